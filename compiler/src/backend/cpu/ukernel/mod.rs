//! Kernels on kiln's own C microkernels: the decision of which kernels take them and how (`plan`,
//! a pure function of the graph, the kernel and the host, whose result prints in
//! `--stage schedule`), the weights packed at compile time into the layout the C code reads, and
//! the kernel's MLIR: a call of the C entry point on the buffers' pointers.
//!
//! A contraction or convolution qualifies when its root is an f32 Conv (1-D or 2-D) or a
//! MatMul/Gemm whose B is a constant 2-D matrix, with enough work to fill register tiles, and its
//! elementwise tail is what the microkernel's epilogue does: adds of a bias (per output channel or
//! column) or of a residual of the result's shape, then at most one ReLU or Clip. Anything else
//! keeps the linalg path (its tail fused there).
//!
//! This module holds what every kernel shape shares: the plan's data (`Shape`, `Ukernel`; the
//! `Host` is in `host`), the entry points (`plan`, `pack`, `build`, `replaced_inputs`,
//! `runs_*`), which dispatch on the root op or on the plan's `Shape`, and the constant readers.
//! Each shape's own planning, description, packing and call live in its module, behind
//! `KernelShape`, its C in a file of its own beside this folder:
//! - `conv`: convolutions, grouped and depthwise (`conv.c`, `depthwise.c`), and transposed
//!   convolutions (`conv.c`), on the packed GEMM (`gemm.c`);
//! - `qconv`: the integer convolution (`quantized.c`);
//! - `dqgemm`: the dynamically quantized matrix product (`quantized.c`);
//! - `nbits`: the 4-bit weight-only matrix product, MatMulNBits (`quantized.c`);
//! - `gemm`: matrix products by a constant B (`gemm.c`, which also holds the packed GEMM the
//!   convolutions and recurrent layers run on);
//! - `pool`: max and average pooling (`pool.c`; u8 max pooling in `quantized.c`);
//! - `gather`: row gathers (`gather.c`);
//! - `recurrent`: RNN, GRU and LSTM layers whole (`recurrent.c`);
//! - `rows`: reductions and softmax (`reduction.c`);
//! - `transpose`: transposes that move the last axis (`movement.c`);
//! - `attention`: attention whole (`attention.c`);
//! - `tiled`: the planning convolutions, transposed convolutions, pooling and GEMMs share (their
//!   tail as the epilogue, cache blocks, work units).

use std::fmt;

use melior::dialect::{arith, func};
use melior::ir::attribute::{
    FlatSymbolRefAttribute, FloatAttribute, IntegerAttribute, StringAttribute, TypeAttribute,
};
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Block, BlockLike, Location, Module, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;

use kiln_ir::op::{RnnCell, RnnDirection};
use kiln_ir::{Graph, NodeId, Op, ValueId};

use crate::codegen::mlir::{op, push};
use crate::fuse::Kernel;
use crate::{CompileError, Precision, Result};

mod attention;
pub(super) mod conv;
mod dqgemm;
mod gather;
mod gemm;
mod host;
mod nbits;
mod pool;
pub(super) mod qconv;
mod recurrent;
mod rows;
mod tiled;
mod transpose;

pub use attention::runs_attention;
pub use host::{Host, Level};
pub use recurrent::runs_recurrent;

/// Columns of the register tile (two 16-float vectors), as `tile.h` has it.
pub const NR: usize = 32;

/// The activation applied last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    None,
    Relu,
    Clip(f32, f32),
    /// (Transposed convolutions only: their epilogue runs over finished planes.)
    Sigmoid,
    /// x * clamp(x / 6 + 1/2, 0, 1): MobileNetV3's activation (DBNet's backbone).
    HardSwish,
    /// x * sigmoid(alpha x): SiLU (alpha 1), YOLO's activation (`passes::recognize`).
    Swish(f32),
}

/// What the microkernel adds to each result as it stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// Per output channel (conv) or column (GEMM), folded from the op's bias and constant adds.
    pub bias: Option<Vec<f32>>,
    /// A value of the result's shape, added (a kernel input).
    pub residual: Option<ValueId>,
    /// The residual is added after the activation, not before (YOLOv8's bottlenecks:
    /// `x + silu(conv(...))`).
    pub residual_last: bool,
    pub activation: Activation,
}

/// Where a recurrent layer's initial state (or cell) comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    /// Zeros.
    None,
    /// A kernel input.
    Input(ValueId),
    /// A constant, packed after the weights.
    Packed,
}

