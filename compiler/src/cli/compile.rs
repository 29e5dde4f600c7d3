//! `kiln compile MODEL -o OUT`: writes an artifact the runtime loads.

use std::path::PathBuf;

use super::common::{load_model, parse_shapes, print_timings, write_atomically, Model};
use crate::{CompileError, Options, Result, TargetKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetArg {
    Cpu,
    Cuda,
    Opencl,
}

impl TargetArg {
    pub fn kind(self) -> TargetKind {
        match self {
            TargetArg::Cpu => TargetKind::Cpu,
            TargetArg::Cuda => TargetKind::Cuda,
            TargetArg::Opencl => TargetKind::Opencl,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model.
    model: PathBuf,
    /// Where to write the artifact.
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long, value_enum, default_value = "cpu")]
    target: TargetArg,
    /// Write every stage's text (graph, fused, MLIR, lowered, LLVM IR, assembly) into this folder.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Concrete sizes for an input with symbolic dimensions: NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
    /// Do not use or fill the compile cache.
    #[arg(long)]
    no_cache: bool,
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if args.output.exists() && args.output.canonicalize().ok() == args.model.canonicalize().ok() {
        return Err(CompileError::Usage(format!("-o {} would overwrite the model itself", args.output.display())));
    }
    let graph = match load_model(&args.model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => return Err(CompileError::Usage(format!("{} is already a compiled artifact", args.model.display()))),
    };
    let options = Options {
        target: args.target.kind(),
        input_shapes: parse_shapes(&args.input_shapes)?,
        dump_dir: args.dump_dir.clone(),
        cache: !args.no_cache,
        ..Options::default()
    };
    let compiled = crate::compile(&graph, &options, false)?;
    let bytes = compiled.artifact.to_bytes();
    write_atomically(&args.output, &bytes)?;
    if !args.quiet {
        print_timings(if compiled.from_cache { "compile (from the cache)" } else { "compile" }, &compiled.timings);
        let m = &compiled.artifact.manifest;
        eprintln!("wrote {} ({} kernels, {} bytes) for {}", args.output.display(), m.kernels.len(), bytes.len(), m.target_detail);
        if let Some(d) = &args.dump_dir {
            eprintln!("stage dumps in {}", d.display());
        }
    }
    Ok(())
}
