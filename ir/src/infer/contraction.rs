//! MatMul, Gemm and Einsum.

use super::{not_yet, same_dtype, Ctx, Infer, Operands};
use crate::{broadcast, Dim, Op, Shape, TensorType};

pub(super) fn infer(op: &Op, ops: &Operands, ctx: &Ctx) -> Infer {
    match op {
        Op::MatMul => matmul(ops),
        Op::Gemm(g) => gemm(g, ops),
        Op::Einsum { equation } => einsum(equation, ops, ctx),
        _ => not_yet(op),
    }
}
use crate::error::{invalid, OpError};

fn dims_agree(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        _ => true,
    }
}

pub(super) fn matmul(ops: &Operands) -> Infer {
    let (a, b) = (ops.get(0)?.ty, ops.get(1)?.ty);
    same_dtype("both operands", a, b)?;
    if !a.dtype.is_numeric() {
        return Err(invalid!("needs numeric operands, got {a}"));
    }
    if a.rank() == 0 || b.rank() == 0 {
        return Err(invalid!("operands must have rank 1 or more, got {a} and {b}"));
    }
    // numpy: a 1-D left operand is a row, a 1-D right operand a column; both are dropped after.
    let mut ad = a.shape.0.clone();
    let mut bd = b.shape.0.clone();
    if ad.len() == 1 {
        ad.insert(0, Dim::Fixed(1));
    }
    if bd.len() == 1 {
        bd.push(Dim::Fixed(1));
    }
    let (m, k) = (&ad[ad.len() - 2], &ad[ad.len() - 1]);
    let (k2, n) = (&bd[bd.len() - 2], &bd[bd.len() - 1]);
    if !dims_agree(k, k2) {
        return Err(invalid!("inner dimensions differ: {a} times {b}"));
    }
    let batch = broadcast(&Shape(ad[..ad.len() - 2].to_vec()), &Shape(bd[..bd.len() - 2].to_vec()))
        .ok_or_else(|| invalid!("batch dimensions do not broadcast: {a} times {b}"))?;
    let mut out = batch.0;
    if a.rank() > 1 {
        out.push(m.clone());
    }
    if b.rank() > 1 {
        out.push(n.clone());
    }
    Ok(vec![TensorType::new(a.dtype, Shape(out))])
}

pub(super) fn gemm(g: &crate::op::Gemm, ops: &Operands) -> Infer {
    let (a, b) = (ops.get(0)?.ty, ops.get(1)?.ty);
    same_dtype("A and B", a, b)?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(invalid!("A and B must be 2-D, got {a} and {b}"));
    }
    let (m, k) =
        if g.trans_a { (&a.shape.0[1], &a.shape.0[0]) } else { (&a.shape.0[0], &a.shape.0[1]) };
    let (k2, n) =
        if g.trans_b { (&b.shape.0[1], &b.shape.0[0]) } else { (&b.shape.0[0], &b.shape.0[1]) };
    if !dims_agree(k, k2) {
        return Err(invalid!(
            "inner dimensions differ: {a}{} times {b}{}",
            if g.trans_a { "ᵀ" } else { "" },
            if g.trans_b { "ᵀ" } else { "" }
        ));
    }
    let out = Shape(vec![m.clone(), n.clone()]);
    if let Some(c) = ops.opt(2) {
        same_dtype("A and C", a, c.ty)?;
        // C broadcasts one way: to the result's shape.
        if c.ty.rank() > 2 || broadcast(&c.ty.shape, &out).as_ref() != Some(&out) {
            return Err(invalid!("C {} does not broadcast to the result {}{out}", c.ty, a.dtype));
        }
    }
    Ok(vec![TensorType::new(a.dtype, out)])
}

pub(super) fn einsum(equation: &str, ops: &Operands, _ctx: &Ctx) -> Infer {
    let types: Vec<&TensorType> =
        (0..ops.len()).map(|i| ops.get(i).map(|o| o.ty)).collect::<Result<_, _>>()?;
    let first = types.first().ok_or("needs at least one operand")?;
    for (i, t) in types.iter().enumerate() {
        same_dtype("all operands", first, t)?;
        if !t.dtype.is_numeric() {
            return Err(invalid!("needs numeric operands, got operand {i} {t}"));
        }
    }
    let shapes: Vec<&Shape> = types.iter().map(|t| &t.shape).collect();
    let spec = EinsumSpec::new(equation, &shapes)?;
    let out = Shape(spec.output.iter().map(|&l| spec.sizes[l].clone()).collect());
    Ok(vec![TensorType::new(first.dtype, out)])
}

/// An Einsum equation resolved against its operands' shapes. Every axis gets a label: the
/// dimensions under `...` (broadcast across operands, numpy style) are labels `0..ellipsis_rank`,
/// the letters follow in order of first appearance.
#[derive(Debug)]
pub struct EinsumSpec {
    /// The size of each label.
    pub sizes: Vec<Dim>,
    /// For each operand, the label of each axis (a repeated label takes a diagonal).
    pub operands: Vec<Vec<usize>>,
    /// The label of each result axis; labels absent from it are summed over.
    pub output: Vec<usize>,
}

/// One side of `->` or one operand's term: letters, and where `...` sits among them.
struct Term {
    text: String,
    letters: Vec<u8>,
    ellipsis: Option<usize>,
}

