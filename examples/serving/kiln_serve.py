"""kiln sessions inside Ray Serve: one ``kiln.InferenceSession`` per replica, dynamic batching.

``KilnModel`` is a Ray Serve deployment. Each replica loads the model once (an ONNX model, or a
``.kiln`` artifact from ``kiln compile``; a path every node can read, or the bytes) on its device
(``cuda`` on a GPU replica, else the CPU with ``threads`` threads) and answers ``infer(feeds)``:
``feeds`` is ``{input name: array}`` (or one array, for a model with one input) whose leading
axis is the batch, and the answer is ``{output name: array}``.

With batching on (``max_batch_rows`` > 1), ``@serve.batch`` gathers the requests that arrive
within ``batch_wait_timeout_s`` of each other, up to ``max_batch_rows`` rows in all (Serve's
``batch_size_fn`` counts rows, not requests), concatenates them along the batch axis, runs the
session once and splits every output's rows back to the requests they came from. A symbolic batch
costs few compiles: an ONNX session compiles the batch at a capacity (the next power of two, at
least 16; the runtime pads and cuts back), and an artifact carries programs for 8, 4, 2 and 1 that
cover any batch; the replica compiles (or loads from kiln's compile cache) every capacity up to
``max_batch_rows`` before it takes traffic. This is exact only for a model whose every sample is
computed from its own rows (what ``kiln compile`` proves for an artifact with a symbolic batch).

``app(...)`` builds the application with the replicas placed by what the cluster has: with a GPU,
replicas on the GPU(s) (``num_gpus``, device ``cuda``); else CPU replicas whose threads times
replicas do not exceed a node's cores. ``app_builder`` is the same for ``serve run``::

    serve run kiln_serve:app_builder model=/models/mlp.onnx num_replicas=2 max_batch_rows=64

HTTP: ``POST /`` with JSON ``{"inputs": {name: nested lists}}`` (or ``{"x": ...}`` for one input)
answers ``{"outputs": {name: nested lists}}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from typing import Any, Dict, List, Optional, Union

import numpy as np
from ray import serve

Model = Union[str, bytes]


def _rows(feeds: Dict[str, np.ndarray]) -> int:
    """A request's batch: the leading size of its first input."""
    first = next(iter(feeds.values()))
    return int(first.shape[0]) if first.ndim else 1


def _batch_rows(items: List[Dict[str, np.ndarray]]) -> int:
    """Serve's batch size for a list of requests: their rows, not their number."""
    return sum(_rows(f) for f in items)


# Upper bound for @serve.batch; each replica sets its own (`set_max_batch_size`) in __init__.
_MAX_BATCH_ROWS = 1 << 20


