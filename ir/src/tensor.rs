//! Tensors: a type plus shared, immutable bytes. Cloning a tensor shares its data (weights are never
//! copied per pass); typed views borrow it.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::{narrow, DType, IrError, Shape, TensorType};

/// A Rust type that can be a tensor element.
///
/// Sealed: implemented for the numeric types of [`DType`] and `bool`. Every bit pattern of the
/// numeric types is valid; `bool` tensors are kept normalised to bytes 0/1 (and 4- and 2-bit
/// integers sign-extended or masked) on construction, so a
/// typed view is always sound.
pub trait Element: Copy + Send + Sync + fmt::Debug + PartialEq + 'static + sealed::Sealed {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Converts with `as`-cast semantics (saturating float-to-int, NaN to 0).
    fn from_f64(v: f64) -> Self;
    /// The value as an integer, exactly, for integer and bool types; `None` for floats.
    fn to_i128(self) -> Option<i128>;
    /// Converts with wrap-around for integers (C and numpy semantics).
    fn from_i128(v: i128) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! float_element {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            fn to_i128(self) -> Option<i128> {
                None
            }
            fn from_i128(v: i128) -> Self {
                Self::from_f64(v as f64)
            }
        }
    };
}

float_element!(f32, F32, |x: f32| x as f64, |v: f64| v as f32);
float_element!(f64, F64, |x: f64| x, |v: f64| v);
float_element!(f16, F16, |x: f16| x.to_f64(), crate::narrow::f16_from_f64);
float_element!(bf16, BF16, |x: bf16| x.to_f64(), crate::narrow::bf16_from_f64);

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_i128(self) -> Option<i128> {
                Some(self as i128)
            }
            fn from_i128(v: i128) -> Self {
                v as $t
            }
        }
    };
}

int_element!(i8, I8);
int_element!(i16, I16);
int_element!(i32, I32);
int_element!(i64, I64);
int_element!(u8, U8);
int_element!(u16, U16);
int_element!(u32, U32);
int_element!(u64, U64);

macro_rules! minifloat_element {
    ($t:ident, $format:expr) => {
        impl sealed::Sealed for narrow::$t {}
        impl Element for narrow::$t {
            const DTYPE: DType = DType::$t;
            fn to_f64(self) -> f64 {
                $format.decode(self.0)
            }
            /// Saturating, as ONNX's Cast is by default.
            fn from_f64(v: f64) -> Self {
                narrow::$t($format.encode(v, true))
            }
            fn to_i128(self) -> Option<i128> {
                None
            }
            fn from_i128(v: i128) -> Self {
                Self::from_f64(v as f64)
            }
        }
    };
}

minifloat_element!(F8E4M3FN, narrow::E4M3FN);
minifloat_element!(F8E4M3FNUZ, narrow::E4M3FNUZ);
minifloat_element!(F8E5M2, narrow::E5M2);
minifloat_element!(F8E5M2FNUZ, narrow::E5M2FNUZ);
minifloat_element!(F4E2M1, narrow::E2M1);

impl sealed::Sealed for narrow::F8E8M0 {}
impl Element for narrow::F8E8M0 {
    const DTYPE: DType = DType::F8E8M0;
    fn to_f64(self) -> f64 {
        narrow::decode_e8m0(self.0)
    }
    /// Saturating and rounding up, ONNX Cast's defaults.
    fn from_f64(v: f64) -> Self {
        narrow::F8E8M0(narrow::encode_e8m0(v, true, narrow::RoundMode::Up))
    }
    fn to_i128(self) -> Option<i128> {
        None
    }
    fn from_i128(v: i128) -> Self {
        Self::from_f64(v as f64)
    }
}

macro_rules! narrow_int_element {
    ($t:ident, $inner:ty, $bits:expr, $signed:expr) => {
        impl sealed::Sealed for narrow::$t {}
        impl Element for narrow::$t {
            const DTYPE: DType = DType::$t;
            fn to_f64(self) -> f64 {
                self.0 as f64
            }
            /// Truncated toward zero, then wrapped, as the reference casts.
            fn from_f64(v: f64) -> Self {
                Self::from_i128(v as i64 as i128)
            }
            fn to_i128(self) -> Option<i128> {
                Some(self.0 as i128)
            }
            fn from_i128(v: i128) -> Self {
                narrow::$t(narrow::wrap_int(v, $bits, $signed) as $inner)
            }
        }
    };
}

