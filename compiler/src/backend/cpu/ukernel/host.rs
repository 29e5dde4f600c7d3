//! What the microkernels know of the machine they are built for: its instruction-set level and
//! features, its caches (from sysfs, not constants fitted on one machine) and the threads the
//! code is planned for, which sets how many work units a kernel splits into.

/// The x86-64 instruction-set level the microkernel object is built for (build.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// AVX-512 F, BW, DQ and VL.
    V4,
    /// AVX2 and FMA.
    V3,
    /// Baseline x86-64.
    V1,
}

/// What the compiler knows of the host for the microkernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    pub level: Level,
    /// Rows of the register tile: 8 with 32 vector registers (AVX-512), else 4.
    pub mr: usize,
    /// AVX-512 VNNI (`vpdpbusd`): the integer convolution's u8 x s8 products on it.
    pub vnni: bool,
    /// AMX-INT8 tiles (`tdpbsud`): the integer convolution's products on them, where the
    /// target has AMX (the runtime asks the OS for the tile state before it runs such code).
    pub amx: bool,
    /// AMX-BF16 tiles (`tdpbf16ps`): `--precision bf16`'s direct convolutions on them.
    pub amx_bf16: bool,
    /// AVX512-BF16 (`vdpbf16ps`): `--precision bf16`'s products on it.
    pub bf16: bool,
    pub l1_bytes: usize,
    pub l2_bytes: usize,
    /// The threads the code is planned for (`Options::threads`): how many work units a kernel
    /// with enough work splits into.
    pub threads: usize,
}

impl Host {
    /// This machine: its instruction-set level from LLVM's host features (`+avx512f,...`), its
    /// caches from sysfs (32 KiB and 1 MiB where sysfs says nothing).
    pub fn detect(cpu_features: &str) -> Host {
        let has = |f: &str| cpu_features.split(',').any(|x| x == format!("+{f}"));
        let level = if ["avx512f", "avx512bw", "avx512dq", "avx512vl"].iter().all(|f| has(f)) {
            Level::V4
        } else if has("avx2") && has("fma") {
            Level::V3
        } else {
            Level::V1
        };
        let mr = if level == Level::V4 { 8 } else { 4 };
        Host {
            level,
            mr,
            vnni: level == Level::V4 && has("avx512vnni"),
            amx: level == Level::V4 && has("amx-tile") && has("amx-int8"),
            // (The input is made bf16 pairs with AVX512-BF16's conversion.)
            amx_bf16: level == Level::V4 && has("amx-tile") && has("amx-bf16") && has("avx512bf16"),
            bf16: level == Level::V4 && has("avx512bf16"),
            l1_bytes: cache_bytes(1, "Data").unwrap_or(32 << 10),
            l2_bytes: cache_bytes(2, "Unified").unwrap_or(1 << 20),
            threads: 2,
        }
    }

    /// The work units a kernel of `work` splits into, each worth at least `min_unit`: one on one
    /// thread (a unit's own padded rows and part-filled strips are all a split buys there: 3x3
    /// by 256 on 14x14, 4 units 2.0 ms, 1 unit 1.78 on the Xeon), one below four units' worth
    /// (handing work to another thread would cost more than it saves), else
    /// as many as the work allows up to [`Host::max_units`]. At 2 threads that is 1 or 4, which
    /// measured best there (resnet18 22.0 ms against 22.8 with 2 units, 22.2 with 6, 23.7 with 8).
    pub fn units(&self, work: usize, min_unit: usize) -> usize {
        if self.threads <= 1 || work < 4 * min_unit.max(1) {
            1
        } else {
            (work / min_unit.max(1)).clamp(4, self.max_units())
        }
    }

    /// The most work units a kernel gets: two a planned thread, so threads that claim them one
    /// at a time finish together, and never fewer than 4.
    pub fn max_units(&self) -> usize {
        self.threads.saturating_mul(2).max(4)
    }
}

/// The size of cpu0's cache of a level and type, from sysfs (`32K`).
fn cache_bytes(level: usize, kind: &str) -> Option<usize> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for i in 0..8 {
        let dir = base.join(format!("index{i}"));
        let read =
            |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        if read("level")?.parse::<usize>().ok()? != level || read("type")? != kind {
            continue;
        }
        let size = read("size")?;
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size.as_str(), 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mul);
    }
    None
}
