/* kiln's integer convolution (a QConv node; the compiler's backend/cpu/ukernel/qconv.rs plans it
 * and packs its weights): 2-D, one group, NCHW u8 input, s8 weights, int32 sums, the result
 * requantised to u8 or s8 as it is stored.
 *
 * - s8 input is read as u8 with its top bit flipped (x + 128; `x_flip` 0x80), its zero point
 *   likewise, which leaves x - x_zero as it was.
 * - The input is copied once per work unit into padded planes split by stride phase (as the f32
 *   direct convolution in conv.c does), with 4 channels interleaved at each position: plane
 *   (channel group g, phase) holds, per position, the 4 bytes of channels 4g .. 4g + 3 as one
 *   32-bit word. Padding holds the input's zero point. Positions are taken flat (oh * Wq + ow),
 *   so that for one tap and one channel group, 16 consecutive positions are 16 consecutive words:
 *   one 64-byte vector of u8, 4 channels a lane.
 * - The weights come packed per strip of MR output channels as [K/4][MR] words, each the 4 s8
 *   weights of one channel group at one tap. A register tile is MR rows x 32 positions of int32;
 *   each step broadcasts a row's word and multiplies it into two vectors of positions:
 *   `vpdpbusd` (u8 x s8, the four products summed into int32) where the CPU has AVX-512 VNNI, the
 *   same products widened one byte lane at a time elsewhere. Both are exact.
 * - After the words: per output channel the int32 bias less x_zero * (the channel's weight sum),
 *   so Σ (x - x_zero) w needs no work in the loop, then the f32 multiplier
 *   x_scale * w_scale / y_scale.
 * - The result: (acc + bias) * multiplier, saturated, rounded half to even (adding and taking
 *   away 1.5 * 2^23), plus the result's zero point, stored as bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_MR
#define KILN_MR 8
#endif
#define MR KILN_MR

#include "simd.h"
#include "depthwise.h"
#include "workspace.h"
#include "amx.h"

typedef int32_t v16iu __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

static inline v16i load16i(const int32_t *p) { return *(const v16iu *)p; }

/* The register tile: c0[r], c1[r] (rows r < MR, positions 0-15 and 16-31) = Σ_k dot4(the 32
 * words at xb + offs[k], a[k * MR + r]), the four u8 x s8 products of each word summed into
 * int32. Two forms: widened one byte lane at a time (exact anywhere), and vpdpbusd. Macros, so
 * that the tile is inlined into a function built for VNNI (the object is built for x86-64-v4,
 * which does not include it) and the sums stay in registers for the epilogue. */
#define QTILE_EXACT(K4, a, xb, offs, c0, c1)                                                  \
    do {                                                                                      \
        const int32_t *a_ = (a);                                                              \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) c0[r] = c1[r] = (v16i){0};      \
        for (int64_t k = 0; k < (K4); k++) {                                                  \
            const int32_t *b = (xb) + (offs)[k];                                              \
            v16i b0 = load16i(b), b1 = load16i(b + 16);                                       \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                             \
                v16i u0 = (b0 >> (8 * j)) & 0xff, u1 = (b1 >> (8 * j)) & 0xff;                \
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                       \
                    int32_t wv = (int32_t)(int8_t)(a_[r] >> (8 * j));                         \
                    c0[r] += u0 * wv;                                                         \
                    c1[r] += u1 * wv;                                                         \
                }                                                                             \
            }                                                                                 \
            a_ += MR;                                                                         \
        }                                                                                     \
    } while (0)

#define QTILE_VNNI(K4, a, xb, offs, c0, c1)                                                   \
    do {                                                                                      \
        const int32_t *a_ = (a);                                                              \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) c0[r] = c1[r] = (v16i){0};      \
        for (int64_t k = 0; k < (K4); k++) {                                                  \
            const int32_t *b = (xb) + (offs)[k];                                              \
            __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);              \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                           \
                __m512i w = _mm512_set1_epi32(a_[r]);                                         \
                c0[r] = (v16i)_mm512_dpbusd_epi32((__m512i)c0[r], b0, w);                     \
                c1[r] = (v16i)_mm512_dpbusd_epi32((__m512i)c1[r], b1, w);                     \
            }                                                                                 \
            a_ += MR;                                                                         \
        }                                                                                     \
    } while (0)

/* 16 int32 sums requantised: (acc + bias) * mult, clamped to [lo, hi] less the zero point,
 * rounded half to even, plus the zero point. */
static inline v16i requantise_v(v16i acc, v16i bias, v16 mult, float lo, float hi, int32_t zero) {
    v16 f = __builtin_convertvector(acc + bias, v16) * mult;
    f = vmin(vmax(f, splat(lo)), splat(hi));
#if defined(__AVX512F__)
    /* (The default rounding mode, to nearest even.) */
    return (v16i)_mm512_cvtps_epi32((__m512)f) + zero;
#else
    const v16 magic = splat(12582912.0f);
    v16 r = (f + magic) - magic;
    return __builtin_convertvector(r, v16i) + zero;
#endif
}

static inline v16i requantise(v16i acc, int32_t bias, float mult, float lo, float hi, int32_t zero) {
    return requantise_v(acc, (v16i){0} + bias, splat(mult), lo, hi, zero);
}


/* The strips of flat positions times the strips of output channels, each tile requantised and
 * stored by runs as it leaves the registers (see qconv_rows). */
#define QCONV_ARGS                                                                                                           \
    int64_t flat, int64_t Wq, int64_t oh0, int64_t OW, int64_t N, int64_t m0, int64_t m1, const int32_t *wp, int64_t K4,     \
        const int32_t *xp, const int64_t *offs, const int32_t *bias, const float *mult, float lo, float hi, int64_t y_zero, \
        uint8_t *y
/* Row r of a tile requantised and stored by runs: run q is lanes run_l .. run_l + run_n of the
 * 32, stored at y_row + run_o. */
static inline __attribute__((always_inline)) void store_row(v16i c0, v16i c1, int32_t bias, float mult, float lo, float hi,
                                                            int32_t zero, uint8_t *yr, int64_t runs, const int64_t *run_l,
                                                            const int64_t *run_n, const int64_t *run_o) {
    v16i q0 = requantise(c0, bias, mult, lo, hi, zero), q1 = requantise(c1, bias, mult, lo, hi, zero);
#if defined(__AVX512BW__)
    /* The 32 bytes in one register (the values are in range: truncating is exact), each run
     * stored under a mask. */
    __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8((__m512i)q0)), _mm512_cvtepi32_epi8((__m512i)q1), 1);
    for (int64_t q = 0; q < runs; q++) {
        __mmask32 keep = (__mmask32)(((1ull << run_n[q]) - 1) << run_l[q]);
        _mm256_mask_storeu_epi8(yr + run_o[q] - run_l[q], keep, bytes);
    }
#else
    uint8_t bytes[32];
    for (int l = 0; l < 16; l++) {
        bytes[l] = (uint8_t)q0[l];
        bytes[16 + l] = (uint8_t)q1[l];
    }
    for (int64_t q = 0; q < runs; q++) memcpy(yr + run_o[q], bytes + run_l[q], (size_t)run_n[q]);
#endif
}

#define QCONV_STRIPS(TILE)                                                                                   \
    for (int64_t p0 = 0; p0 < flat; p0 += 32) {                                                              \
        /* The strip's valid positions as runs: (lane, count, output index). */                              \
        int64_t run_l[33], run_n[33], run_o[33];                                                             \
        int64_t runs = strip_runs(p0, 32, flat, Wq, OW, oh0, run_l, run_n, run_o);                           \
        for (int64_t i = m0; i < m1; i += MR) {                                                              \
            v16i c0[MR], c1[MR];                                                                             \
            TILE(K4, wp + (i / MR) * K4 * MR, xp + p0, offs, c0, c1);                                        \
            int64_t mr = m1 - i < MR ? m1 - i : MR;                                                          \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) if (r < mr)                              \
                store_row(c0[r], c1[r], bias[i + r], mult[i + r], lo, hi, (int32_t)y_zero, y + (i + r) * N, \
                          runs, run_l, run_n, run_o);                                                        \
        }                                                                                                    \
    }

static void qconv_strips_exact(QCONV_ARGS) { QCONV_STRIPS(QTILE_EXACT); }

