/*
 * test_tall.h - the integer kernel tests' decode over a matrix taller than a decode buffer (kernels_outl.h
 * CB_DECODE_ROWS: the sums of up to that many rows, then their corrections, then their stores). Included by
 * kernels_q8_test.c and kernels_q4_test.c on Linux targets: the MCUs' paths have no decode buffer, and the
 * matrix is larger than their pool.
 */
#ifndef CB_TEST_TALL_H
#define CB_TEST_TALL_H

#include <string.h>

#include "../src/kernels.h"
#include "../src/kernels_outl.h"

#define TALL_ROWS (2u * CB_DECODE_ROWS + 37u)  /* three decode buffers, rows past the last tile or row group */
#define TALL_SPLIT (CB_DECODE_ROWS / 2u + 16u) /* a tile boundary that is not a buffer's */
#define TALL_PAD 16u                           /* rows past the matrix, which must keep TALL_SENTINEL */
#define TALL_SENTINEL 12345.0f

typedef void (*tall_matmul)(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                            const float *const *x, float *const *y, const float *alpha, int accumulate);

/* One token over the TALL_ROWS rows: def (the scalar kernel) on ref, then the ISA path (cb_matmul_q8) on isa
 * over all rows and split at TALL_SPLIT. Returns 0 when both give def's bits in every row and none writes
 * past the rows; else 1 (all rows), 2 (split) or 3 (a write past the rows), with the row, the value and
 * def's. */
static int tall_decode(tall_matmul def, const cb_tensor *ref, const cb_tensor *isa, const cb_xq *xq, const float *x,
                       int accumulate, size_t *row, float *got, float *want)
{
    static float yv[3][TALL_ROWS + TALL_PAD];
    const float *xs[1] = {x};
    float *y[3] = {yv[0], yv[1], yv[2]};
    const float alpha = 0.75f;
    for (int v = 0; v < 3; v++)
        for (size_t i = 0; i < TALL_ROWS + TALL_PAD; i++)
            yv[v][i] = i < TALL_ROWS ? (float)(i % 7) - 3.0f : TALL_SENTINEL;
    def(ref, 0, TALL_ROWS, 1, xq, xs, &y[0], &alpha, accumulate);
    cb_matmul_q8(isa, 0, TALL_ROWS, 1, xq, xs, &y[1], &alpha, accumulate);
    cb_matmul_q8(isa, 0, TALL_SPLIT, 1, xq, xs, &y[2], &alpha, accumulate);
    cb_matmul_q8(isa, TALL_SPLIT, TALL_ROWS, 1, xq, xs, &y[2], &alpha, accumulate);
    for (size_t i = 0; i < TALL_ROWS + TALL_PAD; i++)
        for (int v = 1; v < 3; v++)
            if (memcmp(&yv[v][i], &yv[0][i], sizeof(float)) != 0) {
                *row = i;
                *got = yv[v][i];
                *want = yv[0][i];
                return v;
            }
    for (size_t i = TALL_ROWS; i < TALL_ROWS + TALL_PAD; i++)
        if (yv[0][i] != TALL_SENTINEL) {
            *row = i;
            *got = yv[0][i];
            *want = TALL_SENTINEL;
            return 3;
        }
    return 0;
}

static const char *const tall_what[4] = {"", "tall decode", "tall decode split", "write beyond rows"};

#endif /* CB_TEST_TALL_H */
