//! Padded symbolic axes: one program serves every size of a symbol up to a capacity. A decoder's
//! KV cache grows by a position a step; compiled per size it would be compiled at every step.
//! Instead the graph is specialised with the symbol at a capacity, the inputs' axis padded with
//! zeros past the run's length, and the run's length passed as one more input
//! (`"<symbol>.length"`, i64). This is exact only where nothing reads the padding: `plan` (a pure
//! function of the graph; it prints) proves that by following the padded axis through each op,
//! and refuses, naming the node, where it cannot. `apply` rewrites what needs it:
//!
//! - a Concat along the padded axis puts what it appends right after the valid positions (one
//!   position is written there by a `Where`, more are reordered by a Gather of run-time
//!   indices), so every padded value keeps its valid positions first;
//! - a Softmax along the padded axis adds a mask that is 0 on the valid positions and -inf on
//!   the padding, so its padding is exactly 0;
//! - a MatMul may contract over the padded axis only when one side's padding is exactly 0 (such a
//!   softmax's result, or an input).
//!
//! Outputs padded along the axis are cut to their valid length by the caller (`Session`). The
//! valid length of a value is the run's length plus a constant (`extra`: a Concat appends).

use std::collections::HashMap;
use std::fmt;

use kiln_ir::{BinaryOp, DType, Dim, Graph, Op, Shape, Tensor, TensorType, ValueId};

use crate::{CompileError, Result};

/// How a value is padded: along `axis`, positions `0..length + extra` are valid and the rest up
/// to the static size are padding; `zeroed` when the padding is exactly 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Padded {
    axis: usize,
    extra: usize,
    zeroed: bool,
}

/// What `apply` does to the graph specialised at a capacity, and how the caller pads inputs and
/// cuts outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PadPlan {
    pub symbol: String,
    /// (input index, axis) of every input axis the symbol sizes.
    pub inputs: Vec<(usize, usize)>,
    /// (output index, axis, extra): outputs whose `axis` is cut to the length plus `extra`.
    pub outputs: Vec<(usize, usize, usize)>,
    /// Concats along the padded axis whose appended positions move after the valid ones: (node,
    /// axis, extra of the padded first operand).
    concats: Vec<(String, usize, usize)>,
    /// Softmaxes along the padded axis that get the mask: (node, axis, extra).
    softmaxes: Vec<(String, usize, usize)>,
}

/// The name of the input that carries the run's length.
pub fn length_input(symbol: &str) -> String {
    format!("{symbol}.length")
}

