//! The storage types in kernels (8- and 4-bit floats, 4- and 2-bit integers; see
//! `kiln_ir::narrow`). A tensor holds one byte an element: a float's code, an integer's value
//! (sign-extended). Kernels compute in f32 (floats) or i8 (integers): `decode` and `encode`
//! convert at loads, stores and casts, with integer arithmetic on the f32's bits, the same on
//! every target. Encoding rounds to nearest with ties to even, as the interpreter does.

use kiln_ir::narrow::{self, MiniFloat, Special};
use kiln_ir::DType;
use melior::ir::Value;

use super::scalar::ScalarBuilder;
use crate::Result;

type V<'c, 'a> = Value<'c, 'a>;

impl<'c, 'a> ScalarBuilder<'c, 'a> {
    fn i32c(&self, v: i64) -> Result<V<'c, 'a>> {
        self.int_constant(v as i128, "i32")
    }

    fn op2(&self, name: &str, a: V<'c, 'a>, b: V<'c, 'a>, ty: &str) -> Result<V<'c, 'a>> {
        self.emit(name, &[a, b], ty)
    }

    /// `a op constant`, in i32.
    fn opc(&self, name: &str, a: V<'c, 'a>, c: i64) -> Result<V<'c, 'a>> {
        let c = self.i32c(c)?;
        self.op2(name, a, c, "i32")
    }

    fn eq_c(&self, a: V<'c, 'a>, c: i64) -> Result<V<'c, 'a>> {
        let c = self.i32c(c)?;
        self.cmpi(melior::dialect::arith::CmpiPredicate::Eq, a, c)
    }

    /// A storage type's byte (i8) to its compute value: f32 for the floats, i8 for the integers.
    pub fn decode_storage(&self, v: V<'c, 'a>, d: DType) -> Result<V<'c, 'a>> {
        if d.packed_bits().is_some() && narrow::minifloat(d).is_none() {
            return Ok(v); // 4- and 2-bit integers: the byte is the value
        }
        let c = self.emit("arith.extui", &[v], "i32")?;
        if d == DType::F8E8M0 {
            // 2^(c - 127): the code is the f32's exponent field; 0 is the f32 subnormal 2^-127.
            let bits = self.opc("arith.shli", c, 23)?;
            let normal = self.emit("arith.bitcast", &[bits], "f32")?;
            let tiny = self.i32c(0x0040_0000)?;
            let tiny = self.emit("arith.bitcast", &[tiny], "f32")?;
            let zero = self.eq_c(c, 0)?;
            let v = self.select(zero, tiny, normal, "f32")?;
            let nan = self.constant(f64::NAN, "f32")?;
            let is_nan = self.eq_c(c, 0xFF)?;
            return self.select(is_nan, nan, v, "f32");
        }
        let f = narrow::minifloat(d).expect("an 8- or 4-bit float");
        let (e_bits, m_bits) = (f.exp_bits as i64, f.man_bits as i64);
        let mag = self.opc("arith.andi", c, (1 << (e_bits + m_bits)) - 1)?;
        let e = self.opc("arith.shrui", mag, m_bits)?;
        let m = self.opc("arith.andi", mag, (1 << m_bits) - 1)?;
        // Normal: the magnitude's bits moved into an f32 and its exponent rebiased.
        let shifted = self.opc("arith.shli", mag, 23 - m_bits)?;
        let bits = self.opc("arith.addi", shifted, (127 - f.bias as i64) << 23)?;
        let normal = self.emit("arith.bitcast", &[bits], "f32")?;
        // Subnormal: m * 2^(1 - bias - m_bits).
        let mf = self.emit("arith.uitofp", &[m], "f32")?;
        let quantum = self.constant(2f64.powi(1 - f.bias - m_bits as i32), "f32")?;
        let sub = self.op2("arith.mulf", mf, quantum, "f32")?;
        let is_sub = self.eq_c(e, 0)?;
        let mut v = self.select(is_sub, sub, normal, "f32")?;
        let nan = self.constant(f64::NAN, "f32")?;
        match f.special {
            Special::Ieee => {
                let top = self.eq_c(e, (1 << e_bits) - 1)?;
                let inf = self.constant(f64::INFINITY, "f32")?;
                let m0 = self.eq_c(m, 0)?;
                let special = self.select(m0, inf, nan, "f32")?;
                v = self.select(top, special, v, "f32")?;
            }
            Special::Fn => {
                let all = self.eq_c(mag, (1 << (e_bits + m_bits)) - 1)?;
                v = self.select(all, nan, v, "f32")?;
            }
            Special::Fnuz | Special::Finite => {}
        }
        let sign = self.opc("arith.shrui", c, e_bits + m_bits)?;
        let negative = self.eq_c(sign, 1)?;
        let neg = self.emit("arith.negf", &[v], "f32")?;
        v = self.select(negative, neg, v, "f32")?;
        if f.special == Special::Fnuz {
            let is_nan = self.eq_c(c, f.sign_bit() as i64)?;
            v = self.select(is_nan, nan, v, "f32")?;
        }
        Ok(v)
    }

