//! Convolution (im2col + GEMM per group) and pooling, for any number of spatial dimensions.

use ndarray::{Array2, ArrayView2, Axis};

use super::{first, not_yet};
use crate::error::{invalid, OpError};
use crate::infer::{transpose_axis, Col2ImPlan, DeformPlan, TransposeAxis};
use crate::op::{Col2Im, Conv, ConvTranspose, DeformConv, Pool, PoolKind, SpatialAxis, Window};
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    out_dims: &[Vec<usize>],
    num_outputs: usize,
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::Conv(c) => vec![conv(
            c,
            x(),
            operands[1].expect("checked"),
            operands.get(2).copied().flatten(),
            &out_dims[0],
        )?],
        Op::QConv(c) => vec![qconv(c, operands, &out_types[0])?],
        Op::Pool(p) => pool(p, x(), &out_dims[0], num_outputs > 1)?,
        Op::GlobalPool(k) => vec![global_pool(*k, x())],
        Op::ConvTranspose(c) => conv_transpose(c, operands, out_types)?,
        Op::Col2Im(c) => vec![col2im(c, operands)?],
        Op::DeformConv(d) => vec![deform_conv(d, operands)?],
        _ => return not_yet(op),
    })
}

/// Col2Im: every column element added into the image element the plan sends it to (in f64 for
/// floats, exactly for integers, which wrap as the sum of the type does).
fn col2im(c: &Col2Im, operands: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let arg =
        |i: usize| operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i });
    let x = arg(0)?;
    let plan = Col2ImPlan::new(c, &arg(1)?.to_i64s(), &arg(2)?.to_i64s())?;
    let [n, cb, l] = <[usize; 3]>::try_from(x.dims())
        .map_err(|_| invalid!("input must be 3-D, got {}", x.ty()))?;
    if plan.block == 0 || cb % plan.block != 0 || l != plan.columns {
        return Err(invalid!("input {} does not fit the plan's blocks", x.ty()));
    }
    let channels = cb / plan.block;
    let pixels: usize = plan.image.iter().product();
    let mut dims = vec![n, channels];
    dims.extend(&plan.image);
    if x.dtype().is_float() {
        let v = x.to_f64s();
        let mut out = vec![0.0; n * channels * pixels];
        for (plane, src) in out.chunks_mut(pixels).zip(v.chunks(plan.block * l)) {
            for (&t, &s) in plan.targets.iter().zip(src) {
                if let Some(t) = t {
                    plane[t] += s;
                }
            }
        }
        Ok(Tensor::from_f64s(x.dtype(), &dims, &out)?)
    } else {
        let v = x.to_i64s();
        let mut out = vec![0i64; n * channels * pixels];
        for (plane, src) in out.chunks_mut(pixels).zip(v.chunks(plan.block * l)) {
            for (&t, &s) in plan.targets.iter().zip(src) {
                if let Some(t) = t {
                    plane[t] = plane[t].wrapping_add(s);
                }
            }
        }
        let t = Tensor::from_vec(&dims, out)?;
        Ok(t.cast(x.dtype()))
    }
}

/// The bilinear taps of `x`'s `[height, width]` plane at `(y, x)`: up to four (flat index,
/// weight) pairs, the taps outside the plane left out (they read zero). Shared in spirit with
/// the decomposition, which weighs the same four taps and zeroes the same ones.
pub fn bilinear_taps(image: [usize; 2], y: f64, x: f64) -> impl Iterator<Item = (usize, f64)> {
    let (y0, x0) = (y.floor(), x.floor());
    let (ly, lx) = (y - y0, x - x0);
    let [h, w] = image;
    [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)].into_iter().filter_map(move |(a, b)| {
        let (ty, tx) = (y0 + a, x0 + b);
        let inside = (0.0..h as f64).contains(&ty) && (0.0..w as f64).contains(&tx);
        let weight =
            (if a == 0.0 { 1.0 - ly } else { ly }) * (if b == 0.0 { 1.0 - lx } else { lx });
        inside.then(|| (ty as usize * w + tx as usize, weight))
    })
}

