//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (LogSoftmax over the classes, then the
//! same loss). The target's class is picked with a one-hot comparison: `Where(class == target, x,
//! 0)` summed over the class axis, which is exact and needs no gather kernel.

use kiln_ir::op::{Loss, LossReduction};
use kiln_ir::{BinaryOp, NodeId, Op, Tensor, UnaryOp, ValueId};

use super::{compute_type, Emit};
use crate::Result;

pub(super) fn decompose(
    e: &mut Emit,
    id: NodeId,
    l: &Loss,
    softmax: bool,
) -> Result<Option<Vec<ValueId>>> {
    let node = e.g.node(id).clone();
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(target)) = (operand(0), operand(1)) else { return Ok(None) };
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let xd = e.dims(x)?;
    if xd.len() < 2 {
        return Ok(None);
    }
    let classes = xd[1];
    let td = e.dtype(target);
    let xc = e.cast("input_compute", x, cd)?;
    let (scores, log_prob) = if softmax {
        let lp = e.op2("log_prob", Op::LogSoftmax { axis: 1 }, &[xc])?;
        (lp, Some(lp))
    } else {
        (xc, None)
    };

    // one_hot[n, k, d...] = (k == target[n, d...]), the class axis at 1 as in the scores.
    let mut class_dims = vec![1; xd.len()];
    class_dims[1] = classes;
    let ks: Vec<f64> = (0..classes).map(|k| k as f64).collect();
    let class_index = e.constant("class_index", Tensor::from_f64s(td, &class_dims, &ks)?)?;
    let mut tdims = xd.clone();
    tdims[1] = 1;
    let t1 = e.reshape("target_classes", target, &tdims)?;
    let one_hot = e.binary("one_hot", BinaryOp::Equal, class_index, t1)?;
    let zero = e.scalar(0.0, cd)?;
    let picked = e.select("picked_all", one_hot, scores, zero)?;
    let picked = e.reduce_sum("picked", picked, Some(&[1]), false)?;
    // The weight of each target (1 without weights).
    let weight = match operand(2) {
        Some(w) => {
            let w = e.cast("weight_compute", w, cd)?;
            let w = e.reshape("weight_classes", w, &class_dims)?;
            let wa = e.select("target_weight_all", one_hot, w, zero)?;
            Some(e.reduce_sum("target_weight", wa, Some(&[1]), false)?)
        }
        None => None,
    };
    // Targets equal to ignore_index count for nothing.
    let kept = match l.ignore_index {
        Some(ii) => {
            let ii = e.constant("ignore_index", Tensor::from_f64s(td, &[], &[ii as f64])?)?;
            let ignored = e.binary("ignored", BinaryOp::Equal, target, ii)?;
            Some(e.unary("kept", UnaryOp::Not, ignored)?)
        }
        None => None,
    };
    let weighted = match weight {
        Some(w) => e.mul("weighted", w, picked)?,
        None => picked,
    };
    let mut loss = e.unary("loss_each", UnaryOp::Neg, weighted)?;
    if let Some(k) = kept {
        loss = e.select("loss_kept", k, loss, zero)?;
    }
    let loss = match l.reduction {
        LossReduction::None => loss,
        LossReduction::Sum => e.reduce_sum("loss_sum", loss, None, false)?,
        LossReduction::Mean => {
            // Weighted mean over the targets that count (0/0 = NaN when none does).
            let sum = e.reduce_sum("loss_sum", loss, None, false)?;
            let denom = match (weight, kept) {
                (None, None) => {
                    let n: usize = e.dims(target)?.iter().product();
                    e.scalar(n as f64, cd)?
                }
                (w, k) => {
                    // Per target (the weights, or the kept mask, have the target's shape).
                    let one = e.scalar(1.0, cd)?;
                    let w = w.unwrap_or(one);
                    let w = match k {
                        Some(k) => e.select("weight_kept", k, w, zero)?,
                        None => w,
                    };
                    e.reduce_sum("weight_sum", w, None, false)?
                }
            };
            e.binary("loss_mean", BinaryOp::Div, sum, denom)?
        }
    };
    let mut results = vec![e.cast("loss", loss, dt)?];
    if let Some(lp) = log_prob {
        if node.outputs.len() > 1 {
            results.push(e.cast("log_prob_out", lp, dt)?);
        }
    }
    Ok(Some(results))
}
