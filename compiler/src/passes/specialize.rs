//! Specialisation: binds symbolic input dimensions to concrete sizes, re-infers every type, and
//! folds what became constant, so codegen sees only static shapes.

use std::collections::HashMap;

use kiln_ir::{Dim, Graph, NodeId, Op, Shape, Tensor, TensorType, ValueId};

use crate::{CompileError, Result};

/// Gives input `name` the concrete `dims` (from `--input-shape` or the tensors a run gets).
/// Every input must end up fully known.
pub fn specialize(graph: &mut Graph, shapes: &HashMap<String, Vec<usize>>) -> Result<()> {
    let names: Vec<String> = graph.inputs().iter().map(|&id| graph.node(id).name.clone()).collect();
    if let Some(unknown) = shapes.keys().find(|k| !names.contains(k)) {
        return Err(CompileError::Usage(format!(
            "--input-shape names `{unknown}`, but the model's inputs are: {}",
            names.join(", ")
        )));
    }
    let mut bound: HashMap<String, usize> = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let declared = graph.node(graph.inputs()[i]).outputs[0].clone();
        let dims: Vec<usize> = match shapes.get(name) {
            Some(d) => {
                check_shape(name, &declared, d, &mut bound)?;
                d.clone()
            }
            None => match declared.shape.as_fixed() {
                Some(d) => d,
                None => {
                    // Symbols already bound by an earlier input carry over.
                    let d: Option<Vec<usize>> = declared
                        .shape
                        .dims()
                        .iter()
                        .map(|d| match d {
                            Dim::Fixed(n) => Some(*n),
                            Dim::Sym(s) => bound.get(&**s).copied(),
                        })
                        .collect();
                    d.ok_or_else(|| {
                        CompileError::Usage(format!(
                            "input `{name}` has the dynamic shape {declared}; give its size with --input-shape {name}=D0,D1,... (or, to compile one program for every size of a symbol up to N, --max-size SYMBOL=N)"
                        ))
                    })?
                }
            },
        };
        if declared.shape.as_fixed().as_deref() != Some(dims.as_slice()) {
            graph.set_input_type(i, TensorType::new(declared.dtype, Shape::fixed(&dims)))?;
        }
    }
    Ok(())
}

fn check_shape(
    name: &str,
    declared: &TensorType,
    dims: &[usize],
    bound: &mut HashMap<String, usize>,
) -> Result<()> {
    let bad = || {
        CompileError::Usage(format!(
            "input `{name}` is {declared}, which the shape {dims:?} does not fit"
        ))
    };
    if dims.len() != declared.rank() {
        return Err(bad());
    }
    for (d, &n) in declared.shape.dims().iter().zip(dims) {
        match d {
            Dim::Fixed(m) if *m != n => return Err(bad()),
            Dim::Sym(s) => {
                if let Some(&prev) = bound.get(&**s) {
                    if prev != n {
                        return Err(CompileError::Usage(format!(
                            "`{s}` is {prev} in an earlier input but {n} in `{name}`"
                        )));
                    }
                }
                bound.insert(s.to_string(), n);
            }
            _ => {}
        }
    }
    Ok(())
}

/// The graph inputs (by index) whose values reach a shape-deciding operand: those
/// `Op::shape_operands` names, the condition of an If whose branches give results of different
/// shapes, and the trip count and condition of a Loop whose results are not all sized.
pub fn shape_inputs(graph: &Graph) -> Vec<usize> {
    let mut seeds: Vec<ValueId> = Vec::new();
    for (id, node) in graph.nodes() {
        let operands = graph.operands(id);
        // Sequences and optionals are resolved when compiling: whatever decides their content
        // (a position, a split, a branch or a loop that gives one) must be known.
        let gives_sequence = node.outputs.iter().any(|t| !t.kind.is_tensor());
        if matches!(node.op, Op::If { .. })
            && node.outputs.iter().any(|t| !t.shape.is_fixed() || !t.kind.is_tensor())
        {
            seeds.extend(operands.first().copied().flatten());
        }
        // A Loop's step count sizes its stacked results: its trip count and first condition.
        if let Op::Loop(l) = &node.op {
            if node.outputs.iter().any(|t| !t.shape.is_fixed()) || gives_sequence {
                seeds.extend(operands.iter().skip(l.captures).take(2).copied().flatten());
            }
        }
        if let Op::Sequence(s) = &node.op {
            if let Some(Some(v)) = s.position_operand().and_then(|i| operands.get(i)) {
                seeds.push(*v);
            }
        }
        for &i in node.op.shape_operands() {
            if let Some(Some(v)) = operands.get(i) {
                seeds.push(*v);
            }
        }
    }
    // Walk back to the inputs those operands come from.
    let mut seen: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    let mut stack: Vec<NodeId> = seeds.iter().map(|v| v.node).collect();
    while let Some(n) = stack.pop() {
        if seen.insert(n) {
            stack.extend(graph.operands(n).into_iter().flatten().map(|v| v.node));
        }
    }
    graph.inputs().iter().enumerate().filter(|(_, id)| seen.contains(id)).map(|(i, _)| i).collect()
}

/// Whether some value's type still has a symbol, or is a sequence or an optional (whose content
/// the values of some inputs may decide).
pub fn has_dynamic_shapes(graph: &Graph) -> bool {
    graph.nodes().any(|(_, n)| n.outputs.iter().any(|t| !t.shape.is_fixed() || !t.kind.is_tensor()))
}

/// Turns the named inputs into constants with the given values (they leave the interface).
pub fn bind_values(graph: &mut Graph, values: &[(String, Tensor)]) -> Result<()> {
    for (name, value) in values {
        let Some(i) = graph.inputs().iter().position(|&id| &graph.node(id).name == name) else {
            continue;
        };
        let id = graph.inputs()[i];
        let declared = graph.node(id).outputs[0].clone();
        if declared.dtype != value.dtype() || declared.rank() != value.rank() {
            return Err(CompileError::Usage(format!(
                "input `{name}` is {declared}, got {}",
                value.ty()
            )));
        }
        let c = graph.add_constant(&graph.unique_name(&format!("{name}.value")), value.clone())?;
        graph.replace_uses(id.into(), c)?;
        graph.remove_node(id)?;
    }
    graph.reinfer()?;
    Ok(())
}
