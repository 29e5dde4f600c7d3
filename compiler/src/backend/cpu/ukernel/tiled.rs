//! The planning convolutions, transposed convolutions, pooling and GEMMs share: from the root's
//! shape (read by its module), whether the kernel is worth it, its elementwise tail as the
//! epilogue (bias and residual adds, then ReLU or Clip), the cache blocks and the work units.

use kiln_ir::op::{BinaryOp, PoolKind, UnaryOp};
use kiln_ir::{DType, Graph, NodeId, Op, ValueId};

use super::{
    blocks, channel_bias, column_bias, conv, gemm, pool, Activation, Blocked, Epilogue, Host,
    Shape, Ukernel, MIN_MACS, NR,
};
use crate::fuse::Kernel;
use crate::Precision;

/// A root as its module reads it: the kernel's shape, its data input, its weight (the data input
/// again where it has none) and its bias (per output channel or column), if any.
pub(super) type Root = (Shape, ValueId, ValueId, Option<Vec<f32>>);

/// The plan of a kernel whose root is a Conv, ConvTranspose, Pool, MatMul or Gemm (and whose
/// one output is its last node's), if it takes the microkernel.
pub(super) fn plan(
    graph: &Graph,
    kernel: &Kernel,
    root: NodeId,
    tail: &[NodeId],
    host: &Host,
    always: bool,
    precision: Precision,
) -> Option<Ukernel> {
    let operands = graph.operands(root);
    let f32_only = operands
        .iter()
        .flatten()
        .chain(&kernel.outputs)
        .all(|&v| graph.value_type(v).dtype == DType::F32);
    // Max pooling of bytes (a quantized model's, `cpu/passes/integer.rs`) has a kernel of its own.
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
        Op::Conv(c) => conv::shape(graph, &operands, c)?,
        Op::Pool(p) => pool::shape(graph, &operands, p, u8_max_pool)?,
        Op::ConvTranspose(c) => conv::transpose_shape(graph, &operands, c)?,
        op @ (Op::MatMul | Op::Gemm(_)) => gemm::shape(graph, &operands, op)?,
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
        // (Planned by their own modules.)
        Shape::QConv { .. }
        | Shape::DynQGemm { .. }
        | Shape::NBitsGemm { .. }
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
        | Shape::DynQGemm { .. }
        | Shape::NBitsGemm { .. }
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
        | Shape::DynQGemm { .. }
        | Shape::NBitsGemm { .. }
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
    let wanted = always || bf16 || (fills && enough && beats_linalg(&shape, m, k, n, host));
    if m * n * k == 0 || !wanted {
        return None;
    }
    // The tail: constant or residual adds, then one activation.
    let mut residual = None;
    let mut residual_last = false;
    let mut activation = Activation::None;
    let mut cur = ValueId::from(root);
    for &t in tail {
        let node = graph.node(t);
        let ops: Vec<ValueId> = graph.operands(t).into_iter().flatten().collect();
        if activation != Activation::None {
            // After the activation only a residual (YOLOv8's `x + silu(conv(...))`), added last.
            let other = match (&node.op, ops.as_slice()) {
                (Op::Binary(BinaryOp::Add), [a, b]) if *a == cur => *b,
                (Op::Binary(BinaryOp::Add), [a, b]) if *b == cur => *a,
                _ => return None,
            };
            // (One residual in all: one added before the activation, or a second, is refused.)
            if residual.is_some()
                || dims(other)? != out_dims
                || graph.value_type(other).dtype != DType::F32
                || graph.constant_value(other).is_some()
                || !kernel.inputs.contains(&other)
            {
                return None;
            }
            residual = Some(other);
            residual_last = true;
            cur = ValueId::from(t);
            continue;
        }
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
                        | Shape::DynQGemm { .. }
                        | Shape::NBitsGemm { .. }
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
            // MobileNetV3's convolutions (DBNet's backbone: 20 of them ran on the linalg path
            // for want of it, its 3x3/2 stem 2.7x onnxruntime's time).
            Op::Unary(UnaryOp::HardSwish) => activation = Activation::HardSwish,
            // SiLU (YOLO's, `passes::recognize`): its 57 kernels were 9% of yolov8n's time.
            Op::Unary(UnaryOp::Swish { alpha }) => activation = Activation::Swish(*alpha),
            // A segmentation head's last layer (DBNet's probability map): a ConvTranspose's
            // epilogue runs over finished planes, 16 lanes at a time.
            Op::Unary(UnaryOp::Sigmoid) if matches!(shape, Shape::ConvTranspose { .. }) => {
                activation = Activation::Sigmoid
            }
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
    let (mut kc, mc, mut nc) = blocks(k, host);
    // A direct convolution in f32 on AVX-512 with whole vectors of channels: vectors along them.
    let channel_vectors = if bf16 { 0 } else { conv::channel_vectors(&shape, host) };
    if channel_vectors > 0 {
        (kc, nc) = conv::channel_blocks(host, channel_vectors);
    }
    // Workgroups: whole images when there are enough, else column chunks (each packs its own
    // part of B), else row chunks (each packs all of B), for about 4 in all.
    let transposed = few_positions(&shape) && !bf16 && channel_vectors == 0;
    // bf16 direct convolutions on AMX tiles: a tile step multiplies 16 channel pairs (or all of
    // them); below 8 pairs most of it would be padding. Their channel units are 32 (a tile pair).
    // GEMMs too, of 16 or more rows (a tile's) and 8 or more pairs along K.
    let amx = bf16
        && host.amx_bf16
        && match shape {
            Shape::Conv { c, .. } => {
                c.div_ceil(2) >= conv::AMX_MIN_PAIRS && conv::direct_shape(&shape)
            }
            Shape::Gemm { m, k, .. } => m >= 16 && k.div_ceil(2) >= conv::AMX_MIN_PAIRS,
            _ => false,
        };
    // A depthwise or pooling multiply-add runs about 8x slower than a packed GEMM's (8-30% of
    // peak against 80-100%), so the same time of work is 8x fewer of them: a depthwise 3x3/2
    // with 576 channels on 7x7 (254K MACs, 0.07 ms) ran on one thread.
    let per_mac = if per_channel { 8 } else { 1 };
    let target = host.units(work * per_mac, MIN_MACS);
    let mut row_bands = 1;
    let (chunks, split_n) = if depthwise {
        // Whole blocks of 16 channels (as the blocked and regrouped forms take them), up to 16
        // chunks, so threads claiming them share the work evenly: 4 chunks of 6 blocks were 2,
        // 2, 2 and none, one thread's work twice the other's at 2 threads. Bands of rows where
        // there are fewer blocks than units wanted, or a block's plane overflows the cache.
        let blocks =
            if images >= target { 1 } else { channels.div_ceil(16).clamp(1, 4 * host.max_units()) };
        row_bands = conv::depthwise_bands(&shape, blocks, target.div_ceil(images), host);
        (blocks * row_bands, false)
    } else if images >= target {
        (1, true)
    } else if transposed {
        // Each chunk packs all of A (the im2col of the image) again: 2 chunks, not 4 (3x3 by 512
        // channels on 7x7, 2 threads: 1.59 -> 1.36 ms).
        (target.div_ceil(images).min(m.div_ceil(NR)).min(host.max_units() / 2), false)
    } else if let Shape::ConvTranspose { h, kh, stride, dilation, .. } = shape {
        // Chunks of output channels; where there are fewer channels than units wanted and the
        // window's rows do not overlap (a 2x2/2 upsampling), chunks of input rows instead
        // (split_n), each owning its output rows: DBNet's 64 -> 1 channel 2x2/2 to 640x640 ran
        // as one unit.
        let want = target.div_ceil(images);
        if channels < want && (kh - 1) * dilation[0] < stride[0] && h > 1 {
            (want.min(h), true)
        } else {
            (want.min(channels), false)
        }
    } else if matches!(shape, Shape::Pool { .. }) {
        (target.div_ceil(images).min(channels), false)
    } else if channel_vectors > 0 {
        conv::channel_split(&shape, channel_vectors, target.div_ceil(images), host.threads)
    } else if conv::direct_shape(&shape) {
        let want = target.div_ceil(images);
        let strip = if amx { conv::AMX_CHANNELS } else { mr };
        conv::direct_split(&shape, strip, mr == 8 && !bf16, want, host.threads)
    } else if matches!(shape, Shape::Conv { group: 1, .. }) {
        conv::gemm_split((m, n, k), images, mr, target.div_ceil(images), host.threads)
    } else {
        // Chunks of the operand packed at run time (a convolution's columns, a GEMM's rows), so
        // no chunk packs another's part again; the constant operand is read packed, from cache.
        // Where neither has the units wanted, fewer (halving to 4) before falling back to the
        // strips of its own operand: a GEMM of 4 column strips wanting 5 units takes 4.
        let (n_strips, m_strips) = (n.div_ceil(NR), m.div_ceil(mr));
        let by_columns = matches!(shape, Shape::Conv { .. });
        let (own, other) = if by_columns { (n_strips, m_strips) } else { (m_strips, n_strips) };
        let mut want = target.div_ceil(images);
        loop {
            if own >= want {
                break (want, by_columns);
            } else if other >= want {
                break (want, !by_columns);
            } else if want <= 4 {
                break (own.clamp(1, want), by_columns);
            }
            want = (want / 2).max(4);
        }
    };
    Some(Ukernel {
        shape,
        input,
        weight,
        epilogue: Epilogue { bias, residual, residual_last, activation },
        mr,
        kc,
        mc,
        nc,
        chunks,
        split_n,
        row_bands,
        transposed,
        blocked: Blocked::default(),
        bf16,
        amx,
        channel_vectors,
    })
}

/// Where the microkernel is faster than the linalg path's register tiles, measured by shape class
/// on a 2-core Zen 4 and a 2-core Xeon (Emerald Rapids; `make bench-ops`, docs/performance.md).
/// The linalg path vectorises along the output's last dimension and streams its operands
/// unpacked: it loses on every one-group convolution. On the Zen 4 stride-1 windows over rows of
/// 6 or more were level (3x3 by 64 on 56x56: 2.18 linalg, 2.24 ms direct); on the Xeon, whose
/// two 512-bit FMA ports the packed tiles keep busier, the direct kernel is ahead from there up
/// (1 thread, CPU time: 3x3 by 64 on 56x56 2.66 -> 2.36 ms, by 128 on 28x28 2.31 -> 1.80, by
/// 256 on 14x14 2.31 -> 1.28), and far ahead where the operands leave the caches (DBNet's 3x3
/// 256 -> 64 on 160x160: 372 -> 106 ms at 2 threads). On GEMMs in cache with B as it is and 8
/// or more rows the linalg path wins.
fn beats_linalg(shape: &Shape, m: usize, k: usize, n: usize, host: &Host) -> bool {
    match *shape {
        // Grouped and depthwise convolutions: the linalg path runs them 2-20x slower; few output
        // positions by many channels fill the transposed tile, not the linalg path's rows.
        Shape::Conv { group, .. } if group > 1 => true,
        Shape::Conv { .. } if few_positions(shape) => true,
        // Strided windows: the microkernel reads them direct from stride-phase planes (3x3/2
        // 1.43 -> 1.29 ms, the 7x7/2 stem 10.0 -> 2.5 ms, 1 thread); pointwise ones and short
        // rows do not vectorise on linalg; stride-1 windows are level or ahead (above) once an
        // image's work pays for its padded copy; below 1M multiply-adds an image they stay on
        // linalg as before (cifarnet's 6 -> 16 5x5 on 14x14, 240K, batch 64: 1.02 against
        // 1.19 ms for the model on the kernel, one A/B run, which this noisy machine cannot
        // tell from even).
        Shape::Conv { kh, kw, stride, ow, .. } => {
            ow < 6 || kh * kw == 1 || stride != [1, 1] || m * n * k >= 16 * MIN_MACS
        }
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
        Shape::QConv { .. } | Shape::DynQGemm { .. } | Shape::NBitsGemm { .. } => true,
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

/// A one-group convolution of at most 64 output positions and at least 64 output channels, or
/// of at most 256 positions and four times as many channels: its vectors run along channels (the
/// transposed form). Its input, packed at run time, is then at most a quarter of its weights,
/// and its positions fill strips of 8, not 32 (a classifier head's 1x1 from 512 to 1000 channels
/// on 13x13, whose 169 positions filled 88% of six strips of 32: 1.28 -> 1.0-1.1 ms, 1 thread).
fn few_positions(shape: &Shape) -> bool {
    matches!(*shape, Shape::Conv { group: 1, m, oh, ow, .. }
        if (oh * ow <= 64 && m >= 64) || (oh * ow <= 256 && m >= 4 * oh * ow))
}
