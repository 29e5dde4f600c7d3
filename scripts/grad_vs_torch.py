#!/usr/bin/env python3
"""kiln's gradient rules against PyTorch's autograd on the same graph (issue 37, item 1).

    grad_vs_torch.py [--kiln PATH] [--device cpu[,ref]] [--only SUBSTRING] [--keep DIR]
                     [--markdown]

Each case is a small ONNX model written with onnx.helper: an op (a few in a chain where the
op needs it), the loss y = sum_i ReduceSum(result_i * R_i) with fixed random tensors R_i, and a
training-domain `Gradient(xs=[...], y="loss")` node over its float inputs (and weights given
as initializers, in some cases), which kiln differentiates at import with its own rules
(`kiln_ir::grad::append_backward`). The model runs with `kiln run` (`--device cpu`: compiled
native code) on seeded random inputs, once in float64 and once in float32; `--device ref` runs
the same models on kiln's reference interpreter through `kiln check` (which reports pass or
fail at the same tolerances, not the differences). PyTorch computes the same forward pass,
written per case with torch.nn.functional in float64 on the same inputs (float32-representable
values, so both of kiln's runs read exactly these; float attributes rounded to float32 as ONNX
stores them), and takes the gradients with `torch.autograd.grad`. Each of kiln's outputs (the
loss and every gradient) is compared element by element with PyTorch's:
|kiln - torch| <= atol + rtol * |torch|, at rtol 1e-9 / atol 1e-12 for kiln's float64 run and
rtol 1e-4 / atol 1e-5 for its float32 run.

Each translation is itself checked: PyTorch's forward results against onnx.reference's (ONNX's
own reference implementation) on the same model, where onnx.reference can run it. A case of an op
outside the rule table can be marked `gap` (none is now): kiln's typed refusal of it is then
"not taken", not a failure, so a rule added later is checked without editing the case.

Prints a table (case, the element type of kiln's run, the largest absolute and relative
difference over the case's outputs, pass/fail per device, the translation's difference from
onnx.reference, the first element out of tolerance or kiln's error) and exits with 1 when any
case fails. Random inputs keep away from the points where a derivative is not defined (Relu
at 0, MaxPool and Max/Min ties, Clip's bounds, Abs at 0).

`make grad-vs-torch` runs it with the train venv (scripts/setup-train.sh: torch, onnx, numpy).
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zlib

import numpy as np

# PyTorch's PyPI build is a CUDA one; the check runs on the CPU, whatever the driver says.
warnings.filterwarnings("ignore", message="CUDA initialization")

import onnx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

TRAINING = "ai.onnx.preview.training"
TOL = {"f64": (1e-9, 1e-12), "f32": (1e-4, 1e-5)}
ONNX_DTYPE = {"f64": TensorProto.DOUBLE, "f32": TensorProto.FLOAT}
NP_DTYPE = {"f64": np.float64, "f32": np.float32}


# ---------------------------------------------------------------------------------------------
# Inputs


class Gen:
    """Seeded random inputs, each float one representable in float32 exactly."""

    def __init__(self, name):
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))

    def f(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32).astype(np.float64)

    def pos(self, *shape, lo=0.5, hi=2.0):
        return self.rng.uniform(lo, hi, shape).astype(np.float32).astype(np.float64)

    def away(self, *shape):
        """Either sign, magnitude in [0.5, 2]: away from 0 (Div, Reciprocal, Abs)."""
        sign = np.where(self.rng.random(shape) < 0.5, -1.0, 1.0)
        return sign * self.pos(*shape)

    def ints(self, lo, hi, *shape):
        return self.rng.integers(lo, hi, shape).astype(np.int64)


def A(v):
    """A float attribute as ONNX stores it (float32), for PyTorch's float64 forward pass."""
    return float(np.float32(v))


def i64(*v):
    return np.array(v, dtype=np.int64)


class Case:
    """One model: `nodes` make the values `outs` from the differentiated `xs` (graph inputs,
    or initializers for the names in `x_inits`) and the fixed `consts` (initializers: integer
    tensors as given, float ones in the run's element type); `torch_fn(t)` computes the same
    results from a dict of torch tensors (xs with requires_grad, consts)."""

    def __init__(self, name, nodes, xs, outs, torch_fn, consts=None, x_inits=(), opset=17,
                 pre=None, gap=None, onnx_ref=None):
        self.name, self.nodes, self.xs, self.outs = name, nodes, xs, outs
        self.torch_fn, self.consts, self.x_inits = torch_fn, consts or {}, set(x_inits)
        self.opset = opset
        # gap: why kiln may refuse the case (an op outside docs/training.md's rule table); a
        # refusal is then reported as "not taken", not a failure, and a run is compared as usual.
        self.gap = gap
        # onnx_ref: why onnx.reference cannot check the translation (None: it can).
        self.onnx_ref = onnx_ref
        # pre(kiln, work) -> more tensors for torch_fn only, taken from a kiln run (Dropout's
        # mask: kiln's own counter-based hash, which PyTorch cannot draw).
        self.pre, self.extra = pre, {}


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


# ---------------------------------------------------------------------------------------------
# The cases. Each function returns a list of Cases; torch functions read the tensors by name.


def unary_cases():
    g = Gen("unary")
    x = g.f(2, 3, 4)
    xp = g.pos(2, 3, 4)
    xa = g.away(2, 3, 4)
    specs = [
        ("Relu", x, {}, lambda t: F.relu(t["x"])),
        ("LeakyRelu", x, {"alpha": 0.1}, lambda t: F.leaky_relu(t["x"], A(0.1))),
        ("Sigmoid", x, {}, lambda t: torch.sigmoid(t["x"])),
        ("Tanh", x, {}, lambda t: torch.tanh(t["x"])),
        ("Erf", x, {}, lambda t: torch.erf(t["x"])),
        ("Neg", x, {}, lambda t: -t["x"]),
        ("Exp", x, {}, lambda t: torch.exp(t["x"])),
        ("Sqrt", xp, {}, lambda t: torch.sqrt(t["x"])),
        ("Log", xp, {}, lambda t: torch.log(t["x"])),
        ("Reciprocal", xa, {}, lambda t: torch.reciprocal(t["x"])),
        ("Abs", xa, {}, lambda t: torch.abs(t["x"])),
        ("Identity", x, {}, lambda t: t["x"]),
    ]
    cases = [Case(op, [node(op, ["x"], ["y"], **a)], {"x": v}, ["y"], fn)
             for op, v, a, fn in specs]
    cases.append(Case("Gelu", [node("Gelu", ["x"], ["y"])], {"x": x}, ["y"],
                      lambda t: F.gelu(t["x"]), opset=20))
    cases.append(Case("Gelu tanh", [node("Gelu", ["x"], ["y"], approximate="tanh")], {"x": x},
                      ["y"], lambda t: F.gelu(t["x"], approximate="tanh"), opset=20))
    # Cast float to float: to the other float width and back.
    cases.append(Case(
        "Cast f->f16->f", [node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                           node("Cast", ["h"], ["y"], to=TensorProto.DOUBLE)],
        {"x": x}, ["y"], lambda t: t["x"].half().double()))
    return cases


