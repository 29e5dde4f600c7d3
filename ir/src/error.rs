//! kiln-ir's error type. Every variant says where: the node and op, the line of text, the input.

use thiserror::Error;

use crate::TensorType;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// Shape or type inference rejected a node: its operands' types, an attribute, a constant.
    #[error("node `{node}` ({op}): {error}")]
    Shape { node: String, op: &'static str, error: Box<OpError> },

    /// The reference interpreter could not run a node: a value out of range, a limit reached.
    #[error("evaluating node `{node}` ({op}): {error}")]
    Eval { node: String, op: &'static str, error: Box<OpError> },

    /// An imported node's attributes do not make an op: missing, mistyped or out of range.
    #[error("node `{node}` ({op}): {error}")]
    Attr { node: String, op: String, error: Box<AttrError> },

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

    /// An ONNX `Gradient` node (`ai.onnx.preview.training`) that defines no derivative kiln can
    /// build: a name it does not resolve, inputs that do not match its names, a `y` that does
    /// not depend on an x, or the backward graph's own error. (Its attributes' errors are
    /// [`IrError::Attr`].)
    #[error("node `{node}` (Gradient): {error}")]
    Gradient { node: String, error: Box<GradientOpError> },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// The leaves are boxed: an `IrError` stays small in every `Result` of the crate.
impl IrError {
    /// Inference's finding about node `node` (`op`).
    pub fn shape(node: impl Into<String>, op: &'static str, error: OpError) -> IrError {
        IrError::Shape { node: node.into(), op, error: Box::new(error) }
    }

    /// The interpreter's finding about node `node` (`op`).
    pub fn eval(node: impl Into<String>, op: &'static str, error: OpError) -> IrError {
        IrError::Eval { node: node.into(), op, error: Box::new(error) }
    }

    /// A bad attribute of node `node` (`op`).
    pub fn attr(node: impl Into<String>, op: impl Into<String>, error: AttrError) -> IrError {
        IrError::Attr { node: node.into(), op: op.into(), error: Box::new(error) }
    }

    /// The error with `what` in front of its message (`tensor `w`: ...`) where it is a message
    /// (`Onnx`, `NotSupported`, `Tensor`); the other variants already say what they are about.
    pub(crate) fn context(self, what: impl std::fmt::Display) -> IrError {
        match self {
            IrError::Onnx(m) => IrError::Onnx(format!("{what}: {m}")),
            IrError::NotSupported(m) => IrError::NotSupported(format!("{what}: {m}")),
            IrError::Tensor(m) => IrError::Tensor(format!("{what}: {m}")),
            other => other,
        }
    }
}

/// Why an op could not be built from its attributes ([`crate::op::Attrs`]): which attribute,
/// and the value it had. The node and op are the caller's ([`IrError::Attr`], a parse error's
/// line).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AttrError {
    #[error("attribute `{name}` is required")]
    Missing { name: String },
    /// The attribute is of another kind (`want` and `got`: "an integer", "a list of floats"...).
    #[error("attribute `{name}` must be {want}, got {got}")]
    WrongKind { name: String, want: &'static str, got: &'static str },
    #[error("attribute `{name}` must not be negative, got {value}")]
    Negative { name: String, value: i64 },
    /// An entry of a list of sizes is negative.
    #[error("attribute `{name}` must not hold negative values, got {value}")]
    NegativeEntry { name: String, value: i64 },
    #[error("attribute `{name}` must be 0 or 1, got {value}")]
    NotFlag { name: String, value: i64 },
    /// A string attribute names no member of its enum.
    #[error("attribute `{name}` has the unknown value `{value}`")]
    UnknownValue { name: String, value: String },
    /// A string attribute is none of the spellings the op takes.
    #[error("attribute `{name}` must be {}, got `{value}`", or_list(allowed))]
    NotOneOf { name: String, value: String, allowed: &'static [&'static str] },
    /// A value its kind allows but the op does not (a direction of 2, a count of 0...).
    #[error("attribute `{name}` {why}, got {value}")]
    OutOfRange { name: String, value: String, why: &'static str },
    /// An attribute the op does not have (a misspelling never passes silently).
    #[error("{op} has no attribute `{name}`")]
    Unexpected { op: String, name: String },
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    /// A list attribute whose length does not fit the input (a window's `pads` for its spatial
    /// rank).
    #[error("{name} has {len} entries, {want} expected")]
    Length { name: &'static str, len: usize, want: usize },
    /// Attributes that cannot be read as any op's (a Constant's data is not an attribute).
    #[error("{0}")]
    Inconsistent(&'static str),
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// What is wrong with one node's operands, attributes or values for its op: the leaf of
/// [`IrError::Shape`] (inference) and [`IrError::Eval`] (the interpreter), which name the node
/// and op. The common findings are typed with their values; a rule's own finding, which names
/// the shapes and values it is about, is [`OpError::Invalid`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OpError {
    #[error(transparent)]
    Attr(#[from] AttrError),
    #[error("operand {index} is missing")]
    MissingOperand { index: usize },
    /// More or fewer operands than the op takes.
    #[error("takes {} operands, got {present} (of {slots} slots)", arity_text(*min, *max))]
    Arity { min: usize, max: usize, present: usize, slots: usize },
    /// A context around an operand's error (`operand 1: expected a tensor, got ...`).
    #[error("operand {index}: {error}")]
    Operand { index: usize, error: Box<OpError> },
    #[error("axis {axis} is out of range for {ty}")]
    Axis { axis: i64, ty: Box<TensorType> },
    /// Operands that must share an element type do not.
    #[error("{what} must have the same element type, got {a} and {b}")]
    DTypeMismatch { what: String, a: Box<TensorType>, b: Box<TensorType> },
    /// An element type outside the class the op takes (`class`: "float", "numeric").
    #[error("needs a {class} type, got {ty}")]
    NeedsType { class: &'static str, ty: Box<TensorType> },
    /// A result rank taken from a value's length, past [`crate::infer::MAX_RANK`].
    #[error("a result of rank {rank}: kiln takes at most {} axes", crate::infer::MAX_RANK)]
    TooManyAxes { rank: usize },
    /// A tensor type whose bytes overflow what memory can address ([`crate::size`]).
    #[error("{what} has more elements than a tensor can hold (at most 2^63 - 1 bytes)")]
    TooLarge { what: String },
    /// A sequence or optional where the op takes a tensor (`got`: [`crate::Value::describe`]).
    #[error("expected a tensor, got {got}")]
    NotTensor { got: String },
    /// A convolution's or pool's window wider than its padded input on one spatial axis.
    #[error("the window ({extent} wide with dilation) does not fit the padded input ({padded}) on spatial axis {axis}")]
    WindowTooWide { extent: usize, padded: usize, axis: usize },
    /// An index value outside its axis (the interpreter's gathers and scatters).
    #[error("index {index} is out of range for axis {axis} of size {size}")]
    Index { index: i64, axis: usize, size: usize },
    /// A Loop that ran `limit` steps (`EvalOptions::max_loop_steps`) without ending.
    #[error("reached the limit of {limit} steps without ending (--max-loop-steps / EvalOptions::max_loop_steps: raise it, or leave it unset for no limit)")]
    StepLimit { limit: u64 },
    /// An op whose rules are not written yet.
    #[error("{op} is not implemented yet")]
    NotYet { op: &'static str },
    /// A node asks for more results than its op gives (or for none).
    #[error("has {have} results, {asked} asked for")]
    ResultCount { have: usize, asked: usize },
    /// A node's declared result type disagrees with what inference gives.
    #[error("result {index} is declared {declared} but inference gives {inferred}")]
    ResultType { index: usize, declared: Box<TensorType>, inferred: Box<TensorType> },
    /// A branch, body or step of a control-flow op that failed (`what`: "branch `then`", "the
    /// body `b`, step 3").
    #[error("in {what}: {error}")]
    Subgraph { what: String, error: Box<IrError> },
    /// A tensor the rule builds that cannot be made (too large for memory's addresses).
    #[error(transparent)]
    Ir(Box<IrError>),
    /// A rule's own finding, naming the shapes and values it is about.
    #[error("{0}")]
    Invalid(String),
}

fn arity_text(min: usize, max: usize) -> String {
    if min == max {
        format!("{min}")
    } else if max == usize::MAX {
        format!("at least {min}")
    } else {
        format!("{min} to {max}")
    }
}

impl From<IrError> for OpError {
    fn from(e: IrError) -> OpError {
        OpError::Ir(Box::new(e))
    }
}

impl From<String> for OpError {
    fn from(msg: String) -> OpError {
        OpError::Invalid(msg)
    }
}

impl From<&str> for OpError {
    fn from(msg: &str) -> OpError {
        OpError::Invalid(msg.into())
    }
}

/// `Err(invalid!("...", args))`: an [`OpError::Invalid`] from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        $crate::error::OpError::Invalid(format!($($arg)*))
    };
}
pub(crate) use invalid;

/// What is wrong with an ONNX `Gradient` node: the leaf of [`IrError::Gradient`], which names
/// the node. `attr` is the attribute a name comes from (`xs`, `zs` or `y`).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GradientOpError {
    #[error("attribute `{attr}` names `{name}`, which no node, initializer or input defines")]
    UnknownName { attr: &'static str, name: String },
    #[error("`{name}` is named twice in xs and zs")]
    Repeated { name: String },
    /// The spec's independent variables: an x or z computed from the others is not one.
    #[error("`{name}` of {attr} is computed from other values of xs and zs, so it is not an independent variable")]
    NotIndependent { attr: &'static str, name: String },
    #[error("takes one input for each name of xs and then of zs ({want}), got {got}")]
    InputCount { want: usize, got: usize },
    /// Input `index` is missing or of another element type than the value it stands for.
    #[error("input {index} stands for `{name}` ({want}), got {got}")]
    InputType { index: usize, name: String, want: Box<TensorType>, got: String },
    #[error("gives one output for each name of xs ({xs}), got {got}")]
    OutputCount { xs: usize, got: usize },
    /// The outputs have each x's shape, which holds dy/dx only for a `y` of one element.
    #[error("y `{y}` must be a float tensor of one element, got {ty}")]
    NotScalar { y: String, ty: Box<TensorType> },
    #[error("y `{y}` does not depend on `{x}` of xs")]
    NotReachable { x: String, y: String },
    /// The backward graph could not be built (an op between xs and y without a gradient rule,
    /// an x that is not a float...): the error of [`crate::grad::append_backward`].
    #[error("differentiating `{y}`: {}", chain(error))]
    Backward { y: String, error: crate::grad::GradError },
}

/// An error and its causes joined by `: `, each once (a cause whose text is already there is
/// not repeated), so a leaf shown inline keeps its causes; the compiler's `chain` is this one.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !text.contains(&s) {
            text.push_str(&format!(": {s}"));
        }
        cause = c.source();
    }
    text
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Shape};

    #[test]
    fn choices_and_arities_read_as_sentences() {
        assert_eq!(or_list(&[]), "");
        assert_eq!(or_list(&["LEFT"]), "LEFT");
        assert_eq!(or_list(&["LEFT", "RIGHT"]), "LEFT or RIGHT");
        assert_eq!(or_list(&["a", "b", "c"]), "a, b or c");
        let arity = |min, max| OpError::Arity { min, max, present: 1, slots: 4 }.to_string();
        assert_eq!(arity(2, 2), "takes 2 operands, got 1 (of 4 slots)");
        assert_eq!(arity(2, usize::MAX), "takes at least 2 operands, got 1 (of 4 slots)");
        assert_eq!(arity(2, 3), "takes 2 to 3 operands, got 1 (of 4 slots)");
    }

    #[test]
    fn leaves_print_inside_the_node_that_failed() {
        let ty = TensorType::new(DType::F32, Shape::fixed(&[2, 3]));
        let e = IrError::shape("sm", "Softmax", OpError::Axis { axis: 2, ty: Box::new(ty) });
        assert_eq!(e.to_string(), "node `sm` (Softmax): axis 2 is out of range for f32[2,3]");
        let inner = OpError::NotTensor { got: "a sequence of 2 tensors".into() };
        let e = IrError::eval("g", "Gather", OpError::Operand { index: 1, error: Box::new(inner) });
        assert_eq!(
            e.to_string(),
            "evaluating node `g` (Gather): operand 1: expected a tensor, got a sequence of 2 tensors"
        );
        let bad = AttrError::NotOneOf {
            name: "auto_pad".into(),
            value: "X".into(),
            allowed: &["A", "B"],
        };
        let e = IrError::attr("c", "Conv", bad);
        assert_eq!(e.to_string(), "node `c` (Conv): attribute `auto_pad` must be A or B, got `X`");
    }

    #[test]
    fn errors_stay_small_in_every_result() {
        // Every fallible function of the crate returns one: the leaves are boxed (clippy's
        // result_large_err draws the line at 128 bytes).
        assert!(std::mem::size_of::<IrError>() <= 64, "{}", std::mem::size_of::<IrError>());
        assert!(std::mem::size_of::<OpError>() <= 80, "{}", std::mem::size_of::<OpError>());
    }

    #[test]
    fn context_prefixes_messages_only() {
        let e = IrError::Onnx("bad".into()).context("tensor `w`");
        assert_eq!(e, IrError::Onnx("tensor `w`: bad".into()));
        let e = IrError::NotSupported("bf17".into()).context("input `x`");
        assert_eq!(e, IrError::NotSupported("input `x`: bf17".into()));
        let typed = IrError::shape("n", "Add", OpError::NotYet { op: "Add" });
        assert_eq!(typed.clone().context("ignored"), typed);
    }
}
