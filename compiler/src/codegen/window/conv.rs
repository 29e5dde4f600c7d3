//! Convolution: the input is padded (`tensor.pad`), then a contraction over input channels and
//! the window computes each output; groups become an extra loop dimension (input, weight and
//! output are expanded to expose it). Convolutions without groups and depthwise ones get their own
//! generics whose output is indexed like the result (no reshapes), so the CPU pipeline can tile and
//! vectorise them like a matmul; strided ones read an im2col copy (every operand map then is a
//! projected permutation). Bias is an epilogue. f16/bf16 operands are widened to f32 first and the
//! result narrowed (the interpreter computes in f32). ConvTranspose becomes a convolution of a
//! stride-spread input.

use kiln_ir::infer::{transpose_axis, TransposeAxis};
use kiln_ir::op::{Conv, ConvTranspose, SpatialAxis};
use kiln_ir::{DType, NodeId, ValueId};
use melior::dialect::arith::CmpiPredicate;

use crate::codegen::contraction::{convert, multiply_add};
use crate::codegen::mlir::{broadcast_map, fill, generic, pad, push, reshape};
use crate::codegen::scalar::{compute, ScalarBuilder};
use crate::codegen::Emitter;
use crate::Result;
use melior::ir::BlockLike;

pub(super) fn conv(em: &mut Emitter, id: NodeId, c: &Conv) -> Result<()> {
    let operands = em.graph.operands(id);
    let (x, w) = (operands[0].expect("conv x"), operands[1].expect("conv w"));
    let bias = operands.get(2).copied().flatten();
    let result = ValueId::from(id);
    let (xd, wd) = (em.dims(x), em.dims(w));
    let dtype = em.ty(x).dtype;
    let cdt = compute_dtype(em, id, dtype)?;
    let spatial = xd.len() - 2;
    // Resolve the padding the interpreter's way (auto_pad included).
    let axes: Vec<_> = (0..spatial)
        .map(|i| c.window.resolve(i, xd[2 + i], wd[2 + i], false))
        .collect::<std::result::Result<_, kiln_ir::OpError>>()
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
    let mut low = vec![0i64; 2];
    let mut high = vec![0i64; 2];
    let mut padded_dims = xd[..2].to_vec();
    for a in &axes {
        low.push(a.pad_begin as i64);
        // Only as much end padding as the last window reads.
        let need = (a.output - 1) * a.stride + (a.kernel - 1) * a.dilation + 1;
        let hi = need.saturating_sub(a.input + a.pad_begin) as i64;
        high.push(hi);
        padded_dims.push(a.input + a.pad_begin + hi as usize);
    }
    let mut xv = widened(em, x, cdt)?;
    if low.iter().chain(&high).any(|&p| p != 0) {
        let zero = em.scalar_constant(0.0, cdt)?;
        let ty = em.tensor_type(&padded_dims, cdt)?;
        xv = pad(em.ctx, em.loc, em.block, xv, &low, &high, zero, ty)?;
    }
    let wv = widened(em, w, cdt)?;
    finish(em, xv, wv, &padded_dims, &wd, &axes, c.group, bias, result, cdt)
}

/// The type convolutions compute in: f32 for f16/bf16, else the operands' own (f32 or f64).
fn compute_dtype(em: &Emitter, id: NodeId, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 | DType::F64 => Ok(dtype),
        DType::F16 | DType::BF16 => Ok(DType::F32),
        _ => Err(em.unsupported(id, &format!("on {dtype} is not supported natively"))),
    }
}

/// Operand `v` as a tensor of `to` (converted elementwise when its dtype differs).
fn widened<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    v: ValueId,
    to: DType,
) -> Result<melior::ir::Value<'c, 'a>> {
    let t = em.value(v)?;
    let from = em.ty(v).dtype;
    if from == to {
        return Ok(t);
    }
    let dims = em.dims(v);
    let dest = em.empty(&dims, to)?;
    convert(em, t, &dims, from, to, dest)
}

