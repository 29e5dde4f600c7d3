//! ONNX nodes to kiln ops, across opsets. Most ops map one to one through `Op::from_attrs` (kiln's
//! attribute names and defaults are ONNX's); the rest are rewritten here: attributes that later
//! opsets made operands, variadic ops, old semantics, and attributes that do not matter at
//! inference (which are dropped explicitly, so an unknown attribute is still an error).

use std::sync::Arc;

use super::import::{attrs_of, free_values, GraphImporter};
use super::proto::NodeProto;
use super::tensor::dtype_of;
use crate::error::AttrError;
use crate::op::{
    Attr, Attrs, CoordinateTransform, NearestMode, OptionalOp, Resize, ResizeMode, SequenceOp,
    Subgraph,
};
use crate::{
    BinaryOp, DType, Graph, IrError, Op, Result, Shape, Tensor, TensorType, UnaryOp, ValueId,
};

/// The ONNX op types (default domain) the importer converts that are not ops of the table (it
/// rewrites them into table ops, or builds them otherwise).
const IMPORTED: &[&str] = &[
    "Sum",
    "Mean",
    "CastLike",
    "Scatter",
    "Upsample",
    "Dropout",
    "Constant",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "QLinearMatMul",
    "QLinearConv",
    "TensorScatter",
    "MaxUnpool",
    "TfIdfVectorizer",
];

pub(super) fn is_supported(op_type: &str) -> bool {
    supported().contains(&op_type)
}

/// Every ONNX op type (default domain) the importer converts: the op table's (kiln's own left
/// out) and those it rewrites.
pub(super) fn supported() -> &'static [&'static str] {
    static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<&'static str> = Op::names()
            .into_iter()
            .filter(|n| UnaryOp::from_name(n).is_none_or(UnaryOp::is_onnx))
            .filter(|n| !crate::op::KILN_OWN.contains(n))
            .collect();
        all.extend(IMPORTED);
        all
    })
}

/// An ONNX node that makes no sense; `GraphImporter::node` names the node and op.
pub(super) fn err(msg: impl Into<String>) -> IrError {
    IrError::Onnx(msg.into())
}

/// A node's attributes that make no op; `GraphImporter::node` names the node and op.
pub(super) fn attr(error: AttrError) -> IrError {
    IrError::attr("", "", error)
}

/// A valid use of a supported op that kiln does not handle (a training mode, a legacy form).
fn unsupported(msg: impl Into<String>) -> IrError {
    IrError::NotSupported(msg.into())
}

