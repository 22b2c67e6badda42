/*
 * demo_common.h - the command line and output shared by colibri_run (generic
 * runtime, model file) and colibri_demo (embedded model):
 *
 *   [MODEL.bin] [--tokens 3,17,42 | --prompt TEXT] [--generate N] [--threads N] [--print-logits]
 *       [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R]
 *       [--repeat-last-n N] [--seed S] [--stop 2,5] [--no-hugepages]
 *
 * prints "tokens: a,b,c" (the generated ids), "tok/s: X" (decode rate),
 * "prefill tok/s: X" (the prompt's one forward) and, with --print-logits,
 * "logits: v0,v1,..." of the prompt's last position. --threads N (default 1)
 * runs the matrix products on N threads through colibri_set_parallel: a pool
 * of N - 1 pthreads and the caller; the results are the same bit for bit.
 * The sampling flags are colibri_sample.h's (the defaults: greedy, or for
 * colibri_demo the sampling chosen at export); the repetition penalty looks at
 * the last N ids (--repeat-last-n, default 64, at most 256, the prompt's included); a stop
 * id ends the generation (printed as the last id). The same flags and seed give
 * the same ids on every target. --chat TEXT runs one user turn through the
 * model's chat template: it needs the tokenizer (refused, exit 2, without).
 * --prompt TEXT is tokenized by the model's own tokenizer (the blob's tokenizer section, colibri_text.h)
 * into the prompt's ids; without a tokenizer, or with more ids than max_seq, it is refused (exit 2).
 * With a tokenizer the generated text is streamed ("text: ...", never a split UTF-8 character) before
 * the "tokens:" line.
 * The prompt and the tokens to generate must fit the model's max_seq positions
 * (N prompt tokens + G generated take N + G - 1): more is refused before any
 * forward pass, never cut.
 * Exit status: 0 ok, 1 I/O error, 2 usage error or bad input (a model file that
 * is not a regular file, a prompt or a generation longer than max_seq),
 * 3 colibri error.
 */
#ifndef DEMO_COMMON_H
#define DEMO_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "colibri_sample.h"

#define DEMO_CONTINUE (-1)

/* The runtime entry points the demos call: linked in, or looked up with dlsym. */
typedef struct demo_api {
    colibri_status (*arena_bytes)(const void *blob, size_t blob_len, size_t *out_bytes);
    colibri_status (*init)(colibri_ctx **ctx, void *arena, size_t arena_len, const void *blob, size_t blob_len);
    colibri_status (*forward)(colibri_ctx *ctx, const int32_t *tokens, size_t n, float *logits, size_t len);
    colibri_status (*info)(const colibri_ctx *ctx, colibri_model_info *info);
    const char *(*strerror)(colibri_status status);
    colibri_status (*set_parallel)(colibri_ctx *ctx, colibri_parallel_for_fn fn, void *user, size_t n_tasks);
    colibri_status (*sample_init)(colibri_sampler *s, const colibri_sample_params *p);
    colibri_status (*sample_next)(colibri_sampler *s, const float *logits, size_t vocab, const int32_t *recent,
                                  size_t n_recent, void *scratch, size_t scratch_len, int32_t *out);
    int (*sample_is_stop)(const colibri_sampler *s, int32_t id);
    colibri_status (*utf8_feed)(colibri_utf8 *u, const uint8_t *bytes, size_t n, colibri_utf8_kind kind,
                                uint8_t *out, size_t cap, size_t *out_len);
    colibri_status (*utf8_flush)(colibri_utf8 *u, uint8_t *out, size_t cap, size_t *out_len);
    /* Streaming text (NULL: ids only): the bytes of one id into buf (cap bytes) and their kind, 0 on
     * success. The tokenizer's decode-one-id fills it; the demo then prints "text: ..." as the ids
     * come, through colibri_utf8 (whole characters only), before the "tokens:" line. */
    int (*token_piece)(void *user, int32_t id, uint8_t *buf, size_t cap, size_t *len, colibri_utf8_kind *kind);
    void *piece_user;
    /* Text prompts (NULL: ids only): the model's tokenizer (colibri_text.h) encodes len bytes of text into
     * at most cap ids, special tokens written in the text matched whole when parse_special, returning a
     * COLIBRI_TOK_* status (COLIBRI_TOK_E_TOO_LONG past cap); tok_strerror names a status. The user
     * pointer is piece_user. */
    int (*tokenize)(void *user, const char *text, size_t len, int parse_special, int32_t *ids, size_t cap,
                    size_t *n_ids);
    const char *(*tok_strerror)(int status);
    /* --chat: the chat template's text before and after the user's (NULL: the model has no template) */
    const char *chat_prefix, *chat_suffix;
    size_t chat_prefix_len, chat_suffix_len;
} demo_api;

