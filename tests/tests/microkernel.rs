//! The packed microkernel (convolutions as implicit GEMM, GEMMs with packed weights): every
//! operand path, edge tiles, K blocks and epilogue against the interpreter, with the microkernel
//! forced on (so each test exercises it whatever this machine's caches decide) and checked in the
//! printed schedule; the decision by shape class; and the schedule stage as a snapshot.

use kiln_compiler::{compile, jit, Options};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::op::{AutoPad, ConvTranspose, Gemm, Pool, PoolKind, UnaryOp, Window};
use kiln_ir::Op;
use kiln_ir::{eval, DType, Graph, Tensor};
use kiln_runtime::LoadOptions;

/// No per-kernel choices stored by `--tune` on this machine enter these tests.
fn options(microkernel: Option<bool>) -> Options {
    Options {
        cache: false,
        microkernel,
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    }
}

/// The schedule stage of `graph` compiled with `microkernel`.
fn schedule(graph: &Graph, microkernel: Option<bool>) -> String {
    compile(graph, &options(microkernel), true).expect("the model compiles").stages
        [kiln_compiler::Stage::Schedule]
        .to_string()
}

/// Runs `graph` on the microkernel (forced) with 1 and 2 threads and checks it against the
/// interpreter; the schedule must say that `kernels` kernels took the microkernel.
fn check(graph: &Graph, inputs: &[Tensor], kernels: usize) {
    let s = schedule(graph, Some(true));
    assert_eq!(s.matches("microkernel:").count(), kernels, "kernels on the microkernel:\n{s}");
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    for threads in [1, 2] {
        let exe = jit(
            graph,
            &options(Some(true)),
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .expect("compiles");
        let got = exe.run(inputs).expect("runs");
        assert_scratch_bounded(&exe, threads);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.ty(), w.ty());
            for (j, (a, b)) in g.to_f64s().iter().zip(w.to_f64s()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 + 1e-4 * b.abs(),
                    "element {j}: compiled {a}, interpreter {b} ({threads} threads)"
                );
            }
        }
    }
}

/// The kernels' scratch a run held stays within what the artifact bounds it by at `threads`
/// threads (the load counts that bound against the memory budget).
pub(crate) fn assert_scratch_bounded(exe: &kiln_runtime::Executable, threads: usize) {
    let desc = exe.manifest().scratch.as_ref().expect("the program bounds its kernels' scratch");
    let bound = kiln_runtime::memory::scratch_bytes(desc, threads).expect("a bound in range");
    let held = exe.kernel_scratch_peak();
    assert!(
        held <= bound,
        "the kernels held {held} bytes of scratch, bounded by {bound} ({desc:?})"
    );
}

fn conv_graph(x: &[usize], w: &[usize], o: ConvOptions, bias: bool) -> (Graph, Vec<Tensor>) {
    let g = GraphBuilder::new("conv");
    let xi = g.input("x", DType::F32, x);
    let wt = g.constant("w", Tensor::random(DType::F32, w, 1));
    let b = bias.then(|| g.constant("b", Tensor::random(DType::F32, &[w[0]], 2)));
    g.output("y", xi.conv(wt, b, o).relu());
    (g.build().unwrap(), vec![Tensor::random(DType::F32, x, 3)])
}

#[test]
fn a_k_by_1_convolution_with_edge_tiles() {
    // Output rows of width 1 (the shape that ran at 1% of peak on the linalg path); 20 channels
    // and 36 positions leave partial register tiles on both sides.
    let (g, x) = conv_graph(&[1, 24, 40, 1], &[20, 24, 5, 1], ConvOptions::default(), true);
    check(&g, &x, 1);
    // The decision by shape class takes it too.
    assert!(schedule(&g, None).contains("microkernel:"));
}

#[test]
fn a_small_image_with_a_residual_and_a_clip_over_several_k_blocks() {
    let g = GraphBuilder::new("block");
    let x = g.input("x", DType::F32, [2, 40, 4, 4]);
    let r = g.input("r", DType::F32, [2, 36, 4, 4]);
    let w = g.constant("w", Tensor::random(DType::F32, &[36, 40, 3, 3], 4));
    let b = g.constant("b", Tensor::random(DType::F32, &[36], 5));
    // K = 360: more than one K block of the register tile.
    let y = x.conv(w, Some(b), ConvOptions { pad: 1, ..ConvOptions::default() }) + r;
    g.output("y", y.clip(0.0, 0.5));
    let g = g.build().unwrap();
    let s = schedule(&g, Some(true));
    assert!(s.contains("epilogue: bias, residual add, clip [0, 0.5]"), "{s}");
    check(
        &g,
        &[
            Tensor::random(DType::F32, &[2, 40, 4, 4], 6),
            Tensor::random(DType::F32, &[2, 36, 4, 4], 7),
        ],
        1,
    );
}

#[test]
fn direct_convolutions_store_rows_that_start_at_any_lane_with_a_residual() {
    // Rows of 35, 45 and 14 outputs in flat strips of 48 or 32 positions (pitch 36, 47 and 16):
    // runs start at every lane and some fill a whole vector; stride-2 rows of 70 inputs are
    // split into their phases a vector at a time, then the tail. Where the register tile has 8
    // rows (AVX-512) the first two take strips of 48 and the last (62 positions a unit: 96 as
    // 48s) strips of 32; elsewhere all take 32.
    let mut widths = Vec::new();
    for (x, stride, pad) in [([1, 6, 9, 70], 2, 1), ([1, 5, 7, 45], 1, 1), ([1, 6, 4, 14], 1, 1)] {
        let oh = (x[2] + 2 * pad - 3) / stride + 1;
        let ow = (x[3] + 2 * pad - 3) / stride + 1;
        let g = GraphBuilder::new("direct");
        let xi = g.input("x", DType::F32, x);
        let r = g.input("r", DType::F32, [1, 10, oh, ow]);
        let w = g.constant("w", Tensor::random(DType::F32, &[10, x[1], 3, 3], 4));
        let b = g.constant("b", Tensor::random(DType::F32, &[10], 5));
        let y = xi.conv(w, Some(b), ConvOptions { stride, pad, ..ConvOptions::default() }) + r;
        g.output("y", y.clip(-0.5, 0.5));
        let g = g.build().unwrap();
        let s = schedule(&g, Some(true));
        assert!(s.contains("stride-phase planes"), "{s}");
        let tile = s.split("register tile: ").nth(1).and_then(|t| t.split(';').next());
        widths.push(tile.expect("the schedule prints the register tile").to_string());
        check(
            &g,
            &[Tensor::random(DType::F32, &x, 6), Tensor::random(DType::F32, &[1, 10, oh, ow], 7)],
            1,
        );
    }
    let want = if widths[0].starts_with("8x") { ["8x48", "8x48", "8x32"] } else { ["4x32"; 3] };
    assert_eq!(widths, want, "register tiles of the three convolutions");
}

