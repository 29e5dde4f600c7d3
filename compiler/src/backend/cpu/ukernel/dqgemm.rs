//! The CPU's dynamically quantized matrix product (`Shape::DynQGemm`, `quantized.c`'s
//! `kiln_uk_dqgemm`): a `DynQMatMul` node (made by the `dynamic` pass from onnxruntime's
//! DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul) planned, described, its weights packed
//! at compile time, and its call.
//!
//! Each work unit first finds the activation's scale and zero point itself, from the min and max
//! of the whole f32 input (one vectorised pass: the input is a few hundred KiB at most where the
//! product is worth an integer kernel, and units that share nothing need no second launch nor a
//! barrier). It then quantizes blocks of its rows into u8 on its stack (round half to even, as
//! DynamicQuantizeLinear) and multiplies them by the s8 weights as `kiln_uk_qgemm` does (4 rows x
//! 64 columns a tile, `vpdpbusd` where the CPU has VNNI; 16 rows x 64 columns on AMX tiles,
//! `tdpbusd`, where it has AMX-INT8 and there are 16 rows or more). The epilogue is the Cast and the Mul:
//! `(acc - zero * Σ w) as f32 * (scale * w_scale)`, exact in int32 up to the conversion, then a
//! fused column bias (the Add onnxruntime's quantizer leaves after the Mul).

use std::fmt;

use kiln_ir::{DType, Graph, NodeId, Op, ValueId};
use melior::ir::Value;

use super::{
    column_bias, other_shape, Activation, Blocked, Call, Epilogue, Host, KernelShape, Pointers,
    Shape, Ukernel, MIN_MACS,
};
use crate::fuse::Kernel;
use crate::{CompileError, Result};

pub(super) struct DynQGemm;

/// The output columns one strip of packed weights holds (`QG_STRIP` in `quantized.c`).
const STRIP: usize = 64;

/// The largest K: the kernel quantizes at least 4 rows at a time into a 32 KiB buffer on its
/// stack (and 255 * 128 * K stays far inside int32).
const MAX_K: usize = 8192;

/// The product's sizes, when the kernel can run this DynQMatMul node: f32 rows of a static shape,
/// constant weights `[K, M]` in a buffer (not inlined into the kernel), s8 or int32 whose
/// columns each span at most 255 within [-255, 255] (`column_offsets`), a constant f32 scale of
/// one value or one per column.
fn shape(graph: &Graph, id: NodeId, vnni: bool) -> Option<Shape> {
    if !matches!(graph.node(id).op, Op::DynQMatMul) {
        return None;
    }
    let ops = graph.operands(id);
    let operand = |i: usize| ops.get(i).copied().flatten();
    let (x, w, scale) = (operand(0)?, operand(1)?, operand(2)?);
    if crate::fuse::is_inline_constant(graph, x) || crate::fuse::is_inline_constant(graph, w) {
        return None;
    }
    let xd = graph.value_type(x).shape.as_fixed()?;
    let wt = graph.constant_value(w)?;
    let (&k, rows_dims) = xd.split_last()?;
    let rows: usize = rows_dims.iter().product();
    let [wk, m] = *wt.dims() else { return None };
    if graph.value_type(x).dtype != DType::F32
        || !matches!(wt.dtype(), DType::I8 | DType::I32)
        || wk != k
    {
        return None;
    }
    column_offsets(&wt.to_f64s(), k, m)?;
    // Nothing to multiply: the float path makes the zeros (or the empty result) as well.
    if rows == 0 || k == 0 || m == 0 || k > MAX_K {
        return None;
    }
    let scales = graph.constant_value(scale)?;
    if scales.dtype() != DType::F32 || !(scales.len() == 1 || scales.len() == m) {
        return None;
    }
    Some(Shape::DynQGemm { rows, k, m, vnni })
}

/// Per column, the offset c that brings its weights into s8 (`w - c`; 0 where they are s8
/// already): `None` where a column's values span more than 255 or pass [-255, 255] (u8 weights
/// less their zero point span at most 255, in [-255, 255]).
fn column_offsets(weights: &[f64], k: usize, m: usize) -> Option<Vec<i32>> {
    (0..m)
        .map(|col| {
            let (lo, hi) = (0..k)
                .map(|kk| weights[kk * m + col])
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
            if lo < -255.0 || hi > 255.0 || hi - lo > 255.0 {
                None
            } else if lo >= -128.0 && hi <= 127.0 {
                Some(0)
            } else {
                Some(hi as i32 - 127)
            }
        })
        .collect()
}

