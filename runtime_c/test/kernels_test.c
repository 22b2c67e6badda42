/*
 * kernels_test.c - every SIMD kernel against its scalar twin, on the target.
 *
 * Built from kernels.c and cbmath.c with the target's own flags (and once
 * more with -DCOLIBRI_SCALAR, where both sides are the scalar code), run
 * natively or under QEMU by tests/test_kernels.py. For random matrices of
 * every weight type (f32, f16, int8 with f32 or f16 scales, int8c with
 * outliers), row counts around the 4-row blocks, column counts and group
 * sizes that are and are not multiples of the vector width:
 *   |simd - scalar| <= 1e-5 * (sum_c |w_c x_c| + |y_before|)   per output,
 * and, with a one-hot x (every product exact), bit-equal outputs, which
 * pins the f16 and int8 conversions (subnormal, largest, signed-zero f16).
 * x is followed by NaNs and y by sentinels: a kernel that reads x beyond
 * cols or writes y beyond rows fails. cb_matmul (several tokens, a split row range) must
 * equal cb_matvec per token bit for bit, as must cb_matmul_scalar cb_matvec_scalar. Built with -fsanitize=address the
 * buffers are exact-size heap blocks instead, so an over-read traps. cb_exp_shift and cb_silu_mul must
 * equal cb_expf element by element, bit for bit; cb_dot, and the attention's cb_scores, cb_weighted_rows
 * and cb_softmax, must equal their rules written out in plain loops, bit for bit.
 *
 * Prints "kernels_test <isa>: <cases> cases, <outputs> outputs, max rel err <e>"
 * and exits 1 on the first failure. `kernels_test quick` runs the matrices of 1 and 5 rows only.
 *
 * Built with -DCB_TEST_BARE_METAL (tests/test_firmware_kernels.py) it is a firmware image's main,
 * booted under the target's QEMU as kernels_q8_test.c is: no heap (every block of a case comes
 * from a static pool, the weights starting only as far past a 16-byte boundary as their type
 * allows: 4 bytes for f32, 2 for f16, 1 for int8; QEMU does not fault on a misaligned MVE load,
 * so this checks the values read there, not the alignment rule), output through board.h's
 * semihosting console (values as f32 bits, the max rel err in units of 1e-9: no float formatting
 * on the board), and columns up to 257 and a shorter exp sweep, so that the pool and the static
 * arrays fit the 128 KiB DTCM of stm32h7.
 */
#include <math.h>
#include <string.h>

#include "../src/cbmath.h"
#include "../src/kernels.h"

#if defined(CB_TEST_BARE_METAL)
#define EXP_N 1027
#define POOL_BYTES 65536u
#else
#define EXP_N 4099
#endif
#include "test_io.h"

#if defined(__SANITIZE_ADDRESS__)
#define EXACT_BUFFERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXACT_BUFFERS 1
#endif
#endif
#ifndef EXACT_BUFFERS
#define EXACT_BUFFERS 0
#endif

#define SLACK 64 /* NaN floats after x, sentinels after y */
#define SENTINEL 12345.0f

#include "test_rng.h"

typedef struct matrix {
    cb_tensor t;
    uint8_t *data, *scales;
    uint16_t *ogap, *oval;
} matrix;

enum { KIND_F32, KIND_F16, KIND_I8_F32S, KIND_I8_F16S, KIND_I8C, N_KINDS };
static const char *const kind_name[N_KINDS] = {"f32", "f16", "int8/f32 scales", "int8/f16 scales", "int8c"};

/* The special f16 values the conversions must get right. */
static const uint16_t f16_special[] = {0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x8000, 0x0000, 0x3c00};

