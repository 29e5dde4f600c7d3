//! Data movement and view ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split,
//! Slice, Gather, Expand.

use super::{axis, not_yet, Ctx, DimProduct, Infer, Operands};
use crate::{broadcast, normalize_axis, DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Reshape { allowzero } => reshape(*allowzero, ops, ctx),
        Op::Flatten { axis } => flatten(*axis, ops, ctx),
        Op::Transpose { perm } => transpose(perm, ops),
        Op::Squeeze => squeeze(ops, ctx),
        Op::Unsqueeze => unsqueeze(ops, ctx),
        Op::Concat { axis } => concat(*axis, ops, ctx),
        Op::Split { axis, num_outputs } => split(*axis, *num_outputs, ops, ctx),
        Op::Slice => slice(ops, ctx),
        Op::Gather { axis } => gather(*axis, ops),
        Op::Expand => expand(ops, ctx),
        _ => not_yet(op),
    }
}
use crate::error::{invalid, OpError};

pub(super) fn reshape(allowzero: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let shape_op = ops.get(1)?;
    let Some(Some(spec)) = ops.ints(1, "shape")? else {
        return match shape_op.ty.shape.0.as_slice() {
            [Dim::Fixed(n)] => Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(*n)?)]),
            _ => {
                Err(invalid!("the shape operand must be 1-D of known length, got {}", shape_op.ty))
            }
        };
    };
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer_at.is_some() => {
                return Err(invalid!("shape {spec:?} has more than one -1"))
            }
            -1 => {
                infer_at = Some(i);
                out.push(None);
            }
            0 if !allowzero => {
                let d = x.shape.0.get(i).ok_or_else(|| {
                    format!("shape {spec:?} copies dimension {i} (a 0) that {x} does not have")
                })?;
                out.push(Some(d.clone()));
            }
            s if s >= 0 => out.push(Some(Dim::Fixed(s as usize))),
            s => return Err(invalid!("shape {spec:?} has the invalid size {s}")),
        }
    }
    let total = DimProduct::of(&x.shape.0);
    let known: Vec<Dim> = out.iter().flatten().cloned().collect();
    let known = DimProduct::of(&known);
    match infer_at {
        Some(i) => {
            let rest = total.div(&known);
            out[i] = Some(match rest.as_ref().and_then(DimProduct::as_dim) {
                Some(d) => d,
                None if known.syms.is_empty() && total.syms.is_empty() => {
                    return Err(invalid!(
                        "cannot reshape {x} ({} elements) to {spec:?}",
                        total.fixed
                    ));
                }
                None => ctx.fresh(i),
            });
        }
        None => {
            if total.syms.is_empty() && known.syms.is_empty() && total.fixed != known.fixed {
                return Err(invalid!(
                    "cannot reshape {x} ({} elements) to {spec:?} ({} elements)",
                    total.fixed,
                    known.fixed
                ));
            }
        }
    }
    Ok(vec![TensorType::new(x.dtype, Shape(out.into_iter().map(|d| d.expect("filled")).collect()))])
}

pub(super) fn flatten(ax: i64, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    // Flatten's axis may equal the rank; a negative one counts from the rank.
    let r = x.rank() as i64;
    let a = if ax < 0 { ax + r } else { ax };
    if !(0..=r).contains(&a) {
        return Err(invalid!("axis {ax} is out of range for {x}"));
    }
    let a = a as usize;
    let part = |dims: &[Dim], i| DimProduct::of(dims).as_dim().unwrap_or_else(|| ctx.fresh(i));
    Ok(vec![TensorType::new(
        x.dtype,
        Shape(vec![part(&x.shape.0[..a], 0), part(&x.shape.0[a..], 1)]),
    )])
}

pub(super) fn transpose(perm: &[usize], ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    let perm: Vec<usize> =
        if perm.is_empty() { (0..x.rank()).rev().collect() } else { perm.to_vec() };
    let mut seen = vec![false; x.rank()];
    if perm.len() != x.rank()
        || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
    {
        return Err(invalid!(
            "perm {perm:?} is not a permutation of the {} dimensions of {x}",
            x.rank()
        ));
    }
    Ok(vec![TensorType::new(x.dtype, Shape(perm.iter().map(|&p| x.shape.0[p].clone()).collect()))])
}

/// Normalised, de-duplicated axes against `rank`.
fn axes_for(axes: &[i64], rank: usize, what: &str) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(a, rank)
            .ok_or_else(|| invalid!("{what} axis {a} is out of range for rank {rank}"))?;
        if out.contains(&n) {
            return Err(invalid!("{what} axis {a} is listed twice"));
        }
        out.push(n);
    }
    Ok(out)
}

