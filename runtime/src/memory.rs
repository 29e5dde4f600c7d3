//! The memory budget: what a model or its inputs size is checked against the budget before it
//! is allocated, so that too large a model is an error that names the tensor, not an abort in
//! the allocator. The budget is the memory available when it is asked for (`MemAvailable`), or
//! what the caller sets (`LoadOptions::max_memory`, `--max-memory`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Result, RuntimeError};

pub use kiln_ir::memory::{available, bytes_of, human};

/// The budget in force: `max`, else the memory available now (unbounded if unknown).
pub fn budget(max: Option<u64>) -> u64 {
    max.or_else(available).unwrap_or(u64::MAX)
}

/// An error unless `bytes` (of `what`, `None` when it overflows) fits in `limit`.
pub fn check(what: &str, bytes: Option<u64>, limit: u64) -> Result<()> {
    match bytes {
        Some(b) if b <= limit => Ok(()),
        _ => Err(RuntimeError::Memory { what: what.to_string(), bytes, limit }),
    }
}

/// The kernel scratch a CPU program's threads may hold at once, from its compile-time bounds:
/// the calling thread's and `threads - 1` workers' (`None` when it overflows a u64).
pub fn scratch_bytes(s: &crate::artifact::ScratchDesc, threads: usize) -> Option<u64> {
    let workers = u64::try_from(threads.max(1) - 1).ok()?;
    s.worker.checked_mul(workers)?.checked_add(s.caller)
}

/// What the kernels' scratch may take at run time: the budget less what the load counted of
/// everything else (constants, arenas, outputs). The compile-time bounds are within it when
/// the load passed; an allocation past it is refused (`ScratchAccount`).
pub fn scratch_limit(budget: u64, loaded: Option<u64>) -> u64 {
    loaded.map_or(0, |l| budget.saturating_sub(l))
}

/// The kernel scratch of one loaded artifact, shared by the kernel libraries of all its
/// programs (`support.c` keeps a pointer to it: `kiln_scratch_account`): every C kernel's
/// scratch and MLIR temporary is counted in `held` before it is allocated, and one that would
/// take `held` past `limit` is refused, the kernel failing the run through the status word as
/// for memory the system refused. Laid out as `support.c`'s `KilnScratchAccount`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct ScratchAccount {
    held: AtomicU64,
    limit: AtomicU64,
    peak: AtomicU64,
    /// The bytes of the last allocation refused for the limit (0: none since read).
    refused: AtomicU64,
}

impl ScratchAccount {
    pub fn new(limit: u64) -> ScratchAccount {
        ScratchAccount { limit: AtomicU64::new(limit), ..ScratchAccount::default() }
    }

    /// The bytes kernels hold now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most they held at once since the load.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// The bytes of an allocation refused for the limit since this was last asked, if any: a
    /// refusal the status word reports was the budget's, not the system's.
    pub fn take_refused(&self) -> Option<u64> {
        Some(self.refused.swap(0, Ordering::Relaxed)).filter(|&b| b > 0)
    }

    /// Where `support.c` counts.
    pub fn as_ptr(&self) -> *mut u8 {
        self as *const ScratchAccount as *mut u8
    }
}

/// The device memory a static GPU program holds at once: every buffer of its own (inputs,
/// outputs, constants) and its arena; views share their buffer's.
pub fn device_bytes(m: &crate::artifact::Manifest) -> Option<u64> {
    use crate::artifact::BufferKind;
    m.buffers
        .iter()
        .filter(|b| !matches!(b.kind, BufferKind::Alias { .. } | BufferKind::Scratch { .. }))
        .try_fold(m.arena_bytes, |acc, b| acc.checked_add(b.bytes))
}

/// An error unless the program fits in the device's `total` memory, named by `device`.
pub fn check_device(m: &crate::artifact::Manifest, device: &str, total: u64) -> Result<()> {
    check(
        &format!("`{}` on {device} (its buffers in device memory)", m.model),
        device_bytes(m),
        total,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::ScratchDesc;

    #[test]
    fn kernel_scratch_is_the_callers_and_each_workers() {
        let s = ScratchDesc { caller: 10, worker: 3, kernels: vec![] };
        assert_eq!(scratch_bytes(&s, 1), Some(10));
        assert_eq!(scratch_bytes(&s, 0), Some(10));
        assert_eq!(scratch_bytes(&s, 4), Some(19));
        let huge = ScratchDesc { caller: 1, worker: u64::MAX / 2, kernels: vec![] };
        assert_eq!(scratch_bytes(&huge, 3), Some(u64::MAX));
        assert_eq!(scratch_bytes(&huge, 4), None);
        // What the budget leaves them after the load.
        assert_eq!(scratch_limit(100, Some(30)), 70);
        assert_eq!(scratch_limit(10, Some(30)), 0);
        assert_eq!(scratch_limit(10, None), 0);
        let a = ScratchAccount::new(70);
        assert_eq!((a.limit(), a.held(), a.peak(), a.take_refused()), (70, 0, 0, None));
        a.refused.store(80, Ordering::Relaxed);
        assert_eq!((a.take_refused(), a.take_refused()), (Some(80), None));
    }

    #[test]
    fn sizes_that_overflow_or_exceed_the_budget_are_errors() {
        assert_eq!(bytes_of(&[1_000_000, 1_000_000], 4), Some(4_000_000_000_000));
        assert_eq!(bytes_of(&[usize::MAX, 2], 4), None);
        assert!(check("x", Some(10), 10).is_ok());
        let e = check(
            "input `x` (f32[1000000,1000000])",
            bytes_of(&[1_000_000, 1_000_000], 4),
            1 << 30,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "input `x` (f32[1000000,1000000]) needs 4000000000000 bytes (3.6 TiB), more than the memory budget of 1073741824 bytes (1.0 GiB): the memory available, or --max-memory / LoadOptions::max_memory"
        );
        let e = check("output `y`", None, 1 << 30).unwrap_err();
        assert!(e.to_string().starts_with("output `y` needs more than 2^64 bytes"), "{e}");
    }
}
