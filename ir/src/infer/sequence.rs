//! Sequence models: RNN, GRU, LSTM, Attention, RotaryEmbedding, CausalConvWithState,
//! LinearAttention.

use super::{same_dtype, Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::op::{Attention, LinearAttention, Rnn, RnnCell, RnnDirection, RotaryEmbedding};
use crate::{broadcast, DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Rnn(r) => rnn(r, ops),
        Op::Attention(a) => attention(a, ops, ctx),
        Op::RotaryEmbedding(r) => rotary(r, ops),
        Op::CausalConvWithState { .. } => causal_conv(ops),
        Op::LinearAttention(a) => linear_attention(a, ops),
        _ => Err(invalid!("{} is not a sequence op", op.name())),
    }
}

/// Two sizes that may be equal: a symbol may stand for any size.
fn agree(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        _ => true,
    }
}

/// `n * d`; `None` when it cannot be named (a symbol times a factor other than 1).
fn times(n: usize, d: &Dim) -> Option<Dim> {
    match d {
        Dim::Fixed(k) => Some(Dim::Fixed(n * k)),
        s if n == 1 => Some(s.clone()),
        _ => None,
    }
}

/// Checks that `ty` has the expected dims (`None`: anything) and explains the layout when not.
fn expect_shape(
    what: &str,
    ty: &TensorType,
    want: &[Option<Dim>],
    layout: &str,
    ctx_ty: &TensorType,
) -> Result<(), OpError> {
    let ok = ty.rank() == want.len()
        && ty.shape.0.iter().zip(want).all(|(d, w)| w.as_ref().is_none_or(|w| agree(d, w)));
    if ok {
        return Ok(());
    }
    let shown: Vec<String> =
        want.iter().map(|w| w.as_ref().map_or("?".to_string(), |d| d.to_string())).collect();
    Err(invalid!("{what} must be [{}] ({layout}) for {ctx_ty}, got {ty}", shown.join(",")))
}

// ----- RNN, GRU, LSTM -----

/// The gate count of a cell: the rows of W and R are `gates * hidden`.
fn gates(cell: RnnCell) -> usize {
    match cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 3,
        RnnCell::Lstm { .. } => 4,
    }
}

/// The activations one direction of a cell takes (f, g[, h]).
fn activations_per_direction(cell: RnnCell) -> usize {
    match cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 2,
        RnnCell::Lstm { .. } => 3,
    }
}

