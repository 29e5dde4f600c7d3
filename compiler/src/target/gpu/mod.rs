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

pub mod launch;
pub mod loops;
pub mod memory;
pub mod ptx;
pub mod schedule;
pub mod script;
pub mod spirv;

use melior::ir::operation::OperationLike;
use melior::ir::Module;

use kiln_ir::Graph;

use super::edit::RawOp;
use super::MlirContext;
use crate::codegen;
use crate::fuse::Kernel;
use crate::{CompileError, Result};
pub use launch::{Arg, KernelPlan, Launch};
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
            GpuTarget::Cuda(t) => format!("nvptx64 {} PTX ISA {}.{}", t.arch, t.isa / 10, t.isa % 10),
            GpuTarget::Opencl => "SPIR-V 1.0 (OpenCL, Kernel capability, 64-bit addressing)".into(),
        }
    }
}

/// One `gpu.func` of the device code.
#[derive(Clone, Debug)]
pub struct DeviceFunction {
    pub name: String,
    /// The fused kernel it belongs to (index) and that kernel's label.
    pub kernel: usize,
    pub label: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// Every kernel compiled for a GPU.
pub struct GpuCode {
    /// PTX text (CUDA) or a SPIR-V binary (OpenCL).
    pub code: Vec<u8>,
    pub functions: Vec<DeviceFunction>,
    /// Per fused kernel, how it runs.
    pub plans: Vec<KernelPlan>,
    pub target_detail: String,
}

/// The text of each stage, when asked for.
#[derive(Default, Clone, Debug)]
pub struct GpuTexts {
    /// Each kernel's MLIR from codegen.
    pub mlir: String,
    /// The device module after lowering (NVVM or SPIR-V dialect) and each kernel's host plan.
    pub lowered: String,
    /// LLVM IR after optimisation (CUDA).
    pub llvm: String,
    pub ptx: String,
    pub spirv: String,
}

fn stage_err(k: &Kernel, stage: &'static str, msg: impl Into<String>) -> CompileError {
    CompileError::Codegen { kernel: k.name.clone(), label: k.label.clone(), stage, msg: msg.into() }
}

/// Compiles every kernel for `target`.
/// `forced` names the one schedule to use where it applies (else per-op); `progress` hears how many
/// kernels are scheduled.
pub fn compile(
    graph: &Graph,
    kernels: &[Kernel],
    target: &GpuTarget,
    forced: Option<&str>,
    mut texts: Option<&mut GpuTexts>,
    progress: &dyn Fn(usize),
) -> Result<GpuCode> {
    let mlir = MlirContext::new();
    let mut device_module = Module::parse(&mlir.ctx, "module attributes {gpu.container_module} {\n  gpu.module @kiln_kernels {\n  }\n}")
        .ok_or_else(|| CompileError::Internal("the device module does not parse".into()))?;
    let device = RawOp::of(&device_module.as_operation()).children().into_iter().find(|o| o.is("gpu.module")).expect("parsed above");
    let mut plans = Vec::with_capacity(kernels.len());
    let mut functions = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let (module, plan, text, strategy) = lower_kernel(&mlir, graph, k, forced)?;
        if let Some(t) = texts.as_deref_mut() {
            t.mlir.push_str(&text);
            t.lowered.push_str(&format!("// kernel {} ({}): {strategy} schedule\n", k.name, k.label));
            for l in &plan.launches {
                t.lowered.push_str(&format!("//   launch {} grid {:?} block {:?} args {:?}\n", l.func, l.grid, l.block, l.args));
            }
        }
        launch::move_functions(RawOp::of(&module.as_operation()), device).map_err(|e| stage_err(k, "outline", e))?;
        for l in &plan.launches {
            functions.push(DeviceFunction { name: l.func.clone(), kernel: i, label: k.label.clone(), grid: l.grid, block: l.block });
        }
        plans.push(plan);
        progress(plans.len());
    }
    // Every kernel's functions, prepared once: loops from linalg, views folded into loads and
    // stores, arithmetic neither target has (floor division, bf16 conversions) expanded, then
    // memory spaces for the temporaries.
    let internal = |stage: &'static str, e: String| CompileError::Codegen { kernel: "device".into(), label: target.detail(), stage, msg: e };
    mlir.run_pipeline(
        &mut device_module,
        "builtin.module(gpu.module(convert-linalg-to-loops,fold-memref-alias-ops,lower-affine,arith-expand{include-bf16=true},canonicalize,cse))",
    )
    .map_err(|e| internal("device loops", e))?;
    let flavor = match target {
        GpuTarget::Cuda(_) => memory::Flavor::Nvvm,
        GpuTarget::Opencl => memory::Flavor::Spirv,
    };
    let device = RawOp::of(&device_module.as_operation()).children().into_iter().find(|o| o.is("gpu.module")).expect("still there");
    memory::legalize(&mlir.ctx, device, flavor).map_err(|e| internal("memory spaces", e))?;
    let code = match target {
        GpuTarget::Cuda(t) => {
            let p = ptx::lower(&mlir, &mut device_module, t).map_err(|e| internal("ptx", e))?;
            if let Some(x) = texts.as_deref_mut() {
                x.lowered.push_str(&p.lowered);
                x.llvm = p.llvm;
                x.ptx = p.ptx.clone();
            }
            p.ptx.into_bytes()
        }
        GpuTarget::Opencl => {
            let (binary, text) = spirv::lower(&mlir, &mut device_module).map_err(|e| internal("spirv", e))?;
            if let Some(x) = texts {
                x.lowered.push_str(&text);
                x.spirv = spirv::disassemble(&binary, &text);
            }
            binary
        }
    };
    Ok(GpuCode { code, functions, plans, target_detail: target.detail() })
}

