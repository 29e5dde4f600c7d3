//! Optimizer updates as ordinary ops: [`append_update`] appends to a graph the update of each
//! parameter and of its optimizer state (SGD with momentum, Nesterov and weight decay; Adam;
//! AdamW), as PyTorch's optimizers define them, so a training step can be compared with PyTorch's
//! step for step. Every op is elementwise (with scalar hyperparameters broadcast), so the
//! update of a parameter fuses into one kernel on every target.
//!
//! The update math is shared with the import of ONNX's `Momentum`, `Adam` and `Adagrad`
//! (`onnx::training`), which differ from PyTorch's only in where they put ε and how they count
//! steps.

use thiserror::Error;

use crate::builder::{GraphBuilder, Traced};
use crate::{DType, Graph, IrError, TensorType, ValueId};

/// An optimizer and its hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// PyTorch's `SGD` (without dampening): g = ∇ + wd·p; with momentum μ ≠ 0 the state b is
    /// μ·b + g (b starts at zero, so the first step's b is g, as PyTorch's is), and
    /// p ← p - lr·(g + μ·b) with Nesterov, p ← p - lr·b without; with μ = 0, p ← p - lr·g.
    Sgd { lr: f64, momentum: f64, nesterov: bool, weight_decay: f64 },
    /// PyTorch's `Adam`, weight decay as an L2 term added to the gradient: g = ∇ + wd·p,
    /// m ← β₁m + (1-β₁)g, v ← β₂v + (1-β₂)g², p ← p - lr/(1-β₁ᵗ) · m / (√v/√(1-β₂ᵗ) + ε).
    Adam { lr: f64, beta1: f64, beta2: f64, epsilon: f64, weight_decay: f64 },
    /// PyTorch's `AdamW`: decoupled weight decay, p ← p·(1 - lr·wd), then Adam's step on ∇.
    AdamW { lr: f64, beta1: f64, beta2: f64, epsilon: f64, weight_decay: f64 },
}

impl Optimizer {
    /// Plain SGD at learning rate `lr` (no momentum, no weight decay).
    pub fn sgd(lr: f64) -> Optimizer {
        Optimizer::Sgd { lr, momentum: 0.0, nesterov: false, weight_decay: 0.0 }
    }

    /// Adam with PyTorch's defaults: β = (0.9, 0.999), ε = 1e-8, no weight decay.
    pub fn adam(lr: f64) -> Optimizer {
        Optimizer::Adam { lr, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.0 }
    }

    /// AdamW with PyTorch's defaults: β = (0.9, 0.999), ε = 1e-8, weight decay 0.01.
    pub fn adamw(lr: f64) -> Optimizer {
        Optimizer::AdamW { lr, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.01 }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "SGD",
            Optimizer::Adam { .. } => "Adam",
            Optimizer::AdamW { .. } => "AdamW",
        }
    }

    /// How many state tensors each parameter keeps, each typed as the parameter and zero before
    /// the first step: SGD's momentum buffer (none without momentum); Adam's first and second
    /// moments, in that order.
    pub fn state_len(&self) -> usize {
        match self {
            Optimizer::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            Optimizer::Adam { .. } | Optimizer::AdamW { .. } => 2,
        }
    }

    /// Whether the update reads the step count (Adam's bias correction does).
    pub fn needs_step(&self) -> bool {
        !matches!(self, Optimizer::Sgd { .. })
    }
}

/// One parameter as the optimizer sees it: its value, its gradient and its state
/// ([`Optimizer::state_len`] values, each typed as the parameter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub param: ValueId,
    pub grad: ValueId,
    pub state: Vec<ValueId>,
}

/// The values a step ends with: the new parameter and the new state, in the slot's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub param: ValueId,
    pub state: Vec<ValueId>,
}

