//! The GPU tile kernels (`backend/gpu/tile/`): each shape at the sizes that pick each of its
//! forms, run on OpenCL against the interpreter (Intel's CPU runtime under `make test`; the
//! OpenCL flavour exchanges values through workgroup memory where NVIDIA's shuffles), their PTX
//! through `ptxas` for sm_80 and sm_90, and the plans as a snapshot.

use kiln_compiler::{Options, Precision, Stage, TargetKind};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::op::ReduceKind;
use kiln_ir::Op;
use kiln_ir::{DType, Graph, Tensor};
use kiln_runtime::LoadOptions;
use kiln_runtime::Target;

use crate::gpu::{check_opencl, have, skipped};

/// One test graph: a name, the graph, its inputs, and the plan text its kernel must get.
struct Case {
    name: &'static str,
    graph: Graph,
    inputs: Vec<Tensor>,
    plan: &'static str,
}

fn reduce_case(
    name: &'static str,
    dims: &[usize],
    kind: ReduceKind,
    axes: &[i64],
    keepdims: bool,
    tail: bool,
    plan: &'static str,
) -> Case {
    let g = GraphBuilder::new(name);
    let x = g.input("x", DType::F32, dims.to_vec());
    let mut y = x.reduce(kind, axes, keepdims);
    if tail {
        // A tail reading a broadcast operand and an activation.
        let out = y.ty().unwrap().shape.as_fixed().unwrap();
        let b = g.constant("b", Tensor::random(DType::F32, &[*out.last().unwrap()], 2));
        y = y.add(b).tanh();
    }
    g.output("y", y);
    Case {
        name,
        graph: g.build().unwrap(),
        inputs: vec![Tensor::random(DType::F32, dims, 1)],
        plan,
    }
}

/// Reductions at sizes that pick every form.
fn reductions() -> Vec<Case> {
    vec![
        reduce_case("rows_warp", &[300, 96], ReduceKind::Sum, &[-1], false, true, "a warp a row"),
        reduce_case("rows_odd", &[37, 33], ReduceKind::Max, &[1], true, false, "a warp a row"),
        reduce_case(
            "rows_block",
            &[40, 5000],
            ReduceKind::Mean,
            &[1],
            false,
            false,
            "a block of 256 a row",
        ),
        reduce_case("scalar_l2", &[700, 1000], ReduceKind::L2, &[], false, false, "each row over"),
        reduce_case(
            "split_rows_l1",
            &[3, 131072],
            ReduceKind::L1,
            &[1],
            true,
            false,
            "each row over",
        ),
        reduce_case(
            "columns",
            &[64, 70, 9],
            ReduceKind::Sum,
            &[1],
            false,
            true,
            "a thread an output",
        ),
        reduce_case(
            "split_columns",
            &[3000, 100],
            ReduceKind::SumSquare,
            &[0],
            false,
            false,
            "the reduction over",
        ),
        reduce_case(
            "min_middle",
            &[4, 6, 50, 7],
            ReduceKind::Min,
            &[1, 2],
            true,
            false,
            "a thread an output",
        ),
        {
            let g = GraphBuilder::new("global_pool");
            let x = g.input("x", DType::F32, [2, 64, 7, 7]);
            g.output("y", x.global_avg_pool().relu());
            Case {
                name: "global_pool",
                graph: g.build().unwrap(),
                inputs: vec![Tensor::random(DType::F32, &[2, 64, 7, 7], 3)],
                plan: "GlobalAveragePool",
            }
        },
    ]
}

