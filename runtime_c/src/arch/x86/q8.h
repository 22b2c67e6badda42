/*
 * arch/x86/q8.h - the integer matmul's tile kernel for x86: VPDPBUSD on
 * AVX-512 VNNI, PMADDUBSW on AVX2; and one block of cb_quantize_q8 on AVX2.
 * Included by kernels_q8.c only.
 *
 * A tile kernel (CB_HAS_Q8_TILES in arch/select.h) defines a type cb_tile_acc for sixteen f32
 * row results, cb_tile_dot(t, tile, xq) - every block of one tile for one
 * token, with the float steps per lane in block order exactly as the scalar
 * kernel - and cb_tile_store(acc, out[16]); with CB_HAS_Q8_QUAD also
 * cb_tile_dot4(t, tile, xq[4], out[4][16]), four tokens in one pass.
 */
#ifndef CB_ARCH_X86_Q8_H
#define CB_ARCH_X86_Q8_H

#if CB_ARCH == CB_ARCH_X86

#include <immintrin.h>
#include <string.h>

#if defined(CB_HAS_Q8_QUANT)
/* One whole block of cb_quantize_q8, eight lanes at a time, the same operations: MAXPS returns its second
 * operand when the first is NaN, so a NaN is skipped as the scalar comparison skips it. */
static inline void cb_quantize_block_isa(const float *x, int8_t *q, float *d, int32_t *s)
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
#endif

#if defined(CB_HAS_Q8_TILES)
#include <cpuid.h>

#ifndef CB_Q8_PREFETCH
/* bytes ahead of the weights being read, where the tiles prefetch in software (cb_q8_sw_prefetch_isa).
 * Against none: +15-25% decode on a Xeon (1-8 KiB alike). Against 4 KiB on an EPYC Zen 5: 288M decode +3-17%
 * for 16 KiB, 30M +6% (paired rounds; 32-64 KiB were no better). With decode's corrections after each 512
 * rows (kernels_outl.h), on an EPYC Zen 4, 288M int8c decode, 11 paired rounds: 8 KiB against 16 KiB 1.12x
 * on x86_64-v3 [1.04-1.47] and 1.07x with AVX-512 [0.93-1.64], 4 KiB 1.13x and 1.02x, 32 KiB 1.01x. */
#define CB_Q8_PREFETCH 8192
#endif
#ifndef CB_Q8_PREFETCH_NEAR
/* the distance on an AMD Zen 3 (cb_q8_sw_prefetch_isa): on an EPYC Zen 3 (family 19h model 01h, AVX2), 288M
 * int8c decode, x86_64-v3, 1 thread, 15 paired rounds: 1 KiB against none 1.092x [1.010-1.233]; against 1 KiB
 * (11 rounds) 512 B 0.956x, 1.5 KiB 0.905x, 2 KiB 0.93x, 8 KiB (against none, 9 rounds) 0.953x. At 2 threads
 * 1 KiB against none 1.027x [0.892-1.114] (11 rounds). */
#define CB_Q8_PREFETCH_NEAR 1024
#endif
#define CB_Q8_SW_PREFETCH 1 /* cb_tensor.sw_prefetch chooses, per CPU */
/* Every block of one tile for one token (cb_tile_dot_pf below), pf: the software prefetch's distance in bytes,
 * 0 for none. Decode passes the tensor's choice as a constant (kernels_q8.c); a prompt's passes of one token
 * (after those of four, which do not prefetch either) never prefetch: with the run-time test there, the decode
 * inlined beside them in cb_matmul_q8_isa ran 0.90x as fast (AVX-512 build, Zen 4, 11 paired rounds; the same
 * code otherwise). */
#define CB_TILE_DOT_PF(t, tile, xq, pf) cb_tile_dot_pf(t, tile, xq, pf)
#define cb_tile_dot(t, tile, xq) cb_tile_dot_pf(t, tile, xq, 0)

