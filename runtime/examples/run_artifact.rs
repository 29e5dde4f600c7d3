//! A host program that depends only on kiln-runtime (no MLIR, no LLVM): loads an artifact made by
//! `kiln compile` and runs it; optionally checks the outputs against expected ones and times runs.
//!
//!     cargo run -p kiln-runtime --example run_artifact -- MODEL.kiln [[NAME=]INPUT]... \
//!         [--expect OUTPUT]... [--bench N] [--profile] [--json]
//!
//! Inputs are `.npy` or ONNX `.pb` files, by name or (bare) in declared order; those not given
//! are seeded random tensors of the declared type.
//! `--expect` files are the outputs in declared order (rtol 1e-3, atol 1e-4 for floats).
//! `--bench N` times N runs after 5 warm-up runs; `--profile` then times one more run kernel by
//! kernel (the device's clock on GPUs) and lists the kernels that took longest; `--json` ends
//! with one JSON line.

use std::path::Path;
use std::time::Instant;

use kiln_ir::onnx::testcase::{compare, Tolerance};
use kiln_ir::{DType, Tensor};
use kiln_runtime::{Executable, LoadOptions, Profile};

fn main() {
    match run() {
        Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

fn read(path: &str) -> Result<Tensor, Box<dyn std::error::Error>> {
    let p = Path::new(path);
    if path.ends_with(".npy") {
        return Ok(kiln_ir::npy::read(p)?);
    }
    let bytes = std::fs::read(p).map_err(|e| format!("{path}: {e}"))?;
    Ok(kiln_ir::onnx::decode_tensor(&bytes, p.parent()).map_err(|e| format!("{path}: {e}"))?)
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let usage = "usage: run_artifact MODEL.kiln [[NAME=]INPUT]... [--expect OUTPUT]... [--bench N] [--profile] [--json]";
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or(usage)?;
    let (mut given, mut expect, mut bench, mut json) = (Vec::new(), Vec::new(), 0usize, false);
    let mut by_kernel = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--expect" => expect.push(args.next().ok_or(usage)?),
            "--bench" => {
                bench = args
                    .next()
                    .ok_or(usage)?
                    .parse()
                    .map_err(|_| "--bench takes a number of runs")?
            }
            "--json" => json = true,
            "--profile" => by_kernel = true,
            // NAME=FILE, or a bare FILE: the next input in declared order.
            _ => given.push(
                a.split_once('=')
                    .map_or((String::new(), a.clone()), |(n, f)| (n.to_string(), f.to_string())),
            ),
        }
    }
    let load = Instant::now();
    let exe = Executable::load_file(Path::new(&path), &LoadOptions::default())?;
    let load_ms = load.elapsed().as_secs_f64() * 1e3;
    let mut inputs = Vec::new();
    let mut positional = given.iter().filter(|(n, _)| n.is_empty()).map(|(_, f)| f);
    for (i, d) in exe.inputs().iter().enumerate() {
        let named = given.iter().find(|(n, _)| *n == d.name).map(|(_, f)| f);
        let t = match named.or_else(|| positional.next()) {
            Some(file) => read(file)?,
            None => Tensor::random(
                DType::from_name(&d.dtype).ok_or("unknown dtype")?,
                &d.dims,
                100 + i as u64,
            ),
        };
        inputs.push(t);
    }
    let mut profile = Profile::default();
    let start = Instant::now();
    let outputs = exe.run_profiled(&inputs, Some(&mut profile))?;
    let first_ms = start.elapsed().as_secs_f64() * 1e3;
    println!(
        "{} on {}: loaded in {load_ms:.1} ms, first run {first_ms:.3} ms",
        exe.manifest().model,
        exe.device()
    );
    for (t, d) in outputs.iter().zip(exe.outputs()) {
        let v = t.to_f64s();
        let head: Vec<String> = v.iter().take(8).map(|x| format!("{x:.5}")).collect();
        println!(
            "  {}: {} [{}{}]",
            d.name,
            t.ty(),
            head.join(", "),
            if v.len() > 8 { ", ..." } else { "" }
        );
    }
    let mut ok = true;
    for (i, file) in expect.iter().enumerate() {
        let want = read(file)?;
        let got = outputs
            .get(i)
            .ok_or(format!("--expect {file}: the model has only {} outputs", outputs.len()))?;
        match compare(&want, got, Tolerance { rtol: 1e-3, atol: 1e-4 }) {
            Ok(()) => println!("  output {i} matches {file}"),
            Err(why) => {
                ok = false;
                println!("  output {i} DIFFERS from {file}: {why}");
            }
        }
    }
    let mut times = Vec::new();
    if bench > 0 {
        for _ in 0..5 {
            exe.run(&inputs)?;
        }
        for _ in 0..bench {
            let t = Instant::now();
            exe.run(&inputs)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "  {} runs: median {:.4} ms, min {:.4} ms, max {:.4} ms",
            bench,
            times[bench / 2],
            times[0],
            times[bench - 1]
        );
    }
    if by_kernel {
        let mut p = Profile::default();
        exe.run_profiled(&inputs, Some(&mut p))?;
        print_profile(&p);
    }
    if json {
        let median = times.get(times.len() / 2).copied();
        println!(
            "{{\"model\": {:?}, \"device\": {:?}, \"matches\": {}, \"checked\": {}, \"median_ms\": {}, \"load_ms\": {load_ms:.3}, \"bytes_to_device\": {}, \"bytes_from_device\": {}, \"launches\": {}}}",
            exe.manifest().model,
            exe.device(),
            ok,
            expect.len(),
            median.map_or("null".to_string(), |m| format!("{m:.5}")),
            profile.bytes_to_device,
            profile.bytes_from_device,
            profile.launches.len()
        );
    }
    Ok(ok)
}

/// Each kernel's device time in one run (a kernel launched several times summed), longest first.
fn print_profile(p: &Profile) {
    let mut kernels: Vec<(String, f64, usize)> = Vec::new();
    for (label, t) in &p.launches {
        let ms = t.as_secs_f64() * 1e3;
        match kernels.iter_mut().find(|k| k.0 == *label) {
            Some(k) => {
                k.1 += ms;
                k.2 += 1;
            }
            None => kernels.push((label.clone(), ms, 1)),
        }
    }
    let total: f64 = kernels.iter().map(|k| k.1).sum();
    kernels.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("  profile: {} launches, {total:.4} ms of kernel time", p.launches.len());
    for (label, ms, n) in kernels.iter().take(12) {
        println!("  {ms:10.4} ms  {:5.1}%  {n:2} launches  {label}", 100.0 * ms / total.max(1e-12));
    }
}
