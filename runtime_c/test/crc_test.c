/*
 * crc_test.c - cb_crc32 (the blob's check at load) on the target, against zlib's crc32 in the test.
 *
 * Built from cbmath.c with the target's flags and run natively or under QEMU by tests/test_kernels.py.
 * A buffer of xorshift32 bytes (state 2463534242; each step's low byte), then one line per case
 * "<offset> <length> <crc as 8 hex digits>": every length 0..80 at offsets 0..7 (the 8- and 4-byte
 * instruction paths' heads and tails), lengths around 64 KiB (the slicing path's threshold) and 1 MiB at
 * offsets 0 and 3; and a 1 MiB buffer's CRC chained over two calls split at an odd byte ("chain" lines).
 * The test rebuilds the bytes and compares every line with zlib.crc32.
 */
#include <stdio.h>

#include "../src/cbmath.h"

#define N ((1u << 20) + 8u)

static uint8_t buf[N]; /* a test program's buffer, not the runtime's: no heap, no stack of a MiB */

int main(void)
{
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (uint8_t)x;
    }
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len <= 80; len++)
            printf("%zu %zu %08x\n", off, len, (unsigned)cb_crc32(0, buf + off, len));
    static const size_t big[] = {65535, 65536, 65537, 65543, 1u << 20};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        for (size_t off = 0; off < 8; off += 3)
            printf("%zu %zu %08x\n", off, big[i], (unsigned)cb_crc32(0, buf + off, big[i]));
    const size_t split = 70001;
    printf("chain %zu %08x\n", split, (unsigned)cb_crc32(cb_crc32(0, buf, split), buf + split, (1u << 20) - split));
    return 0;
}
