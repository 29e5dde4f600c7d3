//! The compiler's pure decisions, tested as functions of their inputs: fusion, arena planning,
//! buffer assignment and launch order, the CPU schedule, and the stage and GPU strategy tables.
//! None of these tests runs MLIR or LLVM, so they take milliseconds.

use kiln_compiler::artifact::{self, Arg, KernelRun, TargetCode};
use kiln_compiler::backend::cpu::schedule;
use kiln_compiler::backend::gpu::schedule::Strategy;
use kiln_compiler::backend::linalg::{Elem, Expr, LinalgOp, OpKind};
use kiln_compiler::fuse::{self, Partition, Views};
use kiln_compiler::{Options, Stage, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{DType, Graph, Tensor};
use kiln_runtime::artifact::{BufferDesc, BufferKind, KernelDesc, Target};
use proptest::prelude::*;

// ----- fusion -----

fn labels(_graph: &Graph, p: &Partition) -> Vec<String> {
    p.kernels.iter().map(|k| k.label.clone()).collect()
}

fn mlp() -> Graph {
    let g = GraphBuilder::new("mlp");
    let x = g.input("x", DType::F32, [4, 32]);
    let w1 = g.constant("w1", Tensor::from_vec(&[32, 64], vec![0.5f32; 32 * 64]).unwrap());
    let b1 = g.constant("b1", Tensor::from_vec(&[64], vec![0.1f32; 64]).unwrap());
    let w2 = g.constant("w2", Tensor::from_vec(&[64, 8], vec![0.25f32; 64 * 8]).unwrap());
    let h = (x.matmul(w1).named("fc1") + b1).named("bias1").relu().named("act1");
    g.output("y", h.matmul(w2).named("fc2"));
    g.build().unwrap()
}

#[test]
fn a_root_takes_its_elementwise_consumers() {
    let g = mlp();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(labels(&g, &p), ["fc1: MatMul + Add + Relu", "fc2: MatMul"]);
}

/// Two elementwise chains meeting at an elementwise node are one kernel (a residual Add of two
/// dequantized tensors reads both where they lie); a chain whose value is read elsewhere too
/// keeps its own kernel.
#[test]
fn elementwise_chains_meeting_at_an_elementwise_node_are_one_kernel() {
    let g = GraphBuilder::new("chains");
    let a = g.input("a", DType::F32, [2, 8]);
    let b = g.input("b", DType::F32, [2, 8]);
    let ca = a.relu().named("ca").sigmoid().named("ca2");
    let cb = b.tanh().named("cb");
    g.output("y", (ca + cb).named("sum"));
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(labels(&g, &p), ["cb: Tanh + Relu + Sigmoid + Add"], "{}", fuse::print(&g, &p));

    let g2 = GraphBuilder::new("shared");
    let a = g2.input("a", DType::F32, [2, 8]);
    let b = g2.input("b", DType::F32, [2, 8]);
    let ca = a.relu().named("ca");
    let cb = b.tanh().named("cb");
    g2.output("y", (ca + cb).named("sum"));
    g2.output("z", cb.sigmoid().named("other"));
    let g2 = g2.build().unwrap();
    let p = fuse::partition(&g2, Views::WithOffsets).unwrap();
    assert_eq!(labels(&g2, &p), ["cb: Tanh", "ca: Relu + Add", "other: Sigmoid"]);
}

#[test]
fn kernels_come_in_launch_order_and_pass_values_between_them() {
    let g = mlp();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    // The second kernel reads what the first wrote.
    assert_eq!(p.kernels[1].inputs[0], p.kernels[0].outputs[0]);
    assert_eq!(p.kernels[1].outputs, vec![g.outputs()[0].1]);
}

#[test]
fn shape_only_ops_are_views_not_kernels() {
    let g = GraphBuilder::new("views");
    let x = g.input("x", DType::F32, [2, 6]);
    let r = x.relu().named("r");
    let flat = r.reshape(&[12]).named("flat");
    g.output("y", flat.sigmoid().named("s"));
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::ShapeOnly).unwrap();
    assert_eq!(p.kernels.len(), 2, "{}", fuse::print(&g, &p));
    let view = p.views.values().next().expect("the reshape is a view");
    assert_eq!(view.offset, 0);
    assert_eq!(view.of, p.kernels[0].outputs[0]);
}