/// Whether the kernel runs this DynQMatMul node (the `dynamic` pass makes no other).
pub(super) fn runs(graph: &Graph, id: NodeId) -> bool {
    shape(graph, id, false).is_some()
}

/// The plan for a kernel whose root is a DynQMatMul: alone, or with the column bias's Add
/// fusion gave it (`fuse::biases_dynamic_product`).
pub(super) fn plan(graph: &Graph, kernel: &Kernel, root: NodeId, host: &Host) -> Option<Ukernel> {
    let shape = shape(graph, root, host.vnni)?;
    let Shape::DynQGemm { rows, k, m, .. } = shape else { return None };
    let ops = graph.operands(root);
    let (x, w) = (ops.first().copied().flatten()?, ops.get(1).copied().flatten()?);
    if !kernel.inputs.contains(&x) || !kernel.inputs.contains(&w) {
        return None;
    }
    let bias = match kernel.nodes.as_slice() {
        [_] => None,
        [_, add] => Some(added_bias(graph, root, *add, m)?),
        _ => return None,
    };
    // Work units as kiln_uk_qgemm's: chunks of rows (4 a tile) where there are enough of them,
    // else chunks of 64-column strips.
    let target = host.units(rows * m * k, 4 * MIN_MACS);
    let (chunks, split_n) =
        if rows >= 4 * target { (target, true) } else { (target.min(m.div_ceil(STRIP)), false) };
    Some(Ukernel {
        shape,
        input: x,
        weight: w,
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
        split_n,
        row_bands: 1,
        transposed: false,
        blocked: Blocked::default(),
        bf16: false,
        // AMX tiles for 16 or more rows (a tile's) and 8 or more words of K, up to 2048 bytes a
        // padded row (16 of them fill the stack buffer `quantized.c` quantizes into).
        amx: host.amx
            && rows >= 16
            && k.div_ceil(4) >= 8
            && k.div_ceil(4).next_multiple_of(16) * 4 <= AMX_MAX_ROW,
        channel_vectors: 0,
    })
}

/// The longest padded row, in bytes, the AMX form takes (`DQ_AMX_ROW` in `quantized.c`).
const AMX_MAX_ROW: usize = 2048;

/// The words of 4 k a strip's packed weights hold a column: K/4 rounded up, and on AMX tiles
/// to whole steps of 16 (zeros).
fn packed_words(k: usize, amx: bool) -> usize {
    if amx {
        k.div_ceil(4).next_multiple_of(16)
    } else {
        k.div_ceil(4)
    }
}

/// The bias an Add of the product and a constant column bias adds, as M floats.
fn added_bias(graph: &Graph, root: NodeId, add: NodeId, m: usize) -> Option<Vec<f32>> {
    if !matches!(graph.node(add).op, Op::Binary(kiln_ir::BinaryOp::Add)) {
        return None;
    }
    let ops: Vec<ValueId> = graph.operands(add).into_iter().flatten().collect();
    let [a, b] = ops[..] else { return None };
    let other = if a.node == root { b } else { a };
    if other.node == root || (a.node != root && b.node != root) {
        return None;
    }
    column_bias(graph, other, m)
}

