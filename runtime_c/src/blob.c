/*
 * blob.c - the model blob checked once, and the context built on it.
 *
 * Every byte the forward pass (forward.c) will read is checked here, before a
 * context exists: the header, every tensor table entry against the shape and
 * dtypes its kind and the header's dims imply, the int8c corrections, and the
 * arena plan against the buffers' lifetimes. The forward pass then trusts the
 * blob and checks nothing. Field offsets, kinds, flags and the order of a
 * layer's tensors come from cb_format.h, generated from codegen/format.py.
 *
 * Each failed check returns CB_BAD(status). A build with -DCOLIBRI_TRACE_CHECKS
 * also records the source line of the check (colibri_debug_check), so a test
 * can tell which of the checks behind one status fired; otherwise CB_BAD(s)
 * is just s.
 */
#include <float.h>

#include "cb_runtime.h"

#include "cbmath.h"

/* The state of one validation; CB_BAD reads it as `v`. */
typedef struct cb_check {
    const uint8_t *b;
    uint64_t len, header_bytes;
    cb_model *m;
    unsigned line; /* the check that failed (COLIBRI_TRACE_CHECKS builds) */
} cb_check;

#ifdef COLIBRI_TRACE_CHECKS
#define CB_BAD(status) (v->line = __LINE__, (status))
#else
#define CB_BAD(status) (status)
#endif
#define CB_TRY(call) do { colibri_status st_ = (call); if (st_ != COLIBRI_OK) return st_; } while (0)

#define DT(d) (1u << (d))
#define DT_ANY (DT(CB_F32) | DT(CB_F16) | DT(CB_I8) | DT(CB_I8C) | DT(CB_I4) | DT(CB_I4C) | DT(CB_I16))

static const uint8_t cb_lifetime[CB_N_BUFFERS][2] = CB_BUFFER_LIFETIMES;

static uint64_t cb_elem_bytes(unsigned dtype) { return dtype == CB_F32 ? 4 : dtype == CB_F16 || dtype == CB_I16 ? 2 : 1; }
/* bytes of one row's values: int4 packs a block of CB_Q8_BLOCK into CB_INT4_BLOCK_BYTES */
static uint64_t cb_row_bytes(unsigned dtype, uint64_t cols)
{
    return cb_is_int4(dtype) ? (uint64_t)cb_ceil_div((uint32_t)cols, CB_Q8_BLOCK) * CB_INT4_BLOCK_BYTES
                             : cb_mul(cols, cb_elem_bytes(dtype));
}

/* table entries of the whole model: the global ones, and each layer's as cb_layer_slots counts them */
static uint64_t cb_n_tensors(const uint8_t *b, const cb_model *m)
{
    uint64_t n_dense = 0;
    for (uint32_t l = 0; l < m->n_layers && l < CB_DENSE_MAP_LAYERS; l++)
        n_dense += (uint64_t)cb_dense_bit(b, m->flags, l);
    uint64_t dense = cb_layer_slots(m->flags, m->n_experts, 1).n_tensors;
    uint64_t moe = cb_layer_slots(m->flags, m->n_experts, 0).n_tensors;
    return CB_FIRST_LAYER + n_dense * dense + (m->n_layers - n_dense) * moe + (m->tied ? 1 : 2)
           + (m->flags & CB_FLAG_PARAMS ? 1 : 0) + (m->flags & CB_FLAG_TOKENIZER ? 1 : 0);
}

/* Bytes of each arena buffer (FORMAT.md "Arena"): all but the caches and the scores hold one row per
 * token of a prefill block (the scores one per attention lane, cb_attn_lanes); the caches hold each
 * layer's cb_kv_layer_rows rows of cb_kv_row_bytes, and with a 16- or 8-bit cache q also holds the
 * block's new k and v rows in f32 */
static void cb_buffer_bytes(const uint8_t *blob, const cb_model *m, uint64_t n[CB_N_BUFFERS])
{
    uint64_t kvdim = cb_mul(m->n_kv_heads, m->head_dim), b = m->block;
    uint64_t qdim = cb_add(cb_mul(m->n_heads, m->head_dim), m->flags & CB_FLAG_KV ? cb_mul(2, kvdim) : 0);
    uint64_t positions = cb_mul(m->n_layers, m->max_seq);
    if (m->flags & CB_FLAG_SLIDING_WINDOW) { /* the parameters were checked before anything is sized */
        positions = 0;
        for (uint32_t l = 0; l < m->n_layers; l++)
            positions = cb_add(positions, cb_kv_layer_rows(cb_layer_window(blob, m, l), m));
    }
    n[CB_BUF_KEY_CACHE] = n[CB_BUF_VALUE_CACHE] = cb_mul(positions, cb_kv_row_bytes(m));
    n[CB_BUF_X] = n[CB_BUF_XB] = n[CB_BUF_MOE] = cb_mul(b, m->hidden);
    n[CB_BUF_Q] = cb_mul(b, qdim);
    n[CB_BUF_ATT] = cb_mul(b, cb_mul(m->n_heads, m->head_dim));
    n[CB_BUF_SCORES] = cb_mul(cb_attn_lanes(blob, m), (uint64_t)m->max_seq + (m->flags & CB_FLAG_ATTN_SINKS ? 1 : 0)); /* a sink: one more */
    n[CB_BUF_ROUTER] = cb_mul(b, m->n_experts);
    n[CB_BUF_GATE] = n[CB_BUF_UP] = cb_mul(b, m->ffn);
    n[CB_BUF_XGATE] = n[CB_BUF_XUP] = cb_mul(b, m->shared_ffn > m->dense_ffn ? m->shared_ffn : m->dense_ffn);
    if (m->flags & CB_FLAG_MLA) { /* f32 latents and rope keys; q and att rows (codegen/plan.py mla_row_widths) */
        const cb_mla_dims d = cb_mla_of(blob, m);
        uint64_t h = m->n_heads, r = d.kv_lora, att = cb_mul(h, cb_add(d.v, r));
        att = d.q_lora > att ? d.q_lora : att;
        att = cb_add(r, m->head_dim) > att ? cb_add(r, m->head_dim) : att;
        n[CB_BUF_KEY_CACHE] = cb_mul(cb_mul(cb_mul(m->n_layers, m->max_seq), r), sizeof(float));
        n[CB_BUF_VALUE_CACHE] = cb_mul(cb_mul(cb_mul(m->n_layers, m->max_seq), m->head_dim), sizeof(float));
        n[CB_BUF_Q] = cb_mul(b, cb_add(cb_mul(h, cb_add(d.nope, m->head_dim)), cb_mul(h, r)));
        n[CB_BUF_ATT] = cb_mul(b, att);
    }
    for (int i = 0; i < CB_N_BUFFERS; i++)
        if (i != CB_BUF_KEY_CACHE && i != CB_BUF_VALUE_CACHE)
            n[i] = cb_mul(n[i], sizeof(float));
}

