//! `kiln check DIR...`: runs ONNX backend-style test directories on a device and compares the
//! outputs; with `--expect`, holds a ratchet of tests that must pass.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kiln_ir::onnx::testcase::{self, CaseResult, EngineError, Outcome, Tolerance};

use crate::{CompileError, Result};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckDevice {
    /// kiln's reference interpreter.
    Ref,
    /// Native code for this CPU.
    Cpu,
    /// PTX on an NVIDIA GPU.
    Cuda,
    /// SPIR-V on an OpenCL device (a GPU if there is one).
    Opencl,
}

impl CheckDevice {
    fn name(self) -> &'static str {
        match self {
            CheckDevice::Ref => "ref",
            CheckDevice::Cpu => "cpu",
            CheckDevice::Cuda => "cuda",
            CheckDevice::Opencl => "opencl",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Test directories (holding model.onnx and test_data_set_*), or folders of them.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Where the tests run.
    #[arg(long, value_enum, default_value = "ref")]
    device: CheckDevice,
    /// Also write every result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// A list of tests (`suite/test`, one a line) that must pass: any that does not fails the
    /// command; other failures are only reported.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// Write the names of the passing tests to this file (refreshes a ratchet list).
    #[arg(long)]
    write_passing: Option<PathBuf>,
    /// Relative tolerance for float outputs.
    #[arg(long, default_value_t = 1e-3)]
    rtol: f64,
    /// Absolute tolerance for float outputs.
    #[arg(long, default_value_t = 1e-5)]
    atol: f64,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(serde::Serialize)]
struct JsonCase<'a> {
    name: &'a str,
    status: &'static str,
    reason: Option<&'a str>,
    ms: f64,
}

#[derive(serde::Serialize)]
struct JsonReport<'a> {
    device: &'static str,
    passed: usize,
    failed: usize,
    skipped: usize,
    tests: Vec<JsonCase<'a>>,
}

