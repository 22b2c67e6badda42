/* sample.c - the sampler and the streaming UTF-8 assembler: see colibri_sample.h,
 * which specifies every step; this file follows it line by line. */
#include "colibri_sample.h"

#include <float.h>
#include <string.h>

#include "cbmath.h"

COLIBRI_API colibri_sample_params colibri_sample_defaults(void)
{
    colibri_sample_params p = {0.0f, 0u, 1.0f, 0.0f, 1.0f, 0u, NULL, 0u};
    return p;
}

static uint64_t splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static int finite(float x)
{
    return x == x && x <= FLT_MAX && x >= -FLT_MAX;
}

COLIBRI_API colibri_status colibri_sample_init(colibri_sampler *s, const colibri_sample_params *p)
{
    if (!s || !p || (p->n_stop && !p->stop_ids))
        return COLIBRI_E_NULL;
    if (!finite(p->temperature) || p->temperature < 0.0f || !(p->top_p >= 0.0f && p->top_p <= 1.0f)
        || !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !finite(p->repeat_penalty) || !(p->repeat_penalty > 0.0f))
        return COLIBRI_E_ARG;
    s->params = *p;
    s->state = splitmix64(p->seed);
    if (s->state == 0)
        s->state = 1;
    return COLIBRI_OK;
}

COLIBRI_API uint64_t colibri_sample_rand(colibri_sampler *s)
{
    uint64_t x = s->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->state = x;
    return x * 0x2545F4914F6CDD1Du;
}

COLIBRI_API int colibri_sample_is_stop(const colibri_sampler *s, int32_t id)
{
    if (!s)
        return 0;
    for (size_t i = 0; i < s->params.n_stop; i++)
        if (s->params.stop_ids[i] == id)
            return 1;
    return 0;
}