narrow_int_element!(I4, i8, 4, true);
narrow_int_element!(U4, u8, 4, false);
narrow_int_element!(I2, i8, 2, true);
narrow_int_element!(U2, u8, 2, false);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i128(self) -> Option<i128> {
        Some(self as i128)
    }
    fn from_i128(v: i128) -> Self {
        v != 0
    }
}

/// Immutable bytes with 8-byte alignment (enough for every element type), shared by reference
/// count: kiln's own words, or memory another owner keeps alive (a caller's array, not copied);
/// or a string tensor's text, which has no byte form.
#[derive(Clone)]
enum Storage {
    Words { words: Arc<[u64]>, len: usize },
    External(Arc<External>),
    Strings(Arc<[String]>),
}

/// Bytes that `owner` keeps alive and unchanged (see [`Tensor::from_external`]).
struct External {
    ptr: *const u8,
    len: usize,
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the bytes are immutable while any tensor over them lives (the contract of
// `Tensor::from_external`), and the owner is Send + Sync.
unsafe impl Send for External {}
unsafe impl Sync for External {}

impl Storage {
    fn from_bytes(bytes: &[u8]) -> Storage {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Storage::Words { words: words.into(), len: bytes.len() }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Words { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
            // SAFETY: `from_external`'s contract: `len` readable bytes at `ptr` while the owner lives.
            Storage::External(e) => unsafe { std::slice::from_raw_parts(e.ptr, e.len) },
            // Strings have no bytes: callers that need bytes check the dtype first, and an
            // empty slice reads as no data rather than as garbage.
            Storage::Strings(_) => &[],
        }
    }
}

/// A tensor with concrete dimensions and row-major (C order) data.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    dims: Vec<usize>,
    data: Storage,
}

impl Tensor {
    /// A tensor over memory someone else owns (a caller's array), without copying: `owner` is
    /// kept alive as long as any tensor over the bytes. `None` when `ptr` is not 8-byte aligned,
    /// the length does not match the type, or the bytes are not in kiln's form (bools other than
    /// 0 and 1, 4- and 2-bit integers not sign-extended): copy them with `from_bytes` then.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that stay valid and unchanged while `owner`
    /// lives.
    pub unsafe fn from_external(
        dtype: DType,
        dims: &[usize],
        ptr: *const u8,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Option<Tensor> {
        if dtype.is_string() {
            return None;
        }
        let want = dims.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d))?;
        if len != want || !(ptr as usize).is_multiple_of(8) || ptr.is_null() {
            return None;
        }
        // SAFETY: the caller's contract: `len` readable bytes at `ptr`.
        if normalised(dtype, unsafe { std::slice::from_raw_parts(ptr, len) }).is_some() {
            return None; // bytes to normalise: copy them with `from_bytes`
        }
        Some(Tensor {
            dtype,
            dims: dims.to_vec(),
            data: Storage::External(Arc::new(External { ptr, len, _owner: owner })),
        })
    }

    /// A tensor over shared words (little-endian bytes, at least as many as the type needs): no
    /// copy. The runtime hands out its output buffers this way and reuses one once every tensor
    /// over it is dropped. Bools other than 0 and 1 are normalised (copied).
    pub fn from_shared_words(
        dtype: DType,
        dims: &[usize],
        words: Arc<[u64]>,
    ) -> Result<Tensor, IrError> {
        no_bytes_for_strings(dtype)?;
        let want =
            crate::size::checked_bytes(dims, dtype).map_err(|e| IrError::Tensor(e.to_string()))?;
        if words.len().saturating_mul(8) < want {
            return Err(IrError::Tensor(format!(
                "{dtype}{} needs {want} bytes, got {}",
                Shape::fixed(dims),
                words.len() * 8
            )));
        }
        let t = Tensor { dtype, dims: dims.to_vec(), data: Storage::Words { words, len: want } };
        if let Some(norm) = normalised(dtype, t.data.bytes()) {
            // A copy: the words are shared.
            return Ok(Tensor { data: Storage::from_bytes(&norm), ..t });
        }
        Ok(t)
    }

