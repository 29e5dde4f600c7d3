//! The elementwise op families, each declared by one table: a line per op gives its variant,
//! its attributes (name, type, ONNX default and how the attribute is spelled), its ONNX name and
//! the operand types it accepts. The enum, `ALL`, `name`, `from_name`, `accepts` and the attribute
//! schema (`attrs`, `with_attrs`) are generated from it, so the text form and ONNX import
//! round-trip by construction. An op's scalar meaning lives in `eval::elementwise`, its code in
//! the compiler's `codegen/scalar.rs`: adding an elementwise op touches those three files.

use super::attr::{Attr, Attrs};
use super::schema::{Approximation, AttrCodec, Family, Flag, Float, ShiftDirection};
use crate::error::AttrError;

macro_rules! elementwise_table {
    (
        $(#[$doc:meta])* $family:ident [$($derive:ident),*] {
            $( $(#[$vdoc:meta])* $variant:ident $({ $($field:ident : $ty:ty = $default:expr ; $attr:literal as $codec:ident),+ $(,)? })? => $name:literal, $class:ident; )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq $(, $derive)*)]
        pub enum $family {
            $( $(#[$vdoc])* $variant $({ $($field: $ty),+ })?, )*
        }

        impl $family {
            /// Every op, with ONNX's default attributes.
            pub const ALL: &'static [$family] = &[ $( $family::$variant $({ $($field: $default),+ })?, )* ];

            /// The ONNX name, which is also the name in kiln's text form.
            pub fn name(self) -> &'static str {
                match self {
                    $( $family::$variant $({ $($field: _),+ })? => $name, )*
                }
            }

            /// The op named `name`, with ONNX's default attributes.
            pub fn from_name(name: &str) -> Option<$family> {
                $family::ALL.iter().copied().find(|op| op.name() == name)
            }

            /// Which operand types the op accepts.
            pub fn accepts(self) -> TypeClass {
                match self {
                    $( $family::$variant $({ $($field: _),+ })? => TypeClass::$class, )*
                }
            }

            /// The op's attributes, every one, in the table's order.
            pub fn params(self) -> Vec<(String, Attr)> {
                let mut a = Attrs::new();
                self.write_attrs(&mut a);
                a.0
            }
        }

        impl $family {
            /// The op with its attributes read from `a` (those missing keep `self`'s values).
            #[allow(unused_variables)]
            pub fn with_attrs(self, a: &mut Attrs) -> Result<$family, AttrError> {
                Ok(match self {
                    $( $family::$variant $({ $($field),+ })? => $family::$variant $({ $($field: <$codec as AttrCodec<$ty>>::read(a, $attr, || $field)?),+ })?, )*
                })
            }
        }

        impl Family for $family {
            fn names() -> Vec<&'static str> {
                $family::ALL.iter().map(|op| op.name()).collect()
            }

            fn name(&self) -> &'static str {
                $family::name(*self)
            }

            #[allow(unused_variables)]
            fn write_attrs(&self, a: &mut Attrs) {
                match *self {
                    $( $family::$variant $({ $($field),+ })? => { $($( <$codec as AttrCodec<$ty>>::write(a, $attr, &$field); )+)? } )*
                }
            }

            fn read_named(name: &str, a: &mut Attrs) -> Option<Result<$family, AttrError>> {
                $family::from_name(name).map(|op| op.with_attrs(a))
            }
        }
    };
}

elementwise_table! {
    /// One-operand elementwise ops. Parameters are ONNX attributes.
    UnaryOp [] {
        Abs => "Abs", Numeric;
        Neg => "Neg", Numeric;
        Sign => "Sign", Numeric;
        Ceil => "Ceil", Float;
        Floor => "Floor", Float;
        Round => "Round", Float;
        Exp => "Exp", Float;
        Log => "Log", Float;
        Sqrt => "Sqrt", Float;
        /// `1 / sqrt(x)`, which normalisations written as small ops compute.
        Rsqrt => "Rsqrt", Float;
        Reciprocal => "Reciprocal", Float;
        Sin => "Sin", Float;
        Cos => "Cos", Float;
        Tan => "Tan", Float;
        Asin => "Asin", Float;
        Acos => "Acos", Float;
        Atan => "Atan", Float;
        Sinh => "Sinh", Float;
        Cosh => "Cosh", Float;
        Tanh => "Tanh", Float;
        Asinh => "Asinh", Float;
        Acosh => "Acosh", Float;
        Atanh => "Atanh", Float;
        Erf => "Erf", Float;
        Sigmoid => "Sigmoid", Float;
        Relu => "Relu", Numeric;
        Softplus => "Softplus", Float;
        Softsign => "Softsign", Float;
        Mish => "Mish", Float;
        HardSwish => "HardSwish", Float;
        /// `x * sigmoid(alpha * x)`.
        Swish { alpha: f32 = 1.0; "alpha" as Float } => "Swish", Float;
        /// `approximate = "tanh"` uses the tanh formula.
        Gelu { tanh: bool = false; "approximate" as Approximation } => "Gelu", Float;
        LeakyRelu { alpha: f32 = 0.01; "alpha" as Float } => "LeakyRelu", Numeric;
        Elu { alpha: f32 = 1.0; "alpha" as Float } => "Elu", Float;
        Selu { alpha: f32 = 1.673_263_2; "alpha" as Float, gamma: f32 = 1.050_701; "gamma" as Float } => "Selu", Float;
        Celu { alpha: f32 = 1.0; "alpha" as Float } => "Celu", Float;
        HardSigmoid { alpha: f32 = 0.2; "alpha" as Float, beta: f32 = 0.5; "beta" as Float } => "HardSigmoid", Float;
        ThresholdedRelu { alpha: f32 = 1.0; "alpha" as Float } => "ThresholdedRelu", Float;
        Shrink { bias: f32 = 0.0; "bias" as Float, lambd: f32 = 0.5; "lambd" as Float } => "Shrink", Numeric;
        Not => "Not", Bool;
        BitwiseNot => "BitwiseNot", Int;
        IsNaN => "IsNaN", Float;
        IsInf { detect_negative: bool = true; "detect_negative" as Flag, detect_positive: bool = true; "detect_positive" as Flag } => "IsInf", Float;
    }
}

/// Ops of kiln's own (in its text form and builder), which ONNX import does not take.
const KILN_OWN: &[&str] = &["Rsqrt"];

impl UnaryOp {
    /// True for an ONNX op (default domain), false for one of kiln's own.
    pub fn is_onnx(self) -> bool {
        !KILN_OWN.contains(&self.name())
    }

    /// True when the result is `bool` whatever the operand type.
    pub fn returns_bool(self) -> bool {
        matches!(self, UnaryOp::IsNaN | UnaryOp::IsInf { .. })
    }

    /// The float parameters, by ONNX attribute name (an RNN activation's `LeakyRelu(0.1)`).
    pub fn attrs_list(&self) -> Vec<(String, f32)> {
        self.params()
            .into_iter()
            .filter_map(|(k, v)| if let Attr::Float(f) = v { Some((k, f)) } else { None })
            .collect()
    }
}

elementwise_table! {
    /// Two-operand elementwise ops with numpy broadcasting.
    BinaryOp [Eq, Hash] {
        Add => "Add", Numeric;
        Sub => "Sub", Numeric;
        Mul => "Mul", Numeric;
        Div => "Div", Numeric;
        /// The exponent may have another numeric type; the result has the base's.
        Pow => "Pow", Numeric;
        Max => "Max", Numeric;
        Min => "Min", Numeric;
        /// `fmod = false`: the result takes the divisor's sign (Python `%`); `true`: C `fmod`.
        Mod { fmod: bool = false; "fmod" as Flag } => "Mod", Numeric;
        /// `x` where `x >= 0`, else `slope * x`.
        PRelu => "PRelu", Float;
        Equal => "Equal", Any;
        Less => "Less", Numeric;
        LessOrEqual => "LessOrEqual", Numeric;
        Greater => "Greater", Numeric;
        GreaterOrEqual => "GreaterOrEqual", Numeric;
        And => "And", Bool;
        Or => "Or", Bool;
        Xor => "Xor", Bool;
        BitwiseAnd => "BitwiseAnd", Int;
        BitwiseOr => "BitwiseOr", Int;
        BitwiseXor => "BitwiseXor", Int;
        /// `direction = "LEFT"` (true) or `"RIGHT"`, which ONNX requires.
        BitShift { left: bool = true; "direction" as ShiftDirection } => "BitShift", Unsigned;
    }
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::Less
                | BinaryOp::LessOrEqual
                | BinaryOp::Greater
                | BinaryOp::GreaterOrEqual
        )
    }

    /// True when the result is `bool` (comparisons and logic).
    pub fn returns_bool(self) -> bool {
        self.is_comparison() || matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }
}

/// A set of element types an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeClass {
    Float,
    Int,
    Unsigned,
    Numeric,
    Bool,
    Any,
}

impl TypeClass {
    pub fn contains(self, d: crate::DType) -> bool {
        match self {
            TypeClass::Float => d.is_float(),
            TypeClass::Int => d.is_int(),
            TypeClass::Unsigned => d.is_unsigned_int(),
            TypeClass::Numeric => d.is_numeric(),
            TypeClass::Bool => d == crate::DType::Bool,
            TypeClass::Any => true,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            TypeClass::Float => "a float type",
            TypeClass::Int => "an integer type",
            TypeClass::Unsigned => "an unsigned integer type",
            TypeClass::Numeric => "a numeric type",
            TypeClass::Bool => "bool",
            TypeClass::Any => "any type",
        }
    }
}
