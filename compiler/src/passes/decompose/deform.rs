//! DeformConv as bilinear sampling by GatherElements into deformed columns, then a grouped
//! MatMul with the weights: what `kiln_ir::eval` computes, once the shapes are static.

use kiln_ir::infer::DeformPlan;
use kiln_ir::op::DeformConv;
use kiln_ir::{BinaryOp, DType, NodeId, Op, Tensor, UnaryOp, ValueId};

use super::image::node_error;
use super::{compute_type, Emit};
use crate::Result;

/// The most pixels of an image whose flat tap indices are computed in f32 (exact below 2^24).
const F32_EXACT_INDEX: usize = 1 << 24;

/// DeformConv of `x` `[N, C, H, W]`: the places of every tap (`[N, G, 1, T * P]` for the `G`
/// offset groups, `T` taps and `P` output positions) are the constant undeformed ones plus the
/// offsets; each of the four bilinear taps around a place is gathered from its offset group's
/// channels (`[N, G, C / G, H * W]`) where it lies inside the image, weighed, and summed; times
/// the mask, the columns `[N, group, C / group * T, P]` are multiplied by the weights `[group,
/// M / group, C / group * T]`, and the bias added.
pub(super) fn deform_conv(
    e: &mut Emit,
    id: NodeId,
    d: &DeformConv,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let arg = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(w), Some(offset)) = (arg(0), arg(1), arg(2)) else { return Ok(None) };
    let (bias, mask) = (arg(3), arg(4));
    let dims_of = |e: &Emit, v: Option<ValueId>| v.map(|v| e.dims(v)).transpose();
    let (bd, md) = (dims_of(e, bias)?, dims_of(e, mask)?);
    let plan = DeformPlan::new(
        d,
        &e.dims(x)?,
        &e.dims(w)?,
        &e.dims(offset)?,
        bd.as_deref(),
        md.as_deref(),
    )
    .map_err(|err| node_error(e, id, err))?;
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let [h, wd] = plan.image;
    if cd != DType::F64 && h * wd > F32_EXACT_INDEX {
        return Ok(None);
    }
    let (n, c, g) = (plan.batch, plan.channels, plan.offset_group);
    let [kh, kw] = plan.kernel;
    let [oh, ow] = plan.output;
    let (taps, positions) = (kh * kw, oh * ow);
    let tp = taps * positions;
    let cog = c / g;

    // The places: the offsets `[N, G, T, 2, P]` split into dy and dx, plus the undeformed ones.
    let off = e.cast("offset_compute", offset, cd)?;
    let off = e.reshape("offsets", off, &[n, g, taps, 2, positions])?;
    let mut places = Vec::with_capacity(2);
    for (a, what) in [(0, "y"), (1, "x")] {
        let part = e.slice(&format!("d{what}"), off, 3, a, a + 1, 1)?;
        let part = e.reshape(&format!("d{what}_flat"), part, &[n, g, 1, tp])?;
        let mut base = Vec::with_capacity(tp);
        for (ki, kj) in (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j))) {
            for (i, j) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
                base.push(if a == 0 { plan.base(0, i, ki) } else { plan.base(1, j, kj) });
            }
        }
        let base = e.constant(&format!("base_{what}"), Tensor::from_f64s(cd, &[tp], &base)?)?;
        places.push(e.add(&format!("place_{what}"), part, base)?);
    }

    // Per axis: the two tap coordinates, whether each is inside, and its linear weight.
    let one = e.scalar(1.0, cd)?;
    let zero = e.scalar(0.0, cd)?;
    let mut axes = Vec::with_capacity(2);
    for (a, what) in [(0, "y"), (1, "x")] {
        let p = places[a];
        let low = e.unary(&format!("{what}0"), UnaryOp::Floor, p)?;
        let frac = e.sub(&format!("l{what}"), p, low)?;
        let rest = e.sub(&format!("h{what}"), one, frac)?;
        let high = e.add(&format!("{what}1"), low, one)?;
        let last = e.scalar((plan.image[a] as f64) - 1.0, cd)?;
        let mut side = Vec::with_capacity(2);
        for (coord, weight, tag) in [(low, rest, "0"), (high, frac, "1")] {
            let ge = e.binary(&format!("{what}{tag}_ge"), BinaryOp::GreaterOrEqual, coord, zero)?;
            let le = e.binary(&format!("{what}{tag}_le"), BinaryOp::LessOrEqual, coord, last)?;
            let inside = e.binary(&format!("{what}{tag}_inside"), BinaryOp::And, ge, le)?;
            side.push((coord, weight, inside));
        }
        axes.push(side);
    }

    let xc = e.cast("compute", x, cd)?;
    let planes = e.reshape("planes", xc, &[n, g, cog, h * wd])?;
    let width = e.scalar(wd as f64, cd)?;
    let zero_index = e.constant("const", Tensor::scalar(0i64))?;
    let spread = e.ints(&[n as i64, g as i64, cog as i64, tp as i64])?;
    let mut sampled = None;
    for (ya, wy, iy) in axes[0].clone() {
        for &(xb, wx, ix) in &axes[1] {
            let inside = e.binary("tap_inside", BinaryOp::And, iy, ix)?;
            let row = e.mul("tap_row", ya, width)?;
            let flat = e.add("tap_flat", row, xb)?;
            let index = e.cast("tap_index", flat, DType::I64)?;
            // Taps outside read index 0 with weight 0 (their computed index may be anything).
            let index = e.select("tap_index_inside", inside, index, zero_index)?;
            let index = e.op2("tap_index_spread", Op::Expand, &[index, spread])?;
            let weight = e.mul("tap_weight", wy, wx)?;
            let weight = e.select("tap_weight_inside", inside, weight, zero)?;
            let read = e.op2("tap", Op::GatherElements { axis: 3 }, &[planes, index])?;
            let term = e.mul("tap_term", read, weight)?;
            sampled = Some(match sampled {
                None => term,
                Some(s) => e.add("sampled", s, term)?,
            });
        }
    }
    let mut sampled = sampled.expect("four taps");
    if let Some(mask) = mask {
        let mc = e.cast("mask_compute", mask, cd)?;
        let mc = e.reshape("mask_flat", mc, &[n, g, 1, tp])?;
        sampled = e.mul("masked", sampled, mc)?;
    }

    // [N, G, C / G, T * P] is [N, C, T, P] is [N, group, C / group * T, P].
    let group = plan.group;
    let (cg, mg) = (c / group, plan.out_channels / group);
    let columns = e.reshape("columns", sampled, &[n, group, cg * taps, positions])?;
    let wc = e.cast("weight_compute", w, cd)?;
    let weights = e.reshape("weights", wc, &[group, mg, cg * taps])?;
    let y = e.matmul("product", weights, columns)?;
    let mut y = e.reshape("result_planes", y, &[n, plan.out_channels, oh, ow])?;
    if let Some(b) = bias {
        let bc = e.cast("bias_compute", b, cd)?;
        let bc = e.reshape("bias_column", bc, &[plan.out_channels, 1, 1])?;
        y = e.add("biased", y, bc)?;
    }
    Ok(Some(vec![e.cast("result", y, dt)?]))
}
