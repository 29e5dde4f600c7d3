//! Resize, following ONNX's reference (onnx/reference/ops/op_resize.py): separable, one axis at a
//! time in f64, each output coordinate mapped to the input, then a small kernel of neighbours
//! (clamped to the edge) weighted by the mode's coefficients. GridSample and AffineGrid follow
//! ONNX's definitions (and PyTorch's `grid_sample` and `affine_grid`, which they describe).

use super::not_yet;
use crate::error::{invalid, OpError};
use crate::infer::{resize_plan, roi_axis_taps, roi_box, ResizePlan};
use crate::op::{
    CoordinateTransform, GridPadding, NearestMode, Resize, ResizeMode, RoiCoordinates, RoiPooling,
};
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Resize(r) => resize(r, operands, out_types),
        Op::GridSample { mode, padding, align_corners } => {
            grid_sample(*mode, *padding, *align_corners, operands, out_types)
        }
        Op::AffineGrid { align_corners } => affine_grid(*align_corners, operands, out_types),
        Op::RoiAlign {
            coordinates,
            mode,
            output_height,
            output_width,
            sampling_ratio,
            spatial_scale,
        } => {
            let half_pixel = *coordinates == RoiCoordinates::HalfPixel;
            let max = *mode == RoiPooling::Max;
            let pooled = [*output_height, *output_width];
            let scale = *spatial_scale as f64;
            roi_align(half_pixel, max, pooled, *sampling_ratio, scale, operands)
        }
        _ => not_yet(op),
    }
}

/// An optional operand with no elements counts as absent.
fn given<'a>(operands: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    operands.get(i).copied().flatten().filter(|t| !t.is_empty())
}

fn resize(
    r: &Resize,
    operands: &[Option<&Tensor>],
    _out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let x = operands.first().copied().flatten().ok_or("Resize needs an input")?;
    let (out, steps) =
        resize_steps(r, x.dims(), given(operands, 1), given(operands, 2), given(operands, 3))?;
    let mut dims = x.dims().to_vec();
    let mut data = x.to_f64s();
    for step in &steps {
        data = apply_step(r, step, &data, &dims);
        dims[step.axis] = step.taps.len();
    }
    // Integers round half to even before saturating, as the reference's saturate_cast does.
    if !x.dtype().is_float() {
        data.iter_mut().for_each(|v| *v = v.round_ties_even());
    }
    Ok(vec![Tensor::from_f64s(x.dtype(), &out, &data).map_err(OpError::from)?])
}

/// One pass of a Resize, along one axis: for every output position along it, the input
/// positions and weights it sums (in this order), or `None` for the extrapolation value.
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeStep {
    pub axis: usize,
    pub taps: Vec<Option<Vec<(usize, f64)>>>,
}

/// The output dimensions of a Resize of an input of `dims` and the passes that compute it, in
/// order (axes left alone have none), from the values of roi, scales and sizes (empty ones
/// count as absent). The code generator builds its tables from these, so that compiled code
/// and this interpreter share one geometry.
pub fn resize_steps(
    r: &Resize,
    dims: &[usize],
    roi: Option<&Tensor>,
    scales: Option<&Tensor>,
    sizes: Option<&Tensor>,
) -> Result<(Vec<usize>, Vec<ResizeStep>), OpError> {
    fn nonempty(t: Option<&Tensor>) -> Option<&Tensor> {
        t.filter(|t| !t.is_empty())
    }
    let roi = nonempty(roi).map(|t| (t.to_f64s(), t.dtype() == DType::F32));
    let scales = nonempty(scales).map(|t| t.to_f64s());
    let sizes = nonempty(sizes).map(|t| t.to_i64s());
    let plan = resize_plan(
        r,
        dims,
        roi.as_ref().map(|(v, f)| (v.as_slice(), *f)),
        scales.as_deref(),
        sizes.as_deref(),
    )?;
    if r.coordinate_transform == CoordinateTransform::TfCropAndResize && plan.roi.is_none() {
        return Err("tf_crop_and_resize needs roi".into());
    }
    let mut steps = Vec::new();
    for &axis in &plan.order {
        if skip_axis(&plan, axis, dims[axis]) {
            continue;
        }
        if dims[axis] == 0 && plan.out[axis] > 0 {
            return Err(invalid!("cannot resize axis {axis} of size 0 to {}", plan.out[axis]));
        }
        steps.push(ResizeStep { axis, taps: taps(r, &plan, dims[axis], axis) });
    }
    Ok((plan.out, steps))
}

