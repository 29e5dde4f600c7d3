//! The compiler, differentially: the bytes describe a graph of a few ONNX nodes over inputs of
//! 0 to 4 elements an axis (or, one input in eight, extreme sizes that are only compiled); it is
//! imported, run by the interpreter, compiled for the CPU and run, and the two must agree
//! (`kiln_tests::graph_fuzz` holds the generator and the check, which the integration tests smoke).
//! A compile error that is not a refusal of the input, a failed run or different numbers is a
//! crash. Built only with `--features compiler` (it links MLIR and LLVM); `make fuzz` runs it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::os::raw::{c_char, c_int};

fuzz_target!(|data: &[u8]| {
    if let Err(bug) = kiln_tests::graph_fuzz::check(data) {
        panic!("{bug}");
    }
});

extern "C" {
    fn LLVMFuzzerRunDriver(
        argc: *mut c_int,
        argv: *mut *mut *mut c_char,
        test: unsafe extern "C" fn(*const u8, usize) -> c_int,
    ) -> c_int;
    fn LLVMFuzzerTestOneInput(data: *const u8, size: usize) -> c_int;
}

/// libFuzzer's driver, started from a `main` of our own: MLIR's static libraries hold
/// mlir-opt's `main`, which the linker would otherwise take in place of libFuzzer's (and which
/// parses the fuzzer's flags as LLVM options).
#[no_mangle]
pub extern "C" fn main(mut argc: c_int, mut argv: *mut *mut c_char) -> c_int {
    // SAFETY: argc and argv are the process's, as the C runtime passed them.
    unsafe { LLVMFuzzerRunDriver(&mut argc, &mut argv, LLVMFuzzerTestOneInput) }
}
