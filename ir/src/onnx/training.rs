//! ONNX's training domain (`ai.onnx.preview.training`): the optimizers Momentum (standard and
//! Nesterov), Adam and Adagrad, imported as the update math their spec gives, in ordinary
//! elementwise ops (`train::optimizer` shares it with the Rust optimizers). The interpreter and
//! every target then run them with no op of their own, and each parameter's update fuses into
//! one elementwise kernel.
//!
//! Each takes the rate R and the update count T, then n tensors X, their n gradients G and
//! their n states (V for Momentum, V and H for Adam, H for Adagrad), and gives the n new X
//! then the n new states, each group in the same order.
//!
//! `Gradient` is differentiated here, at import: kiln's own rules (`grad::append_backward`)
//! append the backward graph of the subgraph from its xs to its y, and its outputs are the
//! gradient values, ordinary ops like the rest of the graph.

use std::collections::{HashMap, HashSet};

use super::import::{node_label, GraphImporter};
use super::ops::{attr, err};
use super::proto::NodeProto;
use crate::builder::Traced;
use crate::error::AttrError;
use crate::grad::append_backward;
use crate::op::Attrs;
use crate::train::optimizer::{adam_direction, momentum, regularized};
use crate::{GradientOpError, IrError, NodeId, Result, ValueId};

pub(super) const DOMAIN: &str = "ai.onnx.preview.training";

/// The ops of the domain the importer converts.
pub(super) const OPS: &[&str] = &["Momentum", "Adam", "Adagrad", "Gradient"];

/// How the node's hyperparameters read.
enum Rule {
    Momentum { alpha: f64, beta: f64, norm: f64, nesterov: bool },
    Adam { alpha: f64, beta: f64, epsilon: f64, norm: f64, norm_post: f64 },
    Adagrad { decay: f64, epsilon: f64, norm: f64 },
}

impl Rule {
    fn read(op_type: &str, mut a: Attrs) -> Result<Rule> {
        let f = |a: &mut Attrs, name: &str, default: f32| -> Result<f64> {
            Ok(f64::from(a.float(name, default).map_err(attr)?))
        };
        let required = |a: &mut Attrs, name: &str| -> Result<f64> {
            match a.opt_float(name).map_err(attr)? {
                Some(v) => Ok(f64::from(v)),
                None => Err(attr(AttrError::Missing { name: name.into() })),
            }
        };
        let rule = match op_type {
            "Momentum" => {
                if !a.contains("mode") {
                    return Err(attr(AttrError::Missing { name: "mode".into() }));
                }
                let mode = a.string("mode", "standard").map_err(attr)?;
                let nesterov = match mode.as_str() {
                    "standard" => false,
                    "nesterov" => true,
                    _ => {
                        return Err(attr(AttrError::NotOneOf {
                            name: "mode".into(),
                            value: mode,
                            allowed: &["standard", "nesterov"],
                        }))
                    }
                };
                Rule::Momentum {
                    alpha: required(&mut a, "alpha")?,
                    beta: required(&mut a, "beta")?,
                    norm: required(&mut a, "norm_coefficient")?,
                    nesterov,
                }
            }
            "Adam" => Rule::Adam {
                alpha: f(&mut a, "alpha", 0.9)?,
                beta: f(&mut a, "beta", 0.999)?,
                epsilon: f(&mut a, "epsilon", 1e-6)?,
                norm: f(&mut a, "norm_coefficient", 0.0)?,
                norm_post: f(&mut a, "norm_coefficient_post", 0.0)?,
            },
            "Adagrad" => Rule::Adagrad {
                decay: f(&mut a, "decay_factor", 0.0)?,
                epsilon: f(&mut a, "epsilon", 1e-6)?,
                norm: f(&mut a, "norm_coefficient", 0.0)?,
            },
            other => return Err(err(format!("{other} is not an op of {DOMAIN} kiln imports"))),
        };
        a.finish(op_type).map_err(attr)?;
        Ok(rule)
    }

