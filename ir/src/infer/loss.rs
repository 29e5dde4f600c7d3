//! Losses: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

use super::{same_dtype, Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::op::{Loss, LossReduction};
use crate::{Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, _ctx: &Ctx) -> Infer {
    match op {
        Op::NllLoss(l) => Ok(vec![loss(l, ops)?]),
        Op::SoftmaxCrossEntropyLoss(l) => Ok(vec![loss(l, ops)?, ops.get(0)?.ty.clone()]),
        _ => Err(invalid!("{} is not a loss", op.name())),
    }
}

fn agree(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        _ => true,
    }
}

/// The loss result: the target's shape with no reduction, a scalar otherwise.
fn loss(l: &Loss, ops: &Operands) -> Result<TensorType, OpError> {
    let x = ops.get(0)?.ty;
    let t = ops.get(1)?.ty;
    if !x.dtype.is_float() {
        return Err(invalid!("input must be a float tensor, got {x}"));
    }
    if x.rank() < 2 {
        return Err(invalid!("input must be [N, C] or [N, C, d1, ...], got {x}"));
    }
    if !t.dtype.is_int() {
        return Err(invalid!("target must be an integer tensor, got {t}"));
    }
    // The target is the input without its class axis (1).
    let mut want = x.shape.0.clone();
    let c = want.remove(1);
    if t.rank() != want.len() || !t.shape.0.iter().zip(&want).all(|(a, b)| agree(a, b)) {
        return Err(invalid!(
            "target must be {} (input {x} without the class axis), got {t}",
            Shape(want)
        ));
    }
    if let Some(w) = ops.opt(2) {
        same_dtype("input and weight", x, w.ty)?;
        if w.ty.rank() != 1 || !agree(&w.ty.shape.0[0], &c) {
            return Err(invalid!("weight must be [C] = [{c}] for input {x}, got {}", w.ty));
        }
    }
    Ok(match l.reduction {
        LossReduction::None => TensorType::new(x.dtype, t.shape.clone()),
        LossReduction::Sum | LossReduction::Mean => TensorType::new(x.dtype, Shape::scalar()),
    })
}
