//! Every rule against central finite differences in f64 on the interpreter: a small graph with
//! seeded random inputs, its result reduced to a scalar loss (the sum of the result times a fixed
//! random tensor, so every result element weighs differently), the appended gradients evaluated
//! and compared, element by element, with (L(x + ε) - L(x - ε)) / 2ε.

mod recurrent;

use super::{append_backward, GradError};
use crate::builder::{ConvOptions, GraphBuilder, Traced};
use crate::op::{AutoPad, Conv, Gemm, Loss, LossReduction, Pool, PoolKind, ReduceKind, Window};
use crate::{eval, DType, Dim, Graph, Op, Tensor, UnaryOp, ValueId};

/// Builds the graph under test from its differentiable inputs (the closure adds any constants:
/// labels, indices, a fixed exponent).
type Build<'a> = &'a dyn for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>;

const EPS: f64 = 1e-6;
const RTOL: f64 = 1e-5;
/// Where a gradient is near zero the difference quotient's rounding (about 1e-16 · |L| / ε)
/// decides, not its relative error.
const ATOL: f64 = 1e-7;

/// Uniform in [-1, 1), seeded.
fn rand(dims: &[usize], seed: u64) -> Tensor {
    Tensor::random(DType::F64, dims, seed)
}

/// Uniform in [0.5, 1.5): away from 0 for Log, Sqrt, a divisor, a Pow base.
fn positive(dims: &[usize], seed: u64) -> Tensor {
    let v: Vec<f64> = rand(dims, seed).to_f64s().iter().map(|x| 1.0 + x / 2.0).collect();
    Tensor::from_f64s(DType::F64, dims, &v).expect("length matches")
}

/// The forward graph (inputs `x0`, `x1`... of `inputs`' shapes, one output `loss`) and the loss.
fn forward(name: &str, inputs: &[Tensor], build: Build) -> (Graph, ValueId) {
    let g = GraphBuilder::new(name);
    let xs: Vec<Traced> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| g.input(&format!("x{i}"), t.dtype(), t.dims()))
        .collect();
    let y = build(&g, &xs);
    let ty = y.ty().unwrap_or_else(|| panic!("{name}: forward failed: {:?}", g.error()));
    let dims = ty.shape.as_fixed().expect("fixed result shape");
    let weights = g.constant("loss_weights", rand(&dims, 7).cast(ty.dtype));
    let loss = y.mul(weights).reduce_sum(&[], false);
    g.output("loss", loss);
    let graph = g.build().unwrap_or_else(|e| panic!("{name}: {e}"));
    let id = graph.outputs()[0].1;
    (graph, id)
}

/// Appends to `graph` the gradient of its first output (the loss) by each named constant, as
/// outputs `d0`, `d1`..., and returns the gradients' element types.
fn add_gradient_outputs(graph: &mut Graph, names: &[String]) -> Vec<DType> {
    let loss = graph.outputs()[0].1;
    let wrt: Vec<ValueId> =
        names.iter().map(|n| ValueId::from(graph.node_by_name(n).expect("constant"))).collect();
    let d = append_backward(graph, loss, &wrt).unwrap_or_else(|e| panic!("{e:?}"));
    let mut types = Vec::with_capacity(d.len());
    for (i, v) in d.into_iter().enumerate() {
        types.push(graph.value_type(v).dtype);
        graph.add_output(&format!("d{i}"), v).expect("output");
    }
    types
}

/// `p0`, `p1`... `p{count - 1}`: the tests' parameter names.
fn numbered(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("p{i}")).collect()
}

fn loss_at(graph: &Graph, inputs: &[Tensor]) -> f64 {
    eval::run(graph, inputs).expect("forward runs")[0].to_f64s()[0]
}

/// Checks the gradient of every input of `build` against finite differences.
fn check(
    name: &str,
    inputs: &[Tensor],
    build: impl for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>,
) {
    let (fwd, loss) = forward(name, inputs, &build);
    let mut graph = fwd.clone();
    let wrt: Vec<ValueId> = graph.inputs().iter().map(|&n| ValueId::from(n)).collect();
    let grads = append_backward(&mut graph, loss, &wrt).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, d) in grads.iter().enumerate() {
        graph.add_output(&format!("d{i}"), *d).expect("a new output");
    }
    let results = eval::run(&graph, inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, x) in inputs.iter().enumerate() {
        let analytic = results[1 + i].to_f64s();
        assert_eq!(results[1 + i].dims(), x.dims(), "{name}: gradient {i} shape");
        let base = x.to_f64s();
        for (j, a) in analytic.iter().enumerate() {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[j] += delta;
                let mut moved = inputs.to_vec();
                moved[i] = Tensor::from_f64s(x.dtype(), x.dims(), &v).expect("same length");
                loss_at(&fwd, &moved)
            };
            let numeric = (at(EPS) - at(-EPS)) / (2.0 * EPS);
            assert!(
                (a - numeric).abs() <= ATOL + RTOL * numeric.abs().max(a.abs()),
                "{name}: d loss / d x{i}[{j}]: rule {a}, finite differences {numeric}"
            );
        }
    }
}

