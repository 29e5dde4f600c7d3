//! ONNX's quantized operators imported as the ops they are made of, as ONNX defines them:
//! DynamicQuantizeLinear (its function body), MatMulInteger and ConvInteger (the zero points
//! subtracted, then the product in int32, or in f32 for the convolution: exact while sums stay
//! below 2^24), QLinearMatMul and QLinearConv (dequantize, the float op, quantize), and the
//! com.microsoft forms onnxruntime writes (its QOperator ops; DynamicQuantizeMatMul and
//! MatMulIntegerToFloat as DynamicQuantizeLinear, MatMulInteger, Cast and Mul). The
//! interpreter and every target then run them with no op of their own; integer kernels that
//! keep them in integers are the next step.

use super::import::GraphImporter;
use super::proto::NodeProto;
use crate::op::{Attrs, Reduce, ReduceKind};
use crate::{BinaryOp, DType, IrError, Op, Result, Tensor, UnaryOp, ValueId};

use super::ops::attr;

pub(super) use super::ops::err;

/// Adds one node named after the ONNX node and `what`.
pub(super) fn op(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    op: Op,
    operands: &[Option<ValueId>],
) -> Result<ValueId> {
    Ok(im.add(node, what, op, operands, 1)?[0])
}

pub(super) fn constant(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    t: Tensor,
) -> Result<ValueId> {
    let name = im.graph.unique_name(&im.name_for(node, what));
    im.graph.add_constant(&name, t)
}

fn operand(im: &GraphImporter, node: &NodeProto, i: usize, what: &str) -> Result<ValueId> {
    im.operand(node, i).ok_or_else(|| err(format!("operand {i} ({what}) is missing")))
}

pub(super) fn convert(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    a: Attrs,
) -> Result<()> {
    match op_type {
        "DynamicQuantizeLinear" => dynamic_quantize(im, node, a),
        "MatMulInteger" => matmul_integer(im, node, a),
        "ConvInteger" => conv_integer(im, node, a),
        "QLinearMatMul" => qlinear_matmul(im, node, a),
        "QLinearConv" => qlinear_conv(im, node, a),
        other => Err(err(format!("{other} is not a quantized op"))),
    }
}

/// The function body ONNX gives DynamicQuantizeLinear: the scale spans [min(x, 0), max(x, 0)]
/// over 255 steps; the zero point puts 0 on a step.
fn dynamic_quantize(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("DynamicQuantizeLinear").map_err(attr)?;
    let x = operand(im, node, 0, "x")?;
    let (y, scale, zp) = dynamic_quantized(im, node, x)?;
    im.bind(node, &[y, scale, zp])
}

/// DynamicQuantizeLinear's function body on `x`: (y, scale, zero point).
fn dynamic_quantized(
    im: &mut GraphImporter,
    node: &NodeProto,
    x: ValueId,
) -> Result<(ValueId, ValueId, ValueId)> {
    let reduce = |kind| Op::Reduce(Reduce { kind, keepdims: false, noop_with_empty_axes: false });
    let zero = constant(im, node, "q_min", Tensor::scalar(0f32))?;
    let top = constant(im, node, "q_max", Tensor::scalar(255f32))?;
    let lo = op(im, node, "x_min", reduce(ReduceKind::Min), &[Some(x)])?;
    let lo = op(im, node, "x_min_adjusted", Op::Binary(BinaryOp::Min), &[Some(lo), Some(zero)])?;
    let hi = op(im, node, "x_max", reduce(ReduceKind::Max), &[Some(x)])?;
    let hi = op(im, node, "x_max_adjusted", Op::Binary(BinaryOp::Max), &[Some(hi), Some(zero)])?;
    let range = op(im, node, "x_range", Op::Binary(BinaryOp::Sub), &[Some(hi), Some(lo)])?;
    let scale = op(im, node, "scale", Op::Binary(BinaryOp::Div), &[Some(range), Some(top)])?;
    let scaled = op(im, node, "min_scaled", Op::Binary(BinaryOp::Div), &[Some(lo), Some(scale)])?;
    let zp = op(im, node, "zero_point_fp", Op::Binary(BinaryOp::Sub), &[Some(zero), Some(scaled)])?;
    let zp = op(im, node, "zero_point_clipped", Op::Clip, &[Some(zp), Some(zero), Some(top)])?;
    let zp = op(im, node, "zero_point_rounded", Op::Unary(UnaryOp::Round), &[Some(zp)])?;
    let zp = op(im, node, "zero_point", Op::Cast { to: DType::U8, saturate: true }, &[Some(zp)])?;
    let y = op(
        im,
        node,
        "",
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(x), Some(scale), Some(zp)],
    )?;
    Ok((y, scale, zp))
}

