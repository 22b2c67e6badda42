/*
 * cb_runtime.h - what blob.c (validation, the context) and forward.c (the forward pass) share:
 * the model's dimensions as validated, the context, and reads of the blob's little-endian fields.
 * Internal: not installed, nothing in it is part of the ABI.
 */
#ifndef CB_RUNTIME_H
#define CB_RUNTIME_H

#include <string.h>

#include "colibri.h"

#include "cb_format.h"
#include "kernels.h"

#ifdef COLIBRI_SPECIALISED
#include "model.h"
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "colibri reads the little-endian blob in place; big-endian hosts are not supported"
#endif

_Static_assert(CB_DTYPE_F32 == CB_F32 && CB_DTYPE_F16 == CB_F16 && CB_DTYPE_INT8 == CB_I8
               && CB_DTYPE_INT8C == CB_I8C && CB_DTYPE_INT4 == CB_I4 && CB_DTYPE_INT4C == CB_I4C
               && CB_DTYPE_INT16 == CB_I16 && CB_DTYPE_LAST == CB_I16, "kernels.h's dtype codes are the format's");
_Static_assert(CB_INT16_MAX == CB_Q16_MAX, "kernels.h's int16 range is the format's");
_Static_assert(CB_INT4_BLOCK_BYTES * 2 == CB_Q8_BLOCK, "an int4 block: two values a byte");
_Static_assert(CB_Q8_BLOCK == CB_ACT_BLOCK && CB_TILE16_ROWS == CB_TILE_ROWS, "kernels.h's q8 shapes are the format's");

/* Tokens a prefill block may hold: at most the format's CB_MAX_PREFILL_BLOCK (128), so each expert's
 * weights are read once per 128 prompt tokens; less as the target declares it (-DCOLIBRI_MAX_PREFILL_BLOCK):
 * a microcontroller's stack reservation is a few KiB and its arrays of row pointers grow with it (32 when
 * a build without the parallel hook does not say). */
#ifndef COLIBRI_MAX_PREFILL_BLOCK
#if defined(COLIBRI_NO_PARALLEL)
#define COLIBRI_MAX_PREFILL_BLOCK 32
#else
#define COLIBRI_MAX_PREFILL_BLOCK 128
#endif
#endif
#define CB_MAX_BLOCK (COLIBRI_MAX_PREFILL_BLOCK + 0u)
_Static_assert(CB_MAX_BLOCK >= 1 && CB_MAX_BLOCK <= CB_MAX_PREFILL_BLOCK, "a prefill block the format allows");
#define CB_CTX_MAGIC 0x78746362u

/* A validated header: the forward pass reads its dimensions from here (or model.h's constants). */
typedef struct cb_model {
    uint32_t vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, n_experts, top_k, max_seq;
    uint32_t tied;
    float rms_eps;
    uint32_t flags, shared_ffn, dense_ffn; /* shared_ffn, dense_ffn 0 without their flags */
    uint32_t n_buffers;                    /* CB_N_BASE_BUFFERS, or CB_N_BUFFERS with an xgate and xup */
    float routed_scale;                    /* 1 unless CB_FLAG_ROUTED_SCALE */
    uint32_t block;                        /* prefill block: tokens the buffers hold, 1..CB_MAX_BLOCK */
    uint32_t layout;                       /* CB_LAYOUT_* */
    uint32_t n_params;                     /* records of the parameters section (0 without PARAMS) */
    uint64_t xq_off;                       /* arena offset of the int8 activations; 0: float activations */
} cb_model;

struct colibri_ctx {
    uint32_t magic;
    uint32_t n_past;
    const colibri_ctx *self; /* a copied arena is no context: its pointers lead to the original */
    const uint8_t *blob;
    uint64_t blob_bytes; /* (arena_bytes: the blob header's) */
    cb_model m;
    float *buf[CB_N_BUFFERS];
    int8_t *xq; /* the int8 activations (m.xq_off); NULL: float activations */
    colibri_parallel_for_fn parallel_for; /* NULL: everything on the calling thread */
    void *parallel_user;
    uint32_t parallel_tasks; /* colibri_set_parallel's n_tasks, at most UINT32_MAX (more rows than a task each) */
    uint8_t q8_sw_prefetch;  /* cb_q8_sw_prefetch() at init: each cb_tensor's sw_prefetch */
};
_Static_assert(sizeof(struct colibri_ctx) <= CB_CTX_BYTES, "the context must fit the bytes the plan leaves it");

