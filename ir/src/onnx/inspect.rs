//! A model's summary for `kiln info`: what the file says, whether or not kiln can import it.

use std::collections::BTreeMap;
use std::path::Path;

use super::import::check_supported_list;
use super::proto::{type_proto, GraphProto, ValueInfoProto};
use super::tensor::dtype_of;
use crate::{IrError, Result, UnsupportedOp};

/// What `kiln info` prints.
#[derive(Debug, Clone)]
pub struct Summary {
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
    /// (name, type) of each graph input that is not an initializer; the type as text (symbols
    /// included), or why kiln cannot take it.
    pub inputs: Vec<(String, String)>,
    /// (name, type): inferred when the model imports, else as the file declares it.
    pub outputs: Vec<(String, String)>,
    /// Op type -> node count (default-domain ops by name, others as `domain:name`).
    pub ops: BTreeMap<String, usize>,
    pub nodes: usize,
    pub parameters: usize,
    pub parameter_bytes: usize,
    pub unsupported: Vec<UnsupportedOp>,
    /// Why the full import failed, when it did for another reason than unsupported ops.
    pub import_error: Option<String>,
}

/// Reads a model and summarises it.
pub fn inspect(path: impl AsRef<Path>) -> Result<Summary> {
    inspect_with(path, &super::ImportOptions::default())
}

/// [`inspect`], importing with `options`.
pub fn inspect_with(path: impl AsRef<Path>, options: &super::ImportOptions) -> Result<Summary> {
    let path = path.as_ref();
    let bytes =
        std::fs::read(path).map_err(|e| IrError::Onnx(format!("{}: {e}", path.display())))?;
    let model = super::decode_model(&bytes, options)
        .map_err(|e| IrError::Onnx(format!("{}: {e}", path.display())))?;
    let g = model.graph.as_ref().expect("decode_model checked the graph");
    let opsets: Vec<(String, i64)> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(1)))
        .collect();
    let mut ops = BTreeMap::new();
    let mut nodes = 0;
    count_ops(g, &mut ops, &mut nodes);
    let initializers: Vec<&str> = g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let (mut parameters, mut parameter_bytes) = (0usize, 0usize);
    // Saturating: a hostile file may declare dimensions whose product overflows (the import
    // below refuses it, naming the tensor).
    for t in &g.initializer {
        let n = t.dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d.max(0) as usize));
        parameters = parameters.saturating_add(n);
        let size = dtype_of(t.data_type.unwrap_or(0)).map_or(0, |d| d.size());
        parameter_bytes = parameter_bytes.saturating_add(n.saturating_mul(size));
    }
    let declared = |v: &ValueInfoProto| declared_type(v);
    let inputs = g
        .input
        .iter()
        .filter(|i| !initializers.contains(&i.name.as_deref().unwrap_or("")))
        .map(|i| (i.name.clone().unwrap_or_default(), declared(i)))
        .collect();
    let unsupported = check_supported_list(g, &opsets);
    // Imported from the model already decoded: a file is read and decoded once (a model of
    // millions of attributes took as long again to decode a second time).
    let dir = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    let imported = super::import::import_model(&model, dir, options).map_err(|e| match e {
        IrError::Onnx(m) => IrError::Onnx(format!("{}: {m}", path.display())),
        other => other,
    });
    let (outputs, import_error) = match imported {
        Ok(m) => (
            m.graph
                .outputs()
                .iter()
                .map(|(n, v)| (n.clone(), m.graph.value_type(*v).to_string()))
                .collect(),
            None,
        ),
        Err(IrError::Unsupported(_)) => (
            g.output.iter().map(|o| (o.name.clone().unwrap_or_default(), declared(o))).collect(),
            None,
        ),
        Err(e) => (
            g.output.iter().map(|o| (o.name.clone().unwrap_or_default(), declared(o))).collect(),
            Some(e.to_string()),
        ),
    };
    Ok(Summary {
        ir_version: model.ir_version.unwrap_or(0),
        producer: [
            model.producer_name.clone().unwrap_or_default(),
            model.producer_version.clone().unwrap_or_default(),
        ]
        .join(" ")
        .trim()
        .to_string(),
        opsets,
        inputs,
        outputs,
        ops,
        nodes,
        parameters,
        parameter_bytes,
        unsupported,
        import_error,
    })
}

fn count_ops(g: &GraphProto, ops: &mut BTreeMap<String, usize>, nodes: &mut usize) {
    for n in &g.node {
        let domain = n.domain.clone().unwrap_or_default();
        let op = n.op_type.clone().unwrap_or_default();
        let key =
            if domain.is_empty() || domain == "ai.onnx" { op } else { format!("{domain}:{op}") };
        *ops.entry(key).or_default() += 1;
        *nodes += 1;
        for a in &n.attribute {
            for sub in a.g.as_deref().into_iter().chain(&a.graphs) {
                count_ops(sub, ops, nodes);
            }
        }
    }
}

/// A declared type as text: `f32[batch,3]`, or what the value is when it is not a tensor.
fn declared_type(v: &ValueInfoProto) -> String {
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => {
            let dtype = match dtype_of(t.elem_type.unwrap_or(0)) {
                Ok(d) => d.to_string(),
                Err(e) => return e.to_string(),
            };
            match &t.shape {
                None => format!("{dtype}[?] (rank unknown)"),
                Some(s) => {
                    use super::proto::tensor_shape_proto::dimension::Value;
                    let dims: Vec<String> = s
                        .dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(Value::DimValue(n)) => n.to_string(),
                            Some(Value::DimParam(p)) if !p.is_empty() => p.clone(),
                            _ => "?".into(),
                        })
                        .collect();
                    format!("{dtype}[{}]", dims.join(","))
                }
            }
        }
        Some(type_proto::Value::SequenceType(_)) => "a sequence".into(),
        Some(type_proto::Value::MapType(_)) => "a map".into(),
        Some(type_proto::Value::OptionalType(_)) => "an optional".into(),
        Some(type_proto::Value::SparseTensorType(_)) => "a sparse tensor".into(),
        None => "untyped".into(),
    }
}
