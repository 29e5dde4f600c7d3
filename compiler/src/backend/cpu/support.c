/* Support code linked into every CPU kernel library, so artifacts need nothing from MLIR at run
 * time. memrefCopy is what MLIR's memref-to-LLVM lowering calls to copy between memrefs whose
 * layouts are not both contiguous (same contract as MLIR's CRunnerUtils); the run's status word
 * and the allocations kernels make report failures instead of aborting, and the allocations are
 * counted against the memory budget. */
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

/* The kernels' scratch against the memory budget (kiln_runtime::memory::ScratchAccount): the
 * runtime hands each library it loads its artifact's account (kiln_scratch_account) before any
 * kernel runs. Every C kernel's scratch and MLIR temporary is counted in `held` before it is
 * allocated; one that would take `held` past `limit` (what the budget left after the load) is
 * refused like memory the system refused (code 2, the bytes), and its bytes are left in
 * `refused`, so that the run's error can say it was the budget. Without an account (a runtime
 * written before it) nothing is counted. */
typedef struct {
    uint64_t held;
    uint64_t limit;
    uint64_t peak;
    uint64_t refused;
} KilnScratchAccount;

static KilnScratchAccount *account;

/* Exported: the runtime calls it once, after loading the library and before any kernel runs. */
void kiln_scratch_account(void *a) { __atomic_store_n(&account, (KilnScratchAccount *)a, __ATOMIC_RELEASE); }

