//! The op graph: a petgraph `StableDiGraph` whose nodes hold one op each and whose edges say which
//! result feeds which operand. Types are inferred as nodes are added, so a graph that exists is
//! well-typed; `verify` re-checks everything for graphs that were edited or parsed.

use std::collections::{BTreeSet, HashMap, HashSet};

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::infer::{self, Operand};
use crate::{IrError, Op, OpError, Result, Tensor, TensorType};

pub type NodeId = NodeIndex<u32>;

/// One result of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    pub node: NodeId,
    pub output: usize,
}

impl ValueId {
    pub fn new(node: NodeId, output: usize) -> ValueId {
        ValueId { node, output }
    }
}

impl From<NodeId> for ValueId {
    /// A node's first result.
    fn from(node: NodeId) -> ValueId {
        ValueId { node, output: 0 }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique within the graph; errors and the text form use it.
    pub name: String,
    pub op: Op,
    /// The type of each result.
    pub outputs: Vec<TensorType>,
}

/// An edge from a producer to a consumer: result `output` of the source feeds operand `operand`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub output: usize,
    pub operand: usize,
}

#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    graph: StableDiGraph<Node, Edge>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, ValueId)>,
    names: HashMap<String, NodeId>,
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            graph: StableDiGraph::default(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            names: HashMap::new(),
        }
    }

    // ----- building -----

    /// Declares the next graph input.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        let id = self.insert(name, Op::Input, vec![ty])?;
        self.inputs.push(id);
        Ok(id.into())
    }

    pub fn add_constant(&mut self, name: &str, value: Tensor) -> Result<ValueId> {
        let ty = value.ty();
        Ok(self.insert(name, Op::Constant(value), vec![ty])?.into())
    }

    /// Adds a node with the op's default number of results, inferring their types.
    pub fn add_node(&mut self, name: &str, op: Op, operands: &[Option<ValueId>]) -> Result<NodeId> {
        let n = op.default_num_outputs();
        self.add_node_with_outputs(name, op, operands, n)
    }

    /// Adds a node keeping its first `num_outputs` results (ops such as LayerNormalization have
    /// optional extra results).
    pub fn add_node_with_outputs(
        &mut self,
        name: &str,
        op: Op,
        operands: &[Option<ValueId>],
        num_outputs: usize,
    ) -> Result<NodeId> {
        let types = self.infer_node(name, &op, operands, num_outputs)?;
        let id = self.insert(name, op, types)?;
        for (i, v) in operands.iter().enumerate() {
            if let Some(v) = v {
                self.graph.add_edge(v.node, id, Edge { output: v.output, operand: i });
            }
        }
        Ok(id)
    }

    /// Marks a value as the next graph output under `name`.
    pub fn add_output(&mut self, name: &str, value: ValueId) -> Result<()> {
        self.check_value(value)?;
        if self.outputs.iter().any(|(n, _)| n == name) {
            return Err(IrError::Graph(format!("two graph outputs are named `{name}`")));
        }
        self.outputs.push((name.to_string(), value));
        Ok(())
    }

    /// Replaces the graph outputs (names must be distinct, values must exist).
    pub fn set_outputs(&mut self, outputs: Vec<(String, ValueId)>) -> Result<()> {
        for (i, (name, v)) in outputs.iter().enumerate() {
            self.check_value(*v)?;
            if outputs[..i].iter().any(|(n, _)| n == name) {
                return Err(IrError::Graph(format!("two graph outputs are named `{name}`")));
            }
        }
        self.outputs = outputs;
        Ok(())
    }

    /// A name not used yet in this graph: `base` itself, or `base_N`.
    pub fn unique_name(&self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !self.names.contains_key(n))
            .expect("unbounded")
    }

    fn insert(&mut self, name: &str, op: Op, outputs: Vec<TensorType>) -> Result<NodeId> {
        if name.is_empty() {
            return Err(IrError::Graph(format!("a {} node has an empty name", op.name())));
        }
        check_sizes(name, &op, &outputs)?;
        if self.names.contains_key(name) {
            return Err(IrError::Graph(format!("two nodes are named `{name}`")));
        }
        let id = self.graph.add_node(Node { name: name.to_string(), op, outputs });
        self.names.insert(name.to_string(), id);
        Ok(id)
    }

    fn infer_node(
        &self,
        name: &str,
        op: &Op,
        operands: &[Option<ValueId>],
        num_outputs: usize,
    ) -> Result<Vec<TensorType>> {
        let shape_err = |error: OpError| IrError::shape(name, op.name(), error);
        check_arity(op, operands).map_err(shape_err)?;
        for v in operands.iter().flatten() {
            // A dangling operand: the graph's error, told as this node's.
            self.check_value(*v).map_err(|e| shape_err(OpError::Invalid(e.to_string())))?;
        }
        let ops: Vec<Option<Operand>> = operands
            .iter()
            .map(|o| o.map(|v| Operand { ty: self.value_type(v), value: self.constant_value(v) }))
            .collect();
        let mut types = infer::infer(op, &ops, name).map_err(shape_err)?;
        if num_outputs == 0 || num_outputs > types.len() {
            return Err(shape_err(OpError::ResultCount { have: types.len(), asked: num_outputs }));
        }
        types.truncate(num_outputs);
        check_sizes(name, op, &types)?;
        Ok(types)
    }

    fn check_value(&self, v: ValueId) -> Result<()> {
        match self.graph.node_weight(v.node) {
            None => Err(IrError::Graph(format!(
                "value {}#{} refers to a node that does not exist",
                v.node.index(),
                v.output
            ))),
            Some(n) if v.output >= n.outputs.len() => Err(IrError::Graph(format!(
                "node `{}` has {} results, result {} used",
                n.name,
                n.outputs.len(),
                v.output
            ))),
            Some(_) => Ok(()),
        }
    }

    // ----- reading -----

    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    pub fn try_node(&self, id: NodeId) -> Option<&Node> {
        self.graph.node_weight(id)
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    /// Every node, in insertion order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.graph.node_indices().map(move |i| (i, &self.graph[i]))
    }

    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// The graph inputs, in order (nodes whose op is `Input`).
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// The graph outputs, in order, with their names.
    pub fn outputs(&self) -> &[(String, ValueId)] {
        &self.outputs
    }

    pub fn value_type(&self, v: ValueId) -> &TensorType {
        &self.graph[v.node].outputs[v.output]
    }

    /// The value if it is produced by a `Constant` node.
    pub fn constant_value(&self, v: ValueId) -> Option<&Tensor> {
        match &self.graph.node_weight(v.node)?.op {
            Op::Constant(t) if v.output == 0 => Some(t),
            _ => None,
        }
    }

    /// A node's operands by position; `None` marks an omitted optional operand.
    pub fn operands(&self, id: NodeId) -> Vec<Option<ValueId>> {
        let mut ops: Vec<Option<ValueId>> = Vec::new();
        for e in self.graph.edges_directed(id, Direction::Incoming) {
            let w = e.weight();
            if ops.len() <= w.operand {
                ops.resize(w.operand + 1, None);
            }
            ops[w.operand] = Some(ValueId::new(e.source(), w.output));
        }
        ops
    }

    /// Every (consumer, operand position) that reads `v`, sorted.
    pub fn users(&self, v: ValueId) -> Vec<(NodeId, usize)> {
        let mut users: Vec<(NodeId, usize)> = self
            .graph
            .edges_directed(v.node, Direction::Outgoing)
            .filter(|e| e.weight().output == v.output)
            .map(|e| (e.target(), e.weight().operand))
            .collect();
        users.sort();
        users
    }

    /// The name a value goes by in text: the node's name, with `#i` for results after the first.
    pub fn value_name(&self, v: ValueId) -> String {
        let n = &self.graph[v.node].name;
        if v.output == 0 {
            n.clone()
        } else {
            format!("{n}#{}", v.output)
        }
    }

    /// Every node in a topological order that is stable: among the nodes that are ready, the one
    /// added first goes first. A cycle is an error naming a node on it.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        let mut indegree: HashMap<NodeId, usize> = HashMap::new();
        let mut ready = BTreeSet::new();
        for id in self.graph.node_indices() {
            let preds: HashSet<NodeId> =
                self.graph.neighbors_directed(id, Direction::Incoming).collect();
            if preds.is_empty() {
                ready.insert(id);
            }
            indegree.insert(id, preds.len());
        }
        let mut order = Vec::with_capacity(self.graph.node_count());
        while let Some(id) = ready.pop_first() {
            order.push(id);
            let succs: HashSet<NodeId> =
                self.graph.neighbors_directed(id, Direction::Outgoing).collect();
            for s in succs {
                let d = indegree.get_mut(&s).expect("every node has an in-degree");
                *d -= 1;
                if *d == 0 {
                    ready.insert(s);
                }
            }
        }
        if order.len() != self.graph.node_count() {
            let stuck =
                self.graph.node_indices().find(|id| indegree[id] > 0).expect("a node is left");
            return Err(IrError::Graph(format!(
                "the graph has a cycle through node `{}`",
                self.graph[stuck].name
            )));
        }
        Ok(order)
    }

    // ----- editing (for passes) -----

    /// Makes every user of `old`, and any graph output naming it, use `new` instead.
    pub fn replace_uses(&mut self, old: ValueId, new: ValueId) -> Result<()> {
        self.check_value(new)?;
        for (user, operand) in self.users(old) {
            let e = self
                .graph
                .edges_connecting(old.node, user)
                .find(|e| *e.weight() == Edge { output: old.output, operand })
                .map(|e| e.id())
                .expect("users() found this edge");
            self.graph.remove_edge(e);
            self.graph.add_edge(new.node, user, Edge { output: new.output, operand });
        }
        for (_, v) in &mut self.outputs {
            if *v == old {
                *v = new;
            }
        }
        Ok(())
    }

    /// Makes operand `operand` of node `id` read `new`, which must have the type of the value it
    /// reads now (so nothing downstream changes type) and must not depend on `id` (a cycle).
    pub fn set_operand(&mut self, id: NodeId, operand: usize, new: ValueId) -> Result<()> {
        self.check_value(new)?;
        let Some(node) = self.try_node(id) else {
            return Err(IrError::Graph(format!("node {id:?} is not in the graph")));
        };
        if petgraph::algo::has_path_connecting(&self.graph, id, new.node, None) {
            return Err(IrError::Graph(format!(
                "operand {operand} of node `{}` cannot read a value computed from it (a cycle)",
                node.name
            )));
        }
        let name = || self.graph[id].name.clone();
        let e = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .find(|e| e.weight().operand == operand)
            .map(|e| (e.id(), ValueId::new(e.source(), e.weight().output)))
            .ok_or_else(|| IrError::Graph(format!("node `{}` has no operand {operand}", name())))?;
        if self.value_type(e.1) != self.value_type(new) {
            return Err(IrError::Graph(format!(
                "operand {operand} of node `{}` is {}, not {}",
                name(),
                self.value_type(e.1),
                self.value_type(new)
            )));
        }
        self.graph.remove_edge(e.0);
        self.graph.add_edge(new.node, id, Edge { output: new.output, operand });
        Ok(())
    }

    /// Copies `sub` into this graph: its inputs are `inputs` (values of this graph, in order), its
    /// nodes are added under `prefix/name`, and its outputs' values here are returned.
    pub fn inline(
        &mut self,
        sub: &Graph,
        inputs: &[ValueId],
        prefix: &str,
    ) -> Result<Vec<ValueId>> {
        if inputs.len() != sub.inputs().len() {
            return Err(IrError::Graph(format!(
                "graph `{}` takes {} inputs, {} given",
                sub.name,
                sub.inputs().len(),
                inputs.len()
            )));
        }
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        let mut input_of: HashMap<NodeId, ValueId> = HashMap::new();
        for (&id, &v) in sub.inputs().iter().zip(inputs) {
            input_of.insert(id, v);
        }
        let translate =
            |v: ValueId, map: &HashMap<NodeId, NodeId>, input_of: &HashMap<NodeId, ValueId>| {
                match input_of.get(&v.node) {
                    Some(&outer) => outer,
                    None => ValueId::new(map[&v.node], v.output),
                }
            };
        for id in sub.topo_order()? {
            let node = sub.node(id);
            if input_of.contains_key(&id) {
                continue;
            }
            let name = self.unique_name(&format!("{prefix}/{}", node.name));
            let new = match &node.op {
                Op::Constant(t) => self.add_constant(&name, t.clone())?.node,
                op => {
                    let operands: Vec<Option<ValueId>> = sub
                        .operands(id)
                        .into_iter()
                        .map(|o| o.map(|v| translate(v, &map, &input_of)))
                        .collect();
                    self.add_node_with_outputs(&name, op.clone(), &operands, node.outputs.len())?
                }
            };
            map.insert(id, new);
        }
        Ok(sub.outputs().iter().map(|(_, v)| translate(*v, &map, &input_of)).collect())
    }

    /// Renames a node; the new name must be unused.
    pub fn rename_node(&mut self, id: NodeId, name: &str) -> Result<()> {
        let old = self
            .graph
            .node_weight(id)
            .ok_or_else(|| IrError::Graph("renaming a node that does not exist".into()))?
            .name
            .clone();
        if old == name {
            return Ok(());
        }
        if name.is_empty() || self.names.contains_key(name) {
            return Err(IrError::Graph(format!(
                "cannot rename `{old}` to `{name}`: the name is empty or taken"
            )));
        }
        self.names.remove(&old);
        self.names.insert(name.to_string(), id);
        self.graph[id].name = name.to_string();
        Ok(())
    }

    /// Removes a node that nothing uses any more.
    pub fn remove_node(&mut self, id: NodeId) -> Result<Node> {
        let node = self
            .graph
            .node_weight(id)
            .ok_or_else(|| IrError::Graph("removing a node that does not exist".into()))?;
        if self.graph.neighbors_directed(id, Direction::Outgoing).next().is_some()
            || self.outputs.iter().any(|(_, v)| v.node == id)
        {
            return Err(IrError::Graph(format!("node `{}` is still used", node.name)));
        }
        self.inputs.retain(|&i| i != id);
        let node = self.graph.remove_node(id).expect("checked above");
        self.names.remove(&node.name);
        Ok(node)
    }

    /// Changes the declared type of a graph input and re-infers every node's types (binding
    /// symbolic dimensions to concrete ones, for instance).
    pub fn set_input_type(&mut self, input: usize, ty: TensorType) -> Result<()> {
        let id = *self
            .inputs
            .get(input)
            .ok_or_else(|| IrError::Graph(format!("the graph has no input {input}")))?;
        check_sizes(&self.graph[id].name, &Op::Input, std::slice::from_ref(&ty))?;
        self.graph[id].outputs = vec![ty];
        self.reinfer()
    }

    /// Re-runs inference over every node in topological order, replacing the stored types.
    pub fn reinfer(&mut self) -> Result<()> {
        for id in self.topo_order()? {
            let node = &self.graph[id];
            if matches!(node.op, Op::Input | Op::Constant(_)) {
                continue;
            }
            let types =
                self.infer_node(&node.name, &node.op, &self.operands(id), node.outputs.len())?;
            self.graph[id].outputs = types;
        }
        Ok(())
    }

    /// Replaces a node's result types with declared ones that agree with inference (the text form
    /// keeps its symbol names this way).
    pub(crate) fn declare_output_types(
        &mut self,
        id: NodeId,
        types: Vec<TensorType>,
    ) -> Result<()> {
        let node = &self.graph[id];
        if types.len() != node.outputs.len() {
            return Err(IrError::Graph(format!(
                "node `{}` declares {} results, has {}",
                node.name,
                types.len(),
                node.outputs.len()
            )));
        }
        for (i, (declared, inferred)) in types.iter().zip(&node.outputs).enumerate() {
            if !type_matches(declared, inferred) {
                return Err(IrError::shape(
                    node.name.clone(),
                    node.op.name(),
                    OpError::ResultType {
                        index: i,
                        declared: Box::new(declared.clone()),
                        inferred: Box::new(inferred.clone()),
                    },
                ));
            }
        }
        self.graph[id].outputs = types;
        Ok(())
    }

    // ----- checking -----

    /// Checks structure and types: names unique and non-empty, inputs are `Input` nodes and every
    /// `Input` node is an input, operands in range and present where required, no cycles, every
    /// stored type equal to what inference gives, outputs valid.
    pub fn verify(&self) -> Result<()> {
        let order = self.topo_order()?;
        let input_set: HashSet<NodeId> = self.inputs.iter().copied().collect();
        if input_set.len() != self.inputs.len() {
            return Err(IrError::Graph("a node is listed twice as a graph input".into()));
        }
        for id in order {
            let node = &self.graph[id];
            if self.names.get(&node.name) != Some(&id) {
                return Err(IrError::Graph(format!("node name `{}` is not unique", node.name)));
            }
            match &node.op {
                Op::Input => {
                    if !input_set.contains(&id) {
                        return Err(IrError::Graph(format!(
                            "Input node `{}` is not a graph input",
                            node.name
                        )));
                    }
                    continue;
                }
                Op::Constant(t) => {
                    if node.outputs != [t.ty()] {
                        return Err(IrError::Graph(format!(
                            "constant `{}` declares type {} but holds {}",
                            node.name,
                            node.outputs[0],
                            t.ty()
                        )));
                    }
                    continue;
                }
                _ if input_set.contains(&id) => {
                    return Err(IrError::Graph(format!(
                        "graph input `{}` is a {} node",
                        node.name,
                        node.op.name()
                    )));
                }
                _ => {}
            }
            let operands = self.operands(id);
            let inferred = self.infer_node(&node.name, &node.op, &operands, node.outputs.len())?;
            for (i, (have, want)) in node.outputs.iter().zip(&inferred).enumerate() {
                if !type_matches(have, want) {
                    return Err(IrError::shape(
                        node.name.clone(),
                        node.op.name(),
                        OpError::ResultType {
                            index: i,
                            declared: Box::new(have.clone()),
                            inferred: Box::new(want.clone()),
                        },
                    ));
                }
            }
        }
        for (name, v) in &self.outputs {
            self.check_value(*v)
                .map_err(|e| IrError::Graph(format!("graph output `{name}`: {e}")))?;
        }
        Ok(())
    }
}

