/*
 * main.c - the firmware example: the exported model, linked in (weights in
 * flash, arena in RAM), runs the prompt and length chosen at export, exactly
 * as colibri_demo does without arguments, and prints
 *
 *   tokens: a,b,c          the greedy tokens, same line as colibri_demo
 *   cycles: N              or "instructions: N" (see board.h): prefill + decode
 *   stack: N               bytes of stack used at most (high-water mark)
 *
 * Exit status: 0 ok, 3 colibri error (as colibri_demo), 4 fault.
 */
#include "board.h"
#include "colibri.h"
#include "model.h"

#define PROG "colibri_firmware"
#define N_GENERATE (COLIBRI_DEFAULT_GENERATE > 0 ? COLIBRI_DEFAULT_GENERATE : 1)

static const int32_t prompt[] = COLIBRI_DEFAULT_PROMPT;
static float logits[COLIBRI_VOCAB];
static int32_t generated[N_GENERATE];

static int32_t argmax(const float *v, size_t n) /* the first of equal maxima, as numpy's argmax */
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

static int fail(colibri_status st)
{
    board_puts("\n" PROG ": " COLIBRI_MODEL_NAME ": ");
    board_puts(colibri_strerror(st));
    board_puts(" (status ");
    board_put_dec((uint64_t)st);
    board_puts(")\n");
    return 3;
}

static void put_line(const char *label, uint64_t v)
{
    board_puts(label);
    board_puts(": ");
    board_put_dec(v);
    board_puts("\n");
}

int main(void)
{
    colibri_ctx *ctx;
    colibri_status st = colibri_model_open(&ctx); /* validates the blob, CRC included */
    if (st != COLIBRI_OK)
        return fail(st);

    /* token i comes from the logits of token i-1, so n tokens take n-1 decode steps */
    long n = 0;
    board_counter_start();
    st = colibri_forward(ctx, prompt, COLIBRI_DEFAULT_PROMPT_LEN, logits, COLIBRI_VOCAB);
    while (st == COLIBRI_OK && n < COLIBRI_DEFAULT_GENERATE) {
        generated[n] = argmax(logits, COLIBRI_VOCAB);
        if (++n == COLIBRI_DEFAULT_GENERATE)
            break;
        st = colibri_forward(ctx, &generated[n - 1], 1, logits, COLIBRI_VOCAB);
    }
    uint64_t count = board_counter();

    board_puts("tokens: ");
    for (long i = 0; i < n; i++) {
        if (i)
            board_puts(",");
        board_put_dec((uint64_t)generated[i]); /* argmax: never negative */
    }
    board_puts("\n");
    if (st != COLIBRI_OK)
        return fail(st);
    put_line(board_counter_name, count);
    put_line("stack", board_stack_used());
    return 0;
}
