/* nfc.c: Unicode NFC (canonical decomposition, canonical ordering by combining class, canonical
 * composition; Hangul by rule) as HF tokenizers' NFC normalizer does, over the tables of the section's
 * NFC block (generated at export by codegen/tokenizer/nfc.py). No malloc, no recursion, no globals: one
 * combining sequence of at most COLIBRI_NFC_MAX_SEQ codepoints on the stack, the output in the caller's
 * buffer. */
#include "nfc.h"

#include "colibri_text.h"
#include "textint.h"

#define NFC_NONE 0xFFFFFFFFu
#define MAX_CP 0x10FFFFu
#define MAX_DECOMP 4u
#define S_BASE 0xAC00u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

typedef struct {
    const uint32_t *dec, *pool, *ccc, *comp;
    uint32_t nd, np, nc, nk;
} tables;

static void get_tables(const uint32_t *b, tables *t) {
    t->nd = b[0]; t->np = b[1]; t->nc = b[2]; t->nk = b[3];
    t->dec = b + 4;
    t->pool = t->dec + 2u * t->nd;
    t->ccc = t->pool + t->np;
    t->comp = t->ccc + 2u * t->nc;
}

int colibri_nfc_check(const uint32_t *b, uint32_t n_words) {
    if (!b || n_words < 4u) return COLIBRI_TOK_E_SECTION;
    tables t;
    if (b[0] > (1u << 20) || b[1] > (1u << 20) || b[2] > (1u << 20) || b[3] > (1u << 20)) return COLIBRI_TOK_E_SECTION;
    if (4ull + 2ull * b[0] + b[1] + 2ull * b[2] + 3ull * b[3] != n_words) return COLIBRI_TOK_E_SECTION;
    get_tables(b, &t);
    for (uint32_t i = 0; i < t.nd; i++) {
        uint32_t cp = t.dec[2u * i], off = t.dec[2u * i + 1u] & 0xFFFFFFu, n = t.dec[2u * i + 1u] >> 24;
        if (cp > MAX_CP || (i && cp <= t.dec[2u * i - 2u]) || n == 0 || n > MAX_DECOMP || off > t.np || n > t.np - off)
            return COLIBRI_TOK_E_SECTION;
    }
    for (uint32_t i = 0; i < t.np; i++)
        if (t.pool[i] > MAX_CP) return COLIBRI_TOK_E_SECTION;
    for (uint32_t i = 0; i < t.nc; i++) {
        uint32_t first = t.ccc[2u * i], last = t.ccc[2u * i + 1u] & 0xFFFFFFu, cc = t.ccc[2u * i + 1u] >> 24;
        if (first > last || last > MAX_CP || cc == 0 || (i && first <= (t.ccc[2u * i - 1u] & 0xFFFFFFu)))
            return COLIBRI_TOK_E_SECTION;
    }
    for (uint32_t i = 0; i < t.nk; i++) {
        const uint32_t *k = t.comp + 3u * i;
        if (k[0] > MAX_CP || k[1] > MAX_CP || k[2] > MAX_CP) return COLIBRI_TOK_E_SECTION;
        if (i && (k[-3] > k[0] || (k[-3] == k[0] && k[-2] >= k[1]))) return COLIBRI_TOK_E_SECTION;
    }
    return COLIBRI_TOK_OK;
}

static uint32_t ccc_of(const tables *t, uint32_t cp) {
    uint32_t lo = 0, hi = t->nc;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        if (cp < t->ccc[2u * mid]) hi = mid;
        else if (cp > (t->ccc[2u * mid + 1u] & 0xFFFFFFu)) lo = mid + 1u;
        else return t->ccc[2u * mid + 1u] >> 24;
    }
    return 0;
}

/* the full canonical decomposition of cp into d[0..return) */
static uint32_t decompose(const tables *t, uint32_t cp, uint32_t d[MAX_DECOMP]) {
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE, n = 2;
        d[0] = L_BASE + s / N_COUNT;
        d[1] = V_BASE + (s % N_COUNT) / T_COUNT;
        if (s % T_COUNT) d[n++] = T_BASE + s % T_COUNT;
        return n;
    }
    uint32_t lo = 0, hi = t->nd;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u, c = t->dec[2u * mid];
        if (c < cp) lo = mid + 1u;
        else if (c > cp) hi = mid;
        else {
            uint32_t off = t->dec[2u * mid + 1u] & 0xFFFFFFu, n = t->dec[2u * mid + 1u] >> 24;
            for (uint32_t k = 0; k < n; k++) d[k] = t->pool[off + k];
            return n;
        }
    }
    d[0] = cp;
    return 1;
}