pub(super) fn squeeze(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let dims = match ops.ints(1, "axes")? {
        None => x.shape.0.iter().filter(|d| !d.is_one()).cloned().collect(),
        // Axes known at run time only: the rank follows from their count.
        Some(None) => match ops.get(1)?.ty.shape.dims() {
            [Dim::Fixed(k)] if *k <= x.rank() => {
                return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank() - k)?)])
            }
            _ => {
                return Err(invalid!(
                    "Squeeze axes {} must be constant or of known length",
                    ops.get(1)?.ty
                ))
            }
        },
        Some(Some(axes)) => {
            let axes = axes_for(&axes, x.rank(), "squeeze")?;
            for &a in &axes {
                if let Dim::Fixed(n) = x.shape.0[a] {
                    if n != 1 {
                        return Err(invalid!("cannot squeeze axis {a} of {x}: its size is {n}"));
                    }
                }
            }
            x.shape
                .0
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        }
    };
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn unsqueeze(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let Some(Some(axes)) = ops.ints(1, "axes")? else {
        // Axes known at run time only: the rank follows from their count.
        return match ops.get(1)?.ty.shape.dims() {
            [Dim::Fixed(k)] => Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank() + k)?)]),
            _ => Err(invalid!(
                "Unsqueeze axes {} must be constant or of known length",
                ops.get(1)?.ty
            )),
        };
    };
    let rank = x.rank() + axes.len();
    let axes = axes_for(&axes, rank, "unsqueeze")?;
    let mut src = x.shape.0.iter();
    let dims =
        (0..rank)
            .map(|i| {
                if axes.contains(&i) {
                    Dim::Fixed(1)
                } else {
                    src.next().expect("counted").clone()
                }
            })
            .collect();
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn concat(ax: i64, ops: &Operands, ctx: &Ctx) -> Infer {
    let first = ops.get(0)?.ty;
    let a = axis(ax, first)?;
    let mut dims = first.shape.0.clone();
    let mut along = vec![first.shape.0[a].clone()];
    for i in 1..ops.len() {
        let t = ops.get(i)?.ty;
        if t.dtype != first.dtype || t.rank() != first.rank() {
            return Err(invalid!("operand {i} {t} does not match operand 0 {first}"));
        }
        for (d, (x, y)) in dims.iter_mut().zip(&t.shape.0).enumerate() {
            if d == a {
                continue;
            }
            match (&*x, y) {
                (Dim::Fixed(p), Dim::Fixed(q)) if p != q => {
                    return Err(invalid!(
                        "operand {i} {t} differs from operand 0 {first} outside axis {a}"
                    ));
                }
                (Dim::Sym(_), Dim::Fixed(_)) => *x = y.clone(),
                _ => {}
            }
        }
        along.push(t.shape.0[a].clone());
    }
    let sum = along.iter().try_fold(0usize, |acc, d| d.fixed().map(|n| acc + n));
    dims[a] = match sum {
        Some(n) => Dim::Fixed(n),
        None if along.iter().filter(|d| d.fixed().is_none_or(|n| n != 0)).count() == 1 => {
            along.into_iter().find(|d| d.fixed().is_none()).expect("one symbol")
        }
        None => ctx.fresh(a),
    };
    Ok(vec![TensorType::new(first.dtype, Shape(dims))])
}

/// The sizes of each part of a split of `n` into `parts` (ONNX 18: equal, the last one smaller).
pub fn equal_split(n: usize, parts: usize) -> Vec<usize> {
    let each = n.div_ceil(parts.max(1));
    (0..parts).map(|i| each.min(n.saturating_sub(i * each))).collect()
}

pub(super) fn split(ax: i64, num_outputs: usize, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let a = axis(ax, x)?;
    if num_outputs == 0 {
        return Err("num_outputs must be positive".into());
    }
    // The count is an attribute, not the names the node has: 4 * 10^13 of them aborted the
    // text parser allocating their types (found by text_parse).
    if num_outputs > super::MAX_RESULTS {
        return Err(invalid!(
            "num_outputs {num_outputs} is more than the {} results a node may have",
            super::MAX_RESULTS
        ));
    }
    let part = |d: Dim| {
        let mut dims = x.shape.0.clone();
        dims[a] = d;
        TensorType::new(x.dtype, Shape(dims))
    };
    match (ops.ints(1, "split")?, &x.shape.0[a]) {
        (Some(Some(sizes)), dim) => {
            if sizes.len() != num_outputs {
                return Err(invalid!(
                    "split {sizes:?} has {} sizes for {num_outputs} results",
                    sizes.len()
                ));
            }
            if sizes.iter().any(|&s| s < 0) {
                return Err(invalid!("split {sizes:?} has a negative size"));
            }
            if let Dim::Fixed(n) = dim {
                if sizes.iter().sum::<i64>() != *n as i64 {
                    return Err(invalid!(
                        "split {sizes:?} does not add up to {n}, the size of axis {a} of {x}"
                    ));
                }
            }
            Ok(sizes.iter().map(|&s| part(Dim::Fixed(s as usize))).collect())
        }
        (Some(None), _) => Ok((0..num_outputs).map(|_| part(ctx.fresh(a))).collect()),
        (None, Dim::Fixed(n)) => {
            if *n < num_outputs {
                return Err(invalid!(
                    "cannot split axis {a} of {x} ({n}) into {num_outputs} parts"
                ));
            }
            Ok(equal_split(*n, num_outputs).into_iter().map(|s| part(Dim::Fixed(s))).collect())
        }
        (None, d) if num_outputs == 1 => Ok(vec![part(d.clone())]),
        (None, _) => Ok((0..num_outputs).map(|_| part(ctx.fresh(a))).collect()),
    }
}

