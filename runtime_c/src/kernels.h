/*
 * kernels.h - matrix-vector kernels over the blob's weight formats.
 *
 * cb_matvec_scalar is the reference: plain loops, one output row at a time,
 * summed in input order. It always builds. cb_matvec is the same computation
 * through the ISA path arch/select.h picks from the compiler's predefined
 * macros (AVX-512, AVX2+FMA+F16C, NEON, RVV 1.0, MVE with floating point;
 * none, or -DCOLIBRI_SCALAR: the scalar one). This header holds no ISA code:
 * that is in arch/<family>/, the scalar kernels in arch/scalar/.
 * The SIMD paths read only the rows' own bytes (the padded stride at most)
 * and x[0, cols); their float sums differ from the scalar ones only in
 * summation order (and FMA's single rounding), so targets agree on greedy
 * tokens, not on the last bit of every logit. The integer matmuls below
 * (int8 weights and activations) agree on every bit.
 */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "arch/select.h"

enum { CB_F32 = 1, CB_F16 = 2, CB_I8 = 3, CB_I8C = 4, CB_I4 = 5, CB_I4C = 6, CB_I16 = 8 }; /* weight and scale dtypes, as in FORMAT.md */

/* Whether this build has the int4 kernels: a runtime specialised to a model (COLIBRI_SPECIALISED) only when
 * its blob has int4/int4c tensors (model.h COLIBRI_INT4), so an int8c firmware image does not carry them;
 * blob.c then refuses an int4 tensor (COLIBRI_E_DTYPE). A build for known blobs (several models in one
 * image) may say COLIBRI_INT4=0 itself. Every other build has them. */
#if defined(COLIBRI_SPECIALISED)
#include "model.h"
#endif
#if defined(COLIBRI_INT4)
#define CB_HAS_INT4 COLIBRI_INT4
#else
#define CB_HAS_INT4 1
#endif
static inline int cb_is_int4(unsigned dtype) { return dtype == CB_I4 || dtype == CB_I4C; }
/* The same for the int16 kernels (model.h COLIBRI_INT16). */
#if defined(COLIBRI_INT16)
#define CB_HAS_INT16 COLIBRI_INT16
#else
#define CB_HAS_INT16 1
#endif

/* One validated weight matrix, pointers into the blob. W[r][c] =
 * scale[r][c / group_size] * q[r][c] (I8, I8C), plus oval[i] at flat index
 * idx[i] = idx[i-1] + ogap[i] (idx[0] = ogap[0]) for I8C and I4C; F32 and F16 are stored as is.
 * I4/I4C: q[r][c] = nibble - 8 in [-8, 7], group_size CB_ACT_BLOCK, rows of 16 bytes a block: byte i
 * of block b holds column 32b + i in its low nibble and 32b + 16 + i in its high one. */
typedef struct cb_tensor {
    const uint8_t *data;   /* rows * row_stride bytes */
    const uint8_t *scales; /* rows * n_groups scales of scale_dtype (I8, I8C) */
    const uint16_t *ogap;  /* n_outliers gaps between flat indices row*cols + col (validated increasing) */
    const uint16_t *oval;  /* n_outliers f16 corrections */
    uint32_t rows, cols, row_stride, group_size, n_groups, n_outliers;
    uint8_t dtype, scale_dtype;
    uint8_t q8;    /* multiplied with int8 activations: cb_matmul_q8 (format 1.2, FORMAT.md "Integer matmuls") */
    uint8_t tiled; /* q8 and stored in 16-row tiles (layout 2); else row-major */
    uint8_t sw_prefetch; /* KiB ahead the tiles prefetch in software, 0: none (cb_q8_sw_prefetch); no bit changes */
} cb_tensor;

/* The attention kernels, in the header so the attention loops inline them (head_dim is short: a call
 * costs as much as the work): the scalar ones, and the ISA's where it has them (arch/select.h). */
#include "arch/scalar/attn.h"
#include "arch/x86/attn.h"
#include "arch/arm/attn.h"

/* Eight partial sums (element i into sum i % 8) combined pairwise: one fixed order on every target
 * (arch/scalar/attn.h). */
static inline float cb_dot(const float *a, const float *b, size_t n)
{
    return cb_dot_isa(a, b, n);
}

/* out[t] = cb_dot(q, keys + t * stride, hd) * scale for t < n: the attention's scores. An ISA kernel
 * takes several positions per pass and gives the same bits. */