/// The convolution in `cdt` (see `convolve`), narrowed into `result` when its dtype differs.
#[allow(clippy::too_many_arguments)]
fn finish<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    xd: &[usize],
    wd: &[usize],
    axes: &[SpatialAxis],
    group: usize,
    bias: Option<ValueId>,
    result: ValueId,
    cdt: DType,
) -> Result<()> {
    let od = em.dims(result);
    let dtype = em.ty(result).dtype;
    let bv = bias.map(|b| widened(em, b, cdt)).transpose()?;
    let dest = if cdt == dtype { em.dest(result)? } else { em.empty(&od, cdt)? };
    let mut t = convolve(em, xv, wv, xd, wd, axes, group, bv, &od, cdt, dest)?;
    if cdt != dtype {
        let dest = em.dest(result)?;
        t = convert(em, t, &od, cdt, dtype, dest)?;
    }
    em.set(result, t);
    Ok(())
}

/// The convolution of an already padded input `xv` (dims `xd`) with weights `wv` [M, C/group,
/// K...] over `axes`, plus the bias (all of `dtype`); writes `out` (dims `od`).
#[allow(clippy::too_many_arguments)]
fn convolve<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    xd: &[usize],
    wd: &[usize],
    axes: &[SpatialAxis],
    group: usize,
    bias: Option<melior::ir::Value<'c, 'a>>,
    od: &[usize],
    dtype: DType,
    out: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let od = od.to_vec();
    let (ctx, loc) = (em.ctx, em.loc);
    let zero = em.scalar_constant(0.0, dtype)?;
    // Without a bias the convolution writes the destination directly.
    let dest = if bias.is_none() { out } else { em.empty(&od, dtype)? };
    let conv = if group == 1 {
        let init = fill(ctx, loc, em.block, zero, dest)?;
        if axes.iter().any(|a| a.stride > 1) {
            im2col(em, xv, wv, &xd[..2], wd, &od, axes, dtype, init)?
        } else {
            direct(em, xv, wv, wd, &od, axes, dtype, init)?
        }
    } else if wd[1] == 1 && wd[0] == group {
        let init = fill(ctx, loc, em.block, zero, dest)?;
        depthwise(em, xv, wv, &od, axes, dtype, init)?
    } else {
        grouped(em, group, xv, wv, xd, wd, &od, axes, dtype, dest)?
    };
    match bias {
        None => Ok(conv),
        Some(b) => add_bias(em, conv, b, out, &od, dtype),
    }
}

