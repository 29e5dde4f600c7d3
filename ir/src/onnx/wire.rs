//! What decoding a message will take in memory, read from its protobuf wire format before prost
//! allocates anything.
//!
//! A message's size on the wire says little about its size in memory: an empty attribute is 2
//! bytes in a file and an `AttributeProto` of 256 bytes once decoded (1224 before its
//! sub-messages were boxed), so a 10 MB model of 5 million of them took 6.4 GB to decode. This
//! scan walks the same fields prost decodes ([`super::proto`]'s, mirrored in [`Msg::field`]),
//! adds up the structs and heap bytes each will take, and counts them, in one pass over the
//! bytes that skips payloads (a tensor's `raw_data`) by their length. `decode_model` refuses a
//! model whose sum exceeds the memory budget, naming what there is too much of.
//!
//! The scan is as lenient as prost: a field it does not know, or of an unexpected wire type, is
//! skipped (prost skips the first and refuses the second), and bytes it cannot read end the scan
//! with no estimate, leaving prost to report them.

use std::mem::size_of;

use super::proto;

/// The protobuf messages kiln decodes (the model's tree; test data's sequences and optionals
/// are not read through here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Msg {
    Model,
    OpsetId,
    Function,
    Graph,
    Node,
    Attribute,
    ValueInfo,
    Type,
    TypeTensor,
    TypeSequence,
    TypeMap,
    Shape,
    Dimension,
    Tensor,
    SparseTensor,
    Entry,
}

const MSGS: usize = Msg::Entry as usize + 1;

/// How a field is held once decoded.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// An optional number: inline in its message.
    Scalar,
    /// A repeated number of `size` bytes in memory; `fixed`: as many bytes on the wire (float,
    /// double), else a varint.
    Numbers { size: u64, fixed: bool },
    /// An optional string or bytes: its bytes on the heap.
    Bytes,
    /// A repeated string or bytes: a `Vec`'s 24 bytes and its bytes on the heap, each.
    ListOfBytes,
    /// A message held inline (`Option<T>` or a oneof's variant): only what it holds.
    Inline(Msg),
    /// A repeated or boxed message: its own struct, and what it holds.
    Own(Msg),
}

impl Msg {
    /// The decoded struct's size in memory.
    fn size(self) -> u64 {
        (match self {
            Msg::Model => size_of::<proto::ModelProto>(),
            Msg::OpsetId => size_of::<proto::OperatorSetIdProto>(),
            Msg::Function => size_of::<proto::FunctionProto>(),
            Msg::Graph => size_of::<proto::GraphProto>(),
            Msg::Node => size_of::<proto::NodeProto>(),
            Msg::Attribute => size_of::<proto::AttributeProto>(),
            Msg::ValueInfo => size_of::<proto::ValueInfoProto>(),
            Msg::Type => size_of::<proto::TypeProto>(),
            Msg::TypeTensor => size_of::<proto::type_proto::Tensor>(),
            Msg::TypeSequence => size_of::<proto::type_proto::Sequence>(),
            Msg::TypeMap => size_of::<proto::type_proto::Map>(),
            Msg::Shape => size_of::<proto::TensorShapeProto>(),
            Msg::Dimension => size_of::<proto::tensor_shape_proto::Dimension>(),
            Msg::Tensor => size_of::<proto::TensorProto>(),
            Msg::SparseTensor => size_of::<proto::SparseTensorProto>(),
            Msg::Entry => size_of::<proto::StringStringEntryProto>(),
        }) as u64
    }