    /// Tensors a parameter comes with: itself, its gradient and its states.
    fn group(&self) -> usize {
        match self {
            Rule::Momentum { .. } | Rule::Adagrad { .. } => 3,
            Rule::Adam { .. } => 4,
        }
    }
}

pub(super) fn convert(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    a: Attrs,
) -> Result<()> {
    if op_type == "Gradient" {
        return gradient(im, node, a);
    }
    let rule = Rule::read(op_type, a)?;
    let operands: Vec<ValueId> = im
        .operands(node)
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or_else(|| err(format!("operand {i} is missing (none is optional)"))))
        .collect::<Result<_>>()?;
    let k = rule.group();
    let tensors = operands.len().saturating_sub(2);
    if operands.len() < 2 + k || !tensors.is_multiple_of(k) {
        return Err(err(format!(
            "takes R, T and then {k} groups of the same number of tensors, got {} operands",
            operands.len()
        )));
    }
    let n = tensors / k;
    let dtype = im.ty(operands[2]).dtype;
    if !dtype.is_float() {
        return Err(err(format!("the tensors to optimize must be floats, got {}", dtype.name())));
    }
    im.trace(|b| {
        let v = |i: usize| b.value(operands[i]);
        let (r, t) = (v(0), v(1));
        // R and T in the tensors' type (ONNX lets R be float while X is double).
        let r = if r.ty().is_some_and(|ty| ty.dtype == dtype) { r } else { r.cast(dtype) };
        let t_pos = t.greater(t.scalar(0.0));
        let t = t.cast(dtype);
        let mut outs: Vec<Vec<Traced>> = vec![Vec::with_capacity(n); k - 1];
        for j in 0..n {
            let (x, g) = (v(2 + j), v(2 + n + j));
            let state = |s: usize| v(2 + (2 + s) * n + j);
            let new = match rule {
                Rule::Momentum { alpha, beta, norm, nesterov } => {
                    // The first update (T = 0) takes the whole gradient.
                    let beta = t_pos.select(x.scalar(beta), x.scalar(1.0));
                    let g = regularized(x, g, norm);
                    let (x_new, v_new) = momentum(x, g, state(0), r, Some(beta), alpha, nesterov);
                    vec![x_new, v_new]
                }
                Rule::Adam { alpha, beta, epsilon, norm, norm_post } => {
                    let g = regularized(x, g, norm);
                    let (dir, v_new, h_new) =
                        adam_direction(g, state(0), state(1), alpha, beta, epsilon, None);
                    // R·√(1-βᵀ)/(1-αᵀ) for T > 0, R at T = 0; the corrected branch reads T ≥ 1 so
                    // it is finite (0/0 otherwise) where Where drops it.
                    let one = x.scalar(1.0);
                    let t1 = t.max(one);
                    let c2 = one.sub(x.scalar(beta).pow(t1)).sqrt();
                    let c1 = one.sub(x.scalar(alpha).pow(t1));
                    let r_adj = t_pos.select(r.mul(c2).div(c1), r);
                    let x_new = x.sub(r_adj.mul(dir));
                    let x_new =
                        if norm_post == 0.0 { x_new } else { x.scalar(1.0 - norm_post).mul(x_new) };
                    vec![x_new, v_new, h_new]
                }
                Rule::Adagrad { decay, epsilon, norm } => {
                    let r_t = r.div(x.scalar(1.0).add(t.mul(x.scalar(decay))));
                    let g = regularized(x, g, norm);
                    let h_new = state(0).add(g.mul(g));
                    let x_new = x.sub(r_t.mul(g).div(h_new.sqrt().add(x.scalar(epsilon))));
                    vec![x_new, h_new]
                }
            };
            for (group, value) in outs.iter_mut().zip(new) {
                group.push(value);
            }
        }
        Ok(outs.into_iter().flatten().collect())
    })
    .and_then(|ids| im.bind(node, &ids))
}

