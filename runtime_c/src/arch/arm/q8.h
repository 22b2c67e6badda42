/*
 * arch/arm/q8.h - the integer matmul's tile kernel for Arm NEON: SMMLA with
 * the Armv8.6 int8 matrix multiply extension, SDOT with the dot product one
 * (rpi5), SMULL/SMLAL/SADALP without either (rpi4, and 32-bit rpi-armv7).
 * Included by kernels_q8.c only; the interface is the one of arch/x86/q8.h.
 *
 * A tile's rows r..r+3 of one 4-column chunk are 16 consecutive bytes (four
 * bytes per row), so one 16-byte load and one 4-byte broadcast of the
 * activations give four rows' int32 sums: four vectors cover the 16 rows.
 *
 * ARMv7 NEON always flushes subnormal inputs and results to zero, which the
 * scalar kernel's VFP arithmetic does not: there a block takes the NEON float
 * steps only where that cannot matter, else VFP ones (see cb_least_scale).
 */
#ifndef CB_ARCH_ARM_Q8_H
#define CB_ARCH_ARM_Q8_H

#if CB_ARCH == CB_ARCH_ARM && defined(CB_HAS_Q8_TILES)

#include <arm_neon.h>
#include <string.h>

#include "matmul.h"


/* sixteen f32 row results (or scales): rows 4i..4i+3 in v[i] */
typedef struct cb_tile_acc {
    float32x4_t v[4];
} cb_tile_acc;

/* Four f16 as f32 (exact). Without AArch64 there is no f16 vector type (no -mfp16-format): the f32
 * bits are rebuilt in integers, as cb_f16_to_f32 does (subnormals through an exact int->float
 * conversion, which gives a normal f32, so the flush to zero cannot touch it). */
static inline float32x4_t cb_ld_f16x4(const uint16_t *p)
{
    return cb_vld_f16(p, 4); /* matmul.h's: the hardware conversion, or the integer rebuild on armv7 */
}

/* four scales from index i, f16 or f32 */
static inline float32x4_t cb_ld_scales4(const cb_tensor *t, size_t i)
{
    if (t->scale_dtype == CB_F32)
        return vld1q_f32((const float *)(const void *)t->scales + i);
    return cb_ld_f16x4((const uint16_t *)(const void *)t->scales + i);
}

/* A tile's sixteen scales of group g. */
static cb_tile_acc cb_tile_scales(const cb_tensor *t, size_t tile, size_t g)
{
    size_t i = (tile * t->n_groups + g) * CB_TILE_ROWS;
    cb_tile_acc sc = {{cb_ld_scales4(t, i), cb_ld_scales4(t, i + 4), cb_ld_scales4(t, i + 8), cb_ld_scales4(t, i + 12)}};
    return sc;
}

#if defined(CB_ARM_I8MM)
/* The block sums of rows 4i..4i+3 (one int32 lane per row): w at block b of the tile plus 16 i. SMMLA
 * multiplies a 2x8 int8 matrix by the transpose of another into a 2x2 int32 one: zipping the 32-bit
 * lanes of two consecutive chunks gives rows 4i, 4i+1 (and 4i+2, 4i+3) with 8 columns each, and the
 * second matrix is the block's 8 activations twice, so lanes 0 and 2 of each result hold the two rows'
 * sums (1 and 3 the same again). */
static inline int32x4_t cb_quad_isum(const int8_t *w, const int8_t *q)
{
    int32x4_t a01 = vdupq_n_s32(0), a23 = a01;
    for (size_t k = 0; k < CB_ACT_BLOCK / 8; k++, w += 128, q += 8) {
        int32x4_t c0 = vreinterpretq_s32_s8(vld1q_s8(w)), c1 = vreinterpretq_s32_s8(vld1q_s8(w + 64));
        int8x8_t x = vld1_s8(q);
        int8x16_t xx = vcombine_s8(x, x);
        a01 = vmmlaq_s32(a01, vreinterpretq_s8_s32(vzip1q_s32(c0, c1)), xx);
        a23 = vmmlaq_s32(a23, vreinterpretq_s8_s32(vzip2q_s32(c0, c1)), xx);
    }
    return vuzp1q_s32(a01, a23);
}

#elif defined(CB_ARM_DOTPROD)
/* The int32 sums of four rows over four chunks: w at the rows' 16 bytes of the first chunk, lane k of
 * x (as int32) the activations of chunk k. */
