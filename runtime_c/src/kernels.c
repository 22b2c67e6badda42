/*
 * kernels.c - see kernels.h. The weights were bounds-checked once by
 * colibri_init; nothing here checks again.
 *
 * The SIMD path: the ISA header gives a handful of vector primitives (load
 * f32/f16/int8 as f32 lanes, fma, add, sum); the row dots below are written
 * once over them. Four rows at a time share each load of x, two vectors per
 * row per step keep eight FMA chains in flight (one vector and four chains
 * where the header sets CB_VCHAINS 1: MVE, whose eight Q registers would
 * otherwise spill accumulators in every step), and the columns a whole
 * vector does not cover are summed in scalar code: x is read only within
 * [0, cols), since what lies beyond it in the arena is not ours to multiply.
 */
#include "kernels.h"

#include "cbmath.h"

#if !defined(COLIBRI_SCALAR)
#if defined(__AVX2__) || defined(__AVX512F__)
#include "kernels_x86.h"
#elif defined(__ARM_NEON)
#include "kernels_neon.h"
#elif defined(__riscv_vector) && defined(__riscv_v_intrinsic)
#include "kernels_rvv.h"
#elif defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2)
#include "kernels_mve.h"
#endif
#endif

#if defined(__GNUC__)
#define CB_INLINE static inline __attribute__((always_inline))
#else
#define CB_INLINE static inline
#endif



#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
#include <immintrin.h>
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
#define CB_EXP8 1
#endif

void cb_exp_shift(float *v, size_t n, float shift)
{
    size_t i = 0;
#if defined(CB_EXP8)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i, cb_exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(shift))));
#endif
    for (; i < n; i++)
        v[i] = cb_expf_inline(v[i] - shift);
}

void cb_softmax(float *v, size_t n)
{
    float max = v[0], part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    size_t i = 1;
#if defined(CB_EXP8)
    if (max == max) { /* VMAXPS returns its second operand when the first is a NaN: the NaNs are skipped */
        __m256 m = _mm256_set1_ps(max);
        for (; i + 8 <= n; i += 8)
            m = _mm256_max_ps(_mm256_loadu_ps(v + i), m);
        float lane[8];
        _mm256_storeu_ps(lane, m);
        for (size_t l = 0; l < 8; l++)
            max = lane[l] > max ? lane[l] : max;
    }
#endif
    for (; i < n; i++) /* which zero a tie of +0 and -0 keeps changes no exp(v - max) */
        if (v[i] > max)
            max = v[i];
    i = 0;
#if defined(CB_EXP8)
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 e = cb_exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), vmax));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(part, acc);
    for (size_t k = i; k < n; k++)
        v[k] = cb_expf_inline(v[k] - max);
#else
    cb_exp_shift(v, n, max);
    for (; i + 8 <= n; i += 8) /* whole chunks of eight: the compiler's vector code, no remainder loop */
        for (size_t l = 0; l < 8; l++)
            part[l] = part[l] + v[i + l];
#endif
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

void cb_silu_mul(float *restrict g, const float *restrict u, size_t n)
{
    size_t i = 0;
#if defined(CB_EXP8)
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), e = cb_exp8(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + cb_expf_inline(-g[i])) * u[i];
}

float cb_scale(const cb_tensor *t, size_t r, size_t g)
{
    size_t i = t->tiled ? ((r / CB_TILE_ROWS) * t->n_groups + g) * CB_TILE_ROWS + r % CB_TILE_ROWS
                        : r * t->n_groups + g;
    if (t->scale_dtype == CB_F32)
        return ((const float *)(const void *)t->scales)[i];
    return cb_f16_to_f32(((const uint16_t *)(const void *)t->scales)[i]);
}

/* sum_g scale[r][g] * sum_{c in g} q[r][c] * x[c], the outliers not included */
static float cb_row_dot(const cb_tensor *t, size_t r, const float *x)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    float dot = 0.0f;
    if (t->dtype == CB_F32)
        return cb_dot((const float *)row, x, cols);
    if (t->dtype == CB_F16) {
        const uint16_t *w = (const uint16_t *)row;
        for (size_t c = 0; c < cols; c++)
            dot += cb_f16_to_f32(w[c]) * x[c];
        return dot;
    }
    const int8_t *q = (const int8_t *)row;
    for (size_t g = 0, c = 0; g < t->n_groups; g++) {
        size_t end = c + t->group_size < cols ? c + t->group_size : cols;
        float acc = 0.0f;
        for (; c < end; c++)
            acc += (float)q[c] * x[c];
        dot += cb_scale(t, r, g) * acc;
    }
    return dot;
}

