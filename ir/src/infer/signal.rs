//! Signal processing: DFT, STFT, MelWeightMatrix. The plans here (`DftPlan`, `StftPlan`,
//! `mel_weight_matrix`) are shared by the interpreter and the compiler's decompositions, so both
//! compute the same coefficients.

use super::generate::checked_count;
use super::{Ctx, Infer, Operand, Operands};
use crate::error::{invalid, OpError};
use crate::{DType, Dim, Op, Shape, Tensor, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Dft { inverse, onesided } => dft(*inverse, *onesided, ops, ctx),
        Op::Stft { onesided } => stft(*onesided, ops, ctx),
        Op::MelWeightMatrix { dtype } => mel(*dtype, ops, ctx),
        _ => super::not_yet(op),
    }
}

/// The most points a transform may have along its axis (dft_length, a frame): far past any
/// signal a model transforms, and small enough that a point's products cannot overflow.
pub const DFT_MAX_LENGTH: usize = 1 << 31;

/// How a DFT maps the points of one line along its axis (each 1 part, real, or 2, real and
/// imaginary) to its result's: a linear map, whose weights [`DftPlan::weight`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DftPlan {
    /// Points on the input's axis, and parts per point.
    pub input_len: usize,
    pub input_parts: usize,
    /// The transform's length (`dft_length`).
    pub length: usize,
    /// Points on the result's axis, and parts per point.
    pub output_len: usize,
    pub output_parts: usize,
    pub inverse: bool,
    pub onesided: bool,
}

impl DftPlan {
    /// The plan for lines of `input_len` points of `input_parts` parts, transformed with
    /// `dft_length` points (the default when `None`).
    pub fn new(
        input_len: usize,
        input_parts: usize,
        dft_length: Option<i64>,
        inverse: bool,
        onesided: bool,
    ) -> Result<DftPlan, OpError> {
        if !matches!(input_parts, 1 | 2) {
            return Err(invalid!(
                "the last axis holds the real part (1) or the real and imaginary parts (2), got {input_parts}"
            ));
        }
        let length = match dft_length {
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|&n| (1..=DFT_MAX_LENGTH).contains(&n))
                .ok_or_else(|| invalid!("dft_length must be from 1 to 2^31, got {n}"))?,
            // An inverse one-sided transform restores an even-length signal by default.
            None if inverse && onesided => 2 * input_len.saturating_sub(1),
            None => input_len,
        };
        if length == 0 {
            return Err(invalid!(
                "the transform has no points (an axis of {input_len} points{})",
                if inverse && onesided { ", one-sided" } else { "" }
            ));
        }
        if length > DFT_MAX_LENGTH {
            return Err(invalid!("a transform of {length} points is more than 2^31"));
        }
        let (output_len, output_parts) = match (inverse, onesided) {
            (false, true) => (length / 2 + 1, 2),
            (true, true) => (length, 1),
            _ => (length, 2),
        };
        Ok(DftPlan { input_len, input_parts, length, output_len, output_parts, inverse, onesided })
    }

    /// `(cos, sin)` of `2πt / length` for `t` in `0..length`: every angle a weight uses.
    pub fn twiddles(&self) -> Vec<(f64, f64)> {
        let n = self.length as f64;
        (0..self.length)
            .map(|t| {
                let a = std::f64::consts::TAU * t as f64 / n;
                (a.cos(), a.sin())
            })
            .collect()
    }

    /// The weight of part `ci` of input point `j` in part `co` of result point `k`
    /// (`twiddles` from [`DftPlan::twiddles`]). Points past the transform's length (cut off)
    /// weigh 0; the zeros a short input is padded with contribute nothing.
    pub fn weight(&self, twiddles: &[(f64, f64)], j: usize, ci: usize, k: usize, co: usize) -> f64 {
        let n = self.length;
        // The angle reduced exactly: j * k mod n, with j, k < 2^31.
        let (cos, sin) = twiddles[((j as u64 * k as u64) % n as u64) as usize];
        let inv_n = 1.0 / n as f64;
        if self.inverse && self.onesided {
            // The real signal of a Hermitian spectrum of which bins 0..=n/2 are given: each
            // bin between 0 and n/2 stands for itself and its conjugate; the imaginary parts of
            // bins 0 and n/2 (n even) cancel, as numpy's irfft ignores them.
            if j > n / 2 || co != 0 {
                return 0.0;
            }
            let edge = j == 0 || 2 * j == n;
            let twice = if edge { 1.0 } else { 2.0 };
            return match ci {
                0 => twice * cos * inv_n,
                _ if edge => 0.0,
                _ => -twice * sin * inv_n,
            };
        }
        if j >= n {
            return 0.0;
        }
        // x e^{∓2πijk/n}: forward takes the minus sign, inverse the plus and 1/n.
        let (sign, scale) = if self.inverse { (1.0, inv_n) } else { (-1.0, 1.0) };
        match (ci, co) {
            (0, 0) | (1, 1) => scale * cos,
            (1, 0) => -sign * scale * sin,
            _ => sign * scale * sin,
        }
    }

    /// The whole map as a row-major `[input_len * input_parts, output_len * output_parts]`
    /// matrix: row `j * input_parts + ci`, column `k * output_parts + co`.
    pub fn matrix(&self) -> Vec<f64> {
        let tw = self.twiddles();
        let (ip, op) = (self.input_parts, self.output_parts);
        let mut m = Vec::with_capacity(self.input_len * ip * self.output_len * op);
        for j in 0..self.input_len {
            for ci in 0..ip {
                for k in 0..self.output_len {
                    for co in 0..op {
                        m.push(self.weight(&tw, j, ci, k, co));
                    }
                }
            }
        }
        m
    }
}

