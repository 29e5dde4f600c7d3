//! SPIR-V for OpenCL (Kernel capability, physical 64-bit addressing): the device module's
//! `gpu.func`s become one SPIR-V module, serialised to the binary `clCreateProgramWithIL` takes.

use crate::backend::edit::{self, RawOp};
use crate::backend::MlirContext;

/// Capabilities kernels may use; `spirv-update-vce` keeps only those they do use.
const CAPS: &str = "Addresses, Int64, Int8, Int16, Float16, Float64, Kernel";
const TARGET: &str = "spirv-attach-target{ver=v1.0 caps=Addresses,Int64,Int8,Int16,Float16,Float64,Kernel client_api=OpenCL}";

/// Lowers the device module to SPIR-V; returns the binary and the SPIR-V dialect text.
pub fn lower(
    mlir: &MlirContext,
    module: &mut melior::ir::Module,
) -> Result<(Vec<u8>, String), String> {
    let root = RawOp::of(&module.as_operation());
    // Each kernel declares its workgroup size, as OpenCL's reqd_work_group_size.
    for f in root.descendants().into_iter().filter(|o| o.is("gpu.func")) {
        let size = f
            .attr("known_block_size")
            .and_then(edit::i32_array_attr)
            .ok_or("a kernel without a known block size")?;
        let dims = size.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        let abi = edit::parse_attr(
            &mlir.ctx,
            &format!("#spirv.entry_point_abi<workgroup_size = [{dims}]>"),
        )
        .ok_or("bad entry point ABI")?;
        f.set_attr("spirv.entry_point_abi", abi);
    }
    // The same environment as the module's target, where the math conversion looks for it (without
    // it, math becomes Vulkan's GLSL instructions): math becomes OpenCL's extended instructions.
    let env = edit::parse_attr(&mlir.ctx, &format!("#spirv.target_env<#spirv.vce<v1.0, [{CAPS}], []>, api=OpenCL, #spirv.resource_limits<>>"))
        .ok_or("bad SPIR-V target environment")?;
    for m in root.children().into_iter().filter(|o| o.is("gpu.module")) {
        m.set_attr("spirv.target_env", env);
    }
    // SPIR-V 1.0 has no bf16, and MLIR's converter widens it to f32, which would misread bf16
    // buffers: bf16 becomes i16 here (`arith-expand` already turned its conversions into
    // integer arithmetic; what is left moves bits).
    super::bf16::to_i16(&mlir.ctx, root)?;
    mlir.run_pipeline(module, "builtin.module(canonicalize)")
        .map_err(|e| format!("after bf16 to i16: {e}"))?;
    let pipeline = format!(
        "builtin.module({TARGET},map-memref-spirv-storage-class{{client-api=opencl}},gpu.module(convert-math-to-spirv),convert-gpu-to-spirv{{use-64bit-index=true}},gpu.module(spirv.module(spirv-lower-abi-attrs,spirv-update-vce)))"
    );
    mlir.run_pipeline(module, &pipeline).map_err(|e| format!("lowering to SPIR-V: {e}"))?;
    let text = module.as_operation().to_string();
    mlir.run_pipeline(module, "builtin.module(gpu-module-to-binary)")
        .map_err(|e| format!("serialising SPIR-V: {e}"))?;
    let binary = super::binary_object(RawOp::of(&module.as_operation()))?;
    Ok((binary, text))
}

/// The SPIR-V binary as text: `spirv-dis` when installed (the standard disassembly), else the
/// SPIR-V dialect form MLIR printed (the same module, one op per instruction).
pub fn disassemble(binary: &[u8], dialect_text: &str) -> String {
    // A fresh directory only this user may enter (removed when dropped): what `spirv-dis` reads
    // is what kiln wrote.
    let out = (|| {
        let dir = kiln_runtime::files::PrivateDir::new("kiln-spirv").ok()?;
        let p = dir.join("kernels.spv");
        kiln_runtime::files::write_new(&p, binary, 0o600).ok()?;
        let o = std::process::Command::new("spirv-dis").arg(&p).output().ok()?;
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    })();
    out.unwrap_or_else(|| format!("; spirv-dis is not installed (Debian: spirv-tools); the module in MLIR's SPIR-V dialect:\n{dialect_text}"))
}
