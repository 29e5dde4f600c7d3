/* The channel-blocked depthwise convolution's inner loops, shared by the float kernel
 * (depthwise.c) and the integer one (quantized.c, on exact float sums): one vector is one
 * position's 16 channels, so every lane is used whatever the plane's width or the stride. */
#ifndef KILN_DEPTHWISE_H
#define KILN_DEPTHWISE_H
#include <string.h>
#include "simd.h"

/* The zero-padded channel-blocked plane of the NCHW forms: Hp x Wp positions of 16 floats, every
 * row and column a window reaches. */
static inline void dw_plane_size(int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW,
                                 int64_t PH, int64_t PW, int64_t OH, int64_t OW, int64_t *Hp, int64_t *Wp) {
    *Hp = (OH - 1) * SH + (KH - 1) * DH + 1;
    *Wp = (OW - 1) * SW + (KW - 1) * DW + 1;
    if (*Hp < PH + H) *Hp = PH + H;
    if (*Wp < PW + W) *Wp = PW + W;
}

/* Rows r0 .. r0 + Hb of the zero-padded channel-blocked plane (Hb rows of Wp positions): its
 * rows outside the input rows ih_a .. ih_b and its columns left and right of the input are
 * zeros, the same for every block of channels, so cleared once. The whole plane is r0 = 0,
 * Hb = Hp, input rows 0 .. H; a band of output rows has its own. */
static inline void dw_clear_band(float *xb, int64_t r0, int64_t Hb, int64_t Wp, int64_t W, int64_t PH, int64_t PW, int64_t ih_a,
                                 int64_t ih_b) {
    for (int64_t r = 0; r < Hb; r++) {
        int64_t ih = r0 + r - PH;
        float *row = xb + r * Wp * 16;
        if (ih < ih_a || ih >= ih_b) {
            memset(row, 0, (size_t)(Wp * 16) * sizeof(float));
        } else {
            memset(row, 0, (size_t)(PW * 16) * sizeof(float));
            memset(row + (PW + W) * 16, 0, (size_t)((Wp - PW - W) * 16) * sizeof(float));
        }
    }
}

/* Flat input positions p .. p + n (n <= 16), transposed so r[j] holds position p + j's 16
 * channels, stored where they lie in the plane (one division a block, not a position). */
static inline __attribute__((always_inline)) void dw_scatter(float *xb, const v16 *r, int64_t p, int64_t n, int64_t W, int64_t PH,
                                                            int64_t PW, int64_t Wp) {
    int64_t ih = p / W, iw = p % W;
    for (int64_t j = 0; j < n; j++) {
        store16(xb + ((ih + PH) * Wp + iw + PW) * 16, r[j]);
        if (++iw == W) iw = 0, ih++;
    }
}

/* R adjacent outputs of a channel-blocked depthwise row, every tap inside the input: acc[j] +=
 * tap * x at the tap's position, 16 channels a vector, aligned loads. Inlined with R constant. */
static inline __attribute__((always_inline)) void dw_blocked_run(int R, v16 *acc, const float *row0, int64_t kh0, int64_t kh1,
                                                                 int64_t KW, int64_t row_step, int64_t tap_step, int64_t out_step,
                                                                 const v16 *wv) {
#pragma GCC unroll 5
    for (int64_t kh = kh0; kh < kh1; kh++) {
        const float *row = row0 + kh * row_step;
#pragma GCC unroll 5
        for (int64_t kw = 0; kw < KW; kw++) {
            v16 wt = wv[kh * KW + kw];
            const float *p = row + kw * tap_step;
#pragma GCC unroll 8
            for (int j = 0; j < R; j++) acc[j] += wt * load16(p + j * out_step);
        }
    }
}

/* R adjacent outputs of a row of a zero-padded channel-blocked plane (every tap inside it), from
 * the bias, stored to y. Inlined with R constant. */
static inline __attribute__((always_inline)) void dw_padded_run(int R, v16 bv, const float *row0, float *y, int64_t KH, int64_t KW,
                                                               int64_t row_step, int64_t tap_step, int64_t out_step, const v16 *wv) {
    v16 acc[4] = {bv, bv, bv, bv};
    dw_blocked_run(R, acc, row0, 0, KH, KW, row_step, tap_step, out_step, wv);
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) store16(y + j * 16, acc[j]);
}

/* Every output of one block of 16 channels from its zero-padded channel-blocked plane xb (rows
 * Wp positions long) into yb [OH, OW, 16]; inlined with the window's size constant where it is
 * a usual one. */
static inline __attribute__((always_inline)) void dw_padded_plane(const float *xb, float *yb, v16 bv, const v16 *wv, int64_t KH, int64_t KW,
                                                                 int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t Wp, int64_t OH,
                                                                 int64_t OW) {
    int64_t rs = DH * Wp * 16, ts = DW * 16, os = SW * 16;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *row0 = xb + oh * SH * Wp * 16;
        float *yrow = yb + oh * OW * 16;
        int64_t ow = 0;
        for (; ow + 4 <= OW; ow += 4) dw_padded_run(4, bv, row0 + ow * os, yrow + ow * 16, KH, KW, rs, ts, os, wv);
        const float *at0 = row0 + ow * os;
        float *yo = yrow + ow * 16;
        /* (Constant counts: a store loop of a variable count became a `rep movs`.) */
        if (OW - ow == 3) dw_padded_run(3, bv, at0, yo, KH, KW, rs, ts, os, wv);
        else if (OW - ow == 2) dw_padded_run(2, bv, at0, yo, KH, KW, rs, ts, os, wv);
        else if (OW - ow == 1) dw_padded_run(1, bv, at0, yo, KH, KW, rs, ts, os, wv);
    }
}

#endif
