/*
 * arch/cortex-m/q8.h - the integer matmul's row dot for Cortex-M: cb_dot32_isa, the int32 dot of 32
 * int8 weights of one row with 32 int8 activations, for the row-major layout (what firmware targets
 * are exported with). Included by kernels_q8.c only; the scalar kernel calls it (arch/scalar/q8.h).
 *
 * MVE (Helium, Armv8.1-M: the Cortex-M55 of target cortex-m55): two 16-lane VLDRB.8 pairs and
 * VMLADAV.S8 / VMLADAVA.S8 (multiply, add across the vector, accumulate into a general-purpose
 * register): 32 MACs in two instructions. Byte loads have no alignment requirement, so neither pointer
 * needs more than the 1-byte alignment int8_t gives.
 *
 * The DSP extension (Armv7E-M and Armv8-M Mainline without MVE: the Cortex-M7 of target stm32h7):
 * each 4-byte word is read with memcpy, which compiles to a plain LDR: Armv7-M and Armv8-M Mainline
 * load words at any address, and the compiler assumes no alignment beyond int8_t's, so it never
 * merges two into an LDRD/LDM, which would need it. SXTB16 sign-extends bytes 0 and 2 of the word
 * into two 16-bit lanes, SXTB16 of the word rotated right by 8 bytes 1 and 3, and each SMLAD adds
 * both lane products to the accumulator: 4 MACs in two SMLADs (SMLAD never overflows or sets Q here).
 *
 * Both sums are exact (at most 32 * 128 * 128 in magnitude), so they equal the scalar loop's bit for bit.
 */
#ifndef CB_ARCH_CORTEX_M_Q8_H
#define CB_ARCH_CORTEX_M_Q8_H

#if CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_MVE)
#include <arm_mve.h>

static inline int32_t cb_dot32_isa(const int8_t *w, const int8_t *q)
{
    int32_t sum = vmladavq_s8(vldrbq_s8(w), vldrbq_s8(q));
    return vmladavaq_s8(sum, vldrbq_s8(w + 16), vldrbq_s8(q + 16));
}

#elif CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_DSP)
#include <arm_acle.h>
#include <string.h>

/* ACLE's __ror, which GCC 12's arm_acle.h (arm-none-eabi-gcc 12.2) lacks, written out: GCC
 * compiles it to ROR, Clang folds it into SXTB16's own ROR #8 operand. */
static inline uint32_t cb_dsp_ror8(uint32_t x)
{
    return x >> 8 | x << 24;
}

/* acc + the dot of the 4 int8 at w with the 4 int8 at q */
static inline int32_t cb_dsp_dot4(int32_t acc, const int8_t *w, const int8_t *q)
{
    uint32_t a, b;
    memcpy(&a, w, sizeof a);
    memcpy(&b, q, sizeof b);
    acc = __smlad(__sxtb16((int32_t)a), __sxtb16((int32_t)b), acc); /* bytes 0 and 2 */
    return __smlad(__sxtb16((int32_t)cb_dsp_ror8(a)), __sxtb16((int32_t)cb_dsp_ror8(b)), acc); /* 1 and 3 */
}

static inline int32_t cb_dot32_isa(const int8_t *w, const int8_t *q)
{
    int32_t acc = 0;
    /* -Os keeps the loop otherwise; unrolled, the demo model takes 5% fewer instructions on stm32h7.
     * GCC and Clang both know the pragma. */
#pragma GCC unroll 8
    for (int c = 0; c < 32; c += 4)
        acc = cb_dsp_dot4(acc, w + c, q + c);
    return acc;
}
#endif

#endif /* CB_ARCH_CORTEX_M_Q8_H */
