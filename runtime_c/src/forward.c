/*
 * forward.c - the forward pass: Mixtral, and the features of Qwen2-MoE,
 * Qwen3-MoE, OLMoE and DeepSeek-MoE that the header's flags switch on.
 *
 * The blob was checked by blob.c before the context existed, so nothing here
 * checks it again. The activations live in the arena buffers the blob's plan
 * places (cb_format.h's CB_BUF_*); each is touched only within the steps of its
 * lifetime (FORMAT.md "Arena"), so buffers never live together may share
 * memory. Reading order: tensors and matrix products, the small operations,
 * then one layer's steps in order (cb_layer), a block of tokens through all
 * layers (cb_block), and the API.
 */
#include <float.h>

#include "cb_runtime.h"

#include "cbmath.h"

/* ------------------------------------------------- tensors and products */

/* An entry of the validated blob as kernel arguments. */
static cb_tensor cb_tensor_at(const colibri_ctx *c, size_t i)
{
    const uint8_t *e = cb_entry(c->blob, i);
    uint64_t scale_off = cb_rd64(e + CB_E_SCALE_OFF), oidx_off = cb_rd64(e + CB_E_OIDX_OFF);
    uint64_t oval_off = cb_rd64(e + CB_E_OVAL_OFF);
    cb_tensor t = {
        .data = c->blob + cb_rd64(e + CB_E_DATA_OFF),
        .scales = scale_off ? c->blob + scale_off : NULL,
        .ogap = oidx_off ? (const uint16_t *)(const void *)(c->blob + oidx_off) : NULL,
        .oval = oval_off ? (const uint16_t *)(const void *)(c->blob + oval_off) : NULL,
        .rows = cb_rd32(e + CB_E_ROWS),
        .cols = cb_rd32(e + CB_E_COLS),
        .row_stride = cb_rd32(e + CB_E_ROW_STRIDE),
        .group_size = cb_rd32(e + CB_E_GROUP_SIZE),
        .n_outliers = cb_rd32(e + CB_E_N_OUTLIERS),
        .dtype = e[CB_E_DTYPE],
        .scale_dtype = e[CB_E_SCALE_DTYPE],
    };
    t.n_groups = t.scale_dtype ? (uint32_t)cb_ceil_div(t.cols, t.group_size) : 0;
    t.q8 = (uint8_t)cb_is_q8(&c->m, t.dtype, t.cols, t.group_size);
    t.tiled = (uint8_t)(t.q8 && !cb_is_int4(t.dtype) && c->m.layout == CB_LAYOUT_TILED16); /* int4: rows */
    t.sw_prefetch = c->q8_sw_prefetch;
    return t;
}

static const float *cb_vector(const colibri_ctx *c, size_t i) /* an F32 1 x n tensor */
{
    return (const float *)(const void *)(c->blob + cb_rd64(cb_entry(c->blob, i) + CB_E_DATA_OFF));
}

/* Rows j0..j1 of x (width cols) quantized into the xq buffer: one row of cb_xq_row_bytes a token. */
static void cb_quantize_rows(const colibri_ctx *c, const float *const *x, size_t j0, size_t j1, size_t cols,
                             cb_xq *xq)
{
    size_t row = (size_t)cb_xq_row_bytes(&c->m, c->blob), blocks = cb_ceil_div((uint32_t)cols, CB_Q8_BLOCK);
    size_t q_bytes = (size_t)cb_align64(blocks * CB_Q8_BLOCK), d_bytes = (size_t)cb_align64(blocks * 4);
    for (size_t j = j0; j < j1; j++) {
        /* the xq buffer: block rows of row bytes */
        int8_t *q = c->xq + j * row;
        float *d = (float *)(void *)(q + q_bytes);
        int32_t *s = (int32_t *)(void *)(q + q_bytes + d_bytes);
        cb_quantize_q8(x[j], cols, q, d, s);
        xq[j].q = q;
        xq[j].d = d;
        xq[j].s = s;
    }
}

static void cb_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps);

/* A step every token of a block takes on its own rows (a norm, SwiGLU, the quantization of a matmul's
 * input), split over the parallel hook by tokens: task i of T takes tokens n i / T to n (i + 1) / T, each
 * through the same operations as alone, so the split changes no bit. */
typedef struct cb_tok_job {
    const colibri_ctx *c;
    size_t n, tasks, cols;
    float *const *out;      /* norm: out[j] = rmsnorm(in[j]) * w; swiglu: gate rows, silu(gate) * up */
    const float *const *in; /* norm: its input rows; swiglu: the up rows; NULL: only the quantization */
    const float *w;         /* norm: its weight; NULL: swiglu */
    cb_xq *xq;              /* then out[j] quantized into the xq buffer, NULL: not */
} cb_tok_job;

static void cb_tok_task(void *job, size_t i)
{
    const cb_tok_job *t = (const cb_tok_job *)job;
    const size_t j0 = t->n * i / t->tasks, j1 = t->n * (i + 1) / t->tasks;
    for (size_t j = j0; t->in && j < j1; j++)
        if (t->w)
            cb_rmsnorm(t->out[j], t->in[j], t->w, t->cols, t->c->m.rms_eps);
        else
            cb_silu_mul(t->out[j], t->in[j], t->cols); /* silu(gate) * up */
    if (t->xq)
        cb_quantize_rows(t->c, (const float *const *)t->out, j0, j1, t->cols, t->xq);
}

#define CB_PARALLEL_MIN_ELEMS 4096u /* per-token steps of fewer elements stay on the calling thread */

/* The step (cb_tok_job's fields) for the n tokens; with xq and integer matmuls, out's rows quantized as
 * cb_quantize does (returned; else NULL). The job lives in this frame, not in its callers' (firmware: the
 * stack bound follows the deepest path, which runs through those callers to the matmuls). */
static const cb_xq *cb_tok_run(const colibri_ctx *c, size_t n, size_t cols, float *const *out,
                               const float *const *in, const float *w, cb_xq *xq)
{
    cb_tok_job job = {c, n, 1, cols, out, in, w, c->m.xq_off ? xq : NULL};
#ifndef COLIBRI_NO_PARALLEL /* (firmware: no indirect call, so the stack bound stays static) */
    job.tasks = c->parallel_tasks < n ? c->parallel_tasks : n;
    if (c->parallel_for && job.tasks > 1 && n * cols >= CB_PARALLEL_MIN_ELEMS) {
        c->parallel_for(cb_tok_task, &job, job.tasks, c->parallel_user);
        return job.xq;
    }
    job.tasks = 1;
#endif
    cb_tok_task(&job, 0);
    return job.xq;
}

/* The n rows x[j] of width cols quantized into the xq buffer (FORMAT.md "Integer matmuls"), for every
 * q8 matrix that takes them; NULL without integer matmuls (float activations).
 * The xq buffer holds one quantized row per token of a block: the rows stay valid until the next call. */
static const cb_xq *cb_quantize(const colibri_ctx *c, const float *const *x, size_t n, size_t cols, cb_xq *xq)
{ /* (a width of partial blocks is quantized too: int4 matrices take any) */
    return cb_tok_run(c, n, cols, (float *const *)x, NULL, NULL, xq);
}

/* out[j] = rmsnorm(in[j]) * w for the n tokens; with xq, the out rows quantized as cb_quantize does
 * (returned; NULL without integer matmuls). */
static const cb_xq *cb_norm_rows(const colibri_ctx *c, float *const *out, float *const *in, const float *w,
                                 size_t n, size_t cols, cb_xq *xq)
{
    return cb_tok_run(c, n, cols, out, (const float *const *)in, w, xq);
}

/* One matmul of a group: y[j] = (accumulate ? y[j] : 0) + alpha[j] * W x[j] for the group's n tokens. */
typedef struct cb_mm_part {
    cb_tensor t;
    const float *const *x;
    const cb_xq *xq; /* q8 tensors: the tokens' int8 activations */
    float *const *y;
    const float *alpha;
    int accumulate;
} cb_mm_part;

#define CB_MM_GROUP 3 /* matmuls one parallel region may hold (q, k, v) */

typedef struct cb_mm_job {
    cb_mm_part *p;
    size_t parts, n, n_tasks, units; /* units: the parts' rows in whole tiles (4 rows for float), summed */
    int scalar;  /* float matrices of a blob with integer matmuls: the scalar kernel (see cb_mm) */
    int through; /* the parts add into the same output rows: units are tiles of those rows, each through
                    every part in order, so each row's sums come in the parts' order whatever the split */
} cb_mm_job;

