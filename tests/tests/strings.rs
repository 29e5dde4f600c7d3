//! Strings on compiled targets: compiled code holds no strings, so the nodes that compute on
//! them (and what follows) run on the host after the compiled part (`Step::Eval`). A classifier
//! shipped with its labels (float compute, ArgMax, then LabelEncoder to strings) and a graph of
//! strings only, against the interpreter on the CPU through an artifact's bytes and the facade's
//! Session; an artifact whose compiled buffer would hold strings is refused at load.

use kiln_compiler::{compile, Options, TargetKind};
use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::ArgReduce;
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::artifact::{Artifact, Step};
use kiln_runtime::{Executable, LoadOptions};

fn strs(dims: &[usize], v: &[&str]) -> Tensor {
    Tensor::from_strings(dims, v.iter().map(|s| s.to_string()).collect()).unwrap()
}

/// `logits = x @ w`, `label = LabelEncoder(ArgMax(logits))` naming the three classes.
fn classifier() -> Graph {
    let g = GraphBuilder::new("classifier");
    let x = g.input("x", DType::F32, vec![4, 3]);
    let w = g.constant("w", Tensor::random(DType::F32, &[3, 3], 5));
    let logits = x.matmul(w).named("logits");
    let arg = ArgReduce { max: true, axis: 1, keepdims: false, select_last_index: false };
    let class = g.apply(Op::ArgReduce(arg), &[Some(logits)], 1)[0].named("class");
    let encoder = Op::LabelEncoder {
        keys: Tensor::vector(&[0i64, 1, 2]),
        values: strs(&[3], &["cat", "dog", "bird"]),
        default: strs(&[1], &["_Unused"]),
    };
    let label = g.apply(encoder, &[Some(class)], 1)[0].named("label");
    g.output("logits", logits);
    g.output("label", label);
    g.build().unwrap()
}

/// Compiles `graph` for the CPU and loads it back from the artifact's bytes.
fn load(graph: &Graph) -> (Executable, Artifact) {
    let options = Options { cache: false, target: TargetKind::Cpu, ..Options::default() };
    let compiled = compile(graph, &options, false).unwrap();
    let bytes = compiled.artifact.to_bytes();
    let art = Artifact::from_bytes(&bytes, "strings.kiln").unwrap();
    let exe =
        Executable::load(art, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap();
    (exe, compiled.artifact)
}

#[test]
fn a_classifier_names_its_classes_on_the_host_after_the_compiled_part() {
    let graph = classifier();
    let (exe, art) = load(&graph);
    let control = art.manifest.control.as_ref().expect("a host part");
    assert!(matches!(control.steps.last(), Some(Step::Eval { .. })));
    assert_eq!(art.manifest.outputs[1].dtype, "string", "the label output's type is kept");
    for seed in [1, 2, 3] {
        let x = vec![Tensor::random(DType::F32, &[4, 3], seed)];
        let want = eval::run(&graph, &x).unwrap();
        let got = exe.run(&x).unwrap();
        for (a, b) in got[0].to_f64s().iter().zip(want[0].to_f64s()) {
            assert!((a - b).abs() <= 1e-5, "logits: {a} vs {b}");
        }
        assert_eq!(got[1], want[1], "labels, seed {seed}");
        assert!(got[1]
            .strings()
            .unwrap()
            .iter()
            .all(|s| ["cat", "dog", "bird"].contains(&s.as_str())));
    }
}

#[test]
fn a_graph_of_strings_runs_whole_on_the_host() {
    let g = GraphBuilder::new("greeting");
    let a = g.input("a", DType::String, vec![2]);
    let b = g.input("b", DType::String, vec![1]);
    let y = g.apply(Op::StringConcat, &[Some(a), Some(b)], 1)[0];
    let up = Op::StringNormalizer {
        case_change_action: "UPPER".into(),
        is_case_sensitive: false,
        locale: String::new(),
        stopwords: vec!["HELLO!".into()],
    };
    let z = g.apply(up, &[Some(y)], 1)[0];
    g.output("z", z);
    let graph = g.build().unwrap();
    let (exe, _) = load(&graph);
    let x = vec![strs(&[2], &["hello", "bye"]), strs(&[1], &["!"])];
    let got = exe.run(&x).unwrap();
    assert_eq!(got, eval::run(&graph, &x).unwrap());
    assert_eq!(got[0].strings().unwrap(), ["BYE!"]);
}

#[test]
fn an_artifact_with_a_compiled_string_buffer_is_refused_at_load() {
    let g = GraphBuilder::new("double");
    let x = g.input("x", DType::F32, vec![2]);
    g.output("y", (x + x).named("y"));
    let options = Options { cache: false, target: TargetKind::Cpu, ..Options::default() };
    let mut art = compile(&g.build().unwrap(), &options, false).unwrap().artifact;
    art.manifest.inputs[0].dtype = "string".into();
    let e = Artifact::from_bytes(&art.to_bytes(), "bad.kiln").unwrap_err().to_string();
    assert!(e.contains("tensor `x` is of strings") && e.contains("evaluated on the host"), "{e}");
}

#[test]
fn a_session_takes_and_gives_strings() {
    let graph = classifier();
    let x = vec![Tensor::random(DType::F32, &[4, 3], 9)];
    let want = eval::run(&graph, &x).unwrap();
    let mut session = kiln::Session::new(graph, &kiln::Options::new().cache(false).threads(2));
    let got = session.run(&x).unwrap();
    assert_eq!(got[1], want[1]);
    assert_eq!(session.output_names(), ["logits", "label"]);
}
