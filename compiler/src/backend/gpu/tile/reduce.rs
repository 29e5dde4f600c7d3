//! Reductions at memory speed: Reduce* and global pooling over one run of axes, viewed as
//! `[outer, len, inner]`.
//!
//! - Rows (`inner` 1, the reduced axes innermost): a warp a row for rows up to 1024 long, a
//!   block a row beyond; when there are too few rows to fill the GPU, each row is split over
//!   several blocks, whose partial results a second launch combines (a warp a row). Loads are
//!   128 bits wide where the row length allows; each thread keeps a vector of partial results,
//!   combined at the end with warp shuffles and, across warps, through workgroup memory.
//! - Columns (`inner` > 1): a thread an output, reading along the strided axis (neighbouring
//!   threads read neighbouring elements); split over blocks likewise when there are few outputs.
//!
//! The finish (mean's division, L2's root, LogSum's log) and the kernel's elementwise tail run
//! as each result is stored.

use kiln_ir::op::{PoolKind, ReduceKind};
use kiln_ir::{normalize_axis, DType, Graph, Op};

use super::builder::{KernelBuilder, V, WARP};
use super::exchange::{Combine, Exchange};
use super::tail::Tail;
use super::{Args, BuildContext, TileTarget, BLOCK};
use crate::fuse::Kernel;

/// What is done to each element before it is combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pre {
    Identity,
    Abs,
    Square,
}

/// What is done to the combined result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    None,
    /// Divided by the reduction's length.
    Mean,
    Sqrt,
    Log,
}

/// How the reduction's work is spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// A warp a row, `BLOCK / 32` rows a block.
    WarpRows,
    /// A block a row.
    BlockRows,
    /// Each row over `splits` blocks, then a warp a row combines their partial results.
    SplitRows { splits: usize },
    /// A thread an output; the reduction over `splits` blocks (1: not split).
    Columns { splits: usize },
}

/// A reduction's plan (pure: it prints in `--stage lowered` and is pinned by tests).
#[derive(Clone, Debug)]
pub struct ReducePlan {
    pub what: &'static str,
    pub pre: Pre,
    pub combine: Combine,
    pub finish: Finish,
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
    pub dtype: DType,
    /// The input's position among the kernel's buffers.
    pub input: usize,
    /// Elements a load (1, or a 128-bit vector's worth).
    pub vec: usize,
    pub form: Form,
    pub tail: Tail,
}

/// Bytes a kernel moves before it must fill the GPU (the bound: 1 MB).
const BIG_TRAFFIC: usize = 1 << 20;
/// The longest row a warp reduces alone.
const WARP_ROW: usize = 1024;

/// The reduction a root node computes: (name, pre, combine, finish), or `None` for one the
/// tile kernels leave to the general schedules (LogSumExp, integer and f64 data, Lp pools
/// beyond p = 2).
fn reduction_of(op: &Op) -> Option<(&'static str, Pre, Combine, Finish)> {
    Some(match op {
        Op::Reduce(r) => match r.kind {
            ReduceKind::Sum => ("ReduceSum", Pre::Identity, Combine::Add, Finish::None),
            ReduceKind::Mean => ("ReduceMean", Pre::Identity, Combine::Add, Finish::Mean),
            ReduceKind::Max => ("ReduceMax", Pre::Identity, Combine::Max, Finish::None),
            ReduceKind::Min => ("ReduceMin", Pre::Identity, Combine::Min, Finish::None),
            ReduceKind::Prod => ("ReduceProd", Pre::Identity, Combine::Mul, Finish::None),
            ReduceKind::L1 => ("ReduceL1", Pre::Abs, Combine::Add, Finish::None),
            ReduceKind::L2 => ("ReduceL2", Pre::Square, Combine::Add, Finish::Sqrt),
            ReduceKind::LogSum => ("ReduceLogSum", Pre::Identity, Combine::Add, Finish::Log),
            ReduceKind::SumSquare => ("ReduceSumSquare", Pre::Square, Combine::Add, Finish::None),
            ReduceKind::LogSumExp => return None,
        },
        Op::GlobalPool(k) => match k {
            PoolKind::Max => ("GlobalMaxPool", Pre::Identity, Combine::Max, Finish::None),
            PoolKind::Average { .. } => {
                ("GlobalAveragePool", Pre::Identity, Combine::Add, Finish::Mean)
            }
            PoolKind::Lp { p: 1 } => ("GlobalLpPool", Pre::Abs, Combine::Add, Finish::None),
            PoolKind::Lp { p: 2 } => ("GlobalLpPool", Pre::Square, Combine::Add, Finish::Sqrt),
            PoolKind::Lp { .. } => return None,
        },
        _ => return None,
    })
}

