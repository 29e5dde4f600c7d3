//! The CPU's integer convolution (`Shape::QConv`, `quantized.c`): a `QConv` node (made by the
//! `integer` pass) planned, described, its weights packed at compile time, and its call.
//!
//! The kernel reads the u8 input straight from a copy padded with the input's zero point, four
//! channels interleaved per position ([C/4][phase plane][4], so that 16 positions of 4 channels
//! are one 64-byte vector), and multiplies it by the s8 weights, packed per register-tile strip
//! as `[M/MR][K/4][MR]` groups of 4 (one 32-bit broadcast per row): `vpdpbusd` (u8 x s8, four
//! products summed into int32) where the CPU has AVX-512 VNNI, an exact widening product
//! elsewhere. The zero points need no work in the loop: the padding holds the input's zero point
//! and the weights' is 0, so `Σ (x - zx) w = Σ x w - zx Σ w`, whose second term is folded into
//! the packed int32 bias. As each tile is stored: `(acc + bias') * (x_scale * w_scale / y_scale)`
//! in f32 (the multiplier formed in f32, as onnxruntime's QLinearConv forms it), rounded half to
//! even, plus the result's zero point, saturated to 8 bits: onnxruntime's MLAS requantisation.

use std::fmt;

use kiln_ir::{DType, Graph, NodeId, Op};
use melior::ir::Value;

use super::window_text;
use super::{
    describe_channel_chunks, other_shape, Activation, Blocked, Call, Epilogue, Host, KernelShape,
    Pointers, Shape, Ukernel, MIN_MACS, NR,
};
use crate::fuse::Kernel;
use crate::{CompileError, Result};

/// Integer convolutions and matrix products: `kiln_uk_qconv2d`, `kiln_uk_qdepthwise` and
/// `kiln_uk_qgemm`.
pub(super) struct QConv;

/// Everything about a QConv node the kernel needs, when it can run it: 2-D, one group, u8 input,
/// s8 constant weights with zero points 0, constant scales and zero points (one each for the
/// input and the result), a constant int32 bias or none, static shapes.
fn shape(graph: &Graph, id: NodeId, vnni: bool, amx: bool) -> Option<Shape> {
    let Op::QConv(c) = &graph.node(id).op else { return None };
    let ops = graph.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (x, w) = (operand(0)?, operand(3)?);
    // The kernel reads both from buffers: a constant small enough for fusion to inline into the
    // kernel (a 1x1 convolution of 4 channels into 4, one 3x3 depthwise channel) has none.
    if crate::fuse::is_inline_constant(graph, x) || crate::fuse::is_inline_constant(graph, w) {
        return None;
    }
    let xd = graph.value_type(x).shape.as_fixed()?;
    // An empty input (no images, no positions) has no work for the kernel to split.
    if xd.contains(&0) {
        return None;
    }
    let wt = graph.constant_value(w)?;
    let wd = wt.dims().to_vec();
    let depthwise = c.group == xd[1] && wd[0] == xd[1] && wd[1] == 1;
    if xd.len() != 4 || wd.len() != 4 || !(c.group == 1 && wd[1] == xd[1] || depthwise) {
        return None;
    }
    // The sums must fit: int32 (255 * 128 * K < 2^31), and for the depthwise kernel's float
    // sums 2^24 (255 * 128 * taps, up to 256); its taps stay in registers, at most 64 of them.
    if wd[1] * wd[2] * wd[3] > 65536 || depthwise && wd[2] * wd[3] > 64 {
        return None;
    }
    let x_signed = graph.value_type(x).dtype == DType::I8;
    if !matches!(graph.value_type(x).dtype, DType::U8 | DType::I8) || wt.dtype() != DType::I8 {
        return None;
    }
    let y = graph.node(id).outputs.first()?;
    if !matches!(y.dtype, DType::U8 | DType::I8) {
        return None;
    }
    let one = |i: usize| -> Option<f64> {
        let v = graph.constant_value(operand(i)?)?.to_f64s();
        (v.len() == 1).then(|| v[0])
    };
    let (x_zero, y_zero) = (one(2)?, one(7)?);
    one(1)?;
    one(6)?;
    graph.constant_value(operand(4)?)?;
    if graph.constant_value(operand(5)?)?.to_f64s().iter().any(|&z| z != 0.0) {
        return None;
    }
    if let Some(b) = operand(8) {
        graph.constant_value(b)?;
    }
    let mut axes = Vec::new();
    for i in 0..2 {
        axes.push(c.window.resolve(i, xd[2 + i], wd[2 + i], false).ok()?);
    }
    let [a, b] = [&axes[0], &axes[1]];
    let mut shape = Shape::QConv {
        batch: xd[0],
        c: xd[1],
        group: c.group,
        h: xd[2],
        w: xd[3],
        m: wd[0],
        kh: wd[2],
        kw: wd[3],
        stride: [a.stride, b.stride],
        dilation: [a.dilation, b.dilation],
        pad: [a.pad_begin, b.pad_begin],
        oh: a.output,
        ow: b.output,
        // (s8 input is read as u8 with its top bit flipped: x + 128, and so its zero point.)
        x_zero: (x_zero as i64 + if x_signed { 128 } else { 0 }) as u8,
        x_signed,
        y_zero: y_zero as i32,
        y_signed: y.dtype == DType::I8,
        y_range: if y.dtype == DType::I8 { [-128, 127] } else { [0, 255] },
        vnni,
        amx: false,
    };
    // AMX for a one-group convolution of at least 32 channels: a tile step then multiplies at
    // least 8 channel groups (half a step's 64 bytes), 4x a vector unit's rate; fewer would
    // waste most of each step. The matrix-product form keeps its own kernel (`kiln_uk_qgemm`).
    let tiles = amx && c.group == 1 && xd[1].div_ceil(4) >= AMX_MIN_GROUPS && !gemm_form(&shape);
    if let Shape::QConv { amx, .. } = &mut shape {
        *amx = tiles;
    }
    Some(shape)
}

