/* Hosted demo: links the runtime statically and prints through libc. */
#include <stdio.h>

int colibri_forward(int token, float *logits, int n);
const char *colibri_strerror(int err);

int main(int argc, char **argv) {
    float logits[16];
    int err = colibri_forward(argc, logits, 16);
    printf("%s %s %f\n", argv[0], colibri_strerror(err), (double)logits[3]);
    return err;
}
