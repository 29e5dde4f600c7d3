//! The CPU's 4-bit weight-only matrix product (`Shape::NBitsGemm`, `quantized.c`'s
//! `kiln_uk_nbgemm`): a `MatMulNBits` node (onnxruntime's com.microsoft op, imported as it is)
//! planned, described, its weights repacked at compile time (still 4 bits a weight), and its
//! call.
//!
//! LLM decoding multiplies one or a few rows by large weights: the time is the weights' traffic,
//! so they stay 4-bit in memory and are unpacked in the kernel's loop, 32 at a time per column
//! (one 16-byte load widened, a mask and a shift), made f32 by `fma(q, scale, -zero * scale)` once
//! per tile of up to 4 rows. The packer reorders each column's 32-weight group so that a byte
//! holds weights j and j + 16 (onnxruntime's holds 2j and 2j + 1): the two halves then line up
//! with 16 consecutive floats of x. The bias operand is added as the results are stored.

use std::fmt;

use kiln_ir::{DType, Graph, NodeId, Op, ValueId};
use melior::ir::Value;

use super::{
    operand_bias, other_shape, Activation, Blocked, Call, Epilogue, Host, KernelShape, Pointers,
    Shape, Ukernel, MIN_MACS,
};
use crate::fuse::Kernel;
use crate::{CompileError, Result};

pub(super) struct NBitsGemm;

/// The columns one strip holds (`NB_COLS` in `quantized.c`).
const COLS: usize = 4;

/// The operands the kernel reads at compile time: packed weights, scales, zero points (if any)
/// and bias (if any), each a constant.
struct Operands {
    b: ValueId,
    scales: ValueId,
    zeros: Option<ValueId>,
    bias: Option<ValueId>,
}

fn operands(graph: &Graph, id: NodeId) -> Option<Operands> {
    let ops = graph.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let constant = |v: Option<ValueId>| v.filter(|&v| graph.constant_value(v).is_some());
    let (b, scales) = (constant(operand(1))?, constant(operand(2))?);
    let zeros = match operand(3) {
        None => None,
        z => Some(constant(z)?),
    };
    let bias = match operand(4) {
        None => None,
        b => Some(constant(b)?),
    };
    Some(Operands { b, scales, zeros, bias })
}

/// The product's sizes, when the kernel can run this MatMulNBits node: 4 bits, f32 rows of a
/// static shape (not inlined into the kernel), the weights, scales, zero points and bias
/// constants.
fn shape(graph: &Graph, id: NodeId) -> Option<Shape> {
    let Op::MatMulNBits { k, n, bits: 4, block_size } = graph.node(id).op else { return None };
    let x = graph.operands(id).first().copied().flatten()?;
    if crate::fuse::is_inline_constant(graph, x) || graph.value_type(x).dtype != DType::F32 {
        return None;
    }
    let xd = graph.value_type(x).shape.as_fixed()?;
    let (&xk, rows_dims) = xd.split_last()?;
    let rows: usize = rows_dims.iter().product();
    operands(graph, id)?;
    if xk != k || rows == 0 || block_size < 16 {
        return None;
    }
    Some(Shape::NBitsGemm { rows, k, n, block_size })
}

/// Whether the kernel runs this MatMulNBits node (kept whole from decomposition where it does).
pub(super) fn runs(graph: &Graph, id: NodeId) -> bool {
    shape(graph, id).is_some()
}

/// The plan for a kernel whose root is a MatMulNBits (alone: fusion leaves it closed).
pub(super) fn plan(graph: &Graph, kernel: &Kernel, root: NodeId, host: &Host) -> Option<Ukernel> {
    let shape = shape(graph, root)?;
    let Shape::NBitsGemm { rows, k, n, .. } = shape else { return None };
    let x = graph.operands(root).first().copied().flatten()?;
    let ops = operands(graph, root)?;
    if !kernel.inputs.contains(&x) || kernel.nodes.len() != 1 {
        return None;
    }
    let bias = operand_bias(graph, ops.bias, n)?;
    // Work units are ranges of 4-column strips.
    let chunks = host.units(rows * n * k, MIN_MACS).min(n.div_ceil(COLS));
    Some(Ukernel {
        shape,
        input: x,
        weight: ops.b,
        epilogue: Epilogue {
            bias,
            residual: None,
            residual_last: false,
            activation: Activation::None,
        },
        mr: 4,
        kc: 0,
        mc: 0,
        nc: 0,
        chunks,
        split_n: true,
        row_bands: 1,
        transposed: false,
        blocked: Blocked::default(),
        bf16: false,
        amx: false,
        channel_vectors: 0,
    })
}

