/* AMX tiles as kiln's kernels use them (conv.c's bf16 direct convolution, gemm.c's bf16 GEMM,
 * quantized.c's integer convolution and dynamically quantized product). Only the AVX-512
 * objects build them, in functions built for `amx-tile` and the product's feature; the planner
 * picks them where the host has AMX and Linux granted the tile state (ukernel/host.rs). Tile
 * numbers are immediates, hence the macros. */
#ifndef KILN_AMX_H
#define KILN_AMX_H
#include <stdint.h>
#include <string.h>

/* The tile configuration (palette 1): each tile's rows and bytes a row. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* The one layout: tiles 0-3 16 x 16 accumulators of 32 bits, 4 and 5 A tiles of 16 rows of
 * `a_bytes` (a step's K, 4 bytes a group of products), 6 and 7 B tiles of `b_rows` rows (the
 * step's groups) of 64 bytes (16 columns). */
static inline TileConfig amx_layout(int64_t a_bytes, int64_t b_rows) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t >= 6 ? (uint8_t)b_rows : 16;
        cfg.colsb[t] = t == 4 || t == 5 ? (uint16_t)a_bytes : 64;
    }
    return cfg;
}

#define AMX_ZERO_ACCUMULATORS() \
    do {                        \
        _tile_zero(0);          \
        _tile_zero(1);          \
        _tile_zero(2);          \
        _tile_zero(3);          \
    } while (0)

/* One step of a 32 x 32 block: B tiles 6 and 7 from b0 and b1, A tiles 4 and 5 from a0 and a1
 * (strides in bytes), and DP (a tile product: _tile_dpbsud, _tile_dpbf16ps...) into 0 (a0 b0),
 * 1 (a0 b1), 2 (a1 b0) and 3 (a1 b1). */
#define AMX_STEP_2X2(DP, a0, a1, a_stride, b0, b1, b_stride) \
    do {                                                     \
        _tile_loadd(6, b0, b_stride);                        \
        _tile_loadd(7, b1, b_stride);                        \
        _tile_loadd(4, a0, a_stride);                        \
        _tile_loadd(5, a1, a_stride);                        \
        DP(0, 4, 6);                                         \
        DP(1, 4, 7);                                         \
        DP(2, 5, 6);                                         \
        DP(3, 5, 7);                                         \
    } while (0)

/* The 32 x 32 block of 32-bit sums into `sums` (32 a row), as AMX_STEP_2X2 placed them. */
#define AMX_STORE_2X2(sums)                          \
    do {                                             \
        _tile_stored(0, (sums), 128);                \
        _tile_stored(1, (sums) + 16, 128);           \
        _tile_stored(2, (sums) + 16 * 32, 128);      \
        _tile_stored(3, (sums) + 16 * 32 + 16, 128); \
    } while (0)

#endif
