//! `TrainSession`: a training step compiled for the CPU against the interpreter running the same
//! step graph, the parameters updated in place in one buffer each that the session owns (no
//! copy, no allocation per step; every reader of an old value ordered before its write), the
//! step's plan and schedule pinned, bad input refused by name, and the trained weights written
//! back into the ONNX model they came from.

use kiln_compiler::train::{
    mixed_precision, step_graph, with_cross_entropy, StepGraph, TrainError,
};
use kiln_compiler::{Options, Precision, TargetKind, TrainOptions, TrainSession};
use kiln_ir::builder::{ConvOptions, GraphBuilder, Traced};
use kiln_ir::op::{Loss, LossReduction, Rnn, RnnCell, RnnDirection};
use kiln_ir::train::Optimizer;
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::LoadOptions;

const PARAMS: [&str; 4] = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"];

/// A constant of `dims` drawn uniformly from [-k, k), seeded: a test model's weight.
fn scaled<'g>(g: &'g GraphBuilder, name: &str, dims: &[usize], seed: u64, k: f64) -> Traced<'g> {
    let t = Tensor::random(DType::F32, dims, seed);
    let v: Vec<f64> = t.to_f64s().iter().map(|v| v * k).collect();
    g.constant(name, Tensor::from_f64s(DType::F32, dims, &v).unwrap())
}

/// Mean softmax cross-entropy of `logits` against `labels`.
fn mean_cross_entropy<'g>(
    g: &'g GraphBuilder,
    logits: Traced<'g>,
    labels: Traced<'g>,
) -> Traced<'g> {
    let op =
        Op::SoftmaxCrossEntropyLoss(Loss { reduction: LossReduction::Mean, ignore_index: None });
    g.apply(op, &[Some(logits), Some(labels)], 1)[0]
}

/// f32 on both sides, the compiled kernels summing in other orders: 1e-4 relative.
fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-4 * (1.0 + want.abs())
}

/// Each of `names` the session holds is `want`'s (`what`: the run, for the message).
fn assert_params(session: &TrainSession, names: &[&str], want: &[Tensor], what: &str) {
    for (name, want) in names.iter().zip(want) {
        for (a, b) in session.param(name).unwrap().to_f64s().iter().zip(want.to_f64s()) {
            assert!(near(*a, b), "{what} {name}: {a} vs {b}");
        }
    }
}

/// A small CNN with its loss: x f32[4,1,8,8] -> conv 1->4 3x3 (pad 1) -> relu -> maxpool 2 ->
/// flatten -> fc 64->3 -> softmax cross-entropy (mean) against labels i64[4]. Outputs the
/// logits and the loss.
fn small_cnn() -> Graph {
    let g = GraphBuilder::new("small_cnn");
    let scaled = |name: &str, dims: &[usize], seed: u64, k: f64| scaled(&g, name, dims, seed, k);
    let x = g.input("x", DType::F32, [4, 1, 8, 8]);
    let labels = g.input("labels", DType::I64, [4]);
    let c = x.conv(
        scaled("conv.weight", &[4, 1, 3, 3], 1, 0.3),
        Some(scaled("conv.bias", &[4], 2, 0.1)),
        ConvOptions::default().pad(1),
    );
    let p = c.relu().max_pool(2, 2, 0).flatten(1);
    let logits = p.linear(scaled("fc.weight", &[3, 64], 3, 0.1), scaled("fc.bias", &[3], 4, 0.1));
    let loss = mean_cross_entropy(&g, logits, labels);
    g.output("logits", logits);
    g.output("loss", loss);
    g.build().unwrap()
}

fn batch(seed: u64) -> Vec<Tensor> {
    let x = Tensor::random(DType::F32, &[4, 1, 8, 8], 100 + seed);
    let labels: Vec<i64> = (0..4).map(|i| ((i + seed) % 3) as i64).collect();
    vec![x, Tensor::from_vec(&[4], labels).unwrap()]
}

fn options(threads: usize) -> TrainOptions {
    TrainOptions {
        load: LoadOptions { threads: Some(threads), ..Default::default() },
        ..Default::default()
    }
}

/// The step graph run by the interpreter, its outputs fed back as the next step's inputs: the
/// loss of each step and the parameters at the end.
fn interpreted(step: &StepGraph, opt: &Optimizer, steps: u64, lr: f32) -> (Vec<f64>, Vec<Tensor>) {
    interpreted_on(step, opt, steps, lr, batch)
}

/// [`interpreted`] on the batches `batch` gives.
fn interpreted_on(
    step: &StepGraph,
    opt: &Optimizer,
    steps: u64,
    lr: f32,
    batch: fn(u64) -> Vec<Tensor>,
) -> (Vec<f64>, Vec<Tensor>) {
    let mut carried: Vec<Tensor> = step.initial.clone();
    for (_, p) in &step.plan.state {
        let i = step.plan.params.iter().position(|q| q == p).unwrap();
        carried.push(Tensor::zeros(DType::F32, step.initial[i].dims()));
    }
    let mut losses = Vec::new();
    for s in 0..steps {
        let mut inputs = batch(s);
        inputs.extend(carried.iter().cloned());
        if opt.needs_step() {
            inputs.push(Tensor::scalar(s as i64 + 1));
        }
        inputs.push(Tensor::scalar(lr));
        let mut out = eval::run(&step.graph, &inputs).unwrap();
        losses.push(out[0].to_f64s()[0]);
        carried = out.split_off(1);
    }
    carried.truncate(step.plan.params.len());
    (losses, carried)
}

