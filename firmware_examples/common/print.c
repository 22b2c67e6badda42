/*
 * print.c - decimal and hex output on the board's console. Hand-rolled rather
 * than snprintf: newlib-nano's formatter links malloc/realloc/_sbrk (for
 * streams that grow), and this image has no heap, not even an unused one.
 */
#include "board.h"

void board_put_dec(uint64_t v)
{
    char buf[21];
    char *p = buf + sizeof buf;
    *--p = '\0';
    do {
        *--p = (char)('0' + v % 10u);
        v /= 10u;
    } while (v);
    board_puts(p);
}

void board_put_hex(uint32_t v)
{
    char buf[11] = "0x";
    for (int i = 0; i < 8; i++)
        buf[2 + i] = "0123456789abcdef"[(v >> (28 - 4 * i)) & 0xfu];
    buf[10] = '\0';
    board_puts(buf);
}