/* The outlier walk: (k, idx) is the next outlier and its flat index. Outliers are sorted, so one
 * pass serves all rows; cb_outl_seek starts a row range, cb_outl_add adds one row's corrections
 * to one token's dot and returns where the next row's start. */
static cb_outl cb_outl_skip(const cb_tensor *t, cb_outl o, uint64_t row_end)
{
    /* Sixteen at a time while the sixteenth is still before row_end: a lookup far into a large
     * matrix (an embedding row) walks tens of thousands of them. */
    while (o.idx < row_end && o.k + 16 < t->n_outliers) {
        uint32_t run = 0;
        for (size_t i = 1; i <= 16; i++)
            run += t->ogap[o.k + i];
        if (o.idx + run >= row_end)
            break;
        o.idx += run;
        o.k += 16;
    }
    while (o.k < t->n_outliers && o.idx < row_end)
        if (++o.k < t->n_outliers)
            o.idx += t->ogap[o.k];
    return o;
}

cb_outl cb_outl_seek(const cb_tensor *t, uint64_t flat)
{
    cb_outl o = {0, t->n_outliers ? t->ogap[0] : 0};
    return cb_outl_skip(t, o, flat);
}

static cb_outl cb_outl_add(const cb_tensor *t, cb_outl o, uint64_t row_start, const float *x, float *dot)
{
    float d = *dot;
    while (o.k < t->n_outliers && o.idx < row_start + t->cols) {
        d += cb_f16_to_f32(t->oval[o.k]) * x[o.idx - row_start];
        if (++o.k < t->n_outliers)
            o.idx += t->ogap[o.k];
    }
    *dot = d;
    return o;
}

/* y_j[r] for one row r and token j from its dot without outliers; returns the walk past row r */
cb_outl cb_finish(const cb_tensor *t, cb_outl o, size_t r, const float *x, float dot, float alpha, float *y,
                  int accumulate)
{
    o = cb_outl_add(t, o, (uint64_t)r * t->cols, x, &dot);
    float v = alpha * dot;
    y[r] = accumulate ? y[r] + v : v;
    return o;
}

void cb_matmul_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                      const float *alpha, int accumulate)
{
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;
    for (size_t r = r0; r < r1; r++, o = next) /* rows outside, tokens inside: each row is read once */
        for (size_t j = 0; j < n; j++)
            next = cb_finish(t, o, r, x[j], cb_row_dot(t, r, x[j]), alpha[j], y[j], accumulate);
}

void cb_matvec_scalar(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    cb_matmul_scalar(t, 0, t->rows, 1, &x, &y, &alpha, accumulate);
}

#if defined(CB_SIMD_NAME)

/* Per (row, token) dot, chain a takes the even vectors and chain b the odd ones, added at the end;
 * with CB_VCHAINS 1 chain a takes them all. After the loop over vector pairs at most one vector is
 * left (CB_VLAST: if); with one chain there is no such loop and CB_VLAST (while) is the loop. */
#if !defined(CB_VCHAINS)
#define CB_VCHAINS 2
#endif
#if CB_VCHAINS == 2
#define CB_VLAST if
#define CB_VCHAIN_SUM(a, b) cb_vsum(cb_vadd(a, b, vl), vl)
#else
#define CB_VLAST while
#define CB_VCHAIN_SUM(a, b) cb_vsum(a, vl)
#endif

/* Weight c of a row as f32: the scalar tail of the vector loops. */
CB_INLINE float cb_weight(const uint8_t *row, size_t c, int dt)
{
    switch (dt) {
    case CB_I8:
        return (float)((const int8_t *)row)[c];
    case CB_F16:
        return cb_f16_to_f32(((const uint16_t *)(const void *)row)[c]);
    default:
        return ((const float *)(const void *)row)[c];
    }
}

/* Weights [c, c + vl) of a row as f32 lanes; dt is a constant after inlining. */
CB_INLINE cb_vf cb_vweights(const uint8_t *row, size_t c, int dt, size_t vl)
{
    switch (dt) {
    case CB_I8:
        return cb_vld_i8((const int8_t *)row + c, vl);
    case CB_F16:
        return cb_vld_f16((const uint16_t *)(const void *)row + c, vl);
    default:
        return cb_vld_f32((const float *)(const void *)row + c, vl);
    }
}

