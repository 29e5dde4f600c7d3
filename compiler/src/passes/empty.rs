//! Contractions over nothing: a MatMul or Gemm with an inner dimension of 0, a Conv or
//! ConvTranspose with no input channels, an Einsum whose contracted letters have extent 0. A
//! sum of no products is 0, so ONNX's result is zeros (plus Gemm's `beta * C`, a convolution's
//! bias), and onnxruntime returns them; the code generators tile by the reduction's extent and
//! crashed on 0. Each becomes its result written out: an Expand of the zero (or of the bias) to
//! the result's shape.
//!
//! Any other node whose results are all empty becomes empty constants.
//!
//! Recurrences over no steps (an RNN, GRU or LSTM whose sequence has length 0) likewise: `Y` is
//! empty and `Y_h`, `Y_c` are zeros, what onnxruntime and kiln's interpreter give a sequence of
//! length 0 (an entry of `sequence_lens` that is 0 gets zero states, whatever the initial ones);
//! the recurrent kernels refused a zero-length sequence.

use kiln_ir::op::OpKind;
use kiln_ir::{Graph, NodeId, Op, Tensor, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        if graph.try_node(id).is_none() {
            continue;
        }
        if let Some(empty) = empty_results(graph, id)? {
            for (k, v) in empty.into_iter().enumerate() {
                graph.replace_uses(ValueId::new(id, k), v)?;
            }
            changed = true;
            continue;
        }
        if let Some(states) = zero_step_recurrence(graph, id)? {
            for (k, v) in states.into_iter().enumerate() {
                graph.replace_uses(ValueId::new(id, k), v)?;
            }
            changed = true;
            continue;
        }
        if let Some(v) = replacement(graph, id)? {
            graph.replace_uses(ValueId::from(id), v)?;
            changed = true;
        }
    }
    if changed {
        super::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// The value to use instead of node `id`'s result when it contracts over nothing.
fn replacement(graph: &mut Graph, id: NodeId) -> Result<Option<ValueId>> {
    let node = graph.node(id).clone();
    if node.outputs.len() != 1 {
        return Ok(None);
    }
    let out = &node.outputs[0];
    let Some(out_dims) = out.shape.as_fixed() else { return Ok(None) };
    let operands = graph.operands(id);
    let dims = |i: usize| -> Option<Vec<usize>> {
        graph.value_type(operands.get(i).copied().flatten()?).shape.as_fixed()
    };
    // The value to broadcast (None: zeros) when the reduction is empty.
    let fill: Option<Option<ValueId>> = match &node.op {
        Op::MatMul => {
            let a = dims(0);
            a.filter(|a| a.last() == Some(&0)).map(|_| None)
        }
        Op::Gemm(g) => {
            let a = dims(0);
            let k = a.map(|a| if g.trans_a { a[0] } else { a[a.len() - 1] });
            match (k, operands.get(2).copied().flatten()) {
                (Some(0), Some(c)) if g.beta != 0.0 => {
                    Some(Some(scaled(graph, &node.name, c, g.beta)?))
                }
                (Some(0), _) => Some(None),
                _ => None,
            }
        }
        Op::Conv(_) | Op::ConvTranspose(_) => {
            let x = dims(0);
            match (x.filter(|x| x.len() > 2 && x[1] == 0), operands.get(2).copied().flatten()) {
                // The bias of each output channel, broadcast along the image.
                (Some(_), Some(b)) => {
                    let mut shape = vec![1i64; out_dims.len()];
                    shape[1] = out_dims[1] as i64;
                    Some(Some(reshaped(graph, &node.name, b, &shape)?))
                }
                (Some(_), None) => Some(None),
                _ => None,
            }
        }
        Op::Einsum { equation } => {
            let empty_letter = einsum_contracts_nothing(equation, &operands, graph);
            empty_letter.then_some(None)
        }
        _ => None,
    };
    let Some(fill) = fill else { return Ok(None) };
    if out_dims.contains(&0) {
        // An empty result needs nothing written; the op's own kernel handles it.
        return Ok(None);
    }
    let value = match fill {
        Some(v) => v,
        None => graph.add_constant(
            &graph.unique_name(&format!("{}.zero", node.name)),
            Tensor::zeros(out.dtype, &[]),
        )?,
    };
    let shape = graph.add_constant(
        &graph.unique_name(&format!("{}.shape", node.name)),
        Tensor::vector(&out_dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
    )?;
    let name = graph.unique_name(&format!("{}.empty", node.name));
    let e = graph.add_node(&name, Op::Expand, &[Some(value), Some(shape)])?;
    // A bias of another dtype than the result (Gemm's C is the result's) is cast back.
    let e: ValueId = e.into();
    if graph.value_type(e).dtype != out.dtype {
        let name = graph.unique_name(&format!("{}.cast", node.name));
        return Ok(Some(
            graph.add_node(&name, Op::Cast { to: out.dtype, saturate: true }, &[Some(e)])?.into(),
        ));
    }
    Ok(Some(e))
}

/// For a recurrence over a sequence of length 0, the values of its outputs (`Y`, `Y_h`[,
/// `Y_c`]): all zeros (`Y` empty).
fn zero_step_recurrence(graph: &mut Graph, id: NodeId) -> Result<Option<Vec<ValueId>>> {
    let node = graph.node(id).clone();
    let Op::Rnn(r) = &node.op else { return Ok(None) };
    let operands = graph.operands(id);
    let Some(x) = operands.first().copied().flatten() else { return Ok(None) };
    let Some(xd) = graph.value_type(x).shape.as_fixed() else { return Ok(None) };
    let steps = if r.batch_first { xd.get(1) } else { xd.first() };
    if steps != Some(&0) {
        return Ok(None);
    }
    let mut values = Vec::with_capacity(node.outputs.len());
    for (k, out) in node.outputs.iter().enumerate() {
        let Some(dims) = out.shape.as_fixed() else { return Ok(None) };
        values.push(zeros(graph, &format!("{}.{k}", node.name), out.dtype, &dims)?);
    }
    Ok(Some(values))
}

/// Empty constants for a node every result of which has no elements: nothing to compute. The
/// code generators assume a window, a row or a tile to work on (a MaxPool whose output axis has
/// size 0 underflowed computing its last window), so such nodes never reach them. Control flow
/// keeps its nodes (its bodies still run: a Loop's termination is its own).
fn empty_results(graph: &mut Graph, id: NodeId) -> Result<Option<Vec<ValueId>>> {
    let node = graph.node(id);
    if matches!(node.op.kind(), OpKind::Source | OpKind::Control) || node.outputs.is_empty() {
        return Ok(None);
    }
    let mut dims = Vec::with_capacity(node.outputs.len());
    for out in &node.outputs {
        match out.shape.as_fixed() {
            Some(d) if out.kind.is_tensor() && d.contains(&0) => dims.push((out.dtype, d)),
            _ => return Ok(None),
        }
    }
    let name = node.name.clone();
    let mut values = Vec::with_capacity(dims.len());
    for (k, (dtype, d)) in dims.into_iter().enumerate() {
        values.push(zeros(graph, &format!("{name}.{k}"), dtype, &d)?);
    }
    Ok(Some(values))
}

/// Zeros of a shape: an empty constant, or a scalar zero expanded (no constant as large as the
/// result in the artifact).
fn zeros(graph: &mut Graph, name: &str, dtype: kiln_ir::DType, dims: &[usize]) -> Result<ValueId> {
    if dims.contains(&0) {
        return Ok(graph.add_constant(
            &graph.unique_name(&format!("{name}.empty")),
            Tensor::zeros(dtype, dims),
        )?);
    }
    let zero = graph
        .add_constant(&graph.unique_name(&format!("{name}.zero")), Tensor::zeros(dtype, &[]))?;
    let shape = graph.add_constant(
        &graph.unique_name(&format!("{name}.shape")),
        Tensor::vector(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
    )?;
    let n = graph.unique_name(&format!("{name}.zeros"));
    Ok(graph.add_node(&n, Op::Expand, &[Some(zero), Some(shape)])?.into())
}

/// `beta * c` (c itself when beta is 1).
fn scaled(graph: &mut Graph, name: &str, c: ValueId, beta: f32) -> Result<ValueId> {
    if beta == 1.0 {
        return Ok(c);
    }
    let dtype = graph.value_type(c).dtype;
    let b = graph.add_constant(
        &graph.unique_name(&format!("{name}.beta")),
        Tensor::from_f64s(dtype, &[], &[beta as f64])?,
    )?;
    let n = graph.unique_name(&format!("{name}.scaled"));
    Ok(graph.add_node(&n, Op::Binary(kiln_ir::BinaryOp::Mul), &[Some(c), Some(b)])?.into())
}

/// `v` reshaped to `shape`.
fn reshaped(graph: &mut Graph, name: &str, v: ValueId, shape: &[i64]) -> Result<ValueId> {
    let s = graph
        .add_constant(&graph.unique_name(&format!("{name}.bias_shape")), Tensor::vector(shape))?;
    let n = graph.unique_name(&format!("{name}.bias"));
    Ok(graph.add_node(&n, Op::Reshape { allowzero: false }, &[Some(v), Some(s)])?.into())
}

/// Whether an Einsum sums over a letter of extent 0 (a letter of an operand that the result
/// does not keep).
fn einsum_contracts_nothing(equation: &str, operands: &[Option<ValueId>], graph: &Graph) -> bool {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let Some((lhs, rhs)) = eq.split_once("->") else { return false };
    if lhs.contains("...") {
        return false;
    }
    for (term, v) in lhs.split(',').zip(operands) {
        let Some(dims) = v.and_then(|v| graph.value_type(v).shape.as_fixed()) else { return false };
        if term.len() != dims.len() {
            return false;
        }
        for (c, &d) in term.chars().zip(&dims) {
            if d == 0 && !rhs.contains(c) {
                return true;
            }
        }
    }
    false
}
