//! Operators: a closed enum with typed attributes and ONNX semantics.
//!
//! Operands that ONNX passes as inputs in its newest opsets (Reshape's shape, Clip's bounds, the
//! axes of Reduce*/Squeeze/Unsqueeze, Slice's starts/ends...) are operands here too, so one op has
//! one meaning; an importer of an older opset turns the attribute into a constant operand.
//! Elementwise ops are grouped into [`UnaryOp`] and [`BinaryOp`] because fusion and codegen treat
//! them as one family.

pub(crate) mod attr;
mod elementwise;
mod window;

pub use attr::{Attr, Attrs};
pub use elementwise::{BinaryOp, TypeClass, UnaryOp};
pub use window::{AutoPad, SpatialAxis, Window};

use crate::{DType, Tensor};

/// One operator with its attributes. Operands and results are described per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input (no operands; its type is the node's output type).
    Input,
    /// A constant tensor (weights, shapes, scalars).
    Constant(Tensor),
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
    /// `(a, b) -> y`, numpy matmul (batched, 1-D operands promoted).
    MatMul,
    /// `(a, b, c?) -> alpha * a' b' + beta * c`.
    Gemm(Gemm),
    /// `(x, w, b?) -> y`, N-d convolution with groups.
    Conv(Conv),
    /// `(x) -> y`: MaxPool, AveragePool.
    Pool(Pool),
    /// `(x) -> y`: pooling over every spatial dimension, kept as size 1.
    GlobalPool(PoolKind),
    /// `(x) -> y`, along one axis.
    Softmax { axis: i64 },
    /// `(x, scale, bias?) -> (y, mean, inv_std_dev)`, normalising over axes `axis..rank`.
    LayerNorm { axis: i64, epsilon: f32 },
    /// `(x, scale, bias, mean, var) -> y`, inference form.
    BatchNorm { epsilon: f32 },
    /// `(x, axes?) -> y`.
    Reduce(Reduce),
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
    /// `(x, shape) -> y`, broadcast to `shape`.
    Expand,
    /// `(x) -> x`.
    Identity,
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

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolKind {
    Max,
    /// `count_include_pad`: padded cells count in the divisor.
    Average { count_include_pad: bool },
}

/// `MaxPool` / `AveragePool` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub kind: PoolKind,
    pub kernel: Vec<usize>,
    pub window: Window,
    pub ceil_mode: bool,
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
            Op::Conv(_) => "Conv",
            Op::Pool(p) => match p.kind {
                PoolKind::Max => "MaxPool",
                PoolKind::Average { .. } => "AveragePool",
            },
            Op::GlobalPool(k) => match k {
                PoolKind::Max => "GlobalMaxPool",
                PoolKind::Average { .. } => "GlobalAveragePool",
            },
            Op::Softmax { .. } => "Softmax",
            Op::LayerNorm { .. } => "LayerNormalization",
            Op::BatchNorm { .. } => "BatchNormalization",
            Op::Reduce(r) => r.kind.op_name(),
            Op::Reshape { .. } => "Reshape",
            Op::Flatten { .. } => "Flatten",
            Op::Transpose { .. } => "Transpose",
            Op::Squeeze => "Squeeze",
            Op::Unsqueeze => "Unsqueeze",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice => "Slice",
            Op::Gather { .. } => "Gather",
            Op::Expand => "Expand",
            Op::Identity => "Identity",
        }
    }

    /// How many operands the op takes: (required, maximum). `usize::MAX` means variadic.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input | Op::Constant(_) => (0, 0),
            Op::Unary(_) | Op::Cast { .. } | Op::Pool(_) | Op::GlobalPool(_) | Op::Softmax { .. } => (1, 1),
            Op::Flatten { .. } | Op::Transpose { .. } | Op::Identity => (1, 1),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::Expand | Op::Unsqueeze => (2, 2),
            Op::Reshape { .. } => (2, 2),
            Op::Clip => (1, 3),
            Op::Where => (3, 3),
            Op::Gemm(_) | Op::Conv(_) | Op::LayerNorm { .. } => (2, 3),
            Op::BatchNorm { .. } => (5, 5),
            Op::Reduce(_) | Op::Squeeze | Op::Split { .. } => (1, 2),
            Op::Concat { .. } => (1, usize::MAX),
            Op::Slice => (3, 5),
        }
    }

    /// How many results a node of this op has when its user asks for nothing else.
    pub fn default_num_outputs(&self) -> usize {
        match self {
            Op::Split { num_outputs, .. } => *num_outputs,
            _ => 1,
        }
    }

    /// Pure elementwise ops (one output element from the same-index elements of the operands).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Clip | Op::Where | Op::Cast { .. } | Op::Identity)
    }
}
