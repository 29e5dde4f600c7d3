//! Convolutions (`Shape::Conv`, `conv.c`; depthwise ones `depthwise.c`) and transposed
//! convolutions (`Shape::ConvTranspose`, `conv.c`), both on the packed GEMM (`gemm.c`): their
//! shapes read from the root op (the rest of their planning is `tiled`'s), their descriptions,
//! their weights packed and their calls.

use std::fmt;

use kiln_ir::op::{Conv as ConvOp, ConvTranspose as ConvTransposeOp};
use kiln_ir::{Graph, ValueId};
use melior::ir::Value;

use super::tiled::Root;
use super::window_text;
use super::{
    bf16_bits, bf16_bytes, describe_channel_chunks, describe_epilogue, describe_tiles, f32_bytes,
    operand_bias, other_shape, weight_f32s, Call, DepthwiseForm, Host, KernelShape, Pointers,
    Shape, Ukernel, NR,
};
use crate::fuse::Kernel;
use crate::{CompileError, Result};

/// Convolutions, grouped and depthwise: `kiln_uk_conv2d` and `kiln_uk_depthwise`.
pub(super) struct Conv;

/// Transposed convolutions: `kiln_uk_conv_transpose`.
pub(super) struct ConvTranspose;

/// A Conv root as the kernel takes it: f32 (checked by `tiled::plan`), 1-D or 2-D, a constant
/// weight, groups that divide the channels, and a bias that is a constant or none.
pub(super) fn shape(graph: &Graph, operands: &[Option<ValueId>], c: &ConvOp) -> Option<Root> {
    let dims = |v: ValueId| graph.value_type(v).shape.as_fixed();
    let (x, w) = (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let (xd, wd) = (dims(x)?, dims(w)?);
    let g = c.group;
    if g == 0 || xd.len() < 3 || xd[1] % g != 0 || wd[0] % g != 0 || wd[1] * g != xd[1] {
        return None;
    }
    if !(3..=4).contains(&xd.len()) || wd.len() != xd.len() || graph.constant_value(w).is_none() {
        return None;
    }
    let spatial = xd.len() - 2;
    let mut axes = Vec::new();
    for i in 0..spatial {
        axes.push(c.window.resolve(i, xd[2 + i], wd[2 + i], false).ok()?);
    }
    let (h, kh, kw, stride, dilation, pad, oh, ow) =
        plane(&xd, &wd, axes.iter().map(|a| (a.stride, a.dilation, a.pad_begin as i64, a.output)))?;
    let pad = [pad[0] as usize, pad[1] as usize];
    let shape = Shape::Conv {
        batch: xd[0],
        c: xd[1],
        h,
        w: xd[xd.len() - 1],
        m: wd[0],
        group: g,
        kh,
        kw,
        stride,
        dilation,
        pad,
        oh,
        ow,
    };
    Some((shape, x, w, operand_bias(graph, operands.get(2).copied().flatten(), wd[0])?))
}

/// A ConvTranspose root as the kernel takes it: one group, 1-D or 2-D, a constant weight, and a
/// bias that is a constant or none.
pub(super) fn transpose_shape(
    graph: &Graph,
    operands: &[Option<ValueId>],
    c: &ConvTransposeOp,
) -> Option<Root> {
    let dims = |v: ValueId| graph.value_type(v).shape.as_fixed();
    let (x, w) = (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let (xd, wd) = (dims(x)?, dims(w)?);
    if c.group != 1
        || !(3..=4).contains(&xd.len())
        || wd.len() != xd.len()
        || wd[0] != xd[1]
        || graph.constant_value(w).is_none()
    {
        return None;
    }
    let spatial = xd.len() - 2;
    let mut axes = Vec::new();
    for i in 0..spatial {
        axes.push(kiln_ir::infer::transpose_axis(c, i, spatial, xd[2 + i], wd[2 + i]).ok()?);
    }
    let (h, kh, kw, stride, dilation, pad, oh, ow) =
        plane(&xd, &wd, axes.iter().map(|a| (a.stride, a.dilation, a.pad_begin, a.output)))?;
    let shape = Shape::ConvTranspose {
        batch: xd[0],
        cin: xd[1],
        h,
        w: xd[xd.len() - 1],
        cout: wd[1],
        kh,
        kw,
        stride,
        dilation,
        pad,
        oh,
        ow,
    };
    Some((shape, x, w, operand_bias(graph, operands.get(2).copied().flatten(), wd[1])?))
}

/// A window over one or two spatial axes as the 2-D one the kernels take (a 1-D window is a 2-D
/// one of height 1): input height, kernel size, stride, dilation, begin padding and output size
/// per axis, from the input and weight dims and each axis's (stride, dilation, pad, output).
#[allow(clippy::type_complexity)]
fn plane(
    xd: &[usize],
    wd: &[usize],
    axes: impl Iterator<Item = (usize, usize, i64, usize)>,
) -> Option<(usize, usize, usize, [usize; 2], [usize; 2], [i64; 2], usize, usize)> {
    let axes: Vec<_> = axes.collect();
    let (sw, dw, pw, ow) = *axes.last()?;
    let (h, kh, (sh, dh, ph, oh)) = match axes.len() {
        2 => (xd[2], wd[2], axes[0]),
        1 => (1, 1, (1, 1, 0, 1)),
        _ => return None,
    };
    Some((h, kh, wd[wd.len() - 1], [sh, sw], [dh, dw], [ph, pw], oh, ow))
}

impl KernelShape for Conv {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = u.mnk();
        let Shape::Conv { batch, c, group, kh, kw, stride, dilation, pad, oh, ow, .. } = u.shape
        else {
            return Err(fmt::Error);
        };
        let window = window_text([kh, kw], stride, dilation, pad);
        if let Some(form) = u.depthwise_form() {
            writeln!(f, "microkernel: depthwise conv, {batch} image(s) of {c} channels {oh}x{ow} ({window})")?;
            writeln!(f, "{}", match form {
                DepthwiseForm::Blocked => "channel-blocked (NCHW16c) in and out: vectors of 16 channels of one position, one FMA a tap, 4 positions at a time",
                DepthwiseForm::Rows => "vectors of 16 outputs along each row, one FMA a tap; the plane copied once, zero-padded",
                DepthwiseForm::Regrouped => "each 16 channels regrouped through 16x16 transposes into vectors of 16 channels of one position, one FMA a tap, 4 positions at a time, and back",
            })?;
            describe_channel_chunks(u, f)?;
        } else {
            let groups =
                if group > 1 { format!(" in each of {group} groups") } else { String::new() };
            writeln!(f, "microkernel: conv as implicit GEMM, {batch} image(s) of M={m} N={n} K={k}{groups} ({window})")?;
            let b = if u.blocked.input || u.blocked.output {
                match (u.blocked.input, u.blocked.output, u.transposed) {
                    (true, true, _) => "channel-blocked (NCHW16c) in and out: C^T = x^T (read where it lies) x W^T, vectors along output channels, stored where they lie",
                    (true, false, true) => "channel-blocked (NCHW16c) in: C^T = x^T (read where it lies) x W^T, vectors along output channels, stored transposed to NCHW",
                    (true, false, false) => "channel-blocked (NCHW16c) in: B (the input) packed at run time through 16x16 transposes",
                    _ => "channel-blocked (NCHW16c) out: C^T = x^T (packed at run time) x W^T, vectors along output channels, stored where they lie",
                }
            } else if u.amx {
                "bf16 products on AMX tiles (tdpbf16ps: 16 channels x 16 positions x 32 products a step), f32 sums in 4 accumulator tiles, 32 channels x 32 positions: weights rounded to bf16 in 16-channel tiles of channel pairs, B read direct from a bf16 copy of the input in stride-phase planes, channel pairs interleaved, a tile's rows a pair's planes apart"
            } else if u.bf16 {
                "bf16 products with vdpbf16ps, f32 sums: weights rounded to bf16 in channel pairs, B read direct from a bf16 copy of the input in stride-phase planes, channel pairs interleaved"
            } else if u.transposed {
                "transposed: C^T = im2col^T (packed at run time) x W^T, vectors along output channels"
            } else if u.channel_vectors > 0 {
                "vectors along output channels, each input float broadcast from a padded copy of the input in stride-phase planes (no im2col, no padding columns computed); K in blocks of KC whose weights stay in L1 over runs of NC positions, sums kept between blocks and stored transposed"
            } else if direct(u) {
                "B read direct from a padded copy of the input in stride-phase planes (no im2col)"
            } else if group == 1 {
                "B is the input as it is"
            } else {
                "B packed (im2col) at run time"
            };
            let what = match (u.transposed, u.split_n) {
                (true, true) => "position",
                (true, false) => "channel",
                (false, true) => "column",
                (false, false) => "row",
            };
            if u.channel_vectors > 0 {
                let v = u.channel_vectors;
                writeln!(f, "register tile: {} channels x {} positions; blocks KC={} NC={}; weights packed at compile time, {b}", 16 * v, channel_tile_positions(v), u.kc, u.nc)?;
                writeln!(
                    f,
                    "workgroups: {} ({} {what} chunk(s) per image)",
                    u.workgroups(),
                    u.chunks
                )?;
            } else {
                describe_tiles(u, f, direct_cols(u), b, what, " per image")?;
            }
        }
        describe_epilogue(u, f)
    }

    fn pack(&self, graph: &Graph, _kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        let w = weight_f32s(graph, u)?;
        let (m, _, k) = u.mnk();
        let Shape::Conv { c, m: channels, group, kh, kw, .. } = u.shape else {
            return Err(other_shape(u));
        };
        if u.amx {
            return Ok(bf16_bytes(pack_conv_bf16_amx(&w, m, c, kh * kw), u));
        }
        if u.bf16 {
            return Ok(bf16_bytes(pack_conv_bf16(&w, m, c, kh * kw, u.mr), u));
        }
        let mut out: Vec<f32> = Vec::new();
        if u.depthwise_form().is_some_and(|f| f != DepthwiseForm::Rows) {
            // Depthwise, channel-blocked or regrouped: [C/16, KH*KW, 16], each tap a vector of 16
            // channels (the last padded with zeros).
            out.resize(c.div_ceil(16) * 16 * k, 0.0);
            for ch in 0..c {
                for t in 0..k {
                    out[((ch / 16) * k + t) * 16 + ch % 16] = w[ch * k + t];
                }
            }
        } else if u.depthwise() {
            // Depthwise: the weights as they are, [C, KH*KW].
            out = w;
        } else if u.channel_vectors > 0 {
            out = pack_conv_channels(&w, m, k, u.channel_vectors);
        } else if u.transposed {
            // Transposed: B[k, m] = W[m, k], in strips of NR output channels.
            out.resize(channels.div_ceil(NR) * k * NR, 0.0);
            for j in 0..channels {
                for kk in 0..k {
                    out[((j / NR) * k + kk) * NR + j % NR] = w[j * k + kk];
                }
            }
        } else {
            // Per group, A = W_g[m, k] (row-major as stored), in strips of MR rows.
            let per_group = m.div_ceil(u.mr) * k * u.mr;
            out.resize(group * per_group, 0.0);
            for g in 0..group {
                for i in 0..m {
                    let (s, r) = (i / u.mr, i % u.mr);
                    for kk in 0..k {
                        out[g * per_group + (s * k + kk) * u.mr + r] = w[(g * m + i) * k + kk];
                    }
                }
            }
        }
        Ok(f32_bytes(out, u))
    }

    fn packed_floats(&self, u: &Ukernel) -> usize {
        let (m, _, k) = u.mnk();
        let Shape::Conv { c, m: channels, group, kh, kw, .. } = u.shape else { return 0 };
        if u.amx {
            let (kb, gb) = amx_pair_blocks(c);
            m.next_multiple_of(AMX_CHANNELS) * kh * kw * kb * gb
        } else if u.bf16 {
            m.div_ceil(u.mr) * c.div_ceil(2) * kh * kw * u.mr
        } else if u.depthwise_form().is_some_and(|f| f != DepthwiseForm::Rows) {
            c.div_ceil(16) * 16 * k
        } else if u.depthwise() {
            c * k
        } else if u.channel_vectors > 0 {
            m * k
        } else if u.transposed {
            channels.div_ceil(NR) * k * NR
        } else {
            group * m.div_ceil(u.mr) * k * u.mr
        }
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Conv { c, h, w, m, group, kh, kw, stride, dilation, pad, oh, ow, .. } = u.shape
        else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, p.wp, p.bias, p.res, p.y];
        if let Some(form) = u.depthwise_form() {
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
                oh,
                ow,
            ]));
            args.extend(call.activation(&u.epilogue));
            args.extend(call.ints(&[u.chunks, u.row_bands, form.code()]));
            return Ok(("kiln_uk_depthwise", args));
        }
        args.extend(call.ints(&[
            c,
            h,
            w,
            m,
            group,
            kh,
            kw,
            stride[0],
            stride[1],
            dilation[0],
            dilation[1],
            pad[0],
            pad[1],
            oh,
            ow,
        ]));
        args.extend(call.activation(&u.epilogue));
        args.extend(call.ints(&[u.kc, u.mc, u.nc, u.chunks, u.split_n as usize]));
        args.extend(call.ints(&[
            u.transposed as usize,
            u.blocked.input as usize,
            u.blocked.output as usize,
            // 0 f32, 1 bf16 on vdpbf16ps, 2 bf16 on AMX tiles.
            if u.amx { 2 } else { u.bf16 as usize },
            direct_cols(u),
            u.channel_vectors,
        ]));
        Ok(("kiln_uk_conv2d", args))
    }
}

