//! Generators: EyeLike, Range, ConstantOfShape. Each is one `linalg.generic` over its result
//! that computes every element from the loop indices (`indexing::over_output`).

use kiln_ir::{NodeId, Op, ValueId};
use melior::dialect::arith::CmpiPredicate;
use melior::ir::Value;

use super::indexing::over_output;
use super::mlir::{dims_list, err, op, push, storage_type};
use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let node = em.graph.node(id).clone();
    let operands = em.graph.operands(id);
    let result = ValueId::from(id);
    let arg = |i: usize| operands.get(i).copied().flatten();
    let need =
        |i: usize| arg(i).ok_or_else(|| err(format!("{} has no operand {i}", node.op.name())));
    let od = em.dims(result);
    let dtype = em.ty(result).dtype;
    match &node.op {
        Op::ConstantOfShape { value } => {
            let c = match value.dtype() {
                d if d.is_float() => {
                    em.scalar_constant(value.to_f64s().first().copied().unwrap_or(0.0), d)?
                }
                d => em.int_constant(value.to_i64s().first().copied().unwrap_or(0) as i128, d)?,
            };
            // A generic (not linalg.fill) so that it is split into workgroups like the others.
            let map = format!("affine_map<({}) -> ()>", dims_list(od.len()));
            over_output(em, result, &[(c, map)], |_, args| Ok(args[0]))
        }
        Op::Range => {
            let (start, delta) = (need(0)?, need(2)?);
            let (sv, dv) = (em.value(start)?, em.value(delta)?);
            let (sd, dd) = (em.dims(start).len(), em.dims(delta).len());
            let sdt = em.ty(start).dtype;
            over_output(em, result, &[], |ix, _| {
                let zeros = |r: usize| -> Result<Vec<Value>> { (0..r).map(|_| ix.c(0)).collect() };
                let s = ix.extract(sv, &zeros(sd)?, sdt)?;
                let d = ix.extract(dv, &zeros(dd)?, sdt)?;
                let i = ix.loop_index(0)?;
                if dtype.is_float() {
                    // start + i * delta in f64, rounded once, as the interpreter computes it.
                    let (s, d) = (ix.to_f64(s, dtype)?, ix.to_f64(d, dtype)?);
                    let i = ix.index_to_i64(i)?;
                    let fi = ix.sb.emit("arith.sitofp", &[i], "f64")?;
                    let v = ix.sb.emit("arith.mulf", &[fi, d], "f64")?;
                    let v = ix.sb.emit("arith.addf", &[s, v], "f64")?;
                    ix.store_f64(v, dtype)
                } else {
                    // Exact with wrap-around in the integer type.
                    let t = storage_type(dtype);
                    let i = push(
                        ix.sb.block,
                        op(ix.sb.ctx, ix.sb.loc, "arith.index_cast", &[i], &[ix.sb.ty(t)?], &[])?,
                    );
                    let v = ix.sb.emit("arith.muli", &[i, d], t)?;
                    ix.sb.emit("arith.addi", &[s, v], t)
                }
            })
        }
        Op::EyeLike { k, .. } => {
            let k = *k;
            over_output(em, result, &[], |ix, _| {
                let i = ix.index_to_i64(ix.loop_index(0)?)?;
                let j = ix.index_to_i64(ix.loop_index(1)?)?;
                // Ones where column - row == k (k may be any i64: compare, never add).
                let diag = ix.sb.emit("arith.subi", &[j, i], "i64")?;
                let kk = ix.sb.int_constant(k as i128, "i64")?;
                let on = ix.sb.cmpi(CmpiPredicate::Eq, diag, kk)?;
                let one = ix.one(dtype)?;
                let zero = ix.zero(dtype)?;
                ix.sb.select(on, one, zero, storage_type(dtype))
            })
        }
        _ => Err(em.not_supported(id)),
    }
}
