//! Resize: `(x, roi?, scales?, sizes?) -> y`, following ONNX's reference implementation
//! (onnx/reference/ops/op_resize.py) for output sizes, `axes` and `keep_aspect_ratio_policy`.
//! GridSample `(x, grid) -> y` and AffineGrid `(theta, size) -> grid`, the resampling of spatial
//! transformers and deformable attention.

use super::{not_yet, Ctx, Infer, Operand, Operands};
use crate::error::{invalid, OpError};
use crate::op::{AspectRatioPolicy, CoordinateTransform, Resize, ResizeMode};
use crate::{normalize_axis, Dim, Op, Shape, Tensor, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Resize(r) => resize(r, ops, ctx),
        Op::GridSample { .. } => grid_sample(ops),
        Op::AffineGrid { .. } => affine_grid(ops, ctx),
        Op::RoiAlign { output_height, output_width, .. } => {
            roi_align([*output_height, *output_width], ops)
        }
        _ => not_yet(op),
    }
}

/// How a Resize maps its input to its output, resolved against concrete operands: one entry per
/// axis of the input.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ResizePlan {
    pub out: Vec<usize>,
    /// The scale each axis's coordinates are transformed with (`out / in` when sizes were given).
    pub scales: Vec<f64>,
    /// Region of interest per axis (start, end), in the input's normalised coordinates.
    pub roi: Option<Vec<(f64, f64)>>,
    /// The roi was f32: the reference combines its values in f32.
    pub roi_f32: bool,
    /// The axes to interpolate, in order (the reference resizes one axis at a time).
    pub order: Vec<usize>,
}

/// The axes `scales`/`sizes`/`roi` refer to, normalised, in attribute order.
fn resized_axes(r: &Resize, rank: usize) -> Result<Vec<usize>, OpError> {
    if r.axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::with_capacity(r.axes.len());
    for &a in &r.axes {
        let i = normalize_axis(a, rank)
            .ok_or_else(|| invalid!("axes {:?}: {a} is out of range for rank {rank}", r.axes))?;
        if out.contains(&i) {
            return Err(invalid!("axes {:?} name axis {i} twice", r.axes));
        }
        out.push(i);
    }
    Ok(out)
}

/// Resolves a Resize for an input of dimensions `input`. `roi` holds all starts then all ends
/// (f32 values are combined in f32, as the reference does); exactly one of `scales` and `sizes`.
pub(crate) fn resize_plan(
    r: &Resize,
    input: &[usize],
    roi: Option<(&[f64], bool)>,
    scales: Option<&[f64]>,
    sizes: Option<&[i64]>,
) -> Result<ResizePlan, OpError> {
    let rank = input.len();
    let axes = resized_axes(r, rank)?;
    let n = axes.len();
    let mut out = input.to_vec();
    let mut factors = vec![1.0; rank];
    match (scales, sizes) {
        (Some(_), Some(_)) => return Err("give scales or sizes, not both".into()),
        (None, None) => return Err("needs scales or sizes".into()),
        (Some(s), None) => {
            if s.len() != n {
                return Err(invalid!(
                    "scales has {} entries, {n} expected (one per resized axis)",
                    s.len()
                ));
            }
            for (&a, &f) in axes.iter().zip(s) {
                if !(f > 0.0 && f.is_finite()) {
                    return Err(invalid!("scales must be positive, got {s:?}"));
                }
                factors[a] = f;
                let size = (f * input[a] as f64).floor();
                if size > usize::MAX as f64 / 2.0 {
                    return Err(invalid!("scale {f} makes axis {a} too large"));
                }
                out[a] = size as usize;
            }
        }
        (None, Some(s)) => {
            if s.len() != n {
                return Err(invalid!(
                    "sizes has {} entries, {n} expected (one per resized axis)",
                    s.len()
                ));
            }
            for (&a, &size) in axes.iter().zip(s) {
                if size < 0 {
                    return Err(invalid!("sizes must not be negative, got {s:?}"));
                }
                if input[a] == 0 {
                    return Err(invalid!("cannot resize axis {a} of size 0 to a given size"));
                }
                factors[a] = size as f64 / input[a] as f64;
                out[a] = size as usize;
            }
            if r.keep_aspect_ratio_policy != AspectRatioPolicy::Stretch {
                // One scale for every resized axis: the smallest or the largest, sizes rounded half up.
                let pick = axes.iter().map(|&a| factors[a]);
                let f = if r.keep_aspect_ratio_policy == AspectRatioPolicy::NotLarger {
                    pick.fold(f64::INFINITY, f64::min)
                } else {
                    pick.fold(f64::NEG_INFINITY, f64::max)
                };
                for &a in &axes {
                    factors[a] = f;
                    out[a] = (f * input[a] as f64 + 0.5).floor() as usize;
                }
            }
        }
    }
    // Only tf_crop_and_resize reads the region of interest.
    let crop = r.coordinate_transform == CoordinateTransform::TfCropAndResize;
    let full_roi = match roi.filter(|_| crop) {
        None => None,
        Some((v, _)) => {
            if v.len() != 2 * n {
                return Err(invalid!(
                    "roi has {} entries, {} expected (starts and ends of the resized axes)",
                    v.len(),
                    2 * n
                ));
            }
            let mut full = vec![(0.0, 1.0); rank];
            for (i, &a) in axes.iter().enumerate() {
                full[a] = (v[i], v[n + i]);
            }
            Some(full)
        }
    };
    let roi_f32 = roi.is_some_and(|(_, f)| f);
    Ok(ResizePlan { out, scales: factors, roi: full_roi, roi_f32, order: axes })
}

