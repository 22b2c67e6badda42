/* tok.c: the tokenizer section (FORMAT.md, "Tokenizer") run in C: added tokens matched whole, the
 * SentencePiece metaspace or a byte-level pre-tokenizer (hand-written matchers for the GPT-2, Llama 3
 * and Qwen2 regexes over the section's Unicode tables), then BPE by merge rank. No malloc, no
 * recursion, no globals; every read is within the section validated by colibri_tok_init. */
#include "../cb_format.h" /* colibri_tok_from_blob: where the blob's table is */
#include "colibri_text.h"

#include <string.h>

#include "nfc.h"
#include "pre_deepseek.h"
#include "textint.h"

#define TOK_MAGIC 0x4B4F5443u
#define TOK_VERSION 2u
#define TOK_HEADER_WORDS 16u
#define TOK_NONE 0xFFFFFFFFu
#define KIND_SPM 1u
#define KIND_BYTELEVEL 2u
#define PRE_NONE 0u
#define PRE_GPT2 1u
#define PRE_LLAMA3 2u
#define PRE_QWEN2 3u
#define PRE_DEEPSEEK 4u
#define F_IGNORE_MERGES 1u
#define F_BYTE_FALLBACK 2u
#define F_NFC 4u
#define F_ADD_BOS (1u << 5)
#define F_ADD_EOS (1u << 6)
#define SPECIAL_BIT 0x80000000u

static uint32_t prepend_scheme(const colibri_tok *t) { return (t->flags >> 3) & 3u; }

/* ---- section validation ---- */

static int cmp_bytes(const uint8_t *a, uint32_t na, const uint8_t *b, uint32_t nb) {
    uint32_t n = na < nb ? na : nb;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return na < nb ? -1 : (na > nb ? 1 : 0);
}

static const uint8_t *piece(const colibri_tok *t, uint32_t id, uint32_t *n) {
    *n = t->offs[id + 1] - t->offs[id];
    return t->pieces + t->offs[id];
}

static int check_ranges(const uint32_t *r, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (r[2 * i] > r[2 * i + 1] || r[2 * i + 1] > 0x10FFFFu) return 0;
        if (i && r[2 * i] <= r[2 * i - 1]) return 0;
    }
    return 1;
}

