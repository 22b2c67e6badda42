/*
 * arch/arm/attn.h - AArch64 NEON attention kernels: IEEE subnormals, so its vector sums are the
 * scalar ones' bits (ARMv7 NEON flushes them: it keeps the scalar kernels). Inlined from kernels.h.
 */
#ifndef CB_ARCH_ARM_ATTN_H
#define CB_ARCH_ARM_ATTN_H

#if CB_ARCH == CB_ARCH_ARM && defined(CB_HAS_ATTN)
#include <arm_neon.h>

/* Four positions a pass (hd a multiple of 8): sums 0-3 and 4-7 of each in two registers, reduced in
 * cb_dot's order. */
static inline void cb_scores_isa(float *restrict out, const float *restrict q, const float *restrict keys,
                                 size_t stride, size_t n, size_t hd, float scale)
{
    size_t t = 0;
    if (hd % 8 == 0) {
        const float32x4_t vscale = vdupq_n_f32(scale), zero = vdupq_n_f32(0.0f);
        for (; t + 4 <= n; t += 4) {
            const float *k0 = keys + t * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
            float32x4_t l0 = zero, l1 = zero, l2 = zero, l3 = zero, h0 = zero, h1 = zero, h2 = zero, h3 = zero;
            for (size_t i = 0; i < hd; i += 8) { /* written out: GCC keeps arrays of these in memory */
                float32x4_t qa = vld1q_f32(q + i), qb = vld1q_f32(q + i + 4);
                l0 = vaddq_f32(l0, vmulq_f32(qa, vld1q_f32(k0 + i)));
                h0 = vaddq_f32(h0, vmulq_f32(qb, vld1q_f32(k0 + i + 4)));
                l1 = vaddq_f32(l1, vmulq_f32(qa, vld1q_f32(k1 + i)));
                h1 = vaddq_f32(h1, vmulq_f32(qb, vld1q_f32(k1 + i + 4)));
                l2 = vaddq_f32(l2, vmulq_f32(qa, vld1q_f32(k2 + i)));
                h2 = vaddq_f32(h2, vmulq_f32(qb, vld1q_f32(k2 + i + 4)));
                l3 = vaddq_f32(l3, vmulq_f32(qa, vld1q_f32(k3 + i)));
                h3 = vaddq_f32(h3, vmulq_f32(qb, vld1q_f32(k3 + i + 4)));
            }
            /* u = s0+s4, s1+s5, s2+s6, s3+s7 per position; then u0+u2 and u1+u3 of each (pairwise adds
             * of the unzipped lanes), and their sum */
            float32x4_t u0 = vaddq_f32(l0, h0), u1 = vaddq_f32(l1, h1), u2 = vaddq_f32(l2, h2), u3 = vaddq_f32(l3, h3);
            float32x4_t even = vpaddq_f32(vuzp1q_f32(u0, u1), vuzp1q_f32(u2, u3));
            float32x4_t odd = vpaddq_f32(vuzp2q_f32(u0, u1), vuzp2q_f32(u2, u3));
            vst1q_f32(out + t, vmulq_f32(vaddq_f32(even, odd), vscale));
        }
    }
    for (; t < n; t++)
        out[t] = cb_dot_isa(q, keys + t * stride, hd) * scale;
}

/* 16 outputs at a time in registers across all t, each the scalar kernel's multiplies and adds */
static inline void cb_weighted_rows_isa(float *restrict out, const float *restrict w, const float *restrict rows,
                                        size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n16 = len & ~(size_t)15; i0 < n16; i0 += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        const float *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            float32x4_t wt = vdupq_n_f32(w[t]);
            a0 = vaddq_f32(a0, vmulq_f32(wt, vld1q_f32(r)));
            a1 = vaddq_f32(a1, vmulq_f32(wt, vld1q_f32(r + 4)));
            a2 = vaddq_f32(a2, vmulq_f32(wt, vld1q_f32(r + 8)));
            a3 = vaddq_f32(a3, vmulq_f32(wt, vld1q_f32(r + 12)));
        }
        vst1q_f32(out + i0, a0);
        vst1q_f32(out + i0 + 4, a1);
        vst1q_f32(out + i0 + 8, a2);
        vst1q_f32(out + i0 + 12, a3);
    }
    cb_weighted_rows_from(out, w, rows, stride, n, i0, len);
}

