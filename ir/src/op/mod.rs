//! Operators: a closed enum with typed attributes and ONNX semantics.
//!
//! Operands that ONNX passes as inputs in its newest opsets (Reshape's shape, Clip's bounds, the
//! axes of Reduce*/Squeeze/Unsqueeze, Slice's starts/ends...) are operands here too, so one op has
//! one meaning; an importer of an older opset turns the attribute into a constant operand.
//! Elementwise ops are grouped into [`UnaryOp`] and [`BinaryOp`] because fusion and codegen treat
//! them as one family.

pub(crate) mod attr;
mod elementwise;
mod family;
mod params;
pub(crate) mod schema;
mod sequence;
mod window;

pub use attr::{Attr, Attrs};
pub use elementwise::{BinaryOp, TypeClass, UnaryOp};
pub use params::*;
pub use sequence::{OptionalOp, SequenceOp};
pub use window::{AutoPad, SpatialAxis, Window};

use std::sync::Arc;

use crate::error::AttrError;
use crate::{DType, Graph, Tensor};
use schema::{
    Count, DepthMode, Flag, Float, Graph as GraphAttr, Int, Ints, Named, OptInt, OptType,
    RequiredInt, Size, Sizes, Str, Strs, TensorValue, Type,
};

/// A graph inside an op (the branches of `If`). Two subgraphs are equal when they print the same.
#[derive(Clone, Debug)]
pub struct Subgraph(pub Arc<Graph>);

impl PartialEq for Subgraph {
    fn eq(&self, other: &Subgraph) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || crate::text::print(&self.0, crate::text::Weights::Full)
                == crate::text::print(&other.0, crate::text::Weights::Full)
    }
}

/// What kind of work an op is, for fusion and the graph passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A graph input or a constant: no work.
    Source,
    /// A new shape on the same bytes (Reshape, Flatten, Squeeze, Unsqueeze): no kernel.
    View,
    /// One result element from the same-index elements of the operands: fuses into loops.
    Elementwise,
    /// Everything else a kernel computes (contractions, windows, reductions, data movement...).
    Root,
    /// Control flow and the sequence and optional ops, which hold graphs or collections.
    Control,
}

/// Which family an op belongs to. Each stage keeps a family's rules in a file of its name
/// (`infer/`, `eval/`, the compiler's `codegen/`, a function in its `batch.rs`) and dispatches on
/// this, so an op's rules sit side by side in every stage and no stage lists a family's ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// Graph inputs and constants, which no stage computes.
    Source,
    /// `Unary`, `Binary`, `Clip`, `Where`, `Cast`, `Identity`.
    Elementwise,
    /// MatMul, Gemm, Einsum.
    Contraction,
    /// Convolutions and pooling.
    Window,
    /// Softmax and the normalisations.
    Normalize,
    /// Reductions (`Reduce*`, ArgMax/ArgMin) and scans (CumSum/CumProd, TopK).
    Reduce,
    /// Reshapes, transposes, joins, splits, slices, Gather, Expand.
    Movement,
    /// Gathers and scatters by index tensors, and the ops that compute each element's source
    /// (Tile, Pad, OneHot, Trilu, DepthToSpace...).
    Indexing,
    /// Tensors made from shapes: Shape, Size, ConstantOfShape, Range, EyeLike.
    Generate,
    /// Resize, GridSample, AffineGrid.
    Resize,
    /// DFT, STFT, MelWeightMatrix.
    Signal,
    /// Recurrent layers, attention, rotary embeddings, and the state-carrying ops of recurrent
    /// language models (CausalConvWithState, LinearAttention).
    Sequence,
    Loss,
    /// If, Scan, Loop.
    Control,
    /// QuantizeLinear, DequantizeLinear.
    Quantize,
    /// The sequence and optional ops.
    Collection,
    /// The ops on string tensors (StringConcat, StringSplit, StringNormalizer, RegexFullMatch,
    /// LabelEncoder): only the interpreter runs them; a compiled program leaves them to the host.
    Strings,
}

