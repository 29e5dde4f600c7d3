//! Sequences and optionals, on values: a sequence is a list of tensors, an optional holds one
//! value or none.

use crate::error::{invalid, OpError};
use crate::op::{OptionalOp, SequenceOp};
use crate::shape::normalize_axis;
use crate::{Op, Tensor, Value};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Value>],
    options: &crate::eval::EvalOptions,
) -> Result<Vec<Value>, OpError> {
    let v = match op {
        Op::Sequence(s) => return sequence(s, operands, options),
        Op::Optional(o) => optional(o, operands)?,
        _ => return Err(invalid!("{} is not a sequence or optional op", op.name())),
    };
    Ok(vec![v])
}

fn operand<'a>(operands: &[Option<&'a Value>], i: usize) -> Result<&'a Value, OpError> {
    operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i })
}

fn seq<'a>(operands: &[Option<&'a Value>], i: usize) -> Result<&'a [Tensor], OpError> {
    match operand(operands, i)? {
        Value::Sequence(s) => Ok(s),
        other => Err(invalid!("operand {i} must be a sequence, got {}", other.describe())),
    }
}

fn tensor<'a>(operands: &[Option<&'a Value>], i: usize) -> Result<&'a Tensor, OpError> {
    operand(operands, i)?.as_tensor().map_err(|e| OpError::Operand { index: i, error: Box::new(e) })
}

/// A position in a sequence of `len` (`insert`: the end is allowed too), negative from the end.
fn position(
    operands: &[Option<&Value>],
    i: usize,
    len: usize,
    insert: bool,
) -> Result<Option<usize>, OpError> {
    let Some(p) = operands.get(i).copied().flatten() else { return Ok(None) };
    let p = p.as_tensor()?.to_i64s().first().copied().ok_or("the position is empty")?;
    let n = len as i64;
    let hi = if insert { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(invalid!("position {p} is outside a sequence of {len}"));
    }
    Ok(Some(if p < 0 { p + n } else { p } as usize))
}

fn sequence(
    s: &SequenceOp,
    operands: &[Option<&Value>],
    options: &crate::eval::EvalOptions,
) -> Result<Vec<Value>, OpError> {
    let v = match s {
        SequenceOp::Empty { .. } => Value::Sequence(Vec::new()),
        SequenceOp::Construct => {
            let items: Vec<Tensor> = (0..operands.len())
                .map(|i| tensor(operands, i).cloned())
                .collect::<Result<_, _>>()?;
            if let Some(t) = items.iter().find(|t| t.dtype() != items[0].dtype()) {
                return Err(invalid!("the elements are {} and {}", items[0].ty(), t.ty()));
            }
            Value::Sequence(items)
        }
        SequenceOp::Insert => {
            let mut items = seq(operands, 0)?.to_vec();
            let x = tensor(operands, 1)?;
            if items.first().is_some_and(|t| t.dtype() != x.dtype()) {
                return Err(invalid!(
                    "inserting {} into a sequence of {}",
                    x.ty(),
                    items[0].dtype()
                ));
            }
            let at = position(operands, 2, items.len(), true)?.unwrap_or(items.len());
            items.insert(at, x.clone());
            Value::Sequence(items)
        }
        SequenceOp::Erase => {
            let mut items = seq(operands, 0)?.to_vec();
            if items.is_empty() {
                return Err("erasing from an empty sequence".into());
            }
            let at = position(operands, 1, items.len(), false)?.unwrap_or(items.len() - 1);
            items.remove(at);
            Value::Sequence(items)
        }
        SequenceOp::At => {
            let items = seq(operands, 0)?;
            let at =
                position(operands, 1, items.len(), false)?.ok_or("SequenceAt needs a position")?;
            Value::Tensor(items[at].clone())
        }
        SequenceOp::Length => Value::Tensor(Tensor::scalar(seq(operands, 0)?.len() as i64)),
        SequenceOp::Split { axis, keepdims } => {
            let x = tensor(operands, 0)?;
            let split = operands
                .get(1)
                .copied()
                .flatten()
                .map(|v| v.as_tensor().map(|t| (t.rank(), t.to_i64s())))
                .transpose()?;
            Value::Sequence(split_to_sequence(x, *axis, *keepdims, split)?)
        }
        SequenceOp::Concat { axis, new_axis } => {
            let items = seq(operands, 0)?;
            let first = items.first().ok_or("joining an empty sequence")?;
            if *new_axis {
                let a = normalize_axis(*axis, first.rank() + 1)
                    .ok_or_else(|| invalid!("axis {axis} is outside rank {}", first.rank() + 1))?;
                Value::Tensor(
                    Tensor::stack(first.dtype(), first.dims(), items, a).map_err(OpError::from)?,
                )
            } else {
                let a = normalize_axis(*axis, first.rank())
                    .ok_or_else(|| invalid!("axis {axis} is outside {}", first.ty()))?;
                for t in items {
                    let same = t.dtype() == first.dtype()
                        && t.rank() == first.rank()
                        && t.dims()
                            .iter()
                            .zip(first.dims())
                            .enumerate()
                            .all(|(i, (x, y))| i == a || x == y);
                    if !same {
                        return Err(invalid!(
                            "cannot join {} and {} along axis {a}",
                            first.ty(),
                            t.ty()
                        ));
                    }
                }
                let items: Vec<&Tensor> = items.iter().collect();
                if first.dtype().is_string() {
                    // (The join works on numbers: strings go by their positions.)
                    let joined = super::strings::by_position(&items, |p| {
                        vec![super::movement::concat(p, a as i64)]
                    })?;
                    Value::Tensor(joined.into_iter().next().expect("one join"))
                } else {
                    Value::Tensor(super::movement::concat(&items, a as i64))
                }
            }
        }
        SequenceOp::Map { body, captures } => return map(&body.0, *captures, operands, options),
    };
    Ok(vec![v])
}

