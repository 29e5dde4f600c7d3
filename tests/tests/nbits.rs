//! onnxruntime's com.microsoft MatMulNBits (4-bit weight-only matrix products): imported from
//! ONNX, run on the CPU's kernel that unpacks the 4-bit weights in its loop or once per strip (`ukernel/nbits.rs`,
//! `quantized.c`'s `kiln_uk_nbgemm`), and decomposed where the weights are not constants (the
//! path every other target takes), each against the interpreter and against a dequantize and
//! matrix product written out here from the packing onnxruntime documents.

use kiln_compiler::{Options, Stage};
use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::{eval, DType, Graph, Tensor};
use kiln_runtime::LoadOptions;
use prost::Message;

use crate::integer::ints;

#[derive(Clone, Copy)]
enum Zeros {
    None,
    /// u8, two 4-bit zero points a byte, low bits first, as onnxruntime's quantizer writes them.
    Packed,
    F32,
}

struct Case {
    rows: &'static [usize],
    k: usize,
    n: usize,
    block_size: usize,
    zeros: Zeros,
    bias: bool,
    /// The packed weights a graph input rather than an initializer (the decomposed path).
    weights_input: bool,
}

/// What the test's own reference needs: per column and block its 4-bit codes, scale and zero.
struct Weights {
    codes: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<f32>,
    bias: Vec<f32>,
}

fn t(d: DType, dims: &[usize], v: Vec<f64>) -> Tensor {
    Tensor::from_f64s(d, dims, &v).unwrap()
}

fn init(tensor: Tensor, name: &str) -> TensorProto {
    TensorProto::decode(kiln_ir::onnx::encode_tensor(&tensor, name).as_slice()).unwrap()
}

fn value(name: &str, elem: i32, dims: &[usize]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(DimValue::DimValue(d as i64)),
                        })
                        .collect(),
                }),
            })),
        }),
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(attribute_type::INT),
        i: Some(v),
        ..Default::default()
    }
}

