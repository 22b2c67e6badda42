/*
 * arch/riscv/q8.h - the integer matmul's tile kernel for RISC-V vectors (RVV
 * 1.0 intrinsics, clang >= 17). Included by kernels_q8.c only; the interface
 * is the one of arch/x86/q8.h.
 *
 * The sixteen rows of a tile are sixteen lanes at every width: int8 at LMUL 1,
 * int16 at 2, int32 and f32 at 4, vl = 16 (VLEN >= 128, so it fits; wider
 * vectors leave lanes unused). A 4-column chunk (row 0's four bytes, then row
 * 1's, ...) comes apart in one segment load: field j holds column j of every
 * row, which multiplies by one activation as a scalar operand.
 */
#ifndef CB_ARCH_RISCV_Q8_H
#define CB_ARCH_RISCV_Q8_H

#if CB_ARCH == CB_ARCH_RISCV && defined(CB_HAS_Q8_TILES)

#include <riscv_vector.h>


/* sixteen f32 row results, one lane per row */
typedef vfloat32m4_t cb_tile_acc;

/* Sixteen f16 as f32 (exact). Zvfh is not in rv64gcv: the f32 bits are rebuilt in integers, as
 * cb_f16_to_f32 does (subnormals through an exact int->float conversion). */
static inline vfloat32m4_t cb_ld_f16x16(const uint16_t *p, size_t vl)
{
    vuint32m4_t h = __riscv_vzext_vf2_u32m4(__riscv_vle16_v_u16m2(p, vl), vl);
    vuint32m4_t exp = __riscv_vand_vx_u32m4(h, 0x7c00u, vl), man = __riscv_vand_vx_u32m4(h, 0x3ffu, vl);
    vuint32m4_t mag = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(h, 0x7fffu, vl), 13, vl);
    vuint32m4_t bits = __riscv_vadd_vx_u32m4(mag, 112u << 23, vl);
    vuint32m4_t special = __riscv_vor_vx_u32m4(mag, 0x7f800000u, vl);
    vuint32m4_t sub = __riscv_vreinterpret_v_f32m4_u32m4(
        __riscv_vfmul_vf_f32m4(__riscv_vfcvt_f_xu_v_f32m4(man, vl), 0x1p-24f, vl));
    bits = __riscv_vmerge_vvm_u32m4(bits, special, __riscv_vmseq_vx_u32m4_b8(exp, 0x7c00u, vl), vl);
    bits = __riscv_vmerge_vvm_u32m4(bits, sub, __riscv_vmseq_vx_u32m4_b8(exp, 0, vl), vl);
    bits = __riscv_vor_vv_u32m4(bits, __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(h, 0x8000u, vl), 16, vl), vl);
    return __riscv_vreinterpret_v_u32m4_f32m4(bits);
}

/* A tile's sixteen f16 (or f32) scales of group g. */
static vfloat32m4_t cb_tile_scales(const cb_tensor *t, size_t tile, size_t g, size_t vl)
{
    size_t i = (tile * t->n_groups + g) * CB_TILE_ROWS;
    if (t->scale_dtype == CB_F32)
        return __riscv_vle32_v_f32m4((const float *)(const void *)t->scales + i, vl);
    return cb_ld_f16x16((const uint16_t *)(const void *)t->scales + i, vl);
}

/* The int32 sums of the sixteen rows over one chunk (four columns) at w: two products per int16 lane
 * (|w q| <= 128 * 127, so their sum fits), the two halves added as they widen. */
static inline vint32m4_t cb_chunk_isum(const int8_t *w, const int8_t *q, size_t vl)
{
    vint8m1x4_t c = __riscv_vlseg4e8_v_i8m1x4(w, vl); /* field j: column j of every row */
    vint16m2_t lo = __riscv_vwmul_vx_i16m2(__riscv_vget_v_i8m1x4_i8m1(c, 0), q[0], vl);
    vint16m2_t hi = __riscv_vwmul_vx_i16m2(__riscv_vget_v_i8m1x4_i8m1(c, 2), q[2], vl);
    lo = __riscv_vwmacc_vx_i16m2(lo, q[1], __riscv_vget_v_i8m1x4_i8m1(c, 1), vl);
    hi = __riscv_vwmacc_vx_i16m2(hi, q[3], __riscv_vget_v_i8m1x4_i8m1(c, 3), vl);
    return __riscv_vwadd_vv_i32m4(lo, hi, vl);
}

/* The block sums of one tile (one int32 lane per row) for the block at w. */
static inline vint32m4_t cb_tile_isum(const int8_t *w, const int8_t *q, size_t vl)
{
    vint32m4_t acc = cb_chunk_isum(w, q, vl);
    for (size_t k = 1; k < CB_ACT_BLOCK / 4; k++)
        acc = __riscv_vadd_vv_i32m4(acc, cb_chunk_isum(w + 4 * CB_TILE_ROWS * k, q + 4 * k, vl), vl);
    return acc;
}

static vfloat32m4_t cb_tile_dot(const cb_tensor *t, size_t tile, const cb_xq *xq)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const size_t vl = __riscv_vsetvl_e32m4(CB_TILE_ROWS); /* 16: VLMAX of e32m4 (= e16m2, e8m1) is >= 16 */
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    vfloat32m4_t acc = __riscv_vfmv_v_f_f32m4(0.0f, vl), sc = acc;
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (b % per_group == 0)
            sc = cb_tile_scales(t, tile, b / per_group, vl);
        vfloat32m4_t f = __riscv_vfcvt_f_x_v_f32m4(cb_tile_isum(w, xq->q + b * CB_ACT_BLOCK, vl), vl);
        f = __riscv_vfmul_vf_f32m4(f, xq->d[b], vl);
        f = __riscv_vfmul_vv_f32m4(f, sc, vl);
        acc = __riscv_vfadd_vv_f32m4(acc, f, vl); /* three roundings, as the scalar kernel: no vfmacc */
    }
    return acc;
}

static void cb_tile_store(vfloat32m4_t v, float *out)
{
    __riscv_vse32_v_f32m4(out, v, CB_TILE_ROWS);
}

#endif
#endif /* CB_ARCH_RISCV_Q8_H */
