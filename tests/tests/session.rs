//! `Session`: a model compiled for what each run brings. A GPT-style decoder's KV cache grows a
//! position a step; padded to a capacity, 32 steps compile twice (capacities 16 and 32) and every
//! step matches the interpreter. A symbol that cannot be padded is compiled per size instead. The
//! same padding makes one artifact for every length up to a capacity (`--max-size`).

use kiln_compiler::pad;
use kiln_compiler::{Options, Session, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, models, DType, Dim, Tensor};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::{Executable, LoadOptions, Target};

fn close(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "{what}, output {k}");
        for (a, b) in g.to_f64s().iter().zip(w.to_f64s()) {
            assert!((a - b).abs() <= 1e-4 + 1e-4 * b.abs(), "{what}, output {k}: {a} vs {b}");
        }
    }
}

#[test]
fn a_decoder_with_a_growing_kv_cache_compiles_twice_in_32_steps() {
    let (layers, heads, head_dim) = (2, 4, 16);
    let graph = models::gpt_decoder_step(layers, heads, head_dim, 3).unwrap();
    let probe = graph
        .inputs()
        .iter()
        .map(|&id| {
            let n = graph.node(id);
            (
                n.name.clone(),
                n.outputs[0].shape.dims().iter().map(|d| d.fixed().unwrap_or(13)).collect(),
            )
        })
        .collect();
    let plan = pad::plan(&graph, "past", &probe).unwrap();
    insta::assert_snapshot!("decoder_pad_plan", plan.to_string());
    for threads in [1, 2] {
        let mut session = Session::new(
            graph.clone(),
            Options { cache: false, ..Options::default() },
            LoadOptions { threads: Some(threads), ..Default::default() },
        );
        let mut cache: Vec<Tensor> =
            (0..2 * layers).map(|_| Tensor::zeros(DType::F32, &[1, heads, 0, head_dim])).collect();
        for step in 0..32 {
            let mut inputs =
                vec![Tensor::random(DType::F32, &[1, 1, heads * head_dim], 100 + step)];
            inputs.extend(cache.iter().cloned());
            let got = session.run(&inputs).unwrap();
            let want = eval::run(&graph, &inputs).unwrap();
            close(&got, &want, &format!("step {step}, {threads} threads"));
            assert_eq!(got[1].dims(), &[1, heads, step as usize + 1, head_dim]);
            cache = got[1..].to_vec();
        }
        assert_eq!(session.compiles(), 2, "capacities 16 and 32");
    }
}

#[test]
fn the_padded_decoder_runs_on_opencl() {
    if !kiln_runtime::list_devices().iter().any(|d| d.target == Target::Opencl && d.usable) {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the padded decoder on OpenCL was not checked");
        return;
    }
    let (layers, heads, head_dim) = (1, 2, 8);
    let graph = models::gpt_decoder_step(layers, heads, head_dim, 5).unwrap();
    let options = Options { cache: false, target: TargetKind::Opencl, ..Options::default() };
    let mut session = Session::new(graph.clone(), options, LoadOptions::default());
    let mut cache: Vec<Tensor> =
        (0..2 * layers).map(|_| Tensor::zeros(DType::F32, &[1, heads, 0, head_dim])).collect();
    for step in 0..18 {
        let mut inputs = vec![Tensor::random(DType::F32, &[1, 1, heads * head_dim], 200 + step)];
        inputs.extend(cache.iter().cloned());
        let got = session.run(&inputs).unwrap();
        close(&got, &eval::run(&graph, &inputs).unwrap(), &format!("opencl step {step}"));
        cache = got[1..].to_vec();
    }
    assert_eq!(session.compiles(), 2, "capacities 16 and 32");
}