fn parse_term(text: &str, what: &str) -> Result<Term, OpError> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = text.as_bytes();
    while let Some(&c) = rest.first() {
        if rest.starts_with(b"...") {
            if ellipsis.is_some() {
                return Err(invalid!("{what} `{text}` has more than one `...`"));
            }
            ellipsis = Some(letters.len());
            rest = &rest[3..];
        } else if c.is_ascii_alphabetic() {
            letters.push(c);
            rest = &rest[1..];
        } else {
            return Err(invalid!(
                "{what} `{text}` has the invalid character {:?}",
                text[text.len() - rest.len()..].chars().next().unwrap_or('?')
            ));
        }
    }
    Ok(Term { text: text.to_string(), letters, ellipsis })
}

impl EinsumSpec {
    pub fn new(equation: &str, shapes: &[&Shape]) -> Result<EinsumSpec, OpError> {
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<Term> =
            lhs.split(',').map(|t| parse_term(t, "term")).collect::<Result<_, _>>()?;
        if terms.len() != shapes.len() {
            return Err(invalid!(
                "equation `{equation}` has {} input terms for {} operands",
                terms.len(),
                shapes.len()
            ));
        }
        // Each operand's ellipsis dimensions, then their broadcast (right-aligned).
        let mut ellipsis = Shape::scalar();
        let mut any_ellipsis = false;
        for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
            let fits = match t.ellipsis {
                Some(_) => s.rank() >= t.letters.len(),
                None => s.rank() == t.letters.len(),
            };
            if !fits {
                return Err(invalid!(
                    "term {i} `{}` does not fit operand {i} of shape {s}",
                    t.text
                ));
            }
            if let Some(p) = t.ellipsis {
                any_ellipsis = true;
                let e = s.rank() - t.letters.len();
                let dims = Shape(s.0[p..p + e].to_vec());
                ellipsis = broadcast(&ellipsis, &dims).ok_or_else(|| {
                    format!(
                        "the `...` dimensions {ellipsis} and {dims} (operand {i}) do not broadcast"
                    )
                })?;
            }
        }
        let e_rank = ellipsis.rank();
        let mut sizes: Vec<Dim> = ellipsis.0.clone();
        let mut letter_label = [usize::MAX; 128];
        let mut operands = Vec::with_capacity(terms.len());
        for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
            let e = s.rank() - t.letters.len();
            let mut labels = Vec::with_capacity(s.rank());
            // This operand's size for each letter; a repeated letter takes a diagonal, so its
            // sizes must be equal.
            let mut own: Vec<(u8, Dim)> = Vec::new();
            for (axis, d) in s.0.iter().enumerate() {
                let letter = match t.ellipsis {
                    Some(p) if axis >= p && axis < p + e => {
                        labels.push(e_rank - e + (axis - p));
                        continue;
                    }
                    Some(p) if axis >= p + e => t.letters[axis - e],
                    _ => t.letters[axis],
                };
                match own.iter_mut().find(|(c, _)| *c == letter) {
                    Some((_, prev)) => match (&*prev, d) {
                        (Dim::Fixed(a), Dim::Fixed(b)) if a != b => {
                            return Err(invalid!("letter `{}` of operand {i} of shape {s} stands for sizes {a} and {b}", letter as char));
                        }
                        (Dim::Sym(_), Dim::Fixed(_)) => *prev = d.clone(),
                        _ => {}
                    },
                    None => own.push((letter, d.clone())),
                }
                if letter_label[letter as usize] == usize::MAX {
                    letter_label[letter as usize] = sizes.len();
                    sizes.push(Dim::Fixed(1));
                }
                labels.push(letter_label[letter as usize]);
            }
            // Across operands, a size 1 broadcasts (as numpy does).
            for (letter, d) in own {
                let l = letter_label[letter as usize];
                sizes[l] = broadcast(&Shape(vec![sizes[l].clone()]), &Shape(vec![d.clone()]))
                    .map(|s| s.0[0].clone())
                    .ok_or_else(|| {
                        format!(
                            "letter `{}` stands for sizes {} and {d} (operand {i} of shape {s})",
                            letter as char, sizes[l]
                        )
                    })?;
            }
            operands.push(labels);
        }
        let output = match rhs {
            Some(r) => {
                let t = parse_term(r, "output")?;
                let mut out = Vec::new();
                if e_rank > 0 && t.ellipsis.is_none() {
                    return Err(invalid!(
                        "output `{r}` needs `...` for the broadcast dimensions {ellipsis}"
                    ));
                }
                for (j, &c) in t.letters.iter().enumerate() {
                    if t.ellipsis == Some(j) {
                        out.extend(0..e_rank);
                    }
                    let l = letter_label[c as usize];
                    if l == usize::MAX {
                        return Err(invalid!("output letter `{}` is in no input term", c as char));
                    }
                    if out.contains(&l) {
                        return Err(invalid!("output letter `{}` is repeated", c as char));
                    }
                    out.push(l);
                }
                if t.ellipsis == Some(t.letters.len()) {
                    out.extend(0..e_rank);
                }
                out
            }
            None => {
                // Implicit output: the `...` dimensions, then the letters used once, in ASCII order.
                let mut count = [0usize; 128];
                for t in &terms {
                    for &c in &t.letters {
                        count[c as usize] += 1;
                    }
                }
                let mut out: Vec<usize> =
                    if any_ellipsis { (0..e_rank).collect() } else { Vec::new() };
                out.extend((0..128).filter(|&c| count[c] == 1).map(|c| letter_label[c]));
                out
            }
        };
        Ok(EinsumSpec { sizes, operands, output })
    }
}
