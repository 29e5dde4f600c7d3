#!/usr/bin/env bash
# Installs what kiln needs on Debian 12 (bookworm), and only what is missing; safe to run again.
#   - a C toolchain and pkg-config (for -sys crates)
#   - LLVM/MLIR 22 development packages (bookworm-security ships them)
#   - Rust, through rustup, if no cargo is found
# Uses sudo for apt when not run as root.
set -euo pipefail

say() { printf 'setup: %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    say "not root and no sudo: install the packages below yourself"; SUDO="false"; fi
fi

# LLVM/MLIR 22. libpolly-22-dev and libzstd-dev are needed at link time even though nothing names them.
# spirv-tools disassembles the SPIR-V kiln makes for OpenCL (`kiln emit --stage spirv`).
PACKAGES=(build-essential pkg-config ca-certificates curl python3 python3-venv spirv-tools
          llvm-22-dev libmlir-22-dev mlir-22-tools libpolly-22-dev libzstd-dev zlib1g-dev libclang-22-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "Debian packages present (LLVM/MLIR 22 included)"
fi

if [ ! -x /usr/lib/llvm-22/bin/llvm-config ]; then
  say "error: /usr/lib/llvm-22/bin/llvm-config is missing after the install"; exit 1
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  say "installing Rust with rustup (stable, minimal profile)"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  say "Rust installed in ~/.cargo; the Makefile puts it on PATH"
else
  say "Rust present: $( (command -v cargo >/dev/null && cargo --version) || "$HOME/.cargo/bin/cargo" --version)"
fi
