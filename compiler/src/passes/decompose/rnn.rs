//! RNN, GRU and LSTM unrolled over their static sequence length.
//!
//! Per direction, each gate's input projection `x W_gᵀ + bias` is one Gemm over every step at
//! once (a [seq*batch, hidden] result split into steps); each step then computes
//! `Gemm(h, R_g, C = that step's projection)` per gate and the cell's elementwise arithmetic,
//! the same as `kiln_ir::eval::sequence` (gate order: GRU z, r, h; LSTM i, o, f, c).
//!
//! With `sequence_lens`, a step past a sequence's length keeps its state (Where on `step < len`)
//! and emits zeros; the reverse direction reads each sequence from its own last step, which is a
//! Gather of the projections by `(len - 1 - step) * batch + b`, and its outputs are put back in
//! time order by the same Gather. A sequence of length 0 ends with zero states, as onnxruntime.

use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
use kiln_ir::{BinaryOp, DType, NodeId, Op, Tensor, UnaryOp, ValueId};

use super::{compute_type, Emit};
use crate::Result;

/// The values derived from `sequence_lens` that the steps and the outputs use.
struct Lens {
    /// [batch, 1] i64.
    col: ValueId,
    /// [seq, batch, 1] bool: step t counts for sequence b.
    valid: ValueId,
    /// [batch, 1] bool: the sequence is not empty.
    nonempty: ValueId,
    /// For the reverse direction: [seq*batch] i64 rows of the [seq*batch, ...] step layout, and
    /// the same split per step ([batch] each).
    reverse_rows: Option<(ValueId, Vec<ValueId>)>,
}

