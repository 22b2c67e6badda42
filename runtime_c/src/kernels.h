/*
 * kernels.h - matrix-vector kernels over the blob's weight formats.
 *
 * cb_matvec_scalar is the reference: plain loops, one output row at a time,
 * summed in input order. It always builds. cb_matvec is the same computation
 * through the ISA path the compiler's predefined macros select (AVX-512,
 * AVX2+FMA+F16C, NEON, RVV 1.0, MVE with floating point; none, or
 * -DCOLIBRI_SCALAR: the scalar one).
 * The SIMD paths read only the rows' own bytes (the padded stride at most)
 * and x[0, cols); their float sums differ from the scalar ones only in
 * summation order (and FMA's single rounding), so targets agree on greedy
 * tokens, not on the last bit of every logit. The integer matmuls below
 * (int8 weights and activations) agree on every bit.
 */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(COLIBRI_SCALAR)
#include <arm_neon.h>
#define CB_ATT_NEON 1 /* AArch64: IEEE subnormals, so its vector sums are the scalar ones' bits */
#endif

enum { CB_F32 = 1, CB_F16 = 2, CB_I8 = 3, CB_I8C = 4 }; /* weight and scale dtypes, as in FORMAT.md */

/* One validated weight matrix, pointers into the blob. W[r][c] =
 * scale[r][c / group_size] * q[r][c] (I8, I8C), plus oval[i] at flat index
 * idx[i] = idx[i-1] + ogap[i] (idx[0] = ogap[0]) for I8C; F32 and F16 are stored as is. */
typedef struct cb_tensor {
    const uint8_t *data;   /* rows * row_stride bytes */
    const uint8_t *scales; /* rows * n_groups scales of scale_dtype (I8, I8C) */
    const uint16_t *ogap;  /* n_outliers gaps between flat indices row*cols + col (validated increasing) */
    const uint16_t *oval;  /* n_outliers f16 corrections */
    uint32_t rows, cols, row_stride, group_size, n_groups, n_outliers;
    uint8_t dtype, scale_dtype;
    uint8_t q8;    /* multiplied with int8 activations: cb_matmul_q8 (format 1.2, FORMAT.md "Integer matmuls") */
    uint8_t tiled; /* q8 and stored in 16-row tiles (layout 2); else row-major */
} cb_tensor;

/* In the header so the attention loops inline them (head_dim is short: a call costs as much as the work). */
/* Eight partial sums (element i into sum i % 8) combined pairwise: one fixed order on every target, and
 * eight independent chains instead of one long one; a compiler that keeps them in a vector register
 * changes no bit. */
static inline float cb_dot(const float *a, const float *b, size_t n)
{
#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
    if (n % 8 == 0) { /* the eight sums in one register, combined in the same order */
        __m256 v = _mm256_setzero_ps();
        for (size_t i = 0; i < n; i += 8)
            v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* s0+s4 .. s3+s7 */
        t = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* (s0+s4)+(s2+s6), (s1+s5)+(s3+s7) */
        return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
    }
#endif
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const size_t whole = n & ~(size_t)7, rest = n & 7;
    for (size_t i = 0; i < whole; i += 8)
        for (size_t l = 0; l < 8; l++)
            s[l] = s[l] + a[i + l] * b[i + l];
    for (size_t l = 0; l < rest; l++)
        s[l] = s[l] + a[whole + l] * b[whole + l];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* out[t] = cb_dot(q, keys + t * stride, hd) * scale for t < n: the attention's scores. With AVX2 (hd a
 * multiple of 8) eight positions at a time, each position's eight lane sums in a register of its own and
 * the eight registers combined across one another in cb_dot's order: the same bits, without one
 * horizontal reduction per position. AArch64 NEON does the same four positions at a time. */
static inline void cb_scores(float *restrict out, const float *restrict q, const float *restrict keys, size_t stride,
                             size_t n, size_t hd, float scale)
{
    size_t t = 0;
#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
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
#elif defined(CB_ATT_NEON) /* four positions a pass: sums 0-3 and 4-7 of each in two registers */
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
#endif
    for (; t < n; t++)
        out[t] = cb_dot(q, keys + t * stride, hd) * scale;
}

/* out[i] = sum over t < n, in order, of w[t] * rows[t * stride + i], for i < len (the attention's values
 * weighted by the scores): the outputs kept in registers across all t (32 at a time with AVX2, 16 with
 * AArch64 NEON, else 8), each element still the same multiplies and adds in the same order as one axpy
 * per t. */
