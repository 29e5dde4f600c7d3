//! kiln-compiler: graph passes, fusion, MLIR/LLVM codegen, targets, and the `kiln` CLI.

pub mod cli;
mod error;
pub mod toolchain;

pub use error::{CompileError, Result};
