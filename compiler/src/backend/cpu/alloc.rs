//! Temporaries the system refuses. Bufferisation leaves `memref.alloc`s in a kernel (a padded
//! copy, a tensor between two ops that did not fuse) which the lowering turns into calls to
//! `_mlir_memref_to_llvm_alloc` (`finalize-memref-to-llvm{use-generic-functions=1}`), defined in
//! `support.c`: a refused allocation records the failure in the run's status word and returns
//! NULL. Here, in the CFG form the lowering reaches before memrefs become LLVM, every allocation
//! is followed by a test of its pointer and a branch to a block that returns, so the kernel
//! stops before it writes through NULL and the run fails naming it (an LRN of 2^31 + 1 channels
//! segfaulted in the memset after its padded copy's `malloc`). What the function allocated
//! before the failure is freed when its wrapper returns (`support.c`'s per-thread list). The
//! same CFG gives the bound of what the temporaries hold (`temporaries`), which the artifact
//! records for the memory budget.

use melior::dialect::arith::{self, CmpiPredicate};
use melior::dialect::func;
use melior::ir::attribute::{DenseI32ArrayAttribute, IntegerAttribute};
use melior::ir::operation::OperationBuilder;
use melior::ir::{Block, BlockLike, BlockRef, Identifier, Location, Module, Type, Value};
use melior::Context;

use crate::backend::edit::RawOp;

/// What `module`'s temporaries may hold at once on one thread, in bytes as `support.c` counts
/// them: every `memref.alloc` at its static size, plus the alignment the lowering adds to it
/// (`finalize-memref-to-llvm` asks size + alignment to align by hand). Each alloc holds one
/// buffer at a time (the deallocation pipeline frees a loop's before its next iteration), so
/// their sum bounds what the kernel holds, whatever its order. `None` when one has a size the
/// type does not fix (a dynamic dimension, an element kiln does not size). Read after
/// `convert-scf-to-cf`, from the types of the ops themselves.
pub fn temporaries(module: &Module) -> Option<u64> {
    let root = RawOp::of(&module.as_operation());
    let mut total = 0u64;
    for a in root.descendants().into_iter().filter(|o| o.is("memref.alloc")) {
        let ty = crate::backend::edit::value_type(a.result(0));
        let dims = crate::backend::edit::static_dims(ty)?;
        let element = crate::backend::edit::element_bytes(ty)? as u64;
        let numel = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64))?;
        let alignment = a
            .attr("alignment")
            .and_then(crate::backend::edit::int_attr)
            .map_or(0, |x| x.max(0) as u64);
        // (support.c asks at least a byte.)
        let bytes = numel.checked_mul(element)?.checked_add(alignment)?.max(1);
        total = total.checked_add(bytes)?;
    }
    Some(total)
}

/// Makes every `memref.alloc` of every function in `module` (after `convert-scf-to-cf`) return
/// from its function when the allocation fails.
pub fn check_allocations(ctx: &Context, module: &Module) -> Result<(), String> {
    let root = RawOp::of(&module.as_operation());
    for f in root.children().into_iter().filter(|o| o.is("func.func")) {
        let allocs: Vec<RawOp> =
            f.descendants().into_iter().filter(|o| o.is("memref.alloc")).collect();
        if allocs.is_empty() {
            continue;
        }
        if let Some(a) = allocs.iter().find(|a| a.parent() != Some(f)) {
            // A branch can only leave the function from one of its own blocks.
            let inside = a.parent().map_or_else(|| "nothing".to_string(), RawOp::name);
            return Err(format!(
                "a temporary is allocated inside `{inside}`, where its failure cannot return"
            ));
        }
        let fail = failure_block(ctx, f)?;
        for a in allocs {
            branch_on_null(ctx, a, fail)?;
        }
    }
    Ok(())
}

/// Appends to `f`'s body a block that returns (the kernel's functions return nothing).
fn failure_block(ctx: &Context, f: RawOp) -> Result<mlir_sys::MlirBlock, String> {
    let ty = f.attr("function_type").ok_or("a function without a type")?;
    // SAFETY: a live func.func: its `function_type` is a TypeAttr of a function type, and its
    // body region takes the new block (owned by it from here on).
    unsafe {
        let fty = mlir_sys::mlirTypeAttrGetValue(ty);
        if mlir_sys::mlirFunctionTypeGetNumResults(fty) != 0 {
            return Err("a kernel function with results cannot return early".into());
        }
        let region = mlir_sys::mlirOperationGetRegion(f.0, 0);
        let block = Block::new(&[]);
        block.append_operation(func::r#return(&[], Location::unknown(ctx)));
        let raw = block.into_raw();
        mlir_sys::mlirRegionAppendOwnedBlock(region, raw);
        Ok(raw)
    }
}

/// Splits `alloc`'s block after it and branches to `fail` when the allocation is NULL.
fn branch_on_null(ctx: &Context, alloc: RawOp, fail: mlir_sys::MlirBlock) -> Result<(), String> {
    let loc = Location::unknown(ctx);
    let index = Type::index(ctx);
    // SAFETY: `alloc` is a live op directly in a block of its function's body; the new block is
    // owned by that region; the ops after `alloc` move into it in order, so the IR stays valid
    // (values keep dominating their uses: the new block runs only after `alloc`'s).
    unsafe {
        let block = mlir_sys::mlirOperationGetBlock(alloc.0);
        let rest = Block::new(&[]).into_raw();
        mlir_sys::mlirRegionInsertOwnedBlockAfter(
            mlir_sys::mlirBlockGetParentRegion(block),
            block,
            rest,
        );
        let mut op = mlir_sys::mlirOperationGetNextInBlock(alloc.0);
        while !op.ptr.is_null() {
            let next = mlir_sys::mlirOperationGetNextInBlock(op);
            mlir_sys::mlirOperationRemoveFromParent(op);
            mlir_sys::mlirBlockAppendOwnedOperation(rest, op);
            op = next;
        }
        let here = BlockRef::from_raw(block);
        let memory = Value::from_raw(alloc.result(0));
        let pointer: Value = here
            .append_operation(
                OperationBuilder::new("memref.extract_aligned_pointer_as_index", loc)
                    .add_operands(&[memory])
                    .add_results(&[index])
                    .build()
                    .map_err(|e| format!("building the pointer test: {e}"))?,
            )
            .result(0)
            .map_err(|e| e.to_string())?
            .into();
        let zero: Value = here
            .append_operation(arith::constant(ctx, IntegerAttribute::new(index, 0).into(), loc))
            .result(0)
            .map_err(|e| e.to_string())?
            .into();
        let null: Value = here
            .append_operation(arith::cmpi(ctx, CmpiPredicate::Eq, pointer, zero, loc))
            .result(0)
            .map_err(|e| e.to_string())?
            .into();
        let (to_fail, to_rest) = (BlockRef::from_raw(fail), BlockRef::from_raw(rest));
        let branch = OperationBuilder::new("cf.cond_br", loc)
            .add_operands(&[null])
            .add_successors(&[&to_fail, &to_rest])
            .add_attributes(&[(
                Identifier::new(ctx, "operandSegmentSizes"),
                DenseI32ArrayAttribute::new(ctx, &[1, 0, 0]).into(),
            )])
            .build()
            .map_err(|e| format!("building the branch: {e}"))?;
        here.append_operation(branch);
    }
    Ok(())
}
