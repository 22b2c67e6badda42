/*
 * kernels_q8.c - integer matmuls: int8 weights times int8 activations (see kernels.h).
 *
 * The scalar kernel reads both layouts and is the reference. An ISA path
 * computes the same int32 block sums sixteen rows at a time from the tiled
 * layout (one lane per row) and then does the float steps lane by lane in
 * block order, which is the scalar order; a layout it was not written for
 * goes through the scalar kernel. The weights were bounds-checked by
 * colibri_init; nothing here checks again.
 */
#include "kernels.h"

#include <string.h>

#include "cbmath.h"

/* The ISA path: a header that defines CB_Q8_NAME and either CB_Q8_TILED (a tile kernel, see
 * kernels_q8_x86.h) or CB_Q8_ROWS (cb_isa_dot32: the int32 dot of 32 weights of a row with 32
 * activations, for the row-major layout). */
#if !defined(COLIBRI_SCALAR)
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define CB_Q8_AVX512 1
#include "kernels_q8_x86.h"
#elif defined(__AVX2__) && defined(__F16C__)
#define CB_Q8_AVX2 1
#include "kernels_q8_x86.h"
#elif defined(__ARM_NEON)
#include "kernels_q8_neon.h"
#elif defined(__riscv_vector) && defined(__riscv_v_intrinsic)
#include "kernels_q8_rvv.h"
#elif defined(__ARM_FEATURE_MVE)
#include "kernels_q8_mve.h"
#elif defined(__ARM_FEATURE_DSP)
#include "kernels_q8_dsp.h"
#endif
#endif

#if defined(__AVX2__) && !defined(COLIBRI_SCALAR)
#include <immintrin.h>
/* One whole block of cb_quantize_q8, eight lanes at a time, the same operations: MAXPS returns its second
 * operand when the first is NaN, so a NaN is skipped as the scalar comparison skips it. */
static void cb_quantize_block8(const float *x, int8_t *q, float *d, int32_t *s)
{
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(_mm256_and_ps(v[i], mag), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    if (!(amax >= 0x1p-100f))
        amax = 0.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f), zero = _mm256_setzero_ps();
    __m256i w[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_mul_ps(v[i], id);
        f = _mm256_add_ps(f, _mm256_blendv_ps(_mm256_set1_ps(-0.5f), _mm256_set1_ps(0.5f),
                                               _mm256_cmp_ps(f, zero, _CMP_GE_OQ)));
        __m256 ok = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-128.0f), _CMP_GT_OQ),
                                  _mm256_cmp_ps(f, _mm256_set1_ps(128.0f), _CMP_LT_OQ));
        __m256i t = _mm256_and_si256(_mm256_cvttps_epi32(f), _mm256_castps_si256(ok));
        t = _mm256_min_epi32(_mm256_max_epi32(t, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
        sum = _mm256_add_epi32(sum, t);
        w[i] = t;
    }
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
    _mm256_storeu_si256((__m256i *)(void *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d = amax / 127.0f;
    *s = _mm_cvtsi128_si32(s4);
}
#define CB_QUANTIZE_BLOCK8 1
#endif

void cb_quantize_q8(const float *x, size_t n, int8_t *q, float *d, int32_t *s)
{
    for (size_t b = 0, k0 = 0; k0 < n; b++, k0 += CB_ACT_BLOCK) {
#if defined(CB_QUANTIZE_BLOCK8)
        if (n - k0 >= CB_ACT_BLOCK) {
            cb_quantize_block8(x + k0, q + k0, d + b, s + b);
            continue;
        }
#endif
        size_t k1 = n - k0 < CB_ACT_BLOCK ? n : k0 + CB_ACT_BLOCK;
        float amax = 0.0f;
        for (size_t k = k0; k < k1; k++) {
            float a = x[k] < 0.0f ? -x[k] : x[k];
            amax = a > amax ? a : amax; /* a NaN is skipped; its q is 0 below */
        }
        if (!(amax >= 0x1p-100f)) /* a block this small is zero (127 / amax would overflow near 1e-37) */
            amax = 0.0f;
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (size_t k = k0; k < k0 + CB_ACT_BLOCK; k++) {
            int32_t v = 0;
            if (k < k1) {
                float f = x[k] * id;
                f = f + (f >= 0.0f ? 0.5f : -0.5f);
                v = f > -128.0f && f < 128.0f ? (int32_t)f : 0; /* truncation: round half away from zero */
                v = v > 127 ? 127 : v < -127 ? -127 : v;
            }
            q[k] = (int8_t)v;
            sum += v;
        }
        d[b] = amax / 127.0f;
        s[b] = sum;
    }
}

/* The exact int32 dot of row r's block b with the block's activations. */
static int32_t cb_block_isum(const cb_tensor *t, size_t r, size_t b, const int8_t *q)
{
    const int8_t *w = (const int8_t *)t->data;
    int32_t sum = 0;
    if (t->tiled) {
        w += (r / CB_TILE_ROWS) * CB_TILE_ROWS * t->cols + b * CB_ACT_BLOCK * CB_TILE_ROWS + 4 * (r % CB_TILE_ROWS);
        for (size_t c = 0; c < CB_ACT_BLOCK; c += 4, w += 4 * CB_TILE_ROWS)
            sum += w[0] * q[c] + w[1] * q[c + 1] + w[2] * q[c + 2] + w[3] * q[c + 3];
    } else {
        w += r * t->row_stride + b * CB_ACT_BLOCK;
#if defined(CB_Q8_ROWS)
        sum = cb_isa_dot32(w, q);
#else
        for (size_t c = 0; c < CB_ACT_BLOCK; c++)
            sum += w[c] * q[c];
#endif
    }
    return sum;
}

void cb_matmul_q8_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols), next = o;
    for (size_t r = r0; r < r1; r++, o = next)
        for (size_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (size_t b = 0; b < blocks; b++) {
                float f = (float)cb_block_isum(t, r, b, xq[j].q + b * CB_ACT_BLOCK);
                f = f * xq[j].d[b];
                f = f * cb_scale(t, r, b / per_group);
                acc = acc + f;
            }
            next = cb_finish(t, o, r, x[j], acc, alpha[j], y[j], accumulate);
        }
}

