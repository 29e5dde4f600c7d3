//! Indexing ops: GatherElements, GatherND, ScatterElements, ScatterND, Tile, Pad, OneHot, Trilu,
//! DepthToSpace, SpaceToDepth, ReverseSequence.
//!
//! Most are one `linalg.generic` over the result with no input maps that index: the body computes
//! the source coordinates from `linalg.index` (and data-dependent indices) and reads the operand
//! with `tensor.extract`. Operands read that way are not sliced when the generic is tiled into
//! workgroups, so any index arithmetic (mod, div, tables) stays correct. Where an index depends
//! only on shapes and attributes, the interpreter's own per-axis tables are precomputed (Pad).
//! Scatters copy the data and then apply the updates one by one in an `scf.for`, in the
//! interpreter's order, so duplicates and reductions agree with it.

use kiln_ir::op::{PadMode, ScatterReduction};
use kiln_ir::{normalize_axis, DType, NodeId, Op, Tensor, ValueId};
use melior::dialect::arith::{CmpfPredicate, CmpiPredicate};
use melior::ir::operation::OperationBuilder;
use melior::ir::{Block, BlockLike, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;

use super::mlir::{
    broadcast_map, dense_literal, dims_list, err, generic, op, parse_attr, push, storage_type,
};
use super::scalar::{compute, ScalarBuilder};
use super::status::{self, Status};
use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let node = em.graph.node(id).clone();
    let operands = em.graph.operands(id);
    let result = ValueId::from(id);
    let arg = |i: usize| operands.get(i).copied().flatten();
    let need =
        |i: usize| arg(i).ok_or_else(|| err(format!("{} has no operand {i}", node.op.name())));
    let graph = em.graph;
    let const_ints = |i: usize| arg(i).and_then(|v| graph.constant_value(v)).map(Tensor::to_i64s);
    let od = em.dims(result);
    let dtype = em.ty(result).dtype;
    match &node.op {
        Op::GatherElements { axis } => {
            let (x, ind) = (need(0)?, need(1)?);
            let xd = em.dims(x);
            let a = normalize_axis(*axis, xd.len())
                .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
            no_reads_from_empty(em, id, &xd, &od)?;
            let idt = em.ty(ind).dtype;
            let (xv, iv) = (em.value(x)?, em.value(ind)?);
            let rank = od.len();
            let status = em.status;
            over_output(em, result, &[(iv, identity(rank))], |ix, args| {
                let j = ix.norm_index(args[0], idt, xd[a], status)?;
                let coords = (0..rank)
                    .map(|d| if d == a { Ok(j) } else { ix.loop_index(d) })
                    .collect::<Result<Vec<_>>>()?;
                ix.extract(xv, &coords, dtype)
            })
        }
        Op::GatherNd { batch_dims } => {
            let (x, ind) = (need(0)?, need(1)?);
            let (xd, id_dims) = (em.dims(x), em.dims(ind));
            let (b, q) = (*batch_dims, id_dims.len());
            let m = id_dims[q - 1];
            no_reads_from_empty(em, id, &xd, &od)?;
            let idt = em.ty(ind).dtype;
            let (xv, iv) = (em.value(x)?, em.value(ind)?);
            let status = em.status;
            over_output(em, result, &[], |ix, _| {
                // Result loops: batch (b), the other index dims (q - 1 - b), then the slice.
                let tuple: Vec<Value> =
                    (0..q - 1).map(|d| ix.loop_index(d)).collect::<Result<_>>()?;
                let mut coords: Vec<Value> = tuple[..b].to_vec();
                for j in 0..m {
                    let mut at = tuple.clone();
                    at.push(ix.c(j as i128)?);
                    let raw = ix.extract(iv, &at, idt)?;
                    coords.push(ix.norm_index(raw, idt, xd[b + j], status)?);
                }
                for k in 0..xd.len() - b - m {
                    coords.push(ix.loop_index(q - 1 + k)?);
                }
                ix.extract(xv, &coords, dtype)
            })
        }
        Op::ScatterElements { axis, reduction } => {
            let (x, ind, upd) = (need(0)?, need(1)?, need(2)?);
            let xd = em.dims(x);
            let a = normalize_axis(*axis, xd.len())
                .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
            let ud = em.dims(upd);
            no_reads_from_empty(em, id, &xd, &ud)?;
            let idt = em.ty(ind).dtype;
            let (iv, uv) = (em.value(ind)?, em.value(upd)?);
            let copy = copy_into_dest(em, x, result)?;
            let n: usize = ud.iter().product();
            let r = *reduction;
            let t = scf_for(em, n, copy, |ix, i, acc| {
                let at = ix.delinearize(i, &ud)?;
                let raw = ix.extract(iv, &at, idt)?;
                let mut coords = at.clone();
                coords[a] = ix.norm_index(raw, idt, xd[a], em.status)?;
                let new = ix.extract(uv, &at, dtype)?;
                ix.combine_into(acc, &coords, new, dtype, r)
            })?;
            em.set(result, t);
            Ok(())
        }
        Op::ScatterNd { reduction } => {
            let (x, ind, upd) = (need(0)?, need(1)?, need(2)?);
            let (xd, id_dims, ud) = (em.dims(x), em.dims(ind), em.dims(upd));
            let q = id_dims.len();
            let m = id_dims[q - 1];
            no_reads_from_empty(em, id, &xd, &ud)?;
            let idt = em.ty(ind).dtype;
            let (iv, uv) = (em.value(ind)?, em.value(upd)?);
            let copy = copy_into_dest(em, x, result)?;
            let n: usize = ud.iter().product();
            let r = *reduction;
            let t = scf_for(em, n, copy, |ix, i, acc| {
                // updates = indices.shape[:-1] + data.shape[m:]: the leading coordinates pick the
                // index tuple, the trailing ones the element of the slice.
                let at = ix.delinearize(i, &ud)?;
                let mut coords = Vec::with_capacity(xd.len());
                for (j, &n) in xd[..m].iter().enumerate() {
                    let mut t: Vec<Value> = at[..q - 1].to_vec();
                    t.push(ix.c(j as i128)?);
                    let raw = ix.extract(iv, &t, idt)?;
                    coords.push(ix.norm_index(raw, idt, n, em.status)?);
                }
                coords.extend_from_slice(&at[q - 1..]);
                let new = ix.extract(uv, &at, dtype)?;
                ix.combine_into(acc, &coords, new, dtype, r)
            })?;
            em.set(result, t);
            Ok(())
        }
        Op::Tile => {
            let x = need(0)?;
            let xd = em.dims(x);
            let xv = em.value(x)?;
            over_output(em, result, &[], |ix, _| {
                let mut coords = Vec::with_capacity(xd.len());
                for (d, &n) in xd.iter().enumerate() {
                    let i = ix.loop_index(d)?;
                    coords.push(if n == od[d] { i } else { ix.rem(i, ix.c(n as i128)?)? });
                }
                ix.extract(xv, &coords, dtype)
            })
        }
        Op::Pad { mode } => {
            pad(em, id, *mode, arg(0), const_ints(1), arg(1), arg(2), arg(3).map(|_| const_ints(3)))
        }
        Op::OneHot { axis } => {
            let (ind, values) = (need(0)?, need(2)?);
            let a = normalize_axis(*axis, od.len())
                .ok_or_else(|| em.unsupported(id, "has an axis out of range"))?;
            let depth = od[a] as i128;
            let idt = em.ty(ind).dtype;
            let vv = em.value(values)?;
            let iv = em.value(ind)?;
            let rank = od.len();
            // The indices are the result's loops without the new axis.
            let map = format!(
                "affine_map<({}) -> ({})>",
                dims_list(rank),
                (0..rank)
                    .filter(|&d| d != a)
                    .map(|d| format!("d{d}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            over_output(em, result, &[(iv, map)], |ix, args| {
                // As the interpreter: indices truncate to i64, negative ones count from the end,
                // and out-of-range ones match nothing.
                let i = ix.to_i64(args[0], idt)?;
                let zero = ix.sb.int_constant(0, "i64")?;
                let neg = ix.sb.cmpi(CmpiPredicate::Slt, i, zero)?;
                let d = ix.sb.int_constant(depth, "i64")?;
                let wrapped = ix.sb.emit("arith.addi", &[i, d], "i64")?;
                let i = ix.sb.select(neg, wrapped, i, "i64")?;
                let here = ix.index_to_i64(ix.loop_index(a)?)?;
                let hit = ix.sb.cmpi(CmpiPredicate::Eq, i, here)?;
                let on = ix.extract(vv, &[ix.c(1)?], dtype)?;
                let off = ix.extract(vv, &[ix.c(0)?], dtype)?;
                ix.sb.select(hit, on, off, storage_type(dtype))
            })
        }
        Op::Trilu { upper } => {
            let x = need(0)?;
            // k decides no shape, so it may be a run-time value (then read in the body):
            // (tensor, rank, dtype), or None with the constant.
            let (k_const, k_runtime) = match arg(1) {
                Some(v) if em.dims(v).iter().product::<usize>() > 0 => match const_ints(1) {
                    Some(c) => (c.first().copied().unwrap_or(0), None),
                    None => (0, Some((em.value(v)?, em.dims(v).len(), em.ty(v).dtype))),
                },
                _ => (0, None),
            };
            let xv = em.value(x)?;
            let rank = od.len();
            let upper = *upper;
            over_output(em, result, &[(xv, identity(rank))], |ix, args| {
                let i = ix.index_to_i64(ix.loop_index(rank - 2)?)?;
                let j = ix.index_to_i64(ix.loop_index(rank - 1)?)?;
                let diag = ix.sb.emit("arith.subi", &[j, i], "i64")?;
                let kk = match k_runtime {
                    None => ix.sb.int_constant(k_const as i128, "i64")?,
                    Some((kv, r, kdt)) => {
                        let raw = ix.extract(
                            kv,
                            &(0..r).map(|_| ix.c(0)).collect::<Result<Vec<_>>>()?,
                            kdt,
                        )?;
                        ix.to_i64(raw, kdt)?
                    }
                };
                let keep = ix.sb.cmpi(
                    if upper { CmpiPredicate::Sge } else { CmpiPredicate::Sle },
                    diag,
                    kk,
                )?;
                let zero = ix.zero(dtype)?;
                ix.sb.select(keep, args[0], zero, storage_type(dtype))
            })
        }
        Op::DepthToSpace { blocksize, crd } => {
            let x = need(0)?;
            let xv = em.value(x)?;
            let (b, crd) = (*blocksize as i128, *crd);
            let c_out = od[1] as i128;
            over_output(em, result, &[], |ix, _| {
                let (n, c, y, w) =
                    (ix.loop_index(0)?, ix.loop_index(1)?, ix.loop_index(2)?, ix.loop_index(3)?);
                let bb = ix.c(b)?;
                let (h, i) = (ix.div(y, bb)?, ix.rem(y, bb)?);
                let (ww, j) = (ix.div(w, bb)?, ix.rem(w, bb)?);
                // i * b + j: the position inside the block.
                let ij = ix.add(ix.mul(i, bb)?, j)?;
                let ch = if crd {
                    ix.add(ix.mul(c, ix.c(b * b)?)?, ij)?
                } else {
                    ix.add(ix.mul(ij, ix.c(c_out)?)?, c)?
                };
                ix.extract(xv, &[n, ch, h, ww], dtype)
            })
        }
        Op::SpaceToDepth { blocksize } => {
            let x = need(0)?;
            let xv = em.value(x)?;
            let b = *blocksize as i128;
            let c_in = em.dims(x)[1] as i128;
            over_output(em, result, &[], |ix, _| {
                let (n, oc, h, w) =
                    (ix.loop_index(0)?, ix.loop_index(1)?, ix.loop_index(2)?, ix.loop_index(3)?);
                // oc = (i * b + j) * C + c.
                let cc = ix.c(c_in)?;
                let (ij, c) = (ix.div(oc, cc)?, ix.rem(oc, cc)?);
                let bb = ix.c(b)?;
                let (i, j) = (ix.div(ij, bb)?, ix.rem(ij, bb)?);
                let y = ix.add(ix.mul(h, bb)?, i)?;
                let xx = ix.add(ix.mul(w, bb)?, j)?;
                ix.extract(xv, &[n, c, y, xx], dtype)
            })
        }
        Op::ReverseSequence { batch_axis, time_axis } => {
            let (x, lens) = (need(0)?, need(1)?);
            let xd = em.dims(x);
            let (ba, ta) = (*batch_axis, *time_axis);
            let steps = xd[ta] as i128;
            let ldt = em.ty(lens).dtype;
            let (xv, lv) = (em.value(x)?, em.value(lens)?);
            over_output(em, result, &[], |ix, _| {
                let mut coords: Vec<Value> =
                    (0..xd.len()).map(|d| ix.loop_index(d)).collect::<Result<_>>()?;
                let raw = ix.extract(lv, &[coords[ba]], ldt)?;
                // The interpreter rejects lengths outside [0, steps]; clamp so reads stay in bounds.
                let len = ix.to_i64(raw, ldt)?;
                let len =
                    ix.sb.emit("arith.maxsi", &[len, ix.sb.int_constant(0, "i64")?], "i64")?;
                let len =
                    ix.sb.emit("arith.minsi", &[len, ix.sb.int_constant(steps, "i64")?], "i64")?;
                let len = ix.i64_to_index(len)?;
                let t = coords[ta];
                let inside = ix.sb.cmpi(CmpiPredicate::Ult, t, len)?;
                let rev = ix.sub(ix.sub(len, ix.c(1)?)?, t)?;
                coords[ta] = ix.sb.select(inside, rev, t, "index")?;
                ix.extract(xv, &coords, dtype)
            })
        }
        _ => Err(em.not_supported(id)),
    }
}

/// Pad: each padded axis maps a result coordinate to an operand coordinate (or to the pad
/// value) by the interpreter's own table, precomputed as a constant.
#[allow(clippy::too_many_arguments)]
fn pad(
    em: &mut Emitter,
    id: NodeId,
    mode: PadMode,
    x: Option<ValueId>,
    pads: Option<Vec<i64>>,
    pads_operand: Option<ValueId>,
    value: Option<ValueId>,
    axes: Option<Option<Vec<i64>>>,
) -> Result<()> {
    let result = ValueId::from(id);
    let x = x.ok_or_else(|| err("Pad has no input"))?;
    let (Some(pads), Some(_)) = (pads, pads_operand) else {
        return Err(em.unsupported(id, "needs constant pads"));
    };
    let axes = match axes {
        None => None,
        Some(Some(a)) => Some(a),
        Some(None) => return Err(em.unsupported(id, "needs constant axes")),
    };
    let (xd, od) = (em.dims(x), em.dims(result));
    let dtype = em.ty(result).dtype;
    let amounts = kiln_ir::infer::pad_amounts(&pads, axes.as_deref(), xd.len())
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
    for &size in &od {
        em.check_table(id, "an index map along an axis", Some(size))?;
    }
    let maps: Vec<Vec<Option<usize>>> = xd
        .iter()
        .zip(&amounts)
        .zip(&od)
        .map(|((&n, &(lo, hi)), &size)| kiln_ir::eval::pad_axis(mode, n, lo, hi, size))
        .collect();
    // Axes whose table is the identity read the loop index itself.
    let identity_axis: Vec<bool> = maps
        .iter()
        .map(|m| {
            m.len() == m.iter().flatten().count()
                && m.iter().enumerate().all(|(i, &c)| c == Some(i))
        })
        .collect();
    let fill_anywhere = maps.iter().any(|m| m.iter().any(Option::is_none));
    let reads_x = !xd.contains(&0) && maps.iter().all(|m| m.iter().any(Option::is_some));
    let mut tables = Vec::with_capacity(xd.len());
    for (m, &ident) in maps.iter().zip(&identity_axis) {
        if ident || od.contains(&0) {
            tables.push(None);
            continue;
        }
        let t = Tensor::from_vec(
            &[m.len()],
            m.iter().map(|c| c.map_or(-1, |c| c as i64)).collect::<Vec<i64>>(),
        )
        .map_err(|e| err(e.to_string()))?;
        tables.push(Some(const_tensor(em, &t)?));
    }
    let xv = em.value(x)?;
    let fill_v = match value {
        Some(v) if em.dims(v).iter().product::<usize>() > 0 => {
            Some((em.value(v)?, em.dims(v).len()))
        }
        _ => None,
    };
    over_output(em, result, &[], |ix, _| {
        let fill = match fill_v {
            Some((v, r)) => {
                ix.extract(v, &(0..r).map(|_| ix.c(0)).collect::<Result<Vec<_>>>()?, dtype)?
            }
            None => ix.zero(dtype)?,
        };
        if !reads_x {
            return Ok(fill);
        }
        let mut coords = Vec::with_capacity(xd.len());
        let mut valid: Option<Value> = None;
        for (d, table) in tables.iter().enumerate() {
            let i = ix.loop_index(d)?;
            let Some(table) = table else {
                coords.push(i);
                continue;
            };
            let c = ix.extract(*table, &[i], DType::I64)?;
            let zero = ix.sb.int_constant(0, "i64")?;
            if fill_anywhere {
                let ok = ix.sb.cmpi(CmpiPredicate::Sge, c, zero)?;
                valid = Some(match valid {
                    Some(v) => ix.sb.emit("arith.andi", &[v, ok], "i1")?,
                    None => ok,
                });
            }
            // -1 (the pad value) reads element 0 instead, then is replaced.
            let c = ix.sb.emit("arith.maxsi", &[c, zero], "i64")?;
            coords.push(ix.i64_to_index(c)?);
        }
        let v = ix.extract(xv, &coords, dtype)?;
        match valid {
            Some(ok) => ix.sb.select(ok, v, fill, storage_type(dtype)),
            None => Ok(v),
        }
    })
}

/// Refuses ops that would read an operand with no elements while producing some (the
/// interpreter reports an out-of-range index there).
fn no_reads_from_empty(em: &Emitter, id: NodeId, xd: &[usize], produced: &[usize]) -> Result<()> {
    if xd.contains(&0) && !produced.contains(&0) {
        return Err(em.unsupported(id, "indexes into an operand with no elements"));
    }
    Ok(())
}

/// A constant tensor (a table computed at compile time) in the function body.
pub(super) fn const_tensor<'c, 'a>(em: &Emitter<'c, 'a>, t: &Tensor) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let ty = em.tensor_type(t.dims(), t.dtype())?;
    Ok(push(
        em.block,
        op(
            ctx,
            loc,
            "arith.constant",
            &[],
            &[ty],
            &[("value", parse_attr(ctx, &dense_literal(t))?)],
        )?,
    ))
}

