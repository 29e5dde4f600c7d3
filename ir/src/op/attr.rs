//! A generic view of op attributes: what the text form prints and parses, and what importers
//! produce. `Op::attrs` and `Op::from_attrs` convert between it and the typed variants.

use std::fmt;

use super::*;
use crate::{DType, Tensor};

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Str(String),
    Type(DType),
    Tensor(Tensor),
    Strs(Vec<String>),
    Graph(Subgraph),
}

impl Attr {
    fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) => "an integer",
            Attr::Float(_) => "a float",
            Attr::Ints(_) => "a list of integers",
            Attr::Floats(_) => "a list of floats",
            Attr::Str(_) => "a string",
            Attr::Type(_) => "a type",
            Attr::Tensor(_) => "a tensor",
            Attr::Strs(_) => "a list of strings",
            Attr::Graph(_) => "a graph",
        }
    }
}

/// An ordered list of named attributes that is consumed by name; leftovers are an error, so a
/// misspelt attribute never passes silently.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(pub Vec<(String, Attr)>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    pub fn push(&mut self, name: &str, value: Attr) {
        self.0.push((name.to_string(), value));
    }

    /// Removes and returns the attribute `name`, if present.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        self.take(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// Sets `name` to `value`, replacing any earlier value.
    pub fn set(&mut self, name: &str, value: Attr) {
        self.take(name);
        self.push(name, value);
    }

    fn take(&mut self, name: &str) -> Option<Attr> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }

    fn wrong(name: &str, want: &str, got: &Attr) -> String {
        format!("attribute `{name}` must be {want}, got {}", got.kind())
    }

    pub fn int(&mut self, name: &str, default: i64) -> Result<i64, String> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn required_int(&mut self, name: &str) -> Result<i64, String> {
        match self.take(name) {
            None => Err(format!("attribute `{name}` is required")),
            Some(Attr::Int(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    pub fn size(&mut self, name: &str, default: usize) -> Result<usize, String> {
        let v = self.int(name, default as i64)?;
        usize::try_from(v).map_err(|_| format!("attribute `{name}` must not be negative, got {v}"))
    }

    pub fn flag(&mut self, name: &str, default: bool) -> Result<bool, String> {
        match self.int(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("attribute `{name}` must be 0 or 1, got {v}")),
        }
    }

    pub fn float(&mut self, name: &str, default: f32) -> Result<f32, String> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(v),
            Some(Attr::Int(v)) => Ok(v as f32),
            Some(a) => Err(Self::wrong(name, "a float", &a)),
        }
    }

    pub fn ints(&mut self, name: &str) -> Result<Option<Vec<i64>>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a list of integers", &a)),
        }
    }

    pub fn sizes(&mut self, name: &str) -> Result<Vec<usize>, String> {
        let v = self.ints(name)?.unwrap_or_default();
        v.iter().map(|&x| usize::try_from(x).map_err(|_| format!("attribute `{name}` must not hold negative values, got {x}"))).collect()
    }

    pub fn floats(&mut self, name: &str) -> Result<Option<Vec<f32>>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v)),
            // An empty list prints the same whatever its element type.
            Some(Attr::Ints(v)) => Ok(Some(v.iter().map(|&x| x as f32).collect())),
            Some(a) => Err(Self::wrong(name, "a list of floats", &a)),
        }
    }

    pub fn strings(&mut self, name: &str) -> Result<Option<Vec<String>>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Strs(v)) => Ok(Some(v)),
            Some(Attr::Ints(v)) if v.is_empty() => Ok(Some(Vec::new())),
            Some(a) => Err(Self::wrong(name, "a list of strings", &a)),
        }
    }

    pub fn graph(&mut self, name: &str) -> Result<Subgraph, String> {
        match self.take(name) {
            None => Err(format!("attribute `{name}` is required")),
            Some(Attr::Graph(g)) => Ok(g),
            Some(a) => Err(Self::wrong(name, "a graph", &a)),
        }
    }

    /// An optional type attribute.
    pub fn opt_dtype(&mut self, name: &str) -> Result<Option<DType>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Type(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a type", &a)),
        }
    }

    /// An optional integer attribute.
    pub fn opt_int(&mut self, name: &str) -> Result<Option<i64>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "an integer", &a)),
        }
    }

    /// An optional float attribute.
    pub fn opt_float(&mut self, name: &str) -> Result<Option<f32>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(v)),
            Some(Attr::Int(v)) => Ok(Some(v as f32)),
            Some(a) => Err(Self::wrong(name, "a float", &a)),
        }
    }

    /// A string attribute naming one variant of a named enum.
    pub fn named<T>(&mut self, name: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> Result<T, String> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Str(s)) => parse(&s).ok_or_else(|| format!("attribute `{name}` has the unknown value `{s}`")),
            Some(a) => Err(Self::wrong(name, "a string", &a)),
        }
    }

    pub fn string(&mut self, name: &str, default: &str) -> Result<String, String> {
        match self.take(name) {
            None => Ok(default.to_string()),
            Some(Attr::Str(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a string", &a)),
        }
    }

    pub fn dtype(&mut self, name: &str) -> Result<DType, String> {
        match self.take(name) {
            None => Err(format!("attribute `{name}` is required")),
            Some(Attr::Type(v)) => Ok(v),
            Some(a) => Err(Self::wrong(name, "a type", &a)),
        }
    }

    pub fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, String> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Tensor(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, "a tensor", &a)),
        }
    }

    /// Fails if any attribute was not consumed.
    pub fn finish(self, op: &str) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some((n, _)) => Err(format!("{op} has no attribute `{n}`")),
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T>(f: &mut fmt::Formatter<'_>, v: &[T], each: impl Fn(&T) -> String) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(&each(x))?;
            }
            f.write_str("]")
        }
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => f.write_str(&float_literal(*v as f64, true)),
            Attr::Ints(v) => list(f, v, |x| x.to_string()),
            Attr::Floats(v) => list(f, v, |x| float_literal(*x as f64, true)),
            Attr::Str(v) => write!(f, "{v:?}"),
            Attr::Type(v) => write!(f, "{v}"),
            Attr::Tensor(t) => f.write_str(&crate::text::tensor_literal(t, true)),
            Attr::Strs(v) => list(f, v, |x| format!("{x:?}")),
            Attr::Graph(g) => f.write_str(crate::text::print(&g.0, crate::text::Weights::Full).trim_end()),
        }
    }
}