/// A transposed convolution as a convolution: the input is spread out by the stride into a zero
/// buffer, placed so that a stride-1 convolution with the flipped kernel (weights rearranged to
/// [M, C/group, K...]) gives each output position. The buffer covers only what the output reads,
/// so the negative padding `output_shape` may ask for is a crop. Both are `linalg.generic`s (the
/// buffer reads the input with `tensor.extract`), so the kernel tiles into workgroups.
pub(super) fn conv_transpose(em: &mut Emitter, id: NodeId, c: &ConvTranspose) -> Result<()> {
    let operands = em.graph.operands(id);
    let (x, w) = match (operands.first().copied().flatten(), operands.get(1).copied().flatten()) {
        (Some(x), Some(w)) => (x, w),
        _ => return Err(em.unsupported(id, "needs an input and a weight")),
    };
    let bias = operands.get(2).copied().flatten();
    let result = ValueId::from(id);
    let (xd, wd) = (em.dims(x), em.dims(w));
    let dtype = compute_dtype(em, id, em.ty(x).dtype)?;
    let spatial = xd.len() - 2;
    let group = c.group;
    let (cin, mg) = (xd[1], wd[1]);
    if group == 0 || cin % group != 0 || wd[0] != cin {
        return Err(em.unsupported(id, "has channels that do not match its groups"));
    }
    let cg = cin / group;
    let m = mg * group;
    let taxes: Vec<TransposeAxis> = (0..spatial)
        .map(|i| transpose_axis(c, i, spatial, xd[2 + i], wd[2 + i]))
        .collect::<std::result::Result<_, kiln_ir::OpError>>()
        .map_err(|e| em.unsupported(id, &e.to_string()))?;
    let (ctx, loc) = (em.ctx, em.loc);
    // Per axis: the buffer size Z = O + (K-1)*D; input i lands at L + i*S, L = (K-1)*D - pad.
    let mut zd = xd[..2].to_vec();
    let mut lands = Vec::with_capacity(spatial);
    let mut axes = Vec::with_capacity(spatial);
    for (i, a) in taxes.iter().enumerate() {
        let (k, d) = (wd[2 + i] as i64, a.dilation as i64);
        let z = a.output as i64 + (k - 1) * d;
        lands.push(((k - 1) * d - a.pad_begin, a.stride as i64, xd[2 + i] as i64));
        zd.push(z as usize);
        axes.push(SpatialAxis {
            input: z as usize,
            kernel: k as usize,
            stride: 1,
            dilation: a.dilation,
            pad_begin: 0,
            pad_end: 0,
            output: a.output,
        });
    }
    let xv = widened(em, x, dtype)?;
    let zdest = em.empty(&zd, dtype)?;
    let zty = em.tensor_type(&zd, dtype)?;
    let zrank = zd.len();
    let id_map = broadcast_map(zrank, &zd, &zd);
    let elem = crate::codegen::mlir::dtype_type(ctx, dtype);
    let g =
        generic(ctx, loc, &[], &[zdest], &[id_map], &vec!["parallel"; zrank], &[zty], |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let c = |v: i64| sb.int_constant(v as i128, "index");
            let mut coords = vec![sb.loop_index(0, "index")?, sb.loop_index(1, "index")?];
            let mut inside = sb.constant(1.0, "i1")?;
            for (i, &(l, s, n)) in lands.iter().enumerate() {
                // Position z holds input (z - L) / S when that divides and lies in the input.
                let z = sb.loop_index(2 + i, "index")?;
                let t = sb.emit("arith.subi", &[z, c(l)?], "index")?;
                let q = sb.emit("arith.floordivsi", &[t, c(s)?], "index")?;
                let r = sb.emit("arith.remsi", &[t, c(s)?], "index")?;
                let ok = sb.cmpi(CmpiPredicate::Eq, r, c(0)?)?;
                let ge = sb.cmpi(CmpiPredicate::Sge, q, c(0)?)?;
                let lt = sb.cmpi(CmpiPredicate::Slt, q, c(n)?)?;
                for b in [ok, ge, lt] {
                    inside = sb.emit("arith.andi", &[inside, b], "i1")?;
                }
                coords.push(q);
            }
            // Every coordinate is clamped to 0 once one is out, so the read stays in bounds.
            let zero = c(0)?;
            for v in coords.iter_mut().skip(2) {
                *v = sb.select(inside, *v, zero, "index")?;
            }
            let mut operands = vec![xv];
            operands.extend(coords);
            let v = push(
                body,
                crate::codegen::mlir::op(ctx, loc, "tensor.extract", &operands, &[elem], &[])?,
            );
            let t = crate::codegen::mlir::storage_type(dtype);
            Ok(vec![sb.select(inside, v, sb.constant(0.0, t)?, t)?])
        })?;
    let zv = push(em.block, g);
    // wc[mm, c, k...] = w[(mm / Mg) * Cg + c, mm % Mg, K-1-k...], read with `tensor.extract`:
    // the tiling's fusion mis-sizes the slice of an input read through such a map.
    let mut wcd = vec![m, cg];
    wcd.extend_from_slice(&wd[2..]);
    let rank = wcd.len();
    let wv = widened(em, w, dtype)?;
    let wdest = em.empty(&wcd, dtype)?;
    let wty = em.tensor_type(&wcd, dtype)?;
    let kernel = wd[2..].to_vec();
    let g = generic(
        ctx,
        loc,
        &[],
        &[wdest],
        &[broadcast_map(rank, &wcd, &wcd)],
        &vec!["parallel"; rank],
        &[wty],
        |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let c = |v: usize| sb.int_constant(v as i128, "index");
            let mm = sb.loop_index(0, "index")?;
            let ci = sb.loop_index(1, "index")?;
            let gi = sb.emit("arith.divui", &[mm, c(mg)?], "index")?;
            let gc = sb.emit("arith.muli", &[gi, c(cg)?], "index")?;
            let mut coords = vec![
                sb.emit("arith.addi", &[gc, ci], "index")?,
                sb.emit("arith.remui", &[mm, c(mg)?], "index")?,
            ];
            for (i, &k) in kernel.iter().enumerate() {
                let ki = sb.loop_index(2 + i, "index")?;
                coords.push(sb.emit("arith.subi", &[c(k - 1)?, ki], "index")?);
            }
            let mut operands = vec![wv];
            operands.extend(coords);
            Ok(vec![push(
                body,
                crate::codegen::mlir::op(ctx, loc, "tensor.extract", &operands, &[elem], &[])?,
            )])
        },
    )?;
    let wc = push(em.block, g);
    finish(em, zv, wc, &zd, &wcd, &axes, group, bias, result, dtype)
}

