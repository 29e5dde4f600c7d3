//! Gradients of the data-movement ops. Views (Reshape, Flatten, Squeeze, Unsqueeze) reshape the
//! gradient back; Transpose applies the inverse permutation; Concat slices the gradient into its
//! operands' parts and Split concatenates its parts' gradients; Expand sums over the broadcast
//! axes. Slice and Gather, which pick elements, run once more on a tensor of element numbers of
//! the input (an "iota"): the result says where each picked element came from, and a
//! ScatterElements that adds sends the gradient there (a Gather may pick one element twice).

use super::{fixed_dims, reduce_to, reshape_like, ty, zeros_like, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::op::ScatterReduction;
use crate::{normalize_axis, Op, Tensor};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let x = s.input(0)?;
    match s.op {
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze => {
            let d = reshape_like(s.dy()?, x)?;
            Ok(vec![Some(d)])
        }
        Op::Transpose { perm } => {
            let r = ty(x)?.shape.rank();
            let perm: Vec<usize> =
                if perm.is_empty() { (0..r).rev().collect() } else { perm.clone() };
            let mut inverse = vec![0; r];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            Ok(vec![Some(s.dy()?.transpose(&inverse))])
        }
        Op::Expand => Ok(vec![Some(reduce_to(s.dy()?, &ty(x)?.shape)?)]),
        Op::Concat { axis } => {
            let dy = s.dy()?;
            let r = ty(x)?.shape.rank();
            let a = normalize_axis(*axis, r)
                .ok_or(RuleError::Unsupported { what: "an axis out of range" })?;
            let mut start = 0i64;
            let mut out = Vec::with_capacity(s.inputs.len());
            for (index, operand) in s.inputs.iter().enumerate() {
                let Some(v) = operand else {
                    out.push(None);
                    continue;
                };
                let t = ty(*v)?;
                let size = t.shape.dims()[a].fixed().ok_or_else(|| RuleError::NeedsFixedShape {
                    what: "the concatenation axis",
                    ty: Box::new(t.clone()),
                })? as i64;
                out.push(
                    s.needs(index).then(|| dy.slice(&[start], &[start + size], &[a as i64], &[1])),
                );
                start += size;
            }
            Ok(out)
        }
        Op::Split { axis, .. } => {
            // A part the loss does not use contributes zeros of its shape.
            let parts = s
                .grads
                .iter()
                .zip(&s.outputs)
                .map(|(d, y)| match d {
                    Some(d) => Ok(*d),
                    None => zeros_like(*y),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![Some(s.g.concat(&parts, *axis)), None])
        }
        Op::Slice | Op::Gather { .. } => {
            let dims = fixed_dims(x, "the input of a Slice or Gather")?;
            let count: usize = dims.iter().product();
            let numbers: Vec<i64> = (0..count as i64).collect();
            let iota = Tensor::from_vec(&dims, numbers).map_err(RuleError::Build)?;
            let mut operands = vec![Some(s.g.anon_constant(iota))];
            operands.extend(s.inputs.iter().skip(1).copied());
            let sources = s.g.apply(s.op.clone(), &operands, 1)[0];
            let flat = |t: Traced<'g>| t.reshape(&[-1]);
            let scatter = Op::ScatterElements { axis: 0, reduction: ScatterReduction::Add };
            let zeros = flat(zeros_like(x)?);
            let dy = flat(s.dy()?);
            let dx = s.g.apply(scatter, &[Some(zeros), Some(flat(sources)), Some(dy)], 1)[0];
            Ok(vec![Some(reshape_like(dx, x)?)])
        }
        _ => Err(RuleError::NoRule),
    }
}
