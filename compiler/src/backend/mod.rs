//! Targets: each turns the kernels' MLIR into code a device runs. The MLIR context and the
//! pieces every target shares (context setup, transform application, pass pipelines, diagnostics)
//! live here.

pub mod cpu;
pub mod edit;
pub mod gpu;
pub mod linalg;

use std::sync::{Arc, Mutex, Once};

use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::{Module, Operation};
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;

use crate::artifact::TargetCode;
use crate::fuse::{Kernel, Views};
use crate::options::{Options, TargetKind};
use crate::passes::Pass;
use crate::stage::{Stage, Stages};
use crate::{CompileError, Result};

/// What a target decides before code generation: its graph passes, what decomposition keeps
/// whole, the views fusion may make and its stages. Fixed per target ([`rules`]), so the stages
/// before code generation need no [`Backend`], whose construction checks the precision, the
/// target CPU and a forced schedule and may refuse them. Passes, fusion, the stage list and the
/// driver ask these and never match on targets themselves.
pub trait Rules: Sync {
    /// The target's name, as the cache key and messages give it (`cpu`, `cuda`...).
    fn name(&self) -> &'static str;

    /// The target's own graph passes, run after the shared ones and before decomposition.
    fn graph_passes(&self) -> Vec<Pass> {
        Vec::new()
    }

    /// Decomposition as this target wants it: the ops it has no kernel for rewritten, but the
    /// nodes it runs whole.
    fn decompose(&self) -> fn(&mut kiln_ir::Graph) -> Result<bool> {
        crate::passes::decompose::run
    }

    /// What fusion may make views of in this target's buffers.
    fn views(&self) -> Views;

    /// The stages a compile for this target has (`kiln emit --stage`).
    fn stages(&self) -> &'static [Stage];

    /// The whole-program step after the kernels' code, as the timings name it.
    fn finish_phase(&self) -> &'static str;
}

/// The rules of `target`.
pub fn rules(target: TargetKind) -> &'static dyn Rules {
    match target {
        TargetKind::Cpu => &cpu::CpuRules,
        TargetKind::Cuda => &gpu::GpuRules::CUDA,
        TargetKind::Opencl => &gpu::GpuRules::OPENCL,
    }
}

/// What a target does with the fused kernels, with its settings checked (the precision, the
/// target CPU, a forced GPU schedule). The driver holds one, picked by [`for_options`] or given
/// to [`crate::driver::compile_on`], and never matches on targets itself.
pub trait Backend: Sync {
    /// The target's rules (the same as [`rules`] gives for it).
    fn rules(&self) -> &'static dyn Rules;

    /// Each kernel's MLIR as codegen builds it, before the target's pipeline (`--stage mlir`
    /// stops here: no LLVM, no linker).
    fn kernel_mlir(&self, graph: &kiln_ir::Graph, kernels: &[Kernel]) -> Result<String>;

    /// Compiles every kernel into the target's code; `texts` receives each stage's text when
    /// given, `progress` hears how many kernels are done.
    fn compile(
        &self,
        graph: &kiln_ir::Graph,
        kernels: &[Kernel],
        texts: Option<&mut Stages>,
        progress: &dyn Fn(usize),
    ) -> Result<TargetCode>;
}

/// A kernel's module from codegen, checked: the kernel boundary, where a codegen failure gets the
/// kernel's name and what it computes (an unsupported node already says both).
pub(crate) fn verified<'c>(
    mlir: &MlirContext,
    k: &Kernel,
    built: Result<Module<'c>>,
) -> Result<Module<'c>> {
    let module = match built {
        Ok(m) => m,
        Err(e @ CompileError::Unsupported { .. }) => return Err(e),
        Err(e) => {
            return Err(CompileError::in_kernel(
                k,
                "mlir",
                crate::KernelError::Codegen(Box::new(e)),
            ))
        }
    };
    if !module.as_operation().verify() {
        let diagnostics = format!("{}\n{}", mlir.take_diagnostics(), module.as_operation());
        return Err(CompileError::in_kernel(k, "mlir", crate::KernelError::Verify { diagnostics }));
    }
    Ok(module)
}

/// Erases the linalg ops that check indices (`codegen::status`: their `scf.if` is tagged
/// `kiln.status`) whose results nothing uses. Fusion (elementwise fusion, tiling a consumer with
/// its producers) copies such an op into its consumer, check and all; the original then reads
/// as dead, but the status store in its body keeps MLIR from erasing it, and it would run a
/// second time on its own.
pub(crate) fn erase_dead_checks(module: &Module) {
    let root = edit::RawOp::of(&module.as_operation());
    let checks = root.descendants().into_iter().filter(|o| o.attr("kiln.status").is_some());
    let mut dead: Vec<edit::RawOp> = Vec::new();
    for check in checks {
        let mut owner = check.parent();
        while let Some(o) = owner.filter(|o| !o.name().starts_with("linalg.")) {
            owner = o.parent();
        }
        let Some(op) = owner else { continue };
        let unused = (0..op.num_results()).all(|i| edit::users(op.result(i)).is_empty());
        if unused && op.num_results() > 0 && !dead.contains(&op) {
            dead.push(op);
        }
    }
    for op in dead {
        op.erase();
    }
}

