/*
 * arch/x86/q4.h - int4 on AVX2 (x86-64-v3) and AVX-512 VNNI.
 *
 * cb_dot32_q4_isa: one row's block dot. The 16 bytes split into 32 unsigned nibbles, PMADDUBSW with the
 * 32 int8 activations (pairs of at most 2 * 15 * 127: no saturation), PMADDWD with ones, a horizontal
 * add; minus 8 * qsum for the nibbles' offset.
 *
 * cb_q4_rows_isa: CB_Q4_ROWS rows' dots with one token (cb_q4_rows_x4_isa: with four), each the scalar
 * kernel's float steps in block order (f = isum, f *= d[b], f *= scale[r][b], acc += f: one lane per row,
 * no contraction).
 * - AVX-512 (F, BW, VL, VNNI): eight rows. With f16 scales, four blocks a step: each row's 64 bytes in one
 *   ZMM (block b + k in 128-bit lane k) against the four blocks' activations shuffled to match; VPDPBUSD
 *   gives four int32 partial sums per row and block, unpacks and adds the block sums, two two-source
 *   permutes the eight rows of each block in a YMM; the rows' scales are eight 8-byte loads and one word
 *   permute. Then (and with f32 scales) one block a step: four rows to a ZMM (one row's 16 bytes per
 *   128-bit lane) against the block's activations broadcast to every lane, an unpack and two adds the
 *   rows' block sums, one permute rows 0-7 in order in a YMM. (Four blocks a step: 288M int4c decode
 *   1.21x, prefill 1.15x on a Zen 5, paired rounds.)
 * - AVX2: four rows. With f16 scales, two blocks a step: each row's 32 bytes in one YMM (block b + k in lane
 *   k) against the two blocks' activations shuffled to match; VPDPBUSD (AVX-512 VNNI with VL) or PMADDUBSW +
 *   PMADDWD, then three PHADDDs leave each block's four row sums in a lane; the scales are four 4-byte loads
 *   and one byte shuffle. Then (and with f32 scales) one block a step: two rows to a YMM (row i's 16 bytes
 *   in the low lane, row i + 1's in the high one), two PHADDDs and an unpack leave the four rows' block sums
 *   in one XMM. (Two blocks a step: x86_64-v3 288M int4c decode 1.18x, 30M 1.14x on a Zen 5.)
 * All sums are exact int32 and the float steps are the scalar kernel's per row, so the result is the
 * scalar definition's bit for bit. Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_X86_Q4_H
#define CB_ARCH_X86_Q4_H

#if CB_ARCH == CB_ARCH_X86 && defined(CB_HAS_Q4_DOT)
#include <immintrin.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)w);
    const __m128i m4 = _mm_set1_epi8(15);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
    __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(const void *)q));
    p = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s) - 8 * qsum;
}

#ifndef CB_Q4_PREFETCH
#define CB_Q4_PREFETCH 4096 /* bytes ahead of the rows' walk (the row kernels below) */
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__F16C__)
#define CB_HAS_Q4_ROWS 1
#define CB_Q4_ROWS 8

/* rows w, w + stride, w + 2 stride, w + 3 stride: one block's 16 bytes each, one per 128-bit lane, as their
 * low and high nibbles */
static inline void cb_q4_unpack4(const uint8_t *w, size_t stride, __m512i *lo, __m512i *hi)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512i raw = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)w));
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(const void *)(w + stride)), 1);
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(const void *)(w + 2 * stride)), 2);
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(const void *)(w + 3 * stride)), 3);
    *lo = _mm512_and_si512(raw, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
}

/* Two rows' (a, b) partial sums, four dwords per block in each 128-bit lane, reduced to their block sums:
 * per lane (a, b, a, b). */
static inline __m512i cb_q4_pair_sums(__m512i a, __m512i b)
{
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    return _mm512_add_epi32(u, _mm512_shuffle_epi32(u, _MM_PERM_BADC));
}

/* Four blocks (b .. b + 3) of eight rows with f16 scales, each row's 64 bytes in one load (block b + k in
 * 128-bit lane k) against the four blocks' activations rearranged to match (low halves in qlo, high halves in
 * qhi); the block sums reduced to one YMM of eight rows per block; then per block, in order, the float steps
 * of the one-block loop below. Same sums, same float operations in the same order: the same bits. */
