/*
 * arch/x86/matmul.h - the x86 vector primitives kernels.c builds its row
 * dots from: AVX-512F (16 lanes) when the compiler targets it, else AVX2 +
 * FMA + F16C (8 lanes, x86-64-v3). Included by kernels.c only.
 *
 * Each primitive takes the vector length vl so the RVV header can share the
 * signatures; here it is the constant lane count and ignored.
 */
#ifndef CB_ARCH_X86_MATMUL_H
#define CB_ARCH_X86_MATMUL_H

#if CB_ARCH == CB_ARCH_X86 && defined(CB_HAS_MATMUL)

#include <immintrin.h>

#if defined(CB_X86_AVX512)
typedef __m512 cb_vf;

static inline size_t cb_vlen(void) { return 16; }
static inline cb_vf cb_vzero(size_t vl) { (void)vl; return _mm512_setzero_ps(); }
static inline cb_vf cb_vld_f32(const float *p, size_t vl) { (void)vl; return _mm512_loadu_ps(p); }
static inline cb_vf cb_vld_f16(const uint16_t *p, size_t vl)
{
    (void)vl;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
static inline cb_vf cb_vld_i8(const int8_t *p, size_t vl)
{
    (void)vl;
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}
static inline cb_vf cb_vfma(cb_vf acc, cb_vf a, cb_vf b, size_t vl) { (void)vl; return _mm512_fmadd_ps(a, b, acc); }
static inline cb_vf cb_vadd(cb_vf a, cb_vf b, size_t vl) { (void)vl; return _mm512_add_ps(a, b); }
static inline float cb_vsum(cb_vf v, size_t vl) { (void)vl; return _mm512_reduce_add_ps(v); }

#else /* CB_X86_AVX2 */
typedef __m256 cb_vf;

static inline size_t cb_vlen(void) { return 8; }
static inline cb_vf cb_vzero(size_t vl) { (void)vl; return _mm256_setzero_ps(); }
static inline cb_vf cb_vld_f32(const float *p, size_t vl) { (void)vl; return _mm256_loadu_ps(p); }
static inline cb_vf cb_vld_f16(const uint16_t *p, size_t vl)
{
    (void)vl;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline cb_vf cb_vld_i8(const int8_t *p, size_t vl)
{
    (void)vl;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}
static inline cb_vf cb_vfma(cb_vf acc, cb_vf a, cb_vf b, size_t vl) { (void)vl; return _mm256_fmadd_ps(a, b, acc); }
static inline cb_vf cb_vadd(cb_vf a, cb_vf b, size_t vl) { (void)vl; return _mm256_add_ps(a, b); }
static inline float cb_vsum(cb_vf v, size_t vl)
{
    (void)vl;
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
#endif /* CB_ARCH_X86_MATMUL_H */
