/*
 * kernels_q8_test.c - the integer matmul kernels against their definition, on the target.
 *
 * Built from kernels.c, kernels_q8.c and cbmath.c with the target's flags,
 * run natively or under QEMU by tests/test_kernels.py. For random int8 and
 * int8c matrices (rows around the 16-row tiles, 32..320 columns, per-row and
 * grouped f16/f32 scales, ~3% corrections), activations with zero, tiny and
 * huge blocks, 1..4 tokens, row ranges split on tiles, with and without
 * accumulation:
 *   - the ISA path (cb_matmul_q8) equals the scalar kernel bit for bit, in both layouts;
 *   - the scalar kernel gives the same bits from the tiled and the row-major copy of a matrix;
 *   - the scalar result is within 1e-5 of the definition evaluated in double
 *     (exact integer block sums, the corrections times x);
 *   - cb_quantize_q8 keeps |q| <= 127, s = sum q, and |x - q d| <= d / 2 (+ rounding) per value;
 *   - on Linux targets, one token over a matrix taller than a decode buffer (test_tall.h), whole and split,
 *     with the tiles' software prefetch (cb_tensor.sw_prefetch) off, 1 KiB and 8 KiB ahead (in the cases
 *     above, any of the three);
 *   - the int8c correction walk (kernels_outl.h: cb_outl_seek, cb_outl_apply, cb_finish), which every
 *     path shares, against a definition that decodes the flat indices itself: the same bits per
 *     (row, token) for 1..16 rows and 1..3 tokens from any start row, including runs of corrections
 *     longer than the seek's 16-at-a-time steps, and the walk left at the first correction past the rows;
 (sentinels) and the padded rows of a tile are not read
 *     into the outputs (they hold garbage here, which zero scales would hide).
 * Prints "kernels_q8_test <isa>: <cases> cases, <outputs> outputs, software prefetch <N KiB|off>" (the choice
 * init makes on this CPU, cb_q8_sw_prefetch) and exits 1 on the first failure.
 *
 * Built with -DCB_TEST_BARE_METAL (tests/test_firmware_kernels.py) it is a firmware image's main,
 * linked with firmware_examples' startup code and booted under the target's QEMU: no heap (the
 * matrices come from a static pool, cleared per case), output through board.h's semihosting
 * console (a failure's two values as f32 bits instead of %.9g), and the row-major weights start
 * one byte past a word boundary, so the row dot of the MCU paths (MVE, DSP) must load unaligned.
 * Otherwise every matrix is its own exact-size heap block, so that ASan traps an over-read.
 */
#include <math.h>
#include <string.h>

#include "../src/cbmath.h"
#include "../src/kernels.h"
#include "../src/kernels_outl.h"

#define SENTINEL 12345.0f
#define MAX_TOKENS 7 /* 1..7 tokens: every mix of the 4- and 2-token passes and single ones */
#define MAX_ROWS 70u  /* row_counts below */
#define MAX_COLS 320u /* col_counts below */

#if defined(CB_TEST_BARE_METAL)
/* Every block of one case, each rounded up to 16 bytes: both copies of the weights (the tiled one
 * padded to whole tiles), both copies of the scales (f32 and one per 32 columns at most), and the
 * outliers (ogap and oval; about 1 weight in 32 has one, room is left for 1 in 16). */
#define PAD_ROWS ((MAX_ROWS + 15u) / 16u * 16u)
#define POOL_BYTES                                                                                           \
    (MAX_ROWS * MAX_COLS + PAD_ROWS * MAX_COLS + (MAX_ROWS + PAD_ROWS) * (MAX_COLS / 32u) * 4u +           \
     2u * 2u * (MAX_ROWS * MAX_COLS / 16u + 1u) + 6u * 16u)
#define WEIGHT_SKEW 1u /* the row-major weights' offset from a 16-byte boundary */
#else
#define WEIGHT_SKEW 0u /* malloc's alignment */
#endif
#include "test_io.h"
#include "test_rng.h"

typedef struct pair {
    cb_tensor rows, tiled; /* one matrix in both layouts */
    int8_t *q, *qt;
    uint8_t *s, *st;
    uint16_t *ogap, *oval;
} pair;

