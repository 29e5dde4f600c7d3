//! Sequence and optional resolution: compiled code holds tensors only, so every sequence whose
//! length and positions are known when compiling becomes the tensors it holds, and every optional
//! whose presence is known becomes its value or nothing.
//!
//! The canonical form is `SequenceConstruct(x...)` (or `SequenceEmpty`): each sweep rewrites the
//! ops that make a sequence from a known one (Insert, Erase, SplitToSequence, SequenceMap, an
//! Optional's element) into that form, and the ops that read one (SequenceAt, SequenceLength,
//! ConcatFromSequence, OptionalHasElement, OptionalGetElement) into the tensors they give.
//! Folding, unrolling and inlining of decided Ifs run in between until nothing changes (a Loop
//! that builds a list must unroll before its list is known). Graph outputs that are sequences
//! or optionals become tensor outputs (see [`flat_outputs`]); what is still unresolved is named
//! by [`check_resolved`].

use std::collections::HashMap;

use kiln_ir::op::{OpFamily, OptionalOp, SequenceOp};
use kiln_ir::{DType, Graph, Kind, NodeId, Op, Tensor, ValueId};

use crate::{CompileError, Result};

pub fn run(graph: &mut Graph) -> Result<bool> {
    if !uses_sequences(graph) {
        return Ok(false);
    }
    let mut changed = false;
    loop {
        let mut step = resolve_once(graph)?;
        if step {
            graph.reinfer()?;
        }
        step |= super::fold::run(graph)?;
        step |= super::unroll::run(graph)?;
        step |= inline_decided_ifs(graph)?;
        if !step {
            break;
        }
        changed = true;
    }
    changed |= flatten_outputs(graph)?;
    if changed {
        graph.reinfer()?;
        super::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// Whether any value of `graph` is a sequence or an optional.
pub fn uses_sequences(graph: &Graph) -> bool {
    graph.nodes().any(|(_, n)| {
        n.op.family() == OpFamily::Collection || n.outputs.iter().any(|t| !t.kind.is_tensor())
    })
}

/// What is known of a sequence or optional value: a sequence's elements, or an optional's
/// content (`Some(None)`: empty).
#[derive(Default)]
struct Known {
    lists: HashMap<ValueId, Vec<ValueId>>,
    optionals: HashMap<ValueId, Option<ValueId>>,
}

fn constant_position(graph: &Graph, v: Option<ValueId>) -> Option<Option<i64>> {
    match v {
        None => Some(None),
        Some(v) => graph.constant_value(v).and_then(|t| t.to_i64s().first().copied()).map(Some),
    }
}

/// A position counted from the end when negative, checked against `len` (`insert`: the end too).
fn index(node: &str, p: i64, len: usize, insert: bool) -> Result<usize> {
    let n = len as i64;
    let hi = if insert { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(CompileError::Usage(format!(
            "node `{node}`: position {p} is outside a sequence of {len}"
        )));
    }
    Ok(if p < 0 { p + n } else { p } as usize)
}

/// One sweep in topological order; whether it rewrote anything.
fn resolve_once(graph: &mut Graph) -> Result<bool> {
    let mut known = Known::default();
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(node) = graph.try_node(id).cloned() else { continue };
        let operands = graph.operands(id);
        let out = ValueId::from(id);
        let list = |known: &Known, i: usize| {
            operands.get(i).copied().flatten().and_then(|v| known.lists.get(&v).cloned())
        };
        match &node.op {
            Op::Sequence(s) => match s {
                SequenceOp::Empty { .. } => {
                    known.lists.insert(out, Vec::new());
                }
                SequenceOp::Construct => {
                    known.lists.insert(out, operands.iter().copied().flatten().collect());
                }
                SequenceOp::Insert | SequenceOp::Erase => {
                    let (Some(mut items), Some(pos)) = (
                        list(&known, 0),
                        constant_position(
                            graph,
                            operands.get(s.position_operand().unwrap_or(0)).copied().flatten(),
                        ),
                    ) else {
                        continue;
                    };
                    if matches!(s, SequenceOp::Insert) {
                        // The op's arity requires the value.
                        let x = operands[1].ok_or_else(|| {
                            CompileError::Internal(format!(
                                "node `{}`: SequenceInsert without a value",
                                node.name
                            ))
                        })?;
                        let at = match pos {
                            Some(p) => index(&node.name, p, items.len(), true)?,
                            None => items.len(),
                        };
                        items.insert(at, x);
                    } else {
                        if items.is_empty() {
                            return Err(CompileError::Usage(format!(
                                "node `{}`: erasing from an empty sequence",
                                node.name
                            )));
                        }
                        let at = match pos {
                            Some(p) => index(&node.name, p, items.len(), false)?,
                            None => items.len() - 1,
                        };
                        items.remove(at);
                    }
                    let v = construct(graph, &node.name, node.outputs[0].dtype, &items)?;
                    graph.replace_uses(out, v)?;
                    known.lists.insert(v, items);
                    changed = true;
                }
                SequenceOp::At => {
                    let (Some(items), Some(Some(p))) = (
                        list(&known, 0),
                        constant_position(graph, operands.get(1).copied().flatten()),
                    ) else {
                        continue;
                    };
                    let at = index(&node.name, p, items.len(), false)?;
                    graph.replace_uses(out, items[at])?;
                    changed = true;
                }
                SequenceOp::Length => {
                    let Some(items) = list(&known, 0) else { continue };
                    let c = graph.add_constant(
                        &graph.unique_name(&format!("{}.len", node.name)),
                        Tensor::scalar(items.len() as i64),
                    )?;
                    graph.replace_uses(out, c)?;
                    changed = true;
                }
                SequenceOp::Concat { axis, new_axis } => {
                    let Some(items) = list(&known, 0) else { continue };
                    if items.is_empty() {
                        return Err(CompileError::Usage(format!(
                            "node `{}`: joining an empty sequence",
                            node.name
                        )));
                    }
                    let mut parts = items.clone();
                    if *new_axis {
                        let rank = graph.value_type(items[0]).rank() as i64 + 1;
                        let a = if *axis < 0 { axis + rank } else { *axis };
                        let axes = graph.add_constant(
                            &graph.unique_name(&format!("{}.axes", node.name)),
                            Tensor::vector(&[a]),
                        )?;
                        for (k, p) in parts.iter_mut().enumerate() {
                            let name = graph.unique_name(&format!("{}.unsqueeze{k}", node.name));
                            *p = graph
                                .add_node(&name, Op::Unsqueeze, &[Some(*p), Some(axes)])?
                                .into();
                        }
                    }
                    let name = graph.unique_name(&format!("{}.concat", node.name));
                    let operands: Vec<Option<ValueId>> = parts.into_iter().map(Some).collect();
                    let joined = graph.add_node(&name, Op::Concat { axis: *axis }, &operands)?;
                    graph.replace_uses(out, joined.into())?;
                    changed = true;
                }
                SequenceOp::Split { axis, keepdims } => {
                    let Some(items) = split(graph, id, &node.name, *axis, *keepdims)? else {
                        continue;
                    };
                    let v = construct(graph, &node.name, node.outputs[0].dtype, &items)?;
                    graph.replace_uses(out, v)?;
                    known.lists.insert(v, items);
                    changed = true;
                }
                SequenceOp::Map { body, captures } => {
                    // Every sequence operand must be known, and as long as the first.
                    let mut args: Vec<Result<ValueId, Vec<ValueId>>> = Vec::new();
                    let mut len = None;
                    for (k, o) in operands.iter().enumerate() {
                        let Some(v) = *o else { continue };
                        if k >= *captures && !graph.value_type(v).kind.is_tensor() {
                            let Some(items) = known.lists.get(&v).cloned() else { break };
                            len.get_or_insert(items.len());
                            args.push(Err(items));
                        } else {
                            args.push(Ok(v));
                        }
                    }
                    if args.len() != operands.len() {
                        continue;
                    }
                    let Some(len) = len else { continue };
                    if args.iter().any(|a| a.as_ref().err().is_some_and(|l| l.len() != len)) {
                        return Err(CompileError::Usage(format!(
                            "node `{}`: SequenceMap over sequences of different lengths",
                            node.name
                        )));
                    }
                    let mut results: Vec<Vec<ValueId>> =
                        vec![Vec::with_capacity(len); node.outputs.len()];
                    for i in 0..len {
                        let inputs: Vec<ValueId> =
                            args.iter().map(|a| a.clone().unwrap_or_else(|l| l[i])).collect();
                        let outs = graph.inline(&body.0, &inputs, &format!("{}.{i}", node.name))?;
                        for (k, v) in outs.into_iter().enumerate().take(results.len()) {
                            results[k].push(v);
                        }
                    }
                    for (k, items) in results.into_iter().enumerate() {
                        let v = construct(
                            graph,
                            &format!("{}.{k}", node.name),
                            node.outputs[k].dtype,
                            &items,
                        )?;
                        graph.replace_uses(ValueId::new(id, k), v)?;
                    }
                    changed = true;
                }
            },
            Op::Optional(o) => match o {
                OptionalOp::Wrap { .. } => {
                    known.optionals.insert(out, operands.first().copied().flatten());
                }
                OptionalOp::HasElement => {
                    let has = match operands.first().copied().flatten() {
                        None => Some(false),
                        Some(v) => match graph.value_type(v).kind {
                            Kind::Optional { .. } => known.optionals.get(&v).map(Option::is_some),
                            _ => Some(true),
                        },
                    };
                    let Some(has) = has else { continue };
                    let c = graph.add_constant(
                        &graph.unique_name(&format!("{}.has", node.name)),
                        Tensor::scalar(has),
                    )?;
                    graph.replace_uses(out, c)?;
                    changed = true;
                }
                OptionalOp::GetElement => {
                    let Some(v) = operands.first().copied().flatten() else { continue };
                    let held = match graph.value_type(v).kind {
                        Kind::Optional { .. } => match known.optionals.get(&v) {
                            None => continue,
                            Some(None) => {
                                return Err(CompileError::Usage(format!(
                                    "node `{}`: the optional is empty",
                                    node.name
                                )))
                            }
                            Some(Some(h)) => *h,
                        },
                        _ => v,
                    };
                    graph.replace_uses(out, held)?;
                    changed = true;
                }
            },
            // A sequence or optional passed through.
            Op::Identity if !node.outputs[0].kind.is_tensor() => {
                let Some(v) = operands.first().copied().flatten() else { continue };
                graph.replace_uses(out, v)?;
                changed = true;
            }
            _ => {}
        }
    }
    Ok(changed)
}

/// A `SequenceConstruct` of `items` (a `SequenceEmpty` when there are none).
fn construct(graph: &mut Graph, base: &str, dtype: DType, items: &[ValueId]) -> Result<ValueId> {
    let name = graph.unique_name(&format!("{base}.list"));
    let op = if items.is_empty() {
        Op::Sequence(SequenceOp::Empty { dtype })
    } else {
        Op::Sequence(SequenceOp::Construct)
    };
    let operands: Vec<Option<ValueId>> = items.iter().copied().map(Some).collect();
    Ok(graph.add_node(&name, op, &operands)?.into())
}

/// The most tensors a sequence that compiled code holds as separate values may have.
pub const MAX_SEQUENCE_TENSORS: usize = 1 << 12;

/// SplitToSequence as a Split (and a Squeeze per piece without `keepdims`), when the operand's
/// shape and the split are known.
fn split(
    graph: &mut Graph,
    id: NodeId,
    name: &str,
    axis: i64,
    keepdims: bool,
) -> Result<Option<Vec<ValueId>>> {
    let operands = graph.operands(id);
    let Some(x) = operands.first().copied().flatten() else { return Ok(None) };
    let Some(dims) = graph.value_type(x).shape.as_fixed() else { return Ok(None) };
    let Some(a) = kiln_ir::normalize_axis(axis, dims.len()) else { return Ok(None) };
    let d = dims[a];
    let given = match operands.get(1).copied().flatten() {
        None => None,
        Some(s) => match graph.constant_value(s) {
            None => return Ok(None),
            Some(t) => Some((t.rank(), t.to_i64s())),
        },
    };
    let lengths: Vec<i64> = match &given {
        None => vec![1; d],
        Some((0, v)) => {
            let n = v.first().copied().filter(|&n| n > 0).ok_or_else(|| {
                CompileError::Usage(format!("node `{name}`: a split length of {v:?}"))
            })? as usize;
            (0..d.div_ceil(n)).map(|i| n.min(d - i * n) as i64).collect()
        }
        Some((_, v)) => v.clone(),
    };
    if lengths.is_empty() {
        return Ok(Some(Vec::new()));
    }
    // Each piece becomes a value of its own (and its kernels): a split of f32[2^20] into 2^20
    // pieces did not finish compiling in 5 minutes.
    if lengths.len() > MAX_SEQUENCE_TENSORS {
        return Err(CompileError::RuntimeSequence {
            node: name.to_string(),
            op: "SplitToSequence",
            what: format!(
                "splits into {} tensors; compiled code holds a sequence as its tensors, at most {MAX_SEQUENCE_TENSORS} (the interpreter, --device ref, runs it)",
                lengths.len()
            ),
        });
    }
    let sizes = graph
        .add_constant(&graph.unique_name(&format!("{name}.sizes")), Tensor::vector(&lengths))?;
    let split_name = graph.unique_name(&format!("{name}.split"));
    let pieces = graph.add_node_with_outputs(
        &split_name,
        Op::Split { axis: a as i64, num_outputs: lengths.len() },
        &[Some(x), Some(sizes)],
        lengths.len(),
    )?;
    let mut items: Vec<ValueId> = (0..lengths.len()).map(|k| ValueId::new(pieces, k)).collect();
    if given.is_none() && !keepdims {
        let axes = graph.add_constant(
            &graph.unique_name(&format!("{name}.axes")),
            Tensor::vector(&[a as i64]),
        )?;
        for (k, v) in items.iter_mut().enumerate() {
            let n = graph.unique_name(&format!("{name}.squeeze{k}"));
            *v = graph.add_node(&n, Op::Squeeze, &[Some(*v), Some(axes)])?.into();
        }
    }
    Ok(Some(items))
}

/// An If whose condition is a constant and whose results include a sequence or an optional is
/// replaced by the branch it takes (`simplify` does the same for every If, later).
fn inline_decided_ifs(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(node) = graph.try_node(id).cloned() else { continue };
        let Op::If { then_branch, else_branch } = &node.op else { continue };
        let operands = graph.operands(id);
        let Some(cond) = operands
            .first()
            .copied()
            .flatten()
            .and_then(|c| graph.constant_value(c))
            .and_then(|t| t.to_f64s().first().copied())
        else {
            continue;
        };
        let branch = if cond != 0.0 { then_branch } else { else_branch };
        let Some(captured) = operands[1..].iter().copied().collect::<Option<Vec<ValueId>>>() else {
            continue;
        };
        let results = graph.inline(&branch.0, &captured, &node.name)?;
        for (k, v) in results.into_iter().enumerate() {
            graph.replace_uses(ValueId::new(id, k), v)?;
        }
        changed = true;
    }
    if changed {
        graph.reinfer()?;
    }
    Ok(changed)
}

