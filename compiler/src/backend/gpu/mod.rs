//! The GPU targets: one path for NVIDIA (PTX) and Intel (SPIR-V through OpenCL).
//!
//! Each fused kernel is built on tensors by codegen (as for the CPU), then:
//! 1. elementwise ops fuse into their consumers (`linalg-fuse-elementwise-ops`);
//! 2. a schedule maps the work onto blocks and threads (`schedule.rs`), trying strategies best
//!    first until one applies;
//! 3. it is bufferised, each block grid becomes a `gpu.launch` and is outlined into a `gpu.func`
//!    (`launch.rs`); the host side that remains is read as the kernel's launch plan;
//! 4. every kernel's `gpu.func`s move into one device module, whose temporaries get their memory
//!    spaces (`memory.rs`) before it is lowered to PTX (`ptx.rs`) or SPIR-V (`spirv.rs`).

pub mod bf16;
pub mod launch;
pub mod loops;
pub mod memory;
pub mod ptx;
pub mod schedule;
pub mod script;
pub mod spirv;
pub mod tile;

use melior::ir::Module;

use kiln_ir::Graph;

use kiln_runtime::artifact::{KernelDesc, Target as ArtifactTarget};

use super::edit::RawOp;
use super::{Backend, MlirContext};
use crate::artifact::{FunctionCall, KernelRun, TargetCode};
use crate::codegen;
use crate::fuse::Kernel;
use crate::stage::{Stage, Stages};
use crate::{CompileError, Result};
pub use launch::{Arg, DeviceLaunch, LaunchPlan};
pub use ptx::PtxTarget;

/// Which GPU code to make.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GpuTarget {
    Cuda(PtxTarget),
    Opencl,
}

impl GpuTarget {
    pub fn detail(&self) -> String {
        match self {
            GpuTarget::Cuda(t) => {
                format!("nvptx64 {} PTX ISA {}.{}", t.arch, t.isa / 10, t.isa % 10)
            }
            GpuTarget::Opencl => "SPIR-V 1.0 (OpenCL, Kernel capability, 64-bit addressing)".into(),
        }
    }
}

/// The GPU backend for one target; `strategy` forces one schedule where it applies (else per-op),
/// for tests and debugging.
pub struct GpuBackend {
    pub target: GpuTarget,
    pub strategy: Option<schedule::Strategy>,
    /// The contractions' arithmetic (`--precision`).
    pub precision: crate::Precision,
}

impl GpuBackend {
    /// The GPU backend for `target` as `options` ask for it. Every precision is accepted: on
    /// NVIDIA GPUs from sm_80 the contractions run on tensor cores at tf32, bf16 or f16;
    /// elsewhere (older GPUs, OpenCL, whose SPIR-V 1.0 has no matrix instructions) they multiply
    /// operands rounded to that precision in f32 arithmetic: the same numbers, without the speed.
    pub fn from_options(options: &crate::Options, target: GpuTarget) -> crate::Result<GpuBackend> {
        Ok(GpuBackend {
            target,
            strategy: super::gpu_strategy(options)?,
            precision: options.precision,
        })
    }
}

/// The stages a CUDA compile has: the shared ones, LLVM IR and PTX.
pub const CUDA_STAGES: &[Stage] = &[
    Stage::Passes,
    Stage::Graph,
    Stage::Fused,
    Stage::Mlir,
    Stage::Lowered,
    Stage::Llvm,
    Stage::Ptx,
];

/// The stages an OpenCL compile has: the shared ones and SPIR-V (no LLVM IR on the way).
pub const OPENCL_STAGES: &[Stage] =
    &[Stage::Passes, Stage::Graph, Stage::Fused, Stage::Mlir, Stage::Lowered, Stage::Spirv];

/// A GPU target's rules.
pub struct GpuRules {
    cuda: bool,
}