#if defined(__AVX512F__)
__attribute__((target("avx512vnni"))) static void qconv_strips_vnni(QCONV_ARGS) { QCONV_STRIPS(QTILE_VNNI); }

/* The strips on AMX tiles (the planes as for the vectors, but the channel groups padded to gb *
 * kb, the weights packed per 16 channels, tap and step of kb groups: qconv.rs's pack_amx). A
 * step: tiles 6 and 7 take kb channel groups' planes (a tile row each, `gstride` words apart)
 * at 16 positions each, 4 and 5 two 16-channel blocks' weights for them, and tdpbsud (s8
 * weights x u8 input, four products a word summed into int32) adds their products into the
 * four accumulator tiles 0-3: 32 channels x 32 positions. The sums go through the stack to
 * store_row, as the vector tile's registers do. `tapoff[t]`: tap t's offset in a plane. */
__attribute__((target("amx-tile,amx-int8"))) static void qconv_strips_amx(int64_t flat, int64_t Wq, int64_t oh0, int64_t OW, int64_t N,
                                                                         int64_t m0, int64_t m1, const int32_t *wp, int64_t taps,
                                                                         int64_t kb, int64_t gb, int64_t gstride, const int64_t *tapoff,
                                                                         const int32_t *xp, const int32_t *bias, const float *mult,
                                                                         float lo, float hi, int64_t y_zero, uint8_t *y) {
    TileConfig cfg = amx_layout(4 * kb, kb);
    _tile_loadconfig(&cfg);
    int32_t sums[32 * 32] __attribute__((aligned(64)));
    int64_t atile = 16 * kb, ablock = taps * gb * atile;
    for (int64_t p0 = 0; p0 < flat; p0 += 32) {
        int64_t run_l[33], run_n[33], run_o[33];
        int64_t runs = strip_runs(p0, 32, flat, Wq, OW, oh0, run_l, run_n, run_o);
        for (int64_t i = m0; i < m1; i += 32) {
            const int32_t *a0 = wp + (i / 16) * ablock, *a1 = a0 + ablock;
            AMX_ZERO_ACCUMULATORS();
            for (int64_t t = 0; t < taps; t++) {
                for (int64_t g = 0; g < gb; g++) {
                    const int32_t *b = xp + g * kb * gstride + tapoff[t] + p0;
                    int64_t at = (t * gb + g) * atile;
                    AMX_STEP_2X2(_tile_dpbsud, a0 + at, a1 + at, kb * 4, b, b + 16, gstride * 4);
                }
            }
            AMX_STORE_2X2(sums);
            int64_t mr = m1 - i < 32 ? m1 - i : 32;
            for (int64_t r = 0; r < mr; r++)
                store_row(load16i(sums + r * 32), load16i(sums + r * 32 + 16), bias[i + r], mult[i + r], lo, hi, (int32_t)y_zero,
                          y + (i + r) * N, runs, run_l, run_n, run_o);
        }
    }
    _tile_release();
}
#endif

/* n words of channel group g (channels 4g .. 4g + 3): word j holds their bytes at x + ch *
 * channel_stride + j * step, channel 4g lowest, top bits flipped for s8; a channel past C reads
 * `pad` (the input's zero point as read). Four whole channels read one after another take the
 * loop that vectorises. */
static inline void interleave4(uint32_t *dst, const uint8_t *x, int64_t C, int64_t g, int64_t channel_stride, int64_t step,
                               int64_t n, uint8_t pad, uint32_t flip) {
    const uint8_t *src[4];
    int64_t steps[4];
    for (int j4 = 0; j4 < 4; j4++) {
        int64_t ch = g * 4 + j4;
        src[j4] = ch < C ? x + ch * channel_stride : &pad;
        steps[j4] = ch < C ? step : 0;
    }
    if (g * 4 + 3 < C && step == 1) {
        const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
        for (int64_t j = 0; j < n; j++)
            dst[j] = ((uint32_t)s0[j] | (uint32_t)s1[j] << 8 | (uint32_t)s2[j] << 16 | (uint32_t)s3[j] << 24) ^ flip;
    } else {
        for (int64_t j = 0; j < n; j++)
            dst[j] = ((uint32_t)src[0][j * steps[0]] | (uint32_t)src[1][j * steps[1]] << 8 | (uint32_t)src[2][j * steps[2]] << 16 |
                      (uint32_t)src[3][j * steps[3]] << 24) ^
                     flip;
    }
}

/* Output rows oh0 .. oh1 and channels m0 .. m1 of one image. */
static void qconv_rows(const uint8_t *x, const int32_t *wp, uint8_t *y, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH,
                       int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW,
                       int64_t x_zero, int64_t x_flip, int64_t y_zero, int64_t y_lo, int64_t y_hi, int64_t vnni, int64_t oh0, int64_t oh1, int64_t m0,
                       int64_t m1) {
    int64_t Wq = OW + (KW - 1) * DW / SW;
    int64_t rows = oh1 - oh0 + (KH - 1) * DH / SH, plane = rows * Wq;
    int64_t C4 = (C + 3) / 4, taps = KH * KW, phases = SH * SW;
    /* AMX (isa 2) pads the channel groups to whole steps of kb, and the channels to 32. */
    int64_t kb = C4 < 16 ? C4 : 16, gb = (C4 + kb - 1) / kb;
    if (vnni == 2) C4 = kb * gb;
    int64_t K4 = C4 * taps;
    int64_t strips = vnni == 2 ? (M + 31) / 32 * 32 / MR : (M + MR - 1) / MR;
    const int32_t *bias = wp + strips * K4 * MR;
    const float *mult = (const float *)(bias + strips * MR);
    /* The last strip may read 32 words past the last position of the last plane. */
    size_t total = (size_t)(C4 * phases * plane + 64);
    int32_t *xp = (int32_t *)scratch(0, total);
    int64_t *offs = (int64_t *)scratch(1, (size_t)(2 * K4));
    if (!xp || !offs) return; /* (recorded by scratch) */
    uint32_t fill = (uint32_t)(x_zero & 0xff) * 0x01010101u, flip = (uint32_t)(x_flip & 0xff) * 0x01010101u;
    for (size_t i = 0; i < total; i++) xp[i] = (int32_t)fill;
    /* The phases some tap reads (a 1x1 stride-2 convolution reads one of its four). */
    char used[64] = {0};
    int every = phases > 64;
    for (int64_t t = 0; t < taps && !every; t++) used[((t / KW) * DH % SH) * SW + (t % KW) * DW % SW] = 1;
    for (int64_t g = 0; g < C4; g++) {
        for (int64_t a = 0; a < SH; a++) {
            for (int64_t b = 0; b < SW; b++) {
                if (!every && !used[a * SW + b]) continue;
                uint32_t *ph = (uint32_t *)xp + ((g * SH + a) * SW + b) * plane;
                int64_t jlo = PW - b <= 0 ? 0 : (PW - b + SW - 1) / SW;
                int64_t jhi = W - 1 + PW - b < 0 ? 0 : (W - 1 + PW - b) / SW + 1;
                if (jhi > Wq) jhi = Wq;
                for (int64_t i = 0; i < rows; i++) {
                    int64_t ih = (oh0 + i) * SH + a - PH;
                    if (ih < 0 || ih >= H || jlo >= jhi) continue;
                    interleave4(ph + i * Wq + jlo, x + ih * W + jlo * SW + b - PW, C, g, H * W, SW, jhi - jlo,
                                (uint8_t)(x_zero ^ x_flip), flip);
                }
            }
        }
    }
    int64_t N = OH * OW;
    int64_t flat = (oh1 - oh0 - 1) * Wq + OW;
    float lo = (float)(y_lo - y_zero), hi = (float)(y_hi - y_zero);
#if defined(__AVX512F__)
    if (vnni == 2) {
        /* A tap's offset within a channel group's planes; the groups are phases * plane apart. */
        for (int64_t t = 0; t < taps; t++) {
            int64_t dy = (t / KW) * DH, dx = (t % KW) * DW;
            offs[t] = ((dy % SH) * SW + dx % SW) * plane + dy / SH * Wq + dx / SW;
        }
        qconv_strips_amx(flat, Wq, oh0, OW, N, m0, m1, wp, taps, kb, gb, phases * plane, offs, xp, bias, mult, lo, hi, y_zero, y);
        return;
    }
#endif
    for (int64_t k = 0; k < K4; k++) {
        int64_t g = k / taps, t = k % taps;
        int64_t dy = (t / KW) * DH, dx = (t % KW) * DW;
        offs[k] = ((g * SH + dy % SH) * SW + dx % SW) * plane + dy / SH * Wq + dx / SW;
    }
#if defined(__AVX512F__)
    if (vnni) {
        qconv_strips_vnni(flat, Wq, oh0, OW, N, m0, m1, wp, K4, xp, offs, bias, mult, lo, hi, y_zero, y);
        return;
    }
#endif
    qconv_strips_exact(flat, Wq, oh0, OW, N, m0, m1, wp, K4, xp, offs, bias, mult, lo, hi, y_zero, y);
}

