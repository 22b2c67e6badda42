/*
 * arch/scalar/matmul.h - the scalar float-activation matmul (kernels.h): the reference of every ISA
 * path, and cb_matmul itself where the ISA has no vector primitives (arch/fallback.h). Plain loops,
 * one output row at a time; f32 and f16 rows summed as cb_dot sums (eight partial sums, one reduction
 * tree: cb_dot_isa and cb_scores_f16_isa give those bits on every ISA, so the float matrices of a blob
 * with integer matmuls run vector code and still give the same bits everywhere), int8 rows in input
 * order. Included by kernels.c only.
 */
#ifndef CB_ARCH_SCALAR_MATMUL_H
#define CB_ARCH_SCALAR_MATMUL_H

#include "../../kernels_outl.h"

/* sum_g scale[r][g] * sum_{c in g} q[r][c] * x[c], the outliers not included */
static float cb_row_dot(const cb_tensor *t, size_t r, const float *x)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    float dot = 0.0f;
    if (t->dtype == CB_F32)
        return cb_dot((const float *)row, x, cols);
    if (t->dtype == CB_F16) {
        cb_scores_f16_isa(&dot, x, (const uint16_t *)row, 0, 1, cols, 1.0f);
        return dot;
    }
    const int8_t *q = (const int8_t *)row;
    for (size_t g = 0, c = 0; g < t->n_groups; g++) {
        size_t end = c + t->group_size < cols ? c + t->group_size : cols;
        float acc = 0.0f;
        for (; c < end; c++)
            acc += (float)q[c] * x[c];
        dot += cb_scale(t, r, g) * acc;
    }
    return dot;
}


void cb_matmul_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                      const float *alpha, int accumulate)
{
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;
    if (t->dtype == CB_F16) { /* eight rows a call, each row's dot as cb_row_dot's (f16 has no corrections) */
        for (size_t r = r0; r < r1; r += 8) {
            float dot[8];
            const size_t m = r1 - r < 8 ? r1 - r : 8;
            const uint16_t *rows = (const uint16_t *)(const void *)(t->data + r * t->row_stride);
            for (size_t j = 0; j < n; j++) {
                cb_scores_f16_isa(dot, x[j], rows, t->row_stride / sizeof(uint16_t), m, t->cols, 1.0f);
                for (size_t i = 0; i < m; i++)
                    (void)cb_finish(t, o, r + i, x[j], dot[i], alpha[j], y[j], accumulate);
            }
        }
        return;
    }
    for (size_t r = r0; r < r1; r++, o = next) /* rows outside, tokens inside: each row is read once */
        for (size_t j = 0; j < n; j++)
            next = cb_finish(t, o, r, x[j], cb_row_dot(t, r, x[j]), alpha[j], y[j], accumulate);
}

void cb_matvec_scalar(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    cb_matmul_scalar(t, 0, t->rows, 1, &x, &y, &alpha, accumulate);
}

#endif /* CB_ARCH_SCALAR_MATMUL_H */