impl GpuRules {
    pub const CUDA: GpuRules = GpuRules { cuda: true };
    pub const OPENCL: GpuRules = GpuRules { cuda: false };
}

impl super::Rules for GpuRules {
    fn name(&self) -> &'static str {
        if self.cuda {
            "cuda"
        } else {
            "opencl"
        }
    }

    /// An OpenCL sub-buffer must start aligned, and the CUDA path has yet to run views at
    /// offsets on hardware: shape-only views.
    fn views(&self) -> crate::fuse::Views {
        crate::fuse::Views::ShapeOnly
    }

    fn stages(&self) -> &'static [Stage] {
        if self.cuda {
            CUDA_STAGES
        } else {
            OPENCL_STAGES
        }
    }

    fn finish_phase(&self) -> &'static str {
        if self.cuda {
            "llvm+ptx"
        } else {
            "spirv"
        }
    }
}

impl Backend for GpuBackend {
    fn rules(&self) -> &'static dyn super::Rules {
        match self.target {
            GpuTarget::Cuda(_) => &GpuRules::CUDA,
            GpuTarget::Opencl => &GpuRules::OPENCL,
        }
    }

    fn kernel_mlir(&self, graph: &Graph, kernels: &[Kernel]) -> Result<String> {
        let mlir = MlirContext::new();
        let mut text = String::new();
        // (Without scheduling, a kernel's function index is not known: its position stands in.)
        for (i, k) in kernels.iter().enumerate() {
            text.push_str(&build(&mlir, graph, k, function_index(i)?)?.as_operation().to_string());
        }
        Ok(text)
    }

    fn compile(
        &self,
        graph: &Graph,
        kernels: &[Kernel],
        texts: Option<&mut Stages>,
        progress: &dyn Fn(usize),
    ) -> Result<TargetCode> {
        compile(graph, kernels, &self.target, self.strategy, self.precision, texts, progress)
    }
}