/// Whether `kiln_uk_conv2d` reads B direct from stride-phase planes (one group, a window or a
/// stride, neither transposed nor channel-blocked), as it chooses.
fn direct(u: &Ukernel) -> bool {
    matches!(u.shape, Shape::Conv { group: 1, kh, kw, stride, .. } if kh * kw > 1 || stride != [1, 1])
        && !u.transposed
        && !u.blocked.input
        && !u.blocked.output
        && u.depthwise_form().is_none()
}

/// The direct form's strip of flat output positions (`kiln_uk_conv2d`'s `cols`): 48, an 8x48
/// register tile (24 accumulators, a third fewer broadcasts a multiply-add than 8x32; 5-8%
/// faster on the Xeon, 3x3 by 64 on 56x56 and on 160x160), where the host has AVX-512 tiles
/// (MR 8) in f32, unless a work unit's flat positions fill the wider strips worse by more than
/// that: a unit computes whole strips, so 4 rows of a 14x14 image (62 positions) take 64 as 32s
/// but 96 as 48s. Else 32.
pub(super) fn direct_cols(u: &Ukernel) -> usize {
    let Shape::Conv { oh, .. } = u.shape else { return 32 };
    if !direct(u) || u.bf16 || u.mr != 8 {
        return 32;
    }
    // The largest unit's rows (chunk_range in workspace.h).
    let rows = if u.split_n { oh.div_ceil(u.chunks.max(1)) } else { oh };
    strip_cols(&u.shape, rows, true)
}