/* --------------------------------------------------------------- header */

/* The family features' fields: each present exactly when its flag says so, everything else still zero. */
static colibri_status cb_check_features(cb_check *v, uint32_t flags)
{
    const uint8_t *b = v->b;
    cb_model *m = v->m;
    uint16_t minor = cb_rd16(b + CB_H_VERSION_MINOR);
    m->flags = flags;
    m->shared_ffn = cb_rd32(b + CB_H_SHARED_FFN);
    m->dense_ffn = cb_rd32(b + CB_H_DENSE_FFN);
    m->n_buffers = flags & (CB_FLAG_SHARED_EXPERT | CB_FLAG_DENSE_LAYERS) ? CB_N_BUFFERS : CB_N_BASE_BUFFERS;
    memcpy(&m->routed_scale, b + CB_H_ROUTED_SCALE, sizeof m->routed_scale);
    if ((flags & ~CB_FLAG_TIED) && minor < CB_MINOR_FEATURES)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: a feature in a blob whose minor predates them */
    if ((flags & CB_FLAG_KV) == CB_FLAG_KV)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: both KV_F16 and KV_INT8 */
    if ((flags & CB_FLAG_QK_NORM) == CB_FLAG_QK_NORM)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: both QK_NORM_HEAD and QK_NORM_FULL */
    if ((flags & CB_FLAG_SHARED_GATE) && !(flags & CB_FLAG_SHARED_EXPERT))
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: SHARED_GATE without SHARED_EXPERT */
    if (!(flags & CB_FLAG_SHARED_EXPERT) != !m->shared_ffn)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* shared_ffn: nonzero exactly with SHARED_EXPERT */
    if (!(flags & CB_FLAG_DENSE_LAYERS) != !m->dense_ffn)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* dense_ffn: nonzero exactly with DENSE_LAYERS */
    if (flags & CB_FLAG_ROUTED_SCALE) {
        if (!(m->routed_scale > 0.0f && m->routed_scale <= FLT_MAX))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* routed_scale: not finite and > 0 */
    } else if (cb_rd32(b + CB_H_ROUTED_SCALE) != 0) {
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* routed_scale: set without ROUTED_SCALE */
    } else {
        m->routed_scale = 1.0f;
    }
    for (uint32_t off = CB_H_BUFFER_OFFSET + 8 * m->n_buffers; off < CB_H_SHARED_FFN; off++)
        if (b[off])
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* buffer_offset: an entry beyond n_buffers is not zero */
    m->xq_off = cb_rd64(b + CB_H_XQ_OFFSET);
    if (m->xq_off != 0 && minor < CB_MINOR_INT8_ACTS)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* xq_offset: in a blob whose minor predates it */
    m->block = cb_rd32(b + CB_H_PREFILL_BLOCK);
    if (m->block > CB_MAX_BLOCK)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* prefill_block: above what this build takes */
    m->block += m->block == 0;
    uint32_t n_dense = 0;
    for (uint32_t l = 0; l < CB_DENSE_MAP_LAYERS; l++) {
        int bit = b[CB_H_DENSE_MAP + l / 8] >> (l % 8) & 1;
        if (bit && (!(flags & CB_FLAG_DENSE_LAYERS) || l >= m->n_layers))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* dense_map: a bit without DENSE_LAYERS or past n_layers */
        n_dense += (uint32_t)bit;
    }
    if ((flags & CB_FLAG_DENSE_LAYERS) && n_dense == 0)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* dense_map: empty with DENSE_LAYERS */
    return COLIBRI_OK;
}

/* MLA's widths from the shapes of layer 0 (cb_check_tensors then holds every layer to them): the latent
 * (KV_B's cols), the q latent (Q_A's rows), each head's nope part (its query rows less head_dim, the rope
 * part) and its value width (its KV_B rows less the nope part). */
static colibri_status cb_check_mla(cb_check *v)
{
    const uint8_t *b = v->b;
    const cb_model *m = v->m;
    const uint32_t flags = m->flags;
    if (!(flags & CB_FLAG_MLA))
        return flags & CB_FLAG_Q_LORA ? CB_BAD(COLIBRI_E_BAD_HEADER) : COLIBRI_OK; /* flags: Q_LORA without MLA */
    if (m->n_kv_heads != m->n_heads || (flags & (CB_FLAG_KV | CB_FLAG_QKV_BIAS | CB_FLAG_QK_NORM)))
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: MLA with kv heads, a 16/8-bit cache, biases or q/k norms */
    const cb_slots s = cb_layer_slots(flags, m->n_experts, cb_dense_bit(b, flags, 0));
    if ((uint64_t)CB_FIRST_LAYER + s.n_tensors > cb_rd32(b + CB_H_N_TENSORS))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* n_tensors: no first layer to read MLA's widths from */
    const uint8_t *kv_b = cb_entry(b, CB_FIRST_LAYER + s.mla + CB_OFF_KV_B);
    const uint8_t *q = cb_entry(b, CB_FIRST_LAYER + (flags & CB_FLAG_Q_LORA ? s.q_lora + CB_OFF_Q_B : s.wq));
    uint32_t h = m->n_heads, q_rows = cb_rd32(q + CB_E_ROWS), kv_rows = cb_rd32(kv_b + CB_E_ROWS);
    if (q_rows % h || kv_rows % h || q_rows / h <= m->head_dim || kv_rows / h <= q_rows / h - m->head_dim)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* MLA: query or kv_b rows not heads of nope + rope, nope + v */
    const cb_mla_dims d = cb_mla_of(b, m);
    if (!d.kv_lora || ((flags & CB_FLAG_Q_LORA) && !d.q_lora))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* MLA: a zero latent width */
    return COLIBRI_OK;
}

/* ------------------------------------------------------------ parameters */

