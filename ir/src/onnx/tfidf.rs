//! TfIdfVectorizer on integer tokens (`pool_int64s`), expanded at import into ordinary ops
//! (nodes named `<node>/<part>`), so the interpreter and every target run it with no op of its
//! own. `pool_strings` needs a string type kiln lacks and is refused.
//!
//! The expansion counts, for every n-gram length `n` and skip distance `d`, where each pool
//! n-gram of that length occurs in each row: the `n` windows `X[:, k*d .. k*d + P]` (`P` the
//! number of start positions) compared (Equal) with the n-grams' `k`-th tokens give a
//! `[N, P, M_n]` match table per window; their And, summed over the positions, counts each
//! n-gram. A one-hot `[M, C]` matrix (MatMul) sends the counts to their output columns, and
//! the mode weighs them.

use super::import::GraphImporter;
use super::ops::{attr, err};
use super::proto::NodeProto;
use crate::error::AttrError;
use crate::op::{Attrs, Reduce, ReduceKind};
use crate::{BinaryOp, DType, IrError, Op, Result, Tensor, ValueId};

/// The most pool tokens, input tokens per row and output columns the expansion takes, and the
/// most entries one `[N, P, M_n]` match table may have: a bigger model gives a typed error
/// rather than a giant graph or gigabytes of intermediate values.
const MAX_POOL: usize = 1 << 12;
const MAX_ROW: usize = 1 << 12;
const MAX_COLUMNS: usize = 1 << 16;
const MAX_MATCHES: usize = crate::fold::FOLD_LIMIT;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Weighting {
    Tf,
    Idf,
    TfIdf,
}

/// The pool's n-grams of the counted lengths, each with its output column.
struct Vocabulary {
    /// For each length `n` (from 1): the distinct n-grams and their columns.
    by_length: Vec<Vec<(Vec<i64>, usize)>>,
    columns: usize,
    max_skip: usize,
    weighting: Weighting,
    weights: Option<Vec<f32>>,
}

fn out_of_range(name: &str, value: impl ToString, why: &'static str) -> IrError {
    attr(AttrError::OutOfRange { name: name.into(), value: value.to_string(), why })
}

fn required_ints(a: &mut Attrs, name: &str) -> Result<Vec<i64>> {
    a.ints(name).map_err(attr)?.ok_or_else(|| attr(AttrError::Missing { name: name.into() }))
}

fn non_negative(name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| out_of_range(name, v, "must not be negative"))
}

impl Vocabulary {
    /// Reads and checks the attributes. N-gram ids run over the whole pool (lengths outside
    /// `[min, max]` take ids too, as in ONNX's reference); a repeated n-gram keeps its last id.
    fn read(mut a: Attrs) -> Result<Vocabulary> {
        let min_len = a.required_int("min_gram_length").map_err(attr)?;
        let max_len = a.required_int("max_gram_length").map_err(attr)?;
        let max_skip = a.required_int("max_skip_count").map_err(attr)?;
        let weighting = match a.string("mode", "").map_err(attr)?.as_str() {
            "TF" => Weighting::Tf,
            "IDF" => Weighting::Idf,
            "TFIDF" => Weighting::TfIdf,
            other => return Err(out_of_range("mode", other, "must be TF, IDF or TFIDF")),
        };
        let counts = required_ints(&mut a, "ngram_counts")?;
        let indexes = required_ints(&mut a, "ngram_indexes")?;
        let weights = a.floats("weights").map_err(attr)?.filter(|w| !w.is_empty());
        let pool = a.ints("pool_int64s").map_err(attr)?;
        if a.strings("pool_strings").map_err(attr)?.is_some() {
            return Err(IrError::NotSupported(
                "pool_strings: kiln has no string type (only pool_int64s)".into(),
            ));
        }
        a.finish("TfIdfVectorizer").map_err(attr)?;
        let pool = pool.ok_or_else(|| attr(AttrError::Missing { name: "pool_int64s".into() }))?;
        if min_len < 1 {
            return Err(out_of_range("min_gram_length", min_len, "must be at least 1"));
        }
        if max_len < min_len {
            return Err(out_of_range(
                "max_gram_length",
                max_len,
                "must be min_gram_length or more",
            ));
        }
        let (min_len, max_len) = (min_len as usize, max_len as usize);
        let max_skip = non_negative("max_skip_count", max_skip)?;
        if pool.len() > MAX_POOL {
            return Err(IrError::NotSupported(format!(
                "a pool of {} tokens (the expansion takes at most {MAX_POOL})",
                pool.len()
            )));
        }
        let bounds = segment_bounds(&counts, pool.len())?;
        let total: usize = bounds.iter().enumerate().map(|(i, (s, e))| (e - s) / (i + 1)).sum();
        if indexes.len() != total {
            return Err(out_of_range(
                "ngram_indexes",
                format!("{} entries", indexes.len()),
                "must have one entry per n-gram of the pool",
            ));
        }
        let columns = indexes
            .iter()
            .map(|&i| non_negative("ngram_indexes", i))
            .collect::<Result<Vec<_>>>()?;
        let n_columns = columns.iter().max().map_or(0, |m| m + 1);
        if n_columns == 0 || n_columns > MAX_COLUMNS {
            return Err(out_of_range(
                "ngram_indexes",
                format!("{n_columns} columns"),
                "must name between 1 and 65536 output columns",
            ));
        }
        if let Some(w) = &weights {
            if w.len() != n_columns {
                return Err(out_of_range(
                    "weights",
                    format!("{} entries", w.len()),
                    "must have one weight per output column",
                ));
            }
        }
        let mut by_length = vec![Vec::new(); bounds.len()];
        let mut id = 0;
        for (i, &(start, end)) in bounds.iter().enumerate() {
            let n = i + 1;
            for gram in pool[start..end].chunks_exact(n) {
                if (min_len..=max_len).contains(&n) {
                    let grams: &mut Vec<(Vec<i64>, usize)> = &mut by_length[i];
                    match grams.iter_mut().find(|(g, _)| g == gram) {
                        Some(seen) => seen.1 = columns[id],
                        None => grams.push((gram.to_vec(), columns[id])),
                    }
                }
                id += 1;
            }
        }
        Ok(Vocabulary { by_length, columns: n_columns, max_skip, weighting, weights })
    }
}

