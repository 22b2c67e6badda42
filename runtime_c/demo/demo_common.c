/* demo_common.c - see demo_common.h. Programs, not the runtime: libc is fine here. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L

#include "demo_common.h"

#include "colibri_text.h" /* the status codes only: the tokenizer comes through demo_api */

#include <sys/mman.h>

#include <pthread.h>
#include <stdatomic.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void demo_usage(FILE *f, const char *prog, int want_model)
{
    fprintf(f, "usage: %s%s [--tokens 3,17,42 | --prompt TEXT] [--generate N] [--threads N] [--print-logits]\n"
               "       [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R]\n"
               "       [--repeat-last-n N] [--seed S] [--stop 2,5] [--chat TEXT] [--no-hugepages]\n", prog,
            want_model ? " MODEL.bin" : "");
}

static int demo_bad(const char *prog, int want_model, const char *what, const char *arg)
{
    fprintf(stderr, "%s: %s%s%s\n", prog, what, arg ? ": " : "", arg ? arg : "");
    demo_usage(stderr, prog, want_model);
    return 2;
}

/* A decimal integer in [lo, hi] filling the whole of [s, end). */
static int demo_long(const char *s, const char **end, long lo, long hi, long *out)
{
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (e == s || errno == ERANGE || v < lo || v > hi)
        return 0;
    *end = e;
    *out = v;
    return 1;
}

/* Comma-separated int32 ids: counts them into *n and, when out is not NULL, stores them there
 * (room for *n ids, counted by a first call). Returns 0 when s is malformed. */
static int demo_tokens(const char *s, int32_t *out, size_t *n)
{
    *n = 0;
    for (;;) {
        long v;
        if (!demo_long(s, &s, INT32_MIN, INT32_MAX, &v))
            return 0;
        if (out)
            out[*n] = (int32_t)v; /* range is colibri's to judge (E_TOKEN) */
        ++*n;
        if (*s == '\0')
            return 1;
        if (*s++ != ',')
            return 0;
    }
}

/* A finite float in [lo, hi] (lo excluded when open_lo) filling the whole of s. */
static int demo_float(const char *s, float lo, float hi, int open_lo, float *out)
{
    char *e;
    errno = 0;
    float v = strtof(s, &e);
    if (e == s || *e != '\0' || errno == ERANGE || !(v >= lo && v <= hi) || (open_lo && v == lo))
        return 0;
    *out = v;
    return 1;
}

