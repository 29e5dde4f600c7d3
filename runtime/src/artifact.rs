//! The artifact: one file that holds everything a device needs to run a compiled model.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNART\0"
//!      8     4  format version (little endian), FORMAT_VERSION
//!     12     4  reserved, 0
//!     16     8  manifest length M
//!     24     8  payload length P
//!     32     4  CRC-32 of the manifest and the payload
//!     36    28  reserved, 0 (the header is 64 bytes)
//!     64     M  manifest: UTF-8 JSON (`Manifest`)
//!   64+M     P  payload: blobs (code, constants), each 64-byte aligned, found by `Blob`
//! ```
//!
//! A file that is not an artifact, is truncated, was damaged (the CRC) or has another format
//! version is an error that says which.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Result, RuntimeError};

pub const MAGIC: &[u8; 8] = b"KILNART\0";
/// 2: kernels have a GPU grid and block, launches say which arguments they write.
/// 3: an artifact may hold programs for several batch sizes (`Manifest::batch`).
/// 4: an artifact may hold programs that host steps run and choose between (`Manifest::control`:
///    run, if, scan and loop steps).
/// 5: a program may have a status word (`BufferKind::Status`) that its kernels take as an
///    argument and set when they fail; a runtime that does not reset and read it must refuse
///    the artifact.
/// 6: a CPU program may have state (`Manifest::state`, `BufferKind::State`): tensors the caller
///    keeps across runs, which the kernels read and update in place.
/// 7: a control step may evaluate a graph on the host with kiln's interpreter (`Step::Eval`: the
///    ops whose result shapes depend on the data, and what follows them), and a value's dims may
///    be known only at run time (`ValueDesc::dynamic`).
pub const FORMAT_VERSION: u32 = 7;
/// The oldest version this runtime reads (2 has no `batch`, 3 no `control`, 4 no status word,
/// 5 no state, 6 no host evaluation: all are optional).
pub const OLDEST_FORMAT_VERSION: u32 = 2;
const HEADER: usize = 64;

/// Parses a host evaluation's graph (`Step::Eval`) and checks it takes `args` and gives
/// `results`: each input of an argument's type and fixed dims, each output of its result's type,
/// with the result's dims when they are fixed, and the result marked dynamic when they are not.
pub fn parse_host_graph(
    text: &str,
    args: &[&ValueDesc],
    results: &[&ValueDesc],
) -> std::result::Result<kiln_ir::Graph, String> {
    let g =
        kiln_ir::text::parse(text).map_err(|e| format!("the host graph does not parse: {e}"))?;
    g.verify().map_err(|e| format!("the host graph is not valid: {e}"))?;
    if g.inputs().len() != args.len() || g.outputs().len() != results.len() {
        return Err(format!(
            "the host graph takes {} values and gives {}, the step passes {} and takes {}",
            g.inputs().len(),
            g.outputs().len(),
            args.len(),
            results.len()
        ));
    }
    for (&id, a) in g.inputs().iter().zip(args) {
        let ty = &g.node(id).outputs[0];
        let fits = ty.dtype.name() == a.dtype
            && !a.dynamic
            && ty.shape.as_fixed().is_some_and(|d| d == a.dims);
        if !fits {
            return Err(format!(
                "the host graph reads `{}` as {ty}, it is {}{:?}",
                g.node(id).name,
                a.dtype,
                a.dims
            ));
        }
    }
    for ((name, v), r) in g.outputs().iter().zip(results) {
        let ty = g.value_type(*v);
        let fits = ty.dtype.name() == r.dtype
            && match ty.shape.as_fixed() {
                Some(d) => !r.dynamic && d == r.dims,
                None => r.dynamic,
            };
        if !fits {
            return Err(format!(
                "the host graph gives `{name}` as {ty}, value `{}` is {}{:?}{}",
                r.name,
                r.dtype,
                r.dims,
                if r.dynamic { " (dims at run time)" } else { "" }
            ));
        }
    }
    Ok(g)
}

fn check_host_graph(
    text: &str,
    args: &[&ValueDesc],
    results: &[&ValueDesc],
) -> std::result::Result<(), String> {
    parse_host_graph(text, args, results).map(|_| ())
}

/// A byte range of the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub offset: u64,
    pub len: u64,
}

/// What kind of code the artifact carries: kiln's one target enum, from the CLI's `--target`
/// through the compiler (`kiln_compiler::TargetKind`) to the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// A shared object for the host CPU (x86-64 Linux).
    Cpu,
    /// PTX for NVIDIA GPUs.
    Cuda,
    /// SPIR-V for OpenCL devices.
    Opencl,
}

impl Target {
    /// Every target (`auto_device` tries CUDA, then OpenCL, then the CPU).
    pub const ALL: [Target; 3] = [Target::Cpu, Target::Cuda, Target::Opencl];

    /// What its code is, for help text.
    pub fn description(self) -> &'static str {
        match self {
            Target::Cpu => "native code for the CPU (a shared object)",
            Target::Cuda => "PTX for an NVIDIA GPU",
            Target::Opencl => "SPIR-V for an OpenCL device",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Opencl => "opencl",
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Target, String> {
        Target::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
            format!("unknown target `{s}`: one of {}", names.join(", "))
        })
    }
}

/// A tensor the executable takes or returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDesc {
    pub name: String,
    /// kiln's dtype name (`f32`, `i64`, `bool`...).
    pub dtype: String,
    pub dims: Vec<usize>,
    /// The buffer holding it.
    pub buffer: usize,
}

/// Where a buffer's bytes live while the executable runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// The caller's i-th input tensor (read only).
    Input(usize),
    /// The i-th output tensor.
    Output(usize),
    /// Constant data from the payload, loaded once.
    Constant(Blob),
    /// A region of the arena, at this byte offset (planned from buffer lifetimes).
    Scratch { offset: u64 },
    /// The same bytes as another buffer, from this byte offset (views: reshape, squeeze...).
    Alias { of: usize, offset: u64 },
    /// The run's status word (`crate::status`, `STATUS_BYTES`): reset before a run, written by
    /// kernels that fail, read after. At most one a program.
    Status,
    /// The i-th state tensor (`Manifest::state`): the caller's, kept across runs, read by the
    /// launches before the one that writes its new value over it (in place).
    State(usize),
}

/// A tensor a program updates in place: the step graph's input `input` and output `output`
/// share its buffer (`BufferKind::State`), which the caller keeps from run to run
/// (`Executable::run_with_state`). Every launch that reads the old value comes before the one
/// that writes the new (the compiler orders them; the devices keep the order, as for any read
/// before a write of the same bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDesc {
    /// The graph input it is (the old value).
    pub input: String,
    /// The graph output whose value is written over it (the new value).
    pub output: String,
    /// kiln's dtype name.
    pub dtype: String,
    pub dims: Vec<usize>,
    /// Its buffer (kind `State`).
    pub buffer: usize,
    /// The launch that writes the new value: the launches before it that take the buffer read
    /// the old value, those after it the new.
    pub writer: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    pub bytes: u64,
    pub kind: BufferKind,
}

/// A compiled kernel: a function in the code blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelDesc {
    /// The entry point: the CPU symbol, the PTX `.entry`, the SPIR-V `OpEntryPoint`.
    pub symbol: String,
    /// CPU: how many workgroups one launch of it runs.
    pub workgroups: u64,
    /// What the kernel computes, for profiles and errors (`fc1: Gemm + Relu`).
    pub label: String,
    /// GPU: workgroups (blocks) in x, y, z.
    #[serde(default)]
    pub grid: [u32; 3],
    /// GPU: threads per workgroup in x, y, z.
    #[serde(default)]
    pub block: [u32; 3],
    /// GPU: the bytes one launch moves at least (each argument buffer read or written once),
    /// for profiles' achieved bandwidth.
    #[serde(default)]
    pub bytes: u64,
    /// GPU: the floating-point operations one launch does (a multiply-add counts two), where
    /// the compiler counts them (contractions); 0 where it does not.
    #[serde(default)]
    pub flops: u64,
}

