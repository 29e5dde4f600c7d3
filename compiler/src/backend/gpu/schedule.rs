//! Schedules: how a kernel's work maps onto workgroups (blocks) and threads, applied to its
//! tensor-level MLIR with transform scripts.
//!
//! Every fused schedule first tiles the op writing the kernel's output (the anchor) into an
//! `scf.forall` over blocks and fuses every op producing its operands into it, so one block
//! computes one tile of the output from the kernel's inputs. Inside the block the work is split
//! over threads by the strategy:
//! - `Parallel`: the anchor's tile over threads, one output element each.
//! - `Reduction`: one block per output row; each long reduction split over the block's threads
//!   (a partial result per thread in workgroup memory, then combined), the anchor's tile over
//!   threads.
//! - `Contraction` (matmul, convolution): the reduction runs in steps; each step copies both
//!   operands' tiles into workgroup memory with all threads, then each thread updates its part
//!   of the accumulator (in workgroup memory); the epilogue (bias, activation) over threads.
//!
//! Then the ops left at block level are fused into the thread loops that use them (Parallel fuses
//! everything, so each thread computes its outputs from the inputs). What stays at block level
//! runs on every thread with private copies. `PerOp`, the fallback, gives every op its own grid
//! (no fusion; temporaries in global memory).
//!
//! Tile sizes divide loop extents exactly, so every tile and every thread's share is static.

use std::fmt;

use super::loops::{self, Loops};
use super::script::{block_mapping, mapping, Script};
use crate::backend::edit::{self, RawOp};
use crate::backend::MlirContext;

/// Threads per block the schedules aim for.
pub const BLOCK_THREADS: usize = 256;
/// A reduction at least this long is split over a block's threads.
const SPLIT_REDUCTION: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Parallel,
    Reduction,
    Contraction,
    PerOp,
    /// The tile kernels (`tile/`), where one takes the kernel.
    Tile,
    /// The tile kernels with contractions on the tensor-core path whatever the precision and
    /// target (on OpenCL, the matrix instruction emulated through workgroup memory): for tests.
    TensorCore,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Strategy::Parallel => "parallel",
            Strategy::Reduction => "reduction",
            Strategy::Contraction => "contraction",
            Strategy::PerOp => "per-op",
            Strategy::Tile => "tile",
            Strategy::TensorCore => "tensor-core",
        })
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Strategy, String> {
        [
            Strategy::Parallel,
            Strategy::Reduction,
            Strategy::Contraction,
            Strategy::PerOp,
            Strategy::Tile,
            Strategy::TensorCore,
        ]
        .into_iter()
        .find(|x| x.to_string() == s)
        .ok_or_else(|| {
            format!(
                "no GPU schedule `{s}` (parallel, reduction, contraction, per-op, tile or tensor-core)"
            )
        })
    }
}

/// Ops that do work on tensors and can be tiled (`tensor.pad` included).
pub fn is_compute(op: RawOp) -> bool {
    loops::is_structured(op) || op.is("tensor.pad")
}

/// The kernel's `func.func`.
pub fn kernel_func(root: RawOp) -> Option<RawOp> {
    root.children().into_iter().find(|o| o.is("func.func"))
}

/// Ops with an empty iteration space do nothing: their results are their inits, unchanged (a
/// reduction over nothing is its initial value; an empty result is empty). They go before
/// scheduling, since MLIR's tiling divides by loop extents.
pub fn drop_empty_ops(func: RawOp) {
    for op in func.children() {
        let Some(l) = loops::loops(op) else { continue };
        if !l.ranges.contains(&0) || op.num_results() == 0 || op.num_results() > op.num_operands() {
            continue;
        }
        let inits = op.num_operands() - op.num_results();
        for r in 0..op.num_results() {
            edit::replace_uses(op.result(r), op.operand(inits + r));
        }
        op.erase();
    }
}

/// The strategies worth trying for a kernel, best first; `PerOp` always ends the list.
pub fn candidates(func: RawOp) -> Vec<Strategy> {
    let compute: Vec<(RawOp, Loops)> =
        func.children().into_iter().filter_map(|o| loops::loops(o).map(|l| (o, l))).collect();
    let mut out = Vec::new();
    // Fusion tiles one output: a kernel writing several (a split, a normalisation's statistics)
    // gives each op its own grid.
    let outputs = func
        .children()
        .into_iter()
        .filter(|o| o.is("bufferization.materialize_in_destination"))
        .count();
    if outputs > 1 {
        return vec![Strategy::PerOp];
    }
    if compute.iter().any(|(o, l)| is_contraction(*o) && contraction_plan(*o, l).is_some()) {
        out.push(Strategy::Contraction);
    }
    if compute.iter().any(|(o, l)| {
        splittable(*o) && innermost_reduction(l).is_some_and(|(_, r)| r >= SPLIT_REDUCTION)
    }) {
        out.push(Strategy::Reduction);
    }
    out.push(Strategy::Parallel);
    out.push(Strategy::PerOp);
    out
}

fn is_contraction(op: RawOp) -> bool {
    // SAFETY: a live linalg structured op.
    loops::is_structured(op)
        && !op.is("linalg.fill")
        && unsafe {
            mlir_sys::mlirLinalgIsAContractionOp(op.0) || mlir_sys::mlirLinalgIsAConvolutionOp(op.0)
        }
}

