/*
 * boot.c - the C runtime's start, shared by every family: called by the reset
 * code with a stack and nothing else. It copies .data from its load image in
 * flash, clears what the linker script's zero table lists (.tbss, .bss and the
 * model arena) and fills the unused stack with a pattern for board_stack_used.
 * The weights stay in flash: .data is the only thing copied.
 */
#include "board.h"

void board_boot(void);

/* Runs before .data and .bss exist, so it touches no static storage. */
void board_boot(void)
{
    const uint32_t *src = __data_load;
    for (uint32_t *dst = __data_start; dst < __data_end;)
        *dst++ = *src++;
    for (const uint32_t *z = __zero_table_start; z < __zero_table_end; z += 2)
        for (uint32_t *p = (uint32_t *)z[0]; p < (uint32_t *)z[1];)
            *p++ = 0;
    /* Paint from the bottom of the stack to a little below this frame: whatever
     * the loop itself calls (a compiler-generated memset) lives in the margin. */
    volatile uint32_t here = 0;
    uintptr_t limit = (uintptr_t)&here - 256;
    for (uint32_t *p = __stack_bottom; (uintptr_t)p < limit;)
        *p++ = BOARD_STACK_PAINT;
}

size_t board_stack_used(void)
{
    const uint32_t *p = __stack_bottom;
    while (p < __stack_top && *p == BOARD_STACK_PAINT)
        p++;
    return (size_t)((const char *)__stack_top - (const char *)p);
}
