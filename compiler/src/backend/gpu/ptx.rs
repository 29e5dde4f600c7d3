//! PTX for NVIDIA GPUs: the device module's `gpu.func`s lowered to the NVVM dialect, translated
//! to LLVM IR, linked with CUDA's libdevice when they call its math, optimised and emitted as PTX
//! by LLVM's NVPTX backend through inkwell.

use std::path::PathBuf;

use inkwell::context::Context as LlvmContext;
use inkwell::module::{Linkage, Module as LlvmModule};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetTriple,
};
use inkwell::OptimizationLevel;

use crate::backend::edit::{self, RawOp};
use crate::backend::MlirContext;

/// LLVM's calling convention for PTX kernels (`ptx_kernel`).
const PTX_KERNEL_CC: u32 = 71;

/// What the PTX is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PtxTarget {
    /// `sm_80`, `sm_90`...
    pub arch: String,
    /// PTX ISA version times ten (78: ISA 7.8, which CUDA 11.8's `ptxas` reads).
    pub isa: u32,
}

impl Default for PtxTarget {
    fn default() -> PtxTarget {
        PtxTarget { arch: "sm_80".into(), isa: 78 }
    }
}

pub struct Ptx {
    pub ptx: String,
    pub lowered: String,
    pub llvm: String,
}

/// Lowers the device module to PTX.
pub fn lower(
    mlir: &MlirContext,
    module: &mut melior::ir::Module,
    target: &PtxTarget,
) -> Result<Ptx, String> {
    mlir.run_pipeline(
        module,
        // Tensor-core ops (nvgpu) and the n-D vectors that carry their fragments first; then
        // everything else.
        "builtin.module(gpu.module(convert-nvgpu-to-nvvm,convert-vector-to-llvm,convert-scf-to-cf,convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1},convert-index-to-llvm,canonicalize,reconcile-unrealized-casts))",
    )
    .map_err(|e| format!("lowering to NVVM: {e}"))?;
    align_shared_memory(&mlir.ctx, RawOp::of(&module.as_operation()));
    let lowered = module.as_operation().to_string();
    let gpu_module = RawOp::of(&module.as_operation())
        .children()
        .into_iter()
        .find(|o| o.is("gpu.module"))
        .ok_or("no gpu.module")?;
    let llvm = LlvmContext::create();
    // SAFETY: inkwell's context comes from the same statically linked LLVM as MLIR's translation.
    let raw = unsafe {
        mlir_sys::mlirTranslateModuleToLLVMIR(gpu_module.0, llvm.raw() as mlir_sys::LLVMContextRef)
    };
    if raw.is_null() {
        return Err(format!(
            "translating the kernels to LLVM IR failed: {}",
            mlir.take_diagnostics()
        ));
    }
    // SAFETY: a module the translation just created in `llvm`, owned from here on.
    let m = unsafe { LlvmModule::new(raw as inkwell::llvm_sys::prelude::LLVMModuleRef) };
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let tm = Target::from_triple(&triple)
        .map_err(|e| format!("LLVM has no NVPTX target: {e}"))?
        .create_target_machine(
            &triple,
            &target.arch,
            &format!("+ptx{}", target.isa),
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            format!(
                "LLVM cannot target {} with PTX ISA {}.{}",
                target.arch,
                target.isa / 10,
                target.isa % 10
            )
        })?;
    m.set_triple(&triple);
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    link_libdevice(&llvm, &m)?;
    // Only the kernels are entry points: everything else (libdevice's functions) may be inlined
    // and dropped.
    let mut f = m.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 && func.get_call_conventions() != PTX_KERNEL_CC {
            func.set_linkage(Linkage::Internal);
        }
        f = func.get_next_function();
    }
    m.verify().map_err(|e| format!("invalid LLVM IR for the kernels: {e}"))?;
    m.run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| format!("LLVM optimisation failed: {e}"))?;
    let llvm_text = m.print_to_string().to_string();
    let asm = tm
        .write_to_memory_buffer(&m, FileType::Assembly)
        .map_err(|e| format!("PTX emission failed: {e}"))?;
    Ok(Ptx { ptx: String::from_utf8_lossy(asm.as_slice()).into_owned(), lowered, llvm: llvm_text })
}

/// Links CUDA's libdevice when the kernels call its functions (`__nv_expf`...).
fn link_libdevice<'l>(llvm: &'l LlvmContext, m: &LlvmModule<'l>) -> Result<(), String> {
    let mut needs = false;
    let mut f = m.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() == 0 && func.get_name().to_bytes().starts_with(b"__nv_") {
            needs = true;
        }
        f = func.get_next_function();
    }
    if !needs {
        return Ok(());
    }
    let path = libdevice().ok_or(
        "the kernels call CUDA's math library (libdevice.10.bc), which was not found: install Debian's nvidia-cuda-toolkit \
         (scripts/setup-cuda-tools.sh) or a CUDA toolkit, or set KILN_LIBDEVICE to the file",
    )?;
    let lib = LlvmModule::parse_bitcode_from_path(&path, llvm)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    lib.set_triple(&m.get_triple());
    lib.set_data_layout(&m.get_data_layout());
    m.link_in_module(lib).map_err(|e| format!("linking {}: {e}", path.display()))
}

/// Where libdevice is: `$KILN_LIBDEVICE`, a CUDA toolkit (`$CUDA_HOME`, `/usr/local/cuda`), or
/// Debian's nvidia-cuda-toolkit.
pub fn libdevice() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_LIBDEVICE") {
        return Some(PathBuf::from(p));
    }
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push("/usr/local/cuda".into());
    let mut candidates: Vec<PathBuf> =
        roots.iter().map(|r| r.join("nvvm/libdevice/libdevice.10.bc")).collect();
    candidates.push("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc".into());
    candidates.push("/usr/lib/cuda/nvvm/libdevice/libdevice.10.bc".into());
    candidates.into_iter().find(|p| p.is_file())
}

/// Shared-memory arrays aligned to 16 bytes. NVPTX's load/store vectoriser combines neighbouring
/// shared accesses into `ld.shared.v2`/`v4` while the PTX still declares the arrays `.align 4`
/// (their element's alignment), so an array that happened to start at an odd word faulted with a
/// misaligned address on the GPU. With the alignment explicit, the vectors are sound.
fn align_shared_memory(ctx: &melior::Context, root: RawOp) {
    for op in root.descendants() {
        let shared =
            op.is("llvm.mlir.global") && op.attr("addr_space").and_then(edit::int_attr) == Some(3);
        if shared && op.attr("alignment").and_then(edit::int_attr).is_none_or(|a| a < 16) {
            op.set_attr(
                "alignment",
                edit::parse_attr(ctx, "16 : i64").expect("an integer attribute"),
            );
        }
    }
}