/// The identity map of rank `n`.
pub(super) fn identity(n: usize) -> String {
    format!("affine_map<({}) -> ({})>", dims_list(n), dims_list(n))
}

/// Index arithmetic and element reads in a kernel body.
pub(super) struct Ix<'c, 'b> {
    pub sb: ScalarBuilder<'c, 'b>,
    index: Type<'c>,
}

impl<'c, 'b> Ix<'c, 'b> {
    pub fn new(ctx: &'c Context, loc: melior::ir::Location<'c>, block: &'b Block<'c>) -> Self {
        Ix { sb: ScalarBuilder { ctx, loc, block }, index: Type::index(ctx) }
    }

    fn push(
        &self,
        name: &str,
        operands: &[Value<'c, '_>],
        result: Type<'c>,
    ) -> Result<Value<'c, 'b>> {
        Ok(push(self.sb.block, op(self.sb.ctx, self.sb.loc, name, operands, &[result], &[])?))
    }

    /// `linalg.index` of loop `d`.
    pub fn loop_index(&self, d: usize) -> Result<Value<'c, 'b>> {
        let (ctx, loc) = (self.sb.ctx, self.sb.loc);
        Ok(push(
            self.sb.block,
            op(
                ctx,
                loc,
                "linalg.index",
                &[],
                &[self.index],
                &[("dim", parse_attr(ctx, &format!("{d} : i64"))?)],
            )?,
        ))
    }