#[test]
fn a_compiled_step_follows_the_interpreter() {
    let graph = small_cnn();
    let opts = [
        Optimizer::Sgd { lr: 0.2, momentum: 0.9, nesterov: false, weight_decay: 1e-3 },
        Optimizer::adam(0.01),
    ];
    for opt in opts {
        let step = step_graph(&graph, "loss", &PARAMS, &opt).unwrap();
        let lr = match opt {
            Optimizer::Sgd { lr, .. }
            | Optimizer::Adam { lr, .. }
            | Optimizer::AdamW { lr, .. } => lr,
        };
        let (want_losses, want_params) = interpreted(&step, &opt, 5, lr as f32);
        for threads in [1, 2] {
            let mut session =
                TrainSession::new(&graph, "loss", &PARAMS, opt, options(threads)).unwrap();
            let losses: Vec<f32> = (0..5).map(|s| session.step(&batch(s)).unwrap()).collect();
            for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
                let (a, b) = (*a as f64, *b);
                assert!(near(a, b), "{} step {s}: loss {a} vs {b}", opt.name());
            }
            assert!(
                want_losses[4] < want_losses[0],
                "{}: the loss fell: {want_losses:?}",
                opt.name()
            );
            assert_params(&session, &PARAMS, &want_params, opt.name());
        }
    }
}

/// In place: each parameter and momentum lives in one buffer of the session's, the same at every
/// step, and the step writes its new value there (the runtime binds that buffer, and nothing
/// else, as the value's input and output): the address does not change while the value does.
/// The step takes the batch and the rate, and gives the loss alone.
#[test]
fn parameters_are_updated_in_place_in_one_buffer() {
    let graph = small_cnn();
    let opt = Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let mut session = TrainSession::new(&graph, "loss", &PARAMS, opt, options(2)).unwrap();
    let exe = session.executable();
    let names = |ts: &[kiln_runtime::artifact::TensorDesc]| {
        ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(exe.inputs()), ["x", "labels", "lr"]);
    assert_eq!(names(exe.outputs()), ["loss"]);
    let state: Vec<(&str, &str)> =
        exe.state().iter().map(|s| (s.input.as_str(), s.output.as_str())).collect();
    assert_eq!(state[0], ("conv.weight", "conv.weight.new"));
    assert_eq!(state[7], ("fc.bias.momentum", "fc.bias.momentum.new"));
    assert_eq!(state.len(), 8);
    // `kiln info` lists them.
    let info = kiln_compiler::cli::artifact_lines(exe.manifest(), 0);
    assert!(
        info.contains(&"  conv.weight: f32[4,1,3,3] <- conv.weight.new".to_string()),
        "{info:?}"
    );
    let addresses = |s: &TrainSession| -> Vec<usize> {
        PARAMS.iter().map(|n| s.param(n).unwrap().bytes().as_ptr() as usize).collect()
    };
    let first = addresses(&session);
    let mut values: Vec<Vec<f64>> =
        PARAMS.iter().map(|n| session.param(n).unwrap().to_f64s()).collect();
    for s in 0..4 {
        session.step(&batch(s)).unwrap();
        assert_eq!(addresses(&session), first, "step {s}: every parameter in the same buffer");
        for (i, name) in PARAMS.iter().enumerate() {
            let now = session.param(name).unwrap().to_f64s();
            assert_ne!(now, values[i], "step {s} wrote `{name}` in its buffer");
            values[i] = now;
        }
    }

    // The runtime's side: `run_with_state` writes into the very bytes it is given; a state
    // tensor shared with another is copied first (the other keeps the old value).
    let exe = session.executable();
    let mut state: Vec<Tensor> = exe
        .state()
        .iter()
        .map(|d| {
            let n: usize = d.dims.iter().product();
            Tensor::from_f64s(DType::F32, &d.dims, &vec![0.01; n]).unwrap()
        })
        .collect();
    let shared = state[0].clone();
    let before: Vec<usize> = state.iter().map(|t| t.bytes().as_ptr() as usize).collect();
    let mut inputs = batch(0);
    inputs.push(Tensor::scalar(0.1f32));
    let out = exe.run_with_state(&inputs, &mut state).unwrap();
    assert_eq!(out.len(), 1);
    let after: Vec<usize> = state.iter().map(|t| t.bytes().as_ptr() as usize).collect();
    assert_ne!(after[0], before[0], "a shared state tensor is copied before it is written");
    assert_eq!(after[1..], before[1..], "the others are written where they are");
    assert_eq!(shared.to_f64s(), vec![0.01f32 as f64; 36], "the copy's other owner is unchanged");
    assert_ne!(state[0].to_f64s(), shared.to_f64s(), "the step wrote the new weight");
    assert_ne!(state[4].to_f64s(), vec![0.01f32 as f64; 36], "and the new momentum");
    // A run without its state is refused, naming it.
    let e = exe.run(&inputs).unwrap_err().to_string();
    assert!(e.contains("updates 8 tensors in place (conv.weight, conv.bias"), "{e}");
}

/// x f32[4,1,8,8] -> conv 1->3 3x3 (pad 1) -> relu -> conv 3->4 3x3 (pad 1) -> relu -> a gate
/// (each channel's values at or below its threshold `gate` f32[1,4,1,1] zeroed) -> maxpool 2 ->
/// flatten -> fc 64->3 -> softmax cross-entropy. The second convolution's input gradient is a
/// ConvTranspose that reads its weight, as the fc's input gradient reads the fc weight. The
/// gate is read deep in the forward but has no gradient (a comparison), so its update (weight
/// decay alone) needs nothing the forward computes: by data alone it would run first.
fn two_conv_cnn() -> Graph {
    let g = GraphBuilder::new("two_conv_cnn");
    let scaled = |name: &str, dims: &[usize], seed: u64, k: f64| scaled(&g, name, dims, seed, k);
    let x = g.input("x", DType::F32, [4, 1, 8, 8]);
    let labels = g.input("labels", DType::I64, [4]);
    let c1 = x.conv(
        scaled("conv1.weight", &[3, 1, 3, 3], 11, 0.4),
        Some(scaled("conv1.bias", &[3], 12, 0.1)),
        ConvOptions::default().pad(1),
    );
    let c2 = c1.relu().conv(
        scaled("conv2.weight", &[4, 3, 3, 3], 13, 0.3),
        Some(scaled("conv2.bias", &[4], 14, 0.1)),
        ConvOptions::default().pad(1),
    );
    let r2 = c2.relu();
    let gate = g.constant("gate", Tensor::full(DType::F32, &[1, 4, 1, 1], 0.1));
    let gated = r2.greater(gate).select(r2, r2.scalar(0.0));
    let p = gated.max_pool(2, 2, 0).flatten(1);
    let logits = p.linear(scaled("fc.weight", &[3, 64], 15, 0.1), scaled("fc.bias", &[3], 16, 0.1));
    let loss = mean_cross_entropy(&g, logits, labels);
    g.output("loss", loss);
    g.build().unwrap()
}