/// The op table: one row per op gives its variant and attributes (each with its type, ONNX
/// default, attribute name and codec), its ONNX name (`family` when its parameters decide it),
/// its arity, its kind, its family, the operands whose values decide its result shape, and its
/// default result count. The enum `Op`, `name`, `arity`, `kind`, `family`, `shape_operands`,
/// `default_num_outputs`, `attrs` and `from_attrs` are generated from it, so the text form and
/// ONNX import round-trip by construction. A row's expressions may use its fields (by reference).
macro_rules! op_table {
    ($(
        $(#[$doc:meta])*
        $variant:ident
        $({ $($field:ident : $fty:ty $(= $default:expr)? ; $attr:literal as $codec:ty),* $(,)? })?
        $(( $bind:ident : $pty:ty ))?
        => $name:tt, arity $arity:expr, $kind:ident, $family:ident
        $(, shapes $shapes:expr)?
        $(, outputs $outputs:expr)?
        ;
    )*) => {
        /// One operator with its attributes. Operands and results are described per variant; `?`
        /// marks an optional operand.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Op {
            $( $(#[$doc])* $variant $({ $($field: $fty),* })? $(($pty))?, )*
        }

        impl Op {
            /// The ONNX operator name, which is also the name in kiln's text form.
            #[allow(unused_variables)]
            pub fn name(&self) -> &'static str {
                match self {
                    $( op_table!(@pat $variant $({ $($field),* })? $(($bind))?) => op_table!(@name $name $(, $bind)?), )*
                }
            }

            /// Every op's name, as `from_attrs` takes them (the sources, built otherwise, left out).
            pub fn names() -> Vec<&'static str> {
                let mut names = Vec::new();
                $( op_table!(@names names, $kind, $name $(, $pty)?); )*
                names
            }

            /// How many operands the op takes: (required, maximum). `usize::MAX` means variadic.
            #[allow(unused_variables)]
            pub fn arity(&self) -> (usize, usize) {
                match self {
                    $( op_table!(@pat $variant $({ $($field),* })? $(($bind))?) => $arity, )*
                }
            }

            pub fn kind(&self) -> OpKind {
                match self {
                    $( op_table!(@any $variant $({ $($field),* })? $(($bind))?) => OpKind::$kind, )*
                }
            }

            pub fn family(&self) -> OpFamily {
                match self {
                    $( op_table!(@any $variant $({ $($field),* })? $(($bind))?) => OpFamily::$family, )*
                }
            }

            /// The operand positions whose values decide the result shape (or that codegen needs
            /// as constants: axes, a count, a diagonal offset).
            pub fn shape_operands(&self) -> &'static [usize] {
                match self {
                    $( op_table!(@any $variant $({ $($field),* })? $(($bind))?) => op_table!(@or &[] $(, $shapes)?), )*
                }
            }

            /// How many results a node of this op has when its user asks for nothing else (ops
            /// with optional extra results, such as LayerNormalization's statistics, keep only the
            /// first).
            #[allow(unused_variables)]
            pub fn default_num_outputs(&self) -> usize {
                match self {
                    $( op_table!(@pat $variant $({ $($field),* })? $(($bind))?) => op_table!(@or 1 $(, $outputs)?), )*
                }
            }

            /// The op's attributes, every one of them, in the table's order.
            #[allow(unused_variables)]
            pub fn attrs(&self) -> Attrs {
                let mut a = Attrs::new();
                match self {
                    $( op_table!(@pat $variant $({ $($field),* })? $(($bind))?) => {
                        $($( <$codec as schema::AttrCodec<$fty>>::write(&mut a, $attr, $field); )*)?
                        op_table!(@write a, $name $(, $bind, $pty)?);
                    } )*
                }
                a
            }

            /// The op named `name` (its ONNX name) with these attributes; missing ones take ONNX's
            /// defaults, unknown ones are an error. `Input` and `Constant` are not built this way.
            pub fn from_attrs(name: &str, mut a: Attrs) -> Result<Op, AttrError> {
                let op = 'found: {
                    $(
                        if let Some(op) = op_table!(@read name, a, $kind, $variant, $name $(, { $($field: $fty $(= $default)?; $attr as $codec),* })? $(, ($bind: $pty))?) {
                            break 'found op?;
                        }
                    )*
                    return Err(AttrError::UnknownOp(name.into()));
                };
                a.finish(name)?;
                Ok(op)
            }
        }
    };
    (@pat $variant:ident { $($field:ident),* }) => { Op::$variant { $($field),* } };
    (@pat $variant:ident ($bind:ident)) => { Op::$variant($bind) };
    (@pat $variant:ident) => { Op::$variant };
    (@any $variant:ident { $($field:ident),* }) => { Op::$variant { .. } };
    (@any $variant:ident ($bind:ident)) => { Op::$variant(_) };
    (@any $variant:ident) => { Op::$variant };
    (@name family, $bind:ident) => { schema::Family::name($bind) };
    (@name $lit:literal $(, $bind:ident)?) => { $lit };
    (@names $v:ident, Source, $($rest:tt)*) => {};
    (@names $v:ident, $kind:ident, family, $pty:ty) => { $v.extend(<$pty as schema::Family>::names()) };
    (@names $v:ident, $kind:ident, $lit:literal $(, $pty:ty)?) => { $v.push($lit) };
    (@or $d:expr) => { $d };
    (@or $d:expr, $v:expr) => { $v };
    (@default) => { schema::required() };
    (@default $d:expr) => { $d };
    (@write $a:ident, family, $bind:ident, $pty:ty) => { schema::Family::write_attrs($bind, &mut $a) };
    (@write $a:ident, $lit:literal, $bind:ident, $pty:ty) => { <$pty as schema::AttrSchema>::write_attrs($bind, &mut $a) };
    (@write $a:ident, $lit:literal) => {};
    // Sources (inputs, constants) are not built from attributes.
    (@read $n:ident, $a:ident, Source, $($rest:tt)*) => { None::<Result<Op, AttrError>> };
    (@read $n:ident, $a:ident, $kind:ident, $variant:ident, family, ($bind:ident : $pty:ty)) => {
        <$pty as schema::Family>::read_named($n, &mut $a).map(|r| r.map(Op::$variant))
    };
    (@read $n:ident, $a:ident, $kind:ident, $variant:ident, $lit:literal, ($bind:ident : $pty:ty)) => {
        ($n == $lit).then(|| <$pty as schema::AttrSchema>::read_attrs(&mut $a).map(Op::$variant))
    };
    (@read $n:ident, $a:ident, $kind:ident, $variant:ident, $lit:literal, { $($field:ident : $fty:ty $(= $default:expr)? ; $attr:literal as $codec:ty),* }) => {
        ($n == $lit).then(|| -> Result<Op, AttrError> {
            Ok(Op::$variant { $( $field: <$codec as schema::AttrCodec<$fty>>::read(&mut $a, $attr, || op_table!(@default $($default)?))? ),* })
        })
    };
    (@read $n:ident, $a:ident, $kind:ident, $variant:ident, $lit:literal) => { ($n == $lit).then(|| Ok::<Op, AttrError>(Op::$variant)) };
}

const ANY: usize = usize::MAX;