/* The whole blob check (blob.c); on success *m holds the validated header. */
colibri_status cb_validate(const void *blob, size_t len, cb_model *m);

/* The specialised build reads the dimensions as constants from model.h, so
 * loop bounds are known to the compiler; init refuses a blob of another shape.
 * (void)(c) keeps the two builds' functions warning-free with one body. */
#ifdef COLIBRI_SPECIALISED
_Static_assert(COLIBRI_TOP_K >= 1 && COLIBRI_TOP_K <= COLIBRI_N_EXPERTS && COLIBRI_TOP_K <= CB_MAX_TOP_K, "top_k");
_Static_assert(COLIBRI_HEAD_DIM % 2 == 0 && COLIBRI_N_HEADS % COLIBRI_N_KV_HEADS == 0, "head layout");
#define CB_VOCAB(c) ((void)(c), (size_t)COLIBRI_VOCAB)
#define CB_HIDDEN(c) ((void)(c), (size_t)COLIBRI_HIDDEN)
#define CB_N_LAYERS(c) ((void)(c), (size_t)COLIBRI_N_LAYERS)
#define CB_N_HEADS(c) ((void)(c), (size_t)COLIBRI_N_HEADS)
#define CB_N_KV_HEADS(c) ((void)(c), (size_t)COLIBRI_N_KV_HEADS)
#define CB_HEAD_DIM(c) ((void)(c), (size_t)COLIBRI_HEAD_DIM)
#define CB_FFN(c) ((void)(c), (size_t)COLIBRI_FFN)
#define CB_N_EXPERTS(c) ((void)(c), (size_t)COLIBRI_N_EXPERTS)
#define CB_TOP_K(c) ((void)(c), (size_t)COLIBRI_TOP_K)
#define CB_MAX_SEQ(c) ((void)(c), (size_t)COLIBRI_MAX_SEQ)
#define CB_TIED(c) ((void)(c), COLIBRI_TIED_LM_HEAD)
#define CB_FLAGS(c) ((void)(c), (uint32_t)COLIBRI_FLAGS)
#define CB_SHARED_FFN(c) ((void)(c), (size_t)COLIBRI_SHARED_FFN)
#define CB_DENSE_FFN(c) ((void)(c), (size_t)COLIBRI_DENSE_FFN)
/* int8 activations exactly when the export planned their buffer: then no matrix takes the float SIMD
 * kernels (the router is scalar), and the linker drops them from the image */
#ifdef COLIBRI_BUF_XQ
#define CB_SPEC_INT8_ACTS 1
#else
#define CB_SPEC_INT8_ACTS 0
#endif
#define CB_INT8_ACTS(c) ((void)(c), CB_SPEC_INT8_ACTS)
#define CB_KV(c) ((void)(c), (uint32_t)COLIBRI_FLAGS & CB_FLAG_KV)
#else
#define CB_VOCAB(c) ((size_t)(c)->m.vocab)
#define CB_HIDDEN(c) ((size_t)(c)->m.hidden)
#define CB_N_LAYERS(c) ((size_t)(c)->m.n_layers)
#define CB_N_HEADS(c) ((size_t)(c)->m.n_heads)
#define CB_N_KV_HEADS(c) ((size_t)(c)->m.n_kv_heads)
#define CB_HEAD_DIM(c) ((size_t)(c)->m.head_dim)
#define CB_FFN(c) ((size_t)(c)->m.ffn)
#define CB_N_EXPERTS(c) ((size_t)(c)->m.n_experts)
#define CB_TOP_K(c) ((size_t)(c)->m.top_k)
#define CB_MAX_SEQ(c) ((size_t)(c)->m.max_seq)
#define CB_TIED(c) ((c)->m.tied)
#define CB_FLAGS(c) ((c)->m.flags)
#define CB_SHARED_FFN(c) ((size_t)(c)->m.shared_ffn)
#define CB_DENSE_FFN(c) ((size_t)(c)->m.dense_ffn)
#define CB_INT8_ACTS(c) ((c)->m.xq_off != 0)
#define CB_KV(c) ((c)->m.flags & CB_FLAG_KV)
#endif

