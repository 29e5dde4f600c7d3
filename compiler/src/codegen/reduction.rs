//! Reductions and the normalisations built on them: Reduce*, Softmax, LogSoftmax,
//! LayerNormalization, BatchNormalization. A reduction is a `linalg.generic` with reduction
//! iterators over the reduced axes; the normalisations chain a few of them with elementwise
//! steps, in f32 (f64 for f64 tensors).

use kiln_ir::op::{Reduce, ReduceKind};
use kiln_ir::{normalize_axis, DType, NodeId, ValueId};
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
fn inputs(em: &Emitter, id: NodeId) -> Vec<Option<ValueId>> {
    em.graph.operands(id)
}

pub(super) fn emit_reduce(em: &mut Emitter, id: NodeId, r: &Reduce) -> Result<()> {
    let o = inputs(em, id);
    reduce_op(em, id, r, o[0].expect("reductions have an input"), o.get(1).copied().flatten())
}

pub(super) fn emit_softmax(em: &mut Emitter, id: NodeId, axis: i64, log: bool) -> Result<()> {
    let x = inputs(em, id)[0].expect("softmax has an input");
    softmax(em, id, x, axis, log)
}

pub(super) fn emit_layer_norm(em: &mut Emitter, id: NodeId, axis: i64, epsilon: f32) -> Result<()> {
    let o = inputs(em, id);
    layer_norm(
        em,
        id,
        o[0].expect("layer norm input"),
        o[1].expect("scale"),
        o.get(2).copied().flatten(),
        axis,
        epsilon,
    )
}