fn f64s<'g>(g: &'g GraphBuilder, dims: &[usize], v: &[f64]) -> Traced<'g> {
    g.anon_constant(Tensor::from_f64s(DType::F64, dims, v).expect("length matches"))
}

fn ints<'g>(g: &'g GraphBuilder, dims: &[usize], v: &[i64]) -> Traced<'g> {
    g.anon_constant(Tensor::from_vec(dims, v.to_vec()).expect("length matches"))
}

#[test]
fn elementwise_arithmetic_with_broadcasting() {
    let (a, b) = (rand(&[2, 3, 4], 1), rand(&[3, 1], 2));
    check("add", &[a.clone(), b.clone()], |_, x| x[0].add(x[1]));
    check("sub", &[b.clone(), a.clone()], |_, x| x[0].sub(x[1]));
    check("mul", &[a.clone(), b.clone()], |_, x| x[0].mul(x[1]));
    check("div", &[a.clone(), positive(&[4], 3)], |_, x| x[0].div(x[1]));
    check("div_numerator_broadcast", &[positive(&[1, 4], 3), positive(&[3, 4], 4)], |_, x| {
        x[0].div(x[1])
    });
    check("neg", &[a.clone()], |_, x| x[0].neg());
    check("scalar_operand", &[a.clone(), rand(&[], 5)], |_, x| x[0].mul(x[1]));
}

#[test]
fn pow_by_a_constant_and_by_a_value() {
    check("pow_const", &[positive(&[3, 4], 1)], |_, x| x[0].pow(x[0].scalar(3.0)));
    check("pow_fraction", &[positive(&[3, 4], 2)], |_, x| x[0].pow(x[0].scalar(-1.5)));
    check("pow_int_exponent", &[rand(&[3, 4], 3)], |g, x| {
        x[0].pow(g.anon_constant(Tensor::scalar(2i64)))
    });
    check("pow_both", &[positive(&[3, 4], 4), rand(&[4], 5)], |_, x| x[0].pow(x[1]));
}

#[test]
fn unary_functions() {
    let (x, p) = (rand(&[3, 5], 11), positive(&[3, 5], 12));
    check("sqrt", &[p.clone()], |_, x| x[0].sqrt());
    check("exp", &[x.clone()], |_, x| x[0].exp());
    check("log", &[p.clone()], |_, x| x[0].log());
    check("reciprocal", &[p.clone()], |_, x| x[0].reciprocal());
    check("rsqrt", &[p.clone()], |_, x| x[0].unary(UnaryOp::Rsqrt));
    check("abs", &[x.clone()], |_, x| x[0].abs());
    check("identity", &[x.clone()], |_, x| x[0].identity());
}

#[test]
fn activations() {
    let x = rand(&[4, 5], 21).to_f64s().iter().map(|v| v * 3.0).collect::<Vec<_>>();
    let x = Tensor::from_f64s(DType::F64, &[4, 5], &x).expect("length");
    check("relu", &[x.clone()], |_, x| x[0].relu());
    check("leaky_relu", &[x.clone()], |_, x| x[0].unary(UnaryOp::LeakyRelu { alpha: 0.1 }));
    check("sigmoid", &[x.clone()], |_, x| x[0].sigmoid());
    check("tanh", &[x.clone()], |_, x| x[0].tanh());
    check("erf", &[x.clone()], |_, x| x[0].erf());
    check("gelu", &[x.clone()], |_, x| x[0].gelu());
    check("gelu_tanh", &[x.clone()], |_, x| x[0].gelu_tanh());
    check("silu", &[x.clone()], |_, x| x[0].unary(UnaryOp::Swish { alpha: 1.0 }));
    check("swish", &[x.clone()], |_, x| x[0].unary(UnaryOp::Swish { alpha: 0.7 }));
    check("hardswish", &[x.clone()], |_, x| x[0].unary(UnaryOp::HardSwish));
    check("clip", &[x.clone()], |_, x| x[0].clip(-1.0, 1.5));
    check("clip_low_only", &[x.clone()], |g, x| {
        g.apply(Op::Clip, &[Some(x[0]), Some(x[0].scalar(-0.5))], 1)[0]
    });
    check("max", &[x.clone(), rand(&[5], 23)], |_, x| x[0].max(x[1]));
    check("min", &[rand(&[5], 24), x.clone()], |_, x| x[0].min(x[1]));
    check("where", &[x.clone(), rand(&[5], 22)], |_, x| {
        x[0].greater(x[0].scalar(0.0)).select(x[0], x[1])
    });
}

