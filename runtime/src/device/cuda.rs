//! The CUDA device: PTX loaded through the driver API (cudarc, libcuda opened at run time, no
//! NVRTC). Kernels take one device pointer per argument (MLIR's bare-pointer convention).
//!
//! Everything stays on the GPU between runs: the module, the constants (uploaded once at load),
//! and one device allocation holding every input, output and constant, and the scratch arena. A
//! run copies the inputs in, launches every kernel, and copies the outputs out. Launches that do
//! not depend on each other (see `hazard.rs`) go on up to `MAX_STREAMS` streams, ordered by
//! events.
//!
//! Launch overhead: the copies go through page-locked host slots (allocated at load), and once a
//! run has launched every kernel directly, the next plain run captures the launches into a CUDA
//! graph that later plain runs replay with one call. Both are optional: a failure of either
//! falls back to pageable copies or direct launches, never a failed run. Every buffer address is
//! fixed at load (one device allocation, fixed host slots), which is what keeps the graph valid.

use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaGraph, CudaStream, DriverError};
use kiln_ir::Tensor;

use super::hazard::{Bits, Hazards};
use super::Peaks;
use crate::artifact::{Artifact, BufferKind, Manifest};
use crate::executable::{CopySpan, Profile, Track};
use crate::status;
use crate::{Result, RuntimeError};

/// At most this many streams run one executable's launches concurrently.
const MAX_STREAMS: usize = 4;
/// Device addresses of buffers are aligned to this (the widest vector access and the driver's own
/// allocation alignment).
const ALIGN: u64 = 256;

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Device { device: "cuda".into(), msg: msg.into() }
}

fn driver(what: &str) -> impl Fn(DriverError) -> RuntimeError + '_ {
    move |e| err(format!("{what}: {}", describe(e)))
}

/// `CUDA_ERROR_X (message)`; the driver is known to be loaded when an error comes back.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Whether libcuda can be opened. cudarc panics on any driver call without it, so every entry
/// point checks this first. Checked once: it dlopens the library.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

pub const NO_DRIVER: &str = "no CUDA driver (libcuda.so) found: this machine has no NVIDIA driver installed; use --device opencl or cpu";

/// The error for a machine without the driver library.
fn require_driver(present: bool) -> Result<()> {
    if present {
        Ok(())
    } else {
        Err(err(NO_DRIVER))
    }
}

/// Runs `f`, turning a panic inside cudarc (a driver without a symbol it expects) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(err(format!("{what}: the CUDA driver library is unusable ({msg})")))
    })
}

/// One CUDA GPU, as `kiln devices` shows it.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    pub index: usize,
    pub name: String,
    /// (major, minor): `sm_<major><minor>`.
    pub compute_capability: (i32, i32),
    pub memory_bytes: u64,
    pub multiprocessors: i32,
}

impl GpuInfo {
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The driver's version as `major.minor`.
pub fn driver_version() -> Result<String> {
    require_driver(driver_present())?;
    guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
    })
}

/// The GPUs the driver sees (none when it reports no device). Creates no context.
pub fn gpus() -> Result<Vec<GpuInfo>> {
    require_driver(driver_present())?;
    guarded("listing GPUs", || {
        match result::init() {
            Ok(()) => {}
            Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(Vec::new()),
            Err(e) => {
                return Err(err(format!("the CUDA driver did not initialise: {}", describe(e))))
            }
        }
        let n = result::device::get_count().map_err(driver("counting GPUs"))?;
        (0..n)
            .map(|i| {
                let dev = result::device::get(i).map_err(driver("cuDeviceGet"))?;
                let attr = |a| {
                    // SAFETY: `dev` came from cuDeviceGet.
                    unsafe { result::device::get_attribute(dev, a) }
                        .map_err(driver("cuDeviceGetAttribute"))
                };
                use sys::CUdevice_attribute_enum as A;
                Ok(GpuInfo {
                    index: i as usize,
                    name: result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?,
                    compute_capability: (
                        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                    ),
                    // SAFETY: as above.
                    memory_bytes: unsafe { result::device::total_mem(dev) }
                        .map_err(driver("cuDeviceTotalMem"))?
                        as u64,
                    multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
                })
            })
            .collect()
    })
}

/// What the driver reports of a GPU's clocks (kHz) and memory bus (bits), for its peak rates;
/// `None` where it reports nothing (newer drivers may not report the clocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clocks {
    pub core_khz: Option<i32>,
    pub memory_khz: Option<i32>,
    pub bus_bits: Option<i32>,
}

