//! Row kernels: Softmax, LogSoftmax, LayerNormalization and RMSNormalization over trailing axes,
//! viewed as `[rows, len]`.
//!
//! A warp takes a row up to 1024 long (eight rows a block), a block of 256 threads a longer one.
//! Up to 32 elements a thread, the row stays in registers: it is read once, its statistics (the
//! maximum and the sum of exponentials; the mean and then the variance of the differences from it;
//! the mean square) combined across the warp or block, and each result stored from the registers
//! (one read and one write of the row). Longer rows are read again for each statistic: softmax's
//! maximum and sum in one pass (an online sum, rescaled as the maximum grows), then the results.
//! Loads and stores are 128 bits wide where the row length allows.

use kiln_ir::{normalize_axis, DType, Graph, Op, ValueId};

use super::builder::{KernelBuilder, V, WARP};
use super::exchange::{Combine, Exchange};
use super::reduce::{f32_computed, load_f32, trips, vector_width};
use super::tail::{broadcast_strides, contiguous_strides, offset, source_of, Source, Tail};
use super::{Args, BuildContext, TileTarget, BLOCK};
use crate::fuse::Kernel;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOp {
    Softmax,
    LogSoftmax,
    LayerNorm { epsilon: f32 },
    RmsNorm { epsilon: f32 },
}

impl RowOp {
    fn name(self) -> &'static str {
        match self {
            RowOp::Softmax => "Softmax",
            RowOp::LogSoftmax => "LogSoftmax",
            RowOp::LayerNorm { .. } => "LayerNormalization",
            RowOp::RmsNorm { .. } => "RMSNormalization",
        }
    }
}

/// A normalisation's scale or bias: read along the row (the same for every row).
#[derive(Clone, Debug)]
pub struct Affine {
    pub value: ValueId,
    pub dtype: DType,
    pub source: Source,
    /// Element strides over the row's dimensions (0: broadcast).
    pub strides: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct RowsPlan {
    pub op: RowOp,
    pub rows: usize,
    pub len: usize,
    /// The row's own dimensions (the normalised axes).
    pub row_dims: Vec<usize>,
    pub dtype: DType,
    pub input: usize,
    pub vec: usize,
    /// A warp a row (else a block).
    pub warp: bool,
    /// The row stays in registers (else it is read once a statistic).
    pub cached: bool,
    pub scale: Option<Affine>,
    pub bias: Option<Affine>,
    pub tail: Tail,
}

/// The longest row a warp takes.
const WARP_ROW: usize = 1024;
/// Vectors a thread keeps in registers at most.
const CACHED: usize = 8;

pub fn plan(t: &TileTarget, graph: &Graph, kernel: &Kernel) -> Option<RowsPlan> {
    let tail = Tail::of(graph, kernel)?;
    let root = tail.root;
    let operands = graph.operands(root);
    let x = operands.first().copied().flatten()?;
    let input = kernel.inputs.iter().position(|&v| v == x)?;
    let xt = graph.value_type(x);
    let xd = xt.shape.as_fixed()?;
    if !f32_computed(xt.dtype) || xd.iter().product::<usize>() == 0 {
        return None;
    }
    let rank = xd.len();
    let (op, first) = match graph.node(root).op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let a = normalize_axis(axis, rank)?;
            // One axis: a row only when everything after it has extent 1.
            if xd[a + 1..].iter().any(|&d| d != 1) {
                return None;
            }
            let op = if matches!(graph.node(root).op, Op::Softmax { .. }) {
                RowOp::Softmax
            } else {
                RowOp::LogSoftmax
            };
            (op, a)
        }
        Op::LayerNorm { axis, epsilon } => {
            (RowOp::LayerNorm { epsilon }, normalize_axis(axis, rank)?)
        }
        Op::RmsNorm { axis, epsilon } => (RowOp::RmsNorm { epsilon }, normalize_axis(axis, rank)?),
        _ => return None,
    };
    let rows: usize = xd[..first].iter().product();
    let len: usize = xd[first..].iter().product();
    let row_dims = xd[first..].to_vec();
    let mut constants = tail.constant_values().len();
    let mut affine = |i: usize| -> Option<Option<Affine>> {
        let Some(v) = operands.get(i).copied().flatten() else { return Some(None) };
        let vt = graph.value_type(v);
        if !f32_computed(vt.dtype) {
            return None;
        }
        let strides = broadcast_strides(&vt.shape.as_fixed()?, &xd)?;
        // The same for every row.
        if strides[..first].iter().any(|&s| s != 0) {
            return None;
        }
        let source = source_of(graph, kernel, v, &mut constants)?;
        Some(Some(Affine { value: v, dtype: vt.dtype, source, strides: strides[first..].to_vec() }))
    };
    let (scale, bias) = match op {
        RowOp::Softmax | RowOp::LogSoftmax => (None, None),
        RowOp::LayerNorm { .. } => (Some(affine(1)??), affine(2)?),
        RowOp::RmsNorm { .. } => (Some(affine(1)??), None),
    };
    let w = vector_width(xt.dtype);
    let vec = if len.is_multiple_of(w) { w } else { 1 };
    let bytes = rows * len * xt.dtype.size();
    let warp = len <= WARP_ROW && (bytes <= 1 << 20 || rows * WARP >= t.min_threads());
    let threads = if warp { WARP } else { BLOCK };
    let cached = len.div_ceil(threads * vec) <= CACHED;
    Some(RowsPlan {
        op,
        rows,
        len,
        row_dims,
        dtype: xt.dtype,
        input,
        vec,
        warp,
        cached,
        scale,
        bias,
        tail,
    })
}

