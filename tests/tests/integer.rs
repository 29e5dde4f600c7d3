//! Integer convolutions on the CPU: DequantizeLinear -> Conv -> QuantizeLinear (onnxruntime's QDQ
//! form) becomes a QConv on the integer kernel (`backend/cpu/passes/integer.rs`, `quantized.c`), with and
//! without VNNI and on AMX tiles, against the interpreter running the float form. Each case also checks that the
//! integer kernel took the convolution, so a regression to the float path fails here.

use kiln_compiler::{Options, Stage};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::LoadOptions;

/// Deterministic values in [lo, hi] (integers) for a seed.
pub(crate) fn ints(n: usize, lo: i64, hi: i64, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (lo + (s % (hi - lo + 1) as u64) as i64) as f64
        })
        .collect()
}

struct Case {
    batch: usize,
    c: usize,
    hw: [usize; 2],
    m: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    signed_out: bool,
    per_channel: bool,
    /// s8 activations (onnxruntime's `activation_type=QInt8`).
    signed_in: bool,
    /// 1, or the channels (depthwise).
    group: usize,
}

/// Between the convolution and the QuantizeLinear.
#[derive(Clone, Copy)]
enum Activation {
    None,
    Relu,
    Clip(f32, f32),
}

/// Q(Conv(DQ(x), DQ(w), DQ(b))) as onnxruntime's quantizer writes it, and an input.
fn qdq_conv(case: &Case, seed: u64) -> (Graph, Tensor) {
    qdq_conv_with(case, seed, Activation::None)
}

/// `qdq_conv` with an activation between the convolution and the QuantizeLinear, as other
/// quantizers (PyTorch's) leave it.
fn qdq_conv_with(case: &Case, seed: u64, act: Activation) -> (Graph, Tensor) {
    let Case {
        batch,
        c,
        hw,
        m,
        k,
        stride,
        pad,
        dilation,
        signed_out,
        per_channel,
        signed_in,
        group,
    } = *case;
    let (x_type, zx, lo, hi) =
        if signed_in { (DType::I8, -11.0, -128, 127) } else { (DType::U8, 37.0, 0, 255) };
    let g = GraphBuilder::new("qdq_conv");
    let x = g.input("x", x_type, [batch, c, hw[0], hw[1]]);
    let t = |d: DType, dims: &[usize], v: Vec<f64>| Tensor::from_f64s(d, dims, &v).unwrap();
    let x_scale = 0.02f32;
    let w_scales: Vec<f64> = if per_channel {
        ints(m, 1, 40, seed + 1).iter().map(|v| v * 0.0005).collect()
    } else {
        vec![0.004]
    };
    let sx = g.constant("sx", t(DType::F32, &[], vec![x_scale as f64]));
    let zx = g.constant("zx", t(x_type, &[], vec![zx]));
    let cg = c / group;
    let wq =
        g.constant("w", t(DType::I8, &[m, cg, k, k], ints(m * cg * k * k, -127, 127, seed + 2)));
    let wdims = if per_channel { vec![m] } else { vec![] };
    let sw = g.constant("sw", t(DType::F32, &wdims, w_scales.clone()));
    let zw = g.constant("zw", t(DType::I8, &wdims, vec![0.0; w_scales.len()]));
    let bias = g.constant("b", t(DType::I32, &[m], ints(m, -3000, 3000, seed + 3)));
    let bias_scales: Vec<f64> =
        (0..w_scales.len()).map(|i| (x_scale * w_scales[i] as f32) as f64).collect();
    let sb = g.constant("sb", t(DType::F32, &wdims, bias_scales));
    let deq = |v, s, z, axis| {
        g.apply(Op::Dequantize { axis, block_size: 0 }, &[Some(v), Some(s), z], 1)[0]
    };
    let xd = deq(x, sx, Some(zx), 1);
    let wd = deq(wq, sw, Some(zw), 0);
    let bd = deq(bias, sb, None, 0);
    let y = xd.conv(wd, Some(bd), ConvOptions { stride, pad, dilation, group });
    let y = match act {
        Activation::None => y,
        Activation::Relu => y.relu(),
        Activation::Clip(lo, hi) => {
            let lo = g.constant("lo", Tensor::scalar(lo));
            let hi = g.constant("hi", Tensor::scalar(hi));
            g.apply(Op::Clip, &[Some(y), Some(lo), Some(hi)], 1)[0]
        }
    };
    let (zy_type, zy) = if signed_out { (DType::I8, -3.0) } else { (DType::U8, 5.0) };
    let sy = g.constant("sy", t(DType::F32, &[], vec![0.35]));
    let zy = g.constant("zy", t(zy_type, &[], vec![zy]));
    let q = g.apply(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(y), Some(sy), Some(zy)],
        1,
    )[0];
    g.output("y", q);
    let graph = g.build().unwrap();
    let input = t(x_type, &[batch, c, hw[0], hw[1]], ints(batch * c * hw[0] * hw[1], lo, hi, seed));
    (graph, input)
}

/// Compiles `case` (VNNI allowed or not), checks the integer kernel took it, and compares with the
/// interpreter: every output within one quantization step, nearly all equal.
fn check(case: &Case, vnni: bool, threads: usize) {
    check_with(case, vnni, threads, Activation::None)
}

