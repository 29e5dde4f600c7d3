//! RNN, GRU, LSTM, Attention, RotaryEmbedding, CausalConvWithState, LinearAttention, the losses.
//!
//! Values are hand-computed from the ONNX formulas where a case is small enough; larger ones are
//! literals from onnxruntime 1.31 (CPU), as each comment says.

use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::op::{
    Attention, CausalActivation, LinearAttention, LinearUpdate, Loss, LossReduction, Rnn, RnnCell,
    RnnDirection, RotaryEmbedding,
};
use kiln_ir::{eval, DType, Dim, Op, Shape, Tensor, UnaryOp};

use super::{assert_close, f32s};

/// Runs `op` on the given operands (`None` = omitted) through a traced graph; returns `n` results.
fn run_op(op: Op, operands: &[Option<&Tensor>], n: usize) -> Result<Vec<Tensor>, String> {
    let g = GraphBuilder::new("t");
    let vals: Vec<Option<Traced>> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| t.map(|t| g.input(&format!("x{i}"), t.dtype(), t.dims())))
        .collect();
    let ys = g.apply(op, &vals, n);
    for (i, y) in ys.iter().enumerate() {
        g.output(&format!("y{i}"), *y);
    }
    let graph = g.build().map_err(|e| e.to_string())?;
    let inputs: Vec<Tensor> = operands.iter().flatten().map(|t| (*t).clone()).collect();
    eval::run(&graph, &inputs).map_err(|e| e.to_string())
}

/// `run_op` that must succeed.
#[track_caller]
fn run(op: Op, operands: &[Option<&Tensor>], n: usize) -> Vec<Tensor> {
    run_op(op, operands, n).unwrap_or_else(|e| panic!("{e}"))
}

/// A shape from text: numbers are sizes, anything else a symbol (`"seq,batch,3"`).
fn shape(s: &str) -> Shape {
    Shape(
        s.split(',')
            .filter(|d| !d.is_empty())
            .map(|d| d.parse::<usize>().map_or_else(|_| Dim::sym(d), Dim::Fixed))
            .collect(),
    )
}

/// The printed types of the first `n` results of `op` on operands of the given types, or the error.
fn types(op: Op, operands: &[Option<(DType, &str)>], n: usize) -> Result<Vec<String>, String> {
    let g = GraphBuilder::new("t");
    let vals: Vec<Option<Traced>> = operands
        .iter()
        .enumerate()
        .map(|(i, o)| o.map(|(d, s)| g.input(&format!("x{i}"), d, shape(s))))
        .collect();
    let ys = g.apply(op, &vals, n);
    for (i, y) in ys.iter().enumerate() {
        g.output(&format!("y{i}"), *y);
    }
    let graph = g.build().map_err(|e| e.to_string())?;
    Ok(graph.outputs().iter().map(|(_, v)| graph.value_type(*v).to_string()).collect())
}

const F: DType = DType::F32;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn rnn(cell: RnnCell, direction: RnnDirection, hidden_size: usize) -> Rnn {
    Rnn { cell, direction, hidden_size, activations: vec![], clip: None, batch_first: false }
}

// ----- RNN, GRU, LSTM: values -----

#[test]
fn rnn_one_step_one_unit_by_hand() {
    let (x, w, r) = (f32s(&[1, 1, 1], &[0.5]), f32s(&[1, 1, 1], &[2.0]), f32s(&[1, 1, 1], &[1.0]));
    let b = f32s(&[1, 2], &[0.1, 0.2]);
    let h0 = f32s(&[1, 1, 1], &[0.3]);
    let op = Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Forward, 1));
    let out = run(op.clone(), &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)], 2);
    // h = tanh(x W + h0 R + Wb + Rb) = tanh(1.0 + 0.3 + 0.3)
    let h = 1.6f64.tanh();
    assert_close(&out[0], &[1, 1, 1, 1], &[h], 1e-6);
    assert_close(&out[1], &[1, 1, 1], &[h], 1e-6);
    // Other activations come with their parameters: LeakyRelu(0.1) of -1.6.
    let h0 = f32s(&[1, 1, 1], &[-3.5]);
    let leaky = Op::Rnn(Rnn {
        activations: vec![UnaryOp::LeakyRelu { alpha: 0.1 }],
        ..rnn(RnnCell::Simple, RnnDirection::Forward, 1)
    });
    let out = run(leaky, &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)], 2);
    assert_close(&out[1], &[1, 1, 1], &[-0.22], 1e-6);
    // clip bounds the activation's input: tanh(clip(1.6, 0.5)).
    let clipped =
        Op::Rnn(Rnn { clip: Some(0.5), ..rnn(RnnCell::Simple, RnnDirection::Forward, 1) });
    let h0 = f32s(&[1, 1, 1], &[0.3]);
    let out = run(clipped, &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)], 2);
    assert_close(&out[1], &[1, 1, 1], &[0.5f64.tanh()], 1e-6);
}

#[test]
fn gru_one_step_by_hand_both_reset_orders() {
    // One unit: gate rows z, r, h; B = [Wbz, Wbr, Wbh, Rbz, Rbr, Rbh].
    let x = f32s(&[1, 1, 1], &[0.5]);
    let w = f32s(&[1, 3, 1], &[0.4, -0.3, 0.8]);
    let r = f32s(&[1, 3, 1], &[0.2, 0.6, -0.7]);
    let b = f32s(&[1, 6], &[0.1, 0.2, 0.3, -0.1, 0.05, 0.4]);
    let h0 = f32s(&[1, 1, 1], &[0.9]);
    let (xv, hp) = (0.5f64, 0.9f64);
    let z = sigmoid(xv * 0.4 + hp * 0.2 + 0.1 - 0.1);
    let rg = sigmoid(xv * -0.3 + hp * 0.6 + 0.2 + 0.05);
    for lbr in [false, true] {
        let cand = if lbr {
            (xv * 0.8 + rg * (hp * -0.7 + 0.4) + 0.3).tanh()
        } else {
            (xv * 0.8 + (rg * hp) * -0.7 + 0.4 + 0.3).tanh()
        };
        let want = (1.0 - z) * cand + z * hp;
        let op = Op::Rnn(rnn(RnnCell::Gru { linear_before_reset: lbr }, RnnDirection::Forward, 1));
        let out = run(op, &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)], 2);
        assert_close(&out[1], &[1, 1, 1], &[want], 1e-6);
    }
}

