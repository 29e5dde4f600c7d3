//! Each op's shape rule and interpreter, against hand-computed values.

use kiln_ir::op::{AutoPad, Conv, Gemm, Pool, PoolKind, Window};
use kiln_ir::{DType, Op, Tensor};

use super::{assert_close, f32s, run_traced, traced_type};

#[test]
fn matmul_values_and_numpy_promotion() {
    let a = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32s(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    assert_close(
        &run_traced(&[a, b], |_, x| x[0].matmul(x[1])),
        &[2, 2],
        &[58., 64., 139., 154.],
        0.0,
    );
    // A 1-D left operand is a row vector, dropped from the result.
    let v = f32s(&[3], &[1., 2., 3.]);
    let m = f32s(&[3, 2], &[1., 0., 0., 1., 1., 1.]);
    assert_close(&run_traced(&[v, m], |_, x| x[0].matmul(x[1])), &[2], &[4., 5.], 0.0);
}

#[test]
fn matmul_shapes_broadcast_batches() {
    let f = DType::F32;
    assert_eq!(
        traced_type(&[(f, &[2, 1, 3, 4]), (f, &[5, 4, 2])], |_, x| x[0].matmul(x[1])),
        Ok("f32[2,5,3,2]".into())
    );
    assert_eq!(
        traced_type(&[(f, &[2, 3, 4]), (f, &[4])], |_, x| x[0].matmul(x[1])),
        Ok("f32[2,3]".into())
    );
    assert_eq!(traced_type(&[(f, &[3]), (f, &[3])], |_, x| x[0].matmul(x[1])), Ok("f32[]".into()));
    let batched = run_traced(
        &[Tensor::full(f, &[2, 1, 2, 3], 1.0), Tensor::full(f, &[3, 3, 1], 2.0)],
        |_, x| x[0].matmul(x[1]),
    );
    assert_close(&batched, &[2, 3, 2, 1], &[6.0; 12], 0.0);
}

#[test]
fn gemm_transposes_scales_and_broadcasts_c() {
    let a = f32s(&[3, 2], &[1., 4., 2., 5., 3., 6.]);
    let b = f32s(&[2, 3], &[7., 9., 11., 8., 10., 12.]);
    let c = f32s(&[2], &[1., 2.]);
    let y = run_traced(&[a, b, c], |_, x| {
        x[0].gemm(x[1], Some(x[2]), Gemm { alpha: 0.5, beta: 2.0, trans_a: true, trans_b: true })
    });
    assert_close(&y, &[2, 2], &[31., 36., 71.5, 81.], 1e-6);
}

fn conv_op(strides: usize, pad: usize, dilation: usize, group: usize, spatial: usize) -> Op {
    Op::Conv(Conv {
        window: Window {
            strides: vec![strides; spatial],
            dilations: vec![dilation; spatial],
            pads: vec![pad; 2 * spatial],
            auto_pad: AutoPad::NotSet,
        },
        group,
    })
}

#[test]
fn conv_matches_the_onnx_documentation_example() {
    let x = f32s(&[1, 1, 5, 5], &(0..25).map(|v| v as f32).collect::<Vec<_>>());
    let w = Tensor::full(DType::F32, &[1, 1, 3, 3], 1.0);
    let padded = run_traced(&[x.clone(), w.clone()], |g, v| {
        g.apply(conv_op(1, 1, 1, 1, 2), &[Some(v[0]), Some(v[1]), None], 1)[0]
    });
    #[rustfmt::skip]
    let want = [12., 21., 27., 33., 24., 33., 54., 63., 72., 51., 63., 99., 108., 117., 81., 93., 144., 153., 162., 111., 72., 111., 117., 123., 84.];
    assert_close(&padded, &[1, 1, 5, 5], &want, 0.0);
    let valid = run_traced(&[x.clone(), w.clone()], |g, v| {
        g.apply(conv_op(1, 0, 1, 1, 2), &[Some(v[0]), Some(v[1]), None], 1)[0]
    });
    assert_close(&valid, &[1, 1, 3, 3], &[54., 63., 72., 99., 108., 117., 144., 153., 162.], 0.0);
    let strided = run_traced(&[x, w], |g, v| {
        g.apply(conv_op(2, 1, 1, 1, 2), &[Some(v[0]), Some(v[1]), None], 1)[0]
    });
    assert_close(&strided, &[1, 1, 3, 3], &[12., 27., 24., 63., 108., 81., 72., 117., 84.], 0.0);
}

#[test]
fn conv_groups_bias_dilation_and_1d() {
    // Depthwise: each channel scaled by its own 1x1 kernel, plus bias.
    let x = f32s(&[1, 2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let w = f32s(&[2, 1, 1, 1], &[2., 3.]);
    let b = f32s(&[2], &[1., -1.]);
    let y = run_traced(&[x, w, b], |g, v| {
        g.apply(conv_op(1, 0, 1, 2, 2), &[Some(v[0]), Some(v[1]), Some(v[2])], 1)[0]
    });
    assert_close(&y, &[1, 2, 2, 2], &[3., 5., 7., 9., 14., 17., 20., 23.], 0.0);
    // Dilation 2 on x[r][c] = 4r + c with a 2x2 kernel of ones: 16i + 4j + 20.
    let x = f32s(&[1, 1, 4, 4], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    let w = Tensor::full(DType::F32, &[1, 1, 2, 2], 1.0);
    let y = run_traced(&[x, w], |g, v| {
        g.apply(conv_op(1, 0, 2, 1, 2), &[Some(v[0]), Some(v[1]), None], 1)[0]
    });
    assert_close(&y, &[1, 1, 2, 2], &[20., 24., 36., 40.], 0.0);
    let x = f32s(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let w = f32s(&[1, 1, 2], &[1., -1.]);
    let y = run_traced(&[x, w], |g, v| {
        g.apply(conv_op(2, 0, 1, 1, 1), &[Some(v[0]), Some(v[1]), None], 1)[0]
    });
    assert_close(&y, &[1, 1, 2], &[-1., -1.], 0.0);
}

#[test]
fn conv_auto_pad_same_keeps_the_size() {
    let op = Op::Conv(Conv {
        window: Window { auto_pad: AutoPad::SameUpper, ..Window::unit(2) },
        group: 1,
    });
    let ty = traced_type(&[(DType::F32, &[1, 3, 7, 9]), (DType::F32, &[4, 3, 3, 3])], |g, v| {
        g.apply(op.clone(), &[Some(v[0]), Some(v[1])], 1)[0]
    });
    assert_eq!(ty, Ok("f32[1,4,7,9]".into()));
}

#[test]
fn pooling_values_padding_and_ceil_mode() {
    let x = f32s(&[1, 1, 4, 4], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].max_pool(2, 2, 0)),
        &[1, 1, 2, 2],
        &[5., 7., 13., 15.],
        0.0,
    );
    assert_close(
        &run_traced(&[x], |_, v| v[0].avg_pool(2, 2, 0)),
        &[1, 1, 2, 2],
        &[2.5, 4.5, 10.5, 12.5],
        0.0,
    );
    // A padded corner window sees 1, 2, 4, 5: divided by the 4 real cells, or by all 9.
    let x = f32s(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let corner = |count_include_pad| {
        let op = Op::Pool(Pool {
            kind: PoolKind::Average { count_include_pad },
            kernel: vec![3, 3],
            window: Window { pads: vec![1; 4], ..Window::unit(2) },
            ceil_mode: false,
            column_major_indices: false,
        });
        run_traced(&[x.clone()], |g, v| g.apply(op.clone(), &[Some(v[0])], 1)[0]).to_f64s()[0]
    };
    assert_eq!(corner(false), 3.0);
    assert!((corner(true) - 12.0 / 9.0).abs() < 1e-6);
    let pool = |ceil_mode| {
        Op::Pool(Pool {
            kind: PoolKind::Max,
            kernel: vec![2, 2],
            window: Window { strides: vec![2, 2], ..Window::unit(2) },
            ceil_mode,
            column_major_indices: false,
        })
    };
    assert_eq!(
        traced_type(&[(DType::F32, &[1, 1, 5, 5])], |g, v| g.apply(pool(false), &[Some(v[0])], 1)
            [0]),
        Ok("f32[1,1,2,2]".into())
    );
    assert_eq!(
        traced_type(&[(DType::F32, &[1, 1, 5, 5])], |g, v| g.apply(pool(true), &[Some(v[0])], 1)
            [0]),
        Ok("f32[1,1,3,3]".into())
    );
}

#[test]
fn global_average_pool_keeps_unit_dims() {
    let x = f32s(&[1, 2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    assert_close(&run_traced(&[x], |_, v| v[0].global_avg_pool()), &[1, 2, 1, 1], &[2.5, 6.5], 0.0);
}

#[test]
fn activations_match_their_definitions() {
    let x = f32s(&[3], &[-1., 0., 2.]);
    assert_close(&run_traced(&[x.clone()], |_, v| v[0].relu()), &[3], &[0., 0., 2.], 0.0);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].sigmoid()),
        &[3],
        &[0.2689414213699951, 0.5, 0.8807970779778823],
        1e-7,
    );
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].tanh()),
        &[3],
        &[-0.7615941559557649, 0.0, 0.9640275800758169],
        1e-7,
    );
    assert_close(&run_traced(&[x.clone()], |_, v| v[0].neg()), &[3], &[1., 0., -2.], 0.0);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].exp()),
        &[3],
        &[0.36787944117144233, 1.0, 7.38905609893065],
        1e-6,
    );
    let one = f32s(&[1], &[1.]);
    assert_close(
        &run_traced(&[one.clone()], |_, v| v[0].gelu()),
        &[1],
        &[0.8413447460685429],
        1e-7,
    );
    assert_close(
        &run_traced(&[one.clone()], |_, v| v[0].gelu_tanh()),
        &[1],
        &[0.8411919906082768],
        1e-7,
    );
    assert_close(
        &run_traced(&[f32s(&[2], &[0.5, -3.0])], |_, v| v[0].erf()),
        &[2],
        &[0.5204998778130465, -0.9999779095030014],
        1e-7,
    );
    let pos = f32s(&[3], &[4., 1., 0.25]);
    assert_close(&run_traced(&[pos.clone()], |_, v| v[0].sqrt()), &[3], &[2., 1., 0.5], 0.0);
    assert_close(&run_traced(&[pos.clone()], |_, v| v[0].reciprocal()), &[3], &[0.25, 1., 4.], 0.0);
    assert_close(
        &run_traced(&[pos], |_, v| v[0].log()),
        &[3],
        &[1.3862943611198906, 0.0, -1.3862943611198906],
        1e-6,
    );
}