/// An optional operand with no elements counts as absent (exporters pass empty roi and scales).
fn given<'a>(o: Option<Operand<'a>>) -> Option<Operand<'a>> {
    o.filter(|o| o.ty.shape.numel() != Some(0))
}

fn resize(r: &Resize, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    if x.rank() == 0 {
        return Err(invalid!("cannot resize a scalar {x}"));
    }
    let (roi, scales, sizes) = (given(ops.opt(1)), given(ops.opt(2)), given(ops.opt(3)));
    for (o, what) in [(roi, "roi"), (scales, "scales")] {
        if let Some(o) = o {
            if !o.ty.dtype.is_float() || o.ty.rank() != 1 {
                return Err(invalid!("{what} must be a 1-D float tensor, got {}", o.ty));
            }
        }
    }
    if let Some(o) = sizes {
        if !o.ty.dtype.is_int() || o.ty.rank() != 1 {
            return Err(invalid!("sizes must be a 1-D integer tensor, got {}", o.ty));
        }
    }
    if scales.is_some() == sizes.is_some() {
        return Err("needs exactly one of scales and sizes".into());
    }
    if r.mode == ResizeMode::Nearest && r.antialias {
        return Err("antialias applies to the linear and cubic modes, not nearest".into());
    }
    let axes = resized_axes(r, x.rank())?;
    let n = axes.len();
    // Lengths known from the types are checked even when the values are not.
    let roi = roi.filter(|_| r.coordinate_transform == CoordinateTransform::TfCropAndResize);
    if r.coordinate_transform == CoordinateTransform::TfCropAndResize && roi.is_none() {
        return Err("tf_crop_and_resize needs roi".into());
    }
    for (o, what, want) in [(scales, "scales", n), (sizes, "sizes", n), (roi, "roi", 2 * n)] {
        if let Some(Dim::Fixed(len)) = o.map(|o| &o.ty.shape.0[0]) {
            if *len != want {
                return Err(invalid!(
                    "{what} has {len} entries, {want} expected for {x} with axes {:?}",
                    r.axes
                ));
            }
        }
    }
    let scale_values = scales.and_then(|o| o.value).map(|t| t.to_f64s());
    let size_values = sizes.and_then(|o| o.value).map(|t| t.to_i64s());
    if let Some(s) = &scale_values {
        if s.iter().any(|f| !(*f > 0.0 && f.is_finite())) {
            return Err(invalid!("scales must be positive, got {s:?}"));
        }
    }
    if let Some(s) = &size_values {
        if s.iter().any(|&v| v < 0) {
            return Err(invalid!("sizes must not be negative, got {s:?}"));
        }
    }
    let known = scale_values.is_some() || size_values.is_some();
    if let (true, Some(input)) = (known, x.shape.as_fixed()) {
        let roi_values =
            roi.and_then(|o| o.value).map(|t| (t.to_f64s(), t.dtype() == crate::DType::F32));
        let plan = resize_plan(
            r,
            &input,
            roi_values.as_ref().map(|(v, f)| (v.as_slice(), *f)),
            scale_values.as_deref(),
            size_values.as_deref(),
        )?;
        return Ok(vec![TensorType::new(x.dtype, Shape::fixed(&plan.out))]);
    }
    // Partly known: axes not resized keep their size; a stretched size or a unit scale is known.
    let mut dims = x.shape.0.clone();
    for (i, &a) in axes.iter().enumerate() {
        dims[a] = match (&size_values, &scale_values, &x.shape.0[a]) {
            (Some(s), _, _) if r.keep_aspect_ratio_policy == AspectRatioPolicy::Stretch => {
                Dim::Fixed(s[i] as usize)
            }
            (_, Some(s), d) if s[i] == 1.0 => d.clone(),
            (_, Some(s), Dim::Fixed(d)) => Dim::Fixed((s[i] * *d as f64).floor() as usize),
            _ => ctx.fresh(a),
        };
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// The spatial ranks GridSample and AffineGrid take: 1-D to 3-D images (ONNX defines any rank;
/// every model samples 2-D or 3-D ones, and a compiled kernel reads up to 4^r taps a point).
pub const GRID_MAX_SPATIAL: usize = 3;

/// GridSample: x `[N, C, D1..Dr]` (floats) and grid `[N, H1..Hr, r]` (floats) give
/// `[N, C, H1..Hr]` of x's type.
fn grid_sample(ops: &Operands) -> Infer {
    let (x, grid) = (ops.get(0)?.ty, ops.get(1)?.ty);
    if !x.dtype.is_float() {
        return Err(invalid!("x must be a float tensor, got {x}"));
    }
    if !grid.dtype.is_float() {
        return Err(invalid!("grid must be a float tensor, got {grid}"));
    }
    let r = x.rank().saturating_sub(2);
    if !(1..=GRID_MAX_SPATIAL).contains(&r) {
        return Err(invalid!(
            "x must be [N, C, D1..Dr] with 1 to {GRID_MAX_SPATIAL} spatial axes, got {x}"
        ));
    }
    if grid.rank() != r + 2 {
        return Err(invalid!(
            "grid must be [N, H1..H{r}, {r}] (rank {}) for x {x}, got {grid}",
            r + 2
        ));
    }
    let g = &grid.shape.0;
    if let Dim::Fixed(k) = g[r + 1] {
        if k != r {
            return Err(invalid!(
                "grid's last axis holds a point's {r} coordinates for x {x}, got {grid}"
            ));
        }
    }
    let n = match (&x.shape.0[0], &g[0]) {
        (Dim::Fixed(p), Dim::Fixed(q)) if p != q => {
            return Err(invalid!("x {x} and grid {grid} differ in batch size"));
        }
        (Dim::Sym(_), Dim::Fixed(_)) => g[0].clone(),
        (a, _) => a.clone(),
    };
    let mut dims = vec![n, x.shape.0[1].clone()];
    dims.extend(g[1..=r].iter().cloned());
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// AffineGrid: theta `[N, r, r + 1]` (floats) and size `[N, C, D1..Dr]` (r = 2 or 3, its
/// length) give `[N, D1..Dr, r]` of theta's type.
fn affine_grid(ops: &Operands, ctx: &Ctx) -> Infer {
    let (theta, size) = (ops.get(0)?.ty, ops.get(1)?);
    if !theta.dtype.is_float() {
        return Err(invalid!("theta must be a float tensor, got {theta}"));
    }
    if !size.ty.dtype.is_int() || size.ty.rank() != 1 {
        return Err(invalid!("size must be a 1-D integer tensor, got {}", size.ty));
    }
    let r = match &size.ty.shape.0[0] {
        Dim::Fixed(len @ (4 | 5)) => len - 2,
        Dim::Fixed(len) => {
            return Err(invalid!(
                "size must be [N, C, H, W] or [N, C, D, H, W], got {len} entries"
            ));
        }
        Dim::Sym(_) => match theta.shape.0.get(1) {
            Some(Dim::Fixed(r @ (2 | 3))) => *r,
            _ => return Err(invalid!("the grid's rank is unknown: size is {}", size.ty)),
        },
    };
    let want = [r, r + 1];
    let agrees = theta.rank() == 3
        && theta.shape.0[1..].iter().zip(want).all(|(d, w)| d.fixed().is_none_or(|d| d == w));
    if !agrees {
        return Err(invalid!("theta must be [N, {}, {}] for a {r}-D grid, got {theta}", r, r + 1));
    }
    let mut dims = Vec::with_capacity(r + 2);
    match size.value.map(Tensor::to_i64s) {
        Some(v) => {
            if v.len() != r + 2 {
                return Err(invalid!(
                    "size must hold {} entries for theta {theta}, got {v:?}",
                    r + 2
                ));
            }
            let mut fixed = Vec::with_capacity(r + 2);
            for &d in &v {
                fixed.push(
                    usize::try_from(d)
                        .map_err(|_| invalid!("size must not be negative, got {v:?}"))?,
                );
            }
            if let Dim::Fixed(n) = theta.shape.0[0] {
                if n != fixed[0] {
                    return Err(invalid!("size {v:?} and theta {theta} differ in batch size"));
                }
            }
            dims.push(Dim::Fixed(fixed[0]));
            dims.extend(fixed[2..].iter().map(|&d| Dim::Fixed(d)));
        }
        None => {
            dims.push(theta.shape.0[0].clone());
            dims.extend((1..=r).map(|i| ctx.fresh(i)));
        }
    }
    dims.push(Dim::Fixed(r));
    if let Some(fixed) = Shape(dims.clone()).as_fixed() {
        super::generate::checked_count(&fixed, theta.dtype, "the grid")?;
    }
    Ok(vec![TensorType::new(theta.dtype, Shape(dims))])
}

/// The most samples per axis a RoiAlign bin takes: `sampling_ratio`, or the bin's size when
/// that is 0 (then the boxes' values decide).
pub const ROI_MAX_GRID: usize = 1 << 10;

/// One RoiAlign box in input pixels, per axis `[h, w]`: where it starts, the size of its bins,
/// and the samples per bin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoiBox {
    pub start: [f64; 2],
    pub bin: [f64; 2],
    pub grid: [usize; 2],
}

/// The box `roi` (x1, y1, x2, y2) of RoiAlign: scaled by `spatial_scale`, shifted half a pixel
/// with `half_pixel` (without it, boxes smaller than a pixel grow to one), cut into `pooled`
/// bins, each sampled `sampling_ratio` times per axis (0: the bin's size, rounded up).
pub fn roi_box(
    roi: [f64; 4],
    spatial_scale: f64,
    half_pixel: bool,
    pooled: [usize; 2],
    sampling_ratio: usize,
) -> Result<RoiBox, OpError> {
    let shift = if half_pixel { 0.5 } else { 0.0 };
    let [x1, y1, x2, y2] = roi.map(|v| v * spatial_scale - shift);
    let mut size = [y2 - y1, x2 - x1];
    if !half_pixel {
        size = size.map(|s| s.max(1.0));
    }
    let bin = [size[0] / pooled[0] as f64, size[1] / pooled[1] as f64];
    if sampling_ratio > ROI_MAX_GRID {
        return Err(invalid!(
            "sampling_ratio must be at most {ROI_MAX_GRID}, got {sampling_ratio}"
        ));
    }
    let grid = if sampling_ratio > 0 {
        [sampling_ratio; 2]
    } else {
        let per_bin = |b: f64| {
            let g = b.ceil();
            // A box of no or negative size (or NaN) has no samples; its bins are 0.
            if g.is_nan() || g <= 0.0 {
                Ok(0)
            } else if g > ROI_MAX_GRID as f64 {
                Err(invalid!("a box {roi:?} samples its bins {g} times, more than {ROI_MAX_GRID}"))
            } else {
                Ok(g as usize)
            }
        };
        [per_bin(bin[0])?, per_bin(bin[1])?]
    };
    Ok(RoiBox { start: [y1, x1], bin, grid })
}

/// One axis of a RoiAlign sample at `coord` on an axis of `size` pixels: the low and high taps
/// and their weights, or `None` when the sample lies outside `[-1, size]` (it reads zero). The
/// coordinate is clamped to 0 below and to the last pixel above, as ONNX's reference does.
pub fn roi_axis_taps(coord: f64, size: usize) -> Option<(usize, usize, f64, f64)> {
    if !(-1.0..=size as f64).contains(&coord) || size == 0 {
        return None;
    }
    let c = coord.max(0.0);
    let low = c.floor() as usize;
    if low >= size - 1 {
        return Some((size - 1, size - 1, 1.0, 0.0));
    }
    let l = c - low as f64;
    Some((low, low + 1, 1.0 - l, l))
}

/// RoiAlign: `[R, C, output_height, output_width]`.
fn roi_align(pooled: [usize; 2], ops: &Operands) -> Infer {
    let (x, rois, batch) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    if !x.dtype.is_float() || x.rank() != 4 {
        return Err(invalid!("the input must be float [N, C, H, W], got {x}"));
    }
    if rois.dtype != x.dtype || rois.rank() != 2 || rois.shape.0[1].fixed().is_some_and(|d| d != 4)
    {
        return Err(invalid!("rois must be [R, 4] of the input's type, got {rois}"));
    }
    if !batch.dtype.is_int() || batch.rank() != 1 {
        return Err(invalid!("batch_indices must be an integer [R], got {batch}"));
    }
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (&rois.shape.0[0], &batch.shape.0[0]) {
        if a != b {
            return Err(invalid!("{a} rois but {b} batch indices"));
        }
    }
    if pooled.contains(&0) {
        return Err(invalid!("output_height and output_width must be positive, got {pooled:?}"));
    }
    let dims = vec![
        rois.shape.0[0].clone(),
        x.shape.0[1].clone(),
        Dim::Fixed(pooled[0]),
        Dim::Fixed(pooled[1]),
    ];
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}
