//! Signal processing: DFT and STFT as the direct sums their plans weigh (in f64, the angles
//! reduced exactly), and MelWeightMatrix from its shared rule.

use super::not_yet;
use crate::error::{invalid, OpError};
use crate::infer::{dft_axis, mel_weight_matrix, DftPlan, StftPlan};
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    Ok(match op {
        Op::Dft { inverse, onesided } => vec![dft(*inverse, *onesided, operands)?],
        Op::Stft { onesided } => vec![stft(*onesided, operands)?],
        Op::MelWeightMatrix { .. } => vec![mel(operands, out_types[0].dtype)?],
        _ => return not_yet(op),
    })
}

fn operand<'t>(operands: &[Option<&'t Tensor>], i: usize) -> Option<&'t Tensor> {
    operands.get(i).copied().flatten()
}

fn required<'t>(operands: &[Option<&'t Tensor>], i: usize) -> Result<&'t Tensor, OpError> {
    operand(operands, i).ok_or(OpError::MissingOperand { index: i })
}

/// The one integer of a scalar operand.
fn int(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match t.to_i64s()[..] {
        [v] => Ok(v),
        _ => Err(invalid!("{what} must hold one value, got {}", t.ty())),
    }
}

/// One line's transform: `line` holds `input_len * input_parts` values, the result
/// `output_len * output_parts`.
fn transform(plan: &DftPlan, twiddles: &[(f64, f64)], line: &[f64], out: &mut [f64]) {
    let (ip, op) = (plan.input_parts, plan.output_parts);
    // Points past the transform's length weigh nothing.
    let used = plan.input_len.min(plan.length);
    for k in 0..plan.output_len {
        for co in 0..op {
            let mut sum = 0.0;
            for j in 0..used {
                for ci in 0..ip {
                    sum += line[j * ip + ci] * plan.weight(twiddles, j, ci, k, co);
                }
            }
            out[k * op + co] = sum;
        }
    }
}

/// DFT along the axis: each line of points (the other axes fixed) transformed.
fn dft(inverse: bool, onesided: bool, operands: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let x = required(operands, 0)?;
    let dims = x.dims();
    let r = dims.len();
    let dft_length = operand(operands, 1).map(|t| int(t, "dft_length")).transpose()?;
    let axis = operand(operands, 2).map(|t| int(t, "axis")).transpose()?;
    let axis = dft_axis(axis, r)?;
    let plan = DftPlan::new(dims[axis], dims[r - 1], dft_length, inverse, onesided)?;
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..r - 1].iter().product();
    let (m, ip, n, op) = (plan.input_len, plan.input_parts, plan.output_len, plan.output_parts);
    let v = x.to_f64s();
    let tw = plan.twiddles();
    let mut y = vec![0.0; outer * n * inner * op];
    let (mut line, mut out) = (vec![0.0; m * ip], vec![0.0; n * op]);
    for o in 0..outer {
        for i in 0..inner {
            for j in 0..m {
                let at = ((o * m + j) * inner + i) * ip;
                line[j * ip..(j + 1) * ip].copy_from_slice(&v[at..at + ip]);
            }
            transform(&plan, &tw, &line, &mut out);
            for k in 0..n {
                let at = ((o * n + k) * inner + i) * op;
                y[at..at + op].copy_from_slice(&out[k * op..(k + 1) * op]);
            }
        }
    }
    let mut out_dims = dims.to_vec();
    out_dims[axis] = n;
    out_dims[r - 1] = op;
    Ok(Tensor::from_f64s(x.dtype(), &out_dims, &y)?)
}

/// STFT: each frame times the window, transformed.
fn stft(onesided: bool, operands: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let x = required(operands, 0)?;
    let &[batch, length, parts] = x.dims() else {
        return Err(invalid!("the signal must be [batch, length, 1 or 2], got {}", x.ty()));
    };
    let step = int(required(operands, 1)?, "frame_step")?;
    let window = operand(operands, 2);
    let frame_length = operand(operands, 3).map(|t| int(t, "frame_length")).transpose()?;
    let plan = StftPlan::new(length, parts, step, frame_length, window.map(|w| w.len()), onesided)?;
    let fl = plan.frame_length;
    let weights = window.map_or_else(|| vec![1.0; fl], Tensor::to_f64s);
    let dft = plan.dft;
    let (n, op) = (dft.output_len, dft.output_parts);
    let v = x.to_f64s();
    let tw = dft.twiddles();
    let mut y = vec![0.0; batch * plan.frames * n * op];
    let mut line = vec![0.0; fl * parts];
    for b in 0..batch {
        for f in 0..plan.frames {
            for j in 0..fl {
                let at = (b * length + f * plan.frame_step + j) * parts;
                for c in 0..parts {
                    line[j * parts + c] = v[at + c] * weights[j];
                }
            }
            let at = (b * plan.frames + f) * n * op;
            transform(&dft, &tw, &line, &mut y[at..at + n * op]);
        }
    }
    Ok(Tensor::from_f64s(x.dtype(), &[batch, plan.frames, n, op], &y)?)
}

/// MelWeightMatrix from its operands' values.
fn mel(operands: &[Option<&Tensor>], dtype: DType) -> Result<Tensor, OpError> {
    let float = |i: usize| -> Result<f64, OpError> {
        Ok(required(operands, i)?.to_f64s().first().copied().unwrap_or(f64::NAN))
    };
    let (rows, cols, m) = mel_weight_matrix(
        int(required(operands, 0)?, "num_mel_bins")?,
        int(required(operands, 1)?, "dft_length")?,
        int(required(operands, 2)?, "sample_rate")?,
        float(3)?,
        float(4)?,
    )?;
    Ok(Tensor::from_f64s(dtype, &[rows, cols], &m)?)
}
