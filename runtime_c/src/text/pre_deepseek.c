/* pre_deepseek.c: DeepSeek's pre-tokenizer (pre_deepseek.h) as a fixed-depth stack of splitters, one per
 * stage of tokenizer.json's Sequence: no regex engine, no recursion, no malloc. Each stage sees only its
 * piece, as HF tokenizers' Split does (so `$` is the end of the piece, `\s?` never looks outside it). */
#include "pre_deepseek.h"

#include "textint.h"

#define NOMATCH ((size_t)-1)

static int is_punct(uint32_t c) { /* [!-/:-~！-／：-～‘-‟　-。] */
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
           (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
}

static int is_cjk(uint32_t c) { /* [一-龥ࠀ-一가-퟿] */
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) || (c >= 0xAC00 && c <= 0xD7FF);
}

static int in_class(const colibri_ds_iter *it, unsigned stage, uint32_t c) {
    switch (stage) {
    case 1: return in_ranges(it->letters, it->n_letters, c);
    case 2: return is_punct(c);
    case 4: return is_cjk(c);
    default: return in_ranges(it->digits, it->n_digits, c);
    }
}

/* the end of the stage's match at q within [q, b), or NOMATCH */
static size_t match_at(const colibri_ds_iter *it, unsigned stage, size_t q, size_t b) {
    uint32_t c, c2;
    size_t n = next_cp(it->s, b, q, &c), m;
    switch (stage) {
    case 0: return (c == '\r' || c == '\n') ? n : NOMATCH;
    case 5: return in_class(it, 5, c) ? n : NOMATCH;
    default: break;
    }
    size_t j = q;
    if ((stage == 1 || stage == 2) && is_ws(c) && n < b && (next_cp(it->s, b, n, &c2), in_class(it, stage, c2)))
        j = n; /* \s? took the whitespace */
    else if (!in_class(it, stage, c))
        return NOMATCH; /* (U+3000 is both \s and punctuation: without \s? it may still start the class) */
    while (j < b) { /* the class, one or more */
        m = next_cp(it->s, b, j, &c2);
        if (!in_class(it, stage, c2)) break;
        j = m;
    }
    return j;
}

/* the next piece of the stage's span (a match, or the text before the next match): 1, or 0 when done */
static int stage_next(colibri_ds_iter *it, unsigned k, size_t *start, size_t *end) {
    size_t p = it->p[k], b = it->b[k];
    if (p >= b) return 0;
    if (k == 3) { /* \s+$ matches at most once, the whitespace at the end: find where it starts */
        size_t ws = NOMATCH, j = p, m;
        uint32_t c;
        for (; j < b; j = m) {
            m = next_cp(it->s, b, j, &c);
            if (!is_ws(c)) ws = NOMATCH;
            else if (ws == NOMATCH) ws = j;
        }
        *start = p;
        *end = (ws == NOMATCH || ws == p) ? b : ws;
        it->p[k] = *end;
        return 1;
    }
    for (size_t q = p, m; q < b; q = m) {
        uint32_t c;
        size_t e = match_at(it, k, q, b);
        if (e != NOMATCH) {
            *start = p;
            *end = q > p ? q : e;
            it->p[k] = *end;
            return 1;
        }
        m = next_cp(it->s, b, q, &c);
    }
    *start = p;
    *end = b;
    it->p[k] = b;
    return 1;
}

void colibri_ds_begin(colibri_ds_iter *it, const uint8_t *s, size_t len, const uint32_t *letters, uint32_t n_letters,
                      const uint32_t *digits, uint32_t n_digits) {
    it->s = s;
    it->letters = letters; it->n_letters = n_letters;
    it->digits = digits; it->n_digits = n_digits;
    it->a[0] = it->p[0] = 0;
    it->b[0] = len;
    it->depth = 0;
}

int colibri_ds_next(colibri_ds_iter *it, size_t *start, size_t *end) {
    for (;;) {
        size_t a, e;
        unsigned k = it->depth;
        if (!stage_next(it, k, &a, &e)) {
            if (k == 0) return 0;
            it->depth--;
            continue;
        }
        if (k + 1u == COLIBRI_DS_STAGES) { *start = a; *end = e; return 1; }
        it->depth = k + 1u;
        it->a[k + 1u] = it->p[k + 1u] = a;
        it->b[k + 1u] = e;
    }
}