static size_t cb_mm_unit(const cb_tensor *t)
{
    return t->q8 ? CB_TILE16_ROWS : 4;
}

/* Rows [r0, r1) of one part: the kernel computes every row the same way whatever its range. */
static void cb_mm_rows(const cb_mm_job *j, const cb_mm_part *p, size_t r0, size_t r1)
{
    if (r0 >= r1)
        return;
    if (p->xq)
        cb_matmul_q8(&p->t, r0, r1, j->n, p->xq, p->x, p->y, p->alpha, p->accumulate);
    else if (cb_is_int16(p->t.dtype)) /* integer, the same bits on every ISA (kernels.h "int16 matmuls") */
        cb_matmul_q16(&p->t, r0, r1, j->n, p->x, p->y, p->alpha, p->accumulate);
    else if (j->scalar) /* the router and --attn-quant's f32/f16 matrices: cb_matmul_scalar, whose float sums have
                           one order on every ISA (cb_dot's), so a q8 blob's forward pass is the same bits everywhere */
        cb_matmul_scalar(&p->t, r0, r1, j->n, p->x, p->y, p->alpha, p->accumulate);
    else
        cb_matmul(&p->t, r0, r1, j->n, p->x, p->y, p->alpha, p->accumulate);
}

#ifndef COLIBRI_NO_PARALLEL
/* Task i of a group's parallel region: the units [units * i / n, units * (i + 1) / n) of the parts' rows
 * laid end to end, so the split does not depend on where one matmul ends and the next begins, and the
 * result does not depend on the split; `through`, those output rows through every part in order. */
static void cb_mm_task(void *job, size_t i)
{
    const cb_mm_job *j = (const cb_mm_job *)job;
    size_t u0 = (size_t)((uint64_t)j->units * i / j->n_tasks), u1 = (size_t)((uint64_t)j->units * (i + 1) / j->n_tasks);
    if (j->through) {
        size_t rows = j->p[0].t.rows, r1 = u1 * CB_TILE16_ROWS < rows ? u1 * CB_TILE16_ROWS : rows;
        for (size_t k = 0; k < j->parts; k++)
            cb_mm_rows(j, &j->p[k], u0 * CB_TILE16_ROWS, r1);
        return;
    }
    for (size_t k = 0, first = 0; k < j->parts && first < u1; k++) {
        const cb_mm_part *p = &j->p[k];
        size_t unit = cb_mm_unit(&p->t), n_units = (p->t.rows + unit - 1) / unit;
        size_t a = u0 > first ? u0 - first : 0, b = u1 - first < n_units ? u1 - first : n_units;
        if (a < b)
            cb_mm_rows(j, p, a * unit, b * unit < p->t.rows ? b * unit : p->t.rows);
        first += n_units;
    }
}

#define CB_PARALLEL_MIN_MACS 16384u /* smaller matmuls stay on the calling thread */
#endif

/* The n tokens through the parts' matmuls, one parallel region for all of them when the context has a
 * parallel_for: the parts write distinct outputs, or with `through` add into the same output rows (every
 * part's rows the same) in the parts' order. Sets each part's xq to NULL where its matrix is not q8. */
static void cb_mm_parts(const colibri_ctx *c, size_t n, cb_mm_part *parts, size_t n_parts, int through)
{
    cb_mm_job job = {parts, n_parts, n, 0, 0, CB_INT8_ACTS(c), through};
    uint64_t macs = 0;
    for (size_t k = 0; k < job.parts; k++) {
        const cb_tensor *t = &job.p[k].t;
        if (!t->q8)
            job.p[k].xq = NULL;
        job.units += (t->rows + cb_mm_unit(t) - 1) / cb_mm_unit(t);
        macs += (uint64_t)t->rows * t->cols * job.n;
    }
    if (through && n_parts)
        job.units = (parts[0].t.rows + CB_TILE16_ROWS - 1) / CB_TILE16_ROWS;
#ifndef COLIBRI_NO_PARALLEL /* (firmware: no indirect call, so the stack bound stays static) */
    job.n_tasks = c->parallel_tasks < job.units ? c->parallel_tasks : job.units;
    if (c->parallel_for && job.n_tasks > 1 && macs >= CB_PARALLEL_MIN_MACS) {
        c->parallel_for(cb_mm_task, &job, job.n_tasks, c->parallel_user);
        return;
    }
#endif
    for (size_t k = 0; k < job.parts; k++) /* part by part: through, each row's sums in the parts' order */
        cb_mm_rows(&job, &job.p[k], 0, job.p[k].t.rows);
}

/* One to three matmuls of the same n tokens into distinct outputs, as one parallel region. */
static void cb_mm3(const colibri_ctx *c, size_t n, const cb_mm_part *parts, size_t n_parts)
{
    cb_mm_part p[CB_MM_GROUP];
    for (size_t k = 0; k < n_parts; k++)
        p[k] = parts[k];
    cb_mm_parts(c, n, p, n_parts, 0);
}

/* y[j] = (accumulate ? y[j] : 0) + alpha[j] * W x[j] for the n tokens, W the tensor at table index i;
 * xq: the x[j] quantized by cb_quantize, which a q8 W multiplies instead (a q8 W always has them). */
static void cb_mm(const colibri_ctx *c, size_t i, size_t n, const float *const *x, const cb_xq *xq,
                  float *const *y, const float *alpha, int accumulate)
{
    const cb_mm_part part = {cb_tensor_at(c, i), x, xq, y, alpha, accumulate};
    cb_mm3(c, n, &part, 1);
}


#define CB_ONE4 1.0f, 1.0f, 1.0f, 1.0f
#define CB_ONE32 CB_ONE4, CB_ONE4, CB_ONE4, CB_ONE4, CB_ONE4, CB_ONE4, CB_ONE4, CB_ONE4
#if CB_MAX_BLOCK == 32u
static const float cb_ones[CB_MAX_BLOCK] = {CB_ONE32};
#else
static const float cb_ones[CB_MAX_BLOCK] = {CB_ONE32, CB_ONE32, CB_ONE32, CB_ONE32};
#endif
_Static_assert(sizeof cb_ones / sizeof *cb_ones == CB_MAX_BLOCK, "one weight per token of a block");

/* The row pointers of a block's tokens in a buffer of rows of width w */
static void cb_rows(float *buf, size_t w, size_t n, float **out)
{
    for (size_t j = 0; j < n; j++)
        out[j] = buf + j * w;
}

/* --------------------------------------------------------- small steps */

static void cb_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float inv = 1.0f / cb_sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * inv * w[i];
}

/* HF rotate_half: dimension i pairs with i + head_dim/2, not with its neighbour.
 * One angle per frequency serves every query and key head. */
static void cb_rotary(float *q, size_t n_q, float *k, size_t n_k, size_t hd, const float *inv_freq, size_t pos)
{
    size_t half = hd / 2;
    for (size_t i = 0; i < half; i++) {
        float angle = inv_freq[i] * (float)pos;
        float cs = cb_cosf(angle), sn = cb_sinf(angle);
        for (size_t h = 0; h < n_q + n_k; h++) {
            float *v = h < n_q ? q + h * hd : k + (h - n_q) * hd;
            float a = v[i], b = v[i + half];
            v[i] = a * cs - b * sn;
            v[i + half] = b * cs + a * sn;
        }
    }
}

/* Steps 1 (the biases and q/k norms after the projections) and 2 (rotary at pos) for one token;
 * base is the layer's first table index. */
static void cb_qk(const colibri_ctx *c, size_t base, const cb_slots *s, float *q, float *k, float *v, size_t pos)
{
    const size_t hd = CB_HEAD_DIM(c), qdim = CB_N_HEADS(c) * hd, kvdim = CB_N_KV_HEADS(c) * hd;
    const float eps = c->m.rms_eps;
    const uint32_t flags = CB_FLAGS(c);
    if (flags & CB_FLAG_QKV_BIAS) { /* Qwen2-MoE: + biases */
        const float *bq = cb_vector(c, base + s->qkv_bias + CB_OFF_BQ);
        const float *bk = cb_vector(c, base + s->qkv_bias + CB_OFF_BK);
        const float *bv = cb_vector(c, base + s->qkv_bias + CB_OFF_BV);
        for (size_t i = 0; i < qdim; i++)
            q[i] += bq[i];
        for (size_t i = 0; i < kvdim; i++) {
            k[i] += bk[i];
            v[i] += bv[i];
        }
    }
    if (flags & CB_FLAG_QK_NORM_FULL) { /* OLMoE: RMSNorm of the whole q and k */
        cb_rmsnorm(q, q, cb_vector(c, base + s->qk_norm + CB_OFF_Q_NORM), qdim, eps);
        cb_rmsnorm(k, k, cb_vector(c, base + s->qk_norm + CB_OFF_K_NORM), kvdim, eps);
    } else if (flags & CB_FLAG_QK_NORM_HEAD) { /* Qwen3-MoE: RMSNorm of each head */
        for (size_t h = 0; h < CB_N_HEADS(c); h++)
            cb_rmsnorm(q + h * hd, q + h * hd, cb_vector(c, base + s->qk_norm + CB_OFF_Q_NORM), hd, eps);
        for (size_t h = 0; h < CB_N_KV_HEADS(c); h++)
            cb_rmsnorm(k + h * hd, k + h * hd, cb_vector(c, base + s->qk_norm + CB_OFF_K_NORM), hd, eps);
    }
    cb_rotary(q, CB_N_HEADS(c), k, CB_N_KV_HEADS(c), hd, cb_vector(c, CB_T_ROPE_FREQ), pos);
}

