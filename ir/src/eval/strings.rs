//! String tensors: the string ops (StringConcat, StringSplit, StringNormalizer, RegexFullMatch,
//! LabelEncoder), Equal and Cast on strings, and the ops that only move elements, run on
//! strings by running them on the elements' positions (`moved`). Every node with a string
//! operand or result comes here (`eval_op`); any other op on strings is an error naming it.

use std::collections::HashMap;

use regex::Regex;

use crate::error::{invalid, OpError};
use crate::op::BinaryOp;
use crate::{DType, Op, Tensor, TensorType};

pub(super) fn eval(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    num_outputs: usize,
) -> Result<Vec<Tensor>, OpError> {
    let out_dims = |i: usize| -> Vec<usize> {
        out_types[i].shape.as_fixed().expect("eval_op checked the result shapes")
    };
    let arg =
        |i: usize| operands.get(i).copied().flatten().ok_or(OpError::MissingOperand { index: i });
    match op {
        Op::StringConcat => {
            let (x, y) = (texts(arg(0)?)?, texts(arg(1)?)?);
            let dims = out_dims(0);
            let (xi, yi) = (source_index(&dims, arg(0)?.dims()), source_index(&dims, arg(1)?.dims()));
            let out = xi.iter().zip(&yi).map(|(&a, &b)| format!("{}{}", x[a], y[b])).collect();
            Ok(vec![strings(&dims, out)?])
        }
        Op::StringSplit { delimiter, maxsplit } => {
            let x = arg(0)?;
            let pieces = split_all(texts(x)?, delimiter, *maxsplit);
            let width = *out_dims(0).last().expect("a split has its pieces' axis");
            let lengths: Vec<i64> = pieces.iter().map(|p| p.len() as i64).collect();
            let padded = pieces
                .into_iter()
                .flat_map(|mut p| {
                    p.resize(width, String::new());
                    p
                })
                .collect();
            Ok(vec![strings(&out_dims(0), padded)?, Tensor::from_vec(x.dims(), lengths)?])
        }
        Op::StringNormalizer { .. } => {
            let kept = normalized(&Normalizer::of(op)?, texts(arg(0)?)?);
            Ok(vec![strings(&out_dims(0), kept)?])
        }
        Op::RegexFullMatch { pattern } => {
            let re = full_match_regex(pattern)?;
            let x = arg(0)?;
            let hits: Vec<bool> = texts(x)?.iter().map(|s| re.is_match(s)).collect();
            Ok(vec![Tensor::from_vec(x.dims(), hits)?])
        }
        Op::LabelEncoder { keys, values, default } => {
            Ok(vec![label_encode(arg(0)?, keys, values, default)?])
        }
        Op::Binary(BinaryOp::Equal) => {
            let (x, y) = (texts(arg(0)?)?, texts(arg(1)?)?);
            let dims = out_dims(0);
            let (xi, yi) = (source_index(&dims, arg(0)?.dims()), source_index(&dims, arg(1)?.dims()));
            let eq: Vec<bool> = xi.iter().zip(&yi).map(|(&a, &b)| x[a] == y[b]).collect();
            Ok(vec![Tensor::from_vec(&dims, eq)?])
        }
        Op::Cast { to, .. } => Ok(vec![cast(arg(0)?, *to)?]),
        _ if moves_elements(op) => moved(op, operands, out_types, num_outputs),
        _ => Err(invalid!("{} does not take strings (strings go to the string ops, Equal, Cast and the ops that move elements)", op.name())),
    }
}

/// A string tensor's text; an error for any other type.
fn texts(t: &Tensor) -> Result<&[String], OpError> {
    t.strings().ok_or_else(|| invalid!("expected strings, got {}", t.ty()))
}

fn strings(dims: &[usize], values: Vec<String>) -> Result<Tensor, OpError> {
    Ok(Tensor::from_strings(dims, values)?)
}

