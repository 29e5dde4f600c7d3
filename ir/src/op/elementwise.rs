//! The elementwise op families. Their scalar meaning lives in `eval::elementwise`.

/// One-operand elementwise ops. Parameters are ONNX attributes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Abs,
    Neg,
    Sign,
    Ceil,
    Floor,
    Round,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Sigmoid,
    Relu,
    Softplus,
    Softsign,
    Mish,
    HardSwish,
    /// `x * sigmoid(alpha * x)`.
    Swish {
        alpha: f32,
    },
    /// `approximate = "tanh"` uses the tanh formula.
    Gelu {
        tanh: bool,
    },
    LeakyRelu {
        alpha: f32,
    },
    Elu {
        alpha: f32,
    },
    Selu {
        alpha: f32,
        gamma: f32,
    },
    Celu {
        alpha: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    ThresholdedRelu {
        alpha: f32,
    },
    Shrink {
        bias: f32,
        lambd: f32,
    },
    Not,
    BitwiseNot,
    IsNaN,
    IsInf {
        detect_positive: bool,
        detect_negative: bool,
    },
}

impl UnaryOp {
    /// Every parameterless variant, plus the parameterised ones with ONNX's default attributes.
    pub const ALL: [UnaryOp; 42] = [
        UnaryOp::Abs,
        UnaryOp::Neg,
        UnaryOp::Sign,
        UnaryOp::Ceil,
        UnaryOp::Floor,
        UnaryOp::Round,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Reciprocal,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Tanh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
        UnaryOp::Erf,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Softplus,
        UnaryOp::Softsign,
        UnaryOp::Mish,
        UnaryOp::HardSwish,
        UnaryOp::Swish { alpha: 1.0 },
        UnaryOp::Gelu { tanh: false },
        UnaryOp::LeakyRelu { alpha: 0.01 },
        UnaryOp::Elu { alpha: 1.0 },
        UnaryOp::Selu { alpha: 1.673_263_2, gamma: 1.050_701 },
        UnaryOp::Celu { alpha: 1.0 },
        UnaryOp::HardSigmoid { alpha: 0.2, beta: 0.5 },
        UnaryOp::ThresholdedRelu { alpha: 1.0 },
        UnaryOp::Shrink { bias: 0.0, lambd: 0.5 },
        UnaryOp::Not,
        UnaryOp::BitwiseNot,
        UnaryOp::IsNaN,
        UnaryOp::IsInf { detect_positive: true, detect_negative: true },
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Abs => "Abs",
            UnaryOp::Neg => "Neg",
            UnaryOp::Sign => "Sign",
            UnaryOp::Ceil => "Ceil",
            UnaryOp::Floor => "Floor",
            UnaryOp::Round => "Round",
            UnaryOp::Exp => "Exp",
            UnaryOp::Log => "Log",
            UnaryOp::Sqrt => "Sqrt",
            UnaryOp::Reciprocal => "Reciprocal",
            UnaryOp::Sin => "Sin",
            UnaryOp::Cos => "Cos",
            UnaryOp::Tan => "Tan",
            UnaryOp::Asin => "Asin",
            UnaryOp::Acos => "Acos",
            UnaryOp::Atan => "Atan",
            UnaryOp::Sinh => "Sinh",
            UnaryOp::Cosh => "Cosh",
            UnaryOp::Tanh => "Tanh",
            UnaryOp::Asinh => "Asinh",
            UnaryOp::Acosh => "Acosh",
            UnaryOp::Atanh => "Atanh",
            UnaryOp::Erf => "Erf",
            UnaryOp::Sigmoid => "Sigmoid",
            UnaryOp::Relu => "Relu",
            UnaryOp::Softplus => "Softplus",
            UnaryOp::Softsign => "Softsign",
            UnaryOp::Mish => "Mish",
            UnaryOp::HardSwish => "HardSwish",
            UnaryOp::Swish { .. } => "Swish",
            UnaryOp::Gelu { .. } => "Gelu",
            UnaryOp::LeakyRelu { .. } => "LeakyRelu",
            UnaryOp::Elu { .. } => "Elu",
            UnaryOp::Selu { .. } => "Selu",
            UnaryOp::Celu { .. } => "Celu",
            UnaryOp::HardSigmoid { .. } => "HardSigmoid",
            UnaryOp::ThresholdedRelu { .. } => "ThresholdedRelu",
            UnaryOp::Shrink { .. } => "Shrink",
            UnaryOp::Not => "Not",
            UnaryOp::BitwiseNot => "BitwiseNot",
            UnaryOp::IsNaN => "IsNaN",
            UnaryOp::IsInf { .. } => "IsInf",
        }
    }

    /// The variant named `name`, with ONNX's default attributes.
    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|u| u.name() == name)
    }

    /// Which operand types the op accepts.
    pub fn accepts(self) -> TypeClass {
        match self {
            UnaryOp::Abs | UnaryOp::Neg | UnaryOp::Sign => TypeClass::Numeric,
            UnaryOp::Relu | UnaryOp::LeakyRelu { .. } | UnaryOp::Shrink { .. } => TypeClass::Numeric,
            UnaryOp::Not => TypeClass::Bool,
            UnaryOp::BitwiseNot => TypeClass::Int,
            _ => TypeClass::Float,
        }
    }

    /// True when the result is `bool` whatever the operand type.
    pub fn returns_bool(self) -> bool {
        matches!(self, UnaryOp::IsNaN | UnaryOp::IsInf { .. })
    }
}