impl Clocks {
    /// The device's attributes; one the driver refuses or reports as 0 is `None`.
    fn of(dev: sys::CUdevice) -> Clocks {
        use sys::CUdevice_attribute_enum as A;
        // SAFETY: `dev` came from the driver (the context's device).
        let get = |a| unsafe { result::device::get_attribute(dev, a) }.ok().filter(|&v| v > 0);
        Clocks {
            core_khz: get(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            memory_khz: get(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            bus_bits: get(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        }
    }
}

/// f32 FMA lanes per multiprocessor: 64 on sm_60, sm_7x and sm_80 (the A100), 128 on the others
/// kiln targets (sm_61, sm_86, sm_89, sm_90 and later).
fn fp32_lanes(capability: (i32, i32)) -> f64 {
    match capability {
        (6, 0) | (7, _) | (8, 0) => 64.0,
        _ => 128.0,
    }
}

/// Memory bandwidth (bytes/s) and boost clock (kHz) of GPUs kiln is run on, by name, for a
/// driver that does not report the attributes.
fn known_gpu(name: &str) -> Option<(f64, i32)> {
    if name.contains("H200") {
        Some((4.8e12, 1_980_000))
    } else if name.contains("H100") && (name.contains("HBM3") || name.contains("SXM")) {
        Some((3.35e12, 1_980_000))
    } else if name.contains("A100") && name.contains("80GB") {
        Some((2.0e12, 1_410_000))
    } else {
        None
    }
}

/// A GPU's peak memory bandwidth (double data rate: 2 x memory clock x bus width) and f32 FMA
/// throughput (multiprocessors x FMA lanes x 2 x clock), from the driver's attributes, else the
/// table of known GPUs, else unknown.
pub fn peaks(gpu: &GpuInfo, clocks: Clocks) -> Peaks {
    let known = known_gpu(&gpu.name);
    let bytes_per_s = match (clocks.memory_khz, clocks.bus_bits) {
        (Some(khz), Some(bits)) => Some(2.0 * khz as f64 * 1e3 * bits as f64 / 8.0),
        _ => known.map(|k| k.0),
    };
    let flops_per_s =
        clocks.core_khz.or(known.map(|k| k.1)).filter(|_| gpu.multiprocessors > 0).map(|khz| {
            gpu.multiprocessors as f64 * fp32_lanes(gpu.compute_capability) * 2.0 * khz as f64 * 1e3
        });
    Peaks { bytes_per_s, flops_per_s }
}

/// Whether `KILN_CUDA_GRAPH` (its value) lets plain runs replay a CUDA graph: all but `0`.
fn graphs_wanted(value: Option<&str>) -> bool {
    value.map(str::trim) != Some("0")
}

/// The loaded module; unloaded on drop.
struct Module {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by us, unloaded once; nothing runs (every run synchronises).
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// One device allocation; freed on drop.
struct DeviceMemory {
    ctx: Arc<CudaContext>,
    base: sys::CUdeviceptr,
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by us, freed once, no work in flight.
            let _ = unsafe { result::free_sync(self.base) };
        }
    }
}

/// Page-locked host memory; freed on drop.
struct PinnedMemory {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once; no copy in flight (every run
            // synchronises, a failed one too).
            let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
        }
    }
}

/// A byte range of the pinned staging memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    offset: usize,
    len: usize,
}

/// Where each input's and output's pinned slot lies, and the bytes they take in all.
#[derive(Debug, PartialEq, Eq)]
struct StagingLayout {
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
    total: usize,
}

/// One slot per input and output, the size of its device buffer, each at an `ALIGN` offset.
fn staging_layout(m: &Manifest) -> StagingLayout {
    let mut total = 0usize;
    let mut place = |buffer: usize| {
        let len = m.buffers[buffer].bytes as usize;
        let slot = Slot { offset: total, len };
        total = (total + len).div_ceil(ALIGN as usize) * ALIGN as usize;
        slot
    };
    let inputs = m.inputs.iter().map(|d| place(d.buffer)).collect();
    let outputs = m.outputs.iter().map(|d| place(d.buffer)).collect();
    StagingLayout { inputs, outputs, total }
}

/// Pinned host slots the copies go through: a copy from pageable memory is staged by the driver
/// and does not overlap the host, one from pinned memory is a direct DMA.
struct Staging {
    memory: PinnedMemory,
    layout: StagingLayout,
}

impl Staging {
    /// Allocates the slots; why not, when the driver refuses (the copies then stay pageable).
    fn new(ctx: &Arc<CudaContext>, m: &Manifest) -> std::result::Result<Staging, String> {
        let layout = staging_layout(m);
        if layout.total == 0 {
            return Err("no input or output bytes to copy".into());
        }
        let ptr = guarded("cuMemHostAlloc", || {
            // SAFETY: plain page-locked host memory, freed by `PinnedMemory`.
            unsafe { result::malloc_host(layout.total, 0) }.map_err(driver("cuMemHostAlloc"))
        })
        .map_err(|e| format!("pinned host memory of {} bytes: {e}", layout.total))?;
        if ptr.is_null() {
            return Err("cuMemHostAlloc returned no memory".into());
        }
        Ok(Staging { memory: PinnedMemory { ctx: ctx.clone(), ptr: ptr as *mut u8 }, layout })
    }

    /// Copies `bytes` into input `i`'s slot and returns where they are.
    fn fill(&self, i: usize, bytes: &[u8]) -> Result<*const u8> {
        let slot = self.layout.inputs[i];
        if bytes.len() > slot.len {
            return Err(err(format!(
                "input {i} has {} bytes, its buffer {}",
                bytes.len(),
                slot.len
            )));
        }
        // SAFETY: the slot lies inside the allocation (layout) and no copy reads it now (the
        // previous run synchronised; runs are serialised).
        unsafe {
            let at = self.memory.ptr.add(slot.offset);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            Ok(at)
        }
    }

    /// Where output `i`'s slot starts.
    fn output(&self, i: usize) -> *mut u8 {
        // SAFETY: inside the allocation (layout).
        unsafe { self.memory.ptr.add(self.layout.outputs[i].offset) }
    }

    /// Output `i`'s bytes, once the copy into its slot has finished.
    fn take_output(&self, i: usize) -> Vec<u8> {
        let slot = self.layout.outputs[i];
        // SAFETY: inside the allocation; the stream that wrote it has synchronised.
        unsafe { std::slice::from_raw_parts(self.memory.ptr.add(slot.offset), slot.len) }.to_vec()
    }
}

/// Whether plain runs replay a CUDA graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphUse {
    /// Plain runs replay the graph one of them captured.
    InUse,
    /// None captured yet: the first run launches directly (a kernel's first launch may load it,
    /// which a capture cannot do); the next plain run captures.
    Pending,
    /// Plain runs launch directly, and why.
    Off(String),
}

impl fmt::Display for GraphUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphUse::InUse => write!(f, "CUDA graph in use"),
            GraphUse::Pending => write!(f, "CUDA graph not captured yet"),
            GraphUse::Off(why) => write!(f, "CUDA graph off ({why})"),
        }
    }
}

/// How plain runs of a CUDA program go: graph or direct launches, pinned or pageable copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMode {
    pub graph: GraphUse,
    /// Why the copies go from and to pageable memory; `None` when they use pinned slots.
    pub pageable: Option<String>,
}

impl fmt::Display for RunMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pageable {
            None => write!(f, "{}, pinned copies", self.graph),
            Some(why) => write!(f, "{}, pageable copies ({why})", self.graph),
        }
    }
}

