//! Random graphs of supported ops: compiled code must agree with the interpreter.

use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::op::ReduceKind;
use kiln_ir::{BinaryOp, DType, Graph, Tensor, UnaryOp};
use proptest::prelude::*;

use crate::compile::check_against_eval;

#[derive(Clone, Debug)]
enum Step {
    Unary(u8, u8),
    Binary(u8, u8, u8),
    Scale(u8, i8),
    Bias(u8, u64),
    Reduce(u8, u8, bool),
    Transpose(u8),
    Reshape(u8),
    Concat(u8),
    Softmax(u8),
    MatMulT(u8),
    Slice(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Step::Unary(a, b)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c)| Step::Binary(a, b, c)),
        (any::<u8>(), any::<i8>()).prop_map(|(a, k)| Step::Scale(a, k)),
        (any::<u8>(), any::<u64>()).prop_map(|(a, s)| Step::Bias(a, s)),
        (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, k)| Step::Reduce(a, b, k)),
        any::<u8>().prop_map(Step::Transpose),
        any::<u8>().prop_map(Step::Reshape),
        any::<u8>().prop_map(Step::Concat),
        any::<u8>().prop_map(Step::Softmax),
        any::<u8>().prop_map(Step::MatMulT),
        any::<u8>().prop_map(Step::Slice),
    ]
}

const UNARY: [UnaryOp; 8] = [
    UnaryOp::Relu,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Gelu { tanh: true },
    UnaryOp::Softsign,
];
const BINARY: [BinaryOp; 5] =
    [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min];

fn pick<'g>(values: &[Traced<'g>], i: u8) -> Traced<'g> {
    values[i as usize % values.len()]
}

/// Builds a valid graph from the steps (each step is shaped to be valid).
fn random_graph(dims: &[usize], steps: &[Step]) -> Graph {
    let g = GraphBuilder::new("random");
    let mut values = vec![g.input("x", DType::F32, dims)];
    for s in steps {
        let v = match *s {
            Step::Unary(a, u) => {
                let x = pick(&values, a);
                // Exp only of bounded values, so the interpreter and native code stay comparable.
                let u = UNARY[u as usize % UNARY.len()];
                if u == UnaryOp::Exp {
                    x.tanh().exp()
                } else {
                    x.unary(u)
                }
            }
            Step::Binary(a, b, op) => {
                let (x, y) = (pick(&values, a), pick(&values, b));
                if x.ty() == y.ty() {
                    x.binary(BINARY[op as usize % BINARY.len()], y)
                } else {
                    x + x
                }
            }
            Step::Scale(a, k) => {
                let x = pick(&values, a);
                x * x.scalar(k as f64 / 32.0)
            }
            Step::Bias(a, seed) => {
                let x = pick(&values, a);
                let t = x.ty().unwrap();
                let last = *t.shape.as_fixed().unwrap().last().unwrap_or(&1);
                x + g.constant(&format!("b{seed}"), Tensor::random(DType::F32, &[last], seed))
            }
            Step::Reduce(a, axis, keep) => {
                let x = pick(&values, a);
                let r = x.ty().unwrap().rank();
                let kinds = [
                    ReduceKind::Sum,
                    ReduceKind::Mean,
                    ReduceKind::Max,
                    ReduceKind::Min,
                    ReduceKind::L2,
                ];
                if r == 0 {
                    x.relu()
                } else {
                    x.reduce(
                        kinds[axis as usize % kinds.len()],
                        &[(axis as usize % r) as i64],
                        keep,
                    )
                }
            }
            Step::Transpose(a) => {
                let x = pick(&values, a);
                let r = x.ty().unwrap().rank();
                x.transpose(&(0..r).rev().collect::<Vec<_>>())
            }
            Step::Reshape(a) => pick(&values, a).reshape(&[-1]),
            Step::Concat(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 0 {
                    x.neg()
                } else {
                    g.concat(&[x, x.neg()], 0)
                }
            }
            Step::Softmax(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 0 {
                    x.sigmoid()
                } else {
                    x.softmax(-1)
                }
            }
            Step::MatMulT(a) => {
                let x = pick(&values, a);
                if x.ty().unwrap().rank() == 2 {
                    x.matmul(x.transpose(&[1, 0]))
                } else {
                    x.tanh()
                }
            }
            Step::Slice(a) => {
                let x = pick(&values, a);
                match x.ty().unwrap().shape.as_fixed().unwrap().first() {
                    Some(&n) if n >= 2 => x.slice(&[1], &[n as i64], &[0], &[1]),
                    _ => x.abs(),
                }
            }
        };
        values.push(v);
    }
    g.output("out", *values.last().unwrap());
    g.output("middle", values[values.len() / 2]);
    g.build().expect("random steps are shaped to be valid")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_graphs_compile_to_what_the_interpreter_computes(
        dims in prop::collection::vec(1usize..5, 1..4),
        steps in prop::collection::vec(step(), 1..10),
        threads in 1usize..3,
    ) {
        let graph = random_graph(&dims, &steps);
        check_against_eval(&graph, &[Tensor::random(DType::F32, &dims, 7)], threads, 1e-4);
    }

    /// Determinism: the same bytes at 1, 2 and 3 threads.
    #[test]
    fn random_graphs_give_the_same_bytes_at_any_thread_count(
        dims in prop::collection::vec(1usize..5, 1..4),
        steps in prop::collection::vec(step(), 1..10),
    ) {
        let graph = random_graph(&dims, &steps);
        let x = [Tensor::random(DType::F32, &dims, 11)];
        let art = kiln_compiler::compile(&graph, &kiln_compiler::Options::default(), false).unwrap().artifact;
        let run = |threads: usize| -> Vec<Vec<u8>> {
            let exe = kiln_runtime::Executable::load(art.clone(), &kiln_runtime::LoadOptions { threads: Some(threads), ..Default::default() }).unwrap();
            exe.run(&x).unwrap().iter().map(|t| t.bytes().to_vec()).collect()
        };
        let one = run(1);
        prop_assert!(run(2) == one && run(3) == one, "different bytes at 2 or 3 threads");
    }
}

/// Larger tensors, so kernels split into several workgroups run on several threads.
#[test]
fn distributed_kernels_agree_with_the_interpreter() {
    let g = GraphBuilder::new("wide");
    let x = g.input("x", DType::F32, [64, 300]);
    let w = g.constant("w", Tensor::random(DType::F32, &[300, 128], 3));
    let b = g.constant("b", Tensor::random(DType::F32, &[128], 4));
    let h = (x.matmul(w) + b).relu();
    let s = h.softmax(-1).reduce_sum(&[1], true);
    g.output("h", h);
    g.output("s", s);
    let graph = g.build().unwrap();
    check_against_eval(&graph, &[Tensor::random(DType::F32, &[64, 300], 5)], 2, 1e-4);
}
