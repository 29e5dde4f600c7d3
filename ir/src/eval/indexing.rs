//! Indexing and rearranging ops: GatherElements, GatherND, ScatterElements, ScatterND, Tile, Pad, OneHot, Trilu, DepthToSpace, SpaceToDepth, NonZero, Compress, NonMaxSuppression, Unique, ReverseSequence.
//!
//! Most of these only move elements: they compute, for every result element, the flat offset of
//! the operand element it copies (non-generic index arithmetic), then one small generic function
//! copies the elements exactly, whatever the dtype.

use ndarray::IxDyn;

use super::select::{nms_tensor, non_max_suppression, unique, NmsLimits};
use super::{strides, tensor, typed, view};
use crate::error::{invalid, OpError};
use crate::infer::{center_crop_pad_amounts, pad_amounts};
use crate::op::{PadMode, ScatterReduction};
use crate::{normalize_axis, Element, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let arg =
        |i: usize| operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i });
    let opt = |i: usize| operands.get(i).copied().flatten();
    let dims =
        out[0].shape.as_fixed().ok_or_else(|| invalid!("result shape {} is not known", out[0]))?;
    let x = arg(0)?;
    // Inference has checked ranks, axes and shapes; what is left to check here is data.
    let ax = |a: i64, rank: usize| {
        normalize_axis(a, rank).ok_or_else(|| invalid!("axis {a} is out of range for rank {rank}"))
    };
    let y = match op {
        Op::GatherElements { axis } => {
            let offs = gather_elements(x.dims(), arg(1)?, ax(*axis, x.rank())?)?;
            typed!(x.dtype(), pick(x, &offs, &dims))
        }
        Op::GatherNd { batch_dims } => {
            let offs = gather_nd(x.dims(), arg(1)?, *batch_dims)?;
            typed!(x.dtype(), pick(x, &offs, &dims))
        }
        Op::ScatterElements { axis, reduction } => {
            let offs = scatter_elements(x.dims(), arg(1)?, ax(*axis, x.rank())?)?;
            typed!(x.dtype(), scatter(x, &offs, arg(2)?, *reduction))
        }
        Op::ScatterNd { reduction } => {
            let offs = scatter_nd(x.dims(), arg(1)?)?;
            typed!(x.dtype(), scatter(x, &offs, arg(2)?, *reduction))
        }
        Op::Tile => {
            let st = strides(x.dims());
            let offs = offsets(&dims, |pos| {
                pos.iter().zip(x.dims()).zip(&st).map(|((&p, &n), &s)| (p % n) * s).sum()
            });
            typed!(x.dtype(), pick(x, &offs, &dims))
        }
        Op::Pad { .. } | Op::CenterCropPad { .. } => {
            // CenterCropPad is a zero Pad whose negative amounts crop.
            let (mode, amounts, value) = match op {
                Op::Pad { mode } => {
                    let pads = arg(1)?.to_i64s();
                    let axes = opt(3).map(Tensor::to_i64s);
                    (*mode, pad_amounts(&pads, axes.as_deref(), x.rank())?, opt(2))
                }
                Op::CenterCropPad { axes } => {
                    let targets = arg(1)?.to_i64s();
                    (PadMode::Constant, center_crop_pad_amounts(x.dims(), &targets, axes)?, None)
                }
                _ => unreachable!("matched above"),
            };
            let maps: Vec<Vec<Option<usize>>> = x
                .dims()
                .iter()
                .zip(&amounts)
                .zip(&dims)
                .map(|((&n, &(lo, hi)), &size)| pad_axis(mode, n, lo, hi, size))
                .collect();
            let st = strides(x.dims());
            let offs = offsets(&dims, |pos| {
                pos.iter()
                    .zip(&maps)
                    .zip(&st)
                    .try_fold(0, |acc, ((&p, map), &s)| map[p].map(|i| acc + i * s))
            });
            typed!(x.dtype(), pick_or(x, &offs, value, &dims))
        }
        Op::OneHot { axis } => {
            let values = arg(2)?;
            let a = ax(*axis, x.rank() + 1)?;
            typed!(values.dtype(), one_hot(x, values, a, &dims))
        }
        Op::Trilu { upper } => {
            let k = opt(1).map(|t| t.to_i64s().first().copied().unwrap_or(0)).unwrap_or(0);
            typed!(x.dtype(), trilu(x, k, *upper))
        }
        Op::DepthToSpace { blocksize: b, crd } => {
            let [n, c, h, w] =
                <[usize; 4]>::try_from(x.dims()).map_err(|_| format!("{} is not 4-D", x.ty()))?;
            let c = c / (b * b);
            let (tmp, perm) = if *crd {
                ([n, c, *b, *b, h, w], [0, 1, 4, 2, 5, 3])
            } else {
                ([n, *b, *b, c, h, w], [0, 3, 4, 1, 5, 2])
            };
            typed!(x.dtype(), rearrange(x, &tmp, &perm, &dims))
        }
        Op::SpaceToDepth { blocksize: b } => {
            let [n, c, h, w] =
                <[usize; 4]>::try_from(x.dims()).map_err(|_| format!("{} is not 4-D", x.ty()))?;
            let tmp = [n, c, h / b, *b, w / b, *b];
            typed!(x.dtype(), rearrange(x, &tmp, &[0, 3, 5, 1, 2, 4], &dims))
        }
        Op::NonZero => non_zero(x, &dims)?,
        Op::Compress { axis } => {
            let offs = compress(x, arg(1)?, axis.map(|a| ax(a, x.rank())).transpose()?)?;
            typed!(x.dtype(), pick(x, &offs, &dims))
        }
        Op::NonMaxSuppression { center_point_box } => {
            let limits = NmsLimits::read(opt(2), opt(3), opt(4))?;
            nms_tensor(&non_max_suppression(x, arg(1)?, limits, *center_point_box)?)
        }
        Op::Unique { axis, sorted } => {
            let d = unique(x, axis.map(|a| ax(a, x.rank())).transpose()?, *sorted);
            let indices =
                |v: &[usize]| Tensor::vector(&v.iter().map(|&i| i as i64).collect::<Vec<_>>());
            return Ok(vec![
                typed!(x.dtype(), pick(x, &d.offsets(), &dims)),
                indices(&d.first),
                indices(&d.inverse),
                indices(&d.counts),
            ]);
        }
        Op::ReverseSequence { batch_axis, time_axis } => {
            let offs = reverse_sequence(x.dims(), arg(1)?, *batch_axis, *time_axis)?;
            typed!(x.dtype(), pick(x, &offs, &dims))
        }
        _ => unreachable!("routed here by eval::eval_op"),
    };
    Ok(vec![y])
}

