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
