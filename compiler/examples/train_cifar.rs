//! Trains the CIFAR-10 CNN (`kiln_ir::models::cifarnet`, the PyTorch tutorial's) with a
//! compiled training step on the CPU: SGD with momentum, softmax cross-entropy, progress as
//! step, loss and steps/s.
//!
//!     cargo run --release -p kiln-compiler --example train_cifar -- [options]
//!
//! Without `--data` it trains on random images and labels (a smoke run and a step timing:
//! `--steps 50 --threads 1` prints the median step time). With `--data DIR` it trains on
//! `DIR/x_train.npy` (f32[n,3,32,32]), `DIR/y_train.npy` (i64[n]) in the order of
//! `DIR/order.npy` (i64[epochs, n]: each epoch's sample order; a last partial batch is skipped),
//! then reports the accuracy on `DIR/x_test.npy`, `DIR/y_test.npy`, writing to `DIR/kiln/`:
//! the initial weights (`init/<param>.npy`, before any step), each step's loss (`losses.npy`)
//! and the test accuracy (`accuracy.txt`). `scripts/train_digits.py` prepares such a folder
//! from scikit-learn's digits and trains the same network in PyTorch from the same weights.
//!
//! Options: --data DIR, --steps N (random data; default 100), --batch B (64), --threads T,
//! --lr X (0.01), --momentum X (0.9), --every N (progress every N steps; 10), --seed S (1),
//! --precision P (f32, or bf16: mixed precision, `TrainOptions::precision`; with `--data` its
//! files go to `DIR/kiln-bf16/` instead of `DIR/kiln/`), --device D (cpu, cuda or opencl: where
//! the step runs; a GPU session feeds its outputs back, and the test accuracy is computed on the
//! CPU).

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_compiler::train::{with_constants, with_cross_entropy};
use kiln_compiler::{Options, Precision, TargetKind, TrainOptions, TrainSession};
use kiln_ir::train::Optimizer;
use kiln_ir::{models, npy, DType, Tensor};
use kiln_runtime::LoadOptions;

const PARAMS: [&str; 10] = [
    "conv1.weight",
    "conv1.bias",
    "conv2.weight",
    "conv2.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
    "fc3.weight",
    "fc3.bias",
];

type Error = Box<dyn std::error::Error>;

struct Args {
    data: Option<PathBuf>,
    steps: usize,
    batch: usize,
    threads: Option<usize>,
    lr: f64,
    momentum: f64,
    every: usize,
    seed: u64,
    precision: Precision,
    device: TargetKind,
}

fn args() -> Result<Args, Error> {
    let mut a = Args {
        data: None,
        steps: 100,
        batch: 64,
        threads: None,
        lr: 0.01,
        momentum: 0.9,
        every: 10,
        seed: 1,
        precision: Precision::F32,
        device: TargetKind::Cpu,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} takes a value"));
        match flag.as_str() {
            "--data" => a.data = Some(PathBuf::from(value()?)),
            "--steps" => a.steps = value()?.parse()?,
            "--batch" => a.batch = value()?.parse()?,
            "--threads" => a.threads = Some(value()?.parse()?),
            "--lr" => a.lr = value()?.parse()?,
            "--momentum" => a.momentum = value()?.parse()?,
            "--every" => a.every = value()?.parse::<usize>()?.max(1),
            "--seed" => a.seed = value()?.parse()?,
            "--precision" => a.precision = value()?.parse()?,
            "--device" => a.device = value()?.parse()?,
            _ => return Err(format!("unknown option `{flag}` (see the example's header)").into()),
        }
    }
    if a.batch == 0 {
        return Err("--batch: at least 1".into());
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {}", kiln_compiler::error_chain(e.as_ref()));
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let a = args()?;
    let forward = models::cifarnet(a.batch, a.seed)?;
    let graph = with_cross_entropy(&forward, "logits")?;
    let optimizer =
        Optimizer::Sgd { lr: a.lr, momentum: a.momentum, nesterov: false, weight_decay: 0.0 };
    let load = LoadOptions { threads: a.threads, ..Default::default() };
    let options = TrainOptions {
        compile: Options::for_target(a.device),
        load: load.clone(),
        precision: a.precision,
        ..Default::default()
    };
    let start = Instant::now();
    let mut session = TrainSession::new(&graph, "loss", &PARAMS, optimizer, options)?;
    println!(
        "compiled the training step of `{}` (batch {}, {}) in {:.1} s: {} kernels on {}",
        forward.name,
        a.batch,
        a.precision,
        start.elapsed().as_secs_f64(),
        session.executable().manifest().kernels.len(),
        session.executable().device()
    );
    match &a.data {
        None => train_random(&mut session, &a),
        Some(dir) => train_folder(&mut session, &forward, &a, dir, &load),
    }
}

/// Prints progress every `a.every` steps: the step, the loss, the steps/s since the last line.
struct Progress {
    every: usize,
    total: usize,
    since: Instant,
    times: Vec<f64>,
}

impl Progress {
    fn new(every: usize, total: usize) -> Progress {
        Progress { every, total, since: Instant::now(), times: Vec::new() }
    }

    fn step(&mut self, step: usize, loss: f32, took: f64) {
        self.times.push(took);
        if (step + 1).is_multiple_of(self.every) || step + 1 == self.total {
            let n = (step % self.every) + 1;
            let rate = n as f64 / self.since.elapsed().as_secs_f64();
            println!("step {:>5}/{}  loss {loss:.4}  {rate:.1} steps/s", step + 1, self.total);
            self.since = Instant::now();
        }
    }

