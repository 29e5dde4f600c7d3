//! Scans and selections: ArgMax/ArgMin, CumSum/CumProd, TopK, all as `linalg.generic`s (so they
//! tile into workgroups like anything else):
//! - ArgMax/ArgMin reduce the axis into two accumulators (best value, its index), the index
//!   written straight into the result.
//! - CumSum/CumProd loop over (result position, source position) and add in the sources the
//!   result position covers: quadratic along the axis, but parallel and exact (integers wrap
//!   as the element type does; floats accumulate in f64, as the interpreter does).
//! - TopK ranks every element (how many elements come before it in the requested order, ties
//!   by index) and then picks, for each result slot r < k, the element of rank r.

use kiln_ir::op::{ArgReduce, Cumulative};
use kiln_ir::{normalize_axis, DType, NodeId, Op, ValueId};
use melior::ir::operation::OperationLike;
use melior::ir::{Block, BlockLike, Value};

use super::mlir::{dims_list, fill, generic, storage_type};
use super::scalar::{compute, Scalar, ScalarBuilder};
use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let node = em.graph.node(id).clone();
    let operands = em.graph.operands(id);
    let x = operands[0].ok_or_else(|| em.unsupported(id, "has no input"))?;
    match &node.op {
        Op::ArgReduce(r) => arg_reduce(em, id, r, x),
        Op::Cumulative(c) => cumulative(em, id, c, x, operands.get(1).copied().flatten()),
        Op::TopK { axis, largest, .. } => top_k(em, id, x, *axis, *largest),
        _ => unreachable!("dispatched by op"),
    }
}

/// Appends a multi-result op and returns its results.
pub(super) fn push_all<'c, 'a>(block: &'a Block<'c>, op: melior::ir::Operation<'c>) -> Vec<Value<'c, 'a>> {
    let r = block.append_operation(op);
    (0..r.result_count()).map(|i| r.result(i).expect("counted").into()).collect()
}

/// `affine_map<(d0..d{n-1}) -> (exprs)>`.
pub(super) fn affine(n: usize, exprs: &[String]) -> String {
    format!("affine_map<({}) -> ({})>", dims_list(n), exprs.join(", "))
}

/// The loop indices `d0..d{n-1}` as expressions, loop `axis` replaced by `with`.
pub(super) fn loops_with(n: usize, axis: usize, with: &str) -> Vec<String> {
    (0..n).map(|i| if i == axis { with.to_string() } else { format!("d{i}") }).collect()
}

/// Compares `a` with `b` (compute values of `dt`): whether `a` comes strictly first in the order
/// (`greater`: descending, else ascending), and whether the two are equal. Floats order NaN above
/// everything when `nan_high` (numpy's sort order), below everything otherwise; NaNs are equal to
/// each other.
pub(super) fn compare<'c, 'a>(
    sb: &ScalarBuilder<'c, 'a>,
    a: Value<'c, 'a>,
    b: Value<'c, 'a>,
    dt: DType,
    greater: bool,
    nan_high: bool,
) -> Result<(Value<'c, 'a>, Value<'c, 'a>)> {
    if !dt.is_float() {
        let signed = dt.is_signed_int();
        let pred = match (greater, signed) {
            (true, true) => "sgt",
            (true, false) => "ugt",
            (false, true) => "slt",
            (false, false) => "ult",
        };
        return Ok((sb.cmpi(pred, a, b)?, sb.cmpi("eq", a, b)?));
    }
    let ord = sb.cmpf(if greater { "ogt" } else { "olt" }, a, b)?;
    let an = sb.cmpf("uno", a, a)?;
    let bn = sb.cmpf("uno", b, b)?;
    let t = sb.constant(1.0, "i1")?;
    // A NaN comes first exactly when it sits at the end of the order we walk from.
    let (nan, other) = if greater == nan_high { (an, bn) } else { (bn, an) };
    let other_not = sb.emit("arith.xori", &[other, t], "i1")?;
    let nan_first = sb.emit("arith.andi", &[nan, other_not], "i1")?;
    let strict = sb.emit("arith.ori", &[ord, nan_first], "i1")?;
    let oeq = sb.cmpf("oeq", a, b)?;
    let both = sb.emit("arith.andi", &[an, bn], "i1")?;
    let equal = sb.emit("arith.ori", &[oeq, both], "i1")?;
    Ok((strict, equal))
}

