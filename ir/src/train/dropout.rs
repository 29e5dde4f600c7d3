//! Dropout in training mode with a deterministic, counter-based mask: element i of the input is
//! kept when a hash of (i, seed) maps to a uniform number at or above the ratio. The hash is
//! integer elementwise ops (xor, shifts, wrapping u32 multiplications), so the interpreter and
//! compiled code on any target make the same mask, the same for the same seed, with no random
//! state and no op of its own; and the gradient comes from the existing rules (a Where: the
//! gradient where kept, scaled, zero where dropped).
//!
//! The mask is not numpy's: ONNX's node tests with a ratio above 0 draw theirs from numpy's
//! generator, which no other implementation reproduces either. A training step that wants a new
//! mask each step passes a new seed each step (the step count, say).

use crate::builder::Traced;
use crate::op::{Reduce, ReduceKind};
use crate::{BinaryOp, DType, Op, Tensor};

/// The results of [`dropout`].
#[derive(Clone, Copy)]
pub struct Dropout<'g> {
    /// `x / (1 - ratio)` where kept, 0 where dropped.
    pub y: Traced<'g>,
    /// Which elements are kept (bool, `x`'s shape).
    pub mask: Traced<'g>,
}

/// Drops each element of `x` with probability `ratio` (a float scalar) and scales the rest by
/// 1 / (1 - ratio); `seed` is a u32 scalar.
pub fn dropout<'g>(x: Traced<'g>, ratio: Traced<'g>, seed: Traced<'g>) -> Dropout<'g> {
    let g = x.builder();
    let (shift_right, xor) = (BinaryOp::BitShift { left: false }, BinaryOp::BitwiseXor);
    let u32c = |v: u32| g.anon_constant(Tensor::scalar(v));
    // Chris Wellons' lowbias32: a bijection of u32 whose outputs pass as independent uniforms.
    let hash = |h: Traced<'g>| {
        let h = h.binary(xor, h.binary(shift_right, u32c(16)));
        let h = h.mul(u32c(0x7feb_352d));
        let h = h.binary(xor, h.binary(shift_right, u32c(15)));
        let h = h.mul(u32c(0x846c_a68b));
        h.binary(xor, h.binary(shift_right, u32c(16)))
    };
    let counter = element_numbers(x).cast(DType::U32);
    let bits = hash(counter.binary(xor, hash(seed.cast(DType::U32))));
    // The top 24 bits as a float in [0, 1), exact in f32.
    let uniform = bits
        .binary(shift_right, u32c(8))
        .cast(DType::F32)
        .mul(g.anon_constant(Tensor::scalar(2f32.powi(-24))));
    let keep = uniform.binary(BinaryOp::GreaterOrEqual, ratio.cast(DType::F32));
    let dtype = x.ty().map_or(DType::F32, |t| t.dtype);
    let ratio = ratio.cast(dtype);
    let scale = ratio.scalar(1.0).div(ratio.scalar(1.0).sub(ratio));
    let y = keep.select(x.mul(scale), x.scalar(0.0));
    Dropout { y, mask: keep }
}

/// The row-major number of each element of `x`, as i64 in `x`'s shape: from constants where the
/// shape is fixed (so the mask's type is too), from `x`'s run-time shape otherwise.
fn element_numbers(x: Traced<'_>) -> Traced<'_> {
    let g = x.builder();
    let i64c = |v: i64| g.anon_constant(Tensor::scalar(v));
    match x.ty().and_then(|t| t.shape.as_fixed()) {
        Some(dims) => {
            let n = dims.iter().product::<usize>() as i64;
            let iota = g.apply(Op::Range, &[Some(i64c(0)), Some(i64c(n)), Some(i64c(1))], 1)[0];
            iota.reshape(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
        }
        None => {
            let shape = g.apply(Op::Shape { start: 0, end: None }, &[Some(x)], 1)[0];
            let prod =
                Reduce { kind: ReduceKind::Prod, keepdims: false, noop_with_empty_axes: false };
            let n = g.apply(Op::Reduce(prod), &[Some(shape)], 1)[0];
            let iota = g.apply(Op::Range, &[Some(i64c(0)), Some(n), Some(i64c(1))], 1)[0];
            g.apply(Op::Reshape { allowzero: false }, &[Some(iota), Some(shape)], 1)[0]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dropout;
    use crate::builder::GraphBuilder;
    use crate::{eval, DType, Dim, Shape, Tensor};

    /// Runs dropout of `x` (f32, shape `dims`, or a symbolic first axis) at `ratio` and `seed`.
    fn run(dims: &[usize], symbolic: bool, ratio: f32, seed: u32) -> (Vec<f64>, Vec<f64>) {
        let g = GraphBuilder::new("dropout");
        let mut shape: Vec<Dim> = dims.iter().map(|&d| Dim::Fixed(d)).collect();
        if symbolic {
            shape[0] = Dim::sym("batch");
        }
        let x = g.input("x", DType::F32, Shape(shape));
        let r = g.constant("ratio", Tensor::scalar(ratio));
        let s = g.constant("seed", Tensor::scalar(seed));
        let d = dropout(x, r, s);
        g.output("y", d.y);
        g.output("mask", d.mask);
        let graph = g.build().expect("dropout builds");
        let n: usize = dims.iter().product();
        let input = Tensor::from_f64s(DType::F32, dims, &vec![2.0; n]).expect("length");
        let out = eval::run(&graph, &[input]).expect("dropout runs");
        (out[0].to_f64s(), out[1].to_f64s())
    }

    #[test]
    fn keeps_about_one_minus_ratio_scaled_and_is_deterministic() {
        let (y, mask) = run(&[100, 200], false, 0.3, 7);
        let kept = mask.iter().filter(|&&m| m != 0.0).count() as f64 / mask.len() as f64;
        assert!((kept - 0.7).abs() < 0.01, "kept {kept}");
        for (v, m) in y.iter().zip(&mask) {
            let want = if *m != 0.0 { 2.0 / 0.7 } else { 0.0 };
            assert!((v - want).abs() < 1e-5, "{v} where the mask is {m}");
        }
        assert_eq!(run(&[100, 200], false, 0.3, 7).1, mask, "the same seed, the same mask");
        let other = run(&[100, 200], false, 0.3, 8).1;
        let same = other.iter().zip(&mask).filter(|(a, b)| a == b).count() as f64;
        // Two independent masks at 0.3 agree on 0.7² + 0.3² = 58% of elements.
        assert!((same / mask.len() as f64 - 0.58).abs() < 0.02, "another seed: {same} agree");
    }

    #[test]
    fn ratio_zero_keeps_everything_and_a_symbolic_batch_gets_the_fixed_mask() {
        let (y, mask) = run(&[3, 4], false, 0.0, 1);
        assert!(mask.iter().all(|&m| m != 0.0) && y.iter().all(|&v| v == 2.0));
        assert_eq!(run(&[6, 5], true, 0.5, 3), run(&[6, 5], false, 0.5, 3));
    }
}