/// The fewest groups of 4 input channels for which a convolution takes the AMX tiles.
const AMX_MIN_GROUPS: usize = 8;

/// How an AMX convolution blocks its channel groups (of 4 input channels): `kb` groups a tile
/// step (16, 64 bytes, or all of them when fewer), `gb` steps a tap; the groups are padded to
/// `kb * gb` with zero weights.
pub fn amx_blocks(c: usize) -> (usize, usize) {
    let c4 = c.div_ceil(4);
    let kb = c4.min(16);
    (kb, c4.div_ceil(kb.max(1)))
}

/// The output channels an AMX tile pair covers: the weights are packed in blocks of them.
const AMX_CHANNELS: usize = 32;

/// A Clip of the 8-bit result with constant bounds (missing ones the type's), within `range`.
/// Bounds that cross (min above max) give max everywhere, as ONNX's Clip does and as the
/// kernel's clamp (max, then min) computes.
fn clip_range(graph: &Graph, clip: NodeId, range: [i32; 2]) -> Option<[i32; 2]> {
    if !matches!(graph.node(clip).op, Op::Clip) {
        return None;
    }
    let ops = graph.operands(clip);
    let bound = |i: usize, none: i32| -> Option<i32> {
        match ops.get(i).copied().flatten() {
            None => Some(none),
            Some(b) => {
                let v = graph.constant_value(b)?.to_f64s();
                (v.len() == 1).then(|| v[0].clamp(range[0] as f64, range[1] as f64) as i32)
            }
        }
    };
    Some([bound(1, range[0])?, bound(2, range[1])?])
}

/// Whether a QConv is a matrix product: N images of K channels at one position, a 1x1 window.
/// The `integer` pass writes quantized Gemms and MatMuls so; `kiln_uk_qgemm` runs them on the
/// rows as they lie (a row's 4 consecutive k are one word) instead of 32 positions a tile.
pub fn gemm_form(shape: &Shape) -> bool {
    matches!(*shape, Shape::QConv { group: 1, h: 1, w: 1, kh: 1, kw: 1, oh: 1, ow: 1, .. })
}

