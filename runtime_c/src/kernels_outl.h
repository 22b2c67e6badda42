/*
 * kernels_outl.h - the int8c corrections (kernels.h, cb_tensor): the one walk over them that every
 * matmul path (scalar and vector, float and integer activations) and the row lookup use. Included
 * by kernels.c, kernels_q8.c and the kernel tests.
 *
 * The corrections are sorted by flat index row * cols + col, stored as gaps (idx[0] = ogap[0],
 * idx[k] = idx[k-1] + ogap[k]), so one pass serves a whole row range: a cb_outl is the next
 * correction k and its flat index idx.
 */
#ifndef CB_KERNELS_OUTL_H
#define CB_KERNELS_OUTL_H

#include "cbmath.h"
#include "kernels.h"

#if defined(__GNUC__)
#define CB_OUTL_INLINE static inline __attribute__((always_inline))
#else
#define CB_OUTL_INLINE static inline
#endif

typedef struct cb_outl {
    size_t k;
    uint64_t idx;
} cb_outl;

/* The walk, as the loop for (; cb_outl_before(t, o, end); o = cb_outl_step(t, o)) over the corrections
 * before flat index end, each at o.idx with value t->oval[o.k]: whether the next one lies before end,
 * and the walk one correction on. */
CB_OUTL_INLINE int cb_outl_before(const cb_tensor *t, cb_outl o, uint64_t end)
{
    return o.k < t->n_outliers && o.idx < end;
}

CB_OUTL_INLINE cb_outl cb_outl_step(const cb_tensor *t, cb_outl o)
{
    if (++o.k < t->n_outliers)
        o.idx += t->ogap[o.k];
    return o;
}

/* The walk moved past every correction before flat index end. Sixteen at a time while the sixteenth is
 * still before end: a lookup far into a large matrix (an embedding row) walks tens of thousands. */
static inline cb_outl cb_outl_skip(const cb_tensor *t, cb_outl o, uint64_t end)
{
    while (o.idx < end && o.k + 16 < t->n_outliers) {
        uint32_t run = 0;
        for (size_t i = 1; i <= 16; i++)
            run += t->ogap[o.k + i];
        if (o.idx + run >= end)
            break;
        o.idx += run;
        o.k += 16;
    }
    for (; cb_outl_before(t, o, end); o = cb_outl_step(t, o))
        continue;
    return o;
}

/* The walk at the first correction at or after flat index flat. */
static inline cb_outl cb_outl_seek(const cb_tensor *t, uint64_t flat)
{
    cb_outl o = {0, t->n_outliers ? t->ogap[0] : 0};
    return cb_outl_skip(t, o, flat);
}

/* dot[j * ld + i] += v * x[j][c] for j < n, n >= 1: one correction's terms */
CB_OUTL_INLINE void cb_outl_add(size_t n, const float *const *x, float *dot, size_t ld, size_t i, size_t c, float v)
{
    size_t j = 0;
    do /* not a for loop: n >= 1, and its test would cost one more compare per correction */
        dot[j * ld + i] = dot[j * ld + i] + v * x[j][c];
    while (++j < n);
}

/* The corrections of rows [r, r + nr) (a tile's), o at the first of them: for each, in index order, and each token
 * j < n (n >= 1), dot[j * ld + i] += oval * x[j][col] (i = row - r). Returns the walk past row r + nr - 1. The
 * row of a correction comes from a multiplication, not a loop: (local + 0.5) / cols lies at least
 * 0.5 / cols from an integer, far more than a double's rounding of a product below 2^40. */
CB_OUTL_INLINE cb_outl cb_outl_apply(const cb_tensor *t, cb_outl o, size_t r, size_t nr, size_t n,
                                     const float *const *x, float *dot, size_t ld)
{
    const size_t cols = t->cols;
    const uint64_t first = (uint64_t)r * cols, end = first + nr * cols;
    const double inv_cols = 1.0 / (double)cols;
    for (; cb_outl_before(t, o, end); o = cb_outl_step(t, o)) {
        size_t local = (size_t)(o.idx - first), i = (size_t)(((double)local + 0.5) * inv_cols);
        cb_outl_add(n, x, dot, ld, i, local - i * cols, cb_f16_to_f32(t->oval[o.k]));
    }
    return o;
}

/* y[r] = (accumulate ? y[r] : 0) + alpha * (dot + row r's corrections times x), the walk o at row r's
 * first correction; returns the walk past row r. The last step of every float-activation kernel. */
CB_OUTL_INLINE cb_outl cb_finish(const cb_tensor *t, cb_outl o, size_t r, const float *x, float dot, float alpha,
                                 float *y, int accumulate)
{
    const uint64_t first = (uint64_t)r * t->cols;
    for (; cb_outl_before(t, o, first + t->cols); o = cb_outl_step(t, o)) /* one row: the column is the offset */
        cb_outl_add(1, &x, &dot, 1, 0, (size_t)(o.idx - first), cb_f16_to_f32(t->oval[o.k]));
    float v = alpha * dot;
    y[r] = accumulate ? y[r] + v : v;
    return o;
}

#endif /* CB_KERNELS_OUTL_H */