/// A model of one MatMulNBits node `y = x * dequantize(w)^T (+ b)` with attributes `attrs`
/// (K, N, bits, block_size...), its initializers and graph inputs.
fn model(
    attrs: Vec<AttributeProto>,
    inputs: &[&str],
    initializer: Vec<TensorProto>,
    graph_inputs: Vec<ValueInfoProto>,
    y_dims: &[usize],
) -> Vec<u8> {
    let node = NodeProto {
        op_type: Some("MatMulNBits".into()),
        domain: Some("com.microsoft".into()),
        name: Some("q4".into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec!["y".into()],
        attribute: attrs,
    };
    let graph = GraphProto {
        name: Some("nbits".into()),
        node: vec![node],
        initializer,
        input: graph_inputs,
        output: vec![value("y", data_type::FLOAT, y_dims)],
        ..Default::default()
    };
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![opset("", 17), opset("com.microsoft", 1)],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The case's model for x of `x_dims`, its weights as the reference reads them, and the packed
/// weights (a graph input's value where the case says so).
fn case_model(c: &Case, x_dims: &[usize], seed: u64) -> (Vec<u8>, Weights, Tensor) {
    let (k, n, bs) = (c.k, c.n, c.block_size);
    let blocks = k.div_ceil(bs);
    let codes: Vec<u8> = ints(n * blocks * bs, 0, 15, seed).iter().map(|&v| v as u8).collect();
    // onnxruntime's packing: per column and block, weight 2j in byte j's low 4 bits, 2j + 1 in
    // its high 4 bits. (Codes past K are packed as they are; they must not count.)
    let packed: Vec<f64> =
        (0..n * blocks * bs / 2).map(|i| (codes[2 * i] | (codes[2 * i + 1] << 4)) as f64).collect();
    let scales: Vec<f32> =
        ints(n * blocks, 1, 60, seed + 1).iter().map(|v| *v as f32 * 0.002).collect();
    let zero_codes: Vec<u8> = ints(n * blocks, 0, 15, seed + 2).iter().map(|&v| v as u8).collect();
    let bias: Vec<f32> = ints(n, -300, 300, seed + 3).iter().map(|v| *v as f32 * 0.01).collect();
    let mut initializer = vec![init(
        t(DType::F32, &[n * blocks], scales.iter().map(|&v| v as f64).collect()),
        "scales",
    )];
    let packed = t(DType::U8, &[n, blocks, bs / 2], packed);
    let mut graph_inputs = vec![value("x", data_type::FLOAT, x_dims)];
    if c.weights_input {
        graph_inputs.push(value("w", data_type::UINT8, &[n, blocks, bs / 2]));
    } else {
        initializer.push(init(packed.clone(), "w"));
    }
    let zeros = match c.zeros {
        Zeros::None => {
            vec![8.0; n * blocks]
        }
        Zeros::Packed => {
            let per_col = blocks.div_ceil(2);
            let mut bytes = vec![0f64; n * per_col];
            for col in 0..n {
                for b in 0..blocks {
                    let z = zero_codes[col * blocks + b] as u32;
                    bytes[col * per_col + b / 2] += (z << (4 * (b % 2))) as f64;
                }
            }
            initializer.push(init(t(DType::U8, &[n * per_col], bytes), "zeros"));
            zero_codes.iter().map(|&z| z as f32).collect()
        }
        Zeros::F32 => {
            let z: Vec<f32> = zero_codes.iter().map(|&z| z as f32 + 0.25).collect();
            initializer.push(init(
                t(DType::F32, &[n * blocks], z.iter().map(|&v| v as f64).collect()),
                "zeros",
            ));
            z
        }
    };
    if c.bias {
        initializer
            .push(init(t(DType::F32, &[n], bias.iter().map(|&v| v as f64).collect()), "bias"));
    }
    let zp = if matches!(c.zeros, Zeros::None) { "" } else { "zeros" };
    let b = if c.bias { "bias" } else { "" };
    let attrs = vec![
        int_attr("K", k as i64),
        int_attr("N", n as i64),
        int_attr("bits", 4),
        int_attr("block_size", bs as i64),
        int_attr("accuracy_level", 4),
    ];
    let mut y_dims = x_dims.to_vec();
    *y_dims.last_mut().unwrap() = n;
    let inputs = ["x", "w", "scales", zp, "", b];
    let bytes = model(attrs, &inputs, initializer, graph_inputs, &y_dims);
    let bias = if c.bias { bias } else { vec![0.0; n] };
    (bytes, Weights { codes, scales, zeros, bias }, packed)
}

/// x * dequantize(w)^T + b in f64, from the codes, scales and zero points as drawn.
fn reference(x: &[f64], k: usize, n: usize, bs: usize, w: &Weights) -> Vec<f64> {
    let blocks = k.div_ceil(bs);
    let rows = x.len() / k;
    let mut y = vec![0f64; rows * n];
    for r in 0..rows {
        for col in 0..n {
            let mut acc = w.bias[col] as f64;
            for kk in 0..k {
                let at = col * blocks + kk / bs;
                let code = w.codes[at * bs + kk % bs] as f64;
                acc += x[r * k + kk] * (code - w.zeros[at] as f64) * w.scales[at] as f64;
            }
            y[r * n + col] = acc;
        }
    }
    y
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 2e-5 * scale, "{what}: element {i}: {a} against {b}");
    }
}