/// The graph plain runs replay, or why not yet or not at all.
enum Graph {
    Pending,
    Ready(CudaGraph),
    Off(String),
}

/// What runs change, under the run lock.
struct RunState {
    /// Timing events for `run_profiled`, made on the first profiled run.
    profile_events: Option<ProfileEvents>,
    /// With them, the events that place a profiled run's launches and copies on a timeline.
    profile_marks: Option<CopyMarks>,
    graph: Graph,
    /// Runs that launched every kernel directly (a capture waits for one).
    direct_runs: u64,
    /// The device time of every run so far; `None` once one could not be measured.
    spent: Option<Duration>,
}

/// Which stream runs each launch and which events order them.
#[derive(Debug, Default)]
struct StreamPlan {
    streams: usize,
    stream_of: Vec<usize>,
    /// Launches whose completion event launch `j` waits for before it starts.
    waits: Vec<Vec<usize>>,
    /// Launches after which an event is recorded (someone waits for it).
    recorded: Vec<bool>,
    /// Launches on other streams the main stream waits for before copying outputs out.
    joins: Vec<usize>,
}

/// Puts each launch on a stream: after a launch it depends on when that one is the last on its
/// stream (no event needed), else on a new stream while there are fewer than `max`, else on the
/// stream that has been idle longest. Waits are added only for dependencies the stream has not
/// already passed (`seen`).
fn plan_streams(h: &Hazards, max: usize) -> StreamPlan {
    let n = h.deps.len();
    let mut p = StreamPlan {
        streams: 0,
        stream_of: vec![0; n],
        waits: vec![Vec::new(); n],
        recorded: vec![false; n],
        joins: Vec::new(),
    };
    let mut tail: Vec<usize> = Vec::new();
    let mut seen: Vec<Bits> = Vec::new();
    for j in 0..n {
        let deps = &h.deps[j];
        // `deps` is latest first, so the first dependency that ends a stream is the latest one.
        let chained = deps.iter().map(|&i| p.stream_of[i]).find(|&s| deps.contains(&tail[s]));
        let s = match chained {
            Some(s) => s,
            None if tail.len() < max => {
                tail.push(j);
                seen.push(Bits::new(n));
                tail.len() - 1
            }
            None => (0..tail.len()).min_by_key(|&s| tail[s]).expect("at least one stream"),
        };
        for &i in deps {
            if !seen[s].get(i) {
                p.waits[j].push(i);
                p.recorded[i] = true;
                seen[s].set(i);
                seen[s].union(&h.after[i]);
            }
        }
        seen[s].set(j);
        seen[s].union(&h.after[j]);
        tail[s] = j;
        p.stream_of[j] = s;
    }
    p.streams = tail.len().max(1);
    for &t in tail.iter().skip(1) {
        if !seen[0].get(t) {
            p.joins.push(t);
            p.recorded[t] = true;
        }
    }
    p
}

/// Timing events for `run_profiled`, one pair per launch, made on the first profiled run.
type ProfileEvents = Vec<(CudaEvent, CudaEvent)>;

/// A profiled run's events on the main stream around the copies: every launch's start is
/// measured from `start`, the first thing the run does on the device.
struct CopyMarks {
    start: CudaEvent,
    inputs_copied: CudaEvent,
    outputs_start: CudaEvent,
    end: CudaEvent,
}

/// The time from `a` to `b` (two recorded events), never negative.
fn between(a: &CudaEvent, b: &CudaEvent) -> Result<Duration> {
    let ms = a.elapsed_ms(b).map_err(driver("cuEventElapsedTime"))?;
    Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
}

/// A loaded CUDA executable.
pub struct CudaProgram {
    ctx: Arc<CudaContext>,
    description: String,
    functions: Vec<sys::CUfunction>,
    /// Per function, what it holds on the device (for profiles).
    resources: Vec<Option<super::Resources>>,
    /// Device address of every buffer.
    ptrs: Vec<sys::CUdeviceptr>,
    plan: StreamPlan,
    streams: Vec<Arc<CudaStream>>,
    /// Per launch, recorded after it when `plan.recorded` says so.
    events: Vec<Option<CudaEvent>>,
    /// Recorded on the main stream once the inputs are copied; side streams wait for it.
    uploaded: Option<CudaEvent>,
    /// Timing events on the main stream after the input copies and before the output copies:
    /// every run's device time without the copies (`None`: they could not be made).
    span: Option<(CudaEvent, CudaEvent)>,
    /// The pinned slots, or why the copies stay pageable.
    staging: std::result::Result<Staging, String>,
    peaks: Peaks,
    /// One run at a time: the buffers are resident.
    run_lock: Mutex<RunState>,
    load_bytes: u64,
    // Dropped after everything above that refers to them.
    _memory: DeviceMemory,
    _module: Module,
}

impl Drop for CudaProgram {
    fn drop(&mut self) {
        // The graph and events are destroyed with the context current and nothing in flight.
        if self.ctx.bind_to_thread().is_ok() {
            self.settle();
        }
    }
}

// SAFETY: the raw handles (functions, device pointers) are plain values the driver accepts from
// any thread once the context is bound (every entry point binds it); runs are serialised by
// `run_lock`.
unsafe impl Send for CudaProgram {}
unsafe impl Sync for CudaProgram {}

impl CudaProgram {
    /// Loads a validated CUDA artifact on GPU `index` (default 0).
    pub fn load(artifact: &Artifact, index: Option<usize>) -> Result<CudaProgram> {
        require_driver(driver_present())?;
        guarded("loading", || CudaProgram::load_inner(artifact, index))
    }