/// One vector (or element) of a thread's share of the row: its position in the row, its value
/// in f32, and whether it lies in the row (`None`: it does for every thread).
struct Piece {
    at: V,
    x: V,
    valid: Option<V>,
}

impl RowsPlan {
    pub fn describe(&self, graph: &Graph) -> String {
        let form = if self.warp {
            format!("a warp a row, {} rows a block", BLOCK / WARP)
        } else {
            format!("a block of {BLOCK} a row")
        };
        let reads = if self.cached { "the row in registers" } else { "the row read per statistic" };
        format!(
            "tile rows: {} [{} x {}] ({}, {}-wide loads), {form}, {reads}{}",
            self.op.name(),
            self.rows,
            self.len,
            self.dtype,
            self.vec,
            self.tail.describe(graph)
        )
    }

    /// The plan's constants beyond the tail's, in `Source::Constant` order.
    pub fn constants(&self) -> Vec<ValueId> {
        let mut out = self.tail.constant_values();
        for a in [&self.scale, &self.bias].into_iter().flatten() {
            if matches!(a.source, Source::Constant(_)) {
                out.push(a.value);
            }
        }
        out
    }

    pub fn build(&self, cx: &mut BuildContext) -> crate::Result<()> {
        let graph = cx.graph;
        let per_block = if self.warp { BLOCK / WARP } else { 1 };
        let grid = [self.rows.div_ceil(per_block) as u32, 1, 1];
        cx.launch("rows", grid, [BLOCK as u32, 1, 1], &[], |kb, a| self.kernel(kb, a, graph))
    }

    fn threads(&self) -> usize {
        if self.warp {
            WARP
        } else {
            BLOCK
        }
    }

    /// The thread's elements, `vec` at a time: (first, step, trips).
    fn share(&self) -> (usize, usize) {
        let step = self.threads() * self.vec;
        (step, self.len.div_ceil(step))
    }

    fn combine(&self, kb: &KernelBuilder, ex: &Exchange, c: Combine, v: V, tid: V) -> V {
        if self.warp {
            ex.warp(kb, c, v, tid)
        } else {
            ex.block(kb, c, v, tid)
        }
    }