/// Whether a reduction can be split over threads: one result, combined by one op with a neutral
/// element (add, mul, min, max, and, or, xor) from the running value. (MLIR's partial
/// reductions need that combiner; it crashes on others rather than refusing.)
/// Whether every indexing map of `op` is a projected permutation (no window arithmetic such as
/// a pooling's `d2 * 10 + d3 * 10`): `split_reduction` reshapes the reduction dimension of each
/// operand and is unsafe on anything else (MLIR crashed on a strided, dilated pooling window).
fn maps_are_projected_permutations(op: RawOp) -> bool {
    // SAFETY: reading a live op's indexing maps.
    unsafe {
        let maps = mlir_sys::mlirLinalgGetIndexingMapsAttribute(op.0);
        if maps.ptr.is_null() {
            return false;
        }
        let n = mlir_sys::mlirArrayAttrGetNumElements(maps);
        (0..n).all(|i| {
            mlir_sys::mlirAffineMapIsProjectedPermutation(mlir_sys::mlirAffineMapAttrGetValue(
                mlir_sys::mlirArrayAttrGetElement(maps, i),
            ))
        })
    }
}

fn splittable(op: RawOp) -> bool {
    if op.num_results() != 1 || !loops::is_structured(op) || op.is("linalg.fill") {
        return false;
    }
    let Some(body) = op.block(0) else { return false };
    // SAFETY: reading a live block's arguments and ops.
    unsafe {
        let n = mlir_sys::mlirBlockGetNumArguments(body);
        if n == 0 {
            return false;
        }
        let out = mlir_sys::mlirBlockGetArgument(body, n - 1);
        let term = RawOp(mlir_sys::mlirBlockGetTerminator(body));
        if !term.is("linalg.yield") || term.num_operands() != 1 {
            return false;
        }
        // The result's indexing map must be a projected permutation (no constant indices, as
        // keepdims results have): MLIR's partial reductions assume it.
        let maps = mlir_sys::mlirLinalgGetIndexingMapsAttribute(op.0);
        let n_maps = mlir_sys::mlirArrayAttrGetNumElements(maps);
        let out_map = mlir_sys::mlirAffineMapAttrGetValue(mlir_sys::mlirArrayAttrGetElement(
            maps,
            n_maps - 1,
        ));
        if !mlir_sys::mlirAffineMapIsProjectedPermutation(out_map) {
            return false;
        }
        let Some(combiner) = edit::defining_op(term.operand(0)) else { return false };
        let known = [
            "arith.addf",
            "arith.mulf",
            "arith.maximumf",
            "arith.minimumf",
            "arith.maxnumf",
            "arith.minnumf",
            "arith.addi",
            "arith.muli",
            "arith.andi",
            "arith.ori",
            "arith.xori",
            "arith.maxsi",
            "arith.minsi",
            "arith.maxui",
            "arith.minui",
        ];
        known.contains(&combiner.name().as_str())
            && combiner.operands().iter().any(|v| edit::same_value(*v, out))
    }
}

/// The innermost reduction loop longer than one, and its extent.
fn innermost_reduction(l: &Loops) -> Option<(usize, usize)> {
    (0..l.ranges.len()).rev().find(|&i| !l.parallel[i] && l.ranges[i] > 1).map(|i| (i, l.ranges[i]))
}

/// The largest divisor of `n` that is at most `cap`.
fn divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n)).rev().find(|d| n.is_multiple_of(*d)).unwrap_or(1)
}

/// Threads over the innermost parallel loops (at most three), at most `budget` in all: (loop,
/// threads) with the threads dividing the loop's extent, innermost first.
fn thread_split(l: &Loops, budget: usize) -> Vec<(usize, usize)> {
    let mut budget = budget;
    let mut out = Vec::new();
    for i in (0..l.ranges.len()).rev() {
        if out.len() == 3 || budget < 2 {
            break;
        }
        if !l.parallel[i] || l.ranges[i] < 2 {
            continue;
        }
        let t = divisor_at_most(l.ranges[i], budget);
        if t < 2 {
            continue;
        }
        out.push((i, t));
        budget /= t;
    }
    out
}

/// Per-loop tile sizes and the forall's mapping for a tiling of `l` by `tiles` (0: untiled).
fn forall_of(l: &Loops, tiles: &[usize], kind: &str) -> Vec<String> {
    let counts: Vec<usize> =
        (0..l.ranges.len()).filter(|&i| tiles[i] != 0).map(|i| l.ranges[i] / tiles[i]).collect();
    if kind == "block" {
        block_mapping(&counts)
    } else {
        mapping(kind, &counts)
    }
}

/// Which loops threads split, and into how many.
type ThreadSplit = Vec<(usize, usize)>;

/// The parallel block tiling: a block covers the thread split of the innermost loops and one
/// index of the others. Returns (block tile sizes, thread split).
fn parallel_blocks(l: &Loops) -> Option<(Vec<usize>, ThreadSplit)> {
    let split = thread_split(l, BLOCK_THREADS);
    let mut block = vec![0; l.ranges.len()];
    for (i, b) in block.iter_mut().enumerate() {
        if l.parallel[i] && l.ranges[i] > 1 {
            *b = split.iter().find(|(j, _)| *j == i).map_or(1, |&(_, t)| t);
        }
    }
    let block = grid_tiles(l, block);
    (block.iter().any(|&b| b != 0) || !split.is_empty()).then_some((block, split))
}

