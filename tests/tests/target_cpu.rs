//! `--target-cpu`: artifacts for an x86-64 level or a named CPU use only the wide features it
//! has (pinned in LLVM's feature string, the C kernels of that level linked), record them, and
//! load on a CPU that has them even where the compiling CPU had more; an artifact needing more
//! than the CPU has is refused naming what is missing. The runtime's feature set is narrowed
//! with `KILN_CPU_LACKS` in a child process of this binary (the runtime reads it once).

use kiln_compiler::backend::cpu::machine::{self, CpuTarget};
use kiln_compiler::{Options, Stage};
use kiln_ir::builder::{ConvOptions, GraphBuilder};
use kiln_ir::{eval, DType, Graph, Tensor};
use kiln_runtime::{Artifact, Executable, LoadOptions};

use crate::status::run_in_child;

const AVX512: &str = "avx512f,avx512cd,avx512bw,avx512dq,avx512vl";

fn named(name: &str) -> CpuTarget {
    CpuTarget::Named(name.into())
}

/// A convolution (the packed microkernel, a C kernel) and a matrix product with a softmax (the
/// linalg path): both code paths of the CPU target.
fn model() -> Graph {
    let g = GraphBuilder::new("portable");
    let x = g.input("x", DType::F32, [2, 8, 12, 12]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, 8, 3, 3], 1));
    let y = x.conv(w, None, ConvOptions { pad: 1, ..ConvOptions::default() }).relu();
    let flat = y.reshape(&[2, 16 * 12 * 12]);
    let m = g.constant("m", Tensor::random(DType::F32, &[16 * 12 * 12, 10], 2));
    g.output("p", flat.matmul(m).softmax(-1));
    g.build().unwrap()
}

fn input() -> Tensor {
    Tensor::random(DType::F32, &[2, 8, 12, 12], 3)
}

fn compiled_for(cpu: &CpuTarget, stages: bool) -> kiln_compiler::Compiled {
    let options = Options { cache: false, target_cpu: cpu.clone(), ..Options::default() };
    kiln_compiler::compile(&model(), &options, stages).expect("compiles")
}

#[test]
fn names_parse_and_odd_text_is_refused() {
    assert_eq!("native".parse::<CpuTarget>(), Ok(CpuTarget::Native));
    assert_eq!("x86-64-v3".parse::<CpuTarget>(), Ok(named("x86-64-v3")));
    for bad in ["", "-mno-avx", "a b", "x;rm"] {
        let e = bad.parse::<CpuTarget>().expect_err(bad);
        assert!(e.contains("is not a CPU"), "{e}");
    }
}

#[test]
fn levels_pin_their_features_and_an_unknown_cpu_is_an_error_naming_the_flag() {
    let v3 = machine::resolve(&named("x86-64-v3")).unwrap();
    let wide = v3.wide();
    for f in ["avx", "avx2", "fma", "sse4.1", "sse4.2"] {
        assert!(wide.iter().any(|w| w == f), "{f} in {wide:?}");
    }
    assert!(!wide.iter().any(|w| w.starts_with("avx512")), "{wide:?}");
    assert!(v3.features.split(',').any(|f| f == "-avx512f"), "{}", v3.features);
    assert_eq!(v3.widest(), "avx2");
    let v4 = machine::resolve(&named("x86-64-v4")).unwrap();
    assert_eq!(v4.widest(), "avx512f");
    assert!(!v4.wide().iter().any(|f| f == "avx512vnni"), "{:?}", v4.wide());
    assert!(machine::resolve(&named("x86-64")).unwrap().wide().is_empty());
    let e = machine::resolve(&named("pentium-9000")).unwrap_err().to_string();
    assert!(e.contains("--target-cpu pentium-9000 is not a CPU"), "{e}");
}

#[test]
fn a_level_artifact_records_and_uses_only_its_features() {
    let c = compiled_for(&named("x86-64-v3"), true);
    let m = &c.artifact.manifest;
    assert!(m.target_detail.contains("x86-64-v3 (avx2)"), "{}", m.target_detail);
    assert!(m.cpu_features.iter().any(|f| f == "avx2"), "{:?}", m.cpu_features);
    assert!(!m.cpu_features.iter().any(|f| f.starts_with("avx512")), "{:?}", m.cpu_features);
    // No AVX-512 register in the code LLVM wrote (the C kernels linked are the v3 build's).
    let asm = c.stages.get(Stage::Asm);
    assert!(asm.contains("ymm"), "AVX2 code expected");
    assert!(!asm.contains("zmm"), "AVX-512 in an x86-64-v3 artifact");
}

#[test]
fn artifacts_load_where_the_cpu_has_their_features_and_are_refused_where_it_lacks_them() {
    if std::env::var_os("KILN_CPU_LACKS").is_none() {
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
        {
            eprintln!("SKIPPED: this CPU has no AVX2/FMA: an x86-64-v3 artifact cannot run here");
            return;
        }
        return run_in_child(
            "target_cpu::artifacts_load_where_the_cpu_has_their_features_and_are_refused_where_it_lacks_them",
            ("KILN_CPU_LACKS", AVX512),
            None,
        );
    }
    // This process's runtime believes the CPU has no AVX-512.
    let x = input();
    let want = eval::run(&model(), std::slice::from_ref(&x)).unwrap();
    let v3 = compiled_for(&named("x86-64-v3"), false).artifact;
    let back = Artifact::from_bytes(&v3.to_bytes(), "v3.kiln").unwrap();
    let exe = Executable::load(back, &LoadOptions::default()).expect("an x86-64-v3 artifact loads");
    let got = exe.run(std::slice::from_ref(&x)).unwrap();
    let (g, w) = (got[0].to_f64s(), want[0].to_f64s());
    assert_eq!(g.len(), w.len());
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "{a} vs {b}");
    }
    let v4 = compiled_for(&named("x86-64-v4"), false).artifact;
    let e = Executable::load(v4, &LoadOptions::default()).err().expect("refused").to_string();
    assert!(
        e.contains("lacks (avx512bw, avx512cd, avx512dq, avx512f, avx512vl)")
            && e.contains("--target-cpu x86-64-v3"),
        "{e}"
    );
}

#[test]
fn bf16_needs_a_target_cpu_that_multiplies_it() {
    let options = Options {
        cache: false,
        target_cpu: named("x86-64-v3"),
        precision: kiln_compiler::Precision::Bf16,
        ..Options::default()
    };
    let e = kiln_compiler::compile(&model(), &options, false).err().expect("refused").to_string();
    assert!(e.contains("the target CPU (x86-64-v3) has no AVX512-BF16"), "{e}");
}
