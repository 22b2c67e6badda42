/*
 * main.c - the firmware example: the exported model, linked in (weights in
 * flash, arena in RAM), runs the prompt, length and sampling chosen at export
 * (colibri.json's "sampling": greedy by default; otherwise colibri_sample.h's
 * sampler with the exported seed), exactly as colibri_demo does without
 * arguments, and prints
 *
 *   tokens: a,b,c          the generated tokens, same line as colibri_demo
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

#if COLIBRI_DEFAULT_SAMPLING
#include "colibri_sample.h"

#define WINDOW 64 /* the repetition penalty's window, prompt included, as colibri_demo's default */
#define N_HISTORY (COLIBRI_DEFAULT_PROMPT_LEN + N_GENERATE)
static const int32_t stop_ids[] = COLIBRI_DEFAULT_STOP;
static int32_t history[N_HISTORY];
static _Alignas(8) unsigned char scratch[COLIBRI_SAMPLE_SCRATCH_BYTES(COLIBRI_VOCAB)];
static colibri_sampler sampler;

static colibri_status sampler_open(void)
{
    const colibri_sample_params p = {COLIBRI_DEFAULT_TEMPERATURE, COLIBRI_DEFAULT_TOP_K, COLIBRI_DEFAULT_TOP_P,
                                     COLIBRI_DEFAULT_MIN_P, COLIBRI_DEFAULT_REPEAT_PENALTY, COLIBRI_DEFAULT_SEED,
                                     stop_ids, COLIBRI_DEFAULT_N_STOP};
    for (size_t i = 0; i < COLIBRI_DEFAULT_PROMPT_LEN; i++)
        history[i] = prompt[i];
    return colibri_sample_init(&sampler, &p);
}

/* The n-th generated id (history holds the prompt, then the ids so far); *stop when it is a stop id. */
static colibri_status next_token(long n, int32_t *out, int *stop)
{
    size_t have = COLIBRI_DEFAULT_PROMPT_LEN + (size_t)n;
    size_t n_recent = COLIBRI_DEFAULT_REPEAT_PENALTY != 1.0f ? (have < WINDOW ? have : WINDOW) : 0;
    colibri_status st = colibri_sample_next(&sampler, logits, COLIBRI_VOCAB, history + have - n_recent, n_recent,
                                            scratch, sizeof scratch, out);
    history[have] = *out;
    *stop = colibri_sample_is_stop(&sampler, *out);
    return st;
}
#else
static colibri_status sampler_open(void)
{
    return COLIBRI_OK;
}

/* Greedy: the first of equal maxima, as numpy's argmax (and colibri_sample at temperature 0). */
static colibri_status next_token(long n, int32_t *out, int *stop)
{
    size_t best = 0;
    (void)n;
    for (size_t i = 1; i < COLIBRI_VOCAB; i++)
        if (logits[i] > logits[best])
            best = i;
    *out = (int32_t)best;
    *stop = 0;
    return COLIBRI_OK;
}
#endif

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
    int stop = 0;
    if ((st = sampler_open()) != COLIBRI_OK)
        return fail(st);
    board_counter_start();
    st = colibri_forward(ctx, prompt, COLIBRI_DEFAULT_PROMPT_LEN, logits, COLIBRI_VOCAB);
    while (st == COLIBRI_OK && n < COLIBRI_DEFAULT_GENERATE) {
        st = next_token(n, &generated[n], &stop);
        if (st != COLIBRI_OK || ++n == COLIBRI_DEFAULT_GENERATE || stop)
            break;
        st = colibri_forward(ctx, &generated[n - 1], 1, logits, COLIBRI_VOCAB);
    }
    uint64_t count = board_counter();

    board_puts("tokens: ");
    for (long i = 0; i < n; i++) {
        if (i)
            board_puts(",");
        board_put_dec((uint64_t)generated[i]); /* an id in [0, vocab): never negative */
    }
    board_puts("\n");
    if (st != COLIBRI_OK)
        return fail(st);
    put_line(board_counter_name, count);
    put_line("stack", board_stack_used());
    return 0;
}
