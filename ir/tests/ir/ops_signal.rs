//! BitCast, the window functions, CenterCropPad, Col2Im and Det: each op's shape rule and
//! interpreter against hand-computed values (or ONNX's reference, where said), and the errors
//! bad operands and attributes give.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{Col2Im, SignalWindow, WindowShape};
use kiln_ir::{eval, DType, Op, Tensor};

use super::{assert_close, f32s, run_traced, traced_type};

/// Runs one op on constant operands (shape operands must be constants for these rules).
fn run_const(op: Op, operands: &[Tensor]) -> Result<Tensor, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<_> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| Some(g.constant(&format!("c{i}"), t.clone())))
        .collect();
    let y = g.apply(op, &xs, 1)[0];
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    eval::run(&graph, &[]).map(|mut v| v.remove(0)).map_err(|e| e.to_string())
}

#[test]
fn bitcast_keeps_the_bits() {
    let x = f32s(&[3], &[1.0, -2.5, 3.75]);
    let y = run_traced(&[x], |g, v| g.apply(Op::BitCast { to: DType::I32 }, &[Some(v[0])], 1)[0]);
    assert_eq!(y.as_slice::<i32>().unwrap(), &[1065353216, -1071644672, 1081081856]);
    let x = Tensor::from_vec(&[2], vec![true, false]).unwrap();
    let y = run_traced(&[x], |g, v| g.apply(Op::BitCast { to: DType::U8 }, &[Some(v[0])], 1)[0]);
    assert_eq!(y.as_slice::<u8>().unwrap(), &[1, 0]);
    let err = traced_type(&[(DType::F32, &[2])], |g, v| {
        g.apply(Op::BitCast { to: DType::I64 }, &[Some(v[0])], 1)[0]
    })
    .unwrap_err();
    assert!(err.contains("(BitCast): cannot reinterpret f32[2] as i64"), "{err}");
}

fn window(shape: WindowShape, periodic: bool) -> Op {
    Op::SignalWindow(SignalWindow { shape, periodic, dtype: None })
}

#[test]
fn windows_match_onnx_reference_values() {
    // ONNX's test_hannwindow, test_hammingwindow_symmetric and test_blackmanwindow (size 10).
    let run = |op| run_const(op, &[Tensor::scalar(10i32)]).unwrap();
    let hann = run(window(WindowShape::Hann, true));
    assert_close(
        &hann,
        &[10],
        &[0.0, 0.0955, 0.3455, 0.6545, 0.9045, 1.0, 0.9045, 0.6545, 0.3455, 0.0955],
        1e-4,
    );
    let hamming = run(window(WindowShape::Hamming, false));
    // Symmetric: the ends are equal, 25/46 - 21/46.
    let h = hamming.to_f64s();
    assert!((h[0] - 4.0 / 46.0).abs() < 1e-6 && (h[9] - h[0]).abs() < 1e-6, "{h:?}");
    let blackman = run(window(WindowShape::Blackman, true));
    assert_eq!(blackman.dtype(), DType::F32);
    assert!((blackman.to_f64s()[5] - 1.0).abs() < 1e-6);
    // One symmetric point has no period: it is the first point, not 0/0.
    let one = run_const(window(WindowShape::Hann, false), &[Tensor::scalar(1i64)]).unwrap();
    assert_eq!(one.to_f64s(), [0.0]);
}

#[test]
fn windows_refuse_bad_sizes_and_types() {
    let err = run_const(window(WindowShape::Hann, true), &[Tensor::scalar(-3i64)]).unwrap_err();
    assert!(err.contains("size must not be negative, got -3"), "{err}");
    let err = run_const(window(WindowShape::Hann, true), &[Tensor::scalar(2.0f32)]).unwrap_err();
    assert!(err.contains("size must be an integer scalar, got f32[]"), "{err}");
    let op = Op::SignalWindow(SignalWindow {
        shape: WindowShape::Hann,
        periodic: true,
        dtype: Some(DType::I32),
    });
    let err = run_const(op, &[Tensor::scalar(4i64)]).unwrap_err();
    assert!(err.contains("output_datatype must be a float type, got i32"), "{err}");
}

