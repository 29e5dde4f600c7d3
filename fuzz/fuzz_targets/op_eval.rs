//! Structure-aware: the bytes choose one supported ONNX op, 1 to 3 operands (graph inputs of
//! small shapes, or small integer or float constants) and up to 4 attributes from the names ops
//! use; the model is built as protobuf, imported, and when it imports with static shapes of
//! modest size, run by the interpreter on random inputs. Every op's inference and evaluation
//! meets odd ranks, axes, attribute values and operand counts, which must give errors, not
//! panics. `KILN_FUZZ_PRINT=1` prints each imported graph (to see what a crash input builds).
#![no_main]

use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::{DType, Tensor};
use libfuzzer_sys::fuzz_target;
use prost::Message;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }
    fn pick<'t, T>(&mut self, from: &'t [T]) -> &'t T {
        &from[self.byte() as usize % from.len()]
    }
    fn small(&mut self) -> i64 {
        (self.byte() % 9) as i64 - 3
    }
}

const INT_ATTRS: &[&str] = &[
    "axis",
    "keepdims",
    "to",
    "transA",
    "transB",
    "group",
    "k",
    "largest",
    "sorted",
    "num_outputs",
    "select_last_index",
    "exclusive",
    "reverse",
    "upper",
    "blocksize",
    "allowzero",
    "batch_dims",
    "center_point_box",
    "count_include_pad",
    "ceil_mode",
    "storage_order",
    "p",
    "noop_with_empty_axes",
    "hidden_size",
    "layout",
    "stash_type",
    "detect_negative",
    "detect_positive",
    "output_height",
    "is_causal",
    "num_groups",
    "dtype",
    "seed",
    "time_axis",
    "batch_axis",
];
const INTS_ATTRS: &[&str] = &["axes", "perm", "kernel_shape", "strides", "pads", "dilations", "shape", "split", "output_padding", "starts", "ends"];
const FLOAT_ATTRS: &[&str] = &["alpha", "beta", "epsilon", "gamma", "bias", "lambd", "momentum", "min", "max", "ratio", "scale"];
const STRING_ATTRS: &[(&str, &[&str])] = &[
    ("mode", &["constant", "reflect", "edge", "nearest", "linear", "cubic", "DCR", "CRD", "bilinear"]),
    ("auto_pad", &["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
    ("reduction", &["none", "add", "mul", "mean", "sum", "max", "min"]),
    ("direction", &["forward", "reverse", "bidirectional"]),
    ("coordinate_transformation_mode", &["half_pixel", "asymmetric", "align_corners"]),
    ("equation", &["ij,jk->ik", "ii->i", "i,i", "bij->bji", "...i->i"]),
];
const ELEM: &[(i32, DType)] =
    &[(data_type::FLOAT, DType::F32), (data_type::INT64, DType::I64), (data_type::BOOL, DType::Bool), (data_type::INT32, DType::I32)];

fn attribute(b: &mut Bytes) -> AttributeProto {
    let name = |s: &&str| Some(s.to_string());
    match b.byte() % 4 {
        0 => AttributeProto { name: name(b.pick(INT_ATTRS)), r#type: Some(attribute_type::INT), i: Some(b.small()), ..Default::default() },
        1 => {
            let n = b.byte() % 5;
            let ints = (0..n).map(|_| b.small()).collect();
            AttributeProto { name: name(b.pick(INTS_ATTRS)), r#type: Some(attribute_type::INTS), ints, ..Default::default() }
        }
        2 => AttributeProto {
            name: name(b.pick(FLOAT_ATTRS)),
            r#type: Some(attribute_type::FLOAT),
            f: Some(b.small() as f32 * 0.5),
            ..Default::default()
        },
        _ => {
            let &(n, values) = b.pick(STRING_ATTRS);
            let s = b.pick(values).as_bytes().to_vec();
            AttributeProto { name: name(&n), r#type: Some(attribute_type::STRING), s: Some(s), ..Default::default() }
        }
    }
}

fn model(b: &mut Bytes) -> (Vec<u8>, Vec<Tensor>) {
    let op = b.pick(kiln_ir::onnx::supported_ops()).to_string();
    let (mut inputs, mut initializers, mut names, mut feeds) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..1 + b.byte() % 3 {
        let name = format!("in{i}");
        let (elem, dtype) = *b.pick(ELEM);
        let rank = b.byte() % 4;
        let dims: Vec<usize> = (0..rank).map(|_| 1 + (b.byte() % 4) as usize).collect();
        if b.byte() % 3 == 0 && dtype == DType::I64 {
            // A small integer constant (shapes, axes, counts).
            let n: usize = dims.iter().product();
            let values: Vec<i64> = (0..n).map(|_| b.small()).collect();
            initializers.push(TensorProto {
                name: Some(name.clone()),
                dims: dims.iter().map(|&d| d as i64).collect(),
                data_type: Some(elem),
                int64_data: values,
                ..Default::default()
            });
        } else {
            let dim = dims.iter().map(|&d| tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d as i64)) }).collect();
            let ty = TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(elem), shape: Some(TensorShapeProto { dim }) })),
            };
            inputs.push(ValueInfoProto { name: Some(name.clone()), r#type: Some(ty) });
            feeds.push(Tensor::random(dtype, &dims, i as u64));
        }
        names.push(name);
    }
    let attribute = (0..b.byte() % 5).map(|_| attribute(b)).collect();
    let outputs = 1 + b.byte() % 2;
    let out_names: Vec<String> = (0..outputs).map(|i| format!("out{i}")).collect();
    let node = NodeProto { op_type: Some(op), name: Some("n".into()), input: names, output: out_names.clone(), attribute, domain: None };
    let output = out_names.iter().map(|n| ValueInfoProto { name: Some(n.clone()), r#type: None }).collect();
    let graph = GraphProto { name: Some("g".into()), node: vec![node], input: inputs, output, initializer: initializers, ..Default::default() };
    let opset = 7 + (b.byte() % 21) as i64;
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(graph),
        ..Default::default()
    };
    (m.encode_to_vec(), feeds)
}

fuzz_target!(|data: &[u8]| {
    let (bytes, feeds) = model(&mut Bytes(data));
    let Ok(m) = kiln_ir::onnx::load_bytes(&bytes, None) else { return };
    // Run only what is static and modest: a shape from a value could ask for anything.
    let modest = m.graph.nodes().all(|(_, n)| n.outputs.iter().all(|t| t.shape.numel().is_some_and(|e| e <= 1 << 16)));
    if std::env::var_os("KILN_FUZZ_PRINT").is_some() {
        eprintln!("{}", m.graph);
    }
    if modest {
        let _ = kiln_ir::eval::run(&m.graph, &feeds);
    }
});
