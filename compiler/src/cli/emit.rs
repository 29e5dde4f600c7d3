//! `kiln emit MODEL --stage S [--format text|dot]`: prints one stage's text, or draws the fused
//! stage for Graphviz.

use std::path::PathBuf;

use super::common::{load_model, parse_max_size, parse_shapes, Model};
use super::compile::{target_parser, CudaArgs};

use crate::{CompileError, Options, Result, Stage};

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model.
    model: PathBuf,
    /// The stage to print.
    #[arg(long, value_enum)]
    stage: Stage,
    /// How to print it: text (every stage), or dot (the fused stage as a Graphviz digraph of
    /// the kernels and the buffers between them: `| dot -Tsvg > fused.svg`).
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// The target whose code to print.
    #[arg(long, value_parser = target_parser(), default_value = "cpu")]
    target: crate::TargetKind,
    #[command(flatten)]
    cuda: CudaArgs,
    /// Concrete sizes for an input with symbolic dimensions: NAME=D0,D1,... (a symbolic batch
    /// without them shows its largest program, and says so on stderr).
    #[arg(long = "input-shape")]
    input_shapes: Vec<String>,
    /// SYMBOL=N: show the one program that serves every size of a symbol up to N, as `kiln
    /// compile --max-size` makes it (the fused stage starts with the padding plan).
    #[arg(long = "max-size", value_name = "SYMBOL=N")]
    max_size: Option<String>,
    /// The arithmetic of convolutions and matrix products: f32, bf16, tf32 or f16 (as `kiln
    /// compile`).
    #[arg(long, default_value = "f32")]
    precision: crate::Precision,
    /// The CPU threads to plan for, as `kiln compile --threads` (default: every core).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    threads: Option<usize>,
}

/// How `emit` prints a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The stage's text (every stage).
    Text,
    /// A Graphviz digraph (the fused stage).
    Dot,
}

impl Format {
    /// The stages that print in this format.
    pub fn stages(self) -> &'static [Stage] {
        match self {
            Format::Text => &Stage::ALL,
            Format::Dot => &[Stage::Fused],
        }
    }

    /// Whether `stage` prints in this format; if not, a usage error naming the flag and the
    /// stages that take it.
    pub fn check(self, stage: Stage) -> Result<()> {
        if self.stages().contains(&stage) {
            return Ok(());
        }
        let takes: Vec<&str> = self.stages().iter().map(|s| s.name()).collect();
        Err(CompileError::Usage(format!(
            "--format {} draws --stage {} only; stage {stage} prints as text (leave out --format)",
            self.name(),
            takes.join(" or ")
        )))
    }

    fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Dot => "dot",
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    args.format.check(args.stage)?;
    let graph = match load_model(&args.model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => {
            return Err(CompileError::Usage("emit takes a model, not a compiled artifact".into()))
        }
    };
    let options = Options {
        target: args.target,
        input_shapes: parse_shapes(&args.input_shapes)?,
        pad: parse_max_size(args.max_size.as_deref())?,
        dump_dir: None,
        cache: false,
        ptx: args.cuda.ptx()?,
        precision: args.precision,
        threads: args.threads,
        ..Options::default()
    };
    // Which program the text is of, when the model has more than one or a padded one: on
    // stderr, so the stage's text stays what a pipe reads.
    let (options, shown) = crate::driver::emitted_program(&graph, &options);
    if let Some(note) = shown {
        eprintln!("note: {note}");
    }
    match args.format {
        Format::Text => print!("{}", crate::driver::emit(&graph, args.stage, &options)?),
        Format::Dot => print!("{}", crate::driver::fused_dot(&graph, &options)?),
    }
    Ok(())
}
