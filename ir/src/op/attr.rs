//! A generic view of op attributes: what the text form prints and parses, and what importers
//! produce. `Op::attrs` and `Op::from_attrs` convert between it and the typed variants.

use std::fmt;

use super::*;
use crate::error::AttrError;
use crate::{DType, Tensor};

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Str(String),
    Type(DType),
    Tensor(Tensor),
    Strs(Vec<String>),
    Graph(Subgraph),
}

impl Attr {
    fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) => "an integer",
            Attr::Float(_) => "a float",
            Attr::Ints(_) => "a list of integers",
            Attr::Floats(_) => "a list of floats",
            Attr::Str(_) => "a string",
            Attr::Type(_) => "a type",
            Attr::Tensor(_) => "a tensor",
            Attr::Strs(_) => "a list of strings",
            Attr::Graph(_) => "a graph",
        }
    }
}

/// An ordered list of named attributes that is consumed by name; leftovers are an error, so a
/// misspelt attribute never passes silently.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(pub Vec<(String, Attr)>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    pub fn push(&mut self, name: &str, value: Attr) {
        self.0.push((name.to_string(), value));
    }

    /// Removes and returns the attribute `name`, if present.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        self.take(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// Sets `name` to `value`, replacing any earlier value.
    pub fn set(&mut self, name: &str, value: Attr) {
        self.take(name);
        self.push(name, value);
    }

    fn take(&mut self, name: &str) -> Option<Attr> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }

    fn wrong(name: &str, want: &'static str, got: &Attr) -> AttrError {
        AttrError::WrongKind { name: name.into(), want, got: got.kind() }
    }

    pub fn int(&mut self, name: &str, default: i64) -> Result<i64, AttrError> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn required_int(&mut self, name: &str) -> Result<i64, AttrError> {
        match self.take(name) {
            None => Err(AttrError::Missing { name: name.into() }),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn size(&mut self, name: &str, default: usize) -> Result<usize, AttrError> {
        let v = self.int(name, default as i64)?;
        usize::try_from(v).map_err(|_| AttrError::Negative { name: name.into(), value: v })
    }

    pub fn flag(&mut self, name: &str, default: bool) -> Result<bool, AttrError> {
        match self.int(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(AttrError::NotFlag { name: name.into(), value: v }),
        }
    }

    pub fn float(&mut self, name: &str, default: f32) -> Result<f32, AttrError> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(v),
            Some(Attr::Int(v)) => Ok(v as f32),
            Some(a) => Err(Self::wrong(name, "a float", &a)),
        }
    }

    pub fn ints(&mut self, name: &str) -> Result<Option<Vec<i64>>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a list of integers", &a)),
        }
    }

    pub fn sizes(&mut self, name: &str) -> Result<Vec<usize>, AttrError> {
        let v = self.ints(name)?.unwrap_or_default();
        v.iter()
            .map(|&x| {
                usize::try_from(x)
                    .map_err(|_| AttrError::NegativeEntry { name: name.into(), value: x })
            })
            .collect()
    }

    pub fn floats(&mut self, name: &str) -> Result<Option<Vec<f32>>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v)),
            // An empty list prints the same whatever its element type.
            Some(Attr::Ints(v)) => Ok(Some(v.iter().map(|&x| x as f32).collect())),
            Some(a) => Err(Self::wrong(name, "a list of floats", &a)),
        }
    }

    pub fn strings(&mut self, name: &str) -> Result<Option<Vec<String>>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Strs(v)) => Ok(Some(v)),
            Some(Attr::Ints(v)) if v.is_empty() => Ok(Some(Vec::new())),
            Some(a) => Err(Self::wrong(name, "a list of strings", &a)),
        }
    }

    pub fn graph(&mut self, name: &str) -> Result<Subgraph, AttrError> {
        match self.take(name) {
            None => Err(AttrError::Missing { name: name.into() }),
            Some(Attr::Graph(g)) => Ok(g),
            Some(a) => Err(Self::wrong(name, "a graph", &a)),
        }
    }

    /// An optional type attribute.
    pub fn opt_dtype(&mut self, name: &str) -> Result<Option<DType>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Type(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a type", &a)),
        }
    }

    /// An optional integer attribute.
    pub fn opt_int(&mut self, name: &str) -> Result<Option<i64>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    /// An optional float attribute.
    pub fn opt_float(&mut self, name: &str) -> Result<Option<f32>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(v)),
            Some(Attr::Int(v)) => Ok(Some(v as f32)),
            Some(a) => Err(Self::wrong(name, "a float", &a)),
        }
    }

    /// A string attribute naming one variant of a named enum.
    pub fn named<T>(
        &mut self,
        name: &str,
        default: T,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<T, AttrError> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Str(s)) => {
                parse(&s).ok_or_else(|| AttrError::UnknownValue { name: name.into(), value: s })
            }
            Some(a) => Err(Self::wrong(name, "a string", &a)),
        }
    }

    pub fn string(&mut self, name: &str, default: &str) -> Result<String, AttrError> {
        match self.take(name) {
            None => Ok(default.to_string()),
            Some(Attr::Str(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a string", &a)),
        }
    }

    pub fn dtype(&mut self, name: &str) -> Result<DType, AttrError> {
        match self.take(name) {
            None => Err(AttrError::Missing { name: name.into() }),
            Some(Attr::Type(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a type", &a)),
        }
    }

    pub fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, AttrError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Tensor(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a tensor", &a)),
        }
    }

    /// Fails if any attribute was not consumed.
    pub fn finish(self, op: &str) -> Result<(), AttrError> {
        match self.0.first() {
            None => Ok(()),
            Some((n, _)) => Err(AttrError::Unexpected { op: op.into(), name: n.clone() }),
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T>(
            f: &mut fmt::Formatter<'_>,
            v: &[T],
            each: impl Fn(&T) -> String,
        ) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(&each(x))?;
            }
            f.write_str("]")
        }
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => f.write_str(&float_literal(*v as f64, true)),
            Attr::Ints(v) => list(f, v, |x| x.to_string()),
            Attr::Floats(v) => list(f, v, |x| float_literal(*x as f64, true)),
            Attr::Str(v) => write!(f, "{v:?}"),
            Attr::Type(v) => write!(f, "{v}"),
            Attr::Tensor(t) => f.write_str(&crate::text::tensor_literal(t, true)),
            Attr::Strs(v) => list(f, v, |x| format!("{x:?}")),
            Attr::Graph(g) => {
                f.write_str(crate::text::print(&g.0, crate::text::Weights::Full).trim_end())
            }
        }
    }
}

