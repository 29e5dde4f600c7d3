//! Shape, Size, ConstantOfShape, Range, EyeLike, ArgMax/ArgMin, CumSum/CumProd, TopK, Einsum, Swish.
//! Each op's shape rule and interpreter, against hand-computed values (or numpy's, where said).

use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::op::{ArgReduce, Cumulative};
use kiln_ir::{eval, DType, Dim, Op, Shape, Tensor, UnaryOp};

use super::{assert_close, f32s, run_traced, traced_type};

/// Like `run_traced`, but returns the build or run error's text instead of panicking.
fn try_run(
    inputs: &[Tensor],
    f: impl for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>,
) -> Result<Tensor, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<Traced> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| g.input(&format!("x{i}"), t.dtype(), t.dims()))
        .collect();
    let y = f(&g, &xs);
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    eval::run(&graph, inputs).map(|mut v| v.remove(0)).map_err(|e| e.to_string())
}

/// Like `traced_type`, for inputs whose shapes may have symbols.
fn sym_type(
    inputs: &[(DType, Shape)],
    f: impl for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>,
) -> Result<String, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<Traced> = inputs
        .iter()
        .enumerate()
        .map(|(i, (d, s))| g.input(&format!("x{i}"), *d, s.clone()))
        .collect();
    let y = f(&g, &xs);
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    Ok(graph.value_type(graph.outputs()[0].1).to_string())
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.as_slice::<i64>().expect("an i64 tensor").to_vec()
}

// ----- Shape and Size -----

fn shape_op(start: i64, end: Option<i64>) -> Op {
    Op::Shape { start, end }
}

#[test]
fn shape_takes_a_clamped_interval_of_the_dimensions() {
    let x = Tensor::zeros(DType::F32, &[3, 4, 5]);
    let shape = |start, end| {
        run_traced(&[x.clone()], |g, v| g.apply(shape_op(start, end), &[Some(v[0])], 1)[0])
    };
    assert_eq!(ints(&shape(0, None)), [3, 4, 5]);
    assert_eq!(ints(&shape(1, None)), [4, 5]);
    assert_eq!(ints(&shape(-1, None)), [5]);
    assert_eq!(ints(&shape(0, Some(-1))), [3, 4]);
    assert_eq!(ints(&shape(1, Some(2))), [4]);
    // Out-of-range bounds clamp to [0, rank]; start > end is empty.
    assert_eq!(ints(&shape(-10, Some(10))), [3, 4, 5]);
    let empty = shape(2, Some(1));
    assert_eq!((empty.dims(), empty.dtype()), (&[0usize][..], DType::I64));
    // A scalar has an empty shape.
    let s =
        run_traced(&[Tensor::scalar(1f32)], |g, v| g.apply(shape_op(0, None), &[Some(v[0])], 1)[0]);
    assert_eq!(s.dims(), &[0]);
}

#[test]
fn shape_and_size_types_need_only_the_rank() {
    let batch = Shape(vec![Dim::sym("batch"), Dim::Fixed(3), Dim::Fixed(4)]);
    let ty = |op: Op| {
        sym_type(&[(DType::F16, batch.clone())], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0])
    };
    assert_eq!(ty(shape_op(0, None)), Ok("i64[3]".into()));
    assert_eq!(ty(shape_op(-2, None)), Ok("i64[2]".into()));
    assert_eq!(ty(shape_op(3, Some(1))), Ok("i64[0]".into()));
    assert_eq!(ty(Op::Size), Ok("i64[]".into()));
}

#[test]
fn size_counts_elements() {
    let size = |x: Tensor| run_traced(&[x], |g, v| g.apply(Op::Size, &[Some(v[0])], 1)[0]);
    let s = size(Tensor::zeros(DType::F32, &[3, 4, 5]));
    assert_eq!((s.dims(), ints(&s)), (&[][..], vec![60]));
    assert_eq!(ints(&size(Tensor::zeros(DType::I8, &[2, 0, 7]))), [0]);
    assert_eq!(ints(&size(Tensor::scalar(true))), [1]);
}

// ----- ConstantOfShape -----

#[test]
fn constant_of_shape_fills_with_the_value_and_its_type() {
    let cos = |value: Tensor, shape: &[i64]| {
        let shape = Tensor::vector(shape);
        run_traced(&[], |g, _| {
            let s = g.constant("shape", shape.clone());
            g.apply(Op::ConstantOfShape { value: value.clone() }, &[Some(s)], 1)[0]
        })
    };
    let y = cos(Tensor::vector(&[7i32]), &[2, 3]);
    assert_eq!((y.dtype(), y.dims()), (DType::I32, &[2usize, 3][..]));
    assert_eq!(y.as_slice::<i32>().unwrap(), &[7; 6]);
    // The ONNX default value, f32 0; an empty shape gives a scalar, a 0 an empty tensor.
    let scalar = cos(Tensor::vector(&[0f32]), &[]);
    assert_close(&scalar, &[], &[0.0], 0.0);
    assert_eq!(cos(Tensor::vector(&[1.5f64]), &[0, 4]).dims(), &[0, 4]);
    assert_close(&cos(Tensor::scalar(1.5f64), &[2]), &[2], &[1.5, 1.5], 0.0);
}