/// Whether this machine has AVX-512 (the microkernel's 8-row tiles, and the channel-vector
/// direct form).
fn avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// What the schedule says of a direct convolution with its vectors along output channels.
const CHANNEL_FORM: &str = "vectors along output channels, each input float broadcast";

#[test]
fn direct_convolutions_with_vectors_along_channels() {
    // Whole vectors of output channels (16 to 112: tiles of 1, 2, 3 and 4 vectors, and 4 then
    // the rest), windows and strides, positions that end in part of a tile, K over several
    // blocks (576 by 64 channels), 2 images, a residual and each activation; with AVX-512 they
    // take the channel-vector form (elsewhere the vectors along positions, checked the same).
    // (input, channels, window, stride, pad, dilation)
    type Case = (&'static [usize], usize, usize, usize, usize, usize);
    let cases: [Case; 8] = [
        (&[1, 8, 11, 13], 16, 3, 1, 1, 1),
        (&[2, 64, 9, 9], 32, 3, 1, 1, 1),
        (&[1, 12, 10, 10], 48, 3, 2, 1, 1),
        (&[1, 64, 7, 7], 64, 3, 1, 1, 1),
        (&[1, 20, 15, 12], 80, 5, 1, 2, 1),
        (&[2, 16, 13, 13], 96, 3, 1, 2, 2),
        (&[1, 24, 9, 9], 112, 1, 2, 0, 1),
        (&[1, 3, 23, 23], 64, 7, 2, 3, 1),
    ];
    for (i, &(x, m, k, stride, pad, dilation)) in cases.iter().enumerate() {
        let o = ConvOptions { stride, pad, dilation, ..ConvOptions::default() };
        let oh = (x[2] + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
        let ow = (x[3] + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
        let g = GraphBuilder::new("channels");
        let xi = g.input("x", DType::F32, x);
        let r = g.input("r", DType::F32, [x[0], m, oh, ow]);
        let w = g.constant("w", Tensor::random(DType::F32, &[m, x[1], k, k], 40 + i as u64));
        let b = g.constant("b", Tensor::random(DType::F32, &[m], 50 + i as u64));
        let y = xi.conv(w, Some(b), o) + r;
        g.output("y", if i % 2 == 0 { y.relu() } else { y.clip(-0.5, 0.5) });
        let g = g.build().unwrap();
        let s = schedule(&g, Some(true));
        assert_eq!(s.contains(CHANNEL_FORM), avx512(), "{s}");
        check(
            &g,
            &[
                Tensor::random(DType::F32, x, 60 + i as u64),
                Tensor::random(DType::F32, &[x[0], m, oh, ow], 70 + i as u64),
            ],
            1,
        );
    }
    // More positions than a run whose sums stay in L2 (2048 at 64 channels with 2 MiB): runs
    // of positions, each stored as it ends.
    let (g, x) = conv_graph(
        &[1, 4, 96, 96],
        &[64, 4, 3, 3],
        ConvOptions { pad: 1, ..ConvOptions::default() },
        true,
    );
    assert_eq!(schedule(&g, Some(true)).contains(CHANNEL_FORM), avx512());
    check(&g, &x, 1);
}

#[test]
fn hardswish_is_an_epilogue() {
    // MobileNetV3's activation after a strided stem (16 channels: the channel-vector form with
    // AVX-512), a direct 3x3 of 10 channels (vectors along positions), a depthwise 5x5/2, a
    // pointwise convolution and a GEMM; sums of 25-40 products, which cross -3 and 3.
    // (input, weight, stride, pad, groups)
    type Case = (&'static [usize], &'static [usize], usize, usize, usize);
    let convs: [Case; 4] = [
        (&[1, 3, 31, 31], &[16, 3, 3, 3], 2, 1, 1),
        (&[1, 8, 12, 12], &[10, 8, 3, 3], 1, 1, 1),
        (&[1, 24, 19, 19], &[24, 1, 5, 5], 2, 2, 24),
        (&[1, 32, 10, 10], &[48, 32, 1, 1], 1, 0, 1),
    ];
    for (i, &(x, w, stride, pad, group)) in convs.iter().enumerate() {
        let g = GraphBuilder::new("hardswish");
        let xi = g.input("x", DType::F32, x);
        let wt = g.constant("w", Tensor::random(DType::F32, w, 80 + i as u64));
        let b = g.constant("b", Tensor::random(DType::F32, &[w[0]], 90 + i as u64));
        let o = ConvOptions { stride, pad, group, ..ConvOptions::default() };
        g.output("y", xi.conv(wt, Some(b), o).unary(UnaryOp::HardSwish));
        let g = g.build().unwrap();
        let s = schedule(&g, Some(true));
        assert!(s.contains("epilogue: bias, hardswish"), "{s}");
        check(&g, &[Tensor::random(DType::F32, x, 100 + i as u64)], 1);
    }
    let g = GraphBuilder::new("gemm_hardswish");
    let a = g.input("a", DType::F32, [24, 40]);
    let bw = g.constant("b", Tensor::random(DType::F32, &[40, 36], 110));
    g.output("y", a.matmul(bw).unary(UnaryOp::HardSwish));
    let g = g.build().unwrap();
    assert!(schedule(&g, Some(true)).contains("hardswish"));
    check(&g, &[Tensor::random(DType::F32, &[24, 40], 111)], 1);
}

/// SiLU as exporters write it, `x * sigmoid(x)`, becomes one Swish (`passes::recognize`) that
/// each convolution path applies as its epilogue, and a residual added after it
/// (`x + silu(conv(x))`, YOLOv8's bottleneck) is added last, after the activation.
#[test]
fn silu_and_a_residual_after_it_are_epilogues() {
    // (input, weight, stride, pad, groups): the channel-vector form (16 channels), vectors along
    // positions (10 channels), a depthwise 5x5 and a pointwise convolution.
    type Case = (&'static [usize], &'static [usize], usize, usize, usize);
    let convs: [Case; 4] = [
        (&[1, 16, 15, 15], &[16, 16, 3, 3], 1, 1, 1),
        (&[1, 10, 12, 12], &[10, 10, 3, 3], 1, 1, 1),
        (&[1, 24, 19, 19], &[24, 1, 5, 5], 1, 2, 24),
        (&[1, 32, 10, 10], &[32, 32, 1, 1], 1, 0, 1),
    ];
    for (i, &(x, w, stride, pad, group)) in convs.iter().enumerate() {
        for residual in [false, true] {
            let g = GraphBuilder::new("silu");
            let xi = g.input("x", DType::F32, x);
            let wt = g.constant("w", Tensor::random(DType::F32, w, 180 + i as u64));
            let b = g.constant("b", Tensor::random(DType::F32, &[w[0]], 190 + i as u64));
            let o = ConvOptions { stride, pad, group, ..ConvOptions::default() };
            let c = xi.conv(wt, Some(b), o);
            let silu = c * c.unary(UnaryOp::Sigmoid);
            g.output("y", if residual { xi + silu } else { silu });
            let g = g.build().unwrap();
            let s = schedule(&g, Some(true));
            let want = if residual {
                "epilogue: bias, silu, residual add"
            } else {
                "epilogue: bias, silu"
            };
            assert!(s.contains(want), "case {i}, residual {residual}:\n{s}");
            check(&g, &[Tensor::random(DType::F32, x, 200 + i as u64)], 1);
        }
    }
}

#[test]
fn direct_convolutions_whose_taps_read_some_stride_phases() {
    // The direct form fills only the stride-phase planes a tap reads: a 1x1 stride-2 window
    // reads one of four, a 2x2 stride-4 window four of sixteen, a 3x3 window dilated 2 at stride
    // 2 only the even phase; a 3x3 stride-3 window every one.
    for (k, stride, dilation, pad) in [(1, 2, 1, 0), (2, 4, 1, 1), (3, 2, 2, 2), (3, 3, 1, 1)] {
        let (g, x) = conv_graph(
            &[2, 6, 19, 23],
            &[10, 6, k, k],
            ConvOptions { stride, pad, dilation, ..ConvOptions::default() },
            true,
        );
        let s = schedule(&g, Some(true));
        if k > 1 || stride > 1 {
            assert!(s.contains("stride-phase planes"), "{s}");
        }
        check(&g, &x, 1);
    }
}

#[test]
fn pointwise_convolutions_strided_and_not_and_one_dimensional() {
    let (g, x) = conv_graph(&[1, 32, 20, 20], &[48, 32, 1, 1], ConvOptions::default(), true);
    check(&g, &x, 1);
    let (g, x) = conv_graph(
        &[1, 32, 20, 20],
        &[48, 32, 1, 1],
        ConvOptions { stride: 2, ..ConvOptions::default() },
        false,
    );
    check(&g, &x, 1);
    let (g, x) = conv_graph(&[1, 64, 70], &[40, 64, 1], ConvOptions::default(), true);
    check(&g, &x, 1);
}

#[test]
fn a_strided_dilated_stem_with_padding() {
    let (g, x) = conv_graph(
        &[1, 3, 30, 30],
        &[16, 3, 7, 7],
        ConvOptions { stride: 2, pad: 3, ..ConvOptions::default() },
        true,
    );
    check(&g, &x, 1);
    let (g, x) = conv_graph(
        &[2, 8, 17, 17],
        &[12, 8, 3, 3],
        ConvOptions { stride: 2, pad: 2, dilation: 2, ..ConvOptions::default() },
        true,
    );
    check(&g, &x, 1);
}

#[test]
fn grouped_and_depthwise_convolutions() {
    // ResNeXt-style groups of 8 channels; depthwise 3x3 at strides 1 and 2, 5x5 with dilation,
    // and rows that are not a multiple of the 16-lane vector; channels regrouped in blocks of 16
    // with a part block left (24, 40), and a 9x9 window too wide to regroup (rows of vectors).
    let (g, x) = conv_graph(
        &[1, 32, 9, 9],
        &[32, 8, 3, 3],
        ConvOptions { pad: 1, group: 4, ..ConvOptions::default() },
        true,
    );
    check(&g, &x, 1);
    for (x, w, o) in [
        (
            [1, 24, 19, 21],
            [24, 1, 3, 3],
            ConvOptions { pad: 1, group: 24, ..ConvOptions::default() },
        ),
        (
            [2, 16, 23, 18],
            [16, 1, 3, 3],
            ConvOptions { stride: 2, pad: 1, group: 16, ..ConvOptions::default() },
        ),
        (
            [1, 8, 20, 37],
            [8, 1, 5, 5],
            ConvOptions { pad: 3, dilation: 2, group: 8, ..ConvOptions::default() },
        ),
        (
            [1, 8, 20, 37],
            [8, 1, 3, 3],
            ConvOptions { stride: 3, group: 8, ..ConvOptions::default() },
        ),
        ([1, 40, 7, 7], [40, 1, 3, 3], ConvOptions { pad: 1, group: 40, ..ConvOptions::default() }),
        (
            [2, 40, 14, 14],
            [40, 1, 5, 5],
            ConvOptions { stride: 2, pad: 2, group: 40, ..ConvOptions::default() },
        ),
        (
            [1, 16, 12, 12],
            [16, 1, 9, 9],
            ConvOptions { pad: 4, group: 16, ..ConvOptions::default() },
        ),
    ] {
        let (g, inputs) = conv_graph(&x, &w, o, true);
        let s = schedule(&g, Some(true));
        assert!(s.contains("depthwise conv"));
        assert_eq!(s.contains("along each row"), w[2] * w[3] > 64, "{s}");
        check(&g, &inputs, 1);
    }
    // A depthwise convolution with a residual add and a clip (MobileNet's form).
    let g = GraphBuilder::new("dw_block");
    let x = g.input("x", DType::F32, [1, 16, 14, 14]);
    let r = g.input("r", DType::F32, [1, 16, 14, 14]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, 1, 3, 3], 16));
    let y = x.conv(w, None, ConvOptions { pad: 1, group: 16, ..ConvOptions::default() }) + r;
    g.output("y", y.clip(0.0, 0.6));
    check(
        &g.build().unwrap(),
        &[
            Tensor::random(DType::F32, &[1, 16, 14, 14], 17),
            Tensor::random(DType::F32, &[1, 16, 14, 14], 18),
        ],
        1,
    );
}

#[test]
fn depthwise_convolutions_split_into_bands_of_rows() {
    // Few channels on large planes (DBNet's first depthwise: 8 channels of 320x320) split their
    // output rows into bands: planned for 16 threads, so bands give the units, and (for 1
    // thread) on a plane whose regrouped scratch would overflow the L2 cache. Regrouped (8, 24
    // channels) and channel-blocked (16) forms; strides, dilation, padding that clips, and a
    // residual before and after the activation, each band's edge rows against the interpreter.
    let planned = |threads: usize| Options { threads: Some(threads), ..options(Some(true)) };
    // (Padding of 3 on a 3x3 window and 28 output rows in 28 bands: the first and last bands
    // read padding only.)
    let cases: [([usize; 4], usize, usize, usize, usize); 6] = [
        ([1, 8, 40, 33], 3, 1, 1, 1),
        ([1, 8, 24, 200], 3, 1, 3, 1),
        ([2, 24, 37, 29], 5, 2, 2, 1),
        ([1, 8, 35, 30], 3, 1, 2, 2),
        ([1, 16, 48, 20], 3, 1, 1, 1),
        ([1, 8, 121, 100], 3, 3, 0, 1),
    ];
    for (x, k, stride, pad, dilation) in cases {
        for residual_last in [false, true] {
            let g = GraphBuilder::new("dw_bands");
            let xi = g.input("x", DType::F32, x);
            let w = g.constant("w", Tensor::random(DType::F32, &[x[1], 1, k, k], 31));
            let b = g.constant("b", Tensor::random(DType::F32, &[x[1]], 32));
            let o = ConvOptions { stride, pad, dilation, group: x[1] };
            // (A residual needs the output's shape: the stride-1 cases that keep it have one.)
            let same = stride == 1 && 2 * pad == dilation * (k - 1);
            let conv = xi.conv(w, Some(b), o);
            let y = match (same, residual_last) {
                (false, _) => conv.relu(),
                (true, false) => (conv + xi).relu(),
                (true, true) => conv.relu() + xi,
            };
            g.output("y", y);
            let g = g.build().unwrap();
            let s = compile(&g, &planned(16), true).expect("compiles").stages
                [kiln_compiler::Stage::Schedule]
                .to_string();
            assert!(s.contains("bands of rows per image"), "{s}");
            let inputs = [Tensor::random(DType::F32, &x, 33)];
            let want = eval::run(&g, &inputs).expect("the interpreter runs the graph");
            for threads in [1, 2] {
                let exe = jit(
                    &g,
                    &planned(16),
                    &LoadOptions { threads: Some(threads), ..Default::default() },
                )
                .expect("compiles");
                assert_scratch_bounded(&exe, threads);
                assert_close(&exe.run(&inputs).expect("runs")[0], &want[0], threads);
            }
            if !same {
                break;
            }
        }
    }
    // One thread, a plane whose regrouped scratch (16 channels of its padded input and output
    // planes, 7.4 MB) no cache holds: bands of rows all the same.
    let (g, inputs) = conv_graph(
        &[1, 8, 240, 240],
        &[8, 1, 3, 3],
        ConvOptions { pad: 1, group: 8, ..ConvOptions::default() },
        true,
    );
    let s = compile(&g, &planned(1), true).expect("compiles").stages
        [kiln_compiler::Stage::Schedule]
        .to_string();
    assert!(s.contains("regrouped") && s.contains("bands of rows per image"), "{s}");
    let want = eval::run(&g, &inputs).expect("the interpreter runs the graph");
    let exe = jit(&g, &planned(1), &LoadOptions { threads: Some(1), ..Default::default() })
        .expect("compiles");
    assert_close(&exe.run(&inputs).expect("runs")[0], &want[0], 1);
}

/// `got` within 1e-4 (absolute and relative) of the interpreter's `want`.
fn assert_close(got: &Tensor, want: &Tensor, threads: usize) {
    assert_eq!(got.dims(), want.dims());
    for (j, (a, b)) in got.to_f64s().iter().zip(want.to_f64s()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 + 1e-4 * b.abs(),
            "element {j}: compiled {a}, interpreter {b} ({threads} threads)"
        );
    }
}

