//! `kiln run MODEL [--input NAME=FILE]...`: compiles (or loads) and runs a model once.

use std::path::PathBuf;
use std::time::Instant;

use kiln_ir::Tensor;
use kiln_runtime::{Executable, LoadOptions, Profile};

use super::common::{
    compile_with_bar, graph_inputs, load_model_within, ms, order_inputs, pick_device,
    print_timings, read_inputs, DeviceArg, Model,
};
use super::trace::Recorder;
use crate::{CompileError, Options, Precision, Result};

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model or a compiled artifact.
    model: PathBuf,
    /// An input: NAME=FILE (.npy, or an ONNX TensorProto .pb).
    #[arg(long = "input")]
    inputs: Vec<String>,
    /// Write output_<i>.npy for the i-th output into this folder.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Where to run (auto: a CUDA GPU, else an OpenCL GPU, else the CPU).
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Report each kernel's time and the bytes copied between host and device.
    #[arg(long)]
    profile: bool,
    /// Write a Chrome/Perfetto trace (JSON) to FILE: the import, the compile's phases, the load,
    /// and the run with each kernel launch on the thread or GPU stream that ran it and the
    /// copies between host and device. Open it in ui.perfetto.dev or chrome://tracing.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// The memory budget (bytes, or with K, M, G or T): a model needing more is refused, naming
    /// its largest tensor, and an ONNX file whose decode would, naming what it holds too many of.
    /// Default: the memory available.
    #[arg(long, value_parser = super::common::parse_bytes)]
    max_memory: Option<u64>,
    /// Stop a run-time Loop after N steps, failing the run with an error naming the Loop (a
    /// Loop whose condition never turns false runs forever otherwise). Default: no limit, as
    /// ONNX has none.
    #[arg(long, value_name = "N")]
    max_loop_steps: Option<u64>,
    /// The arithmetic of convolutions and matrix products: f32, bf16, tf32 or f16 (as `kiln
    /// compile`). A model only: an artifact keeps the precision it was compiled with.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// With --precision bf16: run the model in f32 too, on the same inputs, and report each
    /// output's deviation from it (and whether its largest element moved).
    #[arg(long)]
    deviation: bool,
    /// Print only the outputs: no progress, timings or notes.
    #[arg(long, short)]
    quiet: bool,
}