static int fail(const char *what, size_t rows, size_t cols, size_t group, size_t r, size_t j, double a, double b)
{
    put_str("FAIL ");
    put_str(what);
    put_str(": ");
    put_size(rows);
    put_str("x");
    put_size(cols);
    put_str(" group ");
    put_size(group);
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

static int make(pair *p, size_t rows, size_t cols, size_t group, int scale_dt, int with_outliers, rng *r)
{
    size_t groups = cols / group, prows = (rows + 15) / 16 * 16, es = scale_dt == CB_F32 ? 4 : 2;
    p->q = take(rows * cols, WEIGHT_SKEW);
    p->qt = take(prows * cols, 0);
    p->s = take(rows * groups * es, 0);
    p->st = take(prows * groups * es, 0);
    if (!p->q || !p->qt || !p->s || !p->st)
        return fail("allocation", rows, cols, group, 0, 0, 0.0, 0.0);
    for (size_t i = 0; i < prows * cols; i++)
        p->qt[i] = (int8_t)(next(r) % 200); /* garbage in the padded rows: must not reach an output */
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < cols; c++) {
            int8_t v = (int8_t)((int)(next(r) % 255) - 127);
            if (next(r) % 64 == 0) /* the extremes; -128 never comes from the exporter, but a blob may hold it */
                v = (int8_t)(next(r) % 3 == 0 ? 127 : next(r) % 2 ? -127 : -128);
            p->q[i * cols + c] = v;
            p->qt[(i / 16) * 16 * cols + (c / 4) * 64 + (i % 16) * 4 + c % 4] = v;
        }
    for (size_t i = 0; i < rows; i++)
        for (size_t g = 0; g < groups; g++) {
            float sc = 0.0005f + (uniform(r) + 1.0f) * 0.02f;
            if (next(r) % 97 == 0) /* near the bottom of the normal range: products go subnormal */
                sc *= 2e-36f;
            size_t a = i * groups + g, b = ((i / 16) * groups + g) * 16 + i % 16;
            if (scale_dt == CB_F32) {
                memcpy(p->s + 4 * a, &sc, 4);
                memcpy(p->st + 4 * b, &sc, 4);
            } else {
                uint16_t h = cb_f32_to_f16(sc);
                memcpy(p->s + 2 * a, &h, 2);
                memcpy(p->st + 2 * b, &h, 2);
            }
        }
    size_t n = 0, total = rows * cols;
    if (with_outliers) { /* how many the loop below draws, from a copy of the generator: exact-size blocks */
        rng dry = *r;
        for (size_t i = 0; i < total; i++)
            if (next(&dry) % 32 == 0) {
                (void)next(&dry);
                n++;
            }
    }
    p->ogap = take((n + 1) * 2, 0);
    p->oval = take((n + 1) * 2, 0);
    if (!p->ogap || !p->oval)
        return fail("allocation", rows, cols, group, 0, 0, (double)n, 0.0);
    if (with_outliers) {
        uint64_t last = 0;
        for (size_t i = 0, k = 0; i < total; i++)
            if (next(r) % 32 == 0) {
                p->ogap[k] = (uint16_t)(k ? i - last : i);
                p->oval[k] = cb_f32_to_f16(uniform(r) * 2.0f);
                last = i;
                k++;
            }
    }
    cb_tensor t = {0};
    t.rows = (uint32_t)rows;
    t.cols = (uint32_t)cols;
    t.row_stride = (uint32_t)cols;
    t.group_size = (uint32_t)group;
    t.n_groups = (uint32_t)groups;
    t.n_outliers = (uint32_t)n;
    t.dtype = with_outliers ? CB_I8C : CB_I8;
    t.scale_dtype = (uint8_t)scale_dt;
    t.q8 = 1;
    t.ogap = n ? p->ogap : NULL;
    t.oval = n ? p->oval : NULL;
    p->rows = t;
    p->rows.data = (const uint8_t *)p->q;
    p->rows.scales = p->s;
    p->tiled = t;
    p->tiled.tiled = 1;
    p->tiled.data = (const uint8_t *)p->qt;
    p->tiled.scales = p->st;
    return 0;
}

