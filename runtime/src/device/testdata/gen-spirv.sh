#!/usr/bin/env bash
# Regenerates kernels_cl.spv from kernels_cl.mlir (run once; the .spv is checked in so the tests need
# no MLIR). The OpenCL/Kernel SPIR-V pipeline of kiln's GPU target: convert the gpu.module to a
# spirv.module, cut that op out of the file, and serialise it.
set -euo pipefail
cd "$(dirname "$0")"
BIN=/usr/lib/llvm-22/bin
"$BIN/mlir-opt" kernels_cl.mlir --pass-pipeline='builtin.module(spirv-attach-target{ver=v1.0 caps=Addresses,Int64,Kernel client_api=OpenCL},map-memref-spirv-storage-class{client-api=opencl},convert-gpu-to-spirv{use-64bit-index=true},gpu.module(spirv.module(spirv-lower-abi-attrs,spirv-update-vce)))' \
  | awk '/spirv.module/ { on = 1 } on { print; depth += gsub(/{/, "{") - gsub(/}/, "}"); if (depth == 0) exit }' > /tmp/kiln-kernels-cl.spirv.mlir
"$BIN/mlir-translate" --no-implicit-module --serialize-spirv /tmp/kiln-kernels-cl.spirv.mlir -o kernels_cl.spv
rm -f /tmp/kiln-kernels-cl.spirv.mlir
