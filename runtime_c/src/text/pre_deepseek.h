/* pre_deepseek.h (internal): DeepSeek LLM / DeepSeek-MoE's pre-tokenizer as code (no regex engine). */
#ifndef COLIBRI_PRE_DEEPSEEK_H
#define COLIBRI_PRE_DEEPSEEK_H

#include <stddef.h>
#include <stdint.h>

/* The Sequence of tokenizer.json (codegen/tokenizer/deepseek.py spells it), each stage splitting every
 * piece of the one before, matches and the text between them kept ("Isolated"):
 *   0 [\r\n]   1 \s?[letters]+   2 \s?[!-/:-~！-／：-～‘-‟　-。]+   3 \s+$   4 [一-龥ࠀ-一가-퟿]+
 *   5 Digits(individual_digits): each \p{N} alone */
#define COLIBRI_DS_STAGES 6u

typedef struct {
    const uint8_t *s;
    const uint32_t *letters, *digits; /* the section's ranges: the letter class, \p{N} */
    uint32_t n_letters, n_digits;
    size_t a[COLIBRI_DS_STAGES], b[COLIBRI_DS_STAGES], p[COLIBRI_DS_STAGES]; /* each stage's piece, cursor */
    unsigned depth;
} colibri_ds_iter;

void colibri_ds_begin(colibri_ds_iter *it, const uint8_t *s, size_t len, const uint32_t *letters, uint32_t n_letters,
                      const uint32_t *digits, uint32_t n_digits);
/* the next pre-token [*start, *end): 1, or 0 at the end of the text */
int colibri_ds_next(colibri_ds_iter *it, size_t *start, size_t *end);

#endif