/* out[i] = sum_{c < n} w_i[c] x[c] for the four rows w_i = row + i * stride */
CB_INLINE void cb_dot4(const uint8_t *w0, size_t stride, const float *x, size_t n, int dt, float *out)
{
    const size_t vl = cb_vlen();
    const uint8_t *w1 = w0 + stride, *w2 = w1 + stride, *w3 = w2 + stride;
    cb_vf a0 = cb_vzero(vl), a1 = cb_vzero(vl), a2 = cb_vzero(vl), a3 = cb_vzero(vl);
    size_t c = 0;
#if CB_VCHAINS == 2
    cb_vf b0 = cb_vzero(vl), b1 = cb_vzero(vl), b2 = cb_vzero(vl), b3 = cb_vzero(vl);
    for (; c + 2 * vl <= n; c += 2 * vl) {
        cb_vf xa = cb_vld_f32(x + c, vl), xb = cb_vld_f32(x + c + vl, vl);
        a0 = cb_vfma(a0, cb_vweights(w0, c, dt, vl), xa, vl);
        a1 = cb_vfma(a1, cb_vweights(w1, c, dt, vl), xa, vl);
        a2 = cb_vfma(a2, cb_vweights(w2, c, dt, vl), xa, vl);
        a3 = cb_vfma(a3, cb_vweights(w3, c, dt, vl), xa, vl);
        b0 = cb_vfma(b0, cb_vweights(w0, c + vl, dt, vl), xb, vl);
        b1 = cb_vfma(b1, cb_vweights(w1, c + vl, dt, vl), xb, vl);
        b2 = cb_vfma(b2, cb_vweights(w2, c + vl, dt, vl), xb, vl);
        b3 = cb_vfma(b3, cb_vweights(w3, c + vl, dt, vl), xb, vl);
    }
#endif
    CB_VLAST (c + vl <= n) {
        cb_vf xa = cb_vld_f32(x + c, vl);
        a0 = cb_vfma(a0, cb_vweights(w0, c, dt, vl), xa, vl);
        a1 = cb_vfma(a1, cb_vweights(w1, c, dt, vl), xa, vl);
        a2 = cb_vfma(a2, cb_vweights(w2, c, dt, vl), xa, vl);
        a3 = cb_vfma(a3, cb_vweights(w3, c, dt, vl), xa, vl);
        c += vl;
    }
    float s0 = CB_VCHAIN_SUM(a0, b0), s1 = CB_VCHAIN_SUM(a1, b1);
    float s2 = CB_VCHAIN_SUM(a2, b2), s3 = CB_VCHAIN_SUM(a3, b3);
    for (; c < n; c++) {
        s0 += cb_weight(w0, c, dt) * x[c];
        s1 += cb_weight(w1, c, dt) * x[c];
        s2 += cb_weight(w2, c, dt) * x[c];
        s3 += cb_weight(w3, c, dt) * x[c];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

/* The same for one row (the last rows % 4). */
CB_INLINE float cb_dot1(const uint8_t *w, const float *x, size_t n, int dt)
{
    const size_t vl = cb_vlen();
    cb_vf a = cb_vzero(vl);
    size_t c = 0;
#if CB_VCHAINS == 2
    cb_vf b = cb_vzero(vl);
    for (; c + 2 * vl <= n; c += 2 * vl) {
        a = cb_vfma(a, cb_vweights(w, c, dt, vl), cb_vld_f32(x + c, vl), vl);
        b = cb_vfma(b, cb_vweights(w, c + vl, dt, vl), cb_vld_f32(x + c + vl, vl), vl);
    }
#endif
    CB_VLAST (c + vl <= n) {
        a = cb_vfma(a, cb_vweights(w, c, dt, vl), cb_vld_f32(x + c, vl), vl);
        c += vl;
    }
    float s = CB_VCHAIN_SUM(a, b);
    for (; c < n; c++)
        s += cb_weight(w, c, dt) * x[c];
    return s;
}

/* Two rows times two tokens: out[2i + j] = row i . x_j, each exactly as cb_dot1 computes it (the
 * same chains over the same vectors, the same reduction and tail); the weights are loaded and
 * converted once for both tokens. */
CB_INLINE void cb_dot22(const uint8_t *w0, size_t stride, const float *x0, const float *x1, size_t n, int dt,
                        float *out)
{
    const size_t vl = cb_vlen();
    const uint8_t *w1 = w0 + stride;
    cb_vf a00 = cb_vzero(vl), a01 = cb_vzero(vl), a10 = cb_vzero(vl), a11 = cb_vzero(vl);
    size_t c = 0;
#if CB_VCHAINS == 2
    cb_vf b00 = cb_vzero(vl), b01 = cb_vzero(vl), b10 = cb_vzero(vl), b11 = cb_vzero(vl);
    for (; c + 2 * vl <= n; c += 2 * vl) {
        cb_vf u0 = cb_vweights(w0, c, dt, vl), u1 = cb_vweights(w1, c, dt, vl);
        cb_vf xa = cb_vld_f32(x0 + c, vl), xb = cb_vld_f32(x1 + c, vl);
        a00 = cb_vfma(a00, u0, xa, vl);
        a10 = cb_vfma(a10, u1, xa, vl);
        a01 = cb_vfma(a01, u0, xb, vl);
        a11 = cb_vfma(a11, u1, xb, vl);
        u0 = cb_vweights(w0, c + vl, dt, vl);
        u1 = cb_vweights(w1, c + vl, dt, vl);
        xa = cb_vld_f32(x0 + c + vl, vl);
        xb = cb_vld_f32(x1 + c + vl, vl);
        b00 = cb_vfma(b00, u0, xa, vl);
        b10 = cb_vfma(b10, u1, xa, vl);
        b01 = cb_vfma(b01, u0, xb, vl);
        b11 = cb_vfma(b11, u1, xb, vl);
    }
#endif
    CB_VLAST (c + vl <= n) {
        cb_vf u0 = cb_vweights(w0, c, dt, vl), u1 = cb_vweights(w1, c, dt, vl);
        cb_vf xa = cb_vld_f32(x0 + c, vl), xb = cb_vld_f32(x1 + c, vl);
        a00 = cb_vfma(a00, u0, xa, vl);
        a10 = cb_vfma(a10, u1, xa, vl);
        a01 = cb_vfma(a01, u0, xb, vl);
        a11 = cb_vfma(a11, u1, xb, vl);
        c += vl;
    }
    float s00 = CB_VCHAIN_SUM(a00, b00), s01 = CB_VCHAIN_SUM(a01, b01);
    float s10 = CB_VCHAIN_SUM(a10, b10), s11 = CB_VCHAIN_SUM(a11, b11);
    for (; c < n; c++) {
        float u0 = cb_weight(w0, c, dt), u1 = cb_weight(w1, c, dt);
        s00 += u0 * x0[c];
        s01 += u0 * x1[c];
        s10 += u1 * x0[c];
        s11 += u1 * x1[c];
    }
    out[0] = s00;
    out[1] = s01;
    out[2] = s10;
    out[3] = s11;
}

/* out[0, nr) (nr = 4 or 1): the row dots over columns [0, n) of w, one copy per weight type */
static void cb_dot_rows(const uint8_t *w, size_t stride, const float *x, size_t n, int dt, size_t nr, float *out)
{
    if (nr == 4) {
        if (dt == CB_I8)
            cb_dot4(w, stride, x, n, CB_I8, out);
        else if (dt == CB_F16)
            cb_dot4(w, stride, x, n, CB_F16, out);
        else
            cb_dot4(w, stride, x, n, CB_F32, out);
    } else {
        out[0] = dt == CB_I8 ? cb_dot1(w, x, n, CB_I8) : dt == CB_F16 ? cb_dot1(w, x, n, CB_F16)
                                                                     : cb_dot1(w, x, n, CB_F32);
    }
}

/* dot[i] = cb_row_dot(t, r + i, x) for i < nr, up to summation order */
static void cb_rows_dot(const cb_tensor *t, size_t r, size_t nr, const float *x, float *dot)
{
    const uint8_t *row = t->data + r * t->row_stride;
    if (t->dtype == CB_F32 || t->dtype == CB_F16) {
        cb_dot_rows(row, t->row_stride, x, t->cols, t->dtype, nr, dot);
        return;
    }
    float part[4];
    for (size_t i = 0; i < nr; i++)
        dot[i] = 0.0f;
    for (size_t g = 0, c = 0; g < t->n_groups; g++, c += t->group_size) {
        size_t n = t->cols - c < t->group_size ? t->cols - c : t->group_size;
        cb_dot_rows(row + c, t->row_stride, x + c, n, CB_I8, nr, part);
        for (size_t i = 0; i < nr; i++)
            dot[i] += cb_scale(t, r + i, g) * part[i];
    }
}

/* dot[2i + j] = cb_row_dot(t, r + i, x_j) for i < 2, j < 2, up to summation order, as cb_rows_dot */
static void cb_rows_dot22(const cb_tensor *t, size_t r, const float *x0, const float *x1, float *dot)
{
    const uint8_t *row = t->data + r * t->row_stride;
    if (t->dtype == CB_F32 || t->dtype == CB_F16) {
        if (t->dtype == CB_F16)
            cb_dot22(row, t->row_stride, x0, x1, t->cols, CB_F16, dot);
        else
            cb_dot22(row, t->row_stride, x0, x1, t->cols, CB_F32, dot);
        return;
    }
    float part[4];
    for (size_t i = 0; i < 4; i++)
        dot[i] = 0.0f;
    for (size_t g = 0, c = 0; g < t->n_groups; g++, c += t->group_size) {
        size_t n = t->cols - c < t->group_size ? t->cols - c : t->group_size;
        cb_dot22(row + c, t->row_stride, x0 + c, x1 + c, n, CB_I8, part);
        for (size_t i = 0; i < 4; i++)
            dot[i] += cb_scale(t, r + i / 2, g) * part[i];
    }
}

/* Rows are taken 4 at a time for one token (four rows share each load of x), 2 at a time for
 * several (2 rows x 2 tokens share each weight and each x load), the rest one by one; every
 * (row, token) dot comes out the same in each of these, so neither n nor [r0, r1) changes a bit. */
void cb_matmul(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
               const float *alpha, int accumulate)
{
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;
    float dot[4];
    for (size_t r = r0, nr; r < r1; r += nr) {
        size_t block = n == 1 ? 4 : 2;
        nr = r1 - r >= block ? block : 1;
        cb_outl start[4]; /* the outlier walk at each of the nr rows */
        start[0] = o;
        for (size_t i = 1; i < nr; i++)
            start[i] = cb_outl_skip(t, start[i - 1], (uint64_t)(r + i) * t->cols);
        size_t j = 0;
        if (nr == 2)
            for (; j + 2 <= n; j += 2) {
                cb_rows_dot22(t, r, x[j], x[j + 1], dot);
                for (size_t i = 0; i < 2; i++)
                    for (size_t k = 0; k < 2; k++)
                        next = cb_finish(t, start[i], r + i, x[j + k], dot[2 * i + k], alpha[j + k], y[j + k],
                                         accumulate);
            }
        for (; j < n; j++) {
            if (nr == 4) {
                cb_rows_dot(t, r, 4, x[j], dot);
            } else {
                for (size_t i = 0; i < nr; i++)
                    cb_rows_dot(t, r + i, 1, x[j], dot + i);
            }
            for (size_t i = 0; i < nr; i++)
                next = cb_finish(t, start[i], r + i, x[j], dot[i], alpha[j], y[j], accumulate);
        }
        o = next;
    }
}

void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    cb_matmul(t, 0, t->rows, 1, &x, &y, &alpha, accumulate);
}

const char *cb_kernels_isa(void)
{
    return CB_SIMD_NAME;
}

#else /* no SIMD path for this target */

void cb_matmul(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
               const float *alpha, int accumulate)
{
    cb_matmul_scalar(t, r0, r1, n, x, y, alpha, accumulate);
}

void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    cb_matvec_scalar(t, x, y, alpha, accumulate);
}

