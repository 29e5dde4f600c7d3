//! Contractions on tensor cores: the GEMM of `gemm.rs` with its block's work split over warps,
//! each warp computing a `wm x wn` part of the block tile as 16 x 8 pieces with `mma.sync`
//! (`nvgpu.mma.sync`: m16n8k8 on TF32, m16n8k16 on bf16 or f16, f32 sums). The operand tiles
//! are staged in workgroup memory as `gemm.rs` stages them (double-buffered, one barrier a step),
//! rounded to the precision as they are stored; TF32 keeps A `k`-major and bf16/f16 keep both
//! operands `k`-contiguous, with rows padded so that the 32 lanes' fragment reads hit 32
//! different banks. Each lane's fragment elements are where PTX's `mma` layout puts them:
//! lane = 4 g + t holds rows g and g + 8, columns (k) t and t + 4 (TF32) or 2t, 2t + 1, 2t + 8,
//! 2t + 9 (16-bit), and results at rows g and g + 8, columns 2t and 2t + 1.
//!
//! OpenCL has no matrix instruction: there (for tests, `KILN_GPU_SCHEDULE=tensor-core`) each
//! warp's fragments are written to workgroup memory at those positions and every lane computes
//! its four results from them, so the fragment indexing is checked against the interpreter on
//! any machine.

use kiln_ir::{DType, Graph};

use super::builder::{type_of, Flavor, KernelBuilder, V, WARP};
use super::gemm::GemmPlan;
use super::load::{LoadContext, Loader, Rounding, TileLayout};
use super::reduce::trips;
use super::Args;
use crate::Precision;

/// The tensor-core arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaKind {
    Tf32,
    Bf16,
    F16,
}

impl MmaKind {
    pub fn of(p: Precision) -> Option<MmaKind> {
        match p {
            Precision::F32 => None,
            Precision::Tf32 => Some(MmaKind::Tf32),
            Precision::Bf16 => Some(MmaKind::Bf16),
            Precision::F16 => Some(MmaKind::F16),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MmaKind::Tf32 => "tf32",
            MmaKind::Bf16 => "bf16",
            MmaKind::F16 => "f16",
        }
    }

    /// The reduction length of one `mma`.
    pub fn k(self) -> usize {
        match self {
            MmaKind::Tf32 => 8,
            _ => 16,
        }
    }

    /// The element type operand tiles are kept in.
    pub fn dtype(self) -> DType {
        match self {
            MmaKind::Tf32 => DType::F32,
            MmaKind::Bf16 => DType::BF16,
            MmaKind::F16 => DType::F16,
        }
    }

    /// `v` (f32, scalar or vector) in this precision: TF32 rounded to nearest even in an f32
    /// (the tensor core ignores the 13 low bits), bf16 and f16 converted.
    pub fn convert(self, kb: &KernelBuilder, v: V) -> V {
        let t = type_of(v);
        // SAFETY: a live type.
        let lanes = unsafe {
            mlir_sys::mlirTypeIsAVector(t)
                .then(|| mlir_sys::mlirShapedTypeGetDimSize(t, 0) as usize)
        };
        let of = |e| lanes.map_or(e, |n| kb.vector_t(n, e));
        let splat = |x| lanes.map_or(x, |n| kb.splat(x, n));
        match self {
            MmaKind::Tf32 => {
                let i32t = of(kb.int_t(32));
                let bits = kb.op1("arith.bitcast", &[v], i32t, &[]);
                let lsb = kb.op1("arith.shrui", &[bits, splat(kb.int(13, 32))], i32t, &[]);
                let lsb = kb.op1("arith.andi", &[lsb, splat(kb.int(1, 32))], i32t, &[]);
                let up = kb.op1("arith.addi", &[bits, splat(kb.int(0xfff, 32))], i32t, &[]);
                let up = kb.op1("arith.addi", &[up, lsb], i32t, &[]);
                let kept = kb.op1(
                    "arith.andi",
                    &[up, splat(kb.int(0xffff_e000u32 as i32 as i64, 32))],
                    i32t,
                    &[],
                );
                kb.op1("arith.bitcast", &[kept], t, &[])
            }
            MmaKind::Bf16 => kb.op1("arith.truncf", &[v], of(bf16_t(kb)), &[]),
            MmaKind::F16 => kb.op1("arith.truncf", &[v], of(f16_t(kb)), &[]),
        }
    }

