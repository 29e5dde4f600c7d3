//! Gradients of convolution and pooling. A convolution's input gradient is a ConvTranspose of the
//! result gradient with the same weight; its weight gradient is a Conv over the batch (input and
//! result gradient with batch and channels swapped, stride and dilation exchanged), one per group.
//! MaxPool routes the gradient through its argmax indices with a ScatterElements that adds;
//! AveragePool spreads it back with a depthwise ConvTranspose of ones, divided by each window's
//! count.

use super::{expand_like, fixed_dims, reshape_like, ty, zeros_like, Grads, RuleError, Step};
use crate::builder::Traced;
use crate::op::{
    AutoPad, Conv, ConvTranspose, Pool, PoolKind, ScatterReduction, SpatialAxis, Window,
};
use crate::{BinaryOp, Dim, Op, Tensor, UnaryOp};

pub(super) fn grad<'g>(s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    match s.op {
        Op::Conv(c) => conv(c, s),
        Op::Pool(p) => match p.kind {
            PoolKind::Max => max_pool(p, s),
            PoolKind::Average { count_include_pad } => average_pool(p, count_include_pad, s),
            PoolKind::Lp { .. } => Err(RuleError::NoRule),
        },
        Op::GlobalPool(PoolKind::Average { .. }) => {
            let (x, dy) = (s.input(0)?, s.dy()?);
            let spatial = spatial_dims(x)?;
            let count: usize = spatial.iter().product();
            Ok(vec![Some(expand_like(dy.div(dy.scalar(count as f64)), x)?)])
        }
        Op::GlobalPool(PoolKind::Max) => {
            // Shared equally among the elements equal to the maximum, as ReduceMax's.
            let (x, y, dy) = (s.input(0)?, s.outputs[0], s.dy()?);
            let axes: Vec<i64> = (2..2 + spatial_dims(x)?.len() as i64).collect();
            let at = x.binary(BinaryOp::Equal, y).cast(ty(x)?.dtype);
            Ok(vec![Some(dy.mul(at).div(at.reduce_sum(&axes, true)))])
        }
        Op::GlobalPool(PoolKind::Lp { p }) => {
            // y = (Σ|x|^p)^(1/p): dx = dy·sign(x)·|x|^(p-1) / y^(p-1), 0 where y is 0.
            let (x, y, dy) = (s.input(0)?, s.outputs[0], s.dy()?);
            let e = x.scalar(f64::from(*p) - 1.0);
            let num = x.unary(UnaryOp::Sign).mul(x.unary(UnaryOp::Abs).pow(e));
            let zero = y.binary(BinaryOp::Equal, y.scalar(0.0));
            let dx = dy.mul(num).div(y.pow(e));
            Ok(vec![Some(expand_like(zero, x)?.select(x.scalar(0.0), dx))])
        }
        _ => Err(RuleError::NoRule),
    }
}

/// The sizes of `x`'s spatial axes (from axis 2 on), which the window rules need fixed.
fn spatial_dims(x: Traced<'_>) -> Result<Vec<usize>, RuleError> {
    let t = ty(x)?;
    let dims: Option<Vec<usize>> = t.shape.dims().iter().skip(2).map(Dim::fixed).collect();
    dims.ok_or_else(|| RuleError::NeedsFixedShape { what: "the spatial axes", ty: Box::new(t) })
}

/// The channel count of `x` [N, C, ...], which the rules need fixed.
fn channels(x: Traced<'_>) -> Result<usize, RuleError> {
    let t = ty(x)?;
    t.shape
        .dims()
        .get(1)
        .and_then(Dim::fixed)
        .ok_or_else(|| RuleError::NeedsFixedShape { what: "the channel axis", ty: Box::new(t) })
}

/// The window resolved against the input's spatial sizes (auto_pad made explicit).
fn resolve(
    window: &Window,
    input: &[usize],
    kernel: &[usize],
    ceil_mode: bool,
) -> Result<Vec<SpatialAxis>, RuleError> {
    (0..input.len())
        .map(|i| window.resolve(i, input[i], kernel[i], ceil_mode))
        .collect::<Result<_, _>>()
        .map_err(RuleError::Forward)
}

/// The ConvTranspose that spreads a window op's result gradient back over its input: same
/// strides and dilations, and the padding and output padding that make its result exactly the
/// input's size (ceil_mode's last window may reach past the padded input: more is cut then).
fn transpose_of(axes: &[SpatialAxis], group: usize) -> ConvTranspose {
    let mut begins = Vec::with_capacity(axes.len());
    let mut ends = Vec::with_capacity(axes.len());
    let mut output_padding = Vec::with_capacity(axes.len());
    for a in axes {
        let full = a.stride * (a.output - 1) + a.dilation * (a.kernel - 1) + 1;
        begins.push(a.pad_begin);
        ends.push((full - a.pad_begin).saturating_sub(a.input));
        output_padding.push((a.input + a.pad_begin).saturating_sub(full));
    }
    begins.extend(ends);
    ConvTranspose {
        window: Window {
            strides: axes.iter().map(|a| a.stride).collect(),
            dilations: axes.iter().map(|a| a.dilation).collect(),
            pads: begins,
            auto_pad: AutoPad::NotSet,
        },
        group,
        output_padding,
        output_shape: Vec::new(),
    }
}

