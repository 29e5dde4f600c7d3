//! Decomposition: ops the code generator has no kernel for are rewritten into ops it has, once
//! every shape is static (the pass runs after specialisation).
//!
//! - `Rnn` (RNN, GRU, LSTM) is unrolled over its sequence: one Gemm per gate for the whole input
//!   sequence, then per step a Gemm per gate on the state and elementwise gate arithmetic
//!   (`rnn.rs`). A target that runs some layers whole keeps them (`decompose` with its test: the
//!   CPU's recurrent kernel).
//! - `Attention` becomes MatMul / Softmax / elementwise (`attention.rs`). On the CPU, what its
//!   attention kernel runs whole stays.
//! - `RotaryEmbedding` becomes Slice / Gather / elementwise / Concat (`attention.rs`).
//! - `CausalConvWithState` becomes Concat (the past before the input) / a depthwise Conv /
//!   Sigmoid and Mul for SiLU / Slice (the new state) (`stateful.rs`).
//! - `LinearAttention` is unrolled over its sequence: per step the decay (Mul by exp), the delta
//!   rule's correction (MatMul, Sub, Mul), the outer-product write (a broadcast Mul) and the
//!   query heads' read (MatMul of each KV head's group of query rows) (`stateful.rs`).
//! - `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` become Equal / Where / ReduceSum
//!   (and LogSoftmax) (`loss.rs`).
//! - `CenterCropPad` becomes Slice and Pad, `Col2Im` (floats) a MatMul by a constant scatter
//!   matrix, `Det` (matrices up to 4 x 4) its permutation expansion: Gather / ReduceProd /
//!   ReduceSum (`image.rs`), `AffineGrid` a MatMul of the constant base grid by the transposed
//!   matrices (`image.rs`).
//! - `DFT` and `STFT` become MatMuls by the constant matrix of the transform (cos and sin
//!   weights for the real and imaginary parts), STFT's frames a Gather by a constant index table
//!   times the window (`signal.rs`).
//! - `DeformConv` becomes its four bilinear taps per place gathered (GatherElements) where they
//!   lie inside the image and weighed, times the mask, then a grouped MatMul by the weights
//!   (`deform.rs`).
//! - `RoiAlign` (a fixed `sampling_ratio`) becomes its samples' places computed from the boxes,
//!   their four bilinear taps gathered (GatherElements) from each box's image and weighed, and
//!   a ReduceSum (mean) or ReduceMax over each bin's grid (`roi.rs`).
//! - `QuantizeLinear` and `DequantizeLinear` become elementwise arithmetic with the scale shaped
//!   to broadcast (`quantize.rs`): quantized models run, computing in f32, not yet on integer
//!   kernels.
//! - `MatMulNBits` becomes its weights unpacked (BitwiseAnd, BitShift), dequantized in f32 and a
//!   Gemm by their transpose (`quantize.rs`); the CPU runs what its kernel takes whole, the 4-bit
//!   weights unpacked in the kernel.
//!
//! Each rewrite computes what `kiln_ir::eval` computes for the op; nodes are named
//! `<node>/<part>` (`gru/step3/z`) so errors and `kiln emit --stage graph` point back to the op.
//! A node whose shapes are not all static is left alone (codegen then reports it unsupported).

mod attention;
mod deform;
mod image;
mod loss;
mod quantize;
mod rnn;
mod roi;
mod signal;
mod stateful;

use kiln_ir::op::{Gemm, OpFamily, Reduce, ReduceKind};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor, UnaryOp, ValueId};

use crate::{CompileError, Result};

/// Decomposes every op the code generator has no kernel for (the GPU targets).
pub fn run(graph: &mut Graph) -> Result<bool> {
    decompose(graph, |_, _| false)
}