/// Decides whether `symbol` can be padded in `graph` (every other symbol given in `sizes`, as
/// `specialize` takes them: input name -> dims, the symbol's axes at any probe size).
pub fn plan(
    graph: &Graph,
    symbol: &str,
    probe: &HashMap<String, Vec<usize>>,
) -> std::result::Result<PadPlan, String> {
    let mut inputs = Vec::new();
    for (i, &id) in graph.inputs().iter().enumerate() {
        let axes: Vec<usize> = graph.node(id).outputs[0]
            .shape
            .dims()
            .iter()
            .enumerate()
            .filter(|(_, d)| matches!(d, Dim::Sym(s) if &**s == symbol))
            .map(|(a, _)| a)
            .collect();
        match axes.as_slice() {
            [] => {}
            [a] => inputs.push((i, *a)),
            _ => {
                return Err(format!(
                    "input `{}` has `{symbol}` on more than one axis",
                    graph.node(id).name
                ))
            }
        }
    }
    if inputs.is_empty() {
        return Err(format!("no input has `{symbol}`"));
    }
    let mut g = graph.clone();
    crate::passes::specialize::specialize(&mut g, probe).map_err(|e| e.to_string())?;
    // The rules below read static sizes; a size computed at run time is not followed.
    if crate::passes::specialize::has_dynamic_shapes(&g) {
        return Err("some sizes depend on values computed at run time".into());
    }
    let mut padded: HashMap<ValueId, Padded> = HashMap::new();
    for &(i, axis) in &inputs {
        padded.insert(g.inputs()[i].into(), Padded { axis, extra: 0, zeroed: true });
    }
    let mut concats = Vec::new();
    let mut softmaxes = Vec::new();
    for id in g.topo_order().map_err(|e| e.to_string())? {
        let operands = g.operands(id);
        let pads: Vec<Option<Padded>> =
            operands.iter().map(|o| o.and_then(|v| padded.get(&v).copied())).collect();
        if pads.iter().all(Option::is_none) {
            continue;
        }
        let node = g.node(id);
        let refuse = |why: &str| format!("{} `{}` {why}", node.op.name(), node.name);
        let dims = |v: ValueId| g.value_type(v).shape.as_fixed().unwrap_or_default();
        let out_dims = node.outputs[0].shape.as_fixed().unwrap_or_default();
        let first = pads.iter().flatten().next().copied().expect("one operand is padded");
        let result = match &node.op {
            // Zero bits are zero in every type.
            Op::Identity | Op::Cast { .. } | Op::BitCast { .. } => first,
            Op::Unary(_) => Padded { zeroed: false, ..first },
            Op::Binary(_) | Op::Where | Op::Clip => {
                let rank = out_dims.len();
                let mut at: Option<Padded> = None;
                for (o, p) in operands.iter().zip(&pads) {
                    let (Some(v), Some(p)) = (o, p) else { continue };
                    let aligned = Padded { axis: p.axis + rank - g.value_type(*v).rank(), ..*p };
                    if at.is_some_and(|a| (a.axis, a.extra) != (aligned.axis, aligned.extra)) {
                        return Err(refuse("combines values padded differently"));
                    }
                    at = Some(Padded {
                        zeroed: at.map_or(aligned.zeroed, |a| a.zeroed && aligned.zeroed),
                        ..aligned
                    });
                }
                let at = at.expect("one operand is padded");
                // An operand that is not padded must broadcast along the axis.
                for (o, p) in operands.iter().zip(&pads) {
                    let (Some(v), None) = (o, p) else { continue };
                    let d = dims(*v);
                    let shift = rank - d.len();
                    if at.axis >= shift && d[at.axis - shift] != 1 {
                        return Err(refuse(
                            "combines a padded value with one that is not, along the padded axis",
                        ));
                    }
                }
                let zero_times = matches!(node.op, Op::Binary(BinaryOp::Mul))
                    && pads.iter().flatten().any(|p| p.zeroed);
                // A sum keeps zero padding only when every term is padded with zeros.
                let all_zero = operands
                    .iter()
                    .zip(&pads)
                    .all(|(o, p)| o.is_none() || p.is_some_and(|p| p.zeroed));
                Padded {
                    zeroed: zero_times
                        || (all_zero
                            && matches!(node.op, Op::Binary(BinaryOp::Add | BinaryOp::Sub))),
                    ..at
                }
            }
            Op::Transpose { perm } => {
                let rank = out_dims.len();
                let perm: Vec<usize> =
                    if perm.is_empty() { (0..rank).rev().collect() } else { perm.clone() };
                let axis = perm
                    .iter()
                    .position(|&p| p == first.axis)
                    .ok_or_else(|| refuse("has a bad permutation"))?;
                Padded { axis, ..first }
            }
            op if op.is_view() => {
                if pads.iter().skip(1).any(Option::is_some) {
                    return Err(refuse("takes its shape from a padded value"));
                }
                let input = dims(operands[0].expect("a view has its operand"));
                let axis = kept_axis(&input, first.axis, &out_dims)
                    .ok_or_else(|| refuse("merges or splits the padded axis"))?;
                Padded { axis, ..first }
            }
            Op::Concat { axis } => {
                let rank = out_dims.len() as i64;
                let axis = if *axis < 0 { (*axis + rank) as usize } else { *axis as usize };
                if axis != first.axis {
                    if pads
                        .iter()
                        .any(|p| p.map(|p| (p.axis, p.extra)) != Some((first.axis, first.extra)))
                    {
                        return Err(refuse("joins values padded differently along another axis"));
                    }
                    Padded { zeroed: pads.iter().flatten().all(|p| p.zeroed), ..first }
                } else {
                    if pads[0].is_none() || pads.iter().skip(1).any(Option::is_some) {
                        return Err(refuse("appends a padded value to another value (only the first may be padded)"));
                    }
                    let appended: usize =
                        operands[1..].iter().flatten().map(|&v| dims(v)[axis]).sum();
                    concats.push((node.name.clone(), axis, first.extra));
                    Padded { extra: first.extra + appended, zeroed: false, ..first }
                }
            }
            Op::MatMul => {
                let (a, b) =
                    (operands[0].expect("MatMul has A"), operands[1].expect("MatMul has B"));
                let (ra, rb, r) = (dims(a).len(), dims(b).len(), out_dims.len());
                if ra < 2 || rb < 2 {
                    return Err(refuse("is a matrix-vector product"));
                }
                match (pads[0], pads[1]) {
                    (Some(pa), Some(pb)) if pa.axis == ra - 1 && pb.axis == rb - 2 && pa.extra == pb.extra => {
                        if !(pa.zeroed || pb.zeroed) {
                            return Err(refuse("contracts over the padded axis with padding that is not zero on either side"));
                        }
                        // Contracted away: the result is not padded.
                        continue;
                    }
                    (Some(pa), None) if pa.axis == ra - 2 => Padded { axis: r - 2, zeroed: false, ..pa },
                    (None, Some(pb)) if pb.axis == rb - 1 => Padded { axis: r - 1, zeroed: false, ..pb },
                    _ => return Err(refuse("reads the padded axis in a way kiln does not pad (a batch axis, or one side of a contraction)")),
                }
            }
            Op::Softmax { axis } => {
                let rank = out_dims.len() as i64;
                let axis = if *axis < 0 { (*axis + rank) as usize } else { *axis as usize };
                if axis == first.axis {
                    softmaxes.push((node.name.clone(), axis, first.extra));
                    Padded { zeroed: true, ..first }
                } else {
                    Padded { zeroed: false, ..first }
                }
            }
            Op::LayerNorm { axis, .. } => {
                let rank = out_dims.len() as i64;
                let from = if *axis < 0 { (*axis + rank) as usize } else { *axis as usize };
                if first.axis >= from || pads.iter().skip(1).any(Option::is_some) {
                    return Err(refuse("normalises over the padded axis"));
                }
                if node.outputs.len() > 1 {
                    return Err(refuse("gives its statistics too"));
                }
                Padded { zeroed: false, ..first }
            }
            _ => {
                return Err(refuse(&format!(
                    "reads a value padded along `{symbol}`, which kiln does not pad through"
                )))
            }
        };
        if node.outputs.len() != 1 {
            return Err(refuse("has several results"));
        }
        padded.insert(id.into(), result);
    }
    let mut outputs = Vec::new();
    for (k, (name, v)) in g.outputs().iter().enumerate() {
        if let Some(p) = padded.get(v) {
            outputs.push((k, p.axis, p.extra));
        } else if !g.value_type(*v).shape.is_fixed() {
            return Err(format!("output `{name}` has a size kiln cannot follow"));
        }
    }
    Ok(PadPlan { symbol: symbol.to_string(), inputs, outputs, concats, softmaxes })
}

