//! ConvTranspose, LpPool, MaxPool indices, the normalisations, Resize.
//! Each op's shape rule and interpreter, against hand-computed values or values from ONNX's
//! reference implementation (onnx.reference, onnx 1.x in /tmp/devenv), pasted with a note.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{
    AspectRatioPolicy, AutoPad, ConvTranspose, CoordinateTransform, Lrn, NearestMode, Pool,
    PoolKind, Resize, ResizeMode, Window,
};
use kiln_ir::{eval, DType, Op, Tensor};

use super::{assert_close, f32s, run_traced, traced_type};

/// Runs `op` on `inputs` (graph inputs) and returns its first `n` results.
fn run_op(op: &Op, inputs: &[Tensor], n: usize) -> Vec<Tensor> {
    let g = GraphBuilder::new("t");
    let xs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| Some(g.input(&format!("x{i}"), t.dtype(), t.dims())))
        .collect();
    let ys = g.apply(op.clone(), &xs, n);
    for (i, y) in ys.into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    let graph = g.build().expect("the test graph is valid");
    eval::run(&graph, inputs).expect("the test graph runs")
}

/// The type of `op`'s first result for inputs of these types, or the build error.
fn op_type(op: &Op, inputs: &[(DType, &[usize])]) -> Result<String, String> {
    traced_type(inputs, |g, v| {
        g.apply(op.clone(), &v.iter().map(|&x| Some(x)).collect::<Vec<_>>(), 1)[0]
    })
}

#[track_caller]
fn assert_err(r: Result<String, String>, needle: &str) {
    match r {
        Ok(t) => panic!("expected an error containing {needle:?}, got type {t}"),
        Err(e) => assert!(e.contains(needle), "error {e:?} does not mention {needle:?}"),
    }
}

fn seq(n: usize) -> Vec<f32> {
    (0..n).map(|v| v as f32).collect()
}

// ----- ConvTranspose -----

fn conv_t(strides: &[usize], pads: &[usize], auto_pad: AutoPad) -> ConvTranspose {
    let n = strides.len();
    ConvTranspose {
        window: Window {
            strides: strides.to_vec(),
            dilations: vec![1; n],
            pads: pads.to_vec(),
            auto_pad,
        },
        group: 1,
        output_padding: vec![],
        output_shape: vec![],
    }
}

fn ct1d(c: ConvTranspose, x: &[f32], w: &[f32]) -> Tensor {
    let x = f32s(&[1, 1, x.len()], x);
    let w = f32s(&[1, 1, w.len()], w);
    run_op(&Op::ConvTranspose(c), &[x, w], 1).remove(0)
}

#[test]
fn conv_transpose_1d_strides_pads_and_output_padding() {
    // Each input value spreads a copy of the kernel, stride 2 apart: [1,1,1] + [0,0,2,2,2] + ...
    let full = ct1d(conv_t(&[2], &[], AutoPad::NotSet), &[1., 2., 3.], &[1., 1., 1.]);
    assert_close(&full, &[1, 1, 7], &[1., 1., 3., 2., 5., 3., 3.], 0.0);
    // Pads cut 1 from the start and 2 from the end; output_padding adds one back at the end.
    let mut c = conv_t(&[2], &[1, 2], AutoPad::NotSet);
    c.output_padding = vec![1];
    assert_close(&ct1d(c, &[1., 2., 3.], &[1., 1., 1.]), &[1, 1, 5], &[1., 3., 2., 5., 3.], 0.0);
    let valid = ct1d(conv_t(&[2], &[5, 5], AutoPad::Valid), &[1., 2., 3.], &[1., 1., 1.]);
    assert_close(&valid, &[1, 1, 7], &[1., 1., 3., 2., 5., 3., 3.], 0.0);
}

#[test]
fn conv_transpose_output_shape_derives_the_padding() {
    let with_shape = |out: usize, auto_pad| {
        let mut c = conv_t(&[2], &[], auto_pad);
        c.output_shape = vec![out];
        ct1d(c, &[1., 2., 3.], &[1., 1., 1.])
    };
    // Full size 7; asking for 5 removes one from each side, 6 removes the odd one at the start
    // (at the end for SAME_UPPER).
    assert_close(&with_shape(5, AutoPad::NotSet), &[1, 1, 5], &[1., 3., 2., 5., 3.], 0.0);
    assert_close(&with_shape(6, AutoPad::NotSet), &[1, 1, 6], &[1., 3., 2., 5., 3., 3.], 0.0);
    assert_close(&with_shape(6, AutoPad::SameUpper), &[1, 1, 6], &[1., 1., 3., 2., 5., 3.], 0.0);
    // A larger output pads with zeros; the ONNX reference splits the negative total with floor
    // division (test_convtranspose_output_shape has its extra row and column at the end).
    assert_close(
        &with_shape(8, AutoPad::NotSet),
        &[1, 1, 8],
        &[1., 1., 3., 2., 5., 3., 3., 0.],
        0.0,
    );
    assert_close(
        &with_shape(9, AutoPad::SameUpper),
        &[1, 1, 9],
        &[0., 1., 1., 3., 2., 5., 3., 3., 0.],
        0.0,
    );
}

#[test]
fn conv_transpose_same_padding_gives_input_times_stride() {
    // Kernel 1, stride 2: the full result [1,0,2,0,3] is one short of 3 * 2; the total padding is
    // -1 (values from onnx.reference).
    let upper = ct1d(conv_t(&[2], &[], AutoPad::SameUpper), &[1., 2., 3.], &[1.]);
    assert_close(&upper, &[1, 1, 6], &[0., 1., 0., 2., 0., 3.], 0.0);
    let lower = ct1d(conv_t(&[2], &[], AutoPad::SameLower), &[1., 2., 3.], &[1.]);
    assert_close(&lower, &[1, 1, 6], &[1., 0., 2., 0., 3., 0.], 0.0);
    // Kernel 3: total padding 1, at the end for SAME_UPPER and at the start for SAME_LOWER.
    let upper = ct1d(conv_t(&[2], &[], AutoPad::SameUpper), &[1., 2., 3.], &[1., 1., 1.]);
    assert_close(&upper, &[1, 1, 6], &[1., 1., 3., 2., 5., 3.], 0.0);
    let lower = ct1d(conv_t(&[2], &[], AutoPad::SameLower), &[1., 2., 3.], &[1., 1., 1.]);
    assert_close(&lower, &[1, 1, 6], &[1., 3., 2., 5., 3., 3.], 0.0);
}