/* Whether `bytes` more fit in the account (and counts them if so). */
static int reserve(uint64_t bytes) {
    KilnScratchAccount *a = __atomic_load_n(&account, __ATOMIC_ACQUIRE);
    if (!a) return 1;
    uint64_t limit = __atomic_load_n(&a->limit, __ATOMIC_RELAXED);
    uint64_t held = __atomic_load_n(&a->held, __ATOMIC_RELAXED);
    do {
        if (bytes > limit || held > limit - bytes) {
            __atomic_store_n(&a->refused, bytes, __ATOMIC_RELAXED);
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&a->held, &held, held + bytes, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    uint64_t now = held + bytes, peak = __atomic_load_n(&a->peak, __ATOMIC_RELAXED);
    while (peak < now && !__atomic_compare_exchange_n(&a->peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return 1;
}

static void unreserve(uint64_t bytes) {
    KilnScratchAccount *a = __atomic_load_n(&account, __ATOMIC_ACQUIRE);
    if (a) __atomic_fetch_sub(&a->held, bytes, __ATOMIC_RELAXED);
}

/* `bytes` from the system, counted in the account first; NULL (the failure recorded) when the
 * test hook, the account or the system refuses them. */
static void *counted(uint64_t alignment, uint64_t bytes) {
    if (kiln_refuse_alloc(bytes) || !reserve(bytes)) {
        kiln_fail(KILN_STATUS_ALLOC, bytes);
        return NULL;
    }
    void *p = alignment ? aligned_alloc(alignment, bytes) : malloc(bytes);
    if (!p) {
        unreserve(bytes);
        kiln_fail(KILN_STATUS_ALLOC, bytes);
    }
    return p;
}

/* The C kernels' scratch (workspace.h): each block has a 64-byte header before the bytes the
 * kernel uses, which links it into this library's list of blocks, whichever thread holds it, so
 * that the runtime can free them all when it unloads the library (kiln_scratch_release): the
 * threads keep their blocks from launch to launch, and the workers' and callers' blocks were
 * lost when a program was dropped. */
typedef struct Block {
    struct Block *prev, *next;
    uint64_t bytes;
} Block;

#define BLOCK_HEADER 64
static Block blocks = {&blocks, &blocks, 0};
static char blocks_lock;

static void lock_blocks(void) {
    while (__atomic_test_and_set(&blocks_lock, __ATOMIC_ACQUIRE)) {
    }
}

static void unlock_blocks(void) { __atomic_clear(&blocks_lock, __ATOMIC_RELEASE); }

/* `bytes` (a multiple of 64) of scratch, 64-byte aligned; NULL with the failure recorded. */
KILN_HIDDEN void *kiln_scratch_alloc(uint64_t bytes) {
    char *p = counted(64, BLOCK_HEADER + bytes);
    if (!p) return NULL;
    Block *b = (Block *)p;
    b->bytes = BLOCK_HEADER + bytes;
    lock_blocks();
    b->prev = &blocks;
    b->next = blocks.next;
    blocks.next->prev = b;
    blocks.next = b;
    unlock_blocks();
    return p + BLOCK_HEADER;
}

/* Frees a block kiln_scratch_alloc gave (NULL: nothing). */
KILN_HIDDEN void kiln_scratch_free(void *q) {
    if (!q) return;
    Block *b = (Block *)((char *)q - BLOCK_HEADER);
    lock_blocks();
    b->prev->next = b->next;
    b->next->prev = b->prev;
    unlock_blocks();
    unreserve(b->bytes);
    free(b);
}

/* Exported: frees every thread's scratch blocks. The runtime calls it when it unloads the
 * library, once no kernel of it runs or will (its workers have ended); the threads' pointers to
 * them are never read again. */
void kiln_scratch_release(void) {
    lock_blocks();
    while (blocks.next != &blocks) {
        Block *b = blocks.next;
        blocks.next = b->next;
        unreserve(b->bytes);
        free(b);
    }
    blocks.prev = &blocks;
    unlock_blocks();
}

/* MLIR's temporaries (finalize-memref-to-llvm with use-generic-functions). A refused allocation
 * is recorded here and returns NULL, which the kernel tests before any use (backend/cpu/alloc.rs)
 * and returns; at least a byte is asked for, so NULL always means failure. The temporaries a
 * body holds are listed per thread with their sizes (the free has only the pointer, and the
 * account gets the bytes back), so that those it allocated before a refusal are freed when its
 * wrapper leaves (kiln_status_leave): a failed run leaks nothing. */
typedef struct {
    void *p;
    uint64_t bytes;
} Live;

static __thread Live *live;
static __thread size_t live_count, live_cap;

/* Lists `p` (a new allocation of `bytes`); NULL, recorded as a failure, when `p` is NULL or the
 * list cannot grow (then `p` is freed). */
static void *listed(void *p, uint64_t bytes) {
    if (p && live_count == live_cap) {
        size_t cap = live_cap ? 2 * live_cap : 16;
        Live *grown = realloc(live, cap * sizeof(Live));
        if (grown) {
            live = grown;
            live_cap = cap;
        } else {
            free(p);
            unreserve(bytes);
            kiln_fail(KILN_STATUS_ALLOC, bytes);
            return NULL;
        }
    }
    if (!p) return NULL; /* (recorded by counted) */
    live[live_count].p = p;
    live[live_count].bytes = bytes;
    live_count++;
    return p;
}

KILN_HIDDEN void *_mlir_memref_to_llvm_alloc(uint64_t size) {
    uint64_t n = size ? size : 1;
    return listed(counted(0, n), n);
}

KILN_HIDDEN void *_mlir_memref_to_llvm_aligned_alloc(uint64_t alignment, uint64_t size) {
    /* aligned_alloc wants a multiple of the alignment (a power of two). */
    uint64_t n = size ? (size + alignment - 1) / alignment * alignment : alignment;
    return listed(counted(alignment, n), n);
}

KILN_HIDDEN void _mlir_memref_to_llvm_free(void *p) {
    /* The latest first: bodies free in about the reverse order they allocate. */
    for (size_t i = live_count; i-- > 0;) {
        if (live[i].p == p) {
            unreserve(live[i].bytes);
            live[i] = live[--live_count];
            break;
        }
    }
    free(p);
}

/* After the body: frees what it still holds (only a body that stopped at a refused allocation
 * holds anything) and forgets the status word. */
KILN_HIDDEN void kiln_status_leave(void) {
    while (live_count > 0) {
        live_count--;
        unreserve(live[live_count].bytes);
        free(live[live_count].p);
    }
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