/* A decimal unsigned 64-bit integer filling the whole of s. */
static int demo_u64(const char *s, uint64_t *out)
{
    char *e;
    errno = 0;
    if (*s < '0' || *s > '9')
        return 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (*e != '\0' || errno == ERANGE || v > UINT64_MAX)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* The flag arg names (a value flag: "--name" or "--name=value"). */
static int demo_is(const char *arg, size_t name_len, const char *name)
{
    return name_len == strlen(name) && strncmp(arg, name, name_len) == 0;
}

static const char *const DEMO_VALUE_FLAGS[] = {"--tokens", "--generate", "--threads", "--temperature", "--top-k",
                                               "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--seed",
                                               "--stop", "--chat", "--prompt"};

/* The sampling flags; 1 when arg was one (its error, if any, in *rc), else 0. */
static int demo_sample_flag(const char *arg, size_t name_len, const char *value, const char *prog, int want_model,
                            demo_args *a, int *rc)
{
    colibri_sample_params *p = &a->sample;
    const char *end;
    long v;
    *rc = DEMO_CONTINUE;
    if (demo_is(arg, name_len, "--temperature")) {
        if (!demo_float(value, 0.0f, 1e30f, 0, &p->temperature))
            *rc = demo_bad(prog, want_model, "--temperature wants a number >= 0 (0: greedy)", value);
    } else if (demo_is(arg, name_len, "--top-k")) {
        if (!demo_long(value, &end, 0, 2147483647L, &v) || *end != '\0')
            *rc = demo_bad(prog, want_model, "--top-k wants a count >= 0 (0: off)", value);
        else
            p->top_k = (uint32_t)v;
    } else if (demo_is(arg, name_len, "--top-p")) {
        if (!demo_float(value, 0.0f, 1.0f, 0, &p->top_p))
            *rc = demo_bad(prog, want_model, "--top-p wants a number in [0, 1] (1: off)", value);
    } else if (demo_is(arg, name_len, "--min-p")) {
        if (!demo_float(value, 0.0f, 1.0f, 0, &p->min_p))
            *rc = demo_bad(prog, want_model, "--min-p wants a number in [0, 1] (0: off)", value);
    } else if (demo_is(arg, name_len, "--repeat-penalty")) {
        if (!demo_float(value, 0.0f, 1e30f, 1, &p->repeat_penalty))
            *rc = demo_bad(prog, want_model, "--repeat-penalty wants a number > 0 (1: off)", value);
    } else if (demo_is(arg, name_len, "--repeat-last-n")) {
        if (!demo_long(value, &end, 0, LONG_MAX, &a->repeat_last_n) || *end != '\0')
            *rc = demo_bad(prog, want_model, "--repeat-last-n wants a count >= 0", value);
    } else if (demo_is(arg, name_len, "--seed")) {
        if (!demo_u64(value, &p->seed))
            *rc = demo_bad(prog, want_model, "--seed wants an integer in [0, 2^64)", value);
    } else if (demo_is(arg, name_len, "--stop")) {
        size_t n;
        if (!demo_tokens(value, NULL, &n) || n > DEMO_MAX_STOP)
            *rc = demo_bad(prog, want_model, "--stop wants at most 64 comma-separated token ids", value);
        else {
            demo_tokens(value, a->stop, &n);
            p->n_stop = n;
        }
    } else {
        return 0;
    }
    return 1;
}

int demo_parse(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
               size_t n_default, long default_generate, demo_args *a)
{
    return demo_parse_sampled(argc, argv, prog, want_model, default_tokens, n_default, default_generate, NULL, a);
}

int demo_parse_sampled(int argc, char **argv, const char *prog, int want_model, const int32_t *default_tokens,
                       size_t n_default, long default_generate, const colibri_sample_params *default_sample,
                       demo_args *a)
{
    static const colibri_sample_params greedy = {0.0f, 0u, 1.0f, 0.0f, 1.0f, 0u, NULL, 0u}; /* the defaults */
    a->sample = default_sample ? *default_sample : greedy;
    if (a->sample.n_stop > DEMO_MAX_STOP)
        a->sample.n_stop = DEMO_MAX_STOP;
    if (a->sample.n_stop)
        memcpy(a->stop, a->sample.stop_ids, a->sample.n_stop * sizeof *a->stop);
    a->sample.stop_ids = a->stop;
    a->repeat_last_n = DEMO_REPEAT_LAST_N;
    a->chat = NULL;
    a->prompt_text = NULL;
    a->prompt_len = 0;
    a->model = NULL;
    a->tokens_text = NULL;
    a->default_tokens = default_tokens;
    a->n_tokens = n_default;
    a->generate = default_generate;
    a->threads = 1;
    a->print_logits = 0;
    a->no_hugepages = 0;
    int rc;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = NULL, *end;
        /* --tokens and --generate take a value, as the next argument or after '=' */
        size_t name_len = strncmp(arg, "--", 2) == 0 && strchr(arg, '=') ? (size_t)(strchr(arg, '=') - arg)
                                                                           : strlen(arg);
        int is_tokens = name_len == 8 && strncmp(arg, "--tokens", 8) == 0;
        int is_generate = name_len == 10 && strncmp(arg, "--generate", 10) == 0;
        int is_threads = name_len == 9 && strncmp(arg, "--threads", 9) == 0;
        int takes_value = 0;
        for (size_t f = 0; f < sizeof DEMO_VALUE_FLAGS / sizeof *DEMO_VALUE_FLAGS; f++)
            takes_value |= demo_is(arg, name_len, DEMO_VALUE_FLAGS[f]);
        if (takes_value) {
            if (arg[name_len] == '=')
                value = arg + name_len + 1;
            else if (i + 1 < argc)
                value = argv[++i];
            else
                return demo_bad(prog, want_model, "missing value for", arg);
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            demo_usage(stdout, prog, want_model);
            return 0;
        } else if (strcmp(arg, "--print-logits") == 0) {
            a->print_logits = 1;
        } else if (strcmp(arg, "--no-hugepages") == 0) {
            a->no_hugepages = 1;
        } else if (is_tokens) {
            if (!demo_tokens(value, NULL, &a->n_tokens))
                return demo_bad(prog, want_model, "--tokens wants comma-separated token ids", value);
            a->tokens_text = value;
        } else if (is_generate) {
            if (!demo_long(value, &end, 0, LONG_MAX, &a->generate) || *end != '\0')
                return demo_bad(prog, want_model, "--generate wants a count >= 0", value);
        } else if (is_threads) {
            if (!demo_long(value, &end, 1, DEMO_MAX_THREADS, &a->threads) || *end != '\0')
                return demo_bad(prog, want_model, "--threads wants a count in [1, 64]", value);
        } else if (demo_is(arg, name_len, "--chat")) {
            a->chat = value;
        } else if (demo_is(arg, name_len, "--prompt")) {
            a->prompt_text = value;
            a->prompt_len = strlen(value);
        } else if (demo_sample_flag(arg, name_len, value, prog, want_model, a, &rc)) {
            if (rc != DEMO_CONTINUE)
                return rc;
        } else if (want_model && !a->model && arg[0] != '-') {
            a->model = arg;
        } else {
            return demo_bad(prog, want_model, "unexpected argument", arg);
        }
    }
    if (want_model && !a->model)
        return demo_bad(prog, want_model, "no model file given", NULL);
    if (!!a->prompt_text + !!a->tokens_text + !!a->chat > 1)
        return demo_bad(prog, want_model, "give the prompt as one of --tokens, --prompt or --chat, not two", NULL);
    return DEMO_CONTINUE;
}

