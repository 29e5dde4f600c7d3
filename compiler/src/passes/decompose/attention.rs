//! Attention (opset 23/24) and RotaryEmbedding as MatMul, Softmax, Gather, Slice, Concat and
//! elementwise ops, step for step as `kiln_ir::eval::sequence` computes them.

use kiln_ir::op::{Attention, RotaryEmbedding};
use kiln_ir::{BinaryOp, DType, NodeId, Op, Tensor, UnaryOp, ValueId};

use super::{compute_type, Emit};
use crate::Result;

/// A 3-D [batch, seq, heads * size] operand as 4-D [batch, heads, seq, size].
fn heads_first(e: &mut Emit, what: &str, v: ValueId, heads: usize) -> Result<ValueId> {
    let d = e.dims(v)?;
    if d.len() == 4 {
        return Ok(v);
    }
    // Inference checked that the heads split the hidden size.
    if heads == 0 || d[2] % heads != 0 {
        return Err(crate::CompileError::Internal(format!(
            "{what} {d:?} does not split into {heads} heads"
        )));
    }
    let split = e.reshape(&format!("{what}_heads"), v, &[d[0], d[1], heads, d[2] / heads])?;
    e.transpose(&format!("{what}_heads_first"), split, &[0, 2, 1, 3])
}

pub(super) fn attention(e: &mut Emit, id: NodeId, a: &Attention) -> Result<Option<Vec<ValueId>>> {
    let node = e.g.node(id).clone();
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (operand(0), operand(1), operand(2)) else { return Ok(None) };
    let dt = e.dtype(q);
    let cd = compute_type(dt);
    let q_rank = e.dims(q)?.len();
    let q4 = heads_first(e, "q", q, a.q_num_heads)?;
    let k4 = heads_first(e, "k", k, a.kv_num_heads)?;
    let v4 = heads_first(e, "v", v, a.kv_num_heads)?;
    let [batch, qh, sq, hs]: [usize; 4] =
        e.dims(q4)?.try_into().map_err(|_| internal("Q is not 4-D"))?;
    let [_, kh, _, _]: [usize; 4] = e.dims(k4)?.try_into().map_err(|_| internal("K is not 4-D"))?;
    let vhs = e.dims(v4)?[3];
    if kh == 0 || qh % kh != 0 {
        return Ok(None);
    }

    // The cache: past followed by the new keys and values (an empty or absent past adds nothing).
    let with_past =
        |e: &mut Emit, what: &str, past: Option<ValueId>, new: ValueId| -> Result<ValueId> {
            match past {
                Some(p) if e.dims(p)?.len() == 4 && e.dims(p)?[2] > 0 => {
                    e.concat(what, &[p, new], 2)
                }
                _ => Ok(new),
            }
        };
    let present_k = with_past(e, "present_key", operand(4), k4)?;
    let present_v = with_past(e, "present_value", operand(5), v4)?;
    let past = match operand(4) {
        Some(p) if e.dims(p)?.len() == 4 => e.dims(p)?[2],
        _ => 0,
    };
    let total = e.dims(present_k)?[2];

    // Scores [batch, q_heads, q_seq, total]. Grouped-query attention: query heads
    // g*group..(g+1)*group share KV head g, so the query heads of a group are stacked as rows.
    let group = qh / kh;
    let qc = e.cast("q_compute", q4, cd)?;
    let kc = e.cast("k_compute", present_k, cd)?;
    let vc = e.cast("v_compute", present_v, cd)?;
    let kt = e.transpose("k_t", kc, &[0, 1, 3, 2])?;
    let qg = e.reshape("q_groups", qc, &[batch, kh, group * sq, hs])?;
    let s = e.matmul("qk", qg, kt)?;
    let s = e.reshape("qk_heads", s, &[batch, qh, sq, total])?;
    let scale = a.scale.map_or(1.0 / (hs as f64).sqrt(), |s| s as f64);
    let scale = e.scalar(scale, cd)?;
    let raw = e.mul("qk_scaled", s, scale)?;
    // Softcap comes before the bias so that masked scores stay -inf.
    let capped = if a.softcap > 0.0 {
        let cap = e.scalar(a.softcap as f64, cd)?;
        let d = e.binary("softcap_div", BinaryOp::Div, raw, cap)?;
        let t = e.unary("softcap_tanh", UnaryOp::Tanh, d)?;
        e.mul("qk_softcapped", t, cap)?
    } else {
        raw
    };
    let bias = attention_bias(e, a, &ops, cd, batch, sq, past, total)?;
    let biased = match bias {
        Some(b) => e.add("qk_biased", capped, b)?,
        None => capped,
    };
    // The softmax in softmax_precision when that is wider than the compute type.
    let sp = a.softmax_precision.filter(|p| p.is_float() && p.size() > cd.size()).unwrap_or(cd);
    let sm_in = e.cast("softmax_input", biased, sp)?;
    let probs = e.op2("softmax", Op::Softmax { axis: -1 }, &[sm_in])?;
    let probs = e.cast("probs", probs, cd)?;
    let pg = e.reshape("probs_groups", probs, &[batch, kh, group * sq, total])?;
    let y = e.matmul("y_groups", pg, vc)?;
    let y = e.reshape("y_heads", y, &[batch, qh, sq, vhs])?;
    let y = if q_rank == 3 {
        let t = e.transpose("y_seq_first", y, &[0, 2, 1, 3])?;
        e.reshape("y_merged", t, &[batch, sq, qh * vhs])?
    } else {
        y
    };
    let mut results = vec![e.cast("Y", y, dt)?, present_k, present_v];
    if node.outputs.len() > 3 {
        let qk = match a.qk_matmul_output_mode {
            0 => raw,
            1 => capped,
            2 => biased,
            _ => probs,
        };
        results.push(e.cast("qk_output", qk, dt)?);
    }
    Ok(Some(results))
}

