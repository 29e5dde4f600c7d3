//! Contractions on register tiles: MatMul (batched, broadcasting), Gemm and convolutions (as
//! implicit GEMMs), `C[b, m, n] = sum_k A[b, m, k] B[b, k, n]`.
//!
//! A block computes a `BM x BN` tile of C; each of its threads a `TM x TN` sub-tile whose
//! accumulators stay in registers. The reduction runs `BK` at a time: every thread copies part
//! of the next A and B tiles from global memory into registers while the block computes on the
//! current ones, then stores them into the other half of a double-buffered workgroup-memory
//! tile (one barrier a step). A is kept `k`-major in workgroup memory (`As[k][m]`, rows padded
//! by 4 so no bank is hit twice), so each thread reads its rows and columns of a step as 128-bit
//! vectors. Global loads are 128 bits wide along whichever of the operand's axes is contiguous
//! (rows of a row-major matrix, columns of a transposed one), else one element at a time; a
//! convolution's B is its input read through the window (`im2col` in the loads, zeros where the
//! window leaves the image).
//!
//! When the tiles are too few to fill the GPU (a small output with a long reduction), the
//! reduction is split over blocks (split-K): each writes its partial tile, and a second launch
//! adds them and stores the result. The epilogue (Gemm's alpha, beta and C, the kernel's
//! elementwise tail) runs as results are stored, four consecutive results a vector store.

use kiln_ir::{DType, Graph, Op, ValueId};

use super::builder::Flavor;
use super::builder::{type_of, KernelBuilder, V};
use super::load::{LoadContext, Loader, Rounding, TileLayout};
use super::mma::{self, MmaKind, MmaTile};
use super::reduce::trips;
use super::tail::{broadcast_strides, source_of, Source, Tail};
use super::{Args, BuildContext, Hints, TileTarget};
use crate::fuse::Kernel;

/// How one operand's element `(b, i, j)` is found (`i`, `j`: A's `(m, k)`, B's `(k, n)`).
#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    /// At `batch offset + i * rows + j * cols`; the batch offset is the sum over the output's
    /// batch dimensions of each index times `batch[d]` (0 where the operand broadcasts).
    Strided { rows: usize, cols: usize, batch: Vec<usize> },
    /// A convolution's input as B of the implicit GEMM: `k` is (channel, tap row, tap column),
    /// `n` is (output row, output column), `b` the image.
    Window(Window),
}

/// A 2-D convolution's window over its input, for `Access::Window`.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
    pub out_width: usize,
}

#[derive(Clone, Debug)]
pub struct Operand {
    pub input: usize,
    pub dtype: DType,
    pub access: Access,
}

impl Operand {
    /// Which of the tile's axes is contiguous in memory: 0 (`i`) or 1 (`j`), if either.
    pub(super) fn contiguous(&self) -> Option<usize> {
        match &self.access {
            Access::Strided { rows: 1, .. } => Some(0),
            Access::Strided { cols: 1, .. } => Some(1),
            _ => None,
        }
    }
}

/// The register-tile shape: a block's `bm x bn` tile, a thread's `tm x tn`, `bk` a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub tm: usize,
    pub tn: usize,
}

