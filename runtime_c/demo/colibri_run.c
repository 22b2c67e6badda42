/*
 * colibri_run - runs a model.bin with the generic runtime:
 *
 *   colibri_run MODEL.bin [--tokens 3,17,42] [--generate N] [--print-logits]
 *
 * The blob is mapped read-only and the arena is an anonymous mapping of
 * exactly colibri_arena_bytes: nothing is malloc'd, as on a microcontroller.
 * MODEL.bin must be a regular file: a FIFO, a device or a directory is
 * refused (exit 2) without waiting for a writer or reading a device.
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

int main(int argc, char **argv)
{
    static demo_args a;
    static const int32_t default_tokens[] = {1, 2, 3};
    static const demo_api api = DEMO_LINKED_API;
    int rc = demo_parse(argc, argv, PROG, 1, default_tokens, 3, 16, &a);
    if (rc != DEMO_CONTINUE)
        return rc;

    /* non-blocking: opening a FIFO without a writer returns at once, and fstat then refuses it */
    int fd = open(a.model, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0)
        return demo_io_error(PROG, a.model, strerror(errno));
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return demo_bad_input(PROG, a.model, S_ISDIR(sb.st_mode)    ? "a directory, not a regular file"
                                             : S_ISFIFO(sb.st_mode) ? "a FIFO, not a regular file"
                                             : S_ISCHR(sb.st_mode)  ? "a character device, not a regular file"
                                             : S_ISBLK(sb.st_mode)  ? "a block device, not a regular file"
                                                                    : "not a regular file");
    }
    if ((uintmax_t)sb.st_size > SIZE_MAX)
        return demo_io_error(PROG, a.model, "file larger than the address space");
    size_t len = (size_t)sb.st_size;
    /* an empty file cannot be mapped; hand colibri an empty blob so it reports E_TRUNCATED */
    void *blob = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : demo_map_anon(0);
    close(fd);
    if (!blob || blob == MAP_FAILED)
        return demo_io_error(PROG, a.model, strerror(errno));
    return demo_start(&api, blob, len, &a, PROG, a.model);
}