#[test]
fn matmul_batched_broadcast_and_vectors() {
    check("matmul", &[rand(&[3, 4], 1), rand(&[4, 2], 2)], |_, x| x[0].matmul(x[1]));
    check("matmul_batched", &[rand(&[2, 1, 3, 4], 3), rand(&[5, 4, 2], 4)], |_, x| {
        x[0].matmul(x[1])
    });
    check("matmul_vec_mat", &[rand(&[4], 5), rand(&[2, 4, 3], 6)], |_, x| x[0].matmul(x[1]));
    check("matmul_mat_vec", &[rand(&[2, 3, 4], 7), rand(&[4], 8)], |_, x| x[0].matmul(x[1]));
    check("matmul_dot", &[rand(&[4], 9), rand(&[4], 10)], |_, x| x[0].matmul(x[1]));
}

#[test]
fn gemm_transposes_alpha_beta_and_c() {
    check("gemm", &[rand(&[3, 4], 1), rand(&[4, 2], 2), rand(&[2], 3)], |_, x| {
        x[0].gemm(x[1], Some(x[2]), Gemm::default())
    });
    check("gemm_ta", &[rand(&[4, 3], 4), rand(&[4, 2], 5), rand(&[3, 2], 6)], |_, x| {
        x[0].gemm(x[1], Some(x[2]), Gemm { trans_a: true, alpha: 0.5, ..Gemm::default() })
    });
    check("gemm_tb", &[rand(&[3, 4], 7), rand(&[2, 4], 8), rand(&[3, 1], 9)], |_, x| {
        x[0].gemm(x[1], Some(x[2]), Gemm { trans_b: true, beta: 2.0, ..Gemm::default() })
    });
    check("gemm_tab", &[rand(&[4, 3], 10), rand(&[2, 4], 11)], |_, x| {
        let g = Gemm { trans_a: true, trans_b: true, alpha: -1.5, beta: 1.0 };
        x[0].gemm(x[1], None, g)
    });
}

fn conv_op(strides: &[usize], pads: &[usize], dilations: &[usize], group: usize) -> Op {
    Op::Conv(Conv {
        window: Window {
            strides: strides.to_vec(),
            dilations: dilations.to_vec(),
            pads: pads.to_vec(),
            auto_pad: AutoPad::NotSet,
        },
        group,
    })
}

#[test]
fn conv_stride_pad_dilation_group_bias() {
    let (x, w, b) = (rand(&[2, 2, 5, 5], 1), rand(&[3, 2, 3, 3], 2), rand(&[3], 3));
    check("conv", &[x.clone(), w.clone(), b], |_, x| {
        x[0].conv(x[1], Some(x[2]), ConvOptions::default().pad(1))
    });
    check("conv_stride", &[x.clone(), w.clone()], |_, x| {
        x[0].conv(x[1], None, ConvOptions::default().stride(2))
    });
    check("conv_stride_uneven", &[rand(&[1, 2, 6, 7], 4), w.clone()], |g, x| {
        // 6 and 7 at stride 2 leave input rows no window reads, and the pads differ per side.
        g.apply(conv_op(&[2, 2], &[0, 1, 1, 0], &[1, 1], 1), &[Some(x[0]), Some(x[1])], 1)[0]
    });
    check("conv_dilation", &[rand(&[1, 2, 7, 6], 5), rand(&[2, 2, 2, 3], 6)], |g, x| {
        g.apply(conv_op(&[1, 2], &[1, 0, 1, 1], &[2, 1], 1), &[Some(x[0]), Some(x[1])], 1)[0]
    });
    check(
        "conv_group",
        &[rand(&[2, 4, 5, 5], 7), rand(&[6, 2, 3, 3], 8), rand(&[6], 9)],
        |_, x| x[0].conv(x[1], Some(x[2]), ConvOptions::default().group(2).pad(1).stride(2)),
    );
    check("conv_same_upper", &[rand(&[1, 1, 5, 5], 10), rand(&[2, 1, 2, 2], 11)], |g, x| {
        let c =
            Conv { window: Window { auto_pad: AutoPad::SameUpper, ..Window::unit(2) }, group: 1 };
        g.apply(Op::Conv(c), &[Some(x[0]), Some(x[1])], 1)[0]
    });
    check("conv_1d", &[rand(&[2, 2, 7], 12), rand(&[3, 2, 3], 13)], |_, x| {
        x[0].conv(x[1], None, ConvOptions::default().stride(2).pad(1))
    });
}

fn pool(kind: PoolKind, kernel: usize, stride: usize, pads: &[usize], ceil_mode: bool) -> Op {
    Op::Pool(Pool {
        kind,
        kernel: vec![kernel; 2],
        window: Window {
            strides: vec![stride; 2],
            dilations: vec![1; 2],
            pads: pads.to_vec(),
            auto_pad: AutoPad::NotSet,
        },
        ceil_mode,
        column_major_indices: false,
    })
}

