//! Run-time control flow: an If whose condition is computed from an input (a voice-activity
//! model's sample rate) compiles once into programs and host steps, and each run takes the
//! branch its inputs pick; against the interpreter, on the CPU and OpenCL, inside a symbolic
//! batch; branches of different shapes specialise on the condition instead. Scan and Loop bodies
//! compile once and the host runs them per step; small counted loops are unrolled; a Loop stops
//! at `max_loop_steps` when one is given.

use std::sync::Arc;

use kiln_compiler::{compile, CompileError, Options, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{BinaryOp, Subgraph};
use kiln_ir::{eval, DType, Dim, Graph, Op, Shape, Tensor};
use kiln_runtime::artifact::{Artifact, Step};
use kiln_runtime::{Executable, LoadOptions, Target};

/// A branch over `h: f32[N,16]`: `relu(h @ w)` or `sigmoid(h @ w) * 2`, `w` of `width` columns.
fn branch(name: &str, relu: bool, width: usize, seed: u64) -> Subgraph {
    let g = GraphBuilder::new(name);
    let h = g.input("h", DType::F32, vec![Dim::sym("N"), 16.into()]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, width], seed));
    let y = if relu {
        h.matmul(w).relu()
    } else {
        let s = h.matmul(w).sigmoid();
        s * s.scalar(2.0)
    };
    g.output("out", y);
    Subgraph(Arc::new(g.build().unwrap()))
}

/// `x: f32[N,16]`, `sr: i64[]`: `h = tanh(x)`; `r = If(sr == 16000, relu(h @ w1), sigmoid(h @ w2) * 2)`;
/// outputs `softmax(r)`, `exp(h)` (computed before the If) and `r` (the If's own result).
fn vad_like(n: Dim, else_width: usize) -> Graph {
    let g = GraphBuilder::new("vad_like");
    let x = g.input("x", DType::F32, vec![n, 16.into()]);
    let sr = g.input("sr", DType::I64, Shape::scalar());
    let h = x.tanh();
    let rate = g.constant("rate", Tensor::scalar::<i64>(16000));
    let cond = g.apply(Op::Binary(BinaryOp::Equal), &[Some(sr), Some(rate)], 1)[0].named("cond");
    let op = Op::If {
        then_branch: branch("then_g", true, 8, 1),
        else_branch: branch("else_g", false, else_width, 2),
    };
    let r = g.apply(op, &[Some(cond), Some(h)], 1)[0].named("r");
    g.output("y", r.softmax(-1));
    g.output("side", h.exp());
    g.output("r", r);
    g.build().unwrap()
}

fn inputs(n: usize, sr: i64) -> Vec<Tensor> {
    vec![Tensor::random(DType::F32, &[n, 16], 30 + n as u64), Tensor::scalar::<i64>(sr)]
}

fn close(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.ty(), w.ty(), "{what}");
        for (a, b) in g.to_f64s().iter().zip(w.to_f64s()) {
            assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "{what}: {a} vs {b}");
        }
    }
}

fn sized(n: usize) -> Options {
    Options {
        cache: false,
        input_shapes: [("x".to_string(), vec![n, 16])].into(),
        ..Options::default()
    }
}