fn rows_case(name: &'static str, dims: &[usize], op: &str, tail: bool, plan: &'static str) -> Case {
    let g = GraphBuilder::new(name);
    let x = g.input("x", DType::F32, dims.to_vec());
    let last = *dims.last().unwrap();
    let mut y = match op {
        "softmax" => x.softmax(-1),
        "logsoftmax" => g.apply(Op::LogSoftmax { axis: -1 }, &[Some(x)], 1)[0],
        "layernorm" => {
            let s = g.constant("s", Tensor::random(DType::F32, &[last], 2));
            let b = g.constant("b", Tensor::random(DType::F32, &[last], 3));
            x.layer_norm(s, b, -1, 1e-5)
        }
        "layernorm2" => {
            // Over the last two axes, the scale broadcast along the second to last.
            let s = g.constant("s", Tensor::random(DType::F32, &[1, last], 2));
            let b = g.constant("b", Tensor::random(DType::F32, &[1], 3));
            x.layer_norm(s, b, -2, 1e-5)
        }
        "rmsnorm" => {
            let s = g.constant("s", Tensor::random(DType::F32, &[last], 4));
            g.apply(Op::RmsNorm { axis: -1, epsilon: 1e-6 }, &[Some(x), Some(s)], 1)[0]
        }
        other => panic!("no row op {other}"),
    };
    if tail {
        y = y.mul(x).sigmoid();
    }
    g.output("y", y);
    let inputs = vec![Tensor::random(DType::F32, dims, 5)];
    Case { name, graph: g.build().unwrap(), inputs, plan }
}

/// Row kernels at sizes that pick every form.
fn row_kernels() -> Vec<Case> {
    vec![
        rows_case("softmax_warp", &[3, 40, 128], "softmax", false, "a warp a row"),
        rows_case("softmax_odd", &[37, 45], "softmax", true, "the row in registers"),
        rows_case("logsoftmax_block", &[6, 3000], "logsoftmax", false, "a block of 256 a row"),
        rows_case("softmax_long", &[3, 20000], "softmax", false, "the row read per statistic"),
        rows_case("logsoftmax_long", &[2, 9001], "logsoftmax", true, "the row read per statistic"),
        rows_case("layernorm_warp", &[50, 768], "layernorm", false, "a warp a row"),
        rows_case("layernorm_tail", &[20, 100], "layernorm", true, "the row in registers"),
        rows_case(
            "layernorm_axes",
            &[4, 6, 10],
            "layernorm2",
            false,
            "LayerNormalization [4 x 60]",
        ),
        rows_case("layernorm_long", &[2, 10000], "layernorm", false, "the row read per statistic"),
        rows_case("rmsnorm", &[33, 512], "rmsnorm", false, "RMSNormalization"),
        rows_case("rmsnorm_long", &[2, 12000], "rmsnorm", true, "the row read per statistic"),
    ]
}

fn matmul_case(
    name: &'static str,
    a: &[usize],
    b: &[usize],
    tail: bool,
    plan: &'static str,
) -> Case {
    let g = GraphBuilder::new(name);
    let x = g.input("x", DType::F32, a.to_vec());
    let w = g.constant("w", Tensor::random(DType::F32, b, 2));
    let mut y = x.matmul(w);
    if tail {
        let n = *b.last().unwrap();
        let bias = g.constant("bias", Tensor::random(DType::F32, &[n], 3));
        y = y.add(bias).relu();
    }
    g.output("y", y);
    Case { name, graph: g.build().unwrap(), inputs: vec![Tensor::random(DType::F32, a, 1)], plan }
}

fn gemm_case(
    name: &'static str,
    [m, k, n]: [usize; 3],
    trans: (bool, bool),
    c: Option<&[usize]>,
    [alpha, beta]: [f32; 2],
) -> Case {
    let g = GraphBuilder::new(name);
    let ad = if trans.0 { [k, m] } else { [m, k] };
    let bd = if trans.1 { vec![n, k] } else { vec![k, n] };
    let x = g.input("x", DType::F32, ad.to_vec());
    let w = g.constant("w", Tensor::random(DType::F32, &bd, 2));
    let cv = c.map(|d| g.constant("c", Tensor::random(DType::F32, d, 3)));
    let attrs = kiln_ir::op::Gemm { alpha, beta, trans_a: trans.0, trans_b: trans.1 };
    g.output("y", x.gemm(w, cv, attrs).sigmoid());
    Case {
        name,
        graph: g.build().unwrap(),
        inputs: vec![Tensor::random(DType::F32, &ad, 1)],
        plan: "tile gemm: Gemm",
    }
}

