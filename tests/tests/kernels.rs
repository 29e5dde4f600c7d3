//! One suite for every CPU microkernel shape (`backend/cpu/ukernel/`, `ukernel::SHAPE_NAMES`),
//! as tract runs one suite against every kernel: each shape at its edge sizes (one row, one
//! column, one channel, sizes one past a vector or a register tile, windows as large as the
//! image, single steps), compiled with the microkernel forced, checked in the schedule to have
//! taken that shape, and run at 1 and 2 threads against the interpreter. A shape with no cases
//! here fails the suite, so a new kernel arrives with its edge cases. Degenerate sizes the planner
//! leaves to the linalg path (one element, one step) are run too, and need only be right.

use std::collections::BTreeMap;

use kiln_compiler::backend::cpu::ukernel::SHAPE_NAMES;
use kiln_compiler::{compile, Options, Stage};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::op::{
    Attention, AutoPad, ConvTranspose, Pool, PoolKind, Reduce, ReduceKind, Rnn, RnnCell,
    RnnDirection, UnaryOp, Window,
};
use kiln_ir::{eval, DType, Graph, Op, Tensor};
use kiln_runtime::{Executable, LoadOptions};

/// A graph whose kernels include one of `shape`, its inputs, and how far from the interpreter
/// each output may be (`|a - b| <= tol * (1 + |b|)`; quantized outputs: one step).
struct Case {
    shape: &'static str,
    what: String,
    graph: Graph,
    inputs: Vec<Tensor>,
    tol: f64,
    /// Whether the schedule must show the shape's kernel. Degenerate sizes (one element, one
    /// step) the planner leaves to the linalg path need only be right.
    on_kernel: bool,
}

/// Sizes the planner may leave to the linalg path: right either way.
fn degenerate(what: &str) -> bool {
    what.starts_with("one element") || what.starts_with("a degenerate ")
}

fn case(shape: &'static str, what: impl Into<String>, graph: Graph, inputs: Vec<Tensor>) -> Case {
    let what = what.into();
    Case { shape, on_kernel: !degenerate(&what), what, graph, inputs, tol: 1e-4 }
}

/// The shape a schedule's microkernel line names (what each module's `describe` writes first).
fn shape_of(line: &str) -> Option<&'static str> {
    let d = line.strip_prefix("microkernel: ")?;
    Some(if d.starts_with("depthwise conv") || d.starts_with("conv as implicit GEMM") {
        "conv"
    } else if d.starts_with("ConvTranspose") {
        "conv-transpose"
    } else if d.starts_with("integer ") {
        "qconv"
    } else if d.starts_with("dynamically quantized") {
        "dqgemm"
    } else if d.starts_with("GEMM") {
        "gemm"
    } else if d.contains(" pooling, ") {
        "pool"
    } else if d.starts_with("gather") {
        "gather"
    } else if d.starts_with("recurrent") {
        "recurrent"
    } else if d.contains(" reduction, [") {
        "reduce"
    } else if d.contains("softmax over") {
        "softmax"
    } else if d.starts_with("transpose") {
        "transpose"
    } else if d.starts_with("attention") {
        "attention"
    } else {
        return None;
    })
}

fn options() -> Options {
    Options {
        cache: false,
        microkernel: Some(true),
        microkernel_overrides: Some(Default::default()),
        ..Options::default()
    }
}