/* A section entry (PARAMS, TOKENIZER) at table index i: U8 bytes x 1 of the kind, inside the payload. */
static colibri_status cb_check_bytes_entry(cb_check *v, size_t i, unsigned kind)
{
    const uint8_t *e = cb_entry(v->b, i);
    uint64_t bytes = cb_rd32(e + CB_E_ROWS), off = cb_rd64(e + CB_E_DATA_OFF);
    if (cb_rd16(e + CB_E_KIND) != kind || cb_rd16(e + CB_E_LAYER) || cb_rd16(e + CB_E_EXPERT))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* section: not its kind's entry where the flag puts it */
    if (e[CB_E_DTYPE] != CB_BYTES_DTYPE || e[CB_E_SCALE_DTYPE] || bytes == 0 || cb_rd32(e + CB_E_COLS) != 1
        || cb_rd32(e + CB_E_ROW_STRIDE) != 1 || cb_rd32(e + CB_E_GROUP_SIZE) || cb_rd32(e + CB_E_N_OUTLIERS)
        || cb_rd32(e + CB_E_RESERVED) || cb_rd64(e + CB_E_SCALE_OFF) || cb_rd64(e + CB_E_OIDX_OFF)
        || cb_rd64(e + CB_E_OVAL_OFF))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* section: not U8 bytes x 1, or a part a section lacks */
    if (kind == CB_KIND_PARAMS && bytes % CB_PARAM_RECORD_BYTES)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* params: a length not a whole number of records */
    if (off % CB_ALIGN != 0 || off < v->header_bytes || cb_add(off, bytes) > v->len)
        return CB_BAD(COLIBRI_E_TENSOR_BOUNDS); /* section: unaligned or outside the payload */
    return COLIBRI_OK;
}

/* The parameters section (FORMAT.md "Parameters"), before anything is sized from it: its entry, then each
 * record against the keys this runtime knows (CB_PARAM_DEFS) and the header's flags and n_layers. */
static colibri_status cb_check_params(cb_check *v)
{
    static const cb_param_def defs[] = CB_PARAM_DEFS;
    cb_model *m = v->m;
    uint8_t seen[sizeof defs / sizeof defs[0]] = {0};
    uint32_t n_tensors = cb_rd32(v->b + CB_H_N_TENSORS);
    m->n_params = 0;
    if (!(m->flags & CB_FLAG_PARAMS)) {
        if (m->flags & CB_PARAM_FLAGS)
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: a feature with parameters, without PARAMS */
        return COLIBRI_OK;
    }
    uint32_t tok = (m->flags & CB_FLAG_TOKENIZER) ? 1 : 0;
    if (n_tensors < CB_FIRST_LAYER + 1 + tok)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* n_tensors: no room for the PARAMS entry */
    size_t i = (size_t)n_tensors - 1 - tok;
    CB_TRY(cb_check_bytes_entry(v, i, CB_KIND_PARAMS));
    const uint8_t *rec = v->b + cb_rd64(cb_entry(v->b, i) + CB_E_DATA_OFF);
    uint32_t n = cb_rd32(cb_entry(v->b, i) + CB_E_ROWS) / CB_PARAM_RECORD_BYTES;
    for (uint32_t r = 1; r < n; r++) { /* the structure first: a newer feature's section is still sorted */
        const uint8_t *a = rec + CB_PARAM_RECORD_BYTES * (r - 1), *b = a + CB_PARAM_RECORD_BYTES;
        if (((uint32_t)cb_rd16(b) << 16 | cb_rd16(b + 2)) <= ((uint32_t)cb_rd16(a) << 16 | cb_rd16(a + 2)))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: records not sorted by (key, index), or repeated */
    }
    for (uint32_t r = 0; r < n; r++, rec += CB_PARAM_RECORD_BYTES) {
        uint32_t key = cb_rd16(rec), index = cb_rd16(rec + 2), value = cb_rd32(rec + 4);
        size_t d = 0;
        while (defs[d].key && defs[d].key != key) /* the list ends with key 0 */
            d++;
        if (!defs[d].key)
            return CB_BAD(COLIBRI_E_VERSION); /* params: a key of a newer feature than this runtime's */
        if (defs[d].per_layer ? index >= m->n_layers : index != 0)
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: index past n_layers, or nonzero on a global key */
        if (!(m->flags & defs[d].flag))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: a key without its flag */
        float f;
        memcpy(&f, &value, sizeof f);
        if (defs[d].type == CB_PARAM_F32 && !(f >= -FLT_MAX && f <= FLT_MAX))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: an f32 value not finite */
        seen[d] = 1;
    }
    for (size_t d = 0; defs[d].key; d++)
        if (defs[d].required && (m->flags & defs[d].flag) && !seen[d])
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: a flag without a key it requires */
    m->n_params = n;
    if (m->flags & CB_FLAG_GROUP_TOPK) { /* FORMAT.md "Parameters" N_GROUP, TOPK_GROUP */
        uint32_t groups = cb_param_u32(v->b, m, CB_PARAM_N_GROUP, 0), top = cb_param_u32(v->b, m, CB_PARAM_TOPK_GROUP, 0);
        if (!groups || m->n_experts % groups || !top || top > groups
            || m->top_k > (uint64_t)top * (m->n_experts / groups))
            return CB_BAD(COLIBRI_E_BAD_HEADER); /* params: groups not dividing the experts, or holding < top_k */
    }
    return COLIBRI_OK;
}

/* The frame around the model: alignment, length, magic, major version, table size, CRC-32. */
static colibri_status cb_check_frame(cb_check *v)
{
    const uint8_t *b = v->b;
    const uint64_t len = v->len;
    if ((uintptr_t)b % CB_ALIGN != 0)
        return CB_BAD(COLIBRI_E_BLOB_ALIGN);
    if (len < CB_HEADER_BYTES)
        return CB_BAD(COLIBRI_E_TRUNCATED); /* shorter than the fixed header */
    if (cb_rd32(b + CB_H_MAGIC) != CB_MAGIC)
        return CB_BAD(COLIBRI_E_BAD_MAGIC);
    if (cb_rd16(b + CB_H_VERSION_MAJOR) != CB_VERSION_MAJOR)
        return CB_BAD(COLIBRI_E_VERSION); /* a newer minor only adds what an older reader may ignore */
    v->header_bytes = cb_rd32(b + CB_H_HEADER_BYTES);
    if (cb_rd64(b + CB_H_BLOB_BYTES) != len)
        return CB_BAD(COLIBRI_E_TRUNCATED); /* blob_bytes: not the length passed in */
    if (v->header_bytes > len
        || v->header_bytes != cb_align64(CB_HEADER_BYTES + (uint64_t)CB_ENTRY_BYTES * cb_rd32(b + CB_H_N_TENSORS)))
        return CB_BAD(COLIBRI_E_TRUNCATED); /* header_bytes: not the table's end, or past the blob */
    if (cb_crc32(0, b + CB_CRC_FROM, len - CB_CRC_FROM) != cb_rd32(b + CB_H_CRC32))
        return CB_BAD(COLIBRI_E_CRC);
    return COLIBRI_OK;
}