/// The reference leaves an axis alone when its scale is 1 (math.isclose), its size does not
/// change and its region of interest is the whole axis.
fn skip_axis(plan: &ResizePlan, axis: usize, input: usize) -> bool {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    close(plan.scales[axis], 1.0)
        && plan.out[axis] == input
        && plan.roi.as_ref().is_none_or(|roi| roi[axis].0 == 0.0 && close(roi[axis].1, 1.0))
}

/// The input coordinate of output position `y` on one axis, and whether it lies outside the input
/// (only tf_crop_and_resize extrapolates).
fn source_coordinate(
    mode: CoordinateTransform,
    y: f64,
    scale: f64,
    input: usize,
    out: usize,
    roi: (f64, f64),
    roi_f32: bool,
) -> (f64, bool) {
    let (in_f, out_f) = (input as f64, scale * input as f64);
    let x = match mode {
        CoordinateTransform::AlignCorners => {
            if out_f == 1.0 {
                0.0
            } else {
                y * (in_f - 1.0) / (out_f - 1.0)
            }
        }
        CoordinateTransform::Asymmetric => y / scale,
        CoordinateTransform::TfCropAndResize => {
            // The reference combines f32 roi values in f32 before meeting the f64 coordinates.
            let (span, start) = if roi_f32 {
                ((roi.1 as f32 - roi.0 as f32) as f64, (roi.0 as f32 * (input as f32 - 1.0)) as f64)
            } else {
                (roi.1 - roi.0, roi.0 * (in_f - 1.0))
            };
            let x = if out_f == 1.0 {
                if roi_f32 {
                    (span as f32 * (input as f32 - 1.0) / 2.0) as f64
                } else {
                    span * (in_f - 1.0) / 2.0
                }
            } else {
                y * span * (in_f - 1.0) / (out_f - 1.0)
            };
            let x = x + start;
            return (x, x < 0.0 || x > in_f - 1.0);
        }
        CoordinateTransform::PytorchHalfPixel => {
            if out_f == 1.0 {
                -0.5
            } else {
                (y + 0.5) / scale - 0.5
            }
        }
        CoordinateTransform::HalfPixel => (y + 0.5) / scale - 0.5,
        CoordinateTransform::HalfPixelSymmetric => {
            let adjustment = out as f64 / out_f;
            let offset = in_f / 2.0 * (1.0 - adjustment);
            offset + (y + 0.5) / scale - 0.5
        }
    };
    (x, false)
}

/// The cubic convolution kernel with parameter `a` at distance `x`. The reference (and
/// onnxruntime) compute cubic weights in f32, as `cubic_coeff_a` is f32; so does this, so that
/// results agree to rounding even where they nearly cancel.
fn cubic(x: f64, a: f32) -> f64 {
    let x = x.abs() as f32;
    (if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }) as f64
}

