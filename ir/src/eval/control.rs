//! Control flow: If runs the branch its condition picks, on the captured values.

use crate::{Op, Tensor};

pub(super) fn eval(op: &Op, operands: &[Option<&Tensor>]) -> Result<Vec<Tensor>, String> {
    let Op::If { then_branch, else_branch } = op else { unreachable!("dispatched by eval_op()") };
    let cond = operands.first().copied().flatten().ok_or("the condition is missing")?;
    let taken = if cond.to_f64s().first().copied().unwrap_or(0.0) != 0.0 { &then_branch.0 } else { &else_branch.0 };
    let captured: Vec<Tensor> = operands[1..].iter().map(|o| o.cloned().ok_or("a captured value is missing")).collect::<Result<_, _>>()?;
    crate::eval::run(taken, &captured).map_err(|e| format!("in branch `{}`: {e}", taken.name))
}
