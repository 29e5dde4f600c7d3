//! `kiln bench MODEL`: times runs; with `--json` the last line is one JSON object.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kiln_runtime::device::cuda::GraphUse;

use super::common::{
    graph_input_types, graph_inputs, load_model_within, ms, order_inputs, parse_shapes,
    read_inputs, DeviceArg, Model,
};
use super::trace::Recorder;
use crate::{CompileError, Result};

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model or a compiled artifact.
    model: PathBuf,
    /// (Refused) a number after --deviation: the number of samples is --deviation-samples N.
    #[arg(hide = true)]
    stray: Vec<String>,
    /// Where to run (auto: a CUDA GPU, else an OpenCL GPU, else the CPU).
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Untimed runs first.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 50)]
    iters: usize,
    /// An input: NAME=FILE; inputs not given are random of the declared type.
    #[arg(long = "input")]
    inputs: Vec<String>,
    /// Sizes for inputs with symbolic dimensions: NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
    /// End with a JSON object: model, device, threads, compile_ms, median_ms, min_ms, max_ms,
    /// mean_ms, iters, precision; on a GPU device_{median,min,max,mean}_ms (the time without the
    /// copies), cuda_graph and pinned_copies; with --deviation, deviation.
    #[arg(long)]
    json: bool,
    /// Also time each kernel launch: per kernel, the median over the timed runs (on a GPU with
    /// the achieved GB/s, GFLOP/s and fraction of the device's peak).
    #[arg(long)]
    profile: bool,
    /// Write a Chrome/Perfetto trace (JSON) to FILE: the import, the compile's phases, the load,
    /// every run, and the profiled runs (--iters more, as --profile's) with each kernel launch on
    /// the thread or GPU stream that ran it and the copies between host and device. Open it in
    /// ui.perfetto.dev or chrome://tracing.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Tune first (as `kiln compile --tune`) on these inputs and threads, then bench the tuned
    /// model.
    #[arg(long)]
    tune: bool,
    /// The memory budget (bytes, or with K, M, G or T) for decoding the model, the random inputs
    /// and the model: more is refused, naming the tensor (or what the file holds too many of).
    /// Default: the memory available.
    #[arg(long, value_parser = super::common::parse_bytes)]
    max_memory: Option<u64>,
    /// Stop a run-time Loop after N steps, failing the run with an error naming the Loop (a
    /// Loop whose condition never turns false runs forever otherwise). Default: no limit, as
    /// ONNX has none.
    #[arg(long, value_name = "N")]
    max_loop_steps: Option<u64>,
    /// The arithmetic of convolutions and matrix products: f32, bf16, tf32 or f16 (as `kiln
    /// compile`).
    #[arg(long, default_value = "f32")]
    precision: crate::Precision,
    /// With --precision bf16: also compile the model in f32 and run both on random inputs
    /// (--deviation-samples of them, new ones; inputs given with --input stay), reporting the
    /// largest deviation of the outputs and in how many rows along their last axis the largest
    /// element (a classifier's top-1) is the same.
    #[arg(long)]
    deviation: bool,
    /// With --deviation: how many random inputs to compare on.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "deviation")]
    deviation_samples: usize,
    /// Print only the result: no progress, timings or notes.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(serde::Serialize)]
struct Report {
    model: String,
    device: String,
    threads: usize,
    compile_ms: f64,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    mean_ms: f64,
    iters: usize,
    precision: String,
    /// The device time of the kernels alone (without the input and output copies), over the
    /// same runs, where the device measures it (CUDA).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_median_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_min_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_mean_ms: Option<f64>,
    /// CUDA: whether the timed runs replayed a CUDA graph, and copied through pinned memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    cuda_graph: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned_copies: Option<bool>,
    /// With --deviation: over the samples and outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    deviation: Option<DeviationReport>,
}

/// Median, min, max and mean of some times.
#[derive(Clone, Copy)]
struct Stats {
    median: Duration,
    min: Duration,
    max: Duration,
    mean: Duration,
}

impl Stats {
    /// `None` for no times.
    fn of(mut times: Vec<Duration>) -> Option<Stats> {
        times.sort();
        let (&min, &max) = (times.first()?, times.last()?);
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        Some(Stats { median: times[times.len() / 2], min, max, mean })
    }
}