/// com.microsoft MatMulIntegerToFloat (onnxruntime's optimizer's MatMulInteger -> Cast -> Mul
/// where A's scale is a run-time value): `(A, B, a_scale, b_scale, a_zero_point?,
/// b_zero_point?, bias?) -> Y`, imported as those ops (after a DynamicQuantizeLinear, the form
/// the CPU's `dynamic` pass puts on its integer kernel).
fn matmul_integer_to_float(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("MatMulIntegerToFloat").map_err(attr)?;
    let (x, w) = (operand(im, node, 0, "A")?, operand(im, node, 1, "B")?);
    let (scale, w_scale) = (operand(im, node, 2, "a_scale")?, operand(im, node, 3, "b_scale")?);
    let ac = centred(im, node, "a", x, im.operand(node, 4), true, DType::I32)?;
    let bc = centred(im, node, "b", w, im.operand(node, 5), false, DType::I32)?;
    scaled_product(im, node, ac, bc, scale, w_scale, im.operand(node, 6))
}

/// Cast<f32>(MatMul(ac, bc)) * (scale * w_scale) (+ bias), bound to the node's result.
fn scaled_product(
    im: &mut GraphImporter,
    node: &NodeProto,
    ac: ValueId,
    bc: ValueId,
    scale: ValueId,
    w_scale: ValueId,
    bias: Option<ValueId>,
) -> Result<()> {
    let sums = op(im, node, "sums", Op::MatMul, &[Some(ac), Some(bc)])?;
    let real =
        op(im, node, "sums_real", Op::Cast { to: DType::F32, saturate: true }, &[Some(sums)])?;
    let s = op(im, node, "scales", Op::Binary(BinaryOp::Mul), &[Some(scale), Some(w_scale)])?;
    let what = if bias.is_some() { "product" } else { "" };
    let mut y = op(im, node, what, Op::Binary(BinaryOp::Mul), &[Some(real), Some(s)])?;
    if let Some(bias) = bias {
        y = op(im, node, "", Op::Binary(BinaryOp::Add), &[Some(y), Some(bias)])?;
    }
    im.bind(node, &[y])
}

/// com.microsoft DynamicQuantizeMatMul (what onnxruntime's optimizer makes of
/// quantize_dynamic's products, and what models saved after it hold): `(A, B, b_scale,
/// b_zero_point?, bias?) -> Y`, A quantized as DynamicQuantizeLinear does, MatMulInteger by B,
/// the sums in f32 times `a_scale * b_scale`, plus the bias: imported as exactly those ops, the
/// form the CPU's `dynamic` pass puts on its integer kernel.
fn dynamic_quantize_matmul(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("DynamicQuantizeMatMul").map_err(attr)?;
    let x = operand(im, node, 0, "A")?;
    let (w, w_scale) = (operand(im, node, 1, "B")?, operand(im, node, 2, "b_scale")?);
    let (q, scale, zp) = dynamic_quantized(im, node, x)?;
    let ac = centred(im, node, "a", q, Some(zp), true, DType::I32)?;
    let bc = centred(im, node, "b", w, im.operand(node, 3), false, DType::I32)?;
    scaled_product(im, node, ac, bc, scale, w_scale, im.operand(node, 4))
}

/// `x` as int32 less its zero point (`per_row`: one per row of a matrix, so it broadcasts down
/// the columns).
fn centred(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    x: ValueId,
    zp: Option<ValueId>,
    per_row: bool,
    to: DType,
) -> Result<ValueId> {
    let xc = op(im, node, &format!("{what}_wide"), Op::Cast { to, saturate: true }, &[Some(x)])?;
    let Some(z) = zp else { return Ok(xc) };
    let mut z = op(
        im,
        node,
        &format!("{what}_zero_point_wide"),
        Op::Cast { to, saturate: true },
        &[Some(z)],
    )?;
    if per_row && im.ty(z).rank() == 1 && im.ty(z).shape.numel() != Some(1) {
        let axes = constant(im, node, &format!("{what}_zero_point_axes"), Tensor::vector(&[-1]))?;
        z = op(
            im,
            node,
            &format!("{what}_zero_point_rows"),
            Op::Unsqueeze,
            &[Some(z), Some(axes)],
        )?;
    }
    op(im, node, &format!("{what}_centred"), Op::Binary(BinaryOp::Sub), &[Some(xc), Some(z)])
}

fn matmul_integer(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("MatMulInteger").map_err(attr)?;
    let (x, w) = (operand(im, node, 0, "A")?, operand(im, node, 1, "B")?);
    let ac = centred(im, node, "a", x, im.operand(node, 2), true, DType::I32)?;
    let bc = centred(im, node, "b", w, im.operand(node, 3), false, DType::I32)?;
    let y = op(im, node, "", Op::MatMul, &[Some(ac), Some(bc)])?;
    im.bind(node, &[y])
}

