//! Which x86-64 CPU the code is for (`--target-cpu`): the host (`native`), an x86-64 level
//! (`x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`) or a CPU by name (`skylake`, `znver3`,
//! `sapphirerapids`...). The result is an LLVM CPU name and a feature string in which every
//! wide feature (the ones an artifact records and the runtime checks before loading it) is
//! pinned on or off, so the code uses exactly the features the artifact says it needs.
//!
//! A level's or a named CPU's features come from the system C compiler (`cc -march=NAME`, the
//! same `cc` that links the kernels): LLVM's C API says what a CPU name means to its code
//! generator but not which features that implies, and the two agree on the names and levels
//! both know.

use std::collections::BTreeSet;

use inkwell::targets::TargetMachine;

use crate::{CompileError, Result};

/// What `--target-cpu` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum CpuTarget {
    /// The CPU compiling: its name and every feature it has (AVX-512 where present). Code for
    /// it runs only on CPUs with the same wide features.
    #[default]
    Native,
    /// An x86-64 level or a CPU model, by the name `cc -march=` and LLVM take.
    Named(String),
}

impl CpuTarget {
    pub fn name(&self) -> &str {
        match self {
            CpuTarget::Native => "native",
            CpuTarget::Named(n) => n,
        }
    }
}

impl std::fmt::Display for CpuTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CpuTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<CpuTarget, String> {
        let s = s.trim();
        if s == "native" {
            return Ok(CpuTarget::Native);
        }
        // A name goes on a command line: letters, digits and dashes only.
        let plain = !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !s.starts_with('-');
        if plain {
            Ok(CpuTarget::Named(s.to_string()))
        } else {
            Err(format!(
                "`{s}` is not a CPU: give native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4 or a CPU name (skylake, znver3...)"
            ))
        }
    }
}

/// The wide features kiln pins and records, by LLVM's names (which are also the runtime
/// check's), with the C compiler's macro for each.
const WIDE: &[(&str, &str)] = &[
    ("sse4.1", "__SSE4_1__"),
    ("sse4.2", "__SSE4_2__"),
    ("sse4a", "__SSE4A__"),
    ("avx", "__AVX__"),
    ("avx2", "__AVX2__"),
    ("fma", "__FMA__"),
    ("avx512f", "__AVX512F__"),
    ("avx512cd", "__AVX512CD__"),
    ("avx512bw", "__AVX512BW__"),
    ("avx512dq", "__AVX512DQ__"),
    ("avx512vl", "__AVX512VL__"),
    ("avx512ifma", "__AVX512IFMA__"),
    ("avx512vbmi", "__AVX512VBMI__"),
    ("avx512vbmi2", "__AVX512VBMI2__"),
    ("avx512vnni", "__AVX512VNNI__"),
    ("avx512bitalg", "__AVX512BITALG__"),
    ("avx512vpopcntdq", "__AVX512VPOPCNTDQ__"),
    ("avx512bf16", "__AVX512BF16__"),
    ("avx512fp16", "__AVX512FP16__"),
    ("avx512vp2intersect", "__AVX512VP2INTERSECT__"),
    ("avxvnni", "__AVXVNNI__"),
    ("avxifma", "__AVXIFMA__"),
    ("avxneconvert", "__AVXNECONVERT__"),
    ("avxvnniint8", "__AVXVNNIINT8__"),
    ("avxvnniint16", "__AVXVNNIINT16__"),
    ("amx-tile", "__AMX_TILE__"),
    ("amx-int8", "__AMX_INT8__"),
    ("amx-bf16", "__AMX_BF16__"),
];

/// The vector and matrix features an artifact records and the runtime checks (the SSE2
/// baseline every x86-64 has is not among them).
pub fn is_wide(feature: &str) -> bool {
    feature.contains("avx")
        || feature.contains("fma")
        || feature.contains("sse4")
        || feature.starts_with("amx-")
}

/// A CPU the code is generated for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSpec {
    /// LLVM's CPU name (its scheduling model and the features the name implies).
    pub llvm_cpu: String,
    /// LLVM's feature string, `+avx2,-avx512f,...`: every wide feature on or off.
    pub features: String,
    /// What `--target-cpu` said.
    pub target: CpuTarget,
}

impl CpuSpec {
    /// The wide features the code may use, sorted: what the artifact records.
    pub fn wide(&self) -> Vec<String> {
        let set: BTreeSet<String> = self
            .features
            .split(',')
            .filter_map(|f| f.strip_prefix('+'))
            .filter(|f| is_wide(f))
            .map(str::to_string)
            .collect();
        set.into_iter().collect()
    }

    /// The widest vector level, as `kiln compile` prints it: `avx512f`, `avx2`...
    pub fn widest(&self) -> &'static str {
        let wide = self.wide();
        ["avx512f", "avx2", "avx", "sse4.2"]
            .into_iter()
            .find(|f| wide.iter().any(|w| w == f))
            .unwrap_or("sse2")
    }
}

