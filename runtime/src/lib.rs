//! kiln-runtime: loads compiled kiln artifacts and runs them on a device.
//!
//! This crate must never depend on MLIR or LLVM (`make test` checks it), so an ahead-of-time
//! artifact runs on a machine that has only the runtime. Its devices and artifact format arrive
//! with native compilation; see docs/architecture.md.