/// A per-output-channel weight zero point ([M]) as [M, 1, 1...] against the weight.
fn per_channel(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    v: ValueId,
    rank: usize,
) -> Result<ValueId> {
    if im.ty(v).rank() != 1 || im.ty(v).shape.numel() == Some(1) {
        return Ok(v);
    }
    let axes: Vec<i64> = (1..rank as i64).collect();
    let axes = constant(im, node, &format!("{what}_axes"), Tensor::vector(&axes))?;
    op(im, node, what, Op::Unsqueeze, &[Some(v), Some(axes)])
}

fn conv_op(mut a: Attrs) -> Result<Op> {
    a.remove("kernel_shape");
    Op::from_attrs("Conv", a).map_err(attr)
}

fn conv_integer(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    let conv = conv_op(a)?;
    let (x, w) = (operand(im, node, 0, "x")?, operand(im, node, 1, "w")?);
    let xc = centred(im, node, "x", x, im.operand(node, 2), false, DType::F32)?;
    let wz = match im.operand(node, 3) {
        Some(z) => Some(per_channel(im, node, "w_zero_point_channels", z, im.ty(w).rank())?),
        None => None,
    };
    let wc = centred(im, node, "w", w, wz, false, DType::F32)?;
    let y = op(im, node, "sum", conv, &[Some(xc), Some(wc)])?;
    let y = op(im, node, "", Op::Cast { to: DType::I32, saturate: true }, &[Some(y)])?;
    im.bind(node, &[y])
}

/// DequantizeLinear of `x` with a scale and zero point that are one value or one per position of
/// `axis`.
fn dequantize(
    im: &mut GraphImporter,
    node: &NodeProto,
    what: &str,
    x: ValueId,
    scale: ValueId,
    zp: Option<ValueId>,
    axis: i64,
) -> Result<ValueId> {
    op(im, node, what, Op::Dequantize { axis, block_size: 0 }, &[Some(x), Some(scale), zp])
}

fn qlinear_matmul(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("QLinearMatMul").map_err(attr)?;
    let names =
        ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"];
    let v: Vec<ValueId> =
        names.iter().enumerate().map(|(i, n)| operand(im, node, i, n)).collect::<Result<_>>()?;
    // A's scale is per row (the second-last axis), B's per column (the last).
    let ad = dequantize(im, node, "a_real", v[0], v[1], Some(v[2]), -2)?;
    let bd = dequantize(im, node, "b_real", v[3], v[4], Some(v[5]), -1)?;
    let y = op(im, node, "real", Op::MatMul, &[Some(ad), Some(bd)])?;
    let y = op(
        im,
        node,
        "",
        Op::Quantize { axis: -1, block_size: 0, dtype: None, saturate: true },
        &[Some(y), Some(v[6]), Some(v[7])],
    )?;
    im.bind(node, &[y])
}

fn qlinear_conv(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    let conv = conv_op(a)?;
    let names =
        ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point"];
    let v: Vec<ValueId> =
        names.iter().enumerate().map(|(i, n)| operand(im, node, i, n)).collect::<Result<_>>()?;
    let xd = dequantize(im, node, "x_real", v[0], v[1], Some(v[2]), 1)?;
    // The weight's scale is one or one per output channel (axis 0).
    let wd = dequantize(im, node, "w_real", v[3], v[4], Some(v[5]), 0)?;
    // The int32 bias is in units of x_scale * w_scale, zero point 0.
    let bias = match im.operand(node, 8) {
        None => None,
        Some(b) => {
            let s =
                op(im, node, "bias_scale", Op::Binary(BinaryOp::Mul), &[Some(v[1]), Some(v[4])])?;
            Some(op(
                im,
                node,
                "bias_real",
                Op::Dequantize { axis: 0, block_size: 0 },
                &[Some(b), Some(s)],
            )?)
        }
    };
    let y = op(im, node, "real", conv, &[Some(xd), Some(wd), bias])?;
    let y = op(
        im,
        node,
        "",
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(y), Some(v[6]), Some(v[7])],
    )?;
    im.bind(node, &[y])
}

/// The com.microsoft quantized ops onnxruntime's quantizer writes in QOperator form.
pub(super) const MICROSOFT: &[&str] = &[
    "QLinearAdd",
    "QLinearMul",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearConcat",
    "QGemm",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "MatMulNBits",
];

