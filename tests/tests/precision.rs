//! `--precision`: bf16 convolutions and GEMMs on the CPU (bf16 products with `vdpbf16ps`, or
//! AMX's `tdpbf16ps` where the host has it; f32 sums) against the interpreter on operands rounded to bf16, and the precisions a target has no
//! kernels for refused by name.

use kiln_compiler::{compile, jit, CompileError, Options, Precision, TargetKind};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::op::Gemm;
use kiln_ir::{eval, DType, Graph, Tensor};
use kiln_runtime::LoadOptions;

fn options(precision: Precision) -> Options {
    Options {
        cache: false,
        microkernel_overrides: Some(Default::default()),
        precision,
        ..Options::default()
    }
}

/// `t` rounded to bf16 (to nearest, ties to even) and widened back.
fn bf16(t: &Tensor) -> Tensor {
    t.cast(DType::BF16).cast(DType::F32)
}

/// A convolution (bias, a residual, a ReLU) with its weight `w`; `x` and `r` are inputs.
fn conv(x: &[usize], w: &Tensor, o: ConvOptions, residual: Option<&[usize]>) -> Graph {
    let g = GraphBuilder::new("conv");
    let xi = g.input("x", DType::F32, x);
    let wt = g.constant("w", w.clone());
    let b = g.constant("b", Tensor::random(DType::F32, &[w.dims()[0]], 2));
    let mut y = xi.conv(wt, Some(b), o);
    if let Some(r) = residual {
        y = y + g.input("r", DType::F32, r);
    }
    g.output("y", y.relu());
    g.build().unwrap()
}

/// Whether this machine has bf16 kernels; says loudly when it has not.
fn bf16_here(test: &str) -> bool {
    let g = conv(
        &[1, 2, 4, 4],
        &Tensor::random(DType::F32, &[8, 2, 3, 3], 1),
        ConvOptions::default(),
        None,
    );
    match compile(&g, &options(Precision::Bf16), false) {
        Ok(_) => true,
        Err(e @ CompileError::Precision { .. }) => {
            eprintln!("SKIPPED {test}: {e}");
            false
        }
        Err(e) => panic!("compiling at bf16: {e}"),
    }
}

#[test]
fn bf16_convolutions_multiply_rounded_operands_and_sum_in_f32() {
    if !bf16_here("bf16_convolutions_multiply_rounded_operands_and_sum_in_f32") {
        return;
    }
    // (input, weight, options, residual): a 7x7/2 stem on 3 channels (an odd channel count: the
    // last pair half zero), 3x3 with a residual, rows that start at any lane, a dilated strided
    // window, 1x3, 1x1 at stride 2, channels not a multiple of the 8-row tile, a 7x7 image of
    // many channels, two images.
    let cases: Vec<(Vec<usize>, Vec<usize>, ConvOptions, bool)> = vec![
        (
            vec![1, 3, 30, 30],
            vec![16, 3, 7, 7],
            ConvOptions { stride: 2, pad: 3, ..Default::default() },
            false,
        ),
        (
            vec![1, 16, 14, 14],
            vec![16, 16, 3, 3],
            ConvOptions { pad: 1, ..Default::default() },
            true,
        ),
        (vec![1, 5, 7, 45], vec![10, 5, 3, 3], ConvOptions { pad: 1, ..Default::default() }, true),
        (
            vec![2, 8, 17, 17],
            vec![12, 8, 3, 3],
            ConvOptions { stride: 2, pad: 2, dilation: 2, ..Default::default() },
            false,
        ),
        (
            vec![1, 32, 20, 20],
            vec![48, 32, 1, 3],
            ConvOptions { pad: 1, ..Default::default() },
            true,
        ),
        (
            vec![1, 32, 20, 20],
            vec![20, 32, 1, 1],
            ConvOptions { stride: 2, ..Default::default() },
            false,
        ),
        (
            vec![1, 128, 7, 7],
            vec![64, 128, 3, 3],
            ConvOptions { pad: 1, ..Default::default() },
            true,
        ),
    ];
    for (i, (x, w, o, with_residual)) in cases.into_iter().enumerate() {
        let weight = Tensor::random(DType::F32, &w, 10 + i as u64);
        let x_in = Tensor::random(DType::F32, &x, 20 + i as u64);
        let oh = (x[2] + 2 * o.pad - o.dilation * (w[2] - 1) - 1) / o.stride + 1;
        let ow = (x[3] + 2 * o.pad - o.dilation * (w[3] - 1) - 1) / o.stride + 1;
        let r_dims = [x[0], w[0], oh, ow];
        let residual = with_residual.then_some(&r_dims[..]);
        let g = conv(&x, &weight, o, residual);
        let mut inputs = vec![x_in.clone()];
        if with_residual {
            inputs.push(Tensor::random(DType::F32, &r_dims, 30 + i as u64));
        }
        let mut rounded_inputs = inputs.clone();
        rounded_inputs[0] = bf16(&x_in);
        let rounded = conv(&x, &bf16(&weight), o, residual);
        check_bf16(&format!("conv case {i}"), &g, &inputs, &rounded, &rounded_inputs);
        // Where the host has AMX-BF16, the cases of 16 or more channels ran on its tiles too
        // (check_bf16 compiles with and without them).
        if kiln_runtime::device::cpu::usable("amx-bf16") {
            let mut amx = options(Precision::Bf16);
            amx.amx = true;
            let s = compile(&g, &amx, true).expect("compiles").stages
                [kiln_compiler::Stage::Schedule]
                .to_string();
            assert_eq!(s.contains("tdpbf16ps"), x[1] >= 16, "conv case {i}:\n{s}");
        } else if i == 0 {
            eprintln!("SKIPPED bf16 convolutions on AMX tiles: this CPU (or its OS) has no AMX-BF16; the vector kernels were checked");
        }
    }
}

