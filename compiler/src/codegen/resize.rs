//! Resize: the interpreter's separable passes (`kiln_ir::eval::resize_steps`), one per resized
//! axis, each a constant table of (input index, weight) taps per output position summed in f64
//! in the interpreter's order; so every mode, coordinate transformation, antialias and
//! extrapolation follows from the same geometry code. The result rounds to its type at the end
//! (integers half to even, then saturating, as the interpreter does).

use kiln_ir::{DType, NodeId, Op, Tensor, ValueId};
use melior::dialect::arith::{CmpfPredicate, CmpiPredicate};

use melior::ir::operation::OperationBuilder;
use melior::ir::{Block, BlockLike, Region, RegionLike, Type, Value};

use super::indexing::{const_tensor, copy_into_dest, Ix};
use super::mlir::{err, op, push};
use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let graph = em.graph;
    let Op::Resize(r) = &graph.node(id).op else {
        return Err(em.unsupported(id, "is not a Resize"));
    };
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
    // The plan holds taps per output position of each axis: bounded before it is made.
    for &size in &em.dims(ValueId::from(id)) {
        em.check_table(id, "taps along an axis", Some(size))?;
    }
    let (out, steps) = kiln_ir::eval::resize_steps(r, &xd, consts[0], consts[1], consts[2])
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
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
    // Tables [n_out, k] per pass: input index and weight per tap, zero weights for unused taps;
    // index -1 in the first column marks an extrapolated position.
    let mut passes = Vec::with_capacity(steps.len());
    for step in &steps {
        let n_out = step.taps.len();
        let k = step.taps.iter().map(|t| t.as_ref().map_or(1, Vec::len)).max().unwrap_or(1).max(1);
        em.check_table(id, "a tap table", n_out.checked_mul(k))?;
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
        let idx =
            const_tensor(em, &Tensor::from_vec(&[n_out, k], idx).map_err(|e| err(e.to_string()))?)?;
        let wts =
            const_tensor(em, &Tensor::from_vec(&[n_out, k], wts).map_err(|e| err(e.to_string()))?)?;
        passes.push(Pass { axis: step.axis, k, idx, wts, extrapolates });
    }
    let plan = Plan { src: em.value(x)?, src_dtype: em.ty(x).dtype, passes, extrapolation };
    let rank = od.len();
    super::indexing::over_output(em, result, &[], |ix, _| {
        let coords: Vec<Value> = (0..rank).map(|d| ix.loop_index(d)).collect::<Result<_>>()?;
        let mut v = value_at(&plan, ix, &coords, plan.passes.len())?;
        if !dtype.is_float() {
            v = ix.sb.emit("math.roundeven", &[v], "f64")?;
        }
        ix.store_f64(v, dtype)
    })
}

/// One resized axis: its tap tables.
struct Pass<'c, 'a> {
    axis: usize,
    k: usize,
    idx: Value<'c, 'a>,
    wts: Value<'c, 'a>,
    extrapolates: bool,
}

struct Plan<'c, 'a> {
    src: Value<'c, 'a>,
    src_dtype: DType,
    passes: Vec<Pass<'c, 'a>>,
    extrapolation: f64,
}

/// The value (f64) after the first `s` passes at `coords` (in that pass's output space). One
/// generic computes the whole result: each pass is a loop over its taps around the values of
/// the pass before, which is the interpreter's arithmetic, operation for operation, without
/// its intermediate tensors (and so without ops between which tiling would have to fuse).
fn value_at<'c, 'x>(
    plan: &Plan<'c, '_>,
    ix: &Ix<'c, 'x>,
    coords: &[Value<'c, 'x>],
    s: usize,
) -> Result<Value<'c, 'x>> {
    if s == 0 {
        let v = ix.extract(plan.src, coords, plan.src_dtype)?;
        return ix.to_f64(v, plan.src_dtype);
    }
    let p = &plan.passes[s - 1];
    let (ctx, loc) = (ix.sb.ctx, ix.sb.loc);
    let o = coords[p.axis];
    let index = Type::index(ctx);
    let f64t = ix.sb.ty("f64")?;
    let (lb, ub, step) = (ix.c(0)?, ix.c(p.k as i128)?, ix.c(1)?);
    let init = ix.sb.constant(-0.0, "f64")?;
    let body = Block::new(&[(index, loc), (f64t, loc)]);
    {
        let inner = Ix::new(ctx, loc, &body);
        let sb = &inner.sb;
        let arg = |i: usize| -> Result<Value> {
            body.argument(i).map(Into::into).map_err(|e| err(e.to_string()))
        };
        let (j, acc) = (arg(0)?, arg(1)?);
        let w = inner.extract(p.wts, &[o, j], DType::F64)?;
        let i = inner.extract(p.idx, &[o, j], DType::I64)?;
        // -1 (extrapolated) reads index 0; the value is replaced below.
        let i = sb.emit("arith.maxsi", &[i, sb.int_constant(0, "i64")?], "i64")?;
        let mut at: Vec<Value> = coords.to_vec();
        at[p.axis] = inner.i64_to_index(i)?;
        let v = value_at(plan, &inner, &at, s - 1)?;
        let term = sb.emit("arith.mulf", &[w, v], "f64")?;
        let sum = sb.emit("arith.addf", &[acc, term], "f64")?;
        // Zero weights are no taps (0 * inf would be NaN).
        let used = sb.cmpf(CmpfPredicate::Une, w, sb.constant(0.0, "f64")?)?;
        let next = sb.select(used, sum, acc, "f64")?;
        body.append_operation(op(ctx, loc, "scf.yield", &[next], &[], &[])?);
    }
    let region = Region::new();
    region.append_block(body);
    let f = OperationBuilder::new("scf.for", loc)
        .add_operands(&[lb, ub, step, init])
        .add_results(&[f64t])
        .add_regions([region])
        .build()
        .map_err(|e| err(format!("building scf.for: {e}")))?;
    let mut acc = push(ix.sb.block, f);
    if p.extrapolates {
        let first = ix.extract(p.idx, &[o, ix.c(0)?], DType::I64)?;
        let outside = ix.sb.cmpi(CmpiPredicate::Slt, first, ix.sb.int_constant(0, "i64")?)?;
        let e = ix.sb.constant(plan.extrapolation, "f64")?;
        acc = ix.sb.select(outside, e, acc, "f64")?;
    }
    Ok(acc)
}
