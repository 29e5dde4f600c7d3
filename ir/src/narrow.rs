//! Storage types: 8-bit floats (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), the 4-bit float E2M1,
//! and 4- and 2-bit integers. They hold values; arithmetic happens in a wider type, so each
//! converts to and from f64 here. A tensor keeps one element per byte: ONNX packs the 4- and
//! 2-bit types two or four to a byte, which `pack` and `unpack` undo at the file's edge.
//!
//! Conversions follow ONNX's reference (`ml_dtypes`): to a float format, round to nearest with
//! ties to the even code; out of range, saturate to the largest finite value, or without
//! `saturate` give infinity (E5M2) or NaN (the formats without one). To an integer, truncate
//! toward zero and wrap, as casts between integers do.

/// The element types, one byte each: the code (floats) or the value (integers).
macro_rules! storage_element {
    ($($name:ident($inner:ty)),*) => {$(
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        #[repr(transparent)]
        pub struct $name(pub $inner);
    )*};
}
storage_element!(
    F8E4M3FN(u8),
    F8E4M3FNUZ(u8),
    F8E5M2(u8),
    F8E5M2FNUZ(u8),
    F8E8M0(u8),
    F4E2M1(u8),
    I4(i8),
    U4(u8),
    I2(i8),
    U2(u8)
);

/// What a float format does at the top of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// IEEE-like: the top exponent holds infinities and NaNs (E5M2).
    Ieee,
    /// No infinity; the all-ones magnitude is NaN (E4M3FN).
    Fn,
    /// No infinity and no negative zero; the code `0x80` is NaN (the FNUZ formats).
    Fnuz,
    /// Neither infinity nor NaN (E2M1): NaN becomes negative zero, as `ml_dtypes` has it.
    Finite,
}

/// A small binary float: sign, `exp_bits` of exponent with `bias`, `man_bits` of mantissa.
#[derive(Clone, Copy, Debug)]
pub struct MiniFloat {
    pub exp_bits: u32,
    pub man_bits: u32,
    pub bias: i32,
    pub special: Special,
}

/// The format of an 8- or 4-bit float type (not E8M0, which is a bare exponent).
pub fn minifloat(d: crate::DType) -> Option<MiniFloat> {
    use crate::DType;
    Some(match d {
        DType::F8E4M3FN => E4M3FN,
        DType::F8E4M3FNUZ => E4M3FNUZ,
        DType::F8E5M2 => E5M2,
        DType::F8E5M2FNUZ => E5M2FNUZ,
        DType::F4E2M1 => E2M1,
        _ => return None,
    })
}

pub const E4M3FN: MiniFloat = MiniFloat { exp_bits: 4, man_bits: 3, bias: 7, special: Special::Fn };
pub const E4M3FNUZ: MiniFloat =
    MiniFloat { exp_bits: 4, man_bits: 3, bias: 8, special: Special::Fnuz };
pub const E5M2: MiniFloat =
    MiniFloat { exp_bits: 5, man_bits: 2, bias: 15, special: Special::Ieee };
pub const E5M2FNUZ: MiniFloat =
    MiniFloat { exp_bits: 5, man_bits: 2, bias: 16, special: Special::Fnuz };
pub const E2M1: MiniFloat =
    MiniFloat { exp_bits: 2, man_bits: 1, bias: 1, special: Special::Finite };

impl MiniFloat {
    pub fn bits(self) -> u32 {
        1 + self.exp_bits + self.man_bits
    }

    pub fn sign_bit(self) -> u8 {
        1 << (self.bits() - 1)
    }

    /// The code of the largest finite positive value.
    pub fn max_code(self) -> u8 {
        let magnitude = (1u32 << (self.bits() - 1)) - 1;
        (match self.special {
            Special::Ieee => magnitude - (1 << self.man_bits), // below the infinity
            Special::Fn => magnitude - 1,                      // below the NaN
            Special::Fnuz | Special::Finite => magnitude,
        }) as u8
    }

