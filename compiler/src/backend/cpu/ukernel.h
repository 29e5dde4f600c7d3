/* The entry points of the microkernel (gemm.c) that kiln's other C kernels call, declared once so
 * the compiler checks every caller against the definition. */
#ifndef KILN_UKERNEL_H
#define KILN_UKERNEL_H
#include <stdint.h>

/* C[M, N] = A[M, K] * B[K, N] (+ bias per column, + residual [M, N], activation), A strided, B
 * packed at compile time (f32, or bf16 pairs with `bf16`). */
void kiln_uk_gemm(int64_t a_, int64_t bp_, int64_t bias_, int64_t res_, int64_t y_, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ka, int64_t act, float lo, float hi, int64_t kc, int64_t mc, int64_t nc, int64_t chunks, int64_t split_n,
                  int64_t bf16, int64_t wg_begin, int64_t wg_end);

#endif
