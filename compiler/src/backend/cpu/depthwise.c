/* kiln's f32 depthwise convolution (kiln_uk_depthwise), in the form the compiler chose:
 * between channel-blocked (NCHW16c) tensors, regrouped per 16 channels through blocked scratch,
 * or along output rows for windows too wide to keep their taps in registers. The loops shared
 * with the integer kernel are depthwise.h's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "depthwise.h"
#include "workspace.h"
#include "tile.h"

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

/* One block of 16 channels of a depthwise convolution between channel-blocked tensors, its output
 * rows oh_a .. oh_b: xb [H, W, 16], the taps wv[KH*KW] (each a vector of 16 channels), yb [OH,
 * OW, 16], rb the residual in yb's layout or NULL. Each vector is one position's 16 channels, so every lane is used whatever
 * the image's width (a 7x7 plane wastes 9 of 16 lanes along rows) and every load is aligned.
 * Outputs whose window lies inside the row go 4 at a time (4 FMA chains), the others one at a
 * time with their taps clipped; rows clip their taps to the rows the input has. */
static inline __attribute__((always_inline)) void dw_blocked_block(const float *xb, const v16 *wv, v16 bv, const float *rb, float *yb, int64_t H, int64_t W, int64_t KH,
                             int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t oh_a, int64_t oh_b,
                             int64_t OW, const Epilogue *e) {
    /* Columns [ow_a, ow_b) read no padding: ow * SW >= PW and ow * SW - PW + (KW - 1) * DW < W. */
    int64_t ow_a = (PW + SW - 1) / SW;
    int64_t last = W - 1 + PW - (KW - 1) * DW;
    int64_t ow_b = last < 0 ? 0 : last / SW + 1;
    if (ow_a > OW) ow_a = OW;
    if (ow_b > OW) ow_b = OW;
    if (ow_b < ow_a) ow_b = ow_a;
    for (int64_t oh = oh_a; oh < oh_b; oh++) {
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
                if (rrow && !residual_last(e)) v += load16(rrow + (ow + j) * 16);
                v = finish(v, e, 0, 0);
                if (rrow && residual_last(e)) v += load16(rrow + (ow + j) * 16);
                store16(yrow + (ow + j) * 16, v);
            }
            ow += n;
        }
    }
}

/* A depthwise convolution between channel-blocked (NCHW16c) tensors, for channels c0 .. c1
 * (multiples of 16) and output rows oh0 .. oh1: x [C/16, H, W, 16], the taps packed [C/16,
 * KH*KW, 16], y [C/16, OH, OW, 16]. Nothing is copied. */
static void depthwise_blocked(const float *x, const float *wb, const float *bias, const float *res, float *y, int64_t H, int64_t W,
                              int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                              int64_t OH, int64_t OW, int64_t c0, int64_t c1, int64_t oh0, int64_t oh1, const Epilogue *e) {
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
        if (KH == 3 && KW == 3) dw_blocked_block(xb, wv, bv, rb, yb, H, W, 3, 3, SH, SW, DH, DW, PH, PW, oh0, oh1, OW, &ep);
        else if (KH == 5 && KW == 5) dw_blocked_block(xb, wv, bv, rb, yb, H, W, 5, 5, SH, SW, DH, DW, PH, PW, oh0, oh1, OW, &ep);
        else dw_blocked_block(xb, wv, bv, rb, yb, H, W, KH, KW, SH, SW, DH, DW, PH, PW, oh0, oh1, OW, &ep);
    }
}

/* A depthwise convolution between NCHW tensors, for channels c0 .. c1 (c0 a multiple of 16; the
 * taps packed as depthwise_blocked has them, the last block padded with zeros) and output rows
 * oh0 .. oh1: each 16 channels' input rows that the band's windows read (or the fewer channels
 * left) go channel-blocked into a zero-padded scratch band through 16x16 register transposes, so
 * every output's window lies inside it and runs 4 at a time with no clipping; the results come
 * back the same way, adding the residual and clamping on the way out. Rows of 7 used 7 of a
 * vector's 16 lanes, and stride 2 along rows discarded half of each load (1 thread: 960 channels
 * 3x3 on 7x7, 0.103 -> 0.040 ms; 240 channels 5x5/2 on 14x14, 0.073 -> 0.022 ms). The plan's
 * bands keep the scratch within the L2 cache and give large planes of few channels their work
 * units (DBNet's 8 channels of 320x320: 13 MB of scratch as one plane). */
