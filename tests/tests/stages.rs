//! Snapshots of each stage's text for small models: the graph after passes, the fused kernels,
//! the MLIR kiln generates, and LLVM IR (for a scalar model, with the host CPU's name and
//! features filtered out, so the snapshot does not depend on the machine).

use kiln_compiler::{compile, Options, Stage};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{DType, Graph, Tensor};

fn tiny_mlp() -> Graph {
    let g = GraphBuilder::new("tiny");
    let x = g.input("x", DType::F32, [2, 3]);
    let w = g.constant("w", Tensor::from_vec(&[3, 2], vec![1f32, -1., 0.5, 2., -0.5, 1.]).unwrap());
    let b = g.constant("b", Tensor::vector(&[0.25f32, -0.25]));
    let h = (x.matmul(w).named("fc") + b).relu().named("act");
    // A reshape is a view: no kernel.
    let flat = h.reshape(&[4]).named("flat");
    g.output("y", flat.reduce_sum(&[0], false).named("total"));
    g.build().unwrap()
}

fn stages(graph: &Graph) -> kiln_compiler::Stages {
    compile(graph, &Options { cache: false, ..Options::default() }, true)
        .expect("the model compiles")
        .stages
}

#[test]
fn graph_fused_and_mlir_stages_are_stable() {
    let s = stages(&tiny_mlp());
    insta::assert_snapshot!("tiny_graph", s[Stage::Graph]);
    insta::assert_snapshot!("tiny_fused", s[Stage::Fused]);
    insta::assert_snapshot!("tiny_mlir", s[Stage::Mlir]);
}

