//! A loaded artifact ready to run: `Executable::run(inputs) -> outputs`.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_ir::{DType, Tensor};

use crate::artifact::{
    Artifact, BatchDesc, BufferKind, ControlDesc, Manifest, PaddedDesc, Scanned, Stacked,
    StateDesc, Step, Target, TensorDesc, ValueDesc,
};
use crate::device::cpu::CpuProgram;
use crate::device::cuda::{CudaProgram, RunMode};
use crate::device::opencl::OpenclProgram;
use crate::device::{KernelTime, Peaks, Work};
use crate::memory::ScratchAccount;
use crate::status::{KernelFailure, StatusWord};
use crate::{Result, RuntimeError};

/// How to load an executable. The device kind is the artifact's target.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// CPU worker threads (default: every core).
    pub threads: Option<usize>,
    /// Which device of the artifact's target: the CUDA device ordinal (`cuda:N`, default 0) or
    /// the OpenCL device number across platforms (`opencl:N`, as `kiln devices` lists them;
    /// default: the first GPU that builds SPIR-V, else the first such CPU device). The CPU has
    /// only device 0.
    pub device_index: Option<usize>,
    /// The memory budget in bytes: a program whose constants, scratch arena, outputs and
    /// kernel scratch (at its threads) need more is refused at load, naming the largest; what
    /// is left caps the kernels' scratch at run time. Default: the memory available then.
    pub max_memory: Option<u64>,
    /// The most steps one run of a Loop may take: a Loop that would take another fails the
    /// run, naming the node (`--max-loop-steps`). `None`, the default: no limit, as in ONNX,
    /// where a Loop with no trip count runs until its condition turns false, if ever.
    pub max_loop_steps: Option<u64>,
}

impl LoadOptions {
    /// The CPU worker threads a program loaded with these options runs on.
    pub fn cpu_threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// The CPU as `device()` names it: `cpu (16 threads)`.
pub fn cpu_description(threads: usize) -> String {
    format!("cpu ({threads} thread{})", if threads == 1 { "" } else { "s" })
}

/// Per-kernel timings of one run.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// (kernel label, time) per launch, in order. GPU times are the device's (CUDA events,
    /// OpenCL profiling), CPU times the host's.
    pub launches: Vec<(String, Duration)>,
    /// Per launch, beside `launches` (same order, same count): what it moves and computes at
    /// least, from the artifact (`KernelDesc::bytes` and `flops`; 0 where not counted).
    pub work: Vec<Work>,
    /// Bytes copied from the host to the device by this run: the inputs (0 on the CPU: it runs
    /// in place). Constants were copied at load: see `Executable::load_bytes_to_device`.
    pub bytes_to_device: u64,
    /// Bytes copied back: the outputs.
    pub bytes_from_device: u64,
    /// Per launch, beside `launches`: what its function holds on the device, where the device
    /// says (CUDA: registers, shared and local memory).
    pub resources: Vec<Option<crate::device::Resources>>,
    /// The device time of the kernels alone, from the end of the input copies to the start of
    /// the output copies, summed over the device programs the run ran; `None` where the device
    /// does not measure it (CPU, OpenCL).
    pub device_time: Option<Duration>,
    /// The device's peak rates (CUDA), which `kernel_table` measures each kernel against.
    pub peaks: Option<Peaks>,
    /// When the first run recorded into this profile started (set by `run_profiled` when
    /// unset): `starts` and `copies` count from it, so the inner runs of a program of programs
    /// (batch chunks, control flow's steps) and later runs into the same profile share one clock.
    pub origin: Option<Instant>,
    /// Per launch, beside `launches`: when it started, from `origin`. CPU starts are the host's
    /// clock; GPU starts are the device's events, counted from the run's first event, which is
    /// placed at the host time it was enqueued (the device is idle then: the previous run ended
    /// with a synchronisation).
    pub starts: Vec<Duration>,
    /// Per launch, beside `launches`: the queue it ran on, for timelines.
    pub tracks: Vec<Track>,
    /// The copies between host and device (GPUs), on the device's clock as `starts`.
    pub copies: Vec<CopySpan>,
}

/// Where a launch ran, as a timeline draws it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    /// The CPU thread that called `run`: it launches each kernel and takes workgroups with the
    /// pool's workers, so a launch is its span on that thread (which worker ran which
    /// workgroup is not recorded).
    Host,
    /// A CUDA stream of the program, 0 being the one the copies use.
    CudaStream(usize),
    /// The OpenCL command queue.
    OpenclQueue,
    /// The CPU's threads running launches that do not depend on each other at once (a wave of
    /// them); a launch alone in its wave is on `Host`.
    CpuPool,
}

/// A copy between host and device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopySpan {
    /// Host to device (an input), else device to host (an output).
    pub to_device: bool,
    pub bytes: u64,
    /// From `Profile::origin`, on the device's clock as `Profile::starts`.
    pub start: Duration,
    pub time: Duration,
}

impl Profile {
    /// Each launch's time with what it moves and computes, in launch order.
    pub fn kernels(&self) -> Vec<KernelTime> {
        Profile::medians(std::slice::from_ref(self))
    }

    /// Per launch, the median time over `runs` (profiles of runs of one executable), with its
    /// label and work from the first run.
    pub fn medians(runs: &[Profile]) -> Vec<KernelTime> {
        let Some(first) = runs.first() else { return Vec::new() };
        (0..first.launches.len())
            .map(|i| {
                let mut times: Vec<Duration> =
                    runs.iter().filter_map(|p| p.launches.get(i).map(|l| l.1)).collect();
                times.sort();
                KernelTime {
                    label: first.launches[i].0.clone(),
                    time: times[times.len() / 2],
                    work: first.work.get(i).copied().unwrap_or_default(),
                    resources: first.resources.get(i).copied().flatten(),
                }
            })
            .collect()
    }

    /// Records one launch: its label and time, and beside them its start (from `origin`) and
    /// track, so the four lists stay the same length whatever device timed it.
    pub(crate) fn push_launch(
        &mut self,
        label: &str,
        time: Duration,
        start: Duration,
        track: Track,
    ) {
        self.starts.resize(self.launches.len(), Duration::ZERO);
        self.tracks.resize(self.launches.len(), Track::Host);
        self.launches.push((label.to_string(), time));
        self.starts.push(start);
        self.tracks.push(track);
    }

    /// The other launches that ran while launch `i` did on the CPU's threads (`Track::CpuPool`:
    /// a wave of independent launches run at once), in order.
    pub fn concurrent_with(&self, i: usize) -> Vec<usize> {
        let on_pool = |j: usize| self.tracks.get(j) == Some(&Track::CpuPool);
        if !on_pool(i) {
            return Vec::new();
        }
        let span = |j: usize| {
            let start = self.starts.get(j).copied().unwrap_or_default();
            (start, start + self.launches[j].1)
        };
        let (s, e) = span(i);
        (0..self.launches.len())
            .filter(|&j| j != i && on_pool(j))
            .filter(|&j| {
                let (a, b) = span(j);
                a < e && s < b
            })
            .collect()
    }

