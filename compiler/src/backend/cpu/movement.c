/* kiln's data-movement kernels for the CPU: a transpose that moves the last axis, which a loop
 * nest can only do one element at a time (strided reads or strided writes).
 *
 * A permutation that swaps two adjacent groups of axes, the last among them, is a batch of 2-D
 * transposes: x seen as [batch, R, C] becomes y[batch, C, R] (NCHW -> NHWC: batch N, R = C,
 * C = H*W). Each 16 x 16 block goes through registers: 16 row loads, four rounds of interleaves
 * (a perfect shuffle: after log2(16) rounds row j holds column j), 16 row stores; edge blocks
 * load and store masked. Elements are 32-bit (float or int32: only their bits move). */
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"
#include "workspace.h"

/* y[b, j, i] = x[b, i, j] for x [batch, R, C]. Work units: batch x chunks of C (y's rows). */
void kiln_uk_transpose(int64_t x_, int64_t y_, int64_t batch, int64_t R, int64_t C, int64_t chunks, int64_t wg_begin, int64_t wg_end) {
    const float *x = (const float *)(intptr_t)x_;
    float *y = (float *)(intptr_t)y_;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t b = u / chunks, q = u % chunks;
        int64_t j0, j1;
        chunk_range(C, 16, chunks, q, &j0, &j1);
        const float *xb = x + b * R * C;
        float *yb = y + b * R * C;
        for (int64_t j = j0; j < j1; j += 16) {
            int64_t nj = j1 - j < 16 ? j1 - j : 16;
            for (int64_t i = 0; i < R; i += 16) {
                int64_t ni = R - i < 16 ? R - i : 16;
                v16 r[16];
                if (ni == 16 && nj == 16) {
                    /* A whole block: straight-line, the rows stay in registers. */
#pragma GCC unroll 16
                    for (int k = 0; k < 16; k++) r[k] = load16(xb + (i + k) * C + j);
                    transpose16(r);
#pragma GCC unroll 16
                    for (int k = 0; k < 16; k++) store16(yb + (j + k) * R + i, r[k]);
                    continue;
                }
                for (int64_t k = 0; k < 16; k++) r[k] = k < ni ? load16_n(xb + (i + k) * C + j, nj) : splat(0.0f);
                transpose16(r);
                for (int64_t k = 0; k < nj; k++) store16_n(yb + (j + k) * R + i, r[k], ni);
            }
        }
    }
}