/// One launch of a kernel on buffers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub kernel: usize,
    /// Buffer indices, one per kernel argument (GPU: one device pointer each, in this order).
    pub args: Vec<usize>,
    /// Positions in `args` the kernel may write; empty means any of them. Devices that run
    /// launches concurrently order them by what they read and write.
    #[serde(default)]
    pub writes: Vec<usize>,
}

impl Launch {
    /// Whether the argument at `position` may be written.
    pub fn may_write(&self, position: usize) -> bool {
        self.writes.is_empty() || self.writes.contains(&position)
    }
}

/// Everything about a compiled model except the bytes of its code and constants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The kiln version that wrote it.
    pub kiln_version: String,
    pub model: String,
    pub target: Target,
    /// The CPU features or GPU architecture the code was compiled for, for people.
    pub target_detail: String,
    /// CPU features the code uses (`avx512f`, `fma`...); the runtime refuses a host without one.
    #[serde(default)]
    pub cpu_features: Vec<String>,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    /// Tensors updated in place (static CPU programs only): not among `inputs` and `outputs`,
    /// the caller passes them to every run (`Executable::run_with_state`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<StateDesc>,
    pub buffers: Vec<BufferDesc>,
    pub kernels: Vec<KernelDesc>,
    /// In order: a valid schedule.
    pub launches: Vec<Launch>,
    /// The code blob: a shared object, PTX text or SPIR-V words.
    pub code: Blob,
    /// Bytes of the scratch arena.
    pub arena_bytes: u64,
    /// A symbolic batch: the programs for several batch sizes, which the runtime combines to
    /// run any batch in range. The manifest's own buffers, kernels and launches are then empty,
    /// and its inputs and outputs give the sizes of one sample (1 on the batch axis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchDesc>,
    /// Run-time control flow: static programs and the host steps that run them (an If decided
    /// by a value computed at run time). The manifest's own buffers, kernels and launches are
    /// then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlDesc>,
    /// A padded symbol: one program compiled with the symbol at a capacity, which runs every
    /// size up to it. The manifest's own buffers, kernels and launches are then empty, and its
    /// inputs and outputs give the sizes at the capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padded: Option<PaddedDesc>,
    /// CPU: the scratch the kernels allocate for themselves (the C kernels' packed panels and
    /// padded copies, MLIR's temporaries), bounded at compile time. Absent where a bound is not
    /// known (an artifact written before it, a temporary of a size the compiler cannot read):
    /// the load does not count it, and the run-time cap alone holds the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<ScratchDesc>,
}

/// Bounds of the kernel scratch of one CPU program, in bytes a thread. Scratch is per thread:
/// the C kernels keep theirs from launch to launch (each thread its own, grown to the largest
/// any kernel asked of it), MLIR's temporaries live while their kernel runs. The thread that
/// calls `run` takes part in every launch; a worker only in those of more than one workgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchDesc {
    /// What the calling thread may hold at once.
    pub caller: u64,
    /// What each worker thread may hold at once.
    pub worker: u64,
    /// Per kernel (beside `kernels`), what it asks of one thread by itself, for errors that
    /// name the kernel.
    pub kernels: Vec<u64>,
}

/// How an artifact compiled for a padded symbol runs a size `n` up to its capacity: the padded
/// inputs' axis is zero-filled from `n` to the capacity, `n` is passed as the program's last
/// input (one i64), and each padded output is cut to `n` plus its `extra` positions. The
/// compiler proved nothing reads the padding (`pad::plan`), so this is exact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaddedDesc {
    /// The symbol, as the model names it (`past`, `seq`).
    pub symbol: String,
    /// The largest size a run may have (the program's size along the padded axes).
    pub capacity: u64,
    /// The inputs the symbol sizes and on which axis (`extra` 0).
    pub inputs: Vec<PaddedAxis>,
    /// The outputs padded along an axis, valid up to the size plus `extra`.
    pub outputs: Vec<PaddedAxis>,
    /// Takes the manifest's inputs, then the size; gives its outputs.
    pub program: Box<Manifest>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaddedAxis {
    /// The input's or output's index.
    pub tensor: usize,
    pub axis: usize,
    pub extra: u64,
}

impl Manifest {
    /// The kernels of this program and of every program it holds.
    pub fn kernel_count(&self) -> usize {
        let batch = self.batch.iter().flat_map(|b| &b.programs).map(|p| p.manifest.kernel_count());
        let control = self.control.iter().flat_map(|c| &c.programs).map(Manifest::kernel_count);
        let padded = self.padded.iter().map(|p| p.program.kernel_count());
        self.kernels.len() + batch.sum::<usize>() + control.sum::<usize>() + padded.sum::<usize>()
    }
}

/// A model whose control flow is decided at run time, as static programs and the steps that run
/// them on host values (tensors). Values are written once: the inputs are values
/// `0..inputs.len()`, in order; every other value is some step's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlDesc {
    /// The programs, each a manifest of its own (static, or with control flow of its own); their
    /// blobs are in the artifact's payload.
    pub programs: Vec<Manifest>,
    /// Each value's name and type.
    pub values: Vec<ValueDesc>,
    /// In order.
    pub steps: Vec<Step>,
    /// The value of each output, in order.
    pub outputs: Vec<usize>,
}

/// A value the host passes between programs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueDesc {
    pub name: String,
    pub dtype: String,
    /// Empty when `dynamic`.
    pub dims: Vec<usize>,
    /// The dims are known only at run time: a result of a host evaluation (`Step::Eval`) whose
    /// shape depends on the data. Only host evaluations and the outputs may read it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dynamic: bool,
}

/// One host step of a `ControlDesc`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Runs a program on `args`; its outputs become `results`.
    Run { program: usize, args: Vec<usize>, results: Vec<usize> },
    /// Runs `then` when the one bool value `cond` is true, else `otherwise`, on the same `args`;
    /// the programs have the same outputs, which become `results`.
    If { cond: usize, then: usize, otherwise: usize, args: Vec<usize>, results: Vec<usize> },
    /// Runs `body` once per position along the scanned values' axes. The body takes `captured`,
    /// the state (`state` at the first step, its own state results after) and one slice of each
    /// scanned value, and gives the next state, then one slice of each stacked result. `results`
    /// are the final state, then the stacked values.
    Scan {
        body: usize,
        captured: Vec<usize>,
        state: Vec<usize>,
        scanned: Vec<Scanned>,
        stacked: Vec<Stacked>,
        results: Vec<usize>,
    },
    /// Runs `body` while the step number is below the one i64 `trip_count` (if any) and the
    /// condition holds (the one bool `cond` at first, if any; then the body's). The body takes
    /// `captured`, the step number (one i64), the condition (one bool) and the state (`state` at
    /// the first step, its own state results after), and gives the condition, the next state and
    /// one slice of each stacked result. `results` are the final state, then each stacked value
    /// (its slices along a new leading axis, whose size the run must match).
    Loop {
        /// The Loop node's name, for errors (`LoadOptions::max_loop_steps`); empty in artifacts
        /// written before it.
        #[serde(default)]
        node: String,
        body: usize,
        captured: Vec<usize>,
        trip_count: Option<usize>,
        cond: Option<usize>,
        state: Vec<usize>,
        results: Vec<usize>,
    },
    /// Evaluates `graph` (kiln's text form, constants in full) with kiln's interpreter on `args`
    /// (its inputs, in order); its outputs become `results`. The compiler puts here the ops whose
    /// result shapes depend on the data (NonZero, Compress, NonMaxSuppression, Unique) and
    /// everything after them. The graph is untrusted: it is parsed and checked against the
    /// values at load.
    Eval { graph: String, args: Vec<usize>, results: Vec<usize> },
}

/// A value a Scan step slices: `axis` removed from each slice, read last position first when
/// `reverse`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scanned {
    pub value: usize,
    pub axis: usize,
    pub reverse: bool,
}

/// How a Scan step stacks a result's slices: along a new `axis`, the last step's first when
/// `reverse`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stacked {
    pub axis: usize,
    pub reverse: bool,
}