#[test]
fn conv_transpose_2d_matches_the_onnx_examples() {
    // The ONNX ConvTranspose documentation example: 3x3 arange, 3x3 kernels of ones, 2 channels.
    let x = f32s(&[1, 1, 3, 3], &seq(9));
    let w = Tensor::full(DType::F32, &[1, 2, 3, 3], 1.0);
    let y = run_op(
        &Op::ConvTranspose(conv_t(&[1, 1], &[], AutoPad::NotSet)),
        &[x.clone(), w.clone()],
        1,
    )
    .remove(0);
    #[rustfmt::skip]
    let plane = [0., 1., 3., 3., 2., 3., 8., 15., 12., 7., 9., 21., 36., 27., 15., 9., 20., 33., 24., 13., 6., 13., 21., 15., 8.];
    assert_close(&y, &[1, 2, 5, 5], &[plane, plane].concat(), 0.0);
    // Strides [3, 2] with pads [1, 2, 1, 2] (test_convtranspose_pads; from onnx.reference).
    let y = run_op(&Op::ConvTranspose(conv_t(&[3, 2], &[1, 2, 1, 2], AutoPad::NotSet)), &[x, w], 1)
        .remove(0);
    #[rustfmt::skip]
    let plane = [1., 1., 3., 1., 1., 3., 7., 4., 9., 7., 4., 9., 7., 4., 9., 13., 7., 15., 13., 7., 15.];
    assert_close(&y, &[1, 2, 7, 3], &[plane, plane].concat(), 0.0);
    // Dilation 2 (test_convtranspose_dilations; from onnx.reference).
    let x = f32s(&[1, 1, 3, 3], &[3., 8., 1., 9., 5., 7., 3., 2., 6.]);
    let w = f32s(&[1, 1, 2, 2], &[7., 2., 1., 9.]);
    let mut c = conv_t(&[1, 1], &[], AutoPad::NotSet);
    c.window.dilations = vec![2, 2];
    let y = run_op(&Op::ConvTranspose(c), &[x, w], 1).remove(0);
    #[rustfmt::skip]
    let want = [21., 56., 13., 16., 2., 63., 35., 67., 10., 14., 24., 22., 76., 76., 21., 9., 5., 88., 45., 63., 3., 2., 33., 18., 54.];
    assert_close(&y, &[1, 1, 5, 5], &want, 0.0);
}

#[test]
fn conv_transpose_groups_and_bias_per_output_channel() {
    // Two groups of one input channel and two output channels each, 1x kernels: each input
    // channel scales its group's two weights; bias is per output channel.
    let x = f32s(&[1, 2, 1], &[1., 10.]);
    let w = f32s(&[2, 2, 1], &[1., 2., 3., 4.]);
    let b = f32s(&[4], &[0.5, 0., 0., -1.]);
    let mut c = conv_t(&[1], &[], AutoPad::NotSet);
    c.group = 2;
    let y = run_op(&Op::ConvTranspose(c.clone()), &[x, w, b], 1).remove(0);
    assert_close(&y, &[1, 4, 1], &[1.5, 2., 30., 39.], 0.0);
    // f64 stays f64; two images.
    let x = Tensor::from_vec(&[2, 2, 1], vec![1.0f64, 10., 0.1, 0.2]).unwrap();
    let w = Tensor::from_vec(&[2, 2, 1], vec![1.0f64, 2., 3., 4.]).unwrap();
    let y = run_op(&Op::ConvTranspose(c), &[x, w], 1).remove(0);
    assert_eq!(
        y.as_slice::<f64>().unwrap(),
        &[1., 2., 30., 40., 0.1, 0.2, 0.6000000000000001, 0.8]
    );
}

#[test]
fn conv_transpose_shapes() {
    let f = DType::F32;
    let op = |c: ConvTranspose| Op::ConvTranspose(c);
    let mut c = conv_t(&[3, 2], &[], AutoPad::NotSet);
    c.group = 2;
    c.output_padding = vec![1, 1];
    // M = weight dim 1 times group; size = stride * (in - 1) + output_padding + kernel.
    assert_eq!(
        op_type(&op(c.clone()), &[(f, &[1, 4, 3, 3]), (f, &[4, 3, 3, 3])]),
        Ok("f32[1,6,10,8]".into())
    );
    let mut s = c.clone();
    s.output_shape = vec![1, 6, 9, 7];
    assert_eq!(
        op_type(&op(s.clone()), &[(f, &[1, 4, 3, 3]), (f, &[4, 3, 3, 3])]),
        Ok("f32[1,6,9,7]".into())
    );
    let same = conv_t(&[2, 3, 1], &[], AutoPad::SameLower);
    assert_eq!(
        op_type(&op(same), &[(f, &[2, 1, 3, 4, 5]), (f, &[1, 2, 3, 3, 3])]),
        Ok("f32[2,2,6,12,5]".into())
    );
    // Sizes known only at run time get symbols, unless output_shape gives them.
    let sym = traced_type(&[(f, &[1, 4, 3, 3]), (f, &[4, 3, 3, 3])], |g, v| {
        let x = g.input(
            "dyn",
            DType::F32,
            kiln_ir::Shape(vec!["n".into(), 4.into(), "h".into(), 3.into()]),
        );
        let _ = v;
        g.apply(op(c.clone()), &[Some(x), Some(v[1])], 1)[0]
    });
    assert_eq!(sym, Ok("f32[n,6,\"convtranspose.d2\",8]".into()));
    let fixed = traced_type(&[(f, &[4, 3, 3, 3])], |g, v| {
        let x = g.input(
            "dyn",
            DType::F32,
            kiln_ir::Shape(vec!["n".into(), 4.into(), "h".into(), "w".into()]),
        );
        g.apply(op(s.clone()), &[Some(x), Some(v[0])], 1)[0]
    });
    assert_eq!(fixed, Ok("f32[n,6,9,7]".into()));
}

