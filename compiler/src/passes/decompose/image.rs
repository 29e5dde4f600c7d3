//! CenterCropPad as Slice and Pad, Col2Im as one MatMul by a constant 0/1 matrix, Det as its
//! permutation expansion, and AffineGrid as a MatMul of its constant base grid by the matrices: each rewrite is what `kiln_ir::eval` computes, once the shapes and
//! the shape operands are constants (after specialisation).

use kiln_ir::infer::{center_crop_pad_amounts, Col2ImPlan};
use kiln_ir::op::{PadMode, Reduce, ReduceKind};
use kiln_ir::{IrError, NodeId, Op, OpError, Tensor, ValueId};

use super::{compute_type, Emit};
use crate::Result;

/// The constants a rewrite needs (the shape operands), or `None` when one is not a constant.
pub(super) fn constant_ints(e: &Emit, v: Option<ValueId>) -> Option<Vec<i64>> {
    v.and_then(|v| e.g.constant_value(v)).map(Tensor::to_i64s)
}

/// An error of the rule the interpreter shares, naming the node.
pub(super) fn node_error(e: &Emit, id: NodeId, err: OpError) -> crate::CompileError {
    let n = e.g.node(id);
    IrError::shape(&n.name, n.op.name(), err).into()
}

/// CenterCropPad: a Slice of the cropped axes, then a zero Pad of the padded ones.
pub(super) fn center_crop_pad(
    e: &mut Emit,
    id: NodeId,
    axes: &[i64],
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let Some(x) = ops.first().copied().flatten() else { return Ok(None) };
    let Some(targets) = constant_ints(e, ops.get(1).copied().flatten()) else { return Ok(None) };
    let dims = e.dims(x)?;
    let amounts =
        center_crop_pad_amounts(&dims, &targets, axes).map_err(|err| node_error(e, id, err))?;
    let mut y = x;
    for (a, (&(lo, hi), &n)) in amounts.iter().zip(&dims).enumerate() {
        // Both amounts of an axis have its difference's sign: negative ones crop.
        if lo < 0 || hi < 0 {
            let (start, end) = (lo.unsigned_abs() as usize, n - hi.unsigned_abs() as usize);
            y = e.slice("crop", y, a, start, end, 1)?;
        }
    }
    if amounts.iter().any(|&(lo, hi)| lo > 0 || hi > 0) {
        let mut pads: Vec<i64> = amounts.iter().map(|&(lo, _)| lo.max(0)).collect();
        pads.extend(amounts.iter().map(|&(_, hi)| hi.max(0)));
        let pads = e.ints(&pads)?;
        y = e.op2("pad", Op::Pad { mode: PadMode::Constant }, &[y, pads])?;
    }
    Ok(Some(vec![y]))
}

/// The most entries of Col2Im's scatter matrix (64 MiB of f32): past that the rewrite would
/// make a constant larger than the images it serves, and the node stays unsupported.
const COL2IM_MATRIX_LIMIT: usize = 1 << 24;

/// Col2Im of floats: `[N, C*K, L]` viewed as `[N, C, K*L]` times the constant `[K*L, pixels]`
/// matrix with a one where a column element lands (the plan's targets), viewed as the image.
pub(super) fn col2im(
    e: &mut Emit,
    id: NodeId,
    c: &kiln_ir::op::Col2Im,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let Some(x) = ops.first().copied().flatten() else { return Ok(None) };
    let (Some(image), Some(block)) = (
        constant_ints(e, ops.get(1).copied().flatten()),
        constant_ints(e, ops.get(2).copied().flatten()),
    ) else {
        return Ok(None);
    };
    let dt = e.dtype(x);
    if !dt.is_float() {
        return Ok(None);
    }
    let plan = Col2ImPlan::new(c, &image, &block).map_err(|err| node_error(e, id, err))?;
    let [n, cb, _] = <[usize; 3]>::try_from(e.dims(x)?).map_err(|_| {
        crate::CompileError::Internal("Col2Im's input is 3-D (inference checks)".into())
    })?;
    let pixels: usize = plan.image.iter().product();
    let rows = plan.targets.len();
    if rows.checked_mul(pixels).is_none_or(|m| m > COL2IM_MATRIX_LIMIT) || plan.block == 0 {
        return Ok(None);
    }
    let cd = compute_type(dt);
    let mut m = vec![0.0; rows * pixels];
    for (r, t) in plan.targets.iter().enumerate() {
        if let Some(t) = t {
            m[r * pixels + t] = 1.0;
        }
    }
    let scatter = e.constant("scatter", Tensor::from_f64s(cd, &[rows, pixels], &m)?)?;
    let channels = cb / plan.block;
    let xc = e.cast("compute", x, cd)?;
    let cols = e.reshape("columns", xc, &[n, channels, rows])?;
    let y = e.matmul("image_flat", cols, scatter)?;
    let mut out = vec![n, channels];
    out.extend(&plan.image);
    let y = e.reshape("image", y, &out)?;
    Ok(Some(vec![e.cast("result", y, dt)?]))
}

/// The largest matrix Det expands (4! = 24 products of 4): past that the expansion grows
/// factorially and the node stays unsupported on compiled targets.
const DET_MAX_ORDER: usize = 4;

