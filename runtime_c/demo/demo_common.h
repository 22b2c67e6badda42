/*
 * demo_common.h - the command line and output shared by colibri_run (generic
 * runtime, model file) and colibri_demo (embedded model):
 *
 *   [MODEL.bin] [--tokens 3,17,42] [--generate N] [--print-logits]
 *
 * prints "tokens: a,b,c" (the generated ids), "tok/s: X" (decode rate) and,
 * with --print-logits, "logits: v0,v1,..." of the prompt's last position.
 * Exit status: 0 ok, 1 I/O error, 2 usage error, 3 colibri error.
 */
#ifndef DEMO_COMMON_H
#define DEMO_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#define DEMO_MAX_TOKENS 4096
#define DEMO_CONTINUE (-1)

typedef struct demo_args {
    const char *model; /* MODEL.bin, when the program takes one */
    size_t n_tokens;
    int32_t tokens[DEMO_MAX_TOKENS];
    long generate;
    int print_logits;
} demo_args;

/* Fills a from argv (defaults first). Returns DEMO_CONTINUE, or the exit
 * status to stop with: 0 after --help, 2 after a usage error. */
int demo_parse(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
               size_t n_default, long default_generate, demo_args *a);

/* Prefill of a->tokens, then greedy decoding; prints the results. logits and
 * prompt_logits each hold vocab floats. Returns the exit status. */
int demo_run(colibri_ctx *ctx, const demo_args *a, float *logits, float *prompt_logits, size_t vocab,
             const char *prog, const char *name);

/* "prog: name: <colibri_strerror> (status N)" on stderr; returns 3. */
int demo_fail(const char *prog, const char *name, colibri_status st);

#endif /* DEMO_COMMON_H */