static void release(pair *p) /* in the reverse order of make's: the pool takes them back at once */
{
    give_back(p->oval);
    give_back(p->ogap);
    give_back(p->st);
    give_back(p->s);
    give_back(p->qt);
    give_back(p->q);
}

typedef struct acts {
    float x[MAX_TOKENS][MAX_COLS];
    int8_t q[MAX_TOKENS][MAX_COLS];
    float d[MAX_TOKENS][MAX_COLS / 32];
    int32_t s[MAX_TOKENS][MAX_COLS / 32];
    cb_xq xq[MAX_TOKENS];
} acts;

/* FORMAT.md's quantization rule written out once more, element by element: cb_quantize_q8 (vector code on
 * some targets) must give exactly its q, d and s, also for NaN, infinities, -0, subnormals and the extremes. */
static int check_quantizer(rng *r)
{
    static float x[320];
    static int8_t q[320];
    static float d[10];
    static int32_t s[10];
    static const float special[] = {0.0f, -0.0f, 1e-40f, -3e-38f, 0x1p-100f, 0x1p-101f, 3.4e38f, -3.4e38f};
    for (int round = 0; round < 200; round++) {
        for (size_t k = 0; k < 320; k++) {
            float scale = round % 7 == 0 ? 1e-36f : round % 7 == 1 ? 1e30f : 1.0f;
            x[k] = uniform(r) * scale;
            if (next(r) % 40 == 0)
                x[k] = special[next(r) % 8];
            if (round % 5 == 2 && next(r) % 50 == 0)
                x[k] = next(r) % 3 == 0 ? NAN : next(r) % 2 ? INFINITY : -INFINITY;
            if (round % 9 == 4 && k % 32 < 31)
                x[k] = 0.0f; /* blocks of zeros with one value */
        }
        cb_quantize_q8(x, 320, q, d, s);
        for (size_t b = 0; b < 10; b++) {
            float amax = 0.0f;
            for (size_t k = 32 * b; k < 32 * b + 32; k++) {
                float v = x[k] < 0.0f ? -x[k] : x[k];
                amax = v > amax ? v : amax;
            }
            amax = amax >= 0x1p-100f ? amax : 0.0f;
            float id = amax > 0.0f ? 127.0f / amax : 0.0f, dd = amax / 127.0f;
            int32_t sum = 0;
            for (size_t k = 32 * b; k < 32 * b + 32; k++) {
                float f = x[k] * id;
                f = f + (f >= 0.0f ? 0.5f : -0.5f);
                int32_t v = f > -128.0f && f < 128.0f ? (int32_t)f : 0;
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                if (q[k] != v)
                    return fail("quantizer q", 0, 320, 32, k, (size_t)round, q[k], v);
                sum += v;
            }
            if (memcmp(&d[b], &dd, sizeof dd) != 0 || s[b] != sum)
                return fail("quantizer d/s", 0, 320, 32, b, (size_t)round, d[b], dd);
        }
    }
    return 0;
}

static int make_acts(acts *a, size_t n, size_t cols, rng *r)
{
    for (size_t j = 0; j < n; j++) {
        for (size_t c = 0; c < cols; c++) {
            size_t b = c / 32;
            float scale = (b + j) % 5 == 0 ? 1e-30f : (b + j) % 5 == 1 ? 1e4f : 1.0f; /* tiny, huge blocks */
            if ((b + 2 * j) % 11 == 4)
                scale = 3e-38f; /* a block scale d that is subnormal */
            a->x[j][c] = (b + j) % 7 == 3 ? 0.0f : uniform(r) * scale;
        }
        cb_quantize_q8(a->x[j], cols, a->q[j], a->d[j], a->s[j]);
        for (size_t b = 0; b < cols / 32; b++) {
            int32_t sum = 0;
            for (size_t c = 32 * b; c < 32 * b + 32; c++) {
                double err = fabs((double)a->x[j][c] - (double)a->q[j][c] * a->d[j][b]);
                if (a->q[j][c] == -128 || err > a->d[j][b] * 0.5001 + 0x1p-100)
                    return fail("quantize", 0, cols, 32, c, j, a->x[j][c], (double)a->q[j][c] * a->d[j][b]);
                sum += a->q[j][c];
            }
            if (sum != a->s[j][b])
                return fail("block sum", 0, cols, 32, b, j, sum, a->s[j][b]);
        }
        a->xq[j].q = a->q[j];
        a->xq[j].d = a->d[j];
        a->xq[j].s = a->s[j];
    }
    return 0;
}

