/* What the microkernel's C files (gemm.c, conv.c, depthwise.c, pool.c) share: the register tile's
 * size, the epilogue applied to each result as it is stored, the bf16 tile, and the packed GEMM
 * that gemm.c holds and the convolutions run on (kiln_gemm_block and its operands' sources). */
#ifndef KILN_TILE_H
#define KILN_TILE_H
#include <stdint.h>
#include <stdlib.h>

#ifndef KILN_MR
#define KILN_MR 8
#endif
#define MR KILN_MR
#define NR 32

#include "simd.h"

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2, ACT_SIGMOID = 3, ACT_HARDSWISH = 4, ACT_SWISH = 5 };
/* Or'ed into the activation's code: the residual is added after it, not before. */
enum { ACT_RESIDUAL_LAST = 8 };

/* What the last K block's store adds and clamps. Pointers are at the tile's first element. */
typedef struct {
    const float *bias_row; /* bias_row[i] for tile row i */
    const float *bias_col; /* bias_col[j] for tile column j */
    const float *res;      /* res[i * ldr + at(j, rv)] */
    int64_t ldr;
    int64_t act;
    float lo, hi;
    int64_t rv; /* the residual's distance between column blocks of 16: 16, or a blocked plane */
} Epilogue;

/* Where column j of a row lies when each 16 columns are `stride` floats apart: j itself in a
 * row-major matrix (stride 16); in a channel-blocked (NCHW16c) result stored transposed, column
 * j (a channel) is in plane j / 16. */
static inline int64_t at(int64_t j, int64_t stride) { return j / 16 * stride + j % 16; }

static inline v16 finish(v16 v, const Epilogue *e, int64_t i, int64_t j) {
    int64_t act = e->act & ~(int64_t)ACT_RESIDUAL_LAST, last = e->act & ACT_RESIDUAL_LAST;
    if (e->bias_row) v += splat(e->bias_row[i]);
    if (e->bias_col) v += load16(e->bias_col + j);
    if (e->res && !last) v += load16(e->res + i * e->ldr + at(j, e->rv));
    /* vmax/vmin give their second operand where either is NaN: NaN passes through, as ONNX
     * has it. */
    if (act == ACT_RELU) {
        v = vmax(splat(0.0f), v);
    } else if (act == ACT_CLIP) {
        v = vmin(splat(e->hi), vmax(splat(e->lo), v));
    } else if (act == ACT_SIGMOID) {
        v = splat(1.0f) / (splat(1.0f) + vexp(-v));
    } else if (act == ACT_HARDSWISH) {
        /* x * clamp(x / 6 + 1/2, 0, 1), as ONNX (and the interpreter) has it; NaN stays NaN. */
        v = v * vmin(splat(1.0f), vmax(splat(0.0f), v / splat(6.0f) + splat(0.5f)));
    } else if (act == ACT_SWISH) {
        /* x * sigmoid(alpha x), alpha in `lo` (SiLU: 1). */
        v = v * vrecip(splat(1.0f) + vexp(-splat(e->lo) * v));
    }
    if (e->res && last) v += load16(e->res + i * e->ldr + at(j, e->rv));
    return v;
}

static inline float finish1(float v, const Epilogue *e, int64_t i, int64_t j) {
    int64_t act = e->act & ~(int64_t)ACT_RESIDUAL_LAST, last = e->act & ACT_RESIDUAL_LAST;
    if (e->bias_row) v += e->bias_row[i];
    if (e->bias_col) v += e->bias_col[j];
    if (e->res && !last) v += e->res[i * e->ldr + at(j, e->rv)];
    if (act == ACT_RELU) v = v < 0.0f ? 0.0f : v;
    else if (act == ACT_CLIP) {
        v = v < e->lo ? e->lo : v;
        v = v > e->hi ? e->hi : v;
    } else if (act == ACT_SIGMOID) {
        v16 s = splat(1.0f) / (splat(1.0f) + vexp(splat(-v)));
        v = s[0];
    } else if (act == ACT_HARDSWISH) {
        float t = v / 6.0f + 0.5f;
        v = v * (t < 0.0f ? 0.0f : t > 1.0f ? 1.0f : t); /* (NaN: both false, NaN stays) */
    } else if (act == ACT_SWISH) {
        v16 s = splat(v) / (splat(1.0f) + vexp(splat(-e->lo * v)));
        v = s[0];
    }
    if (e->res && last) v += e->res[i * e->ldr + at(j, e->rv)];
    return v;
}

/* Whether the epilogue adds its residual after the activation: code that adds a residual itself
 * before `finish` (with an epilogue of the activation alone) adds it after instead. */
static inline int residual_last(const Epilogue *e) { return (e->act & ACT_RESIDUAL_LAST) != 0; }

/* The epilogue on the first n (1..16) lanes of a vector at (i, j); the other lanes' bias and
 * residual are not read. */
