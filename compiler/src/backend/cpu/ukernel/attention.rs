//! Attention whole (`Shape::Attention`, `attention.c`): which nodes the CPU keeps whole for it,
//! planned, described and called. Nothing is packed.

use std::fmt;

use kiln_ir::{DType, Graph, NodeId, Op, ValueId};
use melior::ir::Value;

use super::{other_shape, Call, Host, KernelShape, Pointers, Shape, Ukernel, MIN_MACS};
use crate::fuse::Kernel;
use crate::Result;

/// Attention: `kiln_uk_attention`.
pub(super) struct Attention;

/// Whether the CPU runs this `Attention` node whole on the attention kernel (`attention.c`)
/// rather than decomposed (`passes/decompose/attention.rs`): f32 Q, K, V and Y of static
/// shapes; no past key and value, no padding lengths, no softcap, softmax in f32; only Y used;
/// a mask, if any, f32 or bool, spanning the keys (a shorter one is padded with "masked out")
/// and broadcasting along the other axes; operands that are buffers, not constants inlined into
/// the kernel. The decomposition pass asks this too: what it keeps whole, `plan` must take.
pub fn runs_attention(graph: &Graph, id: NodeId) -> bool {
    attention_shape(graph, id).is_some()
}

/// The shape of an Attention node the kernel runs whole (see `runs_attention`).
fn attention_shape(graph: &Graph, id: NodeId) -> Option<Shape> {
    let node = graph.node(id);
    let Op::Attention(a) = &node.op else { return None };
    let operands = graph.operands(id);
    let operand = |i: usize| operands.get(i).copied().flatten();
    if (4..operands.len()).any(|i| operand(i).is_some())
        || a.softcap != 0.0
        || a.softmax_precision.is_some_and(|p| p != DType::F32)
    {
        return None;
    }
    let unused = |i: usize| {
        let v = ValueId::new(id, i);
        graph.users(v).is_empty() && !graph.outputs().iter().any(|(_, o)| *o == v)
    };
    if node.outputs.first()?.dtype != DType::F32 || !(1..node.outputs.len()).all(unused) {
        return None;
    }
    let (q, k, v, mask) = (operand(0)?, operand(1)?, operand(2)?, operand(3));
    let buffer = |x: ValueId| !crate::fuse::is_inline_constant(graph, x);
    if ![q, k, v].iter().all(|&x| graph.value_type(x).dtype == DType::F32 && buffer(x)) {
        return None;
    }
    let dims = |x: ValueId| graph.value_type(x).shape.as_fixed();
    let (qd, kd, vd) = (dims(q)?, dims(k)?, dims(v)?);
    let rank = qd.len();
    if kd.len() != rank || vd.len() != rank {
        return None;
    }
    let (batch, heads, kv_heads, q_seq, kv_seq, head, v_head, interleaved) = match rank {
        3 => {
            let (h, kh) = (a.q_num_heads, a.kv_num_heads);
            if h == 0
                || kh == 0
                || qd[2] % h != 0
                || kd[2] % kh != 0
                || vd[2] % kh != 0
                || kd[2] / kh != qd[2] / h
                || vd[1] != kd[1]
            {
                return None;
            }
            (qd[0], h, kh, qd[1], kd[1], qd[2] / h, vd[2] / kh, true)
        }
        4 if kd[3] == qd[3] && vd[1] == kd[1] && vd[2] == kd[2] => {
            (qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], vd[3], false)
        }
        _ => return None,
    };
    if [batch, heads, kv_heads, q_seq, kv_seq, head, v_head].contains(&0)
        || heads % kv_heads != 0
        || kd[0] != batch
        || vd[0] != batch
    {
        return None;
    }
    let mut mask_dims = [1; 4];
    let mask = match mask {
        None => None,
        Some(m) => {
            let bool_mask = match graph.value_type(m).dtype {
                DType::F32 => false,
                DType::Bool => true,
                _ => return None,
            };
            let md = dims(m)?;
            let scores = [batch, heads, q_seq, kv_seq];
            if md.is_empty() || md.len() > 4 || md.last() != Some(&kv_seq) || !buffer(m) {
                return None;
            }
            mask_dims[4 - md.len()..].copy_from_slice(&md);
            if (0..4).any(|i| mask_dims[i] != 1 && mask_dims[i] != scores[i]) {
                return None;
            }
            Some((m, bool_mask))
        }
    };
    let scale = a.scale.unwrap_or(1.0 / (head as f32).sqrt());
    Some(Shape::Attention {
        batch,
        heads,
        kv_heads,
        q_seq,
        kv_seq,
        head,
        v_head,
        interleaved,
        k,
        v,
        mask,
        mask_dims,
        causal: a.is_causal,
        scale,
    })
}

