//! RoiAlign as bilinear sampling: the samples' places computed from the boxes at run time, their
//! four taps gathered (GatherElements) from each box's image and weighed, then the mean or the
//! largest over each bin's grid. What `kiln_ir::eval` computes, when `sampling_ratio` fixes the
//! grid (0 makes it depend on the boxes' values; such a node stays unsupported).

use kiln_ir::op::{Reduce, ReduceKind, RoiCoordinates, RoiPooling};
use kiln_ir::{BinaryOp, DType, NodeId, Op, Tensor, UnaryOp, ValueId};

use super::{compute_type, Emit};
use crate::Result;

/// The most pixels of an image whose flat tap indices are computed in f32 (exact below 2^24).
const F32_EXACT_INDEX: usize = 1 << 24;

/// The most samples per box and channel the rewrite gathers (bins times their grids).
const MAX_SAMPLES: usize = 1 << 24;

/// RoiAlign's attributes, as the decomposition uses them.
pub(super) struct RoiAttrs {
    pub half_pixel: bool,
    pub max: bool,
    pub pooled: [usize; 2],
    pub sampling_ratio: usize,
    pub spatial_scale: f64,
}

impl RoiAttrs {
    pub(super) fn of(op: &Op) -> Option<RoiAttrs> {
        let Op::RoiAlign {
            coordinates,
            mode,
            output_height,
            output_width,
            sampling_ratio,
            spatial_scale,
        } = op
        else {
            return None;
        };
        Some(RoiAttrs {
            half_pixel: *coordinates == RoiCoordinates::HalfPixel,
            max: *mode == RoiPooling::Max,
            pooled: [*output_height, *output_width],
            sampling_ratio: *sampling_ratio,
            spatial_scale: *spatial_scale as f64,
        })
    }
}

/// One axis of every sample (`coord`, `[R, S]`): the low and high tap coordinates and their
/// weights, as `kiln_ir::infer::roi_axis_taps` gives them (weights 0 and taps 0 outside
/// `[-1, size]`; clamped to 0 below and the last pixel above).
fn axis_taps(
    e: &mut Emit,
    what: &str,
    coord: ValueId,
    size: usize,
    cd: DType,
) -> Result<[ValueId; 4]> {
    let zero = e.scalar(0.0, cd)?;
    let one = e.scalar(1.0, cd)?;
    let below = e.scalar(-1.0, cd)?;
    let above = e.scalar(size as f64, cd)?;
    let last = e.scalar(size as f64 - 1.0, cd)?;
    let ge = e.binary(&format!("{what}_ge"), BinaryOp::GreaterOrEqual, coord, below)?;
    let le = e.binary(&format!("{what}_le"), BinaryOp::LessOrEqual, coord, above)?;
    let inside = e.binary(&format!("{what}_inside"), BinaryOp::And, ge, le)?;
    let c = e.binary(&format!("{what}_clamped"), BinaryOp::Max, coord, zero)?;
    let floor = e.unary(&format!("{what}_floor"), UnaryOp::Floor, c)?;
    let edge = e.binary(&format!("{what}_edge"), BinaryOp::GreaterOrEqual, floor, last)?;
    let low = e.select(&format!("{what}_low_edge"), edge, last, floor)?;
    let next = e.add(&format!("{what}_next"), floor, one)?;
    let high = e.select(&format!("{what}_high_edge"), edge, last, next)?;
    let frac = e.sub(&format!("{what}_frac"), c, floor)?;
    let l = e.select(&format!("{what}_l_edge"), edge, zero, frac)?;
    let h = e.sub(&format!("{what}_h"), one, l)?;
    // Outside: weights 0, and taps 0 (the computed ones may be anything, NaN included).
    let mut out = [low, high, h, l];
    for (v, part) in out.iter_mut().zip(["low", "high", "h", "l"]) {
        *v = e.select(&format!("{what}_{part}_inside"), inside, *v, zero)?;
    }
    Ok(out)
}