/// Loads or JIT-compiles `model` for the given inputs, on `device`, at `precision`; the compile
/// and the load go into `trace` when given.
pub fn executable(
    model: Model,
    inputs: &[(String, Tensor)],
    load: &LoadOptions,
    device: DeviceArg,
    precision: Precision,
    quiet: bool,
    mut trace: Option<&mut Recorder>,
) -> Result<(Executable, Vec<Tensor>)> {
    match model {
        Model::Artifact(_) if precision != Precision::F32 => Err(CompileError::Usage(format!(
            "--precision {precision} applies when compiling: compile the model with it (kiln compile --precision {precision}), or run the ONNX model"
        ))),
        Model::Artifact(a) => {
            let declared: Vec<(String, String)> = a
                .manifest
                .inputs
                .iter()
                .map(|t| (t.name.clone(), format!("{}{:?}", t.dtype, t.dims)))
                .collect();
            let ordered = order_inputs(&declared, inputs.to_vec())?;
            // An artifact runs where it was compiled for; `auto` takes that.
            let compiled_for = a.manifest.target.name();
            if device != DeviceArg::Auto && pick_device(device, true)?.name() != compiled_for {
                return Err(CompileError::Usage(format!(
                    "this artifact was compiled for {compiled_for}: run it with --device {compiled_for}, or recompile the model with --target {}",
                    pick_device(device, true)?.name()
                )));
            }
            let start = Instant::now();
            let exe = Executable::load(a, load)?;
            if let Some(t) = trace {
                t.span("load", "load", start);
            }
            Ok((exe, ordered))
        }
        Model::Graph(g) => {
            let ordered = order_inputs(&graph_inputs(&g), inputs.to_vec())?;
            // Specialise symbolic dimensions (and shape-deciding input values) to the inputs given.
            let names: Vec<String> = g.inputs().iter().map(|&id| g.node(id).name.clone()).collect();
            let shapes =
                names.iter().zip(&ordered).map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
            let values = names.iter().zip(&ordered).map(|(n, t)| (n.clone(), t.clone())).collect();
            let options = Options {
                input_shapes: shapes,
                input_values: values,
                precision,
                // Planned for the threads it will run on.
                threads: load.threads,
                ..Options::for_target(pick_device(device, quiet)?)
            };
            let start = Instant::now();
            let compiled = compile_with_bar(&g, &options, false, quiet)?;
            if let Some(t) = trace.as_deref_mut() {
                t.compile(start, &compiled.timings, compiled.from_cache);
            }
            if !quiet {
                print_timings(
                    if compiled.from_cache { "compile (from the cache)" } else { "compile" },
                    &compiled.timings,
                );
            }
            let start = Instant::now();
            let exe = Executable::load(compiled.artifact, load)?;
            if let Some(t) = trace {
                t.span("load", "load", start);
            }
            let remaining = exe
                .inputs()
                .iter()
                .map(|d| {
                    ordered[names
                        .iter()
                        .position(|n| *n == d.name)
                        .expect("the executable's inputs are the graph's")]
                    .clone()
                })
                .collect();
            Ok((exe, remaining))
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    let mut trace = args.trace.as_deref().map(Recorder::new).transpose()?;
    let start = Instant::now();
    let model = load_model_within(&args.model, args.max_memory)?;
    if let Some(t) = trace.as_mut() {
        t.span(import_name(&model, &args.model), "import", start);
    }
    let (model, inputs) = match model {
        Model::Graph(g) if g.inputs().iter().any(|&id| !g.node(id).outputs[0].kind.is_tensor()) => {
            bind_sequence_inputs(&g, &args.inputs, args.max_memory)?
        }
        m => (m, read_inputs(&args.inputs, args.max_memory)?),
    };
    let load = LoadOptions {
        threads: args.threads,
        max_memory: args.max_memory,
        max_loop_steps: args.max_loop_steps,
        ..Default::default()
    };
    if args.deviation && args.precision == Precision::F32 {
        return Err(CompileError::Usage(
            "--deviation compares a reduced --precision (bf16) with f32: give one".into(),
        ));
    }
    // The f32 reference is compiled from the same model, before it moves into the executable.
    let reference = match (&model, args.deviation) {
        (Model::Graph(g), true) => Some(Model::Graph(g.clone())),
        _ => None,
    };
    let (exe, ordered) =
        executable(model, &inputs, &load, args.device, args.precision, args.quiet, trace.as_mut())?;
    let mut profile = Profile::default();
    let start = Instant::now();
    let profiled = args.profile || trace.is_some();
    let outputs = exe.run_profiled(&ordered, profiled.then_some(&mut profile))?;
    let took = start.elapsed();
    if let Some(t) = trace.as_mut() {
        t.run("run", start, Some(profile.clone()));
    }
    // Outputs are written only after a successful run.
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| CompileError::File {
            path: dir.display().to_string(),
            msg: e.to_string(),
        })?;
        for (i, t) in outputs.iter().enumerate() {
            // Strings have no .npy form kiln writes: an ONNX TensorProto instead.
            if t.dtype().is_string() {
                let p = dir.join(format!("output_{i}.pb"));
                let bytes = kiln_ir::onnx::encode_tensor(t, &format!("output_{i}"));
                std::fs::write(&p, bytes).map_err(|e| CompileError::File {
                    path: p.display().to_string(),
                    msg: e.to_string(),
                })?;
                continue;
            }
            let p = dir.join(format!("output_{i}.npy"));
            match kiln_ir::npy::widened(t.dtype()) {
                None => kiln_ir::npy::write(&p, t)?,
                Some(w) => {
                    if !args.quiet {
                        eprintln!(
                            "note: {}: numpy has no {}; written as {w} (the same values)",
                            p.display(),
                            t.dtype()
                        );
                    }
                    kiln_ir::npy::write(&p, &t.cast(w))?
                }
            }
        }
    }
    for (i, (t, d)) in outputs.iter().zip(exe.outputs()).enumerate() {
        if let Some(s) = t.strings() {
            let head: Vec<String> = s.iter().take(6).map(|x| format!("{x:?}")).collect();
            let more = if s.len() > 6 { ", ..." } else { "" };
            println!("output {i} `{}`: {}  [{}{more}]", d.name, t.ty(), head.join(", "));
            continue;
        }
        let v = t.to_f64s();
        let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
        println!(
            "output {i} `{}`: {}  {}  [{}{}]",
            d.name,
            t.ty(),
            range_text(&v),
            head.join(", "),
            if v.len() > 6 { ", ..." } else { "" }
        );
    }
    if !args.quiet {
        eprintln!("ran on {} in {}", exe.device(), ms(took));
        if let Some(dir) = &args.output_dir {
            eprintln!(
                "wrote {} output{} to {}",
                outputs.len(),
                if outputs.len() == 1 { "" } else { "s" },
                dir.display()
            );
        }
    }
    if let (Some(t), Some(path)) = (trace, &args.trace) {
        t.write(path, format!("kiln run {}", args.model.display()), exe.device())?;
        if !args.quiet {
            eprintln!("trace written to {} (open it in ui.perfetto.dev)", path.display());
        }
    }
    if let Some(reference) = reference {
        let (f32_exe, f32_inputs) =
            executable(reference, &inputs, &load, args.device, Precision::F32, true, None)?;
        let expected = f32_exe.run(&f32_inputs)?;
        for (i, (t, e)) in outputs.iter().zip(&expected).enumerate() {
            println!("output {i}: {}", Deviation::of(t, e));
        }
    }
    if args.profile {
        println!("profile: {} launches", profile.launches.len());
        if profile.work.iter().any(|w| w.counted()) {
            // A GPU's kernels: with the rates they reached and how close to the device's peaks.
            let table = kiln_runtime::device::kernel_table(
                &profile.kernels(),
                profile.peaks.as_ref(),
                "(sum of the kernels)",
            );
            for line in table {
                println!("{line}");
            }
        } else {
            for (i, (label, t)) in profile.launches.iter().enumerate() {
                // Launches the CPU ran at once (a wave of independent ones) say with which.
                let with = profile.concurrent_with(i);
                let note = if with.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> =
                        with.iter().map(|&j| profile.launches[j].0.as_str()).collect();
                    format!("  (at once with {})", names.join(", "))
                };
                println!("  {:>10}  {label}{note}", ms(*t));
            }
        }
        if let Some(t) = profile.device_time {
            println!("  device time without the copies {}", ms(t));
        }
        println!(
            "  host->device {} bytes, device->host {} bytes",
            profile.bytes_to_device, profile.bytes_from_device
        );
    }
    Ok(())
}

