//! Attribute schemas: how an op's typed fields are read from and written to [`Attrs`], declared
//! once per field (name, type, ONNX default, codec) in the op table (`op/mod.rs`), the
//! elementwise tables and [`attr_schema!`] for parameter structs. Reading and writing come from
//! the same declaration, so the text form and ONNX import round-trip by construction.

use super::attr::{Attr, Attrs};
use super::Subgraph;
use crate::error::AttrError;
use crate::{DType, Tensor};

/// How one typed attribute field is read and written.
pub trait AttrCodec<T> {
    /// The attribute `name`, or `default()` when it is absent (a required one fails instead).
    fn read(a: &mut Attrs, name: &str, default: impl FnOnce() -> T) -> Result<T, AttrError>;
    /// Writes the field (an optional one only when present).
    fn write(a: &mut Attrs, name: &str, v: &T);
}

/// A struct of attributes (an op's parameters), read and written field by field.
pub trait AttrSchema: Sized {
    fn write_attrs(&self, a: &mut Attrs);
    fn read_attrs(a: &mut Attrs) -> Result<Self, AttrError>;
}

/// Parameters whose value decides the op's name too (`ReduceSum` and `ReduceMax` are one
/// `Reduce`): the op table's family variants.
pub trait Family: Sized {
    /// Every member's name.
    fn names() -> Vec<&'static str>;
    fn name(&self) -> &'static str;
    fn write_attrs(&self, a: &mut Attrs);
    /// The member named `name`, its attributes read from `a`; `None` when `name` is no member.
    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Self, AttrError>>;
}

impl<T: Family> Family for Box<T> {
    fn names() -> Vec<&'static str> {
        T::names()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn write_attrs(&self, a: &mut Attrs) {
        (**self).write_attrs(a)
    }
    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Self, AttrError>> {
        T::read_named(name, a).map(|r| r.map(Box::new))
    }
}

/// An enum ONNX spells with strings.
pub trait NamedEnum: Sized + Copy {
    fn name(self) -> &'static str;
    fn from_name(s: &str) -> Option<Self>;
}

/// Implements [`AttrSchema`] for a struct from its field list:
/// `attr_schema!(Gemm { alpha: f32 = 1.0; "alpha" as Float, ... })`. Every field must be listed
/// (the struct literal in `read_attrs` says so), in the order the text form prints them.
macro_rules! attr_schema {
    ($ty:ident { $($field:ident : $fty:ty = $default:expr ; $attr:literal as $codec:ty),* $(,)? }) => {
        impl $crate::op::schema::AttrSchema for $ty {
            fn write_attrs(&self, a: &mut $crate::op::Attrs) {
                $( <$codec as $crate::op::schema::AttrCodec<$fty>>::write(a, $attr, &self.$field); )*
            }
            fn read_attrs(a: &mut $crate::op::Attrs) -> Result<$ty, AttrError> {
                Ok($ty { $( $field: <$codec as $crate::op::schema::AttrCodec<$fty>>::read(a, $attr, || $default)? ),* })
            }
        }
    };
}
pub(crate) use attr_schema;

