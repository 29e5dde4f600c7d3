//! ONNX's training domain (`ai.onnx.preview.training`) at import: the Gradient op, differentiated
//! by kiln's own rules when the model is imported, against finite differences and closed forms;
//! and the Gradient nodes that define no derivative, which are typed errors naming the node.

use kiln_ir::grad::GradError;
pub(crate) use kiln_ir::onnx::proto::attr::string;
use kiln_ir::onnx::proto::attr::strings;
use kiln_ir::onnx::proto::*;
use kiln_ir::{eval, AttrError, DType, GradientOpError, IrError, Tensor};
use prost::Message;

use super::assert_close;
use super::onnx::{f32_init, int, load, node, value};

const TRAINING: &str = "ai.onnx.preview.training";

/// A Gradient node named `name` with `xs`, `zs` (left out when empty) and `y`.
fn gradient(
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    xs: &[&str],
    zs: &[&str],
    y: &str,
) -> NodeProto {
    let mut attrs = vec![strings("xs", xs), string("y", y)];
    if !zs.is_empty() {
        attrs.push(strings("zs", zs));
    }
    NodeProto { domain: Some(TRAINING.into()), ..node("Gradient", name, inputs, outputs, attrs) }
}

/// A model of opset 17 and the training domain's opset 1.
fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> Vec<u8> {
    model_with(nodes, inputs, outputs, vec![])
}

fn model_with(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
) -> Vec<u8> {
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![opset("", 17), opset(TRAINING, 1)],
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

/// `ReduceSum` of everything to a scalar.
fn sum(name: &str, input: &str, output: &str) -> NodeProto {
    node("ReduceSum", name, &[input], &[output], vec![int("keepdims", 0)])
}

/// y = sum(tanh(x·w + b)²): dy/dw and dy/db with x held constant (zs), in f64, against central
/// differences of the same model's y.
#[test]
fn gradient_of_a_layer_matches_finite_differences() {
    let f64_value = |name: &str, dims: &[i64]| value(name, data_type::DOUBLE, dims);
    let bytes = model(
        vec![
            node("MatMul", "mm", &["x", "w"], &["m"], vec![]),
            node("Add", "add", &["m", "b"], &["p"], vec![]),
            node("Tanh", "tanh", &["p"], &["t"], vec![]),
            node("Mul", "sq", &["t", "t"], &["tt"], vec![]),
            sum("sum", "tt", "y"),
            gradient("grad", &["w", "b", "x"], &["dw", "db"], &["w", "b"], &["x"], "y"),
        ],
        vec![f64_value("x", &[2, 3]), f64_value("w", &[3, 4]), f64_value("b", &[4])],
        vec![f64_value("y", &[]), f64_value("dw", &[3, 4]), f64_value("db", &[4])],
    );
    let graph = load(&bytes).unwrap().graph;
    let inputs: Vec<Tensor> = [vec![2, 3], vec![3, 4], vec![4]]
        .iter()
        .zip(10..)
        .map(|(dims, seed)| Tensor::random(DType::F64, dims, seed))
        .collect();
    let out = eval::run(&graph, &inputs).unwrap();
    let y_at = |inputs: &[Tensor]| eval::run(&graph, inputs).unwrap()[0].to_f64s()[0];
    let eps = 1e-6;
    for (which, grad) in [(1, &out[1]), (2, &out[2])] {
        assert_eq!(grad.dims(), inputs[which].dims());
        let base = inputs[which].to_f64s();
        for (i, got) in grad.to_f64s().into_iter().enumerate() {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                let mut moved = inputs.clone();
                moved[which] = Tensor::from_f64s(DType::F64, inputs[which].dims(), &v).unwrap();
                y_at(&moved)
            };
            let want = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "input {which} element {i}: {got} against {want}"
            );
        }
    }
}

