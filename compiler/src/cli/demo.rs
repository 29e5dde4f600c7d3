//! `kiln demo`: kiln's main job on a built-in model.

use std::time::Instant;

use kiln_ir::{eval, models, DType, Tensor};

use crate::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Batch size of the traced model.
    #[arg(long, default_value_t = 4)]
    batch: usize,
}

pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let graph = models::cifarnet(args.batch, 0)?;
    let traced = started.elapsed();
    println!("== the CIFAR-10 CNN, traced with kiln's Rust API ({} nodes, {:.1} ms) ==", graph.node_count(), ms(traced));
    print!("{graph}");

    let input = Tensor::random(DType::F32, &[args.batch, 3, 32, 32], 42);
    let started = Instant::now();
    let outputs = eval::run(&graph, &[input])?;
    let took = started.elapsed();
    let logits = &outputs[0];
    println!("\n== logits from the reference interpreter (input: seeded uniform noise in [-1, 1)) ==");
    let values = logits.to_f64s();
    let classes = logits.dims()[1];
    for (i, row) in values.chunks(classes).enumerate() {
        let best = row.iter().enumerate().fold(0, |b, (j, v)| if *v > row[b] { j } else { b });
        let cells: Vec<String> = row.iter().map(|v| format!("{v:+.4}")).collect();
        println!("  [{i}] {}   argmax {best}", cells.join(" "));
    }
    println!("interpreter time: {:.2} ms for batch {}", ms(took), args.batch);
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
