//! The README's figures that a test can check stay true: the opset range, the op count and the
//! conformance ratchets' sizes. (A ratchet refreshed without its README line fails here.)

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repository")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Entries in a ratchet list (blank lines and comments aside).
fn entries(path: &str) -> usize {
    read(path).lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count()
}

#[test]
fn readme_figures_match_the_code_and_the_ratchets() {
    let readme = read("README.md");
    let has = |text: &str| assert!(readme.contains(text), "README.md should say `{text}`");
    has(&format!("ONNX opset 1 to {}", kiln_ir::onnx::NEWEST_OPSET));
    let supported = read("docs/ops.md").lines().filter(|l| l.contains("| yes |")).count();
    has(&format!("({supported} ops, [docs/ops.md]"));
    has(&format!("hold {} tests on the interpreter", entries("tests/conformance/ref.txt")));
    has(&format!("{} compiled for the CPU", entries("tests/conformance/cpu.txt")));
    has(&format!("{} compiled to SPIR-V on OpenCL", entries("tests/conformance/opencl.txt")));
    let python = entries("python/tests/backend_cpu.txt");
    has(&format!("pytest suite and {python} of them"));
    let python_doc = read("docs/python.md");
    assert!(
        python_doc.contains(&format!("{python} of the suite's tests")),
        "docs/python.md should say {python}"
    );
}
