//! The reference interpreter: runs a graph on concrete tensors, op by op. Correct first and clear;
//! it is the oracle that compiled code is tested against, and the engine of constant folding.
//!
//! Each op first has its result types inferred from the concrete operands (so shape rules live in
//! one place, `infer`), then its data computed on ndarray views. Floats are computed in f64 and
//! rounded to the result type; integers in i128 with wrap-around, as C and numpy do. One op family
//! a file, as in `infer`: each file's `eval` takes its family's ops.

mod collection;
mod contraction;
mod control;
mod elementwise;
mod generate;
mod indexing;
mod loss;
mod movement;
mod normalize;
mod quantize;
mod reduce;
mod resize;
pub(crate) mod select;
mod sequence;
mod signal;
pub(crate) mod strings;
mod window;

pub use indexing::pad_axis;
pub use quantize::{quantized_range, requant_multiplier, requantise};
pub use resize::{
    affine_grid_base, affine_grid_positions, grid_bounds, grid_cubic_weights, grid_denormalize,
    grid_reflect, resize_steps, ResizeStep, GRID_COORD_BOUND, GRID_CUBIC_A,
};

use std::collections::HashMap;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::error::{invalid, OpError};
use crate::infer::{self, Operand};
use crate::op::OpFamily;
use crate::{Dim, Element, Graph, IrError, Op, Result, Tensor, TensorType, Value, ValueId};

/// How the interpreter runs a graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalOptions {
    /// The most steps one run of a Loop may take: a Loop that would take another fails the run,
    /// naming it (`--max-loop-steps`). `None`, the default: no limit, as in ONNX, where a Loop
    /// with no trip count runs until its condition turns false, if ever.
    pub max_loop_steps: Option<u64>,
}

/// Runs `graph` on `inputs` (in graph-input order) and returns its outputs in graph-output order.
/// Every input and output is a tensor; [`run_values`] takes and gives sequences and optionals.
pub fn run(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    run_with(graph, inputs, &EvalOptions::default())
}

/// [`run`] with options.
pub fn run_with(graph: &Graph, inputs: &[Tensor], options: &EvalOptions) -> Result<Vec<Tensor>> {
    let inputs: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
    run_values_with(graph, &inputs, options)?
        .into_iter()
        .zip(graph.outputs())
        .map(|(v, (name, _))| {
            v.into_tensor()
                .map_err(|e| IrError::Input { name: name.clone(), msg: format!("output: {e}") })
        })
        .collect()
}

/// Runs `graph` on `inputs` (in graph-input order), any of which may be a sequence or an optional.
pub fn run_values(graph: &Graph, inputs: &[Value]) -> Result<Vec<Value>> {
    run_values_with(graph, inputs, &EvalOptions::default())
}

/// [`run_values`] with options (they hold inside every branch and body it runs too).
pub fn run_values_with(
    graph: &Graph,
    inputs: &[Value],
    options: &EvalOptions,
) -> Result<Vec<Value>> {
    check_inputs(graph, inputs)?;
    let order = graph.topo_order()?;
    // How many times each value is still to be read, so intermediates are dropped early.
    let mut uses: HashMap<ValueId, usize> = HashMap::new();
    for &id in &order {
        for v in graph.operands(id).into_iter().flatten() {
            *uses.entry(v).or_default() += 1;
        }
    }
    for (_, v) in graph.outputs() {
        *uses.entry(*v).or_default() += 1;
    }
    let mut values: HashMap<ValueId, Value> = HashMap::new();
    for (i, &id) in graph.inputs().iter().enumerate() {
        values.insert(id.into(), inputs[i].clone());
    }
    for id in order {
        let node = graph.node(id);
        if matches!(node.op, Op::Input) {
            continue;
        }
        let operand_ids = graph.operands(id);
        let results = {
            let operands: Vec<Option<&Value>> =
                operand_ids.iter().map(|o| o.map(|v| &values[&v])).collect();
            eval_node(&node.op, &operands, node.outputs.len(), options)
                .map_err(|error| IrError::eval(node.name.clone(), node.op.name(), error))?
        };
        for v in operand_ids.into_iter().flatten() {
            let n = uses.get_mut(&v).expect("counted above");
            *n -= 1;
            if *n == 0 {
                values.remove(&v);
            }
        }
        for (i, t) in results.into_iter().enumerate() {
            let v = ValueId::new(id, i);
            if uses.get(&v).copied().unwrap_or(0) > 0 {
                values.insert(v, t);
            }
        }
    }
    Ok(graph.outputs().iter().map(|(_, v)| values[v].clone()).collect())
}

