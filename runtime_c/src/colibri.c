/*
 * colibri.c - the colibri runtime: blob validation, the context, the forward
 * pass (Mixtral, and the features of Qwen2-MoE, Qwen3-MoE, OLMoE and
 * DeepSeek-MoE the header's flags switch on) and the small API functions.
 *
 * Every byte of the blob is checked once, in cb_validate, before a context
 * exists; the forward pass then trusts it and checks nothing. The runtime
 * allocates nothing: the context sits at offset 0 of the caller's arena and
 * the activations in the buffers the blob's arena plan places there.
 */
#include <float.h>
#include <string.h>

#include "colibri.h"

#include "cbmath.h"
#include "kernels.h"

#ifdef COLIBRI_SPECIALISED
#include "model.h"
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "colibri reads the little-endian blob in place; big-endian hosts are not supported"
#endif

/* ---------------------------------------------------------------- format */

#define CB_MAGIC 0x52424C43u /* "CLBR" */
#define CB_VERSION_MAJOR 1u
#define CB_HEADER_FIXED 256u
#define CB_ENTRY_BYTES 64u
#define CB_ALIGN 64u
#define CB_ROW_ALIGN 16u
#define CB_LAYOUT_ROWMAJOR16 1u
#define CB_LAYOUT_TILED16 2u /* format 1.2: q8 matrices in 16-row tiles (FORMAT.md "Integer matmuls") */
#define CB_H_XQ 248u         /* format 1.2: arena offset of the int8 activations; 0 in older blobs */
#define CB_FLAG_TIED 1u
/* format 1.1 feature flags (FORMAT.md "Feature flags"); a 1.0 blob has none of them */
#define CB_FLAG_QKV_BIAS (1u << 1)
#define CB_FLAG_QK_NORM_HEAD (1u << 2)
#define CB_FLAG_QK_NORM_FULL (1u << 3)
#define CB_FLAG_TOPK_NO_NORM (1u << 4)
#define CB_FLAG_SHARED (1u << 5)
#define CB_FLAG_SHARED_GATE (1u << 6)
#define CB_FLAG_DENSE (1u << 7)
#define CB_FLAG_ROUTED_SCALE (1u << 8)
#define CB_FLAGS_KNOWN 0x1FFu
#define CB_FLAG_QK_NORM (CB_FLAG_QK_NORM_HEAD | CB_FLAG_QK_NORM_FULL)
/* format 1.1 header fields in what 1.0 reserved */
#define CB_H_SHARED_FFN 200u
#define CB_H_DENSE_FFN 204u
#define CB_H_ROUTED_SCALE 208u
#define CB_H_PREFILL_BLOCK 212u /* tokens per block of the arena plan; 0 (every older blob) means 1 */
/* Tokens a prefill block may hold (FORMAT.md): 128, so each expert's weights are read once per 128 prompt
 * tokens; 32 on microcontrollers (no parallel hook), whose stack reservation is a few KiB and whose
 * arrays of row pointers grow with it. */
#if defined(COLIBRI_NO_PARALLEL)
#define CB_MAX_BLOCK 32u
#else
#define CB_MAX_BLOCK 128u
#endif
#define CB_H_DENSE_MAP 216u /* 32 bytes: bit l % 8 of byte l / 8 set when layer l is a dense MLP */
#define CB_DENSE_MAP_LAYERS 256u
#define CB_MAX_TOP_K 16u
#define CB_CTX_BYTES 256u
#define CB_CTX_MAGIC 0x78746362u
#define CB_N_BUFFERS 13      /* at most; 11 without a shared expert or dense layers */
#define CB_N_BASE_BUFFERS 11

enum { K_EMBED = 1, K_ROPE_FREQ, K_ATTN_NORM, K_WQ, K_WK, K_WV, K_WO, K_FFN_NORM, K_ROUTER,
       K_W_GATE, K_W_DOWN, K_W_UP, K_FINAL_NORM, K_LM_HEAD,
       K_BQ, K_BK, K_BV, K_Q_NORM, K_K_NORM, K_SHARED_GATE, K_SH_GATE, K_SH_DOWN, K_SH_UP,
       K_MLP_GATE, K_MLP_DOWN, K_MLP_UP };

/* Table index of a layer's tensors is layer_base + slot: ATTN_NORM, WQ, WK, WV, WO at fixed slots, then
 * [BQ BK BV] [Q_NORM K_NORM] FFN_NORM as the flags say, then either (MoE layer) ROUTER, expert e's
 * {gate, down, up} at 3e.., [SHARED_GATE], [SH_GATE SH_DOWN SH_UP], or (dense layer) MLP_GATE..UP. */
enum { S_ATTN_NORM, S_WQ, S_WK, S_WV, S_WO, S_ATTN_EXTRA };
enum { X_GATE, X_DOWN, X_UP };

enum { B_KEY, B_VALUE, B_X, B_XB, B_Q, B_ATT, B_SCORES, B_ROUTER, B_GATE, B_UP, B_MOE, B_XGATE, B_XUP };

/* FORMAT.md "Arena": first and last step each buffer is live. The forward
 * pass below touches each buffer only within these steps, so a plan that
 * shares memory between buffers never live together is safe. */
static const uint8_t cb_lifetime[CB_N_BUFFERS][2] = {
    {0, 11}, {0, 11}, {0, 11}, {0, 11}, {1, 3}, {3, 4}, {3, 3}, {7, 8}, {8, 8}, {8, 8}, {8, 9}, {8, 8}, {8, 8},
};

#define DT(d) (1u << (d))
#define DT_ANY (DT(CB_F32) | DT(CB_F16) | DT(CB_I8) | DT(CB_I8C) | DT(CB_I4) | DT(CB_I4C))
#define CB_DTYPE_LAST CB_I4C /* codes above it are formats this build's kernels do not implement */

typedef struct cb_model {
    uint32_t vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, n_experts, top_k, max_seq;
    uint32_t tied;
    float rms_eps;
    uint32_t flags, shared_ffn, dense_ffn, n_buffers; /* format 1.1; 0, 0, 0, 11 for a 1.0 blob */
    float routed_scale;                               /* 1 unless CB_FLAG_ROUTED_SCALE */
    uint32_t block;                                   /* prefill block: tokens the buffers hold, 1..CB_MAX_BLOCK */
    uint32_t layout;                                  /* CB_LAYOUT_* */
    uint64_t xq_off;                                  /* format 1.2: nonzero when the model has q8 matmuls */
} cb_model;

struct colibri_ctx {
    uint32_t magic;
    uint32_t n_past;
    const colibri_ctx *self; /* a copied arena is no context: its pointers lead to the original */
    const uint8_t *blob;
    uint64_t blob_bytes, arena_bytes;
    cb_model m;
    float *buf[CB_N_BUFFERS];
    colibri_parallel_for_fn parallel_for; /* NULL: everything on the calling thread */
    void *parallel_user;
    size_t parallel_tasks;
};
_Static_assert(sizeof(struct colibri_ctx) <= CB_CTX_BYTES, "the context must fit the 256 bytes the plan leaves it");

