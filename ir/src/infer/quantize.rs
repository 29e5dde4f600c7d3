//! QuantizeLinear and DequantizeLinear: the result has the input's shape; the scale (and zero
//! point) is one value, one per position along the axis, or one per block along it.

use super::{not_yet, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::shape::normalize_axis;
use crate::{DType, Dim, Op, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands) -> Infer {
    match op {
        Op::Quantize { axis, block_size, dtype, .. } => quantize(*axis, *block_size, *dtype, ops),
        Op::Dequantize { axis, block_size } => dequantize(*axis, *block_size, ops),
        Op::DynQMatMul => dynamic_product(ops),
        Op::MatMulNBits { k, n, bits, block_size } => {
            nbits_product(*k, *n, *bits, *block_size, ops)
        }
        _ => not_yet(op),
    }
}

/// Checks the scale's (and zero point's) shape against `x`'s; the normalised axis.
fn scale_layout(
    axis: i64,
    block_size: usize,
    x: &TensorType,
    scale: &TensorType,
    what: &str,
) -> Result<(), OpError> {
    if scale.shape.numel() == Some(1) && block_size == 0 && scale.rank() <= 1 {
        return Ok(());
    }
    let a = normalize_axis(axis, x.rank()).ok_or_else(|| invalid!("axis {axis} is outside {x}"))?;
    let dim = &x.shape.dims()[a];
    if block_size == 0 {
        let ok = scale.rank() == 1
            && (scale.shape.dims()[0] == *dim
                || matches!(dim, Dim::Sym(_))
                || matches!(scale.shape.dims()[0], Dim::Sym(_)));
        return if ok {
            Ok(())
        } else {
            Err(invalid!(
                "the {what} {scale} is neither one value nor one per position of axis {a} of {x}"
            ))
        };
    }
    if scale.rank() != x.rank() {
        return Err(invalid!("a blocked {what} has the input's rank: {scale} for {x}"));
    }
    for (i, (s, d)) in scale.shape.dims().iter().zip(x.shape.dims()).enumerate() {
        let want = if i == a {
            d.fixed().map(|n| Dim::Fixed(n.div_ceil(block_size)))
        } else {
            Some(d.clone())
        };
        if let (Some(w), Dim::Fixed(_)) = (want, s) {
            if *s != w {
                return Err(invalid!("the {what} {scale} does not give one value per block of {block_size} along axis {a} of {x}"));
            }
        }
    }
    Ok(())
}

/// The zero point gives one value where the scale does (the interpreter indexes both alike).
fn same_layout(scale: &TensorType, zero: &TensorType) -> Result<(), OpError> {
    match (scale.shape.numel(), zero.shape.numel()) {
        (Some(s), Some(z)) if s != z => {
            Err(invalid!("the zero point {zero} does not match the scale {scale}"))
        }
        _ => Ok(()),
    }
}

fn is_quantized(d: DType) -> bool {
    matches!(d, DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I32) || d.is_storage()
}

pub(super) fn quantize(
    axis: i64,
    block_size: usize,
    dtype: Option<DType>,
    ops: &Operands,
) -> Infer {
    let (x, scale) = (ops.get(0)?.ty, ops.get(1)?.ty);
    if !x.dtype.is_float() && x.dtype != DType::I32 {
        return Err(invalid!("quantizes floats (or int32), got {x}"));
    }
    if !scale.dtype.is_float() {
        return Err(invalid!("the scale must be a float, got {scale}"));
    }
    scale_layout(axis, block_size, x, scale, "scale")?;
    let to = match ops.opt(2) {
        Some(z) => {
            scale_layout(axis, block_size, x, z.ty, "zero point")?;
            same_layout(scale, z.ty)?;
            if dtype.is_some_and(|d| d != z.ty.dtype) {
                return Err(invalid!(
                    "output_dtype {} disagrees with the zero point {}",
                    dtype.map_or("", |d| d.name()),
                    z.ty
                ));
            }
            z.ty.dtype
        }
        None => dtype.unwrap_or(DType::U8),
    };
    if !is_quantized(to) || to == DType::I32 || to == DType::F8E8M0 {
        return Err(invalid!(
            "quantizes to 8-, 4- or 2-bit integers, 16-bit integers or 8- and 4-bit floats, not {}",
            to.name()
        ));
    }
    Ok(vec![TensorType::new(to, x.shape.clone())])
}

pub(super) fn dequantize(axis: i64, block_size: usize, ops: &Operands) -> Infer {
    let (x, scale) = (ops.get(0)?.ty, ops.get(1)?.ty);
    if !is_quantized(x.dtype) {
        return Err(invalid!(
            "dequantizes 8-, 16- and 32-bit integers and the storage types, got {x}"
        ));
    }
    if !scale.dtype.is_float() {
        return Err(invalid!("the scale must be a float, got {scale}"));
    }
    scale_layout(axis, block_size, x, scale, "scale")?;
    if let Some(z) = ops.opt(2) {
        scale_layout(axis, block_size, x, z.ty, "zero point")?;
        same_layout(scale, z.ty)?;
        if z.ty.dtype != x.dtype {
            return Err(invalid!(
                "the zero point {} is not of the input's type {}",
                z.ty,
                x.dtype.name()
            ));
        }
    }
    Ok(vec![TensorType::new(scale.dtype, x.shape.clone())])
}

/// kiln's DynQMatMul: f32 `[..., K]` by s8 or int32 `[K, M]`, with one f32 weight scale or one per
/// column: f32 `[..., M]`.
fn dynamic_product(ops: &Operands) -> Infer {
    let (x, w, scale) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    let weights = matches!(w.dtype, DType::I8 | DType::I32);
    if x.dtype != DType::F32 || !weights || scale.dtype != DType::F32 {
        return Err(invalid!(
            "takes f32 rows by s8 or int32 weights with an f32 scale, got {x}, {w}, {scale}"
        ));
    }
    if x.rank() < 1 || w.rank() != 2 || scale.rank() > 1 {
        return Err(invalid!(
            "takes rows by a matrix with a scalar or 1-D scale, got {x}, {w}, {scale}"
        ));
    }
    let (k, m) = (&w.shape.dims()[0], &w.shape.dims()[1]);
    let xk = &x.shape.dims()[x.rank() - 1];
    if matches!((xk, k), (Dim::Fixed(a), Dim::Fixed(b)) if a != b) {
        return Err(invalid!("inner dimensions differ: {x} times {w}"));
    }
    let mut out = x.shape.dims().to_vec();
    *out.last_mut().expect("rank 1 or more") = m.clone();
    Ok(vec![TensorType::new(DType::F32, crate::Shape(out))])
}

/// MatMulNBits: f32 `[..., k]` by u8 `[n, blocks, block_size / 2]` (4 bits) with f32 scales,
/// zero points `[n, blocks]` and bias `[n]`: f32 `[..., n]`.
fn nbits_product(k: usize, n: usize, bits: usize, block_size: usize, ops: &Operands) -> Infer {
    if bits != 4 {
        return Err(invalid!("takes 4-bit weights, not {bits}-bit"));
    }
    if block_size < 16 || !block_size.is_power_of_two() {
        return Err(invalid!("block_size {block_size} is not a power of two of 16 or more"));
    }
    if k == 0 || n == 0 {
        return Err(invalid!("K ({k}) and N ({n}) must be positive"));
    }
    let blocks = k.div_ceil(block_size);
    let (a, b, scales) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    if a.dtype != DType::F32 || a.rank() < 1 {
        return Err(invalid!("takes f32 rows [..., K], got {a}"));
    }
    if matches!(&a.shape.dims()[a.rank() - 1], Dim::Fixed(x) if *x != k) {
        return Err(invalid!("the input {a} does not have K = {k} columns"));
    }
    let fits = |t: &TensorType, want: &[usize]| {
        t.rank() == want.len()
            && t.shape.dims().iter().zip(want).all(|(d, w)| !matches!(d, Dim::Fixed(x) if x != w))
    };
    let blob = block_size * bits / 8;
    if b.dtype != DType::U8 || !fits(b, &[n, blocks, blob]) {
        return Err(invalid!("the packed weights {b} are not u8 [{n}, {blocks}, {blob}]"));
    }
    if scales.dtype != DType::F32 || !fits(scales, &[n, blocks]) {
        return Err(invalid!("the scales {scales} are not f32 [{n}, {blocks}]"));
    }
    if let Some(z) = ops.opt(3) {
        if z.ty.dtype != DType::F32 || !fits(z.ty, &[n, blocks]) {
            return Err(invalid!("the zero points {} are not f32 [{n}, {blocks}]", z.ty));
        }
    }
    if let Some(bias) = ops.opt(4) {
        if bias.ty.dtype != DType::F32 || !fits(bias.ty, &[n]) {
            return Err(invalid!("the bias {} is not f32 [{n}]", bias.ty));
        }
    }
    let mut out = a.shape.dims().to_vec();
    *out.last_mut().expect("rank 1 or more") = Dim::Fixed(n);
    Ok(vec![TensorType::new(DType::F32, crate::Shape(out))])
}
