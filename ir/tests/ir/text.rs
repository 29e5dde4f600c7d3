//! The text form: snapshots of printed graphs, and the print -> parse -> print round trip.

use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::op::ReduceKind;
use kiln_ir::text::{self, Weights};
use kiln_ir::{eval, models, AttrError, BinaryOp, DType, Dim, Op, Tensor, UnaryOp};
use proptest::prelude::*;

#[test]
fn cifarnet_prints_stably() {
    insta::assert_snapshot!("cifarnet", models::cifarnet(4, 0).unwrap().to_string());
}

#[test]
fn multi_results_omitted_operands_symbols_and_quoted_names() {
    let g = GraphBuilder::new("odd graph");
    let x = g.input("x", DType::F32, vec![Dim::sym("batch"), Dim::Fixed(4)]);
    let parts = x.split(1, &[2, 2]);
    let hi = g.constant("hi", Tensor::scalar(6f32));
    let clipped = g.apply(Op::Clip, &[Some(parts[0]), None, Some(hi)], 1)[0].named("clip me");
    let y = clipped + parts[1];
    g.output("sum", y);
    g.output("second half", parts[1]);
    insta::assert_snapshot!("odd_graph", g.build().unwrap().to_string());
}

#[test]
fn a_hand_written_graph_parses_and_runs() {
    let src = r#"
        // A comment, then a graph with a literal constant and a shape operand.
        graph tiny {
          input %x: f32[2,3]
          %two: f32[] = Constant [2.0]
          %shape: i64[1] = Constant [-1]
          %y: f32[2,3] = Mul(%x, %two)
          %z: f32[6] = Reshape(%y, %shape) {allowzero = 0}
          %s: f32[1] = ReduceSum(%z) {keepdims = 1}
          output %s
          output %flat = %z
        }
    "#;
    let g = text::parse(src).unwrap();
    let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
    let out = eval::run(&g, &[x]).unwrap();
    assert_eq!(out[0].to_f64s(), [42.0]);
    assert_eq!(out[1].dims(), &[6]);
    assert_eq!(g.outputs()[1].0, "flat");
    // Defaults are filled in and printed explicitly.
    assert!(g.to_string().contains("ReduceSum(%z) {keepdims = 1, noop_with_empty_axes = 0}"));
}

#[test]
fn special_float_values_round_trip() {
    let g = GraphBuilder::new("f");
    let x = g.input("x", DType::F32, [5]);
    let c =
        g.constant("c", Tensor::vector(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-5, -0.0]));
    let h = g.constant("h", Tensor::vector(&[0.1f32, 65504.0]).cast(DType::F16));
    let b = g.constant("b", Tensor::vector(&[true, false]));
    let big = g.constant("big", Tensor::vector(&[i64::MIN, u32::MAX as i64]));
    g.output("y", x + c);
    g.output("h", h);
    g.output("b", b);
    g.output("big", big);
    let graph = g.build().unwrap();
    let printed = text::print(&graph, Weights::Full);
    assert!(
        printed.contains("Constant [NaN, inf, -inf, 1e-5, -0.0]")
            || printed.contains("Constant [nan, inf, -inf, 1e-5, -0.0]"),
        "{printed}"
    );
    let back = text::parse(&printed).unwrap();
    assert_eq!(text::print(&back, Weights::Full), printed);
    for name in ["c", "h", "b", "big"] {
        let a = graph.constant_value(graph.node_by_name(name).unwrap().into()).unwrap();
        let b = back.constant_value(back.node_by_name(name).unwrap().into()).unwrap();
        assert_eq!(a, b, "constant {name} survives bit for bit");
    }
}

/// One step of a random graph: an op applied to earlier values (chosen by `pick`).
#[derive(Clone, Debug)]
enum Step {
    Unary(u8, u8),
    Binary(u8, u8, u8),
    Constant(u8, u64),
    Reduce(u8, u8, bool),
    Transpose(u8),
    Reshape(u8),
    Concat(u8),
    Softmax(u8),
    Split(u8),
    MatMulT(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Step::Unary(a, b)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c)| Step::Binary(a, b, c)),
        (any::<u8>(), any::<u64>()).prop_map(|(a, s)| Step::Constant(a, s)),
        (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, k)| Step::Reduce(a, b, k)),
        any::<u8>().prop_map(Step::Transpose),
        any::<u8>().prop_map(Step::Reshape),
        any::<u8>().prop_map(Step::Concat),
        any::<u8>().prop_map(Step::Softmax),
        any::<u8>().prop_map(Step::Split),
        any::<u8>().prop_map(Step::MatMulT),
    ]
}