#[test]
fn max_pool_through_its_indices() {
    // Random values have no ties, so the maximum of every window is unique.
    let x = rand(&[2, 2, 6, 6], 1);
    check("max_pool", &[x.clone()], |_, x| x[0].max_pool(2, 2, 0));
    check("max_pool_overlap", &[x.clone()], |_, x| x[0].max_pool(3, 1, 1));
    check("max_pool_ceil", &[rand(&[1, 2, 5, 5], 2)], |g, x| {
        g.apply(pool(PoolKind::Max, 2, 2, &[0, 0, 0, 0], true), &[Some(x[0])], 1)[0]
    });
}

#[test]
fn average_pools() {
    let x = rand(&[2, 2, 5, 5], 1);
    check("avg_pool", &[x.clone()], |_, x| x[0].avg_pool(2, 2, 0));
    check("avg_pool_pad_excluded", &[x.clone()], |_, x| x[0].avg_pool(3, 2, 1));
    check("avg_pool_pad_included", &[x.clone()], |g, x| {
        let kind = PoolKind::Average { count_include_pad: true };
        g.apply(pool(kind, 3, 2, &[1, 1, 1, 1], false), &[Some(x[0])], 1)[0]
    });
    check("avg_pool_ceil", &[rand(&[1, 1, 6, 6], 2)], |g, x| {
        let kind = PoolKind::Average { count_include_pad: false };
        g.apply(pool(kind, 3, 2, &[0, 0, 1, 1], true), &[Some(x[0])], 1)[0]
    });
    check("global_avg_pool", &[x.clone()], |_, x| x[0].global_avg_pool());
    check("global_max_pool", &[x.clone()], |g, x| {
        g.apply(Op::GlobalPool(PoolKind::Max), &[Some(x[0])], 1)[0]
    });
    check("global_lp_pool_2", &[x.clone()], |g, x| {
        g.apply(Op::GlobalPool(PoolKind::Lp { p: 2 }), &[Some(x[0])], 1)[0]
    });
    check("global_lp_pool_3", &[x.clone()], |g, x| {
        g.apply(Op::GlobalPool(PoolKind::Lp { p: 3 }), &[Some(x[0])], 1)[0]
    });
}

#[test]
fn movement() {
    let x = rand(&[2, 3, 4], 1);
    check("reshape", &[x.clone()], |_, x| x[0].reshape(&[4, -1]));
    check("flatten", &[x.clone()], |_, x| x[0].flatten(2));
    check("squeeze_unsqueeze", &[rand(&[2, 1, 3], 2)], |_, x| x[0].squeeze(&[1]).unsqueeze(&[0]));
    check("transpose", &[x.clone()], |_, x| x[0].transpose(&[2, 0, 1]));
    check("concat", &[x.clone(), rand(&[2, 2, 4], 3)], |g, x| g.concat(&[x[0], x[1], x[0]], 1));
    check("split", &[x.clone()], |_, x| {
        let parts = x[0].split(2, &[1, 3]);
        parts[1].mul(parts[1])
    });
    check("split_one_part_used", &[x.clone()], |_, x| x[0].split(1, &[2, 1])[1]);
    check("slice", &[rand(&[5, 6], 4)], |_, x| x[0].slice(&[1, 5], &[4, 0], &[0, 1], &[1, -2]));
    check("gather_repeats", &[x.clone()], |g, x| x[0].gather(ints(g, &[2, 2], &[2, 0, 2, -1]), 1));
    check("expand", &[rand(&[3, 1], 5)], |_, x| x[0].expand(&[2, 3, 4]));
}

#[test]
fn softmax_and_log_softmax() {
    let x = rand(&[3, 5], 1);
    check("softmax", &[x.clone()], |_, x| x[0].softmax(-1));
    check("softmax_axis0", &[x.clone()], |_, x| x[0].softmax(0));
    check("log_softmax", &[x.clone()], |g, x| {
        g.apply(Op::LogSoftmax { axis: 1 }, &[Some(x[0])], 1)[0]
    });
}

fn loss_op(sce: bool, reduction: LossReduction, ignore_index: Option<i64>) -> Op {
    let l = Loss { reduction, ignore_index };
    if sce {
        Op::SoftmaxCrossEntropyLoss(l)
    } else {
        Op::NllLoss(l)
    }
}