static inline int32x4_t cb_quad_dot4(const int8_t *w, int8x16_t x)
{
    int32x4_t a = vdupq_n_s32(0);
#if defined(CB_ARM_A64)
    a = vdotq_laneq_s32(a, vld1q_s8(w), x, 0);
    a = vdotq_laneq_s32(a, vld1q_s8(w + 64), x, 1);
    a = vdotq_laneq_s32(a, vld1q_s8(w + 128), x, 2);
    a = vdotq_laneq_s32(a, vld1q_s8(w + 192), x, 3);
#else
    a = vdotq_lane_s32(a, vld1q_s8(w), vget_low_s8(x), 0);
    a = vdotq_lane_s32(a, vld1q_s8(w + 64), vget_low_s8(x), 1);
    a = vdotq_lane_s32(a, vld1q_s8(w + 128), vget_high_s8(x), 0);
    a = vdotq_lane_s32(a, vld1q_s8(w + 192), vget_high_s8(x), 1);
#endif
    return a;
}

/* The block sums of rows 4i..4i+3 (one int32 lane per row): w at block b of the tile plus 16 i. */
static inline int32x4_t cb_quad_isum(const int8_t *w, const int8_t *q)
{
    return vaddq_s32(cb_quad_dot4(w, vld1q_s8(q)), cb_quad_dot4(w + 256, vld1q_s8(q + 16)));
}

#else
/* the four activations of a chunk in every 32-bit lane */
static inline int8x16_t cb_dup4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, sizeof v);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* The block sums of rows 4i..4i+3, as cb_quad_isum above, two chunks at a time. SMULL and SMLAL put
 * two products (|w q| <= 128 * 127, so their sum fits) in each int16 lane: the low half of a
 * 16-byte load is rows 4i and 4i+1, the high half rows 4i+2 and 4i+3, each row's columns 0-3. SADALP
 * adds neighbouring int16 lanes into int32, giving [row, cols 0-1; row, cols 2-3] for two rows per
 * vector, and a pairwise add of the two vectors ends with one row per lane. */
static inline int32x4_t cb_quad_isum(const int8_t *w, const int8_t *q)
{
    int32x4_t lo = vdupq_n_s32(0), hi = lo;
    for (size_t k = 0; k < CB_ACT_BLOCK / 4; k += 2, w += 128, q += 8) {
        int8x16_t x0 = cb_dup4(q), x1 = cb_dup4(q + 4), w0 = vld1q_s8(w), w1 = vld1q_s8(w + 64);
        int16x8_t l = vmlal_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), vget_low_s8(w1), vget_low_s8(x1));
        int16x8_t h = vmlal_s8(vmull_s8(vget_high_s8(w0), vget_high_s8(x0)), vget_high_s8(w1), vget_high_s8(x1));
        lo = vpadalq_s16(lo, l);
        hi = vpadalq_s16(hi, h);
    }
#if defined(CB_ARM_A64)
    return vpaddq_s32(lo, hi);
#else
    return vcombine_s32(vpadd_s32(vget_low_s32(lo), vget_high_s32(lo)), vpadd_s32(vget_low_s32(hi), vget_high_s32(hi)));
#endif
}
#endif

#if !defined(CB_ARM_A64)
/*
 * ARMv7 NEON flushes subnormals (the scalar kernel's VFP does not), so a block takes the NEON float
 * steps only where they cannot meet one. Every f = isum * d * scale that is not zero is at least
 * round(d * m) with m the least nonzero |scale| of the group (|isum| >= 1, rounding is monotone), so
 * when d * m >= 2^-103 every such f is a multiple of 2^-126 (its ulp is), and so is every sum of them
 * in acc (rounding keeps a multiple of 2^-126: a float's ulp is below 2^-126 only when the float
 * needs no rounding): a nonzero acc is then at least 2^-126. With d normal or zero, and no subnormal
 * scale, no input, product or sum of the block is subnormal. Other blocks take the steps lane by lane
 * in VFP; the NEON ones go on once acc is again a multiple of 2^-126 (zero or at least 2^-103).
 */
static inline uint32x4_t cb_mag(float32x4_t v)
{
    return vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x7fffffffu));
}

/* m for the test above: the least nonzero |scale| of a group (infinite if all are zero), or 0 if a
 * scale is subnormal */