fn check_with(case: &Case, vnni: bool, threads: usize, act: Activation) {
    let (graph, x) = qdq_conv_with(case, 11, act);
    // (The vector kernels: AMX has its own test, against them.)
    let options = Options { cache: false, vnni, amx: false, ..Options::default() };
    let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
    assert!(
        schedule.contains("microkernel: integer conv")
            || schedule.contains("microkernel: integer depthwise conv"),
        "not on the integer kernel:\n{schedule}"
    );
    let want_path = if case.group > 1 {
        "depthwise"
    } else if vnni && schedule.contains("vpdpbusd") {
        "vpdpbusd"
    } else {
        "widening"
    };
    if !vnni && case.group == 1 {
        assert!(schedule.contains("widening"), "VNNI was not turned off:\n{schedule}");
    }
    assert!(schedule.contains(want_path), "{schedule}");
    let exe = kiln_compiler::jit(
        &graph,
        &options,
        &LoadOptions { threads: Some(threads), ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("compile failed: {e}"));
    let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0);
    crate::microkernel::assert_scratch_bounded(&exe, threads);
    let want = eval::run(&graph, &[x]).unwrap().remove(0);
    assert_eq!(got.ty(), want.ty());
    let (g, w) = (got.to_f64s(), want.to_f64s());
    let off = g.iter().zip(&w).filter(|(a, b)| a != b).count();
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 1.0, "an output {worst} steps from the interpreter's ({want_path})");
    assert!(off * 100 <= g.len(), "{off} of {} outputs differ ({want_path})", g.len());
    // The result must not be trivially saturated: the case spans the quantized range.
    let distinct: std::collections::BTreeSet<i64> = g.iter().map(|&v| v as i64).collect();
    assert!(distinct.len() > 20, "only {} distinct outputs", distinct.len());
}

const CASES: &[Case] = &[
    // ResNet's stem: 3 channels (a partial group of 4), 7x7/2, pad 3.
    Case {
        batch: 1,
        c: 3,
        hw: [30, 30],
        m: 10,
        k: 7,
        stride: 2,
        pad: 3,
        dilation: 1,
        signed_out: false,
        per_channel: true,
        signed_in: false,
        group: 1,
    },
    // 3x3, pad 1, output channels past a whole register tile, s8 result.
    Case {
        batch: 2,
        c: 16,
        hw: [19, 23],
        m: 20,
        k: 3,
        stride: 1,
        pad: 1,
        dilation: 1,
        signed_out: true,
        per_channel: true,
        signed_in: false,
        group: 1,
    },
    // Pointwise, one weight scale.
    Case {
        batch: 1,
        c: 32,
        hw: [14, 14],
        m: 24,
        k: 1,
        stride: 1,
        pad: 0,
        dilation: 1,
        signed_out: false,
        per_channel: false,
        signed_in: false,
        group: 1,
    },
    // Pointwise on 400 positions, split into chunks of 32-position strips.
    Case {
        batch: 1,
        c: 96,
        hw: [20, 20],
        m: 64,
        k: 1,
        stride: 1,
        pad: 0,
        dilation: 1,
        signed_out: true,
        per_channel: true,
        signed_in: false,
        group: 1,
    },
    // Pointwise on a 7x7 plane (fewer strips than units: split by output channels), s8 in, 122
    // channels (a partial group of 4).
    Case {
        batch: 1,
        c: 122,
        hw: [7, 7],
        m: 200,
        k: 1,
        stride: 1,
        pad: 0,
        dilation: 1,
        signed_out: false,
        per_channel: true,
        signed_in: true,
        group: 1,
    },
    // Dilated 3x3 with 5 channels, stride 2 without padding.
    Case {
        batch: 1,
        c: 5,
        hw: [21, 17],
        m: 9,
        k: 3,
        stride: 2,
        pad: 0,
        dilation: 2,
        signed_out: false,
        per_channel: true,
        signed_in: false,
        group: 1,
    },
    // s8 activations, 3x3 stride 2 with padding.
    Case {
        batch: 1,
        c: 12,
        hw: [16, 15],
        m: 16,
        k: 3,
        stride: 2,
        pad: 1,
        dilation: 1,
        signed_out: false,
        per_channel: true,
        signed_in: true,
        group: 1,
    },
    // Depthwise 3x3 stride 2 (MobileNet's), 40 channels.
    Case {
        batch: 2,
        c: 40,
        hw: [17, 18],
        m: 40,
        k: 3,
        stride: 2,
        pad: 1,
        dilation: 1,
        signed_out: false,
        per_channel: true,
        signed_in: false,
        group: 40,
    },
    // Depthwise 5x5 stride 1, s8 in and out.
    Case {
        batch: 1,
        c: 24,
        hw: [13, 21],
        m: 24,
        k: 5,
        stride: 1,
        pad: 2,
        dilation: 1,
        signed_out: true,
        per_channel: true,
        signed_in: true,
        group: 24,
    },
    // Depthwise on a 7x7 plane (shorter than a vector), dilated, two images, one whole block
    // of 16 channels.
    Case {
        batch: 2,
        c: 16,
        hw: [7, 7],
        m: 16,
        k: 3,
        stride: 1,
        pad: 2,
        dilation: 2,
        signed_out: false,
        per_channel: false,
        signed_in: false,
        group: 16,
    },
];

#[test]
fn integer_convolutions_match_the_interpreter_with_vnni() {
    for case in CASES {
        check(case, true, 2);
    }
}

#[test]
fn integer_convolutions_match_the_interpreter_without_vnni() {
    for case in CASES {
        check(case, false, 1);
    }
}