/// Compiles `c` once, checks its schedule ran a kernel of `c.shape`, and compares its outputs at
/// 1 and 2 threads with the interpreter's. An error names the case.
fn run(c: &Case) -> Result<(), String> {
    let compiled = compile(&c.graph, &options(), true).map_err(|e| format!("compile: {e}"))?;
    let schedule = compiled.stages[Stage::Schedule].to_string();
    let shapes: Vec<Option<&str>> = schedule
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("microkernel: "))
        .map(shape_of)
        .collect();
    if shapes.contains(&None) {
        return Err(format!(
            "a microkernel line the suite cannot name (add it to shape_of):\n{schedule}"
        ));
    }
    if c.on_kernel && !shapes.contains(&Some(c.shape)) {
        return Err(format!("no {} kernel in the schedule:\n{schedule}", c.shape));
    }
    let want = eval::run(&c.graph, &c.inputs).map_err(|e| format!("interpreter: {e}"))?;
    for threads in [1, 2] {
        let load = LoadOptions { threads: Some(threads), ..Default::default() };
        let exe =
            Executable::load(compiled.artifact.clone(), &load).map_err(|e| format!("load: {e}"))?;
        let got = exe.run(&c.inputs).map_err(|e| format!("run: {e}"))?;
        crate::microkernel::assert_scratch_bounded(&exe, threads);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if g.ty() != w.ty() {
                return Err(format!("output {i}: {:?}, the interpreter's {:?}", g.ty(), w.ty()));
            }
            for (j, (a, b)) in g.to_f64s().iter().zip(w.to_f64s()).enumerate() {
                if (a - b).abs() > c.tol * (1.0 + b.abs()) {
                    return Err(format!(
                        "output {i} element {j}: {a}, the interpreter {b} ({threads} threads)"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn conv(x: [usize; 4], m: usize, k: usize, o: ConvOptions) -> (Graph, Vec<Tensor>) {
    let g = GraphBuilder::new("conv");
    let xi = g.input("x", DType::F32, x);
    let w = g.constant("w", Tensor::random(DType::F32, &[m, x[1] / o.group, k, k], 1));
    let b = g.constant("b", Tensor::random(DType::F32, &[m], 2));
    g.output("y", xi.conv(w, Some(b), o).relu());
    (g.build().unwrap(), vec![Tensor::random(DType::F32, &x, 3)])
}

fn conv_cases() -> Vec<Case> {
    let o = |stride, pad, dilation, group| ConvOptions { stride, pad, dilation, group };
    let mut cases = Vec::new();
    for (what, x, m, k, opts) in [
        ("a degenerate 1x1 image of one channel to one", [1, 1, 1, 1], 1, 1, o(1, 0, 1, 1)),
        ("3x3 on a 1x1 image (all padding)", [1, 3, 1, 1], 5, 3, o(1, 1, 1, 1)),
        ("17 to 33 channels, 3x3 pad 1", [1, 17, 5, 7], 33, 3, o(1, 1, 1, 1)),
        ("a window as large as the image", [2, 4, 5, 5], 9, 5, o(1, 0, 1, 1)),
        ("stride past the window", [1, 8, 9, 9], 8, 2, o(3, 0, 1, 1)),
        ("dilated past the image's half", [1, 4, 9, 9], 4, 3, o(1, 2, 3, 1)),
        ("two groups of odd channels", [1, 6, 7, 5], 10, 3, o(1, 1, 1, 2)),
        ("depthwise on 17 channels of 1x1", [1, 17, 1, 1], 17, 3, o(1, 1, 1, 17)),
        ("depthwise strided, 33 channels", [2, 33, 9, 8], 33, 3, o(2, 1, 1, 33)),
    ] {
        let (g, x) = conv(x, m, k, opts);
        cases.push(case("conv", what, g, x));
    }
    cases
}

fn conv_transpose_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // (The last two: one output channel, a bias and a Sigmoid, as DBNet's probability map ends;
    // their units are chunks of input rows, 37 rows in 4 uneven ones, and with pads each chunk's
    // output rows shifted by one.)
    for (what, x, w, strides, pads, head) in [
        (
            "a degenerate 1x1 image of one channel",
            vec![1, 1, 1, 1],
            vec![1, 1, 2, 2],
            vec![2, 2],
            vec![0; 4],
            false,
        ),
        (
            "17 to 3 channels, overlapping",
            vec![1, 17, 3, 4],
            vec![17, 3, 3, 3],
            vec![2, 2],
            vec![1; 4],
            false,
        ),
        ("1-D, stride 1", vec![2, 5, 9], vec![5, 7, 4], vec![1], vec![0; 2], false),
        (
            "64 to 1 channel, 2x2/2, bias and Sigmoid",
            vec![1, 64, 37, 45],
            vec![64, 1, 2, 2],
            vec![2, 2],
            vec![0; 4],
            true,
        ),
        (
            "80 to 1 channel, 2x2/2 padded by 1, bias and Sigmoid",
            vec![1, 80, 31, 33],
            vec![80, 1, 2, 2],
            vec![2, 2],
            vec![1; 4],
            true,
        ),
    ] {
        let spatial = x.len() - 2;
        let g = GraphBuilder::new("conv_transpose");
        let xi = g.input("x", DType::F32, x.as_slice());
        let wt = g.constant("w", Tensor::random(DType::F32, &w, 4));
        let bias = head.then(|| g.constant("b", Tensor::random(DType::F32, &[w[1]], 6)));
        let window =
            Window { strides, dilations: vec![1; spatial], pads, auto_pad: AutoPad::NotSet };
        let op = Op::ConvTranspose(ConvTranspose {
            window,
            group: 1,
            output_padding: vec![],
            output_shape: vec![],
        });
        let mut y = g.apply(op, &[Some(xi), Some(wt), bias], 1)[0];
        if head {
            y = g.apply(Op::Unary(UnaryOp::Sigmoid), &[Some(y)], 1)[0];
        }
        g.output("y", y);
        cases.push(case(
            "conv-transpose",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &x, 5)],
        ));
    }
    cases
}

/// Q(Conv(DQ(x), DQ(w), DQ(b))) as onnxruntime's quantizer writes it: u8 activations, s8
/// per-channel weights, an i32 bias.
fn qconv(x: [usize; 4], m: usize, k: usize, o: ConvOptions) -> (Graph, Vec<Tensor>) {
    let g = GraphBuilder::new("qconv");
    let xi = g.input("x", DType::U8, x);
    let t = |d: DType, dims: &[usize], v: Vec<f64>| Tensor::from_f64s(d, dims, &v).unwrap();
    let cg = x[1] / o.group;
    let n = m * cg * k * k;
    let wq = g.constant(
        "w",
        t(DType::I8, &[m, cg, k, k], (0..n).map(|i| ((i * 37) % 255) as f64 - 127.0).collect()),
    );
    let sw =
        g.constant("sw", t(DType::F32, &[m], (0..m).map(|i| 0.002 + 0.0005 * i as f64).collect()));
    let zw = g.constant("zw", t(DType::I8, &[m], vec![0.0; m]));
    let sx = g.constant("sx", Tensor::scalar(0.02f32));
    let zx = g.constant("zx", t(DType::U8, &[], vec![37.0]));
    let b = g.constant("b", t(DType::I32, &[m], (0..m).map(|i| i as f64 * 97.0 - 300.0).collect()));
    let sb = g.constant(
        "sb",
        t(DType::F32, &[m], (0..m).map(|i| 0.02 * (0.002 + 0.0005 * i as f64)).collect()),
    );
    let deq = |v, s, z, axis| {
        g.apply(Op::Dequantize { axis, block_size: 0 }, &[Some(v), Some(s), z], 1)[0]
    };
    let y = deq(xi, sx, Some(zx), 1).conv(deq(wq, sw, Some(zw), 0), Some(deq(b, sb, None, 0)), o);
    let sy = g.constant("sy", Tensor::scalar(0.05f32));
    let zy = g.constant("zy", t(DType::U8, &[], vec![5.0]));
    let q = g.apply(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(y), Some(sy), Some(zy)],
        1,
    )[0];
    g.output("y", q);
    let len: usize = x.iter().product();
    let input = t(DType::U8, &x, (0..len).map(|i| ((i * 53) % 256) as f64).collect());
    (g.build().unwrap(), vec![input])
}

fn qconv_cases() -> Vec<Case> {
    let o = |stride, pad, group| ConvOptions { stride, pad, dilation: 1, group };
    let mut cases = Vec::new();
    for (what, x, m, k, opts) in [
        ("a degenerate 1x1 image of one channel", [1, 1, 1, 1], 1, 1, o(1, 0, 1)),
        ("3 channels (a partial group of 4), 3x3 pad 1", [1, 3, 5, 6], 17, 3, o(1, 1, 1)),
        ("a window as large as the image, strided", [2, 8, 4, 4], 5, 4, o(2, 0, 1)),
        ("depthwise on 17 channels", [1, 17, 5, 5], 17, 3, o(1, 1, 17)),
    ] {
        let (g, x) = qconv(x, m, k, opts);
        // The interpreter and the kernel may round a half differently: one step.
        cases.push(Case { tol: 1.0, ..case("qconv", what, g, x) });
    }
    cases
}

fn gemm_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, rows, k, n) in [
        ("a degenerate product: one row, one column, K 1", 1, 1, 1),
        ("rows one past a register tile, N one past a vector", 9, 5, 17),
        ("K past a cache block", 3, 1100, 20),
        ("many rows of one column", 70, 33, 1),
    ] {
        let g = GraphBuilder::new("gemm");
        let x = g.input("x", DType::F32, [rows, k]);
        let w = g.constant("w", Tensor::random(DType::F32, &[n, k], 6));
        let b = g.constant("b", Tensor::random(DType::F32, &[n], 7));
        g.output("y", x.linear(w, b));
        cases.push(case(
            "gemm",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &[rows, k], 8)],
        ));
    }
    cases
}

