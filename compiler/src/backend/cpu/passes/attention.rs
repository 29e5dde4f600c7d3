//! Attention recognition (the CPU's pass): scaled dot-product attention as exporters write it
//! becomes one `Attention` node, which the CPU runs as one kernel (`backend/cpu/attention.c`).
//!
//! ```text
//! S = MatMul(Q, K^T) [Div c | Mul c] [Add mask];  P = Softmax(S, last axis);  Y = MatMul(P, V)
//! ```
//!
//! with Q [b, h, s, d], K^T [b, h, d, t], V [b, h, t, dv], c a scalar constant and the mask any
//! f32 value that broadcasts to the scores without widening them, its last axis the keys.
//! Unfused this is a batched GEMM with its epilogue, a softmax and a second GEMM, the scores
//! written and read back twice.
//!
//! Where Q, K and V are heads split from [b, s, h * d] by a Reshape and a Transpose (K's moving
//! the head size before the keys), and Y goes back the same way, the node takes the 3-D form
//! (`q_num_heads`), whose kernel reads and writes the heads where they lie: the four head
//! transposes go too. Otherwise it takes the 4-D form with K = Transpose(K^T), which
//! simplification merges into K^T's own transposes.
//!
//! A constant mask that is 0 on and below the diagonal and -inf above becomes `is_causal`, whose
//! kernel skips the masked keys. The scores, their scaled and masked forms and P must be used
//! only inside the pattern. The
//! pass runs for the CPU only: the GPU targets would decompose the node back into what it was.