static inline __attribute__((always_inline)) void cb_q4_rows_by4(const uint8_t *w, size_t stride,
                                                                 const uint16_t *s16, size_t blocks, size_t b,
                                                                 const cb_xq *xq, size_t n, __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const uint8_t *wb = w + b * (CB_ACT_BLOCK / 2);
    /* written out: GCC keeps arrays of these in memory */
#define CB_Q4_LOAD64(i)                                                                 \
    const __m512i raw##i = _mm512_loadu_si512((const void *)(wb + (i) * stride));       \
    const __m512i lo##i = _mm512_and_si512(raw##i, m4);                                 \
    const __m512i hi##i = _mm512_and_si512(_mm512_srli_epi16(raw##i, 4), m4)
    CB_Q4_LOAD64(0);
    CB_Q4_LOAD64(1);
    CB_Q4_LOAD64(2);
    CB_Q4_LOAD64(3);
    CB_Q4_LOAD64(4);
    CB_Q4_LOAD64(5);
    CB_Q4_LOAD64(6);
    CB_Q4_LOAD64(7);
#undef CB_Q4_LOAD64
    /* the rows' four scales each (one qword per row), then word j = row j % 8 of block j / 8: blocks b, b + 1
     * in the low 256 bits, b + 2, b + 3 in the high */
    static const uint16_t by_block[32] = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29,
                                          2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
    const uint16_t *sb = s16 + b; /* 8 scalar loads and 7 shuffles: a gather measured far slower (Zen 5) */
#define CB_Q4_SCALES2(i)                                                                       \
    _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)(sb + (i) * blocks)),     \
                       _mm_loadl_epi64((const __m128i *)(const void *)(sb + ((i) + 1) * blocks)))
    const __m256i s03 = _mm256_inserti128_si256(_mm256_castsi128_si256(CB_Q4_SCALES2(0)), CB_Q4_SCALES2(2), 1);
    const __m256i s47 = _mm256_inserti128_si256(_mm256_castsi128_si256(CB_Q4_SCALES2(4)), CB_Q4_SCALES2(6), 1);
#undef CB_Q4_SCALES2
    __m512i sq = _mm512_inserti64x4(_mm512_castsi256_si512(s03), s47, 1);
    sq = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)by_block), sq);
    const __m512 sc01 = _mm512_cvtph_ps(_mm512_castsi512_si256(sq)), sc23 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sq, 1));
    const __m512i pick01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i pick23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m512i lanes01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), lanes23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (size_t j = 0; j < n; j++) {
        const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
        const __m512i z0 = _mm512_loadu_si512((const void *)q), z1 = _mm512_loadu_si512((const void *)(q + 64));
        const __m512i qlo = _mm512_shuffle_i64x2(z0, z1, _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i qhi = _mm512_shuffle_i64x2(z0, z1, _MM_SHUFFLE(3, 1, 3, 1));
#define CB_Q4_DOT64(i) _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo##i, qlo), hi##i, qhi)
        /* lane k: rows 0-3's sums of block b + k, and rows 4-7's */
        const __m512i r03 = _mm512_unpacklo_epi64(cb_q4_pair_sums(CB_Q4_DOT64(0), CB_Q4_DOT64(1)),
                                                  cb_q4_pair_sums(CB_Q4_DOT64(2), CB_Q4_DOT64(3)));
        const __m512i r47 = _mm512_unpacklo_epi64(cb_q4_pair_sums(CB_Q4_DOT64(4), CB_Q4_DOT64(5)),
                                                  cb_q4_pair_sums(CB_Q4_DOT64(6), CB_Q4_DOT64(7)));
#undef CB_Q4_DOT64
        const __m512i s8 = _mm512_castsi128_si512(
            _mm_slli_epi32(_mm_loadu_si128((const __m128i *)(const void *)(xq[j].s + b)), 3));
        const __m512 d = _mm512_castps128_ps512(_mm_loadu_ps(xq[j].d + b));
        __m512i s01 = _mm512_sub_epi32(_mm512_permutex2var_epi64(r03, lanes01, r47), _mm512_permutexvar_epi32(pick01, s8));
        __m512i s23 = _mm512_sub_epi32(_mm512_permutex2var_epi64(r03, lanes23, r47), _mm512_permutexvar_epi32(pick23, s8));
        __m512 f01 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s01), _mm512_permutexvar_ps(pick01, d)), sc01);
        __m512 f23 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s23), _mm512_permutexvar_ps(pick23, d)), sc23);
        acc[j] = _mm256_add_ps(acc[j], _mm512_castps512_ps256(f01));
        acc[j] = _mm256_add_ps(acc[j], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f01), 1)));
        acc[j] = _mm256_add_ps(acc[j], _mm512_castps512_ps256(f23));
        acc[j] = _mm256_add_ps(acc[j], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f23), 1)));
    }
}

