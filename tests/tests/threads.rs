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
