//! Control flow: If, Scan.

use super::{Ctx, Infer, Operands};
use crate::shape::normalize_axis;
use crate::{DType, Dim, Graph, Op, Shape, TensorType};

/// `g` with its inputs given `types` (sizes a caller bound reach its results); `None` when they
/// are its types already.
fn specialised(g: &Graph, types: &[TensorType]) -> Result<Option<Graph>, String> {
    if g.inputs().len() != types.len() {
        return Err(format!("`{}` takes {} values, {} are passed", g.name, g.inputs().len(), types.len()));
    }
    for (i, (&id, have)) in g.inputs().iter().zip(types).enumerate() {
        let want = &g.node(id).outputs[0];
        if want.dtype != have.dtype || want.rank() != have.rank() {
            return Err(format!("`{}` reads value {i} as {want}, it is {have}", g.name));
        }
    }
    if g.inputs().iter().zip(types).all(|(&id, ty)| &g.node(id).outputs[0] == ty) {
        return Ok(None);
    }
    let mut s = g.clone();
    for (i, ty) in types.iter().enumerate() {
        s.set_input_type(i, ty.clone()).map_err(|e| format!("in `{}`: {e}", g.name))?;
    }
    Ok(Some(s))
}

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    if let Op::Scan(s) = op {
        return scan(s, ops);
    }
    let Op::If { then_branch, else_branch } = op else { unreachable!("dispatched by infer()") };
    let (t, e) = (&then_branch.0, &else_branch.0);
    let cond = ops.get(0)?.ty;
    if cond.dtype != DType::Bool || cond.shape.numel() != Some(1) {
        return Err(format!("the condition must be one bool, got {cond}"));
    }
    let captures = ops.len() - 1;
    for (g, which) in [(t, "then"), (e, "else")] {
        if g.inputs().len() != captures {
            return Err(format!("the {which} branch takes {} values, {captures} are passed", g.inputs().len()));
        }
        for (i, &id) in g.inputs().iter().enumerate() {
            let want = &g.node(id).outputs[0];
            let have = ops.get(i + 1)?.ty;
            if want.dtype != have.dtype || want.rank() != have.rank() {
                return Err(format!("the {which} branch reads value {i} as {want}, it is {have}"));
            }
        }
    }
    // The branches as the operands' types specialise them (the sizes a caller bound reach the
    // branches' results).
    let types: Vec<TensorType> = (0..captures).map(|i| ops.get(i + 1).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
    let (ts, es) = (specialised(t, &types)?, specialised(e, &types)?);
    let (t, e) = (ts.as_ref().unwrap_or(t), es.as_ref().unwrap_or(e));
    if t.outputs().len() != e.outputs().len() {
        return Err(format!("the branches have {} and {} results", t.outputs().len(), e.outputs().len()));
    }
    // Each result: the branches' types merged (a size they disagree on is known at run time only).
    t.outputs()
        .iter()
        .zip(e.outputs())
        .enumerate()
        .map(|(i, ((_, a), (_, b)))| {
            let (a, b) = (t.value_type(*a), e.value_type(*b));
            if a.dtype != b.dtype || a.rank() != b.rank() {
                return Err(format!("result {i} is {a} in one branch and {b} in the other"));
            }
            let dims =
                a.shape.dims().iter().zip(b.shape.dims()).enumerate().map(|(d, (x, y))| if x == y { x.clone() } else { fresh(ctx, i, d) }).collect();
            Ok(TensorType::new(a.dtype, Shape(dims)))
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
fn scan(s: &crate::op::Scan, ops: &Operands) -> Infer {
    let n = ops.len();
    if n < s.captures + s.scan_inputs {
        return Err(format!("{n} operands, but {} captured and {} scanned", s.captures, s.scan_inputs));
    }
    let states = s.states(n);
    let mut types: Vec<TensorType> = (0..n).map(|i| ops.get(i).map(|o| o.ty.clone())).collect::<Result<_, _>>()?;
    let mut length: Option<Dim> = None;
    for i in 0..s.scan_inputs {
        let t = &mut types[s.captures + states + i];
        let (axis, _) = s.input(i);
        let a = normalize_axis(axis, t.rank()).ok_or_else(|| format!("scan axis {axis} is outside scanned input {i} ({t})"))?;
        let mut dims = t.shape.dims().to_vec();
        let l = dims.remove(a);
        match &length {
            Some(m) if m.fixed().is_some() && l.fixed().is_some() && *m != l => {
                return Err(format!("the scanned inputs have lengths {m} and {l}"));
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
        return Err(format!(
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
                return Err(format!("state {k} goes in as {have} and comes out as {t}"));
            }
            results.push(t);
            continue;
        }
        let (axis, _) = s.output(k - states);
        let a = normalize_axis(axis, t.rank() + 1).ok_or_else(|| format!("stacking axis {axis} is outside rank {}", t.rank() + 1))?;
        let mut dims = t.shape.dims().to_vec();
        dims.insert(a, length.clone());
        results.push(TensorType::new(t.dtype, Shape(dims)));
    }
    Ok(results)
}