/// Weights read by the backward (conv2's ConvTranspose, the fc's input gradient) and a gate read
/// deep in the forward, all updated in place, give the interpreter's losses and parameters, SGD
/// and Adam (weight decay large enough to move the gate), 1 and 2 threads: a write of a new
/// value before the last read of the old would change the loss or the gradients below it. (With
/// the schedule's write-after-read edges removed, the gate's update runs before the forward
/// reads the gate and the losses part from the interpreter's.)
#[test]
fn weights_read_by_the_backward_are_written_after_it() {
    let graph = two_conv_cnn();
    let params = [
        "conv1.weight",
        "conv1.bias",
        "conv2.weight",
        "conv2.bias",
        "gate",
        "fc.weight",
        "fc.bias",
    ];
    let adam =
        Optimizer::Adam { lr: 0.02, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.5 };
    let opts = [
        (Optimizer::Sgd { lr: 0.2, momentum: 0.9, nesterov: false, weight_decay: 0.5 }, 0.2),
        (adam, 0.02),
    ];
    for (opt, lr) in opts {
        let step = step_graph(&graph, "loss", &params, &opt).unwrap();
        let (want_losses, want_params) = interpreted(&step, &opt, 4, lr);
        for threads in [1, 2] {
            let mut session =
                TrainSession::new(&graph, "loss", &params, opt, options(threads)).unwrap();
            let schedule = session.schedule();
            assert!(
                schedule.contains("`conv2.weight.new` over `conv2.weight`: read by"),
                "{schedule}"
            );
            let gate = session.param("gate").unwrap().to_f64s();
            for (s, want) in want_losses.iter().enumerate() {
                let got = session.step(&batch(s as u64)).unwrap() as f64;
                assert!(near(got, *want), "{} step {s}: {got} vs {want}", opt.name());
            }
            assert_params(&session, &params, &want_params, opt.name());
            let moved = session.param("gate").unwrap().to_f64s();
            assert!(moved[0] < gate[0] - 0.01, "the gate moved: {gate:?} -> {moved:?}");
        }
    }
}

/// The seed's model: two GRUs side by side over the same sequence (one forward, one reverse
/// with linear_before_reset), their last states concatenated into a linear classifier.
/// x f32[5, 4, 3] (sequence, batch, features), labels i64[4].
fn two_grus() -> Graph {
    let g = GraphBuilder::new("two_grus");
    let scaled = |name: &str, dims: &[usize], seed: u64, k: f64| scaled(&g, name, dims, seed, k);
    let x = g.input("x", DType::F32, [5, 4, 3]);
    let labels = g.input("labels", DType::I64, [4]);
    let gru = |prefix: &str, seed: u64, direction, linear_before_reset| {
        let op = Op::Rnn(Rnn {
            cell: RnnCell::Gru { linear_before_reset },
            direction,
            hidden_size: 6,
            activations: vec![],
            clip: None,
            batch_first: false,
        });
        let w = scaled(&format!("{prefix}.W"), &[1, 18, 3], seed, 0.5);
        let r = scaled(&format!("{prefix}.R"), &[1, 18, 6], seed + 1, 0.5);
        let b = scaled(&format!("{prefix}.B"), &[1, 36], seed + 2, 0.1);
        // Y_h [1, 4, 6] -> [4, 6].
        g.apply(op, &[Some(x), Some(w), Some(r), Some(b)], 2)[1].squeeze(&[0])
    };
    let a = gru("a", 21, RnnDirection::Forward, false);
    let b = gru("b", 31, RnnDirection::Reverse, true);
    let h = g.concat(&[a, b], 1);
    let logits = h.linear(scaled("fc.weight", &[3, 12], 41, 0.3), scaled("fc.bias", &[3], 42, 0.1));
    let loss = mean_cross_entropy(&g, logits, labels);
    g.output("loss", loss);
    g.build().unwrap()
}

fn sequence_batch(seed: u64) -> Vec<Tensor> {
    let x = Tensor::random(DType::F32, &[5, 4, 3], 200 + seed);
    let labels: Vec<i64> = (0..4).map(|i| ((i * 2 + seed) % 3) as i64).collect();
    vec![x, Tensor::from_vec(&[4], labels).unwrap()]
}

/// The seed's two GRUs trained by a compiled step (the recurrent gradient rules' backward
/// through the passes, fusion and codegen), with Adam, at 1 and 2 threads: the interpreter's
/// losses and parameters on the same step graph, and a loss that falls on a batch seen again.
#[test]
fn two_grus_train_as_the_interpreter_does() {
    let graph = two_grus();
    let params = ["a.W", "a.R", "a.B", "b.W", "b.R", "b.B", "fc.weight", "fc.bias"];
    let opt = Optimizer::adam(0.05);
    let step = step_graph(&graph, "loss", &params, &opt).unwrap();
    // One batch every step, so the loss on it falls.
    let (want_losses, want_params) = interpreted_on(&step, &opt, 6, 0.05, |_| sequence_batch(0));
    assert!(want_losses[5] < want_losses[0], "the loss fell: {want_losses:?}");
    for threads in [1, 2] {
        let mut session =
            TrainSession::new(&graph, "loss", &params, opt, options(threads)).unwrap();
        for (s, want) in want_losses.iter().enumerate() {
            let got = session.step(&sequence_batch(0)).unwrap() as f64;
            assert!(near(got, *want), "step {s}: {got} vs {want}");
        }
        assert_params(&session, &params, &want_params, "adam");
    }
}

