//! ONNX's preview domain (`ai.onnx.preview`): FlexAttention, expanded at import into the ops
//! of its ONNX function body, with its `score_mod` and `prob_mod` graphs inlined where the body
//! calls them. The interpreter and every target then run it with no op of its own (MatMul,
//! Softmax, elementwise), and its nodes are named `<node>/<part>`, so an error in a modifier
//! names the FlexAttention node.

use super::import::{free_values, GraphImporter};
use super::ops::{attr, err};
use super::proto::{GraphProto, NodeProto};
use super::tensor::dtype_of;
use crate::error::AttrError;
use crate::op::{Attr, Attrs};
use crate::{BinaryOp, DType, IrError, Op, Result, Tensor, TensorType, UnaryOp, ValueId};

pub(super) const DOMAIN: &str = "ai.onnx.preview";

/// The ops of the domain the importer converts.
pub(super) const OPS: &[&str] = &["FlexAttention"];

pub(super) fn convert(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    a: Attrs,
) -> Result<()> {
    match op_type {
        "FlexAttention" => flex_attention(im, node, a),
        other => Err(IrError::NotSupported(format!("{DOMAIN}.{other} is not supported"))),
    }
}

/// FlexAttention's attributes.
struct Flex {
    /// `scale`; `None`: 1 / sqrt(head_size).
    scale: Option<f32>,
    /// The type the scores, the softmax and the modifiers work in.
    softmax: DType,
}

impl Flex {
    fn read(mut a: Attrs, input: DType) -> Result<Flex> {
        let scale = a.opt_float("scale").map_err(attr)?;
        let softmax = match a.remove("softmax_precision") {
            None if input == DType::F64 => DType::F64,
            None => DType::F32,
            Some(Attr::Int(t)) => i32::try_from(t)
                .map_err(|_| {
                    attr(AttrError::OutOfRange {
                        name: "softmax_precision".into(),
                        value: t.to_string(),
                        why: "must name a data type",
                    })
                })
                .and_then(|t| {
                    dtype_of(t)
                        .map_err(|e| e.context(format_args!("attribute `softmax_precision`")))
                })?,
            Some(other) => {
                return Err(err(format!(
                    "attribute `softmax_precision` must name a data type, got {other}"
                )))
            }
        };
        if !matches!(softmax, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
            return Err(attr(AttrError::OutOfRange {
                name: "softmax_precision".into(),
                value: softmax.name().into(),
                why: "must be a floating-point type",
            }));
        }
        a.finish("FlexAttention").map_err(attr)?;
        Ok(Flex { scale, softmax })
    }
}

/// `Y = prob_mod(Softmax(score_mod((Q @ K^T) * scale))) @ V`, in the body's order: Q and K are
/// each scaled by sqrt(scale) in their own type (the scale itself computed in f32), the product
/// is cast to the softmax type, and V is too when it differs (Y cast back).
fn flex_attention(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    let operand = |i: usize, what: &str| {
        im.operand(node, i).ok_or_else(|| err(format!("operand {i} ({what}) is missing")))
    };
    let (q, k, v) = (operand(0, "Q")?, operand(1, "K")?, operand(2, "V")?);
    let dtype = check_operands(im, q, k, v)?;
    let flex = Flex::read(a, dtype)?;
    let k = align_heads(im, node, q, k, "K")?;
    let v = align_heads(im, node, q, v, "V")?;
    let s = sqrt_scale(im, node, q, flex.scale, dtype)?;
    let q_scaled = im.add1(node, "QScaled", Op::Binary(BinaryOp::Mul), &[q, s])?;
    let k_scaled = im.add1(node, "KScaled", Op::Binary(BinaryOp::Mul), &[k, s])?;
    let k_t = im.add1(node, "KTranspose", Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k_scaled])?;
    let score = im.add1(node, "Score", Op::MatMul, &[q_scaled, k_t])?;
    let score = cast(im, node, "SoftmaxCast", score, flex.softmax)?;
    let score = modifier(im, node, "score_mod", score)?;
    let prob = im.add1(node, "Prob", Op::Softmax { axis: 3 }, &[score])?;
    let prob = modifier(im, node, "prob_mod", prob)?;
    let y = if dtype == flex.softmax {
        im.add1(node, "", Op::MatMul, &[prob, v])?
    } else {
        let v = cast(im, node, "VSp", v, flex.softmax)?;
        let y = im.add1(node, "YSp", Op::MatMul, &[prob, v])?;
        cast(im, node, "", y, dtype)?
    };
    im.bind(node, &[y])
}

