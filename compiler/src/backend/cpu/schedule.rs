//! Per-kernel schedules for the CPU, decided in Rust from the typed analysis of the kernel's linalg
//! ops (`backend::linalg`): how a kernel is split into workgroups, how each workgroup is tiled into
//! register-sized pieces and vectorised. `decide` is a pure function of the analysis; its
//! `Schedule` prints (`kiln emit --stage schedule`) and `script.rs` turns it into the transform
//! dialect scripts that carry it out.
//!
//! Phases of the scripts:
//! - A: the last linalg op (the anchor) is tiled into an `scf.forall` of workgroups and every
//!   producer is fused in; then, inside, the anchor is tiled to a register tile and its
//!   elementwise producers and the contraction feeding them (with its fill) are fused into that
//!   tile; the contraction's reduction loops are tiled by 1; the innermost (vector) loop is peeled
//!   when the tile does not divide it.
//! - B: unit dimensions are folded away (a direct convolution's window offsets then vanish from
//!   its input map), then every small static linalg op is vectorised on its own (one that cannot
//!   be stays a loop nest).
//! - C: canonicalisation folds the tile-sized tensors into SSA vectors and the accumulators are
//!   hoisted out of the reduction loops, so they live in registers.

use std::collections::HashSet;
use std::fmt;

use crate::backend::linalg::{Elem, Expr, LinalgOp, OpKind};

/// Kernels with less work than this (loop iterations of all their ops: multiply-adds of a
/// contraction, elements of an elementwise op) run as one workgroup: a few microseconds of
/// vector code, less than handing work to another thread is worth.
const MIN_DISTRIBUTED_WORK: usize = 128 * 1024;
/// Work per workgroup aimed at, up to the most workgroups a kernel gets (`decide`'s
/// `distribute`, `Host::max_units`: two a planned thread, enough for threads that take them one
/// at a time to finish together, few enough to keep each one's share of fused producers (a
/// convolution's padded rows) small. With 2 threads, at most 4 measured best (resnet18 22.0 ms
/// against 22.8 with 2, 22.2 with 6, 23.7 with 8).
const WORK_PER_WORKGROUP: usize = 1 << 20;
/// The most workgroups the figures above measured (2 threads): up to it, plans are as measured.
const MAX_WORKGROUPS_MEASURED: usize = 4;
/// Vectorised ops at most this many elements (a register tile, not a whole tensor).
const MAX_VECTOR_ELEMENTS: usize = 1024;

/// A kernel's schedule: what `script.rs` carries out. Op numbers index the kernel's ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The op the workgroups and register tiles are cut from (the last linalg op).
    pub anchor: usize,
    /// The workgroup split, if any.
    pub split: Option<Split>,
    /// The anchor's output extents inside one workgroup.
    pub local: Vec<usize>,
    /// The register tiling, if the anchor has one (only when vectorising).
    pub register: Option<Register>,
    /// Row reductions outside the register tile, each tiled to one row and the row to chunks of
    /// this many elements (0: the whole row), each chunk a vector.
    pub rows: Vec<(usize, usize)>,
    /// Ops left as loop nests whose loops are reordered (the output row innermost).
    pub reorder: Vec<(usize, Vec<usize>)>,
    /// Whether phases B and C (vectorisation) run.
    pub vectorize: bool,
}

/// Workgroups along one output dimension of the anchor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub dim: usize,
    pub tile: usize,
    pub workgroups: usize,
}

impl Schedule {
    pub fn workgroups(&self) -> u64 {
        self.split.map_or(1, |s| s.workgroups as u64)
    }
}

/// How the anchor is split into register tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Register {
    /// Tile size of each anchor loop.
    pub sizes: Vec<usize>,
    /// Indices (into the kernel's linalg ops) fused into the register tile, nearest first.
    pub chain: Vec<usize>,
    /// The contraction among them and its reduction tile sizes.
    pub contraction: Option<(usize, Vec<usize>)>,
    /// The vector loop does not divide evenly: peel its remainder.
    pub peel: bool,
    /// The contraction is vectorised along its reduction loop (tiled by the lane count into
    /// partial sums), not along the output's last dimension.
    pub dot: bool,
}

/// The largest divisor of `n` that is at most `cap`.
fn divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n)).rev().find(|&d| n.is_multiple_of(d)).unwrap_or(1)
}