/// One-group integer convolutions on AMX tiles give the vector kernel's bytes exactly (both sum
/// exactly in int32 and requantise alike) and the interpreter's within a step: fewer than 16
/// channel groups (one short step), groups padded to whole steps, output channels past whole
/// 32-channel tile pairs, strides and dilation, s8 input, pointwise planes, units split by rows
/// and by channels, 1 and 2 threads. Without AMX (or without the OS's leave to use it) it says
/// so and checks nothing.
#[test]
fn integer_convolutions_on_amx_tiles_give_the_vector_kernels_bytes() {
    if !kiln_runtime::device::cpu::usable("amx-int8") {
        eprintln!("SKIPPED integer_convolutions_on_amx_tiles_give_the_vector_kernels_bytes: this CPU (or its OS) has no AMX-INT8");
        return;
    }
    let case = |c, hw, m, k, stride, pad, dilation, signed_in| Case {
        batch: 1,
        c,
        hw,
        m,
        k,
        stride,
        pad,
        dilation,
        signed_out: signed_in,
        per_channel: true,
        signed_in,
        group: 1,
    };
    let cases = [
        case(40, [13, 17], 20, 3, 1, 1, 1, false), // 10 groups: one step of 10
        case(72, [9, 11], 40, 3, 2, 1, 1, true),   // 18 groups padded to 2 steps of 16
        case(64, [12, 12], 64, 3, 1, 2, 2, false), // dilated
        case(128, [7, 7], 96, 3, 1, 1, 1, false),  // few rows: units by channels
        case(64, [10, 30], 48, 1, 1, 0, 1, true),  // pointwise, flat positions
        case(96, [3, 5], 136, 1, 1, 0, 1, false),  // pointwise, one strip: units by channels
        case(32, [8, 8], 33, 5, 2, 2, 1, false),   // 5x5/2, the least channels AMX takes
    ];
    for (i, c) in cases.iter().enumerate() {
        let (graph, x) = qdq_conv(c, 300 + i as u64);
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
        let run = |amx: bool, threads: usize| {
            let options = Options { cache: false, amx, ..Options::default() };
            let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
            assert_eq!(schedule.contains("on AMX tiles"), amx, "case {i}:\n{schedule}");
            let exe = kiln_compiler::jit(
                &graph,
                &options,
                &LoadOptions { threads: Some(threads), ..Default::default() },
            )
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
            let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0);
            crate::microkernel::assert_scratch_bounded(&exe, threads);
            got.to_f64s()
        };
        let vector = run(false, 2);
        for threads in [1, 2] {
            let tiles = run(true, threads);
            assert_eq!(
                tiles, vector,
                "case {i}, {threads} thread(s): AMX differs from the vector kernel"
            );
        }
        let worst = vector.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= 1.0, "case {i}: {worst} steps from the interpreter");
        let distinct: std::collections::BTreeSet<i64> = vector.iter().map(|&v| v as i64).collect();
        assert!(distinct.len() > 20, "case {i}: only {} distinct outputs", distinct.len());
    }
}

/// A convolution whose float result is used besides its QuantizeLinear (here, a graph output)
/// stays float arithmetic, and still matches the interpreter.
#[test]
fn a_quantized_convolution_whose_float_result_is_used_stays_float() {
    let (mut graph, x) = qdq_conv(&CASES[2], 5);
    let conv = graph.nodes().find(|(_, n)| matches!(n.op, Op::Conv(_))).map(|(id, _)| id).unwrap();
    graph.add_output("real", conv.into()).unwrap();
    let options = Options { cache: false, ..Options::default() };
    let passes = kiln_compiler::driver::emit(&graph, Stage::Passes, &options).unwrap();
    assert!(!passes.contains("QConv"), "{passes}");
    crate::compile::check_against_eval(&graph, &[x], 1, 1e-4);
}

/// MaxPool between a DequantizeLinear and a QuantizeLinear of the same scale and zero point (as
/// the quantizer writes it after ResNet's stem) pools the u8 values themselves, on the byte
/// kernel: exactly what the interpreter computes.
#[test]
fn a_quantized_max_pool_pools_the_bytes() {
    let g = GraphBuilder::new("qdq_pool");
    let dims = [2, 5, 23, 19];
    let x = g.input("x", DType::U8, dims);
    let t = |d: DType, v: f64| Tensor::from_f64s(d, &[], &[v]).unwrap();
    let s = g.constant("s", t(DType::F32, 0.07));
    let z = g.constant("z", t(DType::U8, 9.0));
    let real =
        g.apply(Op::Dequantize { axis: 1, block_size: 0 }, &[Some(x), Some(s), Some(z)], 1)[0];
    let pooled = real.max_pool(3, 2, 1);
    let q = g.apply(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(pooled), Some(s), Some(z)],
        1,
    )[0];
    g.output("y", q);
    let graph = g.build().unwrap();
    let n = dims.iter().product();
    let input = Tensor::from_f64s(DType::U8, &dims, &ints(n, 0, 255, 3)).unwrap();
    let options = Options { cache: false, ..Options::default() };
    let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
    assert!(schedule.contains("u8 max pooling"), "{schedule}");
    let exe = kiln_compiler::jit(
        &graph,
        &options,
        &LoadOptions { threads: Some(2), ..Default::default() },
    )
    .unwrap();
    let got = exe.run(std::slice::from_ref(&input)).unwrap().remove(0);
    let want = eval::run(&graph, &[input]).unwrap().remove(0);
    assert_eq!(got.ty(), want.ty());
    assert_eq!(got.to_f64s(), want.to_f64s());
}

/// The interpreter's QConv (exact integer sums) agrees with the float form it replaces, within
/// one step: the `integer` pass keeps the graph's meaning.
#[test]
fn the_integer_pass_keeps_the_interpreters_results() {
    for (i, case) in CASES.iter().enumerate() {
        let (graph, x) = qdq_conv(case, 20 + i as u64);
        let mut rewritten = graph.clone();
        assert!(kiln_compiler::backend::cpu::passes::integer::run(&mut rewritten).unwrap());
        assert!(rewritten.nodes().any(|(_, n)| matches!(n.op, Op::QConv(_))));
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
        let got = eval::run(&rewritten, &[x]).unwrap().remove(0).to_f64s();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= 1.0, "case {i}: {worst} steps apart");
    }
}