#[test]
fn binary_ops_broadcast_numpy_style() {
    let a = f32s(&[2, 1], &[1., 2.]);
    let b = f32s(&[3], &[10., 20., 30.]);
    assert_close(
        &run_traced(&[a.clone(), b.clone()], |_, v| v[0] + v[1]),
        &[2, 3],
        &[11., 21., 31., 12., 22., 32.],
        0.0,
    );
    assert_close(
        &run_traced(&[a.clone(), b.clone()], |_, v| v[1] - v[0]),
        &[2, 3],
        &[9., 19., 29., 8., 18., 28.],
        0.0,
    );
    assert_close(
        &run_traced(&[a.clone(), b.clone()], |_, v| v[0] * v[1]),
        &[2, 3],
        &[10., 20., 30., 20., 40., 60.],
        0.0,
    );
    let s = Tensor::scalar(2f32);
    assert_close(
        &run_traced(&[b.clone(), s.clone()], |_, v| v[0].div(v[1])),
        &[3],
        &[5., 10., 15.],
        0.0,
    );
    assert_close(&run_traced(&[b, s], |_, v| v[0].pow(v[1])), &[3], &[100., 400., 900.], 0.0);
    // Empty dimensions broadcast too.
    let e = Tensor::zeros(DType::F32, &[0, 3]);
    assert_eq!(run_traced(&[e, f32s(&[1, 3], &[1., 2., 3.])], |_, v| v[0] + v[1]).dims(), &[0, 3]);
}