impl Tile {
    pub fn threads(&self) -> usize {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

/// The tiles kiln picks from, largest first; each thread's rows (and columns) are one or two
/// runs of 4, so its reads of a step are 128-bit vectors.
const TILES: [Tile; 5] = [
    Tile { bm: 128, bn: 128, bk: 8, tm: 8, tn: 8 },
    Tile { bm: 64, bn: 128, bk: 8, tm: 4, tn: 8 },
    Tile { bm: 128, bn: 64, bk: 8, tm: 8, tn: 4 },
    Tile { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4 },
    Tile { bm: 16, bn: 128, bk: 16, tm: 4, tn: 8 },
];

/// Gemm's `alpha * AB + beta * C`, with C read through strides over `[m, n]`.
#[derive(Clone, Debug)]
pub struct Bias {
    pub value: ValueId,
    pub dtype: DType,
    pub source: Source,
    pub strides: [usize; 2],
    pub beta: f32,
}

/// How the products are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    /// f32 FMAs on register tiles; operands rounded to a lower precision first when asked.
    Simt { round: Option<MmaKind> },
    /// Tensor cores (`mma.rs`).
    Mma { kind: MmaKind, tile: MmaTile },
}

#[derive(Clone, Debug)]
pub struct GemmPlan {
    pub what: &'static str,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub alpha: f32,
    pub c: Option<Bias>,
    /// The output's batch dimensions (their product is `batch`).
    pub batch_dims: Vec<usize>,
    pub tile: Tile,
    pub math: Math,
    /// Global loads' widths for A and B.
    pub vec_a: usize,
    pub vec_b: usize,
    /// Blocks the reduction is split over (1: none).
    pub splits: usize,
    /// The output's dimensions in groups for the tail: batch, m, n.
    pub groups: [(usize, usize); 3],
    pub tail: Tail,
}

/// Row-major strides of `dims` aligned right against `out` batch dimensions: one per output
/// batch dimension, 0 where the operand has none or broadcasts.
fn batch_strides(dims: &[usize], own: &[usize], out: &[usize]) -> Vec<usize> {
    let full = super::tail::contiguous_strides(dims);
    let mut s = vec![0; out.len()];
    let offset = out.len() - own.len();
    for (i, &d) in own.iter().enumerate() {
        if d == out[offset + i] && d != 1 {
            s[offset + i] = full[i];
        }
    }
    s
}

pub fn plan(t: &TileTarget, graph: &Graph, kernel: &Kernel) -> Option<GemmPlan> {
    let tail = Tail::of(graph, kernel)?;
    let root = tail.root;
    let operands = graph.operands(root);
    let out_dims = tail.dims.clone();
    let input = |v: ValueId| kernel.inputs.iter().position(|&i| i == v);
    let f32_only = operands.iter().flatten().all(|&v| graph.value_type(v).dtype == DType::F32);
    if !f32_only || tail.root_dtype != DType::F32 {
        return None;
    }
    let (what, a, b, m, n, k, batch_dims, alpha, c) = match &graph.node(root).op {
        Op::MatMul => {
            let (x, y) = (operands[0]?, operands[1]?);
            let (xd, yd) =
                (graph.value_type(x).shape.as_fixed()?, graph.value_type(y).shape.as_fixed()?);
            if xd.len() < 2 || yd.len() < 2 {
                return None;
            }
            let (m, k, n) = (xd[xd.len() - 2], xd[xd.len() - 1], yd[yd.len() - 1]);
            let batch_dims = out_dims[..out_dims.len() - 2].to_vec();
            let a = Operand {
                input: input(x)?,
                dtype: DType::F32,
                access: Access::Strided {
                    rows: k,
                    cols: 1,
                    batch: batch_strides(&xd, &xd[..xd.len() - 2], &batch_dims),
                },
            };
            let b = Operand {
                input: input(y)?,
                dtype: DType::F32,
                access: Access::Strided {
                    rows: n,
                    cols: 1,
                    batch: batch_strides(&yd, &yd[..yd.len() - 2], &batch_dims),
                },
            };
            ("MatMul", a, b, m, n, k, batch_dims, 1.0, None)
        }
        Op::Gemm(g) => {
            let (x, y) = (operands[0]?, operands[1]?);
            let (xd, yd) =
                (graph.value_type(x).shape.as_fixed()?, graph.value_type(y).shape.as_fixed()?);
            if xd.len() != 2 || yd.len() != 2 {
                return None;
            }
            let (m, k) = if g.trans_a { (xd[1], xd[0]) } else { (xd[0], xd[1]) };
            let n = if g.trans_b { yd[0] } else { yd[1] };
            // A[m][k]: row-major, or stored [k][m] when transposed; B likewise.
            let (ar, ac) = if g.trans_a { (1, m) } else { (k, 1) };
            let (br, bc) = if g.trans_b { (1, k) } else { (n, 1) };
            let a = Operand {
                input: input(x)?,
                dtype: DType::F32,
                access: Access::Strided { rows: ar, cols: ac, batch: Vec::new() },
            };
            let b = Operand {
                input: input(y)?,
                dtype: DType::F32,
                access: Access::Strided { rows: br, cols: bc, batch: Vec::new() },
            };
            let mut constants = tail.constant_values().len();
            let c = match operands.get(2).copied().flatten() {
                Some(cv) if g.beta != 0.0 => {
                    let s = broadcast_strides(&graph.value_type(cv).shape.as_fixed()?, &[m, n])?;
                    Some(Bias {
                        value: cv,
                        dtype: graph.value_type(cv).dtype,
                        source: source_of(graph, kernel, cv, &mut constants)?,
                        strides: [s[0], s[1]],
                        beta: g.beta,
                    })
                }
                _ => None,
            };
            ("Gemm", a, b, m, n, k, Vec::new(), g.alpha, c)
        }
        Op::Conv(cv) => {
            let (x, w) = (operands[0]?, operands[1]?);
            let (xd, wd) =
                (graph.value_type(x).shape.as_fixed()?, graph.value_type(w).shape.as_fixed()?);
            if cv.group != 1 || xd.len() != 4 || wd.len() != 4 {
                return None;
            }
            let axes: Vec<_> = (0..2)
                .map(|i| cv.window.resolve(i, xd[2 + i], wd[2 + i], false).ok())
                .collect::<Option<_>>()?;
            let (co, ci) = (wd[0], wd[1]);
            let (m, n, k) = (co, axes[0].output * axes[1].output, ci * wd[2] * wd[3]);
            let a = Operand {
                input: input(w)?,
                dtype: DType::F32,
                access: Access::Strided { rows: k, cols: 1, batch: vec![0] },
            };
            let pointwise = wd[2] == 1
                && wd[3] == 1
                && axes.iter().all(|ax| ax.stride == 1 && ax.pad_begin == 0 && ax.pad_end == 0);
            let access = if pointwise {
                Access::Strided { rows: xd[2] * xd[3], cols: 1, batch: vec![ci * xd[2] * xd[3]] }
            } else {
                Access::Window(Window {
                    channels: ci,
                    height: xd[2],
                    width: xd[3],
                    kernel: [wd[2], wd[3]],
                    stride: [axes[0].stride, axes[1].stride],
                    pad: [axes[0].pad_begin, axes[1].pad_begin],
                    dilation: [axes[0].dilation, axes[1].dilation],
                    out_width: axes[1].output,
                })
            };
            let b = Operand { input: input(x)?, dtype: DType::F32, access };
            let mut constants = tail.constant_values().len();
            let c = match operands.get(2).copied().flatten() {
                Some(bias) => Some(Bias {
                    value: bias,
                    dtype: graph.value_type(bias).dtype,
                    source: source_of(graph, kernel, bias, &mut constants)?,
                    strides: [1, 0],
                    beta: 1.0,
                }),
                None => None,
            };
            let what = if pointwise { "Conv 1x1" } else { "Conv" };
            (what, a, b, m, n, k, vec![xd[0]], 1.0, c)
        }
        _ => return None,
    };
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    let batch: usize = batch_dims.iter().product();
    let rank = out_dims.len();
    let nb = batch_dims.len();
    // The output's dims: the batch's, then m's (one), then n's (the rest: a convolution's rows
    // and columns).
    let groups = [(0, nb), (nb, nb + 1), (nb + 1, rank)];
    Some(finish_plan(t, what, batch, m, n, k, a, b, alpha, c, batch_dims, groups, tail))
}

/// Picks the tile, load widths and split for a contraction.
#[allow(clippy::too_many_arguments)]
fn finish_plan(
    t: &TileTarget,
    what: &'static str,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    alpha: f32,
    c: Option<Bias>,
    batch_dims: Vec<usize>,
    groups: [(usize, usize); 3],
    tail: Tail,
) -> GemmPlan {
    let tile = pick_tile(t, batch, m, n);
    let kind = MmaKind::of(t.precision);
    // Tensor cores from sm_80 (mma.sync on TF32 and bf16); on OpenCL only when forced (tests).
    let cores = match t.flavor {
        Flavor::Nvvm => t.sm >= 80 || t.tensor_cores,
        Flavor::Spirv => t.tensor_cores,
    };
    let math = match (kind, cores) {
        (Some(_), true) | (None, true) if t.tensor_cores || kind.is_some() => {
            let kind = kind.unwrap_or(MmaKind::Tf32);
            // The large tile when it still gives every SM a block (and not on OpenCL, whose
            // 32 KB of workgroup memory it exceeds).
            let blocks = m.div_ceil(128) * n.div_ceil(128) * batch;
            let large = t.flavor == Flavor::Nvvm && blocks * 2 >= t.sms;
            Math::Mma { kind, tile: mma::tile(kind, large) }
        }
        _ => Math::Simt { round: kind },
    };
    let (bm, bn, bk, threads) = match math {
        Math::Mma { tile, .. } => (tile.bm, tile.bn, tile.bk, tile.threads()),
        Math::Simt { .. } => (tile.bm, tile.bn, tile.bk, tile.threads()),
    };
    let width = |o: &Operand, along: usize| -> usize {
        // 128-bit loads along the contiguous axis when every row starts aligned and the tile's
        // steps along it are whole vectors.
        match (&o.access, o.contiguous()) {
            (Access::Strided { rows, cols, batch }, Some(axis)) => {
                let pitch = if axis == 0 { *cols } else { *rows };
                let aligned = pitch.is_multiple_of(4)
                    && batch.iter().all(|s| s.is_multiple_of(4))
                    && along.is_multiple_of(4);
                if aligned {
                    4
                } else {
                    1
                }
            }
            _ => 1,
        }
    };
    let vec_a = width(&a, if a.contiguous() == Some(0) { m } else { k });
    let vec_b = width(&b, if b.contiguous() == Some(1) { n } else { k });
    let blocks = m.div_ceil(bm) * n.div_ceil(bn) * batch;
    let steps = k.div_ceil(bk);
    // Split the reduction when the tiles give the GPU fewer than twice the threads it needs
    // to be busy, as long as each split keeps 64 of the reduction or more (whole steps), and
    // the contraction is big enough (10 MFLOP) to be worth the second launch.
    let want = 2 * t.min_threads();
    let per_split = 64usize.div_ceil(bk);
    let big = 2 * batch * m * n * k > 10_000_000;
    let splits = if big && blocks * threads < want && steps >= 2 * per_split {
        want.div_ceil(blocks * threads).min(steps / per_split).clamp(1, 64)
    } else {
        1
    };
    GemmPlan {
        what,
        batch,
        m,
        n,
        k,
        a,
        b,
        alpha,
        c,
        batch_dims,
        tile,
        math,
        vec_a,
        vec_b,
        splits,
        groups,
        tail,
    }
}

/// The tile wasting least on edges, preferring larger tiles (more reuse per load) while they
/// still give the GPU a block per SM.
fn pick_tile(t: &TileTarget, batch: usize, m: usize, n: usize) -> Tile {
    let score = |tl: &Tile| -> f64 {
        let (tm, tn) = (m.div_ceil(tl.bm), n.div_ceil(tl.bn));
        let useful = (m * n) as f64 / ((tm * tl.bm) * (tn * tl.bn)) as f64;
        let blocks = (tm * tn * batch) as f64;
        let fill = (blocks / t.sms as f64).min(1.0);
        // Loads a multiply-add: a tile reads bm + bn values a step for bm * bn products.
        let reuse = (tl.bm * tl.bn) as f64 / (tl.bm + tl.bn) as f64 / 64.0;
        useful * fill.sqrt() * reuse.min(1.0).sqrt()
    };
    *TILES
        .iter()
        .max_by(|x, y| score(x).partial_cmp(&score(y)).expect("finite scores"))
        .expect("tiles")
}

impl GemmPlan {
    pub fn describe(&self, graph: &Graph) -> String {
        let t = self.tile;
        let split = if self.splits > 1 {
            format!(", the reduction split over {} blocks", self.splits)
        } else {
            String::new()
        };
        let how = match self.math {
            Math::Simt { round } => {
                let round =
                    round.map_or(String::new(), |k| format!(", operands rounded to {}", k.name()));
                format!(
                    "{}x{} tiles, {}x{} a thread, k {} a step{round}",
                    t.bm, t.bn, t.tm, t.tn, t.bk
                )
            }
            Math::Mma { kind, tile } => format!(
                "{} tensor cores, {}x{} tiles, {} warps of {}x{}, k {} a step",
                kind.name(),
                tile.bm,
                tile.bn,
                tile.warps(),
                tile.wm,
                tile.wn,
                tile.bk
            ),
        };
        format!(
            "tile gemm: {} [{} x {} x {}] x {} ({how}, loads {}/{} wide{split}){}",
            self.what,
            self.m,
            self.n,
            self.k,
            self.batch,
            self.vec_a,
            self.vec_b,
            self.tail.describe(graph)
        )
    }

