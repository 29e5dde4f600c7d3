//! Sequences and optionals: a sequence's type is its elements' dtype, what their shapes have in
//! common, and their number when it is known (which is what lets the compiler resolve them).

use super::{not_yet, Ctx, Infer, Operand, Operands};
use crate::error::{invalid, OpError};
use crate::op::{OptionalOp, SequenceOp};
use crate::shape::normalize_axis;
use crate::{DType, Dim, Kind, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Sequence(s) => sequence(s, ops, ctx),
        Op::Optional(o) => optional(o, ops),
        _ => not_yet(op),
    }
}

/// The operand as a sequence: (its type, its elements' shape if ranked, its length if known).
fn seq<'a>(o: Operand<'a>) -> Result<(&'a TensorType, Option<&'a Shape>, Option<usize>), OpError> {
    match o.ty.kind {
        Kind::Sequence { ranked, len } => Ok((o.ty, ranked.then_some(&o.ty.shape), len)),
        _ => Err(invalid!("expected a sequence, got {}", o.ty)),
    }
}

fn tensor<'a>(o: Operand<'a>, what: &str) -> Result<&'a TensorType, OpError> {
    if o.ty.kind.is_tensor() {
        Ok(o.ty)
    } else {
        Err(invalid!("{what} must be a tensor, got {}", o.ty))
    }
}

/// A position operand: one integer (a scalar or one element).
fn position(ops: &Operands, i: usize) -> Result<Option<i64>, OpError> {
    let Some(p) = ops.opt(i) else { return Ok(None) };
    let ty = tensor(p, "the position")?;
    // A scalar, as ONNX says, or one element, as some of its tests pass.
    if !matches!(ty.dtype, DType::I32 | DType::I64)
        || ty.rank() > 1
        || ty.shape.numel().is_some_and(|n| n != 1)
    {
        return Err(invalid!("the position must be an int32 or int64 scalar, got {ty}"));
    }
    Ok(p.value.and_then(|v| v.to_i64s().first().copied()))
}

/// Checks a known position against a known length (`insert`: the end is allowed too).
fn check_position(pos: Option<i64>, len: Option<usize>, insert: bool) -> Result<(), OpError> {
    if let (Some(p), Some(n)) = (pos, len) {
        let n = n as i64;
        let hi = if insert { n } else { n - 1 };
        if p < -n || p > hi {
            return Err(invalid!("position {p} is outside a sequence of {n}"));
        }
    }
    Ok(())
}

pub(super) fn sequence(s: &SequenceOp, ops: &Operands, ctx: &Ctx) -> Infer {
    let merged = |a: &Shape, b: &Shape| {
        TensorType::new(DType::F32, a.clone())
            .merge(&TensorType::new(DType::F32, b.clone()), |i| ctx.fresh(i))
            .map(|t| t.shape)
    };
    let ty = match s {
        SequenceOp::Empty { dtype } => TensorType::sequence(*dtype, Some(Shape::scalar()), Some(0)),
        SequenceOp::Construct => {
            let first = tensor(ops.get(0)?, "an element")?;
            let mut elem = Some(first.shape.clone());
            for i in 1..ops.len() {
                let t = tensor(ops.get(i)?, "an element")?;
                if t.dtype != first.dtype {
                    return Err(invalid!("the elements are {} and {}", first, t));
                }
                elem = elem.and_then(|e| merged(&e, &t.shape));
            }
            TensorType::sequence(first.dtype, elem, Some(ops.len()))
        }
        SequenceOp::Insert => {
            let (st, elem, len) = seq(ops.get(0)?)?;
            let x = tensor(ops.get(1)?, "the inserted value")?;
            if x.dtype != st.dtype {
                return Err(invalid!("inserting {x} into {st}"));
            }
            check_position(position(ops, 2)?, len, true)?;
            let elem = match (len, elem) {
                (Some(0), _) => Some(x.shape.clone()),
                (_, Some(e)) => merged(e, &x.shape),
                (_, None) => None,
            };
            TensorType::sequence(st.dtype, elem, len.map(|n| n + 1))
        }
        SequenceOp::Erase => {
            let (st, elem, len) = seq(ops.get(0)?)?;
            if len == Some(0) {
                return Err("erasing from an empty sequence".into());
            }
            check_position(position(ops, 1)?, len, false)?;
            TensorType::sequence(st.dtype, elem.cloned(), len.map(|n| n - 1))
        }
        SequenceOp::At => {
            let (st, elem, len) = seq(ops.get(0)?)?;
            if ops.opt(1).is_none() {
                return Err("SequenceAt needs a position".into());
            }
            check_position(position(ops, 1)?, len, false)?;
            if len == Some(0) {
                return Err("reading from an empty sequence".into());
            }
            let elem = elem.ok_or_else(|| invalid!("the elements of {st} have no known rank"))?;
            TensorType::new(st.dtype, elem.clone())
        }
        SequenceOp::Length => {
            seq(ops.get(0)?)?;
            TensorType::new(DType::I64, Shape::scalar())
        }
        SequenceOp::Split { axis, keepdims } => return split(*axis, *keepdims, ops, ctx),
        SequenceOp::Concat { axis, new_axis } => {
            let (st, elem, len) = seq(ops.get(0)?)?;
            let elem = elem.ok_or_else(|| invalid!("the elements of {st} have no known rank"))?;
            let rank = elem.rank() + *new_axis as usize;
            let a = normalize_axis(*axis, rank)
                .ok_or_else(|| invalid!("axis {axis} is outside rank {rank}"))?;
            let mut dims = elem.dims().to_vec();
            if *new_axis {
                dims.insert(a, len.map_or_else(|| ctx.fresh(a), Dim::Fixed));
            } else {
                dims[a] = match (len, &dims[a]) {
                    (Some(n), Dim::Fixed(d)) => Dim::Fixed(n * d),
                    _ => ctx.fresh(a),
                };
            }
            if len == Some(0) {
                return Err("joining an empty sequence".into());
            }
            TensorType::new(st.dtype, Shape(dims))
        }
        SequenceOp::Map { body, captures } => return map(&body.0, *captures, ops),
    };
    Ok(vec![ty])
}

