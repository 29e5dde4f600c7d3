#!/usr/bin/env python3
"""`make bench-ops`: kiln against onnxruntime one op at a time, on real models' shapes.

Generates single-op ONNX models (opset 18, fp32, fixed-seed weights as initializers, static input
shapes) and, for each, times kiln (`kiln bench --json`, a subprocess) and onnxruntime (in
process, CPU provider, same thread count) in turns; prints one table (latency, ratio, kiln's
GFLOP/s and share of this machine's measured fp32 peak, or GB/s for the memory-bound ops) and a
summary (geomean ratio, the worst ratios, what kiln failed on and why).

  scripts/bench_ops.py [--json OUT] [--list]    (scripts/bench-ops.sh sets up the venv and kiln)
  THREADS=2          thread count for kiln, onnxruntime and the peak probe
  ROUNDS=3           kiln and onnxruntime take turns this many times per shape; each column is the
                     median of the rounds' medians (a shared machine's load changes minute to minute)
  ITERS=             timed runs per tool per round; unset: adaptive, about 0.2 s of runs (5..200)
  WARMUP=3           untimed runs before the timed ones
  ONLY=REGEX         only the shapes whose name matches (re.search)
  KILN=PATH          the kiln binary (default: target/release/kiln in this repo)
  KILN_BENCH_CACHE   kiln's compile cache for this sweep (default: a temporary folder, removed at
                     the end): the first run of a shape compiles cold, the rounds load from it
  KILN_TIMEOUT=300   seconds before one kiln run counts as failed

The models (and their inputs, as .npy, fed to both tools) are cached in $KILN_CACHE or
~/.cache/kiln, then bench-ops/models/; they are made again when missing or when VERSION changes.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# Bump when a shape's model changes, so that cached models are made again.
VERSION = 1
OPSET = 18
REPO = Path(__file__).resolve().parent.parent
# kiln's GFLOP/s and % of peak are shown only for these; the rest are memory-bound (GB/s).
FLOP_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "GRU", "LSTM", "Attention (5 ops)", "Attention (12 ops)"}


# ---------------------------------------------------------------------------------------------
# Model building


class Graph:
    """One small graph: inputs, fixed-seed initializers, nodes."""

    def __init__(self, name):
        self.name = name
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.inputs, self.inits, self.nodes = [], [], []
        self.feeds = {}  # the input values both tools get

    def input(self, name, shape, low=None, high=None):
        if low is None:
            value = self.rng.standard_normal(shape).astype(np.float32)
        else:
            value = self.rng.integers(low, high, size=shape).astype(np.int64)
        self.feeds[name] = value
        self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(shape)))
        return name

    def weight(self, name, shape, fan_in=None):
        # Scaled like a trained layer's (values near 1 after the op), which keeps the outputs finite.
        fan_in = fan_in or int(np.prod(shape[1:])) or 1
        value = (self.rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)
        return self.const(name, value)

    def const(self, name, value):
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, name, values):
        return self.const(name, np.array(values, dtype=np.int64))

    def scalar(self, name, value):
        return self.const(name, np.array(value, dtype=np.float32))

    def node(self, op, inputs, outputs=None, **attrs):
        outputs = outputs or [f"t{len(self.nodes)}"]
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def model(self, outputs):
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-bench-ops")
        m.ir_version = 9  # opset 18 needs 8+; not the newest, for older readers
        # The outputs' static shapes, from shape inference (kiln and onnxruntime both get them).
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        del m.graph.output[:]
        m.graph.output.extend(inferred.graph.output)
        return m


class Shape:
    def __init__(self, name, op, desc, build, flops=0):
        self.name, self.op, self.desc, self.build, self.flops = name, op, desc, build, flops


SHAPES = []


def shape(name, op, desc, flops=0):
    def register(build):
        assert all(s.name != name for s in SHAPES), name
        SHAPES.append(Shape(name, op, desc, build, flops))
        return build

    return register


def conv_flops(n, cin, cout, hout, wout, kh, kw, group=1):
    return 2 * n * cout * hout * wout * (cin // group) * kh * kw


# --- GEMM ---------------------------------------------------------------------------------------


def matmul_shape(name, m, k, n, desc):
    @shape(name, "MatMul", desc, 2 * m * k * n)
    def _(g):
        return [g.node("MatMul", [g.input("x", [m, k]), g.weight("w", [k, n], fan_in=k)], ["y"])]


for _n in (64, 128, 256, 512, 1024, 2048):
    matmul_shape(f"gemm_sq_{_n}", _n, _n, _n, f"{_n}x{_n}x{_n} (MxKxN)")
for _m in (1, 4, 8):
    matmul_shape(f"gemm_m{_m}_1024", _m, 1024, 1024, f"{_m}x1024x1024")
matmul_shape("gemm_m1_k4096", 1, 4096, 1024, "1x4096x1024")
matmul_shape("gemm_tall_4096x64", 4096, 64, 64, "4096x64x64")
matmul_shape("gemm_tall_8192x256", 8192, 256, 32, "8192x256x32")
matmul_shape("gemm_kbig_4096_n16", 256, 4096, 16, "256x4096x16")


@shape("bmm_8x128x64", "MatMul", "[8,128,64]x[8,64,128]", 2 * 8 * 128 * 64 * 128)
def _(g):
    return [g.node("MatMul", [g.input("a", [8, 128, 64]), g.input("b", [8, 64, 128])], ["y"])]


@shape("attn_qkt_12x128", "MatMul", "Q[12,128,64] K^T (Transpose)", 2 * 12 * 128 * 64 * 128)
def _(g):
    kt = g.node("Transpose", [g.input("k", [12, 128, 64])], perm=[0, 2, 1])
    return [g.node("MatMul", [g.input("q", [12, 128, 64]), kt], ["y"])]


@shape("gemm_tb_64x768x3072", "Gemm", "64x768x3072 transB+bias", 2 * 64 * 768 * 3072)
def _(g):
    return [g.node("Gemm", [g.input("x", [64, 768]), g.weight("w", [3072, 768]), g.weight("b", [3072], fan_in=1)], ["y"], transB=1)]


@shape("gemm_cls_1x512x1000", "Gemm", "1x512x1000 transB+bias", 2 * 512 * 1000)
def _(g):
    return [g.node("Gemm", [g.input("x", [1, 512]), g.weight("w", [1000, 512]), g.weight("b", [1000], fan_in=1)], ["y"], transB=1)]


# --- Conv ---------------------------------------------------------------------------------------


def conv_shape(name, desc, n, cin, cout, hw, k, stride=1, pad=0, dilation=1, group=1):
    """A 2-D Conv with bias; hw and k are (h, w) pairs or one int for both, pad is [t, l, b, r] or one int."""
    h, w = (hw, hw) if isinstance(hw, int) else hw
    kh, kw = (k, k) if isinstance(k, int) else k
    pads = [pad] * 4 if isinstance(pad, int) else pad
    ho = (h + pads[0] + pads[2] - dilation * (kh - 1) - 1) // stride + 1
    wo = (w + pads[1] + pads[3] - dilation * (kw - 1) - 1) // stride + 1

    @shape(name, "Conv", desc, conv_flops(n, cin, cout, ho, wo, kh, kw, group))
    def _(g):
        x = g.input("x", [n, cin, h, w])
        wt = g.weight("w", [cout, cin // group, kh, kw])
        b = g.weight("b", [cout], fan_in=1)
        return [g.node("Conv", [x, wt, b], ["y"], kernel_shape=[kh, kw], strides=[stride, stride], pads=pads,
                       dilations=[dilation, dilation], group=group)]


conv_shape("conv1x1_64_256_56", "64->256 k1 @56x56", 1, 64, 256, 56, 1)
conv_shape("conv1x1_256_64_56", "256->64 k1 @56x56", 1, 256, 64, 56, 1)
conv_shape("conv1x1_512_2048_7", "512->2048 k1 @7x7", 1, 512, 2048, 7, 1)
conv_shape("conv3x3_64_56", "64->64 k3 @56x56", 1, 64, 64, 56, 3, pad=1)
conv_shape("conv3x3_128_28", "128->128 k3 @28x28", 1, 128, 128, 28, 3, pad=1)
conv_shape("conv3x3_256_14", "256->256 k3 @14x14", 1, 256, 256, 14, 3, pad=1)
conv_shape("conv3x3_512_7", "512->512 k3 @7x7", 1, 512, 512, 7, 3, pad=1)
conv_shape("conv3x3s2_64_128_56", "64->128 k3 s2 @56x56", 1, 64, 128, 56, 3, stride=2, pad=1)
conv_shape("conv7x7s2_stem_224", "3->64 k7 s2 @224x224", 1, 3, 64, 224, 7, stride=2, pad=3)
conv_shape("conv3x3s2_stem_224", "3->32 k3 s2 @224x224", 1, 3, 32, 224, 3, stride=2, pad=1)
conv_shape("conv5x5_32_64_32", "32->64 k5 @32x32", 1, 32, 64, 32, 5, pad=2)
conv_shape("conv5x1_256_512", "256->512 k5x1 @512x1", 1, 256, 512, (512, 1), (5, 1))
conv_shape("conv1x7_64_17", "64->64 k1x7 @17x17", 1, 64, 64, 17, (1, 7), pad=[0, 3, 0, 3])
conv_shape("conv3x3d2_256_28", "256->256 k3 dil2 @28x28", 1, 256, 256, 28, 3, pad=2, dilation=2)
conv_shape("conv3x3g32_256_28", "256->256 k3 g32 @28x28", 1, 256, 256, 28, 3, pad=1, group=32)
conv_shape("dw3x3_144_56", "dw 144 k3 @56x56", 1, 144, 144, 56, 3, pad=1, group=144)
conv_shape("dw3x3s2_96_112", "dw 96 k3 s2 @112x112", 1, 96, 96, 112, 3, stride=2, pad=1, group=96)
conv_shape("dw5x5_240_28", "dw 240 k5 @28x28", 1, 240, 240, 28, 5, pad=2, group=240)
conv_shape("dw3x3_960_7", "dw 960 k3 @7x7", 1, 960, 960, 7, 3, pad=1, group=960)
conv_shape("dw3x3s2_576_14", "dw 576 k3 s2 @14x14", 1, 576, 576, 14, 3, stride=2, pad=1, group=576)
conv_shape("dw5x5s2_240_28", "dw 240 k5 s2 @28x28", 1, 240, 240, 28, 5, stride=2, pad=2, group=240)
conv_shape("conv3x3_3_16_512", "3->16 k3 @512x512", 1, 3, 16, 512, 3, pad=1)
conv_shape("conv3x3_1024_4", "1024->1024 k3 @4x4", 1, 1024, 1024, 4, 3, pad=1)
conv_shape("conv3x3_b8_64_32", "b8 64->64 k3 @32x32", 8, 64, 64, 32, 3, pad=1)


@shape("conv1d_64_128_1024", "Conv", "1-D 64->128 k3 @1024", 2 * 128 * 1024 * 64 * 3)
def _(g):
    x = g.input("x", [1, 64, 1024])
    return [g.node("Conv", [x, g.weight("w", [128, 64, 3]), g.weight("b", [128], fan_in=1)], ["y"], kernel_shape=[3], pads=[1, 1])]


# ConvTranspose's weight is [Cin, Cout/group, kh, kw]; each input pixel scatters Cout*kh*kw MACs per input channel.
@shape("convT2x2s2_256_128_28", "ConvTranspose", "256->128 k2 s2 28->56", 2 * 256 * 28 * 28 * 128 * 2 * 2)
def _(g):
    x = g.input("x", [1, 256, 28, 28])
    return [g.node("ConvTranspose", [x, g.weight("w", [256, 128, 2, 2]), g.weight("b", [128], fan_in=1)], ["y"],
                   kernel_shape=[2, 2], strides=[2, 2])]


@shape("convT3x3s2_64_32_56", "ConvTranspose", "64->32 k3 s2 op1 56->112", 2 * 64 * 56 * 56 * 32 * 3 * 3)
def _(g):
    x = g.input("x", [1, 64, 56, 56])
    return [g.node("ConvTranspose", [x, g.weight("w", [64, 32, 3, 3]), g.weight("b", [32], fan_in=1)], ["y"],
                   kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])]


# --- Pooling ------------------------------------------------------------------------------------


@shape("maxpool3x3s2_64_112", "MaxPool", "[1,64,112,112] k3 s2 p1")
def _(g):
    return [g.node("MaxPool", [g.input("x", [1, 64, 112, 112])], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]


@shape("avgpool2x2s2_256_56", "AveragePool", "[1,256,56,56] k2 s2")
def _(g):
    return [g.node("AveragePool", [g.input("x", [1, 256, 56, 56])], ["y"], kernel_shape=[2, 2], strides=[2, 2])]


for _c in (2048, 1280):
    @shape(f"gap_{_c}_7", "GlobalAveragePool", f"[1,{_c},7,7]")
    def _(g, c=_c):
        return [g.node("GlobalAveragePool", [g.input("x", [1, c, 7, 7])], ["y"])]


# --- Reductions (opset 18: axes are an input) ---------------------------------------------------


def reduce_shape(name, op, dims, axis):
    @shape(name, op, f"[{','.join(map(str, dims))}] axis {axis}")
    def _(g):
        return [g.node(op, [g.input("x", dims), g.ints("axes", [axis])], ["y"], keepdims=1)]


reduce_shape("rmean_64x128", "ReduceMean", [64, 128], -1)
reduce_shape("rmean_512x4096", "ReduceMean", [512, 4096], -1)
reduce_shape("rsum_32x1024x64_ax1", "ReduceSum", [32, 1024, 64], 1)
reduce_shape("rmax_1024x1000", "ReduceMax", [1024, 1000], -1)


# --- Softmax ------------------------------------------------------------------------------------


for _name, _dims in (("softmax_12x128x128", [12, 128, 128]), ("softmax_8x4096", [8, 4096]), ("softmax_1x1000", [1, 1000])):
    @shape(_name, "Softmax", f"[{','.join(map(str, _dims))}] axis -1")
    def _(g, dims=_dims):
        return [g.node("Softmax", [g.input("x", dims)], ["y"], axis=-1)]


# --- Attention, as exporters write it ------------------------------------------------------------


@shape("attn_bert_12x128x64", "Attention (5 ops)", "[1,12,128,64] heads, K^T, /8, + [1,1,1,128] mask", 2 * 12 * 128 * 128 * 128)
def _(g):
    # BERT's legacy export: MatMul(Q, Transpose(K)) / sqrt(d) + padding mask, Softmax, MatMul V.
    q, k, v = (g.input(n, [1, 12, 128, 64]) for n in ("q", "k", "v"))
    kt = g.node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = g.node("Add", [g.node("Div", [g.node("MatMul", [q, kt]), g.scalar("sqrt_d", 8.0)]), g.input("mask", [1, 1, 1, 128])])
    return [g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v], ["y"])]


@shape("attn_gpt_512_8x64", "Attention (12 ops)", "qkv [1,512,1536] split into 8 heads of 64, causal", 2 * 8 * 512 * 512 * 128)
def _(g):
    # GPT's export: one projection split in three, heads moved out by Reshape + Transpose and
    # back, a causal mask of -inf.
    parts = ["q3", "k3", "v3"]
    g.node("Split", [g.input("qkv", [1, 512, 1536]), g.ints("sizes", [512, 512, 512])], parts, axis=-1)
    heads = g.ints("heads", [1, 512, 8, 64])
    q, k, v = (g.node("Transpose", [g.node("Reshape", [p, heads])], perm=perm) for p, perm in zip(parts, ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])))
    mask = g.const("causal", np.triu(np.full((512, 512), -np.inf, dtype=np.float32), 1))
    scores = g.node("Add", [g.node("Div", [g.node("MatMul", [q, k]), g.scalar("sqrt_d", 8.0)]), mask])
    y = g.node("Transpose", [g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    return [g.node("Reshape", [y, g.ints("hidden", [1, 512, 512])], ["y"])]


# --- LayerNorm ----------------------------------------------------------------------------------


for _name, _dims in (("ln_128x768", [128, 768]), ("ln_16x4096", [16, 4096])):
    @shape(_name, "LayerNormalization", f"[{_dims[0]},{_dims[1]}] axis -1")
    def _(g, dims=_dims):
        scale = g.const("scale", 1 + 0.1 * g.rng.standard_normal(dims[-1]).astype(np.float32))
        bias = g.const("bias", 0.1 * g.rng.standard_normal(dims[-1]).astype(np.float32))
        return [g.node("LayerNormalization", [g.input("x", dims), scale, bias], ["y"], axis=-1, epsilon=1e-5)]


@shape("ln_decomp_128x768", "LayerNorm (9 ops)", "[128,768] tf2onnx form")
def _(g):
    x = g.input("x", [128, 768])
    axes = g.ints("axes", [-1])
    mean = g.node("ReduceMean", [x, axes], keepdims=1)
    d = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Pow", [d, g.scalar("two", 2.0)]), axes], keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [var, g.scalar("eps", 1e-5)])])
    n = g.node("Div", [d, std])
    scale = g.const("scale", 1 + 0.1 * g.rng.standard_normal(768).astype(np.float32))
    bias = g.const("bias", 0.1 * g.rng.standard_normal(768).astype(np.float32))
    return [g.node("Add", [g.node("Mul", [n, scale]), bias], ["y"])]


# --- Elementwise, with broadcasting -------------------------------------------------------------


@shape("add_bcast_64_56", "Add", "[1,64,56,56]+[1,64,1,1]")
def _(g):
    return [g.node("Add", [g.input("x", [1, 64, 56, 56]), g.weight("b", [1, 64, 1, 1], fan_in=1)], ["y"])]


@shape("mul_bcast_128x768", "Mul", "[128,768]*[768]")
def _(g):
    return [g.node("Mul", [g.input("x", [128, 768]), g.weight("s", [768], fan_in=1)], ["y"])]


@shape("silu_256_56", "Sigmoid+Mul", "[1,256,56,56]")
def _(g):
    x = g.input("x", [1, 256, 56, 56])
    return [g.node("Mul", [x, g.node("Sigmoid", [x])], ["y"])]


@shape("relu_512_28", "Relu", "[1,512,28,28]")
def _(g):
    return [g.node("Relu", [g.input("x", [1, 512, 28, 28])], ["y"])]


@shape("gelu_erf_128x3072", "Gelu (5 ops, erf)", "[128,3072]")
def _(g):
    # PyTorch's export: x * 0.5 * (1 + erf(x / sqrt(2))) as Div, Erf, Add, Mul, Mul.
    x = g.input("x", [128, 3072])
    e = g.node("Erf", [g.node("Div", [x, g.scalar("sqrt2", math.sqrt(2.0))])])
    return [g.node("Mul", [g.node("Mul", [x, g.node("Add", [e, g.scalar("one", 1.0)])]), g.scalar("half", 0.5)], ["y"])]


# --- Data movement ------------------------------------------------------------------------------


@shape("transpose_nhwc_64_56", "Transpose", "[1,64,56,56] perm 0,2,3,1")
def _(g):
    return [g.node("Transpose", [g.input("x", [1, 64, 56, 56])], ["y"], perm=[0, 2, 3, 1])]


@shape("transpose_12x128x64", "Transpose", "[12,128,64] perm 1,0,2")
def _(g):
    return [g.node("Transpose", [g.input("x", [12, 128, 64])], ["y"], perm=[1, 0, 2])]


@shape("gather_emb_30522x768", "Gather", "[30522,768] table, [1,128] ids")
def _(g):
    table = g.const("table", (0.02 * g.rng.standard_normal((30522, 768))).astype(np.float32))
    return [g.node("Gather", [table, g.input("ids", [1, 128], 0, 30522)], ["y"], axis=0)]


@shape("slice_ch_256x512", "Slice", "[1,256,512,1] ch 0:128")
def _(g):
    x = g.input("x", [1, 256, 512, 1])
    return [g.node("Slice", [x, g.ints("starts", [0]), g.ints("ends", [128]), g.ints("axes", [1])], ["y"])]


@shape("slice_hw_64_112", "Slice", "[1,64,112,112] [:,:,1:-1,1:-1]")
def _(g):
    x = g.input("x", [1, 64, 112, 112])
    return [g.node("Slice", [x, g.ints("starts", [1, 1]), g.ints("ends", [-1, -1]), g.ints("axes", [2, 3])], ["y"])]


@shape("concat_4x64_28", "Concat", "4x [1,64,28,28] axis 1")
def _(g):
    return [g.node("Concat", [g.input(f"x{i}", [1, 64, 28, 28]) for i in range(4)], ["y"], axis=1)]


@shape("split_qkv_128x2304", "Split", "[1,128,2304] last axis in 3")
def _(g):
    g.node("Split", [g.input("x", [1, 128, 2304]), g.ints("sizes", [768, 768, 768])], ["q", "k", "v"], axis=-1)
    return ["q", "k", "v"]


@shape("split_ch_128_80", "Split", "[1,128,80,80] channels in 2")
def _(g):
    g.node("Split", [g.input("x", [1, 128, 80, 80]), g.ints("sizes", [64, 64])], ["a", "b"], axis=1)
    return ["a", "b"]


@shape("pad_64_56", "Pad", "[1,64,56,56] 1 around H,W")
def _(g):
    return [g.node("Pad", [g.input("x", [1, 64, 56, 56]), g.ints("pads", [0, 0, 1, 1, 0, 0, 1, 1])], ["y"], mode="constant")]


# --- Recurrent ----------------------------------------------------------------------------------


def rnn_shape(op, seq, hidden=256, inp=128, batch=1):
    gates = 3 if op == "GRU" else 4

    @shape(f"{op.lower()}_h{hidden}_s{seq}", op, f"in {inp}, hidden {hidden}, seq {seq}", 2 * seq * batch * gates * hidden * (inp + hidden))
    def _(g):
        x = g.input("x", [seq, batch, inp])
        w = g.weight("W", [1, gates * hidden, inp])
        r = g.weight("R", [1, gates * hidden, hidden])
        b = g.weight("B", [1, 2 * gates * hidden], fan_in=hidden)
        extra = {"linear_before_reset": 1} if op == "GRU" else {}
        return [g.node(op, [x, w, r, b], ["y"], hidden_size=hidden, **extra)]


for _seq in (16, 1):
    rnn_shape("GRU", _seq)
    rnn_shape("LSTM", _seq)


# ---------------------------------------------------------------------------------------------
# Generation and the cache


def models_dir():
    cache = os.environ.get("KILN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    return Path(cache) / "bench-ops" / "models"


def input_files(folder, s, names):
    return {n: folder / f"{s.name}.{n}.npy" for n in names}


def ort_session(model, threads):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def generate(s, folder):
    """Makes the model and its inputs (unless cached); returns (model path, {input: .npy path})."""
    path = folder / f"{s.name}.onnx"
    meta = folder / f"{s.name}.inputs"  # the input names, one a line
    if path.exists() and meta.exists():
        files = input_files(folder, s, meta.read_text().split())
        if all(f.exists() for f in files.values()):
            return path, files
    g = Graph(s.name)
    model = g.model(s.build(g))
    onnx.checker.check_model(model, full_check=True)
    # It must run in onnxruntime before it is kept, so that a failure is kiln's, not the model's.
    sess = ort_session(model.SerializeToString(), 1)
    outs = sess.run(None, g.feeds)
    if not all(np.isfinite(o).all() for o in outs):
        raise RuntimeError(f"{s.name}: onnxruntime's outputs are not finite")
    files = input_files(folder, s, g.feeds)
    for n, v in g.feeds.items():
        np.save(files[n], v)
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(model, tmp)
    os.replace(tmp, path)
    meta.write_text("\n".join(g.feeds) + "\n")
    return path, files


def prepare_cache(folder):
    stamp = folder / "VERSION"
    if folder.exists() and (not stamp.exists() or stamp.read_text().strip() != str(VERSION)):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{VERSION}\n")


# ---------------------------------------------------------------------------------------------
# Timing


# Seconds to wait after onnxruntime's runs before kiln's (see sweep()); 10 ms was enough here.
ORT_QUIET_S = 0.1


def adaptive_iters(one_run_s, fixed):
    if fixed:
        return fixed
    return max(5, min(200, int(0.2 / max(one_run_s, 1e-6))))


def kiln_run(kiln, model, files, threads, iters, warmup, cache, timeout):
    """One `kiln bench`: ({median_ms, compile_ms, ...}, None) or (None, the reason it failed)."""
    cmd = [kiln, "bench", str(model), "--device", "cpu", "--threads", str(threads), "--iters", str(iters),
           "--warmup", str(warmup), "--json", "--quiet"]
    for n, f in files.items():
        cmd += ["--input", f"{n}={f}"]
    env = dict(os.environ, KILN_CACHE=cache)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    lines = [line.strip() for line in p.stderr.splitlines() if line.strip()]
    reason = lines[0] if lines else ""
    # A panic's message is on the line after "thread 'main' panicked at FILE:".
    if reason.startswith("thread '") and "panicked" in reason and len(lines) > 1:
        reason = f"{reason} {lines[1]}"
    if p.returncode != 0:
        if p.returncode < 0:
            sig = signal.Signals(-p.returncode).name
            reason = f"killed by {sig}" + (f": {reason}" if reason else "")
        return None, reason or f"exit status {p.returncode}"
    out = p.stdout.strip().splitlines()
    try:
        d = json.loads(out[-1])
        float(d["median_ms"]), float(d["compile_ms"])
        return d, None
    except (IndexError, ValueError, KeyError, TypeError):
        return None, reason or f"no JSON line in its output: {(out[-1] if out else '')[:80]!r}"


def ort_time(sess, feeds, iters, warmup):
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# The fp32 peak probe runs apart: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, where the environment sets
# them, pick slower kernels than this CPU's, and the thread count must be the bench's.
PROBE = r"""
import json, sys, time
import numpy as np
n = 2048
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
a @ b
best = float("inf")
for _ in range(8):
    t0 = time.perf_counter()
    a @ b
    best = min(best, time.perf_counter() - t0)
