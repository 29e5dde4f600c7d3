//! Artifacts: written by the compiler, read by the runtime alone; damage, foreign files and bad
//! inputs are clear errors.

use kiln_compiler::{compile, Options};
use kiln_ir::{eval, models, DType, Tensor};
use kiln_runtime::{Artifact, Executable, LoadOptions, RuntimeError};

fn compiled_mlp() -> (kiln_ir::Graph, Artifact) {
    let g = models::mlp(2, 8, 16, 4, 11).unwrap();
    let art = compile(&g, &Options { cache: false, ..Options::default() }, false).unwrap().artifact;
    (g, art)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kiln-test-{}-{name}", std::process::id()))
}

#[test]
fn an_artifact_file_runs_through_the_runtime() {
    let (g, art) = compiled_mlp();
    let path = temp("mlp.kiln");
    art.write(&path).unwrap();
    let exe = Executable::load_file(&path, &LoadOptions { threads: Some(2), ..Default::default() })
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(exe.inputs()[0].name, "x");
    assert_eq!(exe.inputs()[0].dims, [2, 8]);
    let x = Tensor::random(DType::F32, &[2, 8], 3);
    let got = exe.run(&[x.clone()]).unwrap();
    let want = eval::run(&g, &[x]).unwrap();
    for (a, b) in got[0].to_f64s().iter().zip(want[0].to_f64s()) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn damaged_and_foreign_files_are_clear_errors() {
    let (_, art) = compiled_mlp();
    let bytes = art.to_bytes();
    let err = |b: &[u8]| Artifact::from_bytes(b, "m.kiln").unwrap_err().to_string();
    let mut flipped = bytes.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x40;
    assert_eq!(err(&flipped), "m.kiln: checksum mismatch: the file is damaged");
    assert!(err(&bytes[..bytes.len() - 10]).contains("truncated or damaged"));
    assert!(err(b"\x08\x01\x12\x04onnx").starts_with("m.kiln: not a kiln artifact"));
    let mut newer = bytes.clone();
    newer[8] = 99;
    assert!(err(&newer).contains("artifact format version 99, this runtime reads versions 2 to 7"));
    let missing =
        Executable::load_file(std::path::Path::new("/nonexistent/m.kiln"), &LoadOptions::default())
            .err()
            .unwrap();
    assert!(matches!(missing, RuntimeError::Io(_)), "{missing}");
}

#[test]
fn the_runtime_checks_inputs() {
    let (_, art) = compiled_mlp();
    let exe =
        Executable::load(art, &LoadOptions { threads: Some(1), ..Default::default() }).unwrap();
    let e = exe.run(&[]).unwrap_err().to_string();
    assert_eq!(e, "input `mlp`: expects 1 inputs (x: f32[2, 8]), 0 given");
    let e = exe.run(&[Tensor::zeros(DType::F32, &[3, 8])]).unwrap_err().to_string();
    assert_eq!(e, "input `x`: expected f32[2, 8], got f32[3,8]");
    let e = exe.run(&[Tensor::zeros(DType::F64, &[2, 8])]).unwrap_err().to_string();
    assert_eq!(e, "input `x`: expected f32[2, 8], got f64[2,8]");
}

#[test]
fn runs_reuse_the_arena_and_give_the_same_results() {
    let (_, art) = compiled_mlp();
    let exe =
        Executable::load(art, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap();
    let x = Tensor::random(DType::F32, &[2, 8], 9);
    let first = exe.run(&[x.clone()]).unwrap();
    let other = exe.run(&[Tensor::random(DType::F32, &[2, 8], 10)]).unwrap();
    assert_ne!(first, other);
    assert_eq!(exe.run(&[x]).unwrap(), first);
}
