//! TensorProto to kiln tensors: every storage form (typed fields, `raw_data`, external data in a
//! file beside the model) for every element type kiln has.

use std::path::Path;

use half::{bf16, f16};

use super::proto::{data_type as dt, SparseTensorProto, TensorProto};
use crate::{narrow, DType, IrError, Tensor};

/// The kiln dtype of an ONNX data type; one kiln lacks is `NotSupported`, named as the spec
/// names it.
pub fn dtype_of(t: i32) -> Result<DType, IrError> {
    Ok(match t {
        dt::FLOAT => DType::F32,
        dt::DOUBLE => DType::F64,
        dt::FLOAT16 => DType::F16,
        dt::BFLOAT16 => DType::BF16,
        dt::INT8 => DType::I8,
        dt::INT16 => DType::I16,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::UINT8 => DType::U8,
        dt::UINT16 => DType::U16,
        dt::UINT32 => DType::U32,
        dt::UINT64 => DType::U64,
        dt::BOOL => DType::Bool,
        dt::FLOAT8E4M3FN => DType::F8E4M3FN,
        dt::FLOAT8E4M3FNUZ => DType::F8E4M3FNUZ,
        dt::FLOAT8E5M2 => DType::F8E5M2,
        dt::FLOAT8E5M2FNUZ => DType::F8E5M2FNUZ,
        dt::FLOAT8E8M0 => DType::F8E8M0,
        dt::FLOAT4E2M1 => DType::F4E2M1,
        dt::INT4 => DType::I4,
        dt::UINT4 => DType::U4,
        dt::INT2 => DType::I2,
        dt::UINT2 => DType::U2,
        dt::STRING => DType::String,
        other => {
            return Err(IrError::NotSupported(format!(
                "element type {} is not supported",
                dt::name(other)
            )))
        }
    })
}

/// The ONNX data type of a kiln dtype.
pub fn onnx_type_of(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::F64 => dt::DOUBLE,
        DType::F16 => dt::FLOAT16,
        DType::BF16 => dt::BFLOAT16,
        DType::I8 => dt::INT8,
        DType::I16 => dt::INT16,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::U8 => dt::UINT8,
        DType::U16 => dt::UINT16,
        DType::U32 => dt::UINT32,
        DType::U64 => dt::UINT64,
        DType::Bool => dt::BOOL,
        DType::F8E4M3FN => dt::FLOAT8E4M3FN,
        DType::F8E4M3FNUZ => dt::FLOAT8E4M3FNUZ,
        DType::F8E5M2 => dt::FLOAT8E5M2,
        DType::F8E5M2FNUZ => dt::FLOAT8E5M2FNUZ,
        DType::F8E8M0 => dt::FLOAT8E8M0,
        DType::F4E2M1 => dt::FLOAT4E2M1,
        DType::I4 => dt::INT4,
        DType::U4 => dt::UINT4,
        DType::I2 => dt::INT2,
        DType::U2 => dt::UINT2,
        DType::String => dt::STRING,
    }
}

/// Converts a TensorProto; `base_dir` is where external data files are looked for. An element type
/// kiln lacks is `NotSupported`; broken data is an `Onnx` error.
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, IrError> {
    let name = t.name.as_deref().unwrap_or("");
    let what = if name.is_empty() { "a tensor".to_string() } else { format!("tensor `{name}`") };
    let dtype = dtype_of(t.data_type.unwrap_or(0)).map_err(|e| e.context(&what))?;
    tensor_data(t, dtype, &what, base_dir)
}