/// Two-operand elementwise ops with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// The exponent may have another numeric type; the result has the base's.
    Pow,
    Max,
    Min,
    /// `fmod = false`: the result takes the divisor's sign (Python `%`); `true`: C `fmod`.
    Mod {
        fmod: bool,
    },
    /// `x` where `x >= 0`, else `slope * x`.
    PRelu,
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    And,
    Or,
    Xor,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    BitShiftLeft,
    BitShiftRight,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 22] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Mod { fmod: false },
        BinaryOp::PRelu,
        BinaryOp::Equal,
        BinaryOp::Less,
        BinaryOp::LessOrEqual,
        BinaryOp::Greater,
        BinaryOp::GreaterOrEqual,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::BitwiseAnd,
        BinaryOp::BitwiseOr,
        BinaryOp::BitwiseXor,
        BinaryOp::BitShiftLeft,
        BinaryOp::BitShiftRight,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "Add",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
            BinaryOp::Div => "Div",
            BinaryOp::Pow => "Pow",
            BinaryOp::Max => "Max",
            BinaryOp::Min => "Min",
            BinaryOp::Mod { .. } => "Mod",
            BinaryOp::PRelu => "PRelu",
            BinaryOp::Equal => "Equal",
            BinaryOp::Less => "Less",
            BinaryOp::LessOrEqual => "LessOrEqual",
            BinaryOp::Greater => "Greater",
            BinaryOp::GreaterOrEqual => "GreaterOrEqual",
            BinaryOp::And => "And",
            BinaryOp::Or => "Or",
            BinaryOp::Xor => "Xor",
            BinaryOp::BitwiseAnd => "BitwiseAnd",
            BinaryOp::BitwiseOr => "BitwiseOr",
            BinaryOp::BitwiseXor => "BitwiseXor",
            BinaryOp::BitShiftLeft | BinaryOp::BitShiftRight => "BitShift",
        }
    }

    pub fn from_name(name: &str) -> Option<BinaryOp> {
        BinaryOp::ALL.into_iter().find(|b| b.name() == name)
    }

    pub fn accepts(self) -> TypeClass {
        match self {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => TypeClass::Bool,
            BinaryOp::BitwiseAnd | BinaryOp::BitwiseOr | BinaryOp::BitwiseXor => TypeClass::Int,
            BinaryOp::BitShiftLeft | BinaryOp::BitShiftRight => TypeClass::Unsigned,
            BinaryOp::Equal => TypeClass::Any,
            BinaryOp::PRelu => TypeClass::Float,
            _ => TypeClass::Numeric,
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Equal | BinaryOp::Less | BinaryOp::LessOrEqual | BinaryOp::Greater | BinaryOp::GreaterOrEqual)
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
