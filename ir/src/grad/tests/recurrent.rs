//! RNN, GRU and LSTM against finite differences: each direction, layout and cell option, with and
//! without the optional operands, the loss reading each of the results; the refused cases'
//! typed errors; and a two-GRU classifier end to end.

use super::{add_gradient_outputs, check, ints, loss_op, numbered, positive, rand};
use crate::builder::{GraphBuilder, Traced};
use crate::grad::{append_backward, GradError, RuleError};
use crate::op::{LossReduction, Rnn, RnnCell, RnnDirection};
use crate::{eval, DType, Dim, Op, Tensor, UnaryOp, ValueId};

const SEQ: usize = 3;
const BATCH: usize = 2;
const INPUT: usize = 3;
const HIDDEN: usize = 4;

/// Which results the loss reads.
#[derive(Clone, Copy, Debug)]
enum Reads {
    Y,
    YH,
    /// Y and Y_h.
    Both,
    /// LSTM's Y_c only.
    YC,
    /// Y, Y_h and, for LSTM, Y_c.
    All,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    cell: RnnCell,
    direction: RnnDirection,
    batch_first: bool,
    bias: bool,
    initial_h: bool,
    /// LSTM only: initial_c and the peepholes.
    initial_c: bool,
    peepholes: bool,
    reads: Reads,
    /// Empty: ONNX's defaults.
    activations: &'static [UnaryOp],
    /// sequence_lens, a constant.
    lens: Option<[i64; BATCH]>,
    clip: Option<f32>,
}

impl Case {
    fn new(cell: RnnCell, direction: RnnDirection) -> Case {
        Case {
            cell,
            direction,
            batch_first: false,
            bias: true,
            initial_h: true,
            initial_c: false,
            peepholes: false,
            reads: Reads::Both,
            activations: &[],
            lens: None,
            clip: None,
        }
    }

    fn op(&self) -> Op {
        Op::Rnn(Rnn {
            cell: self.cell,
            direction: self.direction,
            hidden_size: HIDDEN,
            activations: self.activations.to_vec(),
            clip: self.clip,
            batch_first: self.batch_first,
        })
    }

    fn is_lstm(&self) -> bool {
        matches!(self.cell, RnnCell::Lstm { .. })
    }

    fn dirs(&self) -> usize {
        if self.direction == RnnDirection::Bidirectional {
            2
        } else {
            1
        }
    }

    fn gates(&self) -> usize {
        match self.cell {
            RnnCell::Simple => 1,
            RnnCell::Gru { .. } => 3,
            RnnCell::Lstm { .. } => 4,
        }
    }

    /// X, W, R, then B, initial_h, initial_c and P where the case has them.
    fn inputs(&self) -> Vec<Tensor> {
        let (d, gh) = (self.dirs(), self.gates() * HIDDEN);
        let x = if self.batch_first { [BATCH, SEQ, INPUT] } else { [SEQ, BATCH, INPUT] };
        let state = if self.batch_first { [BATCH, d, HIDDEN] } else { [d, BATCH, HIDDEN] };
        let mut v = vec![rand(&x, 31), rand(&[d, gh, INPUT], 32), rand(&[d, gh, HIDDEN], 33)];
        if self.bias {
            v.push(rand(&[d, 2 * gh], 34));
        }
        if self.initial_h {
            v.push(rand(&state, 35));
        }
        if self.is_lstm() && self.initial_c {
            v.push(rand(&state, 36));
        }
        if self.is_lstm() && self.peepholes {
            v.push(rand(&[d, 3 * HIDDEN], 37));
        }
        v
    }