/* The dims and flags: nonzero, consistent, within the format's bounds and size_t. */
static colibri_status cb_check_header(cb_check *v)
{
    const uint8_t *b = v->b;
    cb_model *m = v->m;
    CB_TRY(cb_check_frame(v));
    m->vocab = cb_rd32(b + CB_H_VOCAB);
    m->hidden = cb_rd32(b + CB_H_HIDDEN);
    m->n_layers = cb_rd32(b + CB_H_N_LAYERS);
    m->n_heads = cb_rd32(b + CB_H_N_HEADS);
    m->n_kv_heads = cb_rd32(b + CB_H_N_KV_HEADS);
    m->head_dim = cb_rd32(b + CB_H_HEAD_DIM);
    m->ffn = cb_rd32(b + CB_H_FFN);
    m->n_experts = cb_rd32(b + CB_H_N_EXPERTS);
    m->top_k = cb_rd32(b + CB_H_TOP_K);
    m->max_seq = cb_rd32(b + CB_H_MAX_SEQ);
    memcpy(&m->rms_eps, b + CB_H_RMS_EPS, sizeof m->rms_eps);
    uint32_t flags = cb_rd32(b + CB_H_FLAGS);
    m->tied = flags & CB_FLAG_TIED;
    if (flags & ~CB_FLAGS_KNOWN)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* flags: an unknown one may change the maths: refuse, not guess */
    CB_TRY(cb_check_features(v, flags));
    if (!m->vocab || !m->hidden || !m->n_layers || !m->n_heads || !m->n_kv_heads || !m->head_dim
        || !m->ffn || !m->n_experts || !m->top_k || !m->max_seq)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* a zero dim */
    if (m->n_heads % m->n_kv_heads || m->head_dim % 2)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* n_kv_heads does not divide n_heads, or head_dim is odd */
    if (m->top_k > m->n_experts || m->top_k > CB_MAX_TOP_K)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* top_k: above n_experts or CB_MAX_TOP_K */
    if (!(m->rms_eps >= 0.0f && m->rms_eps <= FLT_MAX)) /* also refuses NaN */
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* rms_eps: negative or not finite */
    if (m->n_layers > CB_MAX_LAYERS || m->n_experts > CB_MAX_EXPERTS)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* n_layers or n_experts: above CB_MAX_LAYERS, CB_MAX_EXPERTS */
    CB_TRY(cb_check_params(v));
    CB_TRY(cb_check_mla(v));
    uint64_t bytes[CB_N_BUFFERS];
    cb_buffer_bytes(b, m, bytes);
    /* >= rather than >: on 64-bit hosts SIZE_MAX is also the saturated value */
    if (bytes[CB_BUF_KEY_CACHE] >= SIZE_MAX || bytes[CB_BUF_Q] >= SIZE_MAX
        || cb_rd64(b + CB_H_ARENA_BYTES) >= SIZE_MAX || cb_mul(cb_mul(m->block, m->n_heads), m->head_dim) >= SIZE_MAX)
        return CB_BAD(COLIBRI_E_BAD_HEADER); /* arena_bytes or a buffer's size: beyond size_t */
    m->layout = cb_rd32(b + CB_H_LAYOUT);
    if (m->layout != CB_LAYOUT_ROWS && !(m->layout == CB_LAYOUT_TILED16 && m->xq_off))
        return CB_BAD(COLIBRI_E_LAYOUT);
#ifdef COLIBRI_SPECIALISED
    if (m->vocab != COLIBRI_VOCAB || m->hidden != COLIBRI_HIDDEN || m->n_layers != COLIBRI_N_LAYERS
        || m->n_heads != COLIBRI_N_HEADS || m->n_kv_heads != COLIBRI_N_KV_HEADS || m->head_dim != COLIBRI_HEAD_DIM
        || m->ffn != COLIBRI_FFN || m->n_experts != COLIBRI_N_EXPERTS || m->top_k != COLIBRI_TOP_K
        || m->max_seq != COLIBRI_MAX_SEQ || m->tied != COLIBRI_TIED_LM_HEAD || m->flags != COLIBRI_FLAGS
        || m->shared_ffn != COLIBRI_SHARED_FFN || m->dense_ffn != COLIBRI_DENSE_FFN
        || (m->xq_off != 0) != CB_SPEC_INT8_ACTS)
        return CB_BAD(COLIBRI_E_MODEL_MISMATCH);
#endif
    return COLIBRI_OK;
}

/* --------------------------------------------------------- tensor table */