/// One node on values: ops that take sequences and optionals see them; every other op takes
/// tensors.
fn eval_node(
    op: &Op,
    operands: &[Option<&Value>],
    num_outputs: usize,
    options: &EvalOptions,
) -> Result<Vec<Value>, OpError> {
    match op.family() {
        OpFamily::Collection => collection::eval(op, operands, options),
        _ if matches!(op, Op::Identity) => {
            Ok(vec![operands.first().copied().flatten().ok_or("operand 0 is missing")?.clone()])
        }
        OpFamily::Control => {
            let mut r = control::eval(op, operands, options)?;
            r.truncate(num_outputs);
            Ok(r)
        }
        _ => {
            let tensors: Vec<Option<&Tensor>> = operands
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    o.map(|v| {
                        v.as_tensor().map_err(|e| OpError::Operand { index: i, error: Box::new(e) })
                    })
                    .transpose()
                })
                .collect::<Result<_, OpError>>()?;
            Ok(eval_op(op, &tensors, num_outputs)?.into_iter().map(Value::Tensor).collect())
        }
    }
}

/// Runs `graph` on inputs given by name.
pub fn run_named(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
    let mut ordered = Vec::with_capacity(graph.inputs().len());
    for &id in graph.inputs() {
        let name = &graph.node(id).name;
        let t = inputs.get(name).ok_or_else(|| IrError::Input {
            name: name.clone(),
            msg: format!("missing (expected {})", graph.node(id).outputs[0]),
        })?;
        ordered.push(t.clone());
    }
    if let Some(extra) =
        inputs.keys().find(|k| !graph.inputs().iter().any(|&id| &graph.node(id).name == *k))
    {
        return Err(IrError::Input {
            name: extra.clone(),
            msg: "the graph has no input of this name".into(),
        });
    }
    run(graph, &ordered)
}

