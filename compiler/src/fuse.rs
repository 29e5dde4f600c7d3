//! Fusion: partitions a graph into kernels, the units of codegen and of launch.
//!
//! - Shape-only ops (Reshape, Flatten, Squeeze, Unsqueeze) are *views*: no kernel, their result
//!   is the same bytes under another shape. Where the target allows it (the CPU), so are Slices,
//!   Splits and Gathers of one index whose results are contiguous runs of their input's bytes (a channel range of one
//!   image, rows of a matrix, one of the leading blocks): their results are those bytes, at an
//!   offset, and the kernels that read them read the input where it lies.
//! - Every other node belongs to exactly one kernel. A kernel is a chain: at most one *root*
//!   (anything but an elementwise op: matmul, conv, pooling, a reduction, softmax, a
//!   normalisation, data movement...) followed by elementwise consumers fused in (bias,
//!   activation, residual add, scale, clip); or an elementwise chain alone. An elementwise node
//!   joins its producer's kernel when it reads the kernel's last value, is its only reader, keeps
//!   its shape, and its other operands do not depend on that kernel.
//! - Ops with several results are kernels of their own.
//!
//! The kernels come back in a valid launch order.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use kiln_ir::{Graph, NodeId, Op, ValueId};

use crate::Result;

/// Constants this small are folded into the kernels that read them instead of being buffers.
pub const INLINE_CONSTANT: usize = 16;

/// One fused kernel.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The symbol: `k<i>_<first node>` sanitised.
    pub name: String,
    /// What it computes, for people: `conv1: Conv + Relu`.
    pub label: String,
    /// Its nodes, in topological order; the first is the root when there is one.
    pub nodes: Vec<NodeId>,
    /// Values it reads from outside (graph inputs, weights, views, other kernels' results), in a
    /// fixed order; small constants are not among them (they are inlined).
    pub inputs: Vec<ValueId>,
    /// Values it produces that are read outside it or are graph outputs.
    pub outputs: Vec<ValueId>,
    /// For a copy kernel (no nodes): the graph output index it writes.
    pub copy_to_output: Option<usize>,
}

/// The partition of a graph.
#[derive(Clone, Debug)]
pub struct Partition {
    /// In launch order.
    pub kernels: Vec<Kernel>,
    /// View results and the bytes they share.
    pub views: HashMap<ValueId, View>,
}

/// A value that is bytes of another: `of`'s bytes from `offset` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct View {
    pub of: ValueId,
    pub offset: u64,
}

/// What a target lets fusion make views of (`Rules::views`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Views {
    /// Shape-only ops (every target: their views never move the bytes' start).
    ShapeOnly,
    /// Also contiguous Slices and Splits (a target whose buffers can start anywhere, as a
    /// pointer can; OpenCL sub-buffers must start aligned).
    WithOffsets,
}

/// Shape-only ops: a new shape on the same bytes (all shapes are static after specialisation).
pub fn is_view(op: &Op) -> bool {
    op.is_view()
}

/// Elementwise ops fuse into one loop nest.
pub fn is_elementwise(op: &Op) -> bool {
    op.is_elementwise()
}

/// Whether node `id` is a Clip with constant bounds of the result of a kernel that is one
/// integer convolution: the CPU's integer kernel stores its result within the bounds (the
/// `integer` pass writes a Relu or Clip before a QuantizeLinear as such a Clip), so it joins
/// that kernel, which stays closed to anything else.
fn clips_integer_result(graph: &Graph, kernel: &[NodeId], id: NodeId) -> bool {
    let [root] = kernel else { return false };
    if !matches!(graph.node(*root).op, Op::QConv(_)) || !matches!(graph.node(id).op, Op::Clip) {
        return false;
    }
    let ops = graph.operands(id);
    ops.first().copied().flatten().is_some_and(|v| v.node == *root)
        && ops[1..].iter().flatten().all(|&b| graph.constant_value(b).is_some_and(|t| t.len() == 1))
}