pub fn run(args: &Args) -> Result<i32> {
    let tests = testcase::find_tests(&args.dirs)?;
    let expected: Option<Vec<String>> = match &args.expect {
        None => None,
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| CompileError::File { path: p.display().to_string(), msg: e.to_string() })?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect(),
        ),
    };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let tol = Tolerance { rtol: args.rtol, atol: args.atol };
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(tests.len() as u64) };
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} tests {msg}").expect("a valid template"));
    let device = args.device;
    // A GPU device must be usable before a thousand tests say it is not.
    let base = match device {
        CheckDevice::Ref | CheckDevice::Cpu => crate::Options::default(),
        CheckDevice::Cuda => {
            require_device(kiln_runtime::Target::Cuda)?;
            super::common::options_for(crate::TargetKind::Cuda)
        }
        CheckDevice::Opencl => {
            require_device(kiln_runtime::Target::Opencl)?;
            super::common::options_for(crate::TargetKind::Opencl)
        }
    };
    // Each test compiles single-threaded; the tests themselves run in parallel.
    let engine = move |g: &kiln_ir::Graph, x: &[kiln_ir::Tensor]| -> Result<Vec<kiln_ir::Tensor>, EngineError> {
        match device {
            CheckDevice::Ref => Ok(kiln_ir::eval::run(g, x)?),
            _ => compiled(g, x, &base),
        }
    };
    let results = testcase::run_all(&tests, &engine, tol, threads, &|r: &CaseResult| {
        bar.inc(1);
        if let Outcome::Fail(_) = r.outcome {
            bar.set_message(format!("(last failure: {})", r.name));
        }
    });
    bar.finish_and_clear();

    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut skip_reasons: BTreeMap<String, usize> = BTreeMap::new();
    for r in &results {
        match &r.outcome {
            Outcome::Pass => passed += 1,
            Outcome::Fail(why) => {
                failed += 1;
                println!("FAIL {}: {}", r.name, one_line(why));
            }
            Outcome::Skip(why) => {
                skipped += 1;
                *skip_reasons.entry(skip_class(why)).or_default() += 1;
            }
        }
    }
    if !skip_reasons.is_empty() {
        let mut reasons: Vec<(String, usize)> = skip_reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        println!("skipped, by reason:");
        for (why, n) in reasons {
            println!("  {n:5} {why}");
        }
    }
    if let Some(path) = &args.json {
        let report = JsonReport {
            device: args.device.name(),
            passed,
            failed,
            skipped,
            tests: results
                .iter()
                .map(|r| {
                    let (status, reason) = match &r.outcome {
                        Outcome::Pass => ("pass", None),
                        Outcome::Fail(w) => ("fail", Some(w.as_str())),
                        Outcome::Skip(w) => ("skip", Some(w.as_str())),
                    };
                    JsonCase { name: &r.name, status, reason, ms: r.time.as_secs_f64() * 1e3 }
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&report).expect("the report serialises");
        std::fs::write(path, text).map_err(|e| CompileError::File { path: path.display().to_string(), msg: e.to_string() })?;
    }
    let passing: Vec<&str> = results.iter().filter(|r| r.outcome == Outcome::Pass).map(|r| r.name.as_str()).collect();
    if let Some(path) = &args.write_passing {
        let mut text = passing.join("\n");
        text.push('\n');
        std::fs::write(path, text).map_err(|e| CompileError::File { path: path.display().to_string(), msg: e.to_string() })?;
    }
    let mut code = if failed > 0 { 1 } else { 0 };
    if let Some(expected) = &expected {
        let by_name: BTreeMap<&str, &CaseResult> = results.iter().map(|r| (r.name.as_str(), r)).collect();
        let mut regressions = 0;
        for name in expected {
            match by_name.get(name.as_str()) {
                Some(r) if r.outcome == Outcome::Pass => {}
                Some(r) => {
                    regressions += 1;
                    let why = match &r.outcome {
                        Outcome::Fail(w) | Outcome::Skip(w) => one_line(w),
                        Outcome::Pass => unreachable!(),
                    };
                    println!("REGRESSION {name}: listed as passing, now: {why}");
                }
                None => {
                    regressions += 1;
                    println!("REGRESSION {name}: listed as passing, but no such test was found");
                }
            }
        }
        let new = passing.iter().filter(|p| !expected.iter().any(|e| e == *p)).count();
        if new > 0 {
            println!("{new} passing tests are not in {} yet (refresh it with `make ratchet`)", args.expect.as_ref().expect("set").display());
        }
        println!("ratchet: {} listed, {regressions} regressed", expected.len());
        code = if regressions > 0 { 1 } else { 0 };
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    Ok(code)
}

/// Fails unless a device of `target` is usable here.
fn require_device(target: kiln_runtime::Target) -> Result<()> {
    let all = kiln_runtime::list_devices();
    if all.iter().any(|d| d.target == target && d.usable) {
        return Ok(());
    }
    let notes: Vec<String> = all.iter().filter(|d| d.target == target).filter_map(|d| d.note.clone()).collect();
    Err(CompileError::Runtime(kiln_runtime::RuntimeError::Device {
        device: target.name().into(),
        msg: format!("no usable {} device here{}", target.name(), if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }),
    }))
}

/// Compiles for the device of `base`, specialised to the inputs' shapes, and runs once.
fn compiled(g: &kiln_ir::Graph, x: &[kiln_ir::Tensor], base: &crate::Options) -> Result<Vec<kiln_ir::Tensor>, EngineError> {
    let names: Vec<String> = g.inputs().iter().map(|&id| g.node(id).name.clone()).collect();
    let shapes = names.iter().zip(x).map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
    let values = names.iter().zip(x).map(|(n, t)| (n.clone(), t.clone())).collect();
    let options = crate::Options { input_shapes: shapes, input_values: values, ..base.clone() };
    let fail = |e: CompileError| match e {
        CompileError::Unsupported { .. } | CompileError::DynamicShapes(_) => EngineError::Unsupported(e.to_string()),
        CompileError::Ir(e) => e.into(),
        other => EngineError::Failed(other.to_string()),
    };
    let exe = crate::jit(g, &options, &kiln_runtime::LoadOptions { threads: Some(1), ..Default::default() }).map_err(fail)?;
    // Inputs bound at compile time are no longer taken.
    let remaining: Vec<kiln_ir::Tensor> =
        exe.inputs().iter().map(|d| x[names.iter().position(|n| *n == d.name).expect("the executable's inputs are the graph's")].clone()).collect();
    exe.run(&remaining).map_err(|e| EngineError::Failed(e.to_string()))
}

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
}

/// Groups skip reasons: the unsupported op or feature, without node names.
fn skip_class(why: &str) -> String {
    let s = why.rsplit(".onnx: ").next().unwrap_or(why);
    match s.find("): ") {
        Some(i) if s.starts_with("node `") => {
            let op_start = s[..i].rfind('(').map_or(0, |j| j + 1);
            format!("{}: {}", &s[op_start..i], &s[i + 3..])
        }
        _ => s.to_string(),
    }
}