/// Normalised cubic weights at distances `xs` for antialiasing, rounded as the reference's numpy
/// arithmetic rounds them: kernel values and their sum in f32; the quotients in f32 unless a
/// weight is an exact (f64) zero, which makes numpy divide in f64.
fn cubic_antialias(xs: impl Iterator<Item = f64>, a: f32) -> Vec<f64> {
    let values: Vec<Option<f32>> = xs
        .map(|x| {
            let x = x.abs();
            let x2 = x * x;
            let x3 = x * x2;
            if x <= 1.0 {
                Some((a + 2.0) * x3 as f32 - (a + 3.0) * x2 as f32 + 1.0)
            } else if x < 2.0 {
                Some(a * x3 as f32 - 5.0 * a * x2 as f32 + 8.0 * a * x as f32 - 4.0 * a)
            } else {
                None
            }
        })
        .collect();
    let sum = values.iter().fold(0f32, |acc, v| acc + v.unwrap_or(0.0));
    let exact_zero = values.iter().any(Option::is_none);
    values
        .into_iter()
        .map(|v| match v {
            None => 0.0,
            Some(v) if exact_zero => v as f64 / sum as f64,
            Some(v) => (v / sum) as f64,
        })
        .collect()
}

/// The weights of the neighbours `base + 1 - n/2 ..= base + n/2` of a point `ratio` past `base`
/// (`ratio` in (0, 1]), for the resize mode.
fn coefficients(r: &Resize, ratio: f64, scale: f64) -> Vec<f64> {
    let normalise = |c: Vec<f64>| {
        let sum: f64 = c.iter().sum();
        c.into_iter().map(|v| v / sum).collect()
    };
    match r.mode {
        ResizeMode::Nearest => {
            let ceil = if ratio == 1.0 {
                true
            } else {
                match r.nearest_mode {
                    NearestMode::RoundPreferFloor => ratio > 0.5,
                    NearestMode::RoundPreferCeil => ratio >= 0.5,
                    NearestMode::Floor => false,
                    NearestMode::Ceil => true,
                }
            };
            vec![(!ceil) as u8 as f64, ceil as u8 as f64]
        }
        ResizeMode::Linear if r.antialias => {
            // A triangle stretched by 1/scale when downsampling.
            let s = scale.min(1.0);
            let start = (-1.0 / s).floor() as i64 + 1;
            let n = 2 - 2 * start;
            normalise(
                (start..start + n)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect(),
            )
        }
        ResizeMode::Linear => vec![1.0 - ratio, ratio],
        ResizeMode::Cubic if r.antialias => {
            let s = scale.min(1.0);
            let start = (-2.0 / s).floor() as i64 + 1;
            cubic_antialias((start..2 - start).map(|i| s * (i as f64 - ratio)), r.cubic_coeff_a)
        }
        ResizeMode::Cubic => {
            let a = r.cubic_coeff_a;
            vec![
                cubic(ratio + 1.0, a),
                cubic(ratio, a),
                cubic(1.0 - ratio, a),
                cubic(1.0 - ratio + 1.0, a),
            ]
        }
    }
}

/// The taps of every output position along `axis` (of `input` positions).
fn taps(
    r: &Resize,
    plan: &ResizePlan,
    input: usize,
    axis: usize,
) -> Vec<Option<Vec<(usize, f64)>>> {
    let (out, scale) = (plan.out[axis], plan.scales[axis]);
    let roi = plan.roi.as_ref().map_or((0.0, 1.0), |roi| roi[axis]);
    (0..out)
        .map(|y| {
            let (x, outside) = source_coordinate(
                r.coordinate_transform,
                y as f64,
                scale,
                input,
                out,
                roi,
                plan.roi_f32,
            );
            if outside {
                return None;
            }
            // The neighbour left of x is preferred: an integer x sits at ratio 1 past x - 1.
            let floor = x.floor();
            let (base, ratio) =
                if x == floor { (floor as i64 - 1, 1.0) } else { (floor as i64, x - floor) };
            let mut coeffs = coefficients(r, ratio, scale);
            let first = base + 1 - (coeffs.len() / 2) as i64;
            let last = input as i64 - 1;
            if r.exclude_outside {
                for (j, c) in coeffs.iter_mut().enumerate() {
                    if !(0..=last).contains(&(first + j as i64)) {
                        *c = 0.0;
                    }
                }
                let sum: f64 = coeffs.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                coeffs.iter_mut().for_each(|c| *c /= sum);
            }
            // Zero weights are dropped, so nearest picks a value (0 * inf would give NaN).
            Some(
                coeffs
                    .into_iter()
                    .enumerate()
                    .filter(|(_, c)| *c != 0.0)
                    .map(|(j, c)| ((first + j as i64).clamp(0, last) as usize, c))
                    .collect(),
            )
        })
        .collect()
}

