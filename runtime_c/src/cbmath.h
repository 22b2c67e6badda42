/*
 * cbmath.h - the runtime's own math: exp, sin, cos, f16 conversion, CRC-32.
 *
 * libm's expf/sinf/cosf differ in the last bit between glibc, newlib and
 * picolibc; these are plain IEEE arithmetic (built with -ffp-contract=off), so
 * the nonlinearities agree bit for bit on every target. A model with integer
 * matmuls (format 1.2) then gives the same logits on every target whatever
 * its kernels; a float model's differ only by the SIMD float kernels'
 * summation order (kernels.h), and its scalar builds agree bit for bit.
 */
#ifndef CB_MATH_H
#define CB_MATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "arch/select.h" /* CB_F16_X86, CB_F16_ARM: the hardware f16 conversion */

float cb_expf(float x); /* cb_expf_inline, out of line */
float cb_sinf(float x);
float cb_cosf(float x);
uint16_t cb_f32_to_f16(float f); /* round to nearest even */
uint32_t cb_crc32(uint32_t crc, const uint8_t *p, size_t n); /* zlib.crc32(p, crc) */

static inline float cb_pow2f(int32_t n) /* 2^n for n in [-126, 127] */
{
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Cephes expf: x = k*ln2 + r with ln2 split so k*LN2_HI is exact, then a degree-6 polynomial for e^r on
 * |r| <= ln2/2 (about 1 ulp). Written without branches (the special inputs are selected at the end and
 * the arithmetic runs on a clamped x) so loops over it become vector code; every value is computed by the
 * same operations in the same order either way. */
static inline float cb_expf_inline(float x)
{
    const float hi = 88.72283935546875f, lo = -103.972084045410156f;
    float xc = x > hi ? hi : x < lo ? lo : x == x ? x : 0.0f;
    float fk = xc * 1.44269504088896341f;
    int32_t k = (int32_t)(fk < 0.0f ? fk - 0.5f : fk + 0.5f);
    float r = (xc - (float)k * 0.693359375f) - (float)k * -2.12194440e-4f;
    float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    int32_t k1 = k / 2; /* two steps keep each factor a normal float; k in [-150, 128] */
    y = y * cb_pow2f(k1) * cb_pow2f(k - k1);
    y = x < lo ? 0.0f : y;
    y = x > hi ? cb_pow2f(127) * 2.0f : y; /* overflows to +inf, as expf does */
    return x == x ? y : x + x;
}

/* sqrt is exactly rounded by IEEE on every FPU; with -fno-math-errno this is one instruction. */
#if defined(__GNUC__)
#define cb_sqrtf(x) __builtin_sqrtf(x)
#else
#include <math.h>
#define cb_sqrtf(x) sqrtf(x)
#endif

/* In the header because the F16 kernels call it once per weight. Every f16 is exactly an f32, so the
 * hardware conversion (where arch/select.h finds one) gives the same bits as the portable code below;
 * a signalling NaN may come out quiet. */
#if defined(CB_F16_X86)
#include <immintrin.h>
static inline float cb_f16_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}
#elif defined(CB_F16_ARM)
static inline float cb_f16_to_f32(uint16_t h)
{
    __fp16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}
#else
static inline float cb_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in f32 */
        f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    bits = sign | (exp == 0x1f ? 0x7f800000u : (exp + 112u) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}
#endif

#endif /* CB_MATH_H */
