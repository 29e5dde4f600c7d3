# kiln's two commands: `make demo` (the main job on a built-in model) and `make test` (everything).
# Both run the idempotent setup first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

SUITES := node pytorch-converted pytorch-operator simple

.PHONY: train-digits train-digits-bf16 grad-vs-torch setup demo test check-runtime-deps conformance conformance-mirror ratchet bench-pool ops-doc examples bench bench-int8 bench-precision bench-ops fuzz fuzz-smoke soak python python-test python-ratchet python-overhead serve-demo install-check lint

setup:
	@./scripts/setup.sh

demo: setup
	$(CARGO) run --release -q -p kiln-compiler --bin kiln -- demo

# The OpenCL device's tests need a platform that builds SPIR-V: setup-opencl.sh installs Intel's
# CPU runtime (once) and prints the environment that finds it. setup-cuda-tools.sh installs ptxas
# and libdevice (Debian's nvidia-cuda-toolkit), which check and link the PTX kiln makes.
test: setup check-runtime-deps
	$(MAKE) --no-print-directory lint
	./scripts/setup-cuda-tools.sh
	eval "$$(./scripts/setup-opencl.sh)" && $(CARGO) test --workspace
	$(MAKE) --no-print-directory examples
	$(MAKE) --no-print-directory conformance
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory python-test

# Formatting and clippy, warnings as errors (the lints every crate takes are in Cargo.toml).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy -q --workspace --all-targets -- -D warnings

# The debug kiln and the compiler's examples, built the way `cargo test --workspace` builds them
# (every member, dev-dependencies on), so they are the binaries the tests already made. A `-p
# kiln-compiler` build resolves features differently and would build LLVM, MLIR and everything
# over them a second time: about 2 GB more on disk and minutes on CI's two cores.
DEBUG_BUILD := $(CARGO) build -q --workspace --bins --examples

# The JIT example traces, compiles and checks an MLP and saves its artifact; the runtime-only
# example (no MLIR/LLVM in its build) loads and runs that artifact. The host crate of
# examples/host runs as a user's program would (the `kiln` crate's own examples run inside the
# integration tests: tests/tests/facade.rs).
examples:
	@mkdir -p target/examples
	$(DEBUG_BUILD)
	./target/debug/examples/jit_mlp --save target/examples/mlp.kiln
	$(CARGO) run -q -p kiln-runtime --example run_artifact -- target/examples/mlp.kiln
	./target/debug/kiln-host-example
	$(MAKE) --no-print-directory soak SOAK_RUNS=10000

# Runs the example MLP's artifact SOAK_RUNS times and fails if resident memory grows (after a
# warm-up) by more than 1 MiB.
SOAK_RUNS ?= 100000
soak:
	@mkdir -p target/examples; test -f target/examples/mlp.kiln || { $(DEBUG_BUILD) && ./target/debug/examples/jit_mlp --save target/examples/mlp.kiln; }
	$(CARGO) run -q -p kiln-runtime --example soak -- target/examples/mlp.kiln $(SOAK_RUNS)

# The ONNX backend tests, on the reference interpreter, compiled for the CPU and compiled to SPIR-V
# for OpenCL (Intel's CPU runtime here): every test listed in tests/conformance/<device>.txt must
# pass (a ratchet). The data is fetched once into ~/.cache/kiln.
DEVICES := ref cpu opencl
conformance:
	$(DEBUG_BUILD)
	@eval "$$(./scripts/setup-opencl.sh)" && d=$$(./scripts/fetch-onnx-tests.sh) && for dev in $(DEVICES); do \
	  echo "conformance on $$dev:"; \
	  ./target/debug/kiln check $(addprefix $$d/,$(SUITES)) --device $$dev --expect tests/conformance/$$dev.txt --quiet || exit 1; \
	done

# The whole CPU list on a backend defined in the tests, not in the compiler (tests/tests/backend.rs;
# `make test` runs a fifth of it): what a target decides reaches the driver through its traits.
conformance-mirror:
	KILN_MIRROR_FULL=1 $(CARGO) test -q -p kiln-tests --test integration backend:: -- --nocapture

# The digits check of issue 37 (not part of `make test`: it installs PyTorch into a dev venv,
# ~/.cache/kiln/train-venv, and trains for about a minute): the CIFAR-10 CNN trained on
# scikit-learn's digits by kiln's compiled step (examples/train_cifar.rs) and by PyTorch from the
# same weights, order and optimizer; fails when the test accuracies differ by more than a point.
TRAIN_DIGITS_DIR := target/train-digits
TRAIN_DIGITS_ARGS := --batch 64 --lr 0.01 --momentum 0.9 --threads 2
train-digits:
	@py=$$(./scripts/setup-train.sh) && \
	$$py scripts/train_digits.py prepare $(TRAIN_DIGITS_DIR) --epochs 10 && \
	$(CARGO) run --release -q -p kiln-compiler --example train_cifar -- --data $(TRAIN_DIGITS_DIR) $(TRAIN_DIGITS_ARGS) --every 22 && \
	$$py scripts/train_digits.py compare $(TRAIN_DIGITS_DIR) $(TRAIN_DIGITS_ARGS)