static inline v16 finish_n(v16 v, const Epilogue *e, int64_t i, int64_t j, int64_t n) {
    int64_t last = e->act & ACT_RESIDUAL_LAST;
    if (e->bias_row) v += splat(e->bias_row[i]);
    if (e->bias_col) v += load16_n(e->bias_col + j, n);
    if (e->res && !last) v += load16_n(e->res + i * e->ldr + at(j, e->rv), n);
    Epilogue act_only = {NULL, NULL, NULL, 0, e->act & ~(int64_t)ACT_RESIDUAL_LAST, e->lo, e->hi};
    v = finish(v, &act_only, 0, 0);
    if (e->res && last) v += load16_n(e->res + i * e->ldr + at(j, e->rv), n);
    return v;
}

/* An epilogue at the origin of a row-major C (ldr floats a row of the residual). */
static inline Epilogue epilogue_of(const float *bias_row, const float *bias_col, const float *res, int64_t ldr, int64_t act,
                                   float lo, float hi) {
    Epilogue e = {bias_row, bias_col, res, ldr, act, lo, hi, 16};
    return e;
}

/* A convolution's im2col matrix B[k, p] for one image, k = (c, kh, kw), p = (oh, ow). */
typedef struct {
    const float *x; /* this image: [C, H, W] */
    int64_t H, W, KH, KW, SH, SW, DH, DW, PH, PW, OW;
} Im2col;

typedef struct {
    int64_t kc, mc, nc;
} Blocking;

/* Where B comes from. */
typedef struct {
    const float *packed; /* packed whole (K x N in NR strips), or NULL */
    const float *b;      /* else a strided matrix, or */
    int64_t ldb, jb;
    const Im2col *im2col; /* an image's im2col matrix */
    int64_t plane;        /* else, when not 0: a channel-blocked image, B[c, n] = b[(c / 16) * plane + n * 16 + c % 16] */
} Bsource;

/* Where A comes from. */
typedef struct {
    const float *packed; /* packed whole (M x K in MR strips), or NULL */
    const float *a;      /* else a strided matrix, or */
    int64_t lda, ka;
    const Im2col *im2col; /* an image's im2col matrix, transposed (rows are output positions) */
    int64_t plane;        /* else, when not 0: a channel-blocked image, A[n, c] = a[(c / 16) * plane + n * 16 + c % 16] */
} Asource;

/* C[i0 .. i1, j0 .. j1] of C[M, N] = A * B over all of K, with the epilogue (bias and residual
 * pointers at C's origin). C[i, j] is at c[i * ldc + at(j, cv)]: cv = 16 for a row-major C, a
 * plane for a channel-blocked result stored transposed (rows positions, columns channels). */
__attribute__((visibility("hidden"))) void kiln_gemm_block(const Asource *A, const Bsource *B, float *c, int64_t ldc, int64_t cv,
                                                         int64_t M, int64_t N, int64_t K, int64_t i0, int64_t i1, int64_t j0,
                                                         int64_t j1, const Epilogue *epi, const Blocking *bl);

#if MR == 8
/* bf16 products (`--precision bf16`), on AVX512-BF16; only the AVX-512 object has them (the
 * compiler plans them where the host has the instructions). Out of line, so the rest of each
 * file keeps its own target. */
#define KILN_BF16 __attribute__((target("avx512bf16,avx512bw,avx512f"), noinline))

/* The top R rows of a bf16 register tile: c0/c1[r] = sum over K2 pair steps q of A's pair for
 * row r (a word at a[r * a_row + q * a_step]: the even k's bf16 low) times B's 32 pair words of
 * step q (at b + offs[q] where `gathered`, else at b + q * NR), two products a lane with
 * vdpbf16ps. Inlined with R, `gathered` and the strides constant: a direct convolution (packed
 * weights, offsets into its planes) and a GEMM (A's rows, a packed B strip) get loops of their
 * own. */
static inline __attribute__((always_inline, target("avx512bf16,avx512bw,avx512f"))) void
tile_bf16(int R, int gathered, int64_t K2, const uint32_t *restrict a, int64_t a_row, int64_t a_step, const uint32_t *restrict b,
          const int64_t *restrict offs, v16 *c0, v16 *c1) {
    __m512 s0[MR], s1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_ps();
    for (int64_t q = 0; q < K2; q++) {
        const uint32_t *bq = gathered ? b + offs[q] : b + q * NR;
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bq), b1 = (__m512bh)_mm512_loadu_si512(bq + 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[r * a_row + q * a_step]);
            s0[r] = _mm512_dpbf16_ps(s0[r], ar, b0);
            s1[r] = _mm512_dpbf16_ps(s1[r], ar, b1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        c0[r] = (v16)s0[r];
        c1[r] = (v16)s1[r];
    }
}
#endif

#endif
