//! Shape and type inference, one op family a file. Each rule takes the operands' types (and their
//! values when they are constants: Reshape's shape, the axes of a reduction...) and returns the
//! types of every result, or a message that names the offending shapes; the graph wraps it with the
//! node and op.

mod collection;
mod contraction;
mod control;
mod elementwise;
mod generate;
mod indexing;
mod loss;
mod movement;
mod normalize;
mod quantize;
mod reduce;
mod resize;
mod sequence;
mod window;

pub use contraction::EinsumSpec;
pub(crate) use generate::{range_count, shape_interval, Scalar};
pub use indexing::pad_amounts;
pub use movement::{equal_split, slice_axis};
pub(crate) use reduce::reduced_axes;
pub(crate) use resize::{resize_plan, ResizePlan};
pub use window::{transpose_axis, TransposeAxis};

use crate::error::{invalid, OpError};
use crate::{Dim, Op, Shape, Tensor, TensorType};

/// What inference knows about one operand.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub ty: &'a TensorType,
    /// The value, when it is a constant.
    pub value: Option<&'a Tensor>,
}

/// Context for one node's inference: how to name sizes that cannot be known before run time.
pub(crate) struct Ctx<'a> {
    node: &'a str,
}

impl Ctx<'_> {
    /// A symbol for result dimension `i` whose size depends on run-time values.
    pub(crate) fn fresh(&self, i: usize) -> Dim {
        Dim::sym(&format!("{}.d{i}", self.node))
    }

    /// A shape of `rank` fresh symbols.
    /// A shape of `rank` unknown dims. The rank may come from a value's length (a Reshape's
    /// shape operand, Unsqueeze's axes) that only its type bounds: an operand of 2^31 entries
    /// asked for 32 GiB of dims, so ranks past [`MAX_RANK`] are refused.
    pub(crate) fn fresh_shape(&self, rank: usize) -> Result<Shape, OpError> {
        if rank > MAX_RANK {
            return Err(OpError::TooManyAxes { rank });
        }
        Ok(Shape((0..rank).map(|i| self.fresh(i)).collect()))
    }
}

pub(crate) type Infer = Result<Vec<TensorType>, OpError>;

/// The most axes a result may have when its rank comes from a value's length (no model has
/// more than a handful; numpy allows 64).
pub const MAX_RANK: usize = 1024;

/// The most results one node may have when an attribute, not its names, says how many (Split's
/// `num_outputs`).
pub const MAX_RESULTS: usize = 1 << 16;

/// What an op without its rules yet reports.
pub(crate) fn not_yet(op: &Op) -> Infer {
    Err(OpError::NotYet { op: op.name() })
}

/// The types of every result of `op` applied to `operands` (`None` = omitted optional operand).
/// `node` names the node, for the symbols of sizes known only at run time.
pub fn infer(
    op: &Op,
    operands: &[Option<Operand>],
    node: &str,
) -> Result<Vec<TensorType>, OpError> {
    let ctx = Ctx { node };
    let ops = Operands(operands);
    // Sequences and optionals reach only the ops that take them.
    let takes_any = matches!(
        op,
        Op::Identity
            | Op::If { .. }
            | Op::Scan(_)
            | Op::Loop(_)
            | Op::Sequence(_)
            | Op::Optional(_)
    );
    if !takes_any {
        if let Some((i, o)) = operands
            .iter()
            .enumerate()
            .find_map(|(i, o)| o.filter(|o| !o.ty.kind.is_tensor()).map(|o| (i, o)))
        {
            return Err(invalid!("operand {i} is {}, {} takes tensors", o.ty, op.name()));
        }
    }
    match op {
        Op::Input | Op::Constant(_) => Err("Input and Constant nodes carry their own types".into()),
        Op::Unary(u) => elementwise::unary(*u, &ops),
        Op::Binary(b) => elementwise::binary(*b, &ops),
        Op::Clip => elementwise::clip(&ops),
        Op::Where => elementwise::where_(&ops),
        Op::Cast { to, .. } => elementwise::cast(*to, &ops),
        Op::Identity => Ok(vec![ops.get(0)?.ty.clone()]),
        Op::MatMul => contraction::matmul(&ops),
        Op::Gemm(g) => contraction::gemm(g, &ops),
        Op::Conv(c) => window::conv(c, &ops, &ctx),
        Op::QConv(c) => window::qconv(c, &ops, &ctx),
        Op::Pool(p) => window::pool(p, &ops, &ctx),
        Op::GlobalPool(k) => window::global_pool(*k, &ops),
        Op::Softmax { axis } => normalize::softmax(*axis, &ops),
        Op::LayerNorm { axis, .. } => normalize::layer_norm(*axis, &ops),
        Op::BatchNorm { .. } => normalize::batch_norm(&ops),
        Op::Reduce(r) => reduce::reduce(r, &ops, &ctx),
        Op::Reshape { allowzero } => movement::reshape(*allowzero, &ops, &ctx),
        Op::Flatten { axis } => movement::flatten(*axis, &ops, &ctx),
        Op::Transpose { perm } => movement::transpose(perm, &ops),
        Op::Squeeze => movement::squeeze(&ops, &ctx),
        Op::Unsqueeze => movement::unsqueeze(&ops, &ctx),
        Op::Concat { axis } => movement::concat(*axis, &ops, &ctx),
        Op::Split { axis, num_outputs } => movement::split(*axis, *num_outputs, &ops, &ctx),
        Op::Slice => movement::slice(&ops, &ctx),
        Op::Gather { axis } => movement::gather(*axis, &ops),
        Op::Expand => movement::expand(&ops, &ctx),
        Op::Einsum { equation } => contraction::einsum(equation, &ops, &ctx),
        Op::ConvTranspose(c) => window::conv_transpose(c, &ops, &ctx),
        Op::LogSoftmax { axis } | Op::Hardmax { axis } => normalize::softmax(*axis, &ops),
        Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Lrn(_)
        | Op::LpNorm { .. }
        | Op::MeanVarianceNorm { .. } => normalize::infer(op, &ops, &ctx),
        Op::ArgReduce(r) => reduce::arg_reduce(r, &ops),
        Op::Cumulative(_) => reduce::cumulative(&ops),
        Op::TopK { axis, .. } => reduce::top_k(*axis, &ops, &ctx),
        Op::Shape { start, end } => generate::shape(*start, *end, &ops),
        Op::Size => generate::size(&ops),
        Op::ConstantOfShape { value } => generate::constant_of_shape(value, &ops, &ctx),
        Op::Range => generate::range(&ops, &ctx),
        Op::EyeLike { dtype, .. } => generate::eye_like(*dtype, &ops),
        Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::ScatterElements { .. }
        | Op::ScatterNd { .. }
        | Op::Tile
        | Op::Pad { .. }
        | Op::OneHot { .. }
        | Op::Trilu { .. }
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. }
        | Op::NonZero
        | Op::Compress { .. }
        | Op::ReverseSequence { .. } => indexing::infer(op, &ops, &ctx),
        Op::Resize(r) => resize::infer(r, &ops, &ctx),
        Op::Rnn(_) | Op::Attention(_) | Op::RotaryEmbedding(_) => sequence::infer(op, &ops, &ctx),
        Op::NllLoss(_) | Op::SoftmaxCrossEntropyLoss(_) => loss::infer(op, &ops, &ctx),
        Op::If { then_branch, else_branch } => {
            control::if_(&then_branch.0, &else_branch.0, &ops, &ctx)
        }
        Op::Scan(s) => control::scan(s, &ops),
        Op::Loop(l) => control::loop_(l, &ops, &ctx),
        Op::Quantize { axis, block_size, dtype, .. } => {
            quantize::quantize(*axis, *block_size, *dtype, &ops)
        }
        Op::Dequantize { axis, block_size } => quantize::dequantize(*axis, *block_size, &ops),
        Op::Sequence(s) => collection::sequence(s, &ops, &ctx),
        Op::Optional(o) => collection::optional(o, &ops),
    }
}