int demo_fail(const demo_api *api, const char *prog, const char *name, colibri_status st)
{
    fprintf(stderr, "%s: %s: %s (status %d)\n", prog, name, api->strerror(st), (int)st);
    return 3;
}

int demo_io_error(const char *prog, const char *name, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, name, what);
    return 1;
}

int demo_bad_input(const char *prog, const char *name, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, name, what);
    return 2;
}

void *demo_map_anon(size_t len)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* 1 when the kernel gives transparent huge pages to a madvise(MADV_HUGEPAGE) region: its setting is
 * "[always]" or "[madvise]", not "[never]" (nor absent: no THP in this kernel). */
static int demo_thp_on(void)
{
    char mode[128] = {0};
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    size_t n = fread(mode, 1, sizeof mode - 1, f);
    fclose(f);
    mode[n] = '\0';
    return strstr(mode, "[always]") != NULL || strstr(mode, "[madvise]") != NULL;
}

const void *demo_hugepage_copy(const void *blob, size_t len)
{
#ifdef MADV_HUGEPAGE
    const size_t huge = (size_t)2 << 20;
    if (len < huge || len > SIZE_MAX - 2 * huge || !demo_thp_on())
        return NULL;
    size_t span = (len + huge - 1) & ~(huge - 1);
    unsigned char *raw = mmap(NULL, span + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* keep the 2 MiB-aligned span; give back the slack on either side */
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + huge > p)
        munmap(p + span, (size_t)(raw + huge - p));
    if (madvise(p, span, MADV_HUGEPAGE) != 0) { /* before the first touch: the faults then take 2 MiB */
        munmap(p, span);
        return NULL;
    }
    /* a chunk at a time, each chunk's whole source pages dropped from this process once copied (read and
     * clean: a file's stay in the page cache), so that the process holds about one copy at any time */
    const size_t chunk = (size_t)64 << 20;
    const long pagesize = sysconf(_SC_PAGESIZE);
    const uintptr_t page = pagesize > 0 ? (uintptr_t)pagesize : 0, src = (uintptr_t)blob;
    uintptr_t dropped = page ? (src + page - 1) & ~(page - 1) : 0; /* the first whole page */
    for (size_t off = 0; off < len; off += chunk) {
        const size_t n = len - off < chunk ? len - off : chunk;
        memcpy(p + off, (const unsigned char *)blob + off, n);
        const uintptr_t end = (src + off + n) & ~(page - 1);
        if (page && end > dropped) {
            madvise((void *)dropped, end - dropped, MADV_DONTNEED);
            dropped = end;
        }
    }
    mprotect(p, span, PROT_READ);
    return p;
#else
    (void)blob;
    (void)len;
    return NULL;
#endif
}