use kiln_ir::op::Attention;
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        if graph.try_node(id).is_none() {
            continue;
        }
        let Some(m) = recognize(graph, id) else { continue };
        apply(graph, m)?;
        changed = true;
    }
    if changed {
        crate::passes::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// A recognised attention: its operands, scale and heads (3-D form), and the value it replaces.
struct Match {
    q: ValueId,
    k: KeyForm,
    v: ValueId,
    mask: Option<ValueId>,
    /// The mask was a constant causal one (its kernel then skips the masked keys).
    causal: bool,
    scale: f32,
    /// `Some(heads)` for the 3-D form.
    heads: Option<usize>,
    replaces: ValueId,
    /// The node named after (the second MatMul).
    last: NodeId,
}

/// K as the node will read it.
enum KeyForm {
    /// [b, s, h * d] (the 3-D form).
    Packed(ValueId),
    /// K^T [b, h, d, t], to be transposed into K (the 4-D form).
    Transposed(ValueId),
}

fn apply(graph: &mut Graph, m: Match) -> Result<()> {
    let name = graph.node(m.last).name.clone();
    let k = match m.k {
        KeyForm::Packed(k) => k,
        KeyForm::Transposed(kt) => {
            let n = graph.unique_name(&format!("{name}/key"));
            graph.add_node(&n, Op::Transpose { perm: vec![0, 1, 3, 2] }, &[Some(kt)])?.into()
        }
    };
    let op = Op::Attention(Attention {
        is_causal: m.causal,
        kv_num_heads: m.heads.unwrap_or(0),
        q_num_heads: m.heads.unwrap_or(0),
        qk_matmul_output_mode: 0,
        scale: Some(m.scale),
        softcap: 0.0,
        softmax_precision: None,
    });
    let n = graph.unique_name(&format!("{name}/Attention"));
    let new = graph.add_node(&n, op, &[Some(m.q), Some(k), Some(m.v), m.mask])?;
    graph.replace_uses(m.replaces, ValueId::from(new))?;
    Ok(())
}

/// The node producing `v` (output 0) and its op; not for inputs and constants.
fn producer(graph: &Graph, v: ValueId) -> Option<(NodeId, &Op)> {
    let n = graph.try_node(v.node)?;
    (!matches!(n.op, Op::Input | Op::Constant(_)) && v.output == 0).then_some((v.node, &n.op))
}

/// `v` has one user and is not a graph output.
fn used_once(graph: &Graph, v: ValueId) -> bool {
    graph.users(v).len() == 1 && !graph.outputs().iter().any(|(_, o)| *o == v)
}

fn operand(graph: &Graph, id: NodeId, i: usize) -> Option<ValueId> {
    graph.operands(id).get(i).copied().flatten()
}

fn dims(graph: &Graph, v: ValueId) -> Option<Vec<usize>> {
    graph.value_type(v).shape.as_fixed()
}

/// The one value of a one-element constant.
fn scalar(graph: &Graph, v: ValueId) -> Option<f64> {
    let t = graph.constant_value(v)?;
    (t.len() == 1).then(|| t.to_f64s()[0])
}

/// The scores before scaling and the scale: `MatMul`, or a `Div`/`Mul` of one by a scalar.
fn scaled_scores(graph: &Graph, v: ValueId) -> Option<(NodeId, f32)> {
    let (id, op) = producer(graph, v)?;
    match op {
        Op::MatMul => Some((id, 1.0)),
        Op::Binary(b @ (BinaryOp::Div | BinaryOp::Mul)) => {
            let (a0, a1) = (operand(graph, id, 0)?, operand(graph, id, 1)?);
            let (x, c) = match scalar(graph, a1) {
                Some(c) => (a0, c),
                None if *b == BinaryOp::Mul => (a1, scalar(graph, a0)?),
                None => return None,
            };
            let (mm, Op::MatMul) = producer(graph, x)? else { return None };
            let scale = if *b == BinaryOp::Div { 1.0 / c } else { c };
            (used_once(graph, x) && scale.is_finite()).then_some((mm, scale as f32))
        }
        _ => None,
    }
}

/// A constant mask of `s` queries by `t` keys (as many), the same for every batch and head: 0 on
/// and below the diagonal, -inf (or the lowest f32, as some exporters write it) above.
fn is_causal(graph: &Graph, m: ValueId, s: usize, t: usize) -> bool {
    let (Some(c), Some(md)) = (graph.constant_value(m), dims(graph, m)) else { return false };
    if s != t
        || md.len() < 2
        || md[md.len() - 2..] != [s, t]
        || md[..md.len() - 2].iter().any(|&d| d != 1)
    {
        return false;
    }
    let values = c.to_f64s();
    let masked = |x: f64| x == f64::NEG_INFINITY || x <= f32::MIN as f64;
    values.iter().enumerate().all(|(n, &x)| if n % t > n / t { masked(x) } else { x == 0.0 })
}

/// The value a chain of Transposes ending at `v` starts from, and the composed permutation
/// (output axis i is the source's axis perm[i]).
fn through_transposes(graph: &Graph, mut v: ValueId, rank: usize) -> (ValueId, Vec<usize>) {
    let mut perm: Vec<usize> = (0..rank).collect();
    while let Some((id, Op::Transpose { perm: p })) = producer(graph, v) {
        let p: Vec<usize> = if p.is_empty() { (0..rank).rev().collect() } else { p.clone() };
        if p.len() != rank {
            break;
        }
        perm = perm.iter().map(|&i| p[i]).collect();
        let Some(x) = operand(graph, id, 0) else { break };
        v = x;
    }
    (v, perm)
}

/// The [b, s, h * d] value whose heads `v` ([b, h, s, d] read through `want`, the permutation
/// of [b, s, h, d] it is) are: a Reshape splitting the last axis, then Transposes.
fn packed_heads(graph: &Graph, v: ValueId, want: [usize; 4]) -> Option<ValueId> {
    let (split, perm) = through_transposes(graph, v, 4);
    if perm != want {
        return None;
    }
    let (id, Op::Reshape { .. }) = producer(graph, split)? else { return None };
    let x = operand(graph, id, 0)?;
    let (sd, xd) = (dims(graph, split)?, dims(graph, x)?);
    (xd.len() == 3 && sd.len() == 4 && xd[..2] == sd[..2] && xd[2] == sd[2] * sd[3]).then_some(x)
}

/// Y [b, h, s, dv] taken back to [b, s, h * dv] by a Transpose (or a chain) and a Reshape, each
/// used only there: the Reshape's value.
fn packed_result(graph: &Graph, y: ValueId) -> Option<ValueId> {
    let mut v = y;
    let mut perm: Vec<usize> = (0..4).collect();
    loop {
        let users = graph.users(v);
        if users.len() != 1 || graph.outputs().iter().any(|(_, o)| *o == v) {
            return None;
        }
        let (u, _) = users[0];
        match &graph.node(u).op {
            Op::Transpose { perm: p } if p.len() == 4 => {
                perm = p.iter().map(|&i| perm[i]).collect();
                v = u.into();
            }
            Op::Reshape { .. }
                if perm == [0, 2, 1, 3]
                    && graph.operands(u).first().copied().flatten() == Some(v) =>
            {
                let (vd, rd) = (dims(graph, v)?, dims(graph, u.into())?);
                return (rd.len() == 3 && rd[..2] == vd[..2] && rd[2] == vd[2] * vd[3])
                    .then_some(u.into());
            }
            _ => return None,
        }
    }
}

fn recognize(graph: &Graph, id: NodeId) -> Option<Match> {
    if graph.node(id).op != Op::MatMul {
        return None;
    }
    let (p, v4) = (operand(graph, id, 0)?, operand(graph, id, 1)?);
    let (sm, Op::Softmax { axis }) = producer(graph, p)? else { return None };
    if !(*axis == -1 || *axis == 3) || !used_once(graph, p) {
        return None;
    }
    let s = operand(graph, sm, 0)?;
    if !used_once(graph, s) {
        return None;
    }
    // An Add of a mask: the scores are the side that leads to the first MatMul.
    let (scores, mask) = match producer(graph, s)? {
        (add, Op::Binary(BinaryOp::Add)) => {
            let (a, b) = (operand(graph, add, 0)?, operand(graph, add, 1)?);
            if scaled_scores(graph, a).is_some() && used_once(graph, a) {
                (a, Some(b))
            } else if scaled_scores(graph, b).is_some() && used_once(graph, b) {
                (b, Some(a))
            } else {
                return None;
            }
        }
        _ => (s, None),
    };
    let (qk, scale) = scaled_scores(graph, scores)?;
    let (q4, kt4) = (operand(graph, qk, 0)?, operand(graph, qk, 1)?);
    let y4 = ValueId::from(id);
    let all_f32 =
        [q4, kt4, v4, y4].into_iter().chain(mask).all(|v| graph.value_type(v).dtype == DType::F32);
    let (qd, kd, vd, sd) = (dims(graph, q4)?, dims(graph, kt4)?, dims(graph, v4)?, dims(graph, s)?);
    if !all_f32 || qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return None;
    }
    let (b, h, sq, d, t) = (qd[0], qd[1], qd[2], qd[3], kd[3]);
    if kd[..3] != [b, h, d]
        || vd[..3] != [b, h, t]
        || sd != [b, h, sq, t]
        || dims(graph, ValueId::from(qk))? != sd
    {
        return None;
    }
    if let Some(m) = mask {
        // It broadcasts to the scores without widening them (the Add's result is the scores'
        // shape) and spans the keys: Attention pads a shorter mask's last axis with "masked".
        let md = dims(graph, m)?;
        if md.len() > 4 || md.last() != Some(&t) {
            return None;
        }
    }
    // A constant causal mask becomes the causal flag.
    let causal = mask.is_some_and(|m| is_causal(graph, m, sq, t));
    let mask = if causal { None } else { mask };
    // The 3-D form when all of Q, K, V and Y are heads of [b, s, h * d] tensors.
    let packed = (|| {
        Some((
            packed_heads(graph, q4, [0, 2, 1, 3])?,
            packed_heads(graph, kt4, [0, 2, 3, 1])?,
            packed_heads(graph, v4, [0, 2, 1, 3])?,
            packed_result(graph, y4)?,
        ))
    })();
    Some(match packed {
        Some((q, k, v, replaces)) => Match {
            q,
            k: KeyForm::Packed(k),
            v,
            mask,
            causal,
            scale,
            heads: Some(h),
            replaces,
            last: id,
        },
        None => Match {
            q: q4,
            k: KeyForm::Transposed(kt4),
            v: v4,
            mask,
            causal,
            scale,
            heads: None,
            replaces: y4,
            last: id,
        },
    })
}
