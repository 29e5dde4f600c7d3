//! Devices: where kernels run. One dispatch model for all of them: a kernel is a grid of
//! workgroups, and a launch runs all of its workgroups on the launch's buffers.
//!
//! - `cpu`: a shared object, launches split across a thread pool;
//! - `cuda`: PTX through the CUDA driver (libcuda, opened at run time);
//! - `opencl`: SPIR-V through an OpenCL platform (libOpenCL, opened at run time).
//!
//! Neither GPU library is needed to build or start kiln: a missing one is an error (or a note in
//! `list_devices`) that says so.

pub mod cpu;
pub mod cuda;
pub(crate) mod hazard;
pub mod opencl;

use serde::Serialize;

use crate::artifact::Target;
use crate::RuntimeError;

/// One device kiln could run on, or a note that a kind of device is missing (`usable: false`,
/// `index: None`, the reason in `note`).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    pub target: Target,
    /// `cpu`, `cuda:0`, `opencl:1`; the bare target name for a note about a missing driver.
    pub id: String,
    /// What `LoadOptions::device_index` picks it by, for its target.
    pub index: Option<usize>,
    pub name: String,
    /// `CPU`, `GPU`, `accelerator`, `other`; empty for a note.
    pub kind: String,
    /// Whether kiln can run its artifacts there.
    pub usable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// CPU cores (logical), CUDA multiprocessors or OpenCL compute units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_units: Option<u32>,
    /// CUDA: `sm_90`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// OpenCL: the platform and its version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// OpenCL: the device's version; CUDA: the driver's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// OpenCL: the intermediate languages it builds (kiln needs SPIR-V).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub il_versions: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl DeviceInfo {
    fn note(target: Target, note: String) -> DeviceInfo {
        DeviceInfo {
            target,
            id: target.name().into(),
            index: None,
            name: String::new(),
            kind: String::new(),
            usable: false,
            memory_bytes: None,
            compute_units: None,
            compute_capability: None,
            platform: None,
            version: None,
            il_versions: None,
            note: Some(note),
        }
    }
}

fn message(e: RuntimeError) -> String {
    match e {
        RuntimeError::Device { msg, .. } => msg,
        RuntimeError::Opencl(e) => e.to_string(),
        other => other.to_string(),
    }
}

/// The host CPU's model name (from /proc/cpuinfo) and logical cores.
fn cpu_info() -> (String, u32, Option<u64>) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines().find_map(|l| {
            l.strip_prefix("MemTotal:")
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        })
    });
    (model, cores, memory)
}

/// Every device: the CPU, each CUDA GPU, each OpenCL device. A missing driver, loader or
/// platform gives an entry with `usable: false` and a note instead; this never fails.
pub fn list_devices() -> Vec<DeviceInfo> {
    let mut out = Vec::new();
    let (model, cores, memory) = cpu_info();
    out.push(DeviceInfo {
        id: "cpu".into(),
        index: Some(0),
        name: model,
        kind: "CPU".into(),
        usable: true,
        memory_bytes: memory,
        compute_units: Some(cores),
        note: None,
        ..DeviceInfo::note(Target::Cpu, String::new())
    });
    match cuda::gpus() {
        Ok(gpus) if gpus.is_empty() => out.push(DeviceInfo::note(
            Target::Cuda,
            "the CUDA driver is installed but sees no GPU".into(),
        )),
        Ok(gpus) => {
            let version = cuda::driver_version().ok().map(|v| format!("CUDA driver {v}"));
            for g in gpus {
                out.push(DeviceInfo {
                    id: format!("cuda:{}", g.index),
                    index: Some(g.index),
                    name: g.name.clone(),
                    kind: "GPU".into(),
                    usable: true,
                    memory_bytes: Some(g.memory_bytes),
                    compute_units: Some(g.multiprocessors.max(0) as u32),
                    compute_capability: Some(g.sm()),
                    version: version.clone(),
                    note: None,
                    ..DeviceInfo::note(Target::Cuda, String::new())
                });
            }
        }
        Err(e) => out.push(DeviceInfo::note(Target::Cuda, message(e))),
    }
    match opencl::devices() {
        Ok(devices) => {
            for d in devices {
                let spirv = d.takes_spirv();
                out.push(DeviceInfo {
                    id: format!("opencl:{}", d.index),
                    index: Some(d.index),
                    name: d.name.clone(),
                    kind: d.kind.into(),
                    usable: spirv,
                    memory_bytes: Some(d.memory_bytes),
                    compute_units: Some(d.compute_units),
                    platform: Some(format!("{} ({})", d.platform, d.platform_version)),
                    version: Some(d.version.clone()),
                    il_versions: Some(d.il_versions.clone()),
                    note: (!spirv).then(|| {
                        "does not build SPIR-V, which is what kiln gives OpenCL".to_string()
                    }),
                    ..DeviceInfo::note(Target::Opencl, String::new())
                });
            }
        }
        Err(e) => out.push(DeviceInfo::note(Target::Opencl, e.to_string())),
    }
    out
}

