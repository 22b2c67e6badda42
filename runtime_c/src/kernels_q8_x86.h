/*
 * kernels_q8_x86.h - the integer matmul's tile kernel for x86: VPDPBUSD on
 * AVX-512 VNNI, PMADDUBSW on AVX2. Included by kernels_q8.c only.
 *
 * A tiled ISA path defines CB_Q8_TILED, a type cb_tile_acc for sixteen f32
 * row results, cb_tile_dot(t, tile, xq) - every block of one tile for one
 * token, with the float steps per lane in block order exactly as the scalar
 * kernel - and cb_tile_store(acc, out[16]).
 */
#ifndef CB_KERNELS_Q8_X86_H
#define CB_KERNELS_Q8_X86_H

#include <immintrin.h>
#include <string.h>

#define CB_Q8_TILED 1

/* A tile's sixteen f16 (or f32) scales of group g, as two halves of 8 f32 lanes (rows 0-7, 8-15). */
static void cb_tile_scales(const cb_tensor *t, size_t tile, size_t g, __m256 *lo, __m256 *hi)
{
    size_t i = (tile * t->n_groups + g) * CB_TILE_ROWS;
    if (t->scale_dtype == CB_F32) {
        const float *s = (const float *)(const void *)t->scales + i;
        *lo = _mm256_loadu_ps(s);
        *hi = _mm256_loadu_ps(s + 8);
    } else {
        const uint16_t *s = (const uint16_t *)(const void *)t->scales + i;
        *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)s));
        *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + 8)));
    }
}

static inline int32_t cb_ld4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#if defined(CB_Q8_AVX512)
#define CB_Q8_NAME "avx512vnni"
/* The block sums of one tile (16 int32 lanes, one per row) for block b: VPDPBUSD multiplies unsigned
 * by signed bytes, so the weights go in as w + 128 (XOR 0x80) and 128 * s[b] comes off again. */
static inline __m512i cb_tile_isum(const int8_t *w, const int8_t *q, int32_t s)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i a[4];
    for (size_t k = 0; k < 4; k++) /* four independent VPDPBUSD chains: its latency, not its rate, binds */
        a[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                   _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * k)), bias),
                                   _mm512_set1_epi32(cb_ld4(q + 4 * k)));
    for (size_t k = 4; k < CB_ACT_BLOCK / 4; k++)
        a[k - 4] = _mm512_dpbusd_epi32(a[k - 4],
                                       _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * k)), bias),
                                       _mm512_set1_epi32(cb_ld4(q + 4 * k)));
    __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    return _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * s));
}

/* acc[16] (one lane per row of the tile) over every block, as the scalar kernel orders it */
typedef __m512 cb_tile_acc;

static __m512 cb_tile_dot(const cb_tensor *t, size_t tile, const cb_xq *xq)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    __m512 acc = _mm512_setzero_ps(), sc = acc;
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (b % per_group == 0) {
            __m256 lo, hi;
            cb_tile_scales(t, tile, b / per_group, &lo, &hi);
            sc = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        }
        __m512 f = _mm512_cvtepi32_ps(cb_tile_isum(w, xq->q + b * CB_ACT_BLOCK, xq->s[b]));
        f = _mm512_mul_ps(f, _mm512_set1_ps(xq->d[b]));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(f, sc));
    }
    return acc;
}

static void cb_tile_store(cb_tile_acc v, float *out) { _mm512_storeu_ps(out, v); }

#else
#define CB_Q8_NAME "avx2"
/* Eight rows' block sums at a time: PMADDUBSW takes |w| unsigned (ABS of -128 is 0x80, 128 as
 * unsigned) and q with w's sign (|q| <= 127, so SIGN never overflows), so no pair of products
 * (at most 128 * 127 each) can saturate its int16 sum, whatever byte a weight holds. */
static inline void cb_tile_isum(const int8_t *w, const int8_t *q, __m256i *lo, __m256i *hi)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    for (size_t k = 0; k < CB_ACT_BLOCK / 4; k++) {
        __m256i x = _mm256_set1_epi32(cb_ld4(q + 4 * k));
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * k));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * k + 32));
        __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x, w0));
        __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x, w1));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(p0, ones));
        c = _mm256_add_epi32(c, _mm256_madd_epi16(p1, ones));
    }
    *lo = a;
    *hi = c;
}

typedef struct cb_tile_acc {
    __m256 lo, hi;
} cb_tile_acc;

static cb_tile_acc cb_tile_dot(const cb_tensor *t, size_t tile, const cb_xq *xq)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, s0 = acc0, s1 = acc0;
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (b % per_group == 0)
            cb_tile_scales(t, tile, b / per_group, &s0, &s1);
        __m256i i0, i1;
        cb_tile_isum(w, xq->q + b * CB_ACT_BLOCK, &i0, &i1);
        __m256 d = _mm256_set1_ps(xq->d[b]);
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(i0), d), s0));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(i1), d), s1));
    }
    cb_tile_acc r = {acc0, acc1};
    return r;
}

static void cb_tile_store(cb_tile_acc v, float *out)
{
    _mm256_storeu_ps(out, v.lo);
    _mm256_storeu_ps(out + 8, v.hi);
}
#endif


#endif /* CB_KERNELS_Q8_X86_H */
