//! kiln-compiler's error type: what failed, at which stage, for which node.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompileError {
    #[error(transparent)]
    Ir(#[from] kiln_ir::IrError),

    #[error("{path}: {msg}")]
    File { path: String, msg: String },

    #[error("{0}")]
    Usage(String),
}

pub type Result<T, E = CompileError> = std::result::Result<T, E>;