    fn load_inner(artifact: &Artifact, index: Option<usize>) -> Result<CudaProgram> {
        let m = &artifact.manifest;
        let gpus = gpus()?;
        if gpus.is_empty() {
            return Err(err("the CUDA driver is installed but sees no GPU"));
        }
        let index = index.unwrap_or(0);
        let gpu = gpus.get(index).ok_or_else(|| {
            err(format!(
                "there is no CUDA device {index}: this machine has {} (cuda:0..cuda:{})",
                gpus.len(),
                gpus.len() - 1
            ))
        })?;
        let ctx = CudaContext::new(index).map_err(driver("creating a context"))?;
        let description = format!("cuda:{index} {} ({})", gpu.name, gpu.sm());
        // Device memory free now, before anything is allocated there (a failed allocation later
        // is the driver's error, reported with the buffer's size).
        if let Ok((free, _)) = result::mem_get_info() {
            crate::memory::check_device(m, &description, free as u64)?;
        }

        // The module, loaded once, with the JIT's log in the error when the driver rejects it.
        let code = artifact.blob(m.code)?;
        let text = std::str::from_utf8(code)
            .map_err(|_| err("the code blob is not PTX text (not UTF-8)"))?;
        let ptx = CString::new(text)
            .map_err(|_| err("the code blob is not PTX text (it holds a NUL byte)"))?;
        let module = Module { ctx: ctx.clone(), module: load_ptx(&ptx, &m.target_detail)? };

        let max_grid = {
            use sys::CUdevice_attribute_enum as A;
            let get = |a| {
                // SAFETY: the context's device.
                unsafe { result::device::get_attribute(ctx.cu_device(), a) }
                    .map_err(driver("cuDeviceGetAttribute"))
            };
            [
                get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ]
        };
        let mut functions = Vec::with_capacity(m.kernels.len());
        let mut resources = Vec::with_capacity(m.kernels.len());
        for (i, k) in m.kernels.iter().enumerate() {
            let name = CString::new(k.symbol.as_str())
                .map_err(|_| err(format!("kernel {i}'s symbol `{}` holds a NUL byte", k.symbol)))?;
            // SAFETY: the module is loaded.
            let f = unsafe { result::module::get_function(module.module, name) }.map_err(|e| {
                err(format!(
                    "the PTX has no kernel `{}` (kernel {i}, {}): {}",
                    k.symbol,
                    k.label,
                    describe(e)
                ))
            })?;
            // SAFETY: `f` is a function of the loaded module.
            let max_threads = unsafe {
                result::function::get_function_attribute(
                    f,
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                )
            }
            .map_err(driver("cuFuncGetAttribute"))?;
            let threads: u64 = k.block.iter().map(|&b| b as u64).product();
            if threads > max_threads as u64 {
                return Err(err(format!(
                    "kernel `{}` ({}) asks for {threads} threads a block; it can run at most {max_threads} here",
                    k.symbol, k.label
                )));
            }
            if (0..3).any(|d| k.grid[d] as i64 > max_grid[d] as i64) {
                return Err(err(format!(
                    "kernel `{}` ({}) has grid {:?}, over the device's limit {:?}",
                    k.symbol, k.label, k.grid, max_grid
                )));
            }
            functions.push(f);
            resources.push(function_resources(f));
        }

        // One allocation: inputs, outputs and constants each at an aligned offset, then the arena.
        let (offsets, total) = layout(m);
        // SAFETY: the context is current (bound by CudaContext::new and gpus()).
        ctx.bind_to_thread().map_err(driver("binding the context"))?;
        let base = unsafe { result::malloc_sync(total.max(1) as usize) }.map_err(|e| {
            err(format!(
                "cannot allocate {total} bytes of device memory on {description}: {}",
                describe(e)
            ))
        })?;
        let memory = DeviceMemory { ctx: ctx.clone(), base };
        let ptrs: Vec<sys::CUdeviceptr> = offsets.iter().map(|o| base + o).collect();

        // Constants go to the device once.
        let mut load_bytes = 0;
        for (i, b) in m.buffers.iter().enumerate() {
            if let BufferKind::Constant(blob) = b.kind {
                let src = &artifact.blob(blob)?[..b.bytes as usize];
                if !src.is_empty() {
                    // SAFETY: the destination lies inside the allocation (layout); synchronous.
                    unsafe { result::memcpy_htod_sync(ptrs[i], src) }
                        .map_err(driver("uploading constants"))?;
                    load_bytes += src.len() as u64;
                }
            }
        }

        let hazards = Hazards::of(m);
        let plan = plan_streams(&hazards, MAX_STREAMS);
        let streams = (0..plan.streams)
            .map(|_| ctx.new_stream().map_err(driver("creating a stream")))
            .collect::<Result<Vec<_>>>()?;
        let events = plan
            .recorded
            .iter()
            .map(|&r| {
                if r {
                    ctx.new_event(None).map(Some).map_err(driver("creating an event"))
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let uploaded = if plan.streams > 1 {
            Some(ctx.new_event(None).map_err(driver("creating an event"))?)
        } else {
            None
        };
        // Optional: without them a run reports no device time.
        let timed = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).ok();
        let span = timed().zip(timed());
        let staging = Staging::new(&ctx, m);
        let graph = if graphs_wanted(std::env::var("KILN_CUDA_GRAPH").ok().as_deref()) {
            Graph::Pending
        } else {
            Graph::Off("KILN_CUDA_GRAPH=0".into())
        };
        let peaks = peaks(gpu, Clocks::of(ctx.cu_device()));
        Ok(CudaProgram {
            ctx,
            description,
            functions,
            resources,
            ptrs,
            plan,
            streams,
            events,
            uploaded,
            span,
            staging,
            peaks,
            run_lock: Mutex::new(RunState {
                profile_events: None,
                profile_marks: None,
                graph,
                direct_runs: 0,
                spent: Some(Duration::ZERO),
            }),
            load_bytes,
            _memory: memory,
            _module: module,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Bytes copied to the device at load (the constants).
    pub fn load_bytes(&self) -> u64 {
        self.load_bytes
    }

    /// How many streams the launches use.
    pub fn streams(&self) -> usize {
        self.plan.streams
    }

    /// The GPU's peak rates (from its attributes, else its name).
    pub fn peaks(&self) -> Peaks {
        self.peaks
    }

    /// What kernel `i`'s function holds on the device (registers, shared and local memory).
    pub fn resources(&self, i: usize) -> Option<super::Resources> {
        self.resources.get(i).copied().flatten()
    }

    /// The device time of every run so far, kernels alone; `None` when a run could not measure
    /// it.
    pub fn device_time_spent(&self) -> Option<Duration> {
        self.lock().spent
    }

    /// Whether plain runs replay a CUDA graph.
    pub fn graph_use(&self) -> GraphUse {
        match &self.lock().graph {
            Graph::Pending => GraphUse::Pending,
            Graph::Ready(_) => GraphUse::InUse,
            Graph::Off(why) => GraphUse::Off(why.clone()),
        }
    }

    /// How plain runs go: graph or direct launches, pinned or pageable copies.
    pub fn run_mode(&self) -> RunMode {
        RunMode { graph: self.graph_use(), pageable: self.staging.as_ref().err().cloned() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.run_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies `inputs` in, runs every launch, copies the outputs out (as bytes, in order).
    pub fn run(
        &self,
        m: &Manifest,
        inputs: &[Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Vec<u8>>> {
        let mut state = self.lock();
        self.ctx.bind_to_thread().map_err(driver("binding the context"))?;
        if profile.is_some() && state.profile_events.is_none() {
            let timed = || {
                self.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("creating an event"))
            };
            state.profile_events =
                Some(m.launches.iter().map(|_| Ok((timed()?, timed()?))).collect::<Result<_>>()?);
            state.profile_marks = Some(CopyMarks {
                start: timed()?,
                inputs_copied: timed()?,
                outputs_start: timed()?,
                end: timed()?,
            });
        }
        if profile.is_none() {
            self.capture_when_due(&mut state, m);
        }
        // Pageable copies land in these; pinned ones in the slots, copied out after the run.
        let mut pageable: Vec<Vec<u8>> = match &self.staging {
            Ok(_) => Vec::new(),
            Err(_) => {
                m.outputs.iter().map(|o| vec![0u8; m.buffers[o.buffer].bytes as usize]).collect()
            }
        };
        let ran = self.run_once(&mut state, m, inputs, &mut pageable, profile);
        if ran.is_err() {
            // Nothing may still copy into host memory that is about to be freed.
            self.settle();
        }
        ran?;
        Ok(match &self.staging {
            Ok(staging) => (0..m.outputs.len()).map(|i| staging.take_output(i)).collect(),
            Err(_) => pageable,
        })
    }

    /// One run: the input copies, the kernels (the graph's replay or direct launches), the
    /// output copies, the synchronisation, then the profile and the device time.
    fn run_once(
        &self,
        state: &mut RunState,
        m: &Manifest,
        inputs: &[Tensor],
        pageable: &mut [Vec<u8>],
        profile: Option<&mut Profile>,
    ) -> Result<()> {
        let main = &self.streams[0];
        let status = m.buffers.iter().position(|b| b.kind == BufferKind::Status);
        if let Some(b) = status {
            self.reset_status(b)?;
        }
        // A profiled run's marks around the copies; the device is idle here (the last run
        // synchronised), so the first mark runs about when it is enqueued: `enqueued`.
        let marks = if profile.is_some() { state.profile_marks.as_ref() } else { None };
        let mark = |e: Option<&CudaEvent>| match e {
            Some(e) => e.record(main).map_err(driver("cuEventRecord")),
            None => Ok(()),
        };
        let enqueued = Instant::now();
        mark(marks.map(|k| &k.start))?;
        let to_device = self.copy_inputs(m, inputs)?;
        mark(marks.map(|k| &k.inputs_copied))?;
        if let Some((start, _)) = &self.span {
            start.record(main).map_err(driver("cuEventRecord"))?;
        }
        let replayed = profile.is_none() && self.replay(state);
        if !replayed {
            let timing = if profile.is_some() { state.profile_events.as_ref() } else { None };
            self.enqueue(m, timing)?;
        }
        if let Some((_, end)) = &self.span {
            end.record(main).map_err(driver("cuEventRecord"))?;
        }
        let marks = if profile.is_some() { state.profile_marks.as_ref() } else { None };
        mark(marks.map(|k| &k.outputs_start))?;
        let from_device = self.copy_outputs(m, pageable)?;
        mark(marks.map(|k| &k.end))?;
        let mut word = status::RESET;
        if let Some(b) = status {
            // SAFETY: the word's 16 bytes, into `word`, which lives past the synchronisation.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    word.as_mut_ptr() as *mut c_void,
                    self.ptrs[b],
                    word.len(),
                    main.cu_stream(),
                )
            }
            .result()
            .map_err(driver("reading the status word"))?;
        }
        main.synchronize()
            .map_err(|e| err(format!("running the kernels failed: {}", describe(e))))?;
        if let Some(failed) = status::Reported::decode(&word) {
            return Err(failed.error(m, None));
        }
        if !replayed {
            state.direct_runs += 1;
        }
        let took = self.span.as_ref().and_then(|(start, end)| start.elapsed_ms(end).ok());
        let took = took.map(|ms| Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3));
        state.spent = state.spent.zip(took).map(|(a, t)| a + t);
        if let Some(p) = profile {
            if let (Some(ev), Some(marks)) = (&state.profile_events, &state.profile_marks) {
                let base = p.since_origin(enqueued);
                for (j, (launch, (start, end))) in m.launches.iter().zip(ev).enumerate() {
                    p.push_launch(
                        &m.kernels[launch.kernel].label,
                        between(start, end)?,
                        base + between(&marks.start, start)?,
                        Track::CudaStream(self.plan.stream_of[j]),
                    );
                }
                if to_device > 0 {
                    p.copies.push(CopySpan {
                        to_device: true,
                        bytes: to_device,
                        start: base,
                        time: between(&marks.start, &marks.inputs_copied)?,
                    });
                }
                if from_device > 0 {
                    p.copies.push(CopySpan {
                        to_device: false,
                        bytes: from_device,
                        start: base + between(&marks.start, &marks.outputs_start)?,
                        time: between(&marks.outputs_start, &marks.end)?,
                    });
                }
            }
            if let Some(t) = took {
                p.device_time = Some(p.device_time.unwrap_or_default() + t);
            }
            p.bytes_to_device += to_device;
            p.bytes_from_device += from_device;
        }
        Ok(())
    }

    /// Resets status word `b` on the main stream, ahead of the launches (side streams start
    /// after the input copies that follow, and a graph's replay after both).
    fn reset_status(&self, b: usize) -> Result<()> {
        // SAFETY: the word's 16 bytes from `RESET`, which is static.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptrs[b],
                status::RESET.as_ptr() as *const c_void,
                status::RESET.len(),
                self.streams[0].cu_stream(),
            )
        }
        .result()
        .map_err(driver("resetting the status word"))
    }

    /// Copies each input to its device buffer on the main stream, from its pinned slot when
    /// there are slots; returns the bytes copied.
    fn copy_inputs(&self, m: &Manifest, inputs: &[Tensor]) -> Result<u64> {
        let main = self.streams[0].cu_stream();
        let mut to_device = 0u64;
        for (i, (t, d)) in inputs.iter().zip(&m.inputs).enumerate() {
            let bytes = t.bytes();
            if bytes.is_empty() {
                continue;
            }
            let src = match &self.staging {
                Ok(staging) => staging.fill(i, bytes)?,
                Err(_) => bytes.as_ptr(),
            };
            // SAFETY: the buffer holds the declared size (checked by the caller); `src` (a slot
            // or the caller's tensor) lives until the stream is synchronised.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    self.ptrs[d.buffer],
                    src as *const c_void,
                    bytes.len(),
                    main,
                )
            }
            .result()
            .map_err(driver("copying inputs"))?;
            to_device += bytes.len() as u64;
        }
        Ok(to_device)
    }

    /// Copies each output from its device buffer on the main stream, into its pinned slot when
    /// there are slots, else into `pageable`; returns the bytes copied.
    fn copy_outputs(&self, m: &Manifest, pageable: &mut [Vec<u8>]) -> Result<u64> {
        let main = self.streams[0].cu_stream();
        let mut from_device = 0u64;
        for (i, o) in m.outputs.iter().enumerate() {
            let len = m.buffers[o.buffer].bytes as usize;
            if len == 0 {
                continue;
            }
            let dst = match &self.staging {
                Ok(staging) => staging.output(i),
                Err(_) => pageable[i].as_mut_ptr(),
            };
            // SAFETY: the buffer and `dst` (a slot or a vector of the buffer's size, both alive
            // until the stream is synchronised) hold `len` bytes.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, self.ptrs[o.buffer], len, main)
            }
            .result()
            .map_err(driver("copying outputs"))?;
            from_device += len as u64;
        }
        Ok(from_device)
    }