// ----- element copying (generic) -----

/// The elements of `x` at `offs`, as a tensor of `dims`.
fn pick<T: Element>(x: &Tensor, offs: &[usize], dims: &[usize]) -> Tensor {
    let xs = x.as_slice::<T>().expect("dispatched on the dtype");
    Tensor::from_vec(dims, offs.iter().map(|&o| xs[o]).collect())
        .expect("one offset per result element")
}

/// Like `pick`, with `fill` (a one-element tensor of x's dtype; zero if absent) where there is no offset.
fn pick_or<T: Element>(
    x: &Tensor,
    offs: &[Option<usize>],
    fill: Option<&Tensor>,
    dims: &[usize],
) -> Tensor {
    let xs = x.as_slice::<T>().expect("dispatched on the dtype");
    let fill = fill
        .and_then(|t| t.as_slice::<T>().ok()?.first().copied())
        .unwrap_or_else(|| T::from_i128(0));
    Tensor::from_vec(dims, offs.iter().map(|o| o.map_or(fill, |o| xs[o])).collect())
        .expect("one offset per result element")
}

/// A copy of `x` with `updates[k]` combined into element `offs[k]`, in order.
fn scatter<T: Element>(
    x: &Tensor,
    offs: &[usize],
    updates: &Tensor,
    r: ScatterReduction,
) -> Tensor {
    let mut out = x.as_slice::<T>().expect("dispatched on the dtype").to_vec();
    let upd = updates.as_slice::<T>().expect("inference checked the dtypes");
    for (&o, &u) in offs.iter().zip(upd) {
        out[o] = combine(r, out[o], u);
    }
    Tensor::from_vec(x.dims(), out).expect("same shape")
}

