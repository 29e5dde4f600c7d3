/* What kiln's C kernels (ukernel.c, recurrent.c, reduction.c, movement.c) share besides vectors: per-thread
 * scratch space and the split of work into units. */
#ifndef KILN_WORKSPACE_H
#define KILN_WORKSPACE_H
#include <stdint.h>
#include <stdlib.h>

/* Per-thread scratch space, 4 slots for each object file that includes this, grown on demand
 * (the runtime's threads live as long as the process). */
static inline float *scratch(int which, size_t floats) {
    static __thread float *buf[4];
    static __thread size_t cap[4];
    if (cap[which] < floats) {
        free(buf[which]);
        buf[which] = aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        cap[which] = buf[which] ? floats : 0;
    }
    return buf[which];
}

/* The range [lo, hi) of `n` items (rounded to multiples of `r`) that chunk q of `chunks` covers. */
static inline void chunk_range(int64_t n, int64_t r, int64_t chunks, int64_t q, int64_t *lo, int64_t *hi) {
    int64_t per = ((n + r - 1) / r + chunks - 1) / chunks * r;
    *lo = q * per < n ? q * per : n;
    *hi = (q + 1) * per < n ? (q + 1) * per : n;
}

#endif