impl KernelShape for NBitsGemm {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::NBitsGemm { rows, k, n, block_size } = u.shape else { return Err(fmt::Error) };
        writeln!(
            f,
            "microkernel: 4-bit weight-only matrix product, {rows} row(s) of K={k} by N={n}, blocks of {block_size}"
        )?;
        writeln!(f, "weights stay 4-bit, repacked at compile time in strips of {COLS} columns (a byte holds k and k + 16 of its 32-weight group), per strip its blocks' scales and offsets (-zero point * scale)")?;
        writeln!(f, "in the loop: 16 bytes a column widened, masked and shifted into 32 weights, fma(q, scale, offset) in f32 once per tile; register tile: 4 rows x {COLS} columns of 16 lanes")?;
        let bias = if u.epilogue.bias.is_some() { "bias" } else { "none" };
        writeln!(f, "epilogue: {bias}")?;
        writeln!(f, "workgroups: {} ({COLS}-column strip chunks)", u.workgroups())
    }

    fn pack(&self, graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        pack(graph, kernel, u)
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::NBitsGemm { rows, k, n, block_size } = u.shape else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, p.wp, p.y];
        let bias = u.epilogue.bias.is_some();
        args.extend(call.ints(&[k, n, rows, block_size, bias as usize, u.chunks]));
        Ok(("kiln_uk_nbgemm", args))
    }
}

/// The packed constant `kiln_uk_nbgemm` reads: per strip of 4 columns (the last padded with zero
/// columns) its weights as `[K32 / 32][4][16]` bytes (K32: K rounded up to 32; weight k of a
/// column's group g in byte k % 16 of it, low 4 bits for k % 32 < 16, else high; weights past K
/// 0), then per strip `[blocks][4]` f32 scales and `[blocks][4]` f32 offsets (-zero * scale;
/// blocks counted over K32, those past the weights' 0); then the bias, 4 floats a strip.
fn pack(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
    let Shape::NBitsGemm { k, n, block_size, .. } = u.shape else { return Err(other_shape(u)) };
    // `family` hands this module its own plans, made only for a MatMulNBits whose operands are
    // constants (`plan`): anything else is a bug.
    let root =
        *kernel.nodes.first().ok_or_else(|| CompileError::Internal("an empty kernel".into()))?;
    let ops = operands(graph, root).ok_or_else(|| {
        CompileError::Internal("an operand of the 4-bit product is not a constant".into())
    })?;
    let constant = |v: ValueId| {
        graph.constant_value(v).map(|t| t.to_f64s()).ok_or_else(|| {
            CompileError::Internal("an operand of the 4-bit product is not a constant".into())
        })
    };
    let packed: Vec<u8> = constant(ops.b)?.into_iter().map(|v| v as u8).collect();
    let scales = constant(ops.scales)?;
    let zeros = ops.zeros.map(constant).transpose()?;
    let blocks = k.div_ceil(block_size);
    let blob = block_size / 2;
    if packed.len() != n * blocks * blob || scales.len() != n * blocks {
        return Err(CompileError::Internal(format!(
            "the 4-bit product's weights ({} bytes) and scales ({}) do not fit {n} x {blocks} blocks of {block_size}",
            packed.len(),
            scales.len()
        )));
    }
    // Weight (column, k), 0 past K.
    let q = |col: usize, kk: usize| -> u8 {
        if col >= n || kk >= k {
            return 0;
        }
        let byte = packed[(col * blocks + kk / block_size) * blob + (kk % block_size) / 2];
        if kk.is_multiple_of(2) {
            byte & 15
        } else {
            byte >> 4
        }
    };
    let groups = k.div_ceil(32);
    let kblocks = (32 * groups).div_ceil(block_size);
    let strips = n.div_ceil(COLS);
    let mut out = Vec::with_capacity(strips * (groups * 16 * COLS + 8 * kblocks * COLS));
    for s in 0..strips {
        for g in 0..groups {
            for c in 0..COLS {
                let col = s * COLS + c;
                for j in 0..16 {
                    out.push(q(col, 32 * g + j) | (q(col, 32 * g + 16 + j) << 4));
                }
            }
        }
    }
    // (scale, offset) of a column's block; 0 for padding.
    let param = |col: usize, blk: usize| -> (f32, f32) {
        if col >= n || blk >= blocks {
            return (0.0, 0.0);
        }
        let s = scales[col * blocks + blk] as f32;
        let z = zeros.as_ref().map_or(8.0, |z| z[col * blocks + blk] as f32);
        (s, -z * s)
    };
    for s in 0..strips {
        for which in 0..2 {
            for blk in 0..kblocks {
                for c in 0..COLS {
                    let (scale, offset) = param(s * COLS + c, blk);
                    let v = if which == 0 { scale } else { offset };
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }
    if let Some(b) = &u.epilogue.bias {
        for col in 0..strips * COLS {
            out.extend(b.get(col).copied().unwrap_or(0.0).to_le_bytes());
        }
    }
    Ok(out)
}
