//! Sequences and optionals: their types as inference knows them (elements' common shape and
//! length), the interpreter on values, errors for misuse, and the text form's round trip.

use kiln_ir::op::{OptionalOp, SequenceOp};
use kiln_ir::{eval, text, BinaryOp, DType, Graph, Op, Shape, Tensor, TensorType, Value, ValueId};

fn seq_op(g: &mut Graph, name: &str, op: SequenceOp, operands: &[ValueId]) -> ValueId {
    let operands: Vec<Option<ValueId>> = operands.iter().copied().map(Some).collect();
    g.add_node(name, Op::Sequence(op), &operands).unwrap().into()
}

/// `[x, y, z]` built by inserts into an empty sequence (z at `pos`), then read back at `at`,
/// its length, and the elements stacked along a new last axis.
fn lists() -> Graph {
    let mut g = Graph::new("lists");
    let x = g.add_input("x", TensorType::new(DType::F32, [2, 3])).unwrap();
    let y = g.add_input("y", TensorType::new(DType::F32, [1, 3])).unwrap();
    let z = g.add_input("z", TensorType::new(DType::F32, [2, 3])).unwrap();
    let pos = g.add_input("pos", TensorType::new(DType::I64, Shape::scalar())).unwrap();
    let at = g.add_input("at", TensorType::new(DType::I64, Shape::scalar())).unwrap();
    let empty = seq_op(&mut g, "empty", SequenceOp::Empty { dtype: DType::F32 }, &[]);
    let s1 = seq_op(&mut g, "s1", SequenceOp::Insert, &[empty, x]);
    let s2 = seq_op(&mut g, "s2", SequenceOp::Insert, &[s1, y]);
    let s3 = seq_op(&mut g, "s3", SequenceOp::Insert, &[s2, z, pos]);
    let picked = seq_op(&mut g, "picked", SequenceOp::At, &[s3, at]);
    let len = seq_op(&mut g, "len", SequenceOp::Length, &[s3]);
    let pair = seq_op(&mut g, "pair", SequenceOp::Construct, &[x, z]);
    let stacked =
        seq_op(&mut g, "stacked", SequenceOp::Concat { axis: -1, new_axis: true }, &[pair]);
    g.add_output("picked", picked).unwrap();
    g.add_output("len", len).unwrap();
    g.add_output("stacked", stacked).unwrap();
    g.add_output("list", s3).unwrap();
    g
}

#[test]
fn sequence_types_carry_the_elements_common_shape_and_length() {
    let g = lists();
    let ty = |name: &str| {
        g.value_type(g.outputs().iter().find(|(n, _)| n == name).unwrap().1).to_string()
    };
    assert_eq!(ty("list"), "seq(f32[\"s3.d0\",3], 3)");
    assert_eq!(ty("picked"), "f32[\"s3.d0\",3]");
    assert_eq!(ty("len"), "i64[]");
    assert_eq!(ty("stacked"), "f32[2,3,2]");
    // The text form prints and parses sequence types.
    let printed = text::print(&g, text::Weights::Full);
    assert!(printed.contains("seq(f32[\"s3.d0\",3], 3)"), "{printed}");
    assert_eq!(text::print(&text::parse(&printed).unwrap(), text::Weights::Full), printed);
}

#[test]
fn the_interpreter_runs_sequences_with_positions_given_at_run_time() {
    let g = lists();
    let x = Tensor::random(DType::F32, &[2, 3], 1);
    let y = Tensor::random(DType::F32, &[1, 3], 2);
    let z = Tensor::random(DType::F32, &[2, 3], 3);
    for (pos, at, want) in [(0i64, 0i64, &z), (-1, -1, &y), (2, 1, &y), (1, -3, &x)] {
        let inputs: Vec<Value> =
            [x.clone(), y.clone(), z.clone(), Tensor::scalar(pos), Tensor::scalar(at)]
                .into_iter()
                .map(Value::Tensor)
                .collect();
        let out = eval::run_values(&g, &inputs).unwrap();
        assert_eq!(out[0], Value::Tensor(want.clone()), "insert at {pos}, read at {at}");
        assert_eq!(out[1], Value::Tensor(Tensor::scalar(3i64)));
        let Value::Sequence(items) = &out[3] else { panic!("a sequence, got {}", out[3]) };
        assert_eq!(items.len(), 3);
    }
    // A position outside the sequence names itself and the node.
    let inputs: Vec<Value> = [x, y, z, Tensor::scalar(0i64), Tensor::scalar(3i64)]
        .into_iter()
        .map(Value::Tensor)
        .collect();
    let e = eval::run_values(&g, &inputs).unwrap_err().to_string();
    assert!(e.contains("`picked`") && e.contains("position 3 is outside a sequence of 3"), "{e}");
}

