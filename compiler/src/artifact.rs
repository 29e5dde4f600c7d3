//! Writes the artifact the runtime reads (the format's types are the runtime's): buffers for
//! inputs, outputs, constants and views; the scratch arena planned from buffer lifetimes; the
//! status word where a function takes it; the launches in order; the code and the constants in
//! the payload.

use std::collections::HashMap;

use kiln_ir::{Graph, ValueId};
use kiln_runtime::artifact::{
    Artifact, BatchDesc, BatchProgram, Blob, BufferDesc, BufferKind, ControlDesc, KernelDesc,
    Launch, Manifest, StateDesc, Target, TensorDesc,
};
use kiln_runtime::status::STATUS_BYTES;

use crate::batch::BatchPlan;
use crate::fuse::{self, Partition};
use crate::inplace::InPlacePlan;
use crate::{CompileError, Result};

pub const ALIGN: u64 = 64;

fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// A buffer a launch takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// The fused kernel's i-th buffer (its inputs, then its outputs).
    Buffer(usize),
    /// A temporary of the fused kernel, by index into `KernelRun::scratch`.
    Scratch(usize),
    /// Constant data of the fused kernel, by index into `KernelRun::constants`.
    Constant(usize),
    /// The program's status word (`kiln_runtime::status`), which the function sets when it
    /// cannot finish (an index out of range, an allocation refused).
    Status,
}

/// One launch of a compiled function.
#[derive(Clone, Debug)]
pub struct FunctionCall {
    /// Index into `TargetCode::functions`.
    pub function: usize,
    pub args: Vec<Arg>,
    /// Positions in `args` the function may write (empty: any).
    pub writes: Vec<usize>,
}

/// How one fused kernel runs: its launches in order, its temporaries' sizes and its constants.
#[derive(Clone, Debug, Default)]
pub struct KernelRun {
    pub calls: Vec<FunctionCall>,
    pub scratch: Vec<u64>,
    pub constants: Vec<Vec<u8>>,
}

impl KernelRun {
    /// The CPU's plan: one launch of one function on the kernel's buffers.
    pub fn single(function: usize, buffers: usize) -> KernelRun {
        KernelRun {
            calls: vec![FunctionCall {
                function,
                args: (0..buffers).map(Arg::Buffer).collect(),
                writes: Vec::new(),
            }],
            ..KernelRun::default()
        }
    }
}

/// A target's compiled code.
pub struct TargetCode {
    pub target: Target,
    pub blob: Vec<u8>,
    pub target_detail: String,
    pub cpu_features: Vec<String>,
    pub functions: Vec<KernelDesc>,
    /// Per fused kernel, in partition order.
    pub runs: Vec<KernelRun>,
    /// CPU: the bounds of the kernels' own scratch (`None`: not known).
    pub scratch: Option<kiln_runtime::artifact::ScratchDesc>,
}