#[test]
fn constant_of_shape_with_a_runtime_shape() {
    let op = Op::ConstantOfShape { value: Tensor::vector(&[true]) };
    let ty = traced_type(&[(DType::I64, &[2])], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]);
    assert_eq!(ty, Ok("bool[\"constantofshape.d0\",\"constantofshape.d1\"]".into()));
    let y =
        run_traced(&[Tensor::vector(&[3i64, 1])], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]);
    assert_eq!(y.dims(), &[3, 1]);
    assert_eq!(y.as_slice::<bool>().unwrap(), &[true; 3]);
    // The rank must be known.
    let unknown = sym_type(&[(DType::I64, Shape(vec![Dim::sym("n")]))], |g, v| {
        g.apply(op.clone(), &[Some(v[0])], 1)[0]
    });
    assert_eq!(unknown, Err("node `constantofshape` (ConstantOfShape): the shape operand must have a known length, got i64[n]".into()));
}

#[test]
fn constant_of_shape_rejects_bad_shapes_and_values() {
    let err = |value: Tensor, shape: Tensor| {
        try_run(&[], |g, _| {
            let s = g.constant("shape", shape.clone());
            g.apply(Op::ConstantOfShape { value: value.clone() }, &[Some(s)], 1)[0]
        })
        .unwrap_err()
    };
    let one = Tensor::vector(&[1f32]);
    assert_eq!(
        err(one.clone(), Tensor::vector(&[2i64, -1])),
        "node `constantofshape` (ConstantOfShape): shape [2, -1] has a negative size"
    );
    assert_eq!(
        err(Tensor::vector(&[1f32, 2.]), Tensor::vector(&[2i64])),
        "node `constantofshape` (ConstantOfShape): value must hold one element, got f32[2]"
    );
    assert_eq!(
        err(one.clone(), Tensor::from_vec(&[1, 2], vec![2i64, 2]).unwrap()),
        "node `constantofshape` (ConstantOfShape): the shape operand must be 1-D, got i64[1,2]"
    );
    assert_eq!(
        err(one.clone(), Tensor::vector(&[2f32])),
        "node `constantofshape` (ConstantOfShape): shape must be an integer tensor, got f32[1]"
    );
    let huge = err(one, Tensor::vector(&[1i64 << 40, 1 << 40]));
    assert!(huge.ends_with("has too many elements"), "{huge}");
    // A run-time shape is checked when it is known.
    let op = Op::ConstantOfShape { value: Tensor::vector(&[1u8]) };
    let e = try_run(&[Tensor::vector(&[-3i64])], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0])
        .unwrap_err();
    assert_eq!(
        e,
        "evaluating node `constantofshape` (ConstantOfShape): shape [-3] has a negative size"
    );
}

// ----- Range -----

/// Range over constant bounds.
fn range(start: Tensor, limit: Tensor, delta: Tensor) -> Result<Tensor, String> {
    try_run(&[], |g, _| {
        let (s, l, d) = (
            g.constant("start", start.clone()),
            g.constant("limit", limit.clone()),
            g.constant("delta", delta.clone()),
        );
        g.apply(Op::Range, &[Some(s), Some(l), Some(d)], 1)[0]
    })
}

#[test]
fn range_follows_the_onnx_examples() {
    let r = |a: i32, b: i32, c: i32| {
        range(Tensor::scalar(a), Tensor::scalar(b), Tensor::scalar(c)).unwrap()
    };
    assert_eq!(r(3, 9, 3).as_slice::<i32>().unwrap(), &[3, 6]);
    assert_eq!(r(10, 4, -2).as_slice::<i32>().unwrap(), &[10, 8, 6]);
    assert_eq!(r(0, 7, 3).as_slice::<i32>().unwrap(), &[0, 3, 6], "ceil(7 / 3) = 3 elements");
    assert_eq!(r(-1, -8, -3).as_slice::<i32>().unwrap(), &[-1, -4, -7]);
    // Empty: the limit lies behind the start.
    assert_eq!(r(5, 1, 1).dims(), &[0]);
    assert_eq!(r(1, 5, -1).dims(), &[0]);
    assert_eq!(r(4, 4, 1).dims(), &[0]);
}

#[test]
fn range_of_floats_and_of_large_integers() {
    // ceil((1 - 0) / 0.3) = 4 elements: 0, 0.3, 0.6, 0.9 (each start + i * delta).
    let y = range(Tensor::scalar(0f32), Tensor::scalar(1f32), Tensor::scalar(0.3f32)).unwrap();
    assert_close(&y, &[4], &[0.0, 0.3, 0.6, 0.9], 1e-6);
    let y = range(Tensor::scalar(1.0f64), Tensor::scalar(-1.0), Tensor::scalar(-0.5)).unwrap();
    assert_close(&y, &[4], &[1.0, 0.5, 0.0, -0.5], 0.0);
    // Integers are exact where f64 is not.
    let y = range(Tensor::scalar(i64::MAX - 2), Tensor::scalar(i64::MAX), Tensor::scalar(1i64))
        .unwrap();
    assert_eq!(ints(&y), [i64::MAX - 2, i64::MAX - 1]);
    let y = range(Tensor::scalar(u64::MAX - 1), Tensor::scalar(u64::MAX), Tensor::scalar(1u64))
        .unwrap();
    assert_eq!(y.as_slice::<u64>().unwrap(), &[u64::MAX - 1]);
    // One-element vectors count as scalars.
    let y = range(Tensor::vector(&[1i16]), Tensor::vector(&[3i16]), Tensor::scalar(1i16)).unwrap();
    assert_eq!(y.as_slice::<i16>().unwrap(), &[1, 2]);
}