    /// The tensor with `axis` resized to `size`: its first positions kept, zeros after them when
    /// it grows (a padded axis filled, or cut back to its valid length).
    pub fn resize_axis(&self, axis: usize, size: usize) -> Result<Tensor, IrError> {
        no_bytes_for_strings(self.dtype)?;
        let d = &self.dims;
        if axis >= d.len() {
            return Err(IrError::Tensor(format!("no axis {axis} in {}", self.ty())));
        }
        let inner = d[axis + 1..].iter().product::<usize>() * self.dtype.size();
        let (from, to) = (d[axis] * inner, size * inner);
        let keep = from.min(to);
        let outer = d[..axis].iter().product::<usize>();
        // Written as words, so the result shares them without another copy.
        let mut words = vec![0u64; (outer * to).div_ceil(8)];
        let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..outer * to];
        let bytes = self.bytes();
        for o in 0..outer {
            out[o * to..o * to + keep].copy_from_slice(&bytes[o * from..o * from + keep]);
        }
        let mut dims = d.clone();
        dims[axis] = size;
        Tensor::from_shared_words(self.dtype, &dims, words.into())
    }

    /// The tensor at position `i` of `axis`, that axis removed (a Scan's slice of one step).
    pub fn index_axis(&self, axis: usize, i: usize) -> Result<Tensor, IrError> {
        no_bytes_for_strings(self.dtype)?;
        let d = &self.dims;
        if axis >= d.len() || i >= d[axis] {
            return Err(IrError::Tensor(format!(
                "no position {i} on axis {axis} of {}",
                self.ty()
            )));
        }
        let inner = d[axis + 1..].iter().product::<usize>() * self.dtype.size();
        let step = d[axis] * inner;
        let bytes = self.bytes();
        let mut out = Vec::with_capacity(bytes.len() / d[axis].max(1));
        for o in 0..d[..axis].iter().product::<usize>() {
            out.extend_from_slice(&bytes[o * step + i * inner..o * step + (i + 1) * inner]);
        }
        let mut dims = d.clone();
        dims.remove(axis);
        Tensor::from_bytes(self.dtype, &dims, &out)
    }

    /// `parts`, each `dtype[dims]`, stacked along a new `axis` (a Scan's stacked result).
    pub fn stack(
        dtype: DType,
        dims: &[usize],
        parts: &[Tensor],
        axis: usize,
    ) -> Result<Tensor, IrError> {
        no_bytes_for_strings(dtype)?;
        if axis > dims.len() {
            return Err(IrError::Tensor(format!(
                "cannot stack {dtype}{} along axis {axis}",
                Shape::fixed(dims)
            )));
        }
        if let Some(p) = parts.iter().find(|p| p.dtype != dtype || p.dims != dims) {
            return Err(IrError::Tensor(format!(
                "cannot stack {} with {dtype}{}",
                p.ty(),
                Shape::fixed(dims)
            )));
        }
        let inner = dims[axis..].iter().product::<usize>() * dtype.size();
        let mut out =
            Vec::with_capacity(inner * parts.len() * dims[..axis].iter().product::<usize>());
        for o in 0..dims[..axis].iter().product::<usize>() {
            for p in parts {
                out.extend_from_slice(&p.bytes()[o * inner..(o + 1) * inner]);
            }
        }
        let mut full = dims.to_vec();
        full.insert(axis, parts.len());
        Tensor::from_bytes(dtype, &full, &out)
    }

    /// A tensor from raw little-endian bytes; the length must match the type.
    pub fn from_bytes(dtype: DType, dims: &[usize], bytes: &[u8]) -> Result<Tensor, IrError> {
        no_bytes_for_strings(dtype)?;
        let want =
            crate::size::checked_bytes(dims, dtype).map_err(|e| IrError::Tensor(e.to_string()))?;
        if bytes.len() != want {
            return Err(IrError::Tensor(format!(
                "{dtype}{} needs {want} bytes, got {}",
                Shape::fixed(dims),
                bytes.len()
            )));
        }
        let mut t = Tensor { dtype, dims: dims.to_vec(), data: Storage::from_bytes(bytes) };
        if let Some(norm) = normalised(dtype, t.data.bytes()) {
            t.data = Storage::from_bytes(&norm);
        }
        Ok(t)
    }

    /// A tensor from typed values; `values.len()` must be the product of `dims`.
    pub fn from_vec<T: Element>(dims: &[usize], values: Vec<T>) -> Result<Tensor, IrError> {
        Self::from_slice(dims, &values)
    }

    pub fn from_slice<T: Element>(dims: &[usize], values: &[T]) -> Result<Tensor, IrError> {
        let n = crate::size::checked_bytes(dims, T::DTYPE)
            .map_err(|e| IrError::Tensor(e.to_string()))?
            / T::DTYPE.size();
        if values.len() != n {
            return Err(IrError::Tensor(format!(
                "shape {} holds {n} elements, got {} values",
                Shape::fixed(dims),
                values.len()
            )));
        }
        // SAFETY: every Element is plain data with no padding (bool is one byte 0/1).
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        };
        Ok(Tensor { dtype: T::DTYPE, dims: dims.to_vec(), data: Storage::from_bytes(bytes) })
    }

    pub fn scalar<T: Element>(v: T) -> Tensor {
        Self::from_slice(&[], &[v]).expect("one value fills a scalar")
    }

    /// A 1-D tensor.
    pub fn vector<T: Element>(values: &[T]) -> Tensor {
        Self::from_slice(&[values.len()], values).expect("a vector holds its values")
    }

    /// A tensor of strings; `values.len()` must be the product of `dims`.
    pub fn from_strings(dims: &[usize], values: Vec<String>) -> Result<Tensor, IrError> {
        let n = crate::size::numel(dims)
            .ok_or_else(|| IrError::Tensor(format!("string{} is too large", Shape::fixed(dims))))?;
        if values.len() != n {
            return Err(IrError::Tensor(format!(
                "shape {} holds {n} elements, got {} strings",
                Shape::fixed(dims),
                values.len()
            )));
        }
        Ok(Tensor {
            dtype: DType::String,
            dims: dims.to_vec(),
            data: Storage::Strings(values.into()),
        })
    }

    /// The strings of a string tensor; `None` for any other type.
    pub fn strings(&self) -> Option<&[String]> {
        match &self.data {
            Storage::Strings(s) => Some(s),
            _ => None,
        }
    }

    /// Zeros of a size the caller knows fits (a checked type's); panics otherwise. Strings are
    /// empty.
    pub fn zeros(dtype: DType, dims: &[usize]) -> Tensor {
        if dtype.is_string() {
            let n = crate::size::numel(dims).expect("the dimensions of a checked tensor type");
            return Tensor::from_strings(dims, vec![String::new(); n]).expect("length matches");
        }
        let n = crate::size::bytes(dims, dtype).expect("the dimensions of a checked tensor type");
        Tensor {
            dtype,
            dims: dims.to_vec(),
            data: Storage::Words { words: vec![0u64; n.div_ceil(8)].into(), len: n },
        }
    }

    /// Every element set to `v` (converted to `dtype`).
    pub fn full(dtype: DType, dims: &[usize], v: f64) -> Tensor {
        let n: usize = dims.iter().product();
        Tensor::from_f64s(dtype, dims, &vec![v; n]).expect("length matches")
    }

    /// Deterministic pseudo-random values (uniform in [-1, 1) for floats, small integers otherwise),
    /// the same on every machine for the same seed.
    pub fn random(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let mut rng = SplitMix64(seed);
        let values: Vec<f64> = (0..n)
            .map(|_| {
                let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                if dtype.is_float() {
                    u * 2.0 - 1.0
                } else if dtype == DType::Bool {
                    (u < 0.5) as u8 as f64
                } else if dtype.is_unsigned_int() {
                    (u * 10.0).floor()
                } else {
                    (u * 10.0).floor() - 5.0
                }
            })
            .collect();
        Tensor::from_f64s(dtype, dims, &values).expect("length matches")
    }

    /// Values converted from f64 with `as`-cast semantics (strings: as Cast writes them).
    pub fn from_f64s(dtype: DType, dims: &[usize], values: &[f64]) -> Result<Tensor, IrError> {
        if dtype.is_string() {
            return Tensor::from_strings(dims, values.iter().map(|&v| number_text(v, v)).collect());
        }
        macro_rules! conv {
            ($t:ty) => {
                Tensor::from_vec::<$t>(dims, values.iter().map(|&v| <$t>::from_f64(v)).collect())
            };
        }
        with_dtype!(dtype, conv)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, Shape::fixed(&self.dims))
    }

    /// The raw little-endian bytes (none for a string tensor: see `strings`).
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The bytes, writable in place: copied first into words of this tensor's own where they
    /// are shared with another tensor or owned by someone else (copy on write), so no other
    /// tensor sees a change, and the same bytes from then on until the tensor is cloned. A
    /// training step's parameters are written this way (`Executable::run_with_state`).
    ///
    /// # Safety
    /// What is written must be values of the tensor's type in kiln's form: bools 0 or 1, 4- and
    /// 2-bit integers sign-extended (as `from_bytes` would leave them).
    pub unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        if self.dtype.is_string() {
            return &mut []; // strings have no bytes to write
        }
        let len = self.data.bytes().len();
        let unique = match &mut self.data {
            Storage::Words { words, .. } => Arc::get_mut(words).is_some(),
            Storage::External(_) | Storage::Strings(_) => false,
        };
        if !unique {
            self.data = Storage::from_bytes(self.data.bytes());
        }
        match &mut self.data {
            Storage::Words { words, .. } => {
                let words = Arc::get_mut(words).expect("made unique above");
                &mut bytemuck::cast_slice_mut::<u64, u8>(words)[..len]
            }
            Storage::External(_) | Storage::Strings(_) => {
                unreachable!("copied into words above")
            }
        }
    }

    /// A typed view; the element type must match exactly.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], IrError> {
        if T::DTYPE != self.dtype {
            return Err(IrError::Tensor(format!("a {} tensor viewed as {}", self.dtype, T::DTYPE)));
        }
        let bytes = self.data.bytes();
        // SAFETY: storage is 8-byte aligned, the length is a multiple of size_of::<T>() (checked on
        // construction), and every stored bit pattern is a valid T (bools normalised to 0/1).
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, self.len()) })
    }

    /// The same data under other dimensions with the same element count (no copy).
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor, IrError> {
        if dims.iter().product::<usize>() != self.len() {
            return Err(IrError::Tensor(format!(
                "cannot reshape {} to {}",
                self.ty(),
                Shape::fixed(dims)
            )));
        }
        Ok(Tensor { dtype: self.dtype, dims: dims.to_vec(), data: self.data.clone() })
    }

    /// Every element as f64 (exact for all types but the largest 64-bit integers; strings parsed
    /// as numbers, NaN where one is not).
    pub fn to_f64s(&self) -> Vec<f64> {
        if let Some(s) = self.strings() {
            return s.iter().map(|s| s.trim().parse::<f64>().unwrap_or(f64::NAN)).collect();
        }
        macro_rules! conv {
            ($t:ty) => {
                self.as_slice::<$t>().expect("dtype matches").iter().map(|v| v.to_f64()).collect()
            };
        }
        with_dtype!(self.dtype, conv)
    }

    /// Every element as i64 (integer and bool tensors exactly; floats truncated).
    pub fn to_i64s(&self) -> Vec<i64> {
        match self.dtype {
            DType::I64 => self.as_slice::<i64>().expect("dtype matches").to_vec(),
            DType::U64 => {
                self.as_slice::<u64>().expect("dtype matches").iter().map(|&v| v as i64).collect()
            }
            _ => self.to_f64s().into_iter().map(|v| v as i64).collect(),
        }
    }

    /// Converts to another element type with ONNX `Cast` semantics for the common cases
    /// (float to int truncates toward zero and saturates, int to int wraps, to bool is `!= 0`).
    /// Strings parse as numbers (NaN, or 0 in an integer type, where one does not: the
    /// interpreter's Cast checks first) and numbers print as text.
    pub fn cast(&self, to: DType) -> Tensor {
        if to == self.dtype {
            return self.clone();
        }
        if self.dtype.is_string() {
            return Tensor::from_f64s(to, &self.dims, &self.to_f64s()).expect("length matches");
        }
        if to.is_string() {
            let text = match self.dtype {
                DType::I64 => self.to_i64s().iter().map(|v| v.to_string()).collect(),
                DType::U64 => self
                    .as_slice::<u64>()
                    .expect("dtype matches")
                    .iter()
                    .map(|v| v.to_string())
                    .collect(),
                DType::Bool => self
                    .to_f64s()
                    .iter()
                    .map(|&v| if v != 0.0 { "True" } else { "False" }.into())
                    .collect(),
                // At f64's shortest; the narrower floats at f32's (0.1 stays "0.1", as numpy
                // writes a float32).
                DType::F64 => self.to_f64s().into_iter().map(|v| number_text(v, v)).collect(),
                d if d.is_float() || d.is_float8() || d == DType::F4E2M1 => {
                    self.to_f64s().into_iter().map(|v| number_text(v, v as f32)).collect()
                }
                _ => self.to_i64s().iter().map(|v| v.to_string()).collect(),
            };
            return Tensor::from_strings(&self.dims, text).expect("length matches");
        }
        macro_rules! from {
            ($src:ty) => {{
                let s = self.as_slice::<$src>().expect("dtype matches");
                macro_rules! to {
                    ($t:ty) => {
                        Tensor::from_vec::<$t>(
                            &self.dims,
                            s.iter().map(|&v| cast_element::<$src, $t>(v)).collect(),
                        )
                        .expect("length matches")
                    };
                }
                with_dtype!(to, to)
            }};
        }
        with_dtype!(self.dtype, from)
    }

    /// [`Tensor::cast`], but to an 8-bit float without saturating: values out of its range
    /// become infinity or NaN (ONNX Cast with `saturate = 0`). Other types cast as `cast` does.
    pub fn cast_unsaturated(&self, to: DType) -> Tensor {
        if to == self.dtype || !to.is_float8() {
            return self.cast(to);
        }
        let codes: Vec<u8> = self
            .to_f64s()
            .into_iter()
            .map(|v| narrow::encode_unsaturated(to, v).expect("an 8-bit float"))
            .collect();
        Tensor::from_bytes(to, &self.dims, &codes).expect("one byte an element")
    }

    /// A short human summary: type, count, range. Used where weights print.
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return format!("{} (empty)", self.ty());
        }
        if let Some(s) = self.strings() {
            let first: Vec<String> = s.iter().take(4).map(|s| format!("{s:?}")).collect();
            let more = if s.len() > 4 { ", ..." } else { "" };
            return format!("{}, {} strings [{}{more}]", self.ty(), s.len(), first.join(", "));
        }
        let v = self.to_f64s();
        let (lo, hi) =
            v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        format!("{}, {} values in [{}, {}]", self.ty(), v.len(), fmt_g(lo), fmt_g(hi))
    }

    /// A stable 64-bit digest of type and bytes (FNV-1a), for summaries and cache keys.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv64::new();
        h.write(self.dtype.name().as_bytes());
        for d in &self.dims {
            h.write(&(*d as u64).to_le_bytes());
        }
        h.write(self.bytes());
        for s in self.strings().unwrap_or_default() {
            h.write(&(s.len() as u64).to_le_bytes());
            h.write(s.as_bytes());
        }
        h.finish()
    }
}