/// The general N-d grouped convolution as one `linalg.generic` over
/// (n, g, m, o..., c, k...) on group-expanded operands.
#[allow(clippy::too_many_arguments)]
fn grouped<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    g: usize,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    xd: &[usize],
    wd: &[usize],
    od: &[usize],
    axes: &[kiln_ir::op::SpatialAxis],
    dtype: DType,
    dest: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let (ctx, loc) = (em.ctx, em.loc);
    let s = xd.len() - 2;
    let (cg, m) = (wd[1], wd[0]);
    let mg = m / g;
    // x [N, C, S..] -> [N, G, Cg, S..]; w [M, Cg, K..] -> [G, Mg, Cg, K..]; out [N, M, O..] -> [N, G, Mg, O..].
    let expand = |em: &Emitter<'c, 'a>,
                  v,
                  dims: &[usize],
                  at: usize,
                  a: usize,
                  b: usize|
     -> Result<melior::ir::Value<'c, 'a>> {
        let mut out = dims.to_vec();
        out.splice(at..at + 1, [a, b]);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut k = 0;
        for i in 0..dims.len() {
            if i == at {
                groups.push(vec![k, k + 1]);
                k += 2;
            } else {
                groups.push(vec![k]);
                k += 1;
            }
        }
        let ty = em.tensor_type(&out, dtype)?;
        reshape(ctx, loc, em.block, true, v, &groups, &out, ty)
    };
    let x5 = expand(em, xv, xd, 1, g, cg)?;
    let w5 = expand(em, wv, wd, 0, g, mg)?;
    let zero = em.scalar_constant(0.0, dtype)?;
    let init = fill(ctx, loc, em.block, zero, dest)?;
    let o5 = expand(em, init, od, 1, g, mg)?;
    // Loops: n, g, m, o_0..o_{s-1}, c, k_0..k_{s-1}.
    let n_loops = 3 + s + 1 + s;
    let d = |i: usize| format!("d{i}");
    let (ln, lg, lm) = (0, 1, 2);
    let lo = |i: usize| 3 + i;
    let lc = 3 + s;
    let lk = |i: usize| 4 + s + i;
    let all = (0..n_loops).map(d).collect::<Vec<_>>().join(", ");
    let mut x_idx = vec![d(ln), d(lg), d(lc)];
    for (i, a) in axes.iter().enumerate() {
        x_idx.push(format!("d{} * {} + d{} * {}", lo(i), a.stride, lk(i), a.dilation));
    }
    let mut w_idx = vec![d(lg), d(lm), d(lc)];
    w_idx.extend((0..s).map(|i| d(lk(i))));
    let mut o_idx = vec![d(ln), d(lg), d(lm)];
    o_idx.extend((0..s).map(|i| d(lo(i))));
    let map = |v: &[String]| format!("affine_map<({all}) -> ({})>", v.join(", "));
    let mut iters = vec!["parallel"; 3 + s];
    iters.extend(vec!["reduction"; 1 + s]);
    let mut o5_dims = od.to_vec();
    o5_dims.splice(1..2, [g, mg]);
    let o5_ty = em.tensor_type(&o5_dims, dtype)?;
    let gen = generic(
        ctx,
        loc,
        &[x5, w5],
        &[o5],
        &[map(&x_idx), map(&w_idx), map(&o_idx)],
        &iters,
        &[o5_ty],
        |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let t = compute(dtype);
            let a = body.argument(0).expect("x").into();
            let b = body.argument(1).expect("w").into();
            let o = body.argument(2).expect("acc").into();
            Ok(vec![multiply_add(&sb, o, a, b, t)?])
        },
    )?;
    let r = push(em.block, gen);
    let mut groups: Vec<Vec<usize>> = vec![vec![0], vec![1, 2]];
    groups.extend((0..s).map(|i| vec![3 + i]));
    let ty = em.tensor_type(od, dtype)?;
    reshape(ctx, loc, em.block, false, r, &groups, od, ty)
}

