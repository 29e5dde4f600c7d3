//! Dimensions, shapes and tensor types, and numpy-style broadcasting.

use std::fmt;
use std::sync::Arc;

use crate::DType;

/// One dimension: a known size, or a named symbol for a size known only at run time (a batch).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    Sym(Arc<str>),
}

impl Dim {
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(Arc::from(name))
    }

    pub fn fixed(self: &Dim) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    pub fn is_one(&self) -> bool {
        *self == Dim::Fixed(1)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Dim {
        Dim::sym(s)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) if is_plain_symbol(s) => f.write_str(s),
            Dim::Sym(s) => write!(f, "{s:?}"),
        }
    }
}

/// Symbols print bare when they look like identifiers, quoted otherwise.
pub(crate) fn is_plain_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A list of dimensions; rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// The sizes, if every dimension is known.
    pub fn as_fixed(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::fixed).collect()
    }

    pub fn is_fixed(&self) -> bool {
        self.0.iter().all(|d| d.fixed().is_some())
    }

    /// Number of elements, if every dimension is known.
    pub fn numel(&self) -> Option<usize> {
        self.as_fixed().map(|d| d.iter().product())
    }

    /// Normalises a possibly negative axis against this rank.
    pub fn axis(&self, axis: i64) -> Option<usize> {
        normalize_axis(axis, self.rank())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape::fixed(&d)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape::fixed(d)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape::fixed(&d)
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(d: Vec<Dim>) -> Shape {
        Shape(d)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Normalises an ONNX axis (negative counts from the end) against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// The type of a value: element type and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// numpy-style broadcasting of two shapes (right-aligned; a 1 stretches). Two different symbols
/// are assumed equal (the run-time specialisation checks real sizes).
pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        out.push(broadcast_dim(da, db)?);
    }
    Some(Shape(out))
}

fn dim_from_right(s: &Shape, from_right: usize) -> Dim {
    if from_right < s.rank() {
        s.0[s.rank() - 1 - from_right].clone()
    } else {
        Dim::Fixed(1)
    }
}

fn broadcast_dim(a: Dim, b: Dim) -> Option<Dim> {
    match (&a, &b) {
        _ if a == b => Some(a),
        (Dim::Fixed(1), _) => Some(b),
        (_, Dim::Fixed(1)) => Some(a),
        (Dim::Fixed(_), Dim::Fixed(_)) => None,
        // A symbol against a size: at run time the symbol must be that size (or 1).
        (Dim::Sym(_), Dim::Fixed(_)) => Some(b),
        (Dim::Fixed(_), Dim::Sym(_)) => Some(a),
        (Dim::Sym(_), Dim::Sym(_)) => Some(a),
    }
}

/// Broadcasting of concrete sizes, for the interpreter.
pub fn broadcast_fixed(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    broadcast(&Shape::fixed(a), &Shape::fixed(b)).and_then(|s| s.as_fixed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        let s = |d: &[usize]| Shape::fixed(d);
        assert_eq!(broadcast(&s(&[4, 1, 3]), &s(&[2, 1])), Some(s(&[4, 2, 3])));
        assert_eq!(broadcast(&s(&[]), &s(&[2, 3])), Some(s(&[2, 3])));
        assert_eq!(broadcast(&s(&[0, 3]), &s(&[1, 3])), Some(s(&[0, 3])));
        assert_eq!(broadcast(&s(&[2, 3]), &s(&[3, 2])), None);
        assert_eq!(broadcast(&s(&[5]), &s(&[4, 1])), Some(s(&[4, 5])));
    }

    #[test]
    fn broadcasting_with_symbols() {
        let b = Shape(vec![Dim::sym("batch"), Dim::Fixed(1)]);
        let c = Shape::fixed(&[1, 8]);
        assert_eq!(broadcast(&b, &c), Some(Shape(vec![Dim::sym("batch"), Dim::Fixed(8)])));
        assert_eq!(broadcast(&b, &b), Some(b.clone()));
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(normalize_axis(-1, 3), Some(2));
        assert_eq!(normalize_axis(3, 3), None);
        assert_eq!(normalize_axis(-4, 3), None);
        assert_eq!(normalize_axis(0, 0), None);
    }

    #[test]
    fn display_quotes_odd_symbols() {
        let s = Shape(vec![Dim::sym("batch"), Dim::sym("seq len"), Dim::Fixed(3)]);
        assert_eq!(s.to_string(), "[batch,\"seq len\",3]");
    }
}
