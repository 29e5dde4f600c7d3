//! The CPU target: per-kernel workgroup distribution (transform dialect), bufferisation and
//! lowering to the LLVM dialect, translation to LLVM IR, optimisation for the host CPU by inkwell,
//! and one shared object holding every kernel.
//!
//! Each kernel's body function takes its memrefs in MLIR's expanded descriptor form (allocated and
//! aligned pointer, offset, sizes, strides), then `i64 wg_begin, i64 wg_end`; an exported wrapper
//! `k(void **args, i64 wg_begin, i64 wg_end)` loads each buffer pointer, builds the descriptor
//! from the static shape, and calls it. That is the signature the runtime's CPU device calls.
//! `args` ends with the run's status word (`kiln_runtime::status`): the wrapper hands it to
//! `support.c` for what fails in C (a kernel's scratch, an MLIR temporary: `cpu/alloc.rs`), and
//! to the body when its index checks take it (`codegen::status`).

use std::path::PathBuf;

use inkwell::context::Context as LlvmContext;
use inkwell::module::Module as LlvmModule;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::OptimizationLevel;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::{BlockLike, Module, RegionLike};

use kiln_ir::{Graph, ValueId};
use kiln_runtime::artifact::{KernelDesc, Target as ArtifactTarget};
use kiln_runtime::files::{self, PrivateDir};

use super::edit::RawOp;
use super::{linalg, Backend, MlirContext};
use crate::artifact::{Arg, KernelRun, TargetCode};
use crate::codegen;
use crate::fuse::Kernel;
use crate::stage::{Stage, Stages};
use crate::{CompileError, Result};

mod alloc;
mod layout;
pub mod machine;
mod math;
pub mod passes;
pub mod schedule;
mod scratch;
mod script;
pub mod ukernel;

/// Distribution: first tile the workgroup loop, then the pipeline that bufferises and converts
/// it into a plain loop whose bounds become the workgroup range.
const BUFFERIZE: &str = "builtin.module(canonicalize,cse,one-shot-bufferize{bufferize-function-boundaries=1 function-boundary-type-conversion=identity-layout-map},canonicalize,cse,scf-forall-to-for)";

/// Lowering to the LLVM dialect, in two parts: to a CFG on memrefs (temporaries are freed: kernels
/// run many times), where every allocation gets its failure test (`alloc.rs`), then to LLVM
/// (allocations through `support.c`'s `_mlir_memref_to_llvm_alloc`; math without an LLVM
/// intrinsic becomes libm calls).
const LOWER_TO_CF: &str = "builtin.module(func.func(buffer-loop-hoisting),buffer-deallocation-pipeline,convert-bufferization-to-memref,func.func(convert-linalg-to-loops,lower-vector-mask,lower-vector-multi-reduction{lowering-strategy=inner-reduction}),convert-vector-to-scf{full-unroll=true},expand-strided-metadata,lower-affine,convert-scf-to-cf)";
const LOWER_TO_LLVM: &str = "builtin.module(finalize-memref-to-llvm{use-generic-functions=1},convert-math-to-funcs,convert-math-to-llvm,convert-math-to-libm,convert-vector-to-llvm{reassociate-fp-reductions=1},convert-arith-to-llvm,convert-index-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,convert-ub-to-llvm,reconcile-unrealized-casts)";

/// The CPU backend: the microkernel choices in force (see `Options::microkernel` and
/// `Options::microkernel_overrides`; the first forces, the second chooses per kernel signature).
pub struct CpuBackend {
    pub microkernel: Option<bool>,
    pub overrides: std::collections::HashMap<String, bool>,
    /// VNNI for integer convolutions where the host has it (`Options::vnni`).
    pub vnni: bool,
    /// AMX tiles for integer convolutions where the host has them (`Options::amx`).
    pub amx: bool,
    /// The arithmetic of convolutions and matrix products (`Options::precision`); `mod.rs`
    /// refused those this host has no kernels for.
    pub precision: crate::Precision,
    /// The CPU the code is for (`Options::target_cpu`).
    pub cpu: machine::CpuSpec,
    /// The threads it is planned for (`Options::planned_threads`).
    pub threads: usize,
}

