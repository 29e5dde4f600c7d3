//! Builds the CPU microkernel's C files (`src/backend/cpu/`: the packed GEMM `gemm.c`, the
//! convolutions `conv.c` and `depthwise.c`, pooling `pool.c`, the row gather `gather.c`, the
//! recurrent-layer kernel `recurrent.c`, the reductions and softmax `reduction.c`, the transpose
//! `movement.c`, attention `attention.c` and the integer convolution `quantized.c`) with the
//! system C compiler, once per x86-64 instruction-set level, so that compiling a model needs no C
//! compiler run of its own for them: the compiler links the objects for the host's level into
//! each kernel library.
//!   v4: AVX-512 (F, BW, DQ, VL), register tile 8 x 32
//!   v3: AVX2 and FMA, 4 x 32
//!   v1: baseline x86-64 (SSE2), 4 x 32

use std::path::PathBuf;
use std::process::Command;

fn main() {
    // The C kernels, one object each per level.
    let sources = [
        ("gemm", "src/backend/cpu/gemm.c"),
        ("conv", "src/backend/cpu/conv.c"),
        ("depthwise", "src/backend/cpu/depthwise.c"),
        ("pool", "src/backend/cpu/pool.c"),
        ("gather", "src/backend/cpu/gather.c"),
        ("recurrent", "src/backend/cpu/recurrent.c"),
        ("reduction", "src/backend/cpu/reduction.c"),
        ("movement", "src/backend/cpu/movement.c"),
        ("attention", "src/backend/cpu/attention.c"),
        ("quantized", "src/backend/cpu/quantized.c"),
    ];
    for (_, src) in sources {
        println!("cargo:rerun-if-changed={src}");
    }
    println!("cargo:rerun-if-changed=src/backend/cpu/simd.h");
    println!("cargo:rerun-if-changed=src/backend/cpu/depthwise.h");
    println!("cargo:rerun-if-changed=src/backend/cpu/workspace.h");
    println!("cargo:rerun-if-changed=src/backend/cpu/tile.h");
    println!("cargo:rerun-if-changed=src/backend/cpu/amx.h");
    println!("cargo:rerun-if-changed=src/backend/cpu/ukernel.h");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for (level, march, mr) in [("v4", "x86-64-v4", 8), ("v3", "x86-64-v3", 4), ("v1", "x86-64", 4)]
    {
        for (name, src) in sources {
            let obj = out.join(format!("{name}-{level}.o"));
            let status = Command::new(&cc)
                .args([
                    "-c",
                    "-O3",
                    "-fPIC",
                    "-ffp-contract=fast",
                    "-fno-math-errno",
                    "-Wno-psabi",
                    "-mtune=generic",
                ])
                .arg(format!("-march={march}"))
                .arg(format!("-DKILN_MR={mr}"))
                .arg("-o")
                .arg(&obj)
                .arg(src)
                .status();
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => panic!("building {src} for {level} with `{cc}` failed ({s}); scripts/setup.sh installs a C toolchain"),
                Err(e) => panic!("cannot run the C compiler `{cc}` to build {src} ({e}); scripts/setup.sh installs a C toolchain"),
            }
        }
    }
}