#[test]
fn llvm_stage_is_stable() {
    let g = GraphBuilder::new("scalar");
    let x = g.input("x", DType::F32, Vec::<usize>::new());
    g.output("y", (x * x.scalar(3.0)).relu());
    let s = stages(&g.build().unwrap());
    insta::with_settings!({filters => vec![
        (r#""target-cpu"="[^"]*""#, "\"target-cpu\"=\"[cpu]\""),
        (r#""target-features"="[^"]*""#, "\"target-features\"=\"[features]\""),
        (r#""tune-cpu"="[^"]*""#, "\"tune-cpu\"=\"[cpu]\""),
        (r#"target datalayout = "[^"]*""#, "target datalayout = \"[layout]\""),
        (r#"target triple = "[^"]*""#, "target triple = \"[triple]\""),
    ]}, {
        insta::assert_snapshot!("scalar_llvm", s[Stage::Llvm]);
    });
    assert!(s[Stage::Asm].contains("k0_"), "assembly names the kernel");
    assert!(!s[Stage::Lowered].contains("linalg."), "the lowered stage is all LLVM dialect");
}

/// Slices, Splits and one-index Gathers whose results are contiguous bytes of their input are
/// views at an offset on the CPU: no kernel copies them, the kernels after them read the input
/// where it lies. Slices of rows of every channel, a strided slice and a channel slice of a batch
/// of two stay copies.
#[test]
fn contiguous_slices_are_views_at_offsets() {
    let g = GraphBuilder::new("views");
    let x = g.input("x", DType::F32, [1, 8, 6, 6]);
    let r = x.relu().named("r");
    let halves = r.split(1, &[3, 5]);
    let w = g.constant("w", Tensor::random(DType::F32, &[4, 3, 3, 3], 2));
    let c = halves[0].conv(w, None, kiln_ir::builder::ConvOptions::default().pad(1)).named("conv");
    g.output("conv", c);
    g.output("upper", halves[1]);
    let channels = r.slice(&[2], &[5], &[1], &[1]).named("channels");
    g.output("channels", channels.neg());
    let rows = r.slice(&[2], &[5], &[2], &[1]).named("rows");
    g.output("rows", rows.neg());
    let strided = r.slice(&[0], &[6], &[3], &[2]).named("strided");
    g.output("strided", strided.neg());
    let y = g.input("y", DType::F32, [2, 4, 5]);
    g.output("batch_slice", y.slice(&[1], &[3], &[1], &[1]).named("batch_channels").neg());
    let qkv = g.input("qkv", DType::F32, [3, 2, 4, 4]);
    let pick = |i: i64| qkv.gather(g.constant(&format!("i{i}"), Tensor::scalar(i)), 0);
    g.output("scores", pick(0).matmul(pick(-1)));
    let graph = g.build().unwrap();
    let s = stages(&graph);
    insta::assert_snapshot!("views_fused", s[Stage::Fused]);
    let inputs = [
        Tensor::random(DType::F32, &[1, 8, 6, 6], 1),
        Tensor::random(DType::F32, &[2, 4, 5], 3),
        Tensor::random(DType::F32, &[3, 2, 4, 4], 4),
    ];
    crate::compile::check_against_eval(&graph, &inputs, 2, 1e-4);
}

/// On the CPU, a Concat of one image's parts, each written by another kernel, has no kernel:
/// the parts are views of its result, so the convolutions write where the Concat would have
/// copied them, and a part read elsewhere too is read there; parts that are views of one
/// result (a C2f block's Split halves) place that result whole. Not placed: a part that is a
/// graph input, a concat of a placed result, a batch of two, parts that would start
/// unaligned, and halves reversed or apart. Every output against the interpreter, at 1 and 2 threads.
#[test]
fn concat_parts_are_written_where_they_lie() {
    let g = GraphBuilder::new("concats");
    let x = g.input("x", DType::F32, [1, 8, 6, 6]);
    let w =
        |name: &str, dims: &[usize], seed| g.constant(name, Tensor::random(DType::F32, dims, seed));
    let o = kiln_ir::builder::ConvOptions::default;
    let s = x.conv(w("ws", &[4, 8, 1, 1], 1), None, o()).relu().named("squeeze");
    let e1 = s.conv(w("w1", &[16, 4, 1, 1], 2), None, o()).relu().named("expand1x1");
    let e3 = s.conv(w("w3", &[16, 4, 3, 3], 3), None, o().pad(1)).relu().named("expand3x3");
    let fire = g.concat(&[e1, e3], 1).named("fire");
    g.output("next", fire.conv(w("wn", &[8, 32, 1, 1], 4), None, o()).named("next"));
    g.output("expand1x1_again", e1.neg().named("again"));
    // (Reductions after the others, so that each Concat is a kernel of its own: an
    // elementwise op after it would join its kernel.)
    let nested = g.concat(&[fire, x.relu().named("r")], 1).named("nested");
    g.output("nested", nested.reduce_sum(&[1], true));
    let with_input = g.concat(&[x, x.neg().named("nx")], 1).named("with_input");
    g.output("with_input", with_input.reduce_sum(&[1], true));
    let y = g.input("y", DType::F32, [2, 4, 3, 3]);
    g.output("batch", g.concat(&[y.relu(), y.neg()], 1).named("batch").reduce_sum(&[1], true));
    let z = g.input("z", DType::F32, [1, 1, 3, 3]);
    let unaligned = g.concat(&[z.relu(), z.neg()], 1).named("unaligned");
    g.output("unaligned", unaligned.reduce_sum(&[1], true));
    // A C2f block: both halves of the first convolution's result (views of it) lead the
    // concat, so that result is placed whole; reversed, or split by another part, it is not.
    let cv1 = x.conv(w("wc", &[8, 8, 1, 1], 8), None, o()).named("cv1");
    let halves = cv1.split(1, &[4, 4]);
    let m = halves[1].conv(w("wm", &[4, 4, 3, 3], 9), None, o().pad(1)).relu().named("m");
    let c2f = g.concat(&[halves[0], halves[1], m], 1).named("c2f");
    g.output("c2f", c2f.conv(w("wc2", &[8, 12, 1, 1], 10), None, o()).named("cv2"));
    let cv3 = x.conv(w("w3b", &[8, 8, 1, 1], 11), None, o()).named("cv3");
    let h3 = cv3.split(1, &[4, 4]);
    let reversed = g.concat(&[h3[1], h3[0]], 1).named("reversed");
    g.output("reversed", reversed.reduce_sum(&[1], true));
    let cv4 = x.conv(w("w4", &[8, 8, 1, 1], 12), None, o()).named("cv4");
    let h4 = cv4.split(1, &[4, 4]);
    let between = g.concat(&[h4[0], m, h4[1]], 1).named("between");
    g.output("between", between.reduce_sum(&[1], true));
    let graph = g.build().unwrap();
    let s = stages(&graph);
    insta::assert_snapshot!("concat_views_fused", s[Stage::Fused]);
    let inputs = [
        Tensor::random(DType::F32, &[1, 8, 6, 6], 5),
        Tensor::random(DType::F32, &[2, 4, 3, 3], 6),
        Tensor::random(DType::F32, &[1, 1, 3, 3], 7),
    ];
    for threads in [1, 2] {
        crate::compile::check_against_eval(&graph, &inputs, threads, 1e-4);
    }
}

/// `emit --stage mlir` stops after codegen (no target pipeline, LLVM or linker) and prints what a
/// full compile keeps as the stage: with linalg kernels and with microkernel calls.
#[test]
fn the_mlir_stage_stops_after_codegen() {
    let g = tiny_mlp();
    for microkernel in [Some(false), Some(true)] {
        let o = Options {
            cache: false,
            microkernel,
            microkernel_overrides: Some(Default::default()),
            ..Options::default()
        };
        let emitted = kiln_compiler::driver::emit(&g, Stage::Mlir, &o).expect("emits");
        let kept = compile(&g, &o, true).expect("compiles").stages;
        assert_eq!(emitted, kept[Stage::Mlir], "microkernel {microkernel:?}");
        assert!(emitted.contains("func.func"), "{emitted}");
    }
}

/// One list of stages: names parse back, each dumped stage has its own file, and a stage of
/// another target is refused naming the target it needs.
#[test]
fn stages_are_one_list() {
    let mut files = std::collections::HashSet::new();
    for s in Stage::ALL {
        assert_eq!(s.name().parse::<Stage>(), Ok(s));
        if let Some(f) = s.file_name() {
            assert!(files.insert(f), "{f} twice");
        }
    }
    assert_eq!(
        "nope".parse::<Stage>().unwrap_err(),
        "there is no stage `nope`; the stages are passes, graph, fused, schedule, mlir, lowered, llvm, asm, ptx, spirv"
    );
    let o = Options { cache: false, ..Options::default() };
    let e = kiln_compiler::driver::emit(&tiny_mlp(), Stage::Ptx, &o).unwrap_err().to_string();
    assert_eq!(e, "stage ptx is the cuda target's code: compile for target cuda");
    let e = kiln_compiler::driver::emit(
        &tiny_mlp(),
        Stage::Llvm,
        &Options { target: kiln_compiler::TargetKind::Opencl, ..o },
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("stage llvm: the opencl target goes through SPIR-V"), "{e}");
}

/// A failed pipeline is a typed leaf (`LowerError`: which pipeline, what MLIR said) under the
/// kernel context, and the chain prints both.
#[test]
fn errors_chain_the_kernel_context_to_the_leaf() {
    let mlir = kiln_compiler::backend::MlirContext::new();
    let mut module = melior::ir::Module::new(melior::ir::Location::unknown(&mlir.ctx));
    let e = mlir.run_pipeline(&mut module, "builtin.module(no-such-pass)").unwrap_err();
    assert_eq!(e.pipeline, "no-such-pass");
    assert!(e.diagnostics.starts_with("it does not parse"), "{e}");
    let wrapped = kiln_compiler::CompileError::Codegen {
        kernel: "k0_x".into(),
        label: "x: Relu".into(),
        stage: "lower",
        source: kiln_compiler::KernelError::Lower(e),
    };
    assert_eq!(wrapped.to_string(), "compiling kernel `k0_x` (x: Relu), stage lower");
    let source = std::error::Error::source(&wrapped).expect("the leaf is the source").to_string();
    assert!(source.starts_with("the pipeline no-such-pass failed: it does not parse"), "{source}");
    assert_eq!(
        wrapped.chain(),
        format!("compiling kernel `k0_x` (x: Relu), stage lower: {source}")
    );
}

/// The stages before code generation need no backend: settings only a backend checks (a
/// precision the CPU has no kernels for) do not stop them, and the first code stage refuses.
#[test]
fn front_stages_print_where_the_backend_refuses_the_options() {
    let g = tiny_mlp();
    let options =
        Options { cache: false, precision: kiln_compiler::Precision::F16, ..Options::default() };
    for stage in [Stage::Passes, Stage::Graph, Stage::Fused] {
        let text = kiln_compiler::driver::emit(&g, stage, &options)
            .unwrap_or_else(|e| panic!("stage {stage} with --precision f16: {e}"));
        assert!(text.contains("fc"), "stage {stage} shows the model");
    }
    let dot = kiln_compiler::driver::fused_dot(&g, &options).expect("the fused graph draws");
    assert!(dot.starts_with("digraph"), "{dot}");
    let refused = kiln_compiler::driver::emit(&g, Stage::Mlir, &options).unwrap_err().to_string();
    assert!(refused.contains("f16"), "{refused}");
}

/// The blocks of a lowered function in order, each with the blocks it branches to.
fn blocks_and_successors(func: &str) -> Vec<(String, Vec<usize>)> {
    let mut names: Vec<&str> = vec!["^entry"];
    let mut bodies: Vec<String> = vec![String::new()];
    for line in func.lines() {
        let t = line.trim_start();
        if t.starts_with("^bb") {
            names.push(t.split(['(', ':']).next().unwrap_or(t));
            bodies.push(String::new());
        } else if let Some(body) = bodies.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    bodies
        .iter()
        .map(|body| {
            let succ = body
                .lines()
                .filter(|l| l.contains("llvm.br") || l.contains("llvm.cond_br"))
                .flat_map(|l| l.split(|c: char| !(c.is_alphanumeric() || c == '^')))
                .filter_map(|w| names.iter().position(|n| *n == w))
                .collect();
            (body.clone(), succ)
        })
        .collect()
}

/// A linalg kernel's temporaries (a register tile's buffer) are allocated once a call, before
/// its loops, not once a tile: a 3 -> 6 channel 5x5 convolution of 4 images allocated and freed
/// one per tile, through the memory budget's shared counter, and ran no faster on 2 threads
/// than on 1 (2 threads: 26 -> 14 us once hoisted).
#[test]
fn linalg_temporaries_are_allocated_outside_loops() {
    let g = GraphBuilder::new("small_conv");
    let x = g.input("x", DType::F32, [4, 3, 32, 32]);
    let w = g.constant("w", Tensor::from_vec(&[6, 3, 5, 5], vec![0.01f32; 450]).unwrap());
    let b = g.constant("b", Tensor::vector(&[0.5f32; 6]));
    g.output("y", x.conv(w, Some(b), kiln_ir::builder::ConvOptions::default()).relu().named("act"));
    let s = stages(&g.build().unwrap());
    let lowered = &s[Stage::Lowered];
    let func = lowered
        .split("llvm.func @")
        .find(|f| f.contains("_mlir_memref_to_llvm_alloc(%") && f.contains("llvm.cond_br"))
        .expect("the convolution's kernel allocates a temporary (this test needs one)");
    let blocks = blocks_and_successors(func);
    for (b, (body, _)) in blocks.iter().enumerate() {
        if !body.contains("@_mlir_memref_to_llvm_alloc(") {
            continue;
        }
        // Block b is in a loop when a block at or after it branches back to one at or before it.
        let looped =
            blocks.iter().enumerate().skip(b).any(|(_, (_, succ))| succ.iter().any(|&h| h <= b));
        assert!(!looped, "block {b} allocates inside a loop:\n{func}");
    }
}