#[test]
fn an_if_on_a_computed_condition_compiles_once_and_runs_either_branch() {
    let graph = vad_like(Dim::sym("N"), 8);
    let compiled = compile(&graph, &sized(3), true).unwrap();
    // The split: what runs before the If, the two branches, what runs after it.
    let plan =
        compiled.stages[kiln_compiler::Stage::Fused].split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("vad_like_control_split", plan);
    let control =
        compiled.artifact.manifest.control.as_ref().expect("control flow in the artifact");
    assert_eq!(control.programs.len(), 4);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "vad.kiln").unwrap();
    for threads in [1, 2] {
        let exe = Executable::load(
            art.clone(),
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .unwrap();
        for sr in [16000, 8000, 16000] {
            let x = inputs(3, sr);
            close(
                &exe.run(&x).unwrap(),
                &eval::run(&graph, &x).unwrap(),
                &format!("sr {sr}, {threads} threads"),
            );
        }
    }
    // The branches differ, so the runs above did take both.
    let exe = Executable::load(art, &LoadOptions::default()).unwrap();
    let (a, b) = (exe.run(&inputs(3, 16000)).unwrap(), exe.run(&inputs(3, 8000)).unwrap());
    assert_ne!(a[2].to_f64s(), b[2].to_f64s());
    // A wrong input is refused before any program runs.
    let e = exe
        .run(&[Tensor::random(DType::F32, &[4, 16], 1), Tensor::scalar::<i64>(1)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected f32[3, 16], got f32[4,16]") || e.contains("`x`"), "{e}");
}

#[test]
fn an_if_inside_a_symbolic_batch_runs_any_batch() {
    let graph = vad_like(Dim::sym("N"), 8);
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, false).unwrap();
    let batch = compiled.artifact.manifest.batch.as_ref().expect("a symbolic batch");
    assert!(
        batch.programs.iter().all(|p| p.manifest.control.is_some()),
        "each batch size's program has the If's steps"
    );
    let exe = Executable::load(
        compiled.artifact,
        &LoadOptions { threads: Some(2), ..Default::default() },
    )
    .unwrap();
    for (n, sr) in [(1, 16000), (5, 8000), (5, 16000), (8, 8000)] {
        let x = inputs(n, sr);
        close(
            &exe.run(&x).unwrap(),
            &eval::run(&graph, &x).unwrap(),
            &format!("batch {n}, sr {sr}"),
        );
    }
}

#[test]
fn an_if_on_a_computed_condition_runs_on_opencl() {
    if !kiln_runtime::list_devices().iter().any(|d| d.target == Target::Opencl && d.usable) {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the If on OpenCL was not checked");
        println!("SKIPPED: no OpenCL device; the If on OpenCL was not checked");
        return;
    }
    let graph = vad_like(Dim::sym("N"), 8);
    let options = Options { target: TargetKind::Opencl, ..sized(3) };
    let exe = kiln_compiler::jit(&graph, &options, &LoadOptions::default()).unwrap();
    for sr in [16000, 8000] {
        let x = inputs(3, sr);
        close(&exe.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("opencl, sr {sr}"));
    }
}

#[test]
fn branches_of_different_shapes_specialise_on_the_condition() {
    // Then gives [3, 8], else [3, 4]: the result's shape is the condition's to decide.
    let graph = vad_like(Dim::sym("N"), 4);
    let e = compile(&graph, &sized(3), false).err().expect("needs the condition's value");
    assert!(matches!(e, CompileError::DynamicShapes(_)), "{e}");
    assert!(e.to_string().contains("the result shapes depend on the values of `sr`"), "{e}");
    // Given the value (as `kiln run` gives it), the If is replaced by the branch it takes.
    for (sr, width) in [(16000, 8), (8000, 4)] {
        let options = Options {
            input_values: [("sr".to_string(), Tensor::scalar::<i64>(sr))].into(),
            ..sized(3)
        };
        let compiled = compile(&graph, &options, false).unwrap();
        assert!(compiled.artifact.manifest.control.is_none(), "no If is left");
        let exe = Executable::load(compiled.artifact, &LoadOptions::default()).unwrap();
        let x = inputs(3, sr);
        let got = exe.run(&x[..1]).unwrap();
        assert_eq!(got[2].dims(), &[3, width]);
        close(&got, &eval::run(&graph, &x).unwrap(), &format!("sr {sr}"));
    }
}

/// `x: f32[2,6,4]` scanned along axis 1 backwards, `h0: f32[2,4]` the state, a weight and a
/// bias computed before the Scan captured: `h = tanh(h @ w + x_t + b)`; stacks `h * 2` along
/// axis 1 and gives the last `h`. `grow` makes the state grow by a column each step instead.
fn recurrent_scan(grow: bool) -> Graph {
    let body = GraphBuilder::new("step");
    let w = body.input("w", DType::F32, [4, 4]);
    let b = body.input("b", DType::F32, [4]);
    let h = body.input("h", DType::F32, [2, 4]);
    let x = body.input("x_t", DType::F32, [2, 4]);
    let next = (h.matmul(w) + x + b).tanh();
    if grow {
        body.output("h_next", body.concat(&[next, x], 1));
    } else {
        body.output("h_next", next);
    }
    body.output("y_t", next * next.scalar(2.0));
    let body = Subgraph(Arc::new(body.build().unwrap()));
    let g = GraphBuilder::new("recurrent_scan");
    let x = g.input("x", DType::F32, [2, 6, 4]);
    let h0 = g.input("h0", DType::F32, [2, 4]);
    let b0 = g.input("b0", DType::F32, [4]);
    let w = g.constant("w", Tensor::random(DType::F32, &[4, 4], 5));
    let b = b0.sigmoid();
    let scan = kiln_ir::op::Scan {
        body,
        captures: 2,
        scan_inputs: 1,
        input_axes: vec![1],
        input_reverse: vec![true],
        output_axes: vec![1],
        output_reverse: vec![false],
    };
    let out = g.apply(Op::Scan(Box::new(scan)), &[Some(w), Some(b), Some(h0), Some(x)], 2);
    g.output("h_last", out[0].named("scan"));
    g.output("ys", out[1].exp());
    g.build().unwrap()
}

#[test]
fn a_scan_runs_its_body_once_per_step_on_host_slices() {
    let graph = recurrent_scan(false);
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, true).unwrap();
    let plan =
        compiled.stages[kiln_compiler::Stage::Fused].split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("recurrent_scan_control_split", plan);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "scan.kiln").unwrap();
    let x = vec![
        Tensor::random(DType::F32, &[2, 6, 4], 1),
        Tensor::random(DType::F32, &[2, 4], 2),
        Tensor::random(DType::F32, &[4], 3),
    ];
    let want = eval::run(&graph, &x).unwrap();
    assert_eq!(want[1].dims(), &[2, 6, 4]);
    for threads in [1, 2] {
        let exe = Executable::load(
            art.clone(),
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .unwrap();
        close(&exe.run(&x).unwrap(), &want, &format!("{threads} threads"));
    }
    // A state that changes shape from step to step cannot have one compiled body.
    let e = compile(&recurrent_scan(true), &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("state 0 goes in as f32[2,4] and comes out as f32[2,8]"), "{e}");
}

