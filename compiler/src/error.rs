//! kiln-compiler's error types: what failed, at which stage, for which node and kernel.
//!
//! Leaf errors say what went wrong ([`LowerError`]: a pass pipeline and MLIR's diagnostics;
//! [`KernelError`]); [`CompileError::Codegen`] is the one context wrapper at the kernel
//! boundary, naming the kernel, what it computes (its nodes and ops) and the stage, with the
//! leaf as its `source`. The CLI and the Python package print the whole chain.

use thiserror::Error;

/// A pass pipeline of MLIR that failed, with what MLIR said.
#[derive(Debug, Error)]
#[error("the pipeline {pipeline} failed: {diagnostics}")]
pub struct LowerError {
    pub pipeline: String,
    pub diagnostics: String,
}

/// Helpers of the targets that report in text take a failed pipeline as its message.
impl From<LowerError> for String {
    fn from(e: LowerError) -> String {
        e.to_string()
    }
}

/// What failed inside one kernel.
#[derive(Debug, Error)]
pub enum KernelError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The MLIR codegen built does not verify (a kiln bug).
    #[error("the generated MLIR does not verify: {diagnostics}")]
    Verify { diagnostics: String },
    /// Code generation failed (a kiln bug) for a node of the kernel.
    #[error("code generation failed")]
    Codegen(#[source] Box<CompileError>),
    /// A schedule, a microkernel plan, LLVM or the linker failed, as the stage says.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for KernelError {
    fn from(s: String) -> KernelError {
        KernelError::Failed(s)
    }
}

impl From<&str> for KernelError {
    fn from(s: &str) -> KernelError {
        KernelError::Failed(s.into())
    }
}

#[derive(Debug, Error)]
pub enum CompileError {
    #[error(transparent)]
    Ir(#[from] kiln_ir::IrError),

    #[error("{path}: {msg}")]
    File { path: String, msg: String },

    #[error("{0}")]
    Usage(String),

    /// Code generation or a target pipeline failed for a kernel: the context around a
    /// [`KernelError`].
    #[error("compiling kernel `{kernel}` ({label}), stage {stage}")]
    Codegen {
        kernel: String,
        label: String,
        stage: &'static str,
        #[source]
        source: KernelError,
    },

    /// An output cannot be written over an input (`Options::in_place`): the pair is not an
    /// input and an output of the graph, or the graph gives no order in which every reader of
    /// the old value runs before the new value is written (`inplace::plan`).
    #[error("output `{output}` cannot be written in place over input `{input}`: {why}")]
    InPlace { input: String, output: String, why: String },

    /// The model is valid but the code generator cannot compile part of it yet.
    #[error("kernel `{kernel}` ({label}): node `{node}` ({op}) {what}")]
    Unsupported { kernel: String, label: String, node: String, op: &'static str, what: String },

    /// A storage type (8- and 4-bit floats, 4- and 2-bit integers) computed on by something other
    /// than a cast: compiled code converts them only in casts.
    #[error("node `{node}` ({op}) computes on {dtype}, which compiled code only converts to and from with Cast (the interpreter, --device ref, runs it)")]
    StorageType { node: String, op: &'static str, dtype: kiln_ir::DType },

    /// A node on strings that the host part cannot take (the graph has shapes not known when it
    /// compiles for another reason): compiled code holds no strings.
    #[error("node `{node}` ({op}) holds strings, which only the host evaluates, and this graph has no host part to take it (the interpreter, --device ref, runs it)")]
    Strings { node: String, op: &'static str },

    /// A `--precision` the target (or this machine) has no kernels for.
    #[error("--precision {precision} on {target}: {why}")]
    Precision { precision: crate::Precision, target: &'static str, why: String },

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
    NotBatchable {
        input: String,
        symbol: String,
        node: Option<(String, &'static str)>,
        why: String,
    },

    /// Linking the kernels into a library failed outside kiln: the system C compiler `cc` is
    /// missing or refused (its message), or the private folder it links in could not be made,
    /// written or read.
    #[error("{0}")]
    Link(String),

    /// Reading or writing a stream that is not a model or tensor file (the conformance worker's
    /// standard input and output).
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A kiln bug, not bad input: an invariant a stage relies on that an earlier stage broke.
    /// Whatever a model, an option or the machine can cause has its own variant.
    #[error("internal error: {0}")]
    Internal(String),

    #[error(transparent)]
    Runtime(#[from] kiln_runtime::RuntimeError),
}

impl CompileError {
    /// A failure of code generation or a target pipeline in kernel `k`, at `stage`.
    pub(crate) fn in_kernel(
        k: &crate::fuse::Kernel,
        stage: &'static str,
        e: impl Into<KernelError>,
    ) -> CompileError {
        CompileError::Codegen {
            kernel: k.name.clone(),
            label: k.label.clone(),
            stage,
            source: e.into(),
        }
    }

    /// The error and its causes, each once, joined by `: ` (for one-line reports).
    pub fn chain(&self) -> String {
        chain(self)
    }
}

/// Any error and its causes, each once (a cause whose text is already there is not repeated),
/// joined by `: `: what the conformance engine and Python's `KilnError` report.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    kiln_ir::chain(e)
}

pub type Result<T, E = CompileError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_gives_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the pipe closed");
        let e = CompileError::Io { what: "answering", source: io };
        assert_eq!(e.to_string(), "answering");
        assert_eq!(e.chain(), "answering: the pipe closed");
        // A cause whose text the error already holds is not repeated.
        let lower = LowerError { pipeline: "p".into(), diagnostics: "d".into() };
        let e = CompileError::Codegen {
            kernel: "k0".into(),
            label: "Add".into(),
            stage: "lower",
            source: KernelError::Lower(lower),
        };
        assert_eq!(e.chain(), "compiling kernel `k0` (Add), stage lower: the pipeline p failed: d");
        let ir = CompileError::Ir(kiln_ir::IrError::Graph("a cycle".into()));
        assert_eq!(ir.chain(), "invalid graph: a cycle");
    }

    #[test]
    fn user_errors_name_what_they_are_about() {
        let e = CompileError::Unsupported {
            kernel: "k3".into(),
            label: "QConv".into(),
            node: "conv1".into(),
            op: "QConv",
            what: "has a bias of 2e9".into(),
        };
        assert_eq!(e.to_string(), "kernel `k3` (QConv): node `conv1` (QConv) has a bias of 2e9");
        let e = CompileError::NotBatchable {
            input: "x".into(),
            symbol: "n".into(),
            node: Some(("sum".into(), "ReduceSum")),
            why: "sums over the batch".into(),
        };
        assert!(
            e.to_string().starts_with(
                "input `x` has the symbolic batch `n`, but node `sum` (ReduceSum) sums over the batch"
            ),
            "{e}"
        );
        let e = CompileError::Internal("an invariant".into());
        assert_eq!(e.to_string(), "internal error: an invariant");
    }
}
