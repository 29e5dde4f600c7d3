//! Graph import: initializers, inputs, nodes in order, outputs; subgraphs with captured values.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::proto::{self, attribute_type as at, type_proto, GraphProto, ModelProto, NodeProto};
use super::tensor::{dtype_of, sparse_to_dense, tensor_from_proto};
use super::{ops, Model};
use crate::builder::{GraphBuilder, Traced};
use crate::op::{Attr, Attrs};
use crate::{Dim, Graph, IrError, Op, Result, Shape, TensorType, UnsupportedOp, ValueId};

pub(super) fn import_model(
    model: &ModelProto,
    base_dir: Option<&Path>,
    options: &super::ImportOptions,
) -> Result<Model> {
    let opsets: Vec<(String, i64)> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(1)))
        .collect();
    let opset = opsets.iter().find(|(d, _)| d.is_empty() || d == "ai.onnx").map_or(1, |(_, v)| *v);
    let mut warnings = Vec::new();
    if opset > super::NEWEST_OPSET {
        let what = format!("the model imports opset {opset} of the default ONNX domain; kiln knows opsets up to {}", super::NEWEST_OPSET);
        if !options.allow_newer_opsets {
            return Err(IrError::NotSupported(format!(
                "{what}, and an op may mean something else in a newer one (--allow-newer-opsets imports it anyway)"
            )));
        }
        warnings.push(format!(
            "{what}; imported as opset {} (--allow-newer-opsets)",
            super::NEWEST_OPSET
        ));
    }
    let opset = opset.min(super::NEWEST_OPSET);
    let graph = model.graph.as_ref().expect("decode_model checked the graph");
    check_supported(graph, &opsets)?;
    let name = graph.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "model".into());
    let imported = GraphImporter::new(&name, opset, base_dir).import(graph, &[])?;
    Ok(Model {
        graph: imported,
        ir_version: model.ir_version.unwrap_or(0),
        opsets,
        producer: [
            model.producer_name.clone().unwrap_or_default(),
            model.producer_version.clone().unwrap_or_default(),
        ]
        .join(" ")
        .trim()
        .to_string(),
        warnings,
    })
}

/// Lists every node, in every subgraph, whose op kiln does not support; an error if any.
fn check_supported(graph: &GraphProto, opsets: &[(String, i64)]) -> Result<()> {
    let found = check_supported_list(graph, opsets);
    if found.is_empty() {
        Ok(())
    } else {
        Err(IrError::Unsupported(found))
    }
}

/// The ops of `graph` (and its subgraphs) kiln does not support, each with the nodes using it.
pub(super) fn check_supported_list(
    graph: &GraphProto,
    opsets: &[(String, i64)],
) -> Vec<UnsupportedOp> {
    let mut found: Vec<UnsupportedOp> = Vec::new();
    let mut visit = |node: &NodeProto| {
        let domain = node.domain.clone().unwrap_or_default();
        let op_type = node.op_type.clone().unwrap_or_default();
        let default_domain = domain.is_empty() || domain == "ai.onnx";
        if default_domain && ops::is_supported(&op_type) {
            return;
        }
        if domain == "com.microsoft" && super::quantized::MICROSOFT.contains(&op_type.as_str()) {
            return;
        }
        if domain == super::training::DOMAIN && super::training::OPS.contains(&op_type.as_str()) {
            return;
        }
        if domain == super::preview::DOMAIN && super::preview::OPS.contains(&op_type.as_str()) {
            return;
        }
        let opset = opsets
            .iter()
            .find(|(d, _)| *d == domain || (default_domain && (d.is_empty() || d == "ai.onnx")))
            .map_or(0, |(_, v)| *v);
        if domain == super::ml::DOMAIN && super::ml::supports(&op_type, opset) {
            return;
        }
        let shown_domain = if default_domain { "ai.onnx".to_string() } else { domain.clone() };
        let name = node_label(node);
        match found.iter_mut().find(|u| u.op_type == op_type && u.domain == shown_domain) {
            Some(u) => u.nodes.push(name),
            None => found.push(UnsupportedOp {
                op_type,
                domain: shown_domain,
                opset,
                nodes: vec![name],
            }),
        }
    };
    walk_nodes(graph, &mut visit);
    found
}

