/* semihost.c - console and exit status over semihosting, the same on every family:
 * only the trap instruction differs, and that lives in board_semihost. */
#include "board.h"

void board_puts(const char *s)
{
    board_semihost(0x04, s); /* SYS_WRITE0 */
}

_Noreturn void board_exit(int status)
{
    /* SYS_EXIT_EXTENDED: on AArch32 and RV32 plain SYS_EXIT cannot carry a status, this can. */
    const uint32_t block[2] = {0x20026u /* ADP_Stopped_ApplicationExit */, (uint32_t)status};
    board_semihost(0x20, block);
    for (;;)
        __asm__ volatile("wfi");
}
