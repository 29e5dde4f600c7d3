//! Gradients of Softmax, LogSoftmax, LayerNormalization and BatchNormalization (its inference
//! form: the statistics are operands, so they get gradients like the scale and bias do).

use super::{expand_like, rank, reduce_to, ty, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::{normalize_axis, Op};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match s.op {
        Op::Softmax { axis } => {
            // dx = y (dy - Σ dy·y) along the axis.
            let (y, dy) = (s.outputs[0], s.dy()?);
            let a = [*axis];
            Ok(vec![Some(y.mul(dy.sub(dy.mul(y).reduce_sum(&a, true))))])
        }
        Op::LogSoftmax { axis } => {
            // dx = dy - softmax(x) Σ dy along the axis, softmax(x) = exp(y).
            let (y, dy) = (s.outputs[0], s.dy()?);
            Ok(vec![Some(log_softmax_backward(y, dy, *axis))])
        }
        Op::LayerNorm { axis, epsilon } => layer_norm(*axis, *epsilon, s),
        Op::BatchNorm { epsilon } => batch_norm(*epsilon, s),
        _ => Err(RuleError::NoRule),
    }
}

/// The input gradient of `y = log_softmax(x)` along `axis`, from `y` and `dy`.
pub(super) fn log_softmax_backward<'g>(y: Traced<'g>, dy: Traced<'g>, axis: i64) -> Traced<'g> {
    dy.sub(y.exp().mul(dy.reduce_sum(&[axis], true)))
}

/// With x̂ = (x - μ)·r, r = 1/√(σ² + ε) over the normalised axes and g = dy·scale:
/// dx = r (g - mean(g) - x̂ mean(g x̂)), dscale = Σ dy x̂, dbias = Σ dy (over the leading axes).
/// The statistics are recomputed from x rather than read from the node's optional results. When
/// the loss reads those results (Mean μ, InvStdDev r), dx also gets dμ/n and
/// dr·(-r³)(x - μ)/n, n the count of normalised elements (dσ²/dx = 2(x - μ)/n, dr/dσ² = -r³/2).
fn layer_norm<'g>(axis: i64, epsilon: f32, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (x, scale) = (s.input(0)?, s.input(1)?);
    // The statistics of an f16 or bf16 x are f32: their gradients are taken back to x's type.
    let dt = ty(x)?.dtype;
    let stat_grad = |i: usize| -> Result<Option<Traced<'g>>, RuleError> {
        match s.grads.get(i).copied().flatten() {
            Some(d) if ty(d)?.dtype != dt => Ok(Some(d.cast(dt))),
            d => Ok(d),
        }
    };
    let (d_mean, d_inv_std) = (stat_grad(1)?, stat_grad(2)?);
    let dy = match s.grads.first().copied().flatten() {
        Some(d) => Some(d),
        None if d_mean.is_none() && d_inv_std.is_none() => Some(s.dy()?),
        None => None,
    };
    let r = rank(x)?;
    let a =
        normalize_axis(axis, r).ok_or(RuleError::Unsupported { what: "an axis out of range" })?;
    let axes: Vec<i64> = (a as i64..r as i64).collect();
    let xc = x.sub(x.reduce_mean(&axes, true));
    let var = xc.mul(xc).reduce_mean(&axes, true);
    let inv_std = var.add(x.scalar(f64::from(epsilon))).sqrt().reciprocal();
    let x_hat = xc.mul(inv_std);
    let mut dx = match (s.needs(0), dy) {
        (true, Some(dy)) => {
            let g = dy.mul(scale);
            let centred = g.sub(g.reduce_mean(&axes, true));
            Some(inv_std.mul(centred.sub(x_hat.mul(g.mul(x_hat).reduce_mean(&axes, true)))))
        }
        _ => None,
    };
    if s.needs(0) && (d_mean.is_some() || d_inv_std.is_some()) {
        let t = ty(x)?;
        let count: Option<usize> = (a..r).map(|i| t.shape.dims()[i].fixed()).product();
        let count = count.ok_or_else(|| RuleError::NeedsFixedShape {
            what: "the normalised axes",
            ty: Box::new(t.clone()),
        })?;
        let n = x.scalar(count as f64);
        // Each statistic's gradient has the statistic's shape ([..., 1, ...]) and broadcasts
        // over the normalised axes.
        let mut stats = match d_mean {
            Some(dm) => Some(expand_like(dm.div(n), x)?),
            None => None,
        };
        if let Some(dr) = d_inv_std {
            let r3 = inv_std.mul(inv_std).mul(inv_std);
            let term = dr.mul(r3).mul(xc).div(n).neg();
            stats = Some(match stats {
                Some(m) => m.add(term),
                None => term,
            });
        }
        dx = match (dx, stats) {
            (Some(d), Some(m)) => Some(d.add(m)),
            (d, m) => d.or(m),
        };
    }
    let dscale = match (s.needs(1), dy) {
        (true, Some(dy)) => Some(reduce_to(dy.mul(x_hat), &ty(scale)?.shape)?),
        _ => None,
    };
    let dbias = match (s.needs(2), s.inputs.get(2).copied().flatten(), dy) {
        (true, Some(b), Some(dy)) => Some(reduce_to(dy, &ty(b)?.shape)?),
        _ => None,
    };
    Ok(vec![dx, dscale, dbias])
}

/// y = (x - mean)·k + bias with k = scale/√(var + ε) per channel (axis 1): dx = dy·k,
/// dscale = Σ dy (x - mean)/√(var + ε), dbias = Σ dy, dmean = -k Σ dy,
/// dvar = -½ scale (var + ε)^(-3/2) Σ dy (x - mean), the sums over every axis but the channel's.
fn batch_norm<'g>(epsilon: f32, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (x, dy) = (s.input(0)?, s.dy()?);
    let (scale, mean, var) = (s.input(1)?, s.input(3)?, s.input(4)?);
    let r = rank(x)?;
    // The per-channel [C] operands shaped [C, 1, ...] to broadcast against [N, C, ...].
    let trailing: Vec<i64> = (1..r as i64 - 1).collect();
    let per_channel = |t: Traced<'g>| if trailing.is_empty() { t } else { t.unsqueeze(&trailing) };
    let others: Vec<i64> = [0].into_iter().chain(2..r as i64).collect();
    let sum = |t: Traced<'g>| t.reduce_sum(&others, false);
    let inv_std = var.add(var.scalar(f64::from(epsilon))).sqrt().reciprocal();
    let k = scale.mul(inv_std);
    let xc = x.sub(per_channel(mean));
    let dx = s.needs(0).then(|| dy.mul(per_channel(k)));
    let dscale = s.needs(1).then(|| sum(dy.mul(xc)).mul(inv_std));
    let dbias = s.needs(2).then(|| sum(dy));
    let dmean = s.needs(3).then(|| sum(dy).mul(k).neg());
    let dvar = s.needs(4).then(|| {
        let cube = inv_std.mul(inv_std).mul(inv_std);
        sum(dy.mul(xc)).mul(scale).mul(cube).mul(var.scalar(-0.5))
    });
    Ok(vec![dx, dscale, dbias, dmean, dvar])
}
