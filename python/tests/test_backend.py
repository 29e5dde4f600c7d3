"""The ONNX backend test suite through `kiln.backend` (onnx.backend.test), on the node tests the
ratchet `backend_cpu.txt` lists: each must pass. `KILN_BACKEND_ALL=1` runs every node test
instead (`make python-ratchet` refreshes the list from that run)."""

import os

import onnx.backend.test

import kiln.backend

HERE = os.path.dirname(os.path.abspath(__file__))
RATCHET = os.path.join(HERE, "backend_cpu.txt")

backend_test = onnx.backend.test.BackendTest(kiln.backend, __name__)
if os.environ.get("KILN_BACKEND_ALL"):
    backend_test.include(r"^test_.*_cpu$")
else:
    with open(RATCHET) as f:
        names = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    for name in names:
        backend_test.include(rf"^{name}_cpu$")
# Node tests only: the model zoo ("real") downloads models.
backend_test.exclude(r"^test_(bvlc|densenet|inception|resnet50|shufflenet|squeezenet|vgg19|zfnet)")

globals().update(backend_test.test_cases)