/// A Relu or a Clip between the convolution and the QuantizeLinear stays on the integer kernel
/// (a Clip of its 8-bit result), within one step of the interpreter, and really clamps.
#[test]
fn activations_between_conv_and_quantize_stay_integer() {
    let case = &CASES[1];
    for act in [Activation::Relu, Activation::Clip(-1.5, 12.0)] {
        check_with(case, true, 2, act);
        check_with(case, false, 1, act);
        let (graph, x) = qdq_conv_with(case, 11, act);
        // The Clip is stored by the integer kernel, not run as a kernel of its own.
        let options = Options { cache: false, ..Options::default() };
        let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
        assert!(schedule.contains("(a fused Clip)"), "{schedule}");
        assert_eq!(
            schedule.matches("\nkernel ").count() + schedule.starts_with("kernel ") as usize,
            1,
            "{schedule}"
        );
        let zy = if case.signed_out { -3.0 } else { 5.0 };
        let (lo, hi) = match act {
            Activation::Relu => (zy, f64::INFINITY),
            Activation::Clip(lo, hi) => {
                let q = |v: f32| (v / 0.35).round_ties_even() as f64 + zy;
                (q(lo), q(hi))
            }
            Activation::None => unreachable!(),
        };
        let y = eval::run(&graph, &[x]).unwrap().remove(0).to_f64s();
        assert!(y.iter().all(|&v| v >= lo && v <= hi), "outside [{lo}, {hi}]");
        assert!(y.contains(&lo), "the lower bound never reached: the case does not test it");
    }
}

/// A quantized matrix product: QuantizeLinear(Gemm or MatMul(DequantizeLinear(a),
/// DequantizeLinear(w), DequantizeLinear(b)?)), as onnxruntime's quantizer writes a Gemm or
/// MatMul in QDQ form.
struct ProductCase {
    /// A's dims before K (their product is the rows).
    rows: &'static [usize],
    k: usize,
    m: usize,
    /// Gemm (else MatMul), and whether its B is [M, K].
    gemm: bool,
    trans_b: bool,
    per_channel: bool,
    signed_in: bool,
    signed_out: bool,
    bias: bool,
    relu: bool,
}

const PRODUCTS: &[ProductCase] = &[
    // A classifier head: one row, K not a multiple of 4, M not of 64, per-channel weights.
    ProductCase {
        rows: &[1],
        k: 301,
        m: 1000,
        gemm: true,
        trans_b: true,
        per_channel: true,
        signed_in: false,
        signed_out: false,
        bias: true,
        relu: false,
    },
    // A batched MatMul of s8 activations (2 x 7 rows), one weight scale, s8 out.
    ProductCase {
        rows: &[2, 7],
        k: 64,
        m: 70,
        gemm: false,
        trans_b: false,
        per_channel: false,
        signed_in: true,
        signed_out: true,
        bias: false,
        relu: false,
    },
    // Enough rows to split by rows, B as [K, M], a Relu before the QuantizeLinear.
    ProductCase {
        rows: &[67],
        k: 130,
        m: 200,
        gemm: true,
        trans_b: false,
        per_channel: true,
        signed_in: false,
        signed_out: false,
        bias: true,
        relu: true,
    },
];

/// Edge sizes: K of 1 to 5 (a partial word only, a whole one and a partial), one output column,
/// M of 16 (one vector of a strip), and weights too few to be a buffer (1 x 1).
#[test]
fn integer_matrix_products_at_edge_sizes() {
    let sizes: [(usize, usize, &'static [usize]); 5] =
        [(1, 1, &[1]), (2, 16, &[5]), (3, 65, &[2]), (4, 7, &[9]), (5, 64, &[4])];
    for (k, m, rows) in sizes {
        let p = ProductCase {
            rows,
            k,
            m,
            gemm: false,
            trans_b: false,
            per_channel: true,
            signed_in: k % 2 == 0,
            signed_out: false,
            bias: false,
            relu: false,
        };
        let (graph, x) = qdq_product(&p, 70 + k as u64);
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
        for vnni in [true, false] {
            let options = Options { cache: false, vnni, ..Options::default() };
            let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
            // Weights of 16 values or fewer are inlined into the kernel, which the integer
            // kernel cannot read: such a product stays float arithmetic, and still compiles.
            let integer = k * m > 16;
            assert_eq!(
                schedule.contains("integer matrix product"),
                integer,
                "k {k}, m {m}:\n{schedule}"
            );
            let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
            let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst <= 1.0, "k {k}, m {m}, rows {rows:?}: {worst} steps apart");
        }
    }
}

fn qdq_product(p: &ProductCase, seed: u64) -> (Graph, Tensor) {
    let t = |d: DType, dims: &[usize], v: Vec<f64>| Tensor::from_f64s(d, dims, &v).unwrap();
    let (a_type, za, lo, hi) =
        if p.signed_in { (DType::I8, -9.0, -128, 127) } else { (DType::U8, 41.0, 0, 255) };
    let g = GraphBuilder::new("qdq_product");
    let a_dims: Vec<usize> = p.rows.iter().copied().chain([p.k]).collect();
    let a = g.input("a", a_type, a_dims.clone());
    let a_scale = 0.02f32;
    let w_scales: Vec<f64> = if p.per_channel {
        ints(p.m, 1, 40, seed + 1).iter().map(|v| v * 0.0005).collect()
    } else {
        vec![0.004]
    };
    let wdims = if p.per_channel { vec![p.m] } else { vec![] };
    let sa = g.constant("sa", t(DType::F32, &[], vec![a_scale as f64]));
    let za = g.constant("za", t(a_type, &[], vec![za]));
    let b_dims = if p.trans_b { [p.m, p.k] } else { [p.k, p.m] };
    let wq = g.constant("w", t(DType::I8, &b_dims, ints(p.m * p.k, -127, 127, seed + 2)));
    let sw = g.constant("sw", t(DType::F32, &wdims, w_scales.clone()));
    let zw = g.constant("zw", t(DType::I8, &wdims, vec![0.0; w_scales.len()]));
    let deq = |v, s, z, axis| {
        g.apply(Op::Dequantize { axis, block_size: 0 }, &[Some(v), Some(s), z], 1)[0]
    };
    let ad = deq(a, sa, Some(za), 1);
    let wd = deq(wq, sw, Some(zw), if p.trans_b { 0 } else { 1 });
    let y = if p.gemm {
        let bias = p.bias.then(|| {
            let b = g.constant("b", t(DType::I32, &[p.m], ints(p.m, -3000, 3000, seed + 3)));
            let scales: Vec<f64> = w_scales.iter().map(|&s| (a_scale * s as f32) as f64).collect();
            let sb = g.constant("sb", t(DType::F32, &wdims, scales));
            deq(b, sb, None, 0)
        });
        let gemm = kiln_ir::op::Gemm { trans_b: p.trans_b, ..Default::default() };
        g.apply(Op::Gemm(gemm), &[Some(ad), Some(wd), bias], 1)[0]
    } else {
        g.apply(Op::MatMul, &[Some(ad), Some(wd)], 1)[0]
    };
    let y = if p.relu { y.relu() } else { y };
    let (zy_type, zy) = if p.signed_out { (DType::I8, -3.0) } else { (DType::U8, 5.0) };
    let sy = g.constant("sy", t(DType::F32, &[], vec![0.3]));
    let zy = g.constant("zy", t(zy_type, &[], vec![zy]));
    let q = g.apply(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(y), Some(sy), Some(zy)],
        1,
    )[0];
    g.output("y", q);
    let n: usize = a_dims.iter().product();
    (g.build().unwrap(), t(a_type, &a_dims, ints(n, lo, hi, seed)))
}