    /// Enqueues every launch on its stream with the plan's event waits and records, between the
    /// main stream's fork (after the input copies) and join (before the output copies); with
    /// `timing`, an event pair around each launch. The same calls run directly or are captured.
    fn enqueue(&self, m: &Manifest, timing: Option<&ProfileEvents>) -> Result<()> {
        let main = &self.streams[0];
        if let Some(up) = &self.uploaded {
            up.record(main).map_err(driver("cuEventRecord"))?;
            for s in &self.streams[1..] {
                s.wait(up).map_err(driver("cuStreamWaitEvent"))?;
            }
        }
        let mut params: Vec<*mut c_void> = Vec::new();
        let mut values: Vec<sys::CUdeviceptr> = Vec::new();
        for (j, launch) in m.launches.iter().enumerate() {
            let stream = &self.streams[self.plan.stream_of[j]];
            for &i in &self.plan.waits[j] {
                stream
                    .wait(self.events[i].as_ref().expect("planned"))
                    .map_err(driver("cuStreamWaitEvent"))?;
            }
            if let Some(ev) = timing {
                ev[j].0.record(stream).map_err(driver("cuEventRecord"))?;
            }
            let k = &m.kernels[launch.kernel];
            values.clear();
            values.extend(launch.args.iter().map(|&b| self.ptrs[b]));
            params.clear();
            params.extend(values.iter_mut().map(|v| v as *mut sys::CUdeviceptr as *mut c_void));
            let g = (k.grid[0], k.grid[1], k.grid[2]);
            let b = (k.block[0], k.block[1], k.block[2]);
            // SAFETY: the function takes one device pointer per argument (the convention of
            // kiln's GPU code), each to a buffer of the size the compiler planned.
            unsafe {
                result::launch_kernel(
                    self.functions[launch.kernel],
                    g,
                    b,
                    0,
                    stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(|e| RuntimeError::Launch {
                kernel: k.label.clone(),
                msg: format!("cuLaunchKernel: {}", describe(e)),
            })?;
            if let Some(ev) = timing {
                ev[j].1.record(stream).map_err(driver("cuEventRecord"))?;
            }
            if let Some(ev) = &self.events[j] {
                ev.record(stream).map_err(driver("cuEventRecord"))?;
            }
        }
        for &t in &self.plan.joins {
            main.wait(self.events[t].as_ref().expect("planned"))
                .map_err(driver("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Captures the graph when one is due: graphs on, none yet, and a run has launched every
    /// kernel directly. A failed capture turns graphs off for this program, saying why.
    fn capture_when_due(&self, state: &mut RunState, m: &Manifest) {
        if matches!(state.graph, Graph::Pending) && state.direct_runs > 0 {
            state.graph = match self.capture(m) {
                Ok(graph) => Graph::Ready(graph),
                Err(e) => Graph::Off(format!("the capture failed: {e}")),
            };
        }
    }

    /// The launches (with the fork to and join of the side streams) captured from the main
    /// stream into a graph, instantiated and uploaded once. On any failure no stream is left
    /// capturing: a capturing stream refuses ordinary work.
    fn capture(&self, m: &Manifest) -> Result<CudaGraph> {
        let main = &self.streams[0];
        let captured = guarded("capturing a CUDA graph", || {
            main.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver("cuStreamBeginCapture"))?;
            let enqueued = self.enqueue(m, None);
            let ended = main
                .end_capture(sys::CUgraphInstantiate_flags(0))
                .map_err(driver("cuStreamEndCapture or cuGraphInstantiate"));
            enqueued?;
            let graph = ended?.ok_or_else(|| err("the capture holds no work"))?;
            graph.upload().map_err(driver("cuGraphUpload"))?;
            Ok(graph)
        });
        if captured.is_err() {
            self.end_captures();
        }
        captured
    }

    /// Ends any capture a failed one left open on any stream, dropping what it captured.
    fn end_captures(&self) {
        for s in &self.streams {
            let _ = guarded("ending a capture", || {
                let status = s.capture_status().map_err(driver("cuStreamIsCapturing"))?;
                if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    // SAFETY: our stream; the graph it returns, if any, is ours to destroy.
                    let graph = unsafe { result::stream::end_capture(s.cu_stream()) }
                        .map_err(driver("cuStreamEndCapture"))?;
                    if !graph.is_null() {
                        // SAFETY: not instantiated, destroyed once.
                        let _ = unsafe { result::graph::destroy(graph) };
                    }
                }
                Ok(())
            });
        }
    }

    /// Replays the graph on the main stream, when there is one; a failed launch turns graphs off
    /// and the run launches directly.
    fn replay(&self, state: &mut RunState) -> bool {
        let Graph::Ready(graph) = &state.graph else { return false };
        match guarded("cuGraphLaunch", || graph.launch().map_err(driver("cuGraphLaunch"))) {
            Ok(()) => true,
            Err(e) => {
                state.graph = Graph::Off(format!("the graph's launch failed: {e}"));
                false
            }
        }
    }

    /// Waits for every stream, ignoring errors: after a failed run, before host memory a copy
    /// may still use is freed.
    fn settle(&self) {
        for s in &self.streams {
            let _ = s.synchronize();
        }
    }
}

/// A loaded function's registers, static shared memory and local memory (spills), as the driver
/// reports them; `None` when it does not.
fn function_resources(f: sys::CUfunction) -> Option<super::Resources> {
    use sys::CUfunction_attribute_enum as A;
    // SAFETY: `f` is a function of a loaded module.
    let get = |a| unsafe { result::function::get_function_attribute(f, a) }.ok();
    Some(super::Resources {
        registers: u32::try_from(get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?).ok()?,
        shared_bytes: u32::try_from(get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?).ok()?,
        local_bytes: u32::try_from(get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?).ok()?,
    })
}

/// Loads PTX text into the current context. On failure the error carries the JIT's log (a PTX
/// version or target newer than the driver knows, a syntax error).
fn load_ptx(ptx: &CString, target_detail: &str) -> Result<sys::CUmodule> {
    let mut log = vec![0u8; 16 * 1024];
    let mut options = [
        sys::CUjit_option_enum::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option_enum::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut module = std::ptr::null_mut();
    // SAFETY: a NUL-terminated image; the option arrays and the log buffer outlive the call.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            ptx.as_ptr() as *const c_void,
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    match r.result() {
        Ok(()) => Ok(module),
        Err(e) => {
            let end = log.iter().position(|&c| c == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]).trim().to_string();
            let hint = if e.0 == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                " (the PTX is newer than this driver supports: update the driver or compile for an older PTX version)"
            } else {
                ""
            };
            Err(err(format!(
                "the driver rejected the PTX compiled for `{target_detail}`: {}{hint}{}",
                describe(e),
                if log.is_empty() { String::new() } else { format!("\n{log}") }
            )))
        }
    }
}

/// Byte offset of every buffer in the one device allocation, and its size.
fn layout(m: &Manifest) -> (Vec<u64>, u64) {
    let align = |n: u64| n.div_ceil(ALIGN) * ALIGN;
    let mut offsets = vec![0u64; m.buffers.len()];
    let mut total = 0u64;
    for (i, b) in m.buffers.iter().enumerate() {
        if matches!(
            b.kind,
            BufferKind::Input(_)
                | BufferKind::Output(_)
                | BufferKind::Constant(_)
                | BufferKind::Status
        ) {
            offsets[i] = total;
            total = align(total + b.bytes);
        }
    }
    let arena = total;
    total += m.arena_bytes;
    for (i, b) in m.buffers.iter().enumerate() {
        if let BufferKind::Scratch { offset } = b.kind {
            offsets[i] = arena + offset;
        }
    }
    // Aliases last: their target (never an alias) is placed by now.
    for (i, b) in m.buffers.iter().enumerate() {
        if let BufferKind::Alias { of, offset } = b.kind {
            offsets[i] = offsets[of] + offset;
        }
    }
    (offsets, total)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::artifact::{Blob, Target};
    use crate::device::hazard::tests::diamond;

    #[test]
    fn independent_launches_get_their_own_stream_and_events_order_the_rest() {
        let m =
            diamond(Target::Cuda, 4096, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4096 });
        let p = plan_streams(&Hazards::of(&m), MAX_STREAMS);
        // 0 on the main stream, 1 (independent) beside it; 2 follows 1 on its stream and waits
        // for 0; 3 and 4 follow on that stream; the main stream joins it before the outputs.
        assert_eq!(p.stream_of, vec![0, 1, 1, 1, 1]);
        assert_eq!(p.waits, vec![vec![], vec![], vec![0], vec![], vec![]]);
        assert_eq!(p.joins, vec![4]);
        assert_eq!(p.recorded, vec![true, false, false, false, true]);
        assert_eq!(p.streams, 2);
        // One stream: everything in order, no events.
        let p = plan_streams(&Hazards::of(&m), 1);
        assert_eq!((p.stream_of, p.streams, p.joins), (vec![0; 5], 1, vec![]));
        assert!(p.waits.iter().all(|w| w.is_empty()));
    }

    #[test]
    fn layout_keeps_buffers_apart_and_scratch_in_the_arena() {
        let m =
            diamond(Target::Cuda, 4000, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4000 });
        let (o, total) = layout(&m);
        // x, y, o0, o1, w at 256-aligned offsets, then the arena (s0 and s2 share its start).
        assert_eq!(&o[..5], &[0, 4096, 8192, 12288, 16384]);
        assert_eq!((o[5], o[6], o[7]), (20480, 20480 + 4000, 20480));
        assert_eq!(total, 20480 + 8000);
    }

    fn gpu(name: &str, capability: (i32, i32), multiprocessors: i32) -> GpuInfo {
        GpuInfo {
            index: 0,
            name: name.into(),
            compute_capability: capability,
            memory_bytes: 0,
            multiprocessors,
        }
    }

    fn near(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= want * 1e-3)
    }

