//! QuantizeLinear and DequantizeLinear as elementwise arithmetic in f32 (f64 for an f64 scale):
//! the scale and zero point reshaped to broadcast along their axis, or repeated per block.
//!
//! Quantize: `cast(clip(round_even(x / scale) + zero_point, lo, hi))`, or to an 8- or 4-bit
//! float `cast(x / scale + zero_point)` (the cast rounds and saturates); Dequantize:
//! `(x - zero_point) * scale`.

use kiln_ir::{BinaryOp, DType, NodeId, Op, UnaryOp, ValueId};

use super::Emit;
use crate::Result;

/// `p` (a scale or zero point) shaped to broadcast against `x` of `xd`, in `ct`.
fn broadcastable(
    e: &mut Emit,
    p: ValueId,
    xd: &[usize],
    axis: i64,
    block_size: usize,
    ct: DType,
) -> Result<ValueId> {
    let pd = e.dims(p)?;
    let p = e.cast("param", p, ct)?;
    if pd.iter().product::<usize>() == 1 && block_size == 0 {
        return e.reshape("param", p, &[]);
    }
    // Inference checked the axis.
    let a = kiln_ir::normalize_axis(axis, xd.len()).ok_or_else(|| {
        crate::CompileError::Internal(format!("axis {axis} outside rank {}", xd.len()))
    })?;
    if block_size == 0 {
        let mut dims = vec![1; xd.len()];
        dims[a] = xd[a];
        return e.reshape("param", p, &dims);
    }
    // One value per block: [.., nb, ..] -> [.., nb, 1, ..] -> [.., nb, b, ..] -> [.., nb * b, ..],
    // cut to the axis' length.
    let nb = pd[a];
    let mut split = pd.clone();
    split.insert(a + 1, 1);
    let p = e.reshape("blocks", p, &split)?;
    split[a + 1] = block_size;
    let shape = e.ints(&split.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    let p = e.op2("repeat", Op::Expand, &[p, shape])?;
    let mut whole = pd.clone();
    whole[a] = nb * block_size;
    let mut p = e.reshape("per_position", p, &whole)?;
    if whole[a] != xd[a] {
        let starts = e.ints(&[0])?;
        let ends = e.ints(&[xd[a] as i64])?;
        let axes = e.ints(&[a as i64])?;
        p = e.op2("cut", Op::Slice, &[p, starts, ends, axes])?;
    }
    Ok(p)
}

fn compute(scale: DType) -> DType {
    if scale == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

pub(super) fn quantize(
    e: &mut Emit,
    id: NodeId,
    axis: i64,
    block_size: usize,
    saturate: bool,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let (Some(x), Some(scale)) = (ops[0], ops[1]) else { return Ok(None) };
    let to = e.g.node(id).outputs[0].dtype;
    let xd = e.dims(x)?;
    let ct = compute(e.dtype(scale));
    let s = broadcastable(e, scale, &xd, axis, block_size, ct)?;
    let xc = e.cast("x", x, ct)?;
    let mut q = e.binary("div", BinaryOp::Div, xc, s)?;
    // To an 8- or 4-bit float the cast itself rounds and saturates; to an integer, round to
    // even and clip to its range first.
    let to_float = to.is_float8() || to == DType::F4E2M1;
    if !to_float {
        q = e.unary("round", UnaryOp::Round, q)?;
    }
    if let Some(z) = ops.get(2).copied().flatten() {
        let z = broadcastable(e, z, &xd, axis, block_size, ct)?;
        q = e.add("shift", q, z)?;
    }
    if to_float {
        let q = e.op2("quantized", Op::Cast { to, saturate }, &[q])?;
        return Ok(Some(vec![q]));
    }
    let (lo, hi) = kiln_ir::eval::quantized_range(to);
    let lo = e.scalar(lo, ct)?;
    let hi = e.scalar(hi, ct)?;
    q = e.op2("saturate", Op::Clip, &[q, lo, hi])?;
    Ok(Some(vec![e.cast("quantized", q, to)?]))
}

pub(super) fn dequantize(
    e: &mut Emit,
    id: NodeId,
    axis: i64,
    block_size: usize,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let (Some(x), Some(scale)) = (ops[0], ops[1]) else { return Ok(None) };
    let to = e.g.node(id).outputs[0].dtype;
    let xd = e.dims(x)?;
    let ct = compute(e.dtype(scale));
    let s = broadcastable(e, scale, &xd, axis, block_size, ct)?;
    let mut d = e.cast("x", x, ct)?;
    if let Some(z) = ops.get(2).copied().flatten() {
        let z = broadcastable(e, z, &xd, axis, block_size, ct)?;
        d = e.sub("centre", d, z)?;
    }
    let y = e.mul("scale", d, s)?;
    Ok(Some(vec![e.cast("dequantized", y, to)?]))
}

/// MatMulNBits as a dequantized weight and a Gemm: each byte's low and high 4 bits (BitwiseAnd,
/// BitShift) interleaved back into K order, in f32 less the zero point (8 without one) times the
/// scale, `[n, blocks * block_size]` cut to K; then `a` as rows `[rows, k]` times its transpose,
/// plus the bias, in the result's shape.
pub(super) fn nbits_product(
    e: &mut Emit,
    id: NodeId,
    k: usize,
    n: usize,
    block_size: usize,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let (Some(a), Some(b), Some(scales)) = (ops[0], ops[1], ops[2]) else { return Ok(None) };
    let (zeros, bias) = (ops.get(3).copied().flatten(), ops.get(4).copied().flatten());
    let bd = e.dims(b)?;
    let [_, blocks, blob] = bd[..] else { return Ok(None) };
    let mask = e.scalar(15.0, DType::U8)?;
    let four = e.scalar(4.0, DType::U8)?;
    let low = e.binary("low", BinaryOp::BitwiseAnd, b, mask)?;
    let high = e.binary("high", BinaryOp::BitShift { left: false }, b, four)?;
    let low = e.reshape("low_column", low, &[n, blocks, blob, 1])?;
    let high = e.reshape("high_column", high, &[n, blocks, blob, 1])?;
    let q = e.concat("fields", &[low, high], 3)?;
    let q = e.cast("fields_real", q, DType::F32)?;
    let q = e.reshape("blocks", q, &[n, blocks, block_size])?;
    let centred = match zeros {
        Some(z) => {
            let z = e.reshape("zero_points", z, &[n, blocks, 1])?;
            e.sub("centred", q, z)?
        }
        None => {
            let z = e.scalar(8.0, DType::F32)?;
            e.sub("centred", q, z)?
        }
    };
    let s = e.reshape("scales", scales, &[n, blocks, 1])?;
    let w = e.mul("weights", centred, s)?;
    let w = e.reshape("weights_rows", w, &[n, blocks * block_size])?;
    let w = e.slice("weights_cut", w, 1, 0, k, 1)?;
    let ad = e.dims(a)?;
    let rows: usize = ad[..ad.len() - 1].iter().product();
    let a2 = e.reshape("rows", a, &[rows, k])?;
    let y = e.gemm_bt("product", a2, w, bias)?;
    let mut out = ad.clone();
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    Ok(Some(vec![e.reshape("result", y, &out)?]))
}
