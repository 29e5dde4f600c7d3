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
            let ok = a == b || (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
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

/// Values that exercise a small float's rounding: ties, the subnormal range, the largest
/// values and past them, infinities, NaN and both zeros.
fn storage_sweep() -> Tensor {
    let mut v: Vec<f32> = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -1e30];
    for e in -20..18 {
        for m in [1.0f32, 1.0625, 1.125, 1.1875, 1.25, 1.3, 1.5, 1.75, 1.875, 1.96875] {
            let x = m * 2f32.powi(e);
            v.push(x);
            v.push(-x);
        }
    }
    for x in
        [0.25f32, 0.75, 2.5, 3.5, 5.0, 7.0, 240.0, 248.0, 448.0, 464.0, 480.0, 57344.0, 61440.0]
    {
        v.extend([x, -x]);
    }
    Tensor::from_vec(&[v.len()], v).unwrap()
}

/// Finite values around the 4- and 2-bit integer ranges, for the truncation and the wrap (a
/// float to integer cast of infinity or NaN has no defined result).
fn integer_sweep() -> Tensor {
    let v: Vec<f32> = (-80..80).map(|i| i as f32 * 0.375).collect();
    Tensor::from_vec(&[v.len()], v).unwrap()
}

/// Storage types compiled for the CPU: every cast to one, saturating and not, its value read
/// back in the same kernel and the stored codes, equal to the interpreter's (NaN for NaN).
#[test]
fn storage_type_casts_match_the_interpreter() {
    let (x, n) = (storage_sweep(), integer_sweep());
    let g = GraphBuilder::new("storage_casts");
    let floats = g.input("x", DType::F32, [x.len()]);
    let integers = g.input("n", DType::F32, [n.len()]);
    let types = [
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];
    for (i, to) in types.into_iter().enumerate() {
        let input =
            if to.packed_bits().is_some() && to != DType::F4E2M1 { integers } else { floats };
        for saturate in [true, false] {
            let y = g.apply(kiln_ir::Op::Cast { to, saturate }, &[Some(input)], 1)[0];
            g.output(&format!("stored_{i}_{saturate}"), y);
            g.output(&format!("wide_{i}_{saturate}"), y.cast(DType::F32));
        }
    }
    let g = g.build().unwrap();
    check_against_eval(&g, &[x, n], 2, 0.0);
}

