//! Resize, following ONNX's reference (onnx/reference/ops/op_resize.py): separable, one axis at a
//! time in f64, each output coordinate mapped to the input, then a small kernel of neighbours
//! (clamped to the edge) weighted by the mode's coefficients.

use super::not_yet;
use crate::error::{invalid, OpError};
use crate::infer::{resize_plan, ResizePlan};
use crate::op::{CoordinateTransform, NearestMode, Resize, ResizeMode};
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Resize(r) => resize(r, operands, out_types),
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
