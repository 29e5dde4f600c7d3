//! Graph inputs and outputs that are sequences or optionals, as compiled code sees them: tensors.
//!
//! `bind` gives each sequence or optional input the tensors of the value a run passes (a
//! sequence `x` of n tensors becomes the inputs `x[0]` ... `x[n-1]` and a `SequenceConstruct` of
//! them; an optional `x` becomes the input `x` wrapped, or an empty `Optional`), so the compiled
//! program is specialised to that many elements. The `sequences` pass turns outputs into tensors
//! the same way (`passes::sequences::flat_outputs`), and `regroup` puts them back together.

use std::collections::HashMap;

use kiln_ir::op::{OptionalOp, SequenceOp};
use kiln_ir::{Graph, Kind, Op, Tensor, Value, ValueId};

use crate::{CompileError, Result};

/// `graph` with its sequence and optional inputs replaced by tensor inputs, and the tensors to
/// pass them, in the new graph's input order. A graph of tensor inputs comes back as it is.
pub fn bind(graph: &Graph, values: &[Value]) -> Result<(Graph, Vec<Tensor>)> {
    if values.len() != graph.inputs().len() {
        return Err(CompileError::Usage(format!(
            "the model takes {} inputs, {} given",
            graph.inputs().len(),
            values.len()
        )));
    }
    let mut g = graph.clone();
    let mut given: HashMap<String, Tensor> = HashMap::new();
    for (&id, value) in graph.inputs().iter().zip(values) {
        let node = graph.node(id);
        let (name, ty) = (node.name.clone(), node.outputs[0].clone());
        if ty.kind.is_tensor() {
            let t = value
                .as_tensor()
                .map_err(|e| CompileError::Usage(format!("input `{name}`: {e}")))?
                .clone();
            given.insert(name, t);
            continue;
        }
        if !value.fits(&ty) {
            return Err(CompileError::Usage(format!(
                "input `{name}` is {ty}, got {}",
                value.describe()
            )));
        }
        // The old input keeps its place until nothing reads it.
        let old = g.node_by_name(&name).expect("the clone has the input");
        g.rename_node(old, &g.unique_name(&format!("{name}.unbound")))?;
        let elements = |g: &mut Graph,
                        given: &mut HashMap<String, Tensor>,
                        items: &[Tensor]|
         -> Result<ValueId> {
            let mut vs = Vec::with_capacity(items.len());
            for (i, t) in items.iter().enumerate() {
                let n = format!("{name}[{i}]");
                vs.push(g.add_input(&n, t.ty())?);
                given.insert(n, t.clone());
            }
            let op = if items.is_empty() {
                Op::Sequence(SequenceOp::Empty { dtype: ty.dtype })
            } else {
                Op::Sequence(SequenceOp::Construct)
            };
            let operands: Vec<Option<ValueId>> = vs.into_iter().map(Some).collect();
            Ok(g.add_node(&g.unique_name(&format!("{name}.list")), op, &operands)?.into())
        };
        let v = match value {
            Value::Sequence(items) => elements(&mut g, &mut given, items)?,
            Value::Optional(held) => {
                let sequence = matches!(ty.kind, Kind::Optional { sequence: true, .. });
                let inner = match held.as_deref() {
                    None => None,
                    Some(Value::Tensor(t)) => {
                        given.insert(name.clone(), t.clone());
                        Some(g.add_input(&name, t.ty())?)
                    }
                    Some(Value::Sequence(items)) => Some(elements(&mut g, &mut given, items)?),
                    Some(Value::Optional(_)) => {
                        return Err(CompileError::Usage(format!(
                            "input `{name}`: an optional of an optional"
                        )))
                    }
                };
                let op = Op::Optional(OptionalOp::Wrap {
                    dtype: inner.is_none().then_some(ty.dtype),
                    sequence,
                });
                g.add_node(&g.unique_name(&format!("{name}.opt")), op, &[inner])?.into()
            }
            Value::Tensor(_) => {
                return Err(CompileError::Usage(format!("input `{name}` is {ty}, got a tensor")))
            }
        };
        g.replace_uses(old.into(), v)?;
        g.remove_node(old)?;
    }
    g.reinfer()?;
    let tensors = g.inputs().iter().map(|&id| given[&g.node(id).name].clone()).collect();
    Ok((g, tensors))
}

/// The original graph's outputs from the compiled program's (named as
/// `passes::sequences::flat_outputs` names them).
pub fn regroup(graph: &Graph, names: &[String], tensors: Vec<Tensor>) -> Result<Vec<Value>> {
    let mut by_name: HashMap<&str, Tensor> =
        names.iter().map(String::as_str).zip(tensors).collect();
    let mut take = |n: &str| by_name.remove(n);
    let mut out = Vec::with_capacity(graph.outputs().len());
    for (name, v) in graph.outputs() {
        let ty = graph.value_type(*v);
        // The program was compiled from this graph, which names every output it gives.
        let missing =
            || CompileError::Internal(format!("the compiled program gives no output for `{name}`"));
        let sequence = |take: &mut dyn FnMut(&str) -> Option<Tensor>| {
            let mut items = Vec::new();
            while let Some(t) = take(&format!("{name}[{}]", items.len())) {
                items.push(t);
            }
            Value::Sequence(items)
        };
        out.push(match ty.kind {
            Kind::Tensor => Value::Tensor(take(name).ok_or_else(missing)?),
            Kind::Sequence { .. } => sequence(&mut take),
            Kind::Optional { sequence: is_seq, .. } => {
                let has = take(&format!("{name}?")).ok_or_else(missing)?;
                if has.to_f64s().first().copied().unwrap_or(0.0) == 0.0 {
                    Value::Optional(None)
                } else if is_seq {
                    Value::Optional(Some(Box::new(sequence(&mut take))))
                } else {
                    Value::Optional(Some(Box::new(Value::Tensor(take(name).ok_or_else(missing)?))))
                }
            }
        });
    }
    Ok(out)
}