/// The GEMM view of the kernel's root.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// Per image: C[m, oh*ow] = W[m, c*kh*kw] * im2col(x).
    /// Groups one after another; a depthwise convolution (one input and output channel a group)
    /// takes its own kernel, in the form `Ukernel::depthwise_form` gives.
    Conv {
        batch: usize,
        c: usize,
        h: usize,
        w: usize,
        m: usize,
        group: usize,
        kh: usize,
        kw: usize,
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [usize; 2],
        oh: usize,
        ow: usize,
    },
    /// kiln's integer convolution (`QConv`, `qconv.rs`, `quantized.c`): 2-D, one group or
    /// depthwise (`group` = channels), u8 input, s8 weights, int32 sums, requantised to 8 bits
    /// as stored.
    QConv {
        batch: usize,
        c: usize,
        group: usize,
        h: usize,
        w: usize,
        m: usize,
        kh: usize,
        kw: usize,
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [usize; 2],
        oh: usize,
        ow: usize,
        /// The input's zero point as the kernel reads the input: u8, or s8 with its top bit
        /// flipped (x + 128).
        x_zero: u8,
        x_signed: bool,
        y_zero: i32,
        y_signed: bool,
        /// The stored range: the type's, or a Clip's fused into the kernel (an activation the
        /// integer pass turned into a Clip of the 8-bit result).
        y_range: [i32; 2],
        /// `vpdpbusd`, else the exact widening product.
        vnni: bool,
        /// AMX tiles (`tdpbsud`), which take precedence over `vnni` (`qconv::amx_blocks`).
        amx: bool,
    },
    /// kiln's dynamically quantized matrix product (`DynQMatMul`, `dqgemm.rs`, `quantized.c`):
    /// f32 rows `[rows, k]` quantized to u8 at run time (the scale and zero point from their
    /// min and max, in the kernel), by s8 weights `[k, m]`, int32 sums, f32 results.
    DynQGemm { rows: usize, k: usize, m: usize, vnni: bool },
    /// onnxruntime's 4-bit weight-only matrix product (`MatMulNBits`, `nbits.rs`,
    /// `quantized.c`): f32 rows `[rows, k]` by `n` columns of 4-bit weights in blocks of
    /// `block_size` (each with its scale and zero point), unpacked in the loop; f32 results.
    NBitsGemm { rows: usize, k: usize, n: usize, block_size: usize },
    /// C[m, n] = A[m, k] * B[k, n], A an input read row-major (or transposed), B constant.
    Gemm { m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool },
    /// Gather along axis 0: whole rows of `rows` x `row_bytes` data copied by index (any dtype).
    Gather { indices: ValueId, rows: usize, row_bytes: usize, n_idx: usize, idx64: bool },
    /// Max or average pooling (`kind` 0 max, 1 average counting pads, 2 average without them, 3
    /// max of u8, in `quantized.c`);
    /// no weight.
    Pool {
        batch: usize,
        c: usize,
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [usize; 2],
        pad_end: [usize; 2],
        oh: usize,
        ow: usize,
        kind: u8,
    },
    /// One group: cols[cout*kh*kw, h*w] = W^T x, then added into the output (col2im); pads may
    /// be negative (an `output_shape` larger than the full result).
    ConvTranspose {
        batch: usize,
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        kh: usize,
        kw: usize,
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [i64; 2],
        oh: usize,
        ow: usize,
    },
    /// A recurrent layer (RNN, GRU, LSTM) whole (`recurrent.c`): every step's input projection
    /// as one GEMM by the packed W^T, then the time loop, a matrix-vector product by the resident
    /// R^T and the gate arithmetic per step; one direction a workgroup.
    Recurrent {
        cell: RnnCell,
        direction: RnnDirection,
        batch_first: bool,
        seq: usize,
        batch: usize,
        input: usize,
        hidden: usize,
        h0: State,
        c0: State,
        /// The kernel output slot of each result (Y, Y_h, Y_c) that is wanted.
        results: [Option<usize>; 3],
    },
    /// A reduction over a contiguous group of axes, x seen as [outer, reduced, inner] (`kind` 0
    /// sum, 1 mean, 2 max, 3 min; `reduction.c`); global pooling is one over the plane.
    Reduce { outer: usize, reduced: usize, inner: usize, kind: u8 },
    /// Softmax (or LogSoftmax) over the last axis, rows of `cols`.
    Softmax { rows: usize, cols: usize, log: bool },
    /// A transpose that moves the last axis, as a batch of 2-D transposes: x [batch, rows, cols]
    /// becomes [batch, cols, rows] (`movement.c`); 32-bit elements.
    Transpose { batch: usize, rows: usize, cols: usize },
    /// Attention whole (`attention.c`): softmax(Q K^T * scale + mask) V per batch and query
    /// head, Q, K, V and Y read and written where they lie ([batch, seq, heads * size] with
    /// `interleaved`, else [batch, heads, seq, size]); the mask (f32 added, or bool) broadcasts
    /// to [batch, heads, q_seq, kv_seq] from `mask_dims`.
    Attention {
        batch: usize,
        heads: usize,
        kv_heads: usize,
        q_seq: usize,
        kv_seq: usize,
        head: usize,
        v_head: usize,
        interleaved: bool,
        k: ValueId,
        v: ValueId,
        mask: Option<(ValueId, bool)>,
        mask_dims: [usize; 4],
        causal: bool,
        scale: f32,
    },
}

