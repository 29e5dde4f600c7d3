//! Contractions and convolutions on the packed microkernel (`ukernel.c`): the decision of which
//! kernels take it and how (`plan`, a pure function of the graph, the kernel and the host, whose
//! result prints in `--stage schedule`), the weights packed at compile time into the layout the
//! microkernel reads, and the kernel's MLIR: a call of the microkernel on the buffers' pointers.
//!
//! A kernel qualifies when its root is an f32 Conv (one group, 1-D or 2-D) or a MatMul/Gemm whose
//! B is a constant 2-D matrix, with enough work to fill register tiles, and its elementwise tail
//! is what the microkernel's epilogue does: adds of a bias (per output channel or column) or of
//! a residual of the result's shape, then at most one ReLU or Clip. Anything else keeps the
//! linalg path (its tail fused there).

use std::fmt;

use melior::dialect::{arith, func};
use melior::ir::attribute::{
    FlatSymbolRefAttribute, FloatAttribute, IntegerAttribute, StringAttribute, TypeAttribute,
};
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Block, BlockLike, Location, Module, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;

use kiln_ir::op::{BinaryOp, PoolKind, Rnn, RnnCell, RnnDirection, UnaryOp};
use kiln_ir::{DType, Graph, NodeId, Op, ValueId};

use crate::codegen::mlir::{op, push};
use crate::fuse::Kernel;
use crate::{CompileError, Precision, Result};

/// Columns of the register tile (two 16-float vectors), as `ukernel.c` has it.
pub const NR: usize = 32;

/// The x86-64 instruction-set level the microkernel object is built for (build.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// AVX-512 F, BW, DQ and VL.
    V4,
    /// AVX2 and FMA.
    V3,
    /// Baseline x86-64.
    V1,
}

/// What the compiler knows of the host for the microkernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    pub level: Level,
    /// Rows of the register tile: 8 with 32 vector registers (AVX-512), else 4.
    pub mr: usize,
    /// AVX-512 VNNI (`vpdpbusd`): the integer convolution's u8 x s8 products on it.
    pub vnni: bool,
    /// AVX512-BF16 (`vdpbf16ps`): `--precision bf16`'s products on it.
    pub bf16: bool,
    pub l1_bytes: usize,
    pub l2_bytes: usize,
}

impl Host {
    /// This machine: its instruction-set level from LLVM's host features (`+avx512f,...`), its
    /// caches from sysfs (32 KiB and 1 MiB where sysfs says nothing).
    pub fn detect(cpu_features: &str) -> Host {
        let has = |f: &str| cpu_features.split(',').any(|x| x == format!("+{f}"));
        let level = if ["avx512f", "avx512bw", "avx512dq", "avx512vl"].iter().all(|f| has(f)) {
            Level::V4
        } else if has("avx2") && has("fma") {
            Level::V3
        } else {
            Level::V1
        };
        let mr = if level == Level::V4 { 8 } else { 4 };
        Host {
            level,
            mr,
            vnni: level == Level::V4 && has("avx512vnni"),
            bf16: level == Level::V4 && has("avx512bf16"),
            l1_bytes: cache_bytes(1, "Data").unwrap_or(32 << 10),
            l2_bytes: cache_bytes(2, "Unified").unwrap_or(1 << 20),
        }
    }
}

/// The size of cpu0's cache of a level and type, from sysfs (`32K`).
fn cache_bytes(level: usize, kind: &str) -> Option<usize> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for i in 0..8 {
        let dir = base.join(format!("index{i}"));
        let read =
            |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        if read("level")?.parse::<usize>().ok()? != level || read("type")? != kind {
            continue;
        }
        let size = read("size")?;
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size.as_str(), 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mul);
    }
    None
}

/// The activation applied last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    None,
    Relu,
    Clip(f32, f32),
}

/// What the microkernel adds to each result as it stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// Per output channel (conv) or column (GEMM), folded from the op's bias and constant adds.
    pub bias: Option<Vec<f32>>,
    /// A value of the result's shape, added (a kernel input).
    pub residual: Option<ValueId>,
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
    /// kiln's integer convolution (`QConv`, `integer.rs`, `quantized.c`): 2-D, one group or
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
    },
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
                (seq * batch, gates(cell) * hidden, input)
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
            // (A matrix product's units split its rows: integer::plan.)
            Shape::QConv { .. } if super::integer::gemm_form(self) => 1,
            Shape::Conv { batch, .. }
            | Shape::QConv { batch, .. }
            | Shape::ConvTranspose { batch, .. }
            | Shape::Pool { batch, .. }
            | Shape::Transpose { batch, .. } => batch,
            Shape::Gemm { .. }
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
            epilogue: Epilogue { bias: None, residual: None, activation: Activation::None },
            mr: 0,
            kc: 0,
            mc: 0,
            nc: 0,
            chunks,
            split_n: false,
            transposed: false,
            blocked: Blocked::default(),
            bf16: false,
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

/// ", clamp to [lo, hi]" where a fused Clip narrows an integer convolution's stored range.
fn qclamp(signed: bool, range: [i32; 2]) -> String {
    let full = if signed { [-128, 127] } else { [0, 255] };
    if range == full {
        String::new()
    } else {
        format!(", clamp to [{}, {}] (a fused Clip)", range[0], range[1])
    }
}