#[test]
fn a_value_read_twice_ends_its_kernel() {
    let g = GraphBuilder::new("fork");
    let x = g.input("x", DType::F32, [8]);
    let e = x.exp().named("e");
    g.output("a", e.relu().named("a"));
    g.output("b", e.sigmoid().named("b"));
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(p.kernels.len(), 3, "{}", fuse::print(&g, &p));
}

#[test]
fn small_constants_are_inlined_not_read() {
    let g = GraphBuilder::new("scale");
    let x = g.input("x", DType::F32, [16]);
    g.output("y", (x * x.scalar(3.0)).relu());
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(
        p.kernels[0].inputs,
        vec![g.inputs()[0].into()],
        "only x is read; the 3.0 is inlined"
    );
}

#[test]
fn an_output_that_is_an_input_gets_a_copy_kernel() {
    let g = GraphBuilder::new("passthrough");
    let x = g.input("x", DType::F32, [4]);
    g.output("same", x);
    g.output("y", x.relu());
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    let copies: Vec<Option<usize>> =
        p.kernels.iter().map(|k| k.copy_to_output).filter(Option::is_some).collect();
    assert_eq!(copies, [Some(0)]);
}

#[test]
fn contiguous_slices_are_views_only_where_the_target_allows_offsets() {
    let g = GraphBuilder::new("rows");
    let x = g.input("x", DType::F32, [8, 4]);
    let r = x.relu().named("r");
    let rows = r.slice(&[2], &[6], &[0], &[1]).named("rows");
    g.output("y", rows.sigmoid().named("s"));
    let g = g.build().unwrap();
    let views = |t| kiln_compiler::backend::rules(t).views();
    let cpu = fuse::partition(&g, views(TargetKind::Cpu)).unwrap();
    let ocl = fuse::partition(&g, views(TargetKind::Opencl)).unwrap();
    assert_eq!(
        cpu.views.values().next().map(|v| v.offset),
        Some(2 * 4 * 4),
        "rows 2.. of 4 floats"
    );
    assert_eq!(labels(&g, &cpu), ["r: Relu", "s: Sigmoid"]);
    // OpenCL copies the rows in the kernel that reads them.
    assert!(ocl.views.is_empty());
    assert_eq!(labels(&g, &ocl), ["r: Relu", "rows: Slice + Sigmoid"]);
}

#[test]
fn a_reduction_is_a_root_and_takes_its_consumer() {
    let g = GraphBuilder::new("mean");
    let x = g.input("x", DType::F32, [4, 8]);
    g.output("y", x.reduce_sum(&[1], true).named("sum").sqrt().named("root"));
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(labels(&g, &p), ["sum: ReduceSum + Sqrt"]);
}

// ----- arena planning -----

fn scratch(sizes: &[u64]) -> Vec<BufferDesc> {
    sizes
        .iter()
        .map(|&bytes| BufferDesc { bytes, kind: BufferKind::Scratch { offset: 0 } })
        .collect()
}

fn offset(b: &BufferDesc) -> u64 {
    match b.kind {
        BufferKind::Scratch { offset } => offset,
        _ => panic!("not scratch"),
    }
}

#[test]
fn buffers_alive_at_different_times_share_the_arena() {
    let mut b = scratch(&[1000, 1000]);
    let total = artifact::plan_arena(&mut b, &[(0, 0, 1), (1, 2, 3)]);
    assert_eq!((offset(&b[0]), offset(&b[1])), (0, 0));
    assert_eq!(total, 1024, "one buffer's size, aligned");
}

#[test]
fn buffers_alive_together_do_not_overlap() {
    let mut b = scratch(&[100, 200]);
    let total = artifact::plan_arena(&mut b, &[(0, 0, 2), (1, 1, 3)]);
    // The larger goes first, at 0; the smaller after it, aligned.
    assert_eq!((offset(&b[1]), offset(&b[0])), (0, 256));
    assert_eq!(total, 256 + 128);
}

