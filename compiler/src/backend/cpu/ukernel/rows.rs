//! Reductions over consecutive axes (`Shape::Reduce`) and softmax over the last axis
//! (`Shape::Softmax`), both by rows (`reduction.c`): planned, described and called. Nothing is
//! packed.

use std::fmt;

use kiln_ir::op::PoolKind;
use kiln_ir::{DType, Graph, NodeId, Op};
use melior::ir::Value;

use super::{other_shape, Call, Host, KernelShape, Pointers, Shape, Ukernel, MIN_MACS};
use crate::fuse::Kernel;
use crate::Result;

/// Reductions (and global pooling): `kiln_uk_reduce`.
pub(super) struct Reduce;

/// Softmax and log-softmax: `kiln_uk_softmax`.
pub(super) struct Softmax;

/// A reduction over consecutive axes (Reduce{Sum,Mean,Max,Min}, GlobalAveragePool,
/// GlobalMaxPool) or a softmax over the last axis, f32, with nothing after it. The linalg path
/// reduces a row in one vector chain and, split into workgroups, may reduce every row in each.
pub(super) fn plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    tail: &[NodeId],
    always: bool,
    host: &Host,
) -> Option<Ukernel> {
    let operands = graph.operands(root);
    let x = operands.first().copied().flatten()?;
    let out = *kernel.outputs.first()?;
    if !tail.is_empty()
        || graph.value_type(x).dtype != DType::F32
        || graph.value_type(out).dtype != DType::F32
        || !kernel.inputs.contains(&x)
    {
        return None;
    }
    let xd = graph.value_type(x).shape.as_fixed()?;
    let rank = xd.len();
    // (outer, reduced, inner) around a consecutive run of axes.
    let around = |first: usize, last: usize| -> (usize, usize, usize) {
        (
            xd[..first].iter().product(),
            xd[first..=last].iter().product(),
            xd[last + 1..].iter().product(),
        )
    };
    let shape = match &graph.node(root).op {
        Op::Reduce(r) => {
            let kind = match r.kind {
                kiln_ir::op::ReduceKind::Sum => 0,
                kiln_ir::op::ReduceKind::Mean => 1,
                kiln_ir::op::ReduceKind::Max => 2,
                kiln_ir::op::ReduceKind::Min => 3,
                _ => return None,
            };
            let mut axes: Vec<usize> = match operands.get(1).copied().flatten() {
                None => Vec::new(),
                Some(a) => graph
                    .constant_value(a)?
                    .to_i64s()
                    .iter()
                    .map(|&a| kiln_ir::normalize_axis(a, rank))
                    .collect::<Option<_>>()?,
            };
            if axes.is_empty() {
                if r.noop_with_empty_axes {
                    return None;
                }
                axes = (0..rank).collect();
            }
            axes.sort_unstable();
            axes.dedup();
            let (first, last) = (*axes.first()?, *axes.last()?);
            if last - first + 1 != axes.len() {
                return None;
            }
            let (outer, reduced, inner) = around(first, last);
            Shape::Reduce { outer, reduced, inner, kind }
        }
        Op::GlobalPool(p) => {
            let kind = match p {
                PoolKind::Max => 2,
                PoolKind::Average { .. } => 1,
                PoolKind::Lp { .. } => return None,
            };
            if rank < 3 {
                return None;
            }
            let (outer, reduced, inner) = around(2, rank - 1);
            Shape::Reduce { outer, reduced, inner, kind }
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            if rank == 0 || !(*axis == -1 || *axis == rank as i64 - 1) {
                return None;
            }
            let log = matches!(graph.node(root).op, Op::LogSoftmax { .. });
            Shape::Softmax { rows: xd[..rank - 1].iter().product(), cols: xd[rank - 1], log }
        }
        _ => return None,
    };
    let elements: usize = xd.iter().product();
    let (rows, row_len) = match shape {
        Shape::Reduce { outer, reduced, inner, .. } => (outer, reduced * inner),
        Shape::Softmax { rows, cols, .. } => (rows, cols),
        _ => return None,
    };
    // Below a few thousand elements either path takes a microsecond or less.
    if elements == 0 || row_len == 0 || !always && elements < 4096 {
        return None;
    }
    // Up to 4 chunks of rows once there is enough to share: each a few microseconds at least
    // (a reduction streams about 20 floats a nanosecond, softmax's e^x about 2).
    let share = if matches!(shape, Shape::Softmax { .. }) { MIN_MACS / 2 } else { 4 * MIN_MACS };
    let chunks = host.units(elements, share / 4).min(rows);
    Some(Ukernel::unblocked(shape, x, chunks.max(1)))
}

impl KernelShape for Reduce {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Reduce { outer, reduced, inner, kind } = u.shape else { return Err(fmt::Error) };
        let what = ["sum", "mean", "max", "min"][kind as usize];
        writeln!(f, "microkernel: {what} reduction, [{outer}, {reduced}, {inner}] -> [{outer}, {inner}] (outer, reduced, inner)")?;
        let how = if inner == 1 {
            "rows as 4 chains of 16-float vectors, then the lanes"
        } else {
            "whole inner rows added into vectors"
        };
        writeln!(f, "{how}")?;
        writeln!(f, "workgroups: {} (chunks of the outer dimension)", u.workgroups())
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Reduce { outer, reduced, inner, kind } = u.shape else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, p.y];
        args.extend(call.ints(&[outer, reduced, inner, kind as usize]));
        args.extend(call.ints(&[u.chunks]));
        Ok(("kiln_uk_reduce", args))
    }
}

impl KernelShape for Softmax {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Softmax { rows, cols, log } = u.shape else { return Err(fmt::Error) };
        writeln!(
            f,
            "microkernel: {}softmax over {rows} rows of {cols}",
            if log { "log-" } else { "" }
        )?;
        writeln!(f, "per row: the max, e^(x - max) and its sum on vectors, then the scale")?;
        writeln!(f, "workgroups: {} (chunks of rows)", u.workgroups())
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Softmax { rows, cols, log } = u.shape else { return Err(other_shape(u)) };
        let mut args = vec![p.x, p.y];
        args.extend(call.ints(&[rows, cols, log as usize]));
        args.extend(call.ints(&[u.chunks]));
        Ok(("kiln_uk_softmax", args))
    }
}