/// Converts one node, binding its outputs.
pub(super) fn convert(im: &mut GraphImporter, node: &NodeProto, op_type: &str) -> Result<()> {
    let mut a = attrs_of(node, im.base_dir)?;
    let opset = im.opset;
    let n_out = GraphImporter::num_outputs(node).max(1);
    let x0 = im.operand(node, 0);
    let x = || x0.ok_or_else(|| err("operand 0 is missing"));
    // Attributes that never change inference results; Dropout's seed does in training mode.
    let mut seed = None;
    for ignored in ["consumed_inputs", "is_test", "seed"] {
        let v = a.remove(ignored);
        if ignored == "seed" {
            seed = v;
        }
    }
    if node.domain.as_deref() == Some("com.microsoft") {
        return super::quantized::convert_microsoft(im, node, op_type, a);
    }
    if node.domain.as_deref() == Some(super::training::DOMAIN) {
        return super::training::convert(im, node, op_type, a);
    }
    if node.domain.as_deref() == Some(super::preview::DOMAIN) {
        return super::preview::convert(im, node, op_type, a);
    }
    if node.domain.as_deref() == Some(super::ml::DOMAIN) {
        return super::ml::convert(im, node, op_type, a);
    }
    match op_type {
        "Constant" => constant(im, node, a),
        "Dropout" => dropout(im, node, a, opset, seed),
        "Cast" | "CastLike" => {
            let to = if op_type == "Cast" {
                type_attr(&mut a, "to")?
                    .ok_or_else(|| attr(AttrError::Missing { name: "to".into() }))?
            } else {
                let target =
                    im.operand(node, 1).ok_or_else(|| err("operand 1 (target_type) is missing"))?;
                im.ty(target).dtype
            };
            // Only a conversion to E8M0 rounds by `round_mode`; kiln rounds up, the default.
            match a.remove("round_mode") {
                Some(Attr::Str(m)) if m != "up" && to == DType::F8E8M0 => {
                    return Err(unsupported(format!(
                        "{op_type}: round_mode `{m}` to f8e8m0 is not supported (only `up`)"
                    )));
                }
                _ => {}
            }
            let saturate = match a.remove("saturate") {
                None => true,
                Some(Attr::Int(v)) => v != 0,
                Some(_) => return Err(err("attribute `saturate` must be an integer")),
            };
            a.finish(op_type).map_err(attr)?;
            emit(im, node, Op::Cast { to, saturate }, &[Some(x()?)], 1)
        }
        "Optional" => optional(im, node, a),
        "DynamicQuantizeLinear"
        | "MatMulInteger"
        | "ConvInteger"
        | "QLinearMatMul"
        | "QLinearConv" => super::quantized::convert(im, node, op_type, a),
        "QuantizeLinear" | "DequantizeLinear" => {
            // QuantizeLinear's `saturate` (float8 results) is the op's; DequantizeLinear has none.
            if op_type == "DequantizeLinear" {
                a.remove("saturate");
            }
            // DequantizeLinear's (opset 23) must be the scale's type, which is what kiln gives.
            let out = type_attr(&mut a, "output_dtype")?;
            let scale = im.operand(node, 1).map(|s| im.ty(s).dtype);
            match (op_type, out) {
                ("QuantizeLinear", Some(d)) => a.set("output_dtype", Attr::Type(d)),
                ("DequantizeLinear", Some(d)) if Some(d) != scale => {
                    return Err(unsupported(format!(
                        "output_dtype {} differs from the scale's type",
                        d.name()
                    )));
                }
                _ => {}
            }
            generic(im, node, op_type, a, n_out)
        }
        "SequenceMap" => sequence_map(im, node, a),
        // Type attributes are ONNX's integer codes; kiln's table holds types.
        "EyeLike" | "SequenceEmpty" | "BitCast" | "HannWindow" | "HammingWindow"
        | "BlackmanWindow" | "MelWeightMatrix" => {
            let name = match op_type {
                "BitCast" => "to",
                "EyeLike" | "SequenceEmpty" => "dtype",
                _ => "output_datatype",
            };
            if let Some(d) = type_attr(&mut a, name)? {
                a.set(name, Attr::Type(d));
            }
            generic(im, node, op_type, a, n_out)
        }
        "Attention" => {
            if let Some(d) = type_attr(&mut a, "softmax_precision")? {
                a.set("softmax_precision", Attr::Type(d));
            }
            generic(im, node, op_type, a, n_out)
        }
        "Sum" | "Mean" | "Max" | "Min" => variadic(im, node, op_type, a),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "And" | "Or" | "Xor" | "Equal" | "Less"
        | "Greater" | "PRelu"
            if opset < 7 =>
        {
            legacy_broadcast(im, node, op_type, a)
        }
        "Gemm" => {
            a.remove("broadcast");
            generic(im, node, op_type, a, n_out)
        }
        "Reshape" if opset < 5 => {
            let shape = ints_attr(&mut a, "shape")?
                .ok_or_else(|| attr(AttrError::Missing { name: "shape".into() }))?;
            let s = im.constant(node, "shape", Tensor::vector(&shape))?;
            with_operands(im, node, op_type, a, vec![Some(x()?), Some(s)], 1)
        }
        "Clip" if opset < 11 => {
            let dtype = im.ty(x()?).dtype;
            let lo = a.remove("min").map(|v| float_of(&v)).transpose()?;
            let hi = a.remove("max").map(|v| float_of(&v)).transpose()?;
            let lo = lo
                .map(|v| im.constant(node, "min", Tensor::full(dtype, &[], v as f64)))
                .transpose()?;
            let hi = hi
                .map(|v| im.constant(node, "max", Tensor::full(dtype, &[], v as f64)))
                .transpose()?;
            with_operands(im, node, op_type, a, vec![Some(x()?), lo, hi], 1)
        }
        "Split" => {
            let mut operands = vec![Some(x()?), im.operand(node, 1)];
            if opset < 13 {
                if let Some(split) = ints_attr(&mut a, "split")? {
                    operands[1] = Some(im.constant(node, "split", Tensor::vector(&split))?);
                }
            }
            if !a.contains("num_outputs") {
                a.push("num_outputs", Attr::Int(node.output.len() as i64));
            }
            with_operands(im, node, op_type, a, operands, node.output.len())
        }
        "Squeeze" | "Unsqueeze" if opset < 13 => axes_to_operand(im, node, op_type, a),
        "ReduceSum" if opset < 13 => axes_to_operand(im, node, op_type, a),
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset < 18 =>
        {
            axes_to_operand(im, node, op_type, a)
        }
        "Pad" if opset < 11 => {
            let pads = ints_attr(&mut a, "pads")?
                .or(ints_attr(&mut a, "paddings")?)
                .ok_or_else(|| attr(AttrError::Missing { name: "pads".into() }))?;
            let value = a.remove("value").map(|v| float_of(&v)).transpose()?.unwrap_or(0.0);
            let dtype = im.ty(x()?).dtype;
            let p = im.constant(node, "pads", Tensor::vector(&pads))?;
            let v = im.constant(node, "value", Tensor::full(dtype, &[], value as f64))?;
            with_operands(im, node, op_type, a, vec![Some(x()?), Some(p), Some(v)], 1)
        }
        "Slice" if opset < 10 => {
            let starts = ints_attr(&mut a, "starts")?
                .ok_or_else(|| attr(AttrError::Missing { name: "starts".into() }))?;
            let ends = ints_attr(&mut a, "ends")?
                .ok_or_else(|| attr(AttrError::Missing { name: "ends".into() }))?;
            let s = im.constant(node, "starts", Tensor::vector(&starts))?;
            let e = im.constant(node, "ends", Tensor::vector(&ends))?;
            let axes = ints_attr(&mut a, "axes")?
                .map(|v| im.constant(node, "axes", Tensor::vector(&v)))
                .transpose()?;
            with_operands(im, node, op_type, a, vec![Some(x()?), Some(s), Some(e), axes], 1)
        }
        "TopK" if opset < 10 => {
            let k = a
                .remove("k")
                .map(|v| int_of(&v))
                .transpose()?
                .ok_or_else(|| attr(AttrError::Missing { name: "k".into() }))?;
            let kc = im.constant(node, "k", Tensor::vector(&[k]))?;
            with_operands(im, node, op_type, a, vec![Some(x()?), Some(kc)], n_out)
        }
        "Softmax" | "LogSoftmax" | "Hardmax" if opset < 13 => softmax_v1(im, node, op_type, a),
        "Conv" | "ConvTranspose" => {
            if let Some(k) = ints_attr(&mut a, "kernel_shape")? {
                let w =
                    im.operand(node, 1).ok_or_else(|| err("operand 1 (the weight) is missing"))?;
                let Some(wd) = im.ty(w).shape.dims().get(2..).map(<[_]>::to_vec) else {
                    return Err(err(format!(
                        "the weight {} has no spatial axes for kernel_shape {k:?}",
                        im.ty(w)
                    )));
                };
                let agrees = k.len() == wd.len()
                    && k.iter().zip(&wd).all(|(&k, d)| d.fixed().is_none_or(|n| n as i64 == k));
                if !agrees {
                    return Err(err(format!(
                        "kernel_shape {k:?} does not match the weight {}",
                        im.ty(w)
                    )));
                }
            }
            generic(im, node, op_type, a, n_out)
        }
        "LpPool" | "GlobalLpPool" => {
            if let Some(p) = a.remove("p") {
                a.push("p", Attr::Int(float_of(&p)? as i64));
            }
            generic(im, node, op_type, a, n_out)
        }
        "BatchNormalization" => {
            let momentum = a.remove("momentum").map(|v| float_of(&v)).transpose()?.unwrap_or(0.9);
            let training =
                a.remove("training_mode").map(|v| int_of(&v)).transpose()?.is_some_and(|v| v != 0);
            if a.remove("spatial").is_some_and(|v| int_of(&v).unwrap_or(1) != 1) {
                return Err(unsupported(
                    "spatial = 0 (per-activation statistics) is not supported",
                ));
            }
            if training {
                return batch_norm_training(im, node, a, momentum);
            }
            // Before opset 14 more results meant training (with saved statistics kiln does not
            // make); from 14 on they need training_mode = 1.
            if n_out > 1 {
                return Err(unsupported("the running statistics results exist only in training mode, which is not supported"));
            }
            generic(im, node, op_type, a, 1)
        }
        "LayerNormalization" | "RMSNormalization" => {
            a.remove("stash_type");
            generic(im, node, op_type, a, n_out)
        }
        "GroupNormalization" => group_norm(im, node, a, opset),
        "DFT" if opset < 20 => dft_v17(im, node, a),
        "RoiAlign" if opset < 16 => {
            // RoiAlign-10 had no coordinate_transformation_mode: its boxes are not shifted.
            if !a.contains("coordinate_transformation_mode") {
                a.push("coordinate_transformation_mode", Attr::Str("output_half_pixel".into()));
            }
            generic(im, node, op_type, a, n_out)
        }
        "Scatter" => generic_as(im, node, "ScatterElements", a, 1),
        "TensorScatter" => super::scatter::tensor_scatter(im, node, a),
        "MaxUnpool" => super::scatter::max_unpool(im, node, a),
        "TfIdfVectorizer" => super::tfidf::tfidf_vectorizer(im, node, a),
        "Upsample" => upsample(im, node, a, opset),
        "Resize" => resize(im, node, a, opset),
        "GridSample" => {
            // GridSample-16 names the modes bilinear and bicubic; 20 renamed them linear and
            // cubic (and added 5-D inputs, which inference takes at any opset).
            match a.remove("mode") {
                Some(Attr::Str(m)) => {
                    let m = match m.as_str() {
                        "bilinear" => "linear".to_string(),
                        "bicubic" => "cubic".to_string(),
                        _ => m,
                    };
                    a.push("mode", Attr::Str(m));
                }
                // Anything else is left for from_attrs to refuse.
                Some(other) => a.push("mode", other),
                None => {}
            }
            generic(im, node, op_type, a, n_out)
        }
        "RNN" | "GRU" | "LSTM" => {
            a.remove("output_sequence");
            rnn_activations(&mut a)?;
            generic(im, node, op_type, a, n_out)
        }
        "If" => if_(im, node, a),
        "Scan" => scan(im, node, a, opset),
        "Loop" => loop_(im, node, a),
        _ => generic(im, node, op_type, a, n_out),
    }
}

