//! DFT and STFT as MatMuls by the constant matrix of their plan (`kiln_ir::infer::DftPlan`,
//! the weights the interpreter sums with), once the signal's length and the shape operands are
//! constants. MelWeightMatrix needs no rewrite: every operand decides its result, so it is folded
//! to a constant before this pass, or the node stays unsupported.

use kiln_ir::infer::{dft_axis, DftPlan, StftPlan};
use kiln_ir::{NodeId, Tensor, ValueId};

use super::image::{constant_ints, node_error};
use super::{compute_type, Emit};
use crate::Result;

/// The most entries of a transform's matrix (64 MiB of f32): past that the rewrite would make a
/// constant far larger than the signals it serves, and the node stays unsupported.
const DFT_MATRIX_LIMIT: usize = 1 << 24;

/// The one value of optional scalar operand `i`: `Some(None)` when absent, `None` when it is
/// not a constant.
fn scalar_operand(e: &Emit, id: NodeId, i: usize) -> Option<Option<i64>> {
    match e.g.operands(id).get(i).copied().flatten() {
        None => Some(None),
        Some(v) => constant_ints(e, Some(v)).and_then(|v| v.first().copied()).map(Some),
    }
}

/// The plan's matrix as a constant of the compute type, or `None` past the limit.
fn matrix(e: &mut Emit, plan: &DftPlan, cd: kiln_ir::DType) -> Result<Option<ValueId>> {
    let rows = plan.input_len * plan.input_parts;
    let cols = plan.output_len * plan.output_parts;
    if rows.checked_mul(cols).is_none_or(|n| n > DFT_MATRIX_LIMIT) {
        return Ok(None);
    }
    let m = Tensor::from_f64s(cd, &[rows, cols], &plan.matrix())?;
    Ok(Some(e.constant("dft_matrix", m)?))
}

/// DFT of `[pre..., m, post..., parts]` along the `m` axis: the axis and the parts moved last,
/// the lines `[P, m * parts]` times the `[m * parts, n * out_parts]` matrix, moved back.
pub(super) fn dft(
    e: &mut Emit,
    id: NodeId,
    inverse: bool,
    onesided: bool,
) -> Result<Option<Vec<ValueId>>> {
    let Some(x) = e.g.operands(id).first().copied().flatten() else { return Ok(None) };
    let (Some(dft_length), Some(axis)) = (scalar_operand(e, id, 1), scalar_operand(e, id, 2))
    else {
        return Ok(None);
    };
    let dims = e.dims(x)?;
    let r = dims.len();
    let axis = dft_axis(axis, r).map_err(|err| node_error(e, id, err))?;
    let plan = DftPlan::new(dims[axis], dims[r - 1], dft_length, inverse, onesided)
        .map_err(|err| node_error(e, id, err))?;
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let Some(m) = matrix(e, &plan, cd)? else { return Ok(None) };
    // [pre, m, post, parts] -> [pre, post, m, parts]
    let mut perm: Vec<usize> = (0..r - 1).filter(|&a| a != axis).collect();
    perm.extend([axis, r - 1]);
    let xc = e.cast("compute", x, cd)?;
    let moved = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        xc
    } else {
        e.transpose("lines", xc, &perm)?
    };
    let lines: usize = perm[..r - 2].iter().map(|&a| dims[a]).product();
    let flat = e.reshape("lines_flat", moved, &[lines, plan.input_len * plan.input_parts])?;
    let y = e.matmul("transform", flat, m)?;
    let mut moved_dims: Vec<usize> = perm[..r - 2].iter().map(|&a| dims[a]).collect();
    moved_dims.extend([plan.output_len, plan.output_parts]);
    let y = e.reshape("transformed", y, &moved_dims)?;
    // The inverse permutation puts the axis back.
    let mut back = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        back[p] = i;
    }
    let y = if back.iter().enumerate().all(|(i, &p)| i == p) {
        y
    } else {
        e.transpose("result_axes", y, &back)?
    };
    Ok(Some(vec![e.cast("result", y, dt)?]))
}

/// STFT of `[batch, length, parts]`: the frames gathered by a constant index table
/// `[frames, frame_length]` (`[batch, frames, frame_length, parts]`), times the window, each
/// frame `[frame_length * parts]` times the transform's matrix: `[batch, frames, bins, 2]`.
pub(super) fn stft(e: &mut Emit, id: NodeId, onesided: bool) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let Some(x) = ops.first().copied().flatten() else { return Ok(None) };
    let window = ops.get(2).copied().flatten();
    let (Some(Some(step)), Some(frame_length)) =
        (scalar_operand(e, id, 1), scalar_operand(e, id, 3))
    else {
        return Ok(None);
    };
    let dims = e.dims(x)?;
    let &[batch, length, parts] = &dims[..] else { return Ok(None) };
    let window_len = match window {
        Some(w) => Some(e.dims(w)?.iter().product()),
        None => None,
    };
    let plan = StftPlan::new(length, parts, step, frame_length, window_len, onesided)
        .map_err(|err| node_error(e, id, err))?;
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let Some(m) = matrix(e, &plan.dft, cd)? else { return Ok(None) };
    let (frames, fl) = (plan.frames, plan.frame_length);
    // The frame index table: past the limit (frames overlapping many times over a long
    // signal) the node stays unsupported rather than make a constant that large.
    if frames.checked_mul(fl).is_none_or(|n| n > DFT_MATRIX_LIMIT) {
        return Ok(None);
    }
    let index: Vec<i64> =
        (0..frames).flat_map(|f| (0..fl).map(move |j| (f * plan.frame_step + j) as i64)).collect();
    let index = e.constant("frame_index", Tensor::from_vec(&[frames, fl], index)?)?;
    let xc = e.cast("compute", x, cd)?;
    let framed = e.gather("frames", xc, index, 1)?;
    let framed = match window {
        Some(w) => {
            let wc = e.cast("window_compute", w, cd)?;
            let column = e.reshape("window_column", wc, &[fl, 1])?;
            e.mul("windowed", framed, column)?
        }
        None => framed,
    };
    let flat = e.reshape("frames_flat", framed, &[batch, frames, fl * parts])?;
    let y = e.matmul("transform", flat, m)?;
    let (bins, out_parts) = (plan.dft.output_len, plan.dft.output_parts);
    let y = e.reshape("spectra", y, &[batch, frames, bins, out_parts])?;
    Ok(Some(vec![e.cast("result", y, dt)?]))
}
