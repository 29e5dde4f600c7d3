#!/usr/bin/env bash
# Installs NVIDIA's offline CUDA tools from Debian (package nvidia-cuda-toolkit, component non-free):
# `ptxas`, which checks the PTX kiln emits, and `libdevice.10.bc`, the math library kiln links into
# kernels that call exp, log, tanh, erf... No GPU or driver is needed or installed.
# Idempotent; adds the non-free component for bookworm in its own apt sources file when missing.
# Uses sudo when not root.
set -euo pipefail
say() { printf 'setup-cuda-tools: %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if command -v ptxas >/dev/null 2>&1 && [ -f /usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc ]; then
  say "ptxas present: $(ptxas --version | tail -1)"; exit 0
fi
SRC=/etc/apt/sources.list.d/kiln-non-free.sources
if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  say "adding Debian's non-free component ($SRC)"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' | $SUDO tee "$SRC" >/dev/null
  $SUDO apt-get update -qq >&2
fi
say "installing nvidia-cuda-toolkit (ptxas, libdevice; about 1.5 minutes)"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >&2
say "ptxas: $(ptxas --version | tail -1)"
