//! kiln: a graph-mode ML compiler. Load an ONNX model (or build a [`Graph`] in Rust), compile
//! it ahead of time into an [`Artifact`] that the small runtime loads, or in this process, and
//! run it by input name on the CPU, an NVIDIA GPU (CUDA) or an OpenCL device.
//!
//! This crate is the host program's way in: [`load_onnx`], [`compile`], [`jit`],
//! [`load_artifact`], [`Session`] (a model whose sizes are known only when it runs), builder
//! [`Options`], and one [`Error`] whose [`source`](std::error::Error::source) chain says what
//! failed underneath (the node and op, the kernel, the file). The crates below it
//! (`kiln-compiler`, `kiln-runtime`, `kiln-ir`) stay available for what this one does not
//! cover.
//!
//! Building a crate that depends on kiln needs LLVM/MLIR 22: run kiln's `scripts/setup.sh`
//! once (it also tells cargo where LLVM 22 lives, in `~/.cargo/config.toml`), as the README
//! says.
//!
//! # Ahead of time: compile, save, load, run by name
//!
//! ```ignore
#![doc = include_str!("../examples/aot.rs")]
//! ```
//!
//! # In this process, sizes known at run time
//!
//! ```ignore
#![doc = include_str!("../examples/jit.rs")]
//! ```

use std::path::{Path, PathBuf};

pub use kiln_compiler::backend::cpu::machine::CpuTarget;
pub use kiln_compiler::{Precision, TargetKind as Target};
pub use kiln_ir::{builder, DType, Dim, Graph, Tensor};
pub use kiln_runtime::artifact::TensorDesc;
pub use kiln_runtime::{Artifact, Profile};

/// Everything that can fail here. Each variant names what it was doing; the error below it
/// (`source()`) says why, down to the node and op or the kernel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ONNX file could not be read or imported.
    #[error("{path}: cannot load the ONNX model")]
    Model {
        path: PathBuf,
        #[source]
        source: kiln_ir::IrError,
    },
    /// Compiling failed (an op the target has no code for, a shape it cannot take...).
    #[error("compiling `{model}` for {target}")]
    Compile {
        model: String,
        target: &'static str,
        #[source]
        source: Box<kiln_compiler::CompileError>,
    },
    /// An artifact could not be read, written or loaded (a missing device, a CPU without the
    /// features it was compiled for, a corrupt file).
    #[error("{what}")]
    Load {
        what: String,
        #[source]
        source: Box<kiln_runtime::RuntimeError>,
    },
    /// An artifact could not be written.
    #[error("{path}: cannot write the artifact")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A run failed (a wrong shape or dtype, a kernel that could not finish).
    #[error("running `{model}`")]
    Run {
        model: String,
        #[source]
        source: RunError,
    },
    /// Inputs given by name that do not match the model's.
    #[error("`{model}`: {why}")]
    Inputs { model: String, why: String },
}

