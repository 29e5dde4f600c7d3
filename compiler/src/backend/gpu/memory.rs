//! Memory spaces inside kernels. Bufferisation leaves `memref.alloc`s in the `gpu.func`s:
//! workgroup tiles (memory space 3) and per-thread temporaries (no memory space). Each target
//! wants them differently:
//! - SPIR-V (OpenCL): workgroup allocs stay (they become Workgroup variables); per-thread ones
//!   become `memref.alloca` in memory space 6 (Function storage), at the function's entry.
//! - NVVM: workgroup allocs become the function's workgroup attributions (shared memory);
//!   per-thread ones become `memref.alloca` at the entry (local memory, registers after SROA).
//!
//! Runs after `fold-memref-alias-ops`, so these buffers are only loaded from and stored to, and
//! retyping them is safe.

use melior::ir::operation::OperationBuilder;
use melior::ir::{Location, Type};

use crate::backend::edit::{self, RawOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Spirv,
    Nvvm,
}

/// Legalises the allocations of every `gpu.func` in `device` (a `gpu.module`).
pub fn legalize(ctx: &melior::Context, device: RawOp, flavor: Flavor) -> Result<(), String> {
    for func in device.children().into_iter().filter(|f| f.is("gpu.func")) {
        resize_empty_arguments(func)?;
        let entry = func.block(0).ok_or("a gpu.func without a body")?;
        let mut attributions = 0usize;
        for op in
            func.descendants().into_iter().filter(|o| o.is("memref.alloc") || o.is("memref.alloca"))
        {
            let v = op.result(0);
            let t = edit::value_type(v);
            for u in edit::users(v) {
                if !matches!(
                    u.name().as_str(),
                    "memref.load" | "memref.store" | "vector.load" | "vector.store"
                ) {
                    return Err(format!(
                        "a kernel temporary ({}) is used by `{}`",
                        edit::type_text(t),
                        u.name()
                    ));
                }
            }
            let (Some(dims), Some(elem)) = (edit::static_dims(t), edit::element_type(t)) else {
                return Err(format!(
                    "a kernel temporary has a dynamic shape ({})",
                    edit::type_text(t)
                ));
            };
            // Schedules put shared tiles in workgroup memory: NVVM's address space 3 or GPU's.
            let workgroup = edit::memory_space(t).is_some_and(|s| {
                edit::int_attr(s) == Some(3) || edit::attr_is(s, "#gpu.address_space<workgroup>")
            });
            let space = |text: &str| {
                edit::parse_attr(ctx, text).ok_or_else(|| format!("bad memory space {text}"))
            };
            match (flavor, workgroup) {
                (Flavor::Spirv, true) => {}
                // SPIR-V's Function storage class: a private array.
                (Flavor::Spirv, false) => replace_with_alloca(
                    ctx,
                    op,
                    entry,
                    edit::contiguous_memref(elem, &dims, Some(space("6 : i64")?)),
                )?,
                (Flavor::Nvvm, false) => replace_with_alloca(ctx, op, entry, t)?,
                (Flavor::Nvvm, true) => {
                    let t = edit::contiguous_memref(
                        elem,
                        &dims,
                        Some(space("#gpu.address_space<workgroup>")?),
                    );
                    // SAFETY: a new argument of the entry block after the function's arguments
                    // (there are no private attributions), declared below as an attribution.
                    let arg = unsafe {
                        mlir_sys::mlirBlockAddArgument(entry, t, Location::unknown(ctx).to_raw())
                    };
                    edit::replace_uses(v, arg);
                    op.erase();
                    attributions += 1;
                }
            }
        }
        if attributions > 0 {
            let a = edit::parse_attr(ctx, &format!("{attributions} : i64"))
                .expect("an integer attribute");
            func.set_attr("workgroup_attributions", a);
        }
    }
    Ok(())
}