#[test]
fn few_positions_by_many_channels_run_transposed() {
    // 5x5 and 6x6 outputs with 80 and 96 channels: vectors along channels, stored transposed;
    // a residual and a relu in the epilogue; 2 images.
    let g = GraphBuilder::new("late_block");
    let x = g.input("x", DType::F32, [2, 40, 5, 5]);
    let r = g.input("r", DType::F32, [2, 80, 5, 5]);
    let w = g.constant("w", Tensor::random(DType::F32, &[80, 40, 3, 3], 22));
    let b = g.constant("b", Tensor::random(DType::F32, &[80], 23));
    g.output(
        "y",
        (x.conv(w, Some(b), ConvOptions { pad: 1, ..ConvOptions::default() }) + r).relu(),
    );
    let g = g.build().unwrap();
    // (With AVX-512, a 3x3 window over whole vectors of channels runs direct with its vectors
    // along channels instead.)
    let form = if avx512() { CHANNEL_FORM } else { "transposed" };
    assert!(schedule(&g, None).contains(form));
    check(
        &g,
        &[
            Tensor::random(DType::F32, &[2, 40, 5, 5], 24),
            Tensor::random(DType::F32, &[2, 80, 5, 5], 25),
        ],
        1,
    );
    let (g, x) = conv_graph(&[1, 32, 6, 6], &[96, 32, 1, 1], ConvOptions::default(), true);
    assert!(schedule(&g, None).contains("transposed"));
    check(&g, &x, 1);
    // A classifier head's pointwise convolution (SqueezeNet's 512 -> 1000 on 13x13): 169
    // positions by four times as many channels, transposed, its positions' strips of 8 ending
    // in one of 1 and its channels' in a part strip.
    let (g, x) = conv_graph(&[1, 64, 13, 13], &[680, 64, 1, 1], ConvOptions::default(), true);
    assert!(schedule(&g, None).contains("transposed"));
    check(&g, &x, 1);
    // Pointwise on 7x7: 49 positions leave a strip of one row; 72 channels end in a half block
    // of the transposed store; a residual and a clip.
    let g = GraphBuilder::new("pointwise_7x7");
    let x = g.input("x", DType::F32, [1, 48, 7, 7]);
    let r = g.input("r", DType::F32, [1, 72, 7, 7]);
    let w = g.constant("w", Tensor::random(DType::F32, &[72, 48, 1, 1], 26));
    let b = g.constant("b", Tensor::random(DType::F32, &[72], 27));
    g.output("y", (x.conv(w, Some(b), ConvOptions::default()) + r).clip(-0.5, 0.5));
    let g = g.build().unwrap();
    assert!(schedule(&g, None).contains("transposed"));
    check(
        &g,
        &[
            Tensor::random(DType::F32, &[1, 48, 7, 7], 28),
            Tensor::random(DType::F32, &[1, 72, 7, 7], 29),
        ],
        1,
    );
}

