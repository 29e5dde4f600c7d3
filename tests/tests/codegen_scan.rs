//! Native code for scans and selections (ArgMax/ArgMin, CumSum/CumProd, TopK), the
//! normalisations (Hardmax, Instance/Group/RMS/Lp/MeanVariance normalisation, LRN), Einsum,
//! ConvTranspose and MaxPool's indices, against the interpreter. Shapes include some large
//! enough to be split into workgroups.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{ArgReduce, AutoPad, ConvTranspose, Cumulative, Lrn, Pool, PoolKind, Window};
use kiln_ir::{DType, Graph, Op, Tensor};

use crate::compile::check_against_eval;

/// One op over inputs of the given types, every result an output.
fn single(
    op: Op,
    inputs: &[(DType, &[usize])],
    constants: &[Option<Tensor>],
    outputs: usize,
) -> Graph {
    let g = GraphBuilder::new("t");
    let mut operands = Vec::new();
    for (i, (d, s)) in inputs.iter().enumerate() {
        operands.push(Some(g.input(&format!("x{i}"), *d, s.to_vec())));
    }
    for (i, c) in constants.iter().enumerate() {
        operands.push(c.clone().map(|t| g.constant(&format!("c{i}"), t)));
    }
    let results = g.apply(op, &operands, outputs);
    for (i, r) in results.into_iter().enumerate() {
        g.output(&format!("y{i}"), r);
    }
    g.build().expect("the graph builds")
}

/// Random values with some NaNs and repeated values mixed in.
fn with_specials(dims: &[usize], seed: u64) -> Tensor {
    let t = Tensor::random(DType::F32, dims, seed);
    let v: Vec<f64> = t
        .to_f64s()
        .iter()
        .enumerate()
        .map(|(i, &x)| match i % 11 {
            3 => f64::NAN,
            5 | 7 => 0.25,
            _ => (x * 4.0).round() / 4.0,
        })
        .collect();
    Tensor::from_f64s(DType::F32, dims, &v).expect("length matches")
}

#[test]
fn arg_max_and_min_follow_the_interpreter() {
    for max in [true, false] {
        for (axis, keepdims, last) in
            [(0, true, false), (1, false, true), (-1, true, true), (2, false, false)]
        {
            let op = Op::ArgReduce(ArgReduce { max, axis, keepdims, select_last_index: last });
            let g = single(op.clone(), &[(DType::F32, &[3, 5, 7])], &[], 1);
            check_against_eval(&g, &[with_specials(&[3, 5, 7], 1)], 1, 0.0);
            let g = single(op, &[(DType::I32, &[3, 5, 7])], &[], 1);
            check_against_eval(&g, &[Tensor::random(DType::I32, &[3, 5, 7], 2)], 1, 0.0);
        }
    }
    // Large enough for workgroups, the reduced axis first.
    for (axis, keepdims) in [(0, false), (1, false), (0, true)] {
        let op = Op::ArgReduce(ArgReduce { max: true, axis, keepdims, select_last_index: false });
        let g = single(op, &[(DType::F16, &[6, 200, 100])], &[], 1);
        check_against_eval(&g, &[Tensor::random(DType::F16, &[6, 200, 100], 3)], 4, 0.0);
    }
}

#[test]
fn cumulative_sums_and_products() {
    for prod in [false, true] {
        for exclusive in [false, true] {
            for reverse in [false, true] {
                let op = Op::Cumulative(Cumulative { prod, exclusive, reverse });
                for (d, axis) in
                    [(DType::F32, 1i64), (DType::I32, -1), (DType::U8, 0), (DType::F64, 2)]
                {
                    let axis = Tensor::from_vec(&[], vec![axis]).expect("scalar");
                    let g = single(op.clone(), &[(d, &[4, 6, 5])], &[Some(axis)], 1);
                    check_against_eval(&g, &[Tensor::random(d, &[4, 6, 5], 4)], 1, 1e-5);
                }
            }
        }
    }
    // A long axis (a sequential loop), and a short one over enough lines for workgroups.
    for (dims, axis, d) in
        [([3usize, 300], 1i64, DType::F32), ([300, 3], 0, DType::I64), ([300, 64], 1, DType::F32)]
    {
        for (exclusive, reverse) in [(false, false), (true, true)] {
            let axis = Tensor::from_vec(&[1], vec![axis]).expect("one axis");
            let g = single(
                Op::Cumulative(Cumulative { prod: false, exclusive, reverse }),
                &[(d, &dims)],
                &[Some(axis)],
                1,
            );
            check_against_eval(&g, &[Tensor::random(d, &dims, 5)], 4, 1e-5);
        }
    }
    let axis = Tensor::from_vec(&[], vec![0i64]).expect("scalar");
    let g = single(
        Op::Cumulative(Cumulative { prod: true, exclusive: true, reverse: false }),
        &[(DType::I32, &[100])],
        &[Some(axis)],
        1,
    );
    check_against_eval(&g, &[Tensor::random(DType::I32, &[100], 6)], 1, 0.0);
}

