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

    /// The text form could not be parsed.
    #[error("line {line}, column {column}: {msg}")]
    Parse { line: usize, column: usize, msg: String },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;
