//! `kiln emit MODEL --stage S`: prints one stage's text.

use std::path::PathBuf;

use super::common::{load_model, parse_shapes, Model};
use super::compile::{CudaArgs, TargetArg};

use crate::{CompileError, Options, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StageArg {
    /// The op graph after specialisation and after each graph pass.
    Passes,
    /// The op graph after the graph passes.
    Graph,
    /// The kernels fusion made.
    Fused,
    /// Each kernel's ops as its CPU schedule reads them, and the schedule decided (workgroups,
    /// register tile, row reductions, loop orders).
    Schedule,
    /// Each kernel's MLIR before the target pipeline.
    Mlir,
    /// The MLIR after the pipeline (LLVM dialect for the CPU).
    Lowered,
    /// LLVM IR after optimisation.
    Llvm,
    /// Host assembly.
    Asm,
    /// NVIDIA PTX.
    Ptx,
    /// SPIR-V, disassembled.
    Spirv,
}

#[derive(clap::Args)]
pub struct Args {
    model: PathBuf,
    #[arg(long, value_enum)]
    stage: StageArg,
    #[arg(long, value_enum, default_value = "cpu")]
    target: TargetArg,
    #[command(flatten)]
    cuda: CudaArgs,
    /// Concrete sizes for an input with symbolic dimensions: NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let graph = match load_model(&args.model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => return Err(CompileError::Usage("emit takes a model, not a compiled artifact".into())),
    };
    let options = Options {
        target: args.target.kind(),
        input_shapes: parse_shapes(&args.input_shapes)?,
        dump_dir: None,
        cache: false,
        ptx: args.cuda.ptx()?,
        ..Options::default()
    };
    let name = format!("{:?}", args.stage).to_lowercase();
    print!("{}", crate::driver::emit(&graph, &name, &options)?);
    Ok(())
}