    fn elem(self, kb: &KernelBuilder) -> mlir_sys::MlirType {
        match self {
            MmaKind::Tf32 => kb.f32_t(),
            MmaKind::Bf16 => bf16_t(kb),
            MmaKind::F16 => f16_t(kb),
        }
    }
}

fn bf16_t(kb: &KernelBuilder) -> mlir_sys::MlirType {
    use melior::ir::TypeLike;
    melior::ir::Type::bfloat16(kb.ctx).to_raw()
}

fn f16_t(kb: &KernelBuilder) -> mlir_sys::MlirType {
    use melior::ir::TypeLike;
    melior::ir::Type::float16(kb.ctx).to_raw()
}

/// A tensor-core tile: the block's `bm x bn`, `bk` a step, each warp `wm x wn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaTile {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub wm: usize,
    pub wn: usize,
}

impl MmaTile {
    pub fn warps(&self) -> usize {
        (self.bm / self.wm) * (self.bn / self.wn)
    }

    pub fn threads(&self) -> usize {
        self.warps() * WARP
    }

    /// Workgroup-memory row pitches (elements) of the A and B tiles: TF32 keeps `[k][m]` and
    /// `[k][n]`, the 16-bit kinds `[m][k]` and `[n][k]`; padded by 8 so a warp's fragment
    /// reads hit distinct banks.
    fn pitches(&self, kind: MmaKind) -> (usize, usize) {
        match kind {
            MmaKind::Tf32 => (self.bm + 8, self.bn + 8),
            _ => (self.bk + 8, self.bk + 8),
        }
    }

    /// Elements of one stage of the A and B tiles.
    fn stage(&self, kind: MmaKind) -> (usize, usize) {
        let (pa, pb) = self.pitches(kind);
        match kind {
            MmaKind::Tf32 => (self.bk * pa, self.bk * pb),
            _ => (self.bm * pa, self.bn * pb),
        }
    }

    /// Workgroup-memory bytes, both stages, both operands.
    pub fn bytes(&self, kind: MmaKind) -> usize {
        let (a, b) = self.stage(kind);
        2 * (a + b) * kind.dtype().size()
    }
}

/// The tiles: 128 x 128 (8 warps of 64 x 32) and 64 x 64 (4 warps of 32 x 32); a step is two
/// or four `mma` reductions long. Both keep under 48 KB of workgroup memory (NVIDIA's static
/// limit) and the small one under OpenCL's 32 KB with the emulation's scratch.
pub fn tile(kind: MmaKind, large: bool) -> MmaTile {
    let bk = match kind {
        MmaKind::Tf32 => 16,
        _ => 32,
    };
    if large {
        MmaTile { bm: 128, bn: 128, bk, wm: 64, wn: 32 }
    } else {
        MmaTile { bm: 64, bn: 64, bk, wm: 32, wn: 32 }
    }
}

/// Where a lane is: its warp's place in the block tile and its fragment coordinates.
struct Lane {
    warp: V,
    g: V,
    t: V,
    wm0: V,
    wn0: V,
}