/// How an artifact compiled for a symbolic batch runs a batch of `n`: the batch is split into
/// chunks, largest program first (13 with programs for 8, 4, 2 and 1 runs 8, 4, 1), and each
/// chunk runs its program on that chunk's rows of the batched inputs. The compiler proved every
/// sample's results depend only on that sample's inputs, so this is exact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchDesc {
    /// The batch dimension's symbol, as the model names it (`N`, `batch_size`).
    pub symbol: String,
    /// The batch sizes a run may have, inclusive.
    pub min: u64,
    pub max: u64,
    /// Per input (per output): whether its leading axis is the batch. Others are the same for
    /// every sample.
    pub inputs: Vec<bool>,
    pub outputs: Vec<bool>,
    /// One static program per batch size, largest first. Their blobs are in the artifact's
    /// payload (constants two programs share are stored once).
    pub programs: Vec<BatchProgram>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchProgram {
    /// The batch size it was compiled for.
    pub batch: u64,
    pub manifest: Manifest,
}
/// An artifact in memory: its manifest and payload.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub manifest: Manifest,
    pub payload: Vec<u8>,
}

impl Artifact {
    /// The bytes of a blob.
    pub fn blob(&self, b: Blob) -> Result<&[u8]> {
        let (start, end) = (b.offset as usize, (b.offset + b.len) as usize);
        self.payload.get(start..end).ok_or_else(|| RuntimeError::Artifact {
            path: self.manifest.model.clone(),
            msg: format!(
                "blob {start}..{end} lies outside the {}-byte payload",
                self.payload.len()
            ),
        })
    }