/* How far ahead, in KiB, the int8 tiles prefetch in software on the CPU running this (0: not at all). Not on an
 * AMD Zen 4 (family 19h, models 10h-1Fh, 60h-7Fh, A0h-AFh), whose hardware prefetchers alone stream the tiles
 * faster: on an EPYC Zen 4, 288M int8c decode, 7 paired rounds, none against 8 KiB: 1.14x with AVX-512
 * [1.02-1.17] and 1.18x on x86_64-v3 [1.12-1.27] at 1 thread, 1.18x and 1.15x at 2; a 256 MiB stream through
 * the AVX2 tile loop alone reads at 97% of a plain sum's bandwidth without, 84-90% with (2 MiB or 4 KiB pages).
 * CB_Q8_PREFETCH_NEAR on the other family 19h models (Zen 3, as measured there); CB_Q8_PREFETCH elsewhere
 * (Intel; AMD Zen 5, family 1Ah), as measured above. Asked once, at init: CPUID traps to the hypervisor in a
 * VM. */
static inline uint8_t cb_q8_sw_prefetch_isa(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return CB_Q8_PREFETCH / 1024;
    const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return CB_Q8_PREFETCH / 1024;
    unsigned family = (a >> 8) & 0xfu, model = (a >> 4) & 0xfu;
    if (family == 0xfu) {
        family += (a >> 20) & 0xffu;
        model |= ((a >> 16) & 0xfu) << 4;
    }
    _Static_assert(CB_Q8_PREFETCH % 1024 == 0 && CB_Q8_PREFETCH / 1024 <= UINT8_MAX, "whole KiB in a byte");
    _Static_assert(CB_Q8_PREFETCH_NEAR % 1024 == 0 && CB_Q8_PREFETCH_NEAR != CB_Q8_PREFETCH, "whole KiB, apart");
    if (!amd || family != 0x19u)
        return CB_Q8_PREFETCH / 1024;
    const int zen4 = (model >= 0x10u && model <= 0x1fu) || (model >= 0x60u && model <= 0x7fu) ||
                     (model >= 0xa0u && model <= 0xafu);
    return zen4 ? 0 : CB_Q8_PREFETCH_NEAR / 1024;
}

/* A tile's weights as loads the compiler keeps in address order (volatile asm), in the 64-byte loop. Left to
 * itself, one build of it read a block's chunks in the order 0,5,1,2,6,3,7,4, another 0,6,1,2,3,7,4,5; a
 * 256 MiB stream through the VNNI loop alone on a Zen 4, the hardware prefetchers only, reads 0.91x as fast
 * in the first order as in address order with 2 MiB pages, 0.92x with 4 KiB. (The AVX2 loop folds each load
 * into its VPABSB and VPSIGNB; an explicit load there costs an instruction a 32-byte half, 5% of decode's.) */
#if defined(CB_X86_VNNI)
static inline __attribute__((always_inline)) __m512i cb_ld_w512(const int8_t *p, __m512i bias)
{
    __m512i v; /* p's 64 bytes XOR bias, in one instruction as the compiler would fold it */
    __asm__ volatile("vpxord {%1, %2, %0|%0, %2, %1}" : "=v"(v) : "m"(*(const __m512i *)(const void *)p), "v"(bias));
    return v;
}
#endif

/* the prefetch of a chunk at p, pf bytes ahead (a constant; 0: none) */
#define CB_Q8_PF(p)                                                                                     \
    do {                                                                                                \
        if (pf)                                                                                         \
            _mm_prefetch((const char *)(p) + (pf), _MM_HINT_T0);                                        \
    } while (0)

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

#if defined(CB_X86_VNNI)
/* One 4-column chunk k of a block into the accumulator a: VPDPBUSD multiplies unsigned by signed bytes,
 * so the weights go in as w + 128 (XOR 0x80) and 128 * s[b] comes off again after the block. */
#define CB_VNNI_CHUNK(a, k)                                                                             \
    CB_Q8_PF(w + 64 * (k));                                                                             \
    a = _mm512_dpbusd_epi32(a, cb_ld_w512(w + 64 * (k), bias), _mm512_set1_epi32(cb_ld4(q + 4 * (k))))

/* One 4-column chunk k of a block in 32-byte halves, rows 0-7 into lo and 8-15 into hi (VPDPBUSD on YMM). */
#define CB_VNNI_CHUNK_HALVES(lo, hi, k)                                                                 \
    do {                                                                                                \
        const __m256i q_ = _mm256_set1_epi32(cb_ld4(q + 4 * (k)));                                      \
        const __m256i *w_ = (const __m256i *)(const void *)(w + 64 * (k));                              \
        lo = _mm256_dpbusd_epi32(lo, _mm256_xor_si256(_mm256_loadu_si256(w_), bias), q_);              \
        hi = _mm256_dpbusd_epi32(hi, _mm256_xor_si256(_mm256_loadu_si256(w_ + 1), bias), q_);          \
    } while (0)

