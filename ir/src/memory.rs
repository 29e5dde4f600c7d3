//! Memory sizes and what is available: the facts kiln's memory budget is built on (the
//! interpreter checks its results here; `kiln_runtime::memory` checks programs and inputs).

use std::sync::OnceLock;

/// Bytes of memory available now (Linux's `MemAvailable`); `None` where that cannot be read.
pub fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The memory available when this process first asked (unbounded if unknown): the interpreter's
/// limit for one result, read once.
pub fn available_at_start() -> u64 {
    static AT_START: OnceLock<u64> = OnceLock::new();
    *AT_START.get_or_init(|| available().unwrap_or(u64::MAX))
}

/// The bytes of a tensor of `dims` with `size`-byte elements, or `None` when that overflows.
pub fn bytes_of(dims: &[usize], size: usize) -> Option<u64> {
    dims.iter().try_fold(size as u64, |acc, &d| acc.checked_mul(d as u64))
}

/// `n` bytes for people: `7.3 TiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (n as f64, 0);
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
