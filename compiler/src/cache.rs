//! The compile cache: artifacts by a content key in `$KILN_CACHE/compile` (else
//! `~/.cache/kiln/compile`), written atomically, and kept under a size limit
//! (`KILN_CACHE_SIZE`, default 2 GiB) by dropping the least recently used.
//!
//! A key covers kiln's own build, so every rebuild of kiln starts a new set of entries; without
//! a limit the folder only grows (a developer's reached 160k entries and 6 GB).
//!
//! An entry is code kiln will run, so it is trusted only as far as it is checked: the key is a
//! SHA-256 of everything that decides the artifact (the weights by a SHA-256 of their bytes); an
//! entry records its key ahead of the artifact and is refused when the record differs (a file
//! renamed or swapped in from another key); the folder must be this user's and 0700 (created so,
//! tightened if this user's and open), and an entry this user's, not writable by others and not a
//! link (written 0600). A refused entry is never run: the model is compiled anew and the entry
//! overwritten.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kiln_ir::op::Attr;
use kiln_ir::{text, Graph, Op, Tensor};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::files;
use sha2::{Digest, Sha256};

use crate::backend;
pub use crate::options::parse_size;
use crate::options::Options;
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

/// What an entry starts with, before its key and a newline; the artifact follows.
const ENTRY_TAG: &str = "kiln-cache-entry-1 ";

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

/// The cache key: the SHA-256 (64 hex digits) of everything that decides the artifact: the
/// graph (its text, and every weight's bytes), the options (bound input values by their bytes),
/// kiln's version and build, and the host CPU.
pub fn key(graph: &Graph, options: &Options) -> String {
    key_on(graph, options, options.target.name())
}

/// [`key`] for a compile by the backend named `backend` (which, passed to
/// [`crate::driver::compile_on`], need not be the options' target's).
pub fn key_on(graph: &Graph, options: &Options, backend: &str) -> String {
    hex(&Sha256::digest(key_text(graph, options, backend).as_bytes()))
}

/// What the key digests. The graph's text gives each large weight only as a 64-bit summary
/// digest, which a hostile model could collide with; the weights enter by SHA-256 as well.
fn key_text(graph: &Graph, options: &Options, backend: &str) -> String {
    let overrides = backend::microkernel_overrides(options);
    let mut shapes: Vec<_> = options.input_shapes.iter().collect();
    shapes.sort();
    let mut values: Vec<(&String, String)> =
        options.input_values.iter().map(|(n, t)| (n, tensor_digest(t))).collect();
    values.sort();
    format!(
        "{} {}\n{} {:?} {:?} {:?}\n{:?}\n{:?}\n{:?}\nin place {:?}\n{}\nweights {}",
        env!("CARGO_PKG_VERSION"),
        build(),
        backend,
        (
            options.microkernel_choice(),
            overrides.iter().collect::<std::collections::BTreeMap<_, _>>(),
            options.vnni_allowed(),
            options.amx_allowed(),
            options.precision
        ),
        options.ptx,
        // A forced GPU schedule (tests, debugging) makes different code.
        backend::gpu_strategy(options).ok().flatten(),
        shapes,
        values,
        (
            options.target_cpu.name(),
            options.planned_threads(),
            inkwell::targets::TargetMachine::get_host_cpu_features().to_string(),
        ),
        options.in_place,
        text::print(graph, text::Weights::Summary),
        weights_digest(graph)
    )
}

/// The compiler's own build: a rebuilt kiln must not reuse what an older one compiled.
fn build() -> String {
    std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| format!("{} {:?}", m.len(), m.modified().ok()))
        .unwrap_or_default()
}

/// The SHA-256 of every tensor the graph holds (constants, tensor attributes, and those of the
/// graphs inside its ops), each with the node and attribute it belongs to.
fn weights_digest(graph: &Graph) -> String {
    let mut h = Sha256::new();
    digest_graph(&mut h, graph);
    hex(&h.finalize())
}