int demo_start(const demo_api *api, const void *blob, size_t blob_len, const demo_args *a, const char *prog,
               const char *name)
{
    size_t arena_bytes; /* (validates the whole blob: a file that is no model is refused before any copy) */
    colibri_status st = api->arena_bytes(blob, blob_len, &arena_bytes);
    if (st != COLIBRI_OK)
        return demo_fail(api, prog, name, st);
    const void *copy = a->no_hugepages ? NULL : demo_hugepage_copy(blob, blob_len);
    if (copy)
        blob = copy; /* init validates the copy again */
    void *arena = demo_map_anon(arena_bytes);
    if (!arena)
        return demo_io_error(prog, name, "cannot map the arena");
    colibri_ctx *ctx;
    colibri_model_info info = {.struct_size = sizeof info};
    if ((st = api->init(&ctx, arena, arena_bytes, blob, blob_len)) != COLIBRI_OK
        || (st = api->info(ctx, &info)) != COLIBRI_OK)
        return demo_fail(api, prog, name, st);
    float *logits = demo_map_anon(2 * (size_t)info.vocab * sizeof(float));
    if (!logits)
        return demo_io_error(prog, name, "cannot map the logits");
    return demo_run(api, ctx, a, NULL, 0, logits, logits + info.vocab, info.vocab, prog, name);
}

static double demo_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The ids the repetition penalty looks at: the last repeat_last_n of prompt + generated. */
typedef struct demo_window {
    int32_t ids[256];
    size_t n, cap;
} demo_window;

static void demo_window_push(demo_window *w, int32_t id)
{
    if (w->cap == 0)
        return;
    if (w->n == w->cap) {
        memmove(w->ids, w->ids + 1, (w->cap - 1) * sizeof *w->ids);
        w->n--;
    }
    w->ids[w->n++] = id;
}

/* Streams the text of the ids as they come (api->token_piece), whole characters only. */
typedef struct demo_text {
    colibri_utf8 utf8;
    uint8_t piece[DEMO_PIECE_MAX];
    uint8_t out[COLIBRI_UTF8_OUT_MAX(DEMO_PIECE_MAX)];
} demo_text;

static void demo_text_put(const demo_api *api, demo_text *t, int32_t id, int final)
{
    size_t len = 0, n_out = 0;
    colibri_utf8_kind kind = COLIBRI_UTF8_TEXT;
    if (final)
        api->utf8_flush(&t->utf8, t->out, sizeof t->out, &n_out);
    else if (api->token_piece(api->piece_user, id, t->piece, sizeof t->piece, &len, &kind) == 0)
        api->utf8_feed(&t->utf8, t->piece, len, kind, t->out, sizeof t->out, &n_out);
    fwrite(t->out, 1, n_out, stdout);
    fflush(stdout);
}

