//! The attribute schemas of the op table's parameter types: declared field lists
//! ([`attr_schema!`]) for the plain structs, and the families whose members' names and
//! attributes depend on their value (pooling by kind, `Reduce*`, `ArgMax`/`ArgMin`,
//! `CumSum`/`CumProd`, the recurrent cells, the sequence and optional ops), each written and read
//! side by side.

use super::attr::{activation_from_text, activation_text, Attr, Attrs};
use super::schema::{attr_schema, AttrSchema, Family, NamedEnum};
use super::schema::{
    Flag, Float, Graph, Int, Ints, Named, Nested, OptFloat, OptInt, OptType, Size, Sizes,
};
use super::*;
use crate::DType;

impl NamedEnum for AutoPad {
    fn name(self) -> &'static str {
        AutoPad::name(self)
    }
    fn from_name(s: &str) -> Option<AutoPad> {
        AutoPad::from_name(s)
    }
}

attr_schema!(Window {
    auto_pad: AutoPad = AutoPad::NotSet; "auto_pad" as Named,
    dilations: Vec<usize> = Vec::new(); "dilations" as Sizes,
    pads: Vec<usize> = Vec::new(); "pads" as Sizes,
    strides: Vec<usize> = Vec::new(); "strides" as Sizes,
});

attr_schema!(Gemm {
    alpha: f32 = 1.0; "alpha" as Float,
    beta: f32 = 1.0; "beta" as Float,
    trans_a: bool = false; "transA" as Flag,
    trans_b: bool = false; "transB" as Flag,
});

attr_schema!(Conv {
    window: Window = Window::unit(0); "" as Nested,
    group: usize = 1; "group" as Size,
});

attr_schema!(ConvTranspose {
    window: Window = Window::unit(0); "" as Nested,
    group: usize = 1; "group" as Size,
    output_padding: Vec<usize> = Vec::new(); "output_padding" as Sizes,
    output_shape: Vec<usize> = Vec::new(); "output_shape" as Sizes,
});

attr_schema!(Col2Im {
    dilations: Vec<usize> = Vec::new(); "dilations" as Sizes,
    pads: Vec<usize> = Vec::new(); "pads" as Sizes,
    strides: Vec<usize> = Vec::new(); "strides" as Sizes,
});

attr_schema!(DeformConv {
    dilations: Vec<usize> = Vec::new(); "dilations" as Sizes,
    group: usize = 1; "group" as Size,
    kernel_shape: Vec<usize> = Vec::new(); "kernel_shape" as Sizes,
    offset_group: usize = 1; "offset_group" as Size,
    pads: Vec<usize> = Vec::new(); "pads" as Sizes,
    strides: Vec<usize> = Vec::new(); "strides" as Sizes,
});

attr_schema!(Lrn {
    alpha: f32 = 1e-4; "alpha" as Float,
    beta: f32 = 0.75; "beta" as Float,
    bias: f32 = 1.0; "bias" as Float,
    size: usize = 0; "size" as Size,
});

attr_schema!(Resize {
    antialias: bool = false; "antialias" as Flag,
    axes: Vec<i64> = Vec::new(); "axes" as Ints,
    coordinate_transform: CoordinateTransform = CoordinateTransform::HalfPixel; "coordinate_transformation_mode" as Named,
    cubic_coeff_a: f32 = -0.75; "cubic_coeff_a" as Float,
    exclude_outside: bool = false; "exclude_outside" as Flag,
    extrapolation_value: f32 = 0.0; "extrapolation_value" as Float,
    keep_aspect_ratio_policy: AspectRatioPolicy = AspectRatioPolicy::Stretch; "keep_aspect_ratio_policy" as Named,
    mode: ResizeMode = ResizeMode::Nearest; "mode" as Named,
    nearest_mode: NearestMode = NearestMode::RoundPreferFloor; "nearest_mode" as Named,
});

