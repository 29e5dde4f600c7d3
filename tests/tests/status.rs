//! Kernels that cannot finish fail the run, naming the kernel (its node and op), through the
//! run's status word: indices outside their axis in Gather, GatherElements, GatherND,
//! ScatterElements and ScatterND (CPU, its Gather microkernel, OpenCL), scratch a C kernel
//! cannot allocate and MLIR temporaries the system refuses (the LRN of 2^31 + 1 channels that
//! segfaulted). The allocation failures run in a child process of this binary: one with
//! `KILN_TEST_FAIL_ALLOC` (the kernels' test-only refusal) set, one under `ulimit -v`.

use std::process::Command;

use kiln_compiler::{Options, TargetKind};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::op::{Lrn, ScatterReduction};
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::artifact::BufferKind;
use kiln_runtime::{LoadOptions, Target};

use crate::gpu::{have, skipped};

fn i64s(dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_vec(dims, v).unwrap()
}

fn i32s(dims: &[usize], v: Vec<i32>) -> Tensor {
    Tensor::from_vec(dims, v).unwrap()
}

/// One node named `pick` on graph inputs (data, indices[, updates]).
struct Case {
    op: Op,
    inputs: Vec<Tensor>,
    /// Indices inside their axes (negative ones among them), then ones past each end.
    good: Tensor,
    bad: Vec<Tensor>,
}

impl Case {
    fn graph(&self) -> Graph {
        let mut g = Graph::new("status");
        let mut operands = Vec::new();
        for (i, t) in self.inputs.iter().enumerate() {
            let name = ["x", "indices", "updates"][i];
            let ty = kiln_ir::TensorType::new(t.dtype(), t.dims());
            operands.push(Some(g.add_input(name, ty).unwrap()));
        }
        let id = g.add_node("pick", self.op.clone(), &operands).unwrap();
        g.add_output("y", kiln_ir::ValueId::new(id, 0)).unwrap();
        g
    }

    /// The inputs with `indices` in the indices' place.
    fn with(&self, indices: &Tensor) -> Vec<Tensor> {
        let mut inputs = self.inputs.clone();
        inputs[1] = indices.clone();
        inputs
    }
}

/// Every op that reads indices from data, with in-range indices (negative ones included) and
/// indices one past either end of an axis.
fn cases() -> Vec<Case> {
    let f32s = |dims: &[usize], seed| Tensor::random(DType::F32, dims, seed);
    vec![
        Case {
            op: Op::Gather { axis: 0 },
            inputs: vec![f32s(&[40, 24], 1), i64s(&[2, 3], vec![0; 6])],
            good: i64s(&[2, 3], vec![0, 39, -1, -40, 7, 20]),
            bad: vec![
                i64s(&[2, 3], vec![0, 40, 1, 2, 3, 4]),
                i64s(&[2, 3], vec![-41, 0, 0, 0, 0, 0]),
            ],
        },
        Case {
            op: Op::Gather { axis: 1 },
            inputs: vec![f32s(&[4, 9, 5], 2), i32s(&[4], vec![0; 4])],
            good: i32s(&[4], vec![8, -9, 3, -2]),
            bad: vec![i32s(&[4], vec![8, 9, 3, 2])],
        },
        Case {
            op: Op::GatherElements { axis: 1 },
            inputs: vec![f32s(&[3, 10], 3), i64s(&[3, 4], vec![0; 12])],
            good: i64s(&[3, 4], vec![0, 9, -10, -1, 5, 5, 2, 3, 1, -3, 4, 8]),
            bad: vec![i64s(&[3, 4], vec![0, 9, -11, -1, 5, 5, 2, 3, 1, -3, 4, 8])],
        },
        Case {
            op: Op::GatherNd { batch_dims: 0 },
            inputs: vec![f32s(&[5, 6, 8], 4), i64s(&[4, 2], vec![0; 8])],
            good: i64s(&[4, 2], vec![4, 5, -5, -6, 0, 3, 2, -1]),
            // The second position of a tuple addresses the axis of 6.
            bad: vec![i64s(&[4, 2], vec![4, 6, 0, 0, 0, 0, 0, 0])],
        },
        Case {
            op: Op::ScatterElements { axis: 0, reduction: ScatterReduction::Add },
            inputs: vec![f32s(&[8, 5], 5), i64s(&[3, 5], vec![0; 15]), f32s(&[3, 5], 6)],
            good: i64s(&[3, 5], (0..15).map(|i| (i % 16) - 8).collect()),
            bad: vec![i64s(&[3, 5], (0..15).map(|i| if i == 14 { 8 } else { 0 }).collect())],
        },
        Case {
            op: Op::ScatterNd { reduction: ScatterReduction::None },
            inputs: vec![f32s(&[6, 4], 7), i64s(&[3, 1], vec![0; 3]), f32s(&[3, 4], 8)],
            good: i64s(&[3, 1], vec![5, -6, 2]),
            bad: vec![i64s(&[3, 1], vec![5, -7, 2])],
        },
    ]
}