#define DEMO_LINKED_API \
    {colibri_arena_bytes, colibri_init, colibri_forward, colibri_info, colibri_strerror, colibri_set_parallel, \
     colibri_sample_init, colibri_sample_next, colibri_sample_is_stop, colibri_utf8_feed, colibri_utf8_flush, \
     NULL, NULL, NULL, NULL, NULL, NULL, 0, 0}
#define DEMO_MAX_THREADS 64
#define DEMO_MAX_STOP 64
#define DEMO_REPEAT_LAST_N 64
#define DEMO_PIECE_MAX 256 /* bytes of one token's text */

typedef struct demo_args {
    const char *model;          /* MODEL.bin, when the program takes one */
    const char *tokens_text;    /* the --tokens ids, checked and counted; NULL: default_tokens */
    const int32_t *default_tokens;
    size_t n_tokens;            /* ids in tokens_text, else in default_tokens */
    long generate;
    long threads;
    int print_logits;
    int no_hugepages; /* --no-hugepages: decode from the weights where they lie (demo_hugepage_copy) */
    colibri_sample_params sample; /* stop_ids points at stop */
    int32_t stop[DEMO_MAX_STOP];
    long repeat_last_n;
    const char *chat; /* --chat TEXT: one user turn through the model's chat template */
    const char *prompt_text; /* --prompt TEXT (or the program's default text): tokenized, in place of ids */
    size_t prompt_len;
} demo_args;

/* Fills a from argv (defaults first). Returns DEMO_CONTINUE, or the exit
 * status to stop with: 0 after --help, 2 after a usage error. */
int demo_parse(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
               size_t n_default, long default_generate, demo_args *a);

/* demo_parse with default sampling parameters (NULL: greedy) the flags override. */
int demo_parse_sampled(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
                       size_t n_default, long default_generate, const colibri_sample_params *default_sample,
                       demo_args *a);

/* Checks that the prompt and the generation fit the model's max_seq, then the
 * prefill of the prompt and decoding with the sampler; prints the results. The --tokens
 * ids are read into token_buf (token_cap ids, sized by the program from its
 * model), or, when token_buf is NULL, into a mapping of exactly their number.
 * logits and prompt_logits each hold vocab floats. Returns the exit status. */
int demo_run(const demo_api *api, colibri_ctx *ctx, const demo_args *a, int32_t *token_buf, size_t token_cap,
             float *logits, float *prompt_logits, size_t vocab, const char *prog, const char *name);

/* Maps an arena of exactly the size the blob needs (mmap, no malloc), inits a context on it, with the
 * weights copied by demo_hugepage_copy unless --no-hugepages (after the blob passed colibri's check, so a
 * large file that is no model is refused without a copy), and runs demo_run. Returns the exit status. */
int demo_start(const demo_api *api, const void *blob, size_t blob_len, const demo_args *a, const char *prog,
               const char *name);

/* Maps len bytes of zeroed, page-aligned memory; NULL on failure. */
void *demo_map_anon(size_t len);
/* The weights in transparent huge pages (Linux), unless --no-hugepages: a 2 MiB-aligned anonymous copy of
 * the len bytes at blob, madvise(MADV_HUGEPAGE) before its first touch, read-only once copied; the source's
 * whole pages are then dropped from this process (madvise MADV_DONTNEED: a file's or the executable's clean
 * pages, read again from the file if touched). Decode streams every weight once a token: with 4 KiB pages
 * that is a TLB miss each 4 KiB, and the hardware prefetchers stop at each page's end. Returns NULL (the
 * caller keeps blob) for a blob under 2 MiB, with THP off ("[never]") or absent, or when a mapping fails. */
const void *demo_hugepage_copy(const void *blob, size_t len);

/* "prog: name: <colibri_strerror> (status N)" on stderr; returns 3. */
int demo_fail(const demo_api *api, const char *prog, const char *name, colibri_status st);

/* "prog: name: what" on stderr; returns 1. */
int demo_io_error(const char *prog, const char *name, const char *what);

/* "prog: name: what" on stderr; returns 2 (bad input). */
int demo_bad_input(const char *prog, const char *name, const char *what);

#endif /* DEMO_COMMON_H */