/// Reduces axis `a` of `x` (dims `xd`) to the position of its best element, as i64, into `idx_dest`
/// written through `idx_map`: ArgMax (`max`) or ArgMin, NaN counting as the best either way
/// (numpy), ties to the first index unless `last`. The loops are x's dims, the reduced one last
/// when `axis_last` (so that, with the axis dropped, the parallel loops are the result's dims, as
/// the workgroup split expects). Returns the index tensor.
#[allow(clippy::too_many_arguments)]
pub(super) fn arg_best<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    x: Value<'c, 'a>,
    xd: &[usize],
    dt: DType,
    a: usize,
    axis_last: bool,
    max: bool,
    last: bool,
    idx_dest: Value<'c, 'a>,
    idx_map: String,
    idx_dims: &[usize],
) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let rank = xd.len();
    let kd: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if i == a { 1 } else { d }).collect();
    let axis_loop = if axis_last { rank - 1 } else { a };
    let loop_of = |i: usize| {
        if i == a {
            axis_loop
        } else if axis_last && i > a {
            i - 1
        } else {
            i
        }
    };
    let x_map: Vec<String> = (0..rank).map(|i| format!("d{}", loop_of(i))).collect();
    let val_map: Vec<String> = (0..rank).map(|i| if i == a { "0".into() } else { format!("d{}", loop_of(i)) }).collect();
    // The best value so far; the index -1 marks "nothing seen yet", so the fill value is unused.
    let zero = em.scalar_constant(0.0, dt)?;
    let val = em.empty(&kd, dt)?;
    let val = fill(ctx, loc, em.block, zero, val)?;
    let minus = em.int_constant(-1, DType::I64)?;
    let idx = fill(ctx, loc, em.block, minus, idx_dest)?;
    let maps = vec![affine(rank, &x_map), affine(rank, &val_map), idx_map];
    let iters: Vec<&str> = (0..rank).map(|i| if i == axis_loop { "reduction" } else { "parallel" }).collect();
    let types = [em.tensor_type(&kd, dt)?, em.tensor_type(idx_dims, DType::I64)?];
    let g = generic(ctx, loc, &[x], &[val, idx], &maps, &iters, &types, |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let v = sb.load(body.argument(0).expect("x").into(), dt)?;
        let b = sb.load(body.argument(1).expect("best").into(), dt)?;
        let i = body.argument(2).expect("index").into();
        let j = sb.loop_index(axis_loop, "i64")?;
        let none = sb.int_constant(-1, "i64")?;
        let first = sb.cmpi("eq", i, none)?;
        let (better, equal) = compare(&sb, v.v, b.v, dt, max, max)?;
        let mut take = sb.emit("arith.ori", &[first, better], "i1")?;
        if last {
            take = sb.emit("arith.ori", &[take, equal], "i1")?;
        }
        let nv = sb.select(take, v.v, b.v, compute(dt))?;
        let ni = sb.select(take, j, i, "i64")?;
        Ok(vec![sb.store(Scalar { v: nv, dtype: dt })?, ni])
    })?;
    Ok(push_all(em.block, g)[1])
}

fn arg_reduce(em: &mut Emitter, id: NodeId, r: &ArgReduce, x: ValueId) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let a = normalize_axis(r.axis, xd.len()).ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let od = em.dims(result);
    // The result keeps the axis as 0 (keepdims), or drops it (the axis loop then comes last).
    let out: Vec<String> = if r.keepdims { loops_with(rank, a, "0") } else { (0..rank - 1).map(|i| format!("d{i}")).collect() };
    let xv = em.value(x)?;
    let dest = em.dest(result)?;
    let t = arg_best(em, xv, &xd, dt, a, !r.keepdims, r.max, r.select_last_index, dest, affine(rank, &out), &od)?;
    em.set(result, t);
    Ok(())
}

fn cumulative(em: &mut Emitter, id: NodeId, c: &Cumulative, x: ValueId, axis: Option<ValueId>) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let axis = axis
        .and_then(|v| em.graph.constant_value(v))
        .and_then(|t| t.to_i64s().first().copied())
        .ok_or_else(|| em.unsupported(id, "needs a constant axis"))?;
    let a = normalize_axis(axis, xd.len()).ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let (ctx, loc) = (em.ctx, em.loc);
    let acc = if dt.is_float() { DType::F64 } else { dt };
    let tc = compute(acc);
    let float = acc.is_float();
    let init = match (c.prod, float) {
        (false, true) => em.scalar_constant(0.0, acc)?,
        (true, true) => em.scalar_constant(1.0, acc)?,
        (false, false) => em.int_constant(0, acc)?,
        (true, false) => em.int_constant(1, acc)?,
    };
    let dest = if acc == dt { em.dest(result)? } else { em.empty(&xd, acc)? };
    let filled = fill(ctx, loc, em.block, init, dest)?;
    let xv = em.value(x)?;
    // Loops: the result position d0..d{rank-1}, then the source position d{rank} along the axis.
    let n = rank + 1;
    let maps = vec![affine(n, &loops_with(rank, a, &format!("d{rank}"))), affine(n, &loops_with(rank, rank, ""))];
    let mut iters = vec!["parallel"; rank];
    iters.push("reduction");
    // Which source positions j a result position i covers.
    let pred = match (c.reverse, c.exclusive) {
        (false, false) => "ule",
        (false, true) => "ult",
        (true, false) => "uge",
        (true, true) => "ugt",
    };
    let op_name = match (c.prod, float) {
        (false, true) => "arith.addf",
        (true, true) => "arith.mulf",
        (false, false) => "arith.addi",
        (true, false) => "arith.muli",
    };
    let ty = em.tensor_type(&xd, acc)?;
    let g = generic(ctx, loc, &[xv], &[filled], &maps, &iters, &[ty], |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let v = sb.cast(sb.load(body.argument(0).expect("x").into(), dt)?, acc)?;
        let s = sb.load(body.argument(1).expect("acc").into(), acc)?;
        let i = sb.loop_index(a, "index")?;
        let j = sb.loop_index(rank, "index")?;
        let covered = sb.cmpi(pred, j, i)?;
        let next = sb.emit(op_name, &[s.v, v.v], tc)?;
        let r = sb.select(covered, next, s.v, tc)?;
        Ok(vec![sb.store(Scalar { v: r, dtype: acc })?])
    })?;
    let mut t = super::mlir::push(em.block, g);
    if acc != dt {
        let dest = em.dest(result)?;
        let id_map = affine(rank, &loops_with(rank, rank, ""));
        let ty = em.tensor_type(&xd, dt)?;
        let g = generic(ctx, loc, &[t], &[dest], &[id_map.clone(), id_map], &vec!["parallel"; rank], &[ty], |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let v = sb.load(body.argument(0).expect("acc").into(), acc)?;
            Ok(vec![sb.store(sb.cast(v, dt)?)?])
        })?;
        t = super::mlir::push(em.block, g);
    }
    em.set(result, t);
    Ok(())
}