/// The strip width for a unit of `rows` output rows: 48 where `wide` (AVX-512 tiles in f32) and
/// the unit's flat positions fill 48s within the 6% the wider tile gains, else 32.
fn strip_cols(shape: &Shape, rows: usize, wide: bool) -> usize {
    let flat = direct_flat(shape, rows);
    let (by32, by48) = (flat.div_ceil(32) * 32, flat.div_ceil(48) * 48);
    if wide && by48 * 100 < by32 * 106 {
        48
    } else {
        32
    }
}

/// The flat positions `conv_direct` computes for `rows` output rows: rows of the stride phase's
/// pitch (the output width plus the window's reach), the last ending at the output width.
fn direct_flat(shape: &Shape, rows: usize) -> usize {
    let Shape::Conv { kw, stride, dilation, ow, .. } = *shape else { return 0 };
    let pitch = ow + (kw - 1) * dilation[1] / stride[1].max(1);
    (rows.max(1) - 1) * pitch + ow
}

/// How many vectors of 16 output channels a direct convolution's register tile holds when its
/// vectors run along channels (`conv_direct_channels` in conv.c), or 0 for the form with vectors
/// along positions. In f32 on AVX-512 (32 registers: 24 accumulators, the weights' vectors) with
/// channels in whole vectors. The form along positions computes the columns each row's window
/// reaches past the image (2 of every 16 on 14x14, 2 of 9 on 7x7) and reads B unaligned, a split
/// cache line a vector; this one broadcasts each input float and reads the weights aligned, in
/// order: 3x3 convolutions on the Xeon, 1 thread, GFLOP/s positions -> channels: by 64 on 56x56
/// 170 -> 205, by 256 on 14x14 144 -> 211, by 512 on 7x7 (which took the transposed GEMM) 98 ->
/// 164. Four vectors a tile (64 channels by 6 positions) where there are 64 channels; fewer for
/// the channels left.
pub(super) fn channel_vectors(shape: &Shape, host: &Host) -> usize {
    match *shape {
        Shape::Conv { m, .. } if host.mr == 8 && direct_shape(shape) && m.is_multiple_of(16) => {
            (m / 16).min(4)
        }
        _ => 0,
    }
}