    /// An `index` constant.
    pub fn c(&self, n: i128) -> Result<Value<'c, 'b>> {
        self.sb.int_constant(n, "index")
    }

    pub fn add(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.sb.emit("arith.addi", &[a, b], "index")
    }

    pub fn sub(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.sb.emit("arith.subi", &[a, b], "index")
    }

    pub fn mul(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.sb.emit("arith.muli", &[a, b], "index")
    }

    pub fn div(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.sb.emit("arith.divui", &[a, b], "index")
    }

    pub fn rem(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.sb.emit("arith.remui", &[a, b], "index")
    }

    /// The element of tensor `t` (storage type of `dtype`) at `coords`.
    pub fn extract(
        &self,
        t: Value<'c, '_>,
        coords: &[Value<'c, '_>],
        dtype: DType,
    ) -> Result<Value<'c, 'b>> {
        let mut operands: Vec<Value> = vec![t];
        operands.extend_from_slice(coords);
        let elem = super::mlir::dtype_type(self.sb.ctx, dtype);
        self.push("tensor.extract", &operands, elem)
    }

    /// Row-major coordinates of `flat` in `dims`.
    pub fn delinearize(&self, flat: Value<'c, 'b>, dims: &[usize]) -> Result<Vec<Value<'c, 'b>>> {
        let mut out = vec![flat; dims.len()];
        let mut rest = flat;
        for d in (0..dims.len()).rev() {
            if d == 0 {
                out[0] = rest;
                break;
            }
            let n = self.c(dims[d] as i128)?;
            out[d] = self.rem(rest, n)?;
            rest = self.div(rest, n)?;
        }
        Ok(out)
    }

