//! The run's status word: 16 bytes that compiled kernels set when they cannot finish (an index
//! out of range, an allocation the system refused), which the runtime resets before a run and
//! reads after it (the CPU after every launch). A program's kernels name it through its one
//! `BufferKind::Status` buffer.
//!
//! ```text
//! offset  size  field
//!      0     4  code: 0 while nothing failed, else a `CODE_*`
//!      4     4  kernel: the index in the manifest's `kernels` of the kernel that failed; reset
//!               to u32::MAX, and a kernel stores its own only below what it finds, so the
//!               first of kernels that failed one after the other is named
//!      8     8  detail: what the failure measured (the bytes a refused allocation asked for)
//! ```
//!
//! Little endian, as the CPU and GPUs kiln targets are. Every thread of every launch may write
//! it: the CPU's C code (`support.c`) with atomics (the largest code, the smallest kernel), the
//! generated index checks (`codegen/status.rs`) with plain stores of the same values, as
//! OpenCL's SPIR-V has no atomics on global memory.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::artifact::Manifest;
use crate::RuntimeError;

/// The status word's size.
pub const STATUS_BYTES: u64 = 16;
/// An index (Gather, GatherElements, GatherND, ScatterElements, ScatterND) outside its axis.
pub const CODE_INDEX: u32 = 1;
/// A kernel's scratch or temporary could not be allocated; the detail is the bytes asked for.
pub const CODE_ALLOC: u32 = 2;
/// A kernel met a state its planning rules out: a bug in kiln, reported rather than aborting.
pub const CODE_INTERNAL: u32 = 3;

/// The word's bytes before a run: no code, no kernel (u32::MAX), no detail.
pub const RESET: [u8; 16] = [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0];

/// What a kernel reported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelFailure {
    #[error("an index is out of range (ONNX allows -n to n - 1 on an axis of n)")]
    IndexOutOfRange,
    #[error("cannot allocate {bytes} bytes ({}) of scratch", crate::memory::human(*bytes))]
    Alloc { bytes: u64 },
    /// An allocation the runtime refused because the kernels' scratch would have passed what
    /// the memory budget left after the load (`memory::ScratchAccount`).
    #[error(
        "cannot allocate {bytes} bytes ({}) of scratch: the kernels' scratch would pass the {limit} bytes ({}) the memory budget leaves after the load (the memory available, or --max-memory / LoadOptions::max_memory)",
        crate::memory::human(*bytes),
        crate::memory::human(*limit)
    )]
    OverBudget { bytes: u64, limit: u64 },
    #[error("an internal check of kiln's kernel failed (a bug; please report it)")]
    Internal,
    #[error("it reported failure code {code}, which this runtime does not know")]
    Unknown { code: u32 },
}

/// A failure read from the word: what, which kernel (as the word names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported {
    pub code: u32,
    pub kernel: u32,
    pub detail: u64,
}

impl Reported {
    /// The failure the word holds, if any.
    pub fn decode(bytes: &[u8; 16]) -> Option<Reported> {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let code = word(0);
        if code == 0 {
            return None;
        }
        let mut detail = [0u8; 8];
        detail.copy_from_slice(&bytes[8..16]);
        Some(Reported { code, kernel: word(4), detail: u64::from_le_bytes(detail) })
    }

    pub fn failure(&self) -> KernelFailure {
        match self.code {
            CODE_INDEX => KernelFailure::IndexOutOfRange,
            CODE_ALLOC => KernelFailure::Alloc { bytes: self.detail },
            CODE_INTERNAL => KernelFailure::Internal,
            code => KernelFailure::Unknown { code },
        }
    }

    /// The run's error, naming the kernel by its label. `launched` is the kernel the runtime
    /// knows was running (the CPU checks after each launch), used when the word names none.
    pub fn error(&self, m: &Manifest, launched: Option<usize>) -> RuntimeError {
        let named = (self.kernel != u32::MAX).then_some(self.kernel as usize).or(launched);
        let kernel = match named {
            Some(i) => match m.kernels.get(i) {
                Some(k) => k.label.clone(),
                None => format!("#{i} (not a kernel of `{}`)", m.model),
            },
            None => format!("of `{}` (it did not say which)", m.model),
        };
        RuntimeError::Kernel { kernel, failure: self.failure() }
    }
}

/// The word in host memory, for the CPU: kernels write it through the pointer the run passes.
#[repr(C, align(16))]
#[derive(Debug)]
pub struct StatusWord {
    code: AtomicU32,
    kernel: AtomicU32,
    detail: AtomicU64,
}

impl Default for StatusWord {
    fn default() -> StatusWord {
        StatusWord {
            code: AtomicU32::new(0),
            kernel: AtomicU32::new(u32::MAX),
            detail: AtomicU64::new(0),
        }
    }
}

impl StatusWord {
    /// Back to `RESET`, before a run.
    pub fn reset(&self) {
        self.detail.store(0, Ordering::Relaxed);
        self.kernel.store(u32::MAX, Ordering::Relaxed);
        self.code.store(0, Ordering::Release);
    }

    /// Where kernels write it.
    pub fn as_ptr(&self) -> *mut u8 {
        self as *const StatusWord as *mut u8
    }

    /// What it holds now: read after the launch's workgroups have all returned (the pool's
    /// completion count orders their writes before this).
    pub fn read(&self) -> Option<Reported> {
        let code = self.code.load(Ordering::Acquire);
        (code != 0).then(|| Reported {
            code,
            kernel: self.kernel.load(Ordering::Relaxed),
            detail: self.detail.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_decodes_as_kernels_write_it() {
        assert_eq!(Reported::decode(&RESET), None);
        let mut bytes = RESET;
        bytes[0] = CODE_ALLOC as u8;
        bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let r = Reported::decode(&bytes).expect("a failure");
        assert_eq!(r, Reported { code: CODE_ALLOC, kernel: 3, detail: 1 << 40 });
        assert_eq!(
            r.failure().to_string(),
            "cannot allocate 1099511627776 bytes (1.0 TiB) of scratch"
        );
        assert_eq!(
            KernelFailure::OverBudget { bytes: 1 << 30, limit: 1 << 20 }.to_string(),
            "cannot allocate 1073741824 bytes (1.0 GiB) of scratch: the kernels' scratch would pass the 1048576 bytes (1.0 MiB) the memory budget leaves after the load (the memory available, or --max-memory / LoadOptions::max_memory)"
        );
        let w = StatusWord::default();
        assert_eq!(w.read(), None);
        // SAFETY: the word is 16 bytes laid out as RESET.
        let now = unsafe { std::slice::from_raw_parts(w.as_ptr(), 16) };
        assert_eq!(now, RESET);
        w.code.store(CODE_INDEX, Ordering::Relaxed);
        assert_eq!(w.read().map(|r| r.failure()), Some(KernelFailure::IndexOutOfRange));
        w.reset();
        assert_eq!(w.read(), None);
    }
}
