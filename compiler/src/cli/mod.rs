//! The `kiln` command line (clap). Each subcommand lives in its own file.

mod demo;

use clap::{Parser, Subcommand};

use crate::Result;

#[derive(Parser)]
#[command(name = "kiln", about = "kiln: a graph-mode ML compiler", disable_version_flag = true)]
struct Cli {
    /// Print kiln's version and the LLVM/MLIR it links.
    #[arg(short = 'V', long = "version")]
    version: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Trace the built-in CIFAR-10 CNN, print its graph, and run it.
    Demo(demo::Args),
}

/// Runs the CLI on the process arguments; returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        _ if cli.version => {
            println!("{}", crate::toolchain::version_report());
            Ok(())
        }
        Some(Command::Demo(args)) => demo::run(&args),
        None => {
            use clap::CommandFactory;
            let _ = Cli::command().print_help();
            Ok(())
        }
    };
    report(result)
}

/// Prints an error with its chain of causes and returns the exit code.
fn report(result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            1
        }
    }
}
