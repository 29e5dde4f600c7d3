//! kiln's integration suite lives in `tests/main.rs`: one test binary, since each binary that links
//! MLIR and LLVM is about 250 MB.

pub mod graph_fuzz;
