//! Pooling: the input is padded (with -inf for max, 0 otherwise), then a `linalg.generic`
//! reduces each window; a shape-only window operand gives the window loops their extent.
//! Average divisors depend only on the static geometry, so they are a constant tensor computed
//! here. Global pools reduce every spatial axis.

use kiln_ir::op::{Pool, PoolKind, SpatialAxis};
use kiln_ir::{DType, NodeId, Tensor, ValueId};
use melior::dialect::arith::CmpiPredicate;

use crate::codegen::mlir::{
    broadcast_map, dense_literal, dims_list, fill, generic, op, pad, parse_attr, push,
};
use crate::codegen::scalar::{compute, ScalarBuilder};
use crate::codegen::Emitter;
use crate::Result;
use melior::ir::BlockLike;

/// A pool: its window resolved on each spatial axis.
pub(super) fn emit_pool(em: &mut Emitter, id: NodeId, p: &Pool) -> Result<()> {
    let x = em.graph.operands(id)[0].expect("pool input");
    let xd = em.dims(x);
    let axes = (0..xd.len() - 2)
        .map(|i| p.window.resolve(i, xd[2 + i], p.kernel[i], p.ceil_mode))
        .collect::<std::result::Result<Vec<SpatialAxis>, kiln_ir::OpError>>()
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
    pool(em, id, x, p.kind, axes, p.column_major_indices)
}

/// A global pool: one window over every spatial axis.
pub(super) fn emit_global_pool(em: &mut Emitter, id: NodeId, kind: PoolKind) -> Result<()> {
    let x = em.graph.operands(id)[0].expect("pool input");
    let xd = em.dims(x);
    let axes = (0..xd.len() - 2)
        .map(|i| SpatialAxis {
            input: xd[2 + i],
            kernel: xd[2 + i],
            stride: 1,
            dilation: 1,
            pad_begin: 0,
            pad_end: 0,
            output: 1,
        })
        .collect();
    pool(em, id, x, kind, axes, false)
}