#[test]
fn a_gap_between_live_buffers_is_reused() {
    // 0 and 2 live throughout, 1 only early, 3 only late: 3 fits where 1 was.
    let mut b = scratch(&[256, 128, 256, 128]);
    let total = artifact::plan_arena(&mut b, &[(0, 0, 9), (1, 0, 3), (2, 0, 9), (3, 5, 9)]);
    assert_eq!(offset(&b[1]), offset(&b[3]));
    assert_eq!(total, 256 + 256 + 128);
}

#[test]
fn an_empty_buffer_still_gets_an_aligned_slot() {
    let mut b = scratch(&[0, 64]);
    let total = artifact::plan_arena(&mut b, &[(0, 0, 0), (1, 0, 0)]);
    assert_ne!(offset(&b[0]), offset(&b[1]));
    assert_eq!(total, 2 * artifact::ALIGN);
}

proptest! {
    #[test]
    fn no_two_live_buffers_overlap(spec in prop::collection::vec((1u64..5000, 0usize..8, 0usize..4), 1..12)) {
        let sizes: Vec<u64> = spec.iter().map(|s| s.0).collect();
        let lives: Vec<(usize, usize, usize)> = spec.iter().enumerate().map(|(i, &(_, first, len))| (i, first, first + len)).collect();
        let mut b = scratch(&sizes);
        let total = artifact::plan_arena(&mut b, &lives);
        for &(i, fi, li) in &lives {
            prop_assert_eq!(offset(&b[i]) % artifact::ALIGN, 0);
            prop_assert!(offset(&b[i]) + sizes[i] <= total);
            for &(j, fj, lj) in &lives {
                if i < j && fi <= lj && fj <= li {
                    let (a, c) = (offset(&b[i]), offset(&b[j]));
                    prop_assert!(a + sizes[i] <= c || c + sizes[j] <= a, "{} and {} overlap", i, j);
                }
            }
        }
    }
}

// ----- buffers and launch order -----

/// What a backend would give for `p`: one function per kernel, called once on its buffers.
fn fake_code(p: &Partition) -> TargetCode {
    let functions = p
        .kernels
        .iter()
        .map(|k| KernelDesc {
            symbol: k.name.clone(),
            workgroups: 1,
            label: k.label.clone(),
            grid: [0; 3],
            block: [0; 3],
            bytes: 0,
            flops: 0,
        })
        .collect();
    let runs = p
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| KernelRun::single(i, k.inputs.len() + k.outputs.len()))
        .collect();
    TargetCode {
        target: Target::Cpu,
        blob: Vec::new(),
        target_detail: String::new(),
        cpu_features: Vec::new(),
        functions,
        runs,
        scratch: None,
    }
}

#[test]
fn launches_follow_the_partition_and_inputs_and_outputs_come_first() {
    let g = mlp();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    let a = artifact::assemble(&g, &p, fake_code(&p), &Default::default()).unwrap();
    let m = &a.manifest;
    assert_eq!(m.launches.iter().map(|l| l.kernel).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(m.buffers[0].kind, BufferKind::Input(0));
    assert_eq!(m.buffers[1].kind, BufferKind::Output(0));
    assert_eq!((m.inputs[0].buffer, m.outputs[0].buffer), (0, 1));
    // fc2 writes the output buffer.
    assert_eq!(*m.launches[1].args.last().unwrap(), 1);
}

#[test]
fn weights_go_into_the_payload_and_intermediates_into_the_arena() {
    let g = mlp();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    let a = artifact::assemble(&g, &p, fake_code(&p), &Default::default()).unwrap();
    let constants: Vec<u64> = a
        .manifest
        .buffers
        .iter()
        .filter(|b| matches!(b.kind, BufferKind::Constant(_)))
        .map(|b| b.bytes)
        .collect();
    assert_eq!(constants, [32 * 64 * 4, 64 * 4, 64 * 8 * 4]);
    let hidden = a.manifest.launches[0].args.last().copied().unwrap();
    assert_eq!(a.manifest.buffers[hidden].kind, BufferKind::Scratch { offset: 0 });
    assert_eq!(a.manifest.arena_bytes, 4 * 64 * 4);
    assert_eq!(a.manifest.launches[1].args[0], hidden, "fc2 reads what fc1 wrote");
}

#[test]
fn a_view_aliases_the_bytes_it_shares() {
    let g = GraphBuilder::new("views");
    let x = g.input("x", DType::F32, [2, 6]);
    let flat = x.relu().named("r").reshape(&[12]).named("flat");
    g.output("y", flat.sigmoid().named("s"));
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::ShapeOnly).unwrap();
    let a = artifact::assemble(&g, &p, fake_code(&p), &Default::default()).unwrap();
    let written = a.manifest.launches[0].args.last().copied().unwrap();
    let read = a.manifest.launches[1].args[0];
    assert_eq!(a.manifest.buffers[read].kind, BufferKind::Alias { of: written, offset: 0 });
}

