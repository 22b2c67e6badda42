/*
 * fuzz_blob.c - the model blob as hostile input: colibri_arena_bytes,
 * colibri_init (and colibri_region_bytes/colibri_init_regions, the arena split by
 * class) and a few colibri_forward calls on whatever init accepts; its
 * tokenizer section through colibri_tok_from_blob, encode and decode.
 *
 * Built two ways (tests/test_fuzz.py, tests/test_mutation.py):
 *   clang -fsanitize=fuzzer,address,undefined        libFuzzer target
 *   cc -DCB_FUZZ_MAIN -fsanitize=address,undefined    runs the files named on
 *       its command line once each and prints one status line per file
 *
 * Each input runs twice: as given, and with blob_bytes and the CRC-32 made to
 * match it. Almost every mutation breaks the CRC, so the second run is what
 * lets the fuzzer reach the header, tensor-table and plan checks behind it.
 *
 * Beyond "no crash, no sanitizer report" the target checks the API's own
 * promises and aborts when one is broken: arena_bytes and init agree, a failed
 * init leaves *ctx NULL, every error is a documented status, a failed forward
 * leaves n_past alone, and a forward that is repeated gives the same logits.
 * Test code: it may malloc.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "colibri_text.h"

#include "../src/cb_format.h"
#include "../src/cbmath.h"

/* Arenas above this are not allocated (the header is then still validated). */
#define FUZZ_MAX_ARENA ((size_t)64 << 20)
/* Positions run per input: enough for prefill, decode and SEQ_FULL on tiny max_seq. */
#define FUZZ_MAX_STEPS 12

#define FUZZ_CHECK(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "fuzz_blob.c:%d: broken promise: %s\n", __LINE__, #cond);          \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

static int fuzz_known(colibri_status st)
{
    return st >= COLIBRI_OK && st <= COLIBRI_E_DTYPE && st != COLIBRI_E_MODEL_MISMATCH;
}

static void *fuzz_alloc(size_t n) /* 64-aligned and exactly n bytes, so ASan sees a read one past the end */
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0)
        abort();
    return p;
}

/* a token in range, derived from the blob so the fuzzer can steer it */
static int32_t fuzz_token(const uint8_t *b, size_t len, size_t i, uint32_t vocab)
{
    uint32_t h = 2166136261u ^ (uint32_t)i;
    if (len > 0)
        h = (h ^ b[(i * 7919u) % len]) * 16777619u;
    return (int32_t)(h % vocab);
}

static void fuzz_forward(colibri_ctx *ctx, const uint8_t *b, size_t len)
{
    colibri_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    FUZZ_CHECK(colibri_info(ctx, &info) == COLIBRI_OK);
    FUZZ_CHECK(info.n_past == 0 && info.vocab > 0 && info.max_seq > 0 && info.blob_bytes == len);

    float *logits = fuzz_alloc((size_t)info.vocab * sizeof(float));
    float *again = fuzz_alloc((size_t)info.vocab * sizeof(float));
    int32_t tokens[FUZZ_MAX_STEPS];
    size_t steps = info.max_seq < FUZZ_MAX_STEPS ? info.max_seq : FUZZ_MAX_STEPS;
    for (size_t i = 0; i < steps; i++)
        tokens[i] = fuzz_token(b, len, i, info.vocab);

    /* misuse on a live context: refused, nothing changed */
    int32_t bad[2] = {tokens[0], info.vocab > INT32_MAX ? -1 : (int32_t)info.vocab};
    size_t n_bad = info.max_seq >= 2 ? 2 : 1; /* the length check comes before the token check */
    FUZZ_CHECK(colibri_forward(ctx, bad + 2 - n_bad, n_bad, logits, info.vocab) == COLIBRI_E_TOKEN);
    FUZZ_CHECK(colibri_forward(ctx, tokens, 1, logits, info.vocab - 1) == COLIBRI_E_ARG);
    FUZZ_CHECK(colibri_forward(ctx, tokens, (size_t)info.max_seq + 1, logits, info.vocab) == COLIBRI_E_SEQ_FULL);

    /* prefill of two, then single steps up to `steps`, then one too many */
    size_t first = steps < 2 ? steps : 2;
    FUZZ_CHECK(colibri_forward(ctx, tokens, first, logits, info.vocab) == COLIBRI_OK);
    for (size_t i = first; i < steps; i++)
        FUZZ_CHECK(colibri_forward(ctx, tokens + i, 1, i + 1 == steps ? logits : NULL, info.vocab) == COLIBRI_OK);
    FUZZ_CHECK(colibri_info(ctx, &info) == COLIBRI_OK && info.n_past == steps);
    if (steps == info.max_seq) {
        FUZZ_CHECK(colibri_forward(ctx, tokens, 1, logits, info.vocab) == COLIBRI_E_SEQ_FULL);
        FUZZ_CHECK(colibri_info(ctx, &info) == COLIBRI_OK && info.n_past == steps);
    }

    /* the same sequence after reset gives the same bits (NaN payloads included) */
    FUZZ_CHECK(colibri_reset(ctx) == COLIBRI_OK);
    FUZZ_CHECK(colibri_forward(ctx, tokens, first, again, info.vocab) == COLIBRI_OK);
    for (size_t i = first; i < steps; i++)
        FUZZ_CHECK(colibri_forward(ctx, tokens + i, 1, i + 1 == steps ? again : NULL, info.vocab) == COLIBRI_OK);
    FUZZ_CHECK(memcmp(logits, again, (size_t)info.vocab * sizeof(float)) == 0);
    free(logits);
    free(again);
}