fn pool_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let avg = PoolKind::Average { count_include_pad: false };
    for (what, x, kind, kernel, strides, pads, ceil) in [
        (
            "a window as large as the image",
            vec![1, 3, 5, 5],
            PoolKind::Max,
            vec![5, 5],
            vec![1, 1],
            vec![0; 4],
            false,
        ),
        (
            "one channel of 1x1, padded",
            vec![1, 1, 1, 1],
            avg,
            vec![3, 3],
            vec![1, 1],
            vec![1; 4],
            false,
        ),
        (
            "17 channels, ceil mode",
            vec![2, 17, 6, 7],
            PoolKind::Max,
            vec![2, 2],
            vec![2, 2],
            vec![0; 4],
            true,
        ),
        (
            "average counting pads, odd window",
            vec![1, 16, 9, 4],
            PoolKind::Average { count_include_pad: true },
            vec![3, 1],
            vec![2, 1],
            vec![1, 0, 1, 0],
            false,
        ),
    ] {
        let g = GraphBuilder::new("pool");
        let xi = g.input("x", DType::F32, x.as_slice());
        let window = Window { strides, dilations: vec![1; 2], pads, auto_pad: AutoPad::NotSet };
        let y = g.apply(
            Op::Pool(Pool { kind, kernel, window, ceil_mode: ceil, column_major_indices: false }),
            &[Some(xi)],
            1,
        )[0];
        g.output("y", y);
        cases.push(case("pool", what, g.build().unwrap(), vec![Tensor::random(DType::F32, &x, 9)]));
    }
    cases
}