static inline void cb_scores(float *restrict out, const float *restrict q, const float *restrict keys, size_t stride,
                             size_t n, size_t hd, float scale)
{
    cb_scores_isa(out, q, keys, stride, n, hd, scale);
}

/* out[i] = sum over t < n, in order, of w[t] * rows[t * stride + i], for i < len (the attention's values
 * weighted by the scores): the outputs kept in registers across all t (32 at a time with AVX2, 16 with
 * AArch64 NEON, else 8), each element still the same multiplies and adds in the same order as one axpy
 * per t. */
static inline void cb_weighted_rows(float *restrict out, const float *restrict w, const float *restrict rows,
                                    size_t stride, size_t n, size_t len)
{
    cb_weighted_rows_isa(out, w, rows, stride, n, len);
}

/* cb_scores and cb_weighted_rows over a 16-bit (f16) or 8-bit (int8, a scale per head per position) KV
 * cache (arch/scalar/attn.h's definition; AVX2/F16C and AArch64 NEON load and convert eight elements at a
 * time, exactly, and keep the scalar order of products and sums: bit for bit the same everywhere), and the
 * int8 cache's quantization of one head (scalar on every target). */
#define cb_scores_f16 cb_scores_f16_isa
#define cb_scores_i8 cb_scores_i8_isa
#define cb_weighted_rows_f16 cb_weighted_rows_f16_isa
#define cb_weighted_rows_i8 cb_weighted_rows_i8_isa
#define cb_kv_quantize cb_kv_quantize_scalar

/* v[i] = exp(v[i] - max) / sum: max the largest v[i] (NaNs skipped unless v[0] is one), exp cb_expf,
 * sum the eight partial sums of cb_dot (element i into sum i % 8) combined in its order. */
void cb_softmax(float *v, size_t n);
/* v[i] = cb_expf(v[i] - shift), and g[i] = silu(g[i]) * u[i] = g[i] / (1 + cb_expf(-g[i])) * u[i]: with
 * AVX2 eight at a time, by the same operations, so the same bits as the scalar loops */
void cb_exp_shift(float *v, size_t n, float shift);
void cb_silu_mul(float *restrict g, const float *restrict u, size_t n);

/* y[r] = (accumulate ? y[r] : 0) + alpha * (W x)[r]. x has cols, y rows elements; they must not overlap. */
void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate);

/* The scalar reference of cb_matvec, for tests and for targets without a SIMD path. */
void cb_matvec_scalar(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate);

/* Several tokens at once, over the rows [r0, r1): for j < n and r0 <= r < r1,
 *   y[j][r] = (accumulate ? y[j][r] : 0) + alpha[j] * (W x[j])[r].
 * Each (token, row) result is computed with exactly the operations, in exactly the order, that
 * cb_matvec (cb_matmul_scalar: cb_matvec_scalar) uses for that row: it is bit-identical to n
 * cb_matvec calls, whatever n and however the rows are split into ranges. The weights are read
 * once for all n tokens. No x[j] may overlap any y[k]. */
void cb_matmul(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
               const float *alpha, int accumulate);
/* (F32, F16, I8, I8C: an I16 tensor goes through cb_matmul, whose definition is cb_matmul_q16_scalar) */
void cb_matmul_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                      const float *alpha, int accumulate);

/* The path cb_matvec takes: arch/select.h's CB_ISA_NAME ("scalar", "avx2", "neon", ...). */
const char *cb_kernels_isa(void);

/* ---- integer matmuls (FORMAT.md "Integer matmuls") ----
 * A q8 tensor (I8/I8C, cols and group_size multiples of CB_ACT_BLOCK) is multiplied with activations
 * quantized per token: block b of CB_ACT_BLOCK values gets d[b] = max|x| / 127 and
 * q[k] = round-half-away(x[k] * 127 / max|x|) in [-127, 127]; s[b] = sum of the block's q.
 * For row r and token j, with isum_b the exact int32 dot of the row's block b with q,
 *   acc = 0; for b in order: acc += ((float)isum_b * d[b]) * scale[r][g(b)]   (three roundings, no FMA)
 * then the row's corrections are added in float (acc += oval * x[idx], as cb_matvec) and
 *   y[j][r] = (accumulate ? y[j][r] : 0) + alpha[j] * acc.
 * Integer sums are exact in any order, and the float steps run per row in block order in every ISA
 * path, so every path gives the scalar one's result bit for bit. */
#define CB_ACT_BLOCK 32u
#define CB_TILE_ROWS 16u

