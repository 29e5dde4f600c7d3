//! The CUDA device: PTX loaded through the driver API (cudarc, libcuda opened at run time, no
//! NVRTC). Kernels take one device pointer per argument (MLIR's bare-pointer convention).
//!
//! Everything stays on the GPU between runs: the module, the constants (uploaded once at load),
//! and one device allocation holding every input, output and constant, and the scratch arena. A
//! run copies the inputs in, launches every kernel, and copies the outputs out. Launches that do
//! not depend on each other (see `hazard.rs`) go on up to `MAX_STREAMS` streams, ordered by
//! events.

use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use kiln_ir::Tensor;

use super::hazard::{Bits, Hazards};
use crate::artifact::{Artifact, BufferKind, Manifest};
use crate::executable::Profile;
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

/// Timing events for `run_profiled`, made on the first profiled run.
type ProfileEvents = Vec<(CudaEvent, CudaEvent)>;

/// A loaded CUDA executable.
pub struct CudaProgram {
    ctx: Arc<CudaContext>,
    description: String,
    functions: Vec<sys::CUfunction>,
    /// Device address of every buffer.
    ptrs: Vec<sys::CUdeviceptr>,
    plan: StreamPlan,
    streams: Vec<Arc<CudaStream>>,
    /// Per launch, recorded after it when `plan.recorded` says so.
    events: Vec<Option<CudaEvent>>,
    /// Recorded on the main stream once the inputs are copied; side streams wait for it.
    uploaded: Option<CudaEvent>,
    /// One run at a time: the buffers are resident; holds the profiling events once made.
    run_lock: Mutex<Option<ProfileEvents>>,
    load_bytes: u64,
    // Dropped after everything above that refers to them.
    _memory: DeviceMemory,
    _module: Module,
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
        Ok(CudaProgram {
            ctx,
            description,
            functions,
            ptrs,
            plan,
            streams,
            events,
            uploaded,
            run_lock: Mutex::new(None),
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

    /// Copies `inputs` in, runs every launch, copies the outputs out (as bytes, in order).
    pub fn run(
        &self,
        m: &Manifest,
        inputs: &[Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Vec<u8>>> {
        let mut state = self.run_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.bind_to_thread().map_err(driver("binding the context"))?;
        if profile.is_some() && state.is_none() {
            let timed = || {
                self.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("creating an event"))
            };
            *state =
                Some(m.launches.iter().map(|_| Ok((timed()?, timed()?))).collect::<Result<_>>()?);
        }
        let timing = if profile.is_some() { state.as_ref() } else { None };
        let main = &self.streams[0];
        let mut to_device = 0u64;
        for (t, d) in inputs.iter().zip(&m.inputs) {
            let bytes = t.bytes();
            if !bytes.is_empty() {
                // SAFETY: the buffer holds the declared size (checked by the caller); `bytes`
                // lives until the stream is synchronised below.
                unsafe { result::memcpy_htod_async(self.ptrs[d.buffer], bytes, main.cu_stream()) }
                    .map_err(driver("copying inputs"))?;
                to_device += bytes.len() as u64;
            }
        }
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
        let mut outputs = Vec::with_capacity(m.outputs.len());
        for o in &m.outputs {
            let mut host = vec![0u8; m.buffers[o.buffer].bytes as usize];
            if !host.is_empty() {
                // SAFETY: the buffer is this size; `host` outlives the synchronisation below.
                unsafe {
                    result::memcpy_dtoh_async(&mut host, self.ptrs[o.buffer], main.cu_stream())
                }
                .map_err(driver("copying outputs"))?;
            }
            outputs.push(host);
        }
        main.synchronize()
            .map_err(|e| err(format!("running the kernels failed: {}", describe(e))))?;
        if let Some(p) = profile {
            if let Some(ev) = timing {
                for (launch, (start, end)) in m.launches.iter().zip(ev) {
                    let ms = start.elapsed_ms(end).map_err(driver("cuEventElapsedTime"))?;
                    p.launches.push((
                        m.kernels[launch.kernel].label.clone(),
                        Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3),
                    ));
                }
            }
            p.bytes_to_device += to_device;
            p.bytes_from_device += outputs.iter().map(|o| o.len() as u64).sum::<u64>();
        }
        Ok(outputs)
    }
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
        if matches!(b.kind, BufferKind::Input(_) | BufferKind::Output(_) | BufferKind::Constant(_))
        {
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
