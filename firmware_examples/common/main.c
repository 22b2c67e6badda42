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
 * With a text prompt (colibri.json "prompt": "text") the blob's tokenizer section turns it into ids on
 * the device (colibri_text.h) and two lines come first:
 *
 *   prompt: a,b,c          the prompt's ids, as `colibri tokenize` gives them
 *   text: ...              the generated text, streamed as the ids come (whole UTF-8 characters)
 *
 * Without one, none of the tokenizer is linked (--gc-sections drops it).
 * Exit status: 0 ok, 2 the text prompt does not tokenize (over max_seq ids), 3 colibri error (as
 * colibri_demo), 4 fault.
 */
#include "board.h"
#include "colibri.h"
#include "model.h"

#define PROG "colibri_firmware"
#define N_GENERATE (COLIBRI_DEFAULT_GENERATE > 0 ? COLIBRI_DEFAULT_GENERATE : 1)
#define TEXT_PROMPT (COLIBRI_DEFAULT_PROMPT_TEXT_LEN > 0)

#if TEXT_PROMPT
#include "colibri_sample.h"
#include "colibri_text.h"

#define PROMPT_CAP COLIBRI_MAX_SEQ
static const unsigned char prompt_text[] = COLIBRI_DEFAULT_PROMPT_TEXT;
static int32_t prompt[PROMPT_CAP];
static size_t prompt_len;
static colibri_tok tok;
static uint32_t tok_scratch[COLIBRI_TOK_SCRATCH_BYTES / 4];
static colibri_utf8 utf8;
static uint8_t piece[256];
static uint8_t text_out[COLIBRI_UTF8_OUT_MAX(sizeof piece) + 1];

/* The text prompt into prompt[]; prints "prompt: ids". Returns a COLIBRI_TOK_* status. */
static int text_open(void)
{
    size_t blob_len;
    const void *blob = colibri_model_blob(&blob_len);
    int st = colibri_tok_from_blob(&tok, blob, blob_len);
    if (st == COLIBRI_TOK_OK)
        st = colibri_tok_encode(&tok, (const char *)prompt_text, COLIBRI_DEFAULT_PROMPT_TEXT_LEN,
                                COLIBRI_TOK_PARSE_SPECIAL, prompt, PROMPT_CAP, &prompt_len, tok_scratch,
                                sizeof tok_scratch);
    if (st != COLIBRI_TOK_OK)
        return st;
    board_puts("prompt: ");
    for (size_t i = 0; i < prompt_len; i++) {
        if (i)
            board_puts(",");
        board_put_dec((uint64_t)prompt[i]);
    }
    board_puts("\ntext: ");
    colibri_utf8_init(&utf8);
    return COLIBRI_TOK_OK;
}

/* The text of one generated id (final: what the stream still holds), as soon as it is whole. A NUL
 * byte in the text ends what board_puts prints of that piece. */
static void text_put(int32_t id, int final)
{
    size_t n = 0, n_out = 0;
    if (final)
        colibri_utf8_flush(&utf8, text_out, sizeof text_out - 1, &n_out);
    else if (colibri_tok_decode(&tok, id, 0, (char *)piece, sizeof piece, &n) == COLIBRI_TOK_OK)
        colibri_utf8_feed(&utf8, piece, n, COLIBRI_UTF8_TEXT, text_out, sizeof text_out - 1, &n_out);
    text_out[n_out] = 0;
    board_puts((const char *)text_out);
    if (final)
        board_puts("\n");
}
#define PROMPT_LEN prompt_len
#else
#define PROMPT_CAP COLIBRI_DEFAULT_PROMPT_LEN
static const int32_t prompt[] = COLIBRI_DEFAULT_PROMPT;
#define PROMPT_LEN ((size_t)COLIBRI_DEFAULT_PROMPT_LEN)
#endif

static float logits[COLIBRI_VOCAB];
/* The blob's vocabulary: COLIBRI_VOCAB, or in a generic application (PARTITION=model GENERIC=1) that of
 * the partition's model when smaller (a larger one is COLIBRI_E_ARG: the logits hold COLIBRI_VOCAB). */
static size_t n_vocab = COLIBRI_VOCAB;
static int32_t generated[N_GENERATE];

#if COLIBRI_DEFAULT_SAMPLING
#include "colibri_sample.h"

#define WINDOW 64 /* the repetition penalty's window, prompt included, as colibri_demo's default */
#define N_HISTORY (PROMPT_CAP + N_GENERATE)
static const int32_t stop_ids[] = COLIBRI_DEFAULT_STOP;
static int32_t history[N_HISTORY];
static _Alignas(8) unsigned char scratch[COLIBRI_SAMPLE_SCRATCH_BYTES(COLIBRI_VOCAB)];
static colibri_sampler sampler;

static colibri_status sampler_open(void)
{
    const colibri_sample_params p = {COLIBRI_DEFAULT_TEMPERATURE, COLIBRI_DEFAULT_TOP_K, COLIBRI_DEFAULT_TOP_P,
                                     COLIBRI_DEFAULT_MIN_P, COLIBRI_DEFAULT_REPEAT_PENALTY, COLIBRI_DEFAULT_SEED,
                                     stop_ids, COLIBRI_DEFAULT_N_STOP};
    for (size_t i = 0; i < PROMPT_LEN; i++)
        history[i] = prompt[i];
    return colibri_sample_init(&sampler, &p);
}

/* The n-th generated id (history holds the prompt, then the ids so far); *stop when it is a stop id. */
static colibri_status next_token(long n, int32_t *out, int *stop)
{
    size_t have = PROMPT_LEN + (size_t)n;
    size_t n_recent = COLIBRI_DEFAULT_REPEAT_PENALTY != 1.0f ? (have < WINDOW ? have : WINDOW) : 0;
    colibri_status st = colibri_sample_next(&sampler, logits, n_vocab, history + have - n_recent, n_recent,
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
    for (size_t i = 1; i < n_vocab; i++)
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
    colibri_model_info info = {.struct_size = sizeof info};
    if (colibri_info(ctx, &info) == COLIBRI_OK && info.vocab < n_vocab)
        n_vocab = info.vocab;

    /* token i comes from the logits of token i-1, so n tokens take n-1 decode steps */
    long n = 0;
    int stop = 0;
#if TEXT_PROMPT
    int ts = text_open();
    if (ts != COLIBRI_TOK_OK) {
        board_puts(PROG ": " COLIBRI_MODEL_NAME ": prompt: ");
        board_puts(colibri_tok_strerror(ts));
        board_puts("\n");
        return 2;
    }
#endif
    if ((st = sampler_open()) != COLIBRI_OK)
        return fail(st);
    board_counter_start();
    st = colibri_forward(ctx, prompt, PROMPT_LEN, logits, n_vocab);
    while (st == COLIBRI_OK && n < COLIBRI_DEFAULT_GENERATE) {
        st = next_token(n, &generated[n], &stop);
#if TEXT_PROMPT
        if (st == COLIBRI_OK && !stop)
            text_put(generated[n], 0);
#endif
        if (st != COLIBRI_OK || ++n == COLIBRI_DEFAULT_GENERATE || stop)
            break;
        st = colibri_forward(ctx, &generated[n - 1], 1, logits, n_vocab);
    }
    uint64_t count = board_counter();
#if TEXT_PROMPT
    text_put(0, 1);
#endif

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