/// The tensor's data; what is broken is an `Onnx` error that starts with `what`.
fn tensor_data(
    t: &TensorProto,
    dtype: DType,
    what: &str,
    base_dir: Option<&Path>,
) -> Result<Tensor, IrError> {
    let bad = |m: String| IrError::Onnx(format!("{what}: {m}"));
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()?;
    let count = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    if dtype.is_string() {
        return strings_from_proto(t, &dims, count).map_err(bad);
    }
    // The 4- and 2-bit types are packed in files, low bits first; kiln keeps a byte each.
    let bytes_needed = match dtype.packed_bits() {
        Some(bits) => count.div_ceil((8 / bits) as usize),
        None => count.checked_mul(dtype.size()).ok_or_else(|| bad("too large".into()))?,
    };
    let from_file_bytes = |bytes: &[u8]| {
        let t = match dtype.packed_bits() {
            Some(bits) => {
                let signed = matches!(dtype, DType::I4 | DType::I2);
                Tensor::from_bytes(dtype, &dims, &narrow::unpack(bytes, count, bits, signed))
            }
            None => Tensor::from_bytes(dtype, &dims, bytes),
        };
        t.map_err(|e| bad(e.to_string()))
    };
    let wrong_len =
        |have: usize| bad(format!("{dtype}{:?} needs {count} values, the file holds {have}", dims));

    if t.data_location == Some(1) {
        let bytes = read_external(t, base_dir, bytes_needed).map_err(|e| e.context(what))?;
        return from_file_bytes(&bytes);
    }
    if let Some(raw) = &t.raw_data {
        if raw.len() != bytes_needed {
            return Err(bad(format!(
                "{dtype}{dims:?} needs {bytes_needed} bytes of raw data, the file holds {}",
                raw.len()
            )));
        }
        return from_file_bytes(raw);
    }
    // Typed fields: which one holds the data depends on the type (see onnx.proto).
    let tensor =
        match dtype {
            DType::F32 => check_len(&t.float_data, count, wrong_len)
                .and_then(|v| Tensor::from_slice(&dims, v)),
            DType::F64 => check_len(&t.double_data, count, wrong_len)
                .and_then(|v| Tensor::from_slice(&dims, v)),
            DType::I64 => check_len(&t.int64_data, count, wrong_len)
                .and_then(|v| Tensor::from_slice(&dims, v)),
            DType::U64 => check_len(&t.uint64_data, count, wrong_len)
                .and_then(|v| Tensor::from_slice(&dims, v)),
            DType::U32 => check_len(&t.uint64_data, count, wrong_len)
                .and_then(|v| Tensor::from_vec(&dims, v.iter().map(|&x| x as u32).collect())),
            DType::F16 => int32s(t, count, wrong_len).and_then(|v| {
                Tensor::from_vec(&dims, v.iter().map(|&x| f16::from_bits(x as u16)).collect())
            }),
            DType::BF16 => int32s(t, count, wrong_len).and_then(|v| {
                Tensor::from_vec(&dims, v.iter().map(|&x| bf16::from_bits(x as u16)).collect())
            }),
            DType::Bool => int32s(t, count, wrong_len)
                .and_then(|v| Tensor::from_vec(&dims, v.iter().map(|&x| x != 0).collect())),
            // One code a value (8-bit floats), or the packed bytes (4- and 2-bit types).
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2 => int32s(t, bytes_needed, wrong_len)
                .and_then(|v| from_file_bytes(&v.iter().map(|&x| x as u8).collect::<Vec<_>>())),
            DType::I32 | DType::I16 | DType::I8 | DType::U16 | DType::U8 => {
                int32s(t, count, wrong_len).and_then(|v| {
                    Tensor::from_f64s(
                        DType::I64,
                        &dims,
                        &v.iter().map(|&x| x as f64).collect::<Vec<_>>(),
                    )
                    .map(|t| t.cast(dtype))
                })
            }
            DType::String => unreachable!("strings are read above"),
        };
    tensor.map_err(|e| match e {
        IrError::Onnx(m) if m.starts_with(what) => IrError::Onnx(m),
        other => bad(other.to_string()),
    })
}

