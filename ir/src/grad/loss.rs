//! Gradients of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss with respect to their input
//! (log-probabilities, or scores): weights per class and `ignore_index` as the forward reads them.

use super::normalize::log_softmax_backward;
use super::{ty, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::op::{Loss, LossReduction};
use crate::{Dim, Op, Tensor, UnaryOp};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    if s.needs(2) {
        return Err(RuleError::Unsupported { what: "a gradient of a loss's class weights" });
    }
    match s.op {
        Op::NllLoss(l) => {
            let d = match s.grads.first().copied().flatten() {
                Some(dy) => Some(nll_backward(l, s, dy)?),
                None => None,
            };
            Ok(vec![d, None, None])
        }
        Op::SoftmaxCrossEntropyLoss(l) => {
            let scores = s.input(0)?;
            // The log-probabilities: the node's second result when it has one, else recomputed.
            let log_prob = match s.outputs.get(1) {
                Some(&lp) => lp,
                None => s.g.apply(Op::LogSoftmax { axis: 1 }, &[Some(scores)], 1)[0],
            };
            let from_loss = match s.grads.first().copied().flatten() {
                Some(dy) => Some(nll_backward(l, s, dy)?),
                None => None,
            };
            let d_log_prob = match (from_loss, s.grads.get(1).copied().flatten()) {
                (Some(a), Some(b)) => a.add(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return Ok(vec![None, None, None]),
            };
            Ok(vec![Some(log_softmax_backward(log_prob, d_log_prob, 1)), None, None])
        }
        _ => Err(RuleError::NoRule),
    }
}

/// The gradient with respect to the log-probabilities [N, C, d...] of
/// loss_i = -w_i · logp[i, target_i], w_i the target's class weight (1 without weights, 0 where
/// the target is `ignore_index`), reduced as `l` says: -onehot(target) · w_i · g_i with g_i the
/// loss gradient per element (`dy` for `none`, `dy` for `sum`, `dy / Σ w` for `mean`).
fn nll_backward<'g>(l: &Loss, s: &Step<'_, 'g>, dy: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    let (input, target) = (s.input(0)?, s.input(1)?);
    let t = ty(input)?;
    let classes = t.shape.dims().get(1).and_then(Dim::fixed).ok_or_else(|| {
        RuleError::NeedsFixedShape { what: "the class axis", ty: Box::new(t.clone()) }
    })?;
    let g = s.g;
    let index_type = ty(target)?.dtype;
    let (safe_target, kept) = match l.ignore_index {
        Some(ignored) => {
            let ignored = g.anon_constant(Tensor::full(index_type, &[], ignored as f64));
            let kept = target.equal(ignored).unary(UnaryOp::Not);
            let zero = g.anon_constant(Tensor::zeros(index_type, &[]));
            (kept.select(target, zero), Some(kept.cast(t.dtype)))
        }
        None => (target, None),
    };
    let mut weight = match s.inputs.get(2).copied().flatten() {
        Some(w) => w.gather(safe_target, 0),
        // Ones shaped as the target, its symbols kept: the (finite) targets times 0, plus 1.
        None => target.cast(t.dtype).mul(input.scalar(0.0)).add(input.scalar(1.0)),
    };
    if let Some(kept) = kept {
        weight = weight.mul(kept);
    }
    let mut per_item = dy.mul(weight);
    if l.reduction == LossReduction::Mean {
        per_item = per_item.div(weight.reduce_sum(&[], false));
    }
    let depth = g.anon_constant(Tensor::scalar(classes as i64));
    let values = Tensor::from_f64s(t.dtype, &[2], &[0.0, 1.0]).map_err(RuleError::Build)?;
    let values = g.anon_constant(values);
    let one_hot =
        g.apply(Op::OneHot { axis: 1 }, &[Some(safe_target), Some(depth), Some(values)], 1)[0];
    Ok(one_hot.mul(per_item.unsqueeze(&[1])).neg())
}