/// Compiles every kernel for `target`; `progress` hears how many kernels are scheduled.
fn compile(
    graph: &Graph,
    kernels: &[Kernel],
    target: &GpuTarget,
    forced: Option<schedule::Strategy>,
    precision: crate::Precision,
    mut texts: Option<&mut Stages>,
    progress: &dyn Fn(usize),
) -> Result<TargetCode> {
    let mlir = MlirContext::new();
    let mut device_module = Module::parse(
        &mlir.ctx,
        "module attributes {gpu.container_module} {\n  gpu.module @kiln_kernels {\n  }\n}",
    )
    // A constant text.
    .ok_or_else(|| CompileError::Internal("the device module does not parse".into()))?;
    let device = RawOp::of(&device_module.as_operation())
        .children()
        .into_iter()
        .find(|o| o.is("gpu.module"))
        .expect("parsed above");
    let mut runs = Vec::with_capacity(kernels.len());
    let mut functions: Vec<KernelDesc> = Vec::new();
    let flavor = match target {
        GpuTarget::Cuda(_) => tile::builder::Flavor::Nvvm,
        GpuTarget::Opencl => tile::builder::Flavor::Spirv,
    };
    let sm = match target {
        GpuTarget::Cuda(t) => t.arch.trim_start_matches("sm_").parse().unwrap_or(0),
        GpuTarget::Opencl => 0,
    };
    let tile_target = tile::TileTarget {
        flavor,
        sms: tile::ASSUMED_SMS,
        sm,
        precision,
        tensor_cores: forced == Some(schedule::Strategy::TensorCore),
    };
    let device_body = device.block(0).expect("a gpu.module has a body");
    let mut plans_text: Vec<(String, Vec<DeviceLaunch>)> = Vec::new();
    for k in kernels {
        // What a failed index check records: the kernel's first function (every function of a
        // kernel has its label).
        let function = function_index(functions.len())?;
        let tile_plan = match forced {
            // (Tile kernels have no index checks: a kernel with one is scheduled.)
            _ if codegen::status::takes_status(graph, k) => None,
            None | Some(schedule::Strategy::Tile) | Some(schedule::Strategy::TensorCore) => {
                tile::plan(&tile_target, graph, k)
            }
            Some(_) => None,
        };
        let (plan, strategy) = if let Some(p) = &tile_plan {
            if let Some(t) = texts.as_deref_mut() {
                // The kernel's MLIR as codegen builds it, for `--stage mlir`, as for any other.
                t.push(Stage::Mlir, &build(&mlir, graph, k, function)?.as_operation().to_string());
            }
            let plan = tile::build(&mlir.ctx, device_body, flavor, graph, k, p)?;
            (plan, p.describe(graph))
        } else {
            let (module, plan, text, strategy) =
                schedule_kernel(&mlir, graph, k, forced, function)?;
            if let Some(t) = texts.as_deref_mut() {
                t.push(Stage::Mlir, &text);
            }
            launch::move_functions(RawOp::of(&module.as_operation()), device)
                .map_err(|e| CompileError::in_kernel(k, "outline", e))?;
            (plan, format!("{strategy} schedule"))
        };
        // The launch lines wait for the device module's memory spaces (their shared memory).
        plans_text.push((
            format!("// kernel {} ({}): {strategy}\n", k.name, k.label),
            plan.launches.clone(),
        ));
        let first = functions.len();
        for l in &plan.launches {
            functions.push(KernelDesc {
                symbol: l.func.clone(),
                workgroups: 0,
                label: k.label.clone(),
                grid: l.grid,
                block: l.block,
                bytes: l.bytes.unwrap_or_else(|| launch_bytes(graph, k, &plan, l)),
                flops: l.flops,
            });
        }
        // Each launch calls the function outlined for it (a kernel's functions are its own).
        let index = |name: &str| {
            first
                + functions[first..]
                    .iter()
                    .position(|f| f.symbol == name)
                    .expect("every launched function was outlined")
        };
        let calls = plan
            .launches
            .iter()
            .map(|l| FunctionCall {
                function: index(&l.func),
                args: l.args.clone(),
                writes: l.writes.clone(),
            })
            .collect();
        runs.push(KernelRun { calls, scratch: plan.scratch, constants: plan.constants });
        progress(runs.len());
    }
    // Every kernel's functions, prepared once: loops from linalg, views folded into loads and
    // stores, arithmetic neither target has (floor division, bf16 conversions) expanded, then
    // memory spaces for the temporaries.
    let internal = |stage: &'static str, e: String| CompileError::Codegen {
        kernel: "device".into(),
        label: target.detail(),
        stage,
        source: e.into(),
    };
    mlir.run_pipeline(
        &mut device_module,
        "builtin.module(gpu.module(convert-linalg-to-loops,fold-memref-alias-ops,lower-affine,arith-expand{include-bf16=true},canonicalize,cse))",
    )
    .map_err(|e| internal("device loops", e.into()))?;
    let memory_flavor = match target {
        GpuTarget::Cuda(_) => memory::Flavor::Nvvm,
        GpuTarget::Opencl => memory::Flavor::Spirv,
    };
    let device = RawOp::of(&device_module.as_operation())
        .children()
        .into_iter()
        .find(|o| o.is("gpu.module"))
        .expect("still there");
    memory::legalize(&mlir.ctx, device, memory_flavor).map_err(|e| internal("memory spaces", e))?;
    if let Some(t) = texts.as_deref_mut() {
        let shared = memory::workgroup_bytes(device);
        for (head, launches) in &plans_text {
            t.push(Stage::Lowered, head);
            for l in launches {
                let bytes = shared.get(&l.func).copied().unwrap_or(0);
                t.push(
                    Stage::Lowered,
                    &format!(
                        "//   launch {} grid {:?} block {:?} shared {bytes} B args {:?}\n",
                        l.func, l.grid, l.block, l.args
                    ),
                );
            }
        }
    }
    let code = match target {
        GpuTarget::Cuda(t) => {
            let p = ptx::lower(&mlir, &mut device_module, t).map_err(|e| internal("ptx", e))?;
            if let Some(x) = texts.as_deref_mut() {
                x.push(Stage::Lowered, &p.lowered);
                x.set(Stage::Llvm, p.llvm);
                x.set(Stage::Ptx, p.ptx.clone());
            }
            p.ptx.into_bytes()
        }
        GpuTarget::Opencl => {
            let (binary, text) =
                spirv::lower(&mlir, &mut device_module).map_err(|e| internal("spirv", e))?;
            if let Some(x) = texts {
                x.push(Stage::Lowered, &text);
                x.set(Stage::Spirv, spirv::disassemble(&binary, &text));
            }
            binary
        }
    };
    let kind = match target {
        GpuTarget::Cuda(_) => ArtifactTarget::Cuda,
        GpuTarget::Opencl => ArtifactTarget::Opencl,
    };
    Ok(TargetCode {
        target: kind,
        blob: code,
        target_detail: target.detail(),
        cpu_features: Vec::new(),
        functions,
        runs,
        // A GPU kernel allocates nothing of its own: its temporaries are arena buffers.
        scratch: None,
    })
}

