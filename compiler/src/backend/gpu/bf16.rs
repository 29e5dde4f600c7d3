//! bf16 as i16 for SPIR-V: OpenCL's SPIR-V has no bf16 type, and MLIR's SPIR-V conversion widens
//! bf16 to f32, which would read a 2-byte buffer as 4-byte floats. Kernels only move bf16 bits
//! by then (`arith-expand` has made every extension and truncation integer arithmetic ending in
//! `arith.bitcast`), so every bf16 in the device module (values, block arguments, memref
//! elements, function signatures) becomes i16, and the bitcasts between the two fold away.

use mlir_sys::{MlirType, MlirValue};

use crate::backend::edit::{self, RawOp};

/// `t` with bf16 replaced by i16 (as a memref's element too); `None` when `t` holds no bf16.
fn replaced(ctx: &melior::Context, t: MlirType) -> Option<MlirType> {
    // SAFETY: querying and building types in `t`'s live context.
    unsafe {
        if mlir_sys::mlirTypeIsABF16(t) {
            return Some(mlir_sys::mlirIntegerTypeGet(ctx.to_raw(), 16));
        }
        if mlir_sys::mlirTypeIsAMemRef(t) {
            let e = mlir_sys::mlirShapedTypeGetElementType(t);
            if !mlir_sys::mlirTypeIsABF16(e) {
                return None;
            }
            let rank = mlir_sys::mlirShapedTypeGetRank(t);
            let shape: Vec<i64> =
                (0..rank).map(|i| mlir_sys::mlirShapedTypeGetDimSize(t, i as isize)).collect();
            return Some(mlir_sys::mlirMemRefTypeGet(
                mlir_sys::mlirIntegerTypeGet(ctx.to_raw(), 16),
                rank as isize,
                shape.as_ptr(),
                mlir_sys::mlirMemRefTypeGetLayout(t),
                mlir_sys::mlirMemRefTypeGetMemorySpace(t),
            ));
        }
        None
    }
}

fn retype(ctx: &melior::Context, v: MlirValue) {
    if let Some(t) = replaced(ctx, edit::value_type(v)) {
        edit::set_value_type(v, t);
    }
}

/// Rewrites every bf16 under `root` to i16. An op that computes on bf16 (rather than moving its
/// bits) is an error: nothing should be left to compute on it at this stage.
pub fn to_i16(ctx: &melior::Context, root: RawOp) -> Result<(), String> {
    for op in root.descendants() {
        let name = op.name();
        if name.starts_with("arith.") && !matches!(name.as_str(), "arith.bitcast" | "arith.select")
        {
            let on_bf16 = (0..op.num_results())
                .map(|i| op.result(i))
                .chain(op.operands())
                .any(|v| unsafe { mlir_sys::mlirTypeIsABF16(edit::value_type(v)) });
            if on_bf16 {
                return Err(format!("`{name}` computes on bf16, which SPIR-V 1.0 lacks"));
            }
        }
        for i in 0..op.num_results() {
            retype(ctx, op.result(i));
        }
        // SAFETY: walking a live op's regions and blocks.
        unsafe {
            for r in 0..mlir_sys::mlirOperationGetNumRegions(op.0) {
                let region = mlir_sys::mlirOperationGetRegion(op.0, r);
                let mut block = mlir_sys::mlirRegionGetFirstBlock(region);
                while !block.ptr.is_null() {
                    for a in 0..mlir_sys::mlirBlockGetNumArguments(block) {
                        retype(ctx, mlir_sys::mlirBlockGetArgument(block, a));
                    }
                    block = mlir_sys::mlirBlockGetNextInRegion(block);
                }
            }
        }
        // A function's signature follows its (now rewritten) entry block.
        if let Some(ft) = op.attr("function_type") {
            // SAFETY: `function_type` is a TypeAttr of a FunctionType.
            unsafe {
                let f = mlir_sys::mlirTypeAttrGetValue(ft);
                let ins: Vec<MlirType> = (0..mlir_sys::mlirFunctionTypeGetNumInputs(f))
                    .map(|i| {
                        let t = mlir_sys::mlirFunctionTypeGetInput(f, i);
                        replaced(ctx, t).unwrap_or(t)
                    })
                    .collect();
                let outs: Vec<MlirType> = (0..mlir_sys::mlirFunctionTypeGetNumResults(f))
                    .map(|i| {
                        let t = mlir_sys::mlirFunctionTypeGetResult(f, i);
                        replaced(ctx, t).unwrap_or(t)
                    })
                    .collect();
                let nf = mlir_sys::mlirFunctionTypeGet(
                    ctx.to_raw(),
                    ins.len() as isize,
                    ins.as_ptr(),
                    outs.len() as isize,
                    outs.as_ptr(),
                );
                op.set_attr("function_type", mlir_sys::mlirTypeAttrGet(nf));
            }
        }
    }
    Ok(())
}