/// `ConvTranspose(x, w, b)` with the given attributes, then a relu.
fn conv_transpose_graph(
    x: &[usize],
    w: &[usize],
    strides: Vec<usize>,
    pads: Vec<usize>,
    output_padding: Vec<usize>,
    output_shape: Vec<usize>,
) -> (Graph, Vec<Tensor>) {
    let spatial = x.len() - 2;
    let g = GraphBuilder::new("conv_transpose");
    let xi = g.input("x", DType::F32, x);
    let wt = g.constant("w", Tensor::random(DType::F32, w, 26));
    let b = g.constant("b", Tensor::random(DType::F32, &[w[1]], 27));
    let window = Window { strides, dilations: vec![1; spatial], pads, auto_pad: AutoPad::NotSet };
    let op = Op::ConvTranspose(ConvTranspose { window, group: 1, output_padding, output_shape });
    let y = g.apply(op, &[Some(xi), Some(wt), Some(b)], 1)[0];
    g.output("y", y.relu());
    (g.build().unwrap(), vec![Tensor::random(DType::F32, x, 28)])
}

#[test]
fn transposed_convolutions_as_a_gemm_and_a_scatter() {
    // Non-overlapping 2x2 stride 2; overlapping 4x4 stride 2 with pads and output padding, 2
    // images; an output_shape past the full result (negative padding); 1-D. Windows that do not
    // overlap are written once from blocks of input rows: rows of 80 outputs interleaved from
    // two column rows (32 at a time, then the rest) over 3 blocks of rows; a 2x2 stride 3
    // leaving rows and columns no window reaches, with output padding; padded; one output
    // channel (its units are input rows at 2 threads).
    for (x, w, s, p, op, os) in [
        (vec![1, 24, 7, 7], vec![24, 16, 2, 2], vec![2, 2], vec![0; 4], vec![], vec![]),
        (vec![1, 16, 60, 40], vec![16, 64, 2, 2], vec![2, 2], vec![0; 4], vec![], vec![]),
        (vec![1, 8, 9, 11], vec![8, 6, 2, 2], vec![3, 3], vec![0; 4], vec![1, 2], vec![]),
        (vec![2, 8, 8, 8], vec![8, 4, 2, 2], vec![2, 2], vec![1, 1, 1, 1], vec![], vec![]),
        (vec![1, 16, 33, 20], vec![16, 1, 2, 2], vec![2, 2], vec![0; 4], vec![], vec![]),
        (vec![2, 8, 7, 7], vec![8, 5, 4, 4], vec![2, 2], vec![1, 1, 1, 1], vec![1, 0], vec![]),
        (vec![1, 8, 5, 6], vec![8, 6, 3, 3], vec![2, 2], vec![0; 4], vec![], vec![12, 14]),
        (vec![1, 16, 20], vec![16, 12, 5], vec![3], vec![0; 2], vec![], vec![]),
    ] {
        let (g, inputs) = conv_transpose_graph(&x, &w, s, p, op, os);
        assert!(schedule(&g, Some(true)).contains("ConvTranspose as GEMM"));
        check(&g, &inputs, 1);
    }
}