/// Compiles `g` at bf16 and checks that its kernels say so and that it computes `rounded` (the
/// same graph with its weights rounded to bf16) on `rounded_inputs` (the inputs the bf16 kernels
/// multiply rounded likewise), in f32: bf16 products are exact in f32, so only the order of the
/// sums differs. With 1 and 2 threads.
fn check_bf16(
    case: &str,
    g: &Graph,
    inputs: &[Tensor],
    rounded: &Graph,
    rounded_inputs: &[Tensor],
) {
    let want = eval::run(rounded, rounded_inputs).expect("the interpreter runs it");
    let exact = eval::run(g, inputs).expect("the interpreter runs it");
    // The vector kernels, then AMX's tiles where the host has them.
    for (amx, threads) in [(false, 1), (false, 2), (true, 1), (true, 2)] {
        let options = Options { amx, ..options(Precision::Bf16) };
        let s = compile(g, &options, true).expect("compiles at bf16").stages
            [kiln_compiler::Stage::Schedule]
            .to_string();
        let products = if amx { ["vdpbf16ps", "tdpbf16ps"] } else { ["vdpbf16ps"; 2] };
        assert!(
            products.iter().any(|p| s.contains(p)),
            "{case}: not on bf16 products (amx {amx}):\n{s}"
        );
        let exe = jit(g, &options, &LoadOptions { threads: Some(threads), ..Default::default() })
            .expect("compiles");
        let got = exe.run(inputs).expect("runs");
        crate::microkernel::assert_scratch_bounded(&exe, threads);
        let (got, want, exact) = (got[0].to_f64s(), want[0].to_f64s(), exact[0].to_f64s());
        let mut off_f32 = 0.0f64;
        for (j, ((a, b), e)) in got.iter().zip(&want).zip(&exact).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 + 1e-4 * b.abs(),
                "{case}, element {j}: compiled {a}, bf16 reference {b} ({threads} threads, amx {amx})"
            );
            off_f32 = off_f32.max((a - e).abs());
        }
        // The test can tell: the f32 result lies well outside that tolerance.
        assert!(
            off_f32 > 1e-3,
            "{case}: compiled within {off_f32} of f32: were the operands rounded?"
        );
    }
}

