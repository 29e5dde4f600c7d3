//! Softmax and the normalisations, computed in f64.

use super::{first, view};
use crate::error::OpError;
use crate::op::Lrn;
use crate::{normalize_axis, DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::Softmax { axis } => vec![softmax(x(), *axis)],
        Op::LayerNorm { axis, epsilon } => layer_norm(
            x(),
            operands[1].expect("checked"),
            operands.get(2).copied().flatten(),
            *axis,
            *epsilon,
            out_types,
        )?,
        Op::BatchNorm { epsilon } => {
            vec![batch_norm(
                x(),
                &operands[1..5].iter().map(|o| o.expect("checked")).collect::<Vec<_>>(),
                *epsilon,
            )]
        }
        _ => return normalization(op, operands, out_types),
    })
}

/// `x` as f64 rows: [outer, n, inner] for an axis of size n, so the axis is a strided run.
fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

pub(super) fn softmax(x: &Tensor, axis: i64) -> Tensor {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    let (outer, n, inner) = split_at_axis(x.dims(), a);
    let mut v = x.to_f64s();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * n * inner + j * inner + i;
            let max = (0..n).map(|j| v[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for j in 0..n {
                let e = (v[at(j)] - max).exp();
                v[at(j)] = e;
                sum += e;
            }
            for j in 0..n {
                v[at(j)] /= sum;
            }
        }
    }
    Tensor::from_f64s(x.dtype(), x.dims(), &v).expect("same count")
}

/// Y, Mean and InvStdDev (the last two as `types` says).
pub(super) fn layer_norm(
    x: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    axis: i64,
    eps: f32,
    types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    let outer: usize = x.dims()[..a].iter().product();
    let norm_dims = &x.dims()[a..];
    let inner: usize = norm_dims.iter().product();
    // Scale and bias broadcast to the normalised shape.
    let spread = |t: &Tensor| -> Vec<f64> {
        let t64 = t.cast(DType::F64);
        let v = view::<f64>(&t64);
        v.broadcast(ndarray::IxDyn(norm_dims)).expect("inferred").iter().copied().collect()
    };
    let s = spread(scale);
    let b = bias.map(spread);
    let v = x.to_f64s();
    let mut y = vec![0.0; v.len()];
    let (mut means, mut inv_stds) = (Vec::with_capacity(outer), Vec::with_capacity(outer));
    for o in 0..outer {
        let row = &v[o * inner..(o + 1) * inner];
        let mean = row.iter().sum::<f64>() / inner as f64;
        let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for j in 0..inner {
            y[o * inner + j] = (row[j] - mean) * inv * s[j] + b.as_ref().map_or(0.0, |b| b[j]);
        }
        means.push(mean);
        inv_stds.push(inv);
    }
    let stat = |vals: &[f64], t: &TensorType| {
        Tensor::from_f64s(t.dtype, &t.shape.as_fixed().expect("fixed"), vals).map_err(OpError::from)
    };
    Ok(vec![
        Tensor::from_f64s(x.dtype(), x.dims(), &y).map_err(OpError::from)?,
        stat(&means, &types[1])?,
        stat(&inv_stds, &types[2])?,
    ])
}

/// Inference-mode batch normalisation; `params` = scale, bias, mean, var.
pub(super) fn batch_norm(x: &Tensor, params: &[&Tensor], eps: f32) -> Tensor {
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let inner: usize = x.dims()[2..].iter().product();
    let p: Vec<Vec<f64>> = params.iter().map(|t| t.to_f64s()).collect();
    let (scale, bias, mean, var) = (&p[0], &p[1], &p[2], &p[3]);
    let mut v = x.to_f64s();
    for ni in 0..n {
        for ci in 0..c {
            let k = scale[ci] / (var[ci] + eps as f64).sqrt();
            let start = (ni * c + ci) * inner;
            for e in &mut v[start..start + inner] {
                *e = (*e - mean[ci]) * k + bias[ci];
            }
        }
    }
    Tensor::from_f64s(x.dtype(), x.dims(), &v).expect("same count")
}

