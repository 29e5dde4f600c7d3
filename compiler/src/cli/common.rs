//! What the subcommands share: loading a model (ONNX or artifact), reading inputs, picking a
//! device, printing timings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_ir::{Graph, Tensor, TensorType};
use kiln_runtime::Artifact;

use crate::{CompileError, Result, TargetKind};

/// A model as given on the command line (one per command, moved once: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Model {
    Graph(Graph),
    Artifact(Artifact),
}

pub(crate) fn file_err(path: &Path, msg: impl Into<String>) -> CompileError {
    CompileError::File { path: path.display().to_string(), msg: msg.into() }
}

thread_local! {
    /// How the command running on this thread imports models (`--allow-newer-opsets`): set when
    /// it starts; per thread, so commands run in-process side by side (tests) do not mix.
    static IMPORT_OPTIONS: std::cell::Cell<kiln_ir::onnx::ImportOptions> = std::cell::Cell::new(Default::default());
}

pub fn set_import_options(o: kiln_ir::onnx::ImportOptions) {
    IMPORT_OPTIONS.with(|c| c.set(o));
}

pub fn import_options() -> kiln_ir::onnx::ImportOptions {
    IMPORT_OPTIONS.with(|c| c.get())
}

/// A size in bytes, as `--max-memory` takes it (`crate::options::parse_size`).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    crate::options::parse_size(s)
        .ok_or_else(|| format!("`{s}` is not a size (bytes, or a number with K, M, G or T)"))
}

/// Loads an ONNX model or a compiled artifact (told apart by the artifact's magic bytes).
pub fn load_model(path: &Path) -> Result<Model> {
    load_model_with(path, &import_options())
}

/// [`load_model`] within the memory budget `max_memory` (`--max-memory`; `None`: the memory
/// available): an ONNX file whose decode would take more is refused before it is decoded.
pub fn load_model_within(path: &Path, max_memory: Option<u64>) -> Result<Model> {
    load_model_with(path, &kiln_ir::onnx::ImportOptions { max_memory, ..import_options() })
}

fn load_model_with(path: &Path, options: &kiln_ir::onnx::ImportOptions) -> Result<Model> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e.to_string()))?;
    if bytes.starts_with(kiln_runtime::artifact::MAGIC) {
        return Ok(Model::Artifact(Artifact::from_bytes(&bytes, &path.display().to_string())?));
    }
    let dir = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    let model = kiln_ir::onnx::load_bytes_with(&bytes, dir, options).map_err(|e| match e {
        kiln_ir::IrError::Onnx(m) => file_err(path, m),
        other => CompileError::Ir(other),
    })?;
    for w in &model.warnings {
        eprintln!("warning: {}: {w}", path.display());
    }
    Ok(Model::Graph(model.graph))
}

/// Reads an input tensor: `.npy`, or an ONNX TensorProto (`.pb`), within the memory budget
/// (`--max-memory`, else the memory available).
pub fn read_tensor(path: &Path, max_memory: Option<u64>) -> Result<Tensor> {
    // The file is read whole and decoded into a tensor of about its size: twice it must fit.
    let size = std::fs::metadata(path).map_err(|e| file_err(path, e.to_string()))?.len();
    kiln_runtime::memory::check(
        &format!("reading the input file {}", path.display()),
        size.checked_mul(2),
        kiln_runtime::memory::budget(max_memory),
    )?;
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e.to_string()))?;
    if bytes.starts_with(b"\x93NUMPY") {
        return kiln_ir::npy::decode(&bytes).map_err(|e| file_err(path, e.to_string()));
    }
    kiln_ir::onnx::decode_tensor(&bytes, path.parent())
        .map_err(|e| file_err(path, format!("neither a .npy file nor an ONNX tensor: {e}")))
}

/// Parses `NAME=FILE` arguments into named tensors, each read within the memory budget.
pub fn read_inputs(specs: &[String], max_memory: Option<u64>) -> Result<Vec<(String, Tensor)>> {
    let named = input_specs(specs)?;
    named
        .into_iter()
        .map(|(name, file)| Ok((name.to_string(), read_tensor(&PathBuf::from(file), max_memory)?)))
        .collect()
}

/// `NAME=FILE` arguments split, each name given once (a repeated one would silently keep one
/// of the files).
pub fn input_specs(specs: &[String]) -> Result<Vec<(&str, &str)>> {
    let mut out: Vec<(&str, &str)> = Vec::with_capacity(specs.len());
    for s in specs {
        let (name, file) = s
            .split_once('=')
            .ok_or_else(|| CompileError::Usage(format!("--input `{s}` is not NAME=FILE")))?;
        if let Some((_, first)) = out.iter().find(|(n, _)| *n == name) {
            return Err(CompileError::Usage(format!(
                "--input `{name}` is given twice ({first} and {file}): give each input once"
            )));
        }
        out.push((name, file));
    }
    Ok(out)
}