/// A compiled program whose in-place write has nothing to wait for by data (t.new = t / 2)
/// while the old t is read two kernels deep (softmax(softmax(x)) + t): the write is launched
/// after the read, so y is computed from the old t, as the interpreter computes it. (Without
/// the ordering edge the write runs first and y reads the halved t.)
#[test]
fn an_in_place_write_waits_for_a_late_read() {
    let g = GraphBuilder::new("late_reader");
    let x = g.input("x", DType::F32, [4, 4]);
    let t = g.input("t", DType::F32, [4, 4]);
    let s = x.softmax(1).named("s1").softmax(1).named("s2");
    g.output("y", (s + t).named("add_t"));
    g.output("t.new", (t * t.scalar(0.5)).named("halve"));
    let g = g.build().unwrap();
    let options = Options {
        cache: false,
        in_place: vec![("t".into(), "t.new".into())],
        ..Options::default()
    };
    let (x, t) = (Tensor::random(DType::F32, &[4, 4], 1), Tensor::random(DType::F32, &[4, 4], 2));
    let want = eval::run(&g, &[x.clone(), t.clone()]).unwrap();
    for threads in [1, 2] {
        let load = LoadOptions { threads: Some(threads), ..Default::default() };
        let exe = kiln_compiler::jit(&g, &options, &load).unwrap();
        let mut state = vec![Tensor::from_bytes(DType::F32, &[4, 4], t.bytes()).unwrap()];
        let at = state[0].bytes().as_ptr();
        let y = exe.run_with_state(std::slice::from_ref(&x), &mut state).unwrap();
        assert_eq!(state[0].bytes().as_ptr(), at, "written where it is");
        for (a, b) in y[0].to_f64s().iter().zip(want[0].to_f64s()) {
            assert!((a - b).abs() <= 1e-6, "y: {a} vs {b} (threads {threads})");
        }
        assert_eq!(state[0].to_f64s(), want[1].to_f64s(), "t.new");
    }
    // A GPU target refuses in place, typed, before compiling anything.
    let gpu = Options { target: kiln_compiler::TargetKind::Opencl, ..options };
    let e = kiln_compiler::compile(&g, &gpu, false).err().unwrap().to_string();
    assert_eq!(
        e,
        "output `t.new` cannot be written in place over input `t`: state updated in place is the CPU's, not opencl's (run it with the outputs fed back)"
    );
}

/// A Concat written in place by its parts' kernels (`fuse::concat_views`), one part computed
/// from the in-place output: the ordering edge moves that part's writer late, and the Concat's
/// reader still waits for every part (it depended on the latest part by data alone, and was
/// launched before the moved one). Against the interpreter at 1 and 2 threads.
#[test]
fn a_concat_reader_waits_for_a_part_moved_by_an_in_place_write() {
    let g = GraphBuilder::new("concat_after_in_place");
    let x = g.input("x", DType::F32, [1, 16]);
    let t = g.input("t", DType::F32, [1, 16]);
    let s = x.softmax(1).named("s1").softmax(1).named("s2");
    g.output("y", (s + t).named("add_t"));
    let halved = (t * t.scalar(0.5)).named("halve");
    g.output("t.new", halved);
    let parts = [halved.relu().named("relu_part"), s.exp().named("exp_part")];
    // A product reads the Concat, which is then a kernel of its own and placed.
    let w = g.constant("w", Tensor::random(DType::F32, &[32, 4], 9));
    g.output("z", g.concat(&parts, 1).named("cat").matmul(w).named("mm"));
    let g = g.build().unwrap();
    let options = Options {
        cache: false,
        in_place: vec![("t".into(), "t.new".into())],
        ..Options::default()
    };
    let (x, t) = (Tensor::random(DType::F32, &[1, 16], 3), Tensor::random(DType::F32, &[1, 16], 4));
    let want = eval::run(&g, &[x.clone(), t.clone()]).unwrap();
    for threads in [1, 2] {
        let load = LoadOptions { threads: Some(threads), ..Default::default() };
        let exe = kiln_compiler::jit(&g, &options, &load).unwrap();
        let mut state = vec![Tensor::from_bytes(DType::F32, &[1, 16], t.bytes()).unwrap()];
        let out = exe.run_with_state(std::slice::from_ref(&x), &mut state).unwrap();
        for (name, got, want) in [("y", &out[0], &want[0]), ("z", &out[1], &want[2])] {
            for (a, b) in got.to_f64s().iter().zip(want.to_f64s()) {
                assert!((a - b).abs() <= 1e-6, "{name}: {a} vs {b} (threads {threads})");
            }
        }
        assert_eq!(state[0].to_f64s(), want[1].to_f64s(), "t.new");
    }
}

#[test]
fn the_step_plan() {
    let step = step_graph(&small_cnn(), "loss", &PARAMS, &Optimizer::adam(1e-3)).unwrap();
    insta::assert_snapshot!("train_step_plan_adam", step.plan.to_string());
    let sgd = Optimizer::sgd(0.1);
    let step = step_graph(&small_cnn(), "loss", &["fc.weight"], &sgd).unwrap();
    insta::assert_snapshot!("train_step_plan_sgd", step.plan.to_string());
}

/// The session's plan on the CPU writes every carried value over its input, and its schedule
/// puts each one's readers (the forward, the backward's input gradients, the update itself)
/// before its writer.
#[test]
fn the_in_place_plan_and_schedule() {
    let opt = Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 1e-3 };
    let session = TrainSession::new(&small_cnn(), "loss", &PARAMS, opt, options(1)).unwrap();
    insta::assert_snapshot!("train_step_plan_in_place", session.plan().to_string());
    insta::assert_snapshot!("train_in_place_schedule_sgd", session.schedule());
    let m = session.executable().manifest();
    for (i, s) in m.state.iter().enumerate() {
        // Each parameter is read by the forward before its writer (a momentum only by its own
        // writer, which reads it elementwise as it writes).
        let readers = (0..s.writer).filter(|&l| m.launches[l].args.contains(&s.buffer)).count();
        assert!(i >= PARAMS.len() || readers >= 1, "`{}` is read before it is written", s.input);
        assert!(m.launches[s.writer].args.contains(&s.buffer), "`{}`'s writer", s.input);
    }
}