fn conv_case(
    name: &'static str,
    x: [usize; 4],
    co: usize,
    k: usize,
    [stride, pad, dilation]: [usize; 3],
    plan: &'static str,
) -> Case {
    let g = GraphBuilder::new(name);
    let input = g.input("x", DType::F32, x.to_vec());
    let w = g.constant("w", Tensor::random(DType::F32, &[co, x[1], k, k], 2));
    let b = g.constant("b", Tensor::random(DType::F32, &[co], 3));
    let o = ConvOptions::default().stride(stride).pad(pad).dilation(dilation);
    g.output("y", input.conv(w, Some(b), o).relu());
    Case { name, graph: g.build().unwrap(), inputs: vec![Tensor::random(DType::F32, &x, 1)], plan }
}

/// Contractions: every tile, edges in every dimension, transposed operands, split-K, batches
/// that broadcast, Gemm's alpha/beta/C, convolutions direct and pointwise.
fn contractions() -> Vec<Case> {
    vec![
        matmul_case("matmul_large", &[1024, 64], &[64, 2048], true, "128x128 tiles"),
        matmul_case(
            "matmul_edges",
            &[130, 37],
            &[37, 70],
            false,
            "tile gemm: MatMul [130 x 70 x 37]",
        ),
        matmul_case("matmul_skinny", &[5, 300], &[300, 200], true, "16x128 tiles"),
        matmul_case("matmul_split_k", &[64, 4096], &[4096, 64], false, "split over"),
        matmul_case("matmul_batched", &[3, 40, 24], &[24, 36], true, "x 3 ("),
        matmul_case("matmul_broadcast", &[2, 1, 20, 16], &[3, 16, 12], false, "x 6 ("),
        gemm_case("gemm_t", [70, 50, 90], (true, true), Some(&[90]), [0.5, 2.0]),
        gemm_case("gemm_tb", [33, 64, 48], (false, true), Some(&[33, 1]), [1.0, 1.0]),
        gemm_case("gemm_plain", [64, 64, 64], (false, false), None, [1.5, 0.0]),
        conv_case("conv3x3", [2, 8, 20, 20], 16, 3, [1, 1, 1], "tile gemm: Conv [16 x 400 x 72]"),
        conv_case(
            "conv_stem",
            [1, 3, 30, 30],
            12,
            7,
            [2, 3, 1],
            "tile gemm: Conv [12 x 225 x 147]",
        ),
        conv_case("conv_dilated", [1, 4, 17, 13], 8, 3, [1, 2, 2], "tile gemm: Conv"),
        conv_case("conv1x1", [2, 32, 9, 9], 24, 1, [1, 0, 1], "tile gemm: Conv 1x1"),
    ]
}

fn lowered(graph: &Graph, target: TargetKind) -> String {
    let options = Options { target, cache: false, ..Options::default() };
    let stages = kiln_compiler::compile(graph, &options, true).expect("compiles").stages;
    stages[Stage::Lowered].lines().filter(|l| l.starts_with("//")).collect::<Vec<_>>().join("\n")
}

#[test]
fn tile_reductions_match_the_interpreter_on_opencl() {
    for c in reductions() {
        let plans = lowered(&c.graph, TargetKind::Opencl);
        assert!(plans.contains("tile reduce") && plans.contains(c.plan), "{}: {plans}", c.name);
    }
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the tile reductions were not run");
    }
    for c in reductions() {
        eprintln!("{}", c.name);
        check_opencl(&c.graph, &c.inputs, None, 1e-4);
    }
}

#[test]
fn tile_rows_match_the_interpreter_on_opencl() {
    for c in row_kernels() {
        let plans = lowered(&c.graph, TargetKind::Opencl);
        assert!(plans.contains("tile rows") && plans.contains(c.plan), "{}: {plans}", c.name);
    }
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the tile row kernels were not run");
    }
    for c in row_kernels() {
        eprintln!("{}", c.name);
        check_opencl(&c.graph, &c.inputs, None, 1e-4);
    }
}