    pub fn index_to_i64(&self, i: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.push("arith.index_cast", &[i], self.sb.ty("i64")?)
    }

    pub fn i64_to_index(&self, i: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
        self.push("arith.index_cast", &[i], self.index)
    }

    /// An element (storage type) as i64, as `Tensor::to_i64s` converts: integers exactly (u64
    /// bit for bit), floats truncated with saturation and NaN as 0.
    pub fn to_i64(&self, v: Value<'c, 'b>, dtype: DType) -> Result<Value<'c, 'b>> {
        let sb = &self.sb;
        match dtype {
            DType::I64 | DType::U64 => Ok(v),
            DType::I8 | DType::I16 | DType::I32 => sb.emit("arith.extsi", &[v], "i64"),
            DType::U8 | DType::U16 | DType::U32 | DType::Bool => {
                sb.emit("arith.extui", &[v], "i64")
            }
            _ => {
                let f = sb.load(v, dtype)?.v;
                let t = compute(dtype);
                let nan = sb.cmpf(CmpfPredicate::Uno, f, f)?;
                let hi = sb.cmpf(CmpfPredicate::Oge, f, sb.constant(9223372036854775808.0, t)?)?;
                let lo = sb.cmpf(CmpfPredicate::Olt, f, sb.constant(-9223372036854775808.0, t)?)?;
                let safe = sb.select(nan, sb.constant(0.0, t)?, f, t)?;
                let safe = sb.select(hi, sb.constant(0.0, t)?, safe, t)?;
                let safe = sb.select(lo, sb.constant(0.0, t)?, safe, t)?;
                let i = sb.emit("arith.fptosi", &[safe], "i64")?;
                let i = sb.select(hi, sb.int_constant(i64::MAX as i128, "i64")?, i, "i64")?;
                sb.select(lo, sb.int_constant(i64::MIN as i128, "i64")?, i, "i64")
            }
        }
    }