/// When the whole op fits one block (no loop tiled), a grid of one: its first parallel loop
/// tiled by its full extent. `None` without a parallel loop.
fn at_least_one_block(l: &Loops, mut block: Vec<usize>) -> Option<Vec<usize>> {
    if block.iter().all(|&b| b == 0) {
        let i = (0..l.ranges.len()).find(|&i| l.parallel[i])?;
        block[i] = l.ranges[i];
    }
    Some(block)
}

/// Block tiles fit for a grid: a tile covering its whole loop is no tiling (a one-trip grid
/// dimension would only cost an index), and at most three loops are tiled (the grid's x, y, z;
/// MLIR's linear block ids mis-size grids beyond three): the extra loops with the fewest
/// iterations stay whole, run by each thread in turn.
fn grid_tiles(l: &Loops, mut block: Vec<usize>) -> Vec<usize> {
    for (b, &range) in block.iter_mut().zip(&l.ranges) {
        if *b != 0 && *b >= range {
            *b = 0;
        }
    }
    let mut tiled: Vec<usize> = (0..block.len()).filter(|&i| block[i] != 0).collect();
    while tiled.len() > 3 {
        let (k, _) = tiled
            .iter()
            .enumerate()
            .min_by_key(|(_, &i)| l.ranges[i] / block[i])
            .expect("more than three");
        block[tiled[k]] = 0;
        tiled.remove(k);
    }
    // The grid's y and z hold at most 65535 blocks: beyond the largest dimension (x), coarser
    // tiles (a divisor of the extent) until it fits, else the whole loop in each block.
    tiled.sort_by_key(|&i| std::cmp::Reverse(l.ranges[i] / block[i]));
    for &i in tiled.iter().skip(1) {
        if l.ranges[i] / block[i] > 65535 {
            let bigger = (block[i]..=l.ranges[i])
                .find(|&t| l.ranges[i].is_multiple_of(t) && l.ranges[i] / t <= 65535);
            block[i] = match bigger {
                Some(t) if t < l.ranges[i] => t,
                _ => 0,
            };
        }
    }
    block
}

/// How a contraction (matmul or convolution) is tiled, per loop of the op.
#[derive(Clone, Debug)]
struct ContractionPlan {
    /// Block tile (0: the whole loop).
    block: Vec<usize>,
    /// Threads over each loop of the block tile (0: none).
    threads: Vec<usize>,
    /// Reduction step (0: the whole loop).
    step: Vec<usize>,
}

/// Accumulator elements per block (its workgroup-memory tile: 16 KB of f32).
const ACC_ELEMENTS: usize = 4096;

/// The contraction tiling: the output tile over the last parallel loops (matmul: m, n;
/// convolution: output channels and the two image axes), as large as the accumulator allows,
/// each thread computing a few outputs; the reduction in steps over its outermost loop (matmul:
/// k; convolution: input channels, the filter window whole) sized so both operand tiles stay
/// small. The operand tiles' real size is checked when workgroup memory is assigned.
fn contraction_plan(op: RawOp, l: &Loops) -> Option<ContractionPlan> {
    let n = l.ranges.len();
    let par: Vec<usize> = (0..n).filter(|&i| l.parallel[i] && l.ranges[i] > 1).collect();
    let red: Vec<usize> = (0..n).filter(|&i| !l.parallel[i] && l.ranges[i] > 1).collect();
    if par.is_empty() || red.is_empty() || l.reduction_extent() < 16 || l.parallel_extent() < 64 {
        return None;
    }
    // SAFETY: a live linalg op.
    let conv = unsafe { mlir_sys::mlirLinalgIsAConvolutionOp(op.0) };
    // The loops tiled inside a block, innermost last, with each one's largest tile.
    let tiled: Vec<(usize, usize)> = if conv {
        // (batch, channels, rows, columns): channels up to 32, columns up to 32, rows to fill.
        let p: Vec<usize> = (0..n).filter(|&i| l.parallel[i]).collect();
        if p.len() < 3 {
            return None;
        }
        let (c, w) = (p[1], p[p.len() - 1]);
        let mut t = vec![(c, 32), (w, 32)];
        if p.len() >= 4 {
            t.insert(1, (p[p.len() - 2], ACC_ELEMENTS));
        }
        t
    } else if par.len() >= 2 {
        vec![(par[par.len() - 2], 64), (par[par.len() - 1], 64)]
    } else {
        vec![(par[0], 256)]
    };
    let mut block = vec![0; n];
    for &i in &par {
        block[i] = 1;
    }
    let mut budget = ACC_ELEMENTS;
    // Innermost first, so the tile is contiguous where memory is.
    for &(i, cap) in tiled.iter().rev() {
        let b = divisor_at_most(l.ranges[i], cap.min(budget));
        block[i] = b;
        budget = (budget / b).max(1);
    }
    let acc: usize = tiled.iter().map(|&(i, _)| block[i]).product();
    if acc < 64 {
        return None;
    }
    // Threads: up to 16 along the innermost tiled loop, the rest of 256 over the others.
    let mut threads = vec![0; n];
    let mut left = BLOCK_THREADS;
    for (k, &(i, _)) in tiled.iter().rev().enumerate() {
        let cap = if k == 0 { 16 } else { left };
        let t = divisor_at_most(block[i], cap.min(left));
        if t > 1 {
            threads[i] = t;
            left /= t;
        }
    }
    if threads.iter().filter(|&&t| t > 0).product::<usize>() < 32 {
        return None;
    }
    // The reduction step: input tile plus filter (or B) tile within about 12 KB of f32.
    let r = red[0];
    let inner: usize = red[1..].iter().map(|&i| l.ranges[i]).product::<usize>().max(1);
    let per_index = if conv {
        // Per input channel: the input window (stride at most 2) and the filter slice.
        let rows: usize = tiled.iter().skip(1).map(|&(i, _)| 2 * block[i] + 4).product();
        rows + block[tiled[0].0] * inner
    } else {
        (acc / block[tiled[tiled.len() - 1].0] + block[tiled[tiled.len() - 1].0]) * inner
    };
    let cap = (3072 / per_index.max(1)).clamp(1, 32);
    let mut step = vec![0; n];
    step[r] = divisor_at_most(l.ranges[r], cap);
    Some(ContractionPlan { block: grid_tiles(l, block), threads, step })
}