static int demo_generate(const demo_api *api, colibri_ctx *ctx, const demo_args *a, const int32_t *tokens,
                         float *logits, float *prompt_logits, size_t vocab, const char *prog, const char *name)
{
    static demo_window window;
    static demo_text text;
    static int32_t generated[4096];
    colibri_sampler sampler;
    colibri_status st = api->sample_init(&sampler, &a->sample);
    if (st != COLIBRI_OK)
        return demo_fail(api, prog, name, st);
    void *scratch = demo_map_anon(COLIBRI_SAMPLE_SCRATCH_BYTES(vocab));
    if (!scratch)
        return demo_io_error(prog, name, "cannot map the sampler's scratch");
    window.n = 0;
    window.cap = (size_t)a->repeat_last_n < sizeof window.ids / sizeof *window.ids
                     ? (size_t)a->repeat_last_n : sizeof window.ids / sizeof *window.ids;
    for (size_t i = 0; i < a->n_tokens; i++)
        demo_window_push(&window, tokens[i]);
    double t_prefill = demo_now();
    st = api->forward(ctx, tokens, a->n_tokens, logits, vocab);
    t_prefill = demo_now() - t_prefill;
    if (st != COLIBRI_OK)
        return demo_fail(api, prog, name, st);
    memcpy(prompt_logits, logits, vocab * sizeof *logits);

    /* token i comes from the logits of token i-1, so n tokens take n-1 decode steps */
    double seconds = 0.0;
    long steps = 0, n_gen = 0;
    int streaming = api->token_piece != NULL;
    if (streaming) {
        memset(&text.utf8, 0, sizeof text.utf8); /* colibri_utf8_init */
        printf("text: ");
    } else {
        printf("tokens: ");
    }
    for (long i = 0; i < a->generate; i++) {
        int32_t next;
        st = api->sample_next(&sampler, logits, vocab, window.ids, a->sample.repeat_penalty != 1.0f ? window.n : 0,
                              scratch, COLIBRI_SAMPLE_SCRATCH_BYTES(vocab), &next);
        if (st != COLIBRI_OK) {
            printf("\n");
            return demo_fail(api, prog, name, st);
        }
        demo_window_push(&window, next);
        int stop = api->sample_is_stop(&sampler, next);
        if (streaming) {
            if ((size_t)n_gen < sizeof generated / sizeof *generated)
                generated[n_gen++] = next;
            if (!stop)
                demo_text_put(api, &text, next, 0);
        } else {
            printf(i ? ",%ld" : "%ld", (long)next);
            fflush(stdout);
        }
        if (stop || i + 1 == a->generate)
            break;
        double t0 = demo_now();
        st = api->forward(ctx, &next, 1, logits, vocab);
        seconds += demo_now() - t0;
        steps++;
        if (st != COLIBRI_OK) {
            printf("\n");
            return demo_fail(api, prog, name, st);
        }
    }
    if (streaming) {
        demo_text_put(api, &text, 0, 1);
        printf("\ntokens: ");
        for (long i = 0; i < n_gen; i++)
            printf(i ? ",%ld" : "%ld", (long)generated[i]);
    }
    printf("\ntok/s: %.2f\n", seconds > 0.0 ? (double)steps / seconds : 0.0);
    printf("prefill tok/s: %.2f\n", t_prefill > 0.0 ? (double)a->n_tokens / t_prefill : 0.0);
    if (a->print_logits) {
        printf("logits: ");
        for (size_t i = 0; i < vocab; i++)
            printf(i ? ",%.9g" : "%.9g", (double)prompt_logits[i]);
        printf("\n");
    }
    return 0;
}

/* ------------------------------------------------------- the thread pool */