/// Q, K and V must be rank-4 tensors of one floating-point type (returned), K and V with the
/// same batch, heads and sequence, Q's heads a multiple of theirs and Q's head size K's.
fn check_operands(im: &GraphImporter, q: ValueId, k: ValueId, v: ValueId) -> Result<DType> {
    let (tq, tk, tv) = (im.ty(q), im.ty(k), im.ty(v));
    for (what, t) in [("Q", tq), ("K", tk), ("V", tv)] {
        if t.rank() != 4 {
            return Err(err(format!(
                "{what} {t} must be rank 4 (batch, heads, sequence, head size)"
            )));
        }
    }
    if !matches!(tq.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
        return Err(err(format!("Q {tq} must be a floating-point tensor")));
    }
    if tk.dtype != tq.dtype || tv.dtype != tq.dtype {
        return Err(err(format!("Q {tq}, K {tk} and V {tv} must have one element type")));
    }
    let dim = |t: &TensorType, i: usize| t.shape.dims()[i].fixed();
    let differ = |a: Option<usize>, b: Option<usize>| a.zip(b).is_some_and(|(a, b)| a != b);
    if differ(dim(tq, 0), dim(tk, 0)) || differ(dim(tk, 0), dim(tv, 0)) {
        return Err(err(format!("Q {tq}, K {tk} and V {tv} must have one batch size")));
    }
    if differ(dim(tk, 1), dim(tv, 1)) || differ(dim(tk, 2), dim(tv, 2)) {
        return Err(err(format!("K {tk} and V {tv} must have the same heads and sequence length")));
    }
    if differ(dim(tq, 3), dim(tk, 3)) {
        return Err(err(format!("Q {tq} and K {tk} must have one head size")));
    }
    if let (Some(hq), Some(hkv)) = (dim(tq, 1), dim(tk, 1)) {
        if hkv == 0 || hq % hkv != 0 {
            return Err(err(format!(
                "Q's {hq} heads must be a multiple of K's and V's {hkv} (grouped-query attention)"
            )));
        }
    }
    Ok(tq.dtype)
}

/// `x` as `to` (no node when it is already).
fn cast(
    im: &mut GraphImporter,
    node: &NodeProto,
    part: &str,
    x: ValueId,
    to: DType,
) -> Result<ValueId> {
    if im.ty(x).dtype == to {
        return Ok(x);
    }
    im.add1(node, part, Op::Cast { to, saturate: true }, &[x])
}

/// K or V with each of its heads repeated for the group of query heads sharing it (query head
/// h reads head h / group): `[B, Hkv, S, D]` -> `[B, Hkv, group, S, D]` -> `[B, Hq, S, D]`.
/// The sizes come from Shape nodes, which fold when the shapes are known.
fn align_heads(
    im: &mut GraphImporter,
    node: &NodeProto,
    q: ValueId,
    x: ValueId,
    what: &str,
) -> Result<ValueId> {
    let heads = |im: &GraphImporter, v: ValueId| im.ty(v).shape.dims()[1].fixed();
    if heads(im, q).is_some() && heads(im, q) == heads(im, x) {
        return Ok(x);
    }
    let shape = |im: &mut GraphImporter, of: ValueId, start: i64, part: &str| {
        let op = Op::Shape { start, end: Some(start + 1) };
        im.add1(node, &format!("{what}{part}"), op, &[of])
    };
    let batch = shape(im, x, 0, "Batch")?;
    let kv_heads = shape(im, x, 1, "Heads")?;
    let seq = shape(im, x, 2, "SeqLen")?;
    let size = shape(im, x, 3, "HeadSize")?;
    let q_heads = shape(im, q, 1, "QHeads")?;
    let group =
        im.add1(node, &format!("{what}Group"), Op::Binary(BinaryOp::Div), &[q_heads, kv_heads])?;
    let axis = im.constant(node, &format!("{what}Axis2"), Tensor::vector(&[2i64]))?;
    let unsqueezed = im.add1(node, &format!("{what}Unsqueezed"), Op::Unsqueeze, &[x, axis])?;
    let concat = Op::Concat { axis: 0 };
    let expanded_shape = im.add1(
        node,
        &format!("{what}ExpandShape"),
        concat.clone(),
        &[batch, kv_heads, group, seq, size],
    )?;
    let expanded =
        im.add1(node, &format!("{what}Expanded"), Op::Expand, &[unsqueezed, expanded_shape])?;
    let aligned_shape =
        im.add1(node, &format!("{what}AlignedShape"), concat, &[batch, q_heads, seq, size])?;
    let reshape = Op::Reshape { allowzero: false };
    im.add1(node, &format!("{what}Aligned"), reshape, &[expanded, aligned_shape])
}