macro_rules! codec {
    ($(#[$doc:meta])* $name:ident: $t:ty, |$a:ident, $n:ident, $d:ident| $read:expr, |$wa:ident, $wn:ident, $v:ident| $write:expr) => {
        $(#[$doc])*
        pub struct $name;
        impl AttrCodec<$t> for $name {
            fn read($a: &mut Attrs, $n: &str, $d: impl FnOnce() -> $t) -> Result<$t, AttrError> {
                $read
            }
            fn write($wa: &mut Attrs, $wn: &str, $v: &$t) {
                $write
            }
        }
    };
}

codec!(/// An integer.
    Int: i64, |a, n, d| a.int(n, d()), |a, n, v| a.push(n, Attr::Int(*v)));
codec!(/// An integer ONNX requires.
    RequiredInt: i64, |a, n, _d| a.required_int(n), |a, n, v| a.push(n, Attr::Int(*v)));
codec!(/// A size (a non-negative integer).
    Size: usize, |a, n, d| a.size(n, d()), |a, n, v| a.push(n, Attr::Int(*v as i64)));
codec!(/// A small non-negative integer (a norm's p).
    Count: u32, |a, n, d| Ok(a.size(n, d() as usize)? as u32), |a, n, v| a.push(n, Attr::Int(*v as i64)));
codec!(/// A 0/1 integer.
    Flag: bool, |a, n, d| a.flag(n, d()), |a, n, v| a.push(n, Attr::Int(*v as i64)));
codec!(/// A float.
    Float: f32, |a, n, d| a.float(n, d()), |a, n, v| a.push(n, Attr::Float(*v)));
codec!(/// A float written only when present.
    OptFloat: Option<f32>, |a, n, _d| a.opt_float(n), |a, n, v| if let Some(x) = v { a.push(n, Attr::Float(*x)) });
codec!(/// An integer written only when present.
    OptInt: Option<i64>, |a, n, _d| a.opt_int(n), |a, n, v| if let Some(x) = v { a.push(n, Attr::Int(*x)) });
codec!(/// A list of integers.
    Ints: Vec<i64>, |a, n, d| Ok(a.ints(n)?.unwrap_or_else(d)), |a, n, v| a.push(n, Attr::Ints(v.clone())));
codec!(/// A list of sizes.
    Sizes: Vec<usize>, |a, n, d| if a.contains(n) { a.sizes(n) } else { Ok(d()) }, |a, n, v| a.push(n, Attr::Ints(v.iter().map(|&x| x as i64).collect())));
codec!(/// A string.
    Str: String, |a, n, d| a.string(n, &d()), |a, n, v| a.push(n, Attr::Str(v.clone())));
codec!(/// A list of strings.
    Strs: Vec<String>, |a, n, d| Ok(a.strings(n)?.unwrap_or_else(d)), |a, n, v| a.push(n, Attr::Strs(v.clone())));
codec!(/// A type ONNX requires.
    Type: DType, |a, n, _d| a.dtype(n), |a, n, v| a.push(n, Attr::Type(*v)));
codec!(/// A type written only when present.
    OptType: Option<DType>, |a, n, _d| a.opt_dtype(n), |a, n, v| if let Some(x) = v { a.push(n, Attr::Type(*x)) });
codec!(/// A tensor.
    TensorValue: Tensor, |a, n, d| Ok(a.tensor(n)?.unwrap_or_else(d)), |a, n, v| a.push(n, Attr::Tensor(v.clone())));
codec!(/// A graph ONNX requires (a branch, a body).
    Graph: Subgraph, |a, n, _d| a.graph(n), |a, n, v| a.push(n, Attr::Graph(v.clone())));
codec!(/// DepthToSpace's `mode`: `"CRD"` (true) or `"DCR"`.
    DepthMode: bool, |a, n, d| match a.string(n, if d() { "CRD" } else { "DCR" })?.as_str() {
        "DCR" => Ok(false),
        "CRD" => Ok(true),
        other => Err(AttrError::NotOneOf { name: n.into(), value: other.into(), allowed: &["DCR", "CRD"] }),
    }, |a, n, v| a.push(n, Attr::Str(if *v { "CRD" } else { "DCR" }.into())));
codec!(/// Gelu's `approximate`: `"tanh"` (true) or `"none"`.
    Approximation: bool, |a, n, d| match a.string(n, if d() { "tanh" } else { "none" })?.as_str() {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => Err(AttrError::NotOneOf { name: n.into(), value: other.into(), allowed: &["none", "tanh"] }),
    }, |a, n, v| a.push(n, Attr::Str(if *v { "tanh" } else { "none" }.into())));
codec!(/// BitShift's required `direction`: `"LEFT"` (true) or `"RIGHT"`.
    ShiftDirection: bool, |a, n, _d| if !a.contains(n) {
        Err(AttrError::Missing { name: n.into() })
    } else {
        match a.string(n, "")?.as_str() {
            "LEFT" => Ok(true),
            "RIGHT" => Ok(false),
            other => Err(AttrError::NotOneOf { name: n.into(), value: other.into(), allowed: &["LEFT", "RIGHT"] }),
        }
    }, |a, n, v| a.push(n, Attr::Str(if *v { "LEFT" } else { "RIGHT" }.into())));

/// A named enum, spelled as its string.
pub struct Named;

impl<E: NamedEnum> AttrCodec<E> for Named {
    fn read(a: &mut Attrs, name: &str, default: impl FnOnce() -> E) -> Result<E, AttrError> {
        a.named(name, default(), E::from_name)
    }
    fn write(a: &mut Attrs, name: &str, v: &E) {
        a.push(name, Attr::Str(v.name().into()))
    }
}

/// A struct of attributes inlined into the op's (a convolution's window); the name is unused.
pub struct Nested;

impl<T: AttrSchema> AttrCodec<T> for Nested {
    fn read(a: &mut Attrs, _name: &str, _default: impl FnOnce() -> T) -> Result<T, AttrError> {
        T::read_attrs(a)
    }
    fn write(a: &mut Attrs, _name: &str, v: &T) {
        v.write_attrs(a)
    }
}

impl<T: AttrSchema> AttrSchema for Box<T> {
    fn write_attrs(&self, a: &mut Attrs) {
        (**self).write_attrs(a)
    }
    fn read_attrs(a: &mut Attrs) -> Result<Self, AttrError> {
        T::read_attrs(a).map(Box::new)
    }
}

/// A constant's tensor is its data, not an attribute: it writes none and is not read from any.
impl AttrSchema for Tensor {
    fn write_attrs(&self, _a: &mut Attrs) {}
    fn read_attrs(_a: &mut Attrs) -> Result<Tensor, AttrError> {
        Err(AttrError::Inconsistent("a Constant is built from its data, not from attributes"))
    }
}

/// The default of a required attribute, which its codec never asks for (it fails when the
/// attribute is missing).
pub fn required<T>() -> T {
    unreachable!("a required attribute's codec asked for a default")
}