op_table! {
    /// A graph input (no operands; its type is the node's output type).
    Input => "Input", arity (0, 0), Source, Source;
    /// A constant tensor (weights, shapes, scalars).
    Constant(t: Tensor) => "Constant", arity (0, 0), Source, Source;

    // ----- elementwise -----
    /// `(x) -> y`, elementwise.
    Unary(u: UnaryOp) => family, arity (1, 1), Elementwise, Elementwise;
    /// `(a, b) -> y`, elementwise with numpy broadcasting.
    Binary(b: BinaryOp) => family, arity (2, 2), Elementwise, Elementwise;
    /// `(x, min?, max?) -> y`; bounds are scalars.
    Clip => "Clip", arity (1, 3), Elementwise, Elementwise;
    /// `(cond, x, y) -> z`, broadcasting all three.
    Where => "Where", arity (3, 3), Elementwise, Elementwise;
    /// `(x) -> y` converted to `to`; to an 8- or 4-bit float, out-of-range values saturate to the
    /// largest finite one unless `saturate` is off (then infinity or NaN).
    Cast { to: DType; "to" as Type, saturate: bool = true; "saturate" as Flag } => "Cast", arity (1, 1), Elementwise, Elementwise;
    /// `(x) -> y`, x's bits read as `to` (of the same width): no value is converted.
    BitCast { to: DType; "to" as Type } => "BitCast", arity (1, 1), Elementwise, Elementwise;

    // ----- contractions -----
    /// `(a, b) -> y`, numpy matmul (batched, 1-D operands promoted).
    MatMul => "MatMul", arity (2, 2), Root, Contraction;
    /// `(a, b, c?) -> alpha * a' b' + beta * c`.
    Gemm(g: Gemm) => "Gemm", arity (2, 3), Root, Contraction;
    /// `(x...) -> y`, Einstein summation (`"ij,jk->ik"`).
    Einsum { equation: String = String::new(); "equation" as Str } => "Einsum", arity (1, ANY), Root, Contraction;

    // ----- windows -----
    /// `(x, w, b?) -> y`, N-d convolution with groups.
    Conv(c: Conv) => "Conv", arity (2, 3), Root, Window;
    /// `(x, w, b?) -> y`, N-d transposed convolution with groups.
    ConvTranspose(c: ConvTranspose) => "ConvTranspose", arity (2, 3), Root, Window;
    /// `(x, image_shape, block_shape) -> y`: columns of blocks `[N, C * prod(block), L]` summed
    /// back into the image `[N, C, image...]` (the inverse of im2col; PyTorch's `fold`).
    Col2Im(c: Col2Im) => "Col2Im", arity (3, 3), Root, Window, shapes &[1, 2];
    /// `(x, w, offset, b?, mask?) -> y`: 2-D convolution (`x` `[N, C, H, W]`, `w` `[M,
    /// C/group, kH, kW]`) whose every tap reads `x` bilinearly (zero outside) at its place moved
    /// by `offset` `[N, offset_group * kH * kW * 2, oH, oW]` (each tap's dy, dx), times `mask`
    /// `[N, offset_group * kH * kW, oH, oW]` (ones when absent), plus `b` `[M]`.
    DeformConv(d: DeformConv) => "DeformConv", arity (3, 5), Root, Window;
    /// `(x) -> (y, indices)`: MaxPool (indices only for Max), AveragePool, LpPool.
    Pool(p: Pool) => family, arity (1, 1), Root, Window;
    /// `(x) -> y`: pooling over every spatial dimension, kept as size 1.
    GlobalPool(k: PoolKind) => family, arity (1, 1), Root, Window;

    // ----- signal processing -----
    /// `(x, dft_length?, axis?) -> y`: the discrete Fourier transform of `x` along `axis` (a
    /// scalar; -2 when absent; never the last axis). `x` is `[..., 1]` (real) or `[..., 2]`
    /// (real and imaginary parts); along `axis` it is cut or zero-padded to `dft_length` (the
    /// axis' size when absent; `2 * (size - 1)` for an inverse one-sided transform). `inverse`
    /// gives the inverse (scaled by `1 / dft_length`); `onesided` keeps the first
    /// `dft_length / 2 + 1` bins of a forward transform, and makes an inverse one the real
    /// signal of a one-sided (Hermitian) spectrum, `[..., dft_length, ..., 1]`.
    Dft { inverse: bool = false; "inverse" as Flag, onesided: bool = false; "onesided" as Flag }
        => "DFT", arity (1, 3), Root, Signal, shapes &[1, 2];
    /// `(signal, frame_step, window?, frame_length?) -> y`: the short-time Fourier transform of
    /// `signal` `[batch, length, 1 or 2]`: frames of `frame_length` (the window's length, else
    /// the signal's) every `frame_step` points, each times `window` (ones when absent), each
    /// transformed: `[batch, frames, bins, 2]`, `frames = 1 + (length - frame_length) /
    /// frame_step`, `bins = frame_length / 2 + 1` when `onesided`, else `frame_length`.
    Stft { onesided: bool = true; "onesided" as Flag } => "STFT", arity (2, 4), Root, Signal, shapes &[1, 3];
    /// `(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz) -> y`: the
    /// `[dft_length / 2 + 1, num_mel_bins]` matrix of triangular mel filters that maps a
    /// one-sided spectrum to mel bins, of type `dtype` (f32 when `None`). Every operand decides
    /// the result, so it folds to a constant once they are known.
    MelWeightMatrix { dtype: Option<DType> = None; "output_datatype" as OptType }
        => "MelWeightMatrix", arity (5, 5), Root, Signal, shapes &[0, 1, 2, 3, 4];

    // ----- normalisations -----
    /// `(x) -> y`, along one axis.
    Softmax { axis: i64 = -1; "axis" as Int } => "Softmax", arity (1, 1), Root, Normalize;
    /// `(x) -> y`, `log(softmax(x))` along one axis.
    LogSoftmax { axis: i64 = -1; "axis" as Int } => "LogSoftmax", arity (1, 1), Root, Normalize;
    /// `(x) -> y`, one-hot of the first maximum along one axis.
    Hardmax { axis: i64 = -1; "axis" as Int } => "Hardmax", arity (1, 1), Root, Normalize;
    /// `(x, scale, bias?) -> (y, mean, inv_std_dev)`, normalising over axes `axis..rank`.
    LayerNorm { axis: i64 = -1; "axis" as Int, epsilon: f32 = 1e-5; "epsilon" as Float } => "LayerNormalization", arity (2, 3), Root, Normalize;
    /// `(x, scale, bias, mean, var) -> y`, inference form.
    BatchNorm { epsilon: f32 = 1e-5; "epsilon" as Float } => "BatchNormalization", arity (5, 5), Root, Normalize;
    /// `(x, scale, bias) -> y`, per sample and channel over the spatial axes.
    InstanceNorm { epsilon: f32 = 1e-5; "epsilon" as Float } => "InstanceNormalization", arity (3, 3), Root, Normalize;
    /// `(x, scale, bias) -> y`, over channel groups; scale and bias are per channel.
    GroupNorm { epsilon: f32 = 1e-5; "epsilon" as Float, num_groups: usize = 0; "num_groups" as Size } => "GroupNormalization", arity (3, 3), Root, Normalize;
    /// `(x, scale) -> y`, `x / sqrt(mean(x^2) + epsilon) * scale` over axes `axis..rank`.
    RmsNorm { axis: i64 = -1; "axis" as Int, epsilon: f32 = 1e-5; "epsilon" as Float } => "RMSNormalization", arity (2, 2), Root, Normalize;
    /// `(x) -> y`, local response normalisation across channels.
    Lrn(l: Lrn) => "LRN", arity (1, 1), Root, Normalize;
    /// `(x) -> y`, `x / ||x||_p` along one axis.
    LpNorm { axis: i64 = -1; "axis" as Int, p: u32 = 2; "p" as Count } => "LpNormalization", arity (1, 1), Root, Normalize;
    /// `(x) -> y`, `(x - mean) / std` over `axes`.
    MeanVarianceNorm { axes: Vec<i64> = vec![0, 2, 3]; "axes" as Ints } => "MeanVarianceNormalization", arity (1, 1), Root, Normalize;

    // ----- reductions and scans -----
    /// `(x, axes?) -> y`.
    Reduce(r: Reduce) => family, arity (1, 2), Root, Reduce, shapes &[1];
    /// `(x) -> indices (i64)`: ArgMax, ArgMin.
    ArgReduce(r: ArgReduce) => family, arity (1, 1), Root, Reduce;
    /// `(x, axis) -> y`: CumSum, CumProd.
    Cumulative(c: Cumulative) => family, arity (2, 2), Root, Reduce, shapes &[1];
    /// `(x) -> y`, the determinant of each matrix of the last two (square) axes.
    Det => "Det", arity (1, 1), Root, Reduce;
    /// `(x, k) -> (values, indices)`.
    TopK { axis: i64 = -1; "axis" as Int, largest: bool = true; "largest" as Flag, sorted: bool = true; "sorted" as Flag }
        => "TopK", arity (2, 2), Root, Reduce, shapes &[1], outputs 2;

    // ----- data movement -----
    /// `(x, shape) -> y`; `0` copies a dimension unless `allowzero`, `-1` is inferred.
    Reshape { allowzero: bool = false; "allowzero" as Flag } => "Reshape", arity (2, 2), View, Movement, shapes &[1];
    /// `(x) -> y`, 2-D: dims before `axis` times dims from `axis`.
    Flatten { axis: i64 = 1; "axis" as Int } => "Flatten", arity (1, 1), View, Movement;
    /// `(x) -> y`, dimensions permuted.
    Transpose { perm: Vec<usize> = Vec::new(); "perm" as Sizes } => "Transpose", arity (1, 1), Root, Movement;
    /// `(x, axes?) -> y`; without axes every size-1 dimension goes.
    Squeeze => "Squeeze", arity (1, 2), View, Movement, shapes &[1];
    /// `(x, axes) -> y`.
    Unsqueeze => "Unsqueeze", arity (2, 2), View, Movement, shapes &[1];
    /// `(x...) -> y`.
    Concat { axis: i64; "axis" as RequiredInt } => "Concat", arity (1, ANY), Root, Movement;
    /// `(x, split?) -> y...` into `num_outputs` parts (equal unless `split` gives sizes).
    Split { axis: i64 = 0; "axis" as Int, num_outputs: usize = 0; "num_outputs" as Size }
        => "Split", arity (1, 2), Root, Movement, shapes &[1], outputs *num_outputs;
    /// `(x, starts, ends, axes?, steps?) -> y`.
    Slice => "Slice", arity (3, 5), Root, Movement, shapes &[1, 2, 3, 4];
    /// `(x, indices) -> y`, taking along `axis`.
    Gather { axis: i64 = 0; "axis" as Int } => "Gather", arity (2, 2), Root, Movement;
    /// `(x, indices) -> y`, `y[i][j] = x[indices[i][j]][j]` along `axis`.
    GatherElements { axis: i64 = 0; "axis" as Int } => "GatherElements", arity (2, 2), Root, Indexing;
    /// `(x, indices) -> y`, indexing the leading dimensions by index tuples.
    GatherNd { batch_dims: usize = 0; "batch_dims" as Size } => "GatherND", arity (2, 2), Root, Indexing;
    /// `(x, indices, updates) -> y` along `axis`.
    ScatterElements { axis: i64 = 0; "axis" as Int, reduction: ScatterReduction = ScatterReduction::None; "reduction" as Named }
        => "ScatterElements", arity (3, 3), Root, Indexing;
    /// `(x, indices, updates) -> y` at index tuples.
    ScatterNd { reduction: ScatterReduction = ScatterReduction::None; "reduction" as Named } => "ScatterND", arity (3, 3), Root, Indexing;
    /// `(x, shape) -> y`, broadcast to `shape`.
    Expand => "Expand", arity (2, 2), Root, Movement, shapes &[1];
    /// `(x, repeats) -> y`.
    Tile => "Tile", arity (2, 2), Root, Indexing, shapes &[1];
    /// `(x, pads, value?, axes?) -> y`.
    Pad { mode: PadMode = PadMode::Constant; "mode" as Named } => "Pad", arity (2, 4), Root, Indexing, shapes &[1, 3];
    /// `(x, shape) -> y`, each of `axes` (every axis when empty) cropped or zero-padded about its
    /// centre to the size `shape` gives it.
    CenterCropPad { axes: Vec<i64> = Vec::new(); "axes" as Ints } => "CenterCropPad", arity (2, 2), Root, Indexing, shapes &[1];
    /// `(x) -> i64[n]`, the dimensions `start..end`.
    Shape { end: Option<i64> = None; "end" as OptInt, start: i64 = 0; "start" as Int } => "Shape", arity (1, 1), Root, Generate;
    /// `(x) -> i64[]`, the element count.
    Size => "Size", arity (1, 1), Root, Generate;
    /// `(shape) -> y` filled with `value` (a one-element tensor that also gives the type).
    ConstantOfShape { value: Tensor = Tensor::vector(&[0f32]); "value" as TensorValue } => "ConstantOfShape", arity (1, 1), Root, Generate, shapes &[0];
    /// `(start, limit, delta) -> y`.
    Range => "Range", arity (3, 3), Root, Generate, shapes &[0, 1, 2];
    /// `(indices, depth, values) -> y`, a new axis `axis` of size `depth`.
    OneHot { axis: i64 = -1; "axis" as Int } => "OneHot", arity (3, 3), Root, Indexing, shapes &[1];
    /// `(x, k?) -> y`, the upper or lower triangle of the last two axes.
    Trilu { upper: bool = true; "upper" as Flag } => "Trilu", arity (1, 2), Root, Indexing, shapes &[1];
    /// `(x) -> y` of x's shape (2-D): ones on diagonal `k`, of type `dtype` (x's if `None`).
    EyeLike { dtype: Option<DType> = None; "dtype" as OptType, k: i64 = 0; "k" as Int } => "EyeLike", arity (1, 1), Root, Generate;
    /// `(size) -> y`: a Hann, Hamming or Blackman window of `size` points.
    SignalWindow(w: SignalWindow) => family, arity (1, 1), Root, Generate, shapes &[0];
    /// `(x) -> y`, channels to space in blocks (`crd`: column-row-depth order, else depth-column-row).
    DepthToSpace { blocksize: usize = 0; "blocksize" as Size, crd: bool = false; "mode" as DepthMode } => "DepthToSpace", arity (1, 1), Root, Indexing;
    /// `(x) -> y`, space to channels in blocks.
    SpaceToDepth { blocksize: usize = 0; "blocksize" as Size } => "SpaceToDepth", arity (1, 1), Root, Indexing;
    /// `(x, roi?, scales?, sizes?) -> y`.
    Resize(r: Resize) => "Resize", arity (1, 4), Root, Resize, shapes &[1, 2, 3];
    /// `(x, grid) -> y`: x `[N, C, D1..Dr]` (r = 2 or 3) sampled at the normalised points of
    /// `grid` `[N, H1..Hr, r]` (each point's coordinates innermost axis first, -1 and 1 the
    /// edges: the outer pixels' centres with `align_corners`, else their outer borders), giving
    /// `[N, C, H1..Hr]`. `mode` interpolates (linear, nearest rounding half to even, cubic with
    /// Keys' a = -0.75); `padding` says what points and taps outside x read.
    GridSample { mode: ResizeMode = ResizeMode::Linear; "mode" as Named, padding: GridPadding = GridPadding::Zeros; "padding_mode" as Named, align_corners: bool = false; "align_corners" as Flag }
        => "GridSample", arity (2, 2), Root, Resize;
    /// `(theta, size) -> grid`: the normalised sampling grid of GridSample for the affine maps
    /// `theta` (`[N, 2, 3]` for `size = [N, C, H, W]`, `[N, 3, 4]` for `[N, C, D, H, W]`), each
    /// output pixel's centre (x, y[, z]) in [-1, 1] mapped by its batch's matrix:
    /// `[N, H, W, 2]` or `[N, D, H, W, 3]`.
    AffineGrid { align_corners: bool = false; "align_corners" as Flag } => "AffineGrid", arity (2, 2), Root, Resize, shapes &[1];
    /// `(x, rois, batch_indices) -> y`: for each box of `rois` `[R, 4]` (x1, y1, x2, y2, in
    /// input pixels times `spatial_scale`) on the image `batch_indices[r]` of `x` `[N, C, H,
    /// W]`, `[R, C, output_height, output_width]` bins, each pooled (`mode`) from a grid of
    /// `sampling_ratio` x `sampling_ratio` bilinear samples (`ceil(bin size)` per axis when 0).
    RoiAlign { coordinates: RoiCoordinates = RoiCoordinates::HalfPixel; "coordinate_transformation_mode" as Named, mode: RoiPooling = RoiPooling::Avg; "mode" as Named, output_height: usize = 1; "output_height" as Size, output_width: usize = 1; "output_width" as Size, sampling_ratio: usize = 0; "sampling_ratio" as Size, spatial_scale: f32 = 1.0; "spatial_scale" as Float }
        => "RoiAlign", arity (3, 3), Root, Resize;
    /// `(x) -> i64[rank, n]`, the indices of the non-zero elements.
    NonZero => "NonZero", arity (1, 1), Root, Indexing;
    /// `(x, condition) -> y`, the slices where `condition` holds (flattened without `axis`).
    Compress { axis: Option<i64> = None; "axis" as OptInt } => "Compress", arity (2, 2), Root, Indexing;
    /// `(boxes, scores, max_output_boxes_per_class?, iou_threshold?, score_threshold?) ->
    /// i64[n, 3]`: per batch and class, the boxes greedily kept in order of falling score
    /// (ties: the lower index first), each dropped whose IoU with one kept exceeds the threshold,
    /// at most `max_output_boxes_per_class` of them (none when absent), each row
    /// `[batch, class, box]`. Boxes are `[y1, x1, y2, x2]` (any two opposite corners), or
    /// `[x_centre, y_centre, width, height]` with `center_point_box`. The row count depends on
    /// the data.
    NonMaxSuppression { center_point_box: bool = false; "center_point_box" as Flag }
        => "NonMaxSuppression", arity (2, 5), Root, Indexing;
    /// `(x) -> (y, indices, inverse_indices, counts)`: the distinct elements of `x` (flattened),
    /// or its distinct slices along `axis`, ascending with `sorted`, else in order of first
    /// occurrence; each one's first index, each input position's index into `y`, and each one's
    /// count (i64). The count of distinct entries depends on the data.
    Unique { axis: Option<i64> = None; "axis" as OptInt, sorted: bool = true; "sorted" as Flag }
        => "Unique", arity (1, 1), Root, Indexing, outputs 4;
    /// `(x, sequence_lens) -> y`, each batch entry's first `len` steps reversed.
    ReverseSequence { batch_axis: usize = 1; "batch_axis" as Size, time_axis: usize = 0; "time_axis" as Size }
        => "ReverseSequence", arity (2, 2), Root, Indexing;
    /// `(x) -> x`.
    Identity => "Identity", arity (1, 1), Elementwise, Elementwise;

    // ----- sequence models -----
    /// `(x, w, r, b?, sequence_lens?, initial_h?, initial_c?, p?) -> (y, y_h, y_c)`: RNN, GRU, LSTM.
    Rnn(r: Rnn) => family, arity (3, if matches!(r.cell, RnnCell::Lstm { .. }) { 8 } else { 6 }), Root, Sequence, outputs 2;
    /// `(q, k, v, attn_mask?, past_key?, past_value?) -> (y, present_key, present_value, qk)`.
    Attention(t: Attention) => "Attention", arity (3, 7), Root, Sequence;
    /// `(x, cos_cache, sin_cache, position_ids?) -> y`.
    RotaryEmbedding(r: RotaryEmbedding) => "RotaryEmbedding", arity (3, 4), Root, Sequence;
    /// `(x, weight, bias?, past_state?) -> (y, present_state)`: a causal depthwise 1-D
    /// convolution of x `[B, C, L]` by weight `[C, 1, k]`, reading `past_state` `[B, C, k - 1]`
    /// (zeros when absent) before x's first position; `present_state` is the last k - 1
    /// positions of past and x together. `activation` silu (or its alias swish) applies
    /// `y * sigmoid(y)` after the bias.
    CausalConvWithState { activation: CausalActivation = CausalActivation::None; "activation" as Named }
        => "CausalConvWithState", arity (2, 4), Root, Sequence, outputs 2;
    /// `(query, key, value, past_state?, decay?, beta?) -> (output, present_state)`: linear
    /// attention over `[B, T, heads * size]` inputs, the recurrent state `[B, H_kv, d_k, d_v]`
    /// (zeros when absent) updated token by token by `update_rule`, each query head reading its
    /// KV head's state (`q_num_heads / kv_num_heads` query heads share one): output
    /// `[B, T, H_q * d_v]`. `decay` is `[B, T, H_kv]` or `[B, T, H_kv * d_k]`, `beta` `[B, T, H_kv]`
    /// or `[B, T, 1]`.
    LinearAttention(a: LinearAttention) => "LinearAttention", arity (3, 6), Root, Sequence, outputs 2;

    // ----- losses -----
    /// `(input, target, weight?) -> loss`.
    NllLoss(l: Loss) => "NegativeLogLikelihoodLoss", arity (2, 3), Root, Loss;
    /// `(scores, labels, weights?) -> (loss, log_prob)`.
    SoftmaxCrossEntropyLoss(l: Loss) => "SoftmaxCrossEntropyLoss", arity (2, 3), Root, Loss;

    // ----- control flow -----
    /// `(cond, captured...) -> results`: runs one branch. Each branch takes the captured values
    /// as its inputs, in order, and has one output per result.
    If { else_branch: Subgraph; "else_branch" as GraphAttr, then_branch: Subgraph; "then_branch" as GraphAttr }
        => "If", arity (1, ANY), Control, Control, outputs then_branch.0.outputs().len();
    /// `(captured..., state..., scanned...) -> (state..., stacked...)`: runs the body once per
    /// position along the scanned inputs' axes, carrying the state from one step to the next.
    Scan(s: Box<Scan>) => "Scan", arity (1, ANY), Control, Control, outputs s.body.0.outputs().len();
    /// `(captured..., trip count?, cond?, state...) -> (state..., stacked...)`: runs the body
    /// while the step is below the trip count and the condition holds, carrying the state. The
    /// trip count and the condition are positional, either may be absent.
    Loop(l: Box<Loop>) => "Loop", arity (0, ANY), Control, Control, outputs l.body.0.outputs().len().saturating_sub(1);

    // ----- quantization -----
    /// `(x, scale, zero_point?) -> y`, ONNX QuantizeLinear: round-half-even(x / scale) +
    /// zero_point, saturated to the result type (the zero point's, else `dtype`, else u8). The
    /// scale is one value, one per position along `axis` (1-D), or (`block_size` > 0, the rank of
    /// `x`) one per block of `block_size` positions along `axis`; the zero point is shaped alike.
    Quantize { axis: i64 = 1; "axis" as Int, block_size: usize = 0; "block_size" as Size, dtype: Option<DType> = None; "output_dtype" as OptType, saturate: bool = true; "saturate" as Flag }
        => "QuantizeLinear", arity (2, 3), Root, Quantize;
    /// `(x, scale, zero_point?) -> y`, ONNX DequantizeLinear: (x - zero_point) * scale, in the
    /// scale's type; the scale as Quantize's.
    Dequantize { axis: i64 = 1; "axis" as Int, block_size: usize = 0; "block_size" as Size } => "DequantizeLinear", arity (2, 3), Root, Quantize;
    /// `(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias?) -> y`,
    /// kiln's own integer convolution, with ONNX QLinearConv's meaning: `Σ (x - x_zp)(w - w_zp)
    /// + bias` (exact, in integers), times `x_scale * w_scale / y_scale`, rounded half to even,
    /// plus `y_zp`, saturated to `y_zp`'s type. The activation's scale and zero point are one
    /// value; the weight's are one or one per output channel; the bias is int32 `[M]`. The CPU's
    /// `integer` pass makes it from DequantizeLinear -> Conv -> QuantizeLinear where the CPU's
    /// integer kernel runs it; the importer still expands ONNX's QLinearConv into those three.
    QConv(c: Conv) => "QConv", arity (8, 9), Root, Window;
    /// `(x, w, w_scale) -> y`, kiln's own dynamically quantized matrix product, what
    /// onnxruntime's `quantize_dynamic` writes (DynamicQuantizeLinear, MatMulInteger, a Cast to
    /// f32 and a Mul by the product of the scales) as one op: `x` (f32 `[..., K]`) quantized to
    /// u8 as DynamicQuantizeLinear does (scale `(max(x, 0) - min(x, 0)) / 255`, zero point
    /// `round(clip(-min / scale, 0, 255))`, the whole tensor's), less its zero point, times the
    /// weights `w` (`[K, M]`, s8 or int32, their zero point already subtracted) summed in int32,
    /// the sum in f32 times
    /// `scale * w_scale` (one value or one per column). The CPU's `dynamic` pass makes it where
    /// its integer kernel runs it.
    DynQMatMul => "DynQMatMul", arity (3, 3), Root, Quantize;
    /// `(a, b, scales, zero_points?, bias?) -> y`, onnxruntime's com.microsoft MatMulNBits
    /// (weight-only quantized matrix product): `a` (f32 `[..., k]`) times the transpose of the
    /// dequantized `b` (plus `bias`, f32 `[n]`). `b` is u8 `[n, blocks, block_size * bits / 8]`:
    /// each of the n columns' k weights in blocks of `block_size` (a power of two, 16 or more;
    /// the last block padded), packed `bits` at a time from each byte's low bits up. A weight is
    /// `(q - zero_point) * scale` with one f32 scale and zero point per column and block
    /// (`scales` and `zero_points` f32 `[n, blocks]`; without zero points `2^(bits - 1)`). Only
    /// 4 bits. The importer unpacks onnxruntime's packed u8 zero points into floats.
    MatMulNBits { k: usize = 0; "K" as Size, n: usize = 0; "N" as Size, bits: usize = 4; "bits" as Size, block_size: usize = 0; "block_size" as Size }
        => "MatMulNBits", arity (3, 5), Root, Quantize;

    // ----- strings -----
    /// `(x, y) -> z`, string `x[i] + y[i]`, broadcast.
    StringConcat => "StringConcat", arity (2, 2), Root, Strings;
    /// `(x) -> (substrings, lengths)`: each string of x split at `delimiter` (empty: at runs of
    /// whitespace, leading and trailing ones dropped) at most `maxsplit` times; `substrings` is
    /// x's shape plus an axis as long as the most pieces, padded with empty strings, `lengths`
    /// (i64, x's shape) each string's count of pieces. Its result shape depends on the data.
    StringSplit { delimiter: String = String::new(); "delimiter" as Str, maxsplit: Option<i64> = None; "maxsplit" as OptInt }
        => "StringSplit", arity (1, 1), Root, Strings, outputs 2;
    /// `(x) -> y`: the strings of x (1-D `[C]` or `[1, C]`) that are not `stopwords` (compared
    /// ignoring case unless `is_case_sensitive`), changed to `case_change_action` (`LOWER`,
    /// `UPPER` or `NONE`); none left gives one empty string. Its result shape depends on the
    /// data.
    StringNormalizer { case_change_action: String = "NONE".into(); "case_change_action" as Str, is_case_sensitive: bool = false; "is_case_sensitive" as Flag, locale: String = String::new(); "locale" as Str, stopwords: Vec<String> = Vec::new(); "stopwords" as Strs }
        => "StringNormalizer", arity (1, 1), Root, Strings;
    /// `(x) -> bool y`: whether all of each string matches `pattern` (RE2 syntax).
    RegexFullMatch { pattern: String = String::new(); "pattern" as Str } => "RegexFullMatch", arity (1, 1), Root, Strings;
    /// `(x) -> y`, ai.onnx.ml's LabelEncoder: each element of x looked up in `keys`, giving the
    /// `values` entry at its position, else `default` (one value); keys and values are 1-D
    /// tensors of one length (strings, i64, f32...), `default` of the values' type. The importer
    /// turns the `keys_*`/`values_*`/`default_*` lists into these tensors.
    LabelEncoder { keys: Tensor; "keys_tensor" as TensorValue, values: Tensor; "values_tensor" as TensorValue, default: Tensor; "default_tensor" as TensorValue }
        => "LabelEncoder", arity (1, 1), Root, Strings;

    // ----- sequences and optionals -----
    /// The ONNX sequence ops (`SequenceAt`, `SplitToSequence`...).
    Sequence(s: SequenceOp) => family, arity s.arity(), Control, Collection, outputs s.outputs();
    /// The ONNX optional ops.
    Optional(o: OptionalOp) => family, arity o.arity(), Control, Collection;
}

