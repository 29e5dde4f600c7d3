//! Attribute types of the larger ops, and the small enums ONNX spells as strings.

use super::{UnaryOp, Window};
use crate::DType;

/// An enum whose variants ONNX names with strings; `name` and `from_name` convert.
macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            pub fn from_name(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl $crate::op::schema::NamedEnum for $name {
            fn name(self) -> &'static str {
                $name::name(self)
            }
            fn from_name(s: &str) -> Option<$name> {
                $name::from_name(s)
            }
        }
    };
}

/// `ConvTranspose` attributes (the kernel shape is the weight's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvTranspose {
    pub window: Window,
    pub group: usize,
    /// Extra size added to one side of each spatial output dimension.
    pub output_padding: Vec<usize>,
    /// When set, the spatial output size, and the padding is derived from it.
    pub output_shape: Vec<usize>,
}

/// `LRN` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Lrn {
    pub alpha: f32,
    pub beta: f32,
    pub bias: f32,
    pub size: usize,
}

/// `ArgMax` / `ArgMin` attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgReduce {
    pub max: bool,
    pub axis: i64,
    pub keepdims: bool,
    /// Ties go to the last index instead of the first.
    pub select_last_index: bool,
}

/// `CumSum` / `CumProd` attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cumulative {
    pub prod: bool,
    pub exclusive: bool,
    pub reverse: bool,
}

named_enum! {
    /// How scatter ops combine an update with the existing value.
    ScatterReduction { None = "none", Add = "add", Mul = "mul", Max = "max", Min = "min" }
}

named_enum! {
    /// How `Pad` fills.
    PadMode { Constant = "constant", Reflect = "reflect", Edge = "edge", Wrap = "wrap" }
}

named_enum! {
    /// Resize interpolation.
    ResizeMode { Nearest = "nearest", Linear = "linear", Cubic = "cubic" }
}

named_enum! {
    /// What GridSample reads at points and taps outside its input: zeros, the nearest edge
    /// pixel, or the input reflected at its borders.
    GridPadding { Zeros = "zeros", Border = "border", Reflection = "reflection" }
}

named_enum! {
    /// How RoiAlign pools the samples of a bin: their mean, or the largest weighted tap.
    RoiPooling { Avg = "avg", Max = "max" }
}

named_enum! {
    /// Where RoiAlign's box corners sit: `half_pixel` shifts them by half a pixel (pixel
    /// centres at integers + 0.5), `output_half_pixel` (opset 10's behaviour) does not.
    RoiCoordinates { HalfPixel = "half_pixel", OutputHalfPixel = "output_half_pixel" }
}

named_enum! {
    /// How Resize maps an output coordinate to an input coordinate.
    CoordinateTransform {
        HalfPixel = "half_pixel",
        HalfPixelSymmetric = "half_pixel_symmetric",
        PytorchHalfPixel = "pytorch_half_pixel",
        AlignCorners = "align_corners",
        Asymmetric = "asymmetric",
        TfCropAndResize = "tf_crop_and_resize",
    }
}

named_enum! {
    /// How Resize's nearest mode rounds.
    NearestMode { RoundPreferFloor = "round_prefer_floor", RoundPreferCeil = "round_prefer_ceil", Floor = "floor", Ceil = "ceil" }
}

named_enum! {
    /// How Resize treats `sizes` on the axes it resizes.
    AspectRatioPolicy { Stretch = "stretch", NotLarger = "not_larger", NotSmaller = "not_smaller" }
}

/// `Resize` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    pub mode: ResizeMode,
    pub coordinate_transform: CoordinateTransform,
    pub nearest_mode: NearestMode,
    pub cubic_coeff_a: f32,
    pub exclude_outside: bool,
    pub extrapolation_value: f32,
    pub antialias: bool,
    /// The axes `scales`/`sizes` refer to; empty means all.
    pub axes: Vec<i64>,
    pub keep_aspect_ratio_policy: AspectRatioPolicy,
}

impl Default for Resize {
    fn default() -> Resize {
        Resize {
            mode: ResizeMode::Nearest,
            coordinate_transform: CoordinateTransform::HalfPixel,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: false,
            axes: Vec::new(),
            keep_aspect_ratio_policy: AspectRatioPolicy::Stretch,
        }
    }
}

