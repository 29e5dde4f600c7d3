//! The compile cache: its limit (sizes as users write them, and pruning the least recently used
//! artifacts without touching anything else in the folder), and its trust (keys by SHA-256, an
//! entry refused when it was stored for another key, is another user's, or others may write it;
//! the folder 0700, entries 0600), and the compiler's temporary files.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kiln_compiler::cache::{self, Lookup, Pruned, Usage};
use kiln_compiler::Options;
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{DType, Graph, Tensor};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::files::PrivateDir;
use kiln_runtime::{Executable, LoadOptions};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `y = x + w`, with `w` a weight of 64 values (elided from the graph's text) from `seed`.
fn model(seed: u64) -> Graph {
    let g = GraphBuilder::new("add");
    let x = g.input("x", DType::F32, [64]);
    let w = g.constant("w", Tensor::random(DType::F32, &[64], seed));
    g.output("y", x.add(w));
    g.build().unwrap()
}

fn compiled(graph: &Graph) -> Artifact {
    kiln_compiler::compile(graph, &Options { cache: false, ..Options::default() }, false)
        .unwrap()
        .artifact
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn is_root() -> bool {
    kiln_runtime::files::effective_uid() == 0
}

#[track_caller]
fn hit(lookup: Lookup) -> Artifact {
    match lookup {
        Lookup::Hit(art) => *art,
        other => panic!("expected a hit, got {other:?}"),
    }
}

#[track_caller]
fn refused(lookup: Lookup, why: &str) {
    match lookup {
        Lookup::Refused(w) => assert!(w.contains(why), "refused for `{w}`, expected `{why}`"),
        Lookup::Hit(_) => panic!("a hit where a refusal (`{why}`) was due"),
        Lookup::Miss => panic!("a miss where a refusal (`{why}`) was due"),
    }
}

#[test]
fn keys_are_sha256_of_the_graph_with_its_weights_bytes_and_the_options() {
    let options = Options::default();
    let key = cache::key(&model(1), &options);
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    assert_eq!(cache::key(&model(1), &options), key, "the same model, the same key");
    assert_ne!(cache::key(&model(2), &options), key, "other weights, another key");
    let mut bound = Options::default();
    bound.input_values.insert("x".into(), Tensor::random(DType::F32, &[64], 3));
    let bound_key = cache::key(&model(1), &bound);
    assert_ne!(bound_key, key, "a bound input value is part of the key");
    bound.input_values.insert("x".into(), Tensor::random(DType::F32, &[64], 4));
    assert_ne!(cache::key(&model(1), &bound), bound_key, "and so are its bytes");
}

#[test]
fn an_entry_recorded_for_another_key_is_refused_then_overwritten() {
    let dir = PrivateDir::new("kiln-cache-test").unwrap();
    let folder = dir.join("compile");
    let (a, b) = (model(1), model(2));
    let options = Options::default();
    let (key_a, key_b) = (cache::key(&a, &options), cache::key(&b, &options));
    let (art_a, art_b) = (compiled(&a), compiled(&b));
    assert!(matches!(cache::lookup(&folder, &key_a), Lookup::Miss));
    cache::store_in(&folder, &key_a, &art_a).unwrap();
    assert_eq!(hit(cache::lookup(&folder, &key_a)).to_bytes(), art_a.to_bytes());

    // Model A's entry swapped in under model B's key: refused, never run.
    let entry = |key: &str| folder.join(format!("{key}.kiln"));
    std::fs::copy(entry(&key_a), entry(&key_b)).unwrap();
    refused(cache::lookup(&folder, &key_b), "not stored for its key");
    // A bare artifact (no key recorded) is refused too.
    std::fs::remove_file(entry(&key_b)).unwrap();
    art_a.write(&entry(&key_b)).unwrap();
    chmod(&entry(&key_b), 0o600);
    refused(cache::lookup(&folder, &key_b), "not stored for its key");

    // What the driver does next: compile B and store it over the refused entry.
    cache::store_in(&folder, &key_b, &art_b).unwrap();
    let got = hit(cache::lookup(&folder, &key_b));
    assert_eq!(got.to_bytes(), art_b.to_bytes());
    let out = Executable::load(got, &LoadOptions::default())
        .unwrap()
        .run(&[Tensor::zeros(DType::F32, &[64])])
        .unwrap();
    assert_eq!(out[0].bytes(), Tensor::random(DType::F32, &[64], 2).bytes(), "0 + w is B's w");
    // A key kiln cannot have made names no file.
    refused(cache::lookup(&folder, "../x"), "not a cache key");
    assert!(cache::store_in(&folder, "../x", &art_b).is_err());
}

#[test]
fn the_folder_is_0700_entries_0600_and_others_cannot_have_written_them() {
    let dir = PrivateDir::new("kiln-cache-test").unwrap();
    let folder = dir.join("compile");
    let graph = model(5);
    let key = cache::key(&graph, &Options::default());
    let art = compiled(&graph);
    cache::store_in(&folder, &key, &art).unwrap();
    let entry = folder.join(format!("{key}.kiln"));
    assert_eq!((mode(&folder), mode(&entry)), (0o700, 0o600));
    let names: Vec<_> =
        std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, [entry.file_name().unwrap()], "no temporary file is left");

    // An entry others may write is refused.
    chmod(&entry, 0o620);
    refused(cache::lookup(&folder, &key), "written by other users");
    chmod(&entry, 0o600);
    hit(cache::lookup(&folder, &key));

    // A folder of ours that others may write (an older kiln's, under umask 002) is tightened
    // before it is used.
    chmod(&folder, 0o777);
    hit(cache::lookup(&folder, &key));
    assert_eq!(mode(&folder), 0o700);

    // A link is not followed, even to a good entry.
    let other = dir.join("elsewhere.kiln");
    std::fs::rename(&entry, &other).unwrap();
    std::os::unix::fs::symlink(&other, &entry).unwrap();
    refused(cache::lookup(&folder, &key), "symbolic link");
}

#[test]
fn a_cache_folder_or_entry_of_another_user_is_refused() {
    if !is_root() {
        eprintln!("SKIPPED: another user's cache folder and entry (needs root to chown)");
        return;
    }
    let dir = PrivateDir::new("kiln-cache-test").unwrap();
    let graph = model(6);
    let key = cache::key(&graph, &Options::default());
    let art = compiled(&graph);

    // An entry planted by another user in our folder.
    let folder = dir.join("ours");
    cache::store_in(&folder, &key, &art).unwrap();
    let entry = folder.join(format!("{key}.kiln"));
    std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
    refused(cache::lookup(&folder, &key), "belongs to user 65534");

    // A folder another user made first (where `KILN_CACHE` or `HOME` points): neither read nor
    // written, and left as it is.
    let theirs = dir.join("theirs");
    cache::store_in(&theirs, &key, &art).unwrap();
    chmod(&theirs, 0o755);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    refused(cache::lookup(&theirs, &key), "belongs to user 65534");
    let other = model(7);
    let other_key = cache::key(&other, &Options::default());
    assert!(cache::store_in(&theirs, &other_key, &compiled(&other)).is_err());
    assert!(!theirs.join(format!("{other_key}.kiln")).exists());
    assert_eq!(mode(&theirs), 0o755);
}

/// The compiler linked the kernel library in `$TMPDIR/kiln-link-<pid>-<n>`, accepting a directory
/// someone made first; a `kernels.so` swapped in there during the link went into the artifact.
/// Directories planted at those names are not used now: the link directory is fresh.
#[test]
fn directories_planted_where_the_compiler_linked_are_not_used() {
    let planted: Vec<PathBuf> = (0..1024)
        .map(|n| std::env::temp_dir().join(format!("kiln-link-{}-{n}", std::process::id())))
        .filter(|d| std::fs::create_dir(d).is_ok())
        .collect();
    for d in &planted {
        std::fs::write(d.join("kernels.so"), b"foreign code").unwrap();
        chmod(d, 0o777);
        if is_root() {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
        }
    }
    let graph = model(8);
    let exe = Executable::load(compiled(&graph), &LoadOptions::default()).unwrap();
    let out = exe.run(&[Tensor::zeros(DType::F32, &[64])]).unwrap();
    assert_eq!(out[0].bytes(), Tensor::random(DType::F32, &[64], 8).bytes());
    for d in &planted {
        let names: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["kernels.so"], "{} was not touched", d.display());
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A file of `bytes` bytes last written `age` ago.
fn file(dir: &Path, name: &str, bytes: usize, age: Duration) {
    let p = dir.join(name);
    std::fs::write(&p, vec![0u8; bytes]).unwrap();
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn sizes_read_as_bytes_with_binary_multiples() {
    assert_eq!(cache::parse_size("1048576"), Some(1 << 20));
    assert_eq!(cache::parse_size("64k"), Some(64 << 10));
    assert_eq!(cache::parse_size("500M"), Some(500 << 20));
    assert_eq!(cache::parse_size("2G"), Some(2 << 30));
    assert_eq!(cache::parse_size("2GiB"), Some(2 << 30));
    assert_eq!(cache::parse_size(" 1.5G "), Some(3 << 29));
    assert_eq!(cache::parse_size("0"), Some(0));
    for bad in ["", "G", "abc", "-1G", "1e9", "2X", "1..5G", "99999999999T"] {
        assert_eq!(cache::parse_size(bad), None, "{bad:?}");
    }
}

#[test]
fn prune_drops_the_least_recently_used_artifacts_to_nine_tenths_of_the_limit() {
    let dir = scratch("prune");
    let min = Duration::from_secs(60);
    file(&dir, "a.kiln", 1000, 5 * min);
    file(&dir, "b.kiln", 1000, 3 * min);
    file(&dir, "c.kiln", 1000, min);
    file(&dir, "tune-0123.json", 5000, 10 * min); // a tuning record, not an artifact
    file(&dir, "d.77.tmp", 300, 120 * min); // left by a process that died writing it
    file(&dir, "e.78.tmp", 300, Duration::ZERO); // being written now
    assert_eq!(cache::usage(&dir).unwrap(), Usage { entries: 3, bytes: 3000 });

    // Under the limit: nothing goes but the dead write.
    let p = cache::prune(&dir, 3000).unwrap();
    assert_eq!(
        p,
        Pruned {
            removed: Usage { entries: 1, bytes: 300 },
            kept: Usage { entries: 3, bytes: 3000 }
        }
    );

    // Over it: the oldest go until 90% of 2500 is left.
    let p = cache::prune(&dir, 2500).unwrap();
    assert_eq!(
        p,
        Pruned {
            removed: Usage { entries: 1, bytes: 1000 },
            kept: Usage { entries: 2, bytes: 2000 }
        }
    );
    let names = |dir: &Path| {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&dir), ["b.kiln", "c.kiln", "e.78.tmp", "tune-0123.json"]);

    // A used artifact becomes the newest: `b` outlives `c` once it was read last.
    let f = std::fs::File::options().write(true).open(dir.join("b.kiln")).unwrap();
    f.set_modified(SystemTime::now()).unwrap();
    cache::prune(&dir, 1500).unwrap();
    assert_eq!(names(&dir), ["b.kiln", "e.78.tmp", "tune-0123.json"]);

    let p = cache::clear(&dir).unwrap();
    assert_eq!(p.removed, Usage { entries: 1, bytes: 1000 });
    assert_eq!(names(&dir), ["e.78.tmp", "tune-0123.json"]);
    std::fs::remove_dir_all(&dir).unwrap();

    // A cache never made holds nothing.
    assert_eq!(cache::usage(&dir).unwrap(), Usage::default());
    assert_eq!(cache::clear(&dir).unwrap(), Pruned::default());
}