/// `Op::from_attrs` on the node's own operands.
fn generic(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    a: Attrs,
    n_out: usize,
) -> Result<()> {
    generic_as(im, node, op_type, a, n_out)
}

fn generic_as(
    im: &mut GraphImporter,
    node: &NodeProto,
    kiln_name: &str,
    a: Attrs,
    n_out: usize,
) -> Result<()> {
    let operands = im.operands(node);
    with_operands(im, node, kiln_name, a, operands, n_out)
}

fn with_operands(
    im: &mut GraphImporter,
    node: &NodeProto,
    kiln_name: &str,
    a: Attrs,
    operands: Vec<Option<ValueId>>,
    n_out: usize,
) -> Result<()> {
    let op = Op::from_attrs(kiln_name, a).map_err(attr)?;
    emit(im, node, op, &operands, n_out)
}

/// Adds the node's one kiln node and binds every declared output.
fn emit(
    im: &mut GraphImporter,
    node: &NodeProto,
    op: Op,
    operands: &[Option<ValueId>],
    n_out: usize,
) -> Result<()> {
    // Trailing omitted operands are just absent.
    let used = operands.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let values = im.add(node, "", op, &operands[..used], n_out)?;
    im.bind(node, &values)
}

fn int_of(a: &Attr) -> Result<i64> {
    match a {
        Attr::Int(v) => Ok(*v),
        Attr::Float(v) => Ok(*v as i64),
        other => Err(err(format!("expected an integer attribute, got {other}"))),
    }
}

fn float_of(a: &Attr) -> Result<f32> {
    match a {
        Attr::Float(v) => Ok(*v),
        Attr::Int(v) => Ok(*v as f32),
        other => Err(err(format!("expected a float attribute, got {other}"))),
    }
}

fn ints_attr(a: &mut Attrs, name: &str) -> Result<Option<Vec<i64>>> {
    match a.remove(name) {
        None => Ok(None),
        Some(Attr::Ints(v)) => Ok(Some(v)),
        Some(other) => {
            Err(err(format!("attribute `{name}` must be a list of integers, got {other}")))
        }
    }
}

/// An integer attribute that names an ONNX data type.
fn type_attr(a: &mut Attrs, name: &str) -> Result<Option<DType>> {
    match a.remove(name) {
        None => Ok(None),
        Some(Attr::Int(t)) => {
            dtype_of(t as i32).map(Some).map_err(|e| e.context(format_args!("attribute `{name}`")))
        }
        Some(Attr::Type(t)) => Ok(Some(t)),
        Some(other) => Err(err(format!("attribute `{name}` must name a data type, got {other}"))),
    }
}

/// Before opset 7, `broadcast = 1` aligned the second operand with the first starting at `axis`
/// (default: at the end), and PRelu's slope was per channel. Both become numpy broadcasting by
/// giving the second operand trailing unit dimensions.
fn legacy_broadcast(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    mut a: Attrs,
) -> Result<()> {
    let broadcast = a.remove("broadcast").map(|v| int_of(&v)).transpose()?.unwrap_or(0) != 0;
    let axis = a.remove("axis").map(|v| int_of(&v)).transpose()?;
    let (x, b) = match (im.operand(node, 0), im.operand(node, 1)) {
        (Some(x), Some(b)) => (x, b),
        _ => return Err(err("needs two operands")),
    };
    let (ra, rb) = (im.ty(x).rank() as i64, im.ty(b).rank() as i64);
    let start = match (op_type, axis) {
        ("PRelu", _) if rb == 1 && ra > 2 => Some(1),
        (_, Some(ax)) if broadcast => Some(if ax < 0 { ax + ra } else { ax }),
        _ => None,
    };
    let b = match start {
        Some(start) if start + rb < ra && start >= 0 => {
            let dims = im
                .ty(b)
                .shape
                .as_fixed()
                .ok_or_else(|| err("a legacy broadcast operand needs a known shape"))?;
            let mut shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
            shape.extend(std::iter::repeat_n(1, (ra - start - rb) as usize));
            let s = im.constant(node, "aligned_shape", Tensor::vector(&shape))?;
            im.add(node, "aligned", Op::Reshape { allowzero: false }, &[Some(b), Some(s)], 1)?[0]
        }
        _ => b,
    };
    with_operands(im, node, op_type, a, vec![Some(x), Some(b)], 1)
}