    /// Time since `origin` (zero before it is set, or for an instant before it).
    pub(crate) fn since_origin(&self, t: Instant) -> Duration {
        self.origin.map_or(Duration::ZERO, |o| t.saturating_duration_since(o))
    }

    /// Adds the work of the launches a run of `m` just appended after the first `before`, so
    /// `work` stays beside `launches` whatever device timed them.
    fn add_work(&mut self, m: &Manifest, before: usize) {
        self.work.resize(before, Work::default());
        let added = self.launches.len().saturating_sub(before);
        let work = m.launches.iter().map(|l| {
            let k = &m.kernels[l.kernel];
            Work { bytes: k.bytes, flops: k.flops }
        });
        self.work.extend(work.chain(std::iter::repeat(Work::default())).take(added));
    }
}

/// 64-byte aligned, zeroed bytes.
struct Aligned {
    words: Vec<u64>,
    offset: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let words = vec![0u64; len.div_ceil(8) + 8];
        let offset = (64 - (words.as_ptr() as usize % 64)) % 64;
        Aligned { words, offset, len }
    }

    fn ptr(&mut self) -> *mut u8 {
        // SAFETY: `offset` is within the allocation (at most 56 of the 64 spare bytes).
        unsafe { (self.words.as_mut_ptr() as *mut u8).add(self.offset) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let (o, n) = (self.offset, self.len);
        &mut bytemuck_bytes_mut(&mut self.words)[o..o + n]
    }
}

fn bytemuck_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: any u64 storage is valid as bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, words.len() * 8) }
}

/// What a CPU run writes besides its outputs: the scratch arena and the status word.
struct RunMemory {
    arena: Aligned,
    status: StatusWord,
}

/// The CPU's loaded state: the code, the constants in one aligned block, the arena.
struct Cpu {
    program: CpuProgram,
    constants: Aligned,
    /// Where each constant buffer starts in `constants`.
    constant_offsets: Vec<Option<usize>>,
    /// One run at a time uses the arena and the status word.
    arena: Mutex<RunMemory>,
    /// Each output's buffer of the last run: the tensors returned share it, and a run writes it
    /// again once the tensors over it are all dropped (warm pages, no copy), else takes a new
    /// one.
    outputs: Mutex<Vec<Option<Arc<[u64]>>>>,
    /// The artifact's kernel scratch, for the error of an allocation it refused.
    scratch: Arc<ScratchAccount>,
    /// The launches in waves of independent ones (`Hazards::waves`), each wave run at once.
    waves: Vec<Vec<usize>>,
}

enum Program {
    Cpu(Cpu),
    Cuda(CudaProgram),
    Opencl(OpenclProgram),
    /// A symbolic batch: one loaded program per compiled batch size, largest first.
    Batched(Vec<(usize, Executable)>),
    /// Run-time control flow: the loaded programs its steps run (`Manifest::control`).
    Control(Vec<Executable>),
    /// A padded symbol: the one program, compiled at the capacity (`Manifest::padded`).
    Padded(Box<Executable>),
}

/// `1 thread`, `4 threads`.
fn threads_text(threads: usize) -> String {
    format!("{threads} thread{}", if threads == 1 { "" } else { "s" })
}

/// What loading a manifest holds, counted before any of it is allocated.
struct Needs {
    /// Constants, arenas and outputs (`None`: past a u64).
    other: Option<u64>,
    /// The kernels' own scratch, where bounded (`None`: past a u64).
    kernels: Option<u64>,
    /// The largest single item: its bytes, and what it is in words.
    largest: (u64, String),
}

impl Needs {
    fn of(m: &Manifest, threads: usize) -> Needs {
        let mut n = Needs { other: Some(0), kernels: Some(0), largest: (0, String::new()) };
        n.add(m, threads);
        n
    }

    fn total(&self) -> Option<u64> {
        self.other?.checked_add(self.kernels?)
    }

    fn add(&mut self, m: &Manifest, threads: usize) {
        let nested: Vec<&Manifest> = m
            .batch
            .iter()
            .flat_map(|b| b.programs.iter().map(|p| &p.manifest))
            .chain(m.control.iter().flat_map(|c| &c.programs))
            .chain(m.padded.iter().map(|p| &*p.program))
            .collect();
        for n in nested {
            self.add(n, threads);
        }
        self.other = self.other.and_then(|t| t.checked_add(m.arena_bytes));
        if m.arena_bytes > self.largest.0 {
            self.largest = (m.arena_bytes, "a scratch arena".to_string());
        }
        // (State is the caller's memory, as inputs are: not counted here.)
        for b in &m.buffers {
            let name = match b.kind {
                BufferKind::Constant(_) => "a constant".to_string(),
                BufferKind::Output(i) => match m.outputs.get(i) {
                    Some(o) => {
                        let dims: Vec<String> = o.dims.iter().map(usize::to_string).collect();
                        format!("output `{}` ({}[{}])", o.name, o.dtype, dims.join(","))
                    }
                    None => format!("output {i}"),
                },
                _ => continue,
            };
            let held = b.bytes.div_ceil(64) * 64;
            self.other = self.other.and_then(|t| t.checked_add(held));
            if b.bytes > self.largest.0 {
                self.largest = (b.bytes, name);
            }
        }
        // Kernel scratch where the artifact bounds it; each program's library keeps its own.
        if let Some(s) = &m.scratch {
            let bytes = crate::memory::scratch_bytes(s, threads);
            self.kernels = self.kernels.zip(bytes).and_then(|(t, b)| t.checked_add(b));
            // Named by the kernel that asks most of a thread.
            let most = m.kernels.iter().zip(&s.kernels).max_by_key(|(_, &b)| b);
            if let (Some((k, &each)), Some(all)) = (most, bytes) {
                if all > self.largest.0 && each > 0 {
                    self.largest = (
                        all,
                        format!(
                            "the kernels' scratch at {} ({all} bytes; kernel `{}` asks {each} of a thread)",
                            threads_text(threads),
                            k.label
                        ),
                    );
                }
            }
        }
    }
}

/// A compiled model, loaded once (code, constants), run many times.
pub struct Executable {
    manifest: Manifest,
    program: Program,
    /// `LoadOptions::max_loop_steps`, for the Loops its control flow runs.
    max_loop_steps: Option<u64>,
    /// The kernel scratch of the whole artifact (every program of it shares it).
    scratch: Arc<ScratchAccount>,
}

impl Executable {
    /// Reads an artifact file and loads it.
    pub fn load_file(path: &Path, options: &LoadOptions) -> Result<Executable> {
        Executable::load(Artifact::read(path)?, options)
    }