/// How a graph output that is a sequence or an optional appears among compiled (tensor) outputs:
/// a sequence `y` of n tensors as `y[0]` ... `y[n-1]`; an optional `y` as the bool `y?` (whether
/// it holds a value) and, when it does, what it holds under `y` (or `y[i]`).
pub fn flat_outputs(name: &str, kind: Kind, holds: bool, elements: usize) -> Vec<String> {
    let seq = |n: usize| (0..n).map(|i| format!("{name}[{i}]")).collect::<Vec<_>>();
    match kind {
        Kind::Tensor => vec![name.to_string()],
        Kind::Sequence { .. } => seq(elements),
        Kind::Optional { sequence, .. } => {
            let mut out = vec![format!("{name}?")];
            if holds {
                out.extend(if sequence { seq(elements) } else { vec![name.to_string()] });
            }
            out
        }
    }
}

/// Replaces each sequence or optional graph output by the tensors it resolved to.
fn flatten_outputs(graph: &mut Graph) -> Result<bool> {
    let outputs = graph.outputs().to_vec();
    if outputs.iter().all(|(_, v)| graph.value_type(*v).kind.is_tensor()) {
        return Ok(false);
    }
    let items_of = |graph: &Graph, v: ValueId| -> Option<Vec<ValueId>> {
        let node = graph.node(v.node);
        match node.op {
            Op::Sequence(SequenceOp::Construct) => {
                Some(graph.operands(v.node).into_iter().flatten().collect())
            }
            Op::Sequence(SequenceOp::Empty { .. }) => Some(Vec::new()),
            _ => None,
        }
    };
    // All or nothing: an output not resolved yet may be once input values are bound, and
    // `check_resolved` names it if not.
    let mut plan: Vec<(String, Vec<ValueId>, Option<bool>)> = Vec::new();
    for (name, v) in &outputs {
        let ty = graph.value_type(*v);
        let entry = match ty.kind {
            Kind::Tensor => (vec![*v], None),
            Kind::Sequence { .. } => match items_of(graph, *v) {
                Some(items) => (items, None),
                None => return Ok(false),
            },
            Kind::Optional { sequence, .. } => {
                if !matches!(graph.node(v.node).op, Op::Optional(OptionalOp::Wrap { .. })) {
                    return Ok(false);
                }
                let held = graph.operands(v.node).first().copied().flatten();
                let items = match held {
                    None => Vec::new(),
                    Some(h) if sequence => match items_of(graph, h) {
                        Some(items) => items,
                        None => return Ok(false),
                    },
                    Some(h) => vec![h],
                };
                (items, Some(held.is_some()))
            }
        };
        plan.push((name.clone(), entry.0, entry.1));
    }
    let mut flat = Vec::new();
    for ((name, v), (_, items, holds)) in outputs.iter().zip(plan) {
        let kind = graph.value_type(*v).kind;
        let names = flat_outputs(name, kind, holds.unwrap_or(true), items.len());
        let mut names = names.into_iter();
        if let Some(has) = holds {
            let c = graph
                .add_constant(&graph.unique_name(&format!("{name}.has")), Tensor::scalar(has))?;
            flat.push((names.next().expect("an optional has its flag"), c));
        }
        flat.extend(names.zip(items));
    }
    graph.set_outputs(flat)?;
    Ok(true)
}

/// Fails naming the first sequence or optional op left: its length or a position depends on
/// values known only at run time.
pub fn check_resolved(graph: &Graph) -> Result<()> {
    for id in graph.topo_order()? {
        let node = graph.node(id);
        let left = node.op.family() == OpFamily::Collection
            || node.outputs.iter().any(|t| !t.kind.is_tensor());
        if left && matches!(node.op, Op::Input) {
            return Err(CompileError::RuntimeSequence {
                node: node.name.clone(),
                op: node.op.name(),
                what: format!(
                    "the input is {ty}; compiled programs take tensors, so compile with the value a run passes (`values::bind` makes a sequence `{n}` of k tensors the inputs `{n}[0]` ... `{n}[k-1]`)",
                    ty = node.outputs[0],
                    n = node.name
                ),
            });
        }
        if left {
            return Err(CompileError::RuntimeSequence {
                node: node.name.clone(),
                op: node.op.name(),
                what: "its sequence or optional is known only at run time (a position, a length or a loop that depends on data); kiln compiles sequences and optionals whose lengths and positions are known when compiling".into(),
            });
        }
    }
    Ok(())
}