#[test]
fn range_length_is_symbolic_unless_the_bounds_are_constant() {
    let s = (DType::I32, &[][..]);
    let ty = traced_type(&[s, s, s], |g, v| {
        g.apply(Op::Range, &[Some(v[0]), Some(v[1]), Some(v[2])], 1)[0]
    });
    assert_eq!(ty, Ok("i32[\"range.d0\"]".into()));
    let y = run_traced(
        &[Tensor::scalar(2i32), Tensor::scalar(-3i32), Tensor::scalar(-2i32)],
        |g, v| g.apply(Op::Range, &[Some(v[0]), Some(v[1]), Some(v[2])], 1)[0],
    );
    assert_eq!(y.as_slice::<i32>().unwrap(), &[2, 0, -2]);
}

#[test]
fn range_rejects_bad_bounds() {
    let e = range(Tensor::scalar(1i64), Tensor::scalar(5i64), Tensor::scalar(0i64)).unwrap_err();
    assert_eq!(e, "node `range` (Range): delta must not be 0");
    let e = range(Tensor::scalar(1f32), Tensor::scalar(5f32), Tensor::scalar(0f32)).unwrap_err();
    assert_eq!(e, "node `range` (Range): delta must not be 0");
    let e = range(Tensor::scalar(1i64), Tensor::scalar(5i32), Tensor::scalar(1i64)).unwrap_err();
    assert_eq!(e, "node `range` (Range): start, limit and delta must have the same type, got limit i32[] and start i64[]");
    let e =
        range(Tensor::scalar(1f32), Tensor::vector(&[5f32, 6.]), Tensor::scalar(1f32)).unwrap_err();
    assert_eq!(e, "node `range` (Range): limit must be a scalar, got f32[2]");
    let e = range(Tensor::scalar(0f64), Tensor::scalar(f64::INFINITY), Tensor::scalar(1f64))
        .unwrap_err();
    assert!(e.ends_with("has too many elements"), "{e}");
    let e =
        range(Tensor::scalar(0f64), Tensor::scalar(f64::NAN), Tensor::scalar(1f64)).unwrap_err();
    assert!(e.contains("has no element count"), "{e}");
    let e = range(Tensor::scalar(true), Tensor::scalar(true), Tensor::scalar(true)).unwrap_err();
    assert_eq!(e, "node `range` (Range): needs a numeric type, got bool[]");
}

// ----- EyeLike -----

#[test]
fn eye_like_puts_ones_on_diagonal_k() {
    let eye = |x: Tensor, dtype, k| {
        run_traced(&[x], |g, v| g.apply(Op::EyeLike { dtype, k }, &[Some(v[0])], 1)[0])
    };
    let x = Tensor::zeros(DType::I32, &[3, 4]);
    let y = eye(x.clone(), None, 0);
    assert_eq!(y.as_slice::<i32>().unwrap(), &[1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]);
    let y = eye(x.clone(), Some(DType::F64), 1);
    assert_eq!(y.dtype(), DType::F64);
    assert_close(&y, &[3, 4], &[0., 1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 1.], 0.0);
    let y = eye(x.clone(), Some(DType::Bool), -2);
    assert_eq!(
        y.as_slice::<bool>().unwrap(),
        &[false, false, false, false, false, false, false, false, true, false, false, false]
    );
    // Off the matrix entirely: all zeros.
    assert_eq!(eye(x.clone(), None, 4).as_slice::<i32>().unwrap(), &[0; 12]);
    assert_eq!(eye(x, None, i64::MIN).as_slice::<i32>().unwrap(), &[0; 12]);
    let err = traced_type(&[(DType::F32, &[2, 2, 2])], |g, v| {
        g.apply(Op::EyeLike { dtype: None, k: 0 }, &[Some(v[0])], 1)[0]
    });
    assert_eq!(err, Err("node `eyelike` (EyeLike): needs a 2-D input, got f32[2,2,2]".into()));
}

// ----- ArgMax / ArgMin -----

fn arg(max: bool, axis: i64, keepdims: bool, select_last_index: bool) -> Op {
    Op::ArgReduce(ArgReduce { max, axis, keepdims, select_last_index })
}