fn ms_f64(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[derive(serde::Serialize)]
struct DeviationReport {
    samples: usize,
    /// The largest |got - f32| of any output element.
    max_abs: f64,
    /// The largest of each output's max |diff| over its largest |f32|.
    max_relative: f64,
    /// Rows along each output's last axis (a classifier's images), over the samples, and those
    /// whose largest element (top-1) is the same one as in f32.
    rows: usize,
    same_top1: usize,
}

pub fn run(args: &Args) -> Result<()> {
    if args.iters == 0 {
        return Err(CompileError::Usage("--iters must be at least 1".into()));
    }
    let samples = deviation_samples(args)?;
    if samples.is_some() && args.precision == crate::Precision::F32 {
        return Err(CompileError::Usage(
            "--deviation compares a reduced --precision (bf16) with f32: give one".into(),
        ));
    }
    let mut trace = args.trace.as_deref().map(Recorder::new).transpose()?;
    let start = Instant::now();
    let model = load_model_within(&args.model, args.max_memory)?;
    if let Some(t) = trace.as_mut() {
        t.span(super::run::import_name(&model, &args.model), "import", start);
    }
    let reference = match (&model, samples) {
        (Model::Graph(g), Some(_)) => Some(g.clone()),
        _ => None,
    };
    let mut given = read_inputs(&args.inputs, args.max_memory)?;
    let shapes = parse_shapes(&args.input_shapes)?;
    // Random inputs of the declared types for those not given; a given one's sizes come from
    // its file (and bind the symbols it is declared with).
    let declared: Vec<(String, kiln_ir::DType, Vec<usize>)> = match &model {
        // A symbolic batch's artifact declares one sample; --input-shape picks another batch.
        Model::Artifact(a) => a
            .manifest
            .inputs
            .iter()
            .map(|t| (t.name.clone(), kiln_ir::DType::from_name(&t.dtype).expect("validated"), shapes.get(&t.name).unwrap_or(&t.dims).clone()))
            .collect(),
        Model::Graph(g) => graph_input_types(g)
            .into_iter()
            .filter(|(n, _)| !given.iter().any(|(g, _)| g == n))
            .map(|(n, t)| {
                let dims = match (shapes.get(&n), t.shape.as_fixed()) {
                    (Some(d), _) => d.clone(),
                    (None, Some(d)) => d,
                    (None, None) => {
                        return Err(CompileError::Usage(format!(
                            "input `{n}` is {t}: give its sizes with --input-shape {n}=D0,D1,... or a file with --input"
                        )))
                    }
                };
                Ok((n, t.dtype, dims))
            })
            .collect::<Result<_>>()?,
    };
    // Random inputs are sized by the model: checked against the budget before they exist.
    let mut left = kiln_runtime::memory::budget(args.max_memory);
    for (i, (name, dtype, dims)) in declared.iter().enumerate() {
        if !given.iter().any(|(n, _)| n == name) {
            given.push((
                name.clone(),
                crate::tune::random_input(name, *dtype, dims, 1000 + i as u64, &mut left)?,
            ));
        }
    }
    if args.tune {
        let Model::Graph(g) = &model else {
            return Err(CompileError::Usage(
                "--tune needs a model, not a compiled artifact".into(),
            ));
        };
        if !matches!(args.device, DeviceArg::Cpu | DeviceArg::Auto) {
            return Err(CompileError::Usage(
                "--tune tunes CPU kernels: use it with --device cpu".into(),
            ));
        }
        let ordered = order_inputs(&graph_inputs(g), given.clone())?;
        // The options `kiln bench` compiles with: sizes and shape-deciding values from the inputs.
        let names: Vec<String> = g.inputs().iter().map(|&id| g.node(id).name.clone()).collect();
        let options = crate::Options {
            input_shapes: names
                .iter()
                .zip(&ordered)
                .map(|(n, t)| (n.clone(), t.dims().to_vec()))
                .collect(),
            input_values: names.iter().zip(&ordered).map(|(n, t)| (n.clone(), t.clone())).collect(),
            precision: args.precision,
            threads: args.threads,
            ..crate::Options::default()
        };
        let quiet = args.quiet || args.json;
        let start = Instant::now();
        let report = crate::tune::tune(g, &options, args.threads, &ordered, true, &|what| {
            if !quiet {
                eprintln!("tune: {what}");
            }
        })?;
        if let Some(t) = trace.as_mut() {
            t.span("tune", "tune", start);
        }
        if !quiet {
            eprint!("{report}");
        }
    }
    let start = Instant::now();
    let load = kiln_runtime::LoadOptions {
        threads: args.threads,
        max_memory: args.max_memory,
        max_loop_steps: args.max_loop_steps,
        ..Default::default()
    };
    let (exe, ordered) = super::run::executable(
        model,
        &given,
        &load,
        args.device,
        args.precision,
        args.quiet || args.json,
        trace.as_mut(),
    )?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    for i in 0..args.warmup {
        let start = Instant::now();
        exe.run(&ordered)?;
        if let Some(t) = trace.as_mut() {
            t.run(format!("warmup {}", i + 1), start, None);
        }
    }
    let mut times = Vec::with_capacity(args.iters);
    // The device's own time of each run, without the copies (CUDA): the difference of what it
    // has spent in all, read outside the timed span.
    let mut device_times = Vec::with_capacity(args.iters);
    for i in 0..args.iters {
        let spent = exe.device_time_spent();
        let t = Instant::now();
        exe.run(&ordered)?;
        times.push(t.elapsed());
        if let Some(trace) = trace.as_mut() {
            trace.run(format!("run {}", i + 1), t, None);
        }
        if let (Some(a), Some(b)) = (spent, exe.device_time_spent()) {
            device_times.push(b.saturating_sub(a));
        }
    }
    // Only when every run was measured.
    let device = if device_times.len() == times.len() { Stats::of(device_times) } else { None };
    let mode = exe.cuda_run_mode();
    // Separate runs: timing each launch adds a little to each (on CUDA, it launches each kernel
    // instead of replaying a graph).
    let mut runs = Vec::new();
    if args.profile || trace.is_some() {
        for i in 0..args.iters {
            let mut p = kiln_runtime::Profile::default();
            let start = Instant::now();
            exe.run_profiled(&ordered, Some(&mut p))?;
            if let Some(t) = trace.as_mut() {
                t.run(format!("profiled run {}", i + 1), start, Some(p.clone()));
            }
            runs.push(p);
        }
    }
    if args.profile {
        let kernels = kiln_runtime::Profile::medians(&runs);
        let peaks = runs.first().and_then(|p| p.peaks);
        for line in kiln_runtime::device::kernel_table(
            &kernels,
            peaks.as_ref(),
            "(sum of the kernels' medians)",
        ) {
            println!("{line}");
        }
    }
    let deviation = match (reference, samples) {
        (Some(g), Some(samples)) => {
            let start = Instant::now();
            let d = deviation(g, &exe, &declared, &given, samples, &load, args, &left)?;
            if let Some(t) = trace.as_mut() {
                t.span("deviation from f32", "deviation", start);
            }
            Some(d)
        }
        _ => None,
    };
    // --iters was checked to be at least 1.
    let wall = Stats::of(times)
        .ok_or_else(|| CompileError::Internal("no timed runs (--iters is at least 1)".into()))?;
    let threads =
        args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // The result, --quiet or not (quiet keeps out progress and notes); only --json replaces it.
    if !args.json {
        println!(
            "{}: median {}, min {}, max {}, mean {} over {} runs on {}",
            args.model.display(),
            ms(wall.median),
            ms(wall.min),
            ms(wall.max),
            ms(wall.mean),
            args.iters,
            exe.device()
        );
        // The sizes it ran at (a symbolic model's, an artifact's batch), and whose values.
        let inputs: Vec<String> = ordered
            .iter()
            .zip(exe.inputs())
            .map(|(t, d)| {
                let from = if args.inputs.iter().any(|s| s.split('=').next() == Some(&d.name)) {
                    "file"
                } else {
                    "random"
                };
                format!("{} {} ({from})", d.name, t.ty())
            })
            .collect();
        println!("  inputs: {}", inputs.join(", "));
        if let Some(d) = &device {
            println!(
                "  device time without the copies: median {}, min {}, max {}, mean {}",
                ms(d.median),
                ms(d.min),
                ms(d.max),
                ms(d.mean)
            );
        }
        if let Some(mode) = &mode {
            println!("  {mode}");
        }
        if let Some(d) = &deviation {
            println!(
                "{} from f32 on {} random inputs: max |diff| {:.3e} ({:.3e} of the largest |f32|); top-1 (largest along the last axis) the same in {} of {} row(s)",
                args.precision, d.samples, d.max_abs, d.max_relative, d.same_top1, d.rows
            );
        }
    }
    if args.json {
        let r = Report {
            model: args.model.display().to_string(),
            device: exe.target().name().into(),
            threads,
            compile_ms,
            median_ms: ms_f64(wall.median),
            min_ms: ms_f64(wall.min),
            max_ms: ms_f64(wall.max),
            mean_ms: ms_f64(wall.mean),
            iters: args.iters,
            precision: args.precision.to_string(),
            device_median_ms: device.map(|d| ms_f64(d.median)),
            device_min_ms: device.map(|d| ms_f64(d.min)),
            device_max_ms: device.map(|d| ms_f64(d.max)),
            device_mean_ms: device.map(|d| ms_f64(d.mean)),
            cuda_graph: mode.as_ref().map(|m| m.graph == GraphUse::InUse),
            pinned_copies: mode.as_ref().map(|m| m.pageable.is_none()),
            deviation,
        };
        println!("{}", serde_json::to_string(&r).expect("the report serialises"));
    }
    if let (Some(t), Some(path)) = (trace, &args.trace) {
        t.write(path, format!("kiln bench {}", args.model.display()), exe.device())?;
        if !(args.quiet || args.json) {
            eprintln!("trace written to {} (open it in ui.perfetto.dev)", path.display());
        }
    }
    Ok(())
}

/// The random inputs `--deviation` compares on, if asked. `--deviation N` (its spelling when it
/// took the number) still works, with a warning; a stray argument otherwise is refused.
fn deviation_samples(args: &Args) -> Result<Option<usize>> {
    match args.stray.as_slice() {
        [] => Ok(args.deviation.then_some(args.deviation_samples)),
        [n] if args.deviation && n.parse::<usize>().is_ok() => {
            eprintln!("warning: `--deviation {n}` is now `--deviation --deviation-samples {n}` (--deviation is a switch, as in kiln run)");
            Ok(n.parse().ok())
        }
        [extra, ..] => Err(CompileError::Usage(format!(
            "unexpected argument `{extra}`: bench takes one model (the number of --deviation samples is --deviation-samples N)"
        ))),
    }
}

/// Runs `samples` random inputs through `exe` (compiled at a reduced precision) and through
/// `graph` compiled in f32, and measures how far apart their outputs are.
#[allow(clippy::too_many_arguments)]
fn deviation(
    graph: kiln_ir::Graph,
    exe: &kiln_runtime::Executable,
    declared: &[(String, kiln_ir::DType, Vec<usize>)],
    given: &[(String, kiln_ir::Tensor)],
    samples: usize,
    load: &kiln_runtime::LoadOptions,
    args: &Args,
    left: &u64,
) -> Result<DeviationReport> {
    let (f32_exe, _) = super::run::executable(
        Model::Graph(graph),
        given,
        load,
        args.device,
        crate::Precision::F32,
        true,
        None,
    )?;
    let mut report =
        DeviationReport { samples, max_abs: 0.0, max_relative: 0.0, rows: 0, same_top1: 0 };
    for s in 0..samples {
        // New random values for the inputs the bench made up (`declared`: those not given by
        // file, which stay), one sample's at a time in memory.
        let mut room = *left;
        let mut feeds = given.to_vec();
        for (i, (name, dtype, dims)) in declared.iter().enumerate() {
            let t = crate::tune::random_input(
                name,
                *dtype,
                dims,
                7919 * (s as u64 + 1) + i as u64,
                &mut room,
            )?;
            if let Some(slot) = feeds.iter_mut().find(|(n, _)| n == name) {
                slot.1 = t;
            }
        }
        // Both programs were compiled from the model the feeds were made for.
        let pick = |e: &kiln_runtime::Executable| -> Result<Vec<kiln_ir::Tensor>> {
            e.inputs()
                .iter()
                .map(|d| {
                    feeds.iter().find(|(n, _)| *n == d.name).map(|(_, t)| t.clone()).ok_or_else(
                        || CompileError::Internal(format!("no value for input `{}`", d.name)),
                    )
                })
                .collect()
        };
        let got = exe.run(&pick(exe)?)?;
        let want = f32_exe.run(&pick(&f32_exe)?)?;
        for (g, w) in got.iter().zip(&want) {
            let d = super::run::Deviation::of(g, w);
            report.max_abs = report.max_abs.max(d.max_abs);
            report.max_relative = report.max_relative.max(d.relative);
            report.rows += d.rows;
            report.same_top1 += d.same_top1;
        }
    }
    Ok(report)
}
