//! A backend the compiler does not list: the CPU pipeline under another name, defined here and
//! nowhere in the compiler. It compiles through `compile_on`, the driver's entry that takes any
//! `Backend`, and passes the CPU's conformance list: what a target decides reaches the driver
//! through the `Rules` and `Backend` traits only (issue 35), so adding a target is a folder
//! behind them and its line in `backend::rules`/`for_options`, not edits across the compiler.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_compiler::artifact::TargetCode;
use kiln_compiler::backend::{self, Backend, Rules};
use kiln_compiler::fuse::{Kernel, Views};
use kiln_compiler::{Options, Stage, Stages, TargetKind};
use kiln_ir::onnx::testcase::{self, EngineError, Outcome, Tolerance};

/// The mirror's rules: the CPU's decisions, under its own name and finish phase.
struct MirrorRules;

fn cpu_rules() -> &'static dyn Rules {
    backend::rules(TargetKind::Cpu)
}

impl Rules for MirrorRules {
    fn name(&self) -> &'static str {
        "mirror"
    }
    fn graph_passes(&self) -> Vec<kiln_compiler::passes::Pass> {
        cpu_rules().graph_passes()
    }
    fn decompose(&self) -> fn(&mut kiln_ir::Graph) -> kiln_compiler::Result<bool> {
        cpu_rules().decompose()
    }
    fn views(&self) -> Views {
        cpu_rules().views()
    }
    fn stages(&self) -> &'static [Stage] {
        cpu_rules().stages()
    }
    fn finish_phase(&self) -> &'static str {
        "mirror link"
    }
}

/// The mirror backend: the CPU's kernels, counting the compiles that reach it.
struct Mirror {
    cpu: Box<dyn Backend>,
    compiles: AtomicUsize,
}

impl Mirror {
    fn new() -> Mirror {
        let cpu = backend::for_options(&Options::default()).expect("the host CPU's backend");
        Mirror { cpu, compiles: AtomicUsize::new(0) }
    }
}

impl Backend for Mirror {
    fn rules(&self) -> &'static dyn Rules {
        &MirrorRules
    }
    fn kernel_mlir(
        &self,
        graph: &kiln_ir::Graph,
        kernels: &[Kernel],
    ) -> kiln_compiler::Result<String> {
        self.cpu.kernel_mlir(graph, kernels)
    }
    fn compile(
        &self,
        graph: &kiln_ir::Graph,
        kernels: &[Kernel],
        texts: Option<&mut Stages>,
        progress: &dyn Fn(usize),
    ) -> kiln_compiler::Result<TargetCode> {
        self.compiles.fetch_add(1, Ordering::Relaxed);
        self.cpu.compile(graph, kernels, texts, progress)
    }
}

// Compile and the cache: the mirror's compile is its own (the cache keys it by the backend's
// name), and the driver asks the mirror's rules, not the options' target's.
#[test]
fn the_driver_compiles_on_a_backend_it_does_not_list() {
    let graph = kiln_ir::models::mlp(4, 8, 16, 3, 7).unwrap();
    let mirror = Mirror::new();
    let options = Options { cache: false, ..Options::default() };
    let c = kiln_compiler::compile_on(&graph, &options, &mirror, true, &|_| {}).unwrap();
    assert_eq!(mirror.compiles.load(Ordering::Relaxed), 1);
    let phases: Vec<&str> = c.timings.iter().map(|(n, _)| *n).collect();
    assert!(phases.contains(&"mirror link"), "the mirror's finish phase times it: {phases:?}");
    assert!(!c.stages.get(Stage::Llvm).is_empty(), "the mirror's stages are kept");
    let cpu_key = kiln_compiler::cache::key(&graph, &options);
    assert_ne!(kiln_compiler::cache::key_on(&graph, &options, "mirror"), cpu_key);
    assert_eq!(kiln_compiler::cache::key_on(&graph, &options, "cpu"), cpu_key);

    // Its program computes what the interpreter does.
    let exe = kiln_runtime::Executable::load(c.artifact, &Default::default()).unwrap();
    let x = kiln_ir::Tensor::from_vec(
        &[4, 8],
        (0..32).map(|i| i as f32 * 0.1 - 1.0).collect::<Vec<f32>>(),
    )
    .unwrap();
    let got = exe.run(std::slice::from_ref(&x)).unwrap();
    let want = kiln_ir::eval::run(&graph, &[x]).unwrap();
    kiln_ir::onnx::testcase::compare(&want[0], &got[0], Tolerance::default()).unwrap();
}

