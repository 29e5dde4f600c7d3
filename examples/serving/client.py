"""Serve a model with kiln inside Ray Serve, load it with concurrent requests, check every answer.

    python examples/serving/client.py                     # a local Ray cluster, the built-in MLP
    python examples/serving/client.py --model m.onnx      # your model (one float input, batch first)
    python examples/serving/client.py --address auto      # a running cluster (`ray start --head`)

For each configuration (1 replica without batching, 1 replica with batching, 2 replicas with
batching, and 2 replicas with batching serving a compiled ``.kiln`` artifact over HTTP) it deploys
``kiln_serve.KilnModel``, sends ``--requests`` requests of 1 to ``--max-rows`` rows from
``--concurrency`` clients at once (asyncio over a DeploymentHandle; HTTP from threads for the
last), checks every answer against onnxruntime on the same input (``np.allclose``, rtol 1e-4, atol
1e-5) and prints requests/s, rows/s and the p50/p99 latency. With batching through the handle it
also sends two malformed requests among good ones: they must fail alone. Exits 1 if any answer is
wrong or missing. Without ``--address`` it starts a local Ray cluster in this process and shuts it down
at the end, failure included.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL, ATOL = 1e-4, 1e-5
APP, ROUTE = "kiln-demo", "/kiln-demo"  # the Serve application the client deploys, and its route


def mlp(dims=(256, 512, 512, 10), seed: int = 0) -> bytes:
    """x[N,256] -> (MatMul, Add, Relu) x2 -> MatMul, Add -> Softmax -> y[N,10], batch symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        inits += [
            numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array((0.1 * rng.standard_normal(b)).astype(np.float32), f"b{i}"),
        ]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", dims[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dims[-1]])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def requests_for(model: bytes, n: int, max_rows: int, seed: int) -> Tuple[str, List[np.ndarray], List[Dict[str, np.ndarray]]]:
    """``n`` random inputs of 1..max_rows rows for the model's one input, and onnxruntime's answers."""
    import onnxruntime as ort

    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    if len(ref.get_inputs()) != 1:
        sys.exit(f"client: the model has {len(ref.get_inputs())} inputs; the client feeds models with one")
    (inp,) = ref.get_inputs()
    rest = inp.shape[1:]
    if inp.type != "tensor(float)":
        sys.exit(f"client: input {inp.name} is {inp.type}; the client sends random float32 rows")
    if not all(isinstance(d, int) for d in rest):
        sys.exit(f"client: input {inp.name} has shape {inp.shape}; only the leading (batch) size may be symbolic")
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((int(rng.integers(1, max_rows + 1)), *rest)).astype(np.float32) for _ in range(n)]
    names = [o.name for o in ref.get_outputs()]
    answers = [dict(zip(names, ref.run(None, {inp.name: x}))) for x in xs]
    return inp.name, xs, answers


def wrong(got: Any, want: Dict[str, np.ndarray]) -> Optional[str]:
    """Why an answer (outputs by name, or the exception the request raised) is not onnxruntime's
    ``want``; None when it is."""
    if got is None:
        return "no answer"
    if isinstance(got, BaseException):
        return f"{type(got).__name__}: {got}"
    for k, w in want.items():
        g = np.asarray(got.get(k), dtype=w.dtype) if k in got else None
        if g is None or g.shape != w.shape:
            return f"{k}: shape {None if g is None else g.shape}, expected {w.shape}"
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL):
            return f"{k}: max |diff| {float(np.max(np.abs(g - w))):.3g}"
    return None


def replicas_of(handle, n: int) -> Dict[int, Dict[str, Any]]:
    """``describe()`` of every replica, by process id: where each runs and how many session runs
    and rows it has done. Serve routes each call to the replica with the shorter queue as its
    router last saw it (a replica that was busy a moment ago may look busy for seconds), so this
    sends bursts of calls, enough to queue on any one replica, until ``n`` have answered (at most
    30 bursts)."""
    seen: Dict[int, Dict[str, Any]] = {}
    for _ in range(30):
        for r in [handle.describe.remote() for _ in range(64)]:
            d = r.result()
            seen[d["pid"]] = d
        if len(seen) >= n:
            break
        time.sleep(0.1)
    return seen