fn digest_graph(h: &mut Sha256, graph: &Graph) {
    for (_, node) in graph.nodes() {
        if let Op::Constant(t) = &node.op {
            digest_tensor(h, &node.name, "", t);
            continue;
        }
        for (name, attr) in node.op.attrs().0 {
            match attr {
                Attr::Tensor(t) => digest_tensor(h, &node.name, &name, &t),
                Attr::Graph(g) => {
                    field(h, b"graph");
                    field(h, node.name.as_bytes());
                    field(h, name.as_bytes());
                    digest_graph(h, &g.0);
                    field(h, b"end");
                }
                _ => {}
            }
        }
    }
}

/// One tensor: where it is, its type and its bytes, each length-prefixed so that no two
/// sequences of fields read the same.
fn digest_tensor(h: &mut Sha256, node: &str, attr: &str, t: &Tensor) {
    field(h, b"tensor");
    field(h, node.as_bytes());
    field(h, attr.as_bytes());
    field(h, t.dtype().name().as_bytes());
    h.update((t.dims().len() as u64).to_le_bytes());
    for d in t.dims() {
        h.update((*d as u64).to_le_bytes());
    }
    field(h, t.bytes());
    // A string tensor has no bytes: its text, each string length-prefixed.
    if let Some(s) = t.strings() {
        h.update((s.len() as u64).to_le_bytes());
        for x in s {
            field(h, x.as_bytes());
        }
    }
}

fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// A bound input value's SHA-256.
fn tensor_digest(t: &Tensor) -> String {
    let mut h = Sha256::new();
    digest_tensor(&mut h, "", "", t);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the cache holds for a key.
#[derive(Debug)]
pub enum Lookup {
    /// Boxed: an artifact's manifest is large beside the other cases.
    Hit(Box<Artifact>),
    /// Nothing stored (or no cache folder to look in).
    Miss,
    /// Something is stored but cannot be trusted, and must not be run: why.
    Refused(String),
}

/// The artifact stored under `key` in the cache folder, if any and if it can be trusted; a
/// refusal is reported on stderr (the model is compiled anew and the entry overwritten). Marks
/// a hit used, for the limit's order.
pub(crate) fn load(key: &str) -> Option<Artifact> {
    match lookup(&dir()?, key) {
        Lookup::Hit(art) => Some(*art),
        Lookup::Miss => None,
        Lookup::Refused(why) => {
            eprintln!("kiln: warning: compile cache: {why}; compiling anew");
            None
        }
    }
}

/// The artifact stored under `key` in `dir`, checked: the folder must be this user's and not
/// open to others (see [`files::private_folder`]), the entry this user's, not writable by
/// others, not a link, and recorded for `key`. Marks a hit used. A folder not made yet is a
/// miss (a store makes it).
pub fn lookup(dir: &Path, key: &str) -> Lookup {
    let Some(path) = entry_path(dir, key) else {
        return Lookup::Refused(format!("`{key}` is not a cache key"));
    };
    if std::fs::metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Lookup::Miss;
    }
    if let Err(e) = files::private_folder(dir) {
        return Lookup::Refused(format!("the cache folder is refused: {e}"));
    }
    let mut file = match files::open_owned(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
        // The error names the entry and why.
        Err(e) => return Lookup::Refused(e.to_string()),
    };
    let mut bytes = Vec::new();
    if let Err(e) = file.read_to_end(&mut bytes) {
        return Lookup::Refused(format!("{}: {e}", path.display()));
    }
    let Some(artifact) = bytes.strip_prefix(entry_header(key).as_bytes()) else {
        return Lookup::Refused(format!("{} was not stored for its key", path.display()));
    };
    match Artifact::from_bytes(artifact, &path.display().to_string()) {
        Ok(art) => {
            // The open file is this user's, so its time can be set through it (not through the
            // name, which is checked no more).
            let _ = file.set_modified(SystemTime::now());
            Lookup::Hit(Box::new(art))
        }
        Err(e) => Lookup::Refused(e.to_string()),
    }
}

