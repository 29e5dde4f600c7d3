"""kiln from Python: compile ONNX models to native code and run them.

    import numpy as np, kiln
    sess = kiln.InferenceSession("model.onnx")            # compiled for this machine
    (y,) = sess.run(None, {"x": np.ones((1, 3), np.float32)})

``InferenceSession`` is a drop-in for onnxruntime's: ``InferenceSession(path_or_bytes,
sess_options=None, providers=None, provider_options=None)`` in its argument order, with
``SessionOptions`` (threads with onnxruntime's meaning, ``add_session_config_entry`` for kiln's
own options), ``providers`` mapped to kiln's devices (``CUDAExecutionProvider`` -> cuda,
``CPUExecutionProvider`` -> cpu; one that is not available falls back with onnxruntime's
warning), ``get_providers()``, ``get_inputs()``/``get_outputs()`` (name, shape with symbols,
type), ``run(output_names, input_feed)`` (every output for ``None`` or ``[]``; inputs as numpy
arrays of any byte order, lists or scalars). ``compile``, ``load``, ``emit`` and ``devices`` are
kiln's CLI as functions; ``kiln.backend`` is an ``onnx.backend`` Backend. Errors are
``kiln.KilnError`` with kiln's message (it names the node and the op).
"""

from __future__ import annotations

import enum
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _kiln
from ._kiln import KilnError, compile, devices, emit

__version__ = _kiln.__version__
__all__ = [
    "InferenceSession",
    "SessionOptions",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "NodeArg",
    "KilnError",
    "compile",
    "load",
    "emit",
    "devices",
    "get_available_providers",
    "get_device",
    "__version__",
]

Model = Union[str, "os.PathLike[str]", bytes]


class NodeArg:
    """One input or output: its name, its shape (a symbolic size is its name) and its type
    (onnxruntime's names, ``tensor(float)``)."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name: str, type: str, shape: List[Union[int, str]]):
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels. kiln always runs its own passes (fusion is how it compiles), so
    every level compiles the same program."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's modes; kiln runs a program's launches in order (GPUs overlap independent
    ones on their own)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """onnxruntime's session options, as far as they mean something to kiln:
    ``intra_op_num_threads`` (0, the default, is every core; a positive number that many),
    ``enable_profiling`` (``profile()`` then gives each run's kernel times), and session config
    entries for kiln's own options: ``kiln.device`` (``auto``, ``cpu``, ``cuda``, ``opencl``),
    ``kiln.precision`` (``f32``, ``tf32``, ``bf16``, ``f16``). The rest is kept and ignored."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.enable_profiling = False
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.enable_mem_pattern = True
        self.enable_cpu_mem_arena = True
        self.optimized_model_filepath = ""
        self._config: Dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[key] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        return self._config[key]


# onnxruntime's provider names and the kiln device each runs on.
_PROVIDERS = {
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "cuda",
    "OpenCLExecutionProvider": "opencl",
    "CPUExecutionProvider": "cpu",
    "KilnExecutionProvider": "auto",
}
_DEVICE_PROVIDER = {"cuda": "CUDAExecutionProvider", "opencl": "OpenCLExecutionProvider", "cpu": "CPUExecutionProvider"}


def get_available_providers() -> List[str]:
    """The providers this machine can run, best first (onnxruntime's function): a CUDA GPU, an
    OpenCL device, then the CPU, always."""
    usable = {d["target"] for d in devices() if d["usable"]}
    out = [p for t, p in (("cuda", "CUDAExecutionProvider"), ("opencl", "OpenCLExecutionProvider")) if t in usable]
    return out + ["CPUExecutionProvider"]


def get_device() -> str:
    """onnxruntime's: ``GPU`` where a CUDA or OpenCL GPU is usable, else ``CPU``."""
    return "GPU" if len(get_available_providers()) > 1 else "CPU"


def _device_of(providers: Any) -> Optional[str]:
    """The kiln device the first available provider of an onnxruntime ``providers`` list names
    (names, or (name, options) pairs); an unavailable one is warned about and skipped, as
    onnxruntime does."""
    if not providers:
        return None
    available = get_available_providers()
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) else p
        if name not in _PROVIDERS:
            raise KilnError(f"unknown provider `{name}`; kiln runs {', '.join(sorted(_PROVIDERS))}")
        if name in available or name == "KilnExecutionProvider":
            return _PROVIDERS[name]
        warnings.warn(
            f"Specified provider '{name}' is not in available provider names."
            f"Available providers: '{', '.join(available)}'",
            UserWarning,
            stacklevel=3,
        )
    return "cpu"