#[test]
fn conv_transpose_errors_name_the_shapes() {
    let f = DType::F32;
    let plain = Op::ConvTranspose(conv_t(&[1, 1], &[], AutoPad::NotSet));
    assert_err(
        op_type(&plain, &[(f, &[1, 3, 4, 4]), (f, &[2, 1, 3, 3])]),
        "input f32[1,3,4,4] has 3 channels but weight f32[2,1,3,3] is for 2",
    );
    let mut grouped = conv_t(&[1, 1], &[], AutoPad::NotSet);
    grouped.group = 2;
    assert_err(
        op_type(&Op::ConvTranspose(grouped), &[(f, &[1, 3, 4, 4]), (f, &[3, 1, 3, 3])]),
        "3 input channels of f32[1,3,4,4] do not split into 2 groups",
    );
    assert_err(
        op_type(&plain, &[(f, &[1, 2, 4, 4]), (f, &[2, 1, 3, 3]), (f, &[2])]),
        "bias must be [M] = [1], got f32[2]",
    );
    assert_err(
        op_type(&plain, &[(f, &[1, 2, 4]), (f, &[2, 1, 3, 3])]),
        "must have the same rank of 3 or more",
    );
    let cut = Op::ConvTranspose(conv_t(&[1], &[2, 2], AutoPad::NotSet));
    assert_err(
        op_type(&cut, &[(f, &[1, 1, 1]), (f, &[1, 1, 3])]),
        "pads 2 and 2 remove the whole output (3) on spatial axis 0",
    );
    let mut bad = conv_t(&[1, 1], &[], AutoPad::NotSet);
    bad.output_padding = vec![1];
    assert_err(
        op_type(&Op::ConvTranspose(bad), &[(f, &[1, 1, 4, 4]), (f, &[1, 1, 3, 3])]),
        "output_padding has 1 entries, 2 expected",
    );
    assert_err(
        op_type(&plain, &[(DType::I32, &[1, 1, 4, 4]), (DType::I32, &[1, 1, 3, 3])]),
        "needs a float type",
    );
}

// ----- pooling -----

fn pool(kind: PoolKind, kernel: &[usize], strides: &[usize], pads: &[usize]) -> Pool {
    let n = kernel.len();
    let strides = if strides.is_empty() { vec![1; n] } else { strides.to_vec() };
    let pads = if pads.is_empty() { vec![0; 2 * n] } else { pads.to_vec() };
    Pool {
        kind,
        kernel: kernel.to_vec(),
        window: Window { strides, dilations: vec![1; n], pads, auto_pad: AutoPad::NotSet },
        ceil_mode: false,
        column_major_indices: false,
    }
}

#[test]
fn max_pool_indices_are_flat_indices_into_the_input() {
    // Two channels of 4x4 arange: the maxima are the bottom-right cells 5, 7, 13, 15, and the
    // second channel's indices continue after the first channel's 16 cells.
    let x = f32s(&[1, 2, 4, 4], &seq(32));
    let p = pool(PoolKind::Max, &[2, 2], &[2, 2], &[]);
    let r = run_op(&Op::Pool(p.clone()), &[x.clone()], 2);
    assert_close(&r[0], &[1, 2, 2, 2], &[5., 7., 13., 15., 21., 23., 29., 31.], 0.0);
    assert_eq!(r[1].dtype(), DType::I64);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[5, 7, 13, 15, 21, 23, 29, 31]);
    // storage_order 1: cell (h, w) of an image is h + 4 w.
    let cm = Pool { column_major_indices: true, ..p };
    let r = run_op(&Op::Pool(cm), &[x], 2);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[5, 13, 7, 15, 21, 29, 23, 31]);
}

#[test]
fn max_pool_indices_skip_padding_and_take_the_first_maximum() {
    // Ties: the first cell in window order wins. Padding never counts: the corner window of a
    // padded 3x3 reads cells 0, 1, 3, 4 only.
    let x = f32s(&[1, 1, 3, 3], &[2., 2., 1., 2., 2., 1., 0., 0., 9.]);
    let r = run_op(&Op::Pool(pool(PoolKind::Max, &[2, 2], &[2, 2], &[1, 1, 1, 1])), &[x], 2);
    assert_close(&r[0], &[1, 1, 2, 2], &[2., 2., 2., 9.], 0.0);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[0, 1, 3, 8]);
    // 1-D with a batch of two, and 3-D.
    let x = f32s(&[2, 1, 3], &[1., 3., 2., 5., 4., 4.]);
    let r = run_op(&Op::Pool(pool(PoolKind::Max, &[2], &[], &[])), &[x], 2);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[1, 1, 3, 4]);
    let x = f32s(&[1, 1, 2, 2, 2], &[0., 1., 2., 3., 4., 5., 7., 6.]);
    let r = run_op(&Op::Pool(pool(PoolKind::Max, &[2, 2, 2], &[], &[])), &[x.clone()], 2);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[6]);
    // Column-major in 3-D: (d, h, w) = (1, 1, 0) is 1 + 2 * 1 + 4 * 0.
    let cm = Pool { column_major_indices: true, ..pool(PoolKind::Max, &[2, 2, 2], &[], &[]) };
    assert_eq!(run_op(&Op::Pool(cm), &[x], 2)[1].as_slice::<i64>().unwrap(), &[3]);
    // The node type lists both results.
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::U8, [1, 1, 5, 5]);
    let ys = g.apply(Op::Pool(pool(PoolKind::Max, &[2, 2], &[2, 2], &[])), &[Some(x)], 2);
    g.output("y", ys[0]);
    g.output("i", ys[1]);
    let graph = g.build().unwrap();
    assert_eq!(graph.value_type(graph.outputs()[1].1).to_string(), "i64[1,1,2,2]");
}

#[test]
fn average_pool_without_indices_has_one_result() {
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::F32, [1, 1, 4, 4]);
    let ys = g.apply(
        Op::Pool(pool(PoolKind::Average { count_include_pad: false }, &[2, 2], &[], &[])),
        &[Some(x)],
        2,
    );
    g.output("y", ys[0]);
    assert!(g.build().unwrap_err().to_string().contains("has 1 results, 2 asked for"));
}

