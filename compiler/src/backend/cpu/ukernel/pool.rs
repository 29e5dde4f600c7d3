//! Max and average pooling (`Shape::Pool`, `pool.c`; max pooling of u8 in `quantized.c`): the
//! shape read from a Pool root (the rest of its planning is `tiled`'s), its description and its
//! call. Nothing is packed.

use std::fmt;

use kiln_ir::op::{Pool as PoolOp, PoolKind};
use kiln_ir::{Graph, ValueId};
use melior::ir::Value;

use super::tiled::Root;
use super::window_text;
use super::{
    describe_channel_chunks, describe_epilogue, other_shape, Call, KernelShape, Pointers, Shape,
    Ukernel,
};
use crate::Result;

/// Pooling: `kiln_uk_pool2d`, or `kiln_uk_maxpool_u8` for bytes.
pub(super) struct Pool;

/// A Pool root as the kernel takes it: max (of f32, or of u8 where `u8_max_pool`) or average
/// without ceil mode, over one or two spatial axes.
pub(super) fn shape(
    graph: &Graph,
    operands: &[Option<ValueId>],
    p: &PoolOp,
    u8_max_pool: bool,
) -> Option<Root> {
    let x = operands.first().copied().flatten()?;
    let xd = graph.value_type(x).shape.as_fixed()?;
    let kind = match p.kind {
        PoolKind::Max if u8_max_pool => 3,
        PoolKind::Max => 0,
        PoolKind::Average { count_include_pad } if !p.ceil_mode => 1 + u8::from(!count_include_pad),
        _ => return None,
    };
    if !(3..=4).contains(&xd.len()) || p.kernel.len() != xd.len() - 2 {
        return None;
    }
    let spatial = xd.len() - 2;
    let mut axes = Vec::new();
    for i in 0..spatial {
        axes.push(p.window.resolve(i, xd[2 + i], p.kernel[i], p.ceil_mode).ok()?);
    }
    let a = axes.last()?;
    let (hx, kh, sh, dh, ph, phe, oh) = if spatial == 2 {
        let b = &axes[0];
        (xd[2], p.kernel[0], b.stride, b.dilation, b.pad_begin, b.pad_end, b.output)
    } else {
        (1, 1, 1, 1, 0, 0, 1)
    };
    let shape = Shape::Pool {
        batch: xd[0],
        c: xd[1],
        h: hx,
        w: xd[xd.len() - 1],
        kh,
        kw: p.kernel[spatial - 1],
        stride: [sh, a.stride],
        dilation: [dh, a.dilation],
        pad: [ph, a.pad_begin],
        pad_end: [phe, a.pad_end],
        oh,
        ow: a.output,
        kind,
    };
    Some((shape, x, x, None))
}

impl KernelShape for Pool {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Pool { batch, c, kh, kw, stride, dilation, pad, oh, ow, kind, .. } = u.shape
        else {
            return Err(fmt::Error);
        };
        writeln!(
            f,
            "microkernel: {} pooling, {batch} image(s) of {c} channels {oh}x{ow} ({})",
            ["max", "average (pads counted)", "average", "u8 max"][kind as usize],
            window_text([kh, kw], stride, dilation, pad)
        )?;
        if kind == 3 {
            writeln!(f, "separable: per output row the window's rows' maxima (on vectors), then each output's taps along the row")?;
        } else {
            writeln!(f, "separable: each input row reduced along it once (from a padded row buffer), then {kh} row results per output vector; bands of 8 output rows")?;
        }
        describe_channel_chunks(u, f)?;
        describe_epilogue(u, f)
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Pool { c, h, w, kh, kw, stride, dilation, pad, pad_end, oh, ow, kind, .. } =
            u.shape
        else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, p.y];
        args.extend(call.ints(&[
            c,
            h,
            w,
            kh,
            kw,
            stride[0],
            stride[1],
            dilation[0],
            dilation[1],
            pad[0],
            pad[1],
            pad_end[0],
            pad_end[1],
            oh,
            ow,
            kind as usize,
        ]));
        args.extend(call.activation(&u.epilogue));
        args.extend(call.ints(&[u.chunks]));
        Ok((if kind == 3 { "kiln_uk_maxpool_u8" } else { "kiln_uk_pool2d" }, args))
    }
}
