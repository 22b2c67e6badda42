/*
 * arch/scalar/attn.h - the scalar attention and activation kernels: the reference every ISA's
 * attn.h matches bit for bit, and what fallback.h maps to where an ISA has none. Inlined from
 * kernels.h (head_dim is short: a call costs as much as the work). The _from forms start at an
 * index, for the ISA kernels' tails.
 */
#ifndef CB_ARCH_SCALAR_ATTN_H
#define CB_ARCH_SCALAR_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "../../cbmath.h"

/* Eight partial sums (element i into sum i % 8) combined pairwise: one fixed order on every target, and
 * eight independent chains instead of one long one; a compiler that keeps them in a vector register
 * changes no bit. */
static inline float cb_dot_scalar(const float *a, const float *b, size_t n)
{
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const size_t whole = n & ~(size_t)7, rest = n & 7;
    for (size_t i = 0; i < whole; i += 8)
        for (size_t l = 0; l < 8; l++)
            s[l] = s[l] + a[i + l] * b[i + l];
    for (size_t l = 0; l < rest; l++)
        s[l] = s[l] + a[whole + l] * b[whole + l];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static inline void cb_scores_scalar(float *restrict out, const float *restrict q, const float *restrict keys,
                                    size_t stride, size_t n, size_t hd, float scale)
{
    for (size_t t = 0; t < n; t++)
        out[t] = cb_dot_scalar(q, keys + t * stride, hd) * scale;
}

/* cb_weighted_rows for the outputs [i0, len): eight at a time in registers, then one by one */
static inline void cb_weighted_rows_from(float *restrict out, const float *restrict w, const float *restrict rows,
                                         size_t stride, size_t n, size_t i0, size_t len)
{
    const size_t whole = len & ~(size_t)7, rest = len & 7; /* not i < len: GCC's loop warnings */
    for (; i0 < whole; i0 += 8) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (size_t t = 0; t < n; t++)
            for (size_t l = 0; l < 8; l++)
                acc[l] = acc[l] + w[t] * rows[t * stride + i0 + l];
        for (size_t l = 0; l < 8; l++)
            out[i0 + l] = acc[l];
    }
    for (size_t l = 0; l < rest; l++) {
        float acc = 0.0f;
        for (size_t t = 0; t < n; t++)
            acc = acc + w[t] * rows[t * stride + whole + l];
        out[whole + l] = acc;
    }
}

static inline void cb_weighted_rows_scalar(float *restrict out, const float *restrict w, const float *restrict rows,
                                           size_t stride, size_t n, size_t len)
{
    cb_weighted_rows_from(out, w, rows, stride, n, 0, len);
}

/* The 16- and 8-bit KV caches (FORMAT.md "KV cache"): the same sums in the same order as cb_dot_scalar and
 * cb_weighted_rows_from, each cached element converted to f32 exactly as it is read (an f16 is exactly an
 * f32; an int8 is its integer value, its head's scale applied once per position), so every target gives
 * these functions' bits. CB_DOT8 is the eight-partial-sum dot with b[i] read through CVT. */
#define CB_DOT8(a, b, n, CVT)                                                                               \
    do {                                                                                                   \
        const size_t whole_ = (n) & ~(size_t)7, rest_ = (n) & 7;                                           \
        for (size_t i_ = 0; i_ < whole_; i_ += 8)                                                          \
            for (size_t l_ = 0; l_ < 8; l_++)                                                              \
                s[l_] = s[l_] + (a)[i_ + l_] * CVT((b)[i_ + l_]);                                          \
        for (size_t l_ = 0; l_ < rest_; l_++)                                                              \
            s[l_] = s[l_] + (a)[whole_ + l_] * CVT((b)[whole_ + l_]);                                      \
    } while (0)
#define CB_SUM8(s) (((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])))
#define CB_I8_TO_F32(v) ((float)(v))

/* out[t] = cb_dot(q, f16 keys row t) * scale */
static inline void cb_scores_f16_scalar(float *restrict out, const float *restrict q, const uint16_t *restrict keys,
                                        size_t stride, size_t n, size_t hd, float scale)
{
    for (size_t t = 0; t < n; t++) {
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        CB_DOT8(q, keys + t * stride, hd, cb_f16_to_f32);
        out[t] = CB_SUM8(s) * scale;
    }
}

/* out[t] = (cb_dot(q, int8 keys row t) * kscale[t * sstride]) * scale */
static inline void cb_scores_i8_scalar(float *restrict out, const float *restrict q, const int8_t *restrict keys,
                                       size_t stride, const float *restrict kscale, size_t sstride, size_t n,
                                       size_t hd, float scale)
{
    for (size_t t = 0; t < n; t++) {
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        CB_DOT8(q, keys + t * stride, hd, CB_I8_TO_F32);
        out[t] = (CB_SUM8(s) * kscale[t * sstride]) * scale;
    }
}

