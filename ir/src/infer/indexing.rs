//! Indexing and rearranging ops: GatherElements, GatherND, ScatterElements, ScatterND, Tile, Pad, CenterCropPad, OneHot, Trilu, DepthToSpace, SpaceToDepth, NonZero, Compress, NonMaxSuppression, Unique, ReverseSequence.

use super::{axis, same_dtype, Ctx, Infer, Operand, Operands};
use crate::error::{invalid, OpError};
use crate::op::PadMode;
use crate::{normalize_axis, DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::GatherElements { axis } => gather_elements(*axis, ops),
        Op::GatherNd { batch_dims } => gather_nd(*batch_dims, ops),
        Op::ScatterElements { axis, .. } => scatter_elements(*axis, ops),
        Op::ScatterNd { .. } => scatter_nd(ops),
        Op::Tile => tile(ops, ctx),
        Op::Pad { mode } => pad(*mode, ops, ctx),
        Op::CenterCropPad { axes } => center_crop_pad(axes, ops, ctx),
        Op::OneHot { axis } => one_hot(*axis, ops, ctx),
        Op::Trilu { .. } => trilu(ops),
        Op::DepthToSpace { blocksize, .. } => depth_to_space(*blocksize, ops, ctx),
        Op::SpaceToDepth { blocksize } => space_to_depth(*blocksize, ops, ctx),
        Op::NonZero => non_zero(ops, ctx),
        Op::Compress { axis } => compress(*axis, ops, ctx),
        Op::NonMaxSuppression { center_point_box } => {
            non_max_suppression(*center_point_box, ops, ctx)
        }
        Op::Unique { axis, sorted } => unique(*axis, *sorted, ops, ctx),
        Op::ReverseSequence { batch_axis, time_axis } => {
            reverse_sequence(*batch_axis, *time_axis, ops)
        }
        _ => unreachable!("routed here by infer::infer"),
    }
}

fn index_dtype(what: &str, t: &TensorType) -> Result<(), OpError> {
    if !matches!(t.dtype, DType::I32 | DType::I64) {
        return Err(invalid!("{what} must be i32 or i64, got {t}"));
    }
    Ok(())
}

/// The operand must hold exactly one element (a scalar, or a 1-element tensor as ONNX allows).
fn one_element(what: &str, o: &Operand) -> Result<(), OpError> {
    if o.ty.rank() > 1 || o.ty.shape.numel().is_some_and(|n| n != 1) {
        return Err(invalid!("{what} must be a scalar, got {}", o.ty));
    }
    Ok(())
}

/// Two dimensions that must be equal; the better known one (a size over a symbol).
fn unify(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Fixed(p), Dim::Fixed(q)) if p != q => None,
        (Dim::Sym(_), Dim::Fixed(_)) => Some(b.clone()),
        _ => Some(a.clone()),
    }
}

/// `d * k`, kept symbolic where possible.
fn scaled(d: &Dim, k: usize, fresh: impl FnOnce() -> Dim) -> Result<Dim, OpError> {
    match d {
        Dim::Fixed(n) => {
            n.checked_mul(k).map(Dim::Fixed).ok_or_else(|| invalid!("size {n} times {k} overflows"))
        }
        _ if k == 1 => Ok(d.clone()),
        _ if k == 0 => Ok(Dim::Fixed(0)),
        _ => Ok(fresh()),
    }
}

fn gather_elements(ax: i64, ops: &Operands) -> Infer {
    let (x, idx) = (ops.get(0)?.ty, ops.get(1)?.ty);
    index_dtype("indices", idx)?;
    let a = axis(ax, x)?;
    if idx.rank() != x.rank() {
        return Err(invalid!("indices {idx} must have the rank of data {x}"));
    }
    // Off the axis, indices may be smaller than data (as onnxruntime and PyTorch allow), not larger.
    for (d, (xd, id)) in x.shape.0.iter().zip(&idx.shape.0).enumerate() {
        if let (Dim::Fixed(n), Dim::Fixed(m)) = (xd, id) {
            if d != a && m > n {
                return Err(invalid!("indices {idx} is larger than data {x} in dimension {d}"));
            }
        }
    }
    Ok(vec![TensorType::new(x.dtype, idx.shape.clone())])
}