/// The output positions of a register tile of `vectors` channel vectors (conv.c's
/// channel_tile_positions): 24 accumulators where that divides, 16 for one vector.
pub(super) fn channel_tile_positions(vectors: usize) -> usize {
    match vectors {
        4 => 6,
        3 => 8,
        2 => 12,
        _ => 16,
    }
}

/// The channel-vector form's blocks (KC, NC): a K block's weights (KC x 16 x `vectors` floats)
/// in three eighths of L1, so that they stay there while every tile of a run of NC positions
/// passes (18 KiB of the Xeon's 48: KC 72 at 64 channels; 1 thread, 3x3 by 256 on 14x14, KC 72 /
/// 144 / 576: 206 / 182 / 202 GFLOP/s, by 64 on 56x56: 203 / 193 / 183); the run's sums in a
/// quarter of L2, so that they stay there between K blocks.
pub(super) fn channel_blocks(host: &Host, vectors: usize) -> (usize, usize) {
    let bytes = 64 * vectors.max(1);
    ((host.l1_bytes * 3 / 8 / bytes).max(8), (host.l2_bytes / 4 / bytes).max(16))
}

/// The channel-vector form's weights W[m, k] (k = channel, tap): per block of 16 x `vectors`
/// channels (the last as wide as the channels left), [k][block width], so that a K step's
/// vectors are consecutive.
fn pack_conv_channels(w: &[f32], m: usize, k: usize, vectors: usize) -> Vec<f32> {
    let cb = 16 * vectors;
    let mut out = vec![0.0; m * k];
    for b0 in (0..m).step_by(cb) {
        let width = cb.min(m - b0);
        for kk in 0..k {
            for j in 0..width {
                out[b0 * k + kk * width + j] = w[(b0 + j) * k + kk];
            }
        }
    }
    out
}

/// How a channel-vector direct convolution splits each image into at most `want` work units, as
/// (chunks, split_n): by output rows or by blocks of 16 x `vectors` channels, costed and dealt
/// as in [`direct_split`] (a unit's positions in whole tiles, its channels in whole vectors, plus
/// the floats it pads).
pub(super) fn channel_split(
    shape: &Shape,
    vectors: usize,
    want: usize,
    threads: usize,
) -> (usize, bool) {
    let Shape::Conv { c, m, kh, kw, oh, ow, .. } = *shape else {
        return (want, true);
    };
    let k = (c * kh * kw) as u64;
    let unit = |rows: usize, channels: usize| -> u64 {
        if rows == 0 || channels == 0 {
            return 0;
        }
        let p = channel_tile_positions(vectors.min(channels / 16).max(1));
        let macs = ((rows * ow).div_ceil(p) * p * channels.div_ceil(16) * 16) as u64 * k;
        macs + padding_cost(shape, rows)
    };
    cheaper_split(shape, 16 * vectors, want, threads, |r| unit(r, m), |n| unit(oh, n))
}

