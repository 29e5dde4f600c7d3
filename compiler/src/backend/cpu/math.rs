//! Math without library calls: f32 `math.exp`, `math.tanh` and `math.erf` become polynomial approximations
//! in arith ops, and `math.powf` by a small integer constant becomes multiplications. LLVM turns the
//! math ops into libm calls one element at a time, which stops vectorised kernels (softmax,
//! GELU, sigmoid) at the call; arith ops stay in vector registers.
//!
//! exp: Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial, the exponent
//! put back in the bits), within about 1 ulp, inf above ln(FLT_MAX), 0 below ln(FLT_MIN)
//! (denormal results flush). tanh: the [13/6] rational approximation Eigen uses, within
//! 3e-7 absolute. Both keep NaN.

use melior::ir::attribute::Attribute;
use melior::ir::operation::OperationBuilder;
use melior::ir::{Identifier, Location, Type, Value};
use mlir_sys as ffi;

use crate::backend::edit::{self, RawOp};

fn raw_name(o: ffi::MlirOperation) -> String {
    RawOp(o).name()
}

/// Rewrites the math ops of `op`'s body (a function) in place.
pub fn expand(ctx: &melior::Context, func: ffi::MlirOperation) {
    let found: Vec<ffi::MlirOperation> = RawOp(func)
        .descendants()
        .into_iter()
        .filter(|o| {
            matches!(o.name().as_str(), "math.exp" | "math.tanh" | "math.erf" | "math.powf")
        })
        .map(|o| o.0)
        .collect();
    for o in found {
        // SAFETY: ops collected from live IR; each is replaced at most once.
        unsafe {
            let result = ffi::mlirOperationGetResult(o, 0);
            let ty = Type::from_raw(ffi::mlirValueGetType(result)).to_string();
            if !(ty == "f32" || ty.starts_with("vector<") && ty.ends_with("xf32>")) {
                continue;
            }
            let b = Builder { ctx, at: o, ty };
            let x = ffi::mlirOperationGetOperand(o, 0);
            let new = match raw_name(o).as_str() {
                "math.exp" => b.exp(x),
                "math.tanh" => b.tanh(x),
                "math.erf" => b.erf(x),
                _ => match constant_splat(ffi::mlirOperationGetOperand(o, 1)) {
                    Some(p) => b.powf(x, p),
                    None => None,
                },
            };
            if let Some(new) = new {
                ffi::mlirValueReplaceAllUsesOfWith(result, new);
                ffi::mlirOperationDestroy(o);
            }
        }
    }
}

/// The value of a splat float constant, seen through broadcasts and reads of constant tensors
/// (what vectorisation makes of a kernel's scalar constants).
fn constant_splat(v: ffi::MlirValue) -> Option<f64> {
    // SAFETY: accessors on live IR.
    unsafe {
        if !ffi::mlirValueIsAOpResult(v) {
            return None;
        }
        let def = ffi::mlirOpResultGetOwner(v);
        match raw_name(def).as_str() {
            // `dense<3.000000e+00> : vector<16xf32>` or `3.000000e+00 : f32`
            "arith.constant" => edit::float_attr(RawOp(def).attr("value")?),
            "vector.broadcast" | "vector.transfer_read" => {
                constant_splat(ffi::mlirOperationGetOperand(def, 0))
            }
            _ => None,
        }
    }
}

/// Builds ops before `at`, all of the float type `ty` (or its i32/i1 twin).
struct Builder<'c> {
    ctx: &'c melior::Context,
    at: ffi::MlirOperation,
    ty: String,
}

impl<'c> Builder<'c> {
    fn twin(&self, elem: &str) -> String {
        match self.ty.strip_suffix("f32>") {
            Some(head) => format!("{head}{elem}>"),
            None => elem.to_string(),
        }
    }

