/* kiln's packed GEMM for the CPU, the way BLIS and MLAS do it: C[M,N] = A[M,K] * B[K,N] with an
 * epilogue, computed by an MR x NR register tile of broadcast FMAs over packed panels.
 *
 * - A is packed in row strips of MR: strip s holds A[s*MR + r, k] at [(s*K + k)*MR + r] (zero rows
 *   past M). Constant weights arrive packed this way from the compiler; activations are packed
 *   here, one MC x KC block at a time.
 * - B is packed in column strips of NR: strip t holds B[k, t*NR + c] at [(t*K + k)*NR + c]. A
 *   convolution's B is its im2col matrix, packed here straight from the input (implicit GEMM).
 * - Blocking: KC (a B micro-panel in L1), MC (an A block in L2) and NC (a B panel) come from the
 *   compiler, which reads the machine's cache sizes; they are arguments, so the schedule printed
 *   is the one run.
 * - The epilogue (bias per row or column, a residual of C's shape, ReLU or a clip) is applied as
 *   the last K block's tile is stored, while it is in registers.
 * - Workgroups: the compiler cuts the work into `units` (images x column or row ranges); the
 *   runtime's threads each run a range of them.
 *
 * KILN_MR is set by the compiler for the host's vector width (the packed weights use it too). The
 * vectors are GCC vector types: the compiler at hand (-march=native) picks the instructions. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_MR
#define KILN_MR 8
#endif
#define MR KILN_MR
#define NR 32

#include "simd.h"
#include "depthwise.h"
#include "workspace.h"
#include "ukernel.h"

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2 };

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
    if (e->bias_row) v += splat(e->bias_row[i]);
    if (e->bias_col) v += load16(e->bias_col + j);
    if (e->res) v += load16(e->res + i * e->ldr + at(j, e->rv));
    /* vmax/vmin give their second operand where either is NaN: NaN passes through, as ONNX
     * has it. */
    if (e->act == ACT_RELU) {
        v = vmax(splat(0.0f), v);
    } else if (e->act == ACT_CLIP) {
        v = vmin(splat(e->hi), vmax(splat(e->lo), v));
    }
    return v;
}

static inline float finish1(float v, const Epilogue *e, int64_t i, int64_t j) {
    if (e->bias_row) v += e->bias_row[i];
    if (e->bias_col) v += e->bias_col[j];
    if (e->res) v += e->res[i * e->ldr + at(j, e->rv)];
    if (e->act == ACT_RELU) v = v < 0.0f ? 0.0f : v;
    else if (e->act == ACT_CLIP) {
        v = v < e->lo ? e->lo : v;
        v = v > e->hi ? e->hi : v;
    }
    return v;
}

/* One K step of the MR x 32 register tile: c0/c1[r] += a[r] (broadcast) * b0/b1. */
static inline __attribute__((always_inline)) void tile_step(const float *a, v16 b0, v16 b1, v16 *c0, v16 *c1) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        v16 ar = splat(a[r]);
        c0[r] += ar * b0;
        c1[r] += ar * b1;
    }
}

/* Where a tile's A comes from: a packed panel (A[r, k] at a[k * MR + r]), or straight from a
 * channel-blocked image (A[r, k], row r a position and k a channel, at a[r * 16 + k % 16] within
 * each block of 16 channels, blocks `jump` + 16 floats apart: its plane). */
enum { A_PACKED = 0, A_BLOCKED = 1 };

/* The register tile, or the top R rows and first V vectors of it: c[R x 16V] (row stride ldc,
 * the second vector cv floats after the first) = (accumulate ? c : 0) + A * b-panel over kc
 * steps; with `e`, the epilogue is applied as it is stored. The B panel keeps its whole-tile
 * stride (NR). Called with constant R, V and AK, so each shape is its own straight-line loop: an
 * edge tile costs its own FMAs, not a whole tile's. */
static inline __attribute__((always_inline)) void micro_tile(int R, int V, int AK, int64_t kc, const float *restrict a, int64_t jump,
                                                             const float *restrict b, float *restrict c, int64_t ldc, int64_t cv,
                                                             int accumulate, const Epilogue *e) {
    v16 c0[8], c1[8];
    if (accumulate) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            c0[r] = load16(c + r * ldc);
            c1[r] = V == 2 ? load16(c + r * ldc + cv) : splat(0.0f);
        }
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) c0[r] = c1[r] = splat(0.0f);
    }
    /* Packed: one run of kc steps. Blocked: kc / 16 runs of 16, each a channel block. */
    int64_t runs = AK == A_BLOCKED ? kc / 16 : 1, steps = AK == A_BLOCKED ? 16 : kc;
    for (int64_t q = 0; q < runs; q++) {
        for (int64_t k = 0; k < steps; k++) {
            v16 b0 = load16(b), b1 = V == 2 ? load16(b + 16) : b0;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                v16 ar = splat(a[r * (AK == A_BLOCKED ? 16 : 1)]);
                c0[r] += ar * b0;
                if (V == 2) c1[r] += ar * b1;
            }
            a += AK == A_BLOCKED ? 1 : MR;
            b += NR;
        }
        if (AK == A_BLOCKED) a += jump;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        store16(c + r * ldc, e ? finish(c0[r], e, r, 0) : c0[r]);
        if (V == 2) store16(c + r * ldc + cv, e ? finish(c1[r], e, r, 16) : c1[r]);
    }
}

/* A whole MR x NR tile from a packed A panel, or from a blocked image. */
static void micro(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc, int64_t cv,
                  int accumulate, const Epilogue *e) {
    micro_tile(MR, 2, A_PACKED, kc, a, 0, b, c, ldc, cv, accumulate, e);
}
static void micro_blocked(int64_t kc, const float *restrict a, int64_t jump, const float *restrict b, float *restrict c, int64_t ldc,
                          int64_t cv, int accumulate, const Epilogue *e) {
    micro_tile(MR, 2, A_BLOCKED, kc, a, jump, b, c, ldc, cv, accumulate, e);
}

/* The epilogue on the first n (1..16) lanes of a vector at (i, j); the other lanes' bias and
 * residual are not read. */
static inline v16 finish_n(v16 v, const Epilogue *e, int64_t i, int64_t j, int64_t n) {
    if (e->bias_row) v += splat(e->bias_row[i]);
    if (e->bias_col) v += load16_n(e->bias_col + j, n);
    if (e->res) v += load16_n(e->res + i * e->ldr + at(j, e->rv), n);
    Epilogue act_only = {NULL, NULL, NULL, 0, e->act, e->lo, e->hi};
    return finish(v, &act_only, 0, 0);
}

/* A partial tile (mr < MR or nr < NR): only its mr rows and the vectors that cover nr columns
 * are computed (a 7x7 image's 49 positions leave a strip of one row: it costs 2 FMAs a step,
 * not 16). Whole vectors (nr = 16 or 32) are stored where they lie; a part of one goes through
 * a scratch tile and masked stores (with the epilogue on the last K block). */
static void micro_edge(int64_t kc, int ak, const float *a, int64_t jump, const float *b, float *c, int64_t ldc, int64_t cv,
                       int accumulate, const Epilogue *e, int64_t mr, int64_t nr) {
    float t[MR * NR] __attribute__((aligned(64)));
    int whole = nr % 16 == 0, two = nr > 16;
    float *o = whole ? c : t;
    int64_t ldo = whole ? ldc : NR, ov = whole ? cv : 16;
    const Epilogue *oe = whole ? e : NULL;
    if (accumulate && !whole) {
        for (int64_t r = 0; r < mr; r++)
            for (int64_t j = 0; j < nr; j += 16) memcpy(t + r * NR + j, c + r * ldc + at(j, cv), (size_t)(nr - j < 16 ? nr - j : 16) * sizeof(float));
    }
    switch (mr * 4 + two * 2 + ak) {
#define KILN_EDGE(R, V, AK)                                                                                         \
    case R * 4 + (V - 1) * 2 + AK:                                                                                 \
        micro_tile(R, V, AK, kc, a, jump, b, o, ldo, ov, accumulate, oe);                                          \
        break;
#define KILN_EDGE_ROWS(R) KILN_EDGE(R, 1, 0) KILN_EDGE(R, 2, 0) KILN_EDGE(R, 1, 1) KILN_EDGE(R, 2, 1)
        KILN_EDGE_ROWS(1)
        KILN_EDGE_ROWS(2)
        KILN_EDGE_ROWS(3)
        KILN_EDGE_ROWS(4)
#if MR == 8
        KILN_EDGE_ROWS(5)
        KILN_EDGE_ROWS(6)
        KILN_EDGE_ROWS(7)
        KILN_EDGE_ROWS(8)
#endif
#undef KILN_EDGE_ROWS
#undef KILN_EDGE
    default:
        KILN_INTERNAL_FAILURE(); /* mr is 1..MR and ak one of two: a bug, not input */
        return;
    }
    if (whole) return;
    for (int64_t r = 0; r < mr; r++) {
        for (int64_t j = 0; j < nr; j += 16) {
            int64_t n = nr - j < 16 ? nr - j : 16;
            v16 v = load16(t + r * NR + j);
            store16_n(c + r * ldc + at(j, cv), e ? finish_n(v, e, r, j, n) : v, n);
        }
    }
}

/* Packs A[i0 .. i0+mc, p0 .. p0+kc] (A[i, k] = a[i * lda + k * ka]) into MR strips. */
static void pack_a(const float *a, int64_t lda, int64_t ka, int64_t i0, int64_t mc, int64_t m_total, int64_t p0, int64_t kc,
                   float *out) {
    for (int64_t s = 0; s < mc; s += MR) {
        if (lda == 1 && s + MR <= mc && i0 + s + MR <= m_total) {
            /* A transposed input (a pointwise convolution's x[c, n] read as A[n, c]): a strip's
             * MR rows are adjacent floats in each column, one vector move a step. */
            const float *src = a + i0 + s + p0 * ka;
            float *o = out + s * kc;
            for (int64_t k = 0; k < kc; k++) memcpy(o + k * MR, src + k * ka, MR * sizeof(float));
            continue;
        }
        for (int64_t r = 0; r < MR; r++) {
            int64_t i = i0 + s + r;
            float *o = out + s * kc + r;
            if (i < m_total && s + r < mc) {
                const float *src = a + i * lda + p0 * ka;
                for (int64_t k = 0; k < kc; k++) o[k * MR] = src[k * ka];
            } else {
                for (int64_t k = 0; k < kc; k++) o[k * MR] = 0.0f;
            }
        }
    }
}