/// Applies `strategy` to the kernel module. On error the module may be half transformed: the
/// caller rebuilds it before trying another strategy.
pub fn apply(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    strategy: Strategy,
) -> Result<(), String> {
    let root = RawOp::of(&module.as_operation());
    let func = kernel_func(root).ok_or("no kernel function")?;
    match strategy {
        Strategy::PerOp => per_op(mlir, module, func),
        Strategy::Tile | Strategy::TensorCore => {
            Err("tile kernels are not transform schedules".into())
        }
        _ => {
            let plan = blocks(mlir, module, func, strategy)?;
            threads(mlir, module, strategy, plan.as_ref())?;
            fuse_into_threads(mlir, module, strategy)
        }
    }
}

fn run(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    s: Script,
    what: &str,
) -> Result<(), String> {
    mlir.apply_transform(&module.as_operation(), &s.finish()).map_err(|e| format!("{what}: {e}"))
}

/// The anchor: the last compute op that is not a fill.
fn anchor_of(ops: &[RawOp]) -> Option<RawOp> {
    ops.iter().rev().copied().find(|o| is_compute(*o) && !o.is("linalg.fill"))
}

/// Phase 1: the block grid over the anchor, every other compute op fused in.
fn blocks(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    func: RawOp,
    strategy: Strategy,
) -> Result<Option<ContractionPlan>, String> {
    let ctx = &mlir.ctx;
    let ops = func.children();
    let anchor = anchor_of(&ops).ok_or("nothing to tile")?;
    let l = loops::loops(anchor).ok_or("the anchor has no static loops")?;
    let mut plan = None;
    let block = match strategy {
        Strategy::Contraction => {
            let root =
                ops.iter().copied().rev().find(|o| is_contraction(*o)).ok_or("no contraction")?;
            let rl = loops::loops(root).ok_or("the contraction has no static loops")?;
            let cp = contraction_plan(root, &rl).ok_or("the contraction is too small")?;
            let block = cp.block.clone();
            plan = Some(cp);
            root.set_unit_attr(ctx, "kiln.contraction");
            // The anchor's loops are the contraction's parallel loops, in order.
            let par: Vec<usize> =
                (0..rl.ranges.len()).filter(|&i| rl.parallel[i]).map(|i| block[i]).collect();
            if par.len() != l.ranges.len() || l.has_reduction() && !is_contraction(anchor) {
                return Err("the epilogue does not follow the contraction's layout".into());
            }
            if is_contraction(anchor) {
                block
            } else {
                par
            }
        }
        Strategy::Reduction => {
            // One block per row of the (first) long reduction: the loops it keeps are tiled by
            // one, those it reduces stay whole in the block.
            let long = ops
                .iter()
                .filter(|o| splittable(**o))
                .filter_map(|o| loops::loops(*o))
                .find(|rl| innermost_reduction(rl).is_some_and(|(_, e)| e >= SPLIT_REDUCTION))
                .ok_or("no long reduction")?;
            let keep = if long.ranges == l.ranges { &long.parallel } else { &l.parallel };
            grid_tiles(
                &l,
                (0..l.ranges.len()).map(|i| usize::from(keep[i] && l.ranges[i] > 1)).collect(),
            )
        }
        _ => parallel_blocks(&l).ok_or("no parallel loop to distribute")?.0,
    };
    let block = at_least_one_block(&l, block).ok_or("no parallel loop to distribute")?;
    anchor.set_unit_attr(ctx, "kiln.anchor");
    // Padding stays out: fused into a tile it becomes a per-thread copy of the padded window
    // under a branch; alone it is a copy into a padded buffer in global memory.
    let producers: Vec<RawOp> = ops
        .iter()
        .copied()
        .filter(|o| is_compute(*o) && *o != anchor && !o.is("tensor.pad"))
        .collect();
    let mut s = Script::new();
    let a = s.tagged("kiln.anchor", None);
    let (_, mut forall) = s.tile_forall(&a, &block, &forall_of(&l, &block, "block"));
    for (i, p) in producers.iter().rev().enumerate() {
        let t = format!("kiln.p{i}");
        p.set_unit_attr(ctx, &t);
        let h = s.tagged(&t, None);
        forall = s.fuse(&h, &forall);
    }
    s.annotate(&forall, "kiln.block");
    let f = s.ops(&["func.func"], "%root");
    s.canonicalize(&f);
    run(mlir, module, s, "block tiling")?;
    Ok(plan)
}

