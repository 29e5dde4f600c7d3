/* The 16-float vectors kiln's C kernels (gemm.c, conv.c, depthwise.c, pool.c, recurrent.c,
 * reduction.c, movement.c, attention.c, quantized.c) compute with: GCC vector types, so the
 * compiler picks the instructions for the level each object is built for (AVX-512: one register;
 * AVX2: two; baseline: four). */
#ifndef KILN_SIMD_H
#define KILN_SIMD_H
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16 load16(const float *p) { return *(const v16u *)p; }
static inline void store16(float *p, v16 v) { *(v16u *)p = v; }

/* The first n (1..16) lanes of p, the others zero; and a store of the first n lanes of v. */
static inline v16 load16_n(const float *p, int64_t n) {
#if defined(__AVX512F__)
    return (v16)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#else
    float t[16] = {0};
    memcpy(t, p, (size_t)n * sizeof(float));
    return load16(t);
#endif
}

static inline void store16_n(float *p, v16 v, int64_t n) {
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#else
    float t[16];
    store16(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
#endif
}

/* Copies n floats with vector moves: a short row (a plane's row into a padded buffer) that
 * memcpy would inline as `rep movs`, whose start-up cost is most of a 100-float copy (a third of
 * a 3x3 max pool's time). */
static inline void copy_floats(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) store16(dst + i, load16(src + i));
    if (i < n) store16_n(dst + i, load16_n(src + i, n - i), n - i);
}

/* The even (odd) lanes of the 32 lanes a, b: 16 consecutive elements of a stride-2 run. */
static inline v16 evens(v16 a, v16 b) { return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30); }
static inline v16 odds(v16 a, v16 b) { return __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31); }

/* dst[j] = src[2 * j] for j < n: a stride-2 row split into its even phase (odd: pass src + 1).
 * Reads src[0 .. 2 * (n - 1)] only, so a row at the end of a tensor is safe: a whole pair of
 * vectors reads up to src[2 * j + 31], within the row while j + 16 < n. */
static inline void copy_floats_stride2(float *dst, const float *src, int64_t n) {
    int64_t j = 0;
    for (; j + 16 < n; j += 16) store16(dst + j, evens(load16(src + 2 * j), load16(src + 2 * j + 16)));
    /* The rest (at most 16 outputs) from masked loads of the 2 * (n - j) - 1 floats it reads. */
    if (j < n) {
        int64_t r = 2 * (n - j) - 1;
        v16 a = load16_n(src + 2 * j, r < 16 ? r : 16), b = r > 16 ? load16_n(src + 2 * j + 16, r - 16) : (v16){0};
        store16_n(dst + j, evens(a, b), n - j);
    }
}

/* All 16 lanes x (an initialiser, not x + 0, which costs an add: -0.0 + 0 is +0). */
static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
/* Lanes l .. l + 15 (0 <= l < 32) of the 32 lanes lo, hi; lanes past 31 are unspecified. A
 * register permute where a store and a reload at an offset would stall on store forwarding. */
static inline v16 lanes_from(v16 lo, v16 hi, int64_t l) {
#if defined(__AVX512F__)
    __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int)l), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return (v16)_mm512_permutex2var_ps((__m512)lo, at, (__m512)hi);
#else
    float t[48];
    store16(t, lo);
    store16(t + 16, hi);
    return load16(t + l);
#endif
}

/* b where `m` is set, else a (C has no vector ?:). */
static inline v16 select_where(v16i m, v16 b, v16 a) { return (v16)((m & (v16i)b) | (~m & (v16i)a)); }

/* Rows r[0..16] of a 16 x 16 block, transposed in place: four rounds of interleaves (a perfect
 * shuffle: after log2(16) rounds row j holds column j). */
static inline __attribute__((always_inline)) void transpose16(v16 *r) {
#pragma GCC unroll 4
    for (int round = 0; round < 4; round++) {
        v16 t[16];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            t[2 * i] = __builtin_shufflevector(r[i], r[i + 8], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            t[2 * i + 1] = __builtin_shufflevector(r[i], r[i + 8], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) r[i] = t[i];
    }
}

/* The larger and smaller of a and b per lane; where either is NaN, b (as vmaxps has it). One
 * instruction with AVX-512. */
static inline v16 vmax(v16 a, v16 b) {
#if defined(__AVX512F__)
    return (v16)_mm512_max_ps((__m512)a, (__m512)b);
#else
    return select_where(a > b, a, b);
#endif
}

static inline v16 vmin(v16 a, v16 b) {
#if defined(__AVX512F__)
    return (v16)_mm512_min_ps((__m512)a, (__m512)b);
#else
    return select_where(a < b, a, b);
#endif
}

/* The 16 lanes halved, quartered... into lane 0: sum, max (NaN not promised) and bitwise or. */
#define KILN_FOLD(v, op)                                                                                          \
    do {                                                                                                          \
        v = op(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));          \
        v = op(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));          \
        v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));          \
        v = op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));          \
    } while (0)
static inline v16 kiln_add(v16 a, v16 b) { return a + b; }
static inline v16i kiln_or(v16i a, v16i b) { return a | b; }
static inline float hsum(v16 v) {
    KILN_FOLD(v, kiln_add);
    return v[0];
}
static inline float hmax(v16 v) {
    KILN_FOLD(v, vmax);
    return v[0];
}
static inline float hmin(v16 v) {
    KILN_FOLD(v, vmin);
    return v[0];
}
static inline int hany(v16i v) {
    KILN_FOLD(v, kiln_or);
    return v[0] != 0;
}

/* e^x on 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes's expf polynomial, 2^n put
 * into the exponent bits. Inputs are clamped to [-87, 88], so results stay normal floats; NaN
 * stays NaN. */
/* 1 / d to about 23 bits: AVX-512's 14-bit estimate and a Newton step (a division is about
 * eight times the time: the SiLU epilogue's cost); a division elsewhere. NaN stays NaN. */
static inline v16 vrecip(v16 d) {
#if defined(__AVX512F__)
    v16 r = (v16)_mm512_rcp14_ps((__m512)d);
    return r * (splat(2.0f) - d * r);
#else
    return splat(1.0f) / d;
#endif
}

static inline v16 vexp(v16 x) {
    const v16 lo = splat(-87.0f), hi = splat(88.0f);
    x = vmin(hi, vmax(lo, x)); /* (a NaN x stays NaN) */
    const v16 magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    v16 t = x * splat(1.44269504088896341f) + magic;
    v16 n = t - magic;
    v16 r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    v16 p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * (r * r) + r + splat(1.0f);
    v16i e = ((v16i)t - (v16i)magic + 127) << 23;
    return p * (v16)e;
}

#endif
