//! Simplification: Identity removal, an If whose condition is a constant replaced by the branch it
//! takes, chains of reshapes collapsed to one, transposes that cancel removed and chains of
//! transposes merged, then dead nodes removed.

use kiln_ir::{Graph, Op, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    // A taken branch may know its results' sizes better than the If's merged type did.
    let mut reinfer = false;
    for id in graph.topo_order()? {
        if graph.try_node(id).is_none() {
            continue;
        }
        let node = graph.node(id).clone();
        let operands = graph.operands(id);
        let x = operands.first().copied().flatten();
        match (&node.op, x) {
            // Identity (and the importer's Dropout) forwards its operand, unless it would make a
            // graph input or a constant a graph output directly: that copy stays a kernel.
            (Op::Identity, Some(x)) if !is_graph_output(graph, id) => {
                graph.replace_uses(ValueId::from(id), x)?;
                changed = true;
            }
            (Op::If { then_branch, else_branch }, Some(c)) if graph.constant_value(c).is_some() => {
                let taken = graph
                    .constant_value(c)
                    .and_then(|t| t.to_f64s().first().copied())
                    .is_some_and(|b| b != 0.0);
                let branch = if taken { then_branch } else { else_branch };
                let Some(captured) =
                    operands[1..].iter().copied().collect::<Option<Vec<ValueId>>>()
                else {
                    continue;
                };
                let results = graph.inline(&branch.0, &captured, &node.name)?;
                for (k, v) in results.into_iter().enumerate() {
                    graph.replace_uses(ValueId::new(id, k), v)?;
                }
                changed = true;
                reinfer = true;
            }
            // reshape(reshape(x)) = reshape(x) with the outer shape, when the outer shape is known.
            (op, Some(x)) if op.is_view() => {
                let producer = graph.node(x.node);
                let inner_is_view = producer.op.is_view();
                if let (true, Some(dims)) = (inner_is_view, node.outputs[0].shape.as_fixed()) {
                    let source = graph.operands(x.node)[0].expect("views have an operand");
                    if graph.value_type(source).shape.is_fixed() {
                        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                        let s = graph.add_constant(
                            &graph.unique_name(&format!("{}.shape", node.name)),
                            kiln_ir::Tensor::vector(&shape),
                        )?;
                        let name = graph.unique_name(&format!("{}.merged", node.name));
                        let merged = graph.add_node(
                            &name,
                            Op::Reshape { allowzero: true },
                            &[Some(source), Some(s)],
                        )?;
                        graph.replace_uses(ValueId::from(id), merged.into())?;
                        changed = true;
                    }
                }
            }
            (Op::Transpose { perm }, Some(x)) => {
                let rank = node.outputs[0].rank();
                let perm = if perm.is_empty() { (0..rank).rev().collect() } else { perm.clone() };
                if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    graph.replace_uses(ValueId::from(id), x)?;
                    changed = true;
                } else if let Op::Transpose { perm: inner } = &graph.node(x.node).op {
                    // transpose(transpose(x, p), q) = transpose(x, p∘q).
                    let inner =
                        if inner.is_empty() { (0..rank).rev().collect() } else { inner.clone() };
                    let composed: Vec<usize> = perm.iter().map(|&q| inner[q]).collect();
                    let source = graph.operands(x.node)[0].expect("transposes have an operand");
                    let name = graph.unique_name(&format!("{}.merged", node.name));
                    let merged = if composed.iter().enumerate().all(|(i, &p)| i == p) {
                        source
                    } else {
                        graph
                            .add_node(&name, Op::Transpose { perm: composed }, &[Some(source)])?
                            .into()
                    };
                    graph.replace_uses(ValueId::from(id), merged)?;
                    changed = true;
                }
            }
            _ => {}
        }
    }
    changed |= super::fold::remove_dead(graph)?;
    if reinfer {
        graph.reinfer()?;
    }
    Ok(changed)
}

fn is_graph_output(graph: &Graph, id: kiln_ir::NodeId) -> bool {
    graph.outputs().iter().any(|(_, v)| v.node == id)
}
