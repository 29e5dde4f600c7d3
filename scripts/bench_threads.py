"""kiln against onnxruntime at several thread counts on the CPU: for each model, kiln's output
checked against the model's reference (test_data_set_0), then per thread count the median
latency of each (interleaved rounds, each engine in its own process, as scripts/bench.sh), their
ratio, and each engine's speed-up over its own 1-thread time. `scripts/gpu/session.sh cpu-scale`
runs it on the device tool's 16-core host; it runs anywhere.

    python3 bench_threads.py --kiln KILN [--threads 1,4,16] [--rounds 3] [--seconds 1.0]
                             [--json OUT.json] MODEL_DIR...

A MODEL_DIR holds model.onnx and test_data_set_0/{input_0,output_0}.pb (../shared/models'
layout; scripts/bench_models.py writes such folders). Timed runs per measurement: enough for
about --seconds, from kiln's first (compiling) run, between 3 and --max-iters.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper


def say(msg: str) -> None:
    print(f"bench-threads: {msg}", file=sys.stderr, flush=True)


def ort_worker(model: str, threads: int, iters: int, warmup: int, inputs: list) -> None:
    """Times onnxruntime in this process and prints the median ms (run as a child process)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feeds = {}
    for path in inputs:
        t = onnx.load_tensor(path)
        feeds[t.name] = numpy_helper.to_array(t)
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    print(statistics.median(times) * 1e3)


class Model:
    def __init__(self, folder: str) -> None:
        self.folder = folder.rstrip("/")
        self.name = os.path.basename(self.folder)
        self.path = os.path.join(self.folder, "model.onnx")
        data = os.path.join(self.folder, "test_data_set_0")
        self.inputs = sorted((os.path.join(data, f) for f in os.listdir(data) if f.startswith("input_")),
                             key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])) if os.path.isdir(data) else []
        self.outputs = sorted((os.path.join(data, f) for f in os.listdir(data) if f.startswith("output_")),
                              key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])) if os.path.isdir(data) else []
        self.input_args = []
        for p in self.inputs:
            self.input_args += ["--input", f"{onnx.load_tensor(p).name}={p}"]


def check(kiln: str, m: Model, env: dict) -> dict:
    """Runs the model once with kiln on its reference input; the largest absolute difference to
    the reference outputs, and the largest |reference| beside it."""
    if not m.outputs:
        return {"status": "no reference"}
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([kiln, "run", m.path, "--device", "cpu", "--output-dir", out, *m.input_args],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            return {"status": "kiln failed", "error": (r.stderr or r.stdout).strip().splitlines()[-3:]}
        diff, ref_max, ok = 0.0, 0.0, True
        for i, p in enumerate(m.outputs):
            ref = numpy_helper.to_array(onnx.load_tensor(p))
            got = np.load(os.path.join(out, f"output_{i}.npy"))
            if got.shape != ref.shape:
                return {"status": f"shape {list(got.shape)} != {list(ref.shape)}"}
            diff = max(diff, float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))))
            ref_max = max(ref_max, float(np.max(np.abs(ref))))
            ok = ok and bool(np.allclose(got, ref, rtol=1e-3, atol=1e-5))  # kiln check's tolerances
        return {"status": "match" if ok else "differs", "max_abs_diff": diff, "max_abs_ref": ref_max}


