/*
 * arch/cortex-m/q4.h - the int4 block dot on Cortex-M. Included by kernels_q8.c only.
 *
 * MVE (Cortex-M55): the 16 bytes split into nibbles with VAND/VSHR, made signed (nibble - 8), and
 * two VMLADAV.S8 with the activations.
 * DSP (Cortex-M7): per 4-byte word (read with memcpy: a plain LDR, see q8.h) the low nibbles of bytes
 * 0 and 2 and of bytes 1 and 3 as 16-bit lane pairs (AND with 0x000f000f after a shift), the
 * activations' matching bytes sign-extended by SXTB16, SMLAD for each pair; the high nibbles the same
 * way with the activations 16 columns on; then minus 8 * qsum for the nibbles' offset. cb_q4_rows: four
 * rows at a time, each word of activations sign-extended once for the four.
 * Every sum is exact (at most 32 * 15 * 128), so the scalar definition's result.
 */
#ifndef CB_ARCH_CORTEX_M_Q4_H
#define CB_ARCH_CORTEX_M_Q4_H

#if CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_MVE) && defined(CB_HAS_Q4_DOT)
#include <arm_mve.h>

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    (void)qsum;
    const uint8x16_t raw = vldrbq_u8(w);
    const int8x16_t lo = vsubq_n_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), 8);
    const int8x16_t hi = vsubq_n_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), 8);
    int32_t sum = vmladavq_s8(lo, vldrbq_s8(q));
    return vmladavaq_s8(sum, hi, vldrbq_s8(q + 16));
}

#elif CB_ARCH == CB_ARCH_CORTEX_M && defined(CB_CM_DSP) && defined(CB_HAS_Q4_DOT)
#include <arm_acle.h>
#include <string.h>

/* sum + one 4-byte word b of a row's block against its activations: xl0/xl1 the SXTB16 of the matching
 * 4 activations (inputs i .. i + 3) and of them rotated by 8, xh0/xh1 the same 16 inputs on */
static inline __attribute__((always_inline)) int32_t cb_q4_dsp_word(int32_t sum, uint32_t b, int32_t xl0, int32_t xl1, int32_t xh0, int32_t xh1)
{
    const uint32_t m = 0x000f000fu;
    /* nibbles: lo of bytes 0,2 | lo of bytes 1,3 | hi of bytes 0,2 | hi of bytes 1,3, as u16 lane pairs */
    sum = __smlad((int32_t)(b & m), xl0, sum);
    sum = __smlad((int32_t)((b >> 8) & m), xl1, sum);
    sum = __smlad((int32_t)((b >> 4) & m), xh0, sum);
    return __smlad((int32_t)((b >> 12) & m), xh1, sum);
}

/* the SXTB16 forms of the 4 activations at q (bytes 0, 2) and of them rotated right by 8 (bytes 1, 3) */
static inline __attribute__((always_inline)) void cb_q4_dsp_act(const int8_t *q, int32_t *x0, int32_t *x1)
{
    uint32_t x;
    memcpy(&x, q, 4);
    *x0 = __sxtb16((int32_t)x);
    *x1 = __sxtb16((int32_t)cb_dsp_ror8(x)); /* q8.h */
}

static inline int32_t cb_dot32_q4_isa(const uint8_t *w, const int8_t *q, int32_t qsum)
{
    int32_t sum = 0;
    for (size_t i = 0; i < CB_ACT_BLOCK / 2; i += 4) {
        uint32_t b;
        int32_t xl0, xl1, xh0, xh1;
        memcpy(&b, w + i, 4);
        cb_q4_dsp_act(q + i, &xl0, &xl1);
        cb_q4_dsp_act(q + i + CB_ACT_BLOCK / 2, &xh0, &xh1);
        sum = cb_q4_dsp_word(sum, b, xl0, xl1, xh0, xh1);
    }
    return sum - 8 * qsum;
}

/* acc + one block's dot: the scalar kernel's float steps (f = isum, f *= d, f *= scale, acc += f) */
static inline __attribute__((always_inline)) void cb_q4_dsp_acc(float *acc, int32_t isum, float d, float scale)
{
    float f = (float)isum;
    f = f * d;
    f = f * scale;
    *acc = *acc + f;
}

#define CB_HAS_Q4_ROWS 1
#define CB_Q4_ROWS 4
#define CB_Q4_TOKENS 4 /* a prefill's pass over four rows keeps four tokens' dots: 64 bytes of stack, not 512 */

/* out[j][i] = the dot of row r + i with token j (xq[j]), i < 4, j < n <= 4: the scalar kernel's acc before
 * cb_finish, its float steps per row in block order. Each word of activations is sign-extended once for
 * the four rows (cb_dot32_q4_isa does it once a row), and a decode adds the previous rows' corrections a
 * few a block (p). Exact integer sums, the same float operations in the same order: the scalar
 * definition's bits. */
static inline __attribute__((always_inline)) void cb_q4_rows(const cb_tensor *t, size_t r, const cb_xq *xq,
                                                             size_t n, float (*out)[CB_Q4_ROWS], cb_outl_pend *p)
{
    const size_t blocks = t->n_groups, stride = t->row_stride;
    const uint8_t *w = t->data + r * stride;
    for (size_t j = 0; j < n; j++) /* summed in out itself: a firmware stack has no room for a copy */
        for (size_t i = 0; i < CB_Q4_ROWS; i++)
            out[j][i] = 0.0f;
    for (size_t b = 0; b < blocks; b++, w += CB_ACT_BLOCK / 2) {
        if (p)
            cb_outl_pend_run(t, p, CB_OUTL_PEND_PER_BLOCK);
        float sc[CB_Q4_ROWS];
        for (size_t i = 0; i < CB_Q4_ROWS; i++)
            sc[i] = cb_scale(t, r + i, b);
        for (size_t j = 0; j < n; j++) {
            const int8_t *q = xq[j].q + b * CB_ACT_BLOCK;
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t k = 0; k < CB_ACT_BLOCK / 2; k += 4) {
                int32_t xl0, xl1, xh0, xh1;
                uint32_t b0, b1, b2, b3;
                cb_q4_dsp_act(q + k, &xl0, &xl1);
                cb_q4_dsp_act(q + k + CB_ACT_BLOCK / 2, &xh0, &xh1);
                memcpy(&b0, w + k, 4);
                memcpy(&b1, w + stride + k, 4);
                memcpy(&b2, w + 2 * stride + k, 4);
                memcpy(&b3, w + 3 * stride + k, 4);
                s0 = cb_q4_dsp_word(s0, b0, xl0, xl1, xh0, xh1);
                s1 = cb_q4_dsp_word(s1, b1, xl0, xl1, xh0, xh1);
                s2 = cb_q4_dsp_word(s2, b2, xl0, xl1, xh0, xh1);
                s3 = cb_q4_dsp_word(s3, b3, xl0, xl1, xh0, xh1);
            }
            const int32_t off = 8 * xq[j].s[b];
            cb_q4_dsp_acc(&out[j][0], s0 - off, xq[j].d[b], sc[0]);
            cb_q4_dsp_acc(&out[j][1], s1 - off, xq[j].d[b], sc[1]);
            cb_q4_dsp_acc(&out[j][2], s2 - off, xq[j].d[b], sc[2]);
            cb_q4_dsp_acc(&out[j][3], s3 - off, xq[j].d[b], sc[3]);
        }
    }
}

#endif
#endif /* CB_ARCH_CORTEX_M_Q4_H */