/* Packs B[p0 .. p0+kc, j0 .. j0+nc] (B[k, j] = b[k * ldb + j * jb]) into NR strips. */
static void pack_b(const float *b, int64_t ldb, int64_t jb, int64_t j0, int64_t nc, int64_t n_total, int64_t p0, int64_t kc,
                   float *out) {
    for (int64_t t = 0; t < nc; t += NR) {
        int64_t w = n_total - (j0 + t) < NR ? n_total - (j0 + t) : NR;
        if (w > nc - t) w = nc - t;
        float *o = out + t * kc;
        for (int64_t k = 0; k < kc; k++, o += NR) {
            const float *src = b + (p0 + k) * ldb + (j0 + t) * jb;
            if (jb == 1) {
                copy_floats(o, src, w);
            } else {
                for (int64_t c = 0; c < w; c++) o[c] = src[c * jb];
            }
            for (int64_t c = w; c < NR; c++) o[c] = 0.0f;
        }
    }
}

/* A convolution's im2col matrix B[k, p] for one image, k = (c, kh, kw), p = (oh, ow). */
typedef struct {
    const float *x; /* this image: [C, H, W] */
    int64_t H, W, KH, KW, SH, SW, DH, DW, PH, PW, OW;
} Im2col;

/* pack_window_strip for output rows shorter than a vector (a 7x7 image), where runs along rows
 * would be a few floats each: the input offset of each position for each window tap is computed
 * once a strip (-1 where the window reads padding), and every channel gathers with the same
 * offsets from its own plane. */
static inline __attribute__((always_inline)) void pack_window_strip_gather(const Im2col *g, int64_t first, int64_t valid, int64_t width,
                                                                          int64_t p0, int64_t kc, float *out) {
    int64_t khw = g->KH * g->KW;
    int32_t *idx = (int32_t *)scratch(2, (size_t)(khw * width));
    if (!idx) return; /* (recorded by scratch) */
    for (int64_t c = 0; c < width; c++) {
        int64_t p = first + c;
        int64_t oh = p / g->OW, ow = p % g->OW;
        for (int64_t r = 0; r < khw; r++) {
            int64_t ih = oh * g->SH + (r / g->KW) * g->DH - g->PH;
            int64_t iw = ow * g->SW + (r % g->KW) * g->DW - g->PW;
            idx[r * width + c] = (c < valid && ih >= 0 && ih < g->H && iw >= 0 && iw < g->W) ? (int32_t)(ih * g->W + iw) : -1;
        }
    }
    int64_t ch = p0 / khw, r = p0 % khw;
    const float *plane = g->x + ch * g->H * g->W;
    for (int64_t k = 0; k < kc; k++, out += width) {
        const int32_t *ix = idx + r * width;
        for (int64_t c = 0; c < width; c++) {
            int32_t at = ix[c];
            float v = plane[at < 0 ? 0 : at];
            out[c] = at < 0 ? 0.0f : v;
        }
        if (++r == khw) {
            r = 0;
            plane += g->H * g->W;
        }
    }
}

/* One strip of `width` output positions (the first `valid` of them real, from `first`) of the
 * im2col matrix, rows p0 .. p0+kc, stored position-minor (out[k * width + position]). The strip's
 * positions are cut into runs along output rows once; each row of the matrix (a channel and a
 * window tap) then copies each run from one input row: contiguous with stride 1, every SW-th
 * element otherwise, zeros where the window reads padding. Inlined into each caller, so `width`
 * is a constant there. */
static inline __attribute__((always_inline)) void pack_window_strip(const Im2col *g, int64_t first, int64_t valid, int64_t width, int64_t p0,
                                                                   int64_t kc, float *out) {
    if (g->OW > 1 && g->OW < 16) {
        pack_window_strip_gather(g, first, valid, width, p0, kc, out);
        return;
    }
    /* Runs: (first column, count, output row, first output column); at most one a column. */
    enum { MAX_RUNS = NR > MR ? NR : MR };
    int64_t run_c[MAX_RUNS], run_n[MAX_RUNS], run_oh[MAX_RUNS], run_ow[MAX_RUNS];
    int64_t runs = 0;
    for (int64_t c = 0, p = first; c < valid && runs < MAX_RUNS; runs++) {
        int64_t oh = p / g->OW, ow = p % g->OW;
        int64_t n = valid - c < g->OW - ow ? valid - c : g->OW - ow;
        run_c[runs] = c;
        run_n[runs] = n;
        run_oh[runs] = oh;
        run_ow[runs] = ow;
        c += n;
        p += n;
    }
    int64_t khw = g->KH * g->KW;
    int64_t ch = p0 / khw, r = p0 % khw;
    const float *plane = g->x + ch * g->H * g->W;
    for (int64_t k = 0; k < kc; k++, out += width) {
        int64_t kh = r / g->KW, kw = r % g->KW;
        if (g->OW == 1) {
            /* Output rows of one column (a k x 1 convolution, a 1-D one written as 2-D): the
             * strip runs down a column, input element j at row base + j * SH. */
            int64_t iw = kw * g->DW - g->PW;
            int64_t base = first * g->SH + kh * g->DH - g->PH;
            int64_t lo = base >= 0 ? 0 : (-base + g->SH - 1) / g->SH;
            int64_t hi = base > g->H - 1 || iw < 0 || iw >= g->W ? 0 : (g->H - 1 - base) / g->SH + 1;
            if (hi > valid) hi = valid;
            if (lo > hi) lo = hi;
            for (int64_t j = 0; j < lo; j++) out[j] = 0.0f;
            const float *col = plane + iw;
            for (int64_t j = lo; j < hi; j++) out[j] = col[(base + j * g->SH) * g->W];
            for (int64_t j = hi; j < width; j++) out[j] = 0.0f;
            if (++r == khw) {
                r = 0;
                plane += g->H * g->W;
            }
            continue;
        }
        for (int64_t q = 0; q < runs; q++) {
            float *o = out + run_c[q];
            int64_t n = run_n[q];
            int64_t ih = run_oh[q] * g->SH + kh * g->DH - g->PH;
            if (ih < 0 || ih >= g->H) {
                memset(o, 0, (size_t)n * sizeof(float));
                continue;
            }
            const float *row = plane + ih * g->W;
            /* Input column of run element j: base + j * SW; the j that land inside the row. */
            int64_t base = run_ow[q] * g->SW + kw * g->DW - g->PW;
            int64_t lo = base >= 0 ? 0 : (-base + g->SW - 1) / g->SW;
            int64_t hi = base > g->W - 1 ? 0 : (g->W - 1 - base) / g->SW + 1;
            if (hi > n) hi = n;
            if (lo > hi) lo = hi;
            for (int64_t j = 0; j < lo; j++) o[j] = 0.0f;
            if (g->SW == 1) {
                copy_floats(o + lo, row + base + lo, hi - lo);
            } else {
                for (int64_t j = lo; j < hi; j++) o[j] = row[base + j * g->SW];
            }
            for (int64_t j = hi; j < n; j++) o[j] = 0.0f;
        }
        for (int64_t c = valid; c < width; c++) out[c] = 0.0f;
        if (++r == khw) {
            r = 0;
            plane += g->H * g->W;
        }
    }
}

/* Packs B[p0 .. p0+kc, j0 .. j0+nc] of the im2col matrix into NR strips. */
static void pack_im2col(const Im2col *g, int64_t j0, int64_t nc, int64_t n_total, int64_t p0, int64_t kc, float *out) {
    for (int64_t t = 0; t < nc; t += NR) {
        int64_t w = n_total - (j0 + t) < NR ? n_total - (j0 + t) : NR;
        if (w > nc - t) w = nc - t;
        pack_window_strip(g, j0 + t, w, NR, p0, kc, out + t * kc);
    }
}

/* Where B comes from. */
typedef struct {
    const float *packed; /* packed whole (K x N in NR strips), or NULL */
    const float *b;      /* else a strided matrix, or */
    int64_t ldb, jb;
    const Im2col *im2col; /* an image's im2col matrix */
    int64_t plane;        /* else, when not 0: a channel-blocked image, B[c, n] = b[(c / 16) * plane + n * 16 + c % 16] */
} Bsource;

/* Packs rows p0 .. p0+kc (channels, multiples of 16) and columns j0 .. j0+nc (positions) of a
 * channel-blocked (NCHW16c) image read as B[c, n] into NR strips: each 16 positions x 16
 * channels is 16 adjacent vectors, transposed through registers. */
static void pack_b_blocked(const float *b, int64_t plane, int64_t j0, int64_t nc, int64_t n_total, int64_t p0, int64_t kc, float *out) {
    for (int64_t t = 0; t < nc; t += NR) {
        float *o = out + t * kc;
        for (int64_t h = 0; h < NR; h += 16) {
            int64_t w = n_total - (j0 + t + h);
            if (w > nc - t - h) w = nc - t - h;
            if (w > 16) w = 16;
            for (int64_t k = 0; k < kc; k += 16) {
                const float *src = b + (p0 + k) / 16 * plane + (j0 + t + h) * 16;
                v16 r[16];
#pragma GCC unroll 16
                for (int q = 0; q < 16; q++) r[q] = q < w ? load16(src + q * 16) : splat(0.0f);
                transpose16(r);
#pragma GCC unroll 16
                for (int q = 0; q < 16; q++) store16(o + (k + q) * NR + h, r[q]);
            }
        }
    }
}

/* Where A comes from. */
typedef struct {
    const float *packed; /* packed whole (M x K in MR strips), or NULL */
    const float *a;      /* else a strided matrix, or */
    int64_t lda, ka;
    const Im2col *im2col; /* an image's im2col matrix, transposed (rows are output positions) */
    int64_t plane;        /* else, when not 0: a channel-blocked image, A[n, c] = a[(c / 16) * plane + n * 16 + c % 16] */
} Asource;

/* Packs rows i0 .. i0+mc (output positions) and columns p0 .. p0+kc of the transposed im2col
 * matrix into MR strips. */
static void pack_a_im2col(const Im2col *g, int64_t i0, int64_t mc, int64_t m_total, int64_t p0, int64_t kc, float *out) {
    for (int64_t s0 = 0; s0 < mc; s0 += MR) {
        int64_t valid = m_total - (i0 + s0) < MR ? m_total - (i0 + s0) : MR;
        if (valid > mc - s0) valid = mc - s0;
        pack_window_strip(g, i0 + s0, valid, MR, p0, kc, out + s0 * kc);
    }
}

typedef struct {
    int64_t kc, mc, nc;
} Blocking;

/* C[i0 .. i1, j0 .. j1] of C[M, N] = A * B over all of K, with the epilogue (bias and residual
 * pointers at C's origin). C[i, j] is at c[i * ldc + at(j, cv)]: cv = 16 for a row-major C, a
 * plane for a channel-blocked result stored transposed (rows positions, columns channels). */
