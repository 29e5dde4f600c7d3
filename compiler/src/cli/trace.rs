//! `--trace FILE` (`kiln run`, `kiln bench`): a Chrome/Perfetto trace of the command, in the
//! Trace Event Format (`{"traceEvents": [...]}`) that ui.perfetto.dev and chrome://tracing open.
//!
//! A [`Recorder`] notes what the command does against one clock started with it (the import,
//! the compile and the phases the compiler timed, the load, each run with its profile); [`json`]
//! is a pure function from that [`Timeline`] to the trace, so fixed timings give fixed text.
//!
//! Tracks: process 1 is kiln, its thread 1 the thread that ran the command, which holds the
//! host spans and, on the CPU, each kernel launch (the launching thread takes workgroups with
//! the pool's workers; which worker ran which workgroup is not recorded). A GPU is process 2,
//! a track per CUDA stream (or the OpenCL queue), with the copies between host and device on
//! the stream (queue) that made them. Slices that overlap on one device track without nesting
//! (an out-of-order queue) go on a track beside it, as a timeline viewer needs.

use std::path::Path;
use std::time::{Duration, Instant};

use kiln_runtime::{Profile, Track};
use serde_json::{json, Map, Value};

use super::common::{file_err, write_atomically};
use crate::Result;

/// A slice on the command's thread: its name, its kind (the trace's `cat`), and when, from the
/// trace's start.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub category: &'static str,
    pub start: Duration,
    pub time: Duration,
}

/// One run whose launches are traced: its profile, whose `origin` lies `origin` after the
/// trace's start (`Profile::starts` and `copies` count from it).
#[derive(Clone, Debug)]
pub struct TracedRun {
    /// The run's name, for its launches' args (`run 3`).
    pub name: String,
    pub origin: Duration,
    pub profile: Profile,
}

/// What a command did, on one clock: what [`json`] draws.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// The command, which names kiln's process: `kiln run model.onnx`.
    pub command: String,
    /// The device, as `Executable::device` says (`cpu (16 threads)`, a GPU's name).
    pub device: String,
    /// The command thread's slices, in order: import, compile and its phases, load, runs.
    pub host: Vec<Span>,
    pub runs: Vec<TracedRun>,
}

/// kiln's process and the command's thread.
const HOST_PID: u64 = 1;
const HOST_TID: u64 = 1;
/// The GPU's process.
const DEVICE_PID: u64 = 2;

/// The trace of `t`: metadata events naming the processes and threads, then one complete
/// (`X`) event per span, launch and copy, times in microseconds.
pub fn json(t: &Timeline) -> Value {
    let mut events = vec![
        meta("process_name", HOST_PID, None, json!({ "name": t.command })),
        meta("process_labels", HOST_PID, None, json!({ "labels": t.device })),
        meta(
            "thread_name",
            HOST_PID,
            Some(HOST_TID),
            json!({ "name": "kiln (the command's thread)" }),
        ),
    ];
    for s in &t.host {
        events.push(slice(&s.name, s.category, s.start, s.time, HOST_PID, HOST_TID, Map::new()));
    }
    // Device slices first gathered per track, to put the ones that overlap on lanes.
    let mut device: Vec<(Track, DeviceSlice)> = Vec::new();
    for run in &t.runs {
        let p = &run.profile;
        for (i, (label, time)) in p.launches.iter().enumerate() {
            let start = run.origin + p.starts.get(i).copied().unwrap_or_default();
            let mut args = Map::new();
            args.insert("run".into(), json!(run.name));
            args.insert("launch".into(), json!(i));
            // What the compiler counted (GPU kernels; 0 is not counted).
            if let Some(w) = p.work.get(i) {
                if w.bytes > 0 {
                    args.insert("bytes".into(), json!(w.bytes));
                }
                if w.flops > 0 {
                    args.insert("flops".into(), json!(w.flops));
                }
            }
            match p.tracks.get(i).copied().unwrap_or(Track::Host) {
                Track::Host => {
                    events.push(slice(label, "kernel", start, *time, HOST_PID, HOST_TID, args))
                }
                track => device.push((
                    track,
                    DeviceSlice {
                        name: label.clone(),
                        category: "kernel",
                        start,
                        time: *time,
                        args,
                    },
                )),
            }
        }
        // Copies go on the track of the stream that made them: CUDA's main stream, the queue.
        let copy_track = match p.tracks.first() {
            Some(Track::OpenclQueue) => Track::OpenclQueue,
            _ => Track::CudaStream(0),
        };
        for c in &p.copies {
            let mut args = Map::new();
            args.insert("run".into(), json!(run.name));
            args.insert("bytes".into(), json!(c.bytes));
            let name = if c.to_device { "copy host->device" } else { "copy device->host" };
            device.push((
                copy_track,
                DeviceSlice {
                    name: name.into(),
                    category: "copy",
                    start: run.origin + c.start,
                    time: c.time,
                    args,
                },
            ));
        }
    }
    if !device.is_empty() {
        events.push(meta("process_name", DEVICE_PID, None, json!({ "name": t.device })));
        events.extend(device_events(device));
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// A slice on a device track, before it has a lane.
struct DeviceSlice {
    name: String,
    category: &'static str,
    start: Duration,
    time: Duration,
    args: Map<String, Value>,
}

/// The device's slices on their tracks, each track's slices that overlap put on lanes beside
/// it (a slice goes on the first lane whose last slice has ended), each lane a thread named
/// after its track.
fn device_events(mut slices: Vec<(Track, DeviceSlice)>) -> Vec<Value> {
    slices.sort_by_key(|(track, s)| (*track, s.start));
    let mut lanes: Vec<(Track, Duration)> = Vec::new();
    let mut named: Vec<Value> = Vec::new();
    let mut events: Vec<Value> = Vec::new();
    for (track, s) in slices {
        let lane = lanes.iter().position(|(t, end)| *t == track && *end <= s.start);
        let tid = match lane {
            Some(l) => {
                lanes[l].1 = s.start + s.time;
                l
            }
            None => {
                let k = lanes.iter().filter(|(t, _)| *t == track).count();
                lanes.push((track, s.start + s.time));
                let name = match (track, k) {
                    (track, 0) => track_name(track),
                    (track, k) => format!("{} (overlapping {})", track_name(track), k + 1),
                };
                named.push(meta(
                    "thread_name",
                    DEVICE_PID,
                    Some(lanes.len() as u64),
                    json!({ "name": name }),
                ));
                lanes.len() - 1
            }
        } as u64
            + 1;
        events.push(slice(&s.name, s.category, s.start, s.time, DEVICE_PID, tid, s.args));
    }
    named.extend(events);
    named
}

fn track_name(track: Track) -> String {
    match track {
        Track::Host => "host".into(),
        Track::CudaStream(s) => format!("CUDA stream {s}"),
        Track::OpenclQueue => "OpenCL queue".into(),
        Track::CpuPool => "CPU threads".into(),
    }
}

/// A metadata (`M`) event naming a process or a thread.
fn meta(name: &str, pid: u64, tid: Option<u64>, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "pid": pid, "tid": tid.unwrap_or(0), "args": args })
}