/// The values a Gradient node's attributes name (xs, zs, y): the import reads them although no
/// input edge says so, so `node_order` imports their producers first. Empty for other nodes.
pub(super) fn named_values(node: &NodeProto) -> Vec<&str> {
    gradient_names(node, &["xs", "zs", "y"])
}

/// The values a Gradient node differentiates by or holds constant (xs and zs), which the
/// importer must not fold away. Empty for other nodes.
pub(super) fn variables(node: &NodeProto) -> Vec<&str> {
    gradient_names(node, &["xs", "zs"])
}

/// The names in a Gradient node's attributes `which`.
fn gradient_names<'n>(node: &'n NodeProto, which: &[&str]) -> Vec<&'n str> {
    if node.domain.as_deref() != Some(DOMAIN) || node.op_type.as_deref() != Some("Gradient") {
        return Vec::new();
    }
    node.attribute
        .iter()
        .filter(|a| a.name.as_deref().is_some_and(|n| which.contains(&n)))
        .flat_map(|a| a.strings.iter().map(Vec::as_slice).chain(a.s.as_deref()))
        .filter_map(|b| std::str::from_utf8(b).ok())
        .filter(|n| !n.is_empty())
        .collect()
}

/// `Gradient(xs, zs, y)`: output i is dy/dx_i, where y is read as a function of the values xs
/// and zs name (the spec's independent variables), evaluated at the node's inputs (one per name
/// of xs, then of zs). Only the xs are differentiated by: zs, initializers, constants and any
/// other value y reads that xs and zs do not determine are constants of the derivative. When
/// the inputs are the named values themselves (the usual case, and where the spec notes the
/// forward values can be reused) the backward graph reads the forward graph's values; when an
/// input is another value, the nodes from xs and zs to y are copied with the inputs in place of
/// the names, and the copy is differentiated.
fn gradient(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let label = node_label(node);
    let fail = |error| IrError::Gradient { node: label.clone(), error: Box::new(error) };
    let missing = |name: &str| attr(AttrError::Missing { name: name.into() });
    let xs = a.strings("xs").map_err(attr)?.ok_or_else(|| missing("xs"))?;
    let zs = a.strings("zs").map_err(attr)?.unwrap_or_default();
    if !a.contains("y") {
        return Err(missing("y"));
    }
    let y = a.string("y", "").map_err(attr)?;
    a.finish("Gradient").map_err(attr)?;
    if xs.is_empty() {
        return Err(attr(AttrError::OutOfRange {
            name: "xs".into(),
            value: "[]".into(),
            why: "must name at least one value",
        }));
    }

    // The named values, xs then zs, and y.
    let lookup = |attr: &'static str, name: &str| {
        im.values
            .get(name)
            .copied()
            .ok_or_else(|| fail(GradientOpError::UnknownName { attr, name: name.into() }))
    };
    let names: Vec<(&'static str, &String)> =
        xs.iter().map(|n| ("xs", n)).chain(zs.iter().map(|n| ("zs", n))).collect();
    let named: Vec<ValueId> = names.iter().map(|(a, n)| lookup(a, n)).collect::<Result<_>>()?;
    let y_value = lookup("y", &y)?;
    let mut seen = HashSet::new();
    for (_, name) in &names {
        if !seen.insert(name.as_str()) {
            return Err(fail(GradientOpError::Repeated { name: (*name).clone() }));
        }
    }
    let y_ty = im.ty(y_value).clone();
    if !y_ty.kind.is_tensor() || !y_ty.dtype.is_float() || y_ty.shape.numel() != Some(1) {
        return Err(fail(GradientOpError::NotScalar { y: y.clone(), ty: Box::new(y_ty) }));
    }

    // The inputs: one per name, each of its name's element type (the values the derivative is
    // taken at).
    if node.input.len() != names.len() {
        return Err(fail(GradientOpError::InputCount { want: names.len(), got: node.input.len() }));
    }
    let mut inputs = Vec::with_capacity(names.len());
    for (index, ((_, name), &v)) in names.iter().zip(&named).enumerate() {
        let want = im.ty(v);
        let input = im.operand(node, index).filter(|&i| im.ty(i).dtype == want.dtype);
        let Some(input) = input else {
            let got = im.operand(node, index).map_or("nothing".into(), |i| im.ty(i).to_string());
            let (name, want) = ((*name).clone(), Box::new(want.clone()));
            return Err(fail(GradientOpError::InputType { index, name, want, got }));
        };
        inputs.push(input);
    }
    let outputs = node.output.len();
    if outputs > xs.len() {
        return Err(fail(GradientOpError::OutputCount { xs: xs.len(), got: outputs }));
    }

    // The subgraph: the nodes that depend on a named value and that y depends on.
    let graph = &im.graph;
    let order = graph.topo_order()?;
    let mut downstream: HashSet<NodeId> = HashSet::new();
    for &id in &order {
        let operands = graph.operands(id);
        let reads = |v: &ValueId| named.contains(v) || downstream.contains(&v.node);
        if operands.iter().flatten().any(reads) {
            downstream.insert(id);
        }
    }
    // An x or z computed from the others would be no independent variable (the spec's "H
    // cannot appear in xs and zs"), and the copy below could not put its input in its place.
    for ((attr, name), v) in names.iter().zip(&named) {
        if downstream.contains(&v.node) {
            let name = (*name).clone();
            return Err(fail(GradientOpError::NotIndependent { attr, name }));
        }
    }
    let mut upstream: HashSet<NodeId> = HashSet::from([y_value.node]);
    for &id in order.iter().rev() {
        if upstream.contains(&id) {
            upstream.extend(graph.operands(id).iter().flatten().map(|v| v.node));
        }
    }
    for (name, x) in xs.iter().zip(&named) {
        // y may be an x itself (dy/dy = 1).
        if !upstream.contains(&x.node) {
            return Err(fail(GradientOpError::NotReachable { x: name.clone(), y: y.clone() }));
        }
    }

    // y at the inputs: the graph's own y when each input is its named value, else a copy of
    // the subgraph reading the inputs.
    let mut y_at = y_value;
    if inputs != named {
        let mut copied: HashMap<ValueId, ValueId> =
            named.iter().copied().zip(inputs.iter().copied()).collect();
        let subgraph: Vec<NodeId> = order
            .iter()
            .copied()
            .filter(|id| downstream.contains(id) && upstream.contains(id))
            .collect();
        for id in subgraph {
            let operands: Vec<Option<ValueId>> = im
                .graph
                .operands(id)
                .into_iter()
                .map(|o| o.map(|v| copied.get(&v).copied().unwrap_or(v)))
                .collect();
            let original = im.graph.node(id);
            let (op, results) = (original.op.clone(), original.outputs.len());
            let name = im.name_for(node, &original.name);
            let new = im.graph.add_node_with_outputs(&name, op, &operands, results)?;
            for i in 0..results {
                copied.insert(ValueId::new(id, i), ValueId::new(new, i));
            }
        }
        y_at = copied.get(&y_value).copied().unwrap_or(y_value);
    }

    // The gradients asked for (an empty output name skips its x).
    let wanted: Vec<usize> = (0..outputs).filter(|&i| !node.output[i].is_empty()).collect();
    let wrt: Vec<ValueId> = wanted.iter().map(|&i| inputs[i]).collect();
    let grads = append_backward(&mut im.graph, y_at, &wrt)
        .map_err(|error| fail(GradientOpError::Backward { y: y.clone(), error }))?;
    for (&i, d) in wanted.iter().zip(grads) {
        im.values.insert(node.output[i].clone(), d);
    }
    Ok(())
}