/// DFT's axis: `axis` (-2 when absent) for an input of `rank`; never the last (parts) axis.
pub fn dft_axis(axis: Option<i64>, rank: usize) -> Result<usize, OpError> {
    let a = axis.unwrap_or(-2);
    let r = rank as i64;
    let n = if a < 0 { a + r } else { a };
    if !(0..r - 1).contains(&n) {
        return Err(invalid!(
            "axis {a} is not a signal axis of a rank-{rank} input (-{rank} to {} but the last)",
            r - 1
        ));
    }
    Ok(n as usize)
}

/// One integer from a scalar (or one-element) operand's value.
fn scalar_int(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match t.to_i64s()[..] {
        [v] => Ok(v),
        _ => Err(invalid!("{what} must hold one value, got {}", t.ty())),
    }
}

/// Checks that an operand is an integer scalar (or one-element vector) and reads its value
/// when known.
fn int_operand(o: Operand, what: &str) -> Result<Option<i64>, OpError> {
    if !o.ty.dtype.is_int() || o.ty.rank() > 1 || o.ty.shape.numel().is_some_and(|n| n != 1) {
        return Err(invalid!("{what} must be an integer scalar, got {}", o.ty));
    }
    o.value.map(|t| scalar_int(t, what)).transpose()
}

/// The value of optional integer scalar operand `i`: `Ok(None)` when absent, `Err` when it is
/// not an integer scalar, `Ok(Some(None))` when known only at run time.
fn opt_int(ops: &Operands, i: usize, what: &str) -> Result<Option<Option<i64>>, OpError> {
    ops.opt(i).map(|o| int_operand(o, what)).transpose()
}

fn float_signal(x: &TensorType) -> Result<(), OpError> {
    if !x.dtype.is_float() {
        return Err(OpError::NeedsType { class: "float", ty: Box::new(x.clone()) });
    }
    Ok(())
}

/// The parts a signal's last axis holds, when known: 1 (real) or 2 (complex).
fn parts(x: &TensorType) -> Result<Option<usize>, OpError> {
    match x.shape.0.last() {
        Some(Dim::Fixed(p @ (1 | 2))) => Ok(Some(*p)),
        Some(Dim::Fixed(p)) => Err(invalid!(
            "the last axis of {x} holds the real part (1) or the real and imaginary parts (2), not {p}"
        )),
        _ => Ok(None),
    }
}

/// DFT: the axis resized to the result's points, the last axis to its parts.
fn dft(inverse: bool, onesided: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    float_signal(x)?;
    if x.rank() < 2 {
        return Err(invalid!("the signal must be [..., points, ..., 1 or 2], got {x}"));
    }
    let input_parts = parts(x)?;
    let dft_length = opt_int(ops, 1, "dft_length")?;
    let axis = match opt_int(ops, 2, "axis")? {
        None => dft_axis(None, x.rank())?,
        Some(Some(a)) => dft_axis(Some(a), x.rank())?,
        // The axis is known only at run time: so is every size but the parts'.
        Some(None) => {
            let mut shape = ctx.fresh_shape(x.rank())?;
            let out_parts = if inverse && onesided { 1 } else { 2 };
            *shape.0.last_mut().expect("rank 2 or more") = Dim::Fixed(out_parts);
            return Ok(vec![TensorType::new(x.dtype, shape)]);
        }
    };
    let mut dims = x.shape.0.clone();
    let input_len = x.shape.0[axis].fixed();
    let (points, out_parts) = match (input_len, dft_length, input_parts) {
        (Some(len), None | Some(Some(_)), Some(p)) => {
            let plan = DftPlan::new(len, p, dft_length.flatten(), inverse, onesided)?;
            (Dim::Fixed(plan.output_len), plan.output_parts)
        }
        (_, Some(Some(n)), _) => {
            // The input's points do not matter once the length is known.
            let plan = DftPlan::new(1, input_parts.unwrap_or(1), Some(n), inverse, onesided)?;
            (Dim::Fixed(plan.output_len), plan.output_parts)
        }
        _ => {
            let out_parts = if inverse && onesided { 1 } else { 2 };
            let same = !onesided && dft_length.is_none();
            (if same { dims[axis].clone() } else { ctx.fresh(axis) }, out_parts)
        }
    };
    dims[axis] = points;
    *dims.last_mut().expect("rank 2 or more") = Dim::Fixed(out_parts);
    if let Some(d) = Shape(dims.clone()).as_fixed() {
        checked_count(&d, x.dtype, "result")?;
    }
    Ok(vec![TensorType::new(x.dtype, Shape(dims))])
}