    /// Loads an artifact: its code onto the device, its constants into (device) memory, once.
    pub fn load(artifact: Artifact, options: &LoadOptions) -> Result<Executable> {
        // Hand-built artifacts have not been through `from_bytes`.
        artifact
            .validate()
            .map_err(|msg| RuntimeError::Artifact { path: artifact.manifest.model.clone(), msg })?;
        // Everything every program will hold, against the budget, before anything is allocated;
        // what is left of it caps the kernels' scratch at run time, whatever the artifact says.
        let budget = crate::memory::budget(options.max_memory);
        let left = Executable::check_memory(&artifact.manifest, budget, options.cpu_threads())?;
        let scratch = Arc::new(ScratchAccount::new(left));
        if artifact.manifest.batch.is_none()
            && artifact.manifest.control.is_none()
            && artifact.manifest.padded.is_none()
        {
            let program = Executable::load_static(&artifact, options, &scratch)?;
            return Ok(Executable {
                manifest: artifact.manifest,
                program,
                max_loop_steps: options.max_loop_steps,
                scratch,
            });
        }
        // Each program reads its blobs from the one payload.
        let Artifact { manifest, payload } = artifact;
        let mut one = Artifact { manifest: manifest.clone(), payload };
        Executable::load_nested(&mut one, &manifest, options, &scratch)
    }

    /// Loads `m`, a manifest inside `one`'s (a batch's or control flow's program, or the
    /// outermost), whose blobs are in `one`'s payload.
    /// `scratch` is the artifact's one account, which every program's kernels share.
    fn load_nested(
        one: &mut Artifact,
        m: &Manifest,
        options: &LoadOptions,
        scratch: &Arc<ScratchAccount>,
    ) -> Result<Executable> {
        let program = if let Some(b) = &m.batch {
            let programs = b.programs.iter().map(|p| {
                Ok((p.batch as usize, Executable::load_nested(one, &p.manifest, options, scratch)?))
            });
            Program::Batched(programs.collect::<Result<_>>()?)
        } else if let Some(c) = &m.control {
            Program::Control(
                c.programs
                    .iter()
                    .map(|p| Executable::load_nested(one, p, options, scratch))
                    .collect::<Result<_>>()?,
            )
        } else if let Some(p) = &m.padded {
            Program::Padded(Box::new(Executable::load_nested(one, &p.program, options, scratch)?))
        } else {
            one.manifest = m.clone();
            Executable::load_static(one, options, scratch)?
        };
        Ok(Executable {
            manifest: m.clone(),
            program,
            max_loop_steps: options.max_loop_steps,
            scratch: scratch.clone(),
        })
    }

    fn load_static(
        artifact: &Artifact,
        options: &LoadOptions,
        scratch: &Arc<ScratchAccount>,
    ) -> Result<Program> {
        Ok(match artifact.manifest.target {
            Target::Cpu => Program::Cpu(Executable::load_cpu(artifact, options, scratch)?),
            Target::Cuda => Program::Cuda(CudaProgram::load(artifact, options.device_index)?),
            Target::Opencl => Program::Opencl(OpenclProgram::load(artifact, options.device_index)?),
        })
    }

    fn load_cpu(
        artifact: &Artifact,
        options: &LoadOptions,
        scratch: &Arc<ScratchAccount>,
    ) -> Result<Cpu> {
        let m = &artifact.manifest;
        if let Some(i) = options.device_index.filter(|&i| i != 0) {
            return Err(RuntimeError::Device {
                device: "cpu".into(),
                msg: format!("there is no CPU device {i}: the CPU is device 0"),
            });
        }
        let threads = options.cpu_threads();
        crate::device::cpu::check_host_features(&m.cpu_features)?;
        let symbols: Vec<String> = m.kernels.iter().map(|k| k.symbol.clone()).collect();
        let program = CpuProgram::load(artifact.blob(m.code)?, &symbols, threads, scratch.clone())?;
        // Constants go into one aligned block, each at a 64-byte boundary.
        let mut offsets = vec![None; m.buffers.len()];
        let mut total = 0usize;
        for (i, b) in m.buffers.iter().enumerate() {
            if let BufferKind::Constant(_) = b.kind {
                offsets[i] = Some(total);
                total += (b.bytes as usize).div_ceil(64) * 64;
            }
        }
        let mut constants = Aligned::new(total);
        for (i, b) in m.buffers.iter().enumerate() {
            if let (BufferKind::Constant(blob), Some(at)) = (&b.kind, offsets[i]) {
                let src = artifact.blob(*blob)?;
                constants.bytes_mut()[at..at + b.bytes as usize]
                    .copy_from_slice(&src[..b.bytes as usize]);
            }
        }
        let arena = Mutex::new(RunMemory {
            arena: Aligned::new(m.arena_bytes as usize),
            status: StatusWord::default(),
        });
        Ok(Cpu {
            program,
            constants,
            constant_offsets: offsets,
            arena,
            outputs: Mutex::new(vec![None; m.outputs.len()]),
            scratch: scratch.clone(),
            waves: crate::device::hazard::Hazards::of(m).waves(),
        })
    }

    /// What an artifact's programs allocate (each its constants, once; its arena, once; its
    /// outputs, per run; its kernels' scratch, per thread), all of them together, against
    /// `limit`, before any of it is: an error naming the largest. Returns what the kernels'
    /// scratch may take at run time (`memory::scratch_limit`).
    fn check_memory(m: &Manifest, limit: u64, threads: usize) -> Result<u64> {
        let needs = Needs::of(m, threads);
        let what = if needs.kernels == Some(0) {
            "its constants, scratch arena and outputs".to_string()
        } else {
            format!(
                "its constants, scratch arena, outputs and kernel scratch at {}",
                threads_text(threads)
            )
        };
        crate::memory::check(
            &format!("`{}` ({what}; the largest is {})", m.model, needs.largest.1),
            needs.total(),
            limit,
        )?;
        Ok(crate::memory::scratch_limit(limit, needs.other))
    }

    /// The bytes loading `m` allocates and a run holds: every program's constants, scratch
    /// arena and outputs, and its kernels' own scratch at `threads` CPU threads where the
    /// artifact bounds it (`None` when that overflows a u64). `LoadOptions::max_memory` bounds
    /// it.
    pub fn memory_needed(m: &Manifest, threads: usize) -> Option<u64> {
        Needs::of(m, threads).total()
    }

    pub fn inputs(&self) -> &[TensorDesc] {
        &self.manifest.inputs
    }

    pub fn outputs(&self) -> &[TensorDesc] {
        &self.manifest.outputs
    }

    /// The tensors it updates in place (`Manifest::state`): each run takes them beside the
    /// inputs (`run_with_state`). Empty for an artifact compiled without `Options::in_place`.
    pub fn state(&self) -> &[StateDesc] {
        &self.manifest.state
    }