/// sqrt(scale) in Q's type, the scale and its root computed in f32 (as the body does):
/// `scale` when given, else 1 / sqrt(head_size) from Q's shape.
fn sqrt_scale(
    im: &mut GraphImporter,
    node: &NodeProto,
    q: ValueId,
    scale: Option<f32>,
    dtype: DType,
) -> Result<ValueId> {
    let scale = match scale {
        Some(s) => im.constant(node, "ScaleFactorF32", Tensor::scalar(s))?,
        None => {
            let size = im.add1(node, "QKHeadSize", Op::Shape { start: 3, end: None }, &[q])?;
            let size = cast(im, node, "QKHeadSizeF", size, DType::F32)?;
            let root = im.add1(node, "SqrtHeadSize", Op::Unary(UnaryOp::Sqrt), &[size])?;
            let one_f = im.constant(node, "OneF", Tensor::vector(&[1f32]))?;
            im.add1(node, "CalculatedScale", Op::Binary(BinaryOp::Div), &[one_f, root])?
        }
    };
    let root = im.add1(node, "ScaleFactorSqrtF32", Op::Unary(UnaryOp::Sqrt), &[scale])?;
    cast(im, node, "ScaleFactorSqrt", root, dtype)
}

/// `x` through the node's graph attribute `name` (`score_mod` or `prob_mod`), inlined as
/// `<node>/<name>/...`; `x` itself when the attribute is absent. The graph takes x's type
/// (its declared dims are names such as B, H, L, S) and must give one result of that type
/// (sizes it computes from data may be new symbols).
fn modifier(im: &mut GraphImporter, node: &NodeProto, name: &str, x: ValueId) -> Result<ValueId> {
    let Some(g) = node.attribute.iter().find(|a| a.name.as_deref() == Some(name)) else {
        return Ok(x);
    };
    let g = g.g.as_deref().ok_or_else(|| err(format!("attribute `{name}` must be a graph")))?;
    let in_context = |e: IrError| e.context(format_args!("the {name} graph"));
    if g.input.len() != 1 || g.output.len() != 1 {
        return Err(err(format!(
            "the {name} graph must take one tensor and give one, not {} and {}",
            g.input.len(),
            g.output.len()
        )));
    }
    let x_type = im.ty(x).clone();
    let mut body: GraphProto = g.clone();
    body.input[0].r#type = None;
    let mut sub = GraphImporter::new(name, im.opset, im.base_dir);
    sub.implied_input_types = vec![x_type.clone()];
    let reader = format!("the {name} graph");
    let (captures, mut inputs) = im.inline_captures(free_values(&body), &mut sub, &reader)?;
    let graph = sub.import(&body, &captures).map_err(in_context)?;
    inputs.push(x);
    let prefix = im.name_for(node, name);
    let y = im.graph.inline(&graph, &inputs, &prefix).map_err(in_context)?[0];
    let y_type = im.ty(y);
    // A size the graph computes from data (a Range of the scores' own dims) is a new symbol:
    // only sizes known on both sides must agree.
    let (xd, yd) = (x_type.shape.dims(), y_type.shape.dims());
    let sizes_differ = xd.len() != yd.len()
        || xd.iter().zip(yd).any(|(a, b)| a.fixed().zip(b.fixed()).is_some_and(|(a, b)| a != b));
    if y_type.dtype != x_type.dtype || sizes_differ {
        return Err(err(format!(
            "the {name} graph turns {x_type} into {y_type}; it must keep the type and shape"
        )));
    }
    Ok(y)
}