def binary_cases():
    g = Gen("binary")
    cases = []
    a, b = g.f(2, 3, 4), g.f(3, 1)
    for op, sym, fn in [("Add", "+", torch.add), ("Sub", "-", torch.sub),
                        ("Mul", "*", torch.mul)]:
        cases.append(Case(f"{op} [2,3,4]{sym}[3,1]", [node(op, ["a", "b"], ["y"])],
                          {"a": a, "b": b}, ["y"], lambda t, fn=fn: fn(t["a"], t["b"])))
    a2, b2 = g.f(4, 1, 3), g.f(1, 5, 1)
    cases.append(Case("Add [4,1,3]+[1,5,1]", [node("Add", ["a", "b"], ["y"])],
                      {"a": a2, "b": b2}, ["y"], lambda t: t["a"] + t["b"]))
    cases.append(Case("Div [2,3,4]/[3,1]", [node("Div", ["a", "b"], ["y"])],
                      {"a": a, "b": g.away(3, 1)}, ["y"], lambda t: t["a"] / t["b"]))
    cases.append(Case("Div [4]/[2,3,4]", [node("Div", ["a", "b"], ["y"])],
                      {"a": g.f(4), "b": g.away(2, 3, 4)}, ["y"], lambda t: t["a"] / t["b"]))
    cases.append(Case("Pow x^y (x>0) [2,3]^[3]", [node("Pow", ["a", "b"], ["y"])],
                      {"a": g.pos(2, 3), "b": g.f(3)}, ["y"], lambda t: t["a"] ** t["b"]))
    cases.append(Case("Pow x^3 (constant)", [node("Pow", ["a", "e"], ["y"])],
                      {"a": g.f(2, 3)}, ["y"], lambda t: t["a"] ** t["e"],
                      consts={"e": np.array(3.0)}))
    cases.append(Case("Pow x^-0.5 (constant)", [node("Pow", ["a", "e"], ["y"])],
                      {"a": g.pos(2, 3)}, ["y"], lambda t: t["a"] ** t["e"],
                      consts={"e": np.array(-0.5)}))
    cond = g.rng.random((3, 4)) < 0.5
    cases.append(Case("Where [3,4]?[2,3,4]:[4]", [node("Where", ["c", "a", "b"], ["y"])],
                      {"a": g.f(2, 3, 4), "b": g.f(4)}, ["y"],
                      lambda t: torch.where(t["c"], t["a"], t["b"]), consts={"c": cond}))
    cond3 = g.rng.random((2, 3, 4)) < 0.5
    cases.append(Case("Where [2,3,4]?[4]:[3,1] (both operands broadcast)",
                      [node("Where", ["c", "a", "b"], ["y"])],
                      {"a": g.f(4), "b": g.f(3, 1)}, ["y"],
                      lambda t: torch.where(t["c"], t["a"], t["b"]), consts={"c": cond3}))
    cases.append(Case("Clip [-0.5, 0.7]", [node("Clip", ["x", "lo", "hi"], ["y"])],
                      {"x": g.f(3, 5)}, ["y"], lambda t: torch.clamp(t["x"], -0.5, 0.7),
                      consts={"lo": np.array(-0.5), "hi": np.array(0.7)}))
    cases.append(Case("Clip min only", [node("Clip", ["x", "lo"], ["y"])],
                      {"x": g.f(3, 5)}, ["y"], lambda t: torch.clamp(t["x"], min=0.2),
                      consts={"lo": np.array(0.2)}))
    for op, fn in [("Max", torch.maximum), ("Min", torch.minimum)]:
        cases.append(Case(f"{op} of 3, broadcast", [node(op, ["a", "b", "c"], ["y"])],
                          {"a": g.f(2, 3), "b": g.f(3), "c": g.f(2, 1)}, ["y"],
                          lambda t, fn=fn: fn(fn(t["a"], t["b"]), t["c"])))
    # A value used several times: its gradients summed.
    cases.append(Case(
        "reuse: x*x + exp(x)*w - x",
        [node("Mul", ["x", "x"], ["xx"]), node("Exp", ["x"], ["e"]),
         node("Mul", ["e", "w"], ["ew"]), node("Add", ["xx", "ew"], ["s"]),
         node("Sub", ["s", "x"], ["y"])],
        {"x": g.f(3, 4), "w": g.f(4)}, ["y"],
        lambda t: t["x"] * t["x"] + torch.exp(t["x"]) * t["w"] - t["x"]))
    return cases


def contraction_cases():
    g = Gen("contraction")
    cases = []
    mm = [("MatMul [3,4]@[4,5]", (3, 4), (4, 5)),
          ("MatMul [2,1,3,4]@[5,4,2] batched", (2, 1, 3, 4), (5, 4, 2)),
          ("MatMul [4]@[2,4,3] 1-D left", (4,), (2, 4, 3)),
          ("MatMul [2,3,4]@[4] 1-D right", (2, 3, 4), (4,)),
          ("MatMul [4]@[4] 1-D both", (4,), (4,)),
          ("MatMul [3,4]@[2,4,5] left broadcast", (3, 4), (2, 4, 5))]
    for name, sa, sb in mm:
        cases.append(Case(name, [node("MatMul", ["a", "b"], ["y"])],
                          {"a": g.f(*sa), "b": g.f(*sb)}, ["y"],
                          lambda t: torch.matmul(t["a"], t["b"])))

    def gemm(name, ta, tb, alpha, beta, c_shape, m=3, k=4, n=5, b_init=False):
        sa = (k, m) if ta else (m, k)
        sb = (n, k) if tb else (k, n)
        xs = {"a": g.f(*sa), "b": g.f(*sb)}
        ins = ["a", "b"]
        if c_shape is not None:
            xs["c"] = g.f(*c_shape)
            ins.append("c")

        def fn(t):
            a = t["a"].T if ta else t["a"]
            b = t["b"].T if tb else t["b"]
            y = A(alpha) * (a @ b)
            return y + A(beta) * t["c"] if c_shape is not None else y
        return Case(name, [node("Gemm", ins, ["y"], transA=ta, transB=tb, alpha=alpha,
                                beta=beta)], xs, ["y"], fn, x_inits=["b"] if b_init else ())
    cases += [
        gemm("Gemm", 0, 0, 1.0, 1.0, (3, 5)),
        gemm("Gemm transA alpha=0.5 beta=2 C[5]", 1, 0, 0.5, 2.0, (5,)),
        gemm("Gemm transB C[3,1]", 0, 1, 1.0, 1.0, (3, 1)),
        gemm("Gemm transA transB alpha=-1.5 C[] beta=0.3", 1, 1, -1.5, 0.3, ()),
        gemm("Gemm no C, B an initializer", 0, 1, 1.0, 1.0, None, b_init=True),
        gemm("Gemm C[1,1]", 0, 0, 1.0, 1.0, (1, 1)),
    ]
    return cases


def conv_pads(pads):
    """ONNX pads [b1, b2, .., e1, e2, ..] as F.pad's (last axis first) list."""
    n = len(pads) // 2
    out = []
    for i in reversed(range(n)):
        out += [pads[i], pads[i + n]]
    return out


def same_pads(in_sizes, kernel, strides, dilations, upper=True):
    pads_b, pads_e = [], []
    for i, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-i // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - i)
        small, big = total // 2, total - total // 2
        pads_b.append(small if upper else big)
        pads_e.append(big if upper else small)
    return pads_b + pads_e


