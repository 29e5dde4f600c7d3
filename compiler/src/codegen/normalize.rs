//! Normalisations: Softmax, LogSoftmax, Hardmax, LayerNormalization, BatchNormalization,
//! InstanceNormalization, GroupNormalization, RMSNormalization, LpNormalization,
//! MeanVarianceNormalization, LRN. Each is a few keepdims reductions (`reduce::reduce_generic`)
//! and elementwise passes (`reduce::map_generic`), the last writing the result, in f32 (f64 for
//! f64 tensors).

use kiln_ir::op::Lrn;
use kiln_ir::{normalize_axis, DType, NodeId, Op, ValueId};
use melior::dialect::arith::{CmpfPredicate, CmpiPredicate};
use melior::ir::{BlockLike, Value};

use super::mlir::{broadcast_map, dims_list, fill, generic, pad, push, reshape};
use super::reduce::scan::{affine, arg_best, loops_with};
use super::reduce::{acc_of, inputs, keep_map, map_generic, reduce_generic, Init};
use super::scalar::{compute, Scalar, ScalarBuilder};
use super::Emitter;
use crate::Result;

/// The normalised operand (floats only) and operands 1 and 2 when given.
fn float_input(em: &Emitter, id: NodeId) -> Result<(ValueId, Option<ValueId>, Option<ValueId>)> {
    let operands = em.graph.operands(id);
    let x = operands[0].ok_or_else(|| em.unsupported(id, "has no input"))?;
    let dt = em.ty(x).dtype;
    if !dt.is_float() {
        return Err(em.unsupported(id, &format!("on {dt} is not supported natively")));
    }
    let arg = |i: usize| operands.get(i).copied().flatten();
    Ok((x, arg(1), arg(2)))
}

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    match &em.graph.node(id).op {
        Op::Softmax { axis } => emit_softmax(em, id, *axis, false),
        Op::LogSoftmax { axis } => emit_softmax(em, id, *axis, true),
        Op::LayerNorm { axis, epsilon } => emit_layer_norm(em, id, *axis, *epsilon),
        Op::BatchNorm { epsilon } => emit_batch_norm(em, id, *epsilon),
        Op::Hardmax { axis } => emit_hardmax(em, id, *axis),
        Op::InstanceNorm { epsilon } => emit_instance_norm(em, id, *epsilon),
        Op::GroupNorm { num_groups, epsilon } => emit_group_norm(em, id, *num_groups, *epsilon),
        Op::RmsNorm { axis, epsilon } => emit_rms_norm(em, id, *axis, *epsilon),
        Op::LpNorm { axis, p } => emit_lp_norm(em, id, *axis, *p),
        Op::MeanVarianceNorm { axes } => emit_mean_variance_norm(em, id, axes),
        Op::Lrn(l) => emit_lrn(em, id, l),
        _ => Err(em.not_supported(id)),
    }
}

fn emit_softmax(em: &mut Emitter, id: NodeId, axis: i64, log: bool) -> Result<()> {
    let x = inputs(em, id)[0].expect("softmax has an input");
    softmax(em, id, x, axis, log)
}

