/*
 * board.c - board support for RV32 in machine mode: semihosting console and
 * exit status, and the retired-instruction counter (minstret).
 */
#include "board.h"

_Noreturn void board_trap(uint32_t mcause, uint32_t mepc, uint32_t mtval);

_Noreturn void board_trap(uint32_t mcause, uint32_t mepc, uint32_t mtval)
{
    board_puts("\nfault: mcause ");
    board_put_dec(mcause);
    board_puts(" at ");
    board_put_hex(mepc);
    board_puts(", mtval ");
    board_put_hex(mtval);
    board_puts("\n");
    board_exit(4);
}

/* minstret counts retired instructions on hardware and, with QEMU -icount,
 * exactly in emulation too (mcycle would read the same there). */
const char board_counter_name[] = "instructions";
static uint64_t board_counter_base;

static uint64_t board_instret(void)
{
    uint32_t hi, lo, hi2;
    do {
        __asm__ volatile("csrr %0, minstreth" : "=r"(hi));
        __asm__ volatile("csrr %0, minstret" : "=r"(lo));
        __asm__ volatile("csrr %0, minstreth" : "=r"(hi2));
    } while (hi != hi2);
    return (uint64_t)hi << 32 | lo;
}

void board_counter_start(void)
{
    board_counter_base = board_instret();
}

uint64_t board_counter(void)
{
    return board_instret() - board_counter_base;
}