    /// The layer on `inputs` (as `inputs()` orders them) and the results the loss reads.
    fn build<'g>(&self, g: &'g GraphBuilder, inputs: &[Traced<'g>]) -> Traced<'g> {
        let mut next = inputs.iter().copied();
        let (x, w, r) = (next.next(), next.next(), next.next());
        let lstm = self.is_lstm();
        let b = if self.bias { next.next() } else { None };
        let h0 = if self.initial_h { next.next() } else { None };
        let c0 = if lstm && self.initial_c { next.next() } else { None };
        let p = if lstm && self.peepholes { next.next() } else { None };
        let lens = self.lens.map(|l| ints(g, &[BATCH], &l));
        let mut operands = vec![x, w, r, b, lens, h0, c0, p];
        while operands.last().is_some_and(Option::is_none) {
            operands.pop();
        }
        let results = g.apply(self.op(), &operands, if lstm { 3 } else { 2 });
        let flat = |t: Traced<'g>| t.reshape(&[-1]);
        match self.reads {
            Reads::Y => results[0],
            Reads::YH => results[1],
            Reads::YC => results[2],
            Reads::Both => g.concat(&[flat(results[0]), flat(results[1])], 0),
            Reads::All => g.concat(&results.iter().map(|&t| flat(t)).collect::<Vec<_>>(), 0),
        }
    }

    fn check(self, name: &str) {
        check(&format!("{name} {self:?}"), &self.inputs(), move |g, x| self.build(g, x));
    }

    /// Checks the gradient of input `k` alone, the others constants: the rule builds only what
    /// the gradients asked for need.
    fn check_only(self, name: &str, k: usize) {
        let all = self.inputs();
        check(&format!("{name} {self:?}"), &all[k..=k], |g, x| {
            let inputs: Vec<Traced> = all
                .iter()
                .enumerate()
                .map(|(i, t)| if i == k { x[0] } else { g.anon_constant(t.clone()) })
                .collect();
            self.build(g, &inputs)
        });
    }
}

const DIRECTIONS: [RnnDirection; 3] =
    [RnnDirection::Forward, RnnDirection::Reverse, RnnDirection::Bidirectional];

#[test]
fn gru_each_direction_and_linear_before_reset() {
    for direction in DIRECTIONS {
        for linear_before_reset in [false, true] {
            Case::new(RnnCell::Gru { linear_before_reset }, direction).check("gru");
        }
    }
}

#[test]
fn gru_without_bias_or_initial_state_and_each_result() {
    for linear_before_reset in [false, true] {
        let cell = RnnCell::Gru { linear_before_reset };
        let base = Case::new(cell, RnnDirection::Bidirectional);
        Case { bias: false, ..base }.check("gru_no_bias");
        Case { initial_h: false, ..base }.check("gru_no_initial_h");
        Case { bias: false, initial_h: false, reads: Reads::Y, ..base }.check("gru_bare_y");
        Case { reads: Reads::YH, ..base }.check("gru_y_h");
        Case { reads: Reads::Y, direction: RnnDirection::Reverse, ..base }.check("gru_y");
    }
}

#[test]
fn gru_one_gradient_at_a_time() {
    let case = Case::new(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Bidirectional);
    // X, W, R, B, initial_h.
    for k in 0..5 {
        case.check_only(&format!("gru_only_{k}"), k);
    }
    let lstm = Case::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Reverse);
    let lstm = Case { initial_c: true, peepholes: true, reads: Reads::All, ..lstm };
    // initial_c and P.
    for k in 5..7 {
        lstm.check_only(&format!("lstm_only_{k}"), k);
    }
}

#[test]
fn gru_batch_first() {
    for direction in DIRECTIONS {
        let cell = RnnCell::Gru { linear_before_reset: true };
        Case { batch_first: true, ..Case::new(cell, direction) }.check("gru_batch_first");
    }
}

#[test]
fn lstm_each_direction_with_peepholes_and_initial_cell() {
    for direction in DIRECTIONS {
        let base = Case::new(RnnCell::Lstm { input_forget: false }, direction);
        Case { initial_c: true, peepholes: true, reads: Reads::All, ..base }.check("lstm");
    }
}

#[test]
fn lstm_options_and_each_result() {
    let base = Case::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Bidirectional);
    let full = Case { initial_c: true, peepholes: true, reads: Reads::All, ..base };
    Case { cell: RnnCell::Lstm { input_forget: true }, ..full }.check("lstm_input_forget");
    Case { bias: false, initial_h: false, reads: Reads::Y, ..base }.check("lstm_bare_y");
    Case { reads: Reads::YH, ..full }.check("lstm_y_h");
    Case { reads: Reads::YC, direction: RnnDirection::Reverse, ..full }.check("lstm_y_c");
    Case { batch_first: true, ..full }.check("lstm_batch_first");
    Case { initial_c: true, ..base }.check("lstm_no_peepholes");
}