/// Quantized Gemms and MatMuls run on the integer matrix kernel (with VNNI and without, 1 and 2
/// threads), every output within one quantization step of the interpreter on the float form.
#[test]
fn integer_matrix_products_match_the_interpreter() {
    for (i, p) in PRODUCTS.iter().enumerate() {
        let (graph, x) = qdq_product(p, 30 + i as u64);
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap().remove(0);
        for (vnni, threads) in [(true, 2), (false, 1)] {
            let options = Options { cache: false, vnni, ..Options::default() };
            let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
            assert!(
                schedule.contains("microkernel: integer matrix product"),
                "case {i}: not on the integer kernel:\n{schedule}"
            );
            if !vnni {
                assert!(schedule.contains("widening"), "VNNI was not turned off:\n{schedule}");
            }
            let exe = kiln_compiler::jit(
                &graph,
                &options,
                &LoadOptions { threads: Some(threads), ..Default::default() },
            )
            .unwrap_or_else(|e| panic!("case {i}: compile failed: {e}"));
            let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0);
            assert_eq!(got.ty(), want.ty(), "case {i}");
            let (g, w) = (got.to_f64s(), want.to_f64s());
            let off = g.iter().zip(&w).filter(|(a, b)| a != b).count();
            let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst <= 1.0, "case {i}: an output {worst} steps from the interpreter's");
            assert!(off * 100 <= g.len(), "case {i}: {off} of {} outputs differ", g.len());
            let distinct: std::collections::BTreeSet<i64> = g.iter().map(|&v| v as i64).collect();
            assert!(distinct.len() > 20, "case {i}: only {} distinct outputs", distinct.len());
        }
    }
}

/// A quantized convolution whose weights fusion inlines into its kernel (one 3x3 filter: 9
/// values) stays float arithmetic and compiles; the integer kernel reads weights from a buffer,
/// and being given the node anyway was a compile error.
#[test]
fn a_quantized_convolution_with_inlined_weights_stays_float() {
    let case = Case {
        batch: 1,
        c: 1,
        hw: [9, 9],
        m: 1,
        k: 3,
        stride: 1,
        pad: 1,
        dilation: 1,
        signed_out: false,
        per_channel: false,
        signed_in: false,
        group: 1,
    };
    let (graph, x) = qdq_conv(&case, 5);
    let options = Options { cache: false, ..Options::default() };
    let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
    assert!(!schedule.contains("integer conv"), "{schedule}");
    let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
    let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
    let want = eval::run(&graph, &[x]).unwrap().remove(0).to_f64s();
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 1.0, "{worst} steps apart");
}

/// Depthwise and pointwise integer convolutions at edge sizes: a partial last block of 16
/// channels, planes of one position or one row, stride past the plane, one position per strip.
#[test]
fn integer_convolutions_at_edge_sizes() {
    let cases = [
        // (channels, plane, window, stride, pad, group = channels?)
        (17, [1, 1], 3, 2, 1, true),
        (33, [2, 30], 3, 1, 1, true),
        (16, [5, 3], 5, 2, 2, true),
        (24, [1, 1], 1, 1, 0, false),
        (20, [1, 33], 1, 1, 0, false),
    ];
    for (i, &(c, hw, k, stride, pad, depthwise)) in cases.iter().enumerate() {
        let case = Case {
            batch: 1,
            c,
            hw,
            m: if depthwise { c } else { 40 },
            k,
            stride,
            pad,
            dilation: 1,
            signed_out: i % 2 == 1,
            per_channel: true,
            signed_in: i % 2 == 0,
            group: if depthwise { c } else { 1 },
        };
        let (graph, x) = qdq_conv(&case, 90 + i as u64);
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
        for (vnni, amx) in [(true, true), (true, false), (false, false)] {
            let options = Options { cache: false, vnni, amx, ..Options::default() };
            let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
            // (A 1x1 convolution of a 1x1 plane is a matrix product: it runs as one.)
            let path = match (depthwise, hw) {
                (true, _) => "integer depthwise conv",
                (false, [1, 1]) => "integer matrix product",
                (false, _) => "integer conv",
            };
            assert!(schedule.contains(path), "case {i}:\n{schedule}");
            let exe = kiln_compiler::jit(
                &graph,
                &options,
                &LoadOptions { threads: Some(2), ..Default::default() },
            )
            .unwrap();
            let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst <= 1.0, "case {i}: {worst} steps apart");
        }
    }
}