/* One layer's KV cache (FORMAT.md "KV cache"): its key and value rows (cb_kv_row_bytes each) from the
 * layer's first, `rows` positions (position p in row p % rows: a ring when the layer's window makes it
 * shorter than max_seq), and the window (0: full attention). */
typedef struct cb_kv_layer {
    uint8_t *keys, *values;
    size_t rows, window;
} cb_kv_layer;

/* Layer l's cache, its first row `first` rows into the caches (the rows of the layers before it). */
static cb_kv_layer cb_kv_layer_at(const colibri_ctx *c, size_t l, size_t first)
{
    const size_t row = (size_t)cb_kv_row_bytes(&c->m);
    const uint32_t window = cb_layer_window(c->blob, &c->m, (uint32_t)l);
    cb_kv_layer kv = {(uint8_t *)c->buf[CB_BUF_KEY_CACHE] + first * row,
                      (uint8_t *)c->buf[CB_BUF_VALUE_CACHE] + first * row,
                      (size_t)cb_kv_layer_rows(window, &c->m), window};
    return kv;
}

/* The row of position pos in a layer's key (or, value: value) cache. */
static uint8_t *cb_kv_rows(const colibri_ctx *c, const cb_kv_layer *kv, int value, size_t pos)
{
    return (value ? kv->values : kv->keys) + pos % kv->rows * (size_t)cb_kv_row_bytes(&c->m);
}

/* One position's new keys (or values) k, f32, into its row of a 16- or 8-bit cache. */
static void cb_kv_store(const colibri_ctx *c, uint8_t *row, const float *k)
{
    const size_t hd = CB_HEAD_DIM(c), n_kv = CB_N_KV_HEADS(c), kvdim = n_kv * hd;
    if (CB_KV(c) & CB_FLAG_KV_F16) {
        uint16_t *h = (uint16_t *)(void *)row;
        for (size_t i = 0; i < kvdim; i++)
            h[i] = cb_f32_to_f16(k[i]); /* round to nearest even */
        return;
    }
    float *scale = (float *)(void *)(row + (kvdim + 3) / 4 * 4); /* after the int8 values, 4-byte aligned */
    for (size_t h = 0; h < n_kv; h++)
        cb_kv_quantize(k + h * hd, hd, (int8_t *)row + h * hd, scale + h);
}

/* out[i] += the weighted rows (kernel WR, the attention's cb_weighted_rows of a cache type) for i < hd,
 * eight outputs at a time through a register-sized temporary: the second part of a ring's positions */
#define CB_ADD_WEIGHTED(WR, out, w, rows, stride, n, hd)                                                  \
    do {                                                                                                  \
        for (size_t i0_ = 0; i0_ < (hd); i0_ += 8) {                                                      \
            float t_[8];                                                                                  \
            size_t len_ = (hd) - i0_ < 8 ? (hd) - i0_ : 8;                                                \
            WR(t_, w, (rows) + i0_, stride, n, len_);                                                     \
            for (size_t l_ = 0; l_ < len_; l_++)                                                          \
                (out)[i0_ + l_] += t_[l_];                                                                \
        }                                                                                                 \
    } while (0)

/* softmax of the n scores, with the head's sink (gpt-oss, ATTN_SINKS) as one more logit: scores[n], then
 * dropped (its weight goes to no value) */
static void cb_softmax_sink(float *scores, size_t n, const float *sinks, size_t h)
{
    if (sinks)
        scores[n] = sinks[h];
    cb_softmax(scores, n + (sinks != NULL));
}

/* Step 3: causal attention of position pos (query q) over the cached keys/values it sees, into att, for the
 * heads h0..h1-1: the positions lo..pos, lo = 0 or, in a layer of window W, pos + 1 - W (transformers' sliding
 * window: keys at positions > pos - W). In a ring they are rows lo % rows.. then, past the ring's end, rows 0.. */
static void cb_attention(const colibri_ctx *c, const cb_kv_layer *kvl, size_t pos, const float *sinks,
                         const float *q_all, float *att_all, float *scores, size_t h0, size_t h1)
{
    const size_t hd = CB_HEAD_DIM(c), n_heads = CB_N_HEADS(c), kvdim = CB_N_KV_HEADS(c) * hd;
    const size_t group = n_heads / CB_N_KV_HEADS(c); /* query heads sharing one kv head */
    const uint32_t kv_type = CB_KV(c);
    const size_t lo = kvl->window && pos >= kvl->window ? pos + 1 - kvl->window : 0, n = pos + 1 - lo;
    const size_t r0 = lo % kvl->rows, n1 = n < kvl->rows - r0 ? n : kvl->rows - r0, n2 = n - n1;
    const uint8_t *keys = kvl->keys, *values = kvl->values;
    const size_t row = (size_t)cb_kv_row_bytes(&c->m), scale_at = (kvdim + 3) / 4 * 4; /* int8: the scales */
    const float scale = 1.0f / cb_sqrtf((float)hd);
    for (size_t h = h0; h < h1; h++) {
        const float *q = q_all + h * hd;
        float *att = att_all + h * hd;
        size_t kv = (h / group) * hd;
        if (kv_type & CB_FLAG_KV_F16) {
            const uint16_t *k16 = (const uint16_t *)(const void *)keys + kv, *v16 = (const uint16_t *)(const void *)values + kv;
            const size_t st = row / 2;
            cb_scores_f16(scores, q, k16 + r0 * st, st, n1, hd, scale);
            if (n2)
                cb_scores_f16(scores + n1, q, k16, st, n2, hd, scale);
            cb_softmax_sink(scores, n, sinks, h);
            cb_weighted_rows_f16(att, scores, v16 + r0 * st, st, n1, hd);
            if (n2)
                CB_ADD_WEIGHTED(cb_weighted_rows_f16, att, scores + n1, v16, st, n2, hd);
        } else if (kv_type & CB_FLAG_KV_INT8) {
            const float *ks = (const float *)(const void *)(keys + scale_at) + h / group;
            const float *vs = (const float *)(const void *)(values + scale_at) + h / group;
            const int8_t *k8 = (const int8_t *)keys + kv, *v8 = (const int8_t *)values + kv;
            cb_scores_i8(scores, q, k8 + r0 * row, row, ks + r0 * (row / 4), row / 4, n1, hd, scale);
            if (n2)
                cb_scores_i8(scores + n1, q, k8, row, ks, row / 4, n2, hd, scale);
            cb_softmax_sink(scores, n, sinks, h);
            for (size_t t = 0; t < n; t++) /* each position's value scale folded into its weight */
                scores[t] = scores[t] * vs[(t < n1 ? r0 + t : t - n1) * (row / 4)];
            cb_weighted_rows_i8(att, scores, v8 + r0 * row, row, n1, hd);
            if (n2)
                CB_ADD_WEIGHTED(cb_weighted_rows_i8, att, scores + n1, v8, row, n2, hd);
        } else {
            const float *k32 = (const float *)(const void *)keys + kv, *v32 = (const float *)(const void *)values + kv;
            cb_scores(scores, q, k32 + r0 * kvdim, kvdim, n1, hd, scale);
            if (n2)
                cb_scores(scores + n1, q, k32, kvdim, n2, hd, scale);
            cb_softmax_sink(scores, n, sinks, h);
            cb_weighted_rows(att, scores, v32 + r0 * kvdim, kvdim, n1, hd);
            if (n2)
                CB_ADD_WEIGHTED(cb_weighted_rows, att, scores + n1, v32, kvdim, n2, hd);
        }
    }
}

