//! Ops that make tensors from shapes and scalars: Shape, Size, ConstantOfShape, Range, EyeLike.

use super::{first, not_yet, typed};
use crate::error::OpError;
use crate::infer::{range_count, shape_interval, window_size, Scalar};
use crate::{DType, Element, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    out_dims: &[Vec<usize>],
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::Shape { start, end } => vec![shape(x(), *start, *end)],
        Op::Size => vec![Tensor::scalar(x().len() as i64)],
        Op::ConstantOfShape { value } => vec![constant_of_shape(value, &out_dims[0])],
        Op::Range => vec![range(operands)?],
        Op::EyeLike { k, .. } => vec![eye_like(*k, &out_types[0])?],
        Op::SignalWindow(w) => {
            let n = window_size(x())?;
            vec![Tensor::from_f64s(w.out_dtype(), &[n], &w.values(n))?]
        }
        _ => return not_yet(op),
    })
}

/// Shape: the dimensions `start..end`.
pub(super) fn shape(x: &Tensor, start: i64, end: Option<i64>) -> Tensor {
    let (s, e) = shape_interval(x.rank(), start, end);
    Tensor::vector(&x.dims()[s..e].iter().map(|&d| d as i64).collect::<Vec<_>>())
}

/// ConstantOfShape: `value` everywhere.
pub(super) fn constant_of_shape(value: &Tensor, dims: &[usize]) -> Tensor {
    fn fill<T: Element>(value: &Tensor, dims: &[usize]) -> Tensor {
        let v = value.as_slice::<T>().expect("dispatched on the dtype")[0];
        Tensor::from_vec(dims, vec![v; dims.iter().product()]).expect("length matches")
    }
    typed!(value.dtype(), fill(value, dims))
}

/// Range: `start, start + delta, ...` below `limit`.
pub(super) fn range(operands: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let s: Vec<Scalar> = operands[..3]
        .iter()
        .map(|o| o.map(Scalar::of).ok_or("operand missing"))
        .collect::<Result<_, _>>()?;
    let n = range_count(s[0], s[1], s[2])?;
    let x = operands[0].ok_or("operand 0 is missing")?;
    Ok(range_values(x.dtype(), s[0], s[2], n))
}

/// EyeLike: ones where column - row == k.
pub(super) fn eye_like(k: i64, out: &TensorType) -> Result<Tensor, OpError> {
    let dims = out.shape.as_fixed().ok_or("the result shape is known")?;
    let (rows, cols) = (dims[0] as i64, dims[1] as i64);
    let mut v = vec![0.0; dims[0] * dims[1]];
    for r in 0..rows {
        let c = r.saturating_add(k);
        if (0..cols).contains(&c) {
            v[(r * cols + c) as usize] = 1.0;
        }
    }
    Tensor::from_f64s(out.dtype, &dims, &v).map_err(OpError::from)
}

/// `start + i * delta` for `i < n`: exactly for integers, in f64 (rounded once) for floats.
fn range_values(dtype: DType, start: Scalar, delta: Scalar, n: usize) -> Tensor {
    fn go<T: Element>(start: Scalar, delta: Scalar, n: usize) -> Tensor {
        let v: Vec<T> = match (start, delta) {
            (Scalar::Int(s), Scalar::Int(d)) => {
                (0..n).map(|i| T::from_i128(s + i as i128 * d)).collect()
            }
            (Scalar::Float(s), Scalar::Float(d)) => {
                (0..n).map(|i| T::from_f64(s + i as f64 * d)).collect()
            }
            _ => unreachable!("start and delta have one type"),
        };
        Tensor::from_vec(&[n], v).expect("length matches")
    }
    typed!(dtype, go(start, delta, n))
}
