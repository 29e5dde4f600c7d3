//! Combining one value per thread across a warp or a block, every thread getting the result.
//! NVIDIA kernels use warp shuffles (a butterfly: five exchanges for 32 lanes) and workgroup
//! memory between warps; OpenCL kernels, whose subgroups are not 32 lanes on every device, go
//! through workgroup memory for both. Every thread of the block must make the same calls
//! (they hold barriers).

use super::builder::{Flavor, KernelBuilder, V, WARP};

/// How partial results combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Combine {
    Add,
    Mul,
    Max,
    Min,
}

impl Combine {
    pub fn name(self) -> &'static str {
        match self {
            Combine::Add => "add",
            Combine::Mul => "mul",
            Combine::Max => "max",
            Combine::Min => "min",
        }
    }

    /// The value that combines to nothing.
    pub fn neutral(self) -> f64 {
        match self {
            Combine::Add => 0.0,
            Combine::Mul => 1.0,
            Combine::Max => f64::NEG_INFINITY,
            Combine::Min => f64::INFINITY,
        }
    }

    /// `a` combined with `b` (scalars or vectors of floats). Max and min propagate NaN, as
    /// codegen's reductions do.
    pub fn apply(self, kb: &KernelBuilder, a: V, b: V) -> V {
        kb.fop(
            match self {
                Combine::Add => "arith.addf",
                Combine::Mul => "arith.mulf",
                Combine::Max => "arith.maximumf",
                Combine::Min => "arith.minimumf",
            },
            a,
            b,
        )
    }

    /// The lanes of a 1-D vector combined, in a tree.
    pub fn lanes(self, kb: &KernelBuilder, vec: V, n: usize) -> V {
        let mut xs: Vec<V> = (0..n).map(|k| kb.extract(vec, k)).collect();
        while xs.len() > 1 {
            let mut next = Vec::with_capacity(xs.len().div_ceil(2));
            for pair in xs.chunks(2) {
                next.push(if pair.len() == 2 { self.apply(kb, pair[0], pair[1]) } else { pair[0] });
            }
            xs = next;
        }
        xs[0]
    }
}

/// Workgroup memory the exchanges of one kernel use (allocated once, at its start).
pub struct Exchange {
    threads: usize,
    /// OpenCL: one f32 a thread, for warp exchanges.
    lanes: Option<V>,
    /// One f32 a warp, for block exchanges.
    warps: V,
}

impl Exchange {
    /// The exchange arrays of a kernel of `threads` threads a block (a multiple of 32).
    pub fn new(kb: &KernelBuilder, threads: usize) -> Exchange {
        debug_assert!(threads.is_multiple_of(WARP));
        let f32 = kb.f32_t();
        let lanes = (kb.flavor == Flavor::Spirv).then(|| kb.shared(threads, f32));
        let warps = kb.shared((threads / WARP).max(1), f32);
        Exchange { threads, lanes, warps }
    }

    /// `v` combined over the 32 threads of each warp; every lane gets its warp's result. `tid`
    /// is the thread's index in the block.
    pub fn warp(&self, kb: &KernelBuilder, c: Combine, v: V, tid: V) -> V {
        match self.lanes {
            None => {
                let mut r = v;
                for off in [16, 8, 4, 2, 1] {
                    let other = kb.shuffle_xor(r, off);
                    r = c.apply(kb, r, other);
                }
                r
            }
            Some(mem) => {
                kb.store(v, mem, tid);
                kb.barrier();
                let base = kb.mul_k(kb.div_k(tid, WARP as i64), WARP as i64);
                let mut r = kb.load(mem, base);
                for k in 1..WARP as i64 {
                    let at = kb.add_k(base, k);
                    let x = kb.load(mem, at);
                    r = c.apply(kb, r, x);
                }
                kb.barrier();
                r
            }
        }
    }

    /// `v` combined over the whole block; every thread gets the result.
    pub fn block(&self, kb: &KernelBuilder, c: Combine, v: V, tid: V) -> V {
        let w = self.warp(kb, c, v, tid);
        let warps = self.threads / WARP;
        if warps == 1 {
            return w;
        }
        let lane = kb.rem_k(tid, WARP as i64);
        let warp = kb.div_k(tid, WARP as i64);
        let first = kb.cmp("eq", lane, kb.index(0));
        kb.when(first, |kb| kb.store(w, self.warps, warp));
        kb.barrier();
        let mut r = kb.load(self.warps, kb.index(0));
        for k in 1..warps as i64 {
            let x = kb.load(self.warps, kb.index(k));
            r = c.apply(kb, r, x);
        }
        // The array is free again only once every thread has read it.
        kb.barrier();
        r
    }
}