int colibri_tok_init(colibri_tok *t, const void *section, size_t len) {
    if (!t || !section) return COLIBRI_TOK_E_ARG;
    memset(t, 0, sizeof *t);
    if (((uintptr_t)section & 3u) != 0 || len < TOK_HEADER_WORDS * 4u) return COLIBRI_TOK_E_SECTION;
    const uint32_t *h = (const uint32_t *)section;
    if (h[0] != TOK_MAGIC || h[1] != TOK_VERSION) return COLIBRI_TOK_E_VERSION;
    uint32_t kind = h[2] & 0xFFu, pretok = (h[2] >> 8) & 0xFFu, flags = h[2] >> 16;
    uint32_t nv = h[3], nm = h[4], na = h[5], nl = h[9], nn = h[10], pb = h[11], total = h[12], nq = h[13];
    uint32_t nf = h[14]; /* the NFC block's words */
    if (total > len || (total & 3u) || nv == 0 || nv > (1u << 24) || nm > (1u << 26) || na > nv) return COLIBRI_TOK_E_SECTION;
    if (nl > (1u << 20) || nn > (1u << 20) || nq > (1u << 20) || nf > (1u << 24) || h[15]) return COLIBRI_TOK_E_SECTION;
    if (!(kind == KIND_SPM && pretok == PRE_NONE) &&
        !(kind == KIND_BYTELEVEL && pretok >= PRE_GPT2 && pretok <= PRE_DEEPSEEK && nl && nn))
        return COLIBRI_TOK_E_SECTION;
    if (((flags & F_NFC) != 0) != (nq != 0) || (nq != 0) != (nf != 0) || (kind != KIND_SPM && ((flags >> 3) & 3u))) return COLIBRI_TOK_E_SECTION;
    uint64_t words = (uint64_t)TOK_HEADER_WORDS + (nv + 1u) + nv + 4ull * nm + na + 256u + 2ull * (nl + nn + nq) + nf;
    uint64_t need = words * 4u + (((uint64_t)pb + 3u) & ~3ull);
    if (need != total) return COLIBRI_TOK_E_SECTION;
    const uint32_t *w = h + TOK_HEADER_WORDS;
    t->base = (const uint8_t *)section;
    t->hdr = h;
    t->offs = w; w += nv + 1u;
    t->sorted = w; w += nv;
    t->merges = w; w += 4ull * nm;
    t->added = w; w += na;
    t->byte_tok = w; w += 256;
    t->lranges = w; w += 2u * nl;
    t->nranges = w; w += 2u * nn;
    const uint32_t *qranges = w; w += 2u * nq;
    const uint32_t *nfc = w; w += nf;
    t->pieces = (const uint8_t *)w;
    t->n_vocab = nv; t->n_merges = nm; t->n_added = na; t->n_l = nl; t->n_n = nn;
    t->kind = kind; t->pretok = pretok; t->flags = flags;
    int bad = 0;
    if (t->offs[0] != 0 || t->offs[nv] != pb) bad = 1;
    for (uint32_t i = 0; !bad && i < nv; i++)
        if (t->offs[i + 1] < t->offs[i]) bad = 1;
    for (uint32_t i = 0; !bad && i < nv; i++) {
        if (t->sorted[i] >= nv) { bad = 1; break; }
        if (i) { /* strictly increasing by (bytes, id): also proves it is a permutation */
            uint32_t a = t->sorted[i - 1], b = t->sorted[i], la, lb;
            const uint8_t *pa = piece(t, a, &la), *pbb = piece(t, b, &lb);
            int c = cmp_bytes(pa, la, pbb, lb);
            if (c > 0 || (c == 0 && a >= b)) bad = 1;
        }
    }
    for (uint32_t i = 0; !bad && i < nm; i++) {
        const uint32_t *m = t->merges + 4u * i;
        if (m[0] >= nv || m[1] >= nv || m[2] >= nm || m[3] >= nv) bad = 1;
        else if (i && (m[-4] > m[0] || (m[-4] == m[0] && m[-3] >= m[1]))) bad = 1;
    }
    for (uint32_t i = 0; !bad && i < na; i++) {
        uint32_t id = t->added[i] & ~SPECIAL_BIT, n;
        if (id >= nv) bad = 1;
        else { (void)piece(t, id, &n); if (!n) bad = 1; }
    }
    for (uint32_t b = 0; !bad && b < 256; b++) {
        uint32_t id = t->byte_tok[b];
        if ((id != TOK_NONE && id >= nv) || (id == TOK_NONE && (kind == KIND_BYTELEVEL || (flags & F_BYTE_FALLBACK))))
            bad = 1;
    }
    for (int k = 6; !bad && k <= 8; k++)
        if (h[k] != TOK_NONE && h[k] >= nv) bad = 1;
    if (!bad && (!check_ranges(t->lranges, nl) || !check_ranges(t->nranges, nn) || !check_ranges(qranges, nq))) bad = 1;
    if (!bad && nf && colibri_nfc_check(nfc, nf) != COLIBRI_TOK_OK) bad = 1;
    if (bad) { memset(t, 0, sizeof *t); return COLIBRI_TOK_E_SECTION; }
    return COLIBRI_TOK_OK;
}

/* ---- the section inside a model blob (FORMAT.md "Tokenizer"): the table's last entry when the header's
 * TOKENIZER flag is set; every offset is checked against len here, so an unvalidated blob is safe too ---- */

static uint64_t rd_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    while (n--) v = v << 8 | p[n];
    return v;
}

int colibri_tok_from_blob(colibri_tok *t, const void *blob, size_t len) {
    if (!t || !blob) return COLIBRI_TOK_E_ARG;
    memset(t, 0, sizeof *t);
    const uint8_t *b = (const uint8_t *)blob;
    if (len < CB_HEADER_BYTES || rd_le(b + CB_H_MAGIC, 4) != CB_MAGIC) return COLIBRI_TOK_E_SECTION;
    if (!(rd_le(b + CB_H_FLAGS, 4) & CB_FLAG_TOKENIZER)) return COLIBRI_TOK_E_NONE;
    uint64_t n = rd_le(b + CB_H_N_TENSORS, 4);
    if (n == 0 || CB_HEADER_BYTES + CB_ENTRY_BYTES * n > len) return COLIBRI_TOK_E_SECTION;
    const uint8_t *e = b + CB_HEADER_BYTES + CB_ENTRY_BYTES * (n - 1);
    uint64_t off = rd_le(e + CB_E_DATA_OFF, 8), bytes = rd_le(e + CB_E_ROWS, 4);
    if (rd_le(e + CB_E_KIND, 2) != CB_KIND_TOKENIZER || e[CB_E_DTYPE] != CB_BYTES_DTYPE || off > len
        || bytes > len - off)
        return COLIBRI_TOK_E_SECTION;
    return colibri_tok_init(t, b + off, (size_t)bytes);
}

