/*
 * kernels_q4_test.c - the int4 matmul kernels against their definition, on the target.
 *
 * Built from kernels.c, kernels_q8.c and cbmath.c with the target's flags, run natively or under QEMU
 * by tests/test_kernels.py, and as a bare-metal image by tests/test_firmware_kernels.py (as
 * kernels_q8_test.c: -DCB_TEST_BARE_METAL, a static pool, the semihosting console, the weights one
 * byte past a word boundary). For random int4 and int4c matrices (1..40 rows, 32..320 columns, also
 * widths that are not a multiple of the 32-column block, f16 and f32 scales, ~3% corrections, every
 * nibble including 0 and 15), activations with zero, tiny and huge blocks, 1..7 tokens, with and
 * without accumulation:
 *   - the ISA path (cb_matmul_q8 on an I4/I4C tensor) equals cb_matmul_q4_scalar bit for bit: all rows
 *     at once, the rows split in two ranges, and one token at a time;
 *   - the scalar result is within 1e-5 of the definition evaluated in double (the nibbles unpacked
 *     here, exact integer block sums, the corrections times x), and no output past the rows is written;
 *   - on Linux targets, one token over a matrix taller than a decode buffer (test_tall.h), whole and split;
 *   - cb_dequant_row (the embedding lookup) gives scale * (nibble - 8) + correction exactly.
 * Prints "kernels_q4_test <isa>: <cases> cases, <outputs> outputs" and exits 1 on the first failure.
 */
#include <math.h>
#include <string.h>

#include "../src/cbmath.h"
#include "../src/kernels.h"
#include "../src/kernels_outl.h"

#define SENTINEL 12345.0f
#define MAX_TOKENS 7
#define MAX_ROWS 40u
#define MAX_COLS 320u
#define BLK 32u

#if defined(CB_TEST_BARE_METAL)
#define POOL_BYTES (MAX_ROWS * (MAX_COLS / 2u) + MAX_ROWS * (MAX_COLS / BLK) * 4u + 4u * (MAX_ROWS * MAX_COLS / 16u + 1u) + 6u * 16u)
#define WEIGHT_SKEW 1u
#else
#define WEIGHT_SKEW 0u
#endif
#include "test_io.h"
#include "test_rng.h"

typedef struct mat {
    cb_tensor t;
    uint8_t *w, *s;
    uint16_t *ogap, *oval;
} mat;

static int fail(const char *what, size_t rows, size_t cols, size_t r, size_t j, double a, double b)
{
    put_str("FAIL ");
    put_str(what);
    put_str(": ");
    put_size(rows);
    put_str("x");
    put_size(cols);
    put_str(", row ");
    put_size(r);
    put_str(" token ");
    put_size(j);
    put_str(": ");
    put_real(a);
    put_str(" vs ");
    put_real(b);
    put_str("\n");
    return 1;
}

static size_t blocks_of(size_t cols) { return (cols + BLK - 1) / BLK; }

/* q[r][c] in [-8, 7], read from the packed row as FORMAT.md describes it */
static int nibble(const mat *m, size_t r, size_t c)
{
    const uint8_t *row = m->w + r * m->t.row_stride + (c / BLK) * (BLK / 2);
    size_t i = c % BLK;
    return (i < BLK / 2 ? row[i] & 15 : row[i - BLK / 2] >> 4) - 8;
}