#[test]
fn a_weight_no_launch_reads_needs_no_buffer() {
    let g = mlp();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    let mut code = fake_code(&p);
    // fc1 reads its weight packed, from a constant of its own (as the CPU microkernel does).
    let w_slot = p.kernels[0]
        .inputs
        .iter()
        .position(|&v| g.constant_value(v).is_some_and(|t| t.len() == 32 * 64))
        .unwrap();
    code.runs[0].calls[0].args[w_slot] = Arg::Constant(0);
    code.runs[0].constants = vec![vec![7u8; 100]];
    let a = artifact::assemble(&g, &p, code, &Default::default()).unwrap();
    let constants: Vec<u64> = a
        .manifest
        .buffers
        .iter()
        .filter(|b| matches!(b.kind, BufferKind::Constant(_)))
        .map(|b| b.bytes)
        .collect();
    assert_eq!(
        constants,
        [64 * 4, 64 * 8 * 4, 100],
        "the original weight is gone, the packed one is there"
    );
}

#[test]
fn a_copy_kernel_writes_its_own_output_from_the_value() {
    let g = GraphBuilder::new("passthrough");
    let x = g.input("x", DType::F32, [4]);
    g.output("same", x);
    let g = g.build().unwrap();
    let p = fuse::partition(&g, Views::WithOffsets).unwrap();
    let a = artifact::assemble(&g, &p, fake_code(&p), &Default::default()).unwrap();
    assert_eq!(a.manifest.launches[0].args, [0, 1], "input 0 copied into output buffer 1");
}

// ----- the CPU schedule -----

fn d(i: usize) -> Expr {
    Expr::Linear(vec![(i, 1)], 0)
}

/// `fill` then a matmul `[m, k] x [k, n]` as linalg.generic, as codegen writes it.
fn matmul_ops(m: usize, k: usize, n: usize) -> Vec<LinalgOp> {
    let fill = LinalgOp {
        name: "linalg.fill".into(),
        kind: OpKind::Fill,
        parallel: vec![true, true],
        maps: vec![vec![], vec![d(0), d(1)]],
        shapes: vec![None, Some(vec![m, n])],
        elem: vec![Elem::F32, Elem::F32],
        n_inputs: 1,
        producers: vec![None, None],
        multiplies: false,
        body_cost: 1,
    };
    let mm = LinalgOp {
        name: "linalg.generic".into(),
        kind: OpKind::Generic,
        parallel: vec![true, true, false],
        maps: vec![vec![d(0), d(2)], vec![d(2), d(1)], vec![d(0), d(1)]],
        shapes: vec![Some(vec![m, k]), Some(vec![k, n]), Some(vec![m, n])],
        elem: vec![Elem::F32; 3],
        n_inputs: 2,
        producers: vec![None, None, Some(0)],
        multiplies: true,
        body_cost: 1,
    };
    vec![fill, mm]
}

fn elementwise_op(dims: &[usize]) -> Vec<LinalgOp> {
    let map: Vec<Expr> = (0..dims.len()).map(d).collect();
    vec![LinalgOp {
        name: "linalg.generic".into(),
        kind: OpKind::Generic,
        parallel: vec![true; dims.len()],
        maps: vec![map.clone(), map],
        shapes: vec![Some(dims.to_vec()), Some(dims.to_vec())],
        elem: vec![Elem::F32; 2],
        n_inputs: 1,
        producers: vec![None, None],
        multiplies: false,
        body_cost: 1,
    }]
}

