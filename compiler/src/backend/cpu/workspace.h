/* What kiln's C kernels (gemm.c, conv.c, depthwise.c, pool.c, gather.c, recurrent.c, reduction.c,
 * movement.c, attention.c, quantized.c) share besides vectors: per-thread scratch space, failure
 * reports and the split of work into units. */
#ifndef KILN_WORKSPACE_H
#define KILN_WORKSPACE_H
#include <stdint.h>
#include <stdlib.h>

/* The run's status word (kiln_runtime::status; support.c keeps it): a kernel that cannot finish
 * records why and returns without writing its result, and the run fails naming the kernel. No
 * kernel aborts the process. */
#define KILN_STATUS_INDEX 1
#define KILN_STATUS_ALLOC 2
#define KILN_STATUS_INTERNAL 3
__attribute__((visibility("hidden"))) void kiln_fail(uint32_t code, uint64_t detail);
/* Test only (KILN_TEST_FAIL_ALLOC): whether an allocation of `bytes` is refused. */
__attribute__((visibility("hidden"))) int kiln_refuse_alloc(uint64_t bytes);

/* A state the planner rules out (a bug, not input): reported, not aborted on. */
#define KILN_INTERNAL_FAILURE() kiln_fail(KILN_STATUS_INTERNAL, 0)

/* Scratch blocks (support.c): counted against the memory budget and listed, so that the
 * runtime frees every thread's when it unloads the library. `bytes` a multiple of 64; NULL, the
 * failure recorded, when the budget or the system refuses them. */
__attribute__((visibility("hidden"))) void *kiln_scratch_alloc(uint64_t bytes);
__attribute__((visibility("hidden"))) void kiln_scratch_free(void *p);

/* Per-thread scratch space, 4 slots for each object file that includes this, grown on demand
 * and kept from launch to launch (the compiler bounds what each slot may hold: scratch.rs,
 * `slots`). NULL when the memory cannot be had, the failure recorded: the caller returns
 * without writing its result. Every worker returns from its workgroups as usual, so no thread
 * waits for it. */
static inline float *scratch(int which, size_t floats) {
    static __thread float *buf[4];
    static __thread size_t cap[4];
    if (floats == 0) floats = 1; /* (so that NULL always means failure) */
    if (cap[which] < floats) {
        kiln_scratch_free(buf[which]);
        size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
        buf[which] = (float *)kiln_scratch_alloc(bytes);
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

/* A strip of `cols` (at most 48) flat positions from p0 (p = oh * Wq + ow, rows from oh0; `flat`
 * in all; positions with ow >= OW are padding, computed and dropped), as runs of valid lanes:
 * lanes run_l .. run_l + run_n go to output index run_o (oh * OW + ow). The direct convolutions'
 * stores (conv.c, quantized.c) take them. Returns how many. */
static inline int64_t strip_runs(int64_t p0, int64_t cols, int64_t flat, int64_t Wq, int64_t OW, int64_t oh0, int64_t *run_l,
                                 int64_t *run_n, int64_t *run_o) {
    int64_t runs = 0;
    for (int64_t l = 0; l < cols && p0 + l < flat;) {
        int64_t p = p0 + l, oh = p / Wq, ow = p % Wq;
        if (ow >= OW) {
            l += Wq - ow;
            continue;
        }
        int64_t n = OW - ow < cols - l ? OW - ow : cols - l;
        if (p + n > flat) n = flat - p;
        run_l[runs] = l;
        run_n[runs] = n;
        run_o[runs] = (oh0 + oh) * OW + ow;
        runs++;
        l += n;
    }
    return runs;
}

#endif