/* Table entry i against what its place says: kind, layer, expert, rows x cols, one of dtypes. */
static colibri_status cb_check_entry(cb_check *v, size_t i, unsigned kind, uint32_t layer, uint32_t expert,
                                     uint64_t rows, uint64_t cols, unsigned dtypes)
{
    const uint8_t *e = cb_entry(v->b, i);
    unsigned dtype = e[CB_E_DTYPE], scale_dtype = e[CB_E_SCALE_DTYPE];
    uint64_t stride = cb_rd32(e + CB_E_ROW_STRIDE), group = cb_rd32(e + CB_E_GROUP_SIZE);
    uint64_t n_out = cb_rd32(e + CB_E_N_OUTLIERS);
    int int4 = cb_is_int4(dtype), int16 = dtype == CB_I16;
    int quantised = dtype == CB_I8 || dtype == CB_I8C || int4 || int16;
    int tiled = !int4 && v->m->layout == CB_LAYOUT_TILED16 && cb_is_q8(v->m, dtype, cols, group);
    /* a tiled matrix: rows padded to whole tiles, no row padding, scales tiled the same way */
    uint64_t stored_rows = tiled ? (rows + CB_TILE16_ROWS - 1) / CB_TILE16_ROWS * CB_TILE16_ROWS : rows;

    if (cb_rd16(e + CB_E_KIND) != kind || cb_rd16(e + CB_E_LAYER) != layer || cb_rd16(e + CB_E_EXPERT) != expert)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* kind, layer or expert: not this place's */
    if (cb_rd32(e + CB_E_ROWS) != rows || cb_rd32(e + CB_E_COLS) != cols)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* rows or cols: not what the dims say */
    if (dtype > CB_DTYPE_LAST || (!CB_HAS_INT4 && int4) || (!CB_HAS_INT16 && int16))
        return CB_BAD(COLIBRI_E_DTYPE); /* dtype: newer than this runtime's kernels, or not built in (kernels.h) */
    if (dtype < CB_F32 || !(dtypes & DT(dtype)))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* dtype: zero, or not one this kind takes */
    if (stride < cb_row_bytes(dtype, cols) || stride % CB_ROW_ALIGN != 0 || (tiled && stride != cols))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* row_stride: short, unaligned, or padded in a tiled matrix */
    if (int4 && (!v->m->xq_off || group != CB_Q8_BLOCK))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* int4: without integer matmuls, or not one scale a block */
    if (int16 && (scale_dtype != CB_F32 || group != cols || cols % CB_Q8_BLOCK != 0))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* int16: not one f32 scale a row, or not whole blocks */
    /* group_size means nothing to F32/F16 and is not checked there; int4's is the activation block even
     * when the matrix is narrower (cols < 32: one partial block, as the last block of any width) */
    if (quantised ? (scale_dtype != CB_F32 && scale_dtype != CB_F16) || group == 0 || (group > cols && !int4)
                  : scale_dtype != 0)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* scale_dtype or group_size */
    if (n_out != 0 && dtype != CB_I8C && dtype != CB_I4C)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* n_outliers: in a tensor without corrections */

    /* data, scales, outlier indices, outlier values: "0 if none", else 64-aligned and inside the payload */
    uint64_t n_scales = quantised ? cb_mul(stored_rows, cb_ceil_div((uint32_t)cols, (uint32_t)group)) : 0;
    uint64_t len[4] = {cb_mul(stored_rows, stride), cb_mul(n_scales, cb_elem_bytes(scale_dtype)), n_out * 2, n_out * 2};
    for (int p = 0; p < 4; p++) {
        uint64_t off = cb_rd64(e + CB_E_DATA_OFF + 8 * p);
        if (len[p] == 0 && off != 0)
            return CB_BAD(COLIBRI_E_BAD_TENSOR); /* data_off..oval_off: an offset of an empty part */
        if (len[p] != 0 && (off % CB_ALIGN != 0 || off < v->header_bytes || cb_add(off, len[p]) > v->len))
            return CB_BAD(COLIBRI_E_TENSOR_BOUNDS); /* data_off..oval_off: unaligned or outside the payload */
    }
    /* the kernels walk outliers in one sorted pass and index x with them: every
     * gap after the first is >= 1 and the last index is inside the matrix */
    const uint8_t *gap = v->b + cb_rd64(e + CB_E_OIDX_OFF);
    uint64_t n_weights = rows * cols, idx = 0;
    for (uint64_t k = 0; k < n_out; k++) {
        uint16_t g = cb_rd16(gap + 2 * k);
        if (k > 0 && g == 0)
            return CB_BAD(COLIBRI_E_BAD_TENSOR); /* outlier gaps: an index repeated */
        idx += g;
    }
    if (n_out && idx >= n_weights)
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* outlier gaps: the last index past the matrix */
    /* int16: the kernels sum 32 products in int32, exact only for |q| <= CB_Q16_MAX (rows 64-byte aligned in
     * an aligned blob: read as int16; q + MAX as unsigned is at most 2 MAX exactly when |q| <= MAX) */
    const uint8_t *data = v->b + cb_rd64(e + CB_E_DATA_OFF);
    for (uint64_t r = 0; int16 && r < rows; r++) {
        const int16_t *q = (const int16_t *)(const void *)(data + r * stride);
        for (uint64_t c = 0; c < cols; c++)
            if ((uint32_t)(q[c] + CB_Q16_MAX) > 2u * CB_Q16_MAX)
                return CB_BAD(COLIBRI_E_BAD_TENSOR); /* int16 data: a value outside [-8191, 8191] */
    }
    return COLIBRI_OK;
}

/* An MLP's three matrices from table index i: gate and up hidden -> w, down w -> hidden. */
static colibri_status cb_check_mlp(cb_check *v, size_t i, const unsigned kind[3], uint32_t l, uint32_t e, uint64_t w)
{
    uint64_t d = v->m->hidden;
    CB_TRY(cb_check_entry(v, i + CB_MLP_GATE, kind[CB_MLP_GATE], l, e, w, d, DT_ANY));
    CB_TRY(cb_check_entry(v, i + CB_MLP_DOWN, kind[CB_MLP_DOWN], l, e, d, w, DT_ANY));
    return cb_check_entry(v, i + CB_MLP_UP, kind[CB_MLP_UP], l, e, w, d, DT_ANY);
}

/* gpt-oss's vectors of layer l (its first table index base): the output bias, the heads' sinks, the router's
 * bias and each expert's gate, down and up biases, F32, where the flags put them. */
static colibri_status cb_check_gpt_oss(cb_check *v, size_t base, const cb_slots *s, uint32_t l)
{
    const cb_model *m = v->m;
    const uint64_t d = m->hidden;
    if (s->o_bias != CB_NO_SLOT)
        CB_TRY(cb_check_entry(v, base + s->o_bias, CB_KIND_BO, l, 0, 1, d, DT(CB_F32)));
    if (s->sinks != CB_NO_SLOT)
        CB_TRY(cb_check_entry(v, base + s->sinks, CB_KIND_SINKS, l, 0, 1, m->n_heads, DT(CB_F32)));
    if (s->router_bias != CB_NO_SLOT)
        CB_TRY(cb_check_entry(v, base + s->router_bias, CB_KIND_ROUTER_BIAS, l, 0, 1, m->n_experts, DT(CB_F32)));
    if (s->expert_bias != CB_NO_SLOT)
        for (uint32_t e = 0; e < m->n_experts; e++) {
            size_t i = base + s->expert_bias + (size_t)CB_MLP_TENSORS * e;
            CB_TRY(cb_check_entry(v, i + CB_MLP_GATE, CB_KIND_B_GATE, l, e, 1, m->ffn, DT(CB_F32)));
            CB_TRY(cb_check_entry(v, i + CB_MLP_DOWN, CB_KIND_B_DOWN, l, e, 1, d, DT(CB_F32)));
            CB_TRY(cb_check_entry(v, i + CB_MLP_UP, CB_KIND_B_UP, l, e, 1, m->ffn, DT(CB_F32)));
        }
    return COLIBRI_OK;
}

