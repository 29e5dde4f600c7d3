# kiln's two commands: `make demo` (the main job on a built-in model) and `make test` (everything).
# Both run the idempotent setup first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: setup demo test check-runtime-deps

setup:
	@./scripts/setup.sh

demo: setup
	$(CARGO) run --release -q -p kiln-compiler --bin kiln -- demo

test: setup check-runtime-deps
	$(CARGO) test --workspace

# The runtime must load artifacts without MLIR or LLVM (docs/architecture.md).
check-runtime-deps:
	@./scripts/check-runtime-deps.sh
