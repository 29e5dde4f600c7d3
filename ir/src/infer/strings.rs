//! The string ops: StringConcat, StringSplit, StringNormalizer, RegexFullMatch, LabelEncoder.
//! StringSplit's and StringNormalizer's result sizes depend on the strings: known when the
//! operand's value is (the interpreter's case), else fresh symbols.

use super::{Ctx, Infer, Operands};
use crate::error::{invalid, OpError};
use crate::eval::strings::{normalized, piece_count, Normalizer};
use crate::{broadcast, DType, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::StringConcat => concat(ops),
        Op::StringSplit { delimiter, maxsplit } => split(delimiter, *maxsplit, ops, ctx),
        Op::StringNormalizer { .. } => normalizer(op, ops, ctx),
        Op::RegexFullMatch { pattern } => regex_full_match(pattern, ops),
        Op::LabelEncoder { keys, values, default } => label_encoder(keys, values, default, ops),
        _ => unreachable!("routed here by infer::infer"),
    }
}

fn strings(what: &str, ty: &TensorType) -> Result<(), OpError> {
    if !ty.dtype.is_string() {
        return Err(invalid!("{what} must be strings, got {ty}"));
    }
    Ok(())
}

fn concat(ops: &Operands) -> Infer {
    let (x, y) = (ops.get(0)?.ty, ops.get(1)?.ty);
    strings("operand 0", x)?;
    strings("operand 1", y)?;
    let shape =
        broadcast(&x.shape, &y.shape).ok_or_else(|| invalid!("cannot broadcast {x} with {y}"))?;
    Ok(vec![TensorType::new(DType::String, shape)])
}

fn split(delimiter: &str, maxsplit: Option<i64>, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?;
    strings("operand 0", x.ty)?;
    // (A negative maxsplit is no limit, as Python's and ONNX's reference take it.)
    let pieces = match x.value.and_then(|t| t.strings()) {
        Some(s) => {
            Dim::Fixed(s.iter().map(|s| piece_count(s, delimiter, maxsplit)).max().unwrap_or(0))
        }
        None => ctx.fresh(x.ty.rank()),
    };
    let mut dims = x.ty.shape.0.clone();
    dims.push(pieces);
    Ok(vec![
        TensorType::new(DType::String, Shape(dims)),
        TensorType::new(DType::I64, x.ty.shape.clone()),
    ])
}

fn normalizer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = ops.get(0)?;
    strings("operand 0", x.ty)?;
    let n = Normalizer::of(op)?;
    let dims = x.ty.shape.dims();
    let rows = match dims {
        [_] => None,
        [one, _] if *one == Dim::Fixed(1) => Some(Dim::Fixed(1)),
        _ => return Err(invalid!("x must be [C] or [1, C], got {}", x.ty)),
    };
    let kept = match x.value.and_then(|t| t.strings()) {
        Some(s) => Dim::Fixed(normalized(&n, s).len()),
        None => ctx.fresh(dims.len() - 1),
    };
    let shape = Shape(rows.into_iter().chain([kept]).collect());
    Ok(vec![TensorType::new(DType::String, shape)])
}

fn regex_full_match(pattern: &str, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    strings("operand 0", x)?;
    crate::eval::strings::full_match_regex(pattern)?;
    Ok(vec![TensorType::new(DType::Bool, x.shape.clone())])
}

fn label_encoder(
    keys: &crate::Tensor,
    values: &crate::Tensor,
    default: &crate::Tensor,
    ops: &Operands,
) -> Infer {
    let x = ops.get(0)?.ty;
    if keys.rank() != 1 || values.rank() != 1 || keys.len() != values.len() {
        return Err(invalid!(
            "keys and values must be 1-D and of one length, got {} and {}",
            keys.ty(),
            values.ty()
        ));
    }
    if default.len() != 1 || default.dtype() != values.dtype() {
        return Err(invalid!(
            "the default must be one value of the values' type {}, got {}",
            values.dtype(),
            default.ty()
        ));
    }
    if x.dtype != keys.dtype() {
        return Err(invalid!("x must be of the keys' type {}, got {x}", keys.dtype()));
    }
    if !matches!(keys.dtype(), DType::String | DType::I64 | DType::F32 | DType::I32 | DType::F64)
        || !matches!(
            values.dtype(),
            DType::String | DType::I64 | DType::F32 | DType::I16 | DType::I32 | DType::F64
        )
    {
        return Err(invalid!(
            "keys of {} and values of {} are not types LabelEncoder maps",
            keys.dtype(),
            values.dtype()
        ));
    }
    Ok(vec![TensorType::new(values.dtype(), x.shape.clone())])
}