    /// The plan's constants beyond the tail's, in `Source::Constant` order.
    pub fn constants(&self) -> Vec<ValueId> {
        let mut out = self.tail.constant_values();
        if let Some(c) = &self.c {
            if matches!(c.source, Source::Constant(_)) {
                out.push(c.value);
            }
        }
        out
    }

    pub fn build(&self, cx: &mut BuildContext) -> crate::Result<()> {
        let graph = cx.graph;
        let (bm, bn, threads) = match self.math {
            Math::Simt { .. } => (self.tile.bm, self.tile.bn, self.tile.threads()),
            Math::Mma { tile, .. } => (tile.bm, tile.bn, tile.threads()),
        };
        let grid = [
            self.n.div_ceil(bn) as u32,
            self.m.div_ceil(bm) as u32,
            (self.batch * self.splits) as u32,
        ];
        let block = [threads as u32, 1, 1];
        let main = |kb: &KernelBuilder, a: &Args, partial: Option<V>| match self.math {
            Math::Simt { round } => self.kernel(kb, a, graph, round, partial),
            Math::Mma { kind, tile } => self.mma_kernel(kb, a, graph, kind, tile, partial),
        };
        // Two blocks a multiprocessor for the FMA tiles (128 registers a thread): one leaves
        // half the warps that hide shared-memory latency.
        let bound = matches!(self.math, Math::Simt { .. }).then_some(2);
        let hints =
            Hints { min_blocks: bound, flops: 2 * (self.batch * self.m * self.n * self.k) as u64 };
        if self.splits == 1 {
            return cx.launch_with("gemm", grid, block, &[], hints, |kb, a| main(kb, a, None));
        }
        let part = cx.scratch(self.splits * self.batch * self.m * self.n * 4);
        cx.launch_with("gemm_partial", grid, block, &[part], hints, |kb, a| {
            main(kb, a, Some(a.scratch[0]))
        })?;
        let total = self.batch * self.m * self.n;
        let grid = [total.div_ceil(256) as u32, 1, 1];
        cx.launch("gemm_sum", grid, [256, 1, 1], &[part], |kb, a| self.sum_kernel(kb, a, graph))
    }