fn pool(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    kind: PoolKind,
    axes: Vec<SpatialAxis>,
    column_major: bool,
) -> Result<()> {
    // A window over nothing (a global pool of an axis of size 0) has no ONNX answer to give
    // (numpy's max of nothing raises; its mean is 0/0); the window arithmetic below assumes one
    // element. Empty results never get here (the `empty` pass writes them out).
    if axes.iter().any(|a| a.kernel == 0 || a.output == 0) {
        return Err(em.unsupported(id, "pools over an empty window (a spatial axis of size 0)"));
    }
    let node = em.graph.node(id).clone();
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dtype = em.ty(x).dtype;
    // MaxPool with its indices, or over integers: compare-and-select with the window's position.
    if kind == PoolKind::Max && (node.outputs.len() > 1 || !dtype.is_float()) {
        return max_pool_indexed(em, id, x, &axes, column_major);
    }
    if !dtype.is_float() {
        return Err(em.unsupported(id, &format!("on {dtype} is not supported natively")));
    }
    let od = em.dims(result);
    // Pad so that every window lies inside: the declared padding, plus what ceil_mode reaches.
    let mut low = vec![0i64; 2];
    let mut high = vec![0i64; 2];
    let mut padded = xd[..2].to_vec();
    for a in &axes {
        let need = (a.output - 1) * a.stride + (a.kernel - 1) * a.dilation + 1;
        let hi = need.saturating_sub(a.input + a.pad_begin);
        low.push(a.pad_begin as i64);
        high.push(hi as i64);
        padded.push(a.input + a.pad_begin + hi);
    }
    let mut xv = em.value(x)?;
    let pad_value = if kind == PoolKind::Max { f64::NEG_INFINITY } else { 0.0 };
    if low.iter().chain(&high).any(|&p| p != 0) {
        let v = em.scalar_constant(pad_value, dtype)?;
        let ty = em.tensor_type(&padded, dtype)?;
        xv = pad(em.ctx, em.loc, em.block, xv, &low, &high, v, ty)?;
    }
    let (ctx, loc) = (em.ctx, em.loc);
    let kernel: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let window = em.empty(&kernel, dtype)?;
    let WindowLoops { x_map, w_map, o_map, iters } = window_loops(&axes);
    let acc_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let init_value = em.scalar_constant(pad_value, acc_dtype)?;
    let acc_dest = em.empty(&od, acc_dtype)?;
    let acc = fill(ctx, loc, em.block, init_value, acc_dest)?;
    let acc_ty = em.tensor_type(&od, acc_dtype)?;
    let g = generic(
        ctx,
        loc,
        &[xv, window],
        &[acc],
        &[x_map, w_map, o_map],
        &iters,
        &[acc_ty],
        |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let t = compute(acc_dtype);
            let v = sb.load(body.argument(0).expect("x").into(), dtype)?;
            let a = body.argument(2).expect("acc").into();
            let r = match kind {
                PoolKind::Max => sb.emit("arith.maximumf", &[a, v.v], t)?,
                PoolKind::Average { .. } => sb.emit("arith.addf", &[a, v.v], t)?,
                PoolKind::Lp { p } => {
                    let abs = sb.emit("math.absf", &[v.v], t)?;
                    let pw = powi(&sb, abs, p, t)?;
                    sb.emit("arith.addf", &[a, pw], t)?
                }
            };
            Ok(vec![r])
        },
    )?;
    let reduced = push(em.block, g);
    // Finish: divide by the count (average), take the p-th root (Lp), convert to the dtype.
    let divisors = match kind {
        PoolKind::Average { count_include_pad } => {
            let total = axes.iter().try_fold(1usize, |t, a| t.checked_mul(a.output));
            em.check_table(id, "a table of window counts", total)?;
            Some(counts(&axes, count_include_pad))
        }
        _ => None,
    };
    let dest = em.dest(result)?;
    let rank = od.len();
    let mut ins = vec![reduced];
    let mut maps = vec![broadcast_map(rank, &od, &od)];
    if let Some(div) = &divisors {
        let t = Tensor::from_f64s(acc_dtype, &od[2..], div)
            .map_err(|e| em.unsupported(id, &e.to_string()))?;
        let ty = em.tensor_type(t.dims(), acc_dtype)?;
        let c = push(
            em.block,
            op(
                ctx,
                loc,
                "arith.constant",
                &[],
                &[ty],
                &[("value", parse_attr(ctx, &dense_literal(&t))?)],
            )?,
        );
        ins.push(c);
        maps.push(format!(
            "affine_map<({}) -> ({})>",
            dims_list(rank),
            (2..rank).map(|i| format!("d{i}")).collect::<Vec<_>>().join(", ")
        ));
    }
    maps.push(broadcast_map(rank, &od, &od));
    let out_ty = em.tensor_type(&od, dtype)?;
    let fin =
        generic(ctx, loc, &ins, &[dest], &maps, &vec!["parallel"; rank], &[out_ty], |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let t = compute(acc_dtype);
            let mut v = body.argument(0).expect("acc").into();
            if divisors.is_some() {
                let d = body.argument(1).expect("divisor").into();
                v = sb.emit("arith.divf", &[v, d], t)?;
            }
            if let PoolKind::Lp { p } = kind {
                let inv = sb.constant(1.0 / p as f64, t)?;
                v = sb.emit("math.powf", &[v, inv], t)?;
            }
            let s = sb.cast(crate::codegen::scalar::Scalar { v, dtype: acc_dtype }, dtype)?;
            Ok(vec![sb.store(s)?])
        })?;
    let r = push(em.block, fin);
    em.set(result, r);
    Ok(())
}

/// `x^p` for a small integer p by multiplication.
fn powi<'c, 'a>(
    sb: &ScalarBuilder<'c, 'a>,
    x: melior::ir::Value<'c, 'a>,
    p: u32,
    t: &str,
) -> Result<melior::ir::Value<'c, 'a>> {
    let mut v = x;
    for _ in 1..p.max(1) {
        v = sb.emit("arith.mulf", &[v, x], t)?;
    }
    Ok(v)
}