/// Elements of the native vector for an element type (64-byte registers).
fn lanes(elem: Elem) -> Option<usize> {
    match elem {
        // (8- and 16-bit integers take 16 lanes too: they are converted to or from f32 or i32
        // beside them, a quantized model's elementwise work.)
        Elem::F32 | Elem::Int(32) | Elem::Int(16) | Elem::Int(8) => Some(16),
        Elem::F64 | Elem::Int(64) => Some(8),
        _ => None,
    }
}

/// The register tiling of the anchor `ops[a]` whose (workgroup-local) output extents are `local`.
fn register_plan(ops: &[LinalgOp], a: usize, local: &[usize]) -> Option<Register> {
    let anchor = &ops[a];
    let full = anchor.output_shape()?.clone();
    let r = full.len();
    if !anchor.is_generic()
        || !anchor.output_is_identity()
        || r == 0
        || local.len() != r
        || anchor.loops() < r
    {
        return None;
    }
    if anchor.parallel[..r].iter().any(|&p| !p) || anchor.parallel[r..].iter().any(|&p| p) {
        return None;
    }
    // A contraction's init must be a fill, fused along with it.
    let fill_of = |c: usize| -> Option<usize> {
        let init = ops[c].producers.get(ops[c].n_inputs).copied().flatten()?;
        (ops[init].kind == OpKind::Fill).then_some(init)
    };
    // The chain: producers writing a tensor of the anchor's shape through identity maps, down to
    // (and including) one contraction and its fill.
    let mut chain: Vec<usize> = Vec::new();
    let mut contraction = None;
    let mut seen: HashSet<usize> = HashSet::from([a]);
    if anchor.loops() > r {
        // Its fill feeds the register loops' iteration arguments, where fusion cannot reach it:
        // it stays a workgroup-wide fill.
        fill_of(a)?;
        contraction = Some(a);
    }
    let mut stack = if contraction.is_some() { vec![] } else { vec![a] };
    while let Some(i) = stack.pop() {
        let op = &ops[i];
        for k in 0..op.n_inputs {
            let Some(p) = op.producers.get(k).copied().flatten() else { continue };
            if seen.contains(&p) {
                continue;
            }
            let prod = &ops[p];
            let reads_whole = op.maps[k].len() == r
                && op.maps[k].iter().enumerate().all(|(j, e)| e.as_dim() == Some(j));
            if !prod.is_generic()
                || !prod.output_is_identity()
                || prod.output_shape() != Some(&full)
                || !reads_whole
            {
                continue;
            }
            if prod.loops() > r {
                if contraction.is_some()
                    || prod.parallel[..r].iter().any(|&p| !p)
                    || prod.parallel[r..].iter().any(|&p| p)
                {
                    return None;
                }
                let f = fill_of(p)?;
                contraction = Some(p);
                seen.insert(f);
                chain.push(f);
            } else {
                stack.push(p);
            }
            seen.insert(p);
            chain.push(p);
        }
    }
    chain.sort_unstable_by(|x, y| y.cmp(x));
    // Every fused op must read its operands so that the vector (last) loop runs along their last,
    // contiguous dimension, and other parallel loops index whole dimensions; reduction loops
    // (tiled by 1) may add window offsets. A contraction whose operands are contiguous along its
    // one reduction loop instead (a matmul by a transposed matrix, a matrix-vector product) is
    // vectorised along that loop: partial sums per lane, added up at the end.
    let v = r - 1;
    let contiguous = |op: &LinalgOp, maps: &[Vec<Expr>]| -> bool {
        maps.iter().all(|map| {
            map.iter().enumerate().all(|(j, e)| {
                let Expr::Linear(terms, _) = e else { return false };
                let par: Vec<&(usize, i64)> =
                    terms.iter().filter(|&&(d, _)| op.parallel[d]).collect();
                par.len() <= 1
                    && par.iter().all(|&&(_, c)| c == 1)
                    && !(par.first().is_some_and(|&&(d, _)| d == v) && j + 1 != map.len())
            })
        })
    };
    let members: Vec<usize> = std::iter::once(a).chain(chain.iter().copied()).collect();
    let mut dot = false;
    for &i in &members {
        let op = &ops[i];
        if op.kind == OpKind::Fill {
            continue;
        }
        // Contractions in f32; elementwise ops also on 8-, 16- and 32-bit integers (a
        // quantized model's (de)quantizing and residual adds, which ran as scalar loops).
        let elementwise_elem = |e: &Elem| matches!(e, Elem::F32 | Elem::Int(8 | 16 | 32));
        if op.elem.iter().any(|&e| e != Elem::F32)
            && (contraction.is_some() || !op.elem.iter().all(elementwise_elem))
        {
            return None;
        }
        let inputs_of_contraction = Some(i) == contraction;
        let (ins, outs) = op.maps.split_at(if inputs_of_contraction { op.n_inputs } else { 0 });
        if !contiguous(op, outs) {
            return None;
        }
        if !contiguous(op, ins) {
            // Each input reads the one reduction loop as its last, whole dimension.
            let k = op.loops() - 1;
            let along_k = op.loops() == r + 1
                && ins.iter().all(|m| {
                    m.last().and_then(Expr::as_dim) == Some(k)
                        && m.iter().all(|e| e.as_dim().is_some())
                });
            if !along_k {
                return None;
            }
            dot = true;
        }
    }
    if local[v] < 2 {
        return None;
    }
    let lanes = lanes(ops[contraction.unwrap_or(a)].elem[0])?;
    let vl = if local[v] <= lanes / 2 { lanes / 2 } else { lanes };
    let mut sizes = vec![1usize; r];
    if dot {
        let c = contraction?;
        let k = ops[c].ranges()?[r];
        if !k.is_multiple_of(lanes) {
            return None;
        }
        // Rows of partial sums: one vector each per step.
        sizes[v] = divisor_at_most(local[v], 8);
        let red = (0..ops[c].loops()).map(|i| if i < r { 0 } else { lanes }).collect();
        return Some(Register {
            peel: false,
            sizes,
            chain,
            contraction: Some((c, red)),
            dot: true,
        });
    }
    match contraction {
        Some(c) => {
            // The loops the contraction's vector-loaded operands (those whose last dimension is the
            // vector loop) depend on; the others are broadcast.
            let mut vector_users: HashSet<usize> = HashSet::new();
            for map in &ops[c].maps[..ops[c].n_inputs] {
                if map.last().is_some_and(|e| e.coefficient(v).is_some()) {
                    vector_users.extend(map.iter().flat_map(|e| e.dims()).filter(|&d| d < r));
                }
            }
            // One vector per row, up to 16 rows (16 accumulators): measured 3% faster on
            // resnet18 than two vectors by 8 rows, no different elsewhere.
            let nt = vl.min(local[v]);
            sizes[v] = nt;
            let mut acc = 1;
            // Rows that only the broadcast operands index (a matmul's m, a convolution's output
            // channels): each costs one broadcast and one FMA per step.
            if let Some(m) = (0..r)
                .filter(|&i| i != v && local[i] > 1 && !vector_users.contains(&i))
                .max_by_key(|&i| local[i])
            {
                sizes[m] = divisor_at_most(local[m], 16 / acc);
                acc *= sizes[m];
            }
            // Then rows of the vector operands (a convolution's output rows), up to ~16 accumulators.
            for i in (0..v).rev() {
                if acc >= 12 {
                    break;
                }
                if sizes[i] == 1 && local[i] > 1 && vector_users.contains(&i) {
                    sizes[i] = divisor_at_most(local[i], 16 / acc);
                    acc *= sizes[i];
                }
            }
        }
        None => {
            sizes[v] = if local[v] >= 4 * vl {
                4 * vl
            } else if local[v] >= 2 * vl {
                2 * vl
            } else {
                vl.min(local[v])
            };
        }
    }
    let contraction = contraction.map(|c| {
        let n = ops[c].loops();
        (c, (0..n).map(|i| if i < r { 0 } else { 1 }).collect())
    });
    Some(Register {
        peel: !local[v].is_multiple_of(sizes[v]),
        sizes,
        chain,
        contraction,
        dot: false,
    })
}

