/*
 * prompts.c - the firmware application of `scons TARGET=<firmware> PROMPTS=file.json` (the
 * <model>-prompts-qemu.elf image, toolchain/prompts.py): the model, linked in as in main.c, answers
 * every prompt of the generated table prompts.h in turn, greedily (the first of equal maxima, as
 * main.c), each from a fresh context (colibri_reset), and prints
 *
 *   tokens: a,b,c          one line per prompt, in the table's order: the generated tokens, up to
 *                          COLIBRI_FW_PROMPTS_GENERATE, the first stop id included
 *   prompts: N             the number of prompts answered
 *   cycles: N              or "instructions: N" (board.h): all prompts' prefill and decode
 *   stack: N               bytes of stack used at most (high-water mark)
 *
 * Exit status: 0 ok, 3 a colibri error (after a line with the status, as main.c), 4 a fault.
 */
#include "board.h"
#include "colibri.h"
#include "model.h"
#include "prompts.h"

#define PROG "colibri_firmware"

static float logits[COLIBRI_VOCAB];
static int32_t generated[COLIBRI_FW_PROMPTS_GENERATE];

static int fail(colibri_status st, uint32_t prompt)
{
    board_puts("\n" PROG ": " COLIBRI_MODEL_NAME ": prompt ");
    board_put_dec(prompt);
    board_puts(": ");
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

static int32_t argmax(size_t n_vocab)
{
    size_t best = 0;
    for (size_t i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

static int is_stop(int32_t id)
{
    for (uint32_t i = 0; i < COLIBRI_FW_PROMPTS_N_STOP; i++)
        if (colibri_fw_prompt_stop[i] == id)
            return 1;
    return 0;
}

/* One prompt's answer into generated[]; *n_out tokens. */
static colibri_status answer(colibri_ctx *ctx, uint32_t p, size_t n_vocab, long *n_out)
{
    const int32_t *ids = colibri_fw_prompt_ids + colibri_fw_prompt_start[p];
    size_t len = colibri_fw_prompt_start[p + 1] - colibri_fw_prompt_start[p];
    long n = 0;
    colibri_status st = colibri_reset(ctx);
    if (st == COLIBRI_OK)
        st = colibri_forward(ctx, ids, len, logits, n_vocab);
    while (st == COLIBRI_OK) {
        generated[n] = argmax(n_vocab);
        if (++n == COLIBRI_FW_PROMPTS_GENERATE || is_stop(generated[n - 1]))
            break;
        st = colibri_forward(ctx, &generated[n - 1], 1, logits, n_vocab);
    }
    *n_out = n;
    return st;
}

int main(void)
{
    colibri_ctx *ctx;
    size_t n_vocab = COLIBRI_VOCAB;
    uint64_t count = 0;
    colibri_status st = colibri_model_open(&ctx); /* validates the blob, CRC included */
    if (st != COLIBRI_OK)
        return fail(st, 0);
    colibri_model_info info = {.struct_size = sizeof info};
    if (colibri_info(ctx, &info) == COLIBRI_OK && info.vocab < n_vocab)
        n_vocab = info.vocab;

    for (uint32_t p = 0; p < COLIBRI_FW_N_PROMPTS; p++) {
        long n = 0;
        board_counter_start();
        st = answer(ctx, p, n_vocab, &n);
        count += board_counter();
        if (st != COLIBRI_OK)
            return fail(st, p);
        board_puts("tokens: ");
        for (long i = 0; i < n; i++) {
            if (i)
                board_puts(",");
            board_put_dec((uint64_t)generated[i]); /* an id in [0, vocab): never negative */
        }
        board_puts("\n");
    }
    put_line("prompts", COLIBRI_FW_N_PROMPTS);
    put_line(board_counter_name, count);
    put_line("stack", board_stack_used());
    return 0;
}