/// The bytes in kiln's form when they are not already: bools 0 or 1 (any nonzero byte is true),
/// 4- and 2-bit integers sign-extended (signed) or masked (unsigned) from their low bits, as
/// ml_dtypes leaves the high bits clear.
fn normalised(dtype: DType, bytes: &[u8]) -> Option<Vec<u8>> {
    let norm = |b: u8| -> u8 {
        match dtype {
            DType::Bool => (b != 0) as u8,
            DType::I4 | DType::I2 => {
                narrow::wrap_int(b as i128, dtype.packed_bits().expect("packed"), true) as u8
            }
            DType::U4 | DType::U2 => b & ((1u8 << dtype.packed_bits().expect("packed")) - 1),
            _ => b,
        }
    };
    if !matches!(dtype, DType::Bool | DType::I4 | DType::I2 | DType::U4 | DType::U2)
        || bytes.iter().all(|&b| norm(b) == b)
    {
        return None;
    }
    Some(bytes.iter().map(|&b| norm(b)).collect())
}

/// Refuses a byte-level construction or view of a string tensor.
fn no_bytes_for_strings(dtype: DType) -> Result<(), IrError> {
    if dtype.is_string() {
        return Err(IrError::Tensor("a string tensor has no byte form".into()));
    }
    Ok(())
}