#[test]
fn bf16_gemms_multiply_rounded_operands_and_sum_in_f32() {
    if !bf16_here("bf16_gemms_multiply_rounded_operands_and_sum_in_f32") {
        return;
    }
    // A linear layer (B transposed, a bias row, a ReLU) with rows not a multiple of the tile and
    // an odd K (the last pair half zero); one row (a matrix-vector product); a batched MatMul
    // with a residual; A read transposed; columns not a multiple of 32.
    let linear = |w: &Tensor, b: &Tensor| {
        let g = GraphBuilder::new("linear");
        let x = g.input("x", DType::F32, [10, 301]);
        let w = g.constant("w", w.clone());
        let b = g.constant("b", b.clone());
        g.output("y", x.linear(w, b).relu());
        g.build().unwrap()
    };
    let (w, b) = (Tensor::random(DType::F32, &[70, 301], 8), Tensor::random(DType::F32, &[70], 9));
    let x = Tensor::random(DType::F32, &[10, 301], 10);
    check_bf16("linear", &linear(&w, &b), &[x.clone()], &linear(&bf16(&w), &b), &[bf16(&x)]);
    let vector = |w: &Tensor| {
        let g = GraphBuilder::new("vector");
        let x = g.input("x", DType::F32, [1, 512]);
        g.output("y", x.matmul(g.constant("w", w.clone())));
        g.build().unwrap()
    };
    let (w, x) =
        (Tensor::random(DType::F32, &[512, 100], 11), Tensor::random(DType::F32, &[1, 512], 12));
    check_bf16("vector", &vector(&w), &[x.clone()], &vector(&bf16(&w)), &[bf16(&x)]);
    let batched = |w: &Tensor| {
        let g = GraphBuilder::new("batched");
        let x = g.input("x", DType::F32, [2, 6, 200]);
        let r = g.input("r", DType::F32, [2, 6, 96]);
        g.output("y", x.matmul(g.constant("w", w.clone())) + r);
        g.build().unwrap()
    };
    let (w, x, r) = (
        Tensor::random(DType::F32, &[200, 96], 13),
        Tensor::random(DType::F32, &[2, 6, 200], 14),
        Tensor::random(DType::F32, &[2, 6, 96], 15),
    );
    check_bf16(
        "batched",
        &batched(&w),
        &[x.clone(), r.clone()],
        &batched(&bf16(&w)),
        &[bf16(&x), r],
    );
    let trans_a = |w: &Tensor| {
        let g = GraphBuilder::new("trans_a");
        let x = g.input("x", DType::F32, [150, 9]);
        g.output(
            "y",
            x.gemm(g.constant("w", w.clone()), None, Gemm { trans_a: true, ..Gemm::default() }),
        );
        g.build().unwrap()
    };
    let (w, x) =
        (Tensor::random(DType::F32, &[150, 40], 16), Tensor::random(DType::F32, &[150, 9], 17));
    check_bf16("trans_a", &trans_a(&w), &[x.clone()], &trans_a(&bf16(&w)), &[bf16(&x)]);
    // 45 tokens (AMX's tiles where the host has them: a partial second pair of 16-row tiles),
    // K 130 (65 pairs, padded to 80), 50 columns (a partial strip), a residual.
    let tokens = |w: &Tensor| {
        let g = GraphBuilder::new("tokens");
        let x = g.input("x", DType::F32, [3, 15, 130]);
        let r = g.input("r", DType::F32, [3, 15, 50]);
        g.output("y", (x.matmul(g.constant("w", w.clone())) + r).relu());
        g.build().unwrap()
    };
    let (w, x, r) = (
        Tensor::random(DType::F32, &[130, 50], 18),
        Tensor::random(DType::F32, &[3, 15, 130], 19),
        Tensor::random(DType::F32, &[3, 15, 50], 20),
    );
    let g = tokens(&w);
    check_bf16("tokens", &g, &[x.clone(), r.clone()], &tokens(&bf16(&w)), &[bf16(&x), r]);
    if kiln_runtime::device::cpu::usable("amx-bf16") {
        let s = compile(&g, &Options { amx: true, ..options(Precision::Bf16) }, true)
            .expect("compiles")
            .stages[kiln_compiler::Stage::Schedule]
            .to_string();
        assert!(s.contains("tdpbf16ps"), "tokens: not on AMX tiles:\n{s}");
    } else {
        eprintln!("SKIPPED bf16 GEMMs on AMX tiles: this CPU (or its OS) has no AMX-BF16; the vector kernels were checked");
    }
}

