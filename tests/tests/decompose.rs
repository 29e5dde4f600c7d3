//! The decomposition pass: each graph is run on the interpreter before and after the pass (a pure
//! graph rewrite must not change results), and compiled against the interpreter.

use kiln_compiler::passes::decompose;
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{
    Attention, CausalActivation, Col2Im, LinearAttention, LinearUpdate, Loss, LossReduction, Rnn,
    RnnCell, RnnDirection, RotaryEmbedding,
};
use kiln_ir::{eval, DType, Graph, Op, Shape, Tensor, UnaryOp};

use crate::compile::check_against_eval;

/// The ops the pass rewrites.
fn decomposable(op: &Op) -> bool {
    matches!(
        op,
        Op::Rnn(_)
            | Op::Attention(_)
            | Op::RotaryEmbedding(_)
            | Op::CausalConvWithState { .. }
            | Op::LinearAttention(_)
            | Op::NllLoss(_)
            | Op::SoftmaxCrossEntropyLoss(_)
            | Op::CenterCropPad { .. }
            | Op::Col2Im(_)
            | Op::Det
            | Op::AffineGrid { .. }
            | Op::Dft { .. }
            | Op::Stft { .. }
            | Op::DeformConv(_)
            | Op::RoiAlign { .. }
    )
}

fn assert_close(what: &str, got: &[Tensor], want: &[Tensor], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: result count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "{what}: output {i} type");
        for (j, (a, b)) in g.to_f64s().iter().zip(w.to_f64s()).enumerate() {
            let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan()) || a == &b;
            assert!(ok, "{what}: output {i} element {j}: {a}, want {b}");
        }
    }
}

/// Decomposes `graph`, checks nothing decomposable is left and the interpreter gives the same
/// results, then compiles the original against the interpreter.
fn check(graph: &Graph, inputs: &[Tensor], tol: f64) {
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    let mut d = graph.clone();
    assert!(decompose::run(&mut d).expect("the pass runs"), "nothing was decomposed");
    d.verify().expect("the decomposed graph is well-typed");
    if let Some((_, n)) = d.nodes().find(|(_, n)| decomposable(&n.op)) {
        panic!("`{}` ({}) was left", n.name, n.op.name());
    }
    let got = eval::run(&d, inputs).expect("the interpreter runs the decomposed graph");
    assert_close("decomposed", &got, &want, tol);
    check_against_eval(graph, inputs, 2, tol.max(1e-4));
}

// ----- RNN, GRU, LSTM -----

/// An RNN node's operands and results. `seq_lens` is a graph input (run-time lengths) unless
/// `const_lens`.
struct RnnCase {
    rnn: Rnn,
    seq: usize,
    batch: usize,
    input: usize,
    bias: bool,
    initial: bool,
    peepholes: bool,
    lens: Option<Vec<i32>>,
    const_lens: bool,
    weights_as_inputs: bool,
    outputs: usize,
}

impl RnnCase {
    fn new(cell: RnnCell, direction: RnnDirection, hidden: usize) -> RnnCase {
        RnnCase {
            rnn: Rnn {
                cell,
                direction,
                hidden_size: hidden,
                activations: vec![],
                clip: None,
                batch_first: false,
            },
            seq: 4,
            batch: 3,
            input: 5,
            bias: true,
            initial: true,
            peepholes: false,
            lens: None,
            const_lens: false,
            weights_as_inputs: false,
            outputs: if matches!(cell, RnnCell::Lstm { .. }) { 3 } else { 2 },
        }
    }