    fn op(
        &self,
        name: &str,
        operands: &[ffi::MlirValue],
        result: &str,
        attrs: &[(&str, &str)],
    ) -> Option<ffi::MlirValue> {
        let loc = Location::unknown(self.ctx);
        let t = Type::parse(self.ctx, result)?;
        // SAFETY: values of this context's live IR.
        let operands: Vec<Value> =
            operands.iter().map(|&v| unsafe { Value::from_raw(v) }).collect();
        let mut named = Vec::new();
        for (n, a) in attrs {
            named.push((Identifier::new(self.ctx, n), Attribute::parse(self.ctx, a)?));
        }
        let op = OperationBuilder::new(name, loc)
            .add_operands(&operands)
            .add_results(&[t])
            .add_attributes(&named)
            .build()
            .ok()?;
        // SAFETY: inserting a freshly built (owned) op before a live op of a block.
        unsafe {
            let raw = op.into_raw();
            ffi::mlirBlockInsertOwnedOperationBefore(
                ffi::mlirOperationGetBlock(self.at),
                self.at,
                raw,
            );
            Some(ffi::mlirOperationGetResult(raw, 0))
        }
    }

    fn f(&self, name: &str, operands: &[ffi::MlirValue]) -> Option<ffi::MlirValue> {
        self.op(name, operands, &self.ty.clone(), &[])
    }

    fn cst(&self, v: f64) -> Option<ffi::MlirValue> {
        let lit = if v.is_infinite() {
            "0x7F800000".to_string()
        } else {
            format!("{:.9e}", v as f32 as f64)
        };
        let attr = if self.ty == "f32" {
            format!("{lit} : f32")
        } else {
            format!("dense<{lit}> : {}", self.ty)
        };
        self.op("arith.constant", &[], &self.ty.clone(), &[("value", &attr)])
    }

    fn icst(&self, v: i32) -> Option<ffi::MlirValue> {
        let t = self.twin("i32");
        let attr =
            if self.ty == "f32" { format!("{v} : i32") } else { format!("dense<{v}> : {t}") };
        self.op("arith.constant", &[], &t, &[("value", &attr)])
    }

    /// `a * b + c`
    fn fma(
        &self,
        a: ffi::MlirValue,
        b: ffi::MlirValue,
        c: ffi::MlirValue,
    ) -> Option<ffi::MlirValue> {
        self.f("math.fma", &[a, b, c])
    }

    fn clamp(&self, x: ffi::MlirValue, lo: f64, hi: f64) -> Option<ffi::MlirValue> {
        let lo = self.cst(lo)?;
        let hi = self.cst(hi)?;
        let m = self.f("arith.maximumf", &[x, lo])?;
        self.f("arith.minimumf", &[m, hi])
    }

    /// A polynomial in `x` by Horner's rule, highest coefficient first.
    fn horner(&self, x: ffi::MlirValue, coefficients: &[f64]) -> Option<ffi::MlirValue> {
        let mut p = self.cst(coefficients[0])?;
        for &c in &coefficients[1..] {
            let c = self.cst(c)?;
            p = self.fma(p, x, c)?;
        }
        Some(p)
    }

    fn exp(&self, x: ffi::MlirValue) -> Option<ffi::MlirValue> {
        // ln(FLT_MAX) and ln(FLT_MIN): results stay normal, 2^(n-1) stays a normal float.
        const HI: f64 = 88.72283;
        let xc = self.clamp(x, -87.33654, HI)?;
        let (log2e, half) = (self.cst(std::f64::consts::LOG2_E)?, self.cst(0.5)?);
        let t = self.fma(xc, log2e, half)?;
        let n = self.f("math.floor", &[t])?;
        // r = x - n ln 2, ln 2 in a part exact in f32 and a correction.
        let (c1, c2) = (self.cst(-0.693359375)?, self.cst(2.12194440e-4)?);
        let r = self.fma(n, c1, xc)?;
        let r = self.fma(n, c2, r)?;
        let p = self.horner(
            r,
            &[
                1.9875691500e-4,
                1.3981999507e-3,
                8.3334519073e-3,
                4.1665795894e-2,
                1.6666665459e-1,
                5.0000001201e-1,
            ],
        )?;
        let r2 = self.f("arith.mulf", &[r, r])?;
        let y = self.fma(p, r2, r)?;
        let one = self.cst(1.0)?;
        let y = self.f("arith.addf", &[y, one])?;
        // 2^(n-1) from its bits, then times 2: n reaches 128 at the top of the range.
        let ni = self.op("arith.fptosi", &[n], &self.twin("i32"), &[])?;
        let bias = self.icst(126)?;
        let e = self.op("arith.addi", &[ni, bias], &self.twin("i32"), &[])?;
        let shift = self.icst(23)?;
        let bits = self.op("arith.shli", &[e, shift], &self.twin("i32"), &[])?;
        let scale = self.op("arith.bitcast", &[bits], &self.ty.clone(), &[])?;
        let y = self.f("arith.mulf", &[y, scale])?;
        let two = self.cst(2.0)?;
        let y = self.f("arith.mulf", &[y, two])?;
        // Above the range: inf. NaN stays NaN (the clamp and the arithmetic keep it).
        let hi = self.cst(HI)?;
        let over =
            self.op("arith.cmpf", &[x, hi], &self.twin("i1"), &[("predicate", "2 : i64")])?;
        let inf = self.cst(f64::INFINITY)?;
        self.op("arith.select", &[over, inf, y], &self.ty.clone(), &[])
    }

