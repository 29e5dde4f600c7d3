//! Recognition: normalisations that exporters write as chains of small ops become the op kiln
//! runs as one kernel.
//!
//! - **LayerNorm** (tf2onnx, older PyTorch):
//!   `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta]`, with `^2` a `Pow` by
//!   2 or a `Mul` of the difference by itself, becomes `LayerNormalization(x, gamma, beta)`.
//!   Unfused it is five kernels, each a pass over the tensor.
//! - **RMSNorm** (LLaMA-style exports): `x / sqrt(mean(x^2) + eps)` or
//!   `x * reciprocal(sqrt(mean(x^2) + eps))`, `[* gamma]`, becomes `RMSNormalization(x, gamma)`.
//!
//! - **SiLU** (PyTorch's `SiLU` as exported before opset 24, YOLO's activation):
//!   `x * sigmoid(x)` becomes `Swish(x)` (alpha 1), which a convolution's microkernel applies as
//!   its epilogue.
//! - **Softmax** (hand-written and TF-style exports): `e / sum(e)` or `e * reciprocal(sum(e))`
//!   with `e = exp(x - max(x))` or `e = exp(x)`, becomes `Softmax(x)`; **LogSoftmax**:
//!   `d - log(sum(exp(d)))` with `d = x - max(x)` becomes `LogSoftmax(x)`. Unfused the stable form
//!   is four kernels (max, exp, sum, divide), each a pass over the tensor. The reductions are over
//!   one axis with `keepdims`; the unstable `exp(x)` form gets the stable kernel, which agrees
//!   with it wherever it does not overflow.
//!
//! The means reduce the trailing axes with `keepdims`; eps, gamma and beta are constants (gamma
//! and beta of the normalised axes' shape, leading ones allowed). Every intermediate must be
//! used only inside the pattern, so nothing else loses a value. The replacement is named after
//! the last node it replaces.