/* A pointwise convolution (1x1, stride 1, no padding) of positions p0 .. p1 and channels m0 ..
 * m1 of one image: positions are flat, so each group of 4 channels is copied as one run of
 * p1 - p0 words (a loop that vectorises, where a 7x7 plane's rows were runs of 7), and the
 * strips store at their position. */
static void qconv_pointwise(const uint8_t *x, const int32_t *wp, uint8_t *y, int64_t C, int64_t P, int64_t M, int64_t x_zero,
                            int64_t x_flip, int64_t y_zero, int64_t y_lo, int64_t y_hi, int64_t vnni, int64_t p0, int64_t p1,
                            int64_t m0, int64_t m1) {
    int64_t n = p1 - p0, K4 = (C + 3) / 4;
    int64_t kb = K4 < 16 ? K4 : 16, gb = (K4 + kb - 1) / kb;
    if (vnni == 2) K4 = kb * gb; /* (AMX: the groups padded to whole steps, the channels to 32) */
    int64_t strips = vnni == 2 ? (M + 31) / 32 * 32 / MR : (M + MR - 1) / MR;
    const int32_t *bias = wp + strips * K4 * MR;
    const float *mult = (const float *)(bias + strips * MR);
    /* The last strip may read 32 words past the last group's run. */
    int32_t *xp = (int32_t *)scratch(0, (size_t)(K4 * n + 64));
    int64_t *offs = (int64_t *)scratch(1, (size_t)(2 * K4));
    if (!xp || !offs) return; /* (recorded by scratch) */
    uint32_t flip = (uint32_t)(x_flip & 0xff) * 0x01010101u;
    for (int64_t g = 0; g < K4; g++) {
        interleave4((uint32_t *)xp + g * n, x + p0, C, g, P, 1, n, (uint8_t)(x_zero ^ x_flip), flip);
        offs[g] = g * n;
    }
    for (size_t i = (size_t)(K4 * n); i < (size_t)(K4 * n + 64); i++) xp[i] = 0;
    float lo = (float)(y_lo - y_zero), hi = (float)(y_hi - y_zero);
    /* One "row" of n positions: flat = Wq = OW = n, stored from y + p0 with channel stride P. */
#if defined(__AVX512F__)
    if (vnni == 2) {
        offs[0] = 0;
        qconv_strips_amx(n, n, 0, n, P, m0, m1, wp, 1, kb, gb, n, offs, xp, bias, mult, lo, hi, y_zero, y + p0);
        return;
    }
    if (vnni) {
        qconv_strips_vnni(n, n, 0, n, P, m0, m1, wp, K4, xp, offs, bias, mult, lo, hi, y_zero, y + p0);
        return;
    }
#endif
    qconv_strips_exact(n, n, 0, n, P, m0, m1, wp, K4, xp, offs, bias, mult, lo, hi, y_zero, y + p0);
}

/* Work units: images x chunks of output rows (split_n; of 32-position strips for a pointwise
 * convolution) or of output channels (whole strips). */
void kiln_uk_qconv2d(int64_t x_, int64_t wp_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW, int64_t SH,
                     int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW, int64_t x_zero, int64_t x_flip, int64_t y_zero,
                     int64_t y_lo, int64_t y_hi, int64_t vnni, int64_t chunks, int64_t split_n, int64_t wg_begin, int64_t wg_end) {
    const uint8_t *x = (const uint8_t *)(intptr_t)x_;
    const int32_t *wp = (const int32_t *)(intptr_t)wp_;
    uint8_t *y = (uint8_t *)(intptr_t)y_;
    int pointwise = KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0 && OH == H && OW == W;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks;
        if (pointwise) {
            int64_t P = H * W, p0 = 0, p1 = P, m0 = 0, m1 = M;
            if (split_n) chunk_range(P, 32, chunks, q, &p0, &p1);
            else chunk_range(M, vnni == 2 ? 32 : MR, chunks, q, &m0, &m1);
            if (p0 < p1 && m0 < m1)
                qconv_pointwise(x + img * C * P, wp, y + img * M * P, C, P, M, x_zero, x_flip, y_zero, y_lo, y_hi, vnni, p0, p1, m0, m1);
            continue;
        }
        int64_t oh0 = 0, oh1 = OH, m0 = 0, m1 = M;
        if (split_n) chunk_range(OH, 1, chunks, q, &oh0, &oh1);
        else chunk_range(M, vnni == 2 ? 32 : MR, chunks, q, &m0, &m1);
        if (oh0 < oh1 && m0 < m1)
            qconv_rows(x + img * C * H * W, wp, y + img * M * OH * OW, C, H, W, M, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, x_zero, x_flip, y_zero,
                       y_lo, y_hi, vnni, oh0, oh1, m0, m1);
    }
}

typedef uint8_t b16 __attribute__((vector_size(16)));
typedef uint8_t b32 __attribute__((vector_size(32)));
typedef uint8_t b32u __attribute__((vector_size(32), aligned(1)));
static inline b32 load32_u8(const uint8_t *p) { return *(const b32u *)p; }
static inline b16 evens_u8(b32 v) {
    return __builtin_shufflevector(v, v, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
}

/* Max pooling of u8 planes (a quantized model's; padding reads 0, the type's least value, so it
 * never wins). Per output row: the maxima of the window's input rows, on vectors, into a row
 * buffer with PW zero bytes before it, then per output the taps along the row. Same arguments as
 * kiln_uk_pool2d (its kind, epilogue and end pads unused). Work units: images x channel chunks. */
void kiln_uk_maxpool_u8(int64_t x_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                        int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t PH_end, int64_t PW_end, int64_t OH, int64_t OW,
                        int64_t kind, int64_t act, float lo, float hi, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    (void)PH_end, (void)kind, (void)act, (void)lo, (void)hi;
    const uint8_t *x = (const uint8_t *)(intptr_t)x_;
    uint8_t *y = (uint8_t *)(intptr_t)y_;
    /* Output j reads buf[j * SW + kw * DW], up to (OW - 1) * SW + (KW - 1) * DW. */
    int64_t len = (OW - 1) * SW + (KW - 1) * DW + 1;
    if (len < PW + W) len = PW + W;
    /* (64 zero bytes past the end for the vector loads of the last outputs.) */
    uint8_t *buf = (uint8_t *)scratch(0, (size_t)(len + 64 + 3) / 4);
    if (!buf) return; /* (recorded by scratch) */
    memset(buf, 0, (size_t)len + 64);
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks, c0, c1;
        chunk_range(C, 1, chunks, q, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            const uint8_t *plane = x + (img * C + c) * H * W;
            uint8_t *yc = y + (img * C + c) * OH * OW;
            for (int64_t oh = 0; oh < OH; oh++) {
                uint8_t *row = buf + PW;
                memset(row, 0, (size_t)W);
                for (int64_t kh = 0; kh < KH; kh++) {
                    int64_t ih = oh * SH - PH + kh * DH;
                    if (ih < 0 || ih >= H) continue;
                    const uint8_t *src = plane + ih * W;
                    for (int64_t j = 0; j < W; j++) row[j] = src[j] > row[j] ? src[j] : row[j];
                }
                uint8_t *dst = yc + oh * OW;
                int64_t j = 0;
                if (SW == 2 && DW == 1) {
                    /* 16 outputs at a time: the even bytes of 32 from each tap's start. */
                    for (; j + 16 <= OW; j += 16) {
                        const uint8_t *p = buf + 2 * j;
                        b16 m = evens_u8(load32_u8(p));
                        for (int64_t kw = 1; kw < KW; kw++) {
                            b16 t = evens_u8(load32_u8(p + kw));
                            b16 more = (b16)(m < t);
                            m = (t & more) | (m & ~more);
                        }
                        memcpy(dst + j, &m, 16);
                    }
                }
                for (; j < OW; j++) {
                    const uint8_t *p = buf + j * SW;
                    uint8_t m = 0;
                    for (int64_t kw = 0; kw < KW; kw++) m = p[kw * DW] > m ? p[kw * DW] : m;
                    dst[j] = m;
                }
            }
        }
    }
}