/* Returns 0 when a block could not be had. */
static int fill(matrix *m, int kind, size_t rows, size_t cols, size_t group, rng *r)
{
    static const uint8_t dtype[N_KINDS] = {CB_F32, CB_F16, CB_I8, CB_I8, CB_I8C};
    size_t elem = kind == KIND_F32 ? 4 : kind == KIND_F16 ? 2 : 1;
    size_t stride = (cols * elem + 15) / 16 * 16;
    cb_tensor *t = &m->t;
    memset(t, 0, sizeof *t);
    t->rows = (uint32_t)rows;
    t->cols = (uint32_t)cols;
    t->row_stride = (uint32_t)stride;
    t->dtype = dtype[kind];
    m->data = take(rows * stride, elem);
    m->scales = NULL;
    m->ogap = m->oval = NULL;
    if (!m->data)
        return 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < cols; c++) {
            uint8_t *p = m->data + i * stride + c * elem;
            float v = uniform(r) * (next(r) % 16 == 0 ? 50.0f : 1.0f); /* some large weights */
            if (kind == KIND_F32) {
                memcpy(p, &v, 4);
            } else if (kind == KIND_F16) {
                uint16_t h = next(r) % 8 == 0 ? f16_special[next(r) % (sizeof f16_special / 2)] : cb_f32_to_f16(v);
                memcpy(p, &h, 2);
            } else {
                int8_t q = (int8_t)((int)(next(r) % 255) - 127);
                memcpy(p, &q, 1);
            }
        }
    if (kind >= KIND_I8_F32S) {
        t->group_size = (uint32_t)group;
        t->n_groups = (uint32_t)((cols + group - 1) / group);
        t->scale_dtype = kind == KIND_I8_F32S ? CB_F32 : CB_F16;
        size_t n = rows * t->n_groups;
        m->scales = take(n * 4, 0);
        if (!m->scales)
            return 0;
        for (size_t i = 0; i < n; i++) {
            float s = (0.001f + (uniform(r) + 1.0f) * 0.01f);
            if (t->scale_dtype == CB_F32) {
                memcpy(m->scales + 4 * i, &s, 4);
            } else {
                uint16_t h = cb_f32_to_f16(s);
                memcpy(m->scales + 2 * i, &h, 2);
            }
        }
        t->scales = m->scales;
    }
    if (kind == KIND_I8C) {
        size_t total = rows * cols, n = 0;
        m->ogap = take((total + 1) * 2, 0);
        m->oval = take((total + 1) * 2, 0);
        if (!m->ogap || !m->oval)
            return 0;
        uint64_t last = 0;
        for (size_t i = 0; i < total; i++) /* ~3% outliers, the first one possibly at index 0 */
            if (next(r) % 32 == 0) {
                m->ogap[n] = (uint16_t)(n ? i - last : i);
                m->oval[n] = cb_f32_to_f16(uniform(r) * 4.0f);
                last = i;
                n++;
            }
        t->n_outliers = (uint32_t)n;
        t->ogap = m->ogap;
        t->oval = m->oval;
    }
    t->data = m->data;
    return 1;
}

static void release(matrix *m) /* in the reverse order of fill's: the pool takes them back at once */
{
    give_back(m->oval);
    give_back(m->ogap);
    give_back(m->scales);
    give_back(m->data);
}

/* sum_c |W[r][c] x[c]| with the outliers as separate terms, in double */
static double magnitude(const cb_tensor *t, size_t r, const float *x)
{
    double s = 0.0;
    for (size_t c = 0; c < t->cols; c++) {
        const uint8_t *row = t->data + r * t->row_stride;
        double w;
        if (t->dtype == CB_F32) {
            float f;
            memcpy(&f, row + 4 * c, 4);
            w = f;
        } else if (t->dtype == CB_F16) {
            uint16_t h;
            memcpy(&h, row + 2 * c, 2);
            w = cb_f16_to_f32(h);
        } else {
            size_t i = r * t->n_groups + c / t->group_size;
            uint16_t h;
            float f;
            if (t->scale_dtype == CB_F32)
                memcpy(&f, t->scales + 4 * i, 4);
            else {
                memcpy(&h, t->scales + 2 * i, 2);
                f = cb_f16_to_f32(h);
            }
            w = (double)f * (double)(int8_t)row[c];
        }
        s += fabs(w * x[c]);
    }
    uint64_t idx = 0;
    for (size_t k = 0; k < t->n_outliers; k++) {
        idx += t->ogap[k];
        if (idx / t->cols == r)
            s += fabs((double)cb_f16_to_f32(t->oval[k]) * x[idx % t->cols]);
    }
    return s;
}