/* out[j][i] = the dot of row r + i with token j (xq[j]), i < 8, j < n <= 4: the scalar kernel's acc before
 * cb_finish. The rows' nibbles and scales are loaded once a block for all n tokens. */
static inline __attribute__((always_inline)) void cb_q4_rows(const cb_tensor *t, size_t r, const cb_xq *xq,
                                                             size_t n, float (*out)[CB_Q4_ROWS])
{
    const size_t blocks = t->n_groups, stride = t->row_stride;
    const uint8_t *w = t->data + r * stride;
    const int f32_scales = t->scale_dtype == CB_F32;
    const uint8_t *sc = t->scales + r * blocks * (f32_scales ? 4u : 2u);
    /* after the unpack and adds, lane k holds row k's sum in its dword 0 and row 4 + k's in dword 1 */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    /* the eight rows are 8 * stride contiguous bytes, 128 per block step: two lines a step, CB_Q4_PREFETCH
     * bytes ahead (eight short streams interleaved are too short for the hardware prefetcher to pick up) */
    const char *ahead = (const char *)w + CB_Q4_PREFETCH;
    size_t b = 0;
    if (!f32_scales) /* four blocks a step (the eight rows' 64 bytes each, 512 a step) while there are four */
        for (; b + 4 <= blocks; b += 4, ahead += 512) {
            for (size_t l = 0; l < 512; l += 64)
                _mm_prefetch(ahead + l, _MM_HINT_T0);
            cb_q4_rows_by4(w, stride, (const uint16_t *)(const void *)sc, blocks, b, xq, n, acc);
        }
    for (w += b * (CB_ACT_BLOCK / 2); b < blocks; b++, w += CB_ACT_BLOCK / 2, ahead += 128) {
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        __m512i lo03, hi03, lo47, hi47;
        cb_q4_unpack4(w, stride, &lo03, &hi03);
        cb_q4_unpack4(w + 4 * stride, stride, &lo47, &hi47);
        __m256 scale;
        if (f32_scales) {
            const float *s32 = (const float *)(const void *)sc;
            scale = _mm256_setr_ps(s32[b], s32[blocks + b], s32[2 * blocks + b], s32[3 * blocks + b],
                                   s32[4 * blocks + b], s32[5 * blocks + b], s32[6 * blocks + b], s32[7 * blocks + b]);
        } else {
            const uint16_t *s16 = (const uint16_t *)(const void *)sc;
            scale = _mm256_cvtph_ps(_mm_setr_epi16((short)s16[b], (short)s16[blocks + b], (short)s16[2 * blocks + b],
                                                   (short)s16[3 * blocks + b], (short)s16[4 * blocks + b],
                                                   (short)s16[5 * blocks + b], (short)s16[6 * blocks + b],
                                                   (short)s16[7 * blocks + b]));
        }
        for (size_t j = 0; j < n; j++) {
            const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
            const __m512i qlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)q));
            const __m512i qhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(q + 16)));
            const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo03, qlo), hi03, qhi);
            const __m512i c = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo47, qlo), hi47, qhi);
            /* lane k: (a0 + a2, c0 + c2, a1 + a3, c1 + c3), then the two halves added */
            __m512i h = _mm512_add_epi32(_mm512_unpacklo_epi32(a, c), _mm512_unpackhi_epi32(a, c));
            h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, _MM_PERM_BADC));
            __m256i s = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, h));
            s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xq[j].s[b]));
            __m256 f = _mm256_cvtepi32_ps(s);
            f = _mm256_mul_ps(f, _mm256_set1_ps(xq[j].d[b]));
            f = _mm256_mul_ps(f, scale);
            acc[j] = _mm256_add_ps(acc[j], f);
        }
    }
    for (size_t j = 0; j < n; j++)
        _mm256_storeu_ps(out[j], acc[j]);
}

#elif defined(__F16C__)
#define CB_HAS_Q4_ROWS 1
#define CB_Q4_ROWS 4

/* rows a and b's 16 bytes of one block (low lane a, high lane b) as their low and high nibbles */
static inline void cb_q4_unpack2(const uint8_t *a, const uint8_t *b, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
        _mm_loadu_si128((const __m128i *)(const void *)b), 1);
    *lo = _mm256_and_si256(raw, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
}

/* without VNNI: the int16 sums of pairs of products of a block's low and high nibbles with their activations
 * (each at most 2 * 2 * 15 * 127 = 7,620) */
static inline __m256i cb_q4_pair16(__m256i lo, __m256i hi, __m256i qlo, __m256i qhi)
{
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, qlo), _mm256_maddubs_epi16(hi, qhi));
}

