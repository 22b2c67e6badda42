/*
 * contract.c - proofs of the runtime's promises about memory, threads and misuse,
 * linked against the generic runtime sources (tests/test_contract.py):
 *
 *   contract guard   MODEL.bin   the arena between PROT_NONE guard pages, flush
 *                                against each side in turn, forward to max_seq;
 *                                logits and tokens against guard pages as well
 *   contract threads MODEL.bin   two contexts on one blob in two threads give
 *                                exactly the results of running them in turn
 *   contract misuse  MODEL.bin   NULL pointers, forward before init, arena of
 *                                size 0, max_seq exceeded, bad tokens: an error
 *                                code, and the context still gives the same bits
 *
 * Every subcommand maps the blob PROT_READ, so a single write to it would end
 * the run with SIGSEGV. Prints "ok <what>" per check and "FAIL <what>" on the
 * first broken one; exit status 0 when all hold. Test code: it may malloc.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "colibri.h"

#define CANARY 0x5Au
#define MAX_STEPS 256   /* positions whose logits guard keeps (max_seq of the test models is no more) */
#define THREAD_STEPS 32 /* positions per sequence in the threads test: ThreadSanitizer is slow */

static _Atomic int n_checks; /* counted from the test threads too */

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        n_checks++;                                                                            \
        if (!(cond)) {                                                                         \
            printf("FAIL ");                                                                   \
            printf(__VA_ARGS__);                                                               \
            printf("  [%s, contract.c:%d]\n", #cond, __LINE__);                                \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define EXPECT(call, want, what)                                                               \
    do {                                                                                       \
        colibri_status got_ = (call);                                                          \
        CHECK(got_ == (want), "%s: got status %d (%s), want %d", what, (int)got_,              \
              colibri_strerror(got_), (int)(want));                                            \
    } while (0)

typedef struct model {
    const uint8_t *blob; /* PROT_READ mapping of the file */
    size_t len, need;
    uint32_t vocab, max_seq;
} model;

static void *xalloc(size_t n) /* 64-aligned */
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) {
        perror("posix_memalign");
        exit(2);
    }
    return p;
}

static model open_model(const char *path)
{
    model m;
    struct stat sb;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        perror(path);
        exit(2);
    }
    m.len = (size_t)sb.st_size;
    void *p = mmap(NULL, m.len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    m.blob = p;
    EXPECT(colibri_arena_bytes(m.blob, m.len, &m.need), COLIBRI_OK, "arena_bytes of the test model");
    uint8_t *arena = xalloc(m.need);
    colibri_ctx *c;
    colibri_model_info info = {.struct_size = sizeof info};
    EXPECT(colibri_init(&c, arena, m.need, m.blob, m.len), COLIBRI_OK, "init of the test model");
    EXPECT(colibri_info(c, &info), COLIBRI_OK, "info");
    m.vocab = info.vocab;
    m.max_seq = info.max_seq;
    free(arena);
    return m;
}

static int32_t seq_token(int which, size_t i, uint32_t vocab)
{
    return (int32_t)((which ? 13u * i + 5u : 7u * i + 1u) % vocab);
}

/* Runs `steps` single-token forwards of sequence `which`, logits of each step into out[step]. */
static void run_sequence(colibri_ctx *c, const model *m, int which, size_t steps, float *out)
{
    for (size_t i = 0; i < steps; i++) {
        int32_t t = seq_token(which, i, m->vocab);
        EXPECT(colibri_forward(c, &t, 1, out + i * m->vocab, m->vocab), COLIBRI_OK, "forward");
    }
}

/* A child writes one byte at p; true when the write was stopped (SIGSEGV, or a sanitizer's exit). */
static int write_faults(volatile uint8_t *p)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 2); /* the sanitizer's SEGV report is expected here */
        *p = 1;
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 0;
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ------------------------------------------------------------------ guard */

/* `len` usable bytes between two PROT_NONE pages; returns the first usable byte. */
static uint8_t *guarded(size_t len, size_t *span_out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t span = (len + page - 1) / page * page;
    uint8_t *base = mmap(NULL, span + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0
        || mprotect(base + page + span, page, PROT_NONE) != 0) {
        perror("mmap/mprotect");
        exit(2);
    }
    *span_out = span;
    return base + page;
}