/// One scatter reduction step: integers (and bools) exactly with wrap-around, floats in f64.
fn combine<T: Element>(r: ScatterReduction, old: T, new: T) -> T {
    use ScatterReduction as R;
    match (r, old.to_i128(), new.to_i128()) {
        (R::None, _, _) => new,
        (R::Add, Some(a), Some(b)) => T::from_i128(a.wrapping_add(b)),
        // Wrapping in i128 keeps the low 64 bits right even for u64 * u64.
        (R::Mul, Some(a), Some(b)) => T::from_i128(a.wrapping_mul(b)),
        (R::Max, Some(a), Some(b)) => {
            if b > a {
                new
            } else {
                old
            }
        }
        (R::Min, Some(a), Some(b)) => {
            if b < a {
                new
            } else {
                old
            }
        }
        (R::Add, ..) => T::from_f64(old.to_f64() + new.to_f64()),
        (R::Mul, ..) => T::from_f64(old.to_f64() * new.to_f64()),
        // A NaN on either side wins, as with numpy's maximum and minimum.
        (R::Max | R::Min, ..) => {
            let (a, b) = (old.to_f64(), new.to_f64());
            let take_new = b.is_nan() || (!a.is_nan() && if r == R::Max { b > a } else { b < a });
            if take_new {
                new
            } else {
                old
            }
        }
    }
}

/// `x` viewed as `tmp`, permuted by `perm`, laid out as `dims` (DepthToSpace, SpaceToDepth).
fn rearrange<T: Element>(x: &Tensor, tmp: &[usize], perm: &[usize], dims: &[usize]) -> Tensor {
    let xr = x.reshape(tmp).expect("inference checked the sizes");
    tensor(view::<T>(&xr).permuted_axes(IxDyn(perm)).to_owned())
        .reshape(dims)
        .expect("inference checked the sizes")
}

fn one_hot<T: Element>(indices: &Tensor, values: &Tensor, a: usize, dims: &[usize]) -> Tensor {
    let v = values.as_slice::<T>().expect("dispatched on the dtype");
    let (off, on) = (v[0], v[1]);
    let depth = dims[a];
    // Float indices are truncated, as ONNX casts them to int64.
    let idx = indices.to_i64s();
    let inner: usize = indices.dims()[a..].iter().product();
    let mut out = vec![off; dims.iter().product()];
    for (k, &i) in idx.iter().enumerate() {
        let i = if i < 0 { i.saturating_add(depth as i64) } else { i };
        // Indices outside [-depth, depth) leave the whole row off.
        if (0..depth as i64).contains(&i) {
            let (o, r) = (k / inner, k % inner);
            out[(o * depth + i as usize) * inner + r] = on;
        }
    }
    Tensor::from_vec(dims, out).expect("sized from dims")
}

fn trilu<T: Element>(x: &Tensor, k: i64, upper: bool) -> Tensor {
    let xs = x.as_slice::<T>().expect("dispatched on the dtype");
    let d = x.dims();
    let (rows, cols) = (d[d.len() - 2], d[d.len() - 1]);
    let zero = T::from_i128(0);
    let out = xs
        .iter()
        .enumerate()
        .map(|(f, &v)| {
            let (i, j) = ((f / cols) % rows, f % cols);
            let diag = j as i64 - i as i64;
            if (upper && diag >= k) || (!upper && diag <= k) {
                v
            } else {
                zero
            }
        })
        .collect();
    Tensor::from_vec(d, out).expect("same shape")
}