/// Phase 2: the thread loops of the strategy inside the block.
fn threads(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    strategy: Strategy,
    plan: Option<&ContractionPlan>,
) -> Result<(), String> {
    let root = RawOp::of(&module.as_operation());
    let block = find_tagged(root, "kiln.block").ok_or("no block loop")?;
    let anchor = find_tagged(block, "kiln.anchor").ok_or("the anchor left the block")?;
    let al = loops::loops(anchor)
        .or_else(|| pad_loops(anchor))
        .ok_or("the anchor has no static loops")?;
    // (Read now: scheduling may replace the anchor op.)
    let anchor_is_contraction = anchor.attr("kiln.contraction").is_some();
    let mut s = Script::new();
    let blk = s.tagged("kiln.block", None);
    let mut anchor_done = false;
    match strategy {
        Strategy::Parallel => {}
        Strategy::Reduction => {
            let mut n = 0;
            for op in block.descendants().into_iter().filter(|o| is_compute(*o)) {
                let Some(l) = loops::loops(op) else { continue };
                let Some((r, extent)) = innermost_reduction(&l) else { continue };
                if extent < SPLIT_REDUCTION || !splittable(op) {
                    continue;
                }
                // Threads that divide the extent: every thread's share is static.
                let threads = divisor_at_most(extent, BLOCK_THREADS);
                if threads < 32 {
                    continue;
                }
                let t = format!("kiln.r{n}");
                n += 1;
                op.set_unit_attr(&mlir.ctx, &t);
                let h = s.tagged(&t, Some(&blk));
                let single = l.parallel.iter().filter(|p| !**p).count() == 1
                    && maps_are_projected_permutations(op);
                let (fill, forall, combine) = if single {
                    // Thread p accumulates elements p, p + T, p + 2T...: neighbouring threads read
                    // neighbouring elements (coalesced). The reduction becomes (outer, inner) with
                    // the inner one parallel, right after it; partials one per thread.
                    let out_rank = l.parallel.iter().filter(|p| **p).count();
                    let (fill, split, combine) = s.split_reduction(&h, threads, out_rank);
                    let mut counts = vec![0; l.ranges.len() + 1];
                    counts[r + 1] = threads;
                    let (_, forall) =
                        s.tile_forall_threads(&split, &counts, &["#gpu.thread<x>".to_string()]);
                    (fill, forall, combine)
                } else {
                    let mut counts = vec![0; l.ranges.len()];
                    counts[r] = threads;
                    let (fill, _, combine, forall) =
                        s.tile_reduction_threads(&h, &counts, "#gpu.thread<x>");
                    (fill, forall, combine)
                };
                s.fuse(&fill, &forall);
                s.annotate(&forall, "kiln.threads");
                if op == anchor {
                    // The combined result is one element per block: one thread writes it.
                    single_thread(&mut s, &combine, &al);
                    anchor_done = true;
                }
            }
            if n == 0 {
                return Err("no long reduction in the block".into());
            }
        }
        Strategy::Contraction => {
            let plan = plan.ok_or("no contraction plan")?;
            contraction_steps(mlir, module, block, plan)?;
            let c =
                find_tagged(block, "kiln.contraction").ok_or("the contraction left the block")?;
            let cl = loops::loops(c).ok_or("the contraction has no static loops")?;
            let threads = plan.threads.clone();
            // Both operands' tiles are copied into workgroup memory by all the block's threads.
            for i in 0..c.num_operands() - 1 {
                let pad = edit::defining_op(c.operand(i))
                    .filter(|p| p.is("tensor.pad"))
                    .ok_or("an operand tile was not materialised")?;
                let dims = edit::static_dims(edit::value_type(pad.result(0)))
                    .ok_or("a dynamic operand tile")?;
                let t = format!("kiln.pad{i}");
                pad.set_unit_attr(&mlir.ctx, &t);
                let h = s.tagged(&t, Some(&blk));
                let split = copy_split(&dims, BLOCK_THREADS);
                let counts: Vec<usize> = split.iter().copied().filter(|&c| c != 0).collect();
                let linear: Vec<String> = (0..counts.len())
                    .rev()
                    .map(|k| format!("#gpu.thread<linear_dim_{k}>"))
                    .collect();
                let (_, copy) = s.tile_forall_threads(&h, &split, &linear);
                s.annotate(&copy, "kiln.threads");
            }
            let h = s.tagged("kiln.contraction", Some(&blk));
            let (_, compute) = s.tile_forall_threads(&h, &threads, &thread_mapping_of(&threads));
            s.annotate(&compute, "kiln.threads");
            let a = s.tagged("kiln.anchor", Some(&blk));
            if !anchor_is_contraction {
                let at: Vec<usize> =
                    (0..cl.ranges.len()).filter(|&i| cl.parallel[i]).map(|i| threads[i]).collect();
                let (_, ep) = s.tile_forall_threads(&a, &at, &thread_mapping_of(&at));
                s.annotate(&ep, "kiln.threads");
            }
            anchor_done = true;
        }
        Strategy::PerOp | Strategy::Tile | Strategy::TensorCore => {
            unreachable!("{strategy} has no block phase")
        }
    }
    if !anchor_done {
        let split = thread_split(&al, BLOCK_THREADS);
        let a = s.tagged("kiln.anchor", Some(&blk));
        if split.is_empty() {
            single_thread(&mut s, &a, &al);
        } else {
            let mut tiles = vec![0; al.ranges.len()];
            for &(i, _) in &split {
                tiles[i] = 1;
            }
            let counts: Vec<usize> =
                (0..al.ranges.len()).filter(|&i| tiles[i] != 0).map(|i| al.ranges[i]).collect();
            let (_, f) = s.tile_forall(&a, &tiles, &mapping("thread", &counts));
            s.annotate(&f, "kiln.threads");
        }
    }
    let f = s.ops(&["func.func"], "%root");
    s.canonicalize(&f);
    run(mlir, module, s, &format!("{strategy} threads"))
}