#[test]
fn lstm_one_step_with_peepholes_by_hand() {
    // One unit: gate rows i, o, f, c; peepholes i, o, f.
    let x = f32s(&[1, 1, 1], &[1.0]);
    let w = f32s(&[1, 4, 1], &[0.5, -0.4, 0.3, 0.9]);
    let r = f32s(&[1, 4, 1], &[0.1, 0.2, -0.3, 0.4]);
    let b = f32s(&[1, 8], &[0.0, 0.1, 0.2, 0.0, 0.05, 0.0, 0.0, -0.1]);
    let h0 = f32s(&[1, 1, 1], &[0.5]);
    let c0 = f32s(&[1, 1, 1], &[-0.6]);
    let p = f32s(&[1, 3], &[0.7, -0.2, 0.4]);
    let (hp, cp) = (0.5f64, -0.6f64);
    let i = sigmoid(0.5 + hp * 0.1 + 0.0 + 0.05 + 0.7 * cp);
    let f = sigmoid(0.3 + hp * -0.3 + 0.2 + 0.0 + 0.4 * cp);
    let g = (0.9 + hp * 0.4 + 0.0 - 0.1).tanh();
    let c = f * cp + i * g;
    let o = sigmoid(-0.4 + hp * 0.2 + 0.1 + 0.0 + -0.2 * c);
    let h = o * c.tanh();
    let op = Op::Rnn(rnn(RnnCell::Lstm { input_forget: false }, RnnDirection::Forward, 1));
    let out =
        run(op, &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0), Some(&c0), Some(&p)], 3);
    assert_close(&out[0], &[1, 1, 1, 1], &[h], 1e-6);
    assert_close(&out[1], &[1, 1, 1], &[h], 1e-6);
    assert_close(&out[2], &[1, 1, 1], &[c], 1e-6);
}

/// X, W, R, B, sequence_lens, initial_h of a bidirectional one-unit RNN over 3 steps, batch 2.
fn bidirectional_case() -> [Tensor; 6] {
    [
        f32s(&[3, 2, 1], &[0.5, -1.0, 1.5, 0.25, -0.5, 2.0]),
        f32s(&[2, 1, 1], &[0.8, -0.6]),
        f32s(&[2, 1, 1], &[0.5, 0.9]),
        f32s(&[2, 2], &[0.1, -0.2, 0.05, 0.3]),
        Tensor::vector(&[3i32, 1]),
        f32s(&[2, 2, 1], &[0.2, -0.4, 0.6, 0.1]),
    ]
}

#[test]
fn rnn_bidirectional_with_sequence_lens() {
    let [x, w, r, b, lens, h0] = bidirectional_case();
    let op = Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Bidirectional, 1));
    let out = run(op, &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)], 2);
    // onnxruntime. Batch 1 has length 1: its steps 1 and 2 are zero, and its reverse pass starts at
    // step 0, so both directions' Y_h come from step 0.
    #[rustfmt::skip]
    let y = [0.379949, -0.800499, 0.2217469, 0.7778882, 0.8591198, 0.0, 0.1949918, 0.0, -0.07032382, 0.0, 0.8305789, 0.0];
    assert_close(&out[0], &[3, 2, 2, 1], &y, 1e-6);
    assert_close(&out[1], &[2, 2, 1], &[-0.07032382, -0.800499, 0.2217469, 0.7778882], 1e-6);
}

#[test]
fn rnn_batch_first_is_the_transposed_layout() {
    let [x, w, r, b, lens, h0] = bidirectional_case();
    let t = |t: &Tensor, perm: &[usize]| {
        eval::eval_op(&Op::Transpose { perm: perm.to_vec() }, &[Some(t)], 1).unwrap().remove(0)
    };
    let op =
        Op::Rnn(Rnn { batch_first: true, ..rnn(RnnCell::Simple, RnnDirection::Bidirectional, 1) });
    let out = run(
        op,
        &[
            Some(&t(&x, &[1, 0, 2])),
            Some(&w),
            Some(&r),
            Some(&b),
            Some(&lens),
            Some(&t(&h0, &[1, 0, 2])),
        ],
        2,
    );
    let op0 = Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Bidirectional, 1));
    let want = run(op0, &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)], 2);
    assert_eq!(out[0], t(&want[0], &[2, 0, 1, 3]));
    assert_eq!(out[1], t(&want[1], &[1, 0, 2]));
}

#[test]
fn rnn_zero_length_sequence_gives_zero_state() {
    let x = bidirectional_case()[0].clone();
    let (w, r, b) =
        (f32s(&[1, 1, 1], &[0.8]), f32s(&[1, 1, 1], &[0.5]), f32s(&[1, 2], &[0.1, -0.2]));
    let h0 = f32s(&[1, 2, 1], &[0.2, -0.4]);
    let lens = Tensor::vector(&[0i64, 2]);
    let out = run(
        Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Forward, 1)),
        &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)],
        2,
    );
    // As onnxruntime: nothing ran for batch 0, so its Y and Y_h are 0, not initial_h.
    let yh = out[1].to_f64s();
    assert_eq!(yh[0], 0.0);
    assert!(yh[1] != 0.0);
    assert!(out[0].to_f64s().iter().step_by(2).all(|&v| v == 0.0));
}

#[test]
fn gru_reverse_both_reset_orders_match_onnxruntime() {
    let x = f32s(&[2, 1, 2], &[0.25, 0.79, 0.55, -0.55]);
    let w = f32s(
        &[1, 6, 2],
        &[-0.4, 0.75, -0.99, 0.64, 0.59, -0.06, -0.39, -0.44, -0.49, -0.11, 0.01, 0.11],
    );
    let r = f32s(
        &[1, 6, 2],
        &[0.99, 0.59, 0.24, 0.98, -0.57, -0.68, 0.23, -0.91, -0.93, 0.03, -0.07, 0.83],
    );
    let b = f32s(
        &[1, 12],
        &[0.26, 0.03, -0.01, -0.5, -0.98, -0.62, 0.38, -0.6, -0.26, -0.99, 0.66, -0.69],
    );
    let h0 = f32s(&[1, 1, 2], &[-0.46, 0.76]);
    // onnxruntime, direction = "reverse", linear_before_reset = 0 and 1.
    let want = [
        [-0.3608471, -0.6964958, -0.3896262, -0.3683207],
        [-0.5150662, -0.4282218, -0.5257393, -0.1806264],
    ];
    for (lbr, want) in [false, true].into_iter().zip(want) {
        let op = Op::Rnn(rnn(RnnCell::Gru { linear_before_reset: lbr }, RnnDirection::Reverse, 2));
        let out = run(op, &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)], 2);
        assert_close(&out[0], &[2, 1, 1, 2], &want, 1e-6);
        // Reverse: the final state is the one after step 0.
        assert_close(&out[1], &[1, 1, 2], &want[..2], 1e-6);
    }
}

