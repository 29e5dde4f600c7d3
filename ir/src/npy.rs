//! NumPy `.npy` files (format 1.0/2.0/3.0, C order): read and write tensors of kiln's dtypes.

use std::path::Path;

use crate::{DType, IrError, Result, Tensor};

fn descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        // NumPy has no bfloat16, 8-bit or 4-bit floats, or 4- and 2-bit integers.
        DType::BF16
        | DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1
        | DType::I4
        | DType::U4
        | DType::I2
        | DType::U2 => return None,
        // Strings are not numpy arrays of fixed width in kiln.
        DType::String => return None,
    })
}

/// The type a tensor numpy has no type for is written as (values kept exactly): f32 for bf16 and
/// the 8- and 4-bit floats, i8 or u8 for the 4- and 2-bit integers. `None` when numpy has `d`.
pub fn widened(d: DType) -> Option<DType> {
    if descr(d).is_some() || d.is_string() {
        return None;
    }
    Some(match d {
        DType::I4 | DType::I2 => DType::I8,
        DType::U4 | DType::U2 => DType::U8,
        _ => DType::F32,
    })
}

fn dtype_of(descr: &str) -> Option<DType> {
    let d = descr.trim_start_matches(['<', '|', '=']);
    Some(match d {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        _ => return None,
    })
}

/// Serialises a tensor as `.npy` bytes.
pub fn encode(t: &Tensor) -> Result<Vec<u8>> {
    let descr = descr(t.dtype())
        .ok_or_else(|| IrError::Tensor(format!("{} has no .npy type", t.dtype())))?;
    let shape = match t.dims() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // The header ends with a newline, padded so the data starts on a 64-byte boundary.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.bytes().len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    Ok(out)
}

/// Why `.npy` bytes do not decode.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum NpyError {
    #[error("not a .npy file (no \\x93NUMPY magic)")]
    NotNpy,
    #[error("unsupported .npy version {0}")]
    Version(u8),
    #[error("truncated .npy header")]
    Truncated,
    #[error("the .npy header is not text")]
    NotText,
    /// The header lacks a field (`descr`, `shape`).
    #[error("the .npy header has no {0}")]
    NoField(&'static str),
    #[error("unsupported .npy element type {0}")]
    ElementType(String),
    #[error("big-endian .npy data is not supported")]
    BigEndian,
    #[error("Fortran-order .npy data is not supported (save it in C order)")]
    FortranOrder,
    #[error("bad .npy dimension `{0}`")]
    Dimension(String),
    /// The data's length is not what the header's type and shape need.
    #[error("the .npy data does not match its header: {0}")]
    Data(IrError),
}

/// Parses `.npy` bytes.
pub fn decode(bytes: &[u8]) -> std::result::Result<Tensor, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(NpyError::NotNpy);
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(NpyError::Version(v)),
    };
    let header = bytes.get(start..start + header_len).ok_or(NpyError::Truncated)?;
    let header = std::str::from_utf8(header).map_err(|_| NpyError::NotText)?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or(NpyError::NoField("descr"))?;
    let dtype = dtype_of(descr).ok_or_else(|| NpyError::ElementType(descr.into()))?;
    if descr.starts_with('>') {
        return Err(NpyError::BigEndian);
    }
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(NpyError::FortranOrder);
    }
    let shape = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or(NpyError::NoField("shape"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| NpyError::Dimension(s.into())))
        .collect::<std::result::Result<_, _>>()?;
    let data = &bytes[start + header_len..];
    Tensor::from_bytes(dtype, &dims, data).map_err(NpyError::Data)
}

pub fn read(path: &Path) -> Result<Tensor> {
    let bytes =
        std::fs::read(path).map_err(|e| IrError::Tensor(format!("{}: {e}", path.display())))?;
    decode(&bytes).map_err(|e| IrError::Tensor(format!("{}: {e}", path.display())))
}

pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    std::fs::write(path, encode(t)?)
        .map_err(|e| IrError::Tensor(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_npy_dtype() {
        for d in DType::ALL.into_iter().filter(|&d| descr(d).is_some()) {
            for dims in [vec![], vec![3], vec![2, 3]] {
                let t = Tensor::random(d, &dims, 1);
                let b = encode(&t).unwrap();
                assert_eq!(
                    (10 + u16::from_le_bytes([b[8], b[9]]) as usize) % 64,
                    0,
                    "data is 64-byte aligned"
                );
                assert_eq!(decode(&b).unwrap(), t);
            }
        }
    }

    #[test]
    fn types_numpy_lacks_are_named() {
        for d in [DType::BF16, DType::F8E4M3FN, DType::I4] {
            let e = encode(&Tensor::zeros(d, &[2])).unwrap_err().to_string();
            assert!(e.contains(&format!("{d} has no .npy type")), "{e}");
        }
    }

    #[test]
    fn reads_a_header_numpy_wrote() {
        // numpy.save of np.arange(3, dtype='<i8').
        let mut b =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"
                .to_vec();
        while b.len() < 127 {
            b.push(b' ');
        }
        b.push(b'\n');
        for v in 0i64..3 {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(decode(&b).unwrap(), Tensor::vector(&[0i64, 1, 2]));
        assert_eq!(decode(b"junk"), Err(NpyError::NotNpy));
        let e = decode(&b[..130]).unwrap_err();
        assert!(matches!(e, NpyError::Data(_)), "{e:?}");
        assert!(e.to_string().contains("does not match"), "{e}");
    }
}