/* out[j] += alpha[j] * down(silu(gate xb[j]) * up xb[j]) for n tokens: the MLP whose gate is at table
 * index i (CB_MLP_GATE, CB_MLP_DOWN, CB_MLP_UP from there), of width w, its gate and up rows in the
 * buffers gate and up. */
/* v[i] += alpha * b[i] for i < n */
static void cb_add_vector(float *v, const float *b, float alpha, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] += alpha * b[i];
}

/* What changes a routed expert (gpt-oss): its biases (table index of its B_GATE, 0: none) and, with clamp,
 * the clamped SwiGLU's gain and limit instead of SiLU. */
typedef struct cb_expert_extra {
    size_t bias;
    int clamp;
    float alpha, limit;
} cb_expert_extra;

/* gpt-oss's clamped SwiGLU into g (FORMAT.md CLAMPED_SWIGLU): NaN compares false, so it stays NaN */
static void cb_clamped_swiglu(float *g, const float *u, size_t n, float alpha, float limit)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] > limit ? limit : g[i];
        float ui = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
        g[i] = (ui + 1.0f) * (gi / (1.0f + cb_expf(-(gi * alpha))));
    }
}

/* g[j] = silu(g[j]) * u[j] (x->clamp: gpt-oss's clamped form) for the n rows of width w, then quantized
 * into the xq buffer as cb_quantize does (returned; NULL without integer matmuls): the down projection's
 * input, split over the threads by tokens (cb_tok_run). */
static const cb_xq *cb_swiglu_rows(const colibri_ctx *c, float *const *g, float *const *u, size_t n, size_t w,
                                   const cb_expert_extra *x, cb_xq *xq)
{
    if (x && x->clamp) {
        for (size_t j = 0; j < n; j++)
            cb_clamped_swiglu(g[j], u[j], w, x->alpha, x->limit);
        return cb_quantize(c, (const float *const *)g, n, w, xq);
    }
    return cb_tok_run(c, n, w, g, (const float *const *)u, NULL, xq);
}

static void cb_mlp_x(const colibri_ctx *c, size_t i, size_t n, const float *const *xb, float *gate, float *up,
                     size_t w, float *const *out, const float *alpha, const cb_expert_extra *x)
{
    float *g[CB_MAX_BLOCK] = {NULL}, *u[CB_MAX_BLOCK] = {NULL};
    cb_xq xq[CB_MAX_BLOCK];
    cb_rows(gate, w, n, g);
    cb_rows(up, w, n, u);
    const cb_xq *xbq = cb_quantize(c, xb, n, CB_HIDDEN(c), xq);
    const cb_mm_part gate_up[2] = {{cb_tensor_at(c, i + CB_MLP_GATE), xb, xbq, g, cb_ones, 0},
                                   {cb_tensor_at(c, i + CB_MLP_UP), xb, xbq, u, cb_ones, 0}};
    cb_mm3(c, n, gate_up, 2);
    if (x && x->bias)
        for (size_t j = 0; j < n; j++) {
            cb_add_vector(g[j], cb_vector(c, x->bias + CB_MLP_GATE), 1.0f, w);
            cb_add_vector(u[j], cb_vector(c, x->bias + CB_MLP_UP), 1.0f, w);
        }
    const float *const *h = (const float *const *)g;
    cb_mm(c, i + CB_MLP_DOWN, n, h, cb_swiglu_rows(c, g, u, n, w, x, xq), out, alpha, 1);
    if (x && x->bias) /* out += alpha (W h + b) */
        for (size_t j = 0; j < n; j++)
            cb_add_vector(out[j], cb_vector(c, x->bias + CB_MLP_DOWN), alpha[j], CB_HIDDEN(c));
}

static void cb_mlp(const colibri_ctx *c, size_t i, size_t n, const float *const *xb, float *gate, float *up,
                   size_t w, float *const *out, const float *alpha)
{
    cb_mlp_x(c, i, n, xb, gate, up, w, out, alpha, NULL);
}

static int cb_chosen(const size_t *chosen, size_t n, size_t e)
{
    for (size_t i = 0; i < n; i++)
        if (chosen[i] == e)
            return 1;
    return 0;
}

/* The routing of one token: its router logits in, and out the same row holding each chosen
 * expert's weight and CB_NOT_CHOSEN for every other expert (never a weight: probabilities are
 * >= 0 or NaN, routed_scale > 0). */
#define CB_NOT_CHOSEN (-FLT_MAX)

/* Group-limited top-k (CB_FLAG_GROUP_TOPK): the N_GROUP and TOPK_GROUP parameters, read once per MoE layer
 * and block; n_group 0 without the flag. */
typedef struct {
    size_t n_group, topk_group;
} cb_groups;

/* The choosing score of expert e: its score, plus its CHOICE_BIAS with sigmoid scoring (bias not NULL). */
static float cb_choice(const float *probs, const float *bias, size_t e)
{
    return bias ? probs[e] + bias[e] : probs[e];
}

/* The score of group g (experts g*size ...): its best choosing score, or with `top2` the sum of its best
 * two (reference.py group_scores); NaN if any of them is NaN. */
static float cb_group_score(const float *probs, const float *bias, size_t g, size_t size, int top2)
{
    float a = 0.0f, b = 0.0f; /* the best and second best of the first `seen` (at most 2) */
    size_t seen = 0;
    for (size_t e = g * size; e < (g + 1) * size; e++) {
        float x = cb_choice(probs, bias, e);
        if (x != x)
            return x;
        if (!seen || x > a) {
            b = a;
            a = x;
        } else if (seen == 1 || x > b) {
            b = x;
        }
        seen++;
    }
    return top2 && seen > 1 ? b + a : a;
}

/* Whether group (s, g) ranks before group (t, h): the higher score, ties to the lower index, NaN last
 * (the order of numpy's stable argsort of the negated scores). */
static int cb_group_before(float s, size_t g, float t, size_t h)
{
    if (s != s)
        return t != t && g < h;
    return t != t || s > t || (s == t && g < h);
}

/* Masks (CB_NOT_CHOSEN) the experts outside the topk_group best groups, as reference.py route_grouped.
 * With no room for a score per group, it finds the topk_group-th best group (the cut) by topk_group passes,
 * each taking the best group ranked after the previous one, then masks every group ranked after the cut:
 * topk_group·n_experts choosing scores read, no state but the cut. The caller then chooses among the
 * unmasked experts only (at least top_k of them: cb_validate checks top_k <= topk_group·group size). */
static void cb_limit_groups(const colibri_ctx *c, float *probs, const float *bias, const cb_groups *gr)
{
    const size_t size = CB_N_EXPERTS(c) / gr->n_group;
    const int top2 = bias != NULL;
    float cut_s = 0.0f;
    size_t cut_g = gr->n_group;
    for (size_t k = 0; k < gr->topk_group; k++) {
        float best_s = 0.0f;
        size_t best_g = gr->n_group;
        for (size_t g = 0; g < gr->n_group; g++) {
            float s = cb_group_score(probs, bias, g, size, top2);
            if ((cut_g == gr->n_group || cb_group_before(cut_s, cut_g, s, g))
                && (best_g == gr->n_group || cb_group_before(s, g, best_s, best_g))) {
                best_s = s;
                best_g = g;
            }
        }
        cut_s = best_s;
        cut_g = best_g;
    }
    for (size_t g = 0; g < gr->n_group; g++)
        if (cb_group_before(cut_s, cut_g, cb_group_score(probs, bias, g, size, top2), g))
            for (size_t e = g * size; e < (g + 1) * size; e++)
                probs[e] = CB_NOT_CHOSEN;
}

static void cb_route(const colibri_ctx *c, float *probs, const cb_groups *gr)
{
    const size_t n_exp = CB_N_EXPERTS(c), top_k = CB_TOP_K(c);
    const uint32_t flags = CB_FLAGS(c);
    size_t chosen[CB_MAX_TOP_K];
    float weight[CB_MAX_TOP_K], sum = 0.0f;
    cb_softmax(probs, n_exp);
    if (gr->n_group)
        cb_limit_groups(c, probs, NULL, gr);
    /* top_k by probability, ties to the lower index; NaNs still yield k distinct experts */
    for (size_t k = 0; k < top_k; k++) {
        size_t best = n_exp;
        for (size_t e = 0; e < n_exp; e++)
            if (probs[e] != CB_NOT_CHOSEN && !cb_chosen(chosen, k, e) && (best == n_exp || probs[e] > probs[best]))
                best = e;
        chosen[k] = best;
        weight[k] = probs[best];
        sum += weight[k]; /* summed in rank order, as torch sums the topk output */
    }
    for (size_t e = 0; e < n_exp; e++)
        probs[e] = CB_NOT_CHOSEN;
    for (size_t k = 0; k < top_k; k++) {
        float w = flags & CB_FLAG_TOPK_NO_NORM ? weight[k] : weight[k] / sum; /* HF norm_topk_prob */
        if (flags & CB_FLAG_ROUTED_SCALE)
            w *= c->m.routed_scale;
        probs[chosen[k]] = w;
    }
}

