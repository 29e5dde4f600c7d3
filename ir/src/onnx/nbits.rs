//! onnxruntime's com.microsoft MatMulNBits (weight-only quantized matrix product, what
//! onnxruntime's `MatMulNBitsQuantizer` and int4 LLM exports write): `(A, B, scales,
//! zero_points?, g_idx?, bias?) -> Y` with attributes K, N, bits, block_size and
//! accuracy_level, imported as kiln's `MatMulNBits` with its operands in the op's form: the
//! scales as `[N, blocks]`, the zero points unpacked to f32 `[N, blocks]` (onnxruntime packs u8
//! zero points `bits` at a time from each byte's low bits up, `[N, ceil(blocks * bits / 8)]`),
//! no g_idx (one that is not the identity's `i / block_size` is refused).
//! `accuracy_level` (the precision onnxruntime may multiply in) is ignored: kiln computes in f32.

use super::import::GraphImporter;
use super::ops::attr;
use super::proto::NodeProto;
use super::quantized::{constant, err, op};
use crate::op::Attrs;
use crate::{BinaryOp, DType, IrError, Op, Result, Tensor, ValueId};

fn reshape(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    v: ValueId,
    dims: &[usize],
) -> Result<ValueId> {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let shape = constant(im, node, &format!("{what}_shape"), Tensor::vector(&dims))?;
    op(im, node, what, Op::Reshape { allowzero: false }, &[Some(v), Some(shape)])
}

/// A required positive integer attribute.
fn size(a: &mut Attrs, name: &str) -> Result<usize> {
    match a.int(name, -1).map_err(attr)? {
        -1 => Err(err(format!("attribute `{name}` is missing"))),
        v if v <= 0 => Err(err(format!("attribute `{name}` is {v}, not a positive size"))),
        v => Ok(v as usize),
    }
}

pub(super) fn convert(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let k = size(&mut a, "K")?;
    let n = size(&mut a, "N")?;
    let bits = a.int("bits", 4).map_err(attr)?;
    let block_size = size(&mut a, "block_size")?;
    a.remove("accuracy_level");
    a.finish("MatMulNBits").map_err(attr)?;
    if bits != 4 {
        return Err(IrError::NotSupported(format!(
            "{bits}-bit weights are not supported (only 4 bits)"
        )));
    }
    let bits = bits as usize;
    if block_size < 16 || !block_size.is_power_of_two() {
        return Err(err(format!("block_size {block_size} is not a power of two of 16 or more")));
    }
    let blocks = k.div_ceil(block_size);
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 (A) is missing"))?;
    let b = im.operand(node, 1).ok_or_else(|| err("operand 1 (B) is missing"))?;
    let scales = im.operand(node, 2).ok_or_else(|| err("operand 2 (scales) is missing"))?;
    if let Some(g) = im.operand(node, 4) {
        trivial_g_idx(im, g, k, block_size)?;
    }
    let scales_n = im.ty(scales).shape.numel();
    if scales_n != Some(n * blocks) {
        return Err(err(format!(
            "the scales {} are not one per column and block ({n} x {blocks})",
            im.ty(scales)
        )));
    }
    let scales = reshape(im, node, "scales", scales, &[n, blocks])?;
    let zeros = match im.operand(node, 3) {
        None => None,
        Some(z) => Some(zero_points(im, node, z, n, blocks, bits)?),
    };
    let y = op(
        im,
        node,
        "",
        Op::MatMulNBits { k, n, bits, block_size },
        &[Some(x), Some(b), Some(scales), zeros, im.operand(node, 5)],
    )?;
    im.bind(node, &[y])
}

/// g_idx (each of the K rows' block) is accepted only as what it is without act-order:
/// `i / block_size`.
fn trivial_g_idx(im: &GraphImporter, g: ValueId, k: usize, block_size: usize) -> Result<()> {
    let t = im.graph.constant_value(g).ok_or_else(|| {
        IrError::NotSupported("a g_idx that is not a constant is not supported".into())
    })?;
    let v = t.to_f64s();
    let trivial = v.len() == k && v.iter().enumerate().all(|(i, &b)| b == (i / block_size) as f64);
    if !trivial {
        return Err(IrError::NotSupported(
            "a g_idx other than i / block_size (act-order) is not supported".into(),
        ));
    }
    Ok(())
}

/// The zero points as f32 `[n, blocks]`: f32 ones reshaped; u8 ones (`bits` a field from each
/// byte's low bits up, each column's padded to whole bytes) unpacked with BitwiseAnd and
/// BitShift, which fold for a constant.
fn zero_points(
    im: &mut GraphImporter,
    node: &NodeProto,
    z: ValueId,
    n: usize,
    blocks: usize,
    bits: usize,
) -> Result<ValueId> {
    let ty = im.ty(z).clone();
    match ty.dtype {
        DType::F32 => {
            if ty.shape.numel() != Some(n * blocks) {
                return Err(err(format!(
                    "the f32 zero points {ty} are not one per column and block ({n} x {blocks})"
                )));
            }
            reshape(im, node, "zero_points", z, &[n, blocks])
        }
        DType::U8 => {
            let per_byte = 8 / bits;
            let bytes = blocks.div_ceil(per_byte);
            if ty.shape.numel() != Some(n * bytes) {
                return Err(err(format!(
                    "the packed zero points {ty} are not {n} x {bytes} bytes ({blocks} blocks of {bits} bits a column)"
                )));
            }
            let z = reshape(im, node, "zero_points_bytes", z, &[n, bytes, 1])?;
            let mask = constant(im, node, "zero_points_mask", Tensor::scalar((1u8 << bits) - 1))?;
            let mut fields = Vec::with_capacity(per_byte);
            for f in 0..per_byte {
                let shift = constant(
                    im,
                    node,
                    &format!("zero_points_shift{f}"),
                    Tensor::scalar((f * bits) as u8),
                )?;
                let moved = op(
                    im,
                    node,
                    &format!("zero_points_moved{f}"),
                    Op::Binary(BinaryOp::BitShift { left: false }),
                    &[Some(z), Some(shift)],
                )?;
                fields.push(Some(op(
                    im,
                    node,
                    &format!("zero_points_field{f}"),
                    Op::Binary(BinaryOp::BitwiseAnd),
                    &[Some(moved), Some(mask)],
                )?));
            }
            let all = op(im, node, "zero_points_fields", Op::Concat { axis: 2 }, &fields)?;
            let all = reshape(im, node, "zero_points_unpacked", all, &[n, bytes * per_byte])?;
            let starts = constant(im, node, "zero_points_starts", Tensor::vector(&[0i64]))?;
            let ends = constant(im, node, "zero_points_ends", Tensor::vector(&[blocks as i64]))?;
            let axes = constant(im, node, "zero_points_axes", Tensor::vector(&[1i64]))?;
            let cut = op(
                im,
                node,
                "zero_points_cut",
                Op::Slice,
                &[Some(all), Some(starts), Some(ends), Some(axes)],
            )?;
            op(im, node, "zero_points", Op::Cast { to: DType::F32, saturate: true }, &[Some(cut)])
        }
        other => Err(err(format!(
            "zero points of type {} are not supported (u8 packed or f32)",
            other.name()
        ))),
    }
}