    fn run(&self) {
        let r = &self.rnn;
        let h = r.hidden_size;
        let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
        let gates = match r.cell {
            RnnCell::Simple => 1,
            RnnCell::Gru { .. } => 3,
            RnnCell::Lstm { .. } => 4,
        };
        let is_lstm = gates == 4;
        let g = GraphBuilder::new("rnn");
        let mut inputs = Vec::new();
        let mut seed = 10;
        let mut operand = |name: &str, dims: &[usize], as_input: bool| {
            seed += 1;
            let t = Tensor::random(DType::F32, dims, seed);
            if as_input {
                inputs.push(t);
                g.input(name, DType::F32, dims)
            } else {
                g.constant(name, t)
            }
        };
        let xd = if r.batch_first {
            [self.batch, self.seq, self.input]
        } else {
            [self.seq, self.batch, self.input]
        };
        let state = if r.batch_first { [self.batch, dirs, h] } else { [dirs, self.batch, h] };
        let x = operand("x", &xd, true);
        let w = operand("w", &[dirs, gates * h, self.input], self.weights_as_inputs);
        let rw = operand("r", &[dirs, gates * h, h], self.weights_as_inputs);
        let b = self.bias.then(|| operand("b", &[dirs, 2 * gates * h], self.weights_as_inputs));
        let h0 = self.initial.then(|| operand("initial_h", &state, true));
        let c0 = (self.initial && is_lstm).then(|| operand("initial_c", &state, true));
        let p = (self.peepholes && is_lstm)
            .then(|| operand("p", &[dirs, 3 * h], self.weights_as_inputs));
        let lens = self.lens.as_ref().map(|l| {
            let t = Tensor::vector(l);
            if self.const_lens {
                g.constant("lens", t)
            } else {
                inputs.push(t);
                g.input("lens", DType::I32, [l.len()])
            }
        });
        let mut ops = vec![Some(x), Some(w), Some(rw), b, lens, h0];
        if is_lstm {
            ops.extend([c0, p]);
        }
        let results = g.apply(Op::Rnn(r.clone()), &ops, self.outputs);
        for (i, y) in results.into_iter().enumerate() {
            g.output(&format!("y{i}"), y);
        }
        let graph = g.build().expect("the RNN graph builds");
        check(&graph, &inputs, 1e-5);
    }
}

#[test]
fn rnn_forward() {
    RnnCase::new(RnnCell::Simple, RnnDirection::Forward, 6).run();
}

#[test]
fn rnn_reverse_with_activation_parameters_and_clip() {
    let mut c = RnnCase::new(RnnCell::Simple, RnnDirection::Reverse, 4);
    c.rnn.activations = vec![UnaryOp::LeakyRelu { alpha: 0.1 }];
    c.rnn.clip = Some(0.5);
    c.initial = false;
    c.weights_as_inputs = true;
    c.run();
}

#[test]
fn rnn_bidirectional_batch_first() {
    let mut c = RnnCase::new(RnnCell::Simple, RnnDirection::Bidirectional, 3);
    c.rnn.batch_first = true;
    c.rnn.activations = vec![UnaryOp::Tanh, UnaryOp::HardSigmoid { alpha: 0.3, beta: 0.4 }];
    c.run();
}

#[test]
fn gru_forward_linear_before_reset() {
    let mut c = RnnCase::new(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Forward, 5);
    c.weights_as_inputs = true;
    c.run();
}

#[test]
fn gru_bidirectional_batch_first_without_bias() {
    let mut c =
        RnnCase::new(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Bidirectional, 4);
    c.rnn.batch_first = true;
    c.bias = false;
    c.run();
}

#[test]
fn gru_sequence_lens_forward_and_reverse() {
    for (direction, lbr) in [
        (RnnDirection::Forward, false),
        (RnnDirection::Reverse, true),
        (RnnDirection::Bidirectional, false),
    ] {
        let mut c = RnnCase::new(RnnCell::Gru { linear_before_reset: lbr }, direction, 3);
        c.seq = 5;
        c.batch = 4;
        // An empty sequence, a full one, partial ones.
        c.lens = Some(vec![3, 0, 5, 1]);
        c.rnn.clip = Some(0.8);
        c.run();
    }
}

#[test]
fn gru_constant_sequence_lens() {
    let mut c =
        RnnCase::new(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Bidirectional, 3);
    c.lens = Some(vec![2, 4, 1]);
    c.const_lens = true;
    c.rnn.batch_first = true;
    c.run();
}

#[test]
fn lstm_forward() {
    RnnCase::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Forward, 4).run();
}