def _threads(n: Optional[int]) -> Optional[int]:
    """onnxruntime's thread count: 0 (or less, or None) is every core."""
    return n if n is not None and n > 0 else None


class InferenceSession:
    """A model compiled for this machine (or a compiled artifact, loaded).

    In onnxruntime's order: ``path_or_bytes`` (a path or the bytes of an ONNX model or a kiln
    artifact), ``sess_options`` (a ``SessionOptions``), ``providers`` (onnxruntime's names,
    mapped to kiln's devices), ``provider_options`` (accepted; kiln's devices take none). kiln's
    own keywords: ``device`` (``"auto"``: a CUDA GPU, else an OpenCL GPU, else the CPU;
    ``"cpu"``, ``"cuda"``, ``"opencl"``), ``threads`` (CPU threads; 0 or None: every core),
    ``precision`` (the arithmetic of convolutions and matrix products: ``"f32"``, ``"tf32"``,
    ``"bf16"`` or ``"f16"``, where the device has kernels for it, else an error says why),
    ``profile``. A model whose sizes are all known compiles here; one with symbolic sizes
    compiles on the first run of each size (through kiln's compile cache).
    """

    def __init__(
        self,
        path_or_bytes: Model,
        sess_options: Optional[SessionOptions] = None,
        providers: Any = None,
        provider_options: Any = None,
        *,
        device: Optional[str] = None,
        threads: Optional[int] = None,
        precision: Optional[str] = None,
        profile: Optional[bool] = None,
    ):
        so = sess_options if sess_options is not None else SessionOptions()
        if not isinstance(so, SessionOptions):
            raise TypeError(f"sess_options must be a kiln.SessionOptions, not {type(so).__name__}")
        config = getattr(so, "_config", {})
        device = device or _device_of(providers) or config.get("kiln.device") or "auto"
        precision = precision or config.get("kiln.precision") or "f32"
        threads = _threads(threads if threads is not None else so.intra_op_num_threads)
        profile = bool(so.enable_profiling) if profile is None else profile
        model = path_or_bytes
        if not isinstance(model, (bytes, bytearray)):
            model = os.fspath(model)
        self._session = _kiln.Session(
            bytes(model) if isinstance(model, bytearray) else model, device, threads, profile, precision
        )
        self._run = self._session.run
        self._inputs = [NodeArg(*t) for t in self._session.inputs()]
        self._outputs = [NodeArg(*t) for t in self._session.outputs()]
        self._sess_options = so
        runs_on = self._session.device
        target = "cuda" if runs_on.startswith("cuda") else "opencl" if runs_on.startswith("opencl") else "cpu"
        self._providers = [_DEVICE_PROVIDER[target]] + (["CPUExecutionProvider"] if target != "cpu" else [])

    def get_inputs(self) -> List[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> List[str]:
        """The providers in use, as onnxruntime lists them (the device, then the CPU)."""
        return list(self._providers)

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    @property
    def device(self) -> str:
        """Where it runs: ``cpu (2 threads)``, or the GPU's name."""
        return self._session.device

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any], run_options: Any = None) -> List[Any]:
        """The outputs named (every output for ``None`` or ``[]``, as onnxruntime), as numpy
        arrays, for the inputs ``input_feed`` (name -> numpy array, list or scalar; any byte
        order). A C-contiguous input aligned to 8 bytes is read where it lies; the GIL is
        released while the kernels run."""
        names = list(output_names) if output_names else None
        return self._run(names, input_feed)

    def profile(self) -> Dict[str, Any]:
        """The last run's profile: ``launches`` [(kernel, seconds)], ``bytes_to_device``,
        ``bytes_from_device``. Needs ``profile=True`` (or ``enable_profiling``)."""
        return self._session.profile()


def load(artifact: Model, device: str = "auto", threads: Optional[int] = None, profile: bool = False) -> InferenceSession:
    """A session over a compiled artifact (a path, or the bytes ``compile`` returned)."""
    return InferenceSession(artifact, device=device, threads=threads, profile=profile)
