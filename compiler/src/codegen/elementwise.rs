//! Elementwise chains: a run of elementwise nodes in a kernel becomes one `linalg.generic` over the
//! last node's shape; each outside operand is read through a broadcasting map, and the body
//! evaluates the chain in registers.

use std::collections::HashMap;

use kiln_ir::{Graph, NodeId, Op, ValueId};

use super::mlir::{broadcast_map, generic, push};
use super::scalar::{Scalar, ScalarBuilder};
use super::Emitter;
use crate::Result;
use melior::ir::BlockLike;

pub(super) fn emit_chain(em: &mut Emitter, nodes: &[NodeId]) -> Result<()> {
    let graph = em.graph;
    let last = *nodes.last().expect("a chain has nodes");
    let result = ValueId::from(last);
    let out_dims = em.dims(result);
    let out_dtype = em.ty(result).dtype;
    let rank = out_dims.len();
    // Operands produced outside the chain, in first-use order.
    let inside: Vec<NodeId> = nodes.to_vec();
    let mut outer: Vec<ValueId> = Vec::new();
    for &id in nodes {
        for v in graph.operands(id).into_iter().flatten() {
            if !inside.contains(&v.node) && !outer.contains(&v) {
                outer.push(v);
            }
        }
    }
    let ins: Vec<_> = outer.iter().map(|&v| em.value(v)).collect::<Result<_>>()?;
    let dest = em.dest(result)?;
    let mut maps: Vec<String> =
        outer.iter().map(|&v| broadcast_map(rank, &em.dims(v), &out_dims)).collect();
    maps.push(broadcast_map(rank, &out_dims, &out_dims));
    let iterators = vec!["parallel"; rank];
    let out_ty = em.tensor_type(&out_dims, out_dtype)?;
    let (ctx, loc) = (em.ctx, em.loc);
    let g = generic(ctx, loc, &ins, &[dest], &maps, &iterators, &[out_ty], |body| {
        let b = ScalarBuilder { ctx, loc, block: body };
        let mut vals: HashMap<ValueId, Scalar> = HashMap::new();
        for (i, &v) in outer.iter().enumerate() {
            let arg = body.argument(i).expect("one argument per input").into();
            vals.insert(v, b.load(arg, graph.value_type(v).dtype)?);
        }
        eval_chain(&b, graph, nodes, &mut vals)?;
        Ok(vec![b.store(vals[&result])?])
    })?;
    let t = push(em.block, g);
    em.set(result, t);
    Ok(())
}

/// Evaluates the elementwise `nodes` in order on scalars: `vals` holds every operand produced
/// outside them and receives each node's result. Codegen's loop bodies and the GPU tile kernels'
/// epilogues share it, so an elementwise op means the same wherever it is fused.
pub(crate) fn eval_chain<'c, 'a>(
    b: &ScalarBuilder<'c, 'a>,
    graph: &Graph,
    nodes: &[NodeId],
    vals: &mut HashMap<ValueId, Scalar<'c, 'a>>,
) -> Result<()> {
    for &id in nodes {
        let node = graph.node(id);
        let operands: Vec<Option<Scalar>> =
            graph.operands(id).into_iter().map(|o| o.map(|v| vals[&v])).collect();
        let x = operands[0].expect("elementwise ops have a first operand");
        let out = node.outputs[0].dtype;
        let y = match &node.op {
            Op::Unary(u) => b.unary(*u, x, out)?,
            Op::Binary(op) => b.binary(*op, x, operands[1].expect("binary"), out)?,
            Op::Cast { to, saturate } => b.cast_with(x, *to, *saturate)?,
            Op::BitCast { to } => b.bitcast(x, *to)?,
            Op::Identity => x,
            Op::Where => {
                let (t, f) = (operands[1].expect("where"), operands[2].expect("where"));
                let v = b.select(x.v, t.v, f.v, super::scalar::compute(t.dtype))?;
                Scalar { v, dtype: out }
            }
            Op::Clip => {
                clip(b, x, operands.get(1).copied().flatten(), operands.get(2).copied().flatten())?
            }
            other => unreachable!("{} is not elementwise", other.name()),
        };
        vals.insert(ValueId::from(id), y);
    }
    Ok(())
}

fn clip<'c, 'a>(
    b: &ScalarBuilder<'c, 'a>,
    x: Scalar<'c, 'a>,
    lo: Option<Scalar<'c, 'a>>,
    hi: Option<Scalar<'c, 'a>>,
) -> Result<Scalar<'c, 'a>> {
    let d = x.dtype;
    let t = super::scalar::compute(d);
    let (max, min) = if d.is_float() {
        ("arith.maximumf", "arith.minimumf")
    } else if d.is_signed_int() {
        ("arith.maxsi", "arith.minsi")
    } else {
        ("arith.maxui", "arith.minui")
    };
    let mut v = x.v;
    if let Some(l) = lo {
        v = b.emit(max, &[v, l.v], t)?;
    }
    if let Some(h) = hi {
        v = b.emit(min, &[v, h.v], t)?;
    }
    Ok(Scalar { v, dtype: d })
}