#[test]
fn integer_arithmetic_truncates_and_wraps() {
    let a = Tensor::vector(&[7i32, -7, i32::MAX]);
    let b = Tensor::vector(&[2i32, 2, 1]);
    assert_eq!(
        run_traced(&[a.clone(), b.clone()], |_, v| v[0].div(v[1])).as_slice::<i32>().unwrap(),
        &[3, -3, i32::MAX]
    );
    assert_eq!(
        run_traced(&[a, b], |_, v| v[0] + v[1]).as_slice::<i32>().unwrap(),
        &[9, -5, i32::MIN]
    );
}

#[test]
fn max_min_propagate_nan() {
    let a = f32s(&[3], &[1., f32::NAN, 5.]);
    let b = f32s(&[3], &[2., 0., 4.]);
    assert_close(
        &run_traced(&[a.clone(), b.clone()], |_, v| v[0].max(v[1])),
        &[3],
        &[2., f64::NAN, 5.],
        0.0,
    );
    assert_close(&run_traced(&[a, b], |_, v| v[0].min(v[1])), &[3], &[1., f64::NAN, 4.], 0.0);
}

/// Relu and Celu take NaN to NaN, as ONNX's reference (numpy's maximum and minimum) does, and
/// as compiled code does: `f64::max` dropped it (the compiler's fuzz target found Celu with
/// alpha 0, whose negative part is 0 * inf = NaN, giving x on the interpreter and NaN compiled).
#[test]
fn relu_and_celu_propagate_nan() {
    use kiln_ir::UnaryOp;
    let x = f32s(&[3], &[-1., f32::NAN, 0.5]);
    assert_close(&run_traced(&[x.clone()], |_, v| v[0].relu()), &[3], &[0., f64::NAN, 0.5], 0.0);
    let celu = run_traced(&[x], |_, v| v[0].unary(UnaryOp::Celu { alpha: 0.0 }));
    assert_close(&celu, &[3], &[0., f64::NAN, f64::NAN], 0.0);
}