/// Checks inputs against the declared types; a symbol must stand for the same size everywhere
/// (in a sequence's elements, each element binds the symbols for itself: they may differ).
pub fn check_inputs(graph: &Graph, inputs: &[Value]) -> Result<()> {
    if inputs.len() != graph.inputs().len() {
        let names: Vec<String> = graph
            .inputs()
            .iter()
            .map(|&id| format!("{}: {}", graph.node(id).name, graph.node(id).outputs[0]))
            .collect();
        return Err(IrError::Input {
            name: graph.name.clone(),
            msg: format!(
                "the graph takes {} inputs ({}), {} given",
                names.len(),
                names.join(", "),
                inputs.len()
            ),
        });
    }
    let mut bound: HashMap<&str, usize> = HashMap::new();
    for (&id, v) in graph.inputs().iter().zip(inputs) {
        let node = graph.node(id);
        let want = &node.outputs[0];
        let bad = |msg: String| IrError::Input { name: node.name.clone(), msg };
        let t = match v {
            Value::Tensor(t) if want.kind.is_tensor() => t,
            other => {
                if !other.fits(want) {
                    return Err(bad(format!("expected {want}, got {}", other.describe())));
                }
                continue;
            }
        };
        if t.dtype() != want.dtype || t.rank() != want.rank() {
            return Err(bad(format!("expected {want}, got {}", t.ty())));
        }
        for (d, &n) in want.shape.dims().iter().zip(t.dims()) {
            match d {
                Dim::Fixed(m) if *m != n => {
                    return Err(bad(format!("expected {want}, got {}", t.ty())))
                }
                Dim::Sym(s) => {
                    if let Some(&prev) = bound.get(&**s) {
                        if prev != n {
                            return Err(bad(format!(
                                "`{s}` is {prev} in an earlier input but {n} here ({})",
                                t.ty()
                            )));
                        }
                    }
                    bound.insert(s, n);
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Evaluates one op on concrete operands; returns its first `num_outputs` results.
pub fn eval_op(
    op: &Op,
    operands: &[Option<&Tensor>],
    num_outputs: usize,
) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Input => return Err("graph inputs are not evaluated".into()),
        Op::Constant(t) => return Ok(vec![t.clone()]),
        // A branch's result shapes are known once it has run.
        _ if op.family() == OpFamily::Control => {
            let values: Vec<Option<Value>> =
                operands.iter().map(|o| o.cloned().map(Value::Tensor)).collect();
            let refs: Vec<Option<&Value>> = values.iter().map(Option::as_ref).collect();
            let mut r = control::eval(op, &refs, &EvalOptions::default())?;
            r.truncate(num_outputs);
            return r.into_iter().map(Value::into_tensor).collect();
        }
        _ if op.family() == OpFamily::Collection => {
            return Err(invalid!("{} gives a sequence or an optional, not tensors", op.name()))
        }
        _ => {}
    }
    let types: Vec<TensorType> = operands
        .iter()
        .map(|o| {
            o.map(|t| t.ty())
                .unwrap_or_else(|| TensorType::new(crate::DType::F32, crate::Shape::scalar()))
        })
        .collect();
    let infer_ops: Vec<Option<Operand>> = operands
        .iter()
        .zip(&types)
        .map(|(o, ty)| o.map(|t| Operand { ty, value: Some(t) }))
        .collect();
    let out_types = infer::infer(op, &infer_ops, "eval")?;
    let out_dims: Vec<Vec<usize>> = out_types
        .iter()
        .map(|t| {
            t.shape
                .as_fixed()
                .ok_or_else(|| invalid!("result shape {t} is not known from the operands"))
        })
        .collect::<Result<_, OpError>>()?;
    // Each result is checked against the memory available before the op allocates it.
    let limit = crate::memory::available_at_start();
    for (t, dims) in out_types.iter().zip(&out_dims).take(num_outputs.max(1)) {
        match crate::memory::bytes_of(dims, t.dtype.size()) {
            Some(b) if b <= limit => {}
            b => {
                let need = b.map_or("more than 2^64 bytes".to_string(), |b| {
                    format!("{b} bytes ({})", crate::memory::human(b))
                });
                return Err(invalid!(
                    "the result {t} needs {need}, more than the {limit} bytes ({}) of memory available",
                    crate::memory::human(limit)
                ));
            }
        }
    }
    // Strings have no typed view: the string rules take every node that holds them.
    let holds_strings = op.family() == OpFamily::Strings
        || operands.iter().flatten().any(|t| t.dtype().is_string())
        || out_types.iter().any(|t| t.dtype.is_string());
    if holds_strings {
        let mut results = strings::eval(op, operands, &out_types, num_outputs)?;
        results.truncate(num_outputs);
        return Ok(results);
    }
    let mut results = match op.family() {
        OpFamily::Source | OpFamily::Control | OpFamily::Collection | OpFamily::Strings => {
            unreachable!("handled above")
        }
        OpFamily::Elementwise => elementwise::eval(op, operands, &out_types, &out_dims)?,
        OpFamily::Contraction => contraction::eval(op, operands, &out_types, &out_dims)?,
        OpFamily::Window => window::eval(op, operands, &out_types, &out_dims, num_outputs)?,
        OpFamily::Normalize => normalize::eval(op, operands, &out_types)?,
        OpFamily::Reduce => reduce::eval(op, operands, &out_types, &out_dims)?,
        OpFamily::Movement => movement::eval(op, operands, &out_dims)?,
        OpFamily::Indexing => indexing::eval(op, operands, &out_types)?,
        OpFamily::Generate => generate::eval(op, operands, &out_types, &out_dims)?,
        OpFamily::Resize => resize::eval(op, operands, &out_types)?,
        OpFamily::Signal => signal::eval(op, operands, &out_types)?,
        OpFamily::Sequence => sequence::eval(op, operands, &out_types)?,
        OpFamily::Loss => loss::eval(op, operands, &out_types)?,
        OpFamily::Quantize => quantize::eval(op, operands, &out_types)?,
    };
    results.truncate(num_outputs);
    Ok(results)
}

// ----- helpers shared by the op families -----

/// A zero-copy ndarray view of a tensor of element type `T`.
pub(crate) fn view<T: Element>(t: &Tensor) -> ArrayViewD<'_, T> {
    ArrayViewD::from_shape(
        IxDyn(t.dims()),
        t.as_slice::<T>().expect("dispatched on the tensor's dtype"),
    )
    .expect("dims match the data")
}

/// A tensor from an ndarray array (copied into row-major order).
pub(crate) fn tensor<T: Element>(a: ArrayD<T>) -> Tensor {
    let dims = a.shape().to_vec();
    let a = a.as_standard_layout();
    Tensor::from_slice(&dims, a.as_slice().expect("standard layout is contiguous"))
        .expect("dims match the data")
}

/// Calls `$f::<T>(args)` for the Rust type `T` of a runtime dtype.
macro_rules! typed {
    ($dt:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dt {
            $crate::DType::F32 => $f::<f32>($($arg),*),
            $crate::DType::F64 => $f::<f64>($($arg),*),
            $crate::DType::F16 => $f::<$crate::f16>($($arg),*),
            $crate::DType::BF16 => $f::<$crate::bf16>($($arg),*),
            $crate::DType::I8 => $f::<i8>($($arg),*),
            $crate::DType::I16 => $f::<i16>($($arg),*),
            $crate::DType::I32 => $f::<i32>($($arg),*),
            $crate::DType::I64 => $f::<i64>($($arg),*),
            $crate::DType::U8 => $f::<u8>($($arg),*),
            $crate::DType::U16 => $f::<u16>($($arg),*),
            $crate::DType::U32 => $f::<u32>($($arg),*),
            $crate::DType::U64 => $f::<u64>($($arg),*),
            $crate::DType::Bool => $f::<bool>($($arg),*),
            $crate::DType::F8E4M3FN => $f::<$crate::narrow::F8E4M3FN>($($arg),*),
            $crate::DType::F8E4M3FNUZ => $f::<$crate::narrow::F8E4M3FNUZ>($($arg),*),
            $crate::DType::F8E5M2 => $f::<$crate::narrow::F8E5M2>($($arg),*),
            $crate::DType::F8E5M2FNUZ => $f::<$crate::narrow::F8E5M2FNUZ>($($arg),*),
            $crate::DType::F8E8M0 => $f::<$crate::narrow::F8E8M0>($($arg),*),
            $crate::DType::F4E2M1 => $f::<$crate::narrow::F4E2M1>($($arg),*),
            $crate::DType::I4 => $f::<$crate::narrow::I4>($($arg),*),
            $crate::DType::U4 => $f::<$crate::narrow::U4>($($arg),*),
            $crate::DType::I2 => $f::<$crate::narrow::I2>($($arg),*),
            $crate::DType::U2 => $f::<$crate::narrow::U2>($($arg),*),
            // `eval_op` sends every node with a string operand or result to `strings::eval`.
            $crate::DType::String => unreachable!("string tensors are evaluated by `strings`"),
        }
    };
}
pub(crate) use typed;

/// Operand 0, which inference has checked is there.
pub(crate) fn first<'t>(operands: &[Option<&'t Tensor>]) -> &'t Tensor {
    operands[0].expect("inference checked operand 0")
}

/// What an op without an interpreter yet reports.
pub(crate) fn not_yet(op: &Op) -> Result<Vec<Tensor>, OpError> {
    Err(invalid!("{} is not implemented yet", op.name()))
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}
