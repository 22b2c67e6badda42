/*
 * cbmath.h - the runtime's own math: exp, sin, cos, f16 conversion, CRC-32.
 *
 * libm's expf/sinf/cosf differ in the last bit between glibc, newlib and
 * picolibc; these are plain IEEE arithmetic (built with -ffp-contract=off), so
 * the nonlinearities agree bit for bit on every target. Logits then differ
 * between targets only by the SIMD kernels' summation order (kernels.h);
 * scalar builds (KERNELS=scalar) of any two targets agree bit for bit.
 */
#ifndef CB_MATH_H
#define CB_MATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

float cb_expf(float x);
float cb_sinf(float x);
float cb_cosf(float x);
uint16_t cb_f32_to_f16(float f); /* round to nearest even */
uint32_t cb_crc32(uint32_t crc, const uint8_t *p, size_t n); /* zlib.crc32(p, crc) */

/* sqrt is exactly rounded by IEEE on every FPU; with -fno-math-errno this is one instruction. */
#if defined(__GNUC__)
#define cb_sqrtf(x) __builtin_sqrtf(x)
#else
#include <math.h>
#define cb_sqrtf(x) sqrtf(x)
#endif

/* In the header because the F16 kernels call it once per weight. Every f16 is exactly an f32, so the
 * hardware conversion (F16C, AArch64) gives the same bits as the portable code below. */
#if defined(__F16C__)
#include <immintrin.h>
static inline float cb_f16_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}
#elif defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
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