#[test]
fn clip_where_comparisons_and_cast() {
    let x = f32s(&[3], &[-2., 0.5, 3.]);
    assert_close(&run_traced(&[x], |_, v| v[0].clip(0.0, 1.0)), &[3], &[0., 0.5, 1.], 0.0);
    let c = Tensor::vector(&[true, false, true]);
    let y = run_traced(&[c, f32s(&[3], &[1., 2., 3.]), f32s(&[1], &[10.])], |_, v| {
        v[0].select(v[1], v[2])
    });
    assert_close(&y, &[3], &[1., 10., 3.], 0.0);
    let a = f32s(&[3], &[1., 2., 3.]);
    let two = f32s(&[1], &[2.]);
    let cmp = |op: kiln_ir::BinaryOp| {
        let t = run_traced(&[a.clone(), two.clone()], |_, v| v[0].binary(op, v[1]));
        assert_eq!(t.dtype(), DType::Bool);
        t.as_slice::<bool>().unwrap().to_vec()
    };
    assert_eq!(cmp(kiln_ir::BinaryOp::Equal), [false, true, false]);
    assert_eq!(cmp(kiln_ir::BinaryOp::Less), [true, false, false]);
    assert_eq!(cmp(kiln_ir::BinaryOp::Greater), [false, false, true]);
    let c = run_traced(&[f32s(&[3], &[1.7, -1.7, 2.5])], |_, v| v[0].cast(DType::I32));
    assert_eq!(c.as_slice::<i32>().unwrap(), &[1, -1, 2]);
}