fn rnn(r: &Rnn, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(invalid!("X must be a float tensor, got {x}"));
    }
    if x.rank() != 3 {
        let want = if r.batch_first { "[batch, seq, input]" } else { "[seq, batch, input]" };
        return Err(invalid!("X must be 3-D {want}, got {x}"));
    }
    let (seq, batch, input) = if r.batch_first {
        (&x.shape.0[1], &x.shape.0[0], &x.shape.0[2])
    } else {
        (&x.shape.0[0], &x.shape.0[1], &x.shape.0[2])
    };
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let g = gates(r.cell);
    let (w, rr) = (ops.get(1)?.ty, ops.get(2)?.ty);
    same_dtype("X and W", x, w)?;
    same_dtype("X and R", x, rr)?;
    // hidden_size = 0 means the attribute was left out: R's last dimension tells it.
    let hidden = if r.hidden_size > 0 {
        Dim::Fixed(r.hidden_size)
    } else if rr.rank() == 3 {
        rr.shape.0[2].clone()
    } else {
        return Err(invalid!("R must be 3-D [dirs, {g}*hidden, hidden], got {rr}"));
    };
    let gh = times(g, &hidden);
    let d = Some(Dim::Fixed(dirs));
    let gl = if g == 1 { "hidden".to_string() } else { format!("{g}*hidden") };
    expect_shape(
        "W",
        w,
        &[d.clone(), gh.clone(), Some(input.clone())],
        &format!("dirs, {gl}, input"),
        x,
    )?;
    expect_shape(
        "R",
        rr,
        &[d.clone(), gh.clone(), Some(hidden.clone())],
        &format!("dirs, {gl}, hidden"),
        x,
    )?;
    if let Some(b) = ops.opt(3) {
        same_dtype("X and B", x, b.ty)?;
        expect_shape("B", b.ty, &[d.clone(), times(2 * g, &hidden)], &format!("dirs, 2*{gl}"), x)?;
    }
    if let Some(s) = ops.opt(4) {
        if !s.ty.dtype.is_int() {
            return Err(invalid!("sequence_lens must be an integer tensor, got {}", s.ty));
        }
        expect_shape("sequence_lens", s.ty, &[Some(batch.clone())], "batch", x)?;
    }
    let state = if r.batch_first {
        vec![batch.clone(), Dim::Fixed(dirs), hidden.clone()]
    } else {
        vec![Dim::Fixed(dirs), batch.clone(), hidden.clone()]
    };
    let state_layout = if r.batch_first { "batch, dirs, hidden" } else { "dirs, batch, hidden" };
    let is_lstm = matches!(r.cell, RnnCell::Lstm { .. });
    let mut states = vec![(5, "initial_h")];
    if is_lstm {
        states.push((6, "initial_c"));
    }
    for (i, what) in states {
        if let Some(h) = ops.opt(i) {
            same_dtype(&format!("X and {what}"), x, h.ty)?;
            expect_shape(
                what,
                h.ty,
                &state.iter().cloned().map(Some).collect::<Vec<_>>(),
                state_layout,
                x,
            )?;
        }
    }
    if is_lstm {
        if let Some(p) = ops.opt(7) {
            same_dtype("X and P", x, p.ty)?;
            expect_shape("P", p.ty, &[d, times(3, &hidden)], "dirs, 3*hidden", x)?;
        }
    }
    let acts = r.effective_activations();
    let per = activations_per_direction(r.cell);
    if acts.len() != per * dirs {
        return Err(invalid!(
            "{} takes {per} activation(s) per direction, {} for {} direction(s); got {}",
            Op::Rnn(r.clone()).name(),
            per * dirs,
            dirs,
            acts.len()
        ));
    }
    if let Some(a) = acts.iter().find(|a| a.returns_bool() || !a.accepts().contains(DType::F32)) {
        return Err(invalid!("{} is not a float activation", a.name()));
    }
    if let Some(c) = r.clip {
        if c.is_nan() || c < 0.0 {
            return Err(invalid!("clip must be a non-negative threshold, got {c}"));
        }
    }
    let y = if r.batch_first {
        vec![batch.clone(), seq.clone(), Dim::Fixed(dirs), hidden.clone()]
    } else {
        vec![seq.clone(), Dim::Fixed(dirs), batch.clone(), hidden.clone()]
    };
    let mut out =
        vec![TensorType::new(x.dtype, Shape(y)), TensorType::new(x.dtype, Shape(state.clone()))];
    if is_lstm {
        out.push(TensorType::new(x.dtype, Shape(state)));
    }
    Ok(out)
}

// ----- Attention -----

/// The shapes of Attention's operands in the 4-D form [batch, heads, seq, size].
struct AttentionDims {
    batch: Dim,
    q_heads: Dim,
    kv_heads: Dim,
    q_seq: Dim,
    kv_seq: Dim,
    head_size: Dim,
    v_head_size: Dim,
    past: Option<Dim>,
    total: Dim,
}

/// `d / n` exactly, or an error naming `what`; a symbol divided by n > 1 gets a fresh symbol.
fn split_heads(d: &Dim, n: usize, what: &str, fresh: Dim) -> Result<Dim, OpError> {
    match d {
        Dim::Fixed(k) if k % n != 0 => {
            Err(invalid!("{what} size {k} is not a multiple of {n} heads"))
        }
        Dim::Fixed(k) => Ok(Dim::Fixed(k / n)),
        s if n == 1 => Ok(s.clone()),
        _ => Ok(fresh),
    }
}

