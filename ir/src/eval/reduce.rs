//! Reductions: the reduced axes are moved last, then each row is folded.

use std::cmp::Ordering;

use super::{first, not_yet, typed, view};
use crate::error::{invalid, OpError};
use crate::infer::reduced_axes;
use crate::op::{Reduce, ReduceKind};
use crate::{normalize_axis, DType, Element, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    out_dims: &[Vec<usize>],
) -> Result<Vec<Tensor>, OpError> {
    let x = || first(operands);
    Ok(match op {
        Op::Reduce(r) => {
            vec![reduce(r, x(), operands.get(1).copied().flatten(), &out_dims[0])?]
        }
        Op::ArgReduce(r) => arg_reduce(r, operands, out_types)?,
        Op::Cumulative(c) => cumulative(c, operands)?,
        Op::TopK { axis, largest, .. } => top_k(*axis, *largest, operands, out_types)?,
        Op::Det => vec![det(x())?],
        _ => return not_yet(op),
    })
}

/// Det: each matrix's determinant by LU decomposition with partial pivoting, in f64.
fn det(x: &Tensor) -> Result<Tensor, OpError> {
    let dims = x.dims();
    let r = dims.len();
    if r < 2 || dims[r - 2] != dims[r - 1] {
        return Err(invalid!("needs square matrices, got {}", x.ty()));
    }
    let m = dims[r - 1];
    let values = x.to_f64s();
    let out: Vec<f64> = if m == 0 {
        // The determinant of the empty matrix is 1 (the empty product).
        vec![1.0; dims[..r - 2].iter().product()]
    } else {
        values.chunks(m * m).map(|a| determinant(a.to_vec(), m)).collect()
    };
    Ok(Tensor::from_f64s(x.dtype(), &dims[..r - 2], &out)?)
}

/// The determinant of the `m` x `m` row-major matrix `a` (Gaussian elimination; the pivot is
/// the largest entry of its column, as LAPACK's getrf chooses it).
pub fn determinant(mut a: Vec<f64>, m: usize) -> f64 {
    let mut det = 1.0;
    for c in 0..m {
        let p =
            (c..m).max_by(|&i, &j| a[i * m + c].abs().total_cmp(&a[j * m + c].abs())).unwrap_or(c);
        if a[p * m + c] == 0.0 {
            return 0.0;
        }
        if p != c {
            for k in 0..m {
                a.swap(p * m + k, c * m + k);
            }
            det = -det;
        }
        let pivot = a[c * m + c];
        det *= pivot;
        for i in c + 1..m {
            let f = a[i * m + c] / pivot;
            for k in c..m {
                a[i * m + k] -= f * a[c * m + k];
            }
        }
    }
    det
}

pub(super) fn reduce(
    r: &Reduce,
    x: &Tensor,
    axes: Option<&Tensor>,
    out: &[usize],
) -> Result<Tensor, OpError> {
    let axes = reduced_axes(r.noop_with_empty_axes, axes.map(|a| Some(a.to_i64s())), &x.ty())?
        .expect("constant axes");
    let kept: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(&axes).copied().collect();
    let reduced: usize = axes.iter().map(|&a| x.dims()[a]).product();
    let rows: usize = kept.iter().map(|&a| x.dims()[a]).product();
    let exact_ints = (x.dtype().is_int() || x.dtype() == DType::Bool)
        && matches!(
            r.kind,
            ReduceKind::Sum
                | ReduceKind::Prod
                | ReduceKind::Max
                | ReduceKind::Min
                | ReduceKind::SumSquare
                | ReduceKind::L1
        );
    if exact_ints && reduced == 0 && x.dtype().is_int() {
        if let ReduceKind::Max | ReduceKind::Min = r.kind {
            // Over nothing: the type's smallest (Max) or largest (Min) value, where compiled code
            // starts (the i64 bound cast back would wrap).
            let v = if r.kind == ReduceKind::Max { f64::NEG_INFINITY } else { f64::INFINITY };
            return Tensor::from_f64s(x.dtype(), out, &vec![v; rows]).map_err(OpError::from);
        }
    }
    if exact_ints {
        let xi = x.cast(DType::I64);
        let v = view::<i64>(&xi).permuted_axes(perm).as_standard_layout().to_owned();
        let flat = v.as_slice().expect("standard layout");
        let y: Vec<i64> =
            (0..rows).map(|i| fold_int(r.kind, &flat[i * reduced..(i + 1) * reduced])).collect();
        return Tensor::from_vec(out, y).map(|t| t.cast(x.dtype())).map_err(OpError::from);
    }
    let x64 = x.cast(DType::F64);
    let v = view::<f64>(&x64).permuted_axes(perm).as_standard_layout().to_owned();
    let flat = v.as_slice().expect("standard layout");
    let y: Vec<f64> =
        (0..rows).map(|i| fold_float(r.kind, &flat[i * reduced..(i + 1) * reduced])).collect();
    Tensor::from_f64s(x.dtype(), out, &y).map_err(OpError::from)
}

