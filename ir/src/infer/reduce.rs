//! Reductions.

use super::{not_yet, Ctx, Infer, Operands};
use crate::Op;
use crate::op::{Reduce, ReduceKind};
use crate::{Dim, Shape, TensorType};

/// The axes a reduction reduces, normalised and sorted; `None` when they are known only at run time.
pub(crate) fn reduced_axes(noop_with_empty_axes: bool, axes: Option<Option<Vec<i64>>>, x: &TensorType) -> Result<Option<Vec<usize>>, String> {
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
            return Err(format!("axis {a} is listed twice"));
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
        return Err(format!("needs a numeric type, got {x}"));
    }
    let axes = reduced_axes(r.noop_with_empty_axes, ops.ints(1, "axes")?, x)?;
    let shape = match axes {
        Some(axes) => Shape(
            x.shape.0.iter().enumerate().filter_map(|(i, d)| match (axes.contains(&i), r.keepdims) {
                (false, _) => Some(d.clone()),
                (true, true) => Some(Dim::Fixed(1)),
                (true, false) => None,
            }).collect(),
        ),
        None if r.keepdims => ctx.fresh_shape(x.rank()),
        // Without keepdims the rank still follows from how many axes there are.
        None => match ops.get(1)?.ty.shape.dims() {
            [Dim::Fixed(k)] if *k > 0 && *k <= x.rank() => ctx.fresh_shape(x.rank() - k),
            _ => return Err(format!("axes {} known only at run time need keepdims = 1 or a known count", ops.get(1)?.ty)),
        },
    };
    Ok(vec![TensorType::new(x.dtype, shape)])
}

/// ArgMax/ArgMin, CumSum/CumProd, TopK.
pub(super) fn infer(op: &Op, _ops: &Operands, _ctx: &Ctx) -> Infer {
    not_yet(op)
}
