//! Training: one compiled step and a session that runs it.
//!
//! [`step_graph`] turns a forward graph with a scalar loss into the graph of one training step:
//! the forward pass, the loss, its gradients (`kiln_ir::grad::append_backward`) and the
//! optimizer's update (`kiln_ir::train::append_update_at`), with the parameters, their
//! optimizer state, the step count and the learning rate as inputs beside the batch, and the
//! loss, the new parameters and the new state as outputs. It is an ordinary graph, compiled by
//! the ordinary driver (the same passes, fusion and codegen). What the step carries from one
//! run to the next is a pure decision, [`StepPlan`], which prints and is pinned by a snapshot.
//!
//! [`TrainSession`] compiles that graph once and keeps the parameters and state resident. On
//! the CPU it updates them in place: each carried output `<x>.new` is written over its input
//! `<x>` (`Options::in_place`: one buffer a value, which the session owns and passes to every
//! run, `Executable::run_with_state`), the compiler ordering every kernel that reads the old
//! value before the one that writes the new (`inplace::plan`). Only the batch goes in and the
//! loss comes out; nothing is copied or allocated per step. GPU targets, where the runtime binds
//! no state, feed the step's outputs back as the next step's inputs (copied each step).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use kiln_ir::grad::{append_backward, GradError};
use kiln_ir::train::{
    append_update_at, autocast, running_statistics, Autocast, OptimError, Optimizer, Slot,
};
use kiln_ir::{DType, Graph, IrError, Tensor, TensorType, ValueId};
use kiln_runtime::{Executable, LoadOptions, RuntimeError};
use thiserror::Error;

use crate::{CompileError, Options, Precision, TargetKind};

