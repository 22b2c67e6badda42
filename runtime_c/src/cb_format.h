/* cb_format.h - the blob format's numbers, generated from codegen/format.py by
 * `python -m colibri.codegen.formatgen`: do not edit (tests/test_format.py checks it). */
#ifndef CB_FORMAT_H
#define CB_FORMAT_H

#include <stdint.h>

#define CB_MAGIC 0x52424C43u
#define CB_VERSION_MAJOR 1u
#define CB_HEADER_BYTES 256u
#define CB_ENTRY_BYTES 64u
#define CB_ALIGN 64u
#define CB_ROW_ALIGN 16u
#define CB_CTX_BYTES 256u
#define CB_CRC_FROM 12u
/* integer matmuls: activation blocks, the tiled16 layout's tile */
#define CB_Q8_BLOCK 32u
#define CB_TILE16_ROWS 16u
#define CB_TILE16_COLS 4u
/* the format minor that introduced a feature */
#define CB_MINOR_FEATURES 1u
#define CB_MINOR_INT8_ACTS 2u
#define CB_MINOR_INT4 3u
#define CB_MINOR_ATTN_LANES 4u
#define CB_ATTN_LANES 4u /* scores rows of a prefill block (minor >= 4) */

/* bounds the validator applies before sizing anything (the Python readers apply the same) */
#define CB_MAX_LAYERS 65536u
#define CB_MAX_EXPERTS 65536u
#define CB_MAX_TOP_K 16u
#define CB_MAX_PREFILL_BLOCK 128u
#define CB_DENSE_MAP_LAYERS 256u

/* fixed header: byte offsets (arrays: _COUNT elements) */
#define CB_H_MAGIC 0u /* u32 */
#define CB_H_VERSION_MAJOR 4u /* u16 */
#define CB_H_VERSION_MINOR 6u /* u16 */
#define CB_H_CRC32 8u /* u32 */
#define CB_H_HEADER_BYTES 12u /* u32 */
#define CB_H_BLOB_BYTES 16u /* u64 */
#define CB_H_N_TENSORS 24u /* u32 */
#define CB_H_FLAGS 28u /* u32 */
#define CB_H_LAYOUT 32u /* u32 */
#define CB_H_VOCAB 36u /* u32 */
#define CB_H_HIDDEN 40u /* u32 */
#define CB_H_N_LAYERS 44u /* u32 */
#define CB_H_N_HEADS 48u /* u32 */
#define CB_H_N_KV_HEADS 52u /* u32 */
#define CB_H_HEAD_DIM 56u /* u32 */
#define CB_H_FFN 60u /* u32 */
#define CB_H_N_EXPERTS 64u /* u32 */
#define CB_H_TOP_K 68u /* u32 */
#define CB_H_MAX_SEQ 72u /* u32 */
#define CB_H_RMS_EPS 76u /* f32 */
#define CB_H_ROPE_THETA 80u /* f32 */
#define CB_H_N_BUFFERS 84u /* u32 */
#define CB_H_ARENA_BYTES 88u /* u64 */
#define CB_H_BUFFER_OFFSET 96u /* u64[13] */
#define CB_H_BUFFER_OFFSET_COUNT 13u
#define CB_H_SHARED_FFN 200u /* u32 */
#define CB_H_DENSE_FFN 204u /* u32 */
#define CB_H_ROUTED_SCALE 208u /* f32 */
#define CB_H_PREFILL_BLOCK 212u /* u32 */
#define CB_H_DENSE_MAP 216u /* u8[32] */
#define CB_H_DENSE_MAP_COUNT 32u
#define CB_H_XQ_OFFSET 248u /* u64 */

/* tensor table entry: byte offsets */
#define CB_E_KIND 0u /* u16 */
#define CB_E_LAYER 2u /* u16 */
#define CB_E_EXPERT 4u /* u16 */
#define CB_E_DTYPE 6u /* u8 */
#define CB_E_SCALE_DTYPE 7u /* u8 */
#define CB_E_ROWS 8u /* u32 */
#define CB_E_COLS 12u /* u32 */
#define CB_E_ROW_STRIDE 16u /* u32 */
#define CB_E_GROUP_SIZE 20u /* u32 */
#define CB_E_N_OUTLIERS 24u /* u32 */
#define CB_E_RESERVED 28u /* u32 */
#define CB_E_DATA_OFF 32u /* u64 */
#define CB_E_SCALE_OFF 40u /* u64 */
#define CB_E_OIDX_OFF 48u /* u64 */
#define CB_E_OVAL_OFF 56u /* u64 */

