//! ONNX's training domain (`ai.onnx.preview.training`): the optimizers Momentum (standard and
//! Nesterov), Adam and Adagrad, imported as the update math their spec gives, in ordinary
//! elementwise ops (`train::optimizer` shares it with the Rust optimizers). The interpreter and
//! every target then run them with no op of their own, and each parameter's update fuses into
//! one elementwise kernel.
//!
//! Each takes the rate R and the update count T, then n tensors X, their n gradients G and
//! their n states (V for Momentum, V and H for Adam, H for Adagrad), and gives the n new X
//! then the n new states, each group in the same order.

use super::import::GraphImporter;
use super::ops::attr;
use super::proto::NodeProto;
use crate::builder::Traced;
use crate::error::AttrError;
use crate::op::Attrs;
use crate::train::optimizer::{adam_direction, momentum, regularized};
use crate::{IrError, Result, ValueId};

pub(super) const DOMAIN: &str = "ai.onnx.preview.training";

/// The ops of the domain the importer converts (Gradient is not one: autodiff is
/// `grad::append_backward`, which a Gradient node could call, but none is imported yet).
pub(super) const OPS: &[&str] = &["Momentum", "Adam", "Adagrad"];

fn err(msg: impl Into<String>) -> IrError {
    IrError::Onnx(msg.into())
}

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
