//! Gradients of MatMul (batched, broadcast, 1-D operands promoted as numpy does) and Gemm.

use super::{rank, reduce_to, ty, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::Op;

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match s.op {
        Op::MatMul => matmul(s),
        Op::Gemm(gemm) => {
            let (a, b, dy) = (s.input(0)?, s.input(1)?, s.dy()?);
            let scaled =
                |t: Traced<'g>, k: f32| if k == 1.0 { t } else { t.mul(t.scalar(k.into())) };
            let t = |v: Traced<'g>| v.transpose(&[1, 0]);
            // Y = alpha A' B' + beta C with A' = A or Aᵀ, B' = B or Bᵀ: dA' = alpha dY B'ᵀ and
            // dB' = alpha A'ᵀ dY, transposed back where A or B was.
            let da = s.needs(0).then(|| {
                let b_t = if gemm.trans_b { b } else { t(b) };
                let d = dy.matmul(b_t);
                scaled(if gemm.trans_a { t(d) } else { d }, gemm.alpha)
            });
            let db = s.needs(1).then(|| {
                let a_t = if gemm.trans_a { a } else { t(a) };
                let d = a_t.matmul(dy);
                scaled(if gemm.trans_b { t(d) } else { d }, gemm.alpha)
            });
            let dc = match (s.needs(2), s.inputs.get(2).copied().flatten()) {
                (true, Some(c)) => Some(reduce_to(scaled(dy, gemm.beta), &ty(c)?.shape)?),
                _ => None,
            };
            Ok(vec![da, db, dc])
        }
        _ => Err(RuleError::NoRule),
    }
}

/// The last two axes swapped.
fn transpose_last<'g>(t: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    let r = rank(t)?;
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    Ok(t.transpose(&perm))
}

/// dA = dY Bᵀ and dB = Aᵀ dY on the operands promoted to matrices (a 1-D A as a row, a 1-D B as
/// a column, dY given the axes they lost), each summed over the batch axes it was broadcast along,
/// then the promoted axis removed again.
fn matmul<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (a, b, dy) = (s.input(0)?, s.input(1)?, s.dy()?);
    let (ra, rb) = (rank(a)?, rank(b)?);
    let a2 = if ra == 1 { a.unsqueeze(&[0]) } else { a };
    let b2 = if rb == 1 { b.unsqueeze(&[1]) } else { b };
    let mut dy2 = dy;
    if ra == 1 {
        // dY lost A's row axis, the second-to-last of the product.
        let r = rank(dy2)? as i64;
        dy2 = dy2.unsqueeze(&[if rb == 1 { r } else { r - 1 }]);
    }
    if rb == 1 {
        dy2 = dy2.unsqueeze(&[rank(dy2)? as i64]);
    }
    let da = if s.needs(0) {
        let d = reduce_to(dy2.matmul(transpose_last(b2)?), &ty(a2)?.shape)?;
        Some(if ra == 1 { d.squeeze(&[0]) } else { d })
    } else {
        None
    };
    let db = if s.needs(1) {
        let d = reduce_to(transpose_last(a2)?.matmul(dy2), &ty(b2)?.shape)?;
        Some(if rb == 1 { d.squeeze(&[1]) } else { d })
    } else {
        None
    };
    Ok(vec![da, db])
}
