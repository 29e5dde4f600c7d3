//! The state-carrying ops of recurrent language models as existing ops, step for step as
//! `kiln_ir::eval::sequence` computes them: CausalConvWithState as Concat / grouped Conv /
//! elementwise / Slice, LinearAttention as its recurrence unrolled over the (static) sequence.

use kiln_ir::op::{CausalActivation, Conv, LinearAttention, Window};
use kiln_ir::{DType, NodeId, Op, UnaryOp, ValueId};

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
    let present = e.slice("present_state", padded, 2, len, len + k - 1, 1)?;
    // No positions: nothing to convolve (a Conv cannot give an empty result), only the state.
    if len == 0 {
        let y = e.full("output", dt, &[batch, channels, 0], 0.0)?;
        return Ok(Some(vec![y, present]));
    }
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
    Ok(Some(vec![y, present]))
}

/// A packed `[B, T, heads * size]` operand as `[B, heads, size, T]`: one step's slice along the
/// last axis is a column per head, `[B, heads, size, 1]`.
fn steps_last(e: &mut Emit, what: &str, x: ValueId, heads: usize, cd: DType) -> Result<ValueId> {
    let [batch, seq, width]: [usize; 3] = e
        .dims(x)?
        .try_into()
        .map_err(|_| crate::CompileError::Internal(format!("{what} is not 3-D")))?;
    let x = e.cast(&format!("{what}_compute"), x, cd)?;
    let split = e.reshape(&format!("{what}_heads"), x, &[batch, seq, heads, width / heads])?;
    e.transpose(&format!("{what}_steps_last"), split, &[0, 2, 3, 1])
}

/// `(query, key, value, past_state?, decay?, beta?) -> (output, present_state)`: per step t the
/// state `[B, H_kv, d_k, d_v]` is decayed (`* exp(g_t)`), the delta rule's write
/// `beta_t (v_t - k_tᵀ S)` (a MatMul) or `v_t` is added as the outer product `k_t v_tᵀ` (a
/// broadcast Mul), and the query heads of each KV head read it (a MatMul of the group's rows);
/// the steps' outputs are joined and scaled once.
pub(super) fn linear_attention(
    e: &mut Emit,
    id: NodeId,
    a: &LinearAttention,
) -> Result<Option<Vec<ValueId>>> {
    let node_outputs = e.g.node(id).outputs.clone();
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (operand(0), operand(1), operand(2)) else {
        return Ok(None);
    };
    let (hq, hkv) = (a.q_num_heads, a.kv_num_heads);
    let dt = e.dtype(q);
    let cd = compute_type(dt);
    let [batch, seq, q_width]: [usize; 3] = match e.dims(q)?.try_into() {
        Ok(d) => d,
        Err(_) => return Ok(None),
    };
    if hq == 0 || hkv == 0 || hq % hkv != 0 || node_outputs.len() < 2 {
        return Ok(None);
    }
    let (d_k, d_v, group) = (q_width / hq, e.dims(v)?[2] / hkv, hq / hkv);
    // Steps along the last axis: [B, H, size, T].
    let qs = steps_last(e, "query", q, hq, cd)?;
    let ks = steps_last(e, "key", k, hkv, cd)?;
    let vs = steps_last(e, "value", v, hkv, cd)?;
    // exp(decay) as [B, H_kv, d_k or 1, T]: one step's column scales the state's rows.
    let decay = match operand(4) {
        Some(d) => {
            let d = steps_last(e, "decay", d, hkv, cd)?;
            Some(e.unary("decay_exp", UnaryOp::Exp, d)?)
        }
        None => None,
    };
    // beta as [B, H_kv or 1, 1, T].
    let beta = match operand(5) {
        Some(b) => {
            let heads = e.dims(b)?[2];
            Some(steps_last(e, "beta", b, heads, cd)?)
        }
        None => None,
    };
    let mut state = match operand(3) {
        Some(p) => e.cast("past_state_compute", p, cd)?,
        None => e.full("zero_state", cd, &[batch, hkv, d_k, d_v], 0.0)?,
    };
    let mut outputs = Vec::with_capacity(seq);
    for t in 0..seq {
        let at = |e: &mut Emit, what: &str, x: ValueId| -> Result<ValueId> {
            e.slice(&format!("step{t}/{what}"), x, 3, t, t + 1, 1)
        };
        if let Some(g) = decay {
            let g = at(e, "decay", g)?;
            state = e.mul(&format!("step{t}/decayed"), state, g)?;
        }
        let k_col = at(e, "key", ks)?;
        let v_col = at(e, "value", vs)?;
        // v_t as a row [B, H_kv, 1, d_v].
        let mut write = e.reshape(&format!("step{t}/value_row"), v_col, &[batch, hkv, 1, d_v])?;
        if let Some(b) = beta {
            let k_row = e.reshape(&format!("step{t}/key_row"), k_col, &[batch, hkv, 1, d_k])?;
            let retrieved = e.matmul(&format!("step{t}/retrieved"), k_row, state)?;
            let diff = e.sub(&format!("step{t}/correction"), write, retrieved)?;
            let rate = at(e, "beta", b)?;
            write = e.mul(&format!("step{t}/write"), rate, diff)?;
        }
        let outer = e.mul(&format!("step{t}/outer"), k_col, write)?;
        state = e.add(&format!("step{t}/state"), state, outer)?;
        // Query heads kv * group + g read KV head kv's state: the group's rows [group, d_k].
        let q_col = at(e, "query", qs)?;
        let q_rows = e.reshape(&format!("step{t}/query_rows"), q_col, &[batch, hkv, group, d_k])?;
        let read = e.matmul(&format!("step{t}/read"), q_rows, state)?;
        outputs.push(e.reshape(&format!("step{t}/output"), read, &[batch, 1, hq * d_v])?);
    }
    let present = e.cast("present_state", state, node_outputs[1].dtype)?;
    // No steps: an empty output and the past state as it was.
    if outputs.is_empty() {
        let y = e.full("output", dt, &[batch, 0, hq * d_v], 0.0)?;
        return Ok(Some(vec![y, present]));
    }
    let joined = e.concat("outputs", &outputs, 1)?;
    let scale = e.scalar(a.scale_for(d_k), cd)?;
    let scaled = e.mul("scaled", joined, scale)?;
    let y = e.cast("output", scaled, dt)?;
    Ok(Some(vec![y, present]))
}