    /// Serialises to the file format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let manifest = serde_json::to_vec(&self.manifest).expect("the manifest serialises");
        let mut crc = crc32fast::Hasher::new();
        crc.update(&manifest);
        crc.update(&self.payload);
        let mut out = Vec::with_capacity(HEADER + manifest.len() + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc.finalize().to_le_bytes());
        out.resize(HEADER, 0);
        out.extend_from_slice(&manifest);
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses the file format; `path` names the file in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Artifact> {
        let bad = |msg: String| RuntimeError::Artifact { path: path.to_string(), msg };
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(bad(
                "not a kiln artifact (no KILNART header); compile a model with `kiln compile`"
                    .into(),
            ));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = word(8);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "artifact format version {version}, this runtime reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}; recompile the model"
            )));
        }
        let (m, p) = (long(16) as usize, long(24) as usize);
        let want = HEADER
            .checked_add(m)
            .and_then(|x| x.checked_add(p))
            .ok_or_else(|| bad("corrupt header (sizes overflow)".into()))?;
        if bytes.len() != want {
            return Err(bad(format!(
                "the file has {} bytes but its header says {want} (truncated or damaged)",
                bytes.len()
            )));
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[HEADER..]);
        if crc.finalize() != word(32) {
            return Err(bad("checksum mismatch: the file is damaged".into()));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes[HEADER..HEADER + m])
            .map_err(|e| bad(format!("corrupt manifest: {e}")))?;
        let art = Artifact { manifest, payload: bytes[HEADER + m..].to_vec() };
        art.validate().map_err(bad)?;
        Ok(art)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes())
            .map_err(|e| RuntimeError::Io(format!("{}: {e}", path.display())))
    }

    pub fn read(path: &Path) -> Result<Artifact> {
        let bytes = std::fs::read(path)
            .map_err(|e| RuntimeError::Io(format!("{}: {e}", path.display())))?;
        Artifact::from_bytes(&bytes, &path.display().to_string())
    }

    /// Checks the manifest is self-consistent, so running it cannot index out of bounds.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.validate_manifest(&self.manifest)
    }

    fn validate_manifest(&self, m: &Manifest) -> std::result::Result<(), String> {
        let programs = m.batch.is_some() || m.control.is_some() || m.padded.is_some();
        if !m.state.is_empty() && (programs || m.target != Target::Cpu) {
            return Err(format!(
                "state updated in place is a static CPU program's, not {}",
                if programs {
                    "a manifest of programs'".to_string()
                } else {
                    format!("{}'s", m.target.name())
                }
            ));
        }
        if programs && m.scratch.is_some() {
            return Err(
                "a manifest of programs has no kernel scratch of its own (its programs do)".into(),
            );
        }
        match (&m.batch, &m.control, &m.padded) {
            (None, None, None) => self.validate_program(m),
            (Some(b), None, None) => self.validate_batched(m, b),
            (None, Some(c), None) => self.validate_control(m, c),
            (None, None, Some(p)) => self.validate_padded(m, p),
            _ => Err(
                "a manifest is batched, has control flow or has a padded symbol, only one of them"
                    .into(),
            ),
        }
    }

    /// A padded symbol: the program is valid for the artifact's target and takes the manifest's
    /// inputs and then one i64 size, and gives its outputs; every padded axis exists and has
    /// the capacity (plus its extra positions, for outputs).
    fn validate_padded(&self, m: &Manifest, p: &PaddedDesc) -> std::result::Result<(), String> {
        if !(m.buffers.is_empty() && m.kernels.is_empty() && m.launches.is_empty()) {
            return Err(
                "a manifest with a padded symbol has no buffers, kernels or launches of its own"
                    .into(),
            );
        }
        let pm = &p.program;
        if pm.target != m.target {
            return Err(format!(
                "the padded program is for {}, the artifact for {}",
                pm.target.name(),
                m.target.name()
            ));
        }
        self.validate_manifest(pm).map_err(|e| format!("the padded program: {e}"))?;
        let same = |a: &TensorDesc, b: &TensorDesc| a.dtype == b.dtype && a.dims == b.dims;
        let size_ok = pm
            .inputs
            .last()
            .is_some_and(|t| t.dtype == "i64" && t.dims.iter().product::<usize>() == 1);
        if pm.inputs.len() != m.inputs.len() + 1
            || !size_ok
            || pm.inputs.iter().zip(&m.inputs).any(|(a, b)| !same(a, b))
        {
            return Err(format!(
                "the padded program must take the artifact's {} inputs and then one i64 size",
                m.inputs.len()
            ));
        }
        if pm.outputs.len() != m.outputs.len()
            || pm.outputs.iter().zip(&m.outputs).any(|(a, b)| !same(a, b))
        {
            return Err("the padded program must give the artifact's outputs".into());
        }
        if p.inputs.is_empty() {
            return Err(format!("`{}` pads no input", p.symbol));
        }
        for (list, tensors, what) in
            [(&p.inputs, &m.inputs, "input"), (&p.outputs, &m.outputs, "output")]
        {
            for a in list {
                let t = tensors.get(a.tensor).ok_or_else(|| {
                    format!("padded {what} {} does not exist (of {})", a.tensor, tensors.len())
                })?;
                let want = p.capacity + if what == "input" { 0 } else { a.extra };
                if what == "input" && a.extra != 0 {
                    return Err(format!(
                        "padded input `{}` has {} extra positions; inputs have none",
                        t.name, a.extra
                    ));
                }
                if t.dims.get(a.axis).map(|&d| d as u64) != Some(want) {
                    return Err(format!(
                        "padded {what} `{}` ({}{:?}) has no axis {} of size {want}",
                        t.name, t.dtype, t.dims, a.axis
                    ));
                }
            }
        }
        Ok(())
    }

    /// Control flow: every program valid for the artifact's target; every step's values exist,
    /// are written before they are read and once only, and have the types its programs take and
    /// give; an If's condition is one bool; the outputs are values of their types.
    fn validate_control(&self, m: &Manifest, c: &ControlDesc) -> std::result::Result<(), String> {
        if !(m.buffers.is_empty() && m.kernels.is_empty() && m.launches.is_empty()) {
            return Err(
                "a manifest with control flow has no buffers, kernels or launches of its own"
                    .into(),
            );
        }
        // A model whose every node runs on the host has no compiled program.
        let on_host = c.steps.iter().any(|s| matches!(s, Step::Eval { .. }));
        if c.programs.is_empty() && !on_host {
            return Err("control flow with no programs".into());
        }
        // A value whose dims are known only at run time matches any dims (an output's).
        let same =
            |v: &ValueDesc, t: &TensorDesc| v.dtype == t.dtype && (v.dynamic || v.dims == t.dims);
        if c.values.len() < m.inputs.len() {
            return Err(format!(
                "control flow has {} values for {} inputs",
                c.values.len(),
                m.inputs.len()
            ));
        }
        for (v, t) in c.values.iter().zip(&m.inputs) {
            if !same(v, t) {
                return Err(format!(
                    "input `{}` is {}{:?}, its value {}{:?}",
                    t.name, t.dtype, t.dims, v.dtype, v.dims
                ));
            }
        }
        if let Some(v) = c.values.iter().find(|v| kiln_ir::DType::from_name(&v.dtype).is_none()) {
            return Err(format!("value `{}` has unknown type `{}`", v.name, v.dtype));
        }
        for (i, p) in c.programs.iter().enumerate() {
            if p.target != m.target {
                return Err(format!(
                    "program {i} is for {}, the artifact for {}",
                    p.target.name(),
                    m.target.name()
                ));
            }
            self.validate_manifest(p).map_err(|e| format!("program {i}: {e}"))?;
        }
        if let Some(v) = c.values[..m.inputs.len()].iter().find(|v| v.dynamic) {
            return Err(format!("input `{}` cannot have dims known only at run time", v.name));
        }
        let mut written = vec![false; c.values.len()];
        written[..m.inputs.len()].fill(true);
        // Only host evaluations and the outputs read a value of run-time dims.
        let read_by_program = |s: usize, step: &Step| {
            let read: Vec<usize> = match step {
                Step::Run { args, .. } => args.clone(),
                Step::If { cond, args, .. } => [*cond].iter().chain(args).copied().collect(),
                Step::Scan { captured, state, scanned, .. } => captured
                    .iter()
                    .chain(state)
                    .copied()
                    .chain(scanned.iter().map(|s| s.value))
                    .collect(),
                Step::Loop { captured, trip_count, cond, state, .. } => {
                    captured.iter().chain(trip_count).chain(cond).chain(state).copied().collect()
                }
                Step::Eval { .. } => Vec::new(),
            };
            match read.iter().find(|&&v| c.values.get(v).is_some_and(|d| d.dynamic)) {
                Some(&v) => Err(format!(
                    "step {s}: value `{}` has dims known only at run time; only a host evaluation reads it",
                    c.values[v].name
                )),
                None => Ok(()),
            }
        };
        let value = |v: usize, written: &[bool]| match c.values.get(v) {
            Some(d) if written[v] => Ok(d),
            Some(d) => Err(format!("value `{}` is read before it is written", d.name)),
            None => Err(format!("value {v} does not exist (of {})", c.values.len())),
        };
        for (s, step) in c.steps.iter().enumerate() {
            read_by_program(s, step)?;
            let fail = |e: String| format!("step {s}: {e}");
            let program = |p: usize| {
                c.programs.get(p).ok_or_else(|| {
                    fail(format!("program {p} does not exist (of {})", c.programs.len()))
                })
            };
            let counts = |p: usize, pm: &Manifest, args: usize, results: usize| {
                if args != pm.inputs.len() || results != pm.outputs.len() {
                    return Err(fail(format!(
                        "program {p} takes {} values and gives {}, the step passes {args} and takes {results}",
                        pm.inputs.len(),
                        pm.outputs.len()
                    )));
                }
                Ok(())
            };
            let reads = |p: usize, t: &TensorDesc, have: &ValueDesc| {
                if same(have, t) {
                    Ok(())
                } else {
                    Err(fail(format!(
                        "program {p} reads `{}` as {}{:?}, it is {}{:?}",
                        t.name, t.dtype, t.dims, have.dtype, have.dims
                    )))
                }
            };
            let gives = |p: usize, t: &TensorDesc, r: usize| {
                let d = c.values.get(r).ok_or_else(|| {
                    fail(format!("value {r} does not exist (of {})", c.values.len()))
                })?;
                if same(d, t) {
                    Ok(())
                } else {
                    Err(fail(format!(
                        "program {p} gives `{}` as {}{:?}, value `{}` is {}{:?}",
                        t.name, t.dtype, t.dims, d.name, d.dtype, d.dims
                    )))
                }
            };
            let one = |v: usize, dtype: &str, what: &str| {
                let d = value(v, &written).map_err(fail)?;
                if d.dtype != dtype || d.dims.iter().product::<usize>() != 1 {
                    return Err(fail(format!(
                        "the {what} `{}` is {}{:?}, not one {dtype}",
                        d.name, d.dtype, d.dims
                    )));
                }
                Ok(())
            };
            let results = match step {
                Step::Run { program: p, args, results }
                | Step::If { then: p, args, results, .. } => {
                    let mut ps = vec![*p];
                    if let Step::If { cond, otherwise, .. } = step {
                        one(*cond, "bool", "condition")?;
                        ps.push(*otherwise);
                    }
                    for p in ps {
                        let pm = program(p)?;
                        counts(p, pm, args.len(), results.len())?;
                        for (&a, t) in args.iter().zip(&pm.inputs) {
                            reads(p, t, value(a, &written).map_err(fail)?)?;
                        }
                        for (&r, t) in results.iter().zip(&pm.outputs) {
                            gives(p, t, r)?;
                        }
                    }
                    results
                }
                Step::Scan { body, captured, state, scanned, stacked, results } => {
                    let pm = program(*body)?;
                    counts(
                        *body,
                        pm,
                        captured.len() + state.len() + scanned.len(),
                        state.len() + stacked.len(),
                    )?;
                    if results.len() != pm.outputs.len() {
                        return Err(fail(format!(
                            "the scan gives {} results, the step takes {}",
                            pm.outputs.len(),
                            results.len()
                        )));
                    }
                    let mut length = None;
                    let mut slices = Vec::new();
                    for sc in scanned {
                        let d = value(sc.value, &written).map_err(fail)?;
                        let Some(&l) = d.dims.get(sc.axis) else {
                            return Err(fail(format!(
                                "`{}` ({}{:?}) has no axis {}",
                                d.name, d.dtype, d.dims, sc.axis
                            )));
                        };
                        if length.is_some_and(|m| m != l) {
                            return Err(fail(format!(
                                "the scanned values have lengths {} and {l}",
                                length.unwrap_or_default()
                            )));
                        }
                        length = Some(l);
                        let mut dims = d.dims.clone();
                        dims.remove(sc.axis);
                        slices.push(ValueDesc {
                            name: d.name.clone(),
                            dtype: d.dtype.clone(),
                            dims,
                            dynamic: false,
                        });
                    }
                    let length =
                        length.ok_or_else(|| fail("a scan needs a scanned value".into()))?;
                    let ins: Vec<ValueDesc> = captured
                        .iter()
                        .chain(state)
                        .map(|&v| value(v, &written).cloned())
                        .collect::<std::result::Result<_, _>>()
                        .map_err(fail)?;
                    for (t, d) in pm.inputs.iter().zip(ins.iter().chain(&slices)) {
                        reads(*body, t, d)?;
                    }
                    // The state the body gives is the state it takes at the next step.
                    for (k, t) in pm.outputs.iter().take(state.len()).enumerate() {
                        reads(*body, t, &ins[captured.len() + k])?;
                        gives(*body, t, results[k])?;
                    }
                    for ((t, st), &r) in pm
                        .outputs
                        .iter()
                        .skip(state.len())
                        .zip(stacked)
                        .zip(&results[state.len()..])
                    {
                        if st.axis > t.dims.len() {
                            return Err(fail(format!(
                                "`{}` ({}{:?}) cannot be stacked along axis {}",
                                t.name, t.dtype, t.dims, st.axis
                            )));
                        }
                        let mut dims = t.dims.clone();
                        dims.insert(st.axis, length);
                        gives(*body, &TensorDesc { dims, ..t.clone() }, r)?;
                    }
                    results
                }
                Step::Loop { body, captured, trip_count, cond, state, results, .. } => {
                    let pm = program(*body)?;
                    counts(*body, pm, captured.len() + 2 + state.len(), results.len() + 1)?;
                    if results.len() < state.len() {
                        return Err(fail(format!(
                            "the loop carries {} state values but takes {} results",
                            state.len(),
                            results.len()
                        )));
                    }
                    if let Some(t) = trip_count {
                        one(*t, "i64", "trip count")?;
                    }
                    if let Some(c) = cond {
                        one(*c, "bool", "condition")?;
                    }
                    let ins: Vec<ValueDesc> = captured
                        .iter()
                        .chain(state)
                        .map(|&v| value(v, &written).cloned())
                        .collect::<std::result::Result<_, _>>()
                        .map_err(fail)?;
                    let (n, k) = (captured.len(), state.len());
                    for (t, d) in pm.inputs[..n]
                        .iter()
                        .zip(&ins[..n])
                        .chain(pm.inputs[n + 2..].iter().zip(&ins[n..]))
                    {
                        reads(*body, t, d)?;
                    }
                    for (i, (t, dtype)) in
                        pm.inputs[n..n + 2].iter().zip(["i64", "bool"]).enumerate()
                    {
                        if t.dtype != dtype || t.dims.iter().product::<usize>() != 1 {
                            let what = ["step number", "condition"][i];
                            return Err(fail(format!(
                                "the body takes its {what} `{}` as {}{:?}, not one {dtype}",
                                t.name, t.dtype, t.dims
                            )));
                        }
                    }
                    let co = &pm.outputs[0];
                    if co.dtype != "bool" || co.dims.iter().product::<usize>() != 1 {
                        return Err(fail(format!(
                            "the body gives its condition `{}` as {}{:?}, not one bool",
                            co.name, co.dtype, co.dims
                        )));
                    }
                    // The state the body gives is the state it takes at the next step.
                    for (j, t) in pm.outputs[1..=k].iter().enumerate() {
                        reads(*body, t, &ins[n + j])?;
                        gives(*body, t, results[j])?;
                    }
                    // Each stacked value: the body's slice under a leading axis of the steps run,
                    // one size for all of them.
                    let mut length = None;
                    for (t, &r) in pm.outputs[k + 1..].iter().zip(&results[k..]) {
                        let l = match c.values.get(r).map(|d| d.dims.first()) {
                            Some(Some(&l)) => l,
                            Some(None) => {
                                return Err(fail(format!(
                                    "the stacked value `{}` has no leading axis",
                                    c.values[r].name
                                )))
                            }
                            None => {
                                return Err(fail(format!(
                                    "value {r} does not exist (of {})",
                                    c.values.len()
                                )))
                            }
                        };
                        if length.is_some_and(|m| m != l) {
                            return Err(fail(format!(
                                "the stacked values have {} and {l} steps",
                                length.unwrap_or_default()
                            )));
                        }
                        length = Some(l);
                        let mut dims = t.dims.clone();
                        dims.insert(0, l);
                        gives(*body, &TensorDesc { dims, ..t.clone() }, r)?;
                    }
                    results
                }
                Step::Eval { graph, args, results } => {
                    let ins: Vec<&ValueDesc> = args
                        .iter()
                        .map(|&v| value(v, &written))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(fail)?;
                    let outs: Vec<&ValueDesc> = results
                        .iter()
                        .map(|&r| {
                            c.values.get(r).ok_or_else(|| {
                                format!("value {r} does not exist (of {})", c.values.len())
                            })
                        })
                        .collect::<std::result::Result<_, _>>()
                        .map_err(fail)?;
                    check_host_graph(graph, &ins, &outs).map_err(fail)?;
                    results
                }
            };
            for &r in results {
                if std::mem::replace(&mut written[r], true) {
                    return Err(fail(format!("value `{}` is written twice", c.values[r].name)));
                }
            }
        }
        if c.outputs.len() != m.outputs.len() {
            return Err(format!(
                "control flow gives {} outputs, the artifact has {}",
                c.outputs.len(),
                m.outputs.len()
            ));
        }
        for (&v, t) in c.outputs.iter().zip(&m.outputs) {
            let d = value(v, &written)?;
            if !same(d, t) {
                return Err(format!(
                    "output `{}` is {}{:?}, its value `{}` is {}{:?}",
                    t.name, t.dtype, t.dims, d.name, d.dtype, d.dims
                ));
            }
        }
        Ok(())
    }

    /// A batched artifact: every program is a valid static one with the same interface, whose
    /// batched tensors have its batch size as their leading dimension.
    fn validate_batched(&self, m: &Manifest, b: &BatchDesc) -> std::result::Result<(), String> {
        if b.inputs.len() != m.inputs.len() || b.outputs.len() != m.outputs.len() {
            return Err("the batch description does not match the inputs and outputs".into());
        }
        if !b.inputs.contains(&true) {
            return Err("a batched artifact needs a batched input".into());
        }
        if b.min == 0 || b.min > b.max {
            return Err(format!("the batch range {}..{} is empty or starts at 0", b.min, b.max));
        }
        if !b.programs.iter().any(|p| p.batch == 1) {
            return Err("a batched artifact needs a program for batch 1 (every batch is a sum of its programs' sizes)".into());
        }
        if b.programs.iter().any(|p| p.batch == 0) {
            return Err(
                "a batch program for batch 0 (every program runs at least one sample)".into()
            );
        }
        if b.programs.windows(2).any(|w| w[0].batch <= w[1].batch) {
            return Err("the batch programs are not in decreasing order of batch size".into());
        }
        let batched = |t: &TensorDesc, flag: bool| flag && t.dims.first().is_some_and(|&d| d == 1);
        if let Some(t) = m
            .inputs
            .iter()
            .zip(&b.inputs)
            .chain(m.outputs.iter().zip(&b.outputs))
            .find(|(t, &f)| f && !batched(t, f))
        {
            return Err(format!(
                "batched tensor `{}` does not have 1 as its leading dimension",
                t.0.name
            ));
        }
        for p in &b.programs {
            let pm = &p.manifest;
            if pm.batch.is_some() || pm.target != m.target {
                return Err(format!(
                    "the program for batch {} is not a program of one batch size for {}",
                    p.batch,
                    m.target.name()
                ));
            }
            let same = |ours: &[TensorDesc], theirs: &[TensorDesc], flags: &[bool]| {
                ours.len() == theirs.len()
                    && ours.iter().zip(theirs).zip(flags).all(|((o, t), &f)| {
                        let mut dims = o.dims.clone();
                        if f {
                            dims[0] = p.batch as usize;
                        }
                        o.name == t.name && o.dtype == t.dtype && dims == t.dims
                    })
            };
            if !same(&m.inputs, &pm.inputs, &b.inputs) || !same(&m.outputs, &pm.outputs, &b.outputs)
            {
                return Err(format!(
                    "the program for batch {} has other inputs or outputs than the artifact",
                    p.batch
                ));
            }
            self.validate_manifest(pm)
                .map_err(|e| format!("the program for batch {}: {e}", p.batch))?;
        }
        Ok(())
    }

    fn validate_program(&self, m: &Manifest) -> std::result::Result<(), String> {
        let nbuf = m.buffers.len();
        let in_payload = |b: &Blob| {
            b.offset.checked_add(b.len).is_some_and(|end| end <= self.payload.len() as u64)
        };
        if !in_payload(&m.code) {
            return Err("the code blob lies outside the payload".into());
        }
        for (i, b) in m.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Input(k) if *k >= m.inputs.len() => {
                    return Err(format!("buffer {i} is input {k}, of {}", m.inputs.len()))
                }
                BufferKind::Output(k) if *k >= m.outputs.len() => {
                    return Err(format!("buffer {i} is output {k}, of {}", m.outputs.len()))
                }
                BufferKind::State(k) if *k >= m.state.len() => {
                    return Err(format!("buffer {i} is state {k}, of {}", m.state.len()))
                }
                BufferKind::Constant(blob) if !in_payload(blob) || blob.len < b.bytes => {
                    return Err(format!("buffer {i}'s constant data lies outside the payload"))
                }
                BufferKind::Scratch { offset }
                    if offset.checked_add(b.bytes).is_none_or(|e| e > m.arena_bytes) =>
                {
                    return Err(format!("buffer {i} lies outside the arena"));
                }
                BufferKind::Alias { of, offset } => {
                    let target = m
                        .buffers
                        .get(*of)
                        .ok_or_else(|| format!("buffer {i} aliases missing buffer {of}"))?;
                    if matches!(target.kind, BufferKind::Alias { .. }) {
                        return Err(format!("buffer {i} aliases an alias (buffer {of})"));
                    }
                    if target.kind == BufferKind::Status {
                        return Err(format!("buffer {i} aliases the status word (buffer {of})"));
                    }
                    if offset.checked_add(b.bytes).is_none_or(|end| end > target.bytes) {
                        return Err(format!("buffer {i} aliases bytes outside buffer {of}"));
                    }
                }
                // Kernels write all of it, and the devices keep one a program.
                BufferKind::Status if b.bytes != crate::status::STATUS_BYTES => {
                    return Err(format!(
                        "buffer {i} is the status word of {} bytes, not {}",
                        b.bytes,
                        crate::status::STATUS_BYTES
                    ));
                }
                _ => {}
            }
        }
        let words = m.buffers.iter().filter(|b| b.kind == BufferKind::Status).count();
        if words > 1 {
            return Err(format!("{words} buffers are the status word; a program has at most one"));
        }
        for s in &m.state {
            let touches = m.launches.get(s.writer).is_some_and(|l| l.args.contains(&s.buffer));
            if !touches {
                return Err(format!(
                    "state `{}` is written by launch {}, which does not take its buffer {}",
                    s.input, s.writer, s.buffer
                ));
            }
        }
        let state: Vec<TensorDesc> = m
            .state
            .iter()
            .map(|s| TensorDesc {
                name: s.input.clone(),
                dtype: s.dtype.clone(),
                dims: s.dims.clone(),
                buffer: s.buffer,
            })
            .collect();
        let tensors = m.inputs.iter().enumerate().map(|(k, t)| (t, BufferKind::Input(k)));
        let tensors =
            tensors.chain(m.outputs.iter().enumerate().map(|(k, t)| (t, BufferKind::Output(k))));
        let tensors =
            tensors.chain(state.iter().enumerate().map(|(k, t)| (t, BufferKind::State(k))));
        for (t, kind) in tensors {
            let b = m
                .buffers
                .get(t.buffer)
                .ok_or_else(|| format!("tensor `{}` names missing buffer {}", t.name, t.buffer))?;
            let dtype = kiln_ir::DType::from_name(&t.dtype)
                .ok_or_else(|| format!("tensor `{}` has unknown type `{}`", t.name, t.dtype))?;
            // An empty one holds nothing (an unread input of a graph whose results fold away).
            // (Dims whose product overflows hold more than nothing.)
            let empty = t.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) == Some(0);
            if dtype.is_string() && !empty {
                return Err(format!(
                    "tensor `{}` is of strings, which no compiled buffer holds (strings are evaluated on the host)",
                    t.name
                ));
            }
            // Its own buffer, of exactly its bytes: a run copies and returns that many.
            if b.kind != kind {
                return Err(format!(
                    "tensor `{}` names buffer {}, which is not its {} buffer",
                    t.name,
                    t.buffer,
                    match kind {
                        BufferKind::Input(_) => "input",
                        BufferKind::Output(_) => "output",
                        _ => "state",
                    }
                ));
            }
            let want = kiln_ir::size::bytes(&t.dims, dtype).map(|n| n as u64);
            if want != Some(b.bytes) {
                return Err(format!(
                    "tensor `{}` is {}{:?} ({}), its buffer {} holds {} bytes",
                    t.name,
                    t.dtype,
                    t.dims,
                    want.map_or("too many bytes to address".to_string(), |n| format!("{n} bytes")),
                    t.buffer,
                    b.bytes
                ));
            }
        }
        let gpu = matches!(m.target, Target::Cuda | Target::Opencl);
        if gpu {
            for (i, k) in m.kernels.iter().enumerate() {
                if k.grid.contains(&0) || k.block.contains(&0) {
                    return Err(format!(
                        "kernel {i} (`{}`) has grid {:?} and block {:?}; a GPU kernel needs every entry at least 1",
                        k.symbol, k.grid, k.block
                    ));
                }
            }
        }
        if let Some(s) = &m.scratch {
            validate_scratch(m, s)?;
        }
        for (i, l) in m.launches.iter().enumerate() {
            if l.kernel >= m.kernels.len() {
                return Err(format!("launch {i} names missing kernel {}", l.kernel));
            }
            if let Some(a) = l.args.iter().find(|&&a| a >= nbuf) {
                return Err(format!("launch {i} names missing buffer {a}"));
            }
            if let Some(w) = l.writes.iter().find(|&&w| w >= l.args.len()) {
                return Err(format!("launch {i} writes argument {w}, of {}", l.args.len()));
            }
        }
        Ok(())
    }
}

