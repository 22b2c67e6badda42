/* Bare-metal entry for the firmware fixtures: no libc, our own mem* for the compiler. */
#include <stddef.h>

int colibri_forward(int token, float *logits, int n);
extern unsigned char __data_load[], __data_start[], __data_end[], __bss_start[], __bss_end[];

void *memcpy(void *d, const void *s, size_t n) { unsigned char *a = d; const unsigned char *b = s; while (n--) *a++ = *b++; return d; }
void *memset(void *d, int c, size_t n) { unsigned char *a = d; while (n--) *a++ = (unsigned char)c; return d; }

volatile int fw_status = 7;
float fw_logits[16];

void _start(void) {
    memcpy(__data_start, __data_load, (size_t)(__data_end - __data_start));
    memset(__bss_start, 0, (size_t)(__bss_end - __bss_start));
    fw_status = colibri_forward(1, fw_logits, 16);
    for (;;) {}
}
