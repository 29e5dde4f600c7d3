//! The GPU targets: compiled for OpenCL and run on whatever OpenCL device there is (Intel's CPU
//! runtime under `make test`), against the interpreter, with every schedule; PTX checked by
//! `ptxas`; a clear error where there is no CUDA GPU. A missing device or tool is reported loudly
//! and the test returns (it cannot be checked here), never silently passes.

use kiln_compiler::{Options, TargetKind};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::{eval, models, DType, Graph, Tensor};
use kiln_runtime::{LoadOptions, Target};

pub(crate) fn skipped(what: &str) {
    // Both streams: the harness captures stdout of passing tests, and `--nocapture` runs show it.
    eprintln!("SKIPPED: {what}");
    println!("SKIPPED: {what}");
}

pub(crate) fn have(target: Target) -> bool {
    kiln_runtime::list_devices().iter().any(|d| d.target == target && d.usable)
}

/// Compiles `graph` for OpenCL (with `schedule` forced where it applies), runs it and checks every
/// output against the interpreter.
pub(crate) fn check_opencl(graph: &Graph, inputs: &[Tensor], schedule: Option<&str>, tol: f64) {
    let options = Options {
        target: TargetKind::Opencl,
        cache: false,
        gpu_schedule: schedule.map(|s| s.parse().expect("a GPU schedule")),
        ..Options::default()
    };
    let exe = kiln_compiler::jit(graph, &options, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("compile or load failed ({schedule:?}): {e}"));
    let got = exe.run(inputs).unwrap_or_else(|e| panic!("run failed ({schedule:?}): {e}"));
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "output {i} type");
        for (j, (a, b)) in g.to_f64s().iter().zip(w.to_f64s()).enumerate() {
            let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
            assert!(ok, "{schedule:?}: output {i} element {j}: compiled {a}, interpreter {b}");
        }
    }
}

/// Graphs that exercise each schedule: a matmul with an epilogue and a padded convolution
/// (contraction), a long softmax and a long sum (reduction), pooling and elementwise (parallel).
fn schedule_graphs() -> Vec<(&'static str, Graph, Vec<Tensor>)> {
    let mut out = Vec::new();
    {
        let g = GraphBuilder::new("matmul_bias_relu");
        let x = g.input("x", DType::F32, [64, 96]);
        let w = g.constant("w", Tensor::random(DType::F32, &[96, 80], 1));
        let b = g.constant("b", Tensor::random(DType::F32, &[80], 2));
        g.output("y", x.matmul(w).add(b).relu());
        out.push(("matmul", g.build().unwrap(), vec![Tensor::random(DType::F32, &[64, 96], 3)]));
    }
    {
        let g = GraphBuilder::new("conv_pool");
        let x = g.input("x", DType::F32, [2, 8, 20, 20]);
        let w = g.constant("w", Tensor::random(DType::F32, &[16, 8, 3, 3], 4));
        let b = g.constant("b", Tensor::random(DType::F32, &[16], 5));
        g.output("y", x.conv(w, Some(b), ConvOptions::default().pad(1)).relu().max_pool(2, 2, 0));
        out.push((
            "conv",
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &[2, 8, 20, 20], 6)],
        ));
    }
    {
        let g = GraphBuilder::new("softmax_sum");
        let x = g.input("x", DType::F32, [12, 640]);
        g.output("p", x.softmax(-1));
        g.output("s", x.reduce_sum(&[1], false));
        out.push((
            "reductions",
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &[12, 640], 7)],
        ));
    }
    {
        let g = GraphBuilder::new("sum_rows");
        let x = g.input("x", DType::F32, [6, 1000]);
        g.output("s", x.tanh().reduce_sum(&[1], false).sigmoid());
        out.push(("row sums", g.build().unwrap(), vec![Tensor::random(DType::F32, &[6, 1000], 8)]));
    }
    out
}

#[test]
fn opencl_every_schedule_matches_the_interpreter() {
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the OpenCL path was not checked");
    }
    for (what, graph, inputs) in schedule_graphs() {
        for schedule in
            [None, Some("parallel"), Some("reduction"), Some("contraction"), Some("per-op")]
        {
            eprintln!("{what}: schedule {schedule:?}");
            check_opencl(&graph, &inputs, schedule, 1e-4);
        }
    }
}

#[test]
fn opencl_models_match_the_interpreter() {
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the OpenCL path was not checked");
    }
    check_opencl(
        &models::mlp(4, 32, 64, 10, 1).unwrap(),
        &[Tensor::random(DType::F32, &[4, 32], 2)],
        None,
        1e-4,
    );
    check_opencl(
        &models::cifarnet(4, 0).unwrap(),
        &[Tensor::random(DType::F32, &[4, 3, 32, 32], 42)],
        None,
        1e-4,
    );
}

