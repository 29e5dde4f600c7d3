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
    /// Tests run at a time: worker processes (threads with --in-process). Default: every core.
    #[arg(long, short = 'j', value_name = "N")]
    jobs: Option<usize>,
    /// (Old spelling of --jobs: elsewhere --threads means compute threads.)
    #[arg(long, hide = true, value_name = "N", conflicts_with = "jobs")]
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
    /// Stop a Loop after N steps, failing its test with an error naming the Loop (on the
    /// interpreter and compiled). Default: no limit, as ONNX has none.
    #[arg(long, value_name = "N")]
    max_loop_steps: Option<u64>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Run compiled tests in this process. By default they run in worker processes, so that a
    /// kernel that crashes (or corrupts a device runtime's memory) fails its own test instead of
    /// ending the run.
    #[arg(long)]
    in_process: bool,
    /// (Internal) be a worker: read test folders from stdin, write one JSON result per line.
    #[arg(long, hide = true)]
    worker: bool,
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
    if args.worker {
        return worker(args);
    }
    let tests = testcase::find_tests(&args.dirs)?;
    let expected: Option<Vec<String>> = match &args.expect {
        None => None,
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| CompileError::File {
                    path: p.display().to_string(),
                    msg: e.to_string(),
                })?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect(),
        ),
    };
    if args.threads.is_some() {
        eprintln!("warning: kiln check's --threads is now --jobs (tests run at a time; elsewhere --threads means compute threads)");
    }
    let jobs = args
        .jobs
        .or(args.threads)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let tol = Tolerance { rtol: args.rtol, atol: args.atol };
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(tests.len() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tests {msg}").expect("a valid template"),
    );
    let device = args.device;
    // A GPU device must be usable before a thousand tests say it is not.
    let base = match device {
        CheckDevice::Ref | CheckDevice::Cpu => crate::Options::default(),
        CheckDevice::Cuda => {
            require_device(kiln_runtime::Target::Cuda)?;
            crate::Options::for_target(crate::TargetKind::Cuda)
        }
        CheckDevice::Opencl => {
            require_device(kiln_runtime::Target::Opencl)?;
            crate::Options::for_target(crate::TargetKind::Opencl)
        }
    };
    // Each test compiles single-threaded; the tests themselves run in parallel.
    let limit = args.max_loop_steps;
    let engine = move |g: &kiln_ir::Graph,
                       x: &[kiln_ir::Value]|
          -> Result<Vec<kiln_ir::Value>, EngineError> {
        match device {
            CheckDevice::Ref => Ok(kiln_ir::eval::run_values_with(
                g,
                x,
                &kiln_ir::eval::EvalOptions { max_loop_steps: limit },
            )?),
            _ => compiled(g, x, &base, limit),
        }
    };
    let done = |r: &CaseResult| {
        bar.inc(1);
        if let Outcome::Fail(_) = r.outcome {
            bar.set_message(format!("(last failure: {})", r.name));
        }
    };
    let results = if device == CheckDevice::Ref || args.in_process {
        testcase::run_all(&tests, &engine, tol, jobs, &done)
    } else {
        run_isolated(&tests, args, jobs, &done)
    };
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
        std::fs::write(path, text).map_err(|e| CompileError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
    }
    let passing: Vec<&str> =
        results.iter().filter(|r| r.outcome == Outcome::Pass).map(|r| r.name.as_str()).collect();
    if let Some(path) = &args.write_passing {
        let mut text = passing.join("\n");
        text.push('\n');
        std::fs::write(path, text).map_err(|e| CompileError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
    }
    let mut code = if failed > 0 { 1 } else { 0 };
    if let Some(expected) = &expected {
        let by_name: BTreeMap<&str, &CaseResult> =
            results.iter().map(|r| (r.name.as_str(), r)).collect();
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
            println!(
                "{new} passing tests are not in {} yet (refresh it with `make ratchet`)",
                args.expect.as_ref().expect("set").display()
            );
        }
        println!("ratchet: {} listed, {regressions} regressed", expected.len());
        code = if regressions > 0 { 1 } else { 0 };
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    Ok(code)
}