#[test]
fn split_to_sequence_and_back() {
    let mut g = Graph::new("split");
    let x = g.add_input("x", TensorType::new(DType::F32, [3, 7])).unwrap();
    let three = g.add_constant("three", Tensor::scalar(3i64)).unwrap();
    let pieces =
        seq_op(&mut g, "pieces", SequenceOp::Split { axis: 1, keepdims: true }, &[x, three]);
    let back = seq_op(&mut g, "back", SequenceOp::Concat { axis: 1, new_axis: false }, &[pieces]);
    let rows = seq_op(&mut g, "rows", SequenceOp::Split { axis: 0, keepdims: false }, &[x]);
    g.add_output("pieces", pieces).unwrap();
    g.add_output("back", back).unwrap();
    g.add_output("rows", rows).unwrap();
    // 7 in pieces of 3: 3, 3 and 1, so the pieces' width is not one size.
    assert_eq!(g.value_type(pieces).to_string(), "seq(f32[3,\"pieces.d1\"], 3)");
    assert_eq!(g.value_type(rows).to_string(), "seq(f32[7], 3)");
    let t = Tensor::random(DType::F32, &[3, 7], 4);
    let out = eval::run_values(&g, &[Value::Tensor(t.clone())]).unwrap();
    let Value::Sequence(p) = &out[0] else { panic!() };
    assert_eq!(p.iter().map(|t| t.dims()[1]).collect::<Vec<_>>(), [3, 3, 1]);
    assert_eq!(out[1], Value::Tensor(t.clone()));
    let Value::Sequence(r) = &out[2] else { panic!() };
    assert_eq!(r[2], t.index_axis(0, 2).unwrap());
}

#[test]
fn optionals_hold_a_value_or_none() {
    let mut g = Graph::new("opt");
    let x = g.add_input("x", TensorType::new(DType::F32, [4])).unwrap();
    let some: ValueId = g
        .add_node(
            "some",
            Op::Optional(OptionalOp::Wrap { dtype: None, sequence: false }),
            &[Some(x)],
        )
        .unwrap()
        .into();
    let none: ValueId = g
        .add_node(
            "none",
            Op::Optional(OptionalOp::Wrap { dtype: Some(DType::F32), sequence: false }),
            &[],
        )
        .unwrap()
        .into();
    let has_some: ValueId =
        g.add_node("has_some", Op::Optional(OptionalOp::HasElement), &[Some(some)]).unwrap().into();
    let has_none: ValueId =
        g.add_node("has_none", Op::Optional(OptionalOp::HasElement), &[Some(none)]).unwrap().into();
    let got: ValueId =
        g.add_node("got", Op::Optional(OptionalOp::GetElement), &[Some(some)]).unwrap().into();
    assert_eq!(g.value_type(some).to_string(), "opt(f32[4])");
    assert_eq!(g.value_type(none).to_string(), "opt(f32)");
    assert_eq!(g.value_type(got).to_string(), "f32[4]");
    for (name, v) in [("has_some", has_some), ("has_none", has_none), ("got", got), ("none", none)]
    {
        g.add_output(name, v).unwrap();
    }
    let t = Tensor::random(DType::F32, &[4], 5);
    let out = eval::run_values(&g, &[Value::Tensor(t.clone())]).unwrap();
    assert_eq!(
        out,
        vec![
            Value::Tensor(Tensor::scalar(true)),
            Value::Tensor(Tensor::scalar(false)),
            Value::Tensor(t.clone()),
            Value::Optional(None)
        ]
    );
    // Reading an empty optional is an error naming the node.
    let mut bad = Graph::new("bad");
    let none: ValueId = bad
        .add_node(
            "none",
            Op::Optional(OptionalOp::Wrap { dtype: Some(DType::F32), sequence: false }),
            &[],
        )
        .unwrap()
        .into();
    let got: ValueId =
        bad.add_node("got", Op::Optional(OptionalOp::GetElement), &[Some(none)]).unwrap().into();
    bad.add_output("got", got).unwrap();
    let e = eval::run_values(&bad, &[]).unwrap_err().to_string();
    assert!(e.contains("`got`") && e.contains("the optional is empty"), "{e}");
    // `run` (tensors only) refuses a graph whose output is an optional.
    assert!(eval::run(&g, &[t])
        .unwrap_err()
        .to_string()
        .contains("expected a tensor, got an empty optional"));
}

#[test]
fn sequences_reach_only_the_ops_that_take_them() {
    let mut g = Graph::new("misuse");
    let x = g.add_input("x", TensorType::new(DType::F32, [2])).unwrap();
    let s = seq_op(&mut g, "s", SequenceOp::Construct, &[x]);
    let e =
        g.add_node("add", Op::Binary(BinaryOp::Add), &[Some(s), Some(x)]).unwrap_err().to_string();
    assert!(e.contains("operand 0 is seq(f32[2], 1), Add takes tensors"), "{e}");
    let i = g.add_constant("i", Tensor::scalar(1i64)).unwrap();
    let e = g
        .add_node("at", Op::Sequence(SequenceOp::At), &[Some(s), Some(i)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("position 1 is outside a sequence of 1"), "{e}");
    let mut g = Graph::new("unranked");
    let s = g.add_input("s", TensorType::sequence(DType::F32, None, None)).unwrap();
    let i = g.add_constant("i", Tensor::scalar(0i64)).unwrap();
    let e = g
        .add_node("at", Op::Sequence(SequenceOp::At), &[Some(s), Some(i)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("the elements of seq(f32) have no known rank"), "{e}");
    // An input sequence is checked for its dtype when a run passes it.
    let len: ValueId =
        g.add_node("len", Op::Sequence(SequenceOp::Length), &[Some(s)]).unwrap().into();
    g.add_output("len", len).unwrap();
    let e = eval::run_values(&g, &[Value::Sequence(vec![Tensor::scalar(1i64)])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected seq(f32), got a sequence of 1 tensors"), "{e}");
    assert_eq!(
        eval::run_values(&g, &[Value::Sequence(vec![Tensor::scalar(1f32); 4])]).unwrap(),
        vec![Value::Tensor(Tensor::scalar(4i64))]
    );
}
