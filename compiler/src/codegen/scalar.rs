//! Scalar semantics in kernel bodies: every elementwise op of kiln-ir as arith/math ops.
//!
//! Values are carried in a *compute* type: f16/bf16 widen to f32 (as the interpreter computes in
//! higher precision), f32/f64 and integers stay, bools are i1. `load` and `store` convert from and
//! to the storage type of tensors (bools are bytes in memory).

use melior::dialect::arith::{self, CmpfPredicate, CmpiPredicate};
use melior::ir::attribute::{FloatAttribute, IntegerAttribute};
use melior::ir::r#type::IntegerType;
use melior::ir::{Block, Location, Type, Value};
use melior::Context;

use kiln_ir::op::{BinaryOp, UnaryOp};
use kiln_ir::DType;

use super::mlir::{err, op, push, storage_type};
use crate::Result;

/// A scalar in its compute type, with the kiln dtype it stands for.
#[derive(Clone, Copy)]
pub struct Scalar<'c, 'a> {
    pub v: Value<'c, 'a>,
    pub dtype: DType,
}

/// Emits scalar ops into one block.
pub struct ScalarBuilder<'c, 'a> {
    pub ctx: &'c Context,
    pub loc: Location<'c>,
    pub block: &'a Block<'c>,
}

fn compute_type(d: DType) -> &'static str {
    compute_type_of(storage_compute(d))
}

fn compute_type_of(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "f32",
        DType::F64 => "f64",
        DType::Bool => "i1",
        other => storage_type(other),
    }
}

/// The type a storage type's values are computed in (`storage.rs`): f32 for the 8- and 4-bit
/// floats, 8-bit integers for the 4- and 2-bit ones. Other types are their own.
fn storage_compute(d: DType) -> DType {
    match d {
        DType::I4 | DType::I2 => DType::I8,
        DType::U4 | DType::U2 => DType::U8,
        d if d.is_storage() => DType::F32,
        d => d,
    }
}

fn bits(d: DType) -> u32 {
    (d.size() * 8) as u32
}

/// The bits of an integer type's name (`i8` -> 8; `index` is 64).
fn int_bits(name: &str) -> Option<u32> {
    if name == "index" {
        return Some(64);
    }
    name.strip_prefix('i').and_then(|b| b.parse().ok())
}

