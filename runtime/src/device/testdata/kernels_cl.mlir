// The OpenCL kernels of runtime/src/device/opencl.rs's tests, in the bare-pointer convention kiln's
// GPU code uses (one buffer pointer per kernel argument): c = a + b and c = a * b on 1024 f32, 64
// threads a workgroup (so 16 workgroups). kernels_cl.spv is made from it by gen-spirv.sh.
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @add(%a: memref<1024xf32>, %b: memref<1024xf32>, %c: memref<1024xf32>) kernel
        attributes {spirv.entry_point_abi = #spirv.entry_point_abi<workgroup_size = [64, 1, 1]>} {
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %t0 = arith.muli %bid, %bdim : index
      %i = arith.addi %t0, %tid : index
      %x = memref.load %a[%i] : memref<1024xf32>
      %y = memref.load %b[%i] : memref<1024xf32>
      %s = arith.addf %x, %y : f32
      memref.store %s, %c[%i] : memref<1024xf32>
      gpu.return
    }
    gpu.func @mul(%a: memref<1024xf32>, %b: memref<1024xf32>, %c: memref<1024xf32>) kernel
        attributes {spirv.entry_point_abi = #spirv.entry_point_abi<workgroup_size = [64, 1, 1]>} {
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %t0 = arith.muli %bid, %bdim : index
      %i = arith.addi %t0, %tid : index
      %x = memref.load %a[%i] : memref<1024xf32>
      %y = memref.load %b[%i] : memref<1024xf32>
      %s = arith.mulf %x, %y : f32
      memref.store %s, %c[%i] : memref<1024xf32>
      gpu.return
    }
  }
}