/// The bytes a launch moves at least: each of its argument buffers once.
fn launch_bytes(graph: &Graph, k: &Kernel, plan: &LaunchPlan, l: &DeviceLaunch) -> u64 {
    let buffer = |i: usize| -> u64 {
        let v = k.inputs.iter().chain(&k.outputs).nth(i).copied();
        v.map_or(0, |v| {
            let t = graph.value_type(v);
            let n: usize = t.shape.as_fixed().map_or(0, |d| d.iter().product());
            (n * t.dtype.size()) as u64
        })
    };
    l.args
        .iter()
        .map(|a| match *a {
            Arg::Buffer(i) => buffer(i),
            Arg::Scratch(s) => plan.scratch.get(s).copied().unwrap_or(0),
            Arg::Constant(c) => plan.constants.get(c).map_or(0, |b| b.len() as u64),
            // (Written only when the launch fails.)
            Arg::Status => 0,
        })
        .sum()
}

/// A kernel's module as codegen builds it, verified. `function` is the index of its first
/// function in the artifact, which its index checks record.
fn build<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    function: u32,
) -> Result<Module<'c>> {
    super::verified(mlir, k, codegen::build_kernel(&mlir.ctx, graph, k, function))
}

/// A function index as the status word records it.
fn function_index(i: usize) -> Result<u32> {
    // A graph of 2^32 kernels does not fit in memory to get here.
    u32::try_from(i).map_err(|_| CompileError::Internal(format!("{i} functions are too many")))
}

