//! Graphs from bytes, compiled for the CPU and checked against the interpreter: the compiler's
//! fuzz target (`fuzz/fuzz_targets/compile_diff.rs`, `make fuzz`) and its smoke in the
//! integration tests (`tests/tests/fuzzed.rs`, which replays `fuzz/regressions/compile_diff/`
//! and a fixed set of generated inputs).
//!
//! The bytes choose a few ONNX nodes (ops from the importer's list, operands from the graph's
//! inputs, earlier results or small constants, up to four attributes from the names ops use)
//! over inputs of 0 to 4 elements an axis. A graph that imports with static, modest shapes and
//! that the interpreter runs must compile (or be refused as unsupported), run, and give the
//! interpreter's numbers. One input in eight uses extreme sizes instead (an axis of 2^31, 2^40,
//! 2^62): those are only imported and compiled, which must end in a result or an error, never a
//! crash.

use kiln_compiler::{CompileError, Options};
use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::onnx::testcase::{compare, Tolerance};
use kiln_ir::op::{Attr, Attrs};
use kiln_ir::{DType, Op, Tensor};
use kiln_runtime::{LoadOptions, RuntimeError};
use prost::Message;

/// What one input led to, when kiln behaved.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The compiled program gave the interpreter's outputs.
    Agreed,
    /// Extreme sizes: imported and compiled (or refused) without a crash.
    Survived,
    /// Not a graph both engines take: why (the importer or the interpreter refused it, a shape
    /// is not static or too large to run, the compiler does not support it).
    Skipped(String),
}

/// A kiln bug the input found: a compile error that is not the input's fault, a failed run or
/// different numbers. Panics are bugs too; they propagate.
#[derive(Debug)]
pub struct Bug(pub String);

impl std::fmt::Display for Bug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ops whose results are random or are not meant to agree between engines.
const EXCLUDED: &[&str] = &[
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
];

/// The largest result, in elements, that an input's graph may have to be run.
const MODEST: usize = 1 << 14;

/// Reads choices from the fuzzer's bytes (zeros once they run out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }
    fn pick<'t, T>(&mut self, from: &'t [T]) -> &'t T {
        &from[self.byte() as usize % from.len()]
    }
    /// True one time in `n`.
    fn one_in(&mut self, n: u8) -> bool {
        self.byte().is_multiple_of(n)
    }
    /// A small integer, -3 to 5: axes, counts, flags.
    fn small(&mut self) -> i64 {
        (self.byte() % 9) as i64 - 3
    }
}

const INT_ATTRS: &[&str] = &[
    "axis",
    "keepdims",
    "to",
    "transA",
    "transB",
    "group",
    "k",
    "largest",
    "sorted",
    "select_last_index",
    "exclusive",
    "reverse",
    "upper",
    "blocksize",
    "allowzero",
    "batch_dims",
    "count_include_pad",
    "ceil_mode",
    "p",
    "noop_with_empty_axes",
    "stash_type",
    "detect_negative",
    "detect_positive",
    "num_outputs",
];
const INTS_ATTRS: &[&str] = &[
    "axes",
    "perm",
    "kernel_shape",
    "strides",
    "pads",
    "dilations",
    "shape",
    "split",
    "starts",
    "ends",
];
const FLOAT_ATTRS: &[&str] =
    &["alpha", "beta", "epsilon", "gamma", "bias", "lambd", "min", "max", "scale"];