fn split(axis: i64, keepdims: bool, ops: &Operands, ctx: &Ctx) -> Infer {
    let x = tensor(ops.get(0)?, "the split value")?;
    let a = normalize_axis(axis, x.rank()).ok_or_else(|| invalid!("axis {axis} is outside {x}"))?;
    let dim = x.shape.dims()[a].fixed();
    let mut elem = x.shape.dims().to_vec();
    let len = match ops.opt(1) {
        None => {
            if keepdims {
                elem[a] = Dim::Fixed(1);
            } else {
                elem.remove(a);
            }
            dim
        }
        Some(s) => {
            let st = tensor(s, "the split")?;
            if !matches!(st.dtype, DType::I32 | DType::I64) || st.rank() > 1 {
                return Err(invalid!(
                    "the split must be an int32 or int64 scalar or list, got {st}"
                ));
            }
            let sizes = s.value.map(|v| v.to_i64s());
            if let Some(bad) =
                sizes.iter().flatten().find(|&&n| n < 0 || (st.rank() == 0 && n == 0))
            {
                return Err(invalid!("a split length of {bad}"));
            }
            match (st.rank(), sizes) {
                (0, Some(v)) => {
                    let n = v[0] as usize;
                    elem[a] = match dim {
                        Some(d) if d % n == 0 || d < n => Dim::Fixed(n.min(d)),
                        _ => ctx.fresh(a),
                    };
                    dim.map(|d| d.div_ceil(n))
                }
                (_, Some(v)) => {
                    if let Some(d) = dim {
                        if v.iter().sum::<i64>() != d as i64 {
                            return Err(invalid!(
                                "the split lengths {v:?} do not add up to axis {a} of {x}"
                            ));
                        }
                    }
                    elem[a] = if v.windows(2).all(|w| w[0] == w[1]) && !v.is_empty() {
                        Dim::Fixed(v[0] as usize)
                    } else {
                        ctx.fresh(a)
                    };
                    Some(v.len())
                }
                (r, None) => {
                    elem[a] = ctx.fresh(a);
                    if r == 1 {
                        st.shape.dims()[0].fixed()
                    } else {
                        None
                    }
                }
            }
        }
    };
    Ok(vec![TensorType::sequence(x.dtype, Some(Shape(elem)), len)])
}

/// SequenceMap: the body takes the captured values, then each sequence's element (a tensor passed
/// whole); it gives one sequence per result, as long as the first sequence.
fn map(body: &crate::Graph, captures: usize, ops: &Operands) -> Infer {
    if body.inputs().len() != ops.len() {
        return Err(invalid!(
            "the body takes {} values, {} are passed",
            body.inputs().len(),
            ops.len()
        ));
    }
    let first = ops.get(captures).and_then(seq)?;
    let mut types = Vec::with_capacity(ops.len());
    for i in 0..ops.len() {
        let o = ops.get(i)?;
        let ty = match o.ty.kind {
            Kind::Sequence { len, .. } if i >= captures => {
                if let (Some(m), Some(n)) = (first.2, len) {
                    if m != n {
                        return Err(invalid!("the sequences have {m} and {n} elements"));
                    }
                }
                // Elements may differ in size: the body's declared type stands for each.
                body.node(body.inputs()[i]).outputs[0].clone()
            }
            _ => o.ty.clone(),
        };
        let want = &body.node(body.inputs()[i]).outputs[0];
        if !want.accepts(&ty) {
            return Err(invalid!("the body reads value {i} as {want}, it is {ty}"));
        }
        types.push(ty);
    }
    body.outputs()
        .iter()
        .map(|(_, v)| {
            let t = body.value_type(*v);
            if !t.kind.is_tensor() {
                return Err(invalid!("a SequenceMap body gives {t}, not a tensor"));
            }
            Ok(TensorType::sequence(t.dtype, Some(t.shape.clone()), first.2))
        })
        .collect()
}

pub(super) fn optional(o: &OptionalOp, ops: &Operands) -> Infer {
    let ty = match o {
        OptionalOp::Wrap { dtype, sequence } => match ops.opt(0) {
            Some(x) => {
                if matches!(x.ty.kind, Kind::Optional { .. }) {
                    return Err(invalid!("an optional cannot hold {}", x.ty));
                }
                TensorType::optional(x.ty)
            }
            None => {
                let dtype = dtype.ok_or("an empty Optional needs its type")?;
                TensorType {
                    dtype,
                    shape: Shape::scalar(),
                    kind: Kind::Optional { sequence: *sequence, ranked: false },
                }
            }
        },
        OptionalOp::HasElement => TensorType::new(DType::Bool, Shape::scalar()),
        OptionalOp::GetElement => {
            let x = ops.get(0)?;
            x.ty.element()
                .filter(|_| matches!(x.ty.kind, Kind::Optional { .. }))
                .unwrap_or_else(|| x.ty.clone())
        }
    };
    Ok(vec![ty])
}
