#!/usr/bin/env bash
# Sets up an OpenCL platform that runs SPIR-V on this CPU: Intel's OpenCL CPU runtime from PyPI
# (Debian's PoCL 3.1 rejects clCreateProgramWithIL), cached outside the repo, with an ICD file the
# Khronos loader (Debian's ocl-icd) finds through OCL_ICD_VENDORS. Prints the environment to use:
#   eval "$(scripts/setup-opencl.sh)"     # then kiln ... --device opencl
# Idempotent; installs the Debian loader packages with sudo when not root.
set -euo pipefail
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
DIR="$CACHE/opencl"
say() { printf 'setup-opencl: %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
for p in ocl-icd-libopencl1 ocl-icd-opencl-dev clinfo; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    say "installing $p"; $SUDO apt-get install -y -qq --no-install-recommends "$p" >&2 || { $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq --no-install-recommends "$p" >&2; }
  fi
done
if [ ! -f "$DIR/.complete" ]; then
  say "installing Intel's OpenCL CPU runtime (PyPI intel-opencl-rt) into $DIR"
  rm -rf "$DIR"; mkdir -p "$DIR"
  python3 -m venv "$DIR/venv" >&2
  "$DIR/venv/bin/pip" install -q intel-opencl-rt intel-cmplr-lib-rt >&2
  mkdir -p "$DIR/lib" "$DIR/icd"
  for f in "$DIR"/venv/lib/*; do
    case "$(basename "$f")" in libOpenCL*) ;; *) [ -f "$f" ] && ln -sf "$f" "$DIR/lib/" ;; esac
  done
  [ -f "$DIR/lib/libintelocl.so" ] || { say "error: libintelocl.so not found after the install"; exit 1; }
  echo "$DIR/lib/libintelocl.so" > "$DIR/icd/intel-cpu.icd"
  touch "$DIR/.complete"
fi
echo "export OCL_ICD_VENDORS=$DIR/icd LD_LIBRARY_PATH=$DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