/// What a run failed on: the runtime (a loaded artifact) or the compiler (a [`Session`]
/// compiles each new size as it meets it).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Runtime(Box<kiln_runtime::RuntimeError>),
    #[error(transparent)]
    Compile(Box<kiln_compiler::CompileError>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads and imports an ONNX model (external data from the model's folder).
pub fn load_onnx(path: impl AsRef<Path>) -> Result<Graph> {
    let path = path.as_ref();
    kiln_ir::onnx::load(path)
        .map(|m| m.graph)
        .map_err(|source| Error::Model { path: path.to_path_buf(), source })
}

/// Imports an ONNX model from its bytes (external data, if any, from `base_dir`).
pub fn load_onnx_bytes(bytes: &[u8], base_dir: Option<&Path>) -> Result<Graph> {
    kiln_ir::onnx::load_bytes(bytes, base_dir)
        .map(|m| m.graph)
        .map_err(|source| Error::Model { path: PathBuf::from("<bytes>"), source })
}

/// How to compile and load, built up from [`Options::new`] (the CPU, sizes as the model
/// declares them, f32, every core):
///
/// ```ignore
/// let options = kiln::Options::new()
///     .input_shape("x", [1, 3, 224, 224])
///     .target_cpu("x86-64-v3".parse()?)
///     .threads(4);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Options {
    compile: kiln_compiler::Options,
    load: kiln_runtime::LoadOptions,
}

impl Options {
    /// The CPU, the model's own sizes, f32, the compile cache on, every core.
    pub fn new() -> Options {
        Options::default()
    }

    /// The device kind to compile for: [`Target::Cpu`], [`Target::Cuda`] (PTX for the first
    /// visible GPU's architecture) or [`Target::Opencl`].
    pub fn target(mut self, target: Target) -> Options {
        let keep = std::mem::take(&mut self.compile);
        self.compile = kiln_compiler::Options {
            input_shapes: keep.input_shapes,
            pad: keep.pad,
            cache: keep.cache,
            precision: keep.precision,
            target_cpu: keep.target_cpu,
            ..kiln_compiler::Options::for_target(target)
        };
        self
    }

    /// The sizes of an input with symbolic dimensions (all of them, in order).
    pub fn input_shape(mut self, input: &str, dims: impl Into<Vec<usize>>) -> Options {
        self.compile.input_shapes.insert(input.to_string(), dims.into());
        self
    }

    /// One program for every size of `symbol` up to `max` (a decoder's KV cache): inputs are
    /// zero-padded to it and outputs cut back, where kiln proves nothing reads the padding.
    pub fn max_size(mut self, symbol: &str, max: usize) -> Options {
        self.compile.pad = Some((symbol.to_string(), max));
        self
    }

    /// The arithmetic of convolutions and matrix products (f32 unless asked).
    pub fn precision(mut self, precision: Precision) -> Options {
        self.compile.precision = precision;
        self
    }

    /// The CPU the code is for (the CPU target): the host by default; an x86-64 level
    /// (`"x86-64-v3".parse()?`) for artifacts that load on other machines.
    pub fn target_cpu(mut self, cpu: CpuTarget) -> Options {
        self.compile.target_cpu = cpu;
        self
    }

    /// Use (and fill) the compile cache (on by default).
    pub fn cache(mut self, on: bool) -> Options {
        self.compile.cache = on;
        self
    }

    /// CPU threads a loaded program runs on (default: every core).
    pub fn threads(mut self, n: usize) -> Options {
        self.load.threads = Some(n);
        // The code is planned for the threads it runs on.
        self.compile.threads = Some(n);
        self
    }

    /// Which device of the target's kind (`cuda:N`, `opencl:N`; default the first).
    pub fn device_index(mut self, index: usize) -> Options {
        self.load.device_index = Some(index);
        self
    }

    /// The memory budget in bytes: a program needing more is refused at load, naming its
    /// largest tensor (default: the memory available).
    pub fn max_memory(mut self, bytes: u64) -> Options {
        self.load.max_memory = Some(bytes);
        self
    }

    /// The most steps one run of a Loop may take: a Loop that would take another (one whose
    /// condition never turns false) fails the run, naming it. Default: no limit, as in ONNX.
    pub fn max_loop_steps(mut self, steps: u64) -> Options {
        self.load.max_loop_steps = Some(steps);
        self
    }

    fn target_name(&self) -> &'static str {
        self.compile.target.name()
    }
}

/// Compiles `graph` into an artifact ([`Artifact::to_bytes`] is the `.kiln` file; `kiln run`
/// and [`load_artifact`] run it).
pub fn compile(graph: &Graph, options: &Options) -> Result<Artifact> {
    kiln_compiler::compile(graph, &options.compile, false).map(|c| c.artifact).map_err(|source| {
        Error::Compile {
            model: graph.name.clone(),
            target: options.target_name(),
            source: Box::new(source),
        }
    })
}

/// Compiles `graph` and loads it here, ready to run. Every input size must be known (declared
/// by the model or given with [`Options::input_shape`]); a model whose sizes change from run to
/// run is a [`Session`].
pub fn jit(graph: &Graph, options: &Options) -> Result<Model> {
    let artifact = compile(graph, options)?;
    Model::load(artifact, &options.load, graph.name.clone())
}

/// Writes an artifact to a file, whole or not at all (written aside, then renamed).
pub fn save_artifact(artifact: &Artifact, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    kiln_runtime::files::replace(path, &[&artifact.to_bytes()])
        .map_err(|source| Error::Write { path: path.to_path_buf(), source })
}

/// Loads a `.kiln` file for its target's device.
pub fn load_artifact(path: impl AsRef<Path>, options: &Options) -> Result<Model> {
    let path = path.as_ref();
    let artifact = Artifact::read(path).map_err(|source| Error::Load {
        what: format!("{}: cannot read the artifact", path.display()),
        source: Box::new(source),
    })?;
    Model::load(artifact, &options.load, path.display().to_string())
}

