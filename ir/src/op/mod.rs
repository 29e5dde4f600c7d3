//! Operators: a closed enum with typed attributes and ONNX semantics.
//!
//! Operands that ONNX passes as inputs in its newest opsets (Reshape's shape, Clip's bounds, the
//! axes of Reduce*/Squeeze/Unsqueeze, Slice's starts/ends...) are operands here too, so one op has
//! one meaning; an importer of an older opset turns the attribute into a constant operand.
//! Elementwise ops are grouped into [`UnaryOp`] and [`BinaryOp`] because fusion and codegen treat
//! them as one family.

pub(crate) mod attr;
mod elementwise;
mod params;
mod sequence;
mod window;

pub use attr::{Attr, Attrs};
pub use elementwise::{BinaryOp, TypeClass, UnaryOp};
pub use params::*;
pub use sequence::{OptionalOp, SequenceOp};
pub use window::{AutoPad, SpatialAxis, Window};

use std::sync::Arc;

use crate::{DType, Graph, Tensor};

/// A graph inside an op (the branches of `If`). Two subgraphs are equal when they print the same.
#[derive(Clone, Debug)]
pub struct Subgraph(pub Arc<Graph>);

impl PartialEq for Subgraph {
    fn eq(&self, other: &Subgraph) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || crate::text::print(&self.0, crate::text::Weights::Full) == crate::text::print(&other.0, crate::text::Weights::Full)
    }
}