static void depthwise_regrouped(const float *x, const float *wb, const float *bias, const float *res, float *y, int64_t H, int64_t W,
                                int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW,
                                int64_t OH, int64_t OW, int64_t c0, int64_t c1, int64_t oh0, int64_t oh1, const Epilogue *e) {
    int64_t T = KH * KW, P = H * W, Q = OH * OW;
    int64_t Hp, Wp;
    dw_plane_size(H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH, OW, &Hp, &Wp);
    /* The band: the plane's rows r0 .. r0 + Hb, which hold input rows ih_a .. ih_b. */
    int64_t r0 = oh0 * SH, Hb = (oh1 - oh0 - 1) * SH + (KH - 1) * DH + 1, Qb = (oh1 - oh0) * OW;
    int64_t ih_a = r0 - PH > 0 ? r0 - PH : 0, ih_b = r0 - PH + Hb < H ? r0 - PH + Hb : H;
    if (ih_b < ih_a) ih_b = ih_a;
    float *xb = scratch(0, (size_t)(Hb * Wp * 16));
    float *yb = scratch(1, (size_t)(Qb * 16));
    if (!xb || !yb) return; /* (recorded by scratch) */
    /* A local copy: stores through y cannot change it, so its fields stay in registers. */
    Epilogue ep = *e;
    dw_clear_band(xb, r0, Hb, Wp, W, PH, PW, ih_a, ih_b);
    for (int64_t cb = c0 / 16; cb * 16 < c1; cb++) {
        int64_t nc = c1 - cb * 16 < 16 ? c1 - cb * 16 : 16;
        const float *xc = x + cb * 16 * P;
        for (int64_t p = ih_a * W; p < ih_b * W; p += 16) {
            int64_t n = ih_b * W - p < 16 ? ih_b * W - p : 16;
            v16 r[16];
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) r[l] = l < nc ? load16_n(xc + l * P + p, n) : splat(0.0f);
            transpose16(r);
            /* (Row ih lands in the band's row ih + PH - r0.) */
            dw_scatter(xb, r, p, n, W, PH - r0, PW, Wp);
        }
        v16 wv[64];
        for (int64_t t = 0; t < T; t++) wv[t] = load16(wb + (cb * T + t) * 16);
        v16 bv = bias ? load16_n(bias + cb * 16, nc) : splat(0.0f);
        /* The usual windows get copies with their sizes constant: the taps stay in registers
         * and the tap loops unroll (3x3 on 144 channels of 56x56, 1 thread: 0.37 -> 0.30 ms). */
        if (KH == 3 && KW == 3) dw_padded_plane(xb, yb, bv, wv, 3, 3, SH, SW, DH, DW, Wp, oh1 - oh0, OW);
        else if (KH == 5 && KW == 5) dw_padded_plane(xb, yb, bv, wv, 5, 5, SH, SW, DH, DW, Wp, oh1 - oh0, OW);
        else dw_padded_plane(xb, yb, bv, wv, KH, KW, SH, SW, DH, DW, Wp, oh1 - oh0, OW);
        float *yc = y + cb * 16 * Q + oh0 * OW;
        const float *rc = res ? res + cb * 16 * Q + oh0 * OW : NULL;
        for (int64_t q = 0; q < Qb; q += 16) {
            int64_t n = Qb - q < 16 ? Qb - q : 16;
            v16 r[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) r[j] = j < n ? load16(yb + (q + j) * 16) : splat(0.0f);
            transpose16(r);
            for (int l = 0; l < nc; l++) {
                v16 v = r[l];
                if (rc && !residual_last(&ep)) v += load16_n(rc + l * Q + q, n);
                v = finish(v, &ep, 0, 0);
                if (rc && residual_last(&ep)) v += load16_n(rc + l * Q + q, n);
                store16_n(yc + l * Q + q, v, n);
            }
        }
    }
}

/* A depthwise convolution (one input and one output channel a group) in the form the plan chose
 * (`form`): on channel-blocked tensors; regrouped (NCHW tensors, blocks of 16 channels through
 * blocked scratch); or, for windows too wide to keep their taps in registers, vectorised along
 * output rows: per channel the plane is copied once into a zero-padded buffer (with slack past
 * its end), then each 16 outputs of a row take one FMA per window tap; stride 2 reads 32 inputs
 * and keeps the even ones. Work units: images x chunks of channels x `bands` bands of output
 * rows (`chunks` units an image; the rows form has one band). */
void kiln_uk_depthwise(int64_t x_, int64_t w_, int64_t bias_, int64_t res_, int64_t y_, int64_t C, int64_t H, int64_t W, int64_t KH,
                       int64_t KW, int64_t SH, int64_t SW, int64_t DH, int64_t DW, int64_t PH, int64_t PW, int64_t OH, int64_t OW,
                       int64_t act, float lo, float hi, int64_t chunks, int64_t bands, int64_t form, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_, *w = (const float *)(intptr_t)w_;
    const float *bias = (const float *)(intptr_t)bias_, *res = (const float *)(intptr_t)res_;
    float *y = (float *)(intptr_t)y_;
    /* form: 0 NCHW rows (below), 1 channel-blocked tensors, 2 NCHW regrouped per 16 channels. */
    if (form) {
        Epilogue e = epilogue_of(NULL, NULL, NULL, 0, act, lo, hi);
        if (bands < 1) bands = 1;
        for (int64_t u = wg_begin; u < wg_end; u++) {
            int64_t img = u / chunks, q = u % chunks / bands, band = u % chunks % bands, c0, c1, oh0, oh1;
            chunk_range(C, 16, chunks / bands, q, &c0, &c1);
            chunk_range(OH, 1, bands, band, &oh0, &oh1);
            if (c0 < c1 && oh0 < oh1)
                (form == 1 ? depthwise_blocked : depthwise_regrouped)(x + img * C * H * W, w, bias, res ? res + img * C * OH * OW : NULL,
                                                                         y + img * C * OH * OW, H, W, KH, KW, SH, SW, DH, DW, PH, PW, OH,
                                                                         OW, c0, c1, oh0, oh1, &e);
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
                            int last = residual_last(&e);
                            if (n == 16) {
                                if (rc && !last) v += load16(rc + at);
                                v = finish(v, &e, 0, 0);
                                if (rc && last) v += load16(rc + at);
                                store16(yc + at, v);
                            } else {
                                if (rc && !last) v += load16_n(rc + at, n);
                                v = finish(v, &e, 0, 0);
                                if (rc && last) v += load16_n(rc + at, n);
                                store16_n(yc + at, v, n);
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
