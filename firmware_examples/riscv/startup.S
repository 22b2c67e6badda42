/*
 * startup.S - reset entry for RV32 in machine mode (rv32imac): global pointer,
 * stack, trap vector and thread pointer, then board_boot() (.data, .bss, arena)
 * and main. Linked first in flash (section .vectors): the core starts here.
 */
    .section .vectors, "ax", %progbits
    .globl _start
    .type _start, %function
_start:
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    la sp, __stack_top
    la t0, board_trap_entry
    csrw mtvec, t0
    la tp, __tls_base            /* picolibc's thread-local errno lives in .tdata/.tbss */
    call board_boot
    call main
    tail board_exit
    .size _start, . - _start

    .text
    /* Any trap is a fault here (no interrupt is enabled): report and exit. */
    .balign 4
    .globl board_trap_entry
    .type board_trap_entry, %function
board_trap_entry:
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    tail board_trap
    .size board_trap_entry, . - board_trap_entry

    /* long board_semihost(long op, const void *arg): the RISC-V semihosting
     * sequence, three uncompressed instructions that must not straddle a page. */
    .balign 16
    .globl board_semihost
    .type board_semihost, %function
board_semihost:
    .option push
    .option norvc
    slli zero, zero, 0x1f
    ebreak
    srai zero, zero, 7
    .option pop
    ret
    .size board_semihost, . - board_semihost

    .section .note.GNU-stack, "", %progbits
