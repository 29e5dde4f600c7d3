//! Gradients of the recurrent layers RNN, GRU and LSTM, by back-propagation through time.
//!
//! The node's results hold only the hidden states, so the rule unrolls the layer again over its
//! (fixed) sequence length, recomputing each step's gates from the operands as the interpreter
//! does (`eval/sequence.rs`; gate order GRU z, r, h and LSTM i, o, f, c), then walks the steps
//! backwards, carrying the gradient of the state. Each step's gate pre-activation gradients are
//! stacked over time, so the weight gradients are one batched MatMul per direction summed over
//! time, and the input's one MatMul. The batch may be symbolic; the sequence, input and hidden
//! sizes must be fixed.
//!
//! Refused with a typed error: `sequence_lens` other than a constant of full lengths, activations
//! other than ONNX's defaults, and `clip`.

use super::{fixed_dims, ty, zeros_like, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::op::{Rnn, RnnCell, RnnDirection};
use crate::{Dim, Op};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match s.op {
        Op::Rnn(r) => recurrent(r, s),
        _ => Err(RuleError::NoRule),
    }
}

// The operands of RNN, GRU and LSTM, in ONNX order.
const X: usize = 0;
const W: usize = 1;
const R: usize = 2;
const B: usize = 3;
const SEQUENCE_LENS: usize = 4;
const INITIAL_H: usize = 5;
const INITIAL_C: usize = 6;
const P: usize = 7;

/// What one direction's cell sees: its gates' weights and input projections, its initial state and
/// the gradients arriving from the layer's results.
struct Direction<'g> {
    /// Time indices in the order the steps run (descending for the reverse direction).
    order: Vec<usize>,
    /// Per gate, its rows of R: [hidden, hidden].
    r: Vec<Traced<'g>>,
    /// Per gate, by time, `x W_gᵀ` plus the biases that add to it: [batch, hidden].
    x_proj: Vec<Vec<Traced<'g>>>,
    /// GRU with `linear_before_reset`: the candidate's recurrent bias, applied inside the reset
    /// product.
    candidate_r_bias: Option<Traced<'g>>,
    /// LSTM peepholes i, o, f: [hidden] each.
    peepholes: Option<[Traced<'g>; 3]>,
    h0: Traced<'g>,
    c0: Traced<'g>,
    /// By time, this direction's slice of the gradient of Y: [batch, hidden].
    dy: Vec<Option<Traced<'g>>>,
    dy_h: Option<Traced<'g>>,
    dy_c: Option<Traced<'g>>,
}

/// One direction's gradients, by gate and in step order (the order `Direction::order` gives).
struct Bptt<'g> {
    /// Per gate: the gradient of its pre-activation, which is also that of `x W_gᵀ` and of the
    /// input biases: [batch, hidden] each step.
    pre: Vec<Vec<Traced<'g>>>,
    /// Per gate: the gradient of its recurrent product `rec_in R_gᵀ` (and recurrent bias), and
    /// `rec_in`. The same as `pre` and the state before the step, except GRU's candidate.
    rec: Vec<Vec<Traced<'g>>>,
    rec_in: Vec<Vec<Traced<'g>>>,
    /// Peephole gradients i, o, f, summed over the steps and the batch: [3 * hidden].
    peepholes: Option<Traced<'g>>,
    /// The gradients of the initial states (the cell state's for LSTM only).
    dh0: Traced<'g>,
    dc0: Option<Traced<'g>>,
}