/// One operator with its attributes. Operands and results are described per variant; `?` marks
/// an optional operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input (no operands; its type is the node's output type).
    Input,
    /// A constant tensor (weights, shapes, scalars).
    Constant(Tensor),

    // ----- elementwise -----
    /// `(x) -> y`, elementwise.
    Unary(UnaryOp),
    /// `(a, b) -> y`, elementwise with numpy broadcasting.
    Binary(BinaryOp),
    /// `(x, min?, max?) -> y`; bounds are scalars.
    Clip,
    /// `(cond, x, y) -> z`, broadcasting all three.
    Where,
    /// `(x) -> y` converted to `to`.
    Cast { to: DType },

    // ----- contractions -----
    /// `(a, b) -> y`, numpy matmul (batched, 1-D operands promoted).
    MatMul,
    /// `(a, b, c?) -> alpha * a' b' + beta * c`.
    Gemm(Gemm),
    /// `(x...) -> y`, Einstein summation (`"ij,jk->ik"`).
    Einsum { equation: String },

    // ----- windows -----
    /// `(x, w, b?) -> y`, N-d convolution with groups.
    Conv(Conv),
    /// `(x, w, b?) -> y`, N-d transposed convolution with groups.
    ConvTranspose(ConvTranspose),
    /// `(x) -> (y, indices)`: MaxPool (indices only for Max), AveragePool, LpPool.
    Pool(Pool),
    /// `(x) -> y`: pooling over every spatial dimension, kept as size 1.
    GlobalPool(PoolKind),

    // ----- normalisations -----
    /// `(x) -> y`, along one axis.
    Softmax { axis: i64 },
    /// `(x) -> y`, `log(softmax(x))` along one axis.
    LogSoftmax { axis: i64 },
    /// `(x) -> y`, one-hot of the first maximum along one axis.
    Hardmax { axis: i64 },
    /// `(x, scale, bias?) -> (y, mean, inv_std_dev)`, normalising over axes `axis..rank`.
    LayerNorm { axis: i64, epsilon: f32 },
    /// `(x, scale, bias, mean, var) -> y`, inference form.
    BatchNorm { epsilon: f32 },
    /// `(x, scale, bias) -> y`, per sample and channel over the spatial axes.
    InstanceNorm { epsilon: f32 },
    /// `(x, scale, bias) -> y`, over channel groups; scale and bias are per channel.
    GroupNorm { num_groups: usize, epsilon: f32 },
    /// `(x, scale) -> y`, `x / sqrt(mean(x^2) + epsilon) * scale` over axes `axis..rank`.
    RmsNorm { axis: i64, epsilon: f32 },
    /// `(x) -> y`, local response normalisation across channels.
    Lrn(Lrn),
    /// `(x) -> y`, `x / ||x||_p` along one axis.
    LpNorm { axis: i64, p: u32 },
    /// `(x) -> y`, `(x - mean) / std` over `axes`.
    MeanVarianceNorm { axes: Vec<i64> },

    // ----- reductions and scans -----
    /// `(x, axes?) -> y`.
    Reduce(Reduce),
    /// `(x) -> indices (i64)`: ArgMax, ArgMin.
    ArgReduce(ArgReduce),
    /// `(x, axis) -> y`: CumSum, CumProd.
    Cumulative(Cumulative),
    /// `(x, k) -> (values, indices)`.
    TopK { axis: i64, largest: bool, sorted: bool },

    // ----- data movement -----
    /// `(x, shape) -> y`; `0` copies a dimension unless `allowzero`, `-1` is inferred.
    Reshape { allowzero: bool },
    /// `(x) -> y`, 2-D: dims before `axis` times dims from `axis`.
    Flatten { axis: i64 },
    /// `(x) -> y`, dimensions permuted.
    Transpose { perm: Vec<usize> },
    /// `(x, axes?) -> y`; without axes every size-1 dimension goes.
    Squeeze,
    /// `(x, axes) -> y`.
    Unsqueeze,
    /// `(x...) -> y`.
    Concat { axis: i64 },
    /// `(x, split?) -> y...` into `num_outputs` parts (equal unless `split` gives sizes).
    Split { axis: i64, num_outputs: usize },
    /// `(x, starts, ends, axes?, steps?) -> y`.
    Slice,
    /// `(x, indices) -> y`, taking along `axis`.
    Gather { axis: i64 },
    /// `(x, indices) -> y`, `y[i][j] = x[indices[i][j]][j]` along `axis`.
    GatherElements { axis: i64 },
    /// `(x, indices) -> y`, indexing the leading dimensions by index tuples.
    GatherNd { batch_dims: usize },
    /// `(x, indices, updates) -> y` along `axis`.
    ScatterElements { axis: i64, reduction: ScatterReduction },
    /// `(x, indices, updates) -> y` at index tuples.
    ScatterNd { reduction: ScatterReduction },
    /// `(x, shape) -> y`, broadcast to `shape`.
    Expand,
    /// `(x, repeats) -> y`.
    Tile,
    /// `(x, pads, value?, axes?) -> y`.
    Pad { mode: PadMode },
    /// `(x) -> i64[n]`, the dimensions `start..end`.
    Shape { start: i64, end: Option<i64> },
    /// `(x) -> i64[]`, the element count.
    Size,
    /// `(shape) -> y` filled with `value` (a one-element tensor that also gives the type).
    ConstantOfShape { value: Tensor },
    /// `(start, limit, delta) -> y`.
    Range,
    /// `(indices, depth, values) -> y`, a new axis `axis` of size `depth`.
    OneHot { axis: i64 },
    /// `(x, k?) -> y`, the upper or lower triangle of the last two axes.
    Trilu { upper: bool },
    /// `(x) -> y` of x's shape (2-D): ones on diagonal `k`, of type `dtype` (x's if `None`).
    EyeLike { dtype: Option<DType>, k: i64 },
    /// `(x) -> y`, channels to space in blocks (`crd`: column-row-depth order, else depth-column-row).
    DepthToSpace { blocksize: usize, crd: bool },
    /// `(x) -> y`, space to channels in blocks.
    SpaceToDepth { blocksize: usize },
    /// `(x, roi?, scales?, sizes?) -> y`.
    Resize(Resize),
    /// `(x) -> i64[rank, n]`, the indices of the non-zero elements.
    NonZero,
    /// `(x, condition) -> y`, the slices where `condition` holds (flattened without `axis`).
    Compress { axis: Option<i64> },
    /// `(x, sequence_lens) -> y`, each batch entry's first `len` steps reversed.
    ReverseSequence { batch_axis: usize, time_axis: usize },
    /// `(x) -> x`.
    Identity,

    // ----- sequence models -----
    /// `(x, w, r, b?, sequence_lens?, initial_h?, initial_c?, p?) -> (y, y_h, y_c)`: RNN, GRU, LSTM.
    Rnn(Rnn),
    /// `(q, k, v, attn_mask?, past_key?, past_value?) -> (y, present_key, present_value, qk)`.
    Attention(Attention),
    /// `(x, cos_cache, sin_cache, position_ids?) -> y`.
    RotaryEmbedding(RotaryEmbedding),

    // ----- losses -----
    /// `(input, target, weight?) -> loss`.
    NllLoss(Loss),
    /// `(scores, labels, weights?) -> (loss, log_prob)`.
    SoftmaxCrossEntropyLoss(Loss),

    // ----- control flow -----
    /// `(cond, captured...) -> results`: runs one branch. Each branch takes the captured values
    /// as its inputs, in order, and has one output per result.
    If { then_branch: Subgraph, else_branch: Subgraph },
    /// `(captured..., state..., scanned...) -> (state..., stacked...)`: runs the body once per
    /// position along the scanned inputs' axes, carrying the state from one step to the next.
    Scan(Box<Scan>),
    /// `(captured..., trip count?, cond?, state...) -> (state..., stacked...)`: runs the body
    /// while the step is below the trip count and the condition holds, carrying the state.
    Loop(Box<Loop>),

    // ----- quantization -----
    /// `(x, scale, zero_point?) -> y`, ONNX QuantizeLinear: round-half-even(x / scale) +
    /// zero_point, saturated to the result type (the zero point's, else `dtype`, else u8). The
    /// scale is one value, one per position along `axis` (1-D), or (`block_size` > 0, the rank of
    /// `x`) one per block of `block_size` positions along `axis`; the zero point is shaped alike.
    Quantize { axis: i64, block_size: usize, dtype: Option<DType> },
    /// `(x, scale, zero_point?) -> y`, ONNX DequantizeLinear: (x - zero_point) * scale, in the
    /// scale's type; the scale as Quantize's.
    Dequantize { axis: i64, block_size: usize },

    // ----- sequences and optionals -----
    /// The ONNX sequence ops (`SequenceAt`, `SplitToSequence`...).
    Sequence(SequenceOp),
    /// The ONNX optional ops.
    Optional(OptionalOp),
}