/* The tokenizer section, whatever init said of the blob: a documented status, and on success an encode and
 * decode that stay within their buffers and give ids of the vocabulary. */
static void fuzz_text(const uint8_t *b, size_t len)
{
    static const char text[] = "Hello, w\xc3\xb6rld 123 <|endoftext|> \xe2\x96\x81x \xf0\x9f\x91\x8b\xcc\x81";
    colibri_tok t;
    int ts = colibri_tok_from_blob(&t, b, len);
    FUZZ_CHECK(ts == COLIBRI_TOK_OK || ts == COLIBRI_TOK_E_NONE || ts == COLIBRI_TOK_E_SECTION ||
               ts == COLIBRI_TOK_E_VERSION);
    FUZZ_CHECK(colibri_tok_strerror(ts) != NULL);
    if (ts != COLIBRI_TOK_OK)
        return;
    uint32_t *scratch = fuzz_alloc(COLIBRI_TOK_SCRATCH_BYTES);
    int32_t ids[64];
    size_t n = 0;
    ts = colibri_tok_encode(&t, text, sizeof text - 1, COLIBRI_TOK_PARSE_SPECIAL | COLIBRI_TOK_SPECIAL, ids,
                            sizeof ids / sizeof ids[0], &n, scratch, COLIBRI_TOK_SCRATCH_BYTES);
    FUZZ_CHECK(ts == COLIBRI_TOK_OK || ts == COLIBRI_TOK_E_TOO_LONG || ts == COLIBRI_TOK_E_SCRATCH ||
               ts == COLIBRI_TOK_E_NFC);
    FUZZ_CHECK(n <= sizeof ids / sizeof ids[0]);
    char piece[256];
    for (size_t i = 0; ts == COLIBRI_TOK_OK && i < n; i++) {
        size_t got = 0;
        FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < colibri_tok_vocab(&t));
        int ds = colibri_tok_decode(&t, ids[i], i == 0 ? COLIBRI_TOK_FIRST : 0u, piece, sizeof piece, &got);
        FUZZ_CHECK((ds == COLIBRI_TOK_OK && got <= sizeof piece) || ds == COLIBRI_TOK_E_TOO_LONG);
    }
    size_t got = 0;
    FUZZ_CHECK(colibri_tok_decode(&t, (int32_t)colibri_tok_vocab(&t), 0u, piece, sizeof piece, &got) ==
               COLIBRI_TOK_E_ID);
    free(scratch);
}

/* A blob init accepted, split by class: colibri_region_bytes agrees with init_regions, which refuses a
 * region one byte short and runs forward in three separate allocations. A plan without a range per class
 * (an older export, or a mutated offset) is refused, never trusted. */