/// A Scan whose body reads a captured constant as Unsqueeze's axes (as ONNX's function bodies
/// do): the body's shapes are not static, so it cannot be one program; its 4 steps are unrolled
/// instead, with no host step, and give what the interpreter gives.
#[test]
fn a_scan_whose_shapes_follow_from_captured_values_is_unrolled() {
    let body = GraphBuilder::new("step");
    let axes = body.input("axes", DType::I64, [1]);
    let h = body.input("h", DType::F32, [2, 3]);
    let x = body.input("x_t", DType::F32, [2, 3]);
    body.output("h_next", (h + x).tanh());
    body.output("y_t", body.apply(Op::Unsqueeze, &[Some(h * x), Some(axes)], 1)[0]);
    let body = body.build().unwrap();
    assert!(body.nodes().any(|(_, n)| n.outputs.iter().any(|t| !t.shape.is_fixed())));
    let g = GraphBuilder::new("unrolled_scan");
    let x = g.input("x", DType::F32, [4, 2, 3]);
    let h0 = g.input("h0", DType::F32, [2, 3]);
    let axes = g.constant("axes", Tensor::vector(&[-1i64]));
    let scan = kiln_ir::op::Scan {
        body: Subgraph(Arc::new(body)),
        captures: 1,
        scan_inputs: 1,
        input_axes: vec![0],
        input_reverse: vec![true],
        output_axes: vec![1],
        output_reverse: vec![false],
    };
    let out = g.apply(Op::Scan(Box::new(scan)), &[Some(axes), Some(h0), Some(x)], 2);
    g.output("h_last", out[0]);
    g.output("ys", out[1]);
    let graph = g.build().unwrap();
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, true).unwrap();
    let fused = &compiled.stages[kiln_compiler::Stage::Fused];
    assert!(!fused.contains("control flow"), "{fused}");
    let x = vec![Tensor::random(DType::F32, &[4, 2, 3], 1), Tensor::random(DType::F32, &[2, 3], 2)];
    let want = eval::run(&graph, &x).unwrap();
    assert_eq!(want[1].dims(), &[2, 4, 3, 1]);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "unrolled.kiln").unwrap();
    let exe = Executable::load(art, &LoadOptions::default()).unwrap();
    close(&exe.run(&x).unwrap(), &want, "unrolled");
}

/// A loop body over `h: f32[3,4]` that captures a weight and a value computed before the Loop:
/// `h = tanh(h @ w + c * step)`; stacks `h * 2`. The condition is passed on, or, with `limit`,
/// is `sum(h) < limit` (a while loop whose length the data decides).
fn loop_body(limit: bool) -> Subgraph {
    let body = GraphBuilder::new("loop_body");
    let w = body.input("w", DType::F32, [4, 4]);
    let c = body.input("c", DType::F32, [4]);
    let limit = limit.then(|| body.input("limit", DType::F32, Shape::scalar()));
    let step = body.input("step", DType::I64, Shape::scalar());
    let cond = body.input("cond_in", DType::Bool, Shape::scalar());
    let h = body.input("h", DType::F32, [3, 4]);
    let next = (h.matmul(w) + c * step.cast(DType::F32)).tanh();
    match limit {
        Some(l) => {
            let sum = next.reduce_sum(&[0, 1], false);
            body.output(
                "cond_out",
                body.apply(Op::Binary(BinaryOp::Less), &[Some(sum), Some(l)], 1)[0],
            );
        }
        None => body.output("cond_out", cond.identity()),
    }
    body.output("h_next", next);
    if limit.is_none() {
        body.output("y", next * next.scalar(2.0));
    }
    Subgraph(Arc::new(body.build().unwrap()))
}