/// The schedule each kernel of the CIFAR-10 CNN gets, and its launches: a change here is a change
/// in the code every GPU runs.
#[test]
fn gpu_launch_plans_snapshot() {
    let g = models::cifarnet(4, 0).unwrap();
    let options = Options { target: TargetKind::Opencl, cache: false, ..Options::default() };
    let stages = kiln_compiler::compile(&g, &options, true).expect("compiles").stages;
    let plans: Vec<&str> =
        stages[kiln_compiler::Stage::Lowered].lines().filter(|l| l.starts_with("//")).collect();
    insta::assert_snapshot!("cifarnet_gpu_plans", plans.join("\n"));
}

/// Convolutions of one image with padding: a 3x3 and a depthwise 3x3/2, as in every CNN. Unit
/// dimensions folded, their padding could not be fused, and they fell back to per-op grids whose
/// padding copy ran on one GPU thread (resnet18 took 115 ms on an H200).
fn padded_convolutions() -> Graph {
    let g = GraphBuilder::new("padded_convolutions");
    let x = g.input("x", DType::F32, [1, 16, 24, 24]);
    let w = g.constant("w", Tensor::random(DType::F32, &[32, 16, 3, 3], 11));
    let b = g.constant("b", Tensor::random(DType::F32, &[32], 12));
    let y = x.conv(w, Some(b), ConvOptions::default().pad(1)).relu();
    let dw = g.constant("dw", Tensor::random(DType::F32, &[32, 1, 3, 3], 13));
    let db = g.constant("db", Tensor::random(DType::F32, &[32], 14));
    g.output("y", y.conv(dw, Some(db), ConvOptions::default().pad(1).stride(2).group(32)).relu());
    g.build().unwrap()
}

/// Padded convolutions get fused schedules, and every launch (the padding's fill and copy
/// included) is spread over blocks and threads.
#[test]
fn padded_convolutions_are_spread_over_threads() {
    let g = padded_convolutions();
    let options = Options { target: TargetKind::Opencl, cache: false, ..Options::default() };
    let stages = kiln_compiler::compile(&g, &options, true).expect("compiles").stages;
    let plans: Vec<&str> =
        stages[kiln_compiler::Stage::Lowered].lines().filter(|l| l.starts_with("//")).collect();
    for line in &plans {
        assert!(!line.contains("per-op"), "a padded convolution fell back to per-op: {line}");
        assert!(
            !line.contains("grid [1, 1, 1] block [1, 1, 1]"),
            "a launch runs on one thread: {line}"
        );
    }
    insta::assert_snapshot!("padded_convolutions_gpu_plans", plans.join("\n"));
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the padded convolutions were not run");
    }
    check_opencl(&g, &[Tensor::random(DType::F32, &[1, 16, 24, 24], 15)], None, 1e-4);
}

/// bf16 on OpenCL: SPIR-V 1.0 has none, so kernels keep its bits in i16 (rounding to nearest
/// even when they make one); casts both ways and a bf16 result of arithmetic match the
/// interpreter.
#[test]
fn bf16_runs_on_opencl_as_16_bit_integers() {
    if !have(Target::Opencl) {
        return skipped("no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); bf16 on OpenCL was not run");
    }
    let g = GraphBuilder::new("bf16");
    let x = g.input("x", DType::F32, [64]);
    let h = g.input("h", DType::BF16, [64]);
    g.output("to_bf16", x.cast(DType::BF16));
    g.output("from_bf16", h.cast(DType::F32));
    g.output("sum", h.add(x.cast(DType::BF16)));
    let g = g.build().unwrap();
    let x = Tensor::random(DType::F32, &[64], 21);
    let h = Tensor::random(DType::BF16, &[64], 22);
    check_opencl(&g, &[x, h], None, 0.0);
}

/// Shared-memory arrays are declared 16-byte aligned in PTX: NVPTX combines their accesses into
/// `ld.shared.v4`, and an array declared `.align 4` that happened to start at an odd word faulted
/// with a misaligned address on an H200.
#[test]
fn ptx_shared_memory_is_aligned_for_vector_accesses() {
    if kiln_compiler::backend::gpu::ptx::libdevice().is_none() {
        return skipped("CUDA's libdevice not found; the PTX was not built");
    }
    let options = Options { target: TargetKind::Cuda, cache: false, ..Options::default() };
    let stages =
        kiln_compiler::compile(&padded_convolutions(), &options, true).expect("compiles").stages;
    let ptx = &stages[kiln_compiler::Stage::Ptx];
    let shared: Vec<&str> = ptx.lines().filter(|l| l.trim_start().starts_with(".shared")).collect();
    assert!(!shared.is_empty(), "the contraction schedule uses no shared memory:\n{ptx}");
    for line in shared {
        assert!(line.contains(".align 16"), "shared memory not 16-byte aligned: {line}");
    }
}