/// Builds one kernel, schedules it (the first strategy that applies) and maps it to launches;
/// returns its module (host function and outlined `gpu.module`s), its plan, its codegen text and
/// the strategy used.
fn lower_kernel<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    forced: Option<&str>,
) -> Result<(Module<'c>, KernelPlan, String, schedule::Strategy)> {
    let build = || -> Result<Module<'c>> {
        let m = codegen::build_kernel(&mlir.ctx, graph, k)?;
        if !m.as_operation().verify() {
            return Err(stage_err(k, "mlir", format!("the generated MLIR does not verify: {}\n{}", mlir.take_diagnostics(), m.as_operation())));
        }
        Ok(m)
    };
    let prepare = |m: &mut Module<'c>| {
        mlir.run_pipeline(m, "builtin.module(func.func(linalg-fold-unit-extent-dims,linalg-fuse-elementwise-ops),canonicalize,cse)")
    };
    let first = build()?;
    let text = first.as_operation().to_string();
    let mut first = Some(first);
    let n_buffers = k.inputs.len() + k.outputs.len();
    let mut tried = Vec::new();
    let mut candidates = None;
    loop {
        let mut m = match first.take() {
            Some(m) => m,
            None => build()?,
        };
        prepare(&mut m).map_err(|e| stage_err(k, "fuse elementwise", e))?;
        let root = RawOp::of(&m.as_operation());
        let func = schedule::kernel_func(root).ok_or_else(|| stage_err(k, "schedule", "no kernel function"))?;
        schedule::drop_empty_ops(func);
        let list = candidates
            .get_or_insert_with(|| {
                let all = schedule::candidates(func);
                // A forced schedule: only that one where it applies, else per-op.
                match forced {
                    Some(only) => all.into_iter().filter(|s| s.to_string() == only || *s == schedule::Strategy::PerOp).collect(),
                    None => all,
                }
            })
            .clone();
        let Some(&strategy) = list.get(tried.len()) else {
            let why: Vec<String> = tried.iter().map(|(s, e): &(schedule::Strategy, String)| format!("{s}: {e}")).collect();
            return Err(stage_err(k, "schedule", format!("no schedule applies ({})", why.join("; "))));
        };
        let attempt = schedule::apply(mlir, &m, strategy)
            .and_then(|()| launch::map(mlir, &mut m))
            .and_then(|()| launch::plan(RawOp::of(&m.as_operation()), n_buffers));
        match attempt {
            Ok(plan) => {
                if std::env::var_os("KILN_DEBUG_MLIR").is_some() {
                    eprintln!("// kernel {} ({strategy} schedule)\n{}", k.name, m.as_operation());
                }
                return Ok((m, plan, text, strategy));
            }
            Err(e) => {
                if std::env::var_os("KILN_DEBUG_MLIR").is_some() {
                    eprintln!("// kernel {}: {strategy} schedule failed: {e}\n{}", k.name, m.as_operation());
                }
                tried.push((strategy, e));
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