/// A float that parses back to the same value and reads as a float (`1.0`, not `1`).
/// `as_f32`: print the shortest form that round-trips through f32.
pub(crate) fn float_literal(v: f64, as_f32: bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = if as_f32 { format!("{:?}", v as f32) } else { format!("{v:?}") };
    s
}

/// Prints an RNN activation as ONNX names it, with its parameters: `LeakyRelu(0.1)`.
fn activation_text(u: &UnaryOp) -> String {
    let params: Vec<String> = u.attrs_list().into_iter().map(|(_, v)| float_literal(v as f64, true)).collect();
    if params.is_empty() {
        u.name().to_string()
    } else {
        format!("{}({})", u.name(), params.join(", "))
    }
}

fn activation_from_text(s: &str) -> Result<UnaryOp, String> {
    let (name, params) = match s.find('(') {
        Some(i) if s.ends_with(')') => (
            &s[..i],
            s[i + 1..s.len() - 1]
                .split(',')
                .map(|p| p.trim().parse::<f32>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("bad activation `{s}`"))?,
        ),
        _ => (s, Vec::new()),
    };
    let u = UnaryOp::from_name(name).ok_or_else(|| format!("unknown activation `{name}`"))?;
    let mut a = Attrs::new();
    for ((key, _), v) in u.attrs_list().into_iter().zip(params) {
        a.push(key, Attr::Float(v));
    }
    match Op::from_attrs(name, a)? {
        Op::Unary(u) => Ok(u),
        _ => Err(format!("`{name}` is not an activation")),
    }
}

/// How one typed attribute field is read from and written to [`Attrs`]: the op tables
/// (`elementwise.rs`) name a codec per field, so reading and writing cannot disagree.
pub(crate) trait AttrCodec<T> {
    /// The attribute `name`, or `default` when it is absent.
    fn read(a: &mut Attrs, name: &str, default: T) -> Result<T, String>;
    fn write(v: T) -> Attr;
}

/// A float attribute.
pub(crate) struct Float;

impl AttrCodec<f32> for Float {
    fn read(a: &mut Attrs, name: &str, default: f32) -> Result<f32, String> {
        a.float(name, default)
    }

    fn write(v: f32) -> Attr {
        Attr::Float(v)
    }
}

/// A 0/1 integer attribute.
pub(crate) struct Flag;

impl AttrCodec<bool> for Flag {
    fn read(a: &mut Attrs, name: &str, default: bool) -> Result<bool, String> {
        a.flag(name, default)
    }