impl GemmPlan {
    /// The tensor-core kernel; with `partial`, it stores its split's raw sums there.
    pub(super) fn mma_kernel(
        &self,
        kb: &KernelBuilder,
        a: &Args,
        graph: &Graph,
        kind: MmaKind,
        tl: MmaTile,
        partial: Option<V>,
    ) -> crate::Result<()> {
        let threads = tl.threads();
        let (pa, pb) = tl.pitches(kind);
        let (sa, sb) = tl.stage(kind);
        let tid = kb.thread_id(0);
        let n0 = kb.mul_k(kb.block_id(0), tl.bn as i64);
        let m0 = kb.mul_k(kb.block_id(1), tl.bm as i64);
        let z = kb.block_id(2);
        let (bi, split) = if self.splits > 1 {
            (kb.div_k(z, self.splits as i64), kb.rem_k(z, self.splits as i64))
        } else {
            (z, kb.index(0))
        };
        let steps = self.k.div_ceil(tl.bk);
        let chunk = steps.div_ceil(self.splits);
        let first_step = kb.mul_k(split, chunk as i64);
        let end_step = kb.min(kb.add_k(first_step, chunk as i64), kb.index(steps as i64));
        let count = trips(kb, first_step, end_step, 1);
        let elem = kind.elem(kb);
        let a_tile = kb.shared(2 * sa, elem);
        let b_tile = kb.shared(2 * sb, elem);
        let layout =
            if kind == MmaKind::Tf32 { TileLayout::KMajor } else { TileLayout::KContiguous };
        let loader_a = Loader::new(&self.a, self.vec_a, tl.bm, tl.bk, threads, true)
            .with_layout(layout, Some(Rounding::To(kind)));
        let loader_b = Loader::new(&self.b, self.vec_b, tl.bk, tl.bn, threads, false)
            .with_layout(layout, Some(Rounding::To(kind)));
        let ctx = LoadContext {
            m0,
            n0,
            tid,
            a_base: self.batch_offset(kb, &self.a, bi),
            b_base: self.batch_offset(kb, &self.b, bi),
        };
        let k0 = kb.mul_k(first_step, tl.bk as i64);
        let ra = loader_a.load(kb, self, a, &ctx, k0);
        let rb = loader_b.load(kb, self, a, &ctx, k0);
        loader_a.store(kb, a_tile, kb.index(0), pa, &ra);
        loader_b.store(kb, b_tile, kb.index(0), pb, &rb);
        kb.barrier();
        let warp = kb.div_k(tid, WARP as i64);
        let lane_id = kb.rem_k(tid, WARP as i64);
        let per_row = (tl.bn / tl.wn) as i64;
        let lane = Lane {
            warp,
            g: kb.div_k(lane_id, 4),
            t: kb.rem_k(lane_id, 4),
            wm0: kb.mul_k(kb.div_k(warp, per_row), tl.wm as i64),
            wn0: kb.mul_k(kb.rem_k(warp, per_row), tl.wn as i64),
        };
        // The OpenCL emulation's exchange: per warp, A's 16 x k and B's k x 8 (as f32).
        let kk = kind.k();
        let scratch = (kb.flavor == Flavor::Spirv)
            .then(|| kb.shared(tl.warps() * (16 * kk + kk * 8), kb.f32_t()));
        let (mi, ni) = (tl.wm / 16, tl.wn / 8);
        let zero = kb.f32(0.0);
        let acc0 = vec![zero; mi * ni * 4];
        let acc = kb.for_loop(kb.index(0), count, kb.index(1), &acc0, |kb, s, acc| {
            let stage = kb.rem_k(s, 2);
            let next = kb.add_k(s, 1);
            let more = kb.cmp("ult", next, count);
            let k_next = kb.mul_k(kb.add(first_step, next), tl.bk as i64);
            let types: Vec<_> = ra.iter().chain(&rb).map(|&v| type_of(v)).collect();
            let fetched = kb.if_else(
                more,
                &types,
                |kb| {
                    let mut v = loader_a.load(kb, self, a, &ctx, k_next);
                    v.extend(loader_b.load(kb, self, a, &ctx, k_next));
                    v
                },
                |kb| types.iter().map(|&ty| zero_of(kb, ty)).collect(),
            );
            let a_at = kb.mul_k(stage, sa as i64);
            let b_at = kb.mul_k(stage, sb as i64);
            let mut acc = acc.to_vec();
            for ks in 0..tl.bk / kk {
                let af: Vec<Vec<V>> = (0..mi)
                    .map(|i| a_fragment(kb, kind, a_tile, a_at, pa, &lane, i, ks * kk))
                    .collect();
                let bf: Vec<Vec<V>> = (0..ni)
                    .map(|j| b_fragment(kb, kind, b_tile, b_at, pb, &lane, j, ks * kk))
                    .collect();
                for (i, a_frag) in af.iter().enumerate() {
                    for (j, b_frag) in bf.iter().enumerate() {
                        let at = (i * ni + j) * 4;
                        let c = [acc[at], acc[at + 1], acc[at + 2], acc[at + 3]];
                        let d = mma(kb, kind, a_frag, b_frag, c, scratch, &lane);
                        acc[at..at + 4].copy_from_slice(&d);
                    }
                }
            }
            kb.when(more, |kb| {
                let other = kb.sub(kb.index(1), stage);
                let (na, nb) = fetched.split_at(ra.len());
                loader_a.store(kb, a_tile, kb.mul_k(other, sa as i64), pa, na);
                loader_b.store(kb, b_tile, kb.mul_k(other, sb as i64), pb, nb);
            });
            kb.barrier();
            acc
        });
        let mut result = Ok(());
        for i in 0..mi {
            for j in 0..ni {
                let at = (i * ni + j) * 4;
                let row = kb.add(m0, kb.add(lane.wm0, kb.add_k(lane.g, (i * 16) as i64)));
                let col =
                    kb.add(n0, kb.add(lane.wn0, kb.add_k(kb.mul_k(lane.t, 2), (j * 8) as i64)));
                for (half, r) in [(0, row), (2, kb.add_k(row, 8))] {
                    let vals = [acc[at + half], acc[at + half + 1]];
                    if let Err(e) = self.store(kb, a, graph, partial, bi, split, r, col, &vals) {
                        result = Err(e);
                    }
                }
            }
        }
        result
    }
}

