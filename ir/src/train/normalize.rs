//! Batch normalisation in training mode, as ONNX's BatchNormalization defines it with
//! `training_mode = 1`: the batch's statistics normalise, and the running statistics are updated
//! with them. Built from ReduceMean, elementwise ops and the inference-form BatchNormalization
//! fed the batch statistics, so it needs no op of its own: every target's BatchNormalization
//! kernel runs it, and its gradient is the chain of the existing rules (the inference rule gives
//! the statistics' gradients, ReduceMean's takes them back to the input).

use crate::builder::Traced;

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