    #[test]
    fn peaks_come_from_the_attributes_else_the_gpus_name() {
        // The H200 as its driver reports it: 132 SMs at 1.98 GHz, HBM3e at 3.2 GHz on 6144 bits.
        let h200 = gpu("NVIDIA H200", (9, 0), 132);
        let clocks =
            Clocks { core_khz: Some(1_980_000), memory_khz: Some(3_201_000), bus_bits: Some(6144) };
        let p = peaks(&h200, clocks);
        assert!(near(p.flops_per_s, 66.9e12), "{p:?}"); // 132 x 128 lanes x 2 x 1.98 GHz
        assert!(near(p.bytes_per_s, 4.917e12), "{p:?}"); // 2 x 3.201 GHz x 768 bytes
                                                         // The H100 SXM: HBM3 at 2.619 GHz on 5120 bits is its 3.35 TB/s.
        let h100 = gpu("NVIDIA H100 80GB HBM3", (9, 0), 132);
        let clocks =
            Clocks { core_khz: Some(1_980_000), memory_khz: Some(2_619_000), bus_bits: Some(5120) };
        let p = peaks(&h100, clocks);
        assert!(near(p.bytes_per_s, 3.352e12) && near(p.flops_per_s, 66.9e12), "{p:?}");
        // A driver that reports no clocks: the table by name.
        let p = peaks(&h200, Clocks::default());
        assert!(near(p.bytes_per_s, 4.8e12) && near(p.flops_per_s, 66.9e12), "{p:?}");
        assert!(near(peaks(&h100, Clocks::default()).bytes_per_s, 3.35e12));
        // The A100 has 64 f32 lanes an SM: 108 x 64 x 2 x 1.41 GHz = 19.5 TFLOP/s.
        let p = peaks(&gpu("NVIDIA A100-SXM4-80GB", (8, 0), 108), Clocks::default());
        assert!(near(p.bytes_per_s, 2.0e12) && near(p.flops_per_s, 19.49e12), "{p:?}");
        // Unknown by name and unreported: unknown; a reported clock alone gives the compute.
        let other = gpu("NVIDIA GeForce RTX 4090", (8, 9), 128);
        assert_eq!(peaks(&other, Clocks::default()), Peaks::default());
        let p = peaks(&other, Clocks { core_khz: Some(2_520_000), ..Clocks::default() });
        assert!(p.bytes_per_s.is_none() && near(p.flops_per_s, 82.6e12), "{p:?}");
    }