impl CpuBackend {
    /// The CPU backend `options` ask for, the target CPU resolved and the precision checked.
    pub fn from_options(options: &crate::Options) -> Result<CpuBackend> {
        let cpu = machine::resolve(&options.target_cpu)?;
        Ok(CpuBackend {
            microkernel: options.microkernel_choice(),
            overrides: super::microkernel_overrides(options),
            vnni: options.vnni_allowed(),
            amx: options.amx_allowed(),
            precision: precision(options, &cpu)?,
            cpu,
            threads: options.planned_threads(),
        })
    }
}

/// The precision the CPU backend compiles at: f32, or bf16 where the host multiplies bf16
/// (AVX512-BF16's `vdpbf16ps`; the target CPU's, which is the host's unless `--target-cpu`
/// names another) and the microkernels, which are what compute in bf16, are not
/// forced off; anything else is refused, not run slower than asked.
fn precision(options: &crate::Options, cpu: &machine::CpuSpec) -> Result<crate::Precision> {
    let precision = options.precision;
    let refuse = |why: &str| CompileError::Precision { precision, target: "cpu", why: why.into() };
    match precision {
        crate::Precision::F32 => Ok(precision),
        crate::Precision::Bf16 => {
            if !ukernel::Host::detect(&cpu.features).bf16 {
                Err(refuse(&format!(
                    "the target CPU ({}) has no AVX512-BF16 (vdpbf16ps), which kiln's bf16 kernels multiply with",
                    cpu.target
                )))
            } else if options.microkernel_choice() == Some(false) {
                Err(refuse(
                    "the microkernels are turned off (KILN_UKERNEL=0 or Options::microkernel), \
                     and they are what computes in bf16",
                ))
            } else {
                Ok(precision)
            }
        }
        crate::Precision::F16 => Err(refuse(
            "kiln's CPU kernels have no f16 arithmetic (bf16 they have: --precision bf16)",
        )),
        crate::Precision::Tf32 => Err(refuse(
            "TF32 is NVIDIA's tensor-core format; CPUs have none (bf16 they may: --precision bf16)",
        )),
    }
}

/// The stages a CPU compile has: every shared one, its schedule, LLVM IR and assembly.
pub const STAGES: &[Stage] = &[
    Stage::Passes,
    Stage::Graph,
    Stage::Fused,
    Stage::Schedule,
    Stage::Mlir,
    Stage::Lowered,
    Stage::Llvm,
    Stage::Asm,
];

/// The CPU's rules.
pub struct CpuRules;

impl super::Rules for CpuRules {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn graph_passes(&self) -> Vec<crate::passes::Pass> {
        passes::passes()
    }

    fn decompose(&self) -> fn(&mut Graph) -> Result<bool> {
        passes::decompose
    }

    /// The CPU's buffers are pointers, which start anywhere.
    fn views(&self) -> crate::fuse::Views {
        crate::fuse::Views::WithOffsets
    }

    fn stages(&self) -> &'static [Stage] {
        STAGES
    }

    fn finish_phase(&self) -> &'static str {
        "llvm+link"
    }
}