def malformed_fail_alone(handle, name: str, xs: List[np.ndarray], want: List[Dict[str, np.ndarray]]) -> int:
    """Good requests sent at once with two malformed ones (a row one value short, float64 rows of
    a wrong rank) likely share batches with them: the malformed must fail, each with kiln's
    message, and the rest be right. Returns how many came out otherwise."""
    broken = [np.zeros((2, xs[0].shape[1] - 1), np.float32), np.zeros((3,), np.float64)]

    async def send():
        calls = [handle.infer.remote({name: x}) for x in broken[:1] + xs + broken[1:]]
        return await asyncio.gather(*calls, return_exceptions=True)

    print("client:   now 2 malformed requests among good ones (the replica logs their errors)", flush=True)
    got = asyncio.run(send())
    failed = [got[0], got[-1]]
    wrong_ones = sum(wrong(a, w) is not None for a, w in zip(got[1:-1], want))
    unfailed = sum(not isinstance(f, Exception) for f in failed)
    print(f"client:   {len(xs)} requests sent with 2 malformed ones: {len(xs) - wrong_ones}/{len(xs)} correct, "
          f"{2 - unfailed}/2 malformed refused ({str(failed[0]).strip().splitlines()[-1][:100]})", flush=True)
    return wrong_ones + unfailed


async def load_handle(handle, name: str, xs: List[np.ndarray], concurrency: int) -> Tuple[List[Any], List[float], float]:
    """Every request through the DeploymentHandle, ``concurrency`` in flight; answers,
    per-request latencies and the wall time."""
    answers: List[Any] = [None] * len(xs)
    lat = [0.0] * len(xs)
    nxt = iter(range(len(xs)))

    async def worker():
        for i in nxt:
            t = time.perf_counter()
            try:
                answers[i] = await handle.infer.remote({name: xs[i]})
            except Exception as e:  # counted as wrong below
                answers[i] = e
            lat[i] = time.perf_counter() - t

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers, lat, time.perf_counter() - t0