def window_cases():
    g = Gen("window")
    cases = []
    convs = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

    def conv(name, xs_shape, w_shape, bias, strides, pads, dilations, group, auto_pad=None,
             w_init=False):
        nd = len(xs_shape) - 2
        xs = {"x": g.f(*xs_shape), "w": g.f(*w_shape)}
        ins = ["x", "w"]
        if bias:
            xs["b"] = g.f(w_shape[0])
            ins.append("b")
        attrs = dict(strides=strides, dilations=dilations, group=group,
                     kernel_shape=list(w_shape[2:]))
        if auto_pad:
            attrs["auto_pad"] = auto_pad
            pads = same_pads(xs_shape[2:], w_shape[2:], strides, dilations,
                             upper=auto_pad == "SAME_UPPER")
        else:
            attrs["pads"] = pads

        def fn(t):
            x = F.pad(t["x"], conv_pads(pads))
            return convs[nd](x, t["w"], t.get("b"), stride=strides, dilation=dilations,
                             groups=group)
        return Case(name, [node("Conv", ins, ["y"], **attrs)], xs, ["y"], fn,
                    x_inits=["w"] if w_init else ())
    cases += [
        conv("Conv2d stride 2, pads [1,0,2,1], dilation [1,2], bias", (2, 3, 7, 8),
             (4, 3, 3, 2), True, [2, 2], [1, 0, 2, 1], [1, 2], 1),
        conv("Conv2d group 2, pads 1, bias", (1, 4, 6, 6), (6, 2, 3, 3), True, [1, 1],
             [1, 1, 1, 1], [1, 1], 2),
        conv("Conv2d depthwise (group 3), stride 2", (2, 3, 5, 5), (3, 1, 3, 3), False, [2, 2],
             [1, 1, 1, 1], [1, 1], 3),
        conv("Conv2d 1x1", (2, 4, 3, 3), (5, 4, 1, 1), True, [1, 1], [0, 0, 0, 0], [1, 1], 1),
        conv("Conv2d auto_pad SAME_UPPER stride 2", (1, 2, 7, 6), (3, 2, 3, 3), True, [2, 2],
             None, [1, 1], 1, auto_pad="SAME_UPPER"),
        conv("Conv2d auto_pad SAME_LOWER", (1, 2, 5, 6), (2, 2, 2, 3), False, [1, 1], None,
             [1, 1], 1, auto_pad="SAME_LOWER"),
        conv("Conv1d stride 2 dilation 2 pads [2,1]", (2, 2, 11), (3, 2, 3), False, [2], [2, 1],
             [2], 1),
        conv("Conv3d pads 1 stride 2, bias", (1, 2, 4, 5, 4), (2, 2, 2, 3, 2), True, [2, 1, 2],
             [1, 1, 0, 0, 1, 1], [1, 1, 1], 1),
        conv("Conv2d weight an initializer", (2, 2, 5, 5), (3, 2, 3, 3), True, [1, 1],
             [0, 0, 0, 0], [1, 1], 1, w_init=True),
    ]

    def maxpool(name, shape, k, s, p, d=None, ceil=0):
        attrs = dict(kernel_shape=k, strides=s, pads=p + p, ceil_mode=ceil)
        if d:
            attrs["dilations"] = d

        def fn(t):
            return F.max_pool2d(t["x"], k, s, p, dilation=d or 1, ceil_mode=bool(ceil))
        return Case(name, [node("MaxPool", ["x"], ["y"], **attrs)], {"x": g.f(*shape)}, ["y"],
                    fn)
    cases += [
        maxpool("MaxPool 2x2 stride 2", (2, 3, 6, 6), [2, 2], [2, 2], [0, 0]),
        maxpool("MaxPool 3x3 stride 2 pads 1 (overlapping)", (2, 2, 7, 7), [3, 3], [2, 2],
                [1, 1]),
        maxpool("MaxPool 3x2 stride [1,2] dilation 2 ceil_mode", (1, 2, 8, 7), [3, 2], [1, 2],
                [0, 0], d=[2, 2], ceil=1),
        maxpool("MaxPool 3x3 stride 2 ceil_mode", (1, 2, 6, 6), [3, 3], [2, 2], [0, 0], ceil=1),
    ]

    def avgpool(name, shape, k, s, p, cip, ceil=0):
        attrs = dict(kernel_shape=k, strides=s, pads=p + p, ceil_mode=ceil,
                     count_include_pad=cip)

        def fn(t):
            return F.avg_pool2d(t["x"], k, s, p, ceil_mode=bool(ceil),
                                count_include_pad=bool(cip))
        return Case(name, [node("AveragePool", ["x"], ["y"], **attrs)], {"x": g.f(*shape)},
                    ["y"], fn, opset=19)
    cases += [
        avgpool("AveragePool 2x2 stride 2", (2, 3, 6, 6), [2, 2], [2, 2], [0, 0], 0),
        avgpool("AveragePool 3x3 pads 1 count_include_pad=0", (1, 2, 5, 6), [3, 3], [1, 1],
                [1, 1], 0),
        avgpool("AveragePool 3x3 pads 1 count_include_pad=1", (1, 2, 5, 6), [3, 3], [1, 1],
                [1, 1], 1),
        avgpool("AveragePool 3x3 stride 2 ceil_mode", (1, 2, 6, 7), [3, 3], [2, 2], [0, 0], 0,
                ceil=1),
        avgpool("AveragePool 3x3 stride 2 pads 1 ceil_mode cip=1", (1, 2, 6, 6), [3, 3], [2, 2],
                [1, 1], 1, ceil=1),
    ]
    cases.append(Case("MaxPool 3-D 2x2x2 stride [2,1,2]",
                      [node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2], strides=[2, 1, 2])],
                      {"x": g.f(1, 2, 4, 3, 5)}, ["y"],
                      lambda t: F.max_pool3d(t["x"], 2, [2, 1, 2])))
    cases.append(Case("AveragePool 1-D k3 stride 2 pads [1,1] count_include_pad=0",
                      [node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=[2],
                            pads=[1, 1])],
                      {"x": g.f(2, 3, 8)}, ["y"],
                      lambda t: F.avg_pool1d(t["x"], 3, 2, 1, count_include_pad=False)))
    cases.append(Case("GlobalAveragePool", [node("GlobalAveragePool", ["x"], ["y"])],
                      {"x": g.f(2, 3, 4, 5)}, ["y"],
                      lambda t: t["x"].mean(dim=(2, 3), keepdim=True)))
    cases.append(Case("GlobalMaxPool", [node("GlobalMaxPool", ["x"], ["y"])],
                      {"x": g.f(2, 3, 4, 5)}, ["y"],
                      lambda t: t["x"].amax(dim=(2, 3), keepdim=True)))
    cases.append(Case("GlobalLpPool p 3", [node("GlobalLpPool", ["x"], ["y"], p=3)],
                      {"x": g.f(2, 3, 4, 5)}, ["y"],
                      lambda t: (t["x"].abs() ** 3).sum(dim=(2, 3), keepdim=True) ** (1 / 3),
                      onnx_ref="onnx.reference 1.23 has no GlobalLpPool"))
    return cases


