/*
 * colibri_demo - runs the model linked into this program (generated model.h,
 * model.c and blob), on its static arena:
 *
 *   colibri_demo [--tokens 3,17,42] [--generate N] [--print-logits] [--temperature T] [--top-k K]
 *                [--top-p P] [--min-p M] [--repeat-penalty R] [--seed S] [--stop 2,5]
 *
 * Without arguments it runs the prompt, length and sampling chosen at export
 * (colibri.json's "prompt", "generate", "sampling"); the flags override each.
 */
#include "colibri.h"
#include "demo_common.h"
#include "model.h"

#define PROG "colibri_demo"
#ifdef COLIBRI_MODEL_NAME
#define NAME COLIBRI_MODEL_NAME
#else
#define NAME "embedded model"
#endif

int main(int argc, char **argv)
{
    static demo_args a;
    static const int32_t default_tokens[] = COLIBRI_DEFAULT_PROMPT;
    static float logits[COLIBRI_VOCAB], prompt_logits[COLIBRI_VOCAB];
    static int32_t tokens[COLIBRI_MAX_SEQ]; /* --tokens: at most the model's positions */
    static const demo_api api = DEMO_LINKED_API;
    static const int32_t default_stop[] = COLIBRI_DEFAULT_STOP;
    static const colibri_sample_params default_sample = {
        COLIBRI_DEFAULT_TEMPERATURE, COLIBRI_DEFAULT_TOP_K, COLIBRI_DEFAULT_TOP_P, COLIBRI_DEFAULT_MIN_P,
        COLIBRI_DEFAULT_REPEAT_PENALTY, COLIBRI_DEFAULT_SEED, default_stop, COLIBRI_DEFAULT_N_STOP};
    int rc = demo_parse_sampled(argc, argv, PROG, 0, default_tokens, COLIBRI_DEFAULT_PROMPT_LEN,
                                COLIBRI_DEFAULT_GENERATE, &default_sample, &a);
    if (rc != DEMO_CONTINUE)
        return rc;
    colibri_ctx *ctx;
    colibri_status st = colibri_model_open(&ctx);
    if (st != COLIBRI_OK)
        return demo_fail(&api, PROG, NAME, st);
    return demo_run(&api, ctx, &a, tokens, COLIBRI_MAX_SEQ, logits, prompt_logits, COLIBRI_VOCAB, PROG, NAME);
}