/// Decomposes every op the code generator has no kernel for, but the nodes `keep` says the
/// target runs whole (a backend's own decomposition: `Rules::decompose`).
pub fn decompose(graph: &mut Graph, keep: fn(&Graph, NodeId) -> bool) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(node) = graph.try_node(id) else { continue };
        // The families codegen has no rules for that this pass rewrites (the match below).
        // And the ops of other families that are natural as existing ops, which codegen has no
        // rules for either.
        let decomposed =
            matches!(node.op.family(), OpFamily::Sequence | OpFamily::Loss | OpFamily::Quantize)
                || matches!(
                    node.op,
                    Op::CenterCropPad { .. }
                        | Op::Col2Im(_)
                        | Op::Det
                        | Op::AffineGrid { .. }
                        | Op::Dft { .. }
                        | Op::Stft { .. }
                        | Op::DeformConv(_)
                        | Op::RoiAlign { .. }
                );
        if !decomposed {
            continue;
        }
        if !is_static(graph, id) || keep(graph, id) {
            continue;
        }
        let node = node.clone();
        let mut e = Emit::new(graph, &node.name);
        let results = match &node.op {
            Op::Rnn(r) => rnn::decompose(&mut e, id, r),
            Op::Attention(a) => attention::attention(&mut e, id, a),
            Op::RotaryEmbedding(r) => attention::rotary(&mut e, id, r),
            Op::LinearAttention(a) => stateful::linear_attention(&mut e, id, a),
            Op::CausalConvWithState { activation } => {
                stateful::causal_conv(&mut e, id, *activation)
            }
            Op::NllLoss(l) => loss::decompose(&mut e, id, l, false),
            Op::SoftmaxCrossEntropyLoss(l) => loss::decompose(&mut e, id, l, true),
            Op::Quantize { axis, block_size, saturate, .. } => {
                quantize::quantize(&mut e, id, *axis, *block_size, *saturate)
            }
            Op::Dequantize { axis, block_size } => {
                quantize::dequantize(&mut e, id, *axis, *block_size)
            }
            Op::MatMulNBits { k, n, block_size, .. } => {
                quantize::nbits_product(&mut e, id, *k, *n, *block_size)
            }
            Op::CenterCropPad { axes } => image::center_crop_pad(&mut e, id, axes),
            Op::Col2Im(c) => image::col2im(&mut e, id, c),
            Op::Det => image::det(&mut e, id),
            Op::AffineGrid { align_corners } => image::affine_grid(&mut e, id, *align_corners),
            Op::Dft { inverse, onesided } => signal::dft(&mut e, id, *inverse, *onesided),
            Op::Stft { onesided } => signal::stft(&mut e, id, *onesided),
            Op::DeformConv(d) => deform::deform_conv(&mut e, id, d),
            op @ Op::RoiAlign { .. } => match roi::RoiAttrs::of(op) {
                Some(a) => roi::roi_align(&mut e, id, &a),
                None => continue,
            },
            _ => continue,
        };
        // A failure here is a bug in this pass, not in the model: say which node it was.
        let results = results.map_err(|err| {
            CompileError::Internal(format!(
                "decomposing `{}` ({}): {err}",
                node.name,
                node.op.name()
            ))
        })?;
        let Some(results) = results else { continue };
        for (i, v) in results.into_iter().enumerate().take(node.outputs.len()) {
            graph.replace_uses(ValueId::new(id, i), v)?;
        }
        changed = true;
    }
    // The decomposed nodes, and whatever a rewrite built but did not use, go.
    if changed {
        super::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// Every operand and result of the node has a static shape.
fn is_static(graph: &Graph, id: NodeId) -> bool {
    graph.node(id).outputs.iter().all(|t| t.shape.is_fixed())
        && graph.operands(id).into_iter().flatten().all(|v| graph.value_type(v).shape.is_fixed())
}

/// The type arithmetic is done in: f16 and bf16 are widened to f32 (the interpreter computes these
/// ops in f64; rounding every intermediate to half precision would drift from it).
fn compute_type(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// Adds nodes named `<prefix>/<what>` to a graph, with small constants shared.
struct Emit<'g> {
    g: &'g mut Graph,
    prefix: String,
    constants: Vec<(Tensor, ValueId)>,
}

impl<'g> Emit<'g> {
    fn new(g: &'g mut Graph, prefix: &str) -> Emit<'g> {
        Emit { g, prefix: prefix.to_string(), constants: Vec::new() }
    }

    fn name(&self, what: &str) -> String {
        self.g.unique_name(&format!("{}/{what}", self.prefix))
    }

    fn dims(&self, v: ValueId) -> Result<Vec<usize>> {
        let t = self.g.value_type(v);
        // Decomposition takes only nodes whose operands are static (`decomposable`).
        t.shape.as_fixed().ok_or_else(|| {
            CompileError::Internal(format!(
                "value %{} has the dynamic type {t}",
                self.g.value_name(v)
            ))
        })
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.value_type(v).dtype
    }

    fn op(&mut self, what: &str, op: Op, operands: &[Option<ValueId>]) -> Result<ValueId> {
        let name = self.name(what);
        Ok(self.g.add_node(&name, op, operands)?.into())
    }

    fn op2(&mut self, what: &str, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        let operands: Vec<Option<ValueId>> = operands.iter().copied().map(Some).collect();
        self.op(what, op, &operands)
    }

    /// A constant; small ones are made once per decomposed node.
    fn constant(&mut self, what: &str, t: Tensor) -> Result<ValueId> {
        let small = t.len() <= 64;
        if small {
            if let Some((_, v)) = self.constants.iter().find(|(c, _)| *c == t) {
                return Ok(*v);
            }
        }
        let name = self.name(what);
        let v = self.g.add_constant(&name, t.clone())?;
        if small {
            self.constants.push((t, v));
        }
        Ok(v)
    }

    fn scalar(&mut self, v: f64, d: DType) -> Result<ValueId> {
        self.constant("const", Tensor::from_f64s(d, &[], &[v])?)
    }

    fn full(&mut self, what: &str, d: DType, dims: &[usize], v: f64) -> Result<ValueId> {
        self.constant(what, Tensor::full(d, dims, v))
    }

    fn ints(&mut self, v: &[i64]) -> Result<ValueId> {
        self.constant("const", Tensor::vector(v))
    }

    fn unary(&mut self, what: &str, u: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op2(what, Op::Unary(u), &[x])
    }

    fn binary(&mut self, what: &str, b: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op2(what, Op::Binary(b), &[x, y])
    }

    fn add(&mut self, what: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(what, BinaryOp::Add, x, y)
    }

    fn sub(&mut self, what: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(what, BinaryOp::Sub, x, y)
    }

    fn mul(&mut self, what: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(what, BinaryOp::Mul, x, y)
    }

    fn select(&mut self, what: &str, cond: ValueId, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op2(what, Op::Where, &[cond, x, y])
    }

    /// `x` converted to `to` (itself when it already is).
    fn cast(&mut self, what: &str, x: ValueId, to: DType) -> Result<ValueId> {
        if self.dtype(x) == to {
            return Ok(x);
        }
        self.op2(what, Op::Cast { to, saturate: true }, &[x])
    }

    fn matmul(&mut self, what: &str, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op2(what, Op::MatMul, &[a, b])
    }

    /// `a bᵀ + c`.
    fn gemm_bt(
        &mut self,
        what: &str,
        a: ValueId,
        b: ValueId,
        c: Option<ValueId>,
    ) -> Result<ValueId> {
        self.op(what, Op::Gemm(Gemm { trans_b: true, ..Gemm::default() }), &[Some(a), Some(b), c])
    }

    /// `x` viewed with `dims` (itself when it already has them).
    fn reshape(&mut self, what: &str, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        if self.dims(x)? == dims {
            return Ok(x);
        }
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let s = self.ints(&shape)?;
        self.op2(what, Op::Reshape { allowzero: true }, &[x, s])
    }

    fn transpose(&mut self, what: &str, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        self.op2(what, Op::Transpose { perm: perm.to_vec() }, &[x])
    }

    /// `x[start..end:step]` along `axis` (itself when that is everything).
    fn slice(
        &mut self,
        what: &str,
        x: ValueId,
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<ValueId> {
        if start == 0 && step == 1 && self.dims(x)?.get(axis) == Some(&end) {
            return Ok(x);
        }
        let (s, en, a, st) = (
            self.ints(&[start as i64])?,
            self.ints(&[end as i64])?,
            self.ints(&[axis as i64])?,
            self.ints(&[step as i64])?,
        );
        self.op2(what, Op::Slice, &[x, s, en, a, st])
    }

    fn concat(&mut self, what: &str, xs: &[ValueId], axis: usize) -> Result<ValueId> {
        if let [x] = xs {
            return Ok(*x);
        }
        self.op2(what, Op::Concat { axis: axis as i64 }, xs)
    }

    /// `x` split into `n` equal parts along `axis`.
    fn split(&mut self, what: &str, x: ValueId, axis: usize, n: usize) -> Result<Vec<ValueId>> {
        if n == 1 {
            return Ok(vec![x]);
        }
        let name = self.name(what);
        let id = self.g.add_node_with_outputs(
            &name,
            Op::Split { axis: axis as i64, num_outputs: n },
            &[Some(x)],
            n,
        )?;
        Ok((0..n).map(|i| ValueId::new(id, i)).collect())
    }

    fn gather(&mut self, what: &str, x: ValueId, indices: ValueId, axis: usize) -> Result<ValueId> {
        self.op2(what, Op::Gather { axis: axis as i64 }, &[x, indices])
    }

    /// Entry `i` of the leading axis of `x` (a direction of an RNN weight, say), that axis dropped.
    fn pick(&mut self, what: &str, x: ValueId, i: usize) -> Result<ValueId> {
        let d = self.dims(x)?;
        if d.first() == Some(&1) {
            return self.reshape(what, x, &d[1..]);
        }
        let idx = self.constant("const", Tensor::scalar(i as i64))?;
        self.gather(what, x, idx, 0)
    }

    /// A sum over `axes` (every axis when `None`).
    fn reduce_sum(
        &mut self,
        what: &str,
        x: ValueId,
        axes: Option<&[i64]>,
        keepdims: bool,
    ) -> Result<ValueId> {
        let op =
            Op::Reduce(Reduce { kind: ReduceKind::Sum, keepdims, noop_with_empty_axes: false });
        match axes {
            Some(a) => {
                let a = self.ints(a)?;
                self.op2(what, op, &[x, a])
            }
            None => self.op2(what, op, &[x]),
        }
    }
}