#[test]
fn average_pool_ceil_mode_counts_only_the_padded_input() {
    // Kernel 3, stride 2, pads [1, 0], ceil_mode: windows [-1, 1], [1, 3], [3, 5]; with
    // count_include_pad the first divides by 3 (one pad cell) and the last by 2 (cell 5 is
    // beyond the padded input). Agrees with onnxruntime.
    let x = f32s(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let mut p = pool(PoolKind::Average { count_include_pad: true }, &[3], &[2], &[1, 0]);
    p.ceil_mode = true;
    let y = run_op(&Op::Pool(p.clone()), &[x.clone()], 1).remove(0);
    assert_close(&y, &[1, 1, 3], &[1., 3., 4.5], 1e-6);
    p.kind = PoolKind::Average { count_include_pad: false };
    let y = run_op(&Op::Pool(p), &[x], 1).remove(0);
    assert_close(&y, &[1, 1, 3], &[1.5, 3., 4.5], 1e-6);
}

#[test]
fn lp_pool_and_global_lp_pool() {
    let x = f32s(&[1, 1, 4], &[3., -4., 0., 5.]);
    let y =
        run_op(&Op::Pool(pool(PoolKind::Lp { p: 2 }, &[2], &[2], &[])), &[x.clone()], 1).remove(0);
    assert_close(&y, &[1, 1, 2], &[5., 5.], 1e-6);
    let y =
        run_op(&Op::Pool(pool(PoolKind::Lp { p: 1 }, &[2], &[1], &[])), &[x.clone()], 1).remove(0);
    assert_close(&y, &[1, 1, 3], &[7., 4., 5.], 1e-6);
    // Padding contributes nothing: windows [pad, 3], [-4, 0], [5, pad].
    let y = run_op(&Op::Pool(pool(PoolKind::Lp { p: 3 }, &[2], &[2], &[1, 1])), &[x.clone()], 1)
        .remove(0);
    assert_close(&y, &[1, 1, 3], &[3., 4., 5.], 1e-5);
    let y = run_op(
        &Op::GlobalPool(PoolKind::Lp { p: 2 }),
        &[f32s(&[1, 2, 1, 2], &[3., 4., 6., -8.])],
        1,
    )
    .remove(0);
    assert_close(&y, &[1, 2, 1, 1], &[5., 10.], 1e-6);
    let y = run_op(&Op::GlobalPool(PoolKind::Lp { p: 1 }), &[x], 1).remove(0);
    assert_close(&y, &[1, 1, 1], &[12.], 1e-6);
    assert_err(
        op_type(&Op::GlobalPool(PoolKind::Lp { p: 0 }), &[(DType::F32, &[1, 1, 4])]),
        "GlobalLpPool needs p >= 1",
    );
    assert_err(
        op_type(
            &Op::Pool(pool(PoolKind::Lp { p: 0 }, &[2], &[], &[])),
            &[(DType::F32, &[1, 1, 4])],
        ),
        "LpPool needs p >= 1",
    );
    assert_err(
        op_type(&Op::Pool(pool(PoolKind::Max, &[0], &[], &[])), &[(DType::F32, &[1, 1, 4])]),
        "kernel_shape [0] has a zero size",
    );
}

#[test]
fn pool_shapes_with_dilation_and_auto_pad() {
    let f = DType::F32;
    let mut p = pool(PoolKind::Max, &[2, 2], &[], &[]);
    p.window.dilations = vec![2, 2];
    assert_eq!(op_type(&Op::Pool(p.clone()), &[(f, &[1, 1, 4, 4])]), Ok("f32[1,1,2,2]".into()));
    p.window.auto_pad = AutoPad::SameUpper;
    p.window.strides = vec![2, 3];
    assert_eq!(op_type(&Op::Pool(p.clone()), &[(f, &[1, 1, 5, 7])]), Ok("f32[1,1,3,3]".into()));
    p.window.auto_pad = AutoPad::Valid;
    // VALID: floor((5 - 3) / 2) + 1 and floor((7 - 3) / 3) + 1.
    assert_eq!(op_type(&Op::Pool(p), &[(f, &[1, 1, 5, 7])]), Ok("f32[1,1,2,2]".into()));
}

// ----- normalisations -----

#[test]
fn log_softmax_is_stable_for_large_inputs() {
    // log(softmax([1, 2, 3])) = x - 3 - log(1 + e^-1 + e^-2), with log(...) = 0.40760596444438.
    let y = run_op(
        &Op::LogSoftmax { axis: -1 },
        &[f32s(&[2, 3], &[1., 2., 3., 1000., 1000., 1000.])],
        1,
    )
    .remove(0);
    let c = 0.4076059644443804;
    let l3 = -(3f64).ln();
    assert_close(&y, &[2, 3], &[-2. - c, -1. - c, -c, l3, l3, l3], 1e-6);
    let y = run_op(&Op::LogSoftmax { axis: 0 }, &[f32s(&[2, 1], &[0., 0.])], 1).remove(0);
    assert_close(&y, &[2, 1], &[-(2f64).ln(), -(2f64).ln()], 1e-7);
}

#[test]
fn hardmax_marks_the_first_maximum() {
    let x = f32s(&[2, 4], &[3., 3., 3., 1., -1., 0., 7., 7.]);
    let y = run_op(&Op::Hardmax { axis: 1 }, &[x.clone()], 1).remove(0);
    assert_close(&y, &[2, 4], &[1., 0., 0., 0., 0., 0., 1., 0.], 0.0);
    let y = run_op(&Op::Hardmax { axis: 0 }, &[x], 1).remove(0);
    assert_close(&y, &[2, 4], &[1., 1., 0., 0., 0., 0., 1., 1.], 0.0);
    let h = run_op(&Op::Hardmax { axis: -1 }, &[Tensor::vector(&[1.0f64, 2.0])], 1).remove(0);
    assert_eq!(h.as_slice::<f64>().unwrap(), &[0., 1.]);
}

#[test]
fn instance_and_group_norm() {
    // Channel 0 is [1, 3] (mean 2, variance 1), channel 1 is [5, 7]: each becomes [-1, 1], then
    // scaled and shifted per channel.
    let x = f32s(&[1, 2, 1, 2], &[1., 3., 5., 7.]);
    let scale = f32s(&[2], &[2., 1.]);
    let bias = f32s(&[2], &[0., 10.]);
    let y =
        run_op(&Op::InstanceNorm { epsilon: 0.0 }, &[x.clone(), scale.clone(), bias.clone()], 1)
            .remove(0);
    assert_close(&y, &[1, 2, 1, 2], &[-2., 2., 9., 11.], 1e-6);
    // Two groups of one channel are instance normalisation.
    let y = run_op(
        &Op::GroupNorm { num_groups: 2, epsilon: 0.0 },
        &[x.clone(), scale.clone(), bias.clone()],
        1,
    )
    .remove(0);
    assert_close(&y, &[1, 2, 1, 2], &[-2., 2., 9., 11.], 1e-6);
    // One group: mean 4, variance 5 over both channels; epsilon 0.5 adds to the variance.
    // (x - 4) / sqrt(5.5) = [-1.2792042981336627, -0.42640143271122083, 0.4264..., 1.2792...].
    let y = run_op(&Op::GroupNorm { num_groups: 1, epsilon: 0.5 }, &[x, scale, bias], 1).remove(0);
    let n = [-1.2792042981336627, -0.42640143271122083, 0.42640143271122083, 1.2792042981336627];
    assert_close(&y, &[1, 2, 1, 2], &[2. * n[0], 2. * n[1], n[2] + 10., n[3] + 10.], 1e-6);
    // Four channels in two groups of two (from onnx.reference, opset 21).
    let x = f32s(&[1, 4, 3, 2], &(0..24).map(|v| (v as f32).powf(1.5)).collect::<Vec<_>>());
    let y = run_op(
        &Op::GroupNorm { num_groups: 2, epsilon: 1e-5 },
        &[x, f32s(&[4], &[1., 2., -1., 0.5]), f32s(&[4], &[0., 1., 0., -1.])],
        1,
    )
    .remove(0);
    #[rustfmt::skip]
    let want = [-1.2612990140914917, -1.1768159866333008, -1.022344708442688, -0.8223118782043457, -0.5854341387748718, -0.31674909591674805,
        0.9606882929801941, 1.6067001819610596, 2.300671339035034, 3.039490222930908, 3.8205831050872803, 4.641775131225586,
        1.513105869293213, 1.2678126096725464, 1.012893795967102, 0.7487000823020935, 0.4755464494228363, 0.19371771812438965,
        -0.9517366290092468, -0.8025250434875488, -0.6493332982063293, -0.49226218461990356, -0.3314054608345032, -0.16685009002685547];
    assert_close(&y, &[1, 4, 3, 2], &want, 1e-5);
}

#[test]
fn rms_norm_over_trailing_axes_with_broadcast_scale() {
    // Rows [3, 4] and [0, 0]: rms sqrt(12.5) and sqrt(epsilon).
    let x = f32s(&[2, 2], &[3., 4., 0., 0.]);
    let y = run_op(&Op::RmsNorm { axis: -1, epsilon: 0.0 }, &[x.clone(), f32s(&[2], &[1., 2.])], 1)
        .remove(0);
    assert_close(
        &y,
        &[2, 2],
        &[0.848528137423857, 2. * 1.131370849898476, f64::NAN, f64::NAN],
        1e-6,
    );
    // Over both axes: mean of squares 6.25, +1 epsilon; a scale of [2, 1] broadcasts down rows.
    let y =
        run_op(&Op::RmsNorm { axis: 0, epsilon: 1.0 }, &[x, f32s(&[2, 1], &[1., 2.])], 1).remove(0);
    let r = (6.25f64 + 1.0).sqrt();
    assert_close(&y, &[2, 2], &[3. / r, 4. / r, 0., 0.], 1e-6);
    assert_err(
        op_type(
            &Op::RmsNorm { axis: -1, epsilon: 0.0 },
            &[(DType::F32, &[2, 3]), (DType::F32, &[2])],
        ),
        "scale f32[2] does not broadcast to the input f32[2,3]",
    );
    assert_err(
        op_type(
            &Op::RmsNorm { axis: 2, epsilon: 0.0 },
            &[(DType::F32, &[2, 3]), (DType::F32, &[3])],
        ),
        "axis 2 is out of range for f32[2,3]",
    );
}

#[test]
fn lrn_sums_squares_over_neighbouring_channels() {
    // Channels [1, 2, 3], size 3 (one channel each side): square sums 5, 14, 13;
    // y = x / (2 + 0.3 / 3 * sum) ^ 0.75.
    let x = f32s(&[1, 3, 1, 1], &[1., 2., 3.]);
    let lrn = |size| Op::Lrn(Lrn { alpha: 0.3, beta: 0.75, bias: 2.0, size });
    let y = run_op(&lrn(3), &[x.clone()], 1).remove(0);
    assert_close(
        &y,
        &[1, 3, 1, 1],
        &[0.5029733718731741, 0.7987682757159082, 1.225281284102679],
        1e-6,
    );
    // An even size reaches one further after than before: sums 5, 13, 9 with alpha / size 0.15.
    let y = run_op(&lrn(2), &[x], 1).remove(0);
    assert_close(
        &y,
        &[1, 3, 1, 1],
        &[0.46827446852752624, 0.7138092539782174, 1.2115396991017322],
        1e-6,
    );
    assert_err(op_type(&lrn(0), &[(DType::F32, &[1, 3, 2])]), "size must be positive");
    assert_err(op_type(&lrn(3), &[(DType::F32, &[1, 3])]), "input must be [N, C, spatial...]");
}

#[test]
fn lp_norm_and_mean_variance_norm() {
    let x = f32s(&[2, 2], &[3., -4., 0., 0.]);
    let y = run_op(&Op::LpNorm { axis: 1, p: 2 }, &[x.clone()], 1).remove(0);
    assert_close(&y, &[2, 2], &[0.6, -0.8, 0., 0.], 1e-7);
    let y = run_op(&Op::LpNorm { axis: -1, p: 1 }, &[x.clone()], 1).remove(0);
    assert_close(&y, &[2, 2], &[3. / 7., -4. / 7., 0., 0.], 1e-7);
    let y = run_op(&Op::LpNorm { axis: 0, p: 1 }, &[x], 1).remove(0);
    assert_close(&y, &[2, 2], &[1., -1., 0., 0.], 1e-7);
    assert_err(
        op_type(&Op::LpNorm { axis: 0, p: 3 }, &[(DType::F32, &[2])]),
        "p must be 1 or 2, got 3",
    );
    // MVN over axes 0 and 2 of [2, 2, 2]: channel 0 holds 1, 3, 5, 7 (mean 4, std sqrt(5)),
    // channel 1 holds 2, 2, 2, 2 (std 0: zeros).
    let x = f32s(&[2, 2, 2], &[1., 3., 2., 2., 5., 7., 2., 2.]);
    let y = run_op(&Op::MeanVarianceNorm { axes: vec![0, -1] }, &[x], 1).remove(0);
    let s = 5f64.sqrt();
    assert_close(&y, &[2, 2, 2], &[-3. / s, -1. / s, 0., 0., 1. / s, 3. / s, 0., 0.], 1e-6);
    assert_err(
        op_type(&Op::MeanVarianceNorm { axes: vec![0, -2] }, &[(DType::F32, &[2, 2])]),
        "name axis 0 twice",
    );
    assert_err(
        op_type(&Op::MeanVarianceNorm { axes: vec![0, 2, 3] }, &[(DType::F32, &[2, 2])]),
        "axis 2 is out of range for f32[2,2]",
    );
}

#[test]
fn normalisation_shape_errors() {
    let f = DType::F32;
    let gn = Op::GroupNorm { num_groups: 2, epsilon: 1e-5 };
    assert_eq!(op_type(&gn, &[(f, &[2, 4, 3]), (f, &[4]), (f, &[4])]), Ok("f32[2,4,3]".into()));
    assert_err(
        op_type(&gn, &[(f, &[2, 3, 3]), (f, &[3]), (f, &[3])]),
        "3 channels of f32[2,3,3] do not split into 2 groups",
    );
    assert_err(
        op_type(&gn, &[(f, &[2, 4, 3]), (f, &[2]), (f, &[4])]),
        "scale must be [C] = [4] for input f32[2,4,3], got f32[2]",
    );
    let zero = Op::GroupNorm { num_groups: 0, epsilon: 1e-5 };
    assert_err(
        op_type(&zero, &[(f, &[2, 4, 3]), (f, &[4]), (f, &[4])]),
        "num_groups must be positive",
    );
    let inst = Op::InstanceNorm { epsilon: 1e-5 };
    assert_err(
        op_type(&inst, &[(f, &[2, 4, 3]), (f, &[4]), (DType::F64, &[4])]),
        "input and bias must have the same element type",
    );
    assert_err(op_type(&Op::LogSoftmax { axis: 0 }, &[(DType::I32, &[3])]), "needs a float type");
    assert_err(op_type(&Op::Hardmax { axis: 1 }, &[(f, &[3])]), "axis 1 is out of range");
}

// ----- Resize -----

fn resize_op(mode: ResizeMode, ct: CoordinateTransform) -> Resize {
    Resize { mode, coordinate_transform: ct, ..Resize::default() }
}

/// Resize with constant roi/scales/sizes operands (as an importer makes them).
fn resize(
    r: &Resize,
    x: Tensor,
    roi: Option<&[f32]>,
    scales: Option<&[f32]>,
    sizes: Option<&[i64]>,
) -> Tensor {
    run_traced(&[x], |g, v| {
        let roi = roi.map(|r| g.constant("roi", Tensor::vector(r)));
        let scales = scales.map(|s| g.constant("scales", Tensor::vector(s)));
        let sizes = sizes.map(|s| g.constant("sizes", Tensor::vector(s)));
        g.apply(Op::Resize(r.clone()), &[Some(v[0]), roi, scales, sizes], 1)[0]
    })
}

#[test]
fn resize_nearest_and_linear_match_the_onnx_examples() {
    let x = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let nearest = resize(&Resize::default(), x.clone(), None, Some(&[1., 1., 2., 3.]), None);
    #[rustfmt::skip]
    let want = [1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2., 3., 3., 3., 4., 4., 4., 3., 3., 3., 4., 4., 4.];
    assert_close(&nearest, &[1, 1, 4, 6], &want, 0.0);
    let linear = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::HalfPixel),
        x.clone(),
        None,
        Some(&[1., 1., 2., 2.]),
        None,
    );
    #[rustfmt::skip]
    let want = [1., 1.25, 1.75, 2., 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3., 3.25, 3.75, 4.];
    assert_close(&linear, &[1, 1, 4, 4], &want, 0.0);
    // align_corners: x_in = y * (2 - 1) / (4 - 1), thirds.
    let ac = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::AlignCorners),
        x,
        None,
        Some(&[1., 1., 2., 2.]),
        None,
    );
    let t = 1. / 3.;
    #[rustfmt::skip]
    let want = [1., 1. + t, 2. - t, 2., 1. + 2. * t, 2., 2. + t, 3. - t, 2. + t, 3. - t, 3., 3. + t, 3., 3. + t, 4. - t, 4.];
    assert_close(&ac, &[1, 1, 4, 4], &want, 1e-6);
}