static double scale_of(const mat *m, size_t r, size_t g)
{
    size_t i = r * blocks_of(m->t.cols) + g;
    if (m->t.scale_dtype == CB_F32) {
        float f;
        memcpy(&f, m->s + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, m->s + 2 * i, 2);
    return cb_f16_to_f32(h);
}

static int make(mat *m, size_t rows, size_t cols, int scale_dt, int with_outliers, rng *r)
{
    size_t blocks = blocks_of(cols), stride = blocks * (BLK / 2), es = scale_dt == CB_F32 ? 4 : 2;
    m->w = take(rows * stride, WEIGHT_SKEW);
    m->s = take(rows * blocks * es, 0);
    if (!m->w || !m->s)
        return fail("allocation", rows, cols, 0, 0, 0.0, 0.0);
    for (size_t i = 0; i < rows * stride; i++)
        m->w[i] = (uint8_t)next(r); /* every nibble, 0 (-8) and 15 (7) included */
    for (size_t i = 0; i < rows; i++) /* the columns past cols hold nibble 8 (zero), as the exporter writes */
        for (size_t c = cols; c < blocks * BLK; c++) {
            uint8_t *b = m->w + i * stride + (c / BLK) * (BLK / 2) + c % (BLK / 2);
            *b = c % BLK < BLK / 2 ? (uint8_t)((*b & 0xf0u) | 8u) : (uint8_t)((*b & 0x0fu) | 0x80u);
        }
    for (size_t i = 0; i < rows * blocks; i++) {
        float sc = (0.0005f + (uniform(r) + 1.0f) * 0.02f) * (next(r) % 2 ? 1.0f : -1.0f); /* either sign */
        if (next(r) % 97 == 0)
            sc *= 2e-36f;
        if (scale_dt == CB_F32) {
            memcpy(m->s + 4 * i, &sc, 4);
        } else {
            uint16_t h = cb_f32_to_f16(sc);
            memcpy(m->s + 2 * i, &h, 2);
        }
    }
    size_t n = 0, total = rows * cols;
    if (with_outliers) {
        rng dry = *r;
        for (size_t i = 0; i < total; i++)
            if (next(&dry) % 32 == 0) {
                (void)next(&dry);
                n++;
            }
    }
    m->ogap = take((n + 1) * 2, 0);
    m->oval = take((n + 1) * 2, 0);
    if (!m->ogap || !m->oval)
        return fail("allocation", rows, cols, 0, 0, (double)n, 0.0);
    if (with_outliers) {
        uint64_t last = 0;
        for (size_t i = 0, k = 0; i < total; i++)
            if (next(r) % 32 == 0) {
                m->ogap[k] = (uint16_t)(k ? i - last : i);
                m->oval[k] = cb_f32_to_f16(uniform(r) * 2.0f);
                last = i;
                k++;
            }
    }
    cb_tensor t = {0};
    t.data = m->w;
    t.scales = m->s;
    t.rows = (uint32_t)rows;
    t.cols = (uint32_t)cols;
    t.row_stride = (uint32_t)stride;
    t.group_size = BLK;
    t.n_groups = (uint32_t)blocks;
    t.n_outliers = (uint32_t)n;
    t.dtype = with_outliers ? CB_I4C : CB_I4;
    t.scale_dtype = (uint8_t)scale_dt;
    t.q8 = 1;
    t.ogap = n ? m->ogap : NULL;
    t.oval = n ? m->oval : NULL;
    m->t = t;
    return 0;
}

static void release(mat *m)
{
    give_back(m->oval);
    give_back(m->ogap);
    give_back(m->s);
    give_back(m->w);
}

typedef struct acts {
    float x[MAX_TOKENS][MAX_COLS];
    int8_t q[MAX_TOKENS][MAX_COLS];
    float d[MAX_TOKENS][MAX_COLS / BLK];
    int32_t s[MAX_TOKENS][MAX_COLS / BLK];
    cb_xq xq[MAX_TOKENS];
} acts;

static void make_acts(acts *a, size_t n, size_t cols, rng *r)
{
    for (size_t j = 0; j < n; j++) {
        for (size_t c = 0; c < cols; c++) {
            size_t b = c / BLK;
            float scale = (b + j) % 5 == 0 ? 1e-30f : (b + j) % 5 == 1 ? 1e4f : 1.0f;
            if ((b + 2 * j) % 11 == 4)
                scale = 3e-38f;
            a->x[j][c] = (b + j) % 7 == 3 ? 0.0f : uniform(r) * scale;
        }
        cb_quantize_q8(a->x[j], cols, a->q[j], a->d[j], a->s[j]);
        a->xq[j].q = a->q[j];
        a->xq[j].d = a->d[j];
        a->xq[j].s = a->s[j];
    }
}

/* row r's corrections, dense: one walk over them all */
static void row_corrections(const mat *m, size_t r, double *out, unsigned char *has)
{
    uint64_t idx = 0, first = (uint64_t)r * m->t.cols;
    for (size_t c = 0; c < m->t.cols; c++) {
        out[c] = 0.0;
        has[c] = 0;
    }
    for (size_t k = 0; k < m->t.n_outliers; k++) {
        idx += m->ogap[k];
        if (idx >= first && idx < first + m->t.cols) {
            out[idx - first] = cb_f16_to_f32(m->oval[k]);
            has[idx - first] = 1;
        }
    }
}

static double definition(const mat *m, size_t r, const acts *a, size_t j, double *mag)
{
    size_t cols = m->t.cols;
    double acc = 0.0;
    *mag = 0.0;
    for (size_t b = 0; b < blocks_of(cols); b++) {
        long isum = 0;
        for (size_t c = b * BLK; c < b * BLK + BLK && c < cols; c++)
            isum += (long)nibble(m, r, c) * a->q[j][c];
        double v = (double)isum * a->d[j][b] * scale_of(m, r, b);
        acc += v;
        *mag += fabs(v);
    }
    static double corr[MAX_COLS];
    static unsigned char has[MAX_COLS];
    row_corrections(m, r, corr, has);
    for (size_t c = 0; c < cols; c++) {
        double e = corr[c] * a->x[j][c];
        acc += e;
        *mag += fabs(e);
    }
    return acc;
}

static int check_dequant(const mat *m)
{
    static float row[MAX_COLS];
    static double corr[MAX_COLS];
    static unsigned char has[MAX_COLS];
    for (size_t r = 0; r < m->t.rows; r++) {
        cb_dequant_row(&m->t, r, row);
        row_corrections(m, r, corr, has);
        for (size_t c = 0; c < m->t.cols; c++) {
            float want = (float)scale_of(m, r, c / BLK) * (float)nibble(m, r, c);
            if (has[c])
                want += (float)corr[c];
            if (memcmp(&row[c], &want, sizeof want) != 0)
                return fail("dequant_row", m->t.rows, m->t.cols, r, c, row[c], want);
        }
    }
    return 0;
}

#if !defined(CB_TEST_BARE_METAL)
#include "test_tall.h"

/* One token (decode) over a matrix taller than a decode buffer (kernels_q8.c: CB_DECODE_ROWS rows of sums, then
 * their corrections, then their stores): the ISA path over all rows and split at a row that is not a buffer's
 * boundary equals the scalar definition bit for bit, and writes no row past the range. (Not on the MCUs:
 * their paths have no decode buffer, and the matrix is larger than their pool.) */
static int check_tall_decode(rng *r, size_t *cases)
{
    static acts a;
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        mat m;
        size_t row;
        float got, want;
        if (make(&m, TALL_ROWS, 100, CB_F16, 1, r))
            return 1;
        make_acts(&a, 1, 100, r);
        int v = tall_decode(cb_matmul_q4_scalar, &m.t, &m.t, a.xq, a.x[0], accumulate, &row, &got, &want);
        if (v)
            return fail(tall_what[v], TALL_ROWS, 100, row, 0, got, want);
        release(&m);
        ++*cases;
    }
    return 0;
}
#endif