    /// Where the thread's rows (or columns) of the block tile are: one run of 4, or two (the
    /// second half a tile away), for a thread index along that axis.
    fn runs(kb: &KernelBuilder, t: V, per_thread: usize, extent: usize) -> Vec<V> {
        let first = kb.mul_k(t, 4);
        if per_thread == 4 {
            vec![first]
        } else {
            vec![first, kb.add_k(first, (extent / 2) as i64)]
        }
    }

    /// The main kernel; with `partial`, it stores the raw sums of its split there instead.
    fn kernel(
        &self,
        kb: &KernelBuilder,
        a: &Args,
        graph: &Graph,
        round: Option<MmaKind>,
        partial: Option<V>,
    ) -> crate::Result<()> {
        let t = self.tile;
        let threads = t.threads();
        let (pm, pn) = (t.bm + 4, t.bn + 4);
        let tid = kb.thread_id(0);
        let n0 = kb.mul_k(kb.block_id(0), t.bn as i64);
        let m0 = kb.mul_k(kb.block_id(1), t.bm as i64);
        let z = kb.block_id(2);
        let (bi, split) = if self.splits > 1 {
            (kb.div_k(z, self.splits as i64), kb.rem_k(z, self.splits as i64))
        } else {
            (z, kb.index(0))
        };
        // The split's steps: [s * chunk, min((s + 1) * chunk, steps)) of bk each.
        let steps = self.k.div_ceil(t.bk);
        let chunk = steps.div_ceil(self.splits);
        let first_step = kb.mul_k(split, chunk as i64);
        let end_step = kb.min(kb.add_k(first_step, chunk as i64), kb.index(steps as i64));
        let count = trips(kb, first_step, end_step, 1);
        let a_base = self.batch_offset(kb, &self.a, bi);
        let b_base = self.batch_offset(kb, &self.b, bi);
        let f32t = kb.f32_t();
        let a_tile = kb.shared(2 * t.bk * pm, f32t);
        let b_tile = kb.shared(2 * t.bk * pn, f32t);
        // Rounded operands are computed in f32 here: their tiles hold rounded f32 values.
        let loader_a = Loader::new(&self.a, self.vec_a, t.bm, t.bk, threads, true)
            .with_layout(TileLayout::KMajor, Some(Rounding::InF32(round)));
        let loader_b = Loader::new(&self.b, self.vec_b, t.bk, t.bn, threads, false)
            .with_layout(TileLayout::KMajor, Some(Rounding::InF32(round)));
        let ctx = LoadContext { m0, n0, tid, a_base, b_base };
        // The first step's tiles, then the loop: prefetch the next step into registers,
        // compute this one, store the prefetched tiles into the other buffer, wait.
        let k0 = kb.mul_k(first_step, t.bk as i64);
        let ra = loader_a.load(kb, self, a, &ctx, k0);
        let rb = loader_b.load(kb, self, a, &ctx, k0);
        loader_a.store(kb, a_tile, kb.index(0), pm, &ra);
        loader_b.store(kb, b_tile, kb.index(0), pn, &rb);
        kb.barrier();
        let tx = kb.rem_k(tid, (t.bn / t.tn) as i64);
        let ty = kb.div_k(tid, (t.bn / t.tn) as i64);
        let rows = Self::runs(kb, ty, t.tm, t.bm);
        let cols = Self::runs(kb, tx, t.tn, t.bn);
        let zero = kb.f32(0.0);
        let acc0 = vec![zero; t.tm * t.tn];
        let acc = kb.for_loop(kb.index(0), count, kb.index(1), &acc0, |kb, s, acc| {
            let stage = kb.rem_k(s, 2);
            let next = kb.add_k(s, 1);
            let more = kb.cmp("ult", next, count);
            // Prefetch (every thread takes the same branch).
            let k_next = kb.mul_k(kb.add(first_step, next), t.bk as i64);
            let types: Vec<_> = ra.iter().chain(&rb).map(|&v| type_of(v)).collect();
            let fetched = kb.if_else(
                more,
                &types,
                |kb| {
                    let mut v = loader_a.load(kb, self, a, &ctx, k_next);
                    v.extend(loader_b.load(kb, self, a, &ctx, k_next));
                    v
                },
                |kb| {
                    let z = kb.f32(0.0);
                    // SAFETY: live types.
                    let vector = |ty| unsafe { mlir_sys::mlirTypeIsAVector(ty) };
                    types.iter().map(|&ty| if vector(ty) { kb.splat(z, 4) } else { z }).collect()
                },
            );
            let a_at = kb.mul_k(stage, (t.bk * pm) as i64);
            let b_at = kb.mul_k(stage, (t.bk * pn) as i64);
            let mut acc = acc.to_vec();
            for kk in 0..t.bk {
                let av: Vec<V> = rows
                    .iter()
                    .map(|&r| kb.vload(a_tile, kb.add(a_at, kb.add_k(r, (kk * pm) as i64)), 4, 16))
                    .collect();
                let bv: Vec<V> = cols
                    .iter()
                    .map(|&c| kb.vload(b_tile, kb.add(b_at, kb.add_k(c, (kk * pn) as i64)), 4, 16))
                    .collect();
                let a_s: Vec<V> = av
                    .iter()
                    .flat_map(|&v| (0..4).map(move |e| (v, e)))
                    .map(|(v, e)| kb.extract(v, e))
                    .collect();
                let b_s: Vec<V> = bv
                    .iter()
                    .flat_map(|&v| (0..4).map(move |e| (v, e)))
                    .map(|(v, e)| kb.extract(v, e))
                    .collect();
                for (i, &x) in a_s.iter().enumerate() {
                    for (j, &y) in b_s.iter().enumerate() {
                        let at = i * t.tn + j;
                        acc[at] = kb.fma(x, y, acc[at]);
                    }
                }
            }
            kb.when(more, |kb| {
                let other = kb.sub(kb.index(1), stage);
                let (na, nb) = fetched.split_at(ra.len());
                loader_a.store(kb, a_tile, kb.mul_k(other, (t.bk * pm) as i64), pm, na);
                loader_b.store(kb, b_tile, kb.mul_k(other, (t.bk * pn) as i64), pn, nb);
            });
            kb.barrier();
            acc
        });
        // The results: row run ri, element i of it; column run cj, four consecutive columns.
        let mut result = Ok(());
        for (ri, &r) in rows.iter().enumerate() {
            for i in 0..4 {
                let m = kb.add(m0, kb.add_k(r, i as i64));
                for (cj, &c) in cols.iter().enumerate() {
                    let n = kb.add(n0, c);
                    let vals: Vec<V> =
                        (0..4).map(|j| acc[(ri * 4 + i) * t.tn + cj * 4 + j]).collect();
                    if let Err(e) = self.store(kb, a, graph, partial, bi, split, m, n, &vals) {
                        result = Err(e);
                    }
                }
            }
        }
        result
    }