/// A com.microsoft quantized op: dequantize its operands, the float op, quantize.
pub(super) fn convert_microsoft(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    mut a: Attrs,
) -> Result<()> {
    let v = |im: &GraphImporter, i: usize| operand(im, node, i, "a quantized operand");
    let quantize = |im: &mut GraphImporter, y: ValueId, scale: ValueId, zp: Option<ValueId>| {
        op(
            im,
            node,
            "",
            Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
            &[Some(y), Some(scale), zp],
        )
    };
    match op_type {
        "DynamicQuantizeMatMul" => return dynamic_quantize_matmul(im, node, a),
        "MatMulIntegerToFloat" => return matmul_integer_to_float(im, node, a),
        "MatMulNBits" => return super::nbits::convert(im, node, a),
        _ => {}
    }
    if a.remove("channels_last").is_some_and(|c| matches!(c, crate::op::Attr::Int(1))) {
        return Err(IrError::NotSupported("channels_last = 1 (NHWC) is not supported".into()));
    }
    let y = match op_type {
        "QLinearAdd" | "QLinearMul" => {
            a.finish(op_type).map_err(attr)?;
            let x = dequantize(im, node, "a_real", v(im, 0)?, v(im, 1)?, im.operand(node, 2), 1)?;
            let w = dequantize(im, node, "b_real", v(im, 3)?, v(im, 4)?, im.operand(node, 5), 1)?;
            let b = if op_type == "QLinearAdd" { BinaryOp::Add } else { BinaryOp::Mul };
            let y = op(im, node, "real", Op::Binary(b), &[Some(x), Some(w)])?;
            quantize(im, y, v(im, 6)?, im.operand(node, 7))?
        }
        "QLinearGlobalAveragePool"
        | "QLinearAveragePool"
        | "QLinearSigmoid"
        | "QLinearLeakyRelu" => {
            let real = match op_type {
                "QLinearGlobalAveragePool" => {
                    a.finish(op_type).map_err(attr)?;
                    Op::from_attrs("GlobalAveragePool", Attrs::new()).map_err(attr)?
                }
                "QLinearAveragePool" => Op::from_attrs("AveragePool", a).map_err(attr)?,
                "QLinearSigmoid" => {
                    a.finish(op_type).map_err(attr)?;
                    Op::from_attrs("Sigmoid", Attrs::new()).map_err(attr)?
                }
                _ => Op::from_attrs("LeakyRelu", a).map_err(attr)?,
            };
            let x = dequantize(im, node, "x_real", v(im, 0)?, v(im, 1)?, im.operand(node, 2), 1)?;
            let y = op(im, node, "real", real, &[Some(x)])?;
            quantize(im, y, v(im, 3)?, im.operand(node, 4))?
        }
        "QLinearConcat" => {
            let axis = a.int("axis", 0).map_err(attr)?;
            a.finish(op_type).map_err(attr)?;
            let mut parts = Vec::new();
            for (k, i) in (2..node.input.len()).step_by(3).enumerate() {
                parts.push(Some(dequantize(
                    im,
                    node,
                    &format!("x{k}_real"),
                    v(im, i)?,
                    v(im, i + 1)?,
                    im.operand(node, i + 2),
                    1,
                )?));
            }
            let y = op(im, node, "real", Op::Concat { axis }, &parts)?;
            quantize(im, y, v(im, 0)?, im.operand(node, 1))?
        }
        "QGemm" => {
            let alpha = a.float("alpha", 1.0).map_err(attr)?;
            let trans_a = a.flag("transA", false).map_err(attr)?;
            let trans_b = a.flag("transB", false).map_err(attr)?;
            a.finish(op_type).map_err(attr)?;
            let x = dequantize(im, node, "a_real", v(im, 0)?, v(im, 1)?, im.operand(node, 2), 1)?;
            // B's scale is per output column: axis 0 of a transposed B, else axis 1.
            let w = dequantize(
                im,
                node,
                "b_real",
                v(im, 3)?,
                v(im, 4)?,
                im.operand(node, 5),
                if trans_b { 0 } else { 1 },
            )?;
            // The int32 C is in units of a_scale * b_scale.
            let c = match im.operand(node, 6) {
                None => None,
                Some(c) => {
                    let s = op(
                        im,
                        node,
                        "c_scale",
                        Op::Binary(BinaryOp::Mul),
                        &[Some(v(im, 1)?), Some(v(im, 4)?)],
                    )?;
                    Some(op(
                        im,
                        node,
                        "c_real",
                        Op::Dequantize { axis: 0, block_size: 0 },
                        &[Some(c), Some(s)],
                    )?)
                }
            };
            let gemm = crate::op::Gemm { alpha, beta: 1.0, trans_a, trans_b };
            match im.operand(node, 7) {
                // Without y_scale the result is the float one.
                None => op(im, node, "", Op::Gemm(gemm), &[Some(x), Some(w), c])?,
                Some(ys) => {
                    let y = op(im, node, "real", Op::Gemm(gemm), &[Some(x), Some(w), c])?;
                    quantize(im, y, ys, im.operand(node, 8))?
                }
            }
        }
        other => {
            return Err(err(format!("{other} is not a quantized com.microsoft op kiln knows")))
        }
    };
    im.bind(node, &[y])
}