#[test]
fn arg_max_and_min_with_ties_and_axes() {
    let x = f32s(&[2, 3], &[2., 1., 3., 3., 3., 1.]);
    let run = |op: Op| run_traced(&[x.clone()], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]);
    let y = run(arg(true, 1, true, false));
    assert_eq!((y.dims(), ints(&y)), (&[2usize, 1][..], vec![2, 0]));
    assert_eq!(ints(&run(arg(true, 1, true, true))), [2, 1], "the last of the tied 3s");
    let y = run(arg(false, -2, false, false));
    assert_eq!((y.dims(), ints(&y)), (&[3usize][..], vec![0, 0, 1]));
    assert_eq!(ints(&run(arg(false, 0, false, false))), [0, 0, 1]);
    assert_eq!(ints(&run(arg(false, -1, false, false))), [1, 2]);
    let ties = f32s(&[4], &[5., 1., 5., 1.]);
    let run = |op: Op| {
        ints(&run_traced(&[ties.clone()], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]))
    };
    assert_eq!(
        (run(arg(true, 0, false, false)), run(arg(true, 0, false, true))),
        (vec![0], vec![2])
    );
    assert_eq!(
        (run(arg(false, 0, true, false)), run(arg(false, 0, true, true))),
        (vec![1], vec![3])
    );
}

#[test]
fn arg_reduce_picks_nan_and_compares_integers_exactly() {
    // numpy: argmax([1, nan, 3]) = argmin([1, nan, 0]) = 1.
    let run = |x: Tensor, op: Op| {
        ints(&run_traced(&[x], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]))
    };
    assert_eq!(run(f32s(&[3], &[1., f32::NAN, 3.]), arg(true, 0, false, false)), [1]);
    assert_eq!(run(f32s(&[3], &[1., f32::NAN, 0.]), arg(false, 0, false, false)), [1]);
    // These differ by 1 but are equal as f64.
    assert_eq!(run(Tensor::vector(&[u64::MAX - 1, u64::MAX]), arg(true, 0, false, false)), [1]);
    assert_eq!(run(Tensor::vector(&[i64::MAX, i64::MAX - 1]), arg(false, 0, false, false)), [1]);
}

#[test]
fn arg_reduce_shapes_and_errors() {
    let f = DType::F32;
    let ty = |op: Op, dims: &[usize]| {
        traced_type(&[(f, dims)], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0])
    };
    assert_eq!(ty(arg(true, 0, true, false), &[2, 3, 4]), Ok("i64[1,3,4]".into()));
    assert_eq!(ty(arg(false, -1, false, false), &[2, 3, 4]), Ok("i64[2,3]".into()));
    assert_eq!(
        ty(arg(true, 2, true, false), &[2, 3]),
        Err("node `argmax` (ArgMax): axis 2 is out of range for f32[2,3]".into())
    );
    assert_eq!(
        ty(arg(true, 0, true, false), &[]),
        Err("node `argmax` (ArgMax): axis 0 is out of range for f32[]".into())
    );
    let b = traced_type(&[(DType::Bool, &[2])], |g, v| {
        g.apply(arg(false, 0, true, false), &[Some(v[0])], 1)[0]
    });
    assert_eq!(b, Err("node `argmin` (ArgMin): needs a numeric type, got bool[2]".into()));
    // An empty axis has no maximum, unless there is nothing to reduce at all.
    let e = try_run(&[Tensor::zeros(f, &[2, 0])], |g, v| {
        g.apply(arg(true, 1, true, false), &[Some(v[0])], 1)[0]
    })
    .unwrap_err();
    assert_eq!(e, "evaluating node `argmax` (ArgMax): ArgMax of an empty axis 1 of f32[2,0]");
    let e = try_run(&[Tensor::zeros(f, &[0, 3])], |g, v| {
        g.apply(arg(false, 0, false, false), &[Some(v[0])], 1)[0]
    })
    .unwrap_err();
    assert_eq!(e, "evaluating node `argmin` (ArgMin): ArgMin of an empty axis 0 of f32[0,3]");
    assert_eq!(
        run_traced(&[Tensor::zeros(f, &[0, 3])], |g, v| g.apply(
            arg(true, 1, false, false),
            &[Some(v[0])],
            1
        )[0])
        .dims(),
        &[0]
    );
}

// ----- CumSum / CumProd -----

fn cum(prod: bool, exclusive: bool, reverse: bool) -> Op {
    Op::Cumulative(Cumulative { prod, exclusive, reverse })
}

/// Runs a cumulative op with a constant axis operand.
fn cumulative(x: Tensor, op: Op, axis: Tensor) -> Result<Tensor, String> {
    try_run(&[x], |g, v| {
        let a = g.constant("axis", axis.clone());
        g.apply(op.clone(), &[Some(v[0]), Some(a)], 1)[0]
    })
}

#[test]
fn cumsum_and_cumprod_exclusive_and_reverse() {
    let x = Tensor::vector(&[1f64, 2., 3., 4.]);
    let run = |op| cumulative(x.clone(), op, Tensor::scalar(0i32)).unwrap();
    assert_close(&run(cum(false, false, false)), &[4], &[1., 3., 6., 10.], 0.0);
    assert_close(&run(cum(false, true, false)), &[4], &[0., 1., 3., 6.], 0.0);
    assert_close(&run(cum(false, false, true)), &[4], &[10., 9., 7., 4.], 0.0);
    assert_close(&run(cum(false, true, true)), &[4], &[9., 7., 4., 0.], 0.0);
    assert_close(&run(cum(true, false, false)), &[4], &[1., 2., 6., 24.], 0.0);
    assert_close(&run(cum(true, true, false)), &[4], &[1., 1., 2., 6.], 0.0);
    assert_close(&run(cum(true, false, true)), &[4], &[24., 24., 12., 4.], 0.0);
    assert_close(&run(cum(true, true, true)), &[4], &[24., 12., 4., 1.], 0.0);
}

