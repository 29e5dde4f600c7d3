//! Run-time control flow: a graph with an If whose condition is computed at run time, or a Scan,
//! becomes static programs and the host steps that run them (`Manifest::control`). A pure decision on the
//! optimised graph; the driver compiles each program as a model of its own.
//!
//! The graph is split at its first If (in topological order). `before` computes every value the
//! If and the nodes after it read; each branch is a program, the constants it captures bound into
//! it; `after` computes the rest from those values and the If's results. An If inside a branch or
//! in `after` is split in turn when that program is compiled. Both branches must give results of
//! one shape (else the result's shape depends on the condition, and specialisation on the
//! condition's value applies instead). A Scan splits the same way, its body one program that the
//! host runs once per step on slices of the scanned values, carrying the state (whose shape must
//! not change from step to step). A Loop splits the same way: the host runs its body while the
//! trip count and the condition allow, carrying the state and stacking the rest; the stacked
//! results' sizes must be known when it compiles (a constant trip count the condition cannot cut
//! short), else the trip count and condition are shape-deciding values that `kiln run` binds.

use std::collections::{HashMap, HashSet};
use std::fmt;

use kiln_ir::op::OpFamily;
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
    /// A Scan's body.
    Body,
    After,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Before => "before",
            Role::Then => "then",
            Role::Else => "else",
            Role::Body => "body",
            Role::After => "after",
        }
    }
}

/// A graph split at a run-time If: the programs and the host steps over values that run them.
pub struct ControlSplit {
    /// The If or Scan split at, and which it is.
    pub node: String,
    pub op: &'static str,
    /// In the order the steps name them; every input fully typed.
    pub programs: Vec<(Role, Graph)>,
    /// Every host value's name and type: the graph's inputs first, in order.
    pub values: Vec<(String, TensorType)>,
    pub steps: Vec<Step>,
    /// The value of each graph output, in order.
    pub outputs: Vec<usize>,
}

/// The host values a split starts with: the graph's inputs, in order, and where each is.
fn input_values(graph: &Graph) -> (Vec<(String, TensorType)>, HashMap<ValueId, usize>) {
    let mut values: Vec<(String, TensorType)> = Vec::new();
    let mut value_of: HashMap<ValueId, usize> = HashMap::new();
    for &id in graph.inputs() {
        value_of.insert(id.into(), values.len());
        values.push((graph.node(id).name.clone(), graph.node(id).outputs[0].clone()));
    }
    (values, value_of)
}

/// The `before` program of a split at `at_name`: every node `crossing` needs, reading the graph
/// inputs among them as arguments and returning `crossing`, which become host values. Gives the
/// program, its arguments and its results (host values).
fn before_program(
    graph: &Graph,
    order: &[NodeId],
    crossing: &[ValueId],
    at_name: &str,
    value_of: &mut HashMap<ValueId, usize>,
    values: &mut Vec<(String, TensorType)>,
) -> Result<(Graph, Vec<usize>, Vec<usize>)> {
    let mut needed: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = crossing.iter().map(|v| v.node).collect();
    while let Some(n) = stack.pop() {
        if needed.insert(n) {
            stack.extend(graph.operands(n).into_iter().flatten().map(|v| v.node));
        }
    }
    let mut before = Graph::new(&format!("{}.before.{at_name}", graph.name));
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
                let operands: Vec<Option<ValueId>> = graph
                    .operands(id)
                    .into_iter()
                    .map(|o| o.map(|v| ValueId::new(map[&v.node], v.output)))
                    .collect();
                before.add_node_with_outputs(
                    &node.name,
                    op.clone(),
                    &operands,
                    node.outputs.len(),
                )?
            }
        };
        map.insert(id, new);
    }
    let mut results = Vec::new();
    for &v in crossing {
        let name = graph.value_name(v);
        before.add_output(&name, ValueId::new(map[&v.node], v.output))?;
        value_of.insert(v, values.len());
        results.push(values.len());
        values.push((name, graph.value_type(v).clone()));
    }
    Ok((before, args, results))
}

