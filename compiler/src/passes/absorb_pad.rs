//! Pad absorption: a zero constant `Pad` of spatial axes that feeds a `Conv` becomes the
//! convolution's own padding, so the convolution reads the unpadded tensor and no kernel copies
//! it into a larger one. tf2onnx writes such a Pad before every stride-2 convolution of a
//! "SAME" model (the odd padding at the end); PyTorch exports `ZeroPad2d` the same way.
//!
//! The Pad must be constant mode, pad by 0 (its value absent or a zero scalar constant), leave
//! the batch and channel axes alone, and add no negative padding (a crop); the Conv must take
//! explicit pads (no `auto_pad`). A Pad with other users stays for them.

use kiln_ir::op::{AutoPad, Conv, PadMode};
use kiln_ir::{Graph, NodeId, Op, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(node) = graph.try_node(id) else { continue };
        let Op::Conv(conv) = &node.op else { continue };
        let Some((x, pads)) = absorbable(graph, id, conv) else { continue };
        let mut window = conv.window.clone();
        let spatial = pads.len() / 2;
        if window.pads.is_empty() {
            window.pads = vec![0; 2 * spatial];
        }
        for (p, add) in window.pads.iter_mut().zip(&pads) {
            *p += add;
        }
        let op = Op::Conv(Conv { window, group: conv.group });
        let name = graph.unique_name(&format!("{}/padded", node.name));
        let mut operands = graph.operands(id);
        operands[0] = Some(x);
        let new = graph.add_node(&name, op, &operands)?;
        graph.replace_uses(ValueId::from(id), ValueId::from(new))?;
        changed = true;
    }
    if changed {
        super::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// The Pad's input and its spatial pads (all begins, then all ends) when the Conv can take them.
fn absorbable(graph: &Graph, id: NodeId, conv: &Conv) -> Option<(ValueId, Vec<usize>)> {
    if conv.window.auto_pad != AutoPad::NotSet {
        return None;
    }
    let padded = graph.operands(id).first().copied().flatten()?;
    let pad_node = graph.try_node(padded.node)?;
    if pad_node.op != (Op::Pad { mode: PadMode::Constant }) || padded.output != 0 {
        return None;
    }
    let operands = graph.operands(padded.node);
    let operand = |i: usize| operands.get(i).copied().flatten();
    let x = operand(0)?;
    let rank = graph.value_type(x).rank();
    if rank < 3 {
        return None;
    }
    // A zero value.
    if let Some(v) = operand(2) {
        let t = graph.constant_value(v)?;
        if t.len() != 1 || t.to_f64s()[0] != 0.0 {
            return None;
        }
    }
    // Pads per axis of `axes` (all axes when absent), as [begins..., ends...].
    let given = graph.constant_value(operand(1)?)?.to_i64s();
    let axes: Vec<usize> = match operand(3) {
        None => (0..rank).collect(),
        Some(a) => graph
            .constant_value(a)?
            .to_i64s()
            .iter()
            .map(|&a| kiln_ir::normalize_axis(a, rank))
            .collect::<Option<_>>()?,
    };
    if given.len() != 2 * axes.len() {
        return None;
    }
    let mut full = vec![0i64; 2 * rank];
    for (i, &a) in axes.iter().enumerate() {
        full[a] = given[i];
        full[rank + a] = given[axes.len() + i];
    }
    if full.iter().any(|&p| p < 0)
        || full[0] != 0
        || full[1] != 0
        || full[rank] != 0
        || full[rank + 1] != 0
    {
        return None;
    }
    let spatial = rank - 2;
    let pads: Vec<usize> =
        full[2..rank].iter().chain(&full[rank + 2..]).map(|&p| p as usize).collect();
    (pads.len() == 2 * spatial).then_some((x, pads))
}
