//! The CPU device: kernels are functions of a shared object, `void k(void **args, i64 wg_begin,
//! i64 wg_end)`, each running workgroups `wg_begin..wg_end`; a launch hands its workgroups out one
//! at a time to the calling thread and a few workers (whoever is free takes the next), and returns
//! when all have run. Launches that do not depend on each other go out as one group
//! ([`CpuProgram::launch_group`]): their workgroups are claimed from one count, so two
//! single-workgroup kernels run on two threads at once.
//!
//! Idle workers sleep (after polling for 50 microseconds) and the launching thread wakes them:
//! on a machine shared with other work a polling thread takes the core the kernel needs, and the
//! scheduler favours threads that slept. Whoever is awake takes the next workgroup, so a worker
//! that wakes late finds the work done rather than delaying it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::files::{self, PrivateDir};
use crate::memory::ScratchAccount;
use crate::{Result, RuntimeError};

/// The C signature of every CPU kernel.
pub type KernelFn = unsafe extern "C" fn(args: *const *mut u8, wg_begin: i64, wg_end: i64);

/// A loaded shared object and its kernels.
pub struct CpuProgram {
    kernels: Vec<KernelFn>,
    pool: Option<Pool>,
    threads: usize,
    /// Frees every thread's C kernel scratch (`support.c`'s `kiln_scratch_release`; absent in
    /// libraries written before it), called once no kernel can run.
    release: Option<unsafe extern "C" fn()>,
    /// The artifact's kernel scratch, which the library counts in (it keeps a pointer to it).
    _scratch: Arc<ScratchAccount>,
    // Kept alive while the function pointers are in use.
    _library: libloading::Library,
}

impl Drop for CpuProgram {
    fn drop(&mut self) {
        // The workers end first: after that no thread runs a kernel of this library, and the
        // scratch blocks every thread kept (the workers' and each caller's) can go. Without
        // this, each unloaded program leaked them (a `Session` drops programs it holds no more).
        drop(self.pool.take());
        if let Some(release) = self.release {
            // SAFETY: the library is still loaded, and no kernel of it runs now or later.
            unsafe { release() };
        }
    }
}

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Device { device: "cpu".into(), msg: msg.into() }
}

/// Checks that this CPU has every feature the code was compiled for (running AVX-512 code on a
/// CPU without it would die of an illegal instruction).
pub fn check_host_features(features: &[String]) -> Result<()> {
    let missing: Vec<&str> =
        features.iter().map(String::as_str).filter(|f| host_has(f) == Some(false)).collect();
    if !missing.is_empty() {
        return Err(err(format!(
            "the artifact was compiled for CPU features this machine lacks ({}); compile it on this machine, or for a CPU level it has (kiln compile --target-cpu x86-64-v3, or x86-64-v2)",
            missing.join(", ")
        )));
    }
    // A feature this runtime cannot check may be used by the code: running it could die of an
    // illegal instruction, so it is refused rather than skipped.
    let unknown: Vec<&str> =
        features.iter().map(String::as_str).filter(|f| host_has(f).is_none()).collect();
    if !unknown.is_empty() {
        return Err(err(format!(
            "the artifact needs CPU features this runtime cannot check ({}): run it with the kiln that compiled it, or compile the model again",
            unknown.join(", ")
        )));
    }
    Ok(())
}

/// Whether this runtime can tell if a host has `feature`: the compiler uses no wide feature it
/// cannot (`check_host_features` refuses those).
pub fn can_check(feature: &str) -> bool {
    host_has(feature).is_some()
}

/// Whether code using `feature` can run here: the CPU has it (and, for AMX, the OS lets this
/// process use the tile state), and `KILN_CPU_LACKS` does not hide it.
pub fn usable(feature: &str) -> bool {
    host_has(feature) == Some(true)
}

/// Whether the host has a feature; `None` for names this check does not know. Features
/// `KILN_CPU_LACKS` lists (`avx512f,avx512bw`) count as absent: a way to see, on a newer CPU,
/// whether an artifact loads on one without them.
fn host_has(f: &str) -> Option<bool> {
    detect(f).map(|has| has && !lacks().iter().any(|l| l == f))
}

