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

#if defined(CB_X86_BMI2) || defined(CB_F16_X86)
#include <immintrin.h>
#endif

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

/* One token (decode) over a range of rows: the kernels (kernels_q8.c) write the rows' sums of up to
 * CB_DECODE_ROWS rows into a buffer in one pass without their corrections, then cb_outl_rows adds the
 * corrections of those rows in one tight walk and cb_rows_write their alpha and store: per row the operations
 * of cb_finish in its order. (Against adding each tile's corrections a few per block during the next tile's
 * pass, paired rounds on a Zen 4, 288M decode, 1 thread: int8c 1.47x on x86_64-v3 and 1.04x with AVX-512,
 * int4c 1.20x on x86_64-v3 and 1.2-1.3x with AVX-512, where it now runs as fast as int4 without corrections.
 * 512 rows measured as fast as 1024 and 4096, and faster than 64 and 256.) */
#define CB_DECODE_ROWS 512u /* a multiple of CB_TILE_ROWS and CB_Q4_ROWS: 2 KB of stack */

/* A correction's row is local / cols for its offset local in the rows, computed as (local * magic) >> 48 with
 * magic = 2^48 / cols + 1 (rounded down), not by a division: magic * cols = 2^48 + e with 0 < e <= cols, so the
 * product exceeds local / cols * 2^48 by local * e / cols < 2^48 / cols while local * cols < 2^48, which keeps
 * it below the next integer. That holds for local < CB_DECODE_ROWS * cols when cols < CB_OUTL_MAGIC_COLS
 * (2^19); wider matrices divide (magic 0), as would an empty one (cols 0), in which no correction lies, so
 * nothing is divided. The product stays below 2^58. */
#define CB_OUTL_MAGIC_SHIFT 48u
#define CB_OUTL_MAGIC_COLS (1u << 19)
_Static_assert((uint64_t)CB_DECODE_ROWS * CB_OUTL_MAGIC_COLS * CB_OUTL_MAGIC_COLS <= (uint64_t)1 << CB_OUTL_MAGIC_SHIFT,
               "the magic's rows exact over a decode buffer");
_Static_assert(CB_DECODE_ROWS % CB_TILE_ROWS == 0, "whole tiles in a decode buffer");

/* The magic of a matrix cols wide (0: divide) */
CB_OUTL_INLINE uint64_t cb_outl_magic(uint64_t cols)
{
    return cols && cols < CB_OUTL_MAGIC_COLS ? ((uint64_t)1 << CB_OUTL_MAGIC_SHIFT) / cols + 1 : 0;
}

/* local / cols, for local < CB_DECODE_ROWS * cols and magic = cb_outl_magic(cols) */
CB_OUTL_INLINE size_t cb_outl_row(uint64_t local, uint64_t cols, uint64_t magic)
{
    return (size_t)(magic ? (local * magic) >> CB_OUTL_MAGIC_SHIFT : local / cols);
}

/* How cb_outl_rows' loop finds a correction's row and column in the rows: by the magic, by a division (wider
 * matrices), or by a shift and a mask (a power-of-two width). The magic's two multiplies (row, then column)
 * bound the walk on a core with one integer multiplier: on a Zen 4, 288M int8c decode at 1 thread ran 1.037x
 * (host) and 1.04x (x86_64-v3) as fast by the shift (bench/ab.py, 9 paired rounds); the walk alone, timed
 * outside the runtime, 1.04 against 1.42 ns a correction at 1024 columns. */
enum { CB_ROW_MAGIC, CB_ROW_DIVIDE, CB_ROW_SHIFT };

/* dot[i] += v * x[c] for the correction at offset local in the rows, how (a constant) finding its row i and column
 * c; shift: log2(cols) for CB_ROW_SHIFT. */
CB_OUTL_INLINE void cb_outl_at(float *dot, const float *x, uint64_t local, uint64_t cols, uint64_t magic,
                               unsigned shift, const int how, float v)
{
    size_t i;
    uint64_t c;
    if (how == CB_ROW_SHIFT) {
        i = (size_t)(local >> shift);
#if defined(CB_X86_BMI2)
        c = _bzhi_u64(local, shift); /* the low bits without a copy of local to mask */
#else
        c = local & (cols - 1);
#endif
    } else {
        i = how == CB_ROW_DIVIDE ? (size_t)(local / cols) : cb_outl_row(local, cols, magic);
        c = local - (uint64_t)i * cols;
    }
    dot[i] = dot[i] + v * x[c];
}

/* CB_OUTL_RUN corrections' values as f32, and value j of them (cb_outl_rows_by): four at a time by F16C, value j
 * moved to lane 0 by one shuffle (as fast as sixteen in one AVX-512 register and VALIGND); else each where it is
 * used (an array of sixteen floats made GCC store and reload them: 2.4x as slow on x86). The same bits either
 * way (every f16 is exactly an f32). */
