"""kiln as an ONNX backend (``onnx.backend.base.Backend``): ``prepare``, ``run_model``,
``run_node`` and ``supports_device``, so ``onnx.backend.test.BackendTest(kiln.backend)`` runs the
ONNX backend test suite against kiln. Devices: ``CPU`` compiles for the host CPU, ``CUDA`` for
an NVIDIA GPU when kiln sees a usable one."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from . import InferenceSession, KilnError, devices


def _kiln_device(device: str) -> str:
    d = Device(device)
    if d.type == DeviceType.CPU:
        return "cpu"
    if d.type == DeviceType.CUDA:
        return "cuda"
    raise KilnError(f"kiln has no backend device {device!r}")


class KilnRep(BackendRep):
    """A prepared model: runs on positional or named inputs."""

    def __init__(self, session: InferenceSession):
        self.session = session
        self._inputs = [i.name for i in session.get_inputs()]
        self._outputs = [o.name for o in session.get_outputs()]

    def run(self, inputs: Union[Sequence[Any], Dict[str, Any], Any], **kwargs: Any) -> Any:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self._inputs):
                raise KilnError(f"the model takes {len(self._inputs)} inputs ({', '.join(self._inputs)}), {len(inputs)} given")
            feeds = {n: np.asarray(x) for n, x in zip(self._inputs, inputs)}
        outs = self.session.run(None, feeds)
        return namedtupledict("Outputs", self._outputs)(*outs)


class KilnBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnRep:
        return KilnRep(InferenceSession(model.SerializeToString(), device=_kiln_device(device)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> Any:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError("kiln runs whole models: use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            d = _kiln_device(device)
        except KilnError:
            return False
        return d == "cpu" or any(x["target"] == d and x["usable"] for x in devices())


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
is_compatible = KilnBackend.is_compatible