/* cb_matmul over n tokens and a row range split in two against n cb_matvec calls (and the scalar
 * pair alike): bit-equal, whatever n and the split; y beyond rows untouched. Returns 0 when equal. */
static int check_matmul(const cb_tensor *t, rng *r)
{
    enum { MAX_N = 5 };
    size_t n = 1 + next(r) % MAX_N, rows = t->rows, cols = t->cols, split = next(r) % (rows + 1);
    size_t xs = EXACT_BUFFERS ? cols : cols + SLACK, ys = EXACT_BUFFERS ? rows : rows + SLACK;
    float *x[MAX_N], *y[4][MAX_N], alpha[MAX_N];
    int accumulate = next(r) % 2, bad = 0;
    for (size_t j = 0; j < n; j++) {
        x[j] = take(xs * sizeof(float), 0);
        for (int v = 0; v < 4; v++)
            y[v][j] = take(ys * sizeof(float), 0);
        if (!x[j] || !y[0][j] || !y[1][j] || !y[2][j] || !y[3][j]) {
            put_str("FAIL matmul: out of memory\n");
            return 1;
        }
        for (size_t c = 0; c < xs; c++)
            x[j][c] = c >= cols ? NAN : uniform(r) * 3.0f;
        alpha[j] = uniform(r) * 2.0f;
        for (size_t i = 0; i < ys; i++)
            y[0][j][i] = y[1][j][i] = y[2][j][i] = y[3][j][i] = i < rows ? uniform(r) : SENTINEL;
    }
    const float *const *xc = (const float *const *)x;
    cb_matmul(t, 0, split, n, xc, y[0], alpha, accumulate);
    cb_matmul(t, split, rows, n, xc, y[0], alpha, accumulate);
    cb_matmul_scalar(t, 0, split, n, xc, y[2], alpha, accumulate);
    cb_matmul_scalar(t, split, rows, n, xc, y[2], alpha, accumulate);
    for (size_t j = 0; j < n; j++) {
        cb_matvec(t, x[j], y[1][j], alpha[j], accumulate);
        cb_matvec_scalar(t, x[j], y[3][j], alpha[j], accumulate);
        if (memcmp(y[0][j], y[1][j], ys * sizeof(float)) || memcmp(y[2][j], y[3][j], ys * sizeof(float)))
            bad = 1;
    }
    if (bad) {
        put_str("FAIL matmul rows=");
        put_size(rows);
        put_str(" cols=");
        put_size(cols);
        put_str(" n=");
        put_size(n);
        put_str(" split=");
        put_size(split);
        put_str(": differs from cb_matvec\n");
    }
    for (size_t j = n; j-- > 0;) { /* the reverse order of taking them */
        for (int v = 4; v-- > 0;)
            give_back(y[v][j]);
        give_back(x[j]);
    }
    return bad;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

#define NO_INDEX ((size_t)-1)

/* prints "FAIL <what> <a> [<b>]: <got> vs <want>" (b left out when it is NO_INDEX); returns 1 */
static int fail_bits(const char *what, size_t a, size_t b, float got, float want)
{
    put_str("FAIL ");
    put_str(what);
    put_str(" ");
    put_size(a);
    if (b != NO_INDEX) {
        put_str(" ");
        put_size(b);
    }
    put_str(": ");
    put_exact(got);
    put_str(" vs ");
    put_exact(want);
    put_str("\n");
    return 1;
}

/* cb_dot (vector code where the target has it) against its rule written out: element i into sum i % 8,
 * the sums combined ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)), bit for bit. */
static int check_dot(void)
{
    static float a[263], b[263];
    rng r = {777};
    for (size_t i = 0; i < 263; i++) {
        a[i] = uniform(&r) * (i % 5 == 0 ? 1e6f : 1.0f);
        b[i] = uniform(&r);
    }
    for (size_t n = 0; n <= 263; n++) {
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (size_t i = 0; i < n; i++)
            s[i % 8] = s[i % 8] + a[i] * b[i];
        float want = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])), got = cb_dot(a, b, n);
        if (memcmp(&got, &want, sizeof got) != 0)
            return fail_bits("cb_dot n", n, NO_INDEX, got, want);
    }
    return 0;
}

