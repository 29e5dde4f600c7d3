//! Which launches must wait for which: the ordering a device that runs launches concurrently
//! (CUDA streams, an out-of-order OpenCL queue) has to keep.
//!
//! Launch `j` depends on an earlier launch `i` when `i` writes memory `j` reads or writes, or `i`
//! reads memory `j` writes. This is decided on byte ranges of memory, not on buffer ids: scratch
//! buffers share the arena at different times and views alias other buffers, so two different
//! buffers can be the same bytes.

use crate::artifact::{BufferKind, Manifest};

/// Where a buffer's bytes live, before any device has placed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    Input(usize),
    Output(usize),
    /// A state tensor, read and written in place: its old value's readers and its new value's
    /// writer touch the same bytes, so a read comes before the later write.
    State(usize),
    /// Each constant is its own memory (keyed by its buffer index).
    Constant(usize),
    Arena,
    /// The status word: kernels only set it atomically, in any order, so it orders nothing.
    Status,
}

/// A byte range `start..end` of one space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    space: Space,
    start: u64,
    end: u64,
}

impl Range {
    fn overlaps(&self, other: &Range) -> bool {
        self.space == other.space && self.start < other.end && other.start < self.end
    }

    /// Whether two launches using these ranges must keep their order.
    fn conflicts(&self, other: &Range) -> bool {
        self.space != Space::Status && self.overlaps(other)
    }
}

/// The bytes of buffer `b`: aliases resolve to the bytes of what they alias.
fn range_of(m: &Manifest, b: usize) -> Range {
    let desc = &m.buffers[b];
    let (space, start) = match desc.kind {
        BufferKind::Input(k) => (Space::Input(k), 0),
        BufferKind::Output(k) => (Space::Output(k), 0),
        BufferKind::State(k) => (Space::State(k), 0),
        BufferKind::Constant(_) => (Space::Constant(b), 0),
        BufferKind::Scratch { offset } => (Space::Arena, offset),
        BufferKind::Alias { of, offset } => {
            let base = range_of(m, of);
            (base.space, base.start + offset)
        }
        BufferKind::Status => (Space::Status, 0),
    };
    Range { space, start, end: start + desc.bytes }
}

/// A bit set over launches.
#[derive(Clone, Debug, Default)]
pub struct Bits(Vec<u64>);

impl Bits {
    pub fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    pub fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    pub fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    pub fn union(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
}

/// The dependencies of every launch of a manifest.
#[derive(Clone, Debug)]
pub struct Hazards {
    /// For each launch, the earlier launches it must wait for, latest first, without those that
    /// are implied through another (a transitive reduction).
    pub deps: Vec<Vec<usize>>,
    /// For each launch, every earlier launch it comes after (directly or through others).
    pub after: Vec<Bits>,
    /// For each launch, the inputs whose bytes it reads or writes (it must wait for their upload).
    pub inputs_used: Vec<Vec<usize>>,
    /// For each output, the launches that write its bytes (its download waits for them).
    pub writers_of_output: Vec<Vec<usize>>,
    /// The launches that take the status word (they wait for its reset; its read waits for
    /// them).
    pub status_users: Vec<usize>,
}

impl Hazards {
    /// Analyses a validated manifest.
    pub fn of(m: &Manifest) -> Hazards {
        let n = m.launches.len();
        // (range, written) per argument of each launch.
        let uses: Vec<Vec<(Range, bool)>> = m
            .launches
            .iter()
            .map(|l| {
                l.args.iter().enumerate().map(|(p, &b)| (range_of(m, b), l.may_write(p))).collect()
            })
            .collect();
        let conflict = |i: usize, j: usize| {
            uses[i]
                .iter()
                .any(|(ri, wi)| uses[j].iter().any(|(rj, wj)| (*wi || *wj) && ri.conflicts(rj)))
        };
        let mut deps = Vec::with_capacity(n);
        let mut after: Vec<Bits> = Vec::with_capacity(n);
        for j in 0..n {
            let mut reach = Bits::new(n);
            let mut direct = Vec::new();
            // Latest first: an earlier conflict already reached through a later one needs no edge.
            for i in (0..j).rev() {
                if !reach.get(i) && conflict(i, j) {
                    direct.push(i);
                    reach.set(i);
                    reach.union(&after[i]);
                }
            }
            deps.push(direct);
            after.push(reach);
        }
        let inputs_used = uses
            .iter()
            .map(|u| {
                let mut ks: Vec<usize> = u
                    .iter()
                    .filter_map(|(r, _)| if let Space::Input(k) = r.space { Some(k) } else { None })
                    .collect();
                ks.sort_unstable();
                ks.dedup();
                ks
            })
            .collect();
        let writers_of_output = m
            .outputs
            .iter()
            .map(|o| {
                let r = range_of(m, o.buffer);
                (0..n).filter(|&j| uses[j].iter().any(|(rj, w)| *w && rj.overlaps(&r))).collect()
            })
            .collect();
        let status_users =
            (0..n).filter(|&j| uses[j].iter().any(|(r, _)| r.space == Space::Status)).collect();
        Hazards { deps, after, inputs_used, writers_of_output, status_users }
    }