/// The float types the tile kernels read (computing in f32).
pub fn f32_computed(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Elements of `d` in 128 bits.
pub fn vector_width(d: DType) -> usize {
    16 / d.size()
}

/// The reduced axes of a root node over input dims `xd`.
fn reduced_axes(graph: &Graph, root: kiln_ir::NodeId, xd: &[usize]) -> Option<Vec<usize>> {
    match &graph.node(root).op {
        Op::GlobalPool(_) => Some((2..xd.len()).collect()),
        Op::Reduce(r) => {
            let axes = match graph.operands(root).get(1).copied().flatten() {
                None => Vec::new(),
                Some(a) => graph.constant_value(a)?.to_i64s(),
            };
            let mut axes: Vec<usize> =
                axes.iter().map(|&a| normalize_axis(a, xd.len())).collect::<Option<_>>()?;
            if axes.is_empty() {
                if r.noop_with_empty_axes {
                    return None;
                }
                axes = (0..xd.len()).collect();
            }
            Some(axes)
        }
        _ => None,
    }
}

/// `[outer, len, inner]` of `xd` reduced over `axes`, when the reduced axes of extent above 1
/// are one run.
pub fn three_way(xd: &[usize], axes: &[usize]) -> Option<(usize, usize, usize)> {
    let live: Vec<usize> = (0..xd.len()).filter(|&i| xd[i] > 1).collect();
    let red: Vec<usize> = live.iter().copied().filter(|i| axes.contains(i)).collect();
    let (first, last) = match (red.first(), red.last()) {
        (Some(&f), Some(&l)) => (f, l),
        // Nothing of extent above 1 is reduced: each output is one element.
        _ => return Some((xd.iter().product(), 1, 1)),
    };
    if live.iter().any(|&i| i > first && i < last && !axes.contains(&i)) {
        return None;
    }
    let outer = xd[..first].iter().product();
    let len = xd[first..=last].iter().product();
    let inner = xd[last + 1..].iter().product();
    Some((outer, len, inner))
}

pub fn plan(t: &TileTarget, graph: &Graph, kernel: &Kernel) -> Option<ReducePlan> {
    let tail = Tail::of(graph, kernel)?;
    let root = tail.root;
    let (what, pre, combine, finish) = reduction_of(&graph.node(root).op)?;
    let x = graph.operands(root).first().copied().flatten()?;
    let input = kernel.inputs.iter().position(|&v| v == x)?;
    let xt = graph.value_type(x);
    let xd = xt.shape.as_fixed()?;
    if !f32_computed(xt.dtype) || xd.iter().product::<usize>() == 0 {
        return None;
    }
    let axes = reduced_axes(graph, root, &xd)?;
    let (outer, len, inner) = three_way(&xd, &axes)?;
    let bytes = outer * len * inner * xt.dtype.size();
    let min_threads = t.min_threads();
    let form = if inner > 1 {
        let outputs = outer * inner;
        let splits = if bytes > BIG_TRAFFIC && outputs < min_threads {
            // Enough blocks to fill the GPU four times over, each split at least 8 long.
            (4 * min_threads).div_ceil(outputs).min(len / 8).max(1)
        } else {
            1
        };
        Form::Columns { splits }
    } else if bytes <= BIG_TRAFFIC || (len <= WARP_ROW && outer * WARP >= min_threads) {
        if len <= WARP_ROW {
            Form::WarpRows
        } else {
            Form::BlockRows
        }
    } else if outer * BLOCK >= min_threads {
        Form::BlockRows
    } else {
        let vec = row_vector(xt.dtype, len);
        // Each thread at least UNROLL vectors.
        let per_row = (len / vec).div_ceil(BLOCK * UNROLL);
        let splits = (4 * min_threads).div_ceil(outer * BLOCK).min(per_row).clamp(1, 65535);
        if splits > 1 {
            Form::SplitRows { splits }
        } else {
            Form::BlockRows
        }
    };
    let vec = if inner > 1 { 1 } else { row_vector(xt.dtype, len) };
    Some(ReducePlan {
        what,
        pre,
        combine,
        finish,
        outer,
        len,
        inner,
        dtype: xt.dtype,
        input,
        vec,
        form,
        tail,
    })
}

/// Elements a load along a row of `len`: a 128-bit vector when the row is made of them (so every
/// row starts aligned), else one.
fn row_vector(d: DType, len: usize) -> usize {
    let w = vector_width(d);
    if len.is_multiple_of(w) {
        w
    } else {
        1
    }
}

impl ReducePlan {
    pub fn describe(&self, graph: &Graph) -> String {
        let shape = format!("[{} x {} x {}]", self.outer, self.len, self.inner);
        let form = match self.form {
            Form::WarpRows => format!("a warp a row, {} rows a block", BLOCK / WARP),
            Form::BlockRows => format!("a block of {BLOCK} a row"),
            Form::SplitRows { splits } => {
                format!("each row over {splits} blocks of {BLOCK}, then a warp a row")
            }
            Form::Columns { splits: 1 } => "a thread an output".to_string(),
            Form::Columns { splits } => {
                format!("a thread an output, the reduction over {splits} blocks")
            }
        };
        format!(
            "tile reduce: {} {shape} ({}, {}-wide loads), {form}{}",
            self.what,
            self.dtype,
            self.vec,
            self.tail.describe(graph)
        )
    }

    pub fn build(&self, cx: &mut BuildContext) -> crate::Result<()> {
        let graph = cx.graph;
        let b = [BLOCK as u32, 1, 1];
        match self.form {
            Form::WarpRows | Form::BlockRows => {
                let per_block = if self.form == Form::WarpRows { BLOCK / WARP } else { 1 };
                let grid = [self.outer.div_ceil(per_block) as u32, 1, 1];
                cx.launch("rows", grid, b, &[], |kb, a| self.rows_kernel(kb, a, graph))
            }
            Form::SplitRows { splits } => {
                let part = cx.scratch(self.outer * splits * 4);
                let grid = [splits as u32, self.outer as u32, 1];
                cx.launch("partial", grid, b, &[part], |kb, a| {
                    self.split_kernel(kb, a, splits);
                    Ok(())
                })?;
                let grid = [self.outer.div_ceil(BLOCK / WARP) as u32, 1, 1];
                cx.launch("combine", grid, b, &[part], |kb, a| {
                    self.combine_kernel(kb, a, splits, graph)
                })
            }
            Form::Columns { splits } => {
                let outputs = self.outer * self.inner;
                let blocks = outputs.div_ceil(BLOCK) as u32;
                if splits == 1 {
                    return cx.launch("columns", [blocks, 1, 1], b, &[], |kb, a| {
                        self.columns_kernel(kb, a, graph)
                    });
                }
                let part = cx.scratch(outputs * splits * 4);
                cx.launch("partial", [blocks, splits as u32, 1], b, &[part], |kb, a| {
                    self.columns_partial_kernel(kb, a, splits);
                    Ok(())
                })?;
                cx.launch("combine", [blocks, 1, 1], b, &[part], |kb, a| {
                    self.columns_combine_kernel(kb, a, splits, graph)
                })
            }
        }
    }

    /// `pre(x)` of a loaded value (scalar or vector, f32).
    fn pre(&self, kb: &KernelBuilder, x: V) -> V {
        match self.pre {
            Pre::Identity => x,
            Pre::Abs => kb.fun("math.absf", x),
            Pre::Square => kb.fop("arith.mulf", x, x),
        }
    }

    /// The thread's share of a run: `pre` of every `vec` elements from element `first`, then
    /// every `step` elements while below `end`, combined into a vector (or scalar) of f32.
    fn accumulate(&self, kb: &KernelBuilder, x: V, first: V, end: V, step: i64) -> V {
        let vec = self.vec;
        let c = self.combine;
        let init = kb.f32(c.neutral());
        let init = if vec > 1 { kb.splat(init, vec) } else { init };
        // UNROLL loads in flight a thread: independent accumulators, so the loads of one trip
        // do not wait for each other (a memory-bound loop needs several outstanding).
        let count = trips(kb, first, end, step);
        let groups = kb.div_k(count, UNROLL as i64);
        let inits = vec![init; UNROLL];
        let accs = kb.for_loop(kb.index(0), groups, kb.index(1), &inits, |kb, g, acc| {
            let at = kb.add(first, kb.mul_k(g, step * UNROLL as i64));
            (0..UNROLL)
                .map(|u| {
                    let v = load_f32(kb, x, kb.add_k(at, step * u as i64), vec, self.dtype);
                    c.apply(kb, acc[u], self.pre(kb, v))
                })
                .collect()
        });
        let done = kb.mul_k(groups, UNROLL as i64);
        let rest = kb.for_loop(done, count, kb.index(1), &[accs[0]], |kb, k, acc| {
            let v = load_f32(kb, x, kb.add(first, kb.mul_k(k, step)), vec, self.dtype);
            vec![c.apply(kb, acc[0], self.pre(kb, v))]
        })[0];
        let mut acc = rest;
        for &a in &accs[1..] {
            acc = c.apply(kb, acc, a);
        }
        if vec > 1 {
            c.lanes(kb, acc, vec)
        } else {
            acc
        }
    }

    fn finish(&self, kb: &KernelBuilder, r: V) -> V {
        match self.finish {
            Finish::None => r,
            Finish::Mean => {
                let n = kb.f32(self.len as f64);
                kb.fop("arith.divf", r, n)
            }
            Finish::Sqrt => kb.fun("math.sqrt", r),
            Finish::Log => kb.fun("math.log", r),
        }
    }

    /// Stores output `o` (its linear index) through the tail.
    fn store(&self, kb: &KernelBuilder, a: &Args, graph: &Graph, r: V, o: V) -> crate::Result<()> {
        let r = self.finish(kb, r);
        let rank = self.tail.dims.len();
        self.tail.store(kb, graph, a, r, &[(o, 0, rank)])
    }

    fn rows_kernel(&self, kb: &KernelBuilder, a: &Args, graph: &Graph) -> crate::Result<()> {
        let x = a.buffers[self.input];
        let ex = Exchange::new(kb, BLOCK);
        let tid = kb.thread_id(0);
        let warp_rows = self.form == Form::WarpRows;
        let (row, first, step) = if warp_rows {
            let lane = kb.rem_k(tid, WARP as i64);
            let warp = kb.div_k(tid, WARP as i64);
            let row = kb.add(kb.mul_k(kb.block_id(0), (BLOCK / WARP) as i64), warp);
            (row, kb.mul_k(lane, self.vec as i64), WARP * self.vec)
        } else {
            (kb.block_id(0), kb.mul_k(tid, self.vec as i64), BLOCK * self.vec)
        };
        // Rows past the end (the last block's extra warps) read the last row and store nothing:
        // every thread takes part in the exchanges.
        let valid = kb.lt_k(row, self.outer as i64);
        let last = kb.index(self.outer as i64 - 1);
        let r = kb.min(row, last);
        let base = kb.mul_k(r, self.len as i64);
        let start = kb.add(base, first);
        let end = kb.add_k(base, self.len as i64);
        let part = self.accumulate(kb, x, start, end, step as i64);
        let total = if warp_rows {
            ex.warp(kb, self.combine, part, tid)
        } else {
            ex.block(kb, self.combine, part, tid)
        };
        let lead = if warp_rows { kb.rem_k(tid, WARP as i64) } else { tid };
        let first_lane = kb.cmp("eq", lead, kb.index(0));
        let go = kb.and(valid, first_lane);
        let mut result = Ok(());
        kb.when(go, |kb| result = self.store(kb, a, graph, total, row));
        result
    }

    /// Stage one of a split row: block (s, row) reduces its chunk into `partial[row, s]`.
    fn split_kernel(&self, kb: &KernelBuilder, a: &Args, splits: usize) {
        let x = a.buffers[self.input];
        let part = a.scratch[0];
        let ex = Exchange::new(kb, BLOCK);
        let tid = kb.thread_id(0);
        let s = kb.block_id(0);
        let row = kb.block_id(1);
        let nvec = self.len / self.vec;
        let chunk = nvec.div_ceil(splits);
        // Vectors [s * chunk, min((s + 1) * chunk, nvec)) of the row, in elements.
        let lo = kb.mul_k(s, chunk as i64);
        let hi = kb.min(kb.add_k(lo, chunk as i64), kb.index(nvec as i64));
        let base = kb.mul_k(row, self.len as i64);
        let start = kb.add(base, kb.mul_k(kb.add(lo, tid), self.vec as i64));
        let end = kb.add(base, kb.mul_k(hi, self.vec as i64));
        let p = self.accumulate(kb, x, start, end, (BLOCK * self.vec) as i64);
        let total = ex.block(kb, self.combine, p, tid);
        let at = kb.add(kb.mul_k(row, splits as i64), s);
        let first = kb.cmp("eq", tid, kb.index(0));
        kb.when(first, |kb| kb.store(total, part, at));
    }

    /// Stage two: a warp a row combines the row's partial results and stores it.
    fn combine_kernel(
        &self,
        kb: &KernelBuilder,
        a: &Args,
        splits: usize,
        graph: &Graph,
    ) -> crate::Result<()> {
        let part = a.scratch[0];
        let ex = Exchange::new(kb, BLOCK);
        let tid = kb.thread_id(0);
        let lane = kb.rem_k(tid, WARP as i64);
        let row =
            kb.add(kb.mul_k(kb.block_id(0), (BLOCK / WARP) as i64), kb.div_k(tid, WARP as i64));
        let valid = kb.lt_k(row, self.outer as i64);
        let r = kb.min(row, kb.index(self.outer as i64 - 1));
        let base = kb.mul_k(r, splits as i64);
        let init = kb.f32(self.combine.neutral());
        let c = self.combine;
        let p = kb.for_loop(
            kb.add(base, lane),
            kb.add_k(base, splits as i64),
            kb.index(WARP as i64),
            &[init],
            |kb, j, acc| {
                let v = kb.load(part, j);
                vec![c.apply(kb, acc[0], v)]
            },
        )[0];
        let total = ex.warp(kb, c, p, tid);
        let go = kb.and(valid, kb.cmp("eq", lane, kb.index(0)));
        let mut result = Ok(());
        kb.when(go, |kb| result = self.store(kb, a, graph, total, row));
        result
    }

    /// A thread an output `(o, i)` of `[outer, inner]`, reading `len` elements `inner` apart.
    fn column_of(&self, kb: &KernelBuilder) -> (V, V) {
        let tid = kb.thread_id(0);
        let idx = kb.add(kb.mul_k(kb.block_id(0), BLOCK as i64), tid);
        let outputs = self.outer * self.inner;
        let valid = kb.lt_k(idx, outputs as i64);
        (kb.min(idx, kb.index(outputs as i64 - 1)), valid)
    }

    /// The thread's column's elements `[lo, hi)` along the reduction, combined.
    fn column_run(&self, kb: &KernelBuilder, x: V, idx: V, lo: V, hi: V) -> V {
        let o = kb.div_k(idx, self.inner as i64);
        let i = kb.rem_k(idx, self.inner as i64);
        let base = kb.add(kb.mul_k(o, (self.len * self.inner) as i64), i);
        let init = kb.f32(self.combine.neutral());
        kb.for_loop(lo, hi, kb.index(1), &[init], |kb, j, acc| {
            let at = kb.add(base, kb.mul_k(j, self.inner as i64));
            let v = load_f32(kb, x, at, 1, self.dtype);
            let v = self.pre(kb, v);
            vec![self.combine.apply(kb, acc[0], v)]
        })[0]
    }

    fn columns_kernel(&self, kb: &KernelBuilder, a: &Args, graph: &Graph) -> crate::Result<()> {
        let x = a.buffers[self.input];
        let (idx, valid) = self.column_of(kb);
        let r = self.column_run(kb, x, idx, kb.index(0), kb.index(self.len as i64));
        let mut result = Ok(());
        kb.when(valid, |kb| result = self.store(kb, a, graph, r, idx));
        result
    }

    /// Stage one of split columns: block row `s` reduces its chunk of each column into
    /// `partial[s, output]`.
    fn columns_partial_kernel(&self, kb: &KernelBuilder, a: &Args, splits: usize) {
        let x = a.buffers[self.input];
        let part = a.scratch[0];
        let (idx, valid) = self.column_of(kb);
        let s = kb.block_id(1);
        let chunk = self.len.div_ceil(splits);
        let lo = kb.mul_k(s, chunk as i64);
        let hi = kb.min(kb.add_k(lo, chunk as i64), kb.index(self.len as i64));
        let r = self.column_run(kb, x, idx, lo, hi);
        let at = kb.add(kb.mul_k(s, (self.outer * self.inner) as i64), idx);
        kb.when(valid, |kb| kb.store(r, part, at));
    }

    fn columns_combine_kernel(
        &self,
        kb: &KernelBuilder,
        a: &Args,
        splits: usize,
        graph: &Graph,
    ) -> crate::Result<()> {
        let part = a.scratch[0];
        let (idx, valid) = self.column_of(kb);
        let init = kb.f32(self.combine.neutral());
        let c = self.combine;
        let outputs = (self.outer * self.inner) as i64;
        let r = kb.for_range(0, splits as i64, 1, &[init], |kb, s, acc| {
            let at = kb.add(kb.mul_k(s, outputs), idx);
            let v = kb.load(part, at);
            vec![c.apply(kb, acc[0], v)]
        })[0];
        let mut result = Ok(());
        kb.when(valid, |kb| result = self.store(kb, a, graph, r, idx));
        result
    }
}

/// Loads a thread keeps in flight in a reduction's loop.
const UNROLL: usize = 4;

/// Trips of a loop from `first` below `end` by `step` (0 when `first` is past `end`).
pub fn trips(kb: &KernelBuilder, first: V, end: V, step: i64) -> V {
    let ahead = kb.cmp("ult", first, end);
    let span = kb.sub(kb.add_k(end, step - 1), first);
    let n = kb.div_k(span, step);
    kb.select(ahead, n, kb.index(0))
}

/// `n` elements of `dtype` from `at` as f32 (a vector when `n` > 1).
pub fn load_f32(kb: &KernelBuilder, mem: V, at: V, n: usize, dtype: DType) -> V {
    let v = if n > 1 { kb.vload(mem, at, n, n * dtype.size()) } else { kb.load(mem, at) };
    if dtype == DType::F32 {
        return v;
    }
    let t = if n > 1 { kb.vector_t(n, kb.f32_t()) } else { kb.f32_t() };
    kb.op1("arith.extf", &[v], t, &[])
}