#[test]
fn softmax_cross_entropy_and_nll() {
    let scores = rand(&[4, 3], 1);
    check("sce_mean", &[scores.clone()], |g, x| {
        let labels = ints(g, &[4], &[0, 2, 1, 2]);
        g.apply(loss_op(true, LossReduction::Mean, None), &[Some(x[0]), Some(labels)], 1)[0]
    });
    check("sce_sum_weighted_ignored", &[scores.clone()], |g, x| {
        let labels = ints(g, &[4], &[0, -1, 1, 2]);
        let weights = f64s(g, &[3], &[0.5, 2.0, 1.5]);
        let op = loss_op(true, LossReduction::Sum, Some(-1));
        g.apply(op, &[Some(x[0]), Some(labels), Some(weights)], 1)[0]
    });
    check("sce_mean_weighted_ignored", &[scores.clone()], |g, x| {
        let labels = ints(g, &[4], &[0, 1, 1, 2]);
        let weights = f64s(g, &[3], &[0.5, 2.0, 1.5]);
        let op = loss_op(true, LossReduction::Mean, Some(1));
        g.apply(op, &[Some(x[0]), Some(labels), Some(weights)], 1)[0]
    });
    check("sce_none_spatial_with_log_prob", &[rand(&[2, 3, 2], 2)], |g, x| {
        let labels = ints(g, &[2, 2], &[0, 2, 1, 1]);
        let r = g.apply(loss_op(true, LossReduction::None, None), &[Some(x[0]), Some(labels)], 2);
        // Both results feed the loss.
        r[0].reduce_sum(&[1], false).add(r[1].reduce_mean(&[1, 2], false))
    });
    check("nll_mean", &[rand(&[4, 3], 3)], |g, x| {
        let labels = ints(g, &[4], &[1, 0, 2, 2]);
        let log_prob = g.apply(Op::LogSoftmax { axis: 1 }, &[Some(x[0])], 1)[0];
        g.apply(loss_op(false, LossReduction::Mean, None), &[Some(log_prob), Some(labels)], 1)[0]
    });
    check("nll_none_weighted", &[rand(&[4, 3], 4)], |g, x| {
        let labels = ints(g, &[4], &[1, 0, 2, 2]);
        let weights = f64s(g, &[3], &[1.0, 3.0, 0.25]);
        let op = loss_op(false, LossReduction::None, None);
        g.apply(op, &[Some(x[0]), Some(labels), Some(weights)], 1)[0]
    });
}

#[test]
fn reductions() {
    let x = rand(&[2, 3, 4], 1);
    check("reduce_sum", &[x.clone()], |_, x| x[0].reduce_sum(&[1], false));
    check("reduce_sum_keep", &[x.clone()], |_, x| x[0].reduce_sum(&[0, -1], true));
    check("reduce_sum_all", &[x.clone()], |_, x| x[0].reduce_sum(&[], false));
    check("reduce_mean", &[x.clone()], |_, x| x[0].reduce_mean(&[2, 0], false));
    check("reduce_mean_keep", &[x.clone()], |_, x| x[0].reduce_mean(&[1], true));
    check("reduce_sum_square", &[x.clone()], |_, x| {
        x[0].reduce(ReduceKind::SumSquare, &[1], false)
    });
    check("reduce_l1", &[x.clone()], |_, x| x[0].reduce(ReduceKind::L1, &[2], false));
    check("reduce_l2", &[x.clone()], |_, x| x[0].reduce(ReduceKind::L2, &[0, 2], true));
    check("reduce_log_sum", &[positive(&[2, 3, 4], 2)], |_, x| {
        x[0].reduce(ReduceKind::LogSum, &[1], false)
    });
    check("reduce_log_sum_exp", &[x.clone()], |_, x| {
        x[0].reduce(ReduceKind::LogSumExp, &[-1], false)
    });
    // Random values have no ties, so the maximum is differentiable where it is checked.
    check("reduce_max", &[x.clone()], |_, x| x[0].reduce_max(&[1], false));
    check("reduce_min_all", &[x.clone()], |_, x| x[0].reduce(ReduceKind::Min, &[], true));
}

/// LayerNormalization of a bf16 x has f32 statistics: a loss reading them differentiates, the
/// gradient typed as x (it was a builder type error).
#[test]
fn layer_norm_statistics_of_a_half_input() {
    let g = GraphBuilder::new("half_ln");
    let x = g.input("x", DType::BF16, [2, 4]);
    let s = g.input("s", DType::BF16, [4]);
    let r = g.apply(Op::LayerNorm { axis: -1, epsilon: 1e-2 }, &[Some(x), Some(s)], 3);
    let loss = r[1].mul(r[2]).reduce_sum(&[], false);
    g.output("loss", loss);
    let mut graph = g.build().unwrap();
    let (loss, xv) = (graph.outputs()[0].1, ValueId::from(graph.inputs()[0]));
    let d = append_backward(&mut graph, loss, &[xv]).unwrap()[0];
    assert_eq!(graph.value_type(d).dtype, DType::BF16);
    graph.add_output("dx", d).unwrap();
    let x = Tensor::random(DType::F32, &[2, 4], 3).cast(DType::BF16);
    let s = Tensor::random(DType::F32, &[4], 4).cast(DType::BF16);
    let out = eval::run(&graph, &[x, s]).unwrap();
    assert!(out[1].to_f64s().iter().all(|v| v.is_finite()));
}