int32_t colibri_tok_bos(const colibri_tok *t) { return (!t || !t->hdr || t->hdr[6] == TOK_NONE) ? -1 : (int32_t)t->hdr[6]; }
int32_t colibri_tok_eos(const colibri_tok *t) { return (!t || !t->hdr || t->hdr[7] == TOK_NONE) ? -1 : (int32_t)t->hdr[7]; }
uint32_t colibri_tok_vocab(const colibri_tok *t) { return (t && t->hdr) ? t->n_vocab : 0u; }

const char *colibri_tok_strerror(int status) {
    switch (status) {
    case COLIBRI_TOK_OK: return "ok";
    case COLIBRI_TOK_E_ARG: return "bad argument";
    case COLIBRI_TOK_E_SECTION: return "malformed tokenizer section";
    case COLIBRI_TOK_E_VERSION: return "tokenizer section magic or version not supported";
    case COLIBRI_TOK_E_TOO_LONG: return "the ids do not fit the buffer (text too long)";
    case COLIBRI_TOK_E_SCRATCH: return "a pre-token (or a text composed to NFC) is longer than the tokenizer scratch holds";
    case COLIBRI_TOK_E_ID: return "token id outside the vocabulary";
    case COLIBRI_TOK_E_NFC: return "a combining sequence is longer than NFC composition handles (64 codepoints)";
    case COLIBRI_TOK_E_NONE: return "the model has no tokenizer";
    default: return "unknown tokenizer status";
    }
}

/* ---- character classes ---- */

typedef struct { const colibri_tok *t; const uint8_t *s; size_t len; } scan;

static int is_l(const scan *x, uint32_t c) { return in_ranges(x->t->lranges, x->t->n_l, c); }
static int is_n(const scan *x, uint32_t c) { return in_ranges(x->t->nranges, x->t->n_n, c); }
static int is_other(const scan *x, uint32_t c) { return !is_ws(c) && !is_l(x, c) && !is_n(x, c); }

/* the codepoint at i (or 0xFFFFFFFF at the end) and where the next starts */
static uint32_t peek(const scan *x, size_t i, size_t *next) {
    uint32_t cp;
    if (i >= x->len) { *next = i; return TOK_NONE; }
    *next = next_cp(x->s, x->len, i, &cp);
    return cp;
}

static size_t run_l(const scan *x, size_t i) {
    size_t n;
    for (uint32_t c = peek(x, i, &n); c != TOK_NONE && is_l(x, c); c = peek(x, i, &n)) i = n;
    return i;
}

static size_t run_other(const scan *x, size_t i) {
    size_t n;
    for (uint32_t c = peek(x, i, &n); c != TOK_NONE && is_other(x, c); c = peek(x, i, &n)) i = n;
    return i;
}

static int lower_eq(uint32_t c, char want) {
    if (want == 's' && c == 0x17F) return 1; /* LATIN SMALL LETTER LONG S case-folds to s */
    return c < 128 && (c | 0x20u) == (uint32_t)want;
}

/* 's 't 're 've 'm 'll 'd (case-insensitive for Llama 3/Qwen2) at i: the end, or 0 */
static size_t contraction(const scan *x, size_t i, int icase) {
    size_t a, b, c;
    if (peek(x, i, &a) != '\'') return 0;
    uint32_t c1 = peek(x, a, &b), c2 = peek(x, b, &c);
    if (c1 == TOK_NONE) return 0;
#define EQ(cp, ch) (icase ? lower_eq((cp), (ch)) : (cp) == (uint32_t)(ch))
    if (EQ(c1, 's') || EQ(c1, 't') || EQ(c1, 'm') || EQ(c1, 'd')) return b;
    if (c2 != TOK_NONE && ((EQ(c1, 'r') && EQ(c2, 'e')) || (EQ(c1, 'v') && EQ(c2, 'e')) || (EQ(c1, 'l') && EQ(c2, 'l'))))
        return c;
#undef EQ
    return 0;
}