/// Why the update could not be built (the graph is then left unchanged).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OptimError {
    #[error("value {value:?} is not in the graph")]
    UnknownValue { value: ValueId },
    /// Adam's bias correction needs the step count.
    #[error("{optimizer} needs the step count (a scalar, 1 at the first step)")]
    NoStep { optimizer: &'static str },
    #[error("the step count must be a number of no dimensions, got {ty}")]
    Step { ty: Box<TensorType> },
    #[error("the learning rate must be a float of no dimensions, got {ty}")]
    Rate { ty: Box<TensorType> },
    #[error("parameter {index}: {optimizer} keeps {want} state tensors a parameter, got {got}")]
    StateCount { index: usize, optimizer: &'static str, want: usize, got: usize },
    #[error("parameter {index}: it is {ty}, not a float tensor")]
    NotFloat { index: usize, ty: Box<TensorType> },
    /// A gradient or state value typed otherwise than its parameter.
    #[error("parameter {index}: its {what} is {ty}, the parameter {param}")]
    Mismatch { index: usize, what: &'static str, ty: Box<TensorType>, param: Box<TensorType> },
    /// An update op failed shape inference or could not be added.
    #[error("building the update")]
    Build(#[source] IrError),
}

/// Appends to `graph` one step of `optimizer` for each slot and returns the new values, which
/// the caller makes outputs (or aliases onto the parameters and state). `step` is the step
/// count, 1 at the first step as in PyTorch, a scalar of any number type; only Adam and AdamW
/// read it. On an error the graph is left unchanged.
pub fn append_update(
    graph: &mut Graph,
    optimizer: &Optimizer,
    step: Option<ValueId>,
    slots: &[Slot],
) -> Result<Vec<Update>, OptimError> {
    append_update_at(graph, optimizer, step, None, slots)
}

/// [`append_update`] with the learning rate read from `lr` (a float scalar of the graph, such
/// as an input a schedule sets each step) instead of the optimizer's constant; `None` is the
/// constant. Every use of the rate reads it: SGD's step, Adam's step size, AdamW's decay
/// `1 - lr·wd`.
pub fn append_update_at(
    graph: &mut Graph,
    optimizer: &Optimizer,
    step: Option<ValueId>,
    lr: Option<ValueId>,
    slots: &[Slot],
) -> Result<Vec<Update>, OptimError> {
    check(graph, optimizer, step, slots)?;
    if let Some(r) = lr {
        let t = match graph.try_node(r.node) {
            Some(n) if r.output < n.outputs.len() => graph.value_type(r),
            _ => return Err(OptimError::UnknownValue { value: r }),
        };
        if t.shape.rank() != 0 || !t.kind.is_tensor() || !t.dtype.is_float() {
            return Err(OptimError::Rate { ty: Box::new(t.clone()) });
        }
    }
    let g = GraphBuilder::from_graph(graph.clone());
    let step = if optimizer.needs_step() { step.map(|s| g.value(s)) } else { None };
    let lr = lr.map(|r| g.value(r));
    let mut traced = Vec::with_capacity(slots.len());
    for slot in slots {
        let x = g.value(slot.param);
        let grad = g.value(slot.grad);
        let state: Vec<Traced> = slot.state.iter().map(|&s| g.value(s)).collect();
        traced.push(update(optimizer, step, lr, x, grad, &state)?);
    }
    // The ids are read before `build` takes the builder; a value that failed to trace has
    // recorded the error `build` returns.
    let ids: Vec<Option<Update>> = traced
        .iter()
        .map(|(x, state)| {
            Some(Update {
                param: x.id()?,
                state: state.iter().map(Traced::id).collect::<Option<_>>()?,
            })
        })
        .collect();
    let built = g.build().map_err(OptimError::Build)?;
    let updates = ids.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
        OptimError::Build(IrError::Graph("an update value failed to trace".into()))
    })?;
    *graph = built;
    Ok(updates)
}

fn check(
    graph: &Graph,
    optimizer: &Optimizer,
    step: Option<ValueId>,
    slots: &[Slot],
) -> Result<(), OptimError> {
    let ty = |v: ValueId| -> Result<&TensorType, OptimError> {
        match graph.try_node(v.node) {
            Some(n) if v.output < n.outputs.len() => Ok(graph.value_type(v)),
            _ => Err(OptimError::UnknownValue { value: v }),
        }
    };
    if optimizer.needs_step() {
        let s = step.ok_or(OptimError::NoStep { optimizer: optimizer.name() })?;
        let t = ty(s)?;
        if t.shape.rank() != 0 || !t.kind.is_tensor() || !t.dtype.is_numeric() {
            return Err(OptimError::Step { ty: Box::new(t.clone()) });
        }
    }
    for (index, slot) in slots.iter().enumerate() {
        let p = ty(slot.param)?;
        if !p.dtype.is_float() || !p.kind.is_tensor() {
            return Err(OptimError::NotFloat { index, ty: Box::new(p.clone()) });
        }
        let want = optimizer.state_len();
        if slot.state.len() != want {
            let (optimizer, got) = (optimizer.name(), slot.state.len());
            return Err(OptimError::StateCount { index, optimizer, want, got });
        }
        let named = std::iter::once(("gradient", slot.grad))
            .chain(slot.state.iter().map(|&s| ("state", s)));
        for (what, v) in named {
            let t = ty(v)?;
            if t != p {
                let (ty, param) = (Box::new(t.clone()), Box::new(p.clone()));
                return Err(OptimError::Mismatch { index, what, ty, param });
            }
        }
    }
    Ok(())
}

/// One parameter's step: its new value and new state. (`check` has made sure of the state and
/// the step; they are matched again here rather than indexed.)
fn update<'g>(
    optimizer: &Optimizer,
    step: Option<Traced<'g>>,
    rate: Option<Traced<'g>>,
    x: Traced<'g>,
    grad: Traced<'g>,
    state: &[Traced<'g>],
) -> Result<(Traced<'g>, Vec<Traced<'g>>), OptimError> {
    // The rate as a value typed as the parameter: the input's, else the constant.
    let dtype = x.ty().map_or(DType::F32, |t| t.dtype);
    let rate_of = |lr: f64| rate.map_or_else(|| x.scalar(lr), |r| r.cast(dtype));
    let adam = |x: Traced<'g>, g: Traced<'g>, lr, beta1, beta2, epsilon| match (state, step) {
        (&[m, v], Some(t)) => Ok(adam_torch(x, g, m, v, t, rate_of(lr), beta1, beta2, epsilon)),
        (_, None) => Err(OptimError::NoStep { optimizer: optimizer.name() }),
        _ => Err(OptimError::StateCount {
            index: 0,
            optimizer: optimizer.name(),
            want: 2,
            got: state.len(),
        }),
    };
    Ok(match *optimizer {
        Optimizer::Sgd { lr, momentum: mu, nesterov, weight_decay } => {
            let g = regularized(x, grad, weight_decay);
            let lr = rate_of(lr);
            match state.first() {
                Some(&v) => {
                    // PyTorch's buffer starts as the first gradient: with a zero buffer and
                    // β = 1, μ·0 + g is that.
                    let (x_new, v_new) = momentum(x, g, v, lr, None, mu, nesterov);
                    (x_new, vec![v_new])
                }
                None => (x.sub(lr.mul(g)), vec![]),
            }
        }
        Optimizer::Adam { lr, beta1, beta2, epsilon, weight_decay } => {
            adam(x, regularized(x, grad, weight_decay), lr, beta1, beta2, epsilon)?
        }
        Optimizer::AdamW { lr, beta1, beta2, epsilon, weight_decay } => {
            let decayed = match rate {
                _ if weight_decay == 0.0 => x,
                None => x.mul(x.scalar(1.0 - lr * weight_decay)),
                Some(_) => x.mul(x.scalar(1.0).sub(rate_of(lr).mul(x.scalar(weight_decay)))),
            };
            adam(decayed, grad, lr, beta1, beta2, epsilon)?
        }
    })
}

/// PyTorch's Adam step from `x` (already decayed for AdamW) along the regularized gradient.
#[allow(clippy::too_many_arguments)]
fn adam_torch<'g>(
    x: Traced<'g>,
    g: Traced<'g>,
    m: Traced<'g>,
    v: Traced<'g>,
    step: Traced<'g>,
    lr: Traced<'g>,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
) -> (Traced<'g>, Vec<Traced<'g>>) {
    let t = step.cast(x.ty().map_or(DType::F32, |t| t.dtype));
    let one = x.scalar(1.0);
    let bc1 = one.sub(x.scalar(beta1).pow(t));
    let bc2 = one.sub(x.scalar(beta2).pow(t));
    let step_size = lr.div(bc1);
    let (dir, m_new, v_new) =
        adam_direction(g, m, v, beta1, beta2, epsilon, Some(bc2.sqrt().reciprocal()));
    (x.sub(step_size.mul(dir)), vec![m_new, v_new])
}

