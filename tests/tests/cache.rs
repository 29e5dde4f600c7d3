//! The compile cache's limit: sizes as users write them, and pruning the least recently used
//! artifacts without touching anything else in the folder.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kiln_compiler::cache::{self, Pruned, Usage};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