/* cb_exp_shift and cb_silu_mul (vector code where the target has it) against cb_expf element by element,
 * bit for bit, over a sweep of inputs with the special ones: NaN, infinities, the clamp edges, subnormals. */
static int check_exp(void)
{
    static float v[EXP_N], g[EXP_N], u[EXP_N], want[EXP_N], wg[EXP_N];
    static const float special[] = {0.0f, -0.0f, 88.72283935546875f, 88.7228394f, -103.972084045410156f,
                                    -103.97209f, 1e-40f, -1e-40f, 200.0f, -200.0f, 0.5f, -0.5f};
    const size_t n = sizeof v / sizeof *v;
    rng r = {12345};
    for (size_t i = 0; i < n; i++) {
        v[i] = i < 12 ? special[i] : i == 12 ? NAN : i == 13 ? INFINITY : i == 14 ? -INFINITY
                                                 : uniform(&r) * (i % 3 == 0 ? 120.0f : 12.0f);
        g[i] = v[i];
        u[i] = uniform(&r);
        want[i] = cb_expf(v[i] - 1.5f);
        wg[i] = g[i] / (1.0f + cb_expf(-g[i])) * u[i];
    }
    cb_exp_shift(v, n, 1.5f);
    cb_silu_mul(g, u, n);
    for (size_t i = 0; i < n; i++)
        if ((memcmp(&v[i], &want[i], 4) && !(isnan(v[i]) && isnan(want[i])))
            || (memcmp(&g[i], &wg[i], 4) && !(isnan(g[i]) && isnan(wg[i])))) {
            put_str("FAIL exp/silu at ");
            put_size(i);
            put_str(": ");
            put_exact(v[i]);
            put_str(" vs ");
            put_exact(want[i]);
            put_str(", ");
            put_exact(g[i]);
            put_str(" vs ");
            put_exact(wg[i]);
            put_str("\n");
            return 1;
        }
    return 0;
}

/* The attention's loops (vector code where the target has it) against their rules written out, bit for
 * bit: cb_scores as cb_dot's rule times the scale, position by position; cb_weighted_rows as one multiply
 * and add per position, in order, never writing past len; cb_softmax as the first largest value (NaNs
 * skipped unless the first is one), cb_expf, cb_dot's eight partial sums and a division. */