/// Whether a QConv is pointwise (1x1, stride 1, no padding, over a plane): `kiln_uk_qconv2d`
/// takes its positions flat, and splits them in 32-position strips.
fn pointwise(shape: &Shape) -> bool {
    matches!(*shape, Shape::QConv { kh: 1, kw: 1, stride: [1, 1], pad: [0, 0], h, w, oh, ow, .. } if oh == h && ow == w)
        && !gemm_form(shape)
}

/// The output channels one strip of `kiln_uk_qgemm`'s packed weights holds.
const GEMM_STRIP: usize = 64;

/// The plan for a kernel whose root is a QConv (alone in its kernel, or with the one Clip fusion
/// gives it).
pub(super) fn plan(graph: &Graph, kernel: &Kernel, root: NodeId, host: &Host) -> Option<Ukernel> {
    let mut shape = shape(graph, root, host.vnni, host.amx)?;
    let ops = graph.operands(root);
    let (x, w) = (ops.first().copied().flatten()?, ops.get(3).copied().flatten()?);
    if !kernel.inputs.contains(&x) || !kernel.inputs.contains(&w) {
        return None;
    }
    // Alone, or with the Clip fusion gave it (`fuse::clips_integer_result`): its bounds narrow
    // the stored range.
    match kernel.nodes.as_slice() {
        [_] => {}
        [_, clip] => {
            let Shape::QConv { y_range, .. } = &mut shape else { return None };
            *y_range = clip_range(graph, *clip, *y_range)?;
        }
        _ => return None,
    }
    let Shape::QConv { batch, m, group, oh, ow, amx, .. } = shape else { return None };
    // Output channels go to units in whole strips: MR rows, or an AMX tile pair's 32.
    let strip = if amx { AMX_CHANNELS } else { host.mr };
    let (_, _, k) = shape.mnk();
    // About 4 work units once there is enough work; by output rows where there are enough of
    // them (each unit copies only the input rows it reads), else by output channels. A depthwise
    // multiply-add counts 8 (a float FMA on 16 lanes, against vpdpbusd's 64), and its units are
    // channel chunks, up to 16 so that threads share them evenly.
    let per_mac = if group > 1 { 8 } else { 1 };
    let work = batch * m * oh * ow * k * per_mac;
    let target = host.units(work, 4 * MIN_MACS);
    // A matrix product's units are chunks of rows (4 a tile) where there are enough of them,
    // else chunks of 64-channel strips.
    let (chunks, split_n) = if gemm_form(&shape) {
        if batch >= 4 * target {
            (target, true)
        } else {
            (target.min(m.div_ceil(GEMM_STRIP)), false)
        }
    } else if group > 1 {
        (if target == 1 { 1 } else { m.div_ceil(16).clamp(1, 4 * host.max_units()) }, false)
    } else if pointwise(&shape) {
        // Positions are flat: chunks of 32-position strips where there are enough of them for
        // every unit, else of output channels (each unit then copies the whole input, which is
        // one vectorised pass).
        let strips = (oh * ow).div_ceil(32);
        if batch >= target {
            (1, true)
        } else if strips >= target {
            (target.div_ceil(batch), true)
        } else {
            (target.div_ceil(batch).min(m.div_ceil(strip)), false)
        }
    } else if batch >= target {
        (1, true)
    } else if oh >= 2 * target {
        (target.div_ceil(batch), true)
    } else {
        (target.div_ceil(batch).min(m.div_ceil(strip)), false)
    };
    Some(Ukernel {
        shape,
        input: x,
        weight: w,
        epilogue: Epilogue {
            bias: None,
            residual: None,
            residual_last: false,
            activation: Activation::None,
        },
        mr: host.mr,
        kc: 0,
        mc: 0,
        nc: 0,
        chunks,
        split_n,
        row_bands: 1,
        transposed: false,
        blocked: Blocked::default(),
        bf16: false,
        amx: false,
        channel_vectors: 0,
    })
}

/// ", clamp to [lo, hi]" where a fused Clip narrows an integer convolution's stored range.
fn qclamp(signed: bool, range: [i32; 2]) -> String {
    let full = if signed { [-128, 127] } else { [0, 255] };
    if range == full {
        String::new()
    } else {
        format!(", clamp to [{}, {}] (a fused Clip)", range[0], range[1])
    }
}