/* DeepSeek-V3's routing of one token (CB_FLAG_ROUTER_SIGMOID), in and out as cb_route: scores
 * sigmoid(logit); the top_k chosen by score + bias (CHOICE_BIAS, HF e_score_correction_bias), ties to the
 * lower index; weights their unbiased scores, divided by their sum + 1e-20 unless TOPK_NO_NORM, times
 * routed_scale. */
static void cb_route_sigmoid(const colibri_ctx *c, float *probs, const float *bias, const cb_groups *gr)
{
    const size_t n_exp = CB_N_EXPERTS(c), top_k = CB_TOP_K(c);
    const uint32_t flags = CB_FLAGS(c);
    size_t chosen[CB_MAX_TOP_K];
    float weight[CB_MAX_TOP_K], sum = 0.0f;
    for (size_t e = 0; e < n_exp; e++)
        probs[e] = 1.0f / (1.0f + cb_expf(-probs[e]));
    if (gr->n_group)
        cb_limit_groups(c, probs, bias, gr);
    for (size_t k = 0; k < top_k; k++) {
        size_t best = n_exp;
        for (size_t e = 0; e < n_exp; e++)
            if (probs[e] != CB_NOT_CHOSEN && !cb_chosen(chosen, k, e)
                && (best == n_exp || probs[e] + bias[e] > probs[best] + bias[best]))
                best = e;
        chosen[k] = best;
        weight[k] = probs[best];
        sum += weight[k];
    }
    for (size_t e = 0; e < n_exp; e++)
        probs[e] = CB_NOT_CHOSEN;
    for (size_t k = 0; k < top_k; k++) {
        float w = flags & CB_FLAG_TOPK_NO_NORM ? weight[k] : weight[k] / (sum + 1e-20f);
        if (flags & CB_FLAG_ROUTED_SCALE)
            w *= c->m.routed_scale;
        probs[chosen[k]] = w;
    }
}

#ifndef COLIBRI_NO_PARALLEL
/* One token's k routed experts without biases, their rows at the top of the gate and up buffers (k <= the
 * block's rows): every gate and up matrix as one parallel region, then every down matrix as one `through`
 * region (cb_mm_parts), so each output row sums the experts in increasing index order as cb_mlp_x expert by
 * expert does: the same bits, with two regions a layer instead of two an expert.
 * probs: the token's routing row (cb_route); xb its normed input, out its moe row. */
static void cb_moe1(const colibri_ctx *c, size_t first, const float *probs, const float *xb, float *out,
                    const cb_expert_extra *x)
{
    const size_t n_exp = CB_N_EXPERTS(c), ffn = CB_FFN(c), dim = CB_HIDDEN(c);
    const float *const *xin = &xb;
    float *g[CB_MAX_TOP_K], *u[CB_MAX_TOP_K], alpha[CB_MAX_TOP_K];
    size_t at[CB_MAX_TOP_K], k = 0;
    cb_xq xq[CB_MAX_TOP_K];
    cb_mm_part p[2 * CB_MAX_TOP_K]; /* gate and up of each expert; then the downs */
    const cb_xq *xbq = cb_quantize(c, xin, 1, dim, xq);
    for (size_t e = 0; e < n_exp; e++) {
        if (probs[e] == CB_NOT_CHOSEN)
            continue;
        at[k] = first + CB_MLP_TENSORS * e;
        alpha[k] = probs[e];
        g[k] = c->buf[CB_BUF_GATE] + k * ffn;
        u[k] = c->buf[CB_BUF_UP] + k * ffn;
        p[2 * k] = (cb_mm_part){cb_tensor_at(c, at[k] + CB_MLP_GATE), xin, xbq, &g[k], cb_ones, 0};
        p[2 * k + 1] = (cb_mm_part){cb_tensor_at(c, at[k] + CB_MLP_UP), xin, xbq, &u[k], cb_ones, 0};
        k++;
    }
    cb_mm_parts(c, 1, p, 2 * k, 0);
    const cb_xq *hq = cb_swiglu_rows(c, g, u, k, ffn, x, xq);
    for (size_t e = 0; e < k; e++)
        p[e] = (cb_mm_part){cb_tensor_at(c, at[e] + CB_MLP_DOWN), (const float *const *)&g[e], hq ? &hq[e] : NULL,
                            &out, &alpha[e], 1};
    cb_mm_parts(c, 1, p, k, 1);
}
#endif

/* Steps 7 and 8 of an MoE layer for the n tokens of a block: route each xb row to top_k experts and
 * accumulate their weighted sum (and the shared expert's output) into its moe row. The tokens are
 * grouped by expert, so each expert's weights are read once per block; each token still sees its
 * experts in increasing index order, the order HF accumulates them in, so a token's result does not
 * depend on the others in its block. */
static void cb_moe(colibri_ctx *c, size_t base, const cb_slots *s, size_t n, float *const *xb_rows,
                   float *const *moe_rows)
{
    const size_t n_exp = CB_N_EXPERTS(c), dim = CB_HIDDEN(c), ffn = CB_FFN(c);
    const uint32_t flags = CB_FLAGS(c);
    float *p_rows[CB_MAX_BLOCK] = {0};
    const float *xs[CB_MAX_BLOCK] = {0};
    float *ys[CB_MAX_BLOCK] = {0};
    float alpha[CB_MAX_BLOCK] = {0};
    const float *const *xb = (const float *const *)xb_rows;
    cb_rows(c->buf[CB_BUF_ROUTER], n_exp, n, p_rows);
    cb_mm(c, base + s->router, n, xb, NULL, p_rows, cb_ones, 0); /* 7: router logits, then weights */
    cb_expert_extra extra = {0, 0, 0.0f, 0.0f};
    if (s->router_bias != CB_NO_SLOT) /* gpt-oss: biased logits */
        for (size_t j = 0; j < n; j++)
            cb_add_vector(p_rows[j], cb_vector(c, base + s->router_bias), 1.0f, n_exp);
    if (flags & CB_FLAG_CLAMPED_SWIGLU) { /* the parameters, read once per layer and block */
        uint32_t a = cb_param_u32(c->blob, &c->m, CB_PARAM_SWIGLU_ALPHA, 0);
        uint32_t lim = cb_param_u32(c->blob, &c->m, CB_PARAM_SWIGLU_LIMIT, 0);
        memcpy(&extra.alpha, &a, sizeof a);
        memcpy(&extra.limit, &lim, sizeof lim);
        extra.clamp = 1;
    }
    cb_groups gr = {0, 0};
    if (flags & CB_FLAG_GROUP_TOPK) { /* likewise */
        gr.n_group = cb_param_u32(c->blob, &c->m, CB_PARAM_N_GROUP, 0);
        gr.topk_group = cb_param_u32(c->blob, &c->m, CB_PARAM_TOPK_GROUP, 0);
    }
    for (size_t j = 0; j < n; j++)
        if (flags & CB_FLAG_ROUTER_SIGMOID)
            cb_route_sigmoid(c, p_rows[j], cb_vector(c, base + s->choice_bias), &gr);
        else
            cb_route(c, p_rows[j], &gr);

#ifndef COLIBRI_NO_PARALLEL
    size_t k = 0;
    for (size_t e = 0; n == 1 && e < n_exp; e++)
        k += p_rows[0][e] != CB_NOT_CHOSEN;
    if (n == 1 && s->expert_bias == CB_NO_SLOT && k <= c->m.block && k <= CB_MAX_TOP_K)
        cb_moe1(c, base + s->experts, p_rows[0], xb_rows[0], moe_rows[0], &extra);
    else
#endif
    for (size_t e = 0; e < n_exp; e++) { /* 8: the routed experts */
        size_t m = 0;
        for (size_t j = 0; j < n; j++)
            if (p_rows[j][e] != CB_NOT_CHOSEN) { /* NaN weights are chosen too, as in the one-token order */
                xs[m] = xb_rows[j];
                ys[m] = moe_rows[j];
                alpha[m++] = p_rows[j][e];
            }
        extra.bias = s->expert_bias != CB_NO_SLOT ? base + s->expert_bias + CB_MLP_TENSORS * e : 0;
        if (m)
            cb_mlp_x(c, base + s->experts + CB_MLP_TENSORS * e, m, xs, c->buf[CB_BUF_GATE], c->buf[CB_BUF_UP], ffn,
                     ys, alpha, &extra);
    }
    for (size_t j = 0; j < n; j++)
        alpha[j] = 1.0f;
    if (flags & CB_FLAG_SHARED_GATE) /* Qwen2-MoE: sigmoid(shared_gate . xb) scales the shared expert */
        for (size_t j = 0; j < n; j++)
            alpha[j] = 1.0f / (1.0f + cb_expf(-cb_dot(cb_vector(c, base + s->shared_gate), xb_rows[j], dim)));
    if (flags & CB_FLAG_SHARED_EXPERT) /* added after the routed experts, as HF adds it to their sum */
        cb_mlp(c, base + s->shared, n, xb, c->buf[CB_BUF_XGATE], c->buf[CB_BUF_XUP], CB_SHARED_FFN(c), moe_rows,
               alpha);
}