/// DFT-17 gives the axis as an attribute (default 1); kiln takes it as an operand, as DFT-20
/// does (whose default, when the operand is absent, is -2).
fn dft_v17(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let axis = a.remove("axis").map(|v| int_of(&v)).transpose()?.unwrap_or(1);
    let x = im.operand(node, 0);
    let length = im.operand(node, 1);
    let axis = im.constant(node, "axis", Tensor::scalar(axis))?;
    with_operands(im, node, "DFT", a, vec![x, length, Some(axis)], 1)
}

/// Older opsets give axes as an attribute; kiln takes them as a constant operand.
fn axes_to_operand(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    mut a: Attrs,
) -> Result<()> {
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 is missing"))?;
    let axes = ints_attr(&mut a, "axes")?
        .map(|v| im.constant(node, "axes", Tensor::vector(&v)))
        .transpose()?;
    with_operands(im, node, op_type, a, vec![Some(x), axes], 1)
}

fn constant(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let value = if let Some(v) = a.remove("value").or_else(|| a.remove("sparse_value")) {
        match v {
            Attr::Tensor(t) => t,
            other => return Err(err(format!("`value` must be a tensor, got {other}"))),
        }
    } else if let Some(v) = a.remove("value_float") {
        Tensor::scalar(float_of(&v)?)
    } else if let Some(v) = a.remove("value_int") {
        Tensor::scalar(int_of(&v)?)
    } else if let Some(v) = a.remove("value_floats") {
        match v {
            Attr::Floats(f) => Tensor::vector(&f),
            Attr::Ints(i) if i.is_empty() => Tensor::vector::<f32>(&[]),
            other => return Err(err(format!("`value_floats` must be floats, got {other}"))),
        }
    } else if let Some(v) = ints_attr(&mut a, "value_ints")? {
        Tensor::vector(&v)
    } else if let Some(v) = a.remove("value_string") {
        match v {
            Attr::Str(s) => Tensor::from_strings(&[], vec![s])?,
            other => return Err(err(format!("`value_string` must be a string, got {other}"))),
        }
    } else if let Some(v) = a.remove("value_strings") {
        match v {
            Attr::Strs(s) => Tensor::from_strings(&[s.len()], s)?,
            Attr::Ints(i) if i.is_empty() => Tensor::from_strings(&[0], Vec::new())?,
            other => return Err(err(format!("`value_strings` must be strings, got {other}"))),
        }
    } else {
        return Err(err(
            "a Constant needs one of value, value_float(s), value_int(s), sparse_value",
        ));
    };
    a.finish("Constant").map_err(attr)?;
    let name = node
        .output
        .first()
        .filter(|o| !o.is_empty())
        .cloned()
        .unwrap_or_else(|| im.name_for(node, ""));
    let kiln_name = im.graph.unique_name(&name);
    let v = im.graph.add_constant(&kiln_name, value)?;
    im.bind(node, &[v])
}

/// BatchNormalization with `training_mode = 1` (opset 14 on): normalised by the batch's
/// statistics, with the running statistics (its optional second and third results) updated;
/// expanded into existing ops by `train::batch_norm_training`.
fn batch_norm_training(
    im: &mut GraphImporter,
    node: &NodeProto,
    mut a: Attrs,
    momentum: f32,
) -> Result<()> {
    let epsilon = a.remove("epsilon").map(|v| float_of(&v)).transpose()?.unwrap_or(1e-5);
    a.finish("BatchNormalization").map_err(attr)?;
    let operands: Vec<ValueId> = (0..5)
        .map(|i| im.operand(node, i).ok_or_else(|| err(format!("operand {i} is missing"))))
        .collect::<Result<_>>()?;
    if im.ty(operands[0]).rank() < 2 {
        return Err(err(format!("the input {} needs a channel axis", im.ty(operands[0]))));
    }
    let outs = im.trace(|b| {
        let v = |i: usize| b.value(operands[i]);
        let r = crate::train::batch_norm_training(v(0), v(1), v(2), v(3), v(4), epsilon, momentum);
        Ok(vec![r.y, r.running_mean, r.running_var])
    })?;
    im.bind(node, &outs)
}

/// Dropout is the identity at inference; its mask, when asked for, is all true. In training
/// mode (opset 12 on: `training_mode` true, or known only at run time) it is
/// `train::dropout`, whose mask is a counter-based hash of the `seed` attribute (0 when absent:
/// ONNX leaves an absent seed to the implementation) and of each element's number, so the same
/// on every target; ONNX's tests draw theirs from numpy, so only a ratio of 0 can match them.
fn dropout(
    im: &mut GraphImporter,
    node: &NodeProto,
    mut a: Attrs,
    opset: i64,
    seed: Option<Attr>,
) -> Result<()> {
    a.remove("ratio");
    a.finish("Dropout").map_err(attr)?;
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 is missing"))?;
    // Before opset 12 training was `is_test = 0` (opset < 7) or left to the runtime: inference.
    let mode = match im.operand(node, 2).filter(|_| opset >= 12) {
        None => Some(false),
        Some(t) => im.graph.constant_value(t).map(|t| t.to_f64s().iter().any(|&b| b != 0.0)),
    };
    if mode != Some(false) {
        let seed = seed.map(|s| int_of(&s)).transpose()?.unwrap_or(0);
        let ratio = im.operand(node, 1);
        let training = im.operand(node, 2);
        let outs = im.trace(|b| {
            let x = b.value(x);
            let ratio = match ratio {
                Some(r) => b.value(r),
                None => b.anon_constant(Tensor::scalar(0.5f32)),
            };
            // The seed's low 32 bits: the hash works on u32.
            let seed = b.anon_constant(Tensor::scalar(seed as u32));
            let d = crate::train::dropout(x, ratio, seed);
            Ok(match (mode, training) {
                (None, Some(t)) => {
                    let t = b.value(t);
                    let all = b.anon_constant(Tensor::scalar(true));
                    vec![t.select(d.y, x), t.select(d.mask, all)]
                }
                _ => vec![d.y, d.mask],
            })
        })?;
        return im.bind(node, &outs);
    }
    let y = im.add(node, "", Op::Identity, &[Some(x)], 1)?[0];
    let mut outs = vec![y];
    if GraphImporter::num_outputs(node) > 1 {
        let shape =
            im.add(node, "mask_shape", Op::Shape { start: 0, end: None }, &[Some(x)], 1)?[0];
        let mask = im.add(
            node,
            "mask",
            Op::ConstantOfShape { value: Tensor::vector(&[true]) },
            &[Some(shape)],
            1,
        )?[0];
        outs.push(mask);
    }
    im.bind(node, &outs)
}