impl Backend for CpuBackend {
    fn rules(&self) -> &'static dyn super::Rules {
        &CpuRules
    }

    fn kernel_mlir(&self, graph: &Graph, kernels: &[Kernel]) -> Result<String> {
        let mlir = MlirContext::new();
        let host = self.host();
        let (plans, _) = self.plan(graph, kernels, &host)?;
        let mut text = String::new();
        for (i, (k, micro)) in kernels.iter().zip(&plans).enumerate() {
            let built = build(&mlir, graph, k, micro.as_ref(), function_index(i)?)?;
            text.push_str(&built.as_operation().to_string());
        }
        Ok(text)
    }

    fn compile(
        &self,
        graph: &Graph,
        kernels: &[Kernel],
        mut texts: Option<&mut Stages>,
        progress: &dyn Fn(usize),
    ) -> Result<TargetCode> {
        let mlir = MlirContext::new();
        let llvm = LlvmContext::create();
        let main = llvm.create_module("kiln");
        let host = self.host();
        let mut uses_ukernel = false;
        let (plans, layouts) = self.plan(graph, kernels, &host)?;
        if let Some(t) = texts.as_deref_mut() {
            t.push(Stage::Schedule, &layouts);
        }
        let mut runs = Vec::with_capacity(kernels.len());
        let mut functions = Vec::with_capacity(kernels.len());
        let mut asks = Vec::with_capacity(kernels.len());
        for (i, (k, micro)) in kernels.iter().zip(&plans).enumerate() {
            let (module, workgroups, mlir_text, schedule_text, constants, constant_slots) =
                match micro {
                    Some(u) => {
                        uses_ukernel = true;
                        let (module, text, described, temps) = lower_ukernel(&mlir, graph, k, u)?;
                        asks.push(KernelScratch { slots: scratch::slots(u), temps });
                        // What the model's values decide (a bias past int32) says so itself.
                        let packed = ukernel::pack(graph, k, u).map_err(|e| match e {
                            CompileError::Unsupported { .. } => e,
                            e => CompileError::in_kernel(
                                k,
                                "pack",
                                crate::KernelError::Codegen(Box::new(e)),
                            ),
                        })?;
                        // (A pooling kernel has no constant of its own.)
                        let (constants, slots) = if packed.is_empty() {
                            (Vec::new(), Vec::new())
                        } else {
                            (vec![packed], ukernel::replaced_inputs(graph, k, u))
                        };
                        (module, u.workgroups(), text, described, constants, slots)
                    }
                    None => {
                        let (module, workgroups, text, described, temps) =
                            lower_linalg(&mlir, graph, k, function_index(i)?, host.max_units())?;
                        asks.push(KernelScratch { slots: Vec::new(), temps });
                        (module, workgroups, text, described, Vec::new(), Vec::new())
                    }
                };
            if let Some(t) = texts.as_deref_mut() {
                t.push(Stage::Schedule, &schedule_text);
                t.push(Stage::Mlir, &mlir_text);
                t.push(Stage::Lowered, &module.as_operation().to_string());
            }
            // SAFETY: the LLVM context is inkwell's, from the same statically linked LLVM as MLIR's.
            let raw = unsafe {
                mlir_sys::mlirTranslateModuleToLLVMIR(
                    module.as_operation().to_raw(),
                    llvm.raw() as mlir_sys::LLVMContextRef,
                )
            };
            if raw.is_null() {
                return Err(CompileError::in_kernel(
                    k,
                    "llvm",
                    format!("translation to LLVM IR failed: {}", mlir.take_diagnostics()),
                ));
            }
            // SAFETY: a module the translation just created in `llvm`, owned by us from here on.
            let m = unsafe { LlvmModule::new(raw as inkwell::llvm_sys::prelude::LLVMModuleRef) };
            main.link_in_module(m)
                .map_err(|e| CompileError::in_kernel(k, "llvm", format!("linking: {e}")))?;
            // One function per kernel, called once on its buffers and the status word; a
            // kernel's own constants (packed weights) take the slots of the values they replace.
            let mut run = KernelRun::single(i, k.inputs.len() + k.outputs.len());
            for &s in &constant_slots {
                run.calls[0].args[s] = Arg::Constant(0);
            }
            run.calls[0].args.push(Arg::Status);
            run.constants = constants;
            runs.push(run);
            functions.push(KernelDesc {
                symbol: k.name.clone(),
                workgroups,
                label: k.label.clone(),
                grid: [0; 3],
                block: [0; 3],
                bytes: 0,
                flops: 0,
            });
            progress(runs.len());
        }
        // The linalg path's index checks take the word as an argument; microkernels report
        // through `support.c`.
        let body_status: Vec<bool> = kernels
            .iter()
            .zip(&plans)
            .map(|(k, micro)| micro.is_none() && codegen::status::takes_status(graph, k))
            .collect();
        add_wrappers(&llvm, &main, kernels, graph, &body_status)?;
        let (tm, detail, cpu_features) = target_machine(&self.cpu)?;
        main.set_triple(&tm.get_triple());
        main.set_data_layout(&tm.get_target_data().get_data_layout());
        // kiln made this module: IR LLVM rejects, or cannot optimise or emit, is a kiln bug.
        main.verify().map_err(|e| CompileError::Internal(format!("invalid LLVM IR: {e}")))?;
        main.run_passes("default<O3>", &tm, PassBuilderOptions::create())
            .map_err(|e| CompileError::Internal(format!("LLVM optimisation failed: {e}")))?;
        if let Some(t) = texts {
            t.set(Stage::Llvm, main.print_to_string().to_string());
            let asm = tm.write_to_memory_buffer(&main, FileType::Assembly).map_err(|e| {
                CompileError::Internal(format!("LLVM assembly emission failed: {e}"))
            })?;
            t.set(Stage::Asm, String::from_utf8_lossy(asm.as_slice()).into_owned());
        }
        let object = tm
            .write_to_memory_buffer(&main, FileType::Object)
            .map_err(|e| CompileError::Internal(format!("LLVM object emission failed: {e}")))?;
        let blob = link_shared(object.as_slice(), uses_ukernel.then_some(host.level))?;
        Ok(TargetCode {
            target: ArtifactTarget::Cpu,
            blob,
            // (What `kiln info` and `kiln compile` print: the precision is the artifact's.)
            target_detail: match self.precision {
                crate::Precision::F32 => detail,
                p => format!("{detail}, --precision {p}"),
            },
            scratch: scratch_bounds(&asks, &functions),
            cpu_features,
            functions,
            runs,
        })
    }
}

