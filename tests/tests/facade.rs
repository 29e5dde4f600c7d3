//! The `kiln` crate a host program uses: inputs by name in any order, each mistake an error
//! naming the input and the model's inputs, errors whose source chain reaches the cause, and
//! sessions and artifacts that give what the interpreter gives.

// The crate's documented examples, compiled here (a binary each would be ~440 MB in debug).
#[allow(dead_code)] // its `main` reads the command line, which is the test harness's here
#[path = "../../kiln/examples/aot.rs"]
mod aot_example;
#[path = "../../kiln/examples/jit.rs"]
mod jit_example;

use kiln::builder::GraphBuilder;
use kiln::{DType, Dim, Options, Session, Tensor};
use kiln_ir::eval;

fn two_inputs() -> kiln::Graph {
    let g = GraphBuilder::new("pair");
    let a = g.input("a", DType::F32, vec![Dim::sym("N"), Dim::from(3)]);
    let b = g.input("b", DType::F32, [3]);
    g.output("sum", a + b);
    g.output("scaled", (a * b).relu());
    g.build().unwrap()
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text += &format!(": {s}");
        source = s.source();
    }
    text
}

#[test]
fn inputs_by_name_in_any_order_give_the_interpreters_outputs_by_name() {
    let graph = two_inputs();
    let (a, b) = (Tensor::random(DType::F32, &[4, 3], 1), Tensor::random(DType::F32, &[3], 2));
    let want = eval::run(&graph, &[a.clone(), b.clone()]).unwrap();
    let options = Options::new().cache(false).threads(2).input_shape("a", [4, 3]);
    let model = kiln::jit(&graph, &options).unwrap();
    let got = model.run_named(&[("b", b.clone()), ("a", a.clone())]).unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["sum", "scaled"]);
    for ((_, g), w) in got.iter().zip(&want) {
        assert_eq!(g.to_f64s(), w.to_f64s());
    }
    let mut session = Session::new(graph, &Options::new().cache(false).threads(2));
    assert_eq!(session.input_names(), ["a", "b"]);
    for n in [1, 6] {
        let a = Tensor::random(DType::F32, &[n, 3], 3);
        let got = session.run_named(&[("a", a.clone()), ("b", b.clone())]).unwrap();
        assert_eq!(got[0].1.dims(), [n, 3]);
    }
}

#[test]
fn wrong_names_and_bad_input_are_errors_that_say_which() {
    let options = Options::new().cache(false).input_shape("a", [2, 3]);
    let model = kiln::jit(&two_inputs(), &options).unwrap();
    let (a, b) = (Tensor::random(DType::F32, &[2, 3], 1), Tensor::random(DType::F32, &[3], 2));
    let e = model.run_named(&[("a", a.clone()), ("c", b.clone())]).err().unwrap().to_string();
    assert!(e.ends_with("it has no input `c` (its inputs: a, b)"), "{e}");
    let e = model.run_named(&[("a", a.clone())]).err().unwrap().to_string();
    assert!(e.ends_with("input `b` is missing (its inputs: a, b)"), "{e}");
    let e = model.run_named(&[("a", a.clone()), ("a", a), ("b", b.clone())]).err().unwrap();
    assert!(e.to_string().ends_with("input `a` is given twice"), "{e}");
    let wrong = Tensor::random(DType::F32, &[2, 4], 3);
    let e = model.run_named(&[("a", wrong), ("b", b)]).err().unwrap();
    let text = chain(&e);
    assert!(text.starts_with("running `pair`: ") && text.contains("input `a`"), "{text}");
    let e = kiln::load_onnx("/nonexistent/model.onnx").err().unwrap();
    assert!(chain(&e).starts_with("/nonexistent/model.onnx: cannot load the ONNX model: "), "{e}");
    let e = kiln::load_artifact("/nonexistent/m.kiln", &Options::new()).err().unwrap();
    assert!(chain(&e).starts_with("/nonexistent/m.kiln: cannot read the artifact: "), "{e}");
}

#[test]
fn an_artifact_saved_and_loaded_runs_as_the_jit_does() {
    let graph = two_inputs();
    let options = Options::new().cache(false).input_shape("a", [5, 3]);
    let dir = std::env::temp_dir().join(format!("kiln-facade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pair.kiln");
    kiln::save_artifact(&kiln::compile(&graph, &options).unwrap(), &path).unwrap();
    let loaded = kiln::load_artifact(&path, &options).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let inputs =
        [("a", Tensor::random(DType::F32, &[5, 3], 4)), ("b", Tensor::random(DType::F32, &[3], 5))];
    let jit = kiln::jit(&graph, &options).unwrap().run_named(&inputs).unwrap();
    let aot = loaded.run_named(&inputs).unwrap();
    for ((_, x), (_, y)) in jit.iter().zip(&aot) {
        assert_eq!(x.to_f64s(), y.to_f64s());
    }
    let e = kiln::save_artifact(&kiln::compile(&graph, &options).unwrap(), "/nonexistent/x.kiln");
    assert!(chain(&e.err().unwrap()).starts_with("/nonexistent/x.kiln: cannot write the artifact"));
}

#[test]
fn the_crate_docs_examples_run() {
    aot_example::run(None).expect("examples/aot.rs");
    jit_example::main().expect("examples/jit.rs");
}
