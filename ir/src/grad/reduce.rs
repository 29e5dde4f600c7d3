//! Gradients of the reductions: the result gradient given back the reduced axes and broadcast
//! over them, then scaled per element: by 1/count for the mean, 2x for the sum of squares,
//! sign(x) for L1, x/y for L2, 1/Σx for LogSum, exp(x - y) for LogSumExp, and for Max and Min
//! shared equally among the elements equal to the result (PyTorch's amax/amin). ReduceProd has
//! none: y/x is wrong where x is zero, and the exact product of the others is not built.

use super::{expand_like, rank, ty, Grads, RuleError, Step};
use crate::op::ReduceKind;
use crate::{normalize_axis, BinaryOp, Op, UnaryOp};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let Op::Reduce(r) = s.op else { return Err(RuleError::NoRule) };
    if r.kind == ReduceKind::Prod {
        return Err(RuleError::NoRule);
    }
    let (x, dy) = (s.input(0)?, s.dy()?);
    let n = rank(x)?;
    let listed = match s.inputs.get(1).copied().flatten() {
        Some(_) => s.constant_ints(1)?,
        None => Vec::new(),
    };
    let axes: Vec<usize> = if listed.is_empty() {
        if r.noop_with_empty_axes {
            // Nothing reduced: the op is the identity (or squares, for SumSquare).
            (0..0).collect()
        } else {
            (0..n).collect()
        }
    } else {
        let mut a = listed
            .iter()
            .map(|&a| normalize_axis(a, n))
            .collect::<Option<Vec<usize>>>()
            .ok_or(RuleError::Unsupported { what: "an axis out of range" })?;
        a.sort_unstable();
        a.dedup();
        a
    };
    let mut d = dy;
    // The result with the reduced axes kept, for the rules that read it.
    let mut y = s.outputs[0];
    if !r.keepdims && !axes.is_empty() {
        let kept = axes.iter().map(|&a| a as i64).collect::<Vec<_>>();
        d = d.unsqueeze(&kept);
        y = y.unsqueeze(&kept);
    }
    let mut dx = expand_like(d, x)?;
    match r.kind {
        ReduceKind::Mean => {
            let t = ty(x)?;
            let count: Option<usize> = axes.iter().map(|&a| t.shape.dims()[a].fixed()).product();
            let count = count.ok_or_else(|| RuleError::NeedsFixedShape {
                what: "the reduced axes",
                ty: Box::new(t.clone()),
            })?;
            dx = dx.div(dx.scalar(count as f64));
        }
        ReduceKind::SumSquare => dx = dx.mul(x).mul(x.scalar(2.0)),
        ReduceKind::L1 => dx = dx.mul(x.unary(UnaryOp::Sign)),
        // A zero norm has every x zero: PyTorch gives them 0, not 0/0.
        ReduceKind::L2 => {
            let zero = y.binary(BinaryOp::Equal, y.scalar(0.0));
            dx = zero.select(x.scalar(0.0), dx.mul(x).div(y));
        }
        ReduceKind::LogSum => dx = dx.div(y.exp()),
        ReduceKind::LogSumExp => dx = dx.mul(x.sub(y).exp()),
        ReduceKind::Max | ReduceKind::Min => {
            let dt = ty(x)?.dtype;
            let at = x.binary(BinaryOp::Equal, y).cast(dt);
            let kept: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let ties = if kept.is_empty() { at } else { at.reduce_sum(&kept, true) };
            dx = dx.mul(at).div(ties);
        }
        ReduceKind::Sum | ReduceKind::Prod => {}
    }
    Ok(vec![Some(dx)])
}
