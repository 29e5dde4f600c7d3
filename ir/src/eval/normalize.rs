//! Softmax and the normalisations, computed in f64.

use super::view;
use crate::{normalize_axis, DType, Tensor, TensorType};

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
pub(super) fn layer_norm(x: &Tensor, scale: &Tensor, bias: Option<&Tensor>, axis: i64, eps: f32, types: &[TensorType]) -> Result<Vec<Tensor>, String> {
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
    let stat = |vals: &[f64], t: &TensorType| Tensor::from_f64s(t.dtype, &t.shape.as_fixed().expect("fixed"), vals).map_err(|e| e.to_string());
    Ok(vec![Tensor::from_f64s(x.dtype(), x.dims(), &y).map_err(|e| e.to_string())?, stat(&means, &types[1])?, stat(&inv_stds, &types[2])?])
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
pub(super) fn eval(op: &crate::Op, _operands: &[Option<&Tensor>], _out: &[crate::TensorType]) -> Result<Vec<Tensor>, String> {
    super::not_yet(op)
}
