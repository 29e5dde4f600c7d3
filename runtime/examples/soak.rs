//! Runs an artifact many times on random inputs of its declared types and checks that the
//! process's resident memory stays flat: after a warm-up, RSS may not grow by more than 1 MiB
//! over the rest (outputs reused, nothing leaked per run). Exits 1 when it grows.
//!
//!     cargo run -p kiln-runtime --example soak -- MODEL.kiln [RUNS]     (default 10000)

use kiln_ir::{DType, Tensor};
use kiln_runtime::{Executable, LoadOptions};

/// Resident memory in bytes (Linux's /proc/self/statm), 0 where unknown.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: soak MODEL.kiln [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let exe = match Executable::load_file(path.as_ref(), &LoadOptions::default()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let inputs: Vec<Tensor> = exe
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Tensor::random(DType::from_name(&d.dtype).expect("validated"), &d.dims, i as u64)
        })
        .collect();
    let warmup = (runs / 10).max(1);
    let mut after_warmup = 0;
    for run in 0..runs {
        if let Err(e) = exe.run(&inputs) {
            eprintln!("error: run {run}: {e}");
            std::process::exit(2);
        }
        if run + 1 == warmup {
            after_warmup = rss();
        }
    }
    let end = rss();
    let grew = end.saturating_sub(after_warmup);
    println!(
        "soak: {runs} runs of {path}: RSS {} KiB after {warmup}, {} KiB at the end ({} KiB more)",
        after_warmup / 1024,
        end / 1024,
        grew / 1024
    );
    if grew > 1 << 20 {
        eprintln!("soak: resident memory grew by {} KiB over {} runs", grew / 1024, runs - warmup);
        std::process::exit(1);
    }
}
