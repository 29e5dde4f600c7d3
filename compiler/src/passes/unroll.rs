//! Loop unrolling: a Loop that provably runs a small constant number of steps (a constant trip
//! count, a condition that starts true and that the body passes on) becomes its body inlined
//! once per step, the step number a constant in each copy; so does a Scan of a small static
//! length whose body's shapes depend on the values it captures, each copy reading its step's
//! slices (a Gather at the step), its stacked results joined by Concat. Every copy then has static shapes
//! even where the body's depend on the step (a Slice at the step, as exporters write Range and
//! cumulative loops), and no host step runs the body. Larger or data-dependent loops stay Loops
//! for the host to run (see `control.rs`).

use kiln_ir::{normalize_axis, DType, Graph, NodeId, Op, Shape, Tensor, TensorType, ValueId};

use crate::Result;

/// At most this many body nodes in all once unrolled: a few small loops, not a model's worth.
const MAX_UNROLLED_NODES: usize = 512;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let node = graph.node(id).clone();
        if let Op::Scan(s) = &node.op {
            changed |= unroll_scan(graph, id, &node.name, s)?;
            continue;
        }
        let Op::Loop(l) = &node.op else { continue };
        let operands = graph.operands(id);
        let c = l.captures;
        let value = |i: usize| {
            operands
                .get(i)
                .copied()
                .flatten()
                .map(|v| graph.constant_value(v).and_then(|t| t.to_f64s().first().copied()))
        };
        // A trip count that is a constant, and a condition absent or a constant true.
        let Some(Some(trip)) = value(c) else { continue };
        let starts = match value(c + 1) {
            None => true,
            Some(v) => v.is_some_and(|x| x != 0.0),
        };
        if !starts || !l.condition_stays_true() {
            continue;
        }
        let body = &l.body.0;
        let steps = trip.max(0.0) as usize;
        if steps.saturating_mul(body.node_count().max(1)) > MAX_UNROLLED_NODES {
            continue;
        }
        let states = l.states(operands.len());
        let stacked_types: Vec<_> =
            body.outputs()[1 + states..].iter().map(|(_, v)| body.value_type(*v).clone()).collect();
        // A loop of no step stacks nothing: each stacked result is empty, which needs the slice's
        // static shape.
        if steps == 0 && stacked_types.iter().any(|t| !t.shape.is_fixed()) {
            continue;
        }
        let declared =
            |i: usize| body.node(body.inputs()[i]).outputs[0].shape.as_fixed().unwrap_or_default();
        let (step_dims, cond_dims) = (declared(c), declared(c + 1));
        let always = graph.add_constant(
            &graph.unique_name(&format!("{}.cond", node.name)),
            Tensor::from_f64s(DType::Bool, &cond_dims, &[1.0])?,
        )?;
        // The captured values, the condition (true at every step), a slot for the step number
        // and the state.
        let mut args: Vec<ValueId> = Vec::with_capacity(operands.len().max(c + 2));
        for i in 0..operands.len().max(c + 2) {
            args.push(match operands.get(i).copied().flatten() {
                _ if i == c || i == c + 1 => always,
                Some(v) => v,
                // Inference requires every state operand.
                None => {
                    return Err(crate::CompileError::Internal(format!(
                        "Loop `{}`: operand {i} is missing",
                        node.name
                    )))
                }
            });
        }
        let mut slices: Vec<Vec<ValueId>> = vec![Vec::with_capacity(steps); stacked_types.len()];
        for step in 0..steps {
            let n = graph.add_constant(
                &graph.unique_name(&format!("{}.step{step}", node.name)),
                Tensor::from_f64s(DType::I64, &step_dims, &[step as f64])?,
            )?;
            args[c] = n;
            let outs = graph.inline(body, &args, &format!("{}.step{step}", node.name))?;
            args.splice(c + 2.., outs[1..=states].iter().copied());
            for (k, &v) in outs[1 + states..].iter().enumerate() {
                slices[k].push(v);
            }
        }
        let mut results: Vec<ValueId> = args[c + 2..].to_vec();
        for (k, (parts, ty)) in slices.into_iter().zip(&stacked_types).enumerate() {
            let name = graph.unique_name(&format!("{}.stacked{k}", node.name));
            let stacked = if parts.is_empty() {
                let mut dims = vec![0];
                dims.extend(ty.shape.as_fixed().unwrap_or_default());
                graph.add_constant(&name, Tensor::zeros(ty.dtype, &dims))?
            } else {
                let axes = graph.add_constant(
                    &graph.unique_name(&format!("{name}.axes")),
                    Tensor::vector(&[0i64]),
                )?;
                let rows: Vec<Option<ValueId>> = parts
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        graph
                            .add_node(
                                &graph.unique_name(&format!("{name}.row{i}")),
                                Op::Unsqueeze,
                                &[Some(p), Some(axes)],
                            )
                            .map(|n| Some(n.into()))
                    })
                    .collect::<std::result::Result<_, _>>()?;
                graph.add_node(&name, Op::Concat { axis: 0 }, &rows)?.into()
            };
            results.push(stacked);
        }
        for (k, v) in results.into_iter().enumerate() {
            graph.replace_uses(ValueId::new(id, k), v)?;
        }
        graph.remove_node(id)?;
        changed = true;
    }
    if changed {
        // The copies' step numbers are constants: fold what they decide (slice bounds, shapes).
        graph.reinfer()?;
        super::fold::run(graph)?;
    }
    Ok(changed)
}