/// The affine map `(d0, ..., d{n-1}) -> (exprs)`.
fn map_of(n: usize, exprs: &[String]) -> String {
    format!(
        "affine_map<({}) -> ({})>",
        (0..n).map(|i| format!("d{i}")).collect::<Vec<_>>().join(", "),
        exprs.join(", ")
    )
}

/// `x[n, c, o*stride + k*dilation ...]` for loop dims `o(i)` and `k(i)`.
fn window_index(
    axes: &[kiln_ir::op::SpatialAxis],
    o: impl Fn(usize) -> usize,
    k: impl Fn(usize) -> usize,
) -> Vec<String> {
    axes.iter()
        .enumerate()
        .map(|(i, a)| format!("d{} * {} + d{} * {}", o(i), a.stride, k(i), a.dilation))
        .collect()
}

/// The convolution body: `acc + x * w`.
fn conv_body<'c>(
    ctx: &'c melior::Context,
    loc: melior::ir::Location<'c>,
    dtype: DType,
) -> impl for<'b> FnOnce(&'b melior::ir::Block<'c>) -> Result<Vec<melior::ir::Value<'c, 'b>>> {
    move |body| {
        let sb = ScalarBuilder { ctx, loc, block: body };
        let a = body.argument(0).expect("x").into();
        let b = body.argument(1).expect("w").into();
        let o = body.argument(2).expect("acc").into();
        Ok(vec![multiply_add(&sb, o, a, b, compute(dtype))?])
    }
}

/// An ungrouped stride-1 convolution over loops (n, m, o..., c, k...), reading the padded input
/// directly.
#[allow(clippy::too_many_arguments)]
fn direct<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    wd: &[usize],
    od: &[usize],
    axes: &[kiln_ir::op::SpatialAxis],
    dtype: DType,
    init: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let s = axes.len();
    let n_loops = 3 + 2 * s;
    let (lc, lo, lk) = (2 + s, |i: usize| 2 + i, |i: usize| 3 + s + i);
    let d = |i: usize| format!("d{i}");
    let mut x_idx = vec![d(0), d(lc)];
    x_idx.extend(window_index(axes, lo, lk));
    let mut w_idx = vec![d(1), d(lc)];
    w_idx.extend((0..s).map(|i| d(lk(i))));
    debug_assert_eq!(wd.len(), 2 + s);
    let o_idx: Vec<String> = (0..2 + s).map(d).collect();
    let mut iters = vec!["parallel"; 2 + s];
    iters.extend(vec!["reduction"; 1 + s]);
    let ty = em.tensor_type(od, dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let maps = [map_of(n_loops, &x_idx), map_of(n_loops, &w_idx), map_of(n_loops, &o_idx)];
    let g =
        generic(ctx, loc, &[xv, wv], &[init], &maps, &iters, &[ty], conv_body(ctx, loc, dtype))?;
    Ok(push(em.block, g))
}