/// Zero of a loaded value's type (scalar or vector f32).
fn zero_of(kb: &KernelBuilder, t: mlir_sys::MlirType) -> V {
    let z = kb.f32(0.0);
    // SAFETY: a live type.
    if unsafe { mlir_sys::mlirTypeIsAVector(t) } {
        kb.splat(z, unsafe { mlir_sys::mlirShapedTypeGetDimSize(t, 0) } as usize)
    } else {
        z
    }
}

/// Two consecutive 16-bit elements from `at` (a 32-bit load on NVIDIA).
fn pair(kb: &KernelBuilder, tile: V, at: V) -> [V; 2] {
    if kb.flavor == Flavor::Nvvm {
        let v = kb.vload(tile, at, 2, 4);
        [kb.extract(v, 0), kb.extract(v, 1)]
    } else {
        [kb.load(tile, at), kb.load(tile, kb.add_k(at, 1))]
    }
}

/// The lane's A fragment of m-piece `i` at step offset `k0`.
#[allow(clippy::too_many_arguments)]
fn a_fragment(
    kb: &KernelBuilder,
    kind: MmaKind,
    tile: V,
    base: V,
    pitch: usize,
    l: &Lane,
    i: usize,
    k0: usize,
) -> Vec<V> {
    let r = kb.add(l.wm0, kb.add_k(l.g, (i * 16) as i64));
    match kind {
        MmaKind::Tf32 => {
            // [k][m]: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
            let k = kb.add_k(l.t, k0 as i64);
            let at = |dk: i64, dm: i64| {
                kb.add(base, kb.add(kb.mul_k(kb.add_k(k, dk), pitch as i64), kb.add_k(r, dm)))
            };
            vec![
                kb.load(tile, at(0, 0)),
                kb.load(tile, at(0, 8)),
                kb.load(tile, at(4, 0)),
                kb.load(tile, at(4, 8)),
            ]
        }
        _ => {
            // [m][k]: rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9.
            let k = kb.add_k(kb.mul_k(l.t, 2), k0 as i64);
            let at = |dm: i64, dk: i64| {
                kb.add(base, kb.add(kb.mul_k(kb.add_k(r, dm), pitch as i64), kb.add_k(k, dk)))
            };
            let mut out = Vec::with_capacity(8);
            for (dm, dk) in [(0, 0), (8, 0), (0, 8), (8, 8)] {
                out.extend(pair(kb, tile, at(dm, dk)));
            }
            out
        }
    }
}

