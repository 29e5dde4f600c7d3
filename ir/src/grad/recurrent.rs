//! Gradients of the recurrent layers RNN, GRU and LSTM, by back-propagation through time.
//!
//! The layer is unrolled over its (fixed) sequence length. Its hidden states are its result Y, so
//! the state before each step is the previous step's Y (or the initial state), and every step's
//! gates are recomputed at once from them, as the interpreter computes them
//! (`eval/sequence.rs`; gate order GRU z, r, h and LSTM i, o, f, c); only LSTM's cell state,
//! which Y does not hold, is recomputed step by step (elementwise). Then the steps are walked
//! backwards, carrying the gradient of the state (and cell state). Each step's gate
//! pre-activation gradients are stacked over time, so the weight gradients are one batched
//! MatMul per direction summed over time, and the input's one MatMul. The batch may be symbolic;
//! the sequence, input and hidden sizes must be fixed.
//!
//! With `sequence_lens` (a constant or a run-time value), a step past a sequence's length keeps
//! its state and outputs zeros, as in the interpreter: its gradient passes the state's gradient
//! on unchanged and gives the gates none (Where on `t < len`); an empty sequence's final states
//! are zeros, so Y_h's and Y_c's gradients do not reach its initial states.
//!
//! Activations: Sigmoid, Tanh, Relu and LeakyRelu, whose derivatives come from their results;
//! with `clip`, a pre-activation outside [-clip, clip] passes no gradient. Other activations are
//! refused with a typed error.

use super::{fixed_dims, ty, zeros_like, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::op::{Rnn, RnnCell, RnnDirection};
use crate::{DType, Dim, Op, UnaryOp};

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

/// What one direction's cell sees: its gates' weights and input projections, its states and the
/// gradients arriving from the layer's results. Values over time are [seq, batch, hidden] in time
/// order; a step's are [batch, hidden].
struct Direction<'g> {
    seq: usize,
    /// The layer's `clip`.
    clip: Option<f64>,
    /// The cell's activations f, g[, h].
    activations: Vec<Activation>,
    /// Time indices in the order the steps run (descending for the reverse direction).
    order: Vec<usize>,
    /// Per gate, its rows of R: [hidden, hidden].
    r: Vec<Traced<'g>>,
    /// Per gate, over time, `x W_gᵀ` plus the biases that add to it.
    x_proj: Vec<Traced<'g>>,
    /// GRU with `linear_before_reset`: the candidate's recurrent bias, applied inside the reset
    /// product.
    candidate_r_bias: Option<Traced<'g>>,
    /// LSTM peepholes i, o, f: [hidden] each.
    peepholes: Option<[Traced<'g>; 3]>,
    h0: Traced<'g>,
    c0: Traced<'g>,
    /// Over time, the hidden state after each step (this direction's Y) and before it (the
    /// previous step's, or the initial state): the forward's own results, so no step waits for
    /// another to recompute them.
    after: Traced<'g>,
    before: Traced<'g>,
    /// By time, this direction's slice of the gradient of Y.
    dy: Vec<Option<Traced<'g>>>,
    dy_h: Option<Traced<'g>>,
    dy_c: Option<Traced<'g>>,
    /// With sequence_lens: by time, where each sequence's step ran ([batch, 1] bool).
    live: Option<Vec<Traced<'g>>>,
    /// [batch, hidden].
    zeros: Traced<'g>,
}

impl<'g> Direction<'g> {
    /// The gradient of a state a step at time `t` takes in: none where the step did not run.
    fn entering(&self, t: usize, d: Traced<'g>) -> Traced<'g> {
        match &self.live {
            Some(live) => live[t].select(d, self.zeros),
            None => d,
        }
    }

    /// The gradient of the state before the step at time `t`: through the step where it ran,
    /// the state's after it where it did not (the state was carried over).
    fn past_step(&self, t: usize, through: Traced<'g>, carried: Traced<'g>) -> Traced<'g> {
        match &self.live {
            Some(live) => live[t].select(through, carried),
            None => through,
        }
    }

    /// A pre-activation as the activation sees it: clipped where the layer clips.
    fn clipped(&self, a: Traced<'g>) -> Traced<'g> {
        match self.clip {
            Some(c) => a.clip(-c, c),
            None => a,
        }
    }

    /// The gradient `d` of a clipped pre-activation as that of `a`, the one before the clip:
    /// none where the clip cut it (`a` is only read when the layer clips).
    fn unclipped(&self, a: impl FnOnce() -> Traced<'g>, d: Traced<'g>) -> Traced<'g> {
        match self.clip {
            Some(c) => {
                let a = a();
                a.abs().greater(a.scalar(c)).select(d.scalar(0.0), d)
            }
            None => d,
        }
    }

    /// A recomputed state where the step at time `t` ran, the previous one where it did not.
    fn step_state(&self, t: usize, new: Traced<'g>, old: Traced<'g>) -> Traced<'g> {
        match &self.live {
            Some(live) => live[t].select(new, old),
            None => new,
        }
    }
}