/// The output axis that `axis` of `input` becomes in `output` when a reshape keeps it whole: the
/// same size, with the same number of elements before it.
fn kept_axis(input: &[usize], axis: usize, output: &[usize]) -> Option<usize> {
    let before: usize = input[..axis].iter().product();
    let mut acc = 1;
    for (j, &d) in output.iter().enumerate() {
        if acc == before && d == input[axis] {
            return Some(j);
        }
        acc *= d;
    }
    None
}

/// `graph` specialised to `shapes` (the plan's symbol at the capacity), rewritten as the plan
/// says, with the length input last.
pub fn apply(graph: &Graph, plan: &PadPlan, shapes: &HashMap<String, Vec<usize>>) -> Result<Graph> {
    let mut g = graph.clone();
    crate::passes::specialize::specialize(&mut g, shapes)?;
    let length =
        g.add_input(&length_input(&plan.symbol), TensorType::new(DType::I64, Shape::scalar()))?;
    // `plan` chose these nodes in this graph, static once specialised.
    let bug = |m: String| CompileError::Internal(format!("padding `{}`: {m}", plan.symbol));
    let by_name = |g: &Graph, name: &str| {
        g.nodes()
            .find(|(_, n)| n.name == name)
            .map(|(id, _)| id)
            .ok_or_else(|| bug(format!("no node `{name}`")))
    };
    // Concats of the same sizes (a layer's keys and values, every layer's) share their indices,
    // and softmaxes of one shape their mask.
    let mut indices: HashMap<(usize, usize, usize), ValueId> = HashMap::new();
    let mut masks: HashMap<(Vec<usize>, usize), ValueId> = HashMap::new();
    let mut places: HashMap<(Vec<usize>, usize), ValueId> = HashMap::new();
    for (name, axis, extra) in &plan.concats {
        let (axis, extra) = (*axis, *extra);
        let id = by_name(&g, name)?;
        let node = g.node(id).clone();
        let operands = g.operands(id);
        let first = operands[0].ok_or_else(|| bug(format!("`{name}` lost its operand")))?;
        let total = node.outputs[0]
            .shape
            .as_fixed()
            .ok_or_else(|| bug(format!("`{name}` is not static")))?[axis];
        let padded_size = g
            .value_type(first)
            .shape
            .as_fixed()
            .ok_or_else(|| bug(format!("`{name}`'s operand is not static")))?[axis];
        let rank = node.outputs[0].rank();
        let appended: Vec<ValueId> = operands[1..].iter().flatten().copied().collect();
        let ordered = match appended.as_slice() {
            // One position appended (a decoder's new key): written over the first padding
            // position, `Where(position == valid, new, padded)`, then appended as well (the
            // capacity's last position, valid when the padded operand was full).
            [one] if total == padded_size + 1 => {
                let mut shape = vec![padded_size];
                shape.extend(std::iter::repeat_n(1, rank - axis - 1));
                let at = match places.get(&(shape.clone(), extra)) {
                    Some(&at) => at,
                    None => {
                        let at = position_is_length(&mut g, name, length, &shape, extra)?;
                        places.insert((shape, extra), at);
                        at
                    }
                };
                let written = select(&mut g, name, "written", at, *one, first)?;
                g.add_node(
                    &g.unique_name(&format!("{name}.ordered")),
                    node.op.clone(),
                    &[Some(written), Some(*one)],
                )?
            }
            // Otherwise the joined positions are gathered in order.
            _ => {
                let index = match indices.get(&(total, padded_size, extra)) {
                    Some(&index) => index,
                    None => {
                        let index =
                            reorder_indices(&mut g, name, length, total, padded_size, extra)?;
                        indices.insert((total, padded_size, extra), index);
                        index
                    }
                };
                let joined = g.add_node_with_outputs(
                    &g.unique_name(&format!("{name}.joined")),
                    node.op.clone(),
                    &operands,
                    1,
                )?;
                g.add_node(
                    &g.unique_name(&format!("{name}.ordered")),
                    Op::Gather { axis: axis as i64 },
                    &[Some(joined.into()), Some(index)],
                )?
            }
        };
        g.replace_uses(id.into(), ordered.into())?;
        g.remove_node(id)?;
        g.rename_node(ordered, name)?;
    }
    for (name, axis, extra) in &plan.softmaxes {
        let (axis, extra) = (*axis, *extra);
        let id = by_name(&g, name)?;
        let x = g.operands(id)[0].ok_or_else(|| bug(format!("`{name}` lost its operand")))?;
        let dims = g
            .value_type(x)
            .shape
            .as_fixed()
            .ok_or_else(|| bug(format!("`{name}` is not static")))?;
        // Positions along the axis, shaped to broadcast against the scores from that axis on.
        let mut shape = vec![dims[axis]];
        shape.extend(std::iter::repeat_n(1, dims.len() - axis - 1));
        let mask = match masks.get(&(shape.clone(), extra)) {
            Some(&mask) => mask,
            None => {
                let mask = length_mask(&mut g, name, length, &shape, extra)?;
                masks.insert((shape, extra), mask);
                mask
            }
        };
        let masked = binary(&mut g, name, "masked", BinaryOp::Add, x, mask)?;
        // The Softmax reads the masked scores.
        let node = g.node(id).clone();
        let mut operands = g.operands(id);
        operands[0] = Some(masked);
        let replacement = g.add_node_with_outputs(
            &g.unique_name(&format!("{name}.masked_softmax")),
            node.op.clone(),
            &operands,
            1,
        )?;
        g.replace_uses(id.into(), replacement.into())?;
        g.remove_node(id)?;
        g.rename_node(replacement, name)?;
    }
    Ok(g)
}

