//! The memory budget: what a model or its inputs size is checked against the budget before it
//! is allocated, so that too large a model is an error that names the tensor, not an abort in
//! the allocator. The budget is the memory available when it is asked for (`MemAvailable`), or
//! what the caller sets (`LoadOptions::max_memory`, `--max-memory`).

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