/// The stages a compile for `target` has.
pub fn stages_of(target: TargetKind) -> &'static [Stage] {
    rules(target).stages()
}

/// The targets whose compiles have `stage`.
pub fn targets_having(stage: Stage) -> Vec<TargetKind> {
    TargetKind::ALL.into_iter().filter(|t| stages_of(*t).contains(&stage)).collect()
}

/// The backend for `options.target`, with its settings read once and checked (each backend's
/// `from_options`: a forced GPU schedule from the options or `KILN_GPU_SCHEDULE`, the
/// microkernel choices, the precision it accepts).
pub fn for_options(options: &Options) -> Result<Box<dyn Backend>> {
    Ok(match options.target {
        TargetKind::Cpu => Box::new(cpu::CpuBackend::from_options(options)?),
        TargetKind::Cuda => Box::new(gpu::GpuBackend::from_options(
            options,
            gpu::GpuTarget::Cuda(options.ptx.clone()),
        )?),
        TargetKind::Opencl => {
            Box::new(gpu::GpuBackend::from_options(options, gpu::GpuTarget::Opencl)?)
        }
    })
}

/// The per-kernel microkernel choices in force: the options', else those `--tune` stored for
/// this CPU. The records were timed in f32: at another precision a kernel off the microkernel
/// would silently lose it, so they apply to f32 only.
pub(crate) fn microkernel_overrides(options: &Options) -> std::collections::HashMap<String, bool> {
    match &options.microkernel_overrides {
        Some(o) => o.clone(),
        None if options.target == TargetKind::Cpu && options.precision == crate::Precision::F32 => {
            crate::tune::load_record().into_iter().collect()
        }
        None => Default::default(),
    }
}

/// The GPU schedule forced by the options, else by `KILN_GPU_SCHEDULE` (for tests and debugging).
pub(crate) fn gpu_strategy(options: &Options) -> Result<Option<gpu::schedule::Strategy>> {
    if options.gpu_schedule.is_some() {
        return Ok(options.gpu_schedule);
    }
    match std::env::var("KILN_GPU_SCHEDULE") {
        Ok(s) => {
            s.parse().map(Some).map_err(|e| CompileError::Usage(format!("KILN_GPU_SCHEDULE: {e}")))
        }
        Err(_) => Ok(None),
    }
}

/// An MLIR context with every dialect, pass and LLVM translation, and its diagnostics collected
/// (so errors can say what MLIR said).
pub struct MlirContext {
    pub ctx: Context,
    diagnostics: Arc<Mutex<Vec<String>>>,
}

impl MlirContext {
    pub fn new() -> MlirContext {
        static PASSES: Once = Once::new();
        PASSES.call_once(register_all_passes);
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        let ctx = Context::new();
        ctx.append_dialect_registry(&registry);
        ctx.load_all_available_dialects();
        register_all_llvm_translations(&ctx);
        let diagnostics = Arc::new(Mutex::new(Vec::new()));
        let sink = diagnostics.clone();
        ctx.attach_diagnostic_handler(move |d| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(d.to_string());
            true
        });
        MlirContext { ctx, diagnostics }
    }

    /// The diagnostics since the last call, joined.
    pub fn take_diagnostics(&self) -> String {
        let mut d = self.diagnostics.lock().unwrap_or_else(|p| p.into_inner());
        let s = d.join("\n");
        d.clear();
        s
    }

    /// Runs a textual pass pipeline on a module; the error carries MLIR's diagnostics.
    pub fn run_pipeline(
        &self,
        module: &mut Module,
        pipeline: &str,
    ) -> Result<(), crate::LowerError> {
        // Named by its first pass, which is enough to find it in the source.
        let name = || {
            pipeline
                .trim_start_matches("builtin.module(")
                .split([',', '(', ')'])
                .next()
                .unwrap_or(pipeline)
                .to_string()
        };
        let pm = PassManager::new(&self.ctx);
        parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline).map_err(|e| {
            crate::LowerError { pipeline: name(), diagnostics: format!("it does not parse: {e}") }
        })?;
        self.take_diagnostics();
        pm.run(module).map_err(|_| crate::LowerError {
            pipeline: name(),
            diagnostics: self.take_diagnostics(),
        })
    }

    /// Applies a transform script (a module with `@__transform_main`) to `payload`.
    pub fn apply_transform(&self, payload: &Operation, script: &str) -> Result<(), String> {
        let script = Module::parse(&self.ctx, script).ok_or_else(|| {
            format!("the transform script does not parse: {}", self.take_diagnostics())
        })?;
        let sequence =
            script.body().first_operation().ok_or("the transform script is empty")?.to_raw();
        self.take_diagnostics();
        // SAFETY: all handles belong to this context and outlive the call.
        let ok = unsafe {
            let options = mlir_sys::mlirTransformOptionsCreate();
            let r = mlir_sys::mlirTransformApplyNamedSequence(
                payload.to_raw(),
                sequence,
                script.as_operation().to_raw(),
                options,
            );
            mlir_sys::mlirTransformOptionsDestroy(options);
            r.value != 0
        };
        if ok {
            Ok(())
        } else {
            Err(self.take_diagnostics())
        }
    }
}

impl Default for MlirContext {
    fn default() -> MlirContext {
        MlirContext::new()
    }
}

use melior::ir::BlockLike;