#[test]
fn small_kernels_run_as_one_workgroup() {
    let s = schedule::decide(&matmul_ops(8, 8, 8), &[8, 8], false, true, Some(4)).unwrap();
    assert_eq!(s.workgroups(), 1);
    assert_eq!(s.anchor, 1, "the matmul, not its fill");
}

#[test]
fn large_kernels_split_evenly_into_a_few_workgroups() {
    let s =
        schedule::decide(&matmul_ops(256, 256, 256), &[256, 256], false, true, Some(4)).unwrap();
    let split = s.split.expect("split");
    assert!((2..=4).contains(&split.workgroups), "{split:?}");
    assert_eq!(split.tile * split.workgroups, 256);
    assert_eq!(s.local[split.dim], split.tile);
}

#[test]
fn batch_one_images_split_along_rows() {
    let s =
        schedule::decide(&elementwise_op(&[1, 64, 64, 64]), &[1, 64, 64, 64], false, true, Some(4))
            .unwrap();
    assert_eq!(s.split.map(|x| x.dim), Some(2), "{s:?}");
}

/// A product of few rows splits its columns: each unit then reads a part of the weights, not
/// all of them; where rows and columns read about as much, rows, as before.
#[test]
fn a_product_of_few_rows_splits_where_its_units_read_least() {
    let s = schedule::decide(&matmul_ops(32, 128, 512), &[32, 512], false, true, Some(4)).unwrap();
    let split = s.split.expect("split");
    assert_eq!((split.dim, split.workgroups), (1, 2), "{s:?}");
    let s =
        schedule::decide(&matmul_ops(128, 128, 128), &[128, 128], false, true, Some(4)).unwrap();
    assert_eq!(s.split.map(|x| x.dim), Some(0), "{s:?}");
}

/// An elementwise body with a transcendental function (GELU's erf) counts as more work than its
/// iterations: 128 x 512 of them split, the same count of a plain body does not.
#[test]
fn transcendental_bodies_count_as_more_work() {
    let dims = [128, 512];
    let plain = schedule::decide(&elementwise_op(&dims), &dims, false, true, Some(4)).unwrap();
    assert_eq!(plain.workgroups(), 1, "{plain:?}");
    let mut ops = elementwise_op(&dims);
    ops[0].body_cost = 1 + kiln_compiler::backend::linalg::TRANSCENDENTAL_COST;
    let erf = schedule::decide(&ops, &dims, false, true, Some(4)).unwrap();
    assert!(erf.workgroups() >= 2, "{erf:?}");
}

#[test]
fn no_distribution_means_one_workgroup() {
    let s = schedule::decide(&matmul_ops(256, 256, 256), &[256, 256], false, true, None).unwrap();
    assert_eq!(s.split, None);
}

#[test]
fn a_contraction_gets_a_register_tile_and_steps_its_reduction() {
    let s = schedule::decide(&matmul_ops(64, 64, 64), &[64, 64], false, true, Some(4)).unwrap();
    let r = s.register.expect("a register tile");
    assert_eq!(r.contraction, Some((1, vec![0, 0, 1])), "one k at a time into the output tile");
    assert!(r.sizes.iter().product::<usize>() <= 1024, "{:?}", r.sizes);
    assert!(s.vectorize);
}

#[test]
fn without_vectors_there_is_no_register_tile() {
    let s = schedule::decide(&matmul_ops(64, 64, 64), &[64, 64], false, false, Some(4)).unwrap();
    assert!(s.register.is_none() && !s.vectorize);
}

#[test]
fn sequential_kernels_and_kernels_without_linalg_ops_are_left_alone() {
    assert_eq!(schedule::decide(&matmul_ops(64, 64, 64), &[64, 64], true, true, Some(4)), None);
    assert_eq!(schedule::decide(&[], &[4], false, true, Some(4)), None);
}