static int check_attention(void)
{
    enum { T = 41, HD = 72, STRIDE = 80 };
    static float q[HD], keys[T * STRIDE], w[T], got[HD + 1], v[T], want[T]; /* HD > T */
    rng r = {4242};
    for (size_t i = 0; i < HD; i++)
        q[i] = uniform(&r);
    for (size_t i = 0; i < T * STRIDE; i++)
        keys[i] = uniform(&r) * (i % 7 == 0 ? 100.0f : 1.0f);
    for (size_t t = 0; t < T; t++)
        w[t] = uniform(&r);
    for (size_t hd = 1; hd <= HD; hd += hd < 16 ? 1 : 8)
        for (size_t n = 0; n <= T; n++) {
            const float scale = 1.0f / (float)hd;
            got[n] = SENTINEL;
            cb_scores(got, q, keys + 3, STRIDE, n, hd, scale);
            for (size_t t = 0; t <= n; t++) {
                float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                for (size_t i = 0; i < hd && t < n; i++)
                    s[i % 8] = s[i % 8] + q[i] * keys[3 + t * STRIDE + i];
                float dot = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
                float expect = t == n ? SENTINEL : dot * scale;
                if (!same_bits(got[t], expect))
                    return fail_bits("cb_scores hd n", hd, n, got[t], expect);
            }
        }
    for (size_t len = 0; len <= HD; len++)
        for (size_t n = 0; n <= T; n += n < 10 ? 1 : 31) {
            got[len] = SENTINEL;
            cb_weighted_rows(got, w, keys + 5, STRIDE, n, len);
            for (size_t i = 0; i <= len; i++) {
                float acc = 0.0f;
                for (size_t t = 0; t < n; t++)
                    acc = acc + w[t] * keys[5 + t * STRIDE + i];
                float expect = i == len ? SENTINEL : acc;
                if (!same_bits(got[i], expect))
                    return fail_bits("cb_weighted_rows len n", len, n, got[i], expect);
            }
        }
    for (size_t kind = 0; kind < 4; kind++)
        for (size_t n = 1; n <= T; n++) {
            for (size_t i = 0; i < n; i++) { /* 1: zeros of both signs, -inf; 2: a NaN inside; 3: NaN first */
                v[i] = kind == 1 && i % 3 ? (i % 2 ? 0.0f : -0.0f) : uniform(&r) * 30.0f;
                if (kind == 1 && i % 5 == 4)
                    v[i] = -INFINITY;
            }
            if (kind == 2)
                v[n / 2] = NAN;
            if (kind == 3)
                v[0] = NAN;
            float max = v[0], part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (size_t i = 1; i < n; i++)
                if (v[i] > max)
                    max = v[i];
            for (size_t i = 0; i < n; i++) {
                want[i] = cb_expf(v[i] - max);
                part[i % 8] = part[i % 8] + want[i];
            }
            float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
            for (size_t i = 0; i < n; i++)
                want[i] = want[i] / sum;
            cb_softmax(v, n);
            for (size_t i = 0; i < n; i++)
                if (!same_bits(v[i], want[i]))
                    return fail_bits("cb_softmax kind n", kind, n, v[i], want[i]);
        }
    return 0;
}

/* cb_f16_to_f32 (the hardware conversion where the target has one) against the definition for all 65536
 * halves: (-1)^s 2^(e-15) (1 + m/1024), subnormals 2^-14 m/1024, infinities, and NaN (sign kept). */
/* The attention over the 16- and 8-bit KV caches (vector code where the target has it) against the rules
 * written out, bit for bit: cb_scores_f16/_i8 as cb_dot's eight partial sums over the converted keys (times
 * the position's key scale for int8) times the scale; cb_weighted_rows_f16/_i8 as one multiply and add per
 * position, in order, never writing past len. f16 keys include subnormals, the largest finite and both
 * zeros; int8 the whole range. A short case list: the lengths around the vector widths (8, 16, 32). */
