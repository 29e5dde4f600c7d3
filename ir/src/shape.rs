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
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
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

    /// Number of elements, if every dimension is known and their product fits.
    pub fn numel(&self) -> Option<usize> {
        self.as_fixed().and_then(|d| crate::size::numel(&d))
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

/// The type of a value: element type and shape, and whether it is a tensor or (as ONNX allows
/// between sequence and optional ops) a sequence of tensors or an optional value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    /// A tensor's shape; for a sequence or an optional, what its elements' shapes are known to be
    /// (symbols where they differ), meaningful only when the kind says the rank is known.
    pub shape: Shape,
    pub kind: Kind,
}

/// What a value is. Sequences and optionals exist only between the ops that make and read them:
/// the interpreter runs them as they are, and the compiler resolves them into tensors before
/// fusion (`passes/sequences.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    #[default]
    Tensor,
    /// A sequence of tensors of the type's dtype; `ranked` when the elements' rank is known,
    /// `len` when their number is.
    Sequence { ranked: bool, len: Option<usize> },
    /// An optional tensor, or (`sequence`) an optional sequence.
    Optional { sequence: bool, ranked: bool },
}

impl Kind {
    pub fn is_tensor(self) -> bool {
        self == Kind::Tensor
    }

    /// Whether the elements' (or the tensor's) rank is known.
    pub fn ranked(self) -> bool {
        match self {
            Kind::Tensor => true,
            Kind::Sequence { ranked, .. } | Kind::Optional { ranked, .. } => ranked,
        }
    }
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into(), kind: Kind::Tensor }
    }

    /// A sequence of `len` (when known) tensors of `dtype`, their shapes described by `elem`
    /// (`None`: rank unknown).
    pub fn sequence(dtype: DType, elem: Option<Shape>, len: Option<usize>) -> TensorType {
        let ranked = elem.is_some();
        TensorType {
            dtype,
            shape: elem.unwrap_or_else(Shape::scalar),
            kind: Kind::Sequence { ranked, len },
        }
    }

    /// Whether a value of type `have` may be passed where `self` is declared: the same dtype
    /// and kind, and the same rank where both know it (sizes are bound or checked elsewhere).
    pub fn accepts(&self, have: &TensorType) -> bool {
        let ranks = |a: bool, b: bool| !(a && b) || self.rank() == have.rank();
        self.dtype == have.dtype
            && match (self.kind, have.kind) {
                (Kind::Tensor, Kind::Tensor) => self.rank() == have.rank(),
                (Kind::Sequence { ranked: a, len: m }, Kind::Sequence { ranked: b, len: n }) => {
                    // An empty sequence has no elements whose rank could disagree.
                    (ranks(a, b) || n == Some(0)) && (m.is_none() || n.is_none() || m == n)
                }
                (
                    Kind::Optional { sequence: s, ranked: a },
                    Kind::Optional { sequence: t, ranked: b },
                ) => s == t && ranks(a, b),
                // A value where an optional of its type is declared.
                (Kind::Optional { .. }, _) => self.element().is_some_and(|e| e.accepts(have)),
                _ => false,
            }
    }

    /// What two types that one value may have in common (an If's branches, a Loop's state in and
    /// out): sizes they disagree on become `fresh(axis)`, a rank they disagree on is unknown for
    /// a sequence; `None` when they are different kinds or dtypes, or tensors of different ranks.
    pub fn merge(&self, other: &TensorType, fresh: impl Fn(usize) -> Dim) -> Option<TensorType> {
        if self.dtype != other.dtype {
            return None;
        }
        let dims = |a: &Shape, b: &Shape| {
            Shape(
                a.dims()
                    .iter()
                    .zip(b.dims())
                    .enumerate()
                    .map(|(i, (x, y))| if x == y { x.clone() } else { fresh(i) })
                    .collect(),
            )
        };
        let elem = |ra: bool, rb: bool| {
            (ra && rb && self.rank() == other.rank()).then(|| dims(&self.shape, &other.shape))
        };
        match (self.kind, other.kind) {
            (Kind::Tensor, Kind::Tensor) if self.rank() == other.rank() => {
                Some(TensorType::new(self.dtype, dims(&self.shape, &other.shape)))
            }
            (Kind::Sequence { ranked: a, len: m }, Kind::Sequence { ranked: b, len: n }) => {
                // An empty sequence says nothing of its elements.
                let e = match (m, n) {
                    (Some(0), _) if b => Some(other.shape.clone()),
                    (_, Some(0)) if a => Some(self.shape.clone()),
                    _ => elem(a, b),
                };
                Some(TensorType::sequence(self.dtype, e, if m == n { m } else { None }))
            }
            (
                Kind::Optional { sequence: s, ranked: a },
                Kind::Optional { sequence: t, ranked: b },
            ) if s == t => {
                let e = elem(a, b);
                Some(TensorType {
                    dtype: self.dtype,
                    shape: e.clone().unwrap_or_else(Shape::scalar),
                    kind: Kind::Optional { sequence: s, ranked: e.is_some() },
                })
            }
            // An optional on one side and a value it may hold on the other (a Loop's state).
            (Kind::Optional { .. }, _) => {
                self.element()?.merge(other, fresh).map(|e| TensorType::optional(&e))
            }
            (_, Kind::Optional { .. }) => {
                other.element()?.merge(self, fresh).map(|e| TensorType::optional(&e))
            }
            _ => None,
        }
    }

    /// An optional of the tensor or sequence type `of`.
    pub fn optional(of: &TensorType) -> TensorType {
        let kind = match of.kind {
            Kind::Tensor => Kind::Optional { sequence: false, ranked: true },
            Kind::Sequence { ranked, .. } => Kind::Optional { sequence: true, ranked },
            k @ Kind::Optional { .. } => k,
        };
        TensorType { dtype: of.dtype, shape: of.shape.clone(), kind }
    }

    /// The type of one element of a sequence (or what an optional holds); `None` for a tensor.
    pub fn element(&self) -> Option<TensorType> {
        match self.kind {
            Kind::Tensor => None,
            Kind::Sequence { ranked, .. } => Some(TensorType::new(
                self.dtype,
                if ranked { self.shape.clone() } else { Shape::scalar() },
            )),
            Kind::Optional { sequence: true, ranked } => {
                Some(TensorType { kind: Kind::Sequence { ranked, len: None }, ..self.clone() })
            }
            Kind::Optional { sequence: false, .. } => {
                Some(TensorType::new(self.dtype, self.shape.clone()))
            }
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

impl fmt::Display for TensorType {
    /// `f32[2,3]`; a sequence `seq(f32[2,"n"], 4)` (elements, length) or `seq(f32)` (rank and
    /// length unknown); an optional `opt(f32[4])` or `opt(seq(f32))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let elem = |f: &mut fmt::Formatter<'_>, ranked: bool| {
            if ranked {
                write!(f, "{}{}", self.dtype, self.shape)
            } else {
                write!(f, "{}", self.dtype)
            }
        };
        match self.kind {
            Kind::Tensor => write!(f, "{}{}", self.dtype, self.shape),
            Kind::Sequence { ranked, len } => {
                f.write_str("seq(")?;
                elem(f, ranked)?;
                match len {
                    Some(n) => write!(f, ", {n})"),
                    None => f.write_str(")"),
                }
            }
            Kind::Optional { sequence, ranked } => {
                f.write_str(if sequence { "opt(seq(" } else { "opt(" })?;
                elem(f, ranked)?;
                f.write_str(if sequence { "))" } else { ")" })
            }
        }
    }
}

/// What two sequence elements' shapes have in common: equal sizes stay, differing ones become the
/// symbol `{sym}{axis}`; `None` when the ranks differ.
pub fn common_shape(a: &Shape, b: &Shape, sym: &str) -> Option<Shape> {
    if a.rank() != b.rank() {
        return None;
    }
    Some(Shape(
        a.dims()
            .iter()
            .zip(b.dims())
            .enumerate()
            .map(|(i, (x, y))| if x == y { x.clone() } else { Dim::sym(&format!("{sym}{i}")) })
            .collect(),
    ))
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