/// DeformConv: the deformed columns (each tap of each output position sampled bilinearly,
/// times its mask value), then each group's weights times its columns, in f64.
fn deform_conv(d: &DeformConv, operands: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let arg = |i: usize| operands.get(i).copied().flatten();
    let need = |i: usize| arg(i).ok_or(OpError::MissingOperand { index: i });
    let (x, w, offset) = (need(0)?, need(1)?, need(2)?);
    let (bias, mask) = (arg(3), arg(4));
    let plan = DeformPlan::new(
        d,
        x.dims(),
        w.dims(),
        offset.dims(),
        bias.map(|b| b.dims()),
        mask.map(|m| m.dims()),
    )?;
    let (xv, wv, ov) = (x.to_f64s(), w.to_f64s(), offset.to_f64s());
    let mv = mask.map(|m| m.to_f64s());
    let [kh, kw] = plan.kernel;
    let [oh, ow] = plan.output;
    let (taps, positions, pixels) = (kh * kw, oh * ow, plan.image[0] * plan.image[1]);
    let channels_per_offset = plan.channels / plan.offset_group;
    // columns[n][c][tap][position], in f64: refused before allocating when memory cannot hold it.
    let column_dims = [plan.batch, plan.channels, taps, positions];
    if crate::memory::bytes_of(&column_dims, 8)
        .is_none_or(|b| b > crate::memory::available_at_start())
    {
        return Err(invalid!(
            "the deformed columns {column_dims:?} need more memory than is available"
        ));
    }
    let mut columns = vec![0.0; column_dims.iter().product()];
    for n in 0..plan.batch {
        for g in 0..plan.offset_group {
            for (ki, kj) in (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j))) {
                let tap = ki * kw + kj;
                let channel = (g * taps + tap) * 2;
                for (i, j) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
                    let p = i * ow + j;
                    let at = |ch: usize| ((n * plan.offset_group * taps * 2 + ch) * positions) + p;
                    let y = plan.base(0, i, ki) + ov[at(channel)];
                    let xx = plan.base(1, j, kj) + ov[at(channel + 1)];
                    let scale = mv.as_ref().map_or(1.0, |m| {
                        m[((n * plan.offset_group + g) * taps + tap) * positions + p]
                    });
                    for c in g * channels_per_offset..(g + 1) * channels_per_offset {
                        let plane = &xv[(n * plan.channels + c) * pixels..][..pixels];
                        let v: f64 =
                            bilinear_taps(plan.image, y, xx).map(|(t, wt)| plane[t] * wt).sum();
                        columns[((n * plan.channels + c) * taps + tap) * positions + p] = v * scale;
                    }
                }
            }
        }
    }
    let bv = bias.map(|b| b.to_f64s());
    let m = plan.out_channels;
    let (cg, mg) = (plan.channels / plan.group, m / plan.group);
    let mut y = vec![0.0; plan.batch * m * positions];
    for n in 0..plan.batch {
        for oc in 0..m {
            let g = oc / mg;
            let out = &mut y[(n * m + oc) * positions..][..positions];
            out.fill(bv.as_ref().map_or(0.0, |b| b[oc]));
            for ci in 0..cg {
                let c = g * cg + ci;
                for tap in 0..taps {
                    let wt = wv[(oc * cg + ci) * taps + tap];
                    let col =
                        &columns[((n * plan.channels + c) * taps + tap) * positions..][..positions];
                    for (o, v) in out.iter_mut().zip(col) {
                        *o += wt * v;
                    }
                }
            }
        }
    }
    Ok(Tensor::from_f64s(x.dtype(), &[plan.batch, m, oh, ow], &y)?)
}

