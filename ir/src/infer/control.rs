//! Control flow: If, Scan, Loop.

use super::{not_yet, Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::shape::normalize_axis;
use crate::{DType, Dim, Graph, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::If { then_branch, else_branch } => if_(&then_branch.0, &else_branch.0, ops, ctx),
        Op::Scan(s) => scan(s, ops),
        Op::Loop(l) => loop_(l, ops, ctx),
        _ => not_yet(op),
    }
}

/// `g` with its inputs given `types` (sizes a caller bound reach its results); `None` when they
/// are its types already.
fn specialised(g: &Graph, types: &[TensorType]) -> Result<Option<Graph>, OpError> {
    if g.inputs().len() != types.len() {
        return Err(invalid!(
            "`{}` takes {} values, {} are passed",
            g.name,
            g.inputs().len(),
            types.len()
        ));
    }
    for (i, (&id, have)) in g.inputs().iter().zip(types).enumerate() {
        let want = &g.node(id).outputs[0];
        if !want.accepts(have) {
            return Err(invalid!("`{}` reads value {i} as {want}, it is {have}", g.name));
        }
    }
    if g.inputs().iter().zip(types).all(|(&id, ty)| &g.node(id).outputs[0] == ty) {
        return Ok(None);
    }
    let mut s = g.clone();
    for (i, ty) in types.iter().enumerate() {
        s.set_input_type(i, ty.clone())
            .map_err(|e| OpError::Subgraph { what: format!("`{}`", g.name), error: Box::new(e) })?;
    }
    Ok(Some(s))
}