#[test]
fn bad_input_is_refused_by_name() {
    let graph = small_cnn();
    let opt = Optimizer::sgd(0.1);
    let err =
        |r: Result<TrainSession, TrainError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(TrainSession::new(&graph, "nope", &PARAMS, opt, options(1)));
    assert_eq!(e, "the graph has no output `nope` to train on (its outputs: logits, loss)");
    let e = err(TrainSession::new(&graph, "logits", &PARAMS, opt, options(1)));
    assert_eq!(e, "the loss `logits` must be a float of one element, but it is f32[4,3]");
    let e = err(TrainSession::new(&graph, "loss", &["conv.weight", "w9"], opt, options(1)));
    assert_eq!(e, "`w9` is not a parameter: the graph has no constant of that name");
    let e = err(TrainSession::new(&graph, "loss", &["x"], opt, options(1)));
    assert_eq!(e, "`x` is not a parameter: the graph has no constant of that name");
    let e = with_cross_entropy(&graph, "loss").unwrap_err().to_string();
    assert_eq!(e, "output `loss` is f32[], not float scores of [batch, classes]");
    let e = with_cross_entropy(&graph, "probs").unwrap_err().to_string();
    assert_eq!(e, "the graph has no output `probs` to train on (its outputs: logits, loss)");
    let mut session = TrainSession::new(&graph, "loss", &PARAMS, opt, options(1)).unwrap();
    let e = session.step(&batch(0)[..1]).unwrap_err().to_string();
    assert_eq!(e, "the step takes 2 batch tensors (x, labels), 1 given");
    let wrong = vec![Tensor::zeros(DType::F32, &[4, 1, 8, 9]), batch(0)[1].clone()];
    let e = session.step(&wrong).unwrap_err().to_string();
    assert_eq!(e, "batch input `x` is f32[4,1,8,8], got f32[4,1,8,9]");
    let e = session.param("w9").unwrap_err().to_string();
    assert_eq!(e, "`w9` is not a parameter: the graph has no constant of that name");
    let e = session.set_param("fc.bias", Tensor::zeros(DType::F32, &[4])).unwrap_err().to_string();
    assert_eq!(e, "parameter `fc.bias` is f32[3], got f32[4]");
    let e = session.set_lr(f64::NAN).unwrap_err().to_string();
    assert_eq!(e, "the learning rate must be finite, got NaN");
    // Nothing above changed the session: a step still runs.
    assert!(session.step(&batch(0)).unwrap().is_finite());
}

/// A parameter set by name is what the next step reads: zero weights give the loss of uniform
/// scores, ln 3.
#[test]
fn a_parameter_set_by_name_is_read_by_the_next_step() {
    let mut session =
        TrainSession::new(&small_cnn(), "loss", &PARAMS, Optimizer::sgd(0.1), options(1)).unwrap();
    session.set_param("fc.weight", Tensor::zeros(DType::F32, &[3, 64])).unwrap();
    session.set_param("fc.bias", Tensor::zeros(DType::F32, &[3])).unwrap();
    let loss = session.step(&batch(0)).unwrap() as f64;
    assert!((loss - 3f64.ln()).abs() < 1e-6, "{loss}");
}

