//! Bad graphs and bad inputs get errors that name the node, the op and the shapes; never panics.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, text, DType, Graph, IrError, Op, Tensor, TensorType, ValueId};

use super::{f32s, traced_type};

#[test]
fn broadcast_mismatch_names_node_op_and_both_shapes() {
    let err = traced_type(&[(DType::F32, &[2, 3]), (DType::F32, &[4])], |_, x| x[0].add(x[1]))
        .unwrap_err();
    assert_eq!(err, "node `add` (Add): cannot broadcast f32[2,3] with f32[4]");
}

#[test]
fn element_type_mismatch_is_an_error() {
    let err =
        traced_type(&[(DType::F32, &[2]), (DType::I64, &[2])], |_, x| x[0].mul(x[1])).unwrap_err();
    assert_eq!(
        err,
        "node `mul` (Mul): both operands must have the same element type, got f32[2] and i64[2]"
    );
}

#[test]
fn matmul_and_conv_mismatches_show_both_shapes() {
    let f = DType::F32;
    let err = traced_type(&[(f, &[2, 3]), (f, &[4, 2])], |_, x| x[0].matmul(x[1])).unwrap_err();
    assert_eq!(err, "node `matmul` (MatMul): inner dimensions differ: f32[2,3] times f32[4,2]");
    let err = traced_type(&[(f, &[1, 3, 8, 8]), (f, &[4, 2, 3, 3])], |_, x| {
        x[0].conv(x[1], None, Default::default())
    })
    .unwrap_err();
    assert_eq!(
        err,
        "node `conv` (Conv): input has 3 channels but weight f32[4,2,3,3] with group 1 expects 2"
    );
}

#[test]
fn reshape_to_the_wrong_count_is_an_error() {
    let err = traced_type(&[(DType::F32, &[2, 3])], |_, x| x[0].reshape(&[4, 2])).unwrap_err();
    assert_eq!(
        err,
        "node `reshape` (Reshape): cannot reshape f32[2,3] (6 elements) to [4, 2] (8 elements)"
    );
    let err = traced_type(&[(DType::F32, &[2, 3])], |_, x| x[0].reshape(&[-1, -1])).unwrap_err();
    assert!(err.contains("more than one -1"), "{err}");
}

#[test]
fn later_ops_on_a_failed_value_keep_the_first_error() {
    let err = traced_type(&[(DType::F32, &[2, 3]), (DType::F32, &[3, 3])], |_, x| {
        x[0].transpose(&[0, 0]).matmul(x[1]).relu()
    })
    .unwrap_err();
    assert!(
        err.starts_with("node `transpose` (Transpose): perm [0, 0] is not a permutation"),
        "{err}"
    );
}

#[test]
fn wrong_operand_counts_are_rejected() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, [2])).unwrap();
    let e = g.add_node("add", Op::Binary(kiln_ir::BinaryOp::Add), &[Some(x)]).unwrap_err();
    assert_eq!(e.to_string(), "node `add` (Add): takes 2 operands, got 1 (of 1 slots)");
    let e = g.add_node("relu", Op::Unary(kiln_ir::UnaryOp::Relu), &[None]).unwrap_err();
    assert!(e.to_string().contains("takes 1 operands, got 0"), "{e}");
}

#[test]
fn duplicate_names_and_dangling_values_are_rejected() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, [2])).unwrap();
    assert_eq!(
        g.add_constant("x", Tensor::scalar(1f32)).unwrap_err(),
        IrError::Graph("two nodes are named `x`".into())
    );
    let bad = ValueId::new(x.node, 3);
    let e = g.add_node("relu", Op::Unary(kiln_ir::UnaryOp::Relu), &[Some(bad)]).unwrap_err();
    assert!(e.to_string().contains("node `x` has 1 results, result 3 used"), "{e}");
    let r = g.add_node("r", Op::Unary(kiln_ir::UnaryOp::Relu), &[Some(x)]).unwrap();
    assert!(g.remove_node(x.node).unwrap_err().to_string().contains("still used"));
    assert!(g.add_output("y", ValueId::new(r, 1)).is_err());
}

