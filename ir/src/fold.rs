//! Constant folding of single nodes: the results of a node whose value is known before run time.
//! The ONNX importer folds as it builds (so shape arithmetic collapses and inference sees real
//! shapes), and the compiler's folding pass uses the same rule.

use crate::{eval, Graph, Op, Tensor, ValueId};

/// Results larger than this many elements are left to run time rather than stored as constants.
pub const FOLD_LIMIT: usize = 1 << 24;

/// The results of `op` on `operands` if they are known now: every present operand is a constant
/// (and the op is deterministic), or the op only reads a static shape (Shape, Size). `None` when
/// not foldable, too large, or when evaluating fails (the error then surfaces at run time).
pub fn fold(
    graph: &Graph,
    op: &Op,
    operands: &[Option<ValueId>],
    num_outputs: usize,
) -> Option<Vec<Tensor>> {
    match op {
        // Loop and Scan run their bodies: a Loop of constant operands may run 10^15 trips, so
        // folding never runs them (the compiler unrolls small ones, `passes/unroll.rs`, and
        // runs the rest).
        Op::Input | Op::Constant(_) | Op::If { .. } | Op::Loop(_) | Op::Scan(_) => return None,
        Op::Shape { start, end } => {
            let dims = graph.value_type(operands.first().copied().flatten()?).shape.as_fixed()?;
            let (lo, hi) = crate::infer::shape_interval(dims.len(), *start, *end);
            let picked: Vec<i64> = dims[lo..hi.max(lo)].iter().map(|&d| d as i64).collect();
            return Some(vec![Tensor::vector(&picked)]);
        }
        Op::Size => {
            let n = graph.value_type(operands.first().copied().flatten()?).shape.numel()?;
            return Some(vec![Tensor::scalar(n as i64)]);
        }
        // A sequence's length and whether an optional holds a value are known from their types
        // when the ops that made them say so; nothing else about them is a constant tensor.
        Op::Sequence(crate::op::SequenceOp::Length) => {
            match graph.value_type(operands.first().copied().flatten()?).kind {
                crate::Kind::Sequence { len: Some(n), .. } => {
                    return Some(vec![Tensor::scalar(n as i64)])
                }
                _ => return None,
            }
        }
        Op::Optional(crate::op::OptionalOp::HasElement) => {
            let has = match operands.first().copied().flatten() {
                None => false,
                Some(v) => match graph.value_type(v).kind {
                    crate::Kind::Optional { .. } => return None,
                    _ => true,
                },
            };
            return Some(vec![Tensor::scalar(has)]);
        }
        Op::Sequence(_) | Op::Optional(_) => return None,
        // A dequantized constant (a quantized model's weight or bias) keeps its integers, scale
        // and zero point, so that the CPU's integer kernels can take them (the compiler's
        // `integer` pass); decomposition turns the rest into arithmetic that folds.
        Op::Dequantize { .. } => return None,
        _ => {}
    }
    // What the graph would refuse is not folded either (the refusal names the node then).
    crate::graph::check_arity(op, operands).ok()?;
    // Every present operand must be a constant.
    let values: Vec<Option<&Tensor>> = operands
        .iter()
        .map(|o| match o {
            None => Some(None),
            Some(v) => graph.constant_value(*v).map(Some),
        })
        .collect::<Option<Vec<_>>>()?;
    let types = crate::infer::infer(
        op,
        &operands
            .iter()
            .map(|o| {
                o.map(|v| crate::infer::Operand {
                    ty: graph.value_type(v),
                    value: graph.constant_value(v),
                })
            })
            .collect::<Vec<_>>(),
        "fold",
    )
    .ok()?;
    if types.iter().take(num_outputs).any(|t| t.shape.numel().is_none_or(|n| n > FOLD_LIMIT)) {
        return None;
    }
    eval::eval_op(op, &values, num_outputs).ok()
}
