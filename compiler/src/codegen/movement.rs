//! Data movement: Transpose, Expand, Slice and Split are `linalg.generic` copies whose input
//! maps do the indexing (so they tile like anything else); Concat inserts each operand into its
//! slice of the destination; Gather reads the data with `tensor.extract` at the looked-up index.

use kiln_ir::infer::slice_axis;
use kiln_ir::{normalize_axis, NodeId, Op, ValueId};
use melior::ir::attribute::{DenseI32ArrayAttribute, DenseI64ArrayAttribute};
use melior::ir::operation::OperationBuilder;
use melior::ir::{Type, Value};

use super::mlir::{broadcast_map, dims_list, err, generic, named, op, parse_attr, push};
use super::Emitter;
use crate::Result;
use melior::ir::BlockLike;

/// The moved operand and every operand.
fn input(em: &Emitter, id: NodeId) -> (ValueId, Vec<Option<ValueId>>) {
    let operands = em.graph.operands(id);
    (operands[0].expect("movement ops have an input"), operands)
}

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    match &em.graph.node(id).op {
        Op::Transpose { perm } => emit_transpose(em, id, perm),
        Op::Concat { axis } => concat(em, id, *axis),
        Op::Split { axis, .. } => emit_split(em, id, *axis),
        Op::Slice => emit_slice(em, id),
        Op::Gather { axis } => emit_gather(em, id, *axis),
        Op::Expand => emit_expand(em, id),
        _ => Err(em.not_supported(id)),
    }
}

fn emit_transpose(em: &mut Emitter, id: NodeId, perm: &[usize]) -> Result<()> {
    let (x, _) = input(em, id);
    let r = em.dims(x).len();
    let perm: Vec<usize> = if perm.is_empty() { (0..r).rev().collect() } else { perm.to_vec() };
    // Input axis perm[k] is read at output loop k.
    let mut exprs = vec![String::new(); r];
    for (k, &p) in perm.iter().enumerate() {
        exprs[p] = format!("d{k}");
    }
    copy_with_map(em, x, ValueId::from(id), &exprs)
}

fn emit_expand(em: &mut Emitter, id: NodeId) -> Result<()> {
    let (x, _) = input(em, id);
    let result = ValueId::from(id);
    let od = em.dims(result);
    let xd = em.dims(x);
    let map = broadcast_map(od.len(), &xd, &od);
    copy_map(em, x, result, map)
}

fn emit_slice(em: &mut Emitter, id: NodeId) -> Result<()> {
    let (x, operands) = input(em, id);
    let xd = em.dims(x);
    let ints = |i: usize| -> Option<Vec<i64>> {
        operands
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| em.graph.constant_value(v))
            .map(|t| t.to_i64s())
    };
    let (starts, ends) = match (ints(1), ints(2)) {
        (Some(s), Some(e)) => (s, e),
        _ => return Err(em.unsupported(id, "needs constant starts and ends")),
    };
    let axes = ints(3).unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = ints(4).unwrap_or_else(|| vec![1; starts.len()]);
    let result = ValueId::from(id);
    let od = em.dims(result);
    let mut offsets = vec![0i64; xd.len()];
    let mut strides = vec![1i64; xd.len()];
    for i in 0..starts.len() {
        let a = normalize_axis(axes[i], xd.len())
            .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
        let (start, count) = slice_axis(xd[a], starts[i], ends[i], steps[i])
            .map_err(|e| em.unsupported(id, &e.to_string()))?;
        offsets[a] = start;
        // One element needs no step (and an extreme one, +-2^63, would overflow the index
        // arithmetic).
        strides[a] = if count <= 1 { 1 } else { steps[i] };
    }
    if strides.iter().all(|&s| s > 0) || od.contains(&0) {
        let xv = em.value(x)?;
        let view = if od.contains(&0) {
            xv
        } else {
            extract_slice(em, xv, &offsets, &od, &strides, em.ty(result).dtype)?
        };
        return copy_value(em, view, result);
    }
    // A negative step reads backwards: `start + step * d` (never a plain loop index, so the
    // loop ranges come from the result).
    let exprs: Vec<String> = (0..xd.len())
        .map(|a| {
            if strides[a] == 1 && offsets[a] == 0 && xd[a] == od[a] {
                format!("d{a}")
            } else {
                format!("d{a} * {} + {}", strides[a], offsets[a])
            }
        })
        .collect();
    copy_with_map(em, x, result, &exprs)
}

