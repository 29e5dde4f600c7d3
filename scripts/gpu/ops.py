"""Single ops on the GPU: kiln against PyTorch on the same GPU, in one run (issue "GPU speed").

    python3 scripts/gpu/ops.py --kiln /tmp/kiln [--iters N] [--json OUT.json] [--only NAME...]

For each op (the issue's table: MatMul 4096^3, the ResNet convolutions, ReduceL2 to a scalar,
Softmax, LayerNorm, a depthwise convolution) and each precision it is measured at, this writes
the op as an ONNX model with random weights, runs it through `kiln run --device cuda` on random
inputs and checks the result against PyTorch's f32 result in float64, times it with `kiln bench
--device cuda --json` (the device time of the kernels, without the input and output copies, where
kiln reports it; else the wall time of a run), and times the same op in PyTorch (CUDA events,
median of --iters after warm-up): f32 with TF32 off, with TF32 on, and bf16 where the op is a
contraction. Prints a markdown table (docs/gpu.md takes it as it is) and writes JSON.

Needs, on the GPU machine: numpy, onnx, torch (CUDA). Nothing here runs in CI.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def onnx_model(path, nodes, inputs, outputs, inits):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    g = helper.make_graph(
        nodes,
        os.path.basename(path),
        [vi(n, s) for n, s in inputs],
        [vi(n, s) for n, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(m, path)


def ops():
    """(name, build(dir, rng) -> (model path, {input: array}, torch fn(inputs, dtype) -> out,
    flops, bytes), precisions kiln is measured at, torch modes)."""
    from onnx import helper

    out = []

    def matmul(n):
        def build(d, rng):
            a = rng.standard_normal((n, n), dtype=np.float32)
            b = rng.standard_normal((n, n), dtype=np.float32)
            path = os.path.join(d, f"matmul{n}.onnx")
            onnx_model(path, [helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [n, n]), ("b", [n, n])], [("y", [n, n])], {})
            return path, {"a": a, "b": b}, lambda t, x: x["a"] @ x["b"], 2 * n**3, 3 * 4 * n * n

        return build

    def conv(x, co, k, stride, pad, group=1):
        def build(d, rng):
            xs = rng.standard_normal(x, dtype=np.float32)
            w = rng.standard_normal((co, x[1] // group, k, k), dtype=np.float32) * 0.1
            b = rng.standard_normal((co,), dtype=np.float32)
            oh = (x[2] + 2 * pad - k) // stride + 1
            ow = (x[3] + 2 * pad - k) // stride + 1
            path = os.path.join(d, f"conv_{x[0]}_{x[1]}_{x[2]}_{co}_{k}_{stride}_{group}.onnx")
            node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride] * 2, pads=[pad] * 4, group=group)
            onnx_model(path, [node], [("x", list(x))], [("y", [x[0], co, oh, ow])], {"w": w, "b": b})

            def fn(t, v):
                return t.nn.functional.conv2d(v["x"], v["w"], v["b"], stride=stride, padding=pad, groups=group)

            flops = 2 * x[0] * co * oh * ow * (x[1] // group) * k * k
            return path, {"x": xs}, fn, flops, 4 * (xs.size + w.size + x[0] * co * oh * ow), {"w": w, "b": b}

        return build

    out.append(("MatMul 4096 x 4096 x 4096", matmul(4096), ["f32", "tf32", "bf16"]))
    out.append(("Conv 3x3, 64->64, 56x56, batch 1", conv((1, 64, 56, 56), 64, 3, 1, 1), ["f32", "tf32"]))
    out.append(("Conv 3x3, 64->64, 56x56, batch 32", conv((32, 64, 56, 56), 64, 3, 1, 1), ["f32", "tf32"]))
    out.append(("Conv 7x7 stride 2, 3->64, 224x224 (stem)", conv((1, 3, 224, 224), 64, 7, 2, 3), ["f32", "tf32"]))
    out.append(("Conv 1x1, 256->64, 56x56", conv((1, 256, 56, 56), 64, 1, 1, 0), ["f32", "tf32"]))
    out.append(("Depthwise 3x3, 144 channels, 56x56", conv((1, 144, 56, 56), 144, 3, 1, 1, 144), ["f32"]))

    def reduce_l2(d, rng):
        x = rng.standard_normal((4096, 4096), dtype=np.float32)
        path = os.path.join(d, "reducel2.onnx")
        onnx_model(path, [helper.make_node("ReduceL2", ["x"], ["y"], keepdims=0)], [("x", [4096, 4096])], [("y", [])], {})
        return path, {"x": x}, lambda t, v: t.linalg.vector_norm(v["x"]), 2 * x.size, 4 * x.size

    def softmax(d, rng):
        shape = [32, 12, 128, 128]
        x = rng.standard_normal(shape, dtype=np.float32)
        path = os.path.join(d, "softmax.onnx")
        onnx_model(path, [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", shape)], [("y", shape)], {})
        return path, {"x": x}, lambda t, v: t.softmax(v["x"], -1), 0, 8 * x.size

    def layer_norm(d, rng):
        shape = [32, 128, 768]
        x = rng.standard_normal(shape, dtype=np.float32)
        s = rng.standard_normal((768,), dtype=np.float32)
        b = rng.standard_normal((768,), dtype=np.float32)
        path = os.path.join(d, "layernorm.onnx")
        node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)
        onnx_model(path, [node], [("x", shape)], [("y", shape)], {"s": s, "b": b})

        def fn(t, v):
            return t.nn.functional.layer_norm(v["x"], (768,), v["s"], v["b"], 1e-5)

        return path, {"x": x}, fn, 0, 8 * x.size, {"s": s, "b": b}

    out.append(("ReduceL2 of 4096 x 4096 to a scalar", reduce_l2, ["f32"]))
    out.append(("Softmax over the last axis of [32, 12, 128, 128]", softmax, ["f32"]))
    out.append(("LayerNorm over 768 of [32, 128, 768]", layer_norm, ["f32"]))
    return out


def torch_time(fn, inputs, iters, mode):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    x = {k: torch.from_numpy(v).cuda().to(dtype) for k, v in inputs.items()}
    with torch.no_grad():
        for _ in range(5):
            fn(torch, x)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(torch, x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return float(np.median(times))


def torch_reference(fn, inputs):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = {k: torch.from_numpy(v).cuda().double() for k, v in inputs.items()}
    with torch.no_grad():
        return fn(torch, x).cpu().numpy()


def kiln_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    import torch

    device = torch.cuda.get_device_name(0)
    print(f"device: {device}; PyTorch {torch.__version__}", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, build, precisions in ops():
            if args.only and not any(o.lower() in name.lower() for o in args.only):
                continue
            built = build(d, rng)
            path, inputs, fn, flops, nbytes = built[:5]
            consts = built[5] if len(built) > 5 else {}
            # The torch functions read weights from the same dict as inputs.
            everything = {**inputs, **consts}
            ref = torch_reference(fn, everything)
            feeds = []
            for k, v in inputs.items():
                p = os.path.join(d, f"{k}.npy")
                np.save(p, v)
                feeds += ["--input", f"{k}={p}"]
            t = {m: torch_time(fn, everything, args.iters, m) for m in (["f32", "tf32", "bf16"] if "bf16" in precisions else ["f32", "tf32"])}
            for p in precisions:
                row = {"op": name, "precision": p, "torch_f32_ms": t["f32"], "torch_tf32_ms": t["tf32"], "torch_bf16_ms": t.get("bf16")}
                try:
                    outdir = os.path.join(d, f"out_{p}")
                    os.makedirs(outdir, exist_ok=True)
                    subprocess.run([args.kiln, "run", path, *feeds, "--device", "cuda", "--precision", p, "--output-dir", outdir, "-q"], check=True, capture_output=True, text=True)
                    got = np.load(os.path.join(outdir, "output_0.npy")).astype(np.float64)
                    scale = max(float(np.max(np.abs(ref))), 1e-30)
                    row["max_rel_err"] = float(np.max(np.abs(got - ref))) / scale
                    b = kiln_json([args.kiln, "bench", path, "--device", "cuda", "--precision", p, "--iters", str(args.iters), "--json", "-q"])
                    row["kiln_wall_ms"] = b["median_ms"]
                    row["kiln_ms"] = b.get("device_median_ms", b.get("device_ms", b["median_ms"]))
                    row["kiln_device_time"] = "device_median_ms" in b or "device_ms" in b
                except Exception as e:  # noqa: BLE001 - report and go on to the next op
                    row["error"] = str(e)
                mode = {"f32": "f32", "tf32": "tf32", "bf16": "bf16"}[p]
                base = row.get(f"torch_{mode}_ms")
                if "kiln_ms" in row and base:
                    row["kiln_over_torch"] = row["kiln_ms"] / base
                    if flops:
                        row["kiln_tflops"] = flops / row["kiln_ms"] / 1e9
                    row["kiln_gbps"] = nbytes / row["kiln_ms"] / 1e6
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    print(f"\nSingle ops on {device} (PyTorch {torch.__version__}, CUDA events, median of {args.iters}):\n")
    print("| op | precision | kiln ms | PyTorch ms (same mode) | kiln / PyTorch | PyTorch f32 / TF32 ms | kiln TFLOP/s | kiln GB/s | max rel. error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['op']} | {r['precision']} | error: {r['error'][:120]} | | | | | | |")
            continue
        base = r.get(f"torch_{r['precision']}_ms")
        tf = f"{r['kiln_tflops']:.1f}" if r.get("kiln_tflops") else ""
        print(
            f"| {r['op']} | {r['precision']} | {r['kiln_ms']:.4f}{'' if r['kiln_device_time'] else ' (wall)'} | {base:.4f} | {r['kiln_over_torch']:.2f}x | "
            f"{r['torch_f32_ms']:.4f} / {r['torch_tf32_ms']:.4f} | {tf} | {r['kiln_gbps']:.0f} | {r['max_rel_err']:.1e} |"
        )
    if args.json:
        json.dump({"device": device, "torch": torch.__version__, "ops": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
