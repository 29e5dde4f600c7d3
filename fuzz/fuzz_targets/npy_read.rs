//! `.npy` bytes -> Tensor; a decoded tensor encodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = kiln_ir::npy::decode(data) {
        let _ = kiln_ir::npy::encode(&t);
    }
});