impl fmt::Display for Ukernel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let (m, n, k) = self.mnk();
        match &self.shape {
            Shape::Conv { batch, c, group, kh, kw, stride, dilation, pad, oh, ow, .. } => {
                let window = format!("window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{}", stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1]);
                if self.depthwise() {
                    write!(f, "microkernel: depthwise conv, {batch} image(s) of {c} channels {oh}x{ow} ({window})")?
                } else {
                    let groups = if *group > 1 { format!(" in each of {group} groups") } else { String::new() };
                    write!(f, "microkernel: conv as implicit GEMM, {batch} image(s) of M={m} N={n} K={k}{groups} ({window})")?
                }
            }
            Shape::ConvTranspose { batch, kh, kw, stride, dilation, pad, oh, ow, .. } => write!(
                f,
                "microkernel: ConvTranspose as GEMM M={m} N={n} K={k} and col2im, {batch} image(s) of {oh}x{ow} (window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{})",
                stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1]
            )?,
            Shape::QConv { batch, c, group, kh, kw, stride, dilation, pad, oh, ow, y_zero, y_signed, y_range, .. } if *group > 1 => {
                writeln!(f, "microkernel: integer depthwise conv, {batch} image(s) of {c} channels {oh}x{ow} (window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{})", stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1])?;
                writeln!(f, "each 16 channels' planes less the zero point transposed into a zero-padded channel-blocked plane of floats (exact integers), vectors of 16 channels at each output, one FMA a tap, 4 outputs at a time; sums exact, transposed back")?;
                writeln!(f, "epilogue: requantise to {} (scale, round half to even, zero point {y_zero}, saturate{})", if *y_signed { "s8" } else { "u8" }, qclamp(*y_signed, *y_range))?;
                return writeln!(f, "workgroups: {} ({} channel chunk(s) per image)", self.workgroups(), self.chunks);
            }
            Shape::QConv { batch, c, m, x_zero, x_signed, y_zero, y_signed, y_range, vnni, .. } if super::integer::gemm_form(&self.shape) => {
                writeln!(f, "microkernel: integer matrix product, {batch} row(s) of K={c} by M={m}")?;
                writeln!(f, "u8 x s8 -> s32 {}; each row's 4 consecutive k one word as it lies{}, broadcast into vectors of 16 output channels", if *vnni { "with vpdpbusd" } else { "by widening products (no VNNI)" }, if *x_signed { " (s8 read as u8: x + 128)" } else { "" })?;
                writeln!(f, "register tile: 4 rows x 64 channels; weights packed at compile time in strips of 64 channels, the zero point {x_zero} folded into the int32 bias")?;
                writeln!(f, "epilogue: requantise to {} (scale, round half to even, zero point {y_zero}, saturate{})", if *y_signed { "s8" } else { "u8" }, qclamp(*y_signed, *y_range))?;
                let what = if self.split_n { "row" } else { "64-channel strip" };
                return writeln!(f, "workgroups: {} ({what} chunks)", self.workgroups());
            }
            Shape::QConv { batch, kh, kw, stride, dilation, pad, x_zero, x_signed, y_zero, y_signed, y_range, vnni, .. } => {
                writeln!(f, "microkernel: integer conv, {batch} image(s) of M={m} N={n} K={k} (window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{})", stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1])?;
                writeln!(f, "u8 x s8 -> s32 {}; B read direct from a copy of the input{} padded with its zero point {x_zero}, 4 channels interleaved a position", if *vnni { "with vpdpbusd" } else { "by widening products (no VNNI)" }, if *x_signed { " (s8 read as u8: x + 128)" } else { "" })?;
                writeln!(f, "register tile: {}x{NR}; weights packed at compile time in groups of 4, the zero point folded into the int32 bias", self.mr)?;
                writeln!(f, "epilogue: requantise to {} (scale, round half to even, zero point {y_zero}, saturate{})", if *y_signed { "s8" } else { "u8" }, qclamp(*y_signed, *y_range))?;
                let what = match (self.split_n, super::integer::pointwise(&self.shape)) {
                    (true, true) => "32-position strip",
                    (true, false) => "output row",
                    (false, _) => "output channel",
                };
                return writeln!(f, "workgroups: {} ({} {what} chunk(s) per image)", self.workgroups(), self.chunks);
            }
            Shape::Gather { rows, row_bytes, n_idx, .. } => write!(f, "microkernel: gather of {n_idx} rows of {row_bytes} bytes from a table of {rows} rows (row copies)")?,
            Shape::Reduce { outer, reduced, inner, kind } => {
                let what = ["sum", "mean", "max", "min"][*kind as usize];
                writeln!(f, "microkernel: {what} reduction, [{outer}, {reduced}, {inner}] -> [{outer}, {inner}] (outer, reduced, inner)")?;
                let how = if *inner == 1 { "rows as 4 chains of 16-float vectors, then the lanes" } else { "whole inner rows added into vectors" };
                writeln!(f, "{how}")?;
                return writeln!(f, "workgroups: {} (chunks of the outer dimension)", self.workgroups());
            }
            Shape::Transpose { batch, rows, cols } => {
                writeln!(f, "microkernel: transpose of {batch} matrices [{rows}, {cols}] -> [{cols}, {rows}] (the last axis moves)")?;
                writeln!(f, "16x16 blocks through registers (four rounds of interleaves), edge blocks masked")?;
                return writeln!(f, "workgroups: {} ({} chunk(s) of columns per matrix)", self.workgroups(), self.chunks);
            }
            Shape::Softmax { rows, cols, log } => {
                writeln!(f, "microkernel: {}softmax over {rows} rows of {cols}", if *log { "log-" } else { "" })?;
                writeln!(f, "per row: the max, e^(x - max) and its sum on vectors, then the scale")?;
                return writeln!(f, "workgroups: {} (chunks of rows)", self.workgroups());
            }
            Shape::Attention { batch, heads, kv_heads, q_seq, kv_seq, head, v_head, interleaved, mask, mask_dims, causal, scale, .. } => {
                let kv = if kv_heads != heads { format!(" ({kv_heads} KV heads)") } else { String::new() };
                let layout = if *interleaved { "[batch, seq, heads * size]" } else { "[batch, heads, seq, size]" };
                writeln!(f, "microkernel: attention, {batch} x {heads} heads{kv} of {q_seq} queries over {kv_seq} keys, head size {head} (V {v_head}), scale {scale}")?;
                let mask = match mask {
                    None => "no mask".to_string(),
                    Some((_, bool_mask)) => format!("{} mask broadcast from {mask_dims:?}", if *bool_mask { "bool" } else { "additive" }),
                };
                writeln!(f, "Q, K, V and Y read and written where they lie as {layout}; {mask}{}", if *causal { ", causal" } else { "" })?;
                writeln!(f, "per 4 query rows: scores against K^T packed per head (4x32 register tile), softmax in a scratch row block, then P V (4x32); nothing else written")?;
                return writeln!(f, "workgroups: {} (chunks of batch x heads x 64 query rows)", self.workgroups());
            }
            Shape::Pool { batch, c, kh, kw, stride, dilation, pad, oh, ow, kind, .. } => write!(
                f,
                "microkernel: {} pooling, {batch} image(s) of {c} channels {oh}x{ow} (window {kh}x{kw}, stride {}x{}, dilation {}x{}, pad {}x{})",
                ["max", "average (pads counted)", "average", "u8 max"][*kind as usize],
                stride[0], stride[1], dilation[0], dilation[1], pad[0], pad[1]
            )?,
            Shape::Gemm { trans_a, trans_b, .. } => {
                write!(f, "microkernel: GEMM M={m} N={n} K={k}{}{}", if *trans_a { ", A transposed" } else { "" }, if *trans_b { ", B transposed" } else { "" })?
            }
            Shape::Recurrent { cell, direction, batch_first, seq, batch, input, hidden, .. } => {
                let what = match cell {
                    RnnCell::Simple => "RNN".to_string(),
                    RnnCell::Gru { linear_before_reset } => format!("GRU{}", if *linear_before_reset { " (linear before reset)" } else { "" }),
                    RnnCell::Lstm { input_forget } => format!("LSTM{}", if *input_forget { " (input and forget gates coupled)" } else { "" }),
                };
                writeln!(
                    f,
                    "microkernel: recurrent {what} layer, {}, {seq} steps of batch {batch}{}, input {input}, hidden {hidden}",
                    direction.name(),
                    if *batch_first { " (batch first)" } else { "" }
                )?;
                writeln!(f, "input projections: one GEMM M={m} N={n} K={k} by W^T packed at compile time, blocks KC={} MC={} NC={}", self.kc, self.mc, self.nc)?;
                writeln!(f, "time loop in the kernel: per step the state times R^T (resident, packed), then the gates on vectors")?;
                return writeln!(f, "workgroups: {} (one a direction)", self.workgroups());
            }
        }
        writeln!(f)?;
        if matches!(self.shape, Shape::Gather { .. }) {
            writeln!(f, "workgroups: {} (chunks of the indices)", self.workgroups())?;
            return Ok(());
        }
        if let Shape::Pool { kind: 3, .. } = self.shape {
            writeln!(f, "separable: per output row the window's rows' maxima (on vectors), then each output's taps along the row")?;
            writeln!(
                f,
                "workgroups: {} ({} channel chunk(s) per image)",
                self.workgroups(),
                self.chunks
            )?;
        } else if let Shape::Pool { kh, .. } = self.shape {
            writeln!(f, "separable: each input row reduced along it once (from a padded row buffer), then {kh} row results per output vector; bands of 8 output rows")?;
            writeln!(
                f,
                "workgroups: {} ({} channel chunk(s) per image)",
                self.workgroups(),
                self.chunks
            )?;
        } else if let Some(form) = self.depthwise_form() {
            writeln!(f, "{}", match form {
                DepthwiseForm::Blocked => "channel-blocked (NCHW16c) in and out: vectors of 16 channels of one position, one FMA a tap, 4 positions at a time",
                DepthwiseForm::Rows => "vectors of 16 outputs along each row, one FMA a tap; the plane copied once, zero-padded",
                DepthwiseForm::Regrouped => "each 16 channels regrouped through 16x16 transposes into vectors of 16 channels of one position, one FMA a tap, 4 positions at a time, and back",
            })?;
            writeln!(
                f,
                "workgroups: {} ({} channel chunk(s) per image)",
                self.workgroups(),
                self.chunks
            )?;
        } else {
            let b = match self.shape {
                Shape::Conv { .. } if self.blocked.input || self.blocked.output => match (self.blocked.input, self.blocked.output, self.transposed) {
                    (true, true, _) => "channel-blocked (NCHW16c) in and out: C^T = x^T (read where it lies) x W^T, vectors along output channels, stored where they lie",
                    (true, false, true) => "channel-blocked (NCHW16c) in: C^T = x^T (read where it lies) x W^T, vectors along output channels, stored transposed to NCHW",
                    (true, false, false) => "channel-blocked (NCHW16c) in: B (the input) packed at run time through 16x16 transposes",
                    _ => "channel-blocked (NCHW16c) out: C^T = x^T (packed at run time) x W^T, vectors along output channels, stored where they lie",
                },
                Shape::Conv { .. } if self.bf16 => "bf16 products with vdpbf16ps, f32 sums: weights rounded to bf16 in channel pairs, B read direct from a bf16 copy of the input in stride-phase planes, channel pairs interleaved",
                Shape::Conv { .. } if self.transposed => "transposed: C^T = im2col^T (packed at run time) x W^T, vectors along output channels",
                // (As kiln_uk_conv2d chooses.)
                Shape::Conv { group: 1, kh, kw, stride, .. } if kh * kw > 1 || stride != [1, 1] => {
                    "B read direct from a padded copy of the input in stride-phase planes (no im2col)"
                }
                Shape::Conv { group: 1, .. } => "B is the input as it is",
                Shape::Conv { .. } => "B packed (im2col) at run time",
                Shape::ConvTranspose { .. } => "B (the input) packed at run time",
                Shape::Pool { .. } | Shape::QConv { .. } | Shape::Gather { .. } | Shape::Recurrent { .. } | Shape::Reduce { .. } | Shape::Softmax { .. } | Shape::Transpose { .. } | Shape::Attention { .. } => "",
                Shape::Gemm { .. } if self.bf16 => "bf16 products with vdpbf16ps, f32 sums: B rounded to bf16 in pairs along K, A's rows made bf16 pairs at run time, each B strip against every row tile",
                Shape::Gemm { m, .. } if m < self.mr => "rows times packed B strips, up to 4 rows a pass (matrix-vector)",
                Shape::Gemm { .. } => "A packed at run time",
            };
            writeln!(f, "register tile: {}x{NR}; blocks KC={} MC={} NC={}; weights packed at compile time, {b}", self.mr, self.kc, self.mc, self.nc)?;
            let per_image =
                if matches!(self.shape, Shape::Gemm { .. }) { "" } else { " per image" };
            let what =
                if self.transposed && self.split_n && matches!(self.shape, Shape::Conv { .. }) {
                    "position"
                } else if self.transposed || matches!(self.shape, Shape::ConvTranspose { .. }) {
                    "channel"
                } else if self.split_n {
                    "column"
                } else {
                    "row"
                };
            writeln!(
                f,
                "workgroups: {} ({} {what} chunk(s){per_image})",
                self.workgroups(),
                self.chunks
            )?;
        }
        let mut epi = Vec::new();
        if self.epilogue.bias.is_some() {
            epi.push("bias".to_string());
        }
        if self.epilogue.residual.is_some() {
            epi.push("residual add".to_string());
        }
        match self.epilogue.activation {
            Activation::None => {}
            Activation::Relu => epi.push("relu".into()),
            Activation::Clip(lo, hi) => epi.push(format!("clip [{lo}, {hi}]")),
        }
        writeln!(
            f,
            "epilogue: {}",
            if epi.is_empty() { "none".to_string() } else { epi.join(", ") }
        )
    }
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
    if let Op::Rnn(r) = &graph.node(root).op {
        return recurrent_plan(graph, kernel, root, r, host);
    }
    if let Op::QConv(_) = &graph.node(root).op {
        return super::integer::plan(graph, kernel, root, host);
    }
    if kernel.outputs.len() != 1 || kernel.outputs[0] != ValueId::from(*kernel.nodes.last()?) {
        return None;
    }
    let operands = graph.operands(root);
    if let Op::Gather { axis } = graph.node(root).op {
        return gather_plan(graph, kernel, root, axis, tail, always);
    }
    if let Op::Transpose { perm } = &graph.node(root).op {
        return transpose_plan(graph, kernel, root, perm, tail);
    }
    if let Op::Attention(_) = &graph.node(root).op {
        return attention_plan(graph, kernel, root);
    }
    if matches!(
        graph.node(root).op,
        Op::Reduce(_) | Op::GlobalPool(_) | Op::Softmax { .. } | Op::LogSoftmax { .. }
    ) {
        return rows_plan(graph, kernel, root, tail, always);
    }
    let f32_only = operands
        .iter()
        .flatten()
        .chain(&kernel.outputs)
        .all(|&v| graph.value_type(v).dtype == DType::F32);
    // Max pooling of bytes (a quantized model's, `passes/integer.rs`) has a kernel of its own.
    let u8_max_pool = matches!(&graph.node(root).op, Op::Pool(p) if p.kind == PoolKind::Max)
        && tail.is_empty()
        && operands
            .iter()
            .flatten()
            .chain(&kernel.outputs)
            .all(|&v| graph.value_type(v).dtype == DType::U8);
    if !f32_only && !u8_max_pool {
        return None;
    }
    let dims = |v: ValueId| graph.value_type(v).shape.as_fixed();
    let (shape, input, weight, mut bias) = match &graph.node(root).op {
        Op::Conv(c) => {
            let (x, w) =
                (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
            let (xd, wd) = (dims(x)?, dims(w)?);
            let g = c.group;
            if g == 0 || xd.len() < 3 || xd[1] % g != 0 || wd[0] % g != 0 || wd[1] * g != xd[1] {
                return None;
            }
            if !(3..=4).contains(&xd.len())
                || wd.len() != xd.len()
                || graph.constant_value(w).is_none()
            {
                return None;
            }
            let spatial = xd.len() - 2;
            let mut axes = Vec::new();
            for i in 0..spatial {
                axes.push(c.window.resolve(i, xd[2 + i], wd[2 + i], false).ok()?);
            }
            let (h, kh, kw, stride, dilation, pad, oh, ow) = plane(
                &xd,
                &wd,
                axes.iter().map(|a| (a.stride, a.dilation, a.pad_begin as i64, a.output)),
            )?;
            let pad = [pad[0] as usize, pad[1] as usize];
            let shape = Shape::Conv {
                batch: xd[0],
                c: xd[1],
                h,
                w: xd[xd.len() - 1],
                m: wd[0],
                group: g,
                kh,
                kw,
                stride,
                dilation,
                pad,
                oh,
                ow,
            };
            (shape, x, w, operand_bias(graph, operands.get(2).copied().flatten(), wd[0])?)
        }
        Op::Pool(p) => {
            let x = operands.first().copied().flatten()?;
            let xd = dims(x)?;
            let kind = match p.kind {
                PoolKind::Max if u8_max_pool => 3,
                PoolKind::Max => 0,
                PoolKind::Average { count_include_pad } if !p.ceil_mode => {
                    1 + u8::from(!count_include_pad)
                }
                _ => return None,
            };
            if !(3..=4).contains(&xd.len()) || p.kernel.len() != xd.len() - 2 {
                return None;
            }
            let spatial = xd.len() - 2;
            let mut axes = Vec::new();
            for i in 0..spatial {
                axes.push(p.window.resolve(i, xd[2 + i], p.kernel[i], p.ceil_mode).ok()?);
            }
            let a = axes.last()?;
            let (hx, kh, sh, dh, ph, phe, oh) = if spatial == 2 {
                let b = &axes[0];
                (xd[2], p.kernel[0], b.stride, b.dilation, b.pad_begin, b.pad_end, b.output)
            } else {
                (1, 1, 1, 1, 0, 0, 1)
            };
            let shape = Shape::Pool {
                batch: xd[0],
                c: xd[1],
                h: hx,
                w: xd[xd.len() - 1],
                kh,
                kw: p.kernel[spatial - 1],
                stride: [sh, a.stride],
                dilation: [dh, a.dilation],
                pad: [ph, a.pad_begin],
                pad_end: [phe, a.pad_end],
                oh,
                ow: a.output,
                kind,
            };
            (shape, x, x, None)
        }
        Op::ConvTranspose(c) => {
            let (x, w) =
                (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
            let (xd, wd) = (dims(x)?, dims(w)?);
            if c.group != 1
                || !(3..=4).contains(&xd.len())
                || wd.len() != xd.len()
                || wd[0] != xd[1]
                || graph.constant_value(w).is_none()
            {
                return None;
            }
            let spatial = xd.len() - 2;
            let mut axes = Vec::new();
            for i in 0..spatial {
                axes.push(
                    kiln_ir::infer::transpose_axis(c, i, spatial, xd[2 + i], wd[2 + i]).ok()?,
                );
            }
            let (h, kh, kw, stride, dilation, pad, oh, ow) = plane(
                &xd,
                &wd,
                axes.iter().map(|a| (a.stride, a.dilation, a.pad_begin, a.output)),
            )?;
            let shape = Shape::ConvTranspose {
                batch: xd[0],
                cin: xd[1],
                h,
                w: xd[xd.len() - 1],
                cout: wd[1],
                kh,
                kw,
                stride,
                dilation,
                pad,
                oh,
                ow,
            };
            (shape, x, w, operand_bias(graph, operands.get(2).copied().flatten(), wd[1])?)
        }
        Op::MatMul | Op::Gemm(_) => {
            let (a, b) =
                (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
            let (ad, bd) = (dims(a)?, dims(b)?);
            if bd.len() != 2 || graph.constant_value(b).is_none() || ad.len() < 2 {
                return None;
            }
            let (trans_a, trans_b, c) = match &graph.node(root).op {
                Op::Gemm(g) => {
                    if g.alpha != 1.0 || ad.len() != 2 {
                        return None;
                    }
                    let c = operands.get(2).copied().flatten();
                    if c.is_some() && g.beta != 1.0 {
                        return None;
                    }
                    (g.trans_a, g.trans_b, c)
                }
                _ => (false, false, None),
            };
            let k = if trans_a { ad[0] } else { ad[ad.len() - 1] };
            let m: usize = if trans_a { ad[1] } else { ad[..ad.len() - 1].iter().product() };
            let n = if trans_b { bd[0] } else { bd[1] };
            let shape = Shape::Gemm { m, n, k, trans_a, trans_b };
            // Gemm's C: a constant row broadcast over the result is a bias.
            let bias = match c {
                None => None,
                Some(c) => Some(column_bias(graph, c, n)?),
            };
            (shape, a, b, bias)
        }
        _ => return None,
    };
    // The data input and the weight must be buffers (not constants inlined into the kernel).
    if !kernel.inputs.contains(&input) || !kernel.inputs.contains(&weight) {
        return None;
    }
    let out = kernel.outputs[0];
    let out_dims = dims(out)?;
    let (m, n, k) = match shape {
        Shape::Conv { .. }
        | Shape::Gemm { .. }
        | Shape::ConvTranspose { .. }
        | Shape::Pool { .. } => shape.mnk(),
        // (Planned by gather_plan, recurrent_plan and integer::plan.)
        Shape::QConv { .. }
        | Shape::Gather { .. }
        | Shape::Recurrent { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => return None,
    };
    let depthwise = shape.depthwise();
    let channels = match shape {
        Shape::Conv { m, .. } => m,
        Shape::ConvTranspose { cout, .. } => cout,
        Shape::Pool { c, .. } => c,
        Shape::Gemm { .. }
        | Shape::QConv { .. }
        | Shape::Gather { .. }
        | Shape::Recurrent { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => 0,
    };
    let images = shape.images();
    // Enough rows and columns to fill the register tiles, and enough work to pay for packing.
    // A GEMM of few rows streams its packed weights (matrix-vector); a depthwise convolution has
    // a kernel of its own; others need whole register tiles.
    let fills = match shape {
        Shape::Gemm { .. } => n >= NR / 2 || scalar_on_linalg(&shape),
        Shape::Conv { .. } if depthwise => true,
        Shape::Conv { .. } if few_positions(&shape) => true,
        Shape::Conv { .. } => m >= host.mr && n >= NR / 2,
        Shape::ConvTranspose { .. } | Shape::Pool { .. } => true,
        Shape::QConv { .. }
        | Shape::Gather { .. }
        | Shape::Recurrent { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => false,
    };
    // Depthwise and pooling windows run per channel, at a fraction of a GEMM's speed.
    let per_channel = depthwise || matches!(shape, Shape::Pool { .. });
    let work = images * m.max(1) * n * k * if per_channel { channels } else { 1 };
    // A GEMM the linalg path cannot vectorise at all, and pooling (whose linalg windows are
    // scalar loop nests: a 2x2/2 max pool of 4x6x28x28 takes 24 us there, 2.7 here), are worth
    // the call at any size.
    let enough =
        work >= MIN_MACS || scalar_on_linalg(&shape) || matches!(shape, Shape::Pool { .. });
    // bf16 products run on this kernel only: in its direct convolution (a padded copy of the
    // input, made bf16 as it is copied), every one-group convolution with a window or a stride
    // takes it. A pointwise one keeps f32, its input read where it lies (often channel-blocked
    // between depthwise ones): copying it costs more than bf16 products save (mobilenet_v2,
    // 2 threads: 0.77x f32's speed when they took it; resnet18, which has none: 1.7x).
    // A GEMM by constant weights takes it too (B rounded and packed at compile time).
    let bf16 = precision == Precision::Bf16
        && host.bf16
        && match shape {
            Shape::Conv { group, kh, kw, stride, .. } => {
                group == 1 && (kh * kw > 1 || stride != [1, 1])
            }
            Shape::Gemm { .. } => true,
            _ => false,
        };
    let wanted = always || bf16 || (fills && enough && beats_linalg(&shape, k, n, host));
    if m * n * k == 0 || !wanted {
        return None;
    }
    // The tail: constant or residual adds, then one activation.
    let mut residual = None;
    let mut activation = Activation::None;
    let mut cur = ValueId::from(root);
    for &t in tail {
        if activation != Activation::None {
            return None;
        }
        let node = graph.node(t);
        let ops: Vec<ValueId> = graph.operands(t).into_iter().flatten().collect();
        match &node.op {
            Op::Binary(BinaryOp::Add) if ops.len() == 2 => {
                let other = if ops[0] == cur {
                    ops[1]
                } else if ops[1] == cur {
                    ops[0]
                } else {
                    return None;
                };
                let od = dims(other)?;
                if graph.value_type(other).dtype != DType::F32 {
                    return None;
                }
                if od == out_dims
                    && residual.is_none()
                    && graph.constant_value(other).is_none()
                    && kernel.inputs.contains(&other)
                {
                    residual = Some(other);
                } else {
                    let add = match shape {
                        // The pooling kernel adds nothing.
                        Shape::Pool { .. }
                        | Shape::QConv { .. }
                        | Shape::Gather { .. }
                        | Shape::Recurrent { .. }
                        | Shape::Reduce { .. }
                        | Shape::Softmax { .. }
                        | Shape::Transpose { .. }
                        | Shape::Attention { .. } => return None,
                        Shape::Conv { .. } | Shape::ConvTranspose { .. } => {
                            channel_bias(graph, other, channels, out_dims.len())?
                        }
                        Shape::Gemm { .. } => column_bias(graph, other, n)?,
                    };
                    let width = add.len();
                    let b = bias.get_or_insert_with(|| vec![0.0; width]);
                    for (x, y) in b.iter_mut().zip(add) {
                        *x += y;
                    }
                }
            }
            Op::Unary(UnaryOp::Relu) => activation = Activation::Relu,
            Op::Clip => {
                let bound = |i: usize, default: f32| -> Option<f32> {
                    match graph.operands(t).get(i).copied().flatten() {
                        None => Some(default),
                        Some(v) => graph
                            .constant_value(v)
                            .and_then(|c| c.to_f64s().first().map(|&x| x as f32)),
                    }
                };
                activation =
                    Activation::Clip(bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?);
            }
            _ => return None,
        }
        cur = ValueId::from(t);
    }
    let mr = host.mr;
    let (kc, mc, nc) = blocks(k, host);
    // Workgroups: whole images when there are enough, else column chunks (each packs its own
    // part of B), else row chunks (each packs all of B), for about 4 in all.
    let transposed = few_positions(&shape) && !bf16;
    // A depthwise or pooling multiply-add runs about 8x slower than a packed GEMM's (8-30% of
    // peak against 80-100%), so the same time of work is 8x fewer of them: a depthwise 3x3/2
    // with 576 channels on 7x7 (254K MACs, 0.07 ms) ran on one thread.
    let per_mac = if per_channel { 8 } else { 1 };
    let target = if work * per_mac < 4 * MIN_MACS { 1 } else { 4 };
    let (chunks, split_n) = if images >= target {
        (1, true)
    } else if depthwise {
        // Whole blocks of 16 channels (as the blocked and regrouped forms take them), up to 16
        // chunks, so threads claiming them share the work evenly: 4 chunks of 6 blocks were 2,
        // 2, 2 and none, one thread's work twice the other's at 2 threads.
        (channels.div_ceil(16).clamp(1, 16), false)
    } else if transposed {
        // Each chunk packs all of A (the im2col of the image) again: 2 chunks, not 4 (3x3 by 512
        // channels on 7x7, 2 threads: 1.59 -> 1.36 ms).
        (target.div_ceil(images).min(m.div_ceil(NR)).min(2), false)
    } else if matches!(shape, Shape::ConvTranspose { .. } | Shape::Pool { .. }) {
        (target.div_ceil(images).min(channels), false)
    } else {
        // Chunks of the operand packed at run time (a convolution's columns, a GEMM's rows), so
        // no chunk packs another's part again; the constant operand is read packed, from cache.
        let want = target.div_ceil(images);
        let (n_strips, m_strips) = (n.div_ceil(NR), m.div_ceil(mr));
        let by_columns = matches!(shape, Shape::Conv { .. });
        let (own, other) = if by_columns { (n_strips, m_strips) } else { (m_strips, n_strips) };
        if own >= want {
            (want, by_columns)
        } else if other >= want {
            (want, !by_columns)
        } else {
            (own.clamp(1, want), by_columns)
        }
    };
    Some(Ukernel {
        shape,
        input,
        weight,
        epilogue: Epilogue { bias, residual, activation },
        mr,
        kc,
        mc,
        nc,
        chunks,
        split_n,
        transposed,
        blocked: Blocked::default(),
        bf16,
    })
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

/// Gates of a recurrent cell (rows of W and R per hidden unit).
fn gates(cell: RnnCell) -> usize {
    match cell {
        RnnCell::Simple => 1,
        RnnCell::Gru { .. } => 3,
        RnnCell::Lstm { .. } => 4,
    }
}

/// Whether the CPU runs this `Rnn` node whole on the recurrent kernel (`recurrent.c`) rather than
/// unrolled into kernels per step (`passes/decompose/rnn.rs`): f32 throughout, static shapes,
/// ONNX's default activations and no clip, no sequence lengths (or constant full ones), and
/// constant weights, biases and peepholes (packed at compile time) with R large enough to be a
/// buffer (it carries the packed constant). The decomposition pass asks this too: what it keeps
/// whole, `plan` must take.
pub fn runs_recurrent(graph: &Graph, id: NodeId) -> bool {
    let Op::Rnn(r) = &graph.node(id).op else { return false };
    let operands = graph.operands(id);
    let operand = |i: usize| operands.get(i).copied().flatten();
    let defaults = Rnn { activations: Vec::new(), ..r.clone() };
    if r.clip.is_some()
        || r.effective_activations() != defaults.effective_activations()
        || operands.len() > 8
    {
        return false;
    }
    let all_f32 = operands
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 4)
        .filter_map(|(_, v)| *v)
        .all(|v| graph.value_type(v).dtype == DType::F32)
        && graph.node(id).outputs.iter().all(|t| t.dtype == DType::F32);
    let static_shapes = operands.iter().flatten().all(|&v| graph.value_type(v).shape.is_fixed())
        && graph.node(id).outputs.iter().all(|t| t.shape.is_fixed());
    if !all_f32 || !static_shapes {
        return false;
    }
    let (Some(x), Some(w), Some(rw)) = (operand(0), operand(1), operand(2)) else { return false };
    let constant = |v: Option<ValueId>| v.is_none_or(|v| graph.constant_value(v).is_some());
    if graph.constant_value(x).is_some()
        || !constant(Some(w))
        || !constant(Some(rw))
        || !constant(operand(3))
        || !constant(operand(7))
    {
        return false;
    }
    if crate::fuse::is_inline_constant(graph, rw) {
        return false;
    }
    let Some(xd) = graph.value_type(x).shape.as_fixed() else { return false };
    let Some(hidden) = graph.value_type(rw).shape.as_fixed().and_then(|d| d.last().copied()) else {
        return false;
    };
    if xd.len() != 3 || xd.contains(&0) || hidden == 0 {
        return false;
    }
    let seq = if r.batch_first { xd[1] } else { xd[0] };
    // Sequence lengths: none, or a constant that is full for every sequence.
    match operand(4) {
        None => true,
        Some(l) => {
            graph.constant_value(l).is_some_and(|t| t.to_i64s().iter().all(|&n| n == seq as i64))
        }
    }
}

/// Whether the CPU runs this `Attention` node whole on the attention kernel (`attention.c`)
/// rather than decomposed (`passes/decompose/attention.rs`): f32 Q, K, V and Y of static
/// shapes; no past key and value, no padding lengths, no softcap, softmax in f32; only Y used;
/// a mask, if any, f32 or bool, spanning the keys (a shorter one is padded with "masked out")
/// and broadcasting along the other axes; operands that are buffers, not constants inlined into
/// the kernel. The decomposition pass asks this too: what it keeps whole, `plan` must take.
pub fn runs_attention(graph: &Graph, id: NodeId) -> bool {
    attention_shape(graph, id).is_some()
}

/// What the CPU keeps whole for a kernel of its own (see `runs_recurrent`, `runs_attention`).
/// Whether the CPU's integer convolution runs this QConv node (the `integer` pass makes no other).
pub fn runs_qconv(graph: &Graph, id: NodeId) -> bool {
    super::integer::runs(graph, id)
}

pub fn runs_whole(graph: &Graph, id: NodeId) -> bool {
    runs_recurrent(graph, id) || runs_attention(graph, id)
}

fn attention_shape(graph: &Graph, id: NodeId) -> Option<Shape> {
    let node = graph.node(id);
    let Op::Attention(a) = &node.op else { return None };
    let operands = graph.operands(id);
    let operand = |i: usize| operands.get(i).copied().flatten();
    if (4..operands.len()).any(|i| operand(i).is_some())
        || a.softcap != 0.0
        || a.softmax_precision.is_some_and(|p| p != DType::F32)
    {
        return None;
    }
    let unused = |i: usize| {
        let v = ValueId::new(id, i);
        graph.users(v).is_empty() && !graph.outputs().iter().any(|(_, o)| *o == v)
    };
    if node.outputs.first()?.dtype != DType::F32 || !(1..node.outputs.len()).all(unused) {
        return None;
    }
    let (q, k, v, mask) = (operand(0)?, operand(1)?, operand(2)?, operand(3));
    let buffer = |x: ValueId| !crate::fuse::is_inline_constant(graph, x);
    if ![q, k, v].iter().all(|&x| graph.value_type(x).dtype == DType::F32 && buffer(x)) {
        return None;
    }
    let dims = |x: ValueId| graph.value_type(x).shape.as_fixed();
    let (qd, kd, vd) = (dims(q)?, dims(k)?, dims(v)?);
    let rank = qd.len();
    if kd.len() != rank || vd.len() != rank {
        return None;
    }
    let (batch, heads, kv_heads, q_seq, kv_seq, head, v_head, interleaved) = match rank {
        3 => {
            let (h, kh) = (a.q_num_heads, a.kv_num_heads);
            if h == 0
                || kh == 0
                || qd[2] % h != 0
                || kd[2] % kh != 0
                || vd[2] % kh != 0
                || kd[2] / kh != qd[2] / h
                || vd[1] != kd[1]
            {
                return None;
            }
            (qd[0], h, kh, qd[1], kd[1], qd[2] / h, vd[2] / kh, true)
        }
        4 if kd[3] == qd[3] && vd[1] == kd[1] && vd[2] == kd[2] => {
            (qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], vd[3], false)
        }
        _ => return None,
    };
    if [batch, heads, kv_heads, q_seq, kv_seq, head, v_head].contains(&0)
        || heads % kv_heads != 0
        || kd[0] != batch
        || vd[0] != batch
    {
        return None;
    }
    let mut mask_dims = [1; 4];
    let mask = match mask {
        None => None,
        Some(m) => {
            let bool_mask = match graph.value_type(m).dtype {
                DType::F32 => false,
                DType::Bool => true,
                _ => return None,
            };
            let md = dims(m)?;
            let scores = [batch, heads, q_seq, kv_seq];
            if md.is_empty() || md.len() > 4 || md.last() != Some(&kv_seq) || !buffer(m) {
                return None;
            }
            mask_dims[4 - md.len()..].copy_from_slice(&md);
            if (0..4).any(|i| mask_dims[i] != 1 && mask_dims[i] != scores[i]) {
                return None;
            }
            Some((m, bool_mask))
        }
    };
    let scale = a.scale.unwrap_or(1.0 / (head as f32).sqrt());
    Some(Shape::Attention {
        batch,
        heads,
        kv_heads,
        q_seq,
        kv_seq,
        head,
        v_head,
        interleaved,
        k,
        v,
        mask,
        mask_dims,
        causal: a.is_causal,
        scale,
    })
}

/// An attention node kept whole for the CPU (see `runs_attention`): a kernel of its own.
fn attention_plan(graph: &Graph, kernel: &Kernel, root: NodeId) -> Option<Ukernel> {
    let shape = attention_shape(graph, root)?;
    let Shape::Attention { batch, heads, q_seq, kv_seq, head, v_head, k, v, mask, .. } = shape
    else {
        return None;
    };
    let q = graph.operands(root).first().copied().flatten()?;
    let inputs = [Some(q), Some(k), Some(v), mask.map(|(m, _)| m)];
    if kernel.nodes.len() != 1 || !inputs.iter().flatten().all(|x| kernel.inputs.contains(x)) {
        return None;
    }
    // Work units of 64 query rows of a head; up to 4 chunks of them once there is enough work to
    // share (a few microseconds each).
    let units = batch * heads * q_seq.div_ceil(64);
    let work = batch * heads * q_seq * kv_seq * (head + v_head);
    let chunks = if work >= 4 * MIN_MACS { units.min(4) } else { 1 };
    Some(Ukernel::unblocked(shape, q, chunks))
}

/// A recurrent layer kept whole for the CPU (see `runs_recurrent`).
fn recurrent_plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    r: &Rnn,
    host: &Host,
) -> Option<Ukernel> {
    if !runs_recurrent(graph, root) || kernel.nodes.len() != 1 {
        return None;
    }
    let operands = graph.operands(root);
    let operand = |i: usize| operands.get(i).copied().flatten();
    let (x, rw) = (operand(0)?, operand(2)?);
    let xd = graph.value_type(x).shape.as_fixed()?;
    let hidden = *graph.value_type(rw).shape.as_fixed()?.last()?;
    let (seq, batch, input) =
        if r.batch_first { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    let is_lstm = matches!(r.cell, RnnCell::Lstm { .. });
    let state = |v: Option<ValueId>| -> Option<State> {
        Some(match v {
            None => State::None,
            Some(v) if graph.constant_value(v).is_some() => State::Packed,
            Some(v) if kernel.inputs.contains(&v) => State::Input(v),
            Some(_) => return None,
        })
    };
    let h0 = state(operand(5))?;
    let c0 = if is_lstm { state(operand(6))? } else { State::None };
    if !kernel.inputs.contains(&x) || !kernel.inputs.contains(&rw) {
        return None;
    }
    let mut results = [None; 3];
    for (slot, v) in kernel.outputs.iter().enumerate() {
        if v.node != root || v.output > 2 {
            return None;
        }
        results[v.output] = Some(slot);
    }
    let dirs = if r.direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let (kc, mc, nc) = blocks(input, host);
    Some(Ukernel {
        shape: Shape::Recurrent {
            cell: r.cell,
            direction: r.direction,
            batch_first: r.batch_first,
            seq,
            batch,
            input,
            hidden,
            h0,
            c0,
            results,
        },
        input: x,
        weight: rw,
        epilogue: Epilogue { bias: None, residual: None, activation: Activation::None },
        mr: host.mr,
        kc,
        mc,
        nc,
        chunks: dirs,
        split_n: false,
        transposed: false,
        blocked: Blocked::default(),
        bf16: false,
    })
}

/// A reduction over consecutive axes (Reduce{Sum,Mean,Max,Min}, GlobalAveragePool,
/// GlobalMaxPool) or a softmax over the last axis, f32, with nothing after it. The linalg path
/// reduces a row in one vector chain and, split into workgroups, may reduce every row in each.
fn rows_plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    tail: &[NodeId],
    always: bool,
) -> Option<Ukernel> {
    let operands = graph.operands(root);
    let x = operands.first().copied().flatten()?;
    let out = *kernel.outputs.first()?;
    if !tail.is_empty()
        || graph.value_type(x).dtype != DType::F32
        || graph.value_type(out).dtype != DType::F32
        || !kernel.inputs.contains(&x)
    {
        return None;
    }
    let xd = graph.value_type(x).shape.as_fixed()?;
    let rank = xd.len();
    // (outer, reduced, inner) around a consecutive run of axes.
    let around = |first: usize, last: usize| -> (usize, usize, usize) {
        (
            xd[..first].iter().product(),
            xd[first..=last].iter().product(),
            xd[last + 1..].iter().product(),
        )
    };
    let shape = match &graph.node(root).op {
        Op::Reduce(r) => {
            let kind = match r.kind {
                kiln_ir::op::ReduceKind::Sum => 0,
                kiln_ir::op::ReduceKind::Mean => 1,
                kiln_ir::op::ReduceKind::Max => 2,
                kiln_ir::op::ReduceKind::Min => 3,
                _ => return None,
            };
            let mut axes: Vec<usize> = match operands.get(1).copied().flatten() {
                None => Vec::new(),
                Some(a) => graph
                    .constant_value(a)?
                    .to_i64s()
                    .iter()
                    .map(|&a| kiln_ir::normalize_axis(a, rank))
                    .collect::<Option<_>>()?,
            };
            if axes.is_empty() {
                if r.noop_with_empty_axes {
                    return None;
                }
                axes = (0..rank).collect();
            }
            axes.sort_unstable();
            axes.dedup();
            let (first, last) = (*axes.first()?, *axes.last()?);
            if last - first + 1 != axes.len() {
                return None;
            }
            let (outer, reduced, inner) = around(first, last);
            Shape::Reduce { outer, reduced, inner, kind }
        }
        Op::GlobalPool(p) => {
            let kind = match p {
                PoolKind::Max => 2,
                PoolKind::Average { .. } => 1,
                PoolKind::Lp { .. } => return None,
            };
            if rank < 3 {
                return None;
            }
            let (outer, reduced, inner) = around(2, rank - 1);
            Shape::Reduce { outer, reduced, inner, kind }
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            if rank == 0 || !(*axis == -1 || *axis == rank as i64 - 1) {
                return None;
            }
            let log = matches!(graph.node(root).op, Op::LogSoftmax { .. });
            Shape::Softmax { rows: xd[..rank - 1].iter().product(), cols: xd[rank - 1], log }
        }
        _ => return None,
    };
    let elements: usize = xd.iter().product();
    let (rows, row_len) = match shape {
        Shape::Reduce { outer, reduced, inner, .. } => (outer, reduced * inner),
        Shape::Softmax { rows, cols, .. } => (rows, cols),
        _ => return None,
    };
    // Below a few thousand elements either path takes a microsecond or less.
    if elements == 0 || row_len == 0 || !always && elements < 4096 {
        return None;
    }
    // Up to 4 chunks of rows once there is enough to share: each a few microseconds at least
    // (a reduction streams about 20 floats a nanosecond, softmax's e^x about 2).
    let share = if matches!(shape, Shape::Softmax { .. }) { MIN_MACS / 2 } else { 4 * MIN_MACS };
    let chunks = if elements >= share { rows.min(4) } else { 1 };
    Some(Ukernel::unblocked(shape, x, chunks.max(1)))
}

/// A Gather along axis 0 with nothing after it: whole rows copied by index. The linalg path
/// loads element by element; rows of 64 bytes and more copy faster whole.
fn gather_plan(
    graph: &Graph,
    kernel: &Kernel,
    root: kiln_ir::NodeId,
    axis: i64,
    tail: &[kiln_ir::NodeId],
    always: bool,
) -> Option<Ukernel> {
    let operands = graph.operands(root);
    let (data, indices) =
        (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let dd = graph.value_type(data).shape.as_fixed()?;
    let id = graph.value_type(indices).shape.as_fixed()?;
    let idx64 = match graph.value_type(indices).dtype {
        DType::I64 => true,
        DType::I32 => false,
        _ => return None,
    };
    if !tail.is_empty() || dd.is_empty() || !(axis == 0 || axis == -(dd.len() as i64)) || dd[0] == 0
    {
        return None;
    }
    if !kernel.inputs.contains(&data) || !kernel.inputs.contains(&indices) {
        return None;
    }
    let row_bytes = dd[1..].iter().product::<usize>() * graph.value_type(data).dtype.size();
    let n_idx: usize = id.iter().product();
    if n_idx == 0 || row_bytes == 0 || !always && (row_bytes < 64 || n_idx * row_bytes < 16 << 10) {
        return None;
    }
    let chunks = if n_idx * row_bytes >= 256 << 10 { 4.min(n_idx) } else { 1 };
    Some(Ukernel::unblocked(
        Shape::Gather { indices, rows: dd[0], row_bytes, n_idx, idx64 },
        data,
        chunks,
    ))
}

/// A Transpose alone whose permutation swaps two adjacent groups of axes, the last axis among
/// them (NCHW <-> NHWC, a matrix transpose, [B, S, D] -> [B, D, S]), on 32-bit elements. The
/// linalg path vectorises along the output's last axis, which the input strides across: it moves
/// one element at a time (NCHW -> NHWC of 64 x 56 x 56: 0.074 ms, 0.035 in 16x16 blocks).
/// Permutations that keep the last axis last copy whole runs on the linalg path already.
fn transpose_plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    perm: &[usize],
    tail: &[NodeId],
) -> Option<Ukernel> {
    let x = graph.operands(root).first().copied().flatten()?;
    let dims = graph.value_type(x).shape.as_fixed()?;
    let r = dims.len();
    if !tail.is_empty()
        || r < 2
        || perm.len() != r
        || graph.value_type(x).dtype.size() != 4
        || !kernel.inputs.contains(&x)
    {
        return None;
    }
    // perm = [0 .. b) ++ [s .. r) ++ [b .. s): axes b..s (R) and s..r (C) trade places.
    let b = (0..r).find(|&i| perm[i] != i)?;
    let s = perm[b];
    let swapped = s > b
        && s < r
        && (b..r)
            .all(|i| perm[i] == if i < b + (r - s) { s + (i - b) } else { b + (i - b - (r - s)) });
    if !swapped {
        return None;
    }
    let batch: usize = dims[..b].iter().product();
    let (rows, cols): (usize, usize) = (dims[b..s].iter().product(), dims[s..].iter().product());
    if batch * rows * cols == 0 || rows == 1 || cols == 1 {
        return None;
    }
    let bytes = batch * rows * cols * 4;
    // About 4 units in all when it is worth handing some to another thread.
    let chunks = if bytes >= 256 << 10 { 4usize.div_ceil(batch).min(cols.div_ceil(16)) } else { 1 };
    Some(Ukernel::unblocked(Shape::Transpose { batch, rows, cols }, x, chunks))
}

/// Where the microkernel is faster than the linalg path's register tiles, measured by shape class
/// on a 2-core Zen 4 (`make bench-ops`, docs/performance.md). The linalg path vectorises along the
/// output's last dimension and streams its operands unpacked: it loses when that dimension is
/// short (a k x 1 convolution, a 4x4 image), on pointwise convolutions, on strided windows, and
/// on GEMMs whose constant B does not stay in L2 between row tiles. On stride-1 windows over rows
/// of 6 or more the two are level (3x3 by 64 on 56x56: 2.18 linalg, 2.24 ms direct), and on
/// GEMMs in cache with B as it is and 8 or more rows the linalg path wins.
fn beats_linalg(shape: &Shape, k: usize, n: usize, host: &Host) -> bool {
    match *shape {
        // Grouped and depthwise convolutions: the linalg path runs them 2-20x slower; few output
        // positions by many channels fill the transposed tile, not the linalg path's rows.
        Shape::Conv { group, .. } if group > 1 => true,
        Shape::Conv { .. } if few_positions(shape) => true,
        // Strided windows: the microkernel reads them direct from stride-phase planes (3x3/2
        // 1.43 -> 1.29 ms, the 7x7/2 stem 10.0 -> 2.5 ms, 1 thread).
        Shape::Conv { kh, kw, stride, ow, .. } => ow < 6 || kh * kw == 1 || stride != [1, 1],
        // B stored transposed (PyTorch's Linear as Gemm transB=1): the linalg path reads it along
        // K, 1.3-2.6x slower at M 4-128 with B in cache (level at M = 1). At 2-4 rows the
        // linalg tile is mostly empty: 1.1-1.5x slower (level from 8 rows, faster from 16).
        Shape::Gemm { m, trans_b, .. } => {
            (trans_b && m > 1)
                || (2..=4).contains(&m)
                || k * n * 4 > host.l2_bytes / 2
                || scalar_on_linalg(shape)
        }
        // The linalg path convolves a stride-spread copy of the input: 4-9x slower.
        Shape::ConvTranspose { .. } => true,
        // (It has no linalg lowering.)
        Shape::QConv { .. } => true,
        Shape::Gather { .. }
        | Shape::Recurrent { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => false,
        // Its pooling windows are loop nests, 2-3x slower.
        Shape::Pool { .. } => true,
    }
}

/// A GEMM by a transposed weight whose K is not a multiple of 16: the linalg path's dot tile
/// needs whole vectors along K, so it stays scalar (a GRU's input projections, K = 10).
fn scalar_on_linalg(shape: &Shape) -> bool {
    matches!(*shape, Shape::Gemm { trans_b: true, k, .. } if !k.is_multiple_of(16))
}

/// A one-group convolution of at most 64 output positions and at least 64 output channels: its
/// vectors run along channels (the transposed form).
fn few_positions(shape: &Shape) -> bool {
    matches!(*shape, Shape::Conv { group: 1, m, oh, ow, .. } if oh * ow <= 64 && m >= 64)
}

/// A window over one or two spatial axes as the 2-D one the kernels take (a 1-D window is a 2-D
/// one of height 1): input height, kernel size, stride, dilation, begin padding and output size
/// per axis, from the input and weight dims and each axis's (stride, dilation, pad, output).
#[allow(clippy::type_complexity)]
fn plane(
    xd: &[usize],
    wd: &[usize],
    axes: impl Iterator<Item = (usize, usize, i64, usize)>,
) -> Option<(usize, usize, usize, [usize; 2], [usize; 2], [i64; 2], usize, usize)> {
    let axes: Vec<_> = axes.collect();
    let (sw, dw, pw, ow) = *axes.last()?;
    let (h, kh, (sh, dh, ph, oh)) = match axes.len() {
        2 => (xd[2], wd[2], axes[0]),
        1 => (1, 1, (1, 1, 0, 1)),
        _ => return None,
    };
    Some((h, kh, wd[wd.len() - 1], [sh, sw], [dh, dw], [ph, pw], oh, ow))
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
    if matches!(
        u.shape,
        Shape::Pool { .. }
            | Shape::Gather { .. }
            | Shape::Reduce { .. }
            | Shape::Softmax { .. }
            | Shape::Transpose { .. }
            | Shape::Attention { .. }
    ) {
        return Ok(Vec::new());
    }
    if let Shape::QConv { .. } = u.shape {
        return super::integer::pack(graph, kernel, u);
    }
    if let Shape::Recurrent { .. } = u.shape {
        let out = pack_recurrent(graph, kernel, u)?;
        return Ok(out.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let w = constant_f32s(graph, u.weight).ok_or_else(|| {
        CompileError::Internal("the microkernel's weight is not a constant".into())
    })?;
    let (m, n, k) = u.mnk();
    if u.bf16 {
        let mut out = match u.shape {
            Shape::Conv { c, kh, kw, .. } => pack_conv_bf16(&w, m, c, kh * kw, u.mr),
            Shape::Gemm { trans_b, .. } => pack_gemm_bf16(&w, n, k, trans_b),
            _ => return Err(CompileError::Internal(format!("no bf16 packing for {u}"))),
        };
        out.extend(u.epilogue.bias.iter().flatten().map(|b| b.to_bits()));
        return Ok(out.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let mut out: Vec<f32> = Vec::new();
    match u.shape {
        // Depthwise, channel-blocked or regrouped: [C/16, KH*KW, 16], each tap a vector of 16
        // channels (the last padded with zeros).
        Shape::Conv { c, .. } if u.depthwise_form().is_some_and(|f| f != DepthwiseForm::Rows) => {
            out.resize(c.div_ceil(16) * 16 * k, 0.0);
            for ch in 0..c {
                for t in 0..k {
                    out[((ch / 16) * k + t) * 16 + ch % 16] = w[ch * k + t];
                }
            }
        }
        // Depthwise: the weights as they are, [C, KH*KW].
        Shape::Conv { .. } if u.depthwise() => out = w,
        // Transposed: B[k, m] = W[m, k], in strips of NR output channels.
        Shape::Conv { m: channels, .. } if u.transposed => {
            out.resize(channels.div_ceil(NR) * k * NR, 0.0);
            for j in 0..channels {
                for kk in 0..k {
                    out[((j / NR) * k + kk) * NR + j % NR] = w[j * k + kk];
                }
            }
        }
        // Per group, A = W_g[m, k] (row-major as stored), in strips of MR rows.
        Shape::Conv { group, .. } => {
            let per_group = m.div_ceil(u.mr) * k * u.mr;
            out.resize(group * per_group, 0.0);
            for g in 0..group {
                for i in 0..m {
                    let (s, r) = (i / u.mr, i % u.mr);
                    for kk in 0..k {
                        out[g * per_group + (s * k + kk) * u.mr + r] = w[(g * m + i) * k + kk];
                    }
                }
            }
        }
        Shape::Pool { .. }
        | Shape::QConv { .. }
        | Shape::Gather { .. }
        | Shape::Recurrent { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => {}
        // A[m, ci] = W[ci, m] (W is [Cin, Cout*KH*KW]), in strips of MR rows.
        Shape::ConvTranspose { .. } => {
            out.resize(m.div_ceil(u.mr) * k * u.mr, 0.0);
            for i in 0..m {
                for ci in 0..k {
                    out[((i / u.mr) * k + ci) * u.mr + i % u.mr] = w[ci * m + i];
                }
            }
        }
        // B[k, n] = W[k, n], or W[n, k] transposed, in strips of NR columns.
        Shape::Gemm { trans_b, .. } => {
            let strips = n.div_ceil(NR);
            out.resize(strips * k * NR, 0.0);
            for kk in 0..k {
                for j in 0..n {
                    let v = if trans_b { w[j * k + kk] } else { w[kk * n + j] };
                    out[((j / NR) * k + kk) * NR + j % NR] = v;
                }
            }
        }
    }
    if let Some(b) = &u.epilogue.bias {
        out.extend(b);
    }
    Ok(out.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// `x` as bf16 (to nearest, ties to even), its 16 bits in the low half of a word.
fn bf16_bits(x: f32) -> u32 {
    u32::from(half::bf16::from_f32(x).to_bits())
}

/// A one-group convolution's weights W[m, c, taps] for `kiln_uk_conv2d`'s bf16 form: A[i, q]
/// with q = (channel pair, tap), each word two bf16 (rounded to nearest even), the even
/// channel's in the low half, as `vdpbf16ps` pairs them with the input's channel pairs; in
/// strips of `mr` rows ([(s * K2 + q) * mr + r]), rows past m and an odd c's last channel zero.
fn pack_conv_bf16(w: &[f32], m: usize, c: usize, taps: usize, mr: usize) -> Vec<u32> {
    let k2 = c.div_ceil(2) * taps;
    let mut out = vec![0u32; m.div_ceil(mr) * k2 * mr];
    for i in 0..m {
        let (s, r) = (i / mr, i % mr);
        for ch in 0..c {
            for t in 0..taps {
                let q = (ch / 2) * taps + t;
                out[(s * k2 + q) * mr + r] |=
                    bf16_bits(w[(i * c + ch) * taps + t]) << (16 * (ch % 2));
            }
        }
    }
    out
}

/// A GEMM's constant B[k, n] (W[k, n], or W[n, k] transposed) for `kiln_uk_gemm`'s bf16 form:
/// in strips of NR columns, a word per column and pair of rows ([(t * K2 + q) * NR + c]: B[2q, j]
/// low, B[2q + 1, j] high, rounded to nearest even), columns past n and an odd k's last row zero.
fn pack_gemm_bf16(w: &[f32], n: usize, k: usize, trans_b: bool) -> Vec<u32> {
    let k2 = k.div_ceil(2);
    let mut out = vec![0u32; n.div_ceil(NR) * k2 * NR];
    for kk in 0..k {
        for j in 0..n {
            let v = if trans_b { w[j * k + kk] } else { w[kk * n + j] };
            out[((j / NR) * k2 + kk / 2) * NR + j % NR] |= bf16_bits(v) << (16 * (kk % 2));
        }
    }
    out
}

/// The packed weights' length in floats (where the bias starts).
fn packed_floats(u: &Ukernel) -> usize {
    let (m, n, k) = u.mnk();
    match (u.bf16, &u.shape) {
        (true, Shape::Conv { c, kh, kw, .. }) => {
            return m.div_ceil(u.mr) * c.div_ceil(2) * kh * kw * u.mr
        }
        (true, Shape::Gemm { .. }) => return n.div_ceil(NR) * k.div_ceil(2) * NR,
        _ => {}
    }
    match u.shape {
        Shape::Conv { c, .. } if u.depthwise_form().is_some_and(|f| f != DepthwiseForm::Rows) => {
            c.div_ceil(16) * 16 * k
        }
        Shape::Conv { c, .. } if u.depthwise() => c * k,
        Shape::Conv { m: channels, .. } if u.transposed => channels.div_ceil(NR) * k * NR,
        Shape::Conv { group, .. } => group * m.div_ceil(u.mr) * k * u.mr,
        Shape::ConvTranspose { .. } => m.div_ceil(u.mr) * k * u.mr,
        Shape::Gemm { .. } => n.div_ceil(NR) * k * NR,
        // (Its packed constant is bytes, with its own bias: integer::pack.)
        Shape::QConv { .. } => 0,
        Shape::Pool { .. }
        | Shape::Gather { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. }
        | Shape::Attention { .. } => 0,
        Shape::Recurrent { direction, .. } => {
            recurrent_floats_per_direction(&u.shape)
                * if direction == RnnDirection::Bidirectional { 2 } else { 1 }
        }
    }
}

/// Floats of one direction's packed weights (as `recurrent.c` lays them out): W^T in strips of
/// NR columns, R^T, the bias, the candidate's recurrent bias, the peepholes.
fn recurrent_floats_per_direction(shape: &Shape) -> usize {
    let Shape::Recurrent { cell, input, hidden, .. } = *shape else { return 0 };
    let hp = hidden.div_ceil(16) * 16;
    let ghp = gates(cell) * hp;
    ghp.div_ceil(NR) * NR * input + hidden * ghp + ghp + hp + 3 * hp
}

/// A recurrent layer's packed constant: per direction the layout `recurrent.c` reads (each gate's
/// columns padded to a multiple of 16, padding zero), then the initial state and cell where they
/// are constants.
fn pack_recurrent(graph: &Graph, kernel: &Kernel, u: &Ukernel) -> Result<Vec<f32>> {
    let Shape::Recurrent { cell, direction, input, hidden, h0, c0, .. } = u.shape else {
        return Ok(Vec::new());
    };
    let root = *kernel
        .nodes
        .first()
        .ok_or_else(|| CompileError::Internal("a recurrent kernel without its node".into()))?;
    let operands = graph.operands(root);
    let constant = |i: usize| -> Option<Vec<f32>> {
        operands.get(i).copied().flatten().and_then(|v| constant_f32s(graph, v))
    };
    let missing = |what: &str| {
        CompileError::Internal(format!("the recurrent layer's {what} is not a constant"))
    };
    let w = constant(1).ok_or_else(|| missing("W"))?;
    let r = constant(2).ok_or_else(|| missing("R"))?;
    let (b, p) = (constant(3), constant(7));
    let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
    let g = gates(cell);
    let (h, hp) = (hidden, hidden.div_ceil(16) * 16);
    let ghp = g * hp;
    let lbr = matches!(cell, RnnCell::Gru { linear_before_reset: true });
    let per = recurrent_floats_per_direction(&u.shape);
    let mut out = vec![0.0f32; per * dirs];
    for d in 0..dirs {
        let o = &mut out[d * per..(d + 1) * per];
        let (wp, rest) = o.split_at_mut(ghp.div_ceil(NR) * NR * input);
        let (rt, rest) = rest.split_at_mut(h * ghp);
        let (bias, rest) = rest.split_at_mut(ghp);
        let (rbh, peep) = rest.split_at_mut(hp);
        for gate in 0..g {
            // `c` indexes the packed rows and several source arrays at once.
            #[allow(clippy::needless_range_loop)]
            for c in 0..h {
                let (row, j) = (gate * h + c, gate * hp + c);
                for k in 0..input {
                    wp[((j / NR) * input + k) * NR + j % NR] = w[(d * g * h + row) * input + k];
                }
                for k in 0..h {
                    rt[k * ghp + j] = r[(d * g * h + row) * h + k];
                }
                if let Some(b) = &b {
                    let (wb, rb) = (b[d * 2 * g * h + row], b[d * 2 * g * h + g * h + row]);
                    // GRU's candidate with linear_before_reset: its recurrent bias is inside r * (...).
                    if lbr && gate == 2 {
                        bias[j] = wb;
                        rbh[c] = rb;
                    } else {
                        bias[j] = wb + rb;
                    }
                }
            }
        }
        if let Some(p) = &p {
            for gate in 0..3 {
                for c in 0..h {
                    peep[gate * hp + c] = p[d * 3 * h + gate * h + c];
                }
            }
        }
    }
    for (state, i) in [(h0, 5), (c0, 6)] {
        if state == State::Packed {
            out.extend(constant(i).ok_or_else(|| missing("initial state"))?);
        }
    }
    Ok(out)
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
    let i64t: Type = IntegerType::new(ctx, 64).into();
    let f32t = Type::float32(ctx);
    let index = Type::index(ctx);
    let mut arg_types = Vec::new();
    for &v in kernel.inputs.iter().chain(&kernel.outputs) {
        arg_types.push(crate::codegen::memref_type(ctx, graph, v)?);
    }
    arg_types.extend([index, index]);
    let symbol = match u.shape {
        Shape::Conv { .. } if u.depthwise() => "kiln_uk_depthwise",
        Shape::Conv { .. } => "kiln_uk_conv2d",
        Shape::Gemm { .. } => "kiln_uk_gemm",
        Shape::QConv { group, .. } if group > 1 => "kiln_uk_qdepthwise",
        Shape::QConv { .. } if super::integer::gemm_form(&u.shape) => "kiln_uk_qgemm",
        Shape::QConv { .. } => "kiln_uk_qconv2d",
        Shape::ConvTranspose { .. } => "kiln_uk_conv_transpose",
        Shape::Pool { kind: 3, .. } => "kiln_uk_maxpool_u8",
        Shape::Pool { .. } => "kiln_uk_pool2d",
        Shape::Gather { .. } => "kiln_uk_gather_rows",
        Shape::Reduce { .. } => "kiln_uk_reduce",
        Shape::Softmax { .. } => "kiln_uk_softmax",
        Shape::Transpose { .. } => "kiln_uk_transpose",
        Shape::Attention { .. } => "kiln_uk_attention",
        Shape::Recurrent { .. } => "kiln_uk_recurrent",
    };
    let block = Block::new(&arg_types.iter().map(|t| (*t, loc)).collect::<Vec<_>>());
    // The call's arguments, each i64 (pointers, sizes) or f32 (the clip bounds); the callee's
    // signature is theirs.
    let mut callee_types: Vec<Type> = Vec::new();
    {
        let c64 = |v: i64| -> Value {
            push(&block, arith::constant(ctx, IntegerAttribute::new(i64t, v).into(), loc))
        };
        let cf = |v: f32| -> Value {
            push(&block, arith::constant(ctx, FloatAttribute::new(ctx, f32t, v as f64).into(), loc))
        };
        let pointer = |i: usize| -> Result<Value> {
            let arg: Value =
                block.argument(i).map_err(|e| CompileError::Internal(e.to_string()))?.into();
            let p = push(
                &block,
                op(ctx, loc, "memref.extract_aligned_pointer_as_index", &[arg], &[index], &[])?,
            );
            Ok(push(&block, arith::index_cast(p, i64t, loc)))
        };
        let slot = |v: ValueId| -> Result<usize> {
            kernel.inputs.iter().position(|&x| x == v).ok_or_else(|| {
                CompileError::Internal(format!(
                    "%{} is not an input of {}",
                    graph.value_name(v),
                    kernel.name
                ))
            })
        };
        let n_in = kernel.inputs.len();
        let x = pointer(slot(u.input)?)?;
        let wp = pointer(slot(u.weight)?)?;
        let bias = match &u.epilogue.bias {
            Some(_) => {
                let off = c64(4 * packed_floats(u) as i64);
                push(&block, arith::addi(wp, off, loc))
            }
            None => c64(0),
        };
        let res = match u.epilogue.residual {
            Some(r) => pointer(slot(r)?)?,
            None => c64(0),
        };
        let y = pointer(n_in)?;
        let (act, lo, hi) = match u.epilogue.activation {
            Activation::None => (0, 0.0, 0.0),
            Activation::Relu => (1, 0.0, 0.0),
            Activation::Clip(lo, hi) => (2, lo, hi),
        };
        let wg = |i: usize| -> Result<Value> {
            let arg: Value =
                block.argument(i).map_err(|e| CompileError::Internal(e.to_string()))?.into();
            Ok(push(&block, arith::index_cast(arg, i64t, loc)))
        };
        let (wg_begin, wg_end) = (wg(arg_types.len() - 2)?, wg(arg_types.len() - 1)?);
        let ints = |v: &[usize]| v.iter().map(|&x| c64(x as i64)).collect::<Vec<_>>();
        let mut args: Vec<Value> = vec![x, wp, bias, res, y];
        if let Shape::Pool {
            c, h, w, kh, kw, stride, dilation, pad, pad_end, oh, ow, kind, ..
        } = &u.shape
        {
            args = vec![x, y];
            args.extend(ints(&[
                *c,
                *h,
                *w,
                *kh,
                *kw,
                stride[0],
                stride[1],
                dilation[0],
                dilation[1],
                pad[0],
                pad[1],
                pad_end[0],
                pad_end[1],
                *oh,
                *ow,
                *kind as usize,
            ]));
        }
        if let Shape::QConv { .. } = &u.shape {
            args = vec![x, wp, y];
            args.extend(super::integer::sizes(&u.shape).into_iter().map(&c64));
        }
        if let Shape::Reduce { outer, reduced, inner, kind } = &u.shape {
            args = vec![x, y];
            args.extend(ints(&[*outer, *reduced, *inner, *kind as usize]));
        }
        if let Shape::Softmax { rows, cols, log } = &u.shape {
            args = vec![x, y];
            args.extend(ints(&[*rows, *cols, *log as usize]));
        }
        if let Shape::Transpose { batch, rows, cols } = &u.shape {
            args = vec![x, y];
            args.extend(ints(&[*batch, *rows, *cols]));
        }
        if let Shape::Attention {
            batch,
            heads,
            kv_heads,
            q_seq,
            kv_seq,
            head,
            v_head,
            interleaved,
            k,
            v,
            mask,
            mask_dims,
            causal,
            scale,
        } = &u.shape
        {
            let mask_ptr = match mask {
                Some((m, _)) => pointer(slot(*m)?)?,
                None => c64(0),
            };
            args = vec![x, pointer(slot(*k)?)?, pointer(slot(*v)?)?, mask_ptr, y];
            // Strides of (batch, head, row), the last axis contiguous.
            let strides = |heads: usize, rows: usize, size: usize| {
                if *interleaved {
                    [rows * heads * size, size, heads * size]
                } else {
                    [heads * rows * size, rows * size, size]
                }
            };
            let md = mask_dims;
            let natural = [md[1] * md[2] * md[3], md[2] * md[3], md[3]];
            let ms: Vec<usize> = (0..3).map(|i| if md[i] == 1 { 0 } else { natural[i] }).collect();
            let kind = match mask {
                None => 0,
                Some((_, false)) => 1,
                Some((_, true)) => 2,
            };
            args.extend(ints(&[*batch, *heads, *kv_heads, *q_seq, *kv_seq, *head, *v_head]));
            args.extend(ints(&strides(*heads, *q_seq, *head)));
            args.extend(ints(&strides(*kv_heads, *kv_seq, *head)));
            args.extend(ints(&strides(*kv_heads, *kv_seq, *v_head)));
            args.extend(ints(&strides(*heads, *q_seq, *v_head)));
            args.extend(ints(&[kind, ms[0], ms[1], ms[2], *causal as usize]));
            args.push(cf(*scale));
        }
        if let Shape::Gather { indices, rows, row_bytes, n_idx, idx64 } = &u.shape {
            args = vec![x, pointer(slot(*indices)?)?, y];
            args.extend(ints(&[*rows, *row_bytes, *n_idx, *idx64 as usize]));
        }
        if let Shape::Recurrent {
            cell,
            direction,
            batch_first,
            seq,
            batch,
            input,
            hidden,
            h0,
            c0,
            results,
        } = &u.shape
        {
            // Constant initial states follow the weights in the packed constant.
            let mut packed_next = packed_floats(u);
            let state_floats =
                batch * hidden * if *direction == RnnDirection::Bidirectional { 2 } else { 1 };
            let mut state = |s: &State| -> Result<Value> {
                Ok(match s {
                    State::None => c64(0),
                    State::Input(v) => pointer(slot(*v)?)?,
                    State::Packed => {
                        let off = c64(4 * packed_next as i64);
                        packed_next += state_floats;
                        push(&block, arith::addi(wp, off, loc))
                    }
                })
            };
            let (h0, c0) = (state(h0)?, state(c0)?);
            let result = |i: usize| -> Result<Value> {
                results[i].map_or_else(|| Ok(c64(0)), |slot| pointer(n_in + slot))
            };
            args = vec![x, wp, h0, c0, result(0)?, result(1)?, result(2)?];
            let (cell, lbr, input_forget) = match cell {
                RnnCell::Simple => (0, false, false),
                RnnCell::Gru { linear_before_reset } => (1, *linear_before_reset, false),
                RnnCell::Lstm { input_forget } => (2, false, *input_forget),
            };
            let direction = match direction {
                RnnDirection::Forward => 0,
                RnnDirection::Reverse => 1,
                RnnDirection::Bidirectional => 2,
            };
            args.extend(ints(&[
                cell,
                lbr as usize,
                input_forget as usize,
                direction,
                *batch_first as usize,
                *seq,
                *batch,
                *input,
                *hidden,
                u.kc,
                u.mc,
                u.nc,
            ]));
        }
        match &u.shape {
            Shape::Pool { .. }
            | Shape::QConv { .. }
            | Shape::Gather { .. }
            | Shape::Recurrent { .. }
            | Shape::Reduce { .. }
            | Shape::Softmax { .. }
            | Shape::Transpose { .. }
            | Shape::Attention { .. } => {}
            Shape::Conv { c, h, w, kh, kw, stride, dilation, pad, oh, ow, .. } if u.depthwise() => {
                args.extend(ints(&[
                    *c,
                    *h,
                    *w,
                    *kh,
                    *kw,
                    stride[0],
                    stride[1],
                    dilation[0],
                    dilation[1],
                    pad[0],
                    pad[1],
                    *oh,
                    *ow,
                ]));
            }
            Shape::Conv { c, h, w, m, group, kh, kw, stride, dilation, pad, oh, ow, .. } => {
                args.extend(ints(&[
                    *c,
                    *h,
                    *w,
                    *m,
                    *group,
                    *kh,
                    *kw,
                    stride[0],
                    stride[1],
                    dilation[0],
                    dilation[1],
                    pad[0],
                    pad[1],
                    *oh,
                    *ow,
                ]));
            }
            Shape::ConvTranspose {
                cin, h, w, cout, kh, kw, stride, dilation, pad, oh, ow, ..
            } => {
                args.extend(ints(&[
                    *cin,
                    *h,
                    *w,
                    *cout,
                    *kh,
                    *kw,
                    stride[0],
                    stride[1],
                    dilation[0],
                    dilation[1],
                ]));
                args.extend([c64(pad[0]), c64(pad[1])]);
                args.extend(ints(&[*oh, *ow]));
            }
            Shape::Gemm { m, n, k, trans_a, .. } => {
                // A[i, kk] = a[i * lda + kk * ka].
                let (lda, ka) = if *trans_a { (1, *m) } else { (*k, 1) };
                args.extend(ints(&[*m, *n, *k, lda, ka]));
            }
        }
        // (A gather and a recurrent layer have no epilogue.)
        if !matches!(
            u.shape,
            Shape::Gather { .. }
                | Shape::QConv { .. }
                | Shape::Recurrent { .. }
                | Shape::Reduce { .. }
                | Shape::Softmax { .. }
                | Shape::Transpose { .. }
                | Shape::Attention { .. }
        ) {
            args.push(c64(act));
            args.push(cf(lo));
            args.push(cf(hi));
        }
        if matches!(u.shape, Shape::Recurrent { .. }) {
            // (Its blocks are among its sizes; its workgroups are its directions.)
        } else if matches!(
            u.shape,
            Shape::Gather { .. }
                | Shape::Reduce { .. }
                | Shape::Softmax { .. }
                | Shape::Transpose { .. }
                | Shape::Attention { .. }
        ) {
            args.extend(ints(&[u.chunks]));
        } else if u.depthwise() {
            args.extend(ints(&[u.chunks, u.depthwise_form().map_or(0, DepthwiseForm::code)]));
        } else if matches!(u.shape, Shape::Pool { .. }) {
            args.extend(ints(&[u.chunks]));
        } else if matches!(u.shape, Shape::QConv { .. }) {
            args.extend(ints(&[u.chunks, u.split_n as usize]));
        } else if matches!(u.shape, Shape::ConvTranspose { .. }) {
            args.extend(ints(&[u.kc, u.mc, u.nc, u.chunks]));
        } else {
            args.extend(ints(&[u.kc, u.mc, u.nc, u.chunks, u.split_n as usize]));
            if matches!(u.shape, Shape::Conv { .. }) {
                args.extend(ints(&[
                    u.transposed as usize,
                    u.blocked.input as usize,
                    u.blocked.output as usize,
                    u.bf16 as usize,
                ]));
            } else if matches!(u.shape, Shape::Gemm { .. }) {
                args.extend(ints(&[u.bf16 as usize]));
            }
        }
        args.push(wg_begin);
        args.push(wg_end);
        callee_types.extend(args.iter().map(|a| a.r#type()));
        block.append_operation(func::call(
            ctx,
            FlatSymbolRefAttribute::new(ctx, symbol),
            &args,
            &[],
            loc,
        ));
        block.append_operation(func::r#return(&[], loc));
    }
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