    /// What a user calls many of them.
    fn plural(self) -> &'static str {
        match self {
            Msg::Model => "models",
            Msg::OpsetId => "opset imports",
            Msg::Function => "functions",
            Msg::Graph => "graphs",
            Msg::Node => "nodes",
            Msg::Attribute => "attributes",
            Msg::ValueInfo => "value infos",
            Msg::Type | Msg::TypeTensor | Msg::TypeSequence | Msg::TypeMap => "types",
            Msg::Shape => "shapes",
            Msg::Dimension => "dimensions",
            Msg::Tensor => "tensors",
            Msg::SparseTensor => "sparse tensors",
            Msg::Entry => "external data entries",
        }
    }

    /// How field `tag` of this message is held: `proto.rs`'s fields, which this must follow (a
    /// field missing here is skipped, as prost skips one the structs lack, so a sub-message
    /// added there and not here goes uncounted).
    fn field(self, tag: u32) -> Option<Field> {
        use Field::*;
        const I64S: Field = Numbers { size: 8, fixed: false };
        Some(match (self, tag) {
            (Msg::Model, 1 | 5) => Scalar,
            (Msg::Model, 2 | 3 | 4 | 6) => Bytes,
            (Msg::Model, 7) => Inline(Msg::Graph),
            (Msg::Model, 8) => Own(Msg::OpsetId),
            (Msg::Model, 25) => Own(Msg::Function),
            (Msg::OpsetId, 1) => Bytes,
            (Msg::OpsetId, 2) => Scalar,
            (Msg::Function, 1 | 10) => Bytes,
            (Msg::Graph, 1) => Own(Msg::Node),
            (Msg::Graph, 2) => Bytes,
            (Msg::Graph, 5) => Own(Msg::Tensor),
            (Msg::Graph, 15) => Own(Msg::SparseTensor),
            (Msg::Graph, 11..=13) => Own(Msg::ValueInfo),
            (Msg::Node, 1 | 2) => ListOfBytes,
            (Msg::Node, 3 | 4 | 7) => Bytes,
            (Msg::Node, 5) => Own(Msg::Attribute),
            (Msg::Attribute, 1 | 4 | 21) => Bytes,
            (Msg::Attribute, 2 | 3 | 20) => Scalar,
            (Msg::Attribute, 5 | 10) => Own(Msg::Tensor),
            (Msg::Attribute, 6 | 11) => Own(Msg::Graph),
            (Msg::Attribute, 7) => Numbers { size: 4, fixed: true },
            (Msg::Attribute, 8) => I64S,
            (Msg::Attribute, 9) => ListOfBytes,
            (Msg::Attribute, 14) => Own(Msg::Type),
            (Msg::Attribute, 22) => Own(Msg::SparseTensor),
            (Msg::ValueInfo, 1) => Bytes,
            (Msg::ValueInfo, 2) => Inline(Msg::Type),
            (Msg::Type, 1 | 8) => Inline(Msg::TypeTensor),
            (Msg::Type, 4 | 9) => Inline(Msg::TypeSequence),
            (Msg::Type, 5) => Inline(Msg::TypeMap),
            (Msg::TypeTensor, 1) => Scalar,
            (Msg::TypeTensor, 2) => Inline(Msg::Shape),
            (Msg::TypeSequence, 1) => Own(Msg::Type),
            (Msg::TypeMap, 1) => Scalar,
            (Msg::Shape, 1) => Own(Msg::Dimension),
            (Msg::Dimension, 1) => Scalar,
            (Msg::Dimension, 2) => Bytes,
            (Msg::Tensor, 1 | 7 | 11) => I64S,
            (Msg::Tensor, 2 | 14) => Scalar,
            (Msg::Tensor, 4) => Numbers { size: 4, fixed: true },
            (Msg::Tensor, 5) => Numbers { size: 4, fixed: false },
            (Msg::Tensor, 6) => ListOfBytes,
            (Msg::Tensor, 8 | 9) => Bytes,
            (Msg::Tensor, 10) => Numbers { size: 8, fixed: true },
            (Msg::Tensor, 13) => Own(Msg::Entry),
            (Msg::SparseTensor, 1 | 2) => Own(Msg::Tensor),
            (Msg::SparseTensor, 3) => I64S,
            (Msg::Entry, 1 | 2) => Bytes,
            _ => return None,
        })
    }
}