#[test]
fn top_k_values_and_indices() {
    for largest in [true, false] {
        for (axis, k) in [(1i64, 3i64), (-1, 7), (0, 1), (1, 0)] {
            let op = Op::TopK { axis, largest, sorted: true };
            let k = Tensor::from_vec(&[1], vec![k]).expect("k");
            let g = single(op.clone(), &[(DType::F32, &[4, 9, 7])], &[Some(k.clone())], 2);
            check_against_eval(&g, &[with_specials(&[4, 9, 7], 6)], 1, 0.0);
            let g = single(op, &[(DType::U16, &[4, 9, 7])], &[Some(k)], 2);
            check_against_eval(&g, &[Tensor::random(DType::U16, &[4, 9, 7], 7)], 1, 0.0);
        }
    }
    // A long axis, and f16 values (many ties).
    let k = Tensor::from_vec(&[1], vec![5i64]).expect("k");
    let g = single(
        Op::TopK { axis: -1, largest: true, sorted: true },
        &[(DType::F16, &[2, 5000])],
        &[Some(k)],
        2,
    );
    check_against_eval(&g, &[Tensor::random(DType::F16, &[2, 5000], 8)], 1, 0.0);
}

#[test]
fn hardmax_picks_the_first_maximum() {
    for axis in [0i64, 1, -1] {
        let g = single(Op::Hardmax { axis }, &[(DType::F32, &[3, 8, 5])], &[], 1);
        check_against_eval(&g, &[with_specials(&[3, 8, 5], 8)], 1, 0.0);
    }
}

#[test]
fn group_and_instance_normalisation() {
    let x = [2usize, 6, 5, 4];
    let params = |seed| Some(Tensor::random(DType::F32, &[6], seed));
    for groups in [1usize, 2, 3, 6] {
        let g = single(
            Op::GroupNorm { num_groups: groups, epsilon: 1e-3 },
            &[(DType::F32, &x)],
            &[params(1), params(2)],
            1,
        );
        check_against_eval(&g, &[Tensor::random(DType::F32, &x, 9)], 1, 1e-4);
    }
    let g =
        single(Op::InstanceNorm { epsilon: 1e-5 }, &[(DType::F32, &x)], &[params(3), params(4)], 1);
    check_against_eval(&g, &[Tensor::random(DType::F32, &x, 10)], 1, 1e-4);
    // Large enough for workgroups.
    let big = [2usize, 8, 40, 40];
    let p = |seed| Some(Tensor::random(DType::F32, &[8], seed));
    let g = single(Op::InstanceNorm { epsilon: 1e-5 }, &[(DType::F32, &big)], &[p(5), p(6)], 1);
    check_against_eval(&g, &[Tensor::random(DType::F32, &big, 11)], 4, 1e-4);
    for groups in [2usize, 4] {
        let g = single(
            Op::GroupNorm { num_groups: groups, epsilon: 1e-5 },
            &[(DType::F32, &[1, 8, 40, 60])],
            &[p(7), p(8)],
            1,
        );
        check_against_eval(&g, &[Tensor::random(DType::F32, &[1, 8, 40, 60], 12)], 4, 1e-4);
    }
}

#[test]
fn rms_lp_and_mean_variance_normalisation() {
    let x = [3usize, 4, 5];
    for (axis, scale_dims) in [(-1i64, vec![5usize]), (1, vec![4, 5]), (0, vec![3, 1, 5])] {
        let scale = Some(Tensor::random(DType::F32, &scale_dims, 12));
        let g = single(Op::RmsNorm { axis, epsilon: 1e-5 }, &[(DType::F32, &x)], &[scale], 1);
        check_against_eval(&g, &[Tensor::random(DType::F32, &x, 13)], 1, 1e-4);
    }
    // A zero row normalises to zeros.
    let mut v = Tensor::random(DType::F32, &x, 14).to_f64s();
    v[..5].iter_mut().for_each(|e| *e = 0.0);
    let zeroed = Tensor::from_f64s(DType::F32, &x, &v).expect("length matches");
    for p in [1u32, 2] {
        for axis in [-1i64, 1] {
            let g = single(Op::LpNorm { axis, p }, &[(DType::F32, &x)], &[], 1);
            check_against_eval(&g, std::slice::from_ref(&zeroed), 1, 1e-5);
        }
    }
    for axes in [vec![0i64, 2], vec![1], vec![0, 1, 2]] {
        let g = single(Op::MeanVarianceNorm { axes }, &[(DType::F32, &x)], &[], 1);
        check_against_eval(&g, &[Tensor::random(DType::F32, &x, 15)], 1, 1e-4);
    }
    let g = single(Op::LpNorm { axis: 1, p: 2 }, &[(DType::F16, &x)], &[], 1);
    check_against_eval(&g, &[Tensor::random(DType::F16, &x, 16)], 1, 2e-3);
}

