//! Scans and selections: ArgMax/ArgMin, CumSum/CumProd, TopK.
//! - ArgMax/ArgMin reduce the axis into two accumulators (best value, its index), the index
//!   written straight into the result.
//! - CumSum/CumProd over a short axis loop over (result position, source position) and add in
//!   the sources each result position covers: quadratic along the axis, but parallel and
//!   tileable; a long axis is a sequential `scf.for` carrying the running value of every line.
//!   Integers wrap as the element type does; floats accumulate in f64, as the interpreter does.
//! - TopK takes k selection steps (an `scf.for`), each picking in every line the first element
//!   after the previous pick in the requested order (NaN above everything, ties by index).

use kiln_ir::op::{ArgReduce, Cumulative};
use kiln_ir::{normalize_axis, DType, NodeId, ValueId};
use melior::dialect::arith::{CmpfPredicate, CmpiPredicate};
use melior::ir::operation::OperationLike;
use melior::ir::{Block, BlockLike, Value};

use crate::codegen::mlir::{dims_list, fill, generic, op, push};
use crate::codegen::scalar::{compute, Scalar, ScalarBuilder};
use crate::codegen::Emitter;
use crate::Result;

/// The scanned operand (and operand 1, an axis or `k`, when given).
fn operands(em: &Emitter, id: NodeId) -> Result<(ValueId, Option<ValueId>)> {
    let operands = em.graph.operands(id);
    let x = operands[0].ok_or_else(|| em.unsupported(id, "has no input"))?;
    Ok((x, operands.get(1).copied().flatten()))
}

pub(super) fn emit_arg_reduce(em: &mut Emitter, id: NodeId, r: &ArgReduce) -> Result<()> {
    let (x, _) = operands(em, id)?;
    arg_reduce(em, id, r, x)
}

pub(super) fn emit_cumulative(em: &mut Emitter, id: NodeId, c: &Cumulative) -> Result<()> {
    let (x, axis) = operands(em, id)?;
    cumulative(em, id, c, x, axis)
}

pub(super) fn emit_top_k(em: &mut Emitter, id: NodeId, axis: i64, largest: bool) -> Result<()> {
    let (x, _) = operands(em, id)?;
    top_k(em, id, x, axis, largest)
}

/// Appends a multi-result op and returns its results.
pub(in crate::codegen) fn push_all<'c, 'a>(
    block: &'a Block<'c>,
    op: melior::ir::Operation<'c>,
) -> Vec<Value<'c, 'a>> {
    let r = block.append_operation(op);
    (0..r.result_count()).map(|i| r.result(i).expect("counted").into()).collect()
}

/// `affine_map<(d0..d{n-1}) -> (exprs)>`.
pub(in crate::codegen) fn affine(n: usize, exprs: &[String]) -> String {
    format!("affine_map<({}) -> ({})>", dims_list(n), exprs.join(", "))
}

/// The loop indices `d0..d{n-1}` as expressions, loop `axis` replaced by `with`.
pub(in crate::codegen) fn loops_with(n: usize, axis: usize, with: &str) -> Vec<String> {
    (0..n).map(|i| if i == axis { with.to_string() } else { format!("d{i}") }).collect()
}

