//! A symbolic batch: `kiln compile` without sizes for a model whose only unknown dimension is
//! its inputs' leading one. `plan` decides, as a pure function of the graph and the options,
//! whether every sample of that batch is computed from its own rows alone (so that a batch of
//! `n` is exactly the concatenation of smaller batches) and which batch sizes get a program.
//! The driver compiles one static program per size; the runtime splits a batch into chunks of
//! those sizes (`kiln_runtime::artifact::BatchDesc`).

use std::collections::{HashMap, HashSet};
use std::fmt;

use kiln_ir::op::OpFamily;
use kiln_ir::{normalize_axis, Dim, Graph, Node, NodeId, Op, TensorType, ValueId};

use crate::passes::specialize;
use crate::{CompileError, Options, Result};

/// Programs are compiled for the powers of two up to this size (and the range's end). A batch
/// of 8 runs as one program; 13 as 8 + 4 + 1.
pub const LARGEST_PROGRAM: usize = 8;
/// The batch size the analysis specialises the graph to: above 1, so a dimension that stays 1
/// (broadcast) is told from the batch, and not a size models often have.
const PROBE: usize = 7;
/// An unbounded range's end.
pub const NO_LIMIT: usize = i32::MAX as usize;

/// What a symbolic-batch compile makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// The batch's symbol, as the model names it.
    pub symbol: String,
    /// The batch sizes a run may have, inclusive.
    pub min: usize,
    pub max: usize,
    /// Per graph input (per output): whether its leading axis is the batch.
    pub inputs: Vec<bool>,
    pub outputs: Vec<bool>,
    /// Every input's sizes with the batch left out (its leading dimension 1 when batched).
    pub shapes: Vec<(String, Vec<usize>)>,
    /// The batch sizes with a program, largest first (always ending with 1).
    pub sizes: Vec<usize>,
}

impl BatchPlan {
    /// The options that compile the program for batch `size`.
    pub fn options_for(&self, options: &Options, size: usize) -> Options {
        Options {
            input_shapes: shapes_at(&self.shapes, &self.inputs, size),
            batch_ranges: HashMap::new(),
            ..options.clone()
        }
    }
}

/// Every input's sizes with the batched ones' leading dimension set to `size`.
fn shapes_at(
    shapes: &[(String, Vec<usize>)],
    batched: &[bool],
    size: usize,
) -> HashMap<String, Vec<usize>> {
    shapes
        .iter()
        .zip(batched)
        .map(|((name, dims), &b)| {
            let mut dims = dims.clone();
            if b {
                dims[0] = size;
            }
            (name.clone(), dims)
        })
        .collect()
}

impl fmt::Display for BatchPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |flags: &[bool], names: &mut dyn Iterator<Item = String>| {
            let v: Vec<String> = names.zip(flags).filter(|(_, &b)| b).map(|(n, _)| n).collect();
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let max = if self.max == NO_LIMIT { String::new() } else { self.max.to_string() };
        writeln!(f, "batch `{}` in {}..{max}", self.symbol, self.min)?;
        writeln!(
            f,
            "  batched inputs: {}",
            names(&self.inputs, &mut self.shapes.iter().map(|(n, _)| n.clone()))
        )?;
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        write!(f, "  programs for batch {}", sizes.join(", "))
    }
}

/// Whether `graph` compiles as a symbolic batch under `options`. `None`: not such a compile
/// (every size is given, values are bound, or more than the leading dimension is unknown:
/// specialisation then says what is missing). An error: the batch is there, but some node
/// mixes samples (a reduction over the batch, a Reshape that moves it), named with its op.
pub fn plan(graph: &Graph, options: &Options) -> Result<Option<BatchPlan>> {
    if !options.input_values.is_empty() {
        return Ok(None);
    }
    let Some((symbol, shapes, inputs, (min, max))) = batch_inputs(graph, options)? else {
        return Ok(None);
    };
    // Analyse the graph specialised to a probe batch: shapes static, shape arithmetic still there.
    let mut g = graph.clone();
    let probe = shapes_at(&shapes, &inputs, PROBE);
    let first = shapes
        .iter()
        .zip(&inputs)
        .find(|(_, &b)| b)
        .map(|((n, _), _)| n.clone())
        .unwrap_or_default();
    let refuse = |node: Option<(String, &'static str)>, why: String| CompileError::NotBatchable {
        input: first.clone(),
        symbol: symbol.clone(),
        node,
        why,
    };
    // A leading symbol that is not a batch (a sequence length beside a fixed-size state) fails here.
    specialize::specialize(&mut g, &probe).map_err(|e| {
        refuse(None, format!("the model does not hold for a batch of {PROBE} ({e})"))
    })?;
    let sized = fold_shapes(&mut g, &inputs).map_err(|e| {
        refuse(None, format!("its shape arithmetic fails for a batch of {PROBE} ({e})"))
    })?;
    let outputs = separable(&g, &inputs, &sized).map_err(|(node, why)| {
        refuse(node.map(|n| (g.node(n).name.clone(), g.node(n).op.name())), why)
    })?;
    let mut sizes: Vec<usize> = (0..usize::BITS)
        .map(|p| 1usize << p)
        .take_while(|&s| s <= max.min(LARGEST_PROGRAM))
        .collect();
    sizes.reverse();
    Ok(Some(BatchPlan { symbol, min, max, inputs, outputs, shapes, sizes }))
}