    /// An index element read from a tensor of `dtype` (i32/i64) for an axis of size `n`:
    /// negative counts from the end. Out of range (the interpreter rejects it) sets the run's
    /// status word when the kernel has one (`status`), and is clamped so reads stay in bounds.
    pub fn norm_index(
        &self,
        raw: Value<'c, 'b>,
        dtype: DType,
        n: usize,
        status: Option<Status<'c, '_>>,
    ) -> Result<Value<'c, 'b>> {
        let sb = &self.sb;
        let i = self.to_i64(raw, dtype)?;
        let n = n as i128;
        let zero = sb.int_constant(0, "i64")?;
        let neg = sb.cmpi(CmpiPredicate::Slt, i, zero)?;
        let wrapped = sb.emit("arith.addi", &[i, sb.int_constant(n, "i64")?], "i64")?;
        let i = sb.select(neg, wrapped, i, "i64")?;
        if let Some(status) = status {
            let below = sb.cmpi(CmpiPredicate::Slt, i, zero)?;
            let above = sb.cmpi(CmpiPredicate::Sge, i, sb.int_constant(n, "i64")?)?;
            let bad = sb.emit("arith.ori", &[below, above], "i1")?;
            status::fail_if(sb.ctx, sb.loc, sb.block, bad, status)?;
        }
        let i = sb.emit("arith.maxsi", &[i, zero], "i64")?;
        let i = sb.emit("arith.minsi", &[i, sb.int_constant((n - 1).max(0), "i64")?], "i64")?;
        self.i64_to_index(i)
    }