/// The inputs are the values the derivative is taken at: y = sum((a·b)²) with h = a·b, so
/// dy/dh = 2h, dy/da = 2ab² (b a constant, in zs), and with the inputs put in the names'
/// places (h := h1; a := h1 and b := a) the same formulas at those values. The Gradient nodes
/// come before the nodes of y: their attributes order the import, not the list.
#[test]
fn gradient_is_taken_at_its_inputs_and_by_xs_only() {
    let f = |name: &str| value(name, data_type::FLOAT, &[3]);
    let bytes = model(
        vec![
            gradient("at_h1", &["h1"], &["dh"], &["h"], &[], "y"),
            gradient("by_a", &["a", "b"], &["da"], &["a"], &["b"], "y"),
            gradient("swapped", &["h1", "a"], &["da_swapped"], &["a"], &["b"], "y"),
            node("Mul", "h", &["a", "b"], &["h"], vec![]),
            node("Mul", "hh", &["h", "h"], &["hh"], vec![]),
            sum("y", "hh", "y"),
        ],
        vec![f("a"), f("b"), f("h1")],
        vec![value("y", data_type::FLOAT, &[]), f("dh"), f("da"), f("da_swapped")],
    );
    let graph = load(&bytes).unwrap().graph;
    let (a, b, h1) = ([1.0, -2.0, 0.5], [3.0, 0.25, -1.0], [2.0, 4.0, -3.0]);
    let t = |v: &[f64; 3]| Tensor::from_f64s(DType::F32, &[3], v).unwrap();
    let out = eval::run(&graph, &[t(&a), t(&b), t(&h1)]).unwrap();
    let y: f64 = (0..3).map(|i| (a[i] * b[i]).powi(2)).sum();
    assert_close(&out[0], &[], &[y], 1e-4);
    assert_close(&out[1], &[3], &h1.map(|h| 2.0 * h), 1e-5);
    let da: Vec<f64> = (0..3).map(|i| 2.0 * a[i] * b[i] * b[i]).collect();
    assert_close(&out[2], &[3], &da, 1e-5);
    let swapped: Vec<f64> = (0..3).map(|i| 2.0 * h1[i] * a[i] * a[i]).collect();
    assert_close(&out[3], &[3], &swapped, 1e-5);
}

/// A Gradient's output is a value like any other, so a second Gradient differentiates it (the
/// spec's higher-order example): d(a³)/da = 3a², and its derivative 6a.
#[test]
fn gradient_of_a_gradient_is_the_second_derivative() {
    let s = |name: &str| value(name, data_type::FLOAT, &[]);
    let bytes = model(
        vec![
            node("Mul", "sq", &["a", "a"], &["sq"], vec![]),
            node("Mul", "cube", &["sq", "a"], &["cube"], vec![]),
            gradient("first", &["a"], &["d1"], &["a"], &[], "cube"),
            gradient("second", &["a"], &["d2"], &["a"], &[], "d1"),
        ],
        vec![s("a")],
        vec![s("d1"), s("d2")],
    );
    let graph = load(&bytes).unwrap().graph;
    let out = eval::run(&graph, &[Tensor::scalar(1.5f32)]).unwrap();
    assert_close(&out[0], &[], &[3.0 * 1.5 * 1.5], 1e-5);
    assert_close(&out[1], &[], &[6.0 * 1.5], 1e-5);
}

/// An x that is an initializer, read through ops of constants only (Transpose, Mul by a
/// constant), which the importer would otherwise fold into new constants, cutting y off from
/// it: y = sum(x · (2w)ᵀ), so dy/dw[j][k] = 2 Σ_i x[i][k].
#[test]
fn gradient_by_an_initializer_read_through_constant_ops() {
    let bytes = model_with(
        vec![
            node("Mul", "w2", &["w", "two"], &["w2"], vec![]),
            node("Transpose", "wt", &["w2"], &["wt"], vec![]),
            node("MatMul", "m", &["x", "wt"], &["m"], vec![]),
            sum("y", "m", "y"),
            gradient("g", &["w"], &["dw"], &["w"], &[], "y"),
        ],
        vec![value("x", data_type::FLOAT, &[4, 3])],
        vec![value("y", data_type::FLOAT, &[]), value("dw", data_type::FLOAT, &[2, 3])],
        vec![f32_init("w", &[2, 3], &[1., 2., 3., 4., 5., 6.]), f32_init("two", &[], &[2.])],
    );
    let graph = load(&bytes).unwrap().graph;
    let x = Tensor::random(DType::F32, &[4, 3], 3);
    let out = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
    let xs = x.to_f64s();
    let col = |k: usize| 2.0 * (0..4).map(|i| xs[i * 3 + k]).sum::<f64>();
    let want: Vec<f64> = (0..2).flat_map(|_| (0..3).map(col)).collect();
    assert_close(&out[1], &[2, 3], &want, 1e-5);
}