/// Assembles the artifact for compiled kernels. The outputs `in_place` writes over inputs share
/// the input's buffer, of kind `State` (neither among the manifest's inputs nor its outputs),
/// and its ordering edges join the schedule.
pub fn assemble(
    graph: &Graph,
    partition: &Partition,
    code: TargetCode,
    in_place: &InPlacePlan,
) -> Result<Artifact> {
    if !in_place.pairs.is_empty() && code.target != Target::Cpu {
        let a = &in_place.pairs[0];
        return Err(CompileError::InPlace {
            input: a.input.clone(),
            output: a.output.clone(),
            why: format!("state updated in place is the CPU's, not {}'s", code.target.name()),
        });
    }
    let mut payload = code.blob;
    let code_blob = Blob { offset: 0, len: payload.len() as u64 };
    let mut buffers: Vec<BufferDesc> = Vec::new();
    let mut buffer_of: HashMap<ValueId, usize> = HashMap::new();
    let bytes_of = |v: ValueId| {
        let t = graph.value_type(v);
        (t.shape.numel().unwrap_or(0) * t.dtype.size()) as u64
    };
    // Inputs and outputs first, so the interface is easy to read in the manifest; then the
    // state, each an input whose buffer an output is written into.
    let mut inputs = Vec::new();
    let mut state: Vec<StateDesc> = Vec::new();
    // Each graph input's and output's buffer.
    let mut in_buffer = vec![usize::MAX; graph.inputs().len()];
    let mut out_buffer = vec![usize::MAX; graph.outputs().len()];
    for (i, &id) in graph.inputs().iter().enumerate() {
        if in_place.pairs.iter().any(|a| a.input_index == i) {
            continue;
        }
        let v = ValueId::from(id);
        in_buffer[i] = buffers.len();
        buffers.push(BufferDesc { bytes: bytes_of(v), kind: BufferKind::Input(inputs.len()) });
        inputs.push(desc(graph, &graph.node(id).name, v, buffers.len() - 1));
    }
    let mut outputs = Vec::new();
    for (j, (name, v)) in graph.outputs().iter().enumerate() {
        if in_place.pairs.iter().any(|a| a.output_index == j) {
            continue;
        }
        out_buffer[j] = buffers.len();
        buffers.push(BufferDesc { bytes: bytes_of(*v), kind: BufferKind::Output(outputs.len()) });
        outputs.push(desc(graph, name, *v, buffers.len() - 1));
    }
    for (s, a) in in_place.pairs.iter().enumerate() {
        let id = graph.inputs()[a.input_index];
        let d = desc(graph, &a.input, ValueId::from(id), buffers.len());
        in_buffer[a.input_index] = buffers.len();
        out_buffer[a.output_index] = buffers.len();
        buffers.push(BufferDesc { bytes: bytes_of(ValueId::from(id)), kind: BufferKind::State(s) });
        state.push(StateDesc {
            input: a.input.clone(),
            output: a.output.clone(),
            dtype: d.dtype,
            dims: d.dims,
            buffer: d.buffer,
            // (Set once the launches are in order.)
            writer: usize::MAX,
        });
    }
    for (i, &id) in graph.inputs().iter().enumerate() {
        buffer_of.insert(ValueId::from(id), in_buffer[i]);
    }
    // Outputs written by a copy kernel (inputs, constants, views, a value listed twice) keep
    // their value's own buffer as the copy's source.
    let copied: Vec<usize> = partition.kernels.iter().filter_map(|k| k.copy_to_output).collect();
    for (j, (_, v)) in graph.outputs().iter().enumerate() {
        if !copied.contains(&j) {
            buffer_of.insert(*v, out_buffer[j]);
        }
    }
    // Constants, views and scratch values, on first use by a kernel. A scratch buffer's lifetime
    // is counted in the kernels' waves (`kernel_waves`), not their order: two buffers share bytes
    // only if no kernel using one can run at once with a kernel using the other, so the reuse
    // adds no hazard that would keep independent kernels apart.
    let wave = kernel_waves_after(partition, &in_place.edges).ok_or_else(|| {
        // (Only the added edges can make a cycle: the partition is in a valid order.)
        let a = in_place
            .pairs
            .iter()
            .find(|a| graph_reads_new_before_old(partition, a))
            .unwrap_or(&in_place.pairs[0]);
        CompileError::InPlace {
            input: a.input.clone(),
            output: a.output.clone(),
            why: "no order runs every reader of the old value before the new value is written"
                .into(),
        }
    })?;
    let mut scratch: Vec<(usize, usize, usize)> = Vec::new(); // (buffer, first wave, last wave)
    for (k, kernel) in partition.kernels.iter().enumerate() {
        // A constant none of the kernel's launches reads (a weight it reads packed, from its own
        // constants) needs no buffer for it.
        let used = |slot: usize| {
            code.runs
                .get(k)
                .is_none_or(|p| p.calls.iter().any(|l| l.args.contains(&Arg::Buffer(slot))))
        };
        for (slot, &v) in kernel.inputs.iter().chain(&kernel.outputs).enumerate() {
            let unread_constant =
                slot < kernel.inputs.len() && graph.constant_value(v).is_some() && !used(slot);
            if !unread_constant {
                resolve(
                    graph,
                    partition,
                    v,
                    &mut buffers,
                    &mut buffer_of,
                    &mut payload,
                    bytes_of,
                    &mut scratch,
                    wave[k],
                );
            }
        }
        // Everything this kernel reads is live at least until its wave.
        for &v in &kernel.inputs {
            let src = fuse::resolve_view(&partition.views, v).of;
            if let Some(&b) = buffer_of.get(&src) {
                if let Some(s) = scratch.iter_mut().find(|s| s.0 == b) {
                    s.2 = s.2.max(wave[k]);
                }
            }
        }
    }
    // Each kernel's own temporaries live only while it runs; its constants join the payload.
    let mut temps: Vec<Vec<usize>> = Vec::with_capacity(code.runs.len());
    let mut consts: Vec<Vec<usize>> = Vec::with_capacity(code.runs.len());
    for (k, plan) in code.runs.iter().enumerate() {
        let mut t = Vec::new();
        for &bytes in &plan.scratch {
            buffers.push(BufferDesc { bytes, kind: BufferKind::Scratch { offset: 0 } });
            scratch.push((buffers.len() - 1, wave[k], wave[k]));
            t.push(buffers.len() - 1);
        }
        temps.push(t);
        let mut c = Vec::new();
        for data in &plan.constants {
            payload.resize(align(payload.len() as u64) as usize, 0);
            let blob = Blob { offset: payload.len() as u64, len: data.len() as u64 };
            payload.extend_from_slice(data);
            buffers.push(BufferDesc { bytes: blob.len, kind: BufferKind::Constant(blob) });
            c.push(buffers.len() - 1);
        }
        consts.push(c);
    }
    let arena_bytes = plan_arena(&mut buffers, &scratch);
    // One status word for the program, when a function takes it.
    let takes_status =
        code.runs.iter().flat_map(|r| &r.calls).any(|c| c.args.contains(&Arg::Status));
    let status = takes_status.then(|| {
        buffers.push(BufferDesc { bytes: STATUS_BYTES, kind: BufferKind::Status });
        buffers.len() - 1
    });
    // Launches go wave by wave (each wave's kernels in order): the order the arena's sharing
    // assumes, so the hazards a device derives from it (byte ranges, in launch order) keep the
    // kernels of one wave apart from none but their own dependencies.
    let mut order: Vec<usize> = (0..partition.kernels.len()).collect();
    order.sort_by_key(|&k| wave[k]);
    let mut launches = Vec::new();
    for k in order {
        let (kernel, plan) = (&partition.kernels[k], &code.runs[k]);
        // A state's writer: the kernel's last launch (where it writes its outputs).
        for (st, a) in state.iter_mut().zip(&in_place.pairs) {
            if a.writer == k {
                st.writer = launches.len() + plan.calls.len().saturating_sub(1);
            }
        }
        // (Slots no launch reads may have no buffer.)
        let mut own: Vec<usize> =
            kernel.inputs.iter().map(|v| buffer_of.get(v).copied().unwrap_or(usize::MAX)).collect();
        for &v in &kernel.outputs {
            // A copy kernel made for output j writes that output's own buffer.
            own.push(match kernel.copy_to_output {
                Some(j) => out_buffer[j],
                None => buffer_of[&v],
            });
        }
        for l in &plan.calls {
            let args = l
                .args
                .iter()
                .map(|a| match a {
                    Arg::Buffer(i) => own[*i],
                    Arg::Scratch(i) => temps[k][*i],
                    Arg::Constant(i) => consts[k][*i],
                    Arg::Status => status.expect("made above for any call that takes it"),
                })
                .collect();
            launches.push(Launch { kernel: l.function, args, writes: l.writes.clone() });
        }
    }
    let manifest = Manifest {
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
        model: graph.name.clone(),
        target: code.target,
        target_detail: code.target_detail,
        cpu_features: code.cpu_features,
        inputs,
        outputs,
        state,
        buffers,
        kernels: code.functions,
        launches,
        code: code_blob,
        arena_bytes,
        batch: None,
        control: None,
        padded: None,
        scratch: code.scratch,
    };
    Ok(Artifact { manifest, payload })
}