const STRING_ATTRS: &[(&str, &[&str])] = &[
    ("mode", &["constant", "reflect", "edge", "nearest", "linear", "DCR", "CRD"]),
    ("auto_pad", &["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
    ("reduction", &["none", "add", "mul", "max", "min"]),
    ("equation", &["ij,jk->ik", "ii->i", "i,i", "bij->bji", "...i->i", "ij->"]),
];
/// Element types of inputs: mostly f32, the type kernels are written for.
const ELEM: &[(i32, DType)] = &[
    (data_type::FLOAT, DType::F32),
    (data_type::FLOAT, DType::F32),
    (data_type::FLOAT, DType::F32),
    (data_type::INT64, DType::I64),
    (data_type::INT32, DType::I32),
    (data_type::BOOL, DType::Bool),
];
/// Axis sizes of the extreme inputs.
const EXTREME: &[i64] = &[0, 1, 3, 1 << 20, 1 << 31, (1 << 32) + 1, 1 << 40, 1 << 62];

fn any_attribute(b: &mut Bytes) -> AttributeProto {
    let name = |s: &&str| Some(s.to_string());
    match b.byte() % 4 {
        0 => AttributeProto {
            name: name(b.pick(INT_ATTRS)),
            r#type: Some(attribute_type::INT),
            i: Some(b.small()),
            ..Default::default()
        },
        1 => {
            let n = b.byte() % 5;
            let ints = (0..n).map(|_| b.small()).collect();
            AttributeProto {
                name: name(b.pick(INTS_ATTRS)),
                r#type: Some(attribute_type::INTS),
                ints,
                ..Default::default()
            }
        }
        2 => AttributeProto {
            name: name(b.pick(FLOAT_ATTRS)),
            r#type: Some(attribute_type::FLOAT),
            f: Some(b.small() as f32 * 0.5),
            ..Default::default()
        },
        _ => {
            let &(n, values) = b.pick(STRING_ATTRS);
            let s = b.pick(values).as_bytes().to_vec();
            AttributeProto {
                name: name(&n),
                r#type: Some(attribute_type::STRING),
                s: Some(s),
                ..Default::default()
            }
        }
    }
}

/// Element types an attribute `to` (or `dtype`) may name.
const TYPES: &[i32] = &[
    data_type::FLOAT,
    data_type::INT64,
    data_type::INT32,
    data_type::BOOL,
    data_type::DOUBLE,
    data_type::FLOAT16,
    data_type::INT8,
    data_type::UINT8,
];

/// Values for the attributes an op requires, to find its template with.
fn required() -> Vec<(&'static str, Attr)> {
    vec![
        ("axis", Attr::Int(0)),
        ("to", Attr::Type(DType::F32)),
        ("kernel_shape", Attr::Ints(vec![1, 1])),
        ("kernel_shape", Attr::Ints(vec![1])),
    ]
}

/// The op `name` with ONNX's defaults (or, where it requires one attribute, a value for it):
/// its arity, result count and attributes. None for ops the importer rewrites into others.
fn template(name: &str) -> Option<Op> {
    Op::from_attrs(name, Attrs::new()).ok().or_else(|| {
        required().into_iter().find_map(|(n, v)| {
            let mut a = Attrs::new();
            a.push(n, v);
            Op::from_attrs(name, a).ok()
        })
    })
}

/// Attribute `name` of an op with a new value of its kind (None for kinds not mutated here:
/// tensors, graphs, strings lists).
fn mutated(b: &mut Bytes, name: &str, value: &Attr) -> Option<AttributeProto> {
    let base = AttributeProto { name: Some(name.into()), ..Default::default() };
    Some(match value {
        Attr::Int(d) => {
            // Flags (default 0 or 1) mostly stay flags.
            let i =
                if (0..=1).contains(d) && !b.one_in(4) { (b.byte() % 2) as i64 } else { b.small() };
            AttributeProto { r#type: Some(attribute_type::INT), i: Some(i), ..base }
        }
        Attr::Type(_) => AttributeProto {
            r#type: Some(attribute_type::INT),
            i: Some(*b.pick(TYPES) as i64),
            ..base
        },
        Attr::Ints(v) => {
            // Mostly as long as the default (one per axis), sometimes another length.
            let n = if v.is_empty() || b.one_in(4) { (b.byte() % 5) as usize } else { v.len() };
            let ints = (0..n).map(|_| b.small()).collect();
            AttributeProto { r#type: Some(attribute_type::INTS), ints, ..base }
        }
        Attr::Float(_) => AttributeProto {
            r#type: Some(attribute_type::FLOAT),
            f: Some(b.small() as f32 * 0.5),
            ..base
        },
        Attr::Floats(v) => {
            let floats = (0..v.len().max(1)).map(|_| b.small() as f32 * 0.5).collect();
            AttributeProto { r#type: Some(attribute_type::FLOATS), floats, ..base }
        }
        Attr::Str(_) => {
            let values = STRING_ATTRS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)?;
            AttributeProto {
                r#type: Some(attribute_type::STRING),
                s: Some(b.pick(values).as_bytes().to_vec()),
                ..base
            }
        }
        _ => return None,
    })
}

fn value_info(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d)) })
        .collect();
    let ty = TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(TensorShapeProto { dim }),
        })),
    };
    ValueInfoProto { name: Some(name.into()), r#type: Some(ty) }
}