impl<'c, 'a> ScalarBuilder<'c, 'a> {
    /// A scalar type by the name `compute`/`storage_type` give it, built with melior's type
    /// constructors (never parsed from text).
    pub fn ty(&self, name: &str) -> Result<Type<'c>> {
        let ctx = self.ctx;
        Ok(match name {
            "f16" => Type::float16(ctx),
            "bf16" => Type::bfloat16(ctx),
            "f32" => Type::float32(ctx),
            "f64" => Type::float64(ctx),
            "index" => Type::index(ctx),
            _ => match int_bits(name) {
                Some(bits) => IntegerType::new(ctx, bits).into(),
                None => return Err(err(format!("`{name}` is not a scalar type"))),
            },
        })
    }

    /// `name` with operands and one result of type `result`.
    pub fn emit(
        &self,
        name: &str,
        operands: &[Value<'c, 'a>],
        result: &str,
    ) -> Result<Value<'c, 'a>> {
        let t = self.ty(result)?;
        Ok(push(self.block, op(self.ctx, self.loc, name, operands, &[t], &[])?))
    }

    /// `name` with one integer attribute (a predicate, a dimension).
    fn emit_int_attr(
        &self,
        name: &str,
        operands: &[Value<'c, 'a>],
        result: Type<'c>,
        attr: (&str, i64),
    ) -> Result<Value<'c, 'a>> {
        let a = IntegerAttribute::new(IntegerType::new(self.ctx, 64).into(), attr.1).into();
        Ok(push(self.block, op(self.ctx, self.loc, name, operands, &[result], &[(attr.0, a)])?))
    }

    /// A constant of compute type `ty` (`f32`, `i64`, `i1`...).
    pub fn constant(&self, value: f64, ty: &str) -> Result<Value<'c, 'a>> {
        if ty.starts_with('f') || ty == "bf16" {
            let t = self.ty(ty)?;
            let a = FloatAttribute::new(self.ctx, t, value).into();
            return Ok(push(
                self.block,
                op(self.ctx, self.loc, "arith.constant", &[], &[t], &[("value", a)])?,
            ));
        }
        let v = if ty == "i1" { (value != 0.0) as i128 } else { value as i128 };
        self.int_constant(v, ty)
    }

    /// An integer constant given as i128 (exact for every integer type: its bits are the low
    /// bits of the value).
    pub fn int_constant(&self, value: i128, ty: &str) -> Result<Value<'c, 'a>> {
        let t = self.ty(ty)?;
        let bits = int_bits(ty).ok_or_else(|| err(format!("`{ty}` is not an integer type")))?;
        let v =
            if bits >= 64 { value as i64 } else { ((value as u64) & ((1u64 << bits) - 1)) as i64 };
        let a = IntegerAttribute::new(t, v).into();
        Ok(push(self.block, op(self.ctx, self.loc, "arith.constant", &[], &[t], &[("value", a)])?))
    }

    /// The current iteration of loop `dim` of the enclosing `linalg.generic` (`linalg.index`),
    /// as `ty` (`index`, or an integer type by `arith.index_cast`).
    pub fn loop_index(&self, dim: usize, ty: &str) -> Result<Value<'c, 'a>> {
        let i =
            self.emit_int_attr("linalg.index", &[], Type::index(self.ctx), ("dim", dim as i64))?;
        if ty == "index" {
            return Ok(i);
        }
        self.emit("arith.index_cast", &[i], ty)
    }

    pub fn select(
        &self,
        c: Value<'c, 'a>,
        a: Value<'c, 'a>,
        b: Value<'c, 'a>,
        ty: &str,
    ) -> Result<Value<'c, 'a>> {
        self.emit("arith.select", &[c, a, b], ty)
    }

    /// `arith.cmpf`, by melior's typed builder.
    pub fn cmpf(
        &self,
        pred: CmpfPredicate,
        a: Value<'c, 'a>,
        b: Value<'c, 'a>,
    ) -> Result<Value<'c, 'a>> {
        Ok(push(self.block, arith::cmpf(self.ctx, pred, a, b, self.loc)))
    }

    /// `arith.cmpi`, by melior's typed builder.
    pub fn cmpi(
        &self,
        pred: CmpiPredicate,
        a: Value<'c, 'a>,
        b: Value<'c, 'a>,
    ) -> Result<Value<'c, 'a>> {
        Ok(push(self.block, arith::cmpi(self.ctx, pred, a, b, self.loc)))
    }

    /// A tensor element (storage type) to its compute type.
    pub fn load(&self, v: Value<'c, 'a>, dtype: DType) -> Result<Scalar<'c, 'a>> {
        let v = match dtype {
            d if d.is_storage() => self.decode_storage(v, d)?,
            DType::F16 | DType::BF16 => self.emit("arith.extf", &[v], "f32")?,
            DType::Bool => {
                let zero = self.int_constant(0, "i8")?;
                self.cmpi(CmpiPredicate::Ne, v, zero)?
            }
            _ => v,
        };
        Ok(Scalar { v, dtype })
    }

    /// A computed scalar back to its storage type.
    pub fn store(&self, s: Scalar<'c, 'a>) -> Result<Value<'c, 'a>> {
        match s.dtype {
            // A value a cast made is exact; one computed otherwise rounds here.
            d if d.is_storage() => self.encode_storage(s.v, d, false, true),
            DType::F16 | DType::BF16 => self.emit("arith.truncf", &[s.v], storage_type(s.dtype)),
            DType::Bool => self.emit("arith.extui", &[s.v], "i8"),
            _ => Ok(s.v),
        }
    }

    fn f(&self, d: DType) -> &'static str {
        compute_type(d)
    }

    /// One unary op.
    pub fn unary(&self, u: UnaryOp, x: Scalar<'c, 'a>, out: DType) -> Result<Scalar<'c, 'a>> {
        let d = x.dtype;
        if d.is_float() {
            let t = self.f(d);
            let v = self.unary_float(u, x.v, t)?;
            return Ok(Scalar { v, dtype: out });
        }
        let t = compute_type(d);
        let signed = d.is_signed_int();
        let v = match u {
            UnaryOp::Not => {
                let one = self.constant(1.0, "i1")?;
                self.emit("arith.xori", &[x.v, one], "i1")?
            }
            UnaryOp::BitwiseNot => {
                let ones = self.int_constant(-1, t)?;
                self.emit("arith.xori", &[x.v, ones], t)?
            }
            UnaryOp::Neg => {
                let zero = self.int_constant(0, t)?;
                self.emit("arith.subi", &[zero, x.v], t)?
            }
            UnaryOp::Abs if signed => self.emit("math.absi", &[x.v], t)?,
            UnaryOp::Abs | UnaryOp::Ceil | UnaryOp::Floor | UnaryOp::Round => x.v,
            UnaryOp::Relu if signed => {
                let zero = self.int_constant(0, t)?;
                self.emit("arith.maxsi", &[x.v, zero], t)?
            }
            UnaryOp::Relu => x.v,
            UnaryOp::Sign => {
                let zero = self.int_constant(0, t)?;
                let one = self.int_constant(1, t)?;
                let gt = self.cmpi(
                    if signed { CmpiPredicate::Sgt } else { CmpiPredicate::Ugt },
                    x.v,
                    zero,
                )?;
                let pos = self.select(gt, one, zero, t)?;
                if signed {
                    let minus = self.int_constant(-1, t)?;
                    let lt = self.cmpi(CmpiPredicate::Slt, x.v, zero)?;
                    self.select(lt, minus, pos, t)?
                } else {
                    pos
                }
            }
            // ONNX defines Shrink on integers by its float formula, truncated back (as the
            // interpreter computes it).
            UnaryOp::Shrink { .. } => {
                let (to_f, to_i) = if signed {
                    ("arith.sitofp", "arith.fptosi")
                } else {
                    ("arith.uitofp", "arith.fptoui")
                };
                let f = self.emit(to_f, &[x.v], "f64")?;
                let f = self.unary_float(u, f, "f64")?;
                self.emit(to_i, &[f], t)?
            }
            other => return Err(err(format!("{} is not defined for {d}", other.name()))),
        };
        Ok(Scalar { v, dtype: out })
    }

    fn unary_float(&self, u: UnaryOp, x: Value<'c, 'a>, t: &str) -> Result<Value<'c, 'a>> {
        let c = |v: f64| self.constant(v, t);
        let math = |name: &str, x: Value<'c, 'a>| self.emit(name, &[x], t);
        let bin = |name: &str, a: Value<'c, 'a>, b: Value<'c, 'a>| self.emit(name, &[a, b], t);
        let sigmoid = |x: Value<'c, 'a>| -> Result<Value<'c, 'a>> {
            let neg = math("arith.negf", x)?;
            let e = math("math.exp", neg)?;
            let one = c(1.0)?;
            let den = bin("arith.addf", one, e)?;
            bin("arith.divf", one, den)
        };
        let softplus = |x: Value<'c, 'a>| -> Result<Value<'c, 'a>> {
            // log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)).
            let zero = c(0.0)?;
            let pos = bin("arith.maximumf", x, zero)?;
            let ax = math("math.absf", x)?;
            let nax = math("arith.negf", ax)?;
            let e = math("math.exp", nax)?;
            let l = math("math.log1p", e)?;
            bin("arith.addf", pos, l)
        };
        let select_ge0 = |x: Value<'c, 'a>, neg: Value<'c, 'a>| -> Result<Value<'c, 'a>> {
            let zero = c(0.0)?;
            let ge = self.cmpf(CmpfPredicate::Oge, x, zero)?;
            self.select(ge, x, neg, t)
        };
        Ok(match u {
            UnaryOp::Abs => math("math.absf", x)?,
            UnaryOp::Neg => math("arith.negf", x)?,
            UnaryOp::Sign => {
                // 1, -1, or x itself (0, -0, NaN).
                let zero = c(0.0)?;
                let (one, minus) = (c(1.0)?, c(-1.0)?);
                let gt = self.cmpf(CmpfPredicate::Ogt, x, zero)?;
                let lt = self.cmpf(CmpfPredicate::Olt, x, zero)?;
                let a = self.select(lt, minus, x, t)?;
                self.select(gt, one, a, t)?
            }
            UnaryOp::Ceil => math("math.ceil", x)?,
            UnaryOp::Floor => math("math.floor", x)?,
            UnaryOp::Round => math("math.roundeven", x)?,
            UnaryOp::Exp => math("math.exp", x)?,
            UnaryOp::Log => math("math.log", x)?,
            UnaryOp::Sqrt => math("math.sqrt", x)?,
            UnaryOp::Rsqrt => {
                let root = math("math.sqrt", x)?;
                bin("arith.divf", c(1.0)?, root)?
            }
            UnaryOp::Reciprocal => bin("arith.divf", c(1.0)?, x)?,
            UnaryOp::Sin => math("math.sin", x)?,
            UnaryOp::Cos => math("math.cos", x)?,
            UnaryOp::Tan => math("math.tan", x)?,
            UnaryOp::Asin => math("math.asin", x)?,
            UnaryOp::Acos => math("math.acos", x)?,
            UnaryOp::Atan => math("math.atan", x)?,
            UnaryOp::Sinh => math("math.sinh", x)?,
            UnaryOp::Cosh => math("math.cosh", x)?,
            UnaryOp::Tanh => math("math.tanh", x)?,
            UnaryOp::Asinh => math("math.asinh", x)?,
            UnaryOp::Acosh => math("math.acosh", x)?,
            UnaryOp::Atanh => math("math.atanh", x)?,
            UnaryOp::Erf => math("math.erf", x)?,
            UnaryOp::Sigmoid => sigmoid(x)?,
            UnaryOp::Relu => bin("arith.maximumf", x, c(0.0)?)?,
            UnaryOp::Softplus => softplus(x)?,
            UnaryOp::Softsign => {
                let ax = math("math.absf", x)?;
                let den = bin("arith.addf", c(1.0)?, ax)?;
                bin("arith.divf", x, den)?
            }
            UnaryOp::Mish => {
                let sp = softplus(x)?;
                let th = math("math.tanh", sp)?;
                bin("arith.mulf", x, th)?
            }
            UnaryOp::HardSwish => {
                let s = bin("arith.mulf", x, c(1.0 / 6.0)?)?;
                let s = bin("arith.addf", s, c(0.5)?)?;
                let s = bin("arith.maximumf", s, c(0.0)?)?;
                let s = bin("arith.minimumf", s, c(1.0)?)?;
                bin("arith.mulf", x, s)?
            }
            UnaryOp::Swish { alpha } => {
                let ax = bin("arith.mulf", x, c(alpha as f64)?)?;
                let s = sigmoid(ax)?;
                bin("arith.mulf", x, s)?
            }
            UnaryOp::Gelu { tanh: false } => {
                let s = bin("arith.mulf", x, c(std::f64::consts::FRAC_1_SQRT_2)?)?;
                let e = math("math.erf", s)?;
                let e = bin("arith.addf", e, c(1.0)?)?;
                let h = bin("arith.mulf", x, c(0.5)?)?;
                bin("arith.mulf", h, e)?
            }
            UnaryOp::Gelu { tanh: true } => {
                let x3 = bin("arith.mulf", x, x)?;
                let x3 = bin("arith.mulf", x3, x)?;
                let inner = bin("arith.mulf", x3, c(0.044715)?)?;
                let inner = bin("arith.addf", inner, x)?;
                let inner = bin("arith.mulf", inner, c((2.0 / std::f64::consts::PI).sqrt())?)?;
                let th = math("math.tanh", inner)?;
                let th = bin("arith.addf", th, c(1.0)?)?;
                let h = bin("arith.mulf", x, c(0.5)?)?;
                bin("arith.mulf", h, th)?
            }
            UnaryOp::LeakyRelu { alpha } => {
                let neg = bin("arith.mulf", x, c(alpha as f64)?)?;
                select_ge0(x, neg)?
            }
            UnaryOp::Elu { alpha } => {
                let e = math("math.expm1", x)?;
                let neg = bin("arith.mulf", e, c(alpha as f64)?)?;
                select_ge0(x, neg)?
            }
            UnaryOp::Selu { alpha, gamma } => {
                let e = math("math.expm1", x)?;
                let neg = bin("arith.mulf", e, c(alpha as f64)?)?;
                let zero = c(0.0)?;
                let gt = self.cmpf(CmpfPredicate::Ogt, x, zero)?;
                let v = self.select(gt, x, neg, t)?;
                bin("arith.mulf", v, c(gamma as f64)?)?
            }
            UnaryOp::Celu { alpha } => {
                let a = alpha as f64;
                let s = bin("arith.mulf", x, c(1.0 / a)?)?;
                let e = math("math.expm1", s)?;
                let neg = bin("arith.mulf", e, c(a)?)?;
                let neg = bin("arith.minimumf", neg, c(0.0)?)?;
                let pos = bin("arith.maximumf", x, c(0.0)?)?;
                bin("arith.addf", pos, neg)?
            }
            UnaryOp::HardSigmoid { alpha, beta } => {
                let v = bin("arith.mulf", x, c(alpha as f64)?)?;
                let v = bin("arith.addf", v, c(beta as f64)?)?;
                let v = bin("arith.maximumf", v, c(0.0)?)?;
                bin("arith.minimumf", v, c(1.0)?)?
            }
            UnaryOp::ThresholdedRelu { alpha } => {
                let gt = self.cmpf(CmpfPredicate::Ogt, x, c(alpha as f64)?)?;
                self.select(gt, x, c(0.0)?, t)?
            }
            UnaryOp::Shrink { bias, lambd } => {
                let (b, l) = (bias as f64, lambd as f64);
                let lo = self.cmpf(CmpfPredicate::Olt, x, c(-l)?)?;
                let hi = self.cmpf(CmpfPredicate::Ogt, x, c(l)?)?;
                let plus = bin("arith.addf", x, c(b)?)?;
                let minus = bin("arith.subf", x, c(b)?)?;
                let v = self.select(hi, minus, c(0.0)?, t)?;
                self.select(lo, plus, v, t)?
            }
            UnaryOp::IsNaN => self.cmpf(CmpfPredicate::Uno, x, x)?,
            UnaryOp::IsInf { detect_positive, detect_negative } => {
                let pos = self.cmpf(CmpfPredicate::Oeq, x, c(f64::INFINITY)?)?;
                let neg = self.cmpf(CmpfPredicate::Oeq, x, c(f64::NEG_INFINITY)?)?;
                match (detect_positive, detect_negative) {
                    (true, true) => self.emit("arith.ori", &[pos, neg], "i1")?,
                    (true, false) => pos,
                    (false, true) => neg,
                    (false, false) => self.constant(0.0, "i1")?,
                }
            }
            UnaryOp::Not | UnaryOp::BitwiseNot => {
                return Err(err(format!("{} is not defined for floats", u.name())))
            }
        })
    }

    /// One binary op; both operands have the same dtype (Pow's exponent may differ).
    pub fn binary(
        &self,
        b: BinaryOp,
        l: Scalar<'c, 'a>,
        r: Scalar<'c, 'a>,
        out: DType,
    ) -> Result<Scalar<'c, 'a>> {
        let d = l.dtype;
        if b == BinaryOp::Pow && r.dtype != d {
            let r = self.cast(r, if d.is_float() { d } else { DType::F64 })?;
            if !d.is_float() {
                let lf = self.cast(l, DType::F64)?;
                let p = self.emit("math.powf", &[lf.v, r.v], "f64")?;
                return self.saturating_int(p, out);
            }
            return self.binary(b, l, r, out);
        }
        let v = if d.is_float() {
            self.binary_float(b, l.v, r.v, self.f(d))?
        } else {
            self.binary_int(b, l.v, r.v, d)?
        };
        Ok(Scalar { v, dtype: out })
    }

    fn binary_float(
        &self,
        b: BinaryOp,
        x: Value<'c, 'a>,
        y: Value<'c, 'a>,
        t: &str,
    ) -> Result<Value<'c, 'a>> {
        let bin = |name: &str| self.emit(name, &[x, y], t);
        Ok(match b {
            BinaryOp::Add => bin("arith.addf")?,
            BinaryOp::Sub => bin("arith.subf")?,
            BinaryOp::Mul => bin("arith.mulf")?,
            BinaryOp::Div => bin("arith.divf")?,
            BinaryOp::Pow => bin("math.powf")?,
            BinaryOp::Max => bin("arith.maximumf")?,
            BinaryOp::Min => bin("arith.minimumf")?,
            BinaryOp::Mod { fmod: true } => bin("arith.remf")?,
            BinaryOp::Mod { fmod: false } => {
                // Python's %: the remainder takes the divisor's sign.
                let m = bin("arith.remf")?;
                let zero = self.constant(0.0, t)?;
                let nonzero = self.cmpf(CmpfPredicate::One, m, zero)?;
                let m_neg = self.cmpf(CmpfPredicate::Olt, m, zero)?;
                let y_neg = self.cmpf(CmpfPredicate::Olt, y, zero)?;
                let differ = self.emit("arith.xori", &[m_neg, y_neg], "i1")?;
                let fix = self.emit("arith.andi", &[nonzero, differ], "i1")?;
                let adj = self.emit("arith.addf", &[m, y], t)?;
                self.select(fix, adj, m, t)?
            }
            BinaryOp::PRelu => {
                let zero = self.constant(0.0, t)?;
                let ge = self.cmpf(CmpfPredicate::Oge, x, zero)?;
                let neg = bin("arith.mulf")?;
                self.select(ge, x, neg, t)?
            }
            BinaryOp::Equal => self.cmpf(CmpfPredicate::Oeq, x, y)?,
            BinaryOp::Less => self.cmpf(CmpfPredicate::Olt, x, y)?,
            BinaryOp::LessOrEqual => self.cmpf(CmpfPredicate::Ole, x, y)?,
            BinaryOp::Greater => self.cmpf(CmpfPredicate::Ogt, x, y)?,
            BinaryOp::GreaterOrEqual => self.cmpf(CmpfPredicate::Oge, x, y)?,
            other => return Err(err(format!("{} is not defined for floats", other.name()))),
        })
    }

    fn binary_int(
        &self,
        b: BinaryOp,
        x: Value<'c, 'a>,
        y: Value<'c, 'a>,
        d: DType,
    ) -> Result<Value<'c, 'a>> {
        let t = compute_type(d);
        let s = d.is_signed_int();
        let bin = |name: &str| self.emit(name, &[x, y], t);
        let pick = |signed: &'static str, unsigned: &'static str| if s { signed } else { unsigned };
        let pick_cmp =
            |signed: CmpiPredicate, unsigned: CmpiPredicate| if s { signed } else { unsigned };
        // x86 traps (SIGFPE) on a division by 0 and on MIN / -1: both divide by 1 instead. ONNX
        // leaves a division by zero undefined (the interpreter reports it as an error); a
        // division by -1 is a negation, wrapping as the reference's, and x % -1 is 0.
        let minus_one = || -> Result<Value<'c, 'a>> {
            let m = self.int_constant(-1, t)?;
            self.cmpi(CmpiPredicate::Eq, y, m)
        };
        let safe_divisor = || -> Result<Value<'c, 'a>> {
            let zero = self.int_constant(0, t)?;
            let one = self.int_constant(1, t)?;
            let is_zero = self.cmpi(CmpiPredicate::Eq, y, zero)?;
            let y = self.select(is_zero, one, y, t)?;
            if !s {
                return Ok(y);
            }
            let is_minus_one = minus_one()?;
            self.select(is_minus_one, one, y, t)
        };
        Ok(match b {
            BinaryOp::And if d == DType::Bool => self.emit("arith.andi", &[x, y], "i1")?,
            BinaryOp::Or if d == DType::Bool => self.emit("arith.ori", &[x, y], "i1")?,
            BinaryOp::Xor if d == DType::Bool => self.emit("arith.xori", &[x, y], "i1")?,
            BinaryOp::Equal => self.cmpi(CmpiPredicate::Eq, x, y)?,
            BinaryOp::Less => self.cmpi(pick_cmp(CmpiPredicate::Slt, CmpiPredicate::Ult), x, y)?,
            BinaryOp::LessOrEqual => {
                self.cmpi(pick_cmp(CmpiPredicate::Sle, CmpiPredicate::Ule), x, y)?
            }
            BinaryOp::Greater => {
                self.cmpi(pick_cmp(CmpiPredicate::Sgt, CmpiPredicate::Ugt), x, y)?
            }
            BinaryOp::GreaterOrEqual => {
                self.cmpi(pick_cmp(CmpiPredicate::Sge, CmpiPredicate::Uge), x, y)?
            }
            _ if d == DType::Bool => {
                return Err(err(format!("{} is not defined for bool", b.name())))
            }
            BinaryOp::Add => bin("arith.addi")?,
            BinaryOp::Sub => bin("arith.subi")?,
            BinaryOp::Mul => bin("arith.muli")?,
            BinaryOp::Div => {
                let q = self.emit(pick("arith.divsi", "arith.divui"), &[x, safe_divisor()?], t)?;
                if s {
                    let zero = self.int_constant(0, t)?;
                    let negated = self.emit("arith.subi", &[zero, x], t)?;
                    self.select(minus_one()?, negated, q, t)?
                } else {
                    q
                }
            }
            BinaryOp::Max => bin(pick("arith.maxsi", "arith.maxui"))?,
            BinaryOp::Min => bin(pick("arith.minsi", "arith.minui"))?,
            BinaryOp::Mod { fmod } => {
                let y = safe_divisor()?;
                let m = self.emit(pick("arith.remsi", "arith.remui"), &[x, y], t)?;
                if fmod || !s {
                    m
                } else {
                    let zero = self.int_constant(0, t)?;
                    let nonzero = self.cmpi(CmpiPredicate::Ne, m, zero)?;
                    let m_neg = self.cmpi(CmpiPredicate::Slt, m, zero)?;
                    let y_neg = self.cmpi(CmpiPredicate::Slt, y, zero)?;
                    let differ = self.emit("arith.xori", &[m_neg, y_neg], "i1")?;
                    let fix = self.emit("arith.andi", &[nonzero, differ], "i1")?;
                    let adj = self.emit("arith.addi", &[m, y], t)?;
                    self.select(fix, adj, m, t)?
                }
            }
            BinaryOp::Pow => {
                if s {
                    self.signed_pow(x, y, t)?
                } else {
                    // Wrapping, as the interpreter multiplies (a real power past the type's
                    // range would not convert back).
                    self.wrapping_pow(x, y, t)?
                }
            }
            BinaryOp::PRelu => {
                let zero = self.int_constant(0, t)?;
                let ge = self.cmpi(CmpiPredicate::Sge, x, zero)?;
                let neg = bin("arith.muli")?;
                self.select(ge, x, neg, t)?
            }
            BinaryOp::BitwiseAnd => bin("arith.andi")?,
            BinaryOp::BitwiseOr => bin("arith.ori")?,
            BinaryOp::BitwiseXor => bin("arith.xori")?,
            BinaryOp::BitShift { left } => {
                // Shifting by the width or more gives 0 (LLVM would give poison).
                let shifted = bin(if left { "arith.shli" } else { "arith.shrui" })?;
                let width = self.int_constant(bits(d) as i128, t)?;
                let too_far = self.cmpi(CmpiPredicate::Uge, y, width)?;
                let zero = self.int_constant(0, t)?;
                self.select(too_far, zero, shifted, t)?
            }
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                return Err(err(format!("{} needs bool operands", b.name())))
            }
        })
    }

    /// ONNX BitCast: `x`'s stored bits read as `to`, which is as wide (inference checks). The
    /// value goes through its storage form, so a bool is its byte and a half float its 16 bits.
    pub fn bitcast(&self, x: Scalar<'c, 'a>, to: DType) -> Result<Scalar<'c, 'a>> {
        let stored = self.store(x)?;
        let (from_ty, to_ty) = (storage_type(x.dtype), storage_type(to));
        let v =
            if from_ty == to_ty { stored } else { self.emit("arith.bitcast", &[stored], to_ty)? };
        self.load(v, to)
    }

    /// ONNX Cast between any two dtypes.
    pub fn cast(&self, x: Scalar<'c, 'a>, to: DType) -> Result<Scalar<'c, 'a>> {
        self.cast_with(x, to, true)
    }

    /// `cast`, with ONNX Cast's `saturate` for 8-bit float results.
    pub fn cast_with(
        &self,
        x: Scalar<'c, 'a>,
        to: DType,
        saturate: bool,
    ) -> Result<Scalar<'c, 'a>> {
        let from = x.dtype;
        if from == to {
            return Ok(x);
        }
        // A storage type's compute value is an f32 or a byte integer: cast from that.
        if from.is_storage() {
            return self.cast_with(Scalar { v: x.v, dtype: storage_compute(from) }, to, saturate);
        }
        if to.is_storage() {
            // Rounded (or wrapped) to the type and back, so what reads it in this kernel sees
            // what a store keeps. A 4- or 2-bit integer goes through i32, so a negative float
            // wraps into an unsigned one (-1 to 15) as the reference does: a float to unsigned
            // conversion of a negative value has no defined result (0 on NVIDIA GPUs).
            let wide = if storage_compute(to) == DType::F32 {
                self.cast(x, DType::F32)?
            } else {
                let i = self.cast(x, DType::I32)?;
                let byte = self.emit("arith.trunci", &[i.v], "i8")?;
                Scalar { v: byte, dtype: storage_compute(to) }
            };
            let code = self.encode_storage(wide.v, to, saturate, false)?;
            let v = self.decode_storage(code, to)?;
            return Ok(Scalar { v, dtype: to });
        }
        let (ft, tt) = (compute_type(from), compute_type(to));
        let v = if to == DType::Bool {
            if from.is_float() {
                let zero = self.constant(0.0, ft)?;
                self.cmpf(CmpfPredicate::Une, x.v, zero)?
            } else {
                let zero = self.int_constant(0, ft)?;
                self.cmpi(CmpiPredicate::Ne, x.v, zero)?
            }
        } else if from == DType::Bool {
            if to.is_float() {
                self.emit("arith.uitofp", &[x.v], tt)?
            } else {
                self.emit("arith.extui", &[x.v], tt)?
            }
        } else if from.is_float() && to.is_float() {
            if matches!(to, DType::F16 | DType::BF16) {
                // Computed in f32, but rounded to the half type here, so what reads the cast
                // in this kernel sees what a store would keep.
                let half = self.emit("arith.truncf", &[x.v], storage_type(to))?;
                self.emit("arith.extf", &[half], "f32")?
            } else {
                match (ft, tt) {
                    ("f32", "f64") => self.emit("arith.extf", &[x.v], "f64")?,
                    ("f64", "f32") => self.emit("arith.truncf", &[x.v], "f32")?,
                    _ => x.v,
                }
            }
        } else if from.is_float() {
            self.emit(if to.is_signed_int() { "arith.fptosi" } else { "arith.fptoui" }, &[x.v], tt)?
        } else if to.is_float() {
            self.emit(
                if from.is_signed_int() { "arith.sitofp" } else { "arith.uitofp" },
                &[x.v],
                tt,
            )?
        } else {
            let (fb, tb) = (bits(from), bits(to));
            if fb == tb {
                x.v
            } else if fb > tb {
                self.emit("arith.trunci", &[x.v], tt)?
            } else {
                self.emit(
                    if from.is_signed_int() { "arith.extsi" } else { "arith.extui" },
                    &[x.v],
                    tt,
                )?
            }
        };
        Ok(Scalar { v, dtype: to })
    }
}