fn desc(graph: &Graph, name: &str, v: ValueId, buffer: usize) -> TensorDesc {
    let t = graph.value_type(v);
    TensorDesc {
        name: name.to_string(),
        dtype: t.dtype.name().to_string(),
        dims: t.shape.as_fixed().unwrap_or_default(),
        buffer,
    }
}

/// Gives `v` a buffer if it has none: a constant's data goes into the payload, a view aliases its
/// source, anything else is scratch first written in wave `k` (`kernel_waves`).
#[allow(clippy::too_many_arguments)]
fn resolve(
    graph: &Graph,
    partition: &Partition,
    v: ValueId,
    buffers: &mut Vec<BufferDesc>,
    buffer_of: &mut HashMap<ValueId, usize>,
    payload: &mut Vec<u8>,
    bytes_of: impl Fn(ValueId) -> u64 + Copy,
    scratch: &mut Vec<(usize, usize, usize)>,
    k: usize,
) -> usize {
    if let Some(&b) = buffer_of.get(&v) {
        return b;
    }
    let view = fuse::resolve_view(&partition.views, v);
    let b = if view.of != v {
        let s =
            resolve(graph, partition, view.of, buffers, buffer_of, payload, bytes_of, scratch, k);
        // A concat's result is written part by part (`fuse::concat_views`), by kernels of
        // different waves: it is alive from the earliest.
        if let Some(e) = scratch.iter_mut().find(|e| e.0 == s) {
            e.1 = e.1.min(k);
        }
        buffers.push(BufferDesc {
            bytes: bytes_of(v),
            kind: BufferKind::Alias { of: s, offset: view.offset },
        });
        buffers.len() - 1
    } else if let Some(t) = graph.constant_value(v) {
        payload.resize(align(payload.len() as u64) as usize, 0);
        let blob = Blob { offset: payload.len() as u64, len: t.bytes().len() as u64 };
        payload.extend_from_slice(t.bytes());
        buffers.push(BufferDesc { bytes: blob.len, kind: BufferKind::Constant(blob) });
        buffers.len() - 1
    } else {
        buffers.push(BufferDesc { bytes: bytes_of(v), kind: BufferKind::Scratch { offset: 0 } });
        scratch.push((buffers.len() - 1, k, k));
        buffers.len() - 1
    };
    buffer_of.insert(v, b);
    b
}

