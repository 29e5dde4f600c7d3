"""Four models for `make bench` beside ../shared/models, written with onnx.helper (no PyTorch
needed) in the op forms PyTorch's dynamo exporter writes (opset 18, f32, static shapes, batch
norms folded into the convolutions before them), at seeded random weights:

  squeezenet1_1    torchvision's SqueezeNet 1.1, 1x3x224x224 -> 1x1000
  yolov8n_320      Ultralytics' YOLOv8n (backbone, C2f, SPPF, PAN neck, the three-scale detect
                   head with DFL and box decoding as `yolo export format=onnx` writes it),
                   1x3x320x320 -> 1x84x2100
  dbnet_mv3_640    a DBNet text detector as PaddleOCR's det_mv3_db (MobileNetV3-large x0.5
                   backbone with squeeze-excite, the DB FPN of 256 channels, the DB head's
                   probability map), 1x3x640x640 -> 1x1x640x640
  bert_tiny_128    BERT-tiny's encoder (2 layers, hidden 128, 2 heads, feed-forward 512) on 128
                   tokens' embeddings, 1x128x128 -> 1x128x128

Each goes to OUT/<name>/model.onnx with OUT/<name>/test_data_set_0/{input_0,output_0}.pb (a seeded
standard-normal input and onnxruntime's output for it, graph optimizations off), the layout of
../shared/models. A model whose OUT/<name>/.version holds this script's VERSION is kept.

    python bench_models.py OUT_DIR [NAME...]   --stats: print nodes, parameters and MACs
                                               --torchvision: also resnet18_dynamo_op18 and
                                               mobilenet_v2_dynamo_op18, exported by PyTorch
"""

import argparse
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Bump when a model or its test data changes: cached copies with another marker are rewritten.
VERSION = "1"
OPSET = 18


