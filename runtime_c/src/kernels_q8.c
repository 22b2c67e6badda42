/*
 * kernels_q8.c - integer matmuls: int8 weights times int8 activations (see kernels.h).
 *
 * The scalar kernel (arch/scalar/q8.h) reads both layouts and is the
 * reference. An ISA path (arch/<family>/q8.h)
 * computes the same int32 block sums sixteen rows at a time from the tiled
 * layout (one lane per row) and then does the float steps lane by lane in
 * block order, which is the scalar order; a layout it was not written for
 * goes through the scalar kernel. The weights were bounds-checked by
 * colibri_init; nothing here checks again.
 */
#include "kernels.h"

#include "cbmath.h"
#include "kernels_outl.h"

/* The integer kernels of the ISA arch/select.h chose (each header is empty unless it is the one), then
 * the scalar ones. */
#include "arch/x86/q8.h"
#include "arch/arm/q8.h"
#include "arch/riscv/q8.h"
#include "arch/cortex-m/q8.h"
#include "arch/scalar/q8.h"
#include "arch/x86/q4.h"
#include "arch/arm/q4.h"
#include "arch/riscv/q4.h"
#include "arch/cortex-m/q4.h"
#include "arch/scalar/q4.h"
#include "arch/scalar/q16.h"
#include "arch/x86/q16.h"
#include "arch/arm/q16.h"

#if defined(CB_HAS_Q8_TILES) && !defined(CB_TILE_DOT_PF)
#define CB_TILE_DOT_PF(t, tile, xq, pf) cb_tile_dot(t, tile, xq) /* an ISA without software prefetch */
#endif

#if defined(CB_HAS_Q8_TILES)
/* The int8 decode's corrections walk (kernels_outl.h cb_outl_rows), in a function of its own: inlined in a decode
 * loop, GCC kept its pointers in vector registers and on the stack (288M int8c decode 1.06x on a Zen 4 as its own
 * function, measured before the walk's shift and its unrolling; kernels_outl.h gives the walk's cost now). The int4
 * decode keeps it inlined: 288M int4c decode ran 0.95x (host) and 0.98x (x86_64-v3) as fast with this one. */
static __attribute__((noinline)) cb_outl cb_decode_walk(const cb_tensor *t, cb_outl o, size_t r, size_t nr,
                                                        const float *x, float *dot)
{
    return cb_outl_rows(t, o, r, nr, x, dot);
}
#endif

#if defined(CB_Q4_ROWS)
_Static_assert(CB_DECODE_ROWS % CB_Q4_ROWS == 0, "whole int4 row groups in a decode buffer");
#endif

/* The int4 matmul (kernels.h "int4 matmuls") with a given block dot: per row and token, the blocks in
 * order with the float steps of cb_matmul_q8_scalar, then cb_finish (corrections, alpha). */
#define CB_MATMUL_Q4(name, dot32)                                                                          \
    static void name(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,                  \
                     const float *const *x, float *const *y, const float *alpha, int accumulate)           \
    {                                                                                                      \
        const size_t blocks = t->n_groups;                                                                 \
        cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;                                     \
        for (size_t r = r0; r < r1; r++, o = next) {                                                       \
            const uint8_t *w = t->data + r * t->row_stride;                                                \
            for (size_t j = 0; j < n; j++) {                                                               \
                float acc = 0.0f;                                                                          \
                for (size_t b = 0; b < blocks; b++) {                                                      \
                    float f = (float)dot32(w + b * (CB_ACT_BLOCK / 2), xq[j].q + b * CB_ACT_BLOCK, xq[j].s[b]); \
                    f = f * xq[j].d[b];                                                                    \
                    f = f * cb_scale(t, r, b);                                                             \
                    acc = acc + f;                                                                         \
                }                                                                                          \
                next = cb_finish(t, o, r, x[j], acc, alpha[j], y[j], accumulate);                          \
            }                                                                                              \
        }                                                                                                  \
    }

CB_MATMUL_Q4(cb_matmul_q4_def, cb_dot32_q4_scalar)
CB_MATMUL_Q4(cb_matmul_q4_rows, cb_dot32_q4_isa)

#if defined(CB_HAS_Q4_ROWS)
#define CB_Q4_TOKENS 32 /* tokens whose dots one pass over CB_Q4_ROWS rows keeps (a prefill block's) */

/* An arch's cb_q4_rows (q4.h: out[j][i] = the dot of row r + i with token j, j < n <= 4) for one token
 * and for four tokens per pass (prefill) */
static inline __attribute__((always_inline)) void cb_q4_rows_isa(const cb_tensor *t, size_t r, const cb_xq *xq,
                                                                 float out[CB_Q4_ROWS])
{
    cb_q4_rows(t, r, xq, 1, (float(*)[CB_Q4_ROWS])out);
}