/// The positions a Gather reads from `Concat(padded, appended)` (`total` positions, the padded
/// operand `padded_size` of them, valid up to `length + extra`) so that the appended ones come
/// right after the valid ones: `j` below the valid length, then the appended positions (stored
/// from `padded_size` on), then any padding position.
fn reorder_indices(
    g: &mut Graph,
    name: &str,
    length: ValueId,
    total: usize,
    padded_size: usize,
    extra: usize,
) -> Result<ValueId> {
    let scalar = |g: &mut Graph, what: &str, v: i64| {
        g.add_constant(&g.unique_name(&format!("{name}.{what}")), Tensor::scalar::<i64>(v))
    };
    let appended = (total - padded_size) as i64;
    let iota = g.add_constant(
        &g.unique_name(&format!("{name}.positions")),
        Tensor::vector(&(0..total as i64).collect::<Vec<_>>()),
    )?;
    let e = scalar(g, "extra", extra as i64)?;
    let valid = binary(g, name, "valid", BinaryOp::Add, length, e)?;
    let in_first = binary(g, name, "in_first", BinaryOp::Less, iota, valid)?;
    let n = scalar(g, "appended", appended)?;
    let end = binary(g, name, "end", BinaryOp::Add, valid, n)?;
    let in_appended = binary(g, name, "in_appended", BinaryOp::Less, iota, end)?;
    // j + padded_size - valid and j - appended fold to constants but for the length.
    let shifted = g.add_constant(
        &g.unique_name(&format!("{name}.shifted")),
        Tensor::vector(&(0..total as i64).map(|j| j + padded_size as i64).collect::<Vec<_>>()),
    )?;
    let appended_at = binary(g, name, "appended_at", BinaryOp::Sub, shifted, valid)?;
    let back = g.add_constant(
        &g.unique_name(&format!("{name}.padding_at")),
        Tensor::vector(&(0..total as i64).map(|j| (j - appended).max(0)).collect::<Vec<_>>()),
    )?;
    let later = select(g, name, "later", in_appended, appended_at, back)?;
    select(g, name, "index", in_first, iota, later)
}

