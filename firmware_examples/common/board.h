/*
 * board.h - what main.c needs from the bare-metal board support of each
 * family (cortex-m/startup.c, riscv/board.c): a console, an exit status,
 * a counter and the stack high-water mark. Console and exit use semihosting,
 * which QEMU (-semihosting-config) and every debug probe implement; on a
 * board without a debugger attached, replace board_puts/board_exit.
 */
#ifndef BOARD_H
#define BOARD_H

#include <stddef.h>
#include <stdint.h>

/* One semihosting call (op, argument block): `bkpt 0xab` on Arm, the
 * slli/ebreak/srai sequence on RISC-V (each family's startup code). */
long board_semihost(long op, const void *arg);

/* Writes a NUL-terminated string to the host console (semihost.c). */
void board_puts(const char *s);

/* Unsigned decimal, and 0x%08x hex (print.c). */
void board_put_dec(uint64_t v);
void board_put_hex(uint32_t v);

/* Ends the program; QEMU exits with this status. */
_Noreturn void board_exit(int status);

/* Starts the performance counter from zero; board_counter() reads it. */
void board_counter_start(void);
uint64_t board_counter(void);

/* What board_counter() counts ("cycles" or "instructions"). */
extern const char board_counter_name[];

/* The most stack bytes used so far (the startup code fills the stack with a pattern). */
size_t board_stack_used(void);

/* The startup code's zero table and stack limits, from the generated linker script. */
extern uint32_t __zero_table_start[], __zero_table_end[];
extern uint32_t __data_start[], __data_end[], __data_load[];
extern uint32_t __stack_bottom[], __stack_top[];

#define BOARD_STACK_PAINT 0xC0DEC0DEu

#endif /* BOARD_H */
