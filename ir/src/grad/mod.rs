//! Reverse-mode automatic differentiation as a graph transform: given a graph, a scalar loss value
//! and the values to differentiate by, [`append_backward`] appends the backward graph, built from
//! ordinary kiln ops with the tracing [`GraphBuilder`] (so shape inference checks every backward
//! op as it is added), and returns the gradient values. No tape: the backward graph is a graph
//! like any other, which the passes, fusion and codegen take as they take a forward graph.
//!
//! The rules are kept one op family a file, as in `infer/` and `eval/`. A rule gets the forward
//! node's operands and results and the gradients of its results, and returns the gradients of the
//! operands that need one. Gradients of a value used more than once are summed. Each rule is
//! checked against central finite differences in f64 on the interpreter (`tests.rs`).

mod contraction;
mod elementwise;
mod loss;
mod movement;
mod normalize;
mod recurrent;
mod reduce;
mod window;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};

use thiserror::Error;

use crate::builder::{GraphBuilder, Traced};
use crate::op::OpFamily;
use crate::{Dim, Graph, IrError, NodeId, Op, OpError, Shape, Tensor, TensorType, ValueId};

/// Why the backward graph could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GradError {
    /// The loss is not one float element.
    #[error("the loss `{name}` must be a float tensor of one element, got {ty}")]
    LossNotScalar { name: String, ty: Box<TensorType> },
    /// A value to differentiate by is not a float tensor.
    #[error("cannot differentiate by `{name}`: it is {ty}, not a float tensor")]
    NotDifferentiable { name: String, ty: Box<TensorType> },
    /// A value named by the caller is not in the graph.
    #[error("value {value:?} is not in the graph")]
    UnknownValue { value: ValueId },
    /// A node between the parameters and the loss has an op without a gradient rule.
    #[error("node `{node}` ({op}): no gradient rule for {op}")]
    NoRule { node: String, op: &'static str },
    /// A node's rule could not build its gradient.
    #[error("node `{node}` ({op}): gradient")]
    Rule {
        node: String,
        op: &'static str,
        #[source]
        error: RuleError,
    },
    /// The forward graph is broken (a cycle), or the finished graph failed verification.
    #[error("the graph")]
    Graph(#[source] IrError),
}

/// What stopped one rule.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RuleError {
    /// The op has no gradient rule (the caller names the node).
    #[error("no gradient rule")]
    NoRule,
    /// The rule needs sizes that are symbolic here (`what`: the axes or value it needs them of).
    #[error("needs fixed sizes for {what}, got {ty}")]
    NeedsFixedShape { what: &'static str, ty: Box<TensorType> },
    /// The rule reads an operand's value (axes, a Pow exponent's sign...) and it is not a constant.
    #[error("operand {index} must be a constant")]
    NeedsConstant { index: usize },
    #[error("operand {index} is missing")]
    MissingOperand { index: usize },
    /// The op's attributes ask for a case the rule does not cover.
    #[error("{what} has no gradient rule yet")]
    Unsupported { what: &'static str },
    /// The forward op's own attributes do not resolve (a window wider than its padded input).
    #[error("the forward op")]
    Forward(#[source] OpError),
    /// A backward op failed shape inference or could not be added.
    #[error("building a backward op")]
    Build(#[source] IrError),
    /// The rule made a gradient whose type differs from its operand's: a bug in the rule.
    #[error("the gradient of operand {index} is {got}, the operand {want}")]
    GradientType { index: usize, got: Box<TensorType>, want: Box<TensorType> },
}

/// One forward node as a rule sees it: its op, operands and results as values of the graph being
/// extended, the gradient of each result (`None`: the loss does not depend on that result) and
/// which operands need a gradient.
pub(crate) struct Step<'a, 'g> {
    pub g: &'g GraphBuilder,
    pub op: &'a Op,
    pub inputs: Vec<Option<Traced<'g>>>,
    pub outputs: Vec<Traced<'g>>,
    pub grads: Vec<Option<Traced<'g>>>,
    pub needs: Vec<bool>,
}

/// A rule's answer: per operand, its gradient, or `None` where none is needed or it is zero.
pub(crate) type Grads<'g> = Vec<Option<Traced<'g>>>;

impl<'g> Step<'_, 'g> {
    pub fn input(&self, index: usize) -> Result<Traced<'g>, RuleError> {
        self.inputs.get(index).copied().flatten().ok_or(RuleError::MissingOperand { index })
    }

    pub fn needs(&self, index: usize) -> bool {
        self.needs.get(index).copied().unwrap_or(false)
    }

    /// The gradient of result 0 (the driver calls a rule only when some result has one; a rule
    /// of a one-result op may rely on it).
    pub fn dy(&self) -> Result<Traced<'g>, RuleError> {
        match self.grads.first().copied().flatten() {
            Some(d) => Ok(d),
            None => self.zeros_like(self.outputs[0]),
        }
    }

    /// Operand `index`'s value when it is a constant.
    pub fn constant(&self, index: usize) -> Result<Tensor, RuleError> {
        let v = self.input(index)?.id().ok_or(RuleError::NeedsConstant { index })?;
        self.g
            .with_graph(|graph| graph.constant_value(v).cloned())
            .ok_or(RuleError::NeedsConstant { index })
    }

    /// Operand `index`'s constant value as i64s (axes, sizes).
    pub fn constant_ints(&self, index: usize) -> Result<Vec<i64>, RuleError> {
        Ok(self.constant(index)?.to_i64s())
    }

    pub fn zeros_like(&self, like: Traced<'g>) -> Result<Traced<'g>, RuleError> {
        zeros_like(like)
    }
}

/// A traced value's type; a value that failed to trace has recorded the builder's error, which the
/// driver reports, so this only has to stop the rule.
pub(crate) fn ty(t: Traced<'_>) -> Result<TensorType, RuleError> {
    match (t.ty(), t.builder().error()) {
        (Some(ty), _) => Ok(ty),
        (None, Some(e)) => Err(RuleError::Build(e)),
        (None, None) => Err(RuleError::Build(IrError::Graph("a value failed to trace".into()))),
    }
}

/// A tensor of zeros typed as `like`. With symbolic sizes it is `Where(false, like, 0)`, whose
/// inferred type keeps `like`'s symbols (a ConstantOfShape of a Shape would get fresh ones), and
/// which is 0 even where `like` is not finite.
pub(crate) fn zeros_like(like: Traced<'_>) -> Result<Traced<'_>, RuleError> {
    let ty = ty(like)?;
    let g = like.builder();
    Ok(match ty.shape.as_fixed() {
        // A scalar broadcast, not a constant of the full size: a parameter's shape comes from
        // the user's model, and its zeros need not be held in memory while the graph is built.
        Some(dims) => g
            .anon_constant(Tensor::zeros(ty.dtype, &[]))
            .expand(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
        None => {
            let never = g.anon_constant(Tensor::scalar(false));
            never.select(like, like.scalar(0.0))
        }
    })
}

/// `t` given `like`'s type when their sizes agree at run time but inference could not tell (a
/// symbol against a fresh one): broadcasting keeps the left operand's symbol.
fn retype<'g>(t: Traced<'g>, like: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    Ok(zeros_like(like)?.add(t))
}

/// A value's rank.
pub(crate) fn rank(t: Traced<'_>) -> Result<usize, RuleError> {
    Ok(ty(t)?.shape.rank())
}

/// A value's sizes, which the rule needs fixed.
pub(crate) fn fixed_dims(t: Traced<'_>, what: &'static str) -> Result<Vec<usize>, RuleError> {
    let ty = ty(t)?;
    ty.shape.as_fixed().ok_or_else(|| RuleError::NeedsFixedShape { what, ty: Box::new(ty) })
}

/// `t` reshaped to `like`'s shape (the element counts agree).
pub(crate) fn reshape_like<'g>(t: Traced<'g>, like: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    let want = ty(like)?;
    let g = t.builder();
    let reshape = Op::Reshape { allowzero: true };
    Ok(match want.shape.as_fixed() {
        Some(dims) => {
            let shape = t.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
            g.apply(reshape, &[Some(t), Some(shape)], 1)[0]
        }
        None => {
            // Fixed sizes as they are; a symbol `t` has on the same axis copied (`0`); one other
            // symbol inferred (`-1`). Inference then keeps the symbols, which a Shape op would
            // replace with fresh ones.
            let have = ty(t)?;
            let no_empty = want.shape.dims().iter().all(|d| *d != Dim::Fixed(0));
            let mut unmatched = 0;
            let spec: Vec<i64> = want
                .shape
                .dims()
                .iter()
                .enumerate()
                .map(|(i, d)| match d {
                    Dim::Fixed(n) => *n as i64,
                    Dim::Sym(_) if have.shape.dims().get(i) == Some(d) => 0,
                    Dim::Sym(_) => {
                        unmatched += 1;
                        -1
                    }
                })
                .collect();
            if no_empty && unmatched <= 1 {
                let shape = t.ints(&spec);
                let r = g.apply(Op::Reshape { allowzero: false }, &[Some(t), Some(shape)], 1)[0];
                // The `-1` axis gets a fresh symbol; `like`'s replaces it.
                if unmatched == 0 {
                    r
                } else {
                    retype(r, like)?
                }
            } else {
                let shape = g.apply(Op::Shape { end: None, start: 0 }, &[Some(like)], 1)[0];
                retype(g.apply(reshape, &[Some(t), Some(shape)], 1)[0], like)?
            }
        }
    })
}

/// `g` broadcast to `like`'s shape (and type: `like` has `g`'s element type).
pub(crate) fn expand_like<'g>(g: Traced<'g>, like: Traced<'g>) -> Result<Traced<'g>, RuleError> {
    let want = ty(like)?;
    Ok(match want.shape.as_fixed() {
        Some(dims) => g.expand(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
        None => zeros_like(like)?.add(g),
    })
}

/// The gradient `g` of a broadcast result summed back to the shape of the operand that was
/// broadcast (`target`): over the leading axes the operand lacks, and over the axes where it has
/// size 1 and the result does not. Sizes that are equal (the same symbol included) stay.
pub(crate) fn reduce_to<'g>(g: Traced<'g>, target: &Shape) -> Result<Traced<'g>, RuleError> {
    let gty = ty(g)?;
    let (out, want) = (gty.shape.dims(), target.dims());
    if out == want {
        return Ok(g);
    }
    let lead = out
        .len()
        .checked_sub(want.len())
        .ok_or(RuleError::Unsupported { what: "a gradient of lower rank than its operand" })?;
    let mut axes: Vec<i64> = (0..lead as i64).collect();
    for (i, w) in want.iter().enumerate() {
        let o = &out[lead + i];
        if o == w {
            continue;
        }
        if *w == Dim::Fixed(1) {
            axes.push((lead + i) as i64);
        } else {
            return Err(RuleError::NeedsFixedShape {
                what: "an operand broadcast along a symbolic axis",
                ty: Box::new(gty),
            });
        }
    }
    let mut r = if axes.is_empty() { g } else { g.reduce_sum(&axes, true) };
    if lead > 0 {
        r = r.squeeze(&(0..lead as i64).collect::<Vec<_>>());
    }
    Ok(r)
}

/// Runs the family's rule for one node.
fn rule<'g>(step: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match step.op.family() {
        OpFamily::Elementwise => elementwise::grad(step),
        OpFamily::Contraction => contraction::grad(step),
        OpFamily::Window => window::grad(step),
        OpFamily::Normalize => normalize::grad(step),
        OpFamily::Reduce => reduce::grad(step),
        OpFamily::Movement => movement::grad(step),
        OpFamily::Loss => loss::grad(step),
        OpFamily::Sequence => recurrent::grad(step),
        _ => Err(RuleError::NoRule),
    }
}

