//! Devices: where kernels run. One dispatch model for all of them: a kernel is a grid of
//! workgroups, and a launch runs all of its workgroups on the launch's buffers.
//!
//! - `cpu`: a shared object, launches split across a thread pool;
//! - `cuda`: PTX through the CUDA driver (libcuda, opened at run time);
//! - `opencl`: SPIR-V through an OpenCL platform (libOpenCL, opened at run time).
//!
//! Neither GPU library is needed to build or start kiln: a missing one is an error (or a note in
//! `list_devices`) that says so.
//!
//! Profiles say how close each kernel comes to the device's peaks (`Peaks`, `kernel_table`).

pub mod cpu;
pub mod cuda;
pub(crate) mod hazard;
pub mod opencl;

use std::time::Duration;

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

/// What one launch moves and computes at least: the artifact's `KernelDesc::bytes` and `flops`
/// (0 where the compiler does not count them: the CPU's kernels, ops without a FLOP count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Work {
    pub bytes: u64,
    pub flops: u64,
}

impl Work {
    /// Whether anything is counted (the roofline columns have something to say).
    pub fn counted(&self) -> bool {
        self.bytes > 0 || self.flops > 0
    }
}

/// What a compiled GPU function holds on the device (CUDA's function attributes): registers a
/// thread, static workgroup (shared) memory a block, and local memory a thread (register
/// spills).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub registers: u32,
    pub shared_bytes: u32,
    pub local_bytes: u32,
}

impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} regs, {} B shared", self.registers, self.shared_bytes)?;
        if self.local_bytes > 0 {
            write!(f, ", {} B local (spills)", self.local_bytes)?;
        }
        Ok(())
    }
}

/// A device's peak rates, where known: what a kernel's achieved rates are measured against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Peaks {
    /// Memory bandwidth, bytes per second.
    pub bytes_per_s: Option<f64>,
    /// f32 fused multiply-add throughput, FLOP per second (a multiply-add counts two).
    pub flops_per_s: Option<f64>,
}

impl std::fmt::Display for Peaks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bandwidth = self.bytes_per_s.map_or("unknown".into(), |b| format!("{:.0}", b / 1e9));
        let flops = self.flops_per_s.map_or("unknown".into(), |x| format!("{:.1}", x / 1e12));
        write!(f, "{bandwidth} GB/s memory, {flops} TFLOP/s f32")
    }
}

/// Which peak a kernel came closer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Bound {
    Memory,
    Compute,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
        }
    }
}

/// A launch's achieved rates and how close they come to the peaks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Roofline {
    /// Bytes per second (where bytes are counted).
    pub bytes_per_s: Option<f64>,
    /// FLOP per second (where FLOPs are counted).
    pub flops_per_s: Option<f64>,
    /// The larger of the bandwidth and the compute fractions of the peaks, and which.
    pub of_peak: Option<(f64, Bound)>,
}

impl Peaks {
    /// `work` done in `time`, against these peaks. Nothing is known of a zero time.
    pub fn roofline(&self, work: Work, time: Duration) -> Roofline {
        let secs = time.as_secs_f64();
        if secs <= 0.0 {
            return Roofline::default();
        }
        let rate = |n: u64| (n > 0).then(|| n as f64 / secs);
        let (bytes_per_s, flops_per_s) = (rate(work.bytes), rate(work.flops));
        let fraction = |got: Option<f64>, peak: Option<f64>, bound| match (got, peak) {
            (Some(g), Some(p)) if p > 0.0 => Some((g / p, bound)),
            _ => None,
        };
        let memory = fraction(bytes_per_s, self.bytes_per_s, Bound::Memory);
        let compute = fraction(flops_per_s, self.flops_per_s, Bound::Compute);
        let of_peak = match (memory, compute) {
            (Some(m), Some(c)) => Some(if c.0 > m.0 { c } else { m }),
            (m, c) => m.or(c),
        };
        Roofline { bytes_per_s, flops_per_s, of_peak }
    }
}

/// One line of a profile table: a kernel's time (one run's, or a median over runs) and what one
/// launch of it moves and computes.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub label: String,
    pub time: Duration,
    pub work: Work,
    /// What its function holds on the device, where the device says (CUDA).
    pub resources: Option<Resources>,
}