/// Where `key`'s entry lies; `None` for a key kiln cannot have made (only hex digits), so that
/// no key names a path outside the folder.
fn entry_path(dir: &Path, key: &str) -> Option<PathBuf> {
    (!key.is_empty() && key.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| dir.join(format!("{key}.kiln")))
}

/// The record of the key an entry was stored for.
fn entry_header(key: &str) -> String {
    format!("{ENTRY_TAG}{key}\n")
}

/// Stores an artifact in the cache folder, and now and then prunes the folder to its limit.
/// Failures only cost the next compile its speed.
pub(crate) fn store(key: &str, art: &Artifact) {
    let Some(dir) = dir() else { return };
    if store_in(&dir, key, art).is_err() {
        return;
    }
    let turn = u64::from_str_radix(&key[key.len().saturating_sub(4)..], 16).unwrap_or(0);
    if turn.is_multiple_of(PRUNE_EVERY) {
        if let Ok(limit) = limit() {
            let _ = prune(&dir, limit);
        }
    }
}

/// Stores an artifact under `key` in `dir` (made 0700 if missing; refused if it is another
/// user's): its key, then the artifact, 0600, written aside under an unpredictable name and
/// renamed over any entry there.
pub fn store_in(dir: &Path, key: &str, art: &Artifact) -> std::io::Result<()> {
    let path = entry_path(dir, key).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("`{key}` is not a cache key"))
    })?;
    files::private_folder(dir)?;
    files::replace_private(&path, &[entry_header(key).as_bytes(), &art.to_bytes()])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hex_keys_name_an_entry() {
        let dir = Path::new("/cache");
        assert_eq!(entry_path(dir, "00ff1a"), Some(PathBuf::from("/cache/00ff1a.kiln")));
        assert_eq!(entry_path(dir, "ABCDEF"), Some(PathBuf::from("/cache/ABCDEF.kiln")));
        for bad in ["", "../x", "a/b", "0g", "abc.kiln"] {
            assert_eq!(entry_path(dir, bad), None, "{bad:?}");
        }
        assert_eq!(hex(&[0x00, 0xff, 0x1a]), "00ff1a");
        assert_eq!(entry_header("ab"), format!("{ENTRY_TAG}ab\n"));
    }

    #[test]
    fn tensor_digests_frame_every_field() {
        let digest = |node: &str, attr: &str, t: &Tensor| {
            let mut h = Sha256::new();
            digest_tensor(&mut h, node, attr, t);
            hex(&h.finalize())
        };
        let t = Tensor::vector(&[1f32, 2.]);
        assert_eq!(digest("n", "a", &t), digest("n", "a", &t));
        // The same characters split differently between node and attribute.
        assert_ne!(digest("ab", "", &t), digest("a", "b", &t));
        // The same bytes as another type, or in another shape.
        let zeros = Tensor::vector(&[0f32; 4]);
        assert_ne!(tensor_digest(&zeros), tensor_digest(&Tensor::vector(&[0i32; 4])));
        assert_ne!(tensor_digest(&zeros), tensor_digest(&zeros.reshape(&[2, 2]).unwrap()));
        assert_eq!(tensor_digest(&zeros).len(), 64);
        // Strings (which have no bytes) by their text, each string framed.
        let s = |v: &[&str]| {
            tensor_digest(
                &Tensor::from_strings(&[2], v.iter().map(|x| x.to_string()).collect()).unwrap(),
            )
        };
        assert_ne!(s(&["a", "b"]), s(&["a", "c"]));
        assert_ne!(s(&["ab", ""]), s(&["a", "b"]));
        assert_eq!(s(&["a", "b"]), s(&["a", "b"]));
    }
}
