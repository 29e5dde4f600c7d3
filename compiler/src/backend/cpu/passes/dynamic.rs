//! Dynamically quantized matrix products for the CPU's integer kernel (`ukernel/dqgemm.rs`,
//! `quantized.c`'s `kiln_uk_dqgemm`).
//!
//! onnxruntime's `quantize_dynamic` (the usual way to quantize BERT- and GPT-style models for
//! CPUs) writes each MatMul by a constant as DynamicQuantizeLinear(x) -> MatMulInteger(q, w_q,
//! zero, w_zero) -> Cast to f32 -> Mul by `scale * w_scale`. The importer expands those ops as
//! ONNX defines them (the min and max reductions, the scale and zero point arithmetic, a
//! QuantizeLinear, and the product in int32 of the operands less their zero points), which the
//! CPU would run as float arithmetic. This pass finds that chain, ending at the Mul, and makes
//! it one `DynQMatMul(x, w, w_scale)` where the kernel runs it (`ukernel::runs_dynamic_product`):
//! the weights a constant matrix less its zero point (after folding, the importer's centred
//! int32 weights are one constant; kept s8 where they fit), the weight scale one constant value
//! or one per column. The QuantizeLinear and its scale stay for any other reader (a second product
//! of the same activation takes its own DynQMatMul) and go where none is left.