#[test]
fn local_response_normalisation() {
    for size in [1usize, 2, 3, 4] {
        let op = Op::Lrn(Lrn { alpha: 1e-2, beta: 0.75, bias: 1.5, size });
        let g = single(op, &[(DType::F32, &[2, 5, 3, 4])], &[], 1);
        check_against_eval(&g, &[Tensor::random(DType::F32, &[2, 5, 3, 4], 17)], 1, 1e-5);
    }
}

#[test]
fn einsum_equations() {
    let cases: &[(&str, &[&[usize]])] = &[
        ("ij,jk->ik", &[&[3, 4], &[4, 5]]),
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("ii->i", &[&[4, 4]]),
        ("ii", &[&[4, 4]]),
        ("...ii->...i", &[&[2, 3, 4, 4]]),
        ("ij->", &[&[3, 4]]),
        ("ij->ji", &[&[3, 4]]),
        ("i,i", &[&[5], &[5]]),
        ("ij,ik,il->jkl", &[&[3, 2], &[3, 4], &[3, 2]]),
        ("...j,j...->...", &[&[2, 1, 3], &[3, 4]]),
        ("ab,b", &[&[3, 1], &[4]]),
    ];
    for (eq, shapes) in cases {
        let inputs: Vec<(DType, &[usize])> = shapes.iter().map(|s| (DType::F32, *s)).collect();
        let g = single(Op::Einsum { equation: eq.to_string() }, &inputs, &[], 1);
        let xs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Tensor::random(DType::F32, s, 20 + i as u64))
            .collect();
        check_against_eval(&g, &xs, 1, 1e-5);
    }
    let g = single(
        Op::Einsum { equation: "ij,jk".into() },
        &[(DType::I64, &[3, 4]), (DType::I64, &[4, 2])],
        &[],
        1,
    );
    check_against_eval(
        &g,
        &[Tensor::random(DType::I64, &[3, 4], 30), Tensor::random(DType::I64, &[4, 2], 31)],
        1,
        0.0,
    );
}

fn conv_transpose(
    strides: &[usize],
    dilations: &[usize],
    pads: &[usize],
    group: usize,
    output_padding: &[usize],
    output_shape: &[usize],
) -> Op {
    let window = Window {
        strides: strides.to_vec(),
        dilations: dilations.to_vec(),
        pads: pads.to_vec(),
        auto_pad: AutoPad::NotSet,
    };
    Op::ConvTranspose(ConvTranspose {
        window,
        group,
        output_padding: output_padding.to_vec(),
        output_shape: output_shape.to_vec(),
    })
}

#[test]
fn transposed_convolutions() {
    // (x dims, w dims, op, bias)
    let cases: Vec<(Vec<usize>, Vec<usize>, Op, bool)> = vec![
        (vec![1, 2, 5], vec![2, 3, 3], conv_transpose(&[2], &[1], &[0, 0], 1, &[], &[]), true),
        (
            vec![2, 4, 4, 5],
            vec![4, 3, 3, 2],
            conv_transpose(&[2, 3], &[1, 2], &[1, 0, 2, 1], 2, &[1, 0], &[]),
            true,
        ),
        (
            vec![1, 2, 3, 3],
            vec![2, 2, 3, 3],
            conv_transpose(&[1, 1], &[1, 1], &[0, 0, 0, 0], 1, &[], &[]),
            false,
        ),
        (
            vec![1, 1, 3, 3],
            vec![1, 2, 3, 3],
            conv_transpose(&[3, 2], &[1, 1], &[], 1, &[], &[10, 8]),
            true,
        ),
        // output_shape smaller than the full result: a crop on both sides.
        (vec![1, 1, 4], vec![1, 1, 5], conv_transpose(&[1], &[1], &[], 1, &[], &[3]), false),
        (
            vec![1, 2, 2, 3, 2],
            vec![2, 1, 2, 2, 3],
            conv_transpose(&[2, 1, 2], &[1, 2, 1], &[0, 1, 0, 1, 0, 1], 2, &[], &[]),
            false,
        ),
    ];
    for (xd, wd, op, bias) in cases {
        let m = wd[1]
            * match &op {
                Op::ConvTranspose(c) => c.group,
                _ => 1,
            };
        let b = bias.then(|| Tensor::random(DType::F32, &[m], 40));
        let g =
            single(op, &[(DType::F32, &xd)], &[Some(Tensor::random(DType::F32, &wd, 41)), b], 1);
        check_against_eval(&g, &[Tensor::random(DType::F32, &xd, 42)], 1, 1e-4);
    }
    // Large enough for workgroups.
    let mut window = Window::unit(2);
    window.strides = vec![2, 2];
    window.auto_pad = AutoPad::SameUpper;
    let op = Op::ConvTranspose(ConvTranspose {
        window,
        group: 1,
        output_padding: vec![],
        output_shape: vec![],
    });
    let g = single(
        op,
        &[(DType::F32, &[1, 8, 32, 32])],
        &[Some(Tensor::random(DType::F32, &[8, 4, 3, 3], 43)), None],
        1,
    );
    check_against_eval(&g, &[Tensor::random(DType::F32, &[1, 8, 32, 32], 44)], 4, 1e-4);
    for bias in [false, true] {
        let op = conv_transpose(&[2], &[1], &[1, 1], 2, &[1], &[]);
        let b = bias.then(|| Tensor::random(DType::F32, &[32], 45));
        let g = single(
            op,
            &[(DType::F32, &[1, 8, 600])],
            &[Some(Tensor::random(DType::F32, &[8, 16, 4], 46)), b],
            1,
        );
        check_against_eval(&g, &[Tensor::random(DType::F32, &[1, 8, 600], 47)], 4, 1e-4);
    }
}