pub(super) fn decompose(e: &mut Emit, id: NodeId, r: &Rnn) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (Some(x), Some(w), Some(rw)) = (operand(0), operand(1), operand(2)) else {
        return Ok(None);
    };
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let xd = e.dims(x)?;
    let (seq, batch, input) =
        if r.batch_first { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    // R is [dirs, gates*hidden, hidden] (hidden_size may be left out).
    let Some(&hidden) = e.dims(rw)?.last() else { return Ok(None) };
    // Empty sequences or states: nothing worth unrolling (and zero-sized steps); leave it.
    if seq == 0 || batch == 0 || hidden == 0 || input == 0 {
        return Ok(None);
    }
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let (gates, per) = match r.cell {
        RnnCell::Simple => (1, 1),
        RnnCell::Gru { .. } => (3, 2),
        RnnCell::Lstm { .. } => (4, 3),
    };
    let is_lstm = matches!(r.cell, RnnCell::Lstm { .. });
    let acts = r.effective_activations();
    if acts.len() != per * dirs {
        return Ok(None);
    }
    // Constant lengths that are all full change nothing.
    let lens = operand(4).filter(|&l| {
        e.g.constant_value(l).is_none_or(|t| t.to_i64s().iter().any(|&n| n != seq as i64))
    });
    let any_reverse = r.direction != RnnDirection::Forward;

    // Time-major [seq, batch, input], flattened to [seq*batch, input] for the projections.
    let xs = e.cast("x", x, cd)?;
    let xs = if r.batch_first { e.transpose("x_time_major", xs, &[1, 0, 2])? } else { xs };
    let x2 = e.reshape("x_rows", xs, &[seq * batch, input])?;
    let dirs_first = |e: &mut Emit, what: &str, v: ValueId| -> Result<ValueId> {
        let v = e.cast(what, v, cd)?;
        if r.batch_first {
            e.transpose(&format!("{what}_dirs_first"), v, &[1, 0, 2])
        } else {
            Ok(v)
        }
    };
    let h0 = operand(5).map(|v| dirs_first(e, "initial_h", v)).transpose()?;
    let c0 =
        if is_lstm { operand(6).map(|v| dirs_first(e, "initial_c", v)).transpose()? } else { None };
    let w = e.cast("w", w, cd)?;
    let rw = e.cast("r", rw, cd)?;
    let bias = operand(3).map(|b| e.cast("b", b, cd)).transpose()?;
    let peep = if is_lstm { operand(7).map(|p| e.cast("p", p, cd)).transpose()? } else { None };
    let lens = lens.map(|l| lens_values(e, l, seq, batch, any_reverse)).transpose()?;

    let zeros = e.full("zeros", cd, &[batch, hidden], 0.0)?;
    let (mut ys, mut yhs, mut ycs) = (Vec::new(), Vec::new(), Vec::new());
    for d in 0..dirs {
        let reverse = r.direction == RnnDirection::Reverse || d == 1;
        let tag = match (dirs, d) {
            (1, _) => String::new(),
            (_, 0) => "forward/".to_string(),
            _ => "backward/".to_string(),
        };
        let act = |i: usize| acts[d * per + i];
        let wd = e.pick(&format!("{tag}w"), w, d)?;
        let rd = e.pick(&format!("{tag}r"), rw, d)?;
        let bd = bias.map(|b| e.pick(&format!("{tag}b"), b, d)).transpose()?;
        let pd = peep.map(|p| e.pick(&format!("{tag}p"), p, d)).transpose()?;
        let names: &[&str] = match r.cell {
            RnnCell::Simple => &["h"],
            RnnCell::Gru { .. } => &["z", "r", "h"],
            RnnCell::Lstm { .. } => &["i", "o", "f", "c"],
        };
        let lbr = matches!(r.cell, RnnCell::Gru { linear_before_reset: true });
        // Per gate: its recurrent weight [hidden, hidden] and its input for each step [batch, hidden].
        let mut rec = Vec::with_capacity(gates);
        let mut step_in: Vec<Vec<ValueId>> = Vec::with_capacity(gates);
        let mut rb_h = None;
        for (g, gname) in names.iter().enumerate() {
            let rows = |e: &mut Emit, what: &str, v: ValueId, first: usize| {
                e.slice(
                    &format!("{tag}{what}_{gname}"),
                    v,
                    0,
                    first + g * hidden,
                    first + (g + 1) * hidden,
                    1,
                )
            };
            let wg = rows(e, "w", wd, 0)?;
            rec.push(rows(e, "r", rd, 0)?);
            let bx = match bd {
                None => None,
                Some(bd) => {
                    let wb = rows(e, "wb", bd, 0)?;
                    let rb = rows(e, "rb", bd, gates * hidden)?;
                    // GRU with linear_before_reset applies the candidate's recurrent bias inside
                    // the reset product; every other recurrent bias adds to the input's.
                    if lbr && g == 2 {
                        rb_h = Some(rb);
                        Some(wb)
                    } else {
                        Some(e.add(&format!("{tag}bias_{gname}"), wb, rb)?)
                    }
                }
            };
            let proj = e.gemm_bt(&format!("{tag}x_{gname}"), x2, wg, bx)?;
            let per_step = match &lens {
                Some(Lens { reverse_rows: Some((_, rows)), .. }) if reverse => {
                    let mut v = Vec::with_capacity(seq);
                    for (s, &idx) in rows.iter().enumerate() {
                        v.push(e.gather(&format!("{tag}step{s}/x_{gname}"), proj, idx, 0)?);
                    }
                    v
                }
                _ => {
                    let proj3 =
                        e.reshape(&format!("{tag}x_{gname}_steps"), proj, &[seq, batch, hidden])?;
                    let parts = e.split(&format!("{tag}x_{gname}_split"), proj3, 0, seq)?;
                    let mut v = Vec::with_capacity(seq);
                    for s in 0..seq {
                        let t = if reverse { seq - 1 - s } else { s };
                        v.push(e.reshape(
                            &format!("{tag}step{s}/x_{gname}"),
                            parts[t],
                            &[batch, hidden],
                        )?);
                    }
                    v
                }
            };
            step_in.push(per_step);
        }
        let peepholes = match pd {
            Some(p) => {
                let mut v = Vec::new();
                for (k, n) in ["i", "o", "f"].iter().enumerate() {
                    v.push(e.slice(
                        &format!("{tag}p_{n}"),
                        p,
                        0,
                        k * hidden,
                        (k + 1) * hidden,
                        1,
                    )?);
                }
                Some(v)
            }
            None => None,
        };

        let state = |e: &mut Emit, what: &str, init: Option<ValueId>| -> Result<ValueId> {
            match init {
                Some(v) => e.pick(&format!("{tag}{what}"), v, d),
                None => Ok(zeros),
            }
        };
        let mut h = state(e, "h0", h0)?;
        let mut c = state(e, "c0", c0)?;
        let mut outs = Vec::with_capacity(seq);
        // Each step's gate inputs.
        let by_step: Vec<Vec<ValueId>> =
            (0..seq).map(|s| step_in.iter().map(|g| g[s]).collect()).collect();
        for (s, xin) in by_step.iter().enumerate() {
            let p = format!("{tag}step{s}");
            let nm = |what: &str| format!("{p}/{what}");
            let gate = |e: &mut Emit,
                        g: usize,
                        hv: ValueId,
                        peep: Option<(ValueId, ValueId)>,
                        f: UnaryOp|
             -> Result<ValueId> {
                let gn = names[g];
                let mut pre = e.gemm_bt(&nm(&format!("{gn}_pre")), hv, rec[g], Some(xin[g]))?;
                if let Some((pw, cv)) = peep {
                    let pc = e.mul(&nm(&format!("{gn}_peephole")), pw, cv)?;
                    pre = e.add(&nm(&format!("{gn}_pre_peephole")), pre, pc)?;
                }
                let pre = clip(e, &nm(&format!("{gn}_clip")), pre, r.clip)?;
                e.unary(&nm(gn), f, pre)
            };
            let (h_new, c_new) = match r.cell {
                RnnCell::Simple => (gate(e, 0, h, None, act(0))?, c),
                RnnCell::Gru { linear_before_reset } => {
                    let z = gate(e, 0, h, None, act(0))?;
                    let rg = gate(e, 1, h, None, act(0))?;
                    let pre = if linear_before_reset {
                        let hh = e.gemm_bt(&nm("h_rec"), h, rec[2], rb_h)?;
                        let rh = e.mul(&nm("r_h_rec"), rg, hh)?;
                        e.add(&nm("h_pre"), xin[2], rh)?
                    } else {
                        let rh = e.mul(&nm("r_h"), rg, h)?;
                        e.gemm_bt(&nm("h_pre"), rh, rec[2], Some(xin[2]))?
                    };
                    let pre = clip(e, &nm("h_clip"), pre, r.clip)?;
                    let cand = e.unary(&nm("h_cand"), act(1), pre)?;
                    // h = (1 - z) * cand + z * h
                    let one = e.scalar(1.0, cd)?;
                    let keep = e.sub(&nm("one_minus_z"), one, z)?;
                    let a = e.mul(&nm("new_part"), keep, cand)?;
                    let b = e.mul(&nm("old_part"), z, h)?;
                    (e.add(&nm("h"), a, b)?, c)
                }
                RnnCell::Lstm { input_forget } => {
                    let pp = |k: usize, cv: ValueId| peepholes.as_ref().map(|p| (p[k], cv));
                    let i = gate(e, 0, h, pp(0, c), act(0))?;
                    let f = if input_forget {
                        // Coupled gates: what is let in replaces what is forgotten.
                        let one = e.scalar(1.0, cd)?;
                        e.sub(&nm("f"), one, i)?
                    } else {
                        gate(e, 2, h, pp(2, c), act(0))?
                    };
                    let cand = gate(e, 3, h, None, act(1))?;
                    let fc = e.mul(&nm("f_c"), f, c)?;
                    let ic = e.mul(&nm("i_cand"), i, cand)?;
                    let c_new = e.add(&nm("c_new"), fc, ic)?;
                    let o = gate(e, 1, h, pp(1, c_new), act(0))?;
                    let hc = e.unary(&nm("h_c"), act(2), c_new)?;
                    (e.mul(&nm("h"), o, hc)?, c_new)
                }
            };
            match &lens {
                Some(l) => {
                    // Steps past a sequence's end keep its state.
                    let step = e.constant("const", Tensor::scalar(s as i64))?;
                    let live = e.binary(&nm("live"), BinaryOp::Less, step, l.col)?;
                    h = e.select(&nm("h_kept"), live, h_new, h)?;
                    if is_lstm {
                        c = e.select(&nm("c_kept"), live, c_new, c)?;
                    }
                }
                None => {
                    h = h_new;
                    c = c_new;
                }
            }
            outs.push(h);
        }

        // Y of this direction in time order, [seq, 1, batch, hidden].
        let y = match &lens {
            Some(Lens { reverse_rows: Some((all, _)), valid, .. }) if reverse => {
                // Step s of sequence b is time len_b - 1 - s: the same rows put the steps back.
                let steps = e.concat(&format!("{tag}y_steps"), &outs, 0)?;
                let timed = e.gather(&format!("{tag}y_timed"), steps, *all, 0)?;
                let timed = e.reshape(&format!("{tag}y_timed3"), timed, &[seq, batch, hidden])?;
                e.select(&format!("{tag}y_valid"), *valid, timed, zeros)?
            }
            _ => {
                if reverse {
                    outs.reverse();
                }
                let timed = e.concat(&format!("{tag}y_steps"), &outs, 0)?;
                let timed = e.reshape(&format!("{tag}y_steps3"), timed, &[seq, batch, hidden])?;
                match &lens {
                    Some(l) => e.select(&format!("{tag}y_valid"), l.valid, timed, zeros)?,
                    None => timed,
                }
            }
        };
        ys.push(e.reshape(&format!("{tag}y"), y, &[seq, 1, batch, hidden])?);
        // The final states; an empty sequence ends with zeros.
        let last = |e: &mut Emit, what: &str, v: ValueId| -> Result<ValueId> {
            let v = match &lens {
                Some(l) => e.select(&format!("{tag}{what}_nonempty"), l.nonempty, v, zeros)?,
                None => v,
            };
            e.reshape(&format!("{tag}{what}"), v, &[1, batch, hidden])
        };
        yhs.push(last(e, "y_h", h)?);
        if is_lstm {
            ycs.push(last(e, "y_c", c)?);
        }
    }

    let mut y = e.concat("y_dirs", &ys, 1)?;
    let mut y_h = e.concat("y_h_dirs", &yhs, 0)?;
    let mut y_c = if is_lstm { Some(e.concat("y_c_dirs", &ycs, 0)?) } else { None };
    if r.batch_first {
        y = e.transpose("y_batch_first", y, &[2, 0, 1, 3])?;
        y_h = e.transpose("y_h_batch_first", y_h, &[1, 0, 2])?;
        y_c = y_c.map(|c| e.transpose("y_c_batch_first", c, &[1, 0, 2])).transpose()?;
    }
    let mut results = vec![e.cast("Y", y, dt)?, e.cast("Y_h", y_h, dt)?];
    if let Some(c) = y_c {
        results.push(e.cast("Y_c", c, dt)?);
    }
    Ok(Some(results))
}