    /// The batch offset of an operand for output batch index `b`.
    pub(super) fn batch_offset(&self, kb: &KernelBuilder, o: &Operand, b: V) -> V {
        let strides: Vec<usize> = match &o.access {
            Access::Strided { batch, .. } => batch.clone(),
            Access::Window(w) => vec![w.channels * w.height * w.width],
        };
        let dims = if matches!(o.access, Access::Window(_)) {
            vec![self.batch]
        } else {
            self.batch_dims.clone()
        };
        if dims.is_empty() {
            return kb.index(0);
        }
        let n = dims.len();
        super::tail::offset(kb, &dims, &strides, &[(b, 0, n)])
    }

    /// Stores consecutive results `vals` at row `m`, columns `n..` (those inside C); `n` is a
    /// multiple of their count.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store(
        &self,
        kb: &KernelBuilder,
        a: &Args,
        graph: &Graph,
        partial: Option<V>,
        bi: V,
        split: V,
        m: V,
        n: V,
        vals: &[V],
    ) -> crate::Result<()> {
        let row_in = kb.lt_k(m, self.m as i64);
        // A vector store when the row's length keeps every run whole and aligned.
        let whole = self.n.is_multiple_of(vals.len());
        let mut result = Ok(());
        kb.when(row_in, |kb| {
            let at_row = |kb: &KernelBuilder, j: usize| -> (V, V) {
                let col = kb.add_k(n, j as i64);
                (col, kb.lt_k(col, self.n as i64))
            };
            match partial {
                Some(p) => {
                    // Raw sums of this split: partial[split][b][m][n].
                    let base = kb.add(kb.mul_k(split, self.batch as i64), bi);
                    let row = kb.add(kb.mul_k(base, self.m as i64), m);
                    let at = kb.add(kb.mul_k(row, self.n as i64), n);
                    if whole {
                        let (_, inside) = at_row(kb, 0);
                        let v = kb.from_elements(vals);
                        kb.when(inside, |kb| kb.vstore(v, p, at, 4 * vals.len()));
                    } else {
                        for (j, &v) in vals.iter().enumerate() {
                            let (_, inside) = at_row(kb, j);
                            kb.when(inside, |kb| kb.store(v, p, kb.add_k(at, j as i64)));
                        }
                    }
                }
                None => {
                    let finished: Vec<V> = (0..vals.len())
                        .map(|j| {
                            let (col, _) = at_row(kb, j);
                            self.finish(kb, a, vals[j], m, col)
                        })
                        .collect();
                    let coords = |col: V| {
                        [
                            (bi, self.groups[0].0, self.groups[0].1),
                            (m, self.groups[1].0, self.groups[1].1),
                            (col, self.groups[2].0, self.groups[2].1),
                        ]
                    };
                    if whole {
                        let (_, inside) = at_row(kb, 0);
                        kb.when(inside, |kb| {
                            result = self.tail.store_run(kb, graph, a, &finished, &coords(n));
                        });
                    } else {
                        for (j, &v) in finished.iter().enumerate() {
                            let (col, inside) = at_row(kb, j);
                            kb.when(inside, |kb| {
                                if let Err(e) = self.tail.store(kb, graph, a, v, &coords(col)) {
                                    result = Err(e);
                                }
                            });
                        }
                    }
                }
            }
        });
        result
    }