static inline void cb_q4_rows_x4_isa(const cb_tensor *t, size_t r, const cb_xq *xq, float (*out)[CB_Q4_ROWS])
{
    cb_q4_rows(t, r, xq, 4, out);
}

/* CB_Q4_ROWS rows at a time (cb_q4_rows_isa: the same acc per row and token as cb_matmul_q4_def; four
 * tokens per pass over the rows where there are four), then the rows' corrections for all those tokens
 * (cb_outl_apply: each correction decoded once) and each (row, token)'s alpha and store: per (row, token)
 * the operations of cb_finish in its order. One token (decode): the sums of up to CB_DECODE_ROWS rows, then
 * their corrections in one walk (kernels_outl.h cb_outl_rows), then their stores; the same operations in the
 * same order. The rows past the last CB_Q4_ROWS go through the one-row kernel. */
static void cb_matmul_q4_isa(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                             const float *const *x, float *const *y, const float *alpha, int accumulate)
{
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols);
    size_t r = r0;
    if (n == 1) /* decode */
        while (r + CB_Q4_ROWS <= r1) {
            float dot[CB_DECODE_ROWS];
            const size_t m = r1 - r >= CB_DECODE_ROWS ? CB_DECODE_ROWS : (r1 - r) / CB_Q4_ROWS * CB_Q4_ROWS;
            for (size_t i = 0; i < m; i += CB_Q4_ROWS)
                cb_q4_rows_isa(t, r + i, xq, dot + i);
            o = cb_outl_rows(t, o, r, m, x[0], dot);
            cb_rows_write(y[0] + r, dot, m, alpha[0], accumulate);
            r += m;
        }
    for (; r + CB_Q4_ROWS <= r1; r += CB_Q4_ROWS) {
        cb_outl next = o;
        for (size_t j0 = 0; j0 < n; j0 += CB_Q4_TOKENS) {
            const size_t m = n - j0 < CB_Q4_TOKENS ? n - j0 : CB_Q4_TOKENS;
            float dot[CB_Q4_TOKENS][CB_Q4_ROWS];
            size_t j = 0;
            for (; j + 4 <= m; j += 4)
                cb_q4_rows_x4_isa(t, r, &xq[j0 + j], &dot[j]);
            for (; j < m; j++)
                cb_q4_rows_isa(t, r, &xq[j0 + j], dot[j]);
            next = cb_outl_apply(t, o, r, CB_Q4_ROWS, m, x + j0, &dot[0][0], CB_Q4_ROWS);
            for (j = 0; j < m; j++)
                cb_rows_write(y[j0 + j] + r, dot[j], CB_Q4_ROWS, alpha[j0 + j], accumulate);
        }
        o = next;
    }
    if (r < r1)
        cb_matmul_q4_rows(t, r, r1, n, xq, x, y, alpha, accumulate);
}
#else
#define cb_matmul_q4_isa cb_matmul_q4_rows
#endif

void cb_matmul_q4_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate)
{
    cb_matmul_q4_def(t, r0, r1, n, xq, x, y, alpha, accumulate);
}

const char *cb_kernels_q4_isa(void)
{
    return CB_ISA_Q4_NAME;
}

void cb_quantize_q8(const float *x, size_t n, int8_t *q, float *d, int32_t *s)
{
    for (size_t b = 0, k0 = 0; k0 < n; b++, k0 += CB_ACT_BLOCK) {
        if (n - k0 >= CB_ACT_BLOCK)
            cb_quantize_block_isa(x + k0, q + k0, d + b, s + b);
        else
            cb_quantize_part(x + k0, n - k0, q + k0, d + b, s + b);
    }
}

#if defined(CB_HAS_Q8_TILES)

#define CB_MAX_TOKENS 32 /* tokens whose dots one pass over a tile keeps (a prefill block's) */

/* y[j][r + i] = (accumulate ? y[j][r + i] : 0) + alpha[j] * dot[j][i] for the nr rows of a tile */
static void cb_tile_write(size_t r, size_t nr, size_t n, float (*dot)[CB_TILE_ROWS], const float *alpha,
                          float *const *y, int accumulate)
{
    for (size_t j = 0; j < n; j++)
        cb_rows_write(y[j] + r, dot[j], nr, alpha[j], accumulate);
}

/* The corrections of the nr rows r.. of a tile, added to every token's dots (dot[j][i]: token j, row r + i)
 * in index order, then alpha: per (row, token) the operations and order of cb_finish. The walk decodes each
 * correction once for all the tokens. Returns the walk past the tile. */
static cb_outl cb_tile_finish(const cb_tensor *t, cb_outl o, size_t r, size_t nr, size_t n, const float *const *x,
                              float (*dot)[CB_TILE_ROWS], const float *alpha, float *const *y, int accumulate)
{
    o = cb_outl_apply(t, o, r, nr, n, x, &dot[0][0], CB_TILE_ROWS);
    cb_tile_write(r, nr, n, dot, alpha, y, accumulate);
    return o;
}