/// Whether node `id` is an Add of a constant column bias (`[M]`, `[1, M]`...) to the result of a
/// kernel that is one dynamically quantized product: the CPU's kernel adds it as it stores (the
/// bias onnxruntime's quantizer leaves after the dequantizing Mul), and the kernel stays closed
/// to anything else.
fn biases_dynamic_product(graph: &Graph, kernel: &[NodeId], id: NodeId) -> bool {
    let [root] = kernel else { return false };
    if !matches!(graph.node(*root).op, Op::DynQMatMul)
        || !matches!(graph.node(id).op, Op::Binary(kiln_ir::BinaryOp::Add))
    {
        return false;
    }
    let ops: Vec<ValueId> = graph.operands(id).into_iter().flatten().collect();
    let [a, b] = ops[..] else { return false };
    let (product, bias) = if a.node == *root { (a, b) } else { (b, a) };
    let m = graph.value_type(product).shape.dims().last().and_then(|d| d.fixed());
    product.node == *root
        && bias.node != *root
        && graph.constant_value(bias).is_some_and(|t| {
            let d = t.dims();
            Some(t.len()) == m && d.iter().rev().skip(1).all(|&x| x == 1) && d.len() <= 2
        })
}

/// Whether a value is a constant small enough to inline into kernels.
pub fn is_inline_constant(graph: &Graph, v: ValueId) -> bool {
    graph.constant_value(v).is_some_and(|t| t.len() <= INLINE_CONSTANT)
}

pub fn partition(graph: &Graph, allowed: Views) -> Result<Partition> {
    partition_in_place(graph, allowed, &HashSet::new())
}