/// Quantized convolutions and products of no images or rows compile (as float arithmetic: the
/// integer kernels have no work to split) and give empty results.
#[test]
fn empty_quantized_convolutions_and_products_compile() {
    let options = Options { cache: false, ..Options::default() };
    for (k, hw, group) in [(1, [20, 20], 1), (3, [9, 9], 1), (1, [1, 1], 1), (3, [9, 9], 24)] {
        let case = Case {
            batch: 0,
            c: 24,
            hw,
            m: 24,
            k,
            stride: 1,
            pad: 0,
            dilation: 1,
            signed_out: false,
            per_channel: true,
            signed_in: false,
            group,
        };
        let (graph, x) = qdq_conv(&case, 5);
        let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("window {k}, group {group}: {e}"));
        let y = exe.run(&[x]).unwrap().remove(0);
        assert_eq!(y.dims()[..2], [0, 24], "window {k}, group {group}");
    }
    let p = ProductCase {
        rows: &[0],
        k: 32,
        m: 40,
        gemm: true,
        trans_b: true,
        per_channel: true,
        signed_in: false,
        signed_out: false,
        bias: true,
        relu: false,
    };
    let (graph, x) = qdq_product(&p, 3);
    let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
    assert_eq!(exe.run(&[x]).unwrap()[0].dims(), [0, 40]);
}

/// A Clip whose bounds cross (min above max) before the QuantizeLinear gives max everywhere, as
/// ONNX's Clip does, on the integer kernel too (the plan refused it, a compile error).
#[test]
fn crossed_clip_bounds_clamp_to_the_maximum() {
    let case = &CASES[1];
    let (graph, x) = qdq_conv_with(case, 11, Activation::Clip(12.0, -1.5));
    let options = Options { cache: false, ..Options::default() };
    let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
    assert!(schedule.contains("(a fused Clip)"), "{schedule}");
    let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
    let got = exe.run(std::slice::from_ref(&x)).unwrap().remove(0).to_f64s();
    let want = eval::run(&graph, &[x]).unwrap().remove(0).to_f64s();
    assert_eq!(got, want);
    assert!(want.windows(2).all(|w| w[0] == w[1]), "not one value: the case does not test it");
}

/// A bias the integer kernel cannot hold once the input's zero point is folded into it (int32
/// past its maximum) is an error naming the node and the values, not an internal error.
#[test]
fn a_bias_past_int32_with_the_zero_point_folded_in_is_unsupported() {
    let case = Case {
        batch: 1,
        c: 3,
        hw: [30, 30],
        m: 10,
        k: 7,
        stride: 2,
        pad: 3,
        dilation: 1,
        signed_out: false,
        per_channel: true,
        signed_in: false,
        group: 1,
    };
    let (mut graph, _) = qdq_conv(&case, 11);
    // Every weight -127 (sums of -127 * 3 * 49), every bias int32's maximum less one: with the
    // input zero point 37 folded in, 2147483646 + 37 * 18669 passes int32.
    let mut swap = |name: &str, t: Tensor| {
        let old = kiln_ir::ValueId::new(graph.node_by_name(name).unwrap(), 0);
        let new = graph.add_constant(&format!("{name}_big"), t).unwrap();
        graph.replace_uses(old, new).unwrap();
    };
    swap("w", Tensor::from_f64s(DType::I8, &[10, 3, 7, 7], &[-127.0; 10 * 3 * 49]).unwrap());
    swap("b", Tensor::from_f64s(DType::I32, &[10], &[2147483646.0; 10]).unwrap());
    let options = Options { cache: false, ..Options::default() };
    let e = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).err().unwrap();
    let kiln_compiler::CompileError::Unsupported { op, what, .. } = &e else {
        panic!("not Unsupported: {e}")
    };
    assert_eq!(*op, "QConv");
    assert_eq!(
        what,
        "has a bias of 2147483646 at output channel 0, which with the input zero point 37 folded in (2148174399) does not fit int32"
    );
}

/// One `quantize_dynamic` product (onnxruntime's form): what `dynamic_model` writes.
struct DynamicCase {
    rows: &'static [usize],
    k: usize,
    m: usize,
    per_column: bool,
    /// An Add of a column bias after the dequantizing Mul (as the quantizer leaves a MatMul's).
    bias: bool,
    /// The weights' zero point (u8 weights with one: `weight_type=QUInt8`).
    w_zero: Option<u8>,
    /// The activation's values are in [lo, hi].
    range: (f64, f64),
}