/// `Loop`: the body takes the captured values, the step number (one i64), the condition (one
/// bool) and the state, in that order, and gives the next condition, the next state and one
/// slice of each stacked result (stacked along a new leading axis, one slice per step).
#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    pub body: Subgraph,
    /// Leading operands the body reads from outside (values ONNX lets a body name implicitly).
    pub captures: usize,
}

impl Loop {
    /// How many state values a node with `operands` operands carries (after the captured values,
    /// the trip count and the condition).
    pub fn states(&self, operands: usize) -> usize {
        operands.saturating_sub(self.captures + 2)
    }

    /// Whether the body's condition result is true whenever its condition input is: the input
    /// passed on (through Identities) or a constant true. Such a loop runs exactly its trip count
    /// when it starts.
    pub fn condition_stays_true(&self) -> bool {
        let body = &self.body.0;
        let Some(&(_, mut v)) = body.outputs().first() else { return false };
        let Some(&cond_in) = body.inputs().get(self.captures + 1) else { return false };
        loop {
            if v.node == cond_in {
                return true;
            }
            if let Some(t) = body.constant_value(v) {
                return t.to_f64s().first().is_some_and(|&x| x != 0.0);
            }
            match (&body.node(v.node).op, body.operands(v.node).first()) {
                (Op::Identity, Some(Some(next))) => v = *next,
                _ => return false,
            }
        }
    }
}