/* colibri_set_parallel's parallel_for over n - 1 pthreads and the calling thread. The caller opens
 * a job by making `generation` odd; a worker joins it by counting itself in `active` and then
 * checking that the job is still open, and every thread in the job takes task indices from `next`
 * until they run out. The caller then closes the job (generation even) and returns once `active`
 * is 0, so no worker can still hold the job (or take an index of the next one) afterwards. Both
 * sides write, then read the other's word, all seq_cst: either the caller sees the worker counted
 * or the worker sees the job closed. So the caller waits only for workers inside the job: one
 * asleep or preempted until the caller has taken the last task finds the job closed, stays out.
 *
 * A forward pass issues a few hundred jobs a token, mostly a few microseconds apart: too close to
 * sleep between when the cores are free, as a wake-up costs up to tens of microseconds. But when
 * the cores are oversubscribed a spinner holds the core the thread it waits for needs, so a waiter
 * spins only about that long (DEMO_SPINS), then sleeps on a condition variable. */
#if defined(__x86_64__) || defined(__i386__)
#define DEMO_SPINS 2000                    /* pauses: 5 to 100 us, by the core */
#define DEMO_RELAX() __builtin_ia32_pause() /* also spares the sibling hyperthread */
#else
#define DEMO_SPINS 10000 /* bare loads: about as long (a guess, not measured on the boards) */
#define DEMO_RELAX() ((void)0)
#endif

typedef struct demo_pool {
    pthread_t threads[DEMO_MAX_THREADS];
    size_t n_workers;
    colibri_task_fn fn;
    void *task_ctx;
    size_t n_tasks;
    atomic_size_t next;
    atomic_uint generation; /* odd while a job is open */
    atomic_uint active;     /* workers in the job */
    atomic_int stop;
    atomic_int sleepers; /* threads in, or about to enter, a pthread_cond_wait */
    pthread_mutex_t lock;
    pthread_cond_t job;  /* generation or stop changed */
    pthread_cond_t done; /* active dropped to 0 */
} demo_pool;

/* After a write to c's predicate. `sleepers` keeps the mutex off the fast path; no wake-up is lost:
 * the waker writes the predicate then reads `sleepers`, a sleeper counts itself then reads the
 * predicate, all seq_cst, so one of them sees the other's write; and a sleeper does both under
 * the mutex the waker takes to broadcast, so the broadcast cannot fall between them and its wait. */
