/*
 * kernels.c - see kernels.h. The weights were bounds-checked once by
 * colibri_init; nothing here checks again.
 */
#include "kernels.h"

#include "cbmath.h"

float cb_dot(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float cb_scale(const cb_tensor *t, size_t r, size_t g)
{
    size_t i = r * t->n_groups + g;
    if (t->scale_dtype == CB_F32)
        return ((const float *)(const void *)t->scales)[i];
    return cb_f16_to_f32(((const uint16_t *)(const void *)t->scales)[i]);
}

/* sum_g scale[r][g] * sum_{c in g} q[r][c] * x[c], the outliers not included */
static float cb_row_dot(const cb_tensor *t, size_t r, const float *x)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    float dot = 0.0f;
    if (t->dtype == CB_F32)
        return cb_dot((const float *)row, x, cols);
    if (t->dtype == CB_F16) {
        const uint16_t *w = (const uint16_t *)row;
        for (size_t c = 0; c < cols; c++)
            dot += cb_f16_to_f32(w[c]) * x[c];
        return dot;
    }
    const int8_t *q = (const int8_t *)row;
    for (size_t g = 0, c = 0; g < t->n_groups; g++) {
        size_t end = c + t->group_size < cols ? c + t->group_size : cols;
        float acc = 0.0f;
        for (; c < end; c++)
            acc += (float)q[c] * x[c];
        dot += cb_scale(t, r, g) * acc;
    }
    return dot;
}

void cb_matvec(const cb_tensor *t, const float *x, float *y, float alpha, int accumulate)
{
    uint64_t row_start = 0; /* flat index of W[r][0]: a running sum, so no division per outlier */
    size_t k = 0;           /* next outlier; sorted, so one pass over them serves all rows */
    uint64_t idx = t->n_outliers ? t->ogap[0] : 0;
    for (size_t r = 0; r < t->rows; r++, row_start += t->cols) {
        float dot = cb_row_dot(t, r, x);
        while (k < t->n_outliers && idx < row_start + t->cols) {
            dot += cb_f16_to_f32(t->oval[k]) * x[idx - row_start];
            if (++k < t->n_outliers)
                idx += t->ogap[k];
        }
        float v = alpha * dot;
        y[r] = accumulate ? y[r] + v : v;
    }
}

void cb_dequant_row(const cb_tensor *t, size_t r, float *out)
{
    const void *row = t->data + r * t->row_stride;
    size_t cols = t->cols;
    if (t->dtype == CB_F32) {
        memcpy(out, row, cols * sizeof(float));
    } else if (t->dtype == CB_F16) {
        for (size_t c = 0; c < cols; c++)
            out[c] = cb_f16_to_f32(((const uint16_t *)row)[c]);
    } else {
        const int8_t *q = (const int8_t *)row;
        for (size_t g = 0, c = 0; g < t->n_groups; g++) {
            size_t end = c + t->group_size < cols ? c + t->group_size : cols;
            float s = cb_scale(t, r, g);
            for (; c < end; c++)
                out[c] = s * (float)q[c];
        }
    }
    /* this row's outliers: the gaps are a running sum, so walk from the first one */
    uint64_t row_start = (uint64_t)r * cols, idx = 0;
    for (size_t k = 0; k < t->n_outliers; k++) {
        idx += t->ogap[k];
        if (idx >= row_start + cols)
            break;
        if (idx >= row_start)
            out[idx - row_start] += cb_f16_to_f32(t->oval[k]);
    }
}
