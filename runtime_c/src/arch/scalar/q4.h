/*
 * arch/scalar/q4.h - the int4 block dot (kernels.h "int4 matmuls"): the definition every ISA path
 * equals bit for bit, and what arch/fallback.h maps cb_dot32_q4_isa to where an ISA has none.
 * Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_SCALAR_Q4_H
#define CB_ARCH_SCALAR_Q4_H

/* sum over the block's 32 columns of (nibble - 8) * q: byte i of w holds column i in its low nibble and
 * column i + 16 in its high one. qsum (the block's sum of q) is for the ISA paths; exact in int32. */
static inline int32_t cb_dot32_q4_scalar(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    int32_t sum = 0;
    for (size_t i = 0; i < CB_ACT_BLOCK / 2; i++) {
        sum += ((int32_t)(w[i] & 15u) - 8) * q[i];
        sum += ((int32_t)(w[i] >> 4) - 8) * q[i + CB_ACT_BLOCK / 2];
    }
    return sum;
}

#endif /* CB_ARCH_SCALAR_Q4_H */