/// Calls `f` on every node of `graph` and of its subgraphs.
fn walk_nodes(graph: &GraphProto, f: &mut impl FnMut(&NodeProto)) {
    for node in &graph.node {
        f(node);
        for a in &node.attribute {
            if let Some(g) = &a.g {
                walk_nodes(g, f);
            }
            for g in &a.graphs {
                walk_nodes(g, f);
            }
        }
    }
}

/// A node's name for messages: its name, else its first output.
pub(super) fn node_label(node: &NodeProto) -> String {
    match node.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => node
            .output
            .iter()
            .find(|o| !o.is_empty())
            .cloned()
            .unwrap_or_else(|| node.op_type.clone().unwrap_or_default()),
    }
}

/// The names a graph reads from enclosing scopes, in order of first use.
pub(super) fn free_values(graph: &GraphProto) -> Vec<String> {
    let mut defined: HashSet<&str> =
        graph.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    defined.extend(
        graph
            .sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref().and_then(|v| v.name.as_deref())),
    );
    defined.extend(graph.input.iter().filter_map(|i| i.name.as_deref()));
    let mut free: Vec<String> = Vec::new();
    let need = |name: &str, defined: &HashSet<&str>, free: &mut Vec<String>| {
        if !name.is_empty() && !defined.contains(name) && !free.iter().any(|f| f == name) {
            free.push(name.to_string());
        }
    };
    for node in &graph.node {
        for i in &node.input {
            need(i, &defined, &mut free);
        }
        for a in &node.attribute {
            for g in a.g.as_deref().into_iter().chain(&a.graphs) {
                for name in free_values(g) {
                    need(&name, &defined, &mut free);
                }
            }
        }
        defined.extend(node.output.iter().map(String::as_str));
    }
    for o in &graph.output {
        if let Some(n) = &o.name {
            need(n, &defined, &mut free);
        }
    }
    free
}

/// The order to import nodes in: as given when that is topological (the spec requires it),
/// else a topological order; a cycle or a name nothing defines is an error naming the node.
fn node_order(g: &GraphProto, known: &HashSet<&str>) -> Result<Vec<usize>> {
    // What each node reads: its inputs, then the values a Gradient's attributes name (its y is
    // no input, yet it must be imported first).
    let reads: Vec<Vec<&str>> = g
        .node
        .iter()
        .map(|n| {
            n.input.iter().map(String::as_str).chain(super::training::named_values(n)).collect()
        })
        .collect();
    let mut defined: HashSet<&str> = known.clone();
    let mut in_order = true;
    for (n, reads) in g.node.iter().zip(&reads) {
        if reads.iter().any(|i| !i.is_empty() && !defined.contains(i)) {
            in_order = false;
            break;
        }
        defined.extend(n.output.iter().map(String::as_str));
    }
    if in_order {
        return Ok((0..g.node.len()).collect());
    }
    let producer: HashMap<&str, usize> = g
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
        .collect();
    let mut order = Vec::with_capacity(g.node.len());
    // 0: not visited, 1: on the current path, 2: done. Depth-first with an explicit stack of
    // (node, next input to look at): a long chain of nodes given in reverse must not overflow
    // the thread's stack (30,000 did).
    let mut state = vec![0u8; g.node.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..g.node.len() {
        if state[root] == 2 {
            continue;
        }
        state[root] = 1;
        stack.push((root, 0));
        while let Some(&mut (i, ref mut k)) = stack.last_mut() {
            let inputs = &reads[i];
            if *k == inputs.len() {
                state[i] = 2;
                order.push(i);
                stack.pop();
                continue;
            }
            let input = inputs[*k];
            let at = *k;
            *k += 1;
            if input.is_empty() || known.contains(input) {
                continue;
            }
            let Some(&p) = producer.get(input) else {
                let n = &g.node[i];
                if at >= n.input.len() {
                    // A name from a Gradient's attributes: its import says which attribute.
                    continue;
                }
                let (label, op) = (node_label(n), n.op_type.as_deref().unwrap_or(""));
                return Err(IrError::Onnx(format!(
                    "node `{label}` ({op}): input {at} `{input}` is not defined by any node, initializer or graph input"
                )));
            };
            match state[p] {
                2 => {}
                1 => {
                    return Err(IrError::Onnx(format!(
                        "the graph has a cycle through node `{}`",
                        node_label(&g.node[p])
                    )))
                }
                _ => {
                    state[p] = 1;
                    stack.push((p, 0));
                }
            }
        }
    }
    Ok(order)
}

/// Builds one kiln graph from one ONNX graph.
pub(super) struct GraphImporter<'a> {
    pub(super) graph: Graph,
    /// ONNX value name -> kiln value.
    pub(super) values: HashMap<String, ValueId>,
    pub(super) opset: i64,
    pub(super) base_dir: Option<&'a Path>,
    /// The types a subgraph's own inputs take when they declare none (ONNX lets a Loop body
    /// leave them to the Loop's operands).
    pub(super) implied_input_types: Vec<TensorType>,
    /// The names the graph's Gradient nodes differentiate by or hold constant (their xs and
    /// zs): a node reading one is never folded into a constant, which would cut y's
    /// dependence on it (an x is often an initializer, and `Transpose(w)` would fold).
    variables: HashSet<String>,
    /// Values of enclosing graphs the graph reads that are known constants, which it takes as
    /// constants rather than inputs (an inlined branch's shape arithmetic then folds, and an If
    /// nested in it whose condition they decide is inlined in turn).
    pub(super) constant_captures: Vec<(String, crate::Tensor)>,
}