#[test]
fn softmax_along_an_axis() {
    let x = f32s(&[3], &[1., 2., 3.]);
    assert_close(
        &run_traced(&[x], |_, v| v[0].softmax(-1)),
        &[3],
        &[0.09003057317038046, 0.24472847105479764, 0.6652409557748219],
        1e-7,
    );
    // Along axis 0 of a 2x2, each column sums to 1.
    let y = run_traced(&[f32s(&[2, 2], &[0., 1., 0., 3.])], |_, v| v[0].softmax(0));
    assert_close(&y, &[2, 2], &[0.5, 0.11920292202211755, 0.5, 0.8807970779778823], 1e-7);
}

#[test]
fn layer_norm_and_batch_norm() {
    let x = f32s(&[2, 3], &[1., 2., 3., 2., 4., 6.]);
    let scale = f32s(&[3], &[1., 1., 2.]);
    let bias = f32s(&[3], &[0., 1., 0.]);
    let y = run_traced(&[x, scale, bias], |_, v| v[0].layer_norm(v[1], v[2], -1, 0.0));
    let r = [-1.224744871391589, 1.0, 2.449489742783178];
    assert_close(&y, &[2, 3], &[r, r].concat(), 1e-6);
    let x = f32s(&[1, 2, 1, 2], &[1., 3., 2., 4.]);
    let p = |a: f32, b: f32| f32s(&[2], &[a, b]);
    let y = run_traced(&[x, p(1., 2.), p(0., 1.), p(2., 3.), p(1., 4.)], |_, v| {
        v[0].batch_norm(v[1], v[2], v[3], v[4], 0.0)
    });
    assert_close(&y, &[1, 2, 1, 2], &[-1., 1., 0., 2.], 1e-6);
}

#[test]
fn reductions_with_axes_and_keepdims() {
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].reduce_sum(&[1], true)),
        &[2, 1],
        &[6., 15.],
        0.0,
    );
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].reduce_mean(&[0], false)),
        &[3],
        &[2.5, 3.5, 4.5],
        0.0,
    );
    assert_close(&run_traced(&[x.clone()], |_, v| v[0].reduce_max(&[], true)), &[1, 1], &[6.], 0.0);
    assert_close(&run_traced(&[x.clone()], |_, v| v[0].reduce_max(&[], false)), &[], &[6.], 0.0);
    assert_close(
        &run_traced(&[x], |_, v| v[0].reduce_l2(&[-1], false)),
        &[2],
        &[3.7416573867739413, 8.774964387392123],
        1e-6,
    );
    let i = Tensor::vector(&[i64::MAX - 1, 1]);
    assert_eq!(
        run_traced(&[i], |_, v| v[0].reduce_sum(&[0], false)).as_slice::<i64>().unwrap(),
        &[i64::MAX],
        "integer sums are exact"
    );
}

#[test]
fn reshape_flatten_transpose() {
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].reshape(&[3, -1])),
        &[3, 2],
        &[1., 2., 3., 4., 5., 6.],
        0.0,
    );
    assert_eq!(run_traced(&[x.clone()], |_, v| v[0].reshape(&[0, 1, -1])).dims(), &[2, 1, 3]);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].transpose(&[1, 0])),
        &[3, 2],
        &[1., 4., 2., 5., 3., 6.],
        0.0,
    );
    let f = DType::F32;
    assert_eq!(traced_type(&[(f, &[2, 3, 4])], |_, v| v[0].flatten(1)), Ok("f32[2,12]".into()));
    assert_eq!(traced_type(&[(f, &[2, 3, 4])], |_, v| v[0].flatten(0)), Ok("f32[1,24]".into()));
    assert_eq!(traced_type(&[(f, &[2, 3, 4])], |_, v| v[0].flatten(-1)), Ok("f32[6,4]".into()));
}

