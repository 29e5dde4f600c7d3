//! Recurrent layers whole (`Shape::Recurrent`, `recurrent.c`; RNN, GRU and LSTM): which nodes the
//! CPU keeps whole for it, planned, described, their weights packed and called.

use std::fmt;

use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
use kiln_ir::{DType, Graph, NodeId, Op, ValueId};
use melior::ir::Value;

use super::{
    blocks, constant_f32s, other_shape, Activation, Blocked, Call, Epilogue, Host, KernelShape,
    Pointers, Shape, State, Ukernel, NR,
};
use crate::fuse::Kernel;
use crate::{CompileError, Result};

/// Recurrent layers: `kiln_uk_recurrent`.
pub(super) struct Recurrent;

/// Gates of a recurrent cell (rows of W and R per hidden unit).
pub(super) fn gates(cell: RnnCell) -> usize {
    match cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 3,
        RnnCell::Lstm { .. } => 4,
    }
}

/// Whether the CPU runs this `Rnn` node whole on the recurrent kernel (`recurrent.c`) rather than
/// unrolled into kernels per step (`passes/decompose/rnn.rs`): f32 throughout, static shapes,
/// ONNX's default activations and no clip, no sequence lengths (or constant full ones), and
/// constant weights, biases and peepholes (packed at compile time) with R large enough to be a
/// buffer (it carries the packed constant). The decomposition pass asks this too: what it keeps
/// whole, `plan` must take.
pub fn runs_recurrent(graph: &Graph, id: NodeId) -> bool {
    let Op::Rnn(r) = &graph.node(id).op else { return false };
    let operands = graph.operands(id);
    let operand = |i: usize| operands.get(i).copied().flatten();
    let defaults = Rnn { activations: Vec::new(), ..r.clone() };
    if r.clip.is_some()
        || r.effective_activations() != defaults.effective_activations()
        || operands.len() > 8
    {
        return false;
    }
    let all_f32 = operands
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 4)
        .filter_map(|(_, v)| *v)
        .all(|v| graph.value_type(v).dtype == DType::F32)
        && graph.node(id).outputs.iter().all(|t| t.dtype == DType::F32);
    let static_shapes = operands.iter().flatten().all(|&v| graph.value_type(v).shape.is_fixed())
        && graph.node(id).outputs.iter().all(|t| t.shape.is_fixed());
    if !all_f32 || !static_shapes {
        return false;
    }
    let (Some(x), Some(w), Some(rw)) = (operand(0), operand(1), operand(2)) else { return false };
    let constant = |v: Option<ValueId>| v.is_none_or(|v| graph.constant_value(v).is_some());
    if graph.constant_value(x).is_some()
        || !constant(Some(w))
        || !constant(Some(rw))
        || !constant(operand(3))
        || !constant(operand(7))
    {
        return false;
    }
    if crate::fuse::is_inline_constant(graph, rw) {
        return false;
    }
    let Some(xd) = graph.value_type(x).shape.as_fixed() else { return false };
    let Some(hidden) = graph.value_type(rw).shape.as_fixed().and_then(|d| d.last().copied()) else {
        return false;
    };
    if xd.len() != 3 || xd.contains(&0) || hidden == 0 {
        return false;
    }
    let seq = if r.batch_first { xd[1] } else { xd[0] };
    // Sequence lengths: none, or a constant that is full for every sequence.
    match operand(4) {
        None => true,
        Some(l) => {
            graph.constant_value(l).is_some_and(|t| t.to_i64s().iter().all(|&n| n == seq as i64))
        }
    }
}