/// For each output position, how many cells its window counts: those in the input, plus the
/// declared padding when `count_include_pad` (never the extra ceil_mode cells).
/// A pooling's loops (n, c, o..., k...) and the maps of its input, window and output.
struct WindowLoops {
    x_map: String,
    w_map: String,
    o_map: String,
    iters: Vec<&'static str>,
}

fn window_loops(axes: &[SpatialAxis]) -> WindowLoops {
    let spatial = axes.len();
    let all = dims_list(2 + 2 * spatial);
    let x_idx: Vec<String> = ["d0".into(), "d1".into()]
        .into_iter()
        .chain(axes.iter().enumerate().map(|(i, a)| {
            format!("d{} * {} + d{} * {}", 2 + i, a.stride, 2 + spatial + i, a.dilation)
        }))
        .collect();
    let w_idx: Vec<String> = (0..spatial).map(|i| format!("d{}", 2 + spatial + i)).collect();
    let o_idx: Vec<String> = (0..2 + spatial).map(|i| format!("d{i}")).collect();
    let map = |v: &[String]| format!("affine_map<({all}) -> ({})>", v.join(", "));
    let mut iters = vec!["parallel"; 2 + spatial];
    iters.extend(vec!["reduction"; spatial]);
    WindowLoops { x_map: map(&x_idx), w_map: map(&w_idx), o_map: map(&o_idx), iters }
}