#[test]
fn squeeze_unsqueeze_expand_identity() {
    let f = DType::F32;
    assert_eq!(traced_type(&[(f, &[1, 3, 1])], |_, v| v[0].squeeze(&[0, 2])), Ok("f32[3]".into()));
    assert_eq!(traced_type(&[(f, &[3])], |_, v| v[0].unsqueeze(&[0, -1])), Ok("f32[1,3,1]".into()));
    let x = f32s(&[3, 1], &[1., 2., 3.]);
    let y = run_traced(&[x.clone()], |_, v| v[0].expand(&[2, 1, 2]));
    assert_close(&y, &[2, 3, 2], &[1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.], 0.0);
    assert_eq!(run_traced(&[x.clone()], |_, v| v[0].identity()), x);
}

#[test]
fn concat_and_split() {
    let a = f32s(&[1, 2], &[1., 2.]);
    let b = f32s(&[2, 2], &[3., 4., 5., 6.]);
    assert_close(
        &run_traced(&[a, b], |g, v| g.concat(&[v[0], v[1]], 0)),
        &[3, 2],
        &[1., 2., 3., 4., 5., 6.],
        0.0,
    );
    let x = f32s(&[6], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].split(0, &[2, 4])[1]),
        &[4],
        &[3., 4., 5., 6.],
        0.0,
    );
    // Without sizes: equal parts, the last one smaller (ONNX 18).
    let seven = (DType::F32, &[7usize][..]);
    let last = traced_type(&[seven], |g, v| {
        g.apply(Op::Split { axis: 0, num_outputs: 3 }, &[Some(v[0])], 3)[2]
    });
    assert_eq!(last, Ok("f32[1]".into()));
}

#[test]
fn slice_with_negative_steps_and_clamping() {
    let x = f32s(&[10], &(0..10).map(|v| v as f32).collect::<Vec<_>>());
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].slice(&[8], &[1], &[0], &[-3])),
        &[3],
        &[8., 5., 2.],
        0.0,
    );
    assert_close(
        &run_traced(&[x.clone()], |_, v| v[0].slice(&[-3], &[i64::MAX], &[0], &[1])),
        &[3],
        &[7., 8., 9.],
        0.0,
    );
    assert_close(
        &run_traced(&[x], |_, v| v[0].slice(&[-1], &[i64::MIN], &[0], &[-4])),
        &[3],
        &[9., 5., 1.],
        0.0,
    );
    let m = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &run_traced(&[m], |_, v| v[0].slice(&[1], &[3], &[1], &[1])),
        &[2, 2],
        &[2., 3., 5., 6.],
        0.0,
    );
}

#[test]
fn gather_with_negative_and_multidimensional_indices() {
    let x = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let i = Tensor::vector(&[-1i64, 0]);
    assert_close(
        &run_traced(&[x.clone(), i], |_, v| v[0].gather(v[1], 0)),
        &[2, 2],
        &[5., 6., 1., 2.],
        0.0,
    );
    let i2 = Tensor::from_vec(&[2, 2], vec![1i32, 0, 0, 1]).unwrap();
    let y = run_traced(&[x, i2], |_, v| v[0].gather(v[1], 1));
    assert_close(&y, &[3, 2, 2], &[2., 1., 1., 2., 4., 3., 3., 4., 6., 5., 5., 6.], 0.0);
}

#[test]
fn f16_and_f64_compute_in_their_own_type() {
    let h = Tensor::vector(&[1.0f32, 2.0, 3.0]).cast(DType::F16);
    let y = run_traced(&[h.clone(), h], |_, v| v[0] * v[1]);
    assert_eq!(y.dtype(), DType::F16);
    assert_close(&y, &[3], &[1., 4., 9.], 0.0);
    let d = Tensor::vector(&[0.1f64]);
    let y = run_traced(&[d.clone(), d], |_, v| v[0] + v[1]);
    assert_eq!(y.as_slice::<f64>().unwrap(), &[0.2], "f64 stays exact: 0.1 + 0.1");
}