#[test]
fn resize_nearest_modes() {
    // Asymmetric upsampling by 2: input coordinates 0, 0.5, 1, 1.5, 2, 2.5.
    let x = f32s(&[3], &[10., 20., 30.]);
    let run = |mode| {
        let r = Resize {
            nearest_mode: mode,
            coordinate_transform: CoordinateTransform::Asymmetric,
            ..Resize::default()
        };
        resize(&r, x.clone(), None, Some(&[2.]), None).to_f64s()
    };
    assert_eq!(run(NearestMode::RoundPreferFloor), [10., 10., 20., 20., 30., 30.]);
    assert_eq!(run(NearestMode::RoundPreferCeil), [10., 20., 20., 30., 30., 30.]);
    assert_eq!(run(NearestMode::Floor), [10., 10., 20., 20., 30., 30.]);
    assert_eq!(run(NearestMode::Ceil), [10., 20., 20., 30., 30., 30.]);
    // Half-pixel downsampling of 4 by 0.75: coordinates 1/6, 3/2, 17/6 (from onnx.reference).
    let x = f32s(&[4], &[10., 20., 30., 40.]);
    let run = |mode| {
        resize(
            &Resize { nearest_mode: mode, ..Resize::default() },
            x.clone(),
            None,
            Some(&[0.75]),
            None,
        )
        .to_f64s()
    };
    assert_eq!(run(NearestMode::RoundPreferFloor), [10., 20., 40.]);
    assert_eq!(run(NearestMode::RoundPreferCeil), [10., 30., 40.]);
    assert_eq!(run(NearestMode::Floor), [10., 20., 30.]);
    assert_eq!(run(NearestMode::Ceil), [20., 30., 40.]);
}

