//! `kiln run MODEL [--input NAME=FILE]...`: compiles (or loads) and runs a model once.

use std::path::PathBuf;
use std::time::Instant;

use kiln_ir::Tensor;
use kiln_runtime::{Executable, LoadOptions, Profile};

use super::common::{
    compile_with_bar, graph_inputs, load_model, ms, order_inputs, pick_device, print_timings,
    read_inputs, DeviceArg, Model,
};
use crate::{CompileError, Options, Result};

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
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Report each kernel's time and the bytes copied between host and device.
    #[arg(long)]
    profile: bool,
    /// The memory budget (bytes, or with K, M, G or T): a model needing more is refused, naming
    /// its largest tensor. Default: the memory available.
    #[arg(long, value_parser = super::common::parse_bytes)]
    max_memory: Option<u64>,
    #[arg(long, short)]
    quiet: bool,
}

/// Loads or JIT-compiles `model` for the given inputs, on `device`.
pub fn executable(
    model: Model,
    inputs: &[(String, Tensor)],
    load: &LoadOptions,
    device: DeviceArg,
    quiet: bool,
) -> Result<(Executable, Vec<Tensor>)> {
    match model {
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
            Ok((Executable::load(a, load)?, ordered))
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
                ..Options::for_target(pick_device(device, quiet)?)
            };
            let compiled = compile_with_bar(&g, &options, false, quiet)?;
            if !quiet {
                print_timings(
                    if compiled.from_cache { "compile (from the cache)" } else { "compile" },
                    &compiled.timings,
                );
            }
            let exe = Executable::load(compiled.artifact, load)?;
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
    let model = load_model(&args.model)?;
    let (model, inputs) = match model {
        Model::Graph(g) if g.inputs().iter().any(|&id| !g.node(id).outputs[0].kind.is_tensor()) => {
            bind_sequence_inputs(&g, &args.inputs)?
        }
        m => (m, read_inputs(&args.inputs)?),
    };
    let load =
        LoadOptions { threads: args.threads, max_memory: args.max_memory, ..Default::default() };
    let (exe, ordered) = executable(model, &inputs, &load, args.device, args.quiet)?;
    let mut profile = Profile::default();
    let start = Instant::now();
    let outputs = exe.run_profiled(&ordered, args.profile.then_some(&mut profile))?;
    let took = start.elapsed();
    // Outputs are written only after a successful run.
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| CompileError::File {
            path: dir.display().to_string(),
            msg: e.to_string(),
        })?;
        for (i, t) in outputs.iter().enumerate() {
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
        let v = t.to_f64s();
        let (lo, hi) =
            v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
        println!(
            "output {i} `{}`: {}  min {lo:.6}, max {hi:.6}  [{}{}]",
            d.name,
            t.ty(),
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
    if args.profile {
        println!("profile: {} launches", profile.launches.len());
        for (label, t) in &profile.launches {
            println!("  {:>10}  {label}", ms(*t));
        }
        println!(
            "  host->device {} bytes, device->host {} bytes",
            profile.bytes_to_device, profile.bytes_from_device
        );
    }
    Ok(())
}

/// A model with sequence or optional inputs: each is read as the ONNX value its type says (a
/// SequenceProto or OptionalProto `.pb`) and passed as its elements (`values::bind`), so the
/// program compiled is specialised to them.
fn bind_sequence_inputs(
    g: &kiln_ir::Graph,
    specs: &[String],
) -> Result<(Model, Vec<(String, Tensor)>)> {
    let mut given: Vec<(String, kiln_ir::Value)> = Vec::new();
    for spec in specs {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| CompileError::Usage(format!("--input `{spec}` is not NAME=FILE")))?;
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
                    kiln_runtime::memory::budget(None),
                )?;
                kiln_ir::onnx::read_value(path, &ty)?
            }
            _ => kiln_ir::Value::Tensor(super::common::read_tensor(std::path::Path::new(file))?),
        };
        given.push((name.to_string(), value));
    }
    let declared = graph_inputs(g);
    let mut ordered = Vec::with_capacity(declared.len());
    for (name, ty) in &declared {
        let i = given.iter().position(|(n, _)| n == name).ok_or_else(|| {
            let file = if ty.starts_with("seq(") || ty.starts_with("opt(") { "FILE.pb, an ONNX SequenceProto or OptionalProto" } else { "FILE.npy" };
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