/// Compiled code converts storage types only in casts: computing on one is an error that names
/// the node and the type, never wrong numbers.
#[test]
fn computing_on_a_storage_type_is_refused_naming_the_node() {
    let g = GraphBuilder::new("add_f8");
    let x = g.input("x", DType::F8E5M2, [4]);
    g.output("y", x.add(x));
    let g = g.build().unwrap();
    let err = kiln_compiler::compile(&g, &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("an Add on f8e5m2 is refused")
        .to_string();
    assert!(err.contains("(Add)") && err.contains("f8e5m2"), "{err}");
}

/// A cast to f16 or bf16 that the same kernel reads on rounds there, as a stored one would (the
/// kernel computes in f32). Arithmetic on half types rounds only where it is stored, as before.
#[test]
fn half_casts_round_inside_fused_kernels() {
    for half in [DType::F16, DType::BF16] {
        let g = GraphBuilder::new("half_in_a_chain");
        let x = g.input("x", DType::F32, [256]);
        let h = g.input("h", DType::F32, [256]);
        g.output("y", x.cast(half).cast(DType::F32).add(h));
        let g = g.build().unwrap();
        let inputs =
            [Tensor::random(DType::F32, &[256], 31), Tensor::random(DType::F32, &[256], 32)];
        check_against_eval(&g, &inputs, 1, 0.0);
    }
}

/// A padded f16 or bf16 Conv (the graph's own type, weights a constant or an input) compiles and
/// matches the interpreter: its input is widened to f32 by a generic before it is padded, and
/// fusing that generic into the workgroup loop after the pad left MLIR's IR broken (the compiler
/// crashed with a segmentation fault while canonicalising the pad).
#[test]
fn padded_half_convolutions_compile() {
    use kiln_ir::builder::ConvOptions;
    for half in [DType::F16, DType::BF16] {
        for weight_input in [false, true] {
            let g = GraphBuilder::new("half_conv");
            let x = g.input("x", half, [16, 16, 14, 14]);
            let w = if weight_input {
                g.input("w", half, [32, 16, 3, 3])
            } else {
                g.constant("w", Tensor::random(DType::F32, &[32, 16, 3, 3], 42).cast(half))
            };
            g.output("y", x.conv(w, None, ConvOptions::default().pad(1)).relu());
            let g = g.build().unwrap();
            let mut inputs = vec![Tensor::random(DType::F32, &[16, 16, 14, 14], 41).cast(half)];
            if weight_input {
                inputs.push(Tensor::random(DType::F32, &[32, 16, 3, 3], 42).cast(half));
            }
            // Both sum in f32 and round once to the half type: the order of the sums may move
            // a result to the neighbouring half value.
            check_against_eval(&g, &inputs, 2, 1e-2);
        }
    }
}

/// Integer Pow, wrapping, with negative exponents too (what truncating the real power gives:
/// 1 for 1, +-1 for -1, 0 otherwise; 0 to a negative power is +inf, saturated to the type's
/// maximum). Every target squares and multiplies (SPIR-V and NVVM have no `math.ipowi`); the
/// OpenCL ratchet holds ONNX's integer Pow tests. An exponent of another type takes the real
/// power, converted saturating (compiled code's `fptosi` of +inf gave INT_MIN).
#[test]
fn integer_pow_matches_the_interpreter() {
    let g = GraphBuilder::new("ipow");
    let x = g.input("x", DType::I64, [7, 1]);
    let y = g.input("y", DType::I64, [1, 11]);
    g.output("p", x.binary(kiln_ir::BinaryOp::Pow, y));
    let g = g.build().unwrap();
    let big_odd = -(1i64 << 60) - 1;
    let inputs = [
        Tensor::from_vec(&[7, 1], vec![-3i64, -2, -1, 0, 1, 2, 3]).unwrap(),
        Tensor::from_vec(&[1, 11], vec![big_odd, -3, -2, -1, 0, 1, 2, 5, 40, 63, 200]).unwrap(),
    ];
    check_against_eval(&g, &inputs, 1, 0.0);
    for base in [DType::I32, DType::U8, DType::U32] {
        let g = GraphBuilder::new("ipow_mixed");
        let x = g.input("x", base, [5, 1]);
        let y = g.input("y", DType::I64, [1, 5]);
        g.output("p", x.binary(kiln_ir::BinaryOp::Pow, y));
        let g = g.build().unwrap();
        let inputs = [
            Tensor::from_f64s(base, &[5, 1], &[0.0, 1.0, 2.0, 3.0, 7.0]).unwrap(),
            Tensor::from_vec(&[1, 5], vec![-2i64, -1, 0, 3, 40]).unwrap(),
        ];
        check_against_eval(&g, &inputs, 1, 0.0);
    }
}

/// Integer reductions: sums, products and extrema exact (wrapping), over nothing the type's
/// bound; the mean, L2, LogSum and LogSumExp computed in f64 and truncated, saturating (an i8
/// mean of [100, 100] wrapped to -28; LogSumExp of integers did not compile).
#[test]
fn integer_reductions_match_the_interpreter() {
    use kiln_ir::op::ReduceKind;
    for dtype in [DType::I8, DType::I32, DType::I64, DType::U8] {
        for kind in [
            ReduceKind::Sum,
            ReduceKind::Mean,
            ReduceKind::Max,
            ReduceKind::Min,
            ReduceKind::L2,
            ReduceKind::LogSum,
            ReduceKind::LogSumExp,
        ] {
            for (dims, values) in
                [(vec![2, 3], vec![100.0, 100.0, 27.0, 0.0, 3.0, 2.0]), (vec![2, 0], vec![])]
            {
                let g = GraphBuilder::new("ireduce");
                let x = g.input("x", dtype, dims.clone());
                g.output("y", x.reduce(kind, &[1], false));
                let g = g.build().unwrap();
                let x = Tensor::from_f64s(dtype, &dims, &values).unwrap();
                check_against_eval(&g, &[x], 1, 0.0);
            }
        }
    }
}

/// Contractions over nothing (K = 0, no input channels, an Einsum summing an empty letter) give
/// ONNX's zeros (plus Gemm's beta * C and a convolution's bias), as the interpreter does: they
/// crashed inside MLIR's tiling, on every target.
#[test]
fn empty_contractions_give_zeros_or_the_bias() {
    use kiln_ir::builder::ConvOptions;
    let mut cases: Vec<(Graph, Vec<Tensor>)> = Vec::new();
    {
        let g = GraphBuilder::new("matmul_k0");
        let x = g.input("x", DType::F32, [3, 0]);
        let w = g.constant("w", Tensor::zeros(DType::F32, &[0, 4]));
        g.output("y", x.matmul(w).relu());
        cases.push((g.build().unwrap(), vec![Tensor::zeros(DType::F32, &[3, 0])]));
    }
    {
        let g = GraphBuilder::new("gemm_k0");
        let x = g.input("x", DType::F32, [0, 3]);
        let w = g.constant("w", Tensor::zeros(DType::F32, &[0, 5]));
        let c = g.constant("c", Tensor::random(DType::F32, &[5], 1));
        let attrs = kiln_ir::op::Gemm { alpha: 1.0, beta: 2.0, trans_a: true, trans_b: false };
        g.output("y", x.gemm(w, Some(c), attrs));
        cases.push((g.build().unwrap(), vec![Tensor::zeros(DType::F32, &[0, 3])]));
    }
    {
        let g = GraphBuilder::new("conv_no_channels");
        let x = g.input("x", DType::F32, [1, 0, 6, 6]);
        let w = g.constant("w", Tensor::zeros(DType::F32, &[4, 0, 3, 3]));
        let b = g.constant("b", Tensor::random(DType::F32, &[4], 2));
        g.output("y", x.conv(w, Some(b), ConvOptions::default().pad(1)));
        cases.push((g.build().unwrap(), vec![Tensor::zeros(DType::F32, &[1, 0, 6, 6])]));
    }
    {
        let g = GraphBuilder::new("einsum_empty");
        let a = g.input("a", DType::F32, [2, 0]);
        let b = g.input("b", DType::F32, [0, 3]);
        let y =
            g.apply(kiln_ir::Op::Einsum { equation: "ij,jk->ik".into() }, &[Some(a), Some(b)], 1)
                [0];
        g.output("y", y);
        cases.push((
            g.build().unwrap(),
            vec![Tensor::zeros(DType::F32, &[2, 0]), Tensor::zeros(DType::F32, &[0, 3])],
        ));
    }
    for (g, inputs) in &cases {
        check_against_eval(g, inputs, 1, 1e-6);
    }
}

/// Integer MIN / -1 and MIN % -1 wrap as the reference's arithmetic does (MIN and 0) instead of
/// killing the process with SIGFPE, for every signed width.
#[test]
fn integer_min_over_minus_one_does_not_trap() {
    for dtype in [DType::I8, DType::I16, DType::I32, DType::I64] {
        let g = GraphBuilder::new("min_div");
        let x = g.input("x", dtype, [4]);
        let y = g.input("y", dtype, [4]);
        g.output("q", x.div(y));
        g.output("r", x.binary(kiln_ir::BinaryOp::Mod { fmod: false }, y));
        g.output("f", x.binary(kiln_ir::BinaryOp::Mod { fmod: true }, y));
        let g = g.build().unwrap();
        let bits = dtype.size() * 8;
        let min = (i64::MIN >> (64 - bits)) as f64;
        let xs = Tensor::from_f64s(dtype, &[4], &[min, min, 7.0, -7.0]).unwrap();
        let ys = Tensor::from_f64s(dtype, &[4], &[-1.0, 3.0, -1.0, 2.0]).unwrap();
        check_against_eval(&g, &[xs, ys], 1, 0.0);
    }
}

/// Slices with extreme steps (+-2^63: "one element, then past the end") compile and give the
/// interpreter's element; the count overflowed i64 and was an internal error.
#[test]
fn slices_with_extreme_steps_take_one_element() {
    for (start, end, step) in
        [(4i64, i64::MIN, i64::MIN), (1, i64::MAX, i64::MAX), (-1, -100, i64::MIN + 1)]
    {
        let g = GraphBuilder::new("extreme_slice");
        let x = g.input("x", DType::F32, [6, 3]);
        g.output("y", x.slice(&[start], &[end], &[0], &[step]));
        let g = g.build().unwrap();
        assert_eq!(g.value_type(g.outputs()[0].1).shape.as_fixed(), Some(vec![1, 3]));
        check_against_eval(&g, &[Tensor::random(DType::F32, &[6, 3], 4)], 1, 0.0);
    }
}

/// Compile-time tables (a Pad's index map per axis, a Resize's taps) of more entries than
/// `codegen::TABLE_LIMIT` are refused naming the node before they are built: a Pad of f32[1] to
/// 2^40 + 1 elements aborted the compiler allocating 16 TB.
#[test]
fn compile_time_tables_are_bounded() {
    use kiln_ir::op::PadMode;
    let g = GraphBuilder::new("huge_pad");
    let x = g.input("x", DType::F32, [1]);
    let pads = g.constant("pads", Tensor::vector(&[0i64, 1 << 40]));
    let y = g.apply(kiln_ir::Op::Pad { mode: PadMode::Edge }, &[Some(x), Some(pads)], 1)[0];
    g.output("y", y);
    let g = g.build().unwrap();
    let e = kiln_compiler::compile(&g, &Options { cache: false, ..Options::default() }, false)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("(Pad) needs an index map along an axis of 1099511627777 entries, more than"),
        "{e}"
    );
    // A table well inside the bound still compiles and matches.
    let g = GraphBuilder::new("long_pad");
    let x = g.input("x", DType::F32, [3]);
    let pads = g.constant("pads", Tensor::vector(&[2i64, 100_000]));
    let y = g.apply(kiln_ir::Op::Pad { mode: PadMode::Reflect }, &[Some(x), Some(pads)], 1)[0];
    g.output("y", y);
    let g = g.build().unwrap();
    check_against_eval(&g, &[Tensor::random(DType::F32, &[3], 1)], 1, 0.0);
}