#[test]
fn resize_cubic_and_antialias_match_the_reference() {
    // All values from onnx.reference (op_resize.py).
    let x4 = f32s(&[1, 1, 4, 4], &(1..=16).map(|v| v as f32).collect::<Vec<_>>());
    let cubic = resize(
        &resize_op(ResizeMode::Cubic, CoordinateTransform::HalfPixel),
        x4.clone(),
        None,
        Some(&[1., 1., 0.8, 0.8]),
        None,
    );
    #[rustfmt::skip]
    let want = [1.47119140625, 2.78125, 4.08251953125, 6.71142578125, 8.021484375, 9.32275390625, 11.91650390625, 13.2265625, 14.527831077575684];
    assert_close(&cubic, &[1, 1, 3, 3], &want, 1e-5);
    let x = f32s(&[4], &[1., 2., 4., 8.]);
    let up = resize(
        &resize_op(ResizeMode::Cubic, CoordinateTransform::HalfPixel),
        x.clone(),
        None,
        Some(&[2.]),
        None,
    );
    assert_close(
        &up,
        &[8],
        &[0.89453125, 1.15625, 1.5625, 2.41796875, 3.16015625, 5.1171875, 7.1640625, 8.421875],
        1e-6,
    );
    let excl = Resize {
        cubic_coeff_a: -0.5,
        exclude_outside: true,
        ..resize_op(ResizeMode::Cubic, CoordinateTransform::HalfPixel)
    };
    #[rustfmt::skip]
    let want = [0.9117646813392639, 1.1459853649139404, 1.6412214040756226, 2.3828125, 3.3359375, 5.022900581359863, 7.284671306610107, 8.352941513061523];
    assert_close(&resize(&excl, x, None, Some(&[2.]), None), &[8], &want, 1e-6);
    let aa =
        Resize { antialias: true, ..resize_op(ResizeMode::Linear, CoordinateTransform::HalfPixel) };
    assert_close(
        &resize(&aa, x4.clone(), None, Some(&[1., 1., 0.6, 0.6]), None),
        &[1, 1, 2, 2],
        &[2.875, 4.5, 9.375, 11.],
        1e-6,
    );
    let aa = Resize {
        antialias: true,
        axes: vec![2, 3],
        ..resize_op(ResizeMode::Cubic, CoordinateTransform::HalfPixel)
    };
    #[rustfmt::skip]
    let want = [1.7750091552734375, 3.1200075149536133, 4.465005397796631, 7.155002117156982, 8.500000953674316, 9.844998359680176, 12.534994125366211, 13.879993438720703, 15.224990844726562];
    assert_close(&resize(&aa, x4, None, None, Some(&[3, 3])), &[1, 1, 3, 3], &want, 1e-5);
}