/// Compares `a` with `b` (compute values of `dt`): whether `a` comes strictly first in the order
/// (`greater`: descending, else ascending), and whether the two are equal. Floats order NaN above
/// everything when `nan_high` (numpy's sort order), below everything otherwise; NaNs are equal to
/// each other.
pub(in crate::codegen) fn compare<'c, 'a>(
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
            (true, true) => CmpiPredicate::Sgt,
            (true, false) => CmpiPredicate::Ugt,
            (false, true) => CmpiPredicate::Slt,
            (false, false) => CmpiPredicate::Ult,
        };
        return Ok((sb.cmpi(pred, a, b)?, sb.cmpi(CmpiPredicate::Eq, a, b)?));
    }
    let ord = sb.cmpf(if greater { CmpfPredicate::Ogt } else { CmpfPredicate::Olt }, a, b)?;
    let an = sb.cmpf(CmpfPredicate::Uno, a, a)?;
    let bn = sb.cmpf(CmpfPredicate::Uno, b, b)?;
    let t = sb.constant(1.0, "i1")?;
    // A NaN comes first exactly when it sits at the end of the order we walk from.
    let (nan, other) = if greater == nan_high { (an, bn) } else { (bn, an) };
    let other_not = sb.emit("arith.xori", &[other, t], "i1")?;
    let nan_first = sb.emit("arith.andi", &[nan, other_not], "i1")?;
    let strict = sb.emit("arith.ori", &[ord, nan_first], "i1")?;
    let oeq = sb.cmpf(CmpfPredicate::Oeq, a, b)?;
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
pub(in crate::codegen) fn arg_best<'c, 'a>(
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
    let val_map: Vec<String> =
        (0..rank).map(|i| if i == a { "0".into() } else { format!("d{}", loop_of(i)) }).collect();
    // The best value so far; the index -1 marks "nothing seen yet", so the fill value is unused.
    let zero = em.scalar_constant(0.0, dt)?;
    let val = em.empty(&kd, dt)?;
    let val = fill(ctx, loc, em.block, zero, val)?;
    let minus = em.int_constant(-1, DType::I64)?;
    let idx = fill(ctx, loc, em.block, minus, idx_dest)?;
    let maps = vec![affine(rank, &x_map), affine(rank, &val_map), idx_map];
    let iters: Vec<&str> =
        (0..rank).map(|i| if i == axis_loop { "reduction" } else { "parallel" }).collect();
    let types = [em.tensor_type(&kd, dt)?, em.tensor_type(idx_dims, DType::I64)?];
    let g = generic(ctx, loc, &[x], &[val, idx], &maps, &iters, &types, |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let v = sb.load(body.argument(0).expect("x").into(), dt)?;
        let b = sb.load(body.argument(1).expect("best").into(), dt)?;
        let i = body.argument(2).expect("index").into();
        let j = sb.loop_index(axis_loop, "i64")?;
        let none = sb.int_constant(-1, "i64")?;
        let first = sb.cmpi(CmpiPredicate::Eq, i, none)?;
        let (better, equal) = compare(&sb, v.v, b.v, dt, max, max)?;
        let take = sb.emit("arith.ori", &[first, better], "i1")?;
        // Ties go to the lower (or, `last`, the higher) index, whatever order the loop runs in.
        let side = sb.cmpi(if last { CmpiPredicate::Sgt } else { CmpiPredicate::Slt }, j, i)?;
        let tie = sb.emit("arith.andi", &[equal, side], "i1")?;
        let take = sb.emit("arith.ori", &[take, tie], "i1")?;
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
    let a = normalize_axis(r.axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let od = em.dims(result);
    // The result keeps the axis as 0 (keepdims), or drops it (the axis loop then comes last).
    let out: Vec<String> = if r.keepdims {
        loops_with(rank, a, "0")
    } else {
        (0..rank - 1).map(|i| format!("d{i}")).collect()
    };
    let xv = em.value(x)?;
    let dest = em.dest(result)?;
    let t = arg_best(
        em,
        xv,
        &xd,
        dt,
        a,
        !r.keepdims,
        r.max,
        r.select_last_index,
        dest,
        affine(rank, &out),
        &od,
    )?;
    em.set(result, t);
    Ok(())
}

fn cumulative(
    em: &mut Emitter,
    id: NodeId,
    c: &Cumulative,
    x: ValueId,
    axis: Option<ValueId>,
) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let axis = axis
        .and_then(|v| em.graph.constant_value(v))
        .and_then(|t| t.to_i64s().first().copied())
        .ok_or_else(|| em.unsupported(id, "needs a constant axis"))?;
    let a = normalize_axis(axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let (ctx, loc) = (em.ctx, em.loc);
    let acc = if dt.is_float() { DType::F64 } else { dt };
    let float = acc.is_float();
    let init = match (c.prod, float) {
        (false, true) => em.scalar_constant(0.0, acc)?,
        (true, true) => em.scalar_constant(1.0, acc)?,
        (false, false) => em.int_constant(0, acc)?,
        (true, false) => em.int_constant(1, acc)?,
    };
    let op_name = match (c.prod, float) {
        (false, true) => "arith.addf",
        (true, true) => "arith.mulf",
        (false, false) => "arith.addi",
        (true, false) => "arith.muli",
    };
    let dest = if acc == dt { em.dest(result)? } else { em.empty(&xd, acc)? };
    let xv = em.value(x)?;
    let mut t = if xd[a] <= TRIANGULAR_SCAN {
        triangular_scan(em, c, xv, &xd, a, dt, acc, op_name, init, dest)?
    } else {
        sequential_scan(em, c, xv, &xd, a, dt, acc, op_name, init, dest)?
    };
    if acc != dt {
        let dest = em.dest(result)?;
        let id_map = affine(rank, &loops_with(rank, rank, ""));
        let ty = em.tensor_type(&xd, dt)?;
        let g = generic(
            ctx,
            loc,
            &[t],
            &[dest],
            &[id_map.clone(), id_map],
            &vec!["parallel"; rank],
            &[ty],
            |body| {
                let sb = ScalarBuilder { ctx, loc, block: body };
                let v = sb.load(body.argument(0).expect("acc").into(), acc)?;
                Ok(vec![sb.store(sb.cast(v, dt)?)?])
            },
        )?;
        t = push(em.block, g);
    }
    em.set(result, t);
    Ok(())
}

/// Axes up to this long scan as one parallel generic (quadratic work); longer ones loop.
const TRIANGULAR_SCAN: usize = 64;

/// The running sum/product as one `linalg.generic` over (result position, source position): each
/// result adds in the sources it covers. Parallel and tileable, but quadratic along the axis.
#[allow(clippy::too_many_arguments)]
fn triangular_scan<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    c: &Cumulative,
    xv: Value<'c, 'a>,
    xd: &[usize],
    a: usize,
    dt: DType,
    acc: DType,
    op_name: &str,
    init: Value<'c, 'a>,
    dest: Value<'c, 'a>,
) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let rank = xd.len();
    let tc = compute(acc);
    let filled = fill(ctx, loc, em.block, init, dest)?;
    // Loops: the result position d0..d{rank-1}, then the source position d{rank} along the axis.
    let n = rank + 1;
    let maps = vec![
        affine(n, &loops_with(rank, a, &format!("d{rank}"))),
        affine(n, &loops_with(rank, rank, "")),
    ];
    let mut iters = vec!["parallel"; rank];
    iters.push("reduction");
    // Which source positions j a result position i covers.
    let pred = match (c.reverse, c.exclusive) {
        (false, false) => CmpiPredicate::Ule,
        (false, true) => CmpiPredicate::Ult,
        (true, false) => CmpiPredicate::Uge,
        (true, true) => CmpiPredicate::Ugt,
    };
    let ty = em.tensor_type(xd, acc)?;
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
    Ok(push(em.block, g))
}

