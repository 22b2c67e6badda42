/* colibri_text.h: the model's own tokenizer in C (optional: a build without text links none of it).
 *
 * The tokenizer section (layout: runtime_c/FORMAT.md, "Tokenizer") is validated once by
 * colibri_tok_init; encode and decode then never read outside it. No malloc, no recursion, no globals:
 * encode works in a caller scratch buffer of COLIBRI_TOK_SCRATCH_BYTES (model.h may set it).
 *
 * Invalid UTF-8 in the text is read as U+FFFD per maximal invalid subpart, as Python's
 * bytes.decode("utf-8", "replace") does before HF tokenizers ever see the text.
 */
#ifndef COLIBRI_TEXT_H
#define COLIBRI_TEXT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(COLIBRI_BUILDING) && defined(__GNUC__)
#define COLIBRI_TOK_API __attribute__((visibility("default")))
#else
#define COLIBRI_TOK_API
#endif

#ifndef COLIBRI_TOK_SCRATCH_BYTES
#define COLIBRI_TOK_SCRATCH_BYTES 16384u /* one pre-token of up to 2048 symbols */
/* (with NFC declared, a text segment that needs composing is composed into the scratch first, and its
 * pre-tokens share the rest) */
#endif

/* encode flags */
#define COLIBRI_TOK_SPECIAL 1u       /* add the BOS/EOS tokenizer_config.json asks for */
#define COLIBRI_TOK_PARSE_SPECIAL 2u /* special tokens written in the text are matched whole */
/* decode flags */
#define COLIBRI_TOK_FIRST 1u /* this id starts the text (SentencePiece: its leading space is dropped) */

enum {
    COLIBRI_TOK_OK = 0,
    COLIBRI_TOK_E_ARG = -101,      /* a NULL pointer or a bad argument */
    COLIBRI_TOK_E_SECTION = -102,  /* the tokenizer section is malformed (cut short, bad offsets, ...) */
    COLIBRI_TOK_E_VERSION = -103,  /* the section's magic or version is not this runtime's */
    COLIBRI_TOK_E_TOO_LONG = -104, /* the ids do not fit the caller's buffer (e.g. a prompt over max_seq) */
    COLIBRI_TOK_E_SCRATCH = -105,  /* one pre-token (or a text composed to NFC) needs more than the scratch holds */
    COLIBRI_TOK_E_ID = -106,       /* decode: an id outside the vocabulary */
    COLIBRI_TOK_E_NFC = -107,      /* NFC: a combining sequence longer than COLIBRI_NFC_MAX_SEQ (64) codepoints */
    COLIBRI_TOK_E_NONE = -108      /* the model has no tokenizer section */
};

typedef struct colibri_tok {
    const uint8_t *base;
    const uint32_t *hdr, *offs, *sorted, *merges, *added, *byte_tok, *lranges, *nranges;
    const uint8_t *pieces;
    uint32_t n_vocab, n_merges, n_added, n_l, n_n, kind, pretok, flags;
} colibri_tok;

/* Validate a tokenizer section (4-byte aligned) and fill *t. */
COLIBRI_TOK_API int colibri_tok_init(colibri_tok *t, const void *section, size_t len);
/* The tokenizer section of a model blob (model.bin, or the blob linked in): COLIBRI_TOK_E_NONE when the
 * blob has none (exported with --no-tokenizer), COLIBRI_TOK_E_SECTION when its entry or section is bad. */
COLIBRI_TOK_API int colibri_tok_from_blob(colibri_tok *t, const void *blob, size_t len);
/* UTF-8 text -> ids[0..*n_ids). scratch: 4-byte aligned, COLIBRI_TOK_SCRATCH_BYTES or more. */
COLIBRI_TOK_API int colibri_tok_encode(const colibri_tok *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                       size_t cap, size_t *n_ids, void *scratch, size_t scratch_bytes);
/* One id -> its bytes (possibly part of a UTF-8 character: stream them as they come). */
COLIBRI_TOK_API int colibri_tok_decode(const colibri_tok *t, int32_t id, unsigned flags, char *buf, size_t cap, size_t *n_bytes);
COLIBRI_TOK_API int32_t colibri_tok_bos(const colibri_tok *t); /* -1 when none */
COLIBRI_TOK_API int32_t colibri_tok_eos(const colibri_tok *t);
COLIBRI_TOK_API uint32_t colibri_tok_vocab(const colibri_tok *t);
COLIBRI_TOK_API const char *colibri_tok_strerror(int status);

#ifdef __cplusplus
}
#endif
#endif