#[test]
fn rnn_each_direction_and_option() {
    for direction in DIRECTIONS {
        let base = Case::new(RnnCell::Simple, direction);
        base.check("rnn");
        Case { bias: false, initial_h: false, reads: Reads::YH, ..base }.check("rnn_bare_y_h");
        Case { batch_first: true, reads: Reads::Y, ..base }.check("rnn_batch_first");
    }
}

/// Activations other than the defaults, per direction: PyTorch's Relu RNN, and each cell with
/// each supported activation somewhere.
#[test]
fn other_activations() {
    use UnaryOp::{LeakyRelu, Relu, Sigmoid, Tanh};
    let relu = Case { activations: &[Relu], ..Case::new(RnnCell::Simple, RnnDirection::Forward) };
    relu.check("rnn_relu");
    let both = RnnDirection::Bidirectional;
    let rnn = Case { activations: &[LeakyRelu { alpha: 0.1 }, Sigmoid], ..relu };
    Case { direction: both, ..rnn }.check("rnn_leaky_relu_sigmoid");
    let gru = Case::new(RnnCell::Gru { linear_before_reset: false }, both);
    let acts = &[Sigmoid, Relu, Tanh, LeakyRelu { alpha: 0.2 }];
    Case { activations: acts, ..gru }.check("gru_activations");
    let gru = Case::new(RnnCell::Gru { linear_before_reset: true }, both);
    Case { activations: acts, ..gru }.check("gru_lbr_activations");
    let lstm = Case::new(RnnCell::Lstm { input_forget: false }, both);
    let acts = &[Sigmoid, Tanh, Relu, Sigmoid, LeakyRelu { alpha: 0.3 }, Tanh];
    let lstm = Case { initial_c: true, peepholes: true, reads: Reads::All, ..lstm };
    Case { activations: acts, ..lstm }.check("lstm_activations");
}

/// A clip small enough to cut some pre-activations of every gate: those pass no gradient.
#[test]
fn clipped_pre_activations() {
    let both = RnnDirection::Bidirectional;
    let clip = Some(0.5);
    for cell in [
        RnnCell::Gru { linear_before_reset: false },
        RnnCell::Gru { linear_before_reset: true },
        RnnCell::Simple,
    ] {
        Case { clip, ..Case::new(cell, both) }.check("clip");
    }
    for input_forget in [false, true] {
        let lstm = Case::new(RnnCell::Lstm { input_forget }, both);
        Case { initial_c: true, peepholes: true, reads: Reads::All, clip, ..lstm }
            .check("lstm_clip");
    }
    let relu = Case::new(RnnCell::Simple, both);
    let relu = Case { activations: &[UnaryOp::Relu, UnaryOp::Tanh], lens: Some([2, 3]), ..relu };
    Case { clip, ..relu }.check("rnn_relu_clip_lens");
}

/// The rule's error for a GRU built by `edit` from the plain forward one (X, W, R as inputs,
/// further operands as `extra` adds them), the loss its Y_h.
fn gru_error(
    seq: Dim,
    edit: impl Fn(&mut Rnn),
    extra: impl for<'g> Fn(&'g GraphBuilder) -> Vec<Option<Traced<'g>>>,
) -> GradError {
    let g = GraphBuilder::new("gru_refused");
    let x = g.input("x", DType::F64, vec![seq, BATCH.into(), INPUT.into()]);
    let w = g.input("w", DType::F64, [1, 3 * HIDDEN, INPUT]);
    let r = g.input("r", DType::F64, [1, 3 * HIDDEN, HIDDEN]);
    let mut rnn = Rnn {
        cell: RnnCell::Gru { linear_before_reset: false },
        direction: RnnDirection::Forward,
        hidden_size: HIDDEN,
        activations: Vec::new(),
        clip: None,
        batch_first: false,
    };
    edit(&mut rnn);
    let mut operands = vec![Some(x), Some(w), Some(r)];
    operands.extend(extra(&g));
    let y_h = g.apply(Op::Rnn(rnn), &operands, 2)[1].named("the_gru");
    g.output("loss", y_h.reduce_sum(&[], false));
    let mut graph = g.build().expect("builds");
    let loss = graph.outputs()[0].1;
    let w = ValueId::from(graph.node_by_name("w").expect("an input"));
    append_backward(&mut graph, loss, &[w]).expect_err("refused")
}