fn attention_dims(a: &Attention, ops: &Operands, ctx: &Ctx) -> Result<AttentionDims, OpError> {
    let (q, k, v) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    if !q.dtype.is_float() {
        return Err(invalid!("Q must be a float tensor, got {q}"));
    }
    same_dtype("Q and K", q, k)?;
    same_dtype("Q and V", q, v)?;
    if q.rank() != k.rank() || q.rank() != v.rank() || !(q.rank() == 3 || q.rank() == 4) {
        return Err(invalid!("Q, K and V must all be 3-D [batch, seq, heads*size] or all 4-D [batch, heads, seq, size], got {q}, {k} and {v}"));
    }
    let (qs, ks, vs) = (&q.shape.0, &k.shape.0, &v.shape.0);
    let mut d = if q.rank() == 3 {
        if a.q_num_heads == 0 || a.kv_num_heads == 0 {
            return Err(invalid!(
                "3-D Q, K and V need q_num_heads and kv_num_heads, got {} and {} for {q}",
                a.q_num_heads,
                a.kv_num_heads
            ));
        }
        let head_size = split_heads(&qs[2], a.q_num_heads, &format!("Q {q} hidden"), ctx.fresh(3))?;
        let k_head =
            split_heads(&ks[2], a.kv_num_heads, &format!("K {k} hidden"), head_size.clone())?;
        if !agree(&head_size, &k_head) {
            return Err(invalid!(
                "Q and K head sizes differ: {q} has {} heads of {head_size}, {k} has {} heads of {k_head}",
                a.q_num_heads, a.kv_num_heads
            ));
        }
        // Y's last dimension is q_heads * v_head_size; name V's head size only when it is needed.
        let v_head_size = split_heads(
            &vs[2],
            a.kv_num_heads,
            &format!("V {v} hidden"),
            Dim::sym(&format!("{}.v_head_size", ctx.node)),
        )?;
        AttentionDims {
            batch: qs[0].clone(),
            q_heads: Dim::Fixed(a.q_num_heads),
            kv_heads: Dim::Fixed(a.kv_num_heads),
            q_seq: qs[1].clone(),
            kv_seq: ks[1].clone(),
            head_size,
            v_head_size,
            past: None,
            total: ks[1].clone(),
        }
    } else {
        if !agree(&qs[3], &ks[3]) {
            return Err(invalid!("Q and K head sizes differ: {q} and {k}"));
        }
        if !agree(&ks[1], &vs[1]) {
            return Err(invalid!("K and V head counts differ: {k} and {v}"));
        }
        AttentionDims {
            batch: qs[0].clone(),
            q_heads: qs[1].clone(),
            kv_heads: ks[1].clone(),
            q_seq: qs[2].clone(),
            kv_seq: ks[2].clone(),
            head_size: qs[3].clone(),
            v_head_size: vs[3].clone(),
            past: None,
            total: ks[2].clone(),
        }
    };
    if !agree(&d.batch, &ks[0]) || !agree(&d.batch, &vs[0]) {
        return Err(invalid!("Q, K and V batch sizes differ: {q}, {k} and {v}"));
    }
    let kv_seq_v = if v.rank() == 3 { &vs[1] } else { &vs[2] };
    if !agree(&d.kv_seq, kv_seq_v) {
        return Err(invalid!("K and V sequence lengths differ: {k} and {v}"));
    }
    // Grouped-query attention: each KV head serves q_heads / kv_heads query heads.
    if let (Dim::Fixed(qh), Dim::Fixed(kh)) = (&d.q_heads, &d.kv_heads) {
        if *kh == 0 || qh % kh != 0 {
            return Err(invalid!("q heads ({qh}) must be a multiple of kv heads ({kh}): {q}, {k}"));
        }
    }
    match (ops.opt(4), ops.opt(5)) {
        (None, None) => {}
        (Some(pk), Some(pv)) => {
            same_dtype("Q and past_key", q, pk.ty)?;
            same_dtype("Q and past_value", q, pv.ty)?;
            let layout = "batch, kv_heads, past_seq, head_size";
            let past = if pk.ty.rank() == 4 { pk.ty.shape.0[2].clone() } else { Dim::Fixed(0) };
            let want = |size: &Dim| {
                [
                    Some(d.batch.clone()),
                    Some(d.kv_heads.clone()),
                    Some(past.clone()),
                    Some(size.clone()),
                ]
            };
            expect_shape("past_key", pk.ty, &want(&d.head_size), layout, k)?;
            expect_shape("past_value", pv.ty, &want(&d.v_head_size), layout, v)?;
            d.total = match (&past, &d.kv_seq) {
                (Dim::Fixed(p), Dim::Fixed(s)) => Dim::Fixed(p + s),
                (Dim::Fixed(0), s) => s.clone(),
                _ => ctx.fresh(2),
            };
            d.past = Some(past);
        }
        _ => return Err("past_key and past_value must be given together".into()),
    }
    Ok(d)
}