fn recurrent<'g>(r: &Rnn, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    if r.clip.is_some() {
        return Err(RuleError::Unsupported { what: "a recurrent layer with clip" });
    }
    let defaults = Rnn { activations: Vec::new(), ..r.clone() }.effective_activations();
    if r.effective_activations() != defaults {
        return Err(RuleError::Unsupported {
            what: "a recurrent layer with activations other than the defaults",
        });
    }
    let x = s.input(X)?;
    let (w, rw) = (s.input(W)?, s.input(R)?);
    let x_ty = ty(x)?;
    let seq = match x_ty.shape.dims().get(usize::from(r.batch_first)) {
        Some(Dim::Fixed(n)) => *n,
        _ => {
            return Err(RuleError::NeedsFixedShape {
                what: "the sequence length of X",
                ty: Box::new(x_ty),
            })
        }
    };
    if s.inputs.get(SEQUENCE_LENS).copied().flatten().is_some() {
        // Lengths that are all full change nothing; shorter ones would need each step masked.
        let full =
            s.constant(SEQUENCE_LENS).is_ok_and(|t| t.to_i64s().iter().all(|&n| n == seq as i64));
        if !full {
            return Err(RuleError::Unsupported {
                what: "a recurrent layer's sequence_lens other than a constant of full lengths",
            });
        }
    }
    let (gates, r_dims) = (gate_count(r.cell), fixed_dims(rw, "R")?);
    let [num_dirs, rows, hidden] = r_dims[..] else {
        return Err(RuleError::Unsupported { what: "a recurrent weight R that is not 3-D" });
    };
    fixed_dims(w, "W")?;
    if seq == 0 || hidden == 0 || num_dirs == 0 || rows != gates * hidden {
        return Err(RuleError::Unsupported {
            what: "a recurrent layer with an empty sequence or hidden state",
        });
    }
    let is_lstm = matches!(r.cell, RnnCell::Lstm { .. });
    let operand = |i: usize| s.inputs.get(i).copied().flatten();
    let grad = |i: usize| s.grads.get(i).copied().flatten();
    // Everything below is time-major: X [seq, batch, input], states [dirs, batch, hidden],
    // Y [seq, dirs, batch, hidden].
    let swap01 = |t: Traced<'g>| if r.batch_first { t.transpose(&[1, 0, 2]) } else { t };
    let x_tm = swap01(x);
    let h0 = operand(INITIAL_H).map(swap01);
    let c0 = if is_lstm { operand(INITIAL_C).map(swap01) } else { None };
    let dy = grad(0).map(|d| if r.batch_first { d.transpose(&[1, 2, 0, 3]) } else { d });
    let (dy_h, dy_c) = (grad(1).map(swap01), if is_lstm { grad(2).map(swap01) } else { None });
    let bias = operand(B);
    let peep = if is_lstm { operand(P) } else { None };
    let lbr = matches!(r.cell, RnnCell::Gru { linear_before_reset: true });
    let h = hidden as i64;
    let rows_of = |t: Traced<'g>, first: i64| t.slice(&[first], &[first + h], &[0], &[1]);

    let (mut dx, mut dw, mut dr, mut db, mut dp, mut dh0, mut dc0) =
        (None, vec![], vec![], vec![], vec![], vec![], vec![]);
    for d in 0..num_dirs {
        let pick = |t: Traced<'g>| t.slice(&[d as i64], &[d as i64 + 1], &[0], &[1]).squeeze(&[0]);
        let (wd, rd, bd) = (pick(w), pick(rw), bias.map(pick));
        let r_gates: Vec<Traced<'g>> = (0..gates).map(|g| rows_of(rd, g as i64 * h)).collect();
        let mut x_proj = Vec::with_capacity(gates);
        let mut candidate_r_bias = None;
        for g in 0..gates {
            let first = g as i64 * h;
            let mut proj = x_tm.matmul(rows_of(wd, first).transpose(&[1, 0]));
            if let Some(bd) = bd {
                let (wb, rb) = (rows_of(bd, first), rows_of(bd, gates as i64 * h + first));
                proj = if lbr && g == 2 {
                    candidate_r_bias = Some(rb);
                    proj.add(wb)
                } else {
                    proj.add(wb.add(rb))
                };
            }
            let steps = if seq == 1 { vec![proj] } else { proj.split(0, &vec![1; seq]) };
            x_proj.push(steps.into_iter().map(|t| t.squeeze(&[0])).collect::<Vec<_>>());
        }
        let zeros = zeros_like(x_proj[0][0])?;
        let reverse = r.direction == RnnDirection::Reverse || d == 1;
        let di = d as i64;
        let dir = Direction {
            order: if reverse { (0..seq).rev().collect() } else { (0..seq).collect() },
            r: r_gates,
            x_proj,
            candidate_r_bias,
            peepholes: peep.map(|p| {
                let p = pick(p);
                [rows_of(p, 0), rows_of(p, h), rows_of(p, 2 * h)]
            }),
            h0: h0.map_or(zeros, pick),
            c0: c0.map_or(zeros, pick),
            dy: (0..seq as i64)
                .map(|t| dy.map(|dy| dy.slice(&[t, di], &[t + 1, di + 1], &[0, 1], &[1, 1])))
                .map(|t| t.map(|t| t.squeeze(&[0, 1])))
                .collect(),
            dy_h: dy_h.map(pick),
            dy_c: dy_c.map(pick),
        };
        let b = match r.cell {
            RnnCell::Simple => simple(&dir)?,
            RnnCell::Gru { linear_before_reset } => gru(&dir, linear_before_reset)?,
            RnnCell::Lstm { input_forget } => lstm(&dir, input_forget)?,
        };

        // Pre-activation gradients in time order, [seq, batch, gates * hidden].
        let in_time = |mut v: Vec<Traced<'g>>| {
            if reverse {
                v.reverse();
            }
            v
        };
        // Only what some needed gradient reads is stacked (initial_h's alone needs neither).
        let pre = (s.needs(X) || s.needs(W) || s.needs(B)).then(|| {
            let pre: Vec<Traced<'g>> = b.pre.into_iter().map(|g| stack(in_time(g))).collect();
            concat(&pre, 2)
        });
        let rec = (s.needs(R) || s.needs(B))
            .then(|| b.rec.into_iter().map(stack).collect::<Vec<Traced<'g>>>());
        if let (true, Some(pre)) = (s.needs(X), pre) {
            let dxd = pre.matmul(wd);
            dx = Some(match dx {
                Some(sum) => dxd.add(sum),
                None => dxd,
            });
        }
        if let (true, Some(pre)) = (s.needs(W), pre) {
            dw.push(pre.transpose(&[0, 2, 1]).matmul(x_tm).reduce_sum(&[0], false));
        }
        if let (true, Some(rec)) = (s.needs(R), &rec) {
            let per_gate: Vec<Traced<'g>> = rec
                .iter()
                .zip(b.rec_in)
                .map(|(g, i)| g.transpose(&[0, 2, 1]).matmul(stack(i)).reduce_sum(&[0], false))
                .collect();
            dr.push(concat(&per_gate, 0));
        }
        if let (true, Some(pre), Some(rec)) = (s.needs(B), pre, &rec) {
            let mut parts = vec![pre.reduce_sum(&[0, 1], false)];
            parts.extend(rec.iter().map(|g| g.reduce_sum(&[0, 1], false)));
            db.push(concat(&parts, 0));
        }
        if let Some(p) = b.peepholes {
            dp.push(p);
        }
        dh0.push(b.dh0);
        if let Some(c) = b.dc0 {
            dc0.push(c);
        }
    }

    // Each operand's gradient, directions stacked on the leading axis; only those needed (the
    // per-direction lists of the others are empty).
    let mut out: Grads<'g> = vec![None; s.inputs.len()];
    out[X] = dx.map(swap01);
    for (i, per_direction) in
        [(W, dw), (R, dr), (B, db), (INITIAL_H, dh0), (INITIAL_C, dc0), (P, dp)]
    {
        if s.needs(i) && per_direction.len() == num_dirs {
            let d = stack(per_direction);
            out[i] = Some(if i == INITIAL_H || i == INITIAL_C { swap01(d) } else { d });
        }
    }
    Ok(out)
}