/// A float as Cast to string writes it, which is numpy's `astype(str)` (ONNX's reference Cast):
/// the shortest digits that read back in its type (`shortest`, `v` as f32 or f64), positional
/// from 1e-4 up to 1e16 with ".0" on a whole number, else scientific with a signed exponent of
/// two digits or more ("1e+300", "1.5e-07"); "nan", "inf" and "-inf".
fn number_text<T: std::fmt::Display + std::fmt::LowerExp>(v: f64, shortest: T) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = v.abs();
    if a == 0.0 || (1e-4..1e16).contains(&a) {
        let t = format!("{shortest}");
        return if t.contains('.') { t } else { format!("{t}.0") };
    }
    let t = format!("{shortest:e}");
    match t.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => t,
    }
}

/// One element converted: exactly through i128 between integers, through f64 otherwise.
pub fn cast_element<S: Element, T: Element>(v: S) -> T {
    match (v.to_i128(), T::DTYPE.is_float()) {
        (Some(i), false) => T::from_i128(i),
        _ => T::from_f64(v.to_f64()),
    }
}

/// Formats a float compactly and round-trippably.
pub(crate) fn fmt_g(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// SplitMix64: tiny, fast and fixed forever, so seeded tensors are the same everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl PartialEq for Tensor {
    /// Same type and same bytes (so NaNs with equal bits compare equal).
    fn eq(&self, other: &Tensor) -> bool {
        self.dtype == other.dtype
            && self.dims == other.dims
            && self.bytes() == other.bytes()
            && self.strings() == other.strings()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(s), true) = (self.strings(), self.len() <= 16) {
            write!(f, "Tensor({} {s:?})", self.ty())
        } else if self.len() <= 16 {
            write!(f, "Tensor({} {:?})", self.ty(), self.to_f64s())
        } else {
            write!(f, "Tensor({})", self.summary())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views_and_sharing() {
        let t = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1., 2., 3., 4., 5., 6.]);
        assert!(t.as_slice::<f64>().is_err());
        let r = t.reshape(&[3, 2]).unwrap();
        assert_eq!(r.bytes().as_ptr(), t.bytes().as_ptr(), "reshape shares data");
        assert!(t.reshape(&[4]).is_err());
    }

    #[test]
    fn construction_checks_length() {
        assert!(Tensor::from_vec(&[2, 2], vec![1i64, 2, 3]).is_err());
        assert!(Tensor::from_bytes(DType::F32, &[2], &[0u8; 7]).is_err());
    }

    #[test]
    fn bool_bytes_are_normalised() {
        let t = Tensor::from_bytes(DType::Bool, &[3], &[0, 7, 1]).unwrap();
        assert_eq!(t.as_slice::<bool>().unwrap(), &[false, true, true]);
    }

    #[test]
    fn casts_follow_onnx() {
        let t = Tensor::vector(&[-1.7f32, 2.5, 300.0]);
        assert_eq!(t.cast(DType::I32).as_slice::<i32>().unwrap(), &[-1, 2, 300]);
        assert_eq!(t.cast(DType::Bool).as_slice::<bool>().unwrap(), &[true, true, true]);
        let big = Tensor::vector(&[i64::MAX, -1]);
        assert_eq!(big.cast(DType::U64).as_slice::<u64>().unwrap(), &[i64::MAX as u64, u64::MAX]);
        let h = Tensor::vector(&[1.5f32]).cast(DType::F16);
        assert_eq!(h.as_slice::<f16>().unwrap(), &[f16::from_f32(1.5)]);
    }

    #[test]
    fn random_is_deterministic() {
        let a = Tensor::random(DType::F32, &[8], 7);
        assert_eq!(a, Tensor::random(DType::F32, &[8], 7));
        assert_ne!(a, Tensor::random(DType::F32, &[8], 8));
        assert!(a.to_f64s().iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
