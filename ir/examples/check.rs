//! Runs ONNX backend-style test directories on the reference interpreter, without the compiler
//! (no MLIR/LLVM to build). The `kiln check --device ref` command does the same with more options.
//!
//!     cargo run -p kiln-ir --release --example check -- DIR... [--verbose]

use std::path::PathBuf;

use kiln_ir::onnx::testcase::{find_tests, run_all, Outcome, Tolerance};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "--verbose");
    let dirs: Vec<PathBuf> =
        args.iter().filter(|a| !a.starts_with("--")).map(PathBuf::from).collect();
    if dirs.is_empty() {
        eprintln!("usage: check DIR... [--verbose]");
        std::process::exit(2);
    }
    let tests = match find_tests(&dirs) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results = run_all(
        &tests,
        &|g, x| kiln_ir::eval::run_values(g, x).map_err(Into::into),
        Tolerance::default(),
        threads,
        &|_| {},
    );
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for r in &results {
        match &r.outcome {
            Outcome::Pass => pass += 1,
            Outcome::Fail(why) => {
                fail += 1;
                println!("FAIL {}: {why}", r.name);
            }
            Outcome::Skip(why) => {
                skip += 1;
                if verbose {
                    println!("SKIP {}: {why}", r.name);
                }
            }
        }
    }
    println!("{pass} passed, {fail} failed, {skip} skipped");
    std::process::exit(if fail > 0 { 1 } else { 0 });
}
