//! The ONNX frontend: ONNX protobuf to a kiln [`Graph`](crate::Graph).
//!
//! - Messages are prost-derived structs ([`proto`]); no build-time codegen, no protoc.
//! - Tensors stored inline (typed fields), in `raw_data`, or as external data in a file beside
//!   the model (the PyTorch exporter writes `model.onnx.data`).
//! - Opset differences are resolved at import: attributes that later opsets turned into operands
//!   become constant operands, old semantics (Softmax's 2-D coercion, Upsample) are rewritten.
//! - Dynamic dimensions become symbols (`batch`, or `<input>_d<i>` when unnamed).
//! - Every unsupported op of a model is reported at once, with the nodes using it.
//! - A corrupt, truncated or non-ONNX file is an error that says so, never a panic.

mod import;
mod inspect;
mod ml;
mod nbits;
mod ops;
mod preview;
pub mod proto;
mod quantized;
mod scatter;
mod tensor;
pub mod testcase;
mod tfidf;
mod training;
mod wire;

use std::path::Path;

use prost::Message;

pub use inspect::{inspect, inspect_with, Summary};
pub use tensor::{dtype_of, onnx_type_of};

use crate::{Graph, IrError, Result, Tensor};

/// The newest version of the default ONNX opset kiln knows (ONNX 1.22's), whose node tests
/// it runs. A newer one may give an op another meaning.
pub const NEWEST_OPSET: i64 = 27;

/// How a model is imported.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions {
    /// Import a model whose default opset is newer than [`NEWEST_OPSET`] (with a warning in
    /// [`Model::warnings`]) instead of refusing it.
    pub allow_newer_opsets: bool,
    /// The memory budget for decoding the model (bytes): a file whose decoded messages would
    /// take more is refused before they are decoded. `None`: the memory available.
    pub max_memory: Option<u64>,
}

/// An imported model.
#[derive(Debug, Clone)]
pub struct Model {
    pub graph: Graph,
    pub ir_version: i64,
    /// (domain, version) of every opset the model imports; `""` is the default domain.
    pub opsets: Vec<(String, i64)>,
    pub producer: String,
    /// What the import let through but a user should hear about (a newer opset allowed).
    pub warnings: Vec<String>,
}

impl Model {
    /// The version of the default ONNX opset the model was written for.
    pub fn default_opset(&self) -> i64 {
        self.opsets.iter().find(|(d, _)| d.is_empty() || d == "ai.onnx").map_or(1, |(_, v)| *v)
    }
}

/// Every ONNX op type (default domain) the importer converts.
pub fn supported_ops() -> &'static [&'static str] {
    ops::supported()
}

/// The ops of other domains the importer converts, each as `domain:op`
/// (`ai.onnx.ml:TreeEnsemble`), the form `docs/ops.md` names them by.
pub fn supported_domain_ops() -> Vec<String> {
    let domains: [(&str, &[&str]); 4] = [
        (training::DOMAIN, training::OPS),
        (preview::DOMAIN, preview::OPS),
        (ml::DOMAIN, ml::OPS),
        ("com.microsoft", quantized::MICROSOFT),
    ];
    domains.iter().flat_map(|(d, ops)| ops.iter().map(move |o| format!("{d}:{o}"))).collect()
}

/// Loads an ONNX model from a file; external data is read from the file's directory.
pub fn load(path: impl AsRef<Path>) -> Result<Model> {
    load_with(path, &ImportOptions::default())
}