def kiln_bench(kiln: str, m: Model, threads: int, iters: int, warmup: int, env: dict):
    r = subprocess.run([kiln, "bench", m.path, "--device", "cpu", "--threads", str(threads), "--iters", str(iters),
                        "--warmup", str(warmup), "--json", "--quiet", *m.input_args],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0 or not r.stdout.strip():
        say(f"kiln bench failed on {m.name} at {threads} threads: {(r.stderr or r.stdout).strip()[-400:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def ort_bench(m: Model, threads: int, iters: int, warmup: int):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--ort-worker", m.path, str(threads), str(iters),
                        str(warmup), *m.inputs], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        say(f"onnxruntime failed on {m.name} at {threads} threads: {r.stderr.strip()[-400:]}")
        return None
    return float(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--ort-worker":
        model, threads, iters, warmup, *inputs = sys.argv[2:]
        ort_worker(model, int(threads), int(iters), int(warmup), inputs)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--threads", default="1,4,16", help="comma-separated thread counts (the first is the base of the speed-ups)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="about this long per measurement")
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0, help="stop starting measurements after this many seconds (0: none)")
    ap.add_argument("--json")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t]
    import onnxruntime

    env = dict(os.environ)
    cache = tempfile.mkdtemp(prefix="kiln-bench-threads.")
    env["KILN_CACHE"] = cache  # a compile cache of its own: each thread count compiles once
    models = [Model(d) for d in args.models if os.path.isfile(os.path.join(d, "model.onnx"))]
    say(f"{len(models)} models, threads {threads}, {args.rounds} rounds; onnxruntime {onnxruntime.__version__}; "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    results = []
    t_start = time.time()
    for m in models:
        c = check(args.kiln, m, env)
        say(f"{m.name}: {c}")
        row = {"model": m.name, "check": c, "threads": {}}
        for t in threads:
            if args.budget and time.time() - t_start > args.budget:
                say(f"{m.name} at {t} threads: skipped, past the budget of {args.budget:.0f} s")
                row["threads"][t] = None
                continue
            cold = kiln_bench(args.kiln, m, t, 3, 1, env)
            if cold is None:
                row["threads"][t] = None
                continue
            iters = max(3, min(args.max_iters, round(args.seconds * 1e3 / max(cold["median_ms"], 1e-3))))
            kiln_ms, ort_ms = [], []
            for _ in range(args.rounds):
                k = kiln_bench(args.kiln, m, t, iters, args.warmup, env)
                if k:
                    kiln_ms.append(k["median_ms"])
                o = ort_bench(m, t, iters, args.warmup)
                if o is not None:
                    ort_ms.append(o)
            r = {"kiln_ms": statistics.median(kiln_ms) if kiln_ms else None,
                 "ort_ms": statistics.median(ort_ms) if ort_ms else None,
                 "kiln_rounds": kiln_ms, "ort_rounds": ort_ms, "iters": iters, "compile_ms": cold["compile_ms"]}
            row["threads"][t] = r
            say(f"{m.name} at {t} threads: kiln {r['kiln_ms']} ms, onnxruntime {r['ort_ms']} ms ({iters} runs x {args.rounds})")
        results.append(row)
    subprocess.run(["rm", "-rf", cache])

    f = lambda x, spec=".3f": format(x, spec) if isinstance(x, (int, float)) else "n/a"
    print(f"\nkiln against onnxruntime {onnxruntime.__version__} on the CPU ({os.cpu_count()} CPUs), "
          f"median of {args.rounds} rounds' medians")
    print(f"{'model':28} check against the reference outputs (kiln run, rtol 1e-3, atol 1e-5)")
    for row in results:
        c = row["check"]
        detail = f"{c['status']} (max |diff| {c['max_abs_diff']:.2e} of max |ref| {c['max_abs_ref']:.3g})" \
            if "max_abs_diff" in c else c["status"]
        print(f"{row['model']:28} {detail}")
    base = threads[0]
    print(f"\n{'model':28} {'threads':>7} {'kiln ms':>10} {'onnxrt ms':>10} {'ratio':>7} "
          f"{'kiln x' + str(base):>9} {'onnxrt x' + str(base):>10}")
    for row in results:
        b = row["threads"].get(base) or {}
        for t in threads:
            r = row["threads"].get(t)
            if not r:
                print(f"{row['model']:28} {t:7d} {'(kiln failed or out of time)':>30}")
                continue
            k, o = r["kiln_ms"], r["ort_ms"]
            ratio = k / o if k and o else None
            r["ratio"] = ratio
            r["kiln_speedup"] = b.get("kiln_ms") / k if k and b.get("kiln_ms") else None
            r["ort_speedup"] = b.get("ort_ms") / o if o and b.get("ort_ms") else None
            print(f"{row['model']:28} {t:7d} {f(k):>10} {f(o):>10} {f(ratio, '.2f') + 'x':>7} "
                  f"{f(r['kiln_speedup'], '.2f') + 'x':>9} {f(r['ort_speedup'], '.2f') + 'x':>10}")
    print(f"ratio: kiln / onnxruntime (below 1: kiln faster); kiln x{base}, onnxrt x{base}: each engine's "
          f"speed-up over its own {base}-thread time; {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__, "threads": threads,
                       "rounds": args.rounds, "models": results}, fh, indent=1)


if __name__ == "__main__":
    main()
