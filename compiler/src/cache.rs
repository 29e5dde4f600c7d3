//! The compile cache: artifacts by a content key in `$KILN_CACHE/compile` (else
//! `~/.cache/kiln/compile`), written atomically, and kept under a size limit
//! (`KILN_CACHE_SIZE`, default 2 GiB) by dropping the least recently used.
//!
//! A key covers kiln's own build, so every rebuild of kiln starts a new set of entries; without
//! a limit the folder only grows (a developer's reached 160k entries and 6 GB).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kiln_ir::{text, Graph};
use kiln_runtime::artifact::Artifact;

pub use crate::options::parse_size;
use crate::options::Options;
use crate::target;
use crate::{CompileError, Result};

/// The limit when `KILN_CACHE_SIZE` is not set.
pub const DEFAULT_LIMIT: u64 = 2 << 30;

/// A prune keeps this fraction of the limit, so the stores after it do not prune again at once.
const KEEP_NUM: u64 = 9;
const KEEP_DEN: u64 = 10;

/// One store in this many (by key) prunes: a prune reads every entry's size and age, which
/// costs more than a store, and a few stores over the limit cost little.
const PRUNE_EVERY: u64 = 16;

/// A `.tmp` file this old is left by a process that died while writing.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// The compile cache's folder: `$KILN_CACHE/compile`, else `~/.cache/kiln/compile`.
pub fn dir() -> Option<PathBuf> {
    let base = std::env::var_os("KILN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln")))?;
    Some(base.join("compile"))
}

/// The size limit in bytes: `KILN_CACHE_SIZE` (bytes, or with a K, M, G or T suffix in powers of
/// 1024), else [`DEFAULT_LIMIT`]. 0 turns the cache off.
pub fn limit() -> Result<u64> {
    match std::env::var("KILN_CACHE_SIZE") {
        Ok(v) => parse_size(&v).ok_or_else(|| {
            CompileError::Usage(format!(
                "KILN_CACHE_SIZE=`{v}` is not a size: give bytes, or a number with K, M, G or T \
                 (for example 500M or 2G; 0 turns the compile cache off)"
            ))
        }),
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_LIMIT),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(CompileError::Usage("KILN_CACHE_SIZE is not valid UTF-8".into()))
        }
    }
}

/// A content hash of everything that decides the artifact: the graph (weights by digest), the
/// options, kiln's version and build, and the host CPU.
pub(crate) fn key(graph: &Graph, options: &Options) -> String {
    let overrides = target::microkernel_overrides(options);
    let mut shapes: Vec<_> = options.input_shapes.iter().collect();
    shapes.sort();
    let mut values: Vec<(&String, u64)> =
        options.input_values.iter().map(|(n, t)| (n, t.digest())).collect();
    values.sort();
    // The compiler's own build: a rebuilt kiln must not reuse what an older one compiled.
    let build = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| format!("{} {:?}", m.len(), m.modified().ok()))
        .unwrap_or_default();
    let text = format!(
        "{} {build}\n{} {:?} {:?} {:?}\n{:?}\n{:?}\n{}\n{}",
        env!("CARGO_PKG_VERSION"),
        options.target.name(),
        (
            options.microkernel_choice(),
            overrides.iter().collect::<std::collections::BTreeMap<_, _>>(),
            options.vnni_allowed(),
            options.precision
        ),
        options.ptx,
        // A forced GPU schedule (tests, debugging) makes different code.
        target::gpu_strategy(options).ok().flatten(),
        shapes,
        values,
        inkwell::targets::TargetMachine::get_host_cpu_features(),
        text::print(graph, text::Weights::Summary)
    );
    let (mut a, mut b) = (0xcbf2_9ce4_8422_2325u64, 0x8422_2325_cbf2_9ce4u64);
    for byte in text.bytes() {
        a = (a ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3);
        b = (b ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(7);
    }
    format!("{a:016x}{b:016x}")
}