/// The features `KILN_CPU_LACKS` hides, read once.
fn lacks() -> &'static [String] {
    static LACKS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LACKS.get_or_init(|| {
        std::env::var("KILN_CPU_LACKS")
            .unwrap_or_default()
            .split(',')
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty())
            .collect()
    })
}

/// Whether this CPU has a feature; `None` for names this check does not know.
fn detect(f: &str) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(which) = f.strip_prefix("amx-") {
            return amx::detect(which);
        }
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
            "avx512fp16",
            "avx512vp2intersect",
            "avxvnni",
            "avxifma",
            "avxneconvert",
            "avxvnniint8",
            "avxvnniint16",
            "sse4a"
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = f;
        None
    }
}

/// AMX: the CPU says it has the tiles (cpuid leaf 7: EDX bit 24 the tile state, 25 int8
/// products, 22 bf16 products), and Linux lets this process use them: the tile data is a
/// dynamically enabled state (8 KiB a thread) that a process must ask for once
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16+); an AMX instruction
/// without it dies of SIGILL. Asked once per process, for every thread.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::sync::OnceLock;

    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;

    /// `which`: `tile`, `int8` or `bf16`; `None` for another name.
    pub fn detect(which: &str) -> Option<bool> {
        let bit = match which {
            "tile" => 24,
            "int8" => 25,
            "bf16" => 22,
            _ => return None,
        };
        Some(cpu_bit(bit) && permitted())
    }

    fn cpu_bit(bit: u32) -> bool {
        // (cpuid is in every x86-64; leaf 7 is asked only where leaf 0 says it exists.)
        use std::arch::x86_64::__cpuid_count;
        __cpuid_count(0, 0).eax >= 7 && __cpuid_count(7, 0).edx >> bit & 1 == 1
    }

    fn permitted() -> bool {
        static PERMITTED: OnceLock<bool> = OnceLock::new();
        *PERMITTED.get_or_init(|| {
            if !cpu_bit(24) {
                return false;
            }
            // SAFETY: a plain system call with integer arguments; it changes only which
            // register states this process may use.
            unsafe {
                libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
            }
        })
    }
}