impl<'c, 'a> ScalarBuilder<'c, 'a> {
    /// `x ^ y` of signed integers, wrapping, by squaring and multiplying over y's bits (every
    /// target: SPIR-V and NVVM have no `math.ipowi`). A negative y gives what truncating the
    /// real power does: 1 for x = 1, +-1 for x = -1, the type's maximum for x = 0 (+inf,
    /// saturated), else 0; as the interpreter computes it.
    fn signed_pow(&self, x: Value<'c, 'a>, y: Value<'c, 'a>, t: &str) -> Result<Value<'c, 'a>> {
        let bits = int_bits(t).ok_or_else(|| err(format!("`{t}` is not an integer type")))?;
        let one = self.int_constant(1, t)?;
        let acc = self.squarings(x, y, t, bits - 1)?;
        let zero = self.int_constant(0, t)?;
        let minus_one = self.int_constant(-1, t)?;
        let max = self.int_constant((1i128 << (bits - 1)) - 1, t)?;
        let is_zero = self.cmpi(CmpiPredicate::Eq, x, zero)?;
        let is_one = self.cmpi(CmpiPredicate::Eq, x, one)?;
        let is_minus_one = self.cmpi(CmpiPredicate::Eq, x, minus_one)?;
        let odd = self.emit("arith.andi", &[y, one], t)?;
        let odd = self.cmpi(CmpiPredicate::Ne, odd, zero)?;
        let sign = self.select(odd, minus_one, one, t)?;
        let fraction = self.select(is_minus_one, sign, zero, t)?;
        let fraction = self.select(is_one, one, fraction, t)?;
        let fraction = self.select(is_zero, max, fraction, t)?;
        let negative = self.cmpi(CmpiPredicate::Slt, y, zero)?;
        self.select(negative, fraction, acc, t)
    }
}

