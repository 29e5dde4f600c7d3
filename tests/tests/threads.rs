//! CPU code planned for more threads than this machine has (issue 33): a kernel with enough work
//! splits into about two work units a planned thread (`Options::threads`, `kiln compile
//! --threads`), pinned here as each kernel's workgroup count at 2, 16 and 64 threads; and an
//! artifact planned for 64 threads gives bitwise the same outputs at 1, 2 and 16 run-time threads,
//! matching the interpreter.

use std::collections::HashMap;

use kiln_compiler::{compile, Options, Stage};
use kiln_ir::{eval, Graph, Tensor};
use kiln_runtime::{Executable, LoadOptions};

/// A model, the input sizes it is compiled for, and inputs of those sizes.
struct Model {
    graph: Graph,
    shapes: HashMap<String, Vec<usize>>,
    inputs: Vec<Tensor>,
}

/// The models: convolutions, pooling and a classifier (cifarnet at batch 1 and 8), a transformer
/// decoder step over 63 cached positions (attention, norms, matrix products) and a wide MLP.
fn models() -> Vec<Model> {
    let mut out = Vec::new();
    for graph in [
        kiln_ir::models::cifarnet(1, 1).unwrap(),
        kiln_ir::models::cifarnet(8, 2).unwrap(),
        kiln_ir::models::gpt_decoder_step(2, 4, 32, 3).unwrap(),
        kiln_ir::models::mlp(64, 512, 1024, 256, 4).unwrap(),
    ] {
        let mut shapes = HashMap::new();
        let mut inputs = Vec::new();
        for (i, &id) in graph.inputs().iter().enumerate() {
            let node = graph.node(id);
            let ty = &node.outputs[0];
            let dims: Vec<usize> =
                ty.shape.dims().iter().map(|d| d.fixed().unwrap_or(63)).collect();
            inputs.push(Tensor::random(ty.dtype, &dims, 10 + i as u64));
            shapes.insert(node.name.clone(), dims);
        }
        out.push(Model { graph, shapes, inputs });
    }
    out
}

fn options(m: &Model, threads: usize) -> Options {
    Options {
        cache: false,
        threads: Some(threads),
        input_shapes: m.shapes.clone(),
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    }
}

/// Each kernel's workgroups in the schedule, in order.
fn workgroups(schedule: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    let mut kernel = String::new();
    for line in schedule.lines() {
        if let Some(name) = line.strip_prefix("kernel ") {
            kernel = name.to_string();
        } else if let Some(rest) = line.trim_start().strip_prefix("workgroups: ") {
            let n = rest.split([' ', ',']).next().and_then(|n| n.parse().ok());
            out.push((kernel.clone(), n.expect("a workgroup count")));
        }
    }
    out
}

// The plans at 2, 16 and 64 threads, as a snapshot; more threads never fewer units, and the
// kernels with the most work get many more.
#[test]
fn kernels_split_into_units_for_the_threads_they_are_planned_for() {
    let mut table = String::new();
    for m in models() {
        let g = &m.graph;
        let per: Vec<Vec<(String, u64)>> = [2, 16, 64]
            .iter()
            .map(|&t| {
                let c = compile(g, &options(&m, t), true).unwrap();
                workgroups(&c.stages[Stage::Schedule])
            })
            .collect();
        assert!(per.iter().all(|p| p.len() == per[0].len()), "the same kernels at every count");
        table.push_str(&format!("{}: workgroups at 2 / 16 / 64 threads\n", g.name));
        for (((name, at2), (_, at16)), (_, at64)) in per[0].iter().zip(&per[1]).zip(&per[2]) {
            let (at16, at64) = (*at16, *at64);
            assert!(*at2 <= at16 && at16 <= at64, "{name}: {at2} / {at16} / {at64}");
            table.push_str(&format!("  {name}: {at2} / {at16} / {at64}\n"));
        }
        // Where the work allows (the MLP's 64 x 1024 x 512 products), two units a thread; a
        // batch of 8 images' convolutions, many more than at 2 threads.
        let most = |p: &[(String, u64)]| p.iter().map(|(_, n)| *n).max().unwrap_or(1);
        if g.name == "mlp" {
            assert!(most(&per[1]) >= 32 && most(&per[2]) >= 128, "{table}");
        }
        if g.name == "cifarnet" && most(&per[0]) >= 4 {
            assert!(most(&per[1]) >= 3 * most(&per[0]).min(4), "{table}");
        }
    }
    insta::assert_snapshot!("workgroups_by_planned_threads", table);
}