attr_schema!(Attention {
    is_causal: bool = false; "is_causal" as Flag,
    kv_num_heads: usize = 0; "kv_num_heads" as Size,
    q_num_heads: usize = 0; "q_num_heads" as Size,
    qk_matmul_output_mode: i64 = 0; "qk_matmul_output_mode" as Int,
    scale: Option<f32> = None; "scale" as OptFloat,
    softcap: f32 = 0.0; "softcap" as Float,
    softmax_precision: Option<DType> = None; "softmax_precision" as OptType,
});

attr_schema!(RotaryEmbedding {
    interleaved: bool = false; "interleaved" as Flag,
    num_heads: usize = 0; "num_heads" as Size,
    rotary_embedding_dim: usize = 0; "rotary_embedding_dim" as Size,
});

attr_schema!(LinearAttention {
    chunk_size: i64 = 64; "chunk_size" as Int,
    kv_num_heads: usize = 0; "kv_num_heads" as Size,
    q_num_heads: usize = 0; "q_num_heads" as Size,
    scale: f32 = 0.0; "scale" as Float,
    update_rule: LinearUpdate = LinearUpdate::GatedDelta; "update_rule" as Named,
});

attr_schema!(Loss {
    ignore_index: Option<i64> = None; "ignore_index" as OptInt,
    reduction: LossReduction = LossReduction::Mean; "reduction" as Named,
});

attr_schema!(Loop {
    body: Subgraph = super::schema::required(); "body" as Graph,
    captures: usize = 0; "captures" as Size,
});

/// Scan's direction lists are 0/1 integers; absent lists mean axis 0, forward, for every tensor
/// (inference checks the lengths of given ones against the operands and results).
impl AttrSchema for Scan {
    fn write_attrs(&self, a: &mut Attrs) {
        let flags = |v: &[bool]| Attr::Ints(v.iter().map(|&r| r as i64).collect());
        a.push("body", Attr::Graph(self.body.clone()));
        a.push("captures", Attr::Int(self.captures as i64));
        a.push("num_scan_inputs", Attr::Int(self.scan_inputs as i64));
        a.push("scan_input_axes", Attr::Ints(self.input_axes.clone()));
        a.push("scan_input_directions", flags(&self.input_reverse));
        a.push("scan_output_axes", Attr::Ints(self.output_axes.clone()));
        a.push("scan_output_directions", flags(&self.output_reverse));
    }

