/*
 * kernels.c - see kernels.h. The weights were bounds-checked once by
 * colibri_init; nothing here checks again.
 *
 * The SIMD path: the ISA header gives a handful of vector primitives (load
 * f32/f16/int8 as f32 lanes, fma, add, sum); the row dots below are written
 * once over them. Four rows at a time share each load of x, two vectors per
 * row per step keep eight FMA chains in flight, and the columns a whole
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
#endif
#endif

#if defined(__GNUC__)
#define CB_INLINE static inline __attribute__((always_inline))
#else
#define CB_INLINE static inline
#endif

float cb_dot(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float cb_scale(const cb_tensor *t, size_t r, size_t g)
{
    size_t i = r * t->n_groups + g;
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

void cb_matvec_scalar(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    uint64_t row_start = 0; /* flat index of W[r][0]: a running sum, so no division per outlier */
    size_t k = 0;           /* next outlier; sorted, so one pass over them serves all rows */
    uint64_t idx = t->n_outliers ? t->ogap[0] : 0;
    for (size_t r = 0; r < t->rows; r++, row_start += t->cols) {
        float dot = cb_row_dot(t, r, x);
        while (k < t->n_outliers && idx < row_start + t->cols) {
            dot += cb_f16_to_f32(t->oval[k]) * x[idx - row_start];
            if (++k < t->n_outliers)
                idx += t->ogap[k];
        }
        float v = alpha * dot;
        y[r] = accumulate ? y[r] + v : v;
    }
}

#if defined(CB_SIMD_NAME)

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
    cb_vf b0 = cb_vzero(vl), b1 = cb_vzero(vl), b2 = cb_vzero(vl), b3 = cb_vzero(vl);
    size_t c = 0;
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
    if (c + vl <= n) {
        cb_vf xa = cb_vld_f32(x + c, vl);
        a0 = cb_vfma(a0, cb_vweights(w0, c, dt, vl), xa, vl);
        a1 = cb_vfma(a1, cb_vweights(w1, c, dt, vl), xa, vl);
        a2 = cb_vfma(a2, cb_vweights(w2, c, dt, vl), xa, vl);
        a3 = cb_vfma(a3, cb_vweights(w3, c, dt, vl), xa, vl);
        c += vl;
    }
    float s0 = cb_vsum(cb_vadd(a0, b0, vl), vl), s1 = cb_vsum(cb_vadd(a1, b1, vl), vl);
    float s2 = cb_vsum(cb_vadd(a2, b2, vl), vl), s3 = cb_vsum(cb_vadd(a3, b3, vl), vl);
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
    cb_vf a = cb_vzero(vl), b = cb_vzero(vl);
    size_t c = 0;
    for (; c + 2 * vl <= n; c += 2 * vl) {
        a = cb_vfma(a, cb_vweights(w, c, dt, vl), cb_vld_f32(x + c, vl), vl);
        b = cb_vfma(b, cb_vweights(w, c + vl, dt, vl), cb_vld_f32(x + c + vl, vl), vl);
    }
    if (c + vl <= n) {
        a = cb_vfma(a, cb_vweights(w, c, dt, vl), cb_vld_f32(x + c, vl), vl);
        c += vl;
    }
    float s = cb_vsum(cb_vadd(a, b, vl), vl);
    for (; c < n; c++)
        s += cb_weight(w, c, dt) * x[c];
    return s;
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

void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    uint64_t row_start = 0; /* as in cb_matvec_scalar */
    size_t k = 0;
    uint64_t idx = t->n_outliers ? t->ogap[0] : 0;
    float dot[4];
    for (size_t r0 = 0, nr; r0 < t->rows; r0 += nr) {
        nr = t->rows - r0 >= 4 ? 4 : 1; /* the last rows % 4 one at a time */
        cb_rows_dot(t, r0, nr, x, dot);
        for (size_t i = 0; i < nr; i++, row_start += t->cols) {
            float d = dot[i];
            while (k < t->n_outliers && idx < row_start + t->cols) {
                d += cb_f16_to_f32(t->oval[k]) * x[idx - row_start];
                if (++k < t->n_outliers)
                    idx += t->ogap[k];
            }
            float v = alpha * d;
            y[r0 + i] = accumulate ? y[r0 + i] + v : v;
        }
    }
}

const char *cb_kernels_isa(void)
{
    return CB_SIMD_NAME;
}

#else /* no SIMD path for this target */

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
        for (size_t g = 0, c = 0; g < t->n_groups; g++) {
            size_t end = c + t->group_size < cols ? c + t->group_size : cols;
            float s = cb_scale(t, r, g);
            for (; c < end; c++)
                out[c] = s * (float)q[c];
        }
    }
    /* this row's outliers: the gaps are a running sum, so walk from the first one */
    uint64_t row_start = (uint64_t)r * cols, idx = 0;
    for (size_t k = 0; k < t->n_outliers; k++) {
        idx += t->ogap[k];
        if (idx >= row_start + cols)
            break;
        if (idx >= row_start)
            out[idx - row_start] += cb_f16_to_f32(t->oval[k]);
    }
}