/// The bands of output rows a depthwise convolution's channel chunks split into (`blocks` of
/// them an image, `want` units wanted an image): enough for the units wanted, and enough that a
/// band's regrouped scratch (16 channels of its zero-padded input rows and of its outputs) fits
/// in half the L2 cache, beside the input and output it streams. DBNet's 8 channels of 320x320
/// were one unit with 13 MB of scratch (2 threads, 2.4 ms against onnxruntime's 1.0). The rows
/// form (windows over 64 taps) has one band.
pub(super) fn depthwise_bands(shape: &Shape, blocks: usize, want: usize, host: &Host) -> usize {
    let Shape::Conv { w, kh, kw, stride, dilation, pad, oh, ow, .. } = *shape else { return 1 };
    if kh * kw > 64 || oh == 0 || ow == 0 {
        return 1;
    }
    let wp = ((ow - 1) * stride[1] + (kw - 1) * dilation[1] + 1).max(pad[1] + w);
    let band_bytes = |rows: usize| {
        let in_rows = (rows - 1) * stride[0] + (kh - 1) * dilation[0] + 1;
        (in_rows * wp + rows * ow) * 16 * 4
    };
    let mut bands = want.div_ceil(blocks.max(1)).max(1);
    while bands < oh && band_bytes(oh.div_ceil(bands)) > host.l2_bytes / 2 {
        bands += 1;
    }
    // Equal bands: 320 rows in 13 bands of 25 (as `chunk_range` cuts them), not 14 with one empty.
    let rows = oh.div_ceil(bands.min(oh));
    oh.div_ceil(rows)
}

/// Whether a one-group convolution takes the direct form (a window or a stride), before the
/// layout pass decides on channel blocking.
pub(super) fn direct_shape(shape: &Shape) -> bool {
    matches!(*shape, Shape::Conv { group: 1, kh, kw, stride, .. } if kh * kw > 1 || stride != [1, 1])
}

/// How a direct convolution splits each image into at most `want` work units, as (chunks,
/// split_n): by output rows (each unit pads only the input rows it reads, and reads every
/// weight) or by output channels in whole register tiles (each unit pads the whole image). A
/// unit computes whole strips of flat positions, so a split by rows pays for a part-filled
/// strip in every unit, and for the narrower strips `direct_cols` takes then: 3x3 by 256 on
/// 14x14 in 4 units of rows is 4 x 64 positions on 8x32 tiles against one image's 240 on 8x48,
/// and scaled 1.6x from 1 to 2 threads where 3x3 by 64 on 56x56 (whose units fill their
/// strips) scaled 2x. Each split's units are costed (tile lanes times channels times K, a
/// narrower tile 6% dearer, plus the floats each unit pads) and dealt in order to the least
/// busy of `threads`, as threads claiming units in turn take them; the split whose busiest
/// thread has the least work wins, rows on a tie.
pub(super) fn direct_split(
    shape: &Shape,
    mr: usize,
    wide: bool,
    want: usize,
    threads: usize,
) -> (usize, bool) {
    let Shape::Conv { c, m, kh, kw, oh, .. } = *shape else {
        return (want, true);
    };
    let k = (c * kh * kw) as u64;
    let unit = |rows: usize, channels: usize, cols: usize| -> u64 {
        if rows == 0 || channels == 0 {
            return 0;
        }
        let lanes = direct_flat(shape, rows).div_ceil(cols) * cols;
        let tile_rows = (channels.div_ceil(mr) * mr) as u64;
        let macs = lanes as u64 * tile_rows * k * if cols == 48 { 100 } else { 106 } / 100;
        macs + padding_cost(shape, rows)
    };
    let by_rows = want.clamp(1, oh.max(1));
    let rows_cols = strip_cols(shape, oh.div_ceil(by_rows), wide);
    let full_cols = strip_cols(shape, oh, wide);
    cheaper_split(shape, mr, want, threads, |r| unit(r, m, rows_cols), |n| unit(oh, n, full_cols))
}

/// What padding the input planes of `rows` output rows costs a direct convolution's unit, in
/// multiply-adds: a padded float about 16 (a copy at ~10 GB/s against ~130 GFLOP/s on the
/// tiles).
fn padding_cost(shape: &Shape, rows: usize) -> u64 {
    let Shape::Conv { c, kh, kw, stride, dilation, .. } = *shape else { return 0 };
    let pitch = direct_flat(shape, 2) - direct_flat(shape, 1);
    let reach = (kh - 1) * dilation[0] / stride[0].max(1);
    let phases = (0..stride[0]).filter(|&a| phase_read(a, stride[0], kh, dilation[0])).count()
        * (0..stride[1]).filter(|&b| phase_read(b, stride[1], kw, dilation[1])).count();
    16 * ((rows + reach) * pitch * c * phases) as u64
}

/// A direct convolution's split into at most `want` units, by output rows or by output
/// channels in steps of `step`, whichever leaves the busiest of `threads` threads the least
/// work (`by_rows(rows)`, `by_channels(channels)`: a unit's cost); rows on a tie.
fn cheaper_split(
    shape: &Shape,
    step: usize,
    want: usize,
    threads: usize,
    by_rows: impl Fn(usize) -> u64,
    by_channels: impl Fn(usize) -> u64,
) -> (usize, bool) {
    let Shape::Conv { batch, m, oh, .. } = *shape else { return (want, true) };
    let rows = want.clamp(1, oh.max(1));
    let rows_cost = busiest(
        &ranges(oh, 1, rows).iter().map(|&r| by_rows(r)).collect::<Vec<_>>(),
        batch,
        threads,
    );
    let channels = want.clamp(1, m.div_ceil(step).max(1));
    let channels_cost = busiest(
        &ranges(m, step, channels).iter().map(|&n| by_channels(n)).collect::<Vec<_>>(),
        batch,
        threads,
    );
    if channels_cost < rows_cost {
        (channels, false)
    } else {
        (rows, true)
    }
}