def movement_cases():
    g = Gen("movement")
    cases = []
    cases.append(Case("Reshape [2,3,4]->[0,-1,2]", [node("Reshape", ["x", "s"], ["y"])],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].reshape(2, 6, 2),
                      consts={"s": i64(0, -1, 2)}))
    cases.append(Case("Flatten axis 2", [node("Flatten", ["x"], ["y"], axis=2)],
                      {"x": g.f(2, 3, 4, 2)}, ["y"], lambda t: t["x"].reshape(6, 8)))
    cases.append(Case("Transpose perm [2,0,3,1]", [node("Transpose", ["x"], ["y"],
                                                        perm=[2, 0, 3, 1])],
                      {"x": g.f(2, 3, 4, 5)}, ["y"], lambda t: t["x"].permute(2, 0, 3, 1)))
    cases.append(Case("Concat axis 1 of 3", [node("Concat", ["a", "b", "c"], ["y"], axis=1)],
                      {"a": g.f(2, 1, 3), "b": g.f(2, 4, 3), "c": g.f(2, 2, 3)}, ["y"],
                      lambda t: torch.cat([t["a"], t["b"], t["c"]], dim=1)))
    cases.append(Case("Concat axis -1, one operand twice", [node("Concat", ["a", "b", "a"],
                                                                 ["y"], axis=-1)],
                      {"a": g.f(3, 2), "b": g.f(3, 4)}, ["y"],
                      lambda t: torch.cat([t["a"], t["b"], t["a"]], dim=-1)))
    cases.append(Case("Split axis 1 into [1,3,2]", [node("Split", ["x", "s"], ["y0", "y1", "y2"],
                                                         axis=1)],
                      {"x": g.f(2, 6, 3)}, ["y0", "y1", "y2"],
                      lambda t: list(torch.split(t["x"], [1, 3, 2], dim=1)),
                      consts={"s": i64(1, 3, 2)}))
    cases.append(Case("Split axis -1 equal, one result unused",
                      [node("Split", ["x"], ["y0", "y1"], axis=-1)],
                      {"x": g.f(3, 4)}, ["y1"], lambda t: [torch.split(t["x"], 2, dim=-1)[1]]))

    def slice_case(name, shape, starts, ends, axes, steps):
        def fn(t):
            x = t["x"]
            for st, en, ax, sp in zip(starts, ends, axes, steps):
                idx = np.arange(x.shape[ax])[slice(st, en, sp)]
                x = x.index_select(ax, torch.from_numpy(idx.copy()))
            return x
        return Case(name, [node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                    {"x": g.f(*shape)}, ["y"], fn,
                    consts={"st": i64(*starts), "en": i64(*ends), "ax": i64(*axes),
                            "sp": i64(*steps)})
    cases += [
        slice_case("Slice [1:4:2, :, -3:]", (5, 3, 6), [1, 0, -3], [4, 3, 1000], [0, 1, 2],
                   [2, 1, 1]),
        slice_case("Slice negative step [::-2] axis 1", (3, 7), [-1], [-1000], [1], [-2]),
    ]

    def gather(name, shape, idx, axis):
        def fn(t):
            d = t["x"].shape[axis]
            i = torch.from_numpy(idx % d).reshape(-1)
            y = t["x"].index_select(axis, i)
            s = list(t["x"].shape)
            return y.reshape(s[:axis] + list(idx.shape) + s[axis + 1:])
        return Case(name, [node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": g.f(*shape)},
                    ["y"], fn, consts={"i": idx})
    cases += [
        gather("Gather axis 0, repeated indices", (5, 3), i64(0, 3, 3, 1), 0),
        gather("Gather axis 1, [2,2] indices with negatives", (2, 4, 3),
               np.array([[1, -1], [0, -4]], dtype=np.int64), 1),
    ]
    cases.append(Case("Expand [3,1]->[2,3,4]", [node("Expand", ["x", "s"], ["y"])],
                      {"x": g.f(3, 1)}, ["y"], lambda t: t["x"].expand(2, 3, 4),
                      consts={"s": i64(2, 1, 4)}))
    cases.append(Case("Expand [2,3,1] by shape [4] (lower rank)",
                      [node("Expand", ["x", "s"], ["y"])],
                      {"x": g.f(2, 3, 1)}, ["y"], lambda t: t["x"].expand(2, 3, 4),
                      consts={"s": i64(4)}))
    cases.append(Case("Gather axis 1, scalar index", [node("Gather", ["x", "i"], ["y"], axis=1)],
                      {"x": g.f(2, 4, 3)}, ["y"], lambda t: t["x"][:, 2],
                      consts={"i": np.array(-2, dtype=np.int64)}))
    cases.append(Case("Transpose default perm", [node("Transpose", ["x"], ["y"])],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].permute(2, 1, 0)))
    cases.append(Case("Flatten axis 0", [node("Flatten", ["x"], ["y"], axis=0)],
                      {"x": g.f(2, 3)}, ["y"], lambda t: t["x"].reshape(1, 6)))
    cases.append(Case("Split num_outputs 3 (opset 18)",
                      [node("Split", ["x"], ["y0", "y1", "y2"], axis=0, num_outputs=3)],
                      {"x": g.f(7, 2)}, ["y0", "y1", "y2"],
                      lambda t: list(torch.split(t["x"], 3, dim=0)), opset=18))
    cases.append(Case("Squeeze no axes", [node("Squeeze", ["x"], ["y"])],
                      {"x": g.f(1, 3, 1, 2)}, ["y"], lambda t: t["x"].reshape(3, 2)))
    cases.append(Case("Squeeze axes [1,3]", [node("Squeeze", ["x", "a"], ["y"])],
                      {"x": g.f(2, 1, 3, 1)}, ["y"], lambda t: t["x"].reshape(2, 3),
                      consts={"a": i64(1, 3)}))
    cases.append(Case("Unsqueeze axes [0,-1]", [node("Unsqueeze", ["x", "a"], ["y"])],
                      {"x": g.f(2, 3)}, ["y"], lambda t: t["x"].reshape(1, 2, 3, 1),
                      consts={"a": i64(0, -1)}))
    return cases


def bn_inference(t):
    # F.batch_norm takes no gradient for the mean and variance; the formula does.
    c = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    return (t["x"] - c(t["m"])) / torch.sqrt(c(t["v"]) + A(1e-5)) * c(t["s"]) + c(t["b"])


def normalize_cases():
    g = Gen("normalize")
    cases = []
    cases.append(Case("Softmax axis 1", [node("Softmax", ["x"], ["y"], axis=1)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: torch.softmax(t["x"], dim=1)))
    cases.append(Case("Softmax axis -1", [node("Softmax", ["x"], ["y"], axis=-1)],
                      {"x": g.f(3, 5)}, ["y"], lambda t: torch.softmax(t["x"], dim=-1)))
    cases.append(Case("LogSoftmax axis -1", [node("LogSoftmax", ["x"], ["y"], axis=-1)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: F.log_softmax(t["x"], dim=-1)))
    cases.append(Case("LogSoftmax axis 0", [node("LogSoftmax", ["x"], ["y"], axis=0)],
                      {"x": g.f(4, 3)}, ["y"], lambda t: F.log_softmax(t["x"], dim=0)))
    cases.append(Case("LayerNormalization axis -1, scale, bias",
                      [node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1,
                            epsilon=1e-5)],
                      {"x": g.f(2, 3, 6), "s": g.f(6), "b": g.f(6)}, ["y"],
                      lambda t: F.layer_norm(t["x"], (6,), t["s"], t["b"], A(1e-5))))
    cases.append(Case("LayerNormalization axis 1 (over [3,4]), no bias",
                      [node("LayerNormalization", ["x", "s"], ["y"], axis=1, epsilon=1e-3)],
                      {"x": g.f(2, 3, 4), "s": g.f(3, 4)}, ["y"],
                      lambda t: F.layer_norm(t["x"], (3, 4), t["s"], None, A(1e-3))))
    def ln_all(t):
        x = t["x"]
        mean = x.mean(dim=-1, keepdim=True)
        inv = 1 / torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdim=True) + A(1e-5))
        return [(x - mean) * inv * t["s"] + t["b"], mean, inv]
    cases.append(Case("LayerNormalization, Mean and InvStdDev in the loss too",
                      [node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"],
                            axis=-1, epsilon=1e-5)],
                      {"x": g.f(3, 5), "s": g.f(5), "b": g.f(5)}, ["y", "mean", "inv"],
                      ln_all))
    cases.append(Case("BatchNormalization inference, x scale bias mean var",
                      [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                            epsilon=1e-5)],
                      {"x": g.f(2, 3, 4, 4), "s": g.f(3), "b": g.f(3), "m": g.f(3),
                       "v": g.pos(3)}, ["y"],
                      bn_inference))
    cases.append(Case("BatchNormalization training_mode=1 (y)",
                      [node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], epsilon=1e-5, momentum=0.9, training_mode=1)],
                      {"x": g.f(4, 3, 3, 2), "s": g.f(3), "b": g.f(3)}, ["y"],
                      lambda t: F.batch_norm(t["x"], None, None, t["s"], t["b"], True, 0.0,
                                             A(1e-5)),
                      consts={"m": g.f(3), "v": g.pos(3)}, opset=15))

    def bn_train_all(t):
        x, mom = t["x"], A(0.9)
        y = F.batch_norm(x, None, None, t["s"], t["b"], True, 0.0, A(1e-5))
        mean = x.mean(dim=(0, 2, 3))
        var = ((x - mean.reshape(1, -1, 1, 1)) ** 2).mean(dim=(0, 2, 3))
        return [y, t["m"] * mom + mean * (1 - mom), t["v"] * mom + var * (1 - mom)]
    cases.append(Case("BatchNormalization training_mode=1 (y, running mean, running var)",
                      [node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], epsilon=1e-5, momentum=0.9, training_mode=1)],
                      {"x": g.f(4, 3, 3, 2), "s": g.f(3), "b": g.f(3)}, ["y", "rm", "rv"],
                      bn_train_all, consts={"m": g.f(3), "v": g.pos(3)}, opset=15))
    return cases


