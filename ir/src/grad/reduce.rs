//! Gradients of ReduceSum, ReduceMean and ReduceSumSquare: the result gradient given back the
//! reduced axes and broadcast over them (divided by the count for the mean).

use super::{expand_like, rank, ty, Grads, RuleError, Step};
use crate::op::ReduceKind;
use crate::{normalize_axis, Op};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let Op::Reduce(r) = s.op else { return Err(RuleError::NoRule) };
    if !matches!(r.kind, ReduceKind::Sum | ReduceKind::Mean | ReduceKind::SumSquare) {
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
    if !r.keepdims && !axes.is_empty() {
        d = d.unsqueeze(&axes.iter().map(|&a| a as i64).collect::<Vec<_>>());
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
        _ => {}
    }
    Ok(vec![Some(dx)])
}