/* One token (decode): the sums of up to CB_DECODE_ROWS rows (whole tiles: a last partial tile's rows past r1
 * land in the buffer's room and are not written), then their corrections in one walk (kernels_outl.h
 * cb_outl_rows), then their stores. The same operations in the same order as cb_tile_finish. pf: the tiles'
 * software prefetch's distance in bytes (0: none), a constant in each caller. */
static inline __attribute__((always_inline)) void cb_q8_decode_rows(const cb_tensor *t, size_t r0, size_t r1,
                                                                     const cb_xq *xq, const float *x, float *y,
                                                                     float alpha, int accumulate, const int pf)
{
    (void)pf;
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols);
    for (size_t r = r0; r < r1;) {
        float dot[CB_DECODE_ROWS];
        const size_t m = r1 - r < CB_DECODE_ROWS ? r1 - r : CB_DECODE_ROWS;
        for (size_t i = 0; i < m; i += CB_TILE_ROWS)
            cb_tile_store(CB_TILE_DOT_PF(t, (r + i) / CB_TILE_ROWS, xq, pf), dot + i);
        o = cb_decode_walk(t, o, r, m, x, dot);
        cb_rows_write(y + r, dot, m, alpha, accumulate);
        r += m;
    }
}

#if defined(CB_Q8_SW_PREFETCH)
/* Decode on a CPU whose tiles prefetch in software (cb_tensor.sw_prefetch: its distance in KiB), in functions of
 * their own, one per distance (a constant in each); the decode without stays inlined in cb_matmul_q8_isa. */
static __attribute__((noinline)) void cb_q8_decode_far(const cb_tensor *t, size_t r0, size_t r1, const cb_xq *xq,
                                                       const float *x, float *y, float alpha, int accumulate)
{
    cb_q8_decode_rows(t, r0, r1, xq, x, y, alpha, accumulate, CB_Q8_PREFETCH);
}
static __attribute__((noinline)) void cb_q8_decode_near(const cb_tensor *t, size_t r0, size_t r1, const cb_xq *xq,
                                                        const float *x, float *y, float alpha, int accumulate)
{
    cb_q8_decode_rows(t, r0, r1, xq, x, y, alpha, accumulate, CB_Q8_PREFETCH_NEAR);
}
static void cb_q8_decode_sw(const cb_tensor *t, size_t r0, size_t r1, const cb_xq *xq, const float *x, float *y,
                            float alpha, int accumulate)
{
    if (t->sw_prefetch == CB_Q8_PREFETCH_NEAR / 1024)
        cb_q8_decode_near(t, r0, r1, xq, x, y, alpha, accumulate);
    else
        cb_q8_decode_far(t, r0, r1, xq, x, y, alpha, accumulate);
}
#define CB_Q8_DECODE_SW(t) ((t)->sw_prefetch)
#else
#define cb_q8_decode_sw(t, r0, r1, xq, x, y, alpha, accumulate) ((void)0)
#define CB_Q8_DECODE_SW(t) 0
#endif

static void cb_matmul_q8_isa(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                             const float *const *x, float *const *y, const float *alpha, int accumulate)
{
    if (!t->tiled) {
        cb_matmul_q8_scalar(t, r0, r1, n, xq, x, y, alpha, accumulate);
        return;
    }
    if (n == 1) {
        if (CB_Q8_DECODE_SW(t))
            cb_q8_decode_sw(t, r0, r1, xq, x[0], y[0], alpha[0], accumulate);
        else
            cb_q8_decode_rows(t, r0, r1, xq, x[0], y[0], alpha[0], accumulate, 0);
        return;
    }
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols);
    float dot[CB_MAX_TOKENS][CB_TILE_ROWS];
    for (size_t r = r0; r < r1; r += CB_TILE_ROWS) { /* r0 is a tile's first row */
        size_t nr = r1 - r < CB_TILE_ROWS ? r1 - r : CB_TILE_ROWS;
        for (size_t j0 = 0; j0 < n; j0 += CB_MAX_TOKENS) {
            size_t m = n - j0 < CB_MAX_TOKENS ? n - j0 : CB_MAX_TOKENS;
            size_t j = 0;
#if defined(CB_HAS_Q8_QUAD) /* an ISA path may take four tokens per pass over the tile */
            for (; j + 4 <= m; j += 4)
                cb_tile_dot4(t, r / CB_TILE_ROWS, &xq[j0 + j], &dot[j]);
#endif
            for (; j < m; j++)
                cb_tile_store(cb_tile_dot(t, r / CB_TILE_ROWS, &xq[j0 + j]), dot[j]);
            cb_outl next = cb_tile_finish(t, o, r, nr, m, x + j0, dot, alpha + j0, y + j0, accumulate);
            if (j0 + m >= n)
                o = next;
        }
    }
}

