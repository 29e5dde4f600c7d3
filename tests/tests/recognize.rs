//! The passes that turn what exporters write into what kiln runs fast: normalisations and
//! attention written as chains of small ops become one op, a zero Pad becomes a Conv's padding.
//! Each graph runs on the interpreter before and after the pass (the rewrite must not change
//! results) and compiled against the interpreter.

use kiln_compiler::backend::cpu::passes::attention;
use kiln_compiler::passes::{absorb_pad, recognize, simplify};
use kiln_ir::builder::{ConvOptions, GraphBuilder, Traced};
use kiln_ir::{eval, BinaryOp, DType, Graph, Op, Tensor};

use crate::compile::check_against_eval;

/// Runs the pass; returns the op names left in the graph (inputs and constants aside).
fn recognized(graph: &Graph, inputs: &[Tensor]) -> Vec<&'static str> {
    recognized_by(recognize::run, graph, inputs)
}

/// Runs `pass`, checks the rewritten graph against the original on the interpreter and the
/// compiled graph against the interpreter; returns the op names left in the rewritten graph.
fn recognized_by(
    pass: fn(&mut Graph) -> kiln_compiler::Result<bool>,
    graph: &Graph,
    inputs: &[Tensor],
) -> Vec<&'static str> {
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    let mut g = graph.clone();
    pass(&mut g).expect("the pass runs");
    g.verify().expect("the rewritten graph is well-typed");
    let got = eval::run(&g, inputs).expect("the interpreter runs the rewritten graph");
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.ty(), b.ty());
        for (x, y) in a.to_f64s().iter().zip(b.to_f64s()) {
            assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "rewritten {x}, original {y}");
        }
    }
    check_against_eval(graph, inputs, 2, 1e-4);
    g.nodes()
        .filter(|(_, n)| !matches!(n.op, Op::Input | Op::Constant(_)))
        .map(|(_, n)| n.op.name())
        .collect()
}

/// `(x - mean) / sqrt(var + eps)`, the square as Pow or as a product.
fn layer_norm<'g>(x: Traced<'g>, pow: bool) -> Traced<'g> {
    let d = x - x.reduce_mean(&[-1], true);
    let sq = if pow { d.binary(BinaryOp::Pow, d.scalar(2.0)) } else { d * d };
    let var = sq.reduce_mean(&[-1], true);
    d / (var + var.scalar(1e-5)).sqrt()
}

#[test]
fn layer_norm_as_exporters_write_it_is_one_op() {
    for (pow, affine) in [(true, true), (false, true), (true, false)] {
        let g = GraphBuilder::new("ln");
        let x = g.input("x", DType::F32, [6, 40]);
        let mut y = layer_norm(x, pow);
        if affine {
            y = y * g.constant("gamma", Tensor::random(DType::F32, &[40], 2))
                + g.constant("beta", Tensor::random(DType::F32, &[1, 40], 3));
        }
        g.output("y", y);
        let graph = g.build().unwrap();
        assert_eq!(
            recognized(&graph, &[Tensor::random(DType::F32, &[6, 40], 1)]),
            vec!["LayerNormalization"],
            "pow {pow}, affine {affine}"
        );
    }
}

#[test]
fn rms_norm_by_division_and_by_reciprocal_is_one_op() {
    for reciprocal in [false, true] {
        let g = GraphBuilder::new("rms");
        let x = g.input("x", DType::F32, [3, 5, 32]);
        let ms = (x * x).reduce_mean(&[-1], true);
        let rms = (ms + ms.scalar(1e-6)).sqrt();
        let n = if reciprocal { x * rms.reciprocal() } else { x / rms };
        g.output("y", n * g.constant("w", Tensor::random(DType::F32, &[32], 4)));
        let graph = g.build().unwrap();
        assert_eq!(
            recognized(&graph, &[Tensor::random(DType::F32, &[3, 5, 32], 1)]),
            vec!["RMSNormalization"],
            "reciprocal {reciprocal}"
        );
    }
}

