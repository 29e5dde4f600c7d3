//! The tracing API.

use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::{eval, models, DType, Dim, Shape, Tensor};

use super::{assert_close, f32s};

#[test]
fn operators_and_methods_read_like_the_model() {
    let g = GraphBuilder::new("affine");
    let x = g.input("x", DType::F32, [1, 2]);
    let w = g.constant("w", f32s(&[2, 2], &[1., 2., 3., 4.]));
    let b = g.constant("b", f32s(&[2], &[-10., 1.]));
    let y = (x.matmul(w) + b).relu() * x.scalar(2.0) - x;
    g.output("y", y);
    let graph = g.build().unwrap();
    let out = eval::run(&graph, &[f32s(&[1, 2], &[1., 1.])]).unwrap();
    // relu([4, 6] + [-10, 1]) = [0, 7]; * 2 = [0, 14]; - [1, 1] = [-1, 13]
    assert_close(&out[0], &[1, 2], &[-1., 13.], 0.0);
}

#[test]
fn nodes_get_readable_names() {
    let g = GraphBuilder::new("n");
    let x = g.input("x", DType::F32, [2]);
    let a = x.relu();
    let b = a.relu().named("second");
    g.output("y", b.neg());
    let graph = g.build().unwrap();
    let names: Vec<&str> = graph.nodes().map(|(_, n)| n.name.as_str()).collect();
    assert_eq!(names, ["x", "relu", "second", "neg"]);
}

#[test]
fn renaming_to_a_taken_name_is_an_error() {
    let g = GraphBuilder::new("n");
    let x = g.input("x", DType::F32, [2]);
    g.output("y", x.relu().named("x"));
    assert!(g.build().unwrap_err().to_string().contains("cannot rename `relu` to `x`"));
}

#[test]
fn values_from_another_builder_are_rejected() {
    let a = GraphBuilder::new("a");
    let b = GraphBuilder::new("b");
    let xa = a.input("x", DType::F32, [2]);
    let xb = b.input("x", DType::F32, [2]);
    b.output("y", xb.add(xa));
    assert_eq!(
        b.build().unwrap_err().to_string(),
        "invalid graph: a value from another graph builder was used"
    );
}

#[test]
fn symbolic_batch_flows_through_shapes() {
    let g = GraphBuilder::new("s");
    let x = g.input("x", DType::F32, vec![Dim::sym("batch"), Dim::Fixed(3), Dim::Fixed(4)]);
    let w = g.constant("w", Tensor::zeros(DType::F32, &[12, 5]));
    let y = x.reshape(&[0, -1]).matmul(w).softmax(-1);
    g.output("y", y);
    let graph = g.build().unwrap();
    assert_eq!(graph.value_type(graph.outputs()[0].1).to_string(), "f32[batch,5]");
    // Binding the symbol: a batch of 2 runs, and re-inference gives concrete shapes.
    let mut fixed = graph.clone();
    fixed
        .set_input_type(0, kiln_ir::TensorType::new(DType::F32, Shape::fixed(&[2, 3, 4])))
        .unwrap();
    assert_eq!(fixed.value_type(fixed.outputs()[0].1).to_string(), "f32[2,5]");
    assert_eq!(
        eval::run(&graph, &[Tensor::zeros(DType::F32, &[2, 3, 4])]).unwrap()[0].dims(),
        &[2, 5]
    );
}

#[test]
fn split_returns_one_handle_per_part() {
    let g = GraphBuilder::new("s");
    let x = g.input("x", DType::F32, [2, 6]);
    let parts = x.split(1, &[1, 2, 3]);
    assert_eq!(parts.len(), 3);
    g.output("y", parts[0] + parts[0]);
    g.output("z", parts[2]);
    let graph = g.build().unwrap();
    let out =
        eval::run(&graph, &[f32s(&[2, 6], &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11.])])
            .unwrap();
    assert_close(&out[0], &[2, 1], &[0., 12.], 0.0);
    assert_close(&out[1], &[2, 3], &[3., 4., 5., 9., 10., 11.], 0.0);
}

