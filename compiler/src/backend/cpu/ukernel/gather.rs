//! Row gathers (`Shape::Gather`, `gather.c`): planned, described and called. Nothing is packed.

use std::fmt;

use kiln_ir::{DType, Graph, NodeId};
use melior::ir::Value;

use super::{other_shape, Call, Host, KernelShape, Pointers, Shape, Ukernel};
use crate::fuse::Kernel;
use crate::Result;

/// Gathers along axis 0: `kiln_uk_gather_rows`.
pub(super) struct Gather;

/// A Gather along axis 0 with nothing after it: whole rows copied by index. The linalg path
/// loads element by element; rows of 64 bytes and more copy faster whole.
pub(super) fn plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    axis: i64,
    tail: &[NodeId],
    always: bool,
    host: &Host,
) -> Option<Ukernel> {
    let operands = graph.operands(root);
    let (data, indices) =
        (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let dd = graph.value_type(data).shape.as_fixed()?;
    let id = graph.value_type(indices).shape.as_fixed()?;
    let idx64 = match graph.value_type(indices).dtype {
        DType::I64 => true,
        DType::I32 => false,
        _ => return None,
    };
    if !tail.is_empty() || dd.is_empty() || !(axis == 0 || axis == -(dd.len() as i64)) || dd[0] == 0
    {
        return None;
    }
    if !kernel.inputs.contains(&data) || !kernel.inputs.contains(&indices) {
        return None;
    }
    let row_bytes = dd[1..].iter().product::<usize>() * graph.value_type(data).dtype.size();
    let n_idx: usize = id.iter().product();
    if n_idx == 0 || row_bytes == 0 || !always && (row_bytes < 64 || n_idx * row_bytes < 16 << 10) {
        return None;
    }
    let chunks = host.units(n_idx * row_bytes, 64 << 10).min(n_idx);
    Some(Ukernel::unblocked(
        Shape::Gather { indices, rows: dd[0], row_bytes, n_idx, idx64 },
        data,
        chunks,
    ))
}

impl KernelShape for Gather {
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
        let Shape::Gather { rows, row_bytes, n_idx, .. } = u.shape else { return Err(fmt::Error) };
        writeln!(f, "microkernel: gather of {n_idx} rows of {row_bytes} bytes from a table of {rows} rows (row copies)")?;
        writeln!(f, "workgroups: {} (chunks of the indices)", u.workgroups())
    }

    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)> {
        let Shape::Gather { indices, rows, row_bytes, n_idx, idx64 } = u.shape else {
            return Err(other_shape(u));
        };
        let mut args = vec![p.x, call.input(indices)?, p.y];
        args.extend(call.ints(&[rows, row_bytes, n_idx, idx64 as usize]));
        args.extend(call.ints(&[u.chunks]));
        Ok(("kiln_uk_gather_rows", args))
    }
}
