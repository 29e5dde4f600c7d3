//! Scatters that ONNX defines but kiln's table need not: TensorScatter (the KV-cache update of
//! opset 24) and MaxUnpool, expanded at import into ScatterElements and the ops around it, so
//! the interpreter and every target run them as they run ScatterElements. Nodes are named
//! `<node>/<part>`.

use super::import::GraphImporter;
use super::ops::{attr, err};
use super::proto::NodeProto;
use crate::error::AttrError;
use crate::op::{Attrs, ScatterReduction};
use crate::{BinaryOp, IrError, Op, Result, Tensor};

fn scatter_along(axis: usize) -> Op {
    Op::ScatterElements { axis: axis as i64, reduction: ScatterReduction::None }
}

/// A sequence axis of a rank-`rank` tensor: not the batch axis (0), in range.
fn sequence_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let normal = if axis < 0 { axis + r } else { axis };
    if normal <= 0 || normal >= r {
        return Err(attr(AttrError::OutOfRange {
            name: "axis".into(),
            value: axis.to_string(),
            why: "must name an axis of past_cache other than the batch axis (0)",
        }));
    }
    Ok(normal as usize)
}

/// TensorScatter `(past_cache, update, write_indices?) -> present_cache`: update's step `s` of
/// batch entry `b` goes to cache position `write_indices[b] + s` along `axis` (modulo the
/// cache's length in `circular` mode). That is ScatterElements along `axis` with the positions
/// `write_indices[b] + s` broadcast to update's shape.
pub(super) fn tensor_scatter(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let axis = a.int("axis", -2).map_err(attr)?;
    let circular = match a.string("mode", "linear").map_err(attr)?.as_str() {
        "linear" => false,
        "circular" => true,
        other => {
            return Err(attr(AttrError::OutOfRange {
                name: "mode".into(),
                value: other.into(),
                why: "must be `linear` or `circular`",
            }))
        }
    };
    a.finish("TensorScatter").map_err(attr)?;
    let past = im.operand(node, 0).ok_or_else(|| err("operand 0 (past_cache) is missing"))?;
    let update = im.operand(node, 1).ok_or_else(|| err("operand 1 (update) is missing"))?;
    let write = im.operand(node, 2);
    let (tp, tu) = (im.ty(past).clone(), im.ty(update).clone());
    if tp.rank() < 2 || tu.rank() != tp.rank() || tu.dtype != tp.dtype {
        return Err(err(format!(
            "update {tu} must have past_cache's type and rank (at least 2), past_cache is {tp}"
        )));
    }
    let axis = sequence_axis(axis, tp.rank())?;
    let (pd, ud) = (tp.shape.dims(), tu.shape.dims());
    for (i, (p, u)) in pd.iter().zip(ud).enumerate() {
        if i != axis && p.fixed().zip(u.fixed()).is_some_and(|(p, u)| p != u) {
            return Err(err(format!(
                "update {tu} and past_cache {tp} must agree on every axis but the sequence axis {axis}"
            )));
        }
    }
    let (Some(max_len), Some(len)) = (pd[axis].fixed(), ud[axis].fixed()) else {
        return Err(IrError::NotSupported(format!(
            "the sequence axis of past_cache {tp} and update {tu} must have known sizes"
        )));
    };
    if len > max_len {
        return Err(err(format!(
            "update {tu} has {len} steps, more than past_cache {tp}'s {max_len}"
        )));
    }
    if let Some(w) = write {
        let tw = im.ty(w);
        let batch_agrees = tw.shape.dims().first().and_then(|d| d.fixed()).zip(pd[0].fixed());
        if tw.dtype != crate::DType::I64
            || tw.rank() != 1
            || batch_agrees.is_some_and(|(w, b)| w != b)
        {
            return Err(err(format!(
                "write_indices {tw} must be i64 of one entry per batch entry (past_cache is {tp})"
            )));
        }
    }
    // The steps 0..len along `axis`, 1 on every other axis: a Range, not a literal, since len
    // is only a declared size (it folds to a constant when small).
    let len = i64::try_from(len)
        .map_err(|_| err(format!("update {tu} has more steps than an i64 counts")))?;
    let mut steps_dims = vec![1i64; tp.rank()];
    steps_dims[axis] = len;
    let (zero, one) = (Tensor::scalar(0i64), Tensor::scalar(1i64));
    let (zero, one) = (im.constant(node, "zero", zero)?, im.constant(node, "one", one)?);
    let end = im.constant(node, "len", Tensor::scalar(len))?;
    let range = im.add1(node, "range", Op::Range, &[zero, end, one])?;
    let steps_shape = im.constant(node, "steps_shape", Tensor::vector(&steps_dims))?;
    let steps = im.add1(node, "steps", Op::Reshape { allowzero: false }, &[range, steps_shape])?;
    let positions = match write {
        None => steps,
        Some(w) => {
            let axes: Vec<i64> = (1..tp.rank() as i64).collect();
            let axes = im.constant(node, "batch_axes", Tensor::vector(&axes))?;
            let start = im.add1(node, "start", Op::Unsqueeze, &[w, axes])?;
            let at = im.add1(node, "positions", Op::Binary(BinaryOp::Add), &[start, steps])?;
            if circular {
                let m = im.constant(node, "max_len", Tensor::scalar(max_len as i64))?;
                im.add1(node, "wrapped", Op::Binary(BinaryOp::Mod { fmod: false }), &[at, m])?
            } else {
                at
            }
        }
    };
    let shape = im.add1(node, "update_shape", Op::Shape { start: 0, end: None }, &[update])?;
    let indices = im.add1(node, "indices", Op::Expand, &[positions, shape])?;
    let present = im.add1(node, "", scatter_along(axis), &[past, indices, update])?;
    im.bind(node, &[present])
}