/// The running sum/product as an `scf.for` along the axis carrying the running value of every
/// line (a slice of x's shape with the axis 1): each step combines one slice of x into it and
/// writes it (or, exclusive, the value before) into that position of the result.
#[allow(clippy::too_many_arguments)]
fn sequential_scan<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    c: &Cumulative,
    xv: Value<'c, 'a>,
    xd: &[usize],
    a: usize,
    dt: DType,
    acc: DType,
    op_name: &str,
    init: Value<'c, 'a>,
    dest: Value<'c, 'a>,
) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let rank = xd.len();
    let n = xd[a];
    let tc = compute(acc);
    let kd: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if i == a { 1 } else { d }).collect();
    let start = em.empty(&kd, acc)?;
    let start = fill(ctx, loc, em.block, init, start)?;
    let last = em.int_constant(n as i128 - 1, DType::I64)?;
    let last = push(
        em.block,
        op(ctx, loc, "arith.index_cast", &[last], &[melior::ir::Type::index(ctx)], &[])?,
    );
    let id_map = affine(rank, &loops_with(rank, rank, ""));
    let kty = em.tensor_type(&kd, acc)?;
    let xty = em.tensor_type(&kd, dt)?;
    let oty = em.tensor_type(xd, acc)?;
    let (reverse, exclusive) = (c.reverse, c.exclusive);
    let op_name = op_name.to_string();
    let r = scf_for(em, n, &[start, dest], |block, step, carried| {
        let j = if reverse {
            push(
                block,
                op(ctx, loc, "arith.subi", &[last, step], &[melior::ir::Type::index(ctx)], &[])?,
            )
        } else {
            step
        };
        let line = slice_at(
            ctx,
            loc,
            block,
            "tensor.extract_slice",
            &[xv, j],
            a,
            &vec![0; rank],
            &kd,
            xty,
        )?;
        // Exclusive: the running value before this step; it is then updated in place (a loop
        // must carry the same buffers on).
        let out = if exclusive {
            slice_at(
                ctx,
                loc,
                block,
                "tensor.insert_slice",
                &[carried[0], carried[1], j],
                a,
                &vec![0; rank],
                &kd,
                oty,
            )?
        } else {
            carried[1]
        };
        let g = generic(
            ctx,
            loc,
            &[line],
            &[carried[0]],
            &[id_map.clone(), id_map.clone()],
            &vec!["parallel"; rank],
            &[kty],
            |body| {
                let sb = ScalarBuilder { ctx, loc, block: body };
                let v = sb.cast(sb.load(body.argument(0).expect("x").into(), dt)?, acc)?;
                let s = sb.load(body.argument(1).expect("acc").into(), acc)?;
                let r = sb.emit(&op_name, &[s.v, v.v], tc)?;
                Ok(vec![sb.store(Scalar { v: r, dtype: acc })?])
            },
        )?;
        let next = push(block, g);
        let out = if exclusive {
            out
        } else {
            slice_at(
                ctx,
                loc,
                block,
                "tensor.insert_slice",
                &[next, out, j],
                a,
                &vec![0; rank],
                &kd,
                oty,
            )?
        };
        Ok(vec![next, out])
    })?;
    Ok(r[1])
}