/// RoiAlign of `x` `[N, C, H, W]` for the boxes `rois` `[R, 4]` of images `batch_indices`.
pub(super) fn roi_align(e: &mut Emit, id: NodeId, a: &RoiAttrs) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let arg = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(rois), Some(batch)) = (arg(0), arg(1), arg(2)) else { return Ok(None) };
    // Past ROI_MAX_GRID the interpreter refuses the node; leave it to say so.
    if a.sampling_ratio == 0 || a.sampling_ratio > kiln_ir::infer::ROI_MAX_GRID {
        return Ok(None);
    }
    let &[n, c, h, w] = &e.dims(x)?[..] else { return Ok(None) };
    let r = e.dims(batch)?.first().copied().unwrap_or(0);
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    if cd != DType::F64 && h * w > F32_EXACT_INDEX {
        return Ok(None);
    }
    let g = a.sampling_ratio;
    let [ph, pw] = a.pooled;
    // The samples of one box and channel: past this the gathered taps would dwarf any image.
    let samples = [ph, g, pw, g].iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if samples.is_none_or(|s| s > MAX_SAMPLES) {
        return Ok(None);
    }

    // Each box's start and bin size per axis, [R, 1].
    let boxes = e.cast("rois_compute", rois, cd)?;
    let scale = e.scalar(a.spatial_scale, cd)?;
    let shift = e.scalar(if a.half_pixel { 0.5 } else { 0.0 }, cd)?;
    let corner = |e: &mut Emit, i: usize, what: &str| -> Result<ValueId> {
        let v = e.slice(what, boxes, 1, i, i + 1, 1)?;
        let v = e.mul(&format!("{what}_scaled"), v, scale)?;
        e.sub(&format!("{what}_shifted"), v, shift)
    };
    let mut coords = Vec::with_capacity(2);
    // Axis 0 (y) reads corners 1 and 3, axis 1 (x) corners 0 and 2.
    for ((lo, hi), bins, what) in [((1, 3), ph, "y"), ((0, 2), pw, "x")] {
        let start = corner(e, lo, &format!("{what}1"))?;
        let end = corner(e, hi, &format!("{what}2"))?;
        let mut size = e.sub(&format!("{what}_size"), end, start)?;
        if !a.half_pixel {
            let one = e.scalar(1.0, cd)?;
            size = e.binary(&format!("{what}_size_min"), BinaryOp::Max, size, one)?;
        }
        let count = e.scalar(bins as f64, cd)?;
        let bin = e.binary(&format!("{what}_bin"), BinaryOp::Div, size, count)?;
        // Sample (p, i) of the axis sits (p + (i + 0.5) / g) bins past the start.
        let steps: Vec<f64> = (0..bins)
            .flat_map(|p| (0..g).map(move |i| p as f64 + (i as f64 + 0.5) / g as f64))
            .collect();
        let steps =
            e.constant(&format!("{what}_steps"), Tensor::from_f64s(cd, &[bins * g], &steps)?)?;
        let along = e.mul(&format!("{what}_along"), bin, steps)?;
        let coord = e.add(&format!("{what}_samples"), start, along)?;
        coords.push(coord);
    }
    let [ylow, yhigh, hy, ly] = axis_taps(e, "y", coords[0], h, cd)?;
    let [xlow, xhigh, hx, lx] = axis_taps(e, "x", coords[1], w, cd)?;
    let (sy, sx) = (ph * g, pw * g);
    let column = |e: &mut Emit, v: ValueId| e.reshape("as_rows", v, &[r, sy, 1]);
    let row = |e: &mut Emit, v: ValueId| e.reshape("as_columns", v, &[r, 1, sx]);
    let ys = [(column(e, ylow)?, column(e, hy)?), (column(e, yhigh)?, column(e, ly)?)];
    let xs = [(row(e, xlow)?, row(e, hx)?), (row(e, xhigh)?, row(e, lx)?)];

    // Each box's image, [R, C, H * W].
    let xc = e.cast("compute", x, cd)?;
    let planes = e.reshape("planes", xc, &[n, c, h * w])?;
    let images = e.gather("box_images", planes, batch, 0)?;
    let width = e.scalar(w as f64, cd)?;
    let spread = e.ints(&[r as i64, c as i64, (sy * sx) as i64])?;
    let mut pooled = None;
    for &(yt, wy) in &ys {
        for &(xt, wx) in &xs {
            let row_start = e.mul("tap_row", yt, width)?;
            let flat = e.add("tap_flat", row_start, xt)?;
            let index = e.cast("tap_index", flat, DType::I64)?;
            let index = e.reshape("tap_index_flat", index, &[r, 1, sy * sx])?;
            let index = e.op2("tap_index_spread", Op::Expand, &[index, spread])?;
            let weight = e.mul("tap_weight", wy, wx)?;
            let weight = e.reshape("tap_weight_flat", weight, &[r, 1, sy * sx])?;
            let read = e.op2("tap", Op::GatherElements { axis: 2 }, &[images, index])?;
            let term = e.mul("tap_term", read, weight)?;
            pooled = Some(match pooled {
                None => term,
                Some(p) if a.max => e.binary("tap_max", BinaryOp::Max, p, term)?,
                Some(p) => e.add("tap_sum", p, term)?,
            });
        }
    }
    let samples = pooled.expect("four taps");
    let grid = e.reshape("grid", samples, &[r, c, ph, g, pw, g])?;
    let kind = if a.max { ReduceKind::Max } else { ReduceKind::Sum };
    let reduce = Op::Reduce(Reduce { kind, keepdims: false, noop_with_empty_axes: false });
    let axes = e.ints(&[3, 5])?;
    let mut y = e.op2("bins", reduce, &[grid, axes])?;
    if !a.max {
        let inv = e.scalar(1.0 / (g * g) as f64, cd)?;
        y = e.mul("mean", y, inv)?;
    }
    Ok(Some(vec![e.cast("result", y, dt)?]))
}