/// A flatten as PyTorch exports it, `Reshape(x, Concat(Shape(x)[0], -1))`: the Shape of a
/// Gradient's x folds (it reads x's type, not its values), so the Reshape keeps fixed sizes and
/// the backward graph broadcasts against them (it was "needs fixed sizes" on a symbolic axis).
#[test]
fn gradient_through_a_reshape_to_the_shape_of_x() {
    let i64_init = |name: &str, v: &[i64]| TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(data_type::INT64),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let w: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) / 8.0).collect();
    let bytes = model_with(
        vec![
            node("Shape", "shape", &["x"], &["shape"], vec![]),
            node("Gather", "batch", &["shape", "zero"], &["batch"], vec![int("axis", 0)]),
            node("Concat", "dims", &["batch", "rest"], &["dims"], vec![int("axis", 0)]),
            node("Reshape", "flat", &["x", "dims"], &["flat"], vec![]),
            node("MatMul", "m", &["flat", "w"], &["m"], vec![]),
            sum("y", "m", "y"),
            gradient("g", &["x", "w"], &["dx", "dw"], &["x", "w"], &[], "y"),
        ],
        vec![value("x", data_type::FLOAT, &[2, 3, 4])],
        vec![
            value("y", data_type::FLOAT, &[]),
            value("dx", data_type::FLOAT, &[2, 3, 4]),
            value("dw", data_type::FLOAT, &[12, 2]),
        ],
        vec![f32_init("w", &[12, 2], &w), i64_init("zero", &[0]), i64_init("rest", &[-1])],
    );
    let graph = load(&bytes).unwrap().graph;
    let x = Tensor::random(DType::F32, &[2, 3, 4], 5);
    let out = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
    // y = sum_b sum_j sum_k flat[b, j] w[j, k]: dy/dx[b, j] = sum_k w[j, k], dy/dw[j, k] = sum_b x[b, j].
    let dx: Vec<f64> =
        (0..2).flat_map(|_| (0..12).map(|j| (w[2 * j] + w[2 * j + 1]) as f64)).collect();
    let xs = x.to_f64s();
    let dw: Vec<f64> = (0..12).flat_map(|j| [xs[j] + xs[12 + j]; 2]).collect();
    assert_close(&out[1], &[2, 3, 4], &dx, 1e-6);
    assert_close(&out[2], &[12, 2], &dw, 1e-6);
}