    fn read_attrs(a: &mut Attrs) -> Result<Scan, AttrError> {
        let body = a.graph("body")?;
        let captures = a.size("captures", 0)?;
        let scan_inputs = a.size("num_scan_inputs", 0)?;
        let flags = |name: &str, v: Option<Vec<i64>>| -> Result<Vec<bool>, AttrError> {
            v.unwrap_or_default()
                .iter()
                .map(|&d| match d {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(AttrError::OutOfRange {
                        name: name.into(),
                        value: d.to_string(),
                        why: "must hold only 0 and 1",
                    }),
                })
                .collect()
        };
        let input_axes = a.ints("scan_input_axes")?.unwrap_or_default();
        let input_reverse = flags("scan_input_directions", a.ints("scan_input_directions")?)?;
        let output_axes = a.ints("scan_output_axes")?.unwrap_or_default();
        let output_reverse = flags("scan_output_directions", a.ints("scan_output_directions")?)?;
        if scan_inputs == 0 {
            return Err(AttrError::OutOfRange {
                name: "num_scan_inputs".into(),
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        Ok(Scan {
            body,
            captures,
            scan_inputs,
            input_axes,
            input_reverse,
            output_axes,
            output_reverse,
        })
    }
}

/// MaxPool, AveragePool, LpPool: the kind decides the name and its own attribute.
impl Family for Pool {
    fn names() -> Vec<&'static str> {
        vec!["MaxPool", "AveragePool", "LpPool"]
    }

    fn name(&self) -> &'static str {
        match self.kind {
            PoolKind::Max => "MaxPool",
            PoolKind::Average { .. } => "AveragePool",
            PoolKind::Lp { .. } => "LpPool",
        }
    }

    fn write_attrs(&self, a: &mut Attrs) {
        self.window.write_attrs(a);
        a.push("ceil_mode", Attr::Int(self.ceil_mode as i64));
        match self.kind {
            PoolKind::Average { count_include_pad } => {
                a.push("count_include_pad", Attr::Int(count_include_pad as i64))
            }
            PoolKind::Lp { p } => a.push("p", Attr::Int(p as i64)),
            PoolKind::Max => a.push("storage_order", Attr::Int(self.column_major_indices as i64)),
        }
        a.push("kernel_shape", Attr::Ints(self.kernel.iter().map(|&k| k as i64).collect()));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Pool, AttrError>> {
        if !matches!(name, "MaxPool" | "AveragePool" | "LpPool") {
            return None;
        }
        Some((|| {
            let window = Window::read_attrs(a)?;
            let (kind, column_major_indices) = match name {
                "MaxPool" => (PoolKind::Max, a.flag("storage_order", false)?),
                "AveragePool" => (
                    PoolKind::Average { count_include_pad: a.flag("count_include_pad", false)? },
                    false,
                ),
                _ => (PoolKind::Lp { p: a.size("p", 2)? as u32 }, false),
            };
            let given = a.contains("kernel_shape");
            let kernel = a.sizes("kernel_shape")?;
            if kernel.is_empty() {
                let name = "kernel_shape".to_string();
                return Err(match given {
                    false => AttrError::Missing { name },
                    true => {
                        AttrError::OutOfRange { name, value: "[]".into(), why: "must not be empty" }
                    }
                });
            }
            Ok(Pool {
                kind,
                kernel,
                window,
                ceil_mode: a.flag("ceil_mode", false)?,
                column_major_indices,
            })
        })())
    }
}

/// GlobalMaxPool, GlobalAveragePool, GlobalLpPool (`GlobalPool`'s kind).
impl Family for PoolKind {
    fn names() -> Vec<&'static str> {
        vec!["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"]
    }

    fn name(&self) -> &'static str {
        match self {
            PoolKind::Max => "GlobalMaxPool",
            PoolKind::Average { .. } => "GlobalAveragePool",
            PoolKind::Lp { .. } => "GlobalLpPool",
        }
    }

    fn write_attrs(&self, a: &mut Attrs) {
        if let PoolKind::Lp { p } = self {
            a.push("p", Attr::Int(*p as i64));
        }
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<PoolKind, AttrError>> {
        Some(match name {
            "GlobalMaxPool" => Ok(PoolKind::Max),
            "GlobalAveragePool" => Ok(PoolKind::Average { count_include_pad: false }),
            "GlobalLpPool" => a.size("p", 2).map(|p| PoolKind::Lp { p: p as u32 }),
            _ => return None,
        })
    }
}

impl Family for Reduce {
    fn names() -> Vec<&'static str> {
        ReduceKind::ALL.iter().map(|k| k.op_name()).collect()
    }

    fn name(&self) -> &'static str {
        self.kind.op_name()
    }

    fn write_attrs(&self, a: &mut Attrs) {
        a.push("keepdims", Attr::Int(self.keepdims as i64));
        a.push("noop_with_empty_axes", Attr::Int(self.noop_with_empty_axes as i64));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Reduce, AttrError>> {
        let kind = ReduceKind::ALL.into_iter().find(|k| k.op_name() == name)?;
        Some((|| {
            Ok(Reduce {
                kind,
                keepdims: a.flag("keepdims", true)?,
                noop_with_empty_axes: a.flag("noop_with_empty_axes", false)?,
            })
        })())
    }
}