/// [`partition`] of a graph whose inputs `in_place` have outputs written over them
/// (`Options::in_place`): an elementwise node that reads one of them (directly or through a
/// view) starts a kernel, or joins one that is elementwise alone, never a kernel with a root.
/// A root (a matrix product, a convolution, a reduction) may store partial results into its
/// output before its epilogue reads the elementwise operands, and its output may be the bytes
/// of that very input (the optimizer's update fused after a weight's gradient): only a kernel
/// that is elementwise alone reads each element before it writes it, at the same index, in
/// the same thread (`inplace::plan` checks the writers).
pub fn partition_in_place(
    graph: &Graph,
    allowed: Views,
    in_place: &HashSet<ValueId>,
) -> Result<Partition> {
    let order = graph.topo_order()?;
    let mut views: HashMap<ValueId, View> = HashMap::new();
    let mut kernel_of: HashMap<NodeId, usize> = HashMap::new();
    let mut kernels: Vec<Vec<NodeId>> = Vec::new();
    // Kernels a kernel reads from (its direct producers).
    let mut deps: Vec<HashSet<usize>> = Vec::new();
    // Whether a kernel can still take elementwise consumers.
    let mut open: Vec<bool> = Vec::new();

    for &id in &order {
        let node = graph.node(id);
        if matches!(node.op, Op::Input | Op::Constant(_)) {
            continue;
        }
        let operands: Vec<ValueId> = graph.operands(id).into_iter().flatten().collect();
        if is_view(&node.op) {
            views.insert(id.into(), resolve_view(&views, operands[0]));
            continue;
        }
        // (Results that are only graph outputs would each need a copy kernel: the node's own
        // kernel writes them at no more cost.)
        let read_by_kernels =
            || (0..node.outputs.len()).any(|i| !graph.users(ValueId::new(id, i)).is_empty());
        if allowed == Views::WithOffsets && read_by_kernels() {
            if let Some(offsets) = contiguous_parts(graph, id) {
                let source = resolve_view(&views, operands[0]);
                for (i, offset) in offsets.into_iter().enumerate() {
                    views.insert(
                        ValueId::new(id, i),
                        View { of: source.of, offset: source.offset + offset },
                    );
                }
                continue;
            }
        }
        // The kernels each operand comes from (through views).
        let producer = |v: ValueId| kernel_of.get(&resolve_view(&views, v).of.node).copied();
        let operand_kernels: Vec<Option<usize>> = operands.iter().map(|&v| producer(v)).collect();
        let mut joined = None;
        if is_elementwise(&node.op) && node.outputs.len() == 1 {
            for &v in &operands {
                let Some(k) = producer(v) else { continue };
                let tail = *kernels[k].last().expect("kernels are not empty");
                let reads_tail = v.node == tail && v.output == 0;
                let only_reader =
                    graph.users(v).len() == 1 && !graph.outputs().iter().any(|(_, o)| *o == v);
                let same_shape = graph.value_type(v).shape == node.outputs[0].shape;
                // Other operands must be computable before kernel k runs.
                let acyclic = operands
                    .iter()
                    .filter(|&&o| o != v)
                    .all(|&o| producer(o).is_none_or(|j| j != k && !depends_on(&deps, j, k)));
                let takes = open[k]
                    || clips_integer_result(graph, &kernels[k], id)
                    || biases_dynamic_product(graph, &kernels[k], id);
                let reads_in_place =
                    operands.iter().any(|&o| in_place.contains(&resolve_view(&views, o).of));
                let rooted = kernels[k].iter().any(|&n| !is_elementwise(&graph.node(n).op));
                if reads_in_place && rooted {
                    continue;
                }
                if takes && reads_tail && only_reader && same_shape && acyclic {
                    joined = Some(k);
                    break;
                }
            }
        }
        if let Some(k) = joined {
            // Another operand's elementwise chain, read only here, joins as well when both
            // chains are elementwise alone: a residual Add of two dequantized tensors then reads
            // both byte tensors in one kernel instead of one chain writing its floats for it.
            let chains: Vec<(ValueId, usize)> = operands
                .iter()
                .filter_map(|&v| producer(v).filter(|&j| j != k).map(|j| (v, j)))
                .collect();
            for (v, j) in chains {
                if mergeable_chain(graph, &kernels, &open, &deps, &kernel_of, j, k, v, id) {
                    let moved = std::mem::take(&mut kernels[j]);
                    for &n in &moved {
                        kernel_of.insert(n, k);
                    }
                    kernels[k].splice(0..0, moved);
                    let inherited: Vec<usize> = deps[j].drain().filter(|&d| d != k).collect();
                    deps[k].extend(inherited);
                    open[j] = false;
                }
            }
        }
        let k = match joined {
            Some(k) => {
                kernels[k].push(id);
                k
            }
            None => {
                kernels.push(vec![id]);
                deps.push(HashSet::new());
                // Multi-result ops stay alone, and so does attention (on the CPU, where it
                // reaches fusion, its kernel has no epilogue); everything else takes elementwise
                // consumers.
                open.push(
                    node.outputs.len() == 1
                        && !matches!(
                            node.op,
                            Op::Attention(_)
                                | Op::QConv(_)
                                | Op::DynQMatMul
                                | Op::MatMulNBits { .. }
                        ),
                );
                kernels.len() - 1
            }
        };
        kernel_of.insert(id, k);
        for j in operand_kernels.into_iter().flatten() {
            if j != k && !kernels[j].is_empty() {
                deps[k].insert(j);
            }
        }
    }

    // Graph outputs that no kernel writes (inputs, constants, views, or a value listed twice)
    // get a copy kernel: every output has its own buffer.
    let mut written: HashSet<ValueId> = HashSet::new();
    let mut copies: Vec<(usize, ValueId)> = Vec::new();
    for (i, (_, v)) in graph.outputs().iter().enumerate() {
        let produced_by_kernel = kernel_of.contains_key(&v.node);
        if !produced_by_kernel || !written.insert(*v) {
            copies.push((i, *v));
        }
    }

    // Concats whose parts their producers can write in place: no kernel of their own.
    let placed = if allowed == Views::WithOffsets {
        concat_views(graph, &kernels, &kernel_of, &mut views)
    } else {
        HashSet::new()
    };
    // (Chains merged into another kernel left theirs empty.)
    let order: Vec<usize> = launch_order(&deps)?
        .into_iter()
        .filter(|&k| !kernels[k].is_empty() && !placed.contains(&k))
        .collect();
    let mut out = Vec::with_capacity(order.len() + copies.len());
    for (n, &k) in order.iter().enumerate() {
        out.push(finish_kernel(graph, &kernels[k], n));
    }
    for (i, v) in copies {
        let n = out.len();
        let name = format!("k{n}_output{i}_copy");
        out.push(Kernel {
            name,
            label: format!("copy of output {i}"),
            nodes: Vec::new(),
            // The copy reads the value under its own shape (a view aliases its source's bytes).
            inputs: vec![v],
            outputs: vec![v],
            copy_to_output: Some(i),
        });
    }
    Ok(Partition { kernels: out, views })
}

