//! Run-time control flow: a graph with an If whose condition is computed at run time becomes
//! static programs and the host steps that run them (`Manifest::control`). A pure decision on the
//! optimised graph; the driver compiles each program as a model of its own.
//!
//! The graph is split at its first If (in topological order). `before` computes every value the
//! If and the nodes after it read; each branch is a program, the constants it captures bound into
//! it; `after` computes the rest from those values and the If's results. An If inside a branch or
//! in `after` is split in turn when that program is compiled. Both branches must give results of
//! one shape (else the result's shape depends on the condition, and specialisation on the
//! condition's value applies instead).

use std::collections::{HashMap, HashSet};
use std::fmt;

use kiln_ir::{Graph, NodeId, Op, TensorType, ValueId};
use kiln_runtime::artifact::Step;

use crate::passes::specialize;
use crate::{CompileError, Result};

/// What a program does in the split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Before,
    Then,
    Else,
    After,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Before => "before",
            Role::Then => "then",
            Role::Else => "else",
            Role::After => "after",
        }
    }
}

/// A graph split at a run-time If: the programs and the host steps over values that run them.
pub struct ControlSplit {
    /// The If split at.
    pub node: String,
    /// In the order the steps name them; every input fully typed.
    pub programs: Vec<(Role, Graph)>,
    /// Every host value's name and type: the graph's inputs first, in order.
    pub values: Vec<(String, TensorType)>,
    pub steps: Vec<Step>,
    /// The value of each graph output, in order.
    pub outputs: Vec<usize>,
}

