"""PyTorch on the same GPU, for the models in ../shared/models: the same architectures and input
shapes (weights random: timing depends on shapes, not values). Eager (TF32 off, as PyTorch's
matmul default and kiln's f32; and TF32 on, as kiln's --precision tf32) and torch.compile, median
of CUDA-event-timed runs after warm-up.

    python3 scripts/gpu/torch_baselines.py [--iters N] [--json OUT.json] [NAME...]

Runs on the GPU machine (PyTorch and torchvision are installed there); prints a table.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return F.softmax(self.net(x), dim=-1)


class CifarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, d=128, heads=4, hidden=512):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + mask
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        h = self.fc(self.ln2(x))
        h = 0.5 * h * (1.0 + torch.tanh(0.7978846 * (h + 0.044715 * h.pow(3))))
        return x + self.out(h)


class Gpt(nn.Module):
    def __init__(self, vocab=1000, d=128, seq=32, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(1, seq, d))
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe
        for layer in self.layers:
            x = layer(x, self.mask)
        return self.head(self.ln(x))


class TwoGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.g1, self.g2 = nn.GRU(10, 20, batch_first=True), nn.GRU(10, 20, batch_first=True)

    def forward(self, x1, x2):
        o1, h1 = self.g1(x1)
        o2, h2 = self.g2(x2)
        return o1, h1, o2, h2


class MatmulNorms(nn.Module):
    def __init__(self, steps=16):
        super().__init__()
        self.w, self.steps = nn.Parameter(torch.randn(100, 100) * 0.1), steps

    def forward(self, x):
        norms = []
        for _ in range(self.steps):
            x = torch.tanh(x @ self.w)
            norms.append(torch.linalg.vector_norm(x))
        return x, torch.stack(norms)


def models():
    import torchvision

    f32 = lambda *s: torch.randn(*s)
    return {
        "mlp_dynamo_op18": (Mlp, [f32(1, 1, 28, 28)]),
        "resnet18_dynamo_op18": (lambda: torchvision.models.resnet18(), [f32(1, 3, 224, 224)]),
        "mobilenet_v2_dynamo_op18": (lambda: torchvision.models.mobilenet_v2(), [f32(1, 3, 224, 224)]),
        "gpt_block_dynamo_op18": (Gpt, [torch.randint(0, 1000, (1, 32))]),
        "seed_cifarnet_b4_dynamo_op18": (CifarNet, [f32(4, 3, 32, 32)]),
        "seed_cifarnet_b64_dynamo_op18": (CifarNet, [f32(64, 3, 32, 32)]),
        "seed_two_gru_dynamo_op18": (TwoGru, [f32(32, 5, 10), f32(32, 5, 10)]),
        "seed_matmul_norms_dynamo_op18": (MatmulNorms, [f32(100, 100)]),
    }


def time_ms(fn, inputs, iters):
    with torch.no_grad():
        for _ in range(10):
            fn(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("names", nargs="*")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--json")
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: PyTorch sees no CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    results = {}
    for name, (make, inputs) in models().items():
        if a.names and name not in a.names:
            continue
        m = make().cuda().eval()
        x = [t.cuda() for t in inputs]
        # f32 as kiln's default computes it (TF32 off), then with TF32 on (kiln's --precision tf32).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        r = {"eager_ms": time_ms(m, x, a.iters)}
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        r["eager_tf32_ms"] = time_ms(m, x, a.iters)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if not a.no_compile:
            try:
                r["compiled_ms"] = time_ms(torch.compile(m), x, a.iters)
            except Exception as e:  # torch.compile may not support every model/version
                r["compiled_error"] = str(e).splitlines()[0][:200]
        results[name] = r
        print(f"{name:34} eager {r['eager_ms']:.4f} ms (TF32 {r['eager_tf32_ms']:.4f})  compiled {r.get('compiled_ms', float('nan')):.4f} ms", flush=True)
        if a.json:  # after every model, so a run cut short by its time limit keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "models": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