#[test]
fn resize_coordinate_modes() {
    // Values from onnx.reference.
    let x = f32s(&[4], &[1., 2., 3., 4.]);
    let hps = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::HalfPixelSymmetric),
        x.clone(),
        None,
        Some(&[0.6]),
        None,
    );
    assert_close(&hps, &[2], &[1.6666667461395264, 3.3333332538604736], 1e-6);
    // pytorch_half_pixel maps a single output to -0.5, which clamps to the first element.
    let pt = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::PytorchHalfPixel),
        x.clone(),
        None,
        None,
        Some(&[1]),
    );
    assert_close(&pt, &[1], &[1.], 0.0);
    let hp = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::HalfPixel),
        x,
        None,
        None,
        Some(&[1]),
    );
    assert_close(&hp, &[1], &[2.5], 0.0);
    // tf_crop_and_resize on axes 2 and 3 of a 4x4: roi rows [0.4, 1.2], columns [0.6, 1.7];
    // coordinates beyond the input take the extrapolation value.
    let x4 = f32s(&[1, 1, 4, 4], &(1..=16).map(|v| v as f32).collect::<Vec<_>>());
    let tf = Resize {
        axes: vec![2, 3],
        extrapolation_value: 10.0,
        ..resize_op(ResizeMode::Linear, CoordinateTransform::TfCropAndResize)
    };
    let y = resize(&tf, x4, Some(&[0.4, 0.6, 1.2, 1.7]), None, Some(&[3, 3]));
    assert_close(
        &y,
        &[1, 1, 3, 3],
        &[7.600000381469727, 10., 10., 12.40000057220459, 10., 10., 10., 10., 10.],
        1e-5,
    );
}

#[test]
fn resize_integers_round_half_to_even_and_saturate() {
    // From onnx.reference: linear 0..255 makes 127.5 -> 128; cubic overshoots clamp to 0 and 255.
    let x = Tensor::vector(&[0u8, 255, 100, 101]);
    let y = resize(
        &resize_op(ResizeMode::Linear, CoordinateTransform::HalfPixel),
        x.clone(),
        None,
        Some(&[1.5]),
        None,
    );
    assert_eq!(y.as_slice::<u8>().unwrap(), &[0, 128, 229, 126, 100, 101]);
    let y = resize(
        &resize_op(ResizeMode::Cubic, CoordinateTransform::HalfPixel),
        x,
        None,
        Some(&[2.]),
        None,
    );
    assert_eq!(y.as_slice::<u8>().unwrap(), &[0, 63, 214, 247, 144, 84, 95, 101]);
}

#[test]
fn resize_shapes_from_scales_sizes_axes_and_policy() {
    let shape = |r: &Resize, dims: &[usize], scales: Option<&[f32]>, sizes: Option<&[i64]>| {
        traced_type(&[(DType::F32, dims)], |g, v| {
            let scales = scales.map(|s| g.constant("scales", Tensor::vector(s)));
            let sizes = sizes.map(|s| g.constant("sizes", Tensor::vector(s)));
            g.apply(Op::Resize(r.clone()), &[Some(v[0]), None, scales, sizes], 1)[0]
        })
    };
    let r = Resize::default();
    // floor(scale * size): 0.6 (as f32) * 4 = 2.4.
    assert_eq!(
        shape(&r, &[1, 1, 2, 4], Some(&[1., 1., 0.6, 0.6]), None),
        Ok("f32[1,1,1,2]".into())
    );
    assert_eq!(shape(&r, &[1, 1, 2, 2], None, Some(&[1, 1, 7, 8])), Ok("f32[1,1,7,8]".into()));
    let axes = Resize { axes: vec![3, -2], ..Resize::default() };
    assert_eq!(shape(&axes, &[1, 1, 2, 2], None, Some(&[8, 7])), Ok("f32[1,1,7,8]".into()));
    assert_eq!(shape(&axes, &[1, 1, 2, 2], Some(&[3., 2.]), None), Ok("f32[1,1,4,6]".into()));
    // keep_aspect_ratio_policy: one scale for the resized axes, sizes rounded half up.
    let not_larger = Resize {
        axes: vec![2, 3],
        keep_aspect_ratio_policy: AspectRatioPolicy::NotLarger,
        ..Resize::default()
    };
    assert_eq!(shape(&not_larger, &[1, 1, 2, 4], None, Some(&[1, 3])), Ok("f32[1,1,1,2]".into()));
    assert_eq!(shape(&not_larger, &[1, 1, 2, 2], None, Some(&[7, 8])), Ok("f32[1,1,7,7]".into()));
    let not_smaller =
        Resize { keep_aspect_ratio_policy: AspectRatioPolicy::NotSmaller, ..not_larger };
    assert_eq!(shape(&not_smaller, &[1, 1, 2, 4], None, Some(&[1, 3])), Ok("f32[1,1,2,3]".into()));
    // Without axes the policy takes every axis into account, the unit scales of N and C too (as
    // the reference does; checked with onnx.reference).
    let all =
        Resize { keep_aspect_ratio_policy: AspectRatioPolicy::NotSmaller, ..Resize::default() };
    assert_eq!(shape(&all, &[1, 1, 2, 4], None, Some(&[1, 1, 1, 3])), Ok("f32[1,1,2,4]".into()));
    let all =
        Resize { keep_aspect_ratio_policy: AspectRatioPolicy::NotLarger, ..Resize::default() };
    assert_eq!(shape(&all, &[1, 1, 2, 4], None, Some(&[1, 1, 1, 3])), Ok("f32[1,1,1,2]".into()));
}