    /// Zero and one in the storage type of `dtype`.
    pub fn zero(&self, dtype: DType) -> Result<Value<'c, 'b>> {
        self.sb.constant(0.0, storage_type(dtype))
    }

    pub fn one(&self, dtype: DType) -> Result<Value<'c, 'b>> {
        self.sb.constant(1.0, storage_type(dtype))
    }

    /// An element (storage type) as f64, exactly.
    pub fn to_f64(&self, v: Value<'c, 'b>, dtype: DType) -> Result<Value<'c, 'b>> {
        let sb = &self.sb;
        match dtype {
            DType::F64 => Ok(v),
            DType::F32 => sb.emit("arith.extf", &[v], "f64"),
            DType::F16 | DType::BF16 => {
                let f = sb.load(v, dtype)?.v;
                sb.emit("arith.extf", &[f], "f64")
            }
            DType::Bool => sb.emit("arith.uitofp", &[v], "f64"),
            d if d.is_signed_int() => sb.emit("arith.sitofp", &[v], "f64"),
            _ => sb.emit("arith.uitofp", &[v], "f64"),
        }
    }

    /// An f64 to the storage type of `dtype`, as `Tensor::from_f64s` converts: floats rounded
    /// (f16/bf16 through f32), integers truncated with saturation and NaN as 0, bools `!= 0`.
    pub fn store_f64(&self, v: Value<'c, 'b>, dtype: DType) -> Result<Value<'c, 'b>> {
        let sb = &self.sb;
        match dtype {
            DType::F64 => Ok(v),
            DType::F32 => sb.emit("arith.truncf", &[v], "f32"),
            DType::F16 | DType::BF16 => {
                let f = sb.emit("arith.truncf", &[v], "f32")?;
                sb.emit("arith.truncf", &[f], storage_type(dtype))
            }
            DType::Bool => {
                let nz = sb.cmpf(CmpfPredicate::Une, v, sb.constant(0.0, "f64")?)?;
                sb.emit("arith.extui", &[nz], "i8")
            }
            _ => {
                let t = storage_type(dtype);
                let bits = dtype.size() as i32 * 8;
                let signed = dtype.is_signed_int();
                let (min, max): (i128, i128) = if signed {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                let nan = sb.cmpf(CmpfPredicate::Uno, v, v)?;
                // max + 1 is a power of two, exact in f64.
                let hi = sb.cmpf(CmpfPredicate::Oge, v, sb.constant((max + 1) as f64, "f64")?)?;
                let lo = sb.cmpf(CmpfPredicate::Olt, v, sb.constant(min as f64, "f64")?)?;
                let zero = sb.constant(0.0, "f64")?;
                let safe = sb.select(nan, zero, v, "f64")?;
                let safe = sb.select(hi, zero, safe, "f64")?;
                let safe = sb.select(lo, zero, safe, "f64")?;
                let i =
                    sb.emit(if signed { "arith.fptosi" } else { "arith.fptoui" }, &[safe], t)?;
                let i = sb.select(hi, sb.int_constant(max, t)?, i, t)?;
                sb.select(lo, sb.int_constant(min, t)?, i, t)
            }
        }
    }

    /// Combines `new` into `acc[coords]` by a scatter reduction, as the interpreter's `combine`:
    /// integers wrap, bools act as 0/1 (so add is or, mul is and), float max/min let NaN win
    /// and keep the old value on ties.
    pub fn combine_into(
        &self,
        acc: Value<'c, 'b>,
        coords: &[Value<'c, 'b>],
        new: Value<'c, 'b>,
        dtype: DType,
        r: ScatterReduction,
    ) -> Result<Value<'c, 'b>> {
        use ScatterReduction as R;
        let sb = &self.sb;
        let st = storage_type(dtype);
        let v = if r == R::None {
            new
        } else {
            let old = self.extract(acc, coords, dtype)?;
            if dtype == DType::Bool {
                let (a, b) = (sb.load(old, dtype)?.v, sb.load(new, dtype)?.v);
                let v = match r {
                    R::Add | R::Max => sb.emit("arith.ori", &[a, b], "i1")?,
                    _ => sb.emit("arith.andi", &[a, b], "i1")?,
                };
                sb.emit("arith.extui", &[v], "i8")?
            } else if dtype.is_float() {
                let (a, b) = (sb.load(old, dtype)?, sb.load(new, dtype)?);
                let t = compute(dtype);
                let v = match r {
                    R::Add => sb.emit("arith.addf", &[a.v, b.v], t)?,
                    R::Mul => sb.emit("arith.mulf", &[a.v, b.v], t)?,
                    _ => {
                        let b_nan = sb.cmpf(CmpfPredicate::Uno, b.v, b.v)?;
                        let better = sb.cmpf(
                            if r == R::Max { CmpfPredicate::Ogt } else { CmpfPredicate::Olt },
                            b.v,
                            a.v,
                        )?;
                        let take = sb.emit("arith.ori", &[b_nan, better], "i1")?;
                        sb.select(take, b.v, a.v, t)?
                    }
                };
                sb.store(super::scalar::Scalar { v, dtype })?
            } else {
                let s = dtype.is_signed_int();
                let name = match r {
                    R::Add => "arith.addi",
                    R::Mul => "arith.muli",
                    R::Max if s => "arith.maxsi",
                    R::Max => "arith.maxui",
                    R::Min if s => "arith.minsi",
                    _ => "arith.minui",
                };
                sb.emit(name, &[old, new], st)?
            }
        };
        let mut operands = vec![v, acc];
        operands.extend_from_slice(coords);
        self.push("tensor.insert", &operands, acc.r#type())
    }
}

/// Builds a tensor of `dims` as a `linalg.generic` over it into `dest`: `ins` are read through
/// their maps (block arguments, in order), `body` computes each element in the storage type
/// from the loop indices.
pub(super) fn build_over<'c, 'a>(
    em: &Emitter<'c, 'a>,
    dims: &[usize],
    dtype: DType,
    dest: Value<'c, 'a>,
    ins: &[(Value<'c, 'a>, String)],
    body: impl for<'b> FnOnce(&Ix<'c, 'b>, &[Value<'c, 'b>]) -> Result<Value<'c, 'b>>,
) -> Result<Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let rank = dims.len();
    let ty = em.tensor_type(dims, dtype)?;
    let values: Vec<Value> = ins.iter().map(|(v, _)| *v).collect();
    let mut maps: Vec<String> = ins.iter().map(|(_, m)| m.clone()).collect();
    maps.push(broadcast_map(rank, dims, dims));
    let n_in = ins.len();
    let g = generic(ctx, loc, &values, &[dest], &maps, &vec!["parallel"; rank], &[ty], |block| {
        let ix = Ix::new(ctx, loc, block);
        let args: Vec<Value> = (0..n_in)
            .map(|i| block.argument(i).map(Into::into))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| err(e.to_string()))?;
        Ok(vec![body(&ix, &args)?])
    })?;
    Ok(push(em.block, g))
}