/// True at the position `length + extra` along the first axis of `shape`.
fn position_is_length(
    g: &mut Graph,
    name: &str,
    length: ValueId,
    shape: &[usize],
    extra: usize,
) -> Result<ValueId> {
    let positions =
        Tensor::from_f64s(DType::I64, shape, &(0..shape[0]).map(|p| p as f64).collect::<Vec<_>>())?;
    let iota = g.add_constant(&g.unique_name(&format!("{name}.positions")), positions)?;
    let e = g.add_constant(
        &g.unique_name(&format!("{name}.extra")),
        Tensor::scalar::<i64>(extra as i64),
    )?;
    let valid = binary(g, name, "valid", BinaryOp::Add, length, e)?;
    binary(g, name, "at", BinaryOp::Equal, iota, valid)
}

/// 0 at the positions below `length + extra` along the first axis of `shape`, -inf after them.
fn length_mask(
    g: &mut Graph,
    name: &str,
    length: ValueId,
    shape: &[usize],
    extra: usize,
) -> Result<ValueId> {
    let positions =
        Tensor::from_f64s(DType::I64, shape, &(0..shape[0]).map(|p| p as f64).collect::<Vec<_>>())?;
    let iota = g.add_constant(&g.unique_name(&format!("{name}.positions")), positions)?;
    let e = g.add_constant(
        &g.unique_name(&format!("{name}.extra")),
        Tensor::scalar::<i64>(extra as i64),
    )?;
    let valid = binary(g, name, "valid", BinaryOp::Add, length, e)?;
    let keep = binary(g, name, "keep", BinaryOp::Less, iota, valid)?;
    let zero = g.add_constant(&g.unique_name(&format!("{name}.zero")), Tensor::scalar(0f32))?;
    let minus_inf = g.add_constant(
        &g.unique_name(&format!("{name}.minus_inf")),
        Tensor::scalar(f32::NEG_INFINITY),
    )?;
    select(g, name, "mask", keep, zero, minus_inf)
}