static int check_attention_kv(void)
{
    enum { T = 19, HD = 40, STRIDE = 44, SSTRIDE = 3 };
    static const size_t hds[] = {1, 7, 8, 16, 40}, lens[] = {0, 1, 8, 15, 16, 17, 31, 32, 33, 40};
    static uint16_t k16[T * STRIDE];
    static int8_t k8[T * STRIDE];
    static float q[HD], w[T], ks[T * SSTRIDE], got[HD + 1];
    static const uint16_t special[] = {0x0001u, 0x03ffu, 0x8001u, 0x7bffu, 0xfbffu, 0x0000u, 0x8000u};
    rng r = {777};
    for (size_t i = 0; i < HD; i++)
        q[i] = uniform(&r);
    for (size_t i = 0; i < T * STRIDE; i++) {
        k16[i] = i % 11 == 0 ? special[i / 11 % 7] : cb_f32_to_f16(uniform(&r) * 4.0f);
        k8[i] = (int8_t)((int)(next(&r) % 255u) - 127);
    }
    for (size_t t = 0; t < T; t++)
        w[t] = uniform(&r);
    for (size_t i = 0; i < T * SSTRIDE; i++)
        ks[i] = uniform(&r) * 0.05f;
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
        for (size_t n = 0; n <= T; n++)
            for (int i8 = 0; i8 < 2; i8++) {
                const size_t hd = hds[hi];
                const float scale = 1.0f / (float)hd;
                got[n] = SENTINEL;
                if (i8)
                    cb_scores_i8(got, q, k8 + 3, STRIDE, ks + 1, SSTRIDE, n, hd, scale);
                else
                    cb_scores_f16(got, q, k16 + 3, STRIDE, n, hd, scale);
                for (size_t t = 0; t <= n; t++) {
                    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                    for (size_t i = 0; i < hd && t < n; i++) {
                        size_t at = 3 + t * STRIDE + i;
                        s[i % 8] = s[i % 8] + q[i] * (i8 ? (float)k8[at] : cb_f16_to_f32(k16[at]));
                    }
                    float dot = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
                    float expect = t == n ? SENTINEL : i8 ? (dot * ks[1 + t * SSTRIDE]) * scale : dot * scale;
                    if (!same_bits(got[t], expect))
                        return fail_bits(i8 ? "cb_scores_i8 hd n" : "cb_scores_f16 hd n", hd, n, got[t], expect);
                }
            }
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t n = 0; n <= T; n += n < 5 ? 1 : 7)
            for (int i8 = 0; i8 < 2; i8++) {
                const size_t len = lens[li];
                got[len] = SENTINEL;
                if (i8)
                    cb_weighted_rows_i8(got, w, k8 + 1, STRIDE, n, len);
                else
                    cb_weighted_rows_f16(got, w, k16 + 1, STRIDE, n, len);
                for (size_t i = 0; i <= len; i++) {
                    float acc = 0.0f;
                    for (size_t t = 0; t < n; t++) {
                        size_t at = 1 + t * STRIDE + i;
                        acc = acc + w[t] * (i8 ? (float)k8[at] : cb_f16_to_f32(k16[at]));
                    }
                    float expect = i == len ? SENTINEL : acc;
                    if (!same_bits(got[i], expect))
                        return fail_bits(i8 ? "cb_weighted_rows_i8 len n" : "cb_weighted_rows_f16 len n", len, n,
                                         got[i], expect);
                }
            }
    return 0;
}

static int check_f16(void)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, pow_bits = (e ? e : 1u) + 127u - 25u;
        float pow2, want, got = cb_f16_to_f32((uint16_t)h);
        memcpy(&pow2, &(uint32_t){pow_bits << 23}, sizeof pow2); /* 2^(e - 25), exact */
        want = e == 0x1fu ? (m ? NAN : INFINITY) : (float)(e ? m | 0x400u : m) * pow2;
        want = h & 0x8000u ? -want : want;
        if (!same_bits(got, want) || signbit(got) != signbit(want))
            return fail_bits("cb_f16_to_f32 of half", h, NO_INDEX, got, want);
    }
    return 0;
}

#if defined(CB_TEST_BARE_METAL)
int main(void)
{
    const int quick = 0;
#else
int main(int argc, char **argv)
{
    /* `kernels_test quick`: the matrices of 1 and 5 rows only (a row alone, a 4-row block and one more),
     * every column count, group and weight type, and every other check: for runs that vary what the
     * columns split into (tests/test_kernels.py's RVV vector lengths beyond the first), not the rows */
    const int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
#endif
    static const size_t rows_list[] = {1, 3, 4, 5, 8, 9, 13};
#if defined(CB_TEST_BARE_METAL)
    static const size_t cols_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 64, 65, 100, 255, 256, 257};
#else
    static const size_t cols_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 64, 65, 100, 255, 256, 257, 1000};
