//! Sequences and optionals in compiled code: resolved into tensors when their lengths and
//! positions are known (positions given at run time are bound like shape-deciding inputs),
//! sequence inputs and outputs passed as their elements, and what stays refused.

use std::sync::Arc;

use kiln_compiler::{compile, driver, values, CompileError, Options, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{SequenceOp, Subgraph};
use kiln_ir::{eval, DType, Graph, Op, Shape, Tensor, TensorType, Value, ValueId};
use kiln_runtime::{Executable, LoadOptions, Target};

fn seq_op(g: &mut Graph, name: &str, op: SequenceOp, operands: &[ValueId]) -> ValueId {
    let operands: Vec<Option<ValueId>> = operands.iter().copied().map(Some).collect();
    g.add_node(name, Op::Sequence(op), &operands).unwrap().into()
}

/// `[x, y, z]` with z inserted at `pos`, read at `at`; the list itself is an output too.
fn lists() -> Graph {
    let mut g = Graph::new("lists");
    let x = g.add_input("x", TensorType::new(DType::F32, [2, 3])).unwrap();
    let y = g.add_input("y", TensorType::new(DType::F32, [2, 3])).unwrap();
    let z = g.add_input("z", TensorType::new(DType::F32, [2, 3])).unwrap();
    let pos = g.add_input("pos", TensorType::new(DType::I64, Shape::scalar())).unwrap();
    let at = g.add_input("at", TensorType::new(DType::I64, Shape::scalar())).unwrap();
    let s2 = seq_op(&mut g, "s2", SequenceOp::Construct, &[x, y]);
    let s3 = seq_op(&mut g, "s3", SequenceOp::Insert, &[s2, z, pos]);
    let picked = seq_op(&mut g, "picked", SequenceOp::At, &[s3, at]);
    let joined = seq_op(&mut g, "joined", SequenceOp::Concat { axis: 0, new_axis: false }, &[s3]);
    g.add_output("picked", picked).unwrap();
    g.add_output("joined", joined).unwrap();
    g.add_output("list", s3).unwrap();
    g
}

fn run_compiled(graph: &Graph, inputs: &[Value], target: TargetKind) -> (Vec<String>, Vec<Value>) {
    let (flat, tensors) = values::bind(graph, inputs).unwrap();
    let mut options = Options { cache: false, target, ..Options::default() };
    for (&id, t) in flat.inputs().iter().zip(&tensors) {
        options.input_values.insert(flat.node(id).name.clone(), t.clone());
        options.input_shapes.insert(flat.node(id).name.clone(), t.dims().to_vec());
    }
    let exe = Executable::load(
        compile(&flat, &options, false).unwrap().artifact,
        &LoadOptions { threads: Some(2), ..Default::default() },
    )
    .unwrap();
    let given: Vec<Tensor> = exe
        .inputs()
        .iter()
        .map(|d| {
            tensors[flat.inputs().iter().position(|&id| flat.node(id).name == d.name).unwrap()]
                .clone()
        })
        .collect();
    let names: Vec<String> = exe.outputs().iter().map(|d| d.name.clone()).collect();
    let out = exe.run(&given).unwrap();
    (names.clone(), values::regroup(graph, &names, out).unwrap())
}

#[test]
fn positions_given_at_run_time_are_bound_and_the_list_resolves_to_tensors() {
    let graph = lists();
    let xyz: Vec<Tensor> = (0..3).map(|i| Tensor::random(DType::F32, &[2, 3], i)).collect();
    for (pos, at) in [(0i64, 0i64), (-1, 2), (2, -1), (1, 1)] {
        let mut inputs: Vec<Value> = xyz.iter().cloned().map(Value::Tensor).collect();
        inputs.extend([Value::Tensor(Tensor::scalar(pos)), Value::Tensor(Tensor::scalar(at))]);
        let want = eval::run_values(&graph, &inputs).unwrap();
        let (names, got) = run_compiled(&graph, &inputs, TargetKind::Cpu);
        // The list output is its three elements.
        assert_eq!(names, ["picked", "joined", "list[0]", "list[1]", "list[2]"]);
        assert_eq!(got, want, "insert at {pos}, read at {at}");
    }
    // Without the positions' values the compiler says which inputs decide the list.
    let e = compile(&graph, &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("refused");
    assert!(matches!(e, CompileError::DynamicShapes(_)), "{e}");
    assert!(e.to_string().contains("depend on the values of `pos`, `at`"), "{e}");
}

/// `ys = SequenceMap(xs, w) { x * w + 1 }`, and `ys` joined along a new axis.
fn mapped() -> Graph {
    let b = GraphBuilder::new("body");
    let x = b.input("x", DType::F32, [4]);
    let w = b.input("w", DType::F32, [4]);
    b.output("y", x * w + b.constant("one", Tensor::scalar(1f32)));
    let body = Subgraph(Arc::new(b.build().unwrap()));
    let mut g = Graph::new("mapped");
    let xs = g
        .add_input("xs", TensorType::sequence(DType::F32, Some(Shape::fixed(&[4])), None))
        .unwrap();
    let w = g.add_input("w", TensorType::new(DType::F32, [4])).unwrap();
    let ys = seq_op(&mut g, "ys", SequenceOp::Map { body, captures: 0 }, &[xs, w]);
    let stacked = seq_op(&mut g, "stacked", SequenceOp::Concat { axis: 0, new_axis: true }, &[ys]);
    g.add_output("ys", ys).unwrap();
    g.add_output("stacked", stacked).unwrap();
    g
}

#[test]
fn a_sequence_input_is_passed_as_its_elements_and_a_sequence_map_is_inlined_per_element() {
    let graph = mapped();
    let w = Tensor::random(DType::F32, &[4], 9);
    for n in [1, 3] {
        let xs: Vec<Tensor> = (0..n).map(|i| Tensor::random(DType::F32, &[4], i as u64)).collect();
        let inputs = vec![Value::Sequence(xs), Value::Tensor(w.clone())];
        let want = eval::run_values(&graph, &inputs).unwrap();
        let (names, got) = run_compiled(&graph, &inputs, TargetKind::Cpu);
        assert_eq!(names.len(), n + 1, "{names:?}");
        assert_eq!(got.len(), 2);
        let (Value::Sequence(g), Value::Sequence(w)) = (&got[0], &want[0]) else {
            panic!("sequences, got {}", got[0])
        };
        for (a, b) in g.iter().zip(w) {
            let d =
                a.to_f64s().iter().zip(b.to_f64s()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(d < 1e-6, "{d}");
        }
        assert_eq!(got[1].as_tensor().unwrap().dims(), &[n, 4]);
    }
    // The optimised graph holds no sequence op: the body is inlined once per element.
    let (flat, tensors) = values::bind(
        &graph,
        &[Value::Sequence(vec![Tensor::random(DType::F32, &[4], 1); 2]), Value::Tensor(w)],
    )
    .unwrap();
    assert_eq!(
        flat.inputs().iter().map(|&id| flat.node(id).name.clone()).collect::<Vec<_>>(),
        ["w", "xs[0]", "xs[1]"]
    );
    assert_eq!(tensors.len(), 3);
    let trace = driver::pass_trace(&flat, &Options { cache: false, ..Options::default() }).unwrap();
    let after = trace
        .split("// after ")
        .find(|s| s.starts_with("sequences\n"))
        .expect("the sequences pass changed the graph");
    insta::assert_snapshot!("sequence_map_resolved", after);
}

#[test]
fn a_sequence_input_without_its_value_is_refused_naming_it() {
    let e = compile(&mapped(), &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("refused");
    assert!(matches!(e, CompileError::RuntimeSequence { .. }), "{e}");
    assert!(
        e.to_string().starts_with(
            "node `xs` (Input): the input is seq(f32[4]); compiled programs take tensors"
        ),
        "{e}"
    );
    // A value of the wrong kind is named too.
    let e = values::bind(
        &mapped(),
        &[Value::Tensor(Tensor::scalar(1f32)), Value::Tensor(Tensor::scalar(1f32))],
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "input `xs` is seq(f32[4]), got f32[]");
}

#[test]
fn sequences_resolve_on_opencl() {
    if !kiln_runtime::list_devices().iter().any(|d| d.target == Target::Opencl && d.usable) {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); sequences on OpenCL were not checked");
        return;
    }
    let graph = lists();
    let mut inputs: Vec<Value> =
        (0..3).map(|i| Value::Tensor(Tensor::random(DType::F32, &[2, 3], i))).collect();
    inputs.extend([Value::Tensor(Tensor::scalar(-2i64)), Value::Tensor(Tensor::scalar(1i64))]);
    let (_, got) = run_compiled(&graph, &inputs, TargetKind::Opencl);
    assert_eq!(got, eval::run_values(&graph, &inputs).unwrap());
}
