/* Generated-code stand-in: constant tables and the static arena. */
const int colibri_model_dims[8] = {64, 2, 4, 2, 320, 256, 0, 1};
unsigned char colibri_arena[16384] __attribute__((aligned(64)));