/* The definition in double: exact block sums, the float steps widened, the corrections times x. */
static double definition(const pair *p, size_t r, const acts *a, size_t j, double *mag)
{
    const cb_tensor *t = &p->rows;
    double acc = 0.0;
    *mag = 0.0;
    for (size_t b = 0; b < t->cols / 32; b++) {
        long isum = 0;
        for (size_t c = 32 * b; c < 32 * b + 32; c++)
            isum += (long)p->q[r * t->cols + c] * a->q[j][c];
        double term = (double)isum * a->d[j][b] * cb_scale(t, r, b * 32 / t->group_size);
        acc += term;
        *mag += fabs(term);
    }
    uint64_t idx = 0;
    for (size_t k = 0; k < t->n_outliers; k++) {
        idx += t->ogap[k];
        if (idx / t->cols == r) {
            double term = (double)cb_f16_to_f32(t->oval[k]) * a->x[j][idx % t->cols];
            acc += term;
            *mag += fabs(term);
        }
    }
    return acc;
}

/* The int8c correction walk against its definition: for corrections at random flat indices of a
 * rows x cols matrix (dense stretches, sparse ones, rows with none), the flat indices decoded here from
 * the gaps; for a start row r0 and nr rows, every (row, token) dot plus its row's corrections in index
 * order must come out of cb_outl_seek + cb_outl_apply (and cb_finish, for one row and token) with the
 * same bits, and the walk must end at the first correction past the rows. */
#define WALK_ROWS 40u
#define WALK_COLS 40u /* a dense row holds more than CB_OUTL_CHUNK */
#define WALK_MAX (WALK_ROWS * WALK_COLS)
static int check_outl_walk(rng *r, size_t *cases)
{
    static uint16_t gap[WALK_MAX], val[WALK_MAX];
    static uint32_t flat[WALK_MAX];
    static float xs[7][WALK_COLS], got[7][CB_TILE_ROWS], want[7][CB_TILE_ROWS];
    for (int round = 0; round < 24; round++) {
        size_t n_out = 0;
        uint32_t last = 0;
        for (uint32_t i = 0; i < WALK_MAX; i++) { /* density by row band: none, 1 in 8, most */
            uint32_t band = (i / WALK_COLS / 5 + (uint32_t)round) % 3, u = next(r) % 8;
            if (band == 0 || (band == 1 && u != 0) || (band == 2 && u == 7))
                continue;
            gap[n_out] = (uint16_t)(n_out ? i - last : i);
            val[n_out] = (uint16_t)(0x3c00u ^ (next(r) & 0x83ffu)); /* +-[1, 2) */
            flat[n_out++] = i;
            last = i;
        }
        cb_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = WALK_ROWS;
        t.cols = WALK_COLS;
        t.n_outliers = (uint32_t)n_out;
        t.ogap = gap;
        t.oval = val;
        for (size_t j = 0; j < 7; j++)
            for (size_t c = 0; c < WALK_COLS; c++)
                xs[j][c] = uniform(r);
        const float *x[7] = {xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6]};
        for (size_t start = 0; start < WALK_ROWS; start += 1 + next(r) % 5) {
            size_t nr = 1 + next(r) % CB_TILE_ROWS, n = 1 + next(r) % 7; /* 1-7 tokens: four at a time and the rest */
            if (start + nr > WALK_ROWS)
                nr = WALK_ROWS - start;
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < nr; i++)
                    got[j][i] = want[j][i] = uniform(r);
            size_t end_k = 0;
            for (size_t k = 0; k < n_out; k++) { /* the definition: every correction, in order */
                size_t row = flat[k] / WALK_COLS, col = flat[k] % WALK_COLS;
                if (row < start + nr)
                    end_k = k + 1;
                if (row >= start && row < start + nr)
                    for (size_t j = 0; j < n; j++)
                        want[j][row - start] += cb_f16_to_f32(val[k]) * xs[j][col];
            }
            cb_outl o = cb_outl_seek(&t, (uint64_t)start * WALK_COLS);
            if (nr == 1 && n == 1) {
                static float y[WALK_ROWS];
                o = cb_finish(&t, o, start, x[0], got[0][0], 1.0f, y, 0);
                got[0][0] = y[start];
            } else {
                o = cb_outl_apply(&t, o, start, nr, n, x, &got[0][0], CB_TILE_ROWS);
            }
            if (o.k != end_k || (end_k < n_out && o.idx != flat[end_k]))
                return fail("outlier walk end", start, WALK_COLS, nr, o.k, n, (double)o.k, (double)end_k);
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < nr; i++)
                    if (memcmp(&got[j][i], &want[j][i], sizeof(float)) != 0)
                        return fail("outlier walk", start, WALK_COLS, nr, start + i, j, got[j][i], want[j][i]);
            ++*cases;
        }
    }
    return 0;
}