impl<'a> GraphImporter<'a> {
    pub(super) fn new(name: &str, opset: i64, base_dir: Option<&'a Path>) -> GraphImporter<'a> {
        GraphImporter {
            graph: Graph::new(name),
            values: HashMap::new(),
            opset,
            base_dir,
            implied_input_types: Vec::new(),
            variables: HashSet::new(),
            constant_captures: Vec::new(),
        }
    }

    /// Imports `g`; `captures` are values of enclosing graphs it reads, which become its first inputs.
    pub(super) fn import(
        mut self,
        g: &GraphProto,
        captures: &[(String, TensorType)],
    ) -> Result<Graph> {
        let onnx_err = |m: String| IrError::Onnx(m);
        self.variables =
            g.node.iter().flat_map(super::training::variables).map(str::to_string).collect();
        for (name, ty) in captures {
            let kiln_name = self.graph.unique_name(name);
            let v = self.graph.add_input(&kiln_name, ty.clone())?;
            self.values.insert(name.clone(), v);
        }
        for (name, t) in std::mem::take(&mut self.constant_captures) {
            let kiln_name = self.graph.unique_name(&name);
            let v = self.graph.add_constant(&kiln_name, t)?;
            self.values.insert(name, v);
        }
        for t in &g.initializer {
            let name = t
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| onnx_err("an initializer has no name".into()))?;
            let tensor = tensor_from_proto(t, self.base_dir)?;
            let kiln_name = self.graph.unique_name(&name);
            let v = self.graph.add_constant(&kiln_name, tensor)?;
            self.values.insert(name, v);
        }
        for s in &g.sparse_initializer {
            let name = s
                .values
                .as_ref()
                .and_then(|v| v.name.clone())
                .filter(|n| !n.is_empty())
                .ok_or_else(|| onnx_err("a sparse initializer has no name".into()))?;
            let tensor = sparse_to_dense(s, self.base_dir)?;
            let kiln_name = self.graph.unique_name(&name);
            let v = self.graph.add_constant(&kiln_name, tensor)?;
            self.values.insert(name, v);
        }
        for (i, input) in g.input.iter().enumerate() {
            let name = input
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| onnx_err("a graph input has no name".into()))?;
            // Old exporters list initializers as inputs too: the initializer wins (a constant).
            if self.values.contains_key(&name) {
                continue;
            }
            let implied = self
                .implied_input_types
                .get(i)
                .filter(|_| input.r#type.as_ref().and_then(|t| t.value.as_ref()).is_none());
            let ty = match implied {
                Some(t) => t.clone(),
                None => {
                    value_type(input).map_err(|e| e.context(format!("graph input `{name}`")))?
                }
            };
            let kiln_name = self.graph.unique_name(&name);
            let v = self.graph.add_input(&kiln_name, ty)?;
            self.values.insert(name, v);
        }
        let known: HashSet<&str> = self.values.keys().map(String::as_str).collect();
        for i in node_order(g, &known)? {
            self.node(&g.node[i])?;
        }
        for output in &g.output {
            let name = output.name.clone().unwrap_or_default();
            let v = *self.values.get(&name).ok_or_else(|| {
                onnx_err(format!("graph output `{name}` is not produced by any node"))
            })?;
            let out_name = if self.graph.outputs().iter().any(|(n, _)| *n == name) {
                self.graph.unique_name(&name)
            } else {
                name
            };
            self.graph.add_output(&out_name, v)?;
        }
        Ok(self.graph)
    }

