//! Control flow: If runs the branch its condition picks, on the captured values; Scan runs its
//! body once per position of the scanned inputs; Loop runs its body while its trip count and
//! condition allow.

use super::EvalOptions;
use crate::error::{invalid, OpError};
use crate::shape::normalize_axis;
use crate::{DType, Op, Tensor, Value};

/// If and Loop carry any value (a sequence through a branch or as loop state); Scan tensors.
/// `options` hold in the branches and bodies too.
pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Value>],
    options: &EvalOptions,
) -> Result<Vec<Value>, OpError> {
    match op {
        Op::If { then_branch, else_branch } => {
            if_(&then_branch.0, &else_branch.0, operands, options)
        }
        Op::Scan(s) => {
            let tensors: Vec<Option<&Tensor>> = operands
                .iter()
                .map(|o| o.map(Value::as_tensor).transpose())
                .collect::<Result<_, _>>()?;
            Ok(scan(s, &tensors, options)?.into_iter().map(Value::Tensor).collect())
        }
        Op::Loop(l) => loop_(l, operands, options),
        other => Err(invalid!("{} is not a control-flow op", other.name())),
    }
}

/// If: the branch the condition picks, on the captured values.
fn if_(
    then_branch: &crate::Graph,
    else_branch: &crate::Graph,
    operands: &[Option<&Value>],
    options: &EvalOptions,
) -> Result<Vec<Value>, OpError> {
    let cond =
        operands.first().copied().flatten().ok_or("the condition is missing")?.as_tensor()?;
    let taken = if cond.to_f64s().first().copied().unwrap_or(0.0) != 0.0 {
        then_branch
    } else {
        else_branch
    };
    let captured: Vec<Value> = operands[1..]
        .iter()
        .map(|o| o.cloned().ok_or("a captured value is missing"))
        .collect::<Result<_, _>>()?;
    crate::eval::run_values_with(taken, &captured, options).map_err(|e| OpError::Subgraph {
        what: format!("branch `{}`", taken.name),
        error: Box::new(e),
    })
}

fn scan(
    s: &crate::op::Scan,
    operands: &[Option<&Tensor>],
    options: &EvalOptions,
) -> Result<Vec<Tensor>, OpError> {
    let all: Vec<Tensor> = operands
        .iter()
        .map(|o| o.cloned().ok_or("a Scan operand is missing"))
        .collect::<Result<_, _>>()?;
    let states = s.states(all.len());
    let (captured, rest) = all.split_at(s.captures.min(all.len()));
    let (state, scanned) = rest.split_at(states);
    let mut state = state.to_vec();
    let mut axes = Vec::new();
    for (i, t) in scanned.iter().enumerate() {
        let (axis, reverse) = s.input(i);
        axes.push((
            normalize_axis(axis, t.rank())
                .ok_or_else(|| invalid!("scan axis {axis} is outside {}", t.ty()))?,
            reverse,
        ));
    }
    let length =
        scanned.first().map(|t| t.dims()[axes[0].0]).ok_or("a Scan needs a scanned input")?;
    let body = &s.body.0;
    let stacked = body.outputs().len().saturating_sub(states);
    let mut slices: Vec<Vec<Tensor>> = vec![Vec::with_capacity(length); stacked];
    for step in 0..length {
        let mut inputs: Vec<Tensor> = captured.to_vec();
        inputs.append(&mut state);
        for (t, &(axis, reverse)) in scanned.iter().zip(&axes) {
            inputs.push(
                t.index_axis(axis, if reverse { length - 1 - step } else { step })
                    .map_err(OpError::from)?,
            );
        }
        let mut out =
            crate::eval::run_with(body, &inputs, options).map_err(|e| OpError::Subgraph {
                what: format!("the body `{}`, step {step}", body.name),
                error: Box::new(e),
            })?;
        let rest = out.split_off(states.min(out.len()));
        state = out;
        for (k, t) in rest.into_iter().enumerate() {
            slices[k].push(t);
        }
    }
    let mut results = state;
    for (k, mut parts) in slices.into_iter().enumerate() {
        let (axis, reverse) = s.output(k);
        if reverse {
            parts.reverse();
        }
        // The slice's type from the body (a scan of length 0 has no slices to read it from).
        let ty = body.value_type(body.outputs()[states + k].1);
        let dims = match parts.first() {
            Some(p) => p.dims().to_vec(),
            None => ty
                .shape
                .as_fixed()
                .ok_or("a scan of length 0 whose result slices have no static shape")?,
        };
        let axis = normalize_axis(axis, dims.len() + 1)
            .ok_or_else(|| invalid!("stacking axis {axis} is outside rank {}", dims.len() + 1))?;
        results.push(Tensor::stack(ty.dtype, &dims, &parts, axis).map_err(OpError::from)?);
    }
    Ok(results)
}