/* Layer l's MLA attention (its first table index base): q_proj or q_a, q_a_norm, q_b; kv_a, kv_a_norm,
 * kv_b (F32: the forward pass reads it per head, both ways); o_proj. */
static colibri_status cb_check_mla_entries(cb_check *v, size_t base, const cb_slots *s, uint32_t l)
{
    const cb_model *m = v->m;
    const cb_mla_dims mla = cb_mla_of(v->b, m);
    const uint64_t d = m->hidden, h = m->n_heads, r = mla.kv_lora, qk = (uint64_t)mla.nope + m->head_dim;
    if (s->q_lora != CB_NO_SLOT) {
        CB_TRY(cb_check_entry(v, base + s->q_lora + CB_OFF_Q_A, CB_KIND_Q_A, l, 0, mla.q_lora, d, DT_ANY));
        CB_TRY(cb_check_entry(v, base + s->q_lora + CB_OFF_Q_A_NORM, CB_KIND_Q_A_NORM, l, 0, 1, mla.q_lora, DT(CB_F32)));
        CB_TRY(cb_check_entry(v, base + s->q_lora + CB_OFF_Q_B, CB_KIND_Q_B, l, 0, h * qk, mla.q_lora, DT_ANY));
    } else {
        CB_TRY(cb_check_entry(v, base + s->wq, CB_KIND_WQ, l, 0, h * qk, d, DT_ANY));
    }
    CB_TRY(cb_check_entry(v, base + s->mla + CB_OFF_KV_A, CB_KIND_KV_A, l, 0, r + m->head_dim, d, DT_ANY));
    CB_TRY(cb_check_entry(v, base + s->mla + CB_OFF_KV_A_NORM, CB_KIND_KV_A_NORM, l, 0, 1, r, DT(CB_F32)));
    CB_TRY(cb_check_entry(v, base + s->mla + CB_OFF_KV_B, CB_KIND_KV_B, l, 0, h * ((uint64_t)mla.nope + mla.v), r,
                          DT(CB_F32)));
    return cb_check_entry(v, base + s->wo, CB_KIND_WO, l, 0, d, h * mla.v, DT_ANY);
}