static void gemm_block(const Asource *A, const Bsource *B, float *c, int64_t ldc, int64_t cv, int64_t M, int64_t N, int64_t K,
                       int64_t i0, int64_t i1, int64_t j0, int64_t j1, const Epilogue *epi, const Blocking *bl) {
    int64_t kc_max = bl->kc, mc_max = bl->mc, nc_max = bl->nc;
    float *bbuf = (B->packed) ? NULL : scratch(0, (size_t)kc_max * (size_t)((nc_max + NR - 1) / NR * NR));
    float *abuf = (A->packed || A->plane) ? NULL : scratch(1, (size_t)kc_max * (size_t)((mc_max + MR - 1) / MR * MR));
    if ((!B->packed && !bbuf) || (!A->packed && !A->plane && !abuf)) return; /* out of memory, recorded by scratch */
    for (int64_t jc = j0; jc < j1; jc += nc_max) {
        int64_t nc = j1 - jc < nc_max ? j1 - jc : nc_max;
        for (int64_t pc = 0; pc < K; pc += kc_max) {
            int64_t kc = K - pc < kc_max ? K - pc : kc_max;
            int first = pc == 0, last = pc + kc >= K;
            if (B->im2col) pack_im2col(B->im2col, jc, nc, N, pc, kc, bbuf);
            else if (B->plane) pack_b_blocked(B->b, B->plane, jc, nc, N, pc, kc, bbuf);
            else if (!B->packed) pack_b(B->b, B->ldb, B->jb, jc, nc, N, pc, kc, bbuf);
            for (int64_t ic = i0; ic < i1; ic += mc_max) {
                int64_t mc = i1 - ic < mc_max ? i1 - ic : mc_max;
                if (A->im2col) pack_a_im2col(A->im2col, ic, mc, M, pc, kc, abuf);
                else if (!A->packed && !A->plane) pack_a(A->a, A->lda, A->ka, ic, mc, M, pc, kc, abuf);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int64_t nr = nc - jr < NR ? nc - jr : NR;
                    int64_t j = jc + jr;
                    const float *bp = B->packed ? B->packed + ((j / NR) * K + pc) * NR : bbuf + jr * kc;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        int64_t mr = mc - ir < MR ? mc - ir : MR;
                        int64_t i = ic + ir;
                        /* (A blocked image is read where it lies: its rows are 16 floats apart.) */
                        const float *ap = A->packed  ? A->packed + ((i / MR) * K + pc) * MR
                                          : A->plane ? A->a + pc / 16 * A->plane + i * 16
                                                     : abuf + ir * kc;
                        int ak = A->plane ? A_BLOCKED : A_PACKED;
                        int64_t jump = A->plane - 16;
                        Epilogue e;
                        const Epilogue *ep = NULL;
                        if (last && epi) {
                            e = *epi;
                            if (e.bias_row) e.bias_row += i;
                            if (e.bias_col) e.bias_col += j;
                            if (e.res) e.res += i * e.ldr + at(j, e.rv);
                            ep = &e;
                        }
                        float *ct = c + i * ldc + at(j, cv);
                        if (mr == MR && nr == NR && ak == A_PACKED) micro(kc, ap, bp, ct, ldc, cv, !first, ep);
                        else if (mr == MR && nr == NR) micro_blocked(kc, ap, jump, bp, ct, ldc, cv, !first, ep);
                        else micro_edge(kc, ak, ap, jump, bp, ct, ldc, cv, !first, ep, mr, nr);
                    }
                }
            }
        }
    }
}

static Epilogue epilogue_of(const float *bias_row, const float *bias_col, const float *res, int64_t ldr, int64_t act, float lo,
                            float hi) {
    Epilogue e = {bias_row, bias_col, res, ldr, act, lo, hi, 16};
    return e;
}

/* The register tile of a direct convolution: c[MR rows][32 flat positions] = A panel (K x MR,
 * packed weights) times B rows read straight from the padded input: row k at xb + offs[k]. */
static inline __attribute__((always_inline)) void micro_direct(int64_t K, const float *restrict a, const float *restrict xb,
                                                              const int64_t *restrict offs, v16 *c0, v16 *c1) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = splat(0.0f);
    for (int64_t k = 0; k < K; k++) {
        const float *b = xb + offs[k];
        tile_step(a, load16(b), load16(b + 16), c0, c1);
        a += MR;
    }
}

#if MR == 8
/* bf16 products (`--precision bf16`), on AVX512-BF16; only the AVX-512 object has them (the
 * compiler plans them where the host has the instructions). Out of line, so the rest of the
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

/* A direct convolution's whole tile in bf16: the weights packed in MR-row strips of pairs, B
 * read at xb + offs[q] (the input's channel-pair planes). */
KILN_BF16 static void micro_direct_bf16(int64_t K2, const uint32_t *restrict a, const uint32_t *restrict xb,
                                        const int64_t *restrict offs, v16 *c0, v16 *c1) {
    tile_bf16(MR, 1, K2, a, 1, MR, xb, offs, c0, c1);
}

/* n words of channel pairs: out[i] = bf16(even[i]) | bf16(odd[i]) << 16, rounded to nearest
 * even; odd NULL for an odd channel count's last pair (zeros). */
KILN_BF16 static void pair_bf16(const float *even, const float *odd, int64_t n, uint32_t *out) {
    /* cvtne2ps gives [even 0..15, odd 0..15]; the permutation interleaves them. */
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512i idx = _mm512_loadu_si512(order);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_loadu_ps(m, even + i);
        __m512 o = odd ? _mm512_maskz_loadu_ps(m, odd + i) : _mm512_setzero_ps();
        __m512i w = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(o, e));
        _mm512_mask_storeu_epi32(out + i, m, w);
    }
}
#endif

/* A convolution of one image without im2col. The input is copied once into padded planes, split
 * by stride phase: phase (a, b) of channel c holds padded rows a, a + SH, ... and columns b,
 * b + SW, ... (one plane at stride 1), so that every window tap of a run of output positions is
 * a contiguous run of one phase plane. Positions are taken "flat", p = oh * Wq + ow (Wq the
 * phase planes' pitch), so that row k of B = im2col for 32 consecutive p is 32 consecutive
 * floats at offs[k] + p; the positions with ow >= OW are computed and dropped. Output rows
 * oh0 .. oh1 and channels m0 .. m1; the epilogue applied as the valid positions are stored. */
static void conv_direct(const float *x, const float *wp, const float *bias, const float *res, float *y, int64_t C, int64_t H, int64_t W,
                        int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH,
                        int64_t OW, int64_t act, float lo, float hi, int64_t oh0, int64_t oh1, int64_t m0, int64_t m1, int bf16) {
    int64_t Wq = OW + (KW - 1) * DW / SW;
    /* The phase rows these output rows read. */
    int64_t rows = oh1 - oh0 + (KH - 1) * DH / SH, plane = rows * Wq;
    int64_t K = C * KH * KW, phases = SH * SW;
    /* The last strip may read 32 floats past the last position of the last plane. */
    size_t total = (size_t)(C * phases * plane + 64);
    float *xp = scratch(0, total);
    int64_t *offs = (int64_t *)scratch(1, (size_t)(2 * K));
    if (!xp || !offs) return; /* (recorded by scratch) */
    memset(xp, 0, total * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        for (int64_t a = 0; a < SH; a++) {
            for (int64_t b = 0; b < SW; b++) {
                float *ph = xp + ((c * SH + a) * SW + b) * plane;
                /* Columns j of the phase read input column j * SW + b - PW. */
                int64_t jlo = PW - b <= 0 ? 0 : (PW - b + SW - 1) / SW;
                int64_t jhi = W - 1 + PW - b < 0 ? 0 : (W - 1 + PW - b) / SW + 1;
                if (jhi > Wq) jhi = Wq;
                for (int64_t i = 0; i < rows; i++) {
                    int64_t ih = (oh0 + i) * SH + a - PH;
                    if (ih < 0 || ih >= H || jlo >= jhi) continue;
                    const float *src = x + (c * H + ih) * W + jlo * SW + b - PW;
                    float *dst = ph + i * Wq + jlo;
                    if (SW == 1) copy_floats(dst, src, jhi - jlo);
                    else if (SW == 2) copy_floats_stride2(dst, src, jhi - jlo);
                    else
                        for (int64_t j = 0; j < jhi - jlo; j++) dst[j] = src[j * SW];
                }
            }
        }
    }
    /* bf16: the planes again as channel pairs, a word a position (the weights are packed so),
     * and B's rows are pairs: K2 of them. */
    uint32_t *xq __attribute__((unused)) = NULL; /* (only the AVX-512 object has bf16 kernels) */
    int64_t K2 = (C + 1) / 2 * KH * KW;
    if (bf16) {
#if MR == 8
        size_t words = (size_t)((C + 1) / 2 * phases * plane + 64);
        xq = (uint32_t *)scratch(2, words);
        if (!xq) return; /* (recorded by scratch) */
        memset(xq + words - 64, 0, 64 * sizeof(uint32_t));
        for (int64_t cp = 0; cp < (C + 1) / 2; cp++) {
            for (int64_t f = 0; f < phases; f++) {
                const float *even = xp + (2 * cp * phases + f) * plane;
                const float *odd = 2 * cp + 1 < C ? xp + ((2 * cp + 1) * phases + f) * plane : NULL;
                pair_bf16(even, odd, plane, xq + (cp * phases + f) * plane);
            }
        }
#else
        KILN_INTERNAL_FAILURE(); /* planned only where the host has AVX512-BF16: a bug, not input */
        return;
#endif
    }
    for (int64_t k = 0; k < (bf16 ? K2 : K); k++) {
        int64_t c = k / (KH * KW), t = k % (KH * KW);
        int64_t dy = (t / KW) * DH, dx = (t % KW) * DW;
        offs[k] = ((c * SH + dy % SH) * SW + dx % SW) * plane + dy / SH * Wq + dx / SW;
    }
    Epilogue act_only = {NULL, NULL, NULL, 0, act, lo, hi};
    int64_t N = OH * OW;
    /* Flat positions of the rows (relative to row oh0): the last row ends at OW. */
    int64_t flat = (oh1 - oh0 - 1) * Wq + OW;
    for (int64_t p0 = 0; p0 < flat; p0 += 32) {
        /* The strip's valid positions as runs: (lane, count, output index). */
        int64_t run_l[33], run_n[33], run_o[33], runs = 0;
        for (int64_t l = 0; l < 32 && p0 + l < flat;) {
            int64_t p = p0 + l, oh = p / Wq, ow = p % Wq;
            if (ow >= OW) {
                l += Wq - ow;
                continue;
            }
            int64_t n = OW - ow < 32 - l ? OW - ow : 32 - l;
            if (p + n > flat) n = flat - p;
            run_l[runs] = l;
            run_n[runs] = n;
            run_o[runs] = (oh0 + oh) * OW + ow;
            runs++;
            l += n;
        }
        for (int64_t i = m0; i < m1; i += MR) {
            v16 c0[MR], c1[MR];
#if MR == 8
            if (bf16)
                micro_direct_bf16(K2, (const uint32_t *)wp + (i / MR) * K2 * MR, xq + p0, offs, c0, c1);
            else
#endif
                micro_direct(K, wp + (i / MR) * K * MR, xp + p0, offs, c0, c1);
            int64_t mr = m1 - i < MR ? m1 - i : MR;
            for (int64_t r = 0; r < mr; r++) {
                v16 b = splat(bias ? bias[i + r] : 0.0f);
                v16 lo = c0[r] + b, hi = c1[r] + b;
                float *yr = y + (i + r) * N;
                const float *rr = res ? res + (i + r) * N : NULL;
                for (int64_t q = 0; q < runs; q++) {
                    for (int64_t j = 0; j < run_n[q]; j += 16) {
                        int64_t n = run_n[q] - j < 16 ? run_n[q] - j : 16, l = run_l[q] + j;
                        /* Runs rarely start on a vector (Wq is no multiple of 32): the lanes
                         * are shifted in registers, not stored and reloaded at an offset. */
                        v16 v = l == 0 ? lo : l == 16 ? hi : lanes_from(lo, hi, l);
                        float *yo = yr + run_o[q] + j;
                        if (n == 16) {
                            if (rr) v += load16(rr + run_o[q] + j);
                            store16(yo, finish(v, &act_only, 0, 0));
                        } else {
                            if (rr) v += load16_n(rr + run_o[q] + j, n);
                            store16_n(yo, finish(v, &act_only, 0, 0), n);
                        }
                    }
                }
            }
        }
    }
}

