//! MatMul, Gemm and Einsum as `linalg.generic` contractions: numpy batching and broadcasting
//! become indexing maps; f16/bf16 accumulate in f32; Gemm's alpha, beta and C are an epilogue.
//! An Einsum is one generic with a loop per label (result labels, then summed ones): a repeated
//! label reads a diagonal, a size-1 axis against a larger label broadcasts.

use kiln_ir::op::Gemm;
use kiln_ir::{DType, NodeId, Op, ValueId};

use super::mlir::{generic, push};
use super::scalar::{compute, ScalarBuilder};
use super::Emitter;
use crate::Result;
use melior::ir::BlockLike;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    match &em.graph.node(id).op {
        Op::MatMul => emit_matmul(em, id),
        Op::Gemm(g) => emit_gemm(em, id, g),
        Op::Einsum { equation } => einsum(em, id, equation),
        _ => Err(em.not_supported(id)),
    }
}

fn emit_matmul(em: &mut Emitter, id: NodeId) -> Result<()> {
    let operands = em.graph.operands(id);
    let (a, b) = (operands[0].expect("matmul a"), operands[1].expect("matmul b"));
    let result = ValueId::from(id);
    let dest = em.dest(result)?;
    let t = contract(em, a, b, false, false, result, dest)?;
    em.set(result, t);
    Ok(())
}

fn emit_gemm(em: &mut Emitter, id: NodeId, g: &Gemm) -> Result<()> {
    let operands = em.graph.operands(id);
    let (a, b) = (operands[0].expect("gemm a"), operands[1].expect("gemm b"));
    gemm(em, id, g, a, b, operands.get(2).copied().flatten())
}

/// The accumulator type of a contraction of `d` operands.
fn acc_type(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// `a @ b` (numpy matmul, optionally transposing 2-D operands) into a destination of `result`'s
/// shape; returns the result tensor.
fn contract<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    a: ValueId,
    b: ValueId,
    trans_a: bool,
    trans_b: bool,
    result: ValueId,
    dest: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let (ad, bd) = (em.dims(a), em.dims(b));
    let out_dims = em.dims(result);
    let dtype = em.ty(a).dtype;
    let acc = acc_type(dtype);
    // Loop dims: batch..., m, n, k; a 1-D left operand has no m, a 1-D right one no n.
    let a_vec = ad.len() == 1;
    let b_vec = bd.len() == 1;
    let batch = out_dims.len() - (!a_vec as usize) - (!b_vec as usize);
    let mut next = batch;
    let mut take = |present: bool| {
        present.then(|| {
            next += 1;
            next - 1
        })
    };
    let (m, n) = (take(!a_vec), take(!b_vec));
    let k = next;
    let nloops = k + 1;
    let d = |i: usize| format!("d{i}");
    let batch_map = |dims: &[usize]| -> Vec<String> {
        // Operand batch dims aligned right against the result's; size 1 broadcasts.
        let own = dims.len().saturating_sub(2);
        (0..own)
            .map(|i| {
                if dims[i] == 1 && out_dims[batch - own + i] != 1 {
                    "0".into()
                } else {
                    d(batch - own + i)
                }
            })
            .collect()
    };
    let mut a_idx = if a_vec { vec![] } else { batch_map(&ad) };
    match m {
        None => a_idx.push(d(k)),
        Some(m) if trans_a => a_idx.extend([d(k), d(m)]),
        Some(m) => a_idx.extend([d(m), d(k)]),
    }
    let mut b_idx = if b_vec { vec![] } else { batch_map(&bd) };
    match n {
        None => b_idx.push(d(k)),
        Some(n) if trans_b => b_idx.extend([d(n), d(k)]),
        Some(n) => b_idx.extend([d(k), d(n)]),
    }
    let mut o_idx: Vec<String> = (0..batch).map(d).collect();
    o_idx.extend(m.map(d));
    o_idx.extend(n.map(d));
    let all = (0..nloops).map(d).collect::<Vec<_>>().join(", ");
    let map = |idx: &[String]| format!("affine_map<({all}) -> ({})>", idx.join(", "));
    let maps = vec![map(&a_idx), map(&b_idx), map(&o_idx)];
    let mut iters = vec!["parallel"; k];
    iters.push("reduction");
    let (av, bv) = (em.value(a)?, em.value(b)?);
    let acc_dest = if acc == dtype { dest } else { em.empty(&out_dims, acc)? };
    let zero = em.scalar_constant(0.0, acc)?;
    let acc_ty = em.tensor_type(&out_dims, acc)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let filled = push(
        em.block,
        super::mlir::named_linalg(ctx, loc, "linalg.fill", &[zero], &[acc_dest], acc_ty, &[])?,
    );
    let g = generic(ctx, loc, &[av, bv], &[filled], &maps, &iters, &[acc_ty], |body| {
        let s = ScalarBuilder { ctx, loc, block: body };
        let x = s.load(body.argument(0).expect("a").into(), dtype)?;
        let y = s.load(body.argument(1).expect("b").into(), dtype)?;
        let o = body.argument(2).expect("acc").into();
        Ok(vec![multiply_add(&s, o, x.v, y.v, compute(acc))?])
    })?;
    let mut t = push(em.block, g);
    if acc != dtype {
        t = convert(em, t, &out_dims, acc, dtype, dest)?;
    }
    Ok(t)
}