#[test]
fn a_pattern_whose_parts_are_used_elsewhere_is_left() {
    // The centred value is also an output: replacing the chain would lose it.
    let g = GraphBuilder::new("ln");
    let x = g.input("x", DType::F32, [4, 16]);
    let d = x - x.reduce_mean(&[-1], true);
    let var = d.binary(BinaryOp::Pow, d.scalar(2.0)).reduce_mean(&[-1], true);
    g.output("y", d / (var + var.scalar(1e-5)).sqrt());
    g.output("centred", d);
    let graph = g.build().unwrap();
    let ops = recognized(&graph, &[Tensor::random(DType::F32, &[4, 16], 1)]);
    assert!(!ops.contains(&"LayerNormalization"), "{ops:?}");
    // A mean over a leading axis is not a layer norm over trailing ones.
    let g = GraphBuilder::new("ln0");
    let x = g.input("x", DType::F32, [4, 16]);
    let d = x - x.reduce_mean(&[0], true);
    let var = (d * d).reduce_mean(&[0], true);
    g.output("y", d / (var + var.scalar(1e-5)).sqrt());
    let graph = g.build().unwrap();
    assert!(!recognized(&graph, &[Tensor::random(DType::F32, &[4, 16], 1)])
        .contains(&"LayerNormalization"));
}

#[test]
fn softmax_and_log_softmax_as_exporters_write_them_are_one_op() {
    // The stable form over the last axis, the unstable form by a reciprocal over a middle axis
    // (its input also read elsewhere), LogSoftmax.
    let g = GraphBuilder::new("softmax");
    let x = g.input("x", DType::F32, [4, 33, 70]);
    let e = (x - x.reduce_max(&[-1], true)).exp();
    g.output("y", e / e.reduce_sum(&[-1], true));
    let graph = g.build().unwrap();
    assert_eq!(recognized(&graph, &[Tensor::random(DType::F32, &[4, 33, 70], 1)]), vec!["Softmax"]);

    let g = GraphBuilder::new("unstable");
    let x = g.input("x", DType::F32, [4, 33, 7]);
    let e = x.exp();
    g.output("y", e * e.reduce_sum(&[1], true).reciprocal());
    g.output("r", x.relu());
    let graph = g.build().unwrap();
    let mut ops = recognized(&graph, &[Tensor::random(DType::F32, &[4, 33, 7], 2)]);
    ops.sort();
    assert_eq!(ops, vec!["Relu", "Softmax"]);

    let g = GraphBuilder::new("log_softmax");
    let x = g.input("x", DType::F32, [16, 1000]);
    let d = x - x.reduce_max(&[1], true);
    g.output("y", d - d.exp().reduce_sum(&[1], true).log());
    let graph = g.build().unwrap();
    assert_eq!(
        recognized(&graph, &[Tensor::random(DType::F32, &[16, 1000], 3)]),
        vec!["LogSoftmax"]
    );

    // A sum over another axis than the max, or an exponential also an output, is left.
    let g = GraphBuilder::new("mismatch");
    let x = g.input("x", DType::F32, [8, 16]);
    let e = (x - x.reduce_max(&[1], true)).exp();
    g.output("y", e / e.reduce_sum(&[0], true));
    let graph = g.build().unwrap();
    assert!(!recognized(&graph, &[Tensor::random(DType::F32, &[8, 16], 4)]).contains(&"Softmax"));
    let g = GraphBuilder::new("shared");
    let x = g.input("x", DType::F32, [8, 16]);
    let e = (x - x.reduce_max(&[1], true)).exp();
    g.output("y", e / e.reduce_sum(&[1], true));
    g.output("e", e);
    let graph = g.build().unwrap();
    assert!(!recognized(&graph, &[Tensor::random(DType::F32, &[8, 16], 5)]).contains(&"Softmax"));
}

/// Heads of a [b, s, h * d] tensor as [b, h, s, d] (or [b, h, d, s] for keys), as exporters
/// write them: a Reshape and a Transpose.
fn heads<'g>(x: Traced<'g>, b: i64, s: i64, h: i64, d: i64, keys: bool) -> Traced<'g> {
    x.reshape(&[b, s, h, d]).transpose(if keys { &[0, 2, 3, 1] } else { &[0, 2, 1, 3] })
}