/* a ranks before b: larger w, then the lower id */
static int better(const float *w, uint32_t a, uint32_t b)
{
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

/* heap of n ids whose root is the one ranked last */
static void sift_down(const float *w, uint32_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && better(w, h[c], h[c + 1]))
            c++;
        if (!better(w, h[i], h[c]))
            return;
        uint32_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* rank[0..k) = the k first ids of the rank order, in that order */
static void top_k(const float *w, size_t vocab, uint32_t *rank, size_t k)
{
    for (size_t i = 0; i < k; i++)
        rank[i] = (uint32_t)i;
    for (size_t i = k / 2; i-- > 0;)
        sift_down(w, rank, k, i);
    for (size_t i = k; i < vocab; i++)
        if (better(w, (uint32_t)i, rank[0])) {
            rank[0] = (uint32_t)i;
            sift_down(w, rank, k, 0);
        }
    for (size_t end = k; end-- > 1;) { /* the last-ranked goes to the end, and so on */
        uint32_t t = rank[0];
        rank[0] = rank[end];
        rank[end] = t;
        sift_down(w, rank, end, 0);
    }
}

/* From logits into w: when they differ a repeated id gets the same value again; in place
 * (logits == w) a repeated id is skipped (n_recent^2 compares: the window is short). */
static void penalize(const float *logits, const int32_t *recent, size_t n_recent, float penalty, float *w)
{
    for (size_t i = 0; i < n_recent; i++) {
        int seen = 0;
        for (size_t j = 0; j < i && logits == w && !seen; j++)
            seen = recent[j] == recent[i];
        if (seen)
            continue;
        float x = logits[recent[i]], y = x > 0.0f ? x / penalty : x * penalty;
        w[recent[i]] = y > FLT_MAX ? FLT_MAX : y;
    }
}

COLIBRI_API colibri_status colibri_sample_penalize(const float *logits, size_t vocab, const int32_t *recent,
                                                   size_t n_recent, float penalty, float *out)
{
    if (!logits || !out || (n_recent && !recent))
        return COLIBRI_E_NULL;
    if (!finite(penalty) || !(penalty > 0.0f))
        return COLIBRI_E_ARG;
    for (size_t i = 0; i < n_recent; i++)
        if (recent[i] < 0 || (size_t)recent[i] >= vocab)
            return COLIBRI_E_TOKEN;
    if (out != logits)
        memmove(out, logits, vocab * sizeof *out);
    if (penalty != 1.0f)
        penalize(out, recent, n_recent, penalty, out);
    return COLIBRI_OK;
}

COLIBRI_API colibri_status colibri_sample_next(colibri_sampler *s, const float *logits, size_t vocab,
                                               const int32_t *recent, size_t n_recent, void *scratch,
                                               size_t scratch_len, int32_t *out)
{
    if (!s || !logits || !out || !scratch || (n_recent && !recent))
        return COLIBRI_E_NULL;
    if (vocab == 0 || vocab > (size_t)INT32_MAX || scratch_len / 8u < vocab || ((uintptr_t)scratch & 3u))
        return COLIBRI_E_ARG;
    const colibri_sample_params *p = &s->params;
    float *w = (float *)scratch;
    uint32_t *rank = (uint32_t *)(w + vocab);
    int any = 0;
    for (size_t i = 0; i < vocab; i++) {
        float x = logits[i];
        if (x != x || x > FLT_MAX)
            return COLIBRI_E_ARG;
        any |= x >= -FLT_MAX;
        w[i] = x;
    }
    if (!any)
        return COLIBRI_E_ARG;
    for (size_t i = 0; i < n_recent; i++)
        if (recent[i] < 0 || (size_t)recent[i] >= vocab)
            return COLIBRI_E_TOKEN;
    /* 1. penalty */
    if (p->repeat_penalty != 1.0f)
        penalize(logits, recent, n_recent, p->repeat_penalty, w);
    /* 2. greedy */
    if (p->temperature == 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < vocab; i++)
            if (w[i] > w[best])
                best = i;
        *out = (int32_t)best;
        return COLIBRI_OK;
    }
    /* 3. top-k */
    size_t n = p->top_k == 0 || p->top_k >= vocab ? vocab : (size_t)p->top_k;
    top_k(w, vocab, rank, n);
    /* 4. softmax with temperature: p_r overwrites w[rank[r]] once w_0 is read */
    const float w0 = w[rank[0]];
    float sum = 0.0f;
    for (size_t r = 0; r < n; r++) {
        float e = cb_expf((w[rank[r]] - w0) / p->temperature);
        w[rank[r]] = e;
        sum += e;
    }
    for (size_t r = 0; r < n; r++)
        w[rank[r]] = w[rank[r]] / sum;
    /* 5. top-p */
    if (p->top_p < 1.0f) {
        float c = 0.0f;
        size_t keep = n;
        for (size_t r = 0; r < n; r++) {
            c += w[rank[r]];
            if (c >= p->top_p) {
                keep = r + 1;
                break;
            }
        }
        n = keep;
    }
    /* 6. min-p */
    if (p->min_p > 0.0f) {
        const float floor = p->min_p * w[rank[0]];
        size_t keep = 1;
        while (keep < n && w[rank[keep]] >= floor)
            keep++;
        n = keep;
    }
    /* 7. draw */
    float total = 0.0f;
    for (size_t r = 0; r < n; r++)
        total += w[rank[r]];
    const float u = (float)(colibri_sample_rand(s) >> 40) * (1.0f / 16777216.0f);
    const float t = u * total;
    float c = 0.0f;
    for (size_t r = 0; r < n; r++) {
        c += w[rank[r]];
        if (t < c) {
            *out = (int32_t)rank[r];
            return COLIBRI_OK;
        }
    }
    *out = (int32_t)rank[n - 1];
    return COLIBRI_OK;
}

/* ------------------------------------------------------------ streaming UTF-8 */

COLIBRI_API void colibri_utf8_init(colibri_utf8 *u)
{
    if (u)
        memset(u, 0, sizeof *u);
}

/* The length of the sequence lead byte b starts (0: never a lead), and the range its
 * second byte must lie in (Unicode Table 3-7, well-formed UTF-8 byte sequences). */
static size_t seq_len(uint8_t b, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b < 0xC2)
        return 0;
    if (b < 0xE0)
        return 2;
    if (b < 0xF0) {
        if (b == 0xE0)
            *lo = 0xA0;
        if (b == 0xED)
            *hi = 0x9F;
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0)
            *lo = 0x90;
        if (b == 0xF4)
            *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Would `next` continue the well-formed prefix p[0..n), n >= 1? */
static int continues(const uint8_t *p, size_t n, uint8_t next)
{
    uint8_t lo, hi;
    seq_len(p[0], &lo, &hi);
    if (n == 1)
        return next >= lo && next <= hi;
    return next >= 0x80 && next <= 0xBF;
}

static size_t put_fffd(uint8_t *out, size_t o)
{
    out[o] = 0xEF;
    out[o + 1] = 0xBF;
    out[o + 2] = 0xBD;
    return o + 3;
}