fn emit_split(em: &mut Emitter, id: NodeId, axis: i64) -> Result<()> {
    let (x, _) = input(em, id);
    let node = em.graph.node(id).clone();
    let xd = em.dims(x);
    let a = normalize_axis(axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let xv = em.value(x)?;
    let mut offset = 0;
    for i in 0..node.outputs.len() {
        let out = ValueId::new(id, i);
        let od = em.dims(out);
        let mut offsets = vec![0i64; xd.len()];
        offsets[a] = offset as i64;
        let view = if od.contains(&0) {
            xv
        } else {
            extract_slice(em, xv, &offsets, &od, &vec![1; xd.len()], em.ty(out).dtype)?
        };
        copy_value(em, view, out)?;
        offset += od[a];
    }
    Ok(())
}

fn emit_gather(em: &mut Emitter, id: NodeId, axis: i64) -> Result<()> {
    let (x, operands) = input(em, id);
    gather(em, id, x, operands[1].expect("gather indices"), axis)
}

/// `result[d...] = x[exprs(d...)]`.
fn copy_with_map(em: &mut Emitter, x: ValueId, result: ValueId, exprs: &[String]) -> Result<()> {
    let rank = em.dims(result).len();
    copy_map(em, x, result, format!("affine_map<({}) -> ({})>", dims_list(rank), exprs.join(", ")))
}

fn copy_map(em: &mut Emitter, x: ValueId, result: ValueId, map: String) -> Result<()> {
    let od = em.dims(result);
    let dtype = em.ty(result).dtype;
    let xv = em.value(x)?;
    let dest = em.dest(result)?;
    let ty = em.tensor_type(&od, dtype)?;
    let out_map = broadcast_map(od.len(), &od, &od);
    let g = generic(
        em.ctx,
        em.loc,
        &[xv],
        &[dest],
        &[map, out_map],
        &vec!["parallel"; od.len()],
        &[ty],
        |body| Ok(vec![body.argument(0).expect("x").into()]),
    )?;
    let t = push(em.block, g);
    em.set(result, t);
    Ok(())
}

/// A static `tensor.extract_slice` (a view until something copies it).
fn extract_slice<'c, 'a>(
    em: &Emitter<'c, 'a>,
    v: Value<'c, 'a>,
    offsets: &[i64],
    sizes: &[usize],
    strides: &[i64],
    dtype: kiln_ir::DType,
) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let sizes: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
    let ty = em.tensor_type(&sizes.iter().map(|&s| s as usize).collect::<Vec<_>>(), dtype)?;
    let o = OperationBuilder::new("tensor.extract_slice", loc)
        .add_operands(&[v])
        .add_attributes(&[
            named(ctx, "static_offsets", DenseI64ArrayAttribute::new(ctx, offsets).into()),
            named(ctx, "static_sizes", DenseI64ArrayAttribute::new(ctx, &sizes).into()),
            named(ctx, "static_strides", DenseI64ArrayAttribute::new(ctx, strides).into()),
            named(
                ctx,
                "operandSegmentSizes",
                DenseI32ArrayAttribute::new(ctx, &[1, 0, 0, 0]).into(),
            ),
        ])
        .add_results(&[ty])
        .build()
        .map_err(|e| err(format!("building tensor.extract_slice: {e}")))?;
    Ok(push(em.block, o))
}

/// Copies a tensor of `result`'s shape into `result`'s destination.
fn copy_value<'c, 'a>(em: &mut Emitter<'c, 'a>, v: Value<'c, 'a>, result: ValueId) -> Result<()> {
    let od = em.dims(result);
    if od.contains(&0) {
        // Nothing to copy (and an empty slice's offset may lie past the end).
        let d = em.dest(result)?;
        em.set(result, d);
        return Ok(());
    }
    let dest = em.dest(result)?;
    let ty = em.tensor_type(&od, em.ty(result).dtype)?;
    let id = broadcast_map(od.len(), &od, &od);
    let g = generic(
        em.ctx,
        em.loc,
        &[v],
        &[dest],
        &[id.clone(), id],
        &vec!["parallel"; od.len()],
        &[ty],
        |body| Ok(vec![body.argument(0).expect("x").into()]),
    )?;
    let t = push(em.block, g);
    em.set(result, t);
    Ok(())
}