/// Concats whose parts are written where they lie in the result: a Concat that is a kernel of
/// its own, whose result is one contiguous run of bytes per part (every axis before the concat
/// axis of extent 1: one image) and no graph output. Each part is bytes of a value some other
/// kernel writes (itself, or the source it is a view of: a C2f block's two Split halves are
/// both its first convolution's result); each such root must lie whole in the result over its
/// own parts only, start 64 bytes aligned (kernels store to it as to any buffer), and be no
/// graph input, output or constant, and no result already placed. Each root becomes a view of
/// the result at its offset, and every view of a root a view of the result, so the kernel
/// writing a root writes it into the result and the Concat's copy is gone (squeezenet's fire
/// modules, a YOLO neck's C2f blocks, a text detector's FPN). Returns the kernels (indices into
/// `kernels`) no longer needed. The artifact gives the result one buffer alive from the first
/// writer's wave on ([`crate::artifact`]), and readers of a part read the result's bytes.
fn concat_views(
    graph: &Graph,
    kernels: &[Vec<NodeId>],
    kernel_of: &HashMap<NodeId, usize>,
    views: &mut HashMap<ValueId, View>,
) -> HashSet<usize> {
    let outputs: HashSet<ValueId> = graph.outputs().iter().map(|(_, v)| *v).collect();
    let bytes = |v: ValueId| -> Option<u64> {
        let t = graph.value_type(v);
        let dims = t.shape.as_fixed()?;
        Some(dims.iter().map(|&d| d as u64).product::<u64>() * t.dtype.size() as u64)
    };
    let mut taken: HashSet<ValueId> = HashSet::new();
    let mut placed = HashSet::new();
    for (k, nodes) in kernels.iter().enumerate() {
        let [id] = nodes[..] else { continue };
        let node = graph.node(id);
        let Op::Concat { axis } = node.op else { continue };
        let result = ValueId::new(id, 0);
        let Some(dims) = node.outputs[0].shape.as_fixed() else { continue };
        let Some(a) = kiln_ir::normalize_axis(axis, dims.len()) else { continue };
        if outputs.contains(&result) || dims[..a].iter().any(|&d| d != 1) {
            continue;
        }
        let parts: Vec<ValueId> = graph.operands(id).into_iter().flatten().collect();
        if parts.iter().collect::<HashSet<_>>().len() != parts.len() {
            continue;
        }
        // Each part's bytes in the result, and each root's start there (the same for all
        // of its parts).
        let mut spans: Vec<(u64, u64, ValueId)> = Vec::with_capacity(parts.len());
        let mut roots: Vec<(ValueId, u64)> = Vec::new();
        let mut at = 0u64;
        let mut fits = true;
        for &p in &parts {
            let Some(len) = bytes(p).filter(|&b| b > 0) else {
                fits = false;
                break;
            };
            let View { of: root, offset } = resolve_view(views, p);
            match (at.checked_sub(offset), roots.iter().find(|r| r.0 == root)) {
                (Some(start), Some(&(_, known))) => fits &= start == known,
                (Some(start), None) => roots.push((root, start)),
                (None, _) => fits = false,
            }
            spans.push((at, at + len, root));
            at += len;
        }
        fits &= roots.iter().all(|&(root, start)| {
            let Some(end) = bytes(root).map(|len| start + len) else { return false };
            let written =
                kernel_of.get(&root.node).is_some_and(|&j| j != k && !placed.contains(&j))
                    && !matches!(graph.node(root.node).op, Op::Input | Op::Constant(_));
            let alone = spans.iter().all(|&(b, e, r)| r == root || e <= start || b >= end);
            written
                && alone
                && end <= at
                && start.is_multiple_of(64)
                && root != result
                && !outputs.contains(&root)
                && !taken.contains(&root)
        });
        if !fits {
            continue;
        }
        for (root, start) in roots {
            for w in views.values_mut().filter(|w| w.of == root) {
                *w = View { of: result, offset: start + w.offset };
            }
            views.insert(root, View { of: result, offset: start });
            taken.insert(root);
        }
        placed.insert(k);
    }
    placed
}

/// The value whose bytes a (possibly chained) view shares, and where in them it starts (a value
/// that is no view is its own bytes from 0).
pub fn resolve_view(views: &HashMap<ValueId, View>, v: ValueId) -> View {
    // Entries are stored resolved (their `of` is no view), so one lookup is enough.
    views.get(&v).copied().unwrap_or(View { of: v, offset: 0 })
}

