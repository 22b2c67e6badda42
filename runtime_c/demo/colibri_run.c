/*
 * colibri_run - runs a model.bin with the generic runtime:
 *
 *   colibri_run MODEL.bin [--tokens 3,17,42] [--generate N] [--print-logits]
 *
 * The blob is mapped read-only and the arena is an anonymous mapping of
 * exactly colibri_arena_bytes: nothing is malloc'd, as on a microcontroller.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colibri.h"
#include "demo_common.h"

#define PROG "colibri_run"

static void *map_anon(size_t bytes) /* page-aligned, so 64-byte aligned; zeroed */
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int io_error(const char *name, const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", name, what);
    return 1;
}

int main(int argc, char **argv)
{
    static demo_args a;
    static const int32_t default_tokens[] = {1, 2, 3};
    int rc = demo_parse(argc, argv, PROG, 1, default_tokens, 3, 16, &a);
    if (rc != DEMO_CONTINUE)
        return rc;

    int fd = open(a.model, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0)
        return io_error(a.model, strerror(errno));
    if ((uintmax_t)sb.st_size > SIZE_MAX)
        return io_error(a.model, "file larger than the address space");
    size_t len = (size_t)sb.st_size;
    /* an empty file cannot be mapped; hand colibri an empty blob so it reports E_TRUNCATED */
    void *blob = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : map_anon(0);
    close(fd);
    if (!blob || blob == MAP_FAILED)
        return io_error(a.model, strerror(errno));

    size_t arena_bytes;
    colibri_status st = colibri_arena_bytes(blob, len, &arena_bytes);
    if (st != COLIBRI_OK)
        return demo_fail(PROG, a.model, st);
    void *arena = map_anon(arena_bytes);
    if (!arena)
        return io_error(a.model, "cannot map the arena");
    colibri_ctx *ctx;
    colibri_model_info info = {.struct_size = sizeof info};
    if ((st = colibri_init(&ctx, arena, arena_bytes, blob, len)) != COLIBRI_OK
        || (st = colibri_info(ctx, &info)) != COLIBRI_OK)
        return demo_fail(PROG, a.model, st);
    float *logits = map_anon(2 * (size_t)info.vocab * sizeof(float));
    if (!logits)
        return io_error(a.model, "cannot map the logits");
    return demo_run(ctx, &a, logits, logits + info.vocab, info.vocab, PROG, a.model);
}
