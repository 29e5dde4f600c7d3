//! The `kiln` command line (clap). Each subcommand lives in its own file.

mod bench;
mod cache;
mod check;
mod common;
mod compile;
mod demo;
mod devices;
mod emit;
mod info;
mod run;
pub mod trace;

// What the commands print, as pure functions (tests read them without capturing stdout).
pub use common::ms;
pub use info::artifact_lines;
pub use run::range_text;

pub use emit::Format;
pub use run::Deviation;

use clap::{Parser, Subcommand};

use crate::Result;

#[derive(Parser)]
#[command(name = "kiln", about = "kiln: a graph-mode ML compiler", disable_version_flag = true)]
struct Cli {
    /// Print kiln's version and the LLVM/MLIR it links.
    #[arg(short = 'V', long = "version")]
    version: bool,

    /// Import models whose default ONNX opset is newer than kiln knows (with a warning) instead
    /// of refusing them.
    #[arg(long, global = true)]
    allow_newer_opsets: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Trace the built-in CIFAR-10 CNN, print its graph, and run it.
    Demo(demo::Args),
    /// Describe an ONNX model: inputs, outputs, opsets, ops, parameters, unsupported ops.
    Info(info::Args),
    /// Compile a model into an artifact the runtime loads.
    Compile(compile::Args),
    /// Run a model (ONNX or artifact) on inputs and write its outputs.
    Run(run::Args),
    /// Print one compilation stage (passes, graph, fused, schedule, mlir, lowered, llvm, asm, ptx,
    /// spirv), or draw the fused stage for Graphviz (--format dot).
    Emit(emit::Args),
    /// Time a model's runs.
    Bench(bench::Args),
    /// Run ONNX backend-style test directories and compare the outputs.
    Check(check::Args),
    /// List the devices kiln can run on (CPU, CUDA, OpenCL) and what `--device auto` picks.
    Devices(devices::Args),
    /// Show the compile cache's folder, size and limit; prune or clear it.
    Cache(cache::Args),
}

/// The command line's definition: every subcommand and flag, with their help (tests walk it).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// Runs the CLI on the process arguments; returns the exit code.
pub fn main() -> i32 {
    quiet_on_closed_pipes();
    run_cli(Cli::parse())
}

/// Output into a pipe whose reader has gone (`kiln emit ... | head`) ends the process quietly,
/// as it does every Unix tool: Rust ignores SIGPIPE, so each write would fail with EPIPE and
/// `println!` would panic ("Broken pipe", exit 101). Only the binary does this, not the
/// in-process `main_with` the tests use.
fn quiet_on_closed_pipes() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs the CLI on `args` (the first is the program's name), as the `kiln` binary would, in
/// this process: for tests of what a command accepts. A usage error is printed and gives 2, as
/// clap's own exit would.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => run_cli(cli),
        Err(e) => {
            let _ = e.print();
            e.exit_code()
        }
    }
}

fn run_cli(cli: Cli) -> i32 {
    common::set_import_options(kiln_ir::onnx::ImportOptions {
        allow_newer_opsets: cli.allow_newer_opsets,
        ..Default::default()
    });
    let result = match cli.command {
        _ if cli.version => {
            println!("{}", crate::toolchain::version_report());
            Ok(())
        }
        Some(Command::Demo(args)) => demo::run(&args),
        Some(Command::Info(args)) => info::run(&args),
        Some(Command::Compile(args)) => compile::run(&args),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Emit(args)) => emit::run(&args),
        Some(Command::Bench(args)) => bench::run(&args),
        Some(Command::Devices(args)) => devices::run(&args),
        Some(Command::Cache(args)) => cache::run(&args),
        Some(Command::Check(args)) => match check::run(&args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
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
