//! kiln-runtime's error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The artifact file is damaged, foreign, or from another format version.
    #[error("{path}: {msg}")]
    Artifact { path: String, msg: String },

    /// Inputs given to `run` do not match what the executable declares.
    #[error("input `{name}`: {msg}")]
    Input { name: String, msg: String },

    /// A device could not be used (missing driver, no such device, a load failure).
    #[error("device {device}: {msg}")]
    Device { device: String, msg: String },

    /// OpenCL cannot be listed or used here (no loader, no platform, a failed call).
    #[error("device opencl")]
    Opencl(#[from] crate::device::opencl::OpenclError),

    /// A kernel launch failed.
    #[error("kernel `{kernel}`: {msg}")]
    Launch { kernel: String, msg: String },

    /// A kernel could not finish and said why through the run's status word (an index out of
    /// range, an allocation refused); `kernel` is its label, naming the node and op.
    #[error("kernel `{kernel}`: {failure}")]
    Kernel { kernel: String, failure: crate::status::KernelFailure },

    #[error("{0}")]
    Io(String),

    /// Something sized by the model or its inputs does not fit in the memory budget.
    #[error(
        "{what} needs {}, more than the memory budget of {limit} bytes ({}): the memory available, or --max-memory / LoadOptions::max_memory",
        bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes ({})", crate::memory::human(b))),
        crate::memory::human(*limit)
    )]
    Memory { what: String, bytes: Option<u64>, limit: u64 },

    /// A run-time Loop would take more steps than `LoadOptions::max_loop_steps` allows.
    #[error(
        "Loop `{node}` reached the limit of {limit} steps without ending (--max-loop-steps / LoadOptions::max_loop_steps: raise it, or leave it unset for no limit)"
    )]
    LoopLimit { node: String, limit: u64 },
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