#[test]
fn lstm_input_forget_clip_and_peepholes_match_onnxruntime() {
    let x = f32s(&[2, 1, 1], &[0.02, 0.69]);
    let w = f32s(&[1, 8, 1], &[0.28, 0.48, -0.82, 0.08, 0.02, 0.74, -0.28, 0.2]);
    #[rustfmt::skip]
    let r = f32s(&[1, 8, 2], &[-0.88, -0.22, -0.35, -0.7, 0.63, -0.24, 0.96, 0.18, 0.21, 0.28, 0.35, -0.7, -0.12, -0.52, -0.2, -0.81]);
    let b = f32s(
        &[1, 16],
        &[
            0.94, -0.57, 0.34, -0.4, 0.75, 0.32, -0.74, 0.69, 0.89, 0.81, 0.14, -0.71, -0.62, 0.86,
            0.1, -0.64,
        ],
    );
    let p = f32s(&[1, 6], &[0.77, 0.28, 0.14, -0.25, -0.18, -0.52]);
    // onnxruntime, clip = 0.5, input_forget = 0 and 1: (Y, Y_c).
    let want = [
        ([-0.1691799, 0.01144456, -0.1815236, 0.05592617], [-0.4431876, 0.1492308]),
        ([-0.1691799, 0.01144456, -0.1648871, 0.05318088], [-0.3962484, 0.1418042]),
    ];
    for (input_forget, (y, c)) in [false, true].into_iter().zip(want) {
        let op = Op::Rnn(Rnn {
            clip: Some(0.5),
            ..rnn(RnnCell::Lstm { input_forget }, RnnDirection::Forward, 2)
        });
        let out = run(op, &[Some(&x), Some(&w), Some(&r), Some(&b), None, None, None, Some(&p)], 3);
        assert_close(&out[0], &[2, 1, 1, 2], &y, 1e-6);
        assert_close(&out[1], &[1, 1, 2], &y[2..], 1e-6);
        assert_close(&out[2], &[1, 1, 2], &c, 1e-6);
    }
}

#[test]
fn rnn_rejects_bad_sequence_lengths() {
    let [x, w, r, b, _, h0] = bidirectional_case();
    let op = Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Bidirectional, 1));
    let lens = Tensor::vector(&[4i32, 1]);
    let e = run_op(op, &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)], 2)
        .unwrap_err();
    assert!(e.contains("sequence length 4 is outside 0..=3"), "{e}");
}

// ----- RNN, GRU, LSTM: shapes -----

#[test]
fn rnn_result_shapes_follow_layout_and_direction() {
    let lstm = |direction, batch_first| {
        Op::Rnn(Rnn { batch_first, ..rnn(RnnCell::Lstm { input_forget: false }, direction, 4) })
    };
    let ops =
        |x: &'static str, dirs: &'static str| [Some((F, x)), Some((F, dirs)), Some((F, "2,16,4"))];
    let t =
        types(lstm(RnnDirection::Bidirectional, false), &ops("seq,batch,3", "2,16,3"), 3).unwrap();
    assert_eq!(t, ["f32[seq,2,batch,4]", "f32[2,batch,4]", "f32[2,batch,4]"]);
    let t =
        types(lstm(RnnDirection::Bidirectional, true), &ops("batch,seq,3", "2,16,3"), 3).unwrap();
    assert_eq!(t, ["f32[batch,seq,2,4]", "f32[batch,2,4]", "f32[batch,2,4]"]);
    // hidden_size left out (0): R's last dimension gives it. GRU has two results.
    let gru = Op::Rnn(rnn(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Reverse, 0));
    let t = types(gru, &[Some((F, "5,2,3")), Some((F, "1,15,3")), Some((F, "1,15,5"))], 2).unwrap();
    assert_eq!(t, ["f32[5,1,2,5]", "f32[1,2,5]"]);
    let gru = Op::Rnn(rnn(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Forward, 5));
    let e =
        types(gru, &[Some((F, "5,2,3")), Some((F, "1,15,3")), Some((F, "1,15,5"))], 3).unwrap_err();
    assert!(e.contains("has 2 results, 3 asked for"), "{e}");
}

