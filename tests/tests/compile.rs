//! Compiled code against the reference interpreter.

use kiln_compiler::Options;
use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, models, DType, Graph, Tensor};
use kiln_runtime::LoadOptions;

/// Compiles `graph`, runs it with `threads` threads, and checks every output against `ir::eval`.
pub(crate) fn check_against_eval(graph: &Graph, inputs: &[Tensor], threads: usize, tol: f64) {
    let exe = kiln_compiler::jit(
        graph,
        &Options { cache: false, ..Options::default() },
        &LoadOptions { threads: Some(threads), ..Default::default() },
    )
    .unwrap_or_else(|e| panic!("compile failed: {e}"));
    let got = exe.run(inputs).unwrap_or_else(|e| panic!("run failed: {e}"));
    let want = eval::run(graph, inputs).expect("the interpreter runs the graph");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "output {i} type");
        let (g, w) = (g.to_f64s(), w.to_f64s());
        for (j, (a, b)) in g.iter().zip(&w).enumerate() {
            let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
            assert!(ok, "output {i} element {j}: compiled {a}, interpreter {b}");
        }
    }
}

#[test]
fn mlp_matches_the_interpreter() {
    let g = models::mlp(4, 32, 64, 10, 1).unwrap();
    check_against_eval(&g, &[Tensor::random(DType::F32, &[4, 32], 2)], 1, 1e-4);
}

#[test]
fn cifarnet_matches_the_interpreter() {
    let g = models::cifarnet(4, 0).unwrap();
    check_against_eval(&g, &[Tensor::random(DType::F32, &[4, 3, 32, 32], 42)], 2, 1e-4);
}

/// Kernels big enough to be split into workgroups whose output is not the input's layout: a
/// reduction over the leading dimension and a transpose. Each workgroup must write its own part
/// of the output (the CPU schedule splits only a dimension the output map indexes by its loop).
#[test]
fn workgroups_of_reductions_and_transposes_cover_the_output() {
    use kiln_ir::builder::GraphBuilder;
    let g = GraphBuilder::new("reduce_leading");
    let x = g.input("x", DType::F32, [64, 4096]);
    g.output("sum0", x.reduce_sum(&[0], false));
    g.output("t", x.transpose(&[1, 0]).relu());
    let graph = g.build().unwrap();
    check_against_eval(&graph, &[Tensor::random(DType::F32, &[64, 4096], 5)], 2, 1e-4);
}

#[test]
fn a_softmax_whose_workgroup_loop_bufferises_apart_runs_as_one_workgroup() {
    // [12,128,128] over the last axis: its distributed schedule used to fail at `distribute`.
    let g = GraphBuilder::new("softmax");
    let x = g.input("x", DType::F32, [12, 128, 128]);
    g.output("y", x.softmax(-1));
    check_against_eval(
        &g.build().unwrap(),
        &[Tensor::random(DType::F32, &[12, 128, 128], 1)],
        2,
        1e-5,
    );
}

/// One graph holding every op of the elementwise tables (`UnaryOp::ALL`, `BinaryOp::ALL`), each
/// on operands of a type it accepts, and its inputs: a new elementwise op is compiled and checked
/// against the interpreter by being in the table. Out-of-domain values give NaN on both sides.
pub(crate) fn every_elementwise_op() -> (Graph, Vec<Tensor>) {
    use kiln_ir::builder::GraphBuilder;
    use kiln_ir::op::TypeClass;
    use kiln_ir::{BinaryOp, UnaryOp};
    const N: usize = 24;
    let g = GraphBuilder::new("elementwise_table");
    let x = g.input("x", DType::F32, [N]);
    let y = g.input("y", DType::F32, [N]);
    let i = g.input("i", DType::I32, [N]);
    let j = g.input("j", DType::I32, [N]);
    let b = g.input("b", DType::Bool, [N]);
    let c = g.input("c", DType::Bool, [N]);
    let u = g.input("u", DType::U8, [N]);
    let s = g.input("s", DType::U8, [N]);
    let mut n = 0;
    let mut name = |op: &str| {
        n += 1;
        format!("{op}_{n}")
    };
    for op in UnaryOp::ALL {
        let operand = match op.accepts() {
            TypeClass::Bool => b,
            TypeClass::Int | TypeClass::Unsigned => i,
            _ => x,
        };
        g.output(&name(op.name()), operand.unary(*op));
    }
    for op in BinaryOp::ALL {
        let (l, r) = match op.accepts() {
            TypeClass::Bool => (b, c),
            TypeClass::Int => (i, j),
            TypeClass::Unsigned => (u, s),
            _ => (x, y),
        };
        g.output(&name(op.name()), l.binary(*op, r));
    }
    let graph = g.build().unwrap();
    let xs: Vec<f32> = (0..N).map(|k| -2.9 + 5.8 * k as f32 / (N - 1) as f32).collect();
    let ys: Vec<f32> = (0..N).map(|k| 0.3 + (k % 7) as f32 * 0.45).collect();
    let is: Vec<i32> = (0..N as i32).map(|k| k * 37 - 400).collect();
    let js: Vec<i32> = (0..N as i32).map(|k| (k % 5) + 1).collect();
    let bs: Vec<bool> = (0..N).map(|k| k % 2 == 0).collect();
    let cs: Vec<bool> = (0..N).map(|k| k % 3 == 0).collect();
    let us: Vec<u8> = (0..N as u8).map(|k| k * 10).collect();
    let ss: Vec<u8> = (0..N as u8).map(|k| k % 9).collect();
    let inputs = vec![
        Tensor::from_vec(&[N], xs).unwrap(),
        Tensor::from_vec(&[N], ys).unwrap(),
        Tensor::from_vec(&[N], is).unwrap(),
        Tensor::from_vec(&[N], js).unwrap(),
        Tensor::from_vec(&[N], bs).unwrap(),
        Tensor::from_vec(&[N], cs).unwrap(),
        Tensor::from_vec(&[N], us).unwrap(),
        Tensor::from_vec(&[N], ss).unwrap(),
    ];
    (graph, inputs)
}

#[test]
fn every_elementwise_op_matches_the_interpreter() {
    let (g, inputs) = every_elementwise_op();
    check_against_eval(&g, &inputs, 1, 1e-4);
}