#[test]
fn a_cycle_is_found_by_the_verifier() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, [2])).unwrap();
    let a = g.add_node("a", Op::Unary(kiln_ir::UnaryOp::Relu), &[Some(x)]).unwrap();
    let b = g.add_node("b", Op::Unary(kiln_ir::UnaryOp::Neg), &[Some(a.into())]).unwrap();
    // Rewire a to read b instead of x: a -> b -> a.
    g.replace_uses(x, b.into()).unwrap();
    let e = g.verify().unwrap_err();
    assert!(
        matches!(e, IrError::Graph(ref m) if m.starts_with("the graph has a cycle through node")),
        "{e}"
    );
    assert!(eval::run(&g, &[f32s(&[2], &[1., 2.])]).is_err());
}

#[test]
fn eval_checks_inputs_by_name_type_and_symbol() {
    let b = GraphBuilder::new("g");
    let x = b.input("x", DType::F32, vec![kiln_ir::Dim::sym("batch"), kiln_ir::Dim::Fixed(3)]);
    let y = b.input("y", DType::F32, vec![kiln_ir::Dim::sym("batch"), kiln_ir::Dim::Fixed(3)]);
    b.output("z", x.add(y));
    let g = b.build().unwrap();
    let t = |n: usize| Tensor::zeros(DType::F32, &[n, 3]);
    assert_eq!(eval::run(&g, &[t(2), t(2)]).unwrap()[0].dims(), &[2, 3]);
    let e = eval::run(&g, &[t(2)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "input `g`: the graph takes 2 inputs (x: f32[batch,3], y: f32[batch,3]), 1 given"
    );
    let e = eval::run(&g, &[t(2), t(5)]).unwrap_err();
    assert_eq!(e.to_string(), "input `y`: `batch` is 2 in an earlier input but 5 here (f32[5,3])");
    let e = eval::run(&g, &[t(2), Tensor::zeros(DType::F32, &[2, 4])]).unwrap_err();
    assert_eq!(e.to_string(), "input `y`: expected f32[batch,3], got f32[2,4]");
    let e = eval::run(&g, &[t(2), Tensor::zeros(DType::I32, &[2, 3])]).unwrap_err();
    assert_eq!(e.to_string(), "input `y`: expected f32[batch,3], got i32[2,3]");
}

#[test]
fn eval_errors_name_the_node() {
    let b = GraphBuilder::new("g");
    let x = b.input("x", DType::F32, [3]);
    let i = b.input("i", DType::I64, [1]);
    b.output("y", x.gather(i, 0).named("lookup"));
    let g = b.build().unwrap();
    let e = eval::run(&g, &[f32s(&[3], &[1., 2., 3.]), Tensor::vector(&[7i64])]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "evaluating node `lookup` (Gather): index 7 is out of range for axis 0 of size 3"
    );
}

#[test]
fn parse_errors_give_line_and_column() {
    let e = text::parse("graph g {\n  input %x: f32[2]\n  %y: f32[2] = Frobnicate(%x)\n}\n")
        .unwrap_err();
    assert_eq!(e.to_string(), "line 3, column 16: unknown op `Frobnicate`");
    let e = text::parse("graph g {\n  %y: f32[2] = Relu(%x)\n}").unwrap_err();
    assert_eq!(e.to_string(), "line 2, column 21: %x is not defined before this use");
    let e = text::parse("graph g {\n  input %x: f32[2]\n  %y: f32[3] = Relu(%x)\n}").unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 3, column 3: node `y` (Relu): result 0 is declared f32[3] but inference gives f32[2]"
    );
    let e = text::parse("graph g {\n  input %x: f33[2]\n}").unwrap_err();
    assert_eq!(e.to_string(), "line 2, column 16: unknown type `f33`");
    let e = text::parse("graph g {\n  input %x: f32[2]\n").unwrap_err();
    assert!(e.to_string().contains("expected `input`, `output`, a %node or `}`"), "{e}");
}

#[test]
fn elided_weights_do_not_parse_back() {
    let g = kiln_ir::models::mlp(1, 8, 8, 2, 0).unwrap();
    let e = text::parse(&g.to_string()).unwrap_err();
    assert!(
        e.to_string().contains("data is elided; only text printed with full weights parses back"),
        "{e}"
    );
}

