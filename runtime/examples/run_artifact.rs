//! A host program that depends only on kiln-runtime (no MLIR, no LLVM): loads an artifact made by
//! `kiln compile` and runs it.
//!
//!     cargo run -p kiln-runtime --example run_artifact -- MODEL.kiln [NAME=INPUT.npy]...
//!
//! Inputs not given are seeded random tensors of the declared type.

use std::path::Path;

use kiln_ir::{DType, Tensor};
use kiln_runtime::{Executable, LoadOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: run_artifact MODEL.kiln [NAME=INPUT.npy]...")?;
    let given: Vec<(String, String)> = args
        .map(|a| a.split_once('=').map(|(n, f)| (n.to_string(), f.to_string())).ok_or(format!("`{a}` is not NAME=FILE")))
        .collect::<Result<_, _>>()?;
    let exe = Executable::load_file(Path::new(&path), &LoadOptions::default())?;
    let mut inputs = Vec::new();
    for (i, d) in exe.inputs().iter().enumerate() {
        let t = match given.iter().find(|(n, _)| *n == d.name) {
            Some((_, file)) => kiln_ir::npy::read(Path::new(file))?,
            None => Tensor::random(DType::from_name(&d.dtype).ok_or("unknown dtype")?, &d.dims, 100 + i as u64),
        };
        inputs.push(t);
    }
    let start = std::time::Instant::now();
    let outputs = exe.run(&inputs)?;
    println!("{} on {} in {:.3} ms", exe.manifest().model, exe.device(), start.elapsed().as_secs_f64() * 1e3);
    for (t, d) in outputs.iter().zip(exe.outputs()) {
        let v = t.to_f64s();
        let head: Vec<String> = v.iter().take(8).map(|x| format!("{x:.5}")).collect();
        println!("  {}: {} [{}{}]", d.name, t.ty(), head.join(", "), if v.len() > 8 { ", ..." } else { "" });
    }
    Ok(())
}
