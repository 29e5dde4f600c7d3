//! Staging an operand's tile of a reduction step from global memory into workgroup memory, for
//! the contraction kernels on the FMA tile (`gemm.rs`) and on tensor cores (`mma.rs`): loads as
//! wide as the operand's contiguous axis allows, rounded as the arithmetic asks, stored `k`-major
//! or `k`-contiguous.

use super::builder::{type_of, Flavor, KernelBuilder, V};
use super::gemm::{Access, GemmPlan, Operand};
use super::mma::MmaKind;
use super::Args;

/// Where a launch is: its block's tile origin and the thread, and the operands' batch offsets.
pub(super) struct LoadContext {
    pub m0: V,
    pub n0: V,
    pub tid: V,
    pub a_base: V,
    pub b_base: V,
}

/// How an operand tile lies in workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileLayout {
    /// `[k][x]` (x: A's m, B's n).
    KMajor,
    /// `[x][k]`.
    KContiguous,
}

/// What is done to operands as they are stored in workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rounding {
    /// Rounded to the precision and kept as f32 (the FMA kernel's rounded operands).
    InF32(Option<MmaKind>),
    /// Converted to the tensor-core element type.
    To(MmaKind),
}

/// Copies one operand's tile of a step: `rows x cols` of the tile in `(i, j)` (A: `bm x bk`,
/// B: `bk x bn`), `vec` elements a load along the contiguous axis.
pub(super) struct Loader<'o> {
    op: &'o Operand,
    layout: TileLayout,
    rounding: Option<Rounding>,
    vec: usize,
    rows: usize,
    cols: usize,
    /// Loads a thread makes.
    per_thread: usize,
    threads: usize,
    /// A (its `i` is `m`), or B.
    is_a: bool,
    /// The axis loads run along (0: `i`, 1: `j`).
    along: usize,
}