#[test]
fn tile_contractions_match_the_interpreter_on_opencl() {
    for c in contractions() {
        let plans = lowered(&c.graph, TargetKind::Opencl);
        assert!(plans.contains("tile gemm") && plans.contains(c.plan), "{}: {plans}", c.name);
    }
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the tile contractions were not run");
    }
    for c in contractions() {
        eprintln!("{}", c.name);
        check_opencl(&c.graph, &c.inputs, None, 1e-4);
    }
}

fn depthwise_case(
    name: &'static str,
    x: [usize; 4],
    mult: usize,
    k: usize,
    [stride, pad, dilation]: [usize; 3],
    bias: bool,
) -> Case {
    let g = GraphBuilder::new(name);
    let input = g.input("x", DType::F32, x.to_vec());
    let w = g.constant("w", Tensor::random(DType::F32, &[x[1] * mult, 1, k, k], 2));
    let b = bias.then(|| g.constant("b", Tensor::random(DType::F32, &[x[1] * mult], 3)));
    let o = ConvOptions::default().stride(stride).pad(pad).dilation(dilation).group(x[1]);
    g.output("y", input.conv(w, b, o).clip(0.0, 6.0));
    Case {
        name,
        graph: g.build().unwrap(),
        inputs: vec![Tensor::random(DType::F32, &x, 1)],
        plan: "tile depthwise",
    }
}

/// Depthwise convolutions: strides, padding, dilation, a depth multiplier, with and without bias.
fn depthwise() -> Vec<Case> {
    vec![
        depthwise_case("dw3x3", [2, 32, 14, 14], 1, 3, [1, 1, 1], true),
        depthwise_case("dw3x3_s2", [1, 24, 15, 15], 1, 3, [2, 1, 1], true),
        depthwise_case("dw5x5_dilated", [1, 8, 11, 9], 2, 5, [1, 4, 2], false),
    ]
}

#[test]
fn tile_depthwise_matches_the_interpreter_on_opencl() {
    for c in depthwise() {
        let plans = lowered(&c.graph, TargetKind::Opencl);
        assert!(plans.contains(c.plan), "{}: {plans}", c.name);
    }
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the depthwise tile kernel was not run");
    }
    for c in depthwise() {
        eprintln!("{}", c.name);
        check_opencl(&c.graph, &c.inputs, None, 1e-4);
    }
}

/// Runs `graph` on OpenCL with `precision` and a forced GPU schedule (None: the default).
fn run_opencl(
    graph: &Graph,
    inputs: &[Tensor],
    precision: Precision,
    schedule: Option<&str>,
) -> Vec<Tensor> {
    let options = Options {
        target: TargetKind::Opencl,
        cache: false,
        precision,
        gpu_schedule: schedule.map(|s| s.parse().expect("a schedule")),
        ..Options::default()
    };
    let exe = kiln_compiler::jit(graph, &options, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{precision} {schedule:?}: {e}"));
    exe.run(inputs).unwrap_or_else(|e| panic!("{precision} {schedule:?}: {e}"))
}

/// The largest difference of `got` from `want`, relative to `want`'s largest magnitude.
fn relative_error(got: &[Tensor], want: &[Tensor]) -> f64 {
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (g.to_f64s(), w.to_f64s());
        let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
        for (a, b) in g.iter().zip(&w) {
            worst = worst.max((a - b).abs() / scale);
        }
    }
    worst
}