/* The first n (1..16) of 16 int32 values in range, stored as bytes. */
static inline void store_bytes(uint8_t *dst, v16i q, int64_t n) {
#if defined(__AVX512BW__)
    _mm_mask_storeu_epi8(dst, (__mmask16)((1u << n) - 1), _mm512_cvtepi32_epi8((__m512i)q));
#else
    uint8_t bytes[16];
    for (int b = 0; b < 16; b++) bytes[b] = (uint8_t)q[b];
    memcpy(dst, bytes, (size_t)n);
#endif
}

/* n (1..16) bytes as floats less the zero point (s8 read as u8 with the top bit flipped); the
 * lanes past n are not positions anyone stores. */
static inline v16 bytes_less_zero(const uint8_t *p, int64_t n, int32_t flip, int32_t zero) {
#if defined(__AVX512BW__)
    v16i v = (v16i)_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << n) - 1), p));
#else
    v16i v = {0};
    for (int64_t l = 0; l < n; l++) v[l] = p[l];
#endif
    return __builtin_convertvector((v ^ flip) - zero, v16);
}

/* A depthwise integer convolution (one input and one output channel a group), 16 channels a
 * vector. Each block of 16 channels' planes, less the input's zero point, goes as floats into a
 * zero-padded channel-blocked scratch plane through 16x16 register transposes (so padding counts
 * as the zero point and needs no correction); every output then takes one FMA a tap on its 16
 * channels, 4 outputs at a time with the taps in registers (depthwise.h, as the float kernel
 * does); the sums come back through transposes, requantised with each channel's raw int32 bias
 * and multiplier and stored as bytes. The sums are integers below 2^24 in magnitude (255 * 128 *
 * at most 64 taps), so float arithmetic is exact. Vectorised along rows instead, a 7x7 plane used
 * 7 of 16 lanes and stride 2 discarded half of each load.
 * The packed constant: the taps as floats [C/16][KH*KW][16] (the last block padded with zeros),
 * the bias [C], the multipliers [C]. Work units: images x chunks of 16 channels. Same arguments
 * as kiln_uk_qconv2d. */
void kiln_uk_qdepthwise(int64_t x_, int64_t wp_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                        int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW, int64_t x_zero, int64_t x_flip,
                        int64_t y_zero, int64_t y_lo, int64_t y_hi, int64_t vnni, int64_t chunks, int64_t split_n, int64_t wg_begin,
                        int64_t wg_end) {
    (void)M, (void)vnni, (void)split_n;
    const uint8_t *x = (const uint8_t *)(intptr_t)x_;
    const float *wf = (const float *)(intptr_t)wp_;
    int64_t T = KH * KW, P = H * W, Q = OH * OW;
    const int32_t *bias = (const int32_t *)(wf + (C + 15) / 16 * T * 16);
    const float *mult = (const float *)(bias + C);
    uint8_t *y = (uint8_t *)(intptr_t)y_;
    int64_t Hp, Wp;
    dw_plane_size(H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, &Hp, &Wp);
    float *xb = scratch(0, (size_t)(Hp * Wp * 16));
    float *yb = scratch(1, (size_t)(Q * 16));
    if (T > 64) { /* planned only up to 64 taps: a bug, not input */
        KILN_INTERNAL_FAILURE();
        return;
    }
    if (!xb || !yb) return; /* (recorded by scratch) */
    dw_clear_band(xb, 0, Hp, Wp, W, PH, PW, 0, H);
    float lo = (float)(y_lo - y_zero), hi = (float)(y_hi - y_zero);
    int32_t flip = (int32_t)x_flip, zero = (int32_t)x_zero;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t img = u / chunks, q = u % chunks, c0, c1;
        chunk_range(C, 16, chunks, q, &c0, &c1);
        for (int64_t cb = c0 / 16; cb * 16 < c1; cb++) {
            int64_t nc = c1 - cb * 16 < 16 ? c1 - cb * 16 : 16;
            const uint8_t *xc = x + (img * C + cb * 16) * P;
            for (int64_t p = 0; p < P; p += 16) {
                int64_t n = P - p < 16 ? P - p : 16;
                v16 r[16];
#pragma GCC unroll 16
                for (int l = 0; l < 16; l++) r[l] = l < nc ? bytes_less_zero(xc + l * P + p, n, flip, zero) : splat(0.0f);
                transpose16(r);
                dw_scatter(xb, r, p, n, W, PH, PW, Wp);
            }
            v16 wv[64];
            for (int64_t t = 0; t < T; t++) wv[t] = load16(wf + (cb * T + t) * 16);
            const v16 none = splat(0.0f);
            /* The usual windows get copies with their sizes constant: the taps stay in registers
             * and the tap loops unroll. */
            if (KH == 3 && KW == 3) dw_padded_plane(xb, yb, none, wv, 3, 3, SH, SW, DH, DW, Wp, OH, OW);
            else if (KH == 5 && KW == 5) dw_padded_plane(xb, yb, none, wv, 5, 5, SH, SW, DH, DW, Wp, OH, OW);
            else dw_padded_plane(xb, yb, none, wv, KH, KW, SH, SW, DH, DW, Wp, OH, OW);
            uint8_t *yc = y + (img * C + cb * 16) * Q;
            for (int64_t q0 = 0; q0 < Q; q0 += 16) {
                int64_t n = Q - q0 < 16 ? Q - q0 : 16;
                v16 r[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++) r[j] = j < n ? load16(yb + (q0 + j) * 16) : splat(0.0f);
                transpose16(r);
                for (int64_t l = 0; l < nc; l++) {
                    int64_t c = cb * 16 + l;
                    v16i qv = requantise(__builtin_convertvector(r[l], v16i), bias[c], mult[c], lo, hi, (int32_t)y_zero);
                    store_bytes(yc + l * Q + q0, qv, n);
                }
            }
        }
    }
}

/* kiln's integer GEMM: a QConv of N images of K channels at one position with a 1x1 window, which
 * is how the integer pass writes a quantized Gemm or MatMul (rows reshaped to [N, K, 1, 1]):
 * y[n, m] = the requantised Σ_k (a[n, k] - a_zero) w[m, k] + bias[m]. A row's bytes are its K
 * values in order, so 4 consecutive k are one 32-bit word as they lie, with no copy: each is
 * broadcast and multiplied into vectors of 16 output channels, whose weights are packed per strip
 * of 64 channels as [K/4][64] words (4 k each, s8; channels past M and k past K zero), so one k
 * step reads 256 contiguous bytes. A tile is R rows (up to 4) x 64 channels: 16 int32 vectors.
 * After the words: per channel (padded to whole strips) the int32 bias less a_zero * Σ w, then
 * the f32 multiplier, as for the convolution. Work units: chunks of rows (split_n) or of strips. */
#define QG_NV 4
#define QG_STRIP (16 * QG_NV)

static inline int32_t whole_word(const uint8_t *p, uint32_t flip) {
    uint32_t w;
    memcpy(&w, p, 4);
    return (int32_t)(w ^ flip);
}

/* A row's last, partial word (K not a multiple of 4): the bytes past K read as 0, which the zero
 * weights past K ignore; top bits flipped for s8. */
static inline int32_t tail_word(const uint8_t *row, int64_t K, int64_t k4, uint32_t flip) {
    uint32_t w = 0;
    memcpy(&w, row + 4 * k4, (size_t)(K - 4 * k4));
    return (int32_t)(w ^ flip);
}