fn run_case(c: &Case, seed: u64) {
    for &rows in c.rows {
        let x_dims =
            if rows % 2 == 0 && rows > 2 { vec![2, rows / 2, c.k] } else { vec![rows, c.k] };
        let (bytes, w, packed) = case_model(c, &x_dims, seed);
        let graph: Graph = kiln_ir::onnx::load_bytes(&bytes, None).unwrap().graph;
        let xv: Vec<f64> =
            ints(rows * c.k, -1000, 1000, seed + 9).iter().map(|v| v * 0.001).collect();
        let x = t(DType::F32, &x_dims, xv.clone());
        let mut inputs = vec![x];
        if c.weights_input {
            inputs.push(packed);
        }
        let what = format!("K={} N={} block {} rows {rows}", c.k, c.n, c.block_size);
        let want = reference(&xv, c.k, c.n, c.block_size, &w);
        let interpreted = eval::run(&graph, &inputs).unwrap();
        close(&interpreted[0].to_f64s(), &want, &format!("{what}: interpreter"));
        let options = Options { cache: false, ..Options::default() };
        let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
        let on_kernel = schedule.contains("microkernel: 4-bit weight-only matrix product");
        assert_eq!(on_kernel, !c.weights_input, "{what}: {schedule}");
        let load = LoadOptions { threads: Some(2), ..LoadOptions::default() };
        let exe = kiln_compiler::jit(&graph, &options, &load).unwrap();
        let got = exe.run(&inputs).unwrap();
        close(&got[0].to_f64s(), &want, &format!("{what}: compiled"));
        // The kernel holds scratch (each strip's weights as f32) only for more than 4 rows, and
        // no more than the artifact bounds it by.
        crate::microkernel::assert_scratch_bounded(&exe, 2);
        if on_kernel {
            assert_eq!(exe.kernel_scratch_peak() > 0, rows > 4, "{what}: scratch held");
        }
    }
}