/// A recurrent layer kept whole for the CPU (see `runs_recurrent`).
pub(super) fn plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    r: &Rnn,
    host: &Host,
) -> Option<Ukernel> {
    if !runs_recurrent(graph, root) || kernel.nodes.len() != 1 {
        return None;
    }
    let operands = graph.operands(root);
    let operand = |i: usize| operands.get(i).copied().flatten();
    let (x, rw) = (operand(0)?, operand(2)?);
    let xd = graph.value_type(x).shape.as_fixed()?;
    let hidden = *graph.value_type(rw).shape.as_fixed()?.last()?;
    let (seq, batch, input) =
        if r.batch_first { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    let is_lstm = matches!(r.cell, RnnCell::Lstm { .. });
    let state = |v: Option<ValueId>| -> Option<State> {
        Some(match v {
            None => State::None,
            Some(v) if graph.constant_value(v).is_some() => State::Packed,
            Some(v) if kernel.inputs.contains(&v) => State::Input(v),
            Some(_) => return None,
        })
    };
    let h0 = state(operand(5))?;
    let c0 = if is_lstm { state(operand(6))? } else { State::None };
    if !kernel.inputs.contains(&x) || !kernel.inputs.contains(&rw) {
        return None;
    }
    let mut results = [None; 3];
    for (slot, v) in kernel.outputs.iter().enumerate() {
        if v.node != root || v.output > 2 {
            return None;
        }
        results[v.output] = Some(slot);
    }
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let (kc, mc, nc) = blocks(input, host);
    Some(Ukernel {
        shape: Shape::Recurrent {
            cell: r.cell,
            direction: r.direction,
            batch_first: r.batch_first,
            seq,
            batch,
            input,
            hidden,
            h0,
            c0,
            results,
        },
        input: x,
        weight: rw,
        epilogue: Epilogue {
            bias: None,
            residual: None,
            residual_last: false,
            activation: Activation::None,
        },
        mr: host.mr,
        kc,
        mc,
        nc,
        chunks: dirs,
        split_n: false,
        row_bands: 1,
        transposed: false,
        blocked: Blocked::default(),
        bf16: false,
        amx: false,
        channel_vectors: 0,
    })
}

impl KernelShape for Recurrent {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = u.mnk();
        let Shape::Recurrent { cell, direction, batch_first, seq, batch, input, hidden, .. } =
            u.shape
        else {
            return Err(fmt::Error);
        };
        let what = match cell {
            RnnCell::Simple => "RNN".to_string(),
            RnnCell::Gru { linear_before_reset } => {
                format!("GRU{}", if linear_before_reset { " (linear before reset)" } else { "" })
            }
            RnnCell::Lstm { input_forget } => format!(
                "LSTM{}",
                if input_forget { " (input and forget gates coupled)" } else { "" }
            ),
        };
        writeln!(
            f,
            "microkernel: recurrent {what} layer, {}, {seq} steps of batch {batch}{}, input {input}, hidden {hidden}",
            direction.name(),
            if batch_first { " (batch first)" } else { "" }
        )?;
        writeln!(f, "input projections: one GEMM M={m} N={n} K={k} by W^T packed at compile time, blocks KC={} MC={} NC={}", u.kc, u.mc, u.nc)?;
        writeln!(f, "time loop in the kernel: per step the state times R^T (resident, packed), then the gates on vectors")?;
        writeln!(f, "workgroups: {} (one a direction)", u.workgroups())
    }

    fn pack(&self, graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        let out = pack_recurrent(graph, kernel, u)?;
        Ok(out.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn packed_floats(&self, u: &Ukernel) -> usize {
        let Shape::Recurrent { direction, .. } = u.shape else { return 0 };
        floats_per_direction(&u.shape)
            * if direction == RnnDirection::Bidirectional { 2 } else { 1 }
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Recurrent {
            cell,
            direction,
            batch_first,
            seq,
            batch,
            input,
            hidden,
            h0,
            c0,
            results,
        } = u.shape
        else {
            return Err(other_shape(u));
        };
        // Constant initial states follow the weights in the packed constant.
        let mut packed_next = self.packed_floats(u);
        let state_floats =
            batch * hidden * if direction == RnnDirection::Bidirectional { 2 } else { 1 };
        let mut state = |s: State| -> Result<Value<'c, 'a>> {
            Ok(match s {
                State::None => call.int(0),
                State::Input(v) => call.input(v)?,
                State::Packed => {
                    let at = call.offset(p.wp, packed_next);
                    packed_next += state_floats;
                    at
                }
            })
        };
        let (h0, c0) = (state(h0)?, state(c0)?);
        let result = |i: usize| -> Result<Value<'c, 'a>> {
            results[i].map_or_else(|| Ok(call.int(0)), |slot| call.output(slot))
        };
        let mut args = vec![p.x, p.wp, h0, c0, result(0)?, result(1)?, result(2)?];
        let (cell, lbr, input_forget) = match cell {
            RnnCell::Simple => (0, false, false),
            RnnCell::Gru { linear_before_reset } => (1, linear_before_reset, false),
            RnnCell::Lstm { input_forget } => (2, false, input_forget),
        };
        let direction = match direction {
            RnnDirection::Forward => 0,
            RnnDirection::Reverse => 1,
            RnnDirection::Bidirectional => 2,
        };
        args.extend(call.ints(&[
            cell,
            lbr as usize,
            input_forget as usize,
            direction,
            batch_first as usize,
            seq,
            batch,
            input,
            hidden,
            u.kc,
            u.mc,
            u.nc,
        ]));
        // (Its blocks are among its sizes; its workgroups are its directions.)
        Ok(("kiln_uk_recurrent", args))
    }
}

/// Floats of one direction's packed weights (as `recurrent.c` lays them out): W^T in strips of
/// NR columns, R^T, the bias, the candidate's recurrent bias, the peepholes.
fn floats_per_direction(shape: &Shape) -> usize {
    let Shape::Recurrent { cell, input, hidden, .. } = *shape else { return 0 };
    let hp = hidden.div_ceil(16) * 16;
    let ghp = gates(cell) * hp;
    ghp.div_ceil(NR) * NR * input + hidden * ghp + ghp + hp + 3 * hp
}

/// A recurrent layer's packed constant: per direction the layout `recurrent.c` reads (each gate's
/// columns padded to a multiple of 16, padding zero), then the initial state and cell where they
/// are constants.
fn pack_recurrent(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<f32>> {
    let Shape::Recurrent { cell, direction, input, hidden, h0, c0, .. } = u.shape else {
        return Ok(Vec::new());
    };
    // A plan is made only for a kernel of one recurrent node with constant weights.
    let root = *kernel
        .nodes
        .first()
        .ok_or_else(|| CompileError::Internal("a recurrent kernel without its node".into()))?;
    let operands = graph.operands(root);
    let constant = |i: usize| -> Option<Vec<f32>> {
        operands.get(i).copied().flatten().and_then(|v| constant_f32s(graph, v))
    };
    let missing = |what: &str| {
        CompileError::Internal(format!("the recurrent layer's {what} is not a constant"))
    };
    let w = constant(1).ok_or_else(|| missing("W"))?;
    let r = constant(2).ok_or_else(|| missing("R"))?;
    let (b, p) = (constant(3), constant(7));
    let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let g = gates(cell);
    let (h, hp) = (hidden, hidden.div_ceil(16) * 16);
    let ghp = g * hp;
    let lbr = matches!(cell, RnnCell::Gru { linear_before_reset: true });
    let per = floats_per_direction(&u.shape);
    let mut out = vec![0.0f32; per * dirs];
    for d in 0..dirs {
        let o = &mut out[d * per..(d + 1) * per];
        let (wp, rest) = o.split_at_mut(ghp.div_ceil(NR) * NR * input);
        let (rt, rest) = rest.split_at_mut(h * ghp);
        let (bias, rest) = rest.split_at_mut(ghp);
        let (rbh, peep) = rest.split_at_mut(hp);
        for gate in 0..g {
            // `c` indexes the packed rows and several source arrays at once.
            #[allow(clippy::needless_range_loop)]
            for c in 0..h {
                let (row, j) = (gate * h + c, gate * hp + c);
                for k in 0..input {
                    wp[((j / NR) * input + k) * NR + j % NR] = w[(d * g * h + row) * input + k];
                }
                for k in 0..h {
                    rt[k * ghp + j] = r[(d * g * h + row) * h + k];
                }
                if let Some(b) = &b {
                    let (wb, rb) = (b[d * 2 * g * h + row], b[d * 2 * g * h + g * h + row]);
                    // GRU's candidate with linear_before_reset: its recurrent bias is inside r * (...).
                    if lbr && gate == 2 {
                        bias[j] = wb;
                        rbh[c] = rb;
                    } else {
                        bias[j] = wb + rb;
                    }
                }
            }
        }
        if let Some(p) = &p {
            for gate in 0..3 {
                for c in 0..h {
                    peep[gate * hp + c] = p[d * 3 * h + gate * h + c];
                }
            }
        }
    }
    for (state, i) in [(h0, 5), (c0, 6)] {
        if state == State::Packed {
            out.extend(constant(i).ok_or_else(|| missing("initial state"))?);
        }
    }
    Ok(out)
}