/// A shape inference guarantees that is not there: a bug of this pass.
fn internal(msg: &str) -> crate::CompileError {
    crate::CompileError::Internal(msg.to_string())
}

/// The additive bias of the scores, broadcastable to [batch, q_heads, q_seq, total]: the mask
/// (a bool mask is 0 / -inf; a mask shorter than total is padded with -inf, not broadcast), the
/// causal triangle, the key padding. `None` when there is none.
#[allow(clippy::too_many_arguments)]
fn attention_bias(
    e: &mut Emit,
    a: &Attention,
    ops: &[Option<ValueId>],
    cd: DType,
    batch: usize,
    sq: usize,
    past: usize,
    total: usize,
) -> Result<Option<ValueId>> {
    let neg_inf = e.scalar(f64::NEG_INFINITY, cd)?;
    let mut bias = None;
    if let Some(m) = ops.get(3).copied().flatten() {
        let md = e.dims(m)?;
        let mut m4 = vec![1; 4 - md.len().min(4)];
        m4.extend_from_slice(&md);
        let mv = e.reshape("mask4", m, &m4)?;
        let mb = if e.dtype(m) == DType::Bool {
            let zero = e.scalar(0.0, cd)?;
            e.select("mask_bias", mv, zero, neg_inf)?
        } else {
            e.cast("mask_bias", mv, cd)?
        };
        let mb = if m4[3] < total {
            let fill = e.full(
                "mask_padding",
                cd,
                &[m4[0], m4[1], m4[2], total - m4[3]],
                f64::NEG_INFINITY,
            )?;
            if m4[3] == 0 {
                fill
            } else {
                e.concat("mask_padded", &[mb, fill], 3)?
            }
        } else {
            mb
        };
        bias = Some(mb);
    }
    if a.is_causal {
        // Upper-left aligned after the past: query i sees keys up to past + i.
        let keep: Vec<bool> =
            (0..sq).flat_map(|i| (0..total).map(move |j| j <= past + i)).collect();
        bias = Some(match bias {
            None => {
                let v: Vec<f64> =
                    keep.iter().map(|&k| if k { 0.0 } else { f64::NEG_INFINITY }).collect();
                e.constant("causal_bias", Tensor::from_f64s(cd, &[sq, total], &v)?)?
            }
            Some(b) => {
                let k = e.constant("causal", Tensor::from_slice(&[sq, total], &keep)?)?;
                e.select("causal_bias", k, b, neg_inf)?
            }
        });
    }
    if let Some(n) = ops.get(6).copied().flatten() {
        // Keys at or past nonpad_kv_seqlen[b] are padding.
        let l = e.cast("nonpad_kv_seqlen", n, DType::I64)?;
        let l = e.reshape("nonpad_col", l, &[batch, 1])?;
        let js: Vec<i64> = (0..total as i64).collect();
        let j = e.constant("key_index", Tensor::from_slice(&[1, total], &js)?)?;
        let keep = e.binary("key_kept", BinaryOp::Less, j, l)?;
        let keep = e.reshape("key_kept4", keep, &[batch, 1, 1, total])?;
        let base = match bias {
            Some(b) => b,
            None => e.scalar(0.0, cd)?,
        };
        bias = Some(e.select("key_padding_bias", keep, base, neg_inf)?);
    }
    Ok(bias)
}