/// What one kernel may ask of a thread besides its buffers: the C code's scratch slots and
/// MLIR's temporaries (`None`: of a size not known when compiling).
struct KernelScratch {
    slots: Vec<(scratch::Slot, u64)>,
    temps: Option<u64>,
}

/// The program's kernel scratch a thread (`ScratchDesc`): the C slots it keeps, each at the
/// largest any kernel it runs asks, plus the largest temporaries of one kernel (they live while
/// it runs). The calling thread runs every kernel, a worker those of more than one workgroup.
/// `None` where a kernel's temporaries have no static size: the runtime's cap alone holds them.
fn scratch_bounds(
    kernels: &[KernelScratch],
    functions: &[KernelDesc],
) -> Option<kiln_runtime::artifact::ScratchDesc> {
    let thread = |runs: &dyn Fn(&KernelDesc) -> bool| -> Option<u64> {
        let ran = || kernels.iter().zip(functions).filter(|(_, f)| runs(f)).map(|(k, _)| k);
        let temps = ran().map(|k| k.temps).try_fold(0u64, |m, t| t.map(|t| m.max(t)))?;
        Some(scratch::held(ran().map(|k| k.slots.as_slice())).saturating_add(temps))
    };
    let own = kernels
        .iter()
        .map(|k| Some(scratch::held([k.slots.as_slice()]).saturating_add(k.temps?)))
        .collect::<Option<Vec<u64>>>()?;
    Some(kiln_runtime::artifact::ScratchDesc {
        caller: thread(&|_| true)?,
        worker: thread(&|f| f.workgroups > 1)?,
        kernels: own,
    })
}

impl CpuBackend {
    /// The target CPU as the microkernels see it, VNNI and AMX left out where the options say so.
    fn host(&self) -> ukernel::Host {
        let mut host = ukernel::Host::detect(&self.cpu.features);
        host.vnni &= self.vnni;
        host.amx &= self.amx;
        host.amx_bf16 &= self.amx;
        host.threads = self.threads;
        host
    }

    /// Each kernel's microkernel plan (None: linalg and a schedule), with the layouts between
    /// them applied, and the layout decision as printed.
    fn plan(
        &self,
        graph: &Graph,
        kernels: &[Kernel],
        host: &ukernel::Host,
    ) -> Result<(Vec<Option<ukernel::Ukernel>>, String)> {
        let mut plans = Vec::with_capacity(kernels.len());
        for k in kernels {
            let choice = self.microkernel.or_else(|| {
                if self.overrides.is_empty() {
                    None
                } else {
                    self.overrides.get(&crate::tune::kernel_signature(graph, k)).copied()
                }
            });
            // A recurrent layer or attention kept whole (cpu/passes/mod.rs asked
            // `ukernel::runs_whole`) has no linalg lowering: it takes its kernel whatever the choice.
            let whole = k.nodes.first().is_some_and(|&n| {
                matches!(
                    graph.node(n).op,
                    kiln_ir::Op::Rnn(_)
                        | kiln_ir::Op::Attention(_)
                        | kiln_ir::Op::QConv(_)
                        | kiln_ir::Op::DynQMatMul
                        | kiln_ir::Op::MatMulNBits { .. }
                )
            });
            plans.push(if whole {
                Some(ukernel::plan(graph, k, host, true, self.precision).ok_or_else(|| {
                    CompileError::in_kernel(k, "plan", "the node was kept whole for the CPU's kernel of its own, which cannot take it")
                })?)
            } else if choice == Some(false) {
                None
            } else {
                ukernel::plan(graph, k, host, choice == Some(true), self.precision)
            });
        }
        let blocked = layout::decide(graph, kernels, &plans);
        layout::apply(kernels, &mut plans, &blocked);
        Ok((plans, layout::describe(graph, &blocked)))
    }
}