/// The contraction's reduction in steps: its accumulator in workgroup memory, zeroed by the
/// threads that will update it; each step's operand tiles materialised (padded copies, which
/// become workgroup tiles).
fn contraction_steps(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    block: RawOp,
    plan: &ContractionPlan,
) -> Result<(), String> {
    let c = find_tagged(block, "kiln.contraction").ok_or("the contraction left the block")?;
    let cl = loops::loops(c).ok_or("the contraction has no static loops")?;
    let (threads, step) = (plan.threads.clone(), plan.step.clone());
    // The accumulator: the fill initialising it writes a fresh tensor, which becomes workgroup
    // memory (not the output tile: copying that in first would race with the fill).
    let fill_op = edit::defining_op(c.operand(c.num_operands() - 1))
        .filter(|f| f.is("linalg.fill"))
        .ok_or("the contraction's init is not a fill")?;
    let acc = fill_op.operand(fill_op.num_operands() - 1);
    let empty = new_empty(&mlir.ctx, edit::value_type(acc), fill_op)?;
    fill_op.set_operand(fill_op.num_operands() - 1, empty.result(0));
    let mut s = Script::new();
    let blk = s.tagged("kiln.block", None);
    let h = s.tagged("kiln.contraction", Some(&blk));
    let fill = s.producer_of(&h, c.num_operands() - 1);
    let (_, fl) = s.tile_forall_threads(
        &fill,
        &threads_for_parallel(&cl, &threads),
        &thread_mapping_of(&threads),
    );
    s.annotate(&fl, "kiln.threads");
    let h = s.tagged("kiln.contraction", Some(&blk));
    let (stepped, _) = s.tile_for(&h, &step);
    s.pad_inputs(&stepped, cl.ranges.len(), c.num_operands(), &zero_of(c));
    run(mlir, module, s, "contraction steps")
}

/// A `tensor.empty` of type `t` (static) inserted before `before`.
pub fn new_empty(
    ctx: &melior::Context,
    t: mlir_sys::MlirType,
    before: RawOp,
) -> Result<RawOp, String> {
    // SAFETY: a live type of this context.
    let ty = unsafe { melior::ir::Type::from_raw(t) };
    let op = melior::ir::operation::OperationBuilder::new(
        "tensor.empty",
        melior::ir::Location::unknown(ctx),
    )
    .add_results(&[ty])
    .build()
    .map_err(|e| format!("building tensor.empty: {e}"))?;
    let raw = op.into_raw();
    // SAFETY: the new op goes into `before`'s block, before it.
    unsafe {
        let block = mlir_sys::mlirOperationGetBlock(before.0);
        mlir_sys::mlirBlockInsertOwnedOperationBefore(block, before.0, raw);
    }
    Ok(RawOp(raw))
}

/// Threads per dimension (0: none) to copy a tile of `dims` with `budget` threads, innermost
/// dimension first so neighbouring threads touch neighbouring elements; each count divides its
/// dimension.
fn copy_split(dims: &[usize], budget: usize) -> Vec<usize> {
    let mut budget = budget;
    let mut out = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        if budget < 2 || dims[i] < 2 {
            continue;
        }
        let t = divisor_at_most(dims[i], budget);
        if t > 1 {
            out[i] = t;
            budget /= t;
        }
    }
    if out.iter().all(|&t| t == 0) {
        // A one-element tile: one thread.
        if let Some(last) = out.last_mut() {
            *last = 1;
        }
    }
    out
}

/// Thread counts over an op's parallel loops only (for the fill of the contraction's output).
fn threads_for_parallel(l: &Loops, threads: &[usize]) -> Vec<usize> {
    (0..l.ranges.len()).filter(|&i| l.parallel[i]).map(|i| threads[i]).collect()
}

