/* The 16-float vectors kiln's C kernels (ukernel.c, recurrent.c) compute with: GCC vector types,
 * so the compiler picks the instructions for the level each object is built for (AVX-512: one
 * register; AVX2: two; baseline: four). */
#ifndef KILN_SIMD_H
#define KILN_SIMD_H
#include <stdint.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16 load16(const float *p) { return *(const v16u *)p; }
static inline void store16(float *p, v16 v) { *(v16u *)p = v; }

/* All 16 lanes x (an initialiser, not x + 0, which costs an add: -0.0 + 0 is +0). */
static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
/* b where `m` is set, else a (C has no vector ?:). */
static inline v16 select_where(v16i m, v16 b, v16 a) { return (v16)((m & (v16i)b) | (~m & (v16i)a)); }

#endif
