//! The linked toolchain is the one the build promises.

#[test]
fn links_llvm_and_mlir_22() {
    let (major, _, _) = kiln_compiler::toolchain::llvm_version();
    assert_eq!(major, 22);
    assert!(kiln_compiler::toolchain::mlir_dialect_count() > 30, "MLIR registers its dialects");
    let report = kiln_compiler::toolchain::version_report();
    assert!(report.starts_with(&format!("kiln {}", env!("CARGO_PKG_VERSION"))), "{report}");
    assert!(report.contains("LLVM 22."), "{report}");
}
