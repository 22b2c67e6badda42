/*
 * kernels_q16_test.c - the int16 matmul (kernels.h "int16 matmuls") through cb_matmul, the target's ISA path,
 * against cb_matmul_q16_scalar, bit for bit: rows that are and are not multiples of the ISA's eight and of a
 * quantization group's 32, 32..320 columns, 1..7 tokens, accumulating or not, the rows split in two calls,
 * the tokens one call each; weights up to +-8191 with rows and activation blocks at the range's ends (a
 * block's dot at 32 * 8191^2, the largest the format allows), zero and tiny activation blocks. Also the
 * scalar definition against a double-precision sum (a gross error in it, not its rounding) and the
 * embedding's row lookup. Prints "kernels_q16_test <isa>: <cases> cases, <outputs> outputs"; exit 1 on a
 * mismatch.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../src/kernels.h"

#define MAX_ROWS 130
#define MAX_COLS 320
#define MAX_TOKENS 7
#define SENTINEL 12345.0f

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

static float uniform(rng *r) /* [-1, 1) */
{
    return (float)((double)(next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct mat {
    cb_tensor t;
    int16_t q[MAX_ROWS * (MAX_COLS + 16)];
    float scale[MAX_ROWS];
} mat;

/* rows x cols weights, the row stride padded by 16 values; row 0 all +8191 and row 1 all -8191 (when there
 * are two), the rest random in range */
static void make(mat *m, size_t rows, size_t cols, rng *r)
{
    size_t stride = cols + 16;
    for (size_t i = 0; i < rows; i++) {
        m->scale[i] = (0.25f + (uniform(r) + 1.0f)) * 1e-4f;
        for (size_t c = 0; c < stride; c++) {
            int v = (int)(next(r) % (2 * CB_Q16_MAX + 1)) - CB_Q16_MAX;
            if (rows > 2 && i < 2)
                v = i == 0 ? CB_Q16_MAX : -CB_Q16_MAX;
            m->q[i * stride + c] = (int16_t)(c < cols ? v : 0x7FFF); /* padding the kernels must not read */
        }
    }
    memset(&m->t, 0, sizeof m->t);
    m->t.data = (const uint8_t *)m->q;
    m->t.scales = (const uint8_t *)m->scale;
    m->t.rows = (uint32_t)rows;
    m->t.cols = (uint32_t)cols;
    m->t.row_stride = (uint32_t)(stride * sizeof(int16_t));
    m->t.group_size = (uint32_t)cols;
    m->t.n_groups = 1;
    m->t.dtype = CB_I16;
    m->t.scale_dtype = CB_F32;
}

/* token j's activations: random, with block 0 of token 0 all equal (every q +8191), a zero block, a tiny one */
static void make_x(float x[MAX_TOKENS][MAX_COLS], size_t n, size_t cols, rng *r)
{
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < cols; c++) {
            float v = uniform(r) * (c % 5 == 0 ? 40.0f : 2.0f);
            size_t b = c / CB_ACT_BLOCK;
            if (j == 0 && b == 0)
                v = 3.5f;
            else if (b == 1 && j % 2)
                v = 0.0f;
            else if (b == 2 && j % 3 == 1)
                v *= 1e-32f;
            x[j][c] = v;
        }
}

/* the definition's value of row i for token j as a double sum of the dequantized operands */
static double approx(const mat *m, size_t i, const float *x)
{
    double sum = 0.0;
    for (size_t b = 0; b < m->t.cols / CB_ACT_BLOCK; b++) {
        int16_t q[CB_ACT_BLOCK];
        float d;
        cb_quantize_q16(x + b * CB_ACT_BLOCK, q, &d);
        for (size_t k = 0; k < CB_ACT_BLOCK; k++)
            sum += (double)m->q[i * (m->t.cols + 16) + b * CB_ACT_BLOCK + k] * q[k] * d;
    }
    return sum * m->scale[i];
}

int main(void)
{
    static const size_t row_counts[] = {1, 5, 8, 9, 63, 64, 65, 130};
    static const size_t col_counts[] = {32, 64, 96, 320};
    static mat m;
    static float xs[MAX_TOKENS][MAX_COLS];
    static float yv[4][MAX_TOKENS][MAX_ROWS + 8];
    rng r = {0x9E3779B97F4A7C15ull};
    size_t cases = 0, outputs = 0;
    for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof *col_counts; ci++)
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                size_t rows = row_counts[ri], cols = col_counts[ci];
                size_t n = 1 + (ri * 4 + ci + (size_t)accumulate) % MAX_TOKENS; /* every count 1..7 */
                make(&m, rows, cols, &r);
                make_x(xs, n, cols, &r);
                const float *x[MAX_TOKENS];
                float alpha[MAX_TOKENS], *y[4][MAX_TOKENS];
                for (size_t j = 0; j < n; j++) {
                    x[j] = xs[j];
                    alpha[j] = 0.5f + (uniform(&r) + 1.0f);
                }
                for (int v = 0; v < 4; v++)
                    for (size_t j = 0; j < n; j++) {
                        y[v][j] = yv[v][j];
                        for (size_t i = 0; i < MAX_ROWS + 8; i++)
                            yv[v][j][i] = i < rows ? (float)(i % 7) - 3.0f : SENTINEL;
                    }
                /* 0: the scalar definition, 1: cb_matmul (the ISA), 2: split at a third, 3: a token a call */
                cb_matmul_q16_scalar(&m.t, 0, rows, n, x, y[0], alpha, accumulate);
                cb_matmul(&m.t, 0, rows, n, x, y[1], alpha, accumulate);
                size_t mid = rows / 3;
                cb_matmul(&m.t, 0, mid, n, x, y[2], alpha, accumulate);
                cb_matmul(&m.t, mid, rows, n, x, y[2], alpha, accumulate);
                for (size_t j = 0; j < n; j++)
                    cb_matmul(&m.t, 0, rows, 1, &x[j], &y[3][j], &alpha[j], accumulate);
                for (size_t j = 0; j < n; j++) {
                    for (int v = 1; v < 4; v++)
                        if (memcmp(yv[0][j], yv[v][j], sizeof yv[0][j]) != 0) {
                            printf("kernels_q16_test: rows %zu cols %zu token %zu/%zu accumulate %d: variant %d "
                                   "differs from the scalar definition\n", rows, cols, j, n, accumulate, v);
                            return 1;
                        }
                    for (size_t i = 0; i < rows; i++) {
                        double want = (accumulate ? (double)((float)(i % 7) - 3.0f) : 0.0)
                                      + alpha[j] * approx(&m, i, x[j]);
                        double tol = 1e-5 * (fabs(want) + alpha[j] * m.scale[i] * 8191.0 * 40.0);
                        if (fabs((double)yv[0][j][i] - want) > tol) {
                            printf("kernels_q16_test: rows %zu cols %zu row %zu token %zu: %.9g, definition %.9g\n",
                                   rows, cols, i, j, (double)yv[0][j][i], want);
                            return 1;
                        }
                    }
                    outputs += rows;
                }
                if (rows > 2 && n > 0) { /* row 0 (+8191) against token 0's first block (every q +8191) */
                    int16_t q[CB_ACT_BLOCK];
                    float d;
                    cb_quantize_q16(xs[0], q, &d);
                    for (size_t k = 0; k < CB_ACT_BLOCK; k++)
                        if (q[k] != CB_Q16_MAX) {
                            printf("kernels_q16_test: a constant block is not all +%d\n", CB_Q16_MAX);
                            return 1;
                        }
                }
                float row[MAX_COLS];
                cb_dequant_row(&m.t, rows - 1, row);
                for (size_t c = 0; c < cols; c++)
                    if (row[c] != m.scale[rows - 1] * (float)m.q[(rows - 1) * (cols + 16) + c]) {
                        printf("kernels_q16_test: the row lookup of rows %zu cols %zu differs at %zu\n", rows, cols, c);
                        return 1;
                    }
                cases++;
            }
    printf("kernels_q16_test %s: %zu cases, %zu outputs bit for bit\n", cb_kernels_q16_isa(), cases, outputs);
    return 0;
}