/// Splits `graph` (optimised: static shapes, constant conditions already taken) at its first If;
/// `None` when it has none.
pub fn split(graph: &Graph) -> Result<Option<ControlSplit>> {
    let order = graph.topo_order()?;
    let Some(&at) = order.iter().find(|&&id| matches!(graph.node(id).op, Op::If { .. })) else { return Ok(None) };
    let Op::If { then_branch, else_branch } = &graph.node(at).op else { unreachable!("found as an If") };
    let if_name = graph.node(at).name.clone();
    let bug = |msg: String| CompileError::Internal(format!("splitting at If `{if_name}`: {msg}"));
    let is_constant = |v: ValueId| matches!(graph.node(v.node).op, Op::Constant(_));
    let is_input = |v: ValueId| matches!(graph.node(v.node).op, Op::Input);

    // The If and everything that reads its results, directly or not.
    let mut later: HashSet<NodeId> = HashSet::from([at]);
    for &id in &order {
        if graph.operands(id).into_iter().flatten().any(|v| later.contains(&v.node)) {
            later.insert(id);
        }
    }
    let mut values: Vec<(String, TensorType)> = Vec::new();
    let mut value_of: HashMap<ValueId, usize> = HashMap::new();
    for &id in graph.inputs() {
        value_of.insert(id.into(), values.len());
        values.push((graph.node(id).name.clone(), graph.node(id).outputs[0].clone()));
    }
    let mut programs: Vec<(Role, Graph)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();

    // `before`: the values computed outside `later` that `later` reads or the graph returns
    // (constants are copied into the programs that read them instead).
    let mut crossing: Vec<ValueId> = Vec::new();
    for &id in order.iter().filter(|id| later.contains(id)) {
        for v in graph.operands(id).into_iter().flatten() {
            if !later.contains(&v.node) && !is_constant(v) && !is_input(v) && !crossing.contains(&v) {
                crossing.push(v);
            }
        }
    }
    for &(_, v) in graph.outputs() {
        if !later.contains(&v.node) && !is_input(v) && !crossing.contains(&v) {
            crossing.push(v);
        }
    }
    if !crossing.is_empty() {
        let mut needed: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = crossing.iter().map(|v| v.node).collect();
        while let Some(n) = stack.pop() {
            if needed.insert(n) {
                stack.extend(graph.operands(n).into_iter().flatten().map(|v| v.node));
            }
        }
        let mut before = Graph::new(&format!("{}.before.{if_name}", graph.name));
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        let mut args = Vec::new();
        for &id in order.iter().filter(|id| needed.contains(id)) {
            let node = graph.node(id);
            let new = match &node.op {
                Op::Input => {
                    args.push(value_of[&id.into()]);
                    before.add_input(&node.name, node.outputs[0].clone())?.node
                }
                Op::Constant(t) => before.add_constant(&node.name, t.clone())?.node,
                op => {
                    let operands: Vec<Option<ValueId>> =
                        graph.operands(id).into_iter().map(|o| o.map(|v| ValueId::new(map[&v.node], v.output))).collect();
                    before.add_node_with_outputs(&node.name, op.clone(), &operands, node.outputs.len())?
                }
            };
            map.insert(id, new);
        }
        let mut results = Vec::new();
        for &v in &crossing {
            let name = graph.value_name(v);
            before.add_output(&name, ValueId::new(map[&v.node], v.output))?;
            value_of.insert(v, values.len());
            results.push(values.len());
            values.push((name, graph.value_type(v).clone()));
        }
        steps.push(Step::Run { program: programs.len(), args, results });
        programs.push((Role::Before, before));
    }

    // The branches: each takes the If's captured values, its constants bound into it.
    let operands: Vec<ValueId> =
        graph.operands(at).into_iter().map(|o| o.ok_or_else(|| bug("an operand is missing".into()))).collect::<Result<_>>()?;
    let (cond, captured) = operands.split_first().ok_or_else(|| bug("no condition".into()))?;
    let cond = *value_of.get(cond).ok_or_else(|| bug("the condition is a constant; the If should have been replaced by its branch".into()))?;
    let mut args = Vec::new();
    for &v in captured {
        if !is_constant(v) {
            args.push(value_of[&v]);
        }
    }
    for (role, branch) in [(Role::Then, &then_branch.0), (Role::Else, &else_branch.0)] {
        let mut b: Graph = (**branch).clone();
        b.name = format!("{}.{}.{if_name}", graph.name, role.name());
        let mut bound = Vec::new();
        for (i, &v) in captured.iter().enumerate() {
            b.set_input_type(i, graph.value_type(v).clone())?;
            if let Some(t) = graph.constant_value(v) {
                bound.push((b.node(b.inputs()[i]).name.clone(), t.clone()));
            }
        }
        specialize::bind_values(&mut b, &bound)?;
        programs.push((role, b));
    }
    let mut results = Vec::new();
    for (k, ty) in graph.node(at).outputs.iter().enumerate() {
        let v = ValueId::new(at, k);
        value_of.insert(v, values.len());
        results.push(values.len());
        values.push((graph.value_name(v), ty.clone()));
    }
    let n = programs.len();
    steps.push(Step::If { cond, then: n - 2, otherwise: n - 1, args, results });

    // `after`: the rest, reading host values as inputs and copying the constants it reads.
    let rest: Vec<NodeId> = order.iter().copied().filter(|&id| id != at && later.contains(&id)).collect();
    if !rest.is_empty() {
        let mut after = Graph::new(&format!("{}.after.{if_name}", graph.name));
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        let mut args = Vec::new();
        for &id in &rest {
            let mut operands = Vec::new();
            for o in graph.operands(id) {
                let Some(v) = o else {
                    operands.push(None);
                    continue;
                };
                if let Some(&mine) = map.get(&v) {
                    operands.push(Some(mine));
                    continue;
                }
                let mine = match graph.constant_value(v) {
                    Some(t) => after.add_constant(&after.unique_name(&graph.value_name(v)), t.clone())?,
                    None => {
                        args.push(value_of[&v]);
                        after.add_input(&after.unique_name(&graph.value_name(v)), graph.value_type(v).clone())?
                    }
                };
                map.insert(v, mine);
                operands.push(Some(mine));
            }
            let node = graph.node(id);
            let new = after.add_node_with_outputs(&node.name, node.op.clone(), &operands, node.outputs.len())?;
            for k in 0..node.outputs.len() {
                map.insert(ValueId::new(id, k), ValueId::new(new, k));
            }
        }
        let mut results = Vec::new();
        for &(_, v) in graph.outputs() {
            if v.node != at && later.contains(&v.node) && !value_of.contains_key(&v) {
                let name = graph.value_name(v);
                after.add_output(&name, map[&v])?;
                value_of.insert(v, values.len());
                results.push(values.len());
                values.push((name, graph.value_type(v).clone()));
            }
        }
        steps.push(Step::Run { program: programs.len(), args, results });
        programs.push((Role::After, after));
    }
    let outputs = graph
        .outputs()
        .iter()
        .map(|(_, v)| value_of.get(v).copied().ok_or_else(|| bug(format!("output `{}` has no value", graph.value_name(*v)))))
        .collect::<Result<_>>()?;
    Ok(Some(ControlSplit { node: if_name, programs, values, steps, outputs }))
}

impl fmt::Display for ControlSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |vs: &[usize]| vs.iter().map(|&v| self.values[v].0.as_str()).collect::<Vec<_>>().join(", ");
        writeln!(f, "control flow at If `{}`: {} programs", self.node, self.programs.len())?;
        for step in &self.steps {
            match step {
                Step::Run { program, args, results } => {
                    writeln!(f, "  run #{program} {}({}) -> ({})", self.programs[*program].0.name(), names(args), names(results))?;
                }
                Step::If { cond, then, otherwise, args, results } => {
                    let (t, e) = (self.programs[*then].0.name(), self.programs[*otherwise].0.name());
                    let (c, a) = (&self.values[*cond].0, names(args));
                    writeln!(f, "  if {c}: #{then} {t}({a}), else #{otherwise} {e}({a}) -> ({})", names(results))?;
                }
            }
        }
        writeln!(f, "  outputs: {}", names(&self.outputs))?;
        for (v, (name, ty)) in self.values.iter().enumerate() {
            writeln!(f, "  value {v} {name}: {ty}")?;
        }
        Ok(())
    }
}
