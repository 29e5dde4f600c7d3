//! Reductions and scans: Reduce* here, ArgMax/ArgMin, CumSum/CumProd and TopK in `scan`. A
//! reduction is a `linalg.generic` with reduction iterators over the reduced axes; its helpers
//! (`reduce_generic`, `map_generic`) are also what the normalisations are built from.

pub(super) mod scan;

use kiln_ir::op::{Reduce, ReduceKind};
use kiln_ir::{normalize_axis, DType, NodeId, Op, ValueId};
use melior::dialect::arith::CmpfPredicate;
use melior::ir::Value;

use super::mlir::{broadcast_map, dims_list, fill, generic, push};
use super::scalar::{compute, Scalar, ScalarBuilder};
use super::Emitter;
use crate::Result;
use melior::ir::BlockLike;

/// The type reductions accumulate floats in.
pub(super) fn acc_of(d: DType) -> DType {
    match d {
        DType::F64 => DType::F64,
        d if d.is_float() => DType::F32,
        d => d,
    }
}

/// The node's operands; inference checked the required ones are there.
pub(super) fn inputs(em: &Emitter, id: NodeId) -> Vec<Option<ValueId>> {
    em.graph.operands(id)
}

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    match &em.graph.node(id).op {
        Op::Reduce(r) => emit_reduce(em, id, r),
        Op::ArgReduce(r) => scan::emit_arg_reduce(em, id, r),
        Op::Cumulative(c) => scan::emit_cumulative(em, id, c),
        Op::TopK { axis, largest, .. } => scan::emit_top_k(em, id, *axis, *largest),
        _ => Err(em.not_supported(id)),
    }
}

fn emit_reduce(em: &mut Emitter, id: NodeId, r: &Reduce) -> Result<()> {
    let o = inputs(em, id);
    reduce_op(em, id, r, o[0].expect("reductions have an input"), o.get(1).copied().flatten())
}

/// A reduction's starting value: floats as f64, integers exactly.
#[derive(Clone, Copy)]
pub(super) enum Init {
    Float(f64),
    Int(i128),
}

/// The map from a rank-`rank` loop nest to a keepdims-shaped result (reduced axes read index 0).
pub(super) fn keep_map(rank: usize, reduced: &[usize]) -> String {
    let e: Vec<String> = (0..rank)
        .map(|i| if reduced.contains(&i) { "0".into() } else { format!("d{i}") })
        .collect();
    format!("affine_map<({}) -> ({})>", dims_list(rank), e.join(", "))
}

/// Reduces `x` (dims `xd`, dtype `dt`) over `axes` into a keepdims-shaped tensor of `acc`:
/// `acc = combine(acc, pre(x))` from `init`. `extra` inputs are read with their maps.
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_generic<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    x: Value<'c, 'a>,
    xd: &[usize],
    dt: DType,
    axes: &[usize],
    acc: DType,
    init: Init,
    extra: &[(Value<'c, 'a>, String)],
    step: impl for<'b> Fn(
        &ScalarBuilder<'c, 'b>,
        Value<'c, 'b>,
        Scalar<'c, 'b>,
        &[Value<'c, 'b>],
    ) -> Result<Value<'c, 'b>>,
) -> Result<Value<'c, 'a>> {
    let rank = xd.len();
    let kd: Vec<usize> =
        xd.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let (ctx, loc) = (em.ctx, em.loc);
    let init_v = match init {
        Init::Float(v) => em.scalar_constant(v, acc)?,
        Init::Int(v) => em.int_constant(v, acc)?,
    };
    let dest = em.empty(&kd, acc)?;
    let filled = fill(ctx, loc, em.block, init_v, dest)?;
    let mut ins = vec![x];
    let mut maps = vec![broadcast_map(rank, xd, xd)];
    for (v, m) in extra {
        ins.push(*v);
        maps.push(m.clone());
    }
    maps.push(keep_map(rank, axes));
    let iters: Vec<&str> =
        (0..rank).map(|i| if axes.contains(&i) { "reduction" } else { "parallel" }).collect();
    let ty = em.tensor_type(&kd, acc)?;
    let n_extra = extra.len();
    let g = generic(ctx, loc, &ins, &[filled], &maps, &iters, &[ty], |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let v = sb.load(body.argument(0).expect("x").into(), dt)?;
        let v = sb.cast(v, acc)?;
        let ex: Vec<Value> =
            (0..n_extra).map(|i| body.argument(1 + i).expect("extra").into()).collect();
        // The accumulator is stored in its storage type (bools as bytes) and combined in its
        // compute type.
        let a = sb.load(body.argument(1 + n_extra).expect("acc").into(), acc)?;
        let r = step(&sb, a.v, v, &ex)?;
        Ok(vec![sb.store(Scalar { v: r, dtype: acc })?])
    })?;
    Ok(push(em.block, g))
}

