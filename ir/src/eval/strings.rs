//! String tensors: the string ops (StringConcat, StringSplit, StringNormalizer, RegexFullMatch,
//! LabelEncoder), Equal and Cast on strings, and the ops that only move elements, run on
//! strings by running them on the elements' positions (`moved`). Every node with a string
//! operand or result comes here (`eval_op`); any other op on strings is an error naming it.

use std::collections::{HashMap, HashSet};

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
            let text = xi.iter().zip(&yi).fold(0usize, |n, (&a, &b)| {
                n.saturating_add(x[a].len()).saturating_add(y[b].len())
            });
            fits(xi.len(), text)?;
            let out = xi.iter().zip(&yi).map(|(&a, &b)| format!("{}{}", x[a], y[b])).collect();
            Ok(vec![strings(&dims, out)?])
        }
        Op::StringSplit { delimiter, maxsplit } => {
            let x = arg(0)?;
            let width = *out_dims(0).last().expect("a split has its pieces' axis");
            // The padded result before the pieces are made: its text is at most the input's.
            let text = texts(x)?.iter().fold(0usize, |n, s| n.saturating_add(s.len()));
            fits(x.len().saturating_mul(width), text)?;
            let pieces = split_all(texts(x)?, delimiter, *maxsplit);
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
        // (Shape and Size read the dims only.)
        _ if moves_elements(op) || matches!(op, Op::Shape { .. } | Op::Size) => {
            moved(op, operands, out_types, num_outputs)
        }
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

/// What a string in memory costs besides its text: the `String` itself.
const STRING_BYTES: usize = std::mem::size_of::<String>();

/// Refuses a result of `n` strings holding `text` bytes of text in all that would not fit the
/// memory available (`eval_op` checked 8 bytes an element; a string may hold much more, and
/// each result element copies its text).
pub(crate) fn fits(n: usize, text: usize) -> Result<(), OpError> {
    let limit = crate::memory::available_at_start();
    let need = n.saturating_mul(STRING_BYTES).saturating_add(text);
    if need as u64 > limit {
        return Err(invalid!(
            "the result's {n} strings need {need} bytes ({}), more than the {limit} bytes ({}) of memory available",
            crate::memory::human(need as u64),
            crate::memory::human(limit)
        ));
    }
    Ok(())
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

/// How many pieces `split_all` makes of `s`, counted without making them (inference sizes the
/// result from this before anything is allocated).
pub(crate) fn piece_count(s: &str, delimiter: &str, maxsplit: Option<i64>) -> usize {
    let max = maxsplit.and_then(|m| usize::try_from(m).ok());
    let all = if delimiter.is_empty() {
        s.split(is_space).filter(|w| !w.is_empty()).count()
    } else {
        s.matches(delimiter).count().saturating_add(1)
    };
    max.map_or(all, |m| all.min(m.saturating_add(1)))
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
    // The stopwords as a set, lowercased once where case does not count.
    let words: HashSet<String> = if n.case_sensitive {
        n.stopwords.iter().cloned().collect()
    } else {
        n.stopwords.iter().map(|w| w.to_lowercase()).collect()
    };
    let stop = |s: &str| {
        if n.case_sensitive {
            words.contains(s)
        } else {
            words.contains(&s.to_lowercase())
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
    let bad = |e: &dyn std::fmt::Display| {
        invalid!("pattern {pattern:?} is not a valid regular expression: {e}")
    };
    // Parsed alone, then anchored as a whole: pasted between anchors as text, a pattern such as
    // `a)|(?:b` or a `(?x)` comment could change what the anchors hold.
    let hir = regex_syntax::Parser::new().parse(pattern).map_err(|e| bad(&e))?;
    let anchored = regex_syntax::hir::Hir::concat(vec![
        regex_syntax::hir::Hir::look(regex_syntax::hir::Look::Start),
        hir,
        regex_syntax::hir::Hir::look(regex_syntax::hir::Look::End),
    ]);
    regex::RegexBuilder::new(&anchored.to_string()).size_limit(1 << 24).build().map_err(|e| bad(&e))
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
        let text =
            picks.iter().fold(0usize, |n, p| n.saturating_add(p.map_or(d.len(), |i| v[i].len())));
        fits(picks.len(), text)?;
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
        let refuse = |s: &str| invalid!("cannot cast the string {s:?} to {to}");
        let Some((lo, hi)) = to.int_range() else {
            // Floats as Rust (and numpy) read them: "nan", "inf", "1e999" (infinity) included.
            let v = s
                .iter()
                .map(|s| s.trim().parse::<f64>().map_err(|_| refuse(s)))
                .collect::<Result<Vec<f64>, OpError>>()?;
            return Ok(Tensor::from_f64s(to, x.dims(), &v)?);
        };
        // Integers as numpy reads them: whole numbers in the type's range, nothing else ("1.5"
        // and "1e3" are errors, as numpy's are).
        let v = s
            .iter()
            .map(|s| {
                s.trim()
                    .parse::<i128>()
                    .ok()
                    .filter(|v| (lo..=hi).contains(v))
                    .ok_or_else(|| refuse(s))
            })
            .collect::<Result<Vec<i128>, OpError>>()?;
        return Ok(match to {
            DType::I64 => Tensor::from_vec(x.dims(), v.iter().map(|&v| v as i64).collect())?,
            DType::U64 => Tensor::from_vec(x.dims(), v.iter().map(|&v| v as u64).collect())?,
            _ => Tensor::from_f64s(to, x.dims(), &v.iter().map(|&v| v as f64).collect::<Vec<_>>())?,
        });
    }
    if to.is_string() {
        // At most 24 bytes of text a number ("-1.7976931348623157e+308").
        fits(x.len(), x.len().saturating_mul(24))?;
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

/// String tensors moved by `f` on their positions (the sequence ops' joins and splits, which do
/// not pass through `eval_op`): each of `xs` numbered after the earlier ones, `f` run on those
/// i64 tensors, and each result's strings read back at the positions it holds.
pub(crate) fn by_position(
    xs: &[&Tensor],
    f: impl FnOnce(&[&Tensor]) -> Vec<Tensor>,
) -> Result<Vec<Tensor>, OpError> {
    let mut pool: Vec<&String> = Vec::new();
    let mut positions = Vec::with_capacity(xs.len());
    for t in xs {
        let s = texts(t)?;
        let first = pool.len() as i64;
        pool.extend(s);
        positions.push(Tensor::from_vec(t.dims(), (first..first + s.len() as i64).collect())?);
    }
    f(&positions.iter().collect::<Vec<_>>()).iter().map(|r| read_back(&pool, r)).collect()
}

/// The strings of `pool` at the positions `r` holds, in `r`'s shape (checked against the memory
/// available first).
fn read_back(pool: &[&String], r: &Tensor) -> Result<Tensor, OpError> {
    let at = r.to_i64s();
    let text = at.iter().fold(0usize, |n, &i| n.saturating_add(pool[i as usize].len()));
    fits(at.len(), text)?;
    strings(r.dims(), at.into_iter().map(|i| pool[i as usize].clone()).collect())
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
            read_back(&pool, &r)
        })
        .collect()
}