/// The fewest elements along the innermost dimension a unit may keep (a register tile's vector).
const MIN_SPLIT_ROW: usize = 16;

/// The bytes of the kernel's inputs (operands no op of it produces) that each of `w` units
/// reads when the output's dimension `d` is split: an input indexed by the loop that makes
/// dimension `d` of an op's output (an output of the kernel's rank) is read a part a unit, any
/// other whole, as is every input of an op that reduces dimension `d` (each unit computes all
/// of a softmax's sums when its reduced axis is split).
fn unit_input_bytes(ops: &[LinalgOp], dims: &[usize], d: usize, w: usize) -> usize {
    let mut total = 0;
    for op in ops {
        let out_map = op.maps.get(op.n_inputs);
        let along =
            out_map.filter(|m| m.len() == dims.len()).and_then(|m| m.get(d)).and_then(Expr::as_dim);
        for i in 0..op.n_inputs {
            if op.producers.get(i).copied().flatten().is_some() {
                continue;
            }
            let Some(Some(shape)) = op.shapes.get(i) else { continue };
            let size = op.elem.get(i).map_or(4, |e| e.bytes());
            let bytes = shape.iter().product::<usize>() * size;
            let divided = along.is_some_and(|l| {
                op.maps.get(i).is_some_and(|m| m.iter().any(|e| e.dims().contains(&l)))
            });
            total += if divided { bytes / w.max(1) } else { bytes };
        }
    }
    total
}