/// Where the maximum is tied its gradient is shared equally (PyTorch's amax), and a zero L2
/// norm gives its elements 0, not 0/0: both points where finite differences do not apply.
#[test]
fn reductions_at_ties_and_zero() {
    let g = GraphBuilder::new("ties");
    let x = g.input("x", DType::F64, [2, 3]);
    let max = x.reduce_max(&[1], false);
    let l2 = x.reduce(ReduceKind::L2, &[1], false);
    g.output("loss", max.add(l2).reduce_sum(&[], false));
    let mut graph = g.build().unwrap();
    let (loss, xv) = (graph.outputs()[0].1, ValueId::from(graph.inputs()[0]));
    let d = append_backward(&mut graph, loss, &[xv]).unwrap()[0];
    graph.add_output("dx", d).unwrap();
    let x = Tensor::from_f64s(DType::F64, &[2, 3], &[3.0, 1.0, 3.0, 0.0, 0.0, 0.0]).unwrap();
    let got = eval::run(&graph, &[x]).unwrap()[1].to_f64s();
    // Row 0: the max's 1 shared by the two 3s; L2's x/|x| with |x| = √19. Row 1: all zero, the
    // max's 1 shared three ways and nothing from L2.
    let n = 19f64.sqrt();
    let want = [0.5 + 3.0 / n, 1.0 / n, 0.5 + 3.0 / n, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "got {got:?}, want {want:?}");
    }
}

#[test]
fn normalisations() {
    let x = rand(&[2, 3, 4], 1);
    check("layer_norm", &[x.clone(), rand(&[4], 2), rand(&[4], 3)], |_, x| {
        x[0].layer_norm(x[1], x[2], -1, 1e-5)
    });
    check("layer_norm_two_axes", &[x.clone(), rand(&[3, 4], 4), rand(&[4], 5)], |_, x| {
        x[0].layer_norm(x[1], x[2], 1, 1e-3)
    });
    // LayerNormalization's Mean and InvStdDev results read by the loss: with y, each alone
    // (y then has no gradient), and over two axes.
    let affine = [x.clone(), rand(&[4], 2), rand(&[4], 3)];
    check("layer_norm_statistics", &affine, |g, x| {
        let r = g.apply(
            Op::LayerNorm { axis: -1, epsilon: 1e-2 },
            &[Some(x[0]), Some(x[1]), Some(x[2])],
            3,
        );
        r[0].add(r[1]).add(r[2].mul(r[2]))
    });
    check("layer_norm_mean", &affine, |g, x| {
        let r = g.apply(
            Op::LayerNorm { axis: -1, epsilon: 1e-2 },
            &[Some(x[0]), Some(x[1]), Some(x[2])],
            3,
        );
        r[1].mul(r[1])
    });
    check("layer_norm_inv_std", &affine, |g, x| {
        let r = g.apply(
            Op::LayerNorm { axis: -1, epsilon: 1e-2 },
            &[Some(x[0]), Some(x[1]), Some(x[2])],
            3,
        );
        r[2]
    });
    check("layer_norm_statistics_two_axes", &[x.clone(), rand(&[3, 4], 4)], |g, x| {
        let r = g.apply(Op::LayerNorm { axis: 1, epsilon: 1e-2 }, &[Some(x[0]), Some(x[1])], 3);
        r[0].add(r[1].mul(r[2]))
    });
    let stats = [rand(&[3], 6), rand(&[3], 7), rand(&[3], 8), positive(&[3], 9)];
    let mut inputs = vec![rand(&[2, 3, 2, 2], 10)];
    inputs.extend(stats);
    check("batch_norm_inference", &inputs, |_, x| x[0].batch_norm(x[1], x[2], x[3], x[4], 1e-5));
}

/// Training-mode BatchNormalization (batch statistics, `train::batch_norm_training`) has no rule
/// of its own: the inference rule's statistics gradients chained through ReduceMean's must give
/// the full gradient, of the result and of the running statistics.
#[test]
fn batch_norm_training_mode() {
    fn stats(g: &GraphBuilder) -> (Traced<'_>, Traced<'_>) {
        (f64s(g, &[2], &[0.1, -0.2]), f64s(g, &[2], &[1.0, 0.5]))
    }
    let x = rand(&[3, 2, 2, 2], 11);
    check("batch_norm_training", &[x.clone(), rand(&[2], 12), rand(&[2], 13)], |g, x| {
        let (m, v) = stats(g);
        crate::train::batch_norm_training(x[0], x[1], x[2], m, v, 1e-5, 0.9).y
    });
    check(
        "batch_norm_training_2d",
        &[rand(&[5, 2], 14), rand(&[2], 15), rand(&[2], 16)],
        |g, x| {
            let (m, v) = stats(g);
            crate::train::batch_norm_training(x[0], x[1], x[2], m, v, 1e-3, 0.9).y
        },
    );
    check("batch_norm_training_running_stats", &[x], |g, x| {
        let (m, v) = stats(g);
        let (scale, bias) = (f64s(g, &[2], &[1.5, 0.5]), f64s(g, &[2], &[0.0, 0.1]));
        let r = crate::train::batch_norm_training(x[0], scale, bias, m, v, 1e-5, 0.8);
        r.running_mean.add(r.running_var.mul(r.running_var))
    });
}