/// The recurrent cell of an `Rnn` op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnnCell {
    /// ONNX `RNN`: `h = f(x W + h R + b)`.
    Simple,
    /// ONNX `GRU`.
    Gru { linear_before_reset: bool },
    /// ONNX `LSTM`; `input_forget` couples the input and forget gates.
    Lstm { input_forget: bool },
}

named_enum! {
    RnnDirection { Forward = "forward", Reverse = "reverse", Bidirectional = "bidirectional" }
}

/// `RNN` / `GRU` / `LSTM` attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Rnn {
    pub cell: RnnCell,
    pub direction: RnnDirection,
    pub hidden_size: usize,
    /// The cell's activation functions (f, g[, h]) for each direction, in ONNX order; empty means
    /// ONNX's defaults. Each is an elementwise op with its parameters.
    pub activations: Vec<UnaryOp>,
    /// Inputs to activations are clipped to `[-clip, clip]`.
    pub clip: Option<f32>,
    /// ONNX `layout = 1`: batch-major inputs and outputs.
    pub batch_first: bool,
}

impl Rnn {
    /// The activations in effect (ONNX's defaults when none were given), one list per direction.
    pub fn effective_activations(&self) -> Vec<UnaryOp> {
        if !self.activations.is_empty() {
            return self.activations.clone();
        }
        let one: &[UnaryOp] = match self.cell {
            RnnCell::Simple => &[UnaryOp::Tanh],
            RnnCell::Gru { .. } => &[UnaryOp::Sigmoid, UnaryOp::Tanh],
            RnnCell::Lstm { .. } => &[UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Tanh],
        };
        let dirs = if self.direction == RnnDirection::Bidirectional { 2 } else { 1 };
        one.iter().copied().cycle().take(one.len() * dirs).collect()
    }
}

/// `Attention` (opset 23) attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub is_causal: bool,
    /// Heads of K and V when they come as 3-D [batch, seq, heads * size] (0: 4-D inputs).
    pub kv_num_heads: usize,
    /// Heads of Q when it comes as 3-D.
    pub q_num_heads: usize,
    /// Which intermediate the optional fourth result holds (0: QK, 1: softcapped, 2: softcapped + mask,
    /// 3: softmax); opset 24 applies the softcap before the mask.
    pub qk_matmul_output_mode: i64,
    /// The scale of QK; `None` means `1/sqrt(head_size)`.
    pub scale: Option<f32>,
    /// Softcapping of QK (`softcap * tanh(qk / softcap)`); 0 disables it.
    pub softcap: f32,
    /// The type softmax is computed in; `None` means the input's.
    pub softmax_precision: Option<DType>,
}

/// `RotaryEmbedding` (opset 23) attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RotaryEmbedding {
    pub interleaved: bool,
    /// Heads when the input is 3-D (0: 4-D input).
    pub num_heads: usize,
    /// How many leading features of each head rotate (0: all).
    pub rotary_embedding_dim: usize,
}

named_enum! {
    /// CausalConvWithState's fused activation: none, or SiLU (`x * sigmoid(x)`), which ONNX
    /// also names swish.
    CausalActivation { None = "none", Silu = "silu", Swish = "swish" }
}

impl CausalActivation {
    /// Whether the activation is `x * sigmoid(x)` (silu and its alias swish).
    pub fn is_silu(self) -> bool {
        matches!(self, CausalActivation::Silu | CausalActivation::Swish)
    }
}

named_enum! {
    /// LinearAttention's recurrence: the state `S` (per KV head, `[d_k, d_v]`) is decayed by
    /// `exp(g_t)` (gated ones) and corrected toward `v_t` at `k_t` by `beta_t` (delta ones)
    /// before `k_t ⊗ v_t` is added.
    LinearUpdate { Linear = "linear", Gated = "gated", Delta = "delta", GatedDelta = "gated_delta" }
}

impl LinearUpdate {
    /// Whether the state decays by `exp(decay)` each step (the decay operand is required).
    pub fn gated(self) -> bool {
        matches!(self, LinearUpdate::Gated | LinearUpdate::GatedDelta)
    }

    /// Whether the write is the delta rule's `beta (v - Sᵀk)` (the beta operand is required).
    pub fn delta(self) -> bool {
        matches!(self, LinearUpdate::Delta | LinearUpdate::GatedDelta)
    }
}