/// Parses `NAME=D0,D1,...` arguments.
pub fn parse_shapes(specs: &[String]) -> Result<HashMap<String, Vec<usize>>> {
    specs
        .iter()
        .map(|s| {
            let bad = || {
                CompileError::Usage(format!("--input-shape `{s}` is not NAME=D0,D1,... (sizes)"))
            };
            let (name, dims) = s.split_once('=').ok_or_else(bad)?;
            let dims = if dims.is_empty() {
                Vec::new()
            } else {
                dims.split(',')
                    .map(|d| d.trim().parse::<usize>().map_err(|_| bad()))
                    .collect::<Result<_>>()?
            };
            Ok((name.to_string(), dims))
        })
        .collect()
}

/// A leading-dimension range batch spec per input (`NAME=1..64,3,224,224`): the range and
/// the other sizes (the first entry unused).
pub type BatchRanges = HashMap<String, (usize, usize, Vec<usize>)>;

/// `--input-shape` for `kiln compile`: sizes (`NAME=D0,D1,...`), or a range of batch sizes for
/// the leading dimension (`NAME=1..64,3,224,224`; `NAME=1..,3,224,224` for no upper bound),
/// which keeps it symbolic.
pub fn parse_shapes_or_ranges(
    specs: &[String],
) -> Result<(HashMap<String, Vec<usize>>, BatchRanges)> {
    let (mut shapes, mut ranges) = (HashMap::new(), HashMap::new());
    for s in specs {
        let bad = || {
            CompileError::Usage(format!("--input-shape `{s}` is not NAME=D0,D1,... (sizes; the first may be a range of batch sizes, LO..HI or LO..)"))
        };
        let (name, dims) = s.split_once('=').ok_or_else(bad)?;
        let parts: Vec<&str> =
            if dims.is_empty() { Vec::new() } else { dims.split(',').map(str::trim).collect() };
        let size = |d: &str| d.parse::<usize>().map_err(|_| bad());
        let rest: Vec<usize> = parts.iter().skip(1).map(|d| size(d)).collect::<Result<_>>()?;
        match parts.first().and_then(|d| d.split_once("..")) {
            Some((lo, hi)) => {
                let lo = size(lo)?;
                let hi = if hi.is_empty() { crate::batch::NO_LIMIT } else { size(hi)? };
                if lo == 0 || lo > hi {
                    return Err(CompileError::Usage(format!("--input-shape `{s}`: the batch range {lo}..{hi} is empty (sizes start at 1)")));
                }
                ranges.insert(name.to_string(), (lo, hi, std::iter::once(0).chain(rest).collect()));
            }
            None => {
                let first: Vec<usize> =
                    parts.first().map(|d| size(d)).transpose()?.into_iter().collect();
                shapes.insert(name.to_string(), first.into_iter().chain(rest).collect());
            }
        }
    }
    Ok((shapes, ranges))
}

/// `--max-size SYMBOL=N` (`compile`, `emit`): the symbol and its capacity, at least 1.
pub fn parse_max_size(spec: Option<&str>) -> Result<Option<(String, usize)>> {
    let Some(spec) = spec else { return Ok(None) };
    let parsed =
        spec.split_once('=').and_then(|(s, n)| Some((s.trim(), n.trim().parse::<usize>().ok()?)));
    match parsed {
        Some((symbol, n)) if !symbol.is_empty() && n > 0 => Ok(Some((symbol.to_string(), n))),
        _ => Err(CompileError::Usage(format!(
            "--max-size `{spec}` is not SYMBOL=N (a symbol of the model and a size of at least 1)"
        ))),
    }
}

/// Puts named tensors in the declared order; a missing or unknown name is an error that lists
/// what the model expects.
pub fn order_inputs(
    declared: &[(String, String)],
    mut given: Vec<(String, Tensor)>,
) -> Result<Vec<Tensor>> {
    let expected =
        || declared.iter().map(|(n, t)| format!("  {n}: {t}")).collect::<Vec<_>>().join("\n");
    if let Some((extra, _)) = given.iter().find(|(n, _)| !declared.iter().any(|(d, _)| d == n)) {
        return Err(CompileError::Usage(format!(
            "the model has no input `{extra}`; it expects:\n{}",
            expected()
        )));
    }
    let mut out = Vec::with_capacity(declared.len());
    for (name, ty) in declared {
        match given.iter().position(|(n, _)| n == name) {
            Some(i) => out.push(given.swap_remove(i).1),
            None => {
                let file = if ty.starts_with("string") { "FILE.pb" } else { "FILE.npy" };
                return Err(CompileError::Usage(format!(
                    "missing input `{name}` (give it with --input {name}={file}); the model expects:\n{}",
                    expected()
                )));
            }
        }
    }
    Ok(out)
}