/// HannWindow, HammingWindow, BlackmanWindow: the shape decides the name.
impl Family for SignalWindow {
    fn names() -> Vec<&'static str> {
        WindowShape::ALL.iter().map(|s| s.op_name()).collect()
    }

    fn name(&self) -> &'static str {
        self.shape.op_name()
    }

    fn write_attrs(&self, a: &mut Attrs) {
        if let Some(d) = self.dtype {
            a.push("output_datatype", Attr::Type(d));
        }
        a.push("periodic", Attr::Int(self.periodic as i64));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<SignalWindow, AttrError>> {
        let shape = WindowShape::ALL.into_iter().find(|s| s.op_name() == name)?;
        Some((|| {
            Ok(SignalWindow {
                shape,
                periodic: a.flag("periodic", true)?,
                dtype: a.opt_dtype("output_datatype")?,
            })
        })())
    }
}

impl Family for ArgReduce {
    fn names() -> Vec<&'static str> {
        vec!["ArgMax", "ArgMin"]
    }

    fn name(&self) -> &'static str {
        if self.max {
            "ArgMax"
        } else {
            "ArgMin"
        }
    }

    fn write_attrs(&self, a: &mut Attrs) {
        a.push("axis", Attr::Int(self.axis));
        a.push("keepdims", Attr::Int(self.keepdims as i64));
        a.push("select_last_index", Attr::Int(self.select_last_index as i64));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<ArgReduce, AttrError>> {
        let max = match name {
            "ArgMax" => true,
            "ArgMin" => false,
            _ => return None,
        };
        Some((|| {
            Ok(ArgReduce {
                max,
                axis: a.int("axis", 0)?,
                keepdims: a.flag("keepdims", true)?,
                select_last_index: a.flag("select_last_index", false)?,
            })
        })())
    }
}

impl Family for Cumulative {
    fn names() -> Vec<&'static str> {
        vec!["CumSum", "CumProd"]
    }

    fn name(&self) -> &'static str {
        if self.prod {
            "CumProd"
        } else {
            "CumSum"
        }
    }

    fn write_attrs(&self, a: &mut Attrs) {
        a.push("exclusive", Attr::Int(self.exclusive as i64));
        a.push("reverse", Attr::Int(self.reverse as i64));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Cumulative, AttrError>> {
        let prod = match name {
            "CumProd" => true,
            "CumSum" => false,
            _ => return None,
        };
        Some((|| {
            Ok(Cumulative {
                prod,
                exclusive: a.flag("exclusive", false)?,
                reverse: a.flag("reverse", false)?,
            })
        })())
    }
}

/// RNN, GRU, LSTM: the cell decides the name and its own attribute; activations print as ONNX
/// names them, with their parameters (`LeakyRelu(0.1)`).
impl Family for Rnn {
    fn names() -> Vec<&'static str> {
        vec!["RNN", "GRU", "LSTM"]
    }

    fn name(&self) -> &'static str {
        match self.cell {
            RnnCell::Simple => "RNN",
            RnnCell::Gru { .. } => "GRU",
            RnnCell::Lstm { .. } => "LSTM",
        }
    }

    fn write_attrs(&self, a: &mut Attrs) {
        a.push("activations", Attr::Strs(self.activations.iter().map(activation_text).collect()));
        if let Some(c) = self.clip {
            a.push("clip", Attr::Float(c));
        }
        a.push("direction", Attr::Str(self.direction.name().into()));
        a.push("hidden_size", Attr::Int(self.hidden_size as i64));
        match self.cell {
            RnnCell::Lstm { input_forget } => {
                a.push("input_forget", Attr::Int(input_forget as i64))
            }
            RnnCell::Gru { linear_before_reset } => {
                a.push("linear_before_reset", Attr::Int(linear_before_reset as i64))
            }
            RnnCell::Simple => {}
        }
        a.push("layout", Attr::Int(self.batch_first as i64));
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<Rnn, AttrError>> {
        if !matches!(name, "RNN" | "GRU" | "LSTM") {
            return None;
        }
        Some((|| {
            let activations = a
                .strings("activations")?
                .unwrap_or_default()
                .iter()
                .map(|s| activation_from_text(s))
                .collect::<Result<Vec<_>, _>>()?;
            let cell = match name {
                "RNN" => RnnCell::Simple,
                "GRU" => {
                    RnnCell::Gru { linear_before_reset: a.flag("linear_before_reset", false)? }
                }
                _ => RnnCell::Lstm { input_forget: a.flag("input_forget", false)? },
            };
            Ok(Rnn {
                cell,
                activations,
                clip: a.opt_float("clip")?,
                direction: a.named("direction", RnnDirection::Forward, RnnDirection::from_name)?,
                hidden_size: a.size("hidden_size", 0)?,
                batch_first: a.flag("layout", false)?,
            })
        })())
    }
}