/* \s+(?!\S)|\s+ at i (a whitespace character) */
static size_t whitespace(const scan *x, size_t i) {
    size_t n, last = i, j = i;
    unsigned count = 0;
    for (uint32_t c = peek(x, j, &n); c != TOK_NONE && is_ws(c); c = peek(x, j, &n)) { last = j; j = n; count++; }
    if (j >= x->len || count == 1) return j;
    return last; /* leave the last whitespace character to the word that follows */
}

static size_t match_gpt2(const scan *x, size_t i) {
    size_t n, m, e;
    uint32_t c0 = peek(x, i, &n);
    if ((e = contraction(x, i, 0)) != 0) return e;
    size_t q = c0 == ' ' ? n : i;
    uint32_t cq = peek(x, q, &m);
    if (cq != TOK_NONE) {
        if (is_l(x, cq)) return run_l(x, q);
        if (is_n(x, cq)) {
            for (; cq != TOK_NONE && is_n(x, cq); cq = peek(x, q, &m)) q = m;
            return q;
        }
        if (is_other(x, cq)) return run_other(x, q);
    }
    if (is_ws(c0)) return whitespace(x, i);
    return n;
}

static size_t match_llama3(const scan *x, size_t i, unsigned max_digits) {
    size_t n, m, e;
    uint32_t c0 = peek(x, i, &n);
    if ((e = contraction(x, i, 1)) != 0) return e;
    if (c0 != '\r' && c0 != '\n' && !is_l(x, c0) && !is_n(x, c0)) {
        uint32_t c1 = peek(x, n, &m);
        if (c1 != TOK_NONE && is_l(x, c1)) return run_l(x, n);
    }
    if (is_l(x, c0)) return run_l(x, i);
    if (is_n(x, c0)) {
        size_t j = n;
        for (unsigned k = 1; k < max_digits; k++) {
            uint32_t c = peek(x, j, &m);
            if (c == TOK_NONE || !is_n(x, c)) break;
            j = m;
        }
        return j;
    }
    size_t q = c0 == ' ' ? n : i;
    uint32_t cq = peek(x, q, &m);
    if (cq != TOK_NONE && is_other(x, cq)) {
        size_t j = run_other(x, q);
        for (uint32_t c = peek(x, j, &m); c == '\r' || c == '\n'; c = peek(x, j, &m)) j = m;
        return j;
    }
    if (is_ws(c0)) {
        size_t j = i, after_nl = 0;
        for (uint32_t c = peek(x, j, &m); c != TOK_NONE && is_ws(c); c = peek(x, j, &m)) {
            if (c == '\r' || c == '\n') after_nl = m;
            j = m;
        }
        if (after_nl) return after_nl;
        return whitespace(x, i);
    }
    return n;
}

/* ---- vocabulary and merges ---- */

static uint32_t lookup(const colibri_tok *t, const uint8_t *s, uint32_t n) {
    uint32_t lo = 0, hi = t->n_vocab;
    while (lo < hi) { /* the first id whose piece is >= s */
        uint32_t mid = lo + (hi - lo) / 2u, pn;
        const uint8_t *p = piece(t, t->sorted[mid], &pn);
        if (cmp_bytes(p, pn, s, n) < 0) lo = mid + 1u;
        else hi = mid;
    }
    if (lo < t->n_vocab) {
        uint32_t pn;
        const uint8_t *p = piece(t, t->sorted[lo], &pn);
        if (cmp_bytes(p, pn, s, n) == 0) return t->sorted[lo];
    }
    return TOK_NONE;
}

static uint32_t merge_of(const colibri_tok *t, uint32_t a, uint32_t b) { /* index into merges, or NONE */
    uint32_t lo = 0, hi = t->n_merges;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        const uint32_t *m = t->merges + 4u * mid;
        if (m[0] < a || (m[0] == a && m[1] < b)) lo = mid + 1u;
        else if (m[0] == a && m[1] == b) return mid;
        else hi = mid;
    }
    return TOK_NONE;
}

typedef struct {
    int32_t *ids;
    size_t cap, n;
    uint8_t *bytes; /* the current pre-token's bytes */
    uint32_t *sym, *mrg;
    size_t max_bytes;
    uint8_t *scratch;
    size_t scratch_bytes;
} work;