/* flags */
#define CB_FLAG_TIED (1u << 0)
#define CB_FLAG_QKV_BIAS (1u << 1)
#define CB_FLAG_QK_NORM_HEAD (1u << 2)
#define CB_FLAG_QK_NORM_FULL (1u << 3)
#define CB_FLAG_TOPK_NO_NORM (1u << 4)
#define CB_FLAG_SHARED_EXPERT (1u << 5)
#define CB_FLAG_SHARED_GATE (1u << 6)
#define CB_FLAG_DENSE_LAYERS (1u << 7)
#define CB_FLAG_ROUTED_SCALE (1u << 8)
#define CB_FLAG_TOKENIZER (1u << 9)
#define CB_FLAG_PARAMS (1u << 10)
#define CB_FLAG_SLIDING_WINDOW (1u << 11)
#define CB_FLAG_ATTN_SINKS (1u << 12)
#define CB_FLAG_O_BIAS (1u << 13)
#define CB_FLAG_EXPERT_BIAS (1u << 16)
#define CB_FLAG_CLAMPED_SWIGLU (1u << 17)
#define CB_FLAG_KV_F16 (1u << 14)
#define CB_FLAG_KV_INT8 (1u << 15)
#define CB_FLAG_MLA (1u << 20)
#define CB_FLAG_Q_LORA (1u << 21)
#define CB_FLAG_ROUTER_SIGMOID (1u << 22)
#define CB_FLAG_GROUP_TOPK (1u << 23)
#define CB_FLAGS_KNOWN 0xF3FFFFu
#define CB_FLAG_QK_NORM (CB_FLAG_QK_NORM_HEAD | CB_FLAG_QK_NORM_FULL)
#define CB_FLAG_KV (CB_FLAG_KV_F16 | CB_FLAG_KV_INT8)
#define CB_KV_SCALE_BYTES 4u /* the f32 scale of one head's int8 KV row */

/* weight layouts, dtypes */
#define CB_LAYOUT_ROWS 1u
#define CB_LAYOUT_TILED16 2u
#define CB_DTYPE_F32 1u
#define CB_DTYPE_F16 2u
#define CB_DTYPE_INT8 3u
#define CB_DTYPE_INT8C 4u
#define CB_DTYPE_INT4 5u
#define CB_DTYPE_INT4C 6u
#define CB_DTYPE_INT16 8u
#define CB_DTYPE_LAST 8u /* codes above: formats this runtime lacks */
#define CB_BYTES_DTYPE 7u /* U8: raw bytes, the TOKENIZER and PARAMS entries only */
#define CB_INT4_BLOCK_BYTES 16u /* an int4 row: this many bytes a Q8 block */
#define CB_INT16_MAX 8191 /* an int16 value's and activation's largest magnitude */

/* the parameters section (FORMAT.md "Parameters"): records of {u16 key, u16 index, u32 value} */
#define CB_PARAM_RECORD_BYTES 8u
#define CB_PARAM_U32 0u
#define CB_PARAM_F32 1u
#define CB_PARAM_SLIDING_WINDOW 1u /* u32, per layer */
#define CB_PARAM_SWIGLU_ALPHA 2u /* f32, global */
#define CB_PARAM_SWIGLU_LIMIT 3u /* f32, global */
#define CB_PARAM_N_GROUP 32u /* u32, global */
#define CB_PARAM_TOPK_GROUP 33u /* u32, global */
#define CB_PARAM_FLAGS 0x820800u /* flags whose feature reads parameters */
typedef struct cb_param_def {
    uint16_t key;
    uint8_t type, per_layer, required; /* required: its flag needs at least one record of it */
    uint32_t flag;
} cb_param_def;
/* every key this runtime knows, then a key-0 end mark */
#define CB_PARAM_DEFS { {1u, CB_PARAM_U32, 1u, 1u, CB_FLAG_SLIDING_WINDOW}, {2u, CB_PARAM_F32, 0u, 1u, CB_FLAG_CLAMPED_SWIGLU}, {3u, CB_PARAM_F32, 0u, 1u, CB_FLAG_CLAMPED_SWIGLU}, {32u, CB_PARAM_U32, 0u, 1u, CB_FLAG_GROUP_TOPK}, {33u, CB_PARAM_U32, 0u, 1u, CB_FLAG_GROUP_TOPK}, {0u, 0u, 0u, 0u, 0u} }