/// The lane's B fragment of n-piece `j` at step offset `k0`.
#[allow(clippy::too_many_arguments)]
fn b_fragment(
    kb: &KernelBuilder,
    kind: MmaKind,
    tile: V,
    base: V,
    pitch: usize,
    l: &Lane,
    j: usize,
    k0: usize,
) -> Vec<V> {
    let c = kb.add(l.wn0, kb.add_k(l.g, (j * 8) as i64));
    match kind {
        MmaKind::Tf32 => {
            // [k][n]: (t, g), (t + 4, g).
            let k = kb.add_k(l.t, k0 as i64);
            let at = |dk: i64| kb.add(base, kb.add(kb.mul_k(kb.add_k(k, dk), pitch as i64), c));
            vec![kb.load(tile, at(0)), kb.load(tile, at(4))]
        }
        _ => {
            // [n][k]: column g, rows 2t, 2t + 1 and 2t + 8, 2t + 9.
            let k = kb.add_k(kb.mul_k(l.t, 2), k0 as i64);
            let at = |dk: i64| kb.add(base, kb.add(kb.mul_k(c, pitch as i64), kb.add_k(k, dk)));
            let mut out = Vec::with_capacity(4);
            out.extend(pair(kb, tile, at(0)));
            out.extend(pair(kb, tile, at(8)));
            out
        }
    }
}

/// One `mma`: `c + a b` for the warp, each lane giving its fragments and getting its four
/// results.
fn mma(
    kb: &KernelBuilder,
    kind: MmaKind,
    a: &[V],
    b: &[V],
    c: [V; 4],
    scratch: Option<V>,
    l: &Lane,
) -> [V; 4] {
    match scratch {
        // nvgpu's lowering deduces no PTX type for bf16: the NVVM op, given packed pairs.
        None if kind == MmaKind::Bf16 => {
            let i32t = kb.int_t(32);
            let pack = |xs: &[V]| -> Vec<V> {
                xs.chunks(2)
                    .map(|p| {
                        let v = kb.from_elements(p);
                        let w = kb.op1("vector.bitcast", &[v], kb.vector_t(1, i32t), &[]);
                        kb.extract(w, 0)
                    })
                    .collect()
            };
            let mut operands = pack(a);
            operands.extend(pack(b));
            operands.extend_from_slice(&c);
            let parse =
                |s: &str| melior::ir::Attribute::parse(kb.ctx, s).expect("an NVVM attribute");
            let st = melior::ir::Type::parse(kb.ctx, "!llvm.struct<(f32, f32, f32, f32)>")
                .expect("an LLVM struct type");
            use melior::ir::TypeLike;
            let d = kb.op1(
                "nvvm.mma.sync",
                &operands,
                st.to_raw(),
                &[
                    ("layoutA", parse("#nvvm.mma_layout<row>")),
                    ("layoutB", parse("#nvvm.mma_layout<col>")),
                    ("shape", parse("#nvvm.shape<m = 16, n = 8, k = 16>")),
                    ("multiplicandAPtxType", parse("#nvvm.mma_type<bf16>")),
                    ("multiplicandBPtxType", parse("#nvvm.mma_type<bf16>")),
                    ("operandSegmentSizes", parse("array<i32: 4, 2, 4>")),
                ],
            );
            let field = |i: i64| {
                let pos = melior::ir::attribute::DenseI64ArrayAttribute::new(kb.ctx, &[i]);
                kb.op1("llvm.extractvalue", &[d], kb.f32_t(), &[("position", pos.into())])
            };
            [field(0), field(1), field(2), field(3)]
        }
        None => {
            let f32t = kb.f32_t();
            let (at, bt, shape, k) = match kind {
                MmaKind::Tf32 => {
                    (kb.vector2_t(4, 1, f32t), kb.vector2_t(2, 1, f32t), "[16, 8, 8]", true)
                }
                _ => {
                    let e = kind.elem(kb);
                    (kb.vector2_t(4, 2, e), kb.vector2_t(2, 2, e), "[16, 8, 16]", false)
                }
            };
            let ct = kb.vector2_t(2, 2, f32t);
            let av = kb.op1("vector.from_elements", a, at, &[]);
            let bv = kb.op1("vector.from_elements", b, bt, &[]);
            let cv = kb.op1("vector.from_elements", &c, ct, &[]);
            let shape_attr =
                melior::ir::Attribute::parse(kb.ctx, shape).expect("an array of integers");
            let mut attrs = vec![("mmaShape", shape_attr)];
            if k {
                attrs.push(("tf32Enabled", melior::ir::Attribute::unit(kb.ctx)));
            }
            let d = kb.op1("nvgpu.mma.sync", &[av, bv, cv], ct, &attrs);
            [
                extract2(kb, d, 0, 0),
                extract2(kb, d, 0, 1),
                extract2(kb, d, 1, 0),
                extract2(kb, d, 1, 1),
            ]
        }
        Some(mem) => emulated_mma(kb, kind, a, b, c, mem, l),
    }
}

