//! From a scheduled kernel to launches: the tensors the threads of a block share go to workgroup
//! memory, the kernel is bufferised, each block grid becomes a `gpu.launch` with its threads
//! mapped, the launches are outlined into `gpu.func`s, and the host side that remains is read as
//! a launch plan: which function, what grid, which buffers.

use melior::ir::operation::OperationBuilder;
use melior::ir::{Block, BlockLike, Location, Region, RegionLike};

use super::script::Script;
use crate::backend::edit::{self, RawOp};
use crate::backend::MlirContext;

pub use crate::artifact::Arg;

/// One launch of a `gpu.func`.
#[derive(Clone, Debug)]
pub struct DeviceLaunch {
    pub func: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: Vec<Arg>,
    /// Positions in `args` the function may write.
    pub writes: Vec<usize>,
    /// Floating-point operations a launch does, where counted (contractions); 0 otherwise.
    pub flops: u64,
    /// The bytes a launch moves at least, when its builder knows which arguments it uses
    /// (else every argument counts).
    pub bytes: Option<u64>,
}

/// How one fused kernel runs: its launches in order, its temporaries' sizes, its constants.
#[derive(Clone, Debug, Default)]
pub struct LaunchPlan {
    pub launches: Vec<DeviceLaunch>,
    pub scratch: Vec<u64>,
    pub constants: Vec<Vec<u8>>,
}

/// Workgroup memory one block may use (the smallest common limit: 32 KB on Intel's CPU OpenCL,
/// 48 KB static on NVIDIA).
pub const WORKGROUP_BYTES: usize = 32 * 1024;

/// Bufferises the scheduled kernel and maps its block grids and thread loops to launches.
pub fn map(mlir: &MlirContext, module: &mut melior::ir::Module) -> Result<(), String> {
    let root = RawOp::of(&module.as_operation());
    if std::env::var("KILN_DEBUG_MLIR").is_ok_and(|v| v == "3") {
        eprintln!("// scheduled, before bufferisation:\n{}", module.as_operation());
    }
    let shared = tag_workgroup_tensors(&mlir.ctx, root)?;
    let mut s = Script::new();
    if shared > 0 {
        let e = s.tagged("kiln.workgroup", None);
        let cast = s.raw_result(&format!(
            "transform.cast {e} : !transform.any_op to !transform.op<\"tensor.empty\">"
        ));
        let alloc = s.raw_result(&format!(
            "transform.bufferization.empty_tensor_to_alloc_tensor {cast} : (!transform.op<\"tensor.empty\">) -> !transform.op<\"bufferization.alloc_tensor\">"
        ));
        let space = s.raw_result("transform.param.constant 3 : i64 -> !transform.any_param");
        s.raw(&format!(
            "transform.annotate {alloc} \"memory_space\" = {space} : !transform.op<\"bufferization.alloc_tensor\">, !transform.any_param"
        ));
    }
    // Results computed into a fresh tensor and then copied to an output are computed in place.
    let f = s.ops(&["func.func"], "%root");
    s.raw(&format!("transform.bufferization.eliminate_empty_tensors {f} : !transform.any_op"));
    s.raw_result(
        "transform.bufferization.one_shot_bufferize %root {bufferize_function_boundaries = true, function_boundary_type_conversion = 1 : i32, memcpy_op = \"linalg.copy\"} : (!transform.any_op) -> !transform.any_op",
    );
    mlir.apply_transform(&module.as_operation(), &s.finish())
        .map_err(|e| format!("bufferisation: {e}"))?;
    // Identical views merge, so copies of a tile onto itself show.
    mlir.run_pipeline(module, "builtin.module(func.func(cse))")
        .map_err(|e| format!("after bufferisation: {e}"))?;
    let root = RawOp::of(&module.as_operation());
    erase_self_copies(root);
    let func =
        super::schedule::kernel_func(root).ok_or("no kernel function after bufferisation")?;
    // Work bufferisation added outside the block grids (copies into outputs) gets grids of its
    // own; what cannot be distributed runs on one thread.
    let leftovers: Vec<RawOp> =
        func.children().into_iter().filter(|o| super::loops::is_structured(*o)).collect();
    super::schedule::tile_each(mlir, module, &leftovers, "distributing copies")?;
    serialize_leftovers(&mlir.ctx, func)?;
    sink_views(func);
    let launches = wrap_block_grids(&mlir.ctx, func)?;
    let mut s = Script::new();
    for (i, dims) in launches.iter().enumerate() {
        let e = s.tagged(&format!("kiln.launch{i}"), None);
        let l = s.raw_result(&format!("transform.gpu.map_forall_to_blocks {e} generate_gpu_launch : (!transform.any_op) -> !transform.any_op"));
        s.raw_result(&format!(
            "transform.gpu.map_nested_forall_to_threads {l} block_dims = [{}, {}, {}] : (!transform.any_op) -> !transform.any_op",
            dims[0], dims[1], dims[2]
        ));
    }
    if std::env::var("KILN_DEBUG_MLIR").is_ok_and(|v| v == "2") {
        eprintln!("// before mapping to blocks and threads:\n{}", module.as_operation());
    }
    mlir.apply_transform(&module.as_operation(), &s.finish())
        .map_err(|e| format!("mapping to blocks and threads: {e}"))?;
    mlir.run_pipeline(module, "builtin.module(canonicalize,cse,func.func(gpu-launch-sink-index-computations),gpu-kernel-outlining,canonicalize,cse)")
        .map_err(|e| format!("outlining: {e}"))
}