pub(super) fn rotary(
    e: &mut Emit,
    id: NodeId,
    r: &RotaryEmbedding,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(cos), Some(sin)) = (operand(0), operand(1), operand(2)) else {
        return Ok(None);
    };
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let xd = e.dims(x)?;
    // Work in [batch, seq, heads, size] (3-D input) or [batch, heads, seq, size] (4-D) and give
    // cos and sin a size-1 heads axis to match.
    let (batch, seq, x4) = match xd.len() {
        3 => {
            if r.num_heads == 0 || xd[2] % r.num_heads != 0 {
                return Ok(None);
            }
            let v = e.reshape("x_heads", x, &[xd[0], xd[1], r.num_heads, xd[2] / r.num_heads])?;
            (xd[0], xd[1], v)
        }
        4 => (xd[0], xd[2], x),
        _ => return Ok(None),
    };
    let x4 = e.cast("x_compute", x4, cd)?;
    let hs = e.dims(x4)?[3];
    let rot = if r.rotary_embedding_dim > 0 { r.rotary_embedding_dim } else { hs };
    let half = rot / 2;
    if rot > hs || rot % 2 != 0 {
        return Ok(None);
    }
    let table = |e: &mut Emit, what: &str, cache: ValueId| -> Result<ValueId> {
        let c = e.cast(&format!("{what}_compute"), cache, cd)?;
        // The rows by position id, or the cache is already [batch, seq, rot/2].
        let rows = match operand(3) {
            Some(p) => e.gather(&format!("{what}_rows"), c, p, 0)?,
            None => c,
        };
        let dims = if xd.len() == 3 { [batch, seq, 1, half] } else { [batch, 1, seq, half] };
        e.reshape(what, rows, &dims)
    };
    let c = table(e, "cos", cos)?;
    let s = table(e, "sin", sin)?;
    let xr = e.slice("x_rotated", x4, 3, 0, rot, 1)?;
    // Pairs are (m, m + half), or neighbours (2m, 2m + 1) when interleaved.
    let (x1, x2) = if r.interleaved {
        (e.slice("x1", xr, 3, 0, rot, 2)?, e.slice("x2", xr, 3, 1, rot, 2)?)
    } else {
        (e.slice("x1", xr, 3, 0, half, 1)?, e.slice("x2", xr, 3, half, rot, 1)?)
    };
    let (cx1, sx2) = (e.mul("cos_x1", c, x1)?, e.mul("sin_x2", s, x2)?);
    let y1 = e.sub("y1", cx1, sx2)?;
    let (sx1, cx2) = (e.mul("sin_x1", s, x1)?, e.mul("cos_x2", c, x2)?);
    let y2 = e.add("y2", sx1, cx2)?;
    let yr = if r.interleaved {
        let mut d = e.dims(y1)?;
        d.push(1);
        let (a, b) = (e.reshape("y1_pairs", y1, &d)?, e.reshape("y2_pairs", y2, &d)?);
        let pairs = e.concat("y_pairs", &[a, b], 4)?;
        let mut full = e.dims(x4)?;
        full[3] = rot;
        e.reshape("y_interleaved", pairs, &full)?
    } else {
        e.concat("y_halves", &[y1, y2], 3)?
    };
    let y = if rot < hs {
        let rest = e.slice("x_pass", x4, 3, rot, hs, 1)?;
        e.concat("y_full", &[yr, rest], 3)?
    } else {
        yr
    };
    let y = e.reshape("y_shaped", y, &xd)?;
    Ok(Some(vec![e.cast("Y", y, dt)?]))
}