fn attention(a: &Attention, ops: &Operands, ctx: &Ctx) -> Infer {
    let d = attention_dims(a, ops, ctx)?;
    let q = ops.get(0)?.ty;
    if !(0..=3).contains(&a.qk_matmul_output_mode) {
        return Err(invalid!(
            "qk_matmul_output_mode must be 0 to 3, got {}",
            a.qk_matmul_output_mode
        ));
    }
    if let Some(p) = a.softmax_precision {
        if !p.is_float() {
            return Err(invalid!("softmax_precision must be a float type, got {p}"));
        }
    }
    if a.softcap.is_nan() || a.softcap < 0.0 {
        return Err(invalid!("softcap must be 0 (off) or positive, got {}", a.softcap));
    }
    let scores = Shape(vec![d.batch.clone(), d.q_heads.clone(), d.q_seq.clone(), d.total.clone()]);
    if let Some(m) = ops.opt(3) {
        if m.ty.dtype != DType::Bool && m.ty.dtype != q.dtype {
            return Err(invalid!("attn_mask must be bool or {} like Q, got {}", q.dtype, m.ty));
        }
        // The mask's last dimension may be shorter than total_seq: the rest is masked out.
        let ok = m.ty.rank() >= 1 && m.ty.rank() <= 4 && {
            let mut padded = m.ty.shape.0.clone();
            let last = padded.len() - 1;
            let short = match (&padded[last], &d.total) {
                (Dim::Fixed(l), Dim::Fixed(t)) => l <= t,
                _ => true,
            };
            padded[last] = d.total.clone();
            short && broadcast(&Shape(padded), &scores).as_ref() == Some(&scores)
        };
        if !ok {
            return Err(invalid!(
                "attn_mask {} does not broadcast to the attention scores {}{scores}",
                m.ty,
                q.dtype
            ));
        }
    }
    if let Some(n) = ops.opt(6) {
        if !n.ty.dtype.is_int() || n.ty.rank() != 1 || !agree(&n.ty.shape.0[0], &d.batch) {
            return Err(invalid!(
                "nonpad_kv_seqlen must be an integer vector [batch] = [{}], got {}",
                d.batch,
                n.ty
            ));
        }
        if d.past.is_some() {
            return Err("nonpad_kv_seqlen cannot be used with past_key and past_value".into());
        }
    }
    let y = if q.rank() == 3 {
        let hidden = match (&d.q_heads, &d.v_head_size) {
            (Dim::Fixed(h), s) => times(*h, s).unwrap_or_else(|| ctx.fresh(2)),
            _ => ctx.fresh(2),
        };
        Shape(vec![d.batch.clone(), d.q_seq.clone(), hidden])
    } else {
        Shape(vec![d.batch.clone(), d.q_heads.clone(), d.q_seq.clone(), d.v_head_size.clone()])
    };
    let present = |size: &Dim| {
        Shape(vec![d.batch.clone(), d.kv_heads.clone(), d.total.clone(), size.clone()])
    };
    Ok(vec![
        TensorType::new(q.dtype, y),
        TensorType::new(q.dtype, present(&d.head_size)),
        TensorType::new(q.dtype, present(&d.v_head_size)),
        TensorType::new(q.dtype, scores),
    ])
}

// ----- RotaryEmbedding -----