/// One direction's gradients, per gate by time (stacked by the caller, only where a gradient it
/// needs reads them).
struct Bptt<'g> {
    /// Per gate: the gradient of its pre-activation, which is also that of `x W_gᵀ` and of the
    /// input biases.
    pre: Vec<Vec<Traced<'g>>>,
    /// Per gate: the gradient of its recurrent product `rec_in R_gᵀ` (and recurrent bias), and
    /// `rec_in` over time. The same as `pre` and the state before the step, except GRU's
    /// candidate.
    rec: Vec<Vec<Traced<'g>>>,
    rec_in: Vec<Traced<'g>>,
    /// Peephole gradients i, o, f, summed over the steps and the batch: [3 * hidden].
    peepholes: Option<Traced<'g>>,
    /// The gradients of the initial states (the cell state's for LSTM only).
    dh0: Traced<'g>,
    dc0: Option<Traced<'g>>,
}

fn recurrent<'g>(r: &Rnn, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let activations: Vec<Activation> = r
        .effective_activations()
        .into_iter()
        .map(|op| Some(Activation { op, slope: slope_from_result(op)? }))
        .collect::<Option<_>>()
        .ok_or(RuleError::Unsupported {
            what: "a recurrent layer activation other than Sigmoid, Tanh, Relu or LeakyRelu",
        })?;
    let per_direction = match r.cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 2,
        RnnCell::Lstm { .. } => 3,
    };
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
    // Lengths that are constant and all full change nothing; others mask the steps.
    let lens = s.inputs.get(SEQUENCE_LENS).copied().flatten().filter(|_| {
        !s.constant(SEQUENCE_LENS).is_ok_and(|t| t.to_i64s().iter().all(|&n| n == seq as i64))
    });
    let (gates, r_dims) = (gate_count(r.cell), fixed_dims(rw, "R")?);
    let [num_dirs, rows, hidden] = r_dims[..] else {
        return Err(RuleError::Unsupported { what: "a recurrent weight R that is not 3-D" });
    };
    if activations.len() != num_dirs * per_direction {
        return Err(RuleError::Unsupported {
            what: "a recurrent layer without one list of activations per direction",
        });
    }
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
    let time_major = |t: Traced<'g>| if r.batch_first { t.transpose(&[1, 2, 0, 3]) } else { t };
    let y = s
        .outputs
        .first()
        .copied()
        .ok_or(RuleError::Unsupported { what: "a recurrent layer without its result Y" })?;
    let (y, dy) = (time_major(y), grad(0).map(time_major));
    let (dy_h, dy_c) = (grad(1).map(swap01), if is_lstm { grad(2).map(swap01) } else { None });
    let bias = operand(B);
    let peep = if is_lstm { operand(P) } else { None };
    let lbr = matches!(r.cell, RnnCell::Gru { linear_before_reset: true });
    // With sequence_lens: by time, whether each sequence's step there ran ([batch, 1] bool), and
    // whether it ran at all (an empty sequence ends with zero states, not its initial ones).
    let (live, nonempty) = match lens {
        Some(lens) => {
            let col = lens.cast(DType::I64).unsqueeze(&[1]);
            let live: Vec<Traced<'g>> =
                (0..seq).map(|t| col.greater(col.scalar(t as f64))).collect();
            (Some(live), Some(col.greater(col.scalar(0.0))))
        }
        None => (None, None),
    };
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
            x_proj.push(proj);
        }
        let reverse = r.direction == RnnDirection::Reverse || d == 1;
        let di = d as i64;
        let after = y.slice(&[di], &[di + 1], &[1], &[1]).squeeze(&[1]);
        let zeros = zeros_like(after.slice(&[0], &[1], &[0], &[1]).squeeze(&[0]))?;
        let h0 = h0.map_or(zeros, pick);
        // Each step starts from the state the previous step (in its direction) ended with. A
        // sequence's reverse steps start at its own last step, from the initial state: where the
        // next time's step did not run, Y there is zeros and the state before is h0. (A step that
        // did not run reads whatever is there, and its gradients are masked.)
        let first = h0.unsqueeze(&[0]);
        let last = seq as i64;
        let before = match (seq, reverse, &live) {
            (1, ..) => first,
            (_, false, _) => s.g.concat(&[first, after.slice(&[0], &[last - 1], &[0], &[1])], 0),
            (_, true, None) => s.g.concat(&[after.slice(&[1], &[last], &[0], &[1]), first], 0),
            (_, true, Some(live)) => {
                let steps = by_time(after, seq);
                let mut v: Vec<Traced<'g>> =
                    (1..seq).map(|t| live[t].select(steps[t], h0)).collect();
                v.push(h0);
                stack(v)
            }
        };
        let masked = |d: Traced<'g>, by: Option<Traced<'g>>| match by {
            Some(m) => m.select(d, zeros),
            None => d,
        };
        let dir = Direction {
            seq,
            clip: r.clip.map(f64::from),
            activations: activations[d * per_direction..(d + 1) * per_direction].to_vec(),
            order: if reverse { (0..seq).rev().collect() } else { (0..seq).collect() },
            r: r_gates,
            x_proj,
            candidate_r_bias,
            peepholes: peep.map(|p| {
                let p = pick(p);
                [rows_of(p, 0), rows_of(p, h), rows_of(p, 2 * h)]
            }),
            h0,
            c0: c0.map_or(zeros, pick),
            after,
            before,
            // Y is zeros where a step did not run, Y_h and Y_c where a sequence is empty.
            dy: match dy {
                Some(dy) => by_time(dy.slice(&[di], &[di + 1], &[1], &[1]).squeeze(&[1]), seq)
                    .into_iter()
                    .enumerate()
                    .map(|(t, d)| Some(masked(d, live.as_ref().map(|l| l[t]))))
                    .collect(),
                None => vec![None; seq],
            },
            dy_h: dy_h.map(|d| masked(pick(d), nonempty)),
            dy_c: dy_c.map(|d| masked(pick(d), nonempty)),
            live: live.clone(),
            zeros,
        };
        let b = match r.cell {
            RnnCell::Simple => simple(&dir)?,
            RnnCell::Gru { linear_before_reset } => gru(&dir, linear_before_reset)?,
            RnnCell::Lstm { input_forget } => lstm(&dir, input_forget)?,
        };

        // The gates' pre-activation gradients side by side, [seq, batch, gates * hidden].
        let pre = (s.needs(X) || s.needs(W) || s.needs(B)).then(|| {
            let pre: Vec<Traced<'g>> = b.pre.into_iter().map(stack).collect();
            concat(&pre, 2)
        });
        let rec: Vec<Traced<'g>> = if s.needs(R) || s.needs(B) {
            b.rec.into_iter().map(stack).collect()
        } else {
            Vec::new()
        };
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
        if s.needs(R) {
            let per_gate: Vec<Traced<'g>> = rec
                .iter()
                .zip(b.rec_in)
                .map(|(g, i)| g.transpose(&[0, 2, 1]).matmul(i).reduce_sum(&[0], false))
                .collect();
            dr.push(concat(&per_gate, 0));
        }
        if let (true, Some(pre)) = (s.needs(B), pre) {
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

/// How the derivative of an activation is formed from its result y (which the rule has at hand,
/// where the pre-activation would be one more value to keep): `None` where it is not.
#[derive(Clone, Copy)]
enum Slope {
    /// σ' = y (1 - y).
    Sigmoid,
    /// tanh' = 1 - y².
    Tanh,
    /// 1 where y > 0, else `alpha` (Relu: 0). y > 0 exactly where x > 0, as alpha > 0.
    Linear { alpha: f64 },
}

/// An activation of the cell and how its derivative is formed.
#[derive(Clone, Copy)]
struct Activation {
    op: UnaryOp,
    slope: Slope,
}

fn slope_from_result(a: UnaryOp) -> Option<Slope> {
    match a {
        UnaryOp::Sigmoid => Some(Slope::Sigmoid),
        UnaryOp::Tanh => Some(Slope::Tanh),
        UnaryOp::Relu => Some(Slope::Linear { alpha: 0.0 }),
        UnaryOp::LeakyRelu { alpha } if alpha > 0.0 => {
            Some(Slope::Linear { alpha: f64::from(alpha) })
        }
        _ => None,
    }
}

/// `dy` times the derivative of activation `a` at the pre-activation that gave `y`.
fn through<'g>(a: Activation, y: Traced<'g>, dy: Traced<'g>) -> Traced<'g> {
    match a.slope {
        Slope::Sigmoid => dy.mul(y.mul(y.scalar(1.0).sub(y))),
        Slope::Tanh => dy.mul(y.scalar(1.0).sub(y.mul(y))),
        Slope::Linear { alpha } => {
            let zero = y.scalar(0.0);
            y.greater(zero).select(dy, if alpha == 0.0 { zero } else { dy.mul(y.scalar(alpha)) })
        }
    }
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

/// A value over time, [seq, batch, hidden], as its steps [batch, hidden] by time.
fn by_time(t: Traced<'_>, seq: usize) -> Vec<Traced<'_>> {
    let parts = if seq == 1 { vec![t] } else { t.split(0, &vec![1; seq]) };
    parts.into_iter().map(|p| p.squeeze(&[0])).collect()
}

/// Values the backward walk made, each with its time, in time order.
fn in_time_order<T>(mut walked: Vec<(usize, T)>) -> Vec<T> {
    walked.sort_by_key(|(t, _)| *t);
    walked.into_iter().map(|(_, v)| v).collect()
}

/// Gate `g`'s `x W_gᵀ + h R_gᵀ` plus the biases that add to them, for every step at once from the
/// states before each step: [seq, batch, hidden].
fn linear_part<'g>(dir: &Direction<'g>, g: usize) -> Traced<'g> {
    dir.x_proj[g].add(dir.before.matmul(dir.r[g].transpose(&[1, 0])))
}

/// RNN: h' = f(x Wᵀ + h Rᵀ + Wb + Rb), so f' comes from h' (Y) alone.
fn simple<'g>(dir: &Direction<'g>) -> Result<Bptt<'g>, RuleError> {
    let after = by_time(dir.after, dir.seq);
    // The pre-activations, which only a clip needs (f' comes from f's result).
    let pre_act = dir.clip.map(|_| by_time(linear_part(dir, 0), dir.seq));
    let (mut walked, mut dh) = (Vec::with_capacity(dir.seq), dir.dy_h);
    for &t in dir.order.iter().rev() {
        let dnext = state_grad(dir, dh, t)?;
        let da = through(dir.activations[0], after[t], dir.entering(t, dnext));
        let da = match &pre_act {
            Some(a) => dir.unclipped(|| a[t], da),
            None => da,
        };
        dh = Some(dir.past_step(t, back_through(da, dir.r[0]), dnext));
        walked.push((t, da));
    }
    let da = in_time_order(walked);
    Ok(Bptt {
        pre: vec![da.clone()],
        rec: vec![da],
        rec_in: vec![dir.before],
        peepholes: None,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: None,
    })
}