/// Where STFT's frames lie and how each is transformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StftPlan {
    pub frame_length: usize,
    pub frame_step: usize,
    pub frames: usize,
    /// The transform of one frame (forward, `frame_length` points).
    pub dft: DftPlan,
}

impl StftPlan {
    /// The plan for a signal of `length` points of `parts` parts; `frame_length` from the
    /// operand, else the window's length, else the signal's.
    pub fn new(
        length: usize,
        parts: usize,
        frame_step: i64,
        frame_length: Option<i64>,
        window: Option<usize>,
        onesided: bool,
    ) -> Result<StftPlan, OpError> {
        let frame_step = usize::try_from(frame_step)
            .ok()
            .filter(|&s| (1..=DFT_MAX_LENGTH).contains(&s))
            .ok_or_else(|| invalid!("frame_step must be from 1 to 2^31, got {frame_step}"))?;
        let frame_length = match frame_length {
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|&n| (1..=DFT_MAX_LENGTH).contains(&n))
                .ok_or_else(|| invalid!("frame_length must be from 1 to 2^31, got {n}"))?,
            None => window.unwrap_or(length),
        };
        if let Some(w) = window {
            if w != frame_length {
                return Err(invalid!("the window has {w} points but frames have {frame_length}"));
            }
        }
        if frame_length == 0 || frame_length > length {
            return Err(invalid!(
                "frames of {frame_length} points do not fit a signal of {length}"
            ));
        }
        let frames = 1 + (length - frame_length) / frame_step;
        let dft = DftPlan::new(frame_length, parts, None, false, onesided)?;
        Ok(StftPlan { frame_length, frame_step, frames, dft })
    }
}

/// STFT: `[batch, length, parts]` to `[batch, frames, bins, 2]`.
fn stft(onesided: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?.ty;
    float_signal(x)?;
    if x.rank() != 3 {
        return Err(invalid!("the signal must be [batch, length, 1 or 2], got {x}"));
    }
    let parts = parts(x)?;
    let step = int_operand(ops.get(1)?, "frame_step")?;
    let window = match ops.opt(2) {
        Some(w) => {
            if w.ty.rank() != 1 || !w.ty.dtype.is_float() {
                return Err(invalid!("the window must be a 1-D float tensor, got {}", w.ty));
            }
            Some(w.ty.shape.0[0].fixed())
        }
        None => None,
    };
    let frame_length = opt_int(ops, 3, "frame_length")?;
    let batch = x.shape.0[0].clone();
    let length = x.shape.0[1].fixed();
    let known_window = window.map(|w| w.ok_or(())).transpose();
    let (frames, bins) = match (length, step, frame_length, known_window, parts) {
        (Some(len), Some(s), None | Some(Some(_)), Ok(w), Some(p)) => {
            let plan = StftPlan::new(len, p, s, frame_length.flatten(), w, onesided)?;
            (Dim::Fixed(plan.frames), Dim::Fixed(plan.dft.output_len))
        }
        _ => (ctx.fresh(1), ctx.fresh(2)),
    };
    Ok(vec![TensorType::new(x.dtype, Shape(vec![batch, frames, bins, Dim::Fixed(2)]))])
}

/// The most mel bins or spectrogram bins MelWeightMatrix makes (a 2^24-entry matrix at most).
const MEL_MAX_BINS: usize = 1 << 12;

