//! Convolution and pooling.

use super::{not_yet, same_dtype, Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::op::{AutoPad, Col2Im, Conv, ConvTranspose, DeformConv, Pool, PoolKind, Window};
use crate::{DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Conv(c) => conv(c, ops, ctx),
        Op::QConv(c) => qconv(c, ops, ctx),
        Op::Pool(p) => pool(p, ops, ctx),
        Op::GlobalPool(k) => global_pool(*k, ops),
        Op::ConvTranspose(c) => conv_transpose(c, ops, ctx),
        Op::Col2Im(c) => col2im(c, ops, ctx),
        Op::DeformConv(d) => deform_conv(d, ops),
        _ => not_yet(op),
    }
}

/// Output spatial sizes for `x` of shape [N, C, spatial...] and kernel sizes `kernel`.
fn spatial_out(
    window: &Window,
    x: &TensorType,
    kernel: &[Dim],
    ceil_mode: bool,
    ctx: &Ctx,
) -> Result<Vec<Dim>, OpError> {
    let spatial = x.rank() - 2;
    window.check(spatial)?;
    (0..spatial)
        .map(|i| match (&x.shape.0[2 + i], kernel[i].fixed()) {
            (Dim::Fixed(n), Some(k)) => {
                window.resolve(i, *n, k, ceil_mode).map(|a| Dim::Fixed(a.output))
            }
            _ => Ok(ctx.fresh(2 + i)),
        })
        .collect()
}

/// The checks Conv and ConvTranspose share: float input and weight of equal rank (3 or more) and
/// a positive group count. `layout` names the weight's layout for the message.
fn check_conv_operands(
    x: &TensorType,
    w: &TensorType,
    group: usize,
    layout: &str,
) -> Result<(), OpError> {
    same_dtype("input and weight", x, w)?;
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    if x.rank() < 3 || w.rank() != x.rank() {
        return Err(invalid!("input [N, C, spatial...] and weight {layout} must have the same rank of 3 or more, got {x} and {w}"));
    }
    if group == 0 {
        return Err("group must be positive".into());
    }
    Ok(())
}

