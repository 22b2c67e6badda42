/*
 * arch/cortex-m/matmul.h - the Cortex-M MVE (Helium, Armv8.1-M with the floating-point
 * extension: the Cortex-M55 of target cortex-m55) vector primitives kernels.c
 * builds its row dots from: 4 float lanes. Included by kernels.c only.
 *
 * Loads take only the alignment their C types give: VLDRW.32 needs 4 bytes
 * (x and f32 rows are float *), the widening VLDRH.U32 of 4 halves 2 bytes
 * (f16 rows), the widening VLDRB.S32 of 4 bytes none (int8 rows, which start
 * at any group offset). MVE vector float arithmetic runs with the standard
 * FPSCR value (flush-to-zero, default NaN), so, as on ARMv7 NEON, a product
 * below 2^-126 may differ from the scalar (FPU) path; the tolerance covers it.
 */
#ifndef CB_ARCH_CORTEX_M_MATMUL_H
#define CB_ARCH_CORTEX_M_MATMUL_H

#if CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_HAS_MATMUL)

#include <arm_mve.h>

#define CB_VCHAINS 1 /* 4 accumulators, x and a weight vector fit in Q0-Q7; 8 accumulators spilled every step */
typedef float32x4_t cb_vf;

static inline size_t cb_vlen(void) { return 4; }
static inline cb_vf cb_vzero(size_t vl) { (void)vl; return vdupq_n_f32(0.0f); }
static inline cb_vf cb_vld_f32(const float *p, size_t vl) { (void)vl; return vldrwq_f32(p); }

/* 4 halves into the bottom of 32-bit lanes (VLDRH.U32), widened by VCVTB.F32.F16: exact for every
 * half (its subnormals are normal f32s; conversions never flush) but NaN, which comes out as the
 * default NaN (as any NaN from the FMA after it would). The instruction is written as its encoding
 * with the value pinned to Q0: binutils 2.40 (Debian 12's arm-none-eabi toolchain) encodes Qn of
 * vcvtb.f32.f16 as register 2n - wrong for Q1-Q3, undefined from Q4 - except for Q0. */
static inline cb_vf cb_vld_f16(const uint16_t *p, size_t vl)
{
    (void)vl;
    register cb_vf v __asm__("q0") = vreinterpretq_f32_u32(vldrhq_u32(p));
    __asm__(".inst.w 0xfe3f0e01 @ vcvtb.f32.f16 q0, q0" : "+w"(v));
    return v;
}

static inline cb_vf cb_vld_i8(const int8_t *p, size_t vl) { (void)vl; return vcvtq_f32_s32(vldrbq_s32(p)); }
static inline cb_vf cb_vfma(cb_vf acc, cb_vf a, cb_vf b, size_t vl) { (void)vl; return vfmaq_f32(acc, a, b); }
static inline cb_vf cb_vadd(cb_vf a, cb_vf b, size_t vl) { (void)vl; return vaddq_f32(a, b); }

/* No float add-across in MVE: (v0 + v1) + (v2 + v3), the pairs in one VADD against the pair-swapped v */
static inline float cb_vsum(cb_vf v, size_t vl)
{
    (void)vl;
    cb_vf pairs = vaddq_f32(v, vrev64q_f32(v));
    return vgetq_lane_f32(pairs, 0) + vgetq_lane_f32(pairs, 2);
}

#endif
#endif /* CB_ARCH_CORTEX_M_MATMUL_H */