/// `Scan` (ONNX opset 9 and later): the body takes the captured values, the state and one slice
/// of each scanned input (its axis removed), in that order, and gives the next state and one
/// slice of each stacked result.
#[derive(Clone, Debug, PartialEq)]
pub struct Scan {
    pub body: Subgraph,
    /// Leading operands the body reads from outside (values ONNX lets a body name implicitly).
    pub captures: usize,
    /// Trailing operands that are scanned; the operands between are the initial state.
    pub scan_inputs: usize,
    /// Per scanned input: its axis, and whether it is read from the last position (empty: axis
    /// 0, forward, for each).
    pub input_axes: Vec<i64>,
    pub input_reverse: Vec<bool>,
    /// Per stacked result: the axis its slices are stacked along, and whether the last step's
    /// slice comes first (empty: axis 0, forward, for each).
    pub output_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
}

impl Scan {
    /// How many state values a node with `operands` operands carries.
    pub fn states(&self, operands: usize) -> usize {
        operands.saturating_sub(self.captures + self.scan_inputs)
    }

    /// Scanned input `i`'s axis (not normalised) and whether it is read backwards.
    pub fn input(&self, i: usize) -> (i64, bool) {
        (
            self.input_axes.get(i).copied().unwrap_or(0),
            self.input_reverse.get(i).copied().unwrap_or(false),
        )
    }

