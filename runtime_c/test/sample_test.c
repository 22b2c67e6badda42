/*
 * sample_test.c - the sampler's draws on a fixed set of logits, for the cross-target
 * test (tests/test_sample_targets.py): the same lines on every target, bit for bit.
 *
 * Logits: V = 1000 ids, multiples of 1/256 in [-7.8, 7.8] from an integer hash (so
 * exact in float on every target, with ties), a few ids masked with -inf; each step
 * rotates them by 31 ids. Each configuration draws STEPS ids, the last 16 drawn as
 * the penalty window, and prints "config N: id,id,...". Then "rand 7: " and the first
 * four PRNG values for seed 7 in hex. Built with -DCB_TEST_BARE_METAL it is a
 * firmware image's main (the semihosting console of firmware_examples/common).
 */
#include <float.h>
#include <stdint.h>

#include "colibri_sample.h"

#define V 1000
#define STEPS 48
#define WINDOW 16

#if defined(CB_TEST_BARE_METAL)
#include "board.h"
static void put_str(const char *s) { board_puts(s); }
static void put_u64(uint64_t v) { board_put_dec(v); }
#else
#include <stdio.h>
static void put_str(const char *s) { fputs(s, stdout); }
static void put_u64(uint64_t v) { printf("%llu", (unsigned long long)v); }
#endif

static void put_hex64(uint64_t v)
{
    char s[17];
    for (int i = 15; i >= 0; i--, v >>= 4)
        s[i] = "0123456789abcdef"[v & 15u];
    s[16] = '\0';
    put_str(s);
}

static float base[V], logits[V];
static _Alignas(8) unsigned char scratch[COLIBRI_SAMPLE_SCRATCH_BYTES(V)];

typedef struct cfg {
    float t;
    uint32_t k;
    float p, m, r;
    uint64_t seed;
} cfg;

static const cfg CONFIGS[] = {
    {0.0f, 0, 1.0f, 0.0f, 1.0f, 0},     {0.0f, 0, 1.0f, 0.0f, 1.5f, 0},    {1.0f, 0, 1.0f, 0.0f, 1.0f, 0},
    {1.0f, 0, 1.0f, 0.0f, 1.0f, 7},     {0.8f, 40, 1.0f, 0.0f, 1.0f, 7},   {1.0f, 0, 0.9f, 0.0f, 1.0f, 123456789},
    {0.7f, 0, 1.0f, 0.05f, 1.0f, 42},   {1.3f, 50, 0.95f, 0.02f, 1.3f, 7}, {2.5f, 3, 1.0f, 0.0f, 0.8f, 99},
    {0.05f, 0, 0.5f, 0.5f, 1.1f, 2026},
};

int main(void)
{
    uint32_t h = 12345u;
    for (int i = 0; i < V; i++) {
        h = h * 1664525u + 1013904223u;
        base[i] = (float)((int32_t)((h >> 8) % 4001u) - 2000) / 256.0f;
    }
    for (int i = 0; i < V; i += 97)
        base[i] = -FLT_MAX * 2.0f; /* -inf */
    int fail = 0;
    for (size_t c = 0; c < sizeof CONFIGS / sizeof *CONFIGS; c++) {
        const cfg *g = &CONFIGS[c];
        colibri_sample_params p = colibri_sample_defaults();
        p.temperature = g->t;
        p.top_k = g->k;
        p.top_p = g->p;
        p.min_p = g->m;
        p.repeat_penalty = g->r;
        p.seed = g->seed;
        colibri_sampler s;
        int32_t drawn[STEPS];
        if (colibri_sample_init(&s, &p) != COLIBRI_OK)
            fail = 1;
        put_str("config ");
        put_u64(c);
        put_str(": ");
        for (int i = 0; i < STEPS && !fail; i++) {
            for (int j = 0; j < V; j++)
                logits[j] = base[(j + 31 * i) % V];
            size_t n_recent = i < WINDOW ? (size_t)i : WINDOW;
            if (colibri_sample_next(&s, logits, V, drawn + i - n_recent, n_recent, scratch, sizeof scratch,
                                    &drawn[i]) != COLIBRI_OK) {
                fail = 1;
                break;
            }
            if (i)
                put_str(",");
            put_u64((uint64_t)drawn[i]);
        }
        put_str("\n");
    }
    colibri_sample_params p = colibri_sample_defaults();
    p.seed = 7;
    colibri_sampler s;
    colibri_sample_init(&s, &p);
    put_str("rand 7:");
    for (int i = 0; i < 4; i++) {
        put_str(" ");
        put_hex64(colibri_sample_rand(&s));
    }
    put_str("\n");
    if (fail)
        put_str("sample_test: a colibri_sample call failed\n");
    return fail;
}