typedef struct cb_xq {
    const int8_t *q;  /* cols values (the matrix's), padded to whole blocks with zeros */
    const float *d;   /* per block */
    const int32_t *s; /* per block */
} cb_xq;

/* x[0, n) -> q, d, s of ceil(n / CB_ACT_BLOCK) blocks (q zero-padded to whole blocks) */
void cb_quantize_q8(const float *x, size_t n, int8_t *q, float *d, int32_t *s);

/* cb_matmul for a q8 tensor; xq[j] are the x[j] quantized. Rows [r0, r1) with r0 and r1 multiples of
 * CB_TILE_ROWS or r1 == rows. */
void cb_matmul_q8(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq, const float *const *x,
                  float *const *y, const float *alpha, int accumulate);
void cb_matmul_q8_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate);

/* How far ahead, in KiB, the int8 tile kernels should prefetch the weights in software on the CPU running this
 * (x86, arch/x86/q8.h: 8 KiB, on an AMD Zen 3 1 KiB, on a Zen 4 not), else 0; asked once, at init, for
 * cb_tensor.sw_prefetch. */
uint8_t cb_q8_sw_prefetch(void);

/* The path cb_matmul_q8 takes: arch/select.h's CB_ISA_Q8_NAME ("scalar", "avx2", "neon-dotprod", ...). */
const char *cb_kernels_q8_isa(void);

/* ---- int4 matmuls ----
 * An I4/I4C tensor (always q8: any cols, a last partial block's nibbles 8, i.e. 0) goes through
 * cb_matmul_q8 like an int8 one, with isum_b the exact int32 sum over the block's columns of
 * (nibble - 8) * q, and then the same float steps, corrections and alpha, in the same order.
 * cb_matmul_q4_scalar is that definition with the scalar block dot; every ISA path equals it bit for bit. */
void cb_matmul_q4_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const cb_xq *xq,
                         const float *const *x, float *const *y, const float *alpha, int accumulate);
/* arch/select.h's CB_ISA_Q4_NAME: the block dot cb_matmul_q8 uses for int4 ("avx2", "neon-dotprod", ...) */
const char *cb_kernels_q4_isa(void);

/* ---- int16 matmuls ----
 * An I16 tensor (row-major int16 q with |q| <= CB_Q16_MAX, cols a multiple of CB_ACT_BLOCK, one f32 scale a
 * row, no corrections) goes through cb_matmul with float x, which it quantizes itself per token and block of
 * CB_ACT_BLOCK: d = max|x| / CB_Q16_MAX and q = round-half-away(x * CB_Q16_MAX / max|x|) (cb_quantize_q8's
 * steps with CB_Q16_MAX for 127; no buffer: each block is quantized once per group of rows). For row r and
 * token j, with isum_b the exact int32 dot of the row's block b with q (32 * 8191^2 < 2^31),
 *   acc = 0; for b in order: acc += ((float)isum_b * d[b]) * scale[r]   (three roundings, no FMA)
 *   y[j][r] = accumulate ? y[j][r] + alpha[j] * acc : alpha[j] * acc.
 * Integer sums are exact in any order and the float steps run per row in block order in every path, so
 * every ISA gives cb_matmul_q16_scalar's result bit for bit. */
#define CB_Q16_MAX 8191

static inline int cb_is_int16(unsigned dtype) { return CB_HAS_INT16 && dtype == CB_I16; }

/* Block b of an I16 matmul's activations: the CB_ACT_BLOCK values at x quantized to q, d. */
void cb_quantize_q16(const float *x, int16_t *q, float *d);
void cb_matmul_q16_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x,
                          float *const *y, const float *alpha, int accumulate);
#if defined(CB_HAS_Q16_DOT)
void cb_matmul_q16(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                   const float *alpha, int accumulate);
#else /* no block dots of the ISA's: the scalar kernel is the kernel (one copy in the image, one frame deep) */
#define cb_matmul_q16 cb_matmul_q16_scalar
#endif
/* arch/select.h's CB_ISA_Q16_NAME: the block dots cb_matmul_q16 uses ("avx2", "neon", "scalar") */
const char *cb_kernels_q16_isa(void);

/* scale[r][g] of an I8/I8C tensor as f32, in either layout */
float cb_scale(const cb_tensor *t, size_t r, size_t g);

/* out[c] = W[r][c]: one dequantized row (the embedding lookup). */
void cb_dequant_row(const cb_tensor *t, size_t r, float *out);

#endif /* CB_KERNELS_H */
