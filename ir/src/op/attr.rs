//! A generic view of op attributes: what the text form prints and parses, and what importers
//! produce. `Op::attrs` and `Op::from_attrs` convert between it and the typed variants.

use std::fmt;

use super::{AutoPad, BinaryOp, Conv, Gemm, Op, Pool, PoolKind, Reduce, ReduceKind, UnaryOp, Window};
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

    fn take(&mut self, name: &str) -> Option<Attr> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }

    fn wrong(name: &str, want: &str, got: &Attr) -> String {
        format!("attribute `{name}` must be {want}, got {}", got.kind())
    }

    pub fn int(&mut self, name: &str, default: i64) -> Result<i64, String> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn required_int(&mut self, name: &str) -> Result<i64, String> {
        match self.take(name) {
            None => Err(format!("attribute `{name}` is required")),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn size(&mut self, name: &str, default: usize) -> Result<usize, String> {
        let v = self.int(name, default as i64)?;
        usize::try_from(v).map_err(|_| format!("attribute `{name}` must not be negative, got {v}"))
    }

    pub fn flag(&mut self, name: &str, default: bool) -> Result<bool, String> {
        match self.int(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("attribute `{name}` must be 0 or 1, got {v}")),
        }
    }

    pub fn float(&mut self, name: &str, default: f32) -> Result<f32, String> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(v),
            Some(Attr::Int(v)) => Ok(v as f32),
            Some(a) => Err(Self::wrong(name, "a float", &a)),
        }
    }

    pub fn ints(&mut self, name: &str) -> Result<Option<Vec<i64>>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a list of integers", &a)),
        }
    }

    pub fn sizes(&mut self, name: &str) -> Result<Vec<usize>, String> {
        let v = self.ints(name)?.unwrap_or_default();
        v.iter()
            .map(|&x| usize::try_from(x).map_err(|_| format!("attribute `{name}` must not hold negative values, got {x}")))
            .collect()
    }

    pub fn string(&mut self, name: &str, default: &str) -> Result<String, String> {
        match self.take(name) {
            None => Ok(default.to_string()),
            Some(Attr::Str(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a string", &a)),
        }
    }

    pub fn dtype(&mut self, name: &str) -> Result<DType, String> {
        match self.take(name) {
            None => Err(format!("attribute `{name}` is required")),
            Some(Attr::Type(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a type", &a)),
        }
    }

    pub fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Tensor(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a tensor", &a)),
        }
    }

    /// Fails if any attribute was not consumed.
    pub fn finish(self, op: &str) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some((n, _)) => Err(format!("{op} has no attribute `{n}`")),
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T>(f: &mut fmt::Formatter<'_>, v: &[T], each: impl Fn(&T) -> String) -> fmt::Result {
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

impl Op {
    /// The op's attributes, every one of them, in a fixed order.
    pub fn attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        let f = |v: f32| Attr::Float(v);
        let b = |v: bool| Attr::Int(v as i64);
        let sizes = |v: &[usize]| Attr::Ints(v.iter().map(|&x| x as i64).collect());
        let window = |a: &mut Attrs, w: &Window| {
            a.push("auto_pad", Attr::Str(w.auto_pad.name().into()));
            a.push("dilations", sizes(&w.dilations));
            a.push("pads", sizes(&w.pads));
            a.push("strides", sizes(&w.strides));
        };
        match self {
            Op::Input | Op::Constant(_) => {}
            Op::Unary(u) => match *u {
                UnaryOp::Gelu { tanh } => a.push("approximate", Attr::Str(if tanh { "tanh" } else { "none" }.into())),
                UnaryOp::LeakyRelu { alpha } | UnaryOp::Elu { alpha } | UnaryOp::Celu { alpha } => a.push("alpha", f(alpha)),
                UnaryOp::ThresholdedRelu { alpha } => a.push("alpha", f(alpha)),
                UnaryOp::Selu { alpha, gamma } => {
                    a.push("alpha", f(alpha));
                    a.push("gamma", f(gamma));
                }
                UnaryOp::HardSigmoid { alpha, beta } => {
                    a.push("alpha", f(alpha));
                    a.push("beta", f(beta));
                }
                UnaryOp::Shrink { bias, lambd } => {
                    a.push("bias", f(bias));
                    a.push("lambd", f(lambd));
                }
                UnaryOp::IsInf { detect_positive, detect_negative } => {
                    a.push("detect_negative", b(detect_negative));
                    a.push("detect_positive", b(detect_positive));
                }
                _ => {}
            },
            Op::Binary(bin) => match *bin {
                BinaryOp::Mod { fmod } => a.push("fmod", b(fmod)),
                BinaryOp::BitShiftLeft => a.push("direction", Attr::Str("LEFT".into())),
                BinaryOp::BitShiftRight => a.push("direction", Attr::Str("RIGHT".into())),
                _ => {}
            },
            Op::Clip | Op::Where | Op::MatMul | Op::Squeeze | Op::Unsqueeze | Op::Slice | Op::Expand | Op::Identity => {}
            Op::Cast { to } => a.push("to", Attr::Type(*to)),
            Op::Gemm(g) => {
                a.push("alpha", f(g.alpha));
                a.push("beta", f(g.beta));
                a.push("transA", b(g.trans_a));
                a.push("transB", b(g.trans_b));
            }
            Op::Conv(c) => {
                window(&mut a, &c.window);
                a.push("group", Attr::Int(c.group as i64));
            }
            Op::Pool(p) => {
                window(&mut a, &p.window);
                a.push("ceil_mode", b(p.ceil_mode));
                if let PoolKind::Average { count_include_pad } = p.kind {
                    a.push("count_include_pad", b(count_include_pad));
                }
                a.push("kernel_shape", sizes(&p.kernel));
            }
            Op::GlobalPool(_) => {}
            Op::Softmax { axis } | Op::Flatten { axis } | Op::Concat { axis } | Op::Gather { axis } => {
                a.push("axis", Attr::Int(*axis))
            }
            Op::LayerNorm { axis, epsilon } => {
                a.push("axis", Attr::Int(*axis));
                a.push("epsilon", f(*epsilon));
            }
            Op::BatchNorm { epsilon } => a.push("epsilon", f(*epsilon)),
            Op::Reduce(r) => {
                a.push("keepdims", b(r.keepdims));
                a.push("noop_with_empty_axes", b(r.noop_with_empty_axes));
            }
            Op::Reshape { allowzero } => a.push("allowzero", b(*allowzero)),
            Op::Transpose { perm } => a.push("perm", sizes(perm)),
            Op::Split { axis, num_outputs } => {
                a.push("axis", Attr::Int(*axis));
                a.push("num_outputs", Attr::Int(*num_outputs as i64));
            }
        }
        a
    }

    /// The op named `name` (its ONNX name) with these attributes; missing ones take ONNX's defaults.
    /// `Input` and `Constant` are not built this way.
    pub fn from_attrs(name: &str, mut a: Attrs) -> Result<Op, String> {
        let window = |a: &mut Attrs| -> Result<Window, String> {
            let auto = a.string("auto_pad", "NOTSET")?;
            Ok(Window {
                auto_pad: AutoPad::from_name(&auto).ok_or_else(|| format!("unknown auto_pad `{auto}`"))?,
                dilations: a.sizes("dilations")?,
                pads: a.sizes("pads")?,
                strides: a.sizes("strides")?,
            })
        };
        let reduce = |a: &mut Attrs, kind| -> Result<Op, String> {
            Ok(Op::Reduce(Reduce { kind, keepdims: a.flag("keepdims", true)?, noop_with_empty_axes: a.flag("noop_with_empty_axes", false)? }))
        };
        let op = if let Some(u) = UnaryOp::from_name(name) {
            Op::Unary(match u {
                UnaryOp::Gelu { .. } => match a.string("approximate", "none")?.as_str() {
                    "none" => UnaryOp::Gelu { tanh: false },
                    "tanh" => UnaryOp::Gelu { tanh: true },
                    other => return Err(format!("unknown Gelu approximation `{other}`")),
                },
                UnaryOp::LeakyRelu { alpha } => UnaryOp::LeakyRelu { alpha: a.float("alpha", alpha)? },
                UnaryOp::Elu { alpha } => UnaryOp::Elu { alpha: a.float("alpha", alpha)? },
                UnaryOp::Celu { alpha } => UnaryOp::Celu { alpha: a.float("alpha", alpha)? },
                UnaryOp::ThresholdedRelu { alpha } => UnaryOp::ThresholdedRelu { alpha: a.float("alpha", alpha)? },
                UnaryOp::Selu { alpha, gamma } => UnaryOp::Selu { alpha: a.float("alpha", alpha)?, gamma: a.float("gamma", gamma)? },
                UnaryOp::HardSigmoid { alpha, beta } => {
                    UnaryOp::HardSigmoid { alpha: a.float("alpha", alpha)?, beta: a.float("beta", beta)? }
                }
                UnaryOp::Shrink { bias, lambd } => UnaryOp::Shrink { bias: a.float("bias", bias)?, lambd: a.float("lambd", lambd)? },
                UnaryOp::IsInf { .. } => UnaryOp::IsInf {
                    detect_negative: a.flag("detect_negative", true)?,
                    detect_positive: a.flag("detect_positive", true)?,
                },
                other => other,
            })
        } else if let Some(bin) = BinaryOp::from_name(name) {
            Op::Binary(match bin {
                BinaryOp::Mod { .. } => BinaryOp::Mod { fmod: a.flag("fmod", false)? },
                BinaryOp::BitShiftLeft | BinaryOp::BitShiftRight => match a.string("direction", "")?.as_str() {
                    "LEFT" => BinaryOp::BitShiftLeft,
                    "RIGHT" => BinaryOp::BitShiftRight,
                    other => return Err(format!("BitShift direction must be LEFT or RIGHT, got `{other}`")),
                },
                other => other,
            })
        } else if let Some(kind) = ReduceKind::ALL.into_iter().find(|k| k.op_name() == name) {
            reduce(&mut a, kind)?
        } else {
            match name {
                "Clip" => Op::Clip,
                "Where" => Op::Where,
                "Cast" => Op::Cast { to: a.dtype("to")? },
                "MatMul" => Op::MatMul,
                "Gemm" => Op::Gemm(Gemm {
                    alpha: a.float("alpha", 1.0)?,
                    beta: a.float("beta", 1.0)?,
                    trans_a: a.flag("transA", false)?,
                    trans_b: a.flag("transB", false)?,
                }),
                "Conv" => {
                    let window = window(&mut a)?;
                    Op::Conv(Conv { window, group: a.size("group", 1)? })
                }
                "MaxPool" | "AveragePool" => {
                    let window = window(&mut a)?;
                    let kind = if name == "MaxPool" {
                        PoolKind::Max
                    } else {
                        PoolKind::Average { count_include_pad: a.flag("count_include_pad", false)? }
                    };
                    let kernel = a.sizes("kernel_shape")?;
                    if kernel.is_empty() {
                        return Err(format!("{name} needs `kernel_shape`"));
                    }
                    Op::Pool(Pool { kind, kernel, window, ceil_mode: a.flag("ceil_mode", false)? })
                }
                "GlobalMaxPool" => Op::GlobalPool(PoolKind::Max),
                "GlobalAveragePool" => Op::GlobalPool(PoolKind::Average { count_include_pad: false }),
                "Softmax" => Op::Softmax { axis: a.int("axis", -1)? },
                "LayerNormalization" => Op::LayerNorm { axis: a.int("axis", -1)?, epsilon: a.float("epsilon", 1e-5)? },
                "BatchNormalization" => Op::BatchNorm { epsilon: a.float("epsilon", 1e-5)? },
                "Reshape" => Op::Reshape { allowzero: a.flag("allowzero", false)? },
                "Flatten" => Op::Flatten { axis: a.int("axis", 1)? },
                "Transpose" => Op::Transpose { perm: a.sizes("perm")? },
                "Squeeze" => Op::Squeeze,
                "Unsqueeze" => Op::Unsqueeze,
                "Concat" => Op::Concat { axis: a.required_int("axis")? },
                "Split" => Op::Split { axis: a.int("axis", 0)?, num_outputs: a.size("num_outputs", 0)? },
                "Slice" => Op::Slice,
                "Gather" => Op::Gather { axis: a.int("axis", 0)? },
                "Expand" => Op::Expand,
                "Identity" => Op::Identity,
                _ => return Err(format!("unknown op `{name}`")),
            }
        };
        a.finish(name)?;
        Ok(op)
    }
}