def reduce_cases():
    g = Gen("reduce")
    cases = []
    cases.append(Case("ReduceSum axes [0,2] keepdims 0", [node("ReduceSum", ["x", "a"], ["y"],
                                                               keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].sum(dim=(0, 2)),
                      consts={"a": i64(0, 2)}))
    cases.append(Case("ReduceSum axes [-1] keepdims 1", [node("ReduceSum", ["x", "a"], ["y"])],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].sum(dim=-1, keepdim=True),
                      consts={"a": i64(-1)}))
    cases.append(Case("ReduceSum all", [node("ReduceSum", ["x"], ["y"], keepdims=0)],
                      {"x": g.f(3, 4)}, ["y"], lambda t: t["x"].sum()))
    cases.append(Case("ReduceSum no axes, noop_with_empty_axes 1 (identity)",
                      [node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)],
                      {"x": g.f(3, 4)}, ["y"], lambda t: t["x"]))
    cases.append(Case("ReduceMean axes input [-1,0] (opset 18)",
                      [node("ReduceMean", ["x", "a"], ["y"], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].mean(dim=(0, 2)),
                      consts={"a": i64(-1, 0)}, opset=18))
    cases.append(Case("ReduceMean axes [1] keepdims 0", [node("ReduceMean", ["x"], ["y"],
                                                              axes=[1], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].mean(dim=1)))
    cases.append(Case("ReduceMean axes [0,2] keepdims 1", [node("ReduceMean", ["x"], ["y"],
                                                                axes=[0, 2])],
                      {"x": g.f(2, 3, 4)}, ["y"],
                      lambda t: t["x"].mean(dim=(0, 2), keepdim=True)))
    cases.append(Case("ReduceSumSquare axes [1]", [node("ReduceSumSquare", ["x"], ["y"],
                                                        axes=[1], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: (t["x"] ** 2).sum(dim=1)))
    cases.append(Case("ReduceSumSquare all keepdims 1", [node("ReduceSumSquare", ["x"], ["y"])],
                      {"x": g.f(2, 3)}, ["y"],
                      lambda t: (t["x"] ** 2).sum(dim=(0, 1), keepdim=True)))
    cases.append(Case("ReduceL1 axes [2] keepdims 0", [node("ReduceL1", ["x"], ["y"],
                                                            axes=[2], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].abs().sum(dim=2)))
    cases.append(Case("ReduceL2 axes [0,2] keepdims 1", [node("ReduceL2", ["x"], ["y"],
                                                              axes=[0, 2])],
                      {"x": g.f(2, 3, 4)}, ["y"],
                      lambda t: (t["x"] ** 2).sum(dim=(0, 2), keepdim=True).sqrt()))
    cases.append(Case("ReduceLogSum axes [1] keepdims 0", [node("ReduceLogSum", ["x"], ["y"],
                                                                axes=[1], keepdims=0)],
                      {"x": g.pos(2, 3, 4)}, ["y"], lambda t: t["x"].sum(dim=1).log()))
    cases.append(Case("ReduceLogSumExp axes [-1] keepdims 0",
                      [node("ReduceLogSumExp", ["x"], ["y"], axes=[-1], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].logsumexp(dim=-1)))
    cases.append(Case("ReduceMax axes [1] keepdims 0", [node("ReduceMax", ["x"], ["y"],
                                                             axes=[1], keepdims=0)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: t["x"].amax(dim=1)))
    cases.append(Case("ReduceMin all keepdims 1", [node("ReduceMin", ["x"], ["y"])],
                      {"x": g.f(3, 4)}, ["y"], lambda t: t["x"].amin(dim=(0, 1), keepdim=True)))
    return cases


def loss_cases():
    g = Gen("loss")
    cases = []

    def labelled(scores, shape, reduction, weight, ignore):
        """The labels (every third one `ignore` when given), the class weights when asked,
        the loss node's inputs and attributes."""
        n, c = shape[0], shape[1]
        labels = g.ints(0, c, n, *shape[2:])
        if ignore is not None:
            labels.reshape(-1)[::3] = ignore
        consts = {"l": labels}
        ins = [scores, "l"]
        if weight:
            consts["w"] = g.pos(c)
            ins.append("w")
        attrs = {"reduction": reduction}
        if ignore is not None:
            attrs["ignore_index"] = ignore
        return consts, ins, attrs

    def sce(name, shape, reduction, weight=False, ignore=None, log_prob=False):
        consts, ins, attrs = labelled("s", shape, reduction, weight, ignore)
        outs = ["y", "lp"] if log_prob else ["y"]

        def fn(t):
            y = F.cross_entropy(t["s"], t["l"], weight=t.get("w"),
                                ignore_index=-100 if ignore is None else ignore,
                                reduction=reduction)
            return [y, F.log_softmax(t["s"], dim=1)] if log_prob else [y]
        return Case(name, [node("SoftmaxCrossEntropyLoss", ins, outs, **attrs)],
                    {"s": g.f(*shape)}, outs, fn, consts=consts)
    cases += [
        sce("SoftmaxCrossEntropyLoss mean", (5, 4), "mean"),
        sce("SoftmaxCrossEntropyLoss sum, weights", (5, 4), "sum", weight=True),
        sce("SoftmaxCrossEntropyLoss none, [N,C,d]", (3, 4, 2), "none"),
        sce("SoftmaxCrossEntropyLoss mean, weights, ignore_index 1", (6, 3), "mean",
            weight=True, ignore=1),
        sce("SoftmaxCrossEntropyLoss mean, ignore_index -1, [N,C,d]", (3, 4, 3), "mean",
            ignore=-1),
        sce("SoftmaxCrossEntropyLoss both results (log_prob)", (4, 3), "mean", log_prob=True),
        sce("SoftmaxCrossEntropyLoss none, weights, ignore_index 0, both results", (5, 3),
            "none", weight=True, ignore=0, log_prob=True),
    ]

    def nll(name, shape, reduction, weight=False, ignore=None):
        consts, ins, attrs = labelled("x", shape, reduction, weight, ignore)
        return Case(name, [node("LogSoftmax", ["s"], ["x"], axis=1),
                           node("NegativeLogLikelihoodLoss", ins, ["y"], **attrs)],
                    {"s": g.f(*shape)}, ["y"],
                    lambda t: F.nll_loss(F.log_softmax(t["s"], dim=1), t["l"],
                                         weight=t.get("w"),
                                         ignore_index=-100 if ignore is None else ignore,
                                         reduction=reduction),
                    consts=consts)
    cases += [
        nll("LogSoftmax+NegativeLogLikelihoodLoss mean", (5, 4), "mean"),
        nll("NegativeLogLikelihoodLoss sum, weights", (5, 4), "sum", weight=True),
        nll("NegativeLogLikelihoodLoss none, [N,C,d1,d2]", (2, 3, 2, 2), "none"),
        nll("NegativeLogLikelihoodLoss mean, weights, ignore_index 2", (6, 4), "mean",
            weight=True, ignore=2),
        nll("NegativeLogLikelihoodLoss mean, weights, ignore_index 1, [N,C,d]", (3, 4, 5),
            "mean", weight=True, ignore=1),
    ]
    return cases


def model_cases():
    """A few layers in a chain, as a model has them."""
    g = Gen("models")
    cases = []
    # MLP: MatMul, Add, Relu, Gemm, softmax cross-entropy; weights as initializers.
    labels = g.ints(0, 3, 4)
    cases.append(Case(
        "MLP: MatMul+Add+Relu+Gemm+SoftmaxCrossEntropyLoss",
        [node("MatMul", ["x", "w1"], ["h"]), node("Add", ["h", "b1"], ["hb"]),
         node("Relu", ["hb"], ["r"]), node("Gemm", ["r", "w2", "b2"], ["z"], transB=1),
         node("SoftmaxCrossEntropyLoss", ["z", "l"], ["y"])],
        {"x": g.f(4, 5), "w1": g.f(5, 6), "b1": g.f(6), "w2": g.f(3, 6), "b2": g.f(3)},
        ["y"],
        lambda t: F.cross_entropy(F.linear(F.relu(t["x"] @ t["w1"] + t["b1"]), t["w2"],
                                           t["b2"]), t["l"]),
        consts={"l": labels}, x_inits=["w1", "b1", "w2", "b2"]))
    # CNN: Conv, Relu, MaxPool, Flatten, Gemm, softmax cross-entropy.
    labels = g.ints(0, 4, 2)
    cases.append(Case(
        "CNN: Conv+Relu+MaxPool+Flatten+Gemm+SoftmaxCrossEntropyLoss",
        [node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         node("Relu", ["c"], ["r"]), node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2],
                                          strides=[2, 2]),
         node("Flatten", ["p"], ["f"]), node("Gemm", ["f", "fw", "fb"], ["z"], transB=1),
         node("SoftmaxCrossEntropyLoss", ["z", "l"], ["y"])],
        {"x": g.f(2, 2, 6, 6), "cw": g.f(3, 2, 3, 3), "cb": g.f(3), "fw": g.f(4, 27),
         "fb": g.f(4)},
        ["y"],
        lambda t: F.cross_entropy(F.linear(torch.flatten(F.max_pool2d(F.relu(F.conv2d(
            t["x"], t["cw"], t["cb"], padding=1)), 2, 2), 1), t["fw"], t["fb"]), t["l"]),
        consts={"l": labels}))
    # Attention: LayerNormalization, projections, scaled softmax over keys, residual.
    d = 4

    def attn(t):
        h = F.layer_norm(t["x"], (d,), t["g"], t["be"], A(1e-5))
        q, k, v = h @ t["wq"], h @ t["wk"], h @ t["wv"]
        s = torch.softmax(q @ k.transpose(1, 2) * t["sc"], dim=-1)
        return t["x"] + torch.tanh(s @ v) @ t["wo"]
    cases.append(Case(
        "attention: LayerNorm+MatMul+Transpose+Softmax+Tanh+residual",
        [node("LayerNormalization", ["x", "g", "be"], ["h"], axis=-1, epsilon=1e-5),
         node("MatMul", ["h", "wq"], ["q"]), node("MatMul", ["h", "wk"], ["k"]),
         node("MatMul", ["h", "wv"], ["v"]), node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
         node("MatMul", ["q", "kt"], ["qk"]), node("Mul", ["qk", "sc"], ["qks"]),
         node("Softmax", ["qks"], ["s"], axis=-1), node("MatMul", ["s", "v"], ["o"]),
         node("Tanh", ["o"], ["to"]), node("MatMul", ["to", "wo"], ["p"]),
         node("Add", ["x", "p"], ["y"])],
        {"x": g.f(2, 3, d), "g": g.f(d), "be": g.f(d), "wq": g.f(d, d), "wk": g.f(d, d),
         "wv": g.f(d, d), "wo": g.f(d, d)},
        ["y"], attn, consts={"sc": np.array(0.5)}))
    return cases


def training_cases():
    """Gradients of a Gradient's outputs, and training-mode Dropout."""
    g = Gen("training")
    cases = []

    def second(t):
        inner = (torch.tanh(t["x"]) * t["w"] * t["ri"]).sum()
        return list(torch.autograd.grad(inner, [t["x"], t["w"]], create_graph=True))
    cases.append(Case(
        "second derivative: Gradient of Gradient(tanh(x)*w)",
        [node("Tanh", ["x"], ["t"]), node("Mul", ["t", "w"], ["m"]),
         node("Mul", ["m", "ri"], ["mr"]), node("ReduceSum", ["mr"], ["inner"], keepdims=0),
         helper.make_node("Gradient", ["x", "w"], ["gx", "gw"], domain=TRAINING,
                          xs=["x", "w"], y="inner")],
        {"x": g.f(3, 4), "w": g.f(4)}, ["gx", "gw"], second, consts={"ri": g.f(3, 4)}))

    ratio = 0.3

    def mask(kiln, work):
        nodes = [node("Dropout", ["x", "r", "tm"], ["y", "mask"], seed=7)]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5, 6])
        out = helper.make_tensor_value_info("mask", TensorProto.BOOL, None)
        inits = [numpy_helper.from_array(np.array(ratio, dtype=np.float32), "r"),
                 numpy_helper.from_array(np.array(True), "tm")]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], [out], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        d = os.path.join(work, "dropout-mask")
        os.makedirs(d, exist_ok=True)
        onnx.save(m, os.path.join(d, "model.onnx"))
        np.save(os.path.join(d, "x.npy"), np.ones((4, 5, 6), np.float32))
        subprocess.run([kiln, "run", os.path.join(d, "model.onnx"), "--device", "cpu", "-q",
                        "--input", f"x={os.path.join(d, 'x.npy')}", "--output-dir", d],
                       check=True, capture_output=True)
        return {"mask": torch.from_numpy(np.load(os.path.join(d, "output_0.npy")))}
    cases.append(Case(
        "Dropout training_mode ratio 0.3 (kiln's mask)",
        [node("Dropout", ["x", "r", "tm"], ["y", "m"], seed=7)],
        {"x": g.f(4, 5, 6)}, ["y"], lambda t: t["x"] * t["mask"] / (1 - ratio),
        consts={"r": np.array(ratio), "tm": np.array(True)}, pre=mask))
    return cases


def gru(t, hidden):
    """ONNX GRU, one forward layer, linear_before_reset 0, no initial state (zeros)."""
    wz, wr, wh = t["w"][0].split(hidden)
    rz, rr, rh = t["r"][0].split(hidden)
    wbz, wbr, wbh, rbz, rbr, rbh = t["b"][0].split(hidden)
    h = torch.zeros(t["x"].shape[1], hidden, dtype=t["x"].dtype)
    ys = []
    for x in t["x"]:
        z = torch.sigmoid(x @ wz.T + h @ rz.T + wbz + rbz)
        r = torch.sigmoid(x @ wr.T + h @ rr.T + wbr + rbr)
        n = torch.tanh(x @ wh.T + (r * h) @ rh.T + rbh + wbh)
        h = (1 - z) * n + z * h
        ys.append(h)
    return [torch.stack(ys)[:, None], h[None]]


def recurrent_cases():
    """The recurrent ops (GRU, the seed's model)."""
    g = Gen("gap")
    h, i = 3, 2
    return [Case(
        "GRU (forward, 1 layer, Y and Y_h)",
        [node("GRU", ["x", "w", "r", "b"], ["ys", "yh"], hidden_size=h)],
        {"x": g.f(4, 2, i), "w": g.f(1, 3 * h, i), "r": g.f(1, 3 * h, h),
         "b": g.f(1, 6 * h)},
        ["ys", "yh"], lambda t: gru(t, h))]


def shape_cases():
    """Shapes computed from a differentiated value (Shape of x feeding a Reshape), as models
    exported from PyTorch compute them."""
    g = Gen("shape")
    cases = [Case(
        "Flatten as exported: Shape+Gather+Unsqueeze+Concat+Reshape, MatMul",
        [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
         node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Concat", ["n1", "m1"], ["shp"], axis=0),
         node("Reshape", ["x", "shp"], ["f"]), node("MatMul", ["f", "w"], ["y"])],
        {"x": g.f(2, 3, 4), "w": g.f(12, 2)}, ["y"],
        lambda t: t["x"].reshape(2, -1) @ t["w"],
        consts={"zero": np.array(0, dtype=np.int64), "ax0": i64(0), "m1": i64(-1)})]
    # Softmax and LogSoftmax before opset 13 coerce the input to 2-D at the axis; kiln imports
    # them as Flatten, the op at axis 1, and a Reshape back to Shape(x).
    # onnx.reference (1.23) runs opset 13's single-axis form for every opset, so it cannot
    # check these translations.
    v11 = "onnx.reference's Softmax-11 is opset 13's"
    cases.append(Case("Softmax opset 11 axis 1 (coerced to 2-D)",
                      [node("Softmax", ["x"], ["y"], axis=1)],
                      {"x": g.f(2, 3, 4)}, ["y"],
                      lambda t: torch.softmax(t["x"].reshape(2, 12), dim=1).reshape(2, 3, 4),
                      opset=11, onnx_ref=v11))
    cases.append(Case("LogSoftmax opset 11 axis 1 (coerced to 2-D)",
                      [node("LogSoftmax", ["x"], ["y"], axis=1)],
                      {"x": g.f(2, 3, 4)}, ["y"],
                      lambda t: F.log_softmax(t["x"].reshape(2, 12), dim=1).reshape(2, 3, 4),
                      opset=11, onnx_ref=v11))
    cases.append(Case("Softmax opset 11 axis -1 (the last: no Reshape)",
                      [node("Softmax", ["x"], ["y"], axis=-1)],
                      {"x": g.f(2, 3, 4)}, ["y"], lambda t: torch.softmax(t["x"], dim=-1),
                      opset=11))
    return cases


FAMILIES = [
    ("elementwise, unary", unary_cases), ("elementwise, binary", binary_cases),
    ("contraction", contraction_cases), ("window", window_cases),
    ("movement", movement_cases), ("normalize", normalize_cases), ("reduce", reduce_cases),
    ("loss", loss_cases), ("models (chains)", model_cases),
    ("training (2nd derivative, Dropout)", training_cases),
    ("shapes computed from x", shape_cases), ("recurrent", recurrent_cases),
]


def all_cases():
    cases = []
    for family, make in FAMILIES:
        for c in make():
            c.family = family
            cases.append(c)
    return cases


# ---------------------------------------------------------------------------------------------
# Running a case


def torch_reference(case):
    """PyTorch's results, loss and gradients in float64, and the random loss tensors R_i."""
    t = {}
    for name, v in case.xs.items():
        t[name] = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    for name, v in case.consts.items():
        t[name] = torch.from_numpy(np.asarray(v).copy())
        if t[name].is_floating_point():
            t[name] = t[name].double()
    t.update(case.extra)
    outs = case.torch_fn(t)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    g = Gen("R:" + case.name)
    rs = [g.f(*o.shape) for o in outs]
    loss = sum((o * torch.from_numpy(r)).sum() for o, r in zip(outs, rs))
    grads = torch.autograd.grad(loss, [t[n] for n in case.xs])
    return rs, loss.detach().numpy(), [d.numpy() for d in grads], [o.detach().numpy() for o in outs]


FWD_TOL = (1e-6, 1e-9)  # rtol, atol of PyTorch's results against onnx.reference's


def onnx_forward(case, outs):
    """The case's results by onnx.reference (ONNX's own reference implementation, float64)
    against PyTorch's: checks the translation, not kiln. The largest absolute difference and
    whether it is within FWD_TOL, or why onnx.reference cannot check the case."""
    if case.onnx_ref:
        return case.onnx_ref
    if case.pre:
        return "kiln's mask"
    if any(n.domain == TRAINING for n in case.nodes):
        return "a Gradient node"
    from onnx.reference import ReferenceEvaluator
    inits = [numpy_helper.from_array(np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f"
                                     else np.asarray(v), n) for n, v in case.consts.items()]
    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, list(v.shape))
              for n, v in case.xs.items()]
    outputs = [helper.make_tensor_value_info(o, TensorProto.DOUBLE, None) for o in case.outs]
    model = helper.make_model(
        helper.make_graph(copy.deepcopy(case.nodes), "g", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", case.opset)])
    got = ReferenceEvaluator(model).run(None, dict(case.xs))
    worst, ok = 0.0, True
    for r, o in zip(got, outs):
        r = np.asarray(r, np.float64)
        if r.shape != o.shape:
            return np.inf, False
        if o.size:
            worst = max(worst, float(np.abs(r - o).max()))
            ok = ok and np.allclose(r, o, rtol=FWD_TOL[0], atol=FWD_TOL[1])
    return worst, ok


def build_model(case, dtype, rs):
    """The case's nodes, the loss and the Gradient node, in element type `dtype`."""
    et, npt = ONNX_DTYPE[dtype], NP_DTYPE[dtype]
    nodes = copy.deepcopy(case.nodes)
    # Casts name TensorProto.DOUBLE as the wide type; in an f32 run, FLOAT.
    if dtype == "f32":
        for n in nodes:
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.DOUBLE:
                    a.i = TensorProto.FLOAT
    inits = []
    for name, v in case.consts.items():
        v = np.asarray(v)
        inits.append(numpy_helper.from_array(v.astype(npt) if v.dtype.kind == "f" else v, name))
    losses = []
    for i, (out, r) in enumerate(zip(case.outs, rs)):
        inits.append(numpy_helper.from_array(r.astype(npt), f"R{i}"))
        nodes.append(node("Mul", [out, f"R{i}"], [f"m{i}"]))
        nodes.append(node("ReduceSum", [f"m{i}"], [f"l{i}"], keepdims=0))
        losses.append(f"l{i}")
    acc = losses[0]
    for i, l in enumerate(losses[1:]):
        nodes.append(node("Add", [acc, l], [f"acc{i}"]))
        acc = f"acc{i}"
    nodes.append(node("Identity", [acc], ["loss"]))
    xs = list(case.xs)
    nodes.append(helper.make_node("Gradient", xs, [f"d_{x}" for x in xs], domain=TRAINING,
                                  xs=xs, y="loss"))
    inputs = []
    for name, v in case.xs.items():
        if name in case.x_inits:
            inits.append(numpy_helper.from_array(v.astype(npt), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, et, list(v.shape)))
    outputs = [helper.make_tensor_value_info(n, et, None)
               for n in ["loss"] + [f"d_{x}" for x in xs]]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset),
                                                    helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model


def compare(got, want, dtype):
    """Largest |got - want|, largest |got - want| / |want| (over elements where |want| > atol),
    and whether every element is within atol + rtol |want|."""
    rtol, atol = TOL[dtype]
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return np.inf, np.inf, False, f"shape {list(got.shape)}, torch {list(want.shape)}"
    if got.size == 0:
        return 0.0, 0.0, True, ""
    diff = np.abs(got - want)
    big = np.abs(want) > atol
    rel = float((diff[big] / np.abs(want[big])).max()) if big.any() else 0.0
    bad = ~(diff <= atol + rtol * np.abs(want))
    why = ""
    if bad.any():
        k = np.unravel_index(np.argmax(np.where(bad, diff, -1)), diff.shape)
        why = f"element {list(map(int, k))}: kiln {got[k]:.9g}, torch {want[k]:.9g}"
    return float(diff.max()), rel, not bad.any(), why


def run_cpu(kiln, case, dtype, model, ref, work):
    """kiln run on the CPU: ([max abs, max rel, all within tolerance, first miss], "") or
    (None, kiln's error)."""
    d = os.path.join(work, f"{slug(case.name)}.{dtype}")
    os.makedirs(d, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    cmd = [kiln, "run", os.path.join(d, "model.onnx"), "--device", "cpu", "--threads", "1",
           "--output-dir", os.path.join(d, "out"), "-q"]
    for name, v in case.xs.items():
        if name not in case.x_inits:
            p = os.path.join(d, f"{name}.npy")
            np.save(p, v.astype(NP_DTYPE[dtype]))
            cmd += ["--input", f"{name}={p}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return None, " ".join(msg)[-300:]
    loss, grads = ref
    worst = [0.0, 0.0, True, ""]
    for i, (name, want) in enumerate([("loss", loss)] + [(f"d_{x}", g)
                                                          for x, g in zip(case.xs, grads)]):
        got = np.load(os.path.join(d, "out", f"output_{i}.npy"))
        a, r, ok, why = compare(got, want, dtype)
        worst[0], worst[1] = max(worst[0], a), max(worst[1], r)
        if not ok and worst[2]:
            worst[2], worst[3] = False, f"{name} {why}"
    return worst, ""


def slug(name):
    keep = "".join(c if c.isalnum() else "_" for c in name)
    return f"{keep[:60]}_{zlib.crc32(name.encode()):08x}"


def write_check_dir(root, case, dtype, model, ref):
    """A `kiln check` test folder: the model, its inputs and PyTorch's outputs."""
    d = os.path.join(root, slug(case.name))
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    npt = NP_DTYPE[dtype]
    ins = [(n, v) for n, v in case.xs.items() if n not in case.x_inits]
    for i, (n, v) in enumerate(ins):
        with open(os.path.join(d, "test_data_set_0", f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v.astype(npt), n).SerializeToString())
    loss, grads = ref
    outs = [("loss", loss)] + [(f"d_{x}", g) for x, g in zip(case.xs, grads)]
    for i, (n, v) in enumerate(outs):
        with open(os.path.join(d, "test_data_set_0", f"output_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(v).astype(npt), n).SerializeToString())
    return os.path.basename(d)


def run_ref(kiln, root, dtype):
    """kiln check on the interpreter over every folder under root: name -> (ok, reason)."""
    rtol, atol = TOL[dtype]
    js = os.path.join(root, "result.json")
    p = subprocess.run([kiln, "check", "--device", "ref", "--rtol", str(rtol), "--atol",
                        str(atol), "-q", "--json", js, root], capture_output=True, text=True)
    if not os.path.isfile(js):
        sys.exit(f"grad_vs_torch: kiln check wrote no results: {p.stderr.strip()[-500:]}")
    with open(js) as f:
        res = json.load(f)
    return {os.path.basename(t["name"]): (t["status"] == "pass", t.get("reason", ""))
            for t in res["tests"]}


def summary(rows, devices):
    """A markdown table per family: cases, the largest differences per element type, and the
    results per device."""
    out = ["| family | cases | f64: max abs, max rel | f32: max abs, max rel | "
           + " | ".join(devices) + " |", "|---|---|---|---|" + "---|" * len(devices)]
    for family, _ in FAMILIES:
        fr = [r for r in rows if r[8] == family]
        if not fr:
            continue
        cells = [family, str(len({r[0] for r in fr}))]
        for dt in ("f64", "f32"):
            vals = [(float(r[2]), float(r[3])) for r in fr if r[1] == dt and r[2] not in ("", "-")]
            cells.append(f"{max(v[0] for v in vals):.1e}, {max(v[1] for v in vals):.1e}"
                         if vals else "-")
        for k, dev in ((4, "cpu"), (5, "ref")):
            if dev not in devices:
                continue
            counts = {}
            for r in fr:
                counts[r[k]] = counts.get(r[k], 0) + 1
            cells.append(", ".join(f"{n} {what}" for what, n in sorted(counts.items())))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.environ.get("KILN", "target/release/kiln"),
                    help="the kiln CLI (default: target/release/kiln, or $KILN)")
    ap.add_argument("--device", default="cpu",
                    help="cpu (kiln run, compiled), ref (kiln check on the interpreter), or "
                         "both as cpu,ref")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--keep", default=None, help="write the models and outputs here")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args()
    devices = args.device.split(",")
    for dev in devices:
        if dev not in ("cpu", "ref"):
            ap.error(f"unknown device {dev!r}: cpu or ref")
    if not (os.path.isfile(args.kiln) and os.access(args.kiln, os.X_OK)):
        sys.exit(f"grad_vs_torch: no kiln CLI at {args.kiln} (build it with "
                 "`cargo build --release -p kiln-compiler --bin kiln`, or pass --kiln)")
    torch.set_num_threads(1)

    work = args.keep or tempfile.mkdtemp(prefix="kiln-grad-vs-torch-")
    os.makedirs(work, exist_ok=True)
    cases = [c for c in all_cases() if args.only is None or args.only in c.name]
    rows = []
    check_dirs = {dt: os.path.join(work, f"check-{dt}") for dt in TOL}
    pending_ref = []  # (row index, dtype, folder name, case)
    for case in cases:
        if case.pre:
            case.extra = case.pre(args.kiln, work)
        rs, loss, grads, outs = torch_reference(case)
        fwd = onnx_forward(case, outs)
        for dtype in ["f64", "f32"]:
            model = build_model(case, dtype, rs)
            row = [case.name, dtype, "", "", "", None, "", "", case.family]
            if dtype == "f64":
                row[7] = (fwd if isinstance(fwd, str)
                          else f"{fwd[0]:.1e}" + ("" if fwd[1] else " FAIL"))
            if "cpu" in devices:
                res, err = run_cpu(args.kiln, case, dtype, model, (loss, grads), work)
                if res is None:
                    row[2:5] = ["-", "-", "not taken" if case.gap else "ERROR"]
                    row[6] = (f"{case.gap}: " if case.gap else "") + err
                else:
                    row[2], row[3] = f"{res[0]:.2e}", f"{res[1]:.2e}"
                    row[4] = "pass" if res[2] else "FAIL"
                    row[6] = res[3]
            if "ref" in devices:
                folder = write_check_dir(check_dirs[dtype], case, dtype, model, (loss, grads))
                pending_ref.append((len(rows), dtype, folder, case))
            rows.append(row)
    if "ref" in devices:
        results = {dt: run_ref(args.kiln, check_dirs[dt], dt)
                   for dt in TOL if os.path.isdir(check_dirs[dt])}
        for i, dtype, folder, case in pending_ref:
            ok, why = results[dtype].get(folder, (False, "no result from kiln check"))
            refused = "differentiating" in (why or "") and case.gap
            rows[i][5] = "pass" if ok else "not taken" if refused else "FAIL"
            if refused and rows[i][6]:
                continue
            if not ok:
                rows[i][6] = (rows[i][6] + "; " if rows[i][6] else "") + f"ref: {why}"[:300]

    failures = sum(1 for r in rows if "FAIL" in r[4:6] or "ERROR" in r[4:6]
                   or r[7].endswith("FAIL"))
    refused = sum(1 for r in rows if "not taken" in r[4:6])
    header = ["case", "kiln", "max abs diff", "max rel diff", "cpu"]
    if "ref" in devices:
        header.append("ref")
    header += ["torch fwd vs onnx.reference", "note"]
    table = [[r[0], r[1], r[2], r[3], r[4]] + ([r[5]] if "ref" in devices else []) + [r[7], r[6]]
             for r in rows]
    if "cpu" not in devices:
        for r in table:
            r[2] = r[3] = r[4] = "-"
    if args.markdown:
        print(summary(rows, devices))
        print()
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in table:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        widths = [max(len(str(r[i])) for r in table + [header]) for i in range(len(header) - 1)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
        print(fmt.format(*header))
        for r in table:
            print(fmt.format(*[str(c) for c in r]))
    print(f"\nPyTorch {torch.__version__}, onnx {onnx.__version__}; tolerances: "
          + ", ".join(f"{dt} rtol {r:g} atol {a:g}" for dt, (r, a) in TOL.items())
          + f" (PyTorch's forward against onnx.reference: rtol {FWD_TOL[0]:g} atol {FWD_TOL[1]:g})"
          + f"; {len(cases)} cases, {len(rows)} runs (case x element type), {failures} failed"
          + (f", {refused} refused where the rule table has a gap" if refused else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
