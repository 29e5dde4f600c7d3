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

#include "simd.h"
#include "workspace.h"
#include "amx.h"
#include "tile.h"
#include "ukernel.h"

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

/* Packs rows i0 .. i0+mc (output positions) and columns p0 .. p0+kc of the transposed im2col
 * matrix into MR strips. */
static void pack_a_im2col(const Im2col *g, int64_t i0, int64_t mc, int64_t m_total, int64_t p0, int64_t kc, float *out) {
    for (int64_t s0 = 0; s0 < mc; s0 += MR) {
        int64_t valid = m_total - (i0 + s0) < MR ? m_total - (i0 + s0) : MR;
        if (valid > mc - s0) valid = mc - s0;
        pack_window_strip(g, i0 + s0, valid, MR, p0, kc, out + s0 * kc);
    }
}

/* (Declared in tile.h, with what it computes.) */
void kiln_gemm_block(const Asource *A, const Bsource *B, float *c, int64_t ldc, int64_t cv, int64_t M, int64_t N, int64_t K,
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
                /* Every row strip of A passes over one strip of B while it is in L1, the next
                 * strip of B after all of them; but with K in one short block (a pointwise
                 * convolution of few input channels) writing C is the traffic, and that order
                 * writes every row of the block at once (256 rows, each its own stream, in DBNet's
                 * 16 -> 256 channels on 160x160 with a residual: 13.8 ms against onnxruntime's
                 * 3.0). Then each strip of MR rows sweeps the block's columns: MR streams. */
                int rows_outer = first && last && kc <= 64;
                int64_t outer = rows_outer ? mc : nc, outer_step = rows_outer ? MR : NR;
                int64_t inner = rows_outer ? nc : mc, inner_step = rows_outer ? NR : MR;
                for (int64_t o = 0; o < outer; o += outer_step) {
                    for (int64_t q = 0; q < inner; q += inner_step) {
                        int64_t jr = rows_outer ? q : o, ir = rows_outer ? o : q;
                        int64_t nr = nc - jr < NR ? nc - jr : NR;
                        int64_t j = jc + jr;
                        const float *bp = B->packed ? B->packed + ((j / NR) * K + pc) * NR : bbuf + jr * kc;
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
 * ld + q] = bf16(A[i, 2q]) | bf16(A[i, 2q + 1]) << 16, an odd K's last high half zero, words
 * past K2 (to ld) zero. */
KILN_BF16 static void rows_to_bf16(const float *a, int64_t lda, int64_t ka, int64_t i0, int64_t i1, int64_t K, int64_t ld, uint32_t *out) {
    int64_t K2 = (K + 1) / 2;
    for (int64_t i = i0; i < i1; i++) {
        const float *row = a + i * lda;
        uint16_t *o = (uint16_t *)(out + (i - i0) * ld);
        for (int64_t q = K2; q < ld; q++) out[(i - i0) * ld + q] = 0;
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

/* Rows a0 .. a1 (ab: their bf16 pairs, K2p words a row, the rows past a1 to a whole 32 zero) by
 * columns b0 .. b1 on AMX tiles: per NR (32) column strip and 32 rows, tiles 4 and 5 take two
 * 16-row blocks of A's pairs and 6 and 7 the strip's two 16-column halves (16 pair rows each,
 * NR words apart), tdpbf16ps adds their products into the accumulator tiles 0-3, which go
 * through the stack to the epilogue. */
__attribute__((target("amx-tile,amx-bf16"))) static void gemm_bf16_amx(const uint32_t *ab, int64_t K2p, const uint32_t *bp, float *y,
                                                                      int64_t N, int64_t a0, int64_t a1, int64_t b0, int64_t b1,
                                                                      const Epilogue *epi) {
    TileConfig cfg = amx_layout(64, 16);
    _tile_loadconfig(&cfg);
    float sums[32 * 32] __attribute__((aligned(64)));
    for (int64_t j = b0; j < b1; j += NR) {
        int64_t nr = b1 - j < NR ? b1 - j : NR;
        const uint32_t *b = bp + (j / NR) * K2p * NR;
        for (int64_t i = a0; i < a1; i += 32) {
            const uint32_t *a = ab + (i - a0) * K2p;
            AMX_ZERO_ACCUMULATORS();
            for (int64_t q = 0; q < K2p; q += 16) {
                AMX_STEP_2X2(_tile_dpbf16ps, a + q, a + 16 * K2p + q, K2p * 4, b + q * NR, b + q * NR + 16, NR * 4);
            }
            AMX_STORE_2X2(sums);
            int64_t mr = a1 - i < 32 ? a1 - i : 32;
            Epilogue e = *epi;
            if (e.bias_col) e.bias_col += j;
            if (e.res) e.res += i * e.ldr + j;
            for (int64_t r = 0; r < mr; r++) {
                float *yr = y + (i + r) * N + j;
                v16 c0 = load16(sums + r * 32), c1 = load16(sums + r * 32 + 16);
                if (nr == NR) {
                    store16(yr, finish(c0, &e, r, 0));
                    store16(yr + 16, finish(c1, &e, r, 16));
                } else {
                    store16_n(yr, finish_n(c0, &e, r, 0, nr < 16 ? nr : 16), nr < 16 ? nr : 16);
                    if (nr > 16) store16_n(yr + 16, finish_n(c1, &e, r, 16, nr - 16), nr - 16);
                }
            }
        }
    }
    _tile_release();
}

/* C = A * B in bf16 products (f32 sums), B packed at compile time as pair strips
 * ([(j / NR) * K2p + q] * NR + j % NR: B[2q, j] low, B[2q + 1, j] high; K2p the pair rows, on
 * AMX whole steps of 16), rows a0 .. a1 and columns b0 .. b1, the epilogue applied as each tile
 * is stored. A's rows are made bf16 once per call; each B strip then meets every row tile while
 * it is in cache. On AMX (`amx`) with 16 or more rows, tiles; else (and fewer rows) vdpbf16ps
 * (zero pair rows add nothing). */
static void gemm_bf16(const float *a, int64_t lda, int64_t ka, const uint32_t *bp, float *y, int64_t N, int64_t K, int64_t a0,
                      int64_t a1, int64_t b0, int64_t b1, const Epilogue *epi, int amx) {
    int64_t K2 = amx ? ((K + 1) / 2 + 15) / 16 * 16 : (K + 1) / 2;
    int64_t rows = amx ? (a1 - a0 + 31) / 32 * 32 : a1 - a0;
    uint32_t *ab = (uint32_t *)scratch(1, (size_t)(rows * K2));
    if (!ab) return; /* out of memory, recorded by scratch */
    rows_to_bf16(a, lda, ka, a0, a1, K, K2, ab);
    if (amx && a1 - a0 >= 16) {
        memset(ab + (a1 - a0) * K2, 0, (size_t)((rows - (a1 - a0)) * K2) * sizeof(uint32_t));
        gemm_bf16_amx(ab, K2, bp, y, N, a0, a1, b0, b1, epi);
        return;
    }
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
            if (a0 < a1 && b0 < b1) gemm_bf16(a, lda, ka, (const uint32_t *)bp, y, N, K, a0, a1, b0, b1, &e, bf16 == 2);
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
        if (a0 < a1 && b0 < b1) kiln_gemm_block(&A, &B, y, N, 16, M, N, K, a0, a1, b0, b1, &e, &bl);
    }
}
