//! MatMul and Gemm.

use super::{same_dtype, Ctx, Infer, Operands};
use crate::{broadcast, Dim, Shape, TensorType};

fn dims_agree(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        _ => true,
    }
}

pub(super) fn matmul(ops: &Operands) -> Infer {
    let (a, b) = (ops.get(0)?.ty, ops.get(1)?.ty);
    same_dtype("both operands", a, b)?;
    if !a.dtype.is_numeric() {
        return Err(format!("needs numeric operands, got {a}"));
    }
    if a.rank() == 0 || b.rank() == 0 {
        return Err(format!("operands must have rank 1 or more, got {a} and {b}"));
    }
    // numpy: a 1-D left operand is a row, a 1-D right operand a column; both are dropped after.
    let mut ad = a.shape.0.clone();
    let mut bd = b.shape.0.clone();
    if ad.len() == 1 {
        ad.insert(0, Dim::Fixed(1));
    }
    if bd.len() == 1 {
        bd.push(Dim::Fixed(1));
    }
    let (m, k) = (&ad[ad.len() - 2], &ad[ad.len() - 1]);
    let (k2, n) = (&bd[bd.len() - 2], &bd[bd.len() - 1]);
    if !dims_agree(k, k2) {
        return Err(format!("inner dimensions differ: {a} times {b}"));
    }
    let batch = broadcast(&Shape(ad[..ad.len() - 2].to_vec()), &Shape(bd[..bd.len() - 2].to_vec()))
        .ok_or_else(|| format!("batch dimensions do not broadcast: {a} times {b}"))?;
    let mut out = batch.0;
    if a.rank() > 1 {
        out.push(m.clone());
    }
    if b.rank() > 1 {
        out.push(n.clone());
    }
    Ok(vec![TensorType::new(a.dtype, Shape(out))])
}

pub(super) fn gemm(g: &crate::op::Gemm, ops: &Operands) -> Infer {
    let (a, b) = (ops.get(0)?.ty, ops.get(1)?.ty);
    same_dtype("A and B", a, b)?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(format!("A and B must be 2-D, got {a} and {b}"));
    }
    let (m, k) = if g.trans_a { (&a.shape.0[1], &a.shape.0[0]) } else { (&a.shape.0[0], &a.shape.0[1]) };
    let (k2, n) = if g.trans_b { (&b.shape.0[1], &b.shape.0[0]) } else { (&b.shape.0[0], &b.shape.0[1]) };
    if !dims_agree(k, k2) {
        return Err(format!("inner dimensions differ: {a}{} times {b}{}", if g.trans_a { "ᵀ" } else { "" }, if g.trans_b { "ᵀ" } else { "" }));
    }
    let out = Shape(vec![m.clone(), n.clone()]);
    if let Some(c) = ops.opt(2) {
        same_dtype("A and C", a, c.ty)?;
        // C broadcasts one way: to the result's shape.
        if c.ty.rank() > 2 || broadcast(&c.ty.shape, &out).as_ref() != Some(&out) {
            return Err(format!("C {} does not broadcast to the result {}{out}", c.ty, a.dtype));
        }
    }
    Ok(vec![TensorType::new(a.dtype, out)])
}

pub(super) fn einsum(_equation: &str, _ops: &Operands, _ctx: &Ctx) -> Infer {
    Err("Einsum is not implemented yet".into())
}