/// Decides a kernel's schedule from its ops and its output's dimensions; `None` runs it as it is
/// (one workgroup, scalar loops). Without `vectorize`, only the workgroup split; `distribute`
/// is the most workgroups it may split into (`None`: one).
pub fn decide(
    ops: &[LinalgOp],
    dims: &[usize],
    sequential: bool,
    vectorize: bool,
    distribute: Option<usize>,
) -> Option<Schedule> {
    // A sequential loop (scatter updates applied in order) must run exactly once, as it is.
    if sequential {
        return None;
    }
    let a = ops.iter().rposition(|o| o.name.starts_with("linalg.") && o.kind != OpKind::Fill)?;
    // Iterations of every op, an iteration with a transcendental function counting as several
    // (GELU's erf on 128 x 512 floats is worth splitting; a bias add that size is not).
    let work: usize = ops
        .iter()
        .filter_map(|o| o.ranges().map(|r| r.iter().product::<usize>() * o.body_cost.max(1)))
        .sum();
    // Distribution: the dimension to split: image rows for batch-1 images (a halo of input per
    // workgroup instead of the whole input), else the first that is not tiny; evenly, so every
    // workgroup has the same static shape.
    let mut split = None;
    if let Some(most) = distribute.filter(|_| work >= MIN_DISTRIBUTED_WORK) {
        // Past 4 units (more than 2 threads), each unit's share shrinks with the threads, to
        // MIN_DISTRIBUTED_WORK at the least: a 3 M-iteration convolution is 3 units at 2
        // threads and 23 at 16.
        let most = most.max(2);
        let per = (WORK_PER_WORKGROUP * MAX_WORKGROUPS_MEASURED / most).max(MIN_DISTRIBUTED_WORK);
        let target = (work / per).clamp(2, most);
        let rows = (dims.len() == 4 && dims[0] == 1 && dims[2] >= 8).then_some(2);
        let others = (0..dims.len()).filter(|&i| dims[i] >= 2);
        // Tiling loop d splits output dimension d only where the anchor's output map indexes
        // that dimension by loop d itself (not so for a reduction over a leading dimension).
        let splittable = |d: usize| {
            ops[a].maps.get(ops[a].n_inputs).and_then(|m| m.get(d)).and_then(Expr::as_dim)
                == Some(d)
        };
        let candidates: Vec<(usize, usize)> = rows
            .into_iter()
            .chain(others)
            .filter(|&d| splittable(d))
            .map(|d| (d, divisor_at_most(dims[d], target)))
            .collect();
        // The first candidate that splits; past 4 units, the first giving the target, else the
        // one giving the most (a batch of 8 caps a split of it at 8 units; its rows may give
        // more). At 2 threads the first, as measured.
        let first = if target <= MAX_WORKGROUPS_MEASURED {
            candidates.iter().find(|(_, w)| *w >= 2)
        } else {
            candidates.iter().find(|(_, w)| *w == target).or_else(|| {
                candidates.iter().rev().max_by_key(|(_, w)| *w).filter(|(_, w)| *w >= 2)
            })
        };
        // Past an image's rows, of the dimensions giving as many units, the one whose units
        // read the fewest bytes of the kernel's inputs: a matrix product of few rows splits its
        // columns, so that each unit reads a part of the weights, not all of them (GPT-2's
        // 32 x 128 by 128 x 512, 2 threads: 43 -> 30 us).
        let pick = first.map(|&(d0, w)| {
            if rows == Some(d0) {
                return (d0, w);
            }
            let fits = |&&(d, wd): &&(usize, usize)| {
                wd == w && (d + 1 < dims.len() || dims[d] / wd >= MIN_SPLIT_ROW)
            };
            // Only for a clear saving (a quarter): where the bytes are about even, the first
            // dimension (rows of a product) measured faster (BERT-tiny's 128 x 128 by 128 x 128,
            // 2 threads: 30 us by rows, 35 by columns).
            let first_bytes = unit_input_bytes(ops, dims, d0, w);
            candidates
                .iter()
                .filter(fits)
                .map(|&(d, wd)| (unit_input_bytes(ops, dims, d, wd), d, wd))
                .filter(|&(bytes, _, _)| 4 * bytes < 3 * first_bytes)
                .min_by_key(|&(bytes, _, _)| bytes)
                .map_or((d0, w), |(_, d, wd)| (d, wd))
        });
        split = pick.map(|(d, w)| Split { dim: d, tile: dims[d] / w, workgroups: w });
    }
    let mut local = ops[a].output_shape().cloned().unwrap_or_default();
    if let Some(s) = split {
        if s.dim < local.len() {
            local[s.dim] = s.tile;
        }
    }
    let register =
        if vectorize && local.len() == dims.len() { register_plan(ops, a, &local) } else { None };
    // Row reductions outside the register tile (softmax's max and sum, a normalisation's
    // moments): one row at a time, the whole row a vector.
    let in_chain: HashSet<usize> =
        register.iter().flat_map(|r| r.chain.iter().copied()).chain([a]).collect();
    let rows: Vec<(usize, usize)> = if vectorize {
        (0..ops.len())
            .filter(|i| !in_chain.contains(i))
            .filter_map(|i| row_reduction(&ops[i]).map(|c| (i, c)))
            .collect()
    } else {
        Vec::new()
    };
    // Other ops stay loop nests for LLVM to vectorise: it can only do so along the innermost
    // loop, so a reduction window (pooling, a strided depthwise convolution) moves outside the
    // output row.
    let reorder: Vec<(usize, Vec<usize>)> = if vectorize {
        (0..ops.len())
            .filter(|i| !in_chain.contains(i) || register.is_none() && *i == a)
            .filter(|i| !rows.iter().any(|r| r.0 == *i))
            .filter_map(|i| row_last(&ops[i]).map(|p| (i, p)))
            .collect()
    } else {
        Vec::new()
    };
    if split.is_none() && register.is_none() && rows.is_empty() && reorder.is_empty() {
        return None;
    }
    let vectorize = register.is_some() || !rows.is_empty();
    Some(Schedule { anchor: a, split, local, register, rows, reorder, vectorize })
}