/// An optional bias (operand 2) must be [M].
fn check_bias(ops: &Operands, x: &TensorType, m: &Dim) -> Result<(), OpError> {
    if let Some(b) = ops.opt(2) {
        same_dtype("input and bias", x, b.ty)?;
        let ok = b.ty.rank() == 1
            && match (&b.ty.shape.0[0], m) {
                (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
                _ => true,
            };
        if !ok {
            return Err(invalid!("bias must be [M] = [{m}], got {}", b.ty));
        }
    }
    Ok(())
}

/// A convolution's channels against its weight [M, C/group, ...] and group count; M.
fn check_groups(x: &TensorType, w: &TensorType, group: usize) -> Result<Dim, OpError> {
    if let (Dim::Fixed(cin), Dim::Fixed(cw)) = (&x.shape.0[1], &w.shape.0[1]) {
        if *cin != cw * group {
            return Err(invalid!(
                "input has {cin} channels but weight {w} with group {group} expects {}",
                cw * group
            ));
        }
    }
    let m = w.shape.0[0].clone();
    if let Dim::Fixed(m) = m {
        if m % group != 0 {
            return Err(invalid!("{m} output channels do not split into {group} groups"));
        }
    }
    Ok(m)
}

pub(super) fn conv(c: &Conv, ops: &Operands, ctx: &Ctx) -> Infer {
    let (x, w) = (ops.get(0)?.ty, ops.get(1)?.ty);
    check_conv_operands(x, w, c.group, "[M, C/group, kernel...]")?;
    let m = check_groups(x, w, c.group)?;
    check_bias(ops, x, &m)?;
    let mut dims = vec![x.shape.0[0].clone(), m];
    dims.extend(spatial_out(&c.window, x, &w.shape.0[2..], false, ctx)?);
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn pool(p: &Pool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_numeric() {
        return Err(OpError::NeedsType { class: "numeric", ty: Box::new(x.clone()) });
    }
    if x.rank() < 3 {
        return Err(invalid!("input must be [N, C, spatial...], got {x}"));
    }
    if p.kernel.len() != x.rank() - 2 {
        return Err(invalid!(
            "kernel_shape {:?} does not match the {} spatial dimensions of {x}",
            p.kernel,
            x.rank() - 2
        ));
    }
    if p.kernel.contains(&0) {
        return Err(invalid!("kernel_shape {:?} has a zero size", p.kernel));
    }
    if p.kind == (PoolKind::Lp { p: 0 }) {
        return Err("LpPool needs p >= 1".into());
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

pub(super) fn global_pool(kind: PoolKind, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_numeric() {
        return Err(OpError::NeedsType { class: "numeric", ty: Box::new(x.clone()) });
    }
    if kind == (PoolKind::Lp { p: 0 }) {
        return Err("GlobalLpPool needs p >= 1".into());
    }
    if x.rank() < 3 {
        return Err(invalid!("input must be [N, C, spatial...], got {x}"));
    }
    let mut dims = x.shape.0[..2].to_vec();
    dims.resize(x.rank(), Dim::Fixed(1));
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// The spatial geometry of a transposed convolution on one axis: where input position 0 lands
/// (`-pad_begin`) and the output size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransposeAxis {
    pub stride: usize,
    pub dilation: usize,
    /// May be negative: the output then starts before the full result (ONNX derives negative
    /// padding when `output_shape` or SAME asks for more than the full size).
    pub pad_begin: i64,
    pub output: usize,
}

/// Checks ConvTranspose's attribute lists for `spatial` spatial dimensions.
fn check_transpose_attrs(c: &ConvTranspose, spatial: usize) -> Result<(), OpError> {
    c.window.check(spatial)?;
    if !c.output_padding.is_empty() && c.output_padding.len() != spatial {
        return Err(invalid!(
            "output_padding has {} entries, {spatial} expected",
            c.output_padding.len()
        ));
    }
    // ONNX allows output_shape with or without the N and C dimensions.
    if !c.output_shape.is_empty()
        && c.output_shape.len() != spatial
        && c.output_shape.len() != spatial + 2
    {
        return Err(invalid!(
            "output_shape {:?} must have {spatial} spatial entries",
            c.output_shape
        ));
    }
    Ok(())
}

/// Resolves spatial axis `i` of a transposed convolution for input size `input` and kernel size
/// `kernel`, following the ONNX reference: with `output_shape` or SAME_*, the total padding is
/// `full - output` split in half (the odd one at the end for SAME_UPPER, else at the start), with
/// floor division, so it may be negative; otherwise the explicit pads (VALID: none).
pub fn transpose_axis(
    c: &ConvTranspose,
    i: usize,
    spatial: usize,
    input: usize,
    kernel: usize,
) -> Result<TransposeAxis, OpError> {
    let (stride, dilation) = (c.window.stride(i), c.window.dilation(i));
    if input == 0 || kernel == 0 {
        return Err(invalid!("spatial axis {i} has input size {input} and kernel size {kernel}; both must be positive"));
    }
    let adj = c.output_padding.get(i).copied().unwrap_or(0);
    // In i128 so that absurd attribute values are an error, not an overflow.
    let wide = |v: usize| v as i128;
    let full =
        wide(stride) * (wide(input) - 1) + wide(adj) + wide(dilation) * (wide(kernel) - 1) + 1;
    let wanted = if !c.output_shape.is_empty() {
        Some(wide(c.output_shape[c.output_shape.len() - spatial + i]))
    } else if matches!(c.window.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
        Some(wide(input) * wide(stride))
    } else {
        None
    };
    let (pad_begin, output) = match wanted {
        Some(out) => {
            let total = full - out;
            let half = total.div_euclid(2);
            let begin = if c.window.auto_pad == AutoPad::SameUpper { half } else { total - half };
            (begin, out)
        }
        None => {
            let (begin, end) = match c.window.auto_pad {
                AutoPad::Valid => (0, 0),
                _ => (
                    c.window.pads.get(i).copied().unwrap_or(0),
                    c.window.pads.get(spatial + i).copied().unwrap_or(0),
                ),
            };
            let out = full - wide(begin) - wide(end);
            if out <= 0 {
                return Err(invalid!(
                    "pads {begin} and {end} remove the whole output ({full}) on spatial axis {i}"
                ));
            }
            (wide(begin), out)
        }
    };
    if output == 0 {
        return Err(invalid!("output_shape gives size 0 on spatial axis {i}"));
    }
    let too_big = || format!("the output of spatial axis {i} is too large");
    Ok(TransposeAxis {
        stride,
        dilation,
        pad_begin: i64::try_from(pad_begin).map_err(|_| too_big())?,
        output: usize::try_from(output)
            .ok()
            .filter(|&o| o <= isize::MAX as usize)
            .ok_or_else(too_big)?,
    })
}

pub(super) fn conv_transpose(c: &ConvTranspose, ops: &Operands, ctx: &Ctx) -> Infer {
    let (x, w) = (ops.get(0)?.ty, ops.get(1)?.ty);
    check_conv_operands(x, w, c.group, "[C, M/group, kernel...]")?;
    let spatial = x.rank() - 2;
    check_transpose_attrs(c, spatial)?;
    if let Dim::Fixed(cin) = x.shape.0[1] {
        if cin % c.group != 0 {
            return Err(invalid!(
                "{cin} input channels of {x} do not split into {} groups",
                c.group
            ));
        }
        if let Dim::Fixed(cw) = w.shape.0[0] {
            if cw != cin {
                return Err(invalid!("input {x} has {cin} channels but weight {w} is for {cw}"));
            }
        }
    }
    let m = match &w.shape.0[1] {
        Dim::Fixed(mg) => Dim::Fixed(mg * c.group),
        d if c.group == 1 => d.clone(),
        _ => ctx.fresh(1),
    };
    check_bias(ops, x, &m)?;
    let mut dims = vec![x.shape.0[0].clone(), m];
    for i in 0..spatial {
        let d = match (&x.shape.0[2 + i], w.shape.0[2 + i].fixed()) {
            (Dim::Fixed(n), Some(k)) => Dim::Fixed(transpose_axis(c, i, spatial, *n, k)?.output),
            // The output size is known without the input's when output_shape gives it.
            _ if !c.output_shape.is_empty() => {
                Dim::Fixed(c.output_shape[c.output_shape.len() - spatial + i])
            }
            _ => ctx.fresh(2 + i),
        };
        dims.push(d);
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// kiln's integer convolution (ONNX QLinearConv's operands): 8-bit input and weight, one scale
/// and zero point for the input and the result, one or one per output channel for the weight,
/// an int32 bias `[M]`; the result has the result zero point's type.
pub(super) fn qconv(c: &Conv, ops: &Operands, ctx: &Ctx) -> Infer {
    let (x, w) = (ops.get(0)?.ty, ops.get(3)?.ty);
    let byte = |t: &TensorType| matches!(t.dtype, DType::U8 | DType::I8);
    if !byte(x) || !byte(w) {
        return Err(invalid!("needs 8-bit integer input and weight, got {x} and {w}"));
    }
    if x.rank() < 3 || w.rank() != x.rank() || c.group == 0 {
        return Err(invalid!("input [N, C, spatial...] and weight [M, C/group, kernel...] must have the same rank of 3 or more and group be positive, got {x} and {w}"));
    }
    let m = check_groups(x, w, c.group)?;
    let one = |t: &TensorType| t.shape.numel() == Some(1) && t.rank() <= 1;
    let per_channel = |t: &TensorType| {
        one(t) || (t.rank() == 1 && (t.shape.0[0] == m || !matches!(t.shape.0[0], Dim::Fixed(_))))
    };
    let names =
        ["x_scale", "x_zero_point", "", "w_scale", "w_zero_point", "y_scale", "y_zero_point"];
    for (i, name) in names.iter().enumerate().map(|(i, n)| (i + 1, n)) {
        if i == 3 {
            continue;
        }
        let t = ops.get(i)?.ty;
        let scale = matches!(i, 1 | 4 | 6);
        if scale && !t.dtype.is_float() {
            return Err(invalid!("{name} must be a float, got {t}"));
        }
        if i == 2 && t.dtype != x.dtype || i == 5 && t.dtype != w.dtype {
            return Err(invalid!("{name} {t} must have the type of what it shifts"));
        }
        if i == 7 && !matches!(t.dtype, DType::U8 | DType::I8) {
            return Err(invalid!("{name} must be an 8-bit integer, got {t}"));
        }
        let ok = if matches!(i, 4 | 5) { per_channel(t) } else { one(t) };
        if !ok {
            return Err(invalid!(
                "{name} {t} must be one value{}",
                if matches!(i, 4 | 5) { " or one per output channel" } else { "" }
            ));
        }
    }
    if let Some(b) = ops.opt(8) {
        if b.ty.dtype != DType::I32
            || b.ty.rank() != 1
            || !per_channel(b.ty)
            || one(b.ty) && m != Dim::Fixed(1)
        {
            return Err(invalid!("bias must be int32 [M] = [{m}], got {}", b.ty));
        }
    }
    let mut dims = vec![x.shape.0[0].clone(), m];
    dims.extend(spatial_out(&c.window, x, &w.shape.0[2..], false, ctx)?);
    Ok(vec![TensorType::new(ops.get(7)?.ty.dtype, Shape(dims))])
}

/// Where Col2Im's columns go: for an image of `image` and blocks of `block`, with the node's
/// strides, pads and dilations.
#[derive(Clone, Debug, PartialEq)]
pub struct Col2ImPlan {
    pub image: Vec<usize>,
    /// Elements in one block (the product of the block shape).
    pub block: usize,
    /// Block positions per axis, and in all (`L`, the input's last axis).
    pub positions: Vec<usize>,
    pub columns: usize,
    /// For block element `k` (row-major over the block) at block position `l` (row-major over
    /// the positions), at `k * columns + l`: the flat image element it adds to, or `None` where
    /// it falls in the padding.
    pub targets: Vec<Option<usize>>,
}

impl Col2ImPlan {
    pub fn new(c: &Col2Im, image: &[i64], block: &[i64]) -> Result<Col2ImPlan, OpError> {
        let n = image.len();
        if block.len() != n || n == 0 {
            return Err(invalid!(
                "image_shape {image:?} and block_shape {block:?} must have one entry per image axis"
            ));
        }
        let or_ones = |v: &[usize], what: &str, len: usize, default: usize| match v.len() {
            0 => Ok(vec![default; len]),
            l if l == len => Ok(v.to_vec()),
            _ => Err(invalid!("{what} {v:?} must have {len} entries")),
        };
        let strides = or_ones(&c.strides, "strides", n, 1)?;
        let dilations = or_ones(&c.dilations, "dilations", n, 1)?;
        let pads = or_ones(&c.pads, "pads", 2 * n, 0)?;
        if strides.contains(&0) || dilations.contains(&0) {
            return Err(invalid!("strides and dilations must be positive"));
        }
        let size = |v: i64, what: &str| {
            usize::try_from(v)
                .ok()
                .filter(|&s| s > 0 && s <= 1 << 31)
                .ok_or_else(|| invalid!("{what} must hold sizes from 1 to 2^31, got {v}"))
        };
        let image: Vec<usize> =
            image.iter().map(|&d| size(d, "image_shape")).collect::<Result<_, _>>()?;
        let block_dims: Vec<usize> =
            block.iter().map(|&d| size(d, "block_shape")).collect::<Result<_, _>>()?;
        let mut positions = Vec::with_capacity(n);
        for i in 0..n {
            // Sizes up to 2^31 and attributes read from an int64 list: u128 cannot overflow.
            let padded = image[i] as u128 + pads[i] as u128 + pads[n + i] as u128;
            let span = dilations[i] as u128 * (block_dims[i] as u128 - 1) + 1;
            if padded < span {
                return Err(invalid!(
                    "a block of {block:?} (dilations {dilations:?}) does not fit the padded image {image:?}"
                ));
            }
            positions.push(((padded - span) / strides[i] as u128 + 1) as usize);
        }
        let block_len = checked_product(&block_dims)?;
        let columns = checked_product(&positions)?;
        let entries =
            block_len.checked_mul(columns).filter(|&e| e <= 1 << 28).ok_or_else(|| {
                invalid!("{block_len} block elements at {columns} positions are too many")
            })?;
        let mut targets = Vec::with_capacity(entries);
        for k in 0..block_len {
            let kk = unravel(k, &block_dims);
            for l in 0..columns {
                let ll = unravel(l, &positions);
                let mut flat = Some(0usize);
                for i in 0..n {
                    let at = (ll[i] * strides[i] + kk[i] * dilations[i]) as i128 - pads[i] as i128;
                    flat = match flat {
                        Some(f) if (0..image[i] as i128).contains(&at) => {
                            Some(f * image[i] + at as usize)
                        }
                        _ => None,
                    };
                }
                targets.push(flat);
            }
        }
        Ok(Col2ImPlan { image, block: block_len, positions, columns, targets })
    }
}

fn checked_product(dims: &[usize]) -> Result<usize, OpError> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid!("{dims:?} has too many elements"))
}

/// The row-major multi-index of flat position `i` in `dims`.
fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for (slot, &d) in idx.iter_mut().zip(dims).rev() {
        *slot = i % d;
        i /= d;
    }
    idx
}

/// Col2Im: `[N, C * prod(block), L]` to `[N, C, image...]`; the image and block shapes must be
/// known (constants) for the result's shape and for `L` to be checked.
fn col2im(c: &Col2Im, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    if x.rank() != 3 {
        return Err(invalid!("input must be [N, C * prod(block_shape), L], got {x}"));
    }
    if !x.dtype.is_numeric() {
        return Err(invalid!("needs a numeric tensor, got {x}"));
    }
    let (image, block) = (ops.ints(1, "image_shape")?, ops.ints(2, "block_shape")?);
    let (Some(Some(image)), Some(Some(block))) = (image, block) else {
        let rank = ops.get(1)?.ty.shape.0.first().and_then(Dim::fixed);
        let rank = rank.ok_or_else(|| invalid!("image_shape must have a known length"))?;
        let mut shape = ctx.fresh_shape(rank + 2)?;
        shape.0[0] = x.shape.0[0].clone();
        return Ok(vec![TensorType::new(x.dtype, shape)]);
    };
    let plan = Col2ImPlan::new(c, &image, &block)?;
    let channels = match &x.shape.0[1] {
        Dim::Fixed(cb) => {
            if cb % plan.block != 0 {
                return Err(invalid!(
                    "input channels {cb} are not a multiple of the block's {} elements",
                    plan.block
                ));
            }
            Dim::Fixed(cb / plan.block)
        }
        _ => ctx.fresh(1),
    };
    if let Dim::Fixed(l) = x.shape.0[2] {
        if l != plan.columns {
            return Err(invalid!(
                "input has {l} columns, but blocks of {block:?} fit {} times in the image {image:?}",
                plan.columns
            ));
        }
    }
    let mut dims = vec![x.shape.0[0].clone(), channels];
    dims.extend(plan.image.iter().map(|&d| Dim::Fixed(d)));
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// Where DeformConv's taps lie and how its channels group, for known operand shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeformPlan {
    pub batch: usize,
    pub channels: usize,
    /// The input image `[height, width]`.
    pub image: [usize; 2],
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub output: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads_begin: [usize; 2],
    pub group: usize,
    pub offset_group: usize,
}

impl DeformPlan {
    /// Checks the operands' shapes (`[N, C, H, W]`, `[M, C / group, kH, kW]`, the offsets
    /// `[N, offset_group * kH * kW * 2, oH, oW]`, the mask `[N, offset_group * kH * kW, oH, oW]`,
    /// the bias `[M]`) against each other and the attributes.
    pub fn new(
        d: &DeformConv,
        x: &[usize],
        w: &[usize],
        offset: &[usize],
        bias: Option<&[usize]>,
        mask: Option<&[usize]>,
    ) -> Result<DeformPlan, OpError> {
        let (&[n, c, h, wd], &[m, cg, kh, kw], &[on, oc, oh, ow]) = (x, w, offset) else {
            return Err(invalid!(
                "needs 2-D images: x [N, C, H, W], w [M, C/group, kH, kW] and offset [N, 2 * offset_group * kH * kW, oH, oW], got {x:?}, {w:?} and {offset:?}"
            ));
        };
        let pair = |v: &[usize], what: &str, default: usize| match v.len() {
            0 => Ok([default; 2]),
            2 => Ok([v[0], v[1]]),
            _ => Err(invalid!("{what} {v:?} must have 2 entries")),
        };
        let strides = pair(&d.strides, "strides", 1)?;
        let dilations = pair(&d.dilations, "dilations", 1)?;
        let kernel = if d.kernel_shape.is_empty() {
            [kh, kw]
        } else {
            pair(&d.kernel_shape, "kernel_shape", 1)?
        };
        let pads = match d.pads.len() {
            0 => [0; 4],
            4 => [d.pads[0], d.pads[1], d.pads[2], d.pads[3]],
            _ => return Err(invalid!("pads {:?} must have 4 entries", d.pads)),
        };
        if strides.contains(&0) || dilations.contains(&0) || d.group == 0 || d.offset_group == 0 {
            return Err(invalid!("strides, dilations, group and offset_group must be positive"));
        }
        if kernel != [kh, kw] {
            return Err(invalid!("kernel_shape {kernel:?} is not the weight's {:?}", [kh, kw]));
        }
        if c % d.group != 0 || c / d.group != cg || m % d.group != 0 {
            return Err(invalid!(
                "{c} input and {m} output channels do not split into {} groups of the weight's {cg}",
                d.group
            ));
        }
        if c % d.offset_group != 0 {
            return Err(invalid!(
                "{c} channels do not split into {} offset groups",
                d.offset_group
            ));
        }
        // Sizes of real tensors (at most 2^63 bytes): the sums below cannot overflow in u128.
        let mut output = [0; 2];
        for (a, (&size, &k)) in [h, wd].iter().zip(&[kh, kw]).enumerate() {
            let padded = size as u128 + pads[a] as u128 + pads[2 + a] as u128;
            let span = (dilations[a] as u128) * (k.max(1) as u128 - 1) + 1;
            if k == 0 || padded < span {
                return Err(invalid!(
                    "a {kh} x {kw} kernel does not fit the padded {h} x {wd} image"
                ));
            }
            output[a] = ((padded - span) / strides[a] as u128 + 1) as usize;
        }
        // kh * kw is the size of a real weight's planes; offset_group is an attribute.
        let taps = kh * kw;
        let groups_of_taps = d
            .offset_group
            .checked_mul(taps)
            .filter(|g| g.checked_mul(2).is_some())
            .ok_or_else(|| invalid!("offset_group {} is too large", d.offset_group))?;
        let want_offset = [n, groups_of_taps * 2, output[0], output[1]];
        if [on, oc, oh, ow] != want_offset {
            return Err(invalid!("offset {offset:?} must be {want_offset:?}"));
        }
        if let Some(mask) = mask {
            let want = [n, groups_of_taps, output[0], output[1]];
            if mask != want {
                return Err(invalid!("mask {mask:?} must be {want:?}"));
            }
        }
        if let Some(b) = bias {
            if b != [m] {
                return Err(invalid!("bias {b:?} must be [{m}]"));
            }
        }
        Ok(DeformPlan {
            batch: n,
            channels: c,
            image: [h, wd],
            out_channels: m,
            kernel: [kh, kw],
            output,
            strides,
            dilations,
            pads_begin: [pads[0], pads[1]],
            group: d.group,
            offset_group: d.offset_group,
        })
    }

    /// The undeformed place of tap `k` (of kernel axis `a`) for output position `o`.
    pub fn base(&self, a: usize, o: usize, k: usize) -> f64 {
        (o * self.strides[a] + k * self.dilations[a]) as f64 - self.pads_begin[a] as f64
    }
}

/// DeformConv: `[N, M, oH, oW]`.
fn deform_conv(d: &DeformConv, ops: &Operands) -> Infer {
    let (x, w, offset) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    let (bias, mask) = (ops.opt(3).map(|o| o.ty), ops.opt(4).map(|o| o.ty));
    for t in [Some(x), Some(w), Some(offset), bias, mask].into_iter().flatten() {
        if !t.dtype.is_float() {
            return Err(OpError::NeedsType { class: "float", ty: Box::new(t.clone()) });
        }
        same_dtype("operands", x, t)?;
    }
    if x.rank() != 4 || w.rank() != 4 || offset.rank() != 4 {
        return Err(invalid!(
            "needs 2-D images: x [N, C, H, W], w [M, C/group, kH, kW] and offset [N, 2 * offset_group * kH * kW, oH, oW], got {x}, {w} and {offset}"
        ));
    }
    let fixed = |t: Option<&TensorType>| t.map(|t| t.shape.as_fixed());
    match (
        x.shape.as_fixed(),
        w.shape.as_fixed(),
        offset.shape.as_fixed(),
        fixed(bias),
        fixed(mask),
    ) {
        (Some(xd), Some(wd), Some(od), None | Some(Some(_)), None | Some(Some(_))) => {
            let plan = DeformPlan::new(
                d,
                &xd,
                &wd,
                &od,
                fixed(bias).flatten().as_deref(),
                fixed(mask).flatten().as_deref(),
            )?;
            let dims = [plan.batch, plan.out_channels, plan.output[0], plan.output[1]];
            Ok(vec![TensorType::new(x.dtype, dims)])
        }
        _ => {
            let dims = vec![
                x.shape.0[0].clone(),
                w.shape.0[0].clone(),
                offset.shape.0[2].clone(),
                offset.shape.0[3].clone(),
            ];
            Ok(vec![TensorType::new(x.dtype, Shape(dims))])
        }
    }
}
