//! Control flow: If.

use super::{Ctx, Infer, Operands};
use crate::{DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    let Op::If { then_branch, else_branch } = op else { unreachable!("dispatched by infer()") };
    let (t, e) = (&then_branch.0, &else_branch.0);
    let cond = ops.get(0)?.ty;
    if cond.dtype != DType::Bool || cond.shape.numel() != Some(1) {
        return Err(format!("the condition must be one bool, got {cond}"));
    }
    let captures = ops.len() - 1;
    for (g, which) in [(t, "then"), (e, "else")] {
        if g.inputs().len() != captures {
            return Err(format!("the {which} branch takes {} values, {captures} are passed", g.inputs().len()));
        }
        for (i, &id) in g.inputs().iter().enumerate() {
            let want = &g.node(id).outputs[0];
            let have = ops.get(i + 1)?.ty;
            if want.dtype != have.dtype || want.rank() != have.rank() {
                return Err(format!("the {which} branch reads value {i} as {want}, it is {have}"));
            }
        }
    }
    // The branches as the operands' types specialise them (the sizes a caller bound reach the
    // branches' results).
    let specialised = |g: &crate::Graph| -> Result<Option<crate::Graph>, String> {
        let types: Vec<TensorType> = (0..captures).map(|i| ops.get(i + 1).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
        if g.inputs().iter().zip(&types).all(|(&id, ty)| &g.node(id).outputs[0] == ty) {
            return Ok(None);
        }
        let mut s = g.clone();
        for (i, ty) in types.into_iter().enumerate() {
            s.set_input_type(i, ty).map_err(|e| format!("in branch `{}`: {e}", g.name))?;
        }
        Ok(Some(s))
    };
    let (ts, es) = (specialised(t)?, specialised(e)?);
    let (t, e) = (ts.as_ref().unwrap_or(t), es.as_ref().unwrap_or(e));
    if t.outputs().len() != e.outputs().len() {
        return Err(format!("the branches have {} and {} results", t.outputs().len(), e.outputs().len()));
    }
    // Each result: the branches' types merged (a size they disagree on is known at run time only).
    t.outputs()
        .iter()
        .zip(e.outputs())
        .enumerate()
        .map(|(i, ((_, a), (_, b)))| {
            let (a, b) = (t.value_type(*a), e.value_type(*b));
            if a.dtype != b.dtype || a.rank() != b.rank() {
                return Err(format!("result {i} is {a} in one branch and {b} in the other"));
            }
            let dims =
                a.shape.dims().iter().zip(b.shape.dims()).enumerate().map(|(d, (x, y))| if x == y { x.clone() } else { fresh(ctx, i, d) }).collect();
            Ok(TensorType::new(a.dtype, Shape(dims)))
        })
        .collect()
}

fn fresh(ctx: &Ctx, result: usize, dim: usize) -> Dim {
    match ctx.fresh(dim) {
        Dim::Sym(s) if result > 0 => Dim::sym(&format!("{s}.r{result}")),
        d => d,
    }
}