fn gather_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, table, ids) in [
        (
            "a degenerate table of one row, one index",
            Tensor::random(DType::F32, &[1, 5], 10),
            Tensor::from_vec(&[1], vec![-1i64]).unwrap(),
        ),
        (
            "17 ids into rows of 33 i64s",
            Tensor::from_vec(&[50, 33], (0..1650i64).collect::<Vec<_>>()).unwrap(),
            Tensor::from_vec(&[17], (0..17i64).map(|i| (i * 7) % 100 - 50).collect::<Vec<_>>())
                .unwrap(),
        ),
        (
            "rows of one element, both ends",
            Tensor::random(DType::F32, &[40, 1], 11),
            Tensor::from_vec(&[2, 3], vec![0i32, 39, -40, -1, 20, 0]).unwrap(),
        ),
    ] {
        let g = GraphBuilder::new("gather");
        let t = g.constant("table", table);
        let i = g.input("ids", ids.dtype(), ids.dims());
        let y = g.apply(Op::Gather { axis: 0 }, &[Some(t), Some(i)], 1)[0];
        g.output("y", y);
        cases.push(case("gather", what, g.build().unwrap(), vec![ids]));
    }
    cases
}

fn recurrent_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, cell, direction, seq, batch, input, hidden) in [
        (
            "a degenerate GRU: one step, one row, hidden 1",
            RnnCell::Gru { linear_before_reset: false },
            RnnDirection::Forward,
            1,
            1,
            1,
            1,
        ),
        (
            "an LSTM with hidden 17, both directions",
            RnnCell::Lstm { input_forget: false },
            RnnDirection::Bidirectional,
            3,
            2,
            5,
            17,
        ),
        (
            "a plain RNN, hidden one past a vector",
            RnnCell::Simple,
            RnnDirection::Reverse,
            4,
            3,
            16,
            17,
        ),
    ] {
        let r = Rnn {
            cell,
            direction,
            hidden_size: hidden,
            activations: vec![],
            clip: None,
            batch_first: false,
        };
        let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
        let gates = match cell {
            RnnCell::Simple => 1,
            RnnCell::Gru { .. } => 3,
            RnnCell::Lstm { .. } => 4,
        };
        let g = GraphBuilder::new("recurrent");
        let x = g.input("x", DType::F32, [seq, batch, input]);
        let w = g.constant("w", Tensor::random(DType::F32, &[dirs, gates * hidden, input], 12));
        let rw = g.constant("r", Tensor::random(DType::F32, &[dirs, gates * hidden, hidden], 13));
        let b = g.constant("b", Tensor::random(DType::F32, &[dirs, 2 * gates * hidden], 14));
        let y = g.apply(Op::Rnn(r), &[Some(x), Some(w), Some(rw), Some(b)], 2);
        g.output("y", y[0]);
        g.output("h", y[1]);
        cases.push(case(
            "recurrent",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &[seq, batch, input], 15)],
        ));
    }
    cases
}

