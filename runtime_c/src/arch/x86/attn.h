/*
 * arch/x86/attn.h - AVX2 attention and activation kernels (x86-64-v3 and up): the same operations in
 * the same order as arch/scalar/attn.h, so the same bits. Inlined from kernels.h.
 */
#ifndef CB_ARCH_X86_ATTN_H
#define CB_ARCH_X86_ATTN_H

#if CB_ARCH == CB_ARCH_X86 && defined(CB_HAS_ATTN)
#include <immintrin.h>

static inline float cb_dot_isa(const float *a, const float *b, size_t n)
{
    if (n % 8 == 0) { /* the eight sums in one register, combined in the same order */
        __m256 v = _mm256_setzero_ps();
        for (size_t i = 0; i < n; i += 8)
            v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* s0+s4 .. s3+s7 */
        t = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* (s0+s4)+(s2+s6), (s1+s5)+(s3+s7) */
        return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
    }
    return cb_dot_scalar(a, b, n);
}

/* Eight positions at a time (hd a multiple of 8), each position's eight lane sums in a register of its
 * own and the eight registers combined across one another in cb_dot's order: the same bits, without
 * one horizontal reduction per position. */
static inline void cb_scores_isa(float *restrict out, const float *restrict q, const float *restrict keys,
                                 size_t stride, size_t n, size_t hd, float scale)
{
    size_t t = 0;
    if (hd % 8 == 0) {
        const __m256 vscale = _mm256_set1_ps(scale);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; t + 8 <= n; t += 8) {
            const float *k = keys + t * stride;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (size_t i = 0; i < hd; i += 8, k += 8) { /* written out: GCC keeps arrays of these in memory */
                __m256 qi = _mm256_loadu_ps(q + i);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(qi, _mm256_loadu_ps(k)));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(qi, _mm256_loadu_ps(k + stride)));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 2 * stride)));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 3 * stride)));
                a4 = _mm256_add_ps(a4, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 4 * stride)));
                a5 = _mm256_add_ps(a5, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 5 * stride)));
                a6 = _mm256_add_ps(a6, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 6 * stride)));
                a7 = _mm256_add_ps(a7, _mm256_mul_ps(qi, _mm256_loadu_ps(k + 7 * stride)));
            }
            /* u = s0+s4, s1+s5, s2+s6, s3+s7 of positions p and p + 1 in one register */
            __m256 b[4] = {
                _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31)),
                _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31)),
                _mm256_add_ps(_mm256_permute2f128_ps(a4, a5, 0x20), _mm256_permute2f128_ps(a4, a5, 0x31)),
                _mm256_add_ps(_mm256_permute2f128_ps(a6, a7, 0x20), _mm256_permute2f128_ps(a6, a7, 0x31))};
            /* u0+u2, u1+u3 of positions 0, 2 | 1, 3 (and 4, 6 | 5, 7) */
            __m256 c0 = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], 0x44), _mm256_shuffle_ps(b[0], b[1], 0xee));
            __m256 c1 = _mm256_add_ps(_mm256_shuffle_ps(b[2], b[3], 0x44), _mm256_shuffle_ps(b[2], b[3], 0xee));
            /* (u0+u2) + (u1+u3): positions 0, 2, 4, 6 | 1, 3, 5, 7 */
            __m256 s = _mm256_mul_ps(_mm256_hadd_ps(c0, c1), vscale);
            _mm256_storeu_ps(out + t, _mm256_permutevar8x32_ps(s, order));
        }
    }
    for (; t < n; t++)
        out[t] = cb_dot_isa(q, keys + t * stride, hd) * scale;
}

/* 32 outputs at a time in registers across all t, each the scalar kernel's multiplies and adds */
static inline void cb_weighted_rows_isa(float *restrict out, const float *restrict w, const float *restrict rows,
                                        size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n32 = len & ~(size_t)31; i0 < n32; i0 += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            __m256 wt = _mm256_broadcast_ss(w + t);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wt, _mm256_loadu_ps(r)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wt, _mm256_loadu_ps(r + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wt, _mm256_loadu_ps(r + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wt, _mm256_loadu_ps(r + 24)));
        }
        _mm256_storeu_ps(out + i0, a0);
        _mm256_storeu_ps(out + i0 + 8, a1);
        _mm256_storeu_ps(out + i0 + 16, a2);
        _mm256_storeu_ps(out + i0 + 24, a3);
    }
    cb_weighted_rows_from(out, w, rows, stride, n, i0, len);
}