/* y[m, n] = the epilogue on ct[n, m] for channels m0 .. m1 and positions n0 .. n1 of N: the
 * transposed convolution's result put back in NCHW, a 16 x 16 block at a time through registers. */
static void store_transposed(const float *ct, int64_t M, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *y,
                             const Epilogue *e) {
    for (int64_t m = m0; m < m1; m += 16) {
        int64_t nm = m1 - m < 16 ? m1 - m : 16;
        for (int64_t n = n0; n < n1; n += 16) {
            int64_t nn = n1 - n < 16 ? n1 - n : 16;
            v16 r[16];
            for (int64_t k = 0; k < 16; k++) r[k] = k < nn ? load16_n(ct + (n + k) * M + m, nm) : splat(0.0f);
            transpose16(r);
            for (int64_t k = 0; k < nm; k++) store16_n(y + (m + k) * N + n, finish_n(r[k], e, m + k, n, nn), nn);
        }
    }
}

/* A 2-D convolution (NCHW) as implicit GEMM, one GEMM a group: per image and group g,
 * C[Mg = M/G out channels, N = OH*OW] = W_g[Mg, K = C/G*KH*KW] (packed, groups one after another)
 * * im2col(x_g)[K, N]. Work units: images x chunks of N (split_n) or of Mg. */
void kiln_uk_conv2d(int64_t x_, int64_t wp_, int64_t bias_, int64_t res_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t M,
                    int64_t G, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                    int64_t OH, int64_t OW, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks,
                    int64_t split_n, int64_t transposed, int64_t in_blocked, int64_t out_blocked, int64_t bf16, int64_t wg_begin,
                    int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_, *wp = (const float *)(intptr_t)wp_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    int64_t Cg = C / G, Mg = M / G;
    int64_t N = OH * OW, K = Cg * KH * KW;
    int64_t a_group = (Mg + MR - 1) / MR * K * MR;
    Blocking bl = {kc, mc, nc};
    /* 1x1, stride 1, no padding: the input is the matrix [C, H*W] as it is. */
    int pointwise = KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0 && OH == H && OW == W;
    if (transposed || out_blocked) {
        /* Few output positions, many channels (a 7x7 image), or a pointwise convolution between
         * channel-blocked (NCHW16c) tensors: C^T[N, M] = im2col(x)^T[N, K] * W^T[K, M], the
         * weights packed in 32-channel strips, so the vectors run along channels. One group.
         * A blocked result is stored where it lies (each vector 16 channels of one position);
         * else C^T goes through scratch and is stored transposed, with the epilogue. Chunks are
         * of positions (split_n) or of channels. */
        float *ct = out_blocked ? NULL : scratch(3, (size_t)(N * M));
        if (!out_blocked && !ct) return; /* (recorded by scratch) */
        for (int64_t u = wg_begin; u < wg_end; u++) {
            int64_t img = u / chunks, q = u % chunks;
            Im2col g = {x + img * C * H * W, H, W, KH, KW, SH, SW, DH, DW, PH, PW, OW};
            Asource A = {NULL, NULL, 0, 0, &g, 0};
            if (in_blocked) {
                /* (Pointwise: the planner blocks no other input.) */
                A.a = g.x;
                A.plane = N * 16;
                A.im2col = NULL;
            } else if (pointwise) {
                /* A[n, c] = x[c, n], a strided read, no offsets to compute. */
                A.a = g.x;
                A.lda = 1;
                A.ka = H * W;
                A.im2col = NULL;
            }
            Bsource B = {wp, NULL, 0, 0, NULL};
            int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
            if (split_n) chunk_range(N, MR, chunks, q, &n0, &n1);
            else chunk_range(M, NR, chunks, q, &m0, &m1);
            if (m0 >= m1 || n0 >= n1) continue;
            const float *ri = res ? res + img * M * N : NULL;
            if (out_blocked) {
                Epilogue e = {NULL, bias, ri, 16, act, lo, hi, N * 16};
                gemm_block(&A, &B, y + img * M * N, 16, N * 16, N, M, K, n0, n1, m0, m1, &e, &bl);
            } else {
                gemm_block(&A, &B, ct, M, 16, N, M, K, n0, n1, m0, m1, NULL, &bl);
                Epilogue e = epilogue_of(bias, NULL, ri, N, act, lo, hi);
                store_transposed(ct, M, N, m0, m1, n0, n1, y + img * M * N, &e);
            }
        }
        return;
    }
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks;
        /* One group, a window or a stride: directly from a padded copy of the input (in bf16,
         * that copy is where the input becomes bf16). */
        if (G == 1 && (KH * KW > 1 || SH * SW > 1)) {
            int64_t oh0 = 0, oh1 = OH, m0 = 0, m1 = M;
            if (split_n) chunk_range(OH, 1, chunks, q, &oh0, &oh1);
            else chunk_range(M, MR, chunks, q, &m0, &m1);
            if (oh0 < oh1 && m0 < m1)
                conv_direct(x + img * C * H * W, wp, bias, res ? res + img * M * N : NULL, y + img * M * N, C, H, W, KH, KW, SH, SW, DH, DW,
                            PH, PW, OH, OW, act, lo, hi, oh0, oh1, m0, m1, (int)bf16);
            continue;
        }
        for (int64_t grp = 0; grp < G; grp++) {
            Asource A = {wp + grp * a_group, NULL, 0, 0, NULL, 0};
            Im2col g = {x + (img * C + grp * Cg) * H * W, H, W, KH, KW, SH, SW, DH, DW, PH, PW, OW};
            Bsource B = {NULL, NULL, 0, 0, &g, 0};
            if (in_blocked) {
                /* A pointwise convolution whose input is channel-blocked: B packed through
                 * transposes (the planner blocks no other input). */
                B.b = g.x;
                B.plane = N * 16;
                B.im2col = NULL;
            } else if (pointwise) {
                /* B[C, H*W] is the input as it is. */
                B.b = g.x;
                B.ldb = H * W;
                B.jb = 1;
                B.im2col = NULL;
            }
            float *yi = y + (img * M + grp * Mg) * N;
            const float *ri = res ? res + (img * M + grp * Mg) * N : NULL;
            Epilogue e = epilogue_of(bias ? bias + grp * Mg : NULL, NULL, ri, N, act, lo, hi);
            int64_t a0 = 0, a1 = Mg, b0 = 0, b1 = N;
            if (split_n) chunk_range(N, NR, chunks, q, &b0, &b1);
            else chunk_range(Mg, MR, chunks, q, &a0, &a1);
            if (a0 < a1 && b0 < b1) gemm_block(&A, &B, yi, N, 16, Mg, N, K, a0, a1, b0, b1, &e, &bl);
        }
    }
}

/* A transposed convolution (NCHW, one group) as a GEMM and a scatter: per image,
 * cols[(co, kh, kw), (ih, iw)] = W[Cin, Cout*KH*KW]^T (packed) * x[Cin, H*W], then each column
 * value is added at output (ih*SH + kh*DH - PH, iw*SW + kw*DW - PW) when that lies inside (pads
 * may be negative); the epilogue runs over the finished planes. Work units: images x chunks of
 * output channels (whole register-tile strips of rows each). */
void kiln_uk_conv_transpose(int64_t x_, int64_t wp_, int64_t bias_, int64_t res_, int64_t y_, int64_t Cin, int64_t H, int64_t W,
                            int64_t Cout, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                            int64_t OH, int64_t OW, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks,
                            int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_, *wp = (const float *)(intptr_t)wp_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    int64_t khw = KH * KW, M = Cout * khw, N = H * W, K = Cin, P = OH * OW;
    /* Channels a chunk boundary falls on: their first row starts a register-tile strip. */
    int64_t step = MR;
    for (int64_t a = khw, b = MR; b;) {
        int64_t t = a % b;
        a = b;
        b = t;
        step = MR / a;
    }
    Blocking bl = {kc, mc, nc};
    Asource A = {wp, NULL, 0, 0, NULL, 0};
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks;
        int64_t c0, c1;
        chunk_range(Cout, step, chunks, q, &c0, &c1);
        if (c0 >= c1) continue;
        int64_t i0 = c0 * khw, i1 = c1 * khw;
        float *cols = scratch(3, (size_t)((i1 - i0) * N));
        if (!cols) return; /* (recorded by scratch) */
        Bsource B = {NULL, x + img * Cin * N, N, 1, NULL};
        /* gemm_block writes rows i0 .. i1 at cols + (i - i0) * N. */
        gemm_block(&A, &B, cols - i0 * N, N, 16, M, N, K, i0, i1, 0, N, NULL, &bl);
        float *yi = y + img * Cout * P;
        const float *ri = res ? res + img * Cout * P : NULL;
        Epilogue e = epilogue_of(bias, NULL, ri, P, act, lo, hi);
        for (int64_t co = c0; co < c1; co++) {
            float *plane = yi + co * P;
            memset(plane, 0, (size_t)P * sizeof(float));
            for (int64_t kh = 0; kh < KH; kh++) {
                for (int64_t kw = 0; kw < KW; kw++) {
                    const float *row = cols + ((co * KH + kh) * KW + kw - i0) * N;
                    for (int64_t ih = 0; ih < H; ih++) {
                        int64_t oh = ih * SH + kh * DH - PH;
                        if (oh < 0 || oh >= OH) continue;
                        float *orow = plane + oh * OW;
                        const float *src = row + ih * W;
                        for (int64_t iw = 0; iw < W; iw++) {
                            int64_t ow = iw * SW + kw * DW - PW;
                            if (ow >= 0 && ow < OW) orow[ow] += src[iw];
                        }
                    }
                }
            }
            for (int64_t p = 0; p < P; p++) plane[p] = finish1(plane[p], &e, co, p);
        }
    }
}

