//! Convolution (im2col + GEMM per group) and pooling, for any number of spatial dimensions.

use ndarray::{Array2, ArrayView2, Axis};

use crate::op::{Conv, Pool, PoolKind, SpatialAxis, Window};
use crate::{DType, Tensor};

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

fn resolve(window: &Window, input: &[usize], kernel: &[usize], ceil_mode: bool) -> Result<Vec<SpatialAxis>, String> {
    (0..input.len()).map(|i| window.resolve(i, input[i], kernel[i], ceil_mode)).collect()
}

/// The element offset in one [C, spatial...] image of each (kernel offset, output position), or
/// `None` in the padding: an [n_kernel, n_out] table shared by every channel.
fn offsets(axes: &[SpatialAxis]) -> (Vec<Option<usize>>, usize, usize) {
    let tables = gather_tables(axes);
    let in_strides = super::strides(&axes.iter().map(|a| a.input).collect::<Vec<_>>());
    let kdims: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let odims: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let (nk, no) = (kdims.iter().product::<usize>(), odims.iter().product::<usize>());
    let mut out = Vec::with_capacity(nk * no);
    let mut k = vec![0; kdims.len()];
    for _ in 0..nk {
        let mut o = vec![0; odims.len()];
        for _ in 0..no {
            let mut off = Some(0);
            for d in 0..axes.len() {
                off = match (off, tables[d][k[d]][o[d]]) {
                    (Some(acc), Some(p)) => Some(acc + p * in_strides[d]),
                    _ => None,
                };
            }
            out.push(off);
            advance(&mut o, &odims);
        }
        advance(&mut k, &kdims);
    }
    (out, nk, no)
}

pub(super) fn conv(c: &Conv, x: &Tensor, w: &Tensor, b: Option<&Tensor>, out: &[usize]) -> Result<Tensor, String> {
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
                    let wg = ArrayView2::from_shape((mg, cg * nk), &ws[g * mg * cg * nk..(g + 1) * mg * cg * nk]).expect("weight layout");
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
            Tensor::from_vec(out, y).map_err(|e| e.to_string())?
        }};
    }
    let y = if f64_path { run!(f64) } else { run!(f32) };
    Ok(y.cast(x.dtype()))
}

pub(super) fn pool(p: &Pool, x: &Tensor, out: &[usize]) -> Result<Tensor, String> {
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
    for plane in 0..planes {
        let base = plane * image;
        for o in 0..no {
            let cells = (0..nk).filter_map(|k| table[k * no + o].map(|off| xs[base + off]));
            y.push(match p.kind {
                PoolKind::Max => cells.fold(f64::NEG_INFINITY, |m, v| if v > m || v.is_nan() { v } else { m }),
                PoolKind::Lp { p } => cells.map(|v| v.abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64),
                PoolKind::Average { count_include_pad } => {
                    let (sum, count) = cells.fold((0.0, 0usize), |(s, c), v| (s + v, c + 1));
                    let divisor = if count_include_pad { (0..nk).filter(|&k| in_padded[k * no + o]).count() } else { count };
                    sum / divisor.max(1) as f64
                }
            });
        }
    }
    Tensor::from_f64s(x.dtype(), out, &y).map_err(|e| e.to_string())
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
                PoolKind::Lp { p } => cells.iter().map(|v| v.abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64),
                PoolKind::Average { .. } => cells.iter().sum::<f64>() / image as f64,
            }
        })
        .collect();
    let mut dims = x.dims()[..2].to_vec();
    dims.resize(x.rank(), 1);
    Tensor::from_f64s(x.dtype(), &dims, &y).expect("one value per plane")
}

pub(super) fn conv_transpose(_c: &crate::op::ConvTranspose, _operands: &[Option<&Tensor>], _out: &[crate::TensorType]) -> Result<Vec<Tensor>, String> {
    Err("ConvTranspose is not implemented yet".into())
}