impl CpuProgram {
    /// Loads a shared object's bytes and resolves `symbols`; `threads` threads run launches (the
    /// caller and `threads - 1` workers); the kernels count their scratch in `scratch`.
    pub fn load(
        code: &[u8],
        symbols: &[String],
        threads: usize,
        scratch: Arc<ScratchAccount>,
    ) -> Result<CpuProgram> {
        // A fresh directory only this user may enter, under a name no other process can predict:
        // a shared object written where another local user could swap or pre-create it would
        // run their code in kiln's process.
        let dir = PrivateDir::new("kiln").map_err(|e| err(e.to_string()))?;
        let path = dir.join("kernels.so");
        files::write_new(&path, code, 0o700).map_err(|e| {
            err(format!("cannot write the kernel library to {}: {e}", path.display()))
        })?;
        // SAFETY: the library is kiln-compiled code (the artifact's checksum was verified); it
        // has no initialisers with side effects. It lies in a directory only this user can
        // enter, under a name no one could predict, so nothing replaced it since it was written.
        let library = unsafe { libloading::Library::new(&path) };
        // The file is not needed once mapped; dropping the directory removes it (KILN_KEEP_SO
        // keeps it, for profilers to read the kernels' symbols).
        if std::env::var_os("KILN_KEEP_SO").is_some() {
            dir.keep();
        }
        let library = library.map_err(|e| err(format!("cannot load the kernel library: {e}")))?;
        let mut kernels = Vec::with_capacity(symbols.len());
        for s in symbols {
            // SAFETY: kiln's kernels all have the `KernelFn` signature.
            let f: libloading::Symbol<KernelFn> = unsafe { library.get(s.as_bytes()) }
                .map_err(|e| err(format!("the kernel library has no `{s}`: {e}")))?;
            kernels.push(*f);
        }
        // The scratch account, before any kernel runs or any worker exists. A library written
        // before it has neither function: its kernels' scratch is then not counted.
        // SAFETY: `support.c`'s functions of these signatures; the account outlives the library
        // (this program holds both, and unloads the library first).
        let account: Option<libloading::Symbol<unsafe extern "C" fn(*mut u8)>> =
            unsafe { library.get(b"kiln_scratch_account") }.ok();
        if let Some(set) = account {
            // SAFETY: as above; `ScratchAccount` is laid out as `KilnScratchAccount`.
            unsafe { set(scratch.as_ptr()) };
        }
        // SAFETY: as above.
        let release: Option<libloading::Symbol<unsafe extern "C" fn()>> =
            unsafe { library.get(b"kiln_scratch_release") }.ok();
        let release = release.map(|f| *f);
        let threads = threads.max(1);
        let pool = if threads > 1 { Some(Pool::new(threads - 1)?) } else { None };
        Ok(CpuProgram { kernels, pool, threads, release, _scratch: scratch, _library: library })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Wakes sleeping workers ahead of a run's first launch, so that they are polling when it
    /// comes (a worker woken by the launch itself arrives after the caller has run a small
    /// kernel's workgroups alone).
    pub fn prepare(&self) {
        if let Some(pool) = &self.pool {
            pool.wake();
        }
    }

    /// Runs every workgroup of every part, the parts at once: their workgroups are handed out
    /// from one count, so threads that finish one part's take another's. With `spans`, each
    /// part's first start and last end are recorded in its slot (one a part).
    ///
    /// # Safety
    /// Each part's `args` must hold valid pointers to buffers of the sizes its kernel was
    /// compiled for, and no part may write memory another reads or writes (the runtime's hazard
    /// analysis groups only such launches).
    pub unsafe fn launch_group(&self, parts: &[Part], spans: Option<&mut [Option<Span>]>) {
        let timed = spans.is_some();
        let mut items: Vec<Item> = Vec::with_capacity(parts.len());
        let mut out = spans;
        let flush = |items: &mut Vec<Item>, out: &mut Option<&mut [Option<Span>]>| {
            if items.is_empty() {
                return;
            }
            let total: i64 = items.iter().map(|i| i.count).sum();
            match &self.pool {
                // SAFETY: as the caller promised; workgroups of one launch write disjoint parts
                // of its outputs (the compiler's distribution guarantees it), and parts of a
                // group touch disjoint memory.
                Some(pool) if total > 1 => unsafe { pool.run(items, timed) },
                _ => {
                    for item in items.iter() {
                        // SAFETY: as the caller promised.
                        unsafe { item.run_all(timed) };
                    }
                }
            }
            if let Some(out) = out.as_deref_mut() {
                for item in items.iter() {
                    if let (Some(slot), Some(ran)) = (out.get_mut(item.part), item.span()) {
                        *slot = Some(slot.map_or(ran, |s| s.union(ran)));
                    }
                }
            }
            items.clear();
        };
        for (n, part) in parts.iter().enumerate() {
            let f = self.kernels[part.kernel];
            // A group counts at most 2^16 - 1 workgroups: larger grids go in slices, alone.
            let mut base = 0i64;
            let w = part.workgroups as i64;
            while base < w {
                let count = (w - base).min(MAX_GROUP);
                let used: i64 = items.iter().map(|i| i.count).sum();
                if used + count > MAX_GROUP {
                    flush(&mut items, &mut out);
                }
                items.push(Item::new(n, f, part.args.as_ptr(), base, count));
                base += count;
            }
        }
        flush(&mut items, &mut out);
    }
}

/// What one launch of `workgroups` empty workgroups takes on a pool of `threads` threads (the
/// caller and `threads - 1` workers): the pool's synchronisation alone, the median of
/// `launches`. With `gap`, the caller waits that long before each launch, so the workers have
/// gone to sleep (past the 50 us they poll) and the launch pays their wake-up. `kiln`'s
/// `pool_cost` example prints it (`make bench-pool`).
pub fn launch_overhead(
    threads: usize,
    workgroups: u64,
    launches: usize,
    gap: Option<Duration>,
) -> Result<Duration> {
    unsafe extern "C" fn nothing(_args: *const *mut u8, _b: i64, _e: i64) {}
    let threads = threads.max(1);
    let pool = if threads > 1 { Some(Pool::new(threads - 1)?) } else { None };
    let args: [*mut u8; 1] = [std::ptr::null_mut()];
    let mut times = Vec::with_capacity(launches.max(1));
    for _ in 0..launches.max(1) {
        if let Some(g) = gap {
            std::thread::sleep(g);
        }
        let mut items =
            [Item::new(0, nothing, args.as_ptr(), 0, workgroups.clamp(1, 0xffff) as i64)];
        let start = Instant::now();
        match &pool {
            // SAFETY: `nothing` reads no argument.
            Some(pool) => unsafe { pool.run(&mut items, false) },
            // SAFETY: as above.
            None => unsafe { items[0].run_all(false) },
        }
        times.push(start.elapsed());
    }
    times.sort_unstable();
    Ok(times[times.len() / 2])
}

/// One launch of a group: its kernel, its arguments and its workgroups.
pub struct Part<'a> {
    pub kernel: usize,
    pub args: &'a [*mut u8],
    pub workgroups: u64,
}

