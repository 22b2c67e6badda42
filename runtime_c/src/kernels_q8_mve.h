/*
 * kernels_q8_mve.h - the integer matmul's row dot for Cortex-M MVE (Helium,
 * Armv8.1-M: the Cortex-M55 of target cortex-m55). Included by kernels_q8.c only.
 *
 * Row-major layout (what firmware targets are exported with): cb_isa_dot32 is
 * the int32 dot of 32 int8 weights of one row with 32 int8 activations, as two
 * 16-lane VLDRB.8 pairs and VMLADAV.S8 / VMLADAVA.S8 (multiply, add across the
 * vector, accumulate into a general-purpose register): 32 MACs in two
 * instructions. Byte loads have no alignment requirement, so neither pointer
 * needs more than the 1-byte alignment int8_t gives. The sum is exact (at most
 * 32 * 128 * 128 in magnitude), so the result equals the scalar loop's bit for bit.
 */
#ifndef CB_KERNELS_Q8_MVE_H
#define CB_KERNELS_Q8_MVE_H

#include <arm_mve.h>

#define CB_Q8_NAME "mve"
#define CB_Q8_ROWS 1

static inline int32_t cb_isa_dot32(const int8_t *w, const int8_t *q)
{
    int32_t sum = vmladavq_s8(vldrbq_s8(w), vldrbq_s8(q));
    return vmladavaq_s8(sum, vldrbq_s8(w + 16), vldrbq_s8(q + 16));
}

#endif /* CB_KERNELS_Q8_MVE_H */