/* the 32-bit partial sums of two rows' block (cb_q4_unpack2) with the block's activations in both lanes */
static inline __m256i cb_q4_pair(__m256i lo, __m256i hi, __m256i qlo, __m256i qhi)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, qlo), hi, qhi);
#else
    return _mm256_madd_epi16(cb_q4_pair16(lo, hi, qlo, qhi), _mm256_set1_epi16(1));
#endif
}

/* Two blocks (b, b + 1) of four rows with f16 scales, each row's 32 bytes in one load (block b + k in 128-bit
 * lane k) against the two blocks' activations shuffled to match; three PHADDDs (with VNNI) or two PHADDWs of
 * the int16 pair sums and one PMADDWD (without) leave the four rows' sums of block b in the low lane and of
 * b + 1 in the high one; then per block, in order, the float steps of the one-block loop below. Same sums,
 * same float operations in the same order: the same bits. s4: the rows' f16 scales of the two blocks, dword i
 * row i's (the caller loads them four steps at a time). */
static inline __attribute__((always_inline)) void cb_q4_rows_by2(const uint8_t *w, size_t stride, __m128i s4,
                                                                 size_t b, const cb_xq *xq, size_t n, __m128 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *wb = w + b * (CB_ACT_BLOCK / 2);
    /* written out: GCC keeps arrays of these in memory */
#define CB_Q4_LOAD32(i)                                                                       \
    const __m256i raw##i = _mm256_loadu_si256((const __m256i *)(const void *)(wb + (i) * stride)); \
    const __m256i lo##i = _mm256_and_si256(raw##i, m4);                                       \
    const __m256i hi##i = _mm256_and_si256(_mm256_srli_epi16(raw##i, 4), m4)
    CB_Q4_LOAD32(0);
    CB_Q4_LOAD32(1);
    CB_Q4_LOAD32(2);
    CB_Q4_LOAD32(3);
#undef CB_Q4_LOAD32
    /* the scales as words: row 0-3 of block b, row 0-3 of b + 1 */
    const __m128i sw = _mm_shuffle_epi8(s4, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    const __m256 sc = _mm256_cvtph_ps(sw);
    const __m256i pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (size_t j = 0; j < n; j++) {
        const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
        const __m256i z0 = _mm256_loadu_si256((const __m256i *)(const void *)q);
        const __m256i z1 = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32));
        const __m256i qlo = _mm256_permute2x128_si256(z0, z1, 0x20), qhi = _mm256_permute2x128_si256(z0, z1, 0x31);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(cb_q4_pair(lo0, hi0, qlo, qhi), cb_q4_pair(lo1, hi1, qlo, qhi)),
                                      _mm256_hadd_epi32(cb_q4_pair(lo2, hi2, qlo, qhi), cb_q4_pair(lo3, hi3, qlo, qhi)));
#else
        /* the rows' int16 pair sums (at most 7,620) added pairwise twice (at most 30,480: still int16) before
         * one PMADDWD widens them: four rows' block sums per lane, as three PHADDDs of four PMADDWDs would
         * leave them (exact integer sums, the same order of lanes) */
        __m256i h = _mm256_madd_epi16(
            _mm256_hadd_epi16(_mm256_hadd_epi16(cb_q4_pair16(lo0, hi0, qlo, qhi), cb_q4_pair16(lo1, hi1, qlo, qhi)),
                              _mm256_hadd_epi16(cb_q4_pair16(lo2, hi2, qlo, qhi), cb_q4_pair16(lo3, hi3, qlo, qhi))),
            _mm256_set1_epi16(1));
#endif
        const __m256i s8 = _mm256_castsi128_si256(
            _mm_slli_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(xq[j].s + b)), 3));
        const __m256 d = _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(xq[j].d + b))));
        h = _mm256_sub_epi32(h, _mm256_permutevar8x32_epi32(s8, pick));
        const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(h), _mm256_permutevar8x32_ps(d, pick)), sc);
        acc[j] = _mm_add_ps(acc[j], _mm256_castps256_ps128(f));
        acc[j] = _mm_add_ps(acc[j], _mm256_extractf128_ps(f, 1));
    }
}

/* out[j][i] = the dot of row r + i with token j (xq[j]), i < 4, j < n <= 4: the scalar kernel's acc before
 * cb_finish. The rows' nibbles and scales are loaded once a block for all n tokens. */
