/*
 * arch/scalar/q8.h - the scalar integer matmul (kernels.h "Integer matmuls"): the reference of every
 * ISA path, reading both layouts, and what arch/fallback.h maps every integer kernel an ISA lacks to.
 * Included by kernels_q8.c only, after the ISA's q8.h (whose row dot cb_dot32_isa it calls).
 */
#ifndef CB_ARCH_SCALAR_Q8_H
#define CB_ARCH_SCALAR_Q8_H

#include "../../kernels_outl.h"

/* Block b of cb_quantize_q8 from its len <= CB_ACT_BLOCK values at x; q zero-padded to the whole block. */
static inline void cb_quantize_part(const float *x, size_t len, int8_t *q, float *d, int32_t *s)
{
    float amax = 0.0f;
    for (size_t k = 0; k < len; k++) {
        float a = x[k] < 0.0f ? -x[k] : x[k];
        amax = a > amax ? a : amax; /* a NaN is skipped; its q is 0 below */
    }
    if (!(amax >= 0x1p-100f)) /* a block this small is zero (127 / amax would overflow near 1e-37) */
        amax = 0.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (size_t k = 0; k < CB_ACT_BLOCK; k++) {
        int32_t v = 0;
        if (k < len) {
            float f = x[k] * id;
            f = f + (f >= 0.0f ? 0.5f : -0.5f);
            v = f > -128.0f && f < 128.0f ? (int32_t)f : 0; /* truncation: round half away from zero */
            v = v > 127 ? 127 : v < -127 ? -127 : v;
        }
        q[k] = (int8_t)v;
        sum += v;
    }
    *d = amax / 127.0f;
    *s = sum;
}

/* one whole block */
static inline void cb_quantize_block_scalar(const float *x, int8_t *q, float *d, int32_t *s)
{
    cb_quantize_part(x, CB_ACT_BLOCK, q, d, s);
}

/* the int32 dot of 32 weights of a row-major row with 32 activations */
static inline int32_t cb_dot32_scalar(const int8_t *w, const int8_t *q)
{
    int32_t sum = 0;
    for (size_t c = 0; c < CB_ACT_BLOCK; c++)
        sum += w[c] * q[c];
    return sum;
}

/* The exact int32 dot of row r's block b with the block's activations. */
static int32_t cb_block_isum(const cb_tensor *t, size_t r, size_t b, const int8_t *q)
{
    const int8_t *w = (const int8_t *)t->data;
    if (!t->tiled)
        return cb_dot32_isa(w + r * t->row_stride + b * CB_ACT_BLOCK, q);
    int32_t sum = 0;
    w += (r / CB_TILE_ROWS) * CB_TILE_ROWS * t->cols + b * CB_ACT_BLOCK * CB_TILE_ROWS + 4 * (r % CB_TILE_ROWS);
    for (size_t c = 0; c < CB_ACT_BLOCK; c += 4, w += 4 * CB_TILE_ROWS)
        sum += w[0] * q[c] + w[1] * q[c + 1] + w[2] * q[c + 2] + w[3] * q[c + 3];
    return sum;
}

void cb_matmul_q8_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;
    for (size_t r = r0; r < r1; r++, o = next)
        for (size_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (size_t b = 0; b < blocks; b++) {
                float f = (float)cb_block_isum(t, r, b, xq[j].q + b * CB_ACT_BLOCK);
                f = f * xq[j].d[b];
                f = f * cb_scale(t, r, b / per_group);
                acc = acc + f;
            }
            next = cb_finish(t, o, r, x[j], acc, alpha[j], y[j], accumulate);
        }
}

#endif /* CB_ARCH_SCALAR_Q8_H */