/// Blocks of 16 (a 32-weight group spans two), 32 and 128; K a whole number of blocks or not,
/// and not of 32; N not a whole number of 4-column strips; packed, f32 and absent zero points;
/// with and without the bias; one row (decoding) to 4, which read the packed weights, and 6 to
/// 64, which make each strip's weights f32 once (4-row tiles and the rest).
#[test]
fn matmul_nbits_runs_on_the_cpu_kernel() {
    let cases = [
        Case {
            rows: &[1, 6],
            k: 100,
            n: 37,
            block_size: 32,
            zeros: Zeros::Packed,
            bias: true,
            weights_input: false,
        },
        Case {
            rows: &[1, 4, 10],
            k: 72,
            n: 21,
            block_size: 16,
            zeros: Zeros::F32,
            bias: false,
            weights_input: false,
        },
        Case {
            rows: &[3],
            k: 200,
            n: 9,
            block_size: 128,
            zeros: Zeros::None,
            bias: true,
            weights_input: false,
        },
        Case {
            rows: &[1, 17, 64],
            k: 256,
            n: 64,
            block_size: 32,
            zeros: Zeros::Packed,
            bias: false,
            weights_input: false,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        run_case(c, 11 + 20 * i as u64);
    }
}

/// Packed weights that are not constants take the decomposition every target without the
/// kernel takes (BitwiseAnd and BitShift unpack them, a Gemm multiplies).
#[test]
fn matmul_nbits_decomposes_where_the_weights_are_not_constants() {
    let c = Case {
        rows: &[1, 5],
        k: 80,
        n: 11,
        block_size: 16,
        zeros: Zeros::Packed,
        bias: true,
        weights_input: true,
    };
    run_case(&c, 5);
}

/// The decomposition computes what the interpreter computes for the op (constant weights, as
/// the GPU targets see them).
#[test]
fn matmul_nbits_decomposition_keeps_the_interpreters_results() {
    let c = Case {
        rows: &[4],
        k: 96,
        n: 13,
        block_size: 32,
        zeros: Zeros::F32,
        bias: true,
        weights_input: false,
    };
    let (bytes, _, _) = case_model(&c, &[4, 96], 3);
    let graph = kiln_ir::onnx::load_bytes(&bytes, None).unwrap().graph;
    let x = t(DType::F32, &[4, 96], ints(4 * 96, -500, 500, 4).iter().map(|v| v * 0.01).collect());
    let want = eval::run(&graph, std::slice::from_ref(&x)).unwrap();
    let mut g = graph.clone();
    assert!(kiln_compiler::passes::decompose::run(&mut g).unwrap());
    assert!(!g.nodes().any(|(_, n)| matches!(n.op, kiln_ir::Op::MatMulNBits { .. })));
    let got = eval::run(&g, &[x]).unwrap();
    close(&got[0].to_f64s(), &want[0].to_f64s(), "decomposed");
}

/// Bad attributes and operands are refused naming the node and what is wrong.
#[test]
fn matmul_nbits_refuses_what_it_cannot_run() {
    let (k, n) = (64usize, 8usize);
    let attrs = |bits: i64, bs: i64| {
        vec![
            int_attr("K", k as i64),
            int_attr("N", n as i64),
            int_attr("bits", bits),
            int_attr("block_size", bs),
        ]
    };
    let load =
        |attrs: Vec<AttributeProto>, w_dims: &[usize], scales: usize, g_idx: Option<Vec<f64>>| {
            let w = t(DType::U8, w_dims, vec![0x88 as f64; w_dims.iter().product()]);
            let mut initializer =
                vec![init(w, "w"), init(t(DType::F32, &[scales], vec![0.1; scales]), "scales")];
            let mut inputs = vec!["x", "w", "scales"];
            if let Some(g) = g_idx {
                initializer.push(init(t(DType::I32, &[k], g), "g_idx"));
                inputs.extend(["", "g_idx"]);
            }
            let bytes = model(
                attrs,
                &inputs,
                initializer,
                vec![value("x", data_type::FLOAT, &[1, k])],
                &[1, n],
            );
            kiln_ir::onnx::load_bytes(&bytes, None).map(|_| ()).unwrap_err().to_string()
        };
    let e = load(attrs(3, 32), &[n, 2, 12], 2 * n, None);
    assert!(e.contains("`q4`") && e.contains("3-bit weights are not supported"), "{e}");
    let e = load(attrs(4, 24), &[n, 3, 12], 3 * n, None);
    assert!(e.contains("`q4`") && e.contains("block_size 24 is not a power of two"), "{e}");
    let e = load(attrs(4, 8), &[n, 8, 4], 8 * n, None);
    assert!(e.contains("block_size 8 is not a power of two of 16 or more"), "{e}");
    let e = load(attrs(4, 32), &[n, 2, 8], 2 * n, None);
    assert!(e.contains("q4") && e.contains("packed weights") && e.contains("[8, 2, 16]"), "{e}");
    let e = load(attrs(4, 32), &[n, 2, 16], n, None);
    assert!(e.contains("`q4`") && e.contains("scales"), "{e}");
    let shuffled: Vec<f64> = (0..k).map(|i| ((i + 1) % 2) as f64).collect();
    let e = load(attrs(4, 32), &[n, 2, 16], 2 * n, Some(shuffled));
    assert!(e.contains("`q4`") && e.contains("g_idx"), "{e}");
    let mut no_k = attrs(4, 32);
    no_k.remove(0);
    let e = load(no_k, &[n, 2, 16], 2 * n, None);
    assert!(e.contains("`q4`") && e.contains("attribute `K` is missing"), "{e}");
    // The identity's g_idx is accepted.
    let trivial: Vec<f64> = (0..k).map(|i| (i / 32) as f64).collect();
    let w = t(DType::U8, &[n, 2, 16], vec![0x88 as f64; n * 32]);
    let bytes = model(
        attrs(4, 32),
        &["x", "w", "scales", "", "g_idx"],
        vec![
            init(w, "w"),
            init(t(DType::F32, &[2 * n], vec![0.1; 2 * n]), "scales"),
            init(t(DType::I32, &[k], trivial), "g_idx"),
        ],
        vec![value("x", data_type::FLOAT, &[1, k])],
        &[1, n],
    );
    kiln_ir::onnx::load_bytes(&bytes, None).unwrap();
}
