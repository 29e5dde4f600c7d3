//! MatMul, Gemm and Einsum. Floats multiply in f32 (f64 for f64 tensors) with ndarray's GEMM; integers
//! accumulate in i64 with wrap-around.

use ndarray::{Array2, Array3, ArrayD, Axis, Ix2, IxDyn, Zip};

use super::reduce::Nums;
use super::{first, not_yet, tensor, view};
use crate::error::{invalid, OpError};
use crate::infer::EinsumSpec;
use crate::op::Gemm;
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    out_dims: &[Vec<usize>],
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::MatMul => vec![matmul(x(), operands[1].expect("checked"), &out_dims[0])?],
        Op::Gemm(g) => {
            vec![gemm(g, x(), operands[1].expect("checked"), operands.get(2).copied().flatten())?]
        }
        Op::Einsum { equation } => einsum(equation, operands, out_types)?,
        _ => return not_yet(op),
    })
}

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
    fn shaped<T: Clone>(
        a: ndarray::ArrayViewD<T>,
        dims: &[usize],
        b: usize,
        r: usize,
        c: usize,
    ) -> Array3<T> {
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
    Array2::from_shape_fn((m, n), |(i, j)| {
        (0..k).fold(0i64, |acc, p| acc.wrapping_add(a[(i, p)].wrapping_mul(b[(p, j)])))
    })
}

/// numpy matmul of `a` and `b` with result dims `out`.
pub(super) fn matmul(a: &Tensor, b: &Tensor, out: &[usize]) -> Result<Tensor, OpError> {
    // Promote 1-D operands to matrices, as numpy does, and restore the result's rank after.
    let a2 =
        if a.rank() == 1 { a.reshape(&[1, a.dims()[0]]).expect("same count") } else { a.clone() };
    let b2 =
        if b.rank() == 1 { b.reshape(&[b.dims()[0], 1]).expect("same count") } else { b.clone() };
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
        (Mats::F32(x), Mats::F32(y)) => {
            tensor(batched(&x, &y, |p, q| p.dot(&q)).into_dyn()).cast(a.dtype())
        }
        (Mats::F64(x), Mats::F64(y)) => tensor(batched(&x, &y, |p, q| p.dot(&q)).into_dyn()),
        (Mats::Int(x), Mats::Int(y)) => {
            tensor(batched(&x, &y, int_matmul).into_dyn()).cast(a.dtype())
        }
        _ => return Err("operand types differ".into()),
    };
    c.reshape(out).map_err(OpError::from)
}

fn batched<T: ndarray::LinalgScalar>(
    a: &Array3<T>,
    b: &Array3<T>,
    f: impl Fn(ndarray::ArrayView2<T>, ndarray::ArrayView2<T>) -> Array2<T>,
) -> Array3<T> {
    let (batch, m, n) = (a.len_of(Axis(0)), a.len_of(Axis(1)), b.len_of(Axis(2)));
    let mut out = Array3::from_elem((batch, m, n), T::zero());
    for i in 0..batch {
        out.index_axis_mut(Axis(0), i)
            .assign(&f(a.index_axis(Axis(0), i), b.index_axis(Axis(0), i)));
    }
    out
}