/// A kernel's module as codegen builds it (a microkernel call, or linalg ops), verified.
/// `function` is its function's index in the artifact (the CPU has one a kernel).
fn build<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    micro: Option<&ukernel::Ukernel>,
    function: u32,
) -> Result<Module<'c>> {
    let built = match micro {
        Some(u) => ukernel::build(&mlir.ctx, graph, k, u),
        None => codegen::build_kernel(&mlir.ctx, graph, k, function),
    };
    super::verified(mlir, k, built)
}

/// Kernel `i`'s function index as the status word records it.
fn function_index(i: usize) -> Result<u32> {
    // A graph of 2^32 kernels does not fit in memory to get here.
    u32::try_from(i).map_err(|_| CompileError::Internal(format!("{i} kernels are too many")))
}

/// The lowering of a kernel's bufferised module to the LLVM dialect, allocations checked;
/// returns the bound of what its temporaries hold at once (`alloc::temporaries`).
fn lower<'c>(mlir: &'c MlirContext, module: &mut Module<'c>, k: &Kernel) -> Result<Option<u64>> {
    mlir.run_pipeline(module, LOWER_TO_CF).map_err(|e| CompileError::in_kernel(k, "lower", e))?;
    let temps = alloc::temporaries(module);
    alloc::check_allocations(&mlir.ctx, module)
        .map_err(|e| CompileError::in_kernel(k, "lower", e))?;
    mlir.run_pipeline(module, LOWER_TO_LLVM).map_err(|e| CompileError::in_kernel(k, "lower", e))?;
    Ok(temps)
}

/// The target machine for `cpu` (its LLVM CPU name and pinned features), a line describing
/// it, and the wide features the code may use.
fn target_machine(cpu: &machine::CpuSpec) -> Result<(TargetMachine, String, Vec<String>)> {
    // The host's target, and a --target-cpu the backend checked when it was made
    // (`machine::CpuSpec`): LLVM refusing them is a kiln bug.
    Target::initialize_native(&InitializationConfig::default())
        .map_err(|e| CompileError::Internal(format!("LLVM native target: {e}")))?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple)
        .map_err(|e| CompileError::Internal(format!("LLVM target for {triple}: {e}")))?;
    let tm = target
        .create_target_machine(
            &triple,
            &cpu.llvm_cpu,
            &cpu.features,
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            CompileError::Internal(format!(
                "LLVM cannot make a target machine for {triple} {}",
                cpu.llvm_cpu
            ))
        })?;
    let detail =
        format!("{} {} ({})", triple.as_str().to_string_lossy(), cpu.llvm_cpu, cpu.widest());
    Ok((tm, detail, cpu.wide()))
}