    /// The symbolic batch, when the artifact was compiled for one: `inputs()` and `outputs()`
    /// then give one sample's sizes, and a run takes any batch in `min..=max` on the axis of
    /// each tensor it marks.
    pub fn batch(&self) -> Option<&BatchDesc> {
        self.manifest.batch.as_ref()
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The target it was compiled for (and so the kind of device it runs on).
    pub fn target(&self) -> Target {
        self.manifest.target
    }

    /// The device it runs on, in words: `cpu (16 threads)`, `cuda:0 NVIDIA H100 (sm_90)`,
    /// `opencl:0 Intel(R) OpenCL / AMD EPYC 9B14 (CPU device)`.
    pub fn device(&self) -> String {
        match &self.program {
            Program::Cpu(c) => cpu_description(c.program.threads()),
            Program::Cuda(p) => p.description().to_string(),
            Program::Opencl(p) => p.description().to_string(),
            Program::Batched(ps) => ps[0].1.device(),
            Program::Control(ps) => ps[0].device(),
            Program::Padded(p) => p.device(),
        }
    }

    /// The most kernel scratch (the CPU's C kernels' scratch and MLIR's temporaries, every
    /// thread's) this artifact's kernels have held at once since it was loaded, in bytes.
    pub fn kernel_scratch_peak(&self) -> u64 {
        self.scratch.peak()
    }

    /// What the kernels' scratch may hold at once: the memory budget less what the load counted
    /// of everything else. An allocation past it fails the run naming the kernel.
    pub fn kernel_scratch_limit(&self) -> u64 {
        self.scratch.limit()
    }

    /// Bytes copied to the device once, at load (the constants); 0 on the CPU.
    pub fn load_bytes_to_device(&self) -> u64 {
        match &self.program {
            Program::Cpu(_) => 0,
            Program::Cuda(p) => p.load_bytes(),
            Program::Opencl(p) => p.load_bytes(),
            Program::Batched(ps) => ps.iter().map(|(_, e)| e.load_bytes_to_device()).sum(),
            Program::Control(ps) => ps.iter().map(Executable::load_bytes_to_device).sum(),
            Program::Padded(p) => p.load_bytes_to_device(),
        }
    }

    /// Runs on `inputs` (in declared order) and returns the outputs (in declared order).
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run_profiled(inputs, None)
    }