blas = ""
try:
    from threadpoolctl import threadpool_info
    blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')} x{i.get('num_threads')}"
                     for i in threadpool_info() if i.get("user_api") == "blas")
except Exception:
    try:
        d = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{d.get('name')} {d.get('version')}"
    except Exception:
        pass
print(json.dumps({"gflops": 2 * n**3 / best / 1e9, "blas": blas.strip()}))
"""


def numpy_peak(threads):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    try:
        p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
        d = json.loads(p.stdout.strip().splitlines()[-1])
        return d["gflops"], d["blas"]
    except Exception as e:  # the peak is then onnxruntime's alone
        return 0.0, f"(numpy probe failed: {e})"


def ort_peak(threads):
    n = 2048
    g = Graph("peak")
    model = g.model([g.node("MatMul", [g.input("a", [n, n]), g.input("b", [n, n])], ["y"])])
    sess = ort_session(model.SerializeToString(), threads)
    sess.run(None, g.feeds)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        sess.run(None, g.feeds)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


# ---------------------------------------------------------------------------------------------
# Report


def say(msg):
    print(f"bench-ops: {msg}", file=sys.stderr, flush=True)


def loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


COLS = "{:<22} {:<19} {:<31} {:>10} {:>10} {:>7} {:>15} {:>6}"


def fmt_ms(v):
    return "-" if v is None else (f"{v:.4f}" if v < 0.1 else f"{v:.3f}")


def row(r, peak):
    kiln, o = r["kiln_ms"], r["ort_ms"]
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
    rate, pct = "-", "-"
    if kiln is not None:
        if r["op"] in FLOP_OPS and r["flops"]:
            gf = r["flops"] / (kiln * 1e-3) / 1e9
            rate = f"{gf:.1f} GFLOP/s"
            pct = f"{100 * gf / peak:.0f}%" if peak else "-"
        elif r["bytes"]:
            rate = f"{r['bytes'] / (kiln * 1e-3) / 1e9:.1f} GB/s"
    kiln_s = "FAIL" if r["kiln_error"] else fmt_ms(kiln)
    ort_s = "FAIL" if r["ort_error"] else fmt_ms(o)
    return COLS.format(r["name"][:22], r["op"][:19], r["desc"][:31], kiln_s, ort_s, ratio, rate, pct)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--json", metavar="OUT", help="also write every result to this JSON file")
    ap.add_argument("--list", action="store_true", help="list the shapes (after ONLY) and stop")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", 2)))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 3)))
    ap.add_argument("--iters", type=int, default=int(os.environ.get("ITERS") or 0), help="0: adaptive")
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("WARMUP", 3)))
    ap.add_argument("--only", default=os.environ.get("ONLY", ""), help="a regex on the shapes' names")
    ap.add_argument("--kiln", default=os.environ.get("KILN", str(REPO / "target" / "release" / "kiln")))
    args = ap.parse_args()

    shapes = [s for s in SHAPES if re.search(args.only, s.name)]
    if args.list:
        for s in shapes:
            print(f"{s.name:<22} {s.op:<19} {s.desc}")
        print(f"{len(shapes)} of {len(SHAPES)} shapes")
        return 0
    if not shapes:
        print(f"bench-ops: no shape matches ONLY={args.only!r} (see --list)", file=sys.stderr)
        return 1
    kiln = os.path.abspath(args.kiln)
    if not os.access(kiln, os.X_OK):
        print(f"bench-ops: no kiln binary at {kiln} (build it, or set KILN=PATH)", file=sys.stderr)
        return 1
    timeout = float(os.environ.get("KILN_TIMEOUT", 300))
    cache = os.environ.get("KILN_BENCH_CACHE")
    own_cache = not cache
    if own_cache:
        cache = tempfile.mkdtemp(prefix="kiln-bench-ops-cache.")
    try:
        return sweep(args, shapes, kiln, cache, timeout)
    finally:
        if own_cache:
            shutil.rmtree(cache, ignore_errors=True)


def sweep(args, shapes, kiln, cache, timeout):
    T = args.threads
    folder = models_dir()
    prepare_cache(folder)
    # The peak is probed before and after the sweep and the best kept: on a shared machine one
    # probe can land on a busy moment. The table waits for it; progress goes to stderr meanwhile.
    load_start = loadavg()
    np_gf, blas = numpy_peak(T)
    ort_gf = ort_peak(T)
    say(f"{len(shapes)} shapes, threads {T}; peak probe: numpy {np_gf:.1f}, onnxruntime {ort_gf:.1f} GFLOP/s")

    results = []
    for i, s in enumerate(shapes, 1):
        r = {"name": s.name, "op": s.op, "desc": s.desc, "flops": s.flops, "bytes": 0, "kiln_ms": None, "ort_ms": None,
             "ratio": None, "kiln_rounds": [], "ort_rounds": [], "kiln_iters": None, "ort_iters": None,
             "kiln_compile_ms_cold": None, "kiln_compile_ms_cached": None, "kiln_error": None, "ort_error": None}
        results.append(r)
        try:
            model, files = generate(s, folder)
        except Exception as e:
            r["kiln_error"] = r["ort_error"] = f"could not make the model: {e}"
            say(f"[{i}/{len(shapes)}] {s.name}: {r['kiln_error']}")
            continue
        feeds = {n: np.load(f) for n, f in files.items()}

        # First runs of each: kiln's compiles cold (into the throwaway cache); one timed run of
        # each sets the adaptive iteration counts.
        d, err = kiln_run(kiln, model, files, T, 1, 1, cache, timeout)
        if err:
            r["kiln_error"] = err
        else:
            r["kiln_compile_ms_cold"] = d["compile_ms"]
            r["kiln_iters"] = adaptive_iters(d["median_ms"] * 1e-3, args.iters)
        sess = None
        try:
            sess = ort_session(str(model), T)
            outs = sess.run(None, feeds)
            r["bytes"] = sum(v.nbytes for v in feeds.values()) + sum(o.nbytes for o in outs)
            t0 = time.perf_counter()
            sess.run(None, feeds)
            r["ort_iters"] = adaptive_iters(time.perf_counter() - t0, args.iters)
        except Exception as e:
            r["ort_error"] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

        cached = []
        for _ in range(args.rounds):
            # onnxruntime's pool threads spin on after its runs (allow_spinning, its default):
            # a kiln run started at once shares the 2 cores with them and timed 1.8-2x slow
            # (conv 1x7: 0.26 ms against 0.15 ms alone). Let them go to sleep first.
            time.sleep(ORT_QUIET_S)
            if not r["kiln_error"]:
                d, err = kiln_run(kiln, model, files, T, r["kiln_iters"], args.warmup, cache, timeout)
                if err:
                    r["kiln_error"] = err
                else:
                    r["kiln_rounds"].append(d["median_ms"])
                    cached.append(d["compile_ms"])
            if sess is not None and not r["ort_error"]:
                r["ort_rounds"].append(ort_time(sess, feeds, r["ort_iters"], args.warmup))
        del sess
        if r["kiln_rounds"] and not r["kiln_error"]:
            r["kiln_ms"] = statistics.median(r["kiln_rounds"])
            r["kiln_compile_ms_cached"] = statistics.median(cached)
        if r["ort_rounds"]:
            r["ort_ms"] = statistics.median(r["ort_rounds"])
        if r["kiln_ms"] and r["ort_ms"]:
            r["ratio"] = r["kiln_ms"] / r["ort_ms"]
        say(f"[{i}/{len(shapes)}] {s.name}: kiln {r['kiln_error'] or fmt_ms(r['kiln_ms'])}, "
            f"onnxruntime {r['ort_error'] or fmt_ms(r['ort_ms'])}")

    np_gf2, _ = numpy_peak(T)
    ort_gf2 = ort_peak(T)
    np_gf, ort_gf = max(np_gf, np_gf2), max(ort_gf, ort_gf2)
    peak = max(np_gf, ort_gf)
    iters = f"{args.iters}" if args.iters else "adaptive (~0.2 s a tool a round, 5..200)"
    print(f"bench-ops: threads {T}, rounds {args.rounds}, iters {iters}, warmup {args.warmup}, "
          f"load average {load_start} (start) {loadavg()} (end), measured peak {peak:.1f} GFLOP/s fp32 "
          f"(best of before and after: numpy sgemm 2048 {np_gf:.1f} [{blas or 'BLAS unknown'}], "
          f"onnxruntime {ort.__version__} MatMul 2048 {ort_gf:.1f})")
    print(COLS.format("name", "op", "shape", "kiln ms", "ORT ms", "ratio", "kiln rate", "%peak"))
    for r in results:
        print(row(r, peak))

    # Summary.
    both = [r for r in results if r["ratio"] is not None]
    print()
    print("ratio: kiln ms / ORT ms (median over rounds of each round's median); kiln rate: GFLOP/s (2 x MACs) "
          "for MatMul/Gemm/Conv/ConvTranspose/GRU/LSTM/Attention (a causal one counted whole), else GB/s of the graph's inputs + outputs; %peak: of the measured peak")
    summary = {"shapes": len(results), "both_ran": len(both)}
    if both:
        geo = math.exp(sum(math.log(r["ratio"]) for r in both) / len(both))
        worst = sorted(both, key=lambda r: r["ratio"], reverse=True)[:5]
        slow = [r for r in both if r["ratio"] > 2]
        summary.update(geomean_ratio=geo, worst=[(r["name"], r["ratio"]) for r in worst], slower_than_2x=len(slow))
        print(f"geomean ratio over the {len(both)} shapes both ran: {geo:.2f}x")
        print("worst 5: " + ", ".join(f"{r['name']} {r['ratio']:.2f}x" for r in worst))
        print(f"slower than 2x: {len(slow)} of {len(both)}")
    kfail = [r for r in results if r["kiln_error"]]
    ofail = [r for r in results if r["ort_error"]]
    summary["kiln_failed"] = {r["name"]: r["kiln_error"] for r in kfail}
    summary["ort_failed"] = {r["name"]: r["ort_error"] for r in ofail}
    print(f"kiln failed on {len(kfail)}" + (":" if kfail else ""))
    for r in kfail:
        print(f"  {r['name']}: {r['kiln_error']}")
    if ofail:
        print(f"onnxruntime failed on {len(ofail)}:")
        for r in ofail:
            print(f"  {r['name']}: {r['ort_error']}")

    if args.json:
        header = {"threads": T, "rounds": args.rounds, "iters": args.iters or "adaptive", "warmup": args.warmup,
                  "measured_peak_gflops": peak, "numpy_sgemm_gflops": np_gf, "blas": blas, "ort_matmul_gflops": ort_gf,
                  "onnxruntime": ort.__version__, "kiln": kiln, "version": VERSION}
        with open(args.json, "w") as f:
            json.dump({"header": header, "results": results, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