/// A quantized model's elementwise work (dequantizing u8 to f32, a residual add requantised)
/// is vectorised like f32's; 64-bit and boolean elements, and integer contractions, are not.
#[test]
fn elementwise_ops_on_8_to_32_bit_integers_are_vectorised() {
    let dims = [1, 64, 14, 14];
    let with = |elem: Vec<Elem>| {
        let mut ops = elementwise_op(&dims);
        ops[0].elem = elem;
        schedule::decide(&ops, &dims, false, true, Some(4))
    };
    for elem in
        [vec![Elem::Int(8), Elem::F32], vec![Elem::F32, Elem::Int(8)], vec![Elem::Int(32); 2]]
    {
        let s = with(elem.clone()).expect("a schedule");
        assert!(s.vectorize && s.register.is_some(), "{elem:?}: {s:?}");
    }
    for elem in [vec![Elem::Int(64), Elem::F32], vec![Elem::Int(1), Elem::F32]] {
        assert!(with(elem.clone()).is_none_or(|s| s.register.is_none()), "{elem:?}");
    }
    let mut ops = matmul_ops(64, 64, 64);
    ops[1].elem = vec![Elem::Int(8), Elem::Int(8), Elem::Int(32)];
    let s = schedule::decide(&ops, &[64, 64], false, true, Some(4));
    assert!(s.is_none_or(|s| s.register.is_none()), "an integer contraction is not tiled");
}

#[test]
fn schedule_decisions_print_stably() {
    let mut text = String::new();
    for (name, ops, dims) in [
        ("matmul_small", matmul_ops(8, 8, 8), vec![8, 8]),
        ("matmul_large", matmul_ops(256, 512, 256), vec![256, 256]),
        ("image_elementwise", elementwise_op(&[1, 32, 56, 56]), vec![1, 32, 56, 56]),
    ] {
        let s = schedule::decide(&ops, &dims, false, true, Some(4));
        text.push_str(&schedule::describe(name, &ops, s.as_ref()));
    }
    insta::assert_snapshot!("schedule_decisions", text);
}

// ----- the stage and strategy tables -----

#[test]
fn stages_are_in_compile_order_and_front_stages_come_first() {
    let front: Vec<Stage> = Stage::ALL.into_iter().take_while(|s| s.is_front()).collect();
    assert_eq!(front, [Stage::Passes, Stage::Graph, Stage::Fused]);
    assert!(Stage::ALL.windows(2).all(|w| w[0] < w[1]));
    assert!(Stage::ALL.iter().all(|s| !s.description().is_empty()));
}

#[test]
fn each_target_has_its_code_stages() {
    let of = |t: TargetKind| -> Vec<&str> {
        let stages = kiln_compiler::backend::stages_of(t);
        assert!(stages.windows(2).all(|w| w[0] < w[1]), "{t:?}'s stages in compile order");
        let backend = kiln_compiler::backend::for_options(&Options::for_target(t)).unwrap();
        assert_eq!(backend.rules().stages(), stages, "{t:?}'s backend has its target's rules");
        stages.iter().map(|s| s.name()).collect()
    };
    assert_eq!(
        of(TargetKind::Cpu),
        ["passes", "graph", "fused", "schedule", "mlir", "lowered", "llvm", "asm"]
    );
    assert_eq!(
        of(TargetKind::Cuda),
        ["passes", "graph", "fused", "mlir", "lowered", "llvm", "ptx"]
    );
    assert_eq!(of(TargetKind::Opencl), ["passes", "graph", "fused", "mlir", "lowered", "spirv"]);
}

#[test]
fn gpu_strategies_parse_by_name() {
    for s in [
        Strategy::Parallel,
        Strategy::Reduction,
        Strategy::Contraction,
        Strategy::PerOp,
        Strategy::Tile,
        Strategy::TensorCore,
    ] {
        assert_eq!(s.to_string().parse::<Strategy>(), Ok(s));
    }
    assert_eq!(
        "fast".parse::<Strategy>().unwrap_err(),
        "no GPU schedule `fast` (parallel, reduction, contraction, per-op, tile or tensor-core)"
    );
}

#[test]
fn a_stage_map_keeps_compile_order_and_skips_empty_stages() {
    let mut s = kiln_compiler::Stages::default();
    s.push(Stage::Mlir, "b");
    s.set(Stage::Graph, "a".into());
    s.push(Stage::Mlir, "c");
    s.set(Stage::Asm, String::new());
    assert_eq!(s.iter().collect::<Vec<_>>(), [(Stage::Graph, "a"), (Stage::Mlir, "bc")]);
    assert_eq!(&s[Stage::Ptx], "");
}