fn concat(em: &mut Emitter, id: NodeId, axis: i64) -> Result<()> {
    let result = ValueId::from(id);
    let od = em.dims(result);
    let a = normalize_axis(axis, od.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let mut acc = em.dest(result)?;
    let ty = em.tensor_type(&od, em.ty(result).dtype)?;
    let mut offset = 0usize;
    let (ctx, loc) = (em.ctx, em.loc);
    for v in em.graph.operands(id).into_iter().flatten() {
        let d = em.dims(v);
        if d[a] == 0 {
            continue;
        }
        let src = em.value(v)?;
        let mut offsets = vec![0i64; od.len()];
        offsets[a] = offset as i64;
        let sizes: Vec<i64> = d.iter().map(|&x| x as i64).collect();
        let ins = OperationBuilder::new("tensor.insert_slice", loc)
            .add_operands(&[src, acc])
            .add_attributes(&[
                named(ctx, "static_offsets", DenseI64ArrayAttribute::new(ctx, &offsets).into()),
                named(ctx, "static_sizes", DenseI64ArrayAttribute::new(ctx, &sizes).into()),
                named(
                    ctx,
                    "static_strides",
                    DenseI64ArrayAttribute::new(ctx, &vec![1; od.len()]).into(),
                ),
                named(
                    ctx,
                    "operandSegmentSizes",
                    DenseI32ArrayAttribute::new(ctx, &[1, 1, 0, 0, 0]).into(),
                ),
            ])
            .add_results(&[ty])
            .build()
            .map_err(|e| err(format!("building tensor.insert_slice: {e}")))?;
        acc = push(em.block, ins);
        offset += d[a];
    }
    em.set(result, acc);
    Ok(())
}

fn gather(em: &mut Emitter, id: NodeId, x: ValueId, indices: ValueId, axis: i64) -> Result<()> {
    let result = ValueId::from(id);
    let (xd, idd, od) = (em.dims(x), em.dims(indices), em.dims(result));
    let a = normalize_axis(axis, xd.len())
        .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
    let (dtype, idt) = (em.ty(result).dtype, em.ty(indices).dtype);
    let xv = em.value(x)?;
    let iv = em.value(indices)?;
    let dest = em.dest(result)?;
    let rank = od.len();
    let ri = idd.len();
    let idx_map = format!(
        "affine_map<({}) -> ({})>",
        dims_list(rank),
        (a..a + ri).map(|i| format!("d{i}")).collect::<Vec<_>>().join(", ")
    );
    let out_map = broadcast_map(rank, &od, &od);
    let ty = em.tensor_type(&od, dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let n = xd[a];
    let status = em.status;
    let g = generic(
        ctx,
        loc,
        &[iv],
        &[dest],
        &[idx_map, out_map],
        &vec!["parallel"; rank],
        &[ty],
        |body| {
            let index = Type::index(ctx);
            let raw = body.argument(0).expect("index").into();
            // Negative indices count from the end; out-of-range ones set the status word and
            // are clamped (no stray reads).
            let i = super::indexing::Ix::new(ctx, loc, body).norm_index(raw, idt, n, status)?;
            let mut coords: Vec<Value> = Vec::with_capacity(xd.len());
            for d in 0..xd.len() {
                if d == a {
                    coords.push(i);
                } else {
                    // Axes after the gathered one come after the indices' axes (none for a scalar index).
                    let loop_dim = if d < a { d } else { d + ri - 1 };
                    coords.push(push(
                        body,
                        op(
                            ctx,
                            loc,
                            "linalg.index",
                            &[],
                            &[index],
                            &[("dim", parse_attr(ctx, &format!("{loop_dim} : i64"))?)],
                        )?,
                    ));
                }
            }
            let elem = super::mlir::dtype_type(ctx, dtype);
            let mut operands = vec![xv];
            operands.extend(coords);
            let v = push(body, op(ctx, loc, "tensor.extract", &operands, &[elem], &[])?);
            Ok(vec![v])
        },
    )?;
    let t = push(em.block, g);
    em.set(result, t);
    Ok(())
}