/// `Loop`: the body takes the captured values, the step number (one i64), the condition (one
/// bool) and the state, in that order, and gives the next condition, the next state and one
/// slice of each stacked result (stacked along a new leading axis, one slice per step).
#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    pub body: Subgraph,
    /// Leading operands the body reads from outside (values ONNX lets a body name implicitly).
    pub captures: usize,
}

impl Loop {
    /// How many state values a node with `operands` operands carries (after the captured values,
    /// the trip count and the condition).
    pub fn states(&self, operands: usize) -> usize {
        operands.saturating_sub(self.captures + 2)
    }

    /// Whether the body's condition result is true whenever its condition input is: the input
    /// passed on (through Identities) or a constant true. Such a loop runs exactly its trip count
    /// when it starts.
    pub fn condition_stays_true(&self) -> bool {
        let body = &self.body.0;
        let Some(&(_, mut v)) = body.outputs().first() else { return false };
        let Some(&cond_in) = body.inputs().get(self.captures + 1) else { return false };
        loop {
            if v.node == cond_in {
                return true;
            }
            if let Some(t) = body.constant_value(v) {
                return t.to_f64s().first().is_some_and(|&x| x != 0.0);
            }
            match (&body.node(v.node).op, body.operands(v.node).first()) {
                (Op::Identity, Some(Some(next))) => v = *next,
                _ => return false,
            }
        }
    }
}

