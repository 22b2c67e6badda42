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

#define CB_OUTL_CHUNK 16u /* corrections of one row decoded at a time for all the tokens (128 bytes of stack) */

/* The corrections of rows [r, r + nr) (a tile's), o at the first of them: for each, in index order, and each token
 * j < n (n >= 1), dot[j * ld + i] += oval * x[j][col] (i = row - r). Returns the walk past row r + nr - 1.
 * Row by row: a row's corrections are found by comparing with the row's end (the walk is sorted) and decoded
 * once, up to CB_OUTL_CHUNK at a time, into columns and f32 values; then each token's sum stays in a
 * register (four tokens at a time, four independent chains) while they are added to it in index order. So
 * every (row, token) sees the operations of the definition in its order, and a row's walk costs one decode
 * and a loop of a known count per token instead of a data-dependent exit per token. */
CB_OUTL_INLINE cb_outl cb_outl_apply(const cb_tensor *t, cb_outl o, size_t r, size_t nr, size_t n,
                                     const float *const *x, float *dot, size_t ld)
{
    const size_t cols = t->cols;
    const uint64_t end = (uint64_t)(r + nr) * cols;
    uint32_t col[CB_OUTL_CHUNK];
    float v[CB_OUTL_CHUNK];
    uint64_t first = (uint64_t)r * cols;
    for (size_t i = 0; cb_outl_before(t, o, end);) {
        if (o.idx >= first + cols) { /* no (more) corrections in row i */
            i++;
            first += cols;
            continue;
        }
        size_t m = 0;
        for (; m < CB_OUTL_CHUNK && cb_outl_before(t, o, first + cols); m++, o = cb_outl_step(t, o)) {
            col[m] = (uint32_t)(o.idx - first);
            v[m] = cb_f16_to_f32(t->oval[o.k]);
        }
        float *d = dot + i;
        size_t j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *x0 = x[j], *x1 = x[j + 1], *x2 = x[j + 2], *x3 = x[j + 3];
            float a0 = d[j * ld], a1 = d[(j + 1) * ld], a2 = d[(j + 2) * ld], a3 = d[(j + 3) * ld];
            for (size_t q = 0; q < m; q++) {
                a0 = a0 + v[q] * x0[col[q]];
                a1 = a1 + v[q] * x1[col[q]];
                a2 = a2 + v[q] * x2[col[q]];
                a3 = a3 + v[q] * x3[col[q]];
            }
            d[j * ld] = a0;
            d[(j + 1) * ld] = a1;
            d[(j + 2) * ld] = a2;
            d[(j + 3) * ld] = a3;
        }
        for (; j < n; j++) {
            const float *xj = x[j];
            float a = d[j * ld];
            for (size_t q = 0; q < m; q++)
                a = a + v[q] * xj[col[q]];
            d[j * ld] = a;
        }
    }
    return o;
}

#define CB_OUTL_PEND_PER_BLOCK 4u /* corrections added per block of the next tile (2-8 measured alike) */

#define CB_OUTL_PEND_ROWS 16u /* rows of a tile at most (CB_TILE_ROWS, CB_Q4_ROWS) */
#define CB_OUTL_MAGIC_SHIFT 40u
#define CB_OUTL_MAGIC_COLS (1u << 18) /* widths below it take the multiply: CB_OUTL_PEND_ROWS * cols^2 < 2^40 */

/* One token's corrections of a tile applied a few at a time inside the next tile's pass (the decode path,
 * kernels_q8.c): while the weights stream, the core has time for them. The tile's sums in dot (dot[i]: row
 * first / cols + i), the walk at its next correction, the flat end of its rows. Each correction is added as
 * cb_outl_apply adds it and in the same order. Its row is local / cols for its offset local in the tile,
 * computed as (local * magic) >> 40 with magic = 2^40 / cols + 1 (rounded down), not by a loop or a
 * division: magic * cols = 2^40 + e with 0 < e <= cols, so the product exceeds local / cols * 2^40 by
 * local * e / cols < 2^40 / cols while local * cols < 2^40, which keeps it below the next integer. That
 * holds for local < CB_OUTL_PEND_ROWS * cols when cols < CB_OUTL_MAGIC_COLS (2^18); wider matrices divide
 * (magic 0), as would an empty one (cols 0), in whose tiles no correction lies, so nothing is divided.
 * (A double multiplication did this before: a chain of four conversions and float operations to every
 * correction's load of x.) */
typedef struct cb_outl_pend {
    cb_outl o;
    uint64_t first, end;
    uint64_t magic;
    const float *x;
    float *dot;
    size_t row; /* the row of dot the last correction went to (SIZE_MAX: none yet in this tile) */
    float sum;  /* dot[row] as it was last stored */
} cb_outl_pend;

/* The magic of a matrix cols wide (0: divide) */
CB_OUTL_INLINE uint64_t cb_outl_magic(uint64_t cols)
{
    return cols && cols < CB_OUTL_MAGIC_COLS ? ((uint64_t)1 << CB_OUTL_MAGIC_SHIFT) / cols + 1 : 0;
}

/* local / cols, for local < CB_OUTL_PEND_ROWS * cols and magic = cb_outl_magic(cols) */
CB_OUTL_INLINE size_t cb_outl_pend_row(uint64_t local, uint64_t cols, uint64_t magic)
{
    return (size_t)(magic ? (local * magic) >> CB_OUTL_MAGIC_SHIFT : local / cols);
}

/* p at the walk o, its corrections to be added to x's dots; no tile yet */
CB_OUTL_INLINE cb_outl_pend cb_outl_pend_start(const cb_tensor *t, cb_outl o, const float *x)
{
    cb_outl_pend p = {.o = o, .magic = cb_outl_magic(t->cols), .x = x, .row = SIZE_MAX};
    return p;
}

/* p at the corrections of the nrows rows from row r, whose sums are dot[0..nrows) */
CB_OUTL_INLINE void cb_outl_pend_tile(const cb_tensor *t, cb_outl_pend *p, size_t r, size_t nrows, float *dot)
{
    p->first = (uint64_t)r * t->cols;
    p->end = p->first + (uint64_t)nrows * t->cols;
    p->dot = dot;
    p->row = SIZE_MAX;
}

/* At most max of the pending corrections. A row's corrections after its first add to the sum kept in a
 * register, not to dot[i] read back: that load would wait for the store just made (store-to-load forwarding
 * in every correction's chain). dot[i] is still stored after every correction, so dot holds every sum
 * whenever the walk stops. The same additions in the same order. (Against reading dot[i] back, paired
 * rounds on a Zen 3, x86_64-v3, 288M int8c decode: 1.04-1.07x; the same model with OUTLIER_FRAC=0, no
 * corrections at all: 1.22x.) */
CB_OUTL_INLINE void cb_outl_pend_run(const cb_tensor *t, cb_outl_pend *p, unsigned max)
{
    cb_outl o = p->o;
    size_t row = p->row;
    float sum = p->sum;
    for (unsigned s = 0; s < max && cb_outl_before(t, o, p->end); s++, o = cb_outl_step(t, o)) {
        const uint64_t local = o.idx - p->first;
        const size_t i = cb_outl_pend_row(local, t->cols, p->magic);
        const float term = cb_f16_to_f32(t->oval[o.k]) * p->x[local - (uint64_t)i * t->cols];
        sum = (i == row ? sum : p->dot[i]) + term;
        p->dot[i] = sum;
        row = i;
    }
    p->o = o;
    p->row = row;
    p->sum = sum;
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