fn gate_count(cell: RnnCell) -> usize {
    match cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 3,
        RnnCell::Lstm { .. } => 4,
    }
}

/// Values of one shape stacked on a new leading axis (the callers pass at least one).
fn stack<'g>(v: Vec<Traced<'g>>) -> Traced<'g> {
    let v: Vec<Traced<'g>> = v.into_iter().map(|t| t.unsqueeze(&[0])).collect();
    concat(&v, 0)
}

/// `v` joined along `axis`; one value is itself (the callers pass at least one).
fn concat<'g>(v: &[Traced<'g>], axis: i64) -> Traced<'g> {
    match v {
        [one] => *one,
        _ => v[0].builder().concat(v, axis),
    }
}

/// A gradient that may have had no contribution, as zeros typed as `like` then.
fn or_zeros<'g>(d: Option<Traced<'g>>, like: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    match d {
        Some(d) => Ok(d),
        None => zeros_like(like),
    }
}

/// `b` plus a gradient that may have had no contribution yet.
fn plus<'g>(a: Option<Traced<'g>>, b: Traced<'g>) -> Traced<'g> {
    match a {
        Some(a) => a.add(b),
        None => b,
    }
}

/// σ'(a) from σ(a): σ (1 - σ).
fn sigmoid_slope(s: Traced<'_>) -> Traced<'_> {
    s.mul(s.scalar(1.0).sub(s))
}

/// tanh'(a) from tanh(a): 1 - tanh².
fn tanh_slope(t: Traced<'_>) -> Traced<'_> {
    t.scalar(1.0).sub(t.mul(t))
}

/// `a R` for a gate's rows R [hidden, hidden]: the gradient of `h Rᵀ` with respect to h.
fn back_through<'g>(a: Traced<'g>, r: Traced<'g>) -> Traced<'g> {
    a.matmul(r)
}

/// The gradient of the state after each step, walking the steps backwards: the carried one plus
/// Y's at that step, or zeros where the loss uses neither.
fn state_grad<'g>(
    dir: &Direction<'g>,
    carried: Option<Traced<'g>>,
    t: usize,
) -> Result<Traced<'g>, RuleError> {
    let here = dir.dy[t];
    Ok(match (carried, here) {
        (Some(a), Some(b)) => a.add(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => zeros_like(dir.h0)?,
    })
}

/// RNN: h' = tanh(x Wᵀ + h Rᵀ + Wb + Rb).
fn simple<'g>(dir: &Direction<'g>) -> Result<Bptt<'g>, RuleError> {
    let rt = dir.r[0].transpose(&[1, 0]);
    let mut states = Vec::with_capacity(dir.order.len());
    let mut h = dir.h0;
    for &t in &dir.order {
        let next = dir.x_proj[0][t].add(h.matmul(rt)).tanh();
        states.push((h, next));
        h = next;
    }
    let (mut pre, mut dh) = (Vec::new(), dir.dy_h);
    for (&t, &(before, after)) in dir.order.iter().zip(&states).rev() {
        let da = state_grad(dir, dh, t)?.mul(tanh_slope(after));
        dh = Some(back_through(da, dir.r[0]));
        pre.push((da, before));
    }
    pre.reverse();
    let (da, before): (Vec<_>, Vec<_>) = pre.into_iter().unzip();
    Ok(Bptt {
        pre: vec![da.clone()],
        rec: vec![da],
        rec_in: vec![before],
        peepholes: None,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: None,
    })
}

