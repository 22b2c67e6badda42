/* Kernels of the miniature runtime. */
static const float bias_table[32] = {1.0f, 2.0f, 3.0f};

void colibri_matvec(float *out, const float *w, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float s = bias_table[r & 31];
        for (int c = 0; c < cols; c++) s += w[r * cols + c] * x[c];
        out[r] = s;
    }
}

float cb_rmsnorm(float *out, const float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = ss / (float)n + 1e-5f;
    float inv = 1.0f / (ss * 0.5f + 0.5f);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv;
    return inv;
}