#[test]
fn the_cifar_cnn_traces_to_the_expected_shapes() {
    let graph = models::cifarnet(4, 0).unwrap();
    let shape = |name: &str| graph.node(graph.node_by_name(name).unwrap()).outputs[0].to_string();
    assert_eq!(shape("conv1"), "f32[4,6,28,28]");
    assert_eq!(shape("pool1"), "f32[4,6,14,14]");
    assert_eq!(shape("conv2"), "f32[4,16,10,10]");
    assert_eq!(shape("flatten"), "f32[4,400]");
    assert_eq!(shape("fc3"), "f32[4,10]");
    let params: usize = graph
        .nodes()
        .filter_map(|(_, n)| match &n.op {
            kiln_ir::Op::Constant(t) => Some(t.len()),
            _ => None,
        })
        .sum();
    assert_eq!(params, 62006, "the tutorial CNN's parameter count");
}

#[test]
fn the_cifar_cnn_matches_a_hand_written_forward_pass() {
    // The same model, computed directly with plain loops for one image, as an independent oracle.
    let graph = models::cifarnet(1, 3).unwrap();
    let weight = |name: &str| match &graph.node(graph.node_by_name(name).unwrap()).op {
        kiln_ir::Op::Constant(t) => t.to_f64s(),
        _ => unreachable!(),
    };
    let x = Tensor::random(DType::F32, &[1, 3, 32, 32], 9);
    let got = eval::run(&graph, &[x.clone()]).unwrap()[0].to_f64s();

    let conv = |input: &[f64], c: usize, hw: usize, w: &[f64], b: &[f64], m: usize| {
        let o = hw - 4;
        let mut out = vec![0.0; m * o * o];
        for mi in 0..m {
            for i in 0..o {
                for j in 0..o {
                    let mut acc = b[mi];
                    for ci in 0..c {
                        for ki in 0..5 {
                            for kj in 0..5 {
                                acc += input[ci * hw * hw + (i + ki) * hw + j + kj]
                                    * w[((mi * c + ci) * 5 + ki) * 5 + kj];
                            }
                        }
                    }
                    out[(mi * o + i) * o + j] = acc;
                }
            }
        }
        out
    };
    let pool_relu = |input: &[f64], c: usize, hw: usize| {
        let o = hw / 2;
        let mut out = vec![0.0; c * o * o];
        for ci in 0..c {
            for i in 0..o {
                for j in 0..o {
                    let at =
                        |a: usize, b: usize| input[ci * hw * hw + (2 * i + a) * hw + 2 * j + b];
                    out[(ci * o + i) * o + j] =
                        at(0, 0).max(at(0, 1)).max(at(1, 0)).max(at(1, 1)).max(0.0);
                }
            }
        }
        out
    };
    let fc = |input: &[f64], w: &[f64], b: &[f64], relu: bool| {
        (0..b.len())
            .map(|o| {
                let v = b[o]
                    + input
                        .iter()
                        .enumerate()
                        .map(|(i, x)| x * w[o * input.len() + i])
                        .sum::<f64>();
                if relu {
                    v.max(0.0)
                } else {
                    v
                }
            })
            .collect::<Vec<f64>>()
    };
    let h = pool_relu(
        &conv(&x.to_f64s(), 3, 32, &weight("conv1.weight"), &weight("conv1.bias"), 6),
        6,
        28,
    );
    let h = pool_relu(&conv(&h, 6, 14, &weight("conv2.weight"), &weight("conv2.bias"), 16), 16, 10);
    let h = fc(&h, &weight("fc1.weight"), &weight("fc1.bias"), true);
    let h = fc(&h, &weight("fc2.weight"), &weight("fc2.bias"), true);
    let want = fc(&h, &weight("fc3.weight"), &weight("fc3.bias"), false);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn conv_options_build_uniform_windows() {
    let g = GraphBuilder::new("c");
    let x = g.input("x", DType::F32, [1, 8, 16, 16]);
    let w = g.constant("w", Tensor::zeros(DType::F32, &[8, 1, 3, 3]));
    let y = x.conv(w, None, ConvOptions::default().stride(2).pad(1).group(8));
    assert_eq!(y.ty().unwrap().to_string(), "f32[1,8,8,8]");
}