    /// `v` (scalar or vector) reduced over the thread's lanes, then over the row's threads.
    fn row_total(&self, kb: &KernelBuilder, ex: &Exchange, c: Combine, v: V, tid: V) -> V {
        let s = if self.vec > 1 { c.lanes(kb, v, self.vec) } else { v };
        self.combine(kb, ex, c, s, tid)
    }

    fn kernel(&self, kb: &KernelBuilder, a: &Args, graph: &Graph) -> crate::Result<()> {
        let x = a.buffers[self.input];
        let ex = Exchange::new(kb, BLOCK);
        let tid = kb.thread_id(0);
        let (row, first) = if self.warp {
            let warp = kb.div_k(tid, WARP as i64);
            let row = kb.add(kb.mul_k(kb.block_id(0), (BLOCK / WARP) as i64), warp);
            (row, kb.mul_k(kb.rem_k(tid, WARP as i64), self.vec as i64))
        } else {
            (kb.block_id(0), kb.mul_k(tid, self.vec as i64))
        };
        // A row past the end (the last block's extra warps) reads the last row and stores
        // nothing: every thread takes part in the exchanges.
        let valid_row = kb.lt_k(row, self.rows as i64);
        let r = kb.min(row, kb.index(self.rows as i64 - 1));
        let base = kb.mul_k(r, self.len as i64);
        let cx = RowContext { a, graph, row, valid_row, base, first };
        if self.cached {
            self.cached_row(kb, &ex, x, tid, &cx)
        } else {
            self.streamed_row(kb, &ex, x, tid, &cx)
        }
    }

    /// The row in registers: every piece loaded once.
    fn cached_row(
        &self,
        kb: &KernelBuilder,
        ex: &Exchange,
        x: V,
        tid: V,
        cx: &RowContext,
    ) -> crate::Result<()> {
        let (step, count) = self.share();
        let pieces: Vec<Piece> = (0..count)
            .map(|k| {
                let at = kb.add_k(cx.first, (k * step) as i64);
                if (k + 1) * step <= self.len {
                    let v = load_f32(kb, x, kb.add(cx.base, at), self.vec, self.dtype);
                    Piece { at, x: v, valid: None }
                } else {
                    // The last piece reaches past the row for some threads (`len` is a multiple
                    // of `vec`: a vector lies in the row whole or not at all).
                    let inside = kb.lt_k(at, self.len as i64);
                    let fill = self.neutral(kb);
                    let t = super::builder::type_of(fill);
                    let v = kb.if_else(
                        inside,
                        &[t],
                        |kb| vec![load_f32(kb, x, kb.add(cx.base, at), self.vec, self.dtype)],
                        |_| vec![fill],
                    )[0];
                    Piece { at, x: v, valid: Some(inside) }
                }
            })
            .collect();
        let outputs = self.results(kb, ex, tid, &pieces, cx)?;
        for (p, y) in pieces.iter().zip(outputs) {
            self.store(kb, cx, p, y)?;
        }
        Ok(())
    }

    /// The value padding a piece past the row: one that changes no statistic (-inf for the
    /// softmaxes' maximum; 0 for sums, masked where a difference is squared).
    fn neutral(&self, kb: &KernelBuilder) -> V {
        let v = match self.op {
            RowOp::Softmax | RowOp::LogSoftmax => f64::NEG_INFINITY,
            _ => 0.0,
        };
        let c = kb.f32(v);
        if self.vec > 1 {
            kb.splat(c, self.vec)
        } else {
            c
        }
    }

    fn splat(&self, kb: &KernelBuilder, v: V) -> V {
        if self.vec > 1 {
            kb.splat(v, self.vec)
        } else {
            v
        }
    }

