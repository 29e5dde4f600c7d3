//! Ops the importer expands into other ops: FlexAttention (ai.onnx.preview) with its modifier
//! graphs inlined, TensorScatter and MaxUnpool, the ai.onnx.ml ops on numbers (Binarizer,
//! ArrayFeatureExtractor, TreeEnsemble), TfIdfVectorizer on integer tokens, and an If inlined
//! inside an inlined branch. Values against hand-computed ones; bad input is an error naming
//! the node.

use kiln_ir::onnx::proto::attr::{float, floats, graph, ints, string, strings, tensor};
use kiln_ir::onnx::proto::*;
use kiln_ir::{eval, Tensor};
use prost::Message;

use super::onnx::{f32_init, int, load, node, value};
use super::{assert_close, f32s};

/// A model of opset 26 and, when `domain` is not empty, that domain (version 5 for
/// ai.onnx.ml's TreeEnsemble, 1 otherwise); every node of `nodes` without a domain takes it.
fn model_in(
    domain: &str,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
) -> Vec<u8> {
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    let mut opset_import = vec![opset("", 26)];
    if !domain.is_empty() {
        opset_import.push(opset(domain, if domain == "ai.onnx.ml" { 5 } else { 1 }));
    }
    let nodes = nodes
        .into_iter()
        .map(|mut n| {
            if n.domain.is_none() && !domain.is_empty() {
                n.domain = Some(domain.into());
            }
            n
        })
        .collect();
    ModelProto {
        ir_version: Some(10),
        opset_import,
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            input: inputs,
            output: outputs,
            initializer,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn f32v(name: &str, dims: &[i64]) -> ValueInfoProto {
    value(name, data_type::FLOAT, dims)
}

fn i64v(name: &str, dims: &[i64]) -> ValueInfoProto {
    value(name, data_type::INT64, dims)
}

fn i64_init(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::INT64),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn i64s(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

/// A one-input one-output modifier graph `out = op(x, c)`, with `c` an initializer of its own
/// (`Some`) or a value of the enclosing graph (`None`).
fn modifier(op: &str, own: Option<f32>) -> GraphProto {
    let unsized_f32 = ValueInfoProto {
        name: Some("x".into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(data_type::FLOAT),
                shape: None,
            })),
        }),
    };
    GraphProto {
        name: Some(format!("{op}_mod")),
        node: vec![node(op, "apply", &["x", "c"], &["out"], vec![])],
        input: vec![unsized_f32],
        output: vec![ValueInfoProto { name: Some("out".into()), r#type: None }],
        initializer: own.map(|c| f32_init("c", &[], &[c])).into_iter().collect(),
        ..Default::default()
    }
}

/// Q = K = I (2x2, two query heads, one K/V head), V = [[1, 2], [3, 4]], scale 1:
/// score_mod multiplies the scores by ln 3 (softmax rows [3/4, 1/4] and [1/4, 3/4]), prob_mod by
/// the outer graph's `c` = 2.
#[test]
fn flex_attention_inlines_its_modifiers_and_shares_kv_heads() {
    let bytes = model_in(
        "ai.onnx.preview",
        vec![node(
            "FlexAttention",
            "flex",
            &["q", "k", "v"],
            &["y"],
            vec![
                float("scale", 1.0),
                graph("score_mod", modifier("Mul", Some(3f32.ln()))),
                graph("prob_mod", modifier("Mul", None)),
            ],
        )],
        vec![f32v("q", &[1, 2, 2, 2]), f32v("k", &[1, 1, 2, 2]), f32v("v", &[1, 1, 2, 2])],
        vec![f32v("y", &[1, 2, 2, 2])],
        vec![f32_init("c", &[], &[2.0])],
    );
    let m = load(&bytes).unwrap();
    assert!(m.graph.to_string().contains("flex/score_mod/"), "{}", m.graph);
    let eye = [1., 0., 0., 1.];
    let q = f32s(&[1, 2, 2, 2], &[eye, eye].concat());
    let k = f32s(&[1, 1, 2, 2], &eye);
    let v = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let y = eval::run(&m.graph, &[q, k, v]).unwrap();
    let head = [3., 5., 5., 7.];
    assert_close(&y[0], &[1, 2, 2, 2], &[head, head].concat(), 1e-5);
}

#[test]
fn flex_attention_refuses_bad_operands_naming_the_node() {
    let flex = |q: &[i64], k: &[i64]| {
        let bytes = model_in(
            "ai.onnx.preview",
            vec![node("FlexAttention", "flex", &["q", "k", "v"], &["y"], vec![])],
            vec![f32v("q", q), f32v("k", k), f32v("v", k)],
            vec![f32v("y", q)],
            vec![],
        );
        load(&bytes).unwrap_err().to_string()
    };
    let e = flex(&[2, 4, 3], &[2, 4, 3, 8]);
    assert!(e.contains("flex") && e.contains("FlexAttention") && e.contains("rank 4"), "{e}");
    let e = flex(&[1, 3, 4, 8], &[1, 2, 4, 8]);
    assert!(e.contains("flex") && e.contains("multiple"), "{e}");
}

/// past = 0..6 as [2, 3, 1]; the updates go to positions write_indices[b] + step along axis 1.
#[test]
fn tensor_scatter_writes_each_batch_entry_at_its_index() {
    let run = |mode: &str, steps: i64, update: &[f32]| {
        let bytes = model_in(
            "",
            vec![node(
                "TensorScatter",
                "ts",
                &["past", "update", "at"],
                &["present"],
                vec![string("mode", mode), int("axis", 1)],
            )],
            vec![f32v("past", &[2, 3, 1]), f32v("update", &[2, steps, 1]), i64v("at", &[2])],
            vec![f32v("present", &[2, 3, 1])],
            vec![],
        );
        let g = load(&bytes).unwrap().graph;
        let past = f32s(&[2, 3, 1], &[0., 1., 2., 3., 4., 5.]);
        let update = f32s(&[2, steps as usize, 1], update);
        eval::run(&g, &[past, update, i64s(&[2], &[2, 0])]).unwrap().remove(0)
    };
    assert_close(&run("linear", 1, &[10., 20.]), &[2, 3, 1], &[0., 1., 10., 20., 4., 5.], 0.0);
    let wrapped = run("circular", 2, &[10., 11., 20., 21.]);
    assert_close(&wrapped, &[2, 3, 1], &[11., 1., 10., 20., 21., 5.], 0.0);
}

#[test]
fn tensor_scatter_refuses_the_batch_axis_and_a_longer_update() {
    let bytes = |axis: i64, steps: i64| {
        model_in(
            "",
            vec![node(
                "TensorScatter",
                "kv_write",
                &["past", "update"],
                &["present"],
                vec![int("axis", axis)],
            )],
            vec![f32v("past", &[2, 3, 1]), f32v("update", &[2, steps, 1])],
            vec![f32v("present", &[2, 3, 1])],
            vec![],
        )
    };
    let e = load(&bytes(0, 1)).unwrap_err().to_string();
    assert!(e.contains("`kv_write` (TensorScatter)") && e.contains("axis"), "{e}");
    let e = load(&bytes(1, 4)).unwrap_err().to_string();
    assert!(e.contains("`kv_write` (TensorScatter)") && e.contains("more than"), "{e}");
}

/// ONNX's MaxUnpool example: 2x2 maxima at flat indices 5, 7, 13, 15 of a 4x4 image; with
/// output_shape 5x5 the 4x4 result is padded at the end.
#[test]
fn max_unpool_scatters_to_the_flat_indices_and_pads_to_output_shape() {
    let run = |output_shape: Option<&[i64]>| {
        let operands: &[&str] = if output_shape.is_some() { &["x", "i", "s"] } else { &["x", "i"] };
        let n = output_shape.map_or(4, |s| s[3]);
        let bytes = model_in(
            "",
            vec![node(
                "MaxUnpool",
                "unpool",
                operands,
                &["y"],
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
            )],
            vec![f32v("x", &[1, 1, 2, 2]), i64v("i", &[1, 1, 2, 2])],
            vec![f32v("y", &[1, 1, n, n])],
            output_shape.map(|s| i64_init("s", &[4], s)).into_iter().collect(),
        );
        let g = load(&bytes).unwrap().graph;
        let x = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
        eval::run(&g, &[x, i64s(&[1, 1, 2, 2], &[5, 7, 13, 15])]).unwrap().remove(0)
    };
    #[rustfmt::skip]
    let four = [0., 0., 0., 0., 0., 1., 0., 2., 0., 0., 0., 0., 0., 3., 0., 4.];
    assert_close(&run(None), &[1, 1, 4, 4], &four, 0.0);
    #[rustfmt::skip]
    let five = [
        0., 0., 0., 0., 0.,
        0., 1., 0., 2., 0.,
        0., 0., 0., 0., 0.,
        0., 3., 0., 4., 0.,
        0., 0., 0., 0., 0.,
    ];
    assert_close(&run(Some(&[1, 1, 5, 5])), &[1, 1, 5, 5], &five, 0.0);
}

#[test]
fn binarizer_and_array_feature_extractor() {
    let bytes = model_in(
        "ai.onnx.ml",
        vec![
            node("Binarizer", "bin", &["x"], &["b"], vec![float("threshold", 0.5)]),
            node("ArrayFeatureExtractor", "afe", &["m", "at"], &["z"], vec![]),
        ],
        vec![f32v("x", &[4]), f32v("m", &[2, 3]), i64v("at", &[2])],
        vec![f32v("b", &[4]), f32v("z", &[2, 2])],
        vec![],
    );
    let g = load(&bytes).unwrap().graph;
    let x = f32s(&[4], &[-1., 0.5, 1., f32::NAN]);
    let m = f32s(&[2, 3], &[0., 1., 2., 3., 4., 5.]);
    let out = eval::run(&g, &[x, m, i64s(&[2], &[2, 0])]).unwrap();
    assert_close(&out[0], &[4], &[0., 0., 1., 0.], 0.0);
    assert_close(&out[1], &[2, 2], &[2., 0., 5., 3.], 0.0);
}

fn f32_tensor(v: &[f32]) -> TensorProto {
    f32_init("t", &[v.len() as i64], v)
}

/// ONNX's single tree (its first split 3, not 3.14): x0 <= 3 ? (x0 <= 1.2 ? leaf 0 : leaf 1)
/// : (x0 <= 4.2 ? leaf 1 : leaf 3); the leaves give targets [0, 1, 0, 1] the weights
/// [5.23, 12.12, -12.23, 7.21].
fn single_tree(true_ids: &[i64], true_leafs: &[i64]) -> Vec<u8> {
    let modes = TensorProto {
        name: Some("t".into()),
        dims: vec![3],
        data_type: Some(data_type::UINT8),
        int32_data: vec![0, 0, 0],
        ..Default::default()
    };
    model_in(
        "ai.onnx.ml",
        vec![node(
            "TreeEnsemble",
            "trees",
            &["x"],
            &["y"],
            vec![
                int("aggregate_function", 1),
                ints("leaf_targetids", &[0, 1, 0, 1]),
                tensor("leaf_weights", f32_tensor(&[5.23, 12.12, -12.23, 7.21])),
                int("n_targets", 2),
                ints("nodes_falseleafs", &[0, 1, 1]),
                ints("nodes_falsenodeids", &[2, 2, 3]),
                ints("nodes_featureids", &[0, 0, 0]),
                tensor("nodes_modes", modes),
                tensor("nodes_splits", f32_tensor(&[3.0, 1.2, 4.2])),
                ints("nodes_trueleafs", true_leafs),
                ints("nodes_truenodeids", true_ids),
                int("post_transform", 0),
                ints("tree_roots", &[0]),
            ],
        )],
        vec![f32v("x", &[4, 2])],
        vec![f32v("y", &[4, 2])],
        vec![],
    )
}

#[test]
fn tree_ensemble_follows_each_sample_to_its_leaf() {
    let g = load(&single_tree(&[1, 0, 1], &[0, 1, 1])).unwrap().graph;
    let x = f32s(&[4, 2], &[1.2, 3.4, -0.12, 1.66, 4.14, 1.77, 5.0, 0.0]);
    let y = eval::run(&g, &[x]).unwrap();
    let want = [5.23, 0., 5.23, 0., 0., 12.12, 0., 7.21];
    assert_close(&y[0], &[4, 2], &want, 1e-6);
}

#[test]
fn tree_ensemble_refuses_cycles_and_dangling_ids() {
    // Node 1's true branch goes back to node 0.
    let e = load(&single_tree(&[1, 0, 1], &[0, 0, 1])).unwrap_err().to_string();
    assert!(e.contains("trees") && e.contains("cycle"), "{e}");
    let e = load(&single_tree(&[1, 9, 1], &[0, 1, 1])).unwrap_err().to_string();
    assert!(e.contains("trees") && e.contains("leaf 9"), "{e}");
}

/// An If whose condition is known inlines its branch; an If inside that branch on a value the
/// outer graph knows is inlined too, even when its branches' results differ in shape (the
/// expanded AffineGrid's f32[] and f32[1]).
#[test]
fn an_if_nested_in_an_inlined_branch_is_taken_on_outer_constants() {
    let branch = |name: &str, nodes: Vec<NodeProto>, out: &str| GraphProto {
        name: Some(name.into()),
        node: nodes,
        output: vec![ValueInfoProto { name: Some(out.into()), r#type: None }],
        ..Default::default()
    };
    let inner = node(
        "If",
        "inner",
        &["d_is_one"],
        &["step"],
        vec![
            graph(
                "then_branch",
                branch("t", vec![node("Identity", "zero", &["zero"], &["s0"], vec![])], "s0"),
            ),
            graph(
                "else_branch",
                branch("e", vec![node("Div", "div", &["two", "d"], &["s1"], vec![])], "s1"),
            ),
        ],
    );
    let outer = node(
        "If",
        "outer",
        &["yes"],
        &["y"],
        vec![
            graph("then_branch", branch("t", vec![inner], "step")),
            graph(
                "else_branch",
                branch("e", vec![node("Identity", "id", &["zero"], &["z"], vec![])], "z"),
            ),
        ],
    );
    let bytes = model_in(
        "",
        vec![node("Equal", "eq", &["d", "one"], &["d_is_one"], vec![]), outer],
        vec![],
        vec![f32v("y", &[1])],
        vec![
            TensorProto {
                data_type: Some(data_type::BOOL),
                int32_data: vec![1],
                ..i64_init("yes", &[], &[])
            },
            f32_init("d", &[1], &[4.0]),
            f32_init("one", &[1], &[1.0]),
            f32_init("two", &[], &[2.0]),
            f32_init("zero", &[], &[0.0]),
        ],
    );
    let g = load(&bytes).unwrap().graph;
    let y = eval::run(&g, &[]).unwrap();
    assert_close(&y[0], &[1], &[0.5], 0.0);
}

/// A score_mod that builds a causal mask from the scores' own sizes (Shape, Range): with a
/// symbolic sequence its result's sizes are new symbols, which are taken (only known sizes
/// must agree). Q = K = 0 makes the scores equal, so row i averages V's first i + 1 rows.
#[test]
fn flex_attention_takes_a_modifier_whose_sizes_come_from_data() {
    let i64_scalar = |name: &str, v: i64| i64_init(name, &[], &[v]);
    let score_mod = GraphProto {
        name: Some("causal".into()),
        node: vec![
            node("Shape", "shape", &["x"], &["dims"], vec![]),
            node("Gather", "l", &["dims", "two"], &["l"], vec![]),
            node("Gather", "s", &["dims", "three"], &["s"], vec![]),
            node("Range", "rows", &["zero", "l", "one"], &["rows"], vec![]),
            node("Range", "cols", &["zero", "s", "one"], &["cols"], vec![]),
            node("Reshape", "row_ids", &["rows", "row_shape"], &["row_ids"], vec![]),
            node("GreaterOrEqual", "causal", &["row_ids", "cols"], &["keep"], vec![]),
            node("Where", "mask", &["keep", "x", "neg_inf"], &["out"], vec![]),
        ],
        input: vec![f32v("x", &[1, 1, 1, 1])],
        output: vec![ValueInfoProto { name: Some("out".into()), r#type: None }],
        initializer: vec![
            i64_scalar("zero", 0),
            i64_scalar("one", 1),
            i64_scalar("two", 2),
            i64_scalar("three", 3),
            i64_init("row_shape", &[2], &[-1, 1]),
            f32_init("neg_inf", &[], &[f32::NEG_INFINITY]),
        ],
        ..Default::default()
    };
    let symbolic = |name: &str, d: i64| {
        let mut v = f32v(name, &[1, 1, 0, d]);
        if let Some(type_proto::Value::TensorType(t)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.shape.as_mut().unwrap().dim[2].value =
                Some(tensor_shape_proto::dimension::Value::DimParam("seq".into()));
        }
        v
    };
    let bytes = model_in(
        "ai.onnx.preview",
        vec![node(
            "FlexAttention",
            "flex",
            &["q", "k", "v"],
            &["y"],
            vec![graph("score_mod", score_mod)],
        )],
        vec![symbolic("q", 2), symbolic("k", 2), symbolic("v", 1)],
        vec![symbolic("y", 1)],
        vec![],
    );
    let g = load(&bytes).unwrap().graph;
    let zeros = Tensor::zeros(kiln_ir::DType::F32, &[1, 1, 3, 2]);
    let v = f32s(&[1, 1, 3, 1], &[3., 6., 9.]);
    let y = eval::run(&g, &[zeros.clone(), zeros, v]).unwrap();
    assert_close(&y[0], &[1, 1, 3, 1], &[3., 4.5, 6.], 1e-6);
}

/// A named node's message: it names the node and its op.
fn names(e: &str, node: &str, op: &str) -> bool {
    e.contains(&format!("`{node}` ({op})"))
}

/// An integer Binarizer compares as the reference does, in f64: 0 > -0.5, and nothing is
/// above NaN or a threshold beyond the type (a truncating cast made -0.5 a 0 and NaN a 0).
#[test]
fn binarizer_on_integers_compares_with_the_threshold_itself() {
    let run = |dtype: i32, threshold: f32, x: Tensor| {
        let bytes = model_in(
            "ai.onnx.ml",
            vec![node("Binarizer", "bin", &["x"], &["b"], vec![float("threshold", threshold)])],
            vec![value("x", dtype, &[3])],
            vec![value("b", dtype, &[3])],
            vec![],
        );
        let g = load(&bytes).unwrap().graph;
        eval::run(&g, &[x]).unwrap().remove(0).to_i64s()
    };
    let x64 = || i64s(&[3], &[-1, 0, 1]);
    assert_eq!(run(data_type::INT64, -0.5, x64()), [0, 1, 1]);
    assert_eq!(run(data_type::INT64, 0.5, x64()), [0, 0, 1]);
    assert_eq!(run(data_type::INT64, -1.0, x64()), [0, 1, 1]);
    assert_eq!(run(data_type::INT64, f32::NAN, x64()), [0, 0, 0]);
    let x32 = || Tensor::from_slice(&[3], &[i32::MIN, 0, i32::MAX]).unwrap();
    assert_eq!(run(data_type::INT32, -1e10, x32()), [1, 1, 1]);
    assert_eq!(run(data_type::INT32, 1e10, x32()), [0, 0, 0]);
    assert_eq!(run(data_type::INT32, f32::NAN, x32()), [0, 0, 0]);
}

/// A softmax_precision beyond i32 is an attribute error, not a truncated type code.
#[test]
fn flex_attention_refuses_a_softmax_precision_beyond_i32() {
    let bytes = model_in(
        "ai.onnx.preview",
        vec![node(
            "FlexAttention",
            "flex",
            &["q", "k", "v"],
            &["y"],
            vec![int("softmax_precision", (1 << 32) + 1)],
        )],
        vec![f32v("q", &[1, 1, 2, 2]), f32v("k", &[1, 1, 2, 2]), f32v("v", &[1, 1, 2, 2])],
        vec![f32v("y", &[1, 1, 2, 2])],
        vec![],
    );
    let e = load(&bytes).unwrap_err().to_string();
    assert!(names(&e, "flex", "FlexAttention") && e.contains("softmax_precision"), "{e}");
}

/// A sequence axis declared 2^40 long: the steps are a Range (not folded at that size), so
/// the import allocates nothing of that size.
#[test]
fn tensor_scatter_of_a_huge_declared_length_allocates_no_steps() {
    let huge = 1i64 << 40;
    let bytes = model_in(
        "",
        vec![node("TensorScatter", "kv_write", &["past", "update"], &["present"], vec![])],
        vec![f32v("past", &[1, huge, 1]), f32v("update", &[1, huge, 1])],
        vec![f32v("present", &[1, huge, 1])],
        vec![],
    );
    let g = load(&bytes).unwrap().graph;
    assert!(g.to_string().contains("kv_write/range"), "{g}");
}

fn max_unpool(x: &[i64], kernel: i64, stride: i64, output_shape: Option<&[i64]>) -> Vec<u8> {
    let operands: &[&str] = if output_shape.is_some() { &["x", "i", "s"] } else { &["x", "i"] };
    model_in(
        "",
        vec![node(
            "MaxUnpool",
            "unpool",
            operands,
            &["y"],
            vec![ints("kernel_shape", &[kernel, kernel]), ints("strides", &[stride, stride])],
        )],
        vec![f32v("x", x), i64v("i", x)],
        vec![f32v("y", &[1, 1, 4, 4])],
        output_shape.map(|s| i64_init("s", &[4], s)).into_iter().collect(),
    )
}

/// An output_shape smaller than the unpooled shape is refused (Pad would crop silently).
#[test]
fn max_unpool_refuses_an_output_shape_smaller_than_the_unpooled_one() {
    let e = load(&max_unpool(&[1, 1, 2, 2], 2, 2, Some(&[1, 1, 3, 4]))).unwrap_err().to_string();
    assert!(names(&e, "unpool", "MaxUnpool") && e.contains("smaller"), "{e}");
}

/// An empty spatial axis unpools to `(0 - 1) * stride + kernel` as the reference computes it:
/// 0 for kernel = stride (taken), negative for kernel < stride (refused).
#[test]
fn max_unpool_of_an_empty_axis() {
    let g = load(&max_unpool(&[1, 1, 0, 2], 2, 2, None)).unwrap().graph;
    let y = g.outputs()[0].1;
    assert_eq!(g.value_type(y).shape.as_fixed(), Some(vec![1, 1, 0, 4]), "{g}");
    let e = load(&max_unpool(&[1, 1, 0, 2], 1, 2, None)).unwrap_err().to_string();
    assert!(names(&e, "unpool", "MaxUnpool") && e.contains("no size"), "{e}");
}

/// A TreeEnsemble of `nodes` nodes comparing feature 0 with `<=` 0, with the given branches,
/// one target per leaf weight (all 1).
fn ensemble(
    true_ids: &[i64],
    true_leafs: &[i64],
    false_ids: &[i64],
    false_leafs: &[i64],
    leaves: usize,
    n_targets: i64,
) -> Vec<u8> {
    let n = true_ids.len();
    let modes = TensorProto {
        name: Some("t".into()),
        dims: vec![n as i64],
        data_type: Some(data_type::UINT8),
        int32_data: vec![0; n],
        ..Default::default()
    };
    model_in(
        "ai.onnx.ml",
        vec![node(
            "TreeEnsemble",
            "trees",
            &["x"],
            &["y"],
            vec![
                ints("leaf_targetids", &vec![0; leaves]),
                tensor("leaf_weights", f32_tensor(&vec![1.0; leaves])),
                int("n_targets", n_targets),
                ints("nodes_falseleafs", false_leafs),
                ints("nodes_falsenodeids", false_ids),
                ints("nodes_featureids", &vec![0; n]),
                tensor("nodes_modes", modes),
                tensor("nodes_splits", f32_tensor(&vec![0.0; n])),
                ints("nodes_trueleafs", true_leafs),
                ints("nodes_truenodeids", true_ids),
                ints("tree_roots", &[0]),
            ],
        )],
        vec![f32v("x", &[2, 1])],
        vec![f32v("y", &[2, 1])],
        vec![],
    )
}

/// A huge n_targets (or one whose table size overflows) is a typed error, not a huge table.
#[test]
fn tree_ensemble_refuses_a_huge_n_targets() {
    for n_targets in [1 << 40, i64::MAX] {
        let e = load(&ensemble(&[0], &[1], &[1], &[1], 2, n_targets)).unwrap_err().to_string();
        assert!(names(&e, "trees", "TreeEnsemble") && e.contains("targets"), "{e}");
    }
}

/// A chain of 10,000 nodes (each false branch a leaf) has only 10,001 paths but ~5e7
/// conditions on them: refused by the cap on all the paths' lengths together.
#[test]
fn tree_ensemble_refuses_a_deep_chain() {
    let n = 10_000i64;
    let true_ids: Vec<i64> = (1..=n).map(|i| if i == n { 0 } else { i }).collect();
    let mut true_leafs = vec![0; n as usize];
    true_leafs[n as usize - 1] = 1;
    let false_ids: Vec<i64> = (0..n).collect();
    let leaves = n as usize;
    let bytes = ensemble(&true_ids, &true_leafs, &false_ids, &vec![1; leaves], leaves, 1);
    let e = load(&bytes).unwrap_err().to_string();
    assert!(names(&e, "trees", "TreeEnsemble") && e.contains("conditions"), "{e}");
}

/// A cycle (0 -> 1 -> 0) padded with more unreachable nodes than the path cap is reported as
/// a cycle, found in one pass over the reachable nodes.
#[test]
fn tree_ensemble_finds_a_cycle_among_many_nodes() {
    let n = 70_000usize;
    let mut true_ids = vec![0i64; n];
    true_ids[0] = 1;
    let false_ids = vec![0i64; n];
    let mut false_leafs = vec![1i64; n];
    false_leafs[0] = 1;
    let bytes = ensemble(&true_ids, &vec![0; n], &false_ids, &false_leafs, 1, 1);
    let e = load(&bytes).unwrap_err().to_string();
    assert!(names(&e, "trees", "TreeEnsemble") && e.contains("cycle"), "{e}");
}

/// TreeEnsemble is new in ai.onnx.ml opset 5: an older opset's is an unsupported op.
#[test]
fn tree_ensemble_needs_ai_onnx_ml_opset_5() {
    let mut m = ModelProto::decode(&ensemble(&[0], &[1], &[1], &[1], 2, 1)[..]).unwrap();
    for o in &mut m.opset_import {
        if o.domain.as_deref() == Some("ai.onnx.ml") {
            o.version = Some(4);
        }
    }
    let e = load(&m.encode_to_vec()).unwrap_err().to_string();
    assert!(e.contains("TreeEnsemble") && e.contains("unsupported"), "{e}");
}

/// 20,000 member nodes and one set of 1,000 values: a member table of 2e7 entries is refused
/// (it was one row per node of the widest set's width).
#[test]
fn tree_ensemble_refuses_a_huge_member_table() {
    let n = 20_000usize;
    let modes = TensorProto {
        name: Some("t".into()),
        dims: vec![n as i64],
        data_type: Some(data_type::UINT8),
        int32_data: vec![6; n],
        ..Default::default()
    };
    let mut sets: Vec<f32> = (0..1000).map(|v| v as f32).collect();
    sets.extend(std::iter::repeat_n(f32::NAN, n));
    let true_ids: Vec<i64> = (0..n as i64).collect();
    let bytes = model_in(
        "ai.onnx.ml",
        vec![node(
            "TreeEnsemble",
            "trees",
            &["x"],
            &["y"],
            vec![
                ints("leaf_targetids", &vec![0; n]),
                tensor("leaf_weights", f32_tensor(&vec![1.0; n])),
                int("n_targets", 1),
                ints("nodes_falseleafs", &vec![1; n]),
                ints("nodes_falsenodeids", &true_ids),
                ints("nodes_featureids", &vec![0; n]),
                tensor("nodes_modes", modes),
                tensor("nodes_splits", f32_tensor(&vec![0.0; n])),
                ints("nodes_trueleafs", &vec![1; n]),
                ints("nodes_truenodeids", &true_ids),
                tensor("membership_values", f32_tensor(&sets)),
                ints("tree_roots", &[0]),
            ],
        )],
        vec![f32v("x", &[2, 1])],
        vec![f32v("y", &[2, 1])],
        vec![],
    );
    let e = load(&bytes).unwrap_err().to_string();
    assert!(names(&e, "trees", "TreeEnsemble") && e.contains("member sets"), "{e}");
}

/// The pool of the TfIdfVectorizer tests: unigrams 1, 2 and bigrams (1 2), (2 1), (1 3); the
/// output columns put the bigrams first: [(1 2), (2 1), (1 3), 2, 1].
fn tfidf(
    dtype: i32,
    dims: &[i64],
    min: i64,
    max_skip: i64,
    mode: &str,
    extra: Vec<AttributeProto>,
) -> Vec<u8> {
    let mut attrs = vec![
        int("min_gram_length", min),
        int("max_gram_length", 2),
        int("max_skip_count", max_skip),
        string("mode", mode),
        ints("ngram_counts", &[0, 2]),
        ints("ngram_indexes", &[4, 3, 0, 1, 2]),
        ints("pool_int64s", &[1, 2, 1, 2, 2, 1, 1, 3]),
    ];
    for a in extra {
        attrs.retain(|b| b.name != a.name);
        attrs.push(a);
    }
    let out: Vec<i64> = dims[..dims.len() - 1].iter().copied().chain([5]).collect();
    model_in(
        "",
        vec![node("TfIdfVectorizer", "tf", &["x"], &["y"], attrs)],
        vec![value("x", dtype, dims)],
        vec![f32v("y", &out)],
        vec![],
    )
}

/// In 1 2 1 3 2 1: unigrams 1 (3 times) and 2 (twice), counted once whatever the skips;
/// bigrams at distance 1: (1 2) once, (2 1) twice, (1 3) once; at distance 2 (skip 1): the
/// pairs (1 1), (2 3), (1 2), (3 1) add one (1 2).
#[test]
fn tfidf_vectorizer_counts_ngrams_over_skips() {
    let x = || i64s(&[6], &[1, 2, 1, 3, 2, 1]);
    let run = |min, skip| {
        let g = load(&tfidf(data_type::INT64, &[6], min, skip, "TF", vec![])).unwrap().graph;
        eval::run(&g, &[x()]).unwrap().remove(0)
    };
    assert_close(&run(1, 1), &[5], &[2., 2., 1., 2., 3.], 0.0);
    assert_close(&run(1, 0), &[5], &[1., 2., 1., 2., 3.], 0.0);
    // Only bigrams counted: the unigram columns stay 0.
    assert_close(&run(2, 1), &[5], &[2., 2., 1., 0., 0.], 0.0);
    // Skips up to the row's length: distance 3 adds (1 3), distance 4 (1 2) and (2 1),
    // distance 5 (1 1) nothing; longer ones fit no bigram (ONNX's reference agrees).
    assert_close(&run(1, 100), &[5], &[3., 3., 2., 2., 3.], 0.0);
}

/// A repeated n-gram counts for its last id only (ONNX's reference trie overwrites the id):
/// pool 1 2 1 with columns [0, 1, 2] counts 1 in column 2, never in column 0.
#[test]
fn tfidf_vectorizer_counts_a_repeated_ngram_once_at_its_last_column() {
    let attrs = vec![
        int("min_gram_length", 1),
        int("max_gram_length", 1),
        int("max_skip_count", 0),
        string("mode", "TF"),
        ints("ngram_counts", &[0]),
        ints("ngram_indexes", &[0, 1, 2]),
        ints("pool_int64s", &[1, 2, 1]),
    ];
    let bytes = model_in(
        "",
        vec![node("TfIdfVectorizer", "tf", &["x"], &["y"], attrs)],
        vec![i64v("x", &[3])],
        vec![f32v("y", &[3])],
        vec![],
    );
    let g = load(&bytes).unwrap().graph;
    let y = eval::run(&g, &[i64s(&[3], &[1, 2, 1])]).unwrap().remove(0);
    assert_close(&y, &[3], &[0., 1., 2.], 0.0);
}

/// Rows of an i32 batch are counted apart; IDF gives the weight where an n-gram occurs and
/// TFIDF the count times the weight.
#[test]
fn tfidf_vectorizer_weighs_rows_of_a_batch() {
    let weights = || vec![floats("weights", &[0.5, 2., 3., 4., 5.])];
    let x = || Tensor::from_slice(&[2, 3], &[1i32, 2, 1, 3, 3, 3]).unwrap();
    let run = |mode: &str, extra| {
        let g = load(&tfidf(data_type::INT32, &[2, 3], 1, 0, mode, extra)).unwrap().graph;
        eval::run(&g, &[x()]).unwrap().remove(0)
    };
    // Row 0 counts [(1 2), (2 1), (1 3), 2, 1] = [1, 1, 0, 1, 2]; row 1 none.
    let zeros = [0.; 5];
    let expect = |row0: [f64; 5]| [row0, zeros].concat();
    assert_close(&run("TF", vec![]), &[2, 5], &expect([1., 1., 0., 1., 2.]), 0.0);
    assert_close(&run("IDF", vec![]), &[2, 5], &expect([1., 1., 0., 1., 1.]), 0.0);
    assert_close(&run("IDF", weights()), &[2, 5], &expect([0.5, 2., 0., 4., 5.]), 0.0);
    assert_close(&run("TFIDF", weights()), &[2, 5], &expect([0.5, 2., 0., 4., 10.]), 0.0);
}

/// String pools, hostile lengths and offsets, and wrong index lists are errors naming the node.
#[test]
fn tfidf_vectorizer_refuses_strings_and_hostile_attributes() {
    let load_err = |extra: Vec<AttributeProto>| {
        let bytes = tfidf(data_type::INT64, &[6], 1, 0, "TF", extra);
        load(&bytes).unwrap_err().to_string()
    };
    let cases: Vec<(Vec<AttributeProto>, &str)> = vec![
        (vec![strings("pool_strings", &["a", "b"])], "pool_strings"),
        (vec![int("min_gram_length", 3)], "max_gram_length"),
        (vec![int("min_gram_length", 0)], "min_gram_length"),
        (vec![int("max_skip_count", -1)], "max_skip_count"),
        (vec![ints("ngram_counts", &[2, 0])], "ngram_counts"),
        (vec![ints("ngram_counts", &[0, 9])], "ngram_counts"),
        (vec![ints("ngram_indexes", &[0, 1, 2])], "ngram_indexes"),
        (vec![ints("ngram_indexes", &[0, 1, 2, 3, -1])], "ngram_indexes"),
        (vec![floats("weights", &[1.])], "weights"),
        (vec![string("mode", "BM25")], "mode"),
    ];
    for (extra, what) in cases {
        let e = load_err(extra);
        assert!(names(&e, "tf", "TfIdfVectorizer") && e.contains(what), "{what}: {e}");
    }
    // Floats are not tokens.
    let bytes = model_in(
        "",
        vec![node(
            "TfIdfVectorizer",
            "tf",
            &["x"],
            &["y"],
            vec![
                int("min_gram_length", 1),
                int("max_gram_length", 1),
                int("max_skip_count", 0),
                string("mode", "TF"),
                ints("ngram_counts", &[0]),
                ints("ngram_indexes", &[0]),
                ints("pool_int64s", &[1]),
            ],
        )],
        vec![f32v("x", &[3])],
        vec![f32v("y", &[1])],
        vec![],
    );
    let e = load(&bytes).unwrap_err().to_string();
    assert!(names(&e, "tf", "TfIdfVectorizer") && e.contains("i32 or i64"), "{e}");
}