/// MelWeightMatrix's `[dft_length / 2 + 1, num_mel_bins]` values, row-major, as ONNX's
/// reference computes them: `num_mel_bins + 2` points evenly spaced in mel between the edges
/// (`mel = 2595 log10(1 + hz / 700)`), each converted back to hertz and to the spectrogram bin
/// `floor((dft_length + 1) * hz / sample_rate)`; filter `i` rises from point `i` to `i + 1` and
/// falls to `i + 2` (a filter of zero rise is 1 at its centre).
pub fn mel_weight_matrix(
    num_mel_bins: i64,
    dft_length: i64,
    sample_rate: i64,
    lower_edge_hertz: f64,
    upper_edge_hertz: f64,
) -> Result<(usize, usize, Vec<f64>), OpError> {
    let count = |v: i64, what: &str| {
        usize::try_from(v)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid!("{what} must be positive, got {v}"))
    };
    let mel_bins = count(num_mel_bins, "num_mel_bins")?;
    let length = count(dft_length, "dft_length")?;
    let rate = count(sample_rate, "sample_rate")? as f64;
    let spectrum_bins = length / 2 + 1;
    if mel_bins > MEL_MAX_BINS || spectrum_bins > MEL_MAX_BINS {
        return Err(invalid!(
            "{spectrum_bins} x {mel_bins} filters are more than {MEL_MAX_BINS} x {MEL_MAX_BINS}"
        ));
    }
    if !lower_edge_hertz.is_finite()
        || !upper_edge_hertz.is_finite()
        || lower_edge_hertz < 0.0
        || upper_edge_hertz < lower_edge_hertz
    {
        return Err(invalid!(
            "the edges must be 0 <= lower_edge_hertz <= upper_edge_hertz, got {lower_edge_hertz} and {upper_edge_hertz}"
        ));
    }
    let to_mel = |hz: f64| 2595.0 * (hz / 700.0).ln_1p() / std::f64::consts::LN_10;
    let (low, high) = (to_mel(lower_edge_hertz), to_mel(upper_edge_hertz));
    let points = mel_bins + 2;
    let step = (high - low) / points as f64;
    let bins: Vec<usize> = (0..points)
        .map(|i| {
            let mel = i as f64 * step + low;
            let hz = 700.0 * (mel / 2595.0 * std::f64::consts::LN_10).exp_m1();
            let bin = ((length as f64 + 1.0) * hz / rate).floor();
            // Points are increasing and not negative. The last is only the end of the last
            // filter's fall, so it may be the bin just past the spectrum; the others may not.
            let end = if i + 1 == points { spectrum_bins } else { spectrum_bins - 1 };
            if bin > end as f64 {
                return Err(invalid!(
                    "upper_edge_hertz {upper_edge_hertz} lies past the {spectrum_bins} bins of a {length}-point spectrum at {sample_rate} Hz"
                ));
            }
            Ok(bin.max(0.0) as usize)
        })
        .collect::<Result<_, _>>()?;
    let mut m = vec![0.0; spectrum_bins * mel_bins];
    for i in 0..mel_bins {
        let (lo, centre, hi) = (bins[i], bins[i + 1], bins[i + 2]);
        if centre == lo {
            m[centre * mel_bins + i] = 1.0;
        } else {
            for j in lo..=centre {
                m[j * mel_bins + i] = (j - lo) as f64 / (centre - lo) as f64;
            }
        }
        for j in centre..hi {
            m[j * mel_bins + i] = (hi - j) as f64 / (hi - centre) as f64;
        }
    }
    Ok((spectrum_bins, mel_bins, m))
}

/// MelWeightMatrix: `[dft_length / 2 + 1, num_mel_bins]` of `dtype` (f32 by default).
fn mel(dtype: Option<DType>, ops: &Operands, ctx: &Ctx) -> Infer {
    let dtype = dtype.unwrap_or(DType::F32);
    if !dtype.is_float() {
        return Err(invalid!("output_datatype must be a float type, got {dtype}"));
    }
    let mel_bins = int_operand(ops.get(0)?, "num_mel_bins")?;
    let length = int_operand(ops.get(1)?, "dft_length")?;
    int_operand(ops.get(2)?, "sample_rate")?;
    for (i, what) in [(3, "lower_edge_hertz"), (4, "upper_edge_hertz")] {
        let t = ops.get(i)?.ty;
        if !t.dtype.is_float() || t.rank() > 1 || t.shape.numel().is_some_and(|n| n != 1) {
            return Err(invalid!("{what} must be a float scalar, got {t}"));
        }
    }
    let values: Option<Vec<&Tensor>> = (0..5).map(|i| ops.opt(i).and_then(|o| o.value)).collect();
    if let Some(v) = values {
        // Every operand known: the matrix is, so its errors show now.
        let f = |t: &Tensor| t.to_f64s()[0];
        let (rows, cols, _) = mel_weight_matrix(
            scalar_int(v[0], "num_mel_bins")?,
            scalar_int(v[1], "dft_length")?,
            scalar_int(v[2], "sample_rate")?,
            f(v[3]),
            f(v[4]),
        )?;
        return Ok(vec![TensorType::new(dtype, [rows, cols])]);
    }
    let rows = match length {
        Some(n) if n > 0 => Dim::Fixed(n as usize / 2 + 1),
        _ => ctx.fresh(0),
    };
    let cols = match mel_bins {
        Some(n) if n > 0 => Dim::Fixed(n as usize),
        _ => ctx.fresh(1),
    };
    Ok(vec![TensorType::new(dtype, Shape(vec![rows, cols]))])
}