/* The block sums of one tile (16 int32 lanes, one per row) where the tiles do not prefetch in software (an AMD
 * family 19h core, cb_q8_sw_prefetch_isa): the weights read 32 bytes at a time, two independent chains per half.
 * On an EPYC Zen 4, 288M int8c decode at 1 thread, 7 paired rounds: 1.105x [1.101-1.110] as fast as by
 * 64-byte loads, and 1.045x the x86_64-v3 build. The same sums. */
static inline __attribute__((always_inline)) __m512i cb_tile_isum_halves(const int8_t *w, const int8_t *q, int32_t s)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    __m256i l0 = _mm256_setzero_si256(), l1 = l0, h0 = l0, h1 = l0;
    CB_VNNI_CHUNK_HALVES(l0, h0, 0);
    CB_VNNI_CHUNK_HALVES(l1, h1, 1);
    CB_VNNI_CHUNK_HALVES(l0, h0, 2);
    CB_VNNI_CHUNK_HALVES(l1, h1, 3);
    CB_VNNI_CHUNK_HALVES(l0, h0, 4);
    CB_VNNI_CHUNK_HALVES(l1, h1, 5);
    CB_VNNI_CHUNK_HALVES(l0, h0, 6);
    CB_VNNI_CHUNK_HALVES(l1, h1, 7);
    const __m512i sum = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_add_epi32(l0, l1)), _mm256_add_epi32(h0, h1), 1);
    return _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * s));
}

/* The block sums of one tile (16 int32 lanes, one per row): four independent VPDPBUSD chains, written
 * out (its latency, not its rate, binds; a loop kept them in memory). With pf, each 64-byte chunk in one
 * load and its prefetch; else cb_tile_isum_halves. */
static inline __attribute__((always_inline)) __m512i cb_tile_isum(const int8_t *w, const int8_t *q, int32_t s,
                                                                   const int pf)
{
    if (!pf)
        return cb_tile_isum_halves(w, q, s);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    CB_VNNI_CHUNK(a0, 0);
    CB_VNNI_CHUNK(a1, 1);
    CB_VNNI_CHUNK(a2, 2);
    CB_VNNI_CHUNK(a3, 3);
    CB_VNNI_CHUNK(a0, 4);
    CB_VNNI_CHUNK(a1, 5);
    CB_VNNI_CHUNK(a2, 6);
    CB_VNNI_CHUNK(a3, 7);
    __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
    return _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * s));
}

/* acc[16] (one lane per row of the tile) over every block, as the scalar kernel orders it */
typedef __m512 cb_tile_acc;

static inline __attribute__((always_inline)) __m512 cb_tile_dot_pf(const cb_tensor *t, size_t tile, const cb_xq *xq,
                                                                    const int pf)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    __m512 acc = _mm512_setzero_ps(), sc = acc;
    for (size_t b = 0, g = 0, left = 0; b < blocks; b++, left--, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (left == 0) { /* the next group's scales */
            __m256 lo, hi;
            cb_tile_scales(t, tile, g++, &lo, &hi);
            sc = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
            left = per_group;
        }
        __m512 f = _mm512_cvtepi32_ps(cb_tile_isum(w, xq->q + b * CB_ACT_BLOCK, xq->s[b], pf));
        f = _mm512_mul_ps(f, _mm512_set1_ps(xq->d[b]));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(f, sc));
    }
    return acc;
}

static void cb_tile_store(cb_tile_acc v, float *out) { _mm512_storeu_ps(out, v); }

/* Four tokens over one tile: each chunk's weights loaded and biased once for all four. */
#define CB_VNNI_CHUNK4(k, A0, A1, A2, A3)                                                                \
    do {                                                                                                 \
        __m512i w_ = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * (k))), bias);         \
        A0 = _mm512_dpbusd_epi32(A0, w_, _mm512_set1_epi32(cb_ld4(q0 + 4 * (k))));                       \
        A1 = _mm512_dpbusd_epi32(A1, w_, _mm512_set1_epi32(cb_ld4(q1 + 4 * (k))));                       \
        A2 = _mm512_dpbusd_epi32(A2, w_, _mm512_set1_epi32(cb_ld4(q2 + 4 * (k))));                       \
        A3 = _mm512_dpbusd_epi32(A3, w_, _mm512_set1_epi32(cb_ld4(q3 + 4 * (k))));                       \
    } while (0)