/// Thread mapping for per-loop thread counts (0: untiled).
fn thread_mapping_of(counts: &[usize]) -> Vec<String> {
    let c: Vec<usize> = counts.iter().copied().filter(|&c| c != 0).collect();
    mapping("thread", &c)
}

/// The zero of a contraction's element type, as a padding value.
fn zero_of(op: RawOp) -> String {
    let t = edit::value_type(op.operand(0));
    // The script spells the element type; it is printed, not parsed.
    let elem = edit::element_type(t).map_or_else(|| "f32".to_string(), edit::type_text);
    if elem.starts_with('f') || elem == "bf16" {
        format!("0.0 : {elem}")
    } else {
        format!("0 : {elem}")
    }
}

/// Tiles `op` (one element per block) to a single thread, so one thread writes it.
fn single_thread(s: &mut Script, op: &str, l: &Loops) {
    let counts: Vec<usize> = (0..l.ranges.len()).map(|i| usize::from(l.parallel[i])).collect();
    if counts.iter().all(|&c| c == 0) {
        return;
    }
    let n = counts.iter().filter(|&&c| c != 0).count();
    let (_, f) = s.tile_forall_threads(op, &counts, &mapping("thread", &vec![1; n]));
    s.annotate(&f, "kiln.threads");
}

/// Phase 3: ops left at block level move into the thread loops using them, nearest first, until
/// none can. The Reduction strategy keeps ops with reduction loops (its combines) at block level.
fn fuse_into_threads(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    strategy: Strategy,
) -> Result<(), String> {
    let root = RawOp::of(&module.as_operation());
    for _round in 0..64 {
        let block = find_tagged(root, "kiln.block").ok_or("no block loop")?;
        let thread_loops: Vec<RawOp> =
            block.descendants().into_iter().filter(|o| o.attr("kiln.threads").is_some()).collect();
        let in_threads = |op: RawOp| thread_loops.iter().any(|t| op.is_inside(*t));
        let candidates: Vec<RawOp> = block
            .descendants()
            .into_iter()
            .filter(|o| is_compute(*o) && !in_threads(*o))
            .filter(|o| {
                strategy != Strategy::Reduction
                    || loops::loops(*o).is_none_or(|l| !l.has_reduction())
            })
            .collect();
        let mut step = None;
        // The last candidate whose result a thread loop uses.
        'find: for op in candidates.iter().rev() {
            for r in 0..op.num_results() {
                for u in edit::users(op.result(r)) {
                    if let Some(t) = thread_loops.iter().find(|t| u.is_inside(**t) || u == **t) {
                        step = Some((*op, *t));
                        break 'find;
                    }
                }
            }
        }
        let Some((op, target)) = step else { return Ok(()) };
        op.set_unit_attr(&mlir.ctx, "kiln.fusing");
        target.set_unit_attr(&mlir.ctx, "kiln.into");
        let mut s = Script::new();
        let p = s.tagged("kiln.fusing", None);
        let t = s.tagged("kiln.into", None);
        let l = s.fuse(&p, &t);
        s.raw(&format!("transform.annotate {l} \"kiln.threads\" : !transform.any_op"));
        let r = run(mlir, module, s, "fusion into threads");
        // Whatever happened, the markers must not match again.
        for o in root.descendants() {
            o.remove_attr("kiln.fusing");
            o.remove_attr("kiln.into");
        }
        r?;
    }
    Err("fusion into threads did not settle".into())
}

/// The first op under `root` carrying the unit attribute `name`.
pub fn find_tagged(root: RawOp, name: &str) -> Option<RawOp> {
    root.descendants().into_iter().find(|o| o.attr(name).is_some())
}

/// PerOp: every compute op its own block grid and thread split, nothing fused.
fn per_op(mlir: &MlirContext, module: &melior::ir::Module, func: RawOp) -> Result<(), String> {
    // (Padding is left to bufferisation: a fill and a copy, distributed afterwards.)
    let ops: Vec<RawOp> =
        func.children().into_iter().filter(|o| loops::is_structured(*o)).collect();
    tile_each(mlir, module, &ops, "per-op tiling")
}

/// Gives each op its own block grid (tiles of its innermost loops) and thread loop (one element
/// per thread), on tensors or, after bufferisation, on buffers.
pub fn tile_each(
    mlir: &MlirContext,
    module: &melior::ir::Module,
    ops: &[RawOp],
    what: &str,
) -> Result<(), String> {
    let mut s = Script::new();
    let mut n = 0;
    for &op in ops {
        // An op without parallel loops to distribute is left alone: it runs on one thread.
        let Some(l) = loops::loops(op).or_else(|| pad_loops(op)) else { continue };
        if l.ranges.contains(&0) {
            // Nothing to do (and nothing MLIR can tile): an op on buffers goes.
            if op.num_results() == 0 {
                op.erase();
            }
            continue;
        }
        let Some((block, split)) = parallel_blocks(&l) else { continue };
        let Some(block) = at_least_one_block(&l, block) else { continue };
        let name = format!("kiln.op{n}");
        n += 1;
        op.set_unit_attr(&mlir.ctx, &name);
        let h = s.tagged(&name, None);
        let (tiled, forall) = s.tile_forall(&h, &block, &forall_of(&l, &block, "block"));
        s.annotate(&forall, "kiln.block");
        if !split.is_empty() {
            let mut tiles = vec![0; l.ranges.len()];
            for &(i, _) in &split {
                tiles[i] = 1;
            }
            let counts: Vec<usize> = split.iter().rev().map(|&(_, t)| t).collect();
            let (_, t) = s.tile_forall(&tiled, &tiles, &mapping("thread", &counts));
            s.annotate(&t, "kiln.threads");
        }
    }
    if n == 0 {
        return Ok(());
    }
    let f = s.ops(&["func.func"], "%root");
    s.canonicalize(&f);
    let r = run(mlir, module, s, what);
    // The tiled ops keep their tags; a later call must not match them again.
    let root = RawOp::of(&module.as_operation());
    for o in root.descendants() {
        for i in 0..n {
            o.remove_attr(&format!("kiln.op{i}"));
        }
    }
    r
}