/* The KW taps along one row of nv consecutive output vectors of a pooling (max when `is_max`,
 * else a sum), each vector its own chain; NaN lanes of a max are flagged in `bad`. Stride 1, 2,
 * or any (gathered). Inlined with is_max and nv constant. */
static inline __attribute__((always_inline)) void pool_taps(int is_max, int nv, v16 *acc, v16i *bad, const float *base, float fill,
                                                           int64_t KW, int64_t DW, int64_t SW) {
    for (int j = 0; j < nv; j++) {
        acc[j] = splat(fill);
        bad[j] = (v16i){0};
    }
    for (int64_t kw = 0; kw < KW; kw++) {
        const float *p = base + kw * DW;
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) {
            v16 v;
            if (SW == 1) {
                v = load16(p + 16 * j);
            } else if (SW == 2) {
                v = evens(load16(p + 32 * j), load16(p + 32 * j + 16));
            } else {
                float t[16];
                for (int l = 0; l < 16; l++) t[l] = p[(16 * j + l) * SW];
                v = load16(t);
            }
            if (is_max) {
                acc[j] = vmax(acc[j], v);
                bad[j] |= v != v;
            } else {
                acc[j] += v;
            }
        }
    }
}

/* Output rows a pooling band computes at once: the rows it reads (their horizontal results) stay
 * in L1, and bands overlap by only (KH - 1) * DH + 1 - SH rows. */
#define POOL_BAND 8

/* Max or average pooling, separable: per band of output rows, every input row the band's windows
 * read is reduced along the row once (copied into a padded row buffer in L1, then each 16 outputs
 * take one max or add per horizontal tap), and each output vector reduces KH of those row results.
 * The input is read once, with no padded copy of the plane; a 3x3 window costs 3 + 3 taps per
 * vector, not 9. `kind`: 0 max, 1 average counting the padding, 2 average over the cells inside
 * the input only. NaN wins in a max, as ONNX has it. Work units: images x channel chunks. */
static inline __attribute__((always_inline)) void pool2d(const float *x, float *y, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                                                       int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t PH_end,
                                                       int64_t PW_end, int64_t OH, int64_t OW, int64_t kind, int64_t act, float lo, float hi,
                                                       int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    int64_t lanes = (OW + 15) / 16 * 16;
    /* The padded row: every column the last vector's taps reach, and a stride-2 pair's slack. */
    int64_t Wp = (lanes - 1) * SW + (KW - 1) * DW + 1 + 16 * SW;
    int64_t band_rows = (POOL_BAND - 1) * SH + (KH - 1) * DH + 1;
    /* Two row buffers: the next row is copied in while this one is reduced, so that the reads
     * do not meet the copy's stores still in flight (a misaligned store forwards to no load: the
     * stall was a fifth of the time). */
    float *rowbufs = scratch(0, (size_t)(2 * (Wp + 64)));
    float *hm = scratch(2, (size_t)(band_rows * lanes));
    /* Divisors of the average: per output row and per output column, the taps that count. */
    float *rows = scratch(1, (size_t)(OH + lanes + 16));
    if (!rowbufs || !hm || !rows) return; /* (recorded by scratch) */
    float *cols = rows + OH;
    for (int64_t o = 0; o < OH + lanes; o++) {
        int is_row = o < OH;
        int64_t i = is_row ? o : o - OH, k = is_row ? KH : KW, st = is_row ? SH : SW, d = is_row ? DH : DW;
        int64_t pb = is_row ? PH : PW, n = is_row ? H : W, pe = is_row ? PH_end : PW_end;
        int64_t count = 0;
        for (int64_t t = 0; t < k; t++) {
            int64_t at = i * st + t * d - pb;
            if (kind == 2 ? (at >= 0 && at < n) : (at >= -pb && at < n + pe)) count++;
        }
        (is_row ? rows : cols)[i] = (float)(count > 0 ? count : 1);
    }
    int is_max = kind == 0;
    float fill = is_max ? -__builtin_inff() : 0.0f;
    v16 nan = splat(__builtin_nanf(""));
    Epilogue e = epilogue_of(NULL, NULL, NULL, 0, act, lo, hi);
    /* The row buffer's padding is the same for every row: filled once, then only the input's
     * columns are copied in. */
    for (int64_t i = 0; i < 2 * (Wp + 64); i++) rowbufs[i] = fill;
    int64_t ncols = PW + W <= Wp ? W : Wp - PW;
    int64_t nvec = lanes / 16;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks;
        int64_t c0, c1;
        chunk_range(C, 1, chunks, q, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            const float *plane = x + (img * C + c) * H * W;
            float *yc = y + (img * C + c) * OH * OW;
            for (int64_t oh0 = 0; oh0 < OH; oh0 += POOL_BAND) {
                int64_t nb = OH - oh0 < POOL_BAND ? OH - oh0 : POOL_BAND;
                int64_t nrows = (nb - 1) * SH + (KH - 1) * DH + 1;
                /* Horizontal: padded row oh0 * SH + r of the band into hm row r. */
                int64_t first = oh0 * SH - PH;
                if (first >= 0 && first < H && ncols > 0) copy_floats(rowbufs + PW, plane + first * W, ncols);
                for (int64_t r = 0; r < nrows; r++) {
                    int64_t ih = first + r;
                    float *hr = hm + r * lanes;
                    float *rowbuf = rowbufs + (r & 1) * (Wp + 64);
                    if (r + 1 < nrows && ih + 1 >= 0 && ih + 1 < H && ncols > 0)
                        copy_floats(rowbufs + ((r + 1) & 1) * (Wp + 64) + PW, plane + (ih + 1) * W, ncols);
                    if (ih < 0 || ih >= H) {
                        for (int64_t j = 0; j < nvec; j++) store16(hr + 16 * j, splat(fill));
                        continue;
                    }
                    for (int64_t j = 0; j < nvec;) {
                        int nv = nvec - j >= 4 ? 4 : nvec - j >= 2 ? 2 : 1;
                        v16 acc[4];
                        v16i bad[4];
                        const float *base = rowbuf + 16 * j * SW;
                        if (is_max) {
                            if (nv == 4) pool_taps(1, 4, acc, bad, base, fill, KW, DW, SW);
                            else if (nv == 2) pool_taps(1, 2, acc, bad, base, fill, KW, DW, SW);
                            else pool_taps(1, 1, acc, bad, base, fill, KW, DW, SW);
                        } else {
                            if (nv == 4) pool_taps(0, 4, acc, bad, base, fill, KW, DW, SW);
                            else if (nv == 2) pool_taps(0, 2, acc, bad, base, fill, KW, DW, SW);
                            else pool_taps(0, 1, acc, bad, base, fill, KW, DW, SW);
                        }
                        for (int k = 0; k < nv; k++, j++) store16(hr + 16 * j, is_max ? select_where(bad[k], nan, acc[k]) : acc[k]);
                    }
                }
                /* Vertical: each output vector reduces KH row results. */
                for (int64_t b = 0; b < nb; b++) {
                    int64_t oh = oh0 + b;
                    for (int64_t j = 0; j < nvec; j++) {
                        v16 v = splat(fill);
                        v16i bad = (v16i){0};
                        for (int64_t kh = 0; kh < KH; kh++) {
                            v16 t = load16(hm + (b * SH + kh * DH) * lanes + 16 * j);
                            if (is_max) {
                                v = vmax(v, t);
                                bad |= t != t;
                            } else {
                                v += t;
                            }
                        }
                        if (is_max) v = select_where(bad, nan, v);
                        else v = v / (load16(cols + 16 * j) * splat(rows[oh]));
                        int64_t ow = 16 * j, n = OW - ow < 16 ? OW - ow : 16;
                        if (n == 16) store16(yc + oh * OW + ow, finish(v, &e, 0, 0));
                        else store16_n(yc + oh * OW + ow, finish(v, &e, 0, 0), n);
                    }
                }
            }
        }
    }
}

/* A 2x2 stride-2 pooling whose windows all lie inside the input (no padding): each 16 outputs
 * of a row read 32 floats of each of its two input rows, reduce the rows, then the even and odd
 * lanes. One pass, nothing copied (the separable path's row buffers cost as much again: 256
 * channels of 56x56, 1 thread: 0.33 -> 0.055 ms). Max gives NaN where a window holds one. */
static void pool2x2s2(const float *x, float *y, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kind, int64_t act,
                      float lo, float hi, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    Epilogue e = epilogue_of(NULL, NULL, NULL, 0, act, lo, hi);
    int is_max = kind == 0;
    v16 nan = splat(__builtin_nanf("")), quarter = splat(0.25f);
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks, c0, c1;
        chunk_range(C, 1, chunks, q, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            const float *plane = x + (img * C + c) * H * W;
            float *yc = y + (img * C + c) * OH * OW;
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *r0 = plane + 2 * oh * W, *r1 = r0 + W;
                float *yr = yc + oh * OW;
                for (int64_t ow = 0; ow < OW; ow += 16) {
                    int64_t n = OW - ow < 16 ? OW - ow : 16;
                    /* The 2n inputs of these outputs, as two vectors a row. */
                    int64_t m = 2 * n, na = m < 16 ? m : 16, nb = m - na;
                    const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                    v16 a0 = n == 16 ? load16(p0) : load16_n(p0, na), b0 = n == 16 ? load16(p0 + 16) : nb > 0 ? load16_n(p0 + 16, nb) : splat(0.0f);
                    v16 a1 = n == 16 ? load16(p1) : load16_n(p1, na), b1 = n == 16 ? load16(p1 + 16) : nb > 0 ? load16_n(p1 + 16, nb) : splat(0.0f);
                    v16 v;
                    if (is_max) {
                        v16 a = vmax(a0, a1), b = vmax(b0, b1);
                        v = vmax(evens(a, b), odds(a, b));
                        /* Lanes of windows holding a NaN (a lane's mask is all ones or zeros, so
                         * it moves through the float shuffles as it is). */
                        v16 bad_a = (v16)((a0 != a0) | (a1 != a1)), bad_b = (v16)((b0 != b0) | (b1 != b1));
                        v = select_where((v16i)evens(bad_a, bad_b) | (v16i)odds(bad_a, bad_b), nan, v);
                    } else {
                        v16 a = a0 + a1, b = b0 + b1;
                        v = (evens(a, b) + odds(a, b)) * quarter;
                    }
                    if (n == 16) store16(yr + ow, finish(v, &e, 0, 0));
                    else store16_n(yr + ow, finish(v, &e, 0, 0), n);
                }
            }
        }
    }
}