use kiln_ir::op::{Reduce, ReduceKind};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor, UnaryOp, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(found) = graph.try_node(id).and_then(|_| dynamic_product(graph, id)) else {
            continue;
        };
        let name = graph.unique_name(&format!("{}/dynamic", graph.node(id).name));
        let w = graph.add_constant(&format!("{name}/weights"), found.weights)?;
        let new = graph.add_node(
            &name,
            Op::DynQMatMul,
            &[Some(found.x), Some(w), Some(found.w_scale)],
        )?;
        if !crate::backend::cpu::ukernel::runs_dynamic_product(graph, new) {
            graph.remove_node(new)?;
            continue;
        }
        graph.replace_uses(ValueId::from(id), ValueId::from(new))?;
        changed = true;
    }
    if changed {
        crate::passes::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// What `dynamic_product` found: the f32 activation, the weights as s8 `[K, M]` (their zero
/// point subtracted) and the weight scale.
struct Found {
    x: ValueId,
    weights: Tensor,
    w_scale: ValueId,
}

/// The node `id` an op of `op`'s kind (compared by `pred`), its operands.
fn node_op(graph: &Graph, v: ValueId, pred: impl Fn(&Op) -> bool) -> Option<Vec<Option<ValueId>>> {
    let node = graph.try_node(v.node)?;
    (v.output == 0 && pred(&node.op)).then(|| graph.operands(v.node))
}

fn binary(graph: &Graph, v: ValueId, op: BinaryOp) -> Option<(ValueId, ValueId)> {
    let ops = node_op(graph, v, |o| *o == Op::Binary(op))?;
    Some((ops.first().copied().flatten()?, ops.get(1).copied().flatten()?))
}

/// The one value of a constant.
fn scalar(graph: &Graph, v: ValueId) -> Option<f64> {
    let t = graph.constant_value(v)?;
    let values = t.to_f64s();
    (values.len() == 1).then(|| values[0])
}

/// `v` is read by one node alone and is no graph output.
fn used_once(graph: &Graph, v: ValueId) -> bool {
    graph.users(v).len() == 1 && !graph.outputs().iter().any(|(_, o)| *o == v)
}

/// Mul `id` ending DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul as the importer writes
/// them (either operand order of each Mul).
fn dynamic_product(graph: &Graph, id: NodeId) -> Option<Found> {
    let (a, b) = binary(graph, ValueId::from(id), BinaryOp::Mul)?;
    [(a, b), (b, a)].into_iter().find_map(|(cast, scales)| product(graph, cast, scales))
}

fn product(graph: &Graph, cast: ValueId, scales: ValueId) -> Option<Found> {
    // Cast(MatMul(Sub(Cast(q), Cast(zero)), weights)) to f32, each read here alone.
    let c = node_op(graph, cast, |o| matches!(o, Op::Cast { to: DType::F32, .. }))?;
    let mm = c.first().copied().flatten()?;
    if !used_once(graph, cast) || !used_once(graph, mm) {
        return None;
    }
    let m_ops = node_op(graph, mm, |o| matches!(o, Op::MatMul))?;
    let (centred, wv) = (m_ops.first().copied().flatten()?, m_ops.get(1).copied().flatten()?);
    let (wide, zero_wide) = binary(graph, centred, BinaryOp::Sub)?;
    let to_i32 = |v: ValueId| -> Option<ValueId> {
        node_op(graph, v, |o| matches!(o, Op::Cast { to: DType::I32, .. }))?
            .first()
            .copied()
            .flatten()
    };
    let (q, zero) = (to_i32(wide)?, to_i32(zero_wide)?);
    let q_ops = node_op(graph, q, |o| matches!(o, Op::Quantize { block_size: 0, .. }))?;
    let (x, scale, q_zero) = (
        q_ops.first().copied().flatten()?,
        q_ops.get(1).copied().flatten()?,
        q_ops.get(2).copied().flatten()?,
    );
    if q_zero != zero || graph.value_type(q).dtype != DType::U8 {
        return None;
    }
    dynamic_quantization(graph, x, scale, zero)?;
    // The weights less their zero point: one int32 constant [K, M] after folding, within s8.
    let wt = graph.constant_value(wv)?;
    let xd = graph.value_type(x).shape.as_fixed()?;
    if graph.value_type(x).dtype != DType::F32
        || wt.dims().len() != 2
        || xd.last() != wt.dims().first()
    {
        return None;
    }
    if !matches!(wt.dtype(), DType::I32 | DType::I8) {
        return None;
    }
    let values = wt.to_f64s();
    // s8 where the values fit (a quarter of the int32 constant's bytes), else int32 (u8 weights
    // less a zero point other than 128: the kernel packs them less a column offset).
    let fits = values.iter().all(|&v| (-128.0..=127.0).contains(&v));
    let dtype = if fits { DType::I8 } else { DType::I32 };
    let weights = Tensor::from_f64s(dtype, wt.dims(), &values).ok()?;
    // The scales: Mul(scale, w_scale) (either order), w_scale one constant f32 or one per column.
    let (s1, s2) = binary(graph, scales, BinaryOp::Mul)?;
    let w_scale = if s1 == scale {
        s2
    } else if s2 == scale {
        s1
    } else {
        return None;
    };
    let ws = graph.constant_value(w_scale)?;
    let m = wt.dims()[1];
    let per_column = ws.dims().len() == 1 && ws.len() == m;
    if ws.dtype() != DType::F32 || !(ws.len() == 1 && ws.dims().len() <= 1 || per_column) {
        return None;
    }
    Some(Found { x, weights, w_scale })
}

/// `scale` and `zero` are DynamicQuantizeLinear's of `x`, as the importer writes its function
/// body: scale = (Max(ReduceMax(x), 0) - Min(ReduceMin(x), 0)) / 255 and zero =
/// Cast<u8>(Round(Clip(0 - min / scale, 0, 255))), the reductions over the whole tensor.
fn dynamic_quantization(graph: &Graph, x: ValueId, scale: ValueId, zero: ValueId) -> Option<()> {
    let (range, top) = binary(graph, scale, BinaryOp::Div)?;
    (scalar(graph, top)? == 255.0).then_some(())?;
    let (hi, lo) = binary(graph, range, BinaryOp::Sub)?;
    // Max(ReduceMax(x), 0) and Min(ReduceMin(x), 0), either operand order.
    let bounded = |v: ValueId, op: BinaryOp, kind: ReduceKind| -> Option<()> {
        let (a, b) = binary(graph, v, op)?;
        let reduced = match (scalar(graph, a), scalar(graph, b)) {
            (_, Some(0.0)) => a,
            (Some(0.0), _) => b,
            _ => return None,
        };
        let r = node_op(
            graph,
            reduced,
            |o| matches!(o, Op::Reduce(Reduce { kind: k, noop_with_empty_axes: false, .. }) if *k == kind),
        )?;
        (r.len() == 1 && r[0] == Some(x)).then_some(())
    };
    bounded(hi, BinaryOp::Max, ReduceKind::Max)?;
    bounded(lo, BinaryOp::Min, ReduceKind::Min)?;
    let z = node_op(graph, zero, |o| matches!(o, Op::Cast { to: DType::U8, .. }))?;
    let rounded = z.first().copied().flatten()?;
    let r = node_op(graph, rounded, |o| *o == Op::Unary(UnaryOp::Round))?;
    let clipped = r.first().copied().flatten()?;
    let c = node_op(graph, clipped, |o| matches!(o, Op::Clip))?;
    let bound = |i: usize| c.get(i).copied().flatten().and_then(|v| scalar(graph, v));
    if c.len() != 3 || bound(1)? != 0.0 || bound(2)? != 255.0 {
        return None;
    }
    let (zero_fp, scaled) = binary(graph, c[0]?, BinaryOp::Sub)?;
    (scalar(graph, zero_fp)? == 0.0).then_some(())?;
    let (min, s) = binary(graph, scaled, BinaryOp::Div)?;
    (min == lo && s == scale).then_some(())
}