/// The import span's name: what was read.
pub fn import_name(model: &Model, path: &std::path::Path) -> String {
    let file = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
    match model {
        Model::Graph(_) => format!("import {file}"),
        Model::Artifact(_) => format!("read {file}"),
    }
}

/// How far a result computed at a reduced precision lies from the f32 one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deviation {
    /// The largest |got - f32|.
    pub max_abs: f64,
    /// That over the largest |f32| (0 when the result is all zeros).
    pub relative: f64,
    /// The mean |got - f32|.
    pub mean_abs: f64,
    /// Rows along the last axis (a classifier's images), and those whose largest element (its
    /// top-1) is the same one.
    pub rows: usize,
    pub same_top1: usize,
}

impl Deviation {
    pub fn of(got: &Tensor, f32: &Tensor) -> Deviation {
        let (g, e) = (got.to_f64s(), f32.to_f64s());
        let (mut max_abs, mut sum, mut scale) = (0.0f64, 0.0f64, 0.0f64);
        for (&a, &b) in g.iter().zip(&e) {
            // Equal (infinities included) or both NaN: no difference. NaN on one side only is
            // a NaN difference, which the largest keeps (`f64::max` would drop it).
            let d = if a == b || (a.is_nan() && b.is_nan()) { 0.0 } else { (a - b).abs() };
            if d.is_nan() || d > max_abs {
                max_abs = d;
            }
            sum += d;
            scale = scale.max(b.abs());
        }
        let width = f32.dims().last().copied().unwrap_or(1).max(1);
        let argmax = |row: &[f64]| {
            row.iter().enumerate().fold(None, |best: Option<(usize, f64)>, (i, &x)| match best {
                Some((_, b)) if b >= x || x.is_nan() => best,
                _ => Some((i, x)),
            })
        };
        let rows = e.len() / width;
        let same_top1 = g
            .chunks(width)
            .zip(e.chunks(width))
            .filter(|(a, b)| argmax(a).map(|x| x.0) == argmax(b).map(|x| x.0))
            .count();
        Deviation {
            max_abs,
            relative: if scale > 0.0 { max_abs / scale } else { 0.0 },
            mean_abs: if e.is_empty() { 0.0 } else { sum / e.len() as f64 },
            rows,
            same_top1,
        }
    }
}

