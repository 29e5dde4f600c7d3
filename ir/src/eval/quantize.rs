//! QuantizeLinear and DequantizeLinear, element by element in f64: each element finds its scale
//! (and zero point) by its position along the axis, or its block.

use super::not_yet;
use crate::error::{invalid, OpError};
use crate::shape::normalize_axis;
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    Ok(match op {
        Op::Quantize { axis, block_size, saturate, .. } => {
            vec![quantize(*axis, *block_size, *saturate, operands, &out_types[0])?]
        }
        Op::Dequantize { axis, block_size } => {
            vec![dequantize(*axis, *block_size, operands, &out_types[0])?]
        }
        Op::DynQMatMul => vec![dynamic_product(operands, &out_types[0])?],
        Op::MatMulNBits { k, n, bits, block_size } => {
            vec![nbits_product(*k, *n, *bits, *block_size, operands, &out_types[0])?]
        }
        _ => return not_yet(op),
    })
}

/// For each element of `dims`, the index of its scale in a scale of `scale_dims`.
fn scale_index(
    dims: &[usize],
    scale_dims: &[usize],
    axis: i64,
    block_size: usize,
) -> Result<Vec<usize>, OpError> {
    let n: usize = dims.iter().product();
    let numel: usize = scale_dims.iter().product();
    if numel == 1 && block_size == 0 {
        return Ok(vec![0; n]);
    }
    let a = normalize_axis(axis, dims.len())
        .ok_or_else(|| invalid!("axis {axis} is outside rank {}", dims.len()))?;
    let strides = super::strides(dims);
    if block_size == 0 {
        return Ok((0..n).map(|i| (i / strides[a]) % dims[a]).collect());
    }
    let sstrides = super::strides(scale_dims);
    Ok((0..n)
        .map(|i| {
            (0..dims.len())
                .map(|k| {
                    let c = (i / strides[k]) % dims[k];
                    (if k == a { c / block_size } else { c }) * sstrides[k]
                })
                .sum()
        })
        .collect())
}

/// The range of a quantized integer type (what QuantizeLinear saturates to).
pub fn quantized_range(d: DType) -> (f64, f64) {
    match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::U4 => (0.0, 15.0),
        DType::I4 => (-8.0, 7.0),
        DType::U2 => (0.0, 3.0),
        DType::I2 => (-2.0, 1.0),
        _ => (i32::MIN as f64, i32::MAX as f64),
    }
}

/// An integer convolution's or matrix product's requantising multiplier for one output channel:
/// `x_scale * w_scale / y_scale` in f32, one rounding after each operation, as onnxruntime
/// computes it (QLinearConv's and QGemm's output scales). In f64 it differs in the last bit for
/// some channels, which moves a sum near a rounding tie to the other integer; in a deep network
/// such single steps grow from layer to layer (mobilenet_v2 ended 7 steps from onnxruntime).
pub fn requant_multiplier(x_scale: f64, w_scale: f64, y_scale: f64) -> f32 {
    x_scale as f32 * w_scale as f32 / y_scale as f32
}

/// An int32 sum (the bias added) requantised as onnxruntime's MLAS does: converted to f32 (which
/// rounds above 2^24), times the f32 multiplier, rounded half to even, plus the zero point, and
/// saturated to `[lo, hi]`.
pub fn requantise(sum: f64, multiplier: f32, zero: f64, lo: f64, hi: f64) -> f64 {
    ((sum as f32 * multiplier).round_ties_even() as f64 + zero).clamp(lo, hi)
}

/// Whether QuantizeLinear to `d` converts to a float format (8- or 4-bit) rather than rounding
/// to an integer.
fn quantizes_to_float(d: DType) -> bool {
    d.is_float8() || d == DType::F4E2M1
}