/// How a one-group convolution on the packed GEMM (pointwise) splits each image into at most
/// `want` work units, as (chunks, split_n): by columns (output positions: each unit packs its
/// own columns of the input and reads every weight) or by rows (output channels: each unit packs
/// all the input and reads its channels' weights). Weights packed at compile time are read from
/// beyond L2 once a model's layers have passed, so a unit that reads them all pays for them:
/// squeezenet's classifier (1x1, 512 -> 1000 on 13x13) in 4 units of its 6 column strips gave
/// one thread 3 strips and every unit 2 MB of weights, and scaled 1.3x from 1 to 2 threads.
/// Each split's units are costed (multiply-adds over whole tiles, plus 8 for each weight read
/// and each input float packed) and dealt as in [`direct_split`]; columns on a tie.
pub(super) fn gemm_split(
    (m, n, k): (usize, usize, usize),
    images: usize,
    mr: usize,
    want: usize,
    threads: usize,
) -> (usize, bool) {
    let unit = |rows: usize, cols: usize| -> u64 {
        if rows == 0 || cols == 0 {
            return 0;
        }
        let macs = (rows.div_ceil(mr) * mr * cols.div_ceil(16) * 16 * k) as u64;
        macs + 8 * (rows * k) as u64 + 8 * (cols * k) as u64
    };
    let by_cols = want.clamp(1, n.div_ceil(NR).max(1));
    let cols_cost = busiest(
        &ranges(n, NR, by_cols).iter().map(|&c| unit(m, c)).collect::<Vec<_>>(),
        images,
        threads,
    );
    // A channel-blocked result (decided after this plan, by the layout pass) is cut in chunks
    // of NR channels, not MR: costed so, either way.
    let by_rows = want.clamp(1, m.div_ceil(NR).max(1));
    let rows_cost = busiest(
        &ranges(m, NR, by_rows).iter().map(|&r| unit(r, n)).collect::<Vec<_>>(),
        images,
        threads,
    );
    if rows_cost < cols_cost {
        (by_rows, false)
    } else {
        (by_cols, true)
    }
}

/// The work of the busiest of `threads` threads when `images` copies of `units` (work each)
/// are dealt in order, each to the least busy thread, as threads claiming units in turn take
/// them.
fn busiest(units: &[u64], images: usize, threads: usize) -> u64 {
    let mut load = vec![0u64; threads.max(1)];
    for &w in units.iter().cycle().take(units.len() * images.max(1)) {
        if let Some(least) = load.iter_mut().min() {
            *least += w;
        }
    }
    load.into_iter().max().unwrap_or(0)
}

/// The sizes of `chunks` ranges of `n` as `chunk_range` (workspace.h) cuts them: `per` a unit,
/// a multiple of `step`, the last fewer (or none).
fn ranges(n: usize, step: usize, chunks: usize) -> Vec<usize> {
    let per = n.div_ceil(step.max(1)).div_ceil(chunks.max(1)) * step.max(1);
    (0..chunks).map(|q| n.min((q + 1) * per).saturating_sub(q * per)).collect()
}

/// Whether a tap of a window of `k` taps `d` apart falls on phase `a` of stride `s` (conv.c's
/// `phase_read`: only those phases are padded).
fn phase_read(a: usize, s: usize, k: usize, d: usize) -> bool {
    (0..k).any(|t| t * d % s.max(1) == a)
}

/// The fewest channel pairs for which a bf16 direct convolution takes the AMX tiles.
pub(super) const AMX_MIN_PAIRS: usize = 8;

/// The output channels an AMX tile pair covers: channel units and packed weights come in them.
pub(super) const AMX_CHANNELS: usize = 32;

/// How an AMX bf16 convolution blocks its channel pairs: `kb` pairs a tile step (16, or all of
/// them when fewer), `gb` steps a tap; the pairs are padded to `kb * gb` (zero weights, and
/// zeroed planes, which a NaN-free product needs).
pub fn amx_pair_blocks(c: usize) -> (usize, usize) {
    let pairs = c.div_ceil(2);
    let kb = pairs.min(16);
    (kb, pairs.div_ceil(kb.max(1)))
}

/// A one-group convolution's weights for `kiln_uk_conv2d`'s bf16 form on AMX tiles: per block of
/// 16 output channels (m padded to 32), per tap, per step of `kb` channel pairs, a 16 x `kb`
/// tile of words, each two bf16 (the even channel's in the low half), as `tdpbf16ps` pairs them
/// with the input's channel-pair planes; channels past c and m zero.
fn pack_conv_bf16_amx(w: &[f32], m: usize, c: usize, taps: usize) -> Vec<u32> {
    let (kb, gb) = amx_pair_blocks(c);
    let mut out = vec![0u32; m.next_multiple_of(AMX_CHANNELS) * taps * kb * gb];
    for i in 0..m {
        for ch in 0..c {
            let pair = ch / 2;
            for t in 0..taps {
                let tile = ((i / 16) * taps + t) * gb + pair / kb;
                let word = tile * 16 * kb + (i % 16) * kb + pair % kb;
                out[word] |= bf16_bits(w[(i * c + ch) * taps + t]) << (16 * (ch % 2));
            }
        }
    }
    out
}

