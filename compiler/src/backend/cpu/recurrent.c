/* Recurrent layers (ONNX RNN, GRU and LSTM) on the CPU: one call runs a layer's whole time loop,
 * one direction a work unit, the weights resident in the constant the compiler packed and the
 * state in scratch. Unrolled into kernels per step (passes/decompose/rnn.rs), every gate of
 * every step costs a launch and a round trip through memory; here a step is one matrix-vector
 * product over the state and the gate arithmetic on vectors.
 *
 * Per direction the compiler packs (floats; Hp = hidden rounded up to 16, GHp = gates * Hp, gate
 * g's columns starting at g * Hp so that gate vectors are whole):
 *   wp    W^T [input, GHp] in NR-column strips, as kiln_uk_gemm reads a packed B;
 *   rt    R^T [hidden, GHp], row-major;
 *   bias  [GHp]: input bias plus recurrent bias (a GRU with linear_before_reset keeps its
 *         candidate's recurrent bias apart: it is inside the reset product);
 *   rbh   [Hp]: that candidate recurrent bias (zeros otherwise);
 *   peep  [3 * Hp]: LSTM peepholes i, o, f (zeros without).
 * The padding lanes hold zeros, so padded state lanes stay zero and never feed a real one.
 * Gate order is ONNX's: GRU z, r, h; LSTM i, o, f, c. The activations are ONNX's defaults
 * (sigmoid, tanh), computed here as polynomials over 16 lanes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "workspace.h"
#include "ukernel.h"

#define NR 32

enum { CELL_SIMPLE = 0, CELL_GRU = 1, CELL_LSTM = 2 };
enum { DIR_FORWARD = 0, DIR_REVERSE = 1, DIR_BIDIRECTIONAL = 2 };


static inline v16 vsigmoid(v16 x) { return splat(1.0f) / (splat(1.0f) + vexp(-x)); }

/* tanh from e^(-2|x|), its sign put back; below 1/16 an odd Taylor polynomial, where 1 - e^(-2|x|)
 * would lose the leading digits. */
static inline v16 vtanh(v16 x) {
    v16i sign_bit = (v16i)splat(-0.0f);
    v16 a = (v16)((v16i)x & ~sign_bit);
    v16 e = vexp(a * splat(-2.0f));
    v16 big = (splat(1.0f) - e) / (splat(1.0f) + e);
    v16 x2 = a * a;
    v16 small = a * (splat(1.0f) + x2 * (splat(-1.0f / 3.0f) + x2 * (splat(2.0f / 15.0f) + x2 * splat(-17.0f / 315.0f))));
    v16 t = select_where(a < splat(0.0625f), small, big);
    return (v16)((v16i)t | ((v16i)x & sign_bit));
}

/* out[b, 0 .. 16 nv) = sum_k h[b, k] * rt[k, 0 .. 16 nv) for nb state rows: nv independent FMA
 * chains along the state. Inlined with nv constant. */
static inline __attribute__((always_inline)) void mv_cols(int nv, const float *h, int64_t ldh, int64_t nb, const float *rt, int64_t ldr,
                                                         int64_t K, float *out, int64_t ldo) {
    for (int64_t b = 0; b < nb; b++) {
        v16 acc[8];
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) acc[v] = splat(0.0f);
        const float *hb = h + b * ldh;
        for (int64_t k = 0; k < K; k++) {
            v16 hv = splat(hb[k]);
            const float *row = rt + k * ldr;
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) acc[v] += hv * load16(row + 16 * v);
        }
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) store16(out + b * ldo + 16 * v, acc[v]);
    }
}

/* out[b, c0 .. c1) = h[b, 0 .. K) * rt[0 .. K, c0 .. c1) (c0 and c1 multiples of 16). */
static void matvec(const float *h, int64_t ldh, int64_t nb, const float *rt, int64_t ldr, int64_t K, int64_t c0, int64_t c1, float *out,
                   int64_t ldo) {
    int64_t c = c0;
    for (; c + 128 <= c1; c += 128) mv_cols(8, h, ldh, nb, rt + c, ldr, K, out + c, ldo);
    if (c + 64 <= c1) {
        mv_cols(4, h, ldh, nb, rt + c, ldr, K, out + c, ldo);
        c += 64;
    }
    if (c + 32 <= c1) {
        mv_cols(2, h, ldh, nb, rt + c, ldr, K, out + c, ldo);
        c += 32;
    }
    if (c + 16 <= c1) mv_cols(1, h, ldh, nb, rt + c, ldr, K, out + c, ldo);
}

/* One layer: x [seq, batch, input] (or [batch, seq, input] with batch_first); h0, c0 (or 0) and
 * Y_h, Y_c [dirs, batch, hidden] (or [batch, dirs, hidden]); Y [seq, dirs, batch, hidden] (or
 * [batch, seq, dirs, hidden]); any result may be 0 (not wanted). Work units: directions.
 * kc, mc, nc: the input projection's GEMM blocking. */