/// Builds, distributes and lowers one kernel; returns the lowered module, its workgroup count,
/// the text of its MLIR before the pipeline, its schedule as printed and the bound of its
/// temporaries.
fn lower_linalg<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    function: u32,
    max_workgroups: usize,
) -> Result<(Module<'c>, u64, String, String, Option<u64>)> {
    let mut module = build(mlir, graph, k, None, function)?;
    let text = module.as_operation().to_string();
    let debug = std::env::var_os("KILN_DEBUG_SCHEDULE").is_some();
    let mut described: Option<String> = None;
    // The full schedule (workgroups, register tiles, vectors), else the vectors in one workgroup,
    // else the workgroup split alone, else one scalar workgroup. Not every kernel tiles (an op
    // without a tiling rule, a reshape between ops), and bufferisation may split a workgroup
    // loop apart; a failed attempt may leave the module half done, so it is rebuilt.
    let mut scheduled = None;
    let split = Some(max_workgroups);
    for (vectorize, distribute) in [(true, split), (true, None), (false, split)] {
        let Some(func) = kernel_func(&module) else { break };
        let kernel_ops = linalg::read_kernel(RawOp(func.to_raw()));
        let dims = if k.outputs.len() == 1 {
            graph.value_type(k.outputs[0]).shape.as_fixed()
        } else {
            None
        };
        let decided = dims.and_then(|d| {
            schedule::decide(&kernel_ops.ops, &d, kernel_ops.sequential, vectorize, distribute)
        });
        if described.is_none() {
            described = Some(schedule::describe(&k.name, &kernel_ops.ops, decided.as_ref()));
        }
        let Some(sch) = decided else { continue };
        if debug {
            eprint!("{}", schedule::describe(&k.name, &kernel_ops.ops, Some(&sch)));
        }
        let attempt = script::apply(mlir, &mut module, &kernel_ops.ops, &kernel_ops.raw, &sch)
            .and_then(|()| {
                // A developer's view of a kernel after its schedule (KILN_DEBUG_SCHEDULE=kernel).
                if std::env::var("KILN_DEBUG_SCHEDULE").is_ok_and(|v| v == k.name) {
                    eprintln!(
                        "// kernel {} scheduled ({} workgroups)\n{}",
                        k.name,
                        sch.workgroups(),
                        module.as_operation()
                    );
                }
                super::erase_dead_checks(&module);
                if let Some(f) = kernel_func(&module) {
                    math::expand(&mlir.ctx, f.to_raw());
                }
                mlir.run_pipeline(&mut module, BUFFERIZE)?;
                if sch.workgroups() > 1 {
                    bind_workgroup_loop(&module)?;
                }
                Ok(())
            });
        match attempt {
            Ok(()) => {
                scheduled = Some(sch.workgroups());
                break;
            }
            Err(e) => {
                if debug {
                    eprintln!("// kernel {}: schedule (vectorize={vectorize}, distribute={distribute:?}) failed: {e}", k.name);
                }
                // What runs instead is said in the printed schedule too.
                if let Some(d) = described.as_mut() {
                    let what = match (vectorize, distribute.is_some()) {
                        (true, true) => "this schedule",
                        (false, true) => "the workgroup split alone",
                        _ => "the vectors in one workgroup",
                    };
                    d.push_str(&format!("  ({what} failed to apply; fell back)\n"));
                }
                module = build(mlir, graph, k, None, function)?;
            }
        }
    }
    let workgroups = match scheduled {
        Some(w) => w,
        None => {
            if let Some(f) = kernel_func(&module) {
                math::expand(&mlir.ctx, f.to_raw());
            }
            mlir.run_pipeline(&mut module, BUFFERIZE)
                .map_err(|e| CompileError::in_kernel(k, "bufferize", e))?;
            1
        }
    };
    let temps = lower(mlir, &mut module, k)?;
    // A developer's view of each kernel after the pipeline (KILN_DEBUG_MLIR=1).
    if std::env::var_os("KILN_DEBUG_MLIR").is_some() {
        eprintln!("// kernel {} ({} workgroups)\n{}", k.name, workgroups, module.as_operation());
    }
    let described = described.unwrap_or_else(|| format!("kernel {}\n  no function\n", k.name));
    Ok((module, workgroups, text, described, temps))
}