#define QG_TILE(R, DOT)                                                                                              \
    do {                                                                                                             \
        _Pragma("GCC unroll 4") for (int r = 0; r < (R); r++) _Pragma("GCC unroll 4") for (int v = 0; v < QG_NV; v++) \
            acc[r][v] = (v16i){0};                                                                                   \
        for (int64_t k4 = 0; k4 < K4; k4++) {                                                                        \
            const int32_t *b = bp + k4 * QG_STRIP;                                                                   \
            v16i bv[QG_NV];                                                                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < QG_NV; v++) bv[v] = load16i(b + 16 * v);                     \
            _Pragma("GCC unroll 4") for (int r = 0; r < (R); r++) {                                                  \
                int32_t aw = k4 < K4full ? whole_word(rows[r] + 4 * k4, flip) : tail_word(rows[r], K, k4, flip);     \
                _Pragma("GCC unroll 4") for (int v = 0; v < QG_NV; v++) DOT(acc[r][v], aw, bv[v]);                   \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

/* acc += the four u8 (word a) x s8 (each lane of b) products, summed. */
#define QG_DOT_EXACT(acc, a, b)                                                    \
    do {                                                                           \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                      \
            int32_t aj = (int32_t)(((uint32_t)(a) >> (8 * j)) & 0xff);             \
            (acc) += ((v16i)((v16u32)(b) << (24 - 8 * j)) >> 24) * aj;             \
        }                                                                          \
    } while (0)
#define QG_DOT_VNNI(acc, a, b) ((acc) = (v16i)_mm512_dpbusd_epi32((__m512i)(acc), _mm512_set1_epi32(a), (__m512i)(b)))

#define QGEMM_ARGS                                                                                                      \
    const uint8_t *a, const int32_t *wp, uint8_t *y, int64_t K, int64_t M, int64_t n0, int64_t n1, int64_t s0, int64_t s1, \
        uint32_t flip, float lo, float hi, int32_t zero

/* Rows n0 .. n1 by strips s0 .. s1, each tile requantised and stored as it leaves the registers. */
#define QGEMM_BODY(DOT)                                                                                          \
    int64_t K4 = (K + 3) / 4, K4full = K / 4, strips = (M + QG_STRIP - 1) / QG_STRIP;                            \
    const int32_t *bias = wp + strips * K4 * QG_STRIP;                                                           \
    const float *mult = (const float *)(bias + strips * QG_STRIP);                                               \
    for (int64_t s = s0; s < s1; s++) {                                                                          \
        const int32_t *bp = wp + s * K4 * QG_STRIP;                                                              \
        for (int64_t n = n0; n < n1; n += 4) {                                                                   \
            int64_t R = n1 - n < 4 ? n1 - n : 4;                                                                 \
            const uint8_t *rows[4];                                                                              \
            for (int r = 0; r < 4; r++) rows[r] = a + (n + (r < R ? r : 0)) * K;                                 \
            v16i acc[4][QG_NV];                                                                                  \
            if (R == 4) QG_TILE(4, DOT);                                                                         \
            else if (R == 3) QG_TILE(3, DOT);                                                                    \
            else if (R == 2) QG_TILE(2, DOT);                                                                    \
            else QG_TILE(1, DOT);                                                                                \
            for (int v = 0; v < QG_NV; v++) {                                                                    \
                int64_t m = s * QG_STRIP + 16 * v;                                                               \
                if (m >= M) break;                                                                               \
                int64_t cnt = M - m < 16 ? M - m : 16;                                                           \
                v16i bv = load16i(bias + m);                                                                     \
                v16 mv = load16(mult + m);                                                                       \
                for (int64_t r = 0; r < R; r++) {                                                                \
                    v16i q = requantise_v(acc[r][v], bv, mv, lo, hi, zero);                                      \
                    uint8_t *dst = y + (n + r) * M + m;                                                          \
                    store_bytes(dst, q, cnt);                                                                    \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }


static void qgemm_exact(QGEMM_ARGS) { QGEMM_BODY(QG_DOT_EXACT) }

#if defined(__AVX512F__)
__attribute__((target("avx512vnni"))) static void qgemm_vnni(QGEMM_ARGS) { QGEMM_BODY(QG_DOT_VNNI) }
#endif

/* y[N, M] from a[N, K] (u8, or s8 with x_flip 0x80) and the packed weights. Work units: chunks
 * of rows (split_n) or of 64-channel strips, `chunks` of them. */
void kiln_uk_qgemm(int64_t x_, int64_t wp_, int64_t y_, int64_t K, int64_t M, int64_t N, int64_t x_flip, int64_t y_zero, int64_t y_lo,
                   int64_t y_hi, int64_t vnni, int64_t chunks, int64_t split_n, int64_t wg_begin, int64_t wg_end) {
    const uint8_t *a = (const uint8_t *)(intptr_t)x_;
    const int32_t *wp = (const int32_t *)(intptr_t)wp_;
    uint8_t *y = (uint8_t *)(intptr_t)y_;
    int64_t strips = (M + QG_STRIP - 1) / QG_STRIP;
    uint32_t flip = (uint32_t)(x_flip & 0xff) * 0x01010101u;
    float lo = (float)(y_lo - y_zero), hi = (float)(y_hi - y_zero);
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t n0 = 0, n1 = N, s0 = 0, s1 = strips;
        if (split_n) chunk_range(N, 4, chunks, u, &n0, &n1);
        else chunk_range(strips, 1, chunks, u, &s0, &s1);
        if (n0 >= n1 || s0 >= s1) continue;
#if defined(__AVX512F__)
        if (vnni) {
            qgemm_vnni(a, wp, y, K, M, n0, n1, s0, s1, flip, lo, hi, (int32_t)y_zero);
            continue;
        }
#endif
        qgemm_exact(a, wp, y, K, M, n0, n1, s0, s1, flip, lo, hi, (int32_t)y_zero);
    }
}

/* kiln's dynamically quantized matrix product (DynQMatMul: onnxruntime's DynamicQuantizeLinear ->
 * MatMulInteger -> Cast -> Mul): y[n, m] = (float)(Σ_k (q[n, k] - zero) w[k, m]) * (scale *
 * w_scale[m]) (+ bias[m]), where q is the f32 input x quantized as DynamicQuantizeLinear does,
 * over the whole tensor: scale = (max(x, 0) - min(x, 0)) / 255, zero = round(clip(0 - min /
 * scale, 0, 255)), q = saturate(round(x / scale) + zero), every step in f32 and rounding half to
 * even, as the op's function body does. Each work unit finds the scale itself (one pass over x,
 * small beside the product), quantizes blocks of its rows into a buffer on its stack, and runs
 * qgemm's tiles on them (flip 0: the bytes are u8). The packed constant: the weights as qgemm's
 * (strips of 64 columns of [K/4][64] words), then per column (padded to whole strips) the int32
 * column sum (so Σ (q - zero) w = Σ q w - zero Σ w), the int32 column offset c, the f32 weight
 * scale and, with a bias, the f32 bias. Weights less their zero point span up to [-255, 255] (u8
 * weights with a zero point other than 128); each column's span is at most 255, so the packed
 * bytes are w - c in s8, and (has_offset) the epilogue adds c Σ_k (q - zero), from each row's
 * byte sum taken as it is quantized: exact in int32 (|Σ| <= 255 * 255 * 8192). */
#define DQ_BUF 32768

/* Round half to even of |v| < 2^22 (every value here is within [-256, 512]). */
static inline float dq_round(float v) {
    const float magic = 12582912.0f;
    volatile float t = v + magic;
    return t - magic;
}

static void dq_scale(const float *x, int64_t n, float *scale, float *zero) {
    v16 lo = splat(0.0f), hi = splat(0.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16 v = load16(x + i);
        lo = vmin(v, lo);
        hi = vmax(v, hi);
    }
    float l = hmin(lo), h = hmax(hi);
    for (; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    float s = (h - l) / 255.0f;
    if (!(s > 0.0f)) {
        /* All zeros: scale 0 and zero point 0 (the function body's 0 / 0 casts to 0). */
        *scale = 0.0f;
        *zero = 0.0f;
        return;
    }
    float z = 0.0f - l / s;
    z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
    *scale = s;
    *zero = dq_round(z);
}

/* n values of x quantized into q. */
static void dq_quantize(const float *x, uint8_t *q, int64_t n, float scale, float zero) {
    if (!(scale > 0.0f)) {
        memset(q, 0, (size_t)n);
        return;
    }
    const v16 s = splat(scale), z = splat(zero), top = splat(255.0f), none = splat(0.0f);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t cnt = n - i < 16 ? n - i : 16;
        v16 f = load16_n(x + i, cnt) / s;
#if defined(__AVX512F__)
        /* (The default rounding mode, to nearest even.) */
        v16i r = (v16i)_mm512_cvtps_epi32((__m512)f);
        v16 g = __builtin_convertvector(r, v16) + z;
#else
        const v16 magic = splat(12582912.0f);
        v16 g = ((f + magic) - magic) + z;
#endif
        g = vmin(vmax(g, none), top);
        store_bytes(q + i, __builtin_convertvector(g, v16i), cnt);
    }
}

/* Each of `rows` rows' sum of its K bytes (for the weights' column offsets). */
static void dq_row_sums(const uint8_t *q, int64_t rows, int64_t K, int32_t *sums) {
    for (int64_t r = 0; r < rows; r++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += q[r * K + k];
        sums[r] = s;
    }
}

/* The rows a block quantizes at most (their sums live on the stack beside the bytes). */
#define DQ_ROWS 1024

#define DQGEMM_ARGS                                                                                             \
    const float *x, const int32_t *wp, float *y, int64_t K, int64_t M, int64_t n0, int64_t n1, int64_t s0, int64_t s1, \
        float scale, float zero, int64_t has_bias, int64_t has_offset

#define DQGEMM_BODY(DOT)                                                                                         \
    int64_t K4 = (K + 3) / 4, K4full = K / 4, strips = (M + QG_STRIP - 1) / QG_STRIP;                            \
    const int32_t *sums = wp + strips * K4 * QG_STRIP;                                                           \
    const int32_t *offs = sums + strips * QG_STRIP;                                                              \
    const float *wscale = (const float *)(offs + strips * QG_STRIP);                                             \
    const float *bias = wscale + strips * QG_STRIP;                                                              \
    const uint32_t flip = 0;                                                                                     \
    uint8_t qb[DQ_BUF] __attribute__((aligned(64)));                                                             \
    int32_t rsum[DQ_ROWS];                                                                                       \
    int64_t rb = (DQ_BUF / K) / 4 * 4;                                                                           \
    if (rb > DQ_ROWS) rb = DQ_ROWS;                                                                              \
    const v16 sv = splat(scale);                                                                                 \
    const int32_t zi = (int32_t)zero;                                                                            \
    for (int64_t nb = n0; nb < n1; nb += rb) {                                                                   \
        int64_t ne = n1 - nb < rb ? n1 : nb + rb;                                                                \
        dq_quantize(x + nb * K, qb, (ne - nb) * K, scale, zero);                                                 \
        if (has_offset) dq_row_sums(qb, ne - nb, K, rsum);                                                       \
        for (int64_t s = s0; s < s1; s++) {                                                                      \
            const int32_t *bp = wp + s * K4 * QG_STRIP;                                                          \
            for (int64_t n = nb; n < ne; n += 4) {                                                               \
                int64_t R = ne - n < 4 ? ne - n : 4;                                                             \
                const uint8_t *rows[4];                                                                          \
                for (int r = 0; r < 4; r++) rows[r] = qb + (n - nb + (r < R ? r : 0)) * K;                       \
                v16i acc[4][QG_NV];                                                                              \
                if (R == 4) QG_TILE(4, DOT);                                                                     \
                else if (R == 3) QG_TILE(3, DOT);                                                                \
                else if (R == 2) QG_TILE(2, DOT);                                                                \
                else QG_TILE(1, DOT);                                                                            \
                for (int v = 0; v < QG_NV; v++) {                                                                \
                    int64_t m = s * QG_STRIP + 16 * v;                                                           \
                    if (m >= M) break;                                                                           \
                    int64_t cnt = M - m < 16 ? M - m : 16;                                                       \
                    v16i zs = load16i(sums + m) * zi;                                                            \
                    v16 mult = sv * load16(wscale + m);                                                          \
                    v16i off = has_offset ? load16i(offs + m) : (v16i){0};                                       \
                    for (int64_t r = 0; r < R; r++) {                                                            \
                        v16i a = acc[r][v] - zs;                                                                 \
                        if (has_offset) a += off * (rsum[n + r - nb] - (int32_t)K * zi);                         \
                        v16 f = __builtin_convertvector(a, v16) * mult;                                          \
                        if (has_bias) f += load16(bias + m);                                                     \
                        store16_n(y + (n + r) * M + m, f, cnt);                                                  \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }

static void dqgemm_exact(DQGEMM_ARGS) { DQGEMM_BODY(QG_DOT_EXACT) }

#if defined(__AVX512F__)
__attribute__((target("avx512vnni"))) static void dqgemm_vnni(DQGEMM_ARGS) { DQGEMM_BODY(QG_DOT_VNNI) }
#endif

#if defined(__AVX512F__)
/* The longest padded row the AMX form takes (dqgemm.rs's AMX_MAX_ROW): 16 of them fill DQ_BUF. */
#define DQ_AMX_ROW 2048

/* DQGEMM_BODY's product on AMX tiles: blocks of rows quantized into rows of Kp = K4s * 4 bytes
 * (zeros past K, and zero rows to a whole 16), then per strip of 64 columns and 16 rows, tile
 * 4 takes 16 rows x 64 k of them, tiles 5-7 the strip's 16-column quarters (16 words of 4 k a
 * row, QG_STRIP words apart; the fourth quarter reloads tile 5), and tdpbusd (u8 x s8, four
 * products a word summed into int32) adds them into the accumulator tiles 0-3; the sums go
 * through the stack to DQGEMM_BODY's epilogue. The weights are packed with K4s words a column
 * (K/4 rounded to whole steps of 16, zeros). */
__attribute__((target("amx-tile,amx-int8"))) static void dqgemm_amx(const float *x, const int32_t *wp, float *y, int64_t K, int64_t M,
                                                                   int64_t n0, int64_t n1, int64_t s0, int64_t s1, float scale,
                                                                   float zero, int64_t has_bias, int64_t has_offset) {
    int64_t K4s = ((K + 3) / 4 + 15) / 16 * 16, Kp = K4s * 4, strips = (M + QG_STRIP - 1) / QG_STRIP;
    const int32_t *sums = wp + strips * K4s * QG_STRIP;
    const int32_t *offs = sums + strips * QG_STRIP;
    const float *wscale = (const float *)(offs + strips * QG_STRIP);
    const float *bias = wscale + strips * QG_STRIP;
    uint8_t qb[DQ_BUF] __attribute__((aligned(64)));
    int32_t rsum[DQ_ROWS];
    int32_t acc[16 * QG_STRIP] __attribute__((aligned(64)));
    if (Kp > DQ_AMX_ROW) {
        KILN_INTERNAL_FAILURE(); /* planned only up to DQ_AMX_ROW: a bug, not input */
        return;
    }
    int64_t rb = DQ_BUF / Kp / 16 * 16;
    if (rb > DQ_ROWS) rb = DQ_ROWS;
    TileConfig cfg = amx_layout(64, 16);
    _tile_loadconfig(&cfg);
    const v16 sv = splat(scale);
    const int32_t zi = (int32_t)zero;
    for (int64_t nb = n0; nb < n1; nb += rb) {
        int64_t ne = n1 - nb < rb ? n1 : nb + rb, rows = ne - nb, padded = (rows + 15) / 16 * 16;
        for (int64_t r = 0; r < rows; r++) {
            dq_quantize(x + (nb + r) * K, qb + r * Kp, K, scale, zero);
            memset(qb + r * Kp + K, 0, (size_t)(Kp - K));
            if (has_offset) {
                int32_t s = 0;
                for (int64_t k = 0; k < K; k++) s += qb[r * Kp + k];
                rsum[r] = s;
            }
        }
        memset(qb + rows * Kp, 0, (size_t)((padded - rows) * Kp));
        for (int64_t s = s0; s < s1; s++) {
            const int32_t *bp = wp + s * K4s * QG_STRIP;
            for (int64_t n = nb; n < ne; n += 16) {
                const uint8_t *a = qb + (n - nb) * Kp;
                AMX_ZERO_ACCUMULATORS();
                for (int64_t q = 0; q < K4s; q += 16) {
                    const int32_t *b = bp + q * QG_STRIP;
                    _tile_loadd(4, a + 4 * q, Kp);
                    _tile_loadd(5, b, QG_STRIP * 4);
                    _tile_loadd(6, b + 16, QG_STRIP * 4);
                    _tile_loadd(7, b + 32, QG_STRIP * 4);
                    _tile_dpbusd(0, 4, 5);
                    _tile_dpbusd(1, 4, 6);
                    _tile_dpbusd(2, 4, 7);
                    _tile_loadd(5, b + 48, QG_STRIP * 4);
                    _tile_dpbusd(3, 4, 5);
                }
                _tile_stored(0, acc, QG_STRIP * 4);
                _tile_stored(1, acc + 16, QG_STRIP * 4);
                _tile_stored(2, acc + 32, QG_STRIP * 4);
                _tile_stored(3, acc + 48, QG_STRIP * 4);
                int64_t R = ne - n < 16 ? ne - n : 16;
                for (int v = 0; v < QG_NV; v++) {
                    int64_t m = s * QG_STRIP + 16 * v;
                    if (m >= M) break;
                    int64_t cnt = M - m < 16 ? M - m : 16;
                    v16i zs = load16i(sums + m) * zi;
                    v16 mult = sv * load16(wscale + m);
                    v16i off = has_offset ? load16i(offs + m) : (v16i){0};
                    for (int64_t r = 0; r < R; r++) {
                        v16i t = load16i(acc + r * QG_STRIP + 16 * v) - zs;
                        if (has_offset) t += off * (rsum[n + r - nb] - (int32_t)K * zi);
                        v16 f = __builtin_convertvector(t, v16) * mult;
                        if (has_bias) f += load16(bias + m);
                        store16_n(y + (n + r) * M + m, f, cnt);
                    }
                }
            }
        }
    }
    _tile_release();
}
#endif

/* y[N, M] (f32) from x[N, K] (f32) and the packed weights. Work units: chunks of rows (split_n)
 * or of 64-column strips, `chunks` of them. K is at most 8192 (the plan's bound), so 4 rows fit
 * the stack buffer. */
void kiln_uk_dqgemm(int64_t x_, int64_t wp_, int64_t y_, int64_t K, int64_t M, int64_t N, int64_t has_bias, int64_t has_offset, int64_t vnni,
                    int64_t chunks, int64_t split_n, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    const int32_t *wp = (const int32_t *)(intptr_t)wp_;
    float *y = (float *)(intptr_t)y_;
    int64_t strips = (M + QG_STRIP - 1) / QG_STRIP;
    float scale = 0.0f, zero = 0.0f;
    if (wg_begin < wg_end) dq_scale(x, N * K, &scale, &zero);
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t n0 = 0, n1 = N, s0 = 0, s1 = strips;
        if (split_n) chunk_range(N, 4, chunks, u, &n0, &n1);
        else chunk_range(strips, 1, chunks, u, &s0, &s1);
        if (n0 >= n1 || s0 >= s1) continue;
#if defined(__AVX512F__)
        if (vnni == 2) {
            dqgemm_amx(x, wp, y, K, M, n0, n1, s0, s1, scale, zero, has_bias, has_offset);
            continue;
        }
        if (vnni) {
            dqgemm_vnni(x, wp, y, K, M, n0, n1, s0, s1, scale, zero, has_bias, has_offset);
            continue;
        }
#endif
        dqgemm_exact(x, wp, y, K, M, n0, n1, s0, s1, scale, zero, has_bias, has_offset);
    }
}

/* kiln's 4-bit weight-only matrix product (MatMulNBits; the compiler's ukernel/nbits.rs plans it
 * and packs its weights): y[r, n] = Σ_k x[r, k] * (q[n, k] - zero[n, k / bs]) * scale[n, k / bs]
 * (+ bias[n]), f32 rows x, 4-bit weights q that stay 4-bit in memory and are unpacked in the loop.
 *
 * - The weights come in strips of NB_COLS columns as [K32 / 32 groups][NB_COLS][16 bytes]: the 16
 *   bytes of a column's group hold its k = 32g + j in byte j's low 4 bits and k = 32g + 16 + j in
 *   its high 4 bits (the packer reorders onnxruntime's pairs), so one 16-byte load widened to
 *   16 int32 lanes gives, by a mask and by a shift, 16 consecutive weights each, in x's order.
 *   Weights past K are 0 and the x lanes past K are loaded as 0.
 * - After the weights, per strip [blocks][NB_COLS] scales then [blocks][NB_COLS] offsets
 *   (-zero * scale): a weight is fma(q, scale, offset), made once per group and used by every
 *   row of the tile (up to 4); then the bias, NB_COLS a strip, where there is one.
 * - A tile is R rows x NB_COLS columns of 16-lane accumulators, summed across lanes at the end
 *   (one tree of shuffles for all 16); one row keeps the high halves in a second set, for twice
 *   the independent sums.
 * - Up to NB_PANEL_ROWS rows (decoding) read the 4-bit weights in the loop, unpacking them once
 *   per 4-row tile. More rows make each strip's weights f32 once, into a scratch panel, and run
 *   every tile over the panel with plain fmas: the unpacking costs as much as the 32 fmas per
 *   group it feeds, so it is done once per strip, not once per tile.
 * - Work units are ranges of strips. GCC vector types: the same code on every x86-64 level. */
#define NB_COLS 4
/* More rows than this: the weights made f32 once per strip (a panel), not once per tile. */
#define NB_PANEL_ROWS 4

/* 16 bytes widened to 16 int32 lanes. */
static inline v16i widen16_u8(const uint8_t *p) {
#if defined(__AVX512F__)
    return (v16i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    v16i r;
    for (int l = 0; l < 16; l++) r[l] = p[l];
    return r;
#endif
}

/* One group of 32 k: the tile's R rows of x (at x, row stride ldx) by the strip's NB_COLS
 * columns (16 bytes each at w), each half's weights fma(q, s, o) from its block's s and o. */
static inline __attribute__((always_inline)) void nb_group(int R, const uint8_t *w, const float *x, int64_t ldx,
                                                           const v16 *sl, const v16 *ol, const v16 *sh, const v16 *oh,
                                                           v16 acc[4][NB_COLS]) {
    _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) {
        v16i b = widen16_u8(w + 16 * c);
        v16 wl = __builtin_convertvector(b & 15, v16) * sl[c] + ol[c];
        v16 wh = __builtin_convertvector(b >> 4, v16) * sh[c] + oh[c];
        if (R == 1) {
            acc[0][c] += load16(x) * wl;
            acc[1][c] += load16(x + 16) * wh;
        } else {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                acc[r][c] += load16(x + r * ldx) * wl;
                acc[r][c] += load16(x + r * ldx + 16) * wh;
            }
        }
    }
}

/* The tile's sums: the 16 accumulators (row r, column c at lane 4r + c; rows past R are not
 * read) summed across their lanes by a tree of shuffles, 15 vector additions for all 16 sums,
 * then stored with the bias. */
static inline __attribute__((always_inline)) void nb_store(int R, v16 acc[4][NB_COLS], const float *bias, float *y,
                                                           int64_t N, int64_t n0, int64_t ncols) {
    typedef int32_t v16m __attribute__((vector_size(64)));
    const v16m l1a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const v16m l1b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const v16m l2a = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const v16m l2b = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const v16m l3a = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const v16m l3b = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const v16m l4a = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const v16m l4b = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    v16 a[16], b[8], c[4], d[2];
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) a[i] = i / NB_COLS < R ? acc[i / NB_COLS][i % NB_COLS] : (v16){0};
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], l1a) + __builtin_shuffle(a[2 * i], a[2 * i + 1], l1b);
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], l2a) + __builtin_shuffle(b[2 * i], b[2 * i + 1], l2b);
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) d[i] = __builtin_shuffle(c[2 * i], c[2 * i + 1], l3a) + __builtin_shuffle(c[2 * i], c[2 * i + 1], l3b);
    v16 s = __builtin_shuffle(d[0], d[1], l4a) + __builtin_shuffle(d[0], d[1], l4b);
    for (int r = 0; r < R; r++)
        for (int64_t cc = 0; cc < ncols; cc++) y[r * N + n0 + cc] = s[r * NB_COLS + cc] + (bias ? bias[cc] : 0.0f);
}