/// A complete (`X`) event.
fn slice(
    name: &str,
    category: &str,
    start: Duration,
    time: Duration,
    pid: u64,
    tid: u64,
    args: Map<String, Value>,
) -> Value {
    json!({
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": micros(start),
        "dur": micros(time),
        "pid": pid,
        "tid": tid,
        "args": args,
    })
}

/// Microseconds, to the nanosecond.
fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// Notes what a command does for its trace, against the clock it was made with.
pub struct Recorder {
    epoch: Instant,
    timeline: Timeline,
}

impl Recorder {
    /// A recorder whose trace starts now, for the trace file at `path`, which is checked now
    /// (its folder must exist) so a long run does not end in an error it could have had first.
    pub fn new(path: &Path) -> Result<Recorder> {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(file_err(
                path,
                format!("--trace: its folder {} does not exist", parent.display()),
            ));
        }
        Ok(Recorder { epoch: Instant::now(), timeline: Timeline::default() })
    }

    fn since(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.epoch)
    }

    /// A slice from `start` to now on the command's thread.
    pub fn span(&mut self, name: impl Into<String>, category: &'static str, start: Instant) {
        let span =
            Span { name: name.into(), category, start: self.since(start), time: start.elapsed() };
        self.timeline.host.push(span);
    }

    /// A compile from `start` to now, and inside it the phases the compiler timed, end to end
    /// in the order it reports them (a model of several programs: each phase summed over them).
    pub fn compile(&mut self, start: Instant, timings: &[(&'static str, Duration)], cached: bool) {
        let name = if cached { "compile (from the cache)" } else { "compile" };
        self.span(name, "compile", start);
        let mut at = self.since(start);
        for (phase, time) in timings {
            let phase =
                Span { name: phase.to_string(), category: "compile", start: at, time: *time };
            at += *time;
            self.timeline.host.push(phase);
        }
    }

    /// A run from `start` to now; with its profile, its launches and copies too.
    pub fn run(&mut self, name: impl Into<String>, start: Instant, profile: Option<Profile>) {
        let name = name.into();
        self.span(name.clone(), "run", start);
        if let Some(profile) = profile {
            let origin = profile.origin.map_or(self.since(start), |o| self.since(o));
            self.timeline.runs.push(TracedRun { name, origin, profile });
        }
    }

    /// Writes the trace to `path` (only once complete, as every file kiln writes), kiln's
    /// process named `command`, the device `device`.
    pub fn write(mut self, path: &Path, command: String, device: String) -> Result<()> {
        self.timeline.command = command;
        self.timeline.device = device;
        let text = serde_json::to_vec(&json(&self.timeline))
            .map_err(|e| file_err(path, format!("cannot write the trace: {e}")))?;
        write_atomically(path, &text)
    }
}
