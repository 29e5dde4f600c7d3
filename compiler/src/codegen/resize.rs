//! Resize: the interpreter's separable passes (`kiln_ir::eval::resize_steps`), one
//! `linalg.generic` per resized axis. Each pass reads a constant table of (input index, weight)
//! taps per output position and sums them in f64 in the interpreter's order, so every mode,
//! coordinate transformation, antialias and extrapolation follows from the same geometry code.
//! Intermediate passes are f64 tensors; the last rounds to the result type (integers half to
//! even, then saturating, as the interpreter does).

use kiln_ir::{DType, NodeId, Op, Tensor, ValueId};

use super::indexing::{build_over, const_tensor, copy_into_dest};
use super::mlir::err;
use super::Emitter;
use crate::Result;
use melior::ir::Value;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let graph = em.graph;
    let Op::Resize(r) = &graph.node(id).op else { return Err(em.unsupported(id, "is not a Resize")) };
    let operands = graph.operands(id);
    let x = operands.first().copied().flatten().ok_or_else(|| err("Resize has no input"))?;
    let crop = r.coordinate_transform == kiln_ir::op::CoordinateTransform::TfCropAndResize;
    // roi, scales and sizes decide the geometry, so they must be constants by now (roi only
    // matters to tf_crop_and_resize).
    let mut consts: Vec<Option<&Tensor>> = Vec::with_capacity(3);
    for i in 1..4 {
        let c = match operands.get(i).copied().flatten() {
            None => None,
            Some(v) => match graph.constant_value(v) {
                Some(t) => Some(t),
                None if i == 1 && !crop => None,
                None if graph.value_type(v).shape.numel() == Some(0) => None,
                None => return Err(em.unsupported(id, "needs constant roi, scales and sizes")),
            },
        };
        consts.push(c);
    }
    let xd = em.dims(x);
    let (out, steps) = kiln_ir::eval::resize_steps(r, &xd, consts[0], consts[1], consts[2]).map_err(|e| em.unsupported(id, &e))?;
    let result = ValueId::from(id);
    let od = em.dims(result);
    if out != od {
        return Err(err(format!("Resize: the plan gives {out:?}, the result type {od:?}")));
    }
    let dtype = em.ty(result).dtype;
    if od.contains(&0) {
        let d = em.dest(result)?;
        em.set(result, d);
        return Ok(());
    }
    if steps.is_empty() {
        let t = copy_into_dest(em, x, result)?;
        em.set(result, t);
        return Ok(());
    }
    let extrapolation = r.extrapolation_value as f64;
    let mut cur = em.value(x)?;
    let mut cur_dt = em.ty(x).dtype;
    let mut dims = xd;
    for (s, step) in steps.iter().enumerate() {
        let last = s + 1 == steps.len();
        let axis = step.axis;
        let n_out = step.taps.len();
        let k = step.taps.iter().map(|t| t.as_ref().map_or(1, Vec::len)).max().unwrap_or(1).max(1);
        // Tables [n_out, k]: input index and weight per tap, zero weights for unused taps;
        // index -1 in the first column marks an extrapolated position.
        let mut idx = vec![0i64; n_out * k];
        let mut wts = vec![0f64; n_out * k];
        let mut extrapolates = false;
        for (o, tap) in step.taps.iter().enumerate() {
            match tap {
                None => {
                    idx[o * k] = -1;
                    extrapolates = true;
                }
                Some(tap) => {
                    for (j, &(i, w)) in tap.iter().enumerate() {
                        idx[o * k + j] = i as i64;
                        wts[o * k + j] = w;
                    }
                }
            }
        }
        let idx_t = const_tensor(em, &Tensor::from_vec(&[n_out, k], idx).map_err(|e| err(e.to_string()))?)?;
        let wts_t = const_tensor(em, &Tensor::from_vec(&[n_out, k], wts).map_err(|e| err(e.to_string()))?)?;
        let mut nd = dims.clone();
        nd[axis] = n_out;
        let out_dt = if last { dtype } else { DType::F64 };
        let dest = if last { em.dest(result)? } else { em.empty(&nd, DType::F64)? };
        let rank = nd.len();
        let (src, src_dt) = (cur, cur_dt);
        let t = build_over(em, &nd, out_dt, dest, &[], |ix, _| {
            let sb = &ix.sb;
            let coords: Vec<Value> = (0..rank).map(|d| ix.loop_index(d)).collect::<Result<_>>()?;
            let o = coords[axis];
            let zero_i = sb.int_constant(0, "i64")?;
            let zero_f = sb.constant(0.0, "f64")?;
            let mut acc = sb.constant(-0.0, "f64")?;
            for j in 0..k {
                let jj = ix.c(j as i128)?;
                let w = ix.extract(wts_t, &[o, jj], DType::F64)?;
                let i = ix.extract(idx_t, &[o, jj], DType::I64)?;
                let i = sb.emit("arith.maxsi", &[i, zero_i], "i64")?;
                let mut at = coords.clone();
                at[axis] = ix.i64_to_index(i)?;
                let v = ix.extract(src, &at, src_dt)?;
                let v = ix.to_f64(v, src_dt)?;
                let term = sb.emit("arith.mulf", &[w, v], "f64")?;
                let sum = sb.emit("arith.addf", &[acc, term], "f64")?;
                // Zero weights are no taps (0 * inf would be NaN).
                let used = sb.cmpf("une", w, zero_f)?;
                acc = sb.select(used, sum, acc, "f64")?;
            }
            if extrapolates {
                let first = ix.extract(idx_t, &[o, ix.c(0)?], DType::I64)?;
                let outside = sb.cmpi("slt", first, zero_i)?;
                let e = sb.constant(extrapolation, "f64")?;
                acc = sb.select(outside, e, acc, "f64")?;
            }
            if !last {
                return Ok(acc);
            }
            if !dtype.is_float() {
                acc = sb.emit("math.roundeven", &[acc], "f64")?;
            }
            ix.from_f64(acc, dtype)
        })?;
        cur = t;
        cur_dt = out_dt;
        dims = nd;
    }
    em.set(result, cur);
    Ok(())
}