/// The declared inputs of a graph, as (name, type text).
pub fn graph_inputs(g: &Graph) -> Vec<(String, String)> {
    g.inputs()
        .iter()
        .map(|&id| (g.node(id).name.clone(), g.node(id).outputs[0].to_string()))
        .collect()
}

/// The declared input types of a graph.
pub fn graph_input_types(g: &Graph) -> Vec<(String, TensorType)> {
    g.inputs().iter().map(|&id| (g.node(id).name.clone(), g.node(id).outputs[0].clone())).collect()
}

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// The best available: CUDA, then an OpenCL GPU, then the CPU.
    Auto,
    /// Native code on this CPU.
    Cpu,
    /// PTX on an NVIDIA GPU.
    Cuda,
    /// SPIR-V on an OpenCL device.
    Opencl,
}

/// Resolves a device choice to the target to compile for, saying which (unless quiet). `auto`
/// takes a CUDA GPU, else an OpenCL GPU, else the CPU. An explicit GPU choice is checked when the
/// executable loads, which names what is missing.
pub fn pick_device(d: DeviceArg, quiet: bool) -> Result<TargetKind> {
    let kind = match d {
        DeviceArg::Cpu => TargetKind::Cpu,
        DeviceArg::Cuda => TargetKind::Cuda,
        DeviceArg::Opencl => TargetKind::Opencl,
        DeviceArg::Auto => {
            let (target, why) = kiln_runtime::auto_device();
            if !quiet {
                eprintln!("device: {why}");
            }
            target
        }
    };
    Ok(kind)
}

/// Compiles with a progress bar on stderr (kernels generated, then the whole-program finish),
/// unless `quiet`; the bar is cleared when done, so the timing summary follows. indicatif draws
/// nothing when stderr is not a terminal.
pub fn compile_with_bar(
    graph: &Graph,
    options: &crate::Options,
    keep_stages: bool,
    quiet: bool,
) -> Result<crate::Compiled> {
    use indicatif::{ProgressBar, ProgressStyle};
    if quiet {
        return crate::compile(graph, options, keep_stages);
    }
    let bar = ProgressBar::new_spinner().with_message("compiling: graph passes and fusion");
    bar.enable_steady_tick(Duration::from_millis(120));
    let style =
        ProgressStyle::with_template("compiling {bar:24} {pos}/{len} kernels {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    let report = |p: crate::Progress| match p {
        crate::Progress::Kernels(n) => {
            bar.set_style(style.clone());
            bar.set_length(n as u64);
            bar.set_message("");
        }
        crate::Progress::KernelsDone(n) => bar.set_position(n as u64),
        crate::Progress::Finishing => bar.set_message(match options.target {
            TargetKind::Cpu => "LLVM -O3, link",
            TargetKind::Cuda => "to PTX",
            TargetKind::Opencl => "to SPIR-V",
        }),
    };
    let r = crate::compile_reporting(graph, options, keep_stages, &report);
    bar.finish_and_clear();
    r
}

