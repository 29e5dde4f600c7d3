//! Shape and type inference, one op family a file (`Op::family` names it; each file's `infer`
//! takes its family's ops). Each rule takes the operands' types (and their values when they are
//! constants: Reshape's shape, the axes of a reduction...) and returns the types of every result,
//! or a message that names the offending shapes; the graph wraps it with the node and op.

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
mod signal;
mod strings;
mod window;

pub use contraction::EinsumSpec;
pub(crate) use generate::{range_count, shape_interval, window_size, Scalar};
pub use indexing::{center_crop_pad_amounts, pad_amounts};
pub use movement::{equal_split, slice_axis};
pub(crate) use reduce::reduced_axes;
pub(crate) use resize::{resize_plan, ResizePlan};
pub use resize::{roi_axis_taps, roi_box, RoiBox, GRID_MAX_SPATIAL, ROI_MAX_GRID};
pub use signal::{dft_axis, mel_weight_matrix, DftPlan, StftPlan, DFT_MAX_LENGTH};
pub use window::{transpose_axis, Col2ImPlan, DeformPlan, TransposeAxis};

use crate::error::{invalid, OpError};
use crate::op::OpFamily;
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
    let takes_any = matches!(op, Op::Identity)
        || matches!(op.family(), OpFamily::Control | OpFamily::Collection);
    if !takes_any {
        if let Some((i, o)) = operands
            .iter()
            .enumerate()
            .find_map(|(i, o)| o.filter(|o| !o.ty.kind.is_tensor()).map(|o| (i, o)))
        {
            return Err(invalid!("operand {i} is {}, {} takes tensors", o.ty, op.name()));
        }
    }
    match op.family() {
        OpFamily::Source => Err("Input and Constant nodes carry their own types".into()),
        OpFamily::Elementwise => elementwise::infer(op, &ops),
        OpFamily::Contraction => contraction::infer(op, &ops, &ctx),
        OpFamily::Window => window::infer(op, &ops, &ctx),
        OpFamily::Normalize => normalize::infer(op, &ops),
        OpFamily::Reduce => reduce::infer(op, &ops, &ctx),
        OpFamily::Movement => movement::infer(op, &ops, &ctx),
        OpFamily::Indexing => indexing::infer(op, &ops, &ctx),
        OpFamily::Generate => generate::infer(op, &ops, &ctx),
        OpFamily::Resize => resize::infer(op, &ops, &ctx),
        OpFamily::Signal => signal::infer(op, &ops, &ctx),
        OpFamily::Sequence => sequence::infer(op, &ops, &ctx),
        OpFamily::Loss => loss::infer(op, &ops, &ctx),
        OpFamily::Control => control::infer(op, &ops, &ctx),
        OpFamily::Quantize => quantize::infer(op, &ops),
        OpFamily::Collection => collection::infer(op, &ops, &ctx),
        OpFamily::Strings => strings::infer(op, &ops, &ctx),
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
