//! kiln's integration tests: one binary for everything that links MLIR/LLVM.

mod compile;
mod decompose;
mod toolchain;
