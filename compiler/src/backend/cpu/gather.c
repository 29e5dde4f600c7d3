/* kiln's row gather (kiln_uk_gather_rows): a Gather along axis 0 as whole-row copies. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "workspace.h"

/* Gather along axis 0: output row i is data row idx[i] (negative indices count from the end;
 * one outside the table fails the run and is clamped into it, as kiln's generated gathers do),
 * copied whole. Any element type:
 * rows are bytes. Work units: chunks of the indices. */
void kiln_uk_gather_rows(int64_t data_, int64_t idx_, int64_t y_, int64_t rows, int64_t row_bytes, int64_t n_idx, int64_t idx64, int64_t chunks,
                         int64_t wg_begin, int64_t wg_end) {
    const char *data = (const char *)(intptr_t)data_;
    const void *idx = (const void *)(intptr_t)idx_;
    char *y = (char *)(intptr_t)y_;
    for (int64_t u = wg_begin; u < wg_end; u++) {
        int64_t i0, i1;
        chunk_range(n_idx, 1, chunks, u, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) {
            int64_t v = idx64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
            if (v < 0) v += rows;
            if (v < 0 || v >= rows) {
                kiln_fail(KILN_STATUS_INDEX, 0); /* the run fails; the copy stays in bounds */
                v = v < 0 ? 0 : rows - 1;
            }
            memcpy(y + i * row_bytes, data + v * row_bytes, (size_t)row_bytes);
        }
    }
}