/// If: both branches typed by the captured values; each result what the branches agree on.
pub(super) fn if_(then_branch: &Graph, else_branch: &Graph, ops: &Operands, ctx: &Ctx) -> Infer {
    let (t, e) = (then_branch, else_branch);
    let cond = ops.get(0)?.ty;
    if cond.dtype != DType::Bool || cond.shape.numel() != Some(1) {
        return Err(invalid!("the condition must be one bool, got {cond}"));
    }
    let captures = ops.len() - 1;
    for (g, which) in [(t, "then"), (e, "else")] {
        if g.inputs().len() != captures {
            return Err(invalid!(
                "the {which} branch takes {} values, {captures} are passed",
                g.inputs().len()
            ));
        }
        for (i, &id) in g.inputs().iter().enumerate() {
            let want = &g.node(id).outputs[0];
            let have = ops.get(i + 1)?.ty;
            if !want.accepts(have) {
                return Err(invalid!("the {which} branch reads value {i} as {want}, it is {have}"));
            }
        }
    }
    // The branches as the operands' types specialise them (the sizes a caller bound reach the
    // branches' results).
    let types: Vec<TensorType> =
        (0..captures).map(|i| ops.get(i + 1).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
    let (ts, es) = (specialised(t, &types)?, specialised(e, &types)?);
    let (t, e) = (ts.as_ref().unwrap_or(t), es.as_ref().unwrap_or(e));
    if t.outputs().len() != e.outputs().len() {
        return Err(invalid!(
            "the branches have {} and {} results",
            t.outputs().len(),
            e.outputs().len()
        ));
    }
    // Each result: the branches' types merged (a size they disagree on is known at run time only).
    t.outputs()
        .iter()
        .zip(e.outputs())
        .enumerate()
        .map(|(i, ((_, a), (_, b)))| {
            let (a, b) = (t.value_type(*a), e.value_type(*b));
            a.merge(b, |d| fresh(ctx, i, d))
                .ok_or_else(|| invalid!("result {i} is {a} in one branch and {b} in the other"))
        })
        .collect()
}

fn fresh(ctx: &Ctx, result: usize, dim: usize) -> Dim {
    match ctx.fresh(dim) {
        Dim::Sym(s) if result > 0 => Dim::sym(&format!("{s}.r{result}")),
        d => d,
    }
}

/// The state keeps its types; each stacked result is the body's slice with the scan's length
/// inserted at its axis.
pub(super) fn scan(s: &crate::op::Scan, ops: &Operands) -> Infer {
    let n = ops.len();
    if n < s.captures + s.scan_inputs {
        return Err(invalid!(
            "{n} operands, but {} captured and {} scanned",
            s.captures,
            s.scan_inputs
        ));
    }
    let states = s.states(n);
    let mut types: Vec<TensorType> =
        (0..n).map(|i| ops.get(i).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
    let mut length: Option<Dim> = None;
    for i in 0..s.scan_inputs {
        let t = &mut types[s.captures + states + i];
        let (axis, _) = s.input(i);
        let a = normalize_axis(axis, t.rank())
            .ok_or_else(|| invalid!("scan axis {axis} is outside scanned input {i} ({t})"))?;
        let mut dims = t.shape.dims().to_vec();
        let l = dims.remove(a);
        match &length {
            Some(m) if m.fixed().is_some() && l.fixed().is_some() && *m != l => {
                return Err(invalid!("the scanned inputs have lengths {m} and {l}"));
            }
            None => length = Some(l),
            _ => {}
        }
        *t = TensorType::new(t.dtype, Shape(dims));
    }
    let body = &s.body.0;
    let spec = specialised(body, &types)?;
    let body = spec.as_ref().unwrap_or(body);
    let outs = body.outputs();
    if outs.len() < states || !s.lists_fit(outs.len() - states) {
        return Err(invalid!(
            "the body gives {} results for {states} state values, and the scan lists must name each scanned input and stacked result",
            outs.len()
        ));
    }
    let length = length.ok_or("a Scan needs a scanned input")?;
    let mut results = Vec::with_capacity(outs.len());
    for (k, (_, v)) in outs.iter().enumerate() {
        let t = body.value_type(*v).clone();
        if k < states {
            let have = &types[s.captures + k];
            if t.dtype != have.dtype || t.rank() != have.rank() {
                return Err(invalid!("state {k} goes in as {have} and comes out as {t}"));
            }
            results.push(t);
            continue;
        }
        let (axis, _) = s.output(k - states);
        let a = normalize_axis(axis, t.rank() + 1)
            .ok_or_else(|| invalid!("stacking axis {axis} is outside rank {}", t.rank() + 1))?;
        let mut dims = t.shape.dims().to_vec();
        dims.insert(a, length.clone());
        results.push(TensorType::new(t.dtype, Shape(dims)));
    }
    Ok(results)
}

/// The state keeps its types where every step agrees (a size the body changes is known at run
/// time only); each stacked result is the body's slice under a leading axis of the number of
/// steps, known when the trip count is a constant and the condition provably stays true (it
/// starts true or absent and the body passes it on or gives a constant true), or when the loop
/// provably runs no step.
pub(super) fn loop_(l: &crate::op::Loop, ops: &Operands, ctx: &Ctx) -> Infer {
    let (n, c) = (ops.len(), l.captures);
    let body = &l.body.0;
    let states = l.states(n);
    if body.inputs().len() != c + 2 + states {
        return Err(invalid!(
            "the body takes {} values, the Loop passes {c} captured, the step number, the condition and {states} state",
            body.inputs().len()
        ));
    }
    let one = |t: &TensorType, dtype: DType| t.dtype == dtype && t.shape.numel() == Some(1);
    let trip = ops.opt(c);
    if let Some(t) = trip.filter(|t| !one(t.ty, DType::I64)) {
        return Err(invalid!("the trip count must be one int64, got {}", t.ty));
    }
    let cond = ops.opt(c + 1);
    if let Some(t) = cond.filter(|t| !one(t.ty, DType::Bool)) {
        return Err(invalid!("the condition must be one bool, got {}", t.ty));
    }
    let mut types: Vec<TensorType> =
        (0..c).map(|i| ops.get(i).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
    let (step_ty, cond_ty) = (
        body.node(body.inputs()[c]).outputs[0].clone(),
        body.node(body.inputs()[c + 1]).outputs[0].clone(),
    );
    if !one(&step_ty, DType::I64) || !one(&cond_ty, DType::Bool) {
        return Err(invalid!("the body must take the step number as one int64 and the condition as one bool, it takes {step_ty} and {cond_ty}"));
    }
    types.extend([step_ty, cond_ty]);
    for k in 0..states {
        types.push(ops.get(c + 2 + k)?.ty.clone());
    }
    let spec = specialised(body, &types)?;
    let body = spec.as_ref().unwrap_or(body);
    let outs = body.outputs();
    if outs.len() < 1 + states {
        return Err(invalid!(
            "the body gives {} results, it must give the condition and {states} state values",
            outs.len()
        ));
    }
    let cond_out = body.value_type(outs[0].1);
    if !one(cond_out, DType::Bool) {
        return Err(invalid!(
            "the body's first result is the condition, one bool; it is {cond_out}"
        ));
    }
    let value = |o: Option<super::Operand>| {
        o.and_then(|o| o.value).and_then(|t| t.to_f64s().first().copied())
    };
    let starts = match cond {
        None => Some(true),
        Some(_) => value(cond).map(|v| v != 0.0),
    };
    let length = match (value(trip), starts) {
        (_, Some(false)) => Dim::Fixed(0),
        (Some(m), Some(true)) if m <= 0.0 => Dim::Fixed(0),
        (Some(m), Some(true)) if l.condition_stays_true() => Dim::Fixed(m as usize),
        _ => Dim::sym(&format!("{}.steps", ctx.node)),
    };
    let mut results = Vec::with_capacity(outs.len() - 1);
    for (k, (_, v)) in outs.iter().enumerate().skip(1) {
        let t = body.value_type(*v);
        if k <= states {
            let have = &types[c + 1 + k];
            // A state that goes in as an optional and comes out as a value is that value from the
            // first step on (ONNX's loops that start from an empty optional).
            let from = match (have.kind, t.kind) {
                (crate::Kind::Optional { .. }, k) if !matches!(k, crate::Kind::Optional { .. }) => {
                    have.element().unwrap_or_else(|| have.clone())
                }
                _ => have.clone(),
            };
            let merged = from.merge(t, |d| fresh(ctx, k, d)).ok_or_else(|| {
                invalid!("state {} goes in as {have} and comes out as {t}", k - 1)
            })?;
            // A sequence's length may change from step to step.
            results.push(match merged.kind {
                crate::Kind::Sequence { ranked, .. } => {
                    TensorType { kind: crate::Kind::Sequence { ranked, len: None }, ..merged }
                }
                _ => merged,
            });
            continue;
        }
        if !t.kind.is_tensor() {
            return Err(invalid!("a Loop stacks tensors, its body gives {t}"));
        }
        let mut dims = vec![length.clone()];
        dims.extend(t.shape.dims().iter().cloned());
        results.push(TensorType::new(t.dtype, Shape(dims)));
    }
    Ok(results)
}