/// A profile as lines of text: per kernel its time and label, then `total` (the sum). Where the
/// artifact counts what kernels move and compute (GPU targets), each line also has the achieved
/// GB/s, GFLOP/s (where FLOPs are counted) and the fraction of `peaks` reached (the larger of
/// bandwidth and compute, and which), under a header, and the device's peaks end the table.
/// Without counted work (the CPU's kernels) the lines are time and label alone.
pub fn kernel_table(kernels: &[KernelTime], peaks: Option<&Peaks>, total: &str) -> Vec<String> {
    let time: Duration = kernels.iter().map(|k| k.time).sum();
    let ms = |t: Duration| t.as_secs_f64() * 1e3;
    if !kernels.iter().any(|k| k.work.counted()) {
        let mut lines: Vec<String> =
            kernels.iter().map(|k| format!("  {:>9.4} ms  {}", ms(k.time), k.label)).collect();
        lines.push(format!("  {:>9.4} ms  {total}", ms(time)));
        return lines;
    }
    let none = Peaks::default();
    let peaks_or_none = peaks.unwrap_or(&none);
    let row = |t: Duration, work: Work, label: &str| {
        let r = peaks_or_none.roofline(work, t);
        let rate = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}", x / 1e9));
        let of_peak =
            r.of_peak.map_or("-".to_string(), |(f, b)| format!("{:.1}% {}", f * 100.0, b.name()));
        format!(
            "  {:>9.4} ms  {:>9}  {:>9}  {:>14}  {label}",
            ms(t),
            rate(r.bytes_per_s),
            rate(r.flops_per_s),
            of_peak
        )
    };
    let with_resources = |line: String, k: &KernelTime| match k.resources {
        Some(res) => format!("{line} [{res}]"),
        None => line,
    };
    let mut lines = vec![format!(
        "  {:>12}  {:>9}  {:>9}  {:>14}  kernel",
        "time", "GB/s", "GFLOP/s", "of peak"
    )];
    lines.extend(kernels.iter().map(|k| with_resources(row(k.time, k.work, &k.label), k)));
    let all = kernels.iter().fold(Work::default(), |a, k| Work {
        bytes: a.bytes + k.work.bytes,
        flops: a.flops + k.work.flops,
    });
    lines.push(row(time, all, total));
    if let Some(p) = peaks {
        lines.push(format!("  the device's peaks: {p}"));
    }
    lines
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

    #[test]
    fn a_kernel_reaches_the_larger_of_its_bandwidth_and_compute_fractions() {
        let peaks = Peaks { bytes_per_s: Some(4.0e12), flops_per_s: Some(60.0e12) };
        let ms = Duration::from_millis(1);
        // 1 GB in 1 ms: 1 TB/s, a quarter of the bandwidth; 3 TFLOP in 1 ms: half the compute.
        let r = peaks.roofline(Work { bytes: 1_000_000_000, flops: 30_000_000_000 }, ms);
        assert_eq!(r.bytes_per_s, Some(1.0e12));
        assert_eq!(r.flops_per_s, Some(30.0e12));
        assert_eq!(r.of_peak, Some((0.5, Bound::Compute)));
        let r = peaks.roofline(Work { bytes: 2_000_000_000, flops: 0 }, ms);
        assert_eq!((r.flops_per_s, r.of_peak), (None, Some((0.5, Bound::Memory))));
        // Unknown peaks, no counted work or no time: no fraction.
        let r = Peaks::default().roofline(Work { bytes: 1, flops: 1 }, ms);
        assert_eq!(r.of_peak, None);
        assert!(r.bytes_per_s.is_some());
        assert_eq!(peaks.roofline(Work::default(), ms), Roofline::default());
        assert_eq!(
            peaks.roofline(Work { bytes: 1, flops: 1 }, Duration::ZERO),
            Roofline::default()
        );
    }

    #[test]
    fn the_profile_table_shows_rates_and_peaks_where_work_is_counted() {
        let k = |label: &str, us: u64, bytes: u64, flops: u64| KernelTime {
            resources: None,
            label: label.into(),
            time: Duration::from_micros(us),
            work: Work { bytes, flops },
        };
        // The CPU: no counted work, the lines kiln always printed.
        let cpu = [k("k0: Relu", 1500, 0, 0), k("k1: Add", 500, 0, 0)];
        assert_eq!(
            kernel_table(&cpu, None, "(sum of the kernels' medians)"),
            vec![
                "     1.5000 ms  k0: Relu",
                "     0.5000 ms  k1: Add",
                "     2.0000 ms  (sum of the kernels' medians)",
            ]
        );
        // A GPU: 4 MB in 10 us is 400 GB/s, 10% of 4 TB/s; 400 MFLOP in 10 us is 40 TFLOP/s.
        let gpu = [k("k0: Gemm", 10, 4_000_000, 400_000_000), k("k1: Relu", 10, 20_000_000, 0)];
        let peaks = Peaks { bytes_per_s: Some(4.0e12), flops_per_s: Some(80.0e12) };
        let table = kernel_table(&gpu, Some(&peaks), "(sum)");
        assert_eq!(
            table,
            vec![
                "          time       GB/s    GFLOP/s         of peak  kernel",
                "     0.0100 ms      400.0    40000.0   50.0% compute  k0: Gemm",
                "     0.0100 ms     2000.0          -    50.0% memory  k1: Relu",
                "     0.0200 ms     1200.0    20000.0    30.0% memory  (sum)",
                "  the device's peaks: 4000 GB/s memory, 80.0 TFLOP/s f32",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
        );
        // Peaks unknown (OpenCL): rates, no fraction.
        let table = kernel_table(&gpu[1..], None, "(sum)");
        assert_eq!(table[1], "     0.0100 ms     2000.0          -               -  k1: Relu");
        assert_eq!(table.len(), 3);
        // CUDA says what each function holds; spills show.
        let mut held = gpu[0].clone();
        held.resources = Some(Resources { registers: 128, shared_bytes: 16896, local_bytes: 0 });
        let table = kernel_table(&[held.clone()], Some(&peaks), "(sum)");
        assert!(table[1].ends_with("k0: Gemm [128 regs, 16896 B shared]"), "{}", table[1]);
        held.resources = Some(Resources { registers: 255, shared_bytes: 0, local_bytes: 64 });
        let table = kernel_table(&[held], Some(&peaks), "(sum)");
        assert!(table[1].ends_with("[255 regs, 0 B shared, 64 B local (spills)]"), "{}", table[1]);
    }
}