#[test]
fn max_and_average_pooling() {
    // Max with ceil mode and padding, with dilation, 1-D; average counting the padding and not;
    // each checked against the interpreter.
    // (input dims, kind, kernel, strides, pads, dilations, ceil mode)
    type Case = (Vec<usize>, PoolKind, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, bool);
    let cases: Vec<Case> = vec![
        (
            vec![1, 16, 37, 41],
            PoolKind::Max,
            vec![3, 3],
            vec![2, 2],
            vec![1, 1, 1, 1],
            vec![1, 1],
            true,
        ),
        (vec![2, 8, 30, 33], PoolKind::Max, vec![3, 2], vec![1, 3], vec![0; 4], vec![2, 1], false),
        (vec![1, 16, 100], PoolKind::Max, vec![5], vec![1], vec![2, 2], vec![1], false),
        (
            vec![1, 16, 29, 31],
            PoolKind::Average { count_include_pad: true },
            vec![3, 3],
            vec![2, 2],
            vec![1, 1, 1, 1],
            vec![1, 1],
            false,
        ),
        (
            vec![1, 16, 29, 31],
            PoolKind::Average { count_include_pad: false },
            vec![3, 3],
            vec![2, 2],
            vec![1, 1, 1, 1],
            vec![1, 1],
            false,
        ),
        // The windows with copies of their own (sizes constant): 2x2/2 and 3x3/1.
        (vec![1, 16, 20, 35], PoolKind::Max, vec![2, 2], vec![2, 2], vec![0; 4], vec![1, 1], false),
        (
            vec![2, 8, 9, 37],
            PoolKind::Average { count_include_pad: false },
            vec![2, 2],
            vec![2, 2],
            vec![0; 4],
            vec![1, 1],
            false,
        ),
        (vec![1, 8, 9, 37], PoolKind::Max, vec![2, 2], vec![2, 2], vec![0; 4], vec![1, 1], true),
        (
            vec![1, 8, 19, 23],
            PoolKind::Average { count_include_pad: false },
            vec![3, 3],
            vec![1, 1],
            vec![1, 1, 1, 1],
            vec![1, 1],
            false,
        ),
    ];
    for (x, kind, kernel, strides, pads, dilations, ceil_mode) in cases {
        let g = GraphBuilder::new("pool");
        let xi = g.input("x", DType::F32, x.as_slice());
        let window = Window { strides, dilations, pads, auto_pad: AutoPad::NotSet };
        let op = Op::Pool(Pool { kind, kernel, window, ceil_mode, column_major_indices: false });
        let y = g.apply(op, &[Some(xi)], 1)[0];
        g.output("y", y);
        let g = g.build().unwrap();
        assert!(schedule(&g, Some(true)).contains("pooling"));
        check(&g, &[Tensor::random(DType::F32, &x, 29)], 1);
    }
    // 2x2/2 and 3x3/2 (padded) max pools give NaN exactly where a window holds one (ONNX's max
    // propagates it).
    for (k, pad) in [(2, 0), (3, 1)] {
        let g = GraphBuilder::new("pool_nan");
        let xi = g.input("x", DType::F32, [1, 2, 6, 40]);
        let window = Window {
            strides: vec![2, 2],
            dilations: vec![1, 1],
            pads: vec![pad; 4],
            auto_pad: AutoPad::NotSet,
        };
        let op = Op::Pool(Pool {
            kind: PoolKind::Max,
            kernel: vec![k, k],
            window,
            ceil_mode: false,
            column_major_indices: false,
        });
        let y = g.apply(op, &[Some(xi)], 1)[0];
        g.output("y", y);
        let g = g.build().unwrap();
        let mut v = Tensor::random(DType::F32, &[1, 2, 6, 40], 30).to_f64s();
        for i in [0, 43, 77, 250, 333, 479] {
            v[i] = f64::NAN;
        }
        let x = Tensor::from_f64s(DType::F32, &[1, 2, 6, 40], &v).unwrap();
        let want = eval::run(&g, std::slice::from_ref(&x)).unwrap()[0].to_f64s();
        let got =
            jit(&g, &options(Some(true)), &LoadOptions::default()).unwrap().run(&[x]).unwrap()[0]
                .to_f64s();
        assert!(want.iter().filter(|w| w.is_nan()).count() >= 6);
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a.is_nan() == b.is_nan() && (a.is_nan() || a == b),
                "{k}x{k} element {j}: compiled {a}, interpreter {b}"
            );
        }
    }
}

#[test]
fn matrix_vector_products_stream_packed_weights() {
    // 4 to 7 rows stream too where the register tile has 8 rows (AVX-512): groups of 4, 2, 1.
    for rows in [1, 3, 4, 7] {
        let g = GraphBuilder::new("gemv");
        let x = g.input("x", DType::F32, [rows, 130]);
        let w = g.constant("w", Tensor::random(DType::F32, &[70, 130], 19));
        let b = g.constant("b", Tensor::random(DType::F32, &[70], 20));
        g.output("y", x.linear(w, b));
        let g = g.build().unwrap();
        if rows < 4 {
            assert!(schedule(&g, Some(true)).contains("matrix-vector"));
        }
        check(&g, &[Tensor::random(DType::F32, &[rows, 130], 21)], 1);
    }
}

