#!/usr/bin/env bash
# Installs cargo-fuzz (from crates.io, once) for kiln's fuzz targets; safe to run again. The
# targets build with the stable toolchain and no sanitizer (`cargo fuzz build -s none`).
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
if cargo fuzz --version >/dev/null 2>&1; then
  printf 'setup-fuzz: %s present\n' "$(cargo fuzz --version)" >&2
else
  printf 'setup-fuzz: installing cargo-fuzz (about 30 s)\n' >&2
  cargo install cargo-fuzz --locked --quiet
fi
