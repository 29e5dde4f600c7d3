/* kiln's f32 convolutions: kiln_uk_conv2d (one group with a window or a stride read direct from
 * padded stride-phase planes; grouped and pointwise ones, and few positions by many channels, on
 * the packed GEMM of gemm.c) and kiln_uk_conv_transpose (a GEMM, then col2im). Their epilogue
 * (bias, residual, ReLU or clip) is applied as results are stored. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "workspace.h"
#include "amx.h"
#include "tile.h"

/* The register tile of a direct convolution: c[MR rows][16 * NV flat positions] = A panel (K x
 * MR, packed weights) times B rows read straight from the padded input: row k at xb + offs[k].
 * Inlined with NV constant: 2 (8x32) or 3 (8x48, AVX-512 only: 24 accumulators; a third fewer
 * broadcasts a multiply-add). */
static inline __attribute__((always_inline)) void micro_direct(int NV, int64_t K, const float *restrict a, const float *restrict xb,
                                                              const int64_t *restrict offs, v16 c[MR][3]) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) c[r][v] = splat(0.0f);
    for (int64_t k = 0; k < K; k++) {
        const float *b = xb + offs[k];
        v16 bv[3];
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) bv[v] = load16(b + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            v16 ar = splat(a[r]);
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) c[r][v] += ar * bv[v];
        }
        a += MR;
    }
}

static void micro_direct_32(int64_t K, const float *a, const float *xb, const int64_t *offs, v16 c[MR][3]) {
    micro_direct(2, K, a, xb, offs, c);
}

#if MR == 8
static void micro_direct_48(int64_t K, const float *a, const float *xb, const int64_t *offs, v16 c[MR][3]) {
    micro_direct(3, K, a, xb, offs, c);
}
#endif

#if MR == 8
/* The channel-vector direct tile: c[f][j] (16 output channels f of the tile's F * 16 at position
 * j of P) += W[k][16 f ..] times x[offs[k] + p_j], over k; the weights packed per block of
 * channels as [K][F * 16] (conv.rs's pack_conv_channels), the positions' flat indices
 * (oh * Wq + ow in the stride-phase planes) in pos. Each step loads F weight vectors (aligned,
 * in order) and broadcasts P input floats from P pointers, one index: no lane computes a
 * padding column, and no load splits a cache line. The sums start at zero (first) or at
 * acc[j * F + f], where they are left. */
static inline __attribute__((always_inline)) void micro_channels(int F, int P, int64_t K, const float *restrict w,
                                                                const float *restrict x, const int64_t *restrict offs,
                                                                const int64_t *restrict pos, v16 *restrict acc, int first) {
    v16 c[4][16];
    const float *xj[16];
#pragma GCC unroll 16
    for (int j = 0; j < P; j++) xj[j] = x + pos[j];
#pragma GCC unroll 16
    for (int j = 0; j < P; j++)
#pragma GCC unroll 4
        for (int f = 0; f < F; f++) c[f][j] = first ? splat(0.0f) : acc[j * F + f];
    for (int64_t k = 0; k < K; k++) {
        int64_t o = offs[k];
        v16 wv[4];
#pragma GCC unroll 4
        for (int f = 0; f < F; f++) wv[f] = load16(w + 16 * f);
#pragma GCC unroll 16
        for (int j = 0; j < P; j++) {
            v16 b = splat(xj[j][o]);
#pragma GCC unroll 4
            for (int f = 0; f < F; f++) c[f][j] += b * wv[f];
        }
        w += 16 * F;
    }
#pragma GCC unroll 16
    for (int j = 0; j < P; j++)
#pragma GCC unroll 4
        for (int f = 0; f < F; f++) acc[j * F + f] = c[f][j];
}

/* The positions a tile of F channel vectors takes: 24 accumulators where that divides (4 x 6,
 * 2 x 12; 3 x 8), 16 for one vector (a broadcast a multiply-add would leave the loads, not the
 * multiply-adds, the limit). conv.rs's channel_tile_positions is the same table. */
static int64_t channel_tile_positions(int64_t F) { return F == 4 ? 6 : F == 3 ? 8 : F == 2 ? 12 : 16; }