fn emit_layer_norm(em: &mut Emitter, id: NodeId, axis: i64, epsilon: f32) -> Result<()> {
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

fn emit_batch_norm(em: &mut Emitter, id: NodeId, epsilon: f32) -> Result<()> {
    let o = inputs(em, id);
    batch_norm(
        em,
        id,
        o[0].expect("batchnorm input"),
        &o[1..5].iter().map(|o| o.expect("batchnorm params")).collect::<Vec<_>>(),
        epsilon,
    )
}

fn emit_hardmax(em: &mut Emitter, id: NodeId, axis: i64) -> Result<()> {
    let (x, _, _) = float_input(em, id)?;
    hardmax(em, id, x, axis)
}

fn emit_instance_norm(em: &mut Emitter, id: NodeId, epsilon: f32) -> Result<()> {
    let (x, scale, bias) = float_input(em, id)?;
    let c = em.dims(x).get(1).copied().ok_or_else(|| em.unsupported(id, "needs a channel axis"))?;
    group_norm(em, id, x, scale, bias, c, epsilon)
}

fn emit_group_norm(em: &mut Emitter, id: NodeId, num_groups: usize, epsilon: f32) -> Result<()> {
    let (x, scale, bias) = float_input(em, id)?;
    group_norm(em, id, x, scale, bias, num_groups, epsilon)
}

fn emit_rms_norm(em: &mut Emitter, id: NodeId, axis: i64, epsilon: f32) -> Result<()> {
    let (x, scale, _) = float_input(em, id)?;
    rms_norm(em, id, x, scale, axis, epsilon)
}

fn emit_lp_norm(em: &mut Emitter, id: NodeId, axis: i64, p: u32) -> Result<()> {
    let (x, _, _) = float_input(em, id)?;
    lp_norm(em, id, x, axis, p)
}

fn emit_mean_variance_norm(em: &mut Emitter, id: NodeId, axes: &[i64]) -> Result<()> {
    let (x, _, _) = float_input(em, id)?;
    mean_variance_norm(em, id, x, axes)
}

fn emit_lrn(em: &mut Emitter, id: NodeId, l: &Lrn) -> Result<()> {
    let (x, _, _) = float_input(em, id)?;
    lrn(em, id, x, l)
}

fn axis_of(em: &Emitter, id: NodeId, axis: i64, rank: usize) -> Result<usize> {
    normalize_axis(axis, rank).ok_or_else(|| em.unsupported(id, "has an axis out of range"))
}

/// A compute value of `acc` from a storage value of `dt`.
fn load_as<'c, 'b>(
    sb: &ScalarBuilder<'c, 'b>,
    v: Value<'c, 'b>,
    dt: DType,
    acc: DType,
) -> Result<Value<'c, 'b>> {
    Ok(sb.cast(sb.load(v, dt)?, acc)?.v)
}

/// A compute value of `acc` back to the storage type of `dt`.
fn store_as<'c, 'b>(
    sb: &ScalarBuilder<'c, 'b>,
    v: Value<'c, 'b>,
    acc: DType,
    dt: DType,
) -> Result<Value<'c, 'b>> {
    sb.store(sb.cast(Scalar { v, dtype: acc }, dt)?)
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

fn hardmax(em: &mut Emitter, id: NodeId, x: ValueId, axis: i64) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let rank = xd.len();
    let a = axis_of(em, id, axis, rank)?;
    let kd: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if i == a { 1 } else { d }).collect();
    let xv = em.value(x)?;
    let idx = em.empty(&kd, DType::I64)?;
    let km = keep_map(rank, &[a]);
    // The first maximum, NaN counting as the maximum (as numpy's argmax).
    let best = arg_best(em, xv, &xd, dt, a, false, true, false, idx, km.clone(), &kd)?;
    let dest = em.dest(result)?;
    let t = map_generic(em, &[(best, km)], &xd, dt, dest, |sb, v| {
        let j = sb.loop_index(a, "i64")?;
        let hit = sb.cmpi(CmpiPredicate::Eq, j, v[0])?;
        let t = compute(dt);
        let (one, zero) = (sb.constant(1.0, t)?, sb.constant(0.0, t)?);
        let y = sb.select(hit, one, zero, t)?;
        sb.store(Scalar { v: y, dtype: dt })
    })?;
    em.set(result, t);
    Ok(())
}