/// Applies one step to `data` (of dimensions `dims`).
fn apply_step(r: &Resize, step: &ResizeStep, data: &[f64], dims: &[usize]) -> Vec<f64> {
    let (axis, input, out) = (step.axis, dims[step.axis], step.taps.len());
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let extrapolation = r.extrapolation_value as f64;
    let mut y = Vec::with_capacity(outer * out * inner);
    for o in 0..outer {
        let plane = &data[o * input * inner..(o + 1) * input * inner];
        for tap in &step.taps {
            match tap {
                None => y.extend(std::iter::repeat_n(extrapolation, inner)),
                Some(tap) => y.extend(
                    (0..inner)
                        .map(|i| tap.iter().map(|&(k, c)| c * plane[k * inner + i]).sum::<f64>()),
                ),
            }
        }
    }
    y
}

// ----- GridSample and AffineGrid -----

/// Keys' cubic convolution coefficient of GridSample's cubic mode (PyTorch's, fixed by ONNX).
pub const GRID_CUBIC_A: f64 = -0.75;

/// How far from the origin (in pixels) a sampling coordinate may lie: farther ones are clamped
/// to it, and NaN reads as its negative. Every tap's index then fits an i64, and a compiled
/// kernel, which clamps the same way, reads the same pixels; at 2^40 pixels the clamp changes
/// no point a real image can hold.
pub const GRID_COORD_BOUND: f64 = (1u64 << 40) as f64;

/// The pixel coordinate of normalised grid coordinate `g` along an axis of `d` pixels: -1 and 1
/// are the outer pixels' centres with `align_corners`, their outer edges without.
pub fn grid_denormalize(g: f64, d: usize, align_corners: bool) -> f64 {
    let d = d as f64;
    if align_corners {
        (g + 1.0) / 2.0 * (d - 1.0)
    } else {
        ((g + 1.0) * d - 1.0) / 2.0
    }
}

/// The range of pixel coordinates inside an axis of `d` pixels, which reflection folds into.
pub fn grid_bounds(d: usize, align_corners: bool) -> (f64, f64) {
    if align_corners {
        (0.0, d as f64 - 1.0)
    } else {
        (-0.5, d as f64 - 0.5)
    }
}

/// `x` reflected at `lo` and `hi` until it lies between them (an empty range folds to `lo`).
pub fn grid_reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let span = hi - lo;
    if span <= 0.0 {
        return lo;
    }
    // An even number of whole folds leaves the point mirrored at the edge it crossed, an odd
    // one at the other.
    let folds = |past: f64| {
        let n = (past / span).floor();
        (past - n * span, n - 2.0 * (n / 2.0).floor() == 0.0)
    };
    if x < lo {
        let (rest, even) = folds(lo - x);
        if even {
            lo + rest
        } else {
            hi - rest
        }
    } else if x > hi {
        let (rest, even) = folds(x - hi);
        if even {
            hi - rest
        } else {
            lo + rest
        }
    } else {
        x
    }
}

/// Keys' cubic weights of the taps at `x0 - 1 .. x0 + 2` for a point `t` past `x0` (0 <= t < 1).
pub fn grid_cubic_weights(t: f64) -> [f64; 4] {
    let a = GRID_CUBIC_A;
    let outer = |s: f64| ((a * s - 5.0 * a) * s + 8.0 * a) * s - 4.0 * a;
    let inner = |s: f64| ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0;
    [outer(t + 1.0), inner(t), inner(1.0 - t), outer(2.0 - t)]
}