type BatchInputs = (String, Vec<(String, Vec<usize>)>, Vec<bool>, (usize, usize));

/// Binds every input's dimensions from the given shapes (as specialisation does); when what is
/// left unknown is one symbol, the leading dimension of the inputs that have it, that is the batch.
fn batch_inputs(graph: &Graph, options: &Options) -> Result<Option<BatchInputs>> {
    let mut bound: HashMap<String, usize> = HashMap::new();
    let mut shapes: Vec<(String, Vec<Option<usize>>)> = Vec::new();
    let mut range: Option<(usize, usize)> = None;
    let mut unknown: Vec<(String, usize)> = Vec::new(); // (symbol, axis)
    for &id in graph.inputs() {
        let name = graph.node(id).name.clone();
        let declared = &graph.node(id).outputs[0];
        let given: Option<Vec<Option<usize>>> = if let Some(d) = options.input_shapes.get(&name) {
            Some(d.iter().map(|&n| Some(n)).collect())
        } else if let Some((lo, hi, d)) = options.batch_ranges.get(&name) {
            if !matches!(declared.shape.dims().first(), Some(Dim::Sym(_))) {
                return Err(CompileError::Usage(format!(
                    "--input-shape gives `{name}` a range of batch sizes, but its leading dimension is not symbolic ({declared})"
                )));
            }
            range = Some(range.map_or((*lo, *hi), |(a, b)| (a.max(*lo), b.min(*hi))));
            Some(std::iter::once(None).chain(d.iter().skip(1).map(|&n| Some(n))).collect())
        } else {
            None
        };
        let dims: Vec<Option<usize>> = match given {
            Some(d) => {
                fits(&name, declared, &d, &mut bound)?;
                d
            }
            None => declared
                .shape
                .dims()
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Some(*n),
                    Dim::Sym(s) => bound.get(&**s).copied(),
                })
                .collect(),
        };
        for (axis, (d, decl)) in dims.iter().zip(declared.shape.dims()).enumerate() {
            if let (None, Dim::Sym(s)) = (d, decl) {
                unknown.push((s.to_string(), axis));
            }
        }
        shapes.push((name, dims));
    }
    let Some((symbol, _)) = unknown.first().cloned() else { return Ok(None) };
    if unknown.iter().any(|(s, axis)| *s != symbol || *axis != 0) {
        return Ok(None);
    }
    let (min, max) = range.unwrap_or((1, NO_LIMIT));
    if min == 0 || min > max {
        return Err(CompileError::Usage(format!(
            "the batch range {min}..{max} is empty (sizes start at 1)"
        )));
    }
    let inputs: Vec<bool> = shapes.iter().map(|(_, d)| d.first() == Some(&None)).collect();
    let shapes = shapes
        .into_iter()
        .map(|(n, d)| (n, d.into_iter().map(|x| x.unwrap_or(1)).collect()))
        .collect();
    Ok(Some((symbol, shapes, inputs, (min, max))))
}

