//! The fused stage as a picture: Graphviz DOT text of the kernels (boxes: name, root node and
//! the ops fused in) and the buffers between them (ellipses: name, type; graph inputs, outputs,
//! constants and views each drawn their own way), for `kiln emit --stage fused --format dot`.
//! Pure functions of the partition: the same graph draws the same text.

use std::collections::HashSet;
use std::fmt::Write;

use kiln_ir::{Graph, ValueId};

use crate::fuse::Partition;

/// Kernels with more fused ops than this list them a few to a line, so boxes stay narrow.
const OPS_A_LINE: usize = 4;

/// The partition of `graph` as one Graphviz digraph.
pub fn fused(graph: &Graph, p: &Partition) -> String {
    digraph(&graph.name, &fused_body(graph, p, ""))
}

/// A digraph around `body` (node and edge statements, clusters), with kiln's styles.
pub fn digraph(name: &str, body: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote(name));
    out.push_str("  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=11];\n");
    out.push_str("  node [fontname=\"Helvetica\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=9];\n");
    out.push_str(body);
    out.push_str("}\n");
    out
}

/// `body` as a cluster (a program of a control-flow split), its box titled `label`. `id` must
/// be unique in the digraph (the prefix its nodes carry).
pub fn cluster(id: &str, label: &str, body: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "  subgraph {} {{", quote(&format!("cluster_{id}")));
    let _ = writeln!(out, "    label={};", quote(label));
    for line in body.lines() {
        let _ = writeln!(out, "  {line}");
    }
    out.push_str("  }\n");
    out
}

/// What a buffer is, which decides how it is drawn.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Input,
    Output,
    Constant,
    View,
    Between,
}

impl Role {
    /// `copied`: the values copy kernels copy into outputs (views, inputs): the output is the
    /// copy's buffer, drawn apart.
    fn of(graph: &Graph, p: &Partition, copied: &HashSet<ValueId>, v: ValueId) -> Role {
        if graph.outputs().iter().any(|(_, o)| *o == v) && !copied.contains(&v) {
            Role::Output
        } else if graph.inputs().contains(&v.node) {
            Role::Input
        } else if graph.constant_value(v).is_some() {
            Role::Constant
        } else if p.views.contains_key(&v) {
            Role::View
        } else {
            Role::Between
        }
    }

    /// The node's attributes, and the line under its name and type that says what it is.
    fn style(self) -> (&'static str, &'static str) {
        match self {
            Role::Input => ("style=filled, fillcolor=\"#d9ead3\"", "input"),
            Role::Output => ("style=\"filled,bold\", fillcolor=\"#fce5cd\"", "output"),
            Role::Constant => {
                ("style=filled, fillcolor=\"#eeeeee\", fontcolor=\"#555555\"", "constant")
            }
            Role::View => ("style=dashed", "view"),
            Role::Between => ("", ""),
        }
    }
}

/// The node and edge statements of one partition, every node id starting with `prefix` (so
/// the programs of a split do not share nodes).
pub fn fused_body(graph: &Graph, p: &Partition, prefix: &str) -> String {
    let value_id = |v: ValueId| quote(&format!("{prefix}v:{}", graph.value_name(v)));
    let kernel_id = |k: &crate::fuse::Kernel| quote(&format!("{prefix}k:{}", k.name));
    // Every buffer a kernel reads or writes, in the order the kernels meet them, with the
    // buffers views are made of.
    let mut values: Vec<ValueId> = Vec::new();
    let mut seen: HashSet<ValueId> = HashSet::new();
    let mut add = |v: ValueId, values: &mut Vec<ValueId>| {
        let mut at = Some(v);
        while let Some(v) = at.filter(|v| seen.insert(*v)) {
            values.push(v);
            at = p.views.get(&v).map(|view| view.of);
        }
    };
    let copied: HashSet<ValueId> = p
        .kernels
        .iter()
        .filter(|k| k.copy_to_output.is_some())
        .flat_map(|k| k.inputs.clone())
        .collect();
    for k in &p.kernels {
        for &v in k.inputs.iter().chain(&k.outputs) {
            add(v, &mut values);
        }
    }
    // A copy kernel writes the graph output it is for, a buffer of its own.
    let output_id = |i: usize| quote(&format!("{prefix}out:{i}"));
    let mut out = String::new();
    for k in &p.kernels {
        let ops: Vec<&str> = k.nodes.iter().map(|&id| graph.node(id).op.name()).collect();
        let what = match k.nodes.first() {
            None => k.label.clone(),
            Some(&first) => {
                let lines: Vec<String> = ops.chunks(OPS_A_LINE).map(|c| c.join(" + ")).collect();
                format!("{}: {}", graph.node(first).name, lines.join(" +\n"))
            }
        };
        let _ = writeln!(
            out,
            "  {} [shape=box, style=\"rounded,filled\", fillcolor=\"#cfe2f3\", label={}];",
            kernel_id(k),
            quote(&format!("{}\n{what}", k.name))
        );
    }
    for &v in &values {
        let role = Role::of(graph, p, &copied, v);
        let (attrs, says) = role.style();
        let mut label = format!("{}\n{}", graph.value_name(v), graph.value_type(v));
        match (role, p.views.get(&v)) {
            (Role::View, Some(view)) if view.offset > 0 => {
                let _ = write!(label, "\nview from byte {}", view.offset);
            }
            // The graph's name for an output, where its value has another.
            (Role::Output, _) => {
                let names: Vec<String> = graph
                    .outputs()
                    .iter()
                    .filter(|(n, o)| *o == v && *n != graph.value_name(v))
                    .map(|(n, _)| format!("`{n}`"))
                    .collect();
                let _ = write!(label, "\n{says}");
                if !names.is_empty() {
                    let _ = write!(label, " {}", names.join(", "));
                }
            }
            _ if !says.is_empty() => {
                let _ = write!(label, "\n{says}");
            }
            _ => {}
        }
        let sep = if attrs.is_empty() { "" } else { ", " };
        let _ = writeln!(
            out,
            "  {} [shape=ellipse{sep}{attrs}, label={}];",
            value_id(v),
            quote(&label)
        );
    }
    for (i, (name, v)) in graph.outputs().iter().enumerate() {
        if p.kernels.iter().any(|k| k.copy_to_output == Some(i)) {
            let (attrs, says) = Role::Output.style();
            let label = format!("{name}\n{}\n{says}", graph.value_type(*v));
            let _ = writeln!(
                out,
                "  {} [shape=ellipse, {attrs}, label={}];",
                output_id(i),
                quote(&label)
            );
        }
    }
    for k in &p.kernels {
        for &v in &k.inputs {
            let _ = writeln!(out, "  {} -> {};", value_id(v), kernel_id(k));
        }
        match k.copy_to_output {
            Some(i) => {
                let _ = writeln!(out, "  {} -> {};", kernel_id(k), output_id(i));
            }
            None => {
                for &v in &k.outputs {
                    let _ = writeln!(out, "  {} -> {};", kernel_id(k), value_id(v));
                }
            }
        }
    }
    // A view is the bytes of another buffer: a dashed edge from it.
    for &v in &values {
        if let Some(view) = p.views.get(&v) {
            let _ = writeln!(
                out,
                "  {} -> {} [style=dashed, arrowhead=none];",
                value_id(view.of),
                value_id(v)
            );
        }
    }
    out
}

/// A DOT string: quoted, with quotes and backslashes escaped and line breaks as `\n`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