/// A compiled program loaded on its device.
pub struct Model {
    exe: kiln_runtime::Executable,
    name: String,
}

impl Model {
    fn load(artifact: Artifact, load: &kiln_runtime::LoadOptions, name: String) -> Result<Model> {
        let exe = kiln_runtime::Executable::load(artifact, load).map_err(|source| Error::Load {
            what: format!("loading `{name}`"),
            source: Box::new(source),
        })?;
        Ok(Model { exe, name })
    }

    /// Its inputs (name, dtype, sizes), in the order [`Model::run`] takes them.
    pub fn inputs(&self) -> &[TensorDesc] {
        self.exe.inputs()
    }

    /// Its outputs, in the order runs return them.
    pub fn outputs(&self) -> &[TensorDesc] {
        self.exe.outputs()
    }

    /// Where it runs: `cpu (16 threads)`, a GPU's name.
    pub fn device(&self) -> String {
        self.exe.device()
    }

    /// Runs on inputs given in order; returns the outputs in order.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.exe.run(inputs).map_err(|e| Error::Run {
            model: self.name.clone(),
            source: RunError::Runtime(Box::new(e)),
        })
    }

    /// Runs on inputs given by name, in any order; returns each output with its name.
    pub fn run_named(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let names: Vec<&str> = self.inputs().iter().map(|d| d.name.as_str()).collect();
        let ordered = in_order(&self.name, &names, inputs)?;
        let outputs = self.run(&ordered)?;
        Ok(self.outputs().iter().map(|d| d.name.clone()).zip(outputs).collect())
    }

    /// The kiln-runtime executable underneath (profiles, batches, load statistics).
    pub fn executable(&self) -> &kiln_runtime::Executable {
        &self.exe
    }
}

/// A model whose sizes are known only when it runs (a symbolic batch or sequence, inputs that
/// decide shapes): each new size is compiled on its first run and kept (the 16 programs used
/// last), or padded up to [`Options::max_size`].
pub struct Session {
    inner: kiln_compiler::Session,
    name: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl Session {
    pub fn new(graph: Graph, options: &Options) -> Session {
        let inputs = graph.inputs().iter().map(|&id| graph.node(id).name.clone()).collect();
        let outputs = graph.outputs().iter().map(|(n, _)| n.clone()).collect();
        let name = graph.name.clone();
        Session {
            inner: kiln_compiler::Session::new(
                graph,
                options.compile.clone(),
                options.load.clone(),
            ),
            name,
            inputs,
            outputs,
        }
    }

    /// Its inputs' names, in the order [`Session::run`] takes them.
    pub fn input_names(&self) -> &[String] {
        &self.inputs
    }

    /// Its outputs' names, in the order runs return them.
    pub fn output_names(&self) -> &[String] {
        &self.outputs
    }

    /// Runs on inputs given in order (compiling first for sizes not seen before).
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.inner.run(inputs).map_err(|e| Error::Run {
            model: self.name.clone(),
            source: RunError::Compile(Box::new(e)),
        })
    }

    /// Runs on inputs given by name, in any order; returns each output with its name.
    pub fn run_named(&mut self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let names: Vec<&str> = self.inputs.iter().map(String::as_str).collect();
        let ordered = in_order(&self.name, &names, inputs)?;
        let outputs = self.run(&ordered)?;
        Ok(self.outputs.iter().cloned().zip(outputs).collect())
    }

    /// Programs compiled so far.
    pub fn compiles(&self) -> usize {
        self.inner.compiles()
    }
}

/// `given` in the order of `names`: every input once, none unknown.
fn in_order(model: &str, names: &[&str], given: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
    let fail = |why: String| Error::Inputs { model: model.to_string(), why };
    for (i, (name, _)) in given.iter().enumerate() {
        if !names.contains(name) {
            return Err(fail(format!(
                "it has no input `{name}` (its inputs: {})",
                names.join(", ")
            )));
        }
        if given[..i].iter().any(|(n, _)| n == name) {
            return Err(fail(format!("input `{name}` is given twice")));
        }
    }
    names
        .iter()
        .map(|name| {
            given.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone()).ok_or_else(|| {
                fail(format!("input `{name}` is missing (its inputs: {})", names.join(", ")))
            })
        })
        .collect()
}