#[test]
fn pointwise_convolutions_keep_f32_at_bf16() {
    if !bf16_here("pointwise_convolutions_keep_f32_at_bf16") {
        return;
    }
    // Their input is read where it lies: a bf16 copy of it costs more than it saves.
    let g = conv(
        &[1, 32, 20, 20],
        &Tensor::random(DType::F32, &[48, 32, 1, 1], 1),
        ConvOptions::default(),
        None,
    );
    let s = compile(&g, &options(Precision::Bf16), true).expect("compiles").stages
        [kiln_compiler::Stage::Schedule]
        .to_string();
    assert!(!s.contains("vdpbf16ps"), "{s}");
    let x = Tensor::random(DType::F32, &[1, 32, 20, 20], 2);
    let got = jit(&g, &options(Precision::Bf16), &LoadOptions::default())
        .expect("compiles")
        .run(&[x.clone()])
        .expect("runs");
    let want = eval::run(&g, &[x]).expect("the interpreter runs it");
    for (a, b) in got[0].to_f64s().iter().zip(want[0].to_f64s()) {
        assert!((a - b).abs() <= 1e-4 + 1e-4 * b.abs(), "compiled {a}, f32 {b}");
    }
}

#[test]
fn precisions_without_kernels_are_refused_by_name() {
    let g = conv(
        &[1, 4, 8, 8],
        &Tensor::random(DType::F32, &[8, 4, 3, 3], 1),
        ConvOptions::default(),
        None,
    );
    let refused = |o: &Options| match compile(&g, o, false) {
        Ok(_) => panic!("compiled at {} for {}", o.precision, o.target.name()),
        Err(e) => e,
    };
    let err = refused(&options(Precision::F16));
    assert!(matches!(err, CompileError::Precision { .. }), "{err}");
    assert!(err.to_string().starts_with("--precision f16 on cpu: "), "{err}");
    let err = refused(&options(Precision::Tf32));
    assert!(err.to_string().starts_with("--precision tf32 on cpu: "), "{err}");
    // GPU targets take every precision (tensor cores, or rounded operands where there are none).
    for p in [Precision::Tf32, Precision::Bf16, Precision::F16] {
        let gpu = Options { target: TargetKind::Opencl, ..options(p) };
        compile(&g, &gpu, false).unwrap_or_else(|e| panic!("{p} on opencl: {e}"));
    }
    assert_eq!("bf16".parse::<Precision>(), Ok(Precision::Bf16));
    assert!("fp8".parse::<Precision>().unwrap_err().contains("one of f32, tf32, bf16, f16"));
}

/// The microkernels are what compute in bf16: forcing them off at bf16 is refused, `--tune`
/// (which times them against the f32 linalg schedules) refuses bf16.
#[test]
fn bf16_is_not_turned_off_by_microkernel_choices() {
    let g = conv(
        &[1, 16, 8, 8],
        &Tensor::random(DType::F32, &[16, 16, 3, 3], 1),
        ConvOptions::default(),
        None,
    );
    let x = Tensor::random(DType::F32, &[1, 16, 8, 8], 2);
    let tuned =
        kiln_compiler::tune::tune(&g, &options(Precision::Bf16), Some(1), &[x], false, &|_| {});
    let Err(err) = tuned else { panic!("tuning at bf16 is refused") };
    assert!(err.to_string().contains("tune without --precision bf16"), "{err}");
    if !bf16_here("bf16_is_not_turned_off_by_microkernel_choices") {
        return;
    }
    let off = Options { microkernel: Some(false), ..options(Precision::Bf16) };
    let Err(err) = compile(&g, &off, false) else { panic!("bf16 without microkernels is refused") };
    assert!(matches!(err, CompileError::Precision { .. }), "{err}");
    assert!(err.to_string().contains("the microkernels are turned off"), "{err}");
}
