//! The recognition pass: normalisations written as chains of small ops become one op. Each graph
//! runs on the interpreter before and after the pass (the rewrite must not change results) and
//! compiled against the interpreter.

use kiln_compiler::passes::recognize;
use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::{eval, BinaryOp, DType, Graph, Op, Tensor};

use crate::compile::check_against_eval;

/// Runs the pass; returns the op names left in the graph (inputs and constants aside).
fn recognized(graph: &Graph, inputs: &[Tensor]) -> Vec<&'static str> {
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    let mut g = graph.clone();
    recognize::run(&mut g).expect("the pass runs");
    g.verify().expect("the rewritten graph is well-typed");
    let got = eval::run(&g, inputs).expect("the interpreter runs the rewritten graph");
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.ty(), b.ty());
        for (x, y) in a.to_f64s().iter().zip(b.to_f64s()) {
            assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "rewritten {x}, original {y}");
        }
    }
    check_against_eval(graph, inputs, 2, 1e-4);
    g.nodes().filter(|(_, n)| !matches!(n.op, Op::Input | Op::Constant(_))).map(|(_, n)| n.op.name()).collect()
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
            y = y * g.constant("gamma", Tensor::random(DType::F32, &[40], 2)) + g.constant("beta", Tensor::random(DType::F32, &[1, 40], 3));
        }
        g.output("y", y);
        let graph = g.build().unwrap();
        assert_eq!(recognized(&graph, &[Tensor::random(DType::F32, &[6, 40], 1)]), vec!["LayerNormalization"], "pow {pow}, affine {affine}");
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
        assert_eq!(recognized(&graph, &[Tensor::random(DType::F32, &[3, 5, 32], 1)]), vec!["RMSNormalization"], "reciprocal {reciprocal}");
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
    assert!(!recognized(&graph, &[Tensor::random(DType::F32, &[4, 16], 1)]).contains(&"LayerNormalization"));
}