    /// Runs, recording per-launch times and the bytes copied into `profile` when given.
    pub fn run_profiled(
        &self,
        inputs: &[Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Tensor>> {
        self.run_profiled_with_state(inputs, &mut [], profile)
    }

    /// Runs a program with state (`state()`, in that order): the kernels read each state
    /// tensor's value and write its new value over it, in its bytes (no copy; a tensor that
    /// shares its bytes with another is first copied, so the other keeps the old value, see
    /// `Tensor::bytes_mut`). The caller keeps them from run to run: a training step's
    /// parameters, optimizer state and running statistics. After an error their values are
    /// unspecified (a kernel may have updated some).
    pub fn run_with_state(&self, inputs: &[Tensor], state: &mut [Tensor]) -> Result<Vec<Tensor>> {
        self.run_profiled_with_state(inputs, state, None)
    }

    /// [`run_with_state`](Self::run_with_state), profiled as [`run_profiled`](Self::run_profiled).
    pub fn run_profiled_with_state(
        &self,
        inputs: &[Tensor],
        state: &mut [Tensor],
        mut profile: Option<&mut Profile>,
    ) -> Result<Vec<Tensor>> {
        let m = &self.manifest;
        self.check_state(state)?;
        // The outermost run sets the clock every start counts from; inner runs keep it.
        if let Some(p) = profile.as_deref_mut() {
            p.origin.get_or_insert_with(Instant::now);
        }
        if let (Program::Padded(program), Some(padded)) = (&self.program, &m.padded) {
            return self.run_padded(padded, program, inputs, profile);
        }
        if let (Program::Batched(programs), Some(batch)) = (&self.program, &m.batch) {
            return self.run_batched(batch, programs, inputs, profile);
        }
        self.check_inputs(inputs)?;
        if let (Program::Control(programs), Some(control)) = (&self.program, &m.control) {
            return run_control(control, programs, inputs, self.max_loop_steps, profile);
        }
        let before = profile.as_ref().map_or(0, |p| p.launches.len());
        let outputs = match &self.program {
            Program::Cpu(cpu) => self.run_cpu(cpu, inputs, state, profile.as_deref_mut())?,
            Program::Cuda(p) => output_tensors(m, &p.run(m, inputs, profile.as_deref_mut())?)?,
            Program::Opencl(p) => output_tensors(m, &p.run(m, inputs, profile.as_deref_mut())?)?,
            Program::Batched(_) | Program::Control(_) | Program::Padded(_) => {
                unreachable!("a program of programs has its description (validated at load)")
            }
        };
        if let Some(p) = profile {
            p.add_work(m, before);
            p.peaks = p.peaks.or(self.peaks());
            // What each launch's function holds on the device (CUDA), beside `launches`.
            p.resources.resize(before, None);
            let added = p.launches.len().saturating_sub(before);
            let of = |l: &crate::artifact::Launch| match &self.program {
                Program::Cuda(c) => c.resources(l.kernel),
                _ => None,
            };
            let res = m.launches.iter().map(of).chain(std::iter::repeat(None)).take(added);
            p.resources.extend(res);
        }
        Ok(outputs)
    }

    /// The device's peak rates, where known (CUDA: from the GPU's attributes, else its name).
    pub fn peaks(&self) -> Option<Peaks> {
        match &self.program {
            Program::Cuda(p) => Some(p.peaks()),
            Program::Cpu(_) | Program::Opencl(_) => None,
            Program::Batched(ps) => ps.first().and_then(|(_, e)| e.peaks()),
            Program::Control(ps) => ps.first().and_then(Executable::peaks),
            Program::Padded(p) => p.peaks(),
        }
    }

    /// The device time of every run so far, kernels alone (without the input and output
    /// copies), over every program: the difference across a run is that run's. `None` where the
    /// device does not measure it (CPU, OpenCL) or a measurement failed.
    pub fn device_time_spent(&self) -> Option<Duration> {
        match &self.program {
            Program::Cuda(p) => p.device_time_spent(),
            Program::Cpu(_) | Program::Opencl(_) => None,
            Program::Batched(ps) => ps.iter().map(|(_, e)| e.device_time_spent()).sum(),
            Program::Control(ps) => ps.iter().map(Executable::device_time_spent).sum(),
            Program::Padded(p) => p.device_time_spent(),
        }
    }

    /// How plain CUDA runs go (`None` off CUDA): replaying a CUDA graph or launching directly,
    /// copying through pinned or pageable host memory (see `docs/devices.md`).
    pub fn cuda_run_mode(&self) -> Option<RunMode> {
        match &self.program {
            Program::Cuda(p) => Some(p.run_mode()),
            Program::Cpu(_) | Program::Opencl(_) => None,
            Program::Batched(ps) => ps.first().and_then(|(_, e)| e.cuda_run_mode()),
            Program::Control(ps) => ps.first().and_then(Executable::cuda_run_mode),
            Program::Padded(p) => p.cuda_run_mode(),
        }
    }

    fn run_cpu(
        &self,
        cpu: &Cpu,
        inputs: &[Tensor],
        state: &mut [Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Tensor>> {
        cpu.program.prepare();
        let m = &self.manifest;
        let mut pool = cpu.outputs.lock().unwrap_or_else(|p| p.into_inner());
        let mut outputs: Vec<Arc<[u64]>> = m
            .outputs
            .iter()
            .zip(pool.iter_mut())
            .map(|(o, kept)| {
                let free =
                    kept.take().filter(|a| Arc::strong_count(a) == 1 && Arc::weak_count(a) == 0);
                match free {
                    Some(a) => a,
                    None => {
                        let words = (m.buffers[o.buffer].bytes as usize).div_ceil(8).max(1);
                        // SAFETY: zeroed u64s are initialised.
                        unsafe { Arc::<[u64]>::new_zeroed_slice(words).assume_init() }
                    }
                }
            })
            .collect();
        // One run at a time uses the arena and the status word.
        let mut memory = cpu.arena.lock().unwrap_or_else(|p| p.into_inner());
        memory.status.reset();
        let arena_ptr = memory.arena.ptr();
        let status_ptr = memory.status.as_ptr();
        let constants_ptr = cpu.constants.words.as_ptr() as *mut u8;
        let constants_base = cpu.constants.offset;
        // SAFETY: the kernels write values of each state tensor's type (checked against the
        // manifest), and the tensors are borrowed mutably for the whole run.
        let state_ptrs: Vec<*mut u8> =
            state.iter_mut().map(|t| unsafe { t.bytes_mut() }.as_mut_ptr()).collect();
        let mut ptrs: Vec<*mut u8> = vec![std::ptr::null_mut(); m.buffers.len()];
        for (i, b) in m.buffers.iter().enumerate() {
            ptrs[i] = match &b.kind {
                // Kernels never write inputs; the pointer is cast for the uniform signature.
                BufferKind::Input(k) => inputs[*k].bytes().as_ptr() as *mut u8,
                BufferKind::Output(k) => {
                    Arc::get_mut(&mut outputs[*k]).expect("not shared").as_mut_ptr() as *mut u8
                }
                // SAFETY: offsets were planned inside the constant block at load.
                BufferKind::Constant(_) => unsafe {
                    constants_ptr
                        .add(constants_base + cpu.constant_offsets[i].expect("planned at load"))
                },
                // SAFETY: validated at load: inside the arena.
                BufferKind::Scratch { offset } => unsafe { arena_ptr.add(*offset as usize) },
                BufferKind::Alias { .. } => std::ptr::null_mut(),
                // Validated at load: the word's 16 bytes, the only one.
                BufferKind::Status => status_ptr,
                // Checked above: the state's type, so its bytes.
                BufferKind::State(k) => state_ptrs[*k],
            };
        }
        for (i, b) in m.buffers.iter().enumerate() {
            if let BufferKind::Alias { of, offset } = b.kind {
                // SAFETY: validated at load: inside the aliased buffer, which is not an alias.
                ptrs[i] = unsafe { ptrs[of].add(offset as usize) };
            }
        }
        let ran = run_cpu_launches(cpu, m, &ptrs, &memory.status, profile);
        drop(memory);
        if let Err(e) = ran {
            // The buffers go back for the next run; what they hold now is not returned.
            keep_outputs(&mut pool, outputs);
            return Err(e);
        }
        let tensors = m
            .outputs
            .iter()
            .zip(&outputs)
            .map(|(o, buf)| {
                let dtype = DType::from_name(&o.dtype).expect("validated at load");
                Tensor::from_shared_words(dtype, &o.dims, buf.clone()).map_err(|e| {
                    RuntimeError::Launch { kernel: "output".into(), msg: e.to_string() }
                })
            })
            .collect();
        keep_outputs(&mut pool, outputs);
        tensors
    }

    /// The address of output `i`'s buffer that the last CPU run wrote (`None` before a run, off
    /// the CPU, or past the outputs): a caller can see that runs reuse buffers rather than
    /// allocate.
    pub fn output_address(&self, i: usize) -> Option<usize> {
        match &self.program {
            Program::Cpu(cpu) => {
                let pool = cpu.outputs.lock().unwrap_or_else(|p| p.into_inner());
                pool.get(i)?.as_ref().map(|a| a.as_ptr() as usize)
            }
            _ => None,
        }
    }

    /// The state a run is given: one tensor per `state()` entry, of its type.
    fn check_state(&self, state: &[Tensor]) -> Result<()> {
        let want = &self.manifest.state;
        if state.len() != want.len() {
            let names: Vec<&str> = want.iter().map(|s| s.input.as_str()).collect();
            return Err(RuntimeError::Input {
                name: self.manifest.model.clone(),
                msg: if want.is_empty() {
                    format!("takes no state, {} state tensors given", state.len())
                } else {
                    format!(
                        "updates {} tensors in place ({}): run it with them (`run_with_state`), {} given",
                        want.len(),
                        names.join(", "),
                        state.len()
                    )
                },
            });
        }
        for (t, d) in state.iter().zip(want) {
            if t.dtype().name() != d.dtype || t.dims() != d.dims.as_slice() {
                return Err(RuntimeError::Input {
                    name: d.input.clone(),
                    msg: format!("expected {}{:?} (state), got {}", d.dtype, d.dims, t.ty()),
                });
            }
        }
        Ok(())
    }

    /// A batch of `n`: split into chunks of the programs' sizes, largest first; each chunk runs
    /// on its rows of the batched inputs, and its rows of the batched outputs are copied into
    /// place. A batch that one program covers runs on the inputs as they are.
    /// A padded symbol: the size read off the inputs (equal wherever the symbol is, at most the
    /// capacity), the padded axes zero-filled to the capacity, the size passed last, the padded
    /// outputs cut back.
    fn run_padded(
        &self,
        padded: &PaddedDesc,
        program: &Executable,
        inputs: &[Tensor],
        profile: Option<&mut Profile>,
    ) -> Result<Vec<Tensor>> {
        let want = &self.manifest.inputs;
        let sym = &padded.symbol;
        let axis_of = |i: usize| padded.inputs.iter().find(|a| a.tensor == i).map(|a| a.axis);
        let shape =
            |i: usize, d: &TensorDesc| {
                let dims: Vec<String> =
                    d.dims
                        .iter()
                        .enumerate()
                        .map(|(k, n)| {
                            if axis_of(i) == Some(k) {
                                format!("{sym}<={n}")
                            } else {
                                n.to_string()
                            }
                        })
                        .collect();
                format!("{}[{}]", d.dtype, dims.join(","))
            };
        if inputs.len() != want.len() {
            let list: Vec<String> = want
                .iter()
                .enumerate()
                .map(|(i, d)| format!("{}: {}", d.name, shape(i, d)))
                .collect();
            return Err(RuntimeError::Input {
                name: self.manifest.model.clone(),
                msg: format!(
                    "expects {} inputs ({}), {} given",
                    want.len(),
                    list.join(", "),
                    inputs.len()
                ),
            });
        }
        let mut size: Option<(usize, &str)> = None;
        for (i, (t, d)) in inputs.iter().zip(want).enumerate() {
            let axis = axis_of(i);
            let fits = t.dtype().name() == d.dtype
                && t.rank() == d.dims.len()
                && t.dims().iter().zip(&d.dims).enumerate().all(|(k, (a, b))| {
                    if axis == Some(k) {
                        a <= b
                    } else {
                        a == b
                    }
                });
            if !fits {
                return Err(RuntimeError::Input {
                    name: d.name.clone(),
                    msg: format!("expected {}, got {}", shape(i, d), t.ty()),
                });
            }
            if let Some(k) = axis {
                agree(&mut size, t.dims()[k], &d.name, sym, "the inputs")?;
            }
        }
        let (n, _) = size.expect("a padded artifact pads an input (validated at load)");
        let moved =
            |e: kiln_ir::IrError| RuntimeError::Launch { kernel: "pad".into(), msg: e.to_string() };
        let mut args: Vec<Tensor> = inputs.to_vec();
        for a in &padded.inputs {
            args[a.tensor] =
                inputs[a.tensor].resize_axis(a.axis, padded.capacity as usize).map_err(moved)?;
        }
        args.push(Tensor::scalar::<i64>(n as i64));
        let mut outs = program.run_profiled(&args, profile)?;
        for a in &padded.outputs {
            outs[a.tensor] =
                outs[a.tensor].resize_axis(a.axis, n + a.extra as usize).map_err(moved)?;
        }
        Ok(outs)
    }

    fn run_batched(
        &self,
        batch: &BatchDesc,
        programs: &[(usize, Executable)],
        inputs: &[Tensor],
        mut profile: Option<&mut Profile>,
    ) -> Result<Vec<Tensor>> {
        let n = self.check_batched_inputs(batch, inputs)?;
        let mut chunks: Vec<(usize, usize)> = Vec::new(); // (program, size)
        let mut left = n;
        for (i, &(size, _)) in programs.iter().enumerate() {
            while left >= size {
                chunks.push((i, size));
                left -= size;
            }
        }
        if let [(p, _)] = chunks[..] {
            return programs[p].1.run_profiled(inputs, profile);
        }
        let out_descs = &self.manifest.outputs;
        let mut rows: Vec<Option<Vec<u8>>> = vec![None; out_descs.len()];
        let mut free: Vec<Option<Tensor>> = vec![None; out_descs.len()];
        let mut at = 0usize;
        for (p, size) in chunks {
            let part: Vec<Tensor> = inputs
                .iter()
                .zip(&batch.inputs)
                .map(|(t, &batched)| if batched { rows_of(t, at, size) } else { Ok(t.clone()) })
                .collect::<Result<_>>()?;
            let results = programs[p].1.run_profiled(&part, profile.as_deref_mut())?;
            for (o, r) in results.into_iter().enumerate() {
                if !batch.outputs[o] {
                    free[o].get_or_insert(r);
                    continue;
                }
                let row = r.bytes().len() / size;
                let buf = rows[o].get_or_insert_with(|| vec![0u8; row * n]);
                buf[at * row..(at + size) * row].copy_from_slice(r.bytes());
            }
            at += size;
        }
        out_descs
            .iter()
            .enumerate()
            .map(|(o, d)| match (free[o].take(), &rows[o]) {
                (Some(t), _) => Ok(t),
                (None, Some(bytes)) => {
                    let dtype = DType::from_name(&d.dtype).expect("validated at load");
                    let mut dims = d.dims.clone();
                    dims[0] = n;
                    Tensor::from_bytes(dtype, &dims, bytes).map_err(|e| RuntimeError::Launch {
                        kernel: "output".into(),
                        msg: e.to_string(),
                    })
                }
                (None, None) => unreachable!("every output comes from the first chunk"),
            })
            .collect()
    }

    /// The batch size of `inputs`: every batched input's leading size, equal across them and in
    /// range; every other size as declared.
    fn check_batched_inputs(&self, batch: &BatchDesc, inputs: &[Tensor]) -> Result<usize> {
        let want = &self.manifest.inputs;
        let sym = &batch.symbol;
        let shape = |d: &TensorDesc, batched: bool| {
            let dims: Vec<String> = d
                .dims
                .iter()
                .enumerate()
                .map(|(i, n)| if batched && i == 0 { sym.clone() } else { n.to_string() })
                .collect();
            format!("{}[{}]", d.dtype, dims.join(","))
        };
        if inputs.len() != want.len() {
            let list: Vec<String> = want
                .iter()
                .zip(&batch.inputs)
                .map(|(d, &b)| format!("{}: {}", d.name, shape(d, b)))
                .collect();
            return Err(RuntimeError::Input {
                name: self.manifest.model.clone(),
                msg: format!(
                    "expects {} inputs ({}), {} given",
                    want.len(),
                    list.join(", "),
                    inputs.len()
                ),
            });
        }
        let mut n: Option<(usize, &str)> = None;
        for ((t, d), &batched) in inputs.iter().zip(want).zip(&batch.inputs) {
            let fits = t.dtype().name() == d.dtype
                && t.rank() == d.dims.len()
                && t.dims()
                    .iter()
                    .zip(&d.dims)
                    .enumerate()
                    .all(|(i, (a, b))| (batched && i == 0) || a == b);
            if !fits {
                return Err(RuntimeError::Input {
                    name: d.name.clone(),
                    msg: format!("expected {}, got {}", shape(d, batched), t.ty()),
                });
            }
            if batched {
                agree(&mut n, t.dims()[0], &d.name, sym, "the batched inputs")?;
            }
        }
        let (n, name) = n.expect("a batched artifact has a batched input (validated at load)");
        if (n as u64) < batch.min || (n as u64) > batch.max {
            return Err(RuntimeError::Input {
                name: name.to_string(),
                msg: format!("batch `{sym}` = {n} is outside the range {}..{} this artifact was compiled for", batch.min, batch.max),
            });
        }
        Ok(n)
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        let want = &self.manifest.inputs;
        let list = || {
            want.iter()
                .map(|t| format!("{}: {}{:?}", t.name, t.dtype, t.dims))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if inputs.len() != want.len() {
            return Err(RuntimeError::Input {
                name: self.manifest.model.clone(),
                msg: format!("expects {} inputs ({}), {} given", want.len(), list(), inputs.len()),
            });
        }
        for (t, d) in inputs.iter().zip(want) {
            if t.dtype().name() != d.dtype || t.dims() != d.dims.as_slice() {
                return Err(RuntimeError::Input {
                    name: d.name.clone(),
                    msg: format!("expected {}{:?}, got {}", d.dtype, d.dims, t.ty()),
                });
            }
        }
        Ok(())
    }
}

/// Keeps the buffers a run wrote, one an output, for the next run.
fn keep_outputs(pool: &mut [Option<Arc<[u64]>>], outputs: Vec<Arc<[u64]>>) {
    for (kept, buf) in pool.iter_mut().zip(outputs) {
        *kept = Some(buf);
    }
}

/// Launches every kernel of a CPU program on `ptrs`, in order, and stops at the first whose
/// workgroups set the status word: its error names the kernel (the later ones would read what
/// it did not write).
fn run_cpu_launches(
    cpu: &Cpu,
    m: &Manifest,
    ptrs: &[*mut u8],
    status: &StatusWord,
    mut profile: Option<&mut Profile>,
) -> Result<()> {
    use crate::device::cpu::{Part, Span};
    for wave in &cpu.waves {
        let args: Vec<Vec<*mut u8>> =
            wave.iter().map(|&j| m.launches[j].args.iter().map(|&b| ptrs[b]).collect()).collect();
        let parts: Vec<Part> = wave
            .iter()
            .zip(&args)
            .map(|(&j, a)| {
                let kernel = m.launches[j].kernel;
                Part { kernel, args: a, workgroups: m.kernels[kernel].workgroups }
            })
            .collect();
        let start = Instant::now();
        let mut spans = profile.as_ref().map(|_| vec![None::<Span>; parts.len()]);
        // SAFETY: buffers are sized as the compiler planned them for each kernel, and the
        // launches of a wave touch no bytes another writes (`Hazards`).
        unsafe { cpu.program.launch_group(&parts, spans.as_deref_mut()) };
        if let Some(p) = profile.as_deref_mut() {
            let end = Instant::now();
            for (n, &j) in wave.iter().enumerate() {
                let label = &m.kernels[m.launches[j].kernel].label;
                if wave.len() == 1 {
                    p.push_launch(label, end - start, p.since_origin(start), Track::Host);
                } else {
                    let span = spans.as_ref().and_then(|s| s[n]);
                    let (s, e) = span.map_or((start, end), |s| (s.start, s.end));
                    p.push_launch(
                        label,
                        e.saturating_duration_since(s),
                        p.since_origin(s),
                        Track::CpuPool,
                    );
                }
            }
        }
        if let Some(failed) = status.read() {
            // The kernel that failed says so in the word; else, a wave of one names its own.
            let launched = (wave.len() == 1).then(|| m.launches[wave[0]].kernel);
            let mut e = failed.error(m, launched);
            // A refusal of the budget's, not the system's: said so, with what it left.
            if let (RuntimeError::Kernel { failure, .. }, Some(bytes)) =
                (&mut e, cpu.scratch.take_refused())
            {
                if matches!(failure, KernelFailure::Alloc { .. }) {
                    *failure = KernelFailure::OverBudget { bytes, limit: cpu.scratch.limit() };
                }
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Records the size `n` that input `name` gives symbol `sym`, or refuses it when an earlier input
/// (`seen`) gave another.
fn agree<'a>(
    seen: &mut Option<(usize, &'a str)>,
    n: usize,
    name: &'a str,
    sym: &str,
    which: &str,
) -> Result<()> {
    match *seen {
        Some((m, other)) if m != n => Err(RuntimeError::Input {
            name: name.to_string(),
            msg: format!("`{sym}` is {m} in `{other}` but {n} here; {which} must agree"),
        }),
        Some(_) => Ok(()),
        None => {
            *seen = Some((n, name));
            Ok(())
        }
    }
}

/// Runs control flow's steps on host values: inputs first, each step's results as it ends. The
/// validation at load guarantees every value read was written and has the type its program takes.
fn run_control(
    c: &ControlDesc,
    programs: &[Executable],
    inputs: &[Tensor],
    max_loop_steps: Option<u64>,
    mut profile: Option<&mut Profile>,
) -> Result<Vec<Tensor>> {
    let mut values: Vec<Option<Tensor>> = vec![None; c.values.len()];
    for (v, t) in values.iter_mut().zip(inputs) {
        *v = Some(t.clone());
    }
    let read = |values: &[Option<Tensor>], v: usize| {
        values[v].clone().expect("written before it is read (validated at load)")
    };
    for step in &c.steps {
        let (program, args, results) = match step {
            Step::Run { program, args, results } => (*program, args, results),
            Step::If { cond, then, otherwise, args, results } => {
                let taken = read(&values, *cond).bytes().first().is_some_and(|&b| b != 0);
                (if taken { *then } else { *otherwise }, args, results)
            }
            Step::Scan { body, captured, state, scanned, stacked, results } => {
                let captured: Vec<Tensor> = captured.iter().map(|&v| read(&values, v)).collect();
                let state: Vec<Tensor> = state.iter().map(|&v| read(&values, v)).collect();
                let scanned: Vec<(Tensor, &Scanned)> =
                    scanned.iter().map(|s| (read(&values, s.value), s)).collect();
                let outs = run_scan(
                    &programs[*body],
                    captured,
                    state,
                    &scanned,
                    stacked,
                    profile.as_deref_mut(),
                )?;
                for (&r, t) in results.iter().zip(outs) {
                    values[r] = Some(t);
                }
                continue;
            }
            Step::Loop { node, body, captured, trip_count, cond, state, results } => {
                let captured: Vec<Tensor> = captured.iter().map(|&v| read(&values, v)).collect();
                let state: Vec<Tensor> = state.iter().map(|&v| read(&values, v)).collect();
                let trip =
                    trip_count.map(|v| read(&values, v).to_i64s().first().copied().unwrap_or(0));
                let cond =
                    cond.is_none_or(|v| read(&values, v).bytes().first().is_some_and(|&b| b != 0));
                let stacked: Vec<&ValueDesc> =
                    results[state.len()..].iter().map(|&r| &c.values[r]).collect();
                let outs = run_loop(
                    &programs[*body],
                    captured,
                    (trip, cond),
                    state,
                    &stacked,
                    (node, max_loop_steps),
                    profile.as_deref_mut(),
                )?;
                for (&r, t) in results.iter().zip(outs) {
                    values[r] = Some(t);
                }
                continue;
            }
            Step::Eval { graph, args, results } => {
                let args: Vec<Tensor> = args.iter().map(|&v| read(&values, v)).collect();
                for (&r, t) in results.iter().zip(eval_on_host(graph, &args)?) {
                    values[r] = Some(t);
                }
                continue;
            }
        };
        let args: Vec<Tensor> = args.iter().map(|&v| read(&values, v)).collect();
        let outs = programs[program].run_profiled(&args, profile.as_deref_mut())?;
        for (&r, t) in results.iter().zip(outs) {
            values[r] = Some(t);
        }
    }
    Ok(c.outputs.iter().map(|&v| read(&values, v)).collect())
}

/// A host evaluation step: the graph (checked at load) run by kiln's interpreter; an error
/// names the node and op that failed.
fn eval_on_host(graph: &str, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let fail = |msg: String| RuntimeError::Launch { kernel: "host evaluation".into(), msg };
    let g = kiln_ir::text::parse(graph).map_err(|e| fail(e.to_string()))?;
    kiln_ir::eval::run(&g, args).map_err(|e| fail(e.to_string()))
}

/// A Scan step: the body once per position of the scanned values, the state carried, the other
/// results stacked (the shapes were validated at load).
fn run_scan(
    body: &Executable,
    captured: Vec<Tensor>,
    mut state: Vec<Tensor>,
    scanned: &[(Tensor, &Scanned)],
    stacked: &[Stacked],
    mut profile: Option<&mut Profile>,
) -> Result<Vec<Tensor>> {
    let moved =
        |e: kiln_ir::IrError| RuntimeError::Launch { kernel: "scan".into(), msg: e.to_string() };
    let length = scanned.first().map_or(0, |(t, s)| t.dims()[s.axis]);
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::with_capacity(length); stacked.len()];
    for step in 0..length {
        let mut args = captured.clone();
        args.append(&mut state);
        for (t, s) in scanned {
            args.push(
                t.index_axis(s.axis, if s.reverse { length - 1 - step } else { step })
                    .map_err(moved)?,
            );
        }
        let mut outs = body.run_profiled(&args, profile.as_deref_mut())?;
        let slices = outs.split_off(args.len() - captured.len() - scanned.len());
        state = outs;
        for (k, t) in slices.into_iter().enumerate() {
            parts[k].push(t);
        }
    }
    let n = state.len();
    let mut results = state;
    for (k, (mut p, st)) in parts.into_iter().zip(stacked).enumerate() {
        if st.reverse {
            p.reverse();
        }
        let d = &body.outputs()[n + k];
        let dtype = DType::from_name(&d.dtype).expect("validated at load");
        results.push(Tensor::stack(dtype, &d.dims, &p, st.axis).map_err(moved)?);
    }
    Ok(results)
}

/// A Loop step: the body while the step is below the trip count and the condition holds, the
/// state carried, the other results stacked along a new leading axis. The stacked values' sizes
/// were decided at compile time (validated at load); a run that takes another number of steps
/// is an error, not a wrong shape. `(node, limit)`: the Loop's name and the most steps it may
/// take (`LoadOptions::max_loop_steps`).
fn run_loop(
    body: &Executable,
    captured: Vec<Tensor>,
    (trip, mut cond): (Option<i64>, bool),
    mut state: Vec<Tensor>,
    stacked: &[&ValueDesc],
    (node, limit): (&str, Option<u64>),
    mut profile: Option<&mut Profile>,
) -> Result<Vec<Tensor>> {
    let moved =
        |e: kiln_ir::IrError| RuntimeError::Launch { kernel: "loop".into(), msg: e.to_string() };
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::new(); stacked.len()];
    let mut step: i64 = 0;
    while cond && trip.is_none_or(|m| step < m) {
        // ONNX sets no limit (a Loop whose condition never turns false never ends); a user may.
        if let Some(limit) = limit.filter(|&n| step as u64 >= n) {
            return Err(RuntimeError::LoopLimit { node: node.to_string(), limit });
        }
        if let Some(d) = stacked.first().filter(|d| d.dims[0] as i64 <= step) {
            return Err(RuntimeError::Launch {
                kernel: "loop".into(),
                msg: format!(
                    "the loop runs more than the {} steps its stacked result `{}` was compiled for",
                    d.dims[0], d.name
                ),
            });
        }
        let mut args = captured.clone();
        // The step number and the condition, one value each, in the shapes the body takes.
        let (n, ins) = (captured.len(), body.inputs());
        args.push(Tensor::from_f64s(DType::I64, &ins[n].dims, &[step as f64]).map_err(moved)?);
        args.push(Tensor::from_f64s(DType::Bool, &ins[n + 1].dims, &[1.0]).map_err(moved)?);
        args.append(&mut state);
        let mut outs = body.run_profiled(&args, profile.as_deref_mut())?;
        let slices = outs.split_off(args.len() - captured.len() - 1);
        state = outs.split_off(1);
        cond = outs[0].bytes().first().is_some_and(|&b| b != 0);
        for (k, t) in slices.into_iter().enumerate() {
            parts[k].push(t);
        }
        step += 1;
    }
    let mut results = state;
    for (p, d) in parts.into_iter().zip(stacked) {
        if p.len() != d.dims[0] {
            return Err(RuntimeError::Launch {
                kernel: "loop".into(),
                msg: format!(
                    "the loop ran {} steps, its stacked result `{}` was compiled for {}",
                    p.len(),
                    d.name,
                    d.dims[0]
                ),
            });
        }
        let dtype = DType::from_name(&d.dtype).expect("validated at load");
        results.push(Tensor::stack(dtype, &d.dims[1..], &p, 0).map_err(moved)?);
    }
    Ok(results)
}

/// Rows `at..at + n` of `t`'s leading axis, as a tensor of their own.
fn rows_of(t: &Tensor, at: usize, n: usize) -> Result<Tensor> {
    let row = t.bytes().len() / t.dims()[0].max(1);
    let mut dims = t.dims().to_vec();
    dims[0] = n;
    Tensor::from_bytes(t.dtype(), &dims, &t.bytes()[at * row..(at + n) * row])
        .map_err(|e| RuntimeError::Launch { kernel: "batch".into(), msg: e.to_string() })
}

/// The outputs' tensors from their buffers' bytes, in order.
fn output_tensors(m: &Manifest, bytes: &[Vec<u8>]) -> Result<Vec<Tensor>> {
    m.outputs.iter().zip(bytes).map(|(o, b)| output_tensor(o, b)).collect()
}

/// An output's tensor from its buffer's bytes.
fn output_tensor(o: &TensorDesc, bytes: &[u8]) -> Result<Tensor> {
    let dtype = DType::from_name(&o.dtype).expect("validated at load");
    let n = o.dims.iter().product::<usize>() * dtype.size();
    let bytes = bytes.get(..n).ok_or_else(|| RuntimeError::Launch {
        kernel: "output".into(),
        msg: format!("output `{}` needs {n} bytes, its buffer has {}", o.name, bytes.len()),
    })?;
    Tensor::from_bytes(dtype, &o.dims, bytes)
        .map_err(|e| RuntimeError::Launch { kernel: "output".into(), msg: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::Blob;
    use crate::device::hazard::tests::diamond;

    #[test]
    fn work_stays_beside_launches_and_medians_are_per_launch() {
        let mut m =
            diamond(Target::Cuda, 4096, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4096 });
        m.kernels[0].bytes = 12288;
        m.kernels[1].flops = 2048;
        let ms = Duration::from_millis;
        let run = |times: [u64; 5]| {
            let mut p = Profile::default();
            for (l, t) in m.launches.iter().zip(times) {
                p.launches.push((m.kernels[l.kernel].label.clone(), ms(t)));
            }
            p.add_work(&m, 0);
            p
        };
        let runs = [run([1, 2, 3, 4, 5]), run([3, 2, 1, 4, 9]), run([2, 2, 2, 2, 2])];
        assert_eq!(runs[0].work.len(), 5);
        let medians = Profile::medians(&runs);
        let times: Vec<Duration> = medians.iter().map(|k| k.time).collect();
        assert_eq!(times, vec![ms(2), ms(2), ms(2), ms(4), ms(5)]);
        assert_eq!(medians[0].work, Work { bytes: 12288, flops: 0 });
        assert_eq!((medians[1].label.as_str(), medians[1].work.flops), ("mul", 2048));
        assert_eq!(runs[0].kernels()[4].time, ms(5));
        assert!(Profile::medians(&[]).is_empty());
        // A second program's launches (control flow, batches) append theirs after the first's.
        let mut p = run([1; 5]);
        p.launches.push(("add".into(), ms(1)));
        p.add_work(&m, 5);
        assert_eq!((p.work.len(), p.work[5].bytes), (6, 12288));
    }
}
