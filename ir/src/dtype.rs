//! Element types.

use std::fmt;

/// The element type of a tensor: ONNX's numeric types and `bool`, the storage types (8- and
/// 4-bit floats, 4- and 2-bit integers: see `narrow`), which hold values but are computed on in a
/// wider type, and `string` (ONNX's strings, held as text, not bytes: only the interpreter
/// computes on them; a compiled program leaves them to the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0,
    F4E2M1,
    I4,
    U4,
    I2,
    U2,
    String,
}

impl DType {
    /// The types held as bytes (every one but `String`): what a compiled buffer, a fuzzer or a
    /// test looping over element types can hold. `from_name` knows `string` too.
    pub const ALL: [DType; 23] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    /// Bytes per element in memory (`bool` is one byte, 0 or 1; the storage types one byte each,
    /// the 4- and 2-bit ones unpacked). A string counts as 8 (its handle; the text is extra):
    /// what memory estimates use, never a buffer's layout (`is_string` types have none).
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 | DType::String => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2 => 1,
        }
    }

    /// The storage types: they hold values, and kiln computes on them in a wider type.
    pub fn is_storage(self) -> bool {
        self.packed_bits().is_some() || self.is_float8()
    }

    /// The 8-bit floats.
    pub fn is_float8(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0
        )
    }

    /// Bits per element of the types ONNX packs several to a byte.
    pub fn packed_bits(self) -> Option<u32> {
        match self {
            DType::F4E2M1 | DType::I4 | DType::U4 => Some(4),
            DType::I2 | DType::U2 => Some(2),
            _ => None,
        }
    }

    /// The bits one element takes: its packed width, else its byte size's.
    pub fn bits(self) -> u32 {
        self.packed_bits().unwrap_or(self.size() as u32 * 8)
    }

    /// The values an integer type holds, as (least, greatest); `None` for the others.
    pub fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::I64 => (i64::MIN.into(), i64::MAX.into()),
            DType::U8 => (0, u8::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::U64 => (0, u64::MAX.into()),
            DType::I4 => (-8, 7),
            DType::U4 => (0, 15),
            DType::I2 => (-2, 1),
            DType::U2 => (0, 3),
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// Numeric types: everything but `bool` and `string` (the storage types included).
    pub fn is_numeric(self) -> bool {
        !matches!(self, DType::Bool | DType::String)
    }

    /// Strings: held as text, never as bytes; only the interpreter computes on them.
    pub fn is_string(self) -> bool {
        self == DType::String
    }

    /// The short name used in kiln's text form (`f32`, `i64`, `bool`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F8E8M0 => "f8e8m0",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
            DType::String => "string",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().chain([DType::String]).find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
