/*
 * arch/scalar/q16.h - the int16 matmul's scalar pieces (kernels.h "int16 matmuls"): a block's quantization
 * (every ISA uses it) and the block dots, the reference of every ISA's and what arch/fallback.h maps them to.
 * Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_SCALAR_Q16_H
#define CB_ARCH_SCALAR_Q16_H

#define CB_Q16_ROWS 8u /* rows of one cb_q16_isums call */

#if defined(__GNUC__)
#define CB_Q16_INLINE static inline __attribute__((always_inline))
#else
#define CB_Q16_INLINE static inline
#endif

/* cb_quantize_part's steps (arch/scalar/q8.h) with CB_Q16_MAX for 127, over one whole block (inlined: no frame
 * of its own on a microcontroller's stack) */
CB_Q16_INLINE void cb_quantize_q16_block(const float *x, int16_t *q, float *d)
{
    float amax = 0.0f;
    for (size_t k = 0; k < CB_ACT_BLOCK; k++) {
        float a = x[k] < 0.0f ? -x[k] : x[k];
        amax = a > amax ? a : amax; /* a NaN is skipped; its q is 0 below */
    }
    if (!(amax >= 0x1p-100f)) /* a block this small is zero */
        amax = 0.0f;
    float id = amax > 0.0f ? (float)CB_Q16_MAX / amax : 0.0f;
    for (size_t k = 0; k < CB_ACT_BLOCK; k++) {
        float f = x[k] * id;
        f = f + (f >= 0.0f ? 0.5f : -0.5f);
        int32_t v = f > -(float)(CB_Q16_MAX + 1) && f < (float)(CB_Q16_MAX + 1) ? (int32_t)f : 0; /* truncation */
        v = v > CB_Q16_MAX ? CB_Q16_MAX : v < -CB_Q16_MAX ? -CB_Q16_MAX : v;
        q[k] = (int16_t)v;
    }
    *d = amax / (float)CB_Q16_MAX;
}

/* the exact int32 dot of one row's block (CB_ACT_BLOCK int16 weights at w) with q */
static inline int32_t cb_q16_dot_scalar(const uint8_t *w, const int16_t *q)
{
    const int16_t *v = (const int16_t *)(const void *)w;
    int32_t sum = 0;
    for (size_t c = 0; c < CB_ACT_BLOCK; c++)
        sum += (int32_t)v[c] * q[c];
    return sum;
}

/* isum[i] = cb_q16_dot_scalar(w + i * stride, q) for i < CB_Q16_ROWS */
static inline void cb_q16_isums_scalar(const uint8_t *w, size_t stride, const int16_t *q, int32_t *isum)
{
    for (size_t i = 0; i < CB_Q16_ROWS; i++)
        isum[i] = cb_q16_dot_scalar(w + i * stride, q);
}

#endif /* CB_ARCH_SCALAR_Q16_H */
