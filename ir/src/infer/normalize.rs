//! Softmax and the normalisations.

use super::{axis, not_yet, same_dtype, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::Op;
use crate::{broadcast, DType, Dim, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands) -> Infer {
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Hardmax { axis } => {
            softmax(*axis, ops)
        }
        Op::LayerNorm { axis, .. } => layer_norm(*axis, ops),
        Op::BatchNorm { .. } => batch_norm(ops),
        _ => normalization(op, ops),
    }
}

pub(super) fn softmax(ax: i64, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    axis(ax, x)?;
    Ok(vec![x.clone()])
}

pub(super) fn layer_norm(ax: i64, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    let a = axis(ax, x)?;
    let normalized = Shape(x.shape.0[a..].to_vec());
    for (i, what) in [(1, "scale"), (2, "bias")] {
        if let Some(p) = ops.opt(i) {
            same_dtype(&format!("input and {what}"), x, p.ty)?;
            if broadcast(&p.ty.shape, &normalized).as_ref() != Some(&normalized) {
                return Err(invalid!(
                    "{what} {} does not broadcast to the normalised shape {normalized} of {x}",
                    p.ty
                ));
            }
        }
    }
    // Mean and InvStdDev keep the leading dimensions and are 1 over the normalised ones.
    let stats = Shape(
        x.shape
            .0
            .iter()
            .enumerate()
            .map(|(i, d)| if i < a { d.clone() } else { Dim::Fixed(1) })
            .collect(),
    );
    let stash = if x.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    Ok(vec![x.clone(), TensorType::new(stash, stats.clone()), TensorType::new(stash, stats)])
}

pub(super) fn batch_norm(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    if x.rank() < 2 {
        return Err(invalid!("input must be [N, C, ...], got {x}"));
    }
    let c = &x.shape.0[1];
    for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
        let p = ops.get(i)?.ty;
        if !p.dtype.is_float() {
            return Err(invalid!("{what} must be a float tensor, got {}", p));
        }
        let ok = p.rank() == 1
            && match (&p.shape.0[0], c) {
                (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
                _ => true,
            };
        if !ok {
            return Err(invalid!("{what} must be [C] = [{c}] for input {x}, got {}", p));
        }
    }
    Ok(vec![x.clone()])
}

/// InstanceNormalization, GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.
fn normalization(op: &Op, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    match op {
        Op::InstanceNorm { .. } => {
            channel_params(x, ops, 1)?;
        }
        Op::GroupNorm { num_groups, .. } => {
            let c = channel_params(x, ops, 1)?;
            if *num_groups == 0 {
                return Err("num_groups must be positive".into());
            }
            if let Dim::Fixed(c) = c {
                if c % num_groups != 0 {
                    return Err(invalid!(
                        "{c} channels of {x} do not split into {num_groups} groups"
                    ));
                }
            }
        }
        Op::RmsNorm { axis: ax, .. } => {
            axis(*ax, x)?;
            let scale = ops.get(1)?.ty;
            same_dtype("input and scale", x, scale)?;
            // Scale broadcasts to X one way (ONNX: unidirectional broadcasting).
            if scale.rank() > x.rank()
                || broadcast(&scale.shape, &x.shape).as_ref() != Some(&x.shape)
            {
                return Err(invalid!("scale {scale} does not broadcast to the input {x}"));
            }
        }
        Op::Lrn(l) => {
            if x.rank() < 3 {
                return Err(invalid!("input must be [N, C, spatial...], got {x}"));
            }
            if l.size == 0 {
                return Err("size must be positive".into());
            }
        }
        Op::LpNorm { axis: ax, p } => {
            axis(*ax, x)?;
            if !matches!(p, 1 | 2) {
                return Err(invalid!("p must be 1 or 2, got {p}"));
            }
        }
        Op::MeanVarianceNorm { axes } => {
            let mut seen = vec![false; x.rank()];
            for &a in axes {
                let i = axis(a, x)?;
                if std::mem::replace(&mut seen[i], true) {
                    return Err(invalid!("axes {axes:?} name axis {i} twice"));
                }
            }
        }
        _ => return not_yet(op),
    }
    Ok(vec![x.clone()])
}

/// Checks an [N, C, ...] input and per-channel [C] parameters at operands `first..`; returns C.
fn channel_params(x: &TensorType, ops: &Operands, first: usize) -> Result<Dim, OpError> {
    if x.rank() < 2 {
        return Err(invalid!("input must be [N, C, ...], got {x}"));
    }
    let c = x.shape.0[1].clone();
    for (i, what) in [(first, "scale"), (first + 1, "bias")] {
        let p = ops.get(i)?.ty;
        same_dtype(&format!("input and {what}"), x, p)?;
        let ok = p.rank() == 1
            && match (&p.shape.0[0], &c) {
                (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
                _ => true,
            };
        if !ok {
            return Err(invalid!("{what} must be [C] = [{c}] for input {x}, got {p}"));
        }
    }
    Ok(c)
}