/// An ungrouped strided convolution: an im2col copy `col[n, c, k..., o...]` of the windows, then
/// a contraction over (n, m, o..., c, k...) reading it.
#[allow(clippy::too_many_arguments)]
fn im2col<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    nc: &[usize],
    wd: &[usize],
    od: &[usize],
    axes: &[kiln_ir::op::SpatialAxis],
    dtype: DType,
    init: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let s = axes.len();
    let (ctx, loc) = (em.ctx, em.loc);
    let d = |i: usize| format!("d{i}");
    // The copy: loops (n, c, k..., o...).
    let mut col_dims = nc.to_vec();
    col_dims.extend(axes.iter().map(|a| a.kernel));
    col_dims.extend(axes.iter().map(|a| a.output));
    let n_col = 2 + 2 * s;
    let mut x_idx = vec![d(0), d(1)];
    x_idx.extend(window_index(axes, |i| 2 + s + i, |i| 2 + i));
    let col_ty = em.tensor_type(&col_dims, dtype)?;
    let col_dest = em.empty(&col_dims, dtype)?;
    let copy = generic(
        ctx,
        loc,
        &[xv],
        &[col_dest],
        &[map_of(n_col, &x_idx), map_of(n_col, &(0..n_col).map(d).collect::<Vec<_>>())],
        &vec!["parallel"; n_col],
        &[col_ty],
        |body| Ok(vec![body.argument(0).expect("x").into()]),
    )?;
    let col = push(em.block, copy);
    // The contraction: loops (n, m, o..., c, k...).
    let n_loops = 3 + 2 * s;
    let (lc, lo, lk) = (2 + s, |i: usize| 2 + i, |i: usize| 3 + s + i);
    let mut c_idx = vec![d(0), d(lc)];
    c_idx.extend((0..s).map(|i| d(lk(i))));
    c_idx.extend((0..s).map(|i| d(lo(i))));
    let mut w_idx = vec![d(1), d(lc)];
    w_idx.extend((0..s).map(|i| d(lk(i))));
    debug_assert_eq!(wd.len(), 2 + s);
    let o_idx: Vec<String> = (0..2 + s).map(d).collect();
    let mut iters = vec!["parallel"; 2 + s];
    iters.extend(vec!["reduction"; 1 + s]);
    let ty = em.tensor_type(od, dtype)?;
    let maps = [map_of(n_loops, &c_idx), map_of(n_loops, &w_idx), map_of(n_loops, &o_idx)];
    let g =
        generic(ctx, loc, &[col, wv], &[init], &maps, &iters, &[ty], conv_body(ctx, loc, dtype))?;
    Ok(push(em.block, g))
}

/// A depthwise convolution (one input channel per group, one output channel per group) over
/// loops (n, g, o..., k...).
fn depthwise<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    xv: melior::ir::Value<'c, 'a>,
    wv: melior::ir::Value<'c, 'a>,
    od: &[usize],
    axes: &[kiln_ir::op::SpatialAxis],
    dtype: DType,
    init: melior::ir::Value<'c, 'a>,
) -> Result<melior::ir::Value<'c, 'a>> {
    let s = axes.len();
    let n_loops = 2 + 2 * s;
    let d = |i: usize| format!("d{i}");
    let mut x_idx = vec![d(0), d(1)];
    x_idx.extend(window_index(axes, |i| 2 + i, |i| 2 + s + i));
    let mut w_idx = vec![d(1), "0".to_string()];
    w_idx.extend((0..s).map(|i| d(2 + s + i)));
    let o_idx: Vec<String> = (0..2 + s).map(d).collect();
    let mut iters = vec!["parallel"; 2 + s];
    iters.extend(vec!["reduction"; s]);
    let ty = em.tensor_type(od, dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let maps = [map_of(n_loops, &x_idx), map_of(n_loops, &w_idx), map_of(n_loops, &o_idx)];
    let g =
        generic(ctx, loc, &[xv, wv], &[init], &maps, &iters, &[ty], conv_body(ctx, loc, dtype))?;
    Ok(push(em.block, g))
}

/// `conv + bias[m]`, writing the kernel destination.
fn add_bias<'c, 'a>(
    em: &mut Emitter<'c, 'a>,
    conv: melior::ir::Value<'c, 'a>,
    bv: melior::ir::Value<'c, 'a>,
    dest: melior::ir::Value<'c, 'a>,
    od: &[usize],
    dtype: DType,
) -> Result<melior::ir::Value<'c, 'a>> {
    let rank = od.len();
    let id = broadcast_map(rank, od, od);
    let bias_map = format!("affine_map<({}) -> (d1)>", crate::codegen::mlir::dims_list(rank));
    let ty = em.tensor_type(od, dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let g = generic(
        ctx,
        loc,
        &[conv, bv],
        &[dest],
        &[id.clone(), bias_map, id],
        &vec!["parallel"; rank],
        &[ty],
        |body| {
            let sb = ScalarBuilder { ctx, loc, block: body };
            let a = body.argument(0).expect("conv").into();
            let c = body.argument(1).expect("bias").into();
            Ok(vec![sb.emit("arith.addf", &[a, c], compute(dtype))?])
        },
    )?;
    Ok(push(em.block, g))
}