    /// The median step time, in ms, of the steps after the first `warm`.
    fn median_ms(&self, warm: usize) -> f64 {
        let mut t: Vec<f64> = self.times.iter().skip(warm).copied().collect();
        if t.is_empty() {
            return f64::NAN;
        }
        t.sort_by(f64::total_cmp);
        t[t.len() / 2] * 1e3
    }
}

fn train_random(session: &mut TrainSession, a: &Args) -> Result<(), Error> {
    let mut progress = Progress::new(a.every, a.steps);
    for s in 0..a.steps {
        let x = Tensor::random(DType::F32, &[a.batch, 3, 32, 32], 1000 + s as u64);
        let labels: Vec<i64> = (0..a.batch).map(|i| ((i * 7 + s) % 10) as i64).collect();
        let batch = [x, Tensor::from_vec(&[a.batch], labels)?];
        let t = Instant::now();
        let loss = session.step(&batch)?;
        progress.step(s, loss, t.elapsed().as_secs_f64());
    }
    match progress.median_ms(5) {
        m if m.is_nan() => println!("median step: none (no step after the 5 warm-up steps)"),
        m => println!("median step: {m:.2} ms (after 5 warm-up steps)"),
    }
    Ok(())
}

fn train_folder(
    session: &mut TrainSession,
    forward: &kiln_ir::Graph,
    a: &Args,
    dir: &Path,
    load: &LoadOptions,
) -> Result<(), Error> {
    let read = |name: &str| npy::read(&dir.join(name));
    let (x, y, order) = (read("x_train.npy")?, read("y_train.npy")?, read("order.npy")?);
    let (xt, yt) = (read("x_test.npy")?, read("y_test.npy")?);
    let out = match a.precision {
        Precision::F32 => dir.join("kiln"),
        p => dir.join(format!("kiln-{p}")),
    };
    std::fs::create_dir_all(out.join("init"))?;
    for (name, t) in session.params() {
        npy::write(&out.join("init").join(format!("{name}.npy")), &t)?;
    }
    let sample = 3 * 32 * 32;
    let xs: &[f32] = x.as_slice()?;
    let ys: &[i64] = y.as_slice()?;
    let order: &[i64] = order.as_slice()?;
    let xts: &[f32] = xt.as_slice()?;
    let yts: &[i64] = yt.as_slice()?;
    let n = ys.len();
    if xs.len() != n * sample || xts.len() != yts.len() * sample {
        return Err("x_train.npy / x_test.npy: not one 3x32x32 image for each label".into());
    }
    let epochs = order.len() / n.max(1);
    let per_epoch = n / a.batch;
    let total = epochs * per_epoch;
    let mut progress = Progress::new(a.every, total);
    let mut losses = Vec::with_capacity(total);
    for e in 0..epochs {
        for b in 0..per_epoch {
            let rows = &order[e * n + b * a.batch..e * n + (b + 1) * a.batch];
            let mut bx = Vec::with_capacity(a.batch * sample);
            let mut by = Vec::with_capacity(a.batch);
            for &r in rows {
                let r = usize::try_from(r)
                    .ok()
                    .filter(|&r| r < n)
                    .ok_or("order.npy: a row past the data")?;
                bx.extend_from_slice(&xs[r * sample..(r + 1) * sample]);
                by.push(ys[r]);
            }
            let batch =
                [Tensor::from_vec(&[a.batch, 3, 32, 32], bx)?, Tensor::from_vec(&[a.batch], by)?];
            let t = Instant::now();
            let loss = session.step(&batch)?;
            losses.push(loss);
            progress.step(e * per_epoch + b, loss, t.elapsed().as_secs_f64());
        }
    }
    npy::write(&out.join("losses.npy"), &Tensor::from_vec(&[losses.len()], losses)?)?;
    // The trained forward graph (logits), compiled at the same batch; the last test batch
    // padded with zero images (their predictions are not counted).
    let trained = with_constants(forward, &session.params())?;
    let exe = kiln_compiler::jit(&trained, &Options { cache: false, ..Options::default() }, load)?;
    let mut correct = 0usize;
    for chunk in (0..yts.len()).step_by(a.batch) {
        let m = a.batch.min(yts.len() - chunk);
        let mut bx = xts[chunk * sample..(chunk + m) * sample].to_vec();
        bx.resize(a.batch * sample, 0.0);
        let out = exe.run(&[Tensor::from_vec(&[a.batch, 3, 32, 32], bx)?])?;
        let scores: &[f32] = out[0].as_slice()?;
        for i in 0..m {
            let row = &scores[i * 10..(i + 1) * 10];
            let best = (0..10).max_by(|&p, &q| row[p].total_cmp(&row[q])).unwrap_or(0);
            correct += usize::from(best as i64 == yts[chunk + i]);
        }
    }
    let accuracy = correct as f64 / yts.len().max(1) as f64;
    std::fs::write(out.join("accuracy.txt"), format!("{accuracy}\n"))?;
    println!(
        "{total} steps ({epochs} epochs of {per_epoch}), median step {:.2} ms; test accuracy {:.2}% ({correct}/{})",
        progress.median_ms(5),
        accuracy * 100.0,
        yts.len()
    );
    Ok(())
}