/// `acc + a * b` in type `t`; floats may fuse into one FMA (`contract`), which vectorised
/// contractions need to reach the FMA units.
pub(super) fn multiply_add<'c, 'a>(
    s: &ScalarBuilder<'c, 'a>,
    acc: melior::ir::Value<'c, 'a>,
    a: melior::ir::Value<'c, 'a>,
    b: melior::ir::Value<'c, 'a>,
    t: &str,
) -> Result<melior::ir::Value<'c, 'a>> {
    if !t.starts_with('f') && !t.starts_with("bf") {
        let p = s.emit("arith.muli", &[a, b], t)?;
        return s.emit("arith.addi", &[acc, p], t);
    }
    let ty = s.ty(t)?;
    let contract = super::mlir::parse_attr(s.ctx, "#arith.fastmath<contract>")?;
    let p = push(
        s.block,
        super::mlir::op(s.ctx, s.loc, "arith.mulf", &[a, b], &[ty], &[("fastmath", contract)])?,
    );
    Ok(push(
        s.block,
        super::mlir::op(s.ctx, s.loc, "arith.addf", &[acc, p], &[ty], &[("fastmath", contract)])?,
    ))
}

/// `t` (dims, dtype `from`) converted elementwise to `to` into `dest`: accumulators narrowed to
/// the result type, operands widened to the compute type.
pub(super) fn convert<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    t: melior::ir::Value<'c, 'a>,
    dims: &[usize],
    from: DType,
    to: DType,
    dest: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let rank = dims.len();
    let id = super::mlir::broadcast_map(rank, dims, dims);
    let ty = em.tensor_type(dims, to)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let g = generic(
        ctx,
        loc,
        &[t],
        &[dest],
        &[id.clone(), id],
        &vec!["parallel"; rank],
        &[ty],
        |body| {
            let s = ScalarBuilder { ctx, loc, block: body };
            let x = s.load(body.argument(0).expect("acc").into(), from)?;
            let y = s.cast(x, to)?;
            Ok(vec![s.store(y)?])
        },
    )?;
    Ok(push(em.block, g))
}