# The same in mixed precision (bf16 products, f32 master weights) against PyTorch's CPU autocast.
train-digits-bf16:
	@py=$$(./scripts/setup-train.sh) && \
	$$py scripts/train_digits.py prepare $(TRAIN_DIGITS_DIR) --epochs 10 && \
	$(CARGO) run --release -q -p kiln-compiler --example train_cifar -- --data $(TRAIN_DIGITS_DIR) $(TRAIN_DIGITS_ARGS) --every 22 --precision bf16 && \
	$$py scripts/train_digits.py compare $(TRAIN_DIGITS_DIR) $(TRAIN_DIGITS_ARGS) --precision bf16

# kiln's gradient rules against PyTorch's autograd (issue 37; not part of `make test`: it needs
# the same train venv with PyTorch and onnx, and the release CLI): small ONNX models, one or a few
# ops each with a training-domain Gradient node, run by `kiln run` on the CPU and by `kiln check`
# on the interpreter, in f64 and f32, against torch.autograd.grad on the same forward pass
# (scripts/grad_vs_torch.py, under a minute); fails on any gradient outside the tolerance.
# `make grad-vs-torch CARGO=true KILN=path/to/kiln` checks a CLI already built elsewhere.
KILN ?= target/release/kiln
GRAD_VS_TORCH_ARGS := --device cpu,ref
grad-vs-torch:
	@py=$$(./scripts/setup-train.sh) && \
	$(CARGO) build --release -q -p kiln-compiler --bin kiln && \
	$$py scripts/grad_vs_torch.py --kiln $(KILN) $(GRAD_VS_TORCH_ARGS)

# Refreshes the ratchet lists with every test that passes now.
ratchet:
	$(DEBUG_BUILD)
	@eval "$$(./scripts/setup-opencl.sh)" && d=$$(./scripts/fetch-onnx-tests.sh) && for dev in $(DEVICES); do \
	  ./target/debug/kiln check $(addprefix $$d/,$(SUITES)) --device $$dev --write-passing tests/conformance/$$dev.txt --quiet | tail -n 1; \
	done

# Regenerates docs/ops.md, the op coverage table.
ops-doc:
	@d=$$(./scripts/fetch-onnx-tests.sh) && \
	  $(CARGO) run -q -p kiln-ir --release --example ops_table -- $$d/node > docs/ops.md

# kiln against onnxruntime on ../shared/models and four generated models (squeezenet1_1,
# yolov8n_320, dbnet_mv3_640, bert_tiny_128: scripts/bench_models.py, once into ~/.cache/kiln/bench-models;
# GENERATED=0 leaves them out) (THREADS=2 by default): median latency, ratio, compile time cold
# and cached. onnxruntime is fetched once into ~/.cache/kiln/bench-venv.
bench: setup
	@./scripts/bench.sh

# The CPU launch pool's synchronisation: one launch of empty workgroups at 1 to 16 threads, back
# to back and after the workers sleep (runtime/examples/pool_cost.rs; the 16-core host runs it in
# scripts/gpu/session.sh cpu-scale).
bench-pool:
	$(CARGO) run -q --release -p kiln-runtime --example pool_cost

# int8: resnet18 and mobilenet_v2 quantized by onnxruntime's quantize_static (QDQ, u8/s8
# per-channel), gpt_block and BERT-tiny's encoder (bench_models.py's bert_tiny_128) by its
# quantize_dynamic (DynamicQuantizeLinear + MatMulInteger, s8 weights), into
# ~/.cache/kiln/int8-models once, timed next to their f32 originals in one bench table (kiln and
# onnxruntime, same threads), then how many quantization steps the QDQ models' outputs are from
# onnxruntime's on 8 random inputs (scripts/int8_agreement.py). THREADS, ROUNDS: as for bench.
bench-int8: setup
	@py=$$(./scripts/setup-python.sh) && out=$${KILN_CACHE:-$$HOME/.cache/kiln}/int8-models && \
	  $$py scripts/quantize_bench_models.py $${MODELS:-../shared/models} $$out && ./scripts/bench.sh $$out && \
	  $$py scripts/int8_agreement.py $${CARGO_TARGET_DIR:-target}/release/kiln $$out

# --precision bf16 against f32, kiln alone, on ../shared/models: latency of each (same threads,
# taking turns), the speed-up, and the deviation from f32 on SAMPLES=100 random inputs (largest,
# relative, top-1 agreement). THREADS, ROUNDS, PRECISION: see scripts/bench-precision.sh.
bench-precision: setup
	@./scripts/bench-precision.sh