/// A string tensor's `string_data`: one entry an element, each UTF-8 (ONNX strings are bytes;
/// kiln's are text, and refuses what is not rather than guess at it).
fn strings_from_proto(t: &TensorProto, dims: &[usize], count: usize) -> Result<Tensor, String> {
    if t.raw_data.is_some() || t.data_location == Some(1) {
        return Err("a string tensor's data must be in `string_data`, not raw or external".into());
    }
    if t.string_data.len() != count {
        return Err(format!(
            "string{dims:?} needs {count} strings, the file holds {}",
            t.string_data.len()
        ));
    }
    let strings = t
        .string_data
        .iter()
        .enumerate()
        .map(|(i, b)| {
            String::from_utf8(b.clone()).map_err(|e| format!("string {i} is not UTF-8 ({e})"))
        })
        .collect::<Result<Vec<String>, String>>()?;
    Tensor::from_strings(dims, strings).map_err(|e| e.to_string())
}

fn check_len<T>(v: &[T], count: usize, wrong: impl Fn(usize) -> IrError) -> Result<&[T], IrError> {
    if v.len() == count {
        Ok(v)
    } else {
        Err(wrong(v.len()))
    }
}

fn int32s(
    t: &TensorProto,
    count: usize,
    wrong: impl Fn(usize) -> IrError,
) -> Result<&[i32], IrError> {
    check_len(&t.int32_data, count, wrong)
}

/// Reads a tensor's bytes from the external data file named in its `external_data` entries.
fn read_external(
    t: &TensorProto,
    base_dir: Option<&Path>,
    bytes_needed: usize,
) -> Result<Vec<u8>, IrError> {
    let entry = |key: &str| {
        t.external_data.iter().find(|e| e.key.as_deref() == Some(key)).and_then(|e| e.value.clone())
    };
    let location = entry("location").ok_or_else(|| onnx("external data without a `location`"))?;
    let parse = |key: &str| -> Result<Option<u64>, IrError> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| onnx(format!("external data `{key}` is not a number: {v}")))
            })
            .transpose()
    };
    let offset = parse("offset")?.unwrap_or(0);
    let length = parse("length")?;
    // The location is relative to the model's directory and must stay inside it.
    let rel = Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(onnx(format!("external data location `{location}` must be a relative path inside the model's directory")));
    }
    let dir = base_dir.ok_or_else(|| {
        onnx("the tensor's data is in an external file, but the model was not loaded from a file")
    })?;
    let start = usize::try_from(offset).map_err(|_| onnx("offset too large"))?;
    let len = match length {
        Some(l) => usize::try_from(l).map_err(|_| onnx("length too large"))?,
        None => bytes_needed,
    };
    if len != bytes_needed {
        return Err(onnx(format!(
            "external data length {len} does not match the {bytes_needed} bytes the tensor needs"
        )));
    }
    let end = start.checked_add(len).ok_or_else(|| onnx("offset + length overflows"))?;
    let available = crate::memory::available_at_start();
    if len as u64 > available {
        return Err(onnx(format!(
            "the tensor's {} of external data are more than the {} of memory available",
            crate::memory::human(len as u64),
            crate::memory::human(available)
        )));
    }
    let (mut file, path, size) = open_external(dir, rel, &location)?;
    if end as u64 > size {
        return Err(onnx(format!(
            "external data file {} holds {size} bytes, bytes {start}..{end} wanted (truncated?)",
            path.display()
        )));
    }
    // Only the tensor's own bytes: a file holding many tensors is not read once a tensor.
    use std::io::{Read, Seek, SeekFrom};
    let mut data = vec![0u8; len];
    file.seek(SeekFrom::Start(start as u64))
        .and_then(|_| file.read_exact(&mut data))
        .map_err(|e| onnx(format!("cannot read external data file {}: {e}", path.display())))?;
    Ok(data)
}

