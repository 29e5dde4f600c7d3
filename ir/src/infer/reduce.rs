//! Reductions.

use super::{not_yet, Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::op::{Reduce, ReduceKind};
use crate::{DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Reduce(r) => reduce(r, ops, ctx),
        Op::ArgReduce(r) => arg_reduce(r, ops),
        Op::Cumulative(_) => cumulative(ops),
        Op::TopK { axis, .. } => top_k(*axis, ops, ctx),
        Op::Det => det(ops),
        _ => not_yet(op),
    }
}

/// Det: the batch axes of a stack of square matrices, in x's float type.
fn det(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(invalid!("needs a float tensor, got {x}"));
    }
    let r = x.rank();
    if r < 2 {
        return Err(invalid!("needs matrices (at least 2-D), got {x}"));
    }
    let (m, n) = (&x.shape.0[r - 2], &x.shape.0[r - 1]);
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (m, n) {
        if a != b {
            return Err(invalid!("needs square matrices, got {x}"));
        }
    }
    Ok(vec![TensorType::new(x.dtype, Shape(x.shape.0[..r - 2].to_vec()))])
}

/// The axes a reduction reduces, normalised and sorted; `None` when they are known only at run time.
pub(crate) fn reduced_axes(
    noop_with_empty_axes: bool,
    axes: Option<Option<Vec<i64>>>,
    x: &TensorType,
) -> Result<Option<Vec<usize>>, OpError> {
    let axes = match axes {
        None => Vec::new(),
        Some(None) => return Ok(None),
        Some(Some(a)) => a,
    };
    if axes.is_empty() {
        return Ok(Some(if noop_with_empty_axes { Vec::new() } else { (0..x.rank()).collect() }));
    }
    let mut out = Vec::new();
    for a in axes {
        let n = super::axis(a, x)?;
        if out.contains(&n) {
            return Err(invalid!("axis {a} is listed twice"));
        }
        out.push(n);
    }
    out.sort();
    Ok(Some(out))
}

pub(super) fn reduce(r: &Reduce, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    // ReduceMax/ReduceMin also take bool (opset 20).
    let bool_ok = matches!(r.kind, ReduceKind::Max | ReduceKind::Min);
    if !x.dtype.is_numeric() && !bool_ok {
        return Err(OpError::NeedsType { class: "numeric", ty: Box::new(x.clone()) });
    }
    let axes = reduced_axes(r.noop_with_empty_axes, ops.ints(1, "axes")?, x)?;
    let shape = match axes {
        Some(axes) => Shape(
            x.shape
                .0
                .iter()
                .enumerate()
                .filter_map(|(i, d)| match (axes.contains(&i), r.keepdims) {
                    (false, _) => Some(d.clone()),
                    (true, true) => Some(Dim::Fixed(1)),
                    (true, false) => None,
                })
                .collect(),
        ),
        None if r.keepdims => ctx.fresh_shape(x.rank())?,
        // Without keepdims the rank still follows from how many axes there are.
        None => match ops.get(1)?.ty.shape.dims() {
            [Dim::Fixed(k)] if *k > 0 && *k <= x.rank() => ctx.fresh_shape(x.rank() - k)?,
            _ => {
                return Err(invalid!(
                    "axes {} known only at run time need keepdims = 1 or a known count",
                    ops.get(1)?.ty
                ))
            }
        },
    };
    Ok(vec![TensorType::new(x.dtype, shape)])
}

/// The operand the scanning reductions take: numeric.
fn numeric<'a>(ops: &Operands<'_, 'a>) -> Result<&'a TensorType, OpError> {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_numeric() {
        return Err(OpError::NeedsType { class: "numeric", ty: Box::new(x.clone()) });
    }
    Ok(x)
}

/// ArgMax/ArgMin.
pub(super) fn arg_reduce(r: &crate::op::ArgReduce, ops: &Operands) -> Infer {
    let x = numeric(ops)?;
    let a = super::axis(r.axis, x)?;
    let mut dims = x.shape.0.clone();
    if r.keepdims {
        dims[a] = Dim::Fixed(1);
    } else {
        dims.remove(a);
    }
    Ok(vec![TensorType::new(DType::I64, Shape(dims))])
}

/// CumSum/CumProd: the axis is checked when known; the result has x's type either way.
pub(super) fn cumulative(ops: &Operands) -> Infer {
    let x = numeric(ops)?;
    if let Some(a) = one_int(ops, 1, "axis")? {
        super::axis(a, x)?;
    }
    Ok(vec![x.clone()])
}

/// TopK: the values and their indices, `k` along the axis.
pub(super) fn top_k(axis: i64, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = numeric(ops)?;
    let a = super::axis(axis, x)?;
    let mut dims = x.shape.0.clone();
    dims[a] = match one_int(ops, 1, "k")? {
        Some(k) if k < 0 => return Err(invalid!("k {k} is negative")),
        Some(k) => match &x.shape.0[a] {
            Dim::Fixed(n) if k as u64 > *n as u64 => {
                return Err(invalid!("k {k} exceeds axis {a} of {x}"))
            }
            _ => Dim::Fixed(k as usize),
        },
        None => ctx.fresh(a),
    };
    let shape = Shape(dims);
    Ok(vec![TensorType::new(x.dtype, shape.clone()), TensorType::new(DType::I64, shape)])
}

/// A one-element integer operand (0-D, or 1-D of length 1): its value if it is a constant.
fn one_int(ops: &Operands, i: usize, what: &str) -> Result<Option<i64>, OpError> {
    let o = ops.get(i)?;
    let values = ops.ints(i, what)?.flatten();
    let one = match o.ty.shape.0.as_slice() {
        [] | [Dim::Fixed(1)] => true,
        [Dim::Sym(_)] => values.is_none(),
        _ => false,
    };
    if !one || values.as_ref().is_some_and(|v| v.len() != 1) {
        return Err(invalid!("{what} must hold one value, got {}", o.ty));
    }
    Ok(values.map(|v| v[0]))
}