static void fuzz_regions(const uint8_t *b, size_t len)
{
    size_t parts[COLIBRI_N_CLASSES];
    colibri_status st = colibri_region_bytes(b, len, parts, COLIBRI_N_CLASSES);
    FUZZ_CHECK(st == COLIBRI_OK || st == COLIBRI_E_BAD_PLAN);
    if (st != COLIBRI_OK)
        return;
    size_t total = 0;
    for (int c = 0; c < COLIBRI_N_CLASSES; c++) {
        FUZZ_CHECK(parts[c] > 0 && parts[c] % COLIBRI_ARENA_ALIGN == 0);
        total += parts[c];
    }
    if (total > FUZZ_MAX_ARENA)
        return;
    colibri_region r[COLIBRI_N_CLASSES];
    for (int c = 0; c < COLIBRI_N_CLASSES; c++)
        r[c] = (colibri_region){fuzz_alloc(parts[c]), parts[c]};
    colibri_ctx *ctx = NULL;
    for (int c = 0; c < COLIBRI_N_CLASSES; c++) {
        r[c].len--;
        FUZZ_CHECK(colibri_init_regions(&ctx, r, COLIBRI_N_CLASSES, b, len) == COLIBRI_E_ARENA_SMALL && ctx == NULL);
        r[c].len++;
    }
    FUZZ_CHECK(colibri_init_regions(&ctx, r, COLIBRI_N_CLASSES, b, len) == COLIBRI_OK &&
               ctx == (colibri_ctx *)r[COLIBRI_CLASS_ACTIVATIONS].ptr);
    fuzz_forward(ctx, b, len);
    for (int c = 0; c < COLIBRI_N_CLASSES; c++)
        free(r[c].ptr);
}

/* init and forward on one 64-aligned copy of the input; returns init's status */
static colibri_status fuzz_blob(const uint8_t *b, size_t len)
{
    fuzz_text(b, len);
    size_t need = 0;
    colibri_status st = colibri_arena_bytes(b, len, &need);
    FUZZ_CHECK(fuzz_known(st) && colibri_strerror(st) != NULL);

    _Alignas(64) uint8_t small[256];
    colibri_ctx *ctx = (colibri_ctx *)(void *)small; /* any non-NULL value: init must clear it */
    colibri_status st_small = colibri_init(&ctx, small, sizeof small, b, len);
    FUZZ_CHECK(fuzz_known(st_small) && st_small != COLIBRI_OK && ctx == NULL);
    if (st != COLIBRI_OK) {
        FUZZ_CHECK(st_small == st); /* the blob's own error wins over the arena's */
        return st;
    }
    FUZZ_CHECK(st_small == COLIBRI_E_ARENA_SMALL);
    FUZZ_CHECK(need > 256); /* the context's 256 bytes and at least one buffer */
    if (need > FUZZ_MAX_ARENA)
        return st;

    uint8_t *arena = fuzz_alloc(need);
    FUZZ_CHECK(colibri_init(&ctx, arena, need - 1, b, len) == COLIBRI_E_ARENA_SMALL && ctx == NULL);
    st = colibri_init(&ctx, arena, need, b, len);
    FUZZ_CHECK(st == COLIBRI_OK && ctx == (colibri_ctx *)(void *)arena);
    fuzz_forward(ctx, b, len);
    free(arena);
    fuzz_regions(b, len);
    return st;
}

/* status as given, and status with blob_bytes and CRC fixed up (-1 when too short to fix) */
static void fuzz_one(const uint8_t *data, size_t size, int *raw, int *fixed)
{
    uint8_t *b = fuzz_alloc(size);
    if (size)
        memcpy(b, data, size);
    *raw = (int)fuzz_blob(b, size);
    *fixed = -1;
    if (size >= CB_H_BLOB_BYTES + 8) {
        uint64_t n = size;
        memcpy(b + CB_H_BLOB_BYTES, &n, sizeof n);
        uint32_t crc = cb_crc32(0, b + CB_CRC_FROM, size - CB_CRC_FROM);
        memcpy(b + CB_H_CRC32, &crc, sizeof crc);
        *fixed = (int)fuzz_blob(b, size);
    }
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int raw, fixed;
    fuzz_one(data, size, &raw, &fixed);
    return 0;
}

#ifdef CB_FUZZ_MAIN
/* Runs each file once: "<raw status> <fixed status> <path>" per line. A crash
 * or a hang (SIGALRM after FUZZ_TIMEOUT seconds) ends the run; the last
 * "run <path>" line on stderr names the input. */
#include <unistd.h>

#define FUZZ_TIMEOUT 20

static int fuzz_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *data = malloc(cap);
    while (data && (got = fread(data + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            data = realloc(data, cap *= 2);
    }
    fclose(f);
    if (!data)
        abort();
    fprintf(stderr, "run %s\n", path);
    alarm(FUZZ_TIMEOUT);
    int raw, fixed;
    fuzz_one(data, n, &raw, &fixed);
    alarm(0);
    printf("%d %d %s\n", raw, fixed, path);
    fflush(stdout);
    free(data);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 0;
    for (int i = 1; i < argc; i++)
        rc |= fuzz_file(argv[i]);
    return rc;
}
#endif