#if defined(CB_Q8_TILED)

#define CB_MAX_TOKENS 32 /* tokens whose dots one pass over a tile keeps (a prefill block's) */

/* The corrections of the nr rows r.. of a tile, added to every token's dots (dot[j][i]: token j, row r + i)
 * in index order, then alpha: per (row, token) the operations and order of cb_finish. The walk decodes each
 * correction once for all the tokens. Its row comes from a multiplication, not a loop: (local + 0.5) / cols
 * lies at least 0.5 / cols from an integer, far more than a double's rounding of a product below 2^40.
 * Returns the walk past the tile. */
static cb_outl cb_tile_finish(const cb_tensor *t, cb_outl o, size_t r, size_t nr, size_t n, const float *const *x,
                              float (*dot)[CB_TILE_ROWS], const float *alpha, float *const *y, int accumulate)
{
    const uint16_t *gap = t->ogap, *val = t->oval;
    const size_t n_out = t->n_outliers, cols = t->cols;
    const uint64_t first = (uint64_t)r * cols, end = first + nr * cols;
    const double inv_cols = 1.0 / (double)cols;
    uint64_t idx = o.idx;
    size_t k = o.k;
    while (k < n_out && idx < end) {
        size_t local = (size_t)(idx - first), i = (size_t)(((double)local + 0.5) * inv_cols);
        size_t c = local - i * cols;
        float v = cb_f16_to_f32(val[k]);
        for (size_t j = 0; j < n; j++)
            dot[j][i] = dot[j][i] + v * x[j][c];
        if (++k < n_out)
            idx += gap[k];
    }
    for (size_t j = 0; j < n; j++) { /* a whole tile's rows as a fixed-length loop: vector code */
        float *restrict yj = y[j] + r;
        const float a = alpha[j], *d = dot[j];
        if (nr == CB_TILE_ROWS && accumulate)
            for (size_t i = 0; i < CB_TILE_ROWS; i++)
                yj[i] = yj[i] + a * d[i];
        else if (nr == CB_TILE_ROWS)
            for (size_t i = 0; i < CB_TILE_ROWS; i++)
                yj[i] = a * d[i];
        else
            for (size_t i = 0; i < nr; i++)
                yj[i] = accumulate ? yj[i] + a * d[i] : a * d[i];
    }
    o.k = k;
    o.idx = idx;
    return o;
}

void cb_matmul_q8(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq, const float *const *x,
                  float *const *y, const float *alpha, int accumulate)
{
    if (!t->tiled) {
        cb_matmul_q8_scalar(t, r0, r1, n, xq, x, y, alpha, accumulate);
        return;
    }
    cb_outl o = cb_outl_seek(t, (uint64_t)r0 * t->cols);
    float dot[CB_MAX_TOKENS][CB_TILE_ROWS];
    for (size_t r = r0; r < r1; r += CB_TILE_ROWS) { /* r0 is a tile's first row */
        size_t nr = r1 - r < CB_TILE_ROWS ? r1 - r : CB_TILE_ROWS;
        for (size_t j0 = 0; j0 < n; j0 += CB_MAX_TOKENS) {
            size_t m = n - j0 < CB_MAX_TOKENS ? n - j0 : CB_MAX_TOKENS;
            size_t j = 0;
#if defined(CB_Q8_TILE_QUAD) /* an ISA path may take four tokens per pass over the tile */
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

const char *cb_kernels_q8_isa(void)
{
    return CB_Q8_NAME;
}

#else /* no tile kernel: the scalar one, with the ISA's row dot if it has one */

void cb_matmul_q8(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq, const float *const *x,
                  float *const *y, const float *alpha, int accumulate)
{
    cb_matmul_q8_scalar(t, r0, r1, n, xq, x, y, alpha, accumulate);
}

const char *cb_kernels_q8_isa(void)
{
#if defined(CB_Q8_ROWS)
    return CB_Q8_NAME;
#else
    return "scalar";
#endif
}

#endif