/* ------------------------------------------------------------ blob fields */

static inline uint16_t cb_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, sizeof v); return v; }
static inline uint32_t cb_rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, sizeof v); return v; }
static inline uint64_t cb_rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, sizeof v); return v; }

/* 32-bit on purpose: a 64-bit division is a libgcc call on 32-bit targets (and pulls in raise() on ARM) */
static inline uint32_t cb_ceil_div(uint32_t a, uint32_t b) { return a / b + (a % b != 0); }
static inline uint64_t cb_align64(uint64_t a) { return a > UINT64_MAX - 63 ? UINT64_MAX : (a + 63) & ~(uint64_t)63; }
/* Sizes from untrusted fields saturate at UINT64_MAX, which then fails every
 * bound it is compared with: no check can be fooled by a wrapped product. */
static inline uint64_t cb_mul(uint64_t a, uint64_t b) { uint64_t r; return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r; }
static inline uint64_t cb_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

static inline const uint8_t *cb_entry(const uint8_t *blob, size_t i)
{
    return blob + CB_HEADER_BYTES + CB_ENTRY_BYTES * i;
}

/* Rows of the scores buffer (FORMAT.md "Arena"): tokens of a prefill block whose attention may run at once */
static inline size_t cb_attn_lanes(const uint8_t *blob, const cb_model *m)
{
    if (cb_rd16(blob + CB_H_VERSION_MINOR) < CB_MINOR_ATTN_LANES)
        return 1;
    return m->block < CB_ATTN_LANES ? m->block : CB_ATTN_LANES;
}

/* Whether layer l is a dense MLP (the header's dense_map) */
static inline int cb_dense_bit(const uint8_t *blob, uint32_t flags, uint64_t l)
{
    return (flags & CB_FLAG_DENSE_LAYERS) && l < CB_DENSE_MAP_LAYERS && (blob[CB_H_DENSE_MAP + l / 8] >> (l % 8) & 1);
}

/* The parameters section's records (FORMAT.md "Parameters"; checked by cb_validate), NULL without PARAMS. */
static inline const uint8_t *cb_params(const uint8_t *blob, const cb_model *m)
{
    if (!(m->flags & CB_FLAG_PARAMS))
        return NULL;
    size_t i = (size_t)cb_rd32(blob + CB_H_N_TENSORS) - 1 - ((m->flags & CB_FLAG_TOKENIZER) ? 1 : 0);
    return blob + cb_rd64(cb_entry(blob, i) + CB_E_DATA_OFF);
}

/* The u32 value of parameter `key` at `index`, 0 without a record: a binary search of the sorted records
 * (called at init or once per layer, never per element). */