/// ONNX Slice for one axis of size `n`: the clamped start and the element count.
pub fn slice_axis(n: usize, start: i64, end: i64, step: i64) -> Result<(i64, usize), OpError> {
    if step == 0 {
        return Err("slice step must not be 0".into());
    }
    let n = n as i64;
    let norm = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
    let (start, end) = (norm(start), norm(end));
    let (start, end) = if step > 0 {
        (start.clamp(0, n), end.clamp(0, n))
    } else {
        (start.clamp(-1, n - 1), end.clamp(-1, n - 1))
    };
    // In i128: a step of +-2^63 (ONNX's "to the end" by an extreme step) overflows i64 here.
    let (s, e, st) = (start as i128, end as i128, step as i128);
    let count =
        if step > 0 { (e - s + st - 1).div_euclid(st) } else { (s - e - st - 1).div_euclid(-st) };
    Ok((start, count.clamp(0, n as i128) as usize))
}

pub(super) fn slice(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let starts = ops.ints(1, "starts")?;
    let ends = ops.ints(2, "ends")?;
    let axes = ops.ints(3, "axes")?;
    let steps = ops.ints(4, "steps")?;
    let (Some(Some(starts)), Some(Some(ends))) = (starts, ends) else {
        return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank())?)]);
    };
    if starts.len() != ends.len() {
        return Err(invalid!("starts {starts:?} and ends {ends:?} differ in length"));
    }
    let axes = match axes {
        None => (0..starts.len() as i64).collect(),
        Some(Some(a)) => a,
        Some(None) => return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank())?)]),
    };
    let steps = match steps {
        None => vec![1; starts.len()],
        Some(Some(s)) => s,
        Some(None) => return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank())?)]),
    };
    if axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(invalid!(
            "starts, ends, axes and steps differ in length: {starts:?} {ends:?} {axes:?} {steps:?}"
        ));
    }
    let axes = axes_for(&axes, x.rank(), "slice")?;
    let mut dims = x.shape.0.clone();
    for (i, &a) in axes.iter().enumerate() {
        dims[a] = match &x.shape.0[a] {
            Dim::Fixed(n) => Dim::Fixed(slice_axis(*n, starts[i], ends[i], steps[i])?.1),
            Dim::Sym(_) if starts[i] == 0 && steps[i] == 1 && ends[i] >= i32::MAX as i64 => {
                x.shape.0[a].clone()
            }
            Dim::Sym(_) => ctx.fresh(a),
        };
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn gather(ax: i64, ops: &Operands) -> Infer {
    let (x, idx) = (ops.get(0)?.ty, ops.get(1)?.ty);
    if !matches!(idx.dtype, DType::I32 | DType::I64) {
        return Err(invalid!("indices must be i32 or i64, got {idx}"));
    }
    let a = axis(ax, x)?;
    let mut dims = x.shape.0[..a].to_vec();
    dims.extend(idx.shape.0.iter().cloned());
    dims.extend(x.shape.0[a + 1..].iter().cloned());
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

pub(super) fn expand(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let shape_op = ops.get(1)?;
    let target = match ops.ints(1, "shape")? {
        Some(Some(s)) => {
            if s.iter().any(|&d| d < 0) {
                return Err(invalid!("shape {s:?} has a negative size"));
            }
            Shape(s.iter().map(|&d| Dim::Fixed(d as usize)).collect())
        }
        _ => match shape_op.ty.shape.0.as_slice() {
            [Dim::Fixed(n)] => ctx.fresh_shape(*n)?,
            _ => {
                return Err(invalid!(
                    "the shape operand must be 1-D of known length, got {}",
                    shape_op.ty
                ))
            }
        },
    };
    let shape =
        broadcast(&x.shape, &target).ok_or_else(|| invalid!("cannot expand {x} to {target}"))?;
    Ok(vec![TensorType::new(x.dtype, shape)])
}