const UNARY: [UnaryOp; 6] = [
    UnaryOp::Relu,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Neg,
    UnaryOp::Gelu { tanh: false },
    UnaryOp::Abs,
];
const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max];

/// Builds a graph from the steps; every step is shaped to be valid, so the graph always builds.
fn pick<'g>(values: &[Traced<'g>], i: u8) -> Traced<'g> {
    values[i as usize % values.len()]
}

fn random_graph(dims: &[usize], steps: &[Step], wide: bool) -> kiln_ir::Graph {
    let g = GraphBuilder::new("random");
    let mut values = vec![g.input("x", DType::F32, dims)];
    for s in steps {
        let v = match *s {
            Step::Unary(a, u) => pick(&values, a).unary(UNARY[u as usize % UNARY.len()]),
            Step::Binary(a, b, op) => {
                let (x, y) = (pick(&values, a), pick(&values, b));
                if x.ty() == y.ty() {
                    x.binary(BINARY[op as usize % BINARY.len()], y)
                } else {
                    x + x
                }
            }
            Step::Constant(a, seed) => {
                let x = pick(&values, a);
                let t = x.ty().unwrap();
                let n = if wide {
                    t.shape.as_fixed().unwrap()
                } else {
                    vec![*t.shape.as_fixed().unwrap().last().unwrap_or(&1)]
                };
                x * g.constant(&format!("c{seed}"), Tensor::random(DType::F32, &n, seed))
            }
            Step::Reduce(a, axis, keep) => {
                let x = pick(&values, a);
                let r = x.ty().unwrap().rank();
                if r == 0 {
                    x.relu()
                } else {
                    x.reduce(
                        ReduceKind::ALL[axis as usize % 4],
                        &[(axis as usize % r) as i64],
                        keep,
                    )
                }
            }
            Step::Transpose(a) => {
                let x = pick(&values, a);
                let r = x.ty().unwrap().rank();
                x.transpose(&(0..r).rev().collect::<Vec<_>>())
            }
            Step::Reshape(a) => pick(&values, a).reshape(&[-1]),
            Step::Concat(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 0 {
                    x.neg()
                } else {
                    g.concat(&[x, x], 0)
                }
            }
            Step::Softmax(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 0 {
                    x.exp()
                } else {
                    x.softmax(-1)
                }
            }
            Step::Split(a) => {
                let x = pick(&values, a);
                match x.ty().unwrap().shape.as_fixed().unwrap().first() {
                    Some(&n) if n >= 2 => x.split(0, &[1, n as i64 - 1])[1],
                    _ => x.sigmoid(),
                }
            }
            Step::MatMulT(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 2 {
                    x.matmul(x.transpose(&[1, 0]))
                } else {
                    x.tanh()
                }
            }
        };
        values.push(v);
    }
    g.output("out", *values.last().unwrap());
    g.output("first", values[values.len() / 2]);
    g.build().expect("random steps are shaped to be valid")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn print_parse_print_is_the_identity(
        dims in prop::collection::vec(1usize..4, 0..4),
        steps in prop::collection::vec(step(), 1..14),
        wide in any::<bool>(),
    ) {
        let graph = random_graph(&dims, &steps, wide);
        let printed = text::print(&graph, Weights::Full);
        let back = text::parse(&printed).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        prop_assert_eq!(text::print(&back, Weights::Full), printed.clone());
        prop_assert_eq!(back.to_string(), graph.to_string());
        back.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The parsed graph computes exactly what the original does.
        let x = Tensor::random(DType::F32, &dims, 5);
        let (a, b) = (eval::run(&graph, &[x.clone()]).unwrap(), eval::run(&back, &[x]).unwrap());
        prop_assert_eq!(a, b);
    }
}