/* The specialised build reads the dimensions as constants from model.h, so
 * loop bounds are known to the compiler; init refuses a blob of another shape.
 * (void)(c) keeps the two builds' functions warning-free with one body. */
#ifdef COLIBRI_SPECIALISED
_Static_assert(COLIBRI_TOP_K >= 1 && COLIBRI_TOP_K <= COLIBRI_N_EXPERTS && COLIBRI_TOP_K <= 16, "top_k");
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
/* int8 activations (format 1.2) exactly when the export planned their buffer: then no matrix takes the
 * float SIMD kernels (the router is scalar), and the linker drops them from the image */
#ifdef COLIBRI_BUF_XQ
#define CB_SPEC_INT8_ACTS 1
#else
#define CB_SPEC_INT8_ACTS 0
#endif
#define CB_INT8_ACTS(c) ((void)(c), CB_SPEC_INT8_ACTS)
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
#endif

/* ----------------------------------------------------------- blob access */

static uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, sizeof v); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, sizeof v); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, sizeof v); return v; }

/* Sizes from untrusted fields saturate at UINT64_MAX, which then fails every
 * bound it is compared with: no check can be fooled by a wrapped product. */
static uint64_t cb_mul(uint64_t a, uint64_t b) { uint64_t r; return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r; }
static uint64_t cb_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }
/* 32-bit on purpose: a 64-bit division is a libgcc call on 32-bit targets (and pulls in raise() on ARM) */
static uint32_t cb_ceil_div(uint32_t a, uint32_t b) { return a / b + (a % b != 0); }
static uint64_t cb_align64(uint64_t a) { return a > UINT64_MAX - 63 ? UINT64_MAX : (a + 63) & ~(uint64_t)63; }

static const uint8_t *cb_entry(const uint8_t *blob, size_t i)
{
    return blob + CB_HEADER_FIXED + CB_ENTRY_BYTES * i;
}

static uint64_t cb_elem_bytes(unsigned dtype) { return dtype == CB_F32 ? 4 : dtype == CB_F16 ? 2 : 1; }
static int cb_is_int4(unsigned dtype) { return dtype == CB_I4 || dtype == CB_I4C; }
/* bytes of one row's data: int4 packs a block of CB_ACT_BLOCK into CB_ACT_BLOCK / 2 */
static uint64_t cb_row_bytes(unsigned dtype, uint64_t cols)
{
    return cb_is_int4(dtype) ? (uint64_t)cb_ceil_div((uint32_t)cols, CB_ACT_BLOCK) * (CB_ACT_BLOCK / 2) : cb_mul(cols, cb_elem_bytes(dtype));
}

static int cb_dense_bit(const uint8_t *blob, uint32_t flags, uint64_t l)
{
    return (flags & CB_FLAG_DENSE) && l < CB_DENSE_MAP_LAYERS && (blob[CB_H_DENSE_MAP + l / 8] >> (l % 8) & 1);
}

/* slots before FFN_NORM: ATTN_NORM..WO and the optional biases and q/k norms */
static uint64_t cb_attn_slots(uint32_t flags)
{
    return S_ATTN_EXTRA + (flags & CB_FLAG_QKV_BIAS ? 3 : 0) + (flags & CB_FLAG_QK_NORM ? 2 : 0);
}

/* table entries of one layer */
static uint64_t cb_layer_tensors(uint32_t flags, uint64_t n_experts, int dense)
{
    uint64_t n = cb_attn_slots(flags) + 1;
    if (dense)
        return n + 3;
    n += 1 + (flags & CB_FLAG_SHARED_GATE ? 1 : 0) + (flags & CB_FLAG_SHARED ? 3 : 0);
    return cb_add(n, cb_mul(3, n_experts));
}

static uint64_t cb_n_tensors(const uint8_t *b, const cb_model *m)
{
    uint64_t n_dense = 0;
    for (uint32_t l = 0; l < m->n_layers && l < CB_DENSE_MAP_LAYERS; l++)
        n_dense += (uint64_t)cb_dense_bit(b, m->flags, l);
    uint64_t layers = cb_add(cb_mul(n_dense, cb_layer_tensors(m->flags, m->n_experts, 1)),
                             cb_mul(m->n_layers - n_dense, cb_layer_tensors(m->flags, m->n_experts, 0)));
    return cb_add(layers, m->tied ? 3 : 4);
}

/* f32 elements of each arena buffer (FORMAT.md "Arena"): all but the caches and the scores hold
 * one row per token of a prefill block */
static void cb_buffer_elems(const cb_model *m, uint64_t n[CB_N_BUFFERS])
{
    uint64_t kv = cb_mul(cb_mul(m->n_layers, m->max_seq), cb_mul(m->n_kv_heads, m->head_dim));
    uint64_t qdim = cb_mul(m->n_heads, m->head_dim), b = m->block;
    n[B_KEY] = n[B_VALUE] = kv;
    n[B_X] = n[B_XB] = n[B_MOE] = cb_mul(b, m->hidden);
    n[B_Q] = n[B_ATT] = cb_mul(b, qdim);
    n[B_SCORES] = m->max_seq;
    n[B_ROUTER] = cb_mul(b, m->n_experts);
    n[B_GATE] = n[B_UP] = cb_mul(b, m->ffn);
    n[B_XGATE] = n[B_XUP] = cb_mul(b, m->shared_ffn > m->dense_ffn ? m->shared_ffn : m->dense_ffn);
}

/* Bytes of one token's quantized activations (codegen/layout.py xq_row_bytes): q for the widest matrix
 * input in whole blocks, its block scales, its block sums, each part 64-byte aligned. */
static uint64_t cb_xq_row_bytes(const cb_model *m)
{
    uint64_t k = m->hidden, qdim = cb_mul(m->n_heads, m->head_dim);
    k = qdim > k ? qdim : k;
    k = m->ffn > k ? m->ffn : k;
    k = m->shared_ffn > k ? m->shared_ffn : k;
    k = m->dense_ffn > k ? m->dense_ffn : k;
    uint64_t blocks = k / CB_ACT_BLOCK + (k % CB_ACT_BLOCK != 0);
    return cb_add(cb_align64(cb_mul(blocks, CB_ACT_BLOCK)), cb_mul(2, cb_align64(cb_mul(blocks, 4))));
}

/* ------------------------------------------------------------ validation */

#define CB_TRY(call) do { colibri_status st_ = (call); if (st_ != COLIBRI_OK) return st_; } while (0)

