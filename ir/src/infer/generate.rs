//! Ops that make tensors from shapes and scalars: Shape, Size, ConstantOfShape, Range, EyeLike.

use super::{not_yet, Ctx, Infer, Operand, Operands};
use crate::op::SignalWindow;
use crate::{DType, Dim, Op, Shape, Tensor, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::Shape { start, end } => shape(*start, *end, ops),
        Op::Size => size(ops),
        Op::ConstantOfShape { value } => constant_of_shape(value, ops, ctx),
        Op::Range => range(ops, ctx),
        Op::EyeLike { dtype, .. } => eye_like(*dtype, ops),
        Op::SignalWindow(w) => signal_window(w, ops, ctx),
        _ => not_yet(op),
    }
}
use crate::error::{invalid, OpError};

/// Shape: the dimensions `start..end`.
pub(super) fn shape(start: i64, end: Option<i64>, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    let (s, e) = shape_interval(x.rank(), start, end);
    Ok(vec![TensorType::new(DType::I64, [e - s])])
}

/// Size: one i64.
pub(super) fn size(ops: &Operands) -> Infer {
    ops.get(0)?;
    Ok(vec![TensorType::new(DType::I64, Shape::scalar())])
}

/// HannWindow, HammingWindow, BlackmanWindow: `size` points (a scalar, its value known when
/// the size is a constant, as `kiln check` and `kiln run` make it by binding the input).
pub(super) fn signal_window(w: &SignalWindow, ops: &Operands, ctx: &Ctx) -> Infer {
    let size = ops.get(0)?;
    if !size.ty.dtype.is_int() || size.ty.rank() != 0 {
        return Err(invalid!("size must be an integer scalar, got {}", size.ty));
    }
    let dtype = w.out_dtype();
    if !dtype.is_float() {
        return Err(invalid!("output_datatype must be a float type, got {dtype}"));
    }
    let len = match size.value {
        Some(t) => Dim::Fixed(window_size(t)?),
        None => ctx.fresh(0),
    };
    if let Dim::Fixed(n) = len {
        checked_count(&[n], dtype, "window")?;
    }
    Ok(vec![TensorType::new(dtype, Shape(vec![len]))])
}

/// A window's size operand as a point count.
pub(crate) fn window_size(size: &Tensor) -> Result<usize, OpError> {
    let n = size.to_i64s().first().copied().ok_or("size is empty")?;
    usize::try_from(n).map_err(|_| invalid!("size must not be negative, got {n}"))
}

/// EyeLike: x's 2-D shape, in `dtype` or x's type.
pub(super) fn eye_like(dtype: Option<DType>, ops: &Operands) -> Infer {
    let x = ops.get(0)?.ty;
    if x.rank() != 2 {
        return Err(invalid!("needs a 2-D input, got {x}"));
    }
    Ok(vec![TensorType::new(dtype.unwrap_or(x.dtype), x.shape.clone())])
}

/// Shape's `start..end` (opset 15): negative values count from the rank, both are clamped to
/// `[0, rank]`, and an interval with `start > end` is empty.
pub(crate) fn shape_interval(rank: usize, start: i64, end: Option<i64>) -> (usize, usize) {
    let r = rank as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    (s, e.max(s))
}

/// The number of elements of `dims`, or why it is too large to allocate.
pub(crate) fn checked_count(dims: &[usize], dtype: DType, what: &str) -> Result<usize, OpError> {
    let n = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n.checked_mul(dtype.size()).is_some_and(|b| b <= isize::MAX as usize) => Ok(n),
        _ => Err(invalid!("{what} {} has too many elements", Shape::fixed(dims))),
    }
}