/* the scratch: the pre-token's bytes, its symbols and their merges (9 bytes per byte of pre-token) */
static void work_scratch(work *w, uint8_t *scratch, size_t scratch_bytes) {
    size_t max_bytes = scratch_bytes / 9u & ~(size_t)3u;
    w->bytes = scratch;
    w->sym = (uint32_t *)(scratch + max_bytes);
    w->mrg = (uint32_t *)(scratch + 5u * max_bytes);
    w->max_bytes = max_bytes;
}

static int emit(work *w, uint32_t id) {
    if (w->n >= w->cap) return COLIBRI_TOK_E_TOO_LONG;
    w->ids[w->n++] = (int32_t)id;
    return COLIBRI_TOK_OK;
}

/* lowest rank first, leftmost among equals: the order HF's BPE merges in */
static int bpe(const colibri_tok *t, work *w, size_t m) {
    uint32_t *s = w->sym, *g = w->mrg;
    for (size_t i = 0; i + 1 < m; i++) g[i] = merge_of(t, s[i], s[i + 1]);
    while (m > 1) {
        size_t best = m;
        uint32_t best_rank = TOK_NONE;
        for (size_t i = 0; i + 1 < m; i++)
            if (g[i] != TOK_NONE && t->merges[4u * g[i] + 2u] < best_rank) { best_rank = t->merges[4u * g[i] + 2u]; best = i; }
        if (best == m) break;
        s[best] = t->merges[4u * g[best] + 3u];
        memmove(s + best + 1, s + best + 2, (m - best - 2) * sizeof *s);
        if (best + 2 < m) memmove(g + best + 1, g + best + 2, (m - best - 2) * sizeof *g);
        m--;
        if (best > 0) g[best - 1] = merge_of(t, s[best - 1], s[best]);
        if (best + 1 < m) g[best] = merge_of(t, s[best], s[best + 1]);
    }
    for (size_t i = 0; i < m; i++) {
        int rc = emit(w, s[i]);
        if (rc) return rc;
    }
    return COLIBRI_TOK_OK;
}

static int nfc_unsafe(const colibri_tok *t, uint32_t cp) {
    const uint32_t *q = t->nranges + 2u * t->n_n;
    return in_ranges(q, t->hdr[13], cp);
}

/* one byte-level pre-token [i, e): re-encoded (invalid bytes become U+FFFD), then BPE over bytes */
static int bytelevel_word(const colibri_tok *t, work *w, const scan *x, size_t i, size_t e) {
    size_t nb = 0;
    while (i < e) {
        uint32_t cp;
        i = next_cp(x->s, e, i, &cp);
        if (nb + 4 > w->max_bytes) return COLIBRI_TOK_E_SCRATCH;
        nb += put_utf8(cp, w->bytes + nb);
    }
    if (t->flags & F_IGNORE_MERGES) {
        uint32_t id = lookup(t, w->bytes, (uint32_t)nb);
        if (id != TOK_NONE) return emit(w, id);
    }
    for (size_t k = 0; k < nb; k++) w->sym[k] = t->byte_tok[w->bytes[k]];
    return bpe(t, w, nb);
}

static int bytelevel_segment(const colibri_tok *t, work *w, const uint8_t *s, size_t len) {
    scan x = {t, s, len};
    size_t i = 0;
    if (t->pretok == PRE_DEEPSEEK) {
        colibri_ds_iter it;
        size_t e;
        colibri_ds_begin(&it, s, len, t->lranges, t->n_l, t->nranges, t->n_n);
        while (colibri_ds_next(&it, &i, &e)) {
            int rc = bytelevel_word(t, w, &x, i, e);
            if (rc) return rc;
        }
        return COLIBRI_TOK_OK;
    }
    while (i < len) {
        size_t e = t->pretok == PRE_GPT2 ? match_gpt2(&x, i) : match_llama3(&x, i, t->pretok == PRE_LLAMA3 ? 3u : 1u);
        if (e <= i) return COLIBRI_TOK_E_SECTION; /* cannot happen: every matcher consumes a character */
        int rc = bytelevel_word(t, w, &x, i, e);
        if (rc) return rc;
        i = e;
    }
    return COLIBRI_TOK_OK;
}