/// `case` compiled with `options`, run with good indices (against the interpreter) and bad ones
/// (an error naming the node), then good ones again: the word is reset between runs.
fn check_case(case: &Case, options: &Options, threads: usize) {
    let g = case.graph();
    let exe = kiln_compiler::jit(
        &g,
        options,
        &LoadOptions { threads: Some(threads), ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("{:?} compiles: {e}", case.op));
    let good = case.with(&case.good);
    let want = eval::run(&g, &good).expect("the interpreter runs it");
    for bad in &case.bad {
        assert!(eval::run(&g, &case.with(bad)).is_err(), "the interpreter refuses {bad:?}");
        let e = exe.run(&case.with(bad)).expect_err("out-of-range indices fail the run");
        let e = e.to_string();
        let op = case.op.name();
        assert!(
            e.contains(&format!("kernel `pick: {op}`")) && e.contains("an index is out of range"),
            "{op}: {e}"
        );
        let got = exe.run(&good).unwrap_or_else(|e| panic!("{op} with good indices: {e}"));
        assert_eq!(got[0].to_f64s(), want[0].to_f64s(), "{op} ({threads} threads)");
    }
}

#[test]
fn indices_out_of_range_fail_the_run_naming_the_node_on_the_cpu() {
    let options = Options { cache: false, ..Options::default() };
    for case in cases() {
        for threads in [1, 2] {
            check_case(&case, &options, threads);
        }
    }
}

#[test]
fn the_cpu_gather_microkernel_checks_its_indices() {
    // Rows of 256 bytes, copied whole by `kiln_uk_gather_rows` (forced on), in 4 work units.
    let n = 2000;
    let good: Vec<i64> = (0..n as i64).map(|i| (i * 37) % 128 - 64).collect();
    let mut bad = good.clone();
    bad[1500] = 64;
    let case = Case {
        op: Op::Gather { axis: 0 },
        inputs: vec![Tensor::random(DType::F32, &[64, 64], 9), i64s(&[n], vec![0; n])],
        good: i64s(&[n], good),
        bad: vec![i64s(&[n], bad)],
    };
    let options = Options {
        cache: false,
        microkernel: Some(true),
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    };
    let stages = kiln_compiler::compile(&case.graph(), &options, true).expect("compiles").stages;
    let schedule = stages[kiln_compiler::Stage::Schedule].to_string();
    assert!(schedule.contains("microkernel: gather"), "{schedule}");
    for threads in [1, 2] {
        check_case(&case, &options, threads);
    }
}

#[test]
fn indices_out_of_range_fail_the_run_naming_the_node_on_opencl() {
    if !have(Target::Opencl) {
        return skipped(
            "no OpenCL device that builds SPIR-V (eval \"$(scripts/setup-opencl.sh)\")",
        );
    }
    let options = Options { target: TargetKind::Opencl, cache: false, ..Options::default() };
    for case in cases() {
        check_case(&case, &options, 1);
    }
}

/// Whether `g` compiled for `target` has a status word.
fn has_status_word(g: &Graph, target: TargetKind) -> bool {
    let options = Options { target, cache: false, ..Options::default() };
    let art = kiln_compiler::compile(g, &options, false).expect("compiles").artifact;
    art.manifest.buffers.iter().any(|b| b.kind == BufferKind::Status)
}

#[test]
fn constant_indices_are_checked_only_when_one_is_out_of_range() {
    let gather = |indices: Vec<i64>| {
        let g = GraphBuilder::new("c");
        let x = g.input("x", DType::F32, [10, 4]);
        let i = g.constant("i", i64s(&[3], indices));
        let y = g.apply(Op::Gather { axis: 0 }, &[Some(x), Some(i)], 1)[0];
        g.output("y", y.relu());
        g.build().unwrap()
    };
    let (inside, outside) = (gather(vec![9, -10, 0]), gather(vec![9, 10, 0]));
    // GPU kernels take the word only where they check (compiling needs no device).
    assert!(!has_status_word(&inside, TargetKind::Opencl));
    assert!(has_status_word(&outside, TargetKind::Opencl));
    let x = Tensor::random(DType::F32, &[10, 4], 1);
    let load = LoadOptions::default();
    let options = Options { cache: false, ..Options::default() };
    let exe = kiln_compiler::jit(&outside, &options, &load).expect("compiles");
    let e = exe.run(std::slice::from_ref(&x)).expect_err("a constant index out of range");
    assert!(e.to_string().contains("an index is out of range"), "{e}");
    let exe = kiln_compiler::jit(&inside, &options, &load).expect("compiles");
    let got = exe.run(std::slice::from_ref(&x)).expect("in range");
    assert_eq!(got[0].to_f64s(), eval::run(&inside, &[x]).unwrap()[0].to_f64s());
}

/// Runs this binary's test `name` again in a child process with `env` set, through `sh -c
/// shell` when given (which must end by running `"$0" "$@"`), and checks that it passed.
pub(crate) fn run_in_child(name: &str, env: (&str, &str), shell: Option<&str>) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let args = [name, "--exact", "--test-threads=1", "--nocapture"];
    let mut cmd = match shell {
        Some(script) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(script).arg(&exe).args(args);
            c
        }
        None => {
            let mut c = Command::new(&exe);
            c.args(args);
            c
        }
    };
    let out = cmd.env(env.0, env.1).output().expect("the test binary runs again");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} in a child process ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "{name} did not run in the child:\n{text}");
}