/* ---- over the 16- and 8-bit KV caches (FORMAT.md "KV cache") ----
 * The f32 kernels above with each cached element converted as it is loaded, four at a time: FCVTL (every
 * f16 is exactly an f32) or SXTL and SCVTF (every int8 is exactly an f32), so the same products and sums in
 * the same order as arch/scalar/attn.h's cb_scores_f16/_i8 and cb_weighted_rows_f16/_i8: the same bits. */
#define CB_ARM_LOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
/* eight elements at p as two f32 vectors lo, hi */
#define CB_ARM_LOAD8_F16(p, lo, hi)                                                                            \
    do {                                                                                                       \
        float16x8_t h_ = vreinterpretq_f16_u16(vld1q_u16(p));                                                  \
        lo = vcvt_f32_f16(vget_low_f16(h_));                                                                   \
        hi = vcvt_high_f32_f16(h_);                                                                            \
    } while (0)
#define CB_ARM_LOAD8_I8(p, lo, hi)                                                                             \
    do {                                                                                                       \
        int16x8_t w_ = vmovl_s8(vld1_s8(p));                                                                   \
        lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w_)));                                                       \
        hi = vcvtq_f32_s32(vmovl_high_s16(w_));                                                                \
    } while (0)

/* Four positions a pass (hd a multiple of 8), as cb_scores_isa: dots = their sums in cb_dot's order. */
#define CB_ARM_DOTS4(q, k0, stride, hd, LOAD8)                                                                \
    const float32x4_t zero_ = vdupq_n_f32(0.0f);                                                              \
    float32x4_t l0 = zero_, l1 = zero_, l2 = zero_, l3 = zero_, h0 = zero_, h1 = zero_, h2 = zero_, h3 = zero_; \
    for (size_t i = 0; i < (hd); i += 8) {                                                                     \
        float32x4_t qa = vld1q_f32((q) + i), qb = vld1q_f32((q) + i + 4), ka, kb;                             \
        LOAD8((k0) + i, ka, kb);                                                                               \
        l0 = vaddq_f32(l0, vmulq_f32(qa, ka));                                                                 \
        h0 = vaddq_f32(h0, vmulq_f32(qb, kb));                                                                 \
        LOAD8((k0) + (stride) + i, ka, kb);                                                                    \
        l1 = vaddq_f32(l1, vmulq_f32(qa, ka));                                                                 \
        h1 = vaddq_f32(h1, vmulq_f32(qb, kb));                                                                 \
        LOAD8((k0) + 2 * (stride) + i, ka, kb);                                                                \
        l2 = vaddq_f32(l2, vmulq_f32(qa, ka));                                                                 \
        h2 = vaddq_f32(h2, vmulq_f32(qb, kb));                                                                 \
        LOAD8((k0) + 3 * (stride) + i, ka, kb);                                                                \
        l3 = vaddq_f32(l3, vmulq_f32(qa, ka));                                                                 \
        h3 = vaddq_f32(h3, vmulq_f32(qb, kb));                                                                 \
    }                                                                                                          \
    float32x4_t u0 = vaddq_f32(l0, h0), u1 = vaddq_f32(l1, h1), u2 = vaddq_f32(l2, h2), u3 = vaddq_f32(l3, h3); \
    float32x4_t dots = vaddq_f32(vpaddq_f32(vuzp1q_f32(u0, u1), vuzp1q_f32(u2, u3)),                          \
                                 vpaddq_f32(vuzp2q_f32(u0, u1), vuzp2q_f32(u2, u3)));