#[test]
fn gemms_with_packed_weights() {
    // Gemm with a transposed weight and a bias row (a linear layer), M not a multiple of the tile.
    let g = GraphBuilder::new("linear");
    let x = g.input("x", DType::F32, [10, 300]);
    let w = g.constant("w", Tensor::random(DType::F32, &[70, 300], 8));
    let b = g.constant("b", Tensor::random(DType::F32, &[70], 9));
    g.output("y", x.linear(w, b).relu());
    check(&g.build().unwrap(), &[Tensor::random(DType::F32, &[10, 300], 10)], 1);
    // A batched MatMul by a constant matrix: the batch folds into rows.
    let g = GraphBuilder::new("batched");
    let x = g.input("x", DType::F32, [2, 6, 200]);
    let w = g.constant("w", Tensor::random(DType::F32, &[200, 96], 11));
    g.output("y", x.matmul(w));
    check(&g.build().unwrap(), &[Tensor::random(DType::F32, &[2, 6, 200], 12)], 1);
    // Gemm reading A transposed.
    let g = GraphBuilder::new("trans_a");
    let x = g.input("x", DType::F32, [150, 9]);
    let w = g.constant("w", Tensor::random(DType::F32, &[150, 40], 13));
    g.output("y", x.gemm(w, None, Gemm { trans_a: true, ..Gemm::default() }));
    check(&g.build().unwrap(), &[Tensor::random(DType::F32, &[150, 9], 14)], 1);
}

#[test]
fn tails_the_epilogue_cannot_do_keep_the_linalg_path() {
    // A sigmoid after the convolution: not an epilogue the microkernel has.
    let g = GraphBuilder::new("silu");
    let x = g.input("x", DType::F32, [1, 16, 12, 1]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, 16, 3, 1], 15));
    g.output("y", x.conv(w, None, ConvOptions::default()).sigmoid());
    let g = g.build().unwrap();
    assert!(!schedule(&g, Some(true)).contains("microkernel:"));
    // And `Some(false)` keeps everything on the linalg path.
    let (g, _) = conv_graph(&[1, 24, 40, 1], &[20, 24, 5, 1], ConvOptions::default(), true);
    assert!(!schedule(&g, Some(false)).contains("microkernel:"));
}

#[test]
fn schedules_print_and_are_stable() {
    // The linalg path's decisions for the CIFAR-10 CNN (convolutions, pooling, linear layers,
    // softmax), and a microkernel plan; the register tile's rows and the cache blocks depend on
    // the host, so they are masked.
    let cnn = kiln_ir::models::cifarnet(4, 0).unwrap();
    insta::assert_snapshot!("cifarnet_schedule", schedule(&cnn, Some(false)));
    let (g, _) = conv_graph(&[1, 24, 40, 1], &[20, 24, 5, 1], ConvOptions::default(), true);
    insta::with_settings!({filters => vec![(r"register tile: \d+x\d+; blocks KC=\d+ MC=\d+ NC=\d+", "register tile: [MR]x[cols]; blocks KC=[kc] MC=[mc] NC=[nc]")]}, {
        insta::assert_snapshot!("k_by_1_schedule", schedule(&g, None));
    });
}

#[test]
fn tuning_times_both_candidates_and_its_choices_apply() {
    let (g, x) = conv_graph(&[1, 24, 40, 1], &[20, 24, 5, 1], ConvOptions::default(), true);
    let report =
        kiln_compiler::tune::tune(&g, &options(None), Some(1), &x, false, &|_| {}).expect("tunes");
    assert_eq!(report.kernels.len(), 1);
    assert_eq!(report.choices.len(), 1);
    assert!(
        report.kernels[0].linalg > std::time::Duration::ZERO
            && report.kernels[0].microkernel > std::time::Duration::ZERO
    );
    assert!(report.to_string().contains(if report.kept { "kept" } else { "untuned choices stay" }));
    // A choice given per kernel signature decides, both ways.
    for choice in [true, false] {
        let overrides = report.choices.keys().map(|k| (k.clone(), choice)).collect();
        let o =
            Options { cache: false, microkernel_overrides: Some(overrides), ..Options::default() };
        let s = &compile(&g, &o, true).unwrap().stages[kiln_compiler::Stage::Schedule];
        assert_eq!(s.contains("microkernel:"), choice, "{s}");
    }
}

#[test]
fn gathers_copy_whole_rows() {
    // An embedding lookup (int64 ids, some negative) and an int32-indexed gather of i64 rows.
    for (table, ids) in [
        (
            Tensor::random(DType::F32, &[300, 40], 30),
            Tensor::from_vec(&[2, 5], vec![0i64, 299, -1, -300, 7, 150, 3, 3, 298, -2]).unwrap(),
        ),
        (
            Tensor::from_vec(&[50, 24], (0..1200i64).collect::<Vec<_>>()).unwrap(),
            Tensor::from_vec(&[6], vec![49i32, 0, 1, -50, 25, 25]).unwrap(),
        ),
    ] {
        let g = GraphBuilder::new("gather");
        let t = g.constant("table", table);
        let i = g.input("ids", ids.dtype(), ids.dims());
        let y = g.apply(Op::Gather { axis: 0 }, &[Some(t), Some(i)], 1)[0];
        g.output("y", y);
        let g = g.build().unwrap();
        assert!(schedule(&g, Some(true)).contains("gather of"));
        check(&g, &[ids], 1);
    }
}

/// A recurrent layer with constant weights: `(graph, inputs)`. `lens` (constant, all full) and a
/// constant `initial_h` where asked; `outputs` results.
fn recurrent_graph(
    r: kiln_ir::op::Rnn,
    seq: usize,
    batch: usize,
    input: usize,
    const_state: bool,
    outputs: usize,
) -> (Graph, Vec<Tensor>) {
    use kiln_ir::op::{RnnCell, RnnDirection};
    let h = r.hidden_size;
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let gates = match r.cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 3,
        RnnCell::Lstm { .. } => 4,
    };
    let lstm = gates == 4;
    let g = GraphBuilder::new("recurrent");
    let xd = if r.batch_first { [batch, seq, input] } else { [seq, batch, input] };
    let state = if r.batch_first { [batch, dirs, h] } else { [dirs, batch, h] };
    let x = g.input("x", DType::F32, xd);
    let w = g.constant("w", Tensor::random(DType::F32, &[dirs, gates * h, input], 1));
    let rw = g.constant("r", Tensor::random(DType::F32, &[dirs, gates * h, h], 2));
    let b = g.constant("b", Tensor::random(DType::F32, &[dirs, 2 * gates * h], 3));
    let lens = g.constant("lens", Tensor::vector(&vec![seq as i32; batch]));
    let mut inputs = vec![Tensor::random(DType::F32, &xd, 4)];
    let h0 = if const_state {
        g.constant("h0", Tensor::random(DType::F32, &state, 5))
    } else {
        inputs.push(Tensor::random(DType::F32, &state, 5));
        g.input("h0", DType::F32, state)
    };
    let mut ops = vec![Some(x), Some(w), Some(rw), Some(b), Some(lens), Some(h0)];
    if lstm {
        inputs.push(Tensor::random(DType::F32, &state, 6));
        let c0 = g.input("c0", DType::F32, state);
        let p = g.constant("p", Tensor::random(DType::F32, &[dirs, 3 * h], 7));
        ops.extend([Some(c0), Some(p)]);
    }
    let results = g.apply(Op::Rnn(r), &ops, outputs);
    for (i, y) in results.into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    (g.build().expect("the recurrent graph builds"), inputs)
}

