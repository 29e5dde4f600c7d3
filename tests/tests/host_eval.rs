//! Data-dependent result shapes on compiled targets: a graph that ends in NonMaxSuppression,
//! NonZero or Unique compiles the part before them, and the host evaluates them and everything
//! after them with the interpreter (`Step::Eval`); against the interpreter on the CPU and OpenCL,
//! through the facade, and a damaged embedded graph refused with a typed error at load.

use kiln_compiler::{compile, Options, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::BinaryOp;
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::artifact::{Artifact, Step};
use kiln_runtime::{Executable, LoadOptions, Target};

/// A detector's tail: `scores = sigmoid(logits)` and `b = boxes * 2` compiled, then
/// NonMaxSuppression, the kept boxes' indices gathered from its rows, and the confident scores'
/// coordinates (NonZero) on the host; `scores` is an output too.
fn detector() -> Graph {
    let g = GraphBuilder::new("detector");
    let boxes = g.input("boxes", DType::F32, vec![1, 8, 4]);
    let logits = g.input("logits", DType::F32, vec![1, 2, 8]);
    let scores = logits.sigmoid().named("scores");
    let b = (boxes * boxes.scalar(2.0)).named("b");
    let limits = [
        g.constant("max", Tensor::scalar(3i64)),
        g.constant("iou", Tensor::scalar(0.4f32)),
        g.constant("floor", Tensor::scalar(0.3f32)),
    ];
    let nms = g.apply(
        Op::NonMaxSuppression { center_point_box: false },
        &[Some(b), Some(scores), Some(limits[0]), Some(limits[1]), Some(limits[2])],
        1,
    )[0]
    .named("selected");
    let column = g.constant("column", Tensor::vector(&[2i64]));
    let kept = g.apply(Op::Gather { axis: 1 }, &[Some(nms), Some(column)], 1)[0].named("kept");
    let half = g.constant("half", Tensor::scalar(0.5f32));
    let confident = g.apply(Op::Binary(BinaryOp::Greater), &[Some(scores), Some(half)], 1)[0]
        .named("confident");
    let at = g.apply(Op::NonZero, &[Some(confident)], 1)[0].named("at");
    g.output("selected", nms);
    g.output("kept", kept);
    g.output("at", at);
    g.output("scores", scores);
    g.build().unwrap()
}

fn inputs(seed: u64) -> Vec<Tensor> {
    vec![
        Tensor::random(DType::F32, &[1, 8, 4], seed),
        Tensor::random(DType::F32, &[1, 2, 8], seed + 1),
    ]
}

fn same(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.ty(), w.ty(), "{what}");
        for (a, b) in g.to_f64s().iter().zip(w.to_f64s()) {
            assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what}: {a} vs {b}");
        }
    }
}

fn options(target: TargetKind) -> Options {
    Options { cache: false, target, ..Options::default() }
}

#[test]
fn a_detector_tail_runs_on_the_host_after_the_compiled_part() {
    let graph = detector();
    let compiled = compile(&graph, &options(TargetKind::Cpu), true).unwrap();
    let plan =
        compiled.stages[kiln_compiler::Stage::Fused].split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("detector_host_split", plan);
    let control = compiled.artifact.manifest.control.as_ref().expect("control flow");
    assert_eq!(control.programs.len(), 1);
    assert!(matches!(control.steps.last(), Some(Step::Eval { .. })));
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "detector.kiln").unwrap();
    let exe =
        Executable::load(art, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap();
    let mut counts = Vec::new();
    for seed in [1, 7, 20, 33] {
        let x = inputs(seed);
        let want = eval::run(&graph, &x).unwrap();
        same(&exe.run(&x).unwrap(), &want, &format!("seed {seed}"));
        counts.push((want[0].dims()[0], want[2].dims()[1]));
    }
    // The inputs keep different numbers of boxes and scores, so the sizes did vary.
    counts.dedup();
    assert!(counts.len() > 1, "{counts:?}");
}

#[test]
fn a_detector_tail_runs_on_opencl() {
    if !kiln_runtime::list_devices().iter().any(|d| d.target == Target::Opencl && d.usable) {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the host tail on OpenCL was not checked");
        println!("SKIPPED: no OpenCL device; the host tail on OpenCL was not checked");
        return;
    }
    let graph = detector();
    let exe =
        kiln_compiler::jit(&graph, &options(TargetKind::Opencl), &LoadOptions::default()).unwrap();
    for seed in [3, 11] {
        let x = inputs(seed);
        same(
            &exe.run(&x).unwrap(),
            &eval::run(&graph, &x).unwrap(),
            &format!("opencl, seed {seed}"),
        );
    }
}

#[test]
fn the_facade_runs_a_model_whose_outputs_depend_on_the_data() {
    // Unique of a compiled product: every node after the Mul on the host.
    let g = GraphBuilder::new("distinct");
    let x = g.input("x", DType::I64, vec![6]);
    let y = (x * x).named("square");
    let u = g.apply(Op::Unique { axis: None, sorted: true }, &[Some(y)], 4);
    g.output("values", u[0]);
    g.output("counts", u[3]);
    let graph = g.build().unwrap();
    let model = kiln::jit(&graph, &kiln::Options::new().cache(false)).unwrap();
    let x = Tensor::vector(&[3i64, -3, 1, 0, 1, 2]);
    let got = model.run_named(&[("x", x.clone())]).unwrap();
    assert_eq!(got[0].0, "values");
    assert_eq!(got[0].1.to_i64s(), [0, 1, 4, 9]);
    assert_eq!(got[1].1.to_i64s(), [1, 2, 1, 2]);
    let mut session = kiln::Session::new(graph.clone(), &kiln::Options::new().cache(false));
    let got = session.run_named(&[("x", Tensor::vector(&[5i64; 6]))]).unwrap();
    assert_eq!((got[0].1.to_i64s(), got[1].1.to_i64s()), (vec![25], vec![6]));
}

#[test]
fn a_damaged_host_graph_is_refused_at_load() {
    let compiled = compile(&detector(), &options(TargetKind::Cpu), false).unwrap();
    let with_graph = |edit: &dyn Fn(&str) -> String| {
        let mut art = compiled.artifact.clone();
        let control = art.manifest.control.as_mut().unwrap();
        let Some(Step::Eval { graph, .. }) = control.steps.last_mut() else {
            panic!("no host step")
        };
        *graph = edit(graph);
        // Written as a file would be (the CRC over the edited manifest), then read back.
        Artifact::from_bytes(&art.to_bytes(), "damaged.kiln").unwrap_err().to_string()
    };
    let e = with_graph(&|g| g[..g.len() / 2].to_string());
    assert!(e.starts_with("damaged.kiln: step 1: the host graph does not parse: "), "{e}");
    let e = with_graph(&|g| g.replace("NonZero", "Nonesuch"));
    assert!(e.contains("the host graph does not parse"), "{e}");
    // A graph that parses but reads a value of another type.
    let e = with_graph(&|g| g.replacen("f32[1,8,4]", "f32[1,8,5]", 1));
    assert!(e.contains("step 1: the host graph"), "{e}");
}
