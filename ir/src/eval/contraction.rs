//! MatMul and Gemm. Floats multiply in f32 (f64 for f64 tensors) with ndarray's GEMM; integers
//! accumulate in i64 with wrap-around.

use ndarray::{Array2, Array3, ArrayD, Axis, Ix2, IxDyn, Zip};

use super::{tensor, view};
use crate::op::Gemm;
use crate::{DType, Tensor};

/// A batch of matrices [batch, rows, cols] in the compute type.
enum Mats {
    F32(Array3<f32>),
    F64(Array3<f64>),
    Int(Array3<i64>),
}

/// The value of `t` in its compute type, broadcast to `dims` and reshaped to [batch, r, c].
fn mats(t: &Tensor, dims: &[usize]) -> Mats {
    let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let batch: usize = dims[..dims.len() - 2].iter().product();
    fn shaped<T: Clone>(a: ndarray::ArrayViewD<T>, dims: &[usize], b: usize, r: usize, c: usize) -> Array3<T> {
        let full = a.broadcast(IxDyn(dims)).expect("inferred").to_owned();
        full.into_shape_with_order((b, r, c)).expect("same count")
    }
    // Operand dims get leading ones so they broadcast against `dims`.
    let padded = |t: &Tensor| -> Tensor {
        let mut d = vec![1; dims.len() - t.rank()];
        d.extend_from_slice(t.dims());
        t.reshape(&d).expect("same count")
    };
    match t.dtype() {
        DType::F64 => Mats::F64(shaped(view::<f64>(&padded(t)), dims, batch, r, c)),
        d if d.is_float() => {
            let f = padded(&t.cast(DType::F32));
            Mats::F32(shaped(view::<f32>(&f), dims, batch, r, c))
        }
        _ => {
            let i = padded(&t.cast(DType::I64));
            Mats::Int(shaped(view::<i64>(&i), dims, batch, r, c))
        }
    }
}

fn int_matmul(a: ndarray::ArrayView2<i64>, b: ndarray::ArrayView2<i64>) -> Array2<i64> {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    Array2::from_shape_fn((m, n), |(i, j)| (0..k).fold(0i64, |acc, p| acc.wrapping_add(a[(i, p)].wrapping_mul(b[(p, j)]))))
}

/// numpy matmul of `a` and `b` with result dims `out`.
pub(super) fn matmul(a: &Tensor, b: &Tensor, out: &[usize]) -> Result<Tensor, String> {
    // Promote 1-D operands to matrices, as numpy does, and restore the result's rank after.
    let a2 = if a.rank() == 1 { a.reshape(&[1, a.dims()[0]]).expect("same count") } else { a.clone() };
    let b2 = if b.rank() == 1 { b.reshape(&[b.dims()[0], 1]).expect("same count") } else { b.clone() };
    let (m, k, n) = (a2.dims()[a2.rank() - 2], a2.dims()[a2.rank() - 1], b2.dims()[b2.rank() - 1]);
    let batch_rank = a2.rank().max(b2.rank()) - 2;
    let batch: Vec<usize> = if batch_rank == 0 {
        Vec::new()
    } else {
        let pad = |t: &Tensor| {
            let mut d = vec![1; batch_rank + 2 - t.rank()];
            d.extend_from_slice(&t.dims()[..t.rank() - 2]);
            d
        };
        crate::broadcast_fixed(&pad(&a2), &pad(&b2)).ok_or("batch dimensions do not broadcast")?
    };
    let dims = |r, c| [batch.as_slice(), &[r, c]].concat();
    let c = match (mats(&a2, &dims(m, k)), mats(&b2, &dims(k, n))) {
        (Mats::F32(x), Mats::F32(y)) => tensor(batched(&x, &y, |p, q| p.dot(&q)).into_dyn()).cast(a.dtype()),
        (Mats::F64(x), Mats::F64(y)) => tensor(batched(&x, &y, |p, q| p.dot(&q)).into_dyn()),
        (Mats::Int(x), Mats::Int(y)) => tensor(batched(&x, &y, int_matmul).into_dyn()).cast(a.dtype()),
        _ => return Err("operand types differ".into()),
    };
    c.reshape(out).map_err(|e| e.to_string())
}

fn batched<T: ndarray::LinalgScalar>(a: &Array3<T>, b: &Array3<T>, f: impl Fn(ndarray::ArrayView2<T>, ndarray::ArrayView2<T>) -> Array2<T>) -> Array3<T> {
    let (batch, m, n) = (a.len_of(Axis(0)), a.len_of(Axis(1)), b.len_of(Axis(2)));
    let mut out = Array3::from_elem((batch, m, n), T::zero());
    for i in 0..batch {
        out.index_axis_mut(Axis(0), i).assign(&f(a.index_axis(Axis(0), i), b.index_axis(Axis(0), i)));
    }
    out
}

pub(super) fn gemm(g: &Gemm, a: &Tensor, b: &Tensor, c: Option<&Tensor>) -> Result<Tensor, String> {
    let t = |x: &Tensor, trans: bool| -> Result<Tensor, String> {
        if trans {
            Ok(super::movement::transpose(x, &[1, 0]))
        } else {
            Ok(x.clone())
        }
    };
    let (a, b) = (t(a, g.trans_a)?, t(b, g.trans_b)?);
    let (m, n) = (a.dims()[0], b.dims()[1]);
    let ab = matmul(&a, &b, &[m, n])?;
    let ab64 = view::<f64>(&ab.cast(DType::F64)).into_dimensionality::<Ix2>().expect("2-D").to_owned();
    let alpha = g.alpha as f64;
    let mut y: ArrayD<f64> = ab64.mapv(|v| v * alpha).into_dyn();
    if let Some(c) = c {
        let c64 = c.cast(DType::F64);
        let cv = view::<f64>(&c64);
        let cv = cv.broadcast(IxDyn(&[m, n])).ok_or("C does not broadcast")?;
        let beta = g.beta as f64;
        Zip::from(&mut y).and(&cv).for_each(|y, &c| *y += beta * c);
    }
    Ok(tensor(y).cast(a.dtype()))
}

pub(super) fn einsum(_equation: &str, _operands: &[Option<&Tensor>], _out: &[crate::TensorType]) -> Result<Vec<Tensor>, String> {
    Err("Einsum is not implemented yet".into())
}
