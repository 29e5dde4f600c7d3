//! kiln's integration tests: one binary for everything that links MLIR/LLVM.

mod codegen_scan;
mod compile;
mod toolchain;