#[test]
fn attention_on_heads_of_a_projection_is_one_op_reading_them_in_place() {
    // GPT-style: Q, K, V split from one projection, heads moved out and back; 37 queries and
    // keys (neither a whole number of 4-row steps nor of 32-key vectors), a causal mask of
    // -inf, 2 images of 4 heads (enough work to split in chunks).
    let (b, s, h, d) = (2usize, 37usize, 4usize, 16usize);
    let g = GraphBuilder::new("gpt");
    let qkv = g.input("qkv", DType::F32, [b, s, 3 * h * d]);
    let parts = qkv.split(-1, &[(h * d) as i64; 3]);
    let (bi, si, hi, di) = (b as i64, s as i64, h as i64, d as i64);
    let (q, k, v) = (
        heads(parts[0], bi, si, hi, di, false),
        heads(parts[1], bi, si, hi, di, true),
        heads(parts[2], bi, si, hi, di, false),
    );
    let causal: Vec<f32> =
        (0..s * s).map(|i| if i % s > i / s { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = g.constant("mask", Tensor::from_slice(&[s, s], &causal).unwrap());
    let scores = q.matmul(k) / q.scalar((d as f64).sqrt()) + mask;
    let y = scores.softmax(-1).matmul(v).transpose(&[0, 2, 1, 3]).reshape(&[bi, si, hi * di]);
    g.output("y", y);
    let graph = g.build().unwrap();
    let ops =
        recognized_by(attention::run, &graph, &[Tensor::random(DType::F32, &[b, s, 3 * h * d], 1)]);
    assert_eq!(
        ops,
        vec!["Split", "Attention"],
        "the head transposes, both MatMuls and the Softmax go"
    );
    // The constant causal mask became the causal flag; the kernel reads the heads in place.
    let o = kiln_compiler::Options { cache: false, ..Default::default() };
    insta::assert_snapshot!(
        "attention_schedule",
        kiln_compiler::compile(&graph, &o, true).expect("compiles").stages
            [kiln_compiler::Stage::Schedule]
    );
}

#[test]
fn attention_on_four_dimensional_heads_with_a_broadcast_mask_is_one_op() {
    // BERT-style padding mask [b, 1, 1, keys] as an input, the scale as a Mul, V's head size
    // (40) not a whole number of vectors; and the same without a mask.
    for masked in [true, false] {
        let g = GraphBuilder::new("bert");
        let q = g.input("q", DType::F32, [1, 2, 20, 24]);
        let k = g.input("k", DType::F32, [1, 2, 20, 24]);
        let v = g.input("v", DType::F32, [1, 2, 20, 40]);
        let mut scores = q.matmul(k.transpose(&[0, 1, 3, 2])) * q.scalar(0.2);
        let mut inputs = vec![
            Tensor::random(DType::F32, &[1, 2, 20, 24], 1),
            Tensor::random(DType::F32, &[1, 2, 20, 24], 2),
            Tensor::random(DType::F32, &[1, 2, 20, 40], 3),
        ];
        if masked {
            scores = scores + g.input("mask", DType::F32, [1, 1, 1, 20]);
            let pad: Vec<f32> = (0..20).map(|j| if j >= 15 { -10000.0 } else { 0.0 }).collect();
            inputs.push(Tensor::from_slice(&[1, 1, 1, 20], &pad).unwrap());
        }
        g.output("y", scores.softmax(-1).matmul(v));
        let graph = g.build().unwrap();
        // K = Transpose(K^T) cancels K^T's own transpose once simplified: the kernel reads K.
        let then_simplify = |g: &mut Graph| -> kiln_compiler::Result<bool> {
            Ok(attention::run(g)? | simplify::run(g)?)
        };
        assert_eq!(
            recognized_by(then_simplify, &graph, &inputs),
            vec!["Attention"],
            "masked {masked}"
        );
    }
}

#[test]
fn attention_whose_probabilities_are_also_an_output_is_left() {
    let g = GraphBuilder::new("probs");
    let q = g.input("q", DType::F32, [1, 2, 8, 16]);
    let kt = g.input("kt", DType::F32, [1, 2, 16, 8]);
    let v = g.input("v", DType::F32, [1, 2, 8, 16]);
    let p = q.matmul(kt).softmax(-1);
    g.output("y", p.matmul(v));
    g.output("p", p);
    let graph = g.build().unwrap();
    let inputs = [
        Tensor::random(DType::F32, &[1, 2, 8, 16], 1),
        Tensor::random(DType::F32, &[1, 2, 16, 8], 2),
        Tensor::random(DType::F32, &[1, 2, 8, 16], 3),
    ];
    assert!(!recognized_by(attention::run, &graph, &inputs).contains(&"Attention"));
}

/// `x` padded by `pads` ([begins..., ends...] over all axes) with `mode` and `value`, then a
/// 3x3 convolution of 8 groups of `per_group` channels with `o`.
fn padded_conv(
    pads: &[i64],
    mode: kiln_ir::op::PadMode,
    value: Option<f64>,
    per_group: usize,
    o: ConvOptions,
) -> (Graph, Vec<Tensor>) {
    let g = GraphBuilder::new("pad_conv");
    let x = g.input("x", DType::F32, [2, 8, 15, 15]);
    let p = g.constant("pads", Tensor::vector(pads));
    let v = value.map(|v| g.constant("value", Tensor::scalar(v as f32)));
    let padded = g.apply(Op::Pad { mode }, &[Some(x), Some(p), v], 1)[0];
    let w = g.constant("w", Tensor::random(DType::F32, &[8, per_group, 3, 3], 2));
    g.output(
        "y",
        padded.conv(
            w,
            Some(g.constant("b", Tensor::random(DType::F32, &[8], 3))),
            o.group(8 / per_group),
        ),
    );
    (g.build().unwrap(), vec![Tensor::random(DType::F32, &[2, 8, 15, 15], 1)])
}

#[test]
fn a_zero_pad_before_a_conv_becomes_its_padding() {
    use kiln_ir::op::PadMode;
    // tf2onnx's SAME padding before a stride-2 convolution (the odd pad at the end), onto a
    // convolution that pads too, and a depthwise one; the zero given explicitly or not.
    for (pads, value, per_group, o) in [
        (vec![0, 0, 0, 0, 0, 0, 1, 1], None, 8, ConvOptions::default().stride(2)),
        (vec![0, 0, 1, 0, 0, 0, 2, 3], Some(0.0), 8, ConvOptions::default().pad(1)),
        (vec![0, 0, 0, 1, 0, 0, 1, 0], None, 1, ConvOptions::default().stride(2)),
    ] {
        let (graph, inputs) = padded_conv(&pads, PadMode::Constant, value, per_group, o);
        assert_eq!(recognized_by(absorb_pad::run, &graph, &inputs), vec!["Conv"], "pads {pads:?}");
    }
    // Not a zero constant pad of the spatial axes: it stays.
    for (pads, mode, value) in [
        (vec![0, 0, 1, 1, 0, 0, 1, 1], PadMode::Constant, Some(1.0)),
        (vec![0, 0, 1, 1, 0, 0, 1, 1], PadMode::Reflect, None),
        (vec![0, 1, 0, 0, 0, 0, 0, 0], PadMode::Constant, None),
        (vec![0, 0, -1, 0, 0, 0, 0, 0], PadMode::Constant, None),
    ] {
        let (graph, inputs) = if pads[1] == 1 {
            // (A channel pad changes the conv's input channels: 9 of them, one group.)
            let g = GraphBuilder::new("pad_c");
            let x = g.input("x", DType::F32, [1, 8, 6, 6]);
            let padded = g.apply(
                Op::Pad { mode },
                &[Some(x), Some(g.constant("pads", Tensor::vector(&pads)))],
                1,
            )[0];
            g.output(
                "y",
                padded.conv(
                    g.constant("w", Tensor::random(DType::F32, &[4, 9, 3, 3], 2)),
                    None,
                    ConvOptions::default(),
                ),
            );
            (g.build().unwrap(), vec![Tensor::random(DType::F32, &[1, 8, 6, 6], 1)])
        } else {
            padded_conv(&pads, mode, value, 8, ConvOptions::default())
        };
        assert_eq!(
            recognized_by(absorb_pad::run, &graph, &inputs),
            vec!["Pad", "Conv"],
            "pads {pads:?}, {mode:?}, value {value:?}"
        );
    }
}
