//! Reductions: the reduced axes are moved last, then each row is folded.

use super::view;
use crate::infer::reduced_axes;
use crate::op::{Reduce, ReduceKind};
use crate::{DType, Tensor};

pub(super) fn reduce(r: &Reduce, x: &Tensor, axes: Option<&Tensor>, out: &[usize]) -> Result<Tensor, String> {
    let axes = reduced_axes(r.noop_with_empty_axes, axes.map(|a| Some(a.to_i64s())), &x.ty())?.expect("constant axes");
    let kept: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(&axes).copied().collect();
    let reduced: usize = axes.iter().map(|&a| x.dims()[a]).product();
    let rows: usize = kept.iter().map(|&a| x.dims()[a]).product();
    let exact_ints = (x.dtype().is_int() || x.dtype() == DType::Bool) && matches!(r.kind, ReduceKind::Sum | ReduceKind::Prod | ReduceKind::Max | ReduceKind::Min | ReduceKind::SumSquare | ReduceKind::L1);
    if exact_ints {
        let xi = x.cast(DType::I64);
        let v = view::<i64>(&xi).permuted_axes(perm).as_standard_layout().to_owned();
        let flat = v.as_slice().expect("standard layout");
        let y: Vec<i64> = (0..rows).map(|i| fold_int(r.kind, &flat[i * reduced..(i + 1) * reduced])).collect();
        return Tensor::from_vec(out, y).map(|t| t.cast(x.dtype())).map_err(|e| e.to_string());
    }
    let x64 = x.cast(DType::F64);
    let v = view::<f64>(&x64).permuted_axes(perm).as_standard_layout().to_owned();
    let flat = v.as_slice().expect("standard layout");
    let y: Vec<f64> = (0..rows).map(|i| fold_float(r.kind, &flat[i * reduced..(i + 1) * reduced])).collect();
    Tensor::from_f64s(x.dtype(), out, &y).map_err(|e| e.to_string())
}

fn fold_float(kind: ReduceKind, v: &[f64]) -> f64 {
    let sum = || v.iter().sum::<f64>();
    match kind {
        ReduceKind::Sum => sum(),
        ReduceKind::Mean => sum() / v.len() as f64,
        ReduceKind::Max => v.iter().copied().fold(f64::NEG_INFINITY, |m, x| if x > m || x.is_nan() { x } else { m }),
        ReduceKind::Min => v.iter().copied().fold(f64::INFINITY, |m, x| if x < m || x.is_nan() { x } else { m }),
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

/// ArgMax/ArgMin, CumSum/CumProd, TopK.
pub(super) fn eval(op: &crate::Op, _operands: &[Option<&Tensor>], _out: &[crate::TensorType]) -> Result<Vec<Tensor>, String> {
    super::not_yet(op)
}