/// Det of `[..., M, M]` for M up to [`DET_MAX_ORDER`]: the Leibniz formula, `Σ_σ sign(σ)
/// Π_i a[i, σ(i)]`, as a Gather of each permutation's entries from the flattened matrices, a
/// product over them, and a signed sum.
pub(super) fn det(e: &mut Emit, id: NodeId) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let Some(x) = ops.first().copied().flatten() else { return Ok(None) };
    let dims = e.dims(x)?;
    let r = dims.len();
    let m = dims[r.saturating_sub(1)];
    if r < 2 || m == 0 || m > DET_MAX_ORDER {
        return Ok(None);
    }
    let dt = e.dtype(x);
    let cd = compute_type(dt);
    let batch: usize = dims[..r - 2].iter().product();
    let (perms, signs) = permutations(m);
    let index: Vec<i64> =
        perms.iter().flat_map(|p| p.iter().enumerate().map(|(i, &j)| (i * m + j) as i64)).collect();
    let xc = e.cast("compute", x, cd)?;
    let flat = e.reshape("flat", xc, &[batch, m * m])?;
    let index = e.constant("entries", Tensor::from_vec(&[perms.len(), m], index)?)?;
    let picked = e.gather("entries", flat, index, 1)?;
    let axis = e.ints(&[-1])?;
    let prod =
        Op::Reduce(Reduce { kind: ReduceKind::Prod, keepdims: false, noop_with_empty_axes: false });
    let terms = e.op2("terms", prod, &[picked, axis])?;
    let signs = e.constant("signs", Tensor::from_f64s(cd, &[perms.len()], &signs)?)?;
    let signed = e.mul("signed", terms, signs)?;
    let sum = e.reduce_sum("sum", signed, Some(&[-1]), false)?;
    let y = e.reshape("det", sum, &dims[..r - 2])?;
    Ok(Some(vec![e.cast("result", y, dt)?]))
}

/// Every permutation of `0..n` with its sign (Heap's algorithm: each step swaps two entries).
fn permutations(n: usize) -> (Vec<Vec<usize>>, Vec<f64>) {
    let mut p: Vec<usize> = (0..n).collect();
    let (mut perms, mut signs) = (vec![p.clone()], vec![1.0]);
    let mut c = vec![0; n];
    let mut sign = 1.0;
    let mut i = 1;
    while i < n {
        if c[i] < i {
            p.swap(if i % 2 == 0 { 0 } else { c[i] }, i);
            sign = -sign;
            perms.push(p.clone());
            signs.push(sign);
            c[i] += 1;
            i = 1;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
    (perms, signs)
}

/// The most pixels of AffineGrid's base grid (64 MiB of f32 rows of 4): past any real image.
const AFFINE_GRID_PIXEL_LIMIT: usize = 1 << 22;

/// AffineGrid once its size is a constant: the base grid `[P, r + 1]` (one homogeneous pixel
/// centre a row, `kiln_ir::eval::affine_grid_base`) times each `thetaᵀ` `[N, r + 1, r]` is
/// `[N, P, r]`, viewed as `[N, D1..Dr, r]`.
pub(super) fn affine_grid(
    e: &mut Emit,
    id: NodeId,
    align_corners: bool,
) -> Result<Option<Vec<ValueId>>> {
    let ops = e.g.operands(id);
    let Some(theta) = ops.first().copied().flatten() else { return Ok(None) };
    if constant_ints(e, ops.get(1).copied().flatten()).is_none() {
        return Ok(None);
    }
    let out = e.dims(ValueId::from(id))?;
    let dt = e.dtype(theta);
    let r = out.len().saturating_sub(2);
    let spatial = &out[1..out.len() - 1];
    let pixels: usize = spatial.iter().product();
    if pixels > AFFINE_GRID_PIXEL_LIMIT {
        return Ok(None);
    }
    let cd = compute_type(dt);
    let base = kiln_ir::eval::affine_grid_base(spatial, align_corners);
    let base = e.constant("base", Tensor::from_f64s(cd, &[pixels, r + 1], &base)?)?;
    let th = e.cast("compute", theta, cd)?;
    let tt = e.transpose("theta_t", th, &[0, 2, 1])?;
    let y = e.matmul("points", base, tt)?;
    let y = e.reshape("grid", y, &out)?;
    Ok(Some(vec![e.cast("result", y, dt)?]))
}

#[cfg(test)]
mod tests {
    use super::permutations;

    /// Every permutation once, each sign its parity's (counted by inversions).
    #[test]
    fn permutations_are_all_and_signed() {
        for n in 1..=4 {
            let (perms, signs) = permutations(n);
            assert_eq!(perms.len(), (1..=n).product::<usize>());
            let mut sorted = perms.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), perms.len());
            for (p, s) in perms.iter().zip(&signs) {
                let inversions = (0..n)
                    .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                    .filter(|&(i, j)| p[i] > p[j]);
                let parity = if inversions.count() % 2 == 0 { 1.0 } else { -1.0 };
                assert_eq!(*s, parity, "{p:?}");
            }
        }
    }
}