/// Whether a kernel that reads `a`'s old value must come after its writer by data alone.
fn graph_reads_new_before_old(partition: &Partition, a: &crate::inplace::Aliased) -> bool {
    let deps = data_dependencies(partition);
    // Reachable from the writer by data: a reader there cannot run before it.
    let mut after = vec![false; partition.kernels.len()];
    after[a.writer] = true;
    for k in a.writer + 1..partition.kernels.len() {
        after[k] = deps[k].iter().any(|&d| after[d]);
    }
    a.readers.iter().any(|&r| after[r])
}

/// Each kernel's wave: one past the latest wave of the kernels whose results it reads (0 for
/// those reading only inputs and constants). Kernels of one wave do not depend on each other,
/// and a device that runs launches at once (the CPU's pool, CUDA streams) may run them so; a
/// chain of kernels is one a wave, as in order.
pub fn kernel_waves(partition: &Partition) -> Vec<usize> {
    kernel_waves_after(partition, &[]).expect("the partition's data order has no cycle")
}

/// The kernels each kernel reads results of (by data), as `kernel_waves` counts them: a value
/// several kernels write parts of (a concat's result) is ready after all of them.
fn data_dependencies(partition: &Partition) -> Vec<Vec<usize>> {
    // Every kernel that has written (part of) each value so far. A reader depends on all the
    // writers of what it reads: by data alone the latest of them would do, but edges added
    // after (`kernel_waves_after`) may move one part's writer past another's.
    let mut writers: HashMap<ValueId, Vec<usize>> = HashMap::new();
    let mut deps = Vec::with_capacity(partition.kernels.len());
    for (k, kernel) in partition.kernels.iter().enumerate() {
        let mut d: Vec<usize> = Vec::new();
        for &v in &kernel.inputs {
            let src = fuse::resolve_view(&partition.views, v).of;
            if let Some(ws) = writers.get(&src).or_else(|| writers.get(&v)) {
                d.extend(ws);
            }
        }
        d.sort_unstable();
        d.dedup();
        deps.push(d);
        for &o in &kernel.outputs {
            writers.entry(o).or_default().push(k);
            let of = fuse::resolve_view(&partition.views, o).of;
            if of != o {
                writers.entry(of).or_default().push(k);
            }
        }
    }
    deps
}

/// [`kernel_waves`] with `after` edges besides the data's: (a, b) puts kernel b in a later wave
/// than kernel a (an in-place write after the reads of the old value, `inplace::plan`). `None`
/// when the edges make a cycle.
pub fn kernel_waves_after(partition: &Partition, after: &[(usize, usize)]) -> Option<Vec<usize>> {
    let n = partition.kernels.len();
    let mut preds = data_dependencies(partition);
    for &(a, b) in after {
        preds[b].push(a);
    }
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting: Vec<usize> = vec![0; n];
    for (k, ps) in preds.iter().enumerate() {
        for &p in ps {
            succs[p].push(k);
            waiting[k] += 1;
        }
    }
    // Longest path from the kernels that wait for none, in any order that respects the edges.
    let mut wave = vec![0usize; n];
    let mut ready: Vec<usize> = (0..n).filter(|&k| waiting[k] == 0).collect();
    let mut done = 0;
    while let Some(k) = ready.pop() {
        done += 1;
        wave[k] = preds[k].iter().map(|&p| wave[p] + 1).max().unwrap_or(0);
        for &s in &succs[k] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                ready.push(s);
            }
        }
    }
    (done == n).then_some(wave)
}

