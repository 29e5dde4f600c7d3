//! Losses: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, computed in f64.

use crate::error::{invalid, OpError};
use crate::op::{Loss, LossReduction};
use crate::{Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (l, softmax) = match op {
        Op::NllLoss(l) => (l, false),
        Op::SoftmaxCrossEntropyLoss(l) => (l, true),
        _ => return Err(invalid!("{} is not a loss", op.name())),
    };
    let x = operands.first().copied().flatten().ok_or("the input is missing")?;
    let target = operands.get(1).copied().flatten().ok_or("the target is missing")?;
    let weight = operands.get(2).copied().flatten().map(|w| w.to_f64s());
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let inner: usize = x.dims()[2..].iter().product();
    let mut scores = x.to_f64s();
    if softmax {
        log_softmax_classes(&mut scores, n, c, inner);
    }
    let (losses, weight_sum) = nll(l, &scores, &target.to_i64s(), weight.as_deref(), n, c, inner)?;
    let loss = match l.reduction {
        LossReduction::None => losses,
        LossReduction::Sum => vec![losses.iter().sum()],
        // Weighted mean over the targets that count (0/0 = NaN when none does, as PyTorch).
        LossReduction::Mean => vec![losses.iter().sum::<f64>() / weight_sum],
    };
    let to = |ty: &TensorType, v: &[f64]| -> Result<Tensor, OpError> {
        let dims = ty.shape.as_fixed().ok_or_else(|| invalid!("result shape {ty} is not known"))?;
        Tensor::from_f64s(ty.dtype, &dims, v).map_err(OpError::from)
    };
    let mut results = vec![to(&out[0], &loss)?];
    if softmax {
        results.push(to(&out[1], &scores)?);
    }
    Ok(results)
}

/// In place, `log(softmax(x))` along the class axis of [n, c, inner] values.
fn log_softmax_classes(v: &mut [f64], n: usize, c: usize, inner: usize) {
    for b in 0..n {
        for i in 0..inner {
            let at = |k: usize| (b * c + k) * inner + i;
            let max = (0..c).map(|k| v[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let lse = max + (0..c).map(|k| (v[at(k)] - max).exp()).sum::<f64>().ln();
            for k in 0..c {
                v[at(k)] -= lse;
            }
        }
    }
}

/// `-w[t] * x[b, t, i]` for each target `t` (0 where it is ignored), and the sum of the weights used.
fn nll(
    l: &Loss,
    x: &[f64],
    targets: &[i64],
    weight: Option<&[f64]>,
    n: usize,
    c: usize,
    inner: usize,
) -> Result<(Vec<f64>, f64), OpError> {
    let mut losses = vec![0.0; n * inner];
    let mut weight_sum = 0.0;
    for b in 0..n {
        for i in 0..inner {
            let t = targets[b * inner + i];
            if l.ignore_index == Some(t) {
                continue;
            }
            let k = usize::try_from(t).ok().filter(|&k| k < c).ok_or_else(|| {
                format!("target {t} is not a class in 0..{c} (and not ignore_index)")
            })?;
            let w = weight.map_or(1.0, |w| w[k]);
            losses[b * inner + i] = -w * x[(b * c + k) * inner + i];
            weight_sum += w;
        }
    }
    Ok((losses, weight_sum))
}