/// A program of `nodes` (in order) that runs after others: the host values it reads are its
/// inputs (its arguments), the constants it reads are copied in, and the graph outputs among its
/// nodes' results that no earlier step gave become its results (host values). Gives the program,
/// its arguments and its results.
fn later_program(
    graph: &Graph,
    nodes: &[NodeId],
    name: &str,
    value_of: &mut HashMap<ValueId, usize>,
    values: &mut Vec<(String, TensorType)>,
) -> Result<(Graph, Vec<usize>, Vec<usize>)> {
    let part: HashSet<NodeId> = nodes.iter().copied().collect();
    let mut program = Graph::new(name);
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    let mut args = Vec::new();
    for &id in nodes {
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
            let name = program.unique_name(&graph.value_name(v));
            let mine = match graph.constant_value(v) {
                Some(t) => program.add_constant(&name, t.clone())?,
                None => {
                    args.push(value_of[&v]);
                    program.add_input(&name, graph.value_type(v).clone())?
                }
            };
            map.insert(v, mine);
            operands.push(Some(mine));
        }
        let node = graph.node(id);
        let new = program.add_node_with_outputs(
            &node.name,
            node.op.clone(),
            &operands,
            node.outputs.len(),
        )?;
        for k in 0..node.outputs.len() {
            map.insert(ValueId::new(id, k), ValueId::new(new, k));
        }
    }
    let mut results = Vec::new();
    for &(_, v) in graph.outputs() {
        if part.contains(&v.node) && !value_of.contains_key(&v) {
            let name = graph.value_name(v);
            program.add_output(&name, map[&v])?;
            value_of.insert(v, values.len());
            results.push(values.len());
            values.push((name, graph.value_type(v).clone()));
        }
    }
    Ok((program, args, results))
}

/// The ops whose result shapes may depend on the data, which the host evaluates.
fn data_dependent(op: &Op) -> bool {
    matches!(
        op,
        Op::NonZero | Op::Compress { .. } | Op::NonMaxSuppression { .. } | Op::Unique { .. }
    )
}

/// Whether a node computes on strings (a string operand or result, or a string op such as
/// LabelEncoder on numbers): compiled code holds no strings, so the host evaluates it.
pub fn holds_strings(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    if matches!(node.op, Op::Input | Op::Constant(_)) {
        return false; // a host value, or copied into the host part that reads it
    }
    node.op.family() == OpFamily::Strings
        || node.outputs.iter().any(|t| t.dtype.is_string())
        || graph.operands(id).into_iter().flatten().any(|v| graph.value_type(v).dtype.is_string())
}

/// The host part of a graph: every node downstream of a data-dependent op whose result shape is
/// not fixed (its operands' are), or of a node that holds strings (`holds_strings`), those
/// included. `None` when there is none, or when some shape is not fixed for another reason (a
/// symbolic input, a shape computed at run time), which stays an error.
pub fn host_tail(graph: &Graph) -> Result<Option<HashSet<NodeId>>> {
    let order = graph.topo_order()?;
    let dynamic = |id: NodeId| graph.node(id).outputs.iter().any(|t| t.shape.as_fixed().is_none());
    let mut tail: HashSet<NodeId> = HashSet::new();
    for &id in &order {
        let reads_tail = graph.operands(id).into_iter().flatten().any(|v| tail.contains(&v.node));
        if reads_tail
            || holds_strings(graph, id)
            || (dynamic(id) && data_dependent(&graph.node(id).op))
        {
            tail.insert(id);
        } else if dynamic(id) {
            return Ok(None);
        }
    }
    Ok((!tail.is_empty()).then_some(tail))
}