/// `LinearAttention` (opset 27) attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearAttention {
    /// A tuning hint of chunked implementations; the result does not depend on it.
    pub chunk_size: i64,
    pub kv_num_heads: usize,
    pub q_num_heads: usize,
    /// The output's scale; 0 means `1/sqrt(d_k)`.
    pub scale: f32,
    pub update_rule: LinearUpdate,
}

impl LinearAttention {
    /// The output's scale for keys of `d_k` features.
    pub fn scale_for(&self, d_k: usize) -> f64 {
        if self.scale == 0.0 {
            1.0 / (d_k as f64).sqrt()
        } else {
            self.scale as f64
        }
    }
}

named_enum! {
    LossReduction { None = "none", Sum = "sum", Mean = "mean" }
}

/// `NegativeLogLikelihoodLoss` / `SoftmaxCrossEntropyLoss` attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    pub reduction: LossReduction,
    /// Targets equal to this contribute nothing.
    pub ignore_index: Option<i64>,
}

/// `Col2Im` attributes; the image and block shapes are operands. Empty lists mean ONNX's
/// defaults (strides and dilations of 1, no padding) on every image axis.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Col2Im {
    pub dilations: Vec<usize>,
    /// Begin values for every image axis, then end values.
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

/// `DeformConv` attributes (2-D). Empty lists mean ONNX's defaults: the weight's kernel, strides
/// and dilations of 1, no padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeformConv {
    pub dilations: Vec<usize>,
    /// Groups of input and output channels, as Conv's.
    pub group: usize,
    pub kernel_shape: Vec<usize>,
    /// Groups of input channels that share one set of offsets (and of mask values).
    pub offset_group: usize,
    /// Begin values for both spatial axes, then end values.
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

impl Default for DeformConv {
    /// ONNX's defaults: one group, one offset group, the rest from the operands.
    fn default() -> DeformConv {
        DeformConv {
            dilations: Vec::new(),
            group: 1,
            kernel_shape: Vec::new(),
            offset_group: 1,
            pads: Vec::new(),
            strides: Vec::new(),
        }
    }
}

/// The window functions of ONNX's signal ops (opset 17), each a sum of cosines:
/// `w[n] = a0 - a1 cos(2πn/N) + a2 cos(4πn/N)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowShape {
    Hann,
    Hamming,
    Blackman,
}

impl WindowShape {
    pub const ALL: [WindowShape; 3] =
        [WindowShape::Hann, WindowShape::Hamming, WindowShape::Blackman];

    /// The ONNX op name.
    pub fn op_name(self) -> &'static str {
        match self {
            WindowShape::Hann => "HannWindow",
            WindowShape::Hamming => "HammingWindow",
            WindowShape::Blackman => "BlackmanWindow",
        }
    }

    /// `(a0, a1, a2)`, as the ONNX reference defines them (Hamming's are 25/46 and 21/46, not
    /// the rounded 0.54 and 0.46).
    pub fn coefficients(self) -> (f64, f64, f64) {
        match self {
            WindowShape::Hann => (0.5, 0.5, 0.0),
            WindowShape::Hamming => (25.0 / 46.0, 21.0 / 46.0, 0.0),
            WindowShape::Blackman => (0.42, 0.5, 0.08),
        }
    }
}

/// HannWindow, HammingWindow, BlackmanWindow: the shape, whether the window is periodic (its
/// period is `size`, for spectral analysis) or symmetric (period `size - 1`, for filter design),
/// and the result type (`output_datatype`; f32 when `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct SignalWindow {
    pub shape: WindowShape,
    pub periodic: bool,
    pub dtype: Option<DType>,
}

impl SignalWindow {
    /// The result type.
    pub fn out_dtype(&self) -> DType {
        self.dtype.unwrap_or(DType::F32)
    }

    /// The window's `size` values.
    pub fn values(&self, size: usize) -> Vec<f64> {
        let (a0, a1, a2) = self.shape.coefficients();
        // A symmetric window of N points is the periodic one of N - 1 points with its first
        // point repeated at the end.
        let period = if self.periodic { size as f64 } else { size.saturating_sub(1) as f64 };
        let tau = 2.0 * std::f64::consts::PI;
        (0..size)
            .map(|n| {
                // One point (symmetric) has no period: it is the window's first point.
                let x = if period > 0.0 { tau * n as f64 / period } else { 0.0 };
                a0 - a1 * x.cos() + a2 * (2.0 * x).cos()
            })
            .collect()
    }
}
