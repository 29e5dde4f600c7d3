//! Tuning by measurement (`kiln compile --tune`, `kiln bench --tune`): where the heuristics in
//! `backend/cpu/ukernel/` cannot decide, time each kernel's candidates on this machine and keep
//! the faster. The candidates of a CPU kernel are its linalg schedule and the packed microkernel
//! (where it applies). The model is compiled and timed with every kernel on each, each kernel
//! takes its faster one, and the result is timed against the untuned model: it is kept only if it
//! is not slower. Winners are stored in the compile cache folder (`tune-<cpu>.json`), keyed by the
//! kernel's signature (its ops, attributes and types) and the host CPU, and every later compile
//! on this machine uses them (they are part of the compile cache key).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::time::Duration;

use kiln_ir::{Graph, Tensor};
use kiln_runtime::{files, Executable, LoadOptions, Profile};

use crate::fuse::Kernel;
use crate::{CompileError, Options, Result};

/// A kernel's identity across compiles: its nodes' ops with their attributes and its values'
/// types, hashed (the kernel's name and the graph around it do not enter).
pub fn kernel_signature(graph: &Graph, kernel: &Kernel) -> String {
    let mut text = String::new();
    for &n in &kernel.nodes {
        text.push_str(&format!("{:?};", graph.node(n).op));
        for v in graph.operands(n).into_iter().flatten() {
            text.push_str(&format!("{} ", graph.value_type(v)));
        }
    }
    for &v in &kernel.outputs {
        text.push_str(&format!("-> {}", graph.value_type(v)));
    }
    format!("{:016x}", fnv(&text))
}