/// The pixel a tap at index `i` reads along an axis of `d` (> 0) pixels, `None` for zero.
fn grid_pixel(i: f64, d: usize, padding: GridPadding, align_corners: bool) -> Option<usize> {
    let last = d as f64 - 1.0;
    let i = match padding {
        GridPadding::Zeros if i < 0.0 || i > last => return None,
        GridPadding::Zeros => i,
        GridPadding::Border => i.clamp(0.0, last),
        GridPadding::Reflection => {
            let (lo, hi) = grid_bounds(d, align_corners);
            grid_reflect(i, lo, hi).trunc().clamp(0.0, last)
        }
    };
    Some(i as usize)
}

/// The taps (pixel, weight) of the point at pixel coordinate `x` along an axis of `d` (> 0)
/// pixels: the coordinate is first brought inside by border or reflection padding (nearest
/// rounds it half to even before), then each tap's index is padded again.
fn grid_axis_taps(
    x: f64,
    d: usize,
    mode: ResizeMode,
    padding: GridPadding,
    align_corners: bool,
) -> Vec<(Option<usize>, f64)> {
    let mut x =
        if x.is_nan() { -GRID_COORD_BOUND } else { x.clamp(-GRID_COORD_BOUND, GRID_COORD_BOUND) };
    if mode == ResizeMode::Nearest {
        x = x.round_ties_even();
    }
    let (lo, hi) = grid_bounds(d, align_corners);
    if x < lo || x > hi {
        x = match padding {
            GridPadding::Zeros => x,
            GridPadding::Border => x.clamp(0.0, d as f64 - 1.0),
            GridPadding::Reflection => grid_reflect(x, lo, hi),
        };
    }
    let px = |i: f64| grid_pixel(i, d, padding, align_corners);
    match mode {
        ResizeMode::Nearest => vec![(px(x.trunc()), 1.0)],
        ResizeMode::Linear => {
            let x0 = x.floor();
            let t = x - x0;
            vec![(px(x0), 1.0 - t), (px(x0 + 1.0), t)]
        }
        ResizeMode::Cubic => {
            let x0 = x.floor();
            let w = grid_cubic_weights(x - x0);
            (0..4).map(|k| (px(x0 + k as f64 - 1.0), w[k])).collect()
        }
    }
}

fn grid_sample(
    mode: ResizeMode,
    padding: GridPadding,
    align_corners: bool,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let x = operands.first().copied().flatten().ok_or("GridSample needs an input")?;
    let grid = operands.get(1).copied().flatten().ok_or("GridSample needs a grid")?;
    let out_dims = out
        .first()
        .and_then(|t| t.shape.as_fixed())
        .ok_or("GridSample's result shape is unknown")?;
    let xd = x.dims();
    let (n, c, spatial) = (xd[0], xd[1], &xd[2..]);
    let r = spatial.len();
    let points: usize = grid.dims()[1..=r].iter().product();
    let plane: usize = spatial.iter().product();
    let total = n * c * points;
    let mut y = vec![0.0; total];
    if total > 0 && plane == 0 && padding != GridPadding::Zeros {
        return Err(invalid!(
            "cannot sample the empty input {} with {} padding",
            x.ty(),
            padding.name()
        ));
    }
    if total > 0 && plane > 0 {
        let xs = x.to_f64s();
        let gs = grid.to_f64s();
        // Coordinates are computed in the grid's precision, as PyTorch does (the reference
        // rounds them to f32).
        let wide = grid.dtype() == DType::F64;
        let mut strides = vec![1usize; r];
        for i in (0..r.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * spatial[i + 1];
        }
        for b in 0..n {
            for p in 0..points {
                let point = &gs[(b * points + p) * r..][..r];
                // Axis i (outermost first) takes the point's coordinate r - 1 - i.
                let taps: Vec<Vec<(Option<usize>, f64)>> = (0..r)
                    .map(|i| {
                        let mut xi = grid_denormalize(point[r - 1 - i], spatial[i], align_corners);
                        if !wide {
                            xi = xi as f32 as f64;
                        }
                        grid_axis_taps(xi, spatial[i], mode, padding, align_corners)
                    })
                    .collect();
                for ch in 0..c {
                    let image = &xs[(b * c + ch) * plane..][..plane];
                    y[(b * c + ch) * points + p] = grid_combine(image, &taps, &strides);
                }
            }
        }
    }
    Ok(vec![Tensor::from_f64s(x.dtype(), &out_dims, &y).map_err(OpError::from)?])
}