/// DynamicQuantizeLinear(x) -> MatMulInteger -> Cast -> Mul by `x_scale * w_scale` (-> Add
/// bias) as onnxruntime's `quantize_dynamic` writes it, and a second product of the same
/// quantized activation (its own weights, no bias), as an ONNX model imported here, and an input.
fn dynamic_model(c: &DynamicCase, seed: u64) -> (Graph, Tensor) {
    use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
    use kiln_ir::onnx::proto::*;
    use prost::Message;
    let t = |d: DType, dims: &[usize], v: Vec<f64>| Tensor::from_f64s(d, dims, &v).unwrap();
    let init = |tensor: Tensor, name: &str| {
        TensorProto::decode(kiln_ir::onnx::encode_tensor(&tensor, name).as_slice()).unwrap()
    };
    let f32_type = |dims: &[usize]| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(data_type::FLOAT),
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| tensor_shape_proto::Dimension {
                        value: Some(DimValue::DimValue(d as i64)),
                    })
                    .collect(),
            }),
        })),
    };
    let node =
        |op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>| NodeProto {
            op_type: Some(op.into()),
            name: Some(outputs[0].into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute,
            ..Default::default()
        };
    let (k, m) = (c.k, c.m);
    let (w_type, w_lo, w_hi, zw) = match c.w_zero {
        Some(z) => (DType::U8, 0, 255, z as f64),
        None => (DType::I8, -127, 127, 0.0),
    };
    let w_scales: Vec<f64> = if c.per_column {
        ints(m, 1, 40, seed + 1).iter().map(|v| v * 0.0005).collect()
    } else {
        vec![0.004]
    };
    let sdims = if c.per_column { vec![m] } else { vec![] };
    let mut initializer = vec![
        init(t(w_type, &[k, m], ints(k * m, w_lo, w_hi, seed + 2)), "w"),
        init(t(w_type, &[], vec![zw]), "w_zero"),
        init(t(DType::F32, &sdims, w_scales), "w_scale"),
        init(t(DType::I8, &[k, 9], ints(k * 9, -127, 127, seed + 3)), "w2"),
        init(t(DType::I8, &[], vec![0.0]), "w2_zero"),
        init(t(DType::F32, &[], vec![0.01]), "w2_scale"),
    ];
    let mut nodes = vec![
        node("DynamicQuantizeLinear", &["x"], &["xq", "xs", "xz"], vec![]),
        node("Mul", &["xs", "w_scale"], &["s"], vec![]),
        node("MatMulInteger", &["xq", "w", "xz", "w_zero"], &["mi"], vec![]),
        node(
            "Cast",
            &["mi"],
            &["mf"],
            vec![AttributeProto {
                name: Some("to".into()),
                r#type: Some(attribute_type::INT),
                i: Some(data_type::FLOAT as i64),
                ..Default::default()
            }],
        ),
        node("Mul", &["mf", "s"], &[if c.bias { "y0" } else { "y" }], vec![]),
        node("Mul", &["w2_scale", "xs"], &["s2"], vec![]),
        node("MatMulInteger", &["xq", "w2", "xz", "w2_zero"], &["mi2"], vec![]),
        node(
            "Cast",
            &["mi2"],
            &["mf2"],
            vec![AttributeProto {
                name: Some("to".into()),
                r#type: Some(attribute_type::INT),
                i: Some(data_type::FLOAT as i64),
                ..Default::default()
            }],
        ),
        node("Mul", &["s2", "mf2"], &["y2"], vec![]),
    ];
    if c.bias {
        let b: Vec<f64> = ints(m, -500, 500, seed + 4).iter().map(|v| v * 0.01).collect();
        initializer.push(init(t(DType::F32, &[m], b), "b"));
        nodes.push(node("Add", &["y0", "b"], &["y"], vec![]));
    }
    let x_dims: Vec<usize> = c.rows.iter().copied().chain([k]).collect();
    let y_dims: Vec<usize> = c.rows.iter().copied().chain([m]).collect();
    let y2_dims: Vec<usize> = c.rows.iter().copied().chain([9]).collect();
    let value = |name: &str, dims: &[usize]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(f32_type(dims)),
    };
    let graph = GraphProto {
        name: Some("dynamic".into()),
        node: nodes,
        initializer,
        input: vec![value("x", &x_dims)],
        output: vec![value("y", &y_dims), value("y2", &y2_dims)],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    let graph = kiln_ir::onnx::load_bytes(&bytes, None).unwrap().graph;
    let n: usize = x_dims.iter().product();
    let (lo, hi) = c.range;
    let x: Vec<f64> =
        ints(n, 0, 10_000, seed).iter().map(|v| lo + (hi - lo) * v / 10_000.0).collect();
    (graph, t(DType::F32, &x_dims, x))
}

const DYNAMIC: &[DynamicCase] = &[
    // A GPT block's projection: whole tiles, one scale, a bias.
    DynamicCase {
        rows: &[1, 32],
        k: 128,
        m: 384,
        per_column: false,
        bias: true,
        w_zero: None,
        range: (-2.5, 3.1),
    },
    // Partial tiles everywhere: K not a multiple of 4, M past a 64-column strip and not a
    // multiple of 16, rows not a multiple of 4; per-column scales; u8 weights with a zero point
    // other than 128 (less it they pass s8: the kernel packs them less a column offset).
    DynamicCase {
        rows: &[3, 5],
        k: 37,
        m: 70,
        per_column: true,
        bias: false,
        w_zero: Some(131),
        range: (-0.3, 7.0),
    },
    // All-positive activations (the range clamps at 0: zero point 0), more rows than a stack
    // block holds (32 KiB / K), one row chunk per unit.
    DynamicCase {
        rows: &[300],
        k: 200,
        m: 20,
        per_column: false,
        bias: true,
        w_zero: None,
        range: (0.5, 4.0),
    },
];

