//! Facts about the MLIR/LLVM that kiln links, checked at run time.

use melior::dialect::DialectRegistry;
use melior::utility::register_all_dialects;

/// The linked LLVM's version (major, minor, patch).
pub fn llvm_version() -> (u32, u32, u32) {
    inkwell::support::get_llvm_version()
}

/// How many MLIR dialects the linked MLIR registers; creating a context proves MLIR is usable.
pub fn mlir_dialect_count() -> usize {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = melior::Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.registered_dialect_count()
}

/// The one-paragraph version report of `kiln --version`.
pub fn version_report() -> String {
    let (major, minor, patch) = llvm_version();
    format!(
        "kiln {}\nLLVM {major}.{minor}.{patch} (inkwell 0.11), MLIR {major} (melior 0.27.8, {} dialects registered)",
        env!("CARGO_PKG_VERSION"),
        mlir_dialect_count()
    )
}