/// `Scan` (ONNX opset 9 and later): the body takes the captured values, the state and one slice
/// of each scanned input (its axis removed), in that order, and gives the next state and one
/// slice of each stacked result.
#[derive(Clone, Debug, PartialEq)]
pub struct Scan {
    pub body: Subgraph,
    /// Leading operands the body reads from outside (values ONNX lets a body name implicitly).
    pub captures: usize,
    /// Trailing operands that are scanned; the operands between are the initial state.
    pub scan_inputs: usize,
    /// Per scanned input: its axis, and whether it is read from the last position (empty: axis
    /// 0, forward, for each).
    pub input_axes: Vec<i64>,
    pub input_reverse: Vec<bool>,
    /// Per stacked result: the axis its slices are stacked along, and whether the last step's
    /// slice comes first (empty: axis 0, forward, for each).
    pub output_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
}

impl Scan {
    /// How many state values a node with `operands` operands carries.
    pub fn states(&self, operands: usize) -> usize {
        operands.saturating_sub(self.captures + self.scan_inputs)
    }

    /// Scanned input `i`'s axis (not normalised) and whether it is read backwards.
    pub fn input(&self, i: usize) -> (i64, bool) {
        (self.input_axes.get(i).copied().unwrap_or(0), self.input_reverse.get(i).copied().unwrap_or(false))
    }

    /// Stacked result `k`'s axis (not normalised) and whether it is stacked backwards.
    pub fn output(&self, k: usize) -> (i64, bool) {
        (self.output_axes.get(k).copied().unwrap_or(0), self.output_reverse.get(k).copied().unwrap_or(false))
    }

    /// Whether the lists name one entry per scanned input and per stacked result (or none).
    pub fn lists_fit(&self, stacked: usize) -> bool {
        let fits = |n: usize, want: usize| n == 0 || n == want;
        fits(self.input_axes.len(), self.scan_inputs)
            && fits(self.input_reverse.len(), self.scan_inputs)
            && fits(self.output_axes.len(), stacked)
            && fits(self.output_reverse.len(), stacked)
    }
}

/// `Gemm` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

impl Default for Gemm {
    fn default() -> Gemm {
        Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false }
    }
}

/// `Conv` attributes (the kernel shape is the weight's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    pub window: Window,
    pub group: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    /// `count_include_pad`: padded cells count in the divisor.
    Average {
        count_include_pad: bool,
    },
    /// The p-norm of the window.
    Lp {
        p: u32,
    },
}

/// `MaxPool` / `AveragePool` / `LpPool` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub kind: PoolKind,
    pub kernel: Vec<usize>,
    pub window: Window,
    pub ceil_mode: bool,
    /// MaxPool's indices count in column-major order (ONNX `storage_order = 1`).
    pub column_major_indices: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 10] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
        ReduceKind::SumSquare,
    ];

    /// The ONNX op name (`ReduceSum`...).
    pub fn op_name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }
}

/// `Reduce*` attributes; the axes are an operand.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduce {
    pub kind: ReduceKind,
    pub keepdims: bool,
    /// With no axes: reduce nothing (true) or everything (false, the default).
    pub noop_with_empty_axes: bool,
}