class Graph:
    """A graph under construction: nodes, initializers, unique names, seeded weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.outputs: list = []
        self.used: set = set()

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def const(self, name: str, array) -> str:
        name = self.fresh(name)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs, name: str, n_out: int = 1, **attrs):
        outs = [self.fresh(f"{name}" if n_out == 1 else f"{name}_{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh("node_" + name), **attrs))
        return outs[0] if n_out == 1 else outs

    def input(self, name: str, shape) -> str:
        self.used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def output(self, x: str, name: str, shape) -> None:
        # The last node writes the graph's output under its name, as exporters name it.
        for node in self.nodes:
            for i, o in enumerate(node.output):
                if o == x:
                    node.output[i] = name
            for i, o in enumerate(node.input):
                if o == x:
                    node.input[i] = name
        self.used.add(name)
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))

    # Layers. Weights: He-normal over the fan-in, so activations keep their scale through depth;
    # biases (batch norms folded into the convolution) small and random.
    def conv(self, x, cin, cout, k, s=1, p=None, g=1, bias=True, name="conv", gain=2.0):
        p = k // 2 if p is None else p
        fan_in = cin // g * k * k
        w = (self.rng.standard_normal((cout, cin // g, k, k)) * np.sqrt(gain / fan_in)).astype(np.float32)
        ins = [x, self.const(f"{name}.weight", w)]
        if bias:
            ins.append(self.const(f"{name}.bias", (self.rng.standard_normal(cout) * 0.1).astype(np.float32)))
        return self.op("Conv", ins, name, kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p],
                       dilations=[1, 1], group=g)

    def conv_transpose(self, x, cin, cout, k, s, name="deconv", gain=2.0):
        # A 2x2/2 transposed convolution: each output pixel sees one pixel of each input channel.
        w = (self.rng.standard_normal((cin, cout, k, k)) * np.sqrt(gain / cin)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
        return self.op("ConvTranspose", [x, self.const(f"{name}.weight", w), self.const(f"{name}.bias", b)], name,
                       kernel_shape=[k, k], strides=[s, s], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)

    def relu(self, x, name="relu"):
        return self.op("Relu", [x], name)

    def silu(self, x, name="silu"):
        # aten.silu as the dynamo exporter writes it.
        return self.op("Mul", [x, self.op("Sigmoid", [x], name + "_sigmoid")], name)

    def maxpool(self, x, k, s, p=0, ceil=False, name="max_pool2d"):
        return self.op("MaxPool", [x], name, kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p],
                       dilations=[1, 1], ceil_mode=int(ceil))

    def upsample(self, x, factor, name="upsample_nearest2d"):
        scales = self.const("val_scales", np.array([1, 1, factor, factor], np.float32))
        return self.op("Resize", [x, "", scales], name, mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")

    def concat(self, xs, axis=1, name="cat"):
        return self.op("Concat", xs, name, axis=axis)

    def mean_hw(self, x, name="mean"):
        return self.op("ReduceMean", [x, self.const("val_axes", np.array([-1, -2], np.int64))], name,
                       keepdims=1, noop_with_empty_axes=0)

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="kiln scripts/bench_models.py", producer_version=VERSION)
        m.ir_version = 10
        onnx.checker.check_model(m, full_check=True)
        return m


# --- SqueezeNet 1.1 (torchvision.models.squeezenet1_1) --------------------------------------------


def squeezenet1_1() -> onnx.ModelProto:
    g = Graph(seed=11)
    x = g.input("input", [1, 3, 224, 224])
    x = g.relu(g.conv(x, 3, 64, 3, s=2, p=0, name="features.0"))
    x = g.maxpool(x, 3, 2, ceil=True)

    def fire(x, idx, cin, squeeze, e1, e3):
        s = g.relu(g.conv(x, cin, squeeze, 1, name=f"features.{idx}.squeeze"))
        a = g.relu(g.conv(s, squeeze, e1, 1, name=f"features.{idx}.expand1x1"))
        b = g.relu(g.conv(s, squeeze, e3, 3, p=1, name=f"features.{idx}.expand3x3"))
        return g.concat([a, b])

    x = fire(x, 3, 64, 16, 64, 64)
    x = fire(x, 4, 128, 16, 64, 64)
    x = g.maxpool(x, 3, 2, ceil=True)
    x = fire(x, 6, 128, 32, 128, 128)
    x = fire(x, 7, 256, 32, 128, 128)
    x = g.maxpool(x, 3, 2, ceil=True)
    x = fire(x, 9, 256, 48, 192, 192)
    x = fire(x, 10, 384, 48, 192, 192)
    x = fire(x, 11, 384, 64, 256, 256)
    x = fire(x, 12, 512, 64, 256, 256)
    # classifier: Dropout (an identity in eval), the final 1x1 convolution, ReLU, the average pool.
    x = g.relu(g.conv(x, 512, 1000, 1, name="classifier.1", gain=1.0))
    x = g.mean_hw(x)
    x = g.op("Reshape", [x, g.const("val_shape", np.array([1, 1000], np.int64))], "view")
    g.output(x, "output", [1, 1000])
    return g.model("squeezenet1_1")


# --- YOLOv8n (ultralytics yolov8.yaml at scale n: depth 0.33, width 0.25) ------------------------


def yolov8n(size: int = 320) -> onnx.ModelProto:
    g = Graph(seed=8)
    x = g.input("images", [1, 3, size, size])

    def conv(x, cin, cout, k=1, s=1, name="conv"):  # Conv2d + folded BatchNorm2d + SiLU
        return g.silu(g.conv(x, cin, cout, k, s, name=f"{name}.conv"), name=f"{name}.act")

    def bottleneck(x, c, shortcut, name):
        y = conv(conv(x, c, c, 3, name=f"{name}.cv1"), c, c, 3, name=f"{name}.cv2")
        return g.op("Add", [x, y], f"{name}.add") if shortcut else y

    def c2f(x, c1, c2, n, shortcut, name):
        c = c2 // 2
        y = conv(x, c1, 2 * c, 1, name=f"{name}.cv1")
        ys = list(g.op("Split", [y, g.const("val_split", np.array([c, c], np.int64))], f"{name}.split", n_out=2, axis=1))
        for i in range(n):
            ys.append(bottleneck(ys[-1], c, shortcut, f"{name}.m.{i}"))
        return conv(g.concat(ys, name=f"{name}.cat"), (2 + n) * c, c2, 1, name=f"{name}.cv2")

    def sppf(x, c1, c2, name):
        c = c1 // 2
        ys = [conv(x, c1, c, 1, name=f"{name}.cv1")]
        for i in range(3):
            ys.append(g.maxpool(ys[-1], 5, 1, p=2, name=f"{name}.m_{i}"))
        return conv(g.concat(ys, name=f"{name}.cat"), 4 * c, c2, 1, name=f"{name}.cv2")

    # backbone
    x = conv(x, 3, 16, 3, 2, "model.0")
    x = conv(x, 16, 32, 3, 2, "model.1")
    x = c2f(x, 32, 32, 1, True, "model.2")
    x = conv(x, 32, 64, 3, 2, "model.3")
    p3 = c2f(x, 64, 64, 2, True, "model.4")
    x = conv(p3, 64, 128, 3, 2, "model.5")
    p4 = c2f(x, 128, 128, 2, True, "model.6")
    x = conv(p4, 128, 256, 3, 2, "model.7")
    x = c2f(x, 256, 256, 1, True, "model.8")
    p5 = sppf(x, 256, 256, "model.9")
    # neck
    x = g.concat([g.upsample(p5, 2, "model.10"), p4], name="model.11")
    h12 = c2f(x, 384, 128, 1, False, "model.12")
    x = g.concat([g.upsample(h12, 2, "model.13"), p3], name="model.14")
    h15 = c2f(x, 192, 64, 1, False, "model.15")
    x = g.concat([conv(h15, 64, 64, 3, 2, "model.16"), h12], name="model.17")
    h18 = c2f(x, 192, 128, 1, False, "model.18")
    x = g.concat([conv(h18, 128, 128, 3, 2, "model.19"), p5], name="model.20")
    h21 = c2f(x, 384, 256, 1, False, "model.21")

    # Detect(nc=80, ch=(64, 128, 256)): reg_max 16, box branch 64 wide, class branch 80 wide.
    nc, reg_max = 80, 16
    no = nc + 4 * reg_max
    c2, c3 = max(16, 64 // 4, reg_max * 4), max(64, min(nc, 100))
    levels = []
    anchors, strides = [], []
    for i, (feat, ch, stride) in enumerate([(h15, 64, 8), (h18, 128, 16), (h21, 256, 32)]):
        b = conv(conv(feat, ch, c2, 3, name=f"model.22.cv2.{i}.0"), c2, c2, 3, name=f"model.22.cv2.{i}.1")
        b = g.conv(b, c2, 4 * reg_max, 1, name=f"model.22.cv2.{i}.2", gain=1.0)
        c = conv(conv(feat, ch, c3, 3, name=f"model.22.cv3.{i}.0"), c3, c3, 3, name=f"model.22.cv3.{i}.1")
        c = g.conv(c, c3, nc, 1, name=f"model.22.cv3.{i}.2", gain=1.0)
        y = g.concat([b, c], name=f"model.22.cat_{i}")
        h = w = size // stride
        levels.append(g.op("Reshape", [y, g.const("val_shape", np.array([1, no, -1], np.int64))], f"model.22.view_{i}"))
        # make_anchors(offset=0.5): cell centres, x fastest; exported as constants.
        sy, sx = np.meshgrid(np.arange(h, dtype=np.float32) + 0.5, np.arange(w, dtype=np.float32) + 0.5, indexing="ij")
        anchors.append(np.stack([sx, sy], -1).reshape(-1, 2))
        strides.append(np.full((h * w, 1), stride, np.float32))
    a = sum(len(s) for s in strides)
    x_cat = g.concat(levels, axis=2, name="model.22.cat")
    box, cls = g.op("Split", [x_cat, g.const("val_split", np.array([4 * reg_max, nc], np.int64))], "model.22.split",
                    n_out=2, axis=1)
    # DFL: softmax over the 16 bins, then a fixed 1x1 convolution by arange(16) (their expectation).
    d = g.op("Reshape", [box, g.const("val_shape", np.array([1, 4, reg_max, a], np.int64))], "model.22.dfl.view")
    d = g.op("Transpose", [d], "model.22.dfl.transpose", perm=[0, 2, 1, 3])
    d = g.op("Softmax", [d], "model.22.dfl.softmax", axis=1)
    dfl_w = np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1)
    d = g.op("Conv", [d, g.const("model.22.dfl.conv.weight", dfl_w)], "model.22.dfl.conv", kernel_shape=[1, 1],
             strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    d = g.op("Reshape", [d, g.const("val_shape", np.array([1, 4, a], np.int64))], "model.22.dfl.view_1")
    # dist2bbox(xywh=True): lt, rb = chunk(2); centre and size, times the stride.
    lt, rb = g.op("Split", [d, g.const("val_split", np.array([2, 2], np.int64))], "model.22.chunk", n_out=2, axis=1)
    anchor = g.const("model.22.anchors", np.concatenate(anchors).T[None].copy())
    x1y1 = g.op("Sub", [anchor, lt], "model.22.sub")
    x2y2 = g.op("Add", [anchor, rb], "model.22.add")
    c_xy = g.op("Div", [g.op("Add", [x1y1, x2y2], "model.22.add_1"), g.const("val_two", np.array(2.0, np.float32))],
                "model.22.div")
    wh = g.op("Sub", [x2y2, x1y1], "model.22.sub_1")
    dbox = g.op("Mul", [g.concat([c_xy, wh], name="model.22.cat_1"),
                        g.const("model.22.strides", np.concatenate(strides).T.copy())], "model.22.mul")
    y = g.concat([dbox, g.op("Sigmoid", [cls], "model.22.sigmoid")], name="model.22.cat_2")
    g.output(y, "output0", [1, 4 + nc, a])
    return g.model("yolov8n")


# --- DBNet (PaddleOCR det_mv3_db: MobileNetV3-large x0.5, DBFPN 256, DBHead) ---------------------


def make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def dbnet_mv3(size: int = 640) -> onnx.ModelProto:
    g = Graph(seed=640)
    x = g.input("x", [1, 3, size, size])
    scale = 0.5

    def act(x, kind, name):
        if kind == "relu":
            return g.relu(x, name)
        if kind == "hardswish":
            return g.op("HardSwish", [x], name)
        return x

    def conv_bn(x, cin, cout, k, s=1, groups=1, kind=None, name="conv"):
        y = g.conv(x, cin, cout, k, s, g=groups, name=f"{name}.conv", gain=2.0 if kind else 1.0)
        return act(y, kind, f"{name}.act")

    def se(x, c, name):
        # AdaptiveAvgPool2D(1), 1x1 conv to c/4, ReLU, 1x1 conv back, hardsigmoid(0.2, 0.5), scale.
        s = g.mean_hw(x, f"{name}.avg_pool")
        s = g.relu(g.conv(s, c, c // 4, 1, name=f"{name}.conv1"), f"{name}.relu")
        s = g.conv(s, c // 4, c, 1, name=f"{name}.conv2", gain=1.0)
        s = g.op("HardSigmoid", [s], f"{name}.hardsigmoid", alpha=0.2, beta=0.5)
        return g.op("Mul", [x, s], f"{name}.mul")

    def residual(x, cin, mid, cout, k, s, use_se, kind, name):
        y = conv_bn(x, cin, mid, 1, kind=kind, name=f"{name}.expand_conv")
        y = conv_bn(y, mid, mid, k, s, groups=mid, kind=kind, name=f"{name}.bottleneck_conv")
        if use_se:
            y = se(y, mid, f"{name}.mid_se")
        y = conv_bn(y, mid, cout, 1, name=f"{name}.linear_conv")
        return g.op("Add", [x, y], f"{name}.add") if cin == cout and s == 1 else y

    # k, exp, c, se, act, s (MobileNetV3-large)
    cfg = [
        (3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
        (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
        (3, 240, 80, False, "hardswish", 2), (3, 200, 80, False, "hardswish", 1),
        (3, 184, 80, False, "hardswish", 1), (3, 184, 80, False, "hardswish", 1),
        (3, 480, 112, True, "hardswish", 1), (3, 672, 112, True, "hardswish", 1),
        (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1),
        (5, 960, 160, True, "hardswish", 1),
    ]
    inplanes = make_divisible(16 * scale)
    x = conv_bn(x, 3, inplanes, 3, 2, kind="hardswish", name="backbone.conv")
    feats, chans = [], []
    for i, (k, exp, c, use_se, kind, s) in enumerate(cfg):
        if s == 2 and i > 2:
            feats.append(x)
            chans.append(inplanes)
        out = make_divisible(scale * c)
        x = residual(x, inplanes, make_divisible(scale * exp), out, k, s, use_se, kind, f"backbone.blocks.{i}")
        inplanes = out
    last = make_divisible(scale * 960)
    feats.append(conv_bn(x, inplanes, last, 1, kind="hardswish", name="backbone.last_conv"))
    chans.append(last)  # [16, 24, 56, 480] at 1/4, 1/8, 1/16, 1/32

    # DBFPN(out_channels=256)
    oc = 256
    in2, in3, in4, in5 = (g.conv(f, ch, oc, 1, bias=False, name=f"neck.in{j}_conv", gain=1.0)
                          for j, (f, ch) in zip((2, 3, 4, 5), zip(feats, chans)))
    out4 = g.op("Add", [in4, g.upsample(in5, 2, "neck.up5")], "neck.out4")
    out3 = g.op("Add", [in3, g.upsample(out4, 2, "neck.up4")], "neck.out3")
    out2 = g.op("Add", [in2, g.upsample(out3, 2, "neck.up3")], "neck.out2")
    p5 = g.upsample(g.conv(in5, oc, oc // 4, 3, bias=False, name="neck.p5_conv", gain=1.0), 8, "neck.p5_up")
    p4 = g.upsample(g.conv(out4, oc, oc // 4, 3, bias=False, name="neck.p4_conv", gain=1.0), 4, "neck.p4_up")
    p3 = g.upsample(g.conv(out3, oc, oc // 4, 3, bias=False, name="neck.p3_conv", gain=1.0), 2, "neck.p3_up")
    p2 = g.conv(out2, oc, oc // 4, 3, bias=False, name="neck.p2_conv", gain=1.0)
    fuse = g.concat([p5, p4, p3, p2], name="neck.fuse")

    # DBHead binarize branch (the shrink map; inference returns it alone).
    h = g.relu(g.conv(fuse, oc, oc // 4, 3, name="head.binarize.conv1"), "head.binarize.relu1")
    h = g.relu(g.conv_transpose(h, oc // 4, oc // 4, 2, 2, name="head.binarize.conv2"), "head.binarize.relu2")
    h = g.op("Sigmoid", [g.conv_transpose(h, oc // 4, 1, 2, 2, name="head.binarize.conv3", gain=1.0)], "head.binarize.sigmoid")
    g.output(h, "maps", [1, 1, size, size])
    return g.model("dbnet_mv3")


# --- BERT-tiny (google/bert_uncased_L-2_H-128_A-2) -----------------------------------------------


def bert_tiny(seq: int = 128, hidden: int = 128, heads: int = 2, ffn: int = 512, layers: int = 2) -> onnx.ModelProto:
    """BERT-tiny's encoder on its embeddings (the token lookup left out: the input is the summed
    embeddings, 1 x seq x hidden), post-norm layers as Hugging Face's export writes them: Q, K and
    V products with biases, heads by Reshape and Transpose, softmax attention, the output
    projection and residual LayerNorm, an Erf GELU feed-forward block. The products by constants
    are what onnxruntime's quantize_dynamic quantizes (scripts/quantize_bench_models.py)."""
    g = Graph(seed=7)
    d = hidden // heads

    def linear(x, cin, cout, name):
        w = (g.rng.standard_normal((cin, cout)) * np.sqrt(1.0 / cin)).astype(np.float32)
        b = (g.rng.standard_normal(cout) * 0.02).astype(np.float32)
        y = g.op("MatMul", [x, g.const(f"{name}.weight", w)], name)
        return g.op("Add", [y, g.const(f"{name}.bias", b)], name + "_bias")

    def layer_norm(x, name):
        ones, zeros = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
        return g.op("LayerNormalization", [x, g.const(f"{name}.weight", ones), g.const(f"{name}.bias", zeros)],
                    name, axis=-1, epsilon=1e-12)

    heads_shape = g.const("val_heads", np.array([1, seq, heads, d], np.int64))
    flat_shape = g.const("val_flat", np.array([1, seq, hidden], np.int64))
    x = layer_norm(g.input("embeddings", [1, seq, hidden]), "embeddings.LayerNorm")
    for i in range(layers):
        p = f"layer.{i}"
        q, k, v = (g.op("Reshape", [linear(x, hidden, hidden, f"{p}.{n}"), heads_shape], f"{p}.{n}_heads")
                   for n in ("query", "key", "value"))
        q = g.op("Transpose", [q], f"{p}.q_t", perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], f"{p}.k_t", perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], f"{p}.v_t", perm=[0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k], f"{p}.scores"), g.const("val_sqrt_d", np.array(np.sqrt(d), np.float32))],
                      f"{p}.scaled")
        probs = g.op("Softmax", [scores], f"{p}.probs", axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v], f"{p}.context")], f"{p}.context_t", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, flat_shape], f"{p}.context_flat")
        x = layer_norm(g.op("Add", [linear(ctx, hidden, hidden, f"{p}.output"), x], f"{p}.residual"), f"{p}.LayerNorm")
        h = linear(x, hidden, ffn, f"{p}.intermediate")
        erf = g.op("Erf", [g.op("Div", [h, g.const("val_sqrt2", np.array(np.sqrt(2.0), np.float32))], f"{p}.gelu_div")],
                   f"{p}.gelu_erf")
        one, half = g.const("val_one", np.array(1.0, np.float32)), g.const("val_half", np.array(0.5, np.float32))
        h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, one], f"{p}.gelu_add")], f"{p}.gelu_mul"), half], f"{p}.gelu")
        y = linear(h, ffn, hidden, f"{p}.ffn_output")
        x = layer_norm(g.op("Add", [y, x], f"{p}.ffn_residual"), f"{p}.ffn_LayerNorm")
    g.output(x, "last_hidden_state", [1, seq, hidden])
    return g.model("bert_tiny")


