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
 * j < n (n >= 1), dot[j * ld + i] += oval * x[j][col] (i = row - r). Returns the walk past row r + nr - 1.
 * Row by row: a row's corrections are found by comparing with the row's end (the walk is sorted), and each
 * token's sum stays in a register while that row's corrections are added to it, in index order, so
 * every (row, token) sees the operations of the definition in its order. */
CB_OUTL_INLINE cb_outl cb_outl_apply(const cb_tensor *t, cb_outl o, size_t r, size_t nr, size_t n,
                                     const float *const *x, float *dot, size_t ld)
{
    const size_t cols = t->cols, count = t->n_outliers;
    const uint16_t *gap = t->ogap, *val = t->oval;
    const uint64_t end = (uint64_t)(r + nr) * cols;
    uint64_t first = (uint64_t)r * cols;
    for (size_t i = 0; o.k < count && o.idx < end; i++, first += cols) {
        if (o.idx >= first + cols) /* no correction in row i */
            continue;
        const uint64_t row_end = first + cols;
        cb_outl next = o;
        for (size_t j = 0; j < n; j++) {
            const float *xj = x[j];
            float acc = dot[j * ld + i];
            size_t k = o.k;
            uint64_t idx = o.idx;
            for (;;) {
                acc = acc + cb_f16_to_f32(val[k]) * xj[idx - first];
                if (++k >= count)
                    break;
                idx += gap[k];
                if (idx >= row_end)
                    break;
            }
            dot[j * ld + i] = acc;
            next.k = k;
            next.idx = idx;
        }
        o = next;
    }
    return o;
}

#define CB_OUTL_PEND_PER_BLOCK 4u /* corrections added per block of the next tile (2-8 measured alike) */

/* One token's corrections of a tile applied a few at a time inside the next tile's pass (the decode path,
 * kernels_q8.c): while the weights stream, the core has time for them. The tile's sums in dot (dot[i]: row
 * first / cols + i), the walk at its next correction, the flat end of its rows. Each correction is added as
 * cb_outl_apply adds it and in the same order. Its row comes from a multiplication, not a loop:
 * (local + 0.5) / cols lies at least 0.5 / cols from an integer, far more than a double's rounding of a
 * product below 2^40. */
typedef struct cb_outl_pend {
    cb_outl o;
    uint64_t first, end;
    double inv_cols;
    const float *x;
    float *dot;
} cb_outl_pend;

/* At most max of the pending corrections. */
CB_OUTL_INLINE void cb_outl_pend_run(const cb_tensor *t, cb_outl_pend *p, unsigned max)
{
    cb_outl o = p->o;
    for (unsigned s = 0; s < max && cb_outl_before(t, o, p->end); s++, o = cb_outl_step(t, o)) {
        const int64_t local = (int64_t)(o.idx - p->first), i = (int64_t)(((double)local + 0.5) * p->inv_cols);
        p->dot[i] = p->dot[i] + cb_f16_to_f32(t->oval[o.k]) * p->x[local - i * (int64_t)t->cols];
    }
    p->o = o;
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