/// The decision for one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Ukernel {
    pub shape: Shape,
    /// The root's data input and constant weight.
    pub input: ValueId,
    pub weight: ValueId,
    pub epilogue: Epilogue,
    pub mr: usize,
    pub kc: usize,
    pub mc: usize,
    pub nc: usize,
    /// Work units per image (conv) or in all (GEMM), each a range of columns (`split_n`) or rows.
    pub chunks: usize,
    pub split_n: bool,
    /// A depthwise convolution's bands of output rows: each of its `chunks` units an image is a
    /// chunk of channels and a band of rows (`chunks / row_bands` channel chunks); 1 for every
    /// other kernel.
    pub row_bands: usize,
    /// A convolution with few output positions and many channels computes C^T = im2col^T W^T:
    /// its vectors run along output channels (weights packed in 32-channel strips) and the
    /// result is stored transposed; chunks are of channels, or of positions with `split_n`.
    pub transposed: bool,
    /// A convolution's data input, and its result (and residual), held channel-blocked (NCHW16c:
    /// [N, C/16, H, W, 16]) as `layout::decide` chose: a pointwise convolution then runs
    /// transposed, a depthwise one on whole vectors of channels.
    pub blocked: Blocked,
    /// `--precision bf16`: a convolution or GEMM multiplies bf16 (weights rounded at compile
    /// time, the input as it is copied into the kernel's padded planes, or A's rows as the GEMM
    /// reads them) with `vdpbf16ps`, summing in f32. Convolutions have it in the direct form
    /// (`kiln_uk_conv2d`'s stride-phase planes) only: such a convolution is neither transposed
    /// nor blocked.
    pub bf16: bool,
    /// `bf16` on AMX tiles (`tdpbf16ps`, `Host::amx_bf16`): a direct convolution of at least
    /// 16 channels; its weights packed as tiles (`conv::pack_conv_bf16_amx`).
    pub amx: bool,
    /// A direct convolution in f32 with its vectors along output channels: this many vectors of
    /// 16 channels a register tile (1-4; `conv::channel_vectors`), each input float broadcast,
    /// K in blocks of `kc`; 0 for every other kernel.
    pub channel_vectors: usize,
}

/// How a depthwise convolution's kernel holds its channels (see `Ukernel::depthwise_form`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepthwiseForm {
    /// NCHW in and out: vectors of 16 positions along each row.
    Rows,
    /// Channel-blocked tensors in and out: vectors of 16 channels of one position.
    Blocked,
    /// NCHW in and out, each 16 channels regrouped in the kernel into blocked scratch and back.
    Regrouped,
}

impl DepthwiseForm {
    /// The kernel's `form` argument.
    fn code(self) -> usize {
        match self {
            DepthwiseForm::Rows => 0,
            DepthwiseForm::Blocked => 1,
            DepthwiseForm::Regrouped => 2,
        }
    }
}

impl Shape {
    /// (M, N, K) of the GEMM (per image for a convolution).
    pub fn mnk(&self) -> (usize, usize, usize) {
        match *self {
            Shape::Conv { c, m, group, kh, kw, oh, ow, .. } => {
                (m / group, oh * ow, c / group * kh * kw)
            }
            Shape::Gemm { m, n, k, .. } => (m, n, k),
            Shape::DynQGemm { rows, k, m, .. } => (rows, m, k.div_ceil(4) * 4),
            Shape::NBitsGemm { rows, k, n, .. } => (rows, n, k),
            Shape::QConv { group, kh, kw, oh, ow, .. } if group > 1 => (1, oh * ow, kh * kw),
            Shape::QConv { c, m, kh, kw, oh, ow, .. } => (m, oh * ow, c.div_ceil(4) * 4 * kh * kw),
            Shape::ConvTranspose { cin, h, w, cout, kh, kw, .. } => (cout * kh * kw, h * w, cin),
            Shape::Pool { kh, kw, oh, ow, .. } => (1, oh * ow, kh * kw),
            Shape::Gather { n_idx, row_bytes, .. } => (n_idx, row_bytes, 1),
            Shape::Reduce { outer, reduced, inner, .. } => (outer, inner, reduced),
            Shape::Softmax { rows, cols, .. } => (rows, cols, 1),
            Shape::Transpose { batch, rows, cols } => (batch * rows, cols, 1),
            Shape::Attention { batch, heads, q_seq, kv_seq, head, .. } => {
                (batch * heads * q_seq, kv_seq, head)
            }
            // The input projection's GEMM.
            Shape::Recurrent { cell, seq, batch, input, hidden, .. } => {
                (seq * batch, recurrent::gates(cell) * hidden, input)
            }
        }
    }

    /// One input and one output channel a group.
    pub fn depthwise(&self) -> bool {
        matches!(*self, Shape::Conv { c, m, group, .. } if group == c && group == m)
    }