impl KernelShape for QConv {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = u.mnk();
        let Shape::QConv {
            batch,
            c,
            m: channels,
            group,
            kh,
            kw,
            stride,
            dilation,
            pad,
            oh,
            ow,
            x_zero,
            x_signed,
            y_zero,
            y_signed,
            y_range,
            vnni,
            amx,
            ..
        } = u.shape
        else {
            return Err(fmt::Error);
        };
        let window = window_text([kh, kw], stride, dilation, pad);
        let products = if vnni { "with vpdpbusd" } else { "by widening products (no VNNI)" };
        let flipped = if x_signed { " (s8 read as u8: x + 128)" } else { "" };
        let epilogue = format!("epilogue: requantise to {} (scale, round half to even, zero point {y_zero}, saturate{})", if y_signed { "s8" } else { "u8" }, qclamp(y_signed, y_range));
        if amx {
            let (kb, gb) = amx_blocks(c);
            writeln!(
                f,
                "microkernel: integer conv, {batch} image(s) of M={m} N={n} K={k} ({window})"
            )?;
            writeln!(f, "s8 x u8 -> s32 on AMX tiles (tdpbsud); B read direct from a copy of the input{flipped} padded with its zero point {x_zero}, 4 channels interleaved a position, a tile's rows {kb} channel groups apart")?;
            writeln!(f, "tile: 32 channels x 32 positions (4 accumulator tiles), {kb} channel groups a step, {gb} step(s) a tap; weights packed at compile time in 16-channel tiles, the zero point folded into the int32 bias")?;
            writeln!(f, "{epilogue}")?;
            let what = match (u.split_n, pointwise(&u.shape)) {
                (true, true) => "32-position strip",
                (true, false) => "output row",
                (false, _) => "32-channel",
            };
            return writeln!(
                f,
                "workgroups: {} ({} {what} chunk(s) per image)",
                u.workgroups(),
                u.chunks
            );
        }
        if group > 1 {
            writeln!(f, "microkernel: integer depthwise conv, {batch} image(s) of {c} channels {oh}x{ow} ({window})")?;
            writeln!(f, "each 16 channels' planes less the zero point transposed into a zero-padded channel-blocked plane of floats (exact integers), vectors of 16 channels at each output, one FMA a tap, 4 outputs at a time; sums exact, transposed back")?;
            writeln!(f, "{epilogue}")?;
            describe_channel_chunks(u, f)
        } else if gemm_form(&u.shape) {
            writeln!(
                f,
                "microkernel: integer matrix product, {batch} row(s) of K={c} by M={channels}"
            )?;
            writeln!(f, "u8 x s8 -> s32 {products}; each row's 4 consecutive k one word as it lies{flipped}, broadcast into vectors of 16 output channels")?;
            writeln!(f, "register tile: 4 rows x 64 channels; weights packed at compile time in strips of 64 channels, the zero point {x_zero} folded into the int32 bias")?;
            writeln!(f, "{epilogue}")?;
            let what = if u.split_n { "row" } else { "64-channel strip" };
            writeln!(f, "workgroups: {} ({what} chunks)", u.workgroups())
        } else {
            writeln!(
                f,
                "microkernel: integer conv, {batch} image(s) of M={m} N={n} K={k} ({window})"
            )?;
            writeln!(f, "u8 x s8 -> s32 {products}; B read direct from a copy of the input{flipped} padded with its zero point {x_zero}, 4 channels interleaved a position")?;
            writeln!(f, "register tile: {}x{NR}; weights packed at compile time in groups of 4, the zero point folded into the int32 bias", u.mr)?;
            writeln!(f, "{epilogue}")?;
            let what = match (u.split_n, pointwise(&u.shape)) {
                (true, true) => "32-position strip",
                (true, false) => "output row",
                (false, _) => "output channel",
            };
            writeln!(f, "workgroups: {} ({} {what} chunk(s) per image)", u.workgroups(), u.chunks)
        }
    }

    fn pack(&self, graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        pack(graph, kernel, u)
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::QConv { group, .. } = u.shape else { return Err(other_shape(u)) };
        let symbol = if group > 1 {
            "kiln_uk_qdepthwise"
        } else if gemm_form(&u.shape) {
            "kiln_uk_qgemm"
        } else {
            "kiln_uk_qconv2d"
        };
        let mut args = vec![p.x, p.wp, p.y];
        args.extend(sizes(&u.shape).into_iter().map(|v| call.int(v)));
        args.extend(call.ints(&[u.chunks, u.split_n as usize]));
        Ok((symbol, args))
    }
}