/// [`load`] with import options.
pub fn load_with(path: impl AsRef<Path>, options: &ImportOptions) -> Result<Model> {
    let path = path.as_ref();
    let bytes =
        std::fs::read(path).map_err(|e| IrError::Onnx(format!("{}: {e}", path.display())))?;
    let dir = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    load_bytes_with(&bytes, dir, options).map_err(|e| match e {
        IrError::Onnx(m) => IrError::Onnx(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// Loads an ONNX model from its bytes; `base_dir` is where external data files are looked for.
pub fn load_bytes(bytes: &[u8], base_dir: Option<&Path>) -> Result<Model> {
    load_bytes_with(bytes, base_dir, &ImportOptions::default())
}

/// [`load_bytes`] with import options.
pub fn load_bytes_with(
    bytes: &[u8],
    base_dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<Model> {
    let model = decode_model(bytes, options)?;
    import::import_model(&model, base_dir, options)
}

/// Decodes a ModelProto and checks it looks like an ONNX model; one whose decoded messages
/// would not fit in the memory budget is refused first.
pub(crate) fn decode_model(bytes: &[u8], options: &ImportOptions) -> Result<proto::ModelProto> {
    if bytes.is_empty() {
        return Err(IrError::Onnx("the file is empty, not an ONNX model".into()));
    }
    let budget = options.max_memory.or_else(crate::memory::available).unwrap_or(u64::MAX);
    check_decoded_size(bytes, wire::Msg::Model, "model", budget)?;
    let model = proto::ModelProto::decode(bytes).map_err(|e| {
        IrError::Onnx(format!("not a valid ONNX model (corrupt or truncated protobuf: {e})"))
    })?;
    if model.graph.is_none() {
        return Err(IrError::Onnx("not an ONNX model: it has no graph".into()));
    }
    if model.ir_version.unwrap_or(0) <= 0
        || model.opset_import.is_empty() && model.ir_version.unwrap_or(0) >= 3
    {
        return Err(IrError::Onnx(format!(
            "not an ONNX model: ir_version {:?} and {} opset imports",
            model.ir_version,
            model.opset_import.len()
        )));
    }
    Ok(model)
}

/// An error unless decoding `bytes` as a `root` (`what`, for the message) fits in `budget`
/// bytes. Counted before prost allocates: 2 bytes on the wire can be hundreds in memory (an
/// empty attribute), so a file's size does not bound its decode.
fn check_decoded_size(bytes: &[u8], root: wire::Msg, what: &str, budget: u64) -> Result<()> {
    // Bytes that do not scan are left to prost, which says what is wrong with them.
    let Some(estimate) = wire::estimate(bytes, root) else { return Ok(()) };
    if estimate.bytes <= budget {
        return Ok(());
    }
    Err(IrError::Onnx(format!(
        "decoding the {what} would take {} bytes ({}) of memory, more than the memory budget of {budget} bytes ({}) (the memory available, or --max-memory): it holds {}",
        estimate.bytes,
        crate::memory::human(estimate.bytes),
        crate::memory::human(budget),
        estimate.largest_part()
    )))
}

/// Reads a serialized TensorProto (the `.pb` files of ONNX test data).
pub fn read_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes =
        std::fs::read(path).map_err(|e| IrError::Onnx(format!("{}: {e}", path.display())))?;
    decode_tensor(&bytes, path.parent()).map_err(|e| match e {
        IrError::Onnx(m) => IrError::Onnx(format!("{}: {m}", path.display())),
        IrError::NotSupported(m) => IrError::NotSupported(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// Decodes a serialized TensorProto.
pub fn decode_tensor(bytes: &[u8], base_dir: Option<&Path>) -> Result<Tensor> {
    let budget = crate::memory::available().unwrap_or(u64::MAX);
    check_decoded_size(bytes, wire::Msg::Tensor, "tensor", budget)?;
    let t = proto::TensorProto::decode(bytes).map_err(|e| {
        IrError::Onnx(format!("not a valid ONNX tensor (corrupt or truncated protobuf: {e})"))
    })?;
    if t.data_type.is_none() {
        return Err(IrError::Onnx("not an ONNX tensor: it has no data type".into()));
    }
    tensor::tensor_from_proto(&t, base_dir)
}

/// Reads a serialized value of type `ty`: a TensorProto, or a SequenceProto or OptionalProto for
/// a sequence or an optional (ONNX test data).
pub fn read_value(path: impl AsRef<Path>, ty: &crate::TensorType) -> Result<crate::Value> {
    let path = path.as_ref();
    if ty.kind.is_tensor() {
        return read_tensor(path).map(crate::Value::Tensor);
    }
    let bytes =
        std::fs::read(path).map_err(|e| IrError::Onnx(format!("{}: {e}", path.display())))?;
    let base = path.parent();
    let corrupt = |what: &str, e: prost::DecodeError| {
        IrError::Onnx(format!(
            "{}: not a valid ONNX {what} (corrupt or truncated protobuf: {e})",
            path.display()
        ))
    };
    let sequence = |s: &proto::SequenceProto| -> Result<crate::Value> {
        if !s.sequence_values.is_empty() || !s.optional_values.is_empty() {
            return Err(IrError::NotSupported(format!(
                "{}: a sequence of sequences or optionals is not supported",
                path.display()
            )));
        }
        Ok(crate::Value::Sequence(
            s.tensor_values
                .iter()
                .map(|t| tensor::tensor_from_proto(t, base))
                .collect::<Result<_>>()?,
        ))
    };
    match ty.kind {
        crate::Kind::Sequence { .. } => {
            sequence(&proto::SequenceProto::decode(&bytes[..]).map_err(|e| corrupt("sequence", e))?)
        }
        _ => {
            let o = proto::OptionalProto::decode(&bytes[..]).map_err(|e| corrupt("optional", e))?;
            let held = match (o.elem_type.unwrap_or(0), &o.tensor_value, &o.sequence_value) {
                (proto::value_elem_type::TENSOR, Some(t), _) => {
                    Some(crate::Value::Tensor(tensor::tensor_from_proto(t, base)?))
                }
                (proto::value_elem_type::SEQUENCE, _, Some(s)) => Some(sequence(s)?),
                (proto::value_elem_type::UNDEFINED, None, None)
                | (proto::value_elem_type::TENSOR, None, _)
                | (proto::value_elem_type::SEQUENCE, _, None) => None,
                (other, _, _) => {
                    return Err(IrError::NotSupported(format!(
                        "{}: an optional of element kind {other} is not supported",
                        path.display()
                    )))
                }
            };
            Ok(crate::Value::Optional(held.map(Box::new)))
        }
    }
}

/// The ONNX model `bytes` with each initializer named in `values` replaced by that value (raw
/// data, in place of the stored or external data): a trained model's weights written back into
/// the model it was imported from. Each name must be an initializer of the main graph, typed as
/// it. The model is re-encoded from the messages kiln reads, so fields kiln does not read (doc
/// strings, metadata, value_info) are not kept.
pub fn replace_initializers(bytes: &[u8], values: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut model = decode_model(bytes, &ImportOptions::default())?;
    let graph =
        model.graph.as_mut().ok_or_else(|| IrError::Onnx("the model has no graph".into()))?;
    for (name, t) in values {
        let init = graph
            .initializer
            .iter_mut()
            .find(|i| i.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| IrError::Onnx(format!("the model has no initializer `{name}`")))?;
        let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
        if init.dims != dims || init.data_type != Some(onnx_type_of(t.dtype())) {
            return Err(IrError::Onnx(format!(
                "initializer `{name}` is typed otherwise than its new value {}",
                t.ty()
            )));
        }
        *init = proto::TensorProto::decode(&encode_tensor(t, name)[..])
            .map_err(|e| IrError::Onnx(format!("re-encoding `{name}`: {e}")))?;
    }
    Ok(model.encode_to_vec())
}

/// Serializes a tensor as a TensorProto (raw data; a string tensor's in `string_data`).
pub fn encode_tensor(t: &Tensor, name: &str) -> Vec<u8> {
    if let Some(strings) = t.strings() {
        return proto::TensorProto {
            dims: t.dims().iter().map(|&d| d as i64).collect(),
            data_type: Some(onnx_type_of(t.dtype())),
            name: Some(name.to_string()),
            string_data: strings.iter().map(|s| s.as_bytes().to_vec()).collect(),
            ..Default::default()
        }
        .encode_to_vec();
    }
    proto::TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: Some(onnx_type_of(t.dtype())),
        name: Some(name.to_string()),
        // The 4- and 2-bit types packed, as ONNX stores them.
        raw_data: Some(match t.dtype().packed_bits() {
            Some(bits) => crate::narrow::pack(t.bytes(), bits),
            None => t.bytes().to_vec(),
        }),
        ..Default::default()
    }
    .encode_to_vec()
}
