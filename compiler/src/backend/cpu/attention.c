/* Scaled dot-product attention on the CPU as one kernel: softmax(Q K^T * scale + mask) V.
 * Unfused it is a batched GEMM, a softmax and a second GEMM, with the scores written out and
 * read back twice, plus the copies that move heads in and out of place. Here Q, K, V and Y are
 * read and written where they lie through strides (heads interleaved in [batch, seq, heads *
 * size] or apart in [batch, heads, seq, size]), and the scores of 4 query rows at a time live
 * in a scratch row block.
 *
 * Per work unit (a batch, a head and up to 64 query rows):
 *   - K^T of the unit's KV head, packed through 16x16 transposes into [head_size, T'] (T'
 *     the keys rounded up to 32, zero columns after them), unless the previous unit of the
 *     same call packed the same head;
 *   - per 4 query rows: scores S = Q K^T (4 rows x 32 keys of accumulators over the head
 *     size), scaled, plus the mask, with -inf above the diagonal when causal and after the
 *     last key; each row's max, e^(s - max) and its sum; then Y = P V along V's rows (4 rows
 *     x 32 columns of accumulators over the keys), scaled by 1 / sum as it is stored. When
 *     causal, keys after the 4 rows' last are skipped: half the work of a square attention.
 * A row whose every score is -inf gives NaN (0/0), as ONNX's reference softmax does. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"
#include "workspace.h"

enum { MASK_NONE = 0, MASK_F32 = 1, MASK_BOOL = 2 };
#define AT_ROWS 4
#define AT_UNIT_ROWS 64

/* K^T of one head (rows of stride ks, hs floats each) into kt [hs][tp], columns T..tp zero. */
static void pack_kt(const float *k, int64_t ks, int64_t T, int64_t hs, int64_t tp, float *kt) {
    for (int64_t t0 = 0; t0 < tp; t0 += 16) {
        for (int64_t d0 = 0; d0 < hs; d0 += 16) {
            int64_t nd = hs - d0 < 16 ? hs - d0 : 16;
            v16 r[16];
            for (int64_t i = 0; i < 16; i++) r[i] = t0 + i < T ? load16_n(k + (t0 + i) * ks + d0, nd) : splat(0.0f);
            transpose16(r);
            for (int64_t j = 0; j < nd; j++) store16(kt + (d0 + j) * tp + t0, r[j]);
        }
    }
}

/* The additive mask of 16 keys from t0 (n of them real, n <= 16): -inf past the real ones. */
static inline v16 mask16(int64_t kind, const void *row, int64_t t0, int64_t n) {
    if (n == 16 && kind == MASK_F32) return load16((const float *)row + t0);
    if (n == 16 && kind == MASK_NONE) return splat(0.0f);
    float t[16];
    for (int64_t l = 0; l < 16; l++) {
        if (l >= n) {
            t[l] = -INFINITY;
        } else if (kind == MASK_F32) {
            t[l] = ((const float *)row)[t0 + l];
        } else if (kind == MASK_BOOL) {
            t[l] = ((const uint8_t *)row)[t0 + l] ? 0.0f : -INFINITY;
        } else {
            t[l] = 0.0f;
        }
    }
    return load16(t);
}