// ----- tuning -----

#[test]
fn a_kernel_signature_names_its_ops_and_types_not_its_graph() {
    let sig = |name: &str, n: usize| {
        let g = GraphBuilder::new(name);
        let x = g.input("input", DType::F32, [n, 8]);
        g.output("out", x.exp().named(name).relu());
        let g = g.build().unwrap();
        let p = fuse::partition(&g, Views::WithOffsets).unwrap();
        kiln_compiler::tune::kernel_signature(&g, &p.kernels[0])
    };
    assert_eq!(sig("first", 4), sig("second", 4));
    assert_ne!(sig("first", 4), sig("first", 5));
}

// ----- outputs written over inputs (in place) -----

/// x f32[4,4], t f32[4,4] -> y = softmax(softmax(x)) + t, and t.new = t * 0.5: the reader of
/// the old t (the Add after two softmaxes) is two kernels deep, its writer depends on nothing.
fn late_reader() -> Graph {
    let g = GraphBuilder::new("late_reader");
    let x = g.input("x", DType::F32, [4, 4]);
    let t = g.input("t", DType::F32, [4, 4]);
    let s = x.softmax(1).named("s1").softmax(1).named("s2");
    g.output("y", (s + t).named("add_t"));
    g.output("t.new", (t * t.scalar(0.5)).named("halve"));
    g.build().unwrap()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(i, o)| (i.to_string(), o.to_string())).collect()
}

fn in_place_partition(g: &Graph, inputs: &[&str]) -> Partition {
    let set = g
        .inputs()
        .iter()
        .filter(|&&i| inputs.contains(&g.node(i).name.as_str()))
        .map(|&i| kiln_ir::ValueId::from(i))
        .collect();
    fuse::partition_in_place(g, Views::WithOffsets, &set).unwrap()
}

