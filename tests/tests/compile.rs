//! Compiled code against the reference interpreter.

use kiln_compiler::Options;
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, models, DType, Graph, Tensor};
use kiln_runtime::LoadOptions;

/// Compiles `graph`, runs it with `threads` threads, and checks every output against `ir::eval`.
pub(crate) fn check_against_eval(graph: &Graph, inputs: &[Tensor], threads: usize, tol: f64) {
    let exe =
        kiln_compiler::jit(graph, &Options { cache: false, ..Options::default() }, &LoadOptions { threads: Some(threads), ..Default::default() })
            .unwrap_or_else(|e| panic!("compile failed: {e}"));
    let got = exe.run(inputs).unwrap_or_else(|e| panic!("run failed: {e}"));
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "output {i} type");
        let (g, w) = (g.to_f64s(), w.to_f64s());
        for (j, (a, b)) in g.iter().zip(&w).enumerate() {
            let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
            assert!(ok, "output {i} element {j}: compiled {a}, interpreter {b}");
        }
    }
}

#[test]
fn mlp_matches_the_interpreter() {
    let g = models::mlp(4, 32, 64, 10, 1).unwrap();
    check_against_eval(&g, &[Tensor::random(DType::F32, &[4, 32], 2)], 1, 1e-4);
}

#[test]
fn cifarnet_matches_the_interpreter() {
    let g = models::cifarnet(4, 0).unwrap();
    check_against_eval(&g, &[Tensor::random(DType::F32, &[4, 3, 32, 32], 42)], 2, 1e-4);
}

/// Kernels big enough to be split into workgroups whose output is not the input's layout: a
/// reduction over the leading dimension and a transpose. Each workgroup must write its own part
/// of the output (the CPU schedule splits only a dimension the output map indexes by its loop).
#[test]
fn workgroups_of_reductions_and_transposes_cover_the_output() {
    use kiln_ir::builder::GraphBuilder;
    let g = GraphBuilder::new("reduce_leading");
    let x = g.input("x", DType::F32, [64, 4096]);
    g.output("sum0", x.reduce_sum(&[0], false));
    g.output("t", x.transpose(&[1, 0]).relu());
    let graph = g.build().unwrap();
    check_against_eval(&graph, &[Tensor::random(DType::F32, &[64, 4096], 5)], 2, 1e-4);
}

#[test]
fn a_softmax_whose_workgroup_loop_bufferises_apart_runs_as_one_workgroup() {
    // [12,128,128] over the last axis: its distributed schedule used to fail at `distribute`.
    let g = GraphBuilder::new("softmax");
    let x = g.input("x", DType::F32, [12, 128, 128]);
    g.output("y", x.softmax(-1));
    check_against_eval(&g.build().unwrap(), &[Tensor::random(DType::F32, &[12, 128, 128], 1)], 2, 1e-5);
}
