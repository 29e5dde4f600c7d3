//! The ONNX frontend: models built here with the prost messages, imported and run; opset
//! rewrites; and malformed input, which must give clear errors, never panics.

pub(super) use kiln_ir::onnx::proto::attr::int;
use kiln_ir::onnx::proto::attr::{float, ints};
use kiln_ir::onnx::proto::*;
use kiln_ir::onnx::{self, proto::tensor_shape_proto::dimension::Value as DimValue};
use kiln_ir::{eval, AttrError, DType, IrError, OpError, Tensor};
use prost::Message;
use std::path::Path;

use super::{assert_close, f32s};

fn tensor_type(elem: i32, dims: &[Option<i64>], params: &[&str]) -> TypeProto {
    let dim = dims
        .iter()
        .enumerate()
        .map(|(i, d)| tensor_shape_proto::Dimension {
            value: match d {
                Some(n) => Some(DimValue::DimValue(*n)),
                None => params
                    .get(i)
                    .filter(|p| !p.is_empty())
                    .map(|p| DimValue::DimParam(p.to_string())),
            },
        })
        .collect();
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(TensorShapeProto { dim }),
        })),
    }
}

pub(super) fn value(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(tensor_type(elem, &dims.iter().map(|&d| Some(d)).collect::<Vec<_>>(), &[])),
    }
}

pub(super) fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: Some(name.into()),
        op_type: Some(op.into()),
        domain: None,
        attribute: attrs,
    }
}

pub(super) fn f32_init(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::FLOAT),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

pub(super) fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    init: Vec<TensorProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        producer_name: Some("kiln-tests".into()),
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            initializer: init,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

pub(super) fn load(bytes: &[u8]) -> Result<onnx::Model, IrError> {
    onnx::load_bytes(bytes, None)
}

/// y = relu(x * w + b) with w, b initializers.
fn small_model() -> Vec<u8> {
    model(
        17,
        vec![
            node("Mul", "mul", &["x", "w"], &["xw"], vec![]),
            node("Add", "add", &["xw", "b"], &["pre"], vec![]),
            node("Relu", "relu", &["pre"], &["y"], vec![]),
        ],
        vec![value("x", data_type::FLOAT, &[2, 3])],
        vec![value("y", data_type::FLOAT, &[2, 3])],
        vec![f32_init("w", &[3], &[1., -1., 2.]), f32_init("b", &[1], &[0.5])],
    )
}

#[test]
fn a_small_model_imports_and_runs() {
    let m = load(&small_model()).unwrap();
    assert_eq!(m.default_opset(), 17);
    assert_eq!(m.producer, "kiln-tests");
    let y = eval::run(&m.graph, &[f32s(&[2, 3], &[1., 2., 3., -1., -2., -3.])]).unwrap();
    assert_close(&y[0], &[2, 3], &[1.5, 0., 6.5, 0., 2.5, 0.], 0.0);
    insta::assert_snapshot!("onnx_small_model", m.graph.to_string());
}

#[test]
fn symbolic_and_unnamed_dimensions_become_symbols() {
    let bytes = model(
        17,
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(tensor_type(data_type::FLOAT, &[None, None, Some(4)], &["batch", ""])),
        }],
        vec![value("y", data_type::FLOAT, &[])],
        vec![],
    );
    let m = load(&bytes).unwrap();
    assert_eq!(m.graph.node(m.graph.inputs()[0]).outputs[0].to_string(), "f32[batch,x_d1,4]");
    let y = eval::run(&m.graph, &[Tensor::zeros(DType::F32, &[2, 5, 4])]).unwrap();
    assert_eq!(y[0].dims(), &[2, 5, 4]);
}

#[test]
fn negative_dimensions_of_inputs_are_symbols() {
    // Paddle2ONNX and some TF exporters declare a dynamic size as -1 (and onnxruntime runs it).
    let bytes = model(
        17,
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(tensor_type(data_type::FLOAT, &[Some(-1), Some(3), Some(-1)], &[])),
        }],
        vec![value("y", data_type::FLOAT, &[])],
        vec![],
    );
    let m = load(&bytes).unwrap();
    assert_eq!(m.graph.node(m.graph.inputs()[0]).outputs[0].to_string(), "f32[x_d0,3,x_d2]");
    let y = eval::run(&m.graph, &[Tensor::zeros(DType::F32, &[2, 3, 7])]).unwrap();
    assert_eq!(y[0].dims(), &[2, 3, 7]);
}

#[test]
fn every_unsupported_op_is_reported_at_once() {
    let bytes = model(
        17,
        vec![
            node("ImageDecoder", "u1", &["x"], &["a"], vec![]),
            node("Relu", "r", &["a"], &["b"], vec![]),
            node("ImageDecoder", "u2", &["b"], &["c"], vec![]),
            NodeProto {
                domain: Some("com.example".into()),
                ..node("Fancy", "f", &["c"], &["y"], vec![])
            },
        ],
        vec![value("x", data_type::FLOAT, &[4])],
        vec![value("y", data_type::FLOAT, &[4])],
        vec![],
    );
    let e = load(&bytes).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the model uses 2 unsupported ops:\n  ImageDecoder (domain ai.onnx, opset 17): 2 nodes (u1, u2)\n  Fancy (domain com.example, opset 0): 1 node (f)"
    );
}