/* cb_weighted_rows_from over cached rows of 16- or 8-bit elements read through CVT */
#define CB_WEIGHTED8(out, w, rows, stride, n, len, CVT)                                                     \
    do {                                                                                                   \
        const size_t whole_ = (len) & ~(size_t)7, rest_ = (len) & 7;                                       \
        for (size_t i0_ = 0; i0_ < whole_; i0_ += 8) {                                                     \
            float acc_[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};                             \
            for (size_t t_ = 0; t_ < (n); t_++)                                                            \
                for (size_t l_ = 0; l_ < 8; l_++)                                                          \
                    acc_[l_] = acc_[l_] + (w)[t_] * CVT((rows)[t_ * (stride) + i0_ + l_]);                 \
            for (size_t l_ = 0; l_ < 8; l_++)                                                              \
                (out)[i0_ + l_] = acc_[l_];                                                                \
        }                                                                                                  \
        for (size_t l_ = 0; l_ < rest_; l_++) {                                                            \
            float acc_ = 0.0f;                                                                             \
            for (size_t t_ = 0; t_ < (n); t_++)                                                            \
                acc_ = acc_ + (w)[t_] * CVT((rows)[t_ * (stride) + whole_ + l_]);                          \
            (out)[whole_ + l_] = acc_;                                                                     \
        }                                                                                                  \
    } while (0)

static inline void cb_weighted_rows_f16_scalar(float *restrict out, const float *restrict w,
                                               const uint16_t *restrict rows, size_t stride, size_t n, size_t len)
{
    CB_WEIGHTED8(out, w, rows, stride, n, len, cb_f16_to_f32);
}

/* w[t] already holds the weight times the position's value scale */
static inline void cb_weighted_rows_i8_scalar(float *restrict out, const float *restrict w,
                                              const int8_t *restrict rows, size_t stride, size_t n, size_t len)
{
    CB_WEIGHTED8(out, w, rows, stride, n, len, CB_I8_TO_F32);
}

/* One head's n values as int8 with an f32 scale: q[i] = round-half-away(x[i] * 127 / max|x|) in
 * [-127, 127], *scale = max|x| / 127, in the float steps of cb_quantize_q8 (a NaN becomes 0; a head
 * whose max|x| is below 2^-100 is zero). */
static inline void cb_kv_quantize_scalar(const float *x, size_t n, int8_t *q, float *scale)
{
    float amax = 0.0f;
    for (size_t k = 0; k < n; k++) {
        float a = x[k] < 0.0f ? -x[k] : x[k];
        amax = a > amax ? a : amax;
    }
    if (!(amax >= 0x1p-100f))
        amax = 0.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (size_t k = 0; k < n; k++) {
        float f = x[k] * id;
        f = f + (f >= 0.0f ? 0.5f : -0.5f);
        int32_t v = f > -128.0f && f < 128.0f ? (int32_t)f : 0; /* truncation: round half away from zero */
        q[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    *scale = amax / 127.0f;
}

static inline void cb_exp_shift_from(float *v, size_t i, size_t n, float shift)
{
    for (; i < n; i++)
        v[i] = cb_expf_inline(v[i] - shift);
}

static inline void cb_exp_shift_scalar(float *v, size_t n, float shift)
{
    cb_exp_shift_from(v, 0, n, shift);
}

static inline void cb_silu_mul_from(float *restrict g, const float *restrict u, size_t i, size_t n)
{
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + cb_expf_inline(-g[i])) * u[i];
}

static inline void cb_silu_mul_scalar(float *restrict g, const float *restrict u, size_t n)
{
    cb_silu_mul_from(g, u, 0, n);
}

/* the largest of max and v[i, n): a NaN is skipped (which zero a tie of +0 and -0 keeps changes no
 * exp(v - max)) */
static inline float cb_max_from(const float *v, size_t i, size_t n, float max)
{
    for (; i < n; i++)
        if (v[i] > max)
            max = v[i];
    return max;
}

/* The end of cb_softmax, v[0, n) already exp(v - max) and part[] the partial sums of v[0, i) (element k
 * into part[k % 8]): the rest of the sums, their total in cb_dot's order, the division. */
static inline void cb_softmax_finish(float *v, size_t i, size_t n, float *part)
{
    for (; i < n; i++)
        part[i % 8] = part[i % 8] + v[i];
    float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t l = 0; l < 8; l++)
            v[i + l] = v[i + l] / sum;
    for (; i < n; i++)
        v[i] = v[i] / sum;
}

static inline void cb_softmax_scalar(float *v, size_t n)
{
    float max = cb_max_from(v, 1, n, v[0]), part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    size_t i = 0;
    cb_exp_shift_scalar(v, n, max);
    for (; i + 8 <= n; i += 8) /* whole chunks of eight: the compiler's vector code, no remainder loop */
        for (size_t l = 0; l < 8; l++)
            part[l] = part[l] + v[i + l];
    cb_softmax_finish(v, i, n, part);
}

#endif /* CB_ARCH_SCALAR_ATTN_H */