fn rule_error(e: GradError) -> RuleError {
    match e {
        GradError::Rule { node, op, error } => {
            assert_eq!((node.as_str(), op), ("the_gru", "GRU"));
            error
        }
        other => panic!("not a rule's error: {other}"),
    }
}

fn no_operands(_: &GraphBuilder) -> Vec<Option<Traced<'_>>> {
    Vec::new()
}

#[test]
fn unsupported_recurrent_layers_are_typed_errors() {
    let fixed = || Dim::Fixed(SEQ);
    let e = rule_error(gru_error(
        fixed(),
        |r| r.activations = vec![UnaryOp::Sigmoid, UnaryOp::Softsign],
        no_operands,
    ));
    assert_eq!(
        e,
        RuleError::Unsupported {
            what: "a recurrent layer activation other than Sigmoid, Tanh, Relu or LeakyRelu"
        }
    );
    let e = rule_error(gru_error(Dim::sym("T"), |_| {}, no_operands));
    assert!(matches!(e, RuleError::NeedsFixedShape { what: "the sequence length of X", .. }));
}

/// Shorter sequences (one empty): the steps past a sequence's length neither change its state
/// nor get gradients, the reverse direction starts at each sequence's own last step, and an
/// empty sequence's final states are zeros, whatever its initial ones.
#[test]
fn sequence_lens_shorter_and_empty() {
    // Bidirectional: a forward and a reverse direction.
    let (lens, both) = (Some([SEQ as i64 - 1, 0]), RnnDirection::Bidirectional);
    for cell in [
        RnnCell::Gru { linear_before_reset: false },
        RnnCell::Gru { linear_before_reset: true },
        RnnCell::Simple,
    ] {
        Case { lens, ..Case::new(cell, both) }.check("lens");
    }
    let lstm = Case::new(RnnCell::Lstm { input_forget: false }, both);
    Case { initial_c: true, peepholes: true, reads: Reads::All, lens, ..lstm }.check("lstm_lens");
    let gru = Case::new(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Bidirectional);
    Case { lens: Some([1, SEQ as i64]), batch_first: true, ..gru }.check("lens_batch_first");
    Case { lens: Some([2, 1]), reads: Reads::Y, ..gru }.check("lens_y");
    Case { lens: Some([2, 1]), reads: Reads::YH, initial_h: false, ..gru }.check("lens_y_h");
    let lstm = Case::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Reverse);
    let lstm = Case { initial_c: true, reads: Reads::YC, lens: Some([2, 1]), ..lstm };
    lstm.check("lstm_lens_y_c");
}

/// sequence_lens as a graph input: the backward graph computes its masks at run time and gives
/// the gradients it gives for the same lengths as a constant (checked above).
#[test]
fn sequence_lens_at_run_time() {
    let case = Case::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Bidirectional);
    let case = Case { initial_c: true, peepholes: true, reads: Reads::All, ..case };
    let lens = [SEQ as i64 - 1, 0];
    let run = |at_run_time: bool| {
        let g = GraphBuilder::new("lens_at_run_time");
        let lens_value = if at_run_time {
            g.input("lens", DType::I64, [BATCH])
        } else {
            g.constant("lens", Tensor::from_vec(&[BATCH], lens.to_vec()).expect("lens"))
        };
        let p: Vec<Traced> = case
            .inputs()
            .into_iter()
            .enumerate()
            .map(|(i, t)| g.constant(&format!("p{i}"), t))
            .collect();
        let mut operands: Vec<Option<Traced>> = p.iter().copied().map(Some).collect();
        operands.insert(4, Some(lens_value));
        let y = g.apply(case.op(), &operands, 3);
        let all: Vec<Traced> = y.iter().map(|t| t.reshape(&[-1])).collect();
        let weights = g.anon_constant(rand(&[SEQ * 2 * BATCH * HIDDEN + 4 * BATCH * HIDDEN], 7));
        g.output("loss", g.concat(&all, 0).mul(weights).reduce_sum(&[], false));
        let count = p.len();
        let mut graph = g.build().expect("builds");
        add_gradient_outputs(&mut graph, &numbered(count));
        let inputs = if at_run_time {
            vec![Tensor::from_vec(&[BATCH], lens.to_vec()).expect("lens")]
        } else {
            vec![]
        };
        eval::run(&graph, &inputs).expect("runs")
    };
    let (at_run_time, constant) = (run(true), run(false));
    assert_eq!(at_run_time.len(), 1 + case.inputs().len());
    for (a, c) in at_run_time.iter().zip(&constant) {
        assert_eq!(a.to_f64s(), c.to_f64s());
    }
}

