//! kiln-compiler: graph passes, fusion, MLIR/LLVM codegen, targets, and the `kiln` CLI.

pub mod artifact;
pub mod backend;
pub mod batch;
pub mod cache;
pub mod cli;
pub mod codegen;
pub mod control;
pub mod dot;
pub mod driver;
mod error;
pub mod fuse;
pub mod inplace;
mod options;
pub mod pad;
pub mod passes;
pub mod session;
mod stage;
pub mod toolchain;
pub mod train;
pub mod tune;
pub mod values;

pub use cache::dir as cache_dir;
pub use driver::{compile, compile_on, compile_reporting, jit, Compiled, Progress};
pub use error::{chain as error_chain, CompileError, KernelError, LowerError, Result};
pub use options::{Options, Precision, TargetKind};
pub use session::Session;
pub use stage::{Stage, Stages};
pub use train::{TrainError, TrainOptions, TrainSession};