/// g + λ·x, the gradient of the loss plus ½λ‖x‖² (λ = 0: `g`, with no op).
pub(crate) fn regularized<'g>(x: Traced<'g>, g: Traced<'g>, lambda: f64) -> Traced<'g> {
    if lambda == 0.0 {
        g
    } else {
        x.scalar(lambda).mul(x).add(g)
    }
}

/// Momentum, as ONNX's `Momentum` defines it: v' = α·v + β·g (β: `None` is 1), then
/// x' = x - r·v', or with Nesterov x' = x - r·(g + α·v'). Returns (x', v').
pub(crate) fn momentum<'g>(
    x: Traced<'g>,
    g: Traced<'g>,
    v: Traced<'g>,
    r: Traced<'g>,
    beta: Option<Traced<'g>>,
    alpha: f64,
    nesterov: bool,
) -> (Traced<'g>, Traced<'g>) {
    let alpha = x.scalar(alpha);
    let scaled = match beta {
        Some(b) => b.mul(g),
        None => g,
    };
    let v_new = alpha.mul(v).add(scaled);
    let dir = if nesterov { g.add(alpha.mul(v_new)) } else { v_new };
    (x.sub(r.mul(dir)), v_new)
}

/// Adam's moments and direction: v' = α·v + (1-α)·g, h' = β·h + (1-β)·g², and the direction
/// v' / (√h'·c + ε), with `c` (`None`: 1) the second moment's bias correction where ε is outside
/// it (PyTorch's placement; ONNX's folds the corrections into the rate). Returns (direction, v', h').
pub(crate) fn adam_direction<'g>(
    g: Traced<'g>,
    v: Traced<'g>,
    h: Traced<'g>,
    alpha: f64,
    beta: f64,
    epsilon: f64,
    c: Option<Traced<'g>>,
) -> (Traced<'g>, Traced<'g>, Traced<'g>) {
    let v_new = g.scalar(alpha).mul(v).add(g.scalar(1.0 - alpha).mul(g));
    let h_new = g.scalar(beta).mul(h).add(g.scalar(1.0 - beta).mul(g.mul(g)));
    let root = h_new.sqrt();
    let root = match c {
        Some(c) => root.mul(c),
        None => root,
    };
    let dir = v_new.div(root.add(g.scalar(epsilon)));
    (dir, v_new, h_new)
}

#[cfg(test)]
mod tests;