const char *cb_kernels_isa(void)
{
    return "scalar";
}

#endif

void cb_dequant_row(const cb_tensor *t, size_t r, float *out)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    if (t->dtype == CB_F32) {
        memcpy(out, row, cols * sizeof(float));
    } else if (t->dtype == CB_F16) {
        for (size_t c = 0; c < cols; c++)
            out[c] = cb_f16_to_f32(((const uint16_t *)row)[c]);
    } else {
        const int8_t *q = (const int8_t *)row;
        /* a tiled row: its four bytes of column group c / 4 sit at 64 * (c / 4) + 4 * (r % 16) in its tile */
        const int8_t *tq = (const int8_t *)t->data + (r / CB_TILE_ROWS) * CB_TILE_ROWS * cols + 4 * (r % CB_TILE_ROWS);
        for (size_t g = 0, c = 0; g < t->n_groups; g++) {
            size_t end = c + t->group_size < cols ? c + t->group_size : cols;
            float s = cb_scale(t, r, g);
            if (t->tiled) /* groups are whole 4-column chunks here */
                for (; c < end; c += 4)
                    for (size_t k = 0; k < 4; k++)
                        out[c + k] = s * (float)tq[16 * c + k];
            else
                for (; c < end; c++)
                    out[c] = s * (float)q[c];
        }
    }
    /* this row's outliers */
    uint64_t row_start = (uint64_t)r * cols;
    cb_outl o = cb_outl_seek(t, row_start);
    while (o.k < t->n_outliers && o.idx < row_start + cols) {
        out[o.idx - row_start] += cb_f16_to_f32(t->oval[o.k]);
        if (++o.k < t->n_outliers)
            o.idx += t->ogap[o.k];
    }
}
