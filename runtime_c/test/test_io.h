/*
 * test_io.h - where the kernel tests take their memory from and print to.
 *
 * With -DCB_TEST_BARE_METAL (a firmware image's main; the includer defines POOL_BYTES): a static
 * pool handed out as a stack, and board.h's semihosting console, printing a float as its f32 bits
 * (no float formatting on the board). Otherwise exact-size heap blocks, so that ASan traps an
 * over-read, and stdio.
 */
#ifndef CB_TEST_IO_H
#define CB_TEST_IO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(CB_TEST_BARE_METAL)
#include "board.h"

typedef struct pool {
    _Alignas(16) unsigned char bytes[POOL_BYTES];
    size_t used;
} pool;

static pool case_pool;

/* n zeroed bytes, skew bytes past a 16-byte boundary; NULL when the pool is exhausted */
static inline void *take(size_t n, size_t skew)
{
    pool *p = &case_pool;
    size_t at = (p->used + 15u) / 16u * 16u + skew;
    if (at > sizeof p->bytes || sizeof p->bytes - at < n)
        return NULL;
    p->used = at + n;
    return memset(p->bytes + at, 0, n);
}

static inline void give_back(void *block) /* a stack: the block and every one taken after it */
{
    if (block) /* back to its 16-byte boundary, where take() began it */
        case_pool.used = (size_t)((unsigned char *)block - case_pool.bytes) / 16u * 16u;
}

static inline void put_str(const char *s)
{
    board_puts(s);
}

static inline void put_size(size_t v)
{
    board_put_dec((uint64_t)v);
}

static inline void put_real(double v) /* the value as an f32's bits */
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    board_puts("f32 ");
    board_put_hex(u);
}

static inline void put_exact(float v)
{
    put_real(v);
}

static inline void put_small(double v) /* a small error or bound: in whole units of 1e-9 */
{
    board_put_dec((uint64_t)(v * 1e9 + 0.5));
    board_puts("e-9");
}
#else
#include <stdio.h>
#include <stdlib.h>

static inline void *take(size_t n, size_t skew) /* zeroed, exact-size heap blocks */
{
    (void)skew;
    return calloc(n ? n : 1, 1);
}

static inline void give_back(void *block)
{
    free(block);
}

static inline void put_str(const char *s)
{
    fputs(s, stdout);
}

static inline void put_size(size_t v)
{
    printf("%zu", v);
}

static inline void put_real(double v)
{
    printf("%.9g", v);
}

static inline void put_exact(float v)
{
    printf("%a", (double)v);
}

static inline void put_small(double v)
{
    printf("%.3g", v);
}
#endif

#endif /* CB_TEST_IO_H */
