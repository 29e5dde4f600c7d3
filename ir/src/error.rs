//! kiln-ir's error type. Every variant says where: the node and op, the line of text, the input.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// Shape or type inference rejected a node.
    #[error("node `{node}` ({op}): {msg}")]
    Shape { node: String, op: &'static str, msg: String },

    /// The reference interpreter could not run a node.
    #[error("evaluating node `{node}` ({op}): {msg}")]
    Eval { node: String, op: &'static str, msg: String },

    /// The graph's structure is broken (a dangling operand, a cycle, a duplicate name...).
    #[error("invalid graph: {0}")]
    Graph(String),

    /// Inputs given to a graph do not match what it declares.
    #[error("input `{name}`: {msg}")]
    Input { name: String, msg: String },

    /// Tensor construction or conversion.
    #[error("tensor: {0}")]
    Tensor(String),

    /// An ONNX file could not be read: corrupt, truncated, not ONNX, or inconsistent.
    #[error("{0}")]
    Onnx(String),

    /// A valid model feature kiln does not support (a training mode, an element type...).
    #[error("{0}")]
    NotSupported(String),

    /// A model uses ops kiln does not support; all of them are listed at once.
    #[error("the model uses {} unsupported op{}:\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, .0.iter().map(|u| format!("  {u}")).collect::<Vec<_>>().join("\n"))]
    Unsupported(Vec<UnsupportedOp>),

    /// The text form could not be parsed.
    #[error("line {line}, column {column}: {msg}")]
    Parse { line: usize, column: usize, msg: String },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// An op a model uses that kiln does not support, with every node that uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnsupportedOp {
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
    pub nodes: Vec<String>,
}

impl std::fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 5;
        let mut names: Vec<&str> = self.nodes.iter().take(SHOWN).map(String::as_str).collect();
        let more = self.nodes.len().saturating_sub(SHOWN);
        let extra = if more > 0 { format!(" and {more} more") } else { String::new() };
        if names.is_empty() {
            names.push("?");
        }
        write!(
            f,
            "{} (domain {}, opset {}): {} node{} ({}{extra})",
            self.op_type,
            self.domain,
            self.opset,
            self.nodes.len(),
            if self.nodes.len() == 1 { "" } else { "s" },
            names.join(", ")
        )
    }
}