# kiln against onnxruntime one op at a time, on ~70 single-op models of real models' shapes
# (generated once into ~/.cache/kiln/bench-ops): latency, ratio, kiln's GFLOP/s and % of the
# measured fp32 peak. THREADS, ROUNDS, ITERS, ONLY=REGEX: see scripts/bench-ops.sh.
bench-ops: setup
	@./scripts/bench-ops.sh

# The fuzz targets (fuzz/: the ONNX importer, the text form, .npy, artifacts, one op evaluated, and
# the compiler against the interpreter; cargo-fuzz on the stable toolchain) for FUZZ_SECONDS each;
# the corpus grows in ~/.cache/kiln/fuzz-corpus. A crash is kept under fuzz/artifacts/ and fails
# the target. FUZZ_JOBS=N runs each in N processes. `make test` runs a 10-second smoke of each
# parser target; the compiler's target (compile_diff, which links MLIR: a long build) is smoked by
# the integration tests instead (tests/tests/fuzzed.rs, the same check on fixed inputs).
FUZZ_SECONDS ?= 300
fuzz:
	@./scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz-smoke:
	@./scripts/fuzz.sh 10 onnx_import text_parse npy_read artifact_read op_eval

# The Python package (python/, PyO3 + maturin) into the venv setup-python.sh keeps outside the
# repo; PROFILE=dev (the default here) reuses the debug build `cargo test` made, PROFILE=release
# is what `pip install ./python` builds.
PROFILE ?= dev
python:
	@py=$$(./scripts/setup-python.sh) && PATH="$$(dirname $$py):$$PATH" MATURIN_PEP517_ARGS="--profile $(PROFILE)" \
	  $$py -m pip install --quiet --no-build-isolation --force-reinstall --no-deps ./python

# The package's pytest suite: sessions against onnxruntime, errors, threads, compile/load/emit,
# and the ONNX backend tests through kiln.backend that python/tests/backend_cpu.txt lists.
python-test: python
	@py=$$(./scripts/setup-python.sh) && eval "$$(./scripts/setup-opencl.sh)" && cd /tmp && \
	  $$py -m pytest -q -p no:cacheprovider -n 2 -rs $(CURDIR)/python/tests

# Runs every ONNX backend test through kiln.backend and rewrites the ratchet list.
python-ratchet: python
	@py=$$(./scripts/setup-python.sh) && cd /tmp && \
	  { echo "# ONNX backend tests (onnx.backend.test, through kiln.backend on the CPU) that must pass: a ratchet."; \
	    echo "# Refresh with \`make python-ratchet\`."; \
	    KILN_BACKEND_ALL=1 $$py -m pytest -q -p no:cacheprovider -n 2 -rA $(CURDIR)/python/tests/test_backend.py | \
	    sed -n 's/^PASSED .*::\(test_.*\)_cpu$$/\1/p' | sort; } > $(CURDIR)/python/tests/backend_cpu.txt.new; \
	  mv $(CURDIR)/python/tests/backend_cpu.txt.new $(CURDIR)/python/tests/backend_cpu.txt; \
	  echo "python-ratchet: $$(grep -vc '^#' $(CURDIR)/python/tests/backend_cpu.txt) tests pass"

# Python's per-call overhead over Rust's Executable::run on a tiny model (release builds).
python-overhead:
	@$(MAKE) --no-print-directory python PROFILE=release
	@py=$$(./scripts/setup-python.sh) && cargo build --release -q -p kiln-compiler --example overhead && \
	  $$py scripts/python_overhead.py target/release/examples/overhead

# kiln inside Ray Serve (examples/serving/, docs/serving.md): a local Ray cluster in the client's
# process (stopped at the end, failure and SIGTERM included), the built-in MLP served by 1 replica
# without and with dynamic batching, by 2, and by 2 from a .kiln artifact over HTTP, every answer
# checked against onnxruntime; exits nonzero on any wrong one. Its own venv (setup-serve.sh: Ray
# Serve, kiln built in release mode); not part of `make test`. SERVE_ARGS passes flags to the client.
SERVE_ARGS ?=
serve-demo:
	@py=$$(./scripts/setup-serve.sh) && $$py examples/serving/client.py $(SERVE_ARGS)

# A new user's install, outside this repository: `cargo install --path compiler --locked` gives a
# working `kiln`, and a copy of examples/host depending on `kiln` by path builds and runs, with
# only what scripts/setup.sh wrote into ~/.cargo/config.toml. Release builds from nothing: about
# 20 minutes on 2 cores, so not part of `make test` (which builds and runs examples/host).
install-check: setup
	./scripts/install-check.sh
