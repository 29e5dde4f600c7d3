/* Support code linked into every CPU kernel library, so artifacts need nothing from MLIR at run
 * time. memrefCopy is what MLIR's memref-to-LLVM lowering calls to copy between memrefs whose
 * layouts are not both contiguous (same contract as MLIR's CRunnerUtils); the run's status word
 * and the allocations kernels make report failures instead of aborting. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KILN_HIDDEN __attribute__((visibility("hidden")))

/* The run's status word (kiln_runtime::status): the largest failure code, the smallest failing
 * kernel (reset to UINT32_MAX), and what the failure measured (bytes). */
typedef struct {
    uint32_t code;
    uint32_t kernel;
    uint64_t detail;
} KilnStatus;

#define KILN_STATUS_ALLOC 2

/* The word and the kernel whose workgroups this thread runs now: each kernel's exported wrapper
 * sets them before its body runs, so whatever fails inside (a C kernel's scratch, an MLIR
 * temporary) reports to the run that launched it. */
static __thread KilnStatus *status_word;
static __thread uint32_t status_kernel;

KILN_HIDDEN void kiln_status_enter(void *word, int64_t kernel) {
    status_word = (KilnStatus *)word;
    status_kernel = (uint32_t)kernel;
}

/* Records a failure: atomics, since every thread of a launch may fail at once. */
KILN_HIDDEN void kiln_fail(uint32_t code, uint64_t detail) {
    KilnStatus *s = status_word;
    if (!s) return; /* (every wrapper sets it before its body runs) */
    uint32_t c = __atomic_load_n(&s->code, __ATOMIC_RELAXED);
    while (c < code && !__atomic_compare_exchange_n(&s->code, &c, code, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    uint32_t k = __atomic_load_n(&s->kernel, __ATOMIC_RELAXED);
    while (k > status_kernel && !__atomic_compare_exchange_n(&s->kernel, &k, status_kernel, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    if (detail) __atomic_store_n(&s->detail, detail, __ATOMIC_RELAXED);
}

/* Test only: KILN_TEST_FAIL_ALLOC=<bytes> makes every allocation of at least that many bytes
 * (C kernels' scratch, MLIR temporaries) fail as if the system had refused it, so that tests
 * reach the failure path without exhausting memory. Read once; unset, nothing is refused. */
KILN_HIDDEN int kiln_refuse_alloc(uint64_t bytes) {
    static uint64_t limit; /* UINT64_MAX: nothing refused; 0: not read yet */
    uint64_t l = __atomic_load_n(&limit, __ATOMIC_RELAXED);
    if (l == 0) {
        const char *v = getenv("KILN_TEST_FAIL_ALLOC");
        char *end = NULL;
        unsigned long long n = v ? strtoull(v, &end, 10) : 0;
        l = v && end != v && *end == '\0' && n > 0 ? (uint64_t)n : UINT64_MAX;
        __atomic_store_n(&limit, l, __ATOMIC_RELAXED);
    }
    return bytes >= l;
}

/* MLIR's temporaries (finalize-memref-to-llvm with use-generic-functions). A refused allocation
 * is recorded here and returns NULL, which the kernel tests before any use (target/cpu/alloc.rs)
 * and returns; at least a byte is asked for, so NULL always means failure. The temporaries a
 * body holds are listed per thread, so that those it allocated before a refusal are freed when
 * its wrapper leaves (kiln_status_leave): a failed run leaks nothing. */
static __thread void **live;
static __thread size_t live_count, live_cap;

/* Lists `p` (a new allocation of `bytes`); NULL, recorded as a failure, when `p` is NULL or the
 * list cannot grow (then `p` is freed). */
static void *listed(void *p, uint64_t bytes) {
    if (p && live_count == live_cap) {
        size_t cap = live_cap ? 2 * live_cap : 16;
        void **grown = realloc(live, cap * sizeof(void *));
        if (grown) {
            live = grown;
            live_cap = cap;
        } else {
            free(p);
            p = NULL;
        }
    }
    if (!p) {
        kiln_fail(KILN_STATUS_ALLOC, bytes);
        return NULL;
    }
    live[live_count++] = p;
    return p;
}

KILN_HIDDEN void *_mlir_memref_to_llvm_alloc(uint64_t size) {
    uint64_t n = size ? size : 1;
    return listed(kiln_refuse_alloc(n) ? NULL : malloc(n), n);
}

KILN_HIDDEN void *_mlir_memref_to_llvm_aligned_alloc(uint64_t alignment, uint64_t size) {
    /* aligned_alloc wants a multiple of the alignment (a power of two). */
    uint64_t n = size ? (size + alignment - 1) / alignment * alignment : alignment;
    return listed(kiln_refuse_alloc(n) ? NULL : aligned_alloc(alignment, n), n);
}

KILN_HIDDEN void _mlir_memref_to_llvm_free(void *p) {
    /* The latest first: bodies free in about the reverse order they allocate. */
    for (size_t i = live_count; i-- > 0;) {
        if (live[i] == p) {
            live[i] = live[--live_count];
            break;
        }
    }
    free(p);
}

/* After the body: frees what it still holds (only a body that stopped at a refused allocation
 * holds anything) and forgets the status word. */
KILN_HIDDEN void kiln_status_leave(void) {
    while (live_count > 0) free(live[--live_count]);
    status_word = NULL;
}

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