/// Prints `compile: passes 12 ms, fuse 1 ms, ...` to stderr.
pub fn print_timings(what: &str, timings: &[(&'static str, Duration)]) {
    let total: Duration = timings.iter().map(|(_, t)| *t).sum();
    let parts: Vec<String> = timings.iter().map(|(s, t)| format!("{s} {}", ms(*t))).collect();
    eprintln!("{what}: {} ({})", ms(total), parts.join(", "));
}

pub fn ms(d: Duration) -> String {
    // Three significant digits or so at every scale: a small model's 4 us is not `0.00 ms`.
    let m = d.as_secs_f64() * 1e3;
    if m >= 100.0 {
        format!("{m:.0} ms")
    } else if m >= 10.0 {
        format!("{m:.1} ms")
    } else if m >= 1.0 {
        format!("{m:.2} ms")
    } else if m >= 0.1 {
        format!("{m:.3} ms")
    } else {
        format!("{:.1} us", m * 1e3)
    }
}

/// Writes `bytes` to `path` only once complete (written aside under an unpredictable name,
/// created exclusively, then renamed), so a failure never leaves a half-written file or destroys
/// an earlier one, and no one can plant the file written aside.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    // Said of the path asked for: the name written aside is kiln's business, not the user's.
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(file_err(path, format!("its folder {} does not exist", parent.display())));
    }
    kiln_runtime::files::replace(path, &[bytes]).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            std::io::ErrorKind::StorageFull => "the disk is full".to_string(),
            _ => e.to_string(),
        };
        file_err(path, format!("cannot write it: {why}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn usage<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(CompileError::Usage(m)) => m,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    #[test]
    fn inputs_are_name_equals_file_each_once() {
        let specs = strings(&["x=a.npy", "y=dir/b=c.pb"]);
        assert_eq!(input_specs(&specs).unwrap(), [("x", "a.npy"), ("y", "dir/b=c.pb")]);
        assert_eq!(usage(input_specs(&strings(&["x"]))), "--input `x` is not NAME=FILE");
        assert_eq!(
            usage(input_specs(&strings(&["x=a.npy", "x=b.npy"]))),
            "--input `x` is given twice (a.npy and b.npy): give each input once"
        );
    }

    #[test]
    fn shapes_are_sizes_and_a_leading_range_keeps_the_batch_open() {
        let shapes = parse_shapes(&strings(&["x=1, 2,3", "s="])).unwrap();
        assert_eq!(shapes["x"], [1, 2, 3]);
        assert_eq!(shapes["s"], Vec::<usize>::new());
        assert!(usage(parse_shapes(&strings(&["x=1,-2"]))).contains("is not NAME=D0,D1"));

        let specs = strings(&["x=1..64,3,224", "y=2,3", "z=4..,5", "w=1..8"]);
        let (shapes, ranges) = parse_shapes_or_ranges(&specs).unwrap();
        assert_eq!(shapes.len(), 1);
        assert_eq!(shapes["y"], [2, 3]);
        assert_eq!(ranges["x"], (1, 64, vec![0, 3, 224]));
        assert_eq!(ranges["z"], (4, crate::batch::NO_LIMIT, vec![0, 5]));
        assert_eq!(ranges["w"], (1, 8, vec![0]));
        for (bad, says) in [
            ("x=0..4,3", "the batch range 0..4 is empty"),
            ("x=5..4", "the batch range 5..4 is empty"),
            ("x=..4", "is not NAME=D0"),
            ("x=1..4,a", "is not NAME=D0"),
            ("x", "is not NAME=D0"),
        ] {
            let e = usage(parse_shapes_or_ranges(&strings(&[bad])));
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_max_size_is_a_symbol_and_a_positive_size() {
        assert_eq!(parse_max_size(None).unwrap(), None);
        assert_eq!(parse_max_size(Some(" past = 64 ")).unwrap(), Some(("past".into(), 64)));
        for bad in ["past=0", "=8", "past", "past=-1", "past=8x"] {
            let e = usage(parse_max_size(Some(bad)));
            assert!(e.starts_with(&format!("--max-size `{bad}` is not SYMBOL=N")), "{e}");
        }
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(
            parse_bytes("2X"),
            Err("`2X` is not a size (bytes, or a number with K, M, G or T)".into())
        );
    }

    #[test]
    fn inputs_come_in_declared_order_and_a_wrong_name_lists_the_model_s() {
        let declared = vec![("a".to_string(), "f32[2]".to_string()), ("b".into(), "i64[]".into())];
        let (ta, tb) = (Tensor::vector(&[1f32, 2.]), Tensor::scalar(7i64));
        let got = order_inputs(&declared, vec![("b".into(), tb.clone()), ("a".into(), ta.clone())])
            .unwrap();
        assert_eq!(got, [ta.clone(), tb]);
        assert_eq!(
            usage(order_inputs(&declared, vec![("c".into(), ta.clone())])),
            "the model has no input `c`; it expects:\n  a: f32[2]\n  b: i64[]"
        );
        assert!(usage(order_inputs(&declared, vec![("a".into(), ta)]))
            .starts_with("missing input `b` (give it with --input b=FILE.npy)"));
    }

    #[test]
    fn durations_print_with_about_three_digits() {
        let us = Duration::from_micros;
        assert_eq!(ms(us(4)), "4.0 us");
        assert_eq!(ms(us(250)), "0.250 ms");
        assert_eq!(ms(us(1_500)), "1.50 ms");
        assert_eq!(ms(us(12_340)), "12.3 ms");
        assert_eq!(ms(us(250_000)), "250 ms");
        assert_eq!(ms(Duration::ZERO), "0.0 us");
    }
}