    /// The launches in waves, for a device that runs launches at once (the CPU's pool): each
    /// launch in the wave one past its latest dependency's, so no launch of a wave depends on
    /// another of it, and each wave's launches in the manifest's order. A chain is one launch a
    /// wave; two independent layers (two GRUs over one input) share their waves.
    pub fn waves(&self) -> Vec<Vec<usize>> {
        let mut level = vec![0usize; self.deps.len()];
        let mut waves: Vec<Vec<usize>> = Vec::new();
        for (j, deps) in self.deps.iter().enumerate() {
            level[j] = deps.iter().map(|&d| level[d] + 1).max().unwrap_or(0);
            if waves.len() <= level[j] {
                waves.resize(level[j] + 1, Vec::new());
            }
            waves[level[j]].push(j);
        }
        waves
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::artifact::{Blob, BufferDesc, KernelDesc, Launch, Target, TensorDesc};

    /// A manifest with `n`-byte buffers: inputs x, y; outputs o0, o1; constant w; scratch s0 at 0,
    /// s1 at n, s2 at 0 (reusing s0's bytes once s0 is dead); and five launches:
    /// 0: s0 = x + y; 1: s1 = x * w; 2: o0 = s0 + s1; 3: s2 = o0 * w; 4: o1 = s2 + w.
    pub(crate) fn diamond(target: Target, n: u64, code: Blob, consts: Blob) -> Manifest {
        let f32s = |name: &str, buffer| TensorDesc {
            name: name.into(),
            dtype: "f32".into(),
            dims: vec![n as usize / 4],
            buffer,
        };
        let buf = |kind| BufferDesc { bytes: n, kind };
        let k = |symbol: &str, label: &str| KernelDesc {
            symbol: symbol.into(),
            workgroups: 1,
            label: label.into(),
            grid: [(n / 4 / 64) as u32, 1, 1],
            block: [64, 1, 1],
            bytes: 0,
            flops: 0,
        };
        let l = |kernel, args: Vec<usize>| Launch { kernel, args, writes: vec![2] };
        Manifest {
            kiln_version: "test".into(),
            model: "diamond".into(),
            target,
            target_detail: String::new(),
            cpu_features: vec![],
            inputs: vec![f32s("x", 0), f32s("y", 1)],
            outputs: vec![f32s("o0", 2), f32s("o1", 3)],
            state: vec![],
            buffers: vec![
                buf(BufferKind::Input(0)),
                buf(BufferKind::Input(1)),
                buf(BufferKind::Output(0)),
                buf(BufferKind::Output(1)),
                buf(BufferKind::Constant(consts)),
                buf(BufferKind::Scratch { offset: 0 }),
                buf(BufferKind::Scratch { offset: n }),
                buf(BufferKind::Scratch { offset: 0 }),
            ],
            kernels: vec![k("add", "add"), k("mul", "mul")],
            launches: vec![
                l(0, vec![0, 1, 5]),
                l(1, vec![0, 4, 6]),
                l(0, vec![5, 6, 2]),
                l(1, vec![2, 4, 7]),
                l(0, vec![7, 4, 3]),
            ],
            code,
            arena_bytes: 2 * n,
            batch: None,
            control: None,
            padded: None,
            scratch: None,
        }
    }

    #[test]
    fn dependencies_follow_memory_not_buffer_ids() {
        let m = diamond(
            Target::Opencl,
            4096,
            Blob { offset: 0, len: 0 },
            Blob { offset: 0, len: 4096 },
        );
        let h = Hazards::of(&m);
        // 0 and 1 are independent; 2 reads both; 3 reads o0 (from 2) and overwrites s0's bytes,
        // which 2 read (and 0 wrote: implied through 2); 4 reads s2.
        assert_eq!(h.deps, vec![vec![], vec![], vec![1, 0], vec![2], vec![3]]);
        assert!(h.after[4].get(0) && h.after[4].get(1) && h.after[3].get(0));
        assert_eq!(h.inputs_used, vec![vec![0, 1], vec![0], vec![], vec![], vec![]]);
        assert_eq!(h.writers_of_output, vec![vec![2], vec![4]]);
    }

    #[test]
    fn waves_hold_launches_that_depend_on_none_of_each_other() {
        let m =
            diamond(Target::Cpu, 4096, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4096 });
        // 0 and 1 at once, then 2 (both), 3, 4: a chain after the diamond's join.
        assert_eq!(Hazards::of(&m).waves(), vec![vec![0, 1], vec![2], vec![3], vec![4]]);
        // s1 overlapping s0's bytes keeps 0 and 1 apart: bytes, not ids, decide.
        let mut m = m;
        m.buffers[6].kind = BufferKind::Scratch { offset: 100 };
        assert_eq!(Hazards::of(&m).waves(), vec![vec![0], vec![1], vec![2], vec![3], vec![4]]);
    }

