//! Traces an MLP with kiln's Rust API, compiles it in-process (JIT), runs it, and checks the
//! result against the reference interpreter. With `--save PATH` it also writes the compiled
//! artifact, which `cargo run -p kiln-runtime --example run_artifact -- PATH` runs without MLIR.
//!
//!     cargo run -p kiln-compiler --example jit_mlp [-- --save mlp.kiln]

use kiln_compiler::{jit, Options};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, DType, Tensor};
use kiln_runtime::LoadOptions;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let save = std::env::args().skip_while(|a| a != "--save").nth(1);
    // A 2-layer perceptron: 16 features -> 64 hidden (GELU) -> 8 classes (softmax).
    let g = GraphBuilder::new("mlp");
    let x = g.input("x", DType::F32, [4, 16]);
    let w1 = g.constant("w1", Tensor::random(DType::F32, &[16, 64], 1));
    let b1 = g.constant("b1", Tensor::random(DType::F32, &[64], 2));
    let w2 = g.constant("w2", Tensor::random(DType::F32, &[64, 8], 3));
    let b2 = g.constant("b2", Tensor::random(DType::F32, &[8], 4));
    let hidden = (x.matmul(w1) + b1).gelu().named("hidden");
    let probs = (hidden.matmul(w2) + b2).softmax(-1).named("probs");
    g.output("probs", probs);
    let graph = g.build()?;

    let options = Options { cache: false, ..Options::default() };
    let start = std::time::Instant::now();
    let exe = jit(&graph, &options, &LoadOptions::default())?;
    println!(
        "compiled `{}` in {:.0} ms: {} kernels on {}",
        graph.name,
        start.elapsed().as_secs_f64() * 1e3,
        exe.manifest().kernels.len(),
        exe.device()
    );

    let input = Tensor::random(DType::F32, &[4, 16], 42);
    let got = exe.run(&[input.clone()])?;
    let want = eval::run(&graph, &[input])?;
    let diff = got[0]
        .to_f64s()
        .iter()
        .zip(want[0].to_f64s())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "probs[0] = {:?}",
        &got[0].to_f64s()[..8].iter().map(|v| (v * 1e4).round() / 1e4).collect::<Vec<_>>()
    );
    println!("max |compiled - interpreter| = {diff:.2e}");
    if diff > 1e-4 {
        return Err(format!("the compiled MLP differs from the interpreter by {diff}").into());
    }
    if let Some(path) = save {
        let art = kiln_compiler::compile(&graph, &options, false)?.artifact;
        art.write(std::path::Path::new(&path))?;
        println!("wrote {path}");
    }
    Ok(())
}
