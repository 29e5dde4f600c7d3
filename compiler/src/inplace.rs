//! Outputs written over inputs (`Options::in_place`): which kernel writes each new value, which
//! kernels read the old one, and the ordering edges that put every reader before the writer.
//!
//! A training step's `w.new` written into `w`'s buffer is safe only if every kernel that reads
//! the old `w` (the forward Conv, the backward's ConvTranspose or MatMul that reads the weight
//! for the input's gradient) has run before the kernel that writes `w.new`. Data dependencies
//! do not say so (the update depends on the gradient only), so [`plan`] adds an edge from each
//! reader to the writer, and the artifact's schedule ([`crate::artifact::kernel_waves_after`])
//! keeps them: each writer in a later wave than its readers, hence launched after them, and the
//! devices keep a read before a later write of the same bytes (`BufferKind::State` is one
//! memory to the runtime's hazards). The writer itself may read the old value only where each
//! element is read before it is written, at the same index, by the same thread: a kernel that
//! is elementwise alone (fusion keeps such readers out of kernels with a root:
//! `fuse::partition_in_place`), reading the old value whole (no view at an offset, no
//! broadcast). Anything else is a typed error ([`CompileError::InPlace`]), never a wrong order.
//! It is a pure function of the graph and its partition, and prints.

use std::collections::HashSet;
use std::fmt::{self, Write};

use kiln_ir::{Graph, ValueId};
use kiln_runtime::artifact::{BufferKind, Manifest};

use crate::fuse::{self, Partition};
use crate::{CompileError, Result};

/// One output written over one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aliased {
    /// The input's name and its index among the graph's inputs.
    pub input: String,
    pub input_index: usize,
    /// The output's name and its index among the graph's outputs.
    pub output: String,
    pub output_index: usize,
    /// The kernel (index into the partition) that writes the output's value into the input's
    /// buffer.
    pub writer: usize,
    /// The other kernels that read the input's old value (directly or through a view), in
    /// partition order: each must run before `writer`.
    pub readers: Vec<usize>,
}

/// What [`plan`] decided for a graph's in-place pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InPlacePlan {
    /// In the order asked.
    pub pairs: Vec<Aliased>,
    /// (reader, writer) kernel pairs: the write-after-read edges the schedule adds, each once,
    /// sorted.
    pub edges: Vec<(usize, usize)>,
    /// Each kernel's name (for printing).
    pub names: Vec<String>,
}

impl fmt::Display for InPlacePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in &self.pairs {
            let readers: Vec<&str> = a.readers.iter().map(|&r| self.names[r].as_str()).collect();
            writeln!(
                f,
                "`{}` written over `{}` by {}, after {}",
                a.output,
                a.input,
                self.names[a.writer],
                if readers.is_empty() { "-".to_string() } else { readers.join(", ") }
            )?;
        }
        Ok(())
    }
}

/// Decides, for each (input, output) pair by name, the kernel that writes the output over the
/// input and the kernels that must run before it; refuses a pair that is not an input and an
/// output of the graph of one type, a name given twice, and a writer that reads the old value
/// at other indices than it writes. (A cycle the edges make is found by the schedule.)
pub fn plan(
    graph: &Graph,
    partition: &Partition,
    pairs: &[(String, String)],
) -> Result<InPlacePlan> {
    let names = partition.kernels.iter().map(|k| k.name.clone()).collect();
    let mut out = InPlacePlan { names, ..InPlacePlan::default() };
    let mut edges: HashSet<(usize, usize)> = HashSet::new();
    for (n, (input, output)) in pairs.iter().enumerate() {
        let fail = |why: String| CompileError::InPlace {
            input: input.clone(),
            output: output.clone(),
            why,
        };
        if pairs[..n].iter().any(|(i, _)| i == input) {
            return Err(fail(format!("input `{input}` is written over twice")));
        }
        if pairs[..n].iter().any(|(_, o)| o == output) {
            return Err(fail(format!("output `{output}` is written in place twice")));
        }
        let input_index = graph
            .inputs()
            .iter()
            .position(|&i| graph.node(i).name == *input)
            .ok_or_else(|| fail(format!("the graph has no input `{input}`")))?;
        let output_index = graph
            .outputs()
            .iter()
            .position(|(name, _)| name == output)
            .ok_or_else(|| fail(format!("the graph has no output `{output}`")))?;
        let x = ValueId::from(graph.inputs()[input_index]);
        let u = graph.outputs()[output_index].1;
        let (tx, tu) = (graph.value_type(x), graph.value_type(u));
        if tx != tu {
            return Err(fail(format!("the input is {tx}, the output {tu}")));
        }
        let writer = partition
            .kernels
            .iter()
            .position(|k| k.copy_to_output == Some(output_index))
            .or_else(|| {
                partition
                    .kernels
                    .iter()
                    .position(|k| k.copy_to_output.is_none() && k.outputs.contains(&u))
            })
            .ok_or_else(|| CompileError::Internal(format!("no kernel writes output `{output}`")))?;
        let reads_x = |v: &ValueId| fuse::resolve_view(&partition.views, *v).of == x;
        let readers: Vec<usize> = partition
            .kernels
            .iter()
            .enumerate()
            .filter(|&(k, kernel)| k != writer && kernel.inputs.iter().any(reads_x))
            .map(|(k, _)| k)
            .collect();
        let w = &partition.kernels[writer];
        if w.inputs.iter().any(reads_x) {
            check_writer(graph, partition, w, x)
                .map_err(|why| fail(format!("kernel {} ({}) {why}", w.name, w.label)))?;
        }
        edges.extend(readers.iter().map(|&r| (r, writer)));
        out.pairs.push(Aliased {
            input: input.clone(),
            input_index,
            output: output.clone(),
            output_index,
            writer,
            readers,
        });
    }
    out.edges = edges.into_iter().collect();
    out.edges.sort_unstable();
    Ok(out)
}