fn binary(
    g: &mut Graph,
    name: &str,
    what: &str,
    op: BinaryOp,
    a: ValueId,
    b: ValueId,
) -> Result<ValueId> {
    Ok(g.add_node(&g.unique_name(&format!("{name}.{what}")), Op::Binary(op), &[Some(a), Some(b)])?
        .into())
}

fn select(
    g: &mut Graph,
    name: &str,
    what: &str,
    c: ValueId,
    a: ValueId,
    b: ValueId,
) -> Result<ValueId> {
    Ok(g.add_node(
        &g.unique_name(&format!("{name}.{what}")),
        Op::Where,
        &[Some(c), Some(a), Some(b)],
    )?
    .into())
}

impl fmt::Display for PadPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[(String, usize, usize)]| {
            let v: Vec<String> =
                v.iter().map(|(n, a, e)| format!("`{n}` axis {a} length+{e}")).collect();
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        writeln!(f, "pad `{}`", self.symbol)?;
        let inputs: Vec<String> =
            self.inputs.iter().map(|(i, a)| format!("#{i} axis {a}")).collect();
        writeln!(f, "  inputs: {}", inputs.join(", "))?;
        writeln!(f, "  concats reordered: {}", list(&self.concats))?;
        writeln!(f, "  softmaxes masked: {}", list(&self.softmaxes))?;
        let outputs: Vec<String> =
            self.outputs.iter().map(|(o, a, e)| format!("#{o} axis {a} length+{e}")).collect();
        writeln!(
            f,
            "  outputs cut: {}",
            if outputs.is_empty() { "none".to_string() } else { outputs.join(", ") }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reshape_keeps_an_axis_where_the_elements_before_it_match() {
        // [2, 5, 6] -> [10, 6]: axis 2 is output axis 1; axis 1 is merged away.
        assert_eq!(kept_axis(&[2, 5, 6], 2, &[10, 6]), Some(1));
        assert_eq!(kept_axis(&[2, 5, 6], 1, &[10, 6]), None);
        // [4, 3] -> [4, 1, 3]: the size-1 axis in between does not hide it.
        assert_eq!(kept_axis(&[4, 3], 1, &[4, 1, 3]), Some(2));
        assert_eq!(kept_axis(&[4, 3], 0, &[4, 1, 3]), Some(0));
        // Split: [6] -> [2, 3] keeps no axis of 6.
        assert_eq!(kept_axis(&[6], 0, &[2, 3]), None);
        assert_eq!(length_input("past"), "past.length");
    }
}