#[test]
fn lstm_bidirectional_peepholes_lens_and_activations() {
    let mut c = RnnCase::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Bidirectional, 3);
    c.peepholes = true;
    c.lens = Some(vec![4, 2, 0]);
    c.rnn.activations = vec![
        UnaryOp::HardSigmoid { alpha: 0.2, beta: 0.5 },
        UnaryOp::Tanh,
        UnaryOp::Softsign,
        UnaryOp::Sigmoid,
        UnaryOp::Elu { alpha: 0.7 },
        UnaryOp::Tanh,
    ];
    c.rnn.clip = Some(1.5);
    c.weights_as_inputs = true;
    c.run();
}

#[test]
fn lstm_reverse_input_forget_batch_first() {
    let mut c = RnnCase::new(RnnCell::Lstm { input_forget: true }, RnnDirection::Reverse, 5);
    c.rnn.batch_first = true;
    c.peepholes = true;
    c.lens = Some(vec![1, 4, 3]);
    c.run();
}

#[test]
fn lstm_only_y() {
    let mut c = RnnCase::new(RnnCell::Lstm { input_forget: false }, RnnDirection::Forward, 4);
    c.outputs = 1;
    c.initial = false;
    c.bias = false;
    c.run();
}

#[test]
fn rnn_with_a_dynamic_sequence_is_left_alone() {
    let g = GraphBuilder::new("dynamic");
    let x = g.input("x", DType::F32, Shape(vec![kiln_ir::Dim::sym("seq"), 2.into(), 3.into()]));
    let w = g.constant("w", Tensor::random(DType::F32, &[1, 4, 3], 1));
    let r = g.constant("r", Tensor::random(DType::F32, &[1, 4, 4], 2));
    let rnn = Rnn {
        cell: RnnCell::Simple,
        direction: RnnDirection::Forward,
        hidden_size: 4,
        activations: vec![],
        clip: None,
        batch_first: false,
    };
    let y = g.apply(Op::Rnn(rnn), &[Some(x), Some(w), Some(r)], 2);
    g.output("y", y[0]);
    let mut graph = g.build().expect("builds");
    assert!(!decompose::run(&mut graph).expect("the pass runs"));
    assert!(graph.nodes().any(|(_, n)| matches!(n.op, Op::Rnn(_))));
}

// ----- Attention -----

fn attention_attrs() -> Attention {
    Attention {
        is_causal: false,
        kv_num_heads: 0,
        q_num_heads: 0,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        softmax_precision: None,
    }
}