#[test]
fn center_crop_pad_crops_down_and_pads_right() {
    // [5] to 2: crop starts at (5 - 2) / 2 = 1. [2] to 5: one zero left, two right.
    let x = f32s(&[5], &[1., 2., 3., 4., 5.]);
    let op = Op::CenterCropPad { axes: vec![] };
    let y = run_const(op.clone(), &[x, Tensor::vector(&[2i64])]).unwrap();
    assert_close(&y, &[2], &[2., 3.], 0.0);
    let x = f32s(&[2], &[1., 2.]);
    let y = run_const(op, &[x, Tensor::vector(&[5i64])]).unwrap();
    assert_close(&y, &[5], &[0., 1., 2., 0., 0.], 0.0);
    // Negative axes count from the end; the other axes keep their size.
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let op = Op::CenterCropPad { axes: vec![-1] };
    let y = run_const(op, &[x, Tensor::vector(&[1i64])]).unwrap();
    assert_close(&y, &[2, 1], &[2., 5.], 0.0);
}

#[test]
fn center_crop_pad_refuses_mismatched_axes() {
    let x = f32s(&[2, 3], &[0.; 6]);
    let op = Op::CenterCropPad { axes: vec![0, 0] };
    let err = run_const(op, &[x.clone(), Tensor::vector(&[1i64, 1])]).unwrap_err();
    assert!(err.contains("(CenterCropPad): axis 0 is listed twice"), "{err}");
    let op = Op::CenterCropPad { axes: vec![] };
    let err = run_const(op.clone(), &[x.clone(), Tensor::vector(&[1i64])]).unwrap_err();
    assert!(err.contains("shape has 1 entries, but there are 2 axes"), "{err}");
    let err = run_const(op, &[x, Tensor::vector(&[1i64, -1])]).unwrap_err();
    assert!(err.contains("has a negative size"), "{err}");
}

#[test]
fn col2im_sums_overlapping_blocks() {
    // A 1 x 3 image from blocks of 1 x 2 at stride 1: two columns, the middle pixel in both.
    let x = f32s(&[1, 2, 2], &[1., 2., 10., 20.]);
    let shapes = [Tensor::vector(&[1i64, 3]), Tensor::vector(&[1i64, 2])];
    let y = run_const(Op::Col2Im(Col2Im::default()), &[x, shapes[0].clone(), shapes[1].clone()])
        .unwrap();
    // Block element 0 of column 0 -> pixel 0, of column 1 -> pixel 1; element 1 -> 1 and 2.
    assert_close(&y, &[1, 1, 1, 3], &[1., 2. + 10., 20.], 0.0);
}

#[test]
fn col2im_refuses_inputs_the_blocks_do_not_fit() {
    let shapes = [Tensor::vector(&[1i64, 3]), Tensor::vector(&[1i64, 2])];
    // Three columns where the blocks fit twice.
    let x = f32s(&[1, 2, 3], &[0.; 6]);
    let err = run_const(Op::Col2Im(Col2Im::default()), &[x, shapes[0].clone(), shapes[1].clone()])
        .unwrap_err();
    assert!(err.contains("input has 3 columns, but blocks of [1, 2] fit 2 times"), "{err}");
    let x = f32s(&[1, 3, 2], &[0.; 6]);
    let err = run_const(Op::Col2Im(Col2Im::default()), &[x, shapes[0].clone(), shapes[1].clone()])
        .unwrap_err();
    assert!(err.contains("input channels 3 are not a multiple of the block's 2 elements"), "{err}");
    let x = f32s(&[1, 2, 2], &[0.; 4]);
    let c = Col2Im { strides: vec![1], ..Col2Im::default() };
    let err = run_const(Op::Col2Im(c), &[x, shapes[0].clone(), shapes[1].clone()]).unwrap_err();
    assert!(err.contains("strides [1] must have 2 entries"), "{err}");
}

#[test]
fn det_of_matrices_and_stacks() {
    let x = f32s(&[2, 2], &[0., 1., 2., 3.]);
    let y = run_traced(&[x], |g, v| g.apply(Op::Det, &[Some(v[0])], 1)[0]);
    assert_close(&y, &[], &[-2.0], 1e-6);
    // A row swap is needed (zero pivot), and a singular matrix gives 0.
    let x =
        f32s(&[2, 3, 3], &[0., 2., 1., 1., 0., 0., 0., 0., 3., 1., 2., 3., 2., 4., 6., 0., 1., 1.]);
    let y = run_traced(&[x], |g, v| g.apply(Op::Det, &[Some(v[0])], 1)[0]);
    assert_close(&y, &[2], &[-6.0, 0.0], 1e-6);
    let err = traced_type(&[(DType::F32, &[2, 3])], |g, v| g.apply(Op::Det, &[Some(v[0])], 1)[0]);
    assert!(err.unwrap_err().contains("(Det): needs square matrices, got f32[2,3]"));
    let err = traced_type(&[(DType::I32, &[2, 2])], |g, v| g.apply(Op::Det, &[Some(v[0])], 1)[0]);
    assert!(err.unwrap_err().contains("(Det): needs a float tensor"));
}