/* token j's block sums (chains a and b added, the bias taken off) through cb_tile_dot's float steps */
#define CB_VNNI_FINISH(acc, a, b, xj)                                                                    \
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(            \
                                                             _mm512_add_epi32(a, b),                     \
                                                             _mm512_set1_epi32(128 * (xj)->s[bk]))),     \
                                                         _mm512_set1_ps((xj)->d[bk])),                   \
                                           sc))

static void cb_tile_dot4(const cb_tensor *t, size_t tile, const cb_xq *x, float (*out)[CB_TILE_ROWS])
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, sc = c0;
    for (size_t bk = 0, g = 0, left = 0; bk < blocks; bk++, left--, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (left == 0) {
            __m256 lo, hi;
            cb_tile_scales(t, tile, g++, &lo, &hi);
            sc = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
            left = per_group;
        }
        const int8_t *q0 = x[0].q + bk * CB_ACT_BLOCK, *q1 = x[1].q + bk * CB_ACT_BLOCK;
        const int8_t *q2 = x[2].q + bk * CB_ACT_BLOCK, *q3 = x[3].q + bk * CB_ACT_BLOCK;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        CB_VNNI_CHUNK4(0, a0, a1, a2, a3);
        CB_VNNI_CHUNK4(1, b0, b1, b2, b3);
        CB_VNNI_CHUNK4(2, a0, a1, a2, a3);
        CB_VNNI_CHUNK4(3, b0, b1, b2, b3);
        CB_VNNI_CHUNK4(4, a0, a1, a2, a3);
        CB_VNNI_CHUNK4(5, b0, b1, b2, b3);
        CB_VNNI_CHUNK4(6, a0, a1, a2, a3);
        CB_VNNI_CHUNK4(7, b0, b1, b2, b3);
        CB_VNNI_FINISH(c0, a0, b0, &x[0]);
        CB_VNNI_FINISH(c1, a1, b1, &x[1]);
        CB_VNNI_FINISH(c2, a2, b2, &x[2]);
        CB_VNNI_FINISH(c3, a3, b3, &x[3]);
    }
    _mm512_storeu_ps(out[0], c0);
    _mm512_storeu_ps(out[1], c1);
    _mm512_storeu_ps(out[2], c2);
    _mm512_storeu_ps(out[3], c3);
}

#else
/* One 4-column chunk k into a (rows 0-7) and c (rows 8-15). PMADDUBSW takes |w| unsigned (ABS of -128
 * is 0x80, 128 as unsigned) and q with w's sign (|q| <= 127, so SIGN never overflows), so no pair of
 * products (at most 128 * 127 each) can saturate its int16 sum, whatever byte a weight holds. */
#define CB_AVX2_CHUNK(k)                                                                               \
    do {                                                                                               \
        CB_Q8_PF(w + 64 * (k));                                                                       \
        __m256i x_ = _mm256_set1_epi32(cb_ld4(q + 4 * (k)));                                          \
        __m256i w0_ = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * (k)));               \
        __m256i w1_ = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * (k) + 32));          \
        __m256i p0_ = _mm256_maddubs_epi16(_mm256_abs_epi8(w0_), _mm256_sign_epi8(x_, w0_));            \
        __m256i p1_ = _mm256_maddubs_epi16(_mm256_abs_epi8(w1_), _mm256_sign_epi8(x_, w1_));            \
        a = _mm256_add_epi32(a, _mm256_madd_epi16(p0_, ones));                                        \
        c = _mm256_add_epi32(c, _mm256_madd_epi16(p1_, ones));                                        \
    } while (0)

/* Sixteen rows' block sums, eight lanes at a time, written out (a loop was not unrolled at -O2). */
static inline __attribute__((always_inline)) void cb_tile_isum(const int8_t *w, const int8_t *q, __m256i *lo,
                                                                 __m256i *hi, const int pf)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    CB_AVX2_CHUNK(0);
    CB_AVX2_CHUNK(1);
    CB_AVX2_CHUNK(2);
    CB_AVX2_CHUNK(3);
    CB_AVX2_CHUNK(4);
    CB_AVX2_CHUNK(5);
    CB_AVX2_CHUNK(6);
    CB_AVX2_CHUNK(7);
    *lo = a;
    *hi = c;
}