fn gemm(
    em: &mut Emitter,
    id: NodeId,
    g: &Gemm,
    a: ValueId,
    b: ValueId,
    c: Option<ValueId>,
) -> Result<()> {
    let result = ValueId::from(id);
    let out_dims = em.dims(result);
    let dtype = em.ty(result).dtype;
    let plain = g.alpha == 1.0 && (c.is_none() || g.beta == 1.0) && acc_type(dtype) == dtype;
    if plain && c.is_none() {
        let dest = em.dest(result)?;
        let t = contract(em, a, b, g.trans_a, g.trans_b, result, dest)?;
        em.set(result, t);
        return Ok(());
    }
    // alpha * (a @ b) + beta * c, the products accumulated first.
    let scratch = em.empty(&out_dims, dtype)?;
    let ab = contract(em, a, b, g.trans_a, g.trans_b, result, scratch)?;
    let dest = em.dest(result)?;
    let rank = out_dims.len();
    let mut ins = vec![ab];
    let mut maps = vec![super::mlir::broadcast_map(rank, &out_dims, &out_dims)];
    if let Some(c) = c {
        ins.push(em.value(c)?);
        maps.push(super::mlir::broadcast_map(rank, &em.dims(c), &out_dims));
    }
    maps.push(super::mlir::broadcast_map(rank, &out_dims, &out_dims));
    let ty = em.tensor_type(&out_dims, dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let (alpha, beta) = (g.alpha as f64, g.beta as f64);
    let has_c = c.is_some();
    let e = generic(ctx, loc, &ins, &[dest], &maps, &vec!["parallel"; rank], &[ty], |body| {
        let s = ScalarBuilder { ctx, loc, block: body };
        let t = compute(dtype);
        let x = s.load(body.argument(0).expect("ab").into(), dtype)?;
        let float = dtype.is_float();
        let (mul, add) =
            if float { ("arith.mulf", "arith.addf") } else { ("arith.muli", "arith.addi") };
        let scale = |v, k: f64| -> Result<_> {
            if k == 1.0 {
                return Ok(v);
            }
            let kc = if float { s.constant(k, t)? } else { s.int_constant(k as i128, t)? };
            s.emit(mul, &[v, kc], t)
        };
        let mut v = scale(x.v, alpha)?;
        if has_c {
            let cv = s.load(body.argument(1).expect("c").into(), dtype)?;
            let cv = scale(cv.v, beta)?;
            v = s.emit(add, &[v, cv], t)?;
        }
        Ok(vec![s.store(super::scalar::Scalar { v, dtype })?])
    })?;
    let t = push(em.block, e);
    em.set(result, t);
    Ok(())
}

fn einsum(em: &mut Emitter, id: NodeId, equation: &str) -> Result<()> {
    let result = ValueId::from(id);
    let xs: Vec<ValueId> = em
        .graph
        .operands(id)
        .into_iter()
        .map(|o| o.ok_or_else(|| em.unsupported(id, "has a missing operand")))
        .collect::<Result<_>>()?;
    let dims: Vec<Vec<usize>> = xs.iter().map(|&v| em.dims(v)).collect();
    let shapes: Vec<kiln_ir::Shape> = dims.iter().map(|d| kiln_ir::Shape::fixed(d)).collect();
    let spec = kiln_ir::infer::EinsumSpec::new(equation, &shapes.iter().collect::<Vec<_>>())
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
    let sizes: Vec<usize> = spec
        .sizes
        .iter()
        .map(|d| d.fixed().ok_or_else(|| em.unsupported(id, "has a label of unknown size")))
        .collect::<Result<_>>()?;
    let summed: Vec<usize> = (0..sizes.len()).filter(|l| !spec.output.contains(l)).collect();
    // Loop k runs over label order[k].
    let order: Vec<usize> = spec.output.iter().chain(&summed).copied().collect();
    let n = order.len();
    let loop_of = |l: usize| order.iter().position(|&o| o == l).expect("every label has a loop");
    let all = (0..n).map(|i| format!("d{i}")).collect::<Vec<_>>().join(", ");
    let mut maps: Vec<String> = Vec::with_capacity(xs.len() + 1);
    for (labels, d) in spec.operands.iter().zip(&dims) {
        let e: Vec<String> = labels
            .iter()
            .zip(d)
            .map(
                |(&l, &size)| {
                    if size == sizes[l] {
                        format!("d{}", loop_of(l))
                    } else {
                        "0".to_string()
                    }
                },
            )
            .collect();
        maps.push(format!("affine_map<({all}) -> ({})>", e.join(", ")));
    }
    let out_idx: Vec<String> = (0..spec.output.len()).map(|i| format!("d{i}")).collect();
    maps.push(format!("affine_map<({all}) -> ({})>", out_idx.join(", ")));
    let mut iters = vec!["parallel"; spec.output.len()];
    iters.extend(vec!["reduction"; summed.len()]);
    let dtype = em.ty(result).dtype;
    let acc = acc_type(dtype);
    let out_dims = em.dims(result);
    let ins: Vec<_> = xs.iter().map(|&v| em.value(v)).collect::<Result<_>>()?;
    let dest = em.dest(result)?;
    let acc_dest = if acc == dtype { dest } else { em.empty(&out_dims, acc)? };
    let zero = em.scalar_constant(0.0, acc)?;
    let acc_ty = em.tensor_type(&out_dims, acc)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let filled = push(
        em.block,
        super::mlir::named_linalg(ctx, loc, "linalg.fill", &[zero], &[acc_dest], acc_ty, &[])?,
    );
    let k = ins.len();
    let g = generic(ctx, loc, &ins, &[filled], &maps, &iters, &[acc_ty], |body| {
        let s = ScalarBuilder { ctx, loc, block: body };
        let t = compute(acc);
        let (mul, add) = if acc.is_float() {
            ("arith.mulf", "arith.addf")
        } else {
            ("arith.muli", "arith.addi")
        };
        let mut p = s.cast(s.load(body.argument(0).expect("operand").into(), dtype)?, acc)?.v;
        for i in 1..k {
            let x = s.cast(s.load(body.argument(i).expect("operand").into(), dtype)?, acc)?.v;
            p = s.emit(mul, &[p, x], t)?;
        }
        let o = body.argument(k).expect("acc").into();
        Ok(vec![s.emit(add, &[o, p], t)?])
    })?;
    let mut t = push(em.block, g);
    if acc != dtype {
        t = convert(em, t, &out_dims, acc, dtype, dest)?;
    }
    em.set(result, t);
    Ok(())
}
