//! A symbolic batch: one artifact, compiled once without sizes, runs any batch in its range by
//! combining its programs (8, 4, 2, 1), each batch against the interpreter; models whose
//! samples mix are refused with the node that mixes them.

use kiln_compiler::{batch, compile, CompileError, Options};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::{eval, DType, Dim, Graph, Op, Tensor};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::{Executable, LoadOptions};

fn n() -> Dim {
    Dim::sym("N")
}

/// A small CNN over `x: [N, 3, 12, 12]` with a torch-style flatten (the target shape computed
/// from `Shape(x)`), plus a second batched input added to the logits.
fn cnn() -> Graph {
    let g = GraphBuilder::new("cnn");
    let x = g.input("x", DType::F32, vec![n(), 3.into(), 12.into(), 12.into()]);
    let bias = g.input("bias", DType::F32, vec![n(), 10.into()]);
    let w = g.constant("w", Tensor::random(DType::F32, &[8, 3, 3, 3], 1));
    let b = g.constant("b", Tensor::random(DType::F32, &[8], 2));
    let y = x.conv(w, Some(b), ConvOptions::default().pad(1)).relu().max_pool(2, 2, 0);
    let shape = g.apply(Op::Shape { start: 0, end: Some(1) }, &[Some(y)], 1)[0];
    let target =
        g.concat(&[shape, g.constant("rest", Tensor::from_vec(&[1], vec![-1i64]).unwrap())], 0);
    let flat = g.apply(Op::Reshape { allowzero: false }, &[Some(y), Some(target)], 1)[0];
    let fc = g.constant("fc", Tensor::random(DType::F32, &[10, 8 * 6 * 6], 3));
    let fb = g.constant("fb", Tensor::random(DType::F32, &[10], 4));
    g.output("y", (flat.linear(fc, fb) + bias).softmax(1));
    g.build().unwrap()
}

fn inputs(n: usize) -> Vec<Tensor> {
    vec![
        Tensor::random(DType::F32, &[n, 3, 12, 12], 10 + n as u64),
        Tensor::random(DType::F32, &[n, 10], 20 + n as u64),
    ]
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.ty(), want.ty(), "{what}");
    for (a, b) in got.to_f64s().iter().zip(want.to_f64s()) {
        assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "{what}: {a} vs {b}");
    }
}

#[test]
fn one_artifact_compiled_without_sizes_runs_batch_1_5_8_and_13() {
    let graph = cnn();
    let plan = batch::plan(&graph, &Options::default()).unwrap().expect("a symbolic batch");
    assert_eq!(
        plan.to_string(),
        "batch `N` in 1..\n  batched inputs: x, bias\n  programs for batch 8, 4, 2, 1"
    );
    let compiled = compile(&graph, &Options { cache: false, ..Options::default() }, false).unwrap();
    let desc = compiled.artifact.manifest.batch.clone().expect("a batched artifact");
    assert_eq!(desc.programs.iter().map(|p| p.batch).collect::<Vec<_>>(), vec![8, 4, 2, 1]);
    // Through the file format, as `kiln compile` writes it and the runtime reads it.
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "cnn.kiln").unwrap();
    for threads in [1, 2] {
        let exe = Executable::load(
            art.clone(),
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .unwrap();
        assert_eq!(exe.inputs()[0].dims, vec![1, 3, 12, 12], "one sample's sizes");
        for n in [1, 5, 8, 13] {
            let x = inputs(n);
            let want = eval::run(&graph, &x).unwrap();
            let got = exe.run(&x).unwrap();
            close(&got[0], &want[0], &format!("batch {n}, {threads} threads"));
        }
    }
    // A constant every program holds the same (a weight packed the same way) is stored once.
    let blobs: Vec<(u64, u64)> = desc
        .programs
        .iter()
        .flat_map(|p| p.manifest.buffers.iter())
        .filter_map(|b| match b.kind {
            kiln_runtime::artifact::BufferKind::Constant(blob) => Some((blob.offset, blob.len)),
            _ => None,
        })
        .collect();
    let mut distinct = blobs.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() * 2 <= blobs.len(),
        "{} distinct constant blobs of {}",
        distinct.len(),
        blobs.len()
    );
}