/// The ONNX backend tests' folder, fetched once into kiln's cache by the script `make
/// conformance` uses.
fn onnx_tests() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(root.join("scripts/fetch-onnx-tests.sh"))
        .current_dir(&root)
        .output()
        .expect("scripts/fetch-onnx-tests.sh runs");
    assert!(
        out.status.success(),
        "fetching the ONNX backend tests failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

/// Compiles `g` on `mirror` specialised to the inputs, runs it once, as `kiln check` runs
/// compiled tests (sequence and optional values bound and regrouped by `values`).
fn run_on_mirror(
    mirror: &Mirror,
    g: &kiln_ir::Graph,
    x: &[kiln_ir::Value],
) -> Result<Vec<kiln_ir::Value>, EngineError> {
    let failed = |e: &dyn std::fmt::Display| EngineError::Failed(e.to_string());
    let (flat, tensors) = kiln_compiler::values::bind(g, x).map_err(|e| failed(&e))?;
    let names: Vec<String> = flat.inputs().iter().map(|&id| flat.node(id).name.clone()).collect();
    let options = Options {
        input_shapes: names
            .iter()
            .zip(&tensors)
            .map(|(n, t)| (n.clone(), t.dims().to_vec()))
            .collect(),
        input_values: names.iter().cloned().zip(tensors.iter().cloned()).collect(),
        cache: false,
        ..Options::default()
    };
    let c = kiln_compiler::compile_on(&flat, &options, mirror, false, &|_| {})
        .map_err(|e| failed(&e))?;
    let load = kiln_runtime::LoadOptions { threads: Some(1), ..Default::default() };
    let exe = kiln_runtime::Executable::load(c.artifact, &load).map_err(|e| failed(&e))?;
    // Inputs bound at compile time are no longer taken.
    let remaining: Vec<kiln_ir::Tensor> = exe
        .inputs()
        .iter()
        .map(|d| tensors[names.iter().position(|n| *n == d.name).expect("a graph input")].clone())
        .collect();
    let out_names: Vec<String> = exe.outputs().iter().map(|d| d.name.clone()).collect();
    let out = exe.run(&remaining).map_err(|e| failed(&e))?;
    kiln_compiler::values::regroup(g, &out_names, out).map_err(|e| failed(&e))
}

// The CPU ratchet (tests/conformance/cpu.txt) on the mirror: every test run passes. The whole
// list takes minutes, which `make conformance-mirror` spends (KILN_MIRROR_FULL=1); `make test`
// runs every fifth test, a sample of every op family the list has, and says so.
#[test]
fn a_backend_defined_outside_the_compiler_passes_the_cpu_conformance_list() {
    let dir = onnx_tests();
    let listed: std::collections::BTreeSet<String> =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/cpu.txt"))
            .expect("tests/conformance/cpu.txt")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect();
    let suites: Vec<PathBuf> = ["node", "pytorch-converted", "pytorch-operator", "simple"]
        .iter()
        .map(|s| dir.join(s))
        .collect();
    let tests: Vec<PathBuf> = testcase::find_tests(&suites)
        .unwrap()
        .into_iter()
        .filter(|t| listed.contains(&testcase::test_name(t)))
        .collect();
    assert_eq!(tests.len(), listed.len(), "every listed test is in the ONNX data");
    let full = std::env::var_os("KILN_MIRROR_FULL").is_some_and(|v| v == "1");
    let tests: Vec<PathBuf> = if full { tests } else { tests.into_iter().step_by(5).collect() };
    let mirror = Mirror::new();
    let engine = |g: &kiln_ir::Graph, x: &[kiln_ir::Value]| run_on_mirror(&mirror, g, x);
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results = testcase::run_all(&tests, &engine, Tolerance::default(), jobs, &|_| {});
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r.outcome != Outcome::Pass)
        .map(|r| format!("{}: {:?}", r.name, r.outcome))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed on the mirror:\n{}",
        failed.len(),
        tests.len(),
        failed.join("\n")
    );
    assert!(
        mirror.compiles.load(Ordering::Relaxed) >= tests.len(),
        "every test compiled on the mirror"
    );
    if full {
        eprintln!(
            "the mirror backend passed all {} tests of the CPU conformance list",
            tests.len()
        );
    } else {
        eprintln!(
            "the mirror backend passed {} of the CPU conformance list's {} tests (every fifth; \
             `make conformance-mirror` runs them all)",
            tests.len(),
            listed.len()
        );
    }
}