/// Runs each test in a worker process (`kiln check --worker`), `jobs` workers at a time; a
/// worker that dies fails the test it was running and is replaced.
fn run_isolated(
    tests: &[PathBuf],
    args: &Args,
    jobs: usize,
    done: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    struct Worker {
        child: Child,
        input: ChildStdin,
        output: BufReader<ChildStdout>,
    }
    let spawn = || -> std::io::Result<Worker> {
        let exe = std::env::current_exe()?;
        let limit = args.max_loop_steps.map(|n| n.to_string());
        let mut child = Command::new(exe)
            .args([
                "check",
                "--worker",
                "--device",
                args.device.name(),
                "--rtol",
                &args.rtol.to_string(),
                "--atol",
                &args.atol.to_string(),
            ])
            .args(limit.iter().flat_map(|n| ["--max-loop-steps", n.as_str()]))
            .arg(".")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Worker { child, input, output })
    };
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<CaseResult>>> =
        Mutex::new((0..tests.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                let mut worker: Option<Worker> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(dir) = tests.get(i) else { break };
                    let start = std::time::Instant::now();
                    let outcome = (|| {
                        if worker.is_none() {
                            worker = Some(
                                spawn()
                                    .map_err(|e| format!("cannot start a worker process: {e}"))?,
                            );
                        }
                        let w = worker.as_mut().expect("started");
                        let mut line = String::new();
                        let sent =
                            writeln!(w.input, "{}", dir.display()).and_then(|()| w.input.flush());
                        let got = sent.and_then(|()| w.output.read_line(&mut line));
                        if !matches!(got, Ok(n) if n > 0) {
                            let status = w
                                .child
                                .wait()
                                .map(|s| s.to_string())
                                .unwrap_or_else(|e| e.to_string());
                            worker = None;
                            return Err(format!(
                                "crashed: the worker process running it died ({status})"
                            ));
                        }
                        let v: serde_json::Value = serde_json::from_str(&line)
                            .map_err(|e| format!("a worker's answer does not parse: {e}"))?;
                        let reason = v["reason"].as_str().unwrap_or_default().to_string();
                        Ok(match v["status"].as_str() {
                            Some("pass") => Outcome::Pass,
                            Some("skip") => Outcome::Skip(reason),
                            _ => Outcome::Fail(reason),
                        })
                    })()
                    .unwrap_or_else(Outcome::Fail);
                    let r = CaseResult {
                        name: testcase::test_name(dir),
                        outcome,
                        time: start.elapsed(),
                    };
                    done(&r);
                    results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                }
                if let Some(mut w) = worker {
                    drop(w.input);
                    let _ = w.child.wait();
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every test ran"))
        .collect()
}

/// Worker mode: each line of stdin is a test folder; each answer one JSON line on stdout.
fn worker(args: &Args) -> Result<i32> {
    use std::io::{BufRead, Write};
    let base = match args.device {
        CheckDevice::Cuda => crate::Options::for_target(crate::TargetKind::Cuda),
        CheckDevice::Opencl => crate::Options::for_target(crate::TargetKind::Opencl),
        _ => crate::Options::default(),
    };
    let device = args.device;
    let limit = args.max_loop_steps;
    let engine = move |g: &kiln_ir::Graph,
                       x: &[kiln_ir::Value]|
          -> Result<Vec<kiln_ir::Value>, EngineError> {
        match device {
            CheckDevice::Ref => Ok(kiln_ir::eval::run_values_with(
                g,
                x,
                &kiln_ir::eval::EvalOptions { max_loop_steps: limit },
            )?),
            _ => compiled(g, x, &base, limit),
        }
    };
    let tol = Tolerance { rtol: args.rtol, atol: args.atol };
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line =
            line.map_err(|source| CompileError::Io { what: "reading the test list", source })?;
        let dir = PathBuf::from(line.trim());
        let start = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            testcase::run_case(&dir, &engine, tol)
        }))
        .unwrap_or_else(|_| Outcome::Fail("panicked".into()));
        let (status, reason) = match &outcome {
            Outcome::Pass => ("pass", None),
            Outcome::Fail(w) => ("fail", Some(w.as_str())),
            Outcome::Skip(w) => ("skip", Some(w.as_str())),
        };
        let name = testcase::test_name(&dir);
        let text = serde_json::to_string(&JsonCase {
            name: &name,
            status,
            reason,
            ms: start.elapsed().as_secs_f64() * 1e3,
        })
        .expect("serialises");
        let mut out = stdout.lock();
        writeln!(out, "{text}")
            .and_then(|()| out.flush())
            .map_err(|source| CompileError::Io { what: "answering", source })?;
    }
    Ok(0)
}