/// Why kernel `w`, which writes over `x`, may not read `x` as it does (`Err`), if so: it must be
/// elementwise alone (or a copy), and read `x` whole, each node that reads it of `x`'s size.
fn check_writer(
    graph: &Graph,
    partition: &Partition,
    w: &fuse::Kernel,
    x: ValueId,
) -> std::result::Result<(), String> {
    let numel = |v: ValueId| graph.value_type(v).shape.numel();
    let whole = |v: ValueId| {
        let view = fuse::resolve_view(&partition.views, v);
        view.of == x && view.offset == 0 && numel(v) == numel(x)
    };
    if w.copy_to_output.is_some() {
        return if w.inputs.iter().all(|&v| whole(v)) {
            Ok(())
        } else {
            Err("copies part of the old value over it".into())
        };
    }
    let inside: HashSet<_> = w.nodes.iter().copied().collect();
    for &id in &w.nodes {
        let node = graph.node(id);
        for v in graph.operands(id).into_iter().flatten() {
            if inside.contains(&v.node) || fuse::resolve_view(&partition.views, v).of != x {
                continue;
            }
            if !fuse::is_elementwise(&node.op) {
                return Err(format!(
                    "reads the old value in `{}` ({}), which is not elementwise",
                    node.name,
                    node.op.name()
                ));
            }
            let same = node.outputs.len() == 1 && node.outputs[0].shape.numel() == numel(x);
            if !whole(v) || !same {
                return Err(format!(
                    "reads the old value in `{}` ({}) at other positions than it writes",
                    node.name,
                    node.op.name()
                ));
            }
        }
    }
    if let Some(&root) = w.nodes.iter().find(|&&n| !fuse::is_elementwise(&graph.node(n).op)) {
        let node = graph.node(root);
        return Err(format!(
            "reads the old value and has a root, `{}` ({}), which may store before it reads",
            node.name,
            node.op.name()
        ));
    }
    Ok(())
}

/// Each state of a compiled program (`Manifest::state`) with the launches that take its bytes
/// before the one that writes the new value (the readers of the old value) and that one, by
/// launch number and label: the order the devices run, which puts every reader first.
pub fn describe(m: &Manifest) -> String {
    let mut out = String::new();
    for s in &m.state {
        let touches = |l: &kiln_runtime::artifact::Launch| {
            l.args.iter().any(|&b| {
                b == s.buffer
                    || matches!(m.buffers[b].kind, BufferKind::Alias { of, .. } if of == s.buffer)
            })
        };
        let name = |i: usize| format!("{i} ({})", m.kernels[m.launches[i].kernel].label);
        let readers: Vec<String> =
            (0..s.writer).filter(|&i| touches(&m.launches[i])).map(name).collect();
        let _ = writeln!(
            out,
            "`{}` over `{}`: read by {}; then written by {}",
            s.output,
            s.input,
            if readers.is_empty() { "-".to_string() } else { readers.join(", ") },
            name(s.writer)
        );
    }
    out
}