/// The contractions at lower precision: operands rounded on the FMA tiles, and the tensor-core
/// kernel (its `mma` emulated through workgroup memory on OpenCL, with the same fragment
/// placement the hardware has). Both against the interpreter within the precision's error, and
/// against each other much closer (they round the same operands and differ only in the order
/// of the sums): a fragment in the wrong place would be far off.
#[test]
fn tile_contractions_at_lower_precision_on_opencl() {
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the tensor-core kernels were not run");
    }
    let picked =
        ["matmul_edges", "matmul_split_k", "matmul_broadcast", "gemm_t", "conv_stem", "conv1x1"];
    let cases: Vec<Case> =
        contractions().into_iter().filter(|c| picked.contains(&c.name)).collect();
    for (precision, tol) in
        [(Precision::Tf32, 4e-3), (Precision::Bf16, 3e-2), (Precision::F16, 4e-3)]
    {
        for c in &cases {
            let want = kiln_ir::eval::run(&c.graph, &c.inputs).expect("the interpreter runs it");
            let fma = run_opencl(&c.graph, &c.inputs, precision, None);
            let cores = run_opencl(&c.graph, &c.inputs, precision, Some("tensor-core"));
            let (e_fma, e_cores, e_both) = (
                relative_error(&fma, &want),
                relative_error(&cores, &want),
                relative_error(&cores, &fma),
            );
            eprintln!("{} {precision}: rounded FMA {e_fma:.2e}, tensor cores {e_cores:.2e}, apart {e_both:.2e}", c.name);
            assert!(e_fma < tol && e_cores < tol, "{} at {precision}: {e_fma} / {e_cores}", c.name);
            assert!(
                e_both < tol / 4.0,
                "{} at {precision}: the two kernels differ by {e_both}",
                c.name
            );
        }
    }
}

/// Every tile test graph.
fn all_cases() -> Vec<Case> {
    let mut all = reductions();
    all.extend(row_kernels());
    all.extend(contractions());
    all.extend(depthwise());
    all
}

#[test]
fn tile_plans_snapshot() {
    let plans: Vec<String> = all_cases()
        .iter()
        .map(|c| format!("{}:\n{}", c.name, lowered(&c.graph, TargetKind::Cuda)))
        .collect();
    insta::assert_snapshot!("tile_plans", plans.join("\n"));
}