fn fold_float(kind: ReduceKind, v: &[f64]) -> f64 {
    let sum = || v.iter().sum::<f64>();
    match kind {
        ReduceKind::Sum => sum(),
        ReduceKind::Mean => sum() / v.len() as f64,
        ReduceKind::Max => {
            v.iter()
                .copied()
                .fold(f64::NEG_INFINITY, |m, x| if x > m || x.is_nan() { x } else { m })
        }
        ReduceKind::Min => {
            v.iter().copied().fold(f64::INFINITY, |m, x| if x < m || x.is_nan() { x } else { m })
        }
        ReduceKind::Prod => v.iter().product(),
        ReduceKind::L1 => v.iter().map(|x| x.abs()).sum(),
        ReduceKind::L2 => v.iter().map(|x| x * x).sum::<f64>().sqrt(),
        ReduceKind::LogSum => sum().ln(),
        ReduceKind::LogSumExp => {
            let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m.is_infinite() {
                return m;
            }
            m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
        }
        ReduceKind::SumSquare => v.iter().map(|x| x * x).sum(),
    }
}

fn fold_int(kind: ReduceKind, v: &[i64]) -> i64 {
    match kind {
        ReduceKind::Sum => v.iter().fold(0i64, |a, &x| a.wrapping_add(x)),
        ReduceKind::Prod => v.iter().fold(1i64, |a, &x| a.wrapping_mul(x)),
        ReduceKind::Max => v.iter().copied().max().unwrap_or(i64::MIN),
        ReduceKind::Min => v.iter().copied().min().unwrap_or(i64::MAX),
        ReduceKind::SumSquare => v.iter().fold(0i64, |a, &x| a.wrapping_add(x.wrapping_mul(x))),
        ReduceKind::L1 => v.iter().fold(0i64, |a, &x| a.wrapping_add(x.wrapping_abs())),
        _ => unreachable!("only exact integer reductions come here"),
    }
}

/// The first operand and the result dims, for the scanning reductions.
fn operand_and_dims<'t>(
    operands: &[Option<&'t Tensor>],
    out: &TensorType,
) -> Result<(&'t Tensor, Vec<usize>), OpError> {
    Ok((
        operands[0].ok_or("operand 0 is missing")?,
        out.shape.as_fixed().ok_or("the result shape is known")?,
    ))
}

/// ArgMax/ArgMin.
pub(super) fn arg_reduce(
    r: &crate::op::ArgReduce,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (x, out_dims) = operand_and_dims(operands, &out[0])?;
    let name = if r.max { "ArgMax" } else { "ArgMin" };
    let a = normalize_axis(r.axis, x.rank()).ok_or("axis checked by inference")?;
    let (outer, n, inner) = split_at_axis(x.dims(), a);
    if n == 0 && outer * inner > 0 {
        return Err(invalid!("{name} of an empty axis {a} of {}", x.ty()));
    }
    let v = Nums::of(x);
    let mut y = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let mut best = 0;
            for j in 1..n {
                // ArgMax and ArgMin both pick NaN first, as numpy does.
                let c =
                    if r.max { v.cmp(at(j), at(best)) } else { v.cmp_nan_least(at(best), at(j)) };
                if c == Ordering::Greater || (c == Ordering::Equal && r.select_last_index) {
                    best = j;
                }
            }
            y.push(best as i64);
        }
    }
    Ok(vec![Tensor::from_vec(&out_dims, y).map_err(OpError::from)?])
}

/// CumSum/CumProd along the axis operand 1 gives.
pub(super) fn cumulative(
    c: &crate::op::Cumulative,
    operands: &[Option<&Tensor>],
) -> Result<Vec<Tensor>, OpError> {
    let x = operands[0].ok_or("operand 0 is missing")?;
    let axis = operands
        .get(1)
        .copied()
        .flatten()
        .ok_or("operand 1 is missing")?
        .to_i64s()
        .first()
        .copied()
        .ok_or("axis must hold one value")?;
    let a = normalize_axis(axis, x.rank())
        .ok_or_else(|| invalid!("axis {axis} is out of range for {}", x.ty()))?;
    let (outer, n, inner) = split_at_axis(x.dims(), a);
    let mut v = Nums::of(x);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let order: Vec<usize> =
                if c.reverse { (0..n).rev().map(at).collect() } else { (0..n).map(at).collect() };
            v.scan(&order, c.prod, c.exclusive);
        }
    }
    Ok(vec![v.to_tensor(x.dtype(), x.dims())])
}