/* The decode walk's row of a correction (cb_outl_row: a multiply and shift for matrices narrower than
 * 2^19 columns, a division beyond) against the division, across its whole range: for widths from 1 to
 * past 2^19, at both sides of every row boundary of a decode buffer (CB_DECODE_ROWS rows, where a rounded-up
 * reciprocal would land a row too far) and at random offsets in it. */
static int check_outl_row(uint64_t local, uint64_t cols, uint64_t magic)
{
    const size_t got = cb_outl_row(local, cols, magic);
    if (got == local / cols)
        return 0;
    return fail("correction's row", CB_DECODE_ROWS, (size_t)cols, 0, (size_t)(local / cols), 0, (double)got,
                (double)(local / cols));
}

static int check_outl_rows(rng *r, size_t *cases)
{
    static const uint64_t widths[] = {1, 2, 3, 7, 31, 32, 33, 100, 1000, 4095, 65535, 65536, 99991, 262143,
                                      CB_OUTL_MAGIC_COLS - 1, CB_OUTL_MAGIC_COLS, CB_OUTL_MAGIC_COLS + 1, 1000003};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        const uint64_t cols = widths[w], magic = cb_outl_magic(cols), span = CB_DECODE_ROWS * cols;
        for (uint64_t k = 0; k <= CB_DECODE_ROWS; k++)
            for (int d = -1; d <= 1; d++) {
                const uint64_t local = k * cols + (uint64_t)(int64_t)d;
                if (!(d < 0 && k == 0) && local < span && check_outl_row(local, cols, magic))
                    return 1;
            }
        for (int i = 0; i < 256; i++) {
            const uint64_t hi = next(r), local = (hi << 32 | next(r)) % span;
            if (check_outl_row(local, cols, magic))
                return 1;
        }
        ++*cases;
    }
    return 0;
}

/* cb_tensor.sw_prefetch's values: none, and the x86 decode's two distances (arch/x86/q8.h) in KiB */
static const uint8_t SW_PREFETCH[3] = {0, 1, 8};

#if !defined(CB_TEST_BARE_METAL)
#include "test_tall.h"

/* The decode walk (cb_outl_rows: one token, rows found by a shift and mask, the magic, or a division by the width)
 * against its definition: corrections at random flat indices of a DW_ROWS-row matrix, dense stretches and sparse
 * ones (gaps up to the format's 65535), for widths of each kind, narrow and past CB_OUTL_MAGIC_COLS; from random
 * start rows over random row counts, every row's dot plus its corrections in index order must come out with the
 * same bits, and the walk must end at the first correction past the rows. (Not on the MCUs: the widest x is 2 MiB.) */
