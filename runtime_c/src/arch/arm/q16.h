/*
 * arch/arm/q16.h - the int16 matmul's block dots on NEON (kernels.h "int16 matmuls"), AArch64 and Armv7:
 * per row, SMULL/SMLAL of four 4-value pieces into two int32x4 (each lane at most 4 * 8191^2), then the
 * lanes added. Integer sums are exact in any order: the scalar dots' values. Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_ARM_Q16_H
#define CB_ARCH_ARM_Q16_H

#if defined(CB_HAS_Q16_DOT) && CB_ARCH == CB_ARCH_ARM
#include <arm_neon.h>

static inline int32_t cb_q16_row_dot_neon(const uint8_t *w, const int16x8_t *q)
{
    const int16_t *v = (const int16_t *)(const void *)w;
    int32x4_t a = vdupq_n_s32(0), b = vdupq_n_s32(0);
    for (size_t k = 0; k < 4; k++) {
        int16x8_t x = vld1q_s16(v + 8 * k);
        a = vmlal_s16(a, vget_low_s16(x), vget_low_s16(q[k]));
        b = vmlal_s16(b, vget_high_s16(x), vget_high_s16(q[k]));
    }
    int32x4_t s = vaddq_s32(a, b);
    int32x2_t h = vadd_s32(vget_low_s32(s), vget_high_s32(s));
    return vget_lane_s32(vpadd_s32(h, h), 0);
}

static inline void cb_q16_isums_isa(const uint8_t *w, size_t stride, const int16_t *q, int32_t *isum)
{
    int16x8_t qv[4];
    for (size_t k = 0; k < 4; k++)
        qv[k] = vld1q_s16(q + 8 * k);
    for (size_t i = 0; i < CB_Q16_ROWS; i++)
        isum[i] = cb_q16_row_dot_neon(w + i * stride, qv);
}
#endif

#endif /* CB_ARCH_ARM_Q16_H */