/// Sum, Mean, Max, Min over any number of operands, as a chain of binary ops.
fn variadic(im: &mut GraphImporter, node: &NodeProto, op_type: &str, a: Attrs) -> Result<()> {
    a.finish(op_type).map_err(attr)?;
    let xs: Vec<ValueId> = im.operands(node).into_iter().flatten().collect();
    let first = *xs.first().ok_or_else(|| err("needs at least one operand"))?;
    let b = match op_type {
        "Sum" | "Mean" => BinaryOp::Add,
        "Max" => BinaryOp::Max,
        _ => BinaryOp::Min,
    };
    let mut acc = first;
    if xs.len() == 1 {
        acc = im.add(
            node,
            if op_type == "Mean" { "sum" } else { "" },
            Op::Identity,
            &[Some(first)],
            1,
        )?[0];
    }
    for (i, &next) in xs.iter().enumerate().skip(1) {
        let last = i == xs.len() - 1 && op_type != "Mean";
        acc = im.add(
            node,
            if last { "" } else { "step" },
            Op::Binary(b),
            &[Some(acc), Some(next)],
            1,
        )?[0];
    }
    if op_type == "Mean" {
        let dtype = im.ty(acc).dtype;
        let n = im.constant(node, "count", Tensor::full(dtype, &[], xs.len() as f64))?;
        acc = im.add(node, "", Op::Binary(BinaryOp::Div), &[Some(acc), Some(n)], 1)?[0];
    }
    im.bind(node, &[acc])
}

/// Softmax-family ops before opset 13 flatten the input to 2-D at `axis` (default 1).
fn softmax_v1(im: &mut GraphImporter, node: &NodeProto, op_type: &str, mut a: Attrs) -> Result<()> {
    let axis = a.remove("axis").map(|v| int_of(&v)).transpose()?.unwrap_or(1);
    a.finish(op_type).map_err(attr)?;
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 is missing"))?;
    let rank = im.ty(x).rank() as i64;
    let axis_n = if axis < 0 { axis + rank } else { axis };
    let make = |axis: i64| match op_type {
        "Softmax" => Op::Softmax { axis },
        "LogSoftmax" => Op::LogSoftmax { axis },
        _ => Op::Hardmax { axis },
    };
    // Normalising over the last axis only is the same in both semantics.
    if axis_n == rank - 1 {
        return emit(im, node, make(axis_n), &[Some(x)], 1);
    }
    let flat = im.add(node, "flatten", Op::Flatten { axis }, &[Some(x)], 1)?[0];
    let y = im.add(node, "2d", make(1), &[Some(flat)], 1)?[0];
    let shape = im.add(node, "shape", Op::Shape { start: 0, end: None }, &[Some(x)], 1)?[0];
    let out = im.add(node, "", Op::Reshape { allowzero: false }, &[Some(y), Some(shape)], 1)?[0];
    im.bind(node, &[out])
}

/// GroupNormalization before opset 21 has one scale and bias per group; kiln's (21) has one per
/// channel, so constant per-group parameters are repeated over each group's channels.
fn group_norm(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs, opset: i64) -> Result<()> {
    a.remove("stash_type");
    let mut operands = im.operands(node);
    if opset < 21 {
        let x = operands.first().copied().flatten().ok_or_else(|| err("operand 0 is missing"))?;
        let channels = im
            .ty(x)
            .shape
            .dims()
            .get(1)
            .and_then(|d| d.fixed())
            .ok_or_else(|| err("the channel count must be known"))?;
        for (i, what) in [(1, "scale"), (2, "bias")] {
            let v = operands
                .get(i)
                .copied()
                .flatten()
                .ok_or_else(|| err(format!("{what} is missing")))?;
            let t = im.graph.constant_value(v).cloned().ok_or_else(|| {
                err(format!("a per-group {what} (opset {opset}) must be a constant"))
            })?;
            let groups = t.len();
            if groups == 0 || channels % groups != 0 {
                return Err(err(format!("{what} has {groups} entries for {channels} channels")));
            }
            // The per-channel constant is built here, sized by the input's shape: an empty
            // input may still claim 2^32 channels (a 32 GiB allocation aborted the import).
            let bytes = crate::memory::bytes_of(&[channels], 8 + t.dtype().size());
            let available = crate::memory::available_at_start();
            if bytes.is_none_or(|b| b > available) {
                return Err(err(format!(
                    "a per-channel {what} for {channels} channels needs more than the {} of memory available",
                    crate::memory::human(available)
                )));
            }
            let per = t
                .to_f64s()
                .iter()
                .flat_map(|&v| std::iter::repeat_n(v, channels / groups))
                .collect::<Vec<_>>();
            let c = im.constant(node, what, Tensor::from_f64s(t.dtype(), &[channels], &per)?)?;
            operands[i] = Some(c);
        }
    }
    with_operands(im, node, "GroupNormalization", a, operands, 1)
}

