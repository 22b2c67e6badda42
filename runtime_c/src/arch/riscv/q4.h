/*
 * arch/riscv/q4.h - the int4 block dot on RVV 1.0: the 16 bytes split into nibbles (vl = 16, LMUL 1:
 * fits at VLEN >= 128), made signed, widened products with the activations (VWMUL into int16), and a
 * widening reduction (VWREDSUM into int32). Exact integer sums: the scalar definition's result.
 * Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_RISCV_Q4_H
#define CB_ARCH_RISCV_Q4_H

#if CB_ARCH == CB_ARCH_RISCV && defined(CB_HAS_Q4_DOT)
#include <riscv_vector.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    const size_t vl = 16;
    vuint8m1_t raw = __riscv_vle8_v_u8m1(w, vl);
    vint8m1_t lo = __riscv_vsub_vx_i8m1(__riscv_vreinterpret_v_u8m1_i8m1(__riscv_vand_vx_u8m1(raw, 15, vl)), 8, vl);
    vint8m1_t hi = __riscv_vsub_vx_i8m1(__riscv_vreinterpret_v_u8m1_i8m1(__riscv_vsrl_vx_u8m1(raw, 4, vl)), 8, vl);
    vint16m2_t p = __riscv_vwmul_vv_i16m2(lo, __riscv_vle8_v_i8m1(q, vl), vl);
    p = __riscv_vwmacc_vv_i16m2(p, hi, __riscv_vle8_v_i8m1(q + 16, vl), vl);
    vint32m1_t s = __riscv_vwredsum_vs_i16m2_i32m1(p, __riscv_vmv_v_x_i32m1(0, 1), vl);
    return __riscv_vmv_x_s_i32m1_i32(s);
}

#endif
#endif /* CB_ARCH_RISCV_Q4_H */