/// The kernel's function (bufferisation may put globals before it).
fn kernel_func<'c, 'a>(module: &'a Module<'c>) -> Option<OperationRef<'c, 'a>> {
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
fn body_ops<'c, 'a>(module: &'a Module<'c>) -> Vec<OperationRef<'c, 'a>> {
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

/// A microkernel kernel's module, lowered; its MLIR text before lowering, its schedule and the
/// bound of its MLIR temporaries (none: it calls C).
fn lower_ukernel<'c>(
    mlir: &'c MlirContext,
    graph: &Graph,
    k: &Kernel,
    u: &ukernel::Ukernel,
) -> Result<(Module<'c>, String, String, Option<u64>)> {
    // (A microkernel's function index is unused: its C code reports through `support.c`.)
    let mut module = build(mlir, graph, k, Some(u), 0)?;
    let text = module.as_operation().to_string();
    let mut described = format!("kernel {}\n", k.name);
    for line in u.to_string().lines() {
        described.push_str(&format!("  {line}\n"));
    }
    let temps = lower(mlir, &mut module, k)?;
    Ok((module, text, described, temps))
}

/// After bufferisation, the workgroup `scf.forall` is an `scf.for` over 0..G at the top of the
/// function: its bounds become the function's `wg_begin`/`wg_end` arguments.
fn bind_workgroup_loop(module: &Module) -> Result<(), String> {
    let loops: Vec<_> = body_ops(module)
        .into_iter()
        .filter(|o| o.name().as_string_ref().as_str() == Ok("scf.for"))
        .collect();
    let [l] = loops.as_slice() else {
        return Err(format!(
            "expected one workgroup loop after bufferisation, found {}",
            loops.len()
        ));
    };
    let func = kernel_func(module).ok_or("no function")?;
    let block = func.region(0).map_err(|e| e.to_string())?.first_block().ok_or("no body")?;
    let n = block.argument_count();
    let (begin, end) = (
        block.argument(n - 2).map_err(|e| e.to_string())?,
        block.argument(n - 1).map_err(|e| e.to_string())?,
    );
    // SAFETY: scf.for's operands 0 and 1 are its lower and upper bounds, both `index`, as are
    // the function arguments put there.
    unsafe {
        mlir_sys::mlirOperationSetOperand(l.to_raw(), 0, melior::ir::ValueLike::to_raw(&begin));
        mlir_sys::mlirOperationSetOperand(l.to_raw(), 1, melior::ir::ValueLike::to_raw(&end));
    }
    Ok(())
}

/// Adds `k(void **args, i64, i64)` for each kernel: it hands `support.c` the status word (the
/// slot after the buffers) and its function's index, calls `k_body` with a descriptor per
/// buffer, and one of the word where the body checks indices (`body_status`), then lets
/// `support.c` free what a body that stopped early still holds.
fn add_wrappers<'l>(
    llvm: &'l LlvmContext,
    module: &LlvmModule<'l>,
    kernels: &[Kernel],
    graph: &Graph,
    body_status: &[bool],
) -> Result<()> {
    let ptr = llvm.ptr_type(inkwell::AddressSpace::default());
    let i64t = llvm.i64_type();
    let fn_type = llvm.void_type().fn_type(&[ptr.into(), i64t.into(), i64t.into()], false);
    let enter = module.add_function(
        "kiln_status_enter",
        llvm.void_type().fn_type(&[ptr.into(), i64t.into()], false),
        Some(inkwell::module::Linkage::External),
    );
    let leave = module.add_function(
        "kiln_status_leave",
        llvm.void_type().fn_type(&[], false),
        Some(inkwell::module::Linkage::External),
    );
    let builder = llvm.create_builder();
    for (index, k) in kernels.iter().enumerate() {
        // The wrapper calls the body codegen made for the same kernel: a mismatch is a bug.
        let internal = |e: inkwell::builder::BuilderError| {
            CompileError::Internal(format!("building the wrapper of {}: {e}", k.name))
        };
        let body = module.get_function(&format!("{}_body", k.name)).ok_or_else(|| {
            CompileError::Internal(format!("kernel {} has no body function", k.name))
        })?;
        let f = module.add_function(&k.name, fn_type, None);
        let entry = llvm.append_basic_block(f, "entry");
        builder.position_at_end(entry);
        let args = f.get_nth_param(0).expect("declared").into_pointer_value();
        let load = |i: usize| {
            // SAFETY: args points to an array with one pointer per kernel buffer, then the
            // status word's.
            let slot = unsafe {
                builder.build_in_bounds_gep(ptr, args, &[i64t.const_int(i as u64, false)], "slot")
            }
            .map_err(internal)?;
            builder.build_load(ptr, slot, "buffer").map_err(internal)
        };
        let buffers: Vec<ValueId> = k.inputs.iter().chain(&k.outputs).copied().collect();
        let status = load(buffers.len())?;
        builder
            .build_call(enter, &[status.into(), i64t.const_int(index as u64, false).into()], "")
            .map_err(internal)?;
        let mut call_args: Vec<inkwell::values::BasicMetadataValueEnum> = Vec::new();
        let mut descriptor =
            |p: inkwell::values::BasicValueEnum<'l>, dims: &[usize]| {
                let mut strides = vec![1u64; dims.len()];
                // Saturating: a tensor with an axis of 0 may have other axes whose product
                // overflows (it holds nothing, so no stride is ever used).
                for d in (0..dims.len().saturating_sub(1)).rev() {
                    strides[d] = strides[d + 1].saturating_mul(dims[d + 1] as u64);
                }
                // {allocated, aligned, offset, sizes..., strides...}
                call_args.push(p.into());
                call_args.push(p.into());
                call_args.push(i64t.const_zero().into());
                call_args.extend(dims.iter().map(|&d| {
                    inkwell::values::BasicMetadataValueEnum::from(i64t.const_int(d as u64, false))
                }));
                call_args.extend(strides.iter().map(|&s| {
                    inkwell::values::BasicMetadataValueEnum::from(i64t.const_int(s, false))
                }));
            };
        for (i, &v) in buffers.iter().enumerate() {
            let p = load(i)?;
            let dims = graph.value_type(v).shape.as_fixed().expect("static after specialisation");
            descriptor(p, &dims);
        }
        if body_status.get(index).copied().unwrap_or(false) {
            // memref<4xi32>: the word's 16 bytes.
            descriptor(status, &[4]);
        }
        call_args.push(f.get_nth_param(1).expect("declared").into());
        call_args.push(f.get_nth_param(2).expect("declared").into());
        if call_args.len() != body.count_params() as usize {
            return Err(CompileError::Internal(format!(
                "kernel {} takes {} arguments, the wrapper has {}",
                k.name,
                body.count_params(),
                call_args.len()
            )));
        }
        builder.build_call(body, &call_args, "").map_err(internal)?;
        builder.build_call(leave, &[], "").map_err(internal)?;
        builder.build_return(None).map_err(internal)?;
    }
    Ok(())
}