pub(super) fn quantize(
    axis: i64,
    block_size: usize,
    saturate: bool,
    operands: &[Option<&Tensor>],
    out: &TensorType,
) -> Result<Tensor, OpError> {
    let x = operands[0].ok_or("operand 0 is missing")?;
    let scale = operands[1].ok_or("operand 1 is missing")?;
    let zero = operands.get(2).copied().flatten();
    let at = scale_index(x.dims(), scale.dims(), axis, block_size)?;
    let (xs, ss) = (x.to_f64s(), scale.to_f64s());
    let zs = zero.map(|z| z.to_f64s());
    let (lo, hi) = quantized_range(out.dtype);
    let to_float = quantizes_to_float(out.dtype);
    // The division in f32 when both are f32, as the reference computes it (a tie must stay one).
    let single = x.dtype() == DType::F32 && scale.dtype() == DType::F32;
    let q: Vec<f64> = xs
        .iter()
        .zip(&at)
        .map(|(&v, &i)| {
            let z = zs.as_ref().map_or(0.0, |z| z[i]);
            let r = if single { (v as f32 / ss[i] as f32) as f64 } else { v / ss[i] };
            if to_float {
                // Converted (rounded, saturated) by the float type itself.
                if single {
                    (r as f32 + z as f32) as f64
                } else {
                    r + z
                }
            } else {
                (r.round_ties_even() + z).clamp(lo, hi)
            }
        })
        .collect();
    let q = Tensor::from_f64s(DType::F64, x.dims(), &q).map_err(OpError::from)?;
    Ok(if saturate { q.cast(out.dtype) } else { q.cast_unsaturated(out.dtype) })
}

pub(super) fn dequantize(
    axis: i64,
    block_size: usize,
    operands: &[Option<&Tensor>],
    out: &TensorType,
) -> Result<Tensor, OpError> {
    let x = operands[0].ok_or("operand 0 is missing")?;
    let scale = operands[1].ok_or("operand 1 is missing")?;
    let zero = operands.get(2).copied().flatten();
    let at = scale_index(x.dims(), scale.dims(), axis, block_size)?;
    let (xs, ss) = (x.to_f64s(), scale.to_f64s());
    let zs = zero.map(|z| z.to_f64s());
    // In the scale's precision, as the reference computes it.
    let y: Vec<f64> = xs
        .iter()
        .zip(&at)
        .map(|(&v, &i)| {
            let d = v - zs.as_ref().map_or(0.0, |z| z[i]);
            if out.dtype == DType::F32 {
                (d as f32 * ss[i] as f32) as f64
            } else {
                d * ss[i]
            }
        })
        .collect();
    Tensor::from_f64s(out.dtype, x.dims(), &y).map_err(OpError::from)
}

