/*
 * arch/x86/q4.h - the int4 block dot on AVX2 (also what AVX-512 builds use): the 16 bytes split into
 * 32 unsigned nibbles, PMADDUBSW with the 32 int8 activations (pairs of at most 2 * 15 * 127: no
 * saturation), PMADDWD with ones, a horizontal add; minus 8 * qsum for the nibbles' offset. All exact
 * integer sums, so the scalar definition's result. Included by kernels_q8.c only.
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

#endif
#endif /* CB_ARCH_X86_Q4_H */