/// Fails unless a device of `target` is usable here.
fn require_device(target: kiln_runtime::Target) -> Result<()> {
    let all = kiln_runtime::list_devices();
    if all.iter().any(|d| d.target == target && d.usable) {
        return Ok(());
    }
    let notes: Vec<String> =
        all.iter().filter(|d| d.target == target).filter_map(|d| d.note.clone()).collect();
    Err(CompileError::Runtime(kiln_runtime::RuntimeError::Device {
        device: target.name().into(),
        msg: format!(
            "no usable {} device here{}",
            target.name(),
            if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }
        ),
    }))
}

/// A compile failure as the conformance engine reports it: what kiln cannot compile yet is
/// unsupported, anything else a failure, with its causes.
fn engine_error(e: CompileError) -> EngineError {
    match e {
        CompileError::Unsupported { .. }
        | CompileError::DynamicShapes(_)
        | CompileError::RuntimeSequence { .. }
        | CompileError::StorageType { .. } => EngineError::Unsupported(e.chain()),
        CompileError::Ir(e) => e.into(),
        other => EngineError::Failed(other.chain()),
    }
}

/// Compiles for the device of `base`, specialised to the inputs' shapes, and runs once. Sequence
/// and optional inputs and outputs are bound and regrouped by `sequences::Interface`.
fn compiled(
    g: &kiln_ir::Graph,
    x: &[kiln_ir::Value],
    base: &crate::Options,
    max_loop_steps: Option<u64>,
) -> Result<Vec<kiln_ir::Value>, EngineError> {
    let (flat, tensors) = crate::values::bind(g, x).map_err(engine_error)?;
    let (names, out) = compiled_tensors(&flat, &tensors, base, max_loop_steps)?;
    crate::values::regroup(g, &names, out).map_err(|e| EngineError::Failed(e.to_string()))
}

/// The compiled program's output names and tensors.
fn compiled_tensors(
    g: &kiln_ir::Graph,
    x: &[kiln_ir::Tensor],
    base: &crate::Options,
    max_loop_steps: Option<u64>,
) -> Result<(Vec<String>, Vec<kiln_ir::Tensor>), EngineError> {
    let names: Vec<String> = g.inputs().iter().map(|&id| g.node(id).name.clone()).collect();
    let shapes = names.iter().zip(x).map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
    let values = names.iter().zip(x).map(|(n, t)| (n.clone(), t.clone())).collect();
    let options = crate::Options { input_shapes: shapes, input_values: values, ..base.clone() };
    let exe = crate::jit(
        g,
        &options,
        &kiln_runtime::LoadOptions { threads: Some(1), max_loop_steps, ..Default::default() },
    )
    .map_err(engine_error)?;
    // Inputs bound at compile time are no longer taken.
    let remaining: Vec<kiln_ir::Tensor> = exe
        .inputs()
        .iter()
        .map(|d| {
            x[names
                .iter()
                .position(|n| *n == d.name)
                .expect("the executable's inputs are the graph's")]
            .clone()
        })
        .collect();
    let names = exe.outputs().iter().map(|d| d.name.clone()).collect();
    Ok((names, exe.run(&remaining).map_err(|e| EngineError::Failed(e.to_string()))?))
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