/// Places scratch buffers in one arena so that buffers alive at the same time do not overlap:
/// largest first, each at the lowest offset free for its lifetime. Returns the arena size.
pub fn plan_arena(buffers: &mut [BufferDesc], scratch: &[(usize, usize, usize)]) -> u64 {
    let mut order: Vec<&(usize, usize, usize)> = scratch.iter().collect();
    order.sort_by_key(|(b, first, _)| (std::cmp::Reverse(buffers[*b].bytes), *first));
    let mut placed: Vec<(u64, u64, usize, usize)> = Vec::new(); // (offset, size, first, last)
    let mut total = 0;
    for &&(b, first, last) in &order {
        let size = align(buffers[b].bytes.max(1));
        // Candidate offsets: 0 and the end of every placed buffer alive at the same time.
        let mut overlapping: Vec<(u64, u64)> = placed
            .iter()
            .filter(|p| p.2 <= last && first <= p.3)
            .map(|p| (p.0, p.0 + p.1))
            .collect();
        overlapping.sort();
        let mut offset = 0;
        for (start, end) in overlapping {
            if offset + size <= start {
                break;
            }
            offset = offset.max(end);
        }
        placed.push((offset, size, first, last));
        buffers[b].kind = BufferKind::Scratch { offset };
        total = total.max(offset + size);
    }
    total
}

/// One payload for several programs' blobs: a blob two programs share byte for byte (a weight
/// packed the same way for every batch size) is stored once.
#[derive(Default)]
struct SharedPayload {
    bytes: Vec<u8>,
    stored: HashMap<(u64, u64), u64>, // (digest, length) -> offset
}

impl SharedPayload {
    fn put(&mut self, from: &Artifact, b: Blob) -> Result<Blob> {
        let bytes = from.blob(b)?;
        let key = (digest(bytes), b.len);
        if let Some(&offset) = self.stored.get(&key) {
            if &self.bytes[offset as usize..(offset + b.len) as usize] == bytes {
                return Ok(Blob { offset, len: b.len });
            }
        }
        self.bytes.resize(align(self.bytes.len() as u64) as usize, 0);
        let offset = self.bytes.len() as u64;
        self.bytes.extend_from_slice(bytes);
        self.stored.insert(key, offset);
        Ok(Blob { offset, len: b.len })
    }

    /// Moves every blob `m` (and the programs it holds) names from `from`'s payload into this one.
    fn take(&mut self, m: &mut Manifest, from: &Artifact) -> Result<()> {
        m.code = self.put(from, m.code)?;
        for b in &mut m.buffers {
            if let BufferKind::Constant(blob) = &mut b.kind {
                *blob = self.put(from, *blob)?;
            }
        }
        if let Some(batch) = &mut m.batch {
            for p in &mut batch.programs {
                self.take(&mut p.manifest, from)?;
            }
        }
        if let Some(control) = &mut m.control {
            for p in &mut control.programs {
                self.take(p, from)?;
            }
        }
        Ok(())
    }
}

/// The manifest of an artifact made of programs: `interface`'s inputs and outputs, the union of
/// the programs' CPU features, and no buffers, kernels or launches of its own.
fn outer_manifest(interface: &Manifest, programs: &[&Manifest]) -> Manifest {
    let mut cpu_features: Vec<String> =
        programs.iter().flat_map(|m| m.cpu_features.iter().cloned()).collect();
    cpu_features.sort();
    cpu_features.dedup();
    Manifest {
        kiln_version: interface.kiln_version.clone(),
        model: interface.model.clone(),
        target: interface.target,
        target_detail: interface.target_detail.clone(),
        cpu_features,
        inputs: interface.inputs.clone(),
        outputs: interface.outputs.clone(),
        state: Vec::new(),
        buffers: Vec::new(),
        kernels: Vec::new(),
        launches: Vec::new(),
        code: Blob { offset: 0, len: 0 },
        arena_bytes: 0,
        batch: None,
        control: None,
        padded: None,
        scratch: None,
    }
}

