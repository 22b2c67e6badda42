/*
 * kernels.h - matrix-vector kernels over the blob's weight formats.
 *
 * cb_matvec_scalar is the reference: plain loops, one output row at a time,
 * summed in input order. It always builds. cb_matvec is the same computation
 * through the ISA path the compiler's predefined macros select (AVX-512,
 * AVX2+FMA+F16C, NEON, RVV 1.0; none, or -DCOLIBRI_SCALAR: the scalar one).
 * The SIMD paths read only the rows' own bytes (the padded stride at most)
 * and x[0, cols); their float sums differ from the scalar ones only in
 * summation order (and FMA's single rounding), so targets agree on greedy
 * tokens, not on the last bit of every logit.
 */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { CB_F32 = 1, CB_F16 = 2, CB_I8 = 3, CB_I8C = 4 }; /* weight and scale dtypes, as in FORMAT.md */

/* One validated weight matrix, pointers into the blob. W[r][c] =
 * scale[r][c / group_size] * q[r][c] (I8, I8C), plus oval[i] at flat index
 * idx[i] = idx[i-1] + ogap[i] (idx[0] = ogap[0]) for I8C; F32 and F16 are stored as is. */
typedef struct cb_tensor {
    const uint8_t *data;   /* rows * row_stride bytes */
    const uint8_t *scales; /* rows * n_groups scales of scale_dtype (I8, I8C) */
    const uint16_t *ogap;  /* n_outliers gaps between flat indices row*cols + col (validated increasing) */
    const uint16_t *oval;  /* n_outliers f16 corrections */
    uint32_t rows, cols, row_stride, group_size, n_groups, n_outliers;
    uint8_t dtype, scale_dtype;
} cb_tensor;

float cb_dot(const float *a, const float *b, size_t n);

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
void cb_matmul_scalar(const cb_tensor *t, size_t r0, size_t r1, size_t n, const float *const *x, float *const *y,
                      const float *alpha, int accumulate);

/* The path cb_matvec takes: "scalar", "avx512", "avx2", "neon", "rvv". */
const char *cb_kernels_isa(void);

/* out[c] = W[r][c]: one dequantized row (the embedding lookup). */
void cb_dequant_row(const cb_tensor *t, size_t r, float *out);

#endif /* CB_KERNELS_H */
