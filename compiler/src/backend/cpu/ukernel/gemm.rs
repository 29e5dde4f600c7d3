//! Matrix products by a constant B (`Shape::Gemm`, `gemm.c`): the shape read from a MatMul or
//! Gemm root (the rest of its planning is `tiled`'s), its description, B packed and its call.

use std::fmt;

use kiln_ir::{Graph, Op, ValueId};
use melior::ir::Value;

use super::tiled::Root;
use super::{
    bf16_bits, bf16_bytes, column_bias, describe_epilogue, describe_tiles, f32_bytes, other_shape,
    weight_f32s, Call, KernelShape, Pointers, Shape, Ukernel, NR,
};
use crate::fuse::Kernel;
use crate::Result;

/// Matrix products: `kiln_uk_gemm`.
pub(super) struct Gemm;

/// A MatMul or Gemm root as the kernel takes it: B a constant 2-D matrix, Gemm's alpha 1 and its
/// C (with beta 1) a constant row broadcast over the result (the bias).
pub(super) fn shape(graph: &Graph, operands: &[Option<ValueId>], op: &Op) -> Option<Root> {
    let dims = |v: ValueId| graph.value_type(v).shape.as_fixed();
    let (a, b) = (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let (ad, bd) = (dims(a)?, dims(b)?);
    if bd.len() != 2 || graph.constant_value(b).is_none() || ad.len() < 2 {
        return None;
    }
    let (trans_a, trans_b, c) = match op {
        Op::Gemm(g) => {
            if g.alpha != 1.0 || ad.len() != 2 {
                return None;
            }
            let c = operands.get(2).copied().flatten();
            if c.is_some() && g.beta != 1.0 {
                return None;
            }
            (g.trans_a, g.trans_b, c)
        }
        _ => (false, false, None),
    };
    let k = if trans_a { ad[0] } else { ad[ad.len() - 1] };
    let m: usize = if trans_a { ad[1] } else { ad[..ad.len() - 1].iter().product() };
    let n = if trans_b { bd[0] } else { bd[1] };
    let shape = Shape::Gemm { m, n, k, trans_a, trans_b };
    // Gemm's C: a constant row broadcast over the result is a bias.
    let bias = match c {
        None => None,
        Some(c) => Some(column_bias(graph, c, n)?),
    };
    Some((shape, a, b, bias))
}

impl KernelShape for Gemm {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = u.mnk();
        let Shape::Gemm { trans_a, trans_b, .. } = u.shape else { return Err(fmt::Error) };
        writeln!(
            f,
            "microkernel: GEMM M={m} N={n} K={k}{}{}",
            if trans_a { ", A transposed" } else { "" },
            if trans_b { ", B transposed" } else { "" }
        )?;
        let b = if u.amx {
            "bf16 products on AMX tiles (tdpbf16ps: 16 rows x 16 columns x 32 products a step), f32 sums in 4 accumulator tiles, 32 rows x 32 columns: B rounded to bf16 in pairs along K (padded to whole steps of 16 pairs), A's rows made bf16 pairs at run time, each B strip against every row tile; fewer than 16 rows in a unit on vdpbf16ps"
        } else if u.bf16 {
            "bf16 products with vdpbf16ps, f32 sums: B rounded to bf16 in pairs along K, A's rows made bf16 pairs at run time, each B strip against every row tile"
        } else if m < u.mr {
            "rows times packed B strips, up to 4 rows a pass (matrix-vector)"
        } else {
            "A packed at run time"
        };
        let what = if u.transposed {
            "channel"
        } else if u.split_n {
            "column"
        } else {
            "row"
        };
        describe_tiles(u, f, NR, b, what, "")?;
        describe_epilogue(u, f)
    }

    fn pack(&self, graph: &Graph, _kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
        let w = weight_f32s(graph, u)?;
        let (_, n, k) = u.mnk();
        let Shape::Gemm { trans_b, .. } = u.shape else { return Err(other_shape(u)) };
        if u.bf16 {
            return Ok(bf16_bytes(pack_gemm_bf16(&w, n, k, trans_b, pair_rows(u)), u));
        }
        // B[k, n] = W[k, n], or W[n, k] transposed, in strips of NR columns.
        let mut out = vec![0.0; n.div_ceil(NR) * k * NR];
        for kk in 0..k {
            for j in 0..n {
                let v = if trans_b { w[j * k + kk] } else { w[kk * n + j] };
                out[((j / NR) * k + kk) * NR + j % NR] = v;
            }
        }
        Ok(f32_bytes(out, u))
    }

    fn packed_floats(&self, u: &Ukernel) -> usize {
        let (_, n, k) = u.mnk();
        if u.bf16 {
            n.div_ceil(NR) * pair_rows(u) * NR
        } else {
            n.div_ceil(NR) * k * NR
        }
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Gemm { m, n, k, trans_a, .. } = u.shape else { return Err(other_shape(u)) };
        let mut args = vec![p.x, p.wp, p.bias, p.res, p.y];
        // A[i, kk] = a[i * lda + kk * ka].
        let (lda, ka) = if trans_a { (1, m) } else { (k, 1) };
        args.extend(call.ints(&[m, n, k, lda, ka]));
        args.extend(call.activation(&u.epilogue));
        args.extend(call.ints(&[u.kc, u.mc, u.nc, u.chunks, u.split_n as usize]));
        // 0 f32, 1 bf16 on vdpbf16ps, 2 bf16 on AMX tiles.
        args.extend(call.ints(&[if u.amx { 2 } else { u.bf16 as usize }]));
        Ok(("kiln_uk_gemm", args))
    }
}

/// The pair rows a bf16 GEMM's packed B strip has: K/2 rounded up, and on AMX tiles to whole
/// steps of 16 pairs (zero rows: a tile step reads 16).
fn pair_rows(u: &Ukernel) -> usize {
    let (_, _, k) = u.mnk();
    if u.amx {
        k.div_ceil(2).next_multiple_of(16)
    } else {
        k.div_ceil(2)
    }
}

/// A GEMM's constant B[k, n] (W[k, n], or W[n, k] transposed) for `kiln_uk_gemm`'s bf16 form:
/// in strips of NR columns, a word per column and pair of rows ([(t * K2 + q) * NR + c]: B[2q, j]
/// low, B[2q + 1, j] high, rounded to nearest even), columns past n, an odd k's last row and
/// pair rows past k (to `k2`) zero.
fn pack_gemm_bf16(w: &[f32], n: usize, k: usize, trans_b: bool, k2: usize) -> Vec<u32> {
    let mut out = vec![0u32; n.div_ceil(NR) * k2 * NR];
    for kk in 0..k {
        for j in 0..n {
            let v = if trans_b { w[j * k + kk] } else { w[kk * n + j] };
            out[((j / NR) * k2 + kk / 2) * NR + j % NR] |= bf16_bits(v) << (16 * (kk % 2));
        }
    }
    out
}