static void demo_pool_wake(demo_pool *p, pthread_cond_t *c)
{
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(c);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Waits until *v == x (eq) or *v != x (!eq), or stop; returns *v. */
static unsigned demo_pool_wait(demo_pool *p, atomic_uint *v, unsigned x, int eq, pthread_cond_t *c)
{
    unsigned now;
    for (int spins = 0; spins < DEMO_SPINS; spins++) {
        if (((now = atomic_load(v)) == x) == eq || atomic_load_explicit(&p->stop, memory_order_relaxed))
            return now;
        DEMO_RELAX();
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (((now = atomic_load(v)) == x) != eq && !atomic_load(&p->stop))
        pthread_cond_wait(c, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return now;
}

static void demo_pool_work(demo_pool *p)
{
    for (size_t i; (i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->n_tasks;)
        p->fn(p->task_ctx, i);
}

static void *demo_pool_worker(void *arg)
{
    demo_pool *p = (demo_pool *)arg;
    for (unsigned seen = 0, g; (g = demo_pool_wait(p, &p->generation, seen, 0, &p->job)) != seen; seen = g) {
        if (!(g & 1))
            continue; /* closed before we came */
        atomic_fetch_add(&p->active, 1);
        if (atomic_load(&p->generation) == g) /* still open: the caller waits for us */
            demo_pool_work(p);
        if (atomic_fetch_sub(&p->active, 1) == 1)
            demo_pool_wake(p, &p->done);
    }
    return NULL; /* stopped: no job is open once stop is set */
}

static void demo_parallel_for(colibri_task_fn fn, void *task_ctx, size_t n_tasks, void *user)
{
    demo_pool *p = (demo_pool *)user;
    p->fn = fn;
    p->task_ctx = task_ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    unsigned g = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1; /* only we write it */
    atomic_store(&p->generation, g);
    demo_pool_wake(p, &p->job);
    demo_pool_work(p);
    atomic_store(&p->generation, g + 1); /* no one joins from here */
    demo_pool_wait(p, &p->active, 0, 1, &p->done);
}

/* Starts threads - 1 workers; returns 0 when it could not. */
static int demo_pool_start(demo_pool *p, size_t threads)
{
    atomic_init(&p->next, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->sleepers, 0);
    p->n_workers = 0;
    for (size_t i = 0; i + 1 < threads; i++, p->n_workers++)
        if (pthread_create(&p->threads[i], NULL, demo_pool_worker, p) != 0)
            return 0;
    return 1;
}

static void demo_pool_stop(demo_pool *p)
{
    atomic_store(&p->stop, 1);
    demo_pool_wake(p, &p->job);
    for (size_t i = 0; i < p->n_workers; i++)
        pthread_join(p->threads[i], NULL);
}

/* The prompt's ids: the defaults, or the --tokens ids read into token_buf (or a mapping of their
 * number); NULL after printing why (the return status in *rc). Refuses, before any forward pass, a
 * prompt and generation that do not fit max_seq positions: the last generated token is not fed. */
static const int32_t *demo_prompt(const demo_api *api, colibri_ctx *ctx, const demo_args *a, int32_t *token_buf,
                                  size_t token_cap, const char *prog, const char *name, int *rc)
{
    char why[160];
    colibri_model_info info = {.struct_size = sizeof info};
    colibri_status st = api->info(ctx, &info);
    if (st != COLIBRI_OK) {
        *rc = demo_fail(api, prog, name, st);
        return NULL;
    }
    uintmax_t steps = a->generate > 1 ? (uintmax_t)a->generate - 1 : 0;
    if (a->n_tokens > info.max_seq) {
        snprintf(why, sizeof why, "%zu tokens, more than max_seq %lu", a->n_tokens, (unsigned long)info.max_seq);
        *rc = demo_bad_input(prog, name, why);
        return NULL;
    }
    if (steps > info.max_seq - a->n_tokens) {
        snprintf(why, sizeof why, "%zu prompt tokens and %ld to generate need %ju positions, more than max_seq %lu",
                 a->n_tokens, a->generate, (uintmax_t)a->n_tokens + steps, (unsigned long)info.max_seq);
        *rc = demo_bad_input(prog, name, why);
        return NULL;
    }
    if (!a->tokens_text)
        return a->default_tokens;
    if (!token_buf)
        token_buf = demo_map_anon(a->n_tokens * sizeof *token_buf); /* at most max_seq ids */
    else if (a->n_tokens > token_cap) {
        snprintf(why, sizeof why, "%zu tokens, more than this program's %zu", a->n_tokens, token_cap);
        *rc = demo_bad_input(prog, name, why);
        return NULL;
    }
    if (!token_buf) {
        *rc = demo_io_error(prog, name, "cannot map the tokens");
        return NULL;
    }
    size_t n;
    demo_tokens(a->tokens_text, token_buf, &n); /* checked and counted by demo_parse */
    return token_buf;
}

/* --prompt TEXT, or --chat TEXT between the chat template's prefix and suffix, into ids by the model's
 * tokenizer: *out is a copy of a with them as its prompt (in *token_buf, mapped for max_seq ids when NULL).
 * More ids than max_seq is refused, never cut. The template's special tokens are parsed; a --chat user
 * text never is (a special token's name typed by the user stays text). */
static int demo_tokenize(const demo_api *api, colibri_ctx *ctx, const demo_args *a, int32_t **token_buf,
                         size_t token_cap, const char *prog, const char *name, demo_args *out)
{
    char why[160];
    const char *flag = a->chat ? "--chat" : "--prompt";
    colibri_model_info info = {.struct_size = sizeof info};
    colibri_status st = api->info(ctx, &info);
    if (st != COLIBRI_OK)
        return demo_fail(api, prog, name, st);
    if (!api->tokenize) {
        snprintf(why, sizeof why, "%s needs the model's tokenizer (none in this model or program%s)", flag,
                 a->chat ? "" : ": give --tokens");
        return demo_bad_input(prog, name, why);
    }
    if (a->chat && !api->chat_prefix_len && !api->chat_suffix_len)
        return demo_bad_input(prog, name, "--chat needs the model's chat template (its tokenizer_config.json has none)");
    size_t cap = info.max_seq;
    if (!*token_buf)
        *token_buf = demo_map_anon(cap * sizeof **token_buf);
    else if (token_cap < cap)
        cap = token_cap;
    if (!*token_buf)
        return demo_io_error(prog, name, "cannot map the tokens");
    /* the parts: the prompt alone, or prefix, user text, suffix */
    const char *text[3] = {a->chat ? api->chat_prefix : a->prompt_text, a->chat, api->chat_suffix};
    const size_t len[3] = {a->chat ? api->chat_prefix_len : a->prompt_len, a->chat ? strlen(a->chat) : 0,
                           api->chat_suffix_len};
    const int special[3] = {1, 0, 1};
    size_t n = 0;
    int ts = COLIBRI_TOK_OK;
    for (int i = 0; i < (a->chat ? 3 : 1) && ts == COLIBRI_TOK_OK; i++) {
        size_t got = 0;
        if (len[i])
            ts = api->tokenize(api->piece_user, text[i], len[i], special[i], *token_buf + n, cap - n, &got);
        n += got;
    }
    if (ts == COLIBRI_TOK_E_TOO_LONG) {
        snprintf(why, sizeof why, "%s: more than max_seq %lu tokens", flag, (unsigned long)info.max_seq);
        return demo_bad_input(prog, name, why);
    }
    if (ts != COLIBRI_TOK_OK || n == 0) {
        snprintf(why, sizeof why, "%s: %s (status %d)", flag, ts ? api->tok_strerror(ts) : "no tokens", ts);
        return demo_bad_input(prog, name, why);
    }
    *out = *a;
    out->prompt_text = NULL;
    out->tokens_text = NULL;
    out->chat = NULL;
    out->default_tokens = *token_buf;
    out->n_tokens = n;
    return 0;
}

int demo_run(const demo_api *api, colibri_ctx *ctx, const demo_args *a, int32_t *token_buf, size_t token_cap,
             float *logits, float *prompt_logits, size_t vocab, const char *prog, const char *name)
{
    int rc = 0;
    demo_args text_args;
    if (a->prompt_text || a->chat) {
        if ((rc = demo_tokenize(api, ctx, a, &token_buf, token_cap, prog, name, &text_args)) != 0)
            return rc;
        a = &text_args;
    }
    const int32_t *tokens = demo_prompt(api, ctx, a, token_buf, token_cap, prog, name, &rc);
    if (!tokens)
        return rc;
    static demo_pool pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .job = PTHREAD_COND_INITIALIZER,
                             .done = PTHREAD_COND_INITIALIZER};
    if (a->threads > 1) {
        colibri_status st;
        if (!demo_pool_start(&pool, (size_t)a->threads)) {
            demo_pool_stop(&pool);
            return demo_io_error(prog, name, "cannot start the threads");
        }
        if ((st = api->set_parallel(ctx, demo_parallel_for, &pool, (size_t)a->threads)) != COLIBRI_OK) {
            demo_pool_stop(&pool);
            return demo_fail(api, prog, name, st);
        }
    }
    rc = demo_generate(api, ctx, a, tokens, logits, prompt_logits, vocab, prog, name);
    if (a->threads > 1) {
        api->set_parallel(ctx, NULL, NULL, 0);
        demo_pool_stop(&pool);
    }
    return rc;
}
