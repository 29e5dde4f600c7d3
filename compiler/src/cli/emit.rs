//! `kiln emit MODEL --stage S`: prints one stage's text.

use std::path::PathBuf;

use super::common::{load_model, parse_shapes, Model};
use super::compile::{CudaArgs, TargetArg};

use crate::{CompileError, Options, Result, Stage};

#[derive(clap::Args)]
pub struct Args {
    model: PathBuf,
    #[arg(long, value_enum)]
    stage: Stage,
    #[arg(long, value_enum, default_value = "cpu")]
    target: TargetArg,
    #[command(flatten)]
    cuda: CudaArgs,
    /// Concrete sizes for an input with symbolic dimensions: NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
    /// The arithmetic of convolutions and matrix products: f32, bf16, tf32 or f16 (as `kiln
    /// compile`).
    #[arg(long, default_value = "f32")]
    precision: crate::Precision,
}

pub fn run(args: &Args) -> Result<()> {
    let graph = match load_model(&args.model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => {
            return Err(CompileError::Usage("emit takes a model, not a compiled artifact".into()))
        }
    };
    let options = Options {
        target: args.target.kind(),
        input_shapes: parse_shapes(&args.input_shapes)?,
        dump_dir: None,
        cache: false,
        ptx: args.cuda.ptx()?,
        precision: args.precision,
        ..Options::default()
    };
    print!("{}", crate::driver::emit(&graph, args.stage, &options)?);
    Ok(())
}