/// The artifact stored under `key`, if any; marks it used, for the limit's order.
pub(crate) fn load(key: &str) -> Option<Artifact> {
    let p = dir()?.join(format!("{key}.kiln"));
    let art = Artifact::read(&p).ok()?;
    if let Ok(f) = std::fs::File::options().write(true).open(&p) {
        let _ = f.set_modified(SystemTime::now());
    }
    Some(art)
}

/// Stores an artifact (atomically: written aside, then renamed), and now and then prunes the
/// folder to its limit. Failures only cost the next compile its speed.
pub(crate) fn store(key: &str, art: &Artifact) {
    let Some(dir) = dir() else { return };
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
    if art.write(&tmp).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("{key}.kiln")));
    }
    let _ = std::fs::remove_file(&tmp);
    let turn = u64::from_str_radix(&key[key.len().saturating_sub(4)..], 16).unwrap_or(0);
    if turn.is_multiple_of(PRUNE_EVERY) {
        if let Ok(limit) = limit() {
            let _ = prune(&dir, limit);
        }
    }
}

/// What a cache folder holds: its artifacts and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    pub bytes: u64,
}

/// What a prune did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The artifacts (and dead `.tmp` files) it removed, and their bytes.
    pub removed: Usage,
    /// What is left.
    pub kept: Usage,
}

struct Entry {
    path: PathBuf,
    bytes: u64,
    used: SystemTime,
}

/// The cache's artifacts (`*.kiln`) in `dir`, oldest use first. Tuning records and anything
/// else in the folder are not entries.
fn entries(dir: &Path) -> std::io::Result<(Vec<Entry>, Vec<PathBuf>)> {
    let mut kept = Vec::new();
    let mut dead = Vec::new();
    let now = SystemTime::now();
    for item in std::fs::read_dir(dir)? {
        let Ok(item) = item else { continue };
        let path = item.path();
        let Ok(meta) = item.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        match path.extension().and_then(|e| e.to_str()) {
            Some("kiln") => kept.push(Entry { path, bytes: meta.len(), used }),
            Some("tmp") if now.duration_since(used).is_ok_and(|age| age > STALE_TMP) => {
                dead.push(path)
            }
            _ => {}
        }
    }
    kept.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.path.cmp(&b.path)));
    Ok((kept, dead))
}

/// What `dir` holds.
pub fn usage(dir: &Path) -> std::io::Result<Usage> {
    let (entries, _) = match entries(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Usage::default()),
        other => other?,
    };
    Ok(Usage { entries: entries.len() as u64, bytes: entries.iter().map(|e| e.bytes).sum() })
}

/// Brings `dir` under `limit` bytes: when it holds more, removes the least recently used
/// artifacts until 90% of the limit is left. Removes `.tmp` files that dead processes left.
pub fn prune(dir: &Path, limit: u64) -> std::io::Result<Pruned> {
    let (entries, dead) = entries(dir)?;
    let mut pruned = Pruned::default();
    for path in dead {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if std::fs::remove_file(&path).is_ok() {
            pruned.removed.entries += 1;
            pruned.removed.bytes += bytes;
        }
    }
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let goal = if total > limit { limit / KEEP_DEN * KEEP_NUM } else { total };
    let mut left = entries.len() as u64;
    for e in &entries {
        if total <= goal {
            break;
        }
        // Another process may have removed it, or be reading it: either way it is gone from
        // the count (an open file stays readable after its name is removed).
        if std::fs::remove_file(&e.path).is_ok() {
            pruned.removed.entries += 1;
            pruned.removed.bytes += e.bytes;
        }
        total -= e.bytes;
        left -= 1;
    }
    pruned.kept = Usage { entries: left, bytes: total };
    Ok(pruned)
}

/// Removes every artifact in `dir` (tuning records stay).
pub fn clear(dir: &Path) -> std::io::Result<Pruned> {
    match prune(dir, 0) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Pruned::default()),
        other => other,
    }
}
