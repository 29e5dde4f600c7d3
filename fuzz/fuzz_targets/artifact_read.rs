//! Artifact bytes -> Artifact: header, checksum, manifest, validation (everything before the
//! shared object would be loaded). A read artifact writes the same bytes again.
#![no_main]

use kiln_runtime::artifact::{Artifact, MAGIC};
use libfuzzer_sys::fuzz_target;

fn read(bytes: &[u8]) {
    if let Ok(a) = Artifact::from_bytes(bytes, "fuzz.kiln") {
        let _ = a.validate();
        let _ = a.to_bytes();
    }
}

fuzz_target!(|data: &[u8]| {
    read(data);
    // The same bytes with the header's sizes and checksum made to agree, so that mutations get
    // past the checksum to the manifest's parser and the validator.
    if data.len() >= 64 && data.starts_with(MAGIC) {
        let mut fixed = data.to_vec();
        let rest = fixed.len() - 64;
        let m = (u64::from_le_bytes(fixed[16..24].try_into().unwrap()) as usize).min(rest);
        fixed[16..24].copy_from_slice(&(m as u64).to_le_bytes());
        fixed[24..32].copy_from_slice(&((rest - m) as u64).to_le_bytes());
        let crc = crc32fast::hash(&fixed[64..]);
        fixed[32..36].copy_from_slice(&crc.to_le_bytes());
        read(&fixed);
    }
});