/// A declared type agrees with an inferred one when dtypes and ranks agree and each inferred fixed
/// size is declared the same (a declared symbol may stand for an inferred symbol of another name).
fn type_matches(declared: &TensorType, inferred: &TensorType) -> bool {
    declared.dtype == inferred.dtype
        && declared.rank() == inferred.rank()
        && declared.shape.dims().iter().zip(inferred.shape.dims()).all(|(d, i)| {
            match (d.fixed(), i.fixed()) {
                (Some(a), Some(b)) => a == b,
                (None, None) => true,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            }
        })
}

/// Whether `operands` (present or omitted, by position) fit `op`'s arity: at most its maximum
/// slots, and every required one present.
pub(crate) fn check_arity(
    op: &Op,
    operands: &[Option<ValueId>],
) -> std::result::Result<(), OpError> {
    let (min, max) = op.arity();
    if operands.len() > max
        || operands.len() < min
        || operands.iter().take(min).any(|o| o.is_none())
    {
        let present = operands.iter().filter(|o| o.is_some()).count();
        return Err(OpError::Arity { min, max, present, slots: operands.len() });
    }
    Ok(())
}

/// Every result type of a node must fit in memory's address space (`size::check_type`): a
/// shape whose element count overflows is refused here, naming the node, so no later product
/// of its dimensions wraps.
fn check_sizes(name: &str, op: &Op, types: &[TensorType]) -> Result<()> {
    for t in types {
        crate::size::check_type(t).map_err(|error| IrError::shape(name, op.name(), error))?;
    }
    Ok(())
}