/// x f32[4,3] -> Gemm(w, b) -> ReduceSumSquare (keepdims 0): a model with initializers, written
/// back after two steps and imported again.
#[test]
fn trained_weights_are_written_into_the_onnx_model() {
    use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
    use kiln_ir::onnx::proto::*;
    use prost::Message;
    let init = |t: &Tensor, name: &str| {
        TensorProto::decode(kiln_ir::onnx::encode_tensor(t, name).as_slice()).unwrap()
    };
    let f32_type = |dims: &[usize]| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(data_type::FLOAT),
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| tensor_shape_proto::Dimension {
                        value: Some(DimValue::DimValue(d as i64)),
                    })
                    .collect(),
            }),
        })),
    };
    let node = |op: &str, inputs: &[&str], output: &str, attribute| NodeProto {
        op_type: Some(op.into()),
        name: Some(output.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    };
    let keepdims = AttributeProto {
        name: Some("keepdims".into()),
        r#type: Some(attribute_type::INT),
        i: Some(0),
        ..Default::default()
    };
    let (w, b) = (Tensor::random(DType::F32, &[3, 2], 1), Tensor::random(DType::F32, &[2], 2));
    let graph = GraphProto {
        name: Some("linear".into()),
        node: vec![
            node("Gemm", &["x", "w", "b"], "y", vec![]),
            node("ReduceSumSquare", &["y"], "loss", vec![keepdims]),
        ],
        initializer: vec![init(&w, "w"), init(&b, "b")],
        input: vec![ValueInfoProto { name: Some("x".into()), r#type: Some(f32_type(&[4, 3])) }],
        output: vec![ValueInfoProto { name: Some("loss".into()), r#type: Some(f32_type(&[])) }],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    let dir = std::env::temp_dir().join(format!("kiln-train-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (source, saved) = (dir.join("linear.onnx"), dir.join("trained.onnx"));
    std::fs::write(&source, &bytes).unwrap();
    let model = kiln_ir::onnx::load(&source).unwrap().graph;
    let mut session =
        TrainSession::new(&model, "loss", &["w", "b"], Optimizer::sgd(0.01), options(1)).unwrap();
    let x = Tensor::random(DType::F32, &[4, 3], 3);
    let first = session.step(std::slice::from_ref(&x)).unwrap();
    let second = session.step(std::slice::from_ref(&x)).unwrap();
    assert!(second < first, "{first} then {second}");
    session.save_onnx(&source, &saved).unwrap();
    let reloaded = kiln_ir::onnx::load(&saved).unwrap().graph;
    for name in ["w", "b"] {
        let v = reloaded.constant_value(reloaded.node_by_name(name).unwrap().into()).unwrap();
        assert_eq!(v.to_f64s(), session.param(name).unwrap().to_f64s(), "{name}");
        assert_ne!(
            v.to_f64s(),
            if name == "w" { w.to_f64s() } else { b.to_f64s() },
            "{name} trained"
        );
    }
    // The trained model's loss on x is the loss the third step would report.
    let third = eval::run(&reloaded, &[x]).unwrap()[0].to_f64s()[0];
    let next = session.step(&[Tensor::random(DType::F32, &[4, 3], 3)]).unwrap() as f64;
    assert!((third - next).abs() <= 1e-5 * (1.0 + next.abs()), "{third} vs {next}");
    let e = session.save_onnx(&dir.join("missing.onnx"), &saved).unwrap_err().to_string();
    assert!(e.contains("missing.onnx"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// x f32[4,3,2,2] -> BatchNormalization (training_mode 1, momentum 0.9; running mean and
/// variance initializers `rm`, `rv`) -> Flatten -> Gemm(w, b) -> logits f32[4,5], as ONNX.
fn batch_norm_model() -> Vec<u8> {
    use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
    use kiln_ir::onnx::proto::*;
    use prost::Message;
    let init = |t: Tensor, name: &str| {
        TensorProto::decode(kiln_ir::onnx::encode_tensor(&t, name).as_slice()).unwrap()
    };
    let f32_type = |dims: &[usize]| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(data_type::FLOAT),
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| tensor_shape_proto::Dimension {
                        value: Some(DimValue::DimValue(d as i64)),
                    })
                    .collect(),
            }),
        })),
    };
    let value = |name: &str, dims: &[usize]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(f32_type(dims)),
    };
    let attr = |name: &str, f: Option<f32>, i: Option<i64>| AttributeProto {
        name: Some(name.into()),
        r#type: Some(if f.is_some() { attribute_type::FLOAT } else { attribute_type::INT }),
        f,
        i,
        ..Default::default()
    };
    let node = |op: &str, inputs: &[&str], outputs: &[&str], attribute| NodeProto {
        op_type: Some(op.into()),
        name: Some(outputs[0].into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute,
        ..Default::default()
    };
    let t = |dims: &[usize], v: Vec<f64>| Tensor::from_f64s(DType::F32, dims, &v).unwrap();
    let graph = GraphProto {
        name: Some("bn".into()),
        node: vec![
            node(
                "BatchNormalization",
                &["x", "scale", "shift", "rm", "rv"],
                &["y", "rm_out", "rv_out"],
                vec![attr("momentum", Some(0.9), None), attr("training_mode", None, Some(1))],
            ),
            node("Flatten", &["y"], &["flat"], vec![]),
            node("Gemm", &["flat", "w", "b"], &["logits"], vec![attr("transB", None, Some(1))]),
        ],
        initializer: vec![
            init(t(&[3], vec![1.0, 0.5, 2.0]), "scale"),
            init(t(&[3], vec![0.1, -0.2, 0.0]), "shift"),
            init(t(&[3], vec![0.5, -1.0, 0.0]), "rm"),
            init(t(&[3], vec![1.0, 2.0, 0.5]), "rv"),
            init(Tensor::random(DType::F32, &[5, 12], 7), "w"),
            init(Tensor::random(DType::F32, &[5], 8), "b"),
        ],
        input: vec![value("x", &[4, 3, 2, 2])],
        output: vec![value("logits", &[4, 5])],
        ..Default::default()
    };
    let opset = OperatorSetIdProto { domain: Some(String::new()), version: Some(15) };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![opset],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A batch for `batch_norm_model`: channel c's values around c - 1, each step's different.
fn bn_batch(step: u64) -> Vec<Tensor> {
    let r = Tensor::random(DType::F32, &[4, 3, 2, 2], 200 + step).to_f64s();
    let x: Vec<f64> =
        r.iter().enumerate().map(|(i, v)| 2.0 * v + ((i / 4) % 3) as f64 - 1.0).collect();
    let labels: Vec<i64> = (0..4).map(|i| ((i + step) % 5) as i64).collect();
    vec![
        Tensor::from_f64s(DType::F32, &[4, 3, 2, 2], &x).unwrap(),
        Tensor::from_vec(&[4], labels).unwrap(),
    ]
}

/// A model with a training-mode BatchNormalization trained by the session: each step updates
/// the running mean and variance as ONNX defines it (`running·momentum + batch·(1 - momentum)`,
/// the population variance), against those formulas in f64 and against the interpreter running
/// the step graph; they stay in the runtime's output buffers like the parameters; and
/// `save_onnx` writes them into the model's initializers.
#[test]
fn batch_norm_running_statistics_are_carried_and_saved() {
    let bytes = batch_norm_model();
    let dir = std::env::temp_dir().join(format!("kiln-train-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (source, saved) = (dir.join("bn.onnx"), dir.join("bn-trained.onnx"));
    std::fs::write(&source, &bytes).unwrap();
    let model = kiln_ir::onnx::load(&source).unwrap().graph;
    let graph = with_cross_entropy(&model, "logits").unwrap();
    let params = ["scale", "shift", "w", "b"];
    let opt = Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let step = step_graph(&graph, "loss", &params, &opt).unwrap();
    assert_eq!(step.plan.running, ["rm", "rv"]);
    assert!(step.plan.to_string().contains("running: rm, rv\n"), "{}", step.plan);
    assert!(step.plan.to_string().contains("`rv.new` -> next step's input `rv`"), "{}", step.plan);

    // The formulas: per channel, over the batch and the spatial axes.
    let (mut mean, mut var) = (vec![0.5, -1.0, 0.0], vec![1.0, 2.0, 0.5]);
    // The interpreter on the step graph, its outputs fed back.
    let mut carried: Vec<Tensor> = step.initial.clone();
    carried.extend(step.initial.iter().map(|t| Tensor::zeros(DType::F32, t.dims())));
    carried.extend(step.running.iter().cloned());
    let mut session = TrainSession::new(&graph, "loss", &params, opt, options(2)).unwrap();
    let mut stats_at: Option<Vec<usize>> = None;
    for s in 0..3 {
        let batch = bn_batch(s);
        let x = batch[0].to_f64s();
        for c in 0..3 {
            let v: Vec<f64> = (0..4)
                .flat_map(|n| (0..4).map(move |i| (n * 3 + c) * 4 + i))
                .map(|i| x[i])
                .collect();
            let m = v.iter().sum::<f64>() / 16.0;
            let pv = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 16.0;
            mean[c] = mean[c] * 0.9 + m * 0.1;
            var[c] = var[c] * 0.9 + pv * 0.1;
        }
        let mut inputs = batch.clone();
        inputs.extend(carried.iter().cloned());
        inputs.push(Tensor::scalar(0.1f32));
        let mut out = eval::run(&step.graph, &inputs).unwrap();
        let want_loss = out[0].to_f64s()[0];
        carried = out.split_off(1);

        let loss = session.step(&batch).unwrap() as f64;
        assert!(
            (loss - want_loss).abs() <= 1e-5 * (1.0 + want_loss.abs()),
            "step {s}: {loss} vs {want_loss}"
        );
        let stats = session.running_stats();
        assert_eq!(stats.len(), 2);
        for ((name, got), (want, interpreted)) in
            stats.iter().zip([(&mean, &carried[8]), (&var, &carried[9])])
        {
            for (c, (a, b)) in got.to_f64s().iter().zip(want.iter()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "step {s} {name}[{c}]: {a} vs {b}"
                );
            }
            assert_eq!(got.to_f64s().len(), 3);
            for (a, b) in got.to_f64s().iter().zip(interpreted.to_f64s()) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "step {s} {name}: {a} vs {b}");
            }
        }
        // Resident like the parameters: each statistic in one buffer, the same every step,
        // which the step updates in place (state 8 and 9: after 4 parameters and 4 momenta).
        let exe = session.executable();
        assert_eq!(exe.state()[8].input, "rm");
        assert_eq!(exe.state()[9].output, "rv.new");
        let held: Vec<usize> = stats.iter().map(|(_, t)| t.bytes().as_ptr() as usize).collect();
        drop(stats);
        let first = stats_at.get_or_insert(held.clone());
        assert_eq!(&held, first, "step {s}: the running statistics stay in their buffers");
    }

    // The saved model holds the statistics now, and the trained parameters.
    session.save_onnx(&source, &saved).unwrap();
    let reloaded = kiln_ir::onnx::load(&saved).unwrap().graph;
    let constant = |name: &str| {
        reloaded.constant_value(reloaded.node_by_name(name).unwrap().into()).unwrap().to_f64s()
    };
    for (name, t) in session.running_stats().iter().chain(&session.params()) {
        assert_eq!(constant(name), t.to_f64s(), "{name}");
    }
    assert_ne!(constant("rm"), [0.5, -1.0, 0.0].map(|v: f64| v as f32 as f64));
    std::fs::remove_dir_all(&dir).ok();

    // A running statistic is no parameter.
    let e = TrainSession::new(&graph, "loss", &["w", "rm"], opt, options(1)).err().unwrap();
    assert_eq!(
        e.to_string(),
        "`rm` is a running statistic of a training-mode BatchNormalization, which each step updates itself: it cannot be a trained parameter"
    );
}

/// `running_statistics` finds what `batch_norm_training` builds, and not a blend of a
/// constant that no BatchNormalization normalises by (which a step must not overwrite).
#[test]
fn running_statistics_are_found_by_their_batch_norm_only() {
    use kiln_ir::train::{batch_norm_training, running_statistics};
    let g = GraphBuilder::new("bn");
    let x = g.input("x", DType::F32, [2, 3, 4]);
    let c = |name: &str| g.constant(name, Tensor::zeros(DType::F32, &[3]));
    let (scale, shift) = (c("scale"), c("shift"));
    let r = batch_norm_training(x, scale, shift, c("rm"), c("rv"), 1e-5, 0.9);
    let ema = c("ema");
    let blend = ema.mul(ema.scalar(0.9)).add(x.reduce_mean(&[0, 2], false).mul(ema.scalar(0.1)));
    g.output("y", r.y);
    g.output("rm_out", r.running_mean);
    g.output("rv_out", r.running_var);
    g.output("blend", blend);
    let graph = g.build().unwrap();
    let found: Vec<(String, kiln_ir::ValueId)> = running_statistics(&graph)
        .iter()
        .map(|s| (graph.node(s.constant.node).name.clone(), s.update))
        .collect();
    let out = |i: usize| graph.outputs()[i].1;
    assert_eq!(found, [("rm".to_string(), out(1)), ("rv".to_string(), out(2))]);
}

/// On a GPU target (OpenCL here) the runtime binds no state: the session compiles without
/// `in_place` and feeds the step's outputs back as the next step's inputs, as before, giving
/// the interpreter's losses and parameters.
#[test]
fn a_gpu_session_feeds_its_outputs_back() {
    use kiln_runtime::Target;
    if !crate::gpu::have(Target::Opencl) {
        return crate::gpu::skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); training on OpenCL was not run");
    }
    let graph = small_cnn();
    let opt = Optimizer::Sgd { lr: 0.2, momentum: 0.9, nesterov: false, weight_decay: 1e-3 };
    let step = step_graph(&graph, "loss", &PARAMS, &opt).unwrap();
    let (want_losses, want_params) = interpreted(&step, &opt, 3, 0.2);
    let options = TrainOptions {
        compile: Options {
            target: kiln_compiler::TargetKind::Opencl,
            cache: false,
            ..Options::default()
        },
        ..Default::default()
    };
    let mut session = TrainSession::new(&graph, "loss", &PARAMS, opt, options).unwrap();
    assert!(session.executable().state().is_empty());
    assert!(session
        .plan()
        .to_string()
        .contains("output 1 `conv.weight.new` -> next step's input `conv.weight`"));
    for (s, want) in want_losses.iter().enumerate() {
        let got = session.step(&batch(s as u64)).unwrap() as f64;
        assert!(near(got, *want), "step {s}: {got} vs {want}");
    }
    assert_params(&session, &PARAMS, &want_params, "sgd");
}