/// The workgroup memory each `gpu.func` of `device` declares, in bytes, by function name: its
/// workgroup attributions (NVVM) or its workgroup-space allocations (SPIR-V), after `legalize`.
pub fn workgroup_bytes(device: RawOp) -> std::collections::HashMap<String, usize> {
    let mut out = std::collections::HashMap::new();
    for func in device.children().into_iter().filter(|f| f.is("gpu.func")) {
        let Some(name) = func.attr("sym_name").and_then(edit::string_attr) else { continue };
        let size = |t| {
            edit::static_dims(t).map_or(0, |d| d.iter().product::<usize>())
                * edit::element_bytes(t).unwrap_or(4)
        };
        let mut bytes = 0;
        // NVVM: the entry block's arguments after the function's are its attributions.
        if let (Some(entry), Some(ft)) = (func.block(0), func.attr("function_type")) {
            // SAFETY: reading a live gpu.func's signature and entry block.
            unsafe {
                let inputs =
                    mlir_sys::mlirFunctionTypeGetNumInputs(mlir_sys::mlirTypeAttrGetValue(ft));
                for i in inputs..mlir_sys::mlirBlockGetNumArguments(entry) {
                    bytes += size(edit::value_type(mlir_sys::mlirBlockGetArgument(entry, i)));
                }
            }
        }
        // SPIR-V: allocations in workgroup memory.
        for op in func.descendants().into_iter().filter(|o| o.is("memref.alloc")) {
            let t = edit::value_type(op.result(0));
            if edit::memory_space(t).is_some_and(|s| edit::int_attr(s) == Some(3)) {
                bytes += size(t);
            }
        }
        out.insert(name, bytes);
    }
    out
}

/// A buffer argument with no elements (an empty input a kernel never reads) becomes a
/// one-element buffer: SPIR-V has no zero-length arrays, and the runtime gives empty buffers a
/// few bytes anyway. Only arguments nothing uses are changed.
fn resize_empty_arguments(func: RawOp) -> Result<(), String> {
    let Some(entry) = func.block(0) else { return Ok(()) };
    let Some(ft) = func.attr("function_type") else { return Ok(()) };
    // SAFETY: reading and rebuilding a live gpu.func's signature; retyped arguments have no uses.
    unsafe {
        let fty = mlir_sys::mlirTypeAttrGetValue(ft);
        let n_in = mlir_sys::mlirFunctionTypeGetNumInputs(fty);
        let mut inputs: Vec<mlir_sys::MlirType> =
            (0..n_in).map(|i| mlir_sys::mlirFunctionTypeGetInput(fty, i)).collect();
        let mut changed = false;
        for (i, input) in inputs.iter_mut().enumerate() {
            let dims = edit::static_dims(*input);
            if dims.is_none_or(|d| d.iter().product::<usize>() != 0)
                || i >= mlir_sys::mlirBlockGetNumArguments(entry) as usize
            {
                continue;
            }
            let arg = mlir_sys::mlirBlockGetArgument(entry, i as isize);
            if !edit::users(arg).is_empty() {
                continue;
            }
            let elem = edit::element_type(*input).ok_or("a buffer argument that is not shaped")?;
            let one = edit::contiguous_memref(elem, &[1], edit::memory_space(*input));
            edit::set_value_type(arg, one);
            *input = one;
            changed = true;
        }
        if changed {
            let n_out = mlir_sys::mlirFunctionTypeGetNumResults(fty);
            let outputs: Vec<mlir_sys::MlirType> =
                (0..n_out).map(|i| mlir_sys::mlirFunctionTypeGetResult(fty, i)).collect();
            let new = mlir_sys::mlirFunctionTypeGet(
                mlir_sys::mlirTypeGetContext(fty),
                inputs.len() as isize,
                inputs.as_ptr(),
                outputs.len() as isize,
                outputs.as_ptr(),
            );
            func.set_attr("function_type", mlir_sys::mlirTypeAttrGet(new));
        }
    }
    Ok(())
}

/// Replaces an allocation by an `alloca` of type `ty` at the start of `entry`.
fn replace_with_alloca(
    ctx: &melior::Context,
    op: RawOp,
    entry: mlir_sys::MlirBlock,
    ty: mlir_sys::MlirType,
) -> Result<(), String> {
    // SAFETY: a live type of this context.
    let t = unsafe { Type::from_raw(ty) };
    let seg = edit::parse_attr(ctx, "array<i32: 0, 0>").expect("a dense array");
    // SAFETY: a live attribute of this context.
    let seg = unsafe { melior::ir::Attribute::from_raw(seg) };
    let new = OperationBuilder::new("memref.alloca", Location::unknown(ctx))
        .add_results(&[t])
        .add_attributes(&[(melior::ir::Identifier::new(ctx, "operandSegmentSizes"), seg)])
        .build()
        .map_err(|e| format!("building memref.alloca: {e}"))?;
    let raw = new.into_raw();
    // SAFETY: the new op goes first in the entry block; the old one's uses move to it (loads and
    // stores only, checked by the caller) before it is erased.
    unsafe {
        let first = mlir_sys::mlirBlockGetFirstOperation(entry);
        mlir_sys::mlirBlockInsertOwnedOperationBefore(entry, first, raw);
    }
    edit::replace_uses(op.result(0), RawOp(raw).result(0));
    op.erase();
    Ok(())
}