    fn node(&mut self, node: &NodeProto) -> Result<()> {
        let label = node_label(node);
        let op_type = node.op_type.clone().unwrap_or_default();
        for (i, name) in node.input.iter().enumerate() {
            if !name.is_empty() && !self.values.contains_key(name) {
                return Err(IrError::Onnx(format!(
                    "node `{label}` ({op_type}): input {i} `{name}` is not available (its producer does not make it)"
                )));
            }
        }
        ops::convert(self, node, &op_type).map_err(|e| match e {
            IrError::Onnx(m) => IrError::Onnx(format!("node `{label}` ({op_type}): {m}")),
            IrError::NotSupported(m) => {
                IrError::NotSupported(format!("node `{label}` ({op_type}): {m}"))
            }
            // `ops::attr` leaves the node to this wrapper (one in a body already has its own).
            IrError::Attr { node, error, .. } if node.is_empty() => {
                IrError::Attr { node: label, op: op_type.clone(), error }
            }
            other => other,
        })
    }

    /// The kiln value of operand `i` of `node`; `None` when it is omitted.
    pub(super) fn operand(&self, node: &NodeProto, i: usize) -> Option<ValueId> {
        node.input.get(i).filter(|n| !n.is_empty()).and_then(|n| self.values.get(n).copied())
    }

    pub(super) fn operands(&self, node: &NodeProto) -> Vec<Option<ValueId>> {
        (0..node.input.len()).map(|i| self.operand(node, i)).collect()
    }

    pub(super) fn ty(&self, v: ValueId) -> &TensorType {
        self.graph.value_type(v)
    }

    /// A fresh kiln node name for `node`, with `suffix` for the extra nodes of a decomposition.
    pub(super) fn name_for(&self, node: &NodeProto, suffix: &str) -> String {
        let base = node_label(node);
        let base = if suffix.is_empty() { base } else { format!("{base}/{suffix}") };
        self.graph.unique_name(&base)
    }

    /// Adds a kiln node for (part of) an ONNX node, or constants when its results are known now
    /// (shape arithmetic collapses this way, so later nodes see real shapes), except where it
    /// reads a Gradient's variable; returns its results.
    pub(super) fn add(
        &mut self,
        node: &NodeProto,
        suffix: &str,
        op: Op,
        operands: &[Option<ValueId>],
        num_outputs: usize,
    ) -> Result<Vec<ValueId>> {
        let name = self.name_for(node, suffix);
        let variable = |v: &ValueId| self.variables.iter().any(|n| self.values.get(n) == Some(v));
        // Shape and Size read only their operand's type, which a derivative never changes: they
        // fold even on a variable, so a Reshape to `Shape(x)` keeps x's fixed sizes.
        let reads_values = !matches!(op, Op::Shape { .. } | Op::Size);
        let folded = if reads_values && operands.iter().flatten().any(variable) {
            None
        } else {
            crate::fold::fold(&self.graph, &op, operands, num_outputs)
        };
        if let Some(results) = folded {
            let mut out = Vec::with_capacity(results.len());
            for (i, t) in results.into_iter().enumerate() {
                let n = if i == 0 {
                    name.clone()
                } else {
                    self.graph.unique_name(&format!("{name}#{i}"))
                };
                out.push(self.graph.add_constant(&n, t)?);
            }
            return Ok(out);
        }
        let id = self.graph.add_node_with_outputs(&name, op, operands, num_outputs)?;
        Ok((0..num_outputs).map(|i| ValueId::new(id, i)).collect())
    }

