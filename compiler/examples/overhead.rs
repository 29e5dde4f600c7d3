//! The per-call time of `Executable::run` on a model (an ONNX file whose inputs are static), for
//! comparison with the Python package's `InferenceSession.run` (`make python-overhead`):
//! `overhead MODEL.onnx [CALLS]` prints the median of 15 rounds' mean per-call microseconds.

use kiln_compiler::{jit, Options};
use kiln_ir::{DType, Tensor};
use kiln_runtime::LoadOptions;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: overhead MODEL.onnx [CALLS]");
    let calls: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let graph = kiln_ir::onnx::load(path).expect("an ONNX model").graph;
    let exe =
        jit(&graph, &Options::default(), &LoadOptions { threads: Some(1), ..Default::default() })
            .expect("it compiles");
    let inputs: Vec<Tensor> = exe
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Tensor::random(DType::from_name(&d.dtype).expect("a kiln dtype"), &d.dims, i as u64)
        })
        .collect();
    let mut rounds = Vec::new();
    for _ in 0..15 {
        let start = std::time::Instant::now();
        for _ in 0..calls {
            std::hint::black_box(exe.run(&inputs).expect("it runs"));
        }
        rounds.push(start.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    rounds.sort_by(f64::total_cmp);
    println!("{:.3}", rounds[rounds.len() / 2]);
}