    /// The images (or matrices) the kernel's work units are per.
    fn images(&self) -> usize {
        match *self {
            // (A matrix product's units split its rows: qconv::plan.)
            Shape::QConv { .. } if qconv::gemm_form(self) => 1,
            Shape::Conv { batch, .. }
            | Shape::QConv { batch, .. }
            | Shape::ConvTranspose { batch, .. }
            | Shape::Pool { batch, .. }
            | Shape::Transpose { batch, .. } => batch,
            Shape::Gemm { .. }
            | Shape::DynQGemm { .. }
            | Shape::NBitsGemm { .. }
            | Shape::Gather { .. }
            | Shape::Recurrent { .. }
            | Shape::Reduce { .. }
            | Shape::Softmax { .. }
            | Shape::Attention { .. } => 1,
        }
    }
}

/// Which of a convolution's tensors are channel-blocked (see `Ukernel::blocked`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Blocked {
    pub input: bool,
    pub output: bool,
}

impl Ukernel {
    /// A kernel with no GEMM inside (rows, a gather, a transpose): one data input, nothing
    /// packed, no epilogue, no cache blocks.
    fn unblocked(shape: Shape, input: ValueId, chunks: usize) -> Ukernel {
        Ukernel {
            shape,
            input,
            weight: input,
            epilogue: Epilogue {
                bias: None,
                residual: None,
                residual_last: false,
                activation: Activation::None,
            },
            mr: 0,
            kc: 0,
            mc: 0,
            nc: 0,
            chunks,
            split_n: false,
            row_bands: 1,
            transposed: false,
            blocked: Blocked::default(),
            bf16: false,
            amx: false,
            channel_vectors: 0,
        }
    }

    /// (M, N, K) of the GEMM (per image for a convolution).
    pub fn mnk(&self) -> (usize, usize, usize) {
        self.shape.mnk()
    }

    pub fn depthwise(&self) -> bool {
        self.shape.depthwise()
    }

    /// Which of this convolution's tensors could be channel-blocked: a pointwise one (1x1, stride
    /// 1, no padding, one group) reads its input so when its input channels are whole blocks of
    /// 16, and writes its result so when its output channels are; a depthwise one whose taps fit
    /// the kernel's registers does both or neither, in whole blocks.
    pub fn blockable(&self) -> Blocked {
        if self.bf16 {
            return Blocked::default();
        }
        match self.shape {
            Shape::Conv { c, m, group, h, w, kh, kw, stride, pad, oh, ow, .. } => {
                if group == 1
                    && kh == 1
                    && kw == 1
                    && stride == [1, 1]
                    && pad == [0, 0]
                    && (oh, ow) == (h, w)
                {
                    Blocked { input: c % 16 == 0, output: m % 16 == 0 }
                } else {
                    let depthwise = self.depthwise() && kh * kw <= 64 && c % 16 == 0;
                    Blocked { input: depthwise, output: depthwise }
                }
            }
            _ => Blocked::default(),
        }
    }

    /// A depthwise convolution's form: blocked where `layout::decide` blocked its tensors, else
    /// regrouped where its taps fit the registers, else rows. Regrouping costs two transposes a
    /// position and pays them back on every shape measured (7x7 to 112x112, 3x3 and 5x5, strides
    /// 1 and 2, 1 thread): rows of vectors leave lanes idle where rows are short, clip taps at
    /// their edges and discard half of each load at stride 2 (3x3/2 on 960 channels of 7x7:
    /// 0.065 -> 0.014 ms; 3x3 on 32 channels of 112x112, rows' best case: a tie).
    pub fn depthwise_form(&self) -> Option<DepthwiseForm> {
        let Shape::Conv { kh, kw, .. } = self.shape else { return None };
        if !self.depthwise() {
            None
        } else if self.blocked.output {
            Some(DepthwiseForm::Blocked)
        } else if kh * kw <= 64 {
            Some(DepthwiseForm::Regrouped)
        } else {
            Some(DepthwiseForm::Rows)
        }
    }

    pub fn workgroups(&self) -> u64 {
        (self.shape.images() * self.chunks) as u64
    }
}