use kiln_ir::op::{Reduce, ReduceKind};
use kiln_ir::{BinaryOp, Graph, NodeId, Op, Tensor, UnaryOp, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        if graph.try_node(id).is_none() {
            continue;
        }
        if let Some((op, x)) =
            softmax(graph, id).or_else(|| log_softmax(graph, id)).or_else(|| swish(graph, id))
        {
            let name = graph.unique_name(&format!("{}/{}", graph.node(id).name, op.name()));
            let new = graph.add_node(&name, op, &[Some(x)])?;
            graph.replace_uses(ValueId::from(id), ValueId::from(new))?;
            changed = true;
            continue;
        }
        let found = layer_norm(graph, id).or_else(|| rms_norm(graph, id));
        let Some(m) = found else { continue };
        apply(graph, m)?;
        changed = true;
    }
    if changed {
        super::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// A recognised normalisation: the op, its input, the node whose value it replaces, the
/// normalised shape's scale and bias.
struct Match {
    op: Op,
    x: ValueId,
    last: NodeId,
    scale: Option<ValueId>,
    bias: Option<ValueId>,
}

fn apply(graph: &mut Graph, m: Match) -> Result<()> {
    let xt = graph.value_type(m.x).clone();
    let Some(dims) = xt.shape.as_fixed() else { return Ok(()) };
    let axis = match m.op {
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => axis as usize,
        _ => return Ok(()),
    };
    let name = graph.node(m.last).name.clone();
    let shaped =
        |graph: &mut Graph, v: Option<ValueId>, what: &str, fill: f64| -> Result<Option<ValueId>> {
            let t = match v {
                Some(v) => match graph.constant_value(v) {
                    Some(t) => t.reshape(&dims[axis..])?,
                    None => return Ok(None),
                },
                None if fill.is_nan() => return Ok(None),
                None => Tensor::full(xt.dtype, &dims[axis..], fill),
            };
            let n = graph.unique_name(&format!("{name}/{what}"));
            Ok(Some(graph.add_constant(&n, t)?))
        };
    let scale = shaped(graph, m.scale, "scale", 1.0)?;
    let bias = shaped(graph, m.bias, "bias", f64::NAN)?;
    let node_name = graph.unique_name(&format!("{name}/{}", m.op.name()));
    let new = graph.add_node(
        &node_name,
        m.op,
        &[Some(m.x), scale, bias]
            .into_iter()
            .take(if bias.is_some() { 3 } else { 2 })
            .collect::<Vec<_>>(),
    )?;
    graph.replace_uses(ValueId::from(m.last), ValueId::from(new))?;
    Ok(())
}

/// The node producing `v` and its op (not for inputs and constants).
fn producer(graph: &Graph, v: ValueId) -> Option<(NodeId, &Op)> {
    let n = graph.try_node(v.node)?;
    (!matches!(n.op, Op::Input | Op::Constant(_)) && v.output == 0).then_some((v.node, &n.op))
}

/// Every use of `v` is by one of `nodes`, and it is not a graph output.
fn used_only_by(graph: &Graph, v: ValueId, nodes: &[NodeId]) -> bool {
    graph.users(v).iter().all(|(u, _)| nodes.contains(u))
        && !graph.outputs().iter().any(|(_, o)| *o == v)
}

/// The one value of a one-element constant.
fn scalar(graph: &Graph, v: ValueId) -> Option<f64> {
    let t = graph.constant_value(v)?;
    (t.len() == 1).then(|| t.to_f64s()[0])
}

/// The two operands of a binary node of `op`.
fn binary(graph: &Graph, id: NodeId, op: BinaryOp) -> Option<(ValueId, ValueId)> {
    if graph.node(id).op != Op::Binary(op) {
        return None;
    }
    let ops = graph.operands(id);
    Some((ops.first().copied().flatten()?, ops.get(1).copied().flatten()?))
}

/// `ReduceMean(x, axes, keepdims)` over trailing axes: x and the first reduced axis.
fn trailing_mean(graph: &Graph, id: NodeId) -> Option<(ValueId, usize)> {
    let Op::Reduce(Reduce { kind: ReduceKind::Mean, keepdims: true, .. }) = graph.node(id).op
    else {
        return None;
    };
    let ops = graph.operands(id);
    let x = ops.first().copied().flatten()?;
    let rank = graph.value_type(x).shape.as_fixed()?.len() as i64;
    let mut axes: Vec<i64> = graph
        .constant_value(ops.get(1).copied().flatten()?)?
        .to_i64s()
        .iter()
        .map(|&a| if a < 0 { a + rank } else { a })
        .collect();
    axes.sort_unstable();
    axes.dedup();
    let first = *axes.first()?;
    let trailing = axes.iter().enumerate().all(|(i, &a)| a == first + i as i64)
        && *axes.last()? == rank - 1
        && first >= 0;
    trailing.then_some((x, first as usize))
}

/// `v^2` as `Pow(v, 2)` or `Mul(v, v)`: the node, if it squares `v`.
fn squares(graph: &Graph, id: NodeId, v: ValueId) -> bool {
    if let Some((a, e)) = binary(graph, id, BinaryOp::Pow) {
        return a == v && scalar(graph, e) == Some(2.0);
    }
    matches!(binary(graph, id, BinaryOp::Mul), Some((a, b)) if a == v && b == v)
}

/// `sqrt(mean(sq) + eps)` at node `s`, its inner values used only by the chain: (the squaring
/// node, eps, the first reduced axis).
fn root_mean_square(graph: &Graph, s: NodeId) -> Option<(NodeId, f64, usize)> {
    if graph.node(s).op != Op::Unary(UnaryOp::Sqrt) {
        return None;
    }
    let (add, _) = producer(graph, graph.operands(s).first().copied().flatten()?)?;
    let (a, b) = binary(graph, add, BinaryOp::Add)?;
    let (mean_v, eps) = match (scalar(graph, a), scalar(graph, b)) {
        (None, Some(e)) => (a, e),
        (Some(e), None) => (b, e),
        _ => return None,
    };
    let (mean, _) = producer(graph, mean_v)?;
    let (sq_v, axis) = trailing_mean(graph, mean)?;
    let (sq, _) = producer(graph, sq_v)?;
    let chain_ok = used_only_by(graph, mean_v, &[add])
        && used_only_by(graph, ValueId::from(add), &[s])
        && used_only_by(graph, sq_v, &[mean]);
    (chain_ok && eps >= 0.0).then_some((sq, eps, axis))
}

/// The optional `* gamma` and `+ beta` after `n` (constants that broadcast over the normalised
/// trailing axes from `axis`): (the last node, gamma, beta).
fn affine(
    graph: &Graph,
    n: NodeId,
    x: ValueId,
    axis: usize,
    allow_beta: bool,
) -> (NodeId, Option<ValueId>, Option<ValueId>) {
    let fits = |c: ValueId| -> bool {
        let (Some(t), Some(xd)) = (graph.constant_value(c), graph.value_type(x).shape.as_fixed())
        else {
            return false;
        };
        let norm = &xd[axis..];
        let strip =
            |d: &[usize]| -> Vec<usize> { d.iter().copied().skip_while(|&x| x == 1).collect() };
        t.dtype() == graph.value_type(x).dtype
            && t.len() == norm.iter().product::<usize>()
            && strip(t.dims()) == strip(norm)
            && t.dims().len() <= xd.len()
    };
    // (value, op) -> the single user applying `op` with a fitting constant, and that constant.
    let next = |v: ValueId, op: BinaryOp| -> Option<(NodeId, ValueId)> {
        let users = graph.users(v);
        if users.len() != 1 || graph.outputs().iter().any(|(_, o)| *o == v) {
            return None;
        }
        let u = users[0].0;
        let (a, b) = binary(graph, u, op)?;
        let c = if a == v { b } else { a };
        (fits(c) && (a == v || b == v)).then_some((u, c))
    };
    let mut last = n;
    let mut gamma = None;
    let mut beta = None;
    if let Some((u, c)) = next(ValueId::from(last), BinaryOp::Mul) {
        last = u;
        gamma = Some(c);
    }
    if allow_beta {
        if let Some((u, c)) = next(ValueId::from(last), BinaryOp::Add) {
            last = u;
            beta = Some(c);
        }
    }
    (last, gamma, beta)
}

/// `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)` at the Div `n`.
fn layer_norm(graph: &Graph, n: NodeId) -> Option<Match> {
    let (d, std) = binary(graph, n, BinaryOp::Div)?;
    let (sub, _) = producer(graph, d)?;
    let (x, m) = binary(graph, sub, BinaryOp::Sub)?;
    let (mean, _) = producer(graph, m)?;
    let (mx, axis) = trailing_mean(graph, mean)?;
    if mx != x || !used_only_by(graph, m, &[sub]) || !graph.value_type(x).dtype.is_float() {
        return None;
    }
    let (s, _) = producer(graph, std)?;
    let (sq, eps, axis2) = root_mean_square(graph, s)?;
    if axis2 != axis
        || !squares(graph, sq, d)
        || !used_only_by(graph, d, &[sq, n])
        || !used_only_by(graph, std, &[n])
    {
        return None;
    }
    let (last, scale, bias) = affine(graph, n, x, axis, true);
    Some(Match {
        op: Op::LayerNorm { axis: axis as i64, epsilon: eps as f32 },
        x,
        last,
        scale,
        bias,
    })
}

/// `x / sqrt(mean(x^2) + eps)` or `x * reciprocal(sqrt(mean(x^2) + eps))` at the Div or Mul `n`.
fn rms_norm(graph: &Graph, n: NodeId) -> Option<Match> {
    let (x, s, s_users) = if let Some((x, std)) = binary(graph, n, BinaryOp::Div) {
        (x, producer(graph, std)?.0, vec![n])
    } else {
        let (a, b) = binary(graph, n, BinaryOp::Mul)?;
        // Either operand may be the reciprocal.
        let pick = |v: ValueId| -> Option<NodeId> {
            let (r, op) = producer(graph, v)?;
            (*op == Op::Unary(UnaryOp::Reciprocal) && used_only_by(graph, v, &[n])).then_some(r)
        };
        let (x, r) = match (pick(b), pick(a)) {
            (Some(r), _) => (a, r),
            (None, Some(r)) => (b, r),
            _ => return None,
        };
        (x, producer(graph, graph.operands(r).first().copied().flatten()?)?.0, vec![r])
    };
    let (sq, eps, axis) = root_mean_square(graph, s)?;
    if !squares(graph, sq, x)
        || !used_only_by(graph, ValueId::from(s), &s_users)
        || !graph.value_type(x).dtype.is_float()
    {
        return None;
    }
    let (last, scale, _) = affine(graph, n, x, axis, false);
    Some(Match {
        op: Op::RmsNorm { axis: axis as i64, epsilon: eps as f32 },
        x,
        last,
        scale,
        bias: None,
    })
}

/// `Reduce<kind>(x, [axis], keepdims)` over one axis: x and the axis (normalised).
fn one_axis_reduce(graph: &Graph, id: NodeId, kind: ReduceKind) -> Option<(ValueId, usize)> {
    let Op::Reduce(Reduce { kind: k, keepdims: true, .. }) = graph.node(id).op else { return None };
    let ops = graph.operands(id);
    let x = ops.first().copied().flatten()?;
    let rank = graph.value_type(x).shape.as_fixed()?.len();
    let axes = graph.constant_value(ops.get(1).copied().flatten()?)?.to_i64s();
    let [a] = axes.as_slice() else { return None };
    (k == kind).then_some((x, kiln_ir::normalize_axis(*a, rank)?))
}

/// `x - max(x, axis)` at `d` (the max used only there): x and the axis; else `d` itself with no
/// axis (the unstable form's exponent).
fn minus_max(graph: &Graph, d: ValueId) -> (ValueId, Option<usize>) {
    let found = producer(graph, d).and_then(|(sub, _)| {
        let (x, m) = binary(graph, sub, BinaryOp::Sub)?;
        let (max, _) = producer(graph, m)?;
        let (mx, axis) = one_axis_reduce(graph, max, ReduceKind::Max)?;
        (mx == x && used_only_by(graph, m, &[sub])).then_some((x, axis))
    });
    match found {
        Some((x, axis)) => (x, Some(axis)),
        None => (d, None),
    }
}

/// `exp(d)` summed over one axis at `s`: (the Exp node, d, the axis).
fn sum_of_exp(graph: &Graph, s: ValueId) -> Option<(NodeId, ValueId, usize)> {
    let (sum, _) = producer(graph, s)?;
    let (e, axis) = one_axis_reduce(graph, sum, ReduceKind::Sum)?;
    let (exp, op) = producer(graph, e)?;
    (*op == Op::Unary(UnaryOp::Exp)).then_some((
        exp,
        graph.operands(exp).first().copied().flatten()?,
        axis,
    ))
}

/// Softmax at the Div (or Mul by a reciprocal) `n`: the op and its input.
fn softmax(graph: &Graph, n: NodeId) -> Option<(Op, ValueId)> {
    let (e, s, s_users) = if let Some((e, s)) = binary(graph, n, BinaryOp::Div) {
        (e, s, vec![n])
    } else {
        let (a, b) = binary(graph, n, BinaryOp::Mul)?;
        let reciprocal_of = |v: ValueId| -> Option<(NodeId, ValueId)> {
            let (r, op) = producer(graph, v)?;
            (*op == Op::Unary(UnaryOp::Reciprocal) && used_only_by(graph, v, &[n]))
                .then_some((r, graph.operands(r).first().copied().flatten()?))
        };
        match (reciprocal_of(b), reciprocal_of(a)) {
            (Some((r, s)), _) => (a, s, vec![r]),
            (None, Some((r, s))) => (b, s, vec![r]),
            _ => return None,
        }
    };
    let (exp, d, axis) = sum_of_exp(graph, s)?;
    let (sum, _) = producer(graph, s)?;
    if ValueId::from(exp) != e
        || !used_only_by(graph, s, &s_users)
        || !used_only_by(graph, e, &[sum, n])
    {
        return None;
    }
    // The stable form's difference goes away with it; the unstable form's x stays for others.
    let (x, max_axis) = minus_max(graph, d);
    if max_axis.is_some() && !used_only_by(graph, d, &[exp]) {
        return None;
    }
    let float = graph.value_type(x).dtype.is_float()
        && graph.value_type(ValueId::from(n)).shape == graph.value_type(x).shape;
    (float && max_axis.is_none_or(|a| a == axis)).then_some((Op::Softmax { axis: axis as i64 }, x))
}

/// SiLU at the Mul `n`: `x * sigmoid(x)` (either order), the sigmoid used by it alone, becomes
/// `Swish(x)` with alpha 1: one op a convolution's microkernel applies as its results are stored
/// (YOLOv8's 57 activations were as many kernels, each a pass over a convolution's result).
fn swish(graph: &Graph, n: NodeId) -> Option<(Op, ValueId)> {
    let (a, b) = binary(graph, n, BinaryOp::Mul)?;
    let sigmoid_of = |s: ValueId, x: ValueId| -> bool {
        producer(graph, s).is_some_and(|(p, op)| {
            *op == Op::Unary(UnaryOp::Sigmoid)
                && graph.operands(p).first().copied().flatten() == Some(x)
                && used_only_by(graph, s, &[n])
        })
    };
    let x = if sigmoid_of(b, a) {
        a
    } else if sigmoid_of(a, b) {
        b
    } else {
        return None;
    };
    let same = graph.value_type(ValueId::from(n)) == graph.value_type(x);
    (same && graph.value_type(x).dtype.is_float())
        .then_some((Op::Unary(UnaryOp::Swish { alpha: 1.0 }), x))
}

/// LogSoftmax at the Sub `n`: `d - log(sum(exp(d)))` with `d = x - max(x)`.
fn log_softmax(graph: &Graph, n: NodeId) -> Option<(Op, ValueId)> {
    let (d, l) = binary(graph, n, BinaryOp::Sub)?;
    let (log, op) = producer(graph, l)?;
    if *op != Op::Unary(UnaryOp::Log) || !used_only_by(graph, l, &[n]) {
        return None;
    }
    let s = graph.operands(log).first().copied().flatten()?;
    let (exp, d2, axis) = sum_of_exp(graph, s)?;
    let (sum, _) = producer(graph, s)?;
    let (x, max_axis) = minus_max(graph, d);
    if d2 != d
        || max_axis != Some(axis)
        || !used_only_by(graph, s, &[log])
        || !used_only_by(graph, ValueId::from(exp), &[sum])
        || !used_only_by(graph, d, &[exp, n])
    {
        return None;
    }
    graph.value_type(x).dtype.is_float().then_some((Op::LogSoftmax { axis: axis as i64 }, x))
}