/// One artifact from the programs of a symbolic batch (largest first): their manifests in the
/// batch description, their blobs in one payload (shared ones once).
pub fn assemble_batched(plan: &BatchPlan, programs: Vec<(usize, Artifact)>) -> Result<Artifact> {
    let mut payload = SharedPayload::default();
    let mut descs = Vec::with_capacity(programs.len());
    for (size, art) in programs {
        let mut m = art.manifest.clone();
        payload.take(&mut m, &art)?;
        descs.push(BatchProgram { batch: size as u64, manifest: m });
    }
    // A plan's sizes always end with 1 (`batch::plan`).
    let one = &descs
        .last()
        .ok_or_else(|| crate::CompileError::Internal("a symbolic batch with no programs".into()))?
        .manifest;
    let mut manifest = outer_manifest(one, &descs.iter().map(|p| &p.manifest).collect::<Vec<_>>());
    manifest.batch = Some(BatchDesc {
        symbol: plan.symbol.clone(),
        min: plan.min as u64,
        max: plan.max as u64,
        inputs: plan.inputs.clone(),
        outputs: plan.outputs.clone(),
        programs: descs,
    });
    let art = Artifact { manifest, payload: payload.bytes };
    // Assembled here from programs that validate: an artifact that does not is a bug.
    art.validate().map_err(|e| {
        crate::CompileError::Internal(format!("the batched artifact does not validate: {e}"))
    })?;
    Ok(art)
}

/// One artifact from a control split's programs (in the split's order) and its steps: the
/// interface is the graph's (`inputs` and `outputs` as the split gives them).
pub fn assemble_control(
    model: &str,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    programs: Vec<Artifact>,
    control: impl FnOnce(Vec<Manifest>) -> ControlDesc,
) -> Result<Artifact> {
    let mut payload = SharedPayload::default();
    let mut manifests = Vec::with_capacity(programs.len());
    for art in &programs {
        let mut m = art.manifest.clone();
        payload.take(&mut m, art)?;
        manifests.push(m);
    }
    // A split always has a program (the control-flow node's own).
    let first = manifests
        .first()
        .ok_or_else(|| crate::CompileError::Internal("control flow with no programs".into()))?;
    let mut manifest = outer_manifest(first, &manifests.iter().collect::<Vec<_>>());
    (manifest.model, manifest.inputs, manifest.outputs) = (model.to_string(), inputs, outputs);
    manifest.control = Some(control(manifests));
    let art = Artifact { manifest, payload: payload.bytes };
    // Assembled here from programs that validate: an artifact that does not is a bug.
    art.validate().map_err(|e| {
        crate::CompileError::Internal(format!("the control-flow artifact does not validate: {e}"))
    })?;
    Ok(art)
}

/// One artifact from a program compiled for a padded symbol at `capacity`: the interface is the
/// program's less its last input (the size the runtime passes).
pub fn assemble_padded(
    model: &str,
    plan: &crate::pad::PadPlan,
    capacity: usize,
    program: Artifact,
) -> Result<Artifact> {
    use kiln_runtime::artifact::{PaddedAxis, PaddedDesc};
    let mut manifest = outer_manifest(&program.manifest, &[&program.manifest]);
    manifest.model = model.to_string();
    manifest.inputs.pop();
    manifest.padded = Some(PaddedDesc {
        symbol: plan.symbol.clone(),
        capacity: capacity as u64,
        inputs: plan
            .inputs
            .iter()
            .map(|&(tensor, axis)| PaddedAxis { tensor, axis, extra: 0 })
            .collect(),
        outputs: plan
            .outputs
            .iter()
            .map(|&(tensor, axis, extra)| PaddedAxis { tensor, axis, extra: extra as u64 })
            .collect(),
        program: Box::new(program.manifest),
    });
    let art = Artifact { manifest, payload: program.payload };
    // Assembled here from a program that validates: an artifact that does not is a bug.
    art.validate().map_err(|e| {
        crate::CompileError::Internal(format!("the padded artifact does not validate: {e}"))
    })?;
    Ok(art)
}

/// FNV-1a over the bytes: finds blobs two programs share (equality is then checked).
fn digest(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}
