//! Sequence models: RNN, GRU, LSTM, Attention, RotaryEmbedding, CausalConvWithState,
//! LinearAttention, computed in f64.
//!
//! Inference has checked every shape, so the index arithmetic below only reads in bounds; the
//! remaining run-time checks are on values (sequence lengths, position ids).

use super::elementwise::unary_float;
use crate::error::{invalid, OpError};
use crate::op::{
    Attention, CausalActivation, LinearAttention, Rnn, RnnCell, RnnDirection, RotaryEmbedding,
};
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Rnn(r) => rnn(r, operands, out),
        Op::Attention(a) => attention(a, operands, out),
        Op::RotaryEmbedding(r) => rotary(r, operands, out),
        Op::CausalConvWithState { activation } => causal_conv(*activation, operands, out),
        Op::LinearAttention(a) => linear_attention(a, operands, out),
        _ => Err(invalid!("{} is not a sequence op", op.name())),
    }
}

fn opt<'a>(operands: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    operands.get(i).copied().flatten()
}

fn get<'a>(operands: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, OpError> {
    opt(operands, i).ok_or(OpError::MissingOperand { index: i })
}

fn result(ty: &TensorType, values: &[f64]) -> Result<Tensor, OpError> {
    let dims = ty.shape.as_fixed().ok_or_else(|| invalid!("result shape {ty} is not known"))?;
    Tensor::from_f64s(ty.dtype, &dims, values).map_err(OpError::from)
}

// ----- RNN, GRU, LSTM -----

/// `m v + b` for a row-major `m` of `b.len()` rows.
fn mat_vec(m: &[f64], v: &[f64], b: &[f64]) -> Vec<f64> {
    let n = v.len();
    b.iter()
        .enumerate()
        .map(|(j, bj)| m[j * n..(j + 1) * n].iter().zip(v).map(|(a, x)| a * x).sum::<f64>() + bj)
        .collect()
}