fn fnv(s: &str) -> u64 {
    s.bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The file holding this CPU's tuned choices.
fn record_path() -> Option<std::path::PathBuf> {
    let cpu = format!(
        "{} {}",
        inkwell::targets::TargetMachine::get_host_cpu_name(),
        inkwell::targets::TargetMachine::get_host_cpu_features()
    );
    crate::cache_dir().map(|d| d.join(format!("tune-{:016x}.json", fnv(&cpu))))
}

/// The tuned choices stored for this CPU: kernel signature -> microkernel or not. A record that
/// is not this user's, or that others may write, is not read (see [`files::open_owned`]).
pub fn load_record() -> BTreeMap<String, bool> {
    let mut text = Vec::new();
    record_path()
        .and_then(|p| files::open_owned(&p).ok())
        .and_then(|mut f| f.read_to_end(&mut text).ok())
        .and_then(|_| serde_json::from_slice(&text).ok())
        .unwrap_or_default()
}

fn store_record(choices: &BTreeMap<String, bool>) -> Result<()> {
    let Some(path) = record_path() else { return Ok(()) };
    let mut all = load_record();
    all.extend(choices.iter().map(|(k, v)| (k.clone(), *v)));
    let io = |e: std::io::Error| CompileError::File {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    // The compile cache's folder: this user's, 0700 (another user's is refused).
    if let Some(dir) = path.parent() {
        files::private_folder(dir).map_err(io)?;
    }
    // A map of strings to booleans always serialises.
    let text =
        serde_json::to_string_pretty(&all).map_err(|e| CompileError::Internal(e.to_string()))?;
    // Written aside, then renamed: a concurrent compile reads the old or the new whole.
    files::replace_private(&path, &[text.as_bytes()]).map_err(io)
}

/// One kernel's outcome.
#[derive(Clone, Debug)]
pub struct KernelTuning {
    pub label: String,
    pub linalg: Duration,
    pub microkernel: Duration,
    /// The choice kept (true: the microkernel).
    pub microkernel_chosen: bool,
}

/// What tuning found.
#[derive(Clone, Debug)]
pub struct Report {
    pub kernels: Vec<KernelTuning>,
    /// Kernel signature -> microkernel or not, as measured.
    pub choices: BTreeMap<String, bool>,
    /// Median latency of the whole model, untuned and tuned.
    pub untuned: Duration,
    pub tuned: Duration,
    /// Whether the tuned choices were kept (the tuned model was not slower).
    pub kept: bool,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for k in &self.kernels {
            writeln!(
                f,
                "  {:<40} linalg {:>9.4} ms  microkernel {:>9.4} ms  -> {}",
                k.label,
                ms(k.linalg),
                ms(k.microkernel),
                if k.microkernel_chosen { "microkernel" } else { "linalg" }
            )?;
        }
        writeln!(
            f,
            "tuned {:.4} ms, untuned {:.4} ms: {}",
            ms(self.tuned),
            ms(self.untuned),
            if self.kept { "kept" } else { "not faster, the untuned choices stay" }
        )
    }
}

/// Per-launch medians and the median of the whole run over `iters` runs.
fn time(exe: &Executable, inputs: &[Tensor], iters: usize) -> Result<(Vec<Duration>, Duration)> {
    for _ in 0..3 {
        exe.run(inputs)?;
    }
    let mut per: Vec<Vec<Duration>> = Vec::new();
    let mut totals = Vec::with_capacity(iters);
    for _ in 0..iters {
        let mut p = Profile::default();
        let t = std::time::Instant::now();
        exe.run_profiled(inputs, Some(&mut p))?;
        totals.push(t.elapsed());
        per.resize(p.launches.len(), Vec::new());
        for (i, (_, d)) in p.launches.iter().enumerate() {
            per[i].push(*d);
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    Ok((per.into_iter().map(median).collect(), median(totals)))
}

/// Tunes the CPU kernels of `graph` compiled with `options` on `inputs`, with `threads`;
/// `progress` hears what is being done. With `persist`, stores the winners when they are kept.
pub fn tune(
    graph: &Graph,
    options: &Options,
    threads: Option<usize>,
    inputs: &[Tensor],
    persist: bool,
    progress: &dyn Fn(&str),
) -> Result<Report> {
    if options.target != crate::TargetKind::Cpu {
        return Err(CompileError::Usage(
            "--tune tunes CPU kernels: use it with the cpu target".into(),
        ));
    }
    if options.precision != crate::Precision::F32 {
        return Err(CompileError::Usage(format!(
            "--tune chooses between the microkernels and the linalg schedules, which exist in f32 \
             only: tune without --precision {} (its kernels always run on the microkernels)",
            options.precision
        )));
    }
    const ITERS: usize = 20;
    let load = LoadOptions { threads, ..Default::default() };
    // Compiles with the microkernel forced (or not) and these per-kernel choices, and times it.
    let variant = |microkernel: Option<bool>,
                   overrides: HashMap<String, bool>,
                   what: &str|
     -> Result<(Vec<Duration>, Duration, Vec<String>)> {
        progress(&format!("compiling and timing: {what}"));
        let o = Options { microkernel, microkernel_overrides: Some(overrides), ..options.clone() };
        let compiled = crate::compile(graph, &o, false)?;
        let labels: Vec<String> =
            compiled.artifact.manifest.kernels.iter().map(|k| k.label.clone()).collect();
        let exe = Executable::load(compiled.artifact, &load)?;
        let (per, total) = time(&exe, inputs, ITERS)?;
        Ok((per, total, labels))
    };
    // The kernels and their signatures, as the compile partitions them.
    let g = crate::driver::optimize(graph, options)?;
    let partition = crate::fuse::partition(&g, crate::backend::rules(options.target).views())?;
    let sigs: Vec<String> = partition.kernels.iter().map(|k| kernel_signature(&g, k)).collect();
    let (_, untuned, labels) =
        variant(options.microkernel, HashMap::new(), "the untuned model (1 of 4)")?;
    let (on, _, _) =
        variant(Some(true), HashMap::new(), "every kernel that can on the microkernel (2 of 4)")?;
    let (off, _, _) =
        variant(Some(false), HashMap::new(), "every kernel on its linalg schedule (3 of 4)")?;
    // The three variants compile the same partition, one label per kernel.
    if on.len() != sigs.len() || off.len() != sigs.len() {
        return Err(CompileError::Internal(format!(
            "tuning: {} kernels, {} and {} timed",
            sigs.len(),
            on.len(),
            off.len()
        )));
    }
    let mut choices = BTreeMap::new();
    let mut kernels = Vec::new();
    for (i, sig) in sigs.iter().enumerate() {
        // Within 3%, the linalg path (the two may be the same code where no microkernel applies).
        let micro = on[i].as_secs_f64() < off[i].as_secs_f64() * 0.97;
        choices.insert(sig.clone(), micro);
        kernels.push(KernelTuning {
            label: labels.get(i).cloned().unwrap_or_default(),
            linalg: off[i],
            microkernel: on[i],
            microkernel_chosen: micro,
        });
    }
    let overrides: HashMap<String, bool> = choices.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let (_, tuned, _) = variant(None, overrides, "the tuned model (4 of 4)")?;
    let kept = tuned <= untuned;
    if kept && persist {
        store_record(&choices)?;
    }
    Ok(Report { kernels, choices, untuned, tuned, kept })
}

/// A seeded random tensor for input `name`, made only if it fits in what is `left` of the memory
/// budget (which it then takes): else an error naming the input, its type, the bytes and the limit.
pub fn random_input(
    name: &str,
    dtype: kiln_ir::DType,
    dims: &[usize],
    seed: u64,
    left: &mut u64,
) -> Result<Tensor> {
    let bytes = kiln_runtime::memory::bytes_of(dims, dtype.size());
    kiln_runtime::memory::check(
        &format!("random input `{name}` ({dtype}{})", kiln_ir::Shape::fixed(dims)),
        bytes,
        *left,
    )?;
    *left -= bytes.unwrap_or(0);
    Ok(Tensor::random(dtype, dims, seed))
}

/// Random inputs of `graph`'s declared types (symbolic sizes from `shapes`), within the memory
/// available.
pub fn random_inputs(graph: &Graph, shapes: &HashMap<String, Vec<usize>>) -> Result<Vec<Tensor>> {
    let mut left = kiln_runtime::memory::budget(None);
    graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let node = graph.node(id);
            let t = &node.outputs[0];
            let dims = match (shapes.get(&node.name), t.shape.as_fixed()) {
                (Some(d), _) => d.clone(),
                (None, Some(d)) => d,
                (None, None) => {
                    return Err(CompileError::Usage(format!(
                        "input `{}` is {t}: give its sizes with --input-shape {}=D0,D1,...",
                        node.name, node.name
                    )))
                }
            };
            random_input(&node.name, t.dtype, &dims, 1000 + i as u64, &mut left)
        })
        .collect()
}
