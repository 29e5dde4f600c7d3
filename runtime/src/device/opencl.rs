//! The OpenCL device: SPIR-V (OpenCL/Kernel flavour) built with `clCreateProgramWithIL`. The
//! loader (libOpenCL.so.1) is opened at run time (opencl3's `dynamic` feature), so kiln starts on
//! machines without one. Kernels take one `cl_mem` per argument.
//!
//! Everything stays on the device between runs: the program, one kernel object per launch with
//! its arguments set at load, the constants (uploaded once), the input and output buffers, and
//! the scratch arena (scratch buffers are sub-buffers of it where their offset meets the device's
//! base address alignment, else buffers of their own). A run writes the inputs, enqueues every
//! launch, and reads the outputs. On an out-of-order queue each launch waits only for the events
//! of the launches it depends on (see `hazard.rs`), so independent launches may overlap.

use std::ptr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kiln_ir::Tensor;
use opencl3::command_queue::{
    CommandQueue, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, CL_QUEUE_PROFILING_ENABLE,
};
use opencl3::context::Context;
use opencl3::device::{
    Device, CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
};
use opencl3::error_codes::{
    ClError, CL_BUILD_PROGRAM_FAILURE, CL_DEVICE_NOT_FOUND, CL_PLATFORM_NOT_FOUND_KHR,
    DLOPEN_RUNTIME_LOAD_FAILED,
};
use opencl3::event::Event;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer, ClMem, CL_MEM_READ_WRITE};
use opencl3::platform::get_platforms;
use opencl3::program::Program;
use opencl3::types::{cl_device_id, cl_event, cl_mem, CL_BLOCKING, CL_NON_BLOCKING};

use super::hazard::Hazards;
use crate::artifact::{Artifact, BufferKind, Manifest};
use crate::executable::{CopySpan, Profile, Track};
use crate::status;
use crate::{Result, RuntimeError};

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Device { device: "opencl".into(), msg: msg.into() }
}

fn cl(what: &str) -> impl Fn(ClError) -> RuntimeError + '_ {
    move |e| err(format!("{what}: {e}"))
}

/// Why OpenCL cannot be listed or used here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenclError {
    #[error(
        "no OpenCL loader (libOpenCL.so.1) found: install one (Debian: ocl-icd-libopencl1) and a platform; `eval \"$(scripts/setup-opencl.sh)\"` sets up Intel's CPU runtime"
    )]
    NoLoader,
    #[error(
        "the OpenCL loader found no platform (no ICD is installed, or OCL_ICD_VENDORS points nowhere); `eval \"$(scripts/setup-opencl.sh)\"` sets up Intel's CPU runtime"
    )]
    NoPlatform,
    /// An OpenCL call failed: what was being done and OpenCL's error.
    #[error("{what}: {error}")]
    Call { what: String, error: String },
}

/// One OpenCL device, numbered across every platform in the loader's order.
#[derive(Clone, Debug)]
pub struct ClDeviceInfo {
    pub index: usize,
    pub platform: String,
    pub platform_version: String,
    pub name: String,
    /// `GPU`, `CPU`, `accelerator` or `other`.
    pub kind: &'static str,
    /// `OpenCL 3.0 ...`
    pub version: String,
    /// The intermediate languages it builds (`SPIR-V_1.0 SPIR-V_1.1 ...`); empty if none.
    pub il_versions: String,
    pub memory_bytes: u64,
    pub compute_units: u32,
    id: cl_device_id,
}

impl ClDeviceInfo {
    /// Whether it builds SPIR-V, the only code kiln gives OpenCL.
    pub fn takes_spirv(&self) -> bool {
        self.il_versions.contains("SPIR-V")
    }

    pub fn describe(&self) -> String {
        format!("opencl:{} {} / {} ({} device)", self.index, self.platform, self.name, self.kind)
    }
}

