"""kiln from Python: compile ONNX models to native code and run them.

    import numpy as np, kiln
    sess = kiln.InferenceSession("model.onnx")            # compiled for this machine
    (y,) = sess.run(None, {"x": np.ones((1, 3), np.float32)})

``InferenceSession`` follows onnxruntime's: ``get_inputs()``/``get_outputs()`` (name, shape
with symbols, type), ``run(output_names, input_feed)``. ``compile``, ``load``, ``emit`` and
``devices`` are kiln's CLI as functions; ``kiln.backend`` is an ``onnx.backend`` Backend.
Errors are ``kiln.KilnError`` with kiln's message (it names the node and the op).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _kiln
from ._kiln import KilnError, compile, devices, emit

__version__ = _kiln.__version__
__all__ = ["InferenceSession", "NodeArg", "KilnError", "compile", "load", "emit", "devices", "__version__"]

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


class InferenceSession:
    """A model compiled for this machine (or a compiled artifact, loaded).

    ``model`` is a path or the bytes of an ONNX model or a kiln artifact. ``device`` is
    ``"auto"`` (a CUDA GPU, else an OpenCL GPU, else the CPU), ``"cpu"``, ``"cuda"`` or
    ``"opencl"``; ``threads`` the CPU threads (default: every core). A model whose sizes are all
    known compiles here; one with symbolic sizes compiles on the first run of each size (through
    kiln's compile cache). ``precision`` is the arithmetic of convolutions and matrix products:
    ``"f32"`` (the default, also ``None``), or ``"bf16"``: bf16 products with f32 sums, norms,
    softmax and the rest in f32, where the CPU has AVX512-BF16 (else an error says why). With
    ``profile=True``, ``profile()`` gives the last run's per-kernel times and bytes copied.
    """

    def __init__(
        self,
        model: Model,
        device: str = "auto",
        threads: Optional[int] = None,
        precision: Optional[str] = None,
        profile: bool = False,
        providers: Any = None,
        sess_options: Any = None,
    ):
        if not isinstance(model, (bytes, bytearray)):
            model = os.fspath(model)
        self._session = _kiln.Session(
            bytes(model) if isinstance(model, bytearray) else model, device, threads, profile, precision or "f32"
        )
        self._run = self._session.run
        self._inputs = [NodeArg(*t) for t in self._session.inputs()]
        self._outputs = [NodeArg(*t) for t in self._session.outputs()]

    def get_inputs(self) -> List[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> List[str]:
        return ["KilnExecutionProvider"]

    @property
    def device(self) -> str:
        """Where it runs: ``cpu (2 threads)``, or the GPU's name."""
        return self._session.device

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any], run_options: Any = None) -> List[Any]:
        """The outputs named (every output when ``None``), as numpy arrays, for the inputs
        ``input_feed`` (name -> numpy array). A C-contiguous input aligned to 8 bytes is read
        where it lies; the GIL is released while the kernels run."""
        return self._run(None if output_names is None else list(output_names), input_feed)

    def profile(self) -> Dict[str, Any]:
        """The last run's profile: ``launches`` [(kernel, seconds)], ``bytes_to_device``,
        ``bytes_from_device``. Needs ``profile=True``."""
        return self._session.profile()


def load(artifact: Model, device: str = "auto", threads: Optional[int] = None, profile: bool = False) -> InferenceSession:
    """A session over a compiled artifact (a path, or the bytes ``compile`` returned)."""
    return InferenceSession(artifact, device=device, threads=threads, profile=profile)