pub(super) fn constant_of_shape(value: &Tensor, ops: &Operands, ctx: &Ctx) -> Infer {
    if value.len() != 1 {
        return Err(invalid!("value must hold one element, got {}", value.ty()));
    }
    let shape = ops.get(0)?;
    if shape.ty.rank() != 1 {
        return Err(invalid!("the shape operand must be 1-D, got {}", shape.ty));
    }
    let dims = match ops.ints(0, "shape")? {
        Some(Some(dims)) => dims,
        _ => {
            return match &shape.ty.shape.0[0] {
                Dim::Fixed(n) => Ok(vec![TensorType::new(value.dtype(), ctx.fresh_shape(*n)?)]),
                Dim::Sym(_) => {
                    Err(invalid!("the shape operand must have a known length, got {}", shape.ty))
                }
            };
        }
    };
    if dims.iter().any(|&d| d < 0) {
        return Err(invalid!("shape {dims:?} has a negative size"));
    }
    let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    checked_count(&dims, value.dtype(), "shape")?;
    Ok(vec![TensorType::new(value.dtype(), dims)])
}

/// A Range bound: exact for integers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar {
    Int(i128),
    Float(f64),
}

impl Scalar {
    /// The single value of a scalar (or one-element) tensor.
    pub(crate) fn of(t: &Tensor) -> Scalar {
        fn first<T: crate::Element>(t: &Tensor) -> Scalar {
            let v = t.as_slice::<T>().expect("dispatched on the dtype")[0];
            match v.to_i128() {
                Some(i) => Scalar::Int(i),
                None => Scalar::Float(v.to_f64()),
            }
        }
        if t.dtype().is_string() {
            return Scalar::Float(t.to_f64s().first().copied().unwrap_or(f64::NAN));
        }
        crate::eval::typed!(t.dtype(), first(t))
    }

    fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

/// Range's element count, `max(ceil((limit - start) / delta), 0)`.
pub(crate) fn range_count(start: Scalar, limit: Scalar, delta: Scalar) -> Result<usize, OpError> {
    let count = match (start, limit, delta) {
        (Scalar::Int(s), Scalar::Int(l), Scalar::Int(d)) => {
            if d == 0 {
                return Err("delta must not be 0".into());
            }
            // Ceiling division, exactly: truncating division rounds up when the remainder has
            // the sign of the divisor.
            let (q, r) = ((l - s) / d, (l - s) % d);
            let q = if r != 0 && (r > 0) == (d > 0) { q + 1 } else { q };
            u64::try_from(q.max(0)).ok().and_then(|n| usize::try_from(n).ok())
        }
        _ => {
            let (s, l, d) = (start.to_f64(), limit.to_f64(), delta.to_f64());
            if d == 0.0 {
                return Err("delta must not be 0".into());
            }
            let c = ((l - s) / d).ceil();
            if c.is_nan() {
                return Err(invalid!("range({s}, {l}, {d}) has no element count"));
            }
            (c < 1e18).then(|| c.max(0.0) as usize)
        }
    };
    count.ok_or_else(|| invalid!("range({start:?}, {limit:?}, {delta:?}) has too many elements"))
}

pub(super) fn range(ops: &Operands, ctx: &Ctx) -> Infer {
    let names = ["start", "limit", "delta"];
    let operands: Vec<Operand> = (0..3).map(|i| ops.get(i)).collect::<Result<_, _>>()?;
    let dtype = operands[0].ty.dtype;
    for (o, name) in operands.iter().zip(names) {
        if o.ty.dtype != dtype {
            return Err(invalid!(
                "start, limit and delta must have the same type, got {name} {} and start {}",
                o.ty,
                operands[0].ty
            ));
        }
        // ONNX says scalar; a one-element 1-D tensor means the same thing.
        if !(o.ty.rank() == 0 || (o.ty.rank() == 1 && o.ty.shape.0[0] == Dim::Fixed(1))) {
            return Err(invalid!("{name} must be a scalar, got {}", o.ty));
        }
    }
    if !dtype.is_numeric() {
        return Err(OpError::NeedsType { class: "numeric", ty: Box::new(operands[0].ty.clone()) });
    }
    let values: Option<Vec<Scalar>> = operands.iter().map(|o| o.value.map(Scalar::of)).collect();
    let len = match values {
        Some(v) => {
            let n = range_count(v[0], v[1], v[2])?;
            checked_count(&[n], dtype, "range")?;
            Dim::Fixed(n)
        }
        None => ctx.fresh(0),
    };
    Ok(vec![TensorType::new(dtype, Shape(vec![len]))])
}