@serve.deployment
class KilnModel:
    def __init__(
        self,
        model: Model,
        device: str = "cpu",
        threads: Optional[int] = None,
        max_batch_rows: int = 64,
        batch_wait_timeout_s: float = 0.005,
        warmup: bool = True,
    ):
        import kiln  # in the replica's process

        self.session = kiln.InferenceSession(model, device=device, threads=threads)
        inputs = self.session.get_inputs()
        self.inputs = [i.name for i in inputs]
        self.types = {i.name: _DTYPES.get(i.type) for i in inputs}
        self.outputs = [o.name for o in self.session.get_outputs()]
        # Batching needs every input's leading size symbolic (a model compiled for one batch
        # size takes requests of that size, one at a time).
        batchable = all(i.shape and not isinstance(i.shape[0], int) for i in inputs)
        self.max_batch_rows = max(1, int(max_batch_rows)) if batchable else 1
        self.batching = self.max_batch_rows > 1
        self.infer_batched.set_max_batch_size(self.max_batch_rows)
        self.infer_batched.set_batch_wait_timeout_s(float(batch_wait_timeout_s))
        # One session's runs take turns; one thread runs them, off the replica's event loop (the
        # GIL is released while kiln's kernels run), so the next batch gathers meanwhile.
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln")
        self.description = {
            "pid": os.getpid(),
            "device": self.session.device,
            "batching": self.batching,
            "max_batch_rows": self.max_batch_rows,
        }
        # Session runs, the rows they took and their seconds, after warm-up.
        self.runs = self.rows_run = 0
        self.run_s = 0.0
        if warmup:
            self._warmup()

    def _warmup(self) -> None:
        """Compile (or load from kiln's cache) the programs the batch sizes this replica will
        see need, before traffic arrives: 1, then every power of two from 32 up to and past
        max_batch_rows (an ONNX session compiles the batch at the next power of two, at least
        16). Only for inputs whose every other size is known."""
        shapes = {}
        for i in self.session.get_inputs():
            rest = i.shape[1:]
            if not i.shape or isinstance(i.shape[0], int) or not all(isinstance(d, int) for d in rest) \
                    or self.types[i.name] is None:
                return
            shapes[i.name] = (rest, self.types[i.name])
        sizes, n = [1], 32
        while n < 2 * self.max_batch_rows and self.batching:
            sizes.append(min(n, self.max_batch_rows))
            n *= 2
        for n in sorted(set(sizes)):
            self.session.run(None, {k: np.zeros((n, *rest), dt) for k, (rest, dt) in shapes.items()})

    def _feeds(self, request: Any) -> Dict[str, np.ndarray]:
        """A request's inputs as contiguous arrays of the types the model declares."""
        feeds = request if isinstance(request, dict) else {self.inputs[0]: request}
        return {k: np.ascontiguousarray(v, dtype=self.types.get(k)) for k, v in feeds.items()}

    def _run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        t = time.perf_counter()
        outs = self.session.run(None, feeds)
        self.run_s += time.perf_counter() - t
        self.runs += 1
        self.rows_run += _rows(feeds)
        return outs

    async def _run_async(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._run, feeds)

    async def infer(self, request: Any) -> Dict[str, np.ndarray]:
        """One request: ``{input: array}`` (or an array), batch on the leading axis."""
        feeds = self._feeds(request)
        if self.batching and feeds and _rows(feeds) <= self.max_batch_rows:
            answer = await self.infer_batched(feeds)
            if isinstance(answer, Exception):
                raise answer
            return answer
        outs = await self._run_async(feeds)
        return dict(zip(self.outputs, outs))

    @serve.batch(max_batch_size=_MAX_BATCH_ROWS, batch_wait_timeout_s=0.005, batch_size_fn=_batch_rows)
    async def infer_batched(self, requests: List[Dict[str, np.ndarray]]) -> List[Any]:
        """The requests Serve gathered, as few session runs as their shapes allow: one per set
        of requests whose inputs agree on everything but the batch. Each request's answer, or
        the exception its run raised: a run that fails is retried one request at a time, so a
        malformed request fails alone."""
        groups: Dict[tuple, List[int]] = {}
        for i, f in enumerate(requests):
            key = tuple((k, v.shape[1:], v.dtype.str) for k, v in sorted(f.items()))
            groups.setdefault(key, []).append(i)
        answers: List[Any] = [None] * len(requests)
        for members in groups.values():
            try:
                answers_of = await self._run_together([requests[i] for i in members])
            except Exception as e:
                if len(members) == 1:
                    answers_of = [e]
                else:
                    answers_of = []
                    for i in members:
                        try:
                            answers_of += await self._run_together([requests[i]])
                        except Exception as e1:
                            answers_of.append(e1)
            for i, a in zip(members, answers_of):
                answers[i] = a
        return answers

    async def _run_together(self, requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        """One session run on the requests concatenated along the batch axis, and every
        output's rows split back to the requests they came from."""
        rows = [_rows(f) for f in requests]
        total = sum(rows)
        if len(requests) == 1:
            feeds = requests[0]
        else:
            feeds = {k: np.concatenate([f[k] for f in requests], axis=0) for k in requests[0]}
        outs = await self._run_async(feeds)
        cuts = np.cumsum(rows)[:-1]
        per_output = []
        for y in outs:
            if y.ndim and y.shape[0] == total:
                per_output.append(np.split(y, cuts, axis=0))
            else:  # not batched: every request gets it whole
                per_output.append([y] * len(requests))
        return [{name: parts[i] for name, parts in zip(self.outputs, per_output)} for i in range(len(requests))]

    def describe(self) -> Dict[str, Any]:
        """Where this replica runs and how it batches; since warm-up, ``runs``: the session's
        runs, ``rows``: the rows they took (their ratio is the mean batch), ``run_s``: their
        seconds; ``cpu_s``: this process's CPU seconds (kiln's, Serve's and Ray's), all along."""
        return dict(self.description, runs=self.runs, rows=self.rows_run, run_s=self.run_s, cpu_s=time.process_time())

    async def __call__(self, request) -> Dict[str, Any]:
        """HTTP: JSON ``{"inputs": {name: lists}}`` (or ``{name: lists}``) -> ``{"outputs": ...}``."""
        body = await request.json()
        outs = await self.infer(body.get("inputs", body))
        return {"outputs": {k: v.tolist() for k, v in outs.items()}}


_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def placement(num_replicas: int, threads: Optional[int] = None, use_gpu: Optional[bool] = None) -> Dict[str, Any]:
    """Where the replicas go, from what the connected Ray cluster has: ``device``,
    ``ray_actor_options`` and ``threads`` per replica. With GPUs (``use_gpu`` None: if the
    cluster has any), every replica runs on CUDA with ``num_gpus`` = its share of them (at most
    one; replicas share a GPU when there are fewer GPUs than replicas). Otherwise CPU replicas of
    ``threads`` threads (by default the cluster's CPUs divided among the replicas, at most the
    largest node's, at least 1), each reserving as many CPUs, so replicas x threads does not
    oversubscribe the cores; where that cannot fit (more replicas than CPUs, or ``threads`` given
    too large) each reserves an equal share of the CPUs, so that every replica still gets placed."""
    import ray

    resources = ray.cluster_resources()
    gpus = float(resources.get("GPU", 0))
    if use_gpu is None:
        use_gpu = gpus >= 1
    if use_gpu:
        share = min(1.0, gpus / num_replicas) if gpus else 1.0
        return {"device": "cuda", "threads": None, "ray_actor_options": {"num_gpus": share, "num_cpus": 1}}
    cpus = int(resources.get("CPU", os.cpu_count() or 1))
    largest = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=cpus)
    if threads is None:
        threads = max(1, min(cpus // num_replicas, largest))
    reserve = threads if threads * num_replicas <= cpus and threads <= largest else cpus / num_replicas
    return {"device": "cpu", "threads": threads, "ray_actor_options": {"num_cpus": reserve}}


def app(
    model: Model,
    num_replicas: int = 1,
    max_batch_rows: int = 64,
    batch_wait_timeout_s: float = 0.005,
    threads: Optional[int] = None,
    use_gpu: Optional[bool] = None,
    max_ongoing_requests: Optional[int] = None,
) -> serve.Application:
    """The application: ``num_replicas`` replicas of ``KilnModel`` placed by ``placement``.
    ``max_batch_rows`` 1 (or 0) turns batching off. A replica holds at most
    ``max_ongoing_requests`` at once (default 64, or ``max_batch_rows`` if larger: enough to fill
    a batch of single rows; the rest wait in the callers' routers, which back off and retry, so a
    bound below the load costs latency even without batching)."""
    where = placement(num_replicas, threads, use_gpu)
    if max_ongoing_requests is None:
        max_ongoing_requests = max(64, max_batch_rows)
    return KilnModel.options(
        num_replicas=num_replicas,
        ray_actor_options=where["ray_actor_options"],
        max_ongoing_requests=max_ongoing_requests,
    ).bind(
        model,
        device=where["device"],
        threads=where["threads"],
        max_batch_rows=max_batch_rows,
        batch_wait_timeout_s=batch_wait_timeout_s,
    )


def app_builder(args: Dict[str, str]) -> serve.Application:
    """For ``serve run kiln_serve:app_builder model=PATH [num_replicas=N] [max_batch_rows=N]
    [batch_wait_timeout_s=S] [threads=N] [use_gpu=0|1]``."""
    import ray

    if not ray.is_initialized():
        # `serve run` calls this before it connects, and placement needs the cluster: connect
        # here (RAY_ADDRESS, else the cluster `ray start` made on this machine, else a new local
        # one), shipping this folder to every node so the replicas can import this module.
        ray.init(namespace="serve", runtime_env={"working_dir": os.path.dirname(os.path.abspath(__file__)),
                                                 "excludes": ["__pycache__"]})
    flag = args.get("use_gpu")
    return app(
        os.path.abspath(args["model"]) if os.path.exists(args["model"]) else args["model"],
        num_replicas=int(args.get("num_replicas", 1)),
        max_batch_rows=int(args.get("max_batch_rows", 64)),
        batch_wait_timeout_s=float(args.get("batch_wait_timeout_s", 0.005)),
        threads=int(args["threads"]) if "threads" in args else None,
        use_gpu=None if flag is None else flag.lower() in ("1", "true", "yes"),
    )