/// Σ over every combination of one tap per axis of the product of their weights times the
/// pixel they address (zero where a tap reads outside with zero padding).
fn grid_combine(image: &[f64], taps: &[Vec<(Option<usize>, f64)>], strides: &[usize]) -> f64 {
    let Some((first, rest)) = taps.split_first() else { return 0.0 };
    let mut sum = 0.0;
    for &(i, w) in first {
        let v = match (i, rest.is_empty()) {
            (None, _) => 0.0,
            (Some(i), true) => image[i],
            (Some(i), false) => grid_combine(&image[i * strides[0]..], rest, &strides[1..]),
        };
        sum += w * v;
    }
    sum
}

/// The normalised positions of the pixel centres along an axis of `d` pixels, as AffineGrid
/// lays them out: from -1 to 1 with `align_corners`, half a pixel inside them without; a
/// single pixel sits at 0 (PyTorch's `affine_grid`).
pub fn affine_grid_positions(d: usize, align_corners: bool) -> Vec<f64> {
    (0..d)
        .map(|i| match (d, align_corners) {
            (1, _) => 0.0,
            (_, true) => -1.0 + 2.0 * i as f64 / (d - 1) as f64,
            (_, false) => -1.0 + (2 * i + 1) as f64 / d as f64,
        })
        .collect()
}

/// The homogeneous base grid of AffineGrid for the spatial `dims` (outermost first): one row
/// `[x, y(, z), 1]` per pixel in row-major order, coordinates innermost axis first.
pub fn affine_grid_base(dims: &[usize], align_corners: bool) -> Vec<f64> {
    let r = dims.len();
    let positions: Vec<Vec<f64>> =
        dims.iter().map(|&d| affine_grid_positions(d, align_corners)).collect();
    let pixels: usize = dims.iter().product();
    let mut base = Vec::with_capacity(pixels * (r + 1));
    let mut at = vec![0usize; r];
    for _ in 0..pixels {
        base.extend((0..r).rev().map(|i| positions[i][at[i]]));
        base.push(1.0);
        for i in (0..r).rev() {
            at[i] += 1;
            if at[i] < dims[i] {
                break;
            }
            at[i] = 0;
        }
    }
    base
}

fn affine_grid(
    align_corners: bool,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let theta = operands.first().copied().flatten().ok_or("AffineGrid needs theta")?;
    let out_dims = out
        .first()
        .and_then(|t| t.shape.as_fixed())
        .ok_or("AffineGrid's result shape is unknown")?;
    let r = out_dims.len() - 2;
    let spatial = &out_dims[1..=r];
    let base = affine_grid_base(spatial, align_corners);
    let th = theta.to_f64s();
    let pixels: usize = spatial.iter().product();
    let mut y = Vec::with_capacity(out_dims[0] * pixels * r);
    for m in th.chunks_exact(r * (r + 1)).take(out_dims[0]) {
        for b in base.chunks_exact(r + 1) {
            for row in m.chunks_exact(r + 1) {
                y.push(row.iter().zip(b).map(|(a, b)| a * b).sum());
            }
        }
    }
    Ok(vec![Tensor::from_f64s(theta.dtype(), &out_dims, &y).map_err(OpError::from)?])
}

