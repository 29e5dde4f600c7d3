//! The printer.

use std::fmt::Write;

use super::{name_literal, Weights, INLINE_LIMIT};
use crate::op::attr::float_literal;
use crate::op::Attr;
use crate::{DType, Graph, Op, Tensor, ValueId};

/// Prints `graph` in kiln's text form.
pub fn print(graph: &Graph, weights: Weights) -> String {
    let mut out = String::new();
    print_graph(graph, weights, "", &mut out);
    out
}

/// Prints `graph` with every line after the first indented by `indent` (nested graphs).
fn print_graph(graph: &Graph, weights: Weights, indent: &str, out: &mut String) {
    let value = |v: ValueId| match v.output {
        0 => format!("%{}", name_literal(&graph.node(v.node).name)),
        i => format!("%{}#{i}", name_literal(&graph.node(v.node).name)),
    };
    writeln!(out, "graph {} {{", name_literal(&graph.name)).expect("writing to a String");
    for &id in graph.inputs() {
        let node = graph.node(id);
        writeln!(out, "{indent}  input %{}: {}", name_literal(&node.name), node.outputs[0])
            .expect("writing to a String");
    }
    // A graph that cannot be ordered (a cycle) still prints, in insertion order, so it can be seen.
    let order = graph.topo_order().unwrap_or_else(|_| graph.nodes().map(|(id, _)| id).collect());
    for id in order {
        let node = graph.node(id);
        if matches!(node.op, Op::Input) {
            continue;
        }
        let types = match node.outputs.as_slice() {
            [one] => one.to_string(),
            many => {
                format!("({})", many.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "))
            }
        };
        write!(out, "{indent}  %{}: {types} = {}", name_literal(&node.name), node.op.name())
            .expect("writing to a String");
        if let Op::Constant(t) = &node.op {
            writeln!(out, " {}", tensor_data(t, weights)).expect("writing to a String");
            continue;
        }
        let operands: Vec<String> = graph
            .operands(id)
            .into_iter()
            .map(|o| o.map_or_else(|| "_".to_string(), value))
            .collect();
        write!(out, "({})", operands.join(", ")).expect("writing to a String");
        let attrs = node.op.attrs();
        if !attrs.0.is_empty() {
            let list: Vec<String> = attrs
                .0
                .iter()
                .map(|(n, a)| match a {
                    Attr::Graph(g) => {
                        let mut nested = String::new();
                        print_graph(&g.0, weights, &format!("{indent}    "), &mut nested);
                        format!("{n} = {}", nested.trim_end())
                    }
                    a => format!("{n} = {a}"),
                })
                .collect();
            write!(out, " {{{}}}", list.join(", ")).expect("writing to a String");
        }
        out.push('\n');
    }
    for (name, v) in graph.outputs() {
        let v = value(*v);
        if v[1..] == name_literal(name) {
            writeln!(out, "{indent}  output {v}").expect("writing to a String");
        } else {
            writeln!(out, "{indent}  output %{} = {v}", name_literal(name))
                .expect("writing to a String");
        }
    }
    writeln!(out, "{indent}}}").expect("writing to a String");
}

/// A tensor's type and data, as attributes print it: `f32[2] [1.0, 2.5]`.
pub fn tensor_literal(t: &Tensor, full: bool) -> String {
    format!("{} {}", t.ty(), tensor_data(t, if full { Weights::Full } else { Weights::Summary }))
}

/// A tensor's data: its values when small, else a summary or hex bytes.
pub fn tensor_data(t: &Tensor, weights: Weights) -> String {
    if let Some(strings) = t.strings() {
        // Strings have no hex form: with full weights every one prints, quoted and escaped.
        if t.len() > INLINE_LIMIT && weights == Weights::Summary {
            return format!("<elided: {} strings, digest {:016x}>", t.len(), t.digest());
        }
        let items: Vec<String> = strings.iter().map(|s| format!("{s:?}")).collect();
        return format!("[{}]", items.join(", "));
    }
    if t.len() <= INLINE_LIMIT {
        let items: Vec<String> = match t.dtype() {
            DType::Bool => {
                t.as_slice::<bool>().expect("dtype matches").iter().map(|b| b.to_string()).collect()
            }
            DType::I64 => t.to_i64s().iter().map(|v| v.to_string()).collect(),
            DType::U64 => {
                t.as_slice::<u64>().expect("dtype matches").iter().map(|v| v.to_string()).collect()
            }
            DType::F64 => t.to_f64s().iter().map(|&v| float_literal(v, false)).collect(),
            d if d.is_float() => t.to_f64s().iter().map(|&v| float_literal(v, true)).collect(),
            _ => t.to_f64s().iter().map(|v| format!("{v}")).collect(),
        };
        return format!("[{}]", items.join(", "));
    }
    match weights {
        Weights::Summary => {
            let v = t.to_f64s();
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
            format!(
                "<elided: {} values in [{}, {}], digest {:016x}>",
                v.len(),
                short(lo),
                short(hi),
                t.digest()
            )
        }
        Weights::Full => {
            let mut s = String::with_capacity(t.bytes().len() * 2 + 5);
            s.push_str("hex\"");
            for b in t.bytes() {
                write!(s, "{b:02x}").expect("writing to a String");
            }
            s.push('"');
            s
        }
    }
}

fn short(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        format!("{v}")
    } else {
        format!("{v:.4}")
    }
}