/// The packed constant `quantized.c` reads: the weights as `[M/MR][K/4][MR]` groups of 4 bytes
/// (K ordered (channel group of 4, kh, kw), channels past C zero; a matrix product's strips are
/// 64 channels, not MR), then per output channel
/// (padded to whole strips) the int32 bias less `x_zero * Σ w`, then the f32 multiplier
/// `x_scale * w_scale / y_scale`, formed in f32 as onnxruntime forms it
/// (`kiln_ir::eval::requant_multiplier`), so that the bytes are its bytes.
fn pack(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
    // `family` hands this module its own plans, made only for a kernel rooted at an integer
    // convolution whose weights, scales and bias are constants (`plan`): anything else is a bug.
    let Shape::QConv { c, m, group, kh, kw, x_zero, .. } = u.shape else {
        return Err(CompileError::Internal("not an integer convolution".into()));
    };
    let root =
        *kernel.nodes.first().ok_or_else(|| CompileError::Internal("an empty kernel".into()))?;
    let ops = graph.operands(root);
    let node = graph.node(root);
    let value = |i: usize| -> Result<Vec<f64>> {
        ops.get(i)
            .copied()
            .flatten()
            .and_then(|v| graph.constant_value(v))
            .map(|t| t.to_f64s())
            .ok_or_else(|| {
                CompileError::Internal(format!(
                    "operand {i} of the integer convolution is not a constant"
                ))
            })
    };
    let weights = value(3)?;
    let (x_scale, w_scale, y_scale) = (value(1)?[0], value(4)?, value(6)?[0]);
    let bias = match ops.get(8).copied().flatten() {
        Some(_) => value(8)?,
        None => vec![0.0; m],
    };
    if group > 1 {
        return Ok(pack_depthwise(&weights, &bias, x_scale, &w_scale, y_scale, m, kh * kw));
    }
    // Σ w per output channel, for the zero point folded into the bias.
    let taps = kh * kw;
    let sums: Vec<i64> = (0..m)
        .map(|i| weights[i * c * taps..(i + 1) * c * taps].iter().map(|&v| v as i8 as i64).sum())
        .collect();
    let (mut out, padded) = if let Shape::QConv { amx: true, .. } = u.shape {
        (pack_amx(&weights, c, m, taps), m.next_multiple_of(AMX_CHANNELS))
    } else {
        // The matrix product's strips are 64 channels; the convolution's, MR.
        let mr = if gemm_form(&u.shape) { GEMM_STRIP } else { u.mr };
        let (strips, k4) = (m.div_ceil(mr), c.div_ceil(4) * taps);
        let mut packed = vec![0u8; strips * k4 * mr * 4];
        for i in 0..m {
            for ch in 0..c {
                for t in 0..taps {
                    let quad = (ch / 4) * taps + t;
                    packed[(((i / mr) * k4 + quad) * mr + i % mr) * 4 + ch % 4] =
                        weights[(i * c + ch) * taps + t] as i8 as u8;
                }
            }
        }
        (packed, strips * mr)
    };
    for i in 0..padded {
        let b = if i < m { bias[i] as i64 - x_zero as i64 * sums[i] } else { 0 };
        // The model's values decide this: a bias and zero point whose folded sum passes int32.
        let b = i32::try_from(b).map_err(|_| CompileError::Unsupported {
            kernel: kernel.name.clone(),
            label: kernel.label.clone(),
            node: node.name.clone(),
            op: node.op.name(),
            what: format!(
                "has a bias of {} at output channel {i}, which with the input zero point {x_zero} \
                 folded in ({b}) does not fit int32",
                bias[i]
            ),
        })?;
        out.extend(b.to_le_bytes());
    }
    for i in 0..padded {
        let s = if i < m { w_scale[if w_scale.len() == 1 { 0 } else { i }] } else { 0.0 };
        out.extend(kiln_ir::eval::requant_multiplier(x_scale, s, y_scale).to_le_bytes());
    }
    Ok(out)
}

