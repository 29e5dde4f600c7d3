//! Batch normalisation in training mode, as ONNX's BatchNormalization defines it with
//! `training_mode = 1`: the batch's statistics normalise, and the running statistics are updated
//! with them. Built from ReduceMean, elementwise ops and the inference-form BatchNormalization
//! fed the batch statistics, so it needs no op of its own: every target's BatchNormalization
//! kernel runs it, and its gradient is the chain of the existing rules (the inference rule gives
//! the statistics' gradients, ReduceMean's takes them back to the input).

use crate::builder::Traced;
use crate::{BinaryOp, Graph, Op, ValueId};

/// The results of [`batch_norm_training`].
#[derive(Clone, Copy)]
pub struct BatchNormTraining<'g> {
    /// The normalised input.
    pub y: Traced<'g>,
    /// The batch's per-channel mean and (population) variance.
    pub batch_mean: Traced<'g>,
    pub batch_var: Traced<'g>,
    /// `running·momentum + batch·(1 - momentum)` for the mean and the variance.
    pub running_mean: Traced<'g>,
    pub running_var: Traced<'g>,
}

/// Normalises `x` [N, C, ...] per channel (axis 1) by its batch statistics; `scale`, `bias`,
/// `running_mean` and `running_var` are [C]. The variance is the population variance (divided
/// by the count, not the count less one), as ONNX's reference computes it.
pub fn batch_norm_training<'g>(
    x: Traced<'g>,
    scale: Traced<'g>,
    bias: Traced<'g>,
    running_mean: Traced<'g>,
    running_var: Traced<'g>,
    epsilon: f32,
    momentum: f32,
) -> BatchNormTraining<'g> {
    let rank = x.ty().map_or(2, |t| t.rank()) as i64;
    let others: Vec<i64> = [0].into_iter().chain(2..rank).collect();
    let mean_kept = x.reduce_mean(&others, true);
    let centred = x.sub(mean_kept);
    let var_kept = centred.mul(centred).reduce_mean(&others, true);
    let batch_mean = mean_kept.squeeze(&others);
    let batch_var = var_kept.squeeze(&others);
    let y = x.batch_norm(scale, bias, batch_mean, batch_var, epsilon);
    let m = f64::from(momentum);
    let blend = |running: Traced<'g>, batch: Traced<'g>| {
        running.mul(running.scalar(m)).add(batch.mul(batch.scalar(1.0 - m)))
    };
    BatchNormTraining {
        y,
        batch_mean,
        batch_var,
        running_mean: blend(running_mean, batch_mean),
        running_var: blend(running_var, batch_var),
    }
}

/// A running statistic a graph updates: the constant it starts from and the value it becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunningStat {
    /// The statistic before the step: a constant of the graph (an ONNX initializer).
    pub constant: ValueId,
    /// `constant·momentum + batch·(1 - momentum)`: the statistic after.
    pub update: ValueId,
}

/// The running statistics of the training-mode batch normalisations of `graph`, as
/// [`batch_norm_training`] builds them (the ONNX importer's `training_mode = 1` included), in
/// node order. Found by that shape: `Add(Mul(C, m), Mul(s, k))` with `C` a constant, `m` and
/// `k` scalar constants summing to 1, and `s` the mean or variance a BatchNormalization
/// normalises by (its operand 3 or 4). Nothing looser: a training step overwrites each
/// constant found with its update, so a blend of a constant that is no running statistic must
/// not match.
pub fn running_statistics(graph: &Graph) -> Vec<RunningStat> {
    let scalar = |v: ValueId| match graph.constant_value(v) {
        Some(t) if t.len() == 1 => t.to_f64s().first().copied(),
        _ => None,
    };
    // (left operand, right operand as a scalar constant) of a Mul.
    let scaled = |v: ValueId| -> Option<(ValueId, f64)> {
        if v.output != 0 || !matches!(graph.node(v.node).op, Op::Binary(BinaryOp::Mul)) {
            return None;
        }
        match graph.operands(v.node)[..] {
            [Some(a), Some(k)] => Some((a, scalar(k)?)),
            _ => None,
        }
    };
    let normalises_by = |v: ValueId| {
        graph.users(v).iter().any(|&(user, operand)| {
            matches!(graph.node(user).op, Op::BatchNorm { .. }) && (operand == 3 || operand == 4)
        })
    };
    let mut found = Vec::new();
    for (id, node) in graph.nodes() {
        if !matches!(node.op, Op::Binary(BinaryOp::Add)) {
            continue;
        }
        let [Some(left), Some(right)] = graph.operands(id)[..] else { continue };
        let (Some((c, m)), Some((s, k))) = (scaled(left), scaled(right)) else { continue };
        // m and 1 - m were each rounded to the statistic's type.
        if graph.constant_value(c).is_some() && normalises_by(s) && (m + k - 1.0).abs() < 1e-6 {
            found.push(RunningStat { constant: c, update: ValueId::new(id, 0) });
        }
    }
    found
}
