/*
 * colibri_demo - runs the model linked into this program (generated model.h,
 * model.c and blob), on its static arena:
 *
 *   colibri_demo [--tokens 3,17,42] [--generate N] [--print-logits]
 *
 * Without arguments it runs the prompt and length chosen at export.
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
    int rc = demo_parse(argc, argv, PROG, 0, default_tokens, COLIBRI_DEFAULT_PROMPT_LEN,
                        COLIBRI_DEFAULT_GENERATE, &a);
    if (rc != DEMO_CONTINUE)
        return rc;
    colibri_ctx *ctx;
    colibri_status st = colibri_model_open(&ctx);
    if (st != COLIBRI_OK)
        return demo_fail(&api, PROG, NAME, st);
    return demo_run(&api, ctx, &a, tokens, COLIBRI_MAX_SEQ, logits, prompt_logits, COLIBRI_VOCAB, PROG, NAME);
}