/// Gives each thread loop whose shared output starts from a `tensor.empty` a fresh one of its
/// own, tagged `kiln.workgroup`: what threads write there, other threads of the block read (a
/// reduction's partials, an accumulator, a copied tile), so it lives in workgroup memory. Fresh,
/// because CSE merges identical empties, which would make two tiles (or a tile and a kernel-level
/// temporary) one buffer. Returns the bytes tagged; too many for one block is an error.
fn tag_workgroup_tensors(ctx: &melior::Context, root: RawOp) -> Result<usize, String> {
    let mut total = 0;
    let mut n = 0i64;
    for forall in root
        .descendants()
        .into_iter()
        .filter(|o| o.attr("kiln.threads").is_some() && o.is("scf.forall"))
    {
        for k in 0..forall.num_operands() {
            let Some((empty, user, operand)) = trace_to_empty(forall, k) else { continue };
            if empty.attr("kiln.workgroup").is_some() && empty.parent() == user.parent() {
                continue;
            }
            let t = edit::value_type(empty.result(0));
            let bytes =
                edit::static_dims(t).ok_or("a dynamic workgroup tensor")?.iter().product::<usize>()
                    * edit::element_bytes(t).unwrap_or(4);
            total += bytes;
            let fresh = super::schedule::new_empty(ctx, t, user)?;
            fresh.set_unit_attr(ctx, "kiln.workgroup");
            // A distinct id, so nothing merges two of them.
            fresh.set_attr(
                "kiln.tile",
                edit::parse_attr(ctx, &format!("{n} : i64")).expect("an integer attribute"),
            );
            n += 1;
            user.set_operand(operand, fresh.result(0));
        }
    }
    if total > WORKGROUP_BYTES {
        return Err(format!(
            "the schedule needs {total} bytes of workgroup memory, more than {WORKGROUP_BYTES}"
        ));
    }
    Ok(total)
}

