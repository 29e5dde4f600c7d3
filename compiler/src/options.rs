//! What a compile is asked to do.

use std::collections::HashMap;
use std::path::PathBuf;

/// The kind of code to generate: the runtime's target enum (what the artifact says it carries),
/// so one enum names a target from the CLI to the runtime.
pub use kiln_runtime::Target as TargetKind;

/// The arithmetic of contractions and convolutions (`--precision`). Norms, softmax,
/// reductions and everything elementwise stay f32 whatever it is, as mixed precision (AMP) has
/// it; tensors between kernels stay f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    #[default]
    F32,
    /// f32 tensors, products of operands rounded to TF32 (10-bit mantissas, f32's range) and
    /// summed in f32: NVIDIA's tensor cores (PyTorch's `allow_tf32`, onnxruntime's CUDA
    /// `use_tf32`). GPU targets only.
    Tf32,
    /// Convolutions and matrix products multiply bf16 operands (weights rounded at compile time,
    /// activations as the kernel reads them) and accumulate in f32: `vdpbf16ps` on the CPU, in
    /// one-group convolutions with a window or a stride and GEMMs by constant weights.
    Bf16,
    /// The same in IEEE half precision (f16).
    F16,
}

impl Precision {
    pub const ALL: [Precision; 4] =
        [Precision::F32, Precision::Tf32, Precision::Bf16, Precision::F16];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown precision `{s}`: one of f32, tf32, bf16, f16"))
    }
}

/// Compile options. Everything that changes the generated code is part of the cache key.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: TargetKind,
    /// Concrete shapes for inputs with symbolic dimensions.
    pub input_shapes: HashMap<String, Vec<usize>>,
    /// Inputs whose leading dimension is a symbolic batch in a range (`--input-shape
    /// x=1..64,3,224,224`): the range, inclusive, and the other sizes (the first entry unused).
    /// The compile is then a symbolic-batch one (`batch.rs`).
    pub batch_ranges: HashMap<String, (usize, usize, Vec<usize>)>,
    /// A symbol compiled at a capacity (`--max-size past=64`): the artifact runs every size up
    /// to it, its inputs padded (`pad.rs`). The other inputs' sizes come from `input_shapes`.
    pub pad: Option<(String, usize)>,
    /// Values of inputs, known at compile time (JIT). Inputs whose values decide result shapes
    /// (a Reshape's shape, reduction axes, Resize scales...) are bound to them when shapes would
    /// otherwise stay dynamic; the compiled code then does not take those inputs.
    pub input_values: HashMap<String, kiln_ir::Tensor>,
    /// Write every stage's text into this folder.
    pub dump_dir: Option<PathBuf>,
    /// Use the compile cache (on by default).
    pub cache: bool,
    /// For `--target cuda`: the GPU architecture and PTX ISA version.
    pub ptx: crate::backend::gpu::PtxTarget,
    /// GPU targets: use only this schedule (`parallel`, `reduction`, `contraction`) where it applies,
    /// else per-op; for tests and debugging (`KILN_GPU_SCHEDULE` does the same).
    pub gpu_schedule: Option<crate::backend::gpu::schedule::Strategy>,
    /// CPU: which contractions and convolutions run on the packed microkernel. `None` decides by
    /// shape class (where it beats the linalg path); `Some(true)` takes it wherever it applies,
    /// `Some(false)` never (tests, comparisons; `KILN_UKERNEL=1|0` does the same).
    pub microkernel: Option<bool>,
    /// CPU: per kernel (by `tune::kernel_signature`), microkernel or not, where `microkernel`
    /// does not force it; `None` takes the choices `--tune` stored for this CPU.
    pub microkernel_overrides: Option<HashMap<String, bool>>,
    /// CPU: integer convolutions multiply with AVX-512 VNNI (`vpdpbusd`) where the host has it;
    /// `false` takes the exact widening products instead (tests, comparisons; `KILN_VNNI=0`
    /// does the same).
    pub vnni: bool,
    /// CPU: integer convolutions multiply on AMX tiles (`tdpbsud`, 16 x 16 x 64 products an
    /// instruction) where the host has AMX-INT8 and the OS lets the process use it, VNNI or the
    /// widening products elsewhere, and `--precision bf16`'s direct convolutions on them
    /// (`tdpbf16ps`) where it has AMX-BF16; `false` keeps both on the vector units (tests,
    /// comparisons; `KILN_AMX=0` does the same).
    pub amx: bool,
    /// The arithmetic of contractions and convolutions (f32 unless asked).
    pub precision: Precision,
    /// CPU: the CPU the code is for (`--target-cpu`): the host by default, whose code runs only
    /// on CPUs with its wide features; an x86-64 level or a CPU name for artifacts that travel.
    pub target_cpu: crate::backend::cpu::machine::CpuTarget,
    /// The CPU threads the code is planned for: a kernel with enough work splits into about two
    /// work units a thread (`kiln emit --stage schedule --threads N` shows them). `None`: this
    /// machine's cores. An artifact runs at any thread count, fastest near this one.
    pub threads: Option<usize>,
    /// Outputs written over inputs, as (input, output) names: each output's value is written
    /// into the input's buffer, which the caller keeps across runs (`Manifest::state`,
    /// `Executable::run_with_state`); the artifact's inputs and outputs leave them out. A
    /// training step's parameters, optimizer state and running statistics (`TrainSession`).
    /// Static CPU programs only; `inplace::plan` orders every reader of an input before the
    /// write over it, or refuses.
    pub in_place: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            target: TargetKind::Cpu,
            input_shapes: HashMap::new(),
            batch_ranges: HashMap::new(),
            pad: None,
            input_values: HashMap::new(),
            dump_dir: None,
            cache: true,
            ptx: Default::default(),
            gpu_schedule: None,
            microkernel: None,
            microkernel_overrides: None,
            vnni: true,
            amx: true,
            precision: Precision::F32,
            target_cpu: Default::default(),
            threads: None,
            in_place: Vec::new(),
        }
    }
}

