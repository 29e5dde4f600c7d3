//! Transposes that move the last axis (`Shape::Transpose`, `movement.c`): planned, described and
//! called. Nothing is packed.

use std::fmt;

use kiln_ir::{Graph, NodeId};
use melior::ir::Value;

use super::{other_shape, Call, Host, KernelShape, Pointers, Shape, Ukernel};
use crate::fuse::Kernel;
use crate::Result;

/// Transposes as batches of 2-D ones: `kiln_uk_transpose`.
pub(super) struct Transpose;

/// A Transpose alone whose permutation swaps two adjacent groups of axes, the last axis among
/// them (NCHW <-> NHWC, a matrix transpose, [B, S, D] -> [B, D, S]), on 32-bit elements. The
/// linalg path vectorises along the output's last axis, which the input strides across: it moves
/// one element at a time (NCHW -> NHWC of 64 x 56 x 56: 0.074 ms, 0.035 in 16x16 blocks).
/// Permutations that keep the last axis last copy whole runs on the linalg path already.
pub(super) fn plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    perm: &[usize],
    tail: &[NodeId],
    host: &Host,
) -> Option<Ukernel> {
    let x = graph.operands(root).first().copied().flatten()?;
    let dims = graph.value_type(x).shape.as_fixed()?;
    let r = dims.len();
    if !tail.is_empty()
        || r < 2
        || perm.len() != r
        || graph.value_type(x).dtype.size() != 4
        || !kernel.inputs.contains(&x)
    {
        return None;
    }
    // perm = [0 .. b) ++ [s .. r) ++ [b .. s): axes b..s (R) and s..r (C) trade places.
    let b = (0..r).find(|&i| perm[i] != i)?;
    let s = perm[b];
    let swapped = s > b
        && s < r
        && (b..r)
            .all(|i| perm[i] == if i < b + (r - s) { s + (i - b) } else { b + (i - b - (r - s)) });
    if !swapped {
        return None;
    }
    let batch: usize = dims[..b].iter().product();
    let (rows, cols): (usize, usize) = (dims[b..s].iter().product(), dims[s..].iter().product());
    if batch * rows * cols == 0 || rows == 1 || cols == 1 {
        return None;
    }
    let bytes = batch * rows * cols * 4;
    // About 4 units in all when it is worth handing some to another thread.
    let target = host.units(bytes, 64 << 10);
    let chunks = if target == 1 { 1 } else { target.div_ceil(batch).min(cols.div_ceil(16)) };
    Some(Ukernel::unblocked(Shape::Transpose { batch, rows, cols }, x, chunks))
}

impl KernelShape for Transpose {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Transpose { batch, rows, cols } = u.shape else { return Err(fmt::Error) };
        writeln!(f, "microkernel: transpose of {batch} matrices [{rows}, {cols}] -> [{cols}, {rows}] (the last axis moves)")?;
        writeln!(
            f,
            "16x16 blocks through registers (four rounds of interleaves), edge blocks masked"
        )?;
        writeln!(f, "workgroups: {} ({} chunk(s) of columns per matrix)", u.workgroups(), u.chunks)
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Transpose { batch, rows, cols } = u.shape else { return Err(other_shape(u)) };
        let mut args = vec![p.x, p.y];
        args.extend(call.ints(&[batch, rows, cols]));
        args.extend(call.ints(&[u.chunks]));
        Ok(("kiln_uk_transpose", args))
    }
}