/// PTX for sm_80 and sm_90 that NVIDIA's assembler accepts.
#[test]
fn ptx_passes_ptxas() {
    let ptxas = std::process::Command::new("ptxas").arg("--version").output();
    if !ptxas.is_ok_and(|o| o.status.success()) {
        return skipped("ptxas not installed (scripts/setup-cuda-tools.sh installs Debian's nvidia-cuda-toolkit); the PTX was not assembled");
    }
    if kiln_compiler::backend::gpu::ptx::libdevice().is_none() {
        return skipped("CUDA's libdevice not found; the PTX was not built");
    }
    let dir = std::env::temp_dir().join(format!("kiln-ptx-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let graphs = [
        ("mlp", models::mlp(4, 32, 64, 10, 1).unwrap()),
        ("cifarnet", models::cifarnet(4, 0).unwrap()),
        ("padded convolutions", padded_convolutions()),
    ];
    for (name, g) in graphs
        .iter()
        .chain(schedule_graphs().iter().map(|(n, g, _)| (*n, g.clone())).collect::<Vec<_>>().iter())
    {
        for arch in ["sm_80", "sm_90"] {
            let mut options =
                Options { target: TargetKind::Cuda, cache: false, ..Options::default() };
            options.ptx.arch = arch.to_string();
            let stages = kiln_compiler::compile(g, &options, true)
                .unwrap_or_else(|e| panic!("{name} for {arch}: {e}"))
                .stages;
            let file = dir.join(format!("{}_{arch}.ptx", name.replace(' ', "_")));
            std::fs::write(&file, &stages[kiln_compiler::Stage::Ptx]).unwrap();
            let out = std::process::Command::new("ptxas")
                .arg(format!("-arch={arch}"))
                .arg(&file)
                .arg("-o")
                .arg(dir.join("out.cubin"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ptxas rejects {name} for {arch}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a CUDA GPU, loading CUDA code is an error that says so (cudarc would panic if asked
/// blindly).
#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if have(Target::Cuda) {
        return skipped("a CUDA GPU is present; the missing-GPU error was not exercised");
    }
    let g = models::mlp(2, 8, 16, 4, 1).unwrap();
    let options = Options { target: TargetKind::Cuda, cache: false, ..Options::default() };
    match kiln_compiler::jit(&g, &options, &LoadOptions::default()) {
        Ok(_) => panic!("loading CUDA code without a GPU succeeded"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("cuda") || msg.contains("CUDA"), "unclear error: {msg}");
        }
    }
}

/// The SPIR-V kiln makes is valid for OpenCL, by Khronos' validator.
#[test]
fn spirv_passes_the_validator() {
    let val = std::process::Command::new("spirv-val").arg("--version").output();
    if !val.is_ok_and(|o| o.status.success()) {
        return skipped("spirv-val not installed (Debian: spirv-tools, which scripts/setup.sh installs); the SPIR-V was not validated");
    }
    let dir = std::env::temp_dir().join(format!("kiln-spirv-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut graphs = vec![
        ("mlp", models::mlp(4, 32, 64, 10, 1).unwrap()),
        ("cifarnet", models::cifarnet(4, 0).unwrap()),
        ("padded convolutions", padded_convolutions()),
    ];
    graphs.extend(schedule_graphs().into_iter().map(|(n, g, _)| (n, g)));
    for (name, g) in &graphs {
        let options = Options { target: TargetKind::Opencl, cache: false, ..Options::default() };
        let art = kiln_compiler::compile(g, &options, false)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .artifact;
        let file = dir.join(format!("{}.spv", name.replace(' ', "_")));
        std::fs::write(&file, art.blob(art.manifest.code).unwrap()).unwrap();
        let out = std::process::Command::new("spirv-val")
            .args(["--target-env", "opencl1.2"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "spirv-val rejects {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every op of the elementwise tables on OpenCL, against the interpreter.
#[test]
fn every_elementwise_op_on_opencl() {
    if !have(Target::Opencl) {
        return skipped("no usable OpenCL device: the elementwise table was not checked on OpenCL");
    }
    let (g, inputs) = crate::compile::every_elementwise_op();
    check_opencl(&g, &inputs, None, 1e-4);
}
