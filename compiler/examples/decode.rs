//! Decodes 32 steps of a GPT-style decoder whose KV cache grows a position a step, through a
//! `Session` (one program per capacity: the cache padded), and times each step against a static
//! artifact compiled for that step's exact length, in interleaved rounds. Prints the compiles and
//! the per-step medians; a measurement, not a test.
//!
//!     cargo run --release -p kiln-compiler --example decode [-- --threads N --layers L --width D]

use std::time::{Duration, Instant};

use kiln_compiler::{compile, Options, Session};
use kiln_ir::{models, DType, Tensor};
use kiln_runtime::{Executable, LoadOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn arg(name: &str, default: usize) -> usize {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (threads, layers, width, steps, rounds) =
        (arg("--threads", 1), arg("--layers", 2), arg("--width", 256), 32, arg("--rounds", 15));
    let heads = 4;
    let head_dim = width / heads;
    let graph = models::gpt_decoder_step(layers, heads, head_dim, 3)?;
    let load = LoadOptions { threads: Some(threads), ..Default::default() };
    let options = Options { cache: false, ..Options::default() };

    // The decode loop through the session: its compiles and each step's inputs.
    let mut session = Session::new(graph.clone(), options.clone(), load.clone());
    let mut cache: Vec<Tensor> =
        (0..2 * layers).map(|_| Tensor::zeros(DType::F32, &[1, heads, 0, head_dim])).collect();
    let mut step_inputs = Vec::new();
    let clock = Instant::now();
    for step in 0..steps {
        let mut inputs = vec![Tensor::random(DType::F32, &[1, 1, width], 100 + step as u64)];
        inputs.extend(cache.iter().cloned());
        let out = session.run(&inputs)?;
        cache = out[1..].to_vec();
        step_inputs.push(inputs);
    }
    let first_pass = clock.elapsed();
    println!(
        "decoder: {layers} layers, width {width}, {heads} heads; {steps} steps, {threads} thread(s); session compiles: {} (first pass {:.2} s with them)",
        session.compiles(),
        first_pass.as_secs_f64()
    );

    // A static artifact per length, for comparison.
    let mut statics = Vec::new();
    let clock = Instant::now();
    for inputs in &step_inputs {
        let shapes = graph
            .inputs()
            .iter()
            .zip(inputs)
            .map(|(&id, t)| (graph.node(id).name.clone(), t.dims().to_vec()))
            .collect();
        let o = Options { input_shapes: shapes, ..options.clone() };
        statics.push(Executable::load(compile(&graph, &o, false)?.artifact, &load)?);
    }
    println!("static artifacts: {steps} compiles, {:.2} s", clock.elapsed().as_secs_f64());

    // Per step, interleaved rounds of the session and the static artifact (both warm, as in a
    // loop that stays at one length; a warm-up run of each first).
    let mut padded = vec![Vec::new(); steps];
    let mut exact = vec![Vec::new(); steps];
    for (s, inputs) in step_inputs.iter().enumerate() {
        session.run(inputs)?;
        statics[s].run(inputs)?;
        for _ in 0..rounds {
            let t = Instant::now();
            session.run(inputs)?;
            padded[s].push(t.elapsed());
            let t = Instant::now();
            statics[s].run(inputs)?;
            exact[s].push(t.elapsed());
        }
    }
    println!("{:>5} {:>6} {:>12} {:>12} {:>7}", "step", "past", "session µs", "static µs", "ratio");
    let (mut sum_p, mut sum_e, mut worst) = (0.0, 0.0, 0.0f64);
    for s in 0..steps {
        let (p, e) = (
            median(padded[s].clone()).as_secs_f64() * 1e6,
            median(exact[s].clone()).as_secs_f64() * 1e6,
        );
        sum_p += p;
        sum_e += e;
        worst = worst.max(p / e);
        println!("{s:>5} {s:>6} {p:>12.1} {e:>12.1} {:>6.2}x", p / e);
    }
    println!(
        "mean per step: session {:.1} µs, static {:.1} µs ({:.2}x); worst step {:.2}x; session compiles {} vs {steps}",
        sum_p / steps as f64,
        sum_e / steps as f64,
        sum_p / sum_e,
        worst,
        session.compiles()
    );
    Ok(())
}