fn max_pool(
    kernel: &[usize],
    strides: &[usize],
    pads: &[usize],
    ceil_mode: bool,
    column_major: bool,
) -> Op {
    let window = Window {
        strides: strides.to_vec(),
        dilations: vec![1; kernel.len()],
        pads: pads.to_vec(),
        auto_pad: AutoPad::NotSet,
    };
    Op::Pool(Pool {
        kind: PoolKind::Max,
        kernel: kernel.to_vec(),
        window,
        ceil_mode,
        column_major_indices: column_major,
    })
}

#[test]
fn max_pool_indices_and_integers() {
    for column_major in [false, true] {
        let op = max_pool(&[3, 2], &[2, 1], &[1, 0, 1, 1], true, column_major);
        let g = single(op, &[(DType::F32, &[2, 3, 7, 6])], &[], 2);
        check_against_eval(&g, &[with_specials(&[2, 3, 7, 6], 50)], 1, 0.0);
    }
    for d in [DType::U8, DType::I8, DType::I32] {
        let g = single(
            max_pool(&[2, 2], &[1, 1], &[1, 1, 0, 0], false, false),
            &[(d, &[1, 2, 5, 5])],
            &[],
            1,
        );
        check_against_eval(&g, &[Tensor::random(d, &[1, 2, 5, 5], 51)], 1, 0.0);
    }
    let g = single(max_pool(&[2], &[2], &[0, 0], false, false), &[(DType::I8, &[2, 3, 9])], &[], 2);
    check_against_eval(&g, &[Tensor::random(DType::I8, &[2, 3, 9], 52)], 1, 0.0);
}

#[test]
fn half_precision_convolutions() {
    use kiln_ir::op::Conv;
    let mut window = Window::unit(1);
    window.pads = vec![1, 2];
    let op = Op::Conv(Conv { window, group: 2 });
    let g = single(
        op,
        &[(DType::F16, &[2, 4, 9])],
        &[
            Some(Tensor::random(DType::F16, &[6, 2, 3], 60)),
            Some(Tensor::random(DType::F16, &[6], 61)),
        ],
        1,
    );
    check_against_eval(&g, &[Tensor::random(DType::F16, &[2, 4, 9], 62)], 1, 1e-2);
    let op = Op::Conv(Conv { window: Window::unit(2), group: 1 });
    let g = single(
        op,
        &[(DType::BF16, &[1, 3, 6, 6])],
        &[Some(Tensor::random(DType::BF16, &[4, 3, 3, 3], 63)), None],
        1,
    );
    check_against_eval(&g, &[Tensor::random(DType::BF16, &[1, 3, 6, 6], 64)], 1, 2e-2);
    let op = conv_transpose(&[2, 2], &[1, 1], &[0, 0, 1, 1], 1, &[], &[]);
    let g = single(
        op,
        &[(DType::F16, &[1, 3, 4, 4])],
        &[
            Some(Tensor::random(DType::F16, &[3, 2, 3, 3], 65)),
            Some(Tensor::random(DType::F16, &[2], 66)),
        ],
        1,
    );
    check_against_eval(&g, &[Tensor::random(DType::F16, &[1, 3, 4, 4], 67)], 1, 1e-2);
}