    /// Adds one node of one result for the part `part` of `node` (see `add`): the common case
    /// of an import-time expansion.
    pub(super) fn add1(
        &mut self,
        node: &NodeProto,
        part: &str,
        op: Op,
        operands: &[ValueId],
    ) -> Result<ValueId> {
        let operands: Vec<Option<ValueId>> = operands.iter().copied().map(Some).collect();
        Ok(self.add(node, part, op, &operands, 1)?[0])
    }

    /// `x` reshaped to one axis (a Reshape to the constant `[-1]`), as the part `part` of `node`.
    pub(super) fn flatten(&mut self, node: &NodeProto, part: &str, x: ValueId) -> Result<ValueId> {
        let flat =
            self.constant(node, &format!("{part}_shape"), crate::Tensor::vector(&[-1i64]))?;
        self.add1(node, part, Op::Reshape { allowzero: false }, &[x, flat])
    }

    /// Expands a node into ops traced with the builder on this graph (so the expansion is the
    /// same code a Rust user calls, as the optimizers and training-mode BatchNormalization are);
    /// returns the ids of the values `f` gives. The graph is handed to the builder and back, not
    /// copied; on an error the import fails as a whole, so its loss does not matter.
    pub(super) fn trace(
        &mut self,
        f: impl for<'b> FnOnce(&'b GraphBuilder) -> Result<Vec<Traced<'b>>>,
    ) -> Result<Vec<ValueId>> {
        let graph = std::mem::replace(&mut self.graph, Graph::new(""));
        let b = GraphBuilder::from_graph(graph);
        let ids: Result<Option<Vec<ValueId>>> = f(&b).map(|vs| vs.iter().map(Traced::id).collect());
        // The builder's own error (an op that failed inference) comes first: a value that failed
        // to trace is only its consequence.
        self.graph = b.into_graph()?;
        ids?.ok_or_else(|| IrError::Graph("an expanded value failed to trace".into()))
    }

    /// Adds a constant for (part of) an ONNX node.
    pub(super) fn constant(
        &mut self,
        node: &NodeProto,
        suffix: &str,
        t: crate::Tensor,
    ) -> Result<ValueId> {
        let name = self.name_for(node, suffix);
        self.graph.add_constant(&name, t)
    }

    /// Binds the ONNX node's outputs to kiln values, in order; empty names are skipped.
    pub(super) fn bind(&mut self, node: &NodeProto, values: &[ValueId]) -> Result<()> {
        for (name, v) in node.output.iter().zip(values) {
            if !name.is_empty() {
                self.values.insert(name.clone(), *v);
            }
        }
        Ok(())
    }

    /// How many results the node declares (trailing omitted ones do not count).
    pub(super) fn num_outputs(node: &NodeProto) -> usize {
        node.output.iter().rposition(|o| !o.is_empty()).map_or(0, |i| i + 1)
    }

    /// Whether a Gradient node of the graph differentiates by `name` or holds it constant.
    pub(super) fn is_variable(&self, name: &str) -> bool {
        self.variables.contains(name)
    }

    /// The types of every value visible here, for the captures of a subgraph.
    pub(super) fn visible_type(&self, name: &str) -> Option<TensorType> {
        self.values.get(name).map(|v| self.ty(*v).clone())
    }

    /// The values of this graph that `sub`, a graph to be inlined here, reads (`free`, its
    /// free names; `reader` names it in the error for one not defined): small constants
    /// (shape arithmetic, up to `SMALL_CAPTURE` elements, not a Gradient's variable) go into
    /// `sub` as constants, so it folds as the graph around it does (an If nested in it on a
    /// size known here is taken in turn); the others become its capture inputs, returned with
    /// the ids to inline it on.
    pub(super) fn inline_captures(
        &self,
        free: Vec<String>,
        sub: &mut GraphImporter,
        reader: &str,
    ) -> Result<(Captures, Vec<ValueId>)> {
        let mut captures = Vec::new();
        let mut ids = Vec::new();
        for n in free {
            let v = *self.values.get(&n).ok_or_else(|| {
                IrError::Onnx(format!("{reader} reads `{n}`, which is not defined before it"))
            })?;
            let small = self.graph.constant_value(v).filter(|t| t.len() <= SMALL_CAPTURE);
            match small.filter(|_| !self.is_variable(&n)).cloned() {
                Some(t) => sub.constant_captures.push((n, t)),
                None => {
                    captures.push((n, self.ty(v).clone()));
                    ids.push(v);
                }
            }
        }
        Ok((captures, ids))
    }
}

