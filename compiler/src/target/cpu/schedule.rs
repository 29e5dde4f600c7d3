//! Per-kernel schedules for the CPU: how a kernel is split into workgroups and how each workgroup
//! is tiled into register-sized pieces and vectorised. The decisions are made here, in Rust, by
//! reading the kernel's linalg ops (iterators, indexing maps, static shapes); the transforms are
//! done by MLIR (transform dialect scripts and passes).
//!
//! Phases, each a transform script or pass pipeline on the kernel's module:
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

use melior::ir::attribute::Attribute;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{BlockLike, Module, RegionLike};
use mlir_sys as ffi;

use kiln_ir::Graph;

use crate::fuse::Kernel;
use crate::target::MlirContext;

/// Kernels with less work than this (loop iterations of all their ops: multiply-adds of a
/// contraction, elements of an elementwise op) run as one workgroup: a few microseconds of
/// vector code, less than handing work to another thread is worth.
const MIN_DISTRIBUTED_WORK: usize = 128 * 1024;
/// Work per workgroup aimed at, and the most workgroups a kernel gets: enough for threads that
/// take them one at a time to finish together, few enough to keep each one's share of fused
/// producers (a convolution's padded rows) small. With 2 threads, at most 4 measured best
/// (resnet18 22.0 ms against 22.8 with 2, 22.2 with 6, 23.7 with 8).
const WORK_PER_WORKGROUP: usize = 1 << 20;
const MAX_WORKGROUPS: usize = 4;
/// Vectorised ops at most this many elements (a register tile, not a whole tensor).
const MAX_VECTOR_ELEMENTS: usize = 1024;

/// A kernel's schedule: the scripts to run and the workgroup count they produce.
pub struct Plan {
    pub workgroups: u64,
    /// Phase A (distribution, then register tiling when `vectorize`).
    script: String,
    vectorize: bool,
}

/// One affine expression of an indexing map: a sum of `coefficient * dim` and a constant, or
/// something else (floordiv, mod...).
#[derive(Clone, Debug, PartialEq)]
enum Expr {
    Linear(Vec<(usize, i64)>, i64),
    Opaque,
}

impl Expr {
    fn dims(&self) -> Vec<usize> {
        match self {
            Expr::Linear(t, _) => t.iter().map(|&(d, _)| d).collect(),
            Expr::Opaque => Vec::new(),
        }
    }

    fn coefficient(&self, d: usize) -> Option<i64> {
        match self {
            Expr::Linear(t, _) => t.iter().find(|&&(x, _)| x == d).map(|&(_, c)| c),
            Expr::Opaque => None,
        }
    }

    /// A plain dimension (`d3`).
    fn as_dim(&self) -> Option<usize> {
        match self {
            Expr::Linear(t, 0) if t.len() == 1 && t[0].1 == 1 => Some(t[0].0),
            _ => None,
        }
    }

    fn is_zero(&self) -> bool {
        matches!(self, Expr::Linear(t, 0) if t.is_empty())
    }
}

/// What the schedule needs to know about a linalg op (or `tensor.pad`).
#[derive(Clone, Debug)]
struct OpInfo {
    raw: ffi::MlirOperation,
    name: String,
    /// Per loop: parallel (else reduction).
    parallel: Vec<bool>,
    /// One map per operand (inputs, then outputs); empty for ops without maps.
    maps: Vec<Vec<Expr>>,
    /// Static operand shapes (None: dynamic or not shaped).
    shapes: Vec<Option<Vec<usize>>>,
    elem: Vec<String>,
    n_inputs: usize,
    /// The op producing each operand (by its raw pointer).
    producers: Vec<Option<*const std::ffi::c_void>>,
}

impl OpInfo {
    fn is_generic(&self) -> bool {
        self.name == "linalg.generic"
    }

    fn loops(&self) -> usize {
        self.parallel.len()
    }

    fn output_shape(&self) -> Option<&Vec<usize>> {
        self.shapes.get(self.n_inputs).and_then(|s| s.as_ref())
    }

    /// The extent of every loop, from the static operand shapes.
    fn ranges(&self) -> Option<Vec<usize>> {
        if self.name == "linalg.fill" {
            return self.output_shape().cloned();
        }
        let mut r = vec![None; self.loops()];
        for (map, shape) in self.maps.iter().zip(&self.shapes) {
            let shape = shape.as_ref()?;
            for (e, &n) in map.iter().zip(shape) {
                if let Some(d) = e.as_dim() {
                    r[d] = Some(n);
                }
            }
        }
        r.into_iter().collect()
    }