/// Unrolls one Scan whose body has shapes it computes from values (the axes of an Unsqueeze it
/// captures, as ONNX's function bodies write them), whose scanned inputs have a static length of
/// at least one step and whose copies stay under [`MAX_UNROLLED_NODES`]; whether it did. The
/// copies see the captured values as they are outside (a constant stays one), so those shapes
/// become static.
fn unroll_scan(graph: &mut Graph, id: NodeId, name: &str, s: &kiln_ir::op::Scan) -> Result<bool> {
    let operands = graph.operands(id);
    let Some(operands) = operands.into_iter().collect::<Option<Vec<ValueId>>>() else {
        return Ok(false);
    };
    let states = s.states(operands.len());
    let first_scanned = s.captures + states;
    // Each scanned input's axis and direction, and the common length.
    let mut scanned = Vec::with_capacity(s.scan_inputs);
    let mut length = None;
    for (i, &v) in operands[first_scanned..].iter().enumerate() {
        let ty = graph.value_type(v);
        let (axis, reverse) = s.input(i);
        let Some(axis) = normalize_axis(axis, ty.rank()) else { return Ok(false) };
        let Some(l) = ty.shape.dims()[axis].fixed() else { return Ok(false) };
        if length.is_some_and(|m| m != l) {
            return Ok(false);
        }
        length = Some(l);
        scanned.push((v, axis, reverse));
    }
    let body = &s.body.0;
    // A body of static shapes (once typed by the operands) compiles as one program the host runs
    // per step (`control.rs`); only one whose shapes follow from the values it captures needs
    // the copies.
    if static_once_typed(graph, body, &operands[..first_scanned], &scanned) {
        return Ok(false);
    }
    let Some(steps) = length.filter(|&l| l > 0) else { return Ok(false) };
    if steps.saturating_mul(body.node_count().max(1)) > MAX_UNROLLED_NODES {
        return Ok(false);
    }
    let stacked = body.outputs().len().saturating_sub(states);
    let mut args: Vec<ValueId> = operands[..first_scanned].to_vec();
    let mut parts: Vec<Vec<ValueId>> = vec![Vec::with_capacity(steps); stacked];
    for step in 0..steps {
        let prefix = format!("{name}.step{step}");
        args.truncate(first_scanned);
        for (i, &(v, axis, reverse)) in scanned.iter().enumerate() {
            let at = if reverse { steps - 1 - step } else { step };
            let index = graph.add_constant(
                &graph.unique_name(&format!("{prefix}.at{i}")),
                Tensor::scalar(at as i64),
            )?;
            let slice = graph.add_node(
                &graph.unique_name(&format!("{prefix}.slice{i}")),
                Op::Gather { axis: axis as i64 },
                &[Some(v), Some(index)],
            )?;
            args.push(slice.into());
        }
        let outs = graph.inline(body, &args, &prefix)?;
        args.splice(s.captures..first_scanned, outs[..states].iter().copied());
        for (k, &v) in outs[states..].iter().enumerate() {
            parts[k].push(v);
        }
    }
    let mut results: Vec<ValueId> = args[s.captures..first_scanned].to_vec();
    for (k, mut rows) in parts.into_iter().enumerate() {
        let (axis, reverse) = s.output(k);
        let rank = graph.value_type(rows[0]).rank();
        let Some(axis) = normalize_axis(axis, rank + 1) else {
            return Err(crate::CompileError::Internal(format!(
                "Scan `{name}`: stacking axis {axis} is outside rank {}",
                rank + 1
            )));
        };
        if reverse {
            rows.reverse();
        }
        let stacked_name = graph.unique_name(&format!("{name}.stacked{k}"));
        let axes = graph.add_constant(
            &graph.unique_name(&format!("{stacked_name}.axes")),
            Tensor::vector(&[axis as i64]),
        )?;
        let rows: Vec<Option<ValueId>> = rows
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                graph
                    .add_node(
                        &graph.unique_name(&format!("{stacked_name}.row{i}")),
                        Op::Unsqueeze,
                        &[Some(p), Some(axes)],
                    )
                    .map(|n| Some(n.into()))
            })
            .collect::<std::result::Result<_, _>>()?;
        results
            .push(graph.add_node(&stacked_name, Op::Concat { axis: axis as i64 }, &rows)?.into());
    }
    let used = graph.node(id).outputs.len();
    for (k, v) in results.into_iter().enumerate().take(used) {
        graph.replace_uses(ValueId::new(id, k), v)?;
    }
    graph.remove_node(id)?;
    Ok(true)
}

/// Whether every shape in a Scan's `body` is static once its inputs take the types of the
/// captured and state operands `carried` and of one slice of each `scanned` operand. A body that
/// does not type-check so is left to the Scan's own checks (true: nothing to unroll).
fn static_once_typed(
    graph: &Graph,
    body: &Graph,
    carried: &[ValueId],
    scanned: &[(ValueId, usize, bool)],
) -> bool {
    let mut types: Vec<TensorType> = carried.iter().map(|&v| graph.value_type(v).clone()).collect();
    for &(v, axis, _) in scanned {
        let ty = graph.value_type(v);
        let mut dims = ty.shape.dims().to_vec();
        dims.remove(axis);
        types.push(TensorType::new(ty.dtype, Shape(dims)));
    }
    let mut typed = body.clone();
    for (i, ty) in types.into_iter().enumerate() {
        if typed.set_input_type(i, ty).is_err() {
            return true;
        }
    }
    let fixed = typed.nodes().all(|(_, n)| n.outputs.iter().all(|t| t.shape.is_fixed()));
    fixed
}