impl std::fmt::Display for Deviation {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "deviation from f32: max |diff| {:.3e} ({:.3e} of the largest |f32|), mean {:.3e}; top-1 (largest along the last axis) the same in {} of {} row(s)",
            self.max_abs, self.relative, self.mean_abs, self.same_top1, self.rows
        )
    }
}

/// An output's range for people: `min x, max y` over its numbers, with how many are NaN; an
/// output with no numbers (empty, or all NaN) says so rather than `min inf, max -inf`.
pub fn range_text(v: &[f64]) -> String {
    let nan = v.iter().filter(|x| x.is_nan()).count();
    let numbers = v.iter().filter(|x| !x.is_nan());
    let (lo, hi) =
        numbers.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
    match (v.len(), nan) {
        (0, _) => "empty".into(),
        (n, k) if k == n => format!("all {n} NaN"),
        (_, 0) => format!("min {lo:.6}, max {hi:.6}"),
        (_, k) => format!("min {lo:.6}, max {hi:.6}, {k} NaN"),
    }
}

/// A model with sequence or optional inputs: each is read as the ONNX value its type says (a
/// SequenceProto or OptionalProto `.pb`) and passed as its elements (`values::bind`), so the
/// program compiled is specialised to them.
fn bind_sequence_inputs(
    g: &kiln_ir::Graph,
    specs: &[String],
    max_memory: Option<u64>,
) -> Result<(Model, Vec<(String, Tensor)>)> {
    let mut given: Vec<(String, kiln_ir::Value)> = Vec::new();
    for (name, file) in super::common::input_specs(specs)? {
        let ty = g
            .inputs()
            .iter()
            .map(|&id| g.node(id))
            .find(|n| n.name == name)
            .map(|n| n.outputs[0].clone());
        let value = match ty {
            Some(ty) if !ty.kind.is_tensor() => {
                let path = std::path::Path::new(file);
                let size = std::fs::metadata(path)
                    .map_err(|e| CompileError::File { path: file.into(), msg: e.to_string() })?
                    .len();
                kiln_runtime::memory::check(
                    &format!("reading the input file {file}"),
                    size.checked_mul(2),
                    kiln_runtime::memory::budget(max_memory),
                )?;
                kiln_ir::onnx::read_value(path, &ty)?
            }
            _ => kiln_ir::Value::Tensor(super::common::read_tensor(
                std::path::Path::new(file),
                max_memory,
            )?),
        };
        given.push((name.to_string(), value));
    }
    let declared = graph_inputs(g);
    let mut ordered = Vec::with_capacity(declared.len());
    for (name, ty) in &declared {
        let i = given.iter().position(|(n, _)| n == name).ok_or_else(|| {
            let file = if ty.starts_with("seq(") || ty.starts_with("opt(") {
                "FILE.pb, an ONNX SequenceProto or OptionalProto"
            } else if ty.starts_with("string") {
                "FILE.pb, an ONNX TensorProto of strings"
            } else {
                "FILE.npy"
            };
            CompileError::Usage(format!(
                "missing input `{name}` (give it with --input {name}={file}); the model expects:\n{}",
                declared.iter().map(|(n, t)| format!("  {n}: {t}")).collect::<Vec<_>>().join("\n")
            ))
        })?;
        ordered.push(given.swap_remove(i).1);
    }
    if let Some((extra, _)) = given.first() {
        return Err(CompileError::Usage(format!("the model has no input `{extra}`")));
    }
    let (flat, tensors) = crate::values::bind(g, &ordered)?;
    let named = flat.inputs().iter().map(|&id| flat.node(id).name.clone()).zip(tensors).collect();
    Ok((Model::Graph(flat), named))
}