// ----- offsets (not generic) -----

/// Advances a row-major multi-index over `dims`.
fn advance(pos: &mut [usize], dims: &[usize]) {
    for d in (0..dims.len()).rev() {
        pos[d] += 1;
        if pos[d] < dims[d] {
            return;
        }
        pos[d] = 0;
    }
}

/// `f(position)` for every position of `dims`, in row-major order.
fn offsets<O>(dims: &[usize], mut f: impl FnMut(&[usize]) -> O) -> Vec<O> {
    let n: usize = dims.iter().product();
    let mut pos = vec![0; dims.len()];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f(&pos));
        advance(&mut pos, dims);
    }
    out
}

/// An index into an axis of size `n` (negative counts from the end), or an error naming both.
fn index(i: i64, n: usize, axis: usize) -> Result<usize, OpError> {
    let j = if i < 0 { i + n as i64 } else { i };
    if (0..n as i64).contains(&j) {
        Ok(j as usize)
    } else {
        Err(OpError::Index { index: i, axis, size: n })
    }
}

fn gather_elements(xd: &[usize], indices: &Tensor, a: usize) -> Result<Vec<usize>, OpError> {
    let idx = indices.to_i64s();
    let st = strides(xd);
    let mut k = 0;
    offsets(indices.dims(), |pos| {
        let j = index(idx[k], xd[a], a)?;
        k += 1;
        Ok(pos
            .iter()
            .zip(&st)
            .enumerate()
            .map(|(d, (&p, &s))| if d == a { j * s } else { p * s })
            .sum())
    })
    .into_iter()
    .collect()
}

/// The flat offset in data of `dims` where an index tuple starting at axis `first` points.
fn tuple_offset(tuple: &[i64], xd: &[usize], st: &[usize], first: usize) -> Result<usize, OpError> {
    tuple
        .iter()
        .enumerate()
        .try_fold(0, |acc, (j, &i)| Ok(acc + index(i, xd[first + j], first + j)? * st[first + j]))
}

fn gather_nd(xd: &[usize], indices: &Tensor, b: usize) -> Result<Vec<usize>, OpError> {
    let id = indices.dims();
    let m = id[id.len() - 1];
    let idx = indices.to_i64s();
    let per_batch: usize = id[b..id.len() - 1].iter().product();
    let batches: usize = xd[..b].iter().product();
    let batch_size: usize = xd[b..].iter().product();
    let slice: usize = xd[b + m..].iter().product();
    let st = strides(xd);
    let mut offs = Vec::with_capacity(batches * per_batch * slice);
    for t in 0..batches * per_batch {
        let start =
            (t / per_batch) * batch_size + tuple_offset(&idx[t * m..(t + 1) * m], xd, &st, b)?;
        offs.extend(start..start + slice);
    }
    Ok(offs)
}

fn scatter_elements(xd: &[usize], indices: &Tensor, a: usize) -> Result<Vec<usize>, OpError> {
    // The same arithmetic as GatherElements: where each update goes instead of where it comes from.
    gather_elements(xd, indices, a)
}

fn scatter_nd(xd: &[usize], indices: &Tensor) -> Result<Vec<usize>, OpError> {
    let id = indices.dims();
    let m = id[id.len() - 1];
    let idx = indices.to_i64s();
    let tuples: usize = id[..id.len() - 1].iter().product();
    let slice: usize = xd[m..].iter().product();
    let st = strides(xd);
    let mut offs = Vec::with_capacity(tuples * slice);
    for t in 0..tuples {
        let start = tuple_offset(&idx[t * m..(t + 1) * m], xd, &st, 0)?;
        offs.extend(start..start + slice);
    }
    Ok(offs)
}