#[test]
fn cumulative_along_an_axis_of_a_matrix() {
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let y = cumulative(x.clone(), cum(false, false, false), Tensor::scalar(0i64)).unwrap();
    assert_close(&y, &[2, 3], &[1., 2., 3., 5., 7., 9.], 0.0);
    // A one-element vector axis, negative.
    let y = cumulative(x.clone(), cum(false, false, false), Tensor::vector(&[-1i64])).unwrap();
    assert_close(&y, &[2, 3], &[1., 3., 6., 4., 9., 15.], 0.0);
    let y = cumulative(x, cum(true, true, true), Tensor::scalar(1i32)).unwrap();
    assert_close(&y, &[2, 3], &[6., 3., 1., 30., 6., 1.], 0.0);
    // The axis may be a run-time value; the type is x's anyway.
    let y = run_traced(&[Tensor::vector(&[2i32, 3, 4]), Tensor::scalar(0i64)], |g, v| {
        g.apply(cum(true, false, false), &[Some(v[0]), Some(v[1])], 1)[0]
    });
    assert_eq!(y.as_slice::<i32>().unwrap(), &[2, 6, 24]);
}

#[test]
fn cumulative_integers_are_exact_and_wrap() {
    let y = cumulative(
        Tensor::vector(&[i64::MAX - 1, 1]),
        cum(false, false, false),
        Tensor::scalar(0i64),
    )
    .unwrap();
    assert_eq!(ints(&y), [i64::MAX - 1, i64::MAX]);
    let y =
        cumulative(Tensor::vector(&[i32::MAX, 1]), cum(false, false, false), Tensor::scalar(0i64))
            .unwrap();
    assert_eq!(y.as_slice::<i32>().unwrap(), &[i32::MAX, i32::MIN], "wraps as numpy's int32");
    let y = cumulative(Tensor::vector(&[200u8, 2]), cum(true, false, false), Tensor::scalar(0i64))
        .unwrap();
    assert_eq!(y.as_slice::<u8>().unwrap(), &[200, 144], "400 mod 256");
}

#[test]
fn cumulative_rejects_bad_axes() {
    let x = || f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let e = cumulative(x(), cum(false, false, false), Tensor::scalar(2i64)).unwrap_err();
    assert_eq!(e, "node `cumsum` (CumSum): axis 2 is out of range for f32[2,3]");
    let e = cumulative(x(), cum(true, false, false), Tensor::vector(&[0i64, 1])).unwrap_err();
    assert_eq!(e, "node `cumprod` (CumProd): axis must hold one value, got i64[2]");
    let e = cumulative(x(), cum(false, false, false), Tensor::scalar(0f32)).unwrap_err();
    assert_eq!(e, "node `cumsum` (CumSum): axis must be an integer tensor, got f32[]");
    let e = try_run(&[x(), Tensor::scalar(-3i64)], |g, v| {
        g.apply(cum(false, false, false), &[Some(v[0]), Some(v[1])], 1)[0]
    })
    .unwrap_err();
    assert_eq!(e, "evaluating node `cumsum` (CumSum): axis -3 is out of range for f32[2,3]");
}

// ----- TopK -----

fn topk(axis: i64, largest: bool) -> Op {
    Op::TopK { axis, largest, sorted: true }
}

/// TopK with a constant k; returns (values, indices).
fn top_k(x: Tensor, op: Op, k: i64) -> Result<(Tensor, Tensor), String> {
    let g = GraphBuilder::new("t");
    let xv = g.input("x", x.dtype(), x.dims());
    let kv = g.constant("k", Tensor::vector(&[k]));
    let r = g.apply(op, &[Some(xv), Some(kv)], 2);
    g.output("values", r[0]);
    g.output("indices", r[1]);
    let graph = g.build().map_err(|e| e.to_string())?;
    let mut out = eval::run(&graph, &[x]).map_err(|e| e.to_string())?;
    let i = out.remove(1);
    Ok((out.remove(0), i))
}