/// The error of running `g` (compiled for the CPU with `options`) on `inputs`, twice over with
/// 2 threads: no run waits for a workgroup that returned early.
fn run_error(g: &Graph, options: &Options, inputs: &[Tensor]) -> String {
    let exe =
        kiln_compiler::jit(g, options, &LoadOptions { threads: Some(2), ..Default::default() })
            .expect("compiles");
    let first = exe.run(inputs).expect_err("the run fails").to_string();
    let again = exe.run(inputs).expect_err("the run fails again").to_string();
    assert_eq!(first, again);
    first
}

#[test]
fn allocations_the_system_refuses_fail_the_run_naming_the_kernel() {
    if std::env::var_os("KILN_TEST_FAIL_ALLOC").is_none() {
        // Every allocation the kernels make is refused in the child (test only).
        return run_in_child(
            "status::allocations_the_system_refuses_fail_the_run_naming_the_kernel",
            ("KILN_TEST_FAIL_ALLOC", "1"),
            None,
        );
    }
    // A C kernel's scratch: the microkernel's convolution packs its input there.
    let g = GraphBuilder::new("conv");
    let x = g.input("x", DType::F32, [2, 8, 12, 12]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, 8, 3, 3], 1));
    g.output("y", x.conv(w, None, ConvOptions { pad: 1, ..ConvOptions::default() }));
    let g = g.build().unwrap();
    let forced = Options {
        cache: false,
        microkernel: Some(true),
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    };
    let e = run_error(&g, &forced, &[Tensor::random(DType::F32, &[2, 8, 12, 12], 2)]);
    assert!(e.contains(": Conv`") && e.contains("cannot allocate"), "{e}");
    // An MLIR temporary: LRN's zero-padded copy of its input.
    let mut g = Graph::new("lrn");
    let x = g.add_input("x", kiln_ir::TensorType::new(DType::F32, [1, 6, 5, 5])).unwrap();
    let lrn = Lrn { alpha: 1e-4, beta: 0.75, bias: 1.0, size: 3 };
    let id = g.add_node("norm", Op::Lrn(lrn), &[Some(x)]).unwrap();
    g.add_output("y", kiln_ir::ValueId::new(id, 0)).unwrap();
    let options = Options { cache: false, ..Options::default() };
    let e = run_error(&g, &options, &[Tensor::random(DType::F32, &[1, 6, 5, 5], 3)]);
    assert!(e.starts_with("kernel `norm: LRN`: cannot allocate"), "{e}");
}

