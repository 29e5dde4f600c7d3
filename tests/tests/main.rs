//! kiln's integration tests: one binary for everything that links MLIR/LLVM.

mod artifact;
mod batch;
mod cache;
mod cli;
mod codegen_indexing;
mod codegen_scan;
mod compile;
mod control;
mod decisions;
mod decompose;
mod determinism;
mod differential;
mod docs;
mod filetests;
mod gpu;
mod gpu_tile;
mod integer;
mod microkernel;
mod precision;
mod recognize;
mod sequences;
mod session;
mod stages;
mod status;
mod target_cpu;
mod toolchain;