static int cmd_guard(const model *m)
{
    size_t steps = m->max_seq < MAX_STEPS ? m->max_seq : MAX_STEPS, span, lspan, tspan;
    size_t out_bytes = steps * m->vocab * sizeof(float);
    float *results[2] = {xalloc(out_bytes), xalloc(out_bytes)};
    uint8_t *region = guarded(m->need, &span);
    /* logits and the token array end exactly at a guard page */
    uint8_t *lregion = guarded(m->vocab * sizeof(float), &lspan);
    float *logits = (float *)(void *)(lregion + lspan - m->vocab * sizeof(float));
    uint8_t *tregion = guarded(m->max_seq * sizeof(int32_t), &tspan);
    int32_t *tokens = (int32_t *)(void *)(tregion + tspan - m->max_seq * sizeof(int32_t));
    for (size_t i = 0; i < m->max_seq; i++)
        tokens[i] = seq_token(0, i, m->vocab);

    CHECK(write_faults(region - 1) && write_faults(region + span), "guard pages of the arena are not armed");
    CHECK(write_faults((volatile uint8_t *)(uintptr_t)m->blob), "the blob mapping is writable");
    printf("ok guard pages and the read-only blob mapping fault on a write\n");

    for (int place = 0; place < 2; place++) {
        /* place 0: arena starts right after the low guard; place 1: ends (64-aligned) at the high one */
        uint8_t *arena = place == 0 ? region : (uint8_t *)((uintptr_t)(region + span - m->need) & ~(uintptr_t)63);
        const char *where = place == 0 ? "low" : "high";
        memset(region, CANARY, span);
        colibri_ctx *c;
        EXPECT(colibri_init(&c, arena, m->need, m->blob, m->len), COLIBRI_OK, "init in the guarded arena");

        /* decode to max_seq, one position at a time, logits every step */
        for (size_t i = 0; i < m->max_seq; i++) {
            EXPECT(colibri_forward(c, tokens + i, 1, logits, m->vocab), COLIBRI_OK, "forward to max_seq");
            if (i < steps)
                memcpy(results[place] + i * m->vocab, logits, m->vocab * sizeof(float));
        }
        EXPECT(colibri_forward(c, tokens, 1, logits, m->vocab), COLIBRI_E_SEQ_FULL, "forward past max_seq");
        /* prefill of all max_seq positions in one call */
        EXPECT(colibri_reset(c), COLIBRI_OK, "reset");
        EXPECT(colibri_forward(c, tokens, m->max_seq, logits, m->vocab), COLIBRI_OK, "prefill of max_seq");
        if (m->max_seq <= MAX_STEPS)
            CHECK(memcmp(logits, results[place] + (steps - 1) * m->vocab, m->vocab * sizeof(float)) == 0,
                  "%s: prefill of max_seq differs from as many single steps", where);

        for (uint8_t *p = region; p < region + span; p++)
            CHECK((p >= arena && p < arena + m->need) || *p == CANARY,
                  "%s: byte %td outside the arena written", where, p - arena);
        printf("ok arena placed %s: forward to max_seq %u and back, nothing outside [arena, arena+%zu) written\n",
               where, m->max_seq, m->need);
    }
    CHECK(memcmp(results[0], results[1], out_bytes) == 0, "logits depend on where the arena is");
    printf("ok both placements give the same logits\n");
    free(results[0]);
    free(results[1]);
    return 0;
}

/* ---------------------------------------------------------------- threads */

typedef struct job {
    const model *m;
    int which;
    size_t steps;
    float *out;
    pthread_barrier_t *start;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    uint8_t *arena = xalloc(j->m->need);
    colibri_ctx *c;
    if (j->start)
        pthread_barrier_wait(j->start);
    EXPECT(colibri_init(&c, arena, j->m->need, j->m->blob, j->m->len), COLIBRI_OK, "init in a thread");
    run_sequence(c, j->m, j->which, j->steps, j->out);
    EXPECT(colibri_reset(c), COLIBRI_OK, "reset in a thread");
    run_sequence(c, j->m, j->which, j->steps, j->out + j->steps * j->m->vocab);
    free(arena);
    return NULL;
}