/// An elementwise pass over `ins` (each with its map) into `dest` of `dims`/`dt`.
pub(super) fn map_generic<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    ins: &[(Value<'c, 'a>, String)],
    dims: &[usize],
    dt: DType,
    dest: Value<'c, 'a>,
    f: impl for<'b> Fn(&ScalarBuilder<'c, 'b>, &[Value<'c, 'b>]) -> Result<Value<'c, 'b>>,
) -> Result<Value<'c, 'a>> {
    let rank = dims.len();
    let vals: Vec<Value> = ins.iter().map(|(v, _)| *v).collect();
    let mut maps: Vec<String> = ins.iter().map(|(_, m)| m.clone()).collect();
    maps.push(broadcast_map(rank, dims, dims));
    let ty = em.tensor_type(dims, dt)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let n = ins.len();
    let g = generic(ctx, loc, &vals, &[dest], &maps, &vec!["parallel"; rank], &[ty], |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let args: Vec<Value> = (0..n).map(|i| body.argument(i).expect("input").into()).collect();
        Ok(vec![f(&sb, &args)?])
    })?;
    Ok(push(em.block, g))
}

fn reduce_op<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    id: NodeId,
    r: &Reduce,
    x: ValueId,
    axes_v: Option<ValueId>,
) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let axes_list = axes_v
        .map(|a| em.graph.constant_value(a).map(|t| t.to_i64s()))
        .map(|o| o.ok_or_else(|| em.unsupported(id, "needs constant axes")));
    let axes_list = axes_list.transpose()?;
    let mut axes: Vec<usize> = match axes_list {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|&a| {
                normalize_axis(a, xd.len())
                    .ok_or_else(|| em.unsupported(id, "has an axis out of range"))
            })
            .collect::<Result<_>>()?,
    };
    if axes.is_empty() && !r.noop_with_empty_axes {
        axes = (0..xd.len()).collect();
    }
    // Integers reduce exactly (wrapping) where the result is an integer function of them; the
    // mean, L2, LogSum and LogSumExp of integers are real numbers, computed in f64 and truncated
    // (saturating), as the interpreter computes them (an i8 mean of [100, 100] is 100).
    let real = matches!(
        r.kind,
        ReduceKind::Mean | ReduceKind::L2 | ReduceKind::LogSum | ReduceKind::LogSumExp
    );
    let acc = if real && dt.is_int() { DType::F64 } else { acc_of(dt) };
    let tc = compute(acc);
    let float = acc.is_float();
    let xv = em.value(x)?;
    // Bools (i1) reduce with logic: any for Max, all for Min.
    let boolean = acc == DType::Bool;
    let big = if float {
        Init::Float(f64::INFINITY)
    } else if boolean {
        Init::Int(1)
    } else {
        Init::Int(int_bound(acc, true))
    };
    let small = if float {
        Init::Float(f64::NEG_INFINITY)
    } else if boolean {
        Init::Int(0)
    } else {
        Init::Int(int_bound(acc, false))
    };
    let zero = if float { Init::Float(0.0) } else { Init::Int(0) };
    let one = if float { Init::Float(1.0) } else { Init::Int(1) };
    let signed = acc.is_signed_int();
    let (add, mul) =
        if float { ("arith.addf", "arith.mulf") } else { ("arith.addi", "arith.muli") };
    let (max, min) = if float {
        ("arith.maximumf", "arith.minimumf")
    } else if boolean {
        ("arith.ori", "arith.andi")
    } else if signed {
        ("arith.maxsi", "arith.minsi")
    } else {
        ("arith.maxui", "arith.minui")
    };
    let count: usize = axes.iter().map(|&a| xd[a]).product();
    let reduced = match r.kind {
        ReduceKind::LogSumExp => {
            let m = reduce_generic(em, xv, &xd, dt, &axes, acc, small, &[], |sb, a, v, _| {
                sb.emit(max, &[a, v.v], tc)
            })?;
            // Guard an all -inf slice: exp(-inf - -inf) is NaN; shift by 0 there instead.
            let s = reduce_generic(
                em,
                xv,
                &xd,
                dt,
                &axes,
                acc,
                zero,
                &[(m, keep_map(xd.len(), &axes))],
                |sb, a, v, ex| {
                    let shift = finite_or_zero(sb, ex[0], tc)?;
                    let d = sb.emit("arith.subf", &[v.v, shift], tc)?;
                    let e = sb.emit("math.exp", &[d], tc)?;
                    sb.emit("arith.addf", &[a, e], tc)
                },
            )?;
            let kd: Vec<usize> = xd
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            let dest = em.empty(&kd, acc)?;
            let id_map = broadcast_map(kd.len(), &kd, &kd);
            map_generic(em, &[(s, id_map.clone()), (m, id_map)], &kd, acc, dest, |sb, a| {
                let l = sb.emit("math.log", &[a[0]], tc)?;
                let shift = finite_or_zero(sb, a[1], tc)?;
                sb.emit("arith.addf", &[l, shift], tc)
            })?
        }
        kind => {
            type Step<'c> = Box<
                dyn for<'b> Fn(
                    &ScalarBuilder<'c, 'b>,
                    Value<'c, 'b>,
                    Scalar<'c, 'b>,
                ) -> Result<Value<'c, 'b>>,
            >;
            let (init, step): (Init, Step<'c>) = match kind {
                ReduceKind::Sum | ReduceKind::Mean | ReduceKind::LogSum => {
                    (zero, Box::new(|sb, a, v| sb.emit(add, &[a, v.v], tc)))
                }
                ReduceKind::Max => (small, Box::new(|sb, a, v| sb.emit(max, &[a, v.v], tc))),
                ReduceKind::Min => (big, Box::new(|sb, a, v| sb.emit(min, &[a, v.v], tc))),
                ReduceKind::Prod => (one, Box::new(|sb, a, v| sb.emit(mul, &[a, v.v], tc))),
                ReduceKind::L1 => (
                    zero,
                    Box::new(move |sb, a, v| {
                        let m = if float {
                            sb.emit("math.absf", &[v.v], tc)?
                        } else if signed {
                            sb.emit("math.absi", &[v.v], tc)?
                        } else {
                            v.v
                        };
                        sb.emit(add, &[a, m], tc)
                    }),
                ),
                ReduceKind::L2 | ReduceKind::SumSquare => (
                    zero,
                    Box::new(|sb, a, v| {
                        let sq = sb.emit(mul, &[v.v, v.v], tc)?;
                        sb.emit(add, &[a, sq], tc)
                    }),
                ),
                ReduceKind::LogSumExp => unreachable!("handled above"),
            };
            reduce_generic(em, xv, &xd, dt, &axes, acc, init, &[], |sb, a, v, _| step(sb, a, v))?
        }
    };
    // Finish (mean, sqrt, log), drop the reduced axes unless keepdims, convert to the dtype.
    let od = em.dims(result);
    let dest = em.dest(result)?;
    let kd: Vec<usize> =
        xd.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    // Read the keepdims-shaped reduction from the result's loop nest.
    let map = if od.len() == kd.len() {
        broadcast_map(od.len(), &kd, &od)
    } else {
        let mut k = 0;
        let e: Vec<String> = (0..kd.len())
            .map(|i| {
                if axes.contains(&i) {
                    "0".to_string()
                } else {
                    k += 1;
                    format!("d{}", k - 1)
                }
            })
            .collect();
        format!("affine_map<({}) -> ({})>", dims_list(od.len()), e.join(", "))
    };
    let kind = r.kind;
    let t = map_generic(em, &[(reduced, map)], &od, dt, dest, |sb, a| {
        let mut v = sb.load(a[0], acc)?.v;
        match kind {
            ReduceKind::Mean if float => {
                let n = sb.constant(count as f64, tc)?;
                v = sb.emit("arith.divf", &[v, n], tc)?;
            }
            ReduceKind::Mean => {
                let n = sb.int_constant(count.max(1) as i128, tc)?;
                v = sb.emit(if signed { "arith.divsi" } else { "arith.divui" }, &[v, n], tc)?;
            }
            ReduceKind::L2 if float => v = sb.emit("math.sqrt", &[v], tc)?,
            ReduceKind::LogSum if float => v = sb.emit("math.log", &[v], tc)?,
            _ => {}
        }
        let s = if float && dt.is_int() {
            // (+-inf and NaN, log of 0 or of a negative sum, saturate as the interpreter's do.)
            sb.saturating_int(v, dt)?
        } else {
            sb.cast(Scalar { v, dtype: acc }, dt)?
        };
        sb.store(s)
    })?;
    em.set(result, t);
    Ok(())
}

/// The smallest or largest value of an integer type (unsigned values in their bit pattern as a
/// signless constant: -1 is all ones).
fn int_bound(d: DType, largest: bool) -> i128 {
    let bits = d.size() as u32 * 8;
    match (d.is_signed_int(), largest) {
        (true, true) => (1i128 << (bits - 1)) - 1,
        (true, false) => -(1i128 << (bits - 1)),
        (false, true) => -1,
        (false, false) => 0,
    }
}

/// `v` when finite, else 0 (so an all -inf row shifts by nothing).
fn finite_or_zero<'c, 'a>(
    sb: &ScalarBuilder<'c, 'a>,
    v: Value<'c, 'a>,
    t: &str,
) -> Result<Value<'c, 'a>> {
    let inf = sb.constant(f64::INFINITY, t)?;
    let abs = sb.emit("math.absf", &[v], t)?;
    let finite = sb.cmpf(CmpfPredicate::Olt, abs, inf)?;
    let zero = sb.constant(0.0, t)?;
    sb.select(finite, v, zero, t)
}