def load_http(port: int, route: str, name: str, xs: List[np.ndarray], concurrency: int) -> Tuple[List[Any], List[float], float]:
    """Every request as JSON over HTTP (one keep-alive connection per client thread)."""
    answers: List[Any] = [None] * len(xs)
    lat = [0.0] * len(xs)
    lock, nxt = threading.Lock(), iter(range(len(xs)))

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                break
            body = json.dumps({"inputs": {name: xs[i].tolist()}})
            t = time.perf_counter()
            try:
                conn.request("POST", route, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                answers[i] = json.loads(data)["outputs"] if r.status == 200 else RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
            except Exception as e:
                answers[i] = e
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            lat[i] = time.perf_counter() - t
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, lat, time.perf_counter() - t0


def interrupted(*_):
    raise KeyboardInterrupt("SIGTERM")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="an ONNX model with one float input, batch first (default: the built-in MLP)")
    ap.add_argument("--address", help="a running Ray cluster (`auto`, or host:port); default: start one here")
    ap.add_argument("--requests", type=int, default=1500, help="requests per configuration (default 1500)")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    ap.add_argument("--max-rows", type=int, default=8, help="rows per request: 1 to this (default 8)")
    ap.add_argument("--max-batch-rows", type=int, default=64, help="rows per batch (default 64)")
    ap.add_argument("--batch-wait", type=float, default=0.005, help="batch wait timeout, seconds (default 0.005)")
    ap.add_argument("--replicas", type=int, default=2, help="replicas of the multi-replica configurations (default 2)")
    ap.add_argument("--port", type=int, default=8765,
                    help="Serve's HTTP port (default 8765; on a cluster where Serve already runs, the port it has: 8000 by default)")
    ap.add_argument("--threads", type=int, help="kiln threads (and Ray CPUs) per CPU replica (default: the CPUs divided among the replicas)")
    ap.add_argument("--cpu", action="store_true", help="CPU replicas even where the cluster has a GPU")
    ap.add_argument("--target-cpu", help="the CPUs the .kiln artifact is compiled for (kiln.compile's target_cpu; "
                    "default: this one's), for a cluster whose nodes' CPUs differ")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()

    import kiln
    import ray
    from ray import serve

    sys.path.insert(0, HERE)
    import kiln_serve

    if args.model:
        with open(args.model, "rb") as f:
            model_bytes = f.read()
        model: Any = os.path.abspath(args.model)  # a path: it must exist on every node
    else:
        model_bytes = mlp()
        model = model_bytes  # bytes travel with the deployment: no file on the nodes
    name, xs, want = requests_for(model_bytes, args.requests, args.max_rows, seed=1)
    rows = sum(x.shape[0] for x in xs)
    print(f"client: {len(xs)} requests, {rows} rows; onnxruntime's answers ready", flush=True)

    started = args.address is None
    bad_total = 0
    results = []
    try:
        ray.init(
            # "local": a cluster of our own even where `ray start` left one running here.
            address=args.address or "local",
            include_dashboard=False if started else None,
            logging_level="warning",
            configure_logging=True,
            # The replicas import kiln_serve from here (uploaded, so every node has it).
            runtime_env={"working_dir": HERE, "excludes": ["__pycache__"]},
            **({"object_store_memory": 256 * 1024**2} if started else {}),
        )
        # SIGTERM (make killed, a CI timeout) ends like Ctrl-C, through the finally below, which
        # stops the cluster; set after ray.init, whose own handler aborts and leaves its agents.
        signal.signal(signal.SIGTERM, interrupted)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        res = ray.cluster_resources()
        use_gpu = False if args.cpu else None
        gpu = not args.cpu and res.get("GPU", 0) >= 1
        print(f"client: Ray {ray.__version__}, cluster {int(res.get('CPU', 0))} CPUs, {int(res.get('GPU', 0))} GPUs, "
              f"{len(ray.nodes())} node(s); replicas on {'the GPU' if gpu else 'CPUs'}", flush=True)
        # The artifact configuration's replicas load a .kiln compiled here, for their device
        # (and, where the nodes' CPUs differ from this one's, for --target-cpu).
        t = time.perf_counter()
        extra = {"target_cpu": args.target_cpu} if args.target_cpu and not gpu else {}
        artifact = kiln.compile(model_bytes, target="cuda" if gpu else "cpu", **extra)
        print(f"client: artifact compiled in {time.perf_counter() - t:.1f} s ({len(artifact) / 1e6:.1f} MB)", flush=True)
        serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                    logging_config={"log_level": "WARNING", "enable_access_log": False})

        configs = [
            # (label, replicas, max batch rows, what the replicas load, over HTTP)
            ("1 replica, no batching", 1, 1, "onnx", False),
            ("1 replica, batching", 1, args.max_batch_rows, "onnx", False),
            (f"{args.replicas} replicas, batching", args.replicas, args.max_batch_rows, "onnx", False),
            (f"{args.replicas} replicas, batching, .kiln artifact, HTTP", args.replicas, args.max_batch_rows, "kiln", True),
        ]
        for label, replicas, batch_rows, kind, over_http in configs:
            t = time.perf_counter()
            application = kiln_serve.app(
                artifact if kind == "kiln" else model,
                num_replicas=replicas,
                max_batch_rows=batch_rows,
                batch_wait_timeout_s=args.batch_wait,
                threads=args.threads,
                use_gpu=use_gpu,
            )
            handle = serve.run(application, name=APP, route_prefix=ROUTE,
                               logging_config={"log_level": "WARNING", "enable_access_log": False})
            devices = sorted({d["device"] for d in replicas_of(handle, replicas).values()})
            up = time.perf_counter() - t
            # Warm the path (and the handle's router) with a few requests, then the timed run.
            warm = xs[: 4 * args.concurrency]
            if over_http:
                load_http(args.port, ROUTE, name, warm, args.concurrency)
            else:
                asyncio.run(load_handle(handle, name, warm, args.concurrency))
            before = replicas_of(handle, replicas)
            cpu = time.process_time()
            if over_http:
                answers, lat, wall = load_http(args.port, ROUTE, name, xs, args.concurrency)
            else:
                answers, lat, wall = asyncio.run(load_handle(handle, name, xs, args.concurrency))
            cpu = time.process_time() - cpu
            after = replicas_of(handle, replicas)
            # Replica statistics, when every replica answered before and after (else None).
            full = len(after) == replicas and after.keys() == before.keys()
            delta = {k: sum(after[p][k] - before[p][k] for p in after) if full else None for k in ("runs", "rows", "run_s", "cpu_s")}
            runs, run_rows = delta["runs"], delta["rows"]
            bad = [(i, why) for i, (a, w) in enumerate(zip(answers, want)) if (why := wrong(a, w))]
            bad_total += len(bad)
            lat_ms = np.array(lat) * 1e3
            r = {
                "config": label,
                "replicas": replicas,
                "max_batch_rows": batch_rows,
                "model": kind,
                "http": over_http,
                "devices": devices,
                "session_runs": runs,
                "mean_batch_rows": run_rows / runs if full and runs else None,
                # Per request, in every replica together: the session's run time, the replica
                # processes' CPU time (kiln, Serve, Ray), and this process's (the client, the
                # handle's router; HTTP: the client only, the proxy is elsewhere).
                "kiln_run_ms_per_request": 1e3 * delta["run_s"] / len(xs) if full else None,
                "replica_cpu_ms_per_request": 1e3 * delta["cpu_s"] / len(xs) if full else None,
                "client_cpu_ms_per_request": 1e3 * cpu / len(xs),
                "deploy_s": round(up, 1),
                "requests": len(xs),
                "rows": rows,
                "wrong": len(bad),
                "requests_per_s": len(xs) / wall,
                "rows_per_s": rows / wall,
                "p50_ms": float(np.percentile(lat_ms, 50)),
                "p99_ms": float(np.percentile(lat_ms, 99)),
            }
            results.append(r)
            stats = (f"{runs} session runs of {run_rows / max(runs, 1):.1f} rows on average; per request: kiln ran "
                     f"{r['kiln_run_ms_per_request']:.2f} ms, the replicas used {r['replica_cpu_ms_per_request']:.2f} ms "
                     f"of CPU, this client {r['client_cpu_ms_per_request']:.2f} ms" if full else
                     f"replica statistics incomplete: {len(before)}, then {len(after)} of {replicas} replicas answered")
            print(f"client: {label}: {r['requests_per_s']:.0f} req/s, {r['rows_per_s']:.0f} rows/s, "
                  f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; {len(xs) - len(bad)}/{len(xs)} correct "
                  f"(up in {up:.1f} s on {', '.join(devices)}; {stats})", flush=True)
            for i, why in bad[:5]:
                print(f"client:   request {i} ({xs[i].shape[0]} rows): {why}", flush=True)
            if batch_rows > 1 and not over_http:
                bad_total += malformed_fail_alone(handle, name, xs[:14], want[:14])
            serve.delete(APP)
    finally:
        try:
            if started:
                serve.shutdown()
            elif ray.is_initialized():
                serve.delete(APP)  # someone else's cluster: leave Serve and its other apps running
        finally:
            if ray.is_initialized():
                ray.shutdown()  # stops the cluster this process started; else disconnects

    print()
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    print("| configuration | requests/s | rows/s | p50 ms | p99 ms | rows per session run | per request: kiln ms "
          "| replicas' CPU ms | client's CPU ms | correct |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['config']} | {r['requests_per_s']:.0f} | {r['rows_per_s']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {num(r['mean_batch_rows'], '.1f')} | {num(r['kiln_run_ms_per_request'], '.2f')} | "
              f"{num(r['replica_cpu_ms_per_request'], '.2f')} | {r['client_cpu_ms_per_request']:.2f} | "
              f"{r['requests'] - r['wrong']}/{r['requests']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"concurrency": args.concurrency, "max_rows": args.max_rows, "results": results}, f, indent=1)
    if bad_total or len(results) != len(configs):
        print(f"client: FAILED: {bad_total} wrong answers", file=sys.stderr)
        return 1
    print(f"client: every answer matches onnxruntime (rtol {RTOL}, atol {ATOL})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"client: interrupted ({e or 'SIGINT'}); the cluster is stopped", file=sys.stderr)
        sys.exit(130)
