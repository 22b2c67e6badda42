/*
 * cbmath.c - see cbmath.h. exp works in float (cheap on single-precision FPUs,
 * where it runs once per attention score and expert activation); sin and cos
 * run once per rotary frequency per layer, so they afford a double-precision
 * range reduction that stays exact for positions up to 2^20.
 */
#include "cbmath.h"

#if defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

float cb_expf(float x)
{
    return cb_expf_inline(x);
}

/* x = n*pi/2 + r with |r| <= pi/4. pi/2 is split Cody-Waite style into three
 * doubles of which the first two have 33 significant bits, so n*PIO2_1 and
 * n*PIO2_2 are exact while |n| < 2^20. Returns n mod 4. */
static unsigned cb_reduce(float x, double *r)
{
    const double two_over_pi = 6.36619772367581382433e-01;
    const double pio2_1 = 1.57079632673412561417e+00;
    const double pio2_2 = 6.07710050630396597660e-11;
    const double pio2_2t = 2.02226624879595063154e-21;
    double d = (double)x, fn = d * two_over_pi;
    int64_t n = (int64_t)(fn < 0.0 ? fn - 0.5 : fn + 0.5);
    double dn = (double)n;
    *r = ((d - dn * pio2_1) - dn * pio2_2) - dn * pio2_2t;
    return (unsigned)((uint64_t)n & 3u);
}

/* Taylor series in double: on |r| <= pi/4 the first omitted term is < 1e-13,
 * far below float rounding. */
static double cb_sin_poly(double r)
{
    double r2 = r * r;
    return r + r * r2 * (-1.66666666666666666667e-01 + r2 * (8.33333333333333333333e-03
        + r2 * (-1.98412698412698412698e-04 + r2 * (2.75573192239858906526e-06
        + r2 * (-2.50521083854417187751e-08 + r2 * 1.60590438368216145994e-10)))));
}

static double cb_cos_poly(double r)
{
    double r2 = r * r;
    return 1.0 + r2 * (-0.5 + r2 * (4.16666666666666666667e-02 + r2 * (-1.38888888888888888889e-03
        + r2 * (2.48015873015873015873e-05 + r2 * (-2.75573192239858906526e-07
        + r2 * (2.08767569878680989792e-09 + r2 * -1.14707455977297247139e-11))))));
}

/* sin(x) for shift 0, cos(x) = sin(x + pi/2) for shift 1: one quadrant further on.
 * Both give NaN for inf/NaN; beyond 2^60 rad (meaningless in float) they give 0. */
static float cb_trig(float x, unsigned shift)
{
    double r;
    if (!(x - x == 0.0f))
        return x - x;
    if (x > 0x1p60f || x < -0x1p60f)
        return 0.0f;
    switch ((cb_reduce(x, &r) + shift) & 3) {
    case 0: return (float)cb_sin_poly(r);
    case 1: return (float)cb_cos_poly(r);
    case 2: return (float)-cb_sin_poly(r);
    default: return (float)-cb_cos_poly(r);
    }
}

float cb_sinf(float x) { return cb_trig(x, 0u); }
float cb_cosf(float x) { return cb_trig(x, 1u); }

/* ryg's float_to_half_fast3_rtne: for f16 subnormals, adding 0.5f moves the
 * f16 ulp onto the f32 ulp, so the FPU does the rounding. */
uint16_t cb_f32_to_f16(float f)
{
    uint32_t x, b;
    float t;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x47800000u) /* >= 65536: inf, or NaN kept quiet */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        memcpy(&t, &x, sizeof t);
        t += 0.5f;
        memcpy(&b, &t, sizeof b);
        return (uint16_t)(sign | (b - 0x3f000000u));
    }
    x += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1u); /* rebias, round half to even */
    return (uint16_t)(sign | (x >> 13));
}

/* CRC-32, reflected polynomial 0xEDB88320 (IEEE 802.3, zlib), one byte per step. */
static const uint32_t cb_crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

/* Byte at a time: 8 instructions a byte, a 1 KiB table. Where the CPU has Arm's CRC32 instructions (the
 * Armv8-A CRC extension: every Raspberry Pi target), they compute this very CRC (polynomial 0x04C11DB7,
 * bit-reflected, no inversion of their own), 8 bytes an instruction on AArch64 and 4 on AArch32. Else,
 * where the stack is not a few KiB (no microcontroller build), a long buffer goes eight bytes at a time
 * through eight tables built on the stack from the first (slicing-by-8): a 300 MB blob's check at init
 * drops from about 0.7 s to 0.15 s. */
uint32_t cb_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
#if defined(__ARM_FEATURE_CRC32) && defined(__aarch64__)
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, sizeof v); /* little-endian, as the whole runtime */
        crc = __crc32d(crc, v);
    }
#elif defined(__ARM_FEATURE_CRC32)
    for (; n >= 4; p += 4, n -= 4) {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        crc = __crc32w(crc, v);
    }
#elif !defined(COLIBRI_NO_PARALLEL)
    if (n >= 65536) {
        uint32_t t[8][256];
        for (int i = 0; i < 256; i++) {
            t[0][i] = cb_crc_table[i];
            for (int k = 1; k < 8; k++)
                t[k][i] = (t[k - 1][i] >> 8) ^ cb_crc_table[t[k - 1][i] & 0xffu];
        }
        for (; n >= 8; p += 8, n -= 8) {
            uint32_t lo, hi;
            memcpy(&lo, p, 4); /* little-endian hosts only, as the whole runtime */
            memcpy(&hi, p + 4, 4);
            lo ^= crc;
            crc = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24]
                  ^ t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
        }
    }
#endif
    for (size_t i = 0; i < n; i++)
        crc = cb_crc_table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}