/// A program's scratch bounds: CPU only, one per kernel, and each thread's bound covers every
/// kernel it runs (the caller all of them, a worker those of more than one workgroup), so that
/// the load's count cannot be less than a kernel's own.
fn validate_scratch(m: &Manifest, s: &ScratchDesc) -> std::result::Result<(), String> {
    if m.target != Target::Cpu {
        return Err(format!("kernel scratch is a CPU program's, not {}'s", m.target.name()));
    }
    if s.kernels.len() != m.kernels.len() {
        return Err(format!(
            "kernel scratch is given for {} kernels, of {}",
            s.kernels.len(),
            m.kernels.len()
        ));
    }
    if s.worker > s.caller {
        return Err(format!(
            "a worker's kernel scratch ({} bytes) exceeds the calling thread's ({}), which runs every kernel",
            s.worker, s.caller
        ));
    }
    for (i, (k, &bytes)) in m.kernels.iter().zip(&s.kernels).enumerate() {
        let thread = if k.workgroups > 1 { s.worker } else { s.caller };
        if bytes > thread {
            return Err(format!(
                "kernel {i} (`{}`) asks {bytes} bytes of scratch a thread, more than the {thread} bytes bounding a thread that runs it",
                k.label
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::hazard::tests::diamond;

    fn art(target: Target) -> Artifact {
        let manifest =
            diamond(target, 4096, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4096 });
        Artifact { manifest, payload: vec![0; 64 + 4096] }
    }

    #[test]
    fn gpu_kernels_need_a_grid_and_a_block() {
        assert_eq!(art(Target::Opencl).validate(), Ok(()));
        for target in [Target::Cuda, Target::Opencl] {
            let mut a = art(target);
            a.manifest.kernels[1].grid = [16, 0, 1];
            let e = a.validate().unwrap_err();
            assert!(e.contains("kernel 1 (`mul`) has grid [16, 0, 1]"), "{e}");
            let mut a = art(target);
            a.manifest.kernels[0].block = [0, 0, 0];
            assert!(a.validate().unwrap_err().contains("needs every entry at least 1"));
        }
        // The CPU ignores them (its artifacts leave them 0).
        let mut a = art(Target::Cpu);
        a.manifest.kernels[0].grid = [0; 3];
        a.manifest.kernels[0].block = [0; 3];
        assert_eq!(a.validate(), Ok(()));
    }

    #[test]
    fn writes_name_arguments_of_the_launch() {
        let mut a = art(Target::Cuda);
        a.manifest.launches[3].writes = vec![2, 3];
        assert_eq!(a.validate().unwrap_err(), "launch 3 writes argument 3, of 3");
        // Through the file format, as a reader meets it.
        let e = Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap_err().to_string();
        assert_eq!(e, "m.kiln: launch 3 writes argument 3, of 3");
    }

    #[test]
    fn gpu_fields_round_trip_and_default_when_absent() {
        let a = art(Target::Opencl);
        let back = Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap();
        assert_eq!(back.manifest, a.manifest);
        let k: KernelDesc =
            serde_json::from_str(r#"{"symbol":"k0","workgroups":4,"label":"x"}"#).unwrap();
        assert_eq!((k.grid, k.block), ([0; 3], [0; 3]));
        let l: Launch = serde_json::from_str(r#"{"kernel":0,"args":[1,2]}"#).unwrap();
        assert!(l.writes.is_empty() && l.may_write(0) && l.may_write(1));
    }

    #[test]
    fn batch_descriptions_are_checked_before_anything_runs() {
        // One-sample tensors ([1] each: n = 4 bytes), one program for batch 1.
        let program =
            diamond(Target::Cpu, 4, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4 });
        let batched = |programs: Vec<BatchProgram>| {
            let mut m = program.clone();
            (m.buffers, m.kernels, m.launches) = (vec![], vec![], vec![]);
            m.batch = Some(BatchDesc {
                symbol: "N".into(),
                min: 1,
                max: 8,
                inputs: vec![true, false],
                outputs: vec![true, true],
                programs,
            });
            Artifact { manifest: m, payload: vec![0; 128] }
        };
        let one = BatchProgram { batch: 1, manifest: program.clone() };
        let a = batched(vec![one.clone()]);
        assert_eq!(a.validate(), Ok(()));
        let back = Artifact::from_bytes(&a.to_bytes(), "b.kiln").unwrap();
        assert_eq!(back.manifest, a.manifest);
        let e = |a: Artifact| a.validate().unwrap_err();
        assert_eq!(e(batched(vec![])), "a batched artifact needs a program for batch 1 (every batch is a sum of its programs' sizes)");
        assert_eq!(
            e(batched(vec![one.clone(), one.clone()])),
            "the batch programs are not in decreasing order of batch size"
        );
        let mut two = one.clone();
        two.batch = 2;
        assert_eq!(
            e(batched(vec![two, one.clone()])),
            "the program for batch 2 has other inputs or outputs than the artifact"
        );
        let mut bad = one.clone();
        bad.manifest.launches[0].args[0] = 99;
        assert_eq!(
            e(batched(vec![bad])),
            "the program for batch 1: launch 0 names missing buffer 99"
        );
        let mut zero = one.clone();
        zero.batch = 0;
        assert_eq!(
            e(batched(vec![one.clone(), zero])),
            "a batch program for batch 0 (every program runs at least one sample)"
        );
        let mut a = batched(vec![one]);
        a.manifest.batch.as_mut().unwrap().min = 0;
        assert_eq!(e(a), "the batch range 0..8 is empty or starts at 0");
    }

    /// Inputs and outputs name their own buffers, of exactly their bytes: a run copies that many
    /// in and out (an output naming a constant, or a buffer smaller than its tensor, segfaulted).
    #[test]
    fn tensors_name_their_own_buffers_of_their_size() {
        assert_eq!(art(Target::Cpu).validate(), Ok(()));
        let mut a = art(Target::Cpu);
        let o = a.manifest.outputs[0].buffer;
        a.manifest.buffers[o].bytes -= 4;
        assert_eq!(
            a.validate().unwrap_err(),
            format!("tensor `o0` is f32[1024] (4096 bytes), its buffer {o} holds 4092 bytes")
        );
        let mut a = art(Target::Cpu);
        let constant = a
            .manifest
            .buffers
            .iter()
            .position(|b| matches!(b.kind, BufferKind::Constant(_)))
            .expect("the diamond has a constant");
        a.manifest.outputs[1].buffer = constant;
        assert_eq!(
            a.validate().unwrap_err(),
            format!("tensor `o1` names buffer {constant}, which is not its output buffer")
        );
        let mut a = art(Target::Cpu);
        a.manifest.inputs[0].dims = vec![1 << 62, 8];
        assert!(a.validate().unwrap_err().contains("too many bytes to address"));
    }

    #[test]
    fn control_flow_is_checked_before_anything_runs() {
        // The diamond (x, y -> o0, o1 of f32[1]) run once, then again on its results under an If.
        let program =
            diamond(Target::Cpu, 4, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4 });
        let f32s = |name: &str| ValueDesc {
            name: name.into(),
            dtype: "f32".into(),
            dims: vec![1],
            dynamic: false,
        };
        let control = ControlDesc {
            programs: vec![program.clone()],
            values: vec![
                f32s("x"),
                f32s("y"),
                ValueDesc { name: "c".into(), dtype: "bool".into(), dims: vec![], dynamic: false },
                f32s("a"),
                f32s("b"),
                f32s("p"),
                f32s("q"),
            ],
            steps: vec![
                Step::Run { program: 0, args: vec![0, 1], results: vec![3, 4] },
                Step::If { cond: 2, then: 0, otherwise: 0, args: vec![3, 4], results: vec![5, 6] },
            ],
            outputs: vec![5, 6],
        };
        let outer = |c: ControlDesc| {
            let mut m = program.clone();
            (m.buffers, m.kernels, m.launches) = (vec![], vec![], vec![]);
            m.inputs.push(TensorDesc {
                name: "c".into(),
                dtype: "bool".into(),
                dims: vec![],
                buffer: 0,
            });
            m.control = Some(c);
            Artifact { manifest: m, payload: vec![0; 128] }
        };
        let a = outer(control.clone());
        assert_eq!(a.validate(), Ok(()));
        assert_eq!(a.manifest.kernel_count(), 2);
        let back = Artifact::from_bytes(&a.to_bytes(), "c.kiln").unwrap();
        assert_eq!(back.manifest, a.manifest);
        let e = |edit: &dyn Fn(&mut ControlDesc)| {
            let mut c = control.clone();
            edit(&mut c);
            outer(c).validate().unwrap_err()
        };
        assert_eq!(e(&|c| c.steps.swap(0, 1)), "step 0: value `a` is read before it is written");
        assert_eq!(
            e(&|c| c.values[2].dtype = "i64".into()),
            "input `c` is bool[], its value i64[]"
        );
        let cond_a = |c: &mut ControlDesc| {
            if let Step::If { cond, .. } = &mut c.steps[1] {
                *cond = 3;
            }
        };
        assert_eq!(e(&cond_a), "step 1: the condition `a` is f32[1], not one bool");
        assert_eq!(
            e(&|c| c.values[4].dims = vec![2]),
            "step 0: program 0 gives `o1` as f32[1], value `b` is f32[2]"
        );
        assert_eq!(e(&|c| c.steps[1] = c.steps[0].clone()), "step 1: value `a` is written twice");
        assert_eq!(e(&|c| c.outputs = vec![5]), "control flow gives 1 outputs, the artifact has 2");
        assert_eq!(e(&|c| c.outputs[1] = 9), "value 9 does not exist (of 7)");
        assert_eq!(
            e(&|c| c.programs[0].launches[0].kernel = 7),
            "program 0: launch 0 names missing kernel 7"
        );
        assert_eq!(e(&|c| c.programs.clear()), "control flow with no programs");
    }

    /// `s = a + b` and `n = NonZero(s)` (whose count depends on the data), in the text form.
    fn host_graph() -> String {
        let g = kiln_ir::builder::GraphBuilder::new("host");
        let a = g.input("a", kiln_ir::DType::F32, vec![1]);
        let b = g.input("b", kiln_ir::DType::F32, vec![1]);
        let s = (a + b).named("s");
        g.output("s", s);
        g.output("n", g.apply(kiln_ir::Op::NonZero, &[Some(s)], 1)[0]);
        kiln_ir::text::print(&g.build().unwrap(), kiln_ir::text::Weights::Full)
    }

    #[test]
    fn host_evaluation_graphs_are_parsed_and_checked_at_load() {
        // The diamond's results a and b, then `s = a + b` and `n = NonZero(s)` on the host.
        let program =
            diamond(Target::Cpu, 4, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4 });
        let value = |name: &str, dtype: &str, dims: Vec<usize>, dynamic: bool| ValueDesc {
            name: name.into(),
            dtype: dtype.into(),
            dims,
            dynamic,
        };
        let control = ControlDesc {
            programs: vec![program.clone()],
            values: vec![
                value("x", "f32", vec![1], false),
                value("y", "f32", vec![1], false),
                value("a", "f32", vec![1], false),
                value("b", "f32", vec![1], false),
                value("s", "f32", vec![1], false),
                value("n", "i64", vec![], true),
            ],
            steps: vec![
                Step::Run { program: 0, args: vec![0, 1], results: vec![2, 3] },
                Step::Eval { graph: host_graph(), args: vec![2, 3], results: vec![4, 5] },
            ],
            outputs: vec![4, 5],
        };
        let outer = |c: ControlDesc| {
            let mut m = program.clone();
            (m.buffers, m.kernels, m.launches) = (vec![], vec![], vec![]);
            // The output of run-time dims has none in the interface.
            (m.outputs[1].dtype, m.outputs[1].dims) = ("i64".into(), vec![]);
            m.control = Some(c);
            Artifact { manifest: m, payload: vec![0; 128] }
        };
        let a = outer(control.clone());
        assert_eq!(a.validate(), Ok(()));
        let back = Artifact::from_bytes(&a.to_bytes(), "h.kiln").unwrap();
        assert_eq!(back.manifest, a.manifest);
        let e = |edit: &dyn Fn(&mut ControlDesc)| {
            let mut c = control.clone();
            edit(&mut c);
            outer(c).validate().unwrap_err()
        };
        let graph = |text: String| {
            move |c: &mut ControlDesc| {
                c.steps[1] =
                    Step::Eval { graph: text.clone(), args: vec![2, 3], results: vec![4, 5] }
            }
        };
        // A graph cut short, and one naming an op that does not exist: typed errors, no panic.
        let cut = host_graph()[..40].to_string();
        assert!(e(&graph(cut)).starts_with("step 1: the host graph does not parse: "));
        let bogus = host_graph().replace("NonZero", "NoSuchOp");
        assert!(e(&graph(bogus)).starts_with("step 1: the host graph does not parse: "));
        assert_eq!(
            e(&|c| c.steps[1] =
                Step::Eval { graph: host_graph(), args: vec![2], results: vec![4, 5] }),
            "step 1: the host graph takes 2 values and gives 2, the step passes 1 and takes 2"
        );
        assert_eq!(
            e(&|c| c.values[3].dims = vec![2]),
            "step 0: program 0 gives `o1` as f32[1], value `b` is f32[2]"
        );
        let e_n = e(&|c| c.values[5].dynamic = false);
        assert!(e_n.starts_with("step 1: the host graph gives `n` as i64[1,"), "{e_n}");
        // A compiled program cannot read a value whose dims are known only at run time.
        let reads_n =
            e(&|c| c.steps.push(Step::Run { program: 0, args: vec![5, 4], results: vec![] }));
        assert_eq!(
            reads_n,
            "step 2: value `n` has dims known only at run time; only a host evaluation reads it"
        );
        assert_eq!(
            e(&|c| c.values[0].dynamic = true),
            "input `x` cannot have dims known only at run time"
        );
    }

    #[test]
    fn a_status_word_is_one_buffer_of_16_bytes_that_nothing_aliases() {
        let with_word = |bytes: u64| {
            let mut a = art(Target::Cpu);
            a.manifest.buffers.push(BufferDesc { bytes, kind: BufferKind::Status });
            a.manifest.launches[0].args.push(8);
            a
        };
        assert_eq!(with_word(16).validate(), Ok(()));
        assert_eq!(
            with_word(8).validate().unwrap_err(),
            "buffer 8 is the status word of 8 bytes, not 16"
        );
        let mut a = with_word(16);
        a.manifest.buffers.push(BufferDesc { bytes: 16, kind: BufferKind::Status });
        assert_eq!(
            a.validate().unwrap_err(),
            "2 buffers are the status word; a program has at most one"
        );
        let mut a = with_word(16);
        a.manifest
            .buffers
            .push(BufferDesc { bytes: 4, kind: BufferKind::Alias { of: 8, offset: 0 } });
        assert_eq!(a.validate().unwrap_err(), "buffer 9 aliases the status word (buffer 8)");
        // Through the file format, as a reader meets it.
        let a = with_word(16);
        assert_eq!(Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap().manifest, a.manifest);
    }

    #[test]
    fn kernel_scratch_bounds_are_checked_before_anything_runs() {
        let with = |target, scratch: ScratchDesc| {
            let mut a = art(target);
            a.manifest.scratch = Some(scratch);
            a
        };
        let ok = ScratchDesc { caller: 100, worker: 50, kernels: vec![100, 30] };
        let a = with(Target::Cpu, ok.clone());
        assert_eq!(a.validate(), Ok(()));
        // Through the file format; a manifest without it (one written before it) reads as
        // unknown.
        assert_eq!(Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap().manifest, a.manifest);
        let back = Artifact::from_bytes(&art(Target::Cpu).to_bytes(), "m.kiln").unwrap();
        assert_eq!(back.manifest.scratch, None);
        let e = |a: Artifact| a.validate().unwrap_err();
        assert_eq!(
            e(with(Target::Cpu, ScratchDesc { kernels: vec![100], ..ok.clone() })),
            "kernel scratch is given for 1 kernels, of 2"
        );
        assert_eq!(
            e(with(Target::Cpu, ScratchDesc { worker: 101, ..ok.clone() })),
            "a worker's kernel scratch (101 bytes) exceeds the calling thread's (100), which runs every kernel"
        );
        // A kernel of several workgroups runs on workers too: their bound must cover it.
        let mut a = with(Target::Cpu, ScratchDesc { kernels: vec![100, 80], ..ok.clone() });
        assert_eq!(a.validate(), Ok(()));
        a.manifest.kernels[1].workgroups = 4;
        assert_eq!(
            e(a),
            "kernel 1 (`mul`) asks 80 bytes of scratch a thread, more than the 50 bytes bounding a thread that runs it"
        );
        assert_eq!(
            e(with(Target::Cuda, ok.clone())),
            "kernel scratch is a CPU program's, not cuda's"
        );
        // A manifest of programs has none of its own.
        let program =
            diamond(Target::Cpu, 4, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4 });
        let mut m = program.clone();
        (m.buffers, m.kernels, m.launches) = (vec![], vec![], vec![]);
        m.padded = None;
        m.control = Some(ControlDesc {
            programs: vec![program.clone()],
            values: m
                .inputs
                .iter()
                .chain(&m.outputs)
                .map(|t| ValueDesc {
                    name: t.name.clone(),
                    dtype: t.dtype.clone(),
                    dims: t.dims.clone(),
                    dynamic: false,
                })
                .collect(),
            steps: vec![Step::Run { program: 0, args: vec![0, 1], results: vec![2, 3] }],
            outputs: vec![2, 3],
        });
        let mut outer = Artifact { manifest: m, payload: vec![0; 128] };
        assert_eq!(outer.validate(), Ok(()));
        outer.manifest.scratch = Some(ScratchDesc::default());
        assert_eq!(
            outer.validate().unwrap_err(),
            "a manifest of programs has no kernel scratch of its own (its programs do)"
        );
    }

    #[test]
    fn older_format_versions_are_refused() {
        let mut bytes = art(Target::Cpu).to_bytes();
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let e = Artifact::from_bytes(&bytes, "old.kiln").unwrap_err().to_string();
        assert!(e.contains("artifact format version 1, this runtime reads versions 2 to 7; recompile the model"), "{e}");
        // Version 6 (before host evaluation) has nothing version 7 reads otherwise.
        bytes[8..12].copy_from_slice(&6u32.to_le_bytes());
        assert!(Artifact::from_bytes(&bytes, "six.kiln").is_ok());
    }
}