#[test]
fn the_interpreter_refuses_a_result_larger_than_memory() {
    // Expand to 100000 x 100000 x 100 floats: 4 TB, refused before it is allocated.
    let g = GraphBuilder::new("expand");
    let x = g.input("x", DType::F32, [1]);
    g.output("y", x.expand(&[100000, 100000, 100]).named("big"));
    let graph = g.build().unwrap();
    let e = eval::run(&graph, &[Tensor::zeros(DType::F32, &[1])]).unwrap_err().to_string();
    assert!(
        e.starts_with("evaluating node `big` (Expand): the result f32[100000,100000,100] needs 4000000000000 bytes (3.6 TiB), more than the "),
        "{e}"
    );
}

/// Sizes that overflow (or would not fit any address space) are errors naming the node at every
/// entry point, never a wrapped size: an Expand of f32[1] to [2^32, 2^32] had a 0-byte buffer
/// that passed validation and segfaulted; a Reshape to [2^62 + 1, 4] "succeeded".
#[test]
fn sizes_that_overflow_are_errors_naming_the_node() {
    let err =
        traced_type(&[(DType::F32, &[1])], |_, x| x[0].expand(&[1 << 32, 1 << 32])).unwrap_err();
    assert!(err.starts_with("node `expand` (Expand): f32[4294967296,4294967296] has more elements than a tensor can hold"), "{err}");
    let err =
        traced_type(&[(DType::F32, &[16])], |_, x| x[0].reshape(&[(1 << 62) + 1, 4])).unwrap_err();
    assert!(err.starts_with("node `reshape` (Reshape): "), "{err}");
    // A declared input.
    let mut g = Graph::new("huge");
    let err = g
        .add_input("x", TensorType::new(DType::F32, [1usize << 40, 1 << 40]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node `x`") && err.contains("more elements than a tensor can hold"),
        "{err}"
    );
    // Tensors from bytes, and the text form's constants.
    let err = Tensor::from_bytes(DType::F32, &[(1 << 62) + 1, 4], &[0; 16]).unwrap_err();
    assert!(err.to_string().contains("more elements than a tensor can hold"), "{err}");
    let src = "graph g {\n  %c: f32[4611686018427387905,4] = Constant [1.0]\n  output %c = %c\n}\n";
    let err = text::parse(src).unwrap_err().to_string();
    assert!(err.contains("more elements than a tensor can hold"), "{err}");
}

/// A rank that comes from a value's length (Unsqueeze's axes, a Reshape's shape known only by
/// its type) is bounded: an empty input unsqueezed by 2^31 run-time axes aborted the import
/// allocating 32 GiB of dims (found by the compiler's fuzz target).
#[test]
fn ranks_from_a_values_length_are_bounded() {
    let mut g = Graph::new("wide");
    let x = g.add_input("x", TensorType::new(DType::F32, [0usize])).unwrap();
    let axes = g.add_input("axes", TensorType::new(DType::I64, [1usize << 31])).unwrap();
    let err = g.add_node("u", Op::Unsqueeze, &[Some(x), Some(axes)]).unwrap_err().to_string();
    assert!(err.contains("node `u`") && err.contains("a result of rank 2147483649"), "{err}");
    // A Split whose num_outputs attribute asks for 4 * 10^13 results (the text form's fuzzer).
    let src = "graph g {\n  input %x: f32[n,4]\n  %s: (f32[n,4], f32[n,4]) = Split(%x) {axis = 0, num_outputs = 41444444444444}\n  output %y = %x\n}\n";
    let err = text::parse(src).unwrap_err().to_string();
    assert!(err.contains("num_outputs 41444444444444 is more than the 65536 results"), "{err}");
    let shape = g.add_input("shape", TensorType::new(DType::I64, [3usize])).unwrap();
    assert!(g.add_node("r", Op::Reshape { allowzero: false }, &[Some(x), Some(shape)]).is_ok());
}

/// A `.npy` whose header claims more than it holds, or more than any tensor can hold, is an
/// error: a header of (2^62 + 1, 4) over 16 bytes of data corrupted the heap.
#[test]
fn npy_headers_that_overflow_are_errors() {
    let header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, 4), }}", (1u64 << 62) + 1);
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let pad = 64 - (10 + header.len() + 1) % 64;
    let h = format!("{header}{}\n", " ".repeat(pad));
    bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    let err = kiln_ir::npy::decode(&bytes).unwrap_err().to_string();
    assert!(err.contains("more elements than a tensor can hold"), "{err}");
}