/// When a part of a group ran: its first workgroup's start and its last one's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: Instant,
    pub end: Instant,
}

impl Span {
    fn union(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// The most workgroups one group hands out (its count is 16 bits of the launch word).
const MAX_GROUP: i64 = 0xffff;

/// A slice of a part's workgroups in a group: `count` of them from `base`, claimed as the
/// group's indices `first..first + count` (set when the group is published).
struct Item {
    part: usize,
    f: KernelFn,
    args: *const *mut u8,
    base: i64,
    count: i64,
    first: i64,
    /// Nanoseconds after `ORIGIN` of the first start and the last end (when timed).
    started: AtomicU64,
    ended: AtomicU64,
}

/// The clock the items' times count from.
static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn nanos_now() -> u64 {
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Item {
    fn new(part: usize, f: KernelFn, args: *const *mut u8, base: i64, count: i64) -> Item {
        Item {
            part,
            f,
            args,
            base,
            count,
            first: 0,
            started: AtomicU64::new(u64::MAX),
            ended: AtomicU64::new(0),
        }
    }

    /// Runs workgroup `index` of this item (0-based within it).
    ///
    /// # Safety
    /// As `launch_group`'s caller promised for this item's part.
    unsafe fn run_one(&self, index: i64, timed: bool) {
        let start = if timed { nanos_now() } else { 0 };
        let i = self.base + index;
        // SAFETY: as promised.
        unsafe { (self.f)(self.args, i, i + 1) };
        if timed {
            self.started.fetch_min(start, Ordering::Relaxed);
            self.ended.fetch_max(nanos_now(), Ordering::Relaxed);
        }
    }

    /// Runs all its workgroups on this thread, in one call.
    ///
    /// # Safety
    /// As `launch_group`'s caller promised for this item's part.
    unsafe fn run_all(&self, timed: bool) {
        let start = if timed { nanos_now() } else { 0 };
        // SAFETY: as promised.
        unsafe { (self.f)(self.args, self.base, self.base + self.count) };
        if timed {
            self.started.fetch_min(start, Ordering::Relaxed);
            self.ended.fetch_max(nanos_now(), Ordering::Relaxed);
        }
    }

    fn span(&self) -> Option<Span> {
        let (s, e) = (self.started.load(Ordering::Relaxed), self.ended.load(Ordering::Relaxed));
        let origin = *ORIGIN.get()?;
        (s <= e).then(|| Span {
            start: origin + Duration::from_nanos(s),
            end: origin + Duration::from_nanos(e),
        })
    }
}

/// How long a thread polls before it sleeps: about the gap between launches in a run, so
/// workers are awake for the next kernel (5 us was 14% slower on mobilenet_v2).
const SPIN: Duration = Duration::from_micros(50);

/// The launch (a group of parts) in progress, published to the workers.
///
/// `next` packs the launch's number (bits 32..64), its workgroup count (16..32) and the next
/// unclaimed workgroup (0..16): a claim is a compare-and-swap of that one word, so it only
/// succeeds for a workgroup of the current launch, whatever a late worker read before. The
/// group's items (each a part's kernel, arguments and workgroups) are written before `next`
/// announces the launch and read after a successful claim (which synchronises with that
/// announcement); they are not rewritten, nor freed, until every claimed workgroup has run.
struct Shared {
    next: AtomicU64,
    items: AtomicPtr<Item>,
    n_items: AtomicUsize,
    timed: AtomicBool,
    /// Workgroups finished in the current launch.
    finished: AtomicI64,
    /// Workers asleep, and the lock and condition they sleep on.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The launching thread, asleep until the last workgroup finishes.
    caller_waiting: AtomicBool,
    done: Condvar,
    stop: AtomicBool,
}

struct Pool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// One launch at a time.
    busy: Mutex<u32>,
}

impl Pool {
    fn new(workers: usize) -> Result<Pool> {
        let shared = Arc::new(Shared {
            next: AtomicU64::new(0),
            items: AtomicPtr::new(std::ptr::null_mut()),
            n_items: AtomicUsize::new(0),
            timed: AtomicBool::new(false),
            finished: AtomicI64::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_waiting: AtomicBool::new(false),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("kiln-cpu-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| err(format!("cannot start {} threads: {e}", workers + 1)))?;
            handles.push(h);
        }
        Ok(Pool { shared, workers: handles, busy: Mutex::new(0) })
    }

    /// Wakes the workers that sleep; each polls again for a while.
    fn wake(&self) {
        let s = &self.shared;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
    }

    /// Runs every workgroup of every item (at most `MAX_GROUP` in all), on this thread and the
    /// workers; with `timed`, each item records when it ran.
    ///
    /// # Safety
    /// As `CpuProgram::launch_group`'s caller promised, for every item.
    unsafe fn run(&self, items: &mut [Item], timed: bool) {
        let mut first = 0;
        for item in items.iter_mut() {
            item.first = first;
            first += item.count;
        }
        let count = first;
        let mut launch = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        *launch = launch.wrapping_add(1);
        let s = &self.shared;
        s.items.store(items.as_mut_ptr(), Ordering::Relaxed);
        s.n_items.store(items.len(), Ordering::Relaxed);
        s.timed.store(timed, Ordering::Relaxed);
        s.finished.store(0, Ordering::Relaxed);
        s.next.store(((*launch as u64) << 32) | ((count as u64) << 16), Ordering::SeqCst);
        self.wake();
        // SAFETY: the launch just published; the caller's promises hold for every workgroup.
        unsafe { claim_and_run(s, *launch) };
        // Workgroups others took: poll a little, then sleep until the last one finishes.
        let start = Instant::now();
        while s.finished.load(Ordering::Acquire) < count {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.caller_waiting.store(true, Ordering::SeqCst);
            while s.finished.load(Ordering::SeqCst) < count {
                g = s.done.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            s.caller_waiting.store(false, Ordering::SeqCst);
        }
    }

    /// Runs workgroups `0..w` of `f` (tests: one kernel, as a group of one part).
    #[cfg(test)]
    unsafe fn run_kernel(&self, f: KernelFn, args: *const *mut u8, w: i64) {
        let mut base = 0;
        while base < w {
            let count = (w - base).min(MAX_GROUP);
            let mut items = [Item::new(0, f, args, base, count)];
            // SAFETY: as the caller promised, for these workgroups.
            unsafe { self.run(&mut items, false) };
            base += count;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Claims and runs workgroups of launch `launch` until none is left.
unsafe fn claim_and_run(s: &Shared, launch: u32) {
    let mut cur = s.next.load(Ordering::Acquire);
    loop {
        let (index, count) = ((cur & 0xffff) as i64, ((cur >> 16) & 0xffff) as i64);
        if (cur >> 32) as u32 != launch || index >= count {
            return;
        }
        match s.next.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // The claim proves the launch is still running, so these are its own items.
                let n = s.n_items.load(Ordering::Relaxed);
                let timed = s.timed.load(Ordering::Relaxed);
                // SAFETY: `run` published `n` items that live until every claimed workgroup
                // has run, and this claim is one of them.
                let items =
                    unsafe { std::slice::from_raw_parts(s.items.load(Ordering::Relaxed), n) };
                // The item whose indices hold `index` (groups have a few items).
                let item = items.iter().rev().find(|it| it.first <= index).unwrap_or(&items[0]);
                // SAFETY: the caller of `run` promised the item's kernel and arguments are valid
                // for every one of its workgroups.
                unsafe { item.run_one(index - item.first, timed) };
                if s.finished.fetch_add(1, Ordering::SeqCst) + 1 == count
                    && s.caller_waiting.load(Ordering::SeqCst)
                {
                    let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                    s.done.notify_all();
                }
                cur = s.next.load(Ordering::Acquire);
            }
            Err(now) => cur = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u32;
    loop {
        let mut start = Instant::now();
        let mut spins = 0u32;
        // Wait for a launch newer than the last one seen: spin, then sleep.
        let launch = loop {
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            let l = (s.next.load(Ordering::Acquire) >> 32) as u32;
            if l != seen {
                break l;
            }
            spins += 1;
            if !spins.is_multiple_of(16) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let l = (s.next.load(Ordering::SeqCst) >> 32) as u32;
            if l == seen && !s.stop.load(Ordering::SeqCst) {
                let _g = s.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            // Woken (by a launch, or ahead of one by `prepare`): poll again for a while.
            start = Instant::now();
        };
        seen = launch;
        // SAFETY: claims only succeed while `launch` runs (see `Shared`).
        unsafe { claim_and_run(s, launch) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feature_the_host_lacks_or_cannot_check_refuses_the_artifact() {
        // A name this runtime cannot check is refused: the code may use it.
        let e = check_host_features(&["avx10.9-512".into()]).unwrap_err().to_string();
        assert!(e.contains("cannot check (avx10.9-512)"), "{e}");
        // Every feature the compiler records on this machine is one it can check.
        let recorded = [
            "avxvnni",
            "avx512vp2intersect",
            "sse4.1",
            "sse4.2",
            "avx512bitalg",
            "amx-tile",
            "amx-int8",
            "amx-bf16",
        ];
        for f in recorded {
            assert!(host_has(f).is_some(), "{f}");
        }
        let known =
            ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512fp16", "avx512vbmi2", "amx-int8"];
        for f in known {
            let r = check_host_features(&[f.to_string()]);
            assert_eq!(r.is_ok(), host_has(f) == Some(true), "{f}");
            if let Err(e) = r {
                assert!(e.to_string().contains(f));
            }
        }
    }

    /// Records (launch, workgroup) for each workgroup it runs; args[0] points to the launch
    /// number (an AtomicI64), args[1] to the log.
    unsafe extern "C" fn record(args: *const *mut u8, b: i64, e: i64) {
        // SAFETY: the test passes those two pointers.
        unsafe {
            let launch = (*(*args as *const AtomicI64)).load(Ordering::SeqCst);
            let log = &*(*args.add(1) as *const Mutex<Vec<(i64, i64)>>);
            let mut log = log.lock().unwrap();
            for i in b..e {
                log.push((launch, i));
            }
        }
    }

    #[test]
    fn every_workgroup_runs_once_before_the_launch_returns() {
        for workers in [1, 3] {
            let pool = Pool::new(workers).expect("threads");
            let launch_no = AtomicI64::new(0);
            let log: Mutex<Vec<(i64, i64)>> = Mutex::new(Vec::new());
            let args = [&launch_no as *const AtomicI64 as *mut u8, &log as *const _ as *mut u8];
            for launch in 0..3000i64 {
                launch_no.store(launch, Ordering::SeqCst);
                let w = 2 + launch % 63;
                // SAFETY: `record` only reads the two pointers given.
                unsafe { pool.run_kernel(record, args.as_ptr(), w) };
                let mut got = std::mem::take(&mut *log.lock().unwrap());
                got.sort_unstable();
                let want: Vec<(i64, i64)> = (0..w).map(|i| (launch, i)).collect();
                assert_eq!(got, want, "launch {launch} with {workers} workers");
                if launch % 500 == 0 {
                    // Let the workers fall asleep now and then.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }
    /// A rendezvous: adds 1 to the counter args[0] points to, then waits (up to 10 s) until it
    /// reaches 2, and adds 1 to args[1]'s counter if it did.
    unsafe extern "C" fn meet(args: *const *mut u8, _b: i64, _e: i64) {
        // SAFETY: the test passes two pointers to AtomicU64s.
        unsafe {
            let arrived = &*(*args as *const AtomicU64);
            let met = &*(*args.add(1) as *const AtomicU64);
            arrived.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            while arrived.load(Ordering::SeqCst) < 2 && start.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
            if arrived.load(Ordering::SeqCst) >= 2 {
                met.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn the_parts_of_a_group_run_at_once() {
        // Two single-workgroup parts, a caller and one worker: each part waits for the other to
        // start, which only happens when they run at once.
        let pool = Pool::new(1).expect("threads");
        let (arrived, met) = (AtomicU64::new(0), AtomicU64::new(0));
        let args = [&arrived as *const AtomicU64 as *mut u8, &met as *const AtomicU64 as *mut u8];
        let mut items =
            [Item::new(0, meet, args.as_ptr(), 0, 1), Item::new(1, meet, args.as_ptr(), 0, 1)];
        // SAFETY: `meet` only touches the two counters.
        unsafe { pool.run(&mut items, true) };
        assert_eq!(met.load(Ordering::SeqCst), 2, "the two parts did not run at once");
        let spans: Vec<Span> = items.iter().map(|i| i.span().expect("timed")).collect();
        assert!(spans[0].start < spans[1].end && spans[1].start < spans[0].end, "{spans:?}");
    }

    #[test]
    fn every_workgroup_of_every_part_runs_once() {
        for workers in [1, 3] {
            let pool = Pool::new(workers).expect("threads");
            let counts: Vec<AtomicU64> = (0..64 * 5).map(|_| AtomicU64::new(0)).collect();
            for round in 0..2000u64 {
                // Up to 5 parts of 1 to 64 workgroups, each counting into its own 64 counters,
                // some starting past workgroup 0 (the slices of a large grid).
                let parts = 1 + (round % 5) as usize;
                let ptrs: Vec<[*mut u8; 1]> =
                    (0..parts).map(|p| [counts[p * 64..].as_ptr() as *mut u8]).collect();
                let mut items: Vec<Item> = (0..parts)
                    .map(|p| {
                        let w = 1 + ((round * 7 + p as u64 * 13) % 64) as i64;
                        let base = (round % 3) as i64 % w;
                        Item::new(p, count, ptrs[p].as_ptr(), base, w - base)
                    })
                    .collect();
                let before: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
                // SAFETY: `count` only touches its part's counters below 64.
                unsafe { pool.run(&mut items, round % 2 == 0) };
                for (p, item) in items.iter().enumerate() {
                    for i in 0..64i64 {
                        let c = counts[p * 64 + i as usize].load(Ordering::Relaxed);
                        let want = u64::from(i >= item.base && i < item.base + item.count);
                        assert_eq!(
                            c - before[p * 64 + i as usize],
                            want,
                            "round {round} part {p} workgroup {i}"
                        );
                    }
                }
            }
        }
    }

    /// Adds 1 to `counts[i]` for each workgroup i it runs; args[0] points to the counts. Cheap,
    /// so launches follow each other as fast as they can (where late workers meet new launches).
    unsafe extern "C" fn count(args: *const *mut u8, b: i64, e: i64) {
        // SAFETY: the test passes one pointer to an array of AtomicU64 at least `e` long.
        unsafe {
            let counts = *args as *const AtomicU64;
            for i in b..e {
                (*counts.add(i as usize)).fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn back_to_back_launches_run_each_workgroup_once() {
        for workers in [1, 3] {
            let pool = Pool::new(workers).expect("threads");
            let counts: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
            let args = [counts.as_ptr() as *mut u8];
            let mut expected = [0u64; 64];
            for launch in 0..20000i64 {
                let w = 2 + launch % 63;
                // SAFETY: `count` only touches the first `w` counters.
                unsafe { pool.run_kernel(count, args.as_ptr(), w) };
                for e in expected.iter_mut().take(w as usize) {
                    *e += 1;
                }
            }
            let got: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            assert_eq!(got, expected.to_vec(), "{workers} workers");
        }
    }
}