    /// Stacked result `k`'s axis (not normalised) and whether it is stacked backwards.
    pub fn output(&self, k: usize) -> (i64, bool) {
        (
            self.output_axes.get(k).copied().unwrap_or(0),
            self.output_reverse.get(k).copied().unwrap_or(false),
        )
    }

    /// Whether the lists name one entry per scanned input and per stacked result (or none).
    pub fn lists_fit(&self, stacked: usize) -> bool {
        let fits = |n: usize, want: usize| n == 0 || n == want;
        fits(self.input_axes.len(), self.scan_inputs)
            && fits(self.input_reverse.len(), self.scan_inputs)
            && fits(self.output_axes.len(), stacked)
            && fits(self.output_reverse.len(), stacked)
    }
}

/// `Gemm` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

impl Default for Gemm {
    fn default() -> Gemm {
        Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false }
    }
}

/// Rows of the op table that are kiln's own, not ONNX's: the importer does not take them
/// (MatMulNBits is onnxruntime's com.microsoft op, which the importer reads itself).
/// LabelEncoder is ai.onnx.ml's, which the importer reads itself too.
pub const KILN_OWN: &[&str] = &["QConv", "DynQMatMul", "MatMulNBits", "LabelEncoder"];

/// `Conv` attributes (the kernel shape is the weight's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    pub window: Window,
    pub group: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    /// `count_include_pad`: padded cells count in the divisor.
    Average {
        count_include_pad: bool,
    },
    /// The p-norm of the window.
    Lp {
        p: u32,
    },
}