fn loop_(
    l: &crate::op::Loop,
    operands: &[Option<&Value>],
    options: &EvalOptions,
) -> Result<Vec<Value>, OpError> {
    let c = l.captures;
    let body = &l.body.0;
    let captured: Vec<Value> = (0..c)
        .map(|i| operands.get(i).copied().flatten().cloned().ok_or("a captured value is missing"))
        .collect::<Result<_, _>>()?;
    let scalar = |i: usize| operands.get(i).copied().flatten().map(Value::as_tensor).transpose();
    let trip = scalar(c)?.map(|t| t.to_i64s().first().copied().unwrap_or(0));
    let mut cond =
        scalar(c + 1)?.and_then(|t| t.to_f64s().first().copied()).is_none_or(|v| v != 0.0);
    let mut state: Vec<Value> = operands
        .iter()
        .skip(c + 2)
        .map(|o| o.cloned().ok_or("a state value is missing"))
        .collect::<Result<_, _>>()?;
    let states = state.len();
    let stacked = body.outputs().len().saturating_sub(1 + states);
    let dims_of =
        |i: usize| body.node(body.inputs()[i]).outputs[0].shape.as_fixed().unwrap_or_default();
    let (step_dims, cond_dims) = (dims_of(c), dims_of(c + 1));
    let mut slices: Vec<Vec<Tensor>> = vec![Vec::new(); stacked];
    let mut step: i64 = 0;
    while cond && trip.is_none_or(|m| step < m) {
        // ONNX sets no limit (a Loop whose condition never turns false never ends); a user may.
        if let Some(limit) = options.max_loop_steps.filter(|&n| step as u64 >= n) {
            return Err(limit_reached(limit));
        }
        let mut inputs = captured.clone();
        inputs.push(Value::Tensor(
            Tensor::from_f64s(DType::I64, &step_dims, &[step as f64]).map_err(OpError::from)?,
        ));
        inputs.push(Value::Tensor(
            Tensor::from_f64s(DType::Bool, &cond_dims, &[1.0]).map_err(OpError::from)?,
        ));
        inputs.append(&mut state);
        let mut out = crate::eval::run_values_with(body, &inputs, options).map_err(|e| {
            OpError::Subgraph {
                what: format!("the body `{}`, step {step}", body.name),
                error: Box::new(e),
            }
        })?;
        if out.len() < 1 + states {
            return Err(invalid!(
                "the body gave {} results for the condition and {states} state values",
                out.len()
            ));
        }
        let rest = out.split_off(1 + states);
        cond = out[0].as_tensor()?.to_f64s().first().is_some_and(|&v| v != 0.0);
        state = out.split_off(1);
        for (k, t) in rest.into_iter().enumerate() {
            slices[k].push(t.into_tensor()?);
        }
        step += 1;
    }
    let mut results = state;
    for (k, parts) in slices.into_iter().enumerate() {
        // The slice's type from the body (a loop of no step has no slices to read it from).
        let ty = body.value_type(body.outputs()[1 + states + k].1);
        let dims = match parts.first() {
            Some(p) => p.dims().to_vec(),
            None => ty
                .shape
                .as_fixed()
                .ok_or("a loop of no step whose stacked results have no static shape")?,
        };
        results
            .push(Value::Tensor(Tensor::stack(ty.dtype, &dims, &parts, 0).map_err(OpError::from)?));
    }
    Ok(results)
}

/// Why a Loop stopped at `limit` steps (the error around it names the node).
fn limit_reached(limit: u64) -> OpError {
    OpError::StepLimit { limit }
}