    /// The value of a non-negative code below the special ones.
    pub fn magnitude(self, code: u8) -> f64 {
        let e = (code as i32) >> self.man_bits;
        let m = (code as i32) & ((1 << self.man_bits) - 1);
        let scale = (1i64 << self.man_bits) as f64;
        if e == 0 {
            m as f64 / scale * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + m as f64 / scale) * 2f64.powi(e - self.bias)
        }
    }

    pub fn decode(self, code: u8) -> f64 {
        let sign = code & self.sign_bit() != 0;
        let mag = code & (self.sign_bit() - 1);
        match self.special {
            Special::Fnuz if code == self.sign_bit() => return f64::NAN,
            Special::Fn if mag == self.sign_bit() - 1 => return f64::NAN,
            Special::Ieee if mag > self.max_code() => {
                return if mag == self.max_code() + 1 {
                    if sign {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    }
                } else {
                    f64::NAN
                };
            }
            _ => {}
        }
        let v = self.magnitude(mag);
        if sign {
            -v
        } else {
            v
        }
    }

    /// The code NaN converts to.
    pub fn nan(self) -> u8 {
        match self.special {
            Special::Ieee | Special::Fn => self.sign_bit() - 1,
            Special::Fnuz => self.sign_bit(),
            Special::Finite => self.sign_bit(),
        }
    }

    pub fn encode(self, v: f64, saturate: bool) -> u8 {
        if v.is_nan() {
            return self.nan();
        }
        let sign = if v.is_sign_negative() { self.sign_bit() } else { 0 };
        let a = v.abs();
        let max = self.max_code();
        let overflow = |sign: u8| match self.special {
            _ if saturate => sign | max,
            Special::Ieee => sign | (max + 1),
            Special::Finite => sign | max,
            Special::Fn | Special::Fnuz => self.nan(),
        };
        if a.is_infinite() {
            return overflow(sign);
        }
        // The codes of non-negative values are in value order: find the two around `a`.
        let top = self.magnitude(max);
        let mag = if a >= top {
            // Past the largest finite value the next step would be one more ulp: a value that
            // rounds there overflows.
            let next = top + (top - self.magnitude(max - 1));
            let half = (top + next) / 2.0;
            if a < half || (a == half && max.is_multiple_of(2)) {
                max
            } else {
                return overflow(sign);
            }
        } else {
            let (mut lo, mut hi) = (0u8, max);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if self.magnitude(mid) <= a {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let (l, h) = (self.magnitude(lo), self.magnitude(hi));
            if a - l < h - a || (a - l == h - a && lo.is_multiple_of(2)) {
                lo
            } else {
                hi
            }
        };
        if mag == 0 && self.special == Special::Fnuz {
            return 0; // no negative zero
        }
        sign | mag
    }
}

/// The code of `v` in an 8-bit float type `to`, converted without saturating (out-of-range
/// values become infinity or NaN); `None` when `to` is not an 8-bit float.
pub fn encode_unsaturated(to: crate::DType, v: f64) -> Option<u8> {
    use crate::DType;
    Some(match to {
        DType::F8E4M3FN => E4M3FN.encode(v, false),
        DType::F8E4M3FNUZ => E4M3FNUZ.encode(v, false),
        DType::F8E5M2 => E5M2.encode(v, false),
        DType::F8E5M2FNUZ => E5M2FNUZ.encode(v, false),
        DType::F8E8M0 => encode_e8m0(v, false, RoundMode::Up),
        _ => return None,
    })
}

/// How a conversion to E8M0 rounds (ONNX Cast's `round_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundMode {
    Up,
    Down,
    Nearest,
}

/// E8M0: a power of two, `2^(code - 127)`; the code 255 is NaN. No sign, no zero.
pub fn decode_e8m0(code: u8) -> f64 {
    if code == 0xFF {
        f64::NAN
    } else {
        2f64.powi(code as i32 - 127)
    }
}

/// The exponent of the value as an f32 (sign dropped), rounded by `mode`; infinities and NaNs
/// give NaN, as ONNX's reference does.
pub fn encode_e8m0(v: f64, saturate: bool, mode: RoundMode) -> u8 {
    let bits = (v as f32).to_bits();
    let exponent = (bits >> 23) & 0xFF;
    if exponent == 0xFF {
        return 0xFF;
    }
    let fraction = bits & 0x7F_FFFF;
    let up = match mode {
        RoundMode::Down => false,
        RoundMode::Up => fraction != 0,
        RoundMode::Nearest => {
            let guard = bits & 0x40_0000 != 0;
            let rest = bits & 0x3F_FFFF != 0;
            guard && (rest || exponent > 0)
        }
    };
    if up && !(saturate && exponent == 0xFE) {
        (exponent + 1).min(0xFF) as u8
    } else {
        exponent as u8
    }
}

/// An integer of `bits` bits (signed or not) from any integer, wrapping.
pub fn wrap_int(v: i128, bits: u32, signed: bool) -> i16 {
    let m = 1i128 << bits;
    let u = v.rem_euclid(m);
    (if signed && u >= m / 2 { u - m } else { u }) as i16
}

/// Unpacks `count` elements of `bits` bits each (low bits first in each byte), sign-extended
/// when `signed`; one byte per element.
pub fn unpack(packed: &[u8], count: usize, bits: u32, signed: bool) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let mask = (1u8 << bits) - 1;
    (0..count)
        .map(|i| {
            let v = (packed[i / per] >> ((i % per) as u32 * bits)) & mask;
            if signed && v & (1 << (bits - 1)) != 0 {
                v | !mask
            } else {
                v
            }
        })
        .collect()
}

/// Packs one-byte elements `bits` bits each, low bits first.
pub fn pack(elements: &[u8], bits: u32) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let mask = (1u8 << bits) - 1;
    let mut out = vec![0u8; elements.len().div_ceil(per)];
    for (i, &e) in elements.iter().enumerate() {
        out[i / per] |= (e & mask) << ((i % per) as u32 * bits);
    }
    out
}