/// Opens the external data file `rel` of the model in `dir`: after following every link it
/// must still lie inside the model's directory and be a regular file (a link to `/etc/passwd`
/// or to `/dev/zero` is refused). Returns the file, its resolved path and its size.
fn open_external(
    dir: &Path,
    rel: &Path,
    location: &str,
) -> Result<(std::fs::File, std::path::PathBuf, u64), IrError> {
    let dir = dir
        .canonicalize()
        .map_err(|e| onnx(format!("the model's directory {}: {e}", dir.display())))?;
    let joined = dir.join(rel);
    let path = joined
        .canonicalize()
        .map_err(|e| onnx(format!("cannot read external data file {}: {e}", joined.display())))?;
    if !path.starts_with(&dir) {
        return Err(onnx(format!(
            "external data location `{location}` leads outside the model's directory (to {})",
            path.display()
        )));
    }
    let file = std::fs::File::open(&path)
        .map_err(|e| onnx(format!("cannot read external data file {}: {e}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| onnx(format!("cannot read external data file {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(onnx(format!(
            "external data location `{location}` is not a regular file ({})",
            path.display()
        )));
    }
    Ok((file, path, meta.len()))
}

/// Converts a sparse tensor (values at flat or coordinate indices) to a dense one.
pub fn sparse_to_dense(s: &SparseTensorProto, base_dir: Option<&Path>) -> Result<Tensor, IrError> {
    let values = tensor_from_proto(
        s.values.as_ref().ok_or(IrError::Onnx("a sparse tensor without values".into()))?,
        base_dir,
    )?;
    let indices = tensor_from_proto(
        s.indices.as_ref().ok_or(IrError::Onnx("a sparse tensor without indices".into()))?,
        base_dir,
    )?
    .to_i64s();
    sparse_fill(s, &values, &indices)
}

/// A broken file's error.
fn onnx(msg: impl Into<String>) -> IrError {
    IrError::Onnx(msg.into())
}

fn sparse_fill(s: &SparseTensorProto, values: &Tensor, indices: &[i64]) -> Result<Tensor, IrError> {
    let dims: Vec<usize> = s
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| onnx(format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()?;
    let dtype = values.dtype();
    let bytes = crate::size::checked_bytes(&dims, dtype).map_err(|e| onnx(e.to_string()))?;
    let n = bytes / dtype.size().max(1);
    // The dense tensor, and the f64 values it is filled from: both must fit before either is
    // allocated (a small file can declare a huge sparse tensor).
    let need = (bytes as u64).saturating_add((n as u64).saturating_mul(8));
    let available = crate::memory::available_at_start();
    if need > available {
        return Err(onnx(format!(
            "a sparse tensor of {dtype}{} would take {} as a dense one, more than the {} of memory available",
            crate::Shape::fixed(&dims),
            crate::memory::human(need),
            crate::memory::human(available)
        )));
    }
    let nnz = values.len();
    let out_of_range = |i: i64| onnx(format!("sparse index {i} is out of range for {dims:?}"));
    let flat: Vec<usize> = if indices.len() == nnz {
        indices
            .iter()
            .map(|&i| usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| out_of_range(i)))
            .collect::<Result<_, _>>()?
    } else if indices.len() == nnz.saturating_mul(dims.len()) && !dims.is_empty() {
        let strides = crate::eval::strides(&dims);
        indices
            .chunks(dims.len())
            .map(|c| {
                c.iter().zip(&strides).zip(&dims).try_fold(0usize, |acc, ((&i, &st), &d)| {
                    let i = usize::try_from(i)
                        .ok()
                        .filter(|&i| i < d)
                        .ok_or_else(|| out_of_range(i))?;
                    Ok(acc + i * st)
                })
            })
            .collect::<Result<_, IrError>>()?
    } else {
        return Err(onnx(format!(
            "a sparse tensor has {nnz} values but {} indices",
            indices.len()
        )));
    };
    let v = values.to_f64s();
    let mut dense = vec![0.0; n];
    for (k, &i) in flat.iter().enumerate() {
        dense[i] = v[k];
    }
    Tensor::from_f64s(dtype, &dims, &dense).map_err(|e| onnx(e.to_string()))
}
