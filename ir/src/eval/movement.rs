//! Data movement: transpose, concat, split, slice, gather, expand. (Reshape-like ops only
//! re-label the shared data.)

use ndarray::{Axis, IxDyn};

use super::{first, not_yet, tensor, typed, view};
use crate::error::OpError;
use crate::infer::slice_axis;
use crate::{normalize_axis, Element, Op, Tensor};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_dims: &[Vec<usize>],
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze => {
            vec![x().reshape(&out_dims[0]).map_err(|e| e.to_string())?]
        }
        Op::Transpose { perm } => vec![transpose(x(), perm)],
        Op::Concat { axis } => {
            vec![concat(&operands.iter().map(|o| o.expect("checked")).collect::<Vec<_>>(), *axis)]
        }
        Op::Split { axis, .. } => split(x(), *axis, out_dims),
        Op::Slice => vec![slice(
            x(),
            &operands[1..].iter().map(|o| o.map(|t| t.to_i64s())).collect::<Vec<_>>(),
        )?],
        Op::Gather { axis } => {
            vec![gather(x(), operands[1].expect("checked"), *axis, &out_dims[0])?]
        }
        Op::Expand => vec![expand(x(), &out_dims[0])],
        _ => return not_yet(op),
    })
}

pub(super) fn transpose(x: &Tensor, perm: &[usize]) -> Tensor {
    let perm: Vec<usize> =
        if perm.is_empty() { (0..x.rank()).rev().collect() } else { perm.to_vec() };
    fn go<T: Element>(x: &Tensor, perm: &[usize]) -> Tensor {
        tensor(view::<T>(x).permuted_axes(IxDyn(perm)).to_owned())
    }
    typed!(x.dtype(), go(x, &perm))
}

pub(super) fn concat(xs: &[&Tensor], axis: i64) -> Tensor {
    let a = normalize_axis(axis, xs[0].rank()).expect("inferred");
    fn go<T: Element>(xs: &[&Tensor], a: usize) -> Tensor {
        let views: Vec<_> = xs.iter().map(|t| view::<T>(t)).collect();
        tensor(ndarray::concatenate(Axis(a), &views).expect("inferred"))
    }
    typed!(xs[0].dtype(), go(xs, a))
}

pub(super) fn split(x: &Tensor, axis: i64, outs: &[Vec<usize>]) -> Vec<Tensor> {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    fn go<T: Element>(x: &Tensor, a: usize, outs: &[Vec<usize>]) -> Vec<Tensor> {
        let v = view::<T>(x);
        let mut start = 0;
        outs.iter()
            .map(|d| {
                let part =
                    v.slice_axis(Axis(a), ndarray::Slice::from(start..start + d[a])).to_owned();
                start += d[a];
                tensor(part)
            })
            .collect()
    }
    typed!(x.dtype(), go(x, a, outs))
}

/// `params` = starts, ends, axes?, steps? as integer lists.
pub(super) fn slice(x: &Tensor, params: &[Option<Vec<i64>>]) -> Result<Tensor, OpError> {
    let starts = params[0].clone().expect("checked");
    let ends = params[1].clone().expect("checked");
    let axes =
        params.get(2).cloned().flatten().unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = params.get(3).cloned().flatten().unwrap_or_else(|| vec![1; starts.len()]);
    // The index list each axis keeps, in order.
    let mut picks: Vec<Option<Vec<usize>>> = vec![None; x.rank()];
    for i in 0..starts.len() {
        let a = normalize_axis(axes[i], x.rank()).expect("inferred");
        let (start, count) = slice_axis(x.dims()[a], starts[i], ends[i], steps[i])?;
        picks[a] = Some((0..count as i64).map(|k| (start + k * steps[i]) as usize).collect());
    }
    fn go<T: Element>(x: &Tensor, picks: &[Option<Vec<usize>>]) -> Tensor {
        let mut a = view::<T>(x).to_owned();
        for (axis, p) in picks.iter().enumerate() {
            if let Some(p) = p {
                a = a.select(Axis(axis), p);
            }
        }
        tensor(a)
    }
    Ok(typed!(x.dtype(), go(x, &picks)))
}

pub(super) fn gather(
    x: &Tensor,
    indices: &Tensor,
    axis: i64,
    out: &[usize],
) -> Result<Tensor, OpError> {
    let a = normalize_axis(axis, x.rank()).expect("inferred");
    let n = x.dims()[a] as i64;
    let idx = indices
        .to_i64s()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + n } else { i };
            if (0..n).contains(&j) {
                Ok(j as usize)
            } else {
                Err(OpError::Index { index: i, axis: a, size: n as usize })
            }
        })
        .collect::<Result<Vec<usize>, OpError>>()?;
    fn go<T: Element>(x: &Tensor, a: usize, idx: &[usize], out: &[usize]) -> Tensor {
        let picked = view::<T>(x).select(Axis(a), idx);
        tensor(picked).reshape(out).expect("same count")
    }
    Ok(typed!(x.dtype(), go(x, a, &idx, out)))
}

pub(super) fn expand(x: &Tensor, out: &[usize]) -> Tensor {
    fn go<T: Element>(x: &Tensor, out: &[usize]) -> Tensor {
        // Operand dims get leading ones so ndarray broadcasts them the numpy way.
        let mut d = vec![1; out.len() - x.rank()];
        d.extend_from_slice(x.dims());
        let xr = x.reshape(&d).expect("same count");
        tensor(view::<T>(&xr).broadcast(IxDyn(out)).expect("inferred").to_owned())
    }
    typed!(x.dtype(), go(x, out))
}
