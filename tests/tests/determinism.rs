//! Determinism as a promise: a compiled model's outputs are bitwise identical whatever the thread
//! count and from run to run, and one executable run from 8 threads at once gives every caller
//! the same bytes. (Work is split into units at compile time, not by the thread count, and each
//! unit's arithmetic is in a fixed order.)

use std::sync::Arc;

use kiln_compiler::{compile, Options};
use kiln_ir::{models, DType, Graph, Tensor};
use kiln_runtime::{Executable, LoadOptions};

fn bits(ts: &[Tensor]) -> Vec<Vec<u8>> {
    ts.iter().map(|t| t.bytes().to_vec()).collect()
}

/// The models: a CNN, an MLP, a decoder step with a KV cache, each with its inputs.
fn cases() -> Vec<(Graph, Vec<Tensor>)> {
    let mut out = vec![
        (models::cifarnet(2, 3).unwrap(), vec![Tensor::random(DType::F32, &[2, 3, 32, 32], 1)]),
        (models::mlp(8, 64, 256, 10, 4).unwrap(), vec![Tensor::random(DType::F32, &[8, 64], 2)]),
    ];
    let decoder = models::gpt_decoder_step(2, 4, 16, 5).unwrap();
    let mut x = vec![Tensor::random(DType::F32, &[1, 1, 64], 3)];
    x.extend((0..4).map(|i| Tensor::random(DType::F32, &[1, 4, 7, 16], 10 + i)));
    let shapes = decoder
        .inputs()
        .iter()
        .zip(&x)
        .map(|(&id, t)| (decoder.node(id).name.clone(), t.dims().to_vec()))
        .collect();
    let mut d = decoder.clone();
    kiln_compiler::passes::specialize::specialize(&mut d, &shapes).unwrap();
    out.push((d, x));
    out
}

#[test]
fn outputs_are_bitwise_identical_at_any_thread_count_and_from_run_to_run() {
    for (graph, x) in cases() {
        let art = compile(&graph, &Options { cache: false, ..Options::default() }, false)
            .unwrap()
            .artifact;
        let mut first: Option<Vec<Vec<u8>>> = None;
        for threads in [1, 2, 3, 4] {
            let exe = Executable::load(
                art.clone(),
                &LoadOptions { threads: Some(threads), ..Default::default() },
            )
            .unwrap();
            for run in 0..3 {
                let got = bits(&exe.run(&x).unwrap());
                match &first {
                    None => first = Some(got),
                    Some(want) => assert!(
                        *want == got,
                        "`{}`: {threads} threads, run {run} differs from 1 thread",
                        graph.name
                    ),
                }
            }
        }
    }
}

#[test]
fn one_executable_run_from_8_threads_at_once_gives_everyone_the_same_bytes() {
    let (graph, x) = cases().remove(0);
    let art =
        compile(&graph, &Options { cache: false, ..Options::default() }, false).unwrap().artifact;
    let exe = Arc::new(
        Executable::load(art, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap(),
    );
    let want = bits(&exe.run(&x).unwrap());
    let x = Arc::new(x);
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (exe, x) = (exe.clone(), x.clone());
            std::thread::spawn(move || {
                (0..25).map(|_| bits(&exe.run(&x).unwrap())).collect::<Vec<_>>()
            })
        })
        .collect();
    for (i, c) in callers.into_iter().enumerate() {
        for (run, got) in c.join().expect("a caller panicked").into_iter().enumerate() {
            assert!(got == want, "caller {i}, run {run}: different bytes");
        }
    }
}