/// `result` computed element by element (see `build_over`); a result with no elements is its
/// destination as it is.
pub(super) fn over_output<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    result: ValueId,
    ins: &[(Value<'c, 'a>, String)],
    body: impl for<'b> FnOnce(&Ix<'c, 'b>, &[Value<'c, 'b>]) -> Result<Value<'c, 'b>>,
) -> Result<()> {
    let dims = em.dims(result);
    let dest = em.dest(result)?;
    if dims.contains(&0) {
        em.set(result, dest);
        return Ok(());
    }
    let t = build_over(em, &dims, em.ty(result).dtype, dest, ins, body)?;
    em.set(result, t);
    Ok(())
}

/// A copy of `x` (of `result`'s type) into `result`'s destination. Explicit, as an identity
/// generic would fold away and leave later in-place updates to a temporary.
pub(super) fn copy_into_dest<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    x: ValueId,
    result: ValueId,
) -> Result<Value<'c, 'a>> {
    let dims = em.dims(result);
    let dest = em.dest(result)?;
    if dims.contains(&0) {
        return Ok(dest);
    }
    let xv = em.value(x)?;
    let ty = em.tensor_type(&dims, em.ty(result).dtype)?;
    Ok(push(
        em.block,
        op(em.ctx, em.loc, "bufferization.materialize_in_destination", &[xv, dest], &[ty], &[])?,
    ))
}