/// Attention on random inputs: Q, K, V dims, then the optional operands.
struct AttentionCase<'a> {
    attrs: Attention,
    dtype: DType,
    qkv: [&'a [usize]; 3],
    /// (dtype, dims).
    mask: Option<(DType, &'a [usize])>,
    /// Past key and past value dims.
    past: Option<[&'a [usize]; 2]>,
    nonpad: Option<&'a [i64]>,
    outputs: usize,
    tol: f64,
}

impl<'a> AttentionCase<'a> {
    fn new(attrs: Attention, qkv: [&'a [usize]; 3]) -> AttentionCase<'a> {
        AttentionCase {
            attrs,
            dtype: DType::F32,
            qkv,
            mask: None,
            past: None,
            nonpad: None,
            outputs: 1,
            tol: 1e-5,
        }
    }

    fn run(&self) {
        let (g, dtype) = (GraphBuilder::new("attention"), self.dtype);
        let mut inputs = Vec::new();
        let mut ops = Vec::new();
        for (i, (name, dims)) in ["q", "k", "v"].iter().zip(self.qkv).enumerate() {
            inputs.push(Tensor::random(dtype, dims, 100 + i as u64));
            ops.push(Some(g.input(name, dtype, dims)));
        }
        ops.push(self.mask.map(|(md, dims)| {
            inputs.push(Tensor::random(md, dims, 7));
            g.input("mask", md, dims)
        }));
        match self.past {
            Some([pk, pv]) => {
                inputs.push(Tensor::random(dtype, pk, 8));
                ops.push(Some(g.input("past_key", dtype, pk)));
                inputs.push(Tensor::random(dtype, pv, 9));
                ops.push(Some(g.input("past_value", dtype, pv)));
            }
            None => ops.extend([None, None]),
        }
        if let Some(n) = self.nonpad {
            inputs.push(Tensor::vector(n));
            ops.push(Some(g.input("nonpad_kv_seqlen", DType::I64, [n.len()])));
        }
        let results = g.apply(Op::Attention(self.attrs.clone()), &ops, self.outputs);
        for (i, y) in results.into_iter().enumerate() {
            g.output(&format!("y{i}"), y);
        }
        let graph = g.build().expect("the attention graph builds");
        check(&graph, &inputs, self.tol);
    }
}

#[test]
fn attention_4d() {
    AttentionCase::new(attention_attrs(), [&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 5]]).run();
}

#[test]
fn attention_3d_gqa_causal_scaled() {
    let a = Attention {
        q_num_heads: 4,
        kv_num_heads: 2,
        is_causal: true,
        scale: Some(0.3),
        ..attention_attrs()
    };
    AttentionCase::new(a, [&[2, 5, 4 * 6], &[2, 5, 2 * 6], &[2, 5, 2 * 3]]).run();
}

#[test]
fn attention_bool_mask_shorter_than_the_keys_with_past() {
    // The mask covers 5 of the 3 + 4 keys: the rest is masked out.
    let a = Attention { is_causal: true, ..attention_attrs() };
    let mut c = AttentionCase::new(a, [&[1, 2, 4, 8], &[1, 2, 4, 8], &[1, 2, 4, 8]]);
    c.mask = Some((DType::Bool, &[4, 5]));
    c.past = Some([&[1, 2, 3, 8], &[1, 2, 3, 8]]);
    c.outputs = 4;
    c.run();
}

#[test]
fn attention_qk_output_modes_with_softcap_and_float_mask() {
    for mode in 0..4 {
        let a = Attention {
            qk_matmul_output_mode: mode,
            softcap: 2.5,
            q_num_heads: 4,
            kv_num_heads: 1,
            ..attention_attrs()
        };
        let mut c = AttentionCase::new(a, [&[2, 3, 4 * 4], &[2, 6, 4], &[2, 6, 4]]);
        c.mask = Some((DType::F32, &[2, 1, 3, 8]));
        c.past = Some([&[2, 1, 2, 4], &[2, 1, 2, 4]]);
        c.outputs = 4;
        c.run();
    }
}

#[test]
fn attention_nonpad_kv_seqlen() {
    let a = Attention { q_num_heads: 2, kv_num_heads: 2, ..attention_attrs() };
    let mut c = AttentionCase::new(a, [&[3, 2, 2 * 4], &[3, 5, 2 * 4], &[3, 5, 2 * 4]]);
    c.mask = Some((DType::F32, &[5]));
    c.nonpad = Some(&[5, 2, 3]);
    c.run();
}

#[test]
fn attention_f16_with_softmax_precision() {
    let a = Attention { softmax_precision: Some(DType::F32), is_causal: true, ..attention_attrs() };
    let mut c = AttentionCase::new(a, [&[1, 2, 3, 8], &[1, 2, 3, 8], &[1, 2, 3, 8]]);
    c.dtype = DType::F16;
    c.outputs = 4;
    c.tol = 2e-3;
    c.run();
}

// ----- RotaryEmbedding -----

fn rotary_case(r: RotaryEmbedding, xd: &[usize], cache: &[usize], positions: Option<&[usize]>) {
    let g = GraphBuilder::new("rotary");
    let mut inputs = vec![Tensor::random(DType::F32, xd, 1)];
    let x = g.input("x", DType::F32, xd);
    let cos = g.constant("cos", Tensor::random(DType::F32, cache, 2));
    let sin = g.constant("sin", Tensor::random(DType::F32, cache, 3));
    let pos = positions.map(|p| {
        let rows = cache[0] as i64;
        let ids: Vec<i64> =
            (0..p.iter().product::<usize>() as i64).map(|i| (i * 7 + 3) % rows).collect();
        inputs.push(Tensor::from_slice(p, &ids).expect("ids"));
        g.input("position_ids", DType::I64, p)
    });
    let y = g.apply(Op::RotaryEmbedding(r), &[Some(x), Some(cos), Some(sin), pos], 1);
    g.output("y", y[0]);
    let graph = g.build().expect("the rotary graph builds");
    check(&graph, &inputs, 1e-5);
}

#[test]
fn rotary_4d_with_positions() {
    rotary_case(
        RotaryEmbedding { interleaved: false, num_heads: 0, rotary_embedding_dim: 0 },
        &[2, 3, 4, 8],
        &[10, 4],
        Some(&[2, 4]),
    );
}

#[test]
fn rotary_3d_interleaved_partial() {
    rotary_case(
        RotaryEmbedding { interleaved: true, num_heads: 2, rotary_embedding_dim: 4 },
        &[2, 3, 2 * 10],
        &[6, 2],
        Some(&[2, 3]),
    );
}

#[test]
fn rotary_without_positions() {
    rotary_case(
        RotaryEmbedding { interleaved: true, num_heads: 0, rotary_embedding_dim: 6 },
        &[2, 2, 3, 8],
        &[2, 3, 3],
        None,
    );
}

// ----- CausalConvWithState, LinearAttention -----

/// One node of `op` whose operands (`None`: omitted) are inputs of random values, `outputs`
/// results.
fn stateful_case(op: Op, dtype: DType, operands: &[Option<&[usize]>], outputs: usize, tol: f64) {
    let g = GraphBuilder::new("stateful");
    let mut inputs = Vec::new();
    let mut values = Vec::new();
    for (i, dims) in operands.iter().enumerate() {
        values.push(dims.map(|d| {
            inputs.push(Tensor::random(dtype, d, 11 + i as u64));
            g.input(&format!("x{i}"), dtype, d)
        }));
    }
    let ys = g.apply(op, &values, outputs);
    for (i, y) in ys.iter().enumerate() {
        g.output(&format!("y{i}"), *y);
    }
    let graph = g.build().expect("the graph builds");
    check(&graph, &inputs, tol);
}

#[test]
fn causal_conv_with_state_with_and_without_past() {
    let none = Op::CausalConvWithState { activation: CausalActivation::None };
    let silu = Op::CausalConvWithState { activation: CausalActivation::Silu };
    let (x, w, b, past): (&[usize], &[usize], &[usize], &[usize]) =
        (&[2, 3, 5], &[3, 1, 4], &[3], &[2, 3, 3]);
    stateful_case(none.clone(), DType::F32, &[Some(x), Some(w)], 2, 1e-5);
    stateful_case(silu.clone(), DType::F32, &[Some(x), Some(w), Some(b), Some(past)], 2, 1e-5);
    // An input shorter than the state; one tap (an empty state); f16.
    stateful_case(
        none.clone(),
        DType::F32,
        &[Some(&[2, 3, 1]), Some(w), None, Some(past)],
        2,
        1e-5,
    );
    stateful_case(none.clone(), DType::F32, &[Some(x), Some(&[3, 1, 1])], 2, 1e-5);
    // No positions at all: an empty output, the past as the state.
    stateful_case(none, DType::F32, &[Some(&[2, 3, 0]), Some(w), None, Some(past)], 2, 0.0);
    stateful_case(silu, DType::F16, &[Some(x), Some(w), Some(b)], 2, 2e-3);
}

fn linear_attention(update_rule: LinearUpdate, q_heads: usize, kv_heads: usize) -> Op {
    Op::LinearAttention(LinearAttention {
        chunk_size: 64,
        kv_num_heads: kv_heads,
        q_num_heads: q_heads,
        scale: 0.0,
        update_rule,
    })
}

#[test]
fn linear_attention_every_update_rule() {
    // B = 2, T = 3, d_k = 4, d_v = 3; two KV heads, four query heads.
    let (q, k, v): (&[usize], &[usize], &[usize]) = (&[2, 3, 16], &[2, 3, 8], &[2, 3, 6]);
    let past: &[usize] = &[2, 2, 4, 3];
    let per_feature: &[usize] = &[2, 3, 8];
    let (per_head, one): (&[usize], &[usize]) = (&[2, 3, 2], &[2, 3, 1]);
    let cases = [
        (LinearUpdate::Linear, None, None),
        (LinearUpdate::Gated, Some(per_feature), None),
        (LinearUpdate::Gated, Some(per_head), None),
        (LinearUpdate::Delta, None, Some(per_head)),
        (LinearUpdate::GatedDelta, Some(per_feature), Some(one)),
    ];
    for (rule, decay, beta) in cases {
        let op = linear_attention(rule, 4, 2);
        stateful_case(
            op.clone(),
            DType::F32,
            &[Some(q), Some(k), Some(v), None, decay, beta],
            2,
            1e-4,
        );
        stateful_case(
            op,
            DType::F32,
            &[Some(q), Some(k), Some(v), Some(past), decay, beta],
            2,
            1e-4,
        );
    }
    // No steps: an empty output, the past as the state.
    let op = linear_attention(LinearUpdate::Linear, 4, 2);
    let (q0, k0, v0): (&[usize], &[usize], &[usize]) = (&[2, 0, 16], &[2, 0, 8], &[2, 0, 6]);
    stateful_case(op, DType::F32, &[Some(q0), Some(k0), Some(v0), Some(past)], 2, 0.0);
    // f16, one step.
    let op = linear_attention(LinearUpdate::GatedDelta, 2, 2);
    let (q1, d1, b1): (&[usize], &[usize], &[usize]) = (&[1, 1, 8], &[1, 1, 8], &[1, 1, 2]);
    stateful_case(
        op,
        DType::F16,
        &[Some(q1), Some(q1), Some(q1), None, Some(d1), Some(b1)],
        2,
        2e-3,
    );
}

// ----- Losses -----

fn loss_case(
    softmax: bool,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    weight: bool,
    xd: &[usize],
    log_prob: bool,
) {
    let g = GraphBuilder::new("loss");
    let c = xd[1];
    let mut td = xd.to_vec();
    td.remove(1);
    let n: usize = td.iter().product();
    // Targets cycle through the classes; every third one is ignore_index when there is one.
    let targets: Vec<i64> = (0..n)
        .map(|i| if i % 3 == 1 { ignore_index.unwrap_or(1) } else { (i * 5 % c) as i64 })
        .collect();
    let inputs = vec![
        Tensor::random(DType::F32, xd, 4),
        Tensor::from_slice(&td, &targets).expect("targets"),
    ];
    let x = g.input("x", DType::F32, xd);
    let t = g.input("target", DType::I64, td.as_slice());
    // Positive weights: a weighted mean divides by their sum.
    let ws: Vec<f32> = (0..c).map(|k| 0.5 + 0.25 * k as f32).collect();
    let w = weight.then(|| g.constant("weight", Tensor::from_slice(&[c], &ws).expect("weights")));
    let l = Loss { reduction, ignore_index };
    let op = if softmax { Op::SoftmaxCrossEntropyLoss(l) } else { Op::NllLoss(l) };
    let results = g.apply(op, &[Some(x), Some(t), w], if log_prob { 2 } else { 1 });
    for (i, y) in results.into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    let graph = g.build().expect("the loss graph builds");
    check(&graph, &inputs, 1e-5);
}

#[test]
fn nll_loss_reductions() {
    for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean] {
        loss_case(false, reduction, None, false, &[4, 5], false);
        loss_case(false, reduction, Some(2), true, &[2, 3, 4, 2], false);
    }
}

#[test]
fn nll_loss_negative_ignore_index_mean() {
    loss_case(false, LossReduction::Mean, Some(-100), false, &[3, 4, 5], false);
}

#[test]
fn softmax_cross_entropy_with_log_prob() {
    for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean] {
        loss_case(true, reduction, Some(0), true, &[3, 4, 2], true);
        loss_case(true, reduction, None, false, &[5, 3], true);
    }
}

// ----- CenterCropPad, Col2Im, Det -----

/// One node of `op` on input `x` (random values) and constant shape operands.
fn one_node(op: Op, dtype: DType, xd: &[usize], shapes: &[Tensor], tol: f64) {
    let g = GraphBuilder::new("image");
    let x = g.input("x", dtype, xd);
    let mut operands = vec![Some(x)];
    for (i, s) in shapes.iter().enumerate() {
        operands.push(Some(g.constant(&format!("s{i}"), s.clone())));
    }
    let y = g.apply(op, &operands, 1)[0];
    g.output("y", y);
    let graph = g.build().expect("the graph builds");
    check(&graph, &[Tensor::random(dtype, xd, 7)], tol);
}

#[test]
fn center_crop_pad_crops_and_pads_in_one_node() {
    // Axis 0 cropped by an odd amount, axis 2 padded by one, axis 1 untouched.
    let op = Op::CenterCropPad { axes: vec![0, -1] };
    one_node(op, DType::F32, &[7, 3, 4], &[Tensor::vector(&[4i64, 5])], 0.0);
}

#[test]
fn col2im_with_strides_pads_and_dilations() {
    let c = Col2Im { dilations: vec![2, 1], pads: vec![1, 0, 1, 2], strides: vec![1, 2] };
    // Image 5 x 6, block 2 x 3: positions (5 + 2 - 3) / 1 + 1 = 5 by (6 + 2 - 3) / 2 + 1 = 3.
    let shapes = [Tensor::vector(&[5i64, 6]), Tensor::vector(&[2i64, 3])];
    one_node(Op::Col2Im(c), DType::F32, &[2, 2 * 6, 15], &shapes, 1e-5);
}

#[test]
fn det_of_stacked_matrices_up_to_four_by_four() {
    for m in 1..=4 {
        one_node(Op::Det, DType::F32, &[2, 3, m, m], &[], 1e-4);
    }
    one_node(Op::Det, DType::F64, &[3, 3], &[], 1e-9);
}

#[test]
fn affine_grid_2d_and_3d() {
    for align_corners in [false, true] {
        let op = Op::AffineGrid { align_corners };
        one_node(op.clone(), DType::F32, &[2, 2, 3], &[Tensor::vector(&[2i64, 3, 4, 5])], 1e-6);
        // A single-pixel axis sits at 0.
        one_node(op, DType::F64, &[1, 3, 4], &[Tensor::vector(&[1i64, 1, 2, 1, 3])], 1e-12);
    }
}

// ----- DFT, STFT -----

/// One operand of a node: a graph input (run-time data), a constant, or absent.
enum Arg {
    In(Tensor),
    Const(Tensor),
    Absent,
}

/// Checks one node whose operands are `args`.
fn one_node_of(op: Op, args: &[Arg], tol: f64) {
    let g = GraphBuilder::new("signal");
    let mut inputs = Vec::new();
    let operands: Vec<_> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::In(t) => {
                inputs.push(t.clone());
                Some(g.input(&format!("x{i}"), t.dtype(), t.dims()))
            }
            Arg::Const(t) => Some(g.constant(&format!("c{i}"), t.clone())),
            Arg::Absent => None,
        })
        .collect();
    let y = g.apply(op, &operands, 1)[0];
    g.output("y", y);
    let graph = g.build().expect("the graph builds");
    check(&graph, &inputs, tol);
}

