/* kiln's f32 max and average pooling (kiln_uk_pool2d): 2x2/2 windows in one pass, ResNet's
 * 3x3/2 max pool by row maxima, any other window separably; an activation fused after it is
 * applied as results are stored. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "workspace.h"
#include "tile.h"

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