/// Training-mode Dropout (`train::dropout`) has no rule of its own: its Where gives the gradient
/// where kept, scaled by 1 / (1 - ratio), and zero where dropped.
#[test]
fn dropout_training_mode() {
    check("dropout", &[rand(&[4, 5], 17)], |g, x| {
        let ratio = g.anon_constant(Tensor::scalar(0.4f64));
        let seed = g.anon_constant(Tensor::scalar(11u32));
        crate::train::dropout(x[0], ratio, seed).y
    });
}

#[test]
fn a_value_used_many_times_sums_its_gradients() {
    check("reuse", &[rand(&[3, 4], 1)], |_, x| x[0].mul(x[0]).add(x[0].exp()).mul(x[0]));
}

#[test]
fn a_two_layer_mlp_end_to_end() {
    // x [4, 6] constant; parameters w1, b1, w2, b2; a mean softmax cross-entropy.
    let params = [rand(&[6, 8], 1), rand(&[8], 2), rand(&[8, 3], 3), rand(&[3], 4)];
    check("mlp", &params, |g, p| {
        let x = g.anon_constant(rand(&[4, 6], 5));
        let labels = ints(g, &[4], &[2, 0, 1, 1]);
        let logits = x.matmul(p[0]).add(p[1]).relu().matmul(p[2]).add(p[3]);
        let op = loss_op(true, LossReduction::Mean, None);
        g.apply(op, &[Some(logits), Some(labels)], 1)[0]
    });
}

#[test]
fn a_small_cnn_end_to_end() {
    // The CIFAR-10 CNN's shape in small: Conv, Relu, MaxPool, Flatten, Gemm, cross-entropy.
    let params = [rand(&[3, 2, 3, 3], 1), rand(&[3], 2), rand(&[4, 27], 3), rand(&[4], 4)];
    check("cnn", &params, |g, p| {
        let x = g.anon_constant(rand(&[2, 2, 6, 6], 5));
        let labels = ints(g, &[2], &[3, 1]);
        let h = x.conv(p[0], Some(p[1]), ConvOptions::default().pad(1)).relu().max_pool(2, 2, 0);
        let logits = h.flatten(1).linear(p[2], p[3]);
        let op = loss_op(true, LossReduction::Mean, None);
        g.apply(op, &[Some(logits), Some(labels)], 1)[0]
    });
}

#[test]
fn an_op_without_a_rule_is_a_typed_error_naming_the_node() {
    let g = GraphBuilder::new("no_rule");
    let x = g.input("x", DType::F64, [3]);
    let y = x.unary(UnaryOp::Cos).named("the_cos").reduce_sum(&[], false);
    g.output("loss", y);
    let mut graph = g.build().expect("builds");
    let before = crate::text::print(&graph, crate::text::Weights::Full);
    let (loss, x) = (graph.outputs()[0].1, ValueId::from(graph.inputs()[0]));
    let e = append_backward(&mut graph, loss, &[x]).expect_err("Cos has no rule");
    assert_eq!(e, GradError::NoRule { node: "the_cos".into(), op: "Cos" });
    assert_eq!(e.to_string(), "node `the_cos` (Cos): no gradient rule for Cos");
    assert_eq!(crate::text::print(&graph, crate::text::Weights::Full), before, "graph unchanged");
}

#[test]
fn values_off_the_path_need_no_rule_and_unused_parameters_get_zeros() {
    let g = GraphBuilder::new("paths");
    let x = g.input("x", DType::F32, [3]);
    let unused = g.input("unused", DType::F32, [2, 2]);
    // Cos has no rule, but nothing between x and the loss goes through it.
    g.output("side", unused.unary(UnaryOp::Cos));
    g.output("loss", x.mul(x).reduce_sum(&[], false));
    let mut graph = g.build().expect("builds");
    let loss = graph.outputs()[1].1;
    let wrt: Vec<ValueId> = graph.inputs().iter().map(|&n| ValueId::from(n)).collect();
    let d = append_backward(&mut graph, loss, &wrt).expect("differentiates");
    graph.add_output("dx", d[0]).expect("output");
    graph.add_output("dunused", d[1]).expect("output");
    let x = Tensor::from_vec(&[3], vec![1f32, -2.0, 0.5]).expect("tensor");
    let out = eval::run(&graph, &[x, Tensor::zeros(DType::F32, &[2, 2])]).expect("runs");
    assert_eq!(out[2].to_f64s(), vec![2.0, -4.0, 1.0]);
    assert_eq!(out[3].to_f64s(), vec![0.0; 4]);
}

