//! `kiln demo`: kiln's main job on a built-in model. Traces the CIFAR-10 CNN with the Rust API,
//! compiles it to native code for the best device (writing the artifact and every stage's IR),
//! runs it, and checks it against the reference interpreter.

use std::path::PathBuf;
use std::time::Instant;

use kiln_ir::{eval, models, DType, Tensor};
use kiln_runtime::{Executable, LoadOptions};

use super::common::{compile_with_bar, ms, pick_device, print_timings, DeviceArg};
use crate::{CompileError, Options, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Batch size of the traced model.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Where the artifact and the IR dumps go.
    #[arg(long, default_value = "target/demo")]
    out: PathBuf,
    /// Where to run (auto: a CUDA GPU, else an OpenCL GPU, else the CPU).
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// Also print the traced graph in kiln's text form.
    #[arg(long)]
    print_graph: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let target = pick_device(args.device, false)?;
    let started = Instant::now();
    let graph = models::cifarnet(args.batch, 0)?;
    println!(
        "== traced the CIFAR-10 CNN with kiln's Rust API: {} nodes in {} ==",
        graph.node_count(),
        ms(started.elapsed())
    );
    if args.print_graph {
        print!("{graph}");
    } else {
        for line in graph.to_string().lines().filter(|l| !l.contains("= Constant")) {
            println!("{line}");
        }
        println!("(weights omitted; --print-graph shows them summarised)");
    }

    std::fs::create_dir_all(&args.out).map_err(|e| CompileError::File {
        path: args.out.display().to_string(),
        msg: e.to_string(),
    })?;
    let dumps = args.out.join("ir");
    let options =
        Options { dump_dir: Some(dumps.clone()), cache: false, ..Options::for_target(target) };
    let compiled = compile_with_bar(&graph, &options, false, false)?;
    println!(
        "\n== compiled for {} ({}) ==",
        target.name(),
        compiled.artifact.manifest.target_detail
    );
    print_timings("compile", &compiled.timings);
    for k in &compiled.artifact.manifest.kernels {
        println!(
            "  kernel {:<22} {} workgroup{}  {}",
            k.symbol,
            k.workgroups,
            if k.workgroups == 1 { " " } else { "s" },
            k.label
        );
    }
    let artifact_path = args.out.join("cifarnet.kiln");
    compiled.artifact.write(&artifact_path)?;

    let exe = Executable::load_file(&artifact_path, &LoadOptions::default())?;
    let input = Tensor::random(DType::F32, &[args.batch, 3, 32, 32], 42);
    let outputs = exe.run(&[input.clone()])?;
    let mut native = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        exe.run(&[input.clone()])?;
        native.push(t.elapsed());
    }
    native.sort();
    let t = Instant::now();
    let reference = eval::run(&graph, &[input])?;
    let interpreted = t.elapsed();

    let logits = outputs[0].to_f64s();
    let want = reference[0].to_f64s();
    let diff = logits.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let classes = outputs[0].dims()[1];
    println!("\n== logits (native; input: seeded uniform noise in [-1, 1)) ==");
    for (i, row) in logits.chunks(classes).enumerate() {
        let best = row.iter().enumerate().fold(0, |b, (j, v)| if *v > row[b] { j } else { b });
        let cells: Vec<String> = row.iter().map(|v| format!("{v:+.4}")).collect();
        println!("  [{i}] {}   argmax {best}", cells.join(" "));
    }
    println!(
        "\nnative {} (median of 20 runs, {}), interpreter {}",
        ms(native[native.len() / 2]),
        exe.device(),
        ms(interpreted)
    );
    println!(
        "max |native - interpreter| = {diff:.2e}  {}",
        if diff < 1e-4 { "(match)" } else { "(MISMATCH)" }
    );
    println!(
        "artifact: {} (run it with `kiln run {} --input x=FILE.npy`)",
        artifact_path.display(),
        artifact_path.display()
    );
    let files: Vec<&str> = crate::Stage::ALL
        .into_iter()
        .filter(|s| !compiled.stages[*s].is_empty())
        .filter_map(crate::Stage::file_name)
        .collect();
    println!("IR of every stage: {}/ ({})", dumps.display(), files.join(", "));
    // The demo's model and input are kiln's own: compiled code that disagrees is a kiln bug.
    if diff >= 1e-4 {
        return Err(CompileError::Internal(format!(
            "the native CNN differs from the interpreter by {diff}"
        )));
    }
    Ok(())
}