/// The weights for AMX tiles, as bytes: per block of 16 output channels, per tap, per step of
/// `kb` channel groups (`amx_blocks`), a 16 x `kb` tile of words, each the 4 s8 weights of one
/// channel group (channel 4g lowest); channels past C and M zero, M padded to 32.
fn pack_amx(weights: &[f64], c: usize, m: usize, taps: usize) -> Vec<u8> {
    let (kb, gb) = amx_blocks(c);
    let blocks = m.next_multiple_of(AMX_CHANNELS) / 16;
    let mut out = vec![0u8; blocks * taps * gb * 16 * kb * 4];
    for oc in 0..m {
        for ch in 0..c {
            let (g, q) = (ch / 4, ch % 4);
            for t in 0..taps {
                let tile = ((oc / 16) * taps + t) * gb + g / kb;
                let word = tile * 16 * kb + (oc % 16) * kb + g % kb;
                out[word * 4 + q] = weights[(oc * c + ch) * taps + t] as i8 as u8;
            }
        }
    }
    out
}

/// A depthwise convolution's packed constant: the weights as floats `[C/16][taps][16]`, 16
/// channels a vector (the last block padded with zeros), then the int32 bias `[C]` as it is (the
/// kernel subtracts the zero point before it multiplies), then the f32 multipliers `[C]`.
fn pack_depthwise(
    weights: &[f64],
    bias: &[f64],
    x_scale: f64,
    w_scale: &[f64],
    y_scale: f64,
    m: usize,
    taps: usize,
) -> Vec<u8> {
    let mut blocked = vec![0f32; m.div_ceil(16) * taps * 16];
    for c in 0..m {
        for t in 0..taps {
            blocked[((c / 16) * taps + t) * 16 + c % 16] = weights[c * taps + t] as f32;
        }
    }
    let mut out: Vec<u8> = blocked.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.extend(bias[..m].iter().flat_map(|&b| (b as i32).to_le_bytes()));
    for i in 0..m {
        let s = w_scale[if w_scale.len() == 1 { 0 } else { i }];
        out.extend(kiln_ir::eval::requant_multiplier(x_scale, s, y_scale).to_le_bytes());
    }
    out
}

/// The sizes `kiln_uk_qconv2d` and `kiln_uk_qdepthwise` (or, for the matrix-product form,
/// `kiln_uk_qgemm`) take after their pointers (the work split comes after them).
fn sizes(shape: &Shape) -> Vec<i64> {
    let Shape::QConv {
        batch,
        c,
        h,
        w,
        m,
        kh,
        kw,
        stride,
        dilation,
        pad,
        oh,
        ow,
        x_zero,
        x_signed,
        y_zero,
        y_range,
        vnni,
        amx,
        ..
    } = *shape
    else {
        return Vec::new();
    };
    // The products: 0 widening, 1 vpdpbusd, 2 AMX tiles.
    let isa = if amx { 2 } else { vnni as i64 };
    let (lo, hi) = (y_range[0] as i64, y_range[1] as i64);
    let flip = if x_signed { 0x80 } else { 0 };
    if gemm_form(shape) {
        // kiln_uk_qgemm: K, M, the rows, then as the convolution's tail (the input's zero point
        // is in the packed bias).
        return [c as i64, m as i64, batch as i64, flip, y_zero as i64, lo, hi, vnni as i64]
            .to_vec();
    }
    [c, h, w, m, kh, kw, stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1], oh, ow]
        .iter()
        .map(|&v| v as i64)
        .chain([x_zero as i64, flip, y_zero as i64, lo, hi, isa])
        .collect()
}

/// Whether a QConv node runs on the integer kernel (the `integer` pass makes no other).
pub(super) fn runs(graph: &Graph, id: NodeId) -> bool {
    shape(graph, id, false, false).is_some()
}
