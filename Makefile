# kiln's two commands: `make demo` (the main job on a built-in model) and `make test` (everything).
# Both run the idempotent setup first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

SUITES := node pytorch-converted pytorch-operator simple

.PHONY: setup demo test check-runtime-deps conformance ratchet ops-doc bench

setup:
	@./scripts/setup.sh

demo: setup
	$(CARGO) run --release -q -p kiln-compiler --bin kiln -- demo

test: setup check-runtime-deps
	$(CARGO) test --workspace
	$(MAKE) --no-print-directory conformance

# The ONNX backend tests on the reference interpreter: every test listed in
# tests/conformance/ref.txt must pass (a ratchet); the data is fetched once into ~/.cache/kiln.
conformance:
	$(CARGO) build -q -p kiln-compiler --bin kiln
	@d=$$(./scripts/fetch-onnx-tests.sh) && \
	  ./target/debug/kiln check $(addprefix $$d/,$(SUITES)) --device ref --expect tests/conformance/ref.txt --quiet

# Refreshes the ratchet list with every test that passes now.
ratchet:
	$(CARGO) build -q -p kiln-compiler --bin kiln
	@d=$$(./scripts/fetch-onnx-tests.sh) && \
	  ./target/debug/kiln check $(addprefix $$d/,$(SUITES)) --device ref --write-passing tests/conformance/ref.txt --quiet | tail -n 1

# The runtime must load artifacts without MLIR or LLVM (docs/architecture.md).
check-runtime-deps:
	@./scripts/check-runtime-deps.sh

# Regenerates docs/ops.md, the op coverage table.
ops-doc:
	@d=$$(./scripts/fetch-onnx-tests.sh) && \
	  $(CARGO) run -q -p kiln-ir --release --example ops_table -- $$d/node > docs/ops.md

# kiln against onnxruntime on ../shared/models (THREADS=2 by default): median latency, ratio,
# compile time cold and cached. onnxruntime is fetched once into ~/.cache/kiln/bench-venv.
bench: setup
	@./scripts/bench.sh