/// Every device of every platform. No loader, or no platform, is an error saying so.
pub fn devices() -> std::result::Result<Vec<ClDeviceInfo>, OpenclError> {
    let platforms = get_platforms().map_err(|e| match e.0 {
        DLOPEN_RUNTIME_LOAD_FAILED => OpenclError::NoLoader,
        CL_PLATFORM_NOT_FOUND_KHR => OpenclError::NoPlatform,
        _ => OpenclError::Call { what: "listing platforms".into(), error: e.to_string() },
    })?;
    if platforms.is_empty() {
        return Err(OpenclError::NoPlatform);
    }
    let mut out = Vec::new();
    for p in platforms {
        let ids = match p.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(e) if e.0 == CL_DEVICE_NOT_FOUND => continue,
            Err(e) => {
                let what =
                    format!("listing the devices of platform `{}`", p.name().unwrap_or_default());
                return Err(OpenclError::Call { what, error: e.to_string() });
            }
        };
        for id in ids {
            let d = Device::new(id);
            let t = d.dev_type().unwrap_or(0);
            let kind = if t & CL_DEVICE_TYPE_GPU != 0 {
                "GPU"
            } else if t & CL_DEVICE_TYPE_CPU != 0 {
                "CPU"
            } else if t & CL_DEVICE_TYPE_ACCELERATOR != 0 {
                "accelerator"
            } else {
                "other"
            };
            out.push(ClDeviceInfo {
                index: out.len(),
                platform: p.name().unwrap_or_default().trim().to_string(),
                platform_version: p.version().unwrap_or_default().trim().to_string(),
                name: d.name().unwrap_or_default().trim().to_string(),
                kind,
                version: d.version().unwrap_or_default().trim().to_string(),
                // Devices before OpenCL 2.1 do not know the query: they take no IL.
                il_versions: d.il_version().unwrap_or_default().trim().to_string(),
                memory_bytes: d.global_mem_size().unwrap_or(0),
                compute_units: d.max_compute_units().unwrap_or(0),
                id,
            });
        }
    }
    Ok(out)
}