/// Checks given sizes (`None`: the batch, left open) against a declared type, binding its symbols.
fn fits(
    name: &str,
    declared: &TensorType,
    dims: &[Option<usize>],
    bound: &mut HashMap<String, usize>,
) -> Result<()> {
    let show = |d: &[Option<usize>]| {
        d.iter().map(|x| x.map_or("N".to_string(), |n| n.to_string())).collect::<Vec<_>>().join(",")
    };
    let bad = || {
        CompileError::Usage(format!(
            "input `{name}` is {declared}, which the shape [{}] does not fit",
            show(dims)
        ))
    };
    if dims.len() != declared.rank() {
        return Err(bad());
    }
    for (d, n) in declared.shape.dims().iter().zip(dims) {
        match (d, n) {
            (Dim::Fixed(m), Some(n)) if m != n => return Err(bad()),
            (Dim::Sym(s), Some(n)) => {
                if let Some(&prev) = bound.get(&**s) {
                    if prev != *n {
                        return Err(CompileError::Usage(format!(
                            "`{s}` is {prev} in an earlier input but {n} in `{name}`"
                        )));
                    }
                }
                bound.insert(s.to_string(), *n);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Folds what the probe batch makes constant (shape arithmetic) and returns the constants that
/// hold the batch size or a value computed from it, told apart from constants of the model.
fn fold_shapes(g: &mut Graph, batched_inputs: &[bool]) -> Result<HashSet<NodeId>> {
    // The nodes whose values depend on a batched input's data (not only its sizes).
    let mut data: HashSet<NodeId> = HashSet::new();
    for id in g.topo_order()? {
        let node = g.node(id);
        let from_input = matches!(node.op, Op::Input)
            && g.inputs().iter().position(|&x| x == id).is_some_and(|i| batched_inputs[i]);
        let sizes_only = matches!(node.op, Op::Shape { .. } | Op::Size);
        if from_input
            || (!sizes_only && g.operands(id).iter().flatten().any(|v| data.contains(&v.node)))
        {
            data.insert(id);
        }
    }
    let mut sized: HashSet<NodeId> = HashSet::new();
    loop {
        let mut changed = false;
        for id in g.topo_order()? {
            let node = g.node(id).clone();
            if matches!(node.op, Op::Input | Op::Constant(_)) {
                continue;
            }
            let operands = g.operands(id);
            let Some(results) = kiln_ir::fold::fold(g, &node.op, &operands, node.outputs.len())
            else {
                continue;
            };
            let of_batch = operands
                .iter()
                .flatten()
                .any(|v| sized.contains(&v.node) || data.contains(&v.node));
            for (i, t) in results.into_iter().enumerate() {
                let c = g.add_constant(&g.unique_name(&format!("{}.folded{i}", node.name)), t)?;
                g.replace_uses(ValueId::new(id, i), c)?;
                if of_batch {
                    sized.insert(c.node);
                }
            }
            changed = true;
        }
        if !changed {
            break;
        }
        crate::passes::fold::remove_dead(g)?;
        g.reinfer()?;
    }
    Ok(sized)
}

/// How a value depends on the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dep {
    /// Not at all: the same for every sample and every batch size.
    Free,
    /// On the batch size only (shape arithmetic from a `Shape` of a batched tensor).
    Sized,
    /// Its leading axis is the batch, and each row depends only on that sample's rows.
    Batched,
}

type Refusal = (Option<NodeId>, String);

/// Walks the graph (specialised to the probe batch) from the batched inputs and returns, per
/// graph output, whether it is batched; or the node that mixes samples and why.
fn separable(
    g: &Graph,
    batched_inputs: &[bool],
    sized: &HashSet<NodeId>,
) -> std::result::Result<Vec<bool>, Refusal> {
    let mut dep: HashMap<ValueId, Dep> = HashMap::new();
    let order = g.topo_order().map_err(|e| (None, e.to_string()))?;
    for id in order {
        let node = g.node(id);
        let operands = g.operands(id);
        let deps: Vec<Dep> = operands.iter().map(|v| v.map_or(Dep::Free, |v| dep[&v])).collect();
        let d = match &node.op {
            Op::Input => {
                let i = g
                    .inputs()
                    .iter()
                    .position(|&x| x == id)
                    .expect("an Input node is a graph input");
                if batched_inputs[i] {
                    Dep::Batched
                } else {
                    Dep::Free
                }
            }
            Op::Constant(_) if sized.contains(&id) => Dep::Sized,
            _ => rule(g, id, &operands, &deps).map_err(|why| (Some(id), why))?,
        };
        for k in 0..node.outputs.len() {
            dep.insert(ValueId::new(id, k), d);
        }
    }
    g.outputs()
        .iter()
        .map(|(name, v)| match dep[v] {
            Dep::Batched => Ok(true),
            Dep::Free => Ok(false),
            Dep::Sized => Err((
                None,
                format!("`{name}` is computed from the batch size, not from the samples"),
            )),
        })
        .collect()
}

/// What a rule decides for a node: how its results depend on the batch, or why it mixes samples.
type Verdict = std::result::Result<Dep, String>;

/// The dependence of a node's results on the batch, given its operands'.
fn rule(g: &Graph, id: NodeId, operands: &[Option<ValueId>], deps: &[Dep]) -> Verdict {
    let node = g.node(id);
    let any_batched = deps.contains(&Dep::Batched);
    if !any_batched && !deps.contains(&Dep::Sized) {
        return Ok(Dep::Free);
    }
    let n = NodeDeps::new(g, id, operands, deps);
    if !any_batched {
        // Only shape arithmetic on the batch size, unless the op makes a tensor that size.
        return match &node.op {
            Op::ConstantOfShape { .. } | Op::Expand | Op::Tile => n.leading_is_batch(),
            _ => Ok(Dep::Sized),
        };
    }
    // The batch size may only shape a result.
    let sized_ok: &[usize] = match &node.op {
        Op::Reshape { .. } | Op::Expand => &[1],
        _ => &[],
    };
    if let Some(i) = (0..deps.len()).find(|i| deps[*i] == Dep::Sized && !sized_ok.contains(i)) {
        return Err(format!(
            "uses the batch size as a value (operand {i}, from the Shape of a batched tensor)"
        ));
    }
    match node.op.family() {
        OpFamily::Source => unreachable!("inputs and constants have no operands"),
        OpFamily::Elementwise => elementwise(&n),
        OpFamily::Contraction => contraction(&n),
        OpFamily::Window => window(&n),
        OpFamily::Normalize => normalize(&n),
        OpFamily::Reduce => reduce(&n),
        OpFamily::Movement => movement(&n),
        OpFamily::Indexing => indexing(&n),
        OpFamily::Generate => generate(&n),
        OpFamily::Resize => resize(&n),
        OpFamily::Sequence => sequence(&n),
        OpFamily::Loss => loss(&n),
        // A transform along an axis that is not the batch's would trace; none is yet.
        OpFamily::Signal => untraced(&node.op),
        OpFamily::Control => control(&n),
        OpFamily::Quantize => quantize(&n),
        OpFamily::Collection => collection(&n),
        // Strings run on the host, never in a batched program.
        OpFamily::Strings => untraced(&node.op),
    }
}

/// A node with operands that depend on the batch, as its family's rule sees it: its operands and
/// how each depends on the batch.
struct NodeDeps<'g> {
    g: &'g Graph,
    node: &'g Node,
    operands: &'g [Option<ValueId>],
    deps: &'g [Dep],
    /// The ranks of operand 0 and of result 0.
    x_rank: usize,
    out_rank: usize,
}

impl<'g> NodeDeps<'g> {
    fn new(g: &'g Graph, id: NodeId, operands: &'g [Option<ValueId>], deps: &'g [Dep]) -> Self {
        let node = g.node(id);
        let mut n =
            NodeDeps { g, node, operands, deps, x_rank: 0, out_rank: node.outputs[0].rank() };
        n.x_rank = n.rank(0);
        n
    }

    fn op(&self) -> &'g Op {
        &self.node.op
    }

    fn batched(&self, i: usize) -> bool {
        self.deps.get(i) == Some(&Dep::Batched)
    }

    fn ty(&self, i: usize) -> Option<&'g TensorType> {
        self.operands.get(i).copied().flatten().map(|v| self.g.value_type(v))
    }

    fn rank(&self, i: usize) -> usize {
        self.ty(i).map_or(0, |t| t.rank())
    }

    fn given(&self, i: usize) -> bool {
        self.operands.get(i).copied().flatten().is_some()
    }

    fn constant(&self, i: usize) -> Option<Vec<i64>> {
        self.operands
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| self.g.constant_value(v))
            .map(|t| t.to_i64s())
    }

    /// Only the operands at `positions` may be batched.
    fn only(&self, positions: &[usize]) -> std::result::Result<(), String> {
        match (0..self.deps.len()).find(|i| self.deps[*i] == Dep::Batched && !positions.contains(i))
        {
            Some(i) => Err(format!(
                "takes a batched tensor as operand {i}, which it does not treat per sample"
            )),
            None => Ok(()),
        }
    }

    /// Operands that broadcast against a batched one: batched ones rank-aligned with the
    /// result, others size 1 (or absent) on the batch axis.
    fn broadcast(&self) -> std::result::Result<(), String> {
        let out_rank = self.out_rank;
        for (i, d) in self.deps.iter().enumerate() {
            let Some(t) = self.ty(i) else { continue };
            match d {
                Dep::Batched if t.rank() != out_rank => {
                    return Err(format!("broadcasts batched operand {i} ({t}) to rank {out_rank}"))
                }
                Dep::Free
                    if t.rank() == out_rank
                        && t.shape.dims().first().is_some_and(|d| !d.is_one()) =>
                {
                    return Err(format!(
                        "combines the batch with operand {i} ({t}), which is not per sample"
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The node's verdict once its family's rule found nothing that mixes samples.
    fn leading_is_batch(&self) -> Verdict {
        leading_is_batch(self.node.outputs.as_slice())
    }
}

fn axis_not_batch(axis: i64, r: usize, what: &str) -> std::result::Result<(), String> {
    match normalize_axis(axis, r) {
        Some(0) => Err(format!("works along the batch axis ({what} {axis})")),
        _ => Ok(()),
    }
}

fn axes_not_batch(axes: Option<Vec<i64>>, r: usize, what: &str) -> std::result::Result<(), String> {
    let axes = axes.ok_or_else(|| format!("has {what} computed at run time"))?;
    axes.iter().try_for_each(|&a| axis_not_batch(a, r, what))
}

/// A family's rule for an op it has none for: refused, as nothing shows that its samples stay
/// apart.
fn untraced(op: &Op) -> Verdict {
    Err(format!("is a {}, which kiln does not trace per sample", op.name()))
}

fn elementwise(n: &NodeDeps) -> Verdict {
    match n.op() {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Clip
        | Op::Where
        | Op::Cast { .. }
        | Op::BitCast { .. }
        | Op::Identity => n.broadcast()?,
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn contraction(n: &NodeDeps) -> Verdict {
    let (ty, rank) = (|i| n.ty(i), |i| n.rank(i));
    let (x_rank, out_rank) = (n.x_rank, n.out_rank);
    match n.op() {
        Op::MatMul => {
            // The batch is a row axis of A, or a broadcast (stack) axis of both.
            if n.batched(0) && (x_rank < 2 || x_rank != out_rank) {
                return Err(format!(
                    "multiplies a batched {} with the batch among its rows or columns",
                    ty(0).expect("operand")
                ));
            }
            if n.batched(1) && (rank(1) < 3 || rank(1) != out_rank) {
                return Err("multiplies by a batched matrix along the batch".into());
            }
            for (i, d) in n.deps.iter().enumerate().take(2) {
                let t = ty(i).expect("MatMul has two operands");
                if *d == Dep::Free
                    && t.rank() >= 3
                    && t.rank() == out_rank
                    && !t.shape.dims()[0].is_one()
                {
                    return Err(format!("multiplies the batch with a stack of matrices ({t}) that is not per sample"));
                }
            }
        }
        Op::Gemm(gemm) => {
            n.only(&[0])?;
            if gemm.trans_a {
                return Err(
                    "reads its batched A transposed (the batch is then a reduction axis)".into()
                );
            }
            if ty(2).is_some_and(|t| t.rank() == 2 && !t.shape.dims()[0].is_one()) {
                return Err(
                    "adds a C with as many rows as the batch, which is not per sample".into()
                );
            }
        }
        Op::Einsum { .. } => return Err("is an Einsum, whose batch kiln does not trace".into()),
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn window(n: &NodeDeps) -> Verdict {
    match n.op() {
        Op::Conv(_) | Op::QConv(_) | Op::ConvTranspose(_) | Op::Pool(_) | Op::GlobalPool(_) => {
            n.only(&[0])?
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn normalize(n: &NodeDeps) -> Verdict {
    let x_rank = n.x_rank;
    match n.op() {
        Op::BatchNorm { .. } | Op::InstanceNorm { .. } | Op::GroupNorm { .. } | Op::Lrn(_) => {
            n.only(&[0])?
        }
        Op::Softmax { axis }
        | Op::LogSoftmax { axis }
        | Op::Hardmax { axis }
        | Op::LpNorm { axis, .. } => {
            n.only(&[0])?;
            axis_not_batch(*axis, x_rank, "axis")?;
        }
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => {
            n.only(&[0])?;
            axis_not_batch(*axis, x_rank, "normalising from axis")?;
        }
        Op::MeanVarianceNorm { axes } => {
            n.only(&[0])?;
            axes_not_batch(Some(axes.clone()), x_rank, "axes")?;
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn reduce(n: &NodeDeps) -> Verdict {
    let x_rank = n.x_rank;
    match n.op() {
        Op::Reduce(r) => {
            n.only(&[0])?;
            match n.operands.get(1).copied().flatten() {
                None if r.noop_with_empty_axes => {}
                None => return Err("reduces every axis, the batch among them".into()),
                Some(_) => axes_not_batch(n.constant(1), x_rank, "axes")?,
            }
        }
        Op::ArgReduce(a) => {
            n.only(&[0])?;
            axis_not_batch(a.axis, x_rank, "axis")?;
        }
        Op::Cumulative(_) => {
            n.only(&[0])?;
            axes_not_batch(n.constant(1), x_rank, "axis")?;
        }
        Op::TopK { axis, .. } => {
            n.only(&[0])?;
            axis_not_batch(*axis, x_rank, "axis")?;
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn movement(n: &NodeDeps) -> Verdict {
    let (ty, constant) = (|i| n.ty(i), |i| n.constant(i));
    let (x_rank, out_rank, deps, node) = (n.x_rank, n.out_rank, n.deps, n.node);
    match n.op() {
        Op::Reshape { allowzero } => {
            n.only(&[0])?;
            if deps[1] == Dep::Free {
                // A constant shape: its leading entry must follow the batch (0 copies it, -1 infers it).
                let shape = constant(1).ok_or("has a shape computed at run time")?;
                match shape.first() {
                    Some(0) if !allowzero => {}
                    Some(-1) => {}
                    _ => {
                        return Err(format!(
                            "reshapes to the constant shape {shape:?}, which fixes the batch size"
                        ))
                    }
                }
            }
            if ty(0).and_then(|t| t.shape.dims().first().cloned())
                != node.outputs[0].shape.dims().first().cloned()
            {
                return Err(format!(
                    "reshapes {} to {}, which moves the batch",
                    ty(0).expect("operand"),
                    node.outputs[0]
                ));
            }
        }
        Op::Flatten { axis } => {
            if normalize_axis(*axis, x_rank + 1) == Some(0) {
                return Err("flattens the batch into the samples (axis 0)".into());
            }
        }
        Op::Transpose { perm } => {
            if perm.first().is_some_and(|&p| p != 0) {
                return Err(format!("moves the batch axis (perm {perm:?})"));
            }
        }
        Op::Squeeze => {
            n.only(&[0])?;
            if !n.given(1) {
                return Err(
                    "squeezes every size-1 axis, which takes the batch away at batch 1".into()
                );
            }
            axes_not_batch(constant(1), x_rank, "axes")?;
        }
        Op::Unsqueeze => {
            n.only(&[0])?;
            axes_not_batch(constant(1), out_rank, "axes")?;
        }
        Op::Concat { axis } => {
            if let Some(i) = deps.iter().position(|d| *d != Dep::Batched) {
                return Err(format!("joins the batch with operand {i}, which is not per sample"));
            }
            axis_not_batch(*axis, out_rank, "axis")?;
        }
        Op::Split { axis, .. } => {
            n.only(&[0])?;
            axis_not_batch(*axis, x_rank, "axis")?;
        }
        Op::Slice => {
            n.only(&[0])?;
            let (starts, ends) = (
                constant(1).ok_or("has starts computed at run time")?,
                constant(2).ok_or("has ends computed at run time")?,
            );
            let axes = if n.given(3) {
                constant(3).ok_or("has axes computed at run time")?
            } else {
                (0..starts.len() as i64).collect()
            };
            let steps = if n.given(4) {
                constant(4).ok_or("has steps computed at run time")?
            } else {
                vec![1; starts.len()]
            };
            for (k, &a) in axes.iter().enumerate() {
                // A malformed Slice (more axes than starts) is refused here, not indexed past its end.
                let whole = starts.get(k) == Some(&0)
                    && steps.get(k) == Some(&1)
                    && ends.get(k).is_some_and(|&e| e >= i32::MAX as i64);
                if normalize_axis(a, x_rank) == Some(0) && !whole {
                    return Err("slices the batch axis".into());
                }
            }
        }
        Op::Gather { axis } => match (n.batched(0), n.batched(1)) {
            (true, false) => axis_not_batch(*axis, x_rank, "axis")?,
            (false, true) if normalize_axis(*axis, x_rank) == Some(0) => {}
            _ => return Err("gathers across the batch".into()),
        },
        Op::Expand => {
            n.only(&[0])?;
            if x_rank != out_rank {
                return Err(
                    "broadcasts the batched tensor to a higher rank, which moves the batch".into(),
                );
            }
            if deps[1] == Dep::Free && constant(1).is_some_and(|s| s.len() == out_rank && s[0] != 1)
            {
                return Err("expands the batch axis to a constant size".into());
            }
        }
        // Each sample's image is read at that sample's points.
        Op::GridSample { .. } => n.only(&[0, 1])?,
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn indexing(n: &NodeDeps) -> Verdict {
    let constant = |i| n.constant(i);
    let (x_rank, out_rank, deps) = (n.x_rank, n.out_rank, n.deps);
    match n.op() {
        Op::GatherElements { axis } | Op::ScatterElements { axis, .. } => {
            if deps.iter().any(|d| *d != Dep::Batched) {
                return Err("indexes a batched tensor with one that is not per sample".into());
            }
            axis_not_batch(*axis, x_rank, "axis")?;
        }
        Op::GatherNd { batch_dims } => {
            if *batch_dims == 0 || !(n.batched(0) && n.batched(1)) {
                return Err("gathers across the batch (batch_dims 0)".into());
            }
        }
        Op::ScatterNd { .. } => return Err("scatters into a batched tensor by index tuples".into()),
        Op::Tile => {
            n.only(&[0])?;
            if constant(1).is_none_or(|r| r.first() != Some(&1)) {
                return Err("repeats the batch axis".into());
            }
        }
        Op::Pad { .. } => {
            n.only(&[0])?;
            let pads = constant(1).ok_or("has pads computed at run time")?;
            let axes: Vec<i64> = if n.given(3) {
                constant(3).ok_or("has axes computed at run time")?
            } else {
                (0..x_rank as i64).collect()
            };
            let k_axes = axes.len();
            for (k, &a) in axes.iter().enumerate() {
                if normalize_axis(a, x_rank) == Some(0)
                    && (pads.get(k) != Some(&0) || pads.get(k + k_axes) != Some(&0))
                {
                    return Err("pads the batch axis".into());
                }
            }
        }
        Op::OneHot { axis } => {
            n.only(&[0])?;
            axis_not_batch(*axis, out_rank, "axis")?;
        }
        Op::Trilu { .. } => {
            n.only(&[0])?;
            if x_rank < 3 {
                return Err("takes the triangle of a matrix whose rows are the batch".into());
            }
        }
        Op::DepthToSpace { .. } | Op::SpaceToDepth { .. } => n.only(&[0])?,
        Op::NonZero | Op::Compress { .. } => {
            return Err("has a result whose size depends on the data".into())
        }
        Op::ReverseSequence { batch_axis, .. } => {
            if *batch_axis != 0 {
                return Err("has its batch on another axis".into());
            }
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn generate(n: &NodeDeps) -> Verdict {
    match n.op() {
        Op::Shape { start, end } => {
            // The dimensions start..end of a batched tensor: the batch size when they include 0.
            let r = n.x_rank as i64;
            let clamp = |a: i64| if a < 0 { (a + r).max(0) } else { a.min(r) };
            let (s, e) = (clamp(*start), end.map_or(r, clamp));
            Ok(if s == 0 && e > 0 { Dep::Sized } else { Dep::Free })
        }
        Op::Size => Ok(Dep::Sized),
        Op::EyeLike { .. } | Op::Range | Op::ConstantOfShape { .. } => {
            Err("makes a tensor shaped by a batched one".into())
        }
        op => untraced(op),
    }
}

fn resize(n: &NodeDeps) -> Verdict {
    let x_rank = n.x_rank;
    match n.op() {
        Op::Resize(r) => {
            n.only(&[0])?;
            let axes: Vec<usize> = if r.axes.is_empty() {
                (0..x_rank).collect()
            } else {
                r.axes.iter().filter_map(|&a| normalize_axis(a, x_rank)).collect()
            };
            if let Some(k) = axes.iter().position(|&a| a == 0) {
                if n.given(3) && n.constant(3).is_none_or(|s| !s.is_empty()) {
                    return Err("gives the batch axis a size".into());
                }
                let scales = n
                    .operands
                    .get(2)
                    .copied()
                    .flatten()
                    .and_then(|v| n.g.constant_value(v))
                    .map(|t| t.to_f64s());
                if scales.is_some_and(|s| s.get(k).is_some_and(|&s| s != 1.0)) {
                    return Err("scales the batch axis".into());
                }
            }
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn sequence(n: &NodeDeps) -> Verdict {
    let (ty, deps) = (|i| n.ty(i), n.deps);
    match n.op() {
        Op::Rnn(r) => {
            n.only(&[0, 4, 5, 6])?;
            if !r.batch_first {
                return Err("has its batch on axis 1 (layout 0)".into());
            }
        }
        Op::Attention(_) => {
            n.only(&[0, 1, 2, 3, 4, 5])?;
            if ty(3).is_some_and(|t| {
                deps[3] == Dep::Free && t.rank() == 4 && !t.shape.dims()[0].is_one()
            }) {
                return Err("masks with a tensor that is not per sample".into());
            }
        }
        Op::RotaryEmbedding(_) => n.only(&[0, 3])?,
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn loss(n: &NodeDeps) -> Verdict {
    match n.op() {
        Op::NllLoss(_) | Op::SoftmaxCrossEntropyLoss(_) => {
            Err("is a loss, which reduces over the batch".into())
        }
        op => untraced(op),
    }
}

fn control(n: &NodeDeps) -> Verdict {
    let (ty, deps) = (|i| n.ty(i), n.deps);
    match n.op() {
        Op::Scan(_) => return Err("is a Scan, whose steps kiln does not trace per sample".into()),
        Op::Loop(_) => return Err("is a Loop, whose steps kiln does not trace per sample".into()),
        Op::If { then_branch, else_branch } => {
            if deps[0] != Dep::Free {
                return Err("branches on a batched value".into());
            }
            // Each branch, typed as its captured operands are, must treat them per sample.
            let mut each = Vec::new();
            for branch in [&then_branch.0, &else_branch.0] {
                let mut b = (**branch).clone();
                for i in 0..b.inputs().len() {
                    let t = ty(i + 1).ok_or("a captured value is missing")?.clone();
                    b.set_input_type(i, t).map_err(|e| e.to_string())?;
                }
                let flags: Vec<bool> = deps[1..].iter().map(|d| *d == Dep::Batched).collect();
                if deps[1..].contains(&Dep::Sized) {
                    return Err("passes the batch size into a branch".into());
                }
                let outputs =
                    separable(&b, &flags, &HashSet::new()).map_err(|(node, why)| match node {
                        Some(n) => format!(
                            "has a branch `{}` whose node `{}` ({}) {why}",
                            b.name,
                            b.node(n).name,
                            b.node(n).op.name()
                        ),
                        None => format!("has a branch `{}` where {why}", b.name),
                    })?;
                each.extend(outputs);
            }
            if each.iter().all(|&b| !b) {
                return Ok(Dep::Free);
            }
            if each.contains(&false) {
                return Err("has results of which some are per sample and some are not".into());
            }
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn quantize(n: &NodeDeps) -> Verdict {
    match n.op() {
        // Per element; a scale per position of an axis must not be per position of the batch.
        Op::Quantize { axis, block_size, .. } | Op::Dequantize { axis, block_size } => {
            n.only(&[0])?;
            let per_tensor =
                n.ty(1).is_some_and(|t| t.shape.numel() == Some(1)) && *block_size == 0;
            if !per_tensor {
                axis_not_batch(*axis, n.x_rank, "scale axis")?;
            }
        }
        // Row by row: only the rows may carry the batch (a rank-1 input has no batch axis of
        // its own to keep).
        Op::MatMulNBits { .. } => {
            n.only(&[0])?;
            if n.x_rank < 2 {
                return Err("multiplies a single row, which has no batch axis".into());
            }
        }
        op => return untraced(op),
    }
    n.leading_is_batch()
}

fn collection(n: &NodeDeps) -> Verdict {
    match n.op() {
        Op::Sequence(_) | Op::Optional(_) => {
            Err("is a sequence or optional op, which kiln does not trace per sample".into())
        }
        op => untraced(op),
    }
}

/// Every result's leading dimension is the probe batch: the batch is still axis 0.
fn leading_is_batch(outputs: &[TensorType]) -> std::result::Result<Dep, String> {
    match outputs.iter().find(|t| t.shape.dims().first() != Some(&Dim::Fixed(PROBE))) {
        Some(t) => Err(format!("gives {t}, whose leading axis is not the batch")),
        None => Ok(Dep::Batched),
    }
}