fn counts(axes: &[SpatialAxis], include_pad: bool) -> Vec<f64> {
    let per_axis: Vec<Vec<usize>> = axes
        .iter()
        .map(|a| {
            (0..a.output)
                .map(|o| {
                    (0..a.kernel)
                        .filter(|&k| {
                            let p = (o * a.stride + k * a.dilation) as i64 - a.pad_begin as i64;
                            if include_pad {
                                p >= -(a.pad_begin as i64) && p < (a.input + a.pad_end) as i64
                            } else {
                                p >= 0 && p < a.input as i64
                            }
                        })
                        .count()
                })
                .collect()
        })
        .collect();
    let total: usize = axes.iter().map(|a| a.output).product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; axes.len()];
    for _ in 0..total {
        out.push(
            idx.iter().enumerate().map(|(d, &i)| per_axis[d][i]).product::<usize>().max(1) as f64
        );
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < axes[d].output {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// MaxPool as a compare-and-select over each window, for integer inputs and for the indices
/// result: the first in-range cell of a window is taken, then a cell replaces the maximum only
/// when strictly larger (or NaN over a number), as the interpreter does. Indices are flat over
/// the whole input (`(n * C + c) * image + offset`), the offset row-major or column-major.
fn max_pool_indexed(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    axes: &[SpatialAxis],
    column_major: bool,
) -> Result<()> {
    let node = em.graph.node(id).clone();
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dtype = em.ty(x).dtype;
    let od = em.dims(result);
    let spatial = axes.len();
    let (ctx, loc) = (em.ctx, em.loc);
    // Pad so that every window lies inside (padded cells are never taken, so any value will do).
    let mut low = vec![0i64; 2];
    let mut high = vec![0i64; 2];
    let mut padded = xd[..2].to_vec();
    for a in axes {
        let need = (a.output - 1) * a.stride + (a.kernel - 1) * a.dilation + 1;
        let hi = need.saturating_sub(a.input + a.pad_begin);
        low.push(a.pad_begin as i64);
        high.push(hi as i64);
        padded.push(a.input + a.pad_begin + hi);
    }
    let mut xv = em.value(x)?;
    if low.iter().chain(&high).any(|&p| p != 0) {
        let v = em.scalar_constant(0.0, dtype)?;
        let ty = em.tensor_type(&padded, dtype)?;
        xv = pad(ctx, loc, em.block, xv, &low, &high, v, ty)?;
    }
    let kernel: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let window = em.empty(&kernel, dtype)?;
    let WindowLoops { x_map, w_map, o_map, iters } = window_loops(axes);
    // The maximum (its fill is never read: index -1 means "nothing taken yet") and its index.
    let vdest = em.dest(result)?;
    let zero = em.scalar_constant(0.0, dtype)?;
    let vdest = fill(ctx, loc, em.block, zero, vdest)?;
    let want_indices = node.outputs.len() > 1;
    let indices = ValueId::new(id, 1);
    let idest = if want_indices { em.dest(indices)? } else { em.empty(&od, DType::I64)? };
    let minus = em.int_constant(-1, DType::I64)?;
    let idest = fill(ctx, loc, em.block, minus, idest)?;
    let types = [em.tensor_type(&od, dtype)?, em.tensor_type(&od, DType::I64)?];
    let channels = xd[1] as i128;
    let image: usize = axes.iter().map(|a| a.input).product();
    // Each spatial axis's weight in the flat offset within an image.
    let weights: Vec<usize> = (0..spatial)
        .map(|d| {
            if column_major {
                axes[..d].iter().map(|a| a.input).product()
            } else {
                axes[d + 1..].iter().map(|a| a.input).product()
            }
        })
        .collect();
    let axes = axes.to_vec();
    let g = generic(
        ctx,
        loc,
        &[xv, window],
        &[vdest, idest],
        &[x_map, w_map, o_map.clone(), o_map],
        &iters,
        &types,
        |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let v = sb.load(body.argument(0).expect("x").into(), dtype)?;
            let m = sb.load(body.argument(2).expect("max").into(), dtype)?;
            let i = body.argument(3).expect("index").into();
            let c = |n: i128| sb.int_constant(n, "i64");
            let mut inside = sb.constant(1.0, "i1")?;
            let mut offset = c(0)?;
            for (d, a) in axes.iter().enumerate() {
                // The input position this cell reads: o * stride + k * dilation - pad_begin.
                let o = sb.loop_index(2 + d, "i64")?;
                let k = sb.loop_index(2 + spatial + d, "i64")?;
                let o = sb.emit("arith.muli", &[o, c(a.stride as i128)?], "i64")?;
                let k = sb.emit("arith.muli", &[k, c(a.dilation as i128)?], "i64")?;
                let p = sb.emit("arith.addi", &[o, k], "i64")?;
                let p = sb.emit("arith.subi", &[p, c(a.pad_begin as i128)?], "i64")?;
                let ge = sb.cmpi(CmpiPredicate::Sge, p, c(0)?)?;
                let lt = sb.cmpi(CmpiPredicate::Slt, p, c(a.input as i128)?)?;
                inside = sb.emit("arith.andi", &[inside, ge], "i1")?;
                inside = sb.emit("arith.andi", &[inside, lt], "i1")?;
                let w = sb.emit("arith.muli", &[p, c(weights[d] as i128)?], "i64")?;
                offset = sb.emit("arith.addi", &[offset, w], "i64")?;
            }
            let first = sb.cmpi(CmpiPredicate::Eq, i, c(-1)?)?;
            let (better, _) =
                crate::codegen::reduce::scan::compare(&sb, v.v, m.v, dtype, true, true)?;
            let take = sb.emit("arith.ori", &[first, better], "i1")?;
            let take = sb.emit("arith.andi", &[take, inside], "i1")?;
            let n = sb.loop_index(0, "i64")?;
            let ch = sb.loop_index(1, "i64")?;
            let plane = sb.emit("arith.muli", &[n, c(channels)?], "i64")?;
            let plane = sb.emit("arith.addi", &[plane, ch], "i64")?;
            let base = sb.emit("arith.muli", &[plane, c(image as i128)?], "i64")?;
            let flat = sb.emit("arith.addi", &[base, offset], "i64")?;
            let nv = sb.select(take, v.v, m.v, compute(dtype))?;
            let ni = sb.select(take, flat, i, "i64")?;
            Ok(vec![sb.store(crate::codegen::scalar::Scalar { v: nv, dtype })?, ni])
        },
    )?;
    let out = crate::codegen::reduce::scan::push_all(em.block, g);
    em.set(result, out[0]);
    if want_indices {
        em.set(indices, out[1]);
    }
    Ok(())
}
