//! `kiln compile MODEL -o OUT`: writes an artifact the runtime loads.

use std::path::PathBuf;

use super::common::{
    compile_with_bar, load_model, parse_max_size, parse_shapes_or_ranges, print_timings,
    write_atomically, Model,
};
use crate::backend::gpu::PtxTarget;
use crate::{CompileError, Options, Result, TargetKind};

/// `--target`'s values: the targets, each with its description in `--help`.
pub fn target_parser() -> impl clap::builder::TypedValueParser<Value = TargetKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = TargetKind::ALL.map(|t| PossibleValue::new(t.name()).help(t.description()));
    PossibleValuesParser::new(values).try_map(|s| s.parse::<TargetKind>())
}

/// The NVIDIA code options (`--target cuda`).
#[derive(clap::Args, Clone, Debug)]
pub struct CudaArgs {
    /// The GPU architecture PTX is generated for (sm_80: A100, sm_90: H100).
    #[arg(long, default_value = "sm_80")]
    pub cuda_arch: String,
    /// The PTX ISA version (7.8 is what CUDA 11.8's ptxas reads; newer GPUs and drivers take newer).
    #[arg(long, default_value = "7.8")]
    pub ptx_isa: String,
}

impl CudaArgs {
    pub fn ptx(&self) -> Result<PtxTarget> {
        let bad = || {
            CompileError::Usage(format!(
                "--ptx-isa {}: expected a version such as 7.8 or 8.0",
                self.ptx_isa
            ))
        };
        let (major, minor) = self.ptx_isa.split_once('.').ok_or_else(bad)?;
        let (major, minor): (u32, u32) =
            (major.parse().map_err(|_| bad())?, minor.parse().map_err(|_| bad())?);
        // The versions LLVM 22's NVPTX backend knows (`llc -march=nvptx64 -mattr=help`): one it
        // does not know would be ignored and PTX of another version written.
        const KNOWN: &[u32] = &[
            60, 61, 62, 63, 64, 65, 70, 71, 72, 73, 74, 75, 76, 77, 78, 80, 81, 82, 83, 84, 85, 86,
            87, 88, 90,
        ];
        if minor > 9 || !KNOWN.contains(&(major * 10 + minor)) {
            return Err(CompileError::Usage(format!(
                "--ptx-isa {}: kiln's LLVM writes PTX ISA 6.0 to 6.5, 7.0 to 7.8, 8.0 to 8.8 and 9.0",
                self.ptx_isa
            )));
        }
        let arch = self.cuda_arch.trim();
        if !arch.strip_prefix("sm_").is_some_and(|n| {
            n.len() >= 2 && n.trim_end_matches('a').chars().all(|c| c.is_ascii_digit())
        }) {
            return Err(CompileError::Usage(format!(
                "--cuda-arch {arch}: expected sm_NN (sm_80, sm_90...)"
            )));
        }
        Ok(PtxTarget { arch: arch.to_string(), isa: major * 10 + minor })
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model.
    model: PathBuf,
    /// Where to write the artifact.
    #[arg(short, long)]
    output: PathBuf,
    /// The device the artifact is for.
    #[arg(long, value_parser = target_parser(), default_value = "cpu")]
    target: TargetKind,
    #[command(flatten)]
    cuda: CudaArgs,
    /// Write every stage's text into this folder: graph.kiln.txt, fused.txt, schedule.txt,
    /// kernels.mlir, lowered.mlir, kernels.ll, kernels.s (CPU), kernels.ptx (CUDA),
    /// kernels.spvasm (OpenCL); a symbolic model's programs each in a folder of their own.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Concrete sizes for an input with symbolic dimensions: NAME=D0,D1,... The first may be a
    /// range of batch sizes (NAME=1..64,3,224,224); without sizes for a symbolic leading
    /// dimension the artifact serves any batch (programs for 8, 4, 2 and 1, combined at run time).
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
    /// SYMBOL=N: one program for every size of a symbol up to N (a KV cache's `past`, a sequence
    /// length): compiled at N, the inputs zero-padded at run time and the outputs cut back. kiln
    /// proves nothing reads the padding, or says which node does.
    #[arg(long = "max-size", value_name = "SYMBOL=N")]
    max_size: Option<String>,
    /// Do not use or fill the compile cache.
    #[arg(long)]
    no_cache: bool,
    /// Time each kernel's candidates (linalg schedule, packed microkernel) on this machine with
    /// random inputs and keep the faster; the choices are stored for later compiles on this CPU.
    #[arg(long)]
    tune: bool,
    /// The arithmetic of convolutions and matrix products: f32; bf16 (bf16 products, f32 sums;
    /// norms, softmax and the rest stay f32: CPUs with AVX512-BF16, GPUs); tf32 or f16 (GPUs:
    /// tensor cores on NVIDIA's sm_80 and later).
    #[arg(long, default_value = "f32")]
    precision: crate::Precision,
    /// The CPU the code is for (--target cpu): `native` (the default) uses every feature of the
    /// CPU compiling (AVX-512 where it has it) and the artifact loads only on CPUs that have
    /// them too; `x86-64-v3` (AVX2, FMA: most x86 CPUs since 2015), `x86-64-v4` (AVX-512),
    /// `x86-64-v2`, `x86-64` or a CPU name (`skylake`, `znver3`, `sapphirerapids`, as `cc
    /// -march=` takes it) makes an artifact for every CPU that has what it names. `kiln info`
    /// shows what an artifact needs.
    #[arg(long, default_value = "native", value_name = "CPU")]
    target_cpu: crate::backend::cpu::machine::CpuTarget,
    /// The CPU threads the code is planned for (about two work units a thread in each kernel
    /// with enough work) and, with --tune, tuned with. Default: every core of this machine.
    /// The artifact runs at any thread count.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    threads: Option<usize>,
    /// No progress bar, timings or summary.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if args.output.exists() && args.output.canonicalize().ok() == args.model.canonicalize().ok() {
        return Err(CompileError::Usage(format!(
            "-o {} would overwrite the model itself",
            args.output.display()
        )));
    }
    let graph = match load_model(&args.model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => {
            return Err(CompileError::Usage(format!(
                "{} is already a compiled artifact",
                args.model.display()
            )))
        }
    };
    if args.target != TargetKind::Cpu && args.target_cpu != Default::default() {
        return Err(CompileError::Usage(format!(
            "--target-cpu {} is for --target cpu; the target is {}",
            args.target_cpu,
            args.target.name()
        )));
    }
    let (input_shapes, batch_ranges) = parse_shapes_or_ranges(&args.input_shapes)?;
    let pad = parse_max_size(args.max_size.as_deref())?;
    let options = Options {
        target: args.target,
        input_shapes,
        batch_ranges,
        pad,
        dump_dir: args.dump_dir.clone(),
        cache: !args.no_cache,
        ptx: args.cuda.ptx()?,
        precision: args.precision,
        target_cpu: args.target_cpu.clone(),
        threads: args.threads,
        ..Options::default()
    };
    if args.tune {
        let inputs = crate::tune::random_inputs(&graph, &options.input_shapes)?;
        let report = crate::tune::tune(&graph, &options, args.threads, &inputs, true, &|what| {
            if !args.quiet {
                eprintln!("tune: {what}");
            }
        })?;
        if !args.quiet {
            eprint!("{report}");
        }
    }
    let compiled = compile_with_bar(&graph, &options, false, args.quiet)?;
    let bytes = compiled.artifact.to_bytes();
    write_atomically(&args.output, &bytes)?;
    if !args.quiet {
        print_timings(
            if compiled.from_cache { "compile (from the cache)" } else { "compile" },
            &compiled.timings,
        );
        let m = &compiled.artifact.manifest;
        match &m.batch {
            None => {
                let mut programs = m.control.as_ref().map_or(String::new(), |c| {
                    format!(" in {} programs with run-time control flow", c.programs.len())
                });
                if let Some(p) = &m.padded {
                    programs = format!("; `{}` up to {}, padded", p.symbol, p.capacity);
                }
                eprintln!(
                    "wrote {} ({} kernels{programs}, {} bytes) for {}",
                    args.output.display(),
                    m.kernel_count(),
                    bytes.len(),
                    m.target_detail
                )
            }
            Some(b) => {
                let sizes: Vec<String> = b
                    .programs
                    .iter()
                    .map(|p| format!("{} ({} kernels)", p.batch, p.manifest.kernel_count()))
                    .collect();
                let max = if b.max as usize == crate::batch::NO_LIMIT {
                    String::new()
                } else {
                    b.max.to_string()
                };
                eprintln!(
                    "wrote {} ({} bytes) for {}: batch `{}` in {}..{max}, programs for batch {}",
                    args.output.display(),
                    bytes.len(),
                    m.target_detail,
                    b.symbol,
                    b.min,
                    sizes.join(", ")
                );
            }
        }
        if let Some(d) = &args.dump_dir {
            eprintln!("stage dumps in {}", d.display());
        }
    }
    Ok(())
}
