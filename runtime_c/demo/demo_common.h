/*
 * demo_common.h - the command line and output shared by colibri_run (generic
 * runtime, model file) and colibri_demo (embedded model):
 *
 *   [MODEL.bin] [--tokens 3,17,42] [--generate N] [--threads N] [--print-logits]
 *
 * prints "tokens: a,b,c" (the generated ids), "tok/s: X" (decode rate),
 * "prefill tok/s: X" (the prompt's one forward) and, with --print-logits,
 * "logits: v0,v1,..." of the prompt's last position. --threads N (default 1)
 * runs the matrix products on N threads through colibri_set_parallel: a pool
 * of N - 1 pthreads and the caller; the results are the same bit for bit.
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

#define DEMO_CONTINUE (-1)

/* The runtime entry points the demos call: linked in, or looked up with dlsym. */
typedef struct demo_api {
    colibri_status (*arena_bytes)(const void *blob, size_t blob_len, size_t *out_bytes);
    colibri_status (*init)(colibri_ctx **ctx, void *arena, size_t arena_len, const void *blob, size_t blob_len);
    colibri_status (*forward)(colibri_ctx *ctx, const int32_t *tokens, size_t n, float *logits, size_t len);
    colibri_status (*info)(const colibri_ctx *ctx, colibri_model_info *info);
    const char *(*strerror)(colibri_status status);
    colibri_status (*set_parallel)(colibri_ctx *ctx, colibri_parallel_for_fn fn, void *user, size_t n_tasks);
} demo_api;

#define DEMO_LINKED_API \
    {colibri_arena_bytes, colibri_init, colibri_forward, colibri_info, colibri_strerror, colibri_set_parallel}
#define DEMO_MAX_THREADS 64

typedef struct demo_args {
    const char *model;          /* MODEL.bin, when the program takes one */
    const char *tokens_text;    /* the --tokens ids, checked and counted; NULL: default_tokens */
    const int32_t *default_tokens;
    size_t n_tokens;            /* ids in tokens_text, else in default_tokens */
    long generate;
    long threads;
    int print_logits;
} demo_args;

/* Fills a from argv (defaults first). Returns DEMO_CONTINUE, or the exit
 * status to stop with: 0 after --help, 2 after a usage error. */
int demo_parse(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
               size_t n_default, long default_generate, demo_args *a);

/* Checks that the prompt and the generation fit the model's max_seq, then the
 * prefill of the prompt and greedy decoding; prints the results. The --tokens
 * ids are read into token_buf (token_cap ids, sized by the program from its
 * model), or, when token_buf is NULL, into a mapping of exactly their number.
 * logits and prompt_logits each hold vocab floats. Returns the exit status. */
int demo_run(const demo_api *api, colibri_ctx *ctx, const demo_args *a, int32_t *token_buf, size_t token_cap,
             float *logits, float *prompt_logits, size_t vocab, const char *prog, const char *name);

/* Maps an arena of exactly the size the blob needs (mmap, no malloc), inits a
 * context on it and runs demo_run. Returns the exit status. */
int demo_start(const demo_api *api, const void *blob, size_t blob_len, const demo_args *a, const char *prog,
               const char *name);

/* Maps len bytes of zeroed, page-aligned memory; NULL on failure. */
void *demo_map_anon(size_t len);

/* "prog: name: <colibri_strerror> (status N)" on stderr; returns 3. */
int demo_fail(const demo_api *api, const char *prog, const char *name, colibri_status st);

/* "prog: name: what" on stderr; returns 1. */
int demo_io_error(const char *prog, const char *name, const char *what);

/* "prog: name: what" on stderr; returns 2 (bad input). */
int demo_bad_input(const char *prog, const char *name, const char *what);

#endif /* DEMO_COMMON_H */
