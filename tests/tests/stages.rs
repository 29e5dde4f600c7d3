//! Snapshots of each stage's text for small models: the graph after passes, the fused kernels,
//! the MLIR kiln generates, and LLVM IR (for a scalar model, with the host CPU's name and
//! features filtered out, so the snapshot does not depend on the machine).

use kiln_compiler::{compile, Options};
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
    compile(graph, &Options { cache: false, ..Options::default() }, true).expect("the model compiles").stages
}

#[test]
fn graph_fused_and_mlir_stages_are_stable() {
    let s = stages(&tiny_mlp());
    insta::assert_snapshot!("tiny_graph", s.graph);
    insta::assert_snapshot!("tiny_fused", s.fused);
    insta::assert_snapshot!("tiny_mlir", s.mlir);
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
        insta::assert_snapshot!("scalar_llvm", s.llvm);
    });
    assert!(s.asm.contains("k0_"), "assembly names the kernel");
    assert!(!s.lowered.contains("linalg."), "the lowered stage is all LLVM dialect");
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
    insta::assert_snapshot!("views_fused", s.fused);
    let inputs =
        [Tensor::random(DType::F32, &[1, 8, 6, 6], 1), Tensor::random(DType::F32, &[2, 4, 5], 3), Tensor::random(DType::F32, &[3, 2, 4, 4], 4)];
    crate::compile::check_against_eval(&graph, &inputs, 2, 1e-4);
}
