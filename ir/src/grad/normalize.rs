//! Gradients of Softmax, LogSoftmax, LayerNormalization and BatchNormalization (its inference
//! form: the statistics are operands, so they get gradients like the scale and bias do).

use super::{rank, reduce_to, ty, Grads, RuleError, Step};
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
/// The statistics are recomputed from x rather than read from the node's optional results.
fn layer_norm<'g>(axis: i64, epsilon: f32, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    if s.grads.iter().skip(1).any(Option::is_some) {
        return Err(RuleError::Unsupported {
            what: "a gradient of LayerNormalization's statistics",
        });
    }
    let (x, scale, dy) = (s.input(0)?, s.input(1)?, s.dy()?);
    let r = rank(x)?;
    let a =
        normalize_axis(axis, r).ok_or(RuleError::Unsupported { what: "an axis out of range" })?;
    let axes: Vec<i64> = (a as i64..r as i64).collect();
    let xc = x.sub(x.reduce_mean(&axes, true));
    let var = xc.mul(xc).reduce_mean(&axes, true);
    let inv_std = var.add(x.scalar(f64::from(epsilon))).sqrt().reciprocal();
    let x_hat = xc.mul(inv_std);
    let dx = s.needs(0).then(|| {
        let g = dy.mul(scale);
        let centred = g.sub(g.reduce_mean(&axes, true));
        inv_std.mul(centred.sub(x_hat.mul(g.mul(x_hat).reduce_mean(&axes, true))))
    });
    let dscale = if s.needs(1) { Some(reduce_to(dy.mul(x_hat), &ty(scale)?.shape)?) } else { None };
    let dbias = match (s.needs(2), s.inputs.get(2).copied().flatten()) {
        (true, Some(b)) => Some(reduce_to(dy, &ty(b)?.shape)?),
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