    /// The normalised values of the cached pieces.
    fn results(
        &self,
        kb: &KernelBuilder,
        ex: &Exchange,
        tid: V,
        pieces: &[Piece],
        cx: &RowContext,
    ) -> crate::Result<Vec<V>> {
        let fold = |c: Combine, vs: &[V]| -> V {
            let mut acc = vs[0];
            for &v in &vs[1..] {
                acc = c.apply(kb, acc, v);
            }
            acc
        };
        let xs: Vec<V> = pieces.iter().map(|p| p.x).collect();
        let n = kb.f32(self.len as f64);
        Ok(match self.op {
            RowOp::Softmax | RowOp::LogSoftmax => {
                let m = self.row_total(kb, ex, Combine::Max, fold(Combine::Max, &xs), tid);
                let mv = self.splat(kb, m);
                let d: Vec<V> = xs.iter().map(|&v| kb.fop("arith.subf", v, mv)).collect();
                let e: Vec<V> = d.iter().map(|&v| kb.fun("math.exp", v)).collect();
                let s = self.row_total(kb, ex, Combine::Add, fold(Combine::Add, &e), tid);
                let sv = self.splat(kb, s);
                if self.op == RowOp::Softmax {
                    e.iter().map(|&v| kb.fop("arith.divf", v, sv)).collect()
                } else {
                    let l = self.splat(kb, kb.fun("math.log", s));
                    d.iter().map(|&v| kb.fop("arith.subf", v, l)).collect()
                }
            }
            RowOp::LayerNorm { epsilon } => {
                let s = self.row_total(kb, ex, Combine::Add, fold(Combine::Add, &xs), tid);
                let mean = kb.fop("arith.divf", s, n);
                let mv = self.splat(kb, mean);
                let zero = self.splat(kb, kb.f32(0.0));
                let d: Vec<V> = pieces
                    .iter()
                    .map(|p| {
                        let d = kb.fop("arith.subf", p.x, mv);
                        match p.valid {
                            Some(inside) => kb.select(inside, d, zero),
                            None => d,
                        }
                    })
                    .collect();
                let sq: Vec<V> = d.iter().map(|&v| kb.fop("arith.mulf", v, v)).collect();
                let q = self.row_total(kb, ex, Combine::Add, fold(Combine::Add, &sq), tid);
                let var = kb.fop("arith.divf", q, n);
                let inv = kb.fun("math.rsqrt", kb.fop("arith.addf", var, kb.f32(epsilon as f64)));
                let iv = self.splat(kb, inv);
                let mut out = Vec::new();
                for (p, &dv) in pieces.iter().zip(&d) {
                    out.push(self.affine(kb, cx, p.at, kb.fop("arith.mulf", dv, iv)));
                }
                out
            }
            RowOp::RmsNorm { epsilon } => {
                let sq: Vec<V> = xs.iter().map(|&v| kb.fop("arith.mulf", v, v)).collect();
                let q = self.row_total(kb, ex, Combine::Add, fold(Combine::Add, &sq), tid);
                let ms = kb.fop("arith.addf", kb.fop("arith.divf", q, n), kb.f32(epsilon as f64));
                let rv = self.splat(kb, kb.fun("math.sqrt", ms));
                let mut out = Vec::new();
                for p in pieces {
                    out.push(self.affine(kb, cx, p.at, kb.fop("arith.divf", p.x, rv)));
                }
                out
            }
        })
    }

    /// `y * scale + bias` at row position `at` (a piece's first element).
    fn affine(&self, kb: &KernelBuilder, cx: &RowContext, at: V, y: V) -> V {
        let read = |a: &Affine| -> V {
            let mem = match a.source {
                Source::Buffer(i) => cx.a.buffers[i],
                Source::Constant(i) => cx.a.constants[i],
            };
            if a.strides.iter().all(|&s| s == 0) {
                let v = load_f32(kb, mem, kb.index(0), 1, a.dtype);
                return self.splat(kb, v);
            }
            if a.strides == contiguous_strides(&self.row_dims) {
                return load_f32(kb, mem, at, self.vec, a.dtype);
            }
            let elems: Vec<V> = (0..self.vec)
                .map(|e| {
                    let j = kb.add_k(at, e as i64);
                    let o = offset(kb, &self.row_dims, &a.strides, &[(j, 0, self.row_dims.len())]);
                    load_f32(kb, mem, o, 1, a.dtype)
                })
                .collect();
            if self.vec > 1 {
                kb.from_elements(&elems)
            } else {
                elems[0]
            }
        };
        let mut y = y;
        if let Some(s) = &self.scale {
            y = kb.fop("arith.mulf", y, read(s));
        }
        if let Some(b) = &self.bias {
            y = kb.fop("arith.addf", y, read(b));
        }
        y
    }