fn reduce_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, kind, dims, axes) in [
        ("one element", ReduceKind::Sum, vec![1, 1], vec![1i64]),
        ("rows of 17", ReduceKind::Max, vec![3, 17], vec![1]),
        ("a reduced axis with one inner column", ReduceKind::Mean, vec![2, 1000, 1], vec![1]),
        ("inner 17 past a vector", ReduceKind::Min, vec![1, 5, 17], vec![1]),
    ] {
        let g = GraphBuilder::new("reduce");
        let x = g.input("x", DType::F32, dims.as_slice());
        let a = g.constant("axes", Tensor::vector(&axes));
        let y = g.apply(
            Op::Reduce(Reduce { kind, keepdims: true, noop_with_empty_axes: false }),
            &[Some(x), Some(a)],
            1,
        )[0];
        g.output("y", y);
        cases.push(case(
            "reduce",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &dims, 16)],
        ));
    }
    cases
}

fn softmax_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, op, dims) in [
        ("one row of one", Op::Softmax { axis: -1 }, vec![1, 1]),
        ("rows of 17", Op::LogSoftmax { axis: -1 }, vec![5, 17]),
        ("one row of 1000", Op::Softmax { axis: 1 }, vec![1, 1000]),
    ] {
        let g = GraphBuilder::new("softmax");
        let x = g.input("x", DType::F32, dims.as_slice());
        let y = g.apply(op, &[Some(x)], 1)[0];
        g.output("y", y);
        cases.push(case(
            "softmax",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &dims, 17)],
        ));
    }
    cases
}