/// A one-group convolution's weights W[m, c, taps] for `kiln_uk_conv2d`'s bf16 form: A[i, q]
/// with q = (channel pair, tap), each word two bf16 (rounded to nearest even), the even
/// channel's in the low half, as `vdpbf16ps` pairs them with the input's channel pairs; in
/// strips of `mr` rows ([(s * K2 + q) * mr + r]), rows past m and an odd c's last channel zero.
fn pack_conv_bf16(w: &[f32], m: usize, c: usize, taps: usize, mr: usize) -> Vec<u32> {
    let k2 = c.div_ceil(2) * taps;
    let mut out = vec![0u32; m.div_ceil(mr) * k2 * mr];
    for i in 0..m {
        let (s, r) = (i / mr, i % mr);
        for ch in 0..c {
            for t in 0..taps {
                let q = (ch / 2) * taps + t;
                out[(s * k2 + q) * mr + r] |=
                    bf16_bits(w[(i * c + ch) * taps + t]) << (16 * (ch % 2));
            }
        }
    }
    out
}

impl KernelShape for ConvTranspose {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = u.mnk();
        let Shape::ConvTranspose { batch, kh, kw, stride, dilation, pad, oh, ow, .. } = u.shape
        else {
            return Err(fmt::Error);
        };
        writeln!(
            f,
            "microkernel: ConvTranspose as GEMM M={m} N={n} K={k} and col2im, {batch} image(s) of {oh}x{ow} (window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{})",
            stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1]
        )?;
        let what = if u.split_n { "input row" } else { "channel" };
        describe_tiles(u, f, NR, "B (the input) packed at run time", what, " per image")?;
        describe_epilogue(u, f)
    }

    fn pack(&self, graph: &Graph, _kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        let w = weight_f32s(graph, u)?;
        // `tiled::plan` gives bf16 only to one-group convolutions and GEMMs.
        if u.bf16 {
            return Err(CompileError::Internal(format!("no bf16 packing for {u}")));
        }
        // A[m, ci] = W[ci, m] (W is [Cin, Cout*KH*KW]), in strips of MR rows.
        let (m, _, k) = u.mnk();
        let mut out = vec![0.0; m.div_ceil(u.mr) * k * u.mr];
        for i in 0..m {
            for ci in 0..k {
                out[((i / u.mr) * k + ci) * u.mr + i % u.mr] = w[ci * m + i];
            }
        }
        Ok(f32_bytes(out, u))
    }

    fn packed_floats(&self, u: &Ukernel) -> usize {
        let (m, _, k) = u.mnk();
        m.div_ceil(u.mr) * k * u.mr
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::ConvTranspose { cin, h, w, cout, kh, kw, stride, dilation, pad, oh, ow, .. } =
            u.shape
        else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, p.wp, p.bias, p.res, p.y];
        args.extend(call.ints(&[
            cin,
            h,
            w,
            cout,
            kh,
            kw,
            stride[0],
            stride[1],
            dilation[0],
            dilation[1],
        ]));
        args.extend([call.int(pad[0]), call.int(pad[1])]);
        args.extend(call.ints(&[oh, ow]));
        args.extend(call.activation(&u.epilogue));
        args.extend(call.ints(&[u.kc, u.mc, u.nc, u.chunks, u.split_n as usize]));
        Ok(("kiln_uk_conv_transpose", args))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(c: usize, m: usize, hw: usize, k: usize, stride: usize, chunks: usize) -> Ukernel {
        let o = (hw + 2 * (k / 2) - k) / stride + 1;
        let shape = Shape::Conv {
            batch: 1,
            c,
            h: hw,
            w: hw,
            m,
            group: 1,
            kh: k,
            kw: k,
            stride: [stride; 2],
            dilation: [1, 1],
            pad: [k / 2; 2],
            oh: o,
            ow: o,
        };
        let mut u = Ukernel::unblocked(shape, ValueId::from(kiln_ir::NodeId::new(0)), chunks);
        u.mr = 8;
        u.split_n = true;
        u
    }

    #[test]
    fn direct_strips_are_48_wide_where_units_fill_them() {
        // 14 rows of 56 (pitch 58) a unit: 810 positions, 816 as 48s against 832 as 32s.
        assert_eq!(direct_cols(&conv(64, 64, 56, 3, 1, 4)), 48);
        // 4 rows of 14 (pitch 16) a unit: 62 positions, 96 as 48s against 64 as 32s.
        assert_eq!(direct_cols(&conv(256, 256, 14, 3, 1, 4)), 32);
        // One unit of 14x14: 222 positions, 240 against 224, 7% more: more than the tile gains.
        assert_eq!(direct_cols(&conv(256, 256, 14, 3, 1, 1)), 32);
        // One unit of 28x28: 838 positions, 864 against 864.
        assert_eq!(direct_cols(&conv(128, 128, 28, 3, 1, 1)), 48);
        // Strided: the stem's 7x7/2 on 224x224, 28 rows of 112 (pitch 115) a unit.
        assert_eq!(direct_cols(&conv(3, 64, 224, 7, 2, 4)), 48);
        // Not on AVX-512 tiles, in bf16, transposed, or not the direct form: 32.
        let mut u = conv(64, 64, 56, 3, 1, 4);
        u.mr = 4;
        assert_eq!(direct_cols(&u), 32);
        let mut u = conv(64, 64, 56, 3, 1, 4);
        u.bf16 = true;
        assert_eq!(direct_cols(&u), 32);
        let mut u = conv(64, 64, 56, 3, 1, 4);
        u.transposed = true;
        assert_eq!(direct_cols(&u), 32);
        assert_eq!(direct_cols(&conv(64, 64, 56, 1, 1, 4)), 32);
    }

    #[test]
    fn direct_convolutions_split_where_units_fill_their_strips() {
        let split =
            |c, m, hw, k, stride| direct_split(&conv(c, m, hw, k, stride, 1).shape, 8, true, 4, 2);
        // 14 rows of 56 a unit fill their strips: by rows, as before.
        assert_eq!(split(64, 64, 56, 3, 1), (4, true));
        // 4 rows of 14 a unit are 62 positions on 64 lanes, four times, on the narrower tile;
        // 64 channels a unit each compute the whole image's 224.
        assert_eq!(split(256, 256, 14, 3, 1), (4, false));
        assert_eq!(split(128, 128, 28, 3, 1), (4, false));
        // 3 channels in, 64 out: padding the whole 224x224 image in every unit costs more
        // than the rows' part-filled strips.
        assert_eq!(split(3, 64, 224, 7, 2), (4, true));
        // One unit wanted: one unit, by rows.
        assert_eq!(direct_split(&conv(256, 256, 14, 3, 1, 1).shape, 8, true, 1, 1), (1, true));
    }

    #[test]
    fn direct_convolutions_take_vectors_along_channels_where_channels_are_whole_vectors() {
        let host = |mr| Host {
            level: if mr == 8 {
                super::super::host::Level::V4
            } else {
                super::super::host::Level::V3
            },
            mr,
            vnni: false,
            amx: false,
            amx_bf16: false,
            bf16: false,
            l1_bytes: 48 << 10,
            l2_bytes: 2 << 20,
            threads: 2,
        };
        let v =
            |c, m, hw, k, stride| channel_vectors(&conv(c, m, hw, k, stride, 1).shape, &host(8));
        assert_eq!(v(64, 64, 56, 3, 1), 4);
        assert_eq!(v(512, 512, 7, 3, 1), 4);
        assert_eq!(v(64, 48, 56, 3, 1), 3);
        assert_eq!(v(3, 16, 224, 7, 2), 1);
        assert_eq!(v(64, 128, 56, 1, 2), 4);
        // Channels in part of a vector keep the vectors along positions; so do pointwise
        // convolutions (the packed GEMM) and hosts without AVX-512.
        assert_eq!(v(64, 24, 56, 3, 1), 0);
        assert_eq!(v(64, 64, 56, 1, 1), 0);
        assert_eq!(channel_vectors(&conv(64, 64, 56, 3, 1, 1).shape, &host(4)), 0);
        // Blocks: 18 KiB of weights (72 steps by 64 channels) in 48 KiB of L1, the sums of
        // 2048 positions in a quarter of 2 MiB; a narrower tile's blocks are as many bytes.
        assert_eq!(channel_blocks(&host(8), 4), (72, 2048));
        assert_eq!(channel_blocks(&host(8), 1), (288, 8192));
        assert_eq!(
            [1, 2, 3, 4].map(channel_tile_positions),
            [16, 12, 8, 6],
            "24 accumulators where that divides"
        );
        // Units: 56x56 by 64 channels (one block) by rows; 7x7 by 512 (49 positions: 4 units
        // of rows would compute 18, 18, 18 and 12 as tiles of 6) by blocks of channels.
        let split = |c, m, hw| channel_split(&conv(c, m, hw, 3, 1, 1).shape, 4, 4, 2);
        assert_eq!(split(64, 64, 56), (4, true));
        assert_eq!(split(512, 512, 7), (4, false));
        // Weights [k][block's channels]: 80 channels are a block of 64, then one of 16.
        let (m, k) = (80, 3);
        let w: Vec<f32> = (0..m * k).map(|i| i as f32).collect();
        let p = pack_conv_channels(&w, m, k, 4);
        assert_eq!(p[1], w[k]); // step 0, channel 1
        assert_eq!(p[64 + 2], w[2 * k + 1]); // step 1, channel 2
        assert_eq!(p[64 * k + 16 + 5], w[69 * k + 1]); // the 16-wide block: step 1, channel 69
    }

    #[test]
    fn pointwise_convolutions_split_by_channels_where_weights_outweigh_positions() {
        // squeezenet's classifier: 1000 channels by 169 positions (6 column strips for 4 units).
        assert_eq!(gemm_split((1000, 169, 512), 1, 8, 4, 2), (4, false));
        // 64 channels by 3025 positions: each unit packs its own columns.
        assert_eq!(gemm_split((64, 3025, 16), 1, 8, 4, 2), (4, true));
        assert_eq!(busiest(&[3, 3, 2, 0], 1, 2), 5);
        assert_eq!(ranges(169, 32, 4), vec![64, 64, 41, 0]);
        assert_eq!(ranges(14, 1, 4), vec![4, 4, 4, 2]);
    }
}