/// Upsample (opsets 7-9) is Resize with asymmetric coordinates and floor rounding.
fn upsample(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs, opset: i64) -> Result<()> {
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 is missing"))?;
    let mode = match a.remove("mode") {
        None => ResizeMode::Nearest,
        Some(Attr::Str(m)) if m == "nearest" => ResizeMode::Nearest,
        Some(Attr::Str(m)) if m == "linear" || m == "bilinear" => ResizeMode::Linear,
        Some(other) => return Err(err(format!("unknown Upsample mode {other}"))),
    };
    let scales = if opset < 9 {
        match a.remove("scales") {
            Some(Attr::Floats(s)) => im.constant(node, "scales", Tensor::vector(&s))?,
            _ => return Err(attr(AttrError::Missing { name: "scales".into() })),
        }
    } else {
        im.operand(node, 1).ok_or_else(|| err("operand 1 (scales) is missing"))?
    };
    a.finish("Upsample").map_err(attr)?;
    let op = Op::Resize(Resize {
        mode,
        coordinate_transform: CoordinateTransform::Asymmetric,
        nearest_mode: NearestMode::Floor,
        ..Resize::default()
    });
    emit(im, node, op, &[Some(x), None, Some(scales)], 1)
}

fn resize(im: &mut GraphImporter, node: &NodeProto, a: Attrs, opset: i64) -> Result<()> {
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 is missing"))?;
    if opset < 11 {
        // Resize-10: (X, scales), asymmetric coordinates, nearest rounds down.
        let mut a = a;
        let mode = a.remove("mode").map(|m| match m {
            Attr::Str(s) => {
                ResizeMode::from_name(&s).ok_or_else(|| err(format!("unknown Resize mode `{s}`")))
            }
            other => Err(err(format!("mode must be a string, got {other}"))),
        });
        let mode = mode.transpose()?.unwrap_or(ResizeMode::Nearest);
        a.finish("Resize").map_err(attr)?;
        let scales = im.operand(node, 1).ok_or_else(|| err("operand 1 (scales) is missing"))?;
        let op = Op::Resize(Resize {
            mode,
            coordinate_transform: CoordinateTransform::Asymmetric,
            nearest_mode: NearestMode::Floor,
            ..Resize::default()
        });
        return emit(im, node, op, &[Some(x), None, Some(scales)], 1);
    }
    // Empty roi/scales tensors stand for "absent" in opsets 11-12.
    let mut operands = im.operands(node);
    for v in operands.iter_mut().skip(1) {
        if let Some(id) = *v {
            if im.ty(id).shape.numel() == Some(0) {
                *v = None;
            }
        }
    }
    with_operands(im, node, "Resize", a, operands, 1)
}

/// RNN activations come as names plus `activation_alpha`/`activation_beta` lists that the
/// activations taking parameters consume in order (as onnxruntime reads the spec); kiln spells
/// each activation with its parameters (`LeakyRelu(0.1)`).
fn rnn_activations(a: &mut Attrs) -> Result<()> {
    let names = match a.remove("activations") {
        None => return Ok(()),
        Some(Attr::Strs(v)) => v,
        Some(other) => return Err(err(format!("activations must be strings, got {other}"))),
    };
    let floats = |a: &mut Attrs, n: &str| -> Result<Vec<f32>> {
        match a.remove(n) {
            None => Ok(Vec::new()),
            Some(Attr::Floats(v)) => Ok(v),
            Some(Attr::Ints(v)) => Ok(v.iter().map(|&x| x as f32).collect()),
            Some(other) => Err(err(format!("`{n}` must be floats, got {other}"))),
        }
    };
    let (alpha, beta) = (floats(a, "activation_alpha")?, floats(a, "activation_beta")?);
    let (mut alphas, mut betas) = (alpha.into_iter(), beta.into_iter());
    let mut spelled = Vec::new();
    for name in &names {
        let u = crate::UnaryOp::from_name(name)
            .ok_or_else(|| unsupported(format!("RNN activation `{name}` is not supported")))?;
        let params = u.attrs_list();
        let text = match params.len() {
            0 => name.clone(),
            1 => format!("{name}({:?})", alphas.next().unwrap_or(params[0].1)),
            _ => format!(
                "{name}({:?}, {:?})",
                alphas.next().unwrap_or(params[0].1),
                betas.next().unwrap_or(params[1].1)
            ),
        };
        spelled.push(text);
    }
    a.push("activations", Attr::Strs(spelled));
    Ok(())
}

/// A Scan's or Loop's `body`: imported with the outer values it reads as its first inputs (their
/// names returned, in order), its own inputs without a type taking `implied`'s.
fn body_of(
    im: &GraphImporter,
    node: &NodeProto,
    op: &str,
    implied: Vec<TensorType>,
) -> Result<(Graph, Vec<String>)> {
    let body_g = node
        .attribute
        .iter()
        .find(|x| x.name.as_deref() == Some("body"))
        .and_then(|x| x.g.as_deref())
        .ok_or_else(|| attr(AttrError::Missing { name: "body".into() }))?;
    let names = free_values(body_g);
    let mut captures: Vec<(String, TensorType)> = Vec::new();
    for n in &names {
        let ty = im.visible_type(n).ok_or_else(|| {
            err(format!("the body reads `{n}`, which is not defined before the {op}"))
        })?;
        captures.push((n.clone(), ty));
    }
    let name = body_g.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "body".to_string());
    let mut body_im = GraphImporter::new(&name, im.opset, im.base_dir);
    body_im.implied_input_types = implied;
    Ok((body_im.import(body_g, &captures)?, names))
}

/// Scan (opset 9 and later): the body becomes a graph whose inputs are the outer values it reads,
/// then its own (the state, one slice of each scanned input); those outer values lead the operands.
fn scan(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs, opset: i64) -> Result<()> {
    if opset < 9 {
        return scan8(im, node, a);
    }
    let flags = |name: &str, v: Option<Vec<i64>>| -> Result<Vec<bool>> {
        v.unwrap_or_default()
            .iter()
            .map(|&d| match d {
                0 | 1 => Ok(d == 1),
                _ => Err(attr(AttrError::OutOfRange {
                    name: name.into(),
                    value: d.to_string(),
                    why: "must hold only 0 and 1",
                })),
            })
            .collect()
    };
    let scan_inputs = a.size("num_scan_inputs", 0).map_err(attr)?;
    let input_axes = a.ints("scan_input_axes").map_err(attr)?.unwrap_or_default();
    let input_reverse =
        flags("scan_input_directions", a.ints("scan_input_directions").map_err(attr)?)?;
    let output_axes = a.ints("scan_output_axes").map_err(attr)?.unwrap_or_default();
    let output_reverse =
        flags("scan_output_directions", a.ints("scan_output_directions").map_err(attr)?)?;
    a.finish("Scan").map_err(attr)?;
    if scan_inputs == 0 {
        return Err(attr(AttrError::OutOfRange {
            name: "num_scan_inputs".into(),
            value: "0".into(),
            why: "must be at least 1",
        }));
    }
    let mut given = Vec::new();
    for i in 0..node.input.len() {
        given.push(im.operand(node, i).ok_or_else(|| err(format!("operand {i} is missing")))?);
    }
    let implied = scan_implied_types(im, &given, scan_inputs, &input_axes);
    let (body, names) = body_of(im, node, "Scan", implied)?;
    let mut operands: Vec<Option<ValueId>> =
        names.iter().map(|n| im.values.get(n).copied()).collect();
    operands.extend(given.into_iter().map(Some));
    let op = Op::Scan(Box::new(crate::op::Scan {
        body: Subgraph(Arc::new(body)),
        captures: names.len(),
        scan_inputs,
        input_axes,
        input_reverse,
        output_axes,
        output_reverse,
    }));
    emit(im, node, op, &operands, node.output.len())
}