/* One TEXT byte through from_utf8_lossy's rule. */
static size_t lossy_byte(colibri_utf8 *u, uint8_t b, uint8_t *out, size_t o)
{
    uint8_t lo, hi;
    if (u->n_pending) {
        if (continues(u->pending, u->n_pending, b)) {
            u->pending[u->n_pending++] = b;
            if (u->n_pending == seq_len(u->pending[0], &lo, &hi)) {
                memcpy(out + o, u->pending, u->n_pending);
                o += u->n_pending;
                u->n_pending = 0;
            }
            return o;
        }
        o = put_fffd(out, o); /* the prefix that cannot be completed; b starts afresh */
        u->n_pending = 0;
    }
    size_t len = seq_len(b, &lo, &hi);
    if (len == 1)
        out[o++] = b;
    else if (len == 0)
        o = put_fffd(out, o);
    else
        u->pending[u->n_pending++] = b;
    return o;
}

/* Is r[0..n) well-formed UTF-8? Writes the length of its longest well-formed prefix of whole
 * characters to *whole. */
static int well_formed(const uint8_t *r, size_t n, size_t *whole)
{
    size_t i = 0;
    *whole = 0;
    while (i < n) {
        uint8_t lo, hi;
        size_t len = seq_len(r[i], &lo, &hi);
        if (len == 0 || i + len > n)
            return 0;
        for (size_t j = 1; j < len; j++)
            if (r[i + j] < (j == 1 ? lo : 0x80) || r[i + j] > (j == 1 ? hi : 0xBF))
                return 0;
        i += len;
        *whole = i;
    }
    return 1;
}

/* The run of byte-fallback bytes ends (final) or is full: decide it, or its whole characters. */
static size_t close_run(colibri_utf8 *u, uint8_t *out, size_t o, int final)
{
    size_t whole;
    int ok = well_formed(u->run, u->n_run, &whole);
    if (ok || (!final && whole)) {
        size_t n = ok ? u->n_run : whole;
        memcpy(out + o, u->run, n);
        o += n;
        memmove(u->run, u->run + n, u->n_run - n);
        u->n_run = (uint8_t)(u->n_run - n);
        return o;
    }
    for (size_t i = 0; i < u->n_run; i++)
        o = put_fffd(out, o);
    u->n_run = 0;
    return o;
}

COLIBRI_API colibri_status colibri_utf8_feed(colibri_utf8 *u, const uint8_t *bytes, size_t n, colibri_utf8_kind kind,
                                             uint8_t *out, size_t cap, size_t *out_len)
{
    if (!u || !out || !out_len || (n && !bytes))
        return COLIBRI_E_NULL;
    if (n > (SIZE_MAX / 3u) - COLIBRI_UTF8_RUN_MAX - 4u || cap < COLIBRI_UTF8_OUT_MAX(n)
        || (kind != COLIBRI_UTF8_TEXT && kind != COLIBRI_UTF8_BYTE) || u->n_pending > 3
        || u->n_run > COLIBRI_UTF8_RUN_MAX)
        return COLIBRI_E_ARG;
    size_t o = 0;
    if (kind == COLIBRI_UTF8_TEXT && u->n_run) /* any text token, even an empty one, ends a run */
        o = close_run(u, out, o, 1);
    for (size_t i = 0; i < n; i++) {
        if (kind == COLIBRI_UTF8_TEXT) {
            o = lossy_byte(u, bytes[i], out, o);
        } else {
            if (u->n_pending) { /* a token's own text ended in an incomplete character */
                o = put_fffd(out, o);
                u->n_pending = 0;
            }
            if (u->n_run == COLIBRI_UTF8_RUN_MAX)
                o = close_run(u, out, o, 0);
            u->run[u->n_run++] = bytes[i];
        }
    }
    *out_len = o;
    return COLIBRI_OK;
}

COLIBRI_API colibri_status colibri_utf8_flush(colibri_utf8 *u, uint8_t *out, size_t cap, size_t *out_len)
{
    if (!u || !out || !out_len)
        return COLIBRI_E_NULL;
    if (cap < COLIBRI_UTF8_OUT_MAX(0) || u->n_pending > 3 || u->n_run > COLIBRI_UTF8_RUN_MAX)
        return COLIBRI_E_ARG;
    size_t o = 0;
    if (u->n_pending)
        o = put_fffd(out, o);
    u->n_pending = 0;
    if (u->n_run)
        o = close_run(u, out, o, 1);
    *out_len = o;
    return COLIBRI_OK;
}
