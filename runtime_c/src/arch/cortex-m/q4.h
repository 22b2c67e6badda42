/*
 * arch/cortex-m/q4.h - the int4 block dot on Cortex-M. Included by kernels_q8.c only.
 *
 * MVE (Cortex-M55): the 16 bytes split into nibbles with VAND/VSHR, made signed (nibble - 8), and
 * two VMLADAV.S8 with the activations.
 * DSP (Cortex-M7): per 4-byte word (read with memcpy: a plain LDR, see q8.h) the low nibbles of bytes
 * 0 and 2 and of bytes 1 and 3 as 16-bit lane pairs (AND with 0x000f000f after a shift), the
 * activations' matching bytes sign-extended by SXTB16, SMLAD for each pair; the high nibbles the same
 * way with the activations 16 columns on; then minus 8 * qsum for the nibbles' offset.
 * Every sum is exact (at most 32 * 15 * 128), so the scalar definition's result.
 */
#ifndef CB_ARCH_CORTEX_M_Q4_H
#define CB_ARCH_CORTEX_M_Q4_H

#if CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_MVE) && defined(CB_HAS_Q4_DOT)
#include <arm_mve.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    const uint8x16_t raw = vldrbq_u8(w);
    const int8x16_t lo = vsubq_n_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), 8);
    const int8x16_t hi = vsubq_n_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), 8);
    int32_t sum = vmladavq_s8(lo, vldrbq_s8(q));
    return vmladavaq_s8(sum, hi, vldrbq_s8(q + 16));
}

#elif CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_DSP) && defined(CB_HAS_Q4_DOT)
#include <arm_acle.h>
#include <string.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    int32_t sum = 0;
    for (size_t i = 0; i < CB_ACT_BLOCK / 2; i += 4) {
        uint32_t b, x0, x1;
        memcpy(&b, w + i, 4);
        memcpy(&x0, q + i, 4);
        memcpy(&x1, q + i + CB_ACT_BLOCK / 2, 4);
        const uint32_t m = 0x000f000fu;
        /* nibbles: lo of bytes 0,2 | lo of bytes 1,3 | hi of bytes 0,2 | hi of bytes 1,3, as u16 lane pairs */
        uint32_t l02 = b & m, l13 = (b >> 8) & m, h02 = (b >> 4) & m, h13 = (b >> 12) & m;
        sum = __smlad((int32_t)l02, __sxtb16((int32_t)x0), sum);
        sum = __smlad((int32_t)l13, __sxtb16((int32_t)(x0 >> 8 | x0 << 24)), sum);
        sum = __smlad((int32_t)h02, __sxtb16((int32_t)x1), sum);
        sum = __smlad((int32_t)h13, __sxtb16((int32_t)(x1 >> 8 | x1 << 24)), sum);
    }
    return sum - 8 * qsum;
}

#endif
#endif /* CB_ARCH_CORTEX_M_Q4_H */