/// SplitToSequence: pieces along `axis` of the lengths `split` gives (see [`SequenceOp::Split`]).
fn split_to_sequence(
    x: &Tensor,
    axis: i64,
    keepdims: bool,
    split: Option<(usize, Vec<i64>)>,
) -> Result<Vec<Tensor>, OpError> {
    let a = normalize_axis(axis, x.rank())
        .ok_or_else(|| invalid!("axis {axis} is outside {}", x.ty()))?;
    let dim = x.dims()[a];
    let lengths: Vec<usize> = match &split {
        None => vec![1; dim],
        Some((0, v)) => {
            let n = *v.first().ok_or("the split is empty")?;
            if n <= 0 {
                return Err(invalid!("a split length of {n}"));
            }
            let n = n as usize;
            (0..dim.div_ceil(n)).map(|i| n.min(dim - i * n)).collect()
        }
        Some((_, v)) => {
            if v.iter().any(|&n| n < 0) || v.iter().sum::<i64>() != dim as i64 {
                return Err(invalid!("the split lengths {v:?} do not make axis {a} of {}", x.ty()));
            }
            v.iter().map(|&n| n as usize).collect()
        }
    };
    let outs: Vec<Vec<usize>> = lengths
        .iter()
        .map(|&n| {
            let mut d = x.dims().to_vec();
            d[a] = n;
            d
        })
        .collect();
    let pieces = if x.dtype().is_string() {
        super::strings::by_position(&[x], |p| super::movement::split(p[0], a as i64, &outs))?
    } else {
        super::movement::split(x, a as i64, &outs)
    };
    if split.is_none() && !keepdims {
        let mut d = x.dims().to_vec();
        d.remove(a);
        return pieces.into_iter().map(|p| p.reshape(&d).map_err(OpError::from)).collect();
    }
    Ok(pieces)
}

/// SequenceMap: the body once per element; a sequence operand gives its element, a tensor itself.
fn map(
    body: &crate::Graph,
    captures: usize,
    operands: &[Option<&Value>],
    options: &crate::eval::EvalOptions,
) -> Result<Vec<Value>, OpError> {
    let len = seq(operands, captures)?.len();
    let mut results: Vec<Vec<Tensor>> = vec![Vec::with_capacity(len); body.outputs().len()];
    for i in 0..len {
        let mut inputs = Vec::with_capacity(operands.len());
        for k in 0..operands.len() {
            inputs.push(match operand(operands, k)? {
                Value::Sequence(s) if k >= captures => {
                    Value::Tensor(s.get(i).cloned().ok_or_else(|| {
                        format!("the sequences have {len} and {} elements", s.len())
                    })?)
                }
                v => v.clone(),
            });
        }
        let out = crate::eval::run_values_with(body, &inputs, options).map_err(|e| {
            OpError::Subgraph {
                what: format!("the body `{}`, element {i}", body.name),
                error: Box::new(e),
            }
        })?;
        for (k, v) in out.into_iter().enumerate() {
            results[k].push(v.into_tensor()?);
        }
    }
    Ok(results.into_iter().map(Value::Sequence).collect())
}

fn optional(o: &OptionalOp, operands: &[Option<&Value>]) -> Result<Value, OpError> {
    let given = operands.first().copied().flatten();
    Ok(match o {
        OptionalOp::Wrap { .. } => Value::Optional(given.map(|v| Box::new(v.clone()))),
        OptionalOp::HasElement => {
            let has = match given {
                None | Some(Value::Optional(None)) => false,
                Some(_) => true,
            };
            Value::Tensor(Tensor::scalar(has))
        }
        OptionalOp::GetElement => match given.ok_or("operand 0 is missing")? {
            Value::Optional(None) => return Err("the optional is empty".into()),
            Value::Optional(Some(v)) => (**v).clone(),
            v => v.clone(),
        },
    })
}