fn extract2(kb: &KernelBuilder, v: V, i: i64, j: i64) -> V {
    let pos = melior::ir::attribute::DenseI64ArrayAttribute::new(kb.ctx, &[i, j]);
    kb.op1("vector.extract", &[v], kb.f32_t(), &[("static_position", pos.into())])
}

/// Where a fragment element lies relative to its lane's (g, t): row offset, column offset,
/// and whether the lane's index along the reduction is 2t (16-bit kinds) rather than t.
type Place = (i64, i64, bool);

/// The `mma` in workgroup memory (OpenCL): each lane writes its A and B fragment elements at
/// their places in the warp's 16 x k and k x 8 matrices; then each computes its four results.
fn emulated_mma(
    kb: &KernelBuilder,
    kind: MmaKind,
    a: &[V],
    b: &[V],
    c: [V; 4],
    mem: V,
    l: &Lane,
) -> [V; 4] {
    let k = kind.k();
    let base = kb.mul_k(l.warp, (16 * k + k * 8) as i64);
    let bbase = kb.add_k(base, (16 * k) as i64);
    let f32v = |kb: &KernelBuilder, v: V| {
        if kind == MmaKind::Tf32 {
            v
        } else {
            kb.op1("arith.extf", &[v], kb.f32_t(), &[])
        }
    };
    // Each fragment element's (row offset, column offset, whether the lane's index counts 2t
    // instead of t) in the matrix, from (g, t).
    let (a_places, b_places): (Vec<Place>, Vec<Place>) = match kind {
        MmaKind::Tf32 => (
            vec![(0, 0, false), (8, 0, false), (0, 4, false), (8, 4, false)],
            vec![(0, 0, false), (4, 0, false)],
        ),
        _ => (
            vec![
                (0, 0, true),
                (0, 1, true),
                (8, 0, true),
                (8, 1, true),
                (0, 8, true),
                (0, 9, true),
                (8, 8, true),
                (8, 9, true),
            ],
            vec![(0, 0, true), (1, 0, true), (8, 0, true), (9, 0, true)],
        ),
    };
    let t2 = kb.mul_k(l.t, 2);
    for (&v, &(dr, dc, twice)) in a.iter().zip(&a_places) {
        // A: row g + dr, column (t or 2t) + dc.
        let col = kb.add_k(if twice { t2 } else { l.t }, dc);
        let row = kb.add_k(l.g, dr);
        let at = kb.add(base, kb.add(kb.mul_k(row, k as i64), col));
        kb.store(f32v(kb, v), mem, at);
    }
    for (&v, &(dr, dc, twice)) in b.iter().zip(&b_places) {
        // B: row (t or 2t) + dr (its k), column g + dc.
        let row = kb.add_k(if twice { t2 } else { l.t }, dr);
        let col = kb.add_k(l.g, dc);
        let at = kb.add(bbase, kb.add(kb.mul_k(row, 8), col));
        kb.store(f32v(kb, v), mem, at);
    }
    kb.barrier();
    let places = [(0, 0), (0, 1), (8, 0), (8, 1)];
    let mut out = [c[0]; 4];
    for (e, &(dr, dc)) in places.iter().enumerate() {
        let row = kb.add_k(l.g, dr);
        let col = kb.add_k(t2, dc);
        let mut s = c[e];
        for kk in 0..k as i64 {
            let x = kb.load(mem, kb.add(base, kb.add_k(kb.mul_k(row, k as i64), kk)));
            let y = kb.load(mem, kb.add(bbase, kb.add(kb.index(kk * 8), col)));
            s = kb.fma(x, y, s);
        }
        out[e] = s;
    }
    kb.barrier();
    out
}
