//! A run-time value: a tensor, or (ONNX) a sequence of tensors or an optional value. Graph inputs
//! and outputs, the interpreter's store and test data hold these; everything compiled holds
//! tensors only.

use std::fmt;

use crate::error::OpError;
use crate::{Kind, Tensor, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Tensor(Tensor),
    Sequence(Vec<Tensor>),
    /// An optional tensor or sequence; `None` carries the type it would have.
    Optional(Option<Box<Value>>),
}

impl Value {
    /// The tensor this value is, or an error naming what it is instead.
    pub fn as_tensor(&self) -> Result<&Tensor, OpError> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(OpError::NotTensor { got: other.describe() }),
        }
    }

    pub fn into_tensor(self) -> Result<Tensor, OpError> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(OpError::NotTensor { got: other.describe() }),
        }
    }

    /// A short description for error messages: `f32[2,3]`, `a sequence of 3 tensors`, `an empty optional`.
    pub fn describe(&self) -> String {
        match self {
            Value::Tensor(t) => t.ty().to_string(),
            Value::Sequence(s) => format!("a sequence of {} tensors", s.len()),
            Value::Optional(None) => "an empty optional".into(),
            Value::Optional(Some(v)) => format!("an optional holding {}", v.describe()),
        }
    }

    /// Whether this value can be given where `want` is declared (dtype and kind; a tensor's
    /// shape is checked by the caller, which binds symbols).
    pub fn fits(&self, want: &TensorType) -> bool {
        let dtype_ok = |t: &Tensor| t.dtype() == want.dtype;
        match (self, want.kind) {
            (Value::Tensor(t), Kind::Tensor) => dtype_ok(t) && t.rank() == want.rank(),
            // Exporters declare sequences' element shapes loosely (a scalar for a list of vectors):
            // only the dtype and a known length are held to.
            (Value::Sequence(s), Kind::Sequence { len, .. }) => {
                len.is_none_or(|n| n == s.len()) && s.iter().all(dtype_ok)
            }
            (Value::Optional(None), Kind::Optional { .. }) => true,
            (Value::Optional(Some(v)), Kind::Optional { .. }) => {
                want.element().is_some_and(|e| v.fits(&e))
            }
            // ONNX passes a value where an optional of its type is declared (a Loop's state).
            (v, Kind::Optional { .. }) => want.element().is_some_and(|e| v.fits(&e)),
            _ => false,
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