/// The writer of `t.new` waits for the reader of the old `t`: without the plan's edge it would
/// be in the first wave, launched before the Add that reads `t` (which would then read the new
/// value). The artifact binds both to one state buffer and leaves them out of its interface.
#[test]
fn an_in_place_write_is_scheduled_after_every_read_of_the_old_value() {
    let g = late_reader();
    let p = in_place_partition(&g, &["t"]);
    let plan = kiln_compiler::inplace::plan(&g, &p, &pairs(&[("t", "t.new")])).unwrap();
    insta::assert_snapshot!("in_place_plan_late_reader", plan.to_string());
    let (writer, reader) = (plan.pairs[0].writer, plan.pairs[0].readers[0]);
    assert_eq!(plan.edges, [(reader, writer)]);
    // Data alone puts the writer first (wave 0), before its reader (wave 2).
    let by_data = artifact::kernel_waves(&p);
    assert!(by_data[writer] < by_data[reader], "{by_data:?}");
    let waves = artifact::kernel_waves_after(&p, &plan.edges).unwrap();
    assert!(waves[writer] > waves[reader], "{waves:?}");

    let a = artifact::assemble(&g, &p, fake_code(&p), &plan).unwrap();
    let m = &a.manifest;
    let names = |ts: &[kiln_runtime::artifact::TensorDesc]| {
        ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!((names(&m.inputs), names(&m.outputs)), (vec!["x".into()], vec!["y".into()]));
    let s = &m.state[0];
    assert_eq!((s.input.as_str(), s.output.as_str()), ("t", "t.new"));
    assert_eq!(m.buffers[s.buffer].kind, BufferKind::State(0));
    let at = |k: usize| m.launches.iter().position(|l| l.kernel == k).unwrap();
    assert_eq!(s.writer, at(writer));
    assert!(at(reader) < at(writer), "the reader is launched first");
    assert!(m.launches[at(writer)].args.contains(&s.buffer), "the writer writes the state");
    assert!(m.launches[at(reader)].args.contains(&s.buffer), "the reader reads it");
    insta::assert_snapshot!("in_place_describe_late_reader", kiln_compiler::inplace::describe(m));
    a.validate().unwrap();
}

/// An update that reads the old weight (w - lr·g) stays out of the kernel of the product that
/// makes its gradient: that kernel may store partial sums into its output, which is the
/// weight's own bytes. Without in-place inputs it fuses as always.
#[test]
fn a_reader_of_an_in_place_input_joins_no_kernel_with_a_root() {
    let g = GraphBuilder::new("sgd");
    let a = g.input("a", DType::F32, [4, 4]);
    let b = g.input("b", DType::F32, [4, 4]);
    let w = g.input("w", DType::F32, [4, 4]);
    let grad = a.matmul(b).named("grad");
    let step = (grad * grad.scalar(0.1)).named("step");
    g.output("w.new", (w - step).named("update"));
    let g = g.build().unwrap();
    let fused = fuse::partition(&g, Views::WithOffsets).unwrap();
    assert_eq!(labels(&g, &fused), ["grad: MatMul + Mul + Sub"]);
    let p = in_place_partition(&g, &["w"]);
    assert_eq!(labels(&g, &p), ["grad: MatMul + Mul", "update: Sub"]);
    let plan = kiln_compiler::inplace::plan(&g, &p, &pairs(&[("w", "w.new")])).unwrap();
    assert_eq!(plan.to_string(), "`w.new` written over `w` by k1_update, after -\n");
    // The fused kernel as the writer is refused, naming why.
    let e = kiln_compiler::inplace::plan(&g, &fused, &pairs(&[("w", "w.new")])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "output `w.new` cannot be written in place over input `w`: kernel k0_grad (grad: MatMul + Mul + Sub) reads the old value and has a root, `grad` (MatMul), which may store before it reads"
    );
}

/// What cannot be written in place is a typed error naming the pair: a writer that reads the
/// old value at other positions (a transpose), values swapped (no order reads both first),
/// names that are not an input and an output, a type that differs, a name given twice.
#[test]
fn in_place_pairs_that_cannot_be_ordered_are_refused() {
    let err = |g: &Graph, list: &[(&str, &str)]| {
        let inputs: Vec<&str> = list.iter().map(|p| p.0).collect();
        let p = in_place_partition(g, &inputs);
        match kiln_compiler::inplace::plan(g, &p, &pairs(list)) {
            Err(e) => e.to_string(),
            Ok(plan) => match artifact::assemble(g, &p, fake_code(&p), &plan) {
                Err(e) => e.to_string(),
                Ok(_) => "accepted".into(),
            },
        }
    };
    let g = GraphBuilder::new("transposed");
    let x = g.input("x", DType::F32, [3, 3]);
    g.output("x.new", x.transpose(&[1, 0]).named("flip"));
    let g = g.build().unwrap();
    assert_eq!(
        err(&g, &[("x", "x.new")]),
        "output `x.new` cannot be written in place over input `x`: kernel k0_flip (flip: Transpose) reads the old value in `flip` (Transpose), which is not elementwise"
    );
    let g = GraphBuilder::new("swap");
    let x = g.input("x", DType::F32, [3]);
    let y = g.input("y", DType::F32, [3]);
    g.output("x.new", y.relu().named("ry"));
    g.output("y.new", x.relu().named("rx"));
    let g = g.build().unwrap();
    assert_eq!(
        err(&g, &[("x", "x.new"), ("y", "y.new")]),
        "output `x.new` cannot be written in place over input `x`: no order runs every reader of the old value before the new value is written"
    );
    assert_eq!(err(&g, &[("x", "y.new")]), "accepted");
    assert_eq!(
        err(&g, &[("z", "x.new")]),
        "output `x.new` cannot be written in place over input `z`: the graph has no input `z`"
    );
    assert_eq!(
        err(&g, &[("x", "x.old")]),
        "output `x.old` cannot be written in place over input `x`: the graph has no output `x.old`"
    );
    assert_eq!(
        err(&g, &[("x", "x.new"), ("x", "y.new")]),
        "output `y.new` cannot be written in place over input `x`: input `x` is written over twice"
    );
    let g = GraphBuilder::new("typed");
    let x = g.input("x", DType::F32, [3]);
    g.output("x.new", x.reshape(&[1, 3]).relu().named("r"));
    let g = g.build().unwrap();
    assert_eq!(
        err(&g, &[("x", "x.new")]),
        "output `x.new` cannot be written in place over input `x`: the input is f32[3], the output f32[1,3]"
    );
}