impl<'o> Loader<'o> {
    pub(super) fn new(
        op: &'o Operand,
        vec: usize,
        rows: usize,
        cols: usize,
        threads: usize,
        is_a: bool,
    ) -> Loader<'o> {
        let along = op.contiguous().unwrap_or(1);
        let per_thread = (rows * cols / vec).div_ceil(threads);
        Loader {
            op,
            layout: TileLayout::KMajor,
            rounding: None,
            vec,
            rows,
            cols,
            per_thread,
            threads,
            is_a,
            along,
        }
    }

    pub(super) fn with_layout(
        mut self,
        layout: TileLayout,
        rounding: Option<Rounding>,
    ) -> Loader<'o> {
        self.layout = layout;
        self.rounding = rounding;
        self
    }

    /// A loaded value as the tile keeps it.
    fn convert(&self, kb: &KernelBuilder, v: V) -> V {
        match self.rounding {
            None | Some(Rounding::InF32(None)) => v,
            Some(Rounding::InF32(Some(k))) => {
                let r = k.convert(kb, v);
                if k == MmaKind::Tf32 {
                    r
                } else {
                    kb.op1("arith.extf", &[r], type_of(v), &[])
                }
            }
            Some(Rounding::To(k)) => k.convert(kb, v),
        }
    }

    /// The tile position `(i, j)` of a thread's `l`-th load.
    fn position(&self, kb: &KernelBuilder, tid: V, l: usize) -> (V, V) {
        let lin = kb.add_k(tid, (l * self.threads) as i64);
        if self.along == 1 {
            let per_row = (self.cols / self.vec) as i64;
            (kb.div_k(lin, per_row), kb.mul_k(kb.rem_k(lin, per_row), self.vec as i64))
        } else {
            let per_col = (self.rows / self.vec) as i64;
            (kb.mul_k(kb.rem_k(lin, per_col), self.vec as i64), kb.div_k(lin, per_col))
        }
    }

    /// The thread's loads of the step starting at reduction index `k0`: values (vectors of
    /// `vec`), zero outside the operand.
    pub(super) fn load(
        &self,
        kb: &KernelBuilder,
        p: &GemmPlan,
        a: &Args,
        cx: &LoadContext,
        k0: V,
    ) -> Vec<V> {
        let mem = a.buffers[self.op.input];
        let zero = if self.vec > 1 { kb.splat(kb.f32(0.0), self.vec) } else { kb.f32(0.0) };
        (0..self.per_thread)
            .map(|l| {
                let (i, j) = self.position(kb, cx.tid, l);
                // Global (row, column) of the operand: A (m, k), B (k, n).
                let (gi, gj) = if self.is_a {
                    (kb.add(cx.m0, i), kb.add(k0, j))
                } else {
                    (kb.add(k0, i), kb.add(cx.n0, j))
                };
                let (ei, ej) = if self.is_a { (p.m, p.k) } else { (p.k, p.n) };
                // Past the tile's last load (a thread count that does not divide the tile).
                let lin = kb.add_k(cx.tid, (l * self.threads) as i64);
                let live = kb.lt_k(lin, (self.rows * self.cols / self.vec) as i64);
                let inside = kb.and(live, kb.and(kb.lt_k(gi, ei as i64), kb.lt_k(gj, ej as i64)));
                let base = if self.is_a { cx.a_base } else { cx.b_base };
                match &self.op.access {
                    Access::Strided { rows, cols, .. } => {
                        let at = kb.add(
                            base,
                            kb.add(kb.mul_k(gi, *rows as i64), kb.mul_k(gj, *cols as i64)),
                        );
                        let t = type_of(zero);
                        kb.if_else(
                            inside,
                            &[t],
                            |kb| {
                                vec![if self.vec > 1 {
                                    kb.vload(mem, at, self.vec, 4 * self.vec)
                                } else {
                                    kb.load(mem, at)
                                }]
                            },
                            |_| vec![zero],
                        )[0]
                    }
                    Access::Window(w) => {
                        // k = (c, r, s), n = (oy, ox); the input at (c, oy * sh - ph + r * dh, ...).
                        let taps = w.kernel[0] * w.kernel[1];
                        let c = kb.div_k(gi, taps as i64);
                        let rs = kb.rem_k(gi, taps as i64);
                        let (r, s) =
                            (kb.div_k(rs, w.kernel[1] as i64), kb.rem_k(rs, w.kernel[1] as i64));
                        let (oy, ox) =
                            (kb.div_k(gj, w.out_width as i64), kb.rem_k(gj, w.out_width as i64));
                        // Signed positions as unsigned: left of the image wraps past its end.
                        let y = kb.sub(
                            kb.add(
                                kb.mul_k(oy, w.stride[0] as i64),
                                kb.mul_k(r, w.dilation[0] as i64),
                            ),
                            kb.index(w.pad[0] as i64),
                        );
                        let x = kb.sub(
                            kb.add(
                                kb.mul_k(ox, w.stride[1] as i64),
                                kb.mul_k(s, w.dilation[1] as i64),
                            ),
                            kb.index(w.pad[1] as i64),
                        );
                        let in_image =
                            kb.and(kb.lt_k(y, w.height as i64), kb.lt_k(x, w.width as i64));
                        let ok = kb.and(inside, in_image);
                        let at = kb.add(
                            base,
                            kb.add(
                                kb.mul_k(c, (w.height * w.width) as i64),
                                kb.add(kb.mul_k(y, w.width as i64), x),
                            ),
                        );
                        kb.load_or(ok, mem, at, zero)
                    }
                }
            })
            .collect()
    }

    /// Stores loaded values into the workgroup tile at `base` (row pitch `pitch`): `[k][x]` or
    /// `[x][k]` (x: A's m, B's n), converted as the tile keeps them.
    pub(super) fn store(&self, kb: &KernelBuilder, tile: V, base: V, pitch: usize, vals: &[V]) {
        let tid = kb.thread_id(0);
        for (l, &v) in vals.iter().enumerate() {
            let (i, j) = self.position(kb, tid, l);
            // The tile's (k, x) with x = m for A, n for B; whether the load ran along x.
            let (kk, x, x_along) =
                if self.is_a { (j, i, self.along == 0) } else { (i, j, self.along == 1) };
            let lin = kb.add_k(tid, (l * self.threads) as i64);
            let live = kb.lt_k(lin, (self.rows * self.cols / self.vec) as i64);
            kb.when(live, |kb| {
                let (at, step_k, step_x) = match self.layout {
                    TileLayout::KMajor => {
                        (kb.add(base, kb.add(kb.mul_k(kk, pitch as i64), x)), pitch, 1)
                    }
                    TileLayout::KContiguous => {
                        (kb.add(base, kb.add(kb.mul_k(x, pitch as i64), kk)), 1, pitch)
                    }
                };
                // The vector runs along x or k; it is one store where that is the tile's
                // contiguous axis (and vectors of converted 16-bit values are NVIDIA's only:
                // OpenCL's SPIR-V 1.0 has no bf16).
                let step = if x_along { step_x } else { step_k };
                let wide = self.rounding.is_none_or(|r| !matches!(r, Rounding::To(_)))
                    || kb.flavor == Flavor::Nvvm;
                if self.vec > 1 && step == 1 && wide {
                    let c = self.convert(kb, v);
                    let bytes = self.vec
                        * if matches!(self.rounding, Some(Rounding::To(k)) if k != MmaKind::Tf32) {
                            2
                        } else {
                            4
                        };
                    kb.vstore(c, tile, at, bytes);
                } else if self.vec == 1 {
                    kb.store(self.convert(kb, v), tile, at);
                } else {
                    for e in 0..self.vec {
                        let x = self.convert(kb, kb.extract(v, e));
                        kb.store(x, tile, kb.add_k(at, (e * step) as i64));
                    }
                }
            });
        }
    }
}