/// Scan before opset 9: `(sequence_lens?, state..., scanned...)`, every operand with a leading
/// batch axis and the scanned ones scanned along axis 1, each batch entry run on its own. Without
/// `sequence_lens` (every entry runs the full length) and with a static batch this is one
/// opset-9 Scan per entry on its slices (a Gather at the entry), the results stacked along a
/// new leading axis.
fn scan8(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    if im.operand(node, 0).is_some() {
        return Err(IrError::NotSupported(
            "Scan before opset 9 with sequence_lens (per-batch lengths) is not supported; export with opset 9 or later".into(),
        ));
    }
    let scan_inputs = a.size("num_scan_inputs", 0).map_err(attr)?;
    let directions = a.ints("directions").map_err(attr)?.unwrap_or_default();
    a.finish("Scan").map_err(attr)?;
    let reverse = directions
        .iter()
        .map(|&d| match d {
            0 | 1 => Ok(d == 1),
            _ => Err(attr(AttrError::OutOfRange {
                name: "directions".into(),
                value: d.to_string(),
                why: "must hold only 0 and 1",
            })),
        })
        .collect::<Result<Vec<bool>>>()?;
    let mut given = Vec::new();
    for i in 1..node.input.len() {
        given.push(im.operand(node, i).ok_or_else(|| err(format!("operand {i} is missing")))?);
    }
    if scan_inputs == 0 || scan_inputs > given.len() {
        return Err(attr(AttrError::OutOfRange {
            name: "num_scan_inputs".into(),
            value: scan_inputs.to_string(),
            why: "must be at least 1 and at most the operands after sequence_lens",
        }));
    }
    let batch = given
        .iter()
        .map(|&v| im.ty(v).shape.0.first().and_then(|d| d.fixed()))
        .next()
        .flatten()
        .ok_or_else(|| {
            IrError::NotSupported("Scan before opset 9 needs a static batch size".into())
        })?;
    if batch == 0 {
        return Err(IrError::NotSupported("Scan before opset 9 over an empty batch".into()));
    }
    // One batch entry's operands: each without its batch axis.
    let mut entry_types = Vec::with_capacity(given.len());
    for &v in &given {
        let ty = im.ty(v);
        if ty.shape.0.first().and_then(|d| d.fixed()) != Some(batch) {
            return Err(err(format!("operand {ty} does not lead with the batch of {batch}")));
        }
        entry_types.push(TensorType::new(ty.dtype, Shape(ty.shape.0[1..].to_vec())));
    }
    let implied = scan_implied_types_of(&entry_types, scan_inputs, &[]);
    let (body, names) = body_of(im, node, "Scan", implied)?;
    let body = Subgraph(Arc::new(body));
    let captured: Vec<Option<ValueId>> = names.iter().map(|n| im.values.get(n).copied()).collect();
    let n_out = node.output.len();
    let mut per_entry: Vec<Vec<ValueId>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let at = im.constant(node, &format!("entry{b}"), crate::Tensor::scalar(b as i64))?;
        let mut operands = captured.clone();
        for (i, &v) in given.iter().enumerate() {
            let slice = im.add(
                node,
                &format!("entry{b}/in{i}"),
                Op::Gather { axis: 0 },
                &[Some(v), Some(at)],
                1,
            )?;
            operands.push(Some(slice[0]));
        }
        let op = Op::Scan(Box::new(crate::op::Scan {
            body: body.clone(),
            captures: names.len(),
            scan_inputs,
            input_axes: Vec::new(),
            input_reverse: reverse.clone(),
            output_axes: Vec::new(),
            output_reverse: Vec::new(),
        }));
        per_entry.push(im.add(node, &format!("entry{b}"), op, &operands, n_out)?);
    }
    let axes = im.constant(node, "batch_axis", crate::Tensor::vector(&[0i64]))?;
    let mut results = Vec::with_capacity(n_out);
    for k in 0..n_out {
        let mut rows = Vec::with_capacity(batch);
        for (b, outs) in per_entry.iter().enumerate() {
            let row = im.add(
                node,
                &format!("entry{b}/out{k}"),
                Op::Unsqueeze,
                &[Some(outs[k]), Some(axes)],
                1,
            )?;
            rows.push(row[0]);
        }
        let stacked = match rows[..] {
            [one] => one,
            _ => {
                let rows: Vec<Option<ValueId>> = rows.into_iter().map(Some).collect();
                im.add(node, &format!("out{k}"), Op::Concat { axis: 0 }, &rows, 1)?[0]
            }
        };
        results.push(stacked);
    }
    im.bind(node, &results)
}

/// The types a Scan's body inputs take when they declare none (ONNX lets a body leave them to
/// the Scan): a state's is its initial value's, a scanned input's is its operand's without the
/// scanned axis. An axis out of range implies nothing; inference reports it.
fn scan_implied_types(
    im: &GraphImporter,
    given: &[ValueId],
    scan_inputs: usize,
    input_axes: &[i64],
) -> Vec<TensorType> {
    let types: Vec<TensorType> = given.iter().map(|&v| im.ty(v).clone()).collect();
    scan_implied_types_of(&types, scan_inputs, input_axes)
}