// One artifact planned for 64 threads: the same bits at 1, 2 and 16 run-time threads (units
// are claimed in any order, but each computes the same outputs the same way), and the
// interpreter's numbers.
#[test]
fn code_planned_for_64_threads_runs_bitwise_alike_at_any_thread_count() {
    for m in models() {
        let (g, x) = (&m.graph, &m.inputs);
        let compiled = compile(g, &options(&m, 64), false).unwrap();
        let want = eval::run(g, x).unwrap();
        let mut first: Option<Vec<Tensor>> = None;
        for threads in [1, 2, 16] {
            let load = LoadOptions { threads: Some(threads), ..Default::default() };
            let exe = Executable::load(compiled.artifact.clone(), &load).unwrap();
            let got = exe.run(x).unwrap();
            for (a, b) in got.iter().zip(&want) {
                for (j, (p, q)) in a.to_f64s().iter().zip(b.to_f64s()).enumerate() {
                    assert!(
                        (p - q).abs() <= 1e-4 + 1e-3 * q.abs(),
                        "{}: element {j}: {p}, the interpreter {q} ({threads} threads)",
                        g.name
                    );
                }
            }
            match &first {
                None => first = Some(got),
                Some(f) => {
                    for (a, b) in f.iter().zip(&got) {
                        assert!(
                            a.bytes() == b.bytes(),
                            "{}: other bits at {threads} threads",
                            g.name
                        );
                    }
                }
            }
        }
    }
}

/// Two GRUs over two inputs, as the seed's model has them: nothing connects them.
fn two_grus() -> (Graph, Vec<Tensor>) {
    use kiln_ir::builder::GraphBuilder;
    use kiln_ir::op::{Rnn, RnnCell, RnnDirection};
    use kiln_ir::{DType, Op};
    let g = GraphBuilder::new("two_grus");
    let mut inputs = Vec::new();
    for i in 0..2u64 {
        let x = g.input(&format!("x{i}"), DType::F32, [5, 32, 10]);
        let c = |name: &str, dims: &[usize], seed| {
            g.constant(&format!("{name}{i}"), Tensor::random(DType::F32, dims, seed + 10 * i))
        };
        let (w, r, b) = (c("w", &[1, 60, 10], 1), c("r", &[1, 60, 20], 2), c("b", &[1, 120], 3));
        let rnn = Rnn {
            cell: RnnCell::Gru { linear_before_reset: true },
            direction: RnnDirection::Forward,
            hidden_size: 20,
            activations: vec![],
            clip: None,
            batch_first: false,
        };
        let y = g.apply(Op::Rnn(rnn), &[Some(x), Some(w), Some(r), Some(b)], 2);
        g.output(&format!("y{i}"), y[0]);
        g.output(&format!("h{i}"), y[1]);
        inputs.push(Tensor::random(DType::F32, &[5, 32, 10], 20 + i));
    }
    (g.build().unwrap(), inputs)
}

// Independent kernels at once: the two GRUs go to the CPU's threads as one group (the profile
// puts them on the pool's track, each beside the other), with the same bits at 1 and 2 threads
// and the interpreter's numbers.
#[test]
fn independent_recurrent_layers_run_at_once() {
    let (g, x) = two_grus();
    let options = Options {
        cache: false,
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    };
    let compiled = compile(&g, &options, false).unwrap();
    let want = eval::run(&g, &x).unwrap();
    let mut first: Option<Vec<Tensor>> = None;
    for threads in [1, 2] {
        let load = LoadOptions { threads: Some(threads), ..Default::default() };
        let exe = Executable::load(compiled.artifact.clone(), &load).unwrap();
        let mut profile = kiln_runtime::Profile::default();
        let got = exe.run_profiled(&x, Some(&mut profile)).unwrap();
        for (a, b) in got.iter().zip(&want) {
            for (p, q) in a.to_f64s().iter().zip(b.to_f64s()) {
                assert!((p - q).abs() <= 1e-5 + 1e-4 * q.abs(), "{p} against {q}");
            }
        }
        match &first {
            None => first = Some(got),
            Some(f) => assert!(f.iter().zip(&got).all(|(a, b)| a.bytes() == b.bytes())),
        }
        let grus: Vec<usize> = (0..profile.launches.len())
            .filter(|&i| profile.launches[i].0.contains("GRU"))
            .collect();
        assert_eq!(grus.len(), 2, "{:?}", profile.launches);
        for &i in &grus {
            assert_eq!(profile.tracks[i], kiln_runtime::Track::CpuPool, "{:?}", profile.launches);
        }
    }
}