    #[test]
    fn pinned_slots_hold_each_input_and_output_apart() {
        let mut m =
            diamond(Target::Cuda, 4000, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4000 });
        m.buffers[3].bytes = 10;
        let l = staging_layout(&m);
        let slot = |offset, len| Slot { offset, len };
        assert_eq!(l.inputs, vec![slot(0, 4000), slot(4096, 4000)]);
        assert_eq!(l.outputs, vec![slot(8192, 4000), slot(12288, 10)]);
        assert_eq!(l.total, 12544);
        m.inputs.clear();
        m.outputs.clear();
        assert_eq!(staging_layout(&m).total, 0);
    }

    #[test]
    fn graphs_are_on_unless_the_environment_says_0() {
        assert!(graphs_wanted(None) && graphs_wanted(Some("1")));
        assert!(!graphs_wanted(Some("0")) && !graphs_wanted(Some(" 0 ")));
        let mode = RunMode { graph: GraphUse::Off("KILN_CUDA_GRAPH=0".into()), pageable: None };
        assert_eq!(mode.to_string(), "CUDA graph off (KILN_CUDA_GRAPH=0), pinned copies");
        let mode = RunMode { graph: GraphUse::InUse, pageable: Some("no room".into()) };
        assert_eq!(mode.to_string(), "CUDA graph in use, pageable copies (no room)");
    }

    #[test]
    fn without_a_driver_or_a_gpu_loading_is_an_error_not_a_panic() {
        let text = require_driver(false).unwrap_err().to_string();
        assert!(text.starts_with("device cuda: no CUDA driver (libcuda.so) found"), "{text}");
        if driver_present() && gpus().is_ok_and(|g| !g.is_empty()) {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: this machine has a CUDA GPU; the test checks the errors without one"
            );
            return;
        }
        // Here: no driver library, or (Debian's libcuda1 without a GPU) a driver that sees none.
        let m =
            diamond(Target::Cuda, 4096, Blob { offset: 0, len: 4 }, Blob { offset: 0, len: 4096 });
        let art = Artifact { manifest: m, payload: vec![0; 4096] };
        let want = if driver_present() {
            "the CUDA driver is installed but sees no GPU"
        } else {
            "no CUDA driver (libcuda.so) found"
        };
        let e = CudaProgram::load(&art, None).err().expect("no GPU, no program");
        assert!(matches!(e, RuntimeError::Device { ref device, .. } if device == "cuda"), "{e}");
        assert!(e.to_string().contains(want), "{e}");
        // Through the public API too.
        let e = crate::Executable::load(art, &crate::LoadOptions::default())
            .err()
            .expect("no GPU, no executable");
        assert!(e.to_string().starts_with("device cuda: ") && e.to_string().contains(want), "{e}");
        assert_eq!(gpus().map(|g| g.len()).ok(), driver_present().then_some(0));
    }
}