/// Constant sequence lengths that are all full change nothing, so the rule takes them.
#[test]
fn gru_with_full_constant_sequence_lens() {
    let case = Case::new(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Reverse);
    check("gru_full_lens", &case.inputs(), |g, x| {
        let lens = ints(g, &[BATCH], &[SEQ as i64; BATCH]);
        let operands = [Some(x[0]), Some(x[1]), Some(x[2]), Some(x[3]), Some(lens), Some(x[4])];
        let results = g.apply(case.op(), &operands, 2);
        g.concat(&[results[0].reshape(&[-1]), results[1].reshape(&[-1])], 0)
    });
}

/// Two GRUs in sequence, as the seed model has them: a bidirectional GRU whose two directions'
/// states feed a second GRU, whose final state feeds a linear head and a softmax cross-entropy.
fn two_grus<'g>(
    g: &'g GraphBuilder,
    x: Traced<'g>,
    labels: Traced<'g>,
    p: &[Traced<'g>],
) -> Traced<'g> {
    let gru = |direction, linear_before_reset| {
        Op::Rnn(Rnn {
            cell: RnnCell::Gru { linear_before_reset },
            direction,
            hidden_size: HIDDEN,
            activations: Vec::new(),
            clip: None,
            batch_first: false,
        })
    };
    let first = g.apply(
        gru(RnnDirection::Bidirectional, false),
        &[Some(x), Some(p[0]), Some(p[1]), Some(p[2])],
        2,
    )[0];
    // [seq, 2, batch, hidden] to [seq, batch, 2 * hidden].
    let both = first.transpose(&[0, 2, 1, 3]).reshape(&[SEQ as i64, -1, 2 * HIDDEN as i64]);
    let second = g.apply(
        gru(RnnDirection::Forward, true),
        &[Some(both), Some(p[3]), Some(p[4]), Some(p[5])],
        2,
    )[1];
    let logits = second.squeeze(&[0]).matmul(p[6]).add(p[7]);
    g.apply(loss_op(true, LossReduction::Mean, None), &[Some(logits), Some(labels)], 1)[0]
}

fn two_gru_params() -> Vec<Tensor> {
    let gh = 3 * HIDDEN;
    vec![
        rand(&[2, gh, INPUT], 41),
        rand(&[2, gh, HIDDEN], 42),
        rand(&[2, 2 * gh], 43),
        rand(&[1, gh, 2 * HIDDEN], 44),
        rand(&[1, gh, HIDDEN], 45),
        rand(&[1, 2 * gh], 46),
        rand(&[HIDDEN, 3], 47),
        positive(&[3], 48),
    ]
}

#[test]
fn two_grus_and_a_classifier_end_to_end() {
    check("two_grus", &two_gru_params(), |g, p| {
        let x = g.anon_constant(rand(&[SEQ, BATCH, INPUT], 40));
        let labels = ints(g, &[BATCH], &[2, 0]);
        two_grus(g, x, labels, p)
    });
}

/// The two GRUs with the batch as a symbol and the weights as constants: the backward graph
/// builds, and on a concrete batch gives the fixed-batch graph's gradients.
#[test]
fn two_grus_with_a_symbolic_batch() {
    let params = two_gru_params();
    let run = |batch: Dim| {
        let g = GraphBuilder::new("two_grus_symbolic");
        let x = g.input("x", DType::F64, vec![SEQ.into(), batch.clone(), INPUT.into()]);
        let labels = g.input("labels", DType::I64, vec![batch]);
        let p: Vec<Traced> = params
            .iter()
            .enumerate()
            .map(|(i, t)| g.constant(&format!("p{i}"), t.clone()))
            .collect();
        g.output("loss", two_grus(&g, x, labels, &p));
        let mut graph = g.build().expect("builds");
        add_gradient_outputs(&mut graph, &numbered(params.len()));
        let x = rand(&[SEQ, BATCH, INPUT], 40);
        let labels = Tensor::from_vec(&[BATCH], vec![2i64, 0]).expect("labels");
        eval::run(&graph, &[x, labels]).expect("runs")
    };
    let (symbolic, fixed) = (run(Dim::sym("N")), run(Dim::Fixed(BATCH)));
    assert_eq!(symbolic.len(), 1 + params.len());
    for (s, f) in symbolic.iter().zip(&fixed) {
        assert_eq!(s.dims(), f.dims());
        for (a, b) in s.to_f64s().iter().zip(f.to_f64s()) {
            assert!((a - b).abs() <= 1e-12, "{a} vs {b}");
        }
    }
}