static inline uint32_t cb_param_u32(const uint8_t *blob, const cb_model *m, unsigned key, uint32_t index)
{
    const uint8_t *rec = cb_params(blob, m);
    uint32_t lo = 0, hi = m->n_params, want = (uint32_t)key << 16 | index;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, at = (uint32_t)cb_rd16(rec + 8 * mid) << 16 | cb_rd16(rec + 8 * mid + 2);
        if (at == want)
            return cb_rd32(rec + 8 * mid + 4);
        if (at < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Layer l's attention window (FORMAT.md "Parameters" SLIDING_WINDOW), 0 for full attention. */
static inline uint32_t cb_layer_window(const uint8_t *blob, const cb_model *m, uint32_t l)
{
    return (m->flags & CB_FLAG_SLIDING_WINDOW) ? cb_param_u32(blob, m, CB_PARAM_SLIDING_WINDOW, l) : 0;
}

/* Positions layer l's KV cache holds (FORMAT.md "KV cache"): max_seq, or a sliding-window layer's ring of
 * window + block - 1 when that is less (the block's new rows never overwrite a row its queries read). */
static inline uint64_t cb_kv_layer_rows(uint32_t window, const cb_model *m)
{
    uint64_t ring = (uint64_t)window + m->block - 1;
    return window && ring < m->max_seq ? ring : m->max_seq;
}


/* Whether a matrix is multiplied with int8 activations (kernels.h): decided by the blob alone. int4 has
 * integer kernels only (any cols: a last partial block is zero-padded); blob.c refuses it without xq. */
static inline int cb_is_q8(const cb_model *m, unsigned dtype, uint64_t cols, uint64_t group)
{
    if (cb_is_int4(dtype))
        return m->xq_off != 0;
    return m->xq_off && (dtype == CB_I8 || dtype == CB_I8C) && cols % CB_Q8_BLOCK == 0 && group % CB_Q8_BLOCK == 0;
}

/* MLA's widths (CB_FLAG_MLA), from the shapes of layer 0's entries: the latent (KV_B's cols), the q latent
 * (Q_A's rows; 0 without Q_LORA), each head's nope part (its query rows less head_dim, the rope part) and
 * value width (its KV_B rows less the nope part). blob.c (cb_check_mla) checks those entries before
 * anything else reads them; all zero without MLA. Kept out of cb_model: the context has no byte to spare. */
typedef struct cb_mla_dims {
    uint32_t kv_lora, q_lora, nope, v;
} cb_mla_dims;

static inline cb_mla_dims cb_mla_of(const uint8_t *blob, const cb_model *m)
{
    cb_mla_dims d = {0, 0, 0, 0};
    if (!(m->flags & CB_FLAG_MLA))
        return d;
    const cb_slots s = cb_layer_slots(m->flags, m->n_experts, cb_dense_bit(blob, m->flags, 0));
    const uint8_t *kv_b = cb_entry(blob, CB_FIRST_LAYER + s.mla + CB_OFF_KV_B);
    const uint8_t *q = cb_entry(blob, CB_FIRST_LAYER + (s.q_lora != CB_NO_SLOT ? s.q_lora + CB_OFF_Q_B : s.wq));
    d.kv_lora = cb_rd32(kv_b + CB_E_COLS);
    if (s.q_lora != CB_NO_SLOT)
        d.q_lora = cb_rd32(cb_entry(blob, CB_FIRST_LAYER + s.q_lora + CB_OFF_Q_A) + CB_E_ROWS);
    d.nope = cb_rd32(q + CB_E_ROWS) / m->n_heads - m->head_dim;
    d.v = cb_rd32(kv_b + CB_E_ROWS) / m->n_heads - d.nope;
    return d;
}

/* Bytes of one position's keys (or values) in one layer's cache (codegen/format.py kv_row_bytes): f32 or
 * f16 elements; int8: the n_kv_heads * head_dim values padded to 4 bytes, then one f32 scale per head. */
static inline uint64_t cb_kv_row_bytes(const cb_model *m)
{
    uint64_t n = cb_mul(m->n_kv_heads, m->head_dim);
    if (m->flags & CB_FLAG_KV_INT8)
        return cb_add(cb_mul(cb_add(n, 3) / 4, 4), cb_mul(CB_KV_SCALE_BYTES, m->n_kv_heads));
    return cb_mul(n, m->flags & CB_FLAG_KV_F16 ? 2 : 4);
}

/* Bytes of one token's quantized activations (codegen/layout.py xq_row_bytes): q for the widest matrix
 * input in whole blocks, its block scales, its block sums, each part 64-byte aligned. */
static inline uint64_t cb_xq_row_bytes(const cb_model *m, const uint8_t *blob)
{
    uint64_t k = m->hidden, qdim = cb_mul(m->n_heads, m->head_dim);
    k = qdim > k ? qdim : k;
    k = m->ffn > k ? m->ffn : k;
    k = m->shared_ffn > k ? m->shared_ffn : k;
    k = m->dense_ffn > k ? m->dense_ffn : k;
    const cb_mla_dims mla = cb_mla_of(blob, m); /* MLA: Q_B's input, and WO's of n_heads * v */
    k = mla.q_lora > k ? mla.q_lora : k;
    k = cb_mul(m->n_heads, mla.v) > k ? cb_mul(m->n_heads, mla.v) : k;
    uint64_t blocks = k / CB_Q8_BLOCK + (k % CB_Q8_BLOCK != 0);
    return cb_add(cb_align64(cb_mul(blocks, CB_Q8_BLOCK)), cb_mul(2, cb_align64(cb_mul(blocks, 4))));
}

#endif /* CB_RUNTIME_H */