/* A strip's weights made f32 once, for tiles of many rows: [groups][NB_COLS][32], each column's
 * group its 32 weights fma(q, scale, offset) in k's order (those past K from q = 0: x's lanes
 * there are 0). */
static inline __attribute__((always_inline)) void nb_panel(int split, int64_t K, int64_t bs, const uint8_t *w,
                                                           const float *scales, const float *offs, float *panel) {
    int64_t groups = (K + 31) / 32;
    v16 sl[NB_COLS] = {0}, ol[NB_COLS] = {0}, sh[NB_COLS] = {0}, oh[NB_COLS] = {0};
    for (int64_t g = 0; g < groups; g++) {
        int64_t blo = 32 * g / bs;
        _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) {
            sl[c] = splat(scales[blo * NB_COLS + c]);
            ol[c] = splat(offs[blo * NB_COLS + c]);
            sh[c] = split ? splat(scales[(blo + 1) * NB_COLS + c]) : sl[c];
            oh[c] = split ? splat(offs[(blo + 1) * NB_COLS + c]) : ol[c];
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) {
            v16i b = widen16_u8(w + 16 * (NB_COLS * g + c));
            float *p = panel + 32 * (NB_COLS * g + c);
            store16(p, __builtin_convertvector(b & 15, v16) * sl[c] + ol[c]);
            store16(p + 16, __builtin_convertvector(b >> 4, v16) * sh[c] + oh[c]);
        }
    }
}