    /// Whether the output map is the identity over the first `rank` loops.
    fn output_is_identity(&self) -> bool {
        let Some(m) = self.maps.get(self.n_inputs) else { return false };
        m.iter().enumerate().all(|(i, e)| e.as_dim() == Some(i))
    }
}

pub(super) fn raw_name(op: ffi::MlirOperation) -> String {
    // SAFETY: a live operation; its name identifier outlives the copy.
    unsafe {
        let id = ffi::mlirOperationGetName(op);
        let s = ffi::mlirIdentifierStr(id);
        String::from_utf8_lossy(std::slice::from_raw_parts(s.data as *const u8, s.length)).into_owned()
    }
}

pub(super) fn raw_attr(op: ffi::MlirOperation, name: &str) -> Option<String> {
    let n = ffi::MlirStringRef { data: name.as_ptr() as *const _, length: name.len() };
    // SAFETY: a live operation; a null attribute means absent.
    unsafe {
        let a = ffi::mlirOperationGetAttributeByName(op, n);
        if a.ptr.is_null() {
            return None;
        }
        Some(Attribute::from_raw(a).to_string())
    }
}

fn set_unit(ctx: &melior::Context, op: ffi::MlirOperation, name: &str) {
    let unit = Attribute::unit(ctx);
    let n = ffi::MlirStringRef { data: name.as_ptr() as *const _, length: name.len() };
    // SAFETY: a live operation of this context; discardable attributes only tag it for matching.
    unsafe { ffi::mlirOperationSetDiscardableAttributeByName(op, n, melior::ir::attribute::AttributeLike::to_raw(&unit)) };
}

/// Every operation nested in `op` (not `op` itself), in pre-order.
pub(super) fn walk(op: ffi::MlirOperation, f: &mut dyn FnMut(ffi::MlirOperation)) {
    // SAFETY: traversal of live IR through the C API's accessors.
    unsafe {
        for r in 0..ffi::mlirOperationGetNumRegions(op) {
            let region = ffi::mlirOperationGetRegion(op, r);
            let mut block = ffi::mlirRegionGetFirstBlock(region);
            while !block.ptr.is_null() {
                let mut o = ffi::mlirBlockGetFirstOperation(block);
                while !o.ptr.is_null() {
                    f(o);
                    walk(o, f);
                    o = ffi::mlirOperationGetNextInBlock(o);
                }
                block = ffi::mlirBlockGetNextInRegion(block);
            }
        }
    }
}

/// `tensor<1x32x128xf32>` -> ([1, 32, 128], "f32"); None for dynamic shapes.
fn parse_shaped(t: &str) -> (Option<Vec<usize>>, String) {
    let Some(inner) = t.strip_prefix("tensor<").or_else(|| t.strip_prefix("memref<")) else { return (None, t.to_string()) };
    let inner = inner.split(',').next().unwrap_or("").trim_end_matches('>');
    let parts: Vec<&str> = inner.split('x').collect();
    let (elem, dims) = parts.split_last().map(|(e, d)| (e.to_string(), d)).unwrap_or_default();
    let shape: Option<Vec<usize>> = dims.iter().map(|d| d.parse().ok()).collect();
    (shape, elem)
}

/// Splits at top-level commas (outside parentheses).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

fn parse_expr(s: &str) -> Expr {
    let mut terms: Vec<(usize, i64)> = Vec::new();
    let mut constant = 0i64;
    for t in s.split(" + ") {
        let t = t.trim();
        let f: Vec<&str> = t.split(" * ").map(str::trim).collect();
        let dim = |x: &str| x.strip_prefix('d').and_then(|n| n.parse::<usize>().ok());
        match f.as_slice() {
            [x] if dim(x).is_some() => terms.push((dim(x).expect("checked"), 1)),
            [x] if x.parse::<i64>().is_ok() => constant += x.parse::<i64>().expect("checked"),
            [x, c] if dim(x).is_some() && c.parse::<i64>().is_ok() => terms.push((dim(x).expect("checked"), c.parse().expect("checked"))),
            _ => return Expr::Opaque,
        }
    }
    Expr::Linear(terms, constant)
}