/* ------------------------------------------------------------ one layer */

/* The rows of a block's tokens in the buffers a layer reads and writes. */
typedef struct cb_block_rows {
    float *x[CB_MAX_BLOCK];   /* residual stream */
    float *xb[CB_MAX_BLOCK];  /* normed input of attention, then of the MLP or experts */
    float *q[CB_MAX_BLOCK];   /* queries */
    float *att[CB_MAX_BLOCK]; /* attention output */
    float *k[CB_MAX_BLOCK];   /* this layer's key cache rows of the block's positions (16/8-bit cache: */
    float *v[CB_MAX_BLOCK];   /* and its value cache rows                  their f32 rows in the q buffer) */
    float *moe[CB_MAX_BLOCK]; /* the MLP's or the experts' output */
} cb_block_rows;

/* ----------------------------------------- multi-head latent attention */

#define CB_MLA_NORM_EPS 1e-6f /* q_a_layernorm and kv_a_layernorm: HF's RMSNorm default, not rms_eps */

/* Widths of one token's q and att rows in an MLA model (codegen/plan.py mla_row_widths). */
static size_t cb_mla_q_row(const colibri_ctx *c, const cb_mla_dims *d)
{
    return CB_N_HEADS(c) * ((size_t)d->nope + CB_HEAD_DIM(c) + d->kv_lora);
}

static size_t cb_mla_att_row(const colibri_ctx *c, const cb_mla_dims *d)
{
    size_t r = d->kv_lora, att = CB_N_HEADS(c) * ((size_t)d->v + r);
    att = d->q_lora > att ? d->q_lora : att;
    return r + CB_HEAD_DIM(c) > att ? r + CB_HEAD_DIM(c) : att;
}

/* Rotary of the rope part (the last head_dim of each qk-wide head, rows in rotate_half order: the importer
 * permuted DeepSeek's interleaved pairs) of n_q query heads and of the one shared rope key k. */
static void cb_mla_rotary(float *q, size_t n_q, size_t qk, float *k, size_t hd, const float *inv_freq, size_t pos)
{
    size_t half = hd / 2;
    for (size_t i = 0; i < half; i++) {
        float angle = inv_freq[i] * (float)pos;
        float cs = cb_cosf(angle), sn = cb_sinf(angle);
        for (size_t h = 0; h <= n_q; h++) {
            float *v = h < n_q ? q + h * qk + (qk - hd) : k;
            float a = v[i], b = v[i + half];
            v[i] = a * cs - b * sn;
            v[i + half] = b * cs + a * sn;
        }
    }
}

/* Step 3 of MLA for position pos of layer l, the up-projections absorbed: each head's q_nope taken into
 * latent space through its key rows of kv_b (W_UK), scored against the cached latents (plus its rotated
 * q_pe against the cached rope keys), the attention-weighted latent taken through its value rows of kv_b
 * (W_UV). q: the token's q row (queries, then the latent-space queries); att: its att row (the heads'
 * outputs, n_heads * mla_v, then the weighted latents). Exact up to float reassociation (FORMAT.md "MLA"). */
static void cb_mla_attention(colibri_ctx *c, const cb_mla_dims *dims, size_t l, size_t pos, const cb_tensor *kv_b,
                             float *q, float *att)
{
    const size_t n_heads = CB_N_HEADS(c), rope = CB_HEAD_DIM(c), nope = dims->nope, vd = dims->v;
    const size_t r = dims->kv_lora, qk = nope + rope, n = pos + 1;
    const float *lat = c->buf[CB_BUF_KEY_CACHE] + l * CB_MAX_SEQ(c) * r;
    const float *kpe = c->buf[CB_BUF_VALUE_CACHE] + l * CB_MAX_SEQ(c) * rope;
    const float scale = 1.0f / cb_sqrtf((float)qk);
    float *scores = c->buf[CB_BUF_SCORES];
    for (size_t h = 0; h < n_heads; h++) {
        const float *qn = q + h * qk, *qp = qn + nope;
        float *ql = q + n_heads * qk + h * r, *ol = att + n_heads * vd + h * r;
        for (size_t i = 0; i < r; i++)
            ql[i] = 0.0f;
        for (size_t d = 0; d < nope; d++) { /* ql = W_UK^T q_nope, one key row of kv_b at a time */
            const float *row = (const float *)(const void *)(kv_b->data + (h * (nope + vd) + d) * kv_b->row_stride);
            for (size_t i = 0; i < r; i++)
                ql[i] += qn[d] * row[i];
        }
        for (size_t t = 0; t < n; t++)
            scores[t] = (cb_dot(ql, lat + t * r, r) + cb_dot(qp, kpe + t * rope, rope)) * scale;
        cb_softmax(scores, n);
        cb_weighted_rows(ol, scores, lat, r, n, r);
        for (size_t i = 0; i < vd; i++) { /* the head's output: W_UV times its weighted latent */
            const float *row =
                (const float *)(const void *)(kv_b->data + (h * (nope + vd) + nope + i) * kv_b->row_stride);
            att[h * vd + i] = cb_dot(row, ol, r);
        }
    }
}

/* Steps 1-4 of an MLA layer (its first table index base) for the n tokens at positions pos..: queries
 * (q_proj, or q_a, its norm and q_b), the latent and rope key of each position into the caches (kv_a, the
 * latent's norm, rotary), attention, then x += Wo att. */
static void cb_mla(colibri_ctx *c, size_t l, size_t base, const cb_slots *s, size_t n, size_t pos, cb_block_rows *r)
{
    const cb_mla_dims d = cb_mla_of(c->blob, &c->m);
    const size_t dim = CB_HIDDEN(c), rank = d.kv_lora, rope = CB_HEAD_DIM(c);
    const size_t qk = (size_t)d.nope + rope, qw = cb_mla_q_row(c, &d);
    float *q[CB_MAX_BLOCK] = {NULL}, *att[CB_MAX_BLOCK] = {NULL};
    cb_xq xq[CB_MAX_BLOCK];
    const float *const *xb = (const float *const *)r->xb;
    cb_rows(c->buf[CB_BUF_Q], qw, n, q);
    cb_rows(c->buf[CB_BUF_ATT], cb_mla_att_row(c, &d), n, att);
    const float *const *staged = (const float *const *)att; /* step 1 stages in att (FORMAT.md "Arena") */
    if (s->q_lora != CB_NO_SLOT) {
        cb_mm(c, base + s->q_lora + CB_OFF_Q_A, n, xb, cb_quantize(c, xb, n, dim, xq), att, cb_ones, 0);
        for (size_t j = 0; j < n; j++)
            cb_rmsnorm(att[j], att[j], cb_vector(c, base + s->q_lora + CB_OFF_Q_A_NORM), d.q_lora, CB_MLA_NORM_EPS);
        cb_mm(c, base + s->q_lora + CB_OFF_Q_B, n, staged, cb_quantize(c, staged, n, d.q_lora, xq), q, cb_ones, 0);
    } else {
        cb_mm(c, base + s->wq, n, xb, cb_quantize(c, xb, n, dim, xq), q, cb_ones, 0);
    }
    cb_mm(c, base + s->mla + CB_OFF_KV_A, n, xb, cb_quantize(c, xb, n, dim, xq), att, cb_ones, 0);
    for (size_t j = 0; j < n; j++) { /* 1, 2: the position's latent and rope key into the caches, rotary */
        float *lat = c->buf[CB_BUF_KEY_CACHE] + (l * CB_MAX_SEQ(c) + pos + j) * rank;
        float *kpe = c->buf[CB_BUF_VALUE_CACHE] + (l * CB_MAX_SEQ(c) + pos + j) * rope;
        cb_rmsnorm(lat, att[j], cb_vector(c, base + s->mla + CB_OFF_KV_A_NORM), rank, CB_MLA_NORM_EPS);
        memcpy(kpe, att[j] + rank, rope * sizeof *kpe);
        cb_mla_rotary(q[j], CB_N_HEADS(c), qk, kpe, rope, cb_vector(c, CB_T_ROPE_FREQ), pos + j);
    }
    const cb_tensor kv_b = cb_tensor_at(c, base + s->mla + CB_OFF_KV_B);
    for (size_t j = 0; j < n; j++) /* 3 */
        cb_mla_attention(c, &d, l, pos + j, &kv_b, q[j], att[j]);
    const size_t ow = CB_N_HEADS(c) * d.v; /* 4: x += Wo att */
    cb_mm(c, base + s->wo, n, staged, cb_quantize(c, staged, n, ow, xq), r->x, cb_ones, 1);
}