static int cmd_threads(const model *m, int rounds)
{
    size_t steps = m->max_seq < THREAD_STEPS ? m->max_seq : THREAD_STEPS;
    size_t bytes = 2 * steps * m->vocab * sizeof(float);
    float *seq[2], *par[2];
    for (int k = 0; k < 2; k++) {
        seq[k] = xalloc(bytes);
        par[k] = xalloc(bytes);
        job j = {m, k, steps, seq[k], NULL};
        run_job(&j); /* one after the other, on this thread */
    }
    CHECK(memcmp(seq[0], seq[0] + steps * m->vocab, bytes / 2) == 0, "a sequence differs after reset");
    CHECK(memcmp(seq[0], seq[1], bytes) != 0, "the two test sequences give the same logits");
    for (int r = 0; r < rounds; r++) {
        pthread_barrier_t start;
        pthread_t tid[2];
        job jobs[2];
        pthread_barrier_init(&start, NULL, 2);
        for (int k = 0; k < 2; k++) {
            memset(par[k], 0, bytes);
            jobs[k] = (job){m, k, steps, par[k], &start};
            CHECK(pthread_create(&tid[k], NULL, run_job, &jobs[k]) == 0, "pthread_create");
        }
        for (int k = 0; k < 2; k++)
            pthread_join(tid[k], NULL);
        pthread_barrier_destroy(&start);
        for (int k = 0; k < 2; k++)
            CHECK(memcmp(par[k], seq[k], bytes) == 0, "round %d: context %d in a thread differs from its "
                  "sequential run", r, k);
    }
    printf("ok %d rounds of two contexts in two threads on one blob: %zu positions each, bit-identical to "
           "running them in turn\n", rounds, steps);
    for (int k = 0; k < 2; k++) {
        free(seq[k]);
        free(par[k]);
    }
    return 0;
}

/* ----------------------------------------------------------------- misuse */

static void same_answer(colibri_ctx *c, const model *m, const float *want, float *logits, const char *after)
{
    colibri_model_info info = {.struct_size = sizeof info};
    EXPECT(colibri_reset(c), COLIBRI_OK, "reset");
    run_sequence(c, m, 0, 3, logits);
    CHECK(memcmp(logits, want, 3 * m->vocab * sizeof(float)) == 0, "after %s the context gives other logits",
          after);
    EXPECT(colibri_info(c, &info), COLIBRI_OK, "info");
    CHECK(info.n_past == 3, "after %s n_past is %u, want 3", after, info.n_past);
}

/* A parallel_for on the calling thread that runs the tasks last to first: the order tasks run
 * in must not change a bit. *user counts the tasks run. */
static void reverse_for(colibri_task_fn fn, void *task_ctx, size_t n_tasks, void *user)
{
    for (size_t i = n_tasks; i-- > 0;)
        fn(task_ctx, i);
    *(size_t *)user += n_tasks;
}