/// The most elements a constant an inlined If branch reads may have to be copied into it as a
/// constant (weights stay inputs: the copy would double them until the import is pruned).
pub(super) const SMALL_CAPTURE: usize = 1024;

/// The outer values a subgraph takes as inputs: each one's name and type.
pub(super) type Captures = Vec<(String, TensorType)>;

/// A type kiln does not take (a map, an input without a shape...).
fn unsupported(msg: &str) -> IrError {
    IrError::NotSupported(msg.into())
}

/// The declared type of a graph input.
fn value_type(v: &proto::ValueInfoProto) -> std::result::Result<TensorType, IrError> {
    let name = v.name.as_deref().unwrap_or("");
    match v.r#type.as_ref() {
        None => Err(unsupported("an input without a type is not supported")),
        Some(t) => type_of(t, name),
    }
}

/// A kiln type from an ONNX type: a tensor (which must have a rank), a sequence of tensors or an
/// optional tensor or sequence (whose elements may leave their rank open).
pub(super) fn type_of(
    t: &proto::TypeProto,
    name: &str,
) -> std::result::Result<TensorType, IrError> {
    match t.value.as_ref() {
        Some(type_proto::Value::TensorType(t)) => {
            let (dtype, shape) = tensor_type_of(t, name)?;
            // No shape at all: kiln needs the rank.
            let shape = shape.ok_or_else(|| {
                unsupported("an input without a shape is not supported (kiln needs the rank)")
            })?;
            Ok(TensorType::new(dtype, shape))
        }
        Some(type_proto::Value::SequenceType(s)) => {
            let (dtype, shape) = sequence_elements(s, name)?;
            Ok(TensorType::sequence(dtype, shape, None))
        }
        Some(type_proto::Value::OptionalType(o)) => match o
            .elem_type
            .as_deref()
            .and_then(|e| e.value.as_ref())
        {
            Some(type_proto::Value::TensorType(t)) => {
                let (dtype, shape) = tensor_type_of(t, name)?;
                let ranked = shape.is_some();
                Ok(TensorType {
                    dtype,
                    shape: shape.unwrap_or_else(Shape::scalar),
                    kind: crate::Kind::Optional { sequence: false, ranked },
                })
            }
            Some(type_proto::Value::SequenceType(s)) => {
                let (dtype, shape) = sequence_elements(s, name)?;
                Ok(TensorType::optional(&TensorType::sequence(dtype, shape, None)))
            }
            _ => Err(unsupported(
                "an optional of anything but a tensor or a sequence of tensors is not supported",
            )),
        },
        Some(type_proto::Value::MapType(_)) => {
            Err(unsupported("a map is not supported (tensors, sequences and optionals only)"))
        }
        Some(type_proto::Value::SparseTensorType(_)) => {
            Err(unsupported("a sparse tensor is not supported (dense tensors only)"))
        }
        None => Err(unsupported("an input without a type is not supported")),
    }
}

fn sequence_elements(
    s: &type_proto::Sequence,
    name: &str,
) -> std::result::Result<(crate::DType, Option<Shape>), IrError> {
    match s.elem_type.as_deref().and_then(|e| e.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => tensor_type_of(t, name),
        _ => Err(unsupported("a sequence of anything but tensors is not supported")),
    }
}

