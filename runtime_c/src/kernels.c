/*
 * kernels.c - see kernels.h. The weights were bounds-checked once by
 * colibri_init; nothing here checks again.
 *
 * The scalar kernel is arch/scalar/matmul.h. The SIMD path: the ISA's
 * arch/<family>/matmul.h gives a handful of vector primitives (load
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
#include "kernels_outl.h"

#if defined(__GNUC__)
#define CB_INLINE static inline __attribute__((always_inline))
#else
#define CB_INLINE static inline
#endif

float cb_scale(const cb_tensor *t, size_t r, size_t g)
{
    size_t i = t->tiled ? ((r / CB_TILE_ROWS) * t->n_groups + g) * CB_TILE_ROWS + r % CB_TILE_ROWS
                        : r * t->n_groups + g;
    if (t->scale_dtype == CB_F32)
        return ((const float *)(const void *)t->scales)[i];
    return cb_f16_to_f32(((const uint16_t *)(const void *)t->scales)[i]);
}

/* The scalar kernel, then the vector primitives of the ISA arch/select.h chose (each header is empty
 * unless it is the one). */
#include "arch/scalar/matmul.h"
#include "arch/x86/matmul.h"
#include "arch/arm/matmul.h"
#include "arch/riscv/matmul.h"
#include "arch/cortex-m/matmul.h"

void cb_exp_shift(float *v, size_t n, float shift)
{
    cb_exp_shift_isa(v, n, shift);
}

void cb_softmax(float *v, size_t n)
{
    cb_softmax_isa(v, n);
}

void cb_silu_mul(float *restrict g, const float *restrict u, size_t n)
{
    cb_silu_mul_isa(g, u, n);
}

#if defined(CB_HAS_MATMUL)


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

/* out[0, nr) (nr = 4 or 1): the dots of nr raw weight rows (no scales) over columns [0, n), one copy per weight type */
static void cb_raw_row_dots(const uint8_t *w, size_t stride, const float *x, size_t n, int dt, size_t nr, float *out)
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
static void cb_tensor_row_dots(const cb_tensor *t, size_t r, size_t nr, const float *x, float *dot)
{
    const uint8_t *row = t->data + r * t->row_stride;
    if (t->dtype == CB_F32 || t->dtype == CB_F16) {
        cb_raw_row_dots(row, t->row_stride, x, t->cols, t->dtype, nr, dot);
        return;
    }
    float part[4];
    for (size_t i = 0; i < nr; i++)
        dot[i] = 0.0f;
    for (size_t g = 0, c = 0; g < t->n_groups; g++, c += t->group_size) {
        size_t n = t->cols - c < t->group_size ? t->cols - c : t->group_size;
        cb_raw_row_dots(row + c, t->row_stride, x + c, n, CB_I8, nr, part);
        for (size_t i = 0; i < nr; i++)
            dot[i] += cb_scale(t, r + i, g) * part[i];
    }
}

/* dot[2i + j] = cb_row_dot(t, r + i, x_j) for i < 2, j < 2, up to summation order, as cb_tensor_row_dots */
static void cb_tensor_row_dots22(const cb_tensor *t, size_t r, const float *x0, const float *x1, float *dot)
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
static void cb_matmul_isa(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x,
                          float *const *y, const float *alpha, int accumulate)
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
                cb_tensor_row_dots22(t, r, x[j], x[j + 1], dot);
                for (size_t i = 0; i < 2; i++)
                    for (size_t k = 0; k < 2; k++)
                        next = cb_finish(t, start[i], r + i, x[j + k], dot[2 * i + k], alpha[j + k], y[j + k],
                                         accumulate);
            }
        for (; j < n; j++) {
            if (nr == 4) {
                cb_tensor_row_dots(t, r, 4, x[j], dot);
            } else {
                for (size_t i = 0; i < nr; i++)
                    cb_tensor_row_dots(t, r + i, 1, x[j], dot + i);
            }
            for (size_t i = 0; i < nr; i++)
                next = cb_finish(t, start[i], r + i, x[j], dot[i], alpha[j], y[j], accumulate);
        }
        o = next;
    }
}

#endif /* CB_HAS_MATMUL */

void cb_matmul(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
               const float *alpha, int accumulate)
{
    if (cb_is_int16(t->dtype)) { /* quantizes x itself (kernels.h "int16 matmuls") */
        cb_matmul_q16(t, r0, r1, n, x, y, alpha, accumulate);
        return;
    }
    cb_matmul_isa(t, r0, r1, n, x, y, alpha, accumulate);
}

void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    cb_matmul(t, 0, t->rows, 1, &x, &y, &alpha, accumulate);
}

const char *cb_kernels_isa(void)
{
    return CB_ISA_NAME;
}

void cb_dequant_row(const cb_tensor *t, size_t r, float *out)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    if (t->dtype == CB_F32) {
        memcpy(out, row, cols * sizeof(float));
    } else if (t->dtype == CB_F16) {
        for (size_t c = 0; c < cols; c++)
            out[c] = cb_f16_to_f32(((const uint16_t *)row)[c]);
    } else if (cb_is_int16(t->dtype)) {
        const int16_t *q = (const int16_t *)row;
        float s = cb_scale(t, r, 0);
        for (size_t c = 0; c < cols; c++)
            out[c] = s * (float)q[c];
    } else if (CB_HAS_INT4 && cb_is_int4(t->dtype)) {
        const uint8_t *b = (const uint8_t *)row; /* block g: 16 bytes, columns 32g + i and 32g + 16 + i */
        for (size_t c = 0; c < cols; c++) {
            size_t i = c % CB_ACT_BLOCK, byte = c / CB_ACT_BLOCK * (CB_ACT_BLOCK / 2) + i % (CB_ACT_BLOCK / 2);
            int v = (i < CB_ACT_BLOCK / 2 ? b[byte] & 15 : b[byte] >> 4) - 8;
            out[c] = cb_scale(t, r, c / CB_ACT_BLOCK) * (float)v;
        }
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
    for (; cb_outl_before(t, o, row_start + cols); o = cb_outl_step(t, o))
        out[o.idx - row_start] += cb_f16_to_f32(t->oval[o.k]);
}