pub(super) fn emit_batch_norm(em: &mut Emitter, id: NodeId, epsilon: f32) -> Result<()> {
    let o = inputs(em, id);
    batch_norm(
        em,
        id,
        o[0].expect("batchnorm input"),
        &o[1..5].iter().map(|o| o.expect("batchnorm params")).collect::<Vec<_>>(),
        epsilon,
    )
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

fn softmax(em: &mut Emitter, id: NodeId, x: ValueId, axis: i64, log: bool) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let a = normalize_axis(axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let acc = acc_of(dt);
    let tc = compute(acc);
    let xv = em.value(x)?;
    let km = keep_map(xd.len(), &[a]);
    let m = reduce_generic(
        em,
        xv,
        &xd,
        dt,
        &[a],
        acc,
        Init::Float(f64::NEG_INFINITY),
        &[],
        |sb, acc, v, _| sb.emit("arith.maximumf", &[acc, v.v], tc),
    )?;
    let s = reduce_generic(
        em,
        xv,
        &xd,
        dt,
        &[a],
        acc,
        Init::Float(0.0),
        &[(m, km.clone())],
        |sb, acc, v, ex| {
            let d = sb.emit("arith.subf", &[v.v, ex[0]], tc)?;
            let e = sb.emit("math.exp", &[d], tc)?;
            sb.emit("arith.addf", &[acc, e], tc)
        },
    )?;
    let dest = em.dest(result)?;
    let id_map = broadcast_map(xd.len(), &xd, &xd);
    let t = map_generic(em, &[(xv, id_map), (m, km.clone()), (s, km)], &xd, dt, dest, |sb, v| {
        let x = sb.load(v[0], dt)?;
        let x = sb.cast(x, acc)?;
        let d = sb.emit("arith.subf", &[x.v, v[1]], tc)?;
        let y = if log {
            let l = sb.emit("math.log", &[v[2]], tc)?;
            sb.emit("arith.subf", &[d, l], tc)?
        } else {
            let e = sb.emit("math.exp", &[d], tc)?;
            sb.emit("arith.divf", &[e, v[2]], tc)?
        };
        let y = sb.cast(Scalar { v: y, dtype: acc }, dt)?;
        sb.store(y)
    })?;
    em.set(result, t);
    Ok(())
}

fn layer_norm(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    scale: ValueId,
    bias: Option<ValueId>,
    axis: i64,
    eps: f32,
) -> Result<()> {
    let node = em.graph.node(id).clone();
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let r = xd.len();
    let a =
        normalize_axis(axis, r).ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let axes: Vec<usize> = (a..r).collect();
    let n: usize = axes.iter().map(|&i| xd[i]).product();
    let acc = acc_of(dt);
    let tc = compute(acc);
    let xv = em.value(x)?;
    let km = keep_map(r, &axes);
    let sum =
        reduce_generic(em, xv, &xd, dt, &axes, acc, Init::Float(0.0), &[], |sb, acc, v, _| {
            sb.emit("arith.addf", &[acc, v.v], tc)
        })?;
    let kd: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if i >= a { 1 } else { d }).collect();
    let kid = broadcast_map(kd.len(), &kd, &kd);
    let mean_dest =
        if node.outputs.len() > 1 { em.dest(ValueId::new(id, 1))? } else { em.empty(&kd, acc)? };
    let mean = map_generic(em, &[(sum, kid.clone())], &kd, acc, mean_dest, |sb, v| {
        let c = sb.constant(n as f64, tc)?;
        sb.emit("arith.divf", &[v[0], c], tc)
    })?;
    let var = reduce_generic(
        em,
        xv,
        &xd,
        dt,
        &axes,
        acc,
        Init::Float(0.0),
        &[(mean, km.clone())],
        |sb, acc, v, ex| {
            let d = sb.emit("arith.subf", &[v.v, ex[0]], tc)?;
            let sq = sb.emit("arith.mulf", &[d, d], tc)?;
            sb.emit("arith.addf", &[acc, sq], tc)
        },
    )?;
    let inv_dest =
        if node.outputs.len() > 2 { em.dest(ValueId::new(id, 2))? } else { em.empty(&kd, acc)? };
    let inv = map_generic(em, &[(var, kid)], &kd, acc, inv_dest, |sb, v| {
        let c = sb.constant(n as f64, tc)?;
        let var = sb.emit("arith.divf", &[v[0], c], tc)?;
        let e = sb.constant(eps as f64, tc)?;
        let s = sb.emit("arith.addf", &[var, e], tc)?;
        sb.emit("math.rsqrt", &[s], tc)
    })?;
    let dest = em.dest(result)?;
    let full = broadcast_map(r, &xd, &xd);
    let mut ins = vec![(xv, full), (mean, km.clone()), (inv, km)];
    let scale_v = em.value(scale)?;
    ins.push((scale_v, broadcast_map(r, &em.dims(scale), &xd)));
    if let Some(b) = bias {
        let bv = em.value(b)?;
        ins.push((bv, broadcast_map(r, &em.dims(b), &xd)));
    }
    let has_bias = bias.is_some();
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let x = sb.load(v[0], dt)?;
        let x = sb.cast(x, acc)?;
        let d = sb.emit("arith.subf", &[x.v, v[1]], tc)?;
        let y = sb.emit("arith.mulf", &[d, v[2]], tc)?;
        let s = sb.cast(sb.load(v[3], dt)?, acc)?;
        let mut y = sb.emit("arith.mulf", &[y, s.v], tc)?;
        if has_bias {
            let b = sb.cast(sb.load(v[4], dt)?, acc)?;
            y = sb.emit("arith.addf", &[y, b.v], tc)?;
        }
        let y = sb.cast(Scalar { v: y, dtype: acc }, dt)?;
        sb.store(y)
    })?;
    em.set(result, t);
    if node.outputs.len() > 1 {
        em.set(ValueId::new(id, 1), mean);
    }
    if node.outputs.len() > 2 {
        em.set(ValueId::new(id, 2), inv);
    }
    Ok(())
}

fn batch_norm(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    params: &[ValueId],
    eps: f32,
) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let r = xd.len();
    let acc = acc_of(dt);
    let tc = compute(acc);
    let mut ins = vec![(em.value(x)?, broadcast_map(r, &xd, &xd))];
    let channel = format!("affine_map<({}) -> (d1)>", dims_list(r));
    for &p in params {
        ins.push((em.value(p)?, channel.clone()));
    }
    let pdt: Vec<DType> = params.iter().map(|&p| em.ty(p).dtype).collect();
    let dest = em.dest(result)?;
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let p = |i: usize| -> Result<Value> { Ok(sb.cast(sb.load(v[1 + i], pdt[i])?, acc)?.v) };
        let x = sb.cast(sb.load(v[0], dt)?, acc)?.v;
        let (scale, bias, mean, var) = (p(0)?, p(1)?, p(2)?, p(3)?);
        let e = sb.constant(eps as f64, tc)?;
        let s = sb.emit("arith.addf", &[var, e], tc)?;
        let inv = sb.emit("math.rsqrt", &[s], tc)?;
        let d = sb.emit("arith.subf", &[x, mean], tc)?;
        let y = sb.emit("arith.mulf", &[d, inv], tc)?;
        let y = sb.emit("arith.mulf", &[y, scale], tc)?;
        let y = sb.emit("arith.addf", &[y, bias], tc)?;
        let y = sb.cast(Scalar { v: y, dtype: acc }, dt)?;
        sb.store(y)
    })?;
    em.set(result, t);
    Ok(())
}