#endif /* CB_HAS_Q8_TILES */

void cb_matmul_q8(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq, const float *const *x,
                  float *const *y, const float *alpha, int accumulate)
{
    if (CB_HAS_INT4 && cb_is_int4(t->dtype)) /* a constant 0 drops the int4 kernels from the image */
        cb_matmul_q4_isa(t, r0, r1, n, xq, x, y, alpha, accumulate);
    else
        cb_matmul_q8_isa(t, r0, r1, n, xq, x, y, alpha, accumulate);
}

/* ---- int16 (kernels.h "int16 matmuls") ---- */

void cb_quantize_q16(const float *x, int16_t *q, float *d)
{
    cb_quantize_q16_block(x, q, d);
}

/* Rows whose sums one quantization of a block serves: 64 with the ISA's block dots (each quantization then costs
 * a small share of the rows' work); else CB_Q16_ROWS, for the stacks of microcontrollers (a frame of about
 * 150 bytes). The group changes no row's operations. */
#if defined(CB_HAS_Q16_DOT)
#define CB_Q16_GROUP 64u
#else
#define CB_Q16_GROUP CB_Q16_ROWS
#endif

/* Rows [r0, r1) of an I16 matmul with a given CB_Q16_ROWS-row block dot: per group of CB_Q16_GROUP rows and
 * token, each block quantized once and dotted with every row of the group (CB_Q16_ROWS at a time, a last
 * partial batch one by one), each row's float steps in block order. */
#define CB_MATMUL_Q16(name, isums)                                                                         \
    void name(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,  \
              const float *alpha, int accumulate)                                                          \
    {                                                                                                      \
        const size_t blocks = t->cols / CB_ACT_BLOCK, stride = t->row_stride;                              \
        const float *scale = (const float *)(const void *)t->scales;                                       \
        for (size_t r = r0; r < r1; r += CB_Q16_GROUP) {                                                   \
            const size_t nr = r1 - r < CB_Q16_GROUP ? r1 - r : CB_Q16_GROUP;                               \
            const uint8_t *w = t->data + r * stride;                                                       \
            for (size_t j = 0; j < n; j++) {                                                               \
                float acc[CB_Q16_GROUP];                                                                   \
                for (size_t i = 0; i < nr; i++)                                                            \
                    acc[i] = 0.0f;                                                                         \
                for (size_t b = 0; b < blocks; b++) {                                                      \
                    int16_t q[CB_ACT_BLOCK];                                                               \
                    float d;                                                                               \
                    cb_quantize_q16_block(x[j] + b * CB_ACT_BLOCK, q, &d);                                 \
                    const uint8_t *wb = w + b * CB_ACT_BLOCK * sizeof(int16_t);                            \
                    for (size_t i = 0; i < nr; i += CB_Q16_ROWS) {                                         \
                        int32_t isum[CB_Q16_ROWS];                                                         \
                        const size_t m = nr - i < CB_Q16_ROWS ? nr - i : CB_Q16_ROWS;                      \
                        if (m == CB_Q16_ROWS)                                                              \
                            isums(wb + i * stride, stride, q, isum);                                       \
                        else                                                                               \
                            for (size_t k = 0; k < m; k++)                                                 \
                                isum[k] = cb_q16_dot_scalar(wb + (i + k) * stride, q);                     \
                        for (size_t k = 0; k < m; k++) {                                                   \
                            float f = (float)isum[k];                                                      \
                            f = f * d;                                                                     \
                            f = f * scale[r + i + k];                                                      \
                            acc[i + k] = acc[i + k] + f;                                                   \
                        }                                                                                  \
                    }                                                                                      \
                }                                                                                          \
                float *yj = y[j] + r;                                                                      \
                for (size_t i = 0; i < nr; i++) {                                                          \
                    float v = alpha[j] * acc[i];                                                           \
                    yj[i] = accumulate ? yj[i] + v : v;                                                    \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

CB_MATMUL_Q16(cb_matmul_q16_scalar, cb_q16_isums_scalar)
#if defined(CB_HAS_Q16_DOT)
CB_MATMUL_Q16(cb_matmul_q16, cb_q16_isums_isa)
#endif

const char *cb_kernels_q16_isa(void)
{
    return CB_ISA_Q16_NAME;
}

uint8_t cb_q8_sw_prefetch(void)
{
#if defined(CB_Q8_SW_PREFETCH)
    return cb_q8_sw_prefetch_isa();
#else
    return 0;
#endif
}

const char *cb_kernels_q8_isa(void)
{
    return CB_ISA_Q8_NAME;
}