/// Builds one kernel, schedules it (the first strategy that applies) and maps it to launches;
/// returns its module (host function and outlined `gpu.module`s), its launches, its codegen text
/// and the strategy used.
fn schedule_kernel<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    forced: Option<schedule::Strategy>,
    function: u32,
) -> Result<(Module<'c>, LaunchPlan, String, schedule::Strategy)> {
    let build = || build(mlir, graph, k, function);
    // Unit dimensions are folded first, so a keepdims reduction splits over a block's threads.
    // Folding puts reshapes between ops, and block tiling cannot fuse a producer through one (a
    // padded convolution's input, a strided 1x1 convolution's result). So each fused strategy
    // is tried folded, then unfolded, before per-op.
    let prepare = |m: &mut Module<'c>, fold: bool| {
        let fold = if fold { "linalg-fold-unit-extent-dims," } else { "" };
        mlir.run_pipeline(
            m,
            &format!(
                "builtin.module(func.func({fold}linalg-fuse-elementwise-ops),canonicalize,cse)"
            ),
        )
    };
    let first = build()?;
    let text = first.as_operation().to_string();
    let mut first = Some(first);
    let n_buffers = k.inputs.len() + k.outputs.len();
    let status = codegen::status::takes_status(graph, k);
    let mut tried: Vec<(String, String)> = Vec::new();
    // Phases: the fused strategies on the folded kernel, then on the unfolded one (each list
    // read from the kernel as prepared), then per-op.
    let phases = [Some(true), Some(false), None];
    let mut phase = 0;
    let mut list: Option<Vec<schedule::Strategy>> = None;
    let mut next = 0;
    loop {
        let fold = phases[phase].unwrap_or(true);
        let mut m = match first.take() {
            Some(m) => m,
            None => build()?,
        };
        prepare(&mut m, fold).map_err(|e| CompileError::in_kernel(k, "fuse elementwise", e))?;
        super::erase_dead_checks(&m);
        let root = RawOp::of(&m.as_operation());
        let func = schedule::kernel_func(root)
            .ok_or_else(|| CompileError::in_kernel(k, "schedule", "no kernel function"))?;
        schedule::drop_empty_ops(func);
        let strategies = list.get_or_insert_with(|| match phases[phase] {
            None => vec![schedule::Strategy::PerOp],
            // A forced schedule: only that one where it applies, else per-op.
            Some(_) => schedule::candidates(func)
                .into_iter()
                .filter(|&s| s != schedule::Strategy::PerOp && forced.is_none_or(|f| f == s))
                .collect(),
        });
        let Some(&strategy) = strategies.get(next) else {
            if phase + 1 < phases.len() {
                // The module built for this attempt is dropped; the next phase builds its own.
                phase += 1;
                list = None;
                next = 0;
                continue;
            }
            let why: Vec<String> = tried.iter().map(|(s, e)| format!("{s}: {e}")).collect();
            return Err(CompileError::in_kernel(
                k,
                "schedule",
                format!("no schedule applies ({})", why.join("; ")),
            ));
        };
        next += 1;
        let attempt = schedule::apply(mlir, &m, strategy)
            .and_then(|()| {
                super::erase_dead_checks(&m);
                launch::map(mlir, &mut m)
            })
            .and_then(|()| launch::plan(RawOp::of(&m.as_operation()), n_buffers, status));
        let name = if fold { strategy.to_string() } else { format!("{strategy} (unfolded)") };
        match attempt {
            Ok(plan) => {
                if std::env::var_os("KILN_DEBUG_MLIR").is_some() {
                    eprintln!("// kernel {} ({name} schedule)\n{}", k.name, m.as_operation());
                }
                return Ok((m, plan, text, strategy));
            }
            Err(e) => {
                if std::env::var_os("KILN_DEBUG_MLIR").is_some() {
                    eprintln!(
                        "// kernel {}: {name} schedule failed: {e}\n{}",
                        k.name,
                        m.as_operation()
                    );
                }
                tried.push((name, e));
            }
        }
    }
}

/// The bytes of the first object of the module's `gpu.binary`.
pub fn binary_object(root: RawOp) -> Result<Vec<u8>, String> {
    let bin = root.children().into_iter().find(|o| o.is("gpu.binary")).ok_or("no gpu.binary")?;
    let objects = bin.attr("objects").ok_or("gpu.binary without objects")?;
    // SAFETY: `objects` is an array of #gpu.object attributes; the bytes are copied out.
    unsafe {
        if mlir_sys::mlirArrayAttrGetNumElements(objects) < 1 {
            return Err("gpu.binary holds no object".into());
        }
        let obj = mlir_sys::mlirArrayAttrGetElement(objects, 0);
        if !mlir_sys::mlirAttributeIsAGPUObjectAttr(obj) {
            return Err("not a #gpu.object".into());
        }
        let s = mlir_sys::mlirGPUObjectAttrGetObject(obj);
        Ok(std::slice::from_raw_parts(s.data as *const u8, s.length).to_vec())
    }
}