fn signal(dtype: DType, dims: &[usize]) -> Arg {
    Arg::In(Tensor::random(dtype, dims, 11))
}

fn int(v: i64) -> Arg {
    Arg::Const(Tensor::scalar(v))
}

#[test]
fn dft_forward_inverse_and_onesided_along_any_axis() {
    use Arg::Absent;
    let dft = |inverse, onesided| Op::Dft { inverse, onesided };
    // Real lines along the default axis (-2) and along axis 1 of 4.
    one_node_of(dft(false, false), &[signal(DType::F32, &[2, 6, 3, 1]), Absent, Absent], 1e-4);
    one_node_of(dft(false, false), &[signal(DType::F32, &[2, 6, 3, 1]), Absent, int(1)], 1e-4);
    // Complex lines along axis 0, padded to 8 points, one-sided: 5 bins.
    one_node_of(dft(false, true), &[signal(DType::F32, &[3, 5, 2]), int(8), int(0)], 1e-4);
    // The inverse of complex lines cut to 4 points.
    one_node_of(dft(true, false), &[signal(DType::F32, &[2, 6, 2]), int(4), int(-2)], 1e-4);
    // One-sided inverses: the default even length 8 from 5 bins, and an odd 7.
    one_node_of(dft(true, true), &[signal(DType::F32, &[2, 5, 2]), Absent, int(1)], 1e-4);
    one_node_of(dft(true, true), &[signal(DType::F32, &[2, 5, 2]), int(7), int(1)], 1e-4);
    // f64 keeps f64's precision.
    one_node_of(dft(false, false), &[signal(DType::F64, &[4, 16, 1]), Absent, Absent], 1e-10);
}

