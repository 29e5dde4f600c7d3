/* Support code linked into every CPU kernel library, so artifacts need nothing from MLIR at run
 * time. memrefCopy is what MLIR's memref-to-LLVM lowering calls to copy between memrefs whose
 * layouts are not both contiguous (same contract as MLIR's CRunnerUtils). */
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t rank;
    void *descriptor;
} UnrankedMemRef;

/* {allocated, aligned, offset, sizes[rank], strides[rank]} */
typedef struct {
    char *allocated;
    char *aligned;
    int64_t offset;
    int64_t sizes_and_strides[];
} MemRefDescriptor;

void memrefCopy(int64_t elem_size, UnrankedMemRef *src_arg, UnrankedMemRef *dst_arg) {
    int64_t rank = src_arg->rank;
    MemRefDescriptor *src = (MemRefDescriptor *)src_arg->descriptor;
    MemRefDescriptor *dst = (MemRefDescriptor *)dst_arg->descriptor;
    const int64_t *sizes = src->sizes_and_strides;
    const int64_t *src_strides = src->sizes_and_strides + rank;
    const int64_t *dst_strides = dst->sizes_and_strides + rank;
    char *s = src->aligned + src->offset * elem_size;
    char *d = dst->aligned + dst->offset * elem_size;
    if (rank == 0) {
        memcpy(d, s, (size_t)elem_size);
        return;
    }
    for (int64_t i = 0; i < rank; i++) {
        if (sizes[i] == 0) return;
    }
    /* The innermost run is copied at once when both sides are contiguous along it. */
    int64_t inner = (src_strides[rank - 1] == 1 && dst_strides[rank - 1] == 1) ? sizes[rank - 1] : 1;
    int64_t index[64] = {0};
    if (rank > 64) return;
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int64_t i = 0; i < rank; i++) {
            so += index[i] * src_strides[i];
            dof += index[i] * dst_strides[i];
        }
        memmove(d + dof * elem_size, s + so * elem_size, (size_t)(inner * elem_size));
        /* Advance the index, the innermost axis by `inner`. */
        int64_t axis = rank - 1;
        index[axis] += inner;
        while (index[axis] >= sizes[axis]) {
            index[axis] = 0;
            if (axis == 0) return;
            axis--;
            index[axis]++;
        }
    }
}

/* Kernels allocate their temporaries (a workgroup's padded input, im2col rows) on every call.
 * Through malloc, large ones are fresh mappings each time: page faults and zeroing on every run.
 * MLIR's lowering calls these instead (finalize-memref-to-llvm{use-generic-functions}); each
 * thread keeps the blocks it freed, by size, and hands them back to the next call that asks for
 * that size, so a model running again reuses the same memory. */
#include <stdlib.h>

#define KILN_CACHED_BLOCKS 16

typedef struct {
    size_t size;
    size_t pad; /* keeps the payload 16-byte aligned */
} BlockHeader;

static __thread __attribute__((tls_model("initial-exec"))) void *kiln_cache[KILN_CACHED_BLOCKS];

void *_mlir_memref_to_llvm_alloc(size_t size) {
    for (int i = 0; i < KILN_CACHED_BLOCKS; i++) {
        BlockHeader *h = (BlockHeader *)kiln_cache[i];
        if (h && h->size == size) {
            kiln_cache[i] = NULL;
            return h + 1;
        }
    }
    BlockHeader *h = (BlockHeader *)malloc(sizeof(BlockHeader) + size);
    if (!h) return NULL;
    h->size = size;
    return h + 1;
}

void _mlir_memref_to_llvm_free(void *p) {
    if (!p) return;
    BlockHeader *h = (BlockHeader *)p - 1;
    for (int i = 0; i < KILN_CACHED_BLOCKS; i++) {
        if (!kiln_cache[i]) {
            kiln_cache[i] = h;
            return;
        }
    }
    /* Full: the oldest entry goes, this one takes its place. */
    free(kiln_cache[0]);
    for (int i = 1; i < KILN_CACHED_BLOCKS; i++) kiln_cache[i - 1] = kiln_cache[i];
    kiln_cache[KILN_CACHED_BLOCKS - 1] = h;
}