/// Group (and instance) normalisation: x [N, C, S...] is viewed as [N, G, C/G, S...] for the
/// statistics of each (n, g) slice; scale and bias are per channel.
fn group_norm(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    scale: Option<ValueId>,
    bias: Option<ValueId>,
    groups: usize,
    eps: f32,
) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let (scale, bias) = match (scale, bias) {
        (Some(s), Some(b)) => (s, b),
        _ => return Err(em.unsupported(id, "needs a scale and a bias")),
    };
    if xd.len() < 2 || groups == 0 || !xd[1].is_multiple_of(groups) {
        return Err(em.unsupported(id, "needs channels that split into the groups"));
    }
    if em.dims(scale) != [xd[1]] || em.dims(bias) != [xd[1]] {
        return Err(em.unsupported(id, "needs a scale and bias per channel"));
    }
    let cg = xd[1] / groups;
    let (ctx, loc) = (em.ctx, em.loc);
    // [N, C, S...] -> [N, G, Cg, S...]
    let mut gd = vec![xd[0], groups, cg];
    gd.extend_from_slice(&xd[2..]);
    let mut reassoc: Vec<Vec<usize>> = vec![vec![0], vec![1, 2]];
    reassoc.extend((3..gd.len()).map(|i| vec![i]));
    let xv = em.value(x)?;
    let xg = reshape(ctx, loc, em.block, true, xv, &reassoc, &gd, em.tensor_type(&gd, dt)?)?;
    let axes: Vec<usize> = (2..gd.len()).collect();
    let count: usize = gd[2..].iter().product();
    let acc = acc_of(dt);
    let tc = compute(acc);
    let (sum, sq) = moments(em, xg, &gd, dt, &axes, count)?;
    // The result pass runs over x's own dims (so its loops are the result's, as the workgroup
    // split expects), reading the group statistics at channel / Cg.
    let rank = xd.len();
    let dest = em.dest(result)?;
    let mut stat = vec!["d0".to_string(), format!("d1 floordiv {cg}")];
    stat.extend(vec!["0".to_string(); rank - 1]);
    let stat = affine(rank, &stat);
    let channel = affine(rank, &["d1".to_string()]);
    let (sv, bv) = (em.value(scale)?, em.value(bias)?);
    let (sdt, bdt) = (em.ty(scale).dtype, em.ty(bias).dtype);
    let ins = [
        (xv, broadcast_map(rank, &xd, &xd)),
        (sum, stat.clone()),
        (sq, stat),
        (sv, channel.clone()),
        (bv, channel),
    ];
    let n = count.max(1) as f64;
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let xv = load_as(sb, v[0], dt, acc)?;
        let cnt = sb.constant(n, tc)?;
        let mean = sb.emit("arith.divf", &[v[1], cnt], tc)?;
        let var = sb.emit("arith.divf", &[v[2], cnt], tc)?;
        let e = sb.constant(eps as f64, tc)?;
        let var = sb.emit("arith.addf", &[var, e], tc)?;
        let sd = sb.emit("math.sqrt", &[var], tc)?;
        let d = sb.emit("arith.subf", &[xv, mean], tc)?;
        let y = sb.emit("arith.divf", &[d, sd], tc)?;
        let s = load_as(sb, v[3], sdt, acc)?;
        let b = load_as(sb, v[4], bdt, acc)?;
        let y = sb.emit("arith.mulf", &[y, s], tc)?;
        let y = sb.emit("arith.addf", &[y, b], tc)?;
        store_as(sb, y, acc, dt)
    })?;
    em.set(result, t);
    Ok(())
}

/// The sum over `axes` and the sum of squared deviations from the mean (`sum / count`), both
/// keepdims-shaped in the accumulator type.
fn moments<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    x: Value<'c, 'a>,
    xd: &[usize],
    dt: DType,
    axes: &[usize],
    count: usize,
) -> Result<(Value<'c, 'a>, Value<'c, 'a>)> {
    let acc = acc_of(dt);
    let tc = compute(acc);
    let km = keep_map(xd.len(), axes);
    let sum = reduce_generic(em, x, xd, dt, axes, acc, Init::Float(0.0), &[], |sb, a, v, _| {
        sb.emit("arith.addf", &[a, v.v], tc)
    })?;
    let n = count.max(1) as f64;
    let sq = reduce_generic(
        em,
        x,
        xd,
        dt,
        axes,
        acc,
        Init::Float(0.0),
        &[(sum, km)],
        |sb, a, v, ex| {
            let cnt = sb.constant(n, tc)?;
            let mean = sb.emit("arith.divf", &[ex[0], cnt], tc)?;
            let d = sb.emit("arith.subf", &[v.v, mean], tc)?;
            let d2 = sb.emit("arith.mulf", &[d, d], tc)?;
            sb.emit("arith.addf", &[a, d2], tc)
        },
    )?;
    Ok((sum, sq))
}