static inline void cb_scores_f16_isa(float *restrict out, const float *restrict q, const uint16_t *restrict keys,
                                     size_t stride, size_t n, size_t hd, float scale)
{
    size_t t = 0;
    if (hd % 8 == 0)
        for (; t + 4 <= n; t += 4) {
            const uint16_t *k0 = keys + t * stride;
            CB_ARM_DOTS4(q, k0, stride, hd, CB_ARM_LOAD8_F16)
            vst1q_f32(out + t, vmulq_f32(dots, vdupq_n_f32(scale)));
        }
    cb_scores_f16_scalar(out + t, q, keys + t * stride, stride, n - t, hd, scale);
}

static inline void cb_scores_i8_isa(float *restrict out, const float *restrict q, const int8_t *restrict keys,
                                    size_t stride, const float *restrict kscale, size_t sstride, size_t n, size_t hd,
                                    float scale)
{
    size_t t = 0;
    if (hd % 8 == 0)
        for (; t + 4 <= n; t += 4) {
            const int8_t *k0 = keys + t * stride;
            const float *ks = kscale + t * sstride;
            CB_ARM_DOTS4(q, k0, stride, hd, CB_ARM_LOAD8_I8)
            float32x4_t vks = {ks[0], ks[sstride], ks[2 * sstride], ks[3 * sstride]};
            vst1q_f32(out + t, vmulq_f32(vmulq_f32(dots, vks), vdupq_n_f32(scale))); /* (dot * kscale) * scale */
        }
    cb_scores_i8_scalar(out + t, q, keys + t * stride, stride, kscale + t * sstride, sstride, n - t, hd, scale);
}

/* 16 outputs at a time in registers across all t; the rest one by one (each output the same sum of t) */
static inline void cb_weighted_rows_f16_isa(float *restrict out, const float *restrict w,
                                            const uint16_t *restrict rows, size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n16 = len & ~(size_t)15; i0 < n16; i0 += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        const uint16_t *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            float32x4_t wt = vdupq_n_f32(w[t]);
            a0 = vaddq_f32(a0, vmulq_f32(wt, CB_ARM_LOAD_F16(r)));
            a1 = vaddq_f32(a1, vmulq_f32(wt, CB_ARM_LOAD_F16(r + 4)));
            a2 = vaddq_f32(a2, vmulq_f32(wt, CB_ARM_LOAD_F16(r + 8)));
            a3 = vaddq_f32(a3, vmulq_f32(wt, CB_ARM_LOAD_F16(r + 12)));
        }
        vst1q_f32(out + i0, a0);
        vst1q_f32(out + i0 + 4, a1);
        vst1q_f32(out + i0 + 8, a2);
        vst1q_f32(out + i0 + 12, a3);
    }
    for (; i0 < len; i0++) {
        float acc = 0.0f;
        for (size_t t = 0; t < n; t++)
            acc = acc + w[t] * cb_f16_to_f32(rows[t * stride + i0]);
        out[i0] = acc;
    }
}

static inline void cb_weighted_rows_i8_isa(float *restrict out, const float *restrict w, const int8_t *restrict rows,
                                           size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n16 = len & ~(size_t)15; i0 < n16; i0 += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            float32x4_t wt = vdupq_n_f32(w[t]);
            int16x8_t lo = vmovl_s8(vld1_s8(r)), hi = vmovl_s8(vld1_s8(r + 8)); /* 16 int8 */
            a0 = vaddq_f32(a0, vmulq_f32(wt, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
            a1 = vaddq_f32(a1, vmulq_f32(wt, vcvtq_f32_s32(vmovl_high_s16(lo))));
            a2 = vaddq_f32(a2, vmulq_f32(wt, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
            a3 = vaddq_f32(a3, vmulq_f32(wt, vcvtq_f32_s32(vmovl_high_s16(hi))));
        }
        vst1q_f32(out + i0, a0);
        vst1q_f32(out + i0 + 4, a1);
        vst1q_f32(out + i0 + 8, a2);
        vst1q_f32(out + i0 + 12, a3);
    }
    for (; i0 < len; i0++) {
        float acc = 0.0f;
        for (size_t t = 0; t < n; t++)
            acc = acc + w[t] * (float)rows[t * stride + i0];
        out[i0] = acc;
    }
}

#endif
#endif /* CB_ARCH_ARM_ATTN_H */