/// For each position of `out` (row-major), the flat position of `dims` broadcast to it
/// (right-aligned, size-1 axes repeated).
fn source_index(out: &[usize], dims: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let lead = out.len() - dims.len();
    let mut strides = vec![0usize; out.len()];
    let mut s = 1;
    for (i, &d) in dims.iter().enumerate().rev() {
        strides[lead + i] = if d == 1 { 0 } else { s };
        s *= d;
    }
    let mut idx = vec![0usize; out.len()];
    let mut result = Vec::with_capacity(n);
    for _ in 0..n {
        result.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for a in (0..out.len()).rev() {
            idx[a] += 1;
            if idx[a] < out[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    result
}

/// Whitespace as Python's `str.split()` takes it (Unicode whitespace and the four separators
/// U+001C..U+001F).
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Each string split as Python's `str.split(delimiter or None, maxsplit)`: at `delimiter`, or
/// (empty) at runs of whitespace with the ends trimmed; after `maxsplit` splits the rest is one
/// piece.
pub(crate) fn split_all(x: &[String], delimiter: &str, maxsplit: Option<i64>) -> Vec<Vec<String>> {
    let max = maxsplit.and_then(|m| usize::try_from(m).ok());
    x.iter()
        .map(|s| {
            if delimiter.is_empty() {
                split_whitespace(s, max)
            } else {
                match max {
                    Some(m) => s.splitn(m.saturating_add(1), delimiter).map(String::from).collect(),
                    None => s.split(delimiter).map(String::from).collect(),
                }
            }
        })
        .collect()
}

fn split_whitespace(s: &str, max: Option<usize>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s.trim_start_matches(is_space);
    while !rest.is_empty() {
        if max == Some(out.len()) {
            out.push(rest.to_string());
            break;
        }
        match rest.find(is_space) {
            Some(i) => {
                out.push(rest[..i].to_string());
                rest = rest[i..].trim_start_matches(is_space);
            }
            None => {
                out.push(rest.to_string());
                break;
            }
        }
    }
    out
}

/// StringNormalizer's attributes, checked.
pub(crate) struct Normalizer {
    case: Case,
    case_sensitive: bool,
    stopwords: Vec<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Lower,
    Upper,
    Keep,
}

impl Normalizer {
    pub(crate) fn of(op: &Op) -> Result<Normalizer, OpError> {
        let Op::StringNormalizer { case_change_action, is_case_sensitive, stopwords, .. } = op
        else {
            unreachable!("a StringNormalizer")
        };
        let case = match case_change_action.as_str() {
            "LOWER" => Case::Lower,
            "UPPER" => Case::Upper,
            "NONE" => Case::Keep,
            other => {
                return Err(invalid!(
                    "case_change_action must be LOWER, UPPER or NONE, got {other:?}"
                ))
            }
        };
        Ok(Normalizer { case, case_sensitive: *is_case_sensitive, stopwords: stopwords.clone() })
    }
}

/// The strings of `x` that are not stopwords, their case changed; one empty string when none is
/// left (ONNX's rule). The locale is not consulted: cases change by Unicode's default rules.
pub(crate) fn normalized(n: &Normalizer, x: &[String]) -> Vec<String> {
    let stop = |s: &str| {
        if n.case_sensitive {
            n.stopwords.iter().any(|w| w == s)
        } else {
            let s = s.to_lowercase();
            n.stopwords.iter().any(|w| w.to_lowercase() == s)
        }
    };
    let kept: Vec<String> = x
        .iter()
        .filter(|s| !stop(s))
        .map(|s| match n.case {
            Case::Lower => s.to_lowercase(),
            Case::Upper => s.to_uppercase(),
            Case::Keep => s.clone(),
        })
        .collect();
    if kept.is_empty() {
        vec![String::new()]
    } else {
        kept
    }
}

/// The regex that matches all of a string against `pattern` (RE2's syntax, as Rust's `regex`
/// reads it: `\w` and `\b` are Unicode-aware here, ASCII in RE2). Its compiled size is bounded,
/// so a hostile pattern is an error, not an exhausted memory.
pub(crate) fn full_match_regex(pattern: &str) -> Result<Regex, OpError> {
    regex::RegexBuilder::new(&format!(r"\A(?:{pattern})\z"))
        .size_limit(1 << 24)
        .build()
        .map_err(|e| invalid!("pattern {pattern:?} is not a valid regular expression: {e}"))
}

/// A LabelEncoder key: strings and integers as they are, floats by value (NaN matching NaN,
/// -0 matching 0).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Text(String),
    Int(i64),
    Float(u64),
}

fn keys_of(t: &Tensor) -> Vec<Key> {
    if let Some(s) = t.strings() {
        return s.iter().cloned().map(Key::Text).collect();
    }
    if t.dtype().is_float() {
        return t
            .to_f64s()
            .into_iter()
            .map(|v| {
                let v = if v.is_nan() {
                    f64::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                };
                Key::Float(v.to_bits())
            })
            .collect();
    }
    t.to_i64s().into_iter().map(Key::Int).collect()
}

fn label_encode(
    x: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    default: &Tensor,
) -> Result<Tensor, OpError> {
    // Inference checked: keys and values 1-D of one length, default one value of the values'
    // type. A repeated key maps to its last value, as ONNX's reference (a dict) does.
    let index: HashMap<Key, usize> =
        keys_of(keys).into_iter().enumerate().map(|(i, k)| (k, i)).collect();
    let picks: Vec<Option<usize>> = keys_of(x).iter().map(|k| index.get(k).copied()).collect();
    if let Some(v) = values.strings() {
        let d = &default.strings().expect("inference checked the default's type")[0];
        let out = picks.iter().map(|p| p.map_or_else(|| d.clone(), |i| v[i].clone())).collect();
        return strings(x.dims(), out);
    }
    if values.dtype() == DType::I64 {
        let (v, d) = (values.to_i64s(), default.to_i64s()[0]);
        let out: Vec<i64> = picks.iter().map(|p| p.map_or(d, |i| v[i])).collect();
        return Ok(Tensor::from_vec(x.dims(), out)?);
    }
    let (v, d) = (values.to_f64s(), default.to_f64s()[0]);
    let out: Vec<f64> = picks.iter().map(|p| p.map_or(d, |i| v[i])).collect();
    Ok(Tensor::from_f64s(values.dtype(), x.dims(), &out)?)
}

/// Cast from or to strings: a number's text as numpy writes it (f32 at f32's shortest), a
/// string parsed as a number (an error naming it where it is not one).
fn cast(x: &Tensor, to: DType) -> Result<Tensor, OpError> {
    if let Some(s) = x.strings() {
        if to.is_string() {
            return Ok(x.clone());
        }
        if to == DType::Bool {
            return Err(invalid!("Cast from string to bool is not supported"));
        }
        let v = s
            .iter()
            .map(|s| {
                let t = s.trim();
                t.parse::<i64>()
                    .map(|i| i as f64)
                    .or_else(|_| t.parse::<f64>())
                    .map_err(|_| invalid!("cannot cast the string {s:?} to {to}"))
            })
            .collect::<Result<Vec<f64>, OpError>>()?;
        if to == DType::I64 {
            let ints = s
                .iter()
                .zip(&v)
                .map(|(s, &f)| s.trim().parse::<i64>().unwrap_or(f as i64))
                .collect();
            return Ok(Tensor::from_vec(x.dims(), ints)?);
        }
        return Ok(Tensor::from_f64s(to, x.dims(), &v)?);
    }
    Ok(x.cast(to))
}

/// The ops that only move (or pick) elements: on strings they run on the positions.
fn moves_elements(op: &Op) -> bool {
    matches!(
        op,
        Op::Identity
            | Op::Reshape { .. }
            | Op::Flatten { .. }
            | Op::Transpose { .. }
            | Op::Squeeze
            | Op::Unsqueeze
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Slice
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::Expand
            | Op::Tile
            | Op::Where
            | Op::Compress { .. }
            | Op::ReverseSequence { .. }
            | Op::DepthToSpace { .. }
            | Op::SpaceToDepth { .. }
    )
}

/// `op` on string operands, run on their elements' positions: each string operand becomes an
/// i64 tensor numbering its elements (after the earlier operands' ones), the op runs on those,
/// and each result that should be strings reads its strings at the positions it got.
fn moved(
    op: &Op,
    operands: &[Option<&Tensor>],
    out_types: &[TensorType],
    num_outputs: usize,
) -> Result<Vec<Tensor>, OpError> {
    let mut pool: Vec<&String> = Vec::new();
    let mut positions: Vec<Option<Tensor>> = Vec::with_capacity(operands.len());
    for o in operands {
        positions.push(match o.and_then(|t| t.strings().map(|s| (t, s))) {
            Some((t, s)) => {
                let first = pool.len() as i64;
                pool.extend(s);
                Some(Tensor::from_vec(t.dims(), (first..first + s.len() as i64).collect())?)
            }
            None => None,
        });
    }
    let args: Vec<Option<&Tensor>> =
        operands.iter().zip(&positions).map(|(o, p)| p.as_ref().or(*o)).collect();
    let results = super::eval_op(op, &args, num_outputs)?;
    results
        .into_iter()
        .zip(out_types)
        .map(|(r, want)| {
            if !want.dtype.is_string() {
                return Ok(r);
            }
            let picked = r.to_i64s().into_iter().map(|i| pool[i as usize].clone()).collect();
            strings(r.dims(), picked)
        })
        .collect()
}