/// `x / sqrt(mean(x^2 over axis..) + eps) * scale`, scale broadcast to x.
fn rms_norm(
    em: &mut Emitter,
    id: NodeId,
    x: ValueId,
    scale: Option<ValueId>,
    axis: i64,
    eps: f32,
) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let rank = xd.len();
    let a = axis_of(em, id, axis, rank)?;
    let scale = scale.ok_or_else(|| em.unsupported(id, "needs a scale"))?;
    let sd = em.dims(scale);
    if sd.len() > rank {
        return Err(em.unsupported(id, "has a scale of higher rank than its input"));
    }
    let axes: Vec<usize> = (a..rank).collect();
    let n = axes.iter().map(|&i| xd[i]).product::<usize>().max(1) as f64;
    let acc = acc_of(dt);
    let tc = compute(acc);
    let xv = em.value(x)?;
    let ss = reduce_generic(em, xv, &xd, dt, &axes, acc, Init::Float(0.0), &[], |sb, s, v, _| {
        let sq = sb.emit("arith.mulf", &[v.v, v.v], tc)?;
        sb.emit("arith.addf", &[s, sq], tc)
    })?;
    let sv = em.value(scale)?;
    let sdt = em.ty(scale).dtype;
    let dest = em.dest(result)?;
    let ins = [
        (xv, broadcast_map(rank, &xd, &xd)),
        (ss, keep_map(rank, &axes)),
        (sv, broadcast_map(rank, &sd, &xd)),
    ];
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let xv = load_as(sb, v[0], dt, acc)?;
        let cnt = sb.constant(n, tc)?;
        let ms = sb.emit("arith.divf", &[v[1], cnt], tc)?;
        let e = sb.constant(eps as f64, tc)?;
        let ms = sb.emit("arith.addf", &[ms, e], tc)?;
        let rms = sb.emit("math.sqrt", &[ms], tc)?;
        let y = sb.emit("arith.divf", &[xv, rms], tc)?;
        let s = load_as(sb, v[2], sdt, acc)?;
        let y = sb.emit("arith.mulf", &[y, s], tc)?;
        store_as(sb, y, acc, dt)
    })?;
    em.set(result, t);
    Ok(())
}

/// `x / ||x||_p` along the axis (p 1, else 2); a zero norm gives zeros.
fn lp_norm(em: &mut Emitter, id: NodeId, x: ValueId, axis: i64, p: u32) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let rank = xd.len();
    let a = axis_of(em, id, axis, rank)?;
    let acc = acc_of(dt);
    let tc = compute(acc);
    let l1 = p == 1;
    let xv = em.value(x)?;
    let s = reduce_generic(em, xv, &xd, dt, &[a], acc, Init::Float(0.0), &[], |sb, s, v, _| {
        let m = if l1 {
            sb.emit("math.absf", &[v.v], tc)?
        } else {
            sb.emit("arith.mulf", &[v.v, v.v], tc)?
        };
        sb.emit("arith.addf", &[s, m], tc)
    })?;
    let dest = em.dest(result)?;
    let ins = [(xv, broadcast_map(rank, &xd, &xd)), (s, keep_map(rank, &[a]))];
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let xv = load_as(sb, v[0], dt, acc)?;
        let norm = if l1 { v[1] } else { sb.emit("math.sqrt", &[v[1]], tc)? };
        let zero = sb.constant(0.0, tc)?;
        let is_zero = sb.cmpf(CmpfPredicate::Oeq, norm, zero)?;
        let y = sb.emit("arith.divf", &[xv, norm], tc)?;
        let y = sb.select(is_zero, zero, y, tc)?;
        store_as(sb, y, acc, dt)
    })?;
    em.set(result, t);
    Ok(())
}

/// `(x - mean) / (std + 1e-9)` with the statistics over `axes` (ONNX's function body).
fn mean_variance_norm(em: &mut Emitter, id: NodeId, x: ValueId, axes: &[i64]) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let rank = xd.len();
    let mut ax: Vec<usize> =
        axes.iter().map(|&a| axis_of(em, id, a, rank)).collect::<Result<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    let count: usize = ax.iter().map(|&i| xd[i]).product();
    let acc = acc_of(dt);
    let tc = compute(acc);
    let xv = em.value(x)?;
    let (sum, sq) = moments(em, xv, &xd, dt, &ax, count)?;
    let km = keep_map(rank, &ax);
    let dest = em.dest(result)?;
    let ins = [(xv, broadcast_map(rank, &xd, &xd)), (sum, km.clone()), (sq, km)];
    let n = count.max(1) as f64;
    let t = map_generic(em, &ins, &xd, dt, dest, |sb, v| {
        let xv = load_as(sb, v[0], dt, acc)?;
        let cnt = sb.constant(n, tc)?;
        let mean = sb.emit("arith.divf", &[v[1], cnt], tc)?;
        let var = sb.emit("arith.divf", &[v[2], cnt], tc)?;
        let sd = sb.emit("math.sqrt", &[var], tc)?;
        let e = sb.constant(1e-9, tc)?;
        let sd = sb.emit("arith.addf", &[sd, e], tc)?;
        let d = sb.emit("arith.subf", &[xv, mean], tc)?;
        let y = sb.emit("arith.divf", &[d, sd], tc)?;
        store_as(sb, y, acc, dt)
    })?;
    em.set(result, t);
    Ok(())
}