/// The decision of each phase, one line each.
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        match self.split {
            Some(s) => writeln!(
                f,
                "workgroups: {} along output dim {} (tile {}), each {}",
                s.workgroups,
                s.dim,
                s.tile,
                shape(&self.local)
            )?,
            None => writeln!(f, "workgroups: 1, {}", shape(&self.local))?,
        }
        match &self.register {
            Some(r) => {
                write!(f, "register tile: [{}] on op{}", list(&r.sizes), self.anchor)?;
                if !r.chain.is_empty() {
                    write!(
                        f,
                        ", fusing op{}",
                        r.chain.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",op")
                    )?;
                }
                if let Some((c, red)) = &r.contraction {
                    write!(f, "; op{c} reduction tiles [{}]", list(red))?;
                }
                if r.dot {
                    write!(f, " (dot: vectorised along the reduction)")?;
                }
                if r.peel {
                    write!(f, ", vector loop peeled")?;
                }
                writeln!(f)?;
            }
            None => writeln!(f, "register tile: none")?,
        }
        for &(r, chunk) in &self.rows {
            match chunk {
                0 => writeln!(f, "row reduction: op{r}, one row a step")?,
                c => writeln!(f, "row reduction: op{r}, one row a step in chunks of {c}")?,
            }
        }
        for (i, perm) in &self.reorder {
            writeln!(f, "loop order: op{i} [{}]", list(perm))?;
        }
        writeln!(f, "vectorize: {}", if self.vectorize { "yes" } else { "no" })
    }
}

fn shape(d: &[usize]) -> String {
    d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x")
}