/// Appends to `graph` the gradient of `loss` (a float value of one element) with respect to each
/// of `wrt`, and returns the gradient values in `wrt`'s order (each typed as its value). A value
/// the loss does not depend on gets zeros. The graph's outputs are left as they are: the caller
/// adds the gradients it wants as outputs. On an error `graph` is unchanged.
pub fn append_backward(
    graph: &mut Graph,
    loss: ValueId,
    wrt: &[ValueId],
) -> Result<Vec<ValueId>, GradError> {
    let type_of = |v: ValueId| -> Result<TensorType, GradError> {
        match graph.try_node(v.node).and_then(|n| n.outputs.get(v.output)) {
            Some(t) => Ok(t.clone()),
            None => Err(GradError::UnknownValue { value: v }),
        }
    };
    let differentiable = |t: &TensorType| t.kind.is_tensor() && t.dtype.is_float();
    let loss_ty = type_of(loss)?;
    if !differentiable(&loss_ty) || loss_ty.shape.numel() != Some(1) {
        return Err(GradError::LossNotScalar {
            name: graph.value_name(loss),
            ty: Box::new(loss_ty),
        });
    }
    for &v in wrt {
        let t = type_of(v)?;
        if !differentiable(&t) {
            return Err(GradError::NotDifferentiable {
                name: graph.value_name(v),
                ty: Box::new(t),
            });
        }
    }
    let order = graph.topo_order().map_err(GradError::Graph)?;

    // The values that need a gradient: float values that depend on some of `wrt` and that the loss
    // depends on. Nothing else gets a backward op.
    let mut depends: HashSet<ValueId> = wrt.iter().copied().collect();
    for &id in &order {
        if graph.operands(id).iter().flatten().any(|v| depends.contains(v)) {
            for (i, t) in graph.node(id).outputs.iter().enumerate() {
                if differentiable(t) {
                    depends.insert(ValueId::new(id, i));
                }
            }
        }
    }
    let mut feeds_loss: HashSet<NodeId> = HashSet::from([loss.node]);
    for &id in order.iter().rev() {
        if feeds_loss.contains(&id) {
            feeds_loss.extend(graph.operands(id).iter().flatten().map(|v| v.node));
        }
    }
    let needed = |v: &ValueId| depends.contains(v) && feeds_loss.contains(&v.node);

    let g = GraphBuilder::from_graph(graph.clone());
    let mut grads: HashMap<ValueId, Traced<'_>> = HashMap::new();
    let dims = loss_ty.shape.as_fixed().unwrap_or_default();
    grads.insert(loss, g.anon_constant(Tensor::full(loss_ty.dtype, &dims, 1.0)));

    for &id in order.iter().rev() {
        let node = graph.node(id);
        let operands = graph.operands(id);
        let needs: Vec<bool> = operands.iter().map(|o| o.as_ref().is_some_and(needed)).collect();
        let out_grads: Vec<Option<Traced<'_>>> =
            (0..node.outputs.len()).map(|i| grads.get(&ValueId::new(id, i)).copied()).collect();
        if !needs.contains(&true) || out_grads.iter().all(Option::is_none) {
            continue;
        }
        let step = Step {
            g: &g,
            op: &node.op,
            inputs: operands.iter().map(|o| o.map(|v| g.value(v))).collect(),
            outputs: (0..node.outputs.len()).map(|i| g.value(ValueId::new(id, i))).collect(),
            grads: out_grads,
            needs: needs.clone(),
        };
        let fail = |error| GradError::Rule { node: node.name.clone(), op: node.op.name(), error };
        let result = rule(&step);
        // A backward op that failed to trace explains more than what the rule saw of it.
        if let Some(e) = g.error() {
            return Err(fail(RuleError::Build(e)));
        }
        let operand_grads = match result {
            Ok(r) => r,
            Err(RuleError::NoRule) => {
                return Err(GradError::NoRule { node: node.name.clone(), op: node.op.name() })
            }
            Err(e) => return Err(fail(e)),
        };
        for (index, (d, operand)) in operand_grads.into_iter().zip(&operands).enumerate() {
            let (Some(d), Some(v), true) = (d, operand, needs[index]) else { continue };
            let (got, want) = (ty(d).map_err(fail)?, graph.value_type(*v).clone());
            if got.dtype != want.dtype || got.shape != want.shape {
                return Err(fail(RuleError::GradientType {
                    index,
                    got: Box::new(got),
                    want: Box::new(want),
                }));
            }
            let sum = match grads.get(v) {
                Some(&earlier) => earlier.add(d),
                None => d,
            };
            grads.insert(*v, sum);
        }
    }

    let mut out = Vec::with_capacity(wrt.len());
    for &v in wrt {
        let d = match grads.get(&v) {
            Some(&d) => d,
            None => zeros_like(g.value(v)).map_err(|error| GradError::Rule {
                node: graph.value_name(v),
                op: "Zeros",
                error,
            })?,
        };
        out.push(d.id());
    }
    let built = g.build().map_err(GradError::Graph)?;
    let ids = out
        .into_iter()
        .map(|d| {
            d.ok_or_else(|| GradError::Graph(IrError::Graph("a gradient failed to trace".into())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    *graph = built;
    Ok(ids)
}
