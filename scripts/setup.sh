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

# Where cargo finds LLVM/MLIR 22 for crates built outside this repository (`cargo install --path
# compiler`, a host crate depending on `kiln`): /usr/bin/llvm-config is LLVM 14 on Debian 12, and
# the -sys crates read these variables. The repository's own .cargo/config.toml sets them for
# builds inside it; the user's ~/.cargo/config.toml gets any that it does not set yet.
python3 - "${CARGO_HOME:-$HOME/.cargo}/config.toml" <<'PY'
import os, re, sys
path = sys.argv[1]
want = {k: "/usr/lib/llvm-22" for k in ("MLIR_SYS_220_PREFIX", "TABLEGEN_220_PREFIX", "LLVM_SYS_221_PREFIX")}
text = open(path).read() if os.path.exists(path) else ""
missing = [k for k in want if not re.search(rf"^\s*{k}\s*=", text, re.M)]
if not missing:
    print(f"setup: {path} already tells cargo where LLVM/MLIR 22 is")
    sys.exit(0)
lines = "".join(f'{k} = "{want[k]}"\n' for k in missing)
m = re.search(r"^\[env\]\s*$", text, re.M)
if m:
    text = text[: m.end()] + "\n" + lines.rstrip("\n") + text[m.end():]
else:
    text = text + ("\n" if text and not text.endswith("\n") else "") + "\n# kiln (scripts/setup.sh): LLVM/MLIR 22\n[env]\n" + lines
os.makedirs(os.path.dirname(path), exist_ok=True)
tmp = path + ".kiln-setup"
with open(tmp, "w") as f:
    f.write(text)
os.replace(tmp, path)
print(f"setup: {path}: set {', '.join(missing)} (where cargo finds LLVM/MLIR 22 outside this repository)")
PY