/// A `tensor.pad`'s loops: its result's dimensions, all parallel.
fn pad_loops(op: RawOp) -> Option<Loops> {
    if !op.is("tensor.pad") {
        return None;
    }
    let dims = edit::static_dims(edit::value_type(op.result(0)))?;
    let n = dims.len();
    Some(Loops { ranges: dims, parallel: vec![true; n] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loops(ranges: &[usize], parallel: &[bool]) -> Loops {
        Loops { ranges: ranges.to_vec(), parallel: parallel.to_vec() }
    }

    #[test]
    fn divisors_stay_under_the_cap_and_degenerate_sizes_give_one() {
        assert_eq!(divisor_at_most(12, 5), 4);
        assert_eq!(divisor_at_most(128, 256), 128);
        assert_eq!(divisor_at_most(257, 256), 1, "a prime past the cap");
        assert_eq!(divisor_at_most(0, 8), 1);
        assert_eq!(divisor_at_most(8, 0), 1);
    }

    #[test]
    fn threads_split_the_innermost_parallel_loops_within_the_budget() {
        // 128 threads on the innermost loop leave 2 for the next; the outermost gets none.
        let l = loops(&[4, 64, 128], &[true, true, true]);
        assert_eq!(thread_split(&l, BLOCK_THREADS), vec![(2, 128), (1, 2)]);
        // Reduction loops take no threads; a loop of one neither.
        let l = loops(&[8, 1, 100, 7], &[true, true, true, false]);
        assert_eq!(thread_split(&l, BLOCK_THREADS), vec![(2, 100), (0, 2)]);
        // A prime extent past the budget has no divisor to split by.
        assert_eq!(thread_split(&loops(&[257], &[true]), BLOCK_THREADS), vec![]);
        // At most three loops, each count dividing its loop.
        let l = loops(&[2, 2, 2, 2], &[true; 4]);
        assert_eq!(thread_split(&l, BLOCK_THREADS), vec![(3, 2), (2, 2), (1, 2)]);
    }

    #[test]
    fn grid_tiles_drop_whole_loops_keep_three_and_fit_y_and_z() {
        // A tile covering its loop is no tiling.
        assert_eq!(grid_tiles(&loops(&[4, 8], &[true, true]), vec![4, 2]), vec![0, 2]);
        // Four tiled loops: the one with the fewest blocks stays whole.
        let l = loops(&[2, 3, 4, 5], &[true; 4]);
        assert_eq!(grid_tiles(&l, vec![1, 1, 1, 1]), vec![0, 1, 1, 1]);
        // y holds at most 65535 blocks: a coarser tile that divides the loop (2^17 / 2 is one
        // block too many)...
        let l = loops(&[200_000, 131_072], &[true, true]);
        assert_eq!(grid_tiles(&l, vec![1, 1]), vec![1, 4]);
        // ...or, when only the whole loop divides a prime, no tiling of it.
        let l = loops(&[200_000, 131_071], &[true, true]);
        assert_eq!(grid_tiles(&l, vec![1, 1]), vec![1, 0]);
    }

    #[test]
    fn parallel_blocks_cover_the_thread_split() {
        let l = loops(&[4, 64, 128], &[true, true, true]);
        // The innermost loop's 128 threads cover it whole: the grid tiles the other two.
        assert_eq!(parallel_blocks(&l), Some((vec![1, 2, 0], vec![(2, 128), (1, 2)])));
        // Nothing parallel to tile or split.
        assert_eq!(parallel_blocks(&loops(&[1, 9], &[true, false])), None);
    }

    #[test]
    fn one_block_at_least_on_the_first_parallel_loop() {
        let l = loops(&[5, 6], &[false, true]);
        assert_eq!(at_least_one_block(&l, vec![0, 0]), Some(vec![0, 6]));
        assert_eq!(at_least_one_block(&l, vec![0, 3]), Some(vec![0, 3]), "already tiled");
        assert_eq!(at_least_one_block(&loops(&[5], &[false]), vec![0]), None);
    }

    #[test]
    fn copies_split_innermost_first_and_a_single_element_takes_one_thread() {
        assert_eq!(copy_split(&[4, 64], 256), vec![4, 64]);
        assert_eq!(copy_split(&[7, 9], 4), vec![0, 3]);
        assert_eq!(copy_split(&[1, 1], 256), vec![0, 1]);
        assert_eq!(copy_split(&[], 256), Vec::<usize>::new());
    }
}
