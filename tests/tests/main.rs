//! kiln's integration tests: one binary for everything that links MLIR/LLVM.

mod codegen_indexing;
mod compile;
mod toolchain;