#[test]
fn an_lrn_whose_temporary_cannot_be_allocated_is_an_error_not_a_crash() {
    if std::env::var_os("KILN_TEST_MEMORY_LIMITED").is_none() {
        // 16 GiB of address space: the padded copy of 2^31 + 4 channels (512 GiB) cannot be
        // had, whatever the system's overcommit policy.
        return run_in_child(
            "status::an_lrn_whose_temporary_cannot_be_allocated_is_an_error_not_a_crash",
            ("KILN_TEST_MEMORY_LIMITED", "1"),
            Some("ulimit -v 16777216 && exec \"$0\" \"$@\""),
        );
    }
    let mut g = Graph::new("lrn");
    let x = g.add_input("x", kiln_ir::TensorType::new(DType::F32, [1, 4, 8, 8])).unwrap();
    let lrn = Lrn { alpha: 1e-4, beta: 0.75, bias: 1.0, size: (1 << 31) + 1 };
    let id = g.add_node("norm", Op::Lrn(lrn), &[Some(x)]).unwrap();
    g.add_output("y", kiln_ir::ValueId::new(id, 0)).unwrap();
    let options = Options { cache: false, ..Options::default() };
    // Its temporary's size is static: the load counts it and refuses it, naming the kernel.
    let e = kiln_compiler::jit(&g, &options, &LoadOptions::default()).err().expect("refused");
    assert!(e.to_string().contains("kernel `norm: LRN` asks"), "{e}");
    // With a budget that lets it load, the system refuses it at run time.
    let unbounded = LoadOptions { max_memory: Some(u64::MAX), ..Default::default() };
    let exe = kiln_compiler::jit(&g, &options, &unbounded).expect("compiles");
    let e = exe.run(&[Tensor::random(DType::F32, &[1, 4, 8, 8], 1)]).expect_err("fails");
    assert!(e.to_string().starts_with("kernel `norm: LRN`: cannot allocate"), "{e}");
    // What the run allocated before the refusal was freed: the next one fails the same way.
    let again = exe.run(&[Tensor::random(DType::F32, &[1, 4, 8, 8], 1)]).expect_err("fails");
    assert_eq!(again.to_string(), e.to_string());
}

/// A transposed convolution whose columns (`kiln_uk_conv_transpose`'s scratch, per chunk of
/// output channels) are 16 times its input and 512 times its weights: 8 MiB a chunk. A 1 MiB
/// model of this kind held 1.16 GB under `--max-memory 64M`.
fn wide_conv_transpose() -> (Graph, Vec<Tensor>) {
    use kiln_ir::op::{AutoPad, ConvTranspose, Window};
    let g = GraphBuilder::new("convt");
    let x = g.input("x", DType::F32, [1, 8, 64, 64]);
    let w = g.constant("w", Tensor::random(DType::F32, &[8, 8, 16, 16], 1));
    let window = Window {
        strides: vec![2, 2],
        dilations: vec![1, 1],
        pads: vec![0; 4],
        auto_pad: AutoPad::NotSet,
    };
    let op = Op::ConvTranspose(ConvTranspose {
        window,
        group: 1,
        output_padding: vec![],
        output_shape: vec![],
    });
    let y = g.apply(op, &[Some(x), Some(w)], 1)[0];
    g.output("y", y);
    (g.build().unwrap(), vec![Tensor::random(DType::F32, &[1, 8, 64, 64], 2)])
}

/// The budget the artifact needs at `threads` threads, without its kernels' scratch and with it.
fn needs(art: &kiln_runtime::Artifact, threads: usize) -> (u64, u64) {
    let mut bare = art.manifest.clone();
    bare.scratch = None;
    let without = kiln_runtime::Executable::memory_needed(&bare, threads).unwrap();
    (without, kiln_runtime::Executable::memory_needed(&art.manifest, threads).unwrap())
}

#[test]
fn kernel_scratch_is_counted_at_load_and_capped_at_run_time() {
    let (g, inputs) = wide_conv_transpose();
    let options = Options { cache: false, ..Options::default() };
    let art = kiln_compiler::compile(&g, &options, false).expect("compiles").artifact;
    let want = eval::run(&g, &inputs).unwrap();
    for threads in [1, 2] {
        let (without, with) = needs(&art, threads);
        let scratch = art.manifest.scratch.as_ref().expect("bounded at compile time");
        assert_eq!(
            with - without,
            kiln_runtime::memory::scratch_bytes(scratch, threads).unwrap(),
            "memory_needed counts the kernels' scratch at {threads} threads"
        );
        assert!(with - without > 8 << 20, "the columns of a chunk: {} bytes", with - without);
        let load = |max: u64| LoadOptions {
            threads: Some(threads),
            max_memory: Some(max),
            ..Default::default()
        };
        // Refused at load naming the kernel, under what it needs...
        let e = kiln_runtime::Executable::load(art.clone(), &load(with - 1))
            .err()
            .expect("refused at load")
            .to_string();
        assert!(
            e.starts_with("`convt` (its constants, scratch arena, outputs and kernel scratch at ")
                && e.contains("kernel `convtranspose: ConvTranspose` asks"),
            "{e}"
        );
        // ... and runs with it, holding no more than the bound.
        let exe = kiln_runtime::Executable::load(art.clone(), &load(with)).expect("loads");
        let got = exe.run(&inputs).expect("runs");
        assert!(got[0].to_f64s().iter().zip(want[0].to_f64s()).all(|(a, b)| (a - b).abs() <= 1e-3));
        crate::microkernel::assert_scratch_bounded(&exe, threads);
        assert!(exe.kernel_scratch_peak() > 8 << 20, "{}", exe.kernel_scratch_peak());
        // Where the bound is not known (an artifact written before it), the load cannot count
        // it: the run-time cap holds the budget, failing the run naming the kernel.
        let mut unknown = art.clone();
        unknown.manifest.scratch = None;
        let exe = kiln_runtime::Executable::load(unknown, &load(without + (1 << 20)))
            .expect("the rest fits");
        assert_eq!(exe.kernel_scratch_limit(), 1 << 20);
        for _ in 0..2 {
            let e = exe.run(&inputs).expect_err("over the budget").to_string();
            assert!(
                e.starts_with("kernel `convtranspose: ConvTranspose`: cannot allocate ")
                    && e.ends_with("of scratch: the kernels' scratch would pass the 1048576 bytes (1.0 MiB) the memory budget leaves after the load (the memory available, or --max-memory / LoadOptions::max_memory)"),
                "{e}"
            );
        }
        assert!(exe.kernel_scratch_peak() <= 1 << 20);
    }
}