/// MaxUnpool `(X, I, output_shape?) -> Y`: each X element written at its flat index I into
/// zeros of the pooling's input shape (`(d - 1) * stride - pads + kernel` per spatial axis),
/// then, when `output_shape` is given, zero-padded at the end of each axis to it (ONNX's
/// reference). A flat ScatterElements, Reshape and Pad.
pub(super) fn max_unpool(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let kernel = a.sizes("kernel_shape").map_err(attr)?;
    if kernel.is_empty() {
        return Err(attr(AttrError::Missing { name: "kernel_shape".into() }));
    }
    let spatial = kernel.len();
    let strides = a.sizes("strides").map_err(attr)?;
    let pads = a.sizes("pads").map_err(attr)?;
    a.finish("MaxUnpool").map_err(attr)?;
    let strides = if strides.is_empty() { vec![1; spatial] } else { strides };
    let pads = if pads.is_empty() { vec![0; 2 * spatial] } else { pads };
    if strides.len() != spatial || pads.len() != 2 * spatial || strides.contains(&0) {
        return Err(err(format!(
            "strides {strides:?} and pads {pads:?} must give {spatial} positive strides and {} pads for kernel_shape {kernel:?}",
            2 * spatial
        )));
    }
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 (X) is missing"))?;
    let i = im.operand(node, 1).ok_or_else(|| err("operand 1 (I) is missing"))?;
    let output_shape = im.operand(node, 2);
    let (tx, ti) = (im.ty(x).clone(), im.ty(i).clone());
    let (xd, id) = (tx.shape.dims(), ti.shape.dims());
    let shapes_differ = xd.len() != id.len()
        || xd.iter().zip(id).any(|(a, b)| a.fixed().zip(b.fixed()).is_some_and(|(a, b)| a != b));
    if tx.rank() != spatial + 2 || shapes_differ || ti.dtype != crate::DType::I64 {
        return Err(err(format!(
            "X {tx} must be [N, C] and {spatial} spatial axes (kernel_shape {kernel:?}), and I {ti} i64 of its shape"
        )));
    }
    let dims = tx
        .shape
        .as_fixed()
        .ok_or_else(|| IrError::NotSupported(format!("X {tx} must have a known shape")))?;
    let mut unpooled = dims[..2].to_vec();
    for d in 0..spatial {
        // As the reference computes it, in i128 (no overflow for usize operands): an empty
        // axis gives `kernel - stride - pads`, which may be 0 but not negative.
        let size = (dims[d + 2] as i128 - 1) * strides[d] as i128 + kernel[d] as i128
            - pads[d] as i128
            - pads[d + spatial] as i128;
        let size = Some(size).filter(|&s| s >= 0 && s <= i64::MAX as i128).ok_or_else(|| {
            err(format!(
                "spatial axis {d}: ({} - 1) * stride {} + kernel {} - pads {} and {} is no size",
                dims[d + 2],
                strides[d],
                kernel[d],
                pads[d],
                pads[d + spatial]
            ))
        })?;
        unpooled.push(size as usize);
    }
    let total = unpooled.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
        err(format!("the unpooled shape {unpooled:?} has more elements than memory holds"))
    })?;
    if total > crate::memory::available_at_start() as usize / tx.dtype.size().max(1) {
        return Err(err(format!(
            "the unpooled shape {unpooled:?} needs more memory than available"
        )));
    }
    let x_flat = im.flatten(node, "x_flat", x)?;
    let i_flat = im.flatten(node, "i_flat", i)?;
    let size = im.constant(node, "size", Tensor::vector(&[total as i64]))?;
    let zero = Op::ConstantOfShape { value: Tensor::zeros(tx.dtype, &[1]) };
    let zeros = im.add1(node, "zeros", zero, &[size])?;
    let scattered = im.add1(node, "scattered", scatter_along(0), &[zeros, i_flat, x_flat])?;
    let unpooled_shape: Vec<i64> = unpooled.iter().map(|&d| d as i64).collect();
    let unpooled_shape = im.constant(node, "unpooled_shape", Tensor::vector(&unpooled_shape))?;
    // allowzero: an empty axis's size 0 is a size, not "copy the operand's".
    let reshape = Op::Reshape { allowzero: true };
    let Some(output_shape) = output_shape else {
        let y = im.add1(node, "", reshape, &[scattered, unpooled_shape])?;
        return im.bind(node, &[y]);
    };
    let to = im.ty(output_shape);
    if to.dtype != crate::DType::I64 || to.shape.dims() != [crate::Dim::Fixed(tx.rank())] {
        return Err(err(format!("output_shape {to} must be i64[{}]", tx.rank())));
    }
    // A known output_shape must hold the unpooled shape (the reference refuses a smaller one;
    // Pad's negative pads would crop silently). One computed at run time is not checked.
    if let Some(out) = im.graph.constant_value(output_shape) {
        let out = out.to_i64s();
        if out.iter().zip(&unpooled).any(|(&o, &u)| o < u as i64) {
            return Err(err(format!(
                "output_shape {out:?} is smaller than the unpooled shape {unpooled:?}"
            )));
        }
    }
    let y = im.add1(node, "unpooled", reshape, &[scattered, unpooled_shape])?;
    // Pads: none at the start of each axis, output_shape - unpooled at its end.
    let ends =
        im.add1(node, "pad_ends", Op::Binary(BinaryOp::Sub), &[output_shape, unpooled_shape])?;
    let starts = im.constant(node, "pad_starts", Tensor::vector(&vec![0i64; tx.rank()]))?;
    let pads = im.add1(node, "pads", Op::Concat { axis: 0 }, &[starts, ends])?;
    let pad = Op::Pad { mode: crate::op::PadMode::Constant };
    let y = im.add1(node, "", pad, &[y, pads])?;
    im.bind(node, &[y])
}
