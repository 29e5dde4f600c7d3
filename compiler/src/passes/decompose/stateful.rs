//! The state-carrying ops of recurrent language models as existing ops, step for step as
//! `kiln_ir::eval::sequence` computes them: CausalConvWithState as Concat / grouped Conv /
//! elementwise / Slice.

use kiln_ir::op::{CausalActivation, Conv, Window};
use kiln_ir::{NodeId, Op, UnaryOp, ValueId};

use super::{compute_type, Emit};
use crate::Result;

/// `(x, weight, bias?, past_state?) -> (y, present_state)`: the past (or zeros) joined before x,
/// a depthwise Conv without padding over that, the activation, and the joined sequence's last
/// k - 1 positions as the new state.
pub(super) fn causal_conv(
    e: &mut Emit,
    id: NodeId,
    activation: CausalActivation,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(w)) = (operand(0), operand(1)) else { return Ok(None) };
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let [batch, channels, len]: [usize; 3] = match e.dims(x)?.try_into() {
        Ok(d) => d,
        Err(_) => return Ok(None),
    };
    let k = e.dims(w)?[2];
    if k == 0 {
        return Ok(None);
    }
    let padded = match (operand(3), k) {
        (_, 1) => x,
        (Some(past), _) => e.concat("padded", &[past, x], 2)?,
        (None, _) => {
            let zeros = e.full("zero_state", dt, &[batch, channels, k - 1], 0.0)?;
            e.concat("padded", &[zeros, x], 2)?
        }
    };
    let conv_in = e.cast("padded_compute", padded, cd)?;
    let weight = e.cast("weight_compute", w, cd)?;
    let bias = match operand(2) {
        Some(b) => Some(e.cast("bias_compute", b, cd)?),
        None => None,
    };
    let conv = Op::Conv(Conv { window: Window::unit(1), group: channels });
    let y = e.op("conv", conv, &[Some(conv_in), Some(weight), bias])?;
    let y = if activation.is_silu() {
        let s = e.unary("sigmoid", UnaryOp::Sigmoid, y)?;
        e.mul("silu", y, s)?
    } else {
        y
    };
    let y = e.cast("output", y, dt)?;
    let present = e.slice("present_state", padded, 2, len, len + k - 1, 1)?;
    Ok(Some(vec![y, present]))
}