/// What each kernel shape's module does for the plans of its shape (`family` gives a plan's):
/// describe it, pack the constant its kernel reads, and make the call of its C entry point. (Its
/// planning is a function of the module, `plan` choosing it by the kernel's root op.)
trait KernelShape {
    /// The plan as `--stage schedule` prints it (`Ukernel`'s `Display`).
    fn describe(&self, u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result;

    /// The constant the kernel reads in its weight's slot: nothing by default.
    fn pack(&self, _graph: &Graph, _kernel: &Kernel, _u: &Ukernel) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    /// The packed weights' length in floats: where the bias (or a recurrent layer's constant
    /// initial state) starts in the packed constant.
    fn packed_floats(&self, _u: &Ukernel) -> usize {
        0
    }

    /// The C entry point the kernel calls and its arguments up to the workgroup range (which
    /// `build` appends), made in `call`'s block from the pointers every call has.
    fn build<'c, 'a>(
        &self,
        u: &Ukernel,
        call: &Call<'c, 'a>,
        p: Pointers<'c, 'a>,
    ) -> Result<(&'static str, Vec<Value<'c, 'a>>)>;
}

impl Shape {
    /// The shape's name: how the kernel suite (tests/tests/kernels.rs) files its cases.
    pub fn name(&self) -> &'static str {
        match self {
            Shape::Conv { .. } => "conv",
            Shape::ConvTranspose { .. } => "conv-transpose",
            Shape::QConv { .. } => "qconv",
            Shape::DynQGemm { .. } => "dqgemm",
            Shape::NBitsGemm { .. } => "nbgemm",
            Shape::Gemm { .. } => "gemm",
            Shape::Pool { .. } => "pool",
            Shape::Gather { .. } => "gather",
            Shape::Recurrent { .. } => "recurrent",
            Shape::Reduce { .. } => "reduce",
            Shape::Softmax { .. } => "softmax",
            Shape::Transpose { .. } => "transpose",
            Shape::Attention { .. } => "attention",
        }
    }
}

/// Every shape's [`Shape::name`] (a new shape joins this list with its arm above): the kernel
/// suite runs each at its edge sizes and fails for a shape it has no cases for.
pub const SHAPE_NAMES: [&str; 12] = [
    "conv",
    "conv-transpose",
    "qconv",
    "dqgemm",
    "gemm",
    "pool",
    "gather",
    "recurrent",
    "reduce",
    "softmax",
    "transpose",
    "attention",
];

/// The module that describes, packs and builds plans of this shape.
fn family(shape: &Shape) -> &'static dyn KernelShape {
    match shape {
        Shape::Conv { .. } => &conv::Conv,
        Shape::ConvTranspose { .. } => &conv::ConvTranspose,
        Shape::QConv { .. } => &qconv::QConv,
        Shape::DynQGemm { .. } => &dqgemm::DynQGemm,
        Shape::NBitsGemm { .. } => &nbits::NBitsGemm,
        Shape::Gemm { .. } => &gemm::Gemm,
        Shape::Pool { .. } => &pool::Pool,
        Shape::Gather { .. } => &gather::Gather,
        Shape::Recurrent { .. } => &recurrent::Recurrent,
        Shape::Reduce { .. } => &rows::Reduce,
        Shape::Softmax { .. } => &rows::Softmax,
        Shape::Transpose { .. } => &transpose::Transpose,
        Shape::Attention { .. } => &attention::Attention,
    }
}

/// A plan handed to another shape's module (a bug: `family` gives each plan its own).
fn other_shape(u: &Ukernel) -> CompileError {
    CompileError::Internal(format!("a microkernel module was given another shape's plan: {u:?}"))
}

impl fmt::Display for Ukernel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        family(&self.shape).describe(self, f)
    }
}

/// The line of work units of a kernel split by channels in each image (pooling, depthwise
/// convolutions).
fn describe_channel_chunks(u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
    if u.row_bands > 1 {
        let chunks = u.chunks / u.row_bands;
        writeln!(
            f,
            "workgroups: {} ({chunks} channel chunk(s) x {} bands of rows per image)",
            u.workgroups(),
            u.row_bands
        )
    } else {
        writeln!(f, "workgroups: {} ({} channel chunk(s) per image)", u.workgroups(), u.chunks)
    }
}

/// A 2-D window as the descriptions of convolutions and pooling give it.
fn window_text(
    [kh, kw]: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pad: [usize; 2],
) -> String {
    format!(
        "window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{}",
        stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1]
    )
}

/// The lines of a kernel on the packed GEMM: its register tile, cache blocks and how B is had
/// (`b`), then its work units, chunks of `what` (`per_image` where they are per image).
fn describe_tiles(
    u: &Ukernel,
    f: &mut fmt::Formatter,
    cols: usize,
    b: &str,
    what: &str,
    per_image: &str,
) -> fmt::Result {
    writeln!(
        f,
        "register tile: {}x{cols}; blocks KC={} MC={} NC={}; weights packed at compile time, {b}",
        u.mr, u.kc, u.mc, u.nc
    )?;
    writeln!(f, "workgroups: {} ({} {what} chunk(s){per_image})", u.workgroups(), u.chunks)
}

/// The epilogue's line: the adds, then the activation.
fn describe_epilogue(u: &Ukernel, f: &mut fmt::Formatter) -> fmt::Result {
    let mut epi = Vec::new();
    if u.epilogue.bias.is_some() {
        epi.push("bias".to_string());
    }
    if u.epilogue.residual.is_some() && !u.epilogue.residual_last {
        epi.push("residual add".to_string());
    }
    match u.epilogue.activation {
        Activation::None => {}
        Activation::Relu => epi.push("relu".into()),
        Activation::Clip(lo, hi) => epi.push(format!("clip [{lo}, {hi}]")),
        Activation::Sigmoid => epi.push("sigmoid".into()),
        Activation::HardSwish => epi.push("hardswish".into()),
        Activation::Swish(1.0) => epi.push("silu".into()),
        Activation::Swish(a) => epi.push(format!("swish (alpha {a})")),
    }
    if u.epilogue.residual.is_some() && u.epilogue.residual_last {
        epi.push("residual add".to_string());
    }
    writeln!(f, "epilogue: {}", if epi.is_empty() { "none".to_string() } else { epi.join(", ") })
}