/* SentencePiece-style: spaces -> U+2581, maybe one U+2581 in front, then BPE over characters */
static int spm_segment(const colibri_tok *t, work *w, const uint8_t *s, size_t len, int first) {
    static const uint8_t meta[3] = {0xE2, 0x96, 0x81};
    size_t nb = 0, i = 0;
    uint32_t scheme = prepend_scheme(t);
    int starts_meta = len >= 3 && memcmp(s, meta, 3) == 0;
    /* 1: Metaspace "first", 2: "always" (both only where the text does not start with a space);
     * 3: the normalizer Prepend, unconditional */
    if (len && (scheme == 3u || ((scheme == 2u || (scheme == 1u && first)) && !(starts_meta || s[0] == ' ')))) {
        if (w->max_bytes < 3) return COLIBRI_TOK_E_SCRATCH;
        memcpy(w->bytes, meta, 3);
        nb = 3;
    }
    while (i < len) {
        uint32_t cp;
        i = next_cp(s, len, i, &cp);
        if (nb + 4 > w->max_bytes) return COLIBRI_TOK_E_SCRATCH;
        if (cp == ' ') { memcpy(w->bytes + nb, meta, 3); nb += 3; }
        else nb += put_utf8(cp, w->bytes + nb);
    }
    size_t m = 0;
    uint32_t unk = t->hdr[8];
    for (size_t k = 0; k < nb;) {
        uint32_t cp;
        size_t e = next_cp(w->bytes, nb, k, &cp);
        uint32_t id = lookup(t, w->bytes + k, (uint32_t)(e - k));
        if (id != TOK_NONE) w->sym[m++] = id;
        else if (t->flags & F_BYTE_FALLBACK) for (size_t b = k; b < e; b++) w->sym[m++] = t->byte_tok[w->bytes[b]];
        else if (unk != TOK_NONE && !(m && w->sym[m - 1] == unk)) w->sym[m++] = unk;
        k = e;
    }
    return bpe(t, w, m);
}

static int model_segment(const colibri_tok *t, work *w, const uint8_t *s, size_t len, int first) {
    return t->kind == KIND_SPM ? spm_segment(t, w, s, len, first) : bytelevel_segment(t, w, s, len);
}

/* NFC (where the section declares it and the text has a codepoint NFC may change): the text composed
 * into the start of the scratch, the pre-token work in the rest */
static int nfc_segment(const colibri_tok *t, work *w, const uint8_t *s, size_t len, int first) {
    size_t n;
    const uint32_t *block = (const uint32_t *)(const void *)t->pieces - t->hdr[14];
    int rc = colibri_nfc_compose(block, s, len, w->scratch, w->scratch_bytes, &n);
    if (rc) return rc;
    size_t used = (n + 3u) & ~(size_t)3u;
    if (used > w->scratch_bytes) used = w->scratch_bytes;
    work v = *w;
    work_scratch(&v, w->scratch + used, w->scratch_bytes - used);
    rc = model_segment(t, &v, w->scratch, n, first);
    w->n = v.n;
    return rc;
}

static int segment(const colibri_tok *t, work *w, const uint8_t *s, size_t len, int first) {
    if (!len) return COLIBRI_TOK_OK;
    if (t->flags & F_NFC) {
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            i = next_cp(s, len, i, &cp);
            if (nfc_unsafe(t, cp)) return nfc_segment(t, w, s, len, first);
        }
    }
    return model_segment(t, w, s, len, first);
}

/* the longest added token at s[i..] (special ones only when parsing them): its index, or NONE */
static uint32_t added_at(const colibri_tok *t, const uint8_t *s, size_t len, size_t i, unsigned flags, uint32_t *n_out) {
    uint32_t best = TOK_NONE, best_n = 0;
    for (uint32_t k = 0; k < t->n_added; k++) {
        uint32_t a = t->added[k], pn;
        if ((a & SPECIAL_BIT) && !(flags & COLIBRI_TOK_PARSE_SPECIAL)) continue;
        const uint8_t *p = piece(t, a & ~SPECIAL_BIT, &pn);
        if (pn > best_n && pn <= len - i && memcmp(p, s + i, pn) == 0) { best = a & ~SPECIAL_BIT; best_n = pn; }
    }
    *n_out = best_n;
    return best;
}