/// LogSoftmax, Hardmax, InstanceNormalization, GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.
fn normalization(
    op: &Op,
    operands: &[Option<&Tensor>],
    _out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let arg =
        |i: usize| operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i });
    let x = arg(0)?;
    let y = match op {
        Op::LogSoftmax { axis } => along_axis(x, *axis, |v| {
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_sum = v.iter().map(|e| (e - max).exp()).sum::<f64>().ln();
            v.iter_mut().for_each(|e| *e = *e - max - log_sum);
        }),
        // One-hot of the first maximum (numpy's argmax: a NaN counts as the maximum).
        Op::Hardmax { axis } => along_axis(x, *axis, |v| {
            let mut best = 0;
            for j in 1..v.len() {
                if v[j] > v[best] || (v[j].is_nan() && !v[best].is_nan()) {
                    best = j;
                }
            }
            v.iter_mut().enumerate().for_each(|(j, e)| *e = (j == best) as u8 as f64);
        }),
        Op::LpNorm { axis, p } => along_axis(x, *axis, |v| {
            let norm = if *p == 1 {
                v.iter().map(|e| e.abs()).sum::<f64>()
            } else {
                v.iter().map(|e| e * e).sum::<f64>().sqrt()
            };
            // A zero norm gives zeros rather than NaN (ONNX).
            v.iter_mut().for_each(|e| *e = if norm == 0.0 { 0.0 } else { *e / norm });
        }),
        Op::InstanceNorm { epsilon } => group_norm(x, arg(1)?, arg(2)?, x.dims()[1], *epsilon),
        Op::GroupNorm { num_groups, epsilon } => {
            group_norm(x, arg(1)?, arg(2)?, *num_groups, *epsilon)
        }
        Op::RmsNorm { axis, epsilon } => rms_norm(x, arg(1)?, *axis, *epsilon)?,
        Op::Lrn(l) => lrn(x, l),
        Op::MeanVarianceNorm { axes } => mean_variance_norm(x, axes),
        _ => return super::not_yet(op),
    };
    Ok(vec![Tensor::from_f64s(x.dtype(), x.dims(), &y).map_err(OpError::from)?])
}

/// `x` as f64 with `f` applied to every line along `axis` (a copied-out run of values).
fn along_axis(x: &Tensor, axis: i64, mut f: impl FnMut(&mut [f64])) -> Vec<f64> {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    let (outer, n, inner) = split_at_axis(x.dims(), a);
    let mut v = x.to_f64s();
    let mut line = vec![0.0; n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * n * inner + j * inner + i;
            for (j, e) in line.iter_mut().enumerate() {
                *e = v[at(j)];
            }
            f(&mut line);
            for (j, e) in line.iter().enumerate() {
                v[at(j)] = *e;
            }
        }
    }
    v
}

/// Mean and population variance of a slice.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / n)
}

/// Statistics per sample and group of channels; scale and bias per channel. Instance
/// normalisation is the case of one channel per group.
fn group_norm(x: &Tensor, scale: &Tensor, bias: &Tensor, groups: usize, eps: f32) -> Vec<f64> {
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let inner: usize = x.dims()[2..].iter().product();
    let (scale, bias) = (scale.to_f64s(), bias.to_f64s());
    let mut v = x.to_f64s();
    if c == 0 {
        return v;
    }
    let per_group = c / groups * inner;
    for ni in 0..n {
        for g in 0..groups {
            let start = (ni * c) * inner + g * per_group;
            let chunk = &mut v[start..start + per_group];
            let (mean, var) = moments(chunk);
            let inv = 1.0 / (var + eps as f64).sqrt();
            for (j, e) in chunk.iter_mut().enumerate() {
                let ch = g * (c / groups) + j / inner.max(1);
                *e = (*e - mean) * inv * scale[ch] + bias[ch];
            }
        }
    }
    v
}