fn transpose_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, dims, perm) in [
        ("17 x 1 rows", vec![17, 2], vec![1, 0]),
        ("edge blocks both ways", vec![2, 17, 33], vec![0, 2, 1]),
        ("a degenerate matrix of one row", vec![1, 1, 40], vec![0, 2, 1]),
    ] {
        let g = GraphBuilder::new("transpose");
        let x = g.input("x", DType::F32, dims.as_slice());
        let y = g.apply(Op::Transpose { perm }, &[Some(x)], 1)[0];
        g.output("y", y);
        cases.push(case(
            "transpose",
            what,
            g.build().unwrap(),
            vec![Tensor::random(DType::F32, &dims, 18)],
        ));
    }
    cases
}

fn attention_cases() -> Vec<Case> {
    let attrs = Attention {
        is_causal: false,
        kv_num_heads: 0,
        q_num_heads: 0,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        softmax_precision: None,
    };
    let mut cases = Vec::new();
    for (what, causal, q, k, v) in [
        ("one query over one key, head size 1", false, [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]),
        ("17 queries over 33 keys, causal", true, [1, 2, 17, 8], [1, 2, 33, 8], [1, 2, 33, 5]),
        ("head size one past a vector", false, [2, 1, 3, 17], [2, 1, 4, 17], [2, 1, 4, 17]),
    ] {
        let g = GraphBuilder::new("attention");
        let ops: Vec<_> = [("q", q), ("k", k), ("v", v)]
            .iter()
            .map(|(n, d)| Some(g.input(n, DType::F32, *d)))
            .collect();
        let a = Attention { is_causal: causal, ..attrs.clone() };
        let y = g.apply(Op::Attention(a), &ops, 1)[0];
        g.output("y", y);
        let inputs = [q, k, v]
            .iter()
            .enumerate()
            .map(|(i, d)| Tensor::random(DType::F32, d, 19 + i as u64))
            .collect();
        cases.push(Case { tol: 1e-3, ..case("attention", what, g.build().unwrap(), inputs) });
    }
    cases
}

/// kiln's DynQMatMul (f32 rows quantized at run time, by s8 weights), as the `dynamic` pass makes
/// it from onnxruntime's `quantize_dynamic` products.
fn dqgemm_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (what, rows, k, m) in [
        ("one row, one column, K of 5 (a partial word)", vec![1], 5, 17),
        ("rows past a tile, columns past a strip", vec![2, 7], 33, 65),
        ("one input channel", vec![9], 1, 80),
    ] {
        let g = GraphBuilder::new("dqgemm");
        let x_dims: Vec<usize> = rows.iter().copied().chain([k]).collect();
        let x = g.input("x", DType::F32, x_dims.clone());
        let w = g.constant("w", Tensor::random(DType::I8, &[k, m], 4));
        let s = g.constant("s", Tensor::scalar(0.01f32));
        let y = g.apply(Op::DynQMatMul, &[Some(x), Some(w), Some(s)], 1)[0];
        g.output("y", y);
        let input = Tensor::random(DType::F32, &x_dims, 5);
        cases.push(case("dqgemm", what, g.build().unwrap(), vec![input]));
    }
    cases
}

#[test]
fn every_microkernel_shape_at_its_edge_sizes() {
    let cases: Vec<Case> = [
        conv_cases(),
        conv_transpose_cases(),
        qconv_cases(),
        dqgemm_cases(),
        gemm_cases(),
        pool_cases(),
        gather_cases(),
        recurrent_cases(),
        reduce_cases(),
        softmax_cases(),
        transpose_cases(),
        attention_cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut per_shape: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &cases {
        *per_shape.entry(c.shape).or_default() += usize::from(c.on_kernel);
    }
    let missing: Vec<&str> =
        SHAPE_NAMES.iter().copied().filter(|s| per_shape.get(s).is_none_or(|&n| n < 2)).collect();
    assert!(
        missing.is_empty(),
        "kernel shapes with fewer than two cases on their kernel in the suite: {missing:?}"
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| run(c).err().map(|e| format!("{} ({}): {e}", c.shape, c.what)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
