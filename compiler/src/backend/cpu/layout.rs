//! Which tensors between convolutions the CPU holds channel-blocked (NCHW16c), the way
//! onnxruntime's NCHWc transformer and oneDNN's blocked formats do: [N, C/16, H, W, 16], so a
//! vector is 16 channels of one position.
//!
//! In NCHW a depthwise convolution vectorises along rows: a 7x7 plane fills 7 of 16 lanes, every
//! tap's load is misaligned, and each channel's plane is copied to pad it. Blocked, every lane
//! and every load is whole, and a pointwise convolution reads its input and writes its result
//! with no transposes. Converting per op would cost a transpose each way; instead a tensor is
//! blocked only where every kernel touching it takes the blocked form, so a run of convolutions
//! (a MobileNet or EfficientNet body) converts at its ends only, inside the first and last
//! pointwise convolutions.
//!
//! `decide` is a pure function of the graph, the kernels and their microkernel plans; its
//! result prints (`kiln emit --stage schedule`) and is pinned by snapshot tests.

use std::collections::{BTreeSet, HashMap, HashSet};

use kiln_ir::{DType, Graph, NodeId, ValueId};

use super::ukernel::{Blocked, Ukernel};
use crate::fuse::Kernel;

/// The blocked tensors: kernel results, each written by one blockable convolution and read only
/// by blockable convolutions, as their data input or their residual.
pub fn decide(graph: &Graph, kernels: &[Kernel], plans: &[Option<Ukernel>]) -> BTreeSet<ValueId> {
    let outputs: BTreeSet<ValueId> = graph.outputs().iter().map(|(_, v)| *v).collect();
    let in_kernel: HashSet<NodeId> = kernels.iter().flat_map(|k| k.nodes.iter().copied()).collect();
    // Who reads each value.
    let mut readers: HashMap<ValueId, Vec<usize>> = HashMap::new();
    for (i, k) in kernels.iter().enumerate() {
        for &v in &k.inputs {
            readers.entry(v).or_default().push(i);
        }
    }
    let reads = |i: usize| plans[i].as_ref().filter(|u| u.blockable().input);
    let writes = |i: usize| plans[i].as_ref().is_some_and(|u| u.blockable().output);
    // Candidates: the single result of a convolution that can write it blocked, 4-D f32, not a
    // graph output, not viewed under another shape, read only by convolutions that can read it
    // blocked, as their input or their residual.
    let mut blocked: BTreeSet<ValueId> = BTreeSet::new();
    for (i, k) in kernels.iter().enumerate() {
        let [v] = k.outputs.as_slice() else { continue };
        let ty = graph.value_type(*v);
        if !writes(i) || ty.dtype != DType::F32 || ty.rank() != 4 || outputs.contains(v) {
            continue;
        }
        // A reader in no kernel is a view (a reshape, a contiguous slice): it reads NCHW bytes.
        if graph.users(*v).iter().any(|(n, _)| !in_kernel.contains(n)) {
            continue;
        }
        let read_well = readers.get(v).is_some_and(|rs| {
            rs.iter().all(|&r| {
                reads(r).is_some_and(|u| u.input == *v || u.epilogue.residual == Some(*v))
            })
        });
        if read_well {
            blocked.insert(*v);
        }
    }
    // Then drop what the kernels around a tensor cannot agree on, until nothing changes: a
    // depthwise convolution is blocked on both sides or neither, and a residual has its sum's
    // layout.
    loop {
        let mut drop: Vec<ValueId> = Vec::new();
        for (k, plan) in kernels.iter().zip(plans) {
            let Some(u) = plan else { continue };
            let out = k.outputs.first().copied();
            let out_blocked = out.is_some_and(|v| blocked.contains(&v));
            let in_blocked = blocked.contains(&u.input);
            if u.depthwise() && in_blocked != out_blocked {
                drop.extend([Some(u.input), out].into_iter().flatten());
            }
            if let Some(r) = u.epilogue.residual {
                if blocked.contains(&r) != out_blocked {
                    drop.extend([Some(r), out].into_iter().flatten());
                }
            }
        }
        let before = blocked.len();
        for v in drop {
            blocked.remove(&v);
        }
        if blocked.len() == before {
            return blocked;
        }
    }
}

/// Sets each plan's `blocked` from the decision; a pointwise convolution that writes a blocked
/// tensor runs transposed (vectors along its output channels, each stored where it lies). One that
/// only reads one keeps its form: transposed, it reads the input where it lies; else it packs B
/// through 16x16 transposes.
pub fn apply(kernels: &[Kernel], plans: &mut [Option<Ukernel>], blocked: &BTreeSet<ValueId>) {
    for (k, plan) in kernels.iter().zip(plans.iter_mut()) {
        let Some(u) = plan.as_mut() else { continue };
        let b = Blocked {
            input: blocked.contains(&u.input),
            output: k.outputs.first().is_some_and(|v| blocked.contains(v)),
        };
        if b == Blocked::default() {
            continue;
        }
        u.blocked = b;
        if !u.depthwise() && b.output {
            u.transposed = true;
        }
    }
}

/// The decision as `kiln emit --stage schedule` prints it, before the kernels.
pub fn describe(graph: &Graph, blocked: &BTreeSet<ValueId>) -> String {
    if blocked.is_empty() {
        return String::new();
    }
    let mut names: Vec<String> = blocked.iter().map(|&v| graph.value_name(v)).collect();
    names.sort();
    format!(
        "layout: {} tensor(s) channel-blocked (NCHW16c) between convolutions: {}\n\n",
        names.len(),
        names.join(", ")
    )
}