/// `[affine_map<(d0, d1) -> (d0, 0)>, ...]` -> results of each map.
fn parse_maps(s: &str) -> Option<Vec<Vec<Expr>>> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("affine_map<") {
        rest = &rest[i..];
        let arrow = rest.find("-> (")?;
        let body = &rest[arrow + 4..];
        let mut depth = 1;
        let mut end = None;
        for (j, c) in body.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end?;
        out.push(split_top(&body[..end]).into_iter().map(parse_expr).collect());
        rest = &body[end..];
    }
    Some(out)
}

fn op_info(op: ffi::MlirOperation) -> OpInfo {
    let name = raw_name(op);
    // SAFETY: operand and type accessors on a live operation.
    let (shapes, elem, producers): (Vec<_>, Vec<_>, Vec<_>) = unsafe {
        let n = ffi::mlirOperationGetNumOperands(op);
        let mut shapes = Vec::new();
        let mut elem = Vec::new();
        let mut producers = Vec::new();
        for i in 0..n {
            let v = ffi::mlirOperationGetOperand(op, i);
            let t = melior::ir::Type::from_raw(ffi::mlirValueGetType(v)).to_string();
            let (s, e) = parse_shaped(&t);
            shapes.push(s);
            elem.push(e);
            producers.push(if ffi::mlirValueIsAOpResult(v) { Some(ffi::mlirOpResultGetOwner(v).ptr as *const _) } else { None });
        }
        (shapes, elem, producers)
    };
    let mut info = OpInfo { raw: op, name: name.clone(), parallel: Vec::new(), maps: Vec::new(), shapes, elem, n_inputs: 0, producers };
    match name.as_str() {
        "linalg.generic" => {
            info.parallel = raw_attr(op, "iterator_types").map(|s| s.split(',').map(|i| i.contains("parallel")).collect()).unwrap_or_default();
            info.maps = raw_attr(op, "indexing_maps").and_then(|s| parse_maps(&s)).unwrap_or_default();
            // `array<i32: 2, 1>`
            info.n_inputs = raw_attr(op, "operandSegmentSizes")
                .and_then(|s| s.split(':').nth(1).and_then(|r| r.split(',').next()).and_then(|n| n.trim().parse().ok()))
                .unwrap_or(0);
        }
        "linalg.fill" => {
            info.n_inputs = 1;
            let rank = info.shapes.get(1).and_then(|s| s.as_ref()).map_or(0, |s| s.len());
            info.parallel = vec![true; rank];
        }
        _ => {}
    }
    info
}

/// The kernel's function (bufferisation may put globals before it).
pub(super) fn kernel_func<'c, 'a>(module: &'a Module<'c>) -> Option<OperationRef<'c, 'a>> {
    let mut op = module.body().first_operation();
    while let Some(o) = op {
        if o.name().as_string_ref().as_str() == Ok("func.func") {
            return Some(o);
        }
        op = o.next_in_block();
    }
    None
}

/// The top-level ops of the kernel's function body.
pub(super) fn body_ops<'c, 'a>(module: &'a Module<'c>) -> Vec<OperationRef<'c, 'a>> {
    let mut out = Vec::new();
    let Some(func) = kernel_func(module) else { return out };
    let Ok(region) = func.region(0) else { return out };
    let Some(block) = region.first_block() else { return out };
    let mut op = block.first_operation();
    while let Some(o) = op {
        op = o.next_in_block();
        out.push(o);
    }
    out
}

/// How the anchor is split into register tiles.
struct Register {
    /// Tile size of each anchor loop.
    sizes: Vec<usize>,
    /// Indices (into the kernel's linalg ops) fused into the register tile, nearest first.
    chain: Vec<usize>,
    /// The contraction among them and its reduction tile sizes.
    contraction: Option<(usize, Vec<usize>)>,
    /// The vector loop does not divide evenly: peel its remainder.
    peel: bool,
    /// The contraction is vectorised along its reduction loop (tiled by the lane count into
    /// partial sums), not along the output's last dimension.
    dot: bool,
}

/// The largest divisor of `n` that is at most `cap`.
fn divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n)).rev().find(|&d| n.is_multiple_of(d)).unwrap_or(1)
}