/// [`scan_implied_types`] from the operands' types.
fn scan_implied_types_of(
    given: &[TensorType],
    scan_inputs: usize,
    input_axes: &[i64],
) -> Vec<TensorType> {
    let states = given.len().saturating_sub(scan_inputs);
    let mut implied: Vec<TensorType> = given[..states].to_vec();
    for (j, ty) in given[states..].iter().enumerate() {
        let rank = ty.rank() as i64;
        let axis = input_axes.get(j).copied().unwrap_or(0);
        let axis = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&axis) {
            break;
        }
        let mut dims = ty.shape.0.clone();
        dims.remove(axis as usize);
        implied.push(TensorType::new(ty.dtype, Shape(dims)));
    }
    implied
}

/// Loop: the body becomes a graph whose inputs are the outer values it reads, then its own (the
/// step number, the condition, the state); those outer values lead the operands, then the trip
/// count and the condition (either may be absent) and the initial state.
fn loop_(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("Loop").map_err(attr)?;
    // The trip count and the condition may be omitted (empty names); the state may not.
    let mut given: Vec<Option<ValueId>> = Vec::new();
    for i in 0..node.input.len().max(2) {
        let v = im.operand(node, i);
        if v.is_none() && i >= 2 {
            return Err(err(format!("operand {i} (state {}) is missing", i - 2)));
        }
        given.push(v);
    }
    // Body inputs may leave their types to the Loop: the step, the condition, the state's.
    let mut implied = vec![
        TensorType::new(DType::I64, Shape::scalar()),
        TensorType::new(DType::Bool, Shape::scalar()),
    ];
    implied.extend(given[2..].iter().flatten().map(|&v| im.ty(v).clone()));
    let (body, names) = body_of(im, node, "Loop", implied)?;
    let mut operands: Vec<Option<ValueId>> =
        names.iter().map(|n| im.values.get(n).copied()).collect();
    operands.extend(given);
    let op = Op::Loop(Box::new(crate::op::Loop {
        body: Subgraph(Arc::new(body)),
        captures: names.len(),
    }));
    emit(im, node, op, &operands, node.output.len())
}

/// Optional: holding its operand, or empty of the type its `type` attribute gives.
fn optional(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("Optional").map_err(attr)?;
    let x = im.operand(node, 0);
    let declared = node
        .attribute
        .iter()
        .find(|t| t.name.as_deref() == Some("type"))
        .and_then(|t| t.tp.as_deref());
    let op = match (x, declared) {
        (Some(_), _) => OptionalOp::Wrap { dtype: None, sequence: false },
        (None, Some(tp)) => {
            let ty = super::import::type_of(tp, "type")
                .map_err(|e| err(format!("attribute `type`: {e}")))?;
            let sequence = match ty.kind {
                crate::Kind::Tensor => false,
                crate::Kind::Sequence { .. } => true,
                crate::Kind::Optional { .. } => {
                    return Err(err("an optional of an optional is not supported"))
                }
            };
            OptionalOp::Wrap { dtype: Some(ty.dtype), sequence }
        }
        (None, None) => return Err(err("an empty Optional needs the attribute `type`")),
    };
    emit(im, node, Op::Optional(op), &[x], 1)
}

/// SequenceMap: the body becomes a graph whose inputs are the outer values it reads, then one
/// per operand (a sequence's element, a tensor itself); its untyped inputs take those types.
fn sequence_map(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("SequenceMap").map_err(attr)?;
    let mut given = Vec::new();
    for i in 0..node.input.len() {
        given.push(im.operand(node, i).ok_or_else(|| err(format!("operand {i} is missing")))?);
    }
    let implied: Vec<TensorType> =
        given.iter().map(|&v| im.ty(v).element().unwrap_or_else(|| im.ty(v).clone())).collect();
    let (body, names) = body_of(im, node, "SequenceMap", implied)?;
    let mut operands: Vec<Option<ValueId>> =
        names.iter().map(|n| im.values.get(n).copied()).collect();
    operands.extend(given.into_iter().map(Some));
    let op =
        Op::Sequence(SequenceOp::Map { body: Subgraph(Arc::new(body)), captures: names.len() });
    emit(im, node, op, &operands, node.output.len())
}

/// If: each branch becomes a graph whose inputs are the outer values it reads.
fn if_(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("If").map_err(attr)?;
    let branch = |name: &str| {
        node.attribute
            .iter()
            .find(|x| x.name.as_deref() == Some(name))
            .and_then(|x| x.g.as_deref())
            .ok_or_else(|| attr(AttrError::Missing { name: name.into() }))
    };
    let (then_g, else_g) = (branch("then_branch")?, branch("else_branch")?);
    let cond = im.operand(node, 0).ok_or_else(|| err("operand 0 (cond) is missing"))?;
    // A condition known now: only the taken branch is imported, inline (the other may not even
    // type-check for these shapes, as in the expanded AffineGrid).
    if let Some(c) = im.graph.constant_value(cond) {
        let taken =
            if c.to_f64s().first().copied().unwrap_or(0.0) != 0.0 { then_g } else { else_g };
        let mut branch = GraphImporter::new("branch", im.opset, im.base_dir);
        let (captures, inputs) = im.inline_captures(free_values(taken), &mut branch, "a branch")?;
        let graph = branch.import(taken, &captures)?;
        let prefix = im.name_for(node, "");
        let outs = im.graph.inline(&graph, &inputs, &prefix)?;
        return im.bind(node, &outs);
    }
    let mut names = free_values(then_g);
    for n in free_values(else_g) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut captures: Vec<(String, TensorType)> = Vec::new();
    for n in &names {
        let ty = im.visible_type(n).ok_or_else(|| {
            err(format!("a branch reads `{n}`, which is not defined before the If"))
        })?;
        captures.push((n.clone(), ty));
    }
    let import = |g: &super::proto::GraphProto, label: &str| -> Result<Subgraph> {
        let name = g.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| label.to_string());
        let graph = GraphImporter::new(&name, im.opset, im.base_dir).import(g, &captures)?;
        Ok(Subgraph(Arc::new(graph)))
    };
    let (then_branch, else_branch) = (import(then_g, "then")?, import(else_g, "else")?);
    let mut operands = vec![Some(cond)];
    operands.extend(names.iter().map(|n| im.values.get(n).copied()));
    let n_out = node.output.len();
    emit(im, node, Op::If { then_branch, else_branch }, &operands, n_out)
}