#[test]
fn a_batch_range_bounds_the_programs_and_the_runs() {
    let graph = cnn();
    let options = Options {
        cache: false,
        batch_ranges: [("x".to_string(), (1, 4, vec![0, 3, 12, 12]))].into(),
        ..Options::default()
    };
    let compiled = compile(&graph, &options, false).unwrap();
    let desc = compiled.artifact.manifest.batch.clone().unwrap();
    assert_eq!(desc.programs.iter().map(|p| p.batch).collect::<Vec<_>>(), vec![4, 2, 1]);
    let exe = Executable::load(compiled.artifact, &LoadOptions::default()).unwrap();
    let x = inputs(3);
    close(&exe.run(&x).unwrap()[0], &eval::run(&graph, &x).unwrap()[0], "batch 3 of 1..4");
    // Out of range, batched inputs that disagree, a wrong sample shape: errors that say which.
    let e = exe.run(&inputs(5)).unwrap_err().to_string();
    assert!(e.contains("batch `N` = 5 is outside the range 1..4"), "{e}");
    let mut x = inputs(3);
    x[1] = Tensor::random(DType::F32, &[2, 10], 1);
    let e = exe.run(&x).unwrap_err().to_string();
    assert!(e.contains("`N` is 3 in `x` but 2 here"), "{e}");
    x[1] = Tensor::random(DType::F32, &[3, 11], 1);
    let e = exe.run(&x).unwrap_err().to_string();
    assert!(e.contains("expected f32[N,10], got f32[3,11]"), "{e}");
}

fn refusal(graph: &Graph) -> String {
    match compile(graph, &Options { cache: false, ..Options::default() }, false) {
        Err(e @ CompileError::NotBatchable { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("compiled a graph that mixes samples"),
    }
}

#[test]
fn models_that_mix_samples_are_refused_naming_the_node() {
    // A mean over the batch.
    let g = GraphBuilder::new("m");
    let x = g.input("x", DType::F32, vec![n(), 8.into()]);
    g.output("y", x - x.reduce_mean(&[0], true).named("batch_mean"));
    let e = refusal(&g.build().unwrap());
    assert!(e.contains("input `x` has the symbolic batch `N`, but node `batch_mean` (ReduceMean) works along the batch axis (axes 0)"), "{e}");
    // The batch size used as a value.
    let g = GraphBuilder::new("m");
    let x = g.input("x", DType::F32, vec![n(), 8.into()]);
    let size = g.apply(Op::Shape { start: 0, end: Some(1) }, &[Some(x)], 1)[0].cast(DType::F32);
    g.output("y", (x / size).named("per_batch"));
    let e = refusal(&g.build().unwrap());
    assert!(e.contains("node `per_batch` (Div) uses the batch size as a value"), "{e}");
    // A constant reshape that fixes the batch (an export traced at batch 2).
    let g = GraphBuilder::new("m");
    let x = g.input("x", DType::F32, vec![n(), 4.into(), 2.into()]);
    g.output("y", x.reshape(&[2, 8]).named("fixed"));
    let e = refusal(&g.build().unwrap());
    assert!(e.contains("the model does not hold for a batch of 7 (node `fixed` (Reshape): cannot reshape f32[7,4,2]"), "{e}");
    // Rows of a matrix product that mix samples: x^T x.
    let g = GraphBuilder::new("m");
    let x = g.input("x", DType::F32, vec![n(), 4.into()]);
    g.output("y", x.transpose(&[1, 0]).named("xt").matmul(x));
    let e = refusal(&g.build().unwrap());
    assert!(e.contains("node `xt` (Transpose) moves the batch axis (perm [1, 0])"), "{e}");
}

#[test]
fn given_sizes_still_compile_one_static_program() {
    let compiled = compile(
        &cnn(),
        &Options {
            cache: false,
            input_shapes: [("x".into(), vec![5, 3, 12, 12]), ("bias".into(), vec![5, 10])].into(),
            ..Options::default()
        },
        false,
    )
    .unwrap();
    assert!(compiled.artifact.manifest.batch.is_none());
    assert_eq!(compiled.artifact.manifest.inputs[0].dims, vec![5, 3, 12, 12]);
}