/// The pool's segment `[start, end)` for each n-gram length, from `ngram_counts` (the start of
/// each length's n-grams): non-decreasing offsets within the pool.
fn segment_bounds(counts: &[i64], pool_len: usize) -> Result<Vec<(usize, usize)>> {
    let starts =
        counts.iter().map(|&c| non_negative("ngram_counts", c)).collect::<Result<Vec<_>>>()?;
    if starts.windows(2).any(|w| w[0] > w[1]) || starts.iter().any(|&s| s > pool_len) {
        return Err(out_of_range(
            "ngram_counts",
            format!("{counts:?}"),
            "must be non-decreasing offsets within the pool",
        ));
    }
    Ok(starts
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, starts.get(i + 1).copied().unwrap_or(pool_len)))
        .collect())
}

/// TfIdfVectorizer `X -> Y`: X is `[C]` or `[N, C]` of i32/i64 tokens; Y is f32 `[C_out]` or
/// `[N, C_out]`, `C_out = max(ngram_indexes) + 1`.
pub(super) fn tfidf_vectorizer(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    let vocab = Vocabulary::read(a)?;
    let x = im.operand(node, 0).ok_or_else(|| err("operand 0 (X) is missing"))?;
    let tx = im.ty(x).clone();
    if !matches!(tx.dtype, DType::I32 | DType::I64) || tx.rank() > 2 {
        return Err(err(format!("X {tx} must be an i32 or i64 tensor [C] or [N, C]")));
    }
    let dims: Option<Vec<usize>> = tx.shape.dims().iter().map(|d| d.fixed()).collect();
    let Some(dims) = dims else {
        return Err(IrError::NotSupported(format!("X {tx} must have a known shape")));
    };
    let (rows, len) = match dims.as_slice() {
        [] => (1, 1),
        [c] => (1, *c),
        [n, c] => (*n, *c),
        _ => unreachable!("rank checked above"),
    };
    if len > MAX_ROW {
        return Err(IrError::NotSupported(format!(
            "X {tx} has rows of {len} tokens (the expansion takes at most {MAX_ROW})"
        )));
    }
    let matrix = im.constant(node, "matrix_shape", Tensor::vector(&[rows as i64, len as i64]))?;
    let x = im.add1(node, "matrix", Op::Reshape { allowzero: false }, &[x, matrix])?;
    let x = im.add1(node, "tokens", Op::Cast { to: DType::I64, saturate: true }, &[x])?;
    let mut counts = Vec::new();
    let mut one_hot_rows = Vec::new();
    for (i, grams) in vocab.by_length.iter().enumerate() {
        let n = i + 1;
        if grams.is_empty() {
            continue;
        }
        if let Some(c) = count_ngrams(im, node, x, rows, len, n, grams, &vocab)? {
            counts.push(c);
            one_hot_rows.extend(grams.iter().map(|(_, col)| *col));
        }
    }
    let frequencies = if counts.is_empty() {
        // No pool n-gram fits in a row: every count is zero.
        im.constant(node, "frequencies", Tensor::full(DType::F32, &[rows, vocab.columns], 0.0))?
    } else {
        let counts = if counts.len() == 1 {
            counts[0]
        } else {
            im.add1(node, "counts", Op::Concat { axis: 1 }, &counts)?
        };
        let mut one_hot = vec![0f32; one_hot_rows.len() * vocab.columns];
        for (r, &col) in one_hot_rows.iter().enumerate() {
            one_hot[r * vocab.columns + col] = 1.0;
        }
        let one_hot = Tensor::from_vec(&[one_hot_rows.len(), vocab.columns], one_hot)?;
        let one_hot = im.constant(node, "columns", one_hot)?;
        im.add1(node, "frequencies", Op::MatMul, &[counts, one_hot])?
    };
    let y = weigh(im, node, frequencies, &vocab)?;
    let out_shape: Vec<i64> = match dims.len() {
        2 => vec![rows as i64, vocab.columns as i64],
        _ => vec![vocab.columns as i64],
    };
    let out_shape = im.constant(node, "shape", Tensor::vector(&out_shape))?;
    let y = im.add1(node, "", Op::Reshape { allowzero: false }, &[y, out_shape])?;
    im.bind(node, &[y])
}

