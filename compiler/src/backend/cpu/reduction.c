/* Reductions over a contiguous group of axes and softmax over rows, on the CPU. The linalg path
 * reduces a row as one vector chain and, split into workgroups, may clone a whole reduction into
 * each; here every row (or column block) has several independent accumulators, and work units
 * are chunks of the outer dimension, each reading only its own rows.
 *
 * A reduction sees x as [O, R, I] (outer, reduced, inner) and writes y [O, I]. With I = 1 it
 * reduces rows (4 vectors of 16 at a time, then a horizontal step); otherwise it adds whole rows
 * of I into accumulators along the inner dimension. Max and min propagate NaN, as ONNX's do. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"
#include "workspace.h"

enum { RED_SUM = 0, RED_MEAN = 1, RED_MAX = 2, RED_MIN = 3 };

/* a op b for 16 lanes (max and min leave NaN to the callers, which track it apart: a chain of
 * NaN-aware selects is three times slower than vmaxps). */
static inline v16 combine(int kind, v16 a, v16 b) {
    if (kind == RED_MAX) return vmax(a, b);
    if (kind == RED_MIN) return vmin(a, b);
    return a + b;
}

/* Lanes that are NaN, as all-ones (a sum carries NaN by itself). */
static inline v16i nan_lanes(int kind, v16 v) { return kind == RED_MAX || kind == RED_MIN ? (v != v) : (v16i){0}; }

static inline float combine1(int kind, float a, float b) {
    if (kind == RED_MAX) return (b > a || b != b) ? b : a;
    if (kind == RED_MIN) return (b < a || b != b) ? b : a;
    return a + b;
}

static inline float identity(int kind) { return kind == RED_MAX ? -INFINITY : kind == RED_MIN ? INFINITY : 0.0f; }

/* One row of n floats reduced: four chains of 16 lanes, then the lanes, then the tail. */
static inline __attribute__((always_inline)) float reduce_row(int kind, const float *p, int64_t n) {
    v16 a0 = splat(identity(kind)), a1 = a0, a2 = a0, a3 = a0;
    v16i bad = {0};
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        v16 x0 = load16(p + j), x1 = load16(p + j + 16), x2 = load16(p + j + 32), x3 = load16(p + j + 48);
        a0 = combine(kind, a0, x0);
        a1 = combine(kind, a1, x1);
        a2 = combine(kind, a2, x2);
        a3 = combine(kind, a3, x3);
        bad |= nan_lanes(kind, x0) | nan_lanes(kind, x1) | nan_lanes(kind, x2) | nan_lanes(kind, x3);
    }
    for (; j + 16 <= n; j += 16) {
        v16 x0 = load16(p + j);
        a0 = combine(kind, a0, x0);
        bad |= nan_lanes(kind, x0);
    }
    v16 a = combine(kind, combine(kind, a0, a1), combine(kind, a2, a3));
    float r = kind == RED_MAX ? hmax(a) : kind == RED_MIN ? hmin(a) : hsum(a);
    for (; j < n; j++) r = combine1(kind, r, p[j]);
    return (kind == RED_MAX || kind == RED_MIN) && hany(bad) ? NAN : r;
}

/* nv vectors of the inner dimension, reduced over R rows of stride I. Inlined with nv constant. */
static inline __attribute__((always_inline)) void reduce_cols(int kind, int nv, const float *p, int64_t R, int64_t I, float scale, float *out) {
    v16 acc[4];
    v16i bad[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        acc[v] = splat(identity(kind));
        bad[v] = (v16i){0};
    }
    for (int64_t r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            v16 x = load16(p + r * I + 16 * v);
            acc[v] = combine(kind, acc[v], x);
            bad[v] |= nan_lanes(kind, x);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        v16 res = kind == RED_MEAN ? acc[v] * splat(scale) : acc[v];
        store16(out + 16 * v, select_where(bad[v], splat(NAN), res));
    }
}

static void reduce(int kind, const float *x, float *y, int64_t o0, int64_t o1, int64_t R, int64_t I) {
    float scale = 1.0f / (float)R;
    for (int64_t o = o0; o < o1; o++) {
        const float *xo = x + o * R * I;
        float *yo = y + o * I;
        if (I == 1) {
            float r = reduce_row(kind, xo, R);
            yo[0] = kind == RED_MEAN ? r * scale : r;
            continue;
        }
        int64_t i = 0;
        for (; i + 64 <= I; i += 64) reduce_cols(kind, 4, xo + i, R, I, scale, yo + i);
        for (; i + 16 <= I; i += 16) reduce_cols(kind, 1, xo + i, R, I, scale, yo + i);
        for (; i < I; i++) {
            float r = identity(kind);
            for (int64_t k = 0; k < R; k++) r = combine1(kind, r, xo[k * I + i]);
            yo[i] = kind == RED_MEAN ? r * scale : r;
        }
    }
}