/// GRU, gates z, r, h: z = σ(x W_zᵀ + h R_zᵀ + b_z), r likewise, the candidate
/// n = tanh(x W_hᵀ + (r ⊙ h) R_hᵀ + b_h), or with `linear_before_reset`
/// n = tanh(x W_hᵀ + Wb_h + r ⊙ (h R_hᵀ + Rb_h)); h' = (1 - z) ⊙ n + z ⊙ h.
fn gru<'g>(dir: &Direction<'g>, linear_before_reset: bool) -> Result<Bptt<'g>, RuleError> {
    struct Saved<'g> {
        h: Traced<'g>,
        z: Traced<'g>,
        r: Traced<'g>,
        n: Traced<'g>,
        /// What multiplies R_hᵀ: r ⊙ h, or h with `linear_before_reset`.
        rec_in: Traced<'g>,
        /// With `linear_before_reset`: h R_hᵀ + Rb_h, which r multiplies.
        q: Option<Traced<'g>>,
    }
    let rt: Vec<Traced<'g>> = dir.r.iter().map(|r| r.transpose(&[1, 0])).collect();
    let mut saved = Vec::with_capacity(dir.order.len());
    let mut h = dir.h0;
    for &t in &dir.order {
        let x = |g: usize| dir.x_proj[g][t];
        let z = x(0).add(h.matmul(rt[0])).sigmoid();
        let r = x(1).add(h.matmul(rt[1])).sigmoid();
        let (n, rec_in, q) = if linear_before_reset {
            let mut q = h.matmul(rt[2]);
            if let Some(rb) = dir.candidate_r_bias {
                q = q.add(rb);
            }
            (x(2).add(r.mul(q)).tanh(), h, Some(q))
        } else {
            let rh = r.mul(h);
            (x(2).add(rh.matmul(rt[2])).tanh(), rh, None)
        };
        let next = z.scalar(1.0).sub(z).mul(n).add(z.mul(h));
        saved.push(Saved { h, z, r, n, rec_in, q });
        h = next;
    }
    let mut pre: Vec<Vec<Traced<'g>>> = vec![Vec::new(); 3];
    let mut rec_h = Vec::with_capacity(saved.len());
    let mut dh = dir.dy_h;
    for (&t, v) in dir.order.iter().zip(&saved).rev() {
        let dnext = state_grad(dir, dh, t)?;
        let dn = dnext.mul(v.z.scalar(1.0).sub(v.z));
        let dz = dnext.mul(v.h.sub(v.n));
        let mut dprev = dnext.mul(v.z);
        let dn_pre = dn.mul(tanh_slope(v.n));
        let (dr, drec) = match v.q {
            Some(q) => {
                let dq = dn_pre.mul(v.r);
                dprev = dprev.add(back_through(dq, dir.r[2]));
                (dn_pre.mul(q), dq)
            }
            None => {
                let drh = back_through(dn_pre, dir.r[2]);
                dprev = dprev.add(drh.mul(v.r));
                (drh.mul(v.h), dn_pre)
            }
        };
        let dz_pre = dz.mul(sigmoid_slope(v.z));
        let dr_pre = dr.mul(sigmoid_slope(v.r));
        dprev = dprev.add(back_through(dz_pre, dir.r[0])).add(back_through(dr_pre, dir.r[1]));
        for (g, p) in [dz_pre, dr_pre, dn_pre].into_iter().enumerate() {
            pre[g].push(p);
        }
        rec_h.push(drec);
        dh = Some(dprev);
    }
    // Back to step order.
    for g in &mut pre {
        g.reverse();
    }
    rec_h.reverse();
    let before: Vec<Traced<'g>> = saved.iter().map(|v| v.h).collect();
    Ok(Bptt {
        rec: vec![pre[0].clone(), pre[1].clone(), rec_h],
        rec_in: vec![before.clone(), before, saved.iter().map(|v| v.rec_in).collect()],
        pre,
        peepholes: None,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: None,
    })
}

