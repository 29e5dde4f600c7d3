//! kiln-ir: the op graph, what a model *is*.
//!
//! - [`DType`], [`Dim`], [`Shape`], [`TensorType`] and [`Tensor`] (shared bytes, typed views);
//! - [`Op`], a closed enum with typed attributes and ONNX semantics;
//! - [`Graph`] on a petgraph `StableDiGraph`, with shape inference when nodes are added and a verifier;
//! - [`builder`], the tracing API (`x.matmul(w).add(b).relu()`);
//! - [`text`], a stable readable print and its parser;
//! - [`eval`], the reference interpreter: the oracle for compiled code and the engine of constant folding.

/// Expands `$mac!(T)` for the Rust element type `T` of a runtime [`DType`].
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $mac:ident) => {
        match $dtype {
            $crate::DType::F32 => $mac!(f32),
            $crate::DType::F64 => $mac!(f64),
            $crate::DType::F16 => $mac!($crate::f16),
            $crate::DType::BF16 => $mac!($crate::bf16),
            $crate::DType::I8 => $mac!(i8),
            $crate::DType::I16 => $mac!(i16),
            $crate::DType::I32 => $mac!(i32),
            $crate::DType::I64 => $mac!(i64),
            $crate::DType::U8 => $mac!(u8),
            $crate::DType::U16 => $mac!(u16),
            $crate::DType::U32 => $mac!(u32),
            $crate::DType::U64 => $mac!(u64),
            $crate::DType::Bool => $mac!(bool),
            $crate::DType::F8E4M3FN => $mac!($crate::narrow::F8E4M3FN),
            $crate::DType::F8E4M3FNUZ => $mac!($crate::narrow::F8E4M3FNUZ),
            $crate::DType::F8E5M2 => $mac!($crate::narrow::F8E5M2),
            $crate::DType::F8E5M2FNUZ => $mac!($crate::narrow::F8E5M2FNUZ),
            $crate::DType::F8E8M0 => $mac!($crate::narrow::F8E8M0),
            $crate::DType::F4E2M1 => $mac!($crate::narrow::F4E2M1),
            $crate::DType::I4 => $mac!($crate::narrow::I4),
            $crate::DType::U4 => $mac!($crate::narrow::U4),
            $crate::DType::I2 => $mac!($crate::narrow::I2),
            $crate::DType::U2 => $mac!($crate::narrow::U2),
            // Callers turn strings away first: they have no Rust element type.
            $crate::DType::String => unreachable!("string tensors are not typed views"),
        }
    };
}

mod dtype;
mod error;
mod graph;
mod shape;
mod tensor;
mod value;

pub mod builder;
pub mod eval;
pub mod fold;
pub mod grad;
pub mod infer;
pub mod memory;
pub mod models;
pub mod narrow;
pub mod npy;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod op;
pub mod size;
pub mod text;
pub mod train;

pub use dtype::DType;
pub use error::{chain, AttrError, GradientOpError, IrError, OpError, Result, UnsupportedOp};
pub use graph::{Edge, Graph, Node, NodeId, ValueId};
pub use half::{bf16, f16};
pub use op::{BinaryOp, Op, UnaryOp};
pub use shape::{
    broadcast, broadcast_fixed, common_shape, normalize_axis, Dim, Kind, Shape, TensorType,
};
pub use tensor::{cast_element, Element, Tensor};
pub use value::Value;