/// What decoding a message will hold in memory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Estimate {
    /// Every struct and heap allocation, in bytes (allocator overhead and `Vec`s' spare
    /// capacity left out).
    pub bytes: u64,
    /// How many of each message, and the bytes of their structs.
    counts: [(u64, u64); MSGS],
    /// The node with the most attributes: (attributes, its name or first output, its op type).
    busiest: Option<(u64, String, String)>,
}

impl Estimate {
    /// What there is most of, by memory: `5000000 attributes (1.2 GiB; 5000000 on node `y`
    /// (Relu))`.
    pub fn largest_part(&self) -> String {
        let (i, &(n, bytes)) =
            self.counts.iter().enumerate().max_by_key(|(_, (_, b))| *b).expect("MSGS is not empty");
        let msg = ALL[i];
        let mut out = format!("{n} {} ({}", msg.plural(), crate::memory::human(bytes));
        if let (Msg::Attribute, Some((k, name, op))) = (msg, &self.busiest) {
            out += &format!("; {k} on node `{name}` ({op})");
        }
        out + ")"
    }

    /// How many `msg` messages the bytes hold (tests).
    #[cfg(test)]
    fn count(&self, msg: Msg) -> u64 {
        self.counts[msg as usize].0
    }
}

const ALL: [Msg; MSGS] = [
    Msg::Model,
    Msg::OpsetId,
    Msg::Function,
    Msg::Graph,
    Msg::Node,
    Msg::Attribute,
    Msg::ValueInfo,
    Msg::Type,
    Msg::TypeTensor,
    Msg::TypeSequence,
    Msg::TypeMap,
    Msg::Shape,
    Msg::Dimension,
    Msg::Tensor,
    Msg::SparseTensor,
    Msg::Entry,
];

/// What decoding `bytes` as a `root` message will take; `None` when the bytes are not a
/// well-formed message (prost reports what is wrong).
pub(crate) fn estimate(bytes: &[u8], root: Msg) -> Option<Estimate> {
    let mut scan = Scan { bytes: root.size(), counts: [(0, 0); MSGS], busiest: None };
    scan.counts[root as usize] = (1, root.size());
    scan.message(bytes, root, 0)?;
    Some(Estimate {
        bytes: scan.bytes,
        counts: scan.counts,
        busiest: scan.busiest.map(|(k, name, op)| {
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (k, text(name), text(op))
        }),
    })
}

/// prost's nesting limit (`RECURSION_LIMIT`), plus one: the scan gives up only where prost
/// does, so every message prost decodes is counted.
const DEPTH_LIMIT: u32 = 101;

struct Scan<'a> {
    bytes: u64,
    counts: [(u64, u64); MSGS],
    busiest: Option<(u64, &'a [u8], &'a [u8])>,
}

impl<'a> Scan<'a> {
    fn add(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
    }

    /// Scans the fields of one `msg` in `buf`.
    fn message(&mut self, mut buf: &'a [u8], msg: Msg, depth: u32) -> Option<()> {
        if depth > DEPTH_LIMIT {
            return None;
        }
        // For the busiest node: its attributes, name, first output and op type.
        let (mut attributes, mut name, mut output, mut op): (u64, &[u8], &[u8], &[u8]) =
            (0, b"", b"", b"");
        while !buf.is_empty() {
            let key = varint(&mut buf)?;
            let (tag, wire) = (u32::try_from(key >> 3).ok()?, (key & 7) as u8);
            if tag == 0 {
                return None;
            }
            let field = msg.field(tag);
            if wire != 2 {
                skip(&mut buf, wire, tag, depth)?;
                // A number given one by one (unpacked) is one element.
                if let Some(Field::Numbers { size, .. }) = field {
                    self.add(size);
                }
                continue;
            }
            let len = usize::try_from(varint(&mut buf)?).ok()?;
            if len > buf.len() {
                return None;
            }
            let (payload, rest) = buf.split_at(len);
            buf = rest;
            match field {
                None | Some(Field::Scalar) => {}
                Some(Field::Numbers { size, fixed }) => {
                    let n = if fixed {
                        (len as u64) / size
                    } else {
                        // One varint ends at each byte without its high bit.
                        payload.iter().filter(|&&b| b < 0x80).count() as u64
                    };
                    self.add(n.saturating_mul(size));
                }
                Some(Field::Bytes) => self.add(len as u64),
                Some(Field::ListOfBytes) => self.add(24 + len as u64),
                Some(Field::Inline(m)) => self.message(payload, m, depth + 1)?,
                Some(Field::Own(m)) => {
                    let c = &mut self.counts[m as usize];
                    *c = (c.0 + 1, c.1.saturating_add(m.size()));
                    self.add(m.size());
                    self.message(payload, m, depth + 1)?;
                    attributes += u64::from(m == Msg::Attribute);
                }
            }
            if msg == Msg::Node {
                match tag {
                    2 if output.is_empty() => output = payload,
                    3 => name = payload,
                    4 => op = payload,
                    _ => {}
                }
            }
        }
        if msg == Msg::Node && self.busiest.as_ref().is_none_or(|(k, _, _)| attributes > *k) {
            let label = if !name.is_empty() { name } else { output };
            self.busiest = Some((attributes, label, op));
        }
        Some(())
    }
}