/// An attention node kept whole for the CPU (see `runs_attention`): a kernel of its own.
pub(super) fn plan(graph: &Graph, kernel: &Kernel, root: NodeId, host: &Host) -> Option<Ukernel> {
    let shape = attention_shape(graph, root)?;
    let Shape::Attention { batch, heads, q_seq, kv_seq, head, v_head, k, v, mask, .. } = shape
    else {
        return None;
    };
    let q = graph.operands(root).first().copied().flatten()?;
    let inputs = [Some(q), Some(k), Some(v), mask.map(|(m, _)| m)];
    if kernel.nodes.len() != 1 || !inputs.iter().flatten().all(|x| kernel.inputs.contains(x)) {
        return None;
    }
    // Work units of 64 query rows of a head; up to 4 chunks of them once there is enough work to
    // share (a few microseconds each).
    let units = batch * heads * q_seq.div_ceil(64);
    let work = batch * heads * q_seq * kv_seq * (head + v_head);
    let chunks = host.units(work, MIN_MACS).min(units);
    Some(Ukernel::unblocked(shape, q, chunks))
}

impl KernelShape for Attention {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Attention {
            batch,
            heads,
            kv_heads,
            q_seq,
            kv_seq,
            head,
            v_head,
            interleaved,
            mask,
            mask_dims,
            causal,
            scale,
            ..
        } = u.shape
        else {
            return Err(fmt::Error);
        };
        let kv = if kv_heads != heads { format!(" ({kv_heads} KV heads)") } else { String::new() };
        let layout =
            if interleaved { "[batch, seq, heads * size]" } else { "[batch, heads, seq, size]" };
        writeln!(f, "microkernel: attention, {batch} x {heads} heads{kv} of {q_seq} queries over {kv_seq} keys, head size {head} (V {v_head}), scale {scale}")?;
        let mask = match mask {
            None => "no mask".to_string(),
            Some((_, bool_mask)) => format!(
                "{} mask broadcast from {mask_dims:?}",
                if bool_mask { "bool" } else { "additive" }
            ),
        };
        writeln!(
            f,
            "Q, K, V and Y read and written where they lie as {layout}; {mask}{}",
            if causal { ", causal" } else { "" }
        )?;
        writeln!(f, "per 4 query rows: scores against K^T packed per head (4x32 register tile), softmax in a scratch row block, then P V (4x32); nothing else written")?;
        writeln!(f, "workgroups: {} (chunks of batch x heads x 64 query rows)", u.workgroups())
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Attention {
            batch,
            heads,
            kv_heads,
            q_seq,
            kv_seq,
            head,
            v_head,
            interleaved,
            k,
            v,
            mask,
            mask_dims,
            causal,
            scale,
        } = u.shape
        else {
            return Err(other_shape(u));
        };
        let mask_ptr = match mask {
            Some((m, _)) => call.input(m)?,
            None => call.int(0),
        };
        let mut args = vec![p.x, call.input(k)?, call.input(v)?, mask_ptr, p.y];
        // Strides of (batch, head, row), the last axis contiguous.
        let strides = |heads: usize, rows: usize, size: usize| {
            if interleaved {
                [rows * heads * size, size, heads * size]
            } else {
                [heads * rows * size, rows * size, size]
            }
        };
        let md = mask_dims;
        let natural = [md[1] * md[2] * md[3], md[2] * md[3], md[3]];
        let ms: Vec<usize> = (0..3).map(|i| if md[i] == 1 { 0 } else { natural[i] }).collect();
        let kind = match mask {
            None => 0,
            Some((_, false)) => 1,
            Some((_, true)) => 2,
        };
        args.extend(call.ints(&[batch, heads, kv_heads, q_seq, kv_seq, head, v_head]));
        args.extend(call.ints(&strides(heads, q_seq, head)));
        args.extend(call.ints(&strides(kv_heads, kv_seq, head)));
        args.extend(call.ints(&strides(kv_heads, kv_seq, v_head)));
        args.extend(call.ints(&strides(heads, q_seq, v_head)));
        args.extend(call.ints(&[kind, ms[0], ms[1], ms[2], causal as usize]));
        args.push(call.float(scale));
        args.extend(call.ints(&[u.chunks]));
        Ok(("kiln_uk_attention", args))
    }
}