fn conv<'g>(c: &Conv, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (x, w, dy) = (s.input(0)?, s.input(1)?, s.dy()?);
    let g = s.g;
    let input = spatial_dims(x)?;
    let wdims = fixed_dims(w, "the weight")?;
    let kernel = &wdims[2..];
    let axes = resolve(&c.window, &input, kernel, false)?;
    let spatial = axes.len();

    let dx = s.needs(0).then(|| {
        g.apply(Op::ConvTranspose(transpose_of(&axes, c.group)), &[Some(dy), Some(w)], 1)[0]
    });

    let dw = if s.needs(1) {
        // dW[m, c, k] = Σ_n,o dY[n, m, o] X[n, c, o·stride + k·dilation - pad]: a Conv of X with
        // batch and channels swapped ([C, N, ...]) by dY likewise ([M, N, ...]) as the weight,
        // the stride and dilation exchanged. Its result can be longer than the kernel where the
        // end padding was not all read; the extra positions are cut.
        let (m, cin) = (wdims[0], channels(x)?);
        let (mg, cg) = (m / c.group, cin / c.group);
        let swap: Vec<usize> = [1, 0].into_iter().chain(2..spatial + 2).collect();
        let window = Window {
            strides: axes.iter().map(|a| a.dilation).collect(),
            dilations: axes.iter().map(|a| a.stride).collect(),
            pads: axes.iter().map(|a| a.pad_begin).chain(axes.iter().map(|a| a.pad_end)).collect(),
            auto_pad: AutoPad::NotSet,
        };
        let spatial_axes: Vec<i64> = (2..spatial as i64 + 2).collect();
        let kernel_ends: Vec<i64> = kernel.iter().map(|&k| k as i64).collect();
        let mut parts = Vec::with_capacity(c.group);
        for gi in 0..c.group {
            let channel_range = |t: Traced<'g>, per: usize| {
                if c.group == 1 {
                    t
                } else {
                    let (lo, hi) = ((gi * per) as i64, ((gi + 1) * per) as i64);
                    t.slice(&[lo], &[hi], &[1], &[1])
                }
            };
            let xg = channel_range(x, cg).transpose(&swap);
            let dyg = channel_range(dy, mg).transpose(&swap);
            let op = Op::Conv(Conv { window: window.clone(), group: 1 });
            let full = g.apply(op, &[Some(xg), Some(dyg)], 1)[0];
            let starts = vec![0; spatial];
            let steps = vec![1; spatial];
            let cut = full.slice(&starts, &kernel_ends, &spatial_axes, &steps);
            parts.push(cut.transpose(&swap));
        }
        Some(if parts.len() == 1 { parts[0] } else { g.concat(&parts, 0) })
    } else {
        None
    };

    let db = s.needs(2).then(|| {
        let axes: Vec<i64> = [0].into_iter().chain(2..spatial as i64 + 2).collect();
        dy.reduce_sum(&axes, false)
    });
    Ok(vec![dx, dw, db])
}

/// The gradient goes to the element each window took its maximum from: MaxPool is run again for
/// its indices (flat offsets into X, row-major) and the gradient is scattered there, adding where
/// windows overlap on one maximum.
fn max_pool<'g>(p: &Pool, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (x, dy) = (s.input(0)?, s.dy()?);
    let g = s.g;
    let row_major = Pool { column_major_indices: false, ..p.clone() };
    let indices = g.apply(Op::Pool(row_major), &[Some(x)], 2)[1];
    let flat = |t: Traced<'g>| t.reshape(&[-1]);
    let zeros = flat(zeros_like(x)?);
    let scatter = Op::ScatterElements { axis: 0, reduction: ScatterReduction::Add };
    let dx = g.apply(scatter, &[Some(zeros), Some(flat(indices)), Some(flat(dy))], 1)[0];
    Ok(vec![Some(reshape_like(dx, x)?)])
}

/// Each window's gradient, divided by the count the forward divided by, spread back over the
/// window by a depthwise ConvTranspose with a kernel of ones.
fn average_pool<'g>(p: &Pool, include_pad: bool, s: &Step<'_, 'g>) -> Result<Grads<'g>, RuleError> {
    let (x, dy) = (s.input(0)?, s.dy()?);
    let g = s.g;
    let input = spatial_dims(x)?;
    let c = channels(x)?;
    let axes = resolve(&p.window, &input, &p.kernel, p.ceil_mode)?;
    // The count is a product over the axes of each axis's count of window cells that lie in the
    // input (or in the padded input, with count_include_pad; never beyond it, where ceil_mode
    // reaches), as the interpreter counts them.
    let per_axis: Vec<Vec<f64>> = axes
        .iter()
        .map(|a| {
            (0..a.output)
                .map(|o| {
                    let (lo, hi) = if include_pad {
                        (0, (a.input + a.pad_begin + a.pad_end) as i64)
                    } else {
                        (a.pad_begin as i64, (a.input + a.pad_begin) as i64)
                    };
                    let inside = (0..a.kernel)
                        .filter(|k| (lo..hi).contains(&((o * a.stride + k * a.dilation) as i64)))
                        .count();
                    inside.max(1) as f64
                })
                .collect()
        })
        .collect();
    let out_dims: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let mut counts = vec![1.0; out_dims.iter().product()];
    for (i, count) in counts.iter_mut().enumerate() {
        let mut rest = i;
        for (axis, sizes) in per_axis.iter().enumerate().rev() {
            *count *= sizes[rest % out_dims[axis]];
            rest /= out_dims[axis];
        }
    }
    let dtype = ty(x)?.dtype;
    let tensor =
        |dims: &[usize], v: &[f64]| Tensor::from_f64s(dtype, dims, v).map_err(RuleError::Build);
    let divisor = g.anon_constant(tensor(&out_dims, &counts)?);
    let kernel_dims: Vec<usize> = [c, 1].into_iter().chain(p.kernel.iter().copied()).collect();
    let ones = g.anon_constant(Tensor::full(dtype, &kernel_dims, 1.0));
    let spread = Op::ConvTranspose(transpose_of(&axes, c));
    Ok(vec![Some(g.apply(spread, &[Some(dy.div(divisor)), Some(ones)], 1)[0])])
}