/* ---- over the 16- and 8-bit KV caches (FORMAT.md "KV cache") ----
 * The f32 kernels above with each cached element converted as it is loaded: F16C's VCVTPH2PS (every f16
 * is exactly an f32) or a sign extension and VCVTDQ2PS (every int8 is exactly an f32), so the same
 * products and sums in the same order as arch/scalar/attn.h's cb_scores_f16/_i8 and
 * cb_weighted_rows_f16/_i8: the same bits. */
#define CB_X86_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define CB_X86_LOAD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p))))

/* The eight lane sums of eight positions (a0 .. a7) reduced in cb_dot's order, positions in order. */
static inline __m256 cb_x86_sums8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                                  __m256 a7)
{
    __m256 b0 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
    __m256 b1 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
    __m256 b2 = _mm256_add_ps(_mm256_permute2f128_ps(a4, a5, 0x20), _mm256_permute2f128_ps(a4, a5, 0x31));
    __m256 b3 = _mm256_add_ps(_mm256_permute2f128_ps(a6, a7, 0x20), _mm256_permute2f128_ps(a6, a7, 0x31));
    __m256 c0 = _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x44), _mm256_shuffle_ps(b0, b1, 0xee));
    __m256 c1 = _mm256_add_ps(_mm256_shuffle_ps(b2, b3, 0x44), _mm256_shuffle_ps(b2, b3, 0xee));
    return _mm256_permutevar8x32_ps(_mm256_hadd_ps(c0, c1), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The lane sums of positions k .. k + 7 (stride elements apart) against q, each element through LOAD. */
#define CB_X86_DOTS8(q, k, stride, hd, LOAD)                                                                   \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;             \
    for (size_t i = 0; i < (hd); i += 8) {                                                                      \
        const __m256 qi = _mm256_loadu_ps((q) + i);                                                            \
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(qi, LOAD((k) + i)));                                               \
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(qi, LOAD((k) + i + (stride))));                                    \
        a2 = _mm256_add_ps(a2, _mm256_mul_ps(qi, LOAD((k) + i + 2 * (stride))));                                \
        a3 = _mm256_add_ps(a3, _mm256_mul_ps(qi, LOAD((k) + i + 3 * (stride))));                                \
        a4 = _mm256_add_ps(a4, _mm256_mul_ps(qi, LOAD((k) + i + 4 * (stride))));                                \
        a5 = _mm256_add_ps(a5, _mm256_mul_ps(qi, LOAD((k) + i + 5 * (stride))));                                \
        a6 = _mm256_add_ps(a6, _mm256_mul_ps(qi, LOAD((k) + i + 6 * (stride))));                                \
        a7 = _mm256_add_ps(a7, _mm256_mul_ps(qi, LOAD((k) + i + 7 * (stride))));                                \
    }

#if defined(CB_HAS_ATTN_F16)
static inline void cb_scores_f16_isa(float *restrict out, const float *restrict q, const uint16_t *restrict keys,
                                     size_t stride, size_t n, size_t hd, float scale)
{
    size_t t = 0;
    if (hd % 8 == 0)
        for (const __m256 vscale = _mm256_set1_ps(scale); t + 8 <= n; t += 8) {
            const uint16_t *k = keys + t * stride;
            CB_X86_DOTS8(q, k, stride, hd, CB_X86_LOAD_F16)
            _mm256_storeu_ps(out + t, _mm256_mul_ps(cb_x86_sums8(a0, a1, a2, a3, a4, a5, a6, a7), vscale));
        }
    cb_scores_f16_scalar(out + t, q, keys + t * stride, stride, n - t, hd, scale);
}

/* 32 outputs at a time in registers across all t; the rest one by one (each output the same sum of t) */
static inline void cb_weighted_rows_f16_isa(float *restrict out, const float *restrict w,
                                            const uint16_t *restrict rows, size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n32 = len & ~(size_t)31; i0 < n32; i0 += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint16_t *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            __m256 wt = _mm256_broadcast_ss(w + t);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wt, CB_X86_LOAD_F16(r)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wt, CB_X86_LOAD_F16(r + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wt, CB_X86_LOAD_F16(r + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wt, CB_X86_LOAD_F16(r + 24)));
        }
        _mm256_storeu_ps(out + i0, a0);
        _mm256_storeu_ps(out + i0 + 8, a1);
        _mm256_storeu_ps(out + i0 + 16, a2);
        _mm256_storeu_ps(out + i0 + 24, a3);
    }
    for (; i0 < len; i0++) {
        float acc = 0.0f;
        for (size_t t = 0; t < n; t++)
            acc = acc + w[t] * cb_f16_to_f32(rows[t * stride + i0]);
        out[i0] = acc;
    }
}
#endif