/// `scf.for %i = 0 to n step 1 iter_args(inits)`: `body` gets the loop's block, `%i` and the
/// carried values, and returns the values to carry on. Returns the loop's results.
pub(super) fn scf_for<'c, 'a>(
    em: &Emitter<'c, 'a>,
    n: usize,
    inits: &[Value<'c, 'a>],
    body: impl for<'b> FnOnce(
        &'b Block<'c>,
        Value<'c, 'b>,
        &[Value<'c, 'b>],
    ) -> Result<Vec<Value<'c, 'b>>>,
) -> Result<Vec<Value<'c, 'a>>> {
    use melior::ir::{Region, RegionLike, ValueLike};
    let (ctx, loc) = (em.ctx, em.loc);
    let index = melior::ir::Type::index(ctx);
    let c = |v: usize| -> Result<Value<'c, 'a>> {
        let attr = crate::codegen::mlir::parse_attr(ctx, &format!("{v} : index"))?;
        Ok(push(em.block, op(ctx, loc, "arith.constant", &[], &[index], &[("value", attr)])?))
    };
    let (lb, ub, step) = (c(0)?, c(n)?, c(1)?);
    let types: Vec<melior::ir::Type> = inits.iter().map(|v| v.r#type()).collect();
    let mut args = vec![(index, loc)];
    args.extend(types.iter().map(|&t| (t, loc)));
    let block = Block::new(&args);
    {
        let iv = block.argument(0).expect("induction variable").into();
        let carried: Vec<Value> =
            (0..inits.len()).map(|i| block.argument(1 + i).expect("carried").into()).collect();
        let yielded = body(&block, iv, &carried)?;
        block.append_operation(op(ctx, loc, "scf.yield", &yielded, &[], &[])?);
    }
    let region = Region::new();
    region.append_block(block);
    let mut operands = vec![lb, ub, step];
    operands.extend_from_slice(inits);
    let op = melior::ir::operation::OperationBuilder::new("scf.for", loc)
        .add_operands(&operands)
        .add_results(&types)
        .add_regions([region])
        .build()
        .map_err(|e| crate::codegen::mlir::err(format!("building scf.for: {e}")))?;
    Ok(push_all(em.block, op))
}

/// `tensor.extract_slice` (operands: source, offset) or `tensor.insert_slice` (source, dest,
/// offset) of the static `sizes` at `offsets`, except the offset on `axis`, which is the dynamic
/// index operand; `result` is the result's type.
#[allow(clippy::too_many_arguments)]
pub(super) fn slice_at<'c, 'b>(
    ctx: &'c melior::Context,
    loc: melior::ir::Location<'c>,
    block: &'b Block<'c>,
    name: &str,
    operands: &[Value<'c, 'b>],
    axis: usize,
    offsets: &[i64],
    sizes: &[usize],
    result: melior::ir::Type<'c>,
) -> Result<Value<'c, 'b>> {
    use melior::ir::attribute::{DenseI32ArrayAttribute, DenseI64ArrayAttribute};
    let mut offsets = offsets.to_vec();
    // MLIR's marker for a dynamic offset (ShapedType::kDynamic).
    offsets[axis] = i64::MIN;
    let sizes: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
    let segments: &[i32] = if operands.len() == 2 { &[1, 1, 0, 0] } else { &[1, 1, 1, 0, 0] };
    let o = melior::ir::operation::OperationBuilder::new(name, loc)
        .add_operands(operands)
        .add_attributes(&[
            crate::codegen::mlir::named(
                ctx,
                "static_offsets",
                DenseI64ArrayAttribute::new(ctx, &offsets).into(),
            ),
            crate::codegen::mlir::named(
                ctx,
                "static_sizes",
                DenseI64ArrayAttribute::new(ctx, &sizes).into(),
            ),
            crate::codegen::mlir::named(
                ctx,
                "static_strides",
                DenseI64ArrayAttribute::new(ctx, &vec![1; sizes.len()]).into(),
            ),
            crate::codegen::mlir::named(
                ctx,
                "operandSegmentSizes",
                DenseI32ArrayAttribute::new(ctx, segments).into(),
            ),
        ])
        .add_results(&[result])
        .build()
        .map_err(|e| crate::codegen::mlir::err(format!("building {name}: {e}")))?;
    Ok(push(block, o))
}

/// TopK by selection: k steps of an `scf.for`, each a reduction along the axis picking, in every
/// line, the first element (in the requested order, ties by index) that comes after the previous
/// pick; O(n k) work.
fn top_k(em: &mut Emitter, id: NodeId, x: ValueId, axis: i64, largest: bool) -> Result<()> {
    let (values, indices) = (ValueId::new(id, 0), ValueId::new(id, 1));
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let a = normalize_axis(axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let rank = xd.len();
    let od = em.dims(values);
    let k = od[a];
    let (ctx, loc) = (em.ctx, em.loc);
    let xv = em.value(x)?;
    let kd: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if i == a { 1 } else { d }).collect();
    // Each step reads the previous pick of every line back from the results (none at step 0).
    let zero = em.scalar_constant(0.0, dt)?;
    let none = em.int_constant(-1, DType::I64)?;
    let best_v = em.empty(&kd, dt)?;
    let best_i = em.empty(&kd, DType::I64)?;
    let vdest = em.dest(values)?;
    let idest = em.dest(indices)?;
    let full = affine(rank, &loops_with(rank, rank, ""));
    let keep = affine(rank, &loops_with(rank, a, "0"));
    let maps = vec![full, keep.clone(), keep.clone(), keep.clone(), keep];
    let iters: Vec<&str> =
        (0..rank).map(|i| if i == a { "reduction" } else { "parallel" }).collect();
    let types = [em.tensor_type(&kd, dt)?, em.tensor_type(&kd, DType::I64)?];
    let (vty, ity) = (em.tensor_type(&od, dt)?, em.tensor_type(&od, DType::I64)?);
    let (kvty, kity) = (types[0], types[1]);
    let tv = compute(dt);
    let index = melior::ir::Type::index(ctx);
    let (c0, c1) = (em.int_constant(0, DType::I64)?, em.int_constant(1, DType::I64)?);
    let c0 = push(em.block, op(ctx, loc, "arith.index_cast", &[c0], &[index], &[])?);
    let c1 = push(em.block, op(ctx, loc, "arith.index_cast", &[c1], &[index], &[])?);
    let r = scf_for(em, k, &[vdest, idest], |block, step, carried| {
        let first =
            push(block, melior::dialect::arith::cmpi(ctx, CmpiPredicate::Eq, step, c0, loc));
        let before = push(block, op(ctx, loc, "arith.subi", &[step, c1], &[index], &[])?);
        let before = push(block, op(ctx, loc, "arith.maxsi", &[before, c0], &[index], &[])?);
        let zeros = vec![0; rank];
        let pv = slice_at(
            ctx,
            loc,
            block,
            "tensor.extract_slice",
            &[carried[0], before],
            a,
            &zeros,
            &kd,
            kvty,
        )?;
        let pi = slice_at(
            ctx,
            loc,
            block,
            "tensor.extract_slice",
            &[carried[1], before],
            a,
            &zeros,
            &kd,
            kity,
        )?;
        let bv = fill(ctx, loc, block, zero, best_v)?;
        let bi = fill(ctx, loc, block, none, best_i)?;
        let g = generic(ctx, loc, &[xv, pv, pi], &[bv, bi], &maps, &iters, &types, |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let v = sb.load(body.argument(0).expect("x").into(), dt)?;
            let pv = sb.load(body.argument(1).expect("previous value").into(), dt)?;
            let pi = body.argument(2).expect("previous index").into();
            let b = sb.load(body.argument(3).expect("best value").into(), dt)?;
            let bi = body.argument(4).expect("best index").into();
            let j = sb.loop_index(a, "i64")?;
            let minus = sb.int_constant(-1, "i64")?;
            // Candidates come after the previous pick: it goes first, or ties and has a lower index.
            let (p_first, p_equal) = compare(&sb, pv.v, v.v, dt, largest, true)?;
            let lower = sb.cmpi(CmpiPredicate::Slt, pi, j)?;
            let tie = sb.emit("arith.andi", &[p_equal, lower], "i1")?;
            let after = sb.emit("arith.ori", &[p_first, tie], "i1")?;
            // (`first` is the loop's value: `op` takes operands of any lifetime.)
            let candidate = push(body, melior::dialect::arith::ori(after, first, loc));
            // The best candidate goes first, ties to the lower index.
            let (v_first, v_equal) = compare(&sb, v.v, b.v, dt, largest, true)?;
            let below = sb.cmpi(CmpiPredicate::Slt, j, bi)?;
            let tie = sb.emit("arith.andi", &[v_equal, below], "i1")?;
            let better = sb.emit("arith.ori", &[v_first, tie], "i1")?;
            let no_best = sb.cmpi(CmpiPredicate::Eq, bi, minus)?;
            let better = sb.emit("arith.ori", &[better, no_best], "i1")?;
            let take = sb.emit("arith.andi", &[candidate, better], "i1")?;
            let nv = sb.select(take, v.v, b.v, tv)?;
            Ok(vec![sb.store(Scalar { v: nv, dtype: dt })?, sb.select(take, j, bi, "i64")?])
        })?;
        let picked = push_all(block, g);
        let vals = slice_at(
            ctx,
            loc,
            block,
            "tensor.insert_slice",
            &[picked[0], carried[0], step],
            a,
            &zeros,
            &kd,
            vty,
        )?;
        let idxs = slice_at(
            ctx,
            loc,
            block,
            "tensor.insert_slice",
            &[picked[1], carried[1], step],
            a,
            &zeros,
            &kd,
            ity,
        )?;
        Ok(vec![vals, idxs])
    })?;
    em.set(values, r[0]);
    em.set(indices, r[1]);
    Ok(())
}