/// The spec `target` names. `native` is the host, less the wide features the runtime cannot
/// check on the machine that loads the artifact (it refuses an artifact naming one: code using
/// it could die of an illegal instruction there).
pub fn resolve(target: &CpuTarget) -> Result<CpuSpec> {
    match target {
        CpuTarget::Native => {
            let features = TargetMachine::get_host_cpu_features()
                .to_string()
                .split(',')
                .map(|f| match f.strip_prefix('+') {
                    Some(name) if is_wide(name) && !kiln_runtime::device::cpu::can_check(name) => {
                        format!("-{name}")
                    }
                    // A CPU with AMX whose OS does not let this process use the tiles (Linux
                    // before 5.16, or a refusal) runs the vector kernels instead.
                    Some(name)
                        if name.starts_with("amx-") && !kiln_runtime::device::cpu::usable(name) =>
                    {
                        format!("-{name}")
                    }
                    _ => f.to_string(),
                })
                .collect::<Vec<_>>()
                .join(",");
            Ok(CpuSpec {
                llvm_cpu: TargetMachine::get_host_cpu_name().to_string(),
                features,
                target: target.clone(),
            })
        }
        CpuTarget::Named(name) => {
            let macros = c_compiler_macros(name)?;
            Ok(CpuSpec {
                llvm_cpu: name.clone(),
                features: pinned_features(&macros),
                target: target.clone(),
            })
        }
    }
}

/// Every wide feature on where the compiler's macros say the CPU has it, off elsewhere.
fn pinned_features(macros: &BTreeSet<String>) -> String {
    WIDE.iter()
        .map(|(feature, mac)| format!("{}{feature}", if macros.contains(*mac) { '+' } else { '-' }))
        .collect::<Vec<_>>()
        .join(",")
}

/// The macros `cc -march=NAME` defines (`__AVX2__`...); an unknown name is an error quoting
/// the C compiler.
fn c_compiler_macros(name: &str) -> Result<BTreeSet<String>> {
    let out = std::process::Command::new("cc")
        .args([&format!("-march={name}"), "-E", "-dM", "-x", "c", "/dev/null"])
        .output()
        .map_err(|e| {
            CompileError::Usage(format!(
                "--target-cpu {name}: cannot run the system C compiler `cc`, which says what a CPU name means (install a C toolchain: scripts/setup.sh): {e}"
            ))
        })?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let first = said.lines().find(|l| l.contains("error")).unwrap_or(said.trim());
        return Err(CompileError::Usage(format!(
            "--target-cpu {name} is not a CPU this toolchain knows (give native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4 or a CPU name such as skylake-avx512 or znver3): cc says: {}",
            first.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_cpus_parse_as_plain_names_only() {
        assert_eq!("native".parse::<CpuTarget>(), Ok(CpuTarget::Native));
        assert_eq!(" x86-64-v3 ".parse::<CpuTarget>(), Ok(CpuTarget::Named("x86-64-v3".into())));
        assert_eq!("znver3".parse::<CpuTarget>().unwrap().to_string(), "znver3");
        // What would be another option or a second word on cc's command line is refused.
        for bad in ["", "-march=native", "sky lake", "a;b", &"x".repeat(65)] {
            let e = bad.parse::<CpuTarget>().unwrap_err();
            assert!(e.contains("is not a CPU"), "{bad:?}: {e}");
        }
        assert!("x".repeat(64).parse::<CpuTarget>().is_ok());
    }

    #[test]
    fn every_wide_feature_is_pinned_on_or_off() {
        let macros: BTreeSet<String> =
            ["__AVX2__", "__FMA__", "__SSE4_2__"].into_iter().map(String::from).collect();
        let pinned = pinned_features(&macros);
        let entries: Vec<&str> = pinned.split(',').collect();
        assert_eq!(entries.len(), WIDE.len());
        assert!(entries.contains(&"+avx2") && entries.contains(&"+fma"), "{pinned}");
        assert!(entries.contains(&"-avx512f") && entries.contains(&"-sse4.1"), "{pinned}");
        let spec = CpuSpec { llvm_cpu: "x".into(), features: pinned, target: CpuTarget::Native };
        assert_eq!(spec.wide(), ["avx2", "fma", "sse4.2"]);
        assert_eq!(spec.widest(), "avx2");
        let bare = CpuSpec { features: "+sse2,-avx".into(), ..spec };
        assert_eq!(bare.wide(), Vec::<String>::new());
        assert_eq!(bare.widest(), "sse2");
        assert!(is_wide("avx512vnni") && is_wide("sse4.1") && !is_wide("sse2") && !is_wide("cx16"));
        assert!(is_wide("amx-int8") && is_wide("amx-tile") && !is_wide("amx"));
    }
}
