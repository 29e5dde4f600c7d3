//! Constant folding: every node whose results are known before run time becomes constants
//! (kiln_ir::fold decides), and nodes nothing uses any more are removed.

use kiln_ir::{Graph, Op, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    // Folding a shape computation can make a later node's shape known, and so foldable: repeat
    // until nothing changes, re-inferring types in between.
    while fold_once(graph)? {
        graph.reinfer()?;
        changed = true;
    }
    changed |= remove_dead(graph)?;
    Ok(changed)
}

fn fold_once(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let node = graph.node(id).clone();
        if matches!(node.op, Op::Input | Op::Constant(_)) {
            continue;
        }
        let operands = graph.operands(id);
        let Some(results) = kiln_ir::fold::fold(graph, &node.op, &operands, node.outputs.len())
        else {
            continue;
        };
        for (i, t) in results.into_iter().enumerate() {
            let name = graph.unique_name(&format!(
                "{}.folded{}",
                node.name,
                if i == 0 { String::new() } else { format!("{i}") }
            ));
            let c = graph.add_constant(&name, t)?;
            graph.replace_uses(ValueId::new(id, i), c)?;
        }
        changed = true;
    }
    remove_dead(graph)?;
    Ok(changed)
}

/// Removes nodes whose results nobody reads (graph inputs stay: they are the interface).
pub fn remove_dead(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    loop {
        let dead: Vec<_> = graph
            .nodes()
            .filter(|(id, n)| {
                !matches!(n.op, Op::Input)
                    && (0..n.outputs.len()).all(|i| graph.users(ValueId::new(*id, i)).is_empty())
                    && !graph.outputs().iter().any(|(_, v)| v.node == *id)
            })
            .map(|(id, _)| id)
            .collect();
        if dead.is_empty() {
            return Ok(changed);
        }
        for id in dead {
            graph.remove_node(id)?;
        }
        changed = true;
    }
}
