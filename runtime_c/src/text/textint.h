/* textint.h: what the text sources share (internal): UTF-8 in and out, codepoint range tables, \s. */
#ifndef COLIBRI_TEXTINT_H
#define COLIBRI_TEXTINT_H

#include <stddef.h>
#include <stdint.h>

#define REPLACEMENT 0xFFFDu

/* the codepoint at s[i] (invalid sequences: one U+FFFD per maximal subpart, as Python's "replace") and
 * where the next starts */
static inline size_t next_cp(const uint8_t *s, size_t len, size_t i, uint32_t *cp) {
    uint8_t c = s[i];
    if (c < 0x80) { *cp = c; return i + 1; }
    uint32_t need, v;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; v = c & 0x1Fu; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; v = c & 0x0Fu; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; v = c & 0x07u; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *cp = REPLACEMENT; return i + 1; }
    size_t j = i + 1;
    for (uint32_t k = 0; k < need; k++, j++) {
        if (j >= len || s[j] < lo || s[j] > hi) { *cp = REPLACEMENT; return j; }
        v = (v << 6) | (s[j] & 0x3Fu);
        lo = 0x80; hi = 0xBF;
    }
    *cp = v;
    return j;
}

static inline size_t utf8_len(uint32_t cp) { return cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u; }

static inline size_t put_utf8(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* inclusive (first, last) pairs, sorted and disjoint: is cp in one? */
static inline int in_ranges(const uint32_t *r, uint32_t n, uint32_t cp) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        if (cp < r[2 * mid]) hi = mid;
        else if (cp > r[2 * mid + 1]) lo = mid + 1u;
        else return 1;
    }
    return 0;
}

/* Unicode White_Space, the \s of the tokenizers' regex engine */
static inline int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

#endif