#[test]
fn stft_with_and_without_a_window() {
    use Arg::Absent;
    // A run-time window of 6 points every 3 of 20: 5 frames of 4 bins.
    let window = Arg::In(Tensor::random(DType::F32, &[6], 5));
    let op = Op::Stft { onesided: true };
    one_node_of(op, &[signal(DType::F32, &[2, 20, 1]), int(3), window, Absent], 1e-4);
    // A complex signal in frames of 5 every 2, two-sided.
    let op = Op::Stft { onesided: false };
    one_node_of(op, &[signal(DType::F32, &[1, 16, 2]), int(2), Absent, int(5)], 1e-4);
}

// ----- DeformConv -----

#[test]
fn deform_conv_with_groups_masks_strides_and_padding() {
    use kiln_ir::op::DeformConv;
    let random = |dims: &[usize], seed| Arg::In(Tensor::random(DType::F32, dims, seed));
    // Offsets of a few pixels either way reach outside the image from every edge.
    let offsets = |dims: &[usize]| {
        let t = Tensor::random(DType::F32, dims, 3);
        let v: Vec<f64> = t.to_f64s().iter().map(|v| v * 3.0).collect();
        Arg::In(Tensor::from_f64s(DType::F32, dims, &v).unwrap())
    };
    // 4 channels in 2 groups and 2 offset groups, 6 outputs, 3 x 3 kernel, stride 2, pads 1.
    let d = DeformConv {
        group: 2,
        offset_group: 2,
        strides: vec![2, 2],
        pads: vec![1, 1, 1, 1],
        ..DeformConv::default()
    };
    // 7 x 6 padded to 9 x 8: (9 - 3) / 2 + 1 = 4 by (8 - 3) / 2 + 1 = 3.
    let args = [
        random(&[2, 4, 7, 6], 1),
        random(&[6, 2, 3, 3], 2),
        offsets(&[2, 2 * 9 * 2, 4, 3]),
        random(&[6], 4),
        random(&[2, 2 * 9, 4, 3], 5),
    ];
    one_node_of(Op::DeformConv(d), &args, 1e-4);
    // Dilation 2, no bias or mask.
    let d = DeformConv { dilations: vec![2, 1], ..DeformConv::default() };
    let args = [random(&[1, 3, 6, 5], 6), random(&[2, 3, 2, 2], 7), offsets(&[1, 8, 4, 4])];
    one_node_of(Op::DeformConv(d), &args, 1e-4);
}