/// GRU, gates z, r, h, activations f = σ and g = tanh by default: z = f(x W_zᵀ + h R_zᵀ + b_z),
/// r likewise, the candidate n = g(x W_hᵀ + (r ⊙ h) R_hᵀ + b_h), or with `linear_before_reset`
/// n = g(x W_hᵀ + Wb_h + r ⊙ (h R_hᵀ + Rb_h)); h' = (1 - z) ⊙ n + z ⊙ h. The gates of every
/// step are computed at once from the states before each step.
fn gru<'g>(dir: &Direction<'g>, linear_before_reset: bool) -> Result<Bptt<'g>, RuleError> {
    let [f, g] = [dir.activations[0], dir.activations[1]];
    let (z_pre, r_pre) = (linear_part(dir, 0), linear_part(dir, 1));
    let z = dir.clipped(z_pre).unary(f.op);
    let r = dir.clipped(r_pre).unary(f.op);
    let hb = dir.before;
    let candidate_rt = dir.r[2].transpose(&[1, 0]);
    // What multiplies R_hᵀ (r ⊙ h, or h with linear_before_reset), and with linear_before_reset
    // h R_hᵀ + Rb_h, which r multiplies.
    let (n, rec_in, q) = if linear_before_reset {
        let mut q = hb.matmul(candidate_rt);
        if let Some(rb) = dir.candidate_r_bias {
            q = q.add(rb);
        }
        (dir.x_proj[2].add(r.mul(q)), hb, Some(by_time(q, dir.seq)))
    } else {
        let rh = r.mul(hb);
        (dir.x_proj[2].add(rh.matmul(candidate_rt)), rh, None)
    };
    let n_pre = n;
    let n = dir.clipped(n_pre).unary(g.op);
    // The pre-activations by time, which only a clip needs.
    let pre_act = dir.clip.map(|_| [z_pre, r_pre, n_pre].map(|v| by_time(v, dir.seq)));
    let unclipped = |k: usize, t: usize, d: Traced<'g>| match &pre_act {
        Some(a) => dir.unclipped(|| a[k][t], d),
        None => d,
    };
    let [z, r, n, hb] = [z, r, n, hb].map(|v| by_time(v, dir.seq));
    let mut walked = Vec::with_capacity(dir.seq);
    let mut dh = dir.dy_h;
    for &t in dir.order.iter().rev() {
        let carried = state_grad(dir, dh, t)?;
        let dnext = dir.entering(t, carried);
        let dn = dnext.mul(z[t].scalar(1.0).sub(z[t]));
        let dz = dnext.mul(hb[t].sub(n[t]));
        let mut dprev = dnext.mul(z[t]);
        let dn_pre = unclipped(2, t, through(g, n[t], dn));
        let (dr, drec) = match &q {
            Some(q) => {
                let dq = dn_pre.mul(r[t]);
                dprev = dprev.add(back_through(dq, dir.r[2]));
                (dn_pre.mul(q[t]), dq)
            }
            None => {
                let drh = back_through(dn_pre, dir.r[2]);
                dprev = dprev.add(drh.mul(r[t]));
                (drh.mul(hb[t]), dn_pre)
            }
        };
        let dz_pre = unclipped(0, t, through(f, z[t], dz));
        let dr_pre = unclipped(1, t, through(f, r[t], dr));
        dprev = dprev.add(back_through(dz_pre, dir.r[0])).add(back_through(dr_pre, dir.r[1]));
        walked.push((t, [dz_pre, dr_pre, dn_pre, drec]));
        dh = Some(dir.past_step(t, dprev, carried));
    }
    let steps = in_time_order(walked);
    let gate = |g: usize| steps.iter().map(|s| s[g]).collect::<Vec<_>>();
    Ok(Bptt {
        pre: vec![gate(0), gate(1), gate(2)],
        rec: vec![gate(0), gate(1), gate(3)],
        rec_in: vec![dir.before, dir.before, rec_in],
        peepholes: None,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: None,
    })
}

