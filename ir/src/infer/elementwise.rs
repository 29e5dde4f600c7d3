//! Elementwise ops: broadcasting and type rules.

use super::{not_yet, same_dtype, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::op::{BinaryOp, TypeClass, UnaryOp};
use crate::{broadcast, DType, Op, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands) -> Infer {
    match op {
        Op::Unary(u) => unary(*u, ops),
        Op::Binary(b) => binary(*b, ops),
        Op::Clip => clip(ops),
        Op::Where => where_(ops),
        Op::Cast { to, .. } => cast(*to, ops),
        Op::BitCast { to } => bitcast(*to, ops),
        Op::Identity => Ok(vec![ops.get(0)?.ty.clone()]),
        _ => not_yet(op),
    }
}

fn accept(class: TypeClass, ty: &TensorType) -> Result<(), OpError> {
    if !class.contains(ty.dtype) {
        return Err(invalid!("needs {}, got {ty}", class.describe()));
    }
    Ok(())
}

pub(super) fn unary(u: UnaryOp, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    accept(u.accepts(), x)?;
    let dtype = if u.returns_bool() { DType::Bool } else { x.dtype };
    Ok(vec![TensorType::new(dtype, x.shape.clone())])
}

pub(super) fn binary(b: BinaryOp, ops: &Operands) -> Infer {
    let (l, r) = (ops.get(0)?.ty, ops.get(1)?.ty);
    accept(b.accepts(), l)?;
    if b == BinaryOp::Pow {
        accept(TypeClass::Numeric, r)?;
    } else {
        same_dtype("both operands", l, r)?;
    }
    let shape =
        broadcast(&l.shape, &r.shape).ok_or_else(|| invalid!("cannot broadcast {l} with {r}"))?;
    let dtype = if b.returns_bool() { DType::Bool } else { l.dtype };
    Ok(vec![TensorType::new(dtype, shape)])
}

pub(super) fn clip(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    accept(TypeClass::Numeric, x)?;
    for (i, what) in [(1, "min"), (2, "max")] {
        if let Some(b) = ops.opt(i) {
            same_dtype(&format!("input and {what}"), x, b.ty)?;
            if b.ty.shape.numel() != Some(1) || b.ty.rank() > 1 {
                return Err(invalid!("{what} must be a scalar, got {}", b.ty));
            }
        }
    }
    Ok(vec![x.clone()])
}

pub(super) fn where_(ops: &Operands) -> Infer {
    let (c, x, y) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    if c.dtype != DType::Bool {
        return Err(invalid!("the condition must be bool, got {c}"));
    }
    same_dtype("both branches", x, y)?;
    let xy =
        broadcast(&x.shape, &y.shape).ok_or_else(|| invalid!("cannot broadcast {x} with {y}"))?;
    let shape = broadcast(&c.shape, &xy)
        .ok_or_else(|| invalid!("cannot broadcast condition {c} with {}{xy}", x.dtype))?;
    Ok(vec![TensorType::new(x.dtype, shape)])
}

/// BitCast: the same shape; the types must be as wide (ONNX has no rule for other widths).
pub(super) fn bitcast(to: DType, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if x.dtype.is_string() || to.is_string() {
        return Err(invalid!("cannot reinterpret {x} as {to}: strings have no bits"));
    }
    if x.dtype.bits() != to.bits() {
        return Err(invalid!(
            "cannot reinterpret {x} as {to}: {} has {} bits, {to} has {}",
            x.dtype,
            x.dtype.bits(),
            to.bits()
        ));
    }
    Ok(vec![TensorType::new(to, x.shape.clone())])
}

pub(super) fn cast(to: DType, ops: &Operands) -> Infer {
    Ok(vec![TensorType::new(to, ops.get(0)?.ty.shape.clone())])
}