/* A 3x3 stride-2 max pool with at most one column and row of padding before (ResNet's stem
 * pool): per output row the max of its (up to) three input rows into a row buffer, whole
 * vectors along the row, then per 16 outputs the max of the buffer's even and odd lanes and the
 * even lanes two further on. The buffer's left pad and its tail past the row are -inf, filled
 * once. NaN where a window holds one. (64 channels of 112x112, 1 thread: 0.30 -> 0.12 ms.) */
static void maxpool3x3s2(const float *x, float *y, int64_t C, int64_t H, int64_t W, int64_t PH, int64_t PW, int64_t OH, int64_t OW,
                         int64_t act, float lo, float hi, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    Epilogue e = epilogue_of(NULL, NULL, NULL, 0, act, lo, hi);
    v16 nan = splat(__builtin_nanf("")), ninf = splat(-__builtin_inff());
    int64_t lanes = (OW + 15) / 16 * 16;
    /* Window j reads buf[2j .. 2j + 2]; a block of 16 loads buf[2 ow .. 2 ow + 34). */
    int64_t len = 2 * lanes + 48;
    if (len < PW + W + 16) len = PW + W + 16;
    float *buf = scratch(0, (size_t)len);
    if (!buf) return; /* (recorded by scratch) */
    for (int64_t i = 0; i < len; i++) buf[i] = -__builtin_inff();
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks, c0, c1;
        chunk_range(C, 1, chunks, q, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            const float *plane = x + (img * C + c) * H * W;
            float *yc = y + (img * C + c) * OH * OW;
            for (int64_t oh = 0; oh < OH; oh++) {
                int64_t r0 = 2 * oh - PH, r1 = r0 + 3;
                if (r0 < 0) r0 = 0;
                if (r1 > H) r1 = H;
                /* Vertical: the rows' max, NaN where any is. */
                for (int64_t iw = 0; iw < W; iw += 16) {
                    int64_t n = W - iw < 16 ? W - iw : 16;
                    v16 v = ninf;
                    v16i bad = (v16i){0};
                    for (int64_t r = r0; r < r1; r++) {
                        v16 t = n == 16 ? load16(plane + r * W + iw) : load16_n(plane + r * W + iw, n);
                        v = vmax(t, v);
                        bad |= t != t;
                    }
                    v = select_where(bad, nan, v);
                    if (n == 16) store16(buf + PW + iw, v);
                    else store16_n(buf + PW + iw, v, n);
                }
                /* Horizontal: taps 2j, 2j + 1, 2j + 2 of the buffer. */
                for (int64_t ow = 0; ow < OW; ow += 16) {
                    const float *p = buf + 2 * ow;
                    v16 a = load16(p), b = load16(p + 16), c2 = load16(p + 2), d = load16(p + 18);
                    v16 t0 = evens(a, b), t1 = odds(a, b), t2 = evens(c2, d);
                    v16 v = vmax(t2, vmax(t1, t0));
                    v = select_where((t0 != t0) | (t1 != t1) | (t2 != t2), nan, v);
                    int64_t n = OW - ow < 16 ? OW - ow : 16;
                    if (n == 16) store16(yc + oh * OW + ow, finish(v, &e, 0, 0));
                    else store16_n(yc + oh * OW + ow, finish(v, &e, 0, 0), n);
                }
            }
        }
    }
}

/* The pooling entry point: the usual windows get copies of pool2d with their sizes constant, so
 * the tap loops unroll (3x3/2 max pool on 64x112x112, 1 thread: 0.30 -> 0.21 ms); any
 * other window takes the general copy. */
void kiln_uk_pool2d(int64_t x_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH,
                    int64_t DW, int64_t PH, int64_t PW, int64_t PH_end, int64_t PW_end, int64_t OH, int64_t OW, int64_t kind, int64_t act,
                    float lo, float hi, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    float *y = (float *)(intptr_t)y_;
    int unit = DH == 1 && DW == 1;
#define POOL2D(kh, kw, sh, sw) \
    pool2d(x, y, C, H, W, kh, kw, sh, sw, 1, 1, PH, PW, PH_end, PW_end, OH, OW, kind, act, lo, hi, chunks, wg_begin, wg_end)
    if (unit && KH == 2 && KW == 2 && SH == 2 && SW == 2 && PH == 0 && PW == 0 && PH_end == 0 && PW_end == 0 && 2 * OH <= H && 2 * OW <= W) {
        pool2x2s2(x, y, C, H, W, OH, OW, kind, act, lo, hi, chunks, wg_begin, wg_end);
        return;
    }
    if (unit && kind == 0 && KH == 3 && KW == 3 && SH == 2 && SW == 2 && PH <= 1 && PW <= 1 && 2 * (OH - 1) - PH < H &&
        2 * (OW - 1) - PW < W) {
        maxpool3x3s2(x, y, C, H, W, PH, PW, OH, OW, act, lo, hi, chunks, wg_begin, wg_end);
        return;
    }
    if (unit && KH == 3 && KW == 3 && SH == 2 && SW == 2) POOL2D(3, 3, 2, 2);
    else if (unit && KH == 2 && KW == 2 && SH == 2 && SW == 2) POOL2D(2, 2, 2, 2);
    else if (unit && KH == 3 && KW == 3 && SH == 1 && SW == 1) POOL2D(3, 3, 1, 1);
    else pool2d(x, y, C, H, W, KH, KW, SH, SW, DH, DW, PH, PW, PH_end, PW_end, OH, OW, kind, act, lo, hi, chunks, wg_begin, wg_end);
#undef POOL2D
}

/* Gather along axis 0: output row i is data row idx[i] (negative indices count from the end;
 * one outside the table fails the run and is clamped into it, as kiln's generated gathers do),
 * copied whole. Any element type:
 * rows are bytes. Work units: chunks of the indices. */
void kiln_uk_gather_rows(int64_t data_, int64_t idx_, int64_t y_, int64_t rows, int64_t row_bytes, int64_t n_idx, int64_t idx64, int64_t chunks,
                         int64_t wg_begin, int64_t wg_end) {
    const char *data = (const char *)(intptr_t)data_;
    const void *idx = (const void *)(intptr_t)idx_;
    char *y = (char *)(intptr_t)y_;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t i0, i1;
        chunk_range(n_idx, 1, chunks, u, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) {
            int64_t v = idx64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
            if (v < 0) v += rows;
            if (v < 0 || v >= rows) {
                kiln_fail(KILN_STATUS_INDEX, 0); /* the run fails; the copy stays in bounds */
                v = v < 0 ? 0 : rows - 1;
            }
            memcpy(y + i * row_bytes, data + v * row_bytes, (size_t)row_bytes);
        }
    }
}

/* The window taps of `nr` output rows of `nv` consecutive vectors each (stride 1 or 2), every
 * vector its own FMA chain; inlined with nr and nv constant. Rows are `rstep` apart in the padded
 * plane. */
static inline __attribute__((always_inline)) void dw_taps(v16 *acc, int nr, int nv, const float *base, int64_t rstep, const v16 *wv,
                                                         int64_t KH, int64_t KW, int64_t row_step, int64_t DW, int64_t SW) {
    for (int64_t kh = 0; kh < KH; kh++) {
        for (int64_t kw = 0; kw < KW; kw++) {
            v16 wt = wv[kh * KW + kw];
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const float *p = base + r * rstep + kh * row_step + kw * DW;
                if (SW == 1) {
#pragma GCC unroll 4
                    for (int j = 0; j < nv; j++) acc[r * nv + j] += wt * load16(p + 16 * j);
                } else {
#pragma GCC unroll 4
                    for (int j = 0; j < nv; j++) {
                        acc[r * nv + j] += wt * evens(load16(p + 32 * j), load16(p + 32 * j + 16));
                    }
                }
            }
        }
    }
}

/* One block of 16 channels of a depthwise convolution between channel-blocked tensors: xb [H, W,
 * 16], the taps wv[KH*KW] (each a vector of 16 channels), yb [OH, OW, 16], rb the residual in
 * yb's layout or NULL. Each vector is one position's 16 channels, so every lane is used whatever
 * the image's width (a 7x7 plane wastes 9 of 16 lanes along rows) and every load is aligned.
 * Outputs whose window lies inside the row go 4 at a time (4 FMA chains), the others one at a
 * time with their taps clipped; rows clip their taps to the rows the input has. */
static inline __attribute__((always_inline)) void dw_blocked_block(const float *xb, const v16 *wv, v16 bv, const float *rb, float *yb, int64_t H, int64_t W, int64_t KH,
                             int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW,
                             const Epilogue *e) {
    /* Columns [ow_a, ow_b) read no padding: ow * SW >= PW and ow * SW - PW + (KW - 1) * DW < W. */
    int64_t ow_a = (PW + SW - 1) / SW;
    int64_t last = W - 1 + PW - (KW - 1) * DW;
    int64_t ow_b = last < 0 ? 0 : last / SW + 1;
    if (ow_a > OW) ow_a = OW;
    if (ow_b > OW) ow_b = OW;
    if (ow_b < ow_a) ow_b = ow_a;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t ih0 = oh * SH - PH;
        int64_t kh0 = 0, kh1 = KH;
        while (kh0 < KH && ih0 + kh0 * DH < 0) kh0++;
        while (kh1 > kh0 && ih0 + (kh1 - 1) * DH >= H) kh1--;
        const float *row0 = xb + ih0 * W * 16;
        float *yrow = yb + oh * OW * 16;
        const float *rrow = rb ? rb + oh * OW * 16 : NULL;
        for (int64_t ow = 0; ow < OW;) {
            v16 acc[4] = {bv, bv, bv, bv};
            int n = 1;
            int64_t iw0 = ow * SW - PW;
            if (ow >= ow_a && ow + 4 <= ow_b) {
                n = 4;
                dw_blocked_run(4, acc, row0 + iw0 * 16, kh0, kh1, KW, DH * W * 16, DW * 16, SW * 16, wv);
            } else {
                for (int64_t kh = kh0; kh < kh1; kh++) {
                    const float *row = row0 + kh * DH * W * 16;
                    for (int64_t kw = 0; kw < KW; kw++) {
                        int64_t iw = iw0 + kw * DW;
                        if (iw >= 0 && iw < W) acc[0] += wv[kh * KW + kw] * load16(row + iw * 16);
                    }
                }
            }
            for (int j = 0; j < n; j++) {
                v16 v = acc[j];
                if (rrow) v += load16(rrow + (ow + j) * 16);
                store16(yrow + (ow + j) * 16, finish(v, e, 0, 0));
            }
            ow += n;
        }
    }
}