/// The f32 counts `[N, M_n]` of the n-grams `grams` (all of length `n`) in the rows of the
/// i64 matrix `x` `[N, len]`, over every skip distance (a unigram once: skips do not change
/// it); None when no n-gram of length `n` fits in a row.
#[allow(clippy::too_many_arguments)]
fn count_ngrams(
    im: &mut GraphImporter,
    node: &NodeProto,
    x: ValueId,
    rows: usize,
    len: usize,
    n: usize,
    grams: &[(Vec<i64>, usize)],
    vocab: &Vocabulary,
) -> Result<Option<ValueId>> {
    let max_distance = if n == 1 { 1 } else { vocab.max_skip.saturating_add(1) };
    let m = grams.len();
    let mut total: Option<ValueId> = None;
    for d in 1..=max_distance {
        // Start positions p with p + (n-1)d < len; a longer distance fits fewer (none past here).
        let span = (n - 1).saturating_mul(d);
        if span >= len {
            break;
        }
        let positions = len - span;
        if rows.saturating_mul(positions).saturating_mul(m) > MAX_MATCHES {
            return Err(IrError::NotSupported(format!(
                "{rows} x {positions} positions x {m} {n}-grams to match, more than {MAX_MATCHES}"
            )));
        }
        let part = format!("n{n}_d{d}");
        let mut matched = None;
        for k in 0..n {
            let start = (k * d) as i64;
            let starts =
                im.constant(node, &format!("{part}_k{k}_start"), Tensor::vector(&[start]))?;
            let ends = im.constant(
                node,
                &format!("{part}_k{k}_end"),
                Tensor::vector(&[start + positions as i64]),
            )?;
            let axes = im.constant(node, &format!("{part}_k{k}_axes"), Tensor::vector(&[1i64]))?;
            let window =
                im.add1(node, &format!("{part}_k{k}_window"), Op::Slice, &[x, starts, ends, axes])?;
            let column = Tensor::vector(&[rows as i64, positions as i64, 1]);
            let column = im.constant(node, &format!("{part}_k{k}_column"), column)?;
            let reshape = Op::Reshape { allowzero: false };
            let window =
                im.add1(node, &format!("{part}_k{k}_tokens"), reshape, &[window, column])?;
            let kth: Vec<i64> = grams.iter().map(|(g, _)| g[k]).collect();
            let kth = im.constant(node, &format!("{part}_k{k}_pool"), Tensor::vector(&kth))?;
            let equal = Op::Binary(BinaryOp::Equal);
            let hit = im.add1(node, &format!("{part}_k{k}_match"), equal, &[window, kth])?;
            matched = Some(match matched {
                None => hit,
                Some(m) => {
                    let and = Op::Binary(BinaryOp::And);
                    im.add1(node, &format!("{part}_k{k}_all"), and, &[m, hit])?
                }
            });
        }
        let matched = matched.expect("n >= 1 windows");
        let hits = im.add1(
            node,
            &format!("{part}_hits"),
            Op::Cast { to: DType::F32, saturate: true },
            &[matched],
        )?;
        let axis = im.constant(node, &format!("{part}_positions"), Tensor::vector(&[1i64]))?;
        let sum = Op::Reduce(Reduce {
            kind: ReduceKind::Sum,
            keepdims: false,
            noop_with_empty_axes: false,
        });
        let count = im.add1(node, &format!("{part}_count"), sum, &[hits, axis])?;
        total = Some(match total {
            None => count,
            Some(t) => {
                im.add1(node, &format!("{part}_total"), Op::Binary(BinaryOp::Add), &[t, count])?
            }
        });
    }
    Ok(total)
}

/// Y from the counts per column `[N, C_out]`: TF the counts; IDF the weight (or 1) where an
/// n-gram occurs; TFIDF the counts times the weights (the counts without weights).
fn weigh(
    im: &mut GraphImporter,
    node: &NodeProto,
    f: ValueId,
    vocab: &Vocabulary,
) -> Result<ValueId> {
    let weights = match &vocab.weights {
        Some(w) => Some(im.constant(node, "weights", Tensor::vector(w))?),
        None => None,
    };
    match (vocab.weighting, weights) {
        (Weighting::Tf, _) | (Weighting::TfIdf, None) => Ok(f),
        (Weighting::TfIdf, Some(w)) => {
            im.add1(node, "weighted", Op::Binary(BinaryOp::Mul), &[f, w])
        }
        (Weighting::Idf, w) => {
            let zero = im.constant(node, "zero", Tensor::scalar(0f32))?;
            let seen = im.add1(node, "seen", Op::Binary(BinaryOp::Greater), &[f, zero])?;
            let on = match w {
                Some(w) => w,
                None => im.constant(node, "one", Tensor::scalar(1f32))?,
            };
            im.add1(node, "idf", Op::Where, &[seen, on, zero])
        }
    }
}