/// Local response normalisation across channels: the squares summed over the window
/// `[c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]` (the channel axis zero-padded so
/// every window lies inside), then `x / (bias + alpha / size * sum)^beta`.
fn lrn(em: &mut Emitter, id: NodeId, x: ValueId, l: &Lrn) -> Result<()> {
    let result = ValueId::from(id);
    let xd = em.dims(x);
    let dt = em.ty(x).dtype;
    let rank = xd.len();
    if rank < 2 || l.size == 0 {
        return Err(em.unsupported(id, "needs a channel axis and a positive size"));
    }
    let (before, after) = ((l.size - 1) / 2, l.size / 2);
    let acc = acc_of(dt);
    let tc = compute(acc);
    let (ctx, loc) = (em.ctx, em.loc);
    let xv = em.value(x)?;
    let mut padded_dims = xd.clone();
    padded_dims[1] += before + after;
    let mut low = vec![0i64; rank];
    let mut high = vec![0i64; rank];
    low[1] = before as i64;
    high[1] = after as i64;
    let zero = em.scalar_constant(0.0, dt)?;
    let xp = if before + after > 0 {
        pad(ctx, loc, em.block, xv, &low, &high, zero, em.tensor_type(&padded_dims, dt)?)?
    } else {
        xv
    };
    // Loops: the result position, then the window offset d{rank}; the shape-only window operand
    // gives that loop its extent.
    let n = rank + 1;
    let window = em.empty(&[l.size], dt)?;
    let init = em.scalar_constant(0.0, acc)?;
    let sums = em.empty(&xd, acc)?;
    let sums = fill(ctx, loc, em.block, init, sums)?;
    let maps = vec![
        affine(n, &loops_with(rank, 1, &format!("d1 + d{rank}"))),
        format!("affine_map<({}) -> (d{rank})>", dims_list(n)),
        affine(n, &loops_with(rank, rank, "")),
    ];
    let mut iters = vec!["parallel"; rank];
    iters.push("reduction");
    let ty = em.tensor_type(&xd, acc)?;
    let g = generic(ctx, loc, &[xp, window], &[sums], &maps, &iters, &[ty], |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let v = load_as(&sb, body.argument(0).expect("x").into(), dt, acc)?;
        let s = body.argument(2).expect("sum").into();
        let sq = sb.emit("arith.mulf", &[v, v], tc)?;
        Ok(vec![sb.emit("arith.addf", &[s, sq], tc)?])
    })?;
    let sums = push(em.block, g);
    let dest = em.dest(result)?;
    let id_map = broadcast_map(rank, &xd, &xd);
    let (alpha, beta, bias, size) = (l.alpha as f64, l.beta as f64, l.bias as f64, l.size as f64);
    let t = map_generic(em, &[(xv, id_map.clone()), (sums, id_map)], &xd, dt, dest, |sb, v| {
        let xv = load_as(sb, v[0], dt, acc)?;
        let k = sb.constant(alpha / size, tc)?;
        let b = sb.constant(bias, tc)?;
        let d = sb.emit("arith.mulf", &[v[1], k], tc)?;
        let d = sb.emit("arith.addf", &[d, b], tc)?;
        let e = sb.constant(beta, tc)?;
        let d = sb.emit("math.powf", &[d, e], tc)?;
        let y = sb.emit("arith.divf", &[xv, d], tc)?;
        store_as(sb, y, acc, dt)
    })?;
    em.set(result, t);
    Ok(())
}