/* Every entry, in table order, against the kind, shape and dtypes its place in the table implies. */
static colibri_status cb_check_tensors(cb_check *v)
{
    static const unsigned expert_kinds[3] = {CB_KIND_W_GATE, CB_KIND_W_DOWN, CB_KIND_W_UP};
    static const unsigned shared_kinds[3] = {CB_KIND_SHARED_W_GATE, CB_KIND_SHARED_W_DOWN, CB_KIND_SHARED_W_UP};
    static const unsigned mlp_kinds[3] = {CB_KIND_MLP_GATE, CB_KIND_MLP_DOWN, CB_KIND_MLP_UP};
    const cb_model *m = v->m;
    const uint64_t d = m->hidden, qdim = (uint64_t)m->n_heads * m->head_dim, kvdim = (uint64_t)m->n_kv_heads * m->head_dim;
    const int per_head = (m->flags & CB_FLAG_QK_NORM_HEAD) != 0;
    if (cb_rd32(v->b + CB_H_N_TENSORS) != cb_n_tensors(v->b, m))
        return CB_BAD(COLIBRI_E_BAD_TENSOR); /* n_tensors: not the count the dims imply */
    CB_TRY(cb_check_entry(v, CB_T_EMBED, CB_KIND_EMBED, 0, 0, m->vocab, d, DT_ANY));
    CB_TRY(cb_check_entry(v, CB_T_ROPE_FREQ, CB_KIND_ROPE_FREQ, 0, 0, 1, m->head_dim / 2, DT(CB_F32)));
    size_t base = CB_FIRST_LAYER;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const cb_slots s = cb_layer_slots(m->flags, m->n_experts, cb_dense_bit(v->b, m->flags, l));
        CB_TRY(cb_check_entry(v, base + s.attn_norm, CB_KIND_ATTN_NORM, l, 0, 1, d, DT(CB_F32)));
        if (s.mla != CB_NO_SLOT) {
            CB_TRY(cb_check_mla_entries(v, base, &s, l));
        } else {
            CB_TRY(cb_check_entry(v, base + s.wq, CB_KIND_WQ, l, 0, qdim, d, DT_ANY));
            CB_TRY(cb_check_entry(v, base + s.wk, CB_KIND_WK, l, 0, kvdim, d, DT_ANY));
            CB_TRY(cb_check_entry(v, base + s.wv, CB_KIND_WV, l, 0, kvdim, d, DT_ANY));
            CB_TRY(cb_check_entry(v, base + s.wo, CB_KIND_WO, l, 0, d, qdim, DT_ANY));
        }
        if (s.qkv_bias != CB_NO_SLOT) {
            CB_TRY(cb_check_entry(v, base + s.qkv_bias + CB_OFF_BQ, CB_KIND_BQ, l, 0, 1, qdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(v, base + s.qkv_bias + CB_OFF_BK, CB_KIND_BK, l, 0, 1, kvdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(v, base + s.qkv_bias + CB_OFF_BV, CB_KIND_BV, l, 0, 1, kvdim, DT(CB_F32)));
        }
        if (s.qk_norm != CB_NO_SLOT) {
            CB_TRY(cb_check_entry(v, base + s.qk_norm + CB_OFF_Q_NORM, CB_KIND_Q_NORM, l, 0, 1,
                                  per_head ? m->head_dim : qdim, DT(CB_F32)));
            CB_TRY(cb_check_entry(v, base + s.qk_norm + CB_OFF_K_NORM, CB_KIND_K_NORM, l, 0, 1,
                                  per_head ? m->head_dim : kvdim, DT(CB_F32)));
        }
        CB_TRY(cb_check_entry(v, base + s.ffn_norm, CB_KIND_FFN_NORM, l, 0, 1, d, DT(CB_F32)));
        if (s.mlp != CB_NO_SLOT)
            CB_TRY(cb_check_mlp(v, base + s.mlp, mlp_kinds, l, 0, m->dense_ffn));
        if (s.router != CB_NO_SLOT)
            CB_TRY(cb_check_entry(v, base + s.router, CB_KIND_ROUTER, l, 0, m->n_experts, d, DT(CB_F32) | DT(CB_F16)));
        if (s.choice_bias != CB_NO_SLOT)
            CB_TRY(cb_check_entry(v, base + s.choice_bias, CB_KIND_CHOICE_BIAS, l, 0, 1, m->n_experts, DT(CB_F32)));
        if (s.experts != CB_NO_SLOT)
            for (uint32_t e = 0; e < m->n_experts; e++)
                CB_TRY(cb_check_mlp(v, base + s.experts + (size_t)CB_MLP_TENSORS * e, expert_kinds, l, e, m->ffn));
        if (s.shared_gate != CB_NO_SLOT)
            CB_TRY(cb_check_entry(v, base + s.shared_gate, CB_KIND_SHARED_EXPERT_GATE, l, 0, 1, d, DT(CB_F32)));
        if (s.shared != CB_NO_SLOT)
            CB_TRY(cb_check_mlp(v, base + s.shared, shared_kinds, l, 0, m->shared_ffn));
        CB_TRY(cb_check_gpt_oss(v, base, &s, l));
        base += s.n_tensors;
    }
    CB_TRY(cb_check_entry(v, base, CB_KIND_FINAL_NORM, 0, 0, 1, d, DT(CB_F32)));
    if (!m->tied)
        CB_TRY(cb_check_entry(v, base + 1, CB_KIND_LM_HEAD, 0, 0, m->vocab, d, DT_ANY));
    base += m->tied ? 1 : 2;
    if (m->flags & CB_FLAG_PARAMS) /* checked by cb_check_params, from the same n_tensors */
        base++;
    if (m->flags & CB_FLAG_TOKENIZER) /* colibri_tok_init checks what its bytes say */
        CB_TRY(cb_check_bytes_entry(v, base, CB_KIND_TOKENIZER));
    return COLIBRI_OK;
}

/* ------------------------------------------------------------ arena plan */

static colibri_status cb_check_plan(cb_check *v)
{
    const uint8_t *b = v->b;
    const cb_model *m = v->m;
    uint64_t arena = cb_rd64(b + CB_H_ARENA_BYTES), off[CB_N_BUFFERS], bytes[CB_N_BUFFERS];
    const int n_buffers = (int)m->n_buffers;
    if (cb_rd32(b + CB_H_N_BUFFERS) != m->n_buffers)
        return CB_BAD(COLIBRI_E_BAD_PLAN); /* n_buffers: not what the flags imply */
    cb_buffer_bytes(b, m, bytes);
    for (int i = 0; i < n_buffers; i++) {
        off[i] = cb_rd64(b + CB_H_BUFFER_OFFSET + 8 * (size_t)i);
        if (off[i] % CB_ALIGN != 0 || off[i] < CB_CTX_BYTES || cb_add(off[i], bytes[i]) > arena)
            return CB_BAD(COLIBRI_E_BAD_PLAN); /* buffer_offset: unaligned, on the context, or past arena_bytes */
    }
    if (m->xq_off) { /* live through every step: it overlaps no buffer */
        uint64_t xq_end = cb_add(m->xq_off, cb_mul(m->block, cb_xq_row_bytes(m, b)));
        if (m->xq_off % CB_ALIGN != 0 || m->xq_off < CB_CTX_BYTES || xq_end > arena)
            return CB_BAD(COLIBRI_E_BAD_PLAN); /* xq_offset: unaligned, on the context, or past arena_bytes */
        for (int i = 0; i < n_buffers; i++)
            if (off[i] < xq_end && m->xq_off < off[i] + bytes[i])
                return CB_BAD(COLIBRI_E_BAD_PLAN); /* xq_offset: overlaps a buffer */
    }
    for (int i = 0; i < n_buffers; i++)
        for (int j = i + 1; j < n_buffers; j++) {
            int live_together = cb_lifetime[i][0] <= cb_lifetime[j][1] && cb_lifetime[j][0] <= cb_lifetime[i][1];
            if (live_together && off[i] < off[j] + bytes[j] && off[j] < off[i] + bytes[i])
                return CB_BAD(COLIBRI_E_BAD_PLAN); /* buffer_offset: two buffers live together overlap */
        }
    return COLIBRI_OK;
}

static colibri_status cb_run_checks(cb_check *v)
{
    CB_TRY(cb_check_header(v));
    CB_TRY(cb_check_tensors(v));
    return cb_check_plan(v);
}

/* The whole blob check, in the order the status codes are documented to win. */
colibri_status cb_validate(const void *blob, size_t len, cb_model *m)
{
    cb_check v = {(const uint8_t *)blob, len, 0, m, 0};
    return cb_run_checks(&v);
}

#ifdef COLIBRI_TRACE_CHECKS
colibri_status colibri_debug_check(const void *blob, size_t blob_len, unsigned *line)
{
    cb_model m;
    cb_check v = {(const uint8_t *)blob, blob_len, 0, &m, 0};
    if (!blob || !line)
        return COLIBRI_E_NULL;
    colibri_status st = cb_run_checks(&v);
    *line = v.line;
    return st;
}
#endif

/* ------------------------------------------------------------------- API */

colibri_status colibri_arena_bytes(const void *blob, size_t blob_len, size_t *out_bytes)
{
    cb_model m;
    if (!blob || !out_bytes)
        return COLIBRI_E_NULL;
    CB_TRY(cb_validate(blob, blob_len, &m));
    *out_bytes = (size_t)cb_rd64((const uint8_t *)blob + CB_H_ARENA_BYTES);
    return COLIBRI_OK;
}

/* The context at the start of act, each buffer at base[its class] + its offset less its class's first
 * offset (first[]: 0 for the whole arena). Only called once every check has passed. */
static colibri_ctx *cb_build_ctx(const uint8_t *b, size_t blob_len, const cb_model *m,
                                 uint8_t *const base[COLIBRI_N_CLASSES], const size_t first[COLIBRI_N_CLASSES])
{
    static const uint8_t cls[CB_N_BUFFERS] = CB_BUFFER_CLASSES;
    colibri_ctx *c = (colibri_ctx *)(void *)base[COLIBRI_CLASS_ACTIVATIONS];
    memset(c, 0, sizeof *c);
    c->blob = b;
    c->blob_bytes = blob_len;
    c->m = *m;
    for (uint32_t i = 0; i < m->n_buffers; i++)
        c->buf[i] = (float *)(void *)(base[cls[i]] + ((size_t)cb_rd64(b + CB_H_BUFFER_OFFSET + 8 * i) - first[cls[i]]));
    c->xq = m->xq_off ? (int8_t *)(base[CB_XQ_CLASS] + ((size_t)m->xq_off - first[CB_XQ_CLASS])) : NULL;
    c->q8_sw_prefetch = cb_q8_sw_prefetch();
    c->self = c;
    c->magic = CB_CTX_MAGIC;
    return c;
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
    uint64_t arena_bytes = cb_rd64(b + CB_H_ARENA_BYTES);
    if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN != 0)
        return COLIBRI_E_ARENA_ALIGN;
    if (arena_len < arena_bytes)
        return COLIBRI_E_ARENA_SMALL;
    /* the arena is untouched until here: a live context in it survives errors */
    uint8_t *base[COLIBRI_N_CLASSES] = {(uint8_t *)arena, (uint8_t *)arena, (uint8_t *)arena};
    static const size_t whole[COLIBRI_N_CLASSES] = {0, 0, 0};
    *out_ctx = cb_build_ctx(b, blob_len, &m, base, whole);
    return COLIBRI_OK;
}