fn top_k(em: &mut Emitter, id: NodeId, x: ValueId, axis: i64, largest: bool) -> Result<()> {
    let (values, indices) = (ValueId::new(id, 0), ValueId::new(id, 1));
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let a = normalize_axis(axis, xd.len()).ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let od = em.dims(values);
    let (ctx, loc) = (em.ctx, em.loc);
    let xv = em.value(x)?;
    // rank[j] = how many l come before j: l's value first in the order, or equal and l < j.
    let n = rank + 1;
    let zero = em.int_constant(0, DType::I64)?;
    let ranks = em.empty(&xd, DType::I64)?;
    let ranks = fill(ctx, loc, em.block, zero, ranks)?;
    let own = affine(n, &loops_with(rank, rank, ""));
    let other = affine(n, &loops_with(rank, a, &format!("d{rank}")));
    let mut iters = vec!["parallel"; rank];
    iters.push("reduction");
    let ty = em.tensor_type(&xd, DType::I64)?;
    let g = generic(ctx, loc, &[xv, xv], &[ranks], &[own.clone(), other, own.clone()], &iters, &[ty], |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let xj = sb.load(body.argument(0).expect("x_j").into(), dt)?;
        let xl = sb.load(body.argument(1).expect("x_l").into(), dt)?;
        let count = body.argument(2).expect("rank").into();
        let j = sb.loop_index(a, "index")?;
        let l = sb.loop_index(rank, "index")?;
        let (first, equal) = compare(&sb, xl.v, xj.v, dt, largest, true)?;
        let lower = sb.cmpi("ult", l, j)?;
        let tie = sb.emit("arith.andi", &[equal, lower], "i1")?;
        let before = sb.emit("arith.ori", &[first, tie], "i1")?;
        let one = sb.emit("arith.extui", &[before], "i64")?;
        Ok(vec![sb.emit("arith.addi", &[count, one], "i64")?])
    })?;
    let ranks = super::mlir::push(em.block, g);
    // Result slot r (loop a, extent k) takes the element j (loop `rank`) of rank r.
    let vdest = em.dest(values)?;
    let idest = em.dest(indices)?;
    let zv = em.scalar_constant(0.0, dt)?;
    let vdest = fill(ctx, loc, em.block, zv, vdest)?;
    let idest = fill(ctx, loc, em.block, zero, idest)?;
    let src = affine(n, &loops_with(rank, a, &format!("d{rank}")));
    let types = [em.tensor_type(&od, dt)?, em.tensor_type(&od, DType::I64)?];
    let vt = storage_type(dt);
    let g = generic(ctx, loc, &[xv, ranks], &[vdest, idest], &[src.clone(), src, own.clone(), own], &iters, &types, |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let xj: Value = body.argument(0).expect("x").into();
        let rj = body.argument(1).expect("rank").into();
        let v = body.argument(2).expect("value").into();
        let i = body.argument(3).expect("index").into();
        let r = sb.loop_index(a, "i64")?;
        let j = sb.loop_index(rank, "i64")?;
        let hit = sb.cmpi("eq", rj, r)?;
        Ok(vec![sb.select(hit, xj, v, vt)?, sb.select(hit, j, i, "i64")?])
    })?;
    let out = push_all(em.block, g);
    em.set(values, out[0]);
    em.set(indices, out[1]);
    Ok(())
}