/* R rows (R <= 4) from x (row stride K) by a strip's f32 panel into y. */
static inline __attribute__((always_inline)) void nb_panel_tile(int R, const float *x, int64_t K, const float *panel,
                                                                const float *bias, float *y, int64_t N, int64_t n0,
                                                                int64_t ncols) {
    int64_t groups = (K + 31) / 32, full = K / 32;
    v16 acc[4][NB_COLS];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) acc[r][c] = (v16){0};
    float xt[4 * 32];
    for (int64_t g = 0; g < groups; g++) {
        const float *xg = x + 32 * g;
        int64_t ldx = K;
        if (g >= full) {
            int64_t left = K - 32 * g;
            for (int r = 0; r < R; r++)
                for (int64_t j = 0; j < 32; j++) xt[r * 32 + j] = j < left ? xg[r * K + j] : 0.0f;
            xg = xt;
            ldx = 32;
        }
        const float *p = panel + 32 * NB_COLS * g;
        _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) {
            v16 wl = load16(p + 32 * c), wh = load16(p + 32 * c + 16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                acc[r][c] += load16(xg + r * ldx) * wl;
                acc[r][c] += load16(xg + r * ldx + 16) * wh;
            }
        }
    }
    nb_store(R, acc, bias, y, N, n0, ncols);
}