/// `MaxPool` / `AveragePool` / `LpPool` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub kind: PoolKind,
    pub kernel: Vec<usize>,
    pub window: Window,
    pub ceil_mode: bool,
    /// MaxPool's indices count in column-major order (ONNX `storage_order = 1`).
    pub column_major_indices: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 10] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
        ReduceKind::SumSquare,
    ];

    /// The ONNX op name (`ReduceSum`...).
    pub fn op_name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }
}

/// `Reduce*` attributes; the axes are an operand.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduce {
    pub kind: ReduceKind,
    pub keepdims: bool,
    /// With no axes: reduce nothing (true) or everything (false, the default).
    pub noop_with_empty_axes: bool,
}

impl Op {
    /// Pure elementwise ops (one output element from the same-index elements of the operands).
    pub fn is_elementwise(&self) -> bool {
        self.kind() == OpKind::Elementwise
    }

    /// Shape-only ops: a new shape on the same bytes.
    pub fn is_view(&self) -> bool {
        self.kind() == OpKind::View
    }

    /// How a gather or scatter addresses its data (operand 0) with the indices it reads from
    /// operand 1; `None` for every other op.
    pub fn indexed_by(&self) -> Option<IndexedBy> {
        match self {
            Op::Gather { axis }
            | Op::GatherElements { axis }
            | Op::ScatterElements { axis, .. } => Some(IndexedBy::Axis(*axis)),
            Op::GatherNd { batch_dims } => Some(IndexedBy::Tuple { first: *batch_dims }),
            Op::ScatterNd { .. } => Some(IndexedBy::Tuple { first: 0 }),
            _ => None,
        }
    }
}

/// How a gather or scatter addresses its data with its indices ([`Op::indexed_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexedBy {
    /// Each index is a position along one axis (not normalised): Gather, GatherElements,
    /// ScatterElements.
    Axis(i64),
    /// Each index tuple (along the indices' last axis) is a position in the data's axes from
    /// `first` on: GatherND after its batch dimensions, ScatterND.
    Tuple { first: usize },
}