/* the primary composite of (a, b), or NFC_NONE */
static uint32_t compose_pair(const tables *t, uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    uint32_t lo = 0, hi = t->nk;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        const uint32_t *k = t->comp + 3u * mid;
        if (k[0] < a || (k[0] == a && k[1] < b)) lo = mid + 1u;
        else if (k[0] == a && k[1] == b) return k[2];
        else hi = mid;
    }
    return NFC_NONE;
}

typedef struct {
    uint32_t cp[COLIBRI_NFC_MAX_SEQ];
    uint8_t cc[COLIBRI_NFC_MAX_SEQ];
    uint32_t n;
    int starter; /* cp[0] is a starter (false only for non-starters at the start of the text) */
} sequence;

/* canonical ordering (stable by combining class) of the non-starters, then their composition with the
 * starter where not blocked */
static void settle(const tables *t, sequence *q) {
    uint32_t first = q->starter ? 1u : 0u;
    for (uint32_t i = first + 1u; i < q->n; i++) {
        uint32_t c = q->cp[i];
        uint8_t cc = q->cc[i];
        uint32_t j = i;
        for (; j > first && q->cc[j - 1u] > cc; j--) { q->cp[j] = q->cp[j - 1u]; q->cc[j] = q->cc[j - 1u]; }
        q->cp[j] = c; q->cc[j] = cc;
    }
    if (!q->starter) return;
    uint32_t kept = 1;
    uint8_t last_cc = 0;
    for (uint32_t i = 1; i < q->n; i++) {
        uint32_t x = (last_cc == 0 || last_cc < q->cc[i]) ? compose_pair(t, q->cp[0], q->cp[i]) : NFC_NONE;
        if (x != NFC_NONE) { q->cp[0] = x; continue; }
        q->cp[kept] = q->cp[i]; q->cc[kept] = q->cc[i]; kept++;
        last_cc = q->cc[i];
    }
    q->n = kept;
}

static int flush(sequence *q, uint8_t *out, size_t cap, size_t *o) {
    for (uint32_t i = 0; i < q->n; i++) {
        if (utf8_len(q->cp[i]) > cap - *o) return COLIBRI_TOK_E_SCRATCH;
        *o += put_utf8(q->cp[i], out + *o);
    }
    q->n = 0;
    return COLIBRI_TOK_OK;
}

int colibri_nfc_compose(const uint32_t *b, const uint8_t *s, size_t len, uint8_t *out, size_t cap, size_t *n_out) {
    tables t;
    sequence q;
    size_t o = 0;
    int rc = COLIBRI_TOK_OK;
    *n_out = 0;
    get_tables(b, &t);
    q.n = 0;
    q.starter = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp, d[MAX_DECOMP];
        i = next_cp(s, len, i, &cp);
        uint32_t nd = decompose(&t, cp, d);
        for (uint32_t k = 0; k < nd; k++) {
            uint32_t cc = ccc_of(&t, d[k]);
            if (cc == 0) {
                if (q.n) {
                    settle(&t, &q);
                    if (q.starter && q.n == 1) {
                        uint32_t x = compose_pair(&t, q.cp[0], d[k]);
                        if (x != NFC_NONE) { q.cp[0] = x; continue; }
                    }
                    if ((rc = flush(&q, out, cap, &o)) != 0) return rc;
                }
                q.cp[0] = d[k]; q.cc[0] = 0; q.n = 1; q.starter = 1;
            } else {
                if (q.n >= COLIBRI_NFC_MAX_SEQ) return COLIBRI_TOK_E_NFC;
                q.cp[q.n] = d[k]; q.cc[q.n] = (uint8_t)cc; q.n++;
            }
        }
    }
    if (q.n) {
        settle(&t, &q);
        if ((rc = flush(&q, out, cap, &o)) != 0) return rc;
    }
    *n_out = o;
    return COLIBRI_TOK_OK;
}