/// Below this many multiply-adds the linalg path's single register tile is as good.
pub(super) const MIN_MACS: usize = 1 << 16;

/// Whether `kernel` runs on the microkernel, and how. With `always`, wherever it applies (else
/// only for the shape classes where it is the faster path).
pub fn plan(
    graph: &Graph,
    kernel: &Kernel,
    host: &Host,
    always: bool,
    precision: Precision,
) -> Option<Ukernel> {
    let (&root, tail) = kernel.nodes.split_first()?;
    match &graph.node(root).op {
        Op::Rnn(r) => return recurrent::plan(graph, kernel, root, r, host),
        Op::QConv(_) => return qconv::plan(graph, kernel, root, host),
        Op::DynQMatMul => return dqgemm::plan(graph, kernel, root, host),
        Op::MatMulNBits { .. } => return nbits::plan(graph, kernel, root, host),
        _ => {}
    }
    if kernel.outputs.len() != 1 || kernel.outputs[0] != ValueId::from(*kernel.nodes.last()?) {
        return None;
    }
    match &graph.node(root).op {
        Op::Gather { axis } => gather::plan(graph, kernel, root, *axis, tail, always, host),
        Op::Transpose { perm } => transpose::plan(graph, kernel, root, perm, tail, host),
        Op::Attention(_) => attention::plan(graph, kernel, root, host),
        Op::Reduce(_) | Op::GlobalPool(_) | Op::Softmax { .. } | Op::LogSoftmax { .. } => {
            rows::plan(graph, kernel, root, tail, always, host)
        }
        _ => tiled::plan(graph, kernel, root, tail, host, always, precision),
    }
}

/// The GEMM's cache blocks (KC, MC, NC) for a K, from the host's caches.
fn blocks(k: usize, host: &Host) -> (usize, usize, usize) {
    let mr = host.mr;
    // KC: a B micro-panel (KC x NR) in half of L1; a K that is not much more is one block.
    let mut kc = (host.l1_bytes / 2 / (NR * 4)).clamp(64, 512) / 16 * 16;
    if k <= kc + kc / 4 {
        kc = k;
    }
    // MC: an A block (MC x KC) in half of L2; NC: a B panel (KC x NC) in a quarter of it.
    let mc = (host.l2_bytes / 2 / (kc.max(1) * 4)).clamp(mr, 4096) / mr * mr;
    let nc = (host.l2_bytes / 4 / (kc.max(1) * 4)).clamp(NR, 4096) / NR * NR;
    (kc, mc, nc)
}

/// Whether the CPU's integer convolution runs this QConv node (the `integer` pass makes no other).
pub fn runs_qconv(graph: &Graph, id: NodeId) -> bool {
    qconv::runs(graph, id)
}

/// Whether the CPU's dynamically quantized matrix product runs this DynQMatMul node (the
/// `dynamic` pass makes no other).
pub fn runs_dynamic_product(graph: &Graph, id: NodeId) -> bool {
    dqgemm::runs(graph, id)
}

/// Whether the CPU's 4-bit weight-only matrix product runs this MatMulNBits node.
pub fn runs_nbits_product(graph: &Graph, id: NodeId) -> bool {
    nbits::runs(graph, id)
}

/// What the CPU keeps whole for a kernel of its own (see `runs_recurrent`, `runs_attention`,
/// `runs_nbits_product`).
pub fn runs_whole(graph: &Graph, id: NodeId) -> bool {
    runs_recurrent(graph, id) || runs_attention(graph, id) || runs_nbits_product(graph, id)
}

/// A constant as f32s.
fn constant_f32s(graph: &Graph, v: ValueId) -> Option<Vec<f32>> {
    Some(graph.constant_value(v)?.to_f64s().into_iter().map(|x| x as f32).collect())
}

/// The op's own bias operand, if any: a constant of one value per output channel (`Some(None)`
/// without one; `None` when it is not such a constant).
fn operand_bias(graph: &Graph, b: Option<ValueId>, channels: usize) -> Option<Option<Vec<f32>>> {
    match b {
        None => Some(None),
        Some(b) => constant_f32s(graph, b).filter(|v| v.len() == channels).map(Some),
    }
}

/// A constant that broadcasts over a conv result as one value per output channel (`[M,1,1]`,
/// `[1,M,1,1]`, a scalar...), as M floats.
fn channel_bias(graph: &Graph, v: ValueId, m: usize, out_rank: usize) -> Option<Vec<f32>> {
    let t = graph.constant_value(v)?;
    let d = t.dims().to_vec();
    if d.len() > out_rank {
        return None;
    }
    let mut full = vec![1usize; out_rank - d.len()];
    full.extend(&d);
    // Every dimension but the channel's (1) must be 1.
    if full.iter().enumerate().any(|(i, &x)| i != 1 && x != 1) || !(full[1] == 1 || full[1] == m) {
        return None;
    }
    let vals = constant_f32s(graph, v)?;
    Some(if full[1] == 1 { vec![*vals.first()?; m] } else { vals })
}