/// C support code every kernel library carries (`memrefCopy`), so artifacts need no MLIR runtime.
const SUPPORT_C: &str = include_str!("support.c");

/// Links an object file into a shared object with the system C compiler (libm for the math
/// that has no LLVM intrinsic); with `ukernel`, the microkernel compiled for the host goes in.
fn link_shared(object: &[u8], ukernel: Option<ukernel::Level>) -> Result<Vec<u8>> {
    // A fresh directory only this user may enter, under a name no one can predict: the library
    // read back from it goes into the artifact and the cache, and runs.
    let dir = PrivateDir::new("kiln-link")
        .map_err(|e| CompileError::Link(format!("a private folder to link in: {e}")))?;
    let (obj, so, support) = (dir.join("kernels.o"), dir.join("kernels.so"), dir.join("support.c"));
    let result = (|| {
        write_new(&obj, object)?;
        write_new(&support, SUPPORT_C.as_bytes())?;
        let mut cmd = std::process::Command::new("cc");
        cmd.args(["-shared", "-fPIC", "-O2", "-o"]).arg(&so).arg(&obj).arg(&support);
        if let Some(host) = ukernel {
            cmd.args(ukernel_objects(dir.path(), host)?);
        }
        let out = cmd.arg("-lm").output().map_err(|e| {
            format!(
                "cannot run the system linker `cc` (install a C toolchain: scripts/setup.sh): {e}"
            )
        })?;
        if !out.status.success() {
            return Err(format!(
                "linking the kernels failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::read(&so).map_err(|e| format!("{}: {e}", so.display()))
    })();
    drop(dir);
    result.map_err(CompileError::Link)
}

/// Writes a file of the link directory (created new, 0600).
fn write_new(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    files::write_new(path, bytes, 0o600).map_err(|e| format!("{}: {e}", path.display()))
}

/// The C kernels' objects (the microkernel's files: the packed GEMM, convolutions, pooling, the
/// gather, recurrent layers, rows, the transpose, attention, integer convolutions) for the host's
/// level, built with kiln (build.rs, which names them `<file>-<level>.o`).
fn ukernel_objects(dir: &std::path::Path, host: ukernel::Level) -> Result<Vec<PathBuf>, String> {
    macro_rules! level {
        ($l:literal) => {
            level!($l: "gemm", "conv", "depthwise", "pool", "gather", "recurrent", "reduction",
                "movement", "attention", "quantized")
        };
        ($l:literal: $($name:literal),*) => {
            [$((
                concat!($name, ".o"),
                include_bytes!(concat!(env!("OUT_DIR"), "/", $name, "-", $l, ".o")).as_slice(),
            )),*]
        };
    }
    let objects = match host {
        ukernel::Level::V4 => level!("v4"),
        ukernel::Level::V3 => level!("v3"),
        ukernel::Level::V1 => level!("v1"),
    };
    let mut paths = Vec::new();
    for (name, bytes) in objects {
        let path = dir.join(name);
        write_new(&path, bytes)?;
        paths.push(path);
    }
    Ok(paths)
}