#[test]
fn recurrent_layers_run_whole_with_their_time_loop_inside() {
    use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
    let rnn = |cell, direction, hidden, batch_first| Rnn {
        cell,
        direction,
        hidden_size: hidden,
        activations: vec![],
        clip: None,
        batch_first,
    };
    // Hidden sizes off the vector width (padded gates), gate widths over 128 columns (the
    // 8-vector block and the remainders), both directions, both layouts, one row and several
    // (the projection's matrix-vector and packed GEMM paths), constant and input states.
    let cases = [
        (
            rnn(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Forward, 40, false),
            7,
            3,
            24,
            false,
            2,
        ),
        (
            rnn(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Bidirectional, 20, true),
            5,
            4,
            10,
            true,
            2,
        ),
        (
            rnn(RnnCell::Gru { linear_before_reset: false }, RnnDirection::Reverse, 33, false),
            3,
            1,
            17,
            false,
            1,
        ),
        (
            rnn(RnnCell::Lstm { input_forget: false }, RnnDirection::Bidirectional, 40, false),
            6,
            2,
            12,
            false,
            3,
        ),
        (
            rnn(RnnCell::Lstm { input_forget: true }, RnnDirection::Reverse, 9, true),
            4,
            3,
            5,
            true,
            3,
        ),
        (rnn(RnnCell::Simple, RnnDirection::Forward, 64, false), 8, 2, 32, false, 2),
    ];
    for (r, seq, batch, input, const_state, outputs) in cases {
        let what = format!("{:?} {} hidden {}", r.cell, r.direction.name(), r.hidden_size);
        let (g, inputs) = recurrent_graph(r, seq, batch, input, const_state, outputs);
        let s = schedule(&g, None);
        assert_eq!(s.matches("microkernel: recurrent").count(), 1, "{what}:\n{s}");
        if r_is_pinned(&what) {
            insta::with_settings!({filters => vec![(r"blocks KC=\d+ MC=\d+ NC=\d+", "blocks KC=[kc] MC=[mc] NC=[nc]")]}, {
                insta::assert_snapshot!("recurrent_gru_schedule", s);
            });
        }
        check(&g, &inputs, 1);
        // The choice of the contraction path does not apply: the layer has no other lowering.
        assert!(schedule(&g, Some(false)).contains("microkernel: recurrent"), "{what}");
    }
}

/// The case whose schedule is pinned: the bidirectional GRU.
fn r_is_pinned(what: &str) -> bool {
    what.contains("Gru") && what.contains("bidirectional")
}

#[test]
fn recurrent_layers_the_kernel_cannot_take_are_unrolled() {
    use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
    // A clip (the kernel has ONNX's default activations, unclipped) and a non-default activation.
    let mut r = Rnn {
        cell: RnnCell::Gru { linear_before_reset: false },
        direction: RnnDirection::Forward,
        hidden_size: 8,
        activations: vec![],
        clip: Some(0.5),
        batch_first: false,
    };
    let (g, inputs) = recurrent_graph(r.clone(), 3, 2, 4, false, 2);
    assert!(!schedule(&g, None).contains("recurrent"));
    crate::compile::check_against_eval(&g, &inputs, 2, 1e-4);
    r.clip = None;
    r.activations = vec![kiln_ir::UnaryOp::Relu, kiln_ir::UnaryOp::Tanh];
    let (g, inputs) = recurrent_graph(r, 3, 2, 4, false, 2);
    assert!(!schedule(&g, None).contains("recurrent"));
    crate::compile::check_against_eval(&g, &inputs, 2, 1e-4);
}

#[test]
fn reductions_and_softmax_by_rows() {
    use kiln_ir::op::{PoolKind, Reduce, ReduceKind};
    let reduce = |kind, dims: &[usize], axes: Option<&[i64]>, keepdims| {
        let g = GraphBuilder::new("reduce");
        let x = g.input("x", DType::F32, dims);
        let axes = axes.map(|a| g.constant("axes", Tensor::vector(a)));
        let y = g.apply(
            Op::Reduce(Reduce { kind, keepdims, noop_with_empty_axes: false }),
            &[Some(x), axes],
            1,
        );
        g.output("y", y[0]);
        (g.build().expect("builds"), vec![Tensor::random(DType::F32, dims, 8)])
    };
    // Rows with a tail past the last vector, inner rows with vector and scalar parts, two
    // reduced axes, everything, and each kind.
    let cases = [
        reduce(ReduceKind::Max, &[64, 1000], Some(&[-1]), true),
        reduce(ReduceKind::Sum, &[8, 100, 40], Some(&[1]), false),
        reduce(ReduceKind::Mean, &[4, 6, 7, 70], Some(&[1, 2]), true),
        reduce(ReduceKind::Min, &[33, 17], None, false),
        reduce(ReduceKind::Mean, &[300, 512], Some(&[1]), false),
    ];
    for (g, x) in &cases {
        check(g, x, 1);
    }
    // Axes apart (0 and 2) are not one run: the linalg path keeps them.
    let (g, _) = reduce(ReduceKind::Sum, &[8, 100, 40], Some(&[0, 2]), false);
    assert!(!schedule(&g, Some(true)).contains("microkernel:"));
    for kind in [PoolKind::Max, PoolKind::Average { count_include_pad: false }] {
        let g = GraphBuilder::new("global");
        let x = g.input("x", DType::F32, [2, 64, 7, 7]);
        let y = g.apply(Op::GlobalPool(kind), &[Some(x)], 1);
        g.output("y", y[0]);
        check(&g.build().unwrap(), &[Tensor::random(DType::F32, &[2, 64, 7, 7], 9)], 1);
    }
    for (op, dims) in [
        (Op::Softmax { axis: -1 }, vec![12, 37, 130]),
        (Op::LogSoftmax { axis: 1 }, vec![5, 300]),
        (Op::Softmax { axis: 1 }, vec![64, 16]),
    ] {
        let g = GraphBuilder::new("softmax");
        let x = g.input("x", DType::F32, dims.as_slice());
        let y = g.apply(op, &[Some(x)], 1);
        g.output("y", y[0]);
        let g = g.build().unwrap();
        assert!(schedule(&g, Some(true)).contains("softmax over"), "{}", schedule(&g, Some(true)));
        check(&g, &[Tensor::random(DType::F32, &dims, 10)], 1);
    }
}

