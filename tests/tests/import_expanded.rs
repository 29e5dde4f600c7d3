//! Ops the ONNX importer expands into other ops (FlexAttention with its modifier graphs,
//! TensorScatter, MaxUnpool, TreeEnsemble, TfIdfVectorizer): each model compiled for the CPU against the
//! interpreter, on inputs that reach the expansions' corners (grouped heads and a mask, a write
//! wrapping around the cache, every comparison mode, NaN features).

use kiln_ir::onnx::proto::attr::{floats, graph, int, ints, string, tensor};
use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::{DType, Graph, Tensor};
use prost::Message;

use crate::compile::check_against_eval;

fn value(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d)) })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

fn node(op: &str, domain: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec!["y".into()],
        name: Some(op.to_lowercase()),
        op_type: Some(op.into()),
        domain: Some(domain.into()),
        attribute: attrs,
    }
}

fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::FLOAT),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// The graph of a one-node model of opset 26 (and `domain`, version 5 for ai.onnx.ml).
fn import(n: NodeProto, inputs: Vec<ValueInfoProto>, output: ValueInfoProto) -> Graph {
    let domain = n.domain.clone().unwrap_or_default();
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    let mut opset_import = vec![opset("", 26)];
    if !domain.is_empty() {
        opset_import.push(opset(&domain, if domain == "ai.onnx.ml" { 5 } else { 1 }));
    }
    let bytes = ModelProto {
        ir_version: Some(10),
        opset_import,
        graph: Some(GraphProto {
            node: vec![n],
            name: Some("g".into()),
            input: inputs,
            output: vec![output],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    kiln_ir::onnx::load_bytes(&bytes, None).expect("the model imports").graph
}

/// Grouped-query FlexAttention (4 query heads on 2 K/V heads) with a score_mod that masks the
/// future (`Where(causal, scores, -inf)`, the mask an initializer of the modifier).
#[test]
fn flex_attention_with_a_causal_score_mod_compiles_as_interpreted() {
    let (l, s) = (3usize, 3usize);
    let mask: Vec<i32> = (0..l * s).map(|i| i32::from(i % s <= i / s)).collect();
    let causal = TensorProto {
        name: Some("causal".into()),
        dims: vec![1, 1, l as i64, s as i64],
        data_type: Some(data_type::BOOL),
        int32_data: mask,
        ..Default::default()
    };
    let score_mod = GraphProto {
        name: Some("causal_mod".into()),
        node: vec![NodeProto {
            input: vec!["causal".into(), "scores".into(), "neg_inf".into()],
            output: vec!["out".into()],
            op_type: Some("Where".into()),
            ..Default::default()
        }],
        input: vec![value("scores", data_type::FLOAT, &[1, 4, 3, 3])],
        output: vec![value("out", data_type::FLOAT, &[1, 4, 3, 3])],
        initializer: vec![causal, f32_tensor("neg_inf", &[], &[f32::NEG_INFINITY])],
        ..Default::default()
    };
    let graph_attr = graph("score_mod", score_mod);
    let g = import(
        node("FlexAttention", "ai.onnx.preview", &["q", "k", "v"], vec![graph_attr]),
        vec![
            value("q", data_type::FLOAT, &[1, 4, 3, 8]),
            value("k", data_type::FLOAT, &[1, 2, 3, 8]),
            value("v", data_type::FLOAT, &[1, 2, 3, 5]),
        ],
        value("y", data_type::FLOAT, &[1, 4, 3, 5]),
    );
    let inputs = [
        Tensor::random(DType::F32, &[1, 4, 3, 8], 1),
        Tensor::random(DType::F32, &[1, 2, 3, 8], 2),
        Tensor::random(DType::F32, &[1, 2, 3, 5], 3),
    ];
    check_against_eval(&g, &inputs, 2, 1e-5);
}

/// A circular write of 3 steps into a 4-long cache at positions 2 and 3: both wrap around.
#[test]
fn tensor_scatter_wrapping_around_compiles_as_interpreted() {
    let g = import(
        node("TensorScatter", "", &["past", "update", "at"], vec![string("mode", "circular")]),
        vec![
            value("past", data_type::FLOAT, &[2, 2, 4, 3]),
            value("update", data_type::FLOAT, &[2, 2, 3, 3]),
            value("at", data_type::INT64, &[2]),
        ],
        value("y", data_type::FLOAT, &[2, 2, 4, 3]),
    );
    let inputs = [
        Tensor::random(DType::F32, &[2, 2, 4, 3], 4),
        Tensor::random(DType::F32, &[2, 2, 3, 3], 5),
        Tensor::from_slice(&[2], &[2i64, 3]).unwrap(),
    ];
    check_against_eval(&g, &inputs, 2, 0.0);
}

/// 3x3 kernels of stride 2 with padding, two channels: each maximum back at its flat index.
#[test]
fn max_unpool_compiles_as_interpreted() {
    let g = import(
        node(
            "MaxUnpool",
            "",
            &["x", "i"],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
            ],
        ),
        vec![
            value("x", data_type::FLOAT, &[1, 2, 2, 2]),
            value("i", data_type::INT64, &[1, 2, 2, 2]),
        ],
        value("y", data_type::FLOAT, &[1, 2, 3, 3]),
    );
    let indices: Vec<i64> = vec![0, 2, 6, 8, 9 + 1, 9 + 5, 9 + 3, 9 + 7];
    let inputs = [
        Tensor::random(DType::F32, &[1, 2, 2, 2], 6),
        Tensor::from_slice(&[1, 2, 2, 2], &indices).unwrap(),
    ];
    check_against_eval(&g, &inputs, 2, 0.0);
}

/// Two trees over two features using every mode but <= (<, >=, >, ==, !=, set membership),
/// NaN going the true way at one node, into three targets, by each aggregate function: the
/// interpreter gives the values ONNX's reference evaluator gives (onnx 1.23.2's
/// `ReferenceEvaluator`, computed once; a min or max of a target no leaf reached is f32's
/// largest or lowest), and the compiled model the interpreter's.
#[test]
fn tree_ensemble_of_every_mode_matches_the_reference() {
    let (big, low) = (f32::MAX, f32::MIN);
    #[rustfmt::skip]
    let reference: [(i64, [f32; 18]); 4] = [
        (0, [0.5, 0., 3., 4., 0., 0., 0., 2.5, 1.5, 2., 4., 0., 0., 2.5, 1.5, 3.5, 1., 0.]),
        (1, [1., 0., 6., 8., 0., 0., 0., 5., 3., 4., 8., 0., 0., 5., 3., 7., 2., 0.]),
        (2, [1., big, 6., 1., big, big, big, 5., 3., 4., 8., big, big, 5., 3., 7., 2., big]),
        (3, [1., low, 6., 7., low, low, low, 5., 3., 4., 8., low, low, 5., 3., 7., 2., low]),
    ];
    for (aggregate, want) in reference {
        tree_ensemble_of_every_mode(aggregate, &want);
    }
}

fn tree_ensemble_of_every_mode(aggregate: i64, want: &[f32]) {
    // Tree 0 (root 0): x0 < 0 ? (x1 >= 0.5 ? leaf 0 : leaf 1) : (x1 in {0.25, 1} ? leaf 2 : leaf 3).
    // Tree 1 (root 3): x1 > 0 ? (x0 == 1 ? leaf 4 : leaf 5) : (x0 != 2 ? leaf 6 : leaf 7).
    let modes = TensorProto {
        name: Some("modes".into()),
        dims: vec![6],
        data_type: Some(data_type::UINT8),
        int32_data: vec![1, 2, 6, 3, 4, 5],
        ..Default::default()
    };
    let g = import(
        node(
            "TreeEnsemble",
            "ai.onnx.ml",
            &["x"],
            vec![
                int("aggregate_function", aggregate),
                int("n_targets", 3),
                ints("tree_roots", &[0, 3]),
                ints("nodes_featureids", &[0, 1, 1, 1, 0, 0]),
                tensor("nodes_modes", modes),
                tensor("nodes_splits", f32_tensor("splits", &[6], &[0., 0.5, 0., 0., 1., 2.])),
                ints("nodes_truenodeids", &[1, 0, 2, 4, 4, 6]),
                ints("nodes_trueleafs", &[0, 1, 1, 0, 1, 1]),
                ints("nodes_falsenodeids", &[2, 1, 3, 5, 5, 7]),
                ints("nodes_falseleafs", &[0, 1, 1, 0, 1, 1]),
                ints("nodes_missing_value_tracks_true", &[0, 1, 0, 0, 0, 0]),
                tensor("membership_values", f32_tensor("sets", &[3], &[0.25, 1., f32::NAN])),
                ints("leaf_targetids", &[0, 1, 2, 0, 1, 2, 0, 1]),
                tensor("leaf_weights", f32_tensor("w", &[8], &[1., 2., 3., 4., 5., 6., 7., 8.])),
            ],
        ),
        vec![value("x", data_type::FLOAT, &[6, 2])],
        value("y", data_type::FLOAT, &[6, 3]),
    );
    #[rustfmt::skip]
    let x = [
        -1.0, 0.75,
        -1.0, f32::NAN,
        1.0, 0.25,
        2.0, -1.0,
        1.0, 1.0,
        -3.0, 0.0,
    ];
    let x = Tensor::from_slice(&[6, 2], &x).unwrap();
    let y = kiln_ir::eval::run(&g, std::slice::from_ref(&x)).unwrap().remove(0);
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    assert_eq!(y.to_f64s(), want, "aggregate_function {aggregate}");
    check_against_eval(&g, &[x], 2, 1e-6);
}

/// TfIdfVectorizer (TFIDF with weights) over uni-, bi- and trigrams with skips up to 2, on an
/// i32 batch of tokens drawn from 0..4 so the n-grams recur: the compiled counts and weights
/// are the interpreter's.
#[test]
fn tfidf_vectorizer_compiles_as_interpreted() {
    let g = import(
        node(
            "TfIdfVectorizer",
            "",
            &["x"],
            vec![
                int("min_gram_length", 1),
                int("max_gram_length", 3),
                int("max_skip_count", 2),
                string("mode", "TFIDF"),
                ints("ngram_counts", &[0, 3, 9]),
                // Unigrams 0 1 2; bigrams (0 1) (1 0) (2 3); trigrams (0 1 0) (3 3 3).
                ints("pool_int64s", &[0, 1, 2, 0, 1, 1, 0, 2, 3, 0, 1, 0, 3, 3, 3]),
                ints("ngram_indexes", &[0, 1, 2, 3, 4, 5, 6, 3]),
                floats("weights", &[0.5, 1., 2., 0.25, 3., 1.5, 4.]),
            ],
        ),
        vec![value("x", data_type::INT32, &[3, 10])],
        value("y", data_type::FLOAT, &[3, 7]),
    );
    let tokens: Vec<i32> = (0..30u32).map(|i| ((i * 7 + i / 3) % 4) as i32).collect();
    let inputs = [Tensor::from_slice(&[3, 10], &tokens).unwrap()];
    check_against_eval(&g, &inputs, 2, 0.0);
}
