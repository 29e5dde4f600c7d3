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
use melior::utility::{parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes};
use melior::Context;

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
    pub fn run_pipeline(&self, module: &mut Module, pipeline: &str) -> Result<(), String> {
        let pm = PassManager::new(&self.ctx);
        parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline).map_err(|e| format!("bad pipeline: {e}"))?;
        self.take_diagnostics();
        pm.run(module).map_err(|_| self.take_diagnostics())
    }

    /// Applies a transform script (a module with `@__transform_main`) to `payload`.
    pub fn apply_transform(&self, payload: &Operation, script: &str) -> Result<(), String> {
        let script = Module::parse(&self.ctx, script).ok_or_else(|| format!("the transform script does not parse: {}", self.take_diagnostics()))?;
        let sequence = script.body().first_operation().ok_or("the transform script is empty")?.to_raw();
        self.take_diagnostics();
        // SAFETY: all handles belong to this context and outlive the call.
        let ok = unsafe {
            let options = mlir_sys::mlirTransformOptionsCreate();
            let r = mlir_sys::mlirTransformApplyNamedSequence(payload.to_raw(), sequence, script.as_operation().to_raw(), options);
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