    fn write(v: bool) -> Attr {
        Attr::Int(v as i64)
    }
}

/// Gelu's `approximate`: `"tanh"` (true) or `"none"`.
pub(crate) struct Approximation;

impl AttrCodec<bool> for Approximation {
    fn read(a: &mut Attrs, name: &str, default: bool) -> Result<bool, String> {
        match a.string(name, if default { "tanh" } else { "none" })?.as_str() {
            "none" => Ok(false),
            "tanh" => Ok(true),
            other => Err(format!("unknown Gelu approximation `{other}`")),
        }
    }

    fn write(v: bool) -> Attr {
        Attr::Str(if v { "tanh" } else { "none" }.into())
    }
}

/// BitShift's required `direction`: `"LEFT"` (true) or `"RIGHT"`.
pub(crate) struct ShiftDirection;

impl AttrCodec<bool> for ShiftDirection {
    fn read(a: &mut Attrs, name: &str, _default: bool) -> Result<bool, String> {
        match a.string(name, "")?.as_str() {
            "LEFT" => Ok(true),
            "RIGHT" => Ok(false),
            other => Err(format!("BitShift direction must be LEFT or RIGHT, got `{other}`")),
        }
    }

    fn write(v: bool) -> Attr {
        Attr::Str(if v { "LEFT" } else { "RIGHT" }.into())
    }
}

