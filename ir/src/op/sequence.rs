//! ONNX's sequence and optional ops. Their values exist between these ops only: the interpreter
//! runs them on [`crate::Value`]s, and the compiler resolves them into tensors when positions and
//! lengths are known (`passes/sequences.rs` in kiln-compiler).

use super::Subgraph;
use crate::DType;

/// One sequence op. Operands and results as in ONNX; a position counts from the end when
/// negative.
#[derive(Clone, Debug, PartialEq)]
pub enum SequenceOp {
    /// `() -> seq`, empty, of element type `dtype`.
    Empty { dtype: DType },
    /// `(x...) -> seq` of the operands, in order.
    Construct,
    /// `(seq, x, position?) -> seq` with `x` inserted before `position` (at the end when absent).
    Insert,
    /// `(seq, position?) -> seq` without the element at `position` (the last when absent).
    Erase,
    /// `(seq, position) -> x`.
    At,
    /// `(seq) -> i64[]`.
    Length,
    /// `(x, split?) -> seq`: `x` cut along `axis` into pieces of `split` (a scalar: equal pieces,
    /// the last shorter; a list: those lengths; absent: pieces of 1, `keepdims` deciding whether
    /// the axis stays).
    Split { axis: i64, keepdims: bool },
    /// `(seq) -> y`: the elements joined along `axis`, or stacked along a new axis `axis`.
    Concat { axis: i64, new_axis: bool },
    /// `(captured..., seq, more...) -> (seq...)`: runs the body once per element; each operand
    /// after the captured ones that is a sequence gives the body its element, a tensor itself.
    Map { body: Subgraph, captures: usize },
}

impl SequenceOp {
    pub fn name(&self) -> &'static str {
        match self {
            SequenceOp::Empty { .. } => "SequenceEmpty",
            SequenceOp::Construct => "SequenceConstruct",
            SequenceOp::Insert => "SequenceInsert",
            SequenceOp::Erase => "SequenceErase",
            SequenceOp::At => "SequenceAt",
            SequenceOp::Length => "SequenceLength",
            SequenceOp::Split { .. } => "SplitToSequence",
            SequenceOp::Concat { .. } => "ConcatFromSequence",
            SequenceOp::Map { .. } => "SequenceMap",
        }
    }

    /// How many operands it takes: (required, maximum); `usize::MAX` means variadic.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            SequenceOp::Empty { .. } => (0, 0),
            SequenceOp::Construct | SequenceOp::Map { .. } => (1, usize::MAX),
            SequenceOp::Insert => (2, 3),
            SequenceOp::Erase | SequenceOp::Split { .. } => (1, 2),
            SequenceOp::At => (2, 2),
            SequenceOp::Length | SequenceOp::Concat { .. } => (1, 1),
        }
    }

    /// How many results it has: SequenceMap one per body result, the others one.
    pub fn outputs(&self) -> usize {
        match self {
            SequenceOp::Map { body, .. } => body.0.outputs().len(),
            _ => 1,
        }
    }

    /// The operand that decides which element is read, written or removed, and how a split cuts:
    /// the compiler needs its value.
    pub fn position_operand(&self) -> Option<usize> {
        match self {
            SequenceOp::Insert => Some(2),
            SequenceOp::Erase | SequenceOp::At | SequenceOp::Split { .. } => Some(1),
            SequenceOp::Empty { .. }
            | SequenceOp::Construct
            | SequenceOp::Length
            | SequenceOp::Concat { .. }
            | SequenceOp::Map { .. } => None,
        }
    }
}

/// One optional op.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionalOp {
    /// `(x?) -> opt`: holding `x`, or empty of element type `dtype` (a sequence's when `sequence`).
    Wrap { dtype: Option<DType>, sequence: bool },
    /// `(opt?) -> bool[]`: whether it holds a value (false when the operand is absent).
    HasElement,
    /// `(opt) -> x`: the value it holds (an error when empty); a tensor or sequence passes.
    GetElement,
}

impl OptionalOp {
    /// How many operands it takes: (required, maximum).
    pub fn arity(&self) -> (usize, usize) {
        match self {
            OptionalOp::Wrap { .. } | OptionalOp::HasElement => (0, 1),
            OptionalOp::GetElement => (1, 1),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            OptionalOp::Wrap { .. } => "Optional",
            OptionalOp::HasElement => "OptionalHasElement",
            OptionalOp::GetElement => "OptionalGetElement",
        }
    }
}