    /// `alpha * sum + beta * C[m, n]` (Gemm), else the sum.
    fn finish(&self, kb: &KernelBuilder, a: &Args, sum: V, m: V, n: V) -> V {
        let mut v = sum;
        if self.alpha != 1.0 {
            v = kb.fop("arith.mulf", v, kb.f32(self.alpha as f64));
        }
        if let Some(c) = &self.c {
            let mem = match c.source {
                Source::Buffer(i) => a.buffers[i],
                Source::Constant(i) => a.constants[i],
            };
            let at = kb.add(kb.mul_k(m, c.strides[0] as i64), kb.mul_k(n, c.strides[1] as i64));
            // A column past the end is computed, not stored: it reads nothing.
            let inside = kb.and(kb.lt_k(m, self.m as i64), kb.lt_k(n, self.n as i64));
            let cv = kb.load_or(inside, mem, at, kb.f32(0.0));
            let cv = if c.dtype == DType::F32 {
                cv
            } else {
                kb.op1("arith.extf", &[cv], kb.f32_t(), &[])
            };
            let cv =
                if c.beta != 1.0 { kb.fop("arith.mulf", cv, kb.f32(c.beta as f64)) } else { cv };
            v = kb.fop("arith.addf", v, cv);
        }
        v
    }

    /// Split-K's second launch: a thread an output, adding the splits' partial sums.
    fn sum_kernel(&self, kb: &KernelBuilder, a: &Args, graph: &Graph) -> crate::Result<()> {
        let part = a.scratch[0];
        let total = self.batch * self.m * self.n;
        let idx = kb.add(kb.mul_k(kb.block_id(0), 256), kb.thread_id(0));
        let inside = kb.lt_k(idx, total as i64);
        let mut result = Ok(());
        kb.when(inside, |kb| {
            let zero = kb.f32(0.0);
            let s = kb.for_range(0, self.splits as i64, 1, &[zero], |kb, s, acc| {
                let at = kb.add(kb.mul_k(s, total as i64), idx);
                vec![kb.fop("arith.addf", acc[0], kb.load(part, at))]
            })[0];
            let n = kb.rem_k(idx, self.n as i64);
            let bm = kb.div_k(idx, self.n as i64);
            let m = kb.rem_k(bm, self.m as i64);
            let bi = kb.div_k(bm, self.m as i64);
            let v = self.finish(kb, a, s, m, n);
            let coords = [
                (bi, self.groups[0].0, self.groups[0].1),
                (m, self.groups[1].0, self.groups[1].1),
                (n, self.groups[2].0, self.groups[2].1),
            ];
            result = self.tail.store(kb, graph, a, v, &coords);
        });
        result
    }
}