/// An ONNX model the bytes describe, the inputs to run it on (none for an extreme one), and
/// whether it is extreme.
pub struct Case {
    pub model: Vec<u8>,
    pub feeds: Vec<Tensor>,
    pub extreme: bool,
    pub threads: usize,
}

/// Builds the model the bytes describe.
pub fn case(data: &[u8]) -> Case {
    let b = &mut Bytes(data);
    let extreme = b.one_in(8);
    let threads = 1 + (b.byte() % 2) as usize;
    let ops: Vec<&str> = kiln_ir::onnx::supported_ops()
        .iter()
        .copied()
        .filter(|op| !EXCLUDED.contains(op))
        .collect();
    let (mut inputs, mut initializers, mut feeds) = (Vec::new(), Vec::new(), Vec::new());
    let mut values: Vec<String> = Vec::new();
    for i in 0..1 + b.byte() % 2 {
        let name = format!("x{i}");
        // The first input is f32, the type most ops take.
        let &(elem, dtype) = if i == 0 || b.one_in(2) { &ELEM[0] } else { b.pick(ELEM) };
        let rank = b.byte() % 4;
        let dims: Vec<i64> = (0..rank)
            .map(|_| if extreme { *b.pick(EXTREME) } else { (b.byte() % 5) as i64 })
            .collect();
        inputs.push(value_info(&name, elem, &dims));
        if !extreme {
            let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            feeds.push(Tensor::random(dtype, &dims, 17 + i as u64));
        }
        values.push(name);
    }
    let mut nodes = Vec::new();
    for n in 0..1 + b.byte() % 3 {
        let op = b.pick(&ops).to_string();
        // The op's own arity and attributes (with ONNX's defaults), when it has no required
        // attribute: most inputs then import, and mutations start from what the op takes.
        let template = template(&op);
        let count = match &template {
            Some(t) => {
                let (min, max) = t.arity();
                let max = max.min(min + 2).max(min);
                min + b.byte() as usize % (max - min + 1)
            }
            None => 1 + (b.byte() % 3) as usize,
        };
        let mut operands = Vec::new();
        for k in 0..count {
            match if k == 0 { 2 } else { b.byte() % 4 } {
                // A small i64 constant of rank 0 or 1: shapes, axes, counts, indices.
                0 => {
                    let name = format!("c{n}_{k}");
                    let len = b.byte() % 4;
                    let rank1 = len > 0 || b.one_in(2);
                    let values: Vec<i64> = (0..len.max(1)).map(|_| b.small()).collect();
                    initializers.push(TensorProto {
                        name: Some(name.clone()),
                        dims: if rank1 { vec![values.len() as i64] } else { vec![] },
                        data_type: Some(data_type::INT64),
                        int64_data: values,
                        ..Default::default()
                    });
                    operands.push(name);
                }
                // An operand left out (optional operands).
                1 if k > 0 && b.one_in(4) => operands.push(String::new()),
                _ => operands.push(b.pick(&values).clone()),
            }
        }
        let template_known = template.as_ref().map(|t| t.default_num_outputs());
        let known: Vec<(String, Attr)> = template.map(|t| t.attrs().0).unwrap_or_default();
        let mut attribute: Vec<AttributeProto> = Vec::new();
        for _ in 0..b.byte() % 4 {
            // Mostly the op's own attributes; now and then any name (which the importer must
            // refuse cleanly), always when kiln has no template for the op.
            let a = if template_known.is_none() || b.one_in(32) {
                Some(any_attribute(b))
            } else if known.is_empty() {
                None
            } else {
                let (name, value) = b.pick(&known);
                mutated(b, name, value)
            };
            // One value a name: a repeated attribute is refused by the importer.
            if let Some(a) = a.filter(|a| attribute.iter().all(|o| o.name != a.name)) {
                attribute.push(a);
            }
        }
        // The op's own result count, now and then one more.
        let results = template_known.unwrap_or(1) + (b.one_in(16)) as usize;
        let outputs: Vec<String> = (0..results).map(|k| format!("n{n}_{k}")).collect();
        nodes.push(NodeProto {
            op_type: Some(op),
            name: Some(format!("n{n}")),
            input: operands,
            output: outputs.clone(),
            attribute,
            domain: None,
        });
        values.extend(outputs);
    }
    // The last node's results, and one earlier value (an intermediate the program must keep).
    let last = nodes.last().map(|n| n.output.clone()).unwrap_or_default();
    let mut outs = last;
    let extra = b.pick(&values).clone();
    if !outs.contains(&extra) && !inputs.iter().any(|i| i.name.as_deref() == Some(&extra)) {
        outs.push(extra);
    }
    let output =
        outs.iter().map(|n| ValueInfoProto { name: Some(n.clone()), r#type: None }).collect();
    let graph = GraphProto {
        name: Some("fuzzed".into()),
        node: nodes,
        input: inputs,
        output,
        initializer: initializers,
        ..Default::default()
    };
    let opset = 13 + (b.byte() % 15) as i64;
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    Case { model: m.encode_to_vec(), feeds, extreme, threads }
}

/// Whether a compile error is the input's (kiln does not support it, or refuses its sizes),
/// not a kiln bug.
fn refused(e: &CompileError) -> bool {
    match e {
        CompileError::Unsupported { .. }
        | CompileError::DynamicShapes(_)
        | CompileError::RuntimeSequence { .. }
        | CompileError::StorageType { .. }
        | CompileError::NotBatchable { .. }
        | CompileError::Precision { .. } => true,
        // The passes re-check what they build; the importer already checked the graph, so these
        // are refusals of sizes (budgets, tables) or unsupported attributes, kept as errors.
        CompileError::Ir(_) => true,
        CompileError::Runtime(RuntimeError::Memory { .. }) => true,
        _ => false,
    }
}

/// Builds the bytes' graph, runs it on the interpreter and compiled for the CPU, and compares.
pub fn check(data: &[u8]) -> Result<Verdict, Bug> {
    let case = case(data);
    let model = match kiln_ir::onnx::load_bytes(&case.model, None) {
        Ok(m) => m,
        Err(e) => return Ok(Verdict::Skipped(format!("import: {e}"))),
    };
    let graph = &model.graph;
    if std::env::var_os("KILN_FUZZ_PRINT").is_some() {
        eprintln!("{graph}");
    }
    let options = Options { cache: false, ..Options::default() };
    let load = LoadOptions { threads: Some(case.threads), ..Default::default() };
    if case.extreme {
        // Sizes too large to run: compiling must still end in a result or an error.
        return match kiln_compiler::jit(graph, &options, &load) {
            Ok(_) => Ok(Verdict::Survived),
            Err(e) if refused(&e) => Ok(Verdict::Survived),
            Err(CompileError::Runtime(_)) => Ok(Verdict::Survived),
            Err(e) => Err(Bug(format!("compiling an extreme graph: {}\n{graph}", e.chain()))),
        };
    }
    let modest = graph
        .nodes()
        .all(|(_, n)| n.outputs.iter().all(|t| t.shape.numel().is_some_and(|e| e <= MODEST)));
    if !modest {
        return Ok(Verdict::Skipped("a result is not static or too large to run".into()));
    }
    let want = match kiln_ir::eval::run(graph, &case.feeds) {
        Ok(w) => w,
        Err(e) => return Ok(Verdict::Skipped(format!("the interpreter: {e}"))),
    };
    let exe = match kiln_compiler::jit(graph, &options, &load) {
        Ok(exe) => exe,
        Err(e) if refused(&e) => return Ok(Verdict::Skipped(format!("compile: {}", e.chain()))),
        Err(e) => return Err(Bug(format!("compile: {}\n{graph}", e.chain()))),
    };
    // The executable's inputs by name (compilation may drop one nothing reads).
    let names: Vec<&str> = graph.inputs().iter().map(|&id| graph.node(id).name.as_str()).collect();
    let feeds: Vec<Tensor> = exe
        .inputs()
        .iter()
        .map(|d| {
            names.iter().position(|n| *n == d.name).map(|i| case.feeds[i].clone()).ok_or_else(
                || Bug(format!("the executable takes `{}`, not an input of the graph", d.name)),
            )
        })
        .collect::<Result<_, _>>()?;
    let got = exe.run(&feeds).map_err(|e| Bug(format!("run: {e}\n{graph}")))?;
    let tol = Tolerance { rtol: 1e-3, atol: 1e-4 };
    for ((name, _), w) in graph.outputs().iter().zip(&want) {
        let i = exe
            .outputs()
            .iter()
            .position(|d| &d.name == name)
            .ok_or_else(|| Bug(format!("output `{name}` is missing from the executable")))?;
        compare(w, &got[i], tol).map_err(|e| Bug(format!("output `{name}`: {e}\n{graph}")))?;
    }
    Ok(Verdict::Agreed)
}