MODELS = {
    "squeezenet1_1": squeezenet1_1,
    "yolov8n_320": lambda: yolov8n(320),
    "dbnet_mv3_640": lambda: dbnet_mv3(640),
    "bert_tiny_128": bert_tiny,
}


def stats(model: onnx.ModelProto) -> tuple:
    """(nodes, parameters, multiply-accumulates) of a model, the MACs of its convolutions and
    matrix products from inferred shapes (those whose shapes are not inferred are left out)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes.update(inits)
    params = sum(int(np.prod(d)) for d in inits.values())
    macs = 0
    for n in model.graph.node:
        a, w, y = (shapes.get(n.input[0]), shapes.get(n.input[1]) if len(n.input) > 1 else None,
                   shapes.get(n.output[0]))
        if not a or not w or not y:
            continue
        if n.op_type == "Conv":
            macs += int(np.prod(y)) * int(np.prod(w[1:]))
        elif n.op_type == "ConvTranspose":
            macs += int(np.prod(a)) * int(np.prod(w[1:]))
        elif n.op_type == "MatMul":
            macs += int(np.prod(y)) * a[-1]
        elif n.op_type == "Gemm":
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            macs += int(np.prod(y)) * (a[0] if trans_a else a[-1])
    return len(model.graph.node), params, macs


def torchvision_export(ctor):
    """A torchvision model at random weights, exported by PyTorch's dynamo exporter as the shared
    models were (opset 18, 1x3x224x224), or by the TorchScript exporter if that fails."""

    def build(path: str) -> None:
        import torch

        torch.manual_seed(0)
        model = ctor(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        names = dict(input_names=["input"], output_names=["output"])
        try:
            torch.onnx.export(model, (x,), path, dynamo=True, opset_version=OPSET, external_data=False, **names)
        except Exception as e:  # an older PyTorch or a failing dynamo export
            print(f"bench_models: dynamo export failed ({type(e).__name__}: {e}); using the TorchScript exporter",
                  file=sys.stderr)
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=OPSET, **names)

    return build


def torchvision_models() -> dict:
    import torchvision

    return {"resnet18_dynamo_op18": torchvision_export(torchvision.models.resnet18),
            "mobilenet_v2_dynamo_op18": torchvision_export(torchvision.models.mobilenet_v2)}


def write(name: str, out_dir: str, build) -> str:
    """Writes OUT/NAME/model.onnx (build(path) writes it) and its test data, unless the folder's
    version marker says it is there already."""
    import onnxruntime as ort

    folder = os.path.join(out_dir, name)
    marker = os.path.join(folder, ".version")
    if os.path.isfile(marker) and open(marker).read().strip() == VERSION and \
            os.path.isfile(os.path.join(folder, "test_data_set_0", "output_0.pb")):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "test_data_set_0"))
    path = os.path.join(folder, "model.onnx")
    build(path)
    model = onnx.load(path)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(2024).standard_normal(shape).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {inp.name: x})
    data = os.path.join(folder, "test_data_set_0")
    onnx.save_tensor(numpy_helper.from_array(x, inp.name), os.path.join(data, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(y, model.graph.output[0].name), os.path.join(data, "output_0.pb"))
    with open(marker, "w") as f:
        f.write(VERSION + "\n")
    n, p, m = stats(model)
    print(f"bench_models: wrote {folder} ({n} nodes, {p / 1e6:.2f} M parameters, {m / 1e9:.2f} GMACs; "
          f"output {list(y.shape)}, mean {float(y.mean()):.4g}, std {float(y.std()):.4g})", file=sys.stderr)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("names", nargs="*", help=f"a subset of {', '.join(MODELS)}")
    ap.add_argument("--stats", action="store_true", help="print each model's nodes, parameters and MACs")
    ap.add_argument("--torchvision", action="store_true",
                    help="also export torchvision's resnet18 and mobilenet_v2 (needs PyTorch and torchvision)")
    args = ap.parse_intermixed_args()
    builders = {name: (lambda path, f=f: onnx.save(f(), path)) for name, f in MODELS.items()}
    if args.torchvision:
        try:
            builders.update(torchvision_models())
        except ImportError as e:
            print(f"bench_models: no torchvision models ({e})", file=sys.stderr)
    names = args.names or list(builders)
    for name in names:
        if name not in builders:
            sys.exit(f"bench_models: no model {name!r} (known: {', '.join(builders)})")
    os.makedirs(args.out_dir, exist_ok=True)
    for name in names:
        try:
            folder = write(name, args.out_dir, builders[name])
        except Exception as e:
            if name in MODELS:
                raise
            print(f"bench_models: could not export {name}: {type(e).__name__}: {e}", file=sys.stderr)
            shutil.rmtree(os.path.join(args.out_dir, name), ignore_errors=True)
            continue
        if args.stats:
            n, p, m = stats(onnx.load(os.path.join(folder, "model.onnx")))
            print(f"{name:24} {n:5d} nodes {p / 1e6:7.2f} M parameters {m / 1e9:7.3f} GMACs")


if __name__ == "__main__":
    main()