/* R rows from x (row stride K) by one strip into y (row stride N), columns n0 .. n0 + ncols;
 * `split`: blocks of 16, so a group's halves have blocks of their own. */
static inline __attribute__((always_inline)) void nb_tile(int R, int split, const float *x, int64_t K, int64_t bs,
                                                          const uint8_t *w, const float *scales, const float *offs,
                                                          const float *bias, float *y, int64_t N, int64_t n0, int64_t ncols) {
    int64_t groups = (K + 31) / 32, full = K / 32;
    v16 acc[4][NB_COLS];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) acc[r][c] = (v16){0};
    v16 sl[NB_COLS] = {0}, ol[NB_COLS] = {0}, sh[NB_COLS] = {0}, oh[NB_COLS] = {0};
    float xt[4 * 32];
    for (int64_t g = 0; g < groups; g++) {
        int64_t blo = 32 * g / bs;
        if (split || (32 * g) % bs == 0) {
            _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) {
                sl[c] = splat(scales[blo * NB_COLS + c]);
                ol[c] = splat(offs[blo * NB_COLS + c]);
                if (split) {
                    sh[c] = splat(scales[(blo + 1) * NB_COLS + c]);
                    oh[c] = splat(offs[(blo + 1) * NB_COLS + c]);
                }
            }
        }
        const float *xg = x + 32 * g;
        int64_t ldx = K;
        if (g >= full) {
            /* The last, partial group: its rows copied into zeros. */
            int64_t left = K - 32 * g;
            for (int r = 0; r < R; r++) {
                for (int64_t j = 0; j < 32; j++) xt[r * 32 + j] = j < left ? xg[r * K + j] : 0.0f;
            }
            xg = xt;
            ldx = 32;
        }
        nb_group(R, w + 16 * NB_COLS * g, xg, ldx, sl, ol, split ? sh : sl, split ? oh : ol, acc);
    }
    if (R == 1) _Pragma("GCC unroll 4") for (int c = 0; c < NB_COLS; c++) acc[0][c] += acc[1][c];
    nb_store(R, acc, bias, y, N, n0, ncols);
}

/* Rows `rows` by one strip: tiles of 4 rows, then the rest. */
static inline __attribute__((always_inline)) void nb_strip(int split, const float *x, int64_t K, int64_t bs, int64_t rows,
                                                           const uint8_t *w, const float *sc, const float *of,
                                                           const float *b, float *y, int64_t N, int64_t n0, int64_t nc) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) nb_tile(4, split, x + r * K, K, bs, w, sc, of, b, y + r * N, N, n0, nc);
    switch (rows - r) {
    case 3: nb_tile(3, split, x + r * K, K, bs, w, sc, of, b, y + r * N, N, n0, nc); break;
    case 2: nb_tile(2, split, x + r * K, K, bs, w, sc, of, b, y + r * N, N, n0, nc); break;
    case 1: nb_tile(1, split, x + r * K, K, bs, w, sc, of, b, y + r * N, N, n0, nc); break;
    default: break;
    }
}

void kiln_uk_nbgemm(int64_t x_, int64_t wp_, int64_t y_, int64_t K, int64_t N, int64_t rows, int64_t bs, int64_t has_bias,
                    int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    const uint8_t *wp = (const uint8_t *)(intptr_t)wp_;
    float *y = (float *)(intptr_t)y_;
    int64_t strips = (N + NB_COLS - 1) / NB_COLS, groups = (K + 31) / 32;
    /* Blocks as the packer counts them: whole groups' worth, so that a split group's high half
     * always has its block's entry. */
    int64_t blocks = (32 * groups + bs - 1) / bs;
    /* Per strip: the weights, then the scales and offsets; the biases after every strip's. */
    int64_t wbytes = groups * 16 * NB_COLS, sfloats = 2 * blocks * NB_COLS;
    const float *so = (const float *)(wp + strips * wbytes);
    const float *biases = has_bias ? so + strips * sfloats : NULL;
    /* Many rows: each strip's weights made f32 once into scratch slot 2 (scratch.rs bounds it). */
    float *panel = NULL;
    if (rows > NB_PANEL_ROWS && wg_begin < wg_end) {
        panel = scratch(2, (size_t)(groups * 32 * NB_COLS));
        if (!panel) return;
    }
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t s0 = 0, s1 = strips;
        chunk_range(strips, 1, chunks, u, &s0, &s1);
        for (int64_t s = s0; s < s1; s++) {
            const uint8_t *w = wp + s * wbytes;
            const float *sc = so + s * sfloats, *of = sc + blocks * NB_COLS;
            const float *b = biases ? biases + s * NB_COLS : NULL;
            int64_t n0 = s * NB_COLS, nc = N - n0 < NB_COLS ? N - n0 : NB_COLS;
            if (rows > NB_PANEL_ROWS) {
                nb_panel(bs < 32, K, bs, w, sc, of, panel);
                int64_t r = 0;
                for (; r + 4 <= rows; r += 4) nb_panel_tile(4, x + r * K, K, panel, b, y + r * N, N, n0, nc);
                switch (rows - r) {
                case 3: nb_panel_tile(3, x + r * K, K, panel, b, y + r * N, N, n0, nc); break;
                case 2: nb_panel_tile(2, x + r * K, K, panel, b, y + r * N, N, n0, nc); break;
                case 1: nb_panel_tile(1, x + r * K, K, panel, b, y + r * N, N, n0, nc); break;
                default: break;
                }
            } else if (bs < 32) nb_strip(1, x, K, bs, rows, w, sc, of, b, y, N, n0, nc);
            else nb_strip(0, x, K, bs, rows, w, sc, of, b, y, N, n0, nc);
        }
    }
}