/// LSTM, gates i, o, f, c (peepholes i, o, f): i = σ(x W_iᵀ + h R_iᵀ + b_i + p_i ⊙ c),
/// f likewise (or 1 - i with `input_forget`), g = tanh(x W_cᵀ + h R_cᵀ + b_c),
/// c' = f ⊙ c + i ⊙ g, o = σ(x W_oᵀ + h R_oᵀ + b_o + p_o ⊙ c'), h' = o ⊙ tanh(c').
fn lstm<'g>(dir: &Direction<'g>, input_forget: bool) -> Result<Bptt<'g>, RuleError> {
    const IN: usize = 0;
    const OUT: usize = 1;
    const FORGET: usize = 2;
    const CELL: usize = 3;
    struct Saved<'g> {
        h: Traced<'g>,
        c: Traced<'g>,
        i: Traced<'g>,
        o: Traced<'g>,
        f: Traced<'g>,
        g: Traced<'g>,
        c_next: Traced<'g>,
        tanh_c_next: Traced<'g>,
    }
    let rt: Vec<Traced<'g>> = dir.r.iter().map(|r| r.transpose(&[1, 0])).collect();
    let peep = dir.peepholes;
    let mut saved = Vec::with_capacity(dir.order.len());
    let (mut h, mut c) = (dir.h0, dir.c0);
    for &t in &dir.order {
        let pre = |gate: usize, peephole: Option<(usize, Traced<'g>)>| {
            let a = dir.x_proj[gate][t].add(h.matmul(rt[gate]));
            match (peep, peephole) {
                (Some(p), Some((k, state))) => a.add(p[k].mul(state)),
                _ => a,
            }
        };
        let i = pre(IN, Some((0, c))).sigmoid();
        let f =
            if input_forget { i.scalar(1.0).sub(i) } else { pre(FORGET, Some((2, c))).sigmoid() };
        let g = pre(CELL, None).tanh();
        let c_next = f.mul(c).add(i.mul(g));
        let o = pre(OUT, Some((1, c_next))).sigmoid();
        let tanh_c_next = c_next.tanh();
        saved.push(Saved { h, c, i, o, f, g, c_next, tanh_c_next });
        h = o.mul(tanh_c_next);
        c = c_next;
    }
    let mut pre: Vec<Vec<Traced<'g>>> = vec![Vec::new(); 4];
    let mut dpeep: [Option<Traced<'g>>; 3] = [None; 3];
    let (mut dh, mut dc) = (dir.dy_h, dir.dy_c);
    for (&t, v) in dir.order.iter().zip(&saved).rev() {
        let dnext = state_grad(dir, dh, t)?;
        let da_o = dnext.mul(v.tanh_c_next).mul(sigmoid_slope(v.o));
        let mut dc_next = plus(dc, dnext.mul(v.o).mul(tanh_slope(v.tanh_c_next)));
        if let Some(p) = peep {
            dc_next = dc_next.add(da_o.mul(p[1]));
        }
        let (mut di, df) = (dc_next.mul(v.g), dc_next.mul(v.c));
        let dg = dc_next.mul(v.i);
        let mut dprev_c = dc_next.mul(v.f);
        if input_forget {
            // f = 1 - i.
            di = di.sub(df);
        }
        let da_i = di.mul(sigmoid_slope(v.i));
        let da_f = if input_forget { zeros_like(da_i)? } else { df.mul(sigmoid_slope(v.f)) };
        let da_c = dg.mul(tanh_slope(v.g));
        if let Some(p) = peep {
            dprev_c = dprev_c.add(da_i.mul(p[0]));
            if !input_forget {
                dprev_c = dprev_c.add(da_f.mul(p[2]));
            }
            let sums = [da_i.mul(v.c), da_o.mul(v.c_next), da_f.mul(v.c)];
            for (acc, s) in dpeep.iter_mut().zip(sums) {
                *acc = Some(plus(*acc, s.reduce_sum(&[0], false)));
            }
        }
        let by_gate = [da_i, da_o, da_f, da_c];
        // The coupled forget gate has no recurrent product of its own.
        let mut dprev = back_through(da_i, dir.r[IN]);
        for g in [OUT, FORGET, CELL] {
            if !(input_forget && g == FORGET) {
                dprev = dprev.add(back_through(by_gate[g], dir.r[g]));
            }
        }
        for (g, p) in by_gate.into_iter().enumerate() {
            pre[g].push(p);
        }
        dh = Some(dprev);
        dc = Some(dprev_c);
    }
    for g in &mut pre {
        g.reverse();
    }
    let before: Vec<Traced<'g>> = saved.iter().map(|v| v.h).collect();
    let peepholes = match dpeep {
        [Some(i), Some(o), Some(f)] => Some(i.builder().concat(&[i, o, f], 0)),
        _ => None,
    };
    Ok(Bptt {
        rec: pre.clone(),
        rec_in: vec![before; 4],
        pre,
        peepholes,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: Some(or_zeros(dc, dir.c0)?),
    })
}