/// The byte offsets of a Slice's, Split's or one-index Gather's results in its input, when each
/// result is one contiguous run of the input's bytes: every axis before the cut axis has extent 1 in the
/// result and every axis after it is whole (steps of 1). Empty results are not views (a kernel
/// gives them a buffer of their own).
fn contiguous_parts(graph: &Graph, id: NodeId) -> Option<Vec<u64>> {
    let node = graph.node(id);
    let operands = graph.operands(id);
    let x = operands.first().copied().flatten()?;
    let ty = graph.value_type(x);
    let dims = ty.shape.as_fixed()?;
    let ints = |i: usize| -> Option<Vec<i64>> {
        graph.constant_value(operands.get(i).copied().flatten()?).map(|t| t.to_i64s())
    };
    // Per result: its start and extent on each axis.
    let mut parts: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    match &node.op {
        Op::Slice => {
            let (starts, ends) = (ints(1)?, ints(2)?);
            let axes = match operands.get(3).copied().flatten() {
                Some(_) => ints(3)?,
                None => (0..starts.len() as i64).collect(),
            };
            let steps = match operands.get(4).copied().flatten() {
                Some(_) => ints(4)?,
                None => vec![1; starts.len()],
            };
            let mut start = vec![0; dims.len()];
            let mut extent = dims.clone();
            for (i, &first) in starts.iter().enumerate() {
                let a = kiln_ir::normalize_axis(*axes.get(i)?, dims.len())?;
                let step = *steps.get(i)?;
                let (s, n) =
                    kiln_ir::infer::slice_axis(dims[a], first, *ends.get(i)?, step).ok()?;
                if step != 1 && n > 1 {
                    return None;
                }
                start[a] = usize::try_from(s).ok()?;
                extent[a] = n;
            }
            parts.push((start, extent));
        }
        Op::Split { axis, .. } => {
            let a = kiln_ir::normalize_axis(*axis, dims.len())?;
            let mut at = 0;
            for t in &node.outputs {
                let extent = t.shape.as_fixed()?;
                let mut start = vec![0; dims.len()];
                start[a] = at;
                at += *extent.get(a)?;
                parts.push((start, extent));
            }
        }
        // One index (a scalar or a single-element list): `x[:, 0]`, `qkv[1]`.
        Op::Gather { axis } => {
            let a = kiln_ir::normalize_axis(*axis, dims.len())?;
            let [i] = ints(1)?[..] else { return None };
            let i = if i < 0 { i + dims[a] as i64 } else { i };
            let mut start = vec![0; dims.len()];
            start[a] = usize::try_from(i).ok().filter(|&i| i < dims[a])?;
            let mut extent = dims.clone();
            extent[a] = 1;
            parts.push((start, extent));
        }
        _ => return None,
    }
    let mut offsets = Vec::with_capacity(parts.len());
    for (start, extent) in parts {
        if extent.contains(&0) || extent.len() != dims.len() {
            return None;
        }
        // The cut axis: the first whose result is not the whole axis; the ones before it must
        // be single indices, the ones after it whole.
        let cut = (0..dims.len()).rev().find(|&a| extent[a] != dims[a]).unwrap_or(0);
        if (0..cut).any(|a| extent[a] != 1) {
            return None;
        }
        let mut stride = ty.dtype.size() as u64;
        let mut offset = 0;
        for a in (0..dims.len()).rev() {
            offset += start[a] as u64 * stride;
            stride *= dims[a] as u64;
        }
        offsets.push(offset);
    }
    Some(offsets)
}

/// Whether kernel `a` reads, directly or not, from kernel `b`.
/// Whether kernel `j`, an elementwise chain whose result `v` only node `id` reads, can move into
/// kernel `k` (also elementwise alone), which `id` joins: nothing else reads any of `j`'s values,
/// the shapes match, and neither kernel depends on the other.
#[allow(clippy::too_many_arguments)]
fn mergeable_chain(
    graph: &Graph,
    kernels: &[Vec<NodeId>],
    open: &[bool],
    deps: &[HashSet<usize>],
    kernel_of: &HashMap<NodeId, usize>,
    j: usize,
    k: usize,
    v: ValueId,
    id: NodeId,
) -> bool {
    let elementwise = |kernel: &[NodeId]| {
        !kernel.is_empty() && kernel.iter().all(|&n| is_elementwise(&graph.node(n).op))
    };
    if !open[j] || !elementwise(&kernels[j]) || !elementwise(&kernels[k]) {
        return false;
    }
    if kernels[j].last() != Some(&v.node) || v.output != 0 {
        return false;
    }
    if graph.value_type(v).shape != graph.node(id).outputs[0].shape {
        return false;
    }
    // Every value of j is read inside j, or (its result) by `id` alone; none is a graph output.
    let read_outside = kernels[j].iter().any(|&n| {
        let value = ValueId::from(n);
        graph.outputs().iter().any(|(_, o)| o.node == n)
            || graph.users(value).iter().any(|&(u, _)| {
                if n == v.node {
                    u != id
                } else {
                    kernel_of.get(&u) != Some(&j)
                }
            })
    });
    !read_outside && !depends_on(deps, j, k) && !depends_on(deps, k, j)
}