/// Gradient nodes that define no derivative kiln can build are typed errors naming the node,
/// never panics.
#[test]
fn bad_gradient_nodes_are_errors_naming_the_node() {
    let f = |name: &str| value(name, data_type::FLOAT, &[3]);
    // c = a + b, d = sum(c·a); e = sum(sin(a)); n = prod(a) (no rules for Sin and ReduceProd)
    let import = |grad: NodeProto| {
        let bytes = model(
            vec![
                node("Add", "c", &["a", "b"], &["c"], vec![]),
                node("Mul", "ca", &["c", "a"], &["ca"], vec![]),
                sum("d", "ca", "d"),
                node("Sin", "sin", &["a"], &["sin"], vec![]),
                sum("e", "sin", "e"),
                node("ReduceProd", "n", &["a"], &["n"], vec![int("keepdims", 0)]),
                grad,
            ],
            vec![f("a"), f("b"), value("i", data_type::INT64, &[3])],
            vec![f("out")],
        );
        load(&bytes).unwrap_err()
    };
    let leaf = |e: &IrError| match e {
        IrError::Gradient { node, error } => {
            assert_eq!(node, "g", "{e}");
            (**error).clone()
        }
        other => panic!("not a Gradient error: {other:?}"),
    };

    // Attributes: xs and y are required.
    let mut no_y = gradient("g", &["a"], &["out"], &["a"], &[], "d");
    no_y.attribute.retain(|a| a.name.as_deref() != Some("y"));
    let e = import(no_y);
    assert_eq!(e, IrError::attr("g", "Gradient", AttrError::Missing { name: "y".into() }));
    assert_eq!(e.to_string(), "node `g` (Gradient): attribute `y` is required");
    let mut no_xs = gradient("g", &["a"], &["out"], &["a"], &[], "d");
    no_xs.attribute.retain(|a| a.name.as_deref() != Some("xs"));
    let e = import(no_xs);
    assert_eq!(e, IrError::attr("g", "Gradient", AttrError::Missing { name: "xs".into() }));
    let e = import(gradient("g", &[], &["out"], &[], &[], "d"));
    assert!(matches!(&e, IrError::Attr { node, .. } if node == "g"), "{e:?}");

    // Names.
    let e = import(gradient("g", &["a"], &["out"], &["a"], &[], "nowhere"));
    assert_eq!(leaf(&e), GradientOpError::UnknownName { attr: "y", name: "nowhere".into() });
    assert_eq!(
        e.to_string(),
        "node `g` (Gradient): attribute `y` names `nowhere`, which no node, initializer or input defines"
    );
    let e = import(gradient("g", &["a", "b"], &["out"], &["a"], &["zz"], "d"));
    assert!(matches!(leaf(&e), GradientOpError::UnknownName { attr: "zs", .. }), "{e}");
    let e = import(gradient("g", &["a", "a"], &["out"], &["a"], &["a"], "d"));
    assert_eq!(leaf(&e), GradientOpError::Repeated { name: "a".into() });
    let e = import(gradient("g", &["a", "c"], &["out"], &["a", "c"], &[], "d"));
    assert_eq!(leaf(&e), GradientOpError::NotIndependent { attr: "xs", name: "c".into() });

    // y must depend on every x, and be a float of one element.
    let e = import(gradient("g", &["a", "b"], &["out"], &["a", "b"], &[], "e"));
    assert_eq!(leaf(&e), GradientOpError::NotReachable { x: "b".into(), y: "e".into() });
    assert_eq!(e.to_string(), "node `g` (Gradient): y `e` does not depend on `b` of xs");
    let e = import(gradient("g", &["a"], &["out"], &["a"], &[], "c"));
    assert!(matches!(leaf(&e), GradientOpError::NotScalar { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "node `g` (Gradient): y `c` must be a float tensor of one element, got f32[3]"
    );

    // Inputs: one per name of xs and zs, each of its name's element type; outputs one per x.
    let e = import(gradient("g", &["a"], &["out"], &["a"], &["b"], "d"));
    assert_eq!(leaf(&e), GradientOpError::InputCount { want: 2, got: 1 });
    let e = import(gradient("g", &["i"], &["out"], &["a"], &[], "d"));
    assert!(matches!(leaf(&e), GradientOpError::InputType { index: 0, .. }), "{e}");
    assert_eq!(e.to_string(), "node `g` (Gradient): input 0 stands for `a` (f32[3]), got i64[3]");
    let e = import(gradient("g", &["a", "b"], &["out", "x"], &["a"], &["b"], "d"));
    assert_eq!(leaf(&e), GradientOpError::OutputCount { xs: 1, got: 2 });

    // An op without a gradient rule on the way from an x to y: the backward graph's own error.
    for (y, node, op) in [("e", "sin", "Sin"), ("n", "n", "ReduceProd")] {
        let e = import(gradient("g", &["a"], &["out"], &["a"], &[], y));
        let GradientOpError::Backward { error, .. } = leaf(&e) else { panic!("{e:?}") };
        assert_eq!(error, GradError::NoRule { node: node.into(), op }, "{e}");
        assert_eq!(
            e.to_string(),
            format!("node `g` (Gradient): differentiating `{y}`: node `{node}` ({op}): no gradient rule for {op}")
        );
    }
}