/// TopK: the `k` largest or smallest along the axis, and their indices.
pub(super) fn top_k(
    axis: i64,
    largest: bool,
    operands: &[Option<&Tensor>],
    out: &[TensorType],
) -> Result<Vec<Tensor>, OpError> {
    let (x, d) = operand_and_dims(operands, &out[0])?;
    let a = normalize_axis(axis, x.rank()).ok_or("axis checked by inference")?;
    let k = d[a];
    let (outer, n, inner) = split_at_axis(x.dims(), a);
    let v = Nums::of(x);
    // Source positions of the results, in result order.
    let mut picks = vec![0; outer * k * inner];
    let mut indices = vec![0i64; outer * k * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let mut order: Vec<usize> = (0..n).collect();
            // A stable sort keeps equal values in index order.
            if largest {
                order.sort_by(|&p, &q| v.cmp(at(q), at(p)));
            } else {
                order.sort_by(|&p, &q| v.cmp(at(p), at(q)));
            }
            for (r, &j) in order[..k].iter().enumerate() {
                picks[(o * k + r) * inner + i] = at(j);
                indices[(o * k + r) * inner + i] = j as i64;
            }
        }
    }
    fn take<T: Element>(x: &Tensor, picks: &[usize], dims: &[usize]) -> Tensor {
        let s = x.as_slice::<T>().expect("dispatched on the dtype");
        Tensor::from_vec(dims, picks.iter().map(|&p| s[p]).collect()).expect("length matches")
    }
    let values = typed!(x.dtype(), take(x, &picks, &d));
    Ok(vec![values, Tensor::from_vec(&d, indices).map_err(OpError::from)?])
}

/// `dims` as (product before `axis`, size of `axis`, product after).
pub(super) fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// A tensor's elements in an exact compute type: i128 for integers (wrapping as the element type
/// would), f64 for floats.
pub(super) enum Nums {
    Int(Vec<i128>),
    Float(Vec<f64>),
}

impl Nums {
    pub(super) fn of(t: &Tensor) -> Nums {
        fn go<T: Element>(t: &Tensor) -> Nums {
            let s = t.as_slice::<T>().expect("dispatched on the dtype");
            if T::DTYPE.is_float() {
                Nums::Float(s.iter().map(|v| v.to_f64()).collect())
            } else {
                Nums::Int(s.iter().map(|v| v.to_i128().unwrap_or(0)).collect())
            }
        }
        typed!(t.dtype(), go(t))
    }

    /// Rounds (floats) or wraps (integers) back to `dtype`.
    pub(super) fn to_tensor(&self, dtype: DType, dims: &[usize]) -> Tensor {
        fn go<T: Element>(n: &Nums, dims: &[usize]) -> Tensor {
            let v: Vec<T> = match n {
                Nums::Int(v) => v.iter().map(|&x| T::from_i128(x)).collect(),
                Nums::Float(v) => v.iter().map(|&x| T::from_f64(x)).collect(),
            };
            Tensor::from_vec(dims, v).expect("length matches")
        }
        typed!(dtype, go(self, dims))
    }

    /// Orders elements `a` and `b`; NaN is greater than everything (numpy's sort order).
    fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self {
            Nums::Int(v) => v[a].cmp(&v[b]),
            Nums::Float(v) => match (v[a].is_nan(), v[b].is_nan()) {
                (false, false) => v[a].partial_cmp(&v[b]).unwrap_or(Ordering::Equal),
                (x, y) => x.cmp(&y),
            },
        }
    }

    /// Like `cmp`, but NaN is less than everything.
    fn cmp_nan_least(&self, a: usize, b: usize) -> Ordering {
        match self {
            Nums::Float(v) if v[a].is_nan() || v[b].is_nan() => v[b].is_nan().cmp(&v[a].is_nan()),
            _ => self.cmp(a, b),
        }
    }

    /// A running sum or product over the elements at `order`, in place; `exclusive` leaves each
    /// element out of its own result.
    fn scan(&mut self, order: &[usize], prod: bool, exclusive: bool) {
        macro_rules! run {
            ($v:expr, $zero:expr, $one:expr, $op:expr) => {{
                let mut acc = if prod { $one } else { $zero };
                for &p in order {
                    let x = $v[p];
                    let next = $op(acc, x);
                    $v[p] = if exclusive { acc } else { next };
                    acc = next;
                }
            }};
        }
        match self {
            Nums::Int(v) => run!(v, 0i128, 1i128, |a: i128, x: i128| if prod {
                a.wrapping_mul(x)
            } else {
                a.wrapping_add(x)
            }),
            Nums::Float(v) => {
                run!(v, 0.0f64, 1.0f64, |a: f64, x: f64| if prod { a * x } else { a + x })
            }
        }
    }
}