/// A float that parses back to the same value and reads as a float (`1.0`, not `1`).
/// `as_f32`: print the shortest form that round-trips through f32.
pub(crate) fn float_literal(v: f64, as_f32: bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = if as_f32 { format!("{:?}", v as f32) } else { format!("{v:?}") };
    s
}

/// Prints an RNN activation as ONNX names it, with its parameters: `LeakyRelu(0.1)`.
pub(crate) fn activation_text(u: &UnaryOp) -> String {
    let params: Vec<String> =
        u.attrs_list().into_iter().map(|(_, v)| float_literal(v as f64, true)).collect();
    if params.is_empty() {
        u.name().to_string()
    } else {
        format!("{}({})", u.name(), params.join(", "))
    }
}

pub(crate) fn activation_from_text(s: &str) -> Result<UnaryOp, AttrError> {
    let (name, params) = match s.find('(') {
        Some(i) if s.ends_with(')') => (
            &s[..i],
            s[i + 1..s.len() - 1]
                .split(',')
                .map(|p| p.trim().parse::<f32>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| unknown(s))?,
        ),
        _ => (s, Vec::new()),
    };
    let u = UnaryOp::from_name(name).ok_or_else(|| unknown(s))?;
    let mut a = Attrs::new();
    for ((key, _), v) in u.attrs_list().into_iter().zip(params) {
        a.push(&key, Attr::Float(v));
    }
    match Op::from_attrs(name, a)? {
        Op::Unary(u) => Ok(u),
        _ => Err(unknown(s)),
    }
}

/// An RNN activation kiln does not know, named as the attribute holds it.
fn unknown(s: &str) -> AttrError {
    AttrError::UnknownValue { name: "activations".into(), value: s.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(list: &[(&str, Attr)]) -> Attrs {
        Attrs(list.iter().map(|(n, a)| (n.to_string(), a.clone())).collect())
    }

    #[test]
    fn attributes_are_read_once_with_defaults() {
        let mut a =
            attrs(&[("k", Attr::Int(3)), ("alpha", Attr::Int(2)), ("s", Attr::Ints(vec![]))]);
        assert_eq!(a.int("k", 1), Ok(3));
        assert_eq!(a.int("k", 1), Ok(1), "taken: the default now");
        assert_eq!(a.float("alpha", 0.5), Ok(2.0), "an integer reads as a float");
        assert_eq!(a.strings("s"), Ok(Some(vec![])), "an empty list of any kind");
        assert_eq!(a.size("absent", 7), Ok(7));
        assert_eq!(a.finish("Op"), Ok(()));
    }

    #[test]
    fn bad_attributes_are_typed_with_the_name_and_value() {
        let mut a = attrs(&[
            ("neg", Attr::Int(-2)),
            ("flag", Attr::Int(2)),
            ("list", Attr::Ints(vec![1, -1])),
            ("f", Attr::Str("x".into())),
            ("dir", Attr::Str("sideways".into())),
            ("extra", Attr::Int(0)),
        ]);
        assert_eq!(a.size("neg", 0), Err(AttrError::Negative { name: "neg".into(), value: -2 }));
        assert_eq!(
            a.flag("flag", false),
            Err(AttrError::NotFlag { name: "flag".into(), value: 2 })
        );
        assert_eq!(
            a.sizes("list"),
            Err(AttrError::NegativeEntry { name: "list".into(), value: -1 })
        );
        let e = a.float("f", 0.0).unwrap_err();
        assert_eq!(e, AttrError::WrongKind { name: "f".into(), want: "a float", got: "a string" });
        assert_eq!(e.to_string(), "attribute `f` must be a float, got a string");
        let e = a.named("dir", 0, |s| (s == "up").then_some(1)).unwrap_err();
        assert_eq!(e.to_string(), "attribute `dir` has the unknown value `sideways`");
        assert_eq!(a.required_int("k"), Err(AttrError::Missing { name: "k".into() }));
        assert_eq!(
            a.finish("Op"),
            Err(AttrError::Unexpected { op: "Op".into(), name: "extra".into() })
        );
    }

    #[test]
    fn activations_read_back_what_they_print() {
        for u in [UnaryOp::Relu, UnaryOp::LeakyRelu { alpha: 0.25 }] {
            assert_eq!(activation_from_text(&activation_text(&u)), Ok(u));
        }
        for bad in ["Nope", "Relu(", "LeakyRelu(x)", "Add"] {
            assert_eq!(
                activation_from_text(bad),
                Err(AttrError::UnknownValue { name: "activations".into(), value: bad.into() }),
                "{bad}"
            );
        }
    }
}