typedef void (*ChannelTile)(int64_t, const float *, const float *, const int64_t *, const int64_t *, v16 *, int);
static void channels_4(int64_t K, const float *w, const float *x, const int64_t *o, const int64_t *p, v16 *a, int first) {
    micro_channels(4, 6, K, w, x, o, p, a, first);
}
static void channels_3(int64_t K, const float *w, const float *x, const int64_t *o, const int64_t *p, v16 *a, int first) {
    micro_channels(3, 8, K, w, x, o, p, a, first);
}
static void channels_2(int64_t K, const float *w, const float *x, const int64_t *o, const int64_t *p, v16 *a, int first) {
    micro_channels(2, 12, K, w, x, o, p, a, first);
}
static void channels_1(int64_t K, const float *w, const float *x, const int64_t *o, const int64_t *p, v16 *a, int first) {
    micro_channels(1, 16, K, w, x, o, p, a, first);
}
#endif

#if MR == 8
/* A direct convolution's whole tile in bf16: the weights packed in MR-row strips of pairs, B
 * read at xb + offs[q] (the input's channel-pair planes). */
KILN_BF16 static void micro_direct_bf16(int64_t K2, const uint32_t *restrict a, const uint32_t *restrict xb,
                                        const int64_t *restrict offs, v16 c[MR][3]) {
    v16 c0[MR], c1[MR];
    tile_bf16(MR, 1, K2, a, 1, MR, xb, offs, c0, c1);
    for (int r = 0; r < MR; r++) {
        c[r][0] = c0[r];
        c[r][1] = c1[r];
    }
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

#if MR == 8
/* A bf16 direct convolution's strips on AMX tiles: the channel-pair planes as for vdpbf16ps (the
 * pairs padded to gb * kb with zeroed planes), the weights packed per 16 channels, tap and step
 * of kb pairs (conv.rs's pack_conv_bf16_amx). A step: tiles 6 and 7 take kb pairs' planes (a
 * tile row each, `gstride` words apart) at 16 positions each, 4 and 5 two 16-channel blocks'
 * weights, and tdpbf16ps adds their products (two bf16 a word, summed into f32) into the
 * accumulator tiles 0-3: 32 channels x 32 positions, stored through the stack, then the bias,
 * residual and activation as the vector tile's rows take them. */
__attribute__((target("amx-tile,amx-bf16"))) static void direct_strips_amx(const uint32_t *xq, const uint32_t *wp, const float *bias,
                                                                          const float *res, float *y, int64_t flat, int64_t Wq,
                                                                          int64_t oh0, int64_t OW, int64_t N, int64_t m0, int64_t m1,
                                                                          int64_t taps, int64_t kb, int64_t gb, int64_t gstride,
                                                                          const int64_t *tapoff, const Epilogue *act) {
    TileConfig cfg = amx_layout(4 * kb, kb);
    _tile_loadconfig(&cfg);
    float sums[32 * 32] __attribute__((aligned(64)));
    int64_t atile = 16 * kb, ablock = taps * gb * atile;
    for (int64_t p0 = 0; p0 < flat; p0 += 32) {
        int64_t run_l[33], run_n[33], run_o[33];
        int64_t runs = strip_runs(p0, 32, flat, Wq, OW, oh0, run_l, run_n, run_o);
        for (int64_t i = m0; i < m1; i += 32) {
            const uint32_t *a0 = wp + (i / 16) * ablock, *a1 = a0 + ablock;
            AMX_ZERO_ACCUMULATORS();
            for (int64_t t = 0; t < taps; t++) {
                for (int64_t g = 0; g < gb; g++) {
                    const uint32_t *b = xq + g * kb * gstride + tapoff[t] + p0;
                    int64_t at = (t * gb + g) * atile;
                    AMX_STEP_2X2(_tile_dpbf16ps, a0 + at, a1 + at, kb * 4, b, b + 16, gstride * 4);
                }
            }
            AMX_STORE_2X2(sums);
            int64_t mr = m1 - i < 32 ? m1 - i : 32;
            for (int64_t r = 0; r < mr; r++) {
                const float *row = sums + r * 32;
                float b = bias ? bias[i + r] : 0.0f;
                float *yr = y + (i + r) * N;
                const float *rr = res ? res + (i + r) * N : NULL;
                for (int64_t q = 0; q < runs; q++) {
                    for (int64_t j = 0; j < run_n[q]; j += 16) {
                        int64_t n = run_n[q] - j < 16 ? run_n[q] - j : 16;
                        v16 v = load16_n(row + run_l[q] + j, n) + splat(b);
                        float *yo = yr + run_o[q] + j;
                        int last = residual_last(act);
                        if (rr && !last) v += load16_n(rr + run_o[q] + j, n);
                        v = finish(v, act, 0, 0);
                        if (rr && last) v += load16_n(rr + run_o[q] + j, n);
                        store16_n(yo, v, n);
                    }
                }
            }
        }
    }
    _tile_release();
}
#endif

/* Whether a tap of a window of `k` taps `d` apart falls on phase `a` of stride `s`. */
static int phase_read(int64_t a, int64_t s, int64_t k, int64_t d) {
    for (int64_t t = 0; t < k; t++)
        if (t * d % s == a) return 1;
    return 0;
}

/* y[m, n] = the epilogue on C^T[n, m] for channels m0 .. m1 and positions n0 .. n1 of N, where
 * C^T[n0 + i, m0 + j] is ct[i * ldc + j]: a result computed with vectors along channels put back
 * in NCHW, a 16 x 16 block at a time through registers. */
static void store_transposed(const float *ct, int64_t ldc, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *y,
                             const Epilogue *e) {
    for (int64_t m = m0; m < m1; m += 16) {
        int64_t nm = m1 - m < 16 ? m1 - m : 16;
        for (int64_t n = n0; n < n1; n += 16) {
            int64_t nn = n1 - n < 16 ? n1 - n : 16;
            v16 r[16];
            for (int64_t k = 0; k < 16; k++) r[k] = k < nn ? load16_n(ct + (n - n0 + k) * ldc + (m - m0), nm) : splat(0.0f);
            transpose16(r);
            for (int64_t k = 0; k < nm; k++) store16_n(y + (m + k) * N + n, finish_n(r[k], e, m + k, n, nn), nn);
        }
    }
}

#if MR == 8
/* A direct convolution with vectors along output channels (`vec` = F, 1-4 vectors a tile), from
 * the stride-phase planes xp and the offsets offs conv_direct has made: output rows oh0 .. oh1
 * (positions n0 .. n1 of N, flat index (oh - oh0) * Wq + ow in the planes) and channels m0 .. m1
 * (whole blocks of F * 16; M a multiple of 16, the last block of the weights as wide as what is
 * left). K is taken in blocks whose weights (kc x F * 16 floats, conv.rs's channel_blocks) stay
 * in L1 while every tile of a run of nc positions passes over them; the run's sums wait in ct
 * (a row of F * 16 a position) between blocks, and are stored transposed, with the epilogue,
 * after the last. */
static void conv_direct_channels(const float *xp, const int64_t *offs, const float *wp, float *y, int64_t K,
                                 int64_t N, int64_t Wq, int64_t OW, int64_t oh0, int64_t oh1, int64_t m0, int64_t m1, int64_t vec,
                                 int64_t kc, int64_t nc, const Epilogue *e) {
    int64_t n0 = oh0 * OW, n1 = oh1 * OW, count = n1 - n0, CB = 16 * vec;
    /* Room for the last tile of any P (at most 16) past the positions (and past a run of at
     * most nc of them); the padding repeats the last position. */
    int64_t padded = (count + 31) / 16 * 16, runs = ((count < nc ? count : nc) + 31) / 16 * 16;
    float *ct = scratch(3, (size_t)(runs * CB));
    int64_t *pos = (int64_t *)scratch(2, (size_t)(2 * padded));
    if (!ct || !pos) return; /* (recorded by scratch) */
    for (int64_t i = 0; i < padded; i++) {
        int64_t n = n0 + (i < count ? i : count - 1);
        pos[i] = (n / OW - oh0) * Wq + n % OW;
    }
    for (int64_t mb = m0; mb < m1; mb += CB) {
        int64_t F = (m1 - mb) / 16 < vec ? (m1 - mb) / 16 : vec, width = 16 * F, P = channel_tile_positions(F);
        /* kc steps of a full block's weights; as many bytes of a narrower one's. */
        int64_t kb = kc * CB / width > 0 ? kc * CB / width : 1;
        ChannelTile tile = F == 4 ? channels_4 : F == 3 ? channels_3 : F == 2 ? channels_2 : channels_1;
        /* Blocks before this one are CB wide; this one is `width`. */
        const float *wb = wp + mb / CB * K * CB;
        /* A K only a little over a block is one; positions in runs of nc tiles' worth, so that
         * their sums stay in L2 between K blocks (a 7x7/2 stem's 12544 positions by 64 channels
         * are 3 MiB). */
        if (K <= kb + kb / 4) kb = K;
        int64_t run = nc / P * P > 0 ? nc / P * P : P;
        for (int64_t t0 = 0; t0 < count; t0 += run) {
            int64_t t1 = t0 + run < count ? t0 + run : count;
            for (int64_t k0 = 0; k0 < K; k0 += kb) {
                int64_t kn = K - k0 < kb ? K - k0 : kb;
                /* The weights of the block after next, fetched into L2 a share a tile: read in
                 * one burst by a block's first tile, weights beyond L2 (a layer's come from
                 * memory once the model's earlier layers have passed) stall it (resnet18's 3x3
                 * by 512 on 7x7 in the model, 1 thread: 2.06 -> 1.80 ms). */
                const char *next = (const char *)(wb + (k0 + 2 * kn) * width);
                int64_t rest = K - k0 - 2 * kn, ahead = rest < kb ? rest : kb, lines = ahead > 0 ? ahead * width / 16 : 0;
                int64_t tiles = (t1 - t0 + P - 1) / P, share = (lines + tiles - 1) / tiles;
                for (int64_t t = t0, i = 0; t < t1; t += P, i++) {
                    for (int64_t l = i * share; l < (i + 1) * share && l < lines; l++) __builtin_prefetch(next + 64 * l, 0, 2);
                    tile(kn, wb + k0 * width, xp, offs + k0, pos + t, (v16 *)(ct + (t - t0) * width), k0 == 0);
                }
            }
            /* The run's results while its sums are in cache. */
            store_transposed(ct, width, N, mb, mb + width, n0 + t0, n0 + t1, y, e);
        }
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
                        int64_t OW, int64_t act, float lo, float hi, int64_t oh0, int64_t oh1, int64_t m0, int64_t m1, int bf16, int64_t cols, int64_t vec, int64_t kc, int64_t nc) {
    /* Strips of 48 positions, and vectors along channels, only where the planner can have them
     * (AVX-512, f32). */
    if ((cols != 32 && !(cols == 48 && MR == 8 && !bf16)) || (vec && (MR != 8 || bf16 || vec > 4))) {
        KILN_INTERNAL_FAILURE(); /* a bug, not input */
        return;
    }
    int64_t Wq = OW + (KW - 1) * DW / SW;
    /* The phase rows these output rows read. */
    int64_t rows = oh1 - oh0 + (KH - 1) * DH / SH, plane = rows * Wq;
    int64_t K = C * KH * KW, phases = SH * SW;
    /* The last strip may read `cols` (at most 48) floats past the last position of the last
     * plane; scratch.rs bounds the slot so. */
    size_t total = (size_t)(C * phases * plane + 64);
    float *xp = scratch(0, total);
    int64_t *offs = (int64_t *)scratch(1, (size_t)(2 * K));
    if (!xp || !offs) return; /* (recorded by scratch) */
    /* Only the phases some tap reads are filled (a 1x1 stride-2 convolution reads one of four);
     * the others' lanes feed only positions that are dropped. bf16 pairs every plane. */
    memset(xp + C * phases * plane, 0, 64 * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        for (int64_t a = 0; a < SH; a++) {
            for (int64_t b = 0; b < SW; b++) {
                float *ph = xp + ((c * SH + a) * SW + b) * plane;
                if (!bf16 && !(phase_read(a, SH, KH, DH) && phase_read(b, SW, KW, DW))) continue;
                /* Columns j of the phase read input column j * SW + b - PW. */
                int64_t jlo = PW - b <= 0 ? 0 : (PW - b + SW - 1) / SW;
                int64_t jhi = W - 1 + PW - b < 0 ? 0 : (W - 1 + PW - b) / SW + 1;
                if (jhi > Wq) jhi = Wq;
                if (jlo > jhi) jlo = jhi;
                /* Only the padding is cleared, row by row beside the copy: clearing the whole
                 * plane first wrote it twice (3% of DBNet's time, in its 3x3 convolutions of
                 * 256 channels of 160x160). */
                for (int64_t i = 0; i < rows; i++) {
                    int64_t ih = (oh0 + i) * SH + a - PH;
                    float *row = ph + i * Wq;
                    if (ih < 0 || ih >= H || jlo >= jhi) {
                        memset(row, 0, (size_t)Wq * sizeof(float));
                        continue;
                    }
                    memset(row, 0, (size_t)jlo * sizeof(float));
                    memset(row + jhi, 0, (size_t)(Wq - jhi) * sizeof(float));
                    const float *src = x + (c * H + ih) * W + jlo * SW + b - PW;
                    float *dst = row + jlo;
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
    /* AMX (bf16 == 2) pads the pairs to whole steps of kb; their planes are zeros (a zero
     * weight times a NaN would not be zero). */
    int64_t pairs = (C + 1) / 2, kb = pairs < 16 ? pairs : 16, gb = (pairs + kb - 1) / kb;
    int64_t padded_pairs = bf16 == 2 ? kb * gb : pairs;
    if (bf16) {
#if MR == 8
        size_t words = (size_t)(padded_pairs * phases * plane + 64);
        xq = (uint32_t *)scratch(2, words);
        if (!xq) return; /* (recorded by scratch) */
        memset(xq + pairs * phases * plane, 0, (size_t)((padded_pairs - pairs) * phases * plane + 64) * sizeof(uint32_t));
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
    Epilogue act_only = {NULL, NULL, NULL, 0, act, lo, hi};
    int64_t N = OH * OW;
    /* Flat positions of the rows (relative to row oh0): the last row ends at OW. */
    int64_t flat = (oh1 - oh0 - 1) * Wq + OW;
#if MR == 8
    if (bf16 == 2) {
        /* A tap's offset within a pair's planes; pairs are phases * plane apart. */
        for (int64_t t = 0; t < KH * KW; t++) {
            int64_t dy = (t / KW) * DH, dx = (t % KW) * DW;
            offs[t] = ((dy % SH) * SW + dx % SW) * plane + dy / SH * Wq + dx / SW;
        }
        direct_strips_amx(xq, (const uint32_t *)wp, bias, res, y, flat, Wq, oh0, OW, N, m0, m1, KH * KW, kb, gb, phases * plane, offs,
                          &act_only);
        return;
    }
#endif
    for (int64_t k = 0; k < (bf16 ? K2 : K); k++) {
        int64_t c = k / (KH * KW), t = k % (KH * KW);
        int64_t dy = (t / KW) * DH, dx = (t % KW) * DW;
        offs[k] = ((c * SH + dy % SH) * SW + dx % SW) * plane + dy / SH * Wq + dx / SW;
    }
#if MR == 8
    if (vec) {
        Epilogue e = epilogue_of(bias, NULL, res, N, act, lo, hi);
        conv_direct_channels(xp, offs, wp, y, K, N, Wq, OW, oh0, oh1, m0, m1, vec, kc, nc, &e);
        return;
    }
#endif
    for (int64_t p0 = 0; p0 < flat; p0 += cols) {
        /* The strip's valid positions as runs: (lane, count, output index). */
        int64_t run_l[49], run_n[49], run_o[49];
        int64_t runs = strip_runs(p0, cols, flat, Wq, OW, oh0, run_l, run_n, run_o);
        for (int64_t i = m0; i < m1; i += MR) {
            v16 c[MR][3];
#if MR == 8
            if (bf16)
                micro_direct_bf16(K2, (const uint32_t *)wp + (i / MR) * K2 * MR, xq + p0, offs, c);
            else if (cols == 48)
                micro_direct_48(K, wp + (i / MR) * K * MR, xp + p0, offs, c);
            else
#endif
                micro_direct_32(K, wp + (i / MR) * K * MR, xp + p0, offs, c);
            int64_t mr = m1 - i < MR ? m1 - i : MR;
            for (int64_t r = 0; r < mr; r++) {
                /* The row's positions through the stack: runs rarely start on a vector (Wq is
                 * no multiple of 16), and a reload at an offset is cheap beside the K loop. */
                float row[48] __attribute__((aligned(64)));
                v16 b = splat(bias ? bias[i + r] : 0.0f);
                for (int64_t v = 0; v < cols / 16; v++) store16(row + 16 * v, c[r][v] + b);
                float *yr = y + (i + r) * N;
                const float *rr = res ? res + (i + r) * N : NULL;
                for (int64_t q = 0; q < runs; q++) {
                    for (int64_t j = 0; j < run_n[q]; j += 16) {
                        int64_t n = run_n[q] - j < 16 ? run_n[q] - j : 16;
                        v16 v = load16_n(row + run_l[q] + j, n);
                        float *yo = yr + run_o[q] + j;
                        int last = residual_last(&act_only);
                        if (n == 16) {
                            if (rr && !last) v += load16(rr + run_o[q] + j);
                            v = finish(v, &act_only, 0, 0);
                            if (rr && last) v += load16(rr + run_o[q] + j);
                            store16(yo, v);
                        } else {
                            if (rr && !last) v += load16_n(rr + run_o[q] + j, n);
                            v = finish(v, &act_only, 0, 0);
                            if (rr && last) v += load16_n(rr + run_o[q] + j, n);
                            store16_n(yo, v, n);
                        }
                    }
                }
            }
        }
    }
}

/* A 2-D convolution (NCHW) as implicit GEMM, one GEMM a group: per image and group g,
 * C[Mg = M/G out channels, N = OH*OW] = W_g[Mg, K = C/G*KH*KW] (packed, groups one after another)
 * * im2col(x_g)[K, N]. Work units: images x chunks of N (split_n) or of Mg. */
void kiln_uk_conv2d(int64_t x_, int64_t wp_, int64_t bias_, int64_t res_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t M,
                    int64_t G, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                    int64_t OH, int64_t OW, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks,
                    int64_t split_n, int64_t transposed, int64_t in_blocked, int64_t out_blocked, int64_t bf16, int64_t cols, int64_t vec, int64_t wg_begin,
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
                kiln_gemm_block(&A, &B, y + img * M * N, 16, N * 16, N, M, K, n0, n1, m0, m1, &e, &bl);
            } else {
                kiln_gemm_block(&A, &B, ct, M, 16, N, M, K, n0, n1, m0, m1, NULL, &bl);
                Epilogue e = epilogue_of(bias, NULL, ri, N, act, lo, hi);
                store_transposed(ct + n0 * M + m0, M, N, m0, m1, n0, n1, y + img * M * N, &e);
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
            else chunk_range(M, bf16 == 2 ? 32 : vec ? 16 * vec : MR, chunks, q, &m0, &m1);
            if (oh0 < oh1 && m0 < m1)
                conv_direct(x + img * C * H * W, wp, bias, res ? res + img * M * N : NULL, y + img * M * N, C, H, W, KH, KW, SH, SW, DH, DW,
                            PH, PW, OH, OW, act, lo, hi, oh0, oh1, m0, m1, (int)bf16, cols, vec, kc, nc);
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
            if (a0 < a1 && b0 < b1) kiln_gemm_block(&A, &B, yi, N, 16, Mg, N, K, a0, a1, b0, b1, &e, &bl);
        }
    }
}

/* conv_transpose_rows where the windows do not overlap ((KH-1)*DH < SH and (KW-1)*DW < SW: a
 * 2x2/2 upsampling): each output takes at most one column value, so it is written once, with the
 * epilogue, from the columns of a block of input rows while they are in cache (blocks of about
 * 1 MiB of columns): no zeroed planes, no adds, no pass over finished planes. The block of input
 * rows [b0, b1) owns output rows [b0*SH - PH, b1*SH - PH), as a chunk does. (DBNet's 64 -> 64
 * 2x2/2 to 320x320, 1 thread: 19.3 ms, three passes over 26 MB planes and a 26 MB column
 * buffer.) */
static void conv_transpose_disjoint(const float *x, const Asource *A, float *y, int64_t H, int64_t W, int64_t Cout, int64_t Cin,
                                    int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                                    int64_t OH, int64_t OW, const Epilogue *e, const Blocking *bl, int64_t c0, int64_t c1, int64_t r0,
                                    int64_t r1, int64_t oh0, int64_t oh1) {
    int64_t khw = KH * KW, M = Cout * khw, N = H * W, P = OH * OW;
    int64_t i0 = c0 * khw, i1 = c1 * khw;
    int64_t rb = (1 << 18) / ((i1 - i0) * W > 0 ? (i1 - i0) * W : 1);
    if (rb < 1) rb = 1;
    float *cols = scratch(3, (size_t)((i1 - i0) * (rb < r1 - r0 ? rb : r1 - r0) * W));
    if (!cols) return; /* (recorded by scratch) */
    Bsource B = {NULL, x, N, 1, NULL};
    /* An interleaving 2x2/2 window with no padding: each output row is two column rows'
     * values, alternately. */
    int pairs = SW == 2 && KW == 2 && DW == 1 && PW == 0 && OW == 2 * W;
    /* (A chunk of no input rows still owns its output rows: one pass, no columns.) */
    int64_t b0 = r0;
    do {
        int64_t b1 = b0 + rb < r1 ? b0 + rb : r1, n0 = b0 * W, n1 = b1 * W, ld = n1 - n0;
        if (n0 < n1) kiln_gemm_block(A, &B, cols - i0 * ld - n0, ld, 16, M, N, Cin, i0, i1, n0, n1, NULL, bl);
        int64_t lo_oh = b0 == r0 ? oh0 : b0 * SH - PH, hi_oh = b1 == r1 ? oh1 : b1 * SH - PH;
        lo_oh = lo_oh < oh0 ? oh0 : lo_oh;
        hi_oh = hi_oh > oh1 ? oh1 : hi_oh;
        for (int64_t co = c0; co < c1; co++) {
            for (int64_t oh = lo_oh; oh < hi_oh; oh++) {
                float *orow = y + co * P + oh * OW;
                /* The tap row and input row this output row reads, if any (at most one). */
                int64_t kh = -1, ih = 0;
                for (int64_t t = 0; t < KH; t++) {
                    int64_t d = oh + PH - t * DH;
                    if (d >= 0 && d % SH == 0 && d / SH >= b0 && d / SH < b1) {
                        kh = t;
                        ih = d / SH;
                    }
                }
                if (kh < 0) {
                    memset(orow, 0, (size_t)OW * sizeof(float));
                } else {
                    const float *src = cols + ((co * KH + kh) * KW - i0) * ld + (ih - b0) * W;
                    int64_t ow = 0;
                    if (pairs) {
                        const float *s1 = src + ld;
                        for (; ow + 32 <= OW; ow += 32) {
                            v16 a = load16(src + ow / 2), b = load16(s1 + ow / 2);
                            store16(orow + ow, __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23));
                            store16(orow + ow + 16,
                                    __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
                        }
                    }
                    for (; ow < OW; ow++) {
                        float v = 0.0f;
                        for (int64_t kw = 0; kw < KW; kw++) {
                            int64_t d = ow + PW - kw * DW;
                            if (d >= 0 && d % SW == 0 && d / SW < W) v = src[kw * ld + d / SW];
                        }
                        orow[ow] = v;
                    }
                }
                /* The epilogue over the row, in L1. */
                int64_t p = oh * OW, p1 = p + OW;
                for (; p + 16 <= p1; p += 16) store16(y + co * P + p, finish(load16(y + co * P + p), e, co, p));
                if (p < p1) store16_n(y + co * P + p, finish_n(load16_n(y + co * P + p, p1 - p), e, co, p, p1 - p), p1 - p);
            }
        }
        b0 = b1;
    } while (b0 < r1);
}

/* A transposed convolution (NCHW, one group) as a GEMM and a scatter: per image,
 * cols[(co, kh, kw), (ih, iw)] = W[Cin, Cout*KH*KW]^T (packed) * x[Cin, H*W], then each column
 * value is added at output (ih*SH + kh*DH - PH, iw*SW + kw*DW - PW) when that lies inside (pads
 * may be negative); the epilogue runs over the finished planes. Work units: images x chunks of
 * output channels (whole register-tile strips of rows each), or with split_rows (only where the
 * window's rows do not overlap, (KH-1)*DH < SH) images x chunks of input rows, all channels
 * each: a chunk of input rows [r0, r1) writes output rows [r0*SH - PH, r1*SH - PH) only, and
 * owns them (the first and last chunks also the rows before and after), so one output channel
 * (a segmentation head's last layer) splits too. */
static void conv_transpose_rows(const float *x, const Asource *A, const float *bias, const float *res, float *y, int64_t Cin,
                                int64_t H, int64_t W, int64_t Cout, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH,
                                int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW, int64_t act, float lo, float hi,
                                const Blocking *bl, int64_t c0, int64_t c1, int64_t r0, int64_t r1, int64_t oh0, int64_t oh1) {
    int64_t khw = KH * KW, M = Cout * khw, N = H * W, P = OH * OW;
    Epilogue e = epilogue_of(bias, NULL, res, P, act, lo, hi);
    if ((KH - 1) * DH < SH && (KW - 1) * DW < SW) {
        conv_transpose_disjoint(x, A, y, H, W, Cout, Cin, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, &e, bl, c0, c1, r0, r1, oh0, oh1);
        return;
    }
    int64_t i0 = c0 * khw, i1 = c1 * khw, n0 = r0 * W, n1 = r1 * W, ld = n1 - n0;
    float *cols = scratch(3, (size_t)((i1 - i0) * ld));
    if (!cols) return; /* (recorded by scratch) */
    Bsource B = {NULL, x, N, 1, NULL};
    /* kiln_gemm_block writes C[i, j] (rows i0 .. i1, columns n0 .. n1) at cols + (i - i0) * ld + j - n0. */
    if (n0 < n1) kiln_gemm_block(A, &B, cols - i0 * ld - n0, ld, 16, M, N, Cin, i0, i1, n0, n1, NULL, bl);
    for (int64_t co = c0; co < c1; co++) {
        float *plane = y + co * P;
        memset(plane + oh0 * OW, 0, (size_t)((oh1 - oh0) * OW) * sizeof(float));
        for (int64_t kh = 0; kh < KH; kh++) {
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *row = cols + ((co * KH + kh) * KW + kw - i0) * ld;
                for (int64_t ih = r0; ih < r1; ih++) {
                    int64_t oh = ih * SH + kh * DH - PH;
                    if (oh < oh0 || oh >= oh1) continue;
                    float *orow = plane + oh * OW;
                    const float *src = row + (ih - r0) * W;
                    for (int64_t iw = 0; iw < W; iw++) {
                        int64_t ow = iw * SW + kw * DW - PW;
                        if (ow >= 0 && ow < OW) orow[ow] += src[iw];
                    }
                }
            }
        }
        int64_t p = oh0 * OW, p1 = oh1 * OW;
        for (; p + 16 <= p1; p += 16) store16(plane + p, finish(load16(plane + p), &e, co, p));
        for (; p < p1; p++) plane[p] = finish1(plane[p], &e, co, p);
    }
}

void kiln_uk_conv_transpose(int64_t x_, int64_t wp_, int64_t bias_, int64_t res_, int64_t y_, int64_t Cin, int64_t H, int64_t W,
                            int64_t Cout, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                            int64_t OH, int64_t OW, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks,
                            int64_t split_rows, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_, *wp = (const float *)(intptr_t)wp_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    int64_t khw = KH * KW, N = H * W, P = OH * OW;
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
        const float *xi = x + img * Cin * N, *ri = res ? res + img * Cout * P : NULL;
        float *yi = y + img * Cout * P;
        if (split_rows) {
            int64_t r0 = H * q / chunks, r1 = H * (q + 1) / chunks;
            int64_t oh0 = q == 0 ? 0 : r0 * SH - PH, oh1 = q == chunks - 1 ? OH : r1 * SH - PH;
            oh0 = oh0 < 0 ? 0 : oh0 > OH ? OH : oh0;
            oh1 = oh1 < oh0 ? oh0 : oh1 > OH ? OH : oh1;
            conv_transpose_rows(xi, &A, bias, ri, yi, Cin, H, W, Cout, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, act, lo, hi, &bl,
                                0, Cout, r0, r1, oh0, oh1);
        } else {
            int64_t c0, c1;
            chunk_range(Cout, step, chunks, q, &c0, &c1);
            if (c0 >= c1) continue;
            conv_transpose_rows(xi, &A, bias, ri, yi, Cin, H, W, Cout, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, act, lo, hi, &bl,
                                c0, c1, 0, H, 0, OH);
        }
    }
}