/* y[O, I] = reduce over R of x[O, R, I] (kind: sum, mean, max, min). Work units: chunks of O. */
void kiln_uk_reduce(int64_t x_, int64_t y_, int64_t O, int64_t R, int64_t I, int64_t kind, int64_t chunks, int64_t wg_begin,
                    int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    float *y = (float *)(intptr_t)y_;
    for (int64_t q = wg_begin; q < wg_end; q++) {
        int64_t o0, o1;
        chunk_range(O, 1, chunks, q, &o0, &o1);
        /* The kind as a constant in each copy, so the combine inlines to one instruction. */
        switch (kind) {
        case RED_SUM: reduce(RED_SUM, x, y, o0, o1, R, I); break;
        case RED_MEAN: reduce(RED_MEAN, x, y, o0, o1, R, I); break;
        case RED_MAX: reduce(RED_MAX, x, y, o0, o1, R, I); break;
        default: reduce(RED_MIN, x, y, o0, o1, R, I); break;
        }
    }
}

/* The max of a row of n floats, NaN not promised (see kiln_uk_softmax). */
static inline float row_max(const float *p, int64_t n) {
    v16 a0 = splat(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        a0 = vmax(a0, load16(p + j));
        a1 = vmax(a1, load16(p + j + 16));
        a2 = vmax(a2, load16(p + j + 32));
        a3 = vmax(a3, load16(p + j + 48));
    }
    for (; j + 16 <= n; j += 16) a0 = vmax(a0, load16(p + j));
    float m = hmax(vmax(vmax(a0, a1), vmax(a2, a3)));
    for (; j < n; j++) m = p[j] > m ? p[j] : m;
    return m;
}

/* Softmax (or, with `log`, LogSoftmax) over each row of n floats: the row's max, then e^(x - max)
 * and its sum, then a scale (or x - max - log sum). A tail of under 16 goes through a padded
 * vector whose extra lanes are -inf (e^-inf adds 0). Work units: chunks of rows. */
void kiln_uk_softmax(int64_t x_, int64_t y_, int64_t rows, int64_t n, int64_t log, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    float *y = (float *)(intptr_t)y_;
    for (int64_t q = wg_begin; q < wg_end; q++) {
        int64_t r0, r1;
        chunk_range(rows, 1, chunks, q, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const float *p = x + r * n;
            float *o = y + r * n;
            /* (A NaN in the row reaches the sum, and so every result, without being tracked.) */
            float m = row_max(p, n);
            v16 mv = splat(m);
            v16 s0 = splat(0.0f), s1 = s0;
            int64_t j = 0;
            for (; j + 32 <= n; j += 32) {
                v16 e0 = vexp(load16(p + j) - mv), e1 = vexp(load16(p + j + 16) - mv);
                s0 += e0;
                s1 += e1;
                if (!log) {
                    store16(o + j, e0);
                    store16(o + j + 16, e1);
                }
            }
            for (; j + 16 <= n; j += 16) {
                v16 e0 = vexp(load16(p + j) - mv);
                s0 += e0;
                if (!log) store16(o + j, e0);
            }
            if (j < n) {
                float t[16];
                for (int l = 0; l < 16; l++) t[l] = j + l < n ? p[j + l] : -INFINITY;
                v16 e0 = vexp(load16(t) - mv);
                /* (vexp clamps, so -inf lanes give e^-87, not 0: masked out here.) */
                float et[16];
                store16(et, e0);
                for (int l = 0; l < 16; l++) {
                    if (j + l < n) {
                        if (!log) o[j + l] = et[l];
                    } else {
                        et[l] = 0.0f;
                    }
                }
                s0 += load16(et);
            }
            float sum = hsum(s0 + s1);
            if (log) {
                v16 shift = splat(m + logf(sum));
                int64_t k = 0;
                for (; k + 16 <= n; k += 16) store16(o + k, load16(p + k) - shift);
                for (; k < n; k++) o[k] = p[k] - (m + logf(sum));
            } else {
                v16 inv = splat(1.0f / sum);
                int64_t k = 0;
                for (; k + 16 <= n; k += 16) store16(o + k, load16(o + k) * inv);
                for (; k < n; k++) o[k] *= 1.0f / sum;
            }
        }
    }
}