/* A depthwise convolution between channel-blocked (NCHW16c) tensors, for channels c0 .. c1
 * (multiples of 16): x [C/16, H, W, 16], the taps packed [C/16, KH*KW, 16], y [C/16, OH, OW, 16].
 * Nothing is copied. */
static void depthwise_blocked(const float *x, const float *wb, const float *bias, const float *res, float *y, int64_t H, int64_t W,
                              int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                              int64_t OH, int64_t OW, int64_t c0, int64_t c1, const Epilogue *e) {
    int64_t T = KH * KW;
    /* A local copy: stores through y cannot change it, so its fields stay in registers. */
    Epilogue ep = *e;
    for (int64_t cb = c0 / 16; cb < c1 / 16; cb++) {
        v16 wv[64];
        for (int64_t t = 0; t < T; t++) wv[t] = load16(wb + (cb * T + t) * 16);
        v16 bv = bias ? load16(bias + cb * 16) : splat(0.0f);
        const float *xb = x + cb * H * W * 16, *rb = res ? res + cb * OH * OW * 16 : NULL;
        float *yb = y + cb * OH * OW * 16;
        /* The usual windows with their sizes constant, as depthwise_regrouped has them. */
        if (KH == 3 && KW == 3) dw_blocked_block(xb, wv, bv, rb, yb, H, W, 3, 3, SH, SW, DH, DW, PH, PW, OH, OW, &ep);
        else if (KH == 5 && KW == 5) dw_blocked_block(xb, wv, bv, rb, yb, H, W, 5, 5, SH, SW, DH, DW, PH, PW, OH, OW, &ep);
        else dw_blocked_block(xb, wv, bv, rb, yb, H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, &ep);
    }
}

/* A depthwise convolution between NCHW tensors, for channels c0 .. c1 (c0 a multiple of 16; the
 * taps packed as depthwise_blocked has them, the last block padded with zeros): each 16
 * channels' planes (or the fewer left) go channel-blocked into a zero-padded scratch plane through 16x16 register transposes, so every output's window lies
 * inside it and runs 4 at a time with no clipping; the results come back the same way, adding
 * the residual and clamping on the way out. Rows of 7 used 7 of a vector's 16 lanes, and stride
 * 2 along rows discarded half of each load (1 thread: 960 channels 3x3 on 7x7, 0.103 -> 0.040
 * ms; 240 channels 5x5/2 on 14x14, 0.073 -> 0.022 ms). */
static void depthwise_regrouped(const float *x, const float *wb, const float *bias, const float *res, float *y, int64_t H, int64_t W,
                                int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                                int64_t OH, int64_t OW, int64_t c0, int64_t c1, const Epilogue *e) {
    int64_t T = KH * KW, P = H * W, Q = OH * OW;
    int64_t Hp, Wp;
    dw_plane_size(H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, &Hp, &Wp);
    float *xb = scratch(0, (size_t)(Hp * Wp * 16));
    float *yb = scratch(1, (size_t)(Q * 16));
    if (!xb || !yb) return; /* (recorded by scratch) */
    /* A local copy: stores through y cannot change it, so its fields stay in registers. */
    Epilogue ep = *e;
    dw_clear_border(xb, H, W, PH, PW, Hp, Wp);
    for (int64_t cb = c0 / 16; cb * 16 < c1; cb++) {
        int64_t nc = c1 - cb * 16 < 16 ? c1 - cb * 16 : 16;
        const float *xc = x + cb * 16 * P;
        for (int64_t p = 0; p < P; p += 16) {
            int64_t n = P - p < 16 ? P - p : 16;
            v16 r[16];
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) r[l] = l < nc ? load16_n(xc + l * P + p, n) : splat(0.0f);
            transpose16(r);
            dw_scatter(xb, r, p, n, W, PH, PW, Wp);
        }
        v16 wv[64];
        for (int64_t t = 0; t < T; t++) wv[t] = load16(wb + (cb * T + t) * 16);
        v16 bv = bias ? load16_n(bias + cb * 16, nc) : splat(0.0f);
        /* The usual windows get copies with their sizes constant: the taps stay in registers
         * and the tap loops unroll (3x3 on 144 channels of 56x56, 1 thread: 0.37 -> 0.30 ms). */
        if (KH == 3 && KW == 3) dw_padded_plane(xb, yb, bv, wv, 3, 3, SH, SW, DH, DW, Wp, OH, OW);
        else if (KH == 5 && KW == 5) dw_padded_plane(xb, yb, bv, wv, 5, 5, SH, SW, DH, DW, Wp, OH, OW);
        else dw_padded_plane(xb, yb, bv, wv, KH, KW, SH, SW, DH, DW, Wp, OH, OW);
        float *yc = y + cb * 16 * Q;
        const float *rc = res ? res + cb * 16 * Q : NULL;
        for (int64_t q = 0; q < Q; q += 16) {
            int64_t n = Q - q < 16 ? Q - q : 16;
            v16 r[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) r[j] = j < n ? load16(yb + (q + j) * 16) : splat(0.0f);
            transpose16(r);
            for (int l = 0; l < nc; l++) {
                v16 v = r[l];
                if (rc) v += load16_n(rc + l * Q + q, n);
                store16_n(yc + l * Q + q, finish(v, &ep, 0, 0), n);
            }
        }
    }
}

/* A depthwise convolution (one input and one output channel a group) in the form the plan chose
 * (`form`): on channel-blocked tensors; regrouped (NCHW tensors, blocks of 16 channels through
 * blocked scratch); or, for windows too wide to keep their taps in registers, vectorised along
 * output rows: per channel the plane is copied once into a zero-padded buffer (with slack past
 * its end), then each 16 outputs of a row take one FMA per window tap; stride 2 reads 32 inputs
 * and keeps the even ones. Work units: images x chunks of channels. */