static float cb_least_scale(cb_tile_acc sc)
{
    const uint32x4_t zero = vdupq_n_u32(0), inf = vdupq_n_u32(0x7f800000u);
    uint32x4_t m = inf;
    for (size_t k = 0; k < 4; k++) { /* as unsigned integers the magnitudes are in |f| order */
        uint32x4_t a = cb_mag(sc.v[k]);
        m = vminq_u32(m, vbslq_u32(vceqq_u32(a, zero), inf, a));
    }
    uint32x2_t h = vpmin_u32(vget_low_u32(m), vget_high_u32(m));
    uint32_t least = vget_lane_u32(vpmin_u32(h, h), 0);
    float f = 0.0f;
    if (least >= 0x00800000u)
        memcpy(&f, &least, sizeof f);
    return f;
}

/* whether every lane of acc is zero or at least 2^-103 */
static int cb_neon_exact(cb_tile_acc acc)
{
    uint32x4_t bad = vdupq_n_u32(0);
    for (size_t k = 0; k < 4; k++) {
        uint32x4_t a = cb_mag(acc.v[k]);
        bad = vorrq_u32(bad, vandq_u32(vtstq_u32(a, a), vcltq_u32(a, vdupq_n_u32(24u << 23))));
    }
    uint32x2_t h = vorr_u32(vget_low_u32(bad), vget_high_u32(bad));
    return (vget_lane_u32(h, 0) | vget_lane_u32(h, 1)) == 0;
}

/* the float steps of one block in VFP, lane by lane */
static cb_tile_acc cb_steps_vfp(cb_tile_acc acc, const int32x4_t isum[4], float d, cb_tile_acc sc)
{
    float a[CB_TILE_ROWS], s[CB_TILE_ROWS];
    int32_t n[CB_TILE_ROWS];
    for (size_t k = 0; k < 4; k++) {
        vst1q_f32(a + 4 * k, acc.v[k]);
        vst1q_f32(s + 4 * k, sc.v[k]);
        vst1q_s32(n + 4 * k, isum[k]);
    }
    for (size_t i = 0; i < CB_TILE_ROWS; i++) {
        float f = (float)n[i];
        f = f * d;
        f = f * s[i];
        a[i] = a[i] + f;
    }
    for (size_t k = 0; k < 4; k++)
        acc.v[k] = vld1q_f32(a + 4 * k);
    return acc;
}
#endif

/* the float steps of four rows, as the scalar kernel orders them */
static inline float32x4_t cb_step(float32x4_t acc, int32x4_t isum, float32x4_t d, float32x4_t sc)
{
    return vaddq_f32(acc, vmulq_f32(vmulq_f32(vcvtq_f32_s32(isum), d), sc));
}

static cb_tile_acc cb_tile_dot(const cb_tensor *t, size_t tile, const cb_xq *xq)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    const float32x4_t zero = vdupq_n_f32(0.0f);
    cb_tile_acc acc = {{zero, zero, zero, zero}}, sc = acc;
#if !defined(CB_ARM_A64)
    float least = 0.0f;
    int exact = 1;
#endif
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (b % per_group == 0) {
            sc = cb_tile_scales(t, tile, b / per_group);
#if !defined(CB_ARM_A64)
            least = cb_least_scale(sc);
#endif
        }
        const int8_t *q = xq->q + b * CB_ACT_BLOCK;
        int32x4_t isum[4] = {cb_quad_isum(w, q), cb_quad_isum(w + 16, q), cb_quad_isum(w + 32, q),
                             cb_quad_isum(w + 48, q)};
        float d = xq->d[b];
#if !defined(CB_ARM_A64)
        if (!(exact && least > 0.0f && (d == 0.0f || (d >= 0x1p-126f && d * least >= 0x1p-103f)))) {
            acc = cb_steps_vfp(acc, isum, d, sc);
            exact = cb_neon_exact(acc);
            continue;
        }
#endif
        float32x4_t dv = vdupq_n_f32(d);
        acc.v[0] = cb_step(acc.v[0], isum[0], dv, sc.v[0]);
        acc.v[1] = cb_step(acc.v[1], isum[1], dv, sc.v[1]);
        acc.v[2] = cb_step(acc.v[2], isum[2], dv, sc.v[2]);
        acc.v[3] = cb_step(acc.v[3], isum[3], dv, sc.v[3]);
    }
    return acc;
}

static void cb_tile_store(cb_tile_acc v, float *out)
{
    for (size_t k = 0; k < 4; k++)
        vst1q_f32(out + 4 * k, v.v[k]);
}

#endif
#endif /* CB_ARCH_ARM_Q8_H */