/// Splits `graph` (optimised: static shapes, constant conditions already taken) at its first If
/// or Scan, or before its host part (`host_tail`); `None` when it has neither.
pub fn split(graph: &Graph) -> Result<Option<ControlSplit>> {
    if let Some(tail) = host_tail(graph)? {
        return split_host(graph, &tail).map(Some);
    }
    let order = graph.topo_order()?;
    let Some(&at) = order.iter().find(|&&id| graph.node(id).op.family() == OpFamily::Control)
    else {
        return Ok(None);
    };
    let if_name = graph.node(at).name.clone();
    // Inference checked the node's operands and axes, and `split` follows its rules.
    let bug = |msg: String| {
        CompileError::Internal(format!(
            "splitting at {} `{if_name}`: {msg}",
            graph.node(at).op.name()
        ))
    };
    // A Scan's state and scanned inputs and a Loop's trip count, condition and state are host
    // values even when constant (the steps slice and carry them); only the captured constants are
    // bound into the body.
    let host_from = match &graph.node(at).op {
        Op::Scan(s) => s.captures,
        Op::Loop(l) => l.captures,
        _ => usize::MAX,
    };
    let is_constant = |v: ValueId| matches!(graph.node(v.node).op, Op::Constant(_));
    let is_input = |v: ValueId| matches!(graph.node(v.node).op, Op::Input);

    // The If and everything that reads its results, directly or not.
    let mut later: HashSet<NodeId> = HashSet::from([at]);
    for &id in &order {
        if graph.operands(id).into_iter().flatten().any(|v| later.contains(&v.node)) {
            later.insert(id);
        }
    }
    let (mut values, mut value_of) = input_values(graph);
    let mut programs: Vec<(Role, Graph)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();

    // `before`: the values computed outside `later` that `later` reads or the graph returns
    // (constants are copied into the programs that read them instead).
    let mut crossing: Vec<ValueId> = Vec::new();
    for &id in order.iter().filter(|id| later.contains(id)) {
        for (i, v) in graph.operands(id).into_iter().enumerate() {
            let Some(v) = v else { continue };
            let host = id == at && i >= host_from;
            if !later.contains(&v.node)
                && (host || !is_constant(v))
                && !is_input(v)
                && !crossing.contains(&v)
            {
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
        let (before, args, results) =
            before_program(graph, &order, &crossing, &if_name, &mut value_of, &mut values)?;
        steps.push(Step::Run { program: programs.len(), args, results });
        programs.push((Role::Before, before));
    }

    // Every operand but a Loop's trip count and condition is present.
    let given = graph.operands(at);
    let optional = |i: usize| matches!(&graph.node(at).op, Op::Loop(l) if i == l.captures || i == l.captures + 1);
    let operands: Vec<ValueId> = given
        .iter()
        .enumerate()
        .filter(|&(i, _)| !optional(i))
        .map(|(_, o)| o.ok_or_else(|| bug("an operand is missing".into())))
        .collect::<Result<_>>()?;
    let mut results = Vec::new();
    for (k, ty) in graph.node(at).outputs.iter().enumerate() {
        results.push(values.len());
        values.push((graph.value_name(ValueId::new(at, k)), ty.clone()));
    }
    // `graph` typed as `types` (the operands'), the constants among `captured` bound into it.
    let program =
        |g: &Graph, role: Role, types: Vec<TensorType>, captured: &[ValueId]| -> Result<Graph> {
            let mut b = g.clone();
            b.name = format!("{}.{}.{if_name}", graph.name, role.name());
            let mut bound = Vec::new();
            for (i, ty) in types.into_iter().enumerate() {
                b.set_input_type(i, ty)?;
                if let Some(t) = captured.get(i).and_then(|&v| graph.constant_value(v)) {
                    bound.push((b.node(b.inputs()[i]).name.clone(), t.clone()));
                }
            }
            specialize::bind_values(&mut b, &bound)?;
            Ok(b)
        };
    let host = |v: &ValueId| {
        value_of
            .get(v)
            .copied()
            .ok_or_else(|| bug(format!("`{}` is not a host value", graph.value_name(*v))))
    };
    match &graph.node(at).op {
        Op::If { then_branch, else_branch } => {
            // Each branch takes the If's captured values.
            let (cond, captured) =
                operands.split_first().ok_or_else(|| bug("no condition".into()))?;
            let cond = host(cond)?;
            let args: Vec<usize> =
                captured.iter().filter(|v| !is_constant(**v)).map(host).collect::<Result<_>>()?;
            let types: Vec<TensorType> =
                captured.iter().map(|&v| graph.value_type(v).clone()).collect();
            programs
                .push((Role::Then, program(&then_branch.0, Role::Then, types.clone(), captured)?));
            programs.push((Role::Else, program(&else_branch.0, Role::Else, types, captured)?));
            let n = programs.len();
            steps.push(Step::If {
                cond,
                then: n - 2,
                otherwise: n - 1,
                args,
                results: results.clone(),
            });
        }
        Op::Scan(s) => {
            let (captured, rest) = operands.split_at(s.captures.min(operands.len()));
            let states = s.states(operands.len());
            let (state, scanned) = rest.split_at(states);
            let mut types: Vec<TensorType> =
                operands.iter().map(|&v| graph.value_type(v).clone()).collect();
            let mut scans = Vec::new();
            for (i, &v) in scanned.iter().enumerate() {
                let (axis, reverse) = s.input(i);
                let t = &mut types[s.captures + states + i];
                let axis = kiln_ir::normalize_axis(axis, t.rank())
                    .ok_or_else(|| bug(format!("scan axis {axis} outside {t}")))?;
                let mut dims = t.shape.dims().to_vec();
                dims.remove(axis);
                *t = TensorType::new(t.dtype, kiln_ir::Shape(dims));
                scans.push(kiln_runtime::artifact::Scanned { value: host(&v)?, axis, reverse });
            }
            let body = program(&s.body.0, Role::Body, types, captured)?;
            // The state must keep its shape from step to step: the body is compiled once.
            for (k, &v) in state.iter().enumerate() {
                let (have, gives) = (graph.value_type(v), body.value_type(body.outputs()[k].1));
                if have != gives {
                    return Err(CompileError::DynamicShapes(format!(
                        "Scan `{if_name}`: state {k} goes in as {have} and comes out as {gives}; kiln compiles a scan body whose state keeps its shape"
                    )));
                }
            }
            let stacked = (0..body.outputs().len() - states)
                .map(|k| {
                    let (axis, reverse) = s.output(k);
                    let rank = body.value_type(body.outputs()[states + k].1).rank() + 1;
                    let axis = kiln_ir::normalize_axis(axis, rank)
                        .ok_or_else(|| bug(format!("stacking axis {axis} outside rank {rank}")))?;
                    Ok(kiln_runtime::artifact::Stacked { axis, reverse })
                })
                .collect::<Result<_>>()?;
            steps.push(Step::Scan {
                body: programs.len(),
                captured: captured
                    .iter()
                    .filter(|v| !is_constant(**v))
                    .map(host)
                    .collect::<Result<_>>()?,
                state: state.iter().map(host).collect::<Result<_>>()?,
                scanned: scans,
                stacked,
                results: results.clone(),
            });
            programs.push((Role::Body, body));
        }
        Op::Loop(l) => {
            // `operands` holds the captured values and the state; the trip count and condition
            // are read from `given`.
            let (captured, state) = operands.split_at(l.captures.min(operands.len()));
            let declared = |i: usize| l.body.0.node(l.body.0.inputs()[i]).outputs[0].clone();
            let mut types: Vec<TensorType> =
                captured.iter().map(|&v| graph.value_type(v).clone()).collect();
            types.extend([declared(l.captures), declared(l.captures + 1)]);
            types.extend(state.iter().map(|&v| graph.value_type(v).clone()));
            let body = program(&l.body.0, Role::Body, types, captured)?;
            // The state must keep its shape from step to step: the body is compiled once.
            for (k, &v) in state.iter().enumerate() {
                let (have, gives) = (graph.value_type(v), body.value_type(body.outputs()[1 + k].1));
                if have != gives {
                    return Err(CompileError::DynamicShapes(format!(
                        "Loop `{if_name}`: state {k} goes in as {have} and comes out as {gives}; kiln compiles a loop body whose state keeps its shape"
                    )));
                }
            }
            let optional_host =
                |i: usize| given.get(i).copied().flatten().map(|v| host(&v)).transpose();
            steps.push(Step::Loop {
                node: if_name.clone(),
                body: programs.len(),
                captured: captured
                    .iter()
                    .filter(|v| !is_constant(**v))
                    .map(host)
                    .collect::<Result<_>>()?,
                trip_count: optional_host(l.captures)?,
                cond: optional_host(l.captures + 1)?,
                state: state.iter().map(host).collect::<Result<_>>()?,
                results: results.clone(),
            });
            programs.push((Role::Body, body));
        }
        _ => unreachable!("found as an If, a Scan or a Loop"),
    }
    for (k, &r) in results.iter().enumerate() {
        value_of.insert(ValueId::new(at, k), r);
    }

    // `after`: the rest, reading host values as inputs and copying the constants it reads.
    let rest: Vec<NodeId> =
        order.iter().copied().filter(|&id| id != at && later.contains(&id)).collect();
    if !rest.is_empty() {
        let (after, args, results) = later_program(
            graph,
            &rest,
            &format!("{}.after.{if_name}", graph.name),
            &mut value_of,
            &mut values,
        )?;
        steps.push(Step::Run { program: programs.len(), args, results });
        programs.push((Role::After, after));
    }
    let outputs = graph
        .outputs()
        .iter()
        .map(|(_, v)| {
            value_of
                .get(v)
                .copied()
                .ok_or_else(|| bug(format!("output `{}` has no value", graph.value_name(*v))))
        })
        .collect::<Result<_>>()?;
    let op = graph.node(at).op.name();
    Ok(Some(ControlSplit { node: if_name, op, programs, values, steps, outputs }))
}

/// `graph` as a static program computing what the host part reads and the graph returns, then a
/// host evaluation (`Step::Eval`) of the host part `tail` on those values.
fn split_host(graph: &Graph, tail: &HashSet<NodeId>) -> Result<ControlSplit> {
    let order = graph.topo_order()?;
    let first = order.iter().find(|id| tail.contains(id)).copied();
    let at = first.ok_or_else(|| CompileError::Internal("an empty host part".into()))?;
    let at_name = graph.node(at).name.clone();
    let is_constant = |v: ValueId| matches!(graph.node(v.node).op, Op::Constant(_));
    let is_input = |v: ValueId| matches!(graph.node(v.node).op, Op::Input);
    let (mut values, mut value_of) = input_values(graph);
    let mut programs: Vec<(Role, Graph)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();

    // The compiled program: what the host part reads (constants it copies) and the outputs
    // computed before it.
    let mut crossing: Vec<ValueId> = Vec::new();
    let tail_reads = order
        .iter()
        .filter(|id| tail.contains(id))
        .flat_map(|&id| graph.operands(id).into_iter().flatten());
    let outputs_before = graph.outputs().iter().map(|&(_, v)| v);
    let mut read_inputs: Vec<ValueId> = Vec::new();
    for v in tail_reads.filter(|v| !is_constant(*v)).chain(outputs_before) {
        if tail.contains(&v.node) {
            continue;
        }
        let list = if is_input(v) { &mut read_inputs } else { &mut crossing };
        if !list.contains(&v) {
            list.push(v);
        }
    }
    // An artifact has a compiled program (it gives the target): when the host part reads only
    // inputs, the program passes them through (strings stay host values: no program holds one).
    if crossing.is_empty() {
        crossing =
            read_inputs.into_iter().filter(|&v| !graph.value_type(v).dtype.is_string()).collect();
    }
    if crossing.is_empty() {
        // Nothing to compute before the host part (a graph of strings): a program that gives
        // one constant byte, which nothing reads, stands for the target.
        let mut anchor = Graph::new(&format!("{}.before.{at_name}", graph.name));
        let name = format!("{at_name}/anchor");
        let v = anchor.add_constant(&name, kiln_ir::Tensor::scalar(0u8))?;
        anchor.add_output(&name, v)?;
        let ty = anchor.value_type(v).clone();
        steps.push(Step::Run {
            program: programs.len(),
            args: Vec::new(),
            results: vec![values.len()],
        });
        values.push((name, ty));
        programs.push((Role::Before, anchor));
    } else {
        let (before, args, results) =
            before_program(graph, &order, &crossing, &at_name, &mut value_of, &mut values)?;
        steps.push(Step::Run { program: programs.len(), args, results });
        programs.push((Role::Before, before));
    }

    // The host part, reading host values as inputs and copying the constants it reads.
    let part: Vec<NodeId> = order.iter().copied().filter(|id| tail.contains(id)).collect();
    let (host, args, results) = later_program(
        graph,
        &part,
        &format!("{}.host.{at_name}", graph.name),
        &mut value_of,
        &mut values,
    )?;
    steps.push(Step::Eval {
        graph: kiln_ir::text::print(&host, kiln_ir::text::Weights::Full),
        args,
        results,
    });
    let outputs = graph
        .outputs()
        .iter()
        .map(|(_, v)| {
            value_of.get(v).copied().ok_or_else(|| {
                CompileError::Internal(format!("output `{}` has no value", graph.value_name(*v)))
            })
        })
        .collect::<Result<_>>()?;
    let op = graph.node(at).op.name();
    Ok(ControlSplit { node: at_name, op, programs, values, steps, outputs })
}

impl fmt::Display for ControlSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |vs: &[usize]| {
            vs.iter().map(|&v| self.values[v].0.as_str()).collect::<Vec<_>>().join(", ")
        };
        writeln!(
            f,
            "control flow at {} `{}`: {} programs",
            self.op,
            self.node,
            self.programs.len()
        )?;
        for step in &self.steps {
            match step {
                Step::Run { program, args, results } => {
                    writeln!(
                        f,
                        "  run #{program} {}({}) -> ({})",
                        self.programs[*program].0.name(),
                        names(args),
                        names(results)
                    )?;
                }
                Step::If { cond, then, otherwise, args, results } => {
                    let (t, e) =
                        (self.programs[*then].0.name(), self.programs[*otherwise].0.name());
                    let (c, a) = (&self.values[*cond].0, names(args));
                    writeln!(
                        f,
                        "  if {c}: #{then} {t}({a}), else #{otherwise} {e}({a}) -> ({})",
                        names(results)
                    )?;
                }
                Step::Scan { body, captured, state, scanned, stacked, results } => {
                    let scans: Vec<String> = scanned
                        .iter()
                        .map(|s| {
                            format!(
                                "{} axis {}{}",
                                self.values[s.value].0,
                                s.axis,
                                if s.reverse { " reversed" } else { "" }
                            )
                        })
                        .collect();
                    let stacks: Vec<String> = stacked
                        .iter()
                        .map(|s| {
                            format!("axis {}{}", s.axis, if s.reverse { " reversed" } else { "" })
                        })
                        .collect();
                    let mut takes = Vec::new();
                    for (what, list) in [
                        ("captured", names(captured)),
                        ("state", names(state)),
                        ("slices of", scans.join(", ")),
                    ] {
                        if !list.is_empty() {
                            takes.push(format!("{what} {list}"));
                        }
                    }
                    let stacks =
                        if stacks.is_empty() { "nothing".to_string() } else { stacks.join(", ") };
                    writeln!(
                        f,
                        "  scan #{body} body({}) stacking {stacks} -> ({})",
                        takes.join("; "),
                        names(results)
                    )?;
                }
                Step::Eval { graph, args, results } => {
                    // The host graph's nodes, one a line, without its header and constants.
                    let nodes: Vec<&str> = graph
                        .lines()
                        .map(str::trim)
                        .filter(|l| l.starts_with('%') && !l.contains("= Constant"))
                        .collect();
                    writeln!(
                        f,
                        "  host eval({}) -> ({}): {}",
                        names(args),
                        names(results),
                        nodes.join("; ")
                    )?;
                }
                Step::Loop { body, captured, trip_count, cond, state, results, .. } => {
                    let one = |v: &Option<usize>| v.map_or("none", |v| self.values[v].0.as_str());
                    let mut takes = Vec::new();
                    if !captured.is_empty() {
                        takes.push(format!("captured {}", names(captured)));
                    }
                    takes.push(format!("trip count {}", one(trip_count)));
                    takes.push(format!("condition {}", one(cond)));
                    if !state.is_empty() {
                        takes.push(format!("state {}", names(state)));
                    }
                    writeln!(
                        f,
                        "  loop #{body} body({}) stacking {} -> ({})",
                        takes.join("; "),
                        results.len() - state.len(),
                        names(results)
                    )?;
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
