//! Convolution and pooling.

use super::{same_dtype, Ctx, Infer, Operands};
use crate::op::{Conv, ConvTranspose, Pool, PoolKind, Window};
use crate::{Dim, Shape, TensorType};

/// Output spatial sizes for `x` of shape [N, C, spatial...] and kernel sizes `kernel`.
fn spatial_out(window: &Window, x: &TensorType, kernel: &[Dim], ceil_mode: bool, ctx: &Ctx) -> Result<Vec<Dim>, String> {
    let spatial = x.rank() - 2;
    window.check(spatial)?;
    (0..spatial)
        .map(|i| match (&x.shape.0[2 + i], kernel[i].fixed()) {
            (Dim::Fixed(n), Some(k)) => window.resolve(i, *n, k, ceil_mode).map(|a| Dim::Fixed(a.output)),
            _ => Ok(ctx.fresh(2 + i)),
        })
        .collect()
}

pub(super) fn conv(c: &Conv, ops: &Operands, ctx: &Ctx) -> Infer {
    let (x, w) = (ops.get(0)?.ty, ops.get(1)?.ty);
    same_dtype("input and weight", x, w)?;
    if !x.dtype.is_float() {
        return Err(format!("needs a float type, got {x}"));
    }
    if x.rank() < 3 || w.rank() != x.rank() {
        return Err(format!("input [N, C, spatial...] and weight [M, C/group, kernel...] must have the same rank of 3 or more, got {x} and {w}"));
    }
    if c.group == 0 {
        return Err("group must be positive".into());
    }
    if let (Dim::Fixed(cin), Dim::Fixed(cw)) = (&x.shape.0[1], &w.shape.0[1]) {
        if *cin != cw * c.group {
            return Err(format!("input has {cin} channels but weight {w} with group {} expects {}", c.group, cw * c.group));
        }
    }
    let m = w.shape.0[0].clone();
    if let Dim::Fixed(m) = m {
        if m % c.group != 0 {
            return Err(format!("{m} output channels do not split into {} groups", c.group));
        }
    }
    if let Some(b) = ops.opt(2) {
        same_dtype("input and bias", x, b.ty)?;
        let ok = b.ty.rank() == 1 && match (&b.ty.shape.0[0], &m) {
            (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
            _ => true,
        };
        if !ok {
            return Err(format!("bias must be [M] = [{m}], got {}", b.ty));
        }
    }
    let mut dims = vec![x.shape.0[0].clone(), m];
    dims.extend(spatial_out(&c.window, x, &w.shape.0[2..], false, ctx)?);
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn pool(p: &Pool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_numeric() {
        return Err(format!("needs a numeric type, got {x}"));
    }
    if x.rank() < 3 {
        return Err(format!("input must be [N, C, spatial...], got {x}"));
    }
    if p.kernel.len() != x.rank() - 2 {
        return Err(format!("kernel_shape {:?} does not match the {} spatial dimensions of {x}", p.kernel, x.rank() - 2));
    }
    let kernel: Vec<Dim> = p.kernel.iter().map(|&k| Dim::Fixed(k)).collect();
    let mut dims = x.shape.0[..2].to_vec();
    dims.extend(spatial_out(&p.window, x, &kernel, p.ceil_mode, ctx)?);
    let y = TensorType::new(x.dtype, Shape(dims));
    if p.kind == PoolKind::Max {
        // MaxPool's optional second result: the flat index of each maximum.
        let indices = TensorType::new(crate::DType::I64, y.shape.clone());
        return Ok(vec![y, indices]);
    }
    Ok(vec![y])
}

pub(super) fn global_pool(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if x.rank() < 3 {
        return Err(format!("input must be [N, C, spatial...], got {x}"));
    }
    let mut dims = x.shape.0[..2].to_vec();
    dims.resize(x.rank(), Dim::Fixed(1));
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn conv_transpose(_c: &ConvTranspose, _ops: &Operands, _ctx: &Ctx) -> Infer {
    Err("ConvTranspose is not implemented yet".into())
}