#[test]
fn top_k_largest_and_smallest_along_an_axis() {
    // The ONNX node test's input: x = arange(12).reshape(3, 4).
    let x = f32s(&[3, 4], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
    let (v, i) = top_k(x.clone(), topk(1, true), 3).unwrap();
    assert_close(&v, &[3, 3], &[3., 2., 1., 7., 6., 5., 11., 10., 9.], 0.0);
    assert_eq!(ints(&i), [3, 2, 1, 3, 2, 1, 3, 2, 1]);
    let (v, i) = top_k(x.clone(), topk(-1, false), 2).unwrap();
    assert_close(&v, &[3, 2], &[0., 1., 4., 5., 8., 9.], 0.0);
    assert_eq!(ints(&i), [0, 1, 0, 1, 0, 1]);
    let (v, i) = top_k(x.clone(), topk(0, true), 1).unwrap();
    assert_close(&v, &[1, 4], &[8., 9., 10., 11.], 0.0);
    assert_eq!(ints(&i), [2, 2, 2, 2]);
    // k = 0 and k = the whole axis.
    let (v, i) = top_k(x.clone(), topk(1, true), 0).unwrap();
    assert_eq!((v.dims(), i.dims()), (&[3usize, 0][..], &[3usize, 0][..]));
    let (_, i) = top_k(x, topk(0, false), 3).unwrap();
    assert_eq!(ints(&i), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
}

#[test]
fn top_k_ties_go_to_the_lower_index() {
    let x = Tensor::vector(&[1i64, 3, 3, 2, 3]);
    let (v, i) = top_k(x.clone(), topk(0, true), 3).unwrap();
    assert_eq!((ints(&v), ints(&i)), (vec![3, 3, 3], vec![1, 2, 4]));
    let (v, i) = top_k(Tensor::vector(&[2i64, 1, 1, 2]), topk(0, false), 3).unwrap();
    assert_eq!((ints(&v), ints(&i)), (vec![1, 1, 2], vec![1, 2, 0]));
    // NaN sorts above everything (numpy's order): first when largest, last when smallest.
    let n = f32s(&[3], &[1., f32::NAN, 3.]);
    let (v, i) = top_k(n.clone(), topk(0, true), 2).unwrap();
    assert_close(&v, &[2], &[f64::NAN, 3.], 0.0);
    assert_eq!(ints(&i), [1, 2]);
    let (_, i) = top_k(n, topk(0, false), 3).unwrap();
    assert_eq!(ints(&i), [0, 2, 1]);
    // Exact comparison of 64-bit integers that are equal as f64.
    let (v, i) = top_k(Tensor::vector(&[u64::MAX, u64::MAX - 1]), topk(0, false), 1).unwrap();
    assert_eq!((v.as_slice::<u64>().unwrap(), ints(&i)), (&[u64::MAX - 1][..], vec![1]));
}

#[test]
fn top_k_shapes_and_errors() {
    let ty = |k: i64, axis: i64| {
        traced_type(&[(DType::F32, &[3, 4])], |g, v| {
            let kv = g.constant("k", Tensor::vector(&[k]));
            g.apply(topk(axis, true), &[Some(v[0]), Some(kv)], 2)[1]
        })
    };
    assert_eq!(ty(2, -1), Ok("i64[3,2]".into()));
    assert_eq!(ty(3, 0), Ok("i64[3,4]".into()));
    assert_eq!(ty(5, 1), Err("node `topk` (TopK): k 5 exceeds axis 1 of f32[3,4]".into()));
    assert_eq!(ty(-1, 1), Err("node `topk` (TopK): k -1 is negative".into()));
    assert_eq!(ty(1, 2), Err("node `topk` (TopK): axis 2 is out of range for f32[3,4]".into()));
    // A run-time k: the axis gets a symbol, both results share it.
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::F16, [3, 4]);
    let k = g.input("k", DType::I64, [1]);
    let r = g.apply(topk(1, true), &[Some(x), Some(k)], 2);
    assert_eq!(r[0].ty().map(|t| t.to_string()), Some("f16[3,\"topk.d1\"]".into()));
    assert_eq!(r[1].ty().map(|t| t.to_string()), Some("i64[3,\"topk.d1\"]".into()));
    // ...and its value is checked when known.
    let e = try_run(&[f32s(&[2], &[1., 2.]), Tensor::vector(&[3i64])], |g, v| {
        g.apply(topk(0, true), &[Some(v[0]), Some(v[1])], 2)[0]
    })
    .unwrap_err();
    assert_eq!(e, "evaluating node `topk` (TopK): k 3 exceeds axis 0 of f32[2]");
    let e = try_run(&[f32s(&[2], &[1., 2.]), Tensor::vector(&[1i64, 1])], |g, v| {
        g.apply(topk(0, true), &[Some(v[0]), Some(v[1])], 2)[0]
    })
    .unwrap_err();
    assert_eq!(e, "node `topk` (TopK): k must hold one value, got i64[2]");
}

// ----- Einsum -----

fn einsum(equation: &str, xs: &[Tensor]) -> Result<Tensor, String> {
    try_run(xs, |g, v| {
        g.apply(
            Op::Einsum { equation: equation.into() },
            &v.iter().map(|t| Some(*t)).collect::<Vec<_>>(),
            1,
        )[0]
    })
}

fn arange(dims: &[usize], scale: f32, offset: f32) -> Tensor {
    let n: usize = dims.iter().product();
    f32s(dims, &(0..n).map(|v| v as f32 * scale + offset).collect::<Vec<_>>())
}

#[test]
fn einsum_matmul_transpose_and_sums() {
    // Values from numpy: a = arange(6).reshape(2, 3), b = arange(12).reshape(3, 4) - 5.
    let a = arange(&[2, 3], 1.0, 0.0);
    let b = arange(&[3, 4], 1.0, -5.0);
    let mm = [5., 8., 11., 14., -4., 8., 20., 32.];
    assert_close(&einsum("ij,jk->ik", &[a.clone(), b.clone()]).unwrap(), &[2, 4], &mm, 0.0);
    // Implicit output: the letters used once, in alphabetical order; spaces are ignored.
    assert_close(&einsum("ij,jk", &[a.clone(), b.clone()]).unwrap(), &[2, 4], &mm, 0.0);
    assert_close(&einsum(" i j , j k -> i k ", &[a.clone(), b]).unwrap(), &[2, 4], &mm, 0.0);
    assert_close(&einsum("ij->ji", &[a.clone()]).unwrap(), &[3, 2], &[0., 3., 1., 4., 2., 5.], 0.0);
    assert_close(&einsum("ba", &[a.clone()]).unwrap(), &[3, 2], &[0., 3., 1., 4., 2., 5.], 0.0);
    // ASCII order puts upper case first: `aB` -> `Ba`, a transpose.
    assert_eq!(einsum("aB", &[a.clone()]).unwrap().dims(), &[3, 2]);
    assert_close(&einsum("ij->", &[a.clone()]).unwrap(), &[], &[15.], 0.0);
    assert_close(&einsum("ij->j", &[a.clone()]).unwrap(), &[3], &[3., 5., 7.], 0.0);
    assert_close(
        &einsum("i,j->ij", &[f32s(&[2], &[1., 2.]), f32s(&[3], &[3., 4., 5.])]).unwrap(),
        &[2, 3],
        &[3., 4., 5., 6., 8., 10.],
        0.0,
    );
    let v = |a: f32| f32s(&[3], &[a, a + 1., a + 2.]);
    assert_close(&einsum("i,i,i->", &[v(1.), v(4.), v(7.)]).unwrap(), &[], &[270.], 0.0);
    assert_close(&einsum("->", &[Tensor::scalar(2.5f32)]).unwrap(), &[], &[2.5], 0.0);
}

#[test]
fn einsum_diagonals_traces_and_ellipsis() {
    let m = arange(&[3, 3], 1.0, 0.0);
    assert_close(&einsum("ii", &[m.clone()]).unwrap(), &[], &[12.], 0.0);
    assert_close(&einsum("ii->i", &[m]).unwrap(), &[3], &[0., 4., 8.], 0.0);
    // numpy: einsum('iij->ji', arange(12).reshape(2, 2, 3)).
    assert_close(
        &einsum("iij->ji", &[arange(&[2, 2, 3], 1.0, 0.0)]).unwrap(),
        &[3, 2],
        &[0., 9., 1., 10., 2., 11.],
        0.0,
    );
    assert_close(
        &einsum("...ii ->...i", &[arange(&[3, 2, 2], 1.0, 0.0)]).unwrap(),
        &[3, 2],
        &[0., 3., 4., 7., 8., 11.],
        0.0,
    );
    // Ellipsis dimensions broadcast; numpy: p = arange(12).reshape(2, 1, 2, 3), q = arange(24).reshape(4, 3, 2) * 0.5.
    let p = arange(&[2, 1, 2, 3], 1.0, 0.0);
    let q = arange(&[4, 3, 2], 0.5, 0.0);
    #[rustfmt::skip]
    let want = [5.0, 6.5, 14.0, 20.0, 14.0, 15.5, 50.0, 56.0, 23.0, 24.5, 86.0, 92.0, 32.0, 33.5, 122.0, 128.0,
                23.0, 33.5, 32.0, 47.0, 86.0, 96.5, 122.0, 137.0, 149.0, 159.5, 212.0, 227.0, 212.0, 222.5, 302.0, 317.0];
    assert_close(
        &einsum("...ij,...jk->...ik", &[p.clone(), q.clone()]).unwrap(),
        &[2, 4, 2, 2],
        &want,
        0.0,
    );
    // Implicit mode puts the ellipsis dimensions first.
    assert_close(&einsum("...ij,...jk", &[p, q]).unwrap(), &[2, 4, 2, 2], &want, 0.0);
    // A letter of size 1 broadcasts against another operand's (numpy: einsum('i,i', [1, 2, 3], [2]) = 12).
    assert_close(
        &einsum("i,i", &[f32s(&[3], &[1., 2., 3.]), f32s(&[1], &[2.])]).unwrap(),
        &[],
        &[12.],
        0.0,
    );
    // An empty summed axis gives zeros.
    assert_close(
        &einsum(
            "ij,jk->ik",
            &[Tensor::zeros(DType::F32, &[2, 0]), Tensor::zeros(DType::F32, &[0, 2])],
        )
        .unwrap(),
        &[2, 2],
        &[0.; 4],
        0.0,
    );
}

#[test]
fn einsum_keeps_the_element_type() {
    let a = Tensor::from_vec(&[2, 2], vec![i64::MAX / 2, 1, 1, 1]).unwrap();
    let b = Tensor::from_vec(&[2, 1], vec![2i64, 1]).unwrap();
    let y = einsum("ij,jk->ik", &[a, b]).unwrap();
    assert_eq!(ints(&y), [i64::MAX, 3], "exact where f64 would round");
    let h = Tensor::vector(&[1.5f32, 2.0]).cast(DType::F16);
    let y = einsum("i,i->", &[h.clone(), h]).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_close(&y, &[], &[6.25], 0.0);
}

#[test]
fn einsum_shapes_with_symbols() {
    let s = |d: &[Dim]| Shape(d.to_vec());
    let (b, n) = (Dim::sym("batch"), |n| Dim::Fixed(n));
    let ty = |eq: &str, shapes: &[Shape]| {
        let inputs: Vec<(DType, Shape)> = shapes.iter().map(|s| (DType::F32, s.clone())).collect();
        sym_type(&inputs, |g, v| {
            g.apply(
                Op::Einsum { equation: eq.into() },
                &v.iter().map(|t| Some(*t)).collect::<Vec<_>>(),
                1,
            )[0]
        })
    };
    let x = s(&[b.clone(), n(2), n(3)]);
    let y = s(&[b.clone(), n(3), n(4)]);
    assert_eq!(ty("bij, bjk -> bik", &[x.clone(), y.clone()]), Ok("f32[batch,2,4]".into()));
    // A symbol meeting a size takes the size.
    assert_eq!(
        ty("ij,jk->kj", &[s(&[n(2), Dim::sym("m")]), s(&[n(5), n(4)])]),
        Ok("f32[4,5]".into())
    );
    assert_eq!(ty("...j->...", &[x]), Ok("f32[batch,2]".into()));
}

#[test]
fn einsum_rejects_bad_equations() {
    let a = || f32s(&[2, 3], &[0.; 6]);
    let e = |eq: &str, xs: &[Tensor]| einsum(eq, xs).unwrap_err();
    let p = "node `einsum` (Einsum): ";
    assert_eq!(
        e("ij,jk->ik", &[a()]),
        format!("{p}equation `ij,jk->ik` has 2 input terms for 1 operands")
    );
    assert_eq!(
        e("ijk->i", &[a()]),
        format!("{p}term 0 `ijk` does not fit operand 0 of shape [2,3]")
    );
    assert_eq!(
        e("...ijk", &[a()]),
        format!("{p}term 0 `...ijk` does not fit operand 0 of shape [2,3]")
    );
    assert_eq!(
        e("ij,ij->i", &[a(), f32s(&[3, 2], &[0.; 6])]),
        format!("{p}letter `i` stands for sizes 2 and 3 (operand 1 of shape [3,2])")
    );
    assert_eq!(
        e("ii->i", &[a()]),
        format!("{p}letter `i` of operand 0 of shape [2,3] stands for sizes 2 and 3")
    );
    assert_eq!(e("ij->k", &[a()]), format!("{p}output letter `k` is in no input term"));
    assert_eq!(e("ij->ii", &[a()]), format!("{p}output letter `i` is repeated"));
    assert_eq!(
        e("...j->j", &[a()]),
        format!("{p}output `j` needs `...` for the broadcast dimensions [2]")
    );
    assert_eq!(e("i.j->i", &[a()]), format!("{p}term `i.j` has the invalid character '.'"));
    assert_eq!(
        e("i1->i", &[f32s(&[2, 3], &[0.; 6])]),
        format!("{p}term `i1` has the invalid character '1'")
    );
    assert_eq!(e("...i...->i", &[a()]), format!("{p}term `...i...` has more than one `...`"));
    assert_eq!(
        e("...i,...i->...i", &[a(), f32s(&[4, 3], &[0.; 12])]),
        format!("{p}the `...` dimensions [2] and [4] (operand 1) do not broadcast")
    );
    assert_eq!(
        e("i,i", &[f32s(&[2], &[0.; 2]), Tensor::vector(&[1i32, 2])]),
        format!("{p}all operands must have the same element type, got f32[2] and i32[2]")
    );
    assert_eq!(
        e("i", &[Tensor::vector(&[true])]),
        format!("{p}needs numeric operands, got operand 0 bool[1]")
    );
}

// ----- Swish -----

#[test]
fn swish_is_x_times_sigmoid_of_alpha_x() {
    let x = f32s(&[3], &[-1., 0., 2.]);
    // x / (1 + exp(-alpha x)), computed in f64 with Python.
    let y = run_traced(&[x.clone()], |_, v| v[0].unary(UnaryOp::Swish { alpha: 1.0 }));
    assert_close(&y, &[3], &[-0.2689414213699951, 0.0, 1.7615941559557646], 1e-7);
    let y = run_traced(&[x], |_, v| v[0].unary(UnaryOp::Swish { alpha: 0.5 }));
    assert_close(&y, &[3], &[-0.3775406687981454, 0.0, 1.4621171572600098], 1e-7);
    let ty =
        traced_type(&[(DType::F16, &[2, 5])], |_, v| v[0].unary(UnaryOp::Swish { alpha: 2.0 }));
    assert_eq!(ty, Ok("f16[2,5]".into()));
}
