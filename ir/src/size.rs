//! Element counts and byte sizes of tensors: the one place dimensions are multiplied into a
//! size. Every tensor type a graph holds is checked here when it is made (inputs, constants,
//! inferred results; `Graph` does it), and every tensor when it is built from bytes, a file or
//! a proto, so products of a checked tensor's dimensions elsewhere (a row, a slice) cannot
//! overflow: they are at most its element count.

use crate::error::OpError;
use crate::{DType, Dim, TensorType};

/// The most bytes one tensor may hold: what a pointer offset can address.
pub const MAX_BYTES: usize = isize::MAX as usize;

/// The number of elements of `dims`, or `None` when it overflows.
pub fn numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The bytes of a tensor of `dims` and `dtype` (storage types one byte an element), or `None`
/// when that overflows or is more than [`MAX_BYTES`].
pub fn bytes(dims: &[usize], dtype: DType) -> Option<usize> {
    numel(dims)?.checked_mul(dtype.size()).filter(|&b| b <= MAX_BYTES)
}

/// `bytes`, or an error saying what is too large.
pub fn checked_bytes(dims: &[usize], dtype: DType) -> Result<usize, OpError> {
    bytes(dims, dtype)
        .ok_or_else(|| OpError::TooLarge { what: format!("{dtype}{}", crate::Shape::fixed(dims)) })
}

/// Checks a value's type: its known dimensions' product times its element size fits in
/// [`MAX_BYTES`] (symbols count as 1: a size bound later is checked again).
pub fn check_type(ty: &TensorType) -> Result<(), OpError> {
    if !ty.kind.ranked() {
        return Ok(());
    }
    let known: Vec<usize> = ty.shape.0.iter().filter_map(Dim::fixed).collect();
    match bytes(&known, ty.dtype) {
        Some(_) => Ok(()),
        None => Err(OpError::TooLarge { what: ty.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_overflow_are_none() {
        assert_eq!(numel(&[]), Some(1));
        assert_eq!(numel(&[2, 3, 0]), Some(0));
        assert_eq!(numel(&[1 << 32, 1 << 32]), None);
        assert_eq!(bytes(&[(1 << 62) + 1, 4], DType::U8), None);
        assert_eq!(bytes(&[1 << 61], DType::F32), None);
        assert_eq!(bytes(&[1 << 60], DType::F32), Some(1 << 62));
        let e = checked_bytes(&[1 << 40, 1 << 40], DType::F32).unwrap_err();
        assert_eq!(e, OpError::TooLarge { what: "f32[1099511627776,1099511627776]".into() });
    }
}