impl Options {
    /// The threads the CPU code is planned for: [`Options::threads`], else this machine's
    /// cores (at least 1; at most 1024, past which no machine kiln plans for goes).
    pub fn planned_threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, 1024)
    }

    /// Whether VNNI may be used where the host has it: the option, unless `KILN_VNNI=0`.
    pub fn vnni_allowed(&self) -> bool {
        self.vnni && std::env::var("KILN_VNNI").as_deref() != Ok("0")
    }

    /// Whether AMX may be used where the host has it: the option, unless `KILN_AMX=0`.
    pub fn amx_allowed(&self) -> bool {
        self.amx && std::env::var("KILN_AMX").as_deref() != Ok("0")
    }

    /// The microkernel choice in force: the option, else `KILN_UKERNEL` (`0` or `1`).
    pub fn microkernel_choice(&self) -> Option<bool> {
        self.microkernel.or_else(|| match std::env::var("KILN_UKERNEL").as_deref() {
            Ok("0") => Some(false),
            Ok("1") => Some(true),
            _ => None,
        })
    }
}

impl Options {
    /// The options for running on `target` here: for CUDA, PTX for the first visible GPU's own
    /// architecture (else the default, sm_80, which the driver compiles for newer GPUs).
    pub fn for_target(target: TargetKind) -> Options {
        let mut o = Options { target, ..Options::default() };
        if target == TargetKind::Cuda {
            let cc = kiln_runtime::list_devices()
                .into_iter()
                .find(|d| d.target == kiln_runtime::Target::Cuda && d.usable)
                .and_then(|d| d.compute_capability);
            if let Some(cc) = cc.filter(|c| c.starts_with("sm_")) {
                o.ptx.arch = cc;
            }
        }
        o
    }
}

/// A size in bytes as users write one (`KILN_CACHE_SIZE`, `--max-memory`): `2G`, `500M`, `64k`,
/// `1.5G`, `1048576`, `2GiB`; multiples are powers of 1024. Whole numbers are exact.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (number, scale) = match t.chars().last()?.to_ascii_uppercase() {
        'K' => (&t[..t.len() - 1], 1u64 << 10),
        'M' => (&t[..t.len() - 1], 1 << 20),
        'G' => (&t[..t.len() - 1], 1 << 30),
        'T' => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let number = number.trim();
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    if !number.contains('.') {
        return number.parse::<u64>().ok()?.checked_mul(scale);
    }
    let value = number.parse::<f64>().ok()? * scale as f64;
    (value.is_finite() && value < u64::MAX as f64).then_some(value as u64)
}