/// Why a training step could not be built, compiled or run.
#[derive(Debug, Error)]
pub enum TrainError {
    #[error("the graph has no output `{name}` to train on (its outputs: {outputs})")]
    UnknownLoss { name: String, outputs: String },
    #[error("the loss `{name}` must be a float of one element, but it is {ty}")]
    LossNotScalar { name: String, ty: Box<TensorType> },
    #[error("output `{name}` is {ty}, not float scores of [batch, classes]")]
    NotScores { name: String, ty: Box<TensorType> },
    #[error("`{name}` is not a parameter: the graph has no constant of that name")]
    UnknownParam { name: String },
    #[error("parameter `{name}` is {ty}, not a float tensor")]
    ParamNotFloat { name: String, ty: Box<TensorType> },
    #[error("parameter `{name}` is given twice")]
    DuplicateParam { name: String },
    /// Each step updates a running statistic by its momentum; the optimizer cannot also.
    #[error("`{name}` is a running statistic of a training-mode BatchNormalization, which each step updates itself: it cannot be a trained parameter")]
    RunningStatParam { name: String },
    #[error("the running statistic `{name}` is updated by more than one BatchNormalization")]
    SharedRunningStat { name: String },
    #[error("no parameters to train")]
    NoParams,
    #[error("the step takes {want} batch tensors ({names}), {got} given")]
    BatchCount { want: usize, got: usize, names: String },
    #[error("batch input `{name}` is {want}, got {got}")]
    BatchInput { name: String, want: Box<TensorType>, got: Box<TensorType> },
    #[error("parameter `{name}` is {want}, got {got}")]
    ParamValue { name: String, want: Box<TensorType>, got: Box<TensorType> },
    /// A precision the training step cannot run at on this target.
    #[error("training in {precision} on {target}: {why}")]
    Precision { precision: Precision, target: &'static str, why: String },
    #[error("the learning rate must be finite, got {lr}")]
    Rate { lr: f64 },
    #[error("building the gradients")]
    Grad(#[source] GradError),
    #[error("building the optimizer's update")]
    Optim(#[source] OptimError),
    #[error("building the step graph")]
    Graph(#[source] IrError),
    #[error("compiling the training step")]
    Compile(#[source] CompileError),
    #[error("running the training step")]
    Run(#[source] RuntimeError),
    #[error("the step's loss is not a float of one element")]
    LossValue,
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    #[error("writing the trained model")]
    Onnx(#[source] IrError),
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// What one training step takes and gives, by name, in the step graph's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    /// The forward graph's own inputs: what each step brings.
    pub batch: Vec<String>,
    /// The trained parameters (inputs), in the order given.
    pub params: Vec<String>,
    /// The optimizer state inputs: (name, parameter), `Optimizer::state_len` a parameter.
    pub state: Vec<(String, String)>,
    /// The running statistics of training-mode BatchNormalizations (inputs after the state):
    /// each step gives their update, carried like the state.
    pub running: Vec<String>,
    /// The step count input (i64, 1 at the first step), where the optimizer reads it.
    pub step: Option<String>,
    /// The learning rate input (f32 scalar).
    pub lr: String,
    /// The loss output (the step's first).
    pub loss: String,
    /// What a step carries to the next: (output, the input it becomes), each parameter, each
    /// state, then each running statistic, in that order after the loss.
    pub carried: Vec<(String, String)>,
    /// Whether each carried output is written over its input in place (`TrainSession` on the
    /// CPU) rather than fed back as the next step's input; `step_graph` leaves it false.
    pub in_place: bool,
}

impl StepPlan {
    /// The (input, output) pairs a step writes in place (`Options::in_place`): every carried
    /// value.
    pub fn in_place_pairs(&self) -> Vec<(String, String)> {
        self.carried.iter().map(|(o, i)| (i.clone(), o.clone())).collect()
    }
}

impl fmt::Display for StepPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "batch:  {}", self.batch.join(", "))?;
        writeln!(f, "params: {}", self.params.join(", "))?;
        let state: Vec<String> = self.state.iter().map(|(s, p)| format!("{s} (of {p})")).collect();
        writeln!(f, "state:  {}", if state.is_empty() { "-".into() } else { state.join(", ") })?;
        // (Only where there are some: the plans of models without them read as before.)
        if !self.running.is_empty() {
            writeln!(f, "running: {}", self.running.join(", "))?;
        }
        writeln!(f, "step:   {}", self.step.as_deref().unwrap_or("-"))?;
        writeln!(f, "lr:     {}", self.lr)?;
        writeln!(f, "loss:   {} (output 0)", self.loss)?;
        for (i, (o, input)) in self.carried.iter().enumerate() {
            if self.in_place {
                writeln!(f, "`{o}` written over input `{input}` (in place)")?;
            } else {
                writeln!(f, "output {} `{o}` -> next step's input `{input}`", i + 1)?;
            }
        }
        Ok(())
    }
}

/// The graph of one training step and what it carries.
#[derive(Clone, Debug)]
pub struct StepGraph {
    pub graph: Graph,
    pub plan: StepPlan,
    /// Each parameter's value in the forward graph (its initial value).
    pub initial: Vec<Tensor>,
    /// Each running statistic's value in the forward graph.
    pub running: Vec<Tensor>,
}

/// Names of the state inputs of `param` under `optimizer`.
fn state_names(optimizer: &Optimizer, param: &str) -> Vec<String> {
    let kinds: &[&str] = match optimizer {
        Optimizer::Sgd { .. } => &["momentum"],
        Optimizer::Adam { .. } | Optimizer::AdamW { .. } => &["m", "v"],
    };
    kinds.iter().take(optimizer.state_len()).map(|k| format!("{param}.{k}")).collect()
}

/// Builds the step graph of `forward` trained on its output `loss` for the constants `params`
/// (named as in the graph: ONNX initializers, the builder's constants), which become inputs.
/// The running statistics of training-mode BatchNormalizations (`train::running_statistics`)
/// become inputs too, and their updates outputs. The forward graph's other outputs are
/// dropped. Inputs, in order: the forward graph's inputs (the batch), the parameters, their
/// state, the running statistics, `step` (where the optimizer reads it), `lr`. Outputs: the
/// loss, then `<param>.new` each, `<state>.new` each, `<statistic>.new` each.
pub fn step_graph(
    forward: &Graph,
    loss: &str,
    params: &[&str],
    optimizer: &Optimizer,
) -> Result<StepGraph> {
    let mut g = forward.clone();
    let outputs = || output_names(forward);
    let loss_value =
        forward.outputs().iter().find(|(n, _)| n == loss).map(|(_, v)| *v).ok_or_else(|| {
            TrainError::UnknownLoss { name: loss.to_string(), outputs: outputs() }
        })?;
    let lt = forward.value_type(loss_value);
    if !lt.dtype.is_float() || !lt.kind.is_tensor() || lt.shape.numel() != Some(1) {
        return Err(TrainError::LossNotScalar { name: loss.to_string(), ty: Box::new(lt.clone()) });
    }
    if params.is_empty() {
        return Err(TrainError::NoParams);
    }
    let batch: Vec<String> =
        forward.inputs().iter().map(|&i| forward.node(i).name.clone()).collect();
    // Found before the parameters' constants are replaced (the value ids stay valid: the
    // graph's nodes keep their ids when others are removed).
    let stats = running_statistics(&g);
    g.set_outputs(vec![(loss.to_string(), loss_value)]).map_err(TrainError::Graph)?;
    // Named, and refused as parameters, before any constant is replaced.
    let mut running = Vec::with_capacity(stats.len());
    for (i, stat) in stats.iter().enumerate() {
        let name = g.node(stat.constant.node).name.clone();
        if params.contains(&name.as_str()) {
            return Err(TrainError::RunningStatParam { name });
        }
        if stats[..i].iter().any(|s| s.constant == stat.constant) {
            return Err(TrainError::SharedRunningStat { name });
        }
        // (running_statistics finds constants only.)
        let Some(t) = g.constant_value(stat.constant).cloned() else { continue };
        running.push((name, stat.constant, stat.update, t));
    }
    // Each parameter's constant becomes an input of its name.
    let mut values = Vec::with_capacity(params.len());
    let mut initial = Vec::with_capacity(params.len());
    for (i, &name) in params.iter().enumerate() {
        if params[..i].contains(&name) {
            return Err(TrainError::DuplicateParam { name: name.to_string() });
        }
        let unknown = || TrainError::UnknownParam { name: name.to_string() };
        let id = g.node_by_name(name).ok_or_else(unknown)?;
        let v = ValueId::from(id);
        let t = g.constant_value(v).ok_or_else(unknown)?.clone();
        let ty = g.value_type(v).clone();
        if !ty.dtype.is_float() || !ty.kind.is_tensor() {
            return Err(TrainError::ParamNotFloat { name: name.to_string(), ty: Box::new(ty) });
        }
        let temp = g.unique_name(&format!("{name}.param"));
        let input = g.add_input(&temp, ty).map_err(TrainError::Graph)?;
        g.replace_uses(v, input).map_err(TrainError::Graph)?;
        g.remove_node(id).map_err(TrainError::Graph)?;
        g.rename_node(input.node, name).map_err(TrainError::Graph)?;
        values.push(input);
        initial.push(t);
    }
    let mut state = Vec::new();
    let mut slots = Vec::with_capacity(params.len());
    for (&name, &p) in params.iter().zip(&values) {
        let ty = g.value_type(p).clone();
        let mut ids = Vec::new();
        for s in state_names(optimizer, name) {
            let unique = g.unique_name(&s);
            ids.push(g.add_input(&unique, ty.clone()).map_err(TrainError::Graph)?);
            state.push((unique, name.to_string()));
        }
        // The gradient is filled in once the backward graph exists.
        slots.push(Slot { param: p, grad: p, state: ids });
    }
    // Each running statistic's constant becomes an input of its name, as a parameter's does.
    let mut running_initial = Vec::with_capacity(running.len());
    for (name, c, _, t) in &running {
        let temp = g.unique_name(&format!("{name}.running"));
        let input = g.add_input(&temp, t.ty()).map_err(TrainError::Graph)?;
        g.replace_uses(*c, input).map_err(TrainError::Graph)?;
        g.remove_node(c.node).map_err(TrainError::Graph)?;
        g.rename_node(input.node, name).map_err(TrainError::Graph)?;
        running_initial.push(t.clone());
    }
    let step = if optimizer.needs_step() {
        let name = g.unique_name("step");
        let v = g.add_input(&name, TensorType::new(DType::I64, [])).map_err(TrainError::Graph)?;
        Some((name, v))
    } else {
        None
    };
    let lr_name = g.unique_name("lr");
    let lr = g.add_input(&lr_name, TensorType::new(DType::F32, [])).map_err(TrainError::Graph)?;
    let grads = append_backward(&mut g, loss_value, &values).map_err(TrainError::Grad)?;
    for (slot, d) in slots.iter_mut().zip(grads) {
        slot.grad = d;
    }
    let updates = append_update_at(&mut g, optimizer, step.as_ref().map(|s| s.1), Some(lr), &slots)
        .map_err(TrainError::Optim)?;
    let mut outs = vec![(loss.to_string(), loss_value)];
    let mut carried = Vec::new();
    for (&name, u) in params.iter().zip(&updates) {
        outs.push((format!("{name}.new"), u.param));
        carried.push((format!("{name}.new"), name.to_string()));
    }
    let mut state_iter = state.iter();
    for u in &updates {
        for &v in &u.state {
            let (s, _) = state_iter.next().expect("a state name a state value");
            outs.push((format!("{s}.new"), v));
            carried.push((format!("{s}.new"), s.clone()));
        }
    }
    for (name, _, update, _) in &running {
        outs.push((format!("{name}.new"), *update));
        carried.push((format!("{name}.new"), name.clone()));
    }
    g.set_outputs(outs).map_err(TrainError::Graph)?;
    g.name = format!("{}_train_step", forward.name);
    let plan = StepPlan {
        batch,
        params: params.iter().map(|p| p.to_string()).collect(),
        state,
        running: running.into_iter().map(|(name, ..)| name).collect(),
        step: step.map(|s| s.0),
        lr: lr_name,
        loss: loss.to_string(),
        carried,
        in_place: false,
    };
    Ok(StepGraph { graph: g, plan, initial, running: running_initial })
}

/// `graph` with the constants named in `values` holding those values instead (each typed as the
/// constant): the forward graph with trained weights, for inference.
pub fn with_constants(graph: &Graph, values: &[(String, Tensor)]) -> Result<Graph> {
    let mut g = graph.clone();
    for (name, t) in values {
        let unknown = || TrainError::UnknownParam { name: name.clone() };
        let id = g.node_by_name(name).ok_or_else(unknown)?;
        let v = ValueId::from(id);
        let ty = g.constant_value(v).ok_or_else(unknown)?.ty();
        if t.ty() != ty {
            let (want, got) = (Box::new(ty), Box::new(t.ty()));
            return Err(TrainError::ParamValue { name: name.clone(), want, got });
        }
        let temp = g.unique_name(&format!("{name}.trained"));
        let c = g.add_constant(&temp, t.clone()).map_err(TrainError::Graph)?;
        g.replace_uses(v, c).map_err(TrainError::Graph)?;
        g.remove_node(id).map_err(TrainError::Graph)?;
        g.rename_node(c.node, name).map_err(TrainError::Graph)?;
    }
    Ok(g)
}

/// `graph` with a loss: an `i64[batch]` input `labels` (class numbers) and an output `loss`, the
/// mean softmax cross-entropy of its output `logits` (`f32[batch, classes]`) against them. The
/// graph's outputs are kept after the loss.
pub fn with_cross_entropy(graph: &Graph, logits: &str) -> Result<Graph> {
    use kiln_ir::builder::GraphBuilder;
    use kiln_ir::op::{Loss, LossReduction};
    let v =
        graph.outputs().iter().find(|(n, _)| n == logits).map(|(_, v)| *v).ok_or_else(|| {
            TrainError::UnknownLoss { name: logits.to_string(), outputs: output_names(graph) }
        })?;
    let ty = graph.value_type(v).clone();
    let batch = match ty.shape.dims() {
        [b, _] if ty.dtype.is_float() => b.clone(),
        _ => return Err(TrainError::NotScores { name: logits.to_string(), ty: Box::new(ty) }),
    };
    let b = GraphBuilder::from_graph(graph.clone());
    let labels = b.input("labels", DType::I64, vec![batch]);
    let op = kiln_ir::Op::SoftmaxCrossEntropyLoss(Loss {
        reduction: LossReduction::Mean,
        ignore_index: None,
    });
    let loss = b.apply(op, &[Some(b.value(v)), Some(labels)], 1)[0];
    b.output("loss", loss);
    b.build().map_err(TrainError::Graph)
}

fn output_names(g: &Graph) -> String {
    let names: Vec<&str> = g.outputs().iter().map(|(n, _)| n.as_str()).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Makes the step's arithmetic `precision` on `target`: f32 leaves it as it is (`None`); bf16 is
/// automatic mixed precision, `kiln_ir::train::autocast` over the whole step (forward and
/// backward): every Conv, ConvTranspose, MatMul and Gemm reads its multiplied operands rounded
/// to bf16 and sums in f32, while the parameters (master weights), the optimizer's state and
/// update, the loss, softmax and normalisation stay f32. bf16 keeps f32's exponent range, so no
/// loss scale is needed. f16 would need one (its gradients underflow), which is not built, and
/// TF32 is a GPU format: both are refused, as is bf16 off the CPU (built and tested there only).
pub fn mixed_precision(
    step: &mut StepGraph,
    precision: Precision,
    target: TargetKind,
) -> Result<Option<Autocast>> {
    let refuse = |why: &str| TrainError::Precision {
        precision,
        target: target.name(),
        why: why.to_string(),
    };
    match precision {
        Precision::F32 => Ok(None),
        Precision::Bf16 if target == TargetKind::Cpu => {
            Ok(Some(autocast(&mut step.graph, DType::BF16).map_err(TrainError::Graph)?))
        }
        Precision::Bf16 => {
            Err(refuse("bf16 mixed precision is built and tested for the CPU's training step only"))
        }
        Precision::F16 => Err(refuse(
            "f16 mixed precision needs a loss scale (small gradients underflow f16), \
             which is not built; bf16 (f32's exponent range) needs none",
        )),
        Precision::Tf32 => {
            Err(refuse("TF32 is a GPU tensor-core format, not a training precision kiln builds"))
        }
    }
}

/// How a [`TrainSession`] compiles and loads its step.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Compile options (the target, threads are the load's); the input shapes are the graph's.
    /// `in_place` is set by the session (on the CPU).
    pub compile: Options,
    /// Load options.
    pub load: LoadOptions,
    /// The learning rate at the first step (`TrainSession::set_lr` changes it at any step);
    /// `None`: the optimizer's.
    pub lr: Option<f64>,
    /// The arithmetic of the step's contractions: f32, or bf16 mixed precision
    /// ([`mixed_precision`]: bf16-rounded operands, f32 sums, f32 master weights).
    pub precision: Precision,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            compile: Options { cache: false, ..Options::default() },
            load: LoadOptions::default(),
            lr: None,
            precision: Precision::F32,
        }
    }
}

/// A model being trained: its step compiled once, its parameters and optimizer state resident
/// between steps.
pub struct TrainSession {
    plan: StepPlan,
    exe: Executable,
    /// The batch inputs' types, for errors naming them.
    batch_types: Vec<TensorType>,
    /// Parameters, optimizer state, running statistics, in the plan's order. In place (the
    /// CPU): the step's state, each in one buffer of its own that every step reads and writes
    /// (`Executable::run_with_state`). Else the step's inputs after the batch, replaced by its
    /// outputs after each step. Step and lr are added at each step.
    carried: Vec<Tensor>,
    /// Where each parameter is in `plan.params`, by name.
    index: HashMap<String, usize>,
    steps: u64,
    lr: f64,
    optimizer: Optimizer,
    /// The forward graph, whose constants `trained_graph` replaces.
    forward: Graph,
    /// What mixed precision cast (`None` in f32).
    autocast: Option<Autocast>,
}

impl TrainSession {
    /// Compiles the training step of `graph` on its output `loss` for the constants named in
    /// `params`, starting from their values in the graph with zero optimizer state.
    pub fn new(
        graph: &Graph,
        loss: &str,
        params: &[&str],
        optimizer: Optimizer,
        options: TrainOptions,
    ) -> Result<TrainSession> {
        let lr = options.lr.unwrap_or(match optimizer {
            Optimizer::Sgd { lr, .. }
            | Optimizer::Adam { lr, .. }
            | Optimizer::AdamW { lr, .. } => lr,
        });
        if !lr.is_finite() {
            return Err(TrainError::Rate { lr });
        }
        let mut step = step_graph(graph, loss, params, &optimizer)?;
        let autocast = mixed_precision(&mut step, options.precision, options.compile.target)?;
        // The runtime binds state in place on the CPU only; elsewhere the outputs come back.
        step.plan.in_place = options.compile.target == crate::TargetKind::Cpu;
        let compile = Options {
            in_place: if step.plan.in_place { step.plan.in_place_pairs() } else { Vec::new() },
            ..options.compile
        };
        let exe = crate::jit(&step.graph, &compile, &options.load).map_err(TrainError::Compile)?;
        let batch_types =
            graph.inputs().iter().map(|&i| graph.node(i).outputs[0].clone()).collect();
        let mut carried: Vec<Tensor> = step.initial.clone();
        for (_, p) in &step.plan.state {
            let i = step.plan.params.iter().position(|q| q == p).expect("a state's parameter");
            carried.push(Tensor::zeros(step.initial[i].dtype(), step.initial[i].dims()));
        }
        carried.extend(step.running.iter().cloned());
        // Buffers of the session's own (not the graph's constants'), which the steps write.
        for t in &mut carried {
            *t = Tensor::from_bytes(t.dtype(), t.dims(), t.bytes()).map_err(TrainError::Graph)?;
        }
        let index = step.plan.params.iter().enumerate().map(|(i, p)| (p.clone(), i)).collect();
        Ok(TrainSession {
            plan: step.plan,
            exe,
            batch_types,
            carried,
            index,
            steps: 0,
            lr,
            optimizer,
            forward: graph.clone(),
            autocast,
        })
    }

    /// What the step takes and carries.
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    /// The contractions mixed precision cast (`None` in f32).
    pub fn autocast(&self) -> Option<&Autocast> {
        self.autocast.as_ref()
    }

    /// The compiled step.
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// Each value updated in place with the launches that read its old value and the one that
    /// writes the new, in launch order (`inplace::describe`); empty off the CPU.
    pub fn schedule(&self) -> String {
        crate::inplace::describe(self.exe.manifest())
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The learning rate the next step uses.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the learning rate of the next steps (a schedule): an input of the step, so nothing
    /// is recompiled.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if !lr.is_finite() {
            return Err(TrainError::Rate { lr });
        }
        self.lr = lr;
        Ok(())
    }

    /// One step on `batch` (the forward graph's inputs, in order): returns the loss before the
    /// update, and updates the parameters and state.
    pub fn step(&mut self, batch: &[Tensor]) -> Result<f32> {
        if batch.len() != self.batch_types.len() {
            return Err(TrainError::BatchCount {
                want: self.batch_types.len(),
                got: batch.len(),
                names: self.plan.batch.join(", "),
            });
        }
        for ((t, want), name) in batch.iter().zip(&self.batch_types).zip(&self.plan.batch) {
            let fits = t.dtype() == want.dtype
                && want.shape.dims().len() == t.rank()
                && want.shape.dims().iter().zip(t.dims()).all(|(d, &n)| d.fixed() == Some(n));
            if !fits {
                return Err(TrainError::BatchInput {
                    name: name.clone(),
                    want: Box::new(want.clone()),
                    got: Box::new(t.ty()),
                });
            }
        }
        let mut inputs: Vec<Tensor> = Vec::with_capacity(batch.len() + self.carried.len() + 2);
        inputs.extend(batch.iter().cloned());
        if !self.plan.in_place {
            inputs.extend(self.carried.iter().cloned());
        }
        if self.plan.step.is_some() {
            inputs.push(Tensor::scalar(self.steps as i64 + 1));
        }
        inputs.push(Tensor::scalar(self.lr as f32));
        let mut out = if self.plan.in_place {
            // The kernels write the new values over the old, in the session's buffers.
            self.exe.run_with_state(&inputs, &mut self.carried).map_err(TrainError::Run)?
        } else {
            self.exe.run(&inputs).map_err(TrainError::Run)?
        };
        let loss =
            out.first().and_then(|l| l.to_f64s().first().copied()).ok_or(TrainError::LossValue)?;
        if !self.plan.in_place {
            self.carried = out.split_off(1);
        }
        self.steps += 1;
        Ok(loss as f32)
    }

    /// The names of the parameters, in order.
    pub fn param_names(&self) -> &[String] {
        &self.plan.params
    }

    /// Parameter `name`'s value now.
    pub fn param(&self, name: &str) -> Result<&Tensor> {
        let i = self.param_index(name)?;
        Ok(&self.carried[i])
    }

    /// Sets parameter `name` (typed as it is).
    pub fn set_param(&mut self, name: &str, value: Tensor) -> Result<()> {
        let i = self.param_index(name)?;
        let have = &self.carried[i];
        if value.dtype() != have.dtype() || value.dims() != have.dims() {
            return Err(TrainError::ParamValue {
                name: name.to_string(),
                want: Box::new(have.ty()),
                got: Box::new(value.ty()),
            });
        }
        // A buffer of the session's own (the caller's tensor is not written by later steps).
        self.carried[i] = Tensor::from_bytes(value.dtype(), value.dims(), value.bytes())
            .map_err(TrainError::Graph)?;
        Ok(())
    }

    fn param_index(&self, name: &str) -> Result<usize> {
        self.index
            .get(name)
            .copied()
            .ok_or_else(|| TrainError::UnknownParam { name: name.to_string() })
    }

    /// Every parameter by name, as the graph's constants would take them.
    pub fn params(&self) -> Vec<(String, Tensor)> {
        self.plan.params.iter().cloned().zip(self.carried.iter().cloned()).collect()
    }

    /// Every running statistic of a training-mode BatchNormalization by name (as the graph's
    /// constants would take them): their values after the steps taken.
    pub fn running_stats(&self) -> Vec<(String, Tensor)> {
        let first = self.carried.len() - self.plan.running.len();
        self.plan.running.iter().cloned().zip(self.carried[first..].iter().cloned()).collect()
    }

    /// The parameters then the running statistics: every constant the steps change, as
    /// `save_onnx` writes them into the model's initializers.
    pub fn trained(&self) -> Vec<(String, Tensor)> {
        let mut all = self.params();
        all.extend(self.running_stats());
        all
    }

    /// The forward graph with the parameters' and running statistics' values now: the trained
    /// model.
    pub fn trained_graph(&self) -> Result<Graph> {
        with_constants(&self.forward, &self.trained())
    }

    /// Writes a copy of the ONNX model `source` (the model the session's graph was imported
    /// from) to `path` with each initializer named as a parameter or running statistic replaced
    /// by its value now.
    pub fn save_onnx(&self, source: &Path, path: &Path) -> Result<()> {
        let bytes = std::fs::read(source).map_err(|e| TrainError::File {
            path: source.display().to_string(),
            msg: e.to_string(),
        })?;
        let out = kiln_ir::onnx::replace_initializers(&bytes, &self.trained())
            .map_err(TrainError::Onnx)?;
        std::fs::write(path, out)
            .map_err(|e| TrainError::File { path: path.display().to_string(), msg: e.to_string() })
    }
}
