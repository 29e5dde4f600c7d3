//! Gradients of the elementwise ops: arithmetic with broadcasting (each operand's gradient summed
//! back over the axes it was broadcast along) and the activations.

use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

use super::{reduce_to, ty, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::{BinaryOp, Op, UnaryOp};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match s.op {
        Op::Unary(u) => Ok(vec![Some(unary(*u, s.input(0)?, s.outputs[0], s.dy()?)?)]),
        Op::Binary(b) => binary(*b, s),
        Op::Identity => Ok(vec![Some(s.dy()?)]),
        Op::Cast { to, .. } => {
            // Between float types the gradient is cast back; from an integer there is none.
            let from = ty(s.input(0)?)?.dtype;
            if !(from.is_float() && to.is_float()) {
                return Err(RuleError::Unsupported { what: "a Cast to or from a non-float type" });
            }
            Ok(vec![Some(s.dy()?.cast(from))])
        }
        Op::Clip => {
            // The gradient passes where x is within the bounds (both included, as PyTorch's
            // clamp); the bounds' own gradients are not written.
            if s.needs(1) || s.needs(2) {
                return Err(RuleError::Unsupported { what: "a gradient of Clip's bounds" });
            }
            let (x, dy) = (s.input(0)?, s.dy()?);
            let mut d = dy;
            let zero = dy.scalar(0.0);
            if let Some(lo) = s.inputs.get(1).copied().flatten() {
                d = x.binary(BinaryOp::GreaterOrEqual, lo).select(d, zero);
            }
            if let Some(hi) = s.inputs.get(2).copied().flatten() {
                d = x.binary(BinaryOp::LessOrEqual, hi).select(d, zero);
            }
            Ok(vec![Some(d), None, None])
        }
        Op::Where => {
            // `cond ? x : y`: the gradient goes to the branch each element was taken from.
            let (cond, dy) = (s.input(0)?, s.dy()?);
            let zero = dy.scalar(0.0);
            let mut out = vec![None];
            for (index, taken) in [(1, true), (2, false)] {
                if !s.needs(index) {
                    out.push(None);
                    continue;
                }
                let d = if taken { cond.select(dy, zero) } else { cond.select(zero, dy) };
                out.push(Some(reduce_to(d, &ty(s.input(index)?)?.shape)?));
            }
            Ok(out)
        }
        _ => Err(RuleError::NoRule),
    }
}