/// The best device here and why: a CUDA GPU, else an OpenCL GPU that builds SPIR-V, else the CPU.
/// (An OpenCL CPU device is never preferred to kiln's own CPU code.)
pub fn auto_device() -> (Target, String) {
    let mut why = Vec::new();
    if !cuda::driver_present() {
        why.push("no CUDA driver".to_string());
    } else {
        match cuda::gpus() {
            Ok(g) if !g.is_empty() => {
                return (Target::Cuda, format!("cuda:0 {} ({}), a CUDA GPU", g[0].name, g[0].sm()))
            }
            Ok(_) => why.push("the CUDA driver sees no GPU".into()),
            Err(e) => why.push(format!("CUDA unusable ({})", message(e))),
        }
    }
    match opencl::devices() {
        Ok(devices) => match devices.iter().find(|d| d.kind == "GPU" && d.takes_spirv()) {
            Some(d) => {
                return (
                    Target::Opencl,
                    format!("{}, an OpenCL GPU ({})", d.describe(), why.join(", ")),
                )
            }
            None => why.push(format!(
                "no OpenCL GPU that builds SPIR-V ({} other OpenCL device{})",
                devices.len(),
                if devices.len() == 1 { "" } else { "s" }
            )),
        },
        Err(opencl::OpenclError::NoLoader) => why.push("no OpenCL loader".into()),
        Err(opencl::OpenclError::NoPlatform) => why.push("no OpenCL platform".into()),
        Err(e) => why.push(format!("OpenCL unusable ({e})")),
    }
    (Target::Cpu, format!("cpu ({})", why.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What stops OpenCL is a variant, not a message to compare, and the runtime error keeps it
    /// as its source.
    #[test]
    fn opencl_failures_are_typed_and_chained() {
        let e = RuntimeError::from(opencl::OpenclError::NoLoader);
        assert_eq!(e.to_string(), "device opencl");
        let source = std::error::Error::source(&e).expect("a source").to_string();
        assert!(source.starts_with("no OpenCL loader (libOpenCL.so.1) found"), "{source}");
        assert!(matches!(e, RuntimeError::Opencl(opencl::OpenclError::NoLoader)));
    }

    #[test]
    fn listing_never_fails_and_says_what_is_missing() {
        let all = list_devices();
        assert_eq!(all[0].target, Target::Cpu);
        assert!(all[0].usable && !all[0].name.is_empty());
        // One entry at least per target: a device, or a note saying why there is none.
        for t in [Target::Cuda, Target::Opencl] {
            let of: Vec<&DeviceInfo> = all.iter().filter(|d| d.target == t).collect();
            assert!(!of.is_empty(), "{t:?}");
            assert!(
                of.iter().all(|d| d.index.is_some() || (d.note.is_some() && !d.usable)),
                "{of:?}"
            );
        }
        if !cuda::driver_present() {
            let note = all.iter().find(|d| d.target == Target::Cuda).unwrap().note.clone().unwrap();
            assert!(note.contains("no CUDA driver"), "{note}");
        }
        let json = serde_json::to_string(&all).unwrap();
        assert!(json.contains("\"target\":\"cpu\""), "{json}");
    }

    #[test]
    fn auto_prefers_gpus_and_says_why() {
        let (target, why) = auto_device();
        if !cuda::driver_present() {
            assert_ne!(target, Target::Cuda);
            assert!(why.contains("no CUDA driver"), "{why}");
        }
        if target == Target::Cpu {
            assert!(why.starts_with("cpu ("), "{why}");
        }
    }
}