/* Steps 6-9 of a layer (its first table index base) for the n tokens of a block: x += mlp-or-experts(norm(x)). */
static void cb_ffn(colibri_ctx *c, size_t base, const cb_slots *s, int dense, size_t n, cb_block_rows *r)
{
    const size_t dim = CB_HIDDEN(c);
    const float *const *xb = (const float *const *)r->xb;
    cb_norm_rows(c, r->xb, r->x, cb_vector(c, base + s->ffn_norm), n, dim, NULL); /* 6: ffn norm */
    float *moe = c->buf[CB_BUF_MOE];
    memset(moe, 0, n * dim * sizeof *moe);
    if (dense) /* 8: the dense MLP */
        cb_mlp(c, base + s->mlp, n, xb, c->buf[CB_BUF_XGATE], c->buf[CB_BUF_XUP], CB_DENSE_FFN(c), r->moe, cb_ones);
    else /* 7, 8: router, experts, shared expert */
        cb_moe(c, base, s, n, r->xb, r->moe);
    float *x = c->buf[CB_BUF_X]; /* 9: x += moe */
    for (size_t i = 0; i < n * dim; i++)
        x[i] += moe[i];
}

/* Steps each token of a block takes alone on rows of its own, split over the parallel hook by tokens as
 * cb_tok_job: the embedding lookup (tokens), or (tokens NULL) steps 1 and 2 after q, k and v, biases, q/k
 * norms and rotary, then the store of k and v into the cache. The same operations whatever the split. */
typedef struct cb_each_job {
    const colibri_ctx *c;
    const int32_t *tokens;
    const cb_slots *s;
    const cb_kv_layer *kvl;
    const cb_block_rows *r;
    size_t base, n, pos, tasks;
} cb_each_job;

static void cb_each_task(void *job, size_t i)
{
    const cb_each_job *e = (const cb_each_job *)job;
    const colibri_ctx *c = e->c;
    const size_t j0 = e->n * i / e->tasks, j1 = e->n * (i + 1) / e->tasks;
    if (e->tokens) {
        const cb_tensor embed = cb_tensor_at(c, CB_T_EMBED);
        for (size_t j = j0; j < j1; j++)
            cb_dequant_row(&embed, (size_t)e->tokens[j], e->r->x[j]);
        return;
    }
    for (size_t j = j0; j < j1; j++) {
        cb_qk(c, e->base, e->s, e->r->q[j], e->r->k[j], e->r->v[j], e->pos + j);
        if (CB_KV(c)) {
            cb_kv_store(c, cb_kv_rows(c, e->kvl, 0, e->pos + j), e->r->k[j]);
            cb_kv_store(c, cb_kv_rows(c, e->kvl, 1, e->pos + j), e->r->v[j]);
        }
    }
}

/* The job for its n tokens, elems the floats each writes (split only above CB_PARALLEL_MIN_ELEMS in all). The
 * job lives in this frame (see cb_tok_run). */
static void cb_each(const colibri_ctx *c, const int32_t *tokens, const cb_slots *s, const cb_kv_layer *kvl,
                    const cb_block_rows *r, size_t base, size_t n, size_t pos, size_t elems)
{
    cb_each_job job = {c, tokens, s, kvl, r, base, n, pos, 1};
#ifndef COLIBRI_NO_PARALLEL
    job.tasks = c->parallel_tasks < n ? c->parallel_tasks : n;
    if (c->parallel_for && job.tasks > 1 && n * elems >= CB_PARALLEL_MIN_ELEMS) {
        c->parallel_for(cb_each_task, &job, job.tasks, c->parallel_user);
        return;
    }
    job.tasks = 1;
#else
    (void)elems;
#endif
    cb_each_task(&job, 0);
}

/* Step 3 for the n tokens of a block at positions pos.. (their keys and values already cached: token j
 * reads the rows up to pos + j). Task i of T takes tokens i, i + T, ... on scores row i, or, for one token
 * (decode), the heads H i / T to H (i + 1) / T; T is 1, or with a parallel_for up to the blob's lanes
 * (FORMAT.md "Arena"). Each head of each token is the same operations whatever its task, so the split
 * changes no bit. */
typedef struct cb_attn_job {
    const colibri_ctx *c;
    const cb_kv_layer *kvl;
    const float *sinks;
    const cb_block_rows *r;
    size_t n, pos, tasks;
} cb_attn_job;

static void cb_attn_task(void *job, size_t i)
{
    const cb_attn_job *a = (const cb_attn_job *)job;
    const size_t row = (size_t)CB_MAX_SEQ(a->c) + (CB_FLAGS(a->c) & CB_FLAG_ATTN_SINKS ? 1 : 0);
    float *scores = a->c->buf[CB_BUF_SCORES] + i * row;
    const size_t heads = CB_N_HEADS(a->c);
    if (a->n == 1) {
        cb_attention(a->c, a->kvl, a->pos, a->sinks, a->r->q[0], a->r->att[0], scores, heads * i / a->tasks,
                     heads * (i + 1) / a->tasks);
        return;
    }
    for (size_t j = i; j < a->n; j += a->tasks)
        cb_attention(a->c, a->kvl, a->pos + j, a->sinks, a->r->q[j], a->r->att[j], scores, 0, heads);
}

static void cb_attend(const colibri_ctx *c, const cb_kv_layer *kvl, size_t n, size_t pos, const float *sinks,
                      const cb_block_rows *r)
{
    cb_attn_job job = {c, kvl, sinks, r, n, pos, 1};
#ifndef COLIBRI_NO_PARALLEL
    const size_t lanes = cb_attn_lanes(c->blob, &c->m);
    size_t tasks = c->parallel_tasks < lanes ? c->parallel_tasks : lanes;
    const size_t units = n == 1 ? CB_N_HEADS(c) : n; /* one token: its heads */
    tasks = tasks < units ? tasks : units;
    const uint64_t macs = (uint64_t)n * (pos + n) * CB_N_HEADS(c) * CB_HEAD_DIM(c); /* scores and weighted rows */
    if (c->parallel_for && tasks > 1 && macs >= CB_PARALLEL_MIN_MACS) {
        job.tasks = tasks;
        c->parallel_for(cb_attn_task, &job, tasks, c->parallel_user);
        return;
    }
#endif
    cb_attn_task(&job, 0);
}

/* Layer l (its first table index base) for the n tokens at positions pos.., each step taken by all
 * n tokens before the next: x += attention(norm(x)), then x += mlp-or-experts(norm(x)). */