/// `x: f32[3,4]` the first state, `b: f32[4]` made into the captured `c`; a Loop of 5 steps (a
/// constant trip count, no condition) gives the last state and the stacked `h * 2` (f32[5,3,4]).
fn counted_loop(trip: Option<i64>) -> Graph {
    let g = GraphBuilder::new("counted_loop");
    let x = g.input("x", DType::F32, [3, 4]);
    let b = g.input("b", DType::F32, [4]);
    let n = match trip {
        Some(t) => g.constant("n", Tensor::scalar::<i64>(t)),
        None => g.input("n", DType::I64, Shape::scalar()),
    };
    let w = g.constant("w", Tensor::random(DType::F32, &[4, 4], 7));
    let c = b.sigmoid();
    let l = kiln_ir::op::Loop { body: loop_body(false), captures: 2 };
    let out = g.apply(Op::Loop(Box::new(l)), &[Some(w), Some(c), Some(n), None, Some(x)], 2);
    g.output("h_last", out[0].named("loop"));
    g.output("ys", out[1].exp());
    g.build().unwrap()
}

#[test]
fn a_loop_runs_its_body_per_step_and_stacks_its_slices() {
    // 60 steps: too long to unroll, so the host runs the one compiled body.
    let graph = counted_loop(Some(60));
    assert_eq!(graph.value_type(graph.outputs()[1].1).to_string(), "f32[60,3,4]");
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, true).unwrap();
    let plan =
        compiled.stages[kiln_compiler::Stage::Fused].split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("counted_loop_control_split", plan);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "loop.kiln").unwrap();
    // The loop step is checked at load: its trip count must be one i64.
    let mut bad = art.clone();
    if let Some(Step::Loop { trip_count, .. }) =
        bad.manifest.control.as_mut().map(|c| &mut c.steps[1])
    {
        *trip_count = Some(2);
    }
    assert_eq!(
        bad.validate().unwrap_err(),
        "step 1: the trip count `sigmoid` is f32[4], not one i64"
    );
    let x = vec![Tensor::random(DType::F32, &[3, 4], 1), Tensor::random(DType::F32, &[4], 2)];
    let want = eval::run(&graph, &x).unwrap();
    assert_eq!(want[1].dims(), &[60, 3, 4]);
    for threads in [1, 2] {
        let exe = Executable::load(
            art.clone(),
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .unwrap();
        close(&exe.run(&x).unwrap(), &want, &format!("{threads} threads"));
    }
}

#[test]
fn a_loop_runs_on_opencl() {
    if !kiln_runtime::list_devices().iter().any(|d| d.target == Target::Opencl && d.usable) {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the Loop on OpenCL was not checked");
        return;
    }
    let graph = counted_loop(Some(60));
    let options = Options { cache: false, target: TargetKind::Opencl, ..Options::default() };
    let exe = Executable::load(
        compile(&graph, &options, false).unwrap().artifact,
        &LoadOptions::default(),
    )
    .unwrap();
    let x = vec![Tensor::random(DType::F32, &[3, 4], 1), Tensor::random(DType::F32, &[4], 2)];
    close(&exe.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), "opencl");
}

#[test]
fn a_short_counted_loop_is_unrolled() {
    let x = vec![Tensor::random(DType::F32, &[3, 4], 1), Tensor::random(DType::F32, &[4], 2)];
    let graph = counted_loop(Some(3));
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, true).unwrap();
    assert!(
        !compiled.stages[kiln_compiler::Stage::Graph].contains("Loop(")
            && compiled.artifact.manifest.control.is_none(),
        "{}",
        &compiled.stages[kiln_compiler::Stage::Graph]
    );
    let exe = Executable::load(compiled.artifact, &LoadOptions::default()).unwrap();
    let want = eval::run(&graph, &x).unwrap();
    assert_eq!(want[1].dims(), &[3, 3, 4]);
    close(&exe.run(&x).unwrap(), &want, "unrolled");
    // A trip count given at run time sizes the stacked result: it is a shape-deciding input,
    // bound when its value is known.
    let graph = counted_loop(None);
    let e = compile(&graph, &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("refused");
    assert!(matches!(e, CompileError::DynamicShapes(_)), "{e}");
    assert!(e.to_string().contains("the result shapes depend on the values of `n`"), "{e}");
    let mut o = Options { cache: false, ..Options::default() };
    o.input_values.insert("n".into(), Tensor::scalar::<i64>(2));
    let exe =
        Executable::load(compile(&graph, &o, false).unwrap().artifact, &LoadOptions::default())
            .unwrap();
    let mut x2 = x.clone();
    x2.push(Tensor::scalar::<i64>(2));
    let want = eval::run(&graph, &x2).unwrap();
    assert_eq!(want[1].dims(), &[2, 3, 4]);
    close(&exe.run(&x).unwrap(), &want, "bound trip count");
}