#[test]
fn the_loss_must_be_one_float_element() {
    let g = GraphBuilder::new("vector_loss");
    let x = g.input("x", DType::F64, [3]);
    g.output("y", x.relu().named("y"));
    let mut graph = g.build().expect("builds");
    let (y, x) = (graph.outputs()[0].1, ValueId::from(graph.inputs()[0]));
    let e = append_backward(&mut graph, y, &[x]).expect_err("not a scalar");
    assert!(matches!(e, GradError::LossNotScalar { .. }), "{e}");
}

/// The CNN with the batch as a symbol (as exported models have it) and its parameters as
/// constants (as imported weights are): the backward graph builds with symbolic shapes, and on a
/// concrete batch gives the gradients the fixed-shape graph gives.
#[test]
fn a_symbolic_batch_and_constant_parameters() {
    let params = [rand(&[3, 2, 3, 3], 1), rand(&[3], 2), rand(&[4, 27], 3), rand(&[4], 4)];
    let build = |batch: Dim| {
        let g = GraphBuilder::new("cnn_symbolic");
        let x = g.input("x", DType::F64, vec![batch.clone(), 2.into(), 6.into(), 6.into()]);
        let labels = g.input("labels", DType::I64, vec![batch]);
        let p: Vec<Traced> = params
            .iter()
            .enumerate()
            .map(|(i, t)| g.constant(&format!("p{i}"), t.clone()))
            .collect();
        let h = x.conv(p[0], Some(p[1]), ConvOptions::default().pad(1)).relu();
        let h = h.max_pool(2, 2, 0).avg_pool(1, 1, 0).global_avg_pool().flatten(1);
        let h = g.concat(&[h, x.reduce_mean(&[2, 3], false).flatten(1)], 1);
        let logits = h.reshape(&[-1, 5]).matmul(g.anon_constant(rand(&[5, 4], 9))).add(p[3]);
        let op = loss_op(true, LossReduction::Mean, None);
        let loss = g.apply(op, &[Some(logits), Some(labels)], 1)[0];
        g.output("loss", loss);
        let mut graph = g.build().expect("builds");
        add_gradient_outputs(&mut graph, &numbered(4));
        graph
    };
    let x = rand(&[2, 2, 6, 6], 5);
    let labels = Tensor::from_vec(&[2], vec![3i64, 1]).expect("labels");
    let symbolic = eval::run(&build(Dim::sym("N")), &[x.clone(), labels.clone()]).expect("runs");
    let fixed = eval::run(&build(Dim::Fixed(2)), &[x, labels]).expect("runs");
    for (s, f) in symbolic.iter().zip(&fixed) {
        assert_eq!(s.dims(), f.dims());
        for (a, b) in s.to_f64s().iter().zip(f.to_f64s()) {
            assert!((a - b).abs() <= 1e-12, "{a} vs {b}");
        }
    }
    // The third parameter (p2) is not used: its gradient is zeros.
    assert!(symbolic[3].to_f64s().iter().all(|&v| v == 0.0));
}

/// The backward graph is built in the forward's element type: an f32 network (Conv, BatchNorm,
/// Relu, AveragePool, LayerNorm, Gemm, cross-entropy) gives in f32 the gradients it gives in f64,
/// to f32's precision.
#[test]
fn f32_graphs_get_f32_gradients() {
    let run = |dtype: DType| {
        let g = GraphBuilder::new("f32");
        let c =
            |name: &str, dims: &[usize], seed: u64| g.constant(name, rand(dims, seed).cast(dtype));
        let x = c("x", &[2, 2, 6, 6], 1);
        let w = c("w", &[3, 2, 3, 3], 2);
        let (scale, bias, mean) = (c("s", &[3], 3), c("b", &[3], 4), c("m", &[3], 5));
        let var = g.constant("v", positive(&[3], 6).cast(dtype));
        let fc = c("fc", &[4, 27], 7);
        let h =
            x.conv(w, None, ConvOptions::default().pad(1)).batch_norm(scale, bias, mean, var, 1e-5);
        let h = h.relu().avg_pool(2, 2, 0).flatten(1);
        let h = h
            .layer_norm(c("ln_s", &[27], 8), c("ln_b", &[27], 9), -1, 1e-5)
            .linear(fc, bias.slice(&[0], &[1], &[0], &[1]));
        let labels = ints(&g, &[2], &[3, 0]);
        let loss =
            g.apply(loss_op(true, LossReduction::Mean, None), &[Some(h), Some(labels)], 1)[0];
        g.output("loss", loss);
        let mut graph = g.build().expect("builds");
        for t in
            add_gradient_outputs(&mut graph, &["w".to_string(), "s".to_string(), "fc".to_string()])
        {
            assert_eq!(t, dtype);
        }
        eval::run(&graph, &[]).expect("runs")
    };
    let (single, double) = (run(DType::F32), run(DType::F64));
    for (s, d) in single.iter().zip(&double) {
        for (a, b) in s.to_f64s().iter().zip(d.to_f64s()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "f32 {a} vs f64 {b}");
        }
    }
}