    fn tanh(&self, x: ffi::MlirValue) -> Option<ffi::MlirValue> {
        let xc = self.clamp(x, -7.905_311_107_635_498, 7.905_311_107_635_498)?;
        let x2 = self.f("arith.mulf", &[xc, xc])?;
        let p = self.horner(
            x2,
            &[
                -2.76076847742355e-16,
                2.00018790482477e-13,
                -8.60467152213735e-11,
                5.12229709037114e-08,
                1.48572235717979e-05,
                6.37261928875436e-04,
                4.89352455891786e-03,
            ],
        )?;
        let p = self.f("arith.mulf", &[xc, p])?;
        let q = self.horner(
            x2,
            &[
                1.19825839466702e-06,
                1.18534705686654e-04,
                2.26843463243900e-03,
                4.89352518554385e-03,
            ],
        )?;
        let y = self.f("arith.divf", &[p, q])?;
        // Tiny inputs: tanh x = x (and -0 stays -0).
        let ax = self.f("math.absf", &[x])?;
        let tiny = self.cst(0.0004)?;
        let small =
            self.op("arith.cmpf", &[ax, tiny], &self.twin("i1"), &[("predicate", "4 : i64")])?;
        self.op("arith.select", &[small, x, y], &self.ty.clone(), &[])
    }

    /// erf: below 0.5 in magnitude its Taylor series to x^11 (error under 2e-9); above,
    /// Abramowitz and Stegun 7.1.26, 1 - t P(t) exp(-x^2) with t = 1 / (1 + 0.3275911 |x|) (error
    /// under 1.5e-7), with the sign of x. Measured against libm over [-6, 6]: 1.4e-7 absolute,
    /// 2.7e-7 relative. NaN stays NaN.
    fn erf(&self, x: ffi::MlirValue) -> Option<ffi::MlirValue> {
        let k = 2.0 / std::f64::consts::PI.sqrt();
        let x2 = self.f("arith.mulf", &[x, x])?;
        let series =
            self.horner(x2, &[-k / 1320.0, k / 216.0, -k / 42.0, k / 10.0, -k / 3.0, k])?;
        let small = self.f("arith.mulf", &[x, series])?;
        let ax = self.f("math.absf", &[x])?;
        let (p, one) = (self.cst(0.3275911)?, self.cst(1.0)?);
        let d = self.fma(p, ax, one)?;
        let t = self.f("arith.divf", &[one, d])?;
        let poly =
            self.horner(t, &[1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592])?;
        let pt = self.f("arith.mulf", &[poly, t])?;
        let neg = self.f("arith.negf", &[x2])?;
        let e = self.exp(neg)?;
        let tail = self.f("arith.mulf", &[pt, e])?;
        let big = self.f("arith.subf", &[one, tail])?;
        let big = self.f("math.copysign", &[big, x])?;
        let half = self.cst(0.5)?;
        let near =
            self.op("arith.cmpf", &[ax, half], &self.twin("i1"), &[("predicate", "4 : i64")])?;
        self.op("arith.select", &[near, small, big], &self.ty.clone(), &[])
    }

    fn powf(&self, x: ffi::MlirValue, p: f64) -> Option<ffi::MlirValue> {
        match p {
            1.0 => Some(x),
            2.0 => self.f("arith.mulf", &[x, x]),
            3.0 => {
                let x2 = self.f("arith.mulf", &[x, x])?;
                self.f("arith.mulf", &[x2, x])
            }
            4.0 => {
                let x2 = self.f("arith.mulf", &[x, x])?;
                self.f("arith.mulf", &[x2, x2])
            }
            _ => None,
        }
    }
}