static inline void cb_weighted_rows(float *restrict out, const float *restrict w, const float *restrict rows,
                                    size_t stride, size_t n, size_t len)
{
    const size_t whole = len & ~(size_t)7, rest = len & 7; /* not i < len: GCC's loop warnings */
    size_t i0 = 0;
#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
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
#elif defined(CB_ATT_NEON)
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
#endif
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

/* v[i] = exp(v[i] - max) / sum: max the largest v[i] (NaNs skipped unless v[0] is one), exp cb_expf,
 * sum the eight partial sums of cb_dot (element i into sum i % 8) combined in its order. */
void cb_softmax(float *v, size_t n);
/* v[i] = cb_expf(v[i] - shift), and g[i] = silu(g[i]) * u[i] = g[i] / (1 + cb_expf(-g[i])) * u[i]: with
 * AVX2 eight at a time, by the same operations, so the same bits as the scalar loops */
void cb_exp_shift(float *v, size_t n, float shift);
void cb_silu_mul(float *restrict g, const float *restrict u, size_t n);

/* y[r] = (accumulate ? y[r] : 0) + alpha * (W x)[r]. x has cols, y rows elements; they must not overlap. */
void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate);

/* The scalar reference of cb_matvec, for tests and for targets without a SIMD path. */
void cb_matvec_scalar(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate);

/* Several tokens at once, over the rows [r0, r1): for j < n and r0 <= r < r1,
 *   y[j][r] = (accumulate ? y[j][r] : 0) + alpha[j] * (W x[j])[r].
 * Each (token, row) result is computed with exactly the operations, in exactly the order, that
 * cb_matvec (cb_matmul_scalar: cb_matvec_scalar) uses for that row: it is bit-identical to n
 * cb_matvec calls, whatever n and however the rows are split into ranges. The weights are read
 * once for all n tokens. No x[j] may overlap any y[k]. */
void cb_matmul(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
               const float *alpha, int accumulate);
void cb_matmul_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                      const float *alpha, int accumulate);

/* The path cb_matvec takes: "scalar", "avx512", "avx2", "neon", "rvv", "mve". */
const char *cb_kernels_isa(void);

/* ---- integer matmuls (FORMAT.md "Integer matmuls") ----
 * A q8 tensor (I8/I8C, cols and group_size multiples of CB_ACT_BLOCK) is multiplied with activations
 * quantized per token: block b of CB_ACT_BLOCK values gets d[b] = max|x| / 127 and
 * q[k] = round-half-away(x[k] * 127 / max|x|) in [-127, 127]; s[b] = sum of the block's q.
 * For row r and token j, with isum_b the exact int32 dot of the row's block b with q,
 *   acc = 0; for b in order: acc += ((float)isum_b * d[b]) * scale[r][g(b)]   (three roundings, no FMA)
 * then the row's corrections are added in float (acc += oval * x[idx], as cb_matvec) and
 *   y[j][r] = (accumulate ? y[j][r] : 0) + alpha[j] * acc.
 * Integer sums are exact in any order, and the float steps run per row in block order in every ISA
 * path, so every path gives the scalar one's result bit for bit. */
#define CB_ACT_BLOCK 32u
#define CB_TILE_ROWS 16u

typedef struct cb_xq {
    const int8_t *q;  /* cols values (the matrix's), padded to whole blocks with zeros */
    const float *d;   /* per block */
    const int32_t *s; /* per block */
} cb_xq;

/* x[0, n) -> q, d, s of ceil(n / CB_ACT_BLOCK) blocks (q zero-padded to whole blocks) */
void cb_quantize_q8(const float *x, size_t n, int8_t *q, float *d, int32_t *s);

/* cb_matmul for a q8 tensor; xq[j] are the x[j] quantized. Rows [r0, r1) with r0 and r1 multiples of
 * CB_TILE_ROWS or r1 == rows. */
void cb_matmul_q8(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq, const float *const *x,
                  float *const *y, const float *alpha, int accumulate);
void cb_matmul_q8_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate);

/* The path cb_matmul_q8 takes: "scalar", "avx512vnni", "avx2", "neon", "neon-dotprod", "rvv", "mve", "dsp". */
const char *cb_kernels_q8_isa(void);

/* The row corrections of int8c (shared with kernels_q8.c): y_j[r] from the row's dot without them. */
typedef struct cb_outl {
    size_t k;
    uint64_t idx;
} cb_outl;
cb_outl cb_outl_seek(const cb_tensor *t, uint64_t flat);
cb_outl cb_finish(const cb_tensor *t, cb_outl o, size_t r, const float *x, float dot, float alpha, float *y,
                  int accumulate);
float cb_scale(const cb_tensor *t, size_t r, size_t g);

/* out[c] = W[r][c]: one dequantized row (the embedding lookup). */
void cb_dequant_row(const cb_tensor *t, size_t r, float *out);

#endif /* CB_KERNELS_H */