impl<'c, 'a> ScalarBuilder<'c, 'a> {
    /// An f64 truncated to the integer type `to`, clamped to its range and NaN to 0, as the
    /// interpreter converts (Rust's `as`): `fptosi` alone gives poison out of range.
    pub fn saturating_int(&self, x: Value<'c, 'a>, to: DType) -> Result<Scalar<'c, 'a>> {
        let t = compute_type(to);
        let bits = bits(to);
        let (lo, hi, convert) = if to.is_signed_int() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1, "arith.fptosi")
        } else {
            (0, (1i128 << bits) - 1, "arith.fptoui")
        };
        let v = self.emit(convert, &[x], t)?;
        // The bounds as f64 are exact powers of two (or 0): at or past them the conversion
        // would overflow.
        let above = self.cmpf(CmpfPredicate::Oge, x, self.constant((hi + 1) as f64, "f64")?)?;
        let below = self.cmpf(CmpfPredicate::Olt, x, self.constant(lo as f64, "f64")?)?;
        let nan = self.cmpf(CmpfPredicate::Uno, x, x)?;
        let v = self.select(above, self.int_constant(hi, t)?, v, t)?;
        let v = self.select(below, self.int_constant(lo, t)?, v, t)?;
        let v = self.select(nan, self.int_constant(0, t)?, v, t)?;
        Ok(Scalar { v, dtype: to })
    }
}