/// The device `index`, or the best one: a GPU that takes SPIR-V on any platform, else a CPU
/// device that does.
pub fn choose(index: Option<usize>) -> Result<ClDeviceInfo> {
    let all = devices()?;
    let list = || {
        all.iter()
            .map(|d| {
                format!(
                    "  {} [IL: {}]",
                    d.describe(),
                    if d.il_versions.is_empty() { "none" } else { &d.il_versions }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if let Some(i) = index {
        let d = all.get(i).ok_or_else(|| {
            err(format!("there is no OpenCL device {i}; the devices are:\n{}", list()))
        })?;
        if !d.takes_spirv() {
            return Err(err(format!(
                "{} does not build SPIR-V (kiln's OpenCL code); the devices are:\n{}",
                d.describe(),
                list()
            )));
        }
        return Ok(d.clone());
    }
    let pick = |kind: &str| all.iter().find(|d| d.kind == kind && d.takes_spirv()).cloned();
    pick("GPU")
        .or_else(|| pick("CPU"))
        .or_else(|| all.iter().find(|d| d.takes_spirv()).cloned())
        .ok_or_else(|| {
            err(format!(
                "no OpenCL device builds SPIR-V (kiln's OpenCL code); the devices are:\n{}",
                list()
            ))
        })
}

/// A command queue: out of order when the device can, with profiling when asked.
fn queue(
    context: &Context,
    device: cl_device_id,
    out_of_order: bool,
    profiling: bool,
) -> Result<CommandQueue> {
    let props = if out_of_order { CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE } else { 0 }
        | if profiling { CL_QUEUE_PROFILING_ENABLE } else { 0 };
    // SAFETY: the device belongs to the context.
    match unsafe { CommandQueue::create_with_properties(context, device, props, 0) } {
        Ok(q) => Ok(q),
        // OpenCL 1.2 platforms have only the older entry point.
        #[allow(deprecated)]
        Err(_) => unsafe { CommandQueue::create(context, device, props) }
            .map_err(cl("creating a command queue")),
    }
}

/// Where each launch's work goes: global and local sizes, in work-items.
struct NdRange {
    global: [usize; 3],
    local: [usize; 3],
}

/// What a run touches, behind the run lock.
struct State {
    queue: CommandQueue,
    /// Made on the first profiled run: profiling can slow a queue, so the plain one has none.
    profiling_queue: Option<CommandQueue>,
    inputs: Vec<Buffer<u8>>,
    outputs: Vec<Buffer<u8>>,
    /// The program's status word, when its kernels take one: reset before each run, read after.
    status: Option<Buffer<u8>>,
}

/// A loaded OpenCL executable.
pub struct OpenclProgram {
    description: String,
    out_of_order: bool,
    state: Mutex<State>,
    /// One per launch, its arguments set at load.
    kernels: Vec<Kernel>,
    ranges: Vec<NdRange>,
    hazards: Hazards,
    load_bytes: u64,
    // Kept alive for the kernels' arguments: constants, the arena, sub-buffers, own scratch.
    _memory: Vec<Buffer<u8>>,
    _program: Option<Program>,
    context: Context,
    device: cl_device_id,
}

// SAFETY: OpenCL objects are thread safe except kernel objects' arguments, which are set only at
// load; runs (which use the kernels and the queues) are serialised by `state`'s lock.
unsafe impl Sync for OpenclProgram {}
unsafe impl Send for OpenclProgram {}

impl OpenclProgram {
    /// Loads a validated OpenCL artifact on device `index` (default: the best, see `choose`).
    pub fn load(artifact: &Artifact, index: Option<usize>) -> Result<OpenclProgram> {
        let m = &artifact.manifest;
        let info = choose(index)?;
        let description = info.describe();
        let device = Device::new(info.id);
        // Device memory, before anything is allocated there (a failed allocation later is the
        // driver's error, reported with the buffer's size).
        if let Ok(total) = device.global_mem_size() {
            crate::memory::check_device(m, &description, total)?;
        }
        let context = Context::from_device(&device).map_err(cl("creating a context"))?;
        let out_of_order = device.queue_on_host_properties().unwrap_or(0)
            & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
            != 0
            && std::env::var_os("KILN_OPENCL_IN_ORDER").is_none();
        let queue = queue(&context, info.id, out_of_order, false)?;

        let code = artifact.blob(m.code)?;
        if code.len() < 20 || code[..4] != [0x03, 0x02, 0x23, 0x07] {
            return Err(err("the code blob is not a SPIR-V module (no SPIR-V magic number)"));
        }
        // A model with nothing to compute (every output empty) has a module without entry points,
        // which OpenCL refuses to build: it needs no program.
        let program = if m.kernels.is_empty() {
            None
        } else {
            let mut program = Program::create_from_il(&context, code).map_err(|e| {
                err(format!("{description} rejected the SPIR-V (clCreateProgramWithIL): {e}"))
            })?;
            if let Err(e) = program.build(&[info.id], "") {
                let log = program.get_build_log(info.id).unwrap_or_default();
                let log = log.trim();
                let what = if e.0 == CL_BUILD_PROGRAM_FAILURE {
                    "building the program failed"
                } else {
                    "building the program"
                };
                return Err(err(format!(
                    "{what} on {description}: {e}{}",
                    if log.is_empty() { String::new() } else { format!("; build log:\n{log}") }
                )));
            }
            Some(program)
        };

        // Memory: inputs, outputs and constants are buffers of their own, scratch lives in the arena.
        let align = (device.mem_base_addr_align().unwrap_or(1024) / 8).max(1) as u64;
        let create = |bytes: u64| {
            // SAFETY: no host pointer; a zero-sized buffer is not allowed, so empty ones get a byte.
            unsafe {
                Buffer::<u8>::create(
                    &context,
                    CL_MEM_READ_WRITE,
                    bytes.max(1) as usize,
                    ptr::null_mut(),
                )
            }
            .map_err(|e| err(format!("cannot allocate {bytes} bytes on {description}: {e}")))
        };
        let mut memory: Vec<Buffer<u8>> = Vec::new();
        let mut mems: Vec<cl_mem> = vec![ptr::null_mut(); m.buffers.len()];
        // Per buffer: the root it lives in (an index into `memory`, or the arena) and its offset there.
        #[derive(Clone, Copy)]
        enum Root {
            Own(usize),
            Arena,
        }
        let mut place: Vec<Option<(Root, u64)>> = vec![None; m.buffers.len()];
        let mut inputs: Vec<Option<Buffer<u8>>> = (0..m.inputs.len()).map(|_| None).collect();
        let mut outputs: Vec<Option<Buffer<u8>>> = (0..m.outputs.len()).map(|_| None).collect();
        let mut status: Option<Buffer<u8>> = None;
        let arena = create(m.arena_bytes)?;
        let mut load_bytes = 0u64;
        for (i, b) in m.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Input(k) => {
                    let buf = create(b.bytes)?;
                    mems[i] = buf.get();
                    inputs[*k] = Some(buf);
                }
                BufferKind::Output(k) => {
                    let buf = create(b.bytes)?;
                    mems[i] = buf.get();
                    outputs[*k] = Some(buf);
                }
                BufferKind::Constant(blob) => {
                    let mut buf = create(b.bytes)?;
                    let src = &artifact.blob(*blob)?[..b.bytes as usize];
                    if !src.is_empty() {
                        // SAFETY: a blocking write of `src` into a buffer at least that large.
                        unsafe { queue.enqueue_write_buffer(&mut buf, CL_BLOCKING, 0, src, &[]) }
                            .map_err(cl("uploading constants"))?;
                        load_bytes += src.len() as u64;
                    }
                    mems[i] = buf.get();
                    place[i] = Some((Root::Own(memory.len()), 0));
                    memory.push(buf);
                }
                BufferKind::Scratch { offset } => {
                    let buf = if b.bytes > 0 && offset % align == 0 {
                        place[i] = Some((Root::Arena, *offset));
                        // SAFETY: inside the arena (validated), at an aligned origin.
                        unsafe {
                            arena.create_sub_buffer(
                                CL_MEM_READ_WRITE,
                                *offset as usize,
                                b.bytes as usize,
                            )
                        }
                        .map_err(cl("creating a sub-buffer"))?
                    } else {
                        // Not aligned for a sub-buffer: memory of its own (scratch shares nothing
                        // with buffers alive at the same time, so this costs only space).
                        place[i] = Some((Root::Own(memory.len()), 0));
                        create(b.bytes)?
                    };
                    mems[i] = buf.get();
                    memory.push(buf);
                }
                BufferKind::Alias { .. } => {}
                // Refused by validation (state is a CPU program's): never here.
                BufferKind::State(_) => {
                    return Err(err("state updated in place is a CPU program's".to_string()))
                }
                // (At most one: validated.)
                BufferKind::Status => {
                    let buf = create(b.bytes)?;
                    mems[i] = buf.get();
                    status = Some(buf);
                }
            }
        }
        // Views: the same cl_mem at offset 0, else a sub-buffer of the memory they live in.
        for (i, b) in m.buffers.iter().enumerate() {
            let BufferKind::Alias { of, offset } = b.kind else { continue };
            if offset == 0 || b.bytes == 0 {
                mems[i] = mems[of];
                continue;
            }
            let (parent, at): (&Buffer<u8>, u64) = match (&m.buffers[of].kind, place[of]) {
                (BufferKind::Input(k), _) => (inputs[*k].as_ref().expect("made above"), offset),
                (BufferKind::Output(k), _) => (outputs[*k].as_ref().expect("made above"), offset),
                (_, Some((Root::Own(r), base))) => (&memory[r], base + offset),
                (_, Some((Root::Arena, base))) => (&arena, base + offset),
                _ => unreachable!("every non-alias buffer is placed"),
            };
            if at % align != 0 {
                return Err(err(format!(
                    "buffer {i} is a view at byte {offset} of buffer {of}; {description} needs sub-buffers aligned to {align} bytes"
                )));
            }
            // SAFETY: inside the parent (validated), at an aligned origin.
            let sub = unsafe {
                parent.create_sub_buffer(CL_MEM_READ_WRITE, at as usize, b.bytes as usize)
            }
            .map_err(cl("creating a sub-buffer"))?;
            mems[i] = sub.get();
            memory.push(sub);
        }
        memory.push(arena);
        // Blocking writes on an out-of-order queue are not reliably complete when they return
        // (seen with Intel's CPU runtime: kernels then read stale constants): wait for them all.
        queue.finish().map_err(cl("uploading constants"))?;

        // One kernel object per launch, arguments bound once.
        let max_wg = device.max_work_group_size().unwrap_or(usize::MAX);
        for (i, k) in m.kernels.iter().enumerate() {
            let threads: u64 = k.block.iter().map(|&b| b as u64).product();
            if threads > max_wg as u64 {
                return Err(err(format!(
                    "kernel {i} (`{}`, {}) asks for {threads} work-items a workgroup; {description} allows {max_wg}",
                    k.symbol, k.label
                )));
            }
        }
        let mut kernels = Vec::with_capacity(m.launches.len());
        let mut ranges = Vec::with_capacity(m.launches.len());
        for (j, launch) in m.launches.iter().enumerate() {
            let k = &m.kernels[launch.kernel];
            let kernel = Kernel::create(
                program.as_ref().expect("built: the manifest has kernels"),
                &k.symbol,
            )
            .map_err(|e| {
                err(format!(
                    "the SPIR-V has no kernel `{}` (kernel {}, {}): {e}",
                    k.symbol, launch.kernel, k.label
                ))
            })?;
            // A kernel built with a fixed LocalSize fails every launch with another local size.
            let fixed = kernel.get_compile_work_group_size(info.id).unwrap_or_default();
            if fixed.len() == 3
                && fixed.iter().any(|&n| n != 0)
                && fixed[..] != k.block.map(|b| b as usize)[..]
            {
                return Err(err(format!(
                    "kernel `{}` ({}) was compiled for workgroups of {fixed:?}; the manifest's block is {:?}",
                    k.symbol, k.label, k.block
                )));
            }
            let nargs = kernel.num_args().map_err(cl("clGetKernelInfo"))? as usize;
            if nargs != launch.args.len() {
                return Err(err(format!(
                    "kernel `{}` ({}) takes {nargs} arguments; launch {j} gives {}",
                    k.symbol,
                    k.label,
                    launch.args.len()
                )));
            }
            for (p, &b) in launch.args.iter().enumerate() {
                // SAFETY: argument `p` of a bare-pointer kernel is a global buffer.
                unsafe { kernel.set_arg(p as u32, &mems[b]) }.map_err(|e| {
                    err(format!("binding argument {p} of `{}` ({}): {e}", k.symbol, k.label))
                })?;
            }
            let global = [0, 1, 2].map(|d| k.grid[d] as usize * k.block[d] as usize);
            ranges.push(NdRange { global, local: k.block.map(|b| b as usize) });
            kernels.push(kernel);
        }
        let take = |v: Vec<Option<Buffer<u8>>>| {
            v.into_iter()
                .map(|b| b.expect("every input and output has a buffer (validated)"))
                .collect()
        };
        let state = State {
            queue,
            profiling_queue: None,
            inputs: take(inputs),
            outputs: take(outputs),
            status,
        };
        Ok(OpenclProgram {
            description,
            out_of_order,
            state: Mutex::new(state),
            kernels,
            ranges,
            hazards: Hazards::of(m),
            load_bytes,
            _memory: memory,
            _program: program,
            context,
            device: info.id,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn load_bytes(&self) -> u64 {
        self.load_bytes
    }

    /// Whether launches run on an out-of-order queue.
    pub fn out_of_order(&self) -> bool {
        self.out_of_order
    }

    /// Writes `inputs`, runs every launch, reads the outputs (as bytes, in order).
    pub fn run(
        &self,
        m: &Manifest,
        inputs: &[Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Vec<u8>>> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        if profile.is_some() && state.profiling_queue.is_none() {
            state.profiling_queue =
                Some(queue(&self.context, self.device, self.out_of_order, true)?);
        }
        let q = if profile.is_some() {
            state.profiling_queue.as_ref().expect("made above")
        } else {
            &state.queue
        };
        // On an in-order queue, order is implicit and events are not needed to express it.
        let ooo = self.out_of_order;
        // The queue is idle here (the last run finished it), so the first command starts about
        // when it is enqueued: a profile places the device's times from that host time.
        let enqueued = Instant::now();
        let mut to_device = 0u64;
        let mut uploads: Vec<Option<Event>> = Vec::with_capacity(inputs.len());
        for (t, buf) in inputs.iter().zip(state.inputs.iter_mut()) {
            let bytes = t.bytes();
            if bytes.is_empty() {
                uploads.push(None);
                continue;
            }
            // SAFETY: the buffer holds the declared size (checked by the caller); `bytes` outlives
            // the `finish` below.
            let ev = unsafe { q.enqueue_write_buffer(buf, CL_NON_BLOCKING, 0, bytes, &[]) }
                .map_err(cl("writing inputs"))?;
            to_device += bytes.len() as u64;
            uploads.push(Some(ev));
        }
        // The status word starts each run reset; launches that take it wait for that.
        let reset = match state.status.as_mut() {
            // SAFETY: the word's buffer holds its 16 bytes; `RESET` is static.
            Some(buf) => Some(
                unsafe { q.enqueue_write_buffer(buf, CL_NON_BLOCKING, 0, &status::RESET, &[]) }
                    .map_err(cl("resetting the status word"))?,
            ),
            None => None,
        };
        let mut done: Vec<Event> = Vec::with_capacity(self.kernels.len());
        let mut wait: Vec<cl_event> = Vec::new();
        for (j, (kernel, r)) in self.kernels.iter().zip(&self.ranges).enumerate() {
            wait.clear();
            if ooo {
                wait.extend(self.hazards.deps[j].iter().map(|&i| done[i].get()));
                wait.extend(
                    self.hazards.inputs_used[j]
                        .iter()
                        .filter_map(|&k| uploads[k].as_ref().map(Event::get)),
                );
                if self.hazards.status_users.binary_search(&j).is_ok() {
                    wait.extend(reset.as_ref().map(Event::get));
                }
            }
            // SAFETY: the kernel's arguments were bound at load to live buffers of the planned sizes.
            let ev = unsafe {
                q.enqueue_nd_range_kernel(
                    kernel.get(),
                    3,
                    ptr::null(),
                    r.global.as_ptr(),
                    r.local.as_ptr(),
                    &wait,
                )
            }
            .map_err(|e| {
                let k = &m.kernels[m.launches[j].kernel];
                RuntimeError::Launch {
                    kernel: k.label.clone(),
                    msg: format!("clEnqueueNDRangeKernel on {}: {e}", self.description),
                }
            })?;
            done.push(ev);
        }
        let mut outputs = Vec::with_capacity(m.outputs.len());
        // The outputs' reads (with their sizes), then the status word's.
        let mut reads = Vec::with_capacity(m.outputs.len());
        let mut read_bytes = Vec::with_capacity(m.outputs.len());
        for (o, buf) in state.outputs.iter().enumerate() {
            let mut host = vec![0u8; m.buffers[m.outputs[o].buffer].bytes as usize];
            if !host.is_empty() {
                wait.clear();
                if ooo {
                    wait.extend(self.hazards.writers_of_output[o].iter().map(|&i| done[i].get()));
                }
                // SAFETY: `host` is the buffer's size and is not touched until `finish` returns.
                reads.push(
                    unsafe { q.enqueue_read_buffer(buf, CL_NON_BLOCKING, 0, &mut host, &wait) }
                        .map_err(cl("reading outputs"))?,
                );
                read_bytes.push(host.len() as u64);
            }
            outputs.push(host);
        }
        let mut word = [0u8; 16];
        if let Some(buf) = state.status.as_ref() {
            wait.clear();
            if ooo {
                wait.extend(self.hazards.status_users.iter().map(|&i| done[i].get()));
            }
            // SAFETY: `word` is the buffer's size and is not touched until `finish` returns.
            reads.push(
                unsafe { q.enqueue_read_buffer(buf, CL_NON_BLOCKING, 0, &mut word, &wait) }
                    .map_err(cl("reading the status word"))?,
            );
        }
        // Everything, not only the reads: the next run reuses the buffers.
        q.finish()
            .map_err(|e| err(format!("running the kernels on {} failed: {e}", self.description)))?;
        drop(reset);
        if let Some(failed) = state.status.as_ref().and_then(|_| status::Reported::decode(&word)) {
            return Err(failed.error(m, None));
        }
        if let Some(p) = profile {
            // The device's clock (ns) from its first command of this run.
            let span = |ev: &Event| match (ev.profiling_command_start(), ev.profiling_command_end())
            {
                (Ok(s), Ok(e)) => Some((s, e.saturating_sub(s))),
                _ => None,
            };
            let written =
                uploads.iter().flatten().zip(inputs.iter().filter(|t| !t.bytes().is_empty()));
            let first = uploads
                .iter()
                .flatten()
                .chain(&done)
                .chain(&reads)
                .filter_map(|e| span(e).map(|s| s.0))
                .min()
                .unwrap_or(0);
            let base = p.since_origin(enqueued);
            let at = |ns: u64| base + Duration::from_nanos(ns.saturating_sub(first));
            for (j, ev) in done.iter().enumerate() {
                let (start, ns) = span(ev).unwrap_or((first, 0));
                p.push_launch(
                    &m.kernels[m.launches[j].kernel].label,
                    Duration::from_nanos(ns),
                    at(start),
                    Track::OpenclQueue,
                );
            }
            let copies = written
                .map(|(ev, t)| (true, t.bytes().len() as u64, ev))
                .chain(read_bytes.iter().zip(&reads).map(|(&n, ev)| (false, n, ev)));
            for (to_device, bytes, ev) in copies {
                if let Some((start, ns)) = span(ev) {
                    p.copies.push(CopySpan {
                        to_device,
                        bytes,
                        start: at(start),
                        time: Duration::from_nanos(ns),
                    });
                }
            }
            p.bytes_to_device += to_device;
            p.bytes_from_device += outputs.iter().map(|o| o.len() as u64).sum::<u64>();
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::artifact::{Blob, BufferDesc, Target};
    use crate::device::hazard::tests::diamond;
    use crate::{Executable, LoadOptions, Profile};

    /// `add` and `mul` on 1024 f32 (testdata/kernels_cl.mlir; made by testdata/gen-spirv.sh).
    const SPIRV: &[u8] = include_bytes!("testdata/kernels_cl.spv");
    const N: usize = 1024;

    /// Whether a platform that builds SPIR-V is here; says loudly when not (past the test
    /// harness's capture, so `cargo test` shows it).
    fn have_platform() -> bool {
        let why = match devices() {
            Ok(d) if d.iter().any(ClDeviceInfo::takes_spirv) => return true,
            Ok(_) => "no OpenCL device builds SPIR-V".to_string(),
            Err(e) => e.to_string(),
        };
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: no OpenCL platform (run scripts/setup-opencl.sh): {why}"
        );
        false
    }

    fn values(f: impl Fn(usize) -> f32) -> Vec<f32> {
        (0..N).map(f).collect()
    }

    fn tensor(v: &[f32]) -> Tensor {
        Tensor::from_slice(&[N], v).unwrap()
    }

    /// The diamond manifest of hazard.rs with the SPIR-V as its code and `w` as its constant.
    fn diamond_artifact(w: &[f32]) -> Artifact {
        let mut payload = SPIRV.to_vec();
        payload.resize(SPIRV.len().div_ceil(64) * 64, 0);
        let consts = Blob { offset: payload.len() as u64, len: (N * 4) as u64 };
        payload.extend(w.iter().flat_map(|x| x.to_le_bytes()));
        let manifest = diamond(
            Target::Opencl,
            (N * 4) as u64,
            Blob { offset: 0, len: SPIRV.len() as u64 },
            consts,
        );
        Artifact { manifest, payload }
    }

    fn check_diamond(exe: &Executable, x: &[f32], y: &[f32], w: &[f32]) {
        let mut profile = Profile::default();
        let out = exe.run_profiled(&[tensor(x), tensor(y)], Some(&mut profile)).unwrap();
        let (o0, o1) = (out[0].as_slice::<f32>().unwrap(), out[1].as_slice::<f32>().unwrap());
        for i in 0..N {
            let want0 = (x[i] + y[i]) + x[i] * w[i];
            assert_eq!(o0[i], want0, "o0[{i}]");
            assert_eq!(o1[i], want0 * w[i] + w[i], "o1[{i}]");
        }
        // The inputs in, the outputs out; the constant went over once, at load.
        assert_eq!((profile.bytes_to_device, profile.bytes_from_device), (2 * 4096, 2 * 4096));
        assert_eq!(
            profile.launches.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
            ["add", "mul", "add", "mul", "add"]
        );
        assert_eq!(exe.load_bytes_to_device(), 4096);
    }

    #[test]
    fn one_launch_adds() {
        if !have_platform() {
            return;
        }
        let mut m = diamond(
            Target::Opencl,
            (N * 4) as u64,
            Blob { offset: 0, len: SPIRV.len() as u64 },
            Blob { offset: 0, len: 0 },
        );
        // x + y straight into o0; no constants, no scratch.
        m.buffers.truncate(3);
        m.outputs.truncate(1);
        m.launches =
            vec![crate::artifact::Launch { kernel: 0, args: vec![0, 1, 2], writes: vec![2] }];
        m.arena_bytes = 0;
        let exe = Executable::load(
            Artifact { manifest: m, payload: SPIRV.to_vec() },
            &LoadOptions::default(),
        )
        .unwrap();
        assert!(exe.device().starts_with("opencl:"), "{}", exe.device());
        let (a, b) = (values(|i| i as f32 * 0.5 - 200.0), values(|i| (i % 13) as f32 - 6.0));
        let out = exe.run(&[tensor(&a), tensor(&b)]).unwrap();
        let c = out[0].as_slice::<f32>().unwrap();
        assert!((0..N).all(|i| c[i] == a[i] + b[i]));
    }

    #[test]
    fn launches_with_scratch_reuse_run_in_dependency_order() {
        if !have_platform() {
            return;
        }
        let w = values(|i| 0.25 + (i % 7) as f32);
        let program = OpenclProgram::load(&diamond_artifact(&w), None).unwrap();
        let _ = writeln!(
            std::io::stderr(),
            "opencl test device: {} (out-of-order queue: {})",
            program.description(),
            program.out_of_order()
        );
        let exe = Executable::load(diamond_artifact(&w), &LoadOptions::default()).unwrap();
        // Twice, with other inputs: the resident buffers and the arena are reused.
        check_diamond(
            &exe,
            &values(|i| i as f32 * 0.5 - 200.0),
            &values(|i| (i % 13) as f32 - 6.0),
            &w,
        );
        check_diamond(&exe, &values(|i| (i % 5) as f32 - 1.5), &values(|i| i as f32 * -0.25), &w);
        // Plain runs (no profiling queue) give the same numbers.
        let (x, y) = (values(|i| i as f32), values(|i| 1.0 - i as f32));
        let out = exe.run(&[tensor(&x), tensor(&y)]).unwrap();
        assert_eq!(
            out[1].as_slice::<f32>().unwrap()[5],
            ((x[5] + y[5]) + x[5] * w[5]) * w[5] + w[5]
        );
    }

    #[test]
    fn unaligned_scratch_and_views_get_memory_that_works() {
        if !have_platform() {
            return;
        }
        let w = values(|i| 1.5 - (i % 3) as f32);
        let mut art = diamond_artifact(&w);
        let m = &mut art.manifest;
        // s1 at an offset no device aligns sub-buffers to: it gets memory of its own.
        m.buffers[6].kind = BufferKind::Scratch { offset: 4096 + 4 };
        m.arena_bytes = 2 * 4096 + 4;
        // Launch 2 reads s1 through a view (offset 0: the same memory).
        m.buffers.push(BufferDesc { bytes: 4096, kind: BufferKind::Alias { of: 6, offset: 0 } });
        m.launches[2].args[1] = 8;
        let exe = Executable::load(art, &LoadOptions::default()).unwrap();
        check_diamond(&exe, &values(|i| i as f32 * 0.125), &values(|i| 3.0 - i as f32), &w);
    }

    #[test]
    fn bad_code_and_missing_kernels_are_errors() {
        if !have_platform() {
            return;
        }
        let w = values(|_| 1.0);
        let mut art = diamond_artifact(&w);
        art.manifest.kernels[1].symbol = "nope".into();
        let e = Executable::load(art, &LoadOptions::default()).err().unwrap().to_string();
        assert!(e.contains("no kernel `nope`"), "{e}");
        let mut art = diamond_artifact(&w);
        art.payload[..4].copy_from_slice(b"\x7fELF");
        let e = Executable::load(art, &LoadOptions::default()).err().unwrap().to_string();
        assert!(e.contains("not a SPIR-V module"), "{e}");
        let mut art = diamond_artifact(&w);
        art.manifest.kernels[0].block = [32, 1, 1];
        art.manifest.kernels[0].grid = [32, 1, 1];
        let e = Executable::load(art, &LoadOptions::default()).err().unwrap().to_string();
        assert!(e.contains("kernel `add` (add) was compiled for workgroups of [64, 1, 1]; the manifest's block is [32, 1, 1]"), "{e}");
        let e = Executable::load(
            diamond_artifact(&w),
            &LoadOptions { device_index: Some(99), ..LoadOptions::default() },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("there is no OpenCL device 99"), "{e}");
    }
}
