/* tok_driver.c: the C tokenizer outside Python (test code: stdio and static buffers are fine here).
 *   tok_driver encode SECTION TEXTS   ids of each text (TEXTS: texts separated by a 0 byte), one line each
 *   tok_driver mutate SECTION N SEED  N mutated copies (byte flips, cuts, word overwrites): init either
 *                                     refuses with an error code or accepts, and then encode/decode run
 *                                     within bounds (run under ASan/UBSan by the test) */
#include "colibri_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SECTION (8u << 20)
static uint32_t section[MAX_SECTION / 4], mutated[MAX_SECTION / 4];
static char texts[1u << 20];
static uint32_t scratch[COLIBRI_TOK_SCRATCH_BYTES * 16 / 4];
static int32_t ids[1u << 16];

static size_t slurp(const char *path, void *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(3); }
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static uint64_t rng_state;
static uint32_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static int encode_all(const colibri_tok *t, size_t ntext, int print) {
    size_t i = 0;
    while (i < ntext) {
        size_t len = strlen(texts + i), n = 0;
        int rc = colibri_tok_encode(t, texts + i, len, COLIBRI_TOK_PARSE_SPECIAL, ids, sizeof ids / sizeof ids[0], &n,
                                    scratch, sizeof scratch);
        if (print) {
            if (rc) printf("error %d", rc);
            for (size_t k = 0; k < n; k++) printf(k ? ",%d" : "%d", (int)ids[k]);
            printf("\n");
        }
        char buf[256];
        for (size_t k = 0; k < n; k++) {
            size_t nb;
            (void)colibri_tok_decode(t, ids[k], k == 0 ? COLIBRI_TOK_FIRST : 0u, buf, sizeof buf, &nb);
        }
        i += len + 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: tok_driver encode SECTION TEXTS | mutate SECTION N SEED\n"); return 2; }
    size_t n = slurp(argv[2], section, sizeof section);
    colibri_tok t;
    if (strcmp(argv[1], "encode") == 0) {
        int rc = colibri_tok_init(&t, section, n);
        if (rc) { printf("init %d\n", rc); return 1; }
        size_t nt = slurp(argv[3], texts, sizeof texts - 1);
        texts[nt] = 0;
        return encode_all(&t, nt, 1);
    }
    if (argc < 5) return 2;
    long count = strtol(argv[3], NULL, 10);
    rng_state = strtoull(argv[4], NULL, 10);
    static const char sample[] = "Hello, world! 123 \xe2\x96\x81x \xf0\x9f\x91\x8b <s>caf\xc3\xa9\n\n  end\xff"
                                 " e\xcc\x81\xcc\xa3 \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 \xe0\xa4\x95\xe0\xa4\xbc";
    memcpy(texts, sample, sizeof sample);
    long accepted = 0, refused = 0;
    for (long it = 0; it < count; it++) {
        memcpy(mutated, section, n);
        size_t len = n;
        uint32_t kind = rnd() % 4u;
        if (kind == 0) len = rnd() % n;                                             /* cut short */
        else if (kind == 1) ((uint8_t *)mutated)[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8u)); /* a bit flip */
        else if (kind == 2) mutated[rnd() % 64u % (n / 4)] = rnd();                  /* the header */
        else mutated[rnd() % (n / 4)] = rnd() % 3u == 0 ? 0xFFFFFFFFu : rnd() % 70000u; /* any word */
        int rc = colibri_tok_init(&t, mutated, len);
        if (rc == COLIBRI_TOK_OK) { accepted++; encode_all(&t, sizeof sample, 0); }
        else if (rc == COLIBRI_TOK_E_SECTION || rc == COLIBRI_TOK_E_VERSION) refused++;
        else { printf("unexpected status %d\n", rc); return 1; }
    }
    printf("accepted %ld refused %ld\n", accepted, refused);
    return 0;
}