/// For each spatial axis, for each kernel offset, for each output position: the input position it
/// reads, or `None` in the padding.
fn gather_tables(axes: &[SpatialAxis]) -> Vec<Vec<Vec<Option<usize>>>> {
    axes.iter()
        .map(|a| {
            (0..a.kernel)
                .map(|k| {
                    (0..a.output)
                        .map(|o| {
                            let p = (o * a.stride + k * a.dilation) as i64 - a.pad_begin as i64;
                            (0..a.input as i64).contains(&p).then_some(p as usize)
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Advances a multi-index over `dims` (last fastest); false when it wraps around.
fn advance(idx: &mut [usize], dims: &[usize]) -> bool {
    for i in (0..idx.len()).rev() {
        idx[i] += 1;
        if idx[i] < dims[i] {
            return true;
        }
        idx[i] = 0;
    }
    false
}

fn resolve(
    window: &Window,
    input: &[usize],
    kernel: &[usize],
    ceil_mode: bool,
) -> Result<Vec<SpatialAxis>, OpError> {
    (0..input.len()).map(|i| window.resolve(i, input[i], kernel[i], ceil_mode)).collect()
}

/// The element offset in one [C, spatial...] image of each (kernel offset, output position), or
/// `None` in the padding: an [n_kernel, n_out] table shared by every channel.
fn offsets(axes: &[SpatialAxis]) -> (Vec<Option<usize>>, usize, usize) {
    let kdims: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let odims: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let in_dims: Vec<usize> = axes.iter().map(|a| a.input).collect();
    let table = combine_tables(&gather_tables(axes), &super::strides(&in_dims), &kdims, &odims);
    (table, kdims.iter().product(), odims.iter().product())
}

/// Flattens per-axis position tables (`per_axis[d][k][p]`: the position on axis `d` that kernel
/// offset `k` and position `p` touch, or `None`) into one [n_kernel, n_positions] table of element
/// offsets under `strides`; `None` where any axis is out of range.
fn combine_tables(
    per_axis: &[Vec<Vec<Option<usize>>>],
    strides: &[usize],
    kdims: &[usize],
    pdims: &[usize],
) -> Vec<Option<usize>> {
    let (nk, np) = (kdims.iter().product::<usize>(), pdims.iter().product::<usize>());
    let mut out = Vec::with_capacity(nk * np);
    let mut k = vec![0; kdims.len()];
    for _ in 0..nk {
        let mut p = vec![0; pdims.len()];
        for _ in 0..np {
            let mut off = Some(0);
            for d in 0..per_axis.len() {
                off = match (off, per_axis[d][k[d]][p[d]]) {
                    (Some(acc), Some(q)) => Some(acc + q * strides[d]),
                    _ => None,
                };
            }
            out.push(off);
            advance(&mut p, pdims);
        }
        advance(&mut k, kdims);
    }
    out
}

pub(super) fn conv(
    c: &Conv,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    out: &[usize],
) -> Result<Tensor, OpError> {
    let (n, cin) = (x.dims()[0], x.dims()[1]);
    let m = w.dims()[0];
    let axes = resolve(&c.window, &x.dims()[2..], &w.dims()[2..], false)?;
    let (table, nk, no) = offsets(&axes);
    let group = c.group;
    let (cg, mg) = (cin / group, m / group);
    let image: usize = x.dims()[2..].iter().product();
    let f64_path = x.dtype() == DType::F64;
    // Compute in f32 unless the tensors are f64.
    let to = if f64_path { DType::F64 } else { DType::F32 };
    let (xc, wc) = (x.cast(to), w.cast(to));
    macro_rules! run {
        ($t:ty) => {{
            let xs = xc.as_slice::<$t>().expect("cast");
            let ws = wc.as_slice::<$t>().expect("cast");
            let mut y = vec![0 as $t; n * m * no];
            let mut col = Array2::<$t>::zeros((cg * nk, no));
            for ni in 0..n {
                for g in 0..group {
                    for ci in 0..cg {
                        let base = (ni * cin + g * cg + ci) * image;
                        for kf in 0..nk {
                            let mut row = col.row_mut(ci * nk + kf);
                            for (o, dst) in row.iter_mut().enumerate() {
                                *dst = table[kf * no + o].map_or(0 as $t, |off| xs[base + off]);
                            }
                        }
                    }
                    let wg = ArrayView2::from_shape(
                        (mg, cg * nk),
                        &ws[g * mg * cg * nk..(g + 1) * mg * cg * nk],
                    )
                    .expect("weight layout");
                    let yg = wg.dot(&col);
                    for (mi, row) in yg.axis_iter(Axis(0)).enumerate() {
                        let start = (ni * m + g * mg + mi) * no;
                        for (dst, v) in y[start..start + no].iter_mut().zip(row) {
                            *dst = *v;
                        }
                    }
                }
            }
            if let Some(b) = b {
                let bc = b.cast(to);
                let bs = bc.as_slice::<$t>().expect("cast");
                for (i, chunk) in y.chunks_mut(no).enumerate() {
                    let bias = bs[i % m];
                    chunk.iter_mut().for_each(|v| *v += bias);
                }
            }
            Tensor::from_vec(out, y).map_err(OpError::from)?
        }};
    }
    let y = if f64_path { run!(f64) } else { run!(f32) };
    Ok(y.cast(x.dtype()))
}

/// Pooling; with `want_indices` (MaxPool's second result) also the flat index of each maximum in
/// the whole input tensor, as ONNX defines it: padding does not count, the first maximum in window
/// order wins, and `column_major_indices` numbers each image's cells column-major.
pub(super) fn pool(
    p: &Pool,
    x: &Tensor,
    out: &[usize],
    want_indices: bool,
) -> Result<Vec<Tensor>, OpError> {
    let axes = resolve(&p.window, &x.dims()[2..], &p.kernel, p.ceil_mode)?;
    let (table, nk, no) = offsets(&axes);
    let planes = x.dims()[0] * x.dims()[1];
    let image: usize = x.dims()[2..].iter().product();
    let xs = x.to_f64s();
    // For average pooling with count_include_pad, a cell counts if it lies in the padded input
    // (not beyond it, where ceil_mode can reach).
    let in_padded: Vec<bool> = match p.kind {
        PoolKind::Average { count_include_pad: true } => padded_mask(&axes),
        _ => Vec::new(),
    };
    let mut y = Vec::with_capacity(planes * no);
    let mut indices: Vec<i64> = Vec::with_capacity(if want_indices { planes * no } else { 0 });
    for plane in 0..planes {
        let base = plane * image;
        for o in 0..no {
            let cells = (0..nk).filter_map(|k| table[k * no + o].map(|off| (off, xs[base + off])));
            y.push(match p.kind {
                PoolKind::Max => {
                    // NaN propagates; otherwise only a strictly larger value replaces the maximum.
                    let (at, m) = cells.fold((None, f64::NEG_INFINITY), |(at, m), (off, v)| {
                        if at.is_none() || v > m || (v.is_nan() && !m.is_nan()) {
                            (Some(off), v)
                        } else {
                            (at, m)
                        }
                    });
                    if want_indices {
                        let off = at.map_or(-1, |off| {
                            let off =
                                if p.column_major_indices { column_major(off, &axes) } else { off };
                            (base + off) as i64
                        });
                        indices.push(off);
                    }
                    m
                }
                PoolKind::Lp { p } => {
                    cells.map(|(_, v)| v.abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64)
                }
                PoolKind::Average { count_include_pad } => {
                    let (sum, count) = cells.fold((0.0, 0usize), |(s, c), (_, v)| (s + v, c + 1));
                    let divisor = if count_include_pad {
                        (0..nk).filter(|&k| in_padded[k * no + o]).count()
                    } else {
                        count
                    };
                    sum / divisor.max(1) as f64
                }
            });
        }
    }
    let mut results = vec![Tensor::from_f64s(x.dtype(), out, &y).map_err(OpError::from)?];
    if want_indices {
        results.push(Tensor::from_vec(out, indices).map_err(OpError::from)?);
    }
    Ok(results)
}

/// A row-major offset within one image renumbered column-major (the first spatial axis fastest).
fn column_major(off: usize, axes: &[SpatialAxis]) -> usize {
    let (mut rest, mut col, mut stride) = (off, 0, 1);
    let dims: Vec<usize> = axes.iter().map(|a| a.input).collect();
    let row_strides = super::strides(&dims);
    for d in 0..dims.len() {
        let coord = rest / row_strides[d];
        rest %= row_strides[d];
        col += coord * stride;
        stride *= dims[d];
    }
    col
}

/// For each (kernel offset, output position): whether the cell lies inside the padded input.
fn padded_mask(axes: &[SpatialAxis]) -> Vec<bool> {
    let kdims: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let odims: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let (nk, no) = (kdims.iter().product::<usize>(), odims.iter().product::<usize>());
    let mut out = Vec::with_capacity(nk * no);
    let mut k = vec![0; kdims.len()];
    for _ in 0..nk {
        let mut o = vec![0; odims.len()];
        for _ in 0..no {
            out.push(axes.iter().enumerate().all(|(d, a)| {
                let p = (o[d] * a.stride + k[d] * a.dilation) as i64 - a.pad_begin as i64;
                p >= -(a.pad_begin as i64) && p < (a.input + a.pad_end) as i64
            }));
            advance(&mut o, &odims);
        }
        advance(&mut k, &kdims);
    }
    out
}

pub(super) fn global_pool(kind: PoolKind, x: &Tensor) -> Tensor {
    let planes = x.dims()[0] * x.dims()[1];
    let image: usize = x.dims()[2..].iter().product();
    let xs = x.to_f64s();
    let y: Vec<f64> = (0..planes)
        .map(|p| {
            let cells = &xs[p * image..(p + 1) * image];
            match kind {
                PoolKind::Max => cells.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                PoolKind::Lp { p } => {
                    cells.iter().map(|v| v.abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64)
                }
                PoolKind::Average { .. } => cells.iter().sum::<f64>() / image as f64,
            }
        })
        .collect();
    let mut dims = x.dims()[..2].to_vec();
    dims.resize(x.rank(), 1);
    Tensor::from_f64s(x.dtype(), &dims, &y).expect("one value per plane")
}

/// Transposed convolution: per group, a GEMM of the weights' transpose with the input gives every
/// (output channel, kernel offset, input position) product, which col2im adds into the output.
pub(super) fn conv_transpose(
    c: &ConvTranspose,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (x, w) = match (operands.first().copied().flatten(), operands.get(1).copied().flatten()) {
        (Some(x), Some(w)) => (x, w),
        _ => return Err("ConvTranspose needs an input and a weight".into()),
    };
    let b = operands.get(2).copied().flatten();
    let out_dims = out[0].shape.as_fixed().ok_or("the result shape is not known")?;
    let spatial = x.rank() - 2;
    let (n, cin) = (x.dims()[0], x.dims()[1]);
    let m = out_dims[1];
    let group = c.group;
    let (cg, mg) = (cin / group, m / group);
    let kdims = &w.dims()[2..];
    let idims = &x.dims()[2..];
    let axes: Vec<TransposeAxis> = (0..spatial)
        .map(|i| transpose_axis(c, i, spatial, idims[i], kdims[i]))
        .collect::<Result<_, _>>()?;
    let odims: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let table = scatter_table(&axes, idims, kdims, &odims);
    let (nk, ni, no) = (
        kdims.iter().product::<usize>(),
        idims.iter().product::<usize>(),
        odims.iter().product::<usize>(),
    );
    let f64_path = x.dtype() == DType::F64;
    // Compute in f32 unless the tensors are f64, as Conv does.
    let to = if f64_path { DType::F64 } else { DType::F32 };
    let (xc, wc) = (x.cast(to), w.cast(to));
    macro_rules! run {
        ($t:ty) => {{
            let xs = xc.as_slice::<$t>().expect("cast");
            let ws = wc.as_slice::<$t>().expect("cast");
            let mut y = vec![0 as $t; n * m * no];
            for g in 0..group {
                // The group's weights [cg, mg * nk], transposed.
                let wg = ArrayView2::from_shape(
                    (cg, mg * nk),
                    &ws[g * cg * mg * nk..(g + 1) * cg * mg * nk],
                )
                .expect("weight layout");
                let wt = wg.t();
                for ni_ in 0..n {
                    let start = (ni_ * cin + g * cg) * ni;
                    let xg = ArrayView2::from_shape((cg, ni), &xs[start..start + cg * ni])
                        .expect("input layout");
                    let cols = wt.dot(&xg);
                    for mi in 0..mg {
                        let dst = &mut y[(ni_ * m + g * mg + mi) * no..][..no];
                        for kf in 0..nk {
                            let row = cols.row(mi * nk + kf);
                            for (i, v) in row.iter().enumerate() {
                                if let Some(o) = table[kf * ni + i] {
                                    dst[o] += *v;
                                }
                            }
                        }
                    }
                }
            }
            if let Some(b) = b {
                let bc = b.cast(to);
                let bs = bc.as_slice::<$t>().expect("cast");
                for (i, chunk) in y.chunks_mut(no).enumerate() {
                    let bias = bs[i % m];
                    chunk.iter_mut().for_each(|v| *v += bias);
                }
            }
            Tensor::from_vec(&out_dims, y).map_err(OpError::from)?
        }};
    }
    let y = if f64_path { run!(f64) } else { run!(f32) };
    Ok(vec![y.cast(x.dtype())])
}

/// For each (kernel offset, input position): the output offset it adds into, or `None` when it
/// falls outside the output (cut by padding).
fn scatter_table(
    axes: &[TransposeAxis],
    idims: &[usize],
    kdims: &[usize],
    odims: &[usize],
) -> Vec<Option<usize>> {
    // Per axis: [kernel offset][input position] -> output position.
    let per_axis: Vec<Vec<Vec<Option<usize>>>> = axes
        .iter()
        .enumerate()
        .map(|(d, a)| {
            (0..kdims[d])
                .map(|k| {
                    (0..idims[d])
                        .map(|i| {
                            let o = (i * a.stride + k * a.dilation) as i64 - a.pad_begin;
                            (0..a.output as i64).contains(&o).then_some(o as usize)
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    combine_tables(&per_axis, &super::strides(odims), kdims, idims)
}

/// kiln's integer convolution (ONNX QLinearConv's meaning): the centred integers convolved
/// exactly (in f64), the bias added, requantised as onnxruntime does (`quantize::requantise`:
/// in f32, times `x_scale * w_scale[m] / y_scale` formed in f32, rounded half to even, shifted by
/// the result zero point and saturated).
pub(super) fn qconv(
    c: &Conv,
    operands: &[Option<&Tensor>],
    out: &TensorType,
) -> Result<Tensor, OpError> {
    let get =
        |i: usize| operands.get(i).copied().flatten().ok_or(format!("operand {i} is missing"));
    let (x, w) = (get(0)?, get(3)?);
    let m = w.dims()[0];
    let per_channel = |t: &Tensor| -> Vec<f64> {
        let v = t.to_f64s();
        if v.len() == 1 {
            vec![v[0]; m]
        } else {
            v
        }
    };
    let (sx, zx) = (get(1)?.to_f64s()[0], get(2)?.to_f64s()[0]);
    let (sw, zw) = (per_channel(get(4)?), per_channel(get(5)?));
    let (sy, zy) = (get(6)?.to_f64s()[0], get(7)?.to_f64s()[0]);
    let bias = match operands.get(8).copied().flatten() {
        Some(b) => per_channel(b),
        None => vec![0.0; m],
    };
    let xs: Vec<f64> = x.to_f64s().iter().map(|v| v - zx).collect();
    let per_m = w.dims().iter().product::<usize>() / m.max(1);
    let ws: Vec<f64> = w.to_f64s().iter().enumerate().map(|(i, v)| v - zw[i / per_m]).collect();
    let xc = Tensor::from_f64s(DType::F64, x.dims(), &xs).map_err(OpError::from)?;
    let wc = Tensor::from_f64s(DType::F64, w.dims(), &ws).map_err(OpError::from)?;
    let dims = out.shape.as_fixed().ok_or("the result's shape is not known")?;
    let acc = conv(c, &xc, &wc, None, &dims)?.to_f64s();
    let plane: usize = dims[2..].iter().product();
    let (lo, hi) = super::quantize::quantized_range(out.dtype);
    let y: Vec<f64> = acc
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let ch = (i / plane) % m;
            let multiplier = super::quantize::requant_multiplier(sx, sw[ch], sy);
            super::quantize::requantise(a + bias[ch], multiplier, zy, lo, hi)
        })
        .collect();
    Tensor::from_f64s(out.dtype, &dims, &y).map_err(OpError::from)
}