/* tensor kinds */
enum cb_kind {
    CB_KIND_EMBED = 1,
    CB_KIND_ROPE_FREQ = 2,
    CB_KIND_ATTN_NORM = 3,
    CB_KIND_WQ = 4,
    CB_KIND_WK = 5,
    CB_KIND_WV = 6,
    CB_KIND_WO = 7,
    CB_KIND_FFN_NORM = 8,
    CB_KIND_ROUTER = 9,
    CB_KIND_W_GATE = 10,
    CB_KIND_W_DOWN = 11,
    CB_KIND_W_UP = 12,
    CB_KIND_FINAL_NORM = 13,
    CB_KIND_LM_HEAD = 14,
    CB_KIND_BQ = 15,
    CB_KIND_BK = 16,
    CB_KIND_BV = 17,
    CB_KIND_Q_NORM = 18,
    CB_KIND_K_NORM = 19,
    CB_KIND_SHARED_EXPERT_GATE = 20,
    CB_KIND_SHARED_W_GATE = 21,
    CB_KIND_SHARED_W_DOWN = 22,
    CB_KIND_SHARED_W_UP = 23,
    CB_KIND_MLP_GATE = 24,
    CB_KIND_MLP_DOWN = 25,
    CB_KIND_MLP_UP = 26,
    CB_KIND_Q_A = 40,
    CB_KIND_Q_A_NORM = 41,
    CB_KIND_Q_B = 42,
    CB_KIND_KV_A = 43,
    CB_KIND_KV_A_NORM = 44,
    CB_KIND_KV_B = 45,
    CB_KIND_CHOICE_BIAS = 46,
    CB_KIND_TOKENIZER = 27,
    CB_KIND_PARAMS = 28,
    CB_KIND_SINKS = 29,
    CB_KIND_BO = 30,
    CB_KIND_ROUTER_BIAS = 31,
    CB_KIND_B_GATE = 32,
    CB_KIND_B_DOWN = 33,
    CB_KIND_B_UP = 34,
};

/* table indices of the global tensors before the layers; the layers start at CB_FIRST_LAYER */
#define CB_T_EMBED 0u
#define CB_T_ROPE_FREQ 1u
#define CB_FIRST_LAYER 2u
/* an MLP's matrices from its slot (experts: expert e's from experts + CB_MLP_TENSORS * e) */
#define CB_MLP_GATE 0u
#define CB_MLP_DOWN 1u
#define CB_MLP_UP 2u
#define CB_MLP_TENSORS 3u
#define CB_OFF_Q_A 0u /* in the q_lora slot */
#define CB_OFF_Q_A_NORM 1u /* in the q_lora slot */
#define CB_OFF_Q_B 2u /* in the q_lora slot */
#define CB_OFF_KV_A 0u /* in the mla slot */
#define CB_OFF_KV_A_NORM 1u /* in the mla slot */
#define CB_OFF_KV_B 2u /* in the mla slot */
#define CB_OFF_BQ 0u /* in the qkv_bias slot */
#define CB_OFF_BK 1u /* in the qkv_bias slot */
#define CB_OFF_BV 2u /* in the qkv_bias slot */
#define CB_OFF_Q_NORM 0u /* in the qk_norm slot */
#define CB_OFF_K_NORM 1u /* in the qk_norm slot */

/* A layer's table entries, as indices from the layer's first (ATTN_NORM); CB_NO_SLOT when the flags
 * or the layer's kind (dense MLP or MoE) leave a slot out. */
#define CB_NO_SLOT UINT32_MAX
typedef struct cb_slots {
    uint32_t attn_norm, wq, wk, wv, wo, q_lora, mla, qkv_bias, qk_norm, ffn_norm, mlp, router, choice_bias, experts, shared_gate, shared, o_bias, sinks, router_bias, expert_bias;
    uint32_t n_tensors; /* entries of the layer */
} cb_slots;