/// `clip(x, -c, c)` when the RNN clips.
fn clip(e: &mut Emit, what: &str, x: ValueId, c: Option<f32>) -> Result<ValueId> {
    let Some(c) = c else { return Ok(x) };
    let d = e.dtype(x);
    let (lo, hi) = (e.scalar(-(c as f64), d)?, e.scalar(c as f64, d)?);
    e.op2(what, Op::Clip, &[x, lo, hi])
}

fn lens_values(
    e: &mut Emit,
    lens: ValueId,
    seq: usize,
    batch: usize,
    reverse: bool,
) -> Result<Lens> {
    let l = e.cast("lens", lens, DType::I64)?;
    let col = e.reshape("lens_col", l, &[batch, 1])?;
    let zero = e.constant("const", Tensor::scalar(0i64))?;
    let nonempty = e.binary("nonempty", BinaryOp::Greater, col, zero)?;
    let times: Vec<i64> = (0..seq as i64).collect();
    let t3 = e.constant("times", Tensor::from_slice(&[seq, 1, 1], &times)?)?;
    let row3 = e.reshape("lens_row3", l, &[1, batch, 1])?;
    let valid = e.binary("valid", BinaryOp::Less, t3, row3)?;
    let reverse_rows = if reverse {
        // Row of (step or time) t for sequence b: clamp(len_b - 1 - t, 0, seq - 1) * batch + b.
        let t_plus_1: Vec<i64> = (1..=seq as i64).collect();
        let tp1 = e.constant("times_plus_1", Tensor::from_slice(&[seq, 1], &t_plus_1)?)?;
        let row = e.reshape("lens_row", l, &[1, batch])?;
        let back = e.sub("reverse_time", row, tp1)?;
        let (lo, hi) = (
            e.constant("const", Tensor::scalar(0i64))?,
            e.constant("const", Tensor::scalar(seq as i64 - 1))?,
        );
        let back = e.op2("reverse_time_clamped", Op::Clip, &[back, lo, hi])?;
        let bsz = e.constant("const", Tensor::scalar(batch as i64))?;
        let scaled = e.mul("reverse_row_base", back, bsz)?;
        let bs: Vec<i64> = (0..batch as i64).collect();
        let brow = e.constant("batch_index", Tensor::from_slice(&[1, batch], &bs)?)?;
        let rows = e.add("reverse_rows", scaled, brow)?;
        let all = e.reshape("reverse_rows_flat", rows, &[seq * batch])?;
        let parts = e.split("reverse_rows_split", rows, 0, seq)?;
        let mut per_step = Vec::with_capacity(seq);
        for (s, p) in parts.into_iter().enumerate() {
            per_step.push(e.reshape(&format!("step{s}/reverse_rows"), p, &[batch])?);
        }
        Some((all, per_step))
    } else {
        None
    };
    Ok(Lens { col, valid, nonempty, reverse_rows })
}