#[test]
fn malformed_files_are_clear_errors() {
    let good = small_model();
    let e = load(&good[..good.len() / 2]).unwrap_err().to_string();
    assert!(e.starts_with("not a valid ONNX model (corrupt or truncated protobuf"), "{e}");
    let noise: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let e = load(&noise).unwrap_err().to_string();
    assert!(e.starts_with("not a valid ONNX model") || e.starts_with("not an ONNX model"), "{e}");
    assert_eq!(load(&[]).unwrap_err().to_string(), "the file is empty, not an ONNX model");
    // A valid protobuf that is not a model: a tensor.
    let e = load(&onnx::encode_tensor(&Tensor::scalar(1f32), "t")).unwrap_err().to_string();
    assert!(e.starts_with("not an ONNX model") || e.starts_with("not a valid ONNX model"), "{e}");
    let e = onnx::load("/nonexistent/model.onnx").unwrap_err().to_string();
    assert!(e.starts_with("/nonexistent/model.onnx: No such file"), "{e}");
}

/// A model whose Relu carries `n` empty attributes: 2 bytes each in the file. Written on the
/// wire, not encoded from structs, so that making it takes no more memory than the file.
fn empty_attributes(n: usize) -> Vec<u8> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let field = |tag: u32, payload: &[u8], out: &mut Vec<u8>| {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    };
    let mut relu = node("Relu", "relu", &["x"], &["y"], vec![]).encode_to_vec();
    for _ in 0..n {
        // Field 5 (attribute), an empty message.
        relu.extend([0x2a, 0x00]);
    }
    let mut graph = Vec::new();
    field(1, &relu, &mut graph);
    let x = GraphProto { input: vec![value("x", data_type::FLOAT, &[4])], ..Default::default() };
    graph.extend(x.encode_to_vec());
    let opsets = vec![OperatorSetIdProto { domain: None, version: Some(17) }];
    let mut bytes = ModelProto { ir_version: Some(8), opset_import: opsets, ..Default::default() }
        .encode_to_vec();
    field(7, &graph, &mut bytes);
    bytes
}

/// This process's peak resident memory (bytes), from `/proc/self/status`.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc");
    line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).expect("VmHWM in kB") * 1024
}

#[test]
fn decoding_a_model_takes_memory_in_proportion_to_its_size() {
    // 300,000 empty attributes, 600 kB: 1224 bytes each once decoded (367 MB) before their
    // sub-messages were boxed, and 80 more each as kiln attributes before being refused.
    let n = 300_000;
    if std::env::var_os("KILN_TEST_DECODE_PEAK").is_some() {
        // In a child process (below): its peak memory is this decode's alone.
        let bytes = empty_attributes(n);
        let before = peak_rss();
        let e = load(&bytes).unwrap_err().to_string();
        assert_eq!(
            e,
            "node `relu` (Relu): attribute 0 (of 300000) has no name, which ONNX requires"
        );
        let grew = peak_rss().saturating_sub(before);
        // At most 256 bytes a message (128 times its smallest encoding), and some slack.
        assert!(
            grew < 160 * bytes.len() as u64,
            "decoding {} bytes took {grew} bytes",
            bytes.len()
        );
        return;
    }
    // Over the memory budget, the model is refused before it is decoded, saying what it holds.
    let bytes = empty_attributes(n);
    let options = onnx::ImportOptions { max_memory: Some(16 << 20), ..Default::default() };
    let e = onnx::load_bytes_with(&bytes, None, &options).unwrap_err().to_string();
    assert!(
        e.starts_with("decoding the model would take 7680") && e.contains(
            "more than the memory budget of 16777216 bytes (16.0 MiB) (the memory available, or --max-memory): it holds 300000 attributes (73.2 MiB; 300000 on node `relu` (Relu))"
        ),
        "{e}"
    );
    if cfg!(target_os = "linux") {
        let exe = std::env::current_exe().expect("the test binary's path");
        let name = "onnx::decoding_a_model_takes_memory_in_proportion_to_its_size";
        let out = std::process::Command::new(exe)
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env("KILN_TEST_DECODE_PEAK", "1")
            .output()
            .expect("the test binary runs again");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "in a child process:\n{text}");
    }
}