fn depends_on(deps: &[HashSet<usize>], a: usize, b: usize) -> bool {
    let mut stack = vec![a];
    let mut seen = HashSet::new();
    while let Some(k) = stack.pop() {
        if k == b {
            return true;
        }
        if seen.insert(k) {
            stack.extend(deps[k].iter().copied());
        }
    }
    false
}

/// A topological order of kernels (stable: earlier-created first among the ready ones).
fn launch_order(deps: &[HashSet<usize>]) -> Result<Vec<usize>> {
    let n = deps.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n).find(|&k| !done[k] && deps[k].iter().all(|&d| done[d]));
        match next {
            Some(k) => {
                done[k] = true;
                order.push(k);
            }
            // Kernels are convex groups of an acyclic graph: a cycle is a fusion bug.
            None => {
                return Err(crate::CompileError::Internal(
                    "fusion made a cycle between kernels".into(),
                ))
            }
        }
    }
    Ok(order)
}

fn finish_kernel(graph: &Graph, nodes: &[NodeId], n: usize) -> Kernel {
    let inside: HashSet<NodeId> = nodes.iter().copied().collect();
    let mut inputs: Vec<ValueId> = Vec::new();
    let mut outputs: Vec<ValueId> = Vec::new();
    for &id in nodes {
        for v in graph.operands(id).into_iter().flatten() {
            if !inside.contains(&v.node) && !is_inline_constant(graph, v) && !inputs.contains(&v) {
                inputs.push(v);
            }
        }
        for i in 0..graph.node(id).outputs.len() {
            let v = ValueId::new(id, i);
            // Views are never inside kernels, so a value read through a view counts as read outside.
            let outside = graph.users(v).iter().any(|(u, _)| !inside.contains(u));
            if outside || graph.outputs().iter().any(|(_, o)| *o == v) {
                outputs.push(v);
            }
        }
    }
    let first = &graph.node(nodes[0]).name;
    let ops: Vec<&str> = nodes.iter().map(|&id| graph.node(id).op.name()).collect();
    let mut label = String::new();
    let _ = write!(label, "{first}: {}", ops.join(" + "));
    Kernel {
        name: format!("k{n}_{}", sanitize(first)),
        label,
        nodes: nodes.to_vec(),
        inputs,
        outputs,
        copy_to_output: None,
    }
}

/// A symbol-safe version of a node name.
fn sanitize(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    s.chars().take(40).collect()
}

/// The partition as text, for `kiln emit --stage fused`.
pub fn print(graph: &Graph, p: &Partition) -> String {
    let mut out = String::new();
    let value = |v: ValueId| format!("%{}", graph.value_name(v));
    for k in &p.kernels {
        let ins: Vec<String> =
            k.inputs.iter().map(|&v| format!("{}: {}", value(v), graph.value_type(v))).collect();
        let outs: Vec<String> =
            k.outputs.iter().map(|&v| format!("{}: {}", value(v), graph.value_type(v))).collect();
        let _ = writeln!(out, "kernel {} ({})", k.name, k.label);
        let _ = writeln!(out, "  in  {}", if ins.is_empty() { "-".into() } else { ins.join(", ") });
        let _ = writeln!(out, "  out {}", outs.join(", "));
        for &id in &k.nodes {
            let n = graph.node(id);
            let operands: Vec<String> =
                graph.operands(id).into_iter().map(|o| o.map_or("_".into(), value)).collect();
            let types: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
            let _ = writeln!(
                out,
                "    %{} = {}({}) : {}",
                n.name,
                n.op.name(),
                operands.join(", "),
                types.join(", ")
            );
        }
    }
    let mut views: Vec<(&ValueId, &View)> = p.views.iter().collect();
    views.sort();
    for (v, src) in views {
        let at = if src.offset == 0 { String::new() } else { format!(" from byte {}", src.offset) };
        let _ =
            writeln!(out, "view {} = {}{at} as {}", value(*v), value(src.of), graph.value_type(*v));
    }
    out
}