/// Reads a varint (at most 10 bytes).
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// Skips a field of wire type `wire` (not 2) as prost does, groups included.
fn skip(buf: &mut &[u8], wire: u8, tag: u32, depth: u32) -> Option<()> {
    let n = match wire {
        0 => return varint(buf).map(|_| ()),
        1 => 8,
        5 => 4,
        3 => {
            if depth > DEPTH_LIMIT {
                return None;
            }
            loop {
                let key = varint(buf)?;
                let (inner, inner_wire) = (u32::try_from(key >> 3).ok()?, (key & 7) as u8);
                match inner_wire {
                    4 if inner == tag => return Some(()),
                    4 => return None,
                    2 => {
                        let len = usize::try_from(varint(buf)?).ok()?;
                        *buf = buf.get(len..)?;
                    }
                    w => skip(buf, w, inner, depth + 1)?,
                }
            }
        }
        _ => return None,
    };
    *buf = buf.get(n..)?;
    Some(())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::onnx::proto::*;

    fn model(graph: GraphProto) -> Vec<u8> {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto { domain: None, version: Some(17) }],
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A node of `n` empty attributes: 2 bytes each on the wire.
    fn empty_attributes(n: usize) -> Vec<u8> {
        model(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into()],
                output: vec!["y".into()],
                op_type: Some("Relu".into()),
                attribute: vec![AttributeProto::default(); n],
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    #[test]
    fn no_message_is_more_than_128_times_its_smallest_encoding() {
        // An empty message is 2 bytes on the wire (its key and a length of 0), and each string,
        // bytes or number at most 24 times its: so a decode takes at most 128 times the file.
        // Inline, an attribute's tensor, graph, sparse tensor and type made it 1224 bytes.
        // The model is the root, once (its graph inline).
        for m in ALL.into_iter().filter(|&m| m != Msg::Model) {
            assert!(m.size() <= 256, "{m:?} is {} bytes in memory", m.size());
        }
        assert_eq!(Msg::Attribute.size(), 256);
    }

    #[test]
    fn empty_attributes_are_counted_with_their_node() {
        let bytes = empty_attributes(1000);
        let e = estimate(&bytes, Msg::Model).expect("well formed");
        assert_eq!(e.count(Msg::Attribute), 1000);
        assert_eq!(e.count(Msg::Node), 1);
        assert!(e.bytes >= 1000 * size_of::<AttributeProto>() as u64, "{}", e.bytes);
        assert!(e.bytes < 1000 * size_of::<AttributeProto>() as u64 + 4096, "{}", e.bytes);
        assert_eq!(
            e.largest_part(),
            format!(
                "1000 attributes ({}; 1000 on node `y` (Relu))",
                crate::memory::human(1000 * size_of::<AttributeProto>() as u64)
            )
        );
    }

    #[test]
    fn every_message_and_number_is_counted() {
        let tensor = TensorProto {
            dims: vec![2, 3],
            data_type: Some(data_type::FLOAT),
            float_data: vec![1.0; 6],
            int64_data: vec![1, 300, 70000],
            string_data: vec![b"abc".to_vec()],
            raw_data: Some(vec![0; 1000]),
            external_data: vec![StringStringEntryProto::default(); 2],
            ..Default::default()
        };
        let ty = TypeProto {
            value: Some(type_proto::Value::SequenceType(type_proto::Sequence {
                elem_type: Some(Box::new(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: Some(1),
                        shape: Some(TensorShapeProto {
                            dim: vec![tensor_shape_proto::Dimension::default(); 3],
                        }),
                    })),
                })),
            })),
        };
        let inner = GraphProto { node: vec![NodeProto::default(); 2], ..Default::default() };
        let attribute = AttributeProto {
            t: Some(Box::new(tensor.clone())),
            g: Some(Box::new(inner.clone())),
            sparse_tensor: Some(Box::new(SparseTensorProto {
                values: Some(Box::new(tensor.clone())),
                indices: Some(Box::new(TensorProto::default())),
                dims: vec![4],
            })),
            tensors: vec![tensor.clone()],
            graphs: vec![inner],
            tp: Some(Box::new(ty.clone())),
            ints: vec![1, 2, 3],
            floats: vec![1.0, 2.0],
            ..Default::default()
        };
        let graph = GraphProto {
            node: vec![NodeProto { attribute: vec![attribute; 2], ..Default::default() }],
            initializer: vec![tensor],
            sparse_initializer: vec![SparseTensorProto::default()],
            input: vec![ValueInfoProto { name: None, r#type: Some(ty) }],
            ..Default::default()
        };
        let bytes = model(graph);
        let e = estimate(&bytes, Msg::Model).expect("well formed");
        // 1 in the graph, 2 in each attribute's `g` and `graphs`.
        assert_eq!(e.count(Msg::Node), 1 + 2 * 4);
        assert_eq!(e.count(Msg::Graph), 2 * 2);
        assert_eq!(e.count(Msg::Attribute), 2);
        // The initializer, and in each attribute `t`, `tensors`, and the sparse tensor's two.
        assert_eq!(e.count(Msg::Tensor), 1 + 2 * 4);
        assert_eq!(e.count(Msg::SparseTensor), 1 + 2);
        assert_eq!(e.count(Msg::Entry), 2 * (1 + 2 * 3));
        // Each attribute's boxed `tp`, and the boxed element type of each sequence type (the
        // input's, each attribute's).
        assert_eq!(e.count(Msg::Type), 2 + (1 + 2));
        assert_eq!(e.count(Msg::Dimension), 3 * 3);
        // Each of the 7 tensors with data holds its 1000 raw bytes, 6 floats and 3 int64s.
        assert!(e.bytes >= 7 * (1000 + 6 * 4 + 3 * 8), "{}", e.bytes);
        // Truncated, it is not well formed.
        assert_eq!(estimate(&bytes[..bytes.len() - 1], Msg::Model), None);
    }

    #[test]
    fn unknown_fields_and_groups_are_skipped_as_prost_skips_them() {
        let mut bytes = empty_attributes(3);
        // Field 99 as a group holding a varint and a length-delimited field, then a fixed32.
        bytes
            .extend([0x9b, 0x06, 0x08, 0x01, 0x12, 0x01, 0x00, 0x9c, 0x06, 0x9d, 0x06, 0, 0, 0, 0]);
        assert!(ModelProto::decode(&bytes[..]).is_ok());
        assert_eq!(estimate(&bytes, Msg::Model).map(|e| e.count(Msg::Attribute)), Some(3));
        // A group that never ends is not.
        bytes.truncate(bytes.len() - 8);
        assert!(ModelProto::decode(&bytes[..]).is_err());
        assert_eq!(estimate(&bytes, Msg::Model), None);
    }
}