void kiln_uk_recurrent(int64_t x_, int64_t packed_, int64_t h0_, int64_t c0_, int64_t y_, int64_t yh_, int64_t yc_, int64_t cell,
                       int64_t lbr, int64_t input_forget, int64_t direction, int64_t batch_first, int64_t seq, int64_t batch,
                       int64_t input, int64_t hidden, int64_t kc, int64_t mc, int64_t nc, int64_t wg_begin, int64_t wg_end) {
    const float *packed = (const float *)(intptr_t)packed_;
    const float *h0 = (const float *)(intptr_t)h0_, *c0 = (const float *)(intptr_t)c0_;
    float *y = (float *)(intptr_t)y_, *yh = (float *)(intptr_t)yh_, *yc = (float *)(intptr_t)yc_;
    int64_t G = cell == CELL_SIMPLE ? 1 : cell == CELL_GRU ? 3 : 4;
    int64_t Hp = (hidden + 15) / 16 * 16, GHp = G * Hp;
    int64_t dirs = direction == DIR_BIDIRECTIONAL ? 2 : 1;
    int64_t wp_len = (GHp + NR - 1) / NR * NR * input;
    int64_t per_dir = wp_len + hidden * GHp + GHp + Hp + 3 * Hp;
    int64_t rows = seq * batch;
    /* Projections of every step, then the state, the cell, the reset state, the recurrent sums. */
    size_t floats = (size_t)(rows * GHp + 3 * batch * Hp + batch * GHp);
    float *buf = scratch(0, floats);
    if (!buf) return; /* out of memory, recorded by scratch */
    float *proj = buf, *h = proj + rows * GHp, *c = h + batch * Hp, *rh = c + batch * Hp, *gr = rh + batch * Hp;
    for (int64_t d = wg_begin; d < wg_end; d++) {
        int reverse = direction == DIR_REVERSE || d == 1;
        const float *wp = packed + d * per_dir, *rt = wp + wp_len, *bias = rt + hidden * GHp, *rbh = bias + GHp, *peep = rbh + Hp;
        /* Every step's input projection at once; rows in x's order. */
        kiln_uk_gemm(x_, (int64_t)(intptr_t)wp, (int64_t)(intptr_t)bias, 0, (int64_t)(intptr_t)proj, rows, GHp, input, input, 1, 0, 0.0f,
                     0.0f, kc, mc, nc, 1, 1, 0, 0, 1);
        memset(h, 0, (size_t)(3 * batch * Hp) * sizeof(float));
        for (int64_t b = 0; b < batch; b++) {
            int64_t s = batch_first ? (b * dirs + d) * hidden : (d * batch + b) * hidden;
            if (h0) memcpy(h + b * Hp, h0 + s, (size_t)hidden * sizeof(float));
            if (c0) memcpy(c + b * Hp, c0 + s, (size_t)hidden * sizeof(float));
        }
        for (int64_t step = 0; step < seq; step++) {
            int64_t t = reverse ? seq - 1 - step : step;
            if (cell == CELL_GRU && !lbr) {
                /* z and r first: the candidate's recurrent product reads r * h. */
                matvec(h, Hp, batch, rt, GHp, hidden, 0, 2 * Hp, gr, GHp);
                for (int64_t b = 0; b < batch; b++) {
                    const float *p = proj + (batch_first ? b * seq + t : t * batch + b) * GHp, *g = gr + b * GHp;
                    for (int64_t j = 0; j < Hp; j += 16) {
                        v16 r = vsigmoid(load16(p + Hp + j) + load16(g + Hp + j));
                        store16(rh + b * Hp + j, r * load16(h + b * Hp + j));
                    }
                }
                matvec(rh, Hp, batch, rt, GHp, hidden, 2 * Hp, 3 * Hp, gr, GHp);
            } else {
                matvec(h, Hp, batch, rt, GHp, hidden, 0, GHp, gr, GHp);
            }
            for (int64_t b = 0; b < batch; b++) {
                const float *p = proj + (batch_first ? b * seq + t : t * batch + b) * GHp, *g = gr + b * GHp;
                float *hb = h + b * Hp, *cb = c + b * Hp;
                for (int64_t j = 0; j < Hp; j += 16) {
                    v16 hv = load16(hb + j);
                    if (cell == CELL_SIMPLE) {
                        hv = vtanh(load16(p + j) + load16(g + j));
                    } else if (cell == CELL_GRU) {
                        v16 z = vsigmoid(load16(p + j) + load16(g + j));
                        v16 cand;
                        if (lbr) {
                            v16 r = vsigmoid(load16(p + Hp + j) + load16(g + Hp + j));
                            cand = vtanh(load16(p + 2 * Hp + j) + r * (load16(g + 2 * Hp + j) + load16(rbh + j)));
                        } else {
                            cand = vtanh(load16(p + 2 * Hp + j) + load16(g + 2 * Hp + j));
                        }
                        hv = cand + z * (hv - cand);
                    } else {
                        v16 cv = load16(cb + j);
                        v16 i = vsigmoid(load16(p + j) + load16(g + j) + load16(peep + j) * cv);
                        v16 f = input_forget ? splat(1.0f) - i : vsigmoid(load16(p + 2 * Hp + j) + load16(g + 2 * Hp + j) + load16(peep + 2 * Hp + j) * cv);
                        v16 cand = vtanh(load16(p + 3 * Hp + j) + load16(g + 3 * Hp + j));
                        cv = f * cv + i * cand;
                        v16 o = vsigmoid(load16(p + Hp + j) + load16(g + Hp + j) + load16(peep + Hp + j) * cv);
                        hv = o * vtanh(cv);
                        store16(cb + j, cv);
                    }
                    store16(hb + j, hv);
                }
                if (y) {
                    int64_t at = batch_first ? ((b * seq + t) * dirs + d) * hidden : ((t * dirs + d) * batch + b) * hidden;
                    memcpy(y + at, hb, (size_t)hidden * sizeof(float));
                }
            }
        }
        for (int64_t b = 0; b < batch; b++) {
            int64_t s = batch_first ? (b * dirs + d) * hidden : (d * batch + b) * hidden;
            if (yh) memcpy(yh + s, h + b * Hp, (size_t)hidden * sizeof(float));
            if (yc) memcpy(yc + s, c + b * Hp, (size_t)hidden * sizeof(float));
        }
    }
}