static int cmd_misuse(const model *m)
{
    const size_t V = m->vocab;
    uint8_t *arena = xalloc(m->need), *other = xalloc(m->need + 64);
    float *want = xalloc(3 * V * sizeof(float)), *logits = xalloc(3 * V * sizeof(float));
    colibri_ctx *c = NULL, *c2;
    colibri_model_info info = {.struct_size = sizeof info};
    size_t n;
    int32_t tok = 1;

    /* NULL pointers */
    EXPECT(colibri_arena_bytes(NULL, m->len, &n), COLIBRI_E_NULL, "arena_bytes(NULL blob)");
    EXPECT(colibri_arena_bytes(m->blob, m->len, NULL), COLIBRI_E_NULL, "arena_bytes(NULL out)");
    EXPECT(colibri_init(NULL, arena, m->need, m->blob, m->len), COLIBRI_E_NULL, "init(NULL ctx)");
    c2 = (colibri_ctx *)(void *)other;
    EXPECT(colibri_init(&c2, NULL, m->need, m->blob, m->len), COLIBRI_E_NULL, "init(NULL arena)");
    CHECK(c2 == NULL, "a failed init left *ctx set");
    c2 = (colibri_ctx *)(void *)other;
    EXPECT(colibri_init(&c2, arena, m->need, NULL, m->len), COLIBRI_E_NULL, "init(NULL blob)");
    CHECK(c2 == NULL, "a failed init left *ctx set");
    EXPECT(colibri_forward(NULL, &tok, 1, logits, V), COLIBRI_E_NULL, "forward(NULL ctx)");
    EXPECT(colibri_reset(NULL), COLIBRI_E_NULL, "reset(NULL)");
    EXPECT(colibri_info(NULL, &info), COLIBRI_E_NULL, "info(NULL ctx)");
    for (int s = -1; s <= COLIBRI_E_DTYPE + 2; s++)
        CHECK(colibri_strerror((colibri_status)s) != NULL && colibri_strerror((colibri_status)s)[0] != '\0',
              "strerror(%d)", s);
    printf("ok NULL pointers: COLIBRI_E_NULL; strerror has a string for every value\n");

    /* forward before init: zeroed, garbage and copied arenas */
    for (int fill = 0; fill < 2; fill++) {
        memset(arena, fill ? 0xA5 : 0, m->need);
        c2 = (colibri_ctx *)(void *)arena;
        EXPECT(colibri_forward(c2, &tok, 1, logits, V), COLIBRI_E_NOT_INIT, "forward before init");
        EXPECT(colibri_reset(c2), COLIBRI_E_NOT_INIT, "reset before init");
        EXPECT(colibri_info(c2, &info), COLIBRI_E_NOT_INIT, "info before init");
    }
    EXPECT(colibri_init(&c, arena, m->need, m->blob, m->len), COLIBRI_OK, "init");
    memcpy(other, arena, m->need);
    EXPECT(colibri_forward((colibri_ctx *)(void *)other, &tok, 1, logits, V), COLIBRI_E_NOT_INIT,
           "forward on a copied arena");
    printf("ok forward/reset/info before init (zeroed, garbage, copied arena): COLIBRI_E_NOT_INIT\n");

    /* arenas and blobs that cannot work */
    c2 = (colibri_ctx *)(void *)other;
    EXPECT(colibri_init(&c2, other, 0, m->blob, m->len), COLIBRI_E_ARENA_SMALL, "arena of size 0");
    CHECK(c2 == NULL, "a failed init left *ctx set");
    EXPECT(colibri_init(&c2, other, m->need - 1, m->blob, m->len), COLIBRI_E_ARENA_SMALL, "arena one byte short");
    EXPECT(colibri_init(&c2, other + 16, m->need, m->blob, m->len), COLIBRI_E_ARENA_ALIGN, "misaligned arena");
    EXPECT(colibri_init(&c2, other, m->need, m->blob + 8, m->len - 8), COLIBRI_E_BLOB_ALIGN, "misaligned blob");
    EXPECT(colibri_init(&c2, other, m->need, m->blob, 0), COLIBRI_E_TRUNCATED, "blob of length 0");
    EXPECT(colibri_init(&c2, other, m->need, m->blob, m->len - 1), COLIBRI_E_TRUNCATED, "blob one byte short");
    printf("ok arena of size 0 / too small / misaligned, blob misaligned / short: their codes\n");

    /* misuse of a live context: refused, nothing changed */
    run_sequence(c, m, 0, 3, want);
    EXPECT(colibri_reset(c), COLIBRI_OK, "reset");
    EXPECT(colibri_forward(c, &tok, 0, logits, V), COLIBRI_E_ARG, "forward of 0 tokens");
    EXPECT(colibri_forward(c, NULL, 1, logits, V), COLIBRI_E_NULL, "forward(NULL tokens)");
    EXPECT(colibri_forward(c, &tok, 1, logits, V - 1), COLIBRI_E_ARG, "logits buffer one short");
    EXPECT(colibri_forward(c, &tok, 1, logits, 0), COLIBRI_E_ARG, "logits buffer of length 0");
    EXPECT(colibri_forward(c, &tok, SIZE_MAX, logits, V), COLIBRI_E_SEQ_FULL, "SIZE_MAX tokens");
    EXPECT(colibri_forward(c, &tok, (size_t)m->max_seq + 1, logits, V), COLIBRI_E_SEQ_FULL, "max_seq+1 tokens");
    const int32_t bad[] = {-1, (int32_t)V, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        EXPECT(colibri_forward(c, &bad[i], 1, logits, V), COLIBRI_E_TOKEN, "out-of-range token");
    if (m->max_seq >= 3) {
        int32_t batch[3] = {1, 2, (int32_t)V};
        EXPECT(colibri_forward(c, batch, 3, logits, V), COLIBRI_E_TOKEN, "bad token at the end of a batch");
    }
    info.struct_size = 4;
    EXPECT(colibri_info(c, &info), COLIBRI_E_ARG, "info with a short struct_size");
    struct { colibri_model_info info; uint32_t tail; } big;
    memset(&big, 0xEE, sizeof big);
    big.info.struct_size = sizeof big;
    EXPECT(colibri_info(c, &big.info), COLIBRI_OK, "info with a larger struct_size");
    CHECK(big.tail == 0xEEEEEEEEu && big.info.n_past == 0 && big.info.vocab == V, "info wrote past its struct");
    info.struct_size = sizeof info;
    same_answer(c, m, want, logits, "every refused call");
    printf("ok 0 tokens, NULL tokens, short logits, SIZE_MAX / max_seq+1 tokens, 5 bad tokens: refused, "
           "context unchanged\n");

    /* the parallel hook: NULL context refused; tasks in any order give the same bits */
    size_t n_tasks_run = 0;
    EXPECT(colibri_set_parallel(NULL, reverse_for, &n_tasks_run, 3), COLIBRI_E_NULL, "set_parallel(NULL ctx)");
    for (size_t tasks = 2; tasks <= 7; tasks += 5) {
        EXPECT(colibri_set_parallel(c, reverse_for, &n_tasks_run, tasks), COLIBRI_OK, "set_parallel");
        same_answer(c, m, want, logits, "a parallel hook running its tasks last to first");
    }
    EXPECT(colibri_set_parallel(c, NULL, NULL, 0), COLIBRI_OK, "set_parallel(NULL) removes the hook");
    same_answer(c, m, want, logits, "removing the parallel hook");
    printf("ok parallel hook (2 and 7 tasks, run last to first; %zu tasks): same bits as without it\n",
           n_tasks_run);

    /* max_seq exceeded, step by step */
    EXPECT(colibri_reset(c), COLIBRI_OK, "reset");
    for (size_t i = 0; i < m->max_seq; i++)
        EXPECT(colibri_forward(c, &tok, 1, NULL, 0), COLIBRI_OK, "forward up to max_seq");
    EXPECT(colibri_forward(c, &tok, 1, logits, V), COLIBRI_E_SEQ_FULL, "forward at max_seq");
    EXPECT(colibri_info(c, &info), COLIBRI_OK, "info");
    CHECK(info.n_past == m->max_seq, "n_past %u after SEQ_FULL", info.n_past);
    same_answer(c, m, want, logits, "SEQ_FULL and reset");
    printf("ok max_seq exceeded: COLIBRI_E_SEQ_FULL, n_past stays max_seq, reset makes it usable\n");

    /* a failed init on the live context's arena leaves that context working */
    uint8_t *copy = xalloc(m->len);
    memcpy(copy, m->blob, m->len);
    copy[m->len - 1] ^= 1;
    EXPECT(colibri_init(&c2, arena, m->need, copy, m->len), COLIBRI_E_CRC, "init of a corrupt blob");
    EXPECT(colibri_init(&c2, arena, 0, m->blob, m->len), COLIBRI_E_ARENA_SMALL, "init with arena 0");
    EXPECT(colibri_init(&c2, arena + 64, m->need - 64, m->blob, m->len), COLIBRI_E_ARENA_SMALL,
           "init into the live arena, too small");
    same_answer(c, m, want, logits, "failed inits on its arena");
    printf("ok failed inits on a live context's arena leave it working\n");
    free(copy);
    free(arena);
    free(other);
    free(want);
    free(logits);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: contract guard|threads|misuse MODEL.bin\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    model m = open_model(argv[2]);
    int rc;
    if (strcmp(argv[1], "guard") == 0)
        rc = cmd_guard(&m);
    else if (strcmp(argv[1], "threads") == 0)
        rc = cmd_threads(&m, 3);
    else if (strcmp(argv[1], "misuse") == 0)
        rc = cmd_misuse(&m);
    else {
        fprintf(stderr, "contract: unknown command %s\n", argv[1]);
        return 2;
    }
    printf("%s: %d checks passed\n", argv[1], (int)n_checks);
    return rc;
}