/* The format 1.1 fields: each present exactly when its flag says so, everything else still zero. */
static colibri_status cb_check_features(const uint8_t *b, cb_model *m, uint32_t flags)
{
    m->flags = flags;
    m->shared_ffn = rd32(b + CB_H_SHARED_FFN);
    m->dense_ffn = rd32(b + CB_H_DENSE_FFN);
    m->n_buffers = flags & (CB_FLAG_SHARED | CB_FLAG_DENSE) ? CB_N_BUFFERS : CB_N_BASE_BUFFERS;
    memcpy(&m->routed_scale, b + CB_H_ROUTED_SCALE, sizeof m->routed_scale);
    if ((flags & ~CB_FLAG_TIED) && rd16(b + 6) < 1)
        return COLIBRI_E_BAD_HEADER; /* features are 1.1; a 1.0 blob claiming one is corrupt */
    if ((flags & CB_FLAG_QK_NORM) == CB_FLAG_QK_NORM || ((flags & CB_FLAG_SHARED_GATE) && !(flags & CB_FLAG_SHARED)))
        return COLIBRI_E_BAD_HEADER;
    if (!(flags & CB_FLAG_SHARED) != !m->shared_ffn || !(flags & CB_FLAG_DENSE) != !m->dense_ffn)
        return COLIBRI_E_BAD_HEADER;
    if (flags & CB_FLAG_ROUTED_SCALE) {
        if (!(m->routed_scale > 0.0f && m->routed_scale <= FLT_MAX))
            return COLIBRI_E_BAD_HEADER;
    } else if (rd32(b + CB_H_ROUTED_SCALE) != 0) {
        return COLIBRI_E_BAD_HEADER;
    } else {
        m->routed_scale = 1.0f;
    }
    /* unused buffer offsets, the reserved word, dense-map bits beyond n_layers and the tail are zero */
    for (uint32_t off = 96 + 8 * m->n_buffers; off < CB_H_SHARED_FFN; off++)
        if (b[off])
            return COLIBRI_E_BAD_HEADER;
    m->xq_off = rd64(b + CB_H_XQ);
    if (m->xq_off != 0 && rd16(b + 6) < 2)
        return COLIBRI_E_BAD_HEADER; /* the xq buffer is 1.2 */
    m->block = rd32(b + CB_H_PREFILL_BLOCK);
    if (m->block > CB_MAX_BLOCK)
        return COLIBRI_E_BAD_HEADER;
    m->block += m->block == 0;
    uint32_t n_dense = 0;
    for (uint32_t l = 0; l < CB_DENSE_MAP_LAYERS; l++) {
        int bit = b[CB_H_DENSE_MAP + l / 8] >> (l % 8) & 1;
        if (bit && (!(flags & CB_FLAG_DENSE) || l >= m->n_layers))
            return COLIBRI_E_BAD_HEADER;
        n_dense += (uint32_t)bit;
    }
    if ((flags & CB_FLAG_DENSE) && n_dense == 0)
        return COLIBRI_E_BAD_HEADER;
    return COLIBRI_OK;
}

static colibri_status cb_check_header(const uint8_t *b, size_t len, cb_model *m)
{
    if ((uintptr_t)b % CB_ALIGN != 0)
        return COLIBRI_E_BLOB_ALIGN;
    if (len < CB_HEADER_FIXED)
        return COLIBRI_E_TRUNCATED;
    if (rd32(b) != CB_MAGIC)
        return COLIBRI_E_BAD_MAGIC;
    if (rd16(b + 4) != CB_VERSION_MAJOR)
        return COLIBRI_E_VERSION; /* a newer minor only adds what an older reader may ignore */
    uint64_t header_bytes = rd32(b + 12);
    if (rd64(b + 16) != len || header_bytes > len
        || header_bytes != cb_align64(CB_HEADER_FIXED + (uint64_t)CB_ENTRY_BYTES * rd32(b + 24)))
        return COLIBRI_E_TRUNCATED;
    if (cb_crc32(0, b + 12, len - 12) != rd32(b + 8))
        return COLIBRI_E_CRC;

    m->vocab = rd32(b + 36);
    m->hidden = rd32(b + 40);
    m->n_layers = rd32(b + 44);
    m->n_heads = rd32(b + 48);
    m->n_kv_heads = rd32(b + 52);
    m->head_dim = rd32(b + 56);
    m->ffn = rd32(b + 60);
    m->n_experts = rd32(b + 64);
    m->top_k = rd32(b + 68);
    m->max_seq = rd32(b + 72);
    memcpy(&m->rms_eps, b + 76, sizeof m->rms_eps);
    uint32_t flags = rd32(b + 28);
    m->tied = flags & CB_FLAG_TIED;
    if (flags & ~CB_FLAGS_KNOWN)
        return COLIBRI_E_BAD_HEADER; /* an unknown flag may change the maths: refuse rather than guess */
    CB_TRY(cb_check_features(b, m, flags));
    if (!m->vocab || !m->hidden || !m->n_layers || !m->n_heads || !m->n_kv_heads || !m->head_dim
        || !m->ffn || !m->n_experts || !m->top_k || !m->max_seq)
        return COLIBRI_E_BAD_HEADER;
    if (m->n_heads % m->n_kv_heads || m->head_dim % 2 || m->top_k > m->n_experts || m->top_k > CB_MAX_TOP_K)
        return COLIBRI_E_BAD_HEADER;
    if (!(m->rms_eps >= 0.0f && m->rms_eps <= FLT_MAX)) /* also refuses NaN */
        return COLIBRI_E_BAD_HEADER;
    uint64_t elems[CB_N_BUFFERS];
    cb_buffer_elems(m, elems);
    /* >= rather than >: on 64-bit hosts SIZE_MAX is also the saturated value */
    if (cb_mul(elems[B_KEY], 4) >= SIZE_MAX || cb_mul(elems[B_Q], 4) >= SIZE_MAX || rd64(b + 88) >= SIZE_MAX
        || cb_mul(cb_mul(m->block, m->n_heads), m->head_dim) >= SIZE_MAX)
        return COLIBRI_E_BAD_HEADER;
    m->layout = rd32(b + 32);
    if (m->layout != CB_LAYOUT_ROWMAJOR16 && !(m->layout == CB_LAYOUT_TILED16 && m->xq_off))
        return COLIBRI_E_LAYOUT;
#ifdef COLIBRI_SPECIALISED
    if (m->vocab != COLIBRI_VOCAB || m->hidden != COLIBRI_HIDDEN || m->n_layers != COLIBRI_N_LAYERS
        || m->n_heads != COLIBRI_N_HEADS || m->n_kv_heads != COLIBRI_N_KV_HEADS || m->head_dim != COLIBRI_HEAD_DIM
        || m->ffn != COLIBRI_FFN || m->n_experts != COLIBRI_N_EXPERTS || m->top_k != COLIBRI_TOP_K
        || m->max_seq != COLIBRI_MAX_SEQ || m->tied != COLIBRI_TIED_LM_HEAD || m->flags != COLIBRI_FLAGS
        || m->shared_ffn != COLIBRI_SHARED_FFN || m->dense_ffn != COLIBRI_DENSE_FFN
        || (m->xq_off != 0) != CB_SPEC_INT8_ACTS)
        return COLIBRI_E_MODEL_MISMATCH;
#endif
    return COLIBRI_OK;
}