/* Each class's range of the (validated) plan: first[c] its lowest offset (the activations': 0, the
 * context's), need[c] its extent rounded up to CB_ALIGN. COLIBRI_E_BAD_PLAN when two ranges overlap.
 * In size_t: the plan check bounded every buffer by arena_bytes, and the header check arena_bytes by
 * SIZE_MAX. */
static colibri_status cb_class_ranges(const uint8_t *b, const cb_model *m, size_t first[COLIBRI_N_CLASSES],
                                      size_t need[COLIBRI_N_CLASSES])
{
    static const uint8_t cls[CB_N_BUFFERS + 1] = CB_BUFFER_CLASSES_XQ;
    uint64_t bytes[CB_N_BUFFERS + 1];
    size_t end[COLIBRI_N_CLASSES] = {0, CB_CTX_BYTES, 0};
    cb_buffer_bytes(b, m, bytes);
    first[COLIBRI_CLASS_KV_CACHE] = first[COLIBRI_CLASS_SCRATCH] = SIZE_MAX;
    first[COLIBRI_CLASS_ACTIVATIONS] = 0;
    uint32_t n = m->n_buffers;
    bytes[n] = cb_mul(m->block, cb_xq_row_bytes(m, b)); /* xq, when there is one, after the table's buffers */
    for (uint32_t i = 0; i < n + (m->xq_off != 0); i++) {
        size_t off = (size_t)(i < n ? cb_rd64(b + CB_H_BUFFER_OFFSET + 8 * i) : m->xq_off), e = off + (size_t)bytes[i];
        int c = cls[i < n ? i : CB_N_BUFFERS];
        first[c] = off < first[c] ? off : first[c];
        end[c] = e > end[c] ? e : end[c];
    }
    for (int c = 0; c < COLIBRI_N_CLASSES; c++) {
        if (first[c] == SIZE_MAX || end[c] > SIZE_MAX - CB_ALIGN) /* (every class has a buffer: the caches, x,
                                                                 * scores; an arena near SIZE_MAX has no room) */
            return COLIBRI_E_BAD_PLAN;
        need[c] = ((end[c] + (CB_ALIGN - 1)) & ~(size_t)(CB_ALIGN - 1)) - first[c];
        for (int d = 0; d < c; d++)
            if (first[c] < end[d] && first[d] < end[c])
                return COLIBRI_E_BAD_PLAN; /* two classes interleave: the plan keeps no class apart */
    }
    return COLIBRI_OK;
}

colibri_status colibri_region_bytes(const void *blob, size_t blob_len, size_t *out, size_t n_out)
{
    cb_model m;
    size_t first[COLIBRI_N_CLASSES], need[COLIBRI_N_CLASSES];
    if (!blob || !out)
        return COLIBRI_E_NULL;
    if (n_out != COLIBRI_N_CLASSES)
        return COLIBRI_E_ARG;
    CB_TRY(cb_validate(blob, blob_len, &m));
    CB_TRY(cb_class_ranges((const uint8_t *)blob, &m, first, need));
    for (int c = 0; c < COLIBRI_N_CLASSES; c++)
        out[c] = need[c];
    return COLIBRI_OK;
}

colibri_status colibri_init_regions(colibri_ctx **out_ctx, const colibri_region *regions, size_t n_regions,
                                    const void *blob, size_t blob_len)
{
    cb_model m;
    size_t first[COLIBRI_N_CLASSES], need[COLIBRI_N_CLASSES];
    uint8_t *base[COLIBRI_N_CLASSES];
    if (!out_ctx)
        return COLIBRI_E_NULL;
    *out_ctx = NULL;
    if (!regions || !blob)
        return COLIBRI_E_NULL;
    if (n_regions != COLIBRI_N_CLASSES)
        return COLIBRI_E_ARG;
    for (int c = 0; c < COLIBRI_N_CLASSES; c++)
        if (!regions[c].ptr)
            return COLIBRI_E_NULL;
    CB_TRY(cb_validate(blob, blob_len, &m));
    const uint8_t *b = (const uint8_t *)blob;
    CB_TRY(cb_class_ranges(b, &m, first, need));
    for (int c = 0; c < COLIBRI_N_CLASSES; c++) {
        if ((uintptr_t)regions[c].ptr % COLIBRI_ARENA_ALIGN != 0)
            return COLIBRI_E_ARENA_ALIGN;
        if (regions[c].len < need[c])
            return COLIBRI_E_ARENA_SMALL;
        base[c] = (uint8_t *)regions[c].ptr;
    }
    for (int c = 0; c < COLIBRI_N_CLASSES; c++)
        for (int d = c + 1; d < COLIBRI_N_CLASSES; d++) {
            uintptr_t pc = (uintptr_t)base[c], pd = (uintptr_t)base[d];
            if (pc < pd + need[d] && pd < pc + need[c])
                return COLIBRI_E_ARG; /* two regions overlap */
        }
    *out_ctx = cb_build_ctx(b, blob_len, &m, base, first);
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
    case COLIBRI_E_ARG: return "bad argument (no tokens, logits buffer shorter than vocab, or regions overlapping)";
    case COLIBRI_E_DTYPE: return "a tensor's weight format is not implemented by this build";
    }
    return "unknown colibri status";
}
