/* nfc.h (internal): NFC composition over the tokenizer section's NFC block (FORMAT.md, "Tokenizer"). */
#ifndef COLIBRI_NFC_H
#define COLIBRI_NFC_H

#include <stddef.h>
#include <stdint.h>

/* The longest combining sequence composed (a starter and the non-starters after it, decomposed): a
 * longer one is COLIBRI_TOK_E_NFC, never a silent difference from NFC. */
#define COLIBRI_NFC_MAX_SEQ 64u

/* The NFC block b[0..n_words): COLIBRI_TOK_OK or COLIBRI_TOK_E_SECTION. */
int colibri_nfc_check(const uint32_t *b, uint32_t n_words);
/* NFC of s[0..len) (UTF-8; invalid sequences read as U+FFFD) into out[0..cap), *n_out bytes; a block that
 * passed colibri_nfc_check. COLIBRI_TOK_E_SCRATCH when out is too small, COLIBRI_TOK_E_NFC when a
 * combining sequence is longer than COLIBRI_NFC_MAX_SEQ. */
int colibri_nfc_compose(const uint32_t *b, const uint8_t *s, size_t len, uint8_t *out, size_t cap, size_t *n_out);

#endif