/* Walks the tensor table in canonical order; `index` is the next entry. */
typedef struct cb_walk {
    const uint8_t *blob;
    uint64_t blob_bytes, header_bytes;
    size_t index;
    const cb_model *m;
} cb_walk;

/* Whether a matrix is multiplied with int8 activations (kernels.h): decided by the blob alone. */
static int cb_is_q8(const cb_model *m, unsigned dtype, uint64_t cols, uint64_t group)
{
    if (cb_is_int4(dtype)) /* int4 has integer kernels only (cb_check_entry requires the xq buffer) */
        return m->xq_off != 0;
    return m->xq_off && (dtype == CB_I8 || dtype == CB_I8C) && cols % CB_ACT_BLOCK == 0 && group % CB_ACT_BLOCK == 0;
}

static colibri_status cb_check_entry(cb_walk *w, unsigned kind, uint32_t layer, uint32_t expert,
                                     uint64_t rows, uint64_t cols, unsigned dtypes)
{
    const uint8_t *e = cb_entry(w->blob, w->index++);
    unsigned dtype = e[6], scale_dtype = e[7];
    uint64_t stride = rd32(e + 16), group = rd32(e + 20), n_out = rd32(e + 24);
    int int4 = cb_is_int4(dtype);
    int quantised = dtype == CB_I8 || dtype == CB_I8C || int4;
    int tiled = !int4 && w->m->layout == CB_LAYOUT_TILED16 && cb_is_q8(w->m, dtype, cols, group);
    /* a tiled matrix: rows padded to whole tiles, no row padding, scales tiled the same way */
    uint64_t stored_rows = tiled ? (rows + CB_TILE_ROWS - 1) / CB_TILE_ROWS * CB_TILE_ROWS : rows;

    if (rd16(e) != kind || rd16(e + 2) != layer || rd16(e + 4) != expert || rd32(e + 8) != rows
        || rd32(e + 12) != cols)
        return COLIBRI_E_BAD_TENSOR;
    if (dtype > CB_DTYPE_LAST)
        return COLIBRI_E_DTYPE;
    if (dtype < CB_F32 || !(dtypes & DT(dtype)))
        return COLIBRI_E_BAD_TENSOR;
    if (stride < cb_row_bytes(dtype, cols) || stride % CB_ROW_ALIGN != 0 || (tiled && stride != cols))
        return COLIBRI_E_BAD_TENSOR;
    if (int4 && (!w->m->xq_off || group != CB_ACT_BLOCK)) /* int4: integer matmuls, one scale a block */
        return COLIBRI_E_BAD_TENSOR;
    /* group_size means nothing to F32/F16 and is not checked there */
    if (quantised ? (scale_dtype != CB_F32 && scale_dtype != CB_F16) || group == 0 || group > cols
                  : scale_dtype != 0)
        return COLIBRI_E_BAD_TENSOR;
    if (n_out != 0 && dtype != CB_I8C && dtype != CB_I4C)
        return COLIBRI_E_BAD_TENSOR;

    /* data, scales, outlier indices, outlier values: "0 if none", else 64-aligned and inside the payload */
    uint64_t n_scales = quantised ? cb_mul(stored_rows, cb_ceil_div(cols, group)) : 0;
    uint64_t len[4] = {cb_mul(stored_rows, stride), cb_mul(n_scales, cb_elem_bytes(scale_dtype)), n_out * 2, n_out * 2};
    for (int i = 0; i < 4; i++) {
        uint64_t off = rd64(e + 32 + 8 * i);
        if (len[i] == 0 && off != 0)
            return COLIBRI_E_BAD_TENSOR;
        if (len[i] != 0 && (off % CB_ALIGN != 0 || off < w->header_bytes || cb_add(off, len[i]) > w->blob_bytes))
            return COLIBRI_E_TENSOR_BOUNDS;
    }
    /* the kernels walk outliers in one sorted pass and index x with them: every
     * gap after the first is >= 1 and the last index is inside the matrix */
    const uint8_t *gap = w->blob + rd64(e + 48);
    uint64_t n_weights = rows * cols, idx = 0;
    for (uint64_t i = 0; i < n_out; i++) {
        uint16_t g = rd16(gap + 2 * i);
        if (i > 0 && g == 0)
            return COLIBRI_E_BAD_TENSOR;
        idx += g;
    }
    if (n_out && idx >= n_weights)
        return COLIBRI_E_BAD_TENSOR;
    return COLIBRI_OK;
}

