/*
 * arch/riscv/matmul.h - the RISC-V vector (RVV 1.0) primitives kernels.c
 * builds its row dots from: LMUL=2 groups of f32, VLMAX lanes (8 at VLEN=128), through
 * the <riscv_vector.h> intrinsics (clang >= 17). Included by kernels.c only.
 */
#ifndef CB_ARCH_RISCV_MATMUL_H
#define CB_ARCH_RISCV_MATMUL_H

#if CB_ARCH == CB_ARCH_RISCV && defined(CB_HAS_MATMUL)

#include <riscv_vector.h>

typedef vfloat32m2_t cb_vf;

static inline size_t cb_vlen(void) { return __riscv_vsetvlmax_e32m2(); }
static inline cb_vf cb_vzero(size_t vl) { return __riscv_vfmv_v_f_f32m2(0.0f, vl); }
static inline cb_vf cb_vld_f32(const float *p, size_t vl) { return __riscv_vle32_v_f32m2(p, vl); }

/* Zvfh is not in rv64gcv: rebuild the f32 bits in integers, as cb_f16_to_f32
 * does (subnormals through an exact int->float conversion). */
static inline cb_vf cb_vld_f16(const uint16_t *p, size_t vl)
{
    vuint32m2_t h = __riscv_vzext_vf2_u32m2(__riscv_vle16_v_u16m1(p, vl), vl);
    vuint32m2_t exp = __riscv_vand_vx_u32m2(h, 0x7c00u, vl), man = __riscv_vand_vx_u32m2(h, 0x3ffu, vl);
    vuint32m2_t mag = __riscv_vsll_vx_u32m2(__riscv_vand_vx_u32m2(h, 0x7fffu, vl), 13, vl);
    vuint32m2_t bits = __riscv_vadd_vx_u32m2(mag, 112u << 23, vl);
    vuint32m2_t special = __riscv_vor_vx_u32m2(mag, 0x7f800000u, vl);
    vuint32m2_t sub = __riscv_vreinterpret_v_f32m2_u32m2(
        __riscv_vfmul_vf_f32m2(__riscv_vfcvt_f_xu_v_f32m2(man, vl), 0x1p-24f, vl));
    bits = __riscv_vmerge_vvm_u32m2(bits, special, __riscv_vmseq_vx_u32m2_b16(exp, 0x7c00u, vl), vl);
    bits = __riscv_vmerge_vvm_u32m2(bits, sub, __riscv_vmseq_vx_u32m2_b16(exp, 0, vl), vl);
    bits = __riscv_vor_vv_u32m2(bits, __riscv_vsll_vx_u32m2(__riscv_vand_vx_u32m2(h, 0x8000u, vl), 16, vl), vl);
    return __riscv_vreinterpret_v_u32m2_f32m2(bits);
}

static inline cb_vf cb_vld_i8(const int8_t *p, size_t vl)
{
    return __riscv_vfcvt_f_x_v_f32m2(__riscv_vsext_vf4_i32m2(__riscv_vle8_v_i8mf2(p, vl), vl), vl);
}
static inline cb_vf cb_vfma(cb_vf acc, cb_vf a, cb_vf b, size_t vl) { return __riscv_vfmacc_vv_f32m2(acc, a, b, vl); }
static inline cb_vf cb_vadd(cb_vf a, cb_vf b, size_t vl) { return __riscv_vfadd_vv_f32m2(a, b, vl); }
static inline float cb_vsum(cb_vf v, size_t vl)
{
    return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(v, __riscv_vfmv_s_f_f32m1(0.0f, 1), vl));
}

#endif
#endif /* CB_ARCH_RISCV_MATMUL_H */
