//! The CPU device: kernels are functions of a shared object, `void k(void **args, i64 wg_begin,
//! i64 wg_end)`, each running workgroups `wg_begin..wg_end`; a launch splits its grid into
//! contiguous ranges across a thread pool.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::{Result, RuntimeError};

/// The C signature of every CPU kernel.
pub type KernelFn = unsafe extern "C" fn(args: *const *mut u8, wg_begin: i64, wg_end: i64);

/// A loaded shared object and its kernels.
pub struct CpuProgram {
    kernels: Vec<KernelFn>,
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    // Kept alive while the function pointers are in use.
    _library: libloading::Library,
}

/// The buffer pointers of one launch, shared by the threads that run its workgroups.
struct Args<'a>(&'a [*mut u8]);

// SAFETY: the pointers are only dereferenced by the kernel, and workgroups of one launch write
// disjoint parts of its outputs (the compiler's distribution guarantees it).
unsafe impl Sync for Args<'_> {}

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Device { device: "cpu".into(), msg: msg.into() }
}

/// Checks that this CPU has every feature the code was compiled for (running AVX-512 code on a
/// CPU without it would die of an illegal instruction).
pub fn check_host_features(features: &[String]) -> Result<()> {
    let missing: Vec<&str> = features.iter().map(String::as_str).filter(|f| host_has(f) == Some(false)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(err(format!(
            "the artifact was compiled for CPU features this machine lacks ({}); compile it on (or for) this machine",
            missing.join(", ")
        )))
    }
}

/// Whether the host has a feature; `None` for names this check does not know.
fn host_has(f: &str) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! known {
            ($($name:tt),*) => {
                match f {
                    $($name => Some(std::arch::is_x86_feature_detected!($name)),)*
                    _ => None,
                }
            };
        }
        known!(
            "avx",
            "avx2",
            "fma",
            "sse4.1",
            "sse4.2",
            "avx512f",
            "avx512cd",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512ifma",
            "avx512vbmi",
            "avx512vbmi2",
            "avx512vnni",
            "avx512bitalg",
            "avx512vpopcntdq",
            "avx512bf16",
            "avx512fp16"
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = f;
        None
    }
}

impl CpuProgram {
    /// Loads a shared object's bytes and resolves `symbols`; `threads` workers run launches.
    pub fn load(code: &[u8], symbols: &[String], threads: usize) -> Result<CpuProgram> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path: PathBuf = std::env::temp_dir().join(format!("kiln-{}-{}.so", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, code).map_err(|e| err(format!("cannot write the kernel library to {}: {e}", path.display())))?;
        // SAFETY: the library is kiln-compiled code; it has no initialisers with side effects.
        let library = unsafe { libloading::Library::new(&path) };
        // The file is not needed once mapped.
        let _ = std::fs::remove_file(&path);
        let library = library.map_err(|e| err(format!("cannot load the kernel library: {e}")))?;
        let mut kernels = Vec::with_capacity(symbols.len());
        for s in symbols {
            // SAFETY: kiln's kernels all have the `KernelFn` signature.
            let f: libloading::Symbol<KernelFn> =
                unsafe { library.get(s.as_bytes()) }.map_err(|e| err(format!("the kernel library has no `{s}`: {e}")))?;
            kernels.push(*f);
        }
        let threads = threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("kiln-cpu-{i}"))
                    .build()
                    .map_err(|e| err(format!("cannot start {threads} threads: {e}")))?,
            )
        } else {
            None
        };
        Ok(CpuProgram { kernels, pool, threads, _library: library })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs every workgroup of kernel `k` on `args`.
    ///
    /// # Safety
    /// `args` must hold valid pointers to buffers of the sizes the kernel was compiled for.
    pub unsafe fn launch(&self, k: usize, args: &[*mut u8], workgroups: u64) {
        let f = self.kernels[k];
        let w = workgroups as i64;
        match &self.pool {
            Some(pool) if workgroups > 1 => {
                let chunks = (self.threads as i64).min(w);
                let shared = Args(args);
                pool.install(|| {
                    (0..chunks).into_par_iter().for_each(|c| {
                        let (b, e) = (w * c / chunks, w * (c + 1) / chunks);
                        let a = &shared;
                        // SAFETY: as the caller promised; each chunk runs disjoint workgroups.
                        unsafe { f(a.0.as_ptr(), b, e) };
                    })
                });
            }
            // SAFETY: as the caller promised.
            _ => unsafe { f(args.as_ptr(), 0, w) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feature_the_host_lacks_refuses_the_artifact() {
        assert!(check_host_features(&["not-a-feature".into()]).is_ok(), "unknown names are not checked");
        let known = ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512fp16", "avx512vbmi2"];
        for f in known {
            let r = check_host_features(&[f.to_string()]);
            assert_eq!(r.is_ok(), host_has(f) == Some(true), "{f}");
            if let Err(e) = r {
                assert!(e.to_string().contains(f));
            }
        }
    }
}