#[test]
fn resize_shapes_known_only_at_run_time() {
    // Scales as a graph input: the resized sizes are symbols; the run gives the real ones.
    let x = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let scales = Tensor::vector(&[2f32, 3.]);
    let r = Resize { axes: vec![2, 3], ..Resize::default() };
    let ty = traced_type(&[(DType::F32, &[1, 1, 2, 2]), (DType::F32, &[2])], |g, v| {
        g.apply(Op::Resize(r.clone()), &[Some(v[0]), None, Some(v[1])], 1)[0]
    });
    assert_eq!(ty, Ok("f32[1,1,\"resize.d2\",\"resize.d3\"]".into()));
    let y = run_traced(&[x, scales], |g, v| {
        g.apply(Op::Resize(r.clone()), &[Some(v[0]), None, Some(v[1])], 1)[0]
    });
    assert_eq!(y.dims(), &[1, 1, 4, 6]);
    // A symbolic input keeps its symbol where the scale is 1, and stretched sizes are known.
    let ty = traced_type(&[], |g, _| {
        let x = g.input("x", DType::F32, kiln_ir::Shape(vec!["n".into(), "c".into(), 4.into()]));
        let s = g.constant("s", Tensor::vector(&[1f32, 2., 0.5]));
        g.apply(Op::Resize(Resize::default()), &[Some(x), None, Some(s)], 1)[0]
    });
    assert_eq!(ty, Ok("f32[n,\"resize.d1\",2]".into()));
    let ty = traced_type(&[], |g, _| {
        let x = g.input("x", DType::F32, kiln_ir::Shape(vec!["n".into(), "h".into()]));
        let s = g.constant("s", Tensor::vector(&[5i64]));
        g.apply(
            Op::Resize(Resize { axes: vec![1], ..Resize::default() }),
            &[Some(x), None, None, Some(s)],
            1,
        )[0]
    });
    assert_eq!(ty, Ok("f32[n,5]".into()));
    // An empty scales tensor counts as absent (exporters write one next to sizes).
    let y = eval::eval_op(
        &Op::Resize(Resize::default()),
        &[
            Some(&f32s(&[2], &[1., 2.])),
            Some(&Tensor::vector::<f32>(&[])),
            Some(&Tensor::vector::<f32>(&[])),
            Some(&Tensor::vector(&[4i64])),
        ],
        1,
    )
    .unwrap();
    assert_close(&y[0], &[4], &[1., 1., 2., 2.], 0.0);
}

#[test]
fn resize_errors() {
    let with = |r: Resize, scales: Option<Tensor>, sizes: Option<Tensor>| {
        traced_type(&[(DType::F32, &[1, 1, 2, 2])], |g, v| {
            let scales = scales.clone().map(|s| g.constant("scales", s));
            let sizes = sizes.clone().map(|s| g.constant("sizes", s));
            g.apply(Op::Resize(r.clone()), &[Some(v[0]), None, scales, sizes], 1)[0]
        })
    };
    let scales = || Some(Tensor::vector(&[1f32, 1., 2., 2.]));
    let sizes = || Some(Tensor::vector(&[1i64, 1, 4, 4]));
    assert_err(with(Resize::default(), scales(), sizes()), "needs exactly one of scales and sizes");
    assert_err(with(Resize::default(), None, None), "needs exactly one of scales and sizes");
    assert_err(
        with(Resize::default(), Some(Tensor::vector(&[2f32, 2.])), None),
        "scales has 2 entries, 4 expected",
    );
    assert_err(
        with(
            Resize { axes: vec![2, 2], ..Resize::default() },
            Some(Tensor::vector(&[2f32, 2.])),
            None,
        ),
        "name axis 2 twice",
    );
    assert_err(
        with(Resize { axes: vec![4], ..Resize::default() }, Some(Tensor::vector(&[2f32])), None),
        "4 is out of range for rank 4",
    );
    assert_err(
        with(Resize::default(), Some(Tensor::vector(&[1f32, 1., 0., 2.])), None),
        "scales must be positive",
    );
    assert_err(
        with(Resize::default(), None, Some(Tensor::vector(&[1i64, 1, -4, 4]))),
        "sizes must not be negative",
    );
    assert_err(
        with(Resize::default(), None, Some(Tensor::vector(&[1f32, 1., 4., 4.]))),
        "sizes must be a 1-D integer tensor",
    );
    assert_err(
        with(resize_op(ResizeMode::Linear, CoordinateTransform::TfCropAndResize), scales(), None),
        "tf_crop_and_resize needs roi",
    );
    assert_err(
        with(Resize { antialias: true, ..Resize::default() }, scales(), None),
        "antialias applies to the linear and cubic modes",
    );
}

#[test]
fn empty_tensors_give_empty_results() {
    let e = |dims: &[usize]| Tensor::zeros(DType::F32, dims);
    let run = |op: Op, operands: &[Tensor]| {
        let refs: Vec<Option<&Tensor>> = operands.iter().map(Some).collect();
        eval::eval_op(&op, &refs, 1).map(|mut r| r.remove(0).dims().to_vec())
    };
    assert_eq!(
        run(Op::InstanceNorm { epsilon: 1e-5 }, &[e(&[1, 0, 2]), e(&[0]), e(&[0])]),
        Ok(vec![1, 0, 2])
    );
    assert_eq!(
        run(Op::GroupNorm { num_groups: 2, epsilon: 1e-5 }, &[e(&[2, 4, 0]), e(&[4]), e(&[4])]),
        Ok(vec![2, 4, 0])
    );
    assert_eq!(run(Op::LogSoftmax { axis: 1 }, &[e(&[0, 3])]), Ok(vec![0, 3]));
    assert_eq!(run(Op::Hardmax { axis: 1 }, &[e(&[2, 0])]), Ok(vec![2, 0]));
    assert_eq!(run(Op::MeanVarianceNorm { axes: vec![0] }, &[e(&[0, 2])]), Ok(vec![0, 2]));
    assert_eq!(
        run(Op::Lrn(Lrn { alpha: 1e-4, beta: 0.75, bias: 1.0, size: 3 }), &[e(&[1, 0, 2])]),
        Ok(vec![1, 0, 2])
    );
    assert_eq!(
        run(Op::Resize(Resize::default()), &[e(&[0, 2]), e(&[0]), Tensor::vector(&[1f32, 2.])]),
        Ok(vec![0, 4])
    );
    let err = run(
        Op::Resize(Resize::default()),
        &[e(&[0, 2]), e(&[0]), e(&[0]), Tensor::vector(&[3i64, 2])],
    )
    .unwrap_err();
    assert!(err.to_string().contains("cannot resize axis 0 of size 0 to a given size"), "{err}");
    let ct = Op::ConvTranspose(conv_t(&[1], &[], AutoPad::NotSet));
    assert_eq!(run(ct.clone(), &[e(&[0, 1, 3]), e(&[1, 2, 2])]), Ok(vec![0, 2, 4]));
    let err = run(ct, &[e(&[1, 1, 0]), e(&[1, 2, 2])]).unwrap_err();
    assert!(err.to_string().contains("spatial axis 0 has input size 0"), "{err}");
}