#[test]
fn a_symbol_that_cannot_be_padded_is_compiled_per_size() {
    // A sum over the symbolic axis reads the padding: each length gets its own program.
    let g = GraphBuilder::new("sum_over_past");
    let x = g.input("x", DType::F32, vec![Dim::sym("past"), 8.into()]);
    g.output("s", x.reduce_sum(&[0], false).named("total"));
    let graph = g.build().unwrap();
    let probe = [("x".to_string(), vec![13, 8])].into_iter().collect();
    assert_eq!(
        pad::plan(&graph, "past", &probe).unwrap_err(),
        "ReduceSum `total` reads a value padded along `past`, which kiln does not pad through"
    );
    let mut session = Session::new(
        graph.clone(),
        Options { cache: false, ..Options::default() },
        LoadOptions::default(),
    );
    for (i, n) in [3, 5, 3, 7].into_iter().enumerate() {
        let x = vec![Tensor::random(DType::F32, &[n, 8], i as u64)];
        close(&session.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("length {n}"));
    }
    assert_eq!(session.compiles(), 3);
    assert!(session.not_padded("past").is_some());
    // Inputs that contradict the model are refused, naming them.
    let e = session.run(&[Tensor::zeros(DType::F32, &[3, 9])]).unwrap_err().to_string();
    assert_eq!(e, "input `x` is f32[past,8], got f32[3,9]");
    // At most so many programs stay loaded (each holds its code, scratch and threads): the
    // least recently used goes, and comes back compiled again (through the compile cache, in
    // a user's session) when it is needed.
    assert_eq!(session.loaded_programs(), 3);
    session.set_max_programs(2);
    assert_eq!(session.loaded_programs(), 2);
    for (i, n) in [9, 7, 3].into_iter().enumerate() {
        let x = vec![Tensor::random(DType::F32, &[n, 8], 10 + i as u64)];
        close(&session.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("length {n}"));
        assert!(session.loaded_programs() <= 2);
    }
    // 9 is new; 7 was loaded (used last before); 3 had been dropped (least recently used).
    assert_eq!(session.compiles(), 5);
}

#[test]
fn a_padded_artifact_serves_every_length_up_to_its_capacity() {
    let (layers, heads, head_dim) = (1, 2, 8);
    let graph = models::gpt_decoder_step(layers, heads, head_dim, 9).unwrap();
    let options = Options { cache: false, pad: Some(("past".into(), 32)), ..Options::default() };
    let compiled = kiln_compiler::compile(&graph, &options, true).unwrap();
    assert!(
        compiled.stages[kiln_compiler::Stage::Fused].starts_with("pad `past`\n"),
        "{}",
        &compiled.stages[kiln_compiler::Stage::Fused]
    );
    let art = Artifact::from_bytes(&compiled.artifact.to_bytes(), "decoder.kiln").unwrap();
    let exe = Executable::load(art.clone(), &LoadOptions::default()).unwrap();
    assert_eq!(exe.inputs()[1].dims, vec![1, heads, 32, head_dim]);
    let step = |past: usize| -> Vec<Tensor> {
        let mut x = vec![Tensor::random(DType::F32, &[1, 1, heads * head_dim], past as u64)];
        x.extend((0..2).map(|i| {
            Tensor::random(DType::F32, &[1, heads, past, head_dim], 50 + i + past as u64)
        }));
        x
    };
    for past in [0, 1, 5, 31, 32] {
        let x = step(past);
        close(&exe.run(&x).unwrap(), &eval::run(&graph, &x).unwrap(), &format!("past {past}"));
    }
    // Past the capacity, or lengths that disagree: errors naming the input.
    let e = exe.run(&step(33)).unwrap_err().to_string();
    assert!(
        e.contains("past_key_0") && e.contains("expected f32[1,2,past<=32,8], got f32[1,2,33,8]"),
        "{e}"
    );
    let mut x = step(4);
    x[2] = Tensor::random(DType::F32, &[1, heads, 5, head_dim], 1);
    let e = exe.run(&x).unwrap_err().to_string();
    assert!(e.contains("`past` is 4 in `past_key_0` but 5 here"), "{e}");
    // The description is checked at load.
    let mut bad = art.clone();
    if let Some(p) = bad.manifest.padded.as_mut() {
        p.capacity = 16;
    }
    assert_eq!(
        bad.validate().unwrap_err(),
        "padded input `past_key_0` (f32[1, 2, 32, 8]) has no axis 2 of size 16"
    );
    // A symbol that cannot be padded is a usage error naming the node.
    let g = GraphBuilder::new("sum_over_past");
    let x = g.input("x", DType::F32, vec![Dim::sym("past"), 8.into()]);
    g.output("s", x.reduce_sum(&[0], false).named("total"));
    let e = kiln_compiler::compile(&g.build().unwrap(), &options, false).err().unwrap().to_string();
    assert_eq!(
        e,
        "`past` cannot be padded to a capacity: ReduceSum `total` reads a value padded along `past`, which kiln does not pad through; give its size with --input-shape"
    );
}