/// The operand list with checked accessors.
pub(crate) struct Operands<'o, 'a>(&'o [Option<Operand<'a>>]);

impl<'a> Operands<'_, 'a> {
    pub(crate) fn get(&self, i: usize) -> Result<Operand<'a>, OpError> {
        self.opt(i).ok_or(OpError::MissingOperand { index: i })
    }

    pub(crate) fn opt(&self, i: usize) -> Option<Operand<'a>> {
        self.0.get(i).copied().flatten()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// A constant integer vector operand: `Ok(None)` if absent, `Err` if not 1-D integer,
    /// `Ok(Some(None))` if present but only known at run time.
    pub(crate) fn ints(&self, i: usize, what: &str) -> Result<Option<Option<Vec<i64>>>, OpError> {
        let Some(o) = self.opt(i) else { return Ok(None) };
        if !o.ty.dtype.is_int() {
            return Err(invalid!("{what} must be an integer tensor, got {}", o.ty));
        }
        if o.ty.rank() > 1 {
            return Err(invalid!("{what} must be 1-D, got {}", o.ty));
        }
        Ok(Some(o.value.map(|t| t.to_i64s())))
    }
}

/// A type check shared by many rules.
pub(crate) fn same_dtype(what: &str, a: &TensorType, b: &TensorType) -> Result<(), OpError> {
    if a.dtype != b.dtype {
        return Err(OpError::DTypeMismatch {
            what: what.into(),
            a: Box::new(a.clone()),
            b: Box::new(b.clone()),
        });
    }
    Ok(())
}

/// Normalises an axis or explains why it is out of range.
pub(crate) fn axis(axis: i64, ty: &TensorType) -> Result<usize, OpError> {
    ty.shape.axis(axis).ok_or_else(|| OpError::Axis { axis, ty: Box::new(ty.clone()) })
}

/// A product of dimensions kept symbolically: a fixed factor and the symbols (as a multiset).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DimProduct {
    pub fixed: usize,
    pub syms: Vec<Dim>,
}

impl DimProduct {
    pub(crate) fn of(dims: &[Dim]) -> DimProduct {
        let mut p = DimProduct { fixed: 1, syms: Vec::new() };
        for d in dims {
            match d {
                // Saturating: a product past usize is no size any tensor has, and the result
                // type it leads to is refused by the graph (`size::check_type`).
                Dim::Fixed(n) => p.fixed = p.fixed.saturating_mul(*n),
                s => p.syms.push(s.clone()),
            }
        }
        p
    }

    /// The product as one dimension, if it is a size or a single symbol.
    pub(crate) fn as_dim(&self) -> Option<Dim> {
        match (self.syms.len(), self.fixed) {
            (0, n) => Some(Dim::Fixed(n)),
            (1, 1) => Some(self.syms[0].clone()),
            _ => None,
        }
    }

    /// `self / other` when it is exact.
    pub(crate) fn div(&self, other: &DimProduct) -> Option<DimProduct> {
        let mut syms = self.syms.clone();
        for s in &other.syms {
            let i = syms.iter().position(|x| x == s)?;
            syms.remove(i);
        }
        if other.fixed == 0 || !self.fixed.is_multiple_of(other.fixed) {
            return None;
        }
        Some(DimProduct { fixed: self.fixed / other.fixed, syms })
    }
}