typedef struct cb_tile_acc {
    __m256 lo, hi;
} cb_tile_acc;

static inline __attribute__((always_inline)) cb_tile_acc cb_tile_dot_pf(const cb_tensor *t, size_t tile,
                                                                        const cb_xq *xq, const int pf)
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, s0 = acc0, s1 = acc0;
    for (size_t b = 0, g = 0, left = 0; b < blocks; b++, left--, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
        if (left == 0) { /* the next group's scales */
            cb_tile_scales(t, tile, g++, &s0, &s1);
            left = per_group;
        }
        __m256i i0, i1;
        cb_tile_isum(w, xq->q + b * CB_ACT_BLOCK, &i0, &i1, pf);
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

/* Four tokens over one tile, in two passes of eight rows: weights and |w| once for all four. */
#define CB_AVX2_TOKEN(A, qj, k)                                                                          \
    A = _mm256_add_epi32(A, _mm256_madd_epi16(_mm256_maddubs_epi16(                                      \
                                                  aw_, _mm256_sign_epi8(_mm256_set1_epi32(cb_ld4(qj + 4 * (k))), wv_)), \
                                              ones))

#define CB_AVX2_CHUNK4(k)                                                                                \
    do {                                                                                                 \
        __m256i wv_ = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * (k)));                \
        __m256i aw_ = _mm256_abs_epi8(wv_);                                                              \
        CB_AVX2_TOKEN(a0, q0, k);                                                                        \
        CB_AVX2_TOKEN(a1, q1, k);                                                                        \
        CB_AVX2_TOKEN(a2, q2, k);                                                                        \
        CB_AVX2_TOKEN(a3, q3, k);                                                                        \
    } while (0)

#define CB_AVX2_FINISH(acc, a, xj)                                                                       \
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps((xj)->d[bk])), sc))

static void cb_tile_dot4(const cb_tensor *t, size_t tile, const cb_xq *x, float (*out)[CB_TILE_ROWS])
{
    const size_t blocks = t->cols / CB_ACT_BLOCK, per_group = t->group_size / CB_ACT_BLOCK;
    const __m256i ones = _mm256_set1_epi16(1);
    for (size_t half = 0; half < 2; half++) {
        const int8_t *w = (const int8_t *)t->data + tile * CB_TILE_ROWS * t->cols + 32 * half;
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, sc = c0, unused;
        for (size_t bk = 0, g = 0, left = 0; bk < blocks; bk++, left--, w += CB_ACT_BLOCK * CB_TILE_ROWS) {
            if (left == 0) {
                if (half == 0)
                    cb_tile_scales(t, tile, g++, &sc, &unused);
                else
                    cb_tile_scales(t, tile, g++, &unused, &sc);
                left = per_group;
            }
            const int8_t *q0 = x[0].q + bk * CB_ACT_BLOCK, *q1 = x[1].q + bk * CB_ACT_BLOCK;
            const int8_t *q2 = x[2].q + bk * CB_ACT_BLOCK, *q3 = x[3].q + bk * CB_ACT_BLOCK;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            CB_AVX2_CHUNK4(0);
            CB_AVX2_CHUNK4(1);
            CB_AVX2_CHUNK4(2);
            CB_AVX2_CHUNK4(3);
            CB_AVX2_CHUNK4(4);
            CB_AVX2_CHUNK4(5);
            CB_AVX2_CHUNK4(6);
            CB_AVX2_CHUNK4(7);
            CB_AVX2_FINISH(c0, a0, &x[0]);
            CB_AVX2_FINISH(c1, a1, &x[1]);
            CB_AVX2_FINISH(c2, a2, &x[2]);
            CB_AVX2_FINISH(c3, a3, &x[3]);
        }
        _mm256_storeu_ps(out[0] + 8 * half, c0);
        _mm256_storeu_ps(out[1] + 8 * half, c1);
        _mm256_storeu_ps(out[2] + 8 * half, c2);
        _mm256_storeu_ps(out[3] + 8 * half, c3);
    }
}
#endif
#endif /* CB_HAS_Q8_TILES */

#endif
#endif /* CB_ARCH_X86_Q8_H */