static colibri_status cb_check_tensors(const uint8_t *b, uint64_t len, const cb_model *m)
{
    cb_walk w = {b, len, rd32(b + 12), 0, m};
    uint64_t d = m->hidden, qdim = (uint64_t)m->n_heads * m->head_dim, kvdim = (uint64_t)m->n_kv_heads * m->head_dim;
    if (rd32(b + 24) != cb_n_tensors(b, m))
        return COLIBRI_E_BAD_TENSOR;
    CB_TRY(cb_check_entry(&w, K_EMBED, 0, 0, m->vocab, d, DT_ANY));
    CB_TRY(cb_check_entry(&w, K_ROPE_FREQ, 0, 0, 1, m->head_dim / 2, DT(CB_F32)));
    for (uint32_t l = 0; l < m->n_layers; l++) {
        CB_TRY(cb_check_entry(&w, K_ATTN_NORM, l, 0, 1, d, DT(CB_F32)));
        CB_TRY(cb_check_entry(&w, K_WQ, l, 0, qdim, d, DT_ANY));
        CB_TRY(cb_check_entry(&w, K_WK, l, 0, kvdim, d, DT_ANY));
        CB_TRY(cb_check_entry(&w, K_WV, l, 0, kvdim, d, DT_ANY));
        CB_TRY(cb_check_entry(&w, K_WO, l, 0, d, qdim, DT_ANY));
        if (m->flags & CB_FLAG_QKV_BIAS) {
            CB_TRY(cb_check_entry(&w, K_BQ, l, 0, 1, qdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(&w, K_BK, l, 0, 1, kvdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(&w, K_BV, l, 0, 1, kvdim, DT(CB_F32)));
        }
        if (m->flags & CB_FLAG_QK_NORM) {
            int per_head = (m->flags & CB_FLAG_QK_NORM_HEAD) != 0;
            CB_TRY(cb_check_entry(&w, K_Q_NORM, l, 0, 1, per_head ? m->head_dim : qdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(&w, K_K_NORM, l, 0, 1, per_head ? m->head_dim : kvdim, DT(CB_F32)));
        }
        CB_TRY(cb_check_entry(&w, K_FFN_NORM, l, 0, 1, d, DT(CB_F32)));
        if (cb_dense_bit(b, m->flags, l)) {
            CB_TRY(cb_check_entry(&w, K_MLP_GATE, l, 0, m->dense_ffn, d, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_MLP_DOWN, l, 0, d, m->dense_ffn, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_MLP_UP, l, 0, m->dense_ffn, d, DT_ANY));
            continue;
        }
        CB_TRY(cb_check_entry(&w, K_ROUTER, l, 0, m->n_experts, d, DT(CB_F32) | DT(CB_F16)));
        for (uint32_t e = 0; e < m->n_experts; e++) {
            CB_TRY(cb_check_entry(&w, K_W_GATE, l, e, m->ffn, d, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_W_DOWN, l, e, d, m->ffn, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_W_UP, l, e, m->ffn, d, DT_ANY));
        }
        if (m->flags & CB_FLAG_SHARED_GATE)
            CB_TRY(cb_check_entry(&w, K_SHARED_GATE, l, 0, 1, d, DT(CB_F32)));
        if (m->flags & CB_FLAG_SHARED) {
            CB_TRY(cb_check_entry(&w, K_SH_GATE, l, 0, m->shared_ffn, d, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_SH_DOWN, l, 0, d, m->shared_ffn, DT_ANY));
            CB_TRY(cb_check_entry(&w, K_SH_UP, l, 0, m->shared_ffn, d, DT_ANY));
        }
    }
    CB_TRY(cb_check_entry(&w, K_FINAL_NORM, 0, 0, 1, d, DT(CB_F32)));
    if (!m->tied)
        CB_TRY(cb_check_entry(&w, K_LM_HEAD, 0, 0, m->vocab, d, DT_ANY));
    return COLIBRI_OK;
}

static colibri_status cb_check_plan(const uint8_t *b, const cb_model *m)
{
    uint64_t arena = rd64(b + 88), off[CB_N_BUFFERS], bytes[CB_N_BUFFERS];
    const int n_buffers = (int)m->n_buffers;
    if (rd32(b + 84) != m->n_buffers)
        return COLIBRI_E_BAD_PLAN;
    cb_buffer_elems(m, bytes);
    for (int i = 0; i < n_buffers; i++) {
        off[i] = rd64(b + 96 + 8 * i);
        bytes[i] = cb_mul(bytes[i], sizeof(float));
        if (off[i] % CB_ALIGN != 0 || off[i] < CB_CTX_BYTES || cb_add(off[i], bytes[i]) > arena)
            return COLIBRI_E_BAD_PLAN;
    }
    if (m->xq_off) { /* live through every step: it overlaps no buffer */
        uint64_t xq_end = cb_add(m->xq_off, cb_mul(m->block, cb_xq_row_bytes(m)));
        if (m->xq_off % CB_ALIGN != 0 || m->xq_off < CB_CTX_BYTES || xq_end > arena)
            return COLIBRI_E_BAD_PLAN;
        for (int i = 0; i < n_buffers; i++)
            if (off[i] < xq_end && m->xq_off < off[i] + bytes[i])
                return COLIBRI_E_BAD_PLAN;
    }
    for (int i = 0; i < n_buffers; i++)
        for (int j = i + 1; j < n_buffers; j++) {
            int live_together = cb_lifetime[i][0] <= cb_lifetime[j][1] && cb_lifetime[j][0] <= cb_lifetime[i][1];
            if (live_together && off[i] < off[j] + bytes[j] && off[j] < off[i] + bytes[i])
                return COLIBRI_E_BAD_PLAN;
        }
    return COLIBRI_OK;
}

/* The whole blob check, in the order the status codes are documented to win. */
static colibri_status cb_validate(const void *blob, size_t len, cb_model *m)
{
    const uint8_t *b = (const uint8_t *)blob;
    CB_TRY(cb_check_header(b, len, m));
    CB_TRY(cb_check_tensors(b, len, m));
    return cb_check_plan(b, m);
}

/* ---------------------------------------------------------- forward pass */

/* An entry of a validated blob as kernel arguments. */
static cb_tensor cb_tensor_at(const colibri_ctx *c, size_t i)
{
    const uint8_t *e = cb_entry(c->blob, i);
    uint64_t scale_off = rd64(e + 40), oidx_off = rd64(e + 48), oval_off = rd64(e + 56);
    cb_tensor t = {
        .data = c->blob + rd64(e + 32),
        .scales = scale_off ? c->blob + scale_off : NULL,
        .ogap = oidx_off ? (const uint16_t *)(const void *)(c->blob + oidx_off) : NULL,
        .oval = oval_off ? (const uint16_t *)(const void *)(c->blob + oval_off) : NULL,
        .rows = rd32(e + 8),
        .cols = rd32(e + 12),
        .row_stride = rd32(e + 16),
        .group_size = rd32(e + 20),
        .n_outliers = rd32(e + 24),
        .dtype = e[6],
        .scale_dtype = e[7],
    };
    t.n_groups = t.scale_dtype ? (uint32_t)cb_ceil_div(t.cols, t.group_size) : 0;
    t.q8 = (uint8_t)cb_is_q8(&c->m, t.dtype, t.cols, t.group_size);
    t.tiled = (uint8_t)(t.q8 && !cb_is_int4(t.dtype) && c->m.layout == CB_LAYOUT_TILED16);
    return t;
}

static const float *cb_vector(const colibri_ctx *c, size_t i) /* an F32 1 x n tensor */
{
    return (const float *)(const void *)(c->blob + rd64(cb_entry(c->blob, i) + 32));
}

#ifndef COLIBRI_NO_PARALLEL
/* One matmul as tasks of the caller's parallel_for: task i takes rows [i*rows/n, (i+1)*rows/n),
 * rounded to whole 4-row blocks. cb_matmul computes every row the same way whatever its range,
 * so the result does not depend on the split. */
typedef struct cb_mm_job {
    const cb_tensor *t;
    size_t n, n_tasks;
    const cb_xq *xq; /* q8 tensors: the tokens' int8 activations */
    int scalar;      /* float matrices of a 1.2 blob: the scalar kernel (see cb_mm) */
    const float *const *x;
    float *const *y;
    const float *alpha;
    int accumulate;
} cb_mm_job;

static size_t cb_mm_row(const cb_mm_job *j, size_t i)
{
    size_t rows = j->t->rows, unit = j->t->q8 ? CB_TILE_ROWS : 4;
    return i >= j->n_tasks ? rows : (size_t)((uint64_t)rows * i / j->n_tasks) / unit * unit;
}

static void cb_mm_task(void *job, size_t i)
{
    const cb_mm_job *j = (const cb_mm_job *)job;
    size_t r0 = cb_mm_row(j, i), r1 = cb_mm_row(j, i + 1);
    if (r0 < r1 && j->xq)
        cb_matmul_q8(j->t, r0, r1, j->n, j->xq, j->x, j->y, j->alpha, j->accumulate);
    else if (r0 < r1 && j->scalar)
        cb_matmul_scalar(j->t, r0, r1, j->n, j->x, j->y, j->alpha, j->accumulate);
    else if (r0 < r1)
        cb_matmul(j->t, r0, r1, j->n, j->x, j->y, j->alpha, j->accumulate);
}

#define CB_PARALLEL_MIN_MACS 16384u /* smaller matmuls stay on the calling thread */
#endif

/* y[j] = (accumulate ? y[j] : 0) + alpha[j] * W x[j] for the n tokens, W the tensor at table index i.
 * same_x: the previous call had the same x and a matrix of the same width (k and v after q, up after
 * gate), so the xq buffer already holds x quantized. */
static void cb_mm_x(const colibri_ctx *c, size_t i, size_t n, const float *const *x, float *const *y,
                    const float *alpha, int accumulate, int same_x)
{
    cb_tensor t = cb_tensor_at(c, i);
    cb_xq xq[CB_MAX_BLOCK];
    if (t.q8) { /* quantize each token once, before any split: every task reads the same int8 rows */
        size_t row = (size_t)cb_xq_row_bytes(&c->m), blocks = (size_t)cb_ceil_div(t.cols, CB_ACT_BLOCK);
        size_t q_bytes = (size_t)cb_align64(blocks * CB_ACT_BLOCK), d_bytes = (size_t)cb_align64(blocks * 4);
        for (size_t j = 0; j < n; j++) {
            /* the context is at arena offset 0, the xq buffer at xq_off: block rows of row bytes */
            int8_t *q = (int8_t *)(uintptr_t)c + c->m.xq_off + j * row;
            float *d = (float *)(void *)(q + q_bytes);
            int32_t *s = (int32_t *)(void *)(q + q_bytes + d_bytes);
            if (!same_x)
                cb_quantize_q8(x[j], t.cols, q, d, s);
            xq[j].q = q;
            xq[j].d = d;
            xq[j].s = s;
        }
    }
#ifndef COLIBRI_NO_PARALLEL /* (firmware: no indirect call, so the stack bound stays static) */
    size_t unit = t.q8 ? CB_TILE_ROWS : 4, tasks = c->parallel_tasks < t.rows / unit ? c->parallel_tasks : t.rows / unit;
    if (c->parallel_for && tasks > 1 && (uint64_t)t.rows * t.cols * n >= CB_PARALLEL_MIN_MACS) {
        cb_mm_job job = {&t, n, tasks, t.q8 ? xq : NULL, CB_INT8_ACTS(c), x, y, alpha, accumulate};
        c->parallel_for(cb_mm_task, &job, tasks, c->parallel_user);
        return;
    }
#endif
    if (t.q8)
        cb_matmul_q8(&t, 0, t.rows, n, xq, x, y, alpha, accumulate);
    else if (CB_INT8_ACTS(c)) /* the router: scalar, so a 1.2 blob's forward pass is the same bits everywhere */
        cb_matmul_scalar(&t, 0, t.rows, n, x, y, alpha, accumulate);
    else
        cb_matmul(&t, 0, t.rows, n, x, y, alpha, accumulate);
}

static void cb_mm(const colibri_ctx *c, size_t i, size_t n, const float *const *x, float *const *y,
                  const float *alpha, int accumulate)
{
    cb_mm_x(c, i, n, x, y, alpha, accumulate, 0);
}

/* one token: y = (accumulate ? y : 0) + alpha * W x */
static void cb_mv(const colibri_ctx *c, size_t i, const float *x, float *y, float alpha, int accumulate)
{
    cb_mm(c, i, 1, &x, &y, &alpha, accumulate);
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

static int cb_dense(const colibri_ctx *c, size_t l)
{
    return cb_dense_bit(c->blob, CB_FLAGS(c), l);
}

static size_t cb_layer_size(const colibri_ctx *c, size_t l) /* table entries of layer l */
{
    return (size_t)cb_layer_tensors(CB_FLAGS(c), CB_N_EXPERTS(c), cb_dense(c, l));
}

static size_t cb_final_norm(const colibri_ctx *c) /* table index of FINAL_NORM */
{
    size_t i = 2;
    for (size_t l = 0; l < CB_N_LAYERS(c); l++)
        i += cb_layer_size(c, l);
    return i;
}

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

/* step 3: causal attention of position pos (query q) over the cached keys/values 0..pos, into att */
static void cb_attention(colibri_ctx *c, size_t l, size_t pos, const float *q_all, float *att_all)
{
    const size_t hd = CB_HEAD_DIM(c), n_heads = CB_N_HEADS(c), kvdim = CB_N_KV_HEADS(c) * hd;
    const size_t group = n_heads / CB_N_KV_HEADS(c); /* query heads sharing one kv head */
    const float *keys = c->buf[B_KEY] + l * CB_MAX_SEQ(c) * kvdim;
    const float *values = c->buf[B_VALUE] + l * CB_MAX_SEQ(c) * kvdim;
    const float scale = 1.0f / cb_sqrtf((float)hd);
    float *scores = c->buf[B_SCORES];
    for (size_t h = 0; h < n_heads; h++) {
        const float *q = q_all + h * hd;
        float *att = att_all + h * hd;
        size_t kv = (h / group) * hd;
        cb_scores(scores, q, keys + kv, kvdim, pos + 1, hd, scale);
        cb_softmax(scores, pos + 1);
        cb_weighted_rows(att, scores, values + kv, kvdim, pos + 1, hd);
    }
}

static int cb_chosen(const size_t *chosen, size_t n, size_t e)
{
    for (size_t i = 0; i < n; i++)
        if (chosen[i] == e)
            return 1;
    return 0;
}

/* out[j] += alpha[j] * down(silu(gate xb[j]) * up xb[j]) for n tokens: the MLP at table index i
 * (gate, down, up) of width w, its gate and up rows in the buffers gate and up */
static void cb_mlp(const colibri_ctx *c, size_t i, size_t n, const float *const *xb, float *gate, float *up,
                   size_t w, float *const *out, const float *alpha)
{
    float *g[CB_MAX_BLOCK] = {NULL}, *u[CB_MAX_BLOCK] = {NULL};
    cb_rows(gate, w, n, g);
    cb_rows(up, w, n, u);
    cb_mm(c, i + X_GATE, n, xb, g, cb_ones, 0);
    cb_mm_x(c, i + X_UP, n, xb, u, cb_ones, 0, 1);
    cb_silu_mul(gate, up, n * w); /* silu(gate) * up */
    cb_mm(c, i + X_DOWN, n, (const float *const *)g, out, alpha, 1);
}

/* The routing of one token: its router logits in, and out the same row holding each chosen
 * expert's weight and CB_NOT_CHOSEN for every other expert (never a weight: probabilities are
 * >= 0 or NaN, routed_scale > 0). */
#define CB_NOT_CHOSEN (-FLT_MAX)
static void cb_route(const colibri_ctx *c, float *probs)
{
    const size_t n_exp = CB_N_EXPERTS(c), top_k = CB_TOP_K(c);
    const uint32_t flags = CB_FLAGS(c);
    size_t chosen[CB_MAX_TOP_K];
    float weight[CB_MAX_TOP_K], sum = 0.0f;
    cb_softmax(probs, n_exp);
    /* top_k by probability, ties to the lower index; NaNs still yield k distinct experts */
    for (size_t k = 0; k < top_k; k++) {
        size_t best = n_exp;
        for (size_t e = 0; e < n_exp; e++)
            if (!cb_chosen(chosen, k, e) && (best == n_exp || probs[e] > probs[best]))
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

/* steps 7-9 for the n tokens of a block: route each xb row to top_k experts and add their weighted
 * sum (and the shared expert's output) to its x row; `router` is the ROUTER's table index. The
 * tokens are grouped by expert, so each expert's weights are read once per block; each token still
 * sees its experts in increasing index order, the order HF accumulates them in, so a token's result
 * does not depend on the others in its block. */
static void cb_moe(colibri_ctx *c, size_t router, size_t n)
{
    const size_t n_exp = CB_N_EXPERTS(c), dim = CB_HIDDEN(c), ffn = CB_FFN(c);
    const uint32_t flags = CB_FLAGS(c);
    float *probs = c->buf[B_ROUTER], *moe = c->buf[B_MOE];
    float *xb_rows[CB_MAX_BLOCK] = {0}, *moe_rows[CB_MAX_BLOCK] = {0}, *p_rows[CB_MAX_BLOCK] = {0};
    const float *xs[CB_MAX_BLOCK] = {0};
    float *ys[CB_MAX_BLOCK] = {0};
    float alpha[CB_MAX_BLOCK] = {0};
    cb_rows(c->buf[B_XB], dim, n, xb_rows);
    cb_rows(moe, dim, n, moe_rows);
    cb_rows(probs, n_exp, n, p_rows);
    cb_mm(c, router, n, (const float *const *)xb_rows, p_rows, cb_ones, 0);
    for (size_t j = 0; j < n; j++)
        cb_route(c, p_rows[j]);

    memset(moe, 0, n * dim * sizeof *moe);
    for (size_t e = 0; e < n_exp; e++) {
        size_t m = 0;
        for (size_t j = 0; j < n; j++)
            if (p_rows[j][e] != CB_NOT_CHOSEN) { /* NaN weights are chosen too, as in the one-token order */
                xs[m] = xb_rows[j];
                ys[m] = moe_rows[j];
                alpha[m++] = p_rows[j][e];
            }
        if (m)
            cb_mlp(c, router + 1 + 3 * e, m, xs, c->buf[B_GATE], c->buf[B_UP], ffn, ys, alpha);
    }
    size_t shared = router + 1 + 3 * n_exp;
    for (size_t j = 0; j < n; j++)
        alpha[j] = 1.0f;
    if (flags & CB_FLAG_SHARED_GATE) { /* Qwen2-MoE: sigmoid(shared_gate . xb) scales the shared expert */
        for (size_t j = 0; j < n; j++)
            alpha[j] = 1.0f / (1.0f + cb_expf(-cb_dot(cb_vector(c, shared), xb_rows[j], dim)));
        shared++;
    }
    if (flags & CB_FLAG_SHARED) /* added after the routed experts, as HF adds it to their sum */
        cb_mlp(c, shared, n, (const float *const *)xb_rows, c->buf[B_XGATE], c->buf[B_XUP], CB_SHARED_FFN(c),
               moe_rows, alpha);
    float *x = c->buf[B_X];
    for (size_t i = 0; i < n * dim; i++)
        x[i] += moe[i];
}

/* Step 1's additions to one token's q and k (biases, q/k norms) and step 2 (rotary at pos). */
static void cb_qk(colibri_ctx *c, size_t base, float *q, float *k, float *v, size_t pos)
{
    const size_t hd = CB_HEAD_DIM(c), kvdim = CB_N_KV_HEADS(c) * hd;
    const float eps = c->m.rms_eps;
    const uint32_t flags = CB_FLAGS(c);
    size_t slot = S_ATTN_EXTRA;
    if (flags & CB_FLAG_QKV_BIAS) {                                        /* + biases (Qwen2-MoE) */
        const float *bq = cb_vector(c, base + slot), *bk = cb_vector(c, base + slot + 1);
        const float *bv = cb_vector(c, base + slot + 2);
        for (size_t i = 0; i < CB_N_HEADS(c) * hd; i++)
            q[i] += bq[i];
        for (size_t i = 0; i < kvdim; i++) {
            k[i] += bk[i];
            v[i] += bv[i];
        }
        slot += 3;
    }
    if (flags & CB_FLAG_QK_NORM_FULL) {                                    /* OLMoE: q, k norms */
        cb_rmsnorm(q, q, cb_vector(c, base + slot), CB_N_HEADS(c) * hd, eps);
        cb_rmsnorm(k, k, cb_vector(c, base + slot + 1), kvdim, eps);
    } else if (flags & CB_FLAG_QK_NORM_HEAD) {                             /* Qwen3: per head */
        for (size_t h = 0; h < CB_N_HEADS(c); h++)
            cb_rmsnorm(q + h * hd, q + h * hd, cb_vector(c, base + slot), hd, eps);
        for (size_t h = 0; h < CB_N_KV_HEADS(c); h++)
            cb_rmsnorm(k + h * hd, k + h * hd, cb_vector(c, base + slot + 1), hd, eps);
    }
    cb_rotary(q, CB_N_HEADS(c), k, CB_N_KV_HEADS(c), hd, cb_vector(c, 1), pos); /* 2 */
}

/* A block of n <= block tokens at positions pos.. through every layer, layer by layer (each step
 * for all n tokens before the next), leaving the residuals in the rows of x. Every token goes
 * through the same operations in the same order as it would alone: a prefill equals single steps. */
static void cb_block(colibri_ctx *c, const int32_t *tokens, size_t n, size_t pos)
{
    const size_t dim = CB_HIDDEN(c), hd = CB_HEAD_DIM(c), kvdim = CB_N_KV_HEADS(c) * hd;
    const size_t qdim = CB_N_HEADS(c) * hd;
    const float eps = c->m.rms_eps;
    const uint32_t flags = CB_FLAGS(c);
    float *x = c->buf[B_X], *xb = c->buf[B_XB], *q = c->buf[B_Q], *att = c->buf[B_ATT];
    float *x_rows[CB_MAX_BLOCK] = {0}, *xb_rows[CB_MAX_BLOCK] = {0}, *q_rows[CB_MAX_BLOCK] = {0}, *att_rows[CB_MAX_BLOCK] = {0};
    float *k_rows[CB_MAX_BLOCK] = {0}, *v_rows[CB_MAX_BLOCK] = {0};
    cb_rows(x, dim, n, x_rows);
    cb_rows(xb, dim, n, xb_rows);
    cb_rows(q, qdim, n, q_rows);
    cb_rows(att, qdim, n, att_rows);
    cb_tensor embed = cb_tensor_at(c, 0);
    for (size_t j = 0; j < n; j++)
        cb_dequant_row(&embed, (size_t)tokens[j], x_rows[j]);
    const float *const *xbc = (const float *const *)xb_rows;
    size_t base = 2; /* table index of the layer's ATTN_NORM */
    for (size_t l = 0; l < CB_N_LAYERS(c); base += cb_layer_size(c, l), l++) {
        size_t ffn_norm = base + cb_attn_slots(flags);
        cb_rows(c->buf[B_KEY] + (l * CB_MAX_SEQ(c) + pos) * kvdim, kvdim, n, k_rows);
        cb_rows(c->buf[B_VALUE] + (l * CB_MAX_SEQ(c) + pos) * kvdim, kvdim, n, v_rows);
        for (size_t j = 0; j < n; j++)
            cb_rmsnorm(xb_rows[j], x_rows[j], cb_vector(c, base + S_ATTN_NORM), dim, eps); /* 0 */
        cb_mm(c, base + S_WQ, n, xbc, q_rows, cb_ones, 0);                    /* 1: k, v straight */
        cb_mm_x(c, base + S_WK, n, xbc, k_rows, cb_ones, 0, 1);               /*    into the cache */
        cb_mm_x(c, base + S_WV, n, xbc, v_rows, cb_ones, 0, 1);
        for (size_t j = 0; j < n; j++) {
            cb_qk(c, base, q_rows[j], k_rows[j], v_rows[j], pos + j);         /* 1, 2 */
            cb_attention(c, l, pos + j, q_rows[j], att_rows[j]);            /* 3 */
        }
        cb_mm(c, base + S_WO, n, (const float *const *)att_rows, x_rows, cb_ones, 1); /* 4: x += Wo att */
        for (size_t j = 0; j < n; j++)
            cb_rmsnorm(xb_rows[j], x_rows[j], cb_vector(c, ffn_norm), dim, eps); /* 6: FFN_NORM */
        if (cb_dense(c, l)) {                                              /* 8, 9: dense MLP */
            float *out = c->buf[B_MOE], *out_rows[CB_MAX_BLOCK] = {0};
            cb_rows(out, dim, n, out_rows);
            memset(out, 0, n * dim * sizeof *out);
            cb_mlp(c, ffn_norm + 1, n, xbc, c->buf[B_XGATE], c->buf[B_XUP], CB_DENSE_FFN(c), out_rows, cb_ones);
            for (size_t i = 0; i < n * dim; i++)
                x[i] += out[i];
        } else {
            cb_moe(c, ffn_norm + 1, n);                                     /* 7, 8, 9 */
        }
    }
}

/* ------------------------------------------------------------------- API */

static int cb_ready(const colibri_ctx *c)
{
    return c->magic == CB_CTX_MAGIC && c->self == c;
}

colibri_status colibri_arena_bytes(const void *blob, size_t blob_len, size_t *out_bytes)
{
    cb_model m;
    if (!blob || !out_bytes)
        return COLIBRI_E_NULL;
    CB_TRY(cb_validate(blob, blob_len, &m));
    *out_bytes = (size_t)rd64((const uint8_t *)blob + 88);
    return COLIBRI_OK;
}

colibri_status colibri_init(colibri_ctx **out_ctx, void *arena, size_t arena_len, const void *blob, size_t blob_len)
{
    cb_model m;
    if (!out_ctx)
        return COLIBRI_E_NULL;
    *out_ctx = NULL;
    if (!arena || !blob)
        return COLIBRI_E_NULL;
    CB_TRY(cb_validate(blob, blob_len, &m));
    const uint8_t *b = (const uint8_t *)blob;
    uint64_t arena_bytes = rd64(b + 88);
    if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN != 0)
        return COLIBRI_E_ARENA_ALIGN;
    if (arena_len < arena_bytes)
        return COLIBRI_E_ARENA_SMALL;

    colibri_ctx *c = (colibri_ctx *)arena; /* the arena is untouched until here: a live context in it survives errors */
    memset(c, 0, sizeof *c);
    c->blob = b;
    c->blob_bytes = blob_len;
    c->arena_bytes = arena_bytes;
    c->m = m;
    for (uint32_t i = 0; i < m.n_buffers; i++) /* buffers 11, 12 of format 1.1 at 184, 192: the same formula */
        c->buf[i] = (float *)(void *)((uint8_t *)arena + rd64(b + 96 + 8 * i));
    c->self = c;
    c->magic = CB_CTX_MAGIC;
    *out_ctx = c;
    return COLIBRI_OK;
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
    if (logits) { /* the last token's row of the last block */
        size_t final_norm = cb_final_norm(ctx), dim = CB_HIDDEN(ctx);
        float *xb = ctx->buf[B_XB] + (n - 1) * dim;
        cb_rmsnorm(xb, ctx->buf[B_X] + (n - 1) * dim, cb_vector(ctx, final_norm), dim, ctx->m.rms_eps); /* 10 */
        cb_mv(ctx, CB_TIED(ctx) ? 0 : final_norm + 1, xb, logits, 1.0f, 0);                            /* 11 */
    }
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
    ctx->parallel_tasks = n_tasks;
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
    info->arena_bytes = ctx->arena_bytes;
    info->blob_bytes = ctx->blob_bytes;
    return COLIBRI_OK;
}

const char *colibri_strerror(colibri_status status)
{
    switch (status) {
    case COLIBRI_OK: return "ok";
    case COLIBRI_E_NULL: return "a required pointer argument is NULL";
    case COLIBRI_E_BAD_MAGIC: return "not a colibri model blob (bad magic)";
    case COLIBRI_E_VERSION: return "unsupported blob format version";
    case COLIBRI_E_TRUNCATED: return "blob truncated or its length does not match its header";
    case COLIBRI_E_CRC: return "blob CRC-32 mismatch (corrupted)";
    case COLIBRI_E_BAD_HEADER: return "blob header has zero, inconsistent or overflowing dimensions";
    case COLIBRI_E_TENSOR_BOUNDS: return "a tensor lies outside the blob or is misaligned";
    case COLIBRI_E_BAD_TENSOR: return "a tensor has the wrong kind, shape, dtype or contents";
    case COLIBRI_E_LAYOUT: return "weight layout not supported by this build";
    case COLIBRI_E_BLOB_ALIGN: return "blob pointer is not 64-byte aligned";
    case COLIBRI_E_ARENA_ALIGN: return "arena pointer is not 64-byte aligned";
    case COLIBRI_E_ARENA_SMALL: return "arena smaller than the model needs";
    case COLIBRI_E_BAD_PLAN: return "arena plan in the blob overlaps live buffers or overflows";
    case COLIBRI_E_MODEL_MISMATCH: return "blob is of another model than this specialised build";
    case COLIBRI_E_NOT_INIT: return "context not initialised by colibri_init";
    case COLIBRI_E_TOKEN: return "token id outside the vocabulary";
    case COLIBRI_E_SEQ_FULL: return "sequence would exceed max_seq positions";
    case COLIBRI_E_ARG: return "bad argument (no tokens, or logits buffer shorter than vocab)";
    case COLIBRI_E_DTYPE: return "a tensor's weight format is not implemented by this build";
    }
    return "unknown colibri status";
}