#[test]
fn rnn_shape_errors_name_the_shapes() {
    let lstm = Op::Rnn(rnn(RnnCell::Lstm { input_forget: false }, RnnDirection::Forward, 4));
    let e = types(lstm.clone(), &[Some((F, "5,2,3")), Some((F, "1,12,3")), Some((F, "1,16,4"))], 1)
        .unwrap_err();
    assert!(
        e.contains("W must be [1,16,3] (dirs, 4*hidden, input) for f32[5,2,3], got f32[1,12,3]"),
        "{e}"
    );
    let e = types(
        lstm.clone(),
        &[Some((F, "5,2,3")), Some((F, "1,16,3")), Some((F, "1,16,4")), Some((F, "1,16"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("B must be [1,32] (dirs, 2*4*hidden) for f32[5,2,3], got f32[1,16]"), "{e}");
    let e = types(
        lstm.clone(),
        &[Some((F, "5,2,3")), Some((F, "1,16,3")), Some((F, "1,16,4")), None, Some((F, "2"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("sequence_lens must be an integer tensor, got f32[2]"), "{e}");
    let e = types(
        lstm.clone(),
        &[
            Some((F, "5,2,3")),
            Some((F, "1,16,3")),
            Some((F, "1,16,4")),
            None,
            None,
            Some((F, "2,1,4")),
        ],
        1,
    )
    .unwrap_err();
    assert!(
        e.contains(
            "initial_h must be [1,2,4] (dirs, batch, hidden) for f32[5,2,3], got f32[2,1,4]"
        ),
        "{e}"
    );
    let e = types(
        lstm,
        &[
            Some((F, "5,2,3")),
            Some((F, "1,16,3")),
            Some((F, "1,16,4")),
            None,
            None,
            None,
            None,
            Some((F, "1,8")),
        ],
        1,
    )
    .unwrap_err();
    assert!(e.contains("P must be [1,12] (dirs, 3*hidden) for f32[5,2,3], got f32[1,8]"), "{e}");
    let two = Op::Rnn(Rnn {
        activations: vec![UnaryOp::Tanh, UnaryOp::Tanh],
        ..rnn(RnnCell::Simple, RnnDirection::Forward, 4)
    });
    let e =
        types(two, &[Some((F, "5,2,3")), Some((F, "1,4,3")), Some((F, "1,4,4"))], 1).unwrap_err();
    assert!(
        e.contains("RNN takes 1 activation(s) per direction, 1 for 1 direction(s); got 2"),
        "{e}"
    );
    let e = types(
        Op::Rnn(rnn(RnnCell::Simple, RnnDirection::Forward, 4)),
        &[Some((F, "5,3")), Some((F, "1,4,3")), Some((F, "1,4,4"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("X must be 3-D [seq, batch, input], got f32[5,3]"), "{e}");
}

// ----- Attention -----

fn attention() -> Attention {
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

#[test]
fn attention_by_hand_with_every_qk_output_mode() {
    // One head, one query [1, 0], keys [1, 0] and [0, 1], values 1 and 3; head size 2.
    let q = f32s(&[1, 1, 1, 2], &[1.0, 0.0]);
    let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f32s(&[1, 1, 2, 1], &[1.0, 3.0]);
    let out = run(Op::Attention(attention()), &[Some(&q), Some(&k), Some(&v)], 4);
    let s = 1.0 / 2f64.sqrt();
    let p0 = sigmoid(s); // softmax of [s, 0]
    assert_close(&out[0], &[1, 1, 1, 1], &[p0 + 3.0 * (1.0 - p0)], 1e-6);
    assert_close(&out[1], &[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0], 0.0);
    assert_close(&out[3], &[1, 1, 1, 2], &[s, 0.0], 1e-6);
    // softcap 0.5 then an additive mask [0, -1]; modes pick raw, capped, capped + mask, softmax.
    let mask = f32s(&[1, 2], &[0.0, -1.0]);
    let capped = 0.5 * (s / 0.5).tanh();
    let p = sigmoid(capped + 1.0);
    let want: [&[f64]; 4] = [&[s, 0.0], &[capped, 0.0], &[capped, -1.0], &[p, 1.0 - p]];
    for (mode, want) in want.into_iter().enumerate() {
        let op = Op::Attention(Attention {
            softcap: 0.5,
            qk_matmul_output_mode: mode as i64,
            ..attention()
        });
        let out = run(op, &[Some(&q), Some(&k), Some(&v), Some(&mask)], 4);
        assert_close(&out[3], &[1, 1, 1, 2], want, 1e-6);
        assert_close(&out[0], &[1, 1, 1, 1], &[p + 3.0 * (1.0 - p)], 1e-6);
    }
    // An explicit scale replaces 1/sqrt(head_size).
    let op = Op::Attention(Attention { scale: Some(2.0), ..attention() });
    let out = run(op, &[Some(&q), Some(&k), Some(&v)], 4);
    assert_close(&out[3], &[1, 1, 1, 2], &[2.0, 0.0], 1e-6);
}

#[test]
fn attention_masks_bool_causal_past_and_padding() {
    let q = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f32s(&[1, 1, 2, 1], &[1.0, 3.0]);
    // A bool mask: true attends. Row 0 sees key 1 only, row 1 key 0 only.
    let m = Tensor::from_slice(&[2, 2], &[false, true, true, false]).unwrap();
    let out = run(Op::Attention(attention()), &[Some(&q), Some(&k), Some(&v), Some(&m)], 1);
    assert_close(&out[0], &[1, 1, 2, 1], &[3.0, 1.0], 1e-6);
    // Causal: query 0 sees key 0 only.
    let causal =
        Op::Attention(Attention { is_causal: true, qk_matmul_output_mode: 2, ..attention() });
    let out = run(causal.clone(), &[Some(&q), Some(&k), Some(&v)], 4);
    assert_close(
        &out[0].reshape(&[2]).unwrap(),
        &[2],
        &[1.0, 3.0 - 2.0 * sigmoid(-(0.5f64.sqrt()))],
        1e-6,
    );
    assert_eq!(out[3].to_f64s()[1], f64::NEG_INFINITY);
    // With one past step the triangle shifts: query i sees keys 0..=1+i of [past, k0, k1].
    let past_k = f32s(&[1, 1, 1, 2], &[5.0, 5.0]);
    let past_v = f32s(&[1, 1, 1, 1], &[7.0]);
    let out = run(causal, &[Some(&q), Some(&k), Some(&v), None, Some(&past_k), Some(&past_v)], 4);
    assert_close(&out[1], &[1, 1, 3, 2], &[5.0, 5.0, 1.0, 0.0, 0.0, 1.0], 0.0);
    assert_close(&out[2], &[1, 1, 3, 1], &[7.0, 1.0, 3.0], 0.0);
    let qk = out[3].to_f64s();
    assert_eq!(
        qk.iter().map(|v| v.is_infinite()).collect::<Vec<_>>(),
        [false, false, true, false, false, false]
    );
    // A mask shorter than the keys, and nonpad_kv_seqlen, both mask out the keys past their end.
    let short = f32s(&[1, 1], &[0.0]);
    let out = run(Op::Attention(attention()), &[Some(&q), Some(&k), Some(&v), Some(&short)], 1);
    assert_close(&out[0], &[1, 1, 2, 1], &[1.0, 1.0], 1e-6);
    let nonpad = Tensor::vector(&[1i64]);
    let out = run(
        Op::Attention(attention()),
        &[Some(&q), Some(&k), Some(&v), None, None, None, Some(&nonpad)],
        1,
    );
    assert_close(&out[0], &[1, 1, 2, 1], &[1.0, 1.0], 1e-6);
}

#[test]
fn attention_grouped_query_and_3d_layout_agree_with_4d_multi_head() {
    let q = Tensor::random(F, &[2, 4, 3, 2], 1);
    let k = Tensor::random(F, &[2, 2, 5, 2], 2);
    let v = Tensor::random(F, &[2, 2, 5, 3], 3);
    let m = Tensor::random(F, &[3, 5], 4);
    let gqa = run(
        Op::Attention(Attention { is_causal: true, ..attention() }),
        &[Some(&q), Some(&k), Some(&v), Some(&m)],
        1,
    );
    // Query heads 0, 1 share KV head 0 and heads 2, 3 share KV head 1: repeat the KV heads.
    let repeat = |t: &Tensor| {
        eval::eval_op(
            &Op::Gather { axis: 1 },
            &[Some(t), Some(&Tensor::vector(&[0i64, 0, 1, 1]))],
            1,
        )
        .unwrap()
        .remove(0)
    };
    let mha = run(
        Op::Attention(Attention { is_causal: true, ..attention() }),
        &[Some(&q), Some(&repeat(&k)), Some(&repeat(&v)), Some(&m)],
        1,
    );
    assert_eq!(gqa[0], mha[0]);
    // The same in 3-D [batch, seq, heads * size]; Y comes back 3-D.
    let to3 = |t: &Tensor| {
        let d = t.dims().to_vec();
        let tr = eval::eval_op(&Op::Transpose { perm: vec![0, 2, 1, 3] }, &[Some(t)], 1)
            .unwrap()
            .remove(0);
        tr.reshape(&[d[0], d[2], d[1] * d[3]]).unwrap()
    };
    let op3 = Op::Attention(Attention {
        is_causal: true,
        q_num_heads: 4,
        kv_num_heads: 2,
        ..attention()
    });
    let out3 = run(op3, &[Some(&to3(&q)), Some(&to3(&k)), Some(&to3(&v)), Some(&m)], 3);
    assert_eq!(out3[0], to3(&gqa[0]));
    assert_eq!(out3[1].dims(), [2, 2, 5, 2], "present_key is 4-D");
    assert_eq!(out3[1], k);
}

#[test]
fn attention_shapes() {
    let att = |q, kv| Op::Attention(Attention { q_num_heads: q, kv_num_heads: kv, ..attention() });
    let t = types(
        att(8, 2),
        &[
            Some((F, "b,4,64")),
            Some((F, "b,s,16")),
            Some((F, "b,s,24")),
            None,
            Some((F, "b,2,p,8")),
            Some((F, "b,2,p,12")),
        ],
        4,
    );
    assert_eq!(
        t.unwrap(),
        [
            "f32[b,4,96]",
            r#"f32[b,2,"attention.d2",8]"#,
            r#"f32[b,2,"attention.d2",12]"#,
            r#"f32[b,8,4,"attention.d2"]"#
        ]
    );
    let t = types(
        att(0, 0),
        &[
            Some((F, "2,9,4,8")),
            Some((F, "2,3,6,8")),
            Some((F, "2,3,6,10")),
            Some((DType::Bool, "4,6")),
        ],
        4,
    );
    assert_eq!(t.unwrap(), ["f32[2,9,4,10]", "f32[2,3,6,8]", "f32[2,3,6,10]", "f32[2,9,4,6]"]);
    let e =
        types(att(0, 0), &[Some((F, "2,3,4,8")), Some((F, "2,2,6,8")), Some((F, "2,2,6,8"))], 1)
            .unwrap_err();
    assert!(
        e.contains("q heads (3) must be a multiple of kv heads (2): f32[2,3,4,8], f32[2,2,6,8]"),
        "{e}"
    );
    let e = types(att(0, 0), &[Some((F, "2,4,24")), Some((F, "2,6,24")), Some((F, "2,6,24"))], 1)
        .unwrap_err();
    assert!(e.contains("3-D Q, K and V need q_num_heads and kv_num_heads"), "{e}");
    let e = types(att(5, 5), &[Some((F, "2,4,24")), Some((F, "2,6,24")), Some((F, "2,6,24"))], 1)
        .unwrap_err();
    assert!(e.contains("Q f32[2,4,24] hidden size 24 is not a multiple of 5 heads"), "{e}");
    let e = types(
        att(0, 0),
        &[Some((F, "2,3,4,8")), Some((F, "2,3,6,8")), Some((F, "2,3,6,8")), Some((F, "3,6"))],
        1,
    )
    .unwrap_err();
    assert!(
        e.contains("attn_mask f32[3,6] does not broadcast to the attention scores f32[2,3,4,6]"),
        "{e}"
    );
    let e = types(
        att(0, 0),
        &[Some((F, "2,3,4,8")), Some((F, "2,3,6,8")), Some((F, "2,3,6,8")), Some((F, "4,7"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("attn_mask f32[4,7] does not broadcast"), "{e}");
    let e = types(
        att(0, 0),
        &[
            Some((F, "2,3,4,8")),
            Some((F, "2,3,6,8")),
            Some((F, "2,3,6,8")),
            None,
            Some((F, "2,3,1,8")),
        ],
        1,
    )
    .unwrap_err();
    assert!(e.contains("past_key and past_value must be given together"), "{e}");
    let e =
        types(att(0, 0), &[Some((F, "2,3,4,8")), Some((F, "2,3,6,7")), Some((F, "2,3,6,8"))], 1)
            .unwrap_err();
    assert!(e.contains("Q and K head sizes differ: f32[2,3,4,8] and f32[2,3,6,7]"), "{e}");
}

// ----- RotaryEmbedding -----

fn rope(interleaved: bool, num_heads: usize, rotary_embedding_dim: usize) -> Op {
    Op::RotaryEmbedding(RotaryEmbedding { interleaved, num_heads, rotary_embedding_dim })
}

#[test]
fn rotary_embedding_by_hand() {
    use std::f32::consts::FRAC_PI_2;
    let x = f32s(&[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    // Angles pi/2 and 0, cached per [batch, seq] (no position ids).
    let cos = f32s(&[1, 1, 2], &[FRAC_PI_2.cos(), 1.0]);
    let sin = f32s(&[1, 1, 2], &[1.0, 0.0]);
    // Halves pair (x0, x2) and (x1, x3); rotating (1, 3) by pi/2 gives (-3, 1).
    let y = run(rope(false, 0, 0), &[Some(&x), Some(&cos), Some(&sin)], 1);
    assert_close(&y[0], &[1, 1, 1, 4], &[-3.0, 2.0, 1.0, 4.0], 1e-6);
    // Interleaved pairs are neighbours: (1, 2) -> (-2, 1).
    let y = run(rope(true, 0, 0), &[Some(&x), Some(&cos), Some(&sin)], 1);
    assert_close(&y[0], &[1, 1, 1, 4], &[-2.0, 1.0, 3.0, 4.0], 1e-6);
    // Only the first 2 features rotate; the rest pass through.
    let (c1, s1) = (f32s(&[1, 1, 1], &[FRAC_PI_2.cos()]), f32s(&[1, 1, 1], &[1.0]));
    let y = run(rope(false, 0, 2), &[Some(&x), Some(&c1), Some(&s1)], 1);
    assert_close(&y[0], &[1, 1, 1, 4], &[-2.0, 1.0, 3.0, 4.0], 1e-6);
    // 3-D input [batch, seq, heads * size]: each of the 2 heads rotates on its own.
    let y =
        run(rope(false, 2, 0), &[Some(&x.reshape(&[1, 1, 4]).unwrap()), Some(&c1), Some(&s1)], 1);
    assert_close(&y[0], &[1, 1, 4], &[-2.0, 1.0, -4.0, 3.0], 1e-6);
    // Position ids pick cache rows: angles [0, pi/2, pi], steps at positions 2 and 1.
    let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let cos = f32s(&[3, 1], &[1.0, FRAC_PI_2.cos(), -1.0]);
    let sin = f32s(&[3, 1], &[0.0, 1.0, 0.0]);
    let pos = Tensor::from_slice(&[1, 2], &[2i64, 1]).unwrap();
    let y = run(rope(false, 0, 0), &[Some(&x), Some(&cos), Some(&sin), Some(&pos)], 1);
    assert_close(&y[0], &[1, 1, 2, 2], &[-1.0, -2.0, -4.0, 3.0], 1e-6);
    let bad = Tensor::from_slice(&[1, 2], &[3i64, 0]).unwrap();
    let e =
        run_op(rope(false, 0, 0), &[Some(&x), Some(&cos), Some(&sin), Some(&bad)], 1).unwrap_err();
    assert!(e.contains("position id 3 is outside the 3 cached positions"), "{e}");
}

#[test]
fn rotary_embedding_shapes() {
    let t = types(
        rope(false, 4, 0),
        &[Some((F, "b,s,32")), Some((F, "50,4")), Some((F, "50,4")), Some((DType::I64, "b,s"))],
        1,
    );
    assert_eq!(t.unwrap(), ["f32[b,s,32]"]);
    let e =
        types(rope(false, 0, 0), &[Some((F, "2,3,32")), Some((F, "50,4")), Some((F, "50,4"))], 1)
            .unwrap_err();
    assert!(
        e.contains("a 3-D input [batch, seq, heads*size] needs num_heads, got f32[2,3,32]"),
        "{e}"
    );
    let e = types(
        rope(false, 0, 3),
        &[Some((F, "2,4,3,8")), Some((F, "2,3,1")), Some((F, "2,3,1"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("the rotated size must be even, got 3 for f32[2,4,3,8]"), "{e}");
    let e = types(
        rope(false, 0, 0),
        &[Some((F, "2,4,3,8")), Some((F, "50,2")), Some((F, "50,2")), Some((DType::I64, "2,3"))],
        1,
    )
    .unwrap_err();
    assert!(
        e.contains(
            "cos_cache must be [?,4] (max_position, rotary_dim/2) for f32[2,4,3,8], got f32[50,2]"
        ),
        "{e}"
    );
    let e = types(
        rope(false, 0, 0),
        &[Some((F, "2,4,3,8")), Some((F, "2,4,4")), Some((F, "2,4,4"))],
        1,
    )
    .unwrap_err();
    assert!(e.contains("cos_cache must be [2,3,4]"), "{e}");
}

// ----- CausalConvWithState -----

fn causal_conv(activation: CausalActivation) -> Op {
    Op::CausalConvWithState { activation }
}

#[test]
fn causal_conv_with_state_by_hand() {
    // Two taps (1, 10): y[t] = padded[t] + 10 padded[t + 1], padded = past (or 0) then x.
    let x = f32s(&[1, 1, 3], &[1.0, 2.0, 3.0]);
    let w = f32s(&[1, 1, 2], &[1.0, 10.0]);
    let none = causal_conv(CausalActivation::None);
    let out = run(none.clone(), &[Some(&x), Some(&w)], 2);
    assert_close(&out[0], &[1, 1, 3], &[10.0, 21.0, 32.0], 1e-6);
    assert_close(&out[1], &[1, 1, 1], &[3.0], 0.0);
    let past = f32s(&[1, 1, 1], &[5.0]);
    let out = run(none.clone(), &[Some(&x), Some(&w), None, Some(&past)], 2);
    assert_close(&out[0], &[1, 1, 3], &[15.0, 21.0, 32.0], 1e-6);
    // The bias comes before SiLU (swish is its other name).
    let bias = f32s(&[1], &[-20.0]);
    let silu = |v: f64| v * sigmoid(v);
    for act in [CausalActivation::Silu, CausalActivation::Swish] {
        let out = run(causal_conv(act), &[Some(&x), Some(&w), Some(&bias), Some(&past)], 2);
        assert_close(&out[0], &[1, 1, 3], &[silu(-5.0), silu(1.0), silu(12.0)], 1e-6);
    }
    // An input shorter than the state: the state keeps past positions (or zeros) and x.
    let (x1, w3) = (f32s(&[1, 1, 1], &[4.0]), f32s(&[1, 1, 3], &[1.0, 1.0, 1.0]));
    let past2 = f32s(&[1, 1, 2], &[7.0, 8.0]);
    let out = run(none.clone(), &[Some(&x1), Some(&w3), None, Some(&past2)], 2);
    assert_close(&out[0], &[1, 1, 1], &[19.0], 1e-6);
    assert_close(&out[1], &[1, 1, 2], &[8.0, 4.0], 0.0);
    let out = run(none.clone(), &[Some(&x1), Some(&w3)], 2);
    assert_close(&out[1], &[1, 1, 2], &[0.0, 4.0], 0.0);
    // Channels convolve on their own; one tap keeps no state.
    let x2 = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w1 = f32s(&[2, 1, 1], &[2.0, -1.0]);
    let out = run(none, &[Some(&x2), Some(&w1)], 2);
    assert_close(&out[0], &[1, 2, 2], &[2.0, 4.0, -3.0, -4.0], 1e-6);
    assert_close(&out[1], &[1, 2, 0], &[], 0.0);
}

#[test]
fn causal_conv_with_state_shapes() {
    let op = causal_conv(CausalActivation::None);
    let t = types(op.clone(), &[Some((F, "b,4,l")), Some((F, "4,1,3"))], 2);
    assert_eq!(t.unwrap(), ["f32[b,4,l]", "f32[b,4,2]"]);
    let e = types(op.clone(), &[Some((F, "2,4,8")), Some((F, "3,1,3"))], 2).unwrap_err();
    assert!(
        e.contains("weight must be [4,1,?] (channels, 1, k) for f32[2,4,8], got f32[3,1,3]"),
        "{e}"
    );
    let e = types(op.clone(), &[Some((F, "2,4,8")), Some((F, "4,1,0"))], 2).unwrap_err();
    assert!(e.contains("the kernel must have at least one tap"), "{e}");
    let e =
        types(op.clone(), &[Some((F, "2,4,8")), Some((F, "4,1,3")), None, Some((F, "2,4,3"))], 2)
            .unwrap_err();
    assert!(e.contains("past_state must be [2,4,2]"), "{e}");
    let e = types(op.clone(), &[Some((F, "2,8")), Some((F, "4,1,3"))], 2).unwrap_err();
    assert!(e.contains("input must be 3-D [batch, channels, length], got f32[2,8]"), "{e}");
    let e = types(op, &[Some((DType::I32, "2,4,8")), Some((DType::I32, "4,1,3"))], 2).unwrap_err();
    assert!(e.contains("input must be a float tensor"), "{e}");
}

// ----- LinearAttention -----

fn linear(update_rule: LinearUpdate, q_num_heads: usize, kv_num_heads: usize, scale: f32) -> Op {
    Op::LinearAttention(LinearAttention {
        chunk_size: 64,
        kv_num_heads,
        q_num_heads,
        scale,
        update_rule,
    })
}

#[test]
fn linear_attention_every_update_rule_by_hand() {
    // One head of d_k = d_v = 1 over two steps (scale 1/sqrt(1)): q = (1, 2), k = (3, 4),
    // v = (5, 6), decay log(1), log(0.5), beta 0.5, 1.
    let (q, k, v) = (
        f32s(&[1, 2, 1], &[1.0, 2.0]),
        f32s(&[1, 2, 1], &[3.0, 4.0]),
        f32s(&[1, 2, 1], &[5.0, 6.0]),
    );
    let decay = f32s(&[1, 2, 1], &[0.0, 0.5f32.ln()]);
    let beta = f32s(&[1, 2, 1], &[0.5, 1.0]);
    let cases = [
        // S1 = 3*5 = 15; S2 = 15 + 4*6 = 39.
        (LinearUpdate::Linear, None, None, [15.0, 78.0], 39.0),
        // S2 = 15 * 0.5 + 24 = 31.5.
        (LinearUpdate::Gated, Some(&decay), None, [15.0, 63.0], 31.5),
        // S1 = 3 * 0.5 (5 - 0) = 7.5; S2 = 7.5 + 4 * 1 (6 - 7.5*4) = -88.5.
        (LinearUpdate::Delta, None, Some(&beta), [7.5, -177.0], -88.5),
        // S2 = 3.75 + 4 * (6 - 3.75*4) = -32.25.
        (LinearUpdate::GatedDelta, Some(&decay), Some(&beta), [7.5, -64.5], -32.25),
    ];
    for (rule, d, b, y, state) in cases {
        let out = run(linear(rule, 1, 1, 0.0), &[Some(&q), Some(&k), Some(&v), None, d, b], 2);
        assert_close(&out[0], &[1, 2, 1], &y, 1e-5);
        assert_close(&out[1], &[1, 1, 1, 1], &[state], 1e-5);
    }
    // A past state of 10 adds to the first step's; an explicit scale replaces 1/sqrt(d_k).
    let past = f32s(&[1, 1, 1, 1], &[10.0]);
    let out = run(
        linear(LinearUpdate::Linear, 1, 1, 0.5),
        &[Some(&q), Some(&k), Some(&v), Some(&past)],
        2,
    );
    assert_close(&out[0], &[1, 2, 1], &[12.5, 49.0], 1e-5);
    assert_close(&out[1], &[1, 1, 1, 1], &[49.0], 1e-5);
}

#[test]
fn linear_attention_query_heads_share_their_kv_head() {
    // Two query heads read the one KV head's state (d_k = 1, so scale 1): steps S = 15, 39.
    let q = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let (k, v) = (f32s(&[1, 2, 1], &[3.0, 4.0]), f32s(&[1, 2, 1], &[5.0, 6.0]));
    let out = run(linear(LinearUpdate::Linear, 2, 1, 0.0), &[Some(&q), Some(&k), Some(&v)], 2);
    assert_close(&out[0], &[1, 2, 2], &[15.0, 30.0, 117.0, 156.0], 1e-5);
    // Two keys features: per-feature decay scales the state's rows, a per-head decay all of
    // them. k = (1, 1), v = 1 at both steps; decay log(0.5) on feature 0 (per feature) or on
    // both (per head); q = (1, 0) reads row 0; scale 1/sqrt(2).
    let ones = f32s(&[1, 2, 2], &[1.0, 1.0, 1.0, 1.0]);
    let (v1, q0) = (f32s(&[1, 2, 1], &[1.0, 1.0]), f32s(&[1, 2, 2], &[1.0, 0.0, 1.0, 0.0]));
    let h = 0.5f32.ln();
    let per_feature = f32s(&[1, 2, 2], &[h, 0.0, h, 0.0]);
    let per_head = f32s(&[1, 2, 1], &[h, h]);
    let r = std::f64::consts::FRAC_1_SQRT_2;
    let gated = linear(LinearUpdate::Gated, 1, 1, 0.0);
    let out = run(gated.clone(), &[Some(&q0), Some(&ones), Some(&v1), None, Some(&per_feature)], 2);
    // Row 0: 1, then 0.5 + 1; row 1: 1, then 2.
    assert_close(&out[0], &[1, 2, 1], &[r, 1.5 * r], 1e-5);
    assert_close(&out[1], &[1, 1, 2, 1], &[1.5, 2.0], 1e-5);
    let out = run(gated, &[Some(&q0), Some(&ones), Some(&v1), None, Some(&per_head)], 2);
    assert_close(&out[1], &[1, 1, 2, 1], &[1.5, 1.5], 1e-5);
}

#[test]
fn linear_attention_shapes() {
    let qkv = |q: &'static str, k: &'static str, v: &'static str| {
        [Some((F, q)), Some((F, k)), Some((F, v))]
    };
    let t = types(linear(LinearUpdate::Linear, 8, 4, 0.0), &qkv("b,t,64", "b,t,32", "b,t,16"), 2);
    assert_eq!(t.unwrap(), ["f32[b,t,32]", "f32[b,4,8,4]"]);
    let e = types(linear(LinearUpdate::Linear, 3, 2, 0.0), &qkv("1,2,6", "1,2,4", "1,2,4"), 2)
        .unwrap_err();
    assert!(e.contains("q_num_heads (3) must be a positive multiple of kv_num_heads (2)"), "{e}");
    let e = types(linear(LinearUpdate::Linear, 2, 2, 0.0), &qkv("1,2,6", "1,2,4", "1,2,4"), 2)
        .unwrap_err();
    assert!(e.contains("key must be [1,2,6]"), "{e}");
    let e = types(linear(LinearUpdate::Gated, 2, 2, 0.0), &qkv("1,2,4", "1,2,4", "1,2,4"), 2)
        .unwrap_err();
    assert!(e.contains("update_rule gated needs decay"), "{e}");
    let mut ops = qkv("1,2,4", "1,2,4", "1,2,4").to_vec();
    ops.extend([None, None, Some((F, "1,2,2"))]);
    let e = types(linear(LinearUpdate::Linear, 2, 2, 0.0), &ops, 2).unwrap_err();
    assert!(e.contains("update_rule linear takes no beta"), "{e}");
    let e = types(
        linear(LinearUpdate::Delta, 2, 2, 0.0),
        &{
            let mut o = ops.clone();
            o[5] = Some((F, "1,2,3"));
            o
        },
        2,
    )
    .unwrap_err();
    assert!(e.contains("beta f32[1,2,3]: its last axis must be 2 or 1"), "{e}");
    let mut past = qkv("1,2,4", "1,2,4", "1,2,4").to_vec();
    past.push(Some((F, "1,2,2,3")));
    let e = types(linear(LinearUpdate::Linear, 2, 2, 0.0), &past, 2).unwrap_err();
    assert!(e.contains("past_state must be [1,2,2,2]"), "{e}");
}

// ----- losses -----

fn loss(reduction: LossReduction, ignore_index: Option<i64>) -> Loss {
    Loss { reduction, ignore_index }
}

#[test]
fn nll_loss_weights_reductions_and_ignore_index() {
    let x = f32s(&[2, 3], &[-1.0, -2.0, -3.0, -0.5, -1.5, -2.5]);
    let t = Tensor::vector(&[2i64, 0]);
    let w = f32s(&[3], &[1.0, 2.0, 3.0]);
    let nll = |r, ii| Op::NllLoss(loss(r, ii));
    // -w[t] * x[t]: 3 * 3 and 1 * 0.5; the mean divides by the weights used (3 + 1).
    assert_close(
        &run(nll(LossReduction::None, None), &[Some(&x), Some(&t), Some(&w)], 1)[0],
        &[2],
        &[9.0, 0.5],
        1e-6,
    );
    assert_close(
        &run(nll(LossReduction::Sum, None), &[Some(&x), Some(&t), Some(&w)], 1)[0],
        &[],
        &[9.5],
        1e-6,
    );
    assert_close(
        &run(nll(LossReduction::Mean, None), &[Some(&x), Some(&t), Some(&w)], 1)[0],
        &[],
        &[2.375],
        1e-6,
    );
    assert_close(
        &run(nll(LossReduction::Mean, None), &[Some(&x), Some(&t), None], 1)[0],
        &[],
        &[1.75],
        1e-6,
    );
    // Ignoring class 0 drops the second sample from the sum and from the divisor.
    assert_close(
        &run(nll(LossReduction::None, Some(0)), &[Some(&x), Some(&t), Some(&w)], 1)[0],
        &[2],
        &[9.0, 0.0],
        1e-6,
    );
    assert_close(
        &run(nll(LossReduction::Mean, Some(0)), &[Some(&x), Some(&t), Some(&w)], 1)[0],
        &[],
        &[3.0],
        1e-6,
    );
    assert_close(
        &run(nll(LossReduction::Mean, Some(0)), &[Some(&x), Some(&t), None], 1)[0],
        &[],
        &[3.0],
        1e-6,
    );
    // [N, C, d1]: the class axis is 1, the loss keeps [N, d1].
    let x3 = f32s(&[1, 2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    let t3 = Tensor::from_slice(&[1, 2], &[1i64, 0]).unwrap();
    assert_close(
        &run(nll(LossReduction::None, None), &[Some(&x3), Some(&t3)], 1)[0],
        &[1, 2],
        &[3.0, 2.0],
        1e-6,
    );
    let bad = Tensor::vector(&[3i64, 0]);
    let e = run_op(nll(LossReduction::Sum, None), &[Some(&x), Some(&bad)], 1).unwrap_err();
    assert!(e.contains("target 3 is not a class in 0..3"), "{e}");
    // An out-of-range target is fine when it is ignore_index.
    assert_close(
        &run(nll(LossReduction::Sum, Some(3)), &[Some(&x), Some(&bad)], 1)[0],
        &[],
        &[0.5],
        1e-6,
    );
}

#[test]
fn softmax_cross_entropy_by_hand() {
    let (l2, l3) = (2f32.ln(), 3f32.ln());
    // Softmax of [0, ln 2, ln 3] is [1/6, 2/6, 3/6].
    let x = f32s(&[2, 3], &[0.0, l2, l3, l3, l2, 0.0]);
    let t = Tensor::vector(&[2i64, 1]);
    let sce = |r, ii| Op::SoftmaxCrossEntropyLoss(loss(r, ii));
    let out = run(sce(LossReduction::None, None), &[Some(&x), Some(&t)], 2);
    let (a, b, c) = ((1f64 / 6.0).ln(), (2f64 / 6.0).ln(), (3f64 / 6.0).ln());
    assert_close(&out[0], &[2], &[-c, -b], 1e-6);
    assert_close(&out[1], &[2, 3], &[a, b, c, c, b, a], 1e-6);
    let w = f32s(&[3], &[1.0, 4.0, 2.0]);
    let out = run(sce(LossReduction::Mean, None), &[Some(&x), Some(&t), Some(&w)], 1);
    assert_close(&out[0], &[], &[(-2.0 * c - 4.0 * b) / 6.0], 1e-6);
    // Every target ignored: the weighted mean is 0/0.
    let out =
        run(sce(LossReduction::Mean, Some(7)), &[Some(&x), Some(&Tensor::vector(&[7i64, 7]))], 1);
    assert!(out[0].to_f64s()[0].is_nan());
}

#[test]
fn loss_shapes() {
    let i = DType::I64;
    let nll = |r| Op::NllLoss(loss(r, None));
    assert_eq!(
        types(nll(LossReduction::None), &[Some((F, "n,5,6,7")), Some((i, "n,6,7"))], 1).unwrap(),
        ["f32[n,6,7]"]
    );
    assert_eq!(
        types(nll(LossReduction::Mean), &[Some((F, "n,5,6,7")), Some((i, "n,6,7"))], 1).unwrap(),
        ["f32[]"]
    );
    let sce = Op::SoftmaxCrossEntropyLoss(loss(LossReduction::Sum, Some(-1)));
    assert_eq!(
        types(sce.clone(), &[Some((F, "3,5")), Some((i, "3")), Some((F, "5"))], 2).unwrap(),
        ["f32[]", "f32[3,5]"]
    );
    let e = types(sce.clone(), &[Some((F, "3,5,2")), Some((i, "3,5"))], 1).unwrap_err();
    assert!(
        e.contains("target must be [3,2] (input f32[3,5,2] without the class axis), got i64[3,5]"),
        "{e}"
    );
    let e = types(sce.clone(), &[Some((F, "3,5")), Some((i, "3")), Some((F, "3"))], 1).unwrap_err();
    assert!(e.contains("weight must be [C] = [5] for input f32[3,5], got f32[3]"), "{e}");
    let e = types(sce.clone(), &[Some((F, "3,5")), Some((F, "3"))], 1).unwrap_err();
    assert!(e.contains("target must be an integer tensor, got f32[3]"), "{e}");
    let e = types(sce, &[Some((F, "5")), Some((i, "1"))], 1).unwrap_err();
    assert!(e.contains("input must be [N, C] or [N, C, d1, ...], got f32[5]"), "{e}");
}
