/*
 * arch/arm/q4.h - the int4 block dot on NEON: the 16 bytes split into nibbles and made signed
 * (nibble - 8, in [-8, 7]); with SDOT (CB_ARM_DOTPROD, CB_ARM_I8MM) two 16-byte dot products, else
 * SMULL/SMLAL into 16-bit lanes (at most 2 * 8 * 128) and SADALP into 32-bit ones; then the lanes
 * added. All exact integer sums: the scalar definition's result. On AArch64 also cb_q4_rows: four rows
 * at a time, the row sums reduced by pairwise adds, the block's float steps one lane per row.
 * Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_ARM_Q4_H
#define CB_ARCH_ARM_Q4_H

#if CB_ARCH == CB_ARCH_ARM && defined(CB_HAS_Q4_DOT)
#include <arm_neon.h>

/* one row's block: the signed nibbles of its first 16 inputs (lo) and of its last 16 (hi) */
static inline void cb_q4_nibbles(const uint8_t *w, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t raw = vld1q_u8(w);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
}

/* one row's block dot with the activations q0, q1 as four int32 partial sums (the lanes
 * cb_dot32_q4_isa adds) */
static inline int32x4_t cb_q4_part(int8x16_t lo, int8x16_t hi, int8x16_t q0, int8x16_t q1)
{
#if defined(CB_ARM_DOTPROD) || defined(CB_ARM_I8MM)
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, q0), hi, q1);
#else
    int16x8_t a = vmull_s8(vget_low_s8(lo), vget_low_s8(q0));
    a = vmlal_s8(a, vget_high_s8(lo), vget_high_s8(q0));
    int16x8_t b = vmull_s8(vget_low_s8(hi), vget_low_s8(q1));
    b = vmlal_s8(b, vget_high_s8(hi), vget_high_s8(q1));
    return vpadalq_s16(vpaddlq_s16(a), b);
#endif
}

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    int8x16_t lo, hi;
    cb_q4_nibbles(w, &lo, &hi);
    const int32x4_t acc = cb_q4_part(lo, hi, vld1q_s8(q), vld1q_s8(q + 16));
#if defined(CB_ARM_A64)
    return vaddvq_s32(acc);
#else
    int32x2_t h = vadd_s32(vget_low_s32(acc), vget_high_s32(acc));
    return vget_lane_s32(vpadd_s32(h, h), 0);
#endif
}

#if defined(CB_ARM_A64)
#define CB_HAS_Q4_ROWS 1
#define CB_Q4_ROWS 4

#ifndef CB_Q4_PREFETCH
#define CB_Q4_PREFETCH 4096 /* bytes ahead of the rows' walk */
#endif

/* out[j][i] = the dot of row r + i with token j (xq[j]), i < 4, j < n <= 4: the scalar kernel's acc before
 * cb_finish, its float steps per row (f = isum, f *= d[b], f *= scale[r][b], acc += f) one lane per row. The
 * four rows' partial sums are reduced by two pairwise adds into one vector, the rows' nibbles and scales
 * decoded once a block for all n tokens. Exact integer sums, the same float operations in the same order:
 * the scalar definition's bits. */
static inline __attribute__((always_inline)) void cb_q4_rows(const cb_tensor *t, size_t r, const cb_xq *xq,
                                                             size_t n, float (*out)[CB_Q4_ROWS])
{
    const size_t blocks = t->n_groups, stride = t->row_stride;
    const uint8_t *w = t->data + r * stride;
    const int f32_scales = t->scale_dtype == CB_F32;
    const uint8_t *sc = t->scales + r * blocks * (f32_scales ? 4u : 2u);
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    /* the four rows are 4 * stride contiguous bytes, 64 a block step: one line a step, CB_Q4_PREFETCH ahead */
    const uint8_t *ahead = w + CB_Q4_PREFETCH;
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK / 2, ahead += 64) {
        __builtin_prefetch(ahead);
        int8x16_t l0, h0, l1, h1, l2, h2, l3, h3;
        cb_q4_nibbles(w, &l0, &h0);
        cb_q4_nibbles(w + stride, &l1, &h1);
        cb_q4_nibbles(w + 2 * stride, &l2, &h2);
        cb_q4_nibbles(w + 3 * stride, &l3, &h3);
        float32x4_t scale;
        if (f32_scales) {
            const float *s32 = (const float *)(const void *)sc;
            const float s[4] = {s32[b], s32[blocks + b], s32[2 * blocks + b], s32[3 * blocks + b]};
            scale = vld1q_f32(s);
        } else {
            const uint16_t *s16 = (const uint16_t *)(const void *)sc;
            const uint16_t s[4] = {s16[b], s16[blocks + b], s16[2 * blocks + b], s16[3 * blocks + b]};
            scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s)));
        }
        for (size_t j = 0; j < n; j++) {
            const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
            const int8x16_t q0 = vld1q_s8(q), q1 = vld1q_s8(q + 16);
            /* (row 0, row 0, row 1, row 1) then (row 0, row 1, row 2, row 3) */
            const int32x4_t s = vpaddq_s32(vpaddq_s32(cb_q4_part(l0, h0, q0, q1), cb_q4_part(l1, h1, q0, q1)),
                                           vpaddq_s32(cb_q4_part(l2, h2, q0, q1), cb_q4_part(l3, h3, q0, q1)));
            float32x4_t f = vcvtq_f32_s32(s);
            f = vmulq_f32(f, vdupq_n_f32(xq[j].d[b]));
            f = vmulq_f32(f, scale);
            acc[j] = vaddq_f32(acc[j], f);
        }
    }
    for (size_t j = 0; j < n; j++)
        vst1q_f32(out[j], acc[j]);
}
#endif

#endif
#endif /* CB_ARCH_ARM_Q4_H */