/// DynamicQuantizeLinear's scale and zero point for `xs`, in f32 step by step as its ONNX
/// function body computes them (the importer's ops): `(max(x, 0) - min(x, 0)) / 255` and
/// `round_half_even(clip(0 - min / scale, 0, 255))`. A tensor of zeros has scale 0 and zero point
/// 0 (the body's 0 / 0 saturates to 0 as it is cast to u8).
fn dynamic_scale(xs: impl Iterator<Item = f32>) -> (f32, f32) {
    let (mut lo, mut hi) = (0f32, 0f32);
    for v in xs {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let scale = (hi - lo) / 255f32;
    let zero = (0f32 - lo / scale).clamp(0.0, 255.0).round_ties_even();
    (scale, if zero.is_nan() { 0.0 } else { zero })
}

/// kiln's DynQMatMul as its ops compute it: x quantized (round half to even, plus the zero
/// point, saturated to u8), the sums of (q - zero) * w in int32 (exact: K is bounded by the op's
/// users), converted to f32 and multiplied by the f32 product `scale * w_scale`.
fn dynamic_product(operands: &[Option<&Tensor>], out: &TensorType) -> Result<Tensor, OpError> {
    let x = operands[0].ok_or("operand 0 is missing")?;
    let w = operands[1].ok_or("operand 1 is missing")?;
    let ws = operands[2].ok_or("operand 2 is missing")?.to_f64s();
    let xs: Vec<f32> = x.to_f64s().into_iter().map(|v| v as f32).collect();
    let (k, m) = match w.dims() {
        [k, m] => (*k, *m),
        d => return Err(invalid!("the weights must be a matrix, got {d:?}")),
    };
    if ws.len() != 1 && ws.len() != m {
        return Err(invalid!("{} weight scales for {m} columns", ws.len()));
    }
    let (scale, zero) = dynamic_scale(xs.iter().copied());
    let q: Vec<i64> = xs
        .iter()
        .map(|&v| {
            let r = (v / scale).round_ties_even();
            // (0 / 0 is NaN, which saturates to 0 as the u8 cast does.)
            let r = if r.is_nan() { 0.0 } else { r };
            (r + zero).clamp(0.0, 255.0) as i64 - zero as i64
        })
        .collect();
    let wv: Vec<i64> = w.to_f64s().into_iter().map(|v| v as i64).collect();
    let rows = xs.len().checked_div(k).unwrap_or(xs.len());
    let mut y = vec![0f64; rows * m];
    for r in 0..rows {
        for j in 0..m {
            let acc: i64 = (0..k).map(|i| q[r * k + i] * wv[i * m + j]).sum();
            let s = scale * ws[if ws.len() == 1 { 0 } else { j }] as f32;
            y[r * m + j] = (acc as i32 as f32 * s) as f64;
        }
    }
    let dims: Vec<usize> = out.shape.as_fixed().ok_or("the result's shape is not static")?;
    Tensor::from_f64s(DType::F32, &dims, &y).map_err(OpError::from)
}

/// MatMulNBits' weights dequantized, `[k, n]` row-major: weight (column `j`, row `i`) is the
/// `bits`-bit field `i % block_size` of block `i / block_size` of column `j` (packed from each
/// byte's low bits up), less its zero point (`2^(bits - 1)` without one), times its scale, in
/// f32.
pub fn nbits_weights(
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
    packed: &[u8],
    scales: &[f32],
    zero_points: Option<&[f32]>,
) -> Result<Vec<f32>, OpError> {
    if bits == 0 || bits > 8 || block_size == 0 || !(block_size * bits).is_multiple_of(8) {
        return Err(invalid!(
            "{bits}-bit weights in blocks of {block_size} do not pack into bytes"
        ));
    }
    let blocks = k.div_ceil(block_size);
    let blob = block_size * bits / 8;
    if packed.len() != n * blocks * blob || scales.len() != n * blocks {
        return Err(invalid!(
            "{} packed bytes and {} scales for {n} columns of {blocks} blocks",
            packed.len(),
            scales.len()
        ));
    }
    if zero_points.is_some_and(|z| z.len() != n * blocks) {
        return Err(invalid!("the zero points are not one per column and block"));
    }
    let mask = (1u32 << bits) - 1;
    let default_zero = (1u32 << (bits - 1)) as f32;
    let mut w = vec![0f32; k * n];
    for j in 0..n {
        for i in 0..k {
            let (block, pos) = (i / block_size, i % block_size);
            let bit = pos * bits;
            let base = (j * blocks + block) * blob;
            let lo = packed[base + bit / 8] as u32;
            let hi = packed.get(base + bit / 8 + 1).copied().unwrap_or(0) as u32;
            let q = (((hi << 8) | lo) >> (bit % 8)) & mask;
            let at = j * blocks + block;
            let z = zero_points.map_or(default_zero, |z| z[at]);
            w[i * n + j] = (q as f32 - z) * scales[at];
        }
    }
    Ok(w)
}

/// MatMulNBits as defined: the weights dequantized in f32 (`nbits_weights`), then the product
/// summed in f64, plus the bias.
fn nbits_product(
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
    operands: &[Option<&Tensor>],
    out: &TensorType,
) -> Result<Tensor, OpError> {
    let a = operands[0].ok_or("operand 0 is missing")?.to_f64s();
    let b = operands[1].ok_or("operand 1 is missing")?;
    let packed: Vec<u8> = b.to_f64s().into_iter().map(|v| v as u8).collect();
    let f32s = |t: &Tensor| t.to_f64s().into_iter().map(|v| v as f32).collect::<Vec<f32>>();
    let scales = f32s(operands[2].ok_or("operand 2 is missing")?);
    let zeros = operands.get(3).copied().flatten().map(f32s);
    let bias = operands.get(4).copied().flatten().map(|t| t.to_f64s());
    let w = nbits_weights(k, n, bits, block_size, &packed, &scales, zeros.as_deref())?;
    let rows = a.len() / k.max(1);
    let mut y = vec![0f64; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let mut acc: f64 = (0..k).map(|i| a[r * k + i] * w[i * n + j] as f64).sum();
            if let Some(b) = &bias {
                acc += b[j];
            }
            y[r * n + j] = acc;
        }
    }
    let dims: Vec<usize> = out.shape.as_fixed().ok_or("the result's shape is not static")?;
    Tensor::from_f64s(DType::F32, &dims, &y).map_err(OpError::from)
}