/// `dx` for `y = u(x)` with result gradient `dy`.
fn unary<'g>(
    u: UnaryOp,
    x: Traced<'g>,
    y: Traced<'g>,
    dy: Traced<'g>,
) -> Result<Traced<'g>, RuleError> {
    let c = |v: f64| x.scalar(v);
    Ok(match u {
        UnaryOp::Neg => dy.neg(),
        UnaryOp::Exp => dy.mul(y),
        UnaryOp::Log => dy.div(x),
        UnaryOp::Sqrt => dy.div(y.mul(c(2.0))),
        // d(1/x) = -1/x² = -y².
        UnaryOp::Reciprocal => dy.mul(y).mul(y).neg(),
        // d(x^-1/2) = -1/2 x^-3/2 = -y³/2.
        UnaryOp::Rsqrt => dy.mul(y).mul(y).mul(y).mul(c(-0.5)),
        UnaryOp::Abs => dy.mul(x.unary(UnaryOp::Sign)),
        // At 0 the subgradient 0 is taken, as PyTorch does.
        UnaryOp::Relu => x.greater(c(0.0)).select(dy, c(0.0)),
        UnaryOp::LeakyRelu { alpha } => x.greater(c(0.0)).select(dy, dy.mul(c(f64::from(alpha)))),
        UnaryOp::Sigmoid => dy.mul(y).mul(c(1.0).sub(y)),
        // y = x s, s = sigmoid(a x): dy/dx = s + a x s (1 - s) (SiLU at a = 1; the compiler's
        // `recognize` writes x * sigmoid(x) so).
        UnaryOp::Swish { alpha } => {
            let a = f64::from(alpha);
            let s = x.mul(c(a)).sigmoid();
            dy.mul(s.add(x.mul(c(a)).mul(s).mul(c(1.0).sub(s))))
        }
        // y = x clamp(x/6 + 1/2, 0, 1): x/3 + 1/2 on [-3, 3], 1 above, 0 below (as PyTorch).
        UnaryOp::HardSwish => {
            let inside = dy.mul(x.mul(c(1.0 / 3.0)).add(c(0.5)));
            let upper = x.greater(c(3.0)).select(dy, inside);
            x.less(c(-3.0)).select(c(0.0), upper)
        }
        UnaryOp::Tanh => dy.mul(c(1.0).sub(y.mul(y))),
        // d erf(x) = 2/√π e^(-x²).
        UnaryOp::Erf => dy.mul(x.mul(x).neg().exp()).mul(c(FRAC_2_SQRT_PI)),
        UnaryOp::Gelu { tanh: false } => {
            // y = x Φ(x): dy/dx = Φ(x) + x φ(x), Φ(x) = (1 + erf(x/√2))/2, φ(x) = e^(-x²/2)/√(2π).
            let cdf = x.div(c(SQRT_2)).erf().add(c(1.0)).mul(c(0.5));
            let pdf = x.mul(x).mul(c(-0.5)).exp().mul(c(1.0 / (2.0 * PI).sqrt()));
            dy.mul(cdf.add(x.mul(pdf)))
        }
        UnaryOp::Gelu { tanh: true } => {
            // y = x/2 (1 + tanh u), u = √(2/π)(x + 0.044715 x³):
            // dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh² u) √(2/π)(1 + 3 · 0.044715 x²).
            let k = (2.0 / PI).sqrt();
            let x2 = x.mul(x);
            let t = x.add(x2.mul(x).mul(c(0.044_715))).mul(c(k)).tanh();
            let du = x2.mul(c(3.0 * 0.044_715)).add(c(1.0)).mul(c(k));
            let left = t.add(c(1.0)).mul(c(0.5));
            let right = x.mul(c(0.5)).mul(c(1.0).sub(t.mul(t))).mul(du);
            dy.mul(left.add(right))
        }
        _ => return Err(RuleError::NoRule),
    })
}

fn binary<'g>(b: BinaryOp, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (a, x, y, dy) = (s.input(0)?, s.input(1)?, s.outputs[0], s.dy()?);
    // The gradients of `a` and `b` before they are summed back to their shapes.
    let (da, db): (Option<Traced<'g>>, Option<Traced<'g>>) = match b {
        BinaryOp::Add => (Some(dy), Some(dy)),
        BinaryOp::Sub => (Some(dy), Some(dy.neg())),
        BinaryOp::Mul => (Some(dy.mul(x)), Some(dy.mul(a))),
        // d(a/b)/db = -a/b² = -y/b.
        BinaryOp::Div => (Some(dy.div(x)), Some(dy.mul(y).div(x).neg())),
        BinaryOp::Pow => {
            // d(a^b)/da = b a^(b-1); d(a^b)/db = a^b ln a (for a > 0). An integer exponent is cast
            // to the base's type first.
            let dtype = ty(a)?.dtype;
            let e = if ty(x)?.dtype == dtype { x } else { x.cast(dtype) };
            let da = s.needs(0).then(|| dy.mul(e).mul(a.pow(e.sub(e.scalar(1.0)))));
            let db = s.needs(1).then(|| dy.mul(y).mul(a.log()));
            (da, db)
        }
        BinaryOp::Max | BinaryOp::Min => {
            // The gradient goes to the operand taken (to `a` on a tie).
            let op =
                if b == BinaryOp::Max { BinaryOp::GreaterOrEqual } else { BinaryOp::LessOrEqual };
            let a_taken = a.binary(op, x);
            let zero = dy.scalar(0.0);
            (Some(a_taken.select(dy, zero)), Some(a_taken.select(zero, dy)))
        }
        _ => return Err(RuleError::NoRule),
    };
    let mut out = Vec::with_capacity(2);
    for (index, d) in [(0, da), (1, db)] {
        out.push(match (s.needs(index), d) {
            (true, Some(d)) => Some(reduce_to(d, &ty(s.input(index)?)?.shape)?),
            _ => None,
        });
    }
    Ok(out)
}