static inline v16 iota16(void) { return (v16){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }

/* acc[r] = sum over keys t of P[r][t] V[t][0..32] (P rows of stride tp in sc, V rows of stride
 * vs); n0 (1..16) and n1 (0..16) of the two vectors are V's. Inlined, so the whole-vector call
 * (16, 16) loads without masks. */
static inline __attribute__((always_inline)) void pv_tile(const float *sc, int64_t tp, const float *v, int64_t vs, int64_t T, int64_t n0, int64_t n1,
                                                          v16 acc[AT_ROWS][2]) {
    v16 a00 = splat(0.0f), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (int64_t t = 0; t < T; t++) {
        const float *vr = v + t * vs;
        v16 x0 = n0 == 16 ? load16(vr) : load16_n(vr, n0);
        v16 x1 = n1 == 16 ? load16(vr + 16) : n1 > 0 ? load16_n(vr + 16, n1) : splat(0.0f);
        v16 p0 = splat(sc[t]), p1 = splat(sc[tp + t]), p2 = splat(sc[2 * tp + t]), p3 = splat(sc[3 * tp + t]);
        a00 += p0 * x0, a01 += p0 * x1;
        a10 += p1 * x0, a11 += p1 * x1;
        a20 += p2 * x0, a21 += p2 * x1;
        a30 += p3 * x0, a31 += p3 * x1;
    }
    acc[0][0] = a00, acc[0][1] = a01, acc[1][0] = a10, acc[1][1] = a11;
    acc[2][0] = a20, acc[2][1] = a21, acc[3][0] = a30, acc[3][1] = a31;
}

/* acc[r] = Q[r] K^T[.., t0..t0 + 32] over the head size (K^T rows of stride tp). */
static inline __attribute__((always_inline)) void qk_tile(const float *const qr[AT_ROWS], const float *kt, int64_t tp, int64_t hs, v16 acc[AT_ROWS][2]) {
    v16 a00 = splat(0.0f), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const float *q0 = qr[0], *q1 = qr[1], *q2 = qr[2], *q3 = qr[3];
    for (int64_t d = 0; d < hs; d++) {
        v16 k0 = load16(kt + d * tp), k1 = load16(kt + d * tp + 16);
        v16 b0 = splat(q0[d]), b1 = splat(q1[d]), b2 = splat(q2[d]), b3 = splat(q3[d]);
        a00 += b0 * k0, a01 += b0 * k1;
        a10 += b1 * k0, a11 += b1 * k1;
        a20 += b2 * k0, a21 += b2 * k1;
        a30 += b3 * k0, a31 += b3 * k1;
    }
    acc[0][0] = a00, acc[0][1] = a01, acc[1][0] = a10, acc[1][1] = a11;
    acc[2][0] = a20, acc[2][1] = a21, acc[3][0] = a30, acc[3][1] = a31;
}

/* Arguments: the buffers; sizes (batch, query heads, KV heads, query rows S, keys T, head size,
 * V's head size); strides in floats of batch, head and row for Q, K, V and Y (the last axis
 * is contiguous); the mask's kind, and its strides in elements of batch, head and row (0 where
 * it broadcasts; its last axis is T, contiguous); causal; the scale; the work split. */
void kiln_uk_attention(int64_t q_, int64_t k_, int64_t v_, int64_t m_, int64_t y_, int64_t batch, int64_t heads, int64_t kv_heads,
                       int64_t S, int64_t T, int64_t hs, int64_t vhs, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh,
                       int64_t ks, int64_t vb, int64_t vh, int64_t vs, int64_t yb, int64_t yh, int64_t ys, int64_t mask_kind, int64_t mb,
                       int64_t mh, int64_t ms, int64_t causal, float scale, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    const float *q = (const float *)(intptr_t)q_, *k = (const float *)(intptr_t)k_, *v = (const float *)(intptr_t)v_;
    const uint8_t *mask = (const uint8_t *)(intptr_t)m_;
    float *y = (float *)(intptr_t)y_;
    const int64_t melt = mask_kind == MASK_F32 ? 4 : 1;
    const int64_t tp = (T + 31) / 32 * 32, group = heads / kv_heads, blocks = (S + AT_UNIT_ROWS - 1) / AT_UNIT_ROWS;
    float *kt = scratch(0, (size_t)(hs * tp));
    float *sc = scratch(1, (size_t)(AT_ROWS * tp));
    if (!kt || !sc) return; /* out of memory, recorded by scratch */
    for (int64_t wq = wg_begin; wq < wg_end; wq++) {
        int64_t u0, u1, packed = -1;
        chunk_range(batch * heads * blocks, 1, chunks, wq, &u0, &u1);
        for (int64_t u = u0; u < u1; u++) {
            const int64_t b = u / (heads * blocks), h = u / blocks % heads, blk = u % blocks;
            const int64_t kvh = h / group;
            if (packed != b * kv_heads + kvh) {
                pack_kt(k + b * kb + kvh * kh, ks, T, hs, tp, kt);
                packed = b * kv_heads + kvh;
            }
            const float *vbase = v + b * vb + kvh * vh;
            const int64_t i_end = (blk + 1) * AT_UNIT_ROWS < S ? (blk + 1) * AT_UNIT_ROWS : S;
            for (int64_t i = blk * AT_UNIT_ROWS; i < i_end; i += AT_ROWS) {
                const int64_t nr = i_end - i < AT_ROWS ? i_end - i : AT_ROWS;
                /* Rows past the last repeat it; their results are not stored. */
                const float *qr[AT_ROWS];
                for (int64_t r = 0; r < AT_ROWS; r++) qr[r] = q + b * qb + h * qh + (i + (r < nr ? r : 0)) * qs;
                /* Causal: keys after the last row's own are masked for all 4 rows, so not computed. */
                const int64_t tend = causal && i + nr < T ? i + nr : T, te = (tend + 31) / 32 * 32;
                /* Scores. */
                for (int64_t t0 = 0; t0 < te; t0 += 32) {
                    v16 acc[AT_ROWS][2];
                    qk_tile(qr, kt + t0, tp, hs, acc);
#pragma GCC unroll 4
                    for (int r = 0; r < AT_ROWS; r++) {
                        const int64_t row = i + (r < nr ? r : 0);
                        const uint8_t *mrow = mask_kind == MASK_NONE ? mask : mask + (row * ms + h * mh + b * mb) * melt;
                        for (int half = 0; half < 2; half++) {
                            int64_t at = t0 + 16 * half, n = T - at < 0 ? 0 : T - at < 16 ? T - at : 16;
                            v16 s = acc[r][half] * splat(scale) + mask16(mask_kind, mrow, at, n);
                            if (causal) s = select_where(iota16() + splat((float)at) > splat((float)row), splat(-INFINITY), s);
                            store16(sc + r * tp + at, s);
                        }
                    }
                }
                /* Softmax numerators and the reciprocals of their sums. */
                float inv[AT_ROWS];
                for (int64_t r = 0; r < AT_ROWS; r++) {
                    float *row = sc + r * tp;
                    v16 mx = splat(-INFINITY);
                    for (int64_t t = 0; t < te; t += 16) mx = vmax(mx, load16(row + t));
                    v16 m = splat(hmax(mx)), sum = splat(0.0f);
                    for (int64_t t = 0; t < te; t += 16) {
                        v16 s = load16(row + t);
                        /* (vexp clamps, so e^-inf would be e^-87: masked keys are set to 0.) */
                        v16 e = select_where(s == splat(-INFINITY), splat(0.0f), vexp(s - m));
                        store16(row + t, e);
                        sum += e;
                    }
                    inv[r] = 1.0f / hsum(sum);
                }
                /* Y = P V, 32 columns at a time. */
                for (int64_t c0 = 0; c0 < vhs; c0 += 32) {
                    const int64_t n0 = vhs - c0 < 16 ? vhs - c0 : 16, n1 = vhs - c0 - 16 < 0 ? 0 : vhs - c0 - 16 < 16 ? vhs - c0 - 16 : 16;
                    v16 acc[AT_ROWS][2];
                    if (n1 == 16) pv_tile(sc, tp, vbase + c0, vs, tend, 16, 16, acc);
                    else pv_tile(sc, tp, vbase + c0, vs, tend, n0, n1, acc);
#pragma GCC unroll 4
                    for (int r = 0; r < AT_ROWS; r++) {
                        if (r >= nr) break;
                        float *yr = y + b * yb + h * yh + (i + r) * ys + c0;
                        v16 s = splat(inv[r]);
                        if (n1 == 16) {
                            store16(yr, acc[r][0] * s);
                            store16(yr + 16, acc[r][1] * s);
                        } else {
                            store16_n(yr, acc[r][0] * s, n0);
                            if (n1 > 0) store16_n(yr + 16, acc[r][1] * s, n1);
                        }
                    }
                }
            }
        }
    }
}