/// The seed's model in small: two GRUs (linear_before_reset, as PyTorch's) over two inputs that
/// nothing connects, one batch-first; their final states side by side feed a linear head and a
/// softmax cross-entropy.
fn parallel_grus<'g>(g: &'g GraphBuilder, x: [Traced<'g>; 2], p: &[Traced<'g>]) -> Traced<'g> {
    let mut states = Vec::new();
    for (i, x) in x.into_iter().enumerate() {
        let rnn = Rnn {
            cell: RnnCell::Gru { linear_before_reset: true },
            direction: RnnDirection::Forward,
            hidden_size: HIDDEN,
            activations: Vec::new(),
            clip: None,
            batch_first: i == 1,
        };
        let w = [Some(x), Some(p[3 * i]), Some(p[3 * i + 1]), Some(p[3 * i + 2])];
        let y_h = g.apply(Op::Rnn(rnn), &w, 2)[1];
        // [1, batch, hidden] or batch-first [batch, 1, hidden], to [batch, hidden].
        states.push(y_h.squeeze(&[if i == 1 { 1 } else { 0 }]));
    }
    let logits = g.concat(&states, 1).matmul(p[6]).add(p[7]);
    let labels = ints(g, &[BATCH], &[1, 2]);
    g.apply(loss_op(true, LossReduction::Mean, None), &[Some(logits), Some(labels)], 1)[0]
}

fn parallel_gru_params() -> Vec<Tensor> {
    let gh = 3 * HIDDEN;
    let mut p = Vec::new();
    for i in 0..2 {
        p.push(rand(&[1, gh, INPUT], 51 + 3 * i));
        p.push(rand(&[1, gh, HIDDEN], 52 + 3 * i));
        p.push(rand(&[1, 2 * gh], 53 + 3 * i));
    }
    p.push(rand(&[2 * HIDDEN, 3], 57));
    p.push(rand(&[3], 58));
    p
}

fn parallel_gru_inputs() -> [Tensor; 2] {
    [rand(&[SEQ, BATCH, INPUT], 49), rand(&[BATCH, SEQ, INPUT], 50)]
}

#[test]
fn two_parallel_grus_as_the_seed_has_them() {
    check("parallel_grus", &parallel_gru_params(), |g, p| {
        let [a, b] = parallel_gru_inputs().map(|t| g.anon_constant(t));
        parallel_grus(g, [a, b], p)
    });
}

/// The same model in f32, as the seed runs it: f32 gradients, equal to the f64 ones to f32's
/// precision.
#[test]
fn two_parallel_grus_in_f32() {
    let run = |dtype: DType| {
        let g = GraphBuilder::new("parallel_grus_f32");
        let [a, b] = parallel_gru_inputs().map(|t| g.anon_constant(t.cast(dtype)));
        let p: Vec<Traced> = parallel_gru_params()
            .into_iter()
            .enumerate()
            .map(|(i, t)| g.constant(&format!("p{i}"), t.cast(dtype)))
            .collect();
        g.output("loss", parallel_grus(&g, [a, b], &p));
        let count = p.len();
        let mut graph = g.build().expect("builds");
        for t in add_gradient_outputs(&mut graph, &numbered(count)) {
            assert_eq!(t, dtype);
        }
        eval::run(&graph, &[]).expect("runs")
    };
    let (single, double) = (run(DType::F32), run(DType::F64));
    assert_eq!(single.len(), 1 + parallel_gru_params().len());
    for (s, d) in single.iter().zip(&double) {
        assert_eq!(s.dtype(), DType::F32);
        for (a, b) in s.to_f64s().iter().zip(d.to_f64s()) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "f32 {a} vs f64 {b}");
        }
    }
}