/* n_experts <= CB_MAX_EXPERTS (checked first), so n cannot wrap */
static inline cb_slots cb_layer_slots(uint32_t flags, uint32_t n_experts, int dense)
{
    cb_slots s;
    uint32_t n = 0;
    s.attn_norm = n;
    n += 1u;
    s.wq = CB_NO_SLOT;
    if (!(flags & CB_FLAG_Q_LORA)) {
        s.wq = n;
        n += 1u;
    }
    s.wk = CB_NO_SLOT;
    if (!(flags & CB_FLAG_MLA)) {
        s.wk = n;
        n += 1u;
    }
    s.wv = CB_NO_SLOT;
    if (!(flags & CB_FLAG_MLA)) {
        s.wv = n;
        n += 1u;
    }
    s.wo = n;
    n += 1u;
    s.q_lora = CB_NO_SLOT;
    if ((flags & CB_FLAG_Q_LORA)) {
        s.q_lora = n;
        n += 3u;
    }
    s.mla = CB_NO_SLOT;
    if ((flags & CB_FLAG_MLA)) {
        s.mla = n;
        n += 3u;
    }
    s.qkv_bias = CB_NO_SLOT;
    if ((flags & CB_FLAG_QKV_BIAS)) {
        s.qkv_bias = n;
        n += 3u;
    }
    s.qk_norm = CB_NO_SLOT;
    if ((flags & CB_FLAG_QK_NORM)) {
        s.qk_norm = n;
        n += 2u;
    }
    s.ffn_norm = n;
    n += 1u;
    s.mlp = CB_NO_SLOT;
    if (dense) {
        s.mlp = n;
        n += 3u;
    }
    s.router = CB_NO_SLOT;
    if (!dense) {
        s.router = n;
        n += 1u;
    }
    s.choice_bias = CB_NO_SLOT;
    if (!dense && (flags & CB_FLAG_ROUTER_SIGMOID)) {
        s.choice_bias = n;
        n += 1u;
    }
    s.experts = CB_NO_SLOT;
    if (!dense) {
        s.experts = n;
        n += 3u * n_experts;
    }
    s.shared_gate = CB_NO_SLOT;
    if (!dense && (flags & CB_FLAG_SHARED_GATE)) {
        s.shared_gate = n;
        n += 1u;
    }
    s.shared = CB_NO_SLOT;
    if (!dense && (flags & CB_FLAG_SHARED_EXPERT)) {
        s.shared = n;
        n += 3u;
    }
    s.o_bias = CB_NO_SLOT;
    if ((flags & CB_FLAG_O_BIAS)) {
        s.o_bias = n;
        n += 1u;
    }
    s.sinks = CB_NO_SLOT;
    if ((flags & CB_FLAG_ATTN_SINKS)) {
        s.sinks = n;
        n += 1u;
    }
    s.router_bias = CB_NO_SLOT;
    if (!dense && (flags & CB_FLAG_EXPERT_BIAS)) {
        s.router_bias = n;
        n += 1u;
    }
    s.expert_bias = CB_NO_SLOT;
    if (!dense && (flags & CB_FLAG_EXPERT_BIAS)) {
        s.expert_bias = n;
        n += 3u * n_experts;
    }
    s.n_tensors = n;
    return s;
}

/* arena buffers; the table of lifetimes (first, last step) is CB_BUFFER_LIFETIMES */
enum cb_buffer {
    CB_BUF_KEY_CACHE = 0,
    CB_BUF_VALUE_CACHE = 1,
    CB_BUF_X = 2,
    CB_BUF_XB = 3,
    CB_BUF_Q = 4,
    CB_BUF_ATT = 5,
    CB_BUF_SCORES = 6,
    CB_BUF_ROUTER = 7,
    CB_BUF_GATE = 8,
    CB_BUF_UP = 9,
    CB_BUF_MOE = 10,
    CB_BUF_XGATE = 11,
    CB_BUF_XUP = 12,
};
#define CB_N_BUFFERS 13
#define CB_N_BASE_BUFFERS 11 /* without a shared expert or dense layers */
#define CB_BUFFER_LIFETIMES { {0, 11}, {0, 11}, {0, 11}, {0, 11}, {1, 3}, {3, 4}, {3, 3}, {7, 8}, {8, 8}, {8, 8}, {8, 9}, {8, 8}, {8, 8} }
/* each buffer's class of data (colibri_class in colibri.h); xq's is CB_XQ_CLASS, last in _XQ */
#define CB_BUFFER_CLASSES { COLIBRI_CLASS_KV_CACHE, COLIBRI_CLASS_KV_CACHE, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_SCRATCH, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS }
#define CB_XQ_CLASS COLIBRI_CLASS_SCRATCH
#define CB_BUFFER_CLASSES_XQ { COLIBRI_CLASS_KV_CACHE, COLIBRI_CLASS_KV_CACHE, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_SCRATCH, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, COLIBRI_CLASS_ACTIVATIONS, CB_XQ_CLASS }

#endif /* CB_FORMAT_H */