#define CB_OUTL_RUN 16
#if defined(CB_F16_X86)
typedef struct {
    __m128 q0, q1, q2, q3; /* (not an array: GCC kept one on the stack) */
} cb_outl_vals;
#define CB_OUTL_Q(v, i) _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)((v) + 4 * (i))))
CB_OUTL_INLINE cb_outl_vals cb_outl_vals_at(const uint16_t *v)
{
    cb_outl_vals r = {CB_OUTL_Q(v, 0), CB_OUTL_Q(v, 1), CB_OUTL_Q(v, 2), CB_OUTL_Q(v, 3)};
    return r;
}
#define CB_OUTL_QJ(vs, j) ((j) < 4 ? (vs).q0 : (j) < 8 ? (vs).q1 : (j) < 12 ? (vs).q2 : (vs).q3)
#define CB_OUTL_VAL(vs, j) _mm_cvtss_f32((j) % 4 ? _mm_permute_ps(CB_OUTL_QJ(vs, j), (j) % 4) : CB_OUTL_QJ(vs, j))
#else
typedef const uint16_t *cb_outl_vals; /* converted where used, as one at a time */
#define cb_outl_vals_at(v) (v)
#define CB_OUTL_VAL(vs, j) cb_f16_to_f32((vs)[j])
#endif

/* Step j of a run in cb_outl_rows_by: correction k + j, then the walk on to the next, leaving the loop with k past
 * the run's corrections applied when that lies at or past the rows' end. */
#define CB_OUTL_STEP(j)                                                                        \
    cb_outl_at(dot, x, local, cols, magic, shift, how, CB_OUTL_VAL(v, j));                     \
    local += g[(j) + 1];                                                                       \
    if (local >= span) {                                                                       \
        k += (j) + 1;                                                                          \
        break;                                                                                 \
    }

/* cb_outl_rows' loop, how (a constant) finding rows; shift: log2(cols) for CB_ROW_SHIFT. The tensor's fields are
 * read once into registers and the walk kept as its offset in the rows. While more than CB_OUTL_RUN corrections
 * remain it runs unrolled over CB_OUTL_RUN at a time: their values converted together, and no count to test at
 * each (11 instructions a correction by the shift on x86 with AVX-512 against 17 one at a time; the walk alone,
 * timed outside the runtime on a Zen 4 at 1024 columns, 0.77 against 1.09 ns a correction). */
CB_OUTL_INLINE cb_outl cb_outl_rows_by(const cb_tensor *t, cb_outl o, uint64_t first, uint64_t end, const float *x,
                                       float *dot, uint64_t magic, unsigned shift, const int how)
{
    const uint64_t cols = t->cols, span = end - first;
    const uint16_t *const gap = t->ogap, *const val = t->oval;
    const size_t n = t->n_outliers;
    size_t k = o.k;
    if (!(k < n && o.idx < end))
        return o;
    uint64_t local = o.idx - first;
    for (;;) {
        if (n - k > CB_OUTL_RUN) { /* corrections k to k + CB_OUTL_RUN all there */
            const uint16_t *const g = gap + k;
            const cb_outl_vals v = cb_outl_vals_at(val + k);
            CB_OUTL_STEP(0) CB_OUTL_STEP(1) CB_OUTL_STEP(2) CB_OUTL_STEP(3)
            CB_OUTL_STEP(4) CB_OUTL_STEP(5) CB_OUTL_STEP(6) CB_OUTL_STEP(7)
            CB_OUTL_STEP(8) CB_OUTL_STEP(9) CB_OUTL_STEP(10) CB_OUTL_STEP(11)
            CB_OUTL_STEP(12) CB_OUTL_STEP(13) CB_OUTL_STEP(14) CB_OUTL_STEP(15)
            k += CB_OUTL_RUN;
        } else {
            cb_outl_at(dot, x, local, cols, magic, shift, how, cb_f16_to_f32(val[k]));
            if (++k >= n)
                break;
            local += gap[k];
            if (local >= span)
                break;
        }
    }
    o.k = k;
    o.idx = first + local;
    return o;
}
#undef CB_OUTL_STEP

/* dot[i] += oval * x[col] for the corrections of the nr <= CB_DECODE_ROWS rows from row r (dot[i]: row r + i),
 * in index order, o at the first of them; returns the walk past them. Consecutive corrections are
 * independent but for a row's running sum, so the walk runs at the core's width. */
CB_OUTL_INLINE cb_outl cb_outl_rows(const cb_tensor *t, cb_outl o, size_t r, size_t nr, const float *x, float *dot)
{
    const uint64_t cols = t->cols, first = (uint64_t)r * cols, end = first + (uint64_t)nr * cols;
    if (cols && (cols & (cols - 1)) == 0) {
        unsigned shift = 0;
        while (((uint64_t)1 << shift) < cols)
            shift++;
        return cb_outl_rows_by(t, o, first, end, x, dot, 0, shift, CB_ROW_SHIFT);
    }
    const uint64_t magic = cb_outl_magic(cols);
    return magic ? cb_outl_rows_by(t, o, first, end, x, dot, magic, 0, CB_ROW_MAGIC)
                 : cb_outl_rows_by(t, o, first, end, x, dot, 0, 0, CB_ROW_DIVIDE);
}

/* y[i] = (accumulate ? y[i] : 0) + a * dot[i], i < m: cb_finish's last steps, for a run of rows. Each element
 * is the same one product (and sum) in any case, so vector code changes no bit. */
CB_OUTL_INLINE void cb_rows_write(float *restrict y, const float *restrict dot, size_t m, float a, int accumulate)
{
    if (accumulate)
        for (size_t i = 0; i < m; i++)
            y[i] = y[i] + a * dot[i];
    else
        for (size_t i = 0; i < m; i++)
            y[i] = a * dot[i];
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