/// For each result coordinate along one axis, the operand coordinate it copies (`None`: the
/// constant; shared with the code generator). Negative pads crop first and the other modes pad what is left, as onnxruntime does.
pub fn pad_axis(mode: PadMode, n: usize, lo: i64, hi: i64, size: usize) -> Vec<Option<usize>> {
    // In i128 so that pads near the ends of the i64 range cannot overflow.
    let (n, lo, hi) = (n as i128, lo as i128, hi as i128);
    let (start, end) = ((-lo).max(0), n - (-hi).max(0));
    let len = end - start;
    (0..size as i128)
        .map(|o| {
            let c = o - lo;
            if (start..end).contains(&c) {
                return Some(c as usize);
            }
            if len <= 0 {
                return None;
            }
            let r = c - start;
            let r = match mode {
                PadMode::Constant => return None,
                PadMode::Edge => r.clamp(0, len - 1),
                PadMode::Wrap => r.rem_euclid(len),
                // numpy's reflection, repeated when the pad is longer than the axis.
                PadMode::Reflect if len == 1 => 0,
                PadMode::Reflect => {
                    let period = 2 * (len - 1);
                    let r = r.rem_euclid(period);
                    if r >= len {
                        period - r
                    } else {
                        r
                    }
                }
            };
            Some((start + r) as usize)
        })
        .collect()
}

fn non_zero(x: &Tensor, dims: &[usize]) -> Result<Tensor, OpError> {
    // A scalar is a 1-D tensor of one element here (see inference).
    let xd: Vec<usize> = if x.rank() == 0 { vec![1] } else { x.dims().to_vec() };
    let v = x.to_f64s();
    let mut rows: Vec<Vec<i64>> = vec![Vec::new(); xd.len()];
    let mut pos = vec![0; xd.len()];
    for &e in &v {
        if e != 0.0 {
            for (row, &p) in rows.iter_mut().zip(&pos) {
                row.push(p as i64);
            }
        }
        advance(&mut pos, &xd);
    }
    Tensor::from_vec(dims, rows.concat()).map_err(OpError::from)
}

fn compress(x: &Tensor, condition: &Tensor, a: Option<usize>) -> Result<Vec<usize>, OpError> {
    let c = condition.as_slice::<bool>().map_err(OpError::from)?;
    // Without an axis the input is flattened.
    let (a, xd) = match a {
        Some(a) => (a, x.dims().to_vec()),
        None => (0, vec![x.len()]),
    };
    let n = xd[a];
    if let Some(p) = c.iter().rposition(|&b| b).filter(|&p| p >= n) {
        return Err(invalid!("condition selects index {p}, out of range for axis {a} of size {n}"));
    }
    let kept: Vec<usize> =
        c.iter().take(n).enumerate().filter(|(_, &b)| b).map(|(j, _)| j).collect();
    let inner: usize = xd[a + 1..].iter().product();
    let outer: usize = xd[..a].iter().product();
    let mut offs = Vec::with_capacity(outer * kept.len() * inner);
    for o in 0..outer {
        for &j in &kept {
            let start = (o * n + j) * inner;
            offs.extend(start..start + inner);
        }
    }
    Ok(offs)
}

fn reverse_sequence(
    xd: &[usize],
    lens: &Tensor,
    batch_axis: usize,
    time_axis: usize,
) -> Result<Vec<usize>, OpError> {
    let lens = lens.to_i64s();
    let steps = xd[time_axis];
    for (b, &l) in lens.iter().enumerate() {
        if !(0..=steps as i64).contains(&l) {
            return Err(invalid!(
                "sequence_lens[{b}] = {l} is out of range for a time axis of size {steps}"
            ));
        }
    }
    let st = strides(xd);
    Ok(offsets(xd, |pos| {
        let (b, t) = (pos[batch_axis], pos[time_axis]);
        let len = lens[b] as usize;
        let src_t = if t < len { len - 1 - t } else { t };
        pos.iter()
            .zip(&st)
            .enumerate()
            .map(|(d, (&p, &s))| if d == time_axis { src_t * s } else { p * s })
            .sum()
    }))
}
