//! Softmax and the normalisations.

use super::{axis, not_yet, same_dtype, Ctx, Infer, Operands};
use crate::Op;
use crate::{broadcast, DType, Dim, Shape, TensorType};

pub(super) fn softmax(ax: i64, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(format!("needs a float type, got {x}"));
    }
    axis(ax, x)?;
    Ok(vec![x.clone()])
}

pub(super) fn layer_norm(ax: i64, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(format!("needs a float type, got {x}"));
    }
    let a = axis(ax, x)?;
    let normalized = Shape(x.shape.0[a..].to_vec());
    for (i, what) in [(1, "scale"), (2, "bias")] {
        if let Some(p) = ops.opt(i) {
            same_dtype(&format!("input and {what}"), x, p.ty)?;
            if broadcast(&p.ty.shape, &normalized).as_ref() != Some(&normalized) {
                return Err(format!("{what} {} does not broadcast to the normalised shape {normalized} of {x}", p.ty));
            }
        }
    }
    // Mean and InvStdDev keep the leading dimensions and are 1 over the normalised ones.
    let stats = Shape(x.shape.0.iter().enumerate().map(|(i, d)| if i < a { d.clone() } else { Dim::Fixed(1) }).collect());
    let stash = if x.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    Ok(vec![x.clone(), TensorType::new(stash, stats.clone()), TensorType::new(stash, stats)])
}

pub(super) fn batch_norm(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(format!("needs a float type, got {x}"));
    }
    if x.rank() < 2 {
        return Err(format!("input must be [N, C, ...], got {x}"));
    }
    let c = &x.shape.0[1];
    for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
        let p = ops.get(i)?.ty;
        if !p.dtype.is_float() {
            return Err(format!("{what} must be a float tensor, got {}", p));
        }
        let ok = p.rank() == 1 && match (&p.shape.0[0], c) {
            (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
            _ => true,
        };
        if !ok {
            return Err(format!("{what} must be [C] = [{c}] for input {x}, got {}", p));
        }
    }
    Ok(vec![x.clone()])
}

/// InstanceNormalization, GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.
pub(super) fn infer(op: &Op, _ops: &Operands, _ctx: &Ctx) -> Infer {
    not_yet(op)
}