#[test]
fn transposes_that_move_the_last_axis_go_by_blocks() {
    let transpose = |dtype: DType, dims: &[usize], perm: &[usize]| {
        let g = GraphBuilder::new("transpose");
        let x = g.input("x", dtype, dims);
        let y = g.apply(Op::Transpose { perm: perm.to_vec() }, &[Some(x)], 1);
        g.output("y", y[0]);
        (g.build().expect("builds"), vec![Tensor::random(dtype, dims, 12)])
    };
    // NCHW -> NHWC and back with edge blocks on both sides, a matrix, [B, S, D] -> [B, D, S],
    // two axes moving behind one, and 32-bit integers (only the bits move).
    let cases = [
        transpose(DType::F32, &[2, 19, 7, 5], &[0, 2, 3, 1]),
        transpose(DType::F32, &[1, 9, 11, 21], &[0, 3, 1, 2]),
        transpose(DType::F32, &[64, 200], &[1, 0]),
        transpose(DType::F32, &[12, 33, 48], &[0, 2, 1]),
        transpose(DType::F32, &[3, 5, 40], &[2, 0, 1]),
        transpose(DType::I32, &[4, 17, 18], &[0, 2, 1]),
    ];
    for (g, x) in &cases {
        assert!(schedule(g, Some(true)).contains("microkernel: transpose"));
        check(g, x, 1);
    }
    // The last axis staying last, or a permutation that is not one swap of two groups: the
    // linalg path keeps them.
    for perm in [[1usize, 0, 2, 3], [0, 3, 2, 1]] {
        let (g, _) = transpose(DType::F32, &[4, 5, 6, 7], &perm);
        assert!(!schedule(&g, Some(true)).contains("microkernel:"), "{perm:?}");
    }
}

/// An inverted-residual block (MobileNetV2's) and its strided form, between convolutions that
/// cannot take blocked tensors: pointwise 24 -> 64, depthwise 3x3, pointwise 64 -> 32 with a
/// residual, depthwise 3x3/2 with a clip, pointwise 64 -> 80 (the graph's output: NCHW).
fn inverted_residual(batch: usize, hw: usize) -> (Graph, Vec<Tensor>) {
    let g = GraphBuilder::new("inverted_residual");
    let x = g.input("x", DType::F32, [batch, 24, hw, hw]);
    let c = |name: &str, shape: &[usize], seed: u64| {
        g.constant(name, Tensor::random(DType::F32, shape, seed))
    };
    let dw = |stride| ConvOptions { pad: 1, stride, group: 64, ..ConvOptions::default() };
    let p0 = x.conv(c("w0", &[32, 24, 1, 1], 40), Some(c("b0", &[32], 41)), ConvOptions::default());
    let e1 = p0
        .conv(c("w1", &[64, 32, 1, 1], 42), Some(c("b1", &[64], 43)), ConvOptions::default())
        .clip(0.0, 6.0);
    let d1 = e1.conv(c("w2", &[64, 1, 3, 3], 44), Some(c("b2", &[64], 45)), dw(1)).clip(0.0, 6.0);
    let p1 =
        d1.conv(c("w3", &[32, 64, 1, 1], 46), Some(c("b3", &[32], 47)), ConvOptions::default())
            + p0;
    let e2 = p1.conv(c("w4", &[64, 32, 1, 1], 48), None, ConvOptions::default()).relu();
    let d2 = e2.conv(c("w5", &[64, 1, 3, 3], 49), Some(c("b5", &[64], 50)), dw(2)).clip(0.0, 6.0);
    g.output(
        "y",
        d2.conv(c("w6", &[80, 64, 1, 1], 51), Some(c("b6", &[80], 52)), ConvOptions::default()),
    );
    (g.build().unwrap(), vec![Tensor::random(DType::F32, &[batch, 24, hw, hw], 53)])
}

#[test]
fn runs_of_convolutions_hold_channel_blocked_tensors() {
    // 14x14, 9x9 and 7x7 (partial tiles of positions, a one-row strip), 2 images; the last
    // convolution reads the blocked tensor transposed (7x7 and smaller), or packs it (10x10).
    for (batch, hw) in [(1, 14), (2, 7), (1, 9), (1, 20)] {
        let (g, x) = inverted_residual(batch, hw);
        let s = schedule(&g, Some(true));
        assert!(s.contains("layout: 6 tensor(s) channel-blocked"), "{s}");
        check(&g, &x, 7);
    }
    // The decision and each kernel's form, pinned (the tile's rows and cache blocks are the
    // host's, masked).
    let (g, _) = inverted_residual(1, 14);
    insta::with_settings!({filters => vec![(r"register tile: \d+x\d+; blocks KC=\d+ MC=\d+ NC=\d+", "register tile: [MR]x[cols]; blocks KC=[kc] MC=[mc] NC=[nc]")]}, {
        insta::assert_snapshot!("inverted_residual_schedule", schedule(&g, Some(true)));
    });
}

/// Recurrences over no steps give the interpreter's answer (onnxruntime's for a sequence of
/// length 0): an empty `Y`, zero `Y_h` and `Y_c` whatever the initial states, in both layouts
/// and every direction; the recurrent kernel refused a sequence of length 0 ("kept whole ...
/// cannot take it").
#[test]
fn recurrences_over_no_steps_give_the_initial_states() {
    use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
    let rnn = |cell, direction, batch_first| Rnn {
        cell,
        direction,
        hidden_size: 5,
        activations: vec![],
        clip: None,
        batch_first,
    };
    let cases = [
        (rnn(RnnCell::Lstm { input_forget: false }, RnnDirection::Bidirectional, false), false, 3),
        (rnn(RnnCell::Gru { linear_before_reset: true }, RnnDirection::Forward, true), true, 2),
        (rnn(RnnCell::Simple, RnnDirection::Reverse, false), false, 2),
    ];
    for (r, const_state, outputs) in cases {
        let (g, inputs) = recurrent_graph(r, 0, 3, 4, const_state, outputs);
        crate::compile::check_against_eval(&g, &inputs, 1, 0.0);
    }
    // No initial state and no sequence lengths.
    let g = GraphBuilder::new("lstm_no_state");
    let x = g.input("x", DType::F32, [0, 2, 4]);
    let w = g.constant("w", Tensor::random(DType::F32, &[1, 20, 4], 1));
    let r = g.constant("r", Tensor::random(DType::F32, &[1, 20, 5], 2));
    let lstm = rnn(RnnCell::Lstm { input_forget: false }, RnnDirection::Forward, false);
    for (i, y) in g.apply(Op::Rnn(lstm), &[Some(x), Some(w), Some(r)], 3).into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    let g = g.build().unwrap();
    crate::compile::check_against_eval(&g, &[Tensor::zeros(DType::F32, &[0, 2, 4])], 1, 0.0);
}
