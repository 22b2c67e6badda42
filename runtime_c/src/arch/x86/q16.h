/*
 * arch/x86/q16.h - the int16 matmul's block dots on AVX2 (kernels.h "int16 matmuls"): eight rows' blocks
 * against one block of activations, PMADDWD (two 16-value halves a row; each pair sum at most
 * 2 * 8191^2), the rows' eight-lane sums folded by PHADDD into one YMM, row i in lane i. Integer sums are
 * exact in any order: the scalar dots' values. Included by kernels_q8.c only.
 */
#ifndef CB_ARCH_X86_Q16_H
#define CB_ARCH_X86_Q16_H

#if defined(CB_HAS_Q16_DOT) && CB_ARCH == CB_ARCH_X86
#include <immintrin.h>

static inline __m256i cb_q16_row_madd(const uint8_t *w, __m256i q0, __m256i q1)
{
    const __m256i *v = (const __m256i *)(const void *)w;
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_loadu_si256(v), q0),
                            _mm256_madd_epi16(_mm256_loadu_si256(v + 1), q1));
}

static inline void cb_q16_isums_isa(const uint8_t *w, size_t stride, const int16_t *q, int32_t *isum)
{
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)(const void *)q);
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)(const void *)(q + 16));
    __m256i m0 = cb_q16_row_madd(w, q0, q1), m1 = cb_q16_row_madd(w + stride, q0, q1);
    __m256i m2 = cb_q16_row_madd(w + 2 * stride, q0, q1), m3 = cb_q16_row_madd(w + 3 * stride, q0, q1);
    __m256i m4 = cb_q16_row_madd(w + 4 * stride, q0, q1), m5 = cb_q16_row_madd(w + 5 * stride, q0, q1);
    __m256i m6 = cb_q16_row_madd(w + 6 * stride, q0, q1), m7 = cb_q16_row_madd(w + 7 * stride, q0, q1);
    /* per 128-bit half: rows 0-3 then 4-7, each lane one row's half-sum */
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m3));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(m4, m5), _mm256_hadd_epi32(m6, m7));
    __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)isum, s);
}
#endif

#endif /* CB_ARCH_X86_Q16_H */