// ----- RoiAlign -----

#[test]
fn roi_align_both_modes_and_box_conventions() {
    use kiln_ir::op::{RoiCoordinates, RoiPooling};
    // Boxes inside, across the edges, smaller than a pixel and far outside, on two images.
    let rois: [f32; 20] = [
        0.5, 1.0, 6.0, 5.5, //
        -2.0, -1.5, 3.0, 9.5, //
        2.2, 2.4, 2.3, 2.5, //
        4.0, 0.0, 30.0, 4.0, //
        20.0, 20.0, 25.0, 25.0,
    ];
    for coordinates in [RoiCoordinates::HalfPixel, RoiCoordinates::OutputHalfPixel] {
        for mode in [RoiPooling::Avg, RoiPooling::Max] {
            let op = Op::RoiAlign {
                coordinates,
                mode,
                output_height: 3,
                output_width: 2,
                sampling_ratio: 2,
                spatial_scale: 0.75,
            };
            let args = [
                Arg::In(Tensor::random(DType::F32, &[2, 3, 8, 7], 1)),
                Arg::In(Tensor::from_slice(&[5, 4], &rois).unwrap()),
                Arg::In(Tensor::vector(&[1i64, 0, 1, 0, 1])),
            ];
            one_node_of(op, &args, 1e-4);
        }
    }
}