/// A kernel's ops and its schedule, as `kiln emit --stage schedule` prints them.
pub fn describe(kernel: &str, ops: &[LinalgOp], schedule: Option<&Schedule>) -> String {
    let mut s = format!(
        "kernel {kernel}
"
    );
    for (i, op) in ops.iter().enumerate() {
        s.push_str(&format!(
            "  op{i}: {op}
"
        ));
    }
    match schedule {
        Some(sch) => {
            for line in sch.to_string().lines() {
                s.push_str(&format!("  {line}\n"));
            }
        }
        None => s.push_str("  one workgroup, loops as generated\n"),
    }
    s
}

/// A reduction along the innermost, contiguous loops that vectorises one row at a time: its
/// parallel loops come first, every map is a projection, and inputs that read along the row read
/// the last loop as their last dimension. A row of a power of two up to 512 elements is one vector
/// op (`Some(0)`); a longer one, with one reduction loop, goes in chunks of the largest power of
/// two up to 512 that divides it, at least 16 (`Some(chunk)`), each chunk a vector op added into
/// the row's accumulator (no masked reductions).
fn row_reduction(op: &LinalgOp) -> Option<usize> {
    let ranges = op.ranges()?;
    let p = op.parallel.iter().filter(|&&p| p).count();
    if !op.is_generic()
        || p == op.loops()
        || op.parallel[..p].iter().any(|&x| !x)
        || op.elem.iter().any(|&e| e != Elem::F32)
    {
        return None;
    }
    let reduced: usize = ranges[p..].iter().product();
    let last = op.loops() - 1;
    let contiguous = op.maps.iter().all(|m| m.iter().all(|e| e.as_dim().is_some() || e.is_zero()))
        && op.maps[..op.n_inputs].iter().all(|m| {
            let reads_row = m.iter().any(|e| e.as_dim().is_some_and(|d| d >= p));
            !reads_row || m.last().and_then(Expr::as_dim) == Some(last)
        });
    if !contiguous {
        return None;
    }
    if reduced.is_power_of_two() && (8..=512).contains(&reduced) {
        return Some(0);
    }
    let mut chunk = 1usize << reduced.trailing_zeros().min(9);
    // No power of two of 16+ divides it (1000 classes): the largest multiple of 8 up to 512 that
    // does, vectorised at its exact size (`vector_sizes` keeps multiples of 8 unmasked).
    if chunk < 16 {
        chunk = (16..=512.min(reduced))
            .rev()
            .find(|&d| d % 8 == 0 && reduced.is_multiple_of(d))
            .unwrap_or(0);
    }
    (op.loops() == p + 1 && reduced > 512.min(chunk * 2) && chunk >= 16).then_some(chunk)
}

/// For a generic whose innermost loop is a reduction: a loop order with the loop of the output's
/// last dimension innermost (reductions just outside it).
fn row_last(op: &LinalgOp) -> Option<Vec<usize>> {
    if !op.is_generic() || op.parallel.last() != Some(&false) {
        return None;
    }
    // Not for multiply-adds (a strided depthwise convolution): measured 40% slower, LLVM keeps
    // their window sums in registers the other way round. Pooling gains 35%.
    if op.multiplies {
        return None;
    }
    let p = op.maps.get(op.n_inputs)?.last()?.as_dim()?;
    if !op.parallel[p] {
        return None;
    }
    let n = op.loops();
    let mut perm: Vec<usize> = (0..n).filter(|&i| op.parallel[i] && i != p).collect();
    perm.extend((0..n).filter(|&i| !op.parallel[i]));
    perm.push(p);
    Some(perm)
}

/// The vector shape for a register-sized op: its loop ranges, the innermost rounded up to a power
/// of two (masked); `None` for ops to leave alone (large, dynamic, or with maps the vectoriser
/// does not take).
pub fn vector_sizes(op: &LinalgOp) -> Option<Vec<usize>> {
    let ranges = op.ranges()?;
    if ranges.is_empty() || ranges.iter().product::<usize>() > MAX_VECTOR_ELEMENTS {
        return None;
    }
    if op.is_generic() {
        let projected =
            op.maps.iter().all(|m| m.iter().all(|e| e.as_dim().is_some() || e.is_zero()));
        if !projected {
            return None;
        }
    }
    let mut sizes = ranges;
    // The innermost rounded up to a power of two (masked), except a reduction's that is a multiple
    // of 8 (a row chunk of 200): whole vectors and a short one, no mask in the reduction.
    let reduction_last = op.parallel.last() == Some(&false);
    if let Some(last) = sizes.last_mut() {
        if !(reduction_last && last.is_multiple_of(8)) {
            *last = last.next_power_of_two();
        }
    }
    Some(sizes)
}