impl Op {
    /// The op's attributes, every one of them, in a fixed order.
    pub fn attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        let f = Attr::Float;
        let b = |v: bool| Attr::Int(v as i64);
        let int = Attr::Int;
        let size = |v: usize| Attr::Int(v as i64);
        let sizes = |v: &[usize]| Attr::Ints(v.iter().map(|&x| x as i64).collect());
        let s = |v: &str| Attr::Str(v.to_string());
        let window = |a: &mut Attrs, w: &Window| {
            a.push("auto_pad", Attr::Str(w.auto_pad.name().into()));
            a.push("dilations", sizes(&w.dilations));
            a.push("pads", sizes(&w.pads));
            a.push("strides", sizes(&w.strides));
        };
        match self {
            Op::Input | Op::Constant(_) => {}
            Op::Unary(u) => a.0.extend(u.params().into_iter().map(|(k, v)| (k.to_string(), v))),
            Op::Binary(b) => a.0.extend(b.params().into_iter().map(|(k, v)| (k.to_string(), v))),
            Op::Clip | Op::Where | Op::MatMul | Op::Squeeze | Op::Unsqueeze | Op::Slice | Op::Expand | Op::Identity => {}
            Op::Tile | Op::Size | Op::Range | Op::NonZero => {}
            Op::Cast { to } => a.push("to", Attr::Type(*to)),
            Op::Gemm(g) => {
                a.push("alpha", f(g.alpha));
                a.push("beta", f(g.beta));
                a.push("transA", b(g.trans_a));
                a.push("transB", b(g.trans_b));
            }
            Op::Einsum { equation } => a.push("equation", s(equation)),
            Op::Conv(c) => {
                window(&mut a, &c.window);
                a.push("group", size(c.group));
            }
            Op::ConvTranspose(c) => {
                window(&mut a, &c.window);
                a.push("group", size(c.group));
                a.push("output_padding", sizes(&c.output_padding));
                a.push("output_shape", sizes(&c.output_shape));
            }
            Op::Pool(p) => {
                window(&mut a, &p.window);
                a.push("ceil_mode", b(p.ceil_mode));
                match p.kind {
                    PoolKind::Average { count_include_pad } => a.push("count_include_pad", b(count_include_pad)),
                    PoolKind::Lp { p } => a.push("p", int(p as i64)),
                    PoolKind::Max => a.push("storage_order", b(p.column_major_indices)),
                }
                a.push("kernel_shape", sizes(&p.kernel));
            }
            Op::GlobalPool(k) => {
                if let PoolKind::Lp { p } = k {
                    a.push("p", int(*p as i64));
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Hardmax { axis } | Op::Flatten { axis } | Op::Concat { axis } => {
                a.push("axis", int(*axis))
            }
            Op::Gather { axis } | Op::GatherElements { axis } | Op::OneHot { axis } => a.push("axis", int(*axis)),
            Op::LayerNorm { axis, epsilon } | Op::RmsNorm { axis, epsilon } => {
                a.push("axis", int(*axis));
                a.push("epsilon", f(*epsilon));
            }
            Op::BatchNorm { epsilon } | Op::InstanceNorm { epsilon } => a.push("epsilon", f(*epsilon)),
            Op::GroupNorm { num_groups, epsilon } => {
                a.push("epsilon", f(*epsilon));
                a.push("num_groups", size(*num_groups));
            }
            Op::Lrn(l) => {
                a.push("alpha", f(l.alpha));
                a.push("beta", f(l.beta));
                a.push("bias", f(l.bias));
                a.push("size", size(l.size));
            }
            Op::LpNorm { axis, p } => {
                a.push("axis", int(*axis));
                a.push("p", int(*p as i64));
            }
            Op::MeanVarianceNorm { axes } => a.push("axes", Attr::Ints(axes.clone())),
            Op::Reduce(r) => {
                a.push("keepdims", b(r.keepdims));
                a.push("noop_with_empty_axes", b(r.noop_with_empty_axes));
            }
            Op::ArgReduce(r) => {
                a.push("axis", int(r.axis));
                a.push("keepdims", b(r.keepdims));
                a.push("select_last_index", b(r.select_last_index));
            }
            Op::Cumulative(c) => {
                a.push("exclusive", b(c.exclusive));
                a.push("reverse", b(c.reverse));
            }
            Op::TopK { axis, largest, sorted } => {
                a.push("axis", int(*axis));
                a.push("largest", b(*largest));
                a.push("sorted", b(*sorted));
            }
            Op::Reshape { allowzero } => a.push("allowzero", b(*allowzero)),
            Op::Transpose { perm } => a.push("perm", sizes(perm)),
            Op::Split { axis, num_outputs } => {
                a.push("axis", int(*axis));
                a.push("num_outputs", size(*num_outputs));
            }
            Op::GatherNd { batch_dims } => a.push("batch_dims", size(*batch_dims)),
            Op::ScatterElements { axis, reduction } => {
                a.push("axis", int(*axis));
                a.push("reduction", s(reduction.name()));
            }
            Op::ScatterNd { reduction } => a.push("reduction", s(reduction.name())),
            Op::Pad { mode } => a.push("mode", s(mode.name())),
            Op::Shape { start, end } => {
                if let Some(e) = end {
                    a.push("end", int(*e));
                }
                a.push("start", int(*start));
            }
            Op::ConstantOfShape { value } => a.push("value", Attr::Tensor(value.clone())),
            Op::Trilu { upper } => a.push("upper", b(*upper)),
            Op::EyeLike { dtype, k } => {
                if let Some(d) = dtype {
                    a.push("dtype", Attr::Type(*d));
                }
                a.push("k", int(*k));
            }
            Op::DepthToSpace { blocksize, crd } => {
                a.push("blocksize", size(*blocksize));
                a.push("mode", s(if *crd { "CRD" } else { "DCR" }));
            }
            Op::SpaceToDepth { blocksize } => a.push("blocksize", size(*blocksize)),
            Op::Resize(r) => {
                a.push("antialias", b(r.antialias));
                a.push("axes", Attr::Ints(r.axes.clone()));
                a.push("coordinate_transformation_mode", s(r.coordinate_transform.name()));
                a.push("cubic_coeff_a", f(r.cubic_coeff_a));
                a.push("exclude_outside", b(r.exclude_outside));
                a.push("extrapolation_value", f(r.extrapolation_value));
                a.push("keep_aspect_ratio_policy", s(r.keep_aspect_ratio_policy.name()));
                a.push("mode", s(r.mode.name()));
                a.push("nearest_mode", s(r.nearest_mode.name()));
            }
            Op::Compress { axis } => {
                if let Some(x) = axis {
                    a.push("axis", int(*x));
                }
            }
            Op::ReverseSequence { batch_axis, time_axis } => {
                a.push("batch_axis", size(*batch_axis));
                a.push("time_axis", size(*time_axis));
            }
            Op::Rnn(r) => {
                a.push("activations", Attr::Strs(r.activations.iter().map(activation_text).collect()));
                if let Some(c) = r.clip {
                    a.push("clip", f(c));
                }
                a.push("direction", s(r.direction.name()));
                a.push("hidden_size", size(r.hidden_size));
                match r.cell {
                    RnnCell::Lstm { input_forget } => a.push("input_forget", b(input_forget)),
                    RnnCell::Gru { linear_before_reset } => a.push("linear_before_reset", b(linear_before_reset)),
                    RnnCell::Simple => {}
                }
                a.push("layout", b(r.batch_first));
            }
            Op::Attention(t) => {
                a.push("is_causal", b(t.is_causal));
                a.push("kv_num_heads", size(t.kv_num_heads));
                a.push("q_num_heads", size(t.q_num_heads));
                a.push("qk_matmul_output_mode", int(t.qk_matmul_output_mode));
                if let Some(sc) = t.scale {
                    a.push("scale", f(sc));
                }
                a.push("softcap", f(t.softcap));
                if let Some(p) = t.softmax_precision {
                    a.push("softmax_precision", Attr::Type(p));
                }
            }
            Op::RotaryEmbedding(r) => {
                a.push("interleaved", b(r.interleaved));
                a.push("num_heads", size(r.num_heads));
                a.push("rotary_embedding_dim", size(r.rotary_embedding_dim));
            }
            Op::NllLoss(l) | Op::SoftmaxCrossEntropyLoss(l) => {
                if let Some(i) = l.ignore_index {
                    a.push("ignore_index", int(i));
                }
                a.push("reduction", s(l.reduction.name()));
            }
            Op::If { then_branch, else_branch } => {
                a.push("else_branch", Attr::Graph(else_branch.clone()));
                a.push("then_branch", Attr::Graph(then_branch.clone()));
            }
            Op::Scan(sc) => {
                let flags = |v: &[bool]| Attr::Ints(v.iter().map(|&r| r as i64).collect());
                a.push("body", Attr::Graph(sc.body.clone()));
                a.push("captures", size(sc.captures));
                a.push("num_scan_inputs", size(sc.scan_inputs));
                a.push("scan_input_axes", Attr::Ints(sc.input_axes.clone()));
                a.push("scan_input_directions", flags(&sc.input_reverse));
                a.push("scan_output_axes", Attr::Ints(sc.output_axes.clone()));
                a.push("scan_output_directions", flags(&sc.output_reverse));
            }
            Op::Loop(l) => {
                a.push("body", Attr::Graph(l.body.clone()));
                a.push("captures", size(l.captures));
            }
            Op::Quantize { axis, block_size, dtype } => {
                a.push("axis", int(*axis));
                a.push("block_size", size(*block_size));
                if let Some(d) = dtype {
                    a.push("output_dtype", Attr::Type(*d));
                }
            }
            Op::Dequantize { axis, block_size } => {
                a.push("axis", int(*axis));
                a.push("block_size", size(*block_size));
            }
            Op::Sequence(sq) => match sq {
                SequenceOp::Empty { dtype } => a.push("dtype", Attr::Type(*dtype)),
                SequenceOp::Construct | SequenceOp::Insert | SequenceOp::Erase | SequenceOp::At | SequenceOp::Length => {}
                SequenceOp::Split { axis, keepdims } => {
                    a.push("axis", int(*axis));
                    a.push("keepdims", b(*keepdims));
                }
                SequenceOp::Concat { axis, new_axis } => {
                    a.push("axis", int(*axis));
                    a.push("new_axis", b(*new_axis));
                }
                SequenceOp::Map { body, captures } => {
                    a.push("body", Attr::Graph(body.clone()));
                    a.push("captures", size(*captures));
                }
            },
            Op::Optional(o) => match o {
                OptionalOp::Wrap { dtype, sequence } => {
                    if let Some(d) = dtype {
                        a.push("dtype", Attr::Type(*d));
                    }
                    a.push("sequence", b(*sequence));
                }
                OptionalOp::HasElement | OptionalOp::GetElement => {}
            },
        }
        a
    }

    /// The op named `name` (its ONNX name) with these attributes; missing ones take ONNX's
    /// defaults, unknown ones are an error. `Input` and `Constant` are not built this way.
    pub fn from_attrs(name: &str, mut a: Attrs) -> Result<Op, String> {
        let window = |a: &mut Attrs| -> Result<Window, String> {
            Ok(Window {
                auto_pad: a.named("auto_pad", AutoPad::NotSet, AutoPad::from_name)?,
                dilations: a.sizes("dilations")?,
                pads: a.sizes("pads")?,
                strides: a.sizes("strides")?,
            })
        };
        let loss = |a: &mut Attrs| -> Result<Loss, String> {
            Ok(Loss { ignore_index: a.opt_int("ignore_index")?, reduction: a.named("reduction", LossReduction::Mean, LossReduction::from_name)? })
        };
        let op = if let Some(u) = UnaryOp::from_name(name) {
            Op::Unary(u.with_attrs(&mut a)?)
        } else if let Some(b) = BinaryOp::from_name(name) {
            Op::Binary(b.with_attrs(&mut a)?)
        } else if let Some(kind) = ReduceKind::ALL.into_iter().find(|k| k.op_name() == name) {
            Op::Reduce(Reduce { kind, keepdims: a.flag("keepdims", true)?, noop_with_empty_axes: a.flag("noop_with_empty_axes", false)? })
        } else {
            match name {
                "Clip" => Op::Clip,
                "Where" => Op::Where,
                "Cast" => Op::Cast { to: a.dtype("to")? },
                "MatMul" => Op::MatMul,
                "Gemm" => Op::Gemm(Gemm {
                    alpha: a.float("alpha", 1.0)?,
                    beta: a.float("beta", 1.0)?,
                    trans_a: a.flag("transA", false)?,
                    trans_b: a.flag("transB", false)?,
                }),
                "Einsum" => Op::Einsum { equation: a.string("equation", "")? },
                "Conv" => {
                    let window = window(&mut a)?;
                    Op::Conv(Conv { window, group: a.size("group", 1)? })
                }
                "ConvTranspose" => {
                    let window = window(&mut a)?;
                    Op::ConvTranspose(ConvTranspose {
                        window,
                        group: a.size("group", 1)?,
                        output_padding: a.sizes("output_padding")?,
                        output_shape: a.sizes("output_shape")?,
                    })
                }
                "MaxPool" | "AveragePool" | "LpPool" => {
                    let window = window(&mut a)?;
                    let (kind, column_major_indices) = match name {
                        "MaxPool" => (PoolKind::Max, a.flag("storage_order", false)?),
                        "AveragePool" => (PoolKind::Average { count_include_pad: a.flag("count_include_pad", false)? }, false),
                        _ => (PoolKind::Lp { p: a.size("p", 2)? as u32 }, false),
                    };
                    let kernel = a.sizes("kernel_shape")?;
                    if kernel.is_empty() {
                        return Err(format!("{name} needs `kernel_shape`"));
                    }
                    Op::Pool(Pool { kind, kernel, window, ceil_mode: a.flag("ceil_mode", false)?, column_major_indices })
                }
                "GlobalMaxPool" => Op::GlobalPool(PoolKind::Max),
                "GlobalAveragePool" => Op::GlobalPool(PoolKind::Average { count_include_pad: false }),
                "GlobalLpPool" => Op::GlobalPool(PoolKind::Lp { p: a.size("p", 2)? as u32 }),
                "Softmax" => Op::Softmax { axis: a.int("axis", -1)? },
                "LogSoftmax" => Op::LogSoftmax { axis: a.int("axis", -1)? },
                "Hardmax" => Op::Hardmax { axis: a.int("axis", -1)? },
                "LayerNormalization" => Op::LayerNorm { axis: a.int("axis", -1)?, epsilon: a.float("epsilon", 1e-5)? },
                "BatchNormalization" => Op::BatchNorm { epsilon: a.float("epsilon", 1e-5)? },
                "InstanceNormalization" => Op::InstanceNorm { epsilon: a.float("epsilon", 1e-5)? },
                "GroupNormalization" => Op::GroupNorm { epsilon: a.float("epsilon", 1e-5)?, num_groups: a.size("num_groups", 0)? },
                "RMSNormalization" => Op::RmsNorm { axis: a.int("axis", -1)?, epsilon: a.float("epsilon", 1e-5)? },
                "LRN" => Op::Lrn(Lrn {
                    alpha: a.float("alpha", 1e-4)?,
                    beta: a.float("beta", 0.75)?,
                    bias: a.float("bias", 1.0)?,
                    size: a.size("size", 0)?,
                }),
                "LpNormalization" => Op::LpNorm { axis: a.int("axis", -1)?, p: a.size("p", 2)? as u32 },
                "MeanVarianceNormalization" => Op::MeanVarianceNorm { axes: a.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]) },
                "ArgMax" | "ArgMin" => Op::ArgReduce(ArgReduce {
                    max: name == "ArgMax",
                    axis: a.int("axis", 0)?,
                    keepdims: a.flag("keepdims", true)?,
                    select_last_index: a.flag("select_last_index", false)?,
                }),
                "CumSum" | "CumProd" => {
                    Op::Cumulative(Cumulative { prod: name == "CumProd", exclusive: a.flag("exclusive", false)?, reverse: a.flag("reverse", false)? })
                }
                "TopK" => Op::TopK { axis: a.int("axis", -1)?, largest: a.flag("largest", true)?, sorted: a.flag("sorted", true)? },
                "Reshape" => Op::Reshape { allowzero: a.flag("allowzero", false)? },
                "Flatten" => Op::Flatten { axis: a.int("axis", 1)? },
                "Transpose" => Op::Transpose { perm: a.sizes("perm")? },
                "Squeeze" => Op::Squeeze,
                "Unsqueeze" => Op::Unsqueeze,
                "Concat" => Op::Concat { axis: a.required_int("axis")? },
                "Split" => Op::Split { axis: a.int("axis", 0)?, num_outputs: a.size("num_outputs", 0)? },
                "Slice" => Op::Slice,
                "Gather" => Op::Gather { axis: a.int("axis", 0)? },
                "GatherElements" => Op::GatherElements { axis: a.int("axis", 0)? },
                "GatherND" => Op::GatherNd { batch_dims: a.size("batch_dims", 0)? },
                "ScatterElements" => Op::ScatterElements {
                    axis: a.int("axis", 0)?,
                    reduction: a.named("reduction", ScatterReduction::None, ScatterReduction::from_name)?,
                },
                "ScatterND" => Op::ScatterNd { reduction: a.named("reduction", ScatterReduction::None, ScatterReduction::from_name)? },
                "Expand" => Op::Expand,
                "Tile" => Op::Tile,
                "Pad" => Op::Pad { mode: a.named("mode", PadMode::Constant, PadMode::from_name)? },
                "Shape" => Op::Shape { end: a.opt_int("end")?, start: a.int("start", 0)? },
                "Size" => Op::Size,
                "ConstantOfShape" => Op::ConstantOfShape { value: a.tensor("value")?.unwrap_or_else(|| Tensor::vector(&[0f32])) },
                "Range" => Op::Range,
                "OneHot" => Op::OneHot { axis: a.int("axis", -1)? },
                "Trilu" => Op::Trilu { upper: a.flag("upper", true)? },
                "EyeLike" => Op::EyeLike { dtype: a.opt_dtype("dtype")?, k: a.int("k", 0)? },
                "DepthToSpace" => Op::DepthToSpace {
                    blocksize: a.size("blocksize", 0)?,
                    crd: match a.string("mode", "DCR")?.as_str() {
                        "DCR" => false,
                        "CRD" => true,
                        other => return Err(format!("DepthToSpace mode must be DCR or CRD, got `{other}`")),
                    },
                },
                "SpaceToDepth" => Op::SpaceToDepth { blocksize: a.size("blocksize", 0)? },
                "Resize" => {
                    let d = Resize::default();
                    Op::Resize(Resize {
                        antialias: a.flag("antialias", false)?,
                        axes: a.ints("axes")?.unwrap_or_default(),
                        coordinate_transform: a.named("coordinate_transformation_mode", d.coordinate_transform, CoordinateTransform::from_name)?,
                        cubic_coeff_a: a.float("cubic_coeff_a", d.cubic_coeff_a)?,
                        exclude_outside: a.flag("exclude_outside", false)?,
                        extrapolation_value: a.float("extrapolation_value", 0.0)?,
                        keep_aspect_ratio_policy: a.named("keep_aspect_ratio_policy", d.keep_aspect_ratio_policy, AspectRatioPolicy::from_name)?,
                        mode: a.named("mode", d.mode, ResizeMode::from_name)?,
                        nearest_mode: a.named("nearest_mode", d.nearest_mode, NearestMode::from_name)?,
                    })
                }
                "NonZero" => Op::NonZero,
                "Compress" => Op::Compress { axis: a.opt_int("axis")? },
                "ReverseSequence" => Op::ReverseSequence { batch_axis: a.size("batch_axis", 1)?, time_axis: a.size("time_axis", 0)? },
                "Identity" => Op::Identity,
                "RNN" | "GRU" | "LSTM" => {
                    let activations =
                        a.strings("activations")?.unwrap_or_default().iter().map(|s| activation_from_text(s)).collect::<Result<Vec<_>, _>>()?;
                    let cell = match name {
                        "RNN" => RnnCell::Simple,
                        "GRU" => RnnCell::Gru { linear_before_reset: a.flag("linear_before_reset", false)? },
                        _ => RnnCell::Lstm { input_forget: a.flag("input_forget", false)? },
                    };
                    Op::Rnn(Rnn {
                        cell,
                        activations,
                        clip: a.opt_float("clip")?,
                        direction: a.named("direction", RnnDirection::Forward, RnnDirection::from_name)?,
                        hidden_size: a.size("hidden_size", 0)?,
                        batch_first: a.flag("layout", false)?,
                    })
                }
                "Attention" => Op::Attention(Attention {
                    is_causal: a.flag("is_causal", false)?,
                    kv_num_heads: a.size("kv_num_heads", 0)?,
                    q_num_heads: a.size("q_num_heads", 0)?,
                    qk_matmul_output_mode: a.int("qk_matmul_output_mode", 0)?,
                    scale: a.opt_float("scale")?,
                    softcap: a.float("softcap", 0.0)?,
                    softmax_precision: a.opt_dtype("softmax_precision")?,
                }),
                "RotaryEmbedding" => Op::RotaryEmbedding(RotaryEmbedding {
                    interleaved: a.flag("interleaved", false)?,
                    num_heads: a.size("num_heads", 0)?,
                    rotary_embedding_dim: a.size("rotary_embedding_dim", 0)?,
                }),
                "NegativeLogLikelihoodLoss" => Op::NllLoss(loss(&mut a)?),
                "SoftmaxCrossEntropyLoss" => Op::SoftmaxCrossEntropyLoss(loss(&mut a)?),
                "If" => Op::If { else_branch: a.graph("else_branch")?, then_branch: a.graph("then_branch")? },
                "Scan" => {
                    let body = a.graph("body")?;
                    let captures = a.size("captures", 0)?;
                    let scan_inputs = a.size("num_scan_inputs", 0)?;
                    let flags = |v: Option<Vec<i64>>| -> Result<Vec<bool>, String> {
                        let v = v.unwrap_or_default();
                        v.iter()
                            .map(|&d| match d {
                                0 => Ok(false),
                                1 => Ok(true),
                                _ => Err(format!("a scan direction is 0 or 1, not {d}")),
                            })
                            .collect()
                    };
                    // Absent lists mean axis 0, forward, for every tensor; inference checks the
                    // lengths of given ones against the operands and results.
                    let input_axes = a.ints("scan_input_axes")?.unwrap_or_default();
                    let input_reverse = flags(a.ints("scan_input_directions")?)?;
                    let output_axes = a.ints("scan_output_axes")?.unwrap_or_default();
                    let output_reverse = flags(a.ints("scan_output_directions")?)?;
                    if scan_inputs == 0 {
                        return Err("Scan needs num_scan_inputs of at least 1".into());
                    }
                    Op::Scan(Box::new(crate::op::Scan { body, captures, scan_inputs, input_axes, input_reverse, output_axes, output_reverse }))
                }
                "Loop" => Op::Loop(Box::new(crate::op::Loop { body: a.graph("body")?, captures: a.size("captures", 0)? })),
                "QuantizeLinear" => {
                    Op::Quantize { axis: a.int("axis", 1)?, block_size: a.size("block_size", 0)?, dtype: a.opt_dtype("output_dtype")? }
                }
                "DequantizeLinear" => Op::Dequantize { axis: a.int("axis", 1)?, block_size: a.size("block_size", 0)? },
                "SequenceEmpty" => Op::Sequence(SequenceOp::Empty { dtype: a.opt_dtype("dtype")?.unwrap_or(DType::F32) }),
                "SequenceConstruct" => Op::Sequence(SequenceOp::Construct),
                "SequenceInsert" => Op::Sequence(SequenceOp::Insert),
                "SequenceErase" => Op::Sequence(SequenceOp::Erase),
                "SequenceAt" => Op::Sequence(SequenceOp::At),
                "SequenceLength" => Op::Sequence(SequenceOp::Length),
                "SplitToSequence" => Op::Sequence(SequenceOp::Split { axis: a.int("axis", 0)?, keepdims: a.flag("keepdims", true)? }),
                "ConcatFromSequence" => Op::Sequence(SequenceOp::Concat { axis: a.required_int("axis")?, new_axis: a.flag("new_axis", false)? }),
                "SequenceMap" => Op::Sequence(SequenceOp::Map { body: a.graph("body")?, captures: a.size("captures", 0)? }),
                "Optional" => Op::Optional(OptionalOp::Wrap { dtype: a.opt_dtype("dtype")?, sequence: a.flag("sequence", false)? }),
                "OptionalHasElement" => Op::Optional(OptionalOp::HasElement),
                "OptionalGetElement" => Op::Optional(OptionalOp::GetElement),
                _ => return Err(format!("unknown op `{name}`")),
            }
        };
        a.finish(name)?;
        Ok(op)
    }
}