#if defined(CB_HAS_ATTN_I8)
static inline void cb_scores_i8_isa(float *restrict out, const float *restrict q, const int8_t *restrict keys,
                                    size_t stride, const float *restrict kscale, size_t sstride, size_t n, size_t hd,
                                    float scale)
{
    size_t t = 0;
    if (hd % 8 == 0)
        for (const __m256 vscale = _mm256_set1_ps(scale); t + 8 <= n; t += 8) {
            const int8_t *k = keys + t * stride;
            const float *ks = kscale + t * sstride;
            CB_X86_DOTS8(q, k, stride, hd, CB_X86_LOAD_I8)
            __m256 vks = _mm256_setr_ps(ks[0], ks[sstride], ks[2 * sstride], ks[3 * sstride], ks[4 * sstride],
                                        ks[5 * sstride], ks[6 * sstride], ks[7 * sstride]);
            __m256 s = _mm256_mul_ps(cb_x86_sums8(a0, a1, a2, a3, a4, a5, a6, a7), vks); /* (dot * kscale) * scale */
            _mm256_storeu_ps(out + t, _mm256_mul_ps(s, vscale));
        }
    cb_scores_i8_scalar(out + t, q, keys + t * stride, stride, kscale + t * sstride, sstride, n - t, hd, scale);
}

static inline void cb_weighted_rows_i8_isa(float *restrict out, const float *restrict w, const int8_t *restrict rows,
                                           size_t stride, size_t n, size_t len)
{
    size_t i0 = 0;
    for (const size_t n32 = len & ~(size_t)31; i0 < n32; i0 += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *r = rows + i0;
        for (size_t t = 0; t < n; t++, r += stride) {
            __m256 wt = _mm256_broadcast_ss(w + t);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wt, CB_X86_LOAD_I8(r)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wt, CB_X86_LOAD_I8(r + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wt, CB_X86_LOAD_I8(r + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wt, CB_X86_LOAD_I8(r + 24)));
        }
        _mm256_storeu_ps(out + i0, a0);
        _mm256_storeu_ps(out + i0 + 8, a1);
        _mm256_storeu_ps(out + i0 + 16, a2);
        _mm256_storeu_ps(out + i0 + 24, a3);
    }
    for (; i0 < len; i0++) {
        float acc = 0.0f;
        for (size_t t = 0; t < n; t++)
            acc = acc + w[t] * (float)rows[t * stride + i0];
        out[i0] = acc;
    }
}
#endif

/* cb_expf_inline on eight lanes: the same operations in the same order (a mul and an add where it
 * has them, never an FMA; the truncating conversion C's cast does; k / 2 rounding towards zero), the
 * special inputs blended in at the end as it selects them. */
static inline __m256 cb_exp8(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-103.972084045410156f);
    const __m256 zero = _mm256_setzero_ps();
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 above = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    __m256 xc = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_blendv_ps(x, zero, nan), lo, below), hi, above);
    __m256 fk = _mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f));
    __m256 half = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(-0.5f), _mm256_cmp_ps(fk, zero, _CMP_LT_OQ));
    __m256i k = _mm256_cvttps_epi32(_mm256_add_ps(fk, half));
    __m256 kf = _mm256_cvtepi32_ps(k);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(kf, _mm256_set1_ps(0.693359375f))),
                             _mm256_mul_ps(kf, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(1.9875691500e-4f), r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    __m256i k1 = _mm256_srai_epi32(_mm256_add_epi32(k, _mm256_srli_epi32(k, 31)), 1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, k1), bias), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
    y = _mm256_blendv_ps(y, zero, below);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), above);
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan);
}

static inline void cb_exp_shift_isa(float *v, size_t n, float shift)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i, cb_exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(shift))));
    cb_exp_shift_from(v, i, n, shift);
}

static inline void cb_softmax_isa(float *v, size_t n)
{
    float max = v[0], part[8];
    size_t i = 1;
    if (max == max) { /* VMAXPS returns its second operand when the first is a NaN: the NaNs are skipped */
        __m256 m = _mm256_set1_ps(max);
        for (; i + 8 <= n; i += 8)
            m = _mm256_max_ps(_mm256_loadu_ps(v + i), m);
        float lane[8];
        _mm256_storeu_ps(lane, m);
        for (size_t l = 0; l < 8; l++)
            max = lane[l] > max ? lane[l] : max;
    }
    max = cb_max_from(v, i, n, max);
    i = 0;
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 e = cb_exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), vmax));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(part, acc);
    cb_exp_shift_from(v, i, n, max);
    cb_softmax_finish(v, i, n, part);
}

static inline void cb_silu_mul_isa(float *restrict g, const float *restrict u, size_t n)
{
    size_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), e = cb_exp8(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    cb_silu_mul_from(g, u, i, n);
}

#endif
#endif /* CB_ARCH_X86_ATTN_H */