/// How many leading features of each head rotate, when it is known.
fn rotated_size(r: &RotaryEmbedding, x: &TensorType) -> Result<Option<usize>, OpError> {
    let head_size = match x.rank() {
        3 => {
            if r.num_heads == 0 {
                return Err(invalid!(
                    "a 3-D input [batch, seq, heads*size] needs num_heads, got {x}"
                ));
            }
            match &x.shape.0[2] {
                Dim::Fixed(h) if h % r.num_heads != 0 => {
                    return Err(invalid!(
                        "hidden size of {x} is not a multiple of {} heads",
                        r.num_heads
                    ))
                }
                Dim::Fixed(h) => Some(h / r.num_heads),
                _ => None,
            }
        }
        4 => x.shape.0[3].fixed(),
        _ => {
            return Err(invalid!(
            "input must be 3-D [batch, seq, hidden] or 4-D [batch, heads, seq, head_size], got {x}"
        ))
        }
    };
    let rot = if r.rotary_embedding_dim > 0 { Some(r.rotary_embedding_dim) } else { head_size };
    if let Some(rot) = rot {
        if rot % 2 != 0 {
            return Err(invalid!("the rotated size must be even, got {rot} for {x}"));
        }
        if head_size.is_some_and(|h| rot > h) {
            return Err(invalid!("rotary_embedding_dim {rot} is larger than the head size of {x}"));
        }
    }
    Ok(rot)
}

fn rotary(r: &RotaryEmbedding, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(invalid!("input must be a float tensor, got {x}"));
    }
    let rot = rotated_size(r, x)?;
    let (cos, sin) = (ops.get(1)?.ty, ops.get(2)?.ty);
    same_dtype("input and cos_cache", x, cos)?;
    same_dtype("input and sin_cache", x, sin)?;
    if cos.shape != sin.shape {
        return Err(invalid!(
            "cos_cache and sin_cache must have the same shape, got {cos} and {sin}"
        ));
    }
    let (batch, seq) =
        if x.rank() == 3 { (&x.shape.0[0], &x.shape.0[1]) } else { (&x.shape.0[0], &x.shape.0[2]) };
    let half = rot.map(|r| Dim::Fixed(r / 2));
    if let Some(p) = ops.opt(3) {
        if !p.ty.dtype.is_int() {
            return Err(invalid!("position_ids must be an integer tensor, got {}", p.ty));
        }
        expect_shape(
            "position_ids",
            p.ty,
            &[Some(batch.clone()), Some(seq.clone())],
            "batch, seq",
            x,
        )?;
        expect_shape("cos_cache", cos, &[None, half], "max_position, rotary_dim/2", x)?;
    } else {
        expect_shape(
            "cos_cache",
            cos,
            &[Some(batch.clone()), Some(seq.clone()), half],
            "batch, seq, rotary_dim/2 without position_ids",
            x,
        )?;
    }
    Ok(vec![x.clone()])
}

// ----- CausalConvWithState -----

fn causal_conv(ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if !x.dtype.is_float() {
        return Err(invalid!("input must be a float tensor, got {x}"));
    }
    if x.rank() != 3 {
        return Err(invalid!("input must be 3-D [batch, channels, length], got {x}"));
    }
    let (batch, channels) = (&x.shape.0[0], &x.shape.0[1]);
    let w = ops.get(1)?.ty;
    same_dtype("input and weight", x, w)?;
    expect_shape(
        "weight",
        w,
        &[Some(channels.clone()), Some(Dim::Fixed(1)), None],
        "channels, 1, k",
        x,
    )?;
    // The state holds k - 1 positions; a kernel of no taps has none to hold.
    let state = match &w.shape.0[2] {
        Dim::Fixed(0) => return Err(invalid!("the kernel must have at least one tap, got {w}")),
        Dim::Fixed(k) => Some(Dim::Fixed(k - 1)),
        _ => None,
    };
    if let Some(b) = ops.opt(2) {
        same_dtype("input and bias", x, b.ty)?;
        expect_shape("bias", b.ty, &[Some(channels.clone())], "channels", x)?;
    }
    let state = match ops.opt(3) {
        Some(p) => {
            same_dtype("input and past_state", x, p.ty)?;
            expect_shape(
                "past_state",
                p.ty,
                &[Some(batch.clone()), Some(channels.clone()), state.clone()],
                "batch, channels, k - 1",
                x,
            )?;
            state.unwrap_or_else(|| p.ty.shape.0[2].clone())
        }
        None => state.ok_or_else(|| {
            invalid!("the kernel size of {w} must be known to size present_state")
        })?,
    };
    Ok(vec![
        x.clone(),
        TensorType::new(x.dtype, Shape(vec![batch.clone(), channels.clone(), state])),
    ])
}