impl KernelShape for DynQGemm {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::DynQGemm { rows, k, m, vnni } = u.shape else { return Err(fmt::Error) };
        let products = if u.amx {
            "on AMX tiles (tdpbusd: 16 rows x 16 columns x 64 products a step; rows padded to 16, K to whole steps of 64)"
        } else if vnni {
            "with vpdpbusd"
        } else {
            "by widening products (no VNNI)"
        };
        writeln!(
            f,
            "microkernel: dynamically quantized matrix product, {rows} row(s) of K={k} by M={m}"
        )?;
        writeln!(f, "the f32 rows' scale and zero point from their min and max in each work unit, rows quantized to u8 (round half to even) in blocks on the stack")?;
        let tile = if u.amx {
            "16 rows x 64 columns (4 accumulator tiles)"
        } else {
            "register tile: 4 rows x 64 columns"
        };
        writeln!(f, "u8 x s8 -> s32 {products}; {tile}; weights packed at compile time in strips of 64 columns, with their column sums")?;
        let bias = if u.epilogue.bias.is_some() { ", column bias" } else { "" };
        writeln!(f, "epilogue: dequantize to f32 ((acc - zero point * column sum) * scale * weight scale){bias}")?;
        let what = if u.split_n { "row" } else { "64-column strip" };
        writeln!(f, "workgroups: {} ({what} chunks)", u.workgroups())
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
        let Shape::DynQGemm { rows, k, m, vnni } = u.shape else { return Err(other_shape(u)) };
        let mut args = vec![p.x, p.wp, p.y];
        let bias = u.epilogue.bias.is_some();
        let offset = call.graph.constant_value(u.weight).is_some_and(|w| {
            column_offsets(&w.to_f64s(), k, m).is_some_and(|c| c.iter().any(|&c| c != 0))
        });
        // The products: 0 widening, 1 vpdpbusd, 2 AMX tiles.
        let isa = if u.amx { 2 } else { vnni as usize };
        args.extend(call.ints(&[k, m, rows, bias as usize, offset as usize, isa]));
        args.extend(call.ints(&[u.chunks]));
        args.extend(call.ints(&[u.split_n as usize]));
        Ok(("kiln_uk_dqgemm", args))
    }
}

/// The packed constant `kiln_uk_dqgemm` reads: the weights less their column's offset as
/// `[M/64][K/4][64]` words of 4 k (s8; columns past M and k past K zero; on AMX K/4 padded to
/// whole steps of 16 words, `packed_words`), then per column (padded
/// to whole strips) the int32 sum of its packed weights, the int32 offset, the f32 weight scale,
/// and the f32 bias where there is one.
fn pack(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
    // `family` hands this module its own plans, made only for a DynQMatMul whose weights and
    // scale are constants (`plan`): anything else is a bug.
    let Shape::DynQGemm { k, m, .. } = u.shape else { return Err(other_shape(u)) };
    let constant = |v: ValueId| {
        graph.constant_value(v).map(|t| t.to_f64s()).ok_or_else(|| {
            CompileError::Internal("an operand of the quantized product is not a constant".into())
        })
    };
    let root =
        *kernel.nodes.first().ok_or_else(|| CompileError::Internal("an empty kernel".into()))?;
    let ops = graph.operands(root);
    let scale_value = ops
        .get(2)
        .copied()
        .flatten()
        .ok_or_else(|| CompileError::Internal("the quantized product has no scale".into()))?;
    let (weights, scales) = (constant(u.weight)?, constant(scale_value)?);
    let (k4, strips) = (packed_words(k, u.amx), m.div_ceil(STRIP));
    let padded = strips * STRIP;
    let offsets = column_offsets(&weights, k, m).ok_or_else(|| {
        CompileError::Internal("the quantized product's weights do not fit its kernel".into())
    })?;
    let mut packed = vec![0i8; strips * k4 * STRIP * 4];
    let mut sums = vec![0i32; padded];
    for kk in 0..k {
        for col in 0..m {
            let v = (weights[kk * m + col] as i32 - offsets[col]) as i8;
            packed[(((col / STRIP) * k4 + kk / 4) * STRIP + col % STRIP) * 4 + kk % 4] = v;
            sums[col] += v as i32;
        }
    }
    let mut out: Vec<u8> = packed.iter().map(|&b| b as u8).collect();
    out.extend(sums.iter().flat_map(|s| s.to_le_bytes()));
    for col in 0..padded {
        out.extend(offsets.get(col).copied().unwrap_or(0).to_le_bytes());
    }
    for col in 0..padded {
        let s = if col < m { scales[if scales.len() == 1 { 0 } else { col }] as f32 } else { 0.0 };
        out.extend(s.to_le_bytes());
    }
    if let Some(b) = &u.epilogue.bias {
        for col in 0..padded {
            out.extend(b.get(col).copied().unwrap_or(0.0).to_le_bytes());
        }
    }
    Ok(out)
}