/// The elementwise tables give each op's attributes one schema: every op, with its defaults and
/// with other values, comes back from its attributes as it was, and the ONNX importer knows it.
#[test]
fn elementwise_ops_round_trip_through_their_attributes() {
    let changed = |op: Op| -> Op {
        let mut a = op.attrs();
        for (_, v) in a.0.iter_mut() {
            match v {
                kiln_ir::op::Attr::Float(f) => *f += 0.25,
                kiln_ir::op::Attr::Int(i) => *i = 1 - *i,
                kiln_ir::op::Attr::Str(s) if s == "none" => *s = "tanh".into(),
                kiln_ir::op::Attr::Str(s) if s == "LEFT" => *s = "RIGHT".into(),
                _ => {}
            }
        }
        Op::from_attrs(op.name(), a).expect("its own attributes")
    };
    let ops: Vec<Op> = UnaryOp::ALL
        .iter()
        .map(|&u| Op::Unary(u))
        .chain(BinaryOp::ALL.iter().map(|&b| Op::Binary(b)))
        .collect();
    for op in ops {
        assert_eq!(Op::from_attrs(op.name(), op.attrs()).as_ref(), Ok(&op));
        let other = changed(op.clone());
        assert_eq!(Op::from_attrs(other.name(), other.attrs()).as_ref(), Ok(&other));
        assert_eq!(
            op.attrs().0.is_empty(),
            other == op,
            "{}: every attribute changes the op",
            op.name()
        );
        let onnx = !matches!(op, Op::Unary(u) if !u.is_onnx());
        assert_eq!(kiln_ir::onnx::supported_ops().contains(&op.name()), onnx, "{}", op.name());
    }
    // A required string attribute that is missing says so, not that "" is no direction.
    let e = Op::from_attrs("BitShift", kiln_ir::op::Attrs::new()).unwrap_err();
    assert_eq!(e, AttrError::Missing { name: "direction".into() });
    assert_eq!(e.to_string(), "attribute `direction` is required");
    let mut a = kiln_ir::op::Attrs::new();
    a.push("direction", kiln_ir::op::Attr::Str("UP".into()));
    let e = Op::from_attrs("BitShift", a).unwrap_err();
    assert_eq!(e.to_string(), "attribute `direction` must be LEFT or RIGHT, got `UP`");
}

/// Every op the table declares comes back from its own attributes and keeps its name: built by
/// name with ONNX's defaults (plus the attributes ONNX requires), written, and read again.
#[test]
fn every_op_round_trips_through_its_attributes() {
    use kiln_ir::op::{Attr, Attrs, OpKind, Subgraph};
    let body = |inputs: usize, outputs: usize| {
        let g = GraphBuilder::new("body");
        let xs: Vec<_> =
            (0..inputs.max(1)).map(|i| g.input(&format!("i{i}"), DType::F32, [1])).collect();
        for o in 0..outputs {
            g.output(&format!("o{o}"), xs[o % xs.len()].relu());
        }
        Attr::Graph(Subgraph(std::sync::Arc::new(g.build().unwrap())))
    };
    let required = |name: &str| -> Attrs {
        let mut a = Attrs::new();
        match name {
            "Cast" => a.push("to", Attr::Type(DType::F16)),
            "Concat" | "ConcatFromSequence" => a.push("axis", Attr::Int(1)),
            "BitShift" => a.push("direction", Attr::Str("RIGHT".into())),
            "MaxPool" | "AveragePool" | "LpPool" => a.push("kernel_shape", Attr::Ints(vec![2, 2])),
            "If" => {
                a.push("then_branch", body(0, 2));
                a.push("else_branch", body(0, 2));
            }
            "Scan" => {
                a.push("body", body(2, 2));
                a.push("num_scan_inputs", Attr::Int(1));
            }
            "Loop" | "SequenceMap" => a.push("body", body(3, 2)),
            _ => {}
        }
        a
    };
    let mut names: Vec<&str> = kiln_ir::onnx::supported_ops().to_vec();
    names.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    let mut built = 0;
    for name in names {
        // (Ops the importer rewrites into others, such as Sum or CastLike, are not in the table.)
        let Ok(op) = Op::from_attrs(name, required(name)) else { continue };
        built += 1;
        assert_eq!(op.name(), name);
        assert_eq!(Op::from_attrs(name, op.attrs()).as_ref(), Ok(&op), "{name}");
        let (min, max) = op.arity();
        assert!(min <= max, "{name}");
        assert_eq!(
            op.is_view(),
            matches!(name, "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze"),
            "{name}"
        );
        assert!(
            op.shape_operands().iter().all(|&i| i < max),
            "{name}: shape operands beyond its arity"
        );
        assert_ne!(op.kind(), OpKind::Source, "{name}");
    }
    assert!(built > 150, "only {built} ops built from their names");
    assert_eq!(
        Op::from_attrs("Constant", Attrs::new()).unwrap_err(),
        AttrError::UnknownOp("Constant".into()),
        "a constant is built from its data"
    );
    let e = Op::from_attrs("Nope", Attrs::new()).unwrap_err();
    assert_eq!(e.to_string(), "unknown op `Nope`");
    let e = Op::from_attrs("Softmax", Attrs(vec![("axes".into(), Attr::Int(1))])).unwrap_err();
    assert_eq!(e, AttrError::Unexpected { op: "Softmax".into(), name: "axes".into() });
    assert_eq!(e.to_string(), "Softmax has no attribute `axes`");
}