/// Follows a tensor back through destinations (DPS inits, slices, loop-carried values) to the
/// `tensor.empty` it starts from, if any (not when it starts from a kernel buffer). Returns the
/// empty and the op using it on that path, with the operand's position.
fn trace_to_empty(start: RawOp, operand: usize) -> Option<(RawOp, RawOp, usize)> {
    let mut v = start.operand(operand);
    let mut user: Option<(RawOp, usize)> = Some((start, operand));
    for _ in 0..64 {
        if let Some(op) = edit::defining_op(v) {
            let name = op.name();
            if name == "tensor.empty" {
                let (u, i) = user?;
                return Some((op, u, i));
            }
            let i = if name == "tensor.extract_slice" || name == "tensor.cast" {
                0
            } else if name.starts_with("linalg.") && op.num_operands() > 0 {
                // A destination-passing op's result is its (last) init, updated.
                op.num_operands() - 1
            } else if name == "scf.for" {
                // Result i is the loop's i-th iteration value: its init is operand 3 + i.
                3 + (0..op.num_results()).find(|&i| edit::same_value(op.result(i), v))?
            } else if name == "scf.forall" {
                let i = (0..op.num_results()).find(|&i| edit::same_value(op.result(i), v))?;
                op.num_operands() - op.num_results() + i
            } else {
                return None;
            };
            user = Some((op, i));
            v = op.operand(i);
        } else {
            let (owner, i) = edit::block_argument_owner(v)?;
            if owner.is("scf.for") {
                let k = 3 + i.checked_sub(1)?;
                user = Some((owner, k));
                v = owner.operand(k);
            } else if owner.is("scf.forall") {
                // A block grid's outputs are the kernel's results, in global memory.
                if is_block_grid(owner) {
                    return None;
                }
                // Block arguments: the induction variables, then one per shared output.
                let ivs = edit::block_argument_count(owner)?.checked_sub(owner.num_results())?;
                let k = owner.num_operands() - owner.num_results() + i.checked_sub(ivs)?;
                user = Some((owner, k));
                v = owner.operand(k);
            } else {
                return None;
            }
        }
    }
    None
}

/// Copies of a buffer onto itself (left by bufferising in place) do nothing: erased.
fn erase_self_copies(root: RawOp) {
    for op in root.descendants() {
        if (op.is("linalg.copy") || op.is("memref.copy"))
            && op.num_operands() == 2
            && edit::same_value(op.operand(0), op.operand(1))
        {
            op.erase();
        }
    }
}

/// Wraps each top-level block grid (an `scf.forall` mapped to blocks) in an `scf.execute_region`
/// tagged `kiln.launch<i>`, so each becomes its own `gpu.launch`; returns each launch's block
/// dimensions (what its thread loops need). Anything else left at the top level that touches
/// memory is an error: it would run on the host.
fn wrap_block_grids(ctx: &melior::Context, func: RawOp) -> Result<Vec<[usize; 3]>, String> {
    let mut dims = Vec::new();
    for op in func.children() {
        let name = op.name();
        if name == "scf.forall" {
            if !is_block_grid(op) {
                return Err("a loop outside any block grid".into());
            }
            dims.push(block_dims(op)?);
            wrap(ctx, op, &format!("kiln.launch{}", dims.len() - 1));
        } else if !is_host_op(&name) {
            return Err(format!("`{name}` would run outside a launch"));
        }
    }
    Ok(dims)
}