/// `scf.for %i = 0 to n` threading the tensor `init` through `body(i, acc) -> acc'`: sequential
/// in-place updates (the kernel then runs as one workgroup, see `backend::cpu`).
pub(super) fn scf_for<'c, 'a>(
    em: &Emitter<'c, 'a>,
    n: usize,
    init: Value<'c, 'a>,
    body: impl for<'b> FnOnce(&Ix<'c, 'b>, Value<'c, 'b>, Value<'c, 'b>) -> Result<Value<'c, 'b>>,
) -> Result<Value<'c, 'a>> {
    if n == 0 {
        return Ok(init);
    }
    let (ctx, loc) = (em.ctx, em.loc);
    let index = Type::index(ctx);
    let ty = init.r#type();
    let c = |v: usize| -> Result<Value<'c, 'a>> {
        Ok(push(
            em.block,
            op(
                ctx,
                loc,
                "arith.constant",
                &[],
                &[index],
                &[("value", parse_attr(ctx, &format!("{v} : index"))?)],
            )?,
        ))
    };
    let (lb, ub, step) = (c(0)?, c(n)?, c(1)?);
    let block = Block::new(&[(index, loc), (ty, loc)]);
    {
        let ix = Ix::new(ctx, loc, &block);
        let arg = |i: usize| -> Result<Value> {
            block.argument(i).map(Into::into).map_err(|e| err(e.to_string()))
        };
        let next = body(&ix, arg(0)?, arg(1)?)?;
        block.append_operation(op(ctx, loc, "scf.yield", &[next], &[], &[])?);
    }
    let region = Region::new();
    region.append_block(block);
    let f = OperationBuilder::new("scf.for", loc)
        .add_operands(&[lb, ub, step, init])
        .add_results(&[ty])
        .add_regions([region])
        .build()
        .map_err(|e| err(format!("building scf.for: {e}")))?;
    Ok(push(em.block, f))
}
