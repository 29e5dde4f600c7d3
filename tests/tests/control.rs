//! Run-time control flow: an If whose condition is computed from an input (a voice-activity
//! model's sample rate) compiles once into programs and host steps, and each run takes the
//! branch its inputs pick; against the interpreter, on the CPU and OpenCL, inside a symbolic
//! batch; branches of different shapes specialise on the condition instead.

use std::sync::Arc;

use kiln_compiler::{compile, CompileError, Options, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{BinaryOp, Subgraph};
use kiln_ir::{eval, DType, Dim, Graph, Op, Shape, Tensor};
use kiln_runtime::artifact::Artifact;
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
    let op = Op::If { then_branch: branch("then_g", true, 8, 1), else_branch: branch("else_g", false, else_width, 2) };
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
    Options { cache: false, input_shapes: [("x".to_string(), vec![n, 16])].into(), ..Options::default() }
}

#[test]
fn an_if_on_a_computed_condition_compiles_once_and_runs_either_branch() {
    let graph = vad_like(Dim::sym("N"), 8);
    let compiled = compile(&graph, &sized(3), true).unwrap();
    // The split: what runs before the If, the two branches, what runs after it.
    let plan = compiled.stages.fused.split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("vad_like_control_split", plan);
    let control = compiled.artifact.manifest.control.as_ref().expect("control flow in the artifact");
    assert_eq!(control.programs.len(), 4);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "vad.kiln").unwrap();
    for threads in [1, 2] {
        let exe = Executable::load(art.clone(), &LoadOptions { threads: Some(threads), ..Default::default() }).unwrap();
        for sr in [16000, 8000, 16000] {
            let x = inputs(3, sr);
            close(&exe.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("sr {sr}, {threads} threads"));
        }
    }
    // The branches differ, so the runs above did take both.
    let exe = Executable::load(art, &LoadOptions::default()).unwrap();
    let (a, b) = (exe.run(&inputs(3, 16000)).unwrap(), exe.run(&inputs(3, 8000)).unwrap());
    assert_ne!(a[2].to_f64s(), b[2].to_f64s());
    // A wrong input is refused before any program runs.
    let e = exe.run(&[Tensor::random(DType::F32, &[4, 16], 1), Tensor::scalar::<i64>(1)]).unwrap_err().to_string();
    assert!(e.contains("expected f32[3, 16], got f32[4,16]") || e.contains("`x`"), "{e}");
}

#[test]
fn an_if_inside_a_symbolic_batch_runs_any_batch() {
    let graph = vad_like(Dim::sym("N"), 8);
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, false).unwrap();
    let batch = compiled.artifact.manifest.batch.as_ref().expect("a symbolic batch");
    assert!(batch.programs.iter().all(|p| p.manifest.control.is_some()), "each batch size's program has the If's steps");
    let exe = Executable::load(compiled.artifact, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap();
    for (n, sr) in [(1, 16000), (5, 8000), (5, 16000), (8, 8000)] {
        let x = inputs(n, sr);
        close(&exe.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("batch {n}, sr {sr}"));
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
        let options = Options { input_values: [("sr".to_string(), Tensor::scalar::<i64>(sr))].into(), ..sized(3) };
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
    let plan = compiled.stages.fused.split("\n\n").next().unwrap().to_string();
    insta::assert_snapshot!("recurrent_scan_control_split", plan);
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "scan.kiln").unwrap();
    let x = vec![Tensor::random(DType::F32, &[2, 6, 4], 1), Tensor::random(DType::F32, &[2, 4], 2), Tensor::random(DType::F32, &[4], 3)];
    let want = eval::run(&graph, &x).unwrap();
    assert_eq!(want[1].dims(), &[2, 6, 4]);
    for threads in [1, 2] {
        let exe = Executable::load(art.clone(), &LoadOptions { threads: Some(threads), ..Default::default() }).unwrap();
        close(&exe.run(&x).unwrap(), &want, &format!("{threads} threads"));
    }
    // A state that changes shape from step to step cannot have one compiled body.
    let e = compile(&recurrent_scan(true), &Options { cache: false, ..Options::default() }, false).err().expect("refused");
    assert!(e.to_string().contains("state 0 goes in as f32[2,4] and comes out as f32[2,8]"), "{e}");
}