/// A tensor type's dtype and shape (`None` when it declares no shape).
fn tensor_type_of(
    t: &type_proto::Tensor,
    name: &str,
) -> std::result::Result<(crate::DType, Option<Shape>), IrError> {
    let dtype = dtype_of(t.elem_type.unwrap_or(0))?;
    let shape = t.shape.as_ref().map(|s| {
        Shape(
            s.dim
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    use proto::tensor_shape_proto::dimension::Value;
                    match &d.value {
                        Some(Value::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                        Some(Value::DimParam(p)) if !p.is_empty() && p != "?" => Dim::sym(p),
                        // Unnamed, missing, or negative: Paddle2ONNX and some TF exporters
                        // write -1 for "dynamic", and onnxruntime runs such models.
                        Some(Value::DimValue(_)) | Some(Value::DimParam(_)) | None => {
                            Dim::sym(&format!("{name}_d{i}"))
                        }
                    }
                })
                .collect(),
        )
    });
    Ok((dtype, shape))
}

/// A node's attributes as kiln attributes (graphs stay out: the ops that take them read them).
pub(super) fn attrs_of(node: &NodeProto, base_dir: Option<&Path>) -> Result<Attrs> {
    let mut out = Attrs::new();
    for (i, a) in node.attribute.iter().enumerate() {
        let name = a.name.clone().unwrap_or_default();
        // ONNX requires the name. Refused at the first, before the rest are converted: a node of
        // 5 million empty attributes converted them all (400 MB) to be refused after.
        if name.is_empty() {
            return Err(IrError::Onnx(format!(
                "attribute {i} (of {}) has no name, which ONNX requires",
                node.attribute.len()
            )));
        }
        if a.ref_attr_name.as_deref().is_some_and(|r| !r.is_empty()) {
            return Err(IrError::NotSupported(format!(
                "attribute `{name}` refers to a function attribute, which is not supported"
            )));
        }
        let ty = a.r#type.unwrap_or_else(|| guess_type(a));
        let utf8 = |b: &[u8]| {
            String::from_utf8(b.to_vec())
                .map_err(|_| IrError::Onnx(format!("attribute `{name}` is not UTF-8")))
        };
        let value = match ty {
            at::FLOAT => Attr::Float(a.f.unwrap_or(0.0)),
            at::INT => Attr::Int(a.i.unwrap_or(0)),
            at::STRING => Attr::Str(utf8(a.s.as_deref().unwrap_or_default())?),
            at::FLOATS => Attr::Floats(a.floats.clone()),
            at::INTS => Attr::Ints(a.ints.clone()),
            at::STRINGS => Attr::Strs(
                a.strings.iter().map(|s| utf8(s)).collect::<std::result::Result<_, _>>()?,
            ),
            at::TENSOR => Attr::Tensor(tensor_from_proto(
                a.t.as_ref()
                    .ok_or_else(|| IrError::Onnx(format!("attribute `{name}` has no tensor")))?,
                base_dir,
            )?),
            at::SPARSE_TENSOR => Attr::Tensor(sparse_to_dense(
                a.sparse_tensor
                    .as_ref()
                    .ok_or_else(|| IrError::Onnx(format!("attribute `{name}` has no tensor")))?,
                base_dir,
            )?),
            // Graphs and types are read by the ops that take them.
            at::GRAPH | at::TYPE_PROTO => continue,
            at::TENSORS | at::GRAPHS | at::SPARSE_TENSORS | at::TYPE_PROTOS => {
                return Err(IrError::NotSupported(format!("attribute `{name}` is a list of tensors, graphs or types, which is not supported")));
            }
            other => {
                return Err(IrError::Onnx(format!(
                    "attribute `{name}` has an unknown type {other}"
                )))
            }
        };
        out.push(&name, value);
    }
    Ok(out)
}

/// Very old models leave `type` unset; the field that is present tells.
fn guess_type(a: &proto::AttributeProto) -> i32 {
    if a.t.is_some() {
        at::TENSOR
    } else if a.g.is_some() {
        at::GRAPH
    } else if a.s.is_some() {
        at::STRING
    } else if a.f.is_some() {
        at::FLOAT
    } else if !a.ints.is_empty() {
        at::INTS
    } else if !a.floats.is_empty() {
        at::FLOATS
    } else if !a.strings.is_empty() {
        at::STRINGS
    } else {
        at::INT
    }
}