/// MLIR's temporaries (a linalg kernel's padded copy) are bounded from the module, and every
/// kind of kernel holds no more than its bound: attention (its own C file), a linalg LRN, an
/// elementwise kernel that holds nothing.
#[test]
fn kernel_scratch_bounds_hold_for_temporaries_and_attention() {
    let options = Options { cache: false, ..Options::default() };
    let mut graphs = Vec::new();
    let mut g = Graph::new("lrn");
    let x = g.add_input("x", kiln_ir::TensorType::new(DType::F32, [1, 6, 5, 5])).unwrap();
    let lrn = Lrn { alpha: 1e-4, beta: 0.75, bias: 1.0, size: 3 };
    let id = g.add_node("norm", Op::Lrn(lrn), &[Some(x)]).unwrap();
    g.add_output("y", kiln_ir::ValueId::new(id, 0)).unwrap();
    graphs.push((g, vec![Tensor::random(DType::F32, &[1, 6, 5, 5], 3)], true));
    // Attention on the heads of one projection (recognised into one op, `attention.c`).
    let (b, s, h, d) = (2i64, 37i64, 4i64, 16i64);
    let gb = GraphBuilder::new("gpt");
    let qkv = gb.input("qkv", DType::F32, [b as usize, s as usize, (3 * h * d) as usize]);
    let parts = qkv.split(-1, &[h * d; 3]);
    let heads = |i: usize, keys: bool| {
        parts[i].reshape(&[b, s, h, d]).transpose(if keys { &[0, 2, 3, 1] } else { &[0, 2, 1, 3] })
    };
    let (q, k, v) = (heads(0, false), heads(1, true), heads(2, false));
    let scores = q.matmul(k) / q.scalar((d as f64).sqrt());
    gb.output("y", scores.softmax(-1).matmul(v).transpose(&[0, 2, 1, 3]).reshape(&[b, s, h * d]));
    let inputs =
        vec![Tensor::random(DType::F32, &[b as usize, s as usize, (3 * h * d) as usize], 4)];
    graphs.push((gb.build().unwrap(), inputs, true));
    let gb = GraphBuilder::new("add");
    let x = gb.input("x", DType::F32, [64, 64]);
    gb.output("y", (x + x).relu());
    graphs.push((gb.build().unwrap(), vec![Tensor::random(DType::F32, &[64, 64], 5)], false));
    for (g, inputs, holds) in graphs {
        let schedule = kiln_compiler::driver::emit(&g, kiln_compiler::Stage::Schedule, &options)
            .expect("compiles");
        for threads in [1, 2] {
            let exe = kiln_compiler::jit(
                &g,
                &options,
                &LoadOptions { threads: Some(threads), ..Default::default() },
            )
            .expect("compiles");
            let want = eval::run(&g, &inputs).unwrap();
            let got = exe.run(&inputs).expect("runs");
            for (a, b) in got[0].to_f64s().iter().zip(want[0].to_f64s()) {
                assert!((a - b).abs() <= 1e-4 + 1e-4 * b.abs(), "`{}`: {a} for {b}", g.name);
            }
            crate::microkernel::assert_scratch_bounded(&exe, threads);
            assert_eq!(exe.kernel_scratch_peak() > 0, holds, "`{}`:\n{schedule}", g.name);
        }
    }
}
