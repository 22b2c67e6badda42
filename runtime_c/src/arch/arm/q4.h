/*
 * arch/arm/q4.h - the int4 block dot on NEON: the 16 bytes split into nibbles and made signed
 * (nibble - 8, in [-8, 7]); with SDOT (CB_ARM_DOTPROD, CB_ARM_I8MM) two 16-byte dot products, else
 * SMULL/SMLAL into 16-bit lanes (at most 2 * 8 * 128) and SADALP into 32-bit ones; then the lanes
 * added. All exact integer sums: the scalar definition's result. Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_ARM_Q4_H
#define CB_ARCH_ARM_Q4_H

#if CB_ARCH == CB_ARCH_ARM && defined(CB_HAS_Q4_DOT)
#include <arm_neon.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    const uint8x16_t raw = vld1q_u8(w);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), vdupq_n_s8(8));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
    const int8x16_t q0 = vld1q_s8(q), q1 = vld1q_s8(q + 16);
#if defined(CB_ARM_DOTPROD) || defined(CB_ARM_I8MM)
    int32x4_t acc = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, q0), hi, q1);
#else
    int16x8_t a = vmull_s8(vget_low_s8(lo), vget_low_s8(q0));
    a = vmlal_s8(a, vget_high_s8(lo), vget_high_s8(q0));
    int16x8_t b = vmull_s8(vget_low_s8(hi), vget_low_s8(q1));
    b = vmlal_s8(b, vget_high_s8(hi), vget_high_s8(q1));
    int32x4_t acc = vpadalq_s16(vpaddlq_s16(a), b);
#endif
#if defined(CB_ARM_A64)
    return vaddvq_s32(acc);
#else
    int32x2_t h = vadd_s32(vget_low_s32(acc), vget_high_s32(acc));
    return vget_lane_s32(vpadd_s32(h, h), 0);
#endif
}

#endif
#endif /* CB_ARCH_ARM_Q4_H */