/// `x` as f32 rounded to odd: truncated toward zero, the last bit set where that was inexact.
/// Rounding this to any format of at most 22 significant bits (f16, bf16) gives what rounding
/// `x` to it directly would: no double rounding. (`half`'s own f64 conversions drop the low 32
/// bits before they round, so an f32 just above a tie, 0xbf4a8001, became the tie and went to
/// even, down.)
fn f32_round_to_odd(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) == x || !f.is_finite() {
        return f;
    }
    let mut bits = f.to_bits();
    if f64::from(f).abs() > x.abs() {
        // Rounded away from zero: one step back toward it (the magnitude is the low 31 bits).
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// f64 to bf16, to nearest with ties to even.
pub fn bf16_from_f64(x: f64) -> half::bf16 {
    half::bf16::from_f32(f32_round_to_odd(x))
}

/// f64 to f16, to nearest with ties to even.
pub fn f16_from_f64(x: f64) -> half::f16 {
    half::f16::from_f32(f32_round_to_odd(x))
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_and_bf16_round_every_bit_of_an_f64() {
        use half::{bf16, f16};
        // Just above a tie only in f32's last bits: up, not to even.
        assert_eq!(super::bf16_from_f64(f64::from(f32::from_bits(0xbf4a_8001))).to_bits(), 0xbf4b);
        assert_eq!(super::bf16_from_f64(f64::from(f32::from_bits(0x3f80_8000))).to_bits(), 0x3f80);
        assert_eq!(super::bf16_from_f64(f64::from(f32::from_bits(0x3f81_8000))).to_bits(), 0x3f82);
        // An f64 just above a tie below f32's precision.
        assert_eq!(super::bf16_from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-40)).to_bits(), 0x3f81);
        assert_eq!(super::f16_from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)).to_bits(), 0x3c01);
        assert_eq!(super::f16_from_f64(1.0 + 2f64.powi(-11)).to_bits(), 0x3c00);
        // Every f32 of a sweep of bit patterns agrees with half's f32 conversions (which see
        // every bit), specials and subnormals included.
        for i in 0..200_000u32 {
            let bits = i.wrapping_mul(2_654_435_761);
            let f = f32::from_bits(bits);
            let (b, h) = (super::bf16_from_f64(f64::from(f)), super::f16_from_f64(f64::from(f)));
            if f.is_nan() {
                assert!(b.is_nan() && h.is_nan());
            } else {
                assert_eq!(b.to_bits(), bf16::from_f32(f).to_bits(), "{bits:08x}");
                assert_eq!(h.to_bits(), f16::from_f32(f).to_bits(), "{bits:08x}");
            }
        }
        assert_eq!(super::bf16_from_f64(1e39).to_bits(), 0x7f80);
        assert_eq!(super::f16_from_f64(-1e6).to_bits(), 0xfc00);
    }

    use super::*;

    #[test]
    fn every_code_round_trips() {
        for f in [E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ] {
            for code in 0..=255u8 {
                let v = f.decode(code);
                if v.is_nan() {
                    continue;
                }
                assert_eq!(f.encode(v, false), code, "{f:?} code {code:#x} = {v}");
            }
        }
        for code in 0..16u8 {
            let v = E2M1.decode(code);
            assert_eq!(E2M1.encode(v, true), code, "E2M1 code {code:#x} = {v}");
        }
        // 2^-127 is an f32 subnormal: rounding up takes it to the next code.
        for code in 1..255u8 {
            assert_eq!(encode_e8m0(decode_e8m0(code), true, RoundMode::Up), code, "E8M0 {code}");
        }
        assert_eq!(encode_e8m0(decode_e8m0(0), true, RoundMode::Down), 0);
    }

    #[test]
    fn ranges_and_specials() {
        assert_eq!(E4M3FN.decode(E4M3FN.max_code()), 448.0);
        assert_eq!(E4M3FNUZ.decode(E4M3FNUZ.max_code()), 240.0);
        assert_eq!(E5M2.decode(E5M2.max_code()), 57344.0);
        assert_eq!(E5M2FNUZ.decode(E5M2FNUZ.max_code()), 57344.0);
        assert_eq!(E2M1.decode(E2M1.max_code()), 6.0);
        assert_eq!(E4M3FN.encode(1e6, true), 0x7E);
        assert!(E4M3FN.decode(E4M3FN.encode(1e6, false)).is_nan());
        assert_eq!(E5M2.decode(E5M2.encode(1e6, false)), f64::INFINITY);
        assert_eq!(E4M3FNUZ.encode(-0.0, true), 0);
        // Ties go to the even code: 0.25 is halfway between E2M1's 0 and 0.5, 3.5 between 3 and 4.
        assert_eq!(E2M1.decode(E2M1.encode(0.25, true)), 0.0);
        assert_eq!(E2M1.decode(E2M1.encode(-3.5, true)), -4.0);
        assert_eq!(wrap_int(-9, 4, true), 7);
        assert_eq!(wrap_int(-3, 2, false), 1);
        assert_eq!(unpack(&pack(&[0xF9, 7, 0x08], 4), 3, 4, true), vec![0xF9, 7, 0xF8]);
    }
}