#define DW_ROWS 12u
#define DW_MAX 16384u
#define DW_COLS_MAX (CB_OUTL_MAGIC_COLS + 24u)
static int check_decode_walk(rng *r, size_t *cases)
{
    static const uint32_t widths[] = {32, 40, 1024, 1000, CB_OUTL_MAGIC_COLS, DW_COLS_MAX};
    static uint16_t gap[DW_MAX], val[DW_MAX];
    static uint64_t flat[DW_MAX];
    static float x[DW_COLS_MAX], got[DW_ROWS], want[DW_ROWS];
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
        for (int round = 0; round < 8; round++) {
            const uint64_t cols = widths[w], total = DW_ROWS * cols;
            size_t n_out = 0;
            for (uint64_t i = next(r) % 3, last = 0; i < total && n_out < DW_MAX; n_out++) {
                gap[n_out] = (uint16_t)(n_out ? i - last : i);
                val[n_out] = (uint16_t)(0x3c00u ^ (next(r) & 0x83ffu)); /* +-[1, 2) */
                flat[n_out] = last = i;
                /* a stretch of rows dense (steps of 1-3), then sparse (up to a full gap), by row band */
                i += (i / cols + (uint64_t)round) % 3 ? 1 + next(r) % 3 : 1 + next(r) % 65535u;
            }
            cb_tensor t;
            memset(&t, 0, sizeof t);
            t.rows = DW_ROWS;
            t.cols = (uint32_t)cols;
            t.n_outliers = (uint32_t)n_out;
            t.ogap = gap;
            t.oval = val;
            for (size_t c = 0; c < cols; c++)
                x[c] = uniform(r);
            for (size_t start = 0; start < DW_ROWS; start += 1 + next(r) % 4) {
                size_t nr = 1 + next(r) % DW_ROWS, end_k = 0;
                if (start + nr > DW_ROWS)
                    nr = DW_ROWS - start;
                for (size_t i = 0; i < nr; i++)
                    got[i] = want[i] = uniform(r);
                for (size_t k = 0; k < n_out; k++) { /* the definition: every correction, in order */
                    const uint64_t row = flat[k] / cols;
                    if (row < start + nr)
                        end_k = k + 1;
                    if (row >= start && row < start + nr)
                        want[row - start] += cb_f16_to_f32(val[k]) * x[flat[k] % cols];
                }
                cb_outl o = cb_outl_rows(&t, cb_outl_seek(&t, (uint64_t)start * cols), start, nr, x, got);
                if (o.k != end_k || (end_k < n_out && o.idx != flat[end_k]))
                    return fail("decode walk end", start, (size_t)cols, nr, o.k, 0, (double)o.k, (double)end_k);
                for (size_t i = 0; i < nr; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        return fail("decode walk", start, (size_t)cols, nr, start + i, 0, got[i], want[i]);
                ++*cases;
            }
        }
    return 0;
}

/* One token (decode) over a matrix taller than a decode buffer (kernels_q8.c: CB_DECODE_ROWS rows of sums, then
 * their corrections, then their stores): the ISA path over all rows and split on a tile boundary that is not
 * a buffer's equals the scalar kernel bit for bit, and writes no row past the range. (Not on the MCUs: their
 * paths have no decode buffer, and the matrix is larger than their pool.) */
static int check_tall_decode(rng *r, size_t *cases)
{
    static acts a;
    for (int k = 0; k < 6; k++) { /* accumulate, and the tiles' software prefetch: none, 1 KiB, 8 KiB ahead */
        const int accumulate = k & 1;
        pair p;
        size_t row;
        float got, want;
        if (make(&p, TALL_ROWS, 64, 32, CB_F16, 1, r) || make_acts(&a, 1, 64, r))
            return 1;
        p.tiled.sw_prefetch = SW_PREFETCH[k >> 1];
        int v = tall_decode(cb_matmul_q8_scalar, &p.rows, &p.tiled, a.xq, a.x[0], accumulate, &row, &got, &want);
        if (v)
            return fail(tall_what[v], TALL_ROWS, 64, 32, row, 0, got, want);
        release(&p);
        ++*cases;
    }
    return 0;
}
#endif

int main(void)
{
    static const size_t row_counts[] = {1, 5, 15, 16, 17, 31, 32, 48, 70};
    static const size_t col_counts[] = {32, 64, 96, 160, 320};
    rng r = {0x9E3779B97F4A7C15ull};
    static acts a;
    size_t cases = 0, outputs = 0;
    if (check_quantizer(&r) || check_outl_walk(&r, &cases) || check_outl_rows(&r, &cases))
        return 1;
#if !defined(CB_TEST_BARE_METAL)
    if (check_decode_walk(&r, &cases) || check_tall_decode(&r, &cases))
        return 1;
#endif
    for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof *col_counts; ci++)
            for (int variant = 0; variant < 6; variant++) {
                size_t rows = row_counts[ri], cols = col_counts[ci];
                size_t group = variant % 3 == 0 ? cols : variant % 3 == 1 ? 32 : (cols % 64 == 0 ? 64 : cols);
                int scale_dt = variant < 3 ? CB_F16 : CB_F32, outl = variant % 2;
                size_t n = 1 + (size_t)(next(&r) % MAX_TOKENS);
                pair p;
                if (make(&p, rows, cols, group, scale_dt, outl, &r) || make_acts(&a, n, cols, &r))
                    return 1;
                p.tiled.sw_prefetch = SW_PREFETCH[next(&r) % 3]; /* any way the same bits */
                float alpha[MAX_TOKENS];
                static float yv[6][MAX_TOKENS][80]; /* static: 7.5 KiB is more than a firmware stack */
                const float *x[MAX_TOKENS];
                float *y[6][MAX_TOKENS];
                for (size_t j = 0; j < n; j++) {
                    alpha[j] = 0.5f + (uniform(&r) + 1.0f);
                    x[j] = a.x[j];
                }
                int accumulate = (int)(next(&r) % 2);
                for (int v = 0; v < 6; v++)
                    for (size_t j = 0; j < n; j++) {
                        y[v][j] = yv[v][j];
                        for (size_t i = 0; i < 80; i++)
                            yv[v][j][i] = i < rows ? (float)(i % 7) - 3.0f : SENTINEL;
                    }
                /* 0: scalar rows, 1: scalar tiled, 2: ISA rows, 3: ISA tiled, 4: ISA tiled split on a tile
                 * boundary, 5: ISA tiled one token at a time */
                cb_matmul_q8_scalar(&p.rows, 0, rows, n, a.xq, x, y[0], alpha, accumulate);
                cb_matmul_q8_scalar(&p.tiled, 0, rows, n, a.xq, x, y[1], alpha, accumulate);
                cb_matmul_q8(&p.rows, 0, rows, n, a.xq, x, y[2], alpha, accumulate);
                cb_matmul_q8(&p.tiled, 0, rows, n, a.xq, x, y[3], alpha, accumulate);
                size_t mid = rows > 16 ? 16 : rows;
                cb_matmul_q8(&p.tiled, 0, mid, n, a.xq, x, y[4], alpha, accumulate);
                cb_matmul_q8(&p.tiled, mid, rows, n, a.xq, x, y[4], alpha, accumulate);
                for (size_t j = 0; j < n; j++)
                    cb_matmul_q8(&p.tiled, 0, rows, 1, &a.xq[j], &x[j], &y[5][j], &alpha[j], accumulate);
                static const char *const what[6] = {"", "scalar tiled vs rows", "isa rows", "isa tiled",
                                                    "isa tiled split", "isa tiled per token"};
                for (size_t j = 0; j < n; j++)
                    for (size_t i = 0; i < 80; i++) {
                        for (int v = 1; v < 6; v++)
                            if (memcmp(&yv[v][j][i], &yv[0][j][i], sizeof(float)) != 0)
                                return fail(what[v], rows, cols, group, i, j, yv[v][j][i], yv[0][j][i]);
                        if (i >= rows) {
                            if (yv[0][j][i] != SENTINEL)
                                return fail("write beyond rows", rows, cols, group, i, j, yv[0][j][i], SENTINEL);
                            continue;
                        }
                        double before = accumulate ? (double)((float)(i % 7) - 3.0f) : 0.0;
                        double mag, want = before + alpha[j] * definition(&p, i, &a, j, &mag), got = yv[0][j][i];
                        if (!(fabs(got - want) <= 1e-5 * (alpha[j] * mag + fabs(before)) + 1e-37))
                            return fail("definition", rows, cols, group, i, j, got, want);
                        outputs++;
                    }
                cases++;
                release(&p);
            }
    put_str("kernels_q8_test ");
    put_str(cb_kernels_q8_isa());
    put_str(": ");
    put_size(cases);
    put_str(" cases, ");
    put_size(outputs);
    put_str(" outputs, software prefetch ");
    if (cb_q8_sw_prefetch()) {
        put_size(cb_q8_sw_prefetch());
        put_str(" KiB");
    } else
        put_str("off");
    put_str("\n");
    return 0;
}