impl Op {
    /// The ONNX operator name, which is also the name in kiln's text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Constant(_) => "Constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Clip => "Clip",
            Op::Where => "Where",
            Op::Cast { .. } => "Cast",
            Op::MatMul => "MatMul",
            Op::Gemm(_) => "Gemm",
            Op::Einsum { .. } => "Einsum",
            Op::Conv(_) => "Conv",
            Op::ConvTranspose(_) => "ConvTranspose",
            Op::Pool(p) => match p.kind {
                PoolKind::Max => "MaxPool",
                PoolKind::Average { .. } => "AveragePool",
                PoolKind::Lp { .. } => "LpPool",
            },
            Op::GlobalPool(k) => match k {
                PoolKind::Max => "GlobalMaxPool",
                PoolKind::Average { .. } => "GlobalAveragePool",
                PoolKind::Lp { .. } => "GlobalLpPool",
            },
            Op::Softmax { .. } => "Softmax",
            Op::LogSoftmax { .. } => "LogSoftmax",
            Op::Hardmax { .. } => "Hardmax",
            Op::LayerNorm { .. } => "LayerNormalization",
            Op::BatchNorm { .. } => "BatchNormalization",
            Op::InstanceNorm { .. } => "InstanceNormalization",
            Op::GroupNorm { .. } => "GroupNormalization",
            Op::RmsNorm { .. } => "RMSNormalization",
            Op::Lrn(_) => "LRN",
            Op::LpNorm { .. } => "LpNormalization",
            Op::MeanVarianceNorm { .. } => "MeanVarianceNormalization",
            Op::Reduce(r) => r.kind.op_name(),
            Op::ArgReduce(a) => {
                if a.max {
                    "ArgMax"
                } else {
                    "ArgMin"
                }
            }
            Op::Cumulative(c) => {
                if c.prod {
                    "CumProd"
                } else {
                    "CumSum"
                }
            }
            Op::TopK { .. } => "TopK",
            Op::Reshape { .. } => "Reshape",
            Op::Flatten { .. } => "Flatten",
            Op::Transpose { .. } => "Transpose",
            Op::Squeeze => "Squeeze",
            Op::Unsqueeze => "Unsqueeze",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice => "Slice",
            Op::Gather { .. } => "Gather",
            Op::GatherElements { .. } => "GatherElements",
            Op::GatherNd { .. } => "GatherND",
            Op::ScatterElements { .. } => "ScatterElements",
            Op::ScatterNd { .. } => "ScatterND",
            Op::Expand => "Expand",
            Op::Tile => "Tile",
            Op::Pad { .. } => "Pad",
            Op::Shape { .. } => "Shape",
            Op::Size => "Size",
            Op::ConstantOfShape { .. } => "ConstantOfShape",
            Op::Range => "Range",
            Op::OneHot { .. } => "OneHot",
            Op::Trilu { .. } => "Trilu",
            Op::EyeLike { .. } => "EyeLike",
            Op::DepthToSpace { .. } => "DepthToSpace",
            Op::SpaceToDepth { .. } => "SpaceToDepth",
            Op::Resize(_) => "Resize",
            Op::NonZero => "NonZero",
            Op::Compress { .. } => "Compress",
            Op::ReverseSequence { .. } => "ReverseSequence",
            Op::Identity => "Identity",
            Op::Rnn(r) => match r.cell {
                RnnCell::Simple => "RNN",
                RnnCell::Gru { .. } => "GRU",
                RnnCell::Lstm { .. } => "LSTM",
            },
            Op::Attention(_) => "Attention",
            Op::RotaryEmbedding(_) => "RotaryEmbedding",
            Op::NllLoss(_) => "NegativeLogLikelihoodLoss",
            Op::SoftmaxCrossEntropyLoss(_) => "SoftmaxCrossEntropyLoss",
            Op::If { .. } => "If",
            Op::Scan(_) => "Scan",
            Op::Loop(_) => "Loop",
            Op::Quantize { .. } => "QuantizeLinear",
            Op::Dequantize { .. } => "DequantizeLinear",
            Op::Sequence(s) => s.name(),
            Op::Optional(o) => o.name(),
        }
    }

    /// How many operands the op takes: (required, maximum). `usize::MAX` means variadic.
    pub fn arity(&self) -> (usize, usize) {
        const ANY: usize = usize::MAX;
        match self {
            Op::Input | Op::Constant(_) => (0, 0),
            Op::Unary(_) | Op::Cast { .. } | Op::Pool(_) | Op::GlobalPool(_) | Op::Identity => (1, 1),
            Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::Hardmax { .. } => (1, 1),
            Op::Lrn(_) | Op::LpNorm { .. } | Op::MeanVarianceNorm { .. } | Op::ArgReduce(_) => (1, 1),
            Op::Flatten { .. } | Op::Transpose { .. } | Op::Shape { .. } | Op::Size => (1, 1),
            Op::ConstantOfShape { .. } | Op::EyeLike { .. } | Op::NonZero => (1, 1),
            Op::DepthToSpace { .. } | Op::SpaceToDepth { .. } => (1, 1),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::Expand | Op::Unsqueeze | Op::Reshape { .. } => (2, 2),
            Op::GatherElements { .. } | Op::GatherNd { .. } | Op::Tile | Op::Cumulative(_) | Op::TopK { .. } => (2, 2),
            Op::RmsNorm { .. } | Op::Compress { .. } | Op::ReverseSequence { .. } => (2, 2),
            Op::Clip => (1, 3),
            Op::Where | Op::Range | Op::OneHot { .. } => (3, 3),
            Op::ScatterElements { .. } | Op::ScatterNd { .. } | Op::InstanceNorm { .. } | Op::GroupNorm { .. } => (3, 3),
            Op::Gemm(_) | Op::Conv(_) | Op::ConvTranspose(_) | Op::LayerNorm { .. } => (2, 3),
            Op::NllLoss(_) | Op::SoftmaxCrossEntropyLoss(_) => (2, 3),
            Op::BatchNorm { .. } => (5, 5),
            Op::Reduce(_) | Op::Squeeze | Op::Split { .. } | Op::Trilu { .. } => (1, 2),
            Op::Pad { .. } => (2, 4),
            Op::Resize(_) => (1, 4),
            Op::Slice => (3, 5),
            Op::Rnn(r) => (3, if matches!(r.cell, RnnCell::Lstm { .. }) { 8 } else { 6 }),
            Op::Attention(_) => (3, 7),
            Op::RotaryEmbedding(_) => (3, 4),
            Op::Concat { .. } | Op::Einsum { .. } => (1, ANY),
            Op::If { .. } | Op::Scan(_) => (1, ANY),
            // The trip count and the condition are positional, either may be absent.
            Op::Loop(_) => (0, ANY),
            Op::Quantize { .. } | Op::Dequantize { .. } => (2, 3),
            Op::Sequence(s) => match s {
                SequenceOp::Empty { .. } => (0, 0),
                SequenceOp::Construct | SequenceOp::Map { .. } => (1, ANY),
                SequenceOp::Insert => (2, 3),
                SequenceOp::Erase | SequenceOp::Split { .. } => (1, 2),
                SequenceOp::At => (2, 2),
                SequenceOp::Length | SequenceOp::Concat { .. } => (1, 1),
            },
            Op::Optional(o) => match o {
                OptionalOp::Wrap { .. } | OptionalOp::HasElement => (0, 1),
                OptionalOp::GetElement => (1, 1),
            },
        }
    }

    /// How many results a node of this op has when its user asks for nothing else (ops with
    /// optional extra results, such as LayerNormalization's statistics, keep only the first).
    pub fn default_num_outputs(&self) -> usize {
        match self {
            Op::Split { num_outputs, .. } => *num_outputs,
            Op::TopK { .. } => 2,
            Op::Rnn(_) => 2,
            Op::If { then_branch, .. } => then_branch.0.outputs().len(),
            Op::Scan(s) => s.body.0.outputs().len(),
            // Everything the body gives but its condition.
            Op::Loop(l) => l.body.0.outputs().len().saturating_sub(1),
            Op::Sequence(SequenceOp::Map { body, .. }) => body.0.outputs().len(),
            _ => 1,
        }
    }

    /// Pure elementwise ops (one output element from the same-index elements of the operands).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Clip | Op::Where | Op::Cast { .. } | Op::Identity)
    }
}