    /// A state buffer (an output written over an input, in place) is one memory: a launch
    /// that writes the new value waits for the launch that read the old one, and does not run
    /// in its wave.
    #[test]
    fn a_state_written_in_place_waits_for_its_readers() {
        use crate::artifact::StateDesc;
        let mut m =
            diamond(Target::Cpu, 4096, Blob { offset: 0, len: 0 }, Blob { offset: 0, len: 4096 });
        // y becomes state 0: launch 0 reads it (s0 = x + y); a sixth launch writes y.new = x * w.
        m.inputs.truncate(1);
        m.buffers[1].kind = BufferKind::State(0);
        m.state = vec![StateDesc {
            input: "y".into(),
            output: "y.new".into(),
            dtype: "f32".into(),
            dims: vec![1024],
            buffer: 1,
            writer: 5,
        }];
        m.launches.push(Launch { kernel: 1, args: vec![0, 4, 1], writes: vec![2] });
        let h = Hazards::of(&m);
        assert_eq!(h.deps[5], vec![0], "the write waits for the read of the old value");
        assert_eq!(h.waves(), vec![vec![0, 1], vec![2, 5], vec![3], vec![4]]);
        let art = crate::artifact::Artifact { manifest: m, payload: vec![0; 4096] };
        art.validate().unwrap();
    }

    #[test]
    fn the_status_word_orders_no_launches() {
        let mut m = diamond(
            Target::Opencl,
            4096,
            Blob { offset: 0, len: 0 },
            Blob { offset: 0, len: 4096 },
        );
        // Launches 0 and 1 both take (and may write) the status word: still independent.
        m.buffers.push(BufferDesc { bytes: 16, kind: BufferKind::Status });
        m.launches[0].args.push(8);
        m.launches[1].args.push(8);
        m.launches[0].writes = vec![2, 3];
        m.launches[1].writes = vec![2, 3];
        let h = Hazards::of(&m);
        assert!(h.deps[0].is_empty() && h.deps[1].is_empty());
        assert_eq!(h.status_users, vec![0, 1]);
    }

    #[test]
    fn overlapping_scratch_ranges_conflict_and_aliases_resolve() {
        let mut m = diamond(
            Target::Opencl,
            4096,
            Blob { offset: 0, len: 0 },
            Blob { offset: 0, len: 4096 },
        );
        // s1 moves to overlap s0 by one byte: launch 1 now writes bytes launch 0 writes.
        m.buffers[6].kind = BufferKind::Scratch { offset: 4095 };
        m.arena_bytes = 4095 + 4096;
        assert_eq!(Hazards::of(&m).deps[1], vec![0]);
        // An alias of s1 read by a new launch depends on the write to s1.
        let mut m = diamond(
            Target::Opencl,
            4096,
            Blob { offset: 0, len: 0 },
            Blob { offset: 0, len: 4096 },
        );
        m.buffers.push(BufferDesc { bytes: 64, kind: BufferKind::Alias { of: 6, offset: 128 } });
        m.launches.truncate(2);
        m.launches.push(Launch { kernel: 0, args: vec![8, 0, 2], writes: vec![2] });
        assert_eq!(Hazards::of(&m).deps[2], vec![1]);
        // Empty `writes` means every argument may be written: read-only uses now conflict.
        let mut m = diamond(
            Target::Opencl,
            4096,
            Blob { offset: 0, len: 0 },
            Blob { offset: 0, len: 4096 },
        );
        m.launches[1].writes.clear();
        assert_eq!(Hazards::of(&m).deps[1], vec![0], "both touch input x and 1 may write it");
    }
}