/// The length of the index tuples (the last dimension of `indices`), which must be known.
fn tuple_len(idx: &TensorType) -> Result<usize, OpError> {
    match idx.shape.0.last() {
        Some(Dim::Fixed(m)) => Ok(*m),
        Some(_) => Err(invalid!("the last dimension of indices {idx} must be known")),
        None => Err(invalid!("indices must have rank at least 1, got {idx}")),
    }
}

fn gather_nd(b: usize, ops: &Operands) -> Infer {
    let (x, idx) = (ops.get(0)?.ty, ops.get(1)?.ty);
    index_dtype("indices", idx)?;
    let (r, q) = (x.rank(), idx.rank());
    if r == 0 || q == 0 {
        return Err(invalid!("data {x} and indices {idx} must have rank at least 1"));
    }
    if b >= r.min(q) {
        return Err(invalid!(
            "batch_dims {b} must be less than the ranks of data {x} and indices {idx}"
        ));
    }
    let m = tuple_len(idx)?;
    if m < 1 || m > r - b {
        return Err(invalid!(
            "index tuples of length {m} (indices {idx}) cannot index data {x} with batch_dims {b}"
        ));
    }
    let mut dims = Vec::with_capacity(q - 1 + r - b - m);
    for i in 0..b {
        dims.push(unify(&x.shape.0[i], &idx.shape.0[i]).ok_or_else(|| {
            format!("batch dimension {i} differs between data {x} and indices {idx}")
        })?);
    }
    dims.extend_from_slice(&idx.shape.0[b..q - 1]);
    dims.extend_from_slice(&x.shape.0[b + m..]);
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

fn scatter_elements(ax: i64, ops: &Operands) -> Infer {
    let (x, idx, upd) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    index_dtype("indices", idx)?;
    same_dtype("data and updates", x, upd)?;
    let a = axis(ax, x)?;
    if idx.rank() != x.rank() {
        return Err(invalid!("indices {idx} must have the rank of data {x}"));
    }
    if idx.rank() != upd.rank()
        || idx.shape.0.iter().zip(&upd.shape.0).any(|(p, q)| unify(p, q).is_none())
    {
        return Err(invalid!("updates {upd} must have the shape of indices {idx}"));
    }
    for (d, (xd, id)) in x.shape.0.iter().zip(&idx.shape.0).enumerate() {
        if let (Dim::Fixed(n), Dim::Fixed(m)) = (xd, id) {
            if d != a && m > n {
                return Err(invalid!("indices {idx} is larger than data {x} in dimension {d}"));
            }
        }
    }
    Ok(vec![x.clone()])
}

fn scatter_nd(ops: &Operands) -> Infer {
    let (x, idx, upd) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    index_dtype("indices", idx)?;
    same_dtype("data and updates", x, upd)?;
    let (r, q) = (x.rank(), idx.rank());
    if r == 0 {
        return Err(invalid!("data must have rank at least 1, got {x}"));
    }
    let m = tuple_len(idx)?;
    if m < 1 || m > r {
        return Err(invalid!("index tuples of length {m} (indices {idx}) cannot index data {x}"));
    }
    // updates = indices.shape[:-1] + data.shape[m:]
    let want: Vec<Dim> = idx.shape.0[..q - 1].iter().chain(&x.shape.0[m..]).cloned().collect();
    if upd.rank() != want.len() || want.iter().zip(&upd.shape.0).any(|(p, q)| unify(p, q).is_none())
    {
        return Err(invalid!(
            "updates {upd} must have shape {} for data {x} and indices {idx}",
            Shape(want)
        ));
    }
    Ok(vec![x.clone()])
}

fn tile(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let reps_ty = ops.get(1)?.ty;
    let Some(Some(reps)) = ops.ints(1, "repeats")? else {
        if let Some(n) = reps_ty.shape.0.first().and_then(Dim::fixed) {
            if reps_ty.rank() != 1 || n != x.rank() {
                return Err(invalid!("repeats {reps_ty} must have one entry per dimension of {x}"));
            }
        }
        return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank())?)]);
    };
    if reps.len() != x.rank() {
        return Err(invalid!("repeats {reps:?} must have one entry per dimension of {x}"));
    }
    let mut dims = Vec::with_capacity(reps.len());
    for (i, (d, &k)) in x.shape.0.iter().zip(&reps).enumerate() {
        let k = usize::try_from(k)
            .map_err(|_| format!("repeats {reps:?} has the negative entry {k}"))?;
        dims.push(scaled(d, k, || ctx.fresh(i))?);
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// Pad's begin and end amounts for every axis of `rank` (zero where not padded), from the pads
/// and axes operands' values.
pub fn pad_amounts(
    pads: &[i64],
    axes: Option<&[i64]>,
    rank: usize,
) -> Result<Vec<(i64, i64)>, OpError> {
    let axes: Vec<i64> = match axes {
        Some(a) => a.to_vec(),
        None => (0..rank as i64).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(invalid!(
            "pads {pads:?} must have 2 entries per padded axis ({} axes)",
            axes.len()
        ));
    }
    let mut out = vec![(0, 0); rank];
    let mut seen = vec![false; rank];
    for (i, &a) in axes.iter().enumerate() {
        let n = normalize_axis(a, rank)
            .ok_or_else(|| invalid!("pad axis {a} is out of range for rank {rank}"))?;
        if std::mem::replace(&mut seen[n], true) {
            return Err(invalid!("pad axis {a} is listed twice"));
        }
        out[n] = (pads[i], pads[axes.len() + i]);
    }
    Ok(out)
}

fn pad(mode: PadMode, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    ops.get(1)?;
    let pads = ops.ints(1, "pads")?.flatten();
    if let Some(v) = ops.opt(2) {
        one_element("the pad value", &v)?;
        same_dtype("data and the pad value", x, v.ty)?;
    }
    let (pads, axes) = match (pads, ops.ints(3, "axes")?) {
        (Some(p), None) => (p, None),
        (Some(p), Some(Some(a))) => (p, Some(a)),
        // Pads or axes known only at run time: the padded axes get fresh sizes (all of them
        // when the axes are unknown too).
        (None, Some(Some(axes))) => {
            let mut dims = x.shape.0.clone();
            for a in axes {
                let n = normalize_axis(a, x.rank())
                    .ok_or_else(|| invalid!("pad axis {a} is out of range for {x}"))?;
                dims[n] = ctx.fresh(n);
            }
            return Ok(vec![TensorType::new(x.dtype, Shape(dims))]);
        }
        _ => return Ok(vec![TensorType::new(x.dtype, ctx.fresh_shape(x.rank())?)]),
    };
    let amounts = pad_amounts(&pads, axes.as_deref(), x.rank())?;
    let mut dims = Vec::with_capacity(x.rank());
    for (i, (d, &(lo, hi))) in x.shape.0.iter().zip(&amounts).enumerate() {
        dims.push(match d {
            Dim::Fixed(n) => {
                let n = *n as i128;
                let (lo, hi) = (lo as i128, hi as i128);
                let size = n + lo + hi;
                if size < 0 || size > i64::MAX as i128 {
                    return Err(invalid!("pads {pads:?} give axis {i} of {x} the size {size}"));
                }
                // Negative pads crop first; the other modes then need something to copy from.
                let kept = n + lo.min(0) + hi.min(0);
                if mode != PadMode::Constant && (lo > 0 || hi > 0) && kept <= 0 {
                    return Err(invalid!("{} padding of axis {i} of {x} by pads {pads:?} has no elements to copy from", mode.name()));
                }
                Dim::Fixed(size as usize)
            }
            _ if lo == 0 && hi == 0 => d.clone(),
            _ => ctx.fresh(i),
        });
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// CenterCropPad's axes (normalised): `axes`, or every axis when it is empty; one per entry of
/// the shape operand, none twice.
pub fn crop_pad_axes(axes: &[i64], rank: usize, targets: usize) -> Result<Vec<usize>, OpError> {
    let axes: Vec<i64> = if axes.is_empty() { (0..rank as i64).collect() } else { axes.to_vec() };
    if axes.len() != targets {
        return Err(invalid!(
            "shape has {targets} entries, but there are {} axes to crop or pad",
            axes.len()
        ));
    }
    let mut seen = vec![false; rank];
    axes.iter()
        .map(|&a| {
            let n = normalize_axis(a, rank)
                .ok_or_else(|| invalid!("axis {a} is out of range for rank {rank}"))?;
            if std::mem::replace(&mut seen[n], true) {
                return Err(invalid!("axis {a} is listed twice"));
            }
            Ok(n)
        })
        .collect()
}

/// CenterCropPad as Pad's amounts per axis (negative ones crop): the difference between an
/// axis and its target size is split in two, the odd element at the end, whether it is added
/// or taken away (ONNX: the crop window starts rounded down, the extra padding goes right).
pub fn center_crop_pad_amounts(
    dims: &[usize],
    targets: &[i64],
    axes: &[i64],
) -> Result<Vec<(i64, i64)>, OpError> {
    let mut out = vec![(0, 0); dims.len()];
    for (&a, &t) in crop_pad_axes(axes, dims.len(), targets.len())?.iter().zip(targets) {
        if t < 0 {
            return Err(invalid!("shape {targets:?} has a negative size"));
        }
        let n = i64::try_from(dims[a]).map_err(|_| invalid!("axis {a} is too long"))?;
        out[a] = if t >= n {
            let lo = (t - n) / 2;
            (lo, t - n - lo)
        } else {
            let lo = (n - t) / 2;
            (-lo, -(n - t - lo))
        };
    }
    Ok(out)
}

fn center_crop_pad(axes: &[i64], ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    let shape = ops.get(1)?;
    index_dtype("shape", shape.ty)?;
    let targets = match ops.ints(1, "shape")?.flatten() {
        Some(t) => t,
        // Sizes known only at run time: the listed axes get fresh sizes (every axis when the
        // list is empty).
        None => {
            let mut dims = x.shape.0.clone();
            let n = shape.ty.shape.0.first().and_then(Dim::fixed).unwrap_or(x.rank());
            for a in crop_pad_axes(axes, x.rank(), n)? {
                dims[a] = ctx.fresh(a);
            }
            return Ok(vec![TensorType::new(x.dtype, Shape(dims))]);
        }
    };
    let mut dims = x.shape.0.clone();
    for (a, &t) in crop_pad_axes(axes, x.rank(), targets.len())?.into_iter().zip(&targets) {
        let t =
            usize::try_from(t).map_err(|_| invalid!("shape {targets:?} has a negative size"))?;
        dims[a] = Dim::Fixed(t);
    }
    let ty = TensorType::new(x.dtype, Shape(dims));
    if let Some(fixed) = ty.shape.as_fixed() {
        super::generate::checked_count(&fixed, x.dtype, "result")?;
    }
    Ok(vec![ty])
}

fn one_hot(ax: i64, ops: &Operands, ctx: &Ctx) -> Infer {
    let (idx, depth, values) = (ops.get(0)?.ty, ops.get(1)?, ops.get(2)?.ty);
    if !idx.dtype.is_numeric() {
        return Err(invalid!("indices must be numeric, got {idx}"));
    }
    one_element("depth", &depth)?;
    if !depth.ty.dtype.is_numeric() {
        return Err(invalid!("depth must be numeric, got {}", depth.ty));
    }
    if values.rank() != 1 || values.shape.0[0].fixed().is_some_and(|n| n != 2) {
        return Err(invalid!("values must be [off_value, on_value], got {values}"));
    }
    let r = idx.rank() as i64;
    // The new axis may be anywhere in the result, whose rank is one more.
    let a = normalize_axis(ax, idx.rank() + 1).ok_or_else(|| {
        format!("axis {ax} is out of range for the result of rank {} from indices {idx}", r + 1)
    })?;
    let d = match depth.value {
        Some(t) => {
            // A float depth is truncated, as ONNX casts it to int64.
            let n = t.to_i64s().first().copied().unwrap_or(0);
            if n < 1 {
                return Err(invalid!("depth must be positive, got {n}"));
            }
            Dim::Fixed(n as usize)
        }
        None => ctx.fresh(a),
    };
    let mut dims = idx.shape.0.clone();
    dims.insert(a, d);
    Ok(vec![TensorType::new(values.dtype, Shape(dims))])
}

fn trilu(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if x.rank() < 2 {
        return Err(invalid!("the input must have rank at least 2, got {x}"));
    }
    if let Some(k) = ops.opt(1) {
        one_element("k", &k)?;
        if !k.ty.dtype.is_int() {
            return Err(invalid!("k must be an integer, got {}", k.ty));
        }
    }
    Ok(vec![x.clone()])
}

fn rank4<'a>(ops: &Operands<'_, 'a>, blocksize: usize) -> Result<&'a TensorType, OpError> {
    let x = ops.get(0)?.ty;
    if x.rank() != 4 {
        return Err(invalid!("the input must be 4-D [N,C,H,W], got {x}"));
    }
    if blocksize == 0 {
        return Err("blocksize must be positive".into());
    }
    Ok(x)
}

fn depth_to_space(b: usize, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = rank4(ops, b)?;
    let bb = b.checked_mul(b).ok_or_else(|| invalid!("blocksize {b} is too large"))?;
    let c = match &x.shape.0[1] {
        Dim::Fixed(c) if c % bb != 0 => {
            return Err(invalid!("channels of {x} are not divisible by blocksize {b} squared"))
        }
        Dim::Fixed(c) => Dim::Fixed(c / bb),
        d if bb == 1 => d.clone(),
        _ => ctx.fresh(1),
    };
    let h = scaled(&x.shape.0[2], b, || ctx.fresh(2))?;
    let w = scaled(&x.shape.0[3], b, || ctx.fresh(3))?;
    Ok(vec![TensorType::new(x.dtype, Shape(vec![x.shape.0[0].clone(), c, h, w]))])
}

fn space_to_depth(b: usize, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = rank4(ops, b)?;
    let bb = b.checked_mul(b).ok_or_else(|| invalid!("blocksize {b} is too large"))?;
    let c = scaled(&x.shape.0[1], bb, || ctx.fresh(1))?;
    let mut spatial = Vec::with_capacity(2);
    for i in [2, 3] {
        spatial.push(match &x.shape.0[i] {
            Dim::Fixed(n) if n % b != 0 => {
                return Err(invalid!("dimension {i} of {x} is not divisible by blocksize {b}"))
            }
            Dim::Fixed(n) => Dim::Fixed(n / b),
            d if b == 1 => d.clone(),
            _ => ctx.fresh(i),
        });
    }
    let [h, w] = <[Dim; 2]>::try_from(spatial).expect("two spatial axes");
    Ok(vec![TensorType::new(x.dtype, Shape(vec![x.shape.0[0].clone(), c, h, w]))])
}

/// Whether an element counts as non-zero (NaN does; -0.0 does not).
pub(crate) fn count_nonzero(t: &crate::Tensor) -> usize {
    t.to_f64s().iter().filter(|v| **v != 0.0).count()
}

fn non_zero(ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?;
    // A scalar counts as a 1-D tensor of one element (as numpy's and onnxruntime's NonZero do).
    let rank = x.ty.rank().max(1);
    let n = match x.value {
        Some(t) => Dim::Fixed(count_nonzero(t)),
        None => ctx.fresh(1),
    };
    Ok(vec![TensorType::new(DType::I64, Shape(vec![Dim::Fixed(rank), n]))])
}

fn compress(ax: Option<i64>, ops: &Operands, ctx: &Ctx) -> Infer {
    let (x, cond) = (ops.get(0)?.ty, ops.get(1)?);
    if cond.ty.dtype != DType::Bool || cond.ty.rank() != 1 {
        return Err(invalid!("condition must be a 1-D bool tensor, got {}", cond.ty));
    }
    let a = ax.map(|ax| axis(ax, x)).transpose()?;
    // How many entries the condition can select from, when known.
    let along = match a {
        Some(a) => x.shape.0[a].fixed(),
        None => x.shape.numel(),
    };
    let kept = match cond.value {
        Some(t) => {
            let c = t.as_slice::<bool>().map_err(OpError::from)?;
            // A shorter condition drops the rest; a longer one may only select what exists.
            if let (Some(n), Some(p)) = (along, c.iter().rposition(|&b| b)) {
                if p >= n {
                    return Err(match a {
                        Some(a) => invalid!(
                            "condition selects index {p}, out of range for axis {a} of size {n}"
                        ),
                        None => invalid!(
                            "condition selects index {p}, out of range for the {n} elements of {x}"
                        ),
                    });
                }
            }
            Dim::Fixed(c.iter().filter(|&&b| b).count())
        }
        None => ctx.fresh(a.unwrap_or(0)),
    };
    let dims = match a {
        Some(a) => {
            let mut d = x.shape.0.clone();
            d[a] = kept;
            d
        }
        None => vec![kept],
    };
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// NonMaxSuppression: i64 `[n, 3]`, n known only when every operand is a constant (then the
/// selection is run here, as the interpreter runs it).
fn non_max_suppression(center_point_box: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let (boxes, scores) = (ops.get(0)?, ops.get(1)?);
    if !boxes.ty.dtype.is_float() || scores.ty.dtype != boxes.ty.dtype {
        return Err(invalid!(
            "boxes and scores must be floats of one type, got {} and {}",
            boxes.ty,
            scores.ty
        ));
    }
    let (b, s) = (&boxes.ty.shape.0, &scores.ty.shape.0);
    let fits = b.len() == 3
        && s.len() == 3
        && unify(&b[2], &Dim::Fixed(4)).is_some()
        && unify(&b[0], &s[0]).is_some()
        && unify(&b[1], &s[2]).is_some();
    if !fits {
        return Err(invalid!(
            "boxes must be [B, N, 4] and scores [B, C, N], got {} and {}",
            boxes.ty,
            scores.ty
        ));
    }
    let limit = |i: usize, what: &str, int: bool| -> Result<Option<&crate::Tensor>, OpError> {
        let Some(o) = ops.opt(i) else { return Ok(None) };
        if o.ty.dtype.is_int() != int || (!int && !o.ty.dtype.is_float()) {
            let want = if int { "an integer" } else { "a float" };
            return Err(invalid!("{what} must be {want}, got {}", o.ty));
        }
        one_element(what, &o)?;
        Ok(o.value)
    };
    let max = limit(2, "max_output_boxes_per_class", true)?;
    let iou = limit(3, "iou_threshold", false)?;
    let score = limit(4, "score_threshold", false)?;
    let known = |i: usize, v: Option<&crate::Tensor>| ops.opt(i).is_none() || v.is_some();
    let n = match (boxes.value, scores.value) {
        (Some(bv), Some(sv)) if known(2, max) && known(3, iou) && known(4, score) => {
            let limits = crate::eval::select::NmsLimits::read(max, iou, score)?;
            let rows = crate::eval::select::non_max_suppression(bv, sv, limits, center_point_box)?;
            Dim::Fixed(rows.len())
        }
        _ => ctx.fresh(0),
    };
    Ok(vec![TensorType::new(DType::I64, Shape(vec![n, Dim::Fixed(3)]))])
}

/// Unique: `y` (x's type; `[k]`, or x's shape with `k` along the axis), then the i64 `indices`
/// `[k]`, `inverse_indices` (one per element, or per position along the axis) and `counts`
/// `[k]`; k is known only when x is a constant.
fn unique(ax: Option<i64>, sorted: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?;
    let a = ax.map(|ax| axis(ax, x.ty)).transpose()?;
    let k = match x.value {
        Some(t) => Dim::Fixed(crate::eval::select::unique(t, a, sorted).first.len()),
        None => ctx.fresh(a.unwrap_or(0)),
    };
    let (y, positions) = match a {
        Some(a) => {
            let mut d = x.ty.shape.0.clone();
            let along = std::mem::replace(&mut d[a], k.clone());
            (d, along)
        }
        None => {
            let n = match x.ty.shape.0.as_slice() {
                [d] => d.clone(),
                _ => x.ty.shape.numel().map_or_else(|| ctx.fresh(1), Dim::Fixed),
            };
            (vec![k.clone()], n)
        }
    };
    let index = |d: Dim| TensorType::new(DType::I64, Shape(vec![d]));
    Ok(vec![TensorType::new(x.ty.dtype, Shape(y)), index(k.clone()), index(positions), index(k)])
}

fn reverse_sequence(batch_axis: usize, time_axis: usize, ops: &Operands) -> Infer {
    let (x, lens) = (ops.get(0)?.ty, ops.get(1)?.ty);
    if x.rank() < 2 {
        return Err(invalid!("the input must have rank at least 2, got {x}"));
    }
    if batch_axis > 1 || time_axis > 1 || batch_axis == time_axis {
        return Err(invalid!(
            "batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 in some order"
        ));
    }
    index_dtype("sequence_lens", lens)?;
    if lens.rank() != 1 || unify(&lens.shape.0[0], &x.shape.0[batch_axis]).is_none() {
        return Err(invalid!(
            "sequence_lens {lens} must have one entry per batch entry of {x} (axis {batch_axis})"
        ));
    }
    Ok(vec![x.clone()])
}