/// LSTM, gates i, o, f, c (peepholes i, o, f), activations f = σ, g = h = tanh by default:
/// i = f(x W_iᵀ + h R_iᵀ + b_i + p_i ⊙ c), the forget gate likewise (or 1 - i with
/// `input_forget`), c̃ = g(x W_cᵀ + h R_cᵀ + b_c), c' = forget ⊙ c + i ⊙ c̃,
/// o = f(x W_oᵀ + h R_oᵀ + b_o + p_o ⊙ c'), h' = o ⊙ h(c'). The
/// products with R are computed for every step at once from the states before each step; the
/// cell state, which Y does not hold, is recomputed step by step.
fn lstm<'g>(dir: &Direction<'g>, input_forget: bool) -> Result<Bptt<'g>, RuleError> {
    const IN: usize = 0;
    const OUT: usize = 1;
    const FORGET: usize = 2;
    const CELL: usize = 3;
    struct Saved<'g> {
        c: Traced<'g>,
        i: Traced<'g>,
        o: Traced<'g>,
        f: Traced<'g>,
        g: Traced<'g>,
        c_next: Traced<'g>,
        /// h(c'), which o multiplies.
        out_c: Traced<'g>,
        /// The pre-activations of i, o, f (the coupled one's is i's) and c, before any clip.
        pre: [Traced<'g>; 4],
    }
    let [gate_act, cell_act, out_act] = [0, 1, 2].map(|k| dir.activations[k]);
    // Per gate, by time: x W_gᵀ + h R_gᵀ + biases, before the peephole term.
    let linear: Vec<Vec<Traced<'g>>> = (0..4)
        .map(|g| {
            // The coupled forget gate has no weights of its own in use.
            if input_forget && g == FORGET {
                Vec::new()
            } else {
                by_time(linear_part(dir, g), dir.seq)
            }
        })
        .collect();
    let peep = dir.peepholes;
    let mut saved = Vec::with_capacity(dir.seq);
    let mut c = dir.c0;
    for &t in &dir.order {
        let pre = |gate: usize, peephole: Option<(usize, Traced<'g>)>| {
            let a = linear[gate][t];
            match (peep, peephole) {
                (Some(p), Some((k, state))) => a.add(p[k].mul(state)),
                _ => a,
            }
        };
        let a_i = pre(IN, Some((0, c)));
        let i = dir.clipped(a_i).unary(gate_act.op);
        let (f, a_f) = if input_forget {
            (i.scalar(1.0).sub(i), a_i)
        } else {
            let a_f = pre(FORGET, Some((2, c)));
            (dir.clipped(a_f).unary(gate_act.op), a_f)
        };
        let a_c = pre(CELL, None);
        let g = dir.clipped(a_c).unary(cell_act.op);
        let c_next = f.mul(c).add(i.mul(g));
        let a_o = pre(OUT, Some((1, c_next)));
        let o = dir.clipped(a_o).unary(gate_act.op);
        // h is applied to the cell state unclipped, as the interpreter does.
        let out_c = c_next.unary(out_act.op);
        let pre = [a_i, a_o, a_f, a_c];
        saved.push((t, Saved { c, i, o, f, g, c_next, out_c, pre }));
        c = dir.step_state(t, c_next, c);
    }
    let mut walked = Vec::with_capacity(dir.seq);
    let mut dpeep: [Option<Traced<'g>>; 3] = [None; 3];
    let (mut dh, mut dc) = (dir.dy_h, dir.dy_c);
    for (t, v) in saved.iter().rev() {
        let t = *t;
        let carried = state_grad(dir, dh, t)?;
        let dnext = dir.entering(t, carried);
        let da_o = dir.unclipped(|| v.pre[OUT], through(gate_act, v.o, dnext.mul(v.out_c)));
        let mut dc_next =
            plus(dc.map(|d| dir.entering(t, d)), through(out_act, v.out_c, dnext.mul(v.o)));
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
        let da_i = dir.unclipped(|| v.pre[IN], through(gate_act, v.i, di));
        let da_f = if input_forget {
            zeros_like(da_i)?
        } else {
            dir.unclipped(|| v.pre[FORGET], through(gate_act, v.f, df))
        };
        let da_c = dir.unclipped(|| v.pre[CELL], through(cell_act, v.g, dg));
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
        walked.push((t, by_gate));
        dh = Some(dir.past_step(t, dprev, carried));
        dc = Some(match dir.live {
            Some(_) => dir.past_step(t, dprev_c, or_zeros(dc, dir.c0)?),
            None => dprev_c,
        });
    }
    let steps = in_time_order(walked);
    let pre: Vec<Vec<Traced<'g>>> = (0..4).map(|g| steps.iter().map(|s| s[g]).collect()).collect();
    let peepholes = match dpeep {
        [Some(i), Some(o), Some(f)] => Some(i.builder().concat(&[i, o, f], 0)),
        _ => None,
    };
    Ok(Bptt {
        rec: pre.clone(),
        rec_in: vec![dir.before; 4],
        pre,
        peepholes,
        dh0: or_zeros(dh, dir.h0)?,
        dc0: Some(or_zeros(dc, dir.c0)?),
    })
}