fn rnn(r: &Rnn, operands: &[Option<&Tensor>], out: &[TensorType]) -> Result<Vec<Tensor>, OpError> {
    let x = get(operands, 0)?;
    let xd = x.dims();
    let (seq, batch, input) =
        if r.batch_first { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    let hidden = out[1]
        .shape
        .as_fixed()
        .and_then(|d| d.last().copied())
        .ok_or("Y_h's shape is not known")?;
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let (g, per) = match r.cell {
        RnnCell::Simple => (1, 1),
        RnnCell::Gru { .. } => (3, 2),
        RnnCell::Lstm { .. } => (4, 3),
    };
    let gh = g * hidden;
    let xv = x.to_f64s();
    let w = get(operands, 1)?.to_f64s();
    let rw = get(operands, 2)?.to_f64s();
    let values_or_zeros =
        |i: usize, n: usize| opt(operands, i).map_or_else(|| vec![0.0; n], |t| t.to_f64s());
    let bias = values_or_zeros(3, dirs * 2 * gh);
    let h0 = values_or_zeros(5, dirs * batch * hidden);
    let c0 = values_or_zeros(6, dirs * batch * hidden);
    let peep = values_or_zeros(7, dirs * 3 * hidden);
    let lens: Vec<usize> = match opt(operands, 4) {
        None => vec![seq; batch],
        Some(t) => t
            .to_i64s()
            .into_iter()
            .map(|l| {
                usize::try_from(l)
                    .ok()
                    .filter(|&l| l <= seq)
                    .ok_or_else(|| invalid!("sequence length {l} is outside 0..={seq}"))
            })
            .collect::<Result<_, _>>()?,
    };
    let acts = r.effective_activations();
    let clip = |v: f64| match r.clip {
        Some(c) => v.clamp(-(c as f64), c as f64),
        None => v,
    };
    // Where (time, direction, batch) and (direction, batch) live in the two layouts.
    let y_at = |t: usize, d: usize, b: usize| {
        if r.batch_first {
            ((b * seq + t) * dirs + d) * hidden
        } else {
            ((t * dirs + d) * batch + b) * hidden
        }
    };
    let state_at = |d: usize, b: usize| {
        if r.batch_first {
            (b * dirs + d) * hidden
        } else {
            (d * batch + b) * hidden
        }
    };
    let x_at = |t: usize, b: usize| {
        if r.batch_first {
            (b * seq + t) * input
        } else {
            (t * batch + b) * input
        }
    };

    let mut y = vec![0.0; seq * dirs * batch * hidden];
    let mut y_h = vec![0.0; dirs * batch * hidden];
    let mut y_c = vec![0.0; dirs * batch * hidden];
    for d in 0..dirs {
        let reverse = r.direction == RnnDirection::Reverse || d == 1;
        let act = |i: usize, v: f64| unary_float(acts[d * per + i], v);
        let wd = &w[d * gh * input..(d + 1) * gh * input];
        let rd = &rw[d * gh * hidden..(d + 1) * gh * hidden];
        let (wb, rb) = bias[d * 2 * gh..(d + 1) * 2 * gh].split_at(gh);
        let p = &peep[d * 3 * hidden..(d + 1) * 3 * hidden];
        for b in 0..batch {
            let s = state_at(d, b);
            let mut h = h0[s..s + hidden].to_vec();
            let mut c = c0[s..s + hidden].to_vec();
            let len = lens[b];
            for step in 0..len {
                // The reverse direction reads each sequence backwards from its own last step.
                let t = if reverse { len - 1 - step } else { step };
                let gx = mat_vec(wd, &xv[x_at(t, b)..x_at(t, b) + input], wb);
                let gr = mat_vec(rd, &h, rb);
                let hs = hidden;
                match r.cell {
                    RnnCell::Simple => h = (0..hs).map(|k| act(0, clip(gx[k] + gr[k]))).collect(),
                    RnnCell::Gru { linear_before_reset } => {
                        // Gate rows: z, r, h.
                        let z: Vec<f64> = (0..hs).map(|k| act(0, clip(gx[k] + gr[k]))).collect();
                        let rg: Vec<f64> =
                            (0..hs).map(|k| act(0, clip(gx[hs + k] + gr[hs + k]))).collect();
                        let cand: Vec<f64> = if linear_before_reset {
                            (0..hs)
                                .map(|k| act(1, clip(gx[2 * hs + k] + rg[k] * gr[2 * hs + k])))
                                .collect()
                        } else {
                            let rh: Vec<f64> = (0..hs).map(|k| rg[k] * h[k]).collect();
                            let hr = mat_vec(&rd[2 * hs * hs..], &rh, &rb[2 * hs..]);
                            (0..hs).map(|k| act(1, clip(gx[2 * hs + k] + hr[k]))).collect()
                        };
                        h = (0..hs).map(|k| (1.0 - z[k]) * cand[k] + z[k] * h[k]).collect();
                    }
                    RnnCell::Lstm { input_forget } => {
                        // Gate rows: i, o, f, c; peepholes: i, o, f.
                        let mut new_h = vec![0.0; hs];
                        for k in 0..hs {
                            let i = act(0, clip(gx[k] + gr[k] + p[k] * c[k]));
                            // Coupled gates: what is let in replaces what is forgotten.
                            let f = if input_forget {
                                1.0 - i
                            } else {
                                act(0, clip(gx[2 * hs + k] + gr[2 * hs + k] + p[2 * hs + k] * c[k]))
                            };
                            let cand = act(1, clip(gx[3 * hs + k] + gr[3 * hs + k]));
                            c[k] = f * c[k] + i * cand;
                            let o = act(0, clip(gx[hs + k] + gr[hs + k] + p[hs + k] * c[k]));
                            new_h[k] = o * act(2, c[k]);
                        }
                        h = new_h;
                    }
                }
                let at = y_at(t, d, b);
                y[at..at + hidden].copy_from_slice(&h);
            }
            // A sequence of length 0 leaves zero states, as onnxruntime does.
            if len > 0 {
                y_h[s..s + hidden].copy_from_slice(&h);
                y_c[s..s + hidden].copy_from_slice(&c);
            }
        }
    }
    let mut results = vec![result(&out[0], &y)?, result(&out[1], &y_h)?];
    if out.len() > 2 {
        results.push(result(&out[2], &y_c)?);
    }
    Ok(results)
}

// ----- Attention -----

/// A Q, K or V operand as [batch, heads, seq, size] values; 3-D operands are split into `heads`.
fn heads_first(t: &Tensor, heads: usize) -> (Vec<f64>, [usize; 4]) {
    let v = t.to_f64s();
    let d = t.dims();
    if d.len() == 4 {
        return (v, [d[0], d[1], d[2], d[3]]);
    }
    let (b, s, size) = (d[0], d[1], d[2] / heads);
    let mut o = vec![0.0; v.len()];
    for bi in 0..b {
        for h in 0..heads {
            for si in 0..s {
                let src = (bi * s + si) * d[2] + h * size;
                let dst = ((bi * heads + h) * s + si) * size;
                o[dst..dst + size].copy_from_slice(&v[src..src + size]);
            }
        }
    }
    (o, [b, heads, s, size])
}

/// `past` followed by `new` along the sequence axis of [batch, heads, seq, size] values.
fn concat_seq(past: Option<(&[f64], usize)>, new: &[f64], [b, h, s, size]: [usize; 4]) -> Vec<f64> {
    let Some((past, p)) = past else { return new.to_vec() };
    let mut o = Vec::with_capacity(past.len() + new.len());
    for bh in 0..b * h {
        o.extend_from_slice(&past[bh * p * size..(bh + 1) * p * size]);
        o.extend_from_slice(&new[bh * s * size..(bh + 1) * s * size]);
    }
    o
}

fn attention(
    a: &Attention,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (q, k, v) = (get(operands, 0)?, get(operands, 1)?, get(operands, 2)?);
    let (qv, [batch, qh, sq, hs]) = heads_first(q, a.q_num_heads);
    let (kv, kd @ [_, kh, skv, _]) = heads_first(k, a.kv_num_heads);
    let (vv, vd @ [.., vhs]) = heads_first(v, a.kv_num_heads);
    let (past_k, past_v) = (opt(operands, 4), opt(operands, 5));
    let past = past_k.map_or(0, |t| t.dims()[2]);
    let pk = past_k.map(|t| t.to_f64s());
    let pv = past_v.map(|t| t.to_f64s());
    let keys = concat_seq(pk.as_deref().map(|p| (p, past)), &kv, kd);
    let values = concat_seq(pv.as_deref().map(|p| (p, past)), &vv, vd);
    let total = past + skv;

    // The additive bias [batch, q_heads, q_seq, total]: mask, causal triangle, key padding.
    let mut bias = vec![0.0; batch * qh * sq * total];
    let at4 = |b: usize, h: usize, i: usize, j: usize| ((b * qh + h) * sq + i) * total + j;
    if let Some(m) = opt(operands, 3) {
        let mv = m.to_f64s();
        let mut md = vec![1; 4 - m.rank()];
        md.extend_from_slice(m.dims());
        let bool_mask = m.dtype() == DType::Bool;
        for b in 0..batch {
            for h in 0..qh {
                for i in 0..sq {
                    for j in 0..total {
                        // A mask shorter than total_seq is padded with "masked out", not broadcast.
                        let val = if j >= md[3] {
                            f64::NEG_INFINITY
                        } else {
                            let pick = |n: usize, d: usize| if d == 1 { 0 } else { n };
                            let e = mv[((pick(b, md[0]) * md[1] + pick(h, md[1])) * md[2]
                                + pick(i, md[2]))
                                * md[3]
                                + j];
                            if !bool_mask {
                                e
                            } else if e != 0.0 {
                                0.0
                            } else {
                                f64::NEG_INFINITY
                            }
                        };
                        bias[at4(b, h, i, j)] = val;
                    }
                }
            }
        }
    }
    if a.is_causal {
        // Upper-left aligned after the past: query i sees keys up to past + i.
        for b in 0..batch {
            for h in 0..qh {
                for i in 0..sq {
                    for j in (past + i + 1)..total {
                        bias[at4(b, h, i, j)] = f64::NEG_INFINITY;
                    }
                }
            }
        }
    }
    if let Some(n) = opt(operands, 6) {
        for (b, &len) in n.to_i64s().iter().enumerate() {
            let from =
                usize::try_from(len).map_err(|_| format!("nonpad_kv_seqlen {len} is negative"))?;
            for h in 0..qh {
                for i in 0..sq {
                    for j in from.min(total)..total {
                        bias[at4(b, h, i, j)] = f64::NEG_INFINITY;
                    }
                }
            }
        }
    }

    let scale = a.scale.map_or(1.0 / (hs as f64).sqrt(), |s| s as f64);
    let softcap = a.softcap as f64;
    let group = qh / kh;
    let mut y = vec![0.0; batch * qh * sq * vhs];
    let mut qk_out = vec![0.0; batch * qh * sq * total];
    let mut row = vec![0.0; total];
    for b in 0..batch {
        for h in 0..qh {
            // Grouped-query attention: query heads h*group..(h+1)*group share KV head h.
            let kvh = h / group;
            for i in 0..sq {
                let qrow = &qv[((b * qh + h) * sq + i) * hs..][..hs];
                for (j, r) in row.iter_mut().enumerate() {
                    let krow = &keys[((b * kh + kvh) * total + j) * hs..][..hs];
                    let raw = qrow.iter().zip(krow).map(|(x, y)| x * y).sum::<f64>() * scale;
                    // Softcap comes before the bias so that masked scores stay -inf.
                    let capped = if softcap > 0.0 { softcap * (raw / softcap).tanh() } else { raw };
                    let biased = capped + bias[at4(b, h, i, j)];
                    qk_out[at4(b, h, i, j)] = match a.qk_matmul_output_mode {
                        0 => raw,
                        1 => capped,
                        _ => biased,
                    };
                    *r = biased;
                }
                // A fully masked row is NaN (0/0), as the reference softmax gives.
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                row.iter_mut().for_each(|r| *r = (*r - max).exp());
                let sum: f64 = row.iter().sum();
                row.iter_mut().for_each(|r| *r /= sum);
                if a.qk_matmul_output_mode == 3 {
                    qk_out[at4(b, h, i, 0)..at4(b, h, i, 0) + total].copy_from_slice(&row);
                }
                let yrow = &mut y[((b * qh + h) * sq + i) * vhs..][..vhs];
                for (j, p) in row.iter().enumerate() {
                    let vrow = &values[((b * kh + kvh) * total + j) * vhs..][..vhs];
                    yrow.iter_mut().zip(vrow).for_each(|(o, x)| *o += p * x);
                }
            }
        }
    }
    if q.rank() == 3 {
        // Back to [batch, q_seq, heads * v_size].
        let mut y3 = vec![0.0; y.len()];
        for b in 0..batch {
            for h in 0..qh {
                for i in 0..sq {
                    let src = ((b * qh + h) * sq + i) * vhs;
                    let dst = (b * sq + i) * qh * vhs + h * vhs;
                    y3[dst..dst + vhs].copy_from_slice(&y[src..src + vhs]);
                }
            }
        }
        y = y3;
    }
    Ok(vec![
        result(&out[0], &y)?,
        result(&out[1], &keys)?,
        result(&out[2], &values)?,
        result(&out[3], &qk_out)?,
    ])
}

// ----- RotaryEmbedding -----

fn rotary(
    r: &RotaryEmbedding,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let x = get(operands, 0)?;
    let (cos, sin) = (get(operands, 1)?.to_f64s(), get(operands, 2)?.to_f64s());
    let cache_rows = get(operands, 1)?.dims()[0];
    let d = x.dims();
    // (batch, seq, heads, head_size) and the offset of element (b, s, h, 0).
    let (batch, seq, heads, hs) = if x.rank() == 3 {
        (d[0], d[1], r.num_heads, d[2] / r.num_heads)
    } else {
        (d[0], d[2], d[1], d[3])
    };
    let at = |b: usize, s: usize, h: usize| {
        if x.rank() == 3 {
            (b * seq + s) * heads * hs + h * hs
        } else {
            ((b * heads + h) * seq + s) * hs
        }
    };
    let rot = if r.rotary_embedding_dim > 0 { r.rotary_embedding_dim } else { hs };
    let half = rot / 2;
    let positions = opt(operands, 3).map(|p| p.to_i64s());
    let mut y = x.to_f64s();
    let xv = x.to_f64s();
    for b in 0..batch {
        for s in 0..seq {
            // The cache row: by position id, or the caches are already [batch, seq, rot/2].
            let row = match &positions {
                Some(p) => {
                    let id = p[b * seq + s];
                    usize::try_from(id).ok().filter(|&i| i < cache_rows).ok_or_else(|| {
                        format!("position id {id} is outside the {cache_rows} cached positions")
                    })?
                }
                None => b * seq + s,
            };
            let (c, sn) = (&cos[row * half..(row + 1) * half], &sin[row * half..(row + 1) * half]);
            for h in 0..heads {
                let o = at(b, s, h);
                for m in 0..half {
                    // Pairs are (m, m + half), or neighbours (2m, 2m + 1) when interleaved.
                    let (i1, i2) = if r.interleaved {
                        (o + 2 * m, o + 2 * m + 1)
                    } else {
                        (o + m, o + m + half)
                    };
                    let (x1, x2) = (xv[i1], xv[i2]);
                    y[i1] = c[m] * x1 - sn[m] * x2;
                    y[i2] = sn[m] * x1 + c[m] * x2;
                }
            }
        }
    }
    Ok(vec![result(&out[0], &y)?])
}

// ----- CausalConvWithState -----

fn causal_conv(
    activation: CausalActivation,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let x = get(operands, 0)?;
    let w = get(operands, 1)?;
    let [batch, channels, len]: [usize; 3] =
        x.dims().try_into().map_err(|_| invalid!("input is not 3-D"))?;
    let k = w.dims()[2];
    let (xv, wv) = (x.to_f64s(), w.to_f64s());
    let bias = opt(operands, 2).map(|b| b.to_f64s());
    let past = opt(operands, 3).map(|p| p.to_f64s());
    // Each row (b, c) is the past (or k - 1 zeros) followed by the input: len + k - 1 positions.
    let width = len + k - 1;
    let mut y = Vec::with_capacity(batch * channels * len);
    let mut state = Vec::with_capacity(batch * channels * (k - 1));
    for row in 0..batch * channels {
        let c = row % channels;
        let mut padded = match &past {
            Some(p) => p[row * (k - 1)..(row + 1) * (k - 1)].to_vec(),
            None => vec![0.0; k - 1],
        };
        padded.extend_from_slice(&xv[row * len..(row + 1) * len]);
        let taps = &wv[c * k..(c + 1) * k];
        for t in 0..len {
            let sum: f64 = taps.iter().zip(&padded[t..t + k]).map(|(a, b)| a * b).sum();
            let v = sum + bias.as_ref().map_or(0.0, |b| b[c]);
            y.push(if activation.is_silu() { v / (1.0 + (-v).exp()) } else { v });
        }
        state.extend_from_slice(&padded[width - (k - 1)..]);
    }
    Ok(vec![result(&out[0], &y)?, result(&out[1], &state)?])
}

// ----- LinearAttention -----

fn linear_attention(
    a: &LinearAttention,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (q, k, v) = (get(operands, 0)?, get(operands, 1)?, get(operands, 2)?);
    let [batch, seq, q_width]: [usize; 3] =
        q.dims().try_into().map_err(|_| invalid!("query is not 3-D"))?;
    let (hq, hkv) = (a.q_num_heads, a.kv_num_heads);
    let (d_k, d_v) = (q_width / hq, v.dims()[2] / hkv);
    let group = hq / hkv;
    let (qv, kv, vv) = (q.to_f64s(), k.to_f64s(), v.to_f64s());
    // Packed [B, T, heads * size]: element (b, t, h, i).
    let packed = |x: &[f64], heads: usize, size: usize, b: usize, t: usize, h: usize, i: usize| {
        x[((b * seq + t) * heads + h) * size + i]
    };
    // Decay per key feature or per head (one value for every feature); beta per head or one.
    let decay = opt(operands, 4).map(|d| (d.dims()[2] / hkv, d.to_f64s()));
    let beta = opt(operands, 5).map(|b| (b.dims()[2], b.to_f64s()));
    let mut state = match opt(operands, 3) {
        Some(p) => p.to_f64s(),
        None => vec![0.0; batch * hkv * d_k * d_v],
    };
    let scale = a.scale_for(d_k);
    let mut y = vec![0.0; batch * seq * hq * d_v];
    for b in 0..batch {
        for h in 0..hkv {
            let s = &mut state[(b * hkv + h) * d_k * d_v..(b * hkv + h + 1) * d_k * d_v];
            for t in 0..seq {
                if let Some((per, d)) = &decay {
                    for i in 0..d_k {
                        let g = packed(d, hkv, *per, b, t, h, if *per == 1 { 0 } else { i }).exp();
                        s[i * d_v..(i + 1) * d_v].iter_mut().for_each(|x| *x *= g);
                    }
                }
                let key: Vec<f64> = (0..d_k).map(|i| packed(&kv, hkv, d_k, b, t, h, i)).collect();
                let mut write: Vec<f64> =
                    (0..d_v).map(|m| packed(&vv, hkv, d_v, b, t, h, m)).collect();
                if let Some((heads, bv)) = &beta {
                    let rate = packed(bv, *heads, 1, b, t, if *heads == 1 { 0 } else { h }, 0);
                    for (m, w) in write.iter_mut().enumerate() {
                        let retrieved: f64 = (0..d_k).map(|i| s[i * d_v + m] * key[i]).sum();
                        *w = rate * (*w - retrieved);
                    }
                }
                for (i, ki) in key.iter().enumerate() {
                    for (m, w) in write.iter().enumerate() {
                        s[i * d_v + m] += ki * w;
                    }
                }
                // The query heads of this KV head read the updated state.
                for qh in h * group..(h + 1) * group {
                    for m in 0..d_v {
                        let dot: f64 = (0..d_k)
                            .map(|i| packed(&qv, hq, d_k, b, t, qh, i) * s[i * d_v + m])
                            .sum();
                        y[((b * seq + t) * hq + qh) * d_v + m] = scale * dot;
                    }
                }
            }
        }
    }
    Ok(vec![result(&out[0], &y)?, result(&out[1], &state)?])
}
