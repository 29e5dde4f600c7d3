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

    /// Code generation or a target pipeline failed for a kernel.
    #[error("compiling kernel `{kernel}` ({label}), stage {stage}: {msg}")]
    Codegen { kernel: String, label: String, stage: &'static str, msg: String },

    /// The model is valid but the code generator cannot compile part of it yet.
    #[error("kernel `{kernel}` ({label}): node `{node}` ({op}) {what}")]
    Unsupported { kernel: String, label: String, node: String, op: &'static str, what: String },

    /// Result shapes that depend on values kiln does not have at compile time.
    #[error("{0}")]
    DynamicShapes(String),

    /// A sequence or optional whose content is known only at run time (compiled code holds
    /// tensors only).
    #[error("node `{node}` ({op}): {what}")]
    RuntimeSequence { node: String, op: &'static str, what: String },

    /// A symbolic batch whose samples some node mixes, so no program for one batch size serves
    /// the others.
    #[error(
        "input `{input}` has the symbolic batch `{symbol}`, but {}{why}, so a program compiled for one batch size cannot run another; give the sizes with --input-shape",
        node.as_ref().map_or(String::new(), |(n, op)| format!("node `{n}` ({op}) "))
    )]
    NotBatchable { input: String, symbol: String, node: Option<(String, &'static str)>, why: String },

    /// A kiln bug, not bad input.
    #[error("internal error: {0}")]
    Internal(String),

    #[error(transparent)]
    Runtime(#[from] kiln_runtime::RuntimeError),
}

impl CompileError {
    /// A failure of code generation or a target pipeline in kernel `k`, at `stage`.
    pub(crate) fn in_kernel(k: &crate::fuse::Kernel, stage: &'static str, msg: impl Into<String>) -> CompileError {
        CompileError::Codegen { kernel: k.name.clone(), label: k.label.clone(), stage, msg: msg.into() }
    }
}

pub type Result<T, E = CompileError> = std::result::Result<T, E>;