/// The interpreter running `step` (an autocast step graph or not) from `initial` SGD state:
/// the losses of `steps` steps.
fn interpreted_losses(step: &StepGraph, opt: &Optimizer, steps: u64, lr: f32) -> Vec<f64> {
    interpreted(step, opt, steps, lr).0
}

fn bf16_options(threads: usize) -> TrainOptions {
    TrainOptions { precision: Precision::Bf16, ..options(threads) }
}

/// Mixed precision (bf16 operands, f32 sums, f32 master weights): 5 steps of the small CNN
/// compiled for the CPU give the interpreter's losses on the same autocast step graph, and stay
/// near the f32 session's. Tolerances: against the interpreter 1e-3 relative (the same
/// arithmetic, but an f32 value that the compiled kernels sum in another order may round to the
/// neighbouring bf16, 2^-8 apart, where the interpreter's does not); against f32 2e-2 (bf16 keeps
/// 8 significant bits, a relative rounding of up to 2^-9 = 2e-3 on every operand of every
/// product, which 5 steps of SGD carry into the loss). The parameters stay f32.
#[test]
fn mixed_precision_follows_the_interpreter_and_stays_near_f32() {
    let graph = small_cnn();
    let opt = Optimizer::Sgd { lr: 0.2, momentum: 0.9, nesterov: false, weight_decay: 1e-3 };
    let mut step = step_graph(&graph, "loss", &PARAMS, &opt).unwrap();
    let f32_losses = interpreted_losses(&step, &opt, 5, 0.2);
    let cast = mixed_precision(&mut step, Precision::Bf16, TargetKind::Cpu).unwrap().unwrap();
    assert!(!cast.cast.is_empty());
    let want = interpreted_losses(&step, &opt, 5, 0.2);
    assert_ne!(want, f32_losses, "the rounding changed the step");
    for (&i, name) in step.graph.inputs()[2..].iter().zip(PARAMS) {
        assert_eq!(step.graph.node(i).outputs[0].dtype, DType::F32, "input `{name}`");
    }
    for (name, v) in &step.graph.outputs()[..1 + PARAMS.len()] {
        assert_eq!(step.graph.value_type(*v).dtype, DType::F32, "output `{name}`");
    }
    for threads in [1, 2] {
        let mut session =
            TrainSession::new(&graph, "loss", &PARAMS, opt, bf16_options(threads)).unwrap();
        assert_eq!(session.autocast(), Some(&cast));
        let losses: Vec<f32> = (0..5).map(|s| session.step(&batch(s)).unwrap()).collect();
        for (s, ((a, b), f)) in losses.iter().zip(&want).zip(&f32_losses).enumerate() {
            let (a, b, f) = (*a as f64, *b, *f);
            assert!((a - b).abs() <= 1e-3 * (1.0 + b.abs()), "step {s}: loss {a} vs {b}");
            assert!((a - f).abs() <= 2e-2 * (1.0 + f.abs()), "step {s}: loss {a} vs f32 {f}");
        }
        assert!(losses[4] < losses[0], "the loss fell: {losses:?}");
        // The compiled step is the rounded one: nearer the bf16 interpreter than the f32 one (a
        // session that compiled the step without the casts would be the other way round).
        let off = |from: &[f64]| -> f64 {
            losses.iter().zip(from).map(|(a, b)| (*a as f64 - b).abs()).sum()
        };
        assert!(off(&want) < off(&f32_losses), "{losses:?}: bf16 {want:?}, f32 {f32_losses:?}");
        for name in PARAMS {
            assert_eq!(session.param(name).unwrap().dtype(), DType::F32, "`{name}` stays f32");
        }
    }
}