int main(void)
{
    static const size_t row_counts[] = {1, 5, 16, 17, 40};
    static const size_t col_counts[] = {32, 40, 64, 96, 100, 160, 200, 320};
    rng r = {0x2545F4914F6CDD1Dull};
    static acts a;
    size_t cases = 0, outputs = 0;
#if !defined(CB_TEST_BARE_METAL)
    if (check_tall_decode(&r, &cases))
        return 1;
#endif
    for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof *col_counts; ci++)
            for (int variant = 0; variant < 4; variant++) {
                size_t rows = row_counts[ri], cols = col_counts[ci];
                int scale_dt = variant < 2 ? CB_F16 : CB_F32, outl = variant % 2;
                size_t n = 1 + (size_t)((ri * 8 + ci + (size_t)variant) % MAX_TOKENS); /* every count 1..7 */
                mat m;
                if (make(&m, rows, cols, scale_dt, outl, &r))
                    return 1;
                make_acts(&a, n, cols, &r);
                if (check_dequant(&m))
                    return 1;
                float alpha[MAX_TOKENS];
                static float yv[4][MAX_TOKENS][MAX_ROWS + 8];
                const float *x[MAX_TOKENS];
                float *y[4][MAX_TOKENS];
                for (size_t j = 0; j < n; j++) {
                    alpha[j] = 0.5f + (uniform(&r) + 1.0f);
                    x[j] = a.x[j];
                }
                int accumulate = (int)(next(&r) % 2);
                for (int v = 0; v < 4; v++)
                    for (size_t j = 0; j < n; j++) {
                        y[v][j] = yv[v][j];
                        for (size_t i = 0; i < MAX_ROWS + 8; i++)
                            yv[v][j][i] = i < rows ? (float)(i % 7) - 3.0f : SENTINEL;
                    }
                /* 0: the scalar definition, 1: ISA, 2: ISA split on a 16-row boundary, 3: ISA per token */
                cb_matmul_q4_scalar(&m.t, 0, rows, n, a.xq, x, y[0], alpha, accumulate);
                cb_matmul_q8(&m.t, 0, rows, n, a.xq, x, y[1], alpha, accumulate);
                size_t mid = rows > 16 ? 16 : rows;
                cb_matmul_q8(&m.t, 0, mid, n, a.xq, x, y[2], alpha, accumulate);
                cb_matmul_q8(&m.t, mid, rows, n, a.xq, x, y[2], alpha, accumulate);
                for (size_t j = 0; j < n; j++)
                    cb_matmul_q8(&m.t, 0, rows, 1, &a.xq[j], &x[j], &y[3][j], &alpha[j], accumulate);
                static const char *const what[4] = {"", "isa", "isa split", "isa per token"};
                for (size_t j = 0; j < n; j++)
                    for (size_t i = 0; i < MAX_ROWS + 8; i++) {
                        for (int v = 1; v < 4; v++)
                            if (memcmp(&yv[v][j][i], &yv[0][j][i], sizeof(float)) != 0)
                                return fail(what[v], rows, cols, i, j, yv[v][j][i], yv[0][j][i]);
                        if (i >= rows) {
                            if (yv[0][j][i] != SENTINEL)
                                return fail("write beyond rows", rows, cols, i, j, yv[0][j][i], SENTINEL);
                            continue;
                        }
                        double before = accumulate ? (double)((float)(i % 7) - 3.0f) : 0.0;
                        double mag, want = before + alpha[j] * definition(&m, i, &a, j, &mag), got = yv[0][j][i];
                        if (!(fabs(got - want) <= 1e-5 * (alpha[j] * mag + fabs(before)) + 1e-37))
                            return fail("definition", rows, cols, i, j, got, want);
                        outputs++;
                    }
                cases++;
                release(&m);
            }
    put_str("kernels_q4_test ");
    put_str(cb_kernels_q4_isa());
    put_str(": ");
    put_size(cases);
    put_str(" cases, ");
    put_size(outputs);
    put_str(" outputs\n");
    return 0;
}