void kiln_uk_depthwise(int64_t x_, int64_t w_, int64_t bias_, int64_t res_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t KH,
                       int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW,
                       int64_t act, float lo, float hi, int64_t chunks, int64_t form, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_, *w = (const float *)(intptr_t)w_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    /* form: 0 NCHW rows (below), 1 channel-blocked tensors, 2 NCHW regrouped per 16 channels. */
    if (form) {
        Epilogue e = epilogue_of(NULL, NULL, NULL, 0, act, lo, hi);
        for (int64_t u = wg_begin; u < wg_end; u++) {
            int64_t img = u / chunks, q = u % chunks, c0, c1;
            chunk_range(C, 16, chunks, q, &c0, &c1);
            if (c0 < c1)
                (form == 1 ? depthwise_blocked : depthwise_regrouped)(x + img * C * H * W, w, bias, res ? res + img * C * OH * OW : NULL,
                                                                         y + img * C * OH * OW, H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH,
                                                                         OW, c0, c1, &e);
        }
        return;
    }
    /* The padded plane: every row a window reads, every column up to the last vector's reach. */
    int64_t Hp = (OH - 1) * SH + (KH - 1) * DH + 1;
    int64_t lanes = (OW + 15) / 16 * 16;
    int64_t Wp = (lanes - 1) * SW + (KW - 1) * DW + 1 + 16 * SW;
    /* Slack past the end: a row's last vectors may read up to 4 x 16 x SW past it. */
    int64_t slack = 160 * SW + 64;
    float *xp = scratch(0, (size_t)(Hp * Wp + slack));
    if (!xp) return; /* (recorded by scratch) */
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks;
        int64_t c0, c1;
        chunk_range(C, 1, chunks, q, &c0, &c1);
        /* The border is the same zeros for every channel: cleared once, then only the rows
         * and columns the input covers are copied per channel. */
        memset(xp, 0, (size_t)(Hp * Wp + slack) * sizeof(float));
        int64_t r0 = PH, r1 = PH + H < Hp ? PH + H : Hp;
        int64_t cols = PW + W <= Wp ? W : Wp - PW;
        for (int64_t c = c0; c < c1; c++) {
            const float *plane = x + (img * C + c) * H * W;
            for (int64_t r = r0; r < r1; r++) {
                float *o = xp + r * Wp + PW;
                const float *src = plane + (r - PH) * W;
                copy_floats(o, src, cols);
            }
            const float *wc = w + c * KH * KW;
            float *yc = y + (img * C + c) * OH * OW;
            const float *rc = res ? res + (img * C + c) * OH * OW : NULL;
            Epilogue e = epilogue_of(bias ? bias + c : NULL, NULL, NULL, 0, act, lo, hi);
            /* The taps as vectors once per channel (a broadcast per tap per vector otherwise). */
            v16 wv[64];
            int64_t taps = KH * KW <= 64 ? KH * KW : 0;
            for (int64_t t = 0; t < taps; t++) wv[t] = splat(wc[t]);
            /* Four independent FMA chains where there are: 4 vectors of a row, or 2 vectors of 2
             * rows, or 1 vector of up to 4 rows (a small plane); one chain of KH*KW dependent
             * FMAs would wait on each. */
            int64_t per_row = (OW + 15) / 16;
            int fast = taps && (SW == 1 || SW == 2);
            for (int64_t oh = 0; oh < OH;) {
                int64_t left = OH - oh;
                int nr = !fast ? 1 : per_row == 1 ? (left >= 4 ? 4 : (int)left) : per_row == 2 && left >= 2 ? 2 : 1;
                for (int64_t ow = 0; ow < OW;) {
                    int64_t nv = nr > 1 ? per_row : OW - ow > 32 ? 4 : OW - ow > 16 ? 2 : 1;
                    v16 acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
                    if (fast) {
                        const float *base = xp + oh * SH * Wp + ow * SW;
                        int64_t rstep = SH * Wp;
                        if (nr == 4) dw_taps(acc, 4, 1, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else if (nr == 3) dw_taps(acc, 3, 1, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else if (nr == 2 && nv == 1) dw_taps(acc, 2, 1, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else if (nr == 2) dw_taps(acc, 2, 2, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else if (nv == 4) dw_taps(acc, 1, 4, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else if (nv == 2) dw_taps(acc, 1, 2, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                        else dw_taps(acc, 1, 1, base, rstep, wv, KH, KW, DH * Wp, DW, SW);
                    } else {
                        nv = 1;
                        for (int64_t kh = 0; kh < KH; kh++) {
                            const float *row = xp + (oh * SH + kh * DH) * Wp + ow * SW;
                            for (int64_t kw = 0; kw < KW; kw++) {
                                const float *p = row + kw * DW;
                                float t[16];
                                for (int l = 0; l < 16; l++) t[l] = p[l * SW];
                                acc[0] += splat(wc[kh * KW + kw]) * load16(t);
                            }
                        }
                    }
                    /* The epilogue on whole vectors; a row's last vector stores its valid lanes. */
                    for (int64_t r = 0; r < nr; r++) {
                        for (int64_t j = 0; j < nv; j++) {
                            int64_t at = (oh + r) * OW + ow + 16 * j;
                            int64_t n = OW - (ow + 16 * j) < 16 ? OW - (ow + 16 * j) : 16;
                            /* 4 vectors are computed where 3 are left (a row of 35): the 4th
                             * lies past the row and is not stored. */
                            if (n <= 0) continue;
                            v16 v = acc[r * nv + j];
                            if (n == 16) {
                                if (rc) v += load16(rc + at);
                                store16(yc + at, finish(v, &e, 0, 0));
                            } else {
                                if (rc) v += load16_n(rc + at, n);
                                store16_n(yc + at, finish(v, &e, 0, 0), n);
                            }
                        }
                    }
                    ow += 16 * nv;
                }
                oh += nr;
            }
        }
    }
}

/* R rows (1, 2 or 4) of A times one NR strip of packed B: each B vector loaded once for all R
 * rows, 4 / R K steps in flight per row, so 8 independent FMA chains in all. Inlined with R
 * constant; out[r * 2 + h] is row r's half h. */
static inline __attribute__((always_inline)) void gemv_rows(int R, const float *a, int64_t lda, int64_t ka, const float *b, int64_t K,
                                                           v16 *out) {
    const int U = 4 / R;
    v16 s0[4][4], s1[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) s0[r][u] = s1[r][u] = splat(0.0f);
    }
    int64_t k = 0;
    for (; k + U <= K; k += U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            v16 b0 = load16(b + (k + u) * NR), b1 = load16(b + (k + u) * NR + 16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                v16 av = splat(a[r * lda + (k + u) * ka]);
                s0[r][u] += av * b0;
                s1[r][u] += av * b1;
            }
        }
    }
    for (; k < K; k++) {
        v16 b0 = load16(b + k * NR), b1 = load16(b + k * NR + 16);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            v16 av = splat(a[r * lda + k * ka]);
            s0[r][0] += av * b0;
            s1[r][0] += av * b1;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        v16 r0 = s0[r][0], r1 = s1[r][0];
#pragma GCC unroll 4
        for (int u = 1; u < U; u++) {
            r0 += s0[r][u];
            r1 += s1[r][u];
        }
        out[2 * r] = r0;
        out[2 * r + 1] = r1;
    }
}

/* A few rows (M < MR: a matrix-vector product, a small batch of tokens) by packed B: each NR
 * strip of B streams once per group of up to 4 rows, no packing of A and no empty tile rows.
 * Work units: chunks of N. */
static void gemv(const float *a, int64_t lda, int64_t ka, const float *bp, float *y, int64_t M, int64_t N, int64_t K, const Epilogue *epi,
                 int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    for (int64_t q = wg_begin; q < wg_end; q++) {
        int64_t j0, j1;
        chunk_range(N, NR, chunks, q, &j0, &j1);
        for (int64_t j = j0; j < j1; j += NR) {
            const float *b = bp + (j / NR) * K * NR;
            int64_t nr = N - j < NR ? N - j : NR;
            for (int64_t i = 0; i < M;) {
                v16 acc[8];
                int64_t rows = M - i >= 4 ? 4 : M - i >= 2 ? 2 : 1;
                const float *ai = a + i * lda;
                if (rows == 4) gemv_rows(4, ai, lda, ka, b, K, acc);
                else if (rows == 2) gemv_rows(2, ai, lda, ka, b, K, acc);
                else gemv_rows(1, ai, lda, ka, b, K, acc);
                for (int64_t r = 0; r < rows; r++, i++) {
                    float t[NR];
                    store16(t, acc[2 * r]);
                    store16(t + 16, acc[2 * r + 1]);
                    for (int64_t c = 0; c < nr; c++) y[i * N + j + c] = finish1(t[c], epi, i, j + c);
                }
            }
        }
    }
}

#if MR == 8
/* A GEMM's tile of `rows` (1..MR) rows in bf16, each row count with its own straight-line loop
 * (a matrix-vector product costs one row's products, not a tile's): A's rows lda2 words apart,
 * B a packed strip of pairs (NR words a step). */
KILN_BF16 static void micro_bf16(int64_t rows, int64_t K2, const uint32_t *a, int64_t lda2, const uint32_t *b, v16 *c0, v16 *c1) {
    switch (rows) {
#define KILN_ROWS(R)                                          \
    case R:                                                   \
        tile_bf16(R, 0, K2, a, lda2, 1, b, NULL, c0, c1);    \
        break;
        KILN_ROWS(1)
        KILN_ROWS(2)
        KILN_ROWS(3)
        KILN_ROWS(4)
        KILN_ROWS(5)
        KILN_ROWS(6)
        KILN_ROWS(7)
        KILN_ROWS(8)
#undef KILN_ROWS
    default:
        KILN_INTERNAL_FAILURE(); /* rows is 1..MR: a bug, not input */
        return;
    }
}

/* Rows i0 .. i1 of A (A[i, k] = a[i * lda + k * ka]) as bf16 pairs, row-major: out[(i - i0) *
 * K2 + q] = bf16(A[i, 2q]) | bf16(A[i, 2q + 1]) << 16, an odd K's last high half zero. */
KILN_BF16 static void rows_to_bf16(const float *a, int64_t lda, int64_t ka, int64_t i0, int64_t i1, int64_t K, uint32_t *out) {
    int64_t K2 = (K + 1) / 2;
    for (int64_t i = i0; i < i1; i++) {
        const float *row = a + i * lda;
        uint16_t *o = (uint16_t *)(out + (i - i0) * K2);
        /* 32 consecutive k become 32 consecutive bf16: 16 pair words in order. A strided row
         * (A transposed) is gathered 32 at a time first. */
        for (int64_t k = 0; k < K; k += 32) {
            int64_t n = K - k < 32 ? K - k : 32;
            float t[32];
            const float *src = row + k * ka;
            if (ka != 1) {
                for (int64_t j = 0; j < n; j++) t[j] = row[(k + j) * ka];
                src = t;
            }
            __mmask16 lo = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
            __mmask16 hi = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, src + 16), _mm512_maskz_loadu_ps(lo, src));
            _mm512_mask_storeu_epi16(o + k, (__mmask32)(n >= 32 ? 0xffffffffu : (1u << n) - 1), (__m512i)v);
        }
        if (K % 2) o[K] = 0;
    }
}

/* C = A * B in bf16 products (f32 sums), B packed at compile time as pair strips
 * ([(j / NR) * K2 + q] * NR + j % NR: B[2q, j] low, B[2q + 1, j] high), rows a0 .. a1 and columns
 * b0 .. b1, the epilogue applied as each tile is stored. A's rows are made bf16 once per call;
 * each B strip then meets every row tile while it is in cache. */
static void gemm_bf16(const float *a, int64_t lda, int64_t ka, const uint32_t *bp, float *y, int64_t N, int64_t K, int64_t a0,
                      int64_t a1, int64_t b0, int64_t b1, const Epilogue *epi) {
    int64_t K2 = (K + 1) / 2;
    uint32_t *ab = (uint32_t *)scratch(1, (size_t)((a1 - a0) * K2));
    if (!ab) return; /* out of memory, recorded by scratch */
    rows_to_bf16(a, lda, ka, a0, a1, K, ab);
    for (int64_t j = b0; j < b1; j += NR) {
        int64_t nr = b1 - j < NR ? b1 - j : NR;
        const uint32_t *b = bp + (j / NR) * K2 * NR;
        for (int64_t i = a0; i < a1; i += MR) {
            int64_t mr = a1 - i < MR ? a1 - i : MR;
            v16 c0[MR], c1[MR];
            micro_bf16(mr, K2, ab + (i - a0) * K2, K2, b, c0, c1);
            Epilogue e = *epi;
            if (e.bias_col) e.bias_col += j;
            if (e.res) e.res += i * e.ldr + j;
            for (int64_t r = 0; r < mr; r++) {
                float *yr = y + (i + r) * N + j;
                if (nr == NR) {
                    store16(yr, finish(c0[r], &e, r, 0));
                    store16(yr + 16, finish(c1[r], &e, r, 16));
                } else {
                    store16_n(yr, finish_n(c0[r], &e, r, 0, nr < 16 ? nr : 16), nr < 16 ? nr : 16);
                    if (nr > 16) store16_n(yr + 16, finish_n(c1[r], &e, r, 16, nr - 16), nr - 16);
                }
            }
        }
    }
}
#endif

/* C[M, N] = A[M, K] * B[K, N] (+ bias per column, + residual [M, N], activation), A strided
 * (A[i, k] = a[i * lda + k * ka]), B packed at compile time (f32, or bf16 pairs with `bf16`).
 * Work units: chunks of N (split_n) or of M. */
void kiln_uk_gemm(int64_t a_, int64_t bp_, int64_t bias_, int64_t res_, int64_t y_, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ka, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks, int64_t split_n,
                  int64_t bf16, int64_t wg_begin, int64_t wg_end) {
    const float *a = (const float *)(intptr_t)a_, *bp = (const float *)(intptr_t)bp_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    Blocking bl = {kc, mc, nc};
    Asource A = {NULL, a, lda, ka, NULL, 0};
    Bsource B = {bp, NULL, 0, 0, NULL};
    Epilogue e = epilogue_of(NULL, bias, res, N, act, lo, hi);
    if (bf16) {
#if MR == 8
        for (int64_t q = wg_begin; q < wg_end; q++) {
            int64_t a0 = 0, a1 = M, b0 = 0, b1 = N;
            if (split_n) chunk_range(N, NR, chunks, q, &b0, &b1);
            else chunk_range(M, MR, chunks, q, &a0, &a1);
            if (a0 < a1 && b0 < b1) gemm_bf16(a, lda, ka, (const uint32_t *)bp, y, N, K, a0, a1, b0, b1, &e);
        }
        return;
#else
        KILN_INTERNAL_FAILURE(); /* planned only where the host has AVX512-BF16: a bug, not input */
        return;
#endif
    }
    if (M < MR) {
        gemv(a, lda, ka, bp, y, M, N, K, &e, chunks, wg_begin, wg_end);
        return;
    }
    for (int64_t q = wg_begin; q < wg_end; q++) {
        int64_t a0 = 0, a1 = M, b0 = 0, b1 = N;
        if (split_n) chunk_range(N, NR, chunks, q, &b0, &b1);
        else chunk_range(M, MR, chunks, q, &a0, &a1);
        if (a0 < a1 && b0 < b1) gemm_block(&A, &B, y, N, 16, M, N, K, a0, a1, b0, b1, &e, &bl);
    }
}