#endif
    static const size_t group_list[] = {0, 1, 3, 7, 8, 16, 17, 32, 64}; /* 0: one group per row */
    rng r = {0x9e3779b97f4a7c15ull};
    size_t cases = 0, outputs = 0;
    double worst = 0.0;
    if (check_f16() || check_exp() || check_dot() || check_attention() || check_attention_kv())
        return 1;
    for (int kind = 0; kind < N_KINDS; kind++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
                for (size_t gi = 0; gi < (kind >= KIND_I8_F32S ? sizeof group_list / sizeof *group_list : 1); gi++)
                    for (int onehot = 0; onehot < 2; onehot++) {
                        size_t rows = rows_list[ri], cols = cols_list[ci];
                        if (quick && rows != 1 && rows != 5)
                            continue;
                        size_t group = group_list[gi] && group_list[gi] < cols ? group_list[gi] : cols;
                        if (gi && group == cols)
                            continue; /* the per-row case, done at gi = 0 */
                        matrix m;
                        size_t xs = EXACT_BUFFERS ? cols : cols + SLACK, ys = EXACT_BUFFERS ? rows : rows + SLACK;
                        int have = fill(&m, kind, rows, cols, group, &r);
                        float *x = take(xs * sizeof *x, 0), *y0 = take(ys * sizeof *y0, 0);
                        float *ya = take(ys * sizeof *ya, 0), *yb = take(ys * sizeof *yb, 0);
                        if (!have || !x || !y0 || !ya || !yb) {
                            put_str("FAIL out of memory\n");
                            return 1;
                        }
                        size_t hot = next(&r) % cols;
                        for (size_t c = 0; c < xs; c++)
                            x[c] = c >= cols ? NAN : onehot ? (c == hot ? 1.0f : 0.0f) : uniform(&r) * 3.0f;
                        for (size_t i = 0; i < ys; i++)
                            y0[i] = i < rows ? uniform(&r) : SENTINEL;
                        int accumulate = !onehot && next(&r) % 2;
                        float alpha = onehot ? 1.0f : uniform(&r) * 2.0f;
                        memcpy(ya, y0, ys * sizeof *ya);
                        memcpy(yb, y0, ys * sizeof *yb);
                        cb_matvec(&m.t, x, ya, alpha, accumulate);
                        cb_matvec_scalar(&m.t, x, yb, alpha, accumulate);
                        for (size_t i = 0; i < ys; i++) {
                            double bound = 0.0, err = fabs((double)ya[i] - (double)yb[i]);
                            int ok;
                            if (i >= rows) {
                                ok = ya[i] == SENTINEL;
                            } else if (onehot) {
                                ok = ya[i] == yb[i];
                            } else {
                                double mag = fabs(alpha) * magnitude(&m.t, i, x) + (accumulate ? fabs(y0[i]) : 0.0);
                                bound = 1e-5 * mag + 1e-30;
                                ok = err <= bound && !isnan(ya[i]);
                                if (mag > 0.0 && err / mag > worst)
                                    worst = err / mag;
                            }
                            if (!ok) {
                                put_str("FAIL ");
                                put_str(kind_name[kind]);
                                put_str(" rows=");
                                put_size(rows);
                                put_str(" cols=");
                                put_size(cols);
                                put_str(" group=");
                                put_size(group);
                                put_str(onehot ? " onehot=1 row " : " onehot=0 row ");
                                put_size(i);
                                put_str(": simd ");
                                put_real(ya[i]);
                                put_str(" scalar ");
                                put_real(yb[i]);
                                put_str(" (bound ");
                                put_small(bound);
                                put_str(")\n");
                                return 1;
                            }
                        }
                        if (check_matmul(&m.t, &r))
                            return 1;
                        outputs += rows;
                        cases++;
                        give_back(yb);
                        give_back(ya);
                        give_back(y0);
                        give_back(x);
                        release(&m);
                    }
    put_str("kernels_test ");
    put_str(cb_kernels_isa());
    put_str(": ");
    put_size(cases);
    put_str(" cases, ");
    put_size(outputs);
    put_str(" outputs, max rel err ");
    put_small(worst);
    put_str("\n");
    return 0;
}