int colibri_tok_encode(const colibri_tok *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                       size_t cap, size_t *n_ids, void *scratch, size_t scratch_bytes) {
    if (n_ids) *n_ids = 0;
    if (!t || !t->hdr || (!text && len) || (!ids && cap) || !n_ids || (!scratch && scratch_bytes) ||
        ((uintptr_t)scratch & 3u))
        return COLIBRI_TOK_E_ARG;
    work w = {ids, cap, 0, NULL, NULL, NULL, 0, (uint8_t *)scratch, scratch_bytes};
    work_scratch(&w, (uint8_t *)scratch, scratch_bytes);
    const uint8_t *s = (const uint8_t *)text;
    int rc = COLIBRI_TOK_OK;
    if ((flags & COLIBRI_TOK_SPECIAL) && (t->flags & F_ADD_BOS) && t->hdr[6] != TOK_NONE) rc = emit(&w, t->hdr[6]);
    size_t start = 0, i = 0;
    while (!rc && i < len) {
        uint32_t n;
        uint32_t id = added_at(t, s, len, i, flags, &n);
        if (id == TOK_NONE) { i++; continue; }
        rc = segment(t, &w, s + start, i - start, start == 0);
        if (!rc) rc = emit(&w, id);
        i += n;
        start = i;
    }
    if (!rc) rc = segment(t, &w, s + start, len - start, start == 0);
    if (!rc && (flags & COLIBRI_TOK_SPECIAL) && (t->flags & F_ADD_EOS) && t->hdr[7] != TOK_NONE) rc = emit(&w, t->hdr[7]);
    *n_ids = rc ? 0 : w.n;
    return rc;
}

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Byte-level: an added token whose text is one character of the ByteLevel alphabet and whose id is that
 * byte's vocabulary entry (DeepSeek's "ü", "À", ...) decodes, as HF's ByteLevel decoder does, to the byte */
static int added_byte(const colibri_tok *t, uint32_t id, const uint8_t *p) {
    uint32_t cp;
    if (next_cp(p, 2, 0, &cp) != 2) return -1;
    int b = -1;
    if ((cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) b = (int)cp;
    else if (cp >= 0x100 && cp <= 0x120) b = (int)(cp - 0x100);        /* bytes 0x00-0x20 */
    else if (cp >= 0x121 && cp <= 0x142) b = (int)(cp - 0x121 + 0x7F); /* bytes 0x7F-0xA0 */
    else if (cp == 0x143) b = 0xAD;
    return (b >= 0 && t->byte_tok[b] == id) ? b : -1;
}

int colibri_tok_decode(const colibri_tok *t, int32_t id, unsigned flags, char *buf, size_t cap, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    if (!t || !t->hdr || !n_bytes || (!buf && cap)) return COLIBRI_TOK_E_ARG;
    if (id < 0 || (uint32_t)id >= t->n_vocab) return COLIBRI_TOK_E_ID;
    uint32_t pn;
    const uint8_t *p = piece(t, (uint32_t)id, &pn);
    size_t n = 0;
    if (t->kind == KIND_BYTELEVEL) {
        int b = pn == 2 ? added_byte(t, (uint32_t)id, p) : -1;
        if (b >= 0) {
            if (cap < 1) return COLIBRI_TOK_E_TOO_LONG;
            buf[0] = (char)b;
            *n_bytes = 1;
            return COLIBRI_TOK_OK;
        }
        if (pn > cap) return COLIBRI_TOK_E_TOO_LONG;
        if (pn) memcpy(buf, p, pn);
        *n_bytes = pn;
        return COLIBRI_TOK_OK;
    }
    if ((t->flags & F_BYTE_FALLBACK) && pn == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 &&
        hexval(p[4]) >= 0) {
        uint8_t b = (uint8_t)(hexval(p[3]) * 16 + hexval(p[4]));
        if (t->byte_tok[b] == (uint32_t)id) {
            if (!((flags & COLIBRI_TOK_FIRST) && b == ' ')) {
                if (cap < 1) return COLIBRI_TOK_E_TOO_LONG;
                buf[n++] = (char)b;
            }
            *n_bytes = n;
            return COLIBRI_TOK_OK;
        }
    }
    for (uint32_t i = 0; i < pn;) {
        uint8_t c;
        uint32_t step = 1;
        if (i + 3 <= pn && p[i] == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) { c = ' '; step = 3; }
        else c = p[i];
        i += step;
        if (c == ' ' && n == 0 && (flags & COLIBRI_TOK_FIRST)) { flags &= ~COLIBRI_TOK_FIRST; continue; }
        flags &= ~COLIBRI_TOK_FIRST;
        if (n >= cap) return COLIBRI_TOK_E_TOO_LONG;
        buf[n++] = (char)c;
    }
    *n_bytes = n;
    return COLIBRI_TOK_OK;
}