/// A constant that broadcasts over a GEMM result as one value per column (`[N]`, `[1,N]`, a
/// scalar), as N floats.
fn column_bias(graph: &Graph, v: ValueId, n: usize) -> Option<Vec<f32>> {
    let t = graph.constant_value(v)?;
    let d = t.dims();
    let lead_ones = d.iter().rev().skip(1).all(|&x| x == 1);
    let last = d.last().copied().unwrap_or(1);
    if !lead_ones || !(last == 1 || last == n) {
        return None;
    }
    let vals = constant_f32s(graph, v)?;
    Some(if last == 1 { vec![*vals.first()?; n] } else { vals })
}

/// The constant the kernel reads instead of its weight: the weight packed for the microkernel,
/// then the bias (M or N floats), little-endian f32.
pub fn pack(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<u8>> {
    family(&u.shape).pack(graph, kernel, u)
}

/// The kernel's weight as f32s, to be packed.
fn weight_f32s(graph: &Graph, u: &Ukernel) -> Result<Vec<f32>> {
    // A plan is made only for a constant weight.
    constant_f32s(graph, u.weight)
        .ok_or_else(|| CompileError::Internal("the microkernel's weight is not a constant".into()))
}

/// Packed f32 weights and then the bias, as the constant's bytes.
fn f32_bytes(mut out: Vec<f32>, u: &Ukernel) -> Vec<u8> {
    if let Some(b) = &u.epilogue.bias {
        out.extend(b);
    }
    out.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Packed bf16 weights (words of two) and then the f32 bias, as the constant's bytes.
fn bf16_bytes(mut out: Vec<u32>, u: &Ukernel) -> Vec<u8> {
    out.extend(u.epilogue.bias.iter().flatten().map(|b| b.to_bits()));
    out.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `x` as bf16 (to nearest, ties to even), its 16 bits in the low half of a word.
fn bf16_bits(x: f32) -> u32 {
    u32::from(half::bf16::from_f32(x).to_bits())
}

/// Where a kernel shape's `build` makes its call: the kernel body's block, whose arguments are
/// the kernel's buffers (inputs, then outputs) and the workgroup range.
struct Call<'c, 'a> {
    ctx: &'c Context,
    loc: Location<'c>,
    block: &'a Block<'c>,
    graph: &'a Graph,
    kernel: &'a Kernel,
}

/// The pointers every call starts from (each an i64, 0 where there is none).
#[derive(Clone, Copy)]
struct Pointers<'c, 'a> {
    /// The data input.
    x: Value<'c, 'a>,
    /// The packed constant, in the weight's slot.
    wp: Value<'c, 'a>,
    /// The bias, in the packed constant after the weights.
    bias: Value<'c, 'a>,
    /// The residual.
    res: Value<'c, 'a>,
    /// The result (the kernel's first output).
    y: Value<'c, 'a>,
}

impl<'c, 'a> Call<'c, 'a> {
    /// An i64 constant.
    fn int(&self, v: i64) -> Value<'c, 'a> {
        let i64t: Type = IntegerType::new(self.ctx, 64).into();
        push(self.block, arith::constant(self.ctx, IntegerAttribute::new(i64t, v).into(), self.loc))
    }

    /// i64 constants.
    fn ints(&self, v: &[usize]) -> Vec<Value<'c, 'a>> {
        v.iter().map(|&x| self.int(x as i64)).collect()
    }

    /// An f32 constant.
    fn float(&self, v: f32) -> Value<'c, 'a> {
        let f32t = Type::float32(self.ctx);
        let attr = FloatAttribute::new(self.ctx, f32t, v as f64);
        push(self.block, arith::constant(self.ctx, attr.into(), self.loc))
    }

    /// The aligned pointer of the block's argument `i` (a buffer), as an i64.
    fn pointer(&self, i: usize) -> Result<Value<'c, 'a>> {
        let index = Type::index(self.ctx);
        let i64t: Type = IntegerType::new(self.ctx, 64).into();
        // The block was made with an argument per buffer and workgroup bound.
        let arg: Value =
            self.block.argument(i).map_err(|e| CompileError::Internal(e.to_string()))?.into();
        let p = push(
            self.block,
            op(
                self.ctx,
                self.loc,
                "memref.extract_aligned_pointer_as_index",
                &[arg],
                &[index],
                &[],
            )?,
        );
        Ok(push(self.block, arith::index_cast(p, i64t, self.loc)))
    }

    /// The pointer of a kernel input.
    fn input(&self, v: ValueId) -> Result<Value<'c, 'a>> {
        // The plan's values are the kernel's own: one that is not is a bug of the plan.
        let slot = self.kernel.inputs.iter().position(|&x| x == v).ok_or_else(|| {
            CompileError::Internal(format!(
                "%{} is not an input of {}",
                self.graph.value_name(v),
                self.kernel.name
            ))
        })?;
        self.pointer(slot)
    }

    /// The pointer of the kernel's output `slot`.
    fn output(&self, slot: usize) -> Result<Value<'c, 'a>> {
        self.pointer(self.kernel.inputs.len() + slot)
    }

    /// `base` plus `floats` floats.
    fn offset(&self, base: Value<'c, 'a>, floats: usize) -> Value<'c, 'a> {
        let off = self.int(4 * floats as i64);
        push(self.block, arith::addi(base, off, self.loc))
    }

    /// The epilogue's activation as the C code takes it: its code (0 none, 1 ReLU, 2 clip, 3
    /// sigmoid, 4 hardswish, 5 swish: tile.h's ACT_*) and the clip's bounds (swish's alpha in
    /// the first).
    fn activation(&self, e: &Epilogue) -> [Value<'c, 'a>; 3] {
        let (act, lo, hi) = match e.activation {
            Activation::None => (0, 0.0, 0.0),
            Activation::Relu => (1, 0.0, 0.0),
            Activation::Clip(lo, hi) => (2, lo, hi),
            Activation::Sigmoid => (3, 0.0, 0.0),
            Activation::HardSwish => (4, 0.0, 0.0),
            Activation::Swish(alpha) => (5, alpha, 0.0),
        };
        // tile.h's ACT_RESIDUAL_LAST: the residual added after the activation.
        let act = if e.residual_last && e.residual.is_some() { act | 8 } else { act };
        [self.int(act), self.float(lo), self.float(hi)]
    }

    /// The workgroup range's bound at argument `i`, as an i64.
    fn workgroup(&self, i: usize) -> Result<Value<'c, 'a>> {
        let i64t: Type = IntegerType::new(self.ctx, 64).into();
        // The block was made with an argument per buffer and workgroup bound.
        let arg: Value =
            self.block.argument(i).map_err(|e| CompileError::Internal(e.to_string()))?.into();
        Ok(push(self.block, arith::index_cast(arg, i64t, self.loc)))
    }
}

/// The kernel's module: `<name>_body` takes the kernel's buffers (the weight's slot holds the
/// packed constant) and the workgroup range, and calls the microkernel on their pointers.
pub fn build<'c>(
    ctx: &'c Context,
    graph: &Graph,
    kernel: &Kernel,
    u: &Ukernel,
) -> Result<Module<'c>> {
    let loc = Location::unknown(ctx);
    let module = Module::new(loc);
    let index = Type::index(ctx);
    let mut arg_types = Vec::new();
    for &v in kernel.inputs.iter().chain(&kernel.outputs) {
        arg_types.push(crate::codegen::memref_type(ctx, graph, v)?);
    }
    arg_types.extend([index, index]);
    let block = Block::new(&arg_types.iter().map(|t| (*t, loc)).collect::<Vec<_>>());
    let shape = family(&u.shape);
    // The call's arguments, each i64 (pointers, sizes) or f32 (the clip bounds); the callee's
    // signature is theirs.
    let (symbol, callee_types) = {
        let call = Call { ctx, loc, block: &block, graph, kernel };
        let x = call.input(u.input)?;
        let wp = call.input(u.weight)?;
        let bias = match &u.epilogue.bias {
            Some(_) => call.offset(wp, shape.packed_floats(u)),
            None => call.int(0),
        };
        let res = match u.epilogue.residual {
            Some(r) => call.input(r)?,
            None => call.int(0),
        };
        let y = call.output(0)?;
        let (wg_begin, wg_end) =
            (call.workgroup(arg_types.len() - 2)?, call.workgroup(arg_types.len() - 1)?);
        let (symbol, mut args) = shape.build(u, &call, Pointers { x, wp, bias, res, y })?;
        args.push(wg_begin);
        args.push(wg_end);
        let callee_types: Vec<Type> = args.iter().map(|a| a.r#type()).collect();
        block.append_operation(func::call(
            ctx,
            FlatSymbolRefAttribute::new(ctx, symbol),
            &args,
            &[],
            loc,
        ));
        block.append_operation(func::r#return(&[], loc));
        (symbol, callee_types)
    };
    let decl = func::func(
        ctx,
        StringAttribute::new(ctx, symbol),
        TypeAttribute::new(FunctionType::new(ctx, &callee_types, &[]).into()),
        Region::new(),
        &[(
            melior::ir::Identifier::new(ctx, "sym_visibility"),
            StringAttribute::new(ctx, "private").into(),
        )],
        loc,
    );
    module.body().append_operation(decl);
    let region = Region::new();
    region.append_block(block);
    let f = func::func(
        ctx,
        StringAttribute::new(ctx, &format!("{}_body", kernel.name)),
        TypeAttribute::new(FunctionType::new(ctx, &arg_types, &[]).into()),
        region,
        &[],
        loc,
    );
    module.body().append_operation(f);
    Ok(module)
}

/// The kernel's inputs whose data the packed constant replaces (the weight, and a bias that went
/// into it): their slots receive the constant, and they need no buffer of their own.
pub fn replaced_inputs(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Vec<usize> {
    let used: Vec<ValueId> = [Some(u.input), u.epilogue.residual].into_iter().flatten().collect();
    kernel
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, v)| !used.contains(v) && graph.constant_value(**v).is_some())
        .map(|(i, _)| i)
        .collect()
}