impl Family for SequenceOp {
    fn names() -> Vec<&'static str> {
        vec![
            "SequenceEmpty",
            "SequenceConstruct",
            "SequenceInsert",
            "SequenceErase",
            "SequenceAt",
            "SequenceLength",
            "SplitToSequence",
            "ConcatFromSequence",
            "SequenceMap",
        ]
    }

    fn name(&self) -> &'static str {
        SequenceOp::name(self)
    }

    fn write_attrs(&self, a: &mut Attrs) {
        match self {
            SequenceOp::Empty { dtype } => a.push("dtype", Attr::Type(*dtype)),
            SequenceOp::Construct
            | SequenceOp::Insert
            | SequenceOp::Erase
            | SequenceOp::At
            | SequenceOp::Length => {}
            SequenceOp::Split { axis, keepdims } => {
                a.push("axis", Attr::Int(*axis));
                a.push("keepdims", Attr::Int(*keepdims as i64));
            }
            SequenceOp::Concat { axis, new_axis } => {
                a.push("axis", Attr::Int(*axis));
                a.push("new_axis", Attr::Int(*new_axis as i64));
            }
            SequenceOp::Map { body, captures } => {
                a.push("body", Attr::Graph(body.clone()));
                a.push("captures", Attr::Int(*captures as i64));
            }
        }
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<SequenceOp, AttrError>> {
        let mut read = || -> Result<Option<SequenceOp>, AttrError> {
            Ok(Some(match name {
                "SequenceEmpty" => {
                    SequenceOp::Empty { dtype: a.opt_dtype("dtype")?.unwrap_or(DType::F32) }
                }
                "SequenceConstruct" => SequenceOp::Construct,
                "SequenceInsert" => SequenceOp::Insert,
                "SequenceErase" => SequenceOp::Erase,
                "SequenceAt" => SequenceOp::At,
                "SequenceLength" => SequenceOp::Length,
                "SplitToSequence" => SequenceOp::Split {
                    axis: a.int("axis", 0)?,
                    keepdims: a.flag("keepdims", true)?,
                },
                "ConcatFromSequence" => SequenceOp::Concat {
                    axis: a.required_int("axis")?,
                    new_axis: a.flag("new_axis", false)?,
                },
                "SequenceMap" => {
                    SequenceOp::Map { body: a.graph("body")?, captures: a.size("captures", 0)? }
                }
                _ => return Ok(None),
            }))
        };
        read().transpose()
    }
}

impl Family for OptionalOp {
    fn names() -> Vec<&'static str> {
        vec!["Optional", "OptionalHasElement", "OptionalGetElement"]
    }

    fn name(&self) -> &'static str {
        OptionalOp::name(self)
    }

    fn write_attrs(&self, a: &mut Attrs) {
        if let OptionalOp::Wrap { dtype, sequence } = self {
            if let Some(d) = dtype {
                a.push("dtype", Attr::Type(*d));
            }
            a.push("sequence", Attr::Int(*sequence as i64));
        }
    }

    fn read_named(name: &str, a: &mut Attrs) -> Option<Result<OptionalOp, AttrError>> {
        let mut read = || -> Result<Option<OptionalOp>, AttrError> {
            Ok(Some(match name {
                "Optional" => OptionalOp::Wrap {
                    dtype: a.opt_dtype("dtype")?,
                    sequence: a.flag("sequence", false)?,
                },
                "OptionalHasElement" => OptionalOp::HasElement,
                "OptionalGetElement" => OptionalOp::GetElement,
                _ => return Ok(None),
            }))
        };
        read().transpose()
    }
}