impl<'c, 'a> ScalarBuilder<'c, 'a> {
    /// `x ^ y` of unsigned integers, wrapping.
    fn wrapping_pow(&self, x: Value<'c, 'a>, y: Value<'c, 'a>, t: &str) -> Result<Value<'c, 'a>> {
        let bits = int_bits(t).ok_or_else(|| err(format!("`{t}` is not an integer type")))?;
        self.squarings(x, y, t, bits)
    }

    /// `x ^ y` over the low `bits` bits of y, wrapping: x squared once a bit, multiplied in
    /// where the bit is set.
    fn squarings(
        &self,
        x: Value<'c, 'a>,
        y: Value<'c, 'a>,
        t: &str,
        bits: u32,
    ) -> Result<Value<'c, 'a>> {
        let one = self.int_constant(1, t)?;
        let (mut acc, mut base) = (one, x);
        for i in 0..bits {
            let shift = self.int_constant(i as i128, t)?;
            let bit = self.emit("arith.shrui", &[y, shift], t)?;
            let bit = self.emit("arith.andi", &[bit, one], t)?;
            let set = self.cmpi(CmpiPredicate::Ne, bit, self.int_constant(0, t)?)?;
            let times = self.emit("arith.muli", &[acc, base], t)?;
            acc = self.select(set, times, acc, t)?;
            base = self.emit("arith.muli", &[base, base], t)?;
        }
        Ok(acc)
    }
}

/// The compute type's spelling, for bodies that build their own ops.
pub fn compute(d: DType) -> &'static str {
    compute_type(d)
}