// ----- LinearAttention -----

/// The per-head size of a packed `[B, T, heads * size]` operand, which must be known.
fn head_size(what: &str, ty: &TensorType, heads: usize) -> Result<usize, OpError> {
    match ty.shape.0[2] {
        Dim::Fixed(n) if n % heads == 0 => Ok(n / heads),
        Dim::Fixed(n) => {
            Err(invalid!("{what} {ty}: its last axis ({n}) does not split into {heads} heads"))
        }
        _ => Err(invalid!("{what} {ty}: the size of its last axis must be known")),
    }
}

fn linear_attention(a: &LinearAttention, ops: &Operands) -> Infer {
    let (q, k, v) = (ops.get(0)?.ty, ops.get(1)?.ty, ops.get(2)?.ty);
    if !q.dtype.is_float() {
        return Err(invalid!("query must be a float tensor, got {q}"));
    }
    same_dtype("query and key", q, k)?;
    same_dtype("query and value", q, v)?;
    if q.rank() != 3 {
        return Err(invalid!("query must be 3-D [batch, seq, heads * size], got {q}"));
    }
    let (hq, hkv) = (a.q_num_heads, a.kv_num_heads);
    if hq == 0 || hkv == 0 || hq % hkv != 0 {
        return Err(invalid!(
            "q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})"
        ));
    }
    let (batch, seq) = (q.shape.0[0].clone(), q.shape.0[1].clone());
    let bt = |last: Option<Dim>| vec![Some(batch.clone()), Some(seq.clone()), last];
    let d_k = head_size("query", q, hq)?;
    expect_shape("key", k, &bt(Some(Dim::Fixed(hkv * d_k))), "batch, seq, kv heads * d_k", q)?;
    expect_shape("value", v, &bt(None), "batch, seq, kv heads * d_v", q)?;
    let d_v = head_size("value", v, hkv)?;
    let state = Shape(vec![batch.clone(), Dim::Fixed(hkv), Dim::Fixed(d_k), Dim::Fixed(d_v)]);
    let state_dtype = match ops.opt(3) {
        Some(p) => {
            if !p.ty.dtype.is_float() {
                return Err(invalid!("past_state must be a float tensor, got {}", p.ty));
            }
            let want: Vec<Option<Dim>> = state.0.iter().cloned().map(Some).collect();
            expect_shape("past_state", p.ty, &want, "batch, kv heads, d_k, d_v", q)?;
            p.ty.dtype
        }
        None => q.dtype,
    };
    let rule = a.update_rule.name();
    for (i, what, needed, sizes) in [
        (4, "decay", a.update_rule.gated(), [hkv, hkv * d_k]),
        (5, "beta", a.update_rule.delta(), [hkv, 1]),
    ] {
        match (ops.opt(i), needed) {
            (None, true) => return Err(invalid!("update_rule {rule} needs {what}")),
            (Some(_), false) => return Err(invalid!("update_rule {rule} takes no {what}")),
            (None, false) => {}
            (Some(t), true) => {
                same_dtype(&format!("query and {what}"), q, t.ty)?;
                expect_shape(what, t.ty, &bt(None), "batch, seq, heads or features", q)?;
                let last = t.ty.shape.0[2].fixed();
                if !last.is_some_and(|n| sizes.contains(&n)) {
                    return Err(invalid!(
                        "{what} {}: its last axis must be {} or {}",
                        t.ty,
                        sizes[0],
                        sizes[1]
                    ));
                }
            }
        }
    }
    Ok(vec![
        TensorType::new(q.dtype, Shape(vec![batch, seq, Dim::Fixed(hq * d_v)])),
        TensorType::new(state_dtype, state),
    ])
}