    /// A compute value to a storage type's byte. Floats: an f32, rounded to nearest even;
    /// finite values past the largest saturate to it when `saturate`, else become infinity or
    /// NaN, as infinities do (saturating, they become the largest value too). Integers: an i8
    /// wrapped to the type's bits. `exact`: the value is one `decode_storage` gave (a store
    /// after a cast), so E8M0 takes its exponent as it is: its smallest value, 2^-127, is an
    /// f32 subnormal that rounding up would move.
    pub fn encode_storage(
        &self,
        v: V<'c, 'a>,
        d: DType,
        saturate: bool,
        exact: bool,
    ) -> Result<V<'c, 'a>> {
        if let (Some(bits), None) = (d.packed_bits(), narrow::minifloat(d)) {
            let unused = self.int_constant(8 - bits as i128, "i8")?;
            if matches!(d, DType::I4 | DType::I2) {
                let up = self.op2("arith.shli", v, unused, "i8")?;
                return self.op2("arith.shrsi", up, unused, "i8");
            }
            let mask = self.int_constant((1 << bits) - 1, "i8")?;
            return self.op2("arith.andi", v, mask, "i8");
        }
        let bits = self.emit("arith.bitcast", &[v], "i32")?;
        if d == DType::F8E8M0 {
            // The exponent field, rounded up when a fraction is left; infinities and NaNs are
            // NaN (255). Saturating, the largest exponent does not round up into NaN.
            let e = self.opc("arith.shrui", bits, 23)?;
            let e = self.opc("arith.andi", e, 0xFF)?;
            let frac = self.opc("arith.andi", bits, 0x7F_FFFF)?;
            let zero = self.i32c(0)?;
            let has_frac = self.cmpi(melior::dialect::arith::CmpiPredicate::Ne, frac, zero)?;
            let up = self.emit("arith.extui", &[has_frac], "i32")?;
            let up = if exact {
                zero
            } else if saturate {
                let at_top = self.eq_c(e, 0xFE)?;
                self.select(at_top, zero, up, "i32")?
            } else {
                up
            };
            let code = self.op2("arith.addi", e, up, "i32")?;
            let special = self.eq_c(e, 0xFF)?;
            let nan = self.i32c(0xFF)?;
            let code = self.select(special, nan, code, "i32")?;
            return self.emit("arith.trunci", &[code], "i8");
        }
        let f = narrow::minifloat(d).expect("an 8- or 4-bit float");
        self.encode_minifloat(bits, f, saturate)
    }

    fn encode_minifloat(&self, bits: V<'c, 'a>, f: MiniFloat, saturate: bool) -> Result<V<'c, 'a>> {
        use melior::dialect::arith::CmpiPredicate;
        let m_bits = f.man_bits as i64;
        let bias = f.bias as i64;
        let sign = self.opc("arith.shrui", bits, 31)?;
        let a = self.opc("arith.andi", bits, 0x7FFF_FFFF)?;
        let e32 = self.opc("arith.shrui", a, 23)?;
        // Normal results: the f32's bits rebiased, rounded at the kept mantissa's last bit (a
        // carry moves into the exponent, as it should).
        let shift = 23 - m_bits;
        let t = self.opc("arith.subi", a, (127 - bias) << 23)?;
        let lsb = self.opc("arith.shrui", t, shift)?;
        let lsb = self.opc("arith.andi", lsb, 1)?;
        let t = self.opc("arith.addi", t, (1 << (shift - 1)) - 1)?;
        let t = self.op2("arith.addi", t, lsb, "i32")?;
        let normal = self.opc("arith.shrui", t, shift)?;
        // Subnormal results: the f32's mantissa with its leading one, shifted further by how far
        // the exponent is below the format's smallest (at most 31: nothing is left by then).
        let mant = self.opc("arith.andi", a, 0x7F_FFFF)?;
        let mant = self.opc("arith.ori", mant, 0x80_0000)?;
        let base = self.i32c(shift + 1 + 127 - bias)?;
        let sh = self.op2("arith.subi", base, e32, "i32")?;
        let cap = self.i32c(31)?;
        let sh = self.op2("arith.minui", sh, cap, "i32")?;
        let one = self.i32c(1)?;
        let sh1 = self.op2("arith.subi", sh, one, "i32")?;
        let half = self.op2("arith.shli", one, sh1, "i32")?;
        let half_less = self.op2("arith.subi", half, one, "i32")?;
        let lsb_s = self.op2("arith.shrui", mant, sh, "i32")?;
        let lsb_s = self.opc("arith.andi", lsb_s, 1)?;
        let s = self.op2("arith.addi", mant, half_less, "i32")?;
        let s = self.op2("arith.addi", s, lsb_s, "i32")?;
        let sub = self.op2("arith.shrui", s, sh, "i32")?;
        let min_normal = self.i32c(127 - bias + 1)?;
        let is_normal = self.cmpi(CmpiPredicate::Sge, e32, min_normal)?;
        let mag = self.select(is_normal, normal, sub, "i32")?;
        // Past the largest finite code (infinity included).
        let max = f.max_code() as i64;
        let max_c = self.i32c(max)?;
        let over = self.cmpi(CmpiPredicate::Ugt, mag, max_c)?;
        let over_code = match f.special {
            _ if saturate => max,
            Special::Ieee => max + 1,
            Special::Finite => max,
            Special::Fn | Special::Fnuz => f.nan() as i64,
        };
        let over_code = self.i32c(over_code)?;
        let mag = self.select(over, over_code, mag, "i32")?;
        let signed = self.opc("arith.shli", sign, f.bits() as i64 - 1)?;
        let mut code = self.op2("arith.ori", mag, signed, "i32")?;
        if f.special == Special::Fnuz {
            // No negative zero; and the overflow NaN keeps its one code.
            let zero = self.eq_c(mag, 0)?;
            let z = self.i32c(0)?;
            code = self.select(zero, z, code, "i32")?;
            if !saturate {
                let nan = self.i32c(f.nan() as i64)?;
                code = self.select(over, nan, code, "i32")?;
            }
        }
        let nan_bits = self.i32c(0x7F80_0000)?;
        let is_nan = self.cmpi(CmpiPredicate::Ugt, a, nan_bits)?;
        let nan = self.i32c(f.nan() as i64)?;
        let code = self.select(is_nan, nan, code, "i32")?;
        self.emit("arith.trunci", &[code], "i8")
    }
}
