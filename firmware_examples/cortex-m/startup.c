/*
 * startup.c - reset, vector table and board support for Cortex-M (Armv7-M and
 * Armv8-M Mainline: the M7 of stm32h7, the M55 of cortex-m55).
 *
 * Reset_Handler enables the FPU (and with it MVE, which shares CP10/CP11),
 * points VTOR at this table, lets board_boot() set up .data/.bss, and calls main.
 * The console and the exit status go through semihosting (BKPT 0xAB); the
 * counter is SysTick on the processor clock, extended to 64 bits by its
 * wrap interrupt.
 */
#include "board.h"

int main(void);
void board_boot(void);
void Reset_Handler(void);
void Fault_Handler(void);
void SysTick_Handler(void);

#define REG32(addr) (*(volatile uint32_t *)(addr))
#define SCB_ICSR REG32(0xE000ED04u)
#define SCB_VTOR REG32(0xE000ED08u)
#define SCB_CFSR REG32(0xE000ED28u)
#define SCB_HFSR REG32(0xE000ED2Cu)
#define SCB_CPACR REG32(0xE000ED88u)
#define SYST_CSR REG32(0xE000E010u)
#define SYST_RVR REG32(0xE000E014u)
#define SYST_CVR REG32(0xE000E018u)
#define ICSR_PENDSTSET (1u << 26)
#define SYST_RELOAD 0x00FFFFFFu /* the full 24 bits: one interrupt per 2^24 cycles */

typedef union {
    void (*handler)(void);
    uint32_t *stack;
} vector;

/* Only the system exceptions: the example enables no peripheral interrupt. */
__attribute__((section(".vectors"), used)) const vector board_vectors[16] = {
    {.stack = __stack_top},
    {.handler = Reset_Handler},
    {.handler = Fault_Handler}, /* NMI */
    {.handler = Fault_Handler}, /* HardFault */
    {.handler = Fault_Handler}, /* MemManage */
    {.handler = Fault_Handler}, /* BusFault */
    {.handler = Fault_Handler}, /* UsageFault */
    {.handler = Fault_Handler}, /* SecureFault (Armv8-M) */
    {0}, {0}, {0},
    {.handler = Fault_Handler}, /* SVCall */
    {.handler = Fault_Handler}, /* DebugMonitor */
    {0},
    {.handler = Fault_Handler}, /* PendSV */
    {.handler = SysTick_Handler},
};

void Reset_Handler(void)
{
    /* CP10/CP11 full access: the FPU, and on Armv8.1-M the MVE (Helium) unit.
     * Nothing before this point may touch a floating-point register. */
    SCB_CPACR |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    SCB_VTOR = (uint32_t)(uintptr_t)board_vectors; /* the part may boot through an alias */
    board_boot();
    board_exit(main());
}

long board_semihost(long op, const void *arg)
{
    register long r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}


void Fault_Handler(void)
{
    uint32_t ipsr;
    __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
    board_puts("\nfault: exception ");
    board_put_dec(ipsr & 0x1ffu);
    board_puts(", CFSR ");
    board_put_hex(SCB_CFSR);
    board_puts(", HFSR ");
    board_put_hex(SCB_HFSR);
    board_puts("\n");
    board_exit(4);
}

/* Counter: SysTick counts down from SYST_RELOAD on the processor clock; each
 * wrap adds one to board_wraps. On QEMU (run with -icount) the processor clock
 * is virtual time, so the firmware built for QEMU converts ticks to instructions. */
static volatile uint32_t board_wraps;

void SysTick_Handler(void)
{
    board_wraps++;
}

void board_counter_start(void)
{
    SYST_CSR = 0;
    SYST_RVR = SYST_RELOAD;
    SYST_CVR = 0;
    board_wraps = 0;
    SYST_CSR = 7; /* processor clock, interrupt on wrap, enable */
    while (SYST_CVR == 0) /* the first tick loads SYST_RELOAD */
        ;
}

static uint64_t board_ticks(void)
{
    uint32_t wraps, now, pending;
    do {
        wraps = board_wraps;
        now = SYST_CVR;
        pending = SCB_ICSR & ICSR_PENDSTSET;
    } while (wraps != board_wraps);
    if (pending && now > SYST_RELOAD / 2) /* wrapped, interrupt not yet taken */
        wraps++;
    return (uint64_t)wraps * (SYST_RELOAD + 1u) + (SYST_RELOAD - now);
}

#if defined(COLIBRI_FW_INSN_PER_TICK_NUM) && defined(COLIBRI_FW_INSN_PER_TICK_DEN)
/* QEMU -icount: every instruction advances virtual time by a fixed step, so
 * ticks of the emulated processor clock convert exactly to instructions. */
const char board_counter_name[] = "instructions";
uint64_t board_counter(void)
{
    return board_ticks() * COLIBRI_FW_INSN_PER_TICK_NUM / COLIBRI_FW_INSN_PER_TICK_DEN;
}
#else
const char board_counter_name[] = "cycles";
uint64_t board_counter(void)
{
    return board_ticks();
}
#endif
