//! The run's status word in generated code (`kiln_runtime::status`): a kernel whose indices come
//! from data (Gather, GatherElements, GatherND, ScatterElements, ScatterND) takes the word as a
//! `memref<4xi32>` argument after its buffers and, where an index lies outside its axis, sets it
//! (code `CODE_INDEX`, its own function's index) before reading a clamped element, so nothing is
//! read or written out of bounds and the run fails naming the kernel. Indices known when
//! compiling and all in range need no check.

use kiln_ir::op::IndexedBy;
use kiln_ir::{normalize_axis, Graph, NodeId, Tensor, ValueId};
use kiln_runtime::status::CODE_INDEX;
use melior::dialect::arith::CmpiPredicate;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::operation::{OperationBuilder, OperationMutLike};
use melior::ir::r#type::IntegerType;
use melior::ir::{Block, BlockLike, Location, Region, RegionLike, Type, Value};
use melior::Context;

use super::mlir::{err, op, push};
use crate::fuse::Kernel;
use crate::Result;

/// The status word as a kernel body sees it.
#[derive(Clone, Copy)]
pub struct Status<'c, 'a> {
    /// The `memref<4xi32>` argument.
    pub word: Value<'c, 'a>,
    /// What a failure records as the failing kernel: the index of the kernel's (first) function
    /// among the artifact's, whose label names the node.
    pub kernel: u32,
}

/// `memref<4xi32>`: the word's 16 bytes as kernels address them.
pub fn word_type(ctx: &Context) -> Type<'_> {
    melior::ir::r#type::MemRefType::new(IntegerType::new(ctx, 32).into(), &[4], None, None).into()
}

/// Whether `kernel` takes the status word: one of its nodes reads indices that may lie outside
/// their axis.
pub fn takes_status(graph: &Graph, kernel: &Kernel) -> bool {
    kernel.nodes.iter().any(|&n| checks_indices(graph, n))
}

/// The indices of a gather or scatter node and the axes they address: one extent for every
/// index (Gather, GatherElements, ScatterElements), or one per position of the index tuple (the
/// indices' last axis: GatherND, ScatterND). `None` where the shapes do not say.
fn indexed_axes(graph: &Graph, id: NodeId) -> Option<(ValueId, Vec<usize>)> {
    let operands = graph.operands(id);
    let (data, indices) = (operands.first().copied()??, operands.get(1).copied()??);
    let xd = graph.value_type(data).shape.as_fixed()?;
    let axes = match graph.node(id).op.indexed_by()? {
        IndexedBy::Axis(axis) => normalize_axis(axis, xd.len()).map(|a| vec![xd[a]])?,
        IndexedBy::Tuple { first } => {
            let m = *graph.value_type(indices).shape.as_fixed()?.last()?;
            xd.get(first..first + m)?.to_vec()
        }
    };
    Some((indices, axes))
}

/// Whether node `id` needs its indices checked when it runs: a gather or scatter, unless its
/// indices are a constant lying wholly inside their axes (ONNX allows -n to n - 1).
fn checks_indices(graph: &Graph, id: NodeId) -> bool {
    if graph.node(id).op.indexed_by().is_none() {
        return false;
    }
    let known = indexed_axes(graph, id)
        .and_then(|(indices, axes)| Some((graph.constant_value(indices)?, axes)));
    !known.is_some_and(|(t, axes)| in_range(t, &axes))
}

/// Whether every index of `t` lies in its axis (`axes` cycles along the index tuple).
fn in_range(t: &Tensor, axes: &[usize]) -> bool {
    if axes.is_empty() {
        return true;
    }
    t.to_i64s().iter().enumerate().all(|(i, &v)| {
        let n = axes[i % axes.len()] as i128;
        (-n..n).contains(&(v as i128))
    })
}

/// Appends to `block`: when `bad` (an i1) holds, record `CODE_INDEX` and this kernel in the
/// word. Plain stores, as OpenCL's SPIR-V has no atomics on global memory: every thread stores
/// the same code, and the kernel is stored only over a later one (a kernel that ran after
/// another failing one leaves the first named).
pub fn fail_if<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    block: &Block<'c>,
    bad: Value<'c, '_>,
    status: Status<'c, '_>,
) -> Result<()> {
    let then = Block::new(&[]);
    {
        let i32t: Type = IntegerType::new(ctx, 32).into();
        let index = Type::index(ctx);
        let constant = |v: i64, ty: Type<'c>| -> Result<Value<'c, '_>> {
            let a = IntegerAttribute::new(ty, v).into();
            Ok(push(&then, op(ctx, loc, "arith.constant", &[], &[ty], &[("value", a)])?))
        };
        let code = constant(CODE_INDEX as i64, i32t)?;
        let kernel = constant(status.kernel as i64, i32t)?;
        let (at_code, at_kernel) = (constant(0, index)?, constant(1, index)?);
        then.append_operation(op(
            ctx,
            loc,
            "memref.store",
            &[code, status.word, at_code],
            &[],
            &[],
        )?);
        let named =
            push(&then, op(ctx, loc, "memref.load", &[status.word, at_kernel], &[i32t], &[])?);
        let later: Value =
            push(&then, melior::dialect::arith::cmpi(ctx, CmpiPredicate::Ugt, named, kernel, loc));
        let store = Block::new(&[]);
        store.append_operation(op(
            ctx,
            loc,
            "memref.store",
            &[kernel, status.word, at_kernel],
            &[],
            &[],
        )?);
        then.append_operation(scf_if(ctx, loc, later, store)?);
    }
    let mut check = scf_if(ctx, loc, bad, then)?;
    // (How the targets find checks whose op fusion copied elsewhere: `erase_dead_checks`.)
    check.set_attribute("kiln.status", melior::ir::Attribute::unit(ctx));
    block.append_operation(check);
    Ok(())
}

/// `scf.if %cond { body }` (no results, no else); `body` gets its `scf.yield` here.
fn scf_if<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    cond: Value<'c, '_>,
    body: Block<'c>,
) -> Result<melior::ir::Operation<'c>> {
    body.append_operation(op(ctx, loc, "scf.yield", &[], &[], &[])?);
    let region = Region::new();
    region.append_block(body);
    OperationBuilder::new("scf.if", loc)
        .add_operands(&[cond])
        .add_regions([region, Region::new()])
        .build()
        .map_err(|e| err(format!("building scf.if: {e}")))
}