#[test]
fn a_tensor_whose_data_does_not_match_its_type_is_an_error() {
    let mut w = f32_init("w", &[3], &[]);
    w.int64_data = vec![1, 2, 3];
    let bytes = model(
        17,
        vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[3])],
        vec![value("y", data_type::FLOAT, &[3])],
        vec![w],
    );
    assert_eq!(
        load(&bytes).unwrap_err().to_string(),
        "tensor `w`: f32[3] needs 3 values, the file holds 0"
    );
    let mut raw = f32_init("w", &[3], &[]);
    raw.raw_data = Some(vec![0; 11]);
    let bytes = model(
        17,
        vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[3])],
        vec![value("y", data_type::FLOAT, &[3])],
        vec![raw],
    );
    assert_eq!(
        load(&bytes).unwrap_err().to_string(),
        "tensor `w`: f32[3] needs 12 bytes of raw data, the file holds 11"
    );
}

#[test]
fn external_data_is_read_beside_the_model_and_its_absence_is_named() {
    let dir = std::env::temp_dir().join(format!("kiln-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(data_type::FLOAT),
        data_location: Some(1),
        ..Default::default()
    };
    let entry =
        |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    w.external_data =
        vec![entry("location", "model.onnx.data"), entry("offset", "4"), entry("length", "12")];
    let bytes = model(
        17,
        vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[3])],
        vec![value("y", data_type::FLOAT, &[3])],
        vec![w],
    );
    std::fs::write(dir.join("model.onnx"), &bytes).unwrap();
    let e = onnx::load(dir.join("model.onnx")).unwrap_err().to_string();
    assert!(
        e.contains("tensor `w`: cannot read external data file") && e.contains("model.onnx.data"),
        "{e}"
    );
    let mut data = vec![0u8; 4];
    for v in [1f32, 2., 3.] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("model.onnx.data"), &data[..10]).unwrap();
    let e = onnx::load(dir.join("model.onnx")).unwrap_err().to_string();
    assert!(e.contains("holds 10 bytes, bytes 4..16 wanted (truncated?)"), "{e}");
    std::fs::write(dir.join("model.onnx.data"), &data).unwrap();
    let m = onnx::load(dir.join("model.onnx")).unwrap();
    let y = eval::run(&m.graph, &[f32s(&[3], &[1., 1., 1.])]).unwrap();
    assert_close(&y[0], &[3], &[1., 2., 3.], 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// External data through links: a location is read only if, after every link is followed, it is
/// a regular file inside the model's directory (`w.bin -> /etc/passwd` put that file into the
/// model's output; `-> /dev/zero` read until memory ran out).
#[cfg(unix)]
#[test]
fn external_data_through_links_must_stay_a_file_in_the_models_folder() {
    let dir = std::env::temp_dir().join(format!("kiln-onnx-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let entry =
        |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    let with_location = |loc: &str| {
        let w = TensorProto {
            name: Some("w".into()),
            dims: vec![3],
            data_type: Some(data_type::FLOAT),
            data_location: Some(1),
            external_data: vec![entry("location", loc), entry("length", "12")],
            ..Default::default()
        };
        let bytes = model(
            17,
            vec![node("Mul", "mul", &["x", "w"], &["y"], vec![])],
            vec![value("x", data_type::FLOAT, &[3])],
            vec![value("y", data_type::FLOAT, &[3])],
            vec![w],
        );
        std::fs::write(dir.join("model.onnx"), &bytes).unwrap();
        onnx::load(dir.join("model.onnx"))
    };
    let link = |name: &str, to: &Path| {
        let _ = std::fs::remove_file(dir.join(name));
        std::os::unix::fs::symlink(to, dir.join(name)).unwrap();
    };
    link("passwd.bin", Path::new("/etc/passwd"));
    let e = with_location("passwd.bin").unwrap_err().to_string();
    assert!(e.contains("leads outside the model's directory"), "{e}");
    link("zero.bin", Path::new("/dev/zero"));
    let e = with_location("zero.bin").unwrap_err().to_string();
    assert!(e.contains("leads outside the model's directory"), "{e}");
    // Inside the folder but not a file.
    link("dir.bin", &dir.join("sub"));
    let e = with_location("dir.bin").unwrap_err().to_string();
    assert!(e.contains("is not a regular file"), "{e}");
    // A link to a file inside the folder is fine, and only the tensor's bytes are read.
    let mut data = Vec::new();
    for v in [4f32, 5., 6.] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("sub/real.bin"), &data).unwrap();
    link("w.bin", &dir.join("sub/real.bin"));
    let m = with_location("w.bin").expect("a link inside the folder");
    let y = eval::run(&m.graph, &[f32s(&[3], &[1., 1., 1.])]).unwrap();
    assert_close(&y[0], &[3], &[4., 5., 6.], 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cycles_and_dangling_names_are_errors_but_unsorted_nodes_are_fine() {
    let io =
        || (vec![value("x", data_type::FLOAT, &[2])], vec![value("y", data_type::FLOAT, &[2])]);
    let (i, o) = io();
    let cycle = model(
        17,
        vec![node("Relu", "a", &["y"], &["t"], vec![]), node("Neg", "b", &["t"], &["y"], vec![])],
        i,
        o,
        vec![],
    );
    assert_eq!(load(&cycle).unwrap_err().to_string(), "the graph has a cycle through node `a`");
    let (i, o) = io();
    let dangling =
        model(17, vec![node("Add", "a", &["x", "nowhere"], &["y"], vec![])], i, o, vec![]);
    assert_eq!(
        load(&dangling).unwrap_err().to_string(),
        "node `a` (Add): input 1 `nowhere` is not defined by any node, initializer or graph input"
    );
    let (i, o) = io();
    let unsorted = model(
        17,
        vec![node("Neg", "b", &["t"], &["y"], vec![]), node("Relu", "a", &["x"], &["t"], vec![])],
        i,
        o,
        vec![],
    );
    let m = load(&unsorted).unwrap();
    assert_close(
        &eval::run(&m.graph, &[f32s(&[2], &[-1., 2.])]).unwrap()[0],
        &[2],
        &[0., -2.],
        0.0,
    );
}

#[test]
fn opsets_newer_than_kiln_knows_are_refused_unless_allowed() {
    let relu = |opset| {
        model(
            opset,
            vec![node("Relu", "r", &["x"], &["y"], vec![])],
            vec![value("x", data_type::FLOAT, &[2])],
            vec![value("y", data_type::FLOAT, &[2])],
            vec![],
        )
    };
    assert!(load(&relu(onnx::NEWEST_OPSET)).unwrap().warnings.is_empty());
    assert_eq!(
        load(&relu(99)).unwrap_err().to_string(),
        "the model imports opset 99 of the default ONNX domain; kiln knows opsets up to 27, and an op may mean something else in a newer one (--allow-newer-opsets imports it anyway)"
    );
    let allowed = onnx::load_bytes_with(
        &relu(99),
        None,
        &onnx::ImportOptions { allow_newer_opsets: true, ..Default::default() },
    )
    .unwrap();
    assert_eq!(
        allowed.warnings,
        vec!["the model imports opset 99 of the default ONNX domain; kiln knows opsets up to 27; imported as opset 27 (--allow-newer-opsets)"
            .to_string()]
    );
    assert_close(
        &eval::run(&allowed.graph, &[f32s(&[2], &[-1., 2.])]).unwrap()[0],
        &[2],
        &[0., 2.],
        0.0,
    );
}

#[test]
fn inspect_describes_a_model_that_does_not_import_and_says_why() {
    let dir = std::env::temp_dir().join(format!("kiln-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dangling.onnx");
    let bytes = model(
        17,
        vec![node("Relu", "r", &["nowhere"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[2])],
        vec![value("y", data_type::FLOAT, &[2])],
        vec![],
    );
    std::fs::write(&path, bytes).unwrap();
    let s = onnx::inspect(&path).unwrap();
    assert_eq!((s.nodes, s.inputs.len()), (1, 1));
    let want = format!("{}: node `r` (Relu): input 0 `nowhere` is not defined by any node, initializer or graph input", path.display());
    assert_eq!(s.import_error, Some(want));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Found by the op_eval fuzz target: inputs that panicked the importer.
#[test]
fn fuzzed_nodes_with_missing_operands_or_odd_weights_are_errors() {
    let x = || vec![value("x", data_type::FLOAT, &[2, 3])];
    let y = || vec![value("y", data_type::FLOAT, &[2, 3])];
    let i64s = |name: &str, v: &[i64]| TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(data_type::INT64),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let c = || vec![f32_init("c", &[2, 3], &[1., 2., 3., 4., 5., 6.]), i64s("starts", &[0])];
    // A Slice of a constant with its ends (or everything but the data) missing was folded by
    // the importer, which evaluated it without checking its operands.
    let no_ends =
        model(13, vec![node("Slice", "s", &["c", "starts"], &["y"], vec![])], vec![], y(), c());
    assert_eq!(
        load(&no_ends).unwrap_err().to_string(),
        "node `s` (Slice): takes 3 to 5 operands, got 2 (of 2 slots)"
    );
    let data_only = model(13, vec![node("Slice", "s", &["c"], &["y"], vec![])], vec![], y(), c());
    assert_eq!(
        load(&data_only).unwrap_err().to_string(),
        "node `s` (Slice): takes 3 to 5 operands, got 1 (of 1 slots)"
    );
    // A Conv whose weight has no spatial axes, with kernel_shape given.
    let conv = model(
        13,
        vec![node("Conv", "conv", &["x", "w"], &["y"], vec![ints("kernel_shape", &[3])])],
        x(),
        y(),
        vec![f32_init("w", &[3], &[1., 1., 1.])],
    );
    assert_eq!(
        load(&conv).unwrap_err().to_string(),
        "node `conv` (Conv): the weight f32[3] has no spatial axes for kernel_shape [3]"
    );
}

#[test]
fn shape_errors_name_the_onnx_node() {
    let bytes = model(
        17,
        vec![node("MatMul", "/layer/MatMul", &["x", "w"], &["y"], vec![])],
        vec![value("x", data_type::FLOAT, &[2, 3])],
        vec![value("y", data_type::FLOAT, &[2, 2])],
        vec![f32_init("w", &[4, 2], &[0.; 8])],
    );
    assert_eq!(
        load(&bytes).unwrap_err().to_string(),
        "node `/layer/MatMul` (MatMul): inner dimensions differ: f32[2,3] times f32[4,2]"
    );
}

/// A bad attribute is an `IrError::Attr`: the ONNX node, its op, the attribute and its value.
#[test]
fn bad_attributes_name_the_node_op_attribute_and_value() {
    let one = |op: &str, attrs: Vec<AttributeProto>| {
        let bytes = model(
            17,
            vec![node(op, "/enc/n", &["x"], &["y"], attrs)],
            vec![value("x", data_type::FLOAT, &[1, 1, 4, 4])],
            vec![value("y", data_type::FLOAT, &[1, 1, 4, 4])],
            vec![],
        );
        load(&bytes).unwrap_err()
    };
    let e = one("Softmax", vec![int("axis", 1), ints("axes", &[1])]);
    let unexpected = AttrError::Unexpected { op: "Softmax".into(), name: "axes".into() };
    assert_eq!(e, IrError::attr("/enc/n", "Softmax", unexpected));
    assert_eq!(e.to_string(), "node `/enc/n` (Softmax): Softmax has no attribute `axes`");
    let e = one("MaxPool", vec![ints("kernel_shape", &[2, -2])]);
    assert_eq!(
        e.to_string(),
        "node `/enc/n` (MaxPool): attribute `kernel_shape` must not hold negative values, got -2"
    );
    assert!(
        matches!(&e, IrError::Attr { error, .. } if matches!(**error, AttrError::NegativeEntry { value: -2, .. })),
        "{e:?}"
    );
    let e = one("MaxPool", vec![]);
    assert_eq!(e.to_string(), "node `/enc/n` (MaxPool): attribute `kernel_shape` is required");
    let e = one("LeakyRelu", vec![ints("alpha", &[1])]);
    assert_eq!(
        e.to_string(),
        "node `/enc/n` (LeakyRelu): attribute `alpha` must be a float, got a list of integers"
    );
    let e = one("Elu", vec![float("alpha", 1.0), int("beta", 0)]);
    assert_eq!(e.to_string(), "node `/enc/n` (Elu): Elu has no attribute `beta`");
}

/// Inference errors are `IrError::Shape` with a typed finding where one fits: the axis and the
/// type, the window and the padded input.
#[test]
fn shape_errors_carry_the_values_they_are_about() {
    let one = |op: &str, attrs: Vec<AttributeProto>| {
        let bytes = model(
            17,
            vec![node(op, "n", &["x"], &["y"], attrs)],
            vec![value("x", data_type::FLOAT, &[1, 1, 4, 4])],
            vec![value("y", data_type::FLOAT, &[1, 1, 4, 4])],
            vec![],
        );
        load(&bytes).unwrap_err()
    };
    let e = one("Softmax", vec![int("axis", 7)]);
    let IrError::Shape { node, op, error } = &e else { panic!("{e:?}") };
    let OpError::Axis { axis, ty } = error.as_ref() else { panic!("{e:?}") };
    assert_eq!(
        (node.as_str(), *op, *axis, ty.to_string()),
        ("n", "Softmax", 7, "f32[1,1,4,4]".into())
    );
    assert_eq!(e.to_string(), "node `n` (Softmax): axis 7 is out of range for f32[1,1,4,4]");
    let e = one("MaxPool", vec![ints("kernel_shape", &[6, 1])]);
    let too_wide = OpError::WindowTooWide { extent: 6, padded: 4, axis: 0 };
    assert_eq!(e, IrError::shape("n", "MaxPool", too_wide));
    let e = one("MaxPool", vec![ints("kernel_shape", &[2, 2]), ints("strides", &[1, 0])]);
    assert_eq!(
        e.to_string(),
        "node `n` (MaxPool): attribute `strides` must be positive, got [1, 0]"
    );
}

#[test]
fn attributes_that_became_operands_are_rewritten() {
    // Opset 6 Clip (bounds as attributes), opset 11 Split (sizes as an attribute), opset 12
    // ReduceSum (axes as an attribute), opset 4 Reshape (shape as an attribute).
    let clip = model(
        6,
        vec![node("Clip", "c", &["x"], &["y"], vec![float("min", -1.0), float("max", 2.0)])],
        vec![value("x", data_type::FLOAT, &[3])],
        vec![value("y", data_type::FLOAT, &[3])],
        vec![],
    );
    let m = load(&clip).unwrap();
    assert_close(
        &eval::run(&m.graph, &[f32s(&[3], &[-5., 0.5, 9.])]).unwrap()[0],
        &[3],
        &[-1., 0.5, 2.],
        0.0,
    );

    let split = model(
        11,
        vec![node("Split", "s", &["x"], &["a", "b"], vec![int("axis", 0), ints("split", &[1, 2])])],
        vec![value("x", data_type::FLOAT, &[3])],
        vec![value("b", data_type::FLOAT, &[2])],
        vec![],
    );
    let m = load(&split).unwrap();
    assert_close(
        &eval::run(&m.graph, &[f32s(&[3], &[1., 2., 3.])]).unwrap()[0],
        &[2],
        &[2., 3.],
        0.0,
    );

    let reduce = model(
        12,
        vec![node("ReduceSum", "r", &["x"], &["y"], vec![ints("axes", &[1]), int("keepdims", 0)])],
        vec![value("x", data_type::FLOAT, &[2, 2])],
        vec![value("y", data_type::FLOAT, &[2])],
        vec![],
    );
    let m = load(&reduce).unwrap();
    assert_close(
        &eval::run(&m.graph, &[f32s(&[2, 2], &[1., 2., 3., 4.])]).unwrap()[0],
        &[2],
        &[3., 7.],
        0.0,
    );

    let reshape = model(
        4,
        vec![node("Reshape", "r", &["x"], &["y"], vec![ints("shape", &[4])])],
        vec![value("x", data_type::FLOAT, &[2, 2])],
        vec![value("y", data_type::FLOAT, &[4])],
        vec![],
    );
    assert_eq!(
        load(&reshape)
            .unwrap()
            .graph
            .value_type(load(&reshape).unwrap().graph.outputs()[0].1)
            .to_string(),
        "f32[4]"
    );
}

#[test]
fn old_softmax_normalises_the_flattened_input() {
    // Opset 11 Softmax with axis 1 on [2, 2, 2]: over the last four elements of each batch row.
    let bytes = model(
        11,
        vec![node("Softmax", "s", &["x"], &["y"], vec![int("axis", 1)])],
        vec![value("x", data_type::FLOAT, &[2, 2, 2])],
        vec![value("y", data_type::FLOAT, &[2, 2, 2])],
        vec![],
    );
    let m = load(&bytes).unwrap();
    let y = eval::run(&m.graph, &[Tensor::zeros(DType::F32, &[2, 2, 2])]).unwrap();
    assert_close(&y[0], &[2, 2, 2], &[0.25; 8], 1e-7);
}

#[test]
fn variadic_ops_and_cast_like() {
    let bytes = model(
        17,
        vec![
            node("Mean", "m", &["a", "b", "c"], &["mean"], vec![]),
            node("CastLike", "c2", &["mean", "i"], &["y"], vec![]),
        ],
        vec![
            value("a", data_type::FLOAT, &[2]),
            value("b", data_type::FLOAT, &[2]),
            value("c", data_type::FLOAT, &[2]),
            value("i", data_type::INT32, &[1]),
        ],
        vec![value("y", data_type::INT32, &[2])],
        vec![],
    );
    let m = load(&bytes).unwrap();
    let y = eval::run(
        &m.graph,
        &[
            f32s(&[2], &[1., 10.]),
            f32s(&[2], &[2., 20.]),
            f32s(&[2], &[3., 30.]),
            Tensor::vector(&[0i32]),
        ],
    )
    .unwrap();
    assert_eq!(y[0].as_slice::<i32>().unwrap(), &[2, 20]);
}

#[test]
fn tensor_files_round_trip_and_bad_ones_are_named() {
    let t = Tensor::from_vec(&[2, 2], vec![1i64, -2, 3, i64::MAX]).unwrap();
    let bytes = onnx::encode_tensor(&t, "t");
    assert_eq!(onnx::decode_tensor(&bytes, None).unwrap(), t);
    let e = onnx::decode_tensor(&bytes[..bytes.len() - 3], None).unwrap_err().to_string();
    assert!(e.contains("raw data") || e.contains("truncated"), "{e}");
    let e = onnx::decode_tensor(&[], None).unwrap_err().to_string();
    assert_eq!(e, "not an ONNX tensor: it has no data type");
    let complex = TensorProto {
        dims: vec![1],
        data_type: Some(14),
        raw_data: Some(vec![0; 8]),
        ..Default::default()
    }
    .encode_to_vec();
    let e = onnx::decode_tensor(&complex, None).unwrap_err();
    assert!(matches!(e, IrError::NotSupported(_)), "{e}");
    assert_eq!(e.to_string(), "a tensor: element type COMPLEX64 is not supported");
}

/// The storage types: 8-bit floats a byte each; 4- and 2-bit values packed low bits first in
/// the file, a byte each in memory (signed ones sign-extended); written back packed.
#[test]
fn storage_type_tensors_unpack_and_round_trip() {
    let proto = |data_type: i32, dims: Vec<i64>, raw: Vec<u8>| {
        TensorProto { dims, data_type: Some(data_type), raw_data: Some(raw), ..Default::default() }
            .encode_to_vec()
    };
    // int4 [-8, 7, -1]: nibbles 0x8, 0x7 in the first byte, 0xF in the low half of the second.
    let t = onnx::decode_tensor(&proto(22, vec![3], vec![0x78, 0x0F]), None).unwrap();
    assert_eq!(t.dtype(), DType::I4);
    assert_eq!(t.to_f64s(), vec![-8.0, 7.0, -1.0]);
    assert_eq!(onnx::decode_tensor(&onnx::encode_tensor(&t, "t"), None).unwrap(), t);
    // uint2 [1, 2, 3, 0, 3]: four to a byte.
    let t = onnx::decode_tensor(&proto(25, vec![5], vec![0b0011_1001, 0b11]), None).unwrap();
    assert_eq!(t.to_f64s(), vec![1.0, 2.0, 3.0, 0.0, 3.0]);
    // float8 e4m3fn: 0x38 is 1.0, 0x7E the largest (448), 0x7F NaN; e5m2 0x7C is infinity.
    let t = onnx::decode_tensor(&proto(17, vec![3], vec![0x38, 0x7E, 0x7F]), None).unwrap();
    let v = t.to_f64s();
    assert_eq!(&v[..2], &[1.0, 448.0]);
    assert!(v[2].is_nan());
    let t = onnx::decode_tensor(&proto(19, vec![1], vec![0x7C]), None).unwrap();
    assert_eq!(t.to_f64s(), vec![f64::INFINITY]);
    // A packed tensor with too few bytes is named.
    let e = onnx::decode_tensor(&proto(21, vec![5], vec![0x12]), None).unwrap_err().to_string();
    assert!(e.contains("needs 3 bytes"), "{e}");
}

/// A sparse initializer declaring a dense size past the memory available is an error before
/// anything that size is allocated ([1e6, 1e6] aborted on allocation), and indices outside it
/// are errors, not wrapped offsets.
#[test]
fn sparse_initializers_past_memory_or_range_are_errors() {
    let sparse = |dims: &[i64], indices: &[i64]| {
        let mut g = GraphProto {
            node: vec![node("Identity", "id", &["w"], &["y"], vec![])],
            name: Some("g".into()),
            output: vec![value("y", data_type::FLOAT, dims)],
            ..Default::default()
        };
        g.sparse_initializer.push(SparseTensorProto {
            values: Some(Box::new(TensorProto {
                name: Some("w".into()),
                dims: vec![indices.len() as i64],
                data_type: Some(data_type::FLOAT),
                float_data: vec![1.0; indices.len()],
                ..Default::default()
            })),
            indices: Some(Box::new(TensorProto {
                dims: vec![indices.len() as i64],
                data_type: Some(data_type::INT64),
                int64_data: indices.to_vec(),
                ..Default::default()
            })),
            dims: dims.to_vec(),
        });
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(18),
            }],
            graph: Some(g),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let refused = |bytes: Vec<u8>| match load(&bytes) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };
    let err = refused(sparse(&[1_000_000, 1_000_000], &[0, 5]));
    assert!(err.contains("more than the") && err.contains("memory available"), "{err}");
    let err = refused(sparse(&[4, 4], &[3, 16]));
    assert!(err.contains("sparse index 16 is out of range"), "{err}");
    let err = refused(sparse(&[4, 4], &[-1]));
    assert!(err.contains("sparse index -1 is out of range"), "{err}");
    // In range: read as the dense tensor.
    let m = load(&sparse(&[2, 3], &[1, 5])).expect("loads");
    let out = eval::run(&m.graph, &[]).unwrap();
    assert_eq!(out[0].to_f64s(), vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
}

/// Nodes out of order are sorted without recursion: 30,000 nodes in a chain given in reverse
/// overflowed the stack.
#[test]
fn a_long_chain_given_in_reverse_imports() {
    let n = 30_000;
    let mut nodes: Vec<NodeProto> = (0..n)
        .map(|i| {
            let src = if i == 0 { "x".to_string() } else { format!("v{}", i - 1) };
            let dst = if i == n - 1 { "y".to_string() } else { format!("v{i}") };
            node("Relu", &format!("r{i}"), &[&src], &[&dst], vec![])
        })
        .collect();
    nodes.reverse();
    let bytes = model(
        17,
        nodes,
        vec![value("x", data_type::FLOAT, &[2])],
        vec![value("y", data_type::FLOAT, &[2])],
        vec![],
    );
    let m = load(&bytes).expect("imports");
    assert_eq!(m.graph.node_count(), n + 1);
}

/// Import-time folding never runs a Loop: one of 10^15 trips over constants never returned.
#[test]
fn a_loop_of_constants_is_not_run_when_importing() {
    let body = GraphProto {
        node: vec![
            node("Add", "acc", &["s", "one"], &["s_next"], vec![]),
            node("Identity", "c", &["cond"], &["c_next"], vec![]),
        ],
        name: Some("body".into()),
        initializer: vec![f32_init("one", &[], &[1.0])],
        input: vec![
            value("i", data_type::INT64, &[]),
            value("cond", data_type::BOOL, &[]),
            value("s", data_type::FLOAT, &[]),
        ],
        output: vec![value("c_next", data_type::BOOL, &[]), value("s_next", data_type::FLOAT, &[])],
        ..Default::default()
    };
    let loop_node = node(
        "Loop",
        "forever",
        &["trips", "go", "s0"],
        &["s"],
        vec![AttributeProto {
            name: Some("body".into()),
            r#type: Some(attribute_type::GRAPH),
            g: Some(Box::new(body)),
            ..Default::default()
        }],
    );
    let trips = TensorProto {
        name: Some("trips".into()),
        dims: vec![],
        data_type: Some(data_type::INT64),
        int64_data: vec![1_000_000_000_000_000],
        ..Default::default()
    };
    let go = TensorProto {
        name: Some("go".into()),
        dims: vec![],
        data_type: Some(data_type::BOOL),
        int32_data: vec![1],
        ..Default::default()
    };
    let bytes = model(
        17,
        vec![loop_node],
        vec![],
        vec![value("s", data_type::FLOAT, &[])],
        vec![trips, go, f32_init("s0", &[], &[0.0])],
    );
    let started = std::time::Instant::now();
    let m = load(&bytes).expect("imports");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        m.graph.nodes().any(|(_, n)| matches!(n.op, kiln_ir::Op::Loop(_))),
        "the Loop stays a node"
    );
}

/// `sum_out = sum_in + next`, `scan_out = sum_out`, its inputs and outputs without types (ONNX
/// leaves them to the Scan).
fn running_sum_body() -> AttributeProto {
    let untyped = |name: &str| ValueInfoProto { name: Some(name.into()), r#type: None };
    let body = GraphProto {
        node: vec![
            node("Add", "add", &["sum_in", "next"], &["sum_out"], vec![]),
            node("Identity", "id", &["sum_out"], &["scan_out"], vec![]),
        ],
        name: Some("body".into()),
        input: vec![untyped("sum_in"), untyped("next")],
        output: vec![untyped("sum_out"), untyped("scan_out")],
        ..Default::default()
    };
    AttributeProto {
        name: Some("body".into()),
        r#type: Some(attribute_type::GRAPH),
        g: Some(Box::new(body)),
        ..Default::default()
    }
}

#[test]
fn scan_bodies_take_untyped_inputs_from_the_scan() {
    // Opset 9: the state is [2], the scanned input [3, 2] read along axis 0 (a slice is [2]).
    let bytes = model(
        11,
        vec![node(
            "Scan",
            "scan",
            &["init", "x"],
            &["y", "z"],
            vec![int("num_scan_inputs", 1), running_sum_body()],
        )],
        vec![value("init", data_type::FLOAT, &[2]), value("x", data_type::FLOAT, &[3, 2])],
        vec![value("y", data_type::FLOAT, &[2]), value("z", data_type::FLOAT, &[3, 2])],
        vec![],
    );
    let m = load(&bytes).expect("imports");
    let x = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = eval::run(&m.graph, &[f32s(&[2], &[10.0, 20.0]), x]).unwrap();
    assert_close(&out[0], &[2], &[19.0, 32.0], 0.0);
    assert_close(&out[1], &[3, 2], &[11.0, 22.0, 14.0, 26.0, 19.0, 32.0], 0.0);
}

#[test]
fn opset_8_scans_run_each_batch_entry() {
    // Opset 8: a leading batch axis of 2 on every operand, scanned along axis 1 backwards.
    let scan = |inputs: &[&str]| {
        node(
            "Scan",
            "scan",
            inputs,
            &["y", "z"],
            vec![int("num_scan_inputs", 1), ints("directions", &[1]), running_sum_body()],
        )
    };
    let bytes = |inputs: &[&str], extra: Vec<ValueInfoProto>| {
        let mut values = vec![
            value("init", data_type::FLOAT, &[2, 1]),
            value("x", data_type::FLOAT, &[2, 2, 1]),
        ];
        values.extend(extra);
        model(
            8,
            vec![scan(inputs)],
            values,
            vec![value("y", data_type::FLOAT, &[2, 1]), value("z", data_type::FLOAT, &[2, 2, 1])],
            vec![],
        )
    };
    let m = load(&bytes(&["", "init", "x"], vec![])).expect("imports");
    let init = f32s(&[2, 1], &[0.0, 100.0]);
    let x = f32s(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    let out = eval::run(&m.graph, &[init, x]).unwrap();
    assert_close(&out[0], &[2, 1], &[3.0, 107.0], 0.0);
    // Read from the last position: entry 0 sees 2 then 1, entry 1 sees 4 then 3.
    assert_close(&out[1], &[2, 2, 1], &[2.0, 3.0, 104.0, 107.0], 0.0);
    let lens = value("lens", data_type::INT32, &[2]);
    let Err(e) = load(&bytes(&["lens", "init", "x"], vec![lens])) else { panic!("refused") };
    let e = e.to_string();
    assert!(e.contains("Scan before opset 9 with sequence_lens"), "{e}");
}