static void cb_layer(colibri_ctx *c, size_t l, size_t base, const cb_kv_layer *kvl, size_t n, size_t pos,
                     cb_block_rows *r)
{
    const size_t dim = CB_HIDDEN(c), kvdim = CB_N_KV_HEADS(c) * CB_HEAD_DIM(c);
    const float eps = c->m.rms_eps;
    const int dense = cb_dense_bit(c->blob, CB_FLAGS(c), l);
    const cb_slots s = cb_layer_slots(CB_FLAGS(c), (uint32_t)CB_N_EXPERTS(c), dense);
    const float *const *xb = (const float *const *)r->xb;
    const float *sinks = s.sinks != CB_NO_SLOT ? cb_vector(c, base + s.sinks) : NULL;
    cb_xq xq[CB_MAX_BLOCK];
    if (CB_FLAGS(c) & CB_FLAG_MLA) {
        for (size_t j = 0; j < n; j++) /* 0: attention norm */
            cb_rmsnorm(r->xb[j], r->x[j], cb_vector(c, base + s.attn_norm), dim, eps);
        cb_mla(c, l, base, &s, n, pos, r); /* 1-4 */
        cb_ffn(c, base, &s, dense, n, r);  /* 6-9 */
        return;
    }
    if (CB_KV(c)) { /* the new k and v rows in f32 after the q rows (FORMAT.md "Arena"), stored after rotary */
        float *staged = c->buf[CB_BUF_Q] + c->m.block * CB_N_HEADS(c) * CB_HEAD_DIM(c);
        cb_rows(staged, kvdim, n, r->k);
        cb_rows(staged + c->m.block * kvdim, kvdim, n, r->v);
    } else { /* position by position: a ring's rows wrap */
        for (size_t j = 0; j < n; j++) {
            r->k[j] = (float *)(void *)cb_kv_rows(c, kvl, 0, pos + j);
            r->v[j] = (float *)(void *)cb_kv_rows(c, kvl, 1, pos + j);
        }
    }

    /* 0: attention norm; 1: q, k, v (k, v straight into the cache) */
    const cb_xq *xbq = cb_norm_rows(c, r->xb, r->x, cb_vector(c, base + s.attn_norm), n, dim, xq);
    const cb_mm_part qkv[3] = {{cb_tensor_at(c, base + s.wq), xb, xbq, r->q, cb_ones, 0},
                               {cb_tensor_at(c, base + s.wk), xb, xbq, r->k, cb_ones, 0},
                               {cb_tensor_at(c, base + s.wv), xb, xbq, r->v, cb_ones, 0}};
    cb_mm3(c, n, qkv, 3);
    cb_each(c, NULL, &s, kvl, r, base, n, pos, (CB_N_HEADS(c) + 2 * CB_N_KV_HEADS(c)) * CB_HEAD_DIM(c)); /* 1, 2 */
    cb_attend(c, kvl, n, pos, sinks, r); /* 3 */
    const float *const *att = (const float *const *)r->att; /* 4: x += Wo att (+ the o bias) */
    cb_mm(c, base + s.wo, n, att, cb_quantize(c, att, n, CB_N_HEADS(c) * CB_HEAD_DIM(c), xq), r->x, cb_ones, 1);
    if (s.o_bias != CB_NO_SLOT)
        for (size_t j = 0; j < n; j++)
            cb_add_vector(r->x[j], cb_vector(c, base + s.o_bias), 1.0f, dim);

    cb_ffn(c, base, &s, dense, n, r); /* 6-9 */
}

static size_t cb_layer_tensors(const colibri_ctx *c, size_t l) /* table entries of layer l */
{
    return cb_layer_slots(CB_FLAGS(c), (uint32_t)CB_N_EXPERTS(c), cb_dense_bit(c->blob, CB_FLAGS(c), l)).n_tensors;
}

/* A block of n <= block tokens at positions pos.. through every layer, leaving the residuals in the
 * rows of x. Every token goes through the same operations in the same order as it would alone: a
 * prefill equals single steps. */
static void cb_block(colibri_ctx *c, const int32_t *tokens, size_t n, size_t pos)
{
    const size_t dim = CB_HIDDEN(c), qdim = CB_N_HEADS(c) * CB_HEAD_DIM(c);
    cb_block_rows r;
    memset(&r, 0, sizeof r);
    cb_rows(c->buf[CB_BUF_X], dim, n, r.x);
    cb_rows(c->buf[CB_BUF_XB], dim, n, r.xb);
    cb_rows(c->buf[CB_BUF_Q], qdim, n, r.q);
    cb_rows(c->buf[CB_BUF_ATT], qdim, n, r.att);
    cb_rows(c->buf[CB_BUF_MOE], dim, n, r.moe);
    cb_each(c, tokens, NULL, NULL, &r, 0, n, pos, dim);
    size_t base = CB_FIRST_LAYER, first = 0; /* the layer's first table entry and first cache row */
    for (size_t l = 0; l < CB_N_LAYERS(c); base += cb_layer_tensors(c, l), l++) {
        const cb_kv_layer kvl = cb_kv_layer_at(c, l, first);
        cb_layer(c, l, base, &kvl, n, pos, &r);
        first += kvl.rows;
    }
}

/* Steps 10 (final norm) and 11 (lm_head, or the embedding when tied) for row j of the last block. */
static void cb_logits(colibri_ctx *c, size_t j, float *logits)
{
    const size_t dim = CB_HIDDEN(c);
    size_t final_norm = CB_FIRST_LAYER;
    for (size_t l = 0; l < CB_N_LAYERS(c); l++)
        final_norm += cb_layer_tensors(c, l);
    float *xb = c->buf[CB_BUF_XB] + j * dim;
    cb_rmsnorm(xb, c->buf[CB_BUF_X] + j * dim, cb_vector(c, final_norm), dim, c->m.rms_eps);
    const float *x = xb, one = 1.0f;
    cb_xq xq[1];
    cb_mm(c, CB_TIED(c) ? CB_T_EMBED : final_norm + 1, 1, &x, cb_quantize(c, &x, 1, dim, xq), &logits, &one, 0);
}

/* ------------------------------------------------------------------- API */

static int cb_ready(const colibri_ctx *c)
{
    return c->magic == CB_CTX_MAGIC && c->self == c;
}

colibri_status colibri_forward(colibri_ctx *ctx, const int32_t *tokens, size_t n_tokens, float *logits,
                               size_t logits_len)
{
    if (!ctx)
        return COLIBRI_E_NULL;
    if (!cb_ready(ctx))
        return COLIBRI_E_NOT_INIT;
    if (!tokens)
        return COLIBRI_E_NULL;
    if (n_tokens == 0)
        return COLIBRI_E_ARG;
    /* every check before the first write, so an error changes nothing; the length
     * ones first, so a wrong n_tokens is caught before tokens[] is read past max_seq */
    if (n_tokens > CB_MAX_SEQ(ctx) - ctx->n_past)
        return COLIBRI_E_SEQ_FULL;
    if (logits && logits_len < CB_VOCAB(ctx))
        return COLIBRI_E_ARG;
    for (size_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || (size_t)tokens[i] >= CB_VOCAB(ctx))
            return COLIBRI_E_TOKEN;

    size_t n = 0; /* tokens in the last block */
    for (size_t i = 0; i < n_tokens; i += n, ctx->n_past += (uint32_t)n) {
        n = n_tokens - i < ctx->m.block ? n_tokens - i : ctx->m.block;
        cb_block(ctx, tokens + i, n, ctx->n_past);
    }
    if (logits)
        cb_logits(ctx, n - 1, logits);
    return COLIBRI_OK;
}

colibri_status colibri_set_parallel(colibri_ctx *ctx, colibri_parallel_for_fn parallel_for, void *user,
                                    size_t n_tasks)
{
    if (!ctx)
        return COLIBRI_E_NULL;
    if (!cb_ready(ctx))
        return COLIBRI_E_NOT_INIT;
#ifdef COLIBRI_NO_PARALLEL
    if (parallel_for && n_tasks > 1)
        return COLIBRI_E_ARG;
#endif
    ctx->parallel_for = n_tasks > 1 ? parallel_for : NULL;
    ctx->parallel_user = user;
    ctx->parallel_tasks = n_tasks < UINT32_MAX ? (uint32_t)n_tasks : UINT32_MAX;
    return COLIBRI_OK;
}

colibri_status colibri_reset(colibri_ctx *ctx)
{
    if (!ctx)
        return COLIBRI_E_NULL;
    if (!cb_ready(ctx))
        return COLIBRI_E_NOT_INIT;
    ctx->n_past = 0; /* stale cache rows past n_past are never read */
    return COLIBRI_OK;
}

colibri_status colibri_info(const colibri_ctx *ctx, colibri_model_info *info)
{
    if (!ctx || !info)
        return COLIBRI_E_NULL;
    if (!cb_ready(ctx))
        return COLIBRI_E_NOT_INIT;
    if (info->struct_size < sizeof *info)
        return COLIBRI_E_ARG; /* no caller predates the first version; a larger struct keeps its tail */
    uint32_t size = info->struct_size;
    memset(info, 0, sizeof *info);
    info->struct_size = size;
    info->abi_version = COLIBRI_ABI_VERSION;
    info->vocab = ctx->m.vocab;
    info->hidden = ctx->m.hidden;
    info->n_layers = ctx->m.n_layers;
    info->n_experts = ctx->m.n_experts;
    info->top_k = ctx->m.top_k;
    info->max_seq = ctx->m.max_seq;
    info->n_past = ctx->n_past;
    info->arena_bytes = cb_rd64(ctx->blob + CB_H_ARENA_BYTES);
    info->blob_bytes = ctx->blob_bytes;
    return COLIBRI_OK;
}
