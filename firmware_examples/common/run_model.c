/*
 * run_model.c - one model of an image holding several (`scons MODEL=a,b`, toolchain/multimodel.py):
 * compiled once per model against that model's model.h (-DCOLIBRI_MULTI_MODEL), it defines
 * colibri_fw_run_<id>(), which opens the model through its own prefix (colibri_<id>_open), runs
 * its built-in prompt and length greedily and prints
 *
 *   tokens <id>: a,b,c     the generated tokens, as colibri_demo prints that model's
 *
 * The generated main (models_main.c) calls each in turn: the models run one at a time, so they
 * may share one arena (ARENA=shared, the default). Returns 0, or 3 after a line with the status.
 */
#include "board.h"
#include "colibri.h"
#include "model.h"

#define CAT_(a, b, c) a##b##c
#define CAT(a, b, c) CAT_(a, b, c)
#define RUN CAT(colibri_fw_run_, COLIBRI_MODEL_ID, )
#define OPEN CAT(colibri_, COLIBRI_MODEL_ID, _open)
#define N_GENERATE (COLIBRI_DEFAULT_GENERATE > 0 ? COLIBRI_DEFAULT_GENERATE : 1)

int RUN(void);

static const int32_t prompt[] = COLIBRI_DEFAULT_PROMPT;
static float logits[COLIBRI_VOCAB];
static int32_t generated[N_GENERATE];

static int32_t argmax(void)
{
    size_t best = 0;
    for (size_t i = 1; i < COLIBRI_VOCAB; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

int RUN(void)
{
    colibri_ctx *ctx;
    long n = 0;
    colibri_status st = OPEN(&ctx);
    if (st == COLIBRI_OK)
        st = colibri_forward(ctx, prompt, COLIBRI_DEFAULT_PROMPT_LEN, logits, COLIBRI_VOCAB);
    while (st == COLIBRI_OK && n < COLIBRI_DEFAULT_GENERATE) {
        generated[n] = argmax();
        if (++n == COLIBRI_DEFAULT_GENERATE)
            break;
        st = colibri_forward(ctx, &generated[n - 1], 1, logits, COLIBRI_VOCAB);
    }
    if (st != COLIBRI_OK) {
        board_puts("colibri_firmware: " COLIBRI_MODEL_NAME ": ");
        board_puts(colibri_strerror(st));
        board_puts(" (status ");
        board_put_dec((uint64_t)st);
        board_puts(")\n");
        return 3;
    }
    board_puts("tokens " COLIBRI_MODEL_NAME ": ");
    for (long i = 0; i < n; i++) {
        if (i)
            board_puts(",");
        board_put_dec((uint64_t)generated[i]);
    }
    board_puts("\n");
    return 0;
}
