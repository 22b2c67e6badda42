/*
 * arch/arm/matmul.h - the Arm Advanced SIMD (NEON) vector primitives
 * kernels.c builds its row dots from: 4 float lanes, AArch64 (rpi4, rpi5) or
 * ARMv7 with VFPv4/ARMv8 FP (rpi-armv7). Included by kernels.c and q8.h.
 *
 * ARMv7 NEON flushes subnormals to zero, so there a product below 2^-126
 * may differ from the scalar (VFP) path; the tolerance covers it.
 */
#ifndef CB_ARCH_ARM_MATMUL_H
#define CB_ARCH_ARM_MATMUL_H

#if CB_ARCH == CB_ARCH_ARM && defined(CB_HAS_MATMUL)

#include <arm_neon.h>
#include <string.h>

typedef float32x4_t cb_vf;

static inline size_t cb_vlen(void) { return 4; }
static inline cb_vf cb_vzero(size_t vl) { (void)vl; return vdupq_n_f32(0.0f); }
static inline cb_vf cb_vld_f32(const float *p, size_t vl) { (void)vl; return vld1q_f32(p); }

static inline cb_vf cb_vld_f16(const uint16_t *p, size_t vl)
{
    (void)vl;
#if defined(CB_ARM_A64)
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
#else
    /* No f16 vector type without -mfp16-format: rebuild the f32 bits in integers,
     * as cb_f16_to_f32 does (subnormals through an exact int->float conversion). */
    uint32x4_t h = vmovl_u16(vld1_u16(p));
    uint32x4_t exp = vandq_u32(h, vdupq_n_u32(0x7c00u)), man = vandq_u32(h, vdupq_n_u32(0x3ffu));
    uint32x4_t mag = vshlq_n_u32(vandq_u32(h, vdupq_n_u32(0x7fffu)), 13);
    uint32x4_t normal = vaddq_u32(mag, vdupq_n_u32(112u << 23));
    uint32x4_t special = vorrq_u32(mag, vdupq_n_u32(0x7f800000u));
    uint32x4_t sub = vreinterpretq_u32_f32(vmulq_n_f32(vcvtq_f32_u32(man), 0x1p-24f));
    uint32x4_t bits = vbslq_u32(vceqq_u32(exp, vdupq_n_u32(0x7c00u)), special, normal);
    bits = vbslq_u32(vceqq_u32(exp, vdupq_n_u32(0)), sub, bits);
    bits = vorrq_u32(bits, vshlq_n_u32(vandq_u32(h, vdupq_n_u32(0x8000u)), 16));
    return vreinterpretq_f32_u32(bits);
#endif
}

/* 4 int8 weights: the only NEON load of 4 bytes is a 32-bit lane load */
static inline cb_vf cb_vld_i8(const int8_t *p, size_t vl)
{
    (void)vl;
    int32_t w;
    memcpy(&w, p, sizeof w);
    int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}

static inline cb_vf cb_vfma(cb_vf acc, cb_vf a, cb_vf b, size_t vl)
{
    (void)vl;
#if defined(CB_ARM_FMA)
    return vfmaq_f32(acc, a, b);
#else
    return vmlaq_f32(acc, a, b);
#endif
}
static inline cb_vf cb_vadd(cb_vf a, cb_vf b, size_t vl) { (void)vl; return vaddq_f32(a, b); }
static inline float cb_vsum(cb_vf v, size_t vl)
{
    (void)vl;
#if defined(CB_ARM_A64)
    return vaddvq_f32(v);
#else
    float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(vpadd_f32(s, s), 0);
#endif
}

#endif
#endif /* CB_ARCH_ARM_MATMUL_H */