static inline __attribute__((always_inline)) void cb_q4_rows(const cb_tensor *t, size_t r, const cb_xq *xq,
                                                             size_t n, float (*out)[CB_Q4_ROWS])
{
    const size_t blocks = t->n_groups, stride = t->row_stride;
    const uint8_t *w = t->data + r * stride;
    const int f32_scales = t->scale_dtype == CB_F32;
    const uint8_t *sc = t->scales + r * blocks * (f32_scales ? 4u : 2u);
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    /* the four rows are 4 * stride contiguous bytes, 64 per block step: one line a step, CB_Q4_PREFETCH
     * bytes ahead (four short streams interleaved are too short for the hardware prefetcher to pick up) */
    const char *ahead = (const char *)w + CB_Q4_PREFETCH;
    size_t b = 0;
    if (!f32_scales) { /* two blocks a step (the four rows' 32 bytes each, 128 a step) while there are two */
        const uint16_t *s16 = (const uint16_t *)(const void *)sc;
#define CB_Q4_STEP(s4)                                                 \
    do {                                                               \
        _mm_prefetch(ahead, _MM_HINT_T0);                              \
        _mm_prefetch(ahead + 64, _MM_HINT_T0);                         \
        cb_q4_rows_by2(w, stride, (s4), b, xq, n, acc);                \
        b += 2;                                                        \
        ahead += 128;                                                  \
    } while (0)
        /* four steps: each row's eight scales in one load, transposed to the four steps' dwords (row i's
         * scales of blocks b + 2k, b + 2k + 1 in dword i of step k): four loads and eight unpacks, not
         * sixteen dword loads */
        while (b + 8 <= blocks) {
            const __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)(s16 + b));
            const __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)(s16 + blocks + b));
            const __m128i r2 = _mm_loadu_si128((const __m128i *)(const void *)(s16 + 2 * blocks + b));
            const __m128i r3 = _mm_loadu_si128((const __m128i *)(const void *)(s16 + 3 * blocks + b));
            const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
            const __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
            CB_Q4_STEP(_mm_unpacklo_epi64(t0, t1));
            CB_Q4_STEP(_mm_unpackhi_epi64(t0, t1));
            CB_Q4_STEP(_mm_unpacklo_epi64(t2, t3));
            CB_Q4_STEP(_mm_unpackhi_epi64(t2, t3));
        }
        while (b + 2 <= blocks) {
            int32_t s0, s1, s2, s3; /* not an array: its stores would stall the vector load of them */
            memcpy(&s0, s16 + b, sizeof s0);
            memcpy(&s1, s16 + blocks + b, sizeof s1);
            memcpy(&s2, s16 + 2 * blocks + b, sizeof s2);
            memcpy(&s3, s16 + 3 * blocks + b, sizeof s3);
            CB_Q4_STEP(_mm_setr_epi32(s0, s1, s2, s3));
        }
#undef CB_Q4_STEP
    }
    for (w += b * (CB_ACT_BLOCK / 2); b < blocks; b++, w += CB_ACT_BLOCK / 2, ahead += 64) {
        _mm_prefetch(ahead, _MM_HINT_T0);
        __m256i lo01, hi01, lo23, hi23;
        cb_q4_unpack2(w, w + stride, &lo01, &hi01);
        cb_q4_unpack2(w + 2 * stride, w + 3 * stride, &lo23, &hi23);
        __m128 scale;
        if (f32_scales) {
            const float *s32 = (const float *)(const void *)sc;
            scale = _mm_setr_ps(s32[b], s32[blocks + b], s32[2 * blocks + b], s32[3 * blocks + b]);
        } else {
            const uint16_t *s16 = (const uint16_t *)(const void *)sc;
            scale = _mm_cvtph_ps(_mm_setr_epi16((short)s16[b], (short)s16[blocks + b], (short)s16[2 * blocks + b],
                                                (short)s16[3 * blocks + b], 0, 0, 0, 0));
        }
        for (size_t j = 0; j < n; j++) {
            const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
            const __m256i qlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)q));
            const __m256i qhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(q + 16)));
            /* lane 0: row 0's and row 2's two halves, lane 1: row 1's and row 3's; then one sum each */
            __m256i h = _mm256_hadd_epi32(cb_q4_pair(lo01, hi01, qlo, qhi), cb_q4_pair(lo23, hi23, qlo, qhi));
            h = _mm256_hadd_epi32(h, h);
            __m128i s = _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            s = _mm_sub_epi32(s, _mm_set1_epi32(8 * xq[j].s[b]));
            __m128 f = _mm_cvtepi32_ps(s);
            f = _mm_mul_ps(f, _mm_set1_ps(xq[j].d[b]));
            f = _mm_mul_ps(f, scale);
            acc[j] = _mm_add_ps(acc[j], f);
        }
    }
    for (size_t j = 0; j < n; j++)
        _mm_storeu_ps(out[j], acc[j]);
}

#endif

#endif
#endif /* CB_ARCH_X86_Q4_H */