/// `x / sqrt(mean(x^2 over axis..) + eps) * scale`, scale broadcast to x.
fn rms_norm(x: &Tensor, scale: &Tensor, axis: i64, eps: f32) -> Result<Vec<f64>, OpError> {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    let inner: usize = x.dims()[a..].iter().product();
    let s64 = scale.cast(DType::F64);
    let s: Vec<f64> = view::<f64>(&s64)
        .broadcast(ndarray::IxDyn(x.dims()))
        .ok_or("scale does not broadcast to the input")?
        .iter()
        .copied()
        .collect();
    let mut v = x.to_f64s();
    if inner == 0 {
        return Ok(v);
    }
    for (o, row) in v.chunks_mut(inner).enumerate() {
        let rms = (row.iter().map(|e| e * e).sum::<f64>() / inner as f64 + eps as f64).sqrt();
        for (j, e) in row.iter_mut().enumerate() {
            *e = *e / rms * s[o * inner + j];
        }
    }
    Ok(v)
}

/// Local response normalisation across channels, with ONNX's window
/// `[c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]` clipped to the channels.
fn lrn(x: &Tensor, l: &Lrn) -> Vec<f64> {
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let inner: usize = x.dims()[2..].iter().product();
    let v = x.to_f64s();
    let (before, after) = ((l.size - 1) / 2, l.size / 2);
    let k = l.alpha as f64 / l.size as f64;
    let mut y = vec![0.0; v.len()];
    for ni in 0..n {
        for ci in 0..c {
            let (lo, hi) = (ci.saturating_sub(before), (ci + after).min(c - 1));
            for i in 0..inner {
                let at = |ch: usize| (ni * c + ch) * inner + i;
                let sq: f64 = (lo..=hi).map(|ch| v[at(ch)] * v[at(ch)]).sum();
                y[at(ci)] = v[at(ci)] / (l.bias as f64 + k * sq).powf(l.beta as f64);
            }
        }
    }
    y
}

/// `(x - mean) / (std + 1e-9)` with the statistics over `axes` (ONNX's function body adds the
/// epsilon to the standard deviation).
fn mean_variance_norm(x: &Tensor, axes: &[i64]) -> Vec<f64> {
    let dims = x.dims();
    let reduced: Vec<bool> = (0..dims.len())
        .map(|d| axes.iter().any(|&a| normalize_axis(a, dims.len()) == Some(d)))
        .collect();
    // Each element's statistics slot: its index with the reduced axes dropped.
    let kept: Vec<usize> = (0..dims.len()).map(|d| if reduced[d] { 1 } else { dims[d] }).collect();
    let kept_strides = super::strides(&kept);
    let slots: usize = kept.iter().product();
    let count = (dims.iter().product::<usize>() / slots.max(1)).max(1) as f64;
    let v = x.to_f64s();
    let slot_of: Vec<usize> = {
        let mut idx = vec![0; dims.len()];
        (0..v.len())
            .map(|_| {
                let s = (0..dims.len())
                    .filter(|&d| !reduced[d])
                    .map(|d| idx[d] * kept_strides[d])
                    .sum();
                for d in (0..dims.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < dims[d] {
                        break;
                    }
                    idx[d] = 0;
                }
                s
            })
            .collect()
    };
    let mut mean = vec![0.0; slots];
    for (e, &s) in v.iter().zip(&slot_of) {
        mean[s] += e;
    }
    mean.iter_mut().for_each(|m| *m /= count);
    let mut var = vec![0.0; slots];
    for (e, &s) in v.iter().zip(&slot_of) {
        var[s] += (e - mean[s]) * (e - mean[s]);
    }
    v.iter().zip(&slot_of).map(|(e, &s)| (e - mean[s]) / ((var[s] / count).sqrt() + 1e-9)).collect()
}