    /// Stores a piece's results through the tail (only for threads of a real row, and only the
    /// part inside the row).
    fn store(&self, kb: &KernelBuilder, cx: &RowContext, p: &Piece, y: V) -> crate::Result<()> {
        let go = match p.valid {
            Some(inside) => kb.and(cx.valid_row, inside),
            None => cx.valid_row,
        };
        let mut result = Ok(());
        kb.when(go, |kb| {
            let rank = self.tail.dims.len();
            let split = rank - self.row_dims.len();
            let values: Vec<V> = if self.vec > 1 {
                (0..self.vec).map(|e| kb.extract(y, e)).collect()
            } else {
                vec![y]
            };
            result = self.tail.store_run(
                kb,
                cx.graph,
                cx.a,
                &values,
                &[(cx.row, 0, split), (p.at, split, rank)],
            );
        });
        result
    }

    /// Rows too long for registers: each statistic a pass over the row in memory.
    fn streamed_row(
        &self,
        kb: &KernelBuilder,
        ex: &Exchange,
        x: V,
        tid: V,
        cx: &RowContext,
    ) -> crate::Result<()> {
        let step = (self.threads() * self.vec) as i64;
        let start = cx.first;
        let end = kb.index(self.len as i64);
        let n = trips(kb, start, end, step);
        // A pass: `f` folds each piece into the carried values.
        let pass = |inits: &[V], f: &Fold| -> Vec<V> {
            kb.for_loop(kb.index(0), n, kb.index(1), inits, |kb, k, acc| {
                let at = kb.add(start, kb.mul_k(k, step));
                let v = load_f32(kb, x, kb.add(cx.base, at), self.vec, self.dtype);
                f(kb, v, acc)
            })
        };
        let zero = self.splat(kb, kb.f32(0.0));
        let len = kb.f32(self.len as f64);
        // The per-element result from a loaded piece.
        type Out<'x> = Box<dyn Fn(&KernelBuilder, V, V) -> V + 'x>;
        let out: Out = match self.op {
            RowOp::Softmax | RowOp::LogSoftmax => {
                // Online: the running maximum m and the sum s of exp(x - m), rescaled when m grows.
                // exp(a - b) is taken as 1 when a == b, so -inf against -inf adds nothing wrong.
                let ninf = self.splat(kb, kb.f32(f64::NEG_INFINITY));
                let one = self.splat(kb, kb.f32(1.0));
                let scale = move |kb: &KernelBuilder, a: V, b: V| -> V {
                    let same =
                        kb.op1("arith.cmpf", &[a, b], cmp_type(kb, a), &[("predicate", oeq(kb))]);
                    let e = kb.fun("math.exp", kb.fop("arith.subf", a, b));
                    kb.select(same, one, e)
                };
                let ms = pass(&[ninf, zero], &|kb, v, acc| {
                    let m = kb.fop("arith.maximumf", acc[0], v);
                    let s = kb.fop(
                        "arith.addf",
                        kb.fop("arith.mulf", acc[1], scale(kb, acc[0], m)),
                        scale(kb, v, m),
                    );
                    vec![m, s]
                });
                let mt = if self.vec > 1 { Combine::Max.lanes(kb, ms[0], self.vec) } else { ms[0] };
                let m = self.combine(kb, ex, Combine::Max, mt, tid);
                let mv = self.splat(kb, m);
                let s_here = kb.fop("arith.mulf", ms[1], scale(kb, ms[0], mv));
                let s = self.row_total(kb, ex, Combine::Add, s_here, tid);
                let sv = self.splat(kb, s);
                let lv = self.splat(kb, kb.fun("math.log", s));
                let soft = self.op == RowOp::Softmax;
                Box::new(move |kb, v, _at| {
                    let d = kb.fop("arith.subf", v, mv);
                    if soft {
                        kb.fop("arith.divf", kb.fun("math.exp", d), sv)
                    } else {
                        kb.fop("arith.subf", d, lv)
                    }
                })
            }
            RowOp::LayerNorm { epsilon } => {
                let s = pass(&[zero], &|kb, v, acc| vec![kb.fop("arith.addf", acc[0], v)]);
                let mean =
                    kb.fop("arith.divf", self.row_total(kb, ex, Combine::Add, s[0], tid), len);
                let mv = self.splat(kb, mean);
                let q = pass(&[zero], &|kb, v, acc| {
                    let d = kb.fop("arith.subf", v, mv);
                    vec![kb.fop("arith.addf", acc[0], kb.fop("arith.mulf", d, d))]
                });
                let var =
                    kb.fop("arith.divf", self.row_total(kb, ex, Combine::Add, q[0], tid), len);
                let inv = kb.fun("math.rsqrt", kb.fop("arith.addf", var, kb.f32(epsilon as f64)));
                let iv = self.splat(kb, inv);
                Box::new(move |kb, v, at| {
                    let d = kb.fop("arith.mulf", kb.fop("arith.subf", v, mv), iv);
                    self.affine(kb, cx, at, d)
                })
            }
            RowOp::RmsNorm { epsilon } => {
                let q = pass(&[zero], &|kb, v, acc| {
                    vec![kb.fop("arith.addf", acc[0], kb.fop("arith.mulf", v, v))]
                });
                let ms = kb.fop("arith.divf", self.row_total(kb, ex, Combine::Add, q[0], tid), len);
                let rms = kb.fun("math.sqrt", kb.fop("arith.addf", ms, kb.f32(epsilon as f64)));
                let rv = self.splat(kb, rms);
                Box::new(move |kb, v, at| self.affine(kb, cx, at, kb.fop("arith.divf", v, rv)))
            }
        };
        let mut result = Ok(());
        kb.for_loop(kb.index(0), n, kb.index(1), &[], |kb, k, _| {
            let at = kb.add(start, kb.mul_k(k, step));
            let v = load_f32(kb, x, kb.add(cx.base, at), self.vec, self.dtype);
            let y = out(kb, v, at);
            if let Err(e) = self.store(kb, cx, &Piece { at, x: v, valid: None }, y) {
                result = Err(e);
            }
            Vec::new()
        });
        result
    }
}

/// One pass's step: the carried values updated by a loaded piece.
type Fold<'x> = dyn Fn(&KernelBuilder, V, &[V]) -> Vec<V> + 'x;

/// What a row's code needs to know of where it is.
struct RowContext<'a, 'g> {
    a: &'a Args,
    graph: &'g Graph,
    row: V,
    valid_row: V,
    base: V,
    first: V,
}

/// `i1`, or a vector of `i1` as wide as `v`.
fn cmp_type(kb: &KernelBuilder, v: V) -> mlir_sys::MlirType {
    // SAFETY: a live type.
    let t = super::builder::type_of(v);
    if unsafe { mlir_sys::mlirTypeIsAVector(t) } {
        let n = unsafe { mlir_sys::mlirShapedTypeGetDimSize(t, 0) } as usize;
        kb.vector_t(n, kb.int_t(1))
    } else {
        kb.int_t(1)
    }
}

/// `arith.cmpf`'s ordered-equal predicate.
fn oeq<'c>(kb: &KernelBuilder<'c>) -> melior::ir::Attribute<'c> {
    melior::ir::attribute::IntegerAttribute::new(
        melior::ir::Type::from(melior::ir::r#type::IntegerType::new(kb.ctx, 64)),
        1,
    )
    .into()
}