/// Which contractions mixed precision casts, forward and backward, and the operands each reads
/// rounded.
#[test]
fn the_autocast_step() {
    let opt = Optimizer::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let mut step = step_graph(&small_cnn(), "loss", &PARAMS, &opt).unwrap();
    let cast = mixed_precision(&mut step, Precision::Bf16, TargetKind::Cpu).unwrap().unwrap();
    insta::assert_snapshot!("train_autocast_bf16", cast.to_string());
    // f32 casts nothing.
    let mut step = step_graph(&small_cnn(), "loss", &PARAMS, &opt).unwrap();
    assert!(mixed_precision(&mut step, Precision::F32, TargetKind::Cpu).unwrap().is_none());
}

/// A precision the training step cannot run at is a typed error naming it and the target.
#[test]
fn a_precision_the_target_cannot_do_is_refused() {
    let graph = small_cnn();
    let opt = Optimizer::sgd(0.1);
    let refused = |precision: Precision, target: TargetKind| {
        let mut o = TrainOptions { precision, ..options(1) };
        o.compile.target = target;
        match TrainSession::new(&graph, "loss", &PARAMS, opt, o) {
            Err(e @ TrainError::Precision { .. }) => e.to_string(),
            Err(e) => panic!("{precision}: another error: {e}"),
            Ok(_) => panic!("{precision} on {}: accepted", target.name()),
        }
    };
    assert_eq!(
        refused(Precision::F16, TargetKind::Cpu),
        "training in f16 on cpu: f16 mixed precision needs a loss scale (small gradients \
         underflow f16), which is not built; bf16 (f32's exponent range) needs none"
    );
    assert_eq!(
        refused(Precision::Tf32, TargetKind::Cpu),
        "training in tf32 on cpu: TF32 is a GPU tensor-core format, not a training precision \
         kiln builds"
    );
    assert_eq!(
        refused(Precision::Bf16, TargetKind::Cuda),
        "training in bf16 on cuda: bf16 mixed precision is built and tested for the CPU's \
         training step only"
    );
}