#[test]
fn quantize_and_dequantize_per_tensor_per_axis_and_blocked() {
    use kiln_ir::Graph;
    let run = |op: Op, x: Tensor, scale: Tensor, zero: Option<Tensor>| -> Result<Tensor, String> {
        let mut g = Graph::new("q");
        let xv = g.add_input("x", x.ty()).unwrap();
        let s = g.add_constant("s", scale).unwrap();
        let z = zero.map(|z| g.add_constant("z", z).unwrap());
        let y = g.add_node("y", op, &[Some(xv), Some(s), z]).map_err(|e| e.to_string())?;
        g.add_output("y", y.into()).unwrap();
        kiln_ir::eval::run(&g, &[x]).map(|mut v| v.remove(0)).map_err(|e| e.to_string())
    };
    // Per tensor, rounding half to even and saturating: 2.5 -> 2, 3.5 -> 4, -1 -> 0 + 128 - 1.
    let x = Tensor::from_slice(&[6], &[0.0f32, 2.5, 3.5, -1.0, 1000.0, -1000.0]).unwrap();
    let q = run(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        x.clone(),
        Tensor::scalar(1f32),
        Some(Tensor::scalar(128u8)),
    )
    .unwrap();
    assert_eq!(q.to_i64s(), [128, 130, 132, 127, 255, 0]);
    let q = run(
        Op::Quantize { axis: 1, block_size: 0, dtype: Some(DType::I8), saturate: true },
        x,
        Tensor::scalar(1f32),
        None,
    )
    .unwrap();
    assert_eq!((q.dtype(), q.to_i64s()), (DType::I8, vec![0, 2, 4, -1, 127, -128]));
    // Per channel of axis 1, and back.
    let x = Tensor::from_slice(&[1, 2, 2], &[10i8, -10, 10, -10]).unwrap();
    let scale = Tensor::from_slice(&[2], &[0.5f32, 2.0]).unwrap();
    let y = run(
        Op::Dequantize { axis: 1, block_size: 0 },
        x,
        scale.clone(),
        Some(Tensor::from_slice(&[2], &[0i8, 2]).unwrap()),
    )
    .unwrap();
    assert_eq!(y.to_f64s(), [5.0, -5.0, 16.0, -24.0]);
    // Blocks of 2 along axis 1 of a [2,3] (the last block short).
    let x = Tensor::from_slice(&[2, 3], &[1i8, 2, 3, 4, 5, 6]).unwrap();
    let bs = Tensor::from_slice(&[2, 2], &[1f32, 10.0, 100.0, 1000.0]).unwrap();
    let y = run(Op::Dequantize { axis: 1, block_size: 2 }, x, bs, None).unwrap();
    assert_eq!(y.to_f64s(), [1.0, 2.0, 30.0, 400.0, 500.0, 6000.0]);
    // A scale that fits neither layout is named.
    let e = run(
        Op::Dequantize { axis: 1, block_size: 0 },
        Tensor::from_slice(&[2, 3], &[0u8; 6]).unwrap(),
        Tensor::from_slice(&[2], &[1f32, 1.0]).unwrap(),
        None,
    )
    .unwrap_err();
    assert!(
        e.contains(
            "the scale f32[2] is neither one value nor one per position of axis 1 of u8[2,3]"
        ),
        "{e}"
    );
    // A zero point laid out unlike its scale is refused, not indexed past its end.
    let x = Tensor::from_slice(&[1, 2, 2], &[1i8, 2, 3, 4]).unwrap();
    let e = run(Op::Dequantize { axis: 1, block_size: 0 }, x, scale, Some(Tensor::scalar(0i8)))
        .unwrap_err();
    assert!(e.contains("the zero point i8[] does not match the scale f32[2]"), "{e}");
}
