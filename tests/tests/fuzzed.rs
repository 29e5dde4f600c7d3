//! The compiler's fuzz target, smoked: graphs built from bytes (`kiln_tests::graph_fuzz`) must
//! compile to the interpreter's numbers. Replays every input that once found a bug
//! (`fuzz/regressions/compile_diff/`) and a fixed set of generated inputs; `make fuzz` runs the
//! target under libFuzzer (`fuzz/fuzz_targets/compile_diff.rs`).

use kiln_tests::graph_fuzz::{check, Bug, Verdict};

/// Deterministic pseudo-random bytes (SplitMix64), so the smoke is the same on every run.
fn generated(seed: u64, len: usize) -> Vec<u8> {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut s = mix(seed.wrapping_add(1));
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix(s) as u8
        })
        .collect()
}

fn run(label: &str, data: &[u8], tally: &mut [usize; 3]) {
    let outcome = if std::env::var_os("KILN_FUZZ_KEEP_GOING").is_some() {
        match std::panic::catch_unwind(|| check(data)) {
            Ok(outcome) => outcome,
            Err(_) => Err(Bug("panicked (above)".into())),
        }
    } else {
        check(data)
    };
    match outcome {
        Ok(Verdict::Agreed) => tally[0] += 1,
        Ok(Verdict::Survived) => tally[1] += 1,
        Ok(Verdict::Skipped(why)) => {
            tally[2] += 1;
            if std::env::var_os("KILN_FUZZ_PRINT").is_some() {
                eprintln!("{label}: skipped: {why}");
            }
        }
        // KILN_FUZZ_KEEP_GOING=1 reports every bug of a sweep instead of stopping at the first.
        // (and keeps each input that found one under fuzz/artifacts/compile_diff/, as libFuzzer does).
        Err(bug) if std::env::var_os("KILN_FUZZ_KEEP_GOING").is_some() => {
            eprintln!("BUG {label}: {bug}");
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fuzz/artifacts/compile_diff");
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join(label.replace(' ', "-")), data);
            tally[2] += 1;
        }
        Err(bug) => panic!("{label}: {bug}"),
    }
}

#[test]
fn regression_inputs_of_the_compiler_fuzz_target_pass() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/compile_diff");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut tally = [0; 3];
    for f in &files {
        run(&f.display().to_string(), &std::fs::read(f).unwrap(), &mut tally);
    }
    eprintln!(
        "{} regression inputs: {} agreed, {} survived, {} skipped",
        files.len(),
        tally[0],
        tally[1],
        tally[2]
    );
}

/// `KILN_FUZZ_SMOKE=N` runs N inputs (default 300); `KILN_FUZZ_FROM` starts elsewhere.
#[test]
fn generated_graphs_compile_to_what_the_interpreter_computes() {
    let n: u64 = std::env::var("KILN_FUZZ_SMOKE").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let from: u64 = std::env::var("KILN_FUZZ_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut tally = [0; 3];
    for seed in from..from + n {
        let data = generated(seed, 24 + (seed % 48) as usize);
        run(&format!("generated input {seed}"), &data, &mut tally);
    }
    eprintln!(
        "{n} generated inputs: {} agreed, {} survived, {} skipped",
        tally[0], tally[1], tally[2]
    );
    // The generator must reach the compiler: most inputs skipping would test nothing.
    assert!(
        tally[0] + tally[1] >= (n as usize) / 10,
        "too few inputs reached the compiler: {tally:?}"
    );
}