/// A while loop: no trip count, the condition `sum(h) < limit` computed from the state and a
/// run-time limit, so the number of steps is decided per run by the data (a limit over 12 never
/// stops it: `h` is a tanh of 12 elements).
fn while_loop() -> Graph {
    let g = GraphBuilder::new("while_loop");
    let x = g.input("x", DType::F32, [3, 4]);
    let b = g.input("b", DType::F32, [4]);
    let limit = g.input("limit", DType::F32, Shape::scalar());
    let go =
        g.apply(Op::Binary(BinaryOp::Less), &[Some(x.reduce_sum(&[0, 1], false)), Some(limit)], 1)
            [0];
    let w = g.constant("w", Tensor::random(DType::F32, &[4, 4], 7));
    let l = kiln_ir::op::Loop { body: loop_body(true), captures: 3 };
    let out = g.apply(
        Op::Loop(Box::new(l)),
        &[Some(w), Some(b), Some(limit), None, Some(go), Some(x)],
        1,
    );
    g.output("h_last", out[0]);
    g.build().unwrap()
}

/// The body is compiled once; the data decides each run's steps.
#[test]
fn a_while_loop_stops_when_its_body_says() {
    let graph = while_loop();
    let exe = kiln_compiler::jit(
        &graph,
        &Options { cache: false, ..Options::default() },
        &LoadOptions::default(),
    )
    .unwrap();
    let ones = Tensor::from_f64s(DType::F32, &[4], &[0.1; 4]).unwrap();
    let mut distinct = std::collections::HashSet::new();
    for limit in [-100.0, 2.0, 6.0, 9.0] {
        let x =
            vec![Tensor::zeros(DType::F32, &[3, 4]), ones.clone(), Tensor::scalar::<f32>(limit)];
        let want = eval::run(&graph, &x).unwrap();
        close(&exe.run(&x).unwrap(), &want, &format!("limit {limit}"));
        distinct.insert(want[0].to_f64s().iter().map(|v| (v * 1e4) as i64).collect::<Vec<_>>());
    }
    assert!(distinct.len() >= 3, "the limits stop the loop after different numbers of steps");
}

/// With `max_loop_steps`, a Loop whose condition never turns false fails the run at the limit,
/// naming the node, compiled for the CPU and on the interpreter alike; one that ends within the
/// limit runs as it does without one.
#[test]
fn a_loop_that_never_ends_stops_at_max_loop_steps() {
    let graph = while_loop();
    let node = graph.node(graph.outputs()[0].1.node).name.clone();
    let exe = kiln_compiler::jit(
        &graph,
        &Options { cache: false, ..Options::default() },
        &LoadOptions { max_loop_steps: Some(50), ..Default::default() },
    )
    .unwrap();
    let x = |limit: f32| {
        let ones = Tensor::from_f64s(DType::F32, &[4], &[0.1; 4]).unwrap();
        vec![Tensor::zeros(DType::F32, &[3, 4]), ones, Tensor::scalar::<f32>(limit)]
    };
    let e = exe.run(&x(100.0)).unwrap_err();
    assert!(matches!(e, kiln_runtime::RuntimeError::LoopLimit { limit: 50, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("Loop `{node}` reached the limit of 50 steps without ending (--max-loop-steps / LoadOptions::max_loop_steps: raise it, or leave it unset for no limit)")
    );
    let limited = eval::EvalOptions { max_loop_steps: Some(50) };
    let e = eval::run_with(&graph, &x(100.0), &limited).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("evaluating node `{node}` (Loop): reached the limit of 50 steps without ending (--max-loop-steps / EvalOptions::max_loop_steps: raise it, or leave it unset for no limit)")
    );
    // Loops that end within the limit (after 0 steps and more), on the same executable.
    for limit in [-100.0, 2.0, 6.0, 9.0] {
        let want = eval::run(&graph, &x(limit)).unwrap();
        assert_eq!(eval::run_with(&graph, &x(limit), &limited).unwrap(), want);
        close(&exe.run(&x(limit)).unwrap(), &want, &format!("limit {limit}"));
    }
}