/// Groups each run of top-level ops that are neither block grids nor host ops into a grid of one
/// block (one thread): correct for anything, fast for nothing; schedules avoid it.
fn serialize_leftovers(ctx: &melior::Context, func: RawOp) -> Result<(), String> {
    let ops = func.children();
    let mut runs: Vec<Vec<RawOp>> = Vec::new();
    let mut current: Vec<RawOp> = Vec::new();
    for op in ops {
        let name = op.name();
        let grid = name == "scf.forall" && is_block_grid(op);
        if grid || is_host_op(&name) || is_sinkable(&name) {
            if !current.is_empty() {
                runs.push(std::mem::take(&mut current));
            }
        } else {
            current.push(op);
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    for run in runs {
        // Values made inside the run must not be used after it.
        for op in &run {
            for r in 0..op.num_results() {
                if edit::users(op.result(r))
                    .iter()
                    .any(|u| !run.iter().any(|o| o == u || u.is_inside(*o)))
                {
                    return Err(format!(
                        "`{}` outside a launch produces a value used elsewhere",
                        op.name()
                    ));
                }
            }
        }
        let loc = Location::unknown(ctx);
        let index = melior::ir::Type::index(ctx);
        let body = Block::new(&[(index, loc)]);
        let term_region = Region::new();
        term_region.append_block(Block::new(&[]));
        let term = body.append_operation(
            OperationBuilder::new("scf.forall.in_parallel", loc)
                .add_regions([term_region])
                .build()
                .expect("builds"),
        );
        let term_raw = term.to_raw();
        let region = Region::new();
        region.append_block(body);
        let attr = |s: &str| melior::ir::Attribute::parse(ctx, s).expect("a valid attribute");
        let id = |s: &str| melior::ir::Identifier::new(ctx, s);
        let forall = OperationBuilder::new("scf.forall", loc)
            .add_attributes(&[
                (id("mapping"), attr("[#gpu.block<x>]")),
                (id("staticLowerBound"), attr("array<i64: 0>")),
                (id("staticUpperBound"), attr("array<i64: 1>")),
                (id("staticStep"), attr("array<i64: 1>")),
                (id("operandSegmentSizes"), attr("array<i32: 0, 0, 0, 0>")),
            ])
            .add_regions([region])
            .build()
            .map_err(|e| format!("building a one-block grid: {e}"))?;
        let raw = forall.into_raw();
        // SAFETY: the new loop goes before the run; the run's ops move into its body, before its
        // terminator, keeping their order.
        unsafe {
            let parent = mlir_sys::mlirOperationGetBlock(run[0].0);
            mlir_sys::mlirBlockInsertOwnedOperationBefore(parent, run[0].0, raw);
            for op in &run {
                mlir_sys::mlirOperationMoveBefore(op.0, term_raw);
            }
        }
    }
    Ok(())
}

/// Pure ops that compute views and indices: they move into the launches that use them (a
/// kernel takes whole buffers, never views).
fn is_sinkable(name: &str) -> bool {
    matches!(
        name,
        "memref.subview"
            | "memref.expand_shape"
            | "memref.collapse_shape"
            | "memref.cast"
            | "memref.reinterpret_cast"
            | "affine.apply"
    ) || (name.starts_with("arith.") && name != "arith.constant")
}

/// Copies each top-level view or index op into every block grid using it (at the start of its
/// body) and rewires the uses there; erases it when nothing outside uses it any more. Later ops
/// first, so a chain of views moves whole.
fn sink_views(func: RawOp) {
    for op in func.children().into_iter().rev() {
        if !is_sinkable(&op.name()) || op.num_results() != 1 {
            continue;
        }
        let v = op.result(0);
        let mut grids: Vec<RawOp> = Vec::new();
        for u in edit::users(v) {
            let mut g = u;
            while let Some(p) = g.parent() {
                if p == func {
                    break;
                }
                g = p;
            }
            if g != u && g.is("scf.forall") && !grids.contains(&g) {
                grids.push(g);
            }
        }
        for g in grids {
            let Some(body) = g.block(0) else { continue };
            let copy = op.clone_op();
            // SAFETY: the clone is a new op handed to the grid's body, before its first op.
            unsafe {
                let first = mlir_sys::mlirBlockGetFirstOperation(body);
                mlir_sys::mlirBlockInsertOwnedOperationBefore(body, first, copy.0);
            }
            edit::replace_uses_inside(v, copy.result(0), g);
        }
        if edit::users(v).is_empty() {
            op.erase();
        }
    }
}

/// Ops the host side may keep: constants, buffer allocation, views, the return.
fn is_host_op(name: &str) -> bool {
    matches!(
        name,
        "arith.constant"
            | "memref.alloc"
            | "memref.dealloc"
            | "memref.get_global"
            | "memref.expand_shape"
            | "memref.collapse_shape"
            | "memref.cast"
            | "func.return"
    )
}

/// One id of an `scf.forall`'s device mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MappingId {
    /// `#gpu.block<x|y|z>` (0, 1, 2).
    Block(usize),
    /// `#gpu.thread<x|y|z>`.
    Thread(usize),
    /// `#gpu.thread<linear_dim_k>`.
    LinearThread,
    Other,
}

/// An `scf.forall`'s mapping, read through the C API (empty when it has none).
fn mapping(forall: RawOp) -> Vec<MappingId> {
    let Some(ids) = forall.attr("mapping").and_then(edit::array_attr) else { return Vec::new() };
    ids.into_iter()
        .map(|a| {
            for (k, d) in ["x", "y", "z"].into_iter().enumerate() {
                if edit::attr_is(a, &format!("#gpu.block<{d}>")) {
                    return MappingId::Block(k);
                }
                if edit::attr_is(a, &format!("#gpu.thread<{d}>")) {
                    return MappingId::Thread(k);
                }
            }
            // (Schedules map at most a handful of loops linearly.)
            if (0..8).any(|k| edit::attr_is(a, &format!("#gpu.thread<linear_dim_{k}>"))) {
                return MappingId::LinearThread;
            }
            MappingId::Other
        })
        .collect()
}

/// An `scf.forall` mapped to blocks: a block grid.
fn is_block_grid(forall: RawOp) -> bool {
    mapping(forall).iter().any(|i| matches!(i, MappingId::Block(_)))
}

/// The block dimensions a block grid's thread loops need: per x/y/z the largest count mapped to
/// it, and enough threads in all for the largest linearly mapped loop.
fn block_dims(forall: RawOp) -> Result<[usize; 3], String> {
    let mut d = [1usize; 3];
    let mut linear = 1usize;
    for t in forall.descendants().into_iter().filter(|o| o.is("scf.forall")) {
        let ids = mapping(t);
        if !ids.iter().any(|i| matches!(i, MappingId::Thread(_) | MappingId::LinearThread)) {
            continue;
        }
        let counts = forall_counts(t).ok_or("a thread loop with dynamic bounds")?;
        if ids.contains(&MappingId::LinearThread) {
            linear = linear.max(counts.iter().product());
            continue;
        }
        for (id, c) in ids.iter().zip(&counts) {
            if let MappingId::Thread(k) = *id {
                d[k] = d[k].max(*c);
            }
        }
    }
    if d[0] * d[1] * d[2] < linear {
        d[0] = linear.div_ceil(d[1] * d[2]);
    }
    if d[0] * d[1] * d[2] > 1024 {
        return Err(format!("{}x{}x{} threads per block, more than 1024", d[0], d[1], d[2]));
    }
    Ok(d)
}

/// A normalised forall's trip counts (static upper bounds).
fn forall_counts(forall: RawOp) -> Option<Vec<usize>> {
    let ub = forall.attr("staticUpperBound")?;
    // SAFETY: staticUpperBound is a DenseI64ArrayAttr.
    unsafe {
        let n = mlir_sys::mlirDenseArrayGetNumElements(ub);
        (0..n).map(|i| usize::try_from(mlir_sys::mlirDenseI64ArrayGetElement(ub, i)).ok()).collect()
    }
}

/// Wraps `op` into an `scf.execute_region` carrying the unit attribute `tag`.
fn wrap(ctx: &melior::Context, op: RawOp, tag: &str) {
    let loc = Location::unknown(ctx);
    let region = Region::new();
    let block = Block::new(&[]);
    let y = block.append_operation(
        OperationBuilder::new("scf.yield", loc).build().expect("scf.yield builds"),
    );
    let y_raw = y.to_raw();
    region.append_block(block);
    let exec = OperationBuilder::new("scf.execute_region", loc)
        .add_regions([region])
        .build()
        .expect("scf.execute_region builds");
    let exec_raw = exec.into_raw();
    // SAFETY: `op` is live in its block; the new op is handed to that block, then `op` moves into
    // the new region before its terminator.
    unsafe {
        let parent = mlir_sys::mlirOperationGetBlock(op.0);
        mlir_sys::mlirBlockInsertOwnedOperationBefore(parent, op.0, exec_raw);
        mlir_sys::mlirOperationMoveBefore(op.0, y_raw);
    }
    RawOp(exec_raw).set_unit_attr(ctx, tag);
}

/// Reads the launch plan from the outlined host function: the launches in order with their
/// buffers. `n_buffers` is the kernel's buffer count (its first function arguments); with
/// `status`, the argument after them is the run's status word.
pub fn plan(root: RawOp, n_buffers: usize, status: bool) -> Result<LaunchPlan, String> {
    let func = root.children().into_iter().find(|o| o.is("func.func")).ok_or("no host function")?;
    let mut plan = LaunchPlan::default();
    let mut scratch_of: Vec<(RawOp, usize)> = Vec::new();
    let mut constant_of: Vec<(String, usize)> = Vec::new();
    for op in func.children() {
        let name = op.name();
        if name != "gpu.launch_func" {
            if !is_host_op(&name) {
                return Err(format!("`{name}` was left on the host side"));
            }
            continue;
        }
        let seg =
            op.attr("operandSegmentSizes").ok_or("gpu.launch_func without operand segments")?;
        // SAFETY: operandSegmentSizes is a DenseI32ArrayAttr.
        let seg: Vec<usize> = unsafe {
            (0..mlir_sys::mlirDenseArrayGetNumElements(seg))
                .map(|i| mlir_sys::mlirDenseI32ArrayGetElement(seg, i) as usize)
                .collect()
        };
        // async deps, grid x y z, block x y z, cluster x y z, dynamic shared memory, kernel operands.
        let start = |k: usize| seg[..k].iter().sum::<usize>();
        let constant = |k: usize| -> Result<u32, String> {
            let v = op.operand(start(k));
            edit::constant_int(v)
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(|| "a launch with a dynamic grid".to_string())
        };
        let grid = [constant(1)?, constant(2)?, constant(3)?];
        let block = [constant(4)?, constant(5)?, constant(6)?];
        let kernel = op.attr("kernel").ok_or("gpu.launch_func without a kernel")?;
        // SAFETY: `kernel` is a SymbolRefAttr. Its root, the outlined module's name, is unique
        // (the function inside may repeat another's name); `move_functions` renames to it.
        let func_name = unsafe {
            let s = mlir_sys::mlirSymbolRefAttrGetRootReference(kernel);
            String::from_utf8_lossy(std::slice::from_raw_parts(s.data as *const u8, s.length))
                .into_owned()
        };
        let first = start(11);
        let mut args = Vec::new();
        for i in 0..seg[11] {
            let v = resolve_view(op.operand(first + i));
            let arg = if let Some((owner, n)) = edit::block_argument_owner(v) {
                if owner.is("func.func") && n < n_buffers {
                    Arg::Buffer(n)
                } else if owner.is("func.func") && status && n == n_buffers {
                    Arg::Status
                } else {
                    return Err(format!("launch argument {i} is not a buffer"));
                }
            } else {
                let d = edit::defining_op(v).ok_or("an argument without a definition")?;
                match d.name().as_str() {
                    "memref.alloc" => {
                        let k = match scratch_of.iter().find(|(o, _)| *o == d) {
                            Some(&(_, k)) => k,
                            None => {
                                let t = edit::value_type(v);
                                let bytes = edit::static_dims(t)
                                    .ok_or("a dynamic temporary")?
                                    .iter()
                                    .product::<usize>()
                                    * edit::element_bytes(t).unwrap_or(4);
                                plan.scratch.push(bytes as u64);
                                scratch_of.push((d, plan.scratch.len() - 1));
                                plan.scratch.len() - 1
                            }
                        };
                        Arg::Scratch(k)
                    }
                    "memref.get_global" => {
                        let sym = d
                            .attr("name")
                            .and_then(edit::string_attr)
                            .ok_or("get_global without a name")?;
                        let k = match constant_of.iter().find(|(s, _)| *s == sym) {
                            Some((_, k)) => *k,
                            None => {
                                plan.constants.push(global_bytes(root, &sym)?);
                                constant_of.push((sym, plan.constants.len() - 1));
                                plan.constants.len() - 1
                            }
                        };
                        Arg::Constant(k)
                    }
                    other => return Err(format!("launch argument {i} comes from `{other}`")),
                }
            };
            args.push(arg);
        }
        // Kernel inputs and constants are only read; everything else may be written.
        let writes = args
            .iter()
            .enumerate()
            .filter(|(_, a)| !matches!(a, Arg::Constant(_)))
            .map(|(i, _)| i)
            .collect();
        plan.launches.push(DeviceLaunch {
            func: func_name,
            grid,
            block,
            args,
            writes,
            flops: 0,
            bytes: None,
        });
    }
    Ok(plan)
}

/// A contiguous reshape of a buffer is the same buffer.
fn resolve_view(mut v: mlir_sys::MlirValue) -> mlir_sys::MlirValue {
    while let Some(d) = edit::defining_op(v) {
        if matches!(
            d.name().as_str(),
            "memref.expand_shape" | "memref.collapse_shape" | "memref.cast"
        ) {
            v = d.operand(0);
        } else {
            break;
        }
    }
    v
}

/// The bytes of the `memref.global` named `sym` (its dense initial value, row-major; bools one
/// byte each).
fn global_bytes(root: RawOp, sym: &str) -> Result<Vec<u8>, String> {
    let g = root
        .children()
        .into_iter()
        .find(|o| {
            o.is("memref.global")
                && o.attr("sym_name").and_then(edit::string_attr).is_some_and(|s| s == sym)
        })
        .ok_or_else(|| format!("no memref.global @{sym}"))?;
    let init = g.attr("initial_value").ok_or_else(|| format!("@{sym} has no initial value"))?;
    let ty = g.attr("type").ok_or("memref.global without a type")?;
    // SAFETY: `type` is a TypeAttr; `initial_value` a dense elements attribute of that shape.
    unsafe {
        let t = mlir_sys::mlirTypeAttrGetValue(ty);
        let numel: usize = edit::static_dims(t).ok_or("a dynamic global")?.iter().product();
        if !mlir_sys::mlirAttributeIsADenseElements(init) {
            return Err(format!("@{sym}'s value is not dense data"));
        }
        let e = mlir_sys::mlirShapedTypeGetElementType(t);
        if mlir_sys::mlirTypeIsAInteger(e) && mlir_sys::mlirIntegerTypeGetWidth(e) == 1 {
            return Ok((0..numel)
                .map(|i| mlir_sys::mlirDenseElementsAttrGetBoolValue(init, i as isize) as u8)
                .collect());
        }
        let size = edit::element_bytes(t).ok_or("a global of unknown element size")?;
        let raw = mlir_sys::mlirDenseElementsAttrGetRawData(init) as *const u8;
        if mlir_sys::mlirDenseElementsAttrIsSplat(init) {
            let one = std::slice::from_raw_parts(raw, size);
            return Ok(one.repeat(numel));
        }
        Ok(std::slice::from_raw_parts(raw, numel * size).to_vec())
    }
}

/// Moves every outlined `gpu.func` into `device` (the `gpu.module` all kernels share) and
/// removes the emptied per-kernel modules. Returns the moved functions' names.
pub fn move_functions(root: RawOp, device: RawOp) -> Result<Vec<String>, String> {
    let block = device.block(0).ok_or("the device module has no body")?;
    let mut names = Vec::new();
    for m in root.children().into_iter().filter(|o| o.is("gpu.module")) {
        let name = m.attr("sym_name").ok_or("an outlined module without a name")?;
        let funcs = m.children();
        if funcs.len() != 1 || !funcs[0].is("gpu.func") {
            return Err("an outlined module does not hold exactly one gpu.func".into());
        }
        funcs[0].set_attr("sym_name", name);
        names.push(edit::string_attr(name).ok_or("an outlined module's name is not a string")?);
        funcs[0].move_to_end(block);
        m.erase();
    }
    Ok(names)
}