/// PTX for sm_80 and sm_90 that NVIDIA's assembler accepts: every test graph in f32, and the
/// contractions on tensor cores at tf32, bf16 and f16.
#[test]
fn tile_ptx_passes_ptxas() {
    let ptxas = std::process::Command::new("ptxas").arg("--version").output();
    if !ptxas.is_ok_and(|o| o.status.success()) {
        return skipped("ptxas not installed (scripts/setup-cuda-tools.sh installs Debian's nvidia-cuda-toolkit); the tile kernels' PTX was not assembled");
    }
    let dir = std::env::temp_dir().join(format!("kiln-tile-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut runs: Vec<(Case, Precision)> =
        all_cases().into_iter().map(|c| (c, Precision::F32)).collect();
    for p in [Precision::Tf32, Precision::Bf16, Precision::F16] {
        runs.extend(contractions().into_iter().map(|c| (c, p)));
    }
    for (c, precision) in &runs {
        for arch in ["sm_80", "sm_90"] {
            let mut options = Options {
                target: TargetKind::Cuda,
                cache: false,
                precision: *precision,
                ..Options::default()
            };
            options.ptx.arch = arch.to_string();
            let stages = kiln_compiler::compile(&c.graph, &options, true)
                .unwrap_or_else(|e| panic!("{} {precision} for {arch}: {e:?}", c.name))
                .stages;
            if *precision != Precision::F32 {
                let plans = &stages[Stage::Lowered];
                assert!(
                    plans.contains("tensor cores"),
                    "{} {precision}: no tensor cores:\n{plans}",
                    c.name
                );
                assert!(
                    stages[Stage::Ptx].contains("mma.sync.aligned"),
                    "{} {precision}: no mma",
                    c.name
                );
            }
            let file = dir.join(format!("{}_{precision}_{arch}.ptx", c.name));
            std::fs::write(&file, &stages[Stage::Ptx]).unwrap();
            let out = std::process::Command::new("ptxas")
                .arg(format!("-arch={arch}"))
                .arg(&file)
                .arg("-o")
                .arg(dir.join("out.cubin"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ptxas rejects {} {precision} for {arch}: {}",
                c.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The single ops the GPU issue measures against PyTorch, at their real sizes: compiled only
/// (no GPU needed), so their launch shapes can be checked from the artifact.
fn real_sized_ops() -> Vec<(&'static str, Graph)> {
    let mut out = Vec::new();
    let conv = |name: &'static str,
                x: [usize; 4],
                co: usize,
                k: usize,
                stride: usize,
                pad: usize,
                group: usize| {
        let g = GraphBuilder::new(name);
        let input = g.input("x", DType::F32, x.to_vec());
        let w = g.constant("w", Tensor::zeros(DType::F32, &[co, x[1] / group, k, k]));
        let b = g.constant("b", Tensor::zeros(DType::F32, &[co]));
        let o = ConvOptions::default().stride(stride).pad(pad).group(group);
        g.output("y", input.conv(w, Some(b), o).relu());
        (name, g.build().unwrap())
    };
    {
        let g = GraphBuilder::new("matmul_4096");
        let a = g.input("a", DType::F32, [4096, 4096]);
        let b = g.input("b", DType::F32, [4096, 4096]);
        g.output("y", a.matmul(b));
        out.push(("matmul 4096^3", g.build().unwrap()));
    }
    out.push(conv("conv 3x3 64->64 56x56 b1", [1, 64, 56, 56], 64, 3, 1, 1, 1));
    out.push(conv("conv 3x3 64->64 56x56 b32", [32, 64, 56, 56], 64, 3, 1, 1, 1));
    out.push(conv("conv 7x7/2 3->64 224 (stem)", [1, 3, 224, 224], 64, 7, 2, 3, 1));
    out.push(conv("conv 1x1 256->64 56x56", [1, 256, 56, 56], 64, 1, 1, 0, 1));
    out.push(conv("depthwise 3x3 144 56x56", [1, 144, 56, 56], 144, 3, 1, 1, 144));
    {
        let g = GraphBuilder::new("reduce_l2");
        let x = g.input("x", DType::F32, [4096, 4096]);
        g.output("y", x.reduce_l2(&[], false));
        out.push(("ReduceL2 4096x4096 to a scalar", g.build().unwrap()));
    }
    {
        let g = GraphBuilder::new("softmax");
        let x = g.input("x", DType::F32, [32, 12, 128, 128]);
        g.output("y", x.softmax(-1));
        out.push(("Softmax [32,12,128,128]", g.build().unwrap()));
    }
    {
        let g = GraphBuilder::new("layernorm");
        let x = g.input("x", DType::F32, [32, 128, 768]);
        let s = g.constant("s", Tensor::zeros(DType::F32, &[768]));
        let b = g.constant("b", Tensor::zeros(DType::F32, &[768]));
        g.output("y", x.layer_norm(s, b, -1, 1e-5));
        out.push(("LayerNorm [32,128,768]", g.build().unwrap()));
    }
    out
}

/// From the compiled artifact alone: no launch moving over 1 MB or doing over 10 MFLOP runs on
/// fewer threads than an H100/H200 has SMs x 128, and every contraction takes the register-tile
/// kernel (f32) or the tensor cores (tf32, bf16).
#[test]
fn real_sized_gpu_launches_fill_the_gpu() {
    const SMS: u64 = 132;
    for (name, g) in real_sized_ops() {
        for precision in [Precision::F32, Precision::Tf32, Precision::Bf16] {
            let mut options =
                Options { target: TargetKind::Cuda, cache: false, precision, ..Options::default() };
            options.ptx.arch = "sm_90".into();
            let compiled = kiln_compiler::compile(&g, &options, true)
                .unwrap_or_else(|e| panic!("{name} at {precision}: {e}"));
            let m = &compiled.artifact.manifest;
            for l in &m.launches {
                let k = &m.kernels[l.kernel];
                let threads: u64 = k.grid.iter().chain(&k.block).map(|&d| d as u64).product();
                if k.bytes > 1 << 20 || k.flops > 10_000_000 {
                    assert!(
                        threads >= SMS * 128,
                        "{name} at {precision}: `{}` moves {} bytes and does {} flops on {threads} threads (grid {:?}, block {:?})",
                        k.symbol, k.bytes, k.flops, k.grid, k.block
                    );
                }
            }
            let lowered = &compiled.stages[Stage::Lowered];
            if name.starts_with("matmul") || name.starts_with("conv") {
                let want = if precision == Precision::F32 { "tile gemm" } else { "tensor cores" };
                assert!(lowered.contains(want), "{name} at {precision}: no {want}:\n{lowered}");
            }
        }
    }
}