/// Elements of the native vector for an element type (64-byte registers).
fn lanes(elem: &str) -> Option<usize> {
    match elem {
        "f32" | "i32" => Some(16),
        "f64" | "i64" => Some(8),
        _ => None,
    }
}

/// The register tiling of the anchor `ops[a]` whose (workgroup-local) output extents are `local`.
fn register_plan(ops: &[OpInfo], a: usize, local: &[usize]) -> Option<Register> {
    let anchor = &ops[a];
    let full = anchor.output_shape()?.clone();
    let r = full.len();
    if !anchor.is_generic() || !anchor.output_is_identity() || r == 0 || local.len() != r || anchor.loops() < r {
        return None;
    }
    if anchor.parallel[..r].iter().any(|&p| !p) || anchor.parallel[r..].iter().any(|&p| p) {
        return None;
    }
    let index_of = |p: *const std::ffi::c_void| ops.iter().position(|o| std::ptr::eq(o.raw.ptr as *const _, p));
    // A contraction's init must be a fill, fused along with it.
    let fill_of = |c: usize| -> Option<usize> {
        let init = ops[c].producers[ops[c].n_inputs].and_then(index_of)?;
        (ops[init].name == "linalg.fill").then_some(init)
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
            let Some(p) = op.producers[k].and_then(index_of) else { continue };
            if seen.contains(&p) {
                continue;
            }
            let prod = &ops[p];
            let reads_whole = op.maps[k].len() == r && op.maps[k].iter().enumerate().all(|(j, e)| e.as_dim() == Some(j));
            if !prod.is_generic() || !prod.output_is_identity() || prod.output_shape() != Some(&full) || !reads_whole {
                continue;
            }
            if prod.loops() > r {
                if contraction.is_some() || prod.parallel[..r].iter().any(|&p| !p) || prod.parallel[r..].iter().any(|&p| p) {
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
    let contiguous = |op: &OpInfo, maps: &[Vec<Expr>]| -> bool {
        maps.iter().all(|map| {
            map.iter().enumerate().all(|(j, e)| {
                let Expr::Linear(terms, _) = e else { return false };
                let par: Vec<&(usize, i64)> = terms.iter().filter(|&&(d, _)| op.parallel[d]).collect();
                par.len() <= 1 && par.iter().all(|&&(_, c)| c == 1) && !(par.first().is_some_and(|&&(d, _)| d == v) && j + 1 != map.len())
            })
        })
    };
    let members: Vec<usize> = std::iter::once(a).chain(chain.iter().copied()).collect();
    let mut dot = false;
    for &i in &members {
        let op = &ops[i];
        if op.name == "linalg.fill" {
            continue;
        }
        if op.elem.iter().any(|e| e != "f32") {
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
            let along_k =
                op.loops() == r + 1 && ins.iter().all(|m| m.last().and_then(Expr::as_dim) == Some(k) && m.iter().all(|e| e.as_dim().is_some()));
            if !along_k {
                return None;
            }
            dot = true;
        }
    }
    if local[v] < 2 {
        return None;
    }
    let lanes = lanes(&ops[contraction.unwrap_or(a)].elem[0])?;
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
        return Some(Register { peel: false, sizes, chain, contraction: Some((c, red)), dot: true });
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
            if let Some(m) = (0..r).filter(|&i| i != v && local[i] > 1 && !vector_users.contains(&i)).max_by_key(|&i| local[i]) {
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
    Some(Register { peel: !local[v].is_multiple_of(sizes[v]), sizes, chain, contraction, dot: false })
}

const ANY: &str = "!transform.any_op";

fn script_header() -> String {
    String::from(
        "module attributes {transform.with_named_sequence} {\n  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {\n",
    )
}

fn script_footer(s: &mut String) {
    s.push_str("    transform.yield\n  }\n}\n");
}

/// Decides a kernel's schedule and tags its ops for the scripts; `None` runs it as it is (one
/// workgroup, scalar loops). Without `vectorize`, only the workgroup split.
pub fn plan(ctx: &melior::Context, module: &Module, graph: &Graph, k: &Kernel, vectorize: bool) -> Option<Plan> {
    if k.outputs.len() != 1 {
        return None;
    }
    let dims = graph.value_type(k.outputs[0]).shape.as_fixed()?;
    let body = body_ops(module);
    // A sequential loop (scatter updates applied in order) must run exactly once, as it is.
    if body.iter().any(|o| o.name().as_string_ref().as_str() == Ok("scf.for")) {
        return None;
    }
    let ops: Vec<OpInfo> = body
        .into_iter()
        .map(|o| o.to_raw())
        .filter(|&o| {
            let n = raw_name(o);
            n.starts_with("linalg.") || n == "tensor.pad"
        })
        .map(op_info)
        .collect();
    let a = ops.iter().rposition(|o| o.name.starts_with("linalg.") && o.name != "linalg.fill")?;
    let work: usize = ops.iter().filter_map(|o| o.ranges()).map(|r| r.iter().product::<usize>()).sum();
    // Distribution: the dimension to split: image rows for batch-1 images (a halo of input per
    // workgroup instead of the whole input), else the first that is not tiny; evenly, so every
    // workgroup has the same static shape.
    let mut split = None;
    if work >= MIN_DISTRIBUTED_WORK {
        let target = (work / WORK_PER_WORKGROUP).clamp(2, MAX_WORKGROUPS);
        let rows = (dims.len() == 4 && dims[0] == 1 && dims[2] >= 8).then_some(2);
        let others = (0..dims.len()).filter(|&i| dims[i] >= 2);
        // Tiling loop d splits output dimension d only where the anchor's output map indexes
        // that dimension by loop d itself (not so for a reduction over a leading dimension).
        let splittable = |d: usize| ops[a].maps.get(ops[a].n_inputs).and_then(|m| m.get(d)).and_then(Expr::as_dim) == Some(d);
        split = rows.into_iter().chain(others).filter(|&d| splittable(d)).find_map(|d| {
            let w = divisor_at_most(dims[d], target);
            (w >= 2).then_some((d, dims[d] / w, w))
        });
    }
    let mut local = ops[a].output_shape().cloned().unwrap_or_default();
    if let Some((d, tile, _)) = split {
        if d < local.len() {
            local[d] = tile;
        }
    }
    let register = if vectorize && local.len() == dims.len() { register_plan(&ops, a, &local) } else { None };
    if vectorize && std::env::var_os("KILN_DEBUG_SCHEDULE").is_some() {
        let what = match &register {
            Some(r) => format!("register tile {:?}{}{}", r.sizes, if r.dot { " (dot)" } else { "" }, if r.peel { " peeled" } else { "" }),
            None => "no register tile".into(),
        };
        eprintln!("// kernel {}: {} workgroups of {:?}, {what}", k.name, split.map_or(1, |s| s.2), local);
    }
    // Row reductions outside the register tile (softmax's max and sum, a normalisation's
    // moments): one row at a time, the whole row a vector.
    let in_chain: HashSet<usize> = register.iter().flat_map(|r| r.chain.iter().copied()).chain([a]).collect();
    let rows: Vec<usize> = if vectorize { (0..ops.len()).filter(|i| !in_chain.contains(i) && row_reduction(&ops[*i])).collect() } else { Vec::new() };
    // Other ops stay loop nests for LLVM to vectorise: it can only do so along the innermost
    // loop, so a reduction window (pooling, a strided depthwise convolution) moves outside the
    // output row.
    let reorder: Vec<(usize, Vec<usize>)> = if vectorize {
        (0..ops.len())
            .filter(|i| !in_chain.contains(i) || register.is_none() && *i == a)
            .filter(|i| !rows.contains(i))
            .filter_map(|i| row_last(&ops[i]).map(|p| (i, p)))
            .collect()
    } else {
        Vec::new()
    };
    if split.is_none() && register.is_none() && rows.is_empty() && reorder.is_empty() {
        return None;
    }
    set_unit(ctx, ops[a].raw, "kiln.anchor");
    let producers: Vec<usize> = (0..ops.len()).filter(|&i| i != a).collect();
    let mut s = script_header();
    s.push_str(&format!("    %a = transform.structured.match attributes {{kiln.anchor}} in %root : ({ANY}) -> {ANY}\n"));
    // Handle of each op after distribution.
    let mut handle: Vec<String> = vec![String::new(); ops.len()];
    handle[a] = "%a".into();
    for (n, &i) in producers.iter().rev().enumerate() {
        set_unit(ctx, ops[i].raw, &format!("kiln.op{n}"));
        s.push_str(&format!("    %p{n} = transform.structured.match attributes {{kiln.op{n}}} in %root : ({ANY}) -> {ANY}\n"));
        handle[i] = format!("%p{n}");
    }
    if let Some((d, tile, _)) = split {
        let sizes: Vec<String> = (0..=d).map(|i| if i == d { tile.to_string() } else { "0".into() }).collect();
        s.push_str(&format!(
            "    %t, %l0 = transform.structured.tile_using_forall %a tile_sizes [{}] : ({ANY}) -> ({ANY}, {ANY})\n",
            sizes.join(", ")
        ));
        handle[a] = "%t".into();
        // Fuse producers, nearest first, each into the loop the previous fusion returned.
        for (n, &i) in producers.iter().rev().enumerate() {
            s.push_str(&format!(
                "    %f{n}, %l{} = transform.structured.fuse_into_containing_op %p{n} into %l{n} : ({ANY}, {ANY}) -> ({ANY}, {ANY})\n",
                n + 1
            ));
            handle[i] = format!("%f{n}");
        }
    }
    if let Some(reg) = &register {
        let mut sizes: Vec<String> = reg.sizes.iter().map(|t| t.to_string()).collect();
        let n = reg.sizes.len();
        sizes.resize(ops[a].loops(), "0".into());
        s.push_str(&format!(
            "    %rt, %rl:{n} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
            handle[a],
            sizes.join(", "),
            format!(", {ANY}").repeat(n)
        ));
        let mut cur = format!("%rl#{}", n - 1);
        for (j, &i) in reg.chain.iter().enumerate() {
            s.push_str(&format!(
                "    %g{j}, %c{j} = transform.structured.fuse_into_containing_op {} into {cur} : ({ANY}, {ANY}) -> ({ANY}, {ANY})\n",
                handle[i]
            ));
            cur = format!("%c{j}");
            handle[i] = format!("%g{j}");
        }
        handle[a] = "%rt".into();
        if let (Some((c, red)), true) = (&reg.contraction, reg.dot) {
            let sizes: Vec<String> = red.iter().map(|t| t.to_string()).collect();
            s.push_str(&format!(
                "    %kf, %ks, %kc, %kl = transform.structured.tile_reduction_using_for {} by tile_sizes = [{}] : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})\n",
                handle[*c],
                sizes.join(", ")
            ));
            s.push_str(&format!("    %kg = transform.structured.generalize %kc : ({ANY}) -> {ANY}\n"));
        } else if let Some((c, red)) = &reg.contraction {
            let q = red.iter().filter(|&&t| t != 0).count();
            let sizes: Vec<String> = red.iter().map(|t| t.to_string()).collect();
            s.push_str(&format!(
                "    %ck, %ckl:{q} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
                handle[*c],
                sizes.join(", "),
                format!(", {ANY}").repeat(q)
            ));
        }
        if reg.peel {
            s.push_str(&format!("    %vl = transform.cast {cur} : {ANY} to !transform.op<\"scf.for\">\n"));
            s.push_str(&format!("    %vm, %vr = transform.loop.peel %vl : (!transform.op<\"scf.for\">) -> ({ANY}, {ANY})\n"));
        }
    }
    for (j, &i) in rows.iter().enumerate() {
        let op = &ops[i];
        let sizes: Vec<&str> = op.parallel.iter().map(|&p| if p { "1" } else { "0" }).collect();
        let n = op.parallel.iter().filter(|&&p| p).count();
        s.push_str(&format!(
            "    %row{j}, %rowl{j}:{n} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
            handle[i],
            sizes.join(", "),
            format!(", {ANY}").repeat(n)
        ));
    }
    for (j, (i, perm)) in reorder.iter().enumerate() {
        let perm: Vec<String> = perm.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!(
            "    %ri{j} = transform.structured.interchange {} iterator_interchange = [{}] : ({ANY}) -> {ANY}\n",
            handle[*i],
            perm.join(", ")
        ));
    }
    script_footer(&mut s);
    Some(Plan { workgroups: split.map_or(1, |(_, _, w)| w as u64), script: s, vectorize: register.is_some() || !rows.is_empty() })
}

/// Runs a plan on the module.
pub fn apply(mlir: &MlirContext, module: &mut Module, plan: &Plan) -> Result<(), String> {
    mlir.apply_transform(&module.as_operation(), &plan.script)?;
    if !plan.vectorize {
        return Ok(());
    }
    mlir.run_pipeline(module, "builtin.module(canonicalize,cse)")?;
    // Phase B: fold unit dimensions, then vectorise the register-sized ops one by one.
    let mut s = script_header();
    s.push_str(&format!("    %func = transform.structured.match ops{{[\"func.func\"]}} in %root : ({ANY}) -> {ANY}\n"));
    s.push_str("    transform.apply_patterns to %func {\n      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices\n    } : !transform.any_op\n");
    script_footer(&mut s);
    mlir.apply_transform(&module.as_operation(), &s)?;
    let func = kernel_func(module).ok_or("no function")?.to_raw();
    let mut candidates = Vec::new();
    walk(func, &mut |o| {
        let n = raw_name(o);
        if n == "linalg.generic" || n == "linalg.fill" {
            candidates.push(o);
        }
    });
    for (i, o) in candidates.into_iter().enumerate() {
        let info = op_info(o);
        let Some(sizes) = vector_sizes(&info) else { continue };
        let tag = format!("kiln.v{i}");
        set_unit(&mlir.ctx, o, &tag);
        let mut s = script_header();
        s.push_str(&format!("    %v = transform.structured.match attributes {{{tag}}} in %root : ({ANY}) -> {ANY}\n"));
        let sz: Vec<String> = sizes.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!("    transform.structured.vectorize %v vector_sizes [{}] : {ANY}\n", sz.join(", ")));
        script_footer(&mut s);
        // An op that does not vectorise stays a loop nest.
        let _ = mlir.apply_transform(&module.as_operation(), &s);
    }
    // Phase C: tile tensors become SSA vectors; accumulators leave the reduction loops.
    mlir.run_pipeline(module, "builtin.module(canonicalize,cse,func.func(lower-vector-mask),canonicalize,cse,loop-invariant-code-motion,loop-invariant-subset-hoisting,canonicalize,cse)")
}

/// A reduction along the innermost, contiguous loops whose rows fit in vector registers: its
/// parallel loops come first, every map is a projection, inputs that read along the row read the
/// last loop as their last dimension, and the reduced extent is a power of two (no masked
/// reductions).
fn row_reduction(op: &OpInfo) -> bool {
    let Some(ranges) = op.ranges() else { return false };
    let p = op.parallel.iter().filter(|&&p| p).count();
    if !op.is_generic() || p == op.loops() || op.parallel[..p].iter().any(|&x| !x) || op.elem.iter().any(|e| e != "f32") {
        return false;
    }
    let reduced: usize = ranges[p..].iter().product();
    let last = op.loops() - 1;
    reduced.is_power_of_two()
        && (8..=512).contains(&reduced)
        && op.maps.iter().all(|m| m.iter().all(|e| e.as_dim().is_some() || e.is_zero()))
        && op.maps[..op.n_inputs].iter().all(|m| {
            let reads_row = m.iter().any(|e| e.as_dim().is_some_and(|d| d >= p));
            !reads_row || m.last().and_then(Expr::as_dim) == Some(last)
        })
}

/// For a generic whose innermost loop is a reduction: a loop order with the loop of the output's
/// last dimension innermost (reductions just outside it).
fn row_last(op: &OpInfo) -> Option<Vec<usize>> {
    if !op.is_generic() || op.parallel.last() != Some(&false) {
        return None;
    }
    // Not for multiply-adds (a strided depthwise convolution): measured 40% slower, LLVM keeps
    // their window sums in registers the other way round. Pooling gains 35%.
    let mut multiplies = false;
    walk(op.raw, &mut |o| multiplies |= raw_name(o) == "arith.mulf");
    if multiplies {
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
fn vector_sizes(op: &OpInfo) -> Option<Vec<usize>> {
    let ranges = op.ranges()?;
    if ranges.is_empty() || ranges.iter().product::<usize>() > MAX_VECTOR_ELEMENTS {
        return None;
    }
    if op.is_generic() {
        let projected = op.maps.iter().all(|m| m.iter().all(|e| e.as_dim().is_some() || e.is_zero()));
        if !projected {
            return None;
        }
    }
    let mut sizes = ranges;
    if let Some(last) = sizes.last_mut() {
        *last = last.next_power_of_two();
    }
    Some(sizes)
}