pub(super) fn gemm(
    g: &Gemm,
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
) -> Result<Tensor, OpError> {
    let t = |x: &Tensor, trans: bool| -> Result<Tensor, OpError> {
        if trans {
            Ok(super::movement::transpose(x, &[1, 0]))
        } else {
            Ok(x.clone())
        }
    };
    let (a, b) = (t(a, g.trans_a)?, t(b, g.trans_b)?);
    let (m, n) = (a.dims()[0], b.dims()[1]);
    let ab = matmul(&a, &b, &[m, n])?;
    let ab64 =
        view::<f64>(&ab.cast(DType::F64)).into_dimensionality::<Ix2>().expect("2-D").to_owned();
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

/// Einstein summation by direct iteration over every label: each result element sums, over the
/// labels absent from the result, the product of the operands' elements. Floats in f64, integers
/// exactly (wrapping as the element type would).
pub(super) fn einsum(
    equation: &str,
    operands: &[Option<&Tensor>],
    out: &[crate::TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let xs: Vec<&Tensor> =
        operands.iter().map(|o| o.ok_or("an operand is missing")).collect::<Result<_, _>>()?;
    let shapes: Vec<crate::Shape> = xs.iter().map(|t| crate::Shape::fixed(t.dims())).collect();
    let spec = EinsumSpec::new(equation, &shapes.iter().collect::<Vec<_>>())?;
    let sizes: Vec<usize> =
        spec.sizes.iter().map(|d| d.fixed().ok_or("sizes are known")).collect::<Result<_, _>>()?;
    let summed: Vec<usize> = (0..sizes.len()).filter(|l| !spec.output.contains(l)).collect();
    // Iteration order: result labels (outermost first), then summed ones.
    let order: Vec<usize> = spec.output.iter().chain(&summed).copied().collect();
    let dims: Vec<usize> = order.iter().map(|&l| sizes[l]).collect();
    // Each operand's stride for each label in `order`: a repeated label adds its strides (a
    // diagonal), a broadcast axis of size 1 has stride 0.
    let strides: Vec<Vec<usize>> = xs
        .iter()
        .zip(&spec.operands)
        .map(|(t, labels)| {
            let st = super::strides(t.dims());
            let mut s = vec![0; order.len()];
            for (axis, &l) in labels.iter().enumerate() {
                if t.dims()[axis] == sizes[l] {
                    let k = order.iter().position(|&o| o == l).expect("every label is ordered");
                    s[k] += st[axis];
                }
            }
            s
        })
        .collect();
    let count = |d: &[usize]| {
        d.iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .ok_or_else(|| invalid!("equation `{equation}` over sizes {dims:?} is too large"))
    };
    let (n_out, n_sum) = (count(&dims[..spec.output.len()])?, count(&dims[spec.output.len()..])?);
    count(&[n_out, n_sum])?;
    let nums: Vec<Nums> = xs.iter().map(|t| Nums::of(t)).collect();
    let out_dims = out[0].shape.as_fixed().ok_or("the result shape is known")?;
    let mut idx = vec![0usize; order.len()];
    let offset =
        |idx: &[usize], k: usize| idx.iter().zip(&strides[k]).map(|(i, s)| i * s).sum::<usize>();
    // Advances the odometer over `idx[range]`, last position fastest.
    let step = |idx: &mut [usize], from: usize, to: usize| {
        for p in (from..to).rev() {
            idx[p] += 1;
            if idx[p] < dims[p] {
                return;
            }
            idx[p] = 0;
        }
    };
    let n_labels = order.len();
    let k_out = spec.output.len();
    let result = if nums.iter().all(|n| matches!(n, Nums::Int(_))) {
        let vals: Vec<&Vec<i128>> = nums
            .iter()
            .map(|n| if let Nums::Int(v) = n { v } else { unreachable!("checked") })
            .collect();
        let mut y = Vec::with_capacity(n_out);
        for _ in 0..n_out {
            let mut acc = 0i128;
            for _ in 0..n_sum {
                acc = acc.wrapping_add(
                    vals.iter()
                        .enumerate()
                        .fold(1i128, |p, (k, v)| p.wrapping_mul(v[offset(&idx, k)])),
                );
                step(&mut idx, k_out, n_labels);
            }
            y.push(acc);
            step(&mut idx, 0, k_out);
        }
        Nums::Int(y)
    } else {
        let vals: Vec<Vec<f64>> = nums
            .into_iter()
            .map(|n| match n {
                Nums::Float(v) => v,
                Nums::Int(v) => v.into_iter().map(|x| x as f64).collect(),
            })
            .collect();
        let mut y = Vec::with_capacity(n_out);
        for _ in 0..n_out {
            let mut acc = 0.0;
            for _ in 0..n_sum {
                acc += vals.iter().enumerate().fold(1.0, |p, (k, v)| p * v[offset(&idx, k)]);
                step(&mut idx, k_out, n_labels);
            }
            y.push(acc);
            step(&mut idx, 0, k_out);
        }
        Nums::Float(y)
    };
    Ok(vec![result.to_tensor(xs[0].dtype(), &out_dims)])
}