/// onnxruntime's dynamically quantized products (DynamicQuantizeLinear -> MatMulInteger -> Cast
/// -> Mul) run on the integer kernel, with VNNI and without and on AMX tiles, at 1 and 2 threads, and give the
/// interpreter's results on the ops as ONNX defines them: the same bits where nothing follows
/// the Mul (the int32 sums are exact; the conversion and the Mul round as the ops do), within an
/// f32 rounding where the bias's Add is fused (it may be one FMA with the Mul).
#[test]
fn dynamically_quantized_products_match_the_interpreter() {
    for (i, c) in DYNAMIC.iter().enumerate() {
        let (graph, x) = dynamic_model(c, 90 + i as u64);
        let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
        // The vector kernels, then AMX's tiles (where the host has them: products of 16 or
        // more rows take them).
        let forms = [(true, false, 2), (false, false, 1), (true, false, 1), (false, false, 2)];
        for (vnni, amx, threads) in forms.into_iter().chain([(true, true, 1), (true, true, 2)]) {
            let options = Options { cache: false, vnni, amx, ..Options::default() };
            let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
            assert_eq!(
                schedule.matches("microkernel: dynamically quantized matrix product").count(),
                2,
                "case {i}: not both products on the integer kernel:\n{schedule}"
            );
            assert_eq!(schedule.contains("widening"), !vnni, "case {i}:\n{schedule}");
            let tiles = amx
                && kiln_runtime::device::cpu::usable("amx-int8")
                && c.rows.iter().any(|&r| r >= 16);
            assert_eq!(schedule.contains("tdpbusd"), tiles, "case {i}:\n{schedule}");
            assert_eq!(schedule.contains("column bias"), c.bias, "case {i}:\n{schedule}");
            let exe = kiln_compiler::jit(
                &graph,
                &options,
                &LoadOptions { threads: Some(threads), ..Default::default() },
            )
            .unwrap_or_else(|e| panic!("case {i}: compile failed: {e}"));
            let got = exe.run(std::slice::from_ref(&x)).unwrap();
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.ty(), w.ty(), "case {i}, output {o}");
                let exact = o == 1 || !c.bias;
                for (a, b) in g.to_f64s().iter().zip(w.to_f64s()) {
                    let tol = if exact { 0.0 } else { 1e-6 * (1.0 + b.abs()) };
                    assert!(
                        (a - b).abs() <= tol,
                        "case {i}, output {o} (vnni {vnni}, amx {amx}, {threads} threads): {a} against {b}"
                    );
                }
            }
        }
    }
}

/// The integer path keeps the float one's results: the interpreter before and after the CPU's
/// passes agree (the `dynamic` pass's DynQMatMul computes what the ops it replaces did).
#[test]
fn the_dynamic_pass_keeps_the_interpreters_results() {
    let (graph, x) = dynamic_model(&DYNAMIC[1], 7);
    let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
    let mut g = graph.clone();
    // (Folding makes the centred weights one constant, as the pipeline does before.)
    kiln_compiler::passes::fold::run(&mut g).unwrap();
    assert!(kiln_compiler::backend::cpu::passes::dynamic::run(&mut g).unwrap());
    assert!(g.nodes().any(|(_, n)| matches!(n.op, Op::DynQMatMul)));
    let got = eval::run(&g, &[x]).unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.to_f64s(), b.to_f64s());
    }
}

/// onnxruntime's fused forms of those products (com.microsoft DynamicQuantizeMatMul, with a
/// bias, and MatMulIntegerToFloat after a DynamicQuantizeLinear), as models saved after its
/// optimizer hold them, import as the same ops and run on the same integer kernel.
#[test]
fn onnxruntimes_fused_dynamic_products_run_on_the_integer_kernel() {
    use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
    use kiln_ir::onnx::proto::*;
    use prost::Message;
    let t = |d: DType, dims: &[usize], v: Vec<f64>| Tensor::from_f64s(d, dims, &v).unwrap();
    let init = |tensor: Tensor, name: &str| {
        TensorProto::decode(kiln_ir::onnx::encode_tensor(&tensor, name).as_slice()).unwrap()
    };
    let value = |name: &str, dims: &[i64]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(data_type::FLOAT),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(DimValue::DimValue(d)),
                        })
                        .collect(),
                }),
            })),
        }),
    };
    let node = |op: &str, domain: &str, inputs: &[&str], outputs: &[&str]| NodeProto {
        op_type: Some(op.into()),
        domain: Some(domain.into()),
        name: Some(outputs[0].into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let (k, m, m2) = (48, 70, 33);
    let ws: Vec<f64> = ints(m, 1, 40, 5).iter().map(|v| v * 0.0005).collect();
    let graph = GraphProto {
        name: Some("fused".into()),
        node: vec![
            node("DynamicQuantizeMatMul", "com.microsoft", &["x", "w", "ws", "", "b"], &["y"]),
            node("DynamicQuantizeLinear", "", &["x"], &["q", "s", "z"]),
            node("MatMulIntegerToFloat", "com.microsoft", &["q", "w2", "s", "ws2", "z"], &["y2"]),
        ],
        initializer: vec![
            init(t(DType::I8, &[k, m], ints(k * m, -127, 127, 6)), "w"),
            init(t(DType::F32, &[m], ws), "ws"),
            init(t(DType::F32, &[m], ints(m, -50, 50, 7).iter().map(|v| v * 0.1).collect()), "b"),
            init(t(DType::I8, &[k, m2], ints(k * m2, -127, 127, 8)), "w2"),
            init(t(DType::F32, &[], vec![0.003]), "ws2"),
        ],
        input: vec![value("x", &[2, 9, k as i64])],
        output: vec![value("y", &[2, 9, m as i64]), value("y2", &[2, 9, m2 as i64])],
        ..Default::default()
    };
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    let bytes = ModelProto {
        ir_version: Some(8),
        opset_import: vec![opset("", 17), opset("com.microsoft", 1)],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    let graph = kiln_ir::onnx::load_bytes(&bytes, None).unwrap().graph;
    let x: Vec<f64> = ints(2 * 9 * k, 0, 1000, 9).iter().map(|v| v * 0.004 - 1.3).collect();
    let x = t(DType::F32, &[2, 9, k], x);
    let options = Options { cache: false, ..Options::default() };
    let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
    assert_eq!(
        schedule.matches("microkernel: dynamically quantized matrix product").count(),
        2,
        "{schedule}"
    );
    let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
    let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
    let got = exe.run(&[x]).unwrap();
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        for (a, b) in g.to_f64s().iter().zip(w.to_f64s()) {
            // (The bias's Add fused into the kernel may round once with the Mul.)
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "output {o}: {a} against {b}");
        }
    }
}