/// RoiAlign: each box's bins pooled from their bilinear samples, in f64, as ONNX's reference
/// (the mean of the samples, or the largest of every sample's four weighted taps).
fn roi_align(
    half_pixel: bool,
    max: bool,
    pooled: [usize; 2],
    sampling_ratio: usize,
    spatial_scale: f64,
    operands: &[Option<&Tensor>],
) -> Result<Vec<Tensor>, OpError> {
    let arg =
        |i: usize| operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i });
    let (x, rois, batch) = (arg(0)?, arg(1)?, arg(2)?);
    let &[n, c, h, w] = x.dims() else {
        return Err(invalid!("the input must be [N, C, H, W], got {}", x.ty()));
    };
    let boxes = rois.to_f64s();
    let batch = batch.to_i64s();
    let r = batch.len();
    if boxes.len() != 4 * r {
        return Err(invalid!("{} rois but {r} batch indices", boxes.len() / 4));
    }
    let xv = x.to_f64s();
    let [ph_n, pw_n] = pooled;
    let mut y = vec![0.0; r * c * ph_n * pw_n];
    for (i, &b) in batch.iter().enumerate() {
        let b = usize::try_from(b)
            .ok()
            .filter(|&b| b < n)
            .ok_or_else(|| invalid!("batch index {b} of box {i} is outside the {n} images"))?;
        let roi = [boxes[4 * i], boxes[4 * i + 1], boxes[4 * i + 2], boxes[4 * i + 3]];
        let bx = roi_box(roi, spatial_scale, half_pixel, pooled, sampling_ratio)?;
        let [gh, gw] = bx.grid;
        let count = (gh * gw).max(1) as f64;
        // The four (pixel, weight) taps of each sample of each bin, shared by every channel:
        // refused before allocating when memory cannot hold them (a result with no channels
        // passes the result's own check whatever its bins).
        let table = [ph_n, pw_n, gh, gw];
        if crate::memory::bytes_of(&table, 72)
            .is_none_or(|b| b > crate::memory::available_at_start())
        {
            return Err(invalid!(
                "the samples of {table:?} bins and grids need more memory than is available"
            ));
        }
        let mut bins = Vec::with_capacity(ph_n * pw_n);
        for ph in 0..ph_n {
            for pw in 0..pw_n {
                let mut samples = Vec::with_capacity(gh * gw);
                for iy in 0..gh {
                    let yy = bx.start[0]
                        + ph as f64 * bx.bin[0]
                        + (iy as f64 + 0.5) * bx.bin[0] / gh as f64;
                    for ix in 0..gw {
                        let xx = bx.start[1]
                            + pw as f64 * bx.bin[1]
                            + (ix as f64 + 0.5) * bx.bin[1] / gw as f64;
                        samples.push(match (roi_axis_taps(yy, h), roi_axis_taps(xx, w)) {
                            (Some((y0, y1, hy, ly)), Some((x0, x1, hx, lx))) => Some([
                                (y0 * w + x0, hy * hx),
                                (y0 * w + x1, hy * lx),
                                (y1 * w + x0, ly * hx),
                                (y1 * w + x1, ly * lx),
                            ]),
                            _ => None,
                        });
                    }
                }
                bins.push(samples);
            }
        }
        for ch in 0..c {
            let plane = &xv[(b * c + ch) * h * w..][..h * w];
            let out = &mut y[(i * c + ch) * ph_n * pw_n..][..ph_n * pw_n];
            for (o, samples) in out.iter_mut().zip(&bins) {
                let value = |s: &Option<[(usize, f64); 4]>| {
                    s.map_or([0.0; 4], |taps| taps.map(|(p, wt)| wt * plane[p]))
                };
                *o = if max {
                    samples
                        .iter()
                        .map(|s| value(s).into_iter().fold(f64::NEG_INFINITY, f64::max))
                        .reduce(f64::max)
                        .unwrap_or(0.0)
                } else {
                    samples.iter().map(|s| value(s).iter().sum::<f64>()).sum::<f64>() / count
                };
            }
        }
    }
    Ok(vec![Tensor::from_f64s(x.dtype(), &[r, c, ph_n, pw_n], &y)?])
}
