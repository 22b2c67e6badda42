"""The blob format (model.bin) as data: the one definition the writer, every reader, the C header
runtime_c/src/cb_format.h and the tables of runtime_c/FORMAT.md are made from.

Nothing else in the tree knows a header offset, a kind code, a flag bit or the order of a layer's
tensors: `codegen/blob.py` packs from HEADER, `codegen/blobview.py`, `codegen/inspect.py` and the
size audit (through manifest.json) read with it, `codegen/formatgen.py` writes the C header and the
documentation tables from it (tests/test_format.py fails when either is stale).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

MAGIC = 0x52424C43  # bytes "CLBR"
VERSION_MAJOR = 1
HEADER_BYTES = 256
ENTRY_BYTES = 64
ALIGN = 64  # every payload array, the blob and the arena buffers
ROW_ALIGN = 16  # row stride of a row-major tensor
CTX_BYTES = 256  # the runtime's context at arena offset 0
CRC_FROM = 12  # the CRC-32 covers [CRC_FROM, blob_bytes): everything after the crc32 field

# Integer matmuls (FORMAT.md): activations quantized in blocks of Q8_BLOCK; the tiled16 layout stores
# q8 matrices in tiles of TILE_ROWS rows, TILE_COLS columns of each row together.
Q8_BLOCK = 32
TILE_ROWS = 16
TILE_COLS = 4

# Versions: the minor a blob is written with says which of the later additions it uses.
MINOR_BASE = 0  # no feature flag beyond TIED, no integer matmuls
MINOR_FEATURES = 1  # a feature flag of the MoE families beyond Mixtral
MINOR_INT8_ACTS = 2  # integer matmuls (an xq buffer, maybe the tiled layout)
MINOR_INT4 = 3  # int4 / int4c tensors (dtypes I4, I4C; always with integer matmuls)
MINOR_ATTN_LANES = 4  # a prefill block's scores buffer holds attn_lanes(block) rows, not one

# Rows of the scores buffer of a blob of minor >= MINOR_ATTN_LANES with a prefill block of B tokens:
# min(B, ATTN_LANES), one for each token whose attention runs at the same time as others'.
ATTN_LANES = 4

_TYPES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "f32": "f"}


@dataclass(frozen=True)
class Field:
    """One fixed-position field: `count` > 1 is an array (`u64[13]`)."""

    name: str
    offset: int
    type: str
    doc: str
    since: int = 0  # format minor that added it
    count: int = 1

    @property
    def fmt(self) -> str:
        return f"<{self.count}{_TYPES[self.type]}" if self.count > 1 else "<" + _TYPES[self.type]

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt)

    @property
    def type_name(self) -> str:
        return f"{self.type}[{self.count}]" if self.count > 1 else self.type


# Bounds on header fields that size anything: the C validator refuses a blob outside them
# (COLIBRI_E_BAD_HEADER) and every Python reader checks them before allocating anything in proportion.
MAX_LAYERS = 1 << 16  # the table entry's layer field is a u16
MAX_EXPERTS = 1 << 16  # the table entry's expert field is a u16
MAX_TOP_K = 16
MAX_PREFILL_BLOCK = 128
DENSE_MAP_LAYERS = 256  # layers the dense_map can mark; later layers are MoE
N_BUFFER_SLOTS = 13  # buffer_offset entries in the header
# the header fields a reader builds lists in proportion to, and their bounds
SIZE_BOUNDS = (("n_layers", MAX_LAYERS), ("n_experts", MAX_EXPERTS))

HEADER: tuple[Field, ...] = (
    Field("magic", 0, "u32", "`0x52424C43` (bytes `C L B R`)"),
    Field("version_major", 4, "u16", "1; a different major is refused"),
    Field("version_minor", 6, "u16", "0; 1 when any flag other than TIED is set; 2 with integer matmuls "
                                      "(xq_offset ≠ 0); 3 with I4/I4C tensors; 4 with a prefill block > 1 (the "
                                      "scores buffer holds min(B, ATTN_LANES) rows); a newer minor is accepted "
                                      "(a dtype the runtime lacks is refused: `COLIBRI_E_DTYPE`)"),
    Field("crc32", 8, "u32", "CRC-32 (IEEE 802.3, as zlib.crc32) of bytes `[12, blob_bytes)`"),
    Field("header_bytes", 12, "u32", "256 + 64·n_tensors rounded up to 64"),
    Field("blob_bytes", 16, "u64", "total length; must equal the length passed in"),
    Field("n_tensors", 24, "u32", "must equal the count the dims imply"),
    Field("flags", 28, "u32", "see \"Feature flags\""),
    Field("layout", 32, "u32", "1 = row-major, each row padded to a 16-byte stride; 2 = q8 matrices in 16-row "
                                "tiles (see \"Integer matmuls\"), the rest row-major. Any other value: "
                                "`COLIBRI_E_LAYOUT`"),
    Field("vocab", 36, "u32", ""),
    Field("hidden", 40, "u32", ""),
    Field("n_layers", 44, "u32", f"≤ {MAX_LAYERS}"),
    Field("n_heads", 48, "u32", ""),
    Field("n_kv_heads", 52, "u32", "divides n_heads"),
    Field("head_dim", 56, "u32", "even"),
    Field("ffn", 60, "u32", "expert intermediate size"),
    Field("n_experts", 64, "u32", f"≤ {MAX_EXPERTS}"),
    Field("top_k", 68, "u32", f"1 ≤ top_k ≤ n_experts, ≤ {MAX_TOP_K}"),
    Field("max_seq", 72, "u32", "KV cache positions"),
    Field("rms_eps", 76, "f32", "finite, ≥ 0"),
    Field("rope_theta", 80, "f32", "informational; the runtime uses the ROPE_FREQ tensor"),
    Field("n_buffers", 84, "u32", "number of arena buffers: 11, or 13 with a shared expert or dense layers"),
    Field("arena_bytes", 88, "u64", "total arena the plan needs"),
    Field("buffer_offset", 96, "u64", "byte offset of each arena buffer (see \"Arena\"); entries from n_buffers "
                                      "on are zero", count=N_BUFFER_SLOTS),
    Field("shared_ffn", 200, "u32", "shared expert intermediate size; nonzero exactly when SHARED_EXPERT", since=1),
    Field("dense_ffn", 204, "u32", "dense MLP intermediate size; nonzero exactly when DENSE_LAYERS", since=1),
    Field("routed_scale", 208, "f32", "finite, > 0 when ROUTED_SCALE; else zero (meaning 1)", since=1),
    Field("prefill_block", 212, "u32",
          f"tokens per prefill block of the arena plan, 0–{MAX_PREFILL_BLOCK} (a microcontroller build of the "
          "runtime takes 0–32); 0 (every blob written before it) means 1. Written whenever it is not 1, in 1.0 "
          "blobs too: a runtime that predates the field refuses such a blob (nonzero reserved word) rather than "
          "running it with buffers it sizes wrongly"),
    Field("dense_map", 216, "u8", f"bit `L % 8` of byte `L / 8` set when layer L is a dense MLP; only with "
                                  f"DENSE_LAYERS (at least one bit), only below n_layers, layers ≥ "
                                  f"{DENSE_MAP_LAYERS} are MoE", since=1, count=DENSE_MAP_LAYERS // 8),
    Field("xq_offset", 248, "u64", "arena offset of the xq buffer (see \"Integer matmuls\"); 0 without integer "
                                   "matmuls", since=2),
)
H = {f.name: f for f in HEADER}

ENTRY: tuple[Field, ...] = (
    Field("kind", 0, "u16", "see \"Kinds\""),
    Field("layer", 2, "u16", "0 for global tensors"),
    Field("expert", 4, "u16", "0 for non-expert tensors"),
    Field("dtype", 6, "u8", "1 = F32, 2 = F16, 3 = I8, 4 = I8C, 5 = I4, 6 = I4C (see \"int4\"); 7 = U8 (raw bytes: "
                            "the TOKENIZER and PARAMS entries only, whose rows are its bytes, cols 1, row_stride 1); "
                            "8 = I16 (see \"int16\"); "
                            "a code above the runtime's last: `COLIBRI_E_DTYPE`"),
    Field("scale_dtype", 7, "u8", "0 none, 1 = F32, 2 = F16 (I8 / I8C / I4 / I4C only); I16: F32"),
    Field("rows", 8, "u32", "outputs"),
    Field("cols", 12, "u32", "inputs"),
    Field("row_stride", 16, "u32", "bytes from one row to the next, ≥ cols·elem (I4/I4C: ≥ 16·ceil(cols/32)), "
                                   "multiple of 16"),
    Field("group_size", 20, "u32", "inputs per scale (divides into ceil(cols/group_size) groups; = cols for "
                                   "per-row; I4/I4C: 32; I16: cols)"),
    Field("n_outliers", 24, "u32", "I8C and I4C only, else 0"),
    Field("reserved", 28, "u32", "0"),
    Field("data_off", 32, "u64", "rows·row_stride bytes of weights (padding bytes are zero); tiled: padded "
                                 "rows·cols"),
    Field("scale_off", 40, "u64", "rows·n_groups scales of scale_dtype, row-major (0 if none); tiled: padded "
                                  "rows·n_groups, tiled"),
    Field("oidx_off", 48, "u64", "n_outliers u16 gaps between flat indices `row*cols + col` (0 if none)"),
    Field("oval_off", 56, "u64", "n_outliers F16 corrections (0 if none)"),
)
E = {f.name: f for f in ENTRY}
ENTRY_STRUCT = struct.Struct("<" + "".join(_TYPES[f.type] * f.count for f in ENTRY))
ENTRY_NAMES = tuple(f.name for f in ENTRY)


@dataclass(frozen=True)
class Flag:
    name: str
    bit: int
    doc: str
    since: int = 1
    runtime: bool = True  # the C runtime runs it; a flag it does not is refused as unknown (COLIBRI_E_BAD_HEADER)

    @property
    def mask(self) -> int:
        return 1 << self.bit


FLAGS: tuple[Flag, ...] = (
    Flag("TIED", 0, "lm_head tied to embed (no LM_HEAD entry)", since=0),
    Flag("QKV_BIAS", 1, "q, k, v projections add BQ, BK, BV (Qwen2-MoE `qkv_bias`)"),
    Flag("QK_NORM_HEAD", 2, "RMSNorm (eps rms_eps) of each q and k head with Q_NORM / K_NORM of head_dim, before "
                            "rotary (Qwen3-MoE)"),
    Flag("QK_NORM_FULL", 3, "RMSNorm of the whole q (n_heads·head_dim) and k (n_kv_heads·head_dim) vectors, before "
                            "rotary (OLMoE); excludes QK_NORM_HEAD"),
    Flag("TOPK_NO_NORM", 4, "routing weights are the softmax probabilities of the top_k experts, not renormalised "
                            "(HF `norm_topk_prob` false)"),
    Flag("SHARED_EXPERT", 5, "every MoE layer also runs a SiLU-gated MLP of shared_ffn (SHARED_W_GATE, "
                             "SHARED_W_DOWN, SHARED_W_UP) on the same input and adds it after the routed experts "
                             "(Qwen2-MoE shared_expert, DeepSeek shared_experts)"),
    Flag("SHARED_GATE", 6, "the shared expert's output is scaled by sigmoid(SHARED_EXPERT_GATE · x) (Qwen2-MoE); "
                           "needs SHARED_EXPERT"),
    Flag("DENSE_LAYERS", 7, "layers marked in dense_map have a SiLU-gated MLP of dense_ffn (MLP_GATE, MLP_DOWN, "
                            "MLP_UP) instead of router and experts"),
    Flag("ROUTED_SCALE", 8, "every routing weight (after the optional renormalisation) is multiplied by "
                            "routed_scale (DeepSeek `routed_scaling_factor`)"),
    # The KV cache's precision (see "KV cache"); neither bit: f32. A runtime that predates them refuses
    # such a blob with COLIBRI_E_BAD_HEADER (an unknown flag), never misreads its cache.
    # The tokenizer section (FORMAT.md "Tokenizer"): a runtime that predates the flag refuses the blob
    # (COLIBRI_E_BAD_HEADER, an unknown flag) rather than miscounting its table.
    Flag("TOKENIZER", 9, "the table ends with a TOKENIZER entry: the model's tokenizer section, after the weights"),
    # The parameters section (FORMAT.md "Parameters"): scalar model parameters the 256-byte header has no
    # room for. Each flag of a feature with parameters (Param.flag) needs PARAMS and its required keys.
    Flag("PARAMS", 10, "the table has a PARAMS entry (before TOKENIZER): the model's parameters section"),
    Flag("SLIDING_WINDOW", 11, "sliding-window attention: a layer with a nonzero SLIDING_WINDOW parameter W "
                               "attends at position p to the keys of positions > p − W only; its KV cache is a "
                               "ring of kv_layer_rows positions (see \"KV cache\")"),
    Flag("ATTN_SINKS", 12, "each layer's SINKS (a learned logit per query head) joins the softmax of the "
                           "attention scores as one more position with no value (gpt-oss); the scores buffer "
                           "holds max_seq + 1"),
    Flag("O_BIAS", 13, "the output projection adds BO (gpt-oss `attention_bias`, with QKV_BIAS)"),
    Flag("EXPERT_BIAS", 16, "the router adds ROUTER_BIAS to its logits, and every expert's gate, up and down "
                            "projections add B_GATE, B_UP, B_DOWN (gpt-oss)"),
    Flag("CLAMPED_SWIGLU", 17, "the experts' activation is gpt-oss's clamped SwiGLU: g = min(gate, L), "
                               "u = clamp(up, −L, L), (u + 1)·g·sigmoid(A·g), A and L the SWIGLU_ALPHA and "
                               "SWIGLU_LIMIT parameters (a NaN stays NaN)"),
    Flag("KV_F16", 14, "the key and value caches hold f16 (each K/V element rounded to nearest even); "
                       "excludes KV_INT8"),
    Flag("KV_INT8", 15, "the key and value caches hold int8 per head per position with an f32 scale "
                        "(see \"KV cache\"); excludes KV_F16"),
    # DeepSeek-V2/V3 (bits 20-27; FORMAT.md "MLA").
    Flag("MLA", 20, "multi-head latent attention (DeepSeek-V2/V3, see \"MLA\"): KV_A, KV_A_NORM, KV_B (F32) "
                    "instead of WK, WV; head_dim is the rope part of a head; n_kv_heads = n_heads; the caches hold "
                    "the latents and the rope keys; excludes QKV_BIAS, QK_NORM_*, KV_F16, KV_INT8"),
    Flag("Q_LORA", 21, "MLA queries through a low-rank latent: Q_A, Q_A_NORM, Q_B instead of WQ; needs MLA"),
    Flag("ROUTER_SIGMOID", 22, "router scores are sigmoid(logits); experts are chosen by score + CHOICE_BIAS, "
                               "weighted by the score (DeepSeek-V3)"),
    Flag("GROUP_TOPK", 23, "group-limited top-k: the experts in n_group equal groups, top_k chosen within the "
                           "topk_group best groups, a group scored by its best expert (by the sum of its best "
                           "two with ROUTER_SIGMOID); the N_GROUP and TOPK_GROUP parameters"),
)
FLAG = {f.name: f.mask for f in FLAGS}
FLAGS_KNOWN = sum(f.mask for f in FLAGS if f.runtime)  # what the C runtime accepts


def flags_not_run(flags: int) -> list[str]:
    """The names of the flags among `flags` that the C runtime does not run (it refuses such a blob)."""
    return [f.name for f in FLAGS if flags & f.mask and not f.runtime]

QK_NORM_FLAGS = FLAG["QK_NORM_HEAD"] | FLAG["QK_NORM_FULL"]

# KV cache precision: the `--kv` / `KV=` names, the header flag each sets (f32: none).
KV_DTYPES = ("f32", "f16", "int8")
KV_FLAG = {"f32": 0, "f16": FLAG["KV_F16"], "int8": FLAG["KV_INT8"]}
KV_FLAGS = FLAG["KV_F16"] | FLAG["KV_INT8"]
KV_SCALE_BYTES = 4  # the f32 scale of one head's int8 row


def kv_layer_rows(window: int, max_seq: int, block: int) -> int:
    """Positions one layer's KV cache holds: max_seq, or for a layer of window W (nonzero) whose
    W + block − 1 is less, that ring of W + block − 1 rows (position p in row p mod rows: a prefill block
    writes its block rows before its first query has read the W it sees)."""
    return window + block - 1 if window and window + block - 1 < max_seq else max_seq


def kv_dtype_of(flags: int) -> str:
    """The KV cache precision a header's flags say (KeyError for both bits)."""
    return {v: k for k, v in KV_FLAG.items()}[flags & KV_FLAGS]


def kv_row_bytes(kv: str, n_kv_heads: int, head_dim: int) -> int:
    """Bytes of one position's keys (or values) in one layer's cache: n_kv_heads·head_dim elements of f32
    or f16; for int8 the n_kv_heads·head_dim int8 values padded to 4 bytes, then one f32 scale per head."""
    n = n_kv_heads * head_dim
    if kv == "int8":
        return -(-n // 4) * 4 + KV_SCALE_BYTES * n_kv_heads
    return n * ELEM_BYTES[kv]

@dataclass(frozen=True)
class Param:
    """A key of the parameters section (FORMAT.md "Parameters"): its code, the type of its u32 value
    (`u32`, or `f32` as its IEEE bits), whether it has one record per layer (index = the layer) or one
    global record (index 0), the flag it belongs to (the key is refused without it), whether that flag
    needs at least one record of it, and what it means."""

    name: str
    code: int
    type: str  # "u32" or "f32"
    per_layer: bool
    flag: str
    doc: str
    required: bool = True
    since: int = 1


PARAM_RECORD = struct.Struct("<HHI")  # key, index, value
PARAM_TYPES = ("u32", "f32")
# Keys reserved per feature group: 1-31 sliding window, YaRN, gpt-oss; 32-63 DeepSeek MLA. Key 0 is none.
PARAMS: tuple[Param, ...] = (
    Param("SLIDING_WINDOW", 1, "u32", True, "SLIDING_WINDOW",
          "attention window of the layer in positions (HF `sliding_window`); 0 or no record: full attention"),
    Param("SWIGLU_ALPHA", 2, "f32", False, "CLAMPED_SWIGLU", "the clamped SwiGLU's sigmoid gain A (HF `swiglu_alpha`)"),
    Param("SWIGLU_LIMIT", 3, "f32", False, "CLAMPED_SWIGLU", "the clamped SwiGLU's clamp L (HF `swiglu_limit`)"),
    Param("N_GROUP", 32, "u32", False, "GROUP_TOPK",
          "the experts' equal groups (HF `n_group`): divides n_experts"),
    Param("TOPK_GROUP", 33, "u32", False, "GROUP_TOPK",
          "the groups the top_k are chosen within (HF `topk_group`): 1 <= TOPK_GROUP <= N_GROUP, "
          "top_k <= TOPK_GROUP·n_experts/N_GROUP"),
)
PARAM = {p.name: p for p in PARAMS}
PARAM_BY_CODE = {p.code: p for p in PARAMS}
PARAM_FLAGS = sum({FLAG[p.flag] for p in PARAMS})  # flags whose feature reads parameters


def pack_params(values: Mapping[tuple[str, int], float | int]) -> bytes:
    """The parameters section: {(key name, index): value} as records sorted by (key, index)."""
    recs = []
    for (name, index), value in values.items():
        p = PARAM[name]
        bits = struct.unpack("<I", struct.pack("<f", value))[0] if p.type == "f32" else int(value)
        recs.append((p.code, index, bits))
    return b"".join(PARAM_RECORD.pack(*r) for r in sorted(recs))


def read_params(data: bytes, n_layers: int, flags: int) -> list[tuple[Param, int, float | int]]:
    """The records of a parameters section as (key, index, value), checked as the runtime checks them;
    ValueError naming the first problem."""
    if not data or len(data) % PARAM_RECORD.size:
        raise ValueError(f"parameters section of {len(data)} bytes, not a positive multiple of {PARAM_RECORD.size}")
    out: list[tuple[Param, int, float | int]] = []
    recs = list(PARAM_RECORD.iter_unpack(data))
    for a, b in zip(recs, recs[1:], strict=False):  # the structure first, as the runtime checks it
        if b[:2] <= a[:2]:
            raise ValueError(f"parameter record {b[:2]} not after {a[:2]}: unsorted or repeated")
    for key, index, bits in recs:
        p = PARAM_BY_CODE.get(key)
        if p is None:
            raise ValueError(f"parameter key {key} is unknown to this version")
        if (index >= n_layers) if p.per_layer else index != 0:
            raise ValueError(f"parameter {p.name}: index {index} out of range")
        if not flags & FLAG[p.flag]:
            raise ValueError(f"parameter {p.name} without its flag {p.flag}")
        value: float | int = bits
        if p.type == "f32":
            value = struct.unpack("<f", struct.pack("<I", bits))[0]
            if value != value or abs(value) == float("inf"):
                raise ValueError(f"parameter {p.name}: value {value} is not finite")
        out.append((p, index, value))
    present = {p.name for p, _, _ in out}
    for p in PARAMS:
        if p.required and flags & FLAG[p.flag] and p.name not in present:
            raise ValueError(f"flag {p.flag} without its parameter {p.name}")
    return out


DTYPES = {"f32": 1, "f16": 2, "int8": 3, "int8c": 4, "int4": 5, "int4c": 6, "int16": 8}  # 7: BYTES_DTYPE
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ELEM_BYTES = {"f32": 4, "f16": 2, "int8": 1, "int8c": 1, "int16": 2}  # int4: see int4_row_bytes
INT4_DTYPES = ("int4", "int4c")  # two values a byte, one scale a Q8_BLOCK, integer matmuls only
INT4_BLOCK_BYTES = Q8_BLOCK // 2
# I16 (FORMAT.md "int16"): 14-bit values and activations, so a block's integer dot fits int32 on every ISA
INT16_MAX = 8191
assert Q8_BLOCK * INT16_MAX**2 < 2**31


def int4_row_bytes(cols: int) -> int:
    """Bytes of one packed int4 row: INT4_BLOCK_BYTES a block (a multiple of ROW_ALIGN)."""
    return -(-cols // Q8_BLOCK) * INT4_BLOCK_BYTES
SCALE_DTYPES = {"f32": 1, "f16": 2}
# Raw bytes (a section, not weights): the dtype of the TOKENIZER and PARAMS entries only; no kernel reads it.
BYTES_DTYPE = 7
LAYOUTS = {"rows": 1, "tiled16": 2}
LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}


@dataclass(frozen=True)
class Kind:
    """A tensor kind: its code, the canonical name it has (`{L}` the layer, `{E}` the expert), its shape
    and the dtypes the runtime accepts, and what the size audit calls its bytes."""

    name: str
    code: int
    canonical: str
    shape: str
    dtypes: str  # "any", "f32", "f32 f16"
    group: str  # size-audit class: embedding, rope, norms, attention, router, experts, shared_expert, dense_mlp
    since: int = 0
    derived: bool = False  # computed by the exporter, not read from the checkpoint


KINDS: tuple[Kind, ...] = (
    Kind("EMBED", 1, "embed", "vocab × hidden", "any", "embedding"),
    Kind("ROPE_FREQ", 2, "rope_freq", "1 × head_dim/2", "f32", "rope", derived=True),
    Kind("ATTN_NORM", 3, "layers.{L}.attn_norm", "1 × hidden", "f32", "norms"),
    Kind("WQ", 4, "layers.{L}.attn.q", "n_heads·head_dim × hidden", "any", "attention"),
    Kind("WK", 5, "layers.{L}.attn.k", "n_kv_heads·head_dim × hidden", "any", "attention"),
    Kind("WV", 6, "layers.{L}.attn.v", "n_kv_heads·head_dim × hidden", "any", "attention"),
    Kind("WO", 7, "layers.{L}.attn.o", "hidden × n_heads·head_dim", "any", "attention"),
    Kind("FFN_NORM", 8, "layers.{L}.ffn_norm", "1 × hidden", "f32", "norms"),
    Kind("ROUTER", 9, "layers.{L}.moe.router", "n_experts × hidden", "f32 f16", "router"),
    Kind("W_GATE", 10, "layers.{L}.moe.experts.{E}.gate", "ffn × hidden", "any", "experts"),
    Kind("W_DOWN", 11, "layers.{L}.moe.experts.{E}.down", "hidden × ffn", "any", "experts"),
    Kind("W_UP", 12, "layers.{L}.moe.experts.{E}.up", "ffn × hidden", "any", "experts"),
    Kind("FINAL_NORM", 13, "final_norm", "1 × hidden", "f32", "norms"),
    Kind("LM_HEAD", 14, "lm_head", "vocab × hidden", "any", "lm_head"),
    Kind("BQ", 15, "layers.{L}.attn.q_bias", "1 × n_heads·head_dim", "f32", "attention", since=1),
    Kind("BK", 16, "layers.{L}.attn.k_bias", "1 × n_kv_heads·head_dim", "f32", "attention", since=1),
    Kind("BV", 17, "layers.{L}.attn.v_bias", "1 × n_kv_heads·head_dim", "f32", "attention", since=1),
    Kind("Q_NORM", 18, "layers.{L}.attn.q_norm",
         "1 × head_dim (QK_NORM_HEAD) or 1 × n_heads·head_dim (QK_NORM_FULL)", "f32", "norms", since=1),
    Kind("K_NORM", 19, "layers.{L}.attn.k_norm",
         "1 × head_dim (QK_NORM_HEAD) or 1 × n_kv_heads·head_dim (QK_NORM_FULL)", "f32", "norms", since=1),
    Kind("SHARED_EXPERT_GATE", 20, "layers.{L}.moe.shared_gate", "1 × hidden", "f32", "shared_expert", since=1),
    Kind("SHARED_W_GATE", 21, "layers.{L}.moe.shared.gate", "shared_ffn × hidden", "any", "shared_expert", since=1),
    Kind("SHARED_W_DOWN", 22, "layers.{L}.moe.shared.down", "hidden × shared_ffn", "any", "shared_expert", since=1),
    Kind("SHARED_W_UP", 23, "layers.{L}.moe.shared.up", "shared_ffn × hidden", "any", "shared_expert", since=1),
    Kind("MLP_GATE", 24, "layers.{L}.mlp.gate", "dense_ffn × hidden", "any", "dense_mlp", since=1),
    Kind("MLP_DOWN", 25, "layers.{L}.mlp.down", "hidden × dense_ffn", "any", "dense_mlp", since=1),
    Kind("MLP_UP", 26, "layers.{L}.mlp.up", "dense_ffn × hidden", "any", "dense_mlp", since=1),
    Kind("Q_A", 40, "layers.{L}.attn.q_a", "q_lora_rank × hidden", "any", "attention", since=1),
    Kind("Q_A_NORM", 41, "layers.{L}.attn.q_a_norm", "1 × q_lora_rank", "f32", "norms", since=1),
    Kind("Q_B", 42, "layers.{L}.attn.q_b", "n_heads·(qk_nope_head_dim + head_dim) × q_lora_rank", "any",
         "attention", since=1),
    Kind("KV_A", 43, "layers.{L}.attn.kv_a", "(kv_lora_rank + head_dim) × hidden", "any", "attention", since=1),
    Kind("KV_A_NORM", 44, "layers.{L}.attn.kv_a_norm", "1 × kv_lora_rank", "f32", "norms", since=1),
    Kind("KV_B", 45, "layers.{L}.attn.kv_b", "n_heads·(qk_nope_head_dim + v_head_dim) × kv_lora_rank", "f32",
         "attention", since=1),
    Kind("CHOICE_BIAS", 46, "layers.{L}.moe.choice_bias", "1 × n_experts", "f32", "router", since=1),
    Kind("TOKENIZER", 27, "tokenizer", "section bytes × 1", "U8", "tokenizer", since=1, derived=True),
    Kind("PARAMS", 28, "params", "section bytes × 1", "U8", "params", since=1, derived=True),
    Kind("SINKS", 29, "layers.{L}.attn.sinks", "1 × n_heads", "f32", "attention", since=1),
    Kind("BO", 30, "layers.{L}.attn.o_bias", "1 × hidden", "f32", "attention", since=1),
    Kind("ROUTER_BIAS", 31, "layers.{L}.moe.router_bias", "1 × n_experts", "f32", "router", since=1),
    Kind("B_GATE", 32, "layers.{L}.moe.experts.{E}.gate_bias", "1 × ffn", "f32", "experts", since=1),
    Kind("B_DOWN", 33, "layers.{L}.moe.experts.{E}.down_bias", "1 × hidden", "f32", "experts", since=1),
    Kind("B_UP", 34, "layers.{L}.moe.experts.{E}.up_bias", "1 × ffn", "f32", "experts", since=1),
)
KIND = {k.name: k for k in KINDS}
KIND_BY_CODE = {k.code: k for k in KINDS}


@dataclass(frozen=True)
class Slot:
    """A run of a layer's table entries: `kinds` in order, present when `when` holds (a flag name, "moe"
    or "dense"), repeated once per expert when `per_expert`. `name` is its field in C's cb_layer_slots."""

    name: str
    kinds: tuple[str, ...]
    when: tuple[str, ...] = ()  # all must hold; a flag name, "QK_NORM" (either q/k norm flag), "moe", "dense"
    per_expert: bool = False


# The table: EMBED, ROPE_FREQ, then each layer's slots in this order, then FINAL_NORM and LM_HEAD (unless TIED).
GLOBAL_HEAD = ("EMBED", "ROPE_FREQ")
LAYER_SLOTS: tuple[Slot, ...] = (
    Slot("attn_norm", ("ATTN_NORM",)),
    Slot("wq", ("WQ",), ("!Q_LORA",)),
    Slot("wk", ("WK",), ("!MLA",)),
    Slot("wv", ("WV",), ("!MLA",)),
    Slot("wo", ("WO",)),
    Slot("q_lora", ("Q_A", "Q_A_NORM", "Q_B"), ("Q_LORA",)),
    Slot("mla", ("KV_A", "KV_A_NORM", "KV_B"), ("MLA",)),
    Slot("qkv_bias", ("BQ", "BK", "BV"), ("QKV_BIAS",)),
    Slot("qk_norm", ("Q_NORM", "K_NORM"), ("QK_NORM",)),
    Slot("ffn_norm", ("FFN_NORM",)),
    Slot("mlp", ("MLP_GATE", "MLP_DOWN", "MLP_UP"), ("dense",)),
    Slot("router", ("ROUTER",), ("moe",)),
    Slot("choice_bias", ("CHOICE_BIAS",), ("moe", "ROUTER_SIGMOID")),
    Slot("experts", ("W_GATE", "W_DOWN", "W_UP"), ("moe",), per_expert=True),
    Slot("shared_gate", ("SHARED_EXPERT_GATE",), ("moe", "SHARED_GATE")),
    Slot("shared", ("SHARED_W_GATE", "SHARED_W_DOWN", "SHARED_W_UP"), ("moe", "SHARED_EXPERT")),
    Slot("o_bias", ("BO",), ("O_BIAS",)),
    Slot("sinks", ("SINKS",), ("ATTN_SINKS",)),
    Slot("router_bias", ("ROUTER_BIAS",), ("moe", "EXPERT_BIAS")),
    Slot("expert_bias", ("B_GATE", "B_DOWN", "B_UP"), ("moe", "EXPERT_BIAS"), per_expert=True),
)
GLOBAL_TAIL = (("FINAL_NORM", ()), ("LM_HEAD", ("untied",)), ("PARAMS", ("PARAMS",)), ("TOKENIZER", ("TOKENIZER",)))
SECTION_KINDS = ("PARAMS", "TOKENIZER")  # U8 entries of raw bytes, not weights
MLP_TENSORS = 3  # gate, down, up: the offsets of an MLP's three matrices in every MLP slot


def _holds(cond: str, flags: int, dense: bool) -> bool:
    if cond.startswith("!"):
        return not _holds(cond[1:], flags, dense)
    if cond == "moe":
        return not dense
    if cond == "dense":
        return dense
    if cond == "QK_NORM":
        return bool(flags & QK_NORM_FLAGS)
    if cond == "untied":
        return not flags & FLAG["TIED"]
    return bool(flags & FLAG[cond])


def layer_slots(flags: int, dense: bool) -> list[Slot]:
    """The slots one layer has, in table order."""
    return [s for s in LAYER_SLOTS if all(_holds(c, flags, dense) for c in s.when)]


def layer_tensors(flags: int, n_experts: int, dense: bool) -> int:
    """Table entries of one layer."""
    return sum(len(s.kinds) * (n_experts if s.per_expert else 1) for s in layer_slots(flags, dense))


def n_tensors(flags: int, n_layers: int, n_experts: int, n_dense: int) -> int:
    """Table entries of a whole model (arithmetic only: safe for any header values)."""
    tail = sum(all(_holds(c, flags, False) for c in when) for _, when in GLOBAL_TAIL)
    return (len(GLOBAL_HEAD) + tail + n_dense * layer_tensors(flags, n_experts, True)
            + (n_layers - n_dense) * layer_tensors(flags, n_experts, False))


def tensor_order(flags: int, n_layers: int, n_experts: int, dense_layers: frozenset[int] | tuple[int, ...] = ()
                 ) -> Iterator[tuple[Kind, int, int]]:
    """(kind, layer, expert) of every table entry, in table order."""
    dense = frozenset(dense_layers)
    for k in GLOBAL_HEAD:
        yield KIND[k], 0, 0
    for layer in range(n_layers):
        for s in layer_slots(flags, layer in dense):
            for e in range(n_experts) if s.per_expert else (0,):
                for k in s.kinds:
                    yield KIND[k], layer, e
    for k, when in GLOBAL_TAIL:
        if all(_holds(c, flags, False) for c in when):
            yield KIND[k], 0, 0


def canonical_name(kind: Kind, layer: int, expert: int) -> str:
    return kind.canonical.format(L=layer, E=expert)


_CANON: dict[tuple[str, ...], Kind] = {}
for _k in KINDS:
    _CANON[tuple(_k.canonical.split("."))] = _k


def kind_of(name: str) -> tuple[Kind, int, int]:
    """(kind, layer, expert) of a canonical tensor name; KeyError for an unknown one."""
    parts = name.split(".")
    layer = expert = 0
    pattern = list(parts)
    if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit():
        layer, pattern[1] = int(parts[1]), "{L}"
        if parts[2:4] == ["moe", "experts"] and len(parts) > 4 and parts[4].isdigit():
            expert, pattern[4] = int(parts[4]), "{E}"
    kind = _CANON.get(tuple(pattern))
    if kind is None:
        raise KeyError(f"{name}: not a canonical tensor name")
    return kind, layer, expert


# Forward steps of one layer, numbered for the buffer lifetimes.
STEPS = ("attn norm", "q/k/v projections", "rotary", "attention", "output projection (accumulated into x)",
         "(reserved)", "ffn norm", "router", "experts (down projections accumulated into moe)", "moe added to x",
         "final norm", "lm_head")


@dataclass(frozen=True)
class Buffer:
    name: str
    first: int  # first and last step the buffer is live
    last: int
    elements: str  # f32 elements, for the documentation (codegen/plan.py computes them)
    doc: str
    extra: bool = False  # only with SHARED_EXPERT or DENSE_LAYERS
    cls: str = "activations"  # its class of data (CLASSES): the memory region it may be placed in


# Classes of arena data, in the order of the runtime's colibri_class (colibri.h): the KV cache, the
# activations of a block of tokens (with the context at offset 0), and the scratch of one step (attention
# scores, int8 activations). Each class is one contiguous range of the arena, in ARENA_ORDER, so that
# colibri_init_regions can put each in a memory of its own.
CLASSES = ("kv_cache", "activations", "scratch")
ARENA_ORDER = ("activations", "kv_cache", "scratch")

BUFFERS: tuple[Buffer, ...] = (
    Buffer("key_cache", 0, 11, "Σ rows_l (n_layers·max_seq without sliding windows) rows of kv_row_bytes; "
           "MLA: n_layers·max_seq rows of kv_lora_rank f32", "key cache, in the KV cache precision (see \"KV cache\"); "
           "MLA: the latents", cls="kv_cache"),
    Buffer("value_cache", 0, 11, "same; MLA: rows of head_dim f32", "value cache; MLA: the rope keys", cls="kv_cache"),
    Buffer("x", 0, 11, "B·hidden", "x (residual stream)"),
    Buffer("xb", 0, 11, "B·hidden", "xb (normed input)"),
    Buffer("q", 1, 3, "B·n_heads·head_dim; with KV_F16 or KV_INT8 B·(n_heads + 2·n_kv_heads)·head_dim; MLA "
           "B·n_heads·(qk_nope_head_dim + head_dim + kv_lora_rank)",
           "q (then, with a 16- or 8-bit KV cache, the block's new k rows and v rows in f32; MLA: each head's "
           "query in latent space after the queries)"),
    Buffer("att", 3, 4, "B·n_heads·head_dim; MLA B·max(n_heads·(v_head_dim + kv_lora_rank), q_lora_rank, "
           "kv_lora_rank + head_dim)", "att (attention output; MLA: then each head's weighted latent, and "
           "in step 1 the q latent and kv_a's output)"),
    Buffer("scores", 3, 3, "min(B, ATTN_LANES)·(max_seq (+ 1 with ATTN_SINKS)); before minor 4, one row",
           "scores (a row for each token whose attention runs beside others')", cls="scratch"),
    Buffer("router", 7, 8, "B·n_experts", "router logits (then the routing weights)"),
    Buffer("gate", 8, 8, "B·ffn", "gate"),
    Buffer("up", 8, 8, "B·ffn", "up"),
    Buffer("moe", 8, 9, "B·hidden", "moe (weighted expert sum)"),
    Buffer("xgate", 8, 8, "B·max(shared_ffn, dense_ffn)", "xgate (shared expert / dense MLP gate)", extra=True),
    Buffer("xup", 8, 8, "B·max(shared_ffn, dense_ffn)", "xup (shared expert / dense MLP up)", extra=True),
)
N_BASE_BUFFERS = sum(not b.extra for b in BUFFERS)
# The int8 activations of the integer matmuls: live through every step; its offset has its own header
# field (xq_offset), so it is not one of the table's buffers.
XQ_BUFFER = Buffer("xq", 0, 11, "B rows of the xq row bytes", "xq (int8 activations)", cls="scratch")


def attn_lanes(block: int) -> int:
    """Rows of the scores buffer a blob written now plans for a prefill block of `block` tokens."""
    return min(max(block, 1), ATTN_LANES)


def blob_minor(flags: int, int8_acts: bool, int4: bool = False, block: int = 1) -> int:
    if attn_lanes(block) > 1:
        return MINOR_ATTN_LANES
    if int4:
        return MINOR_INT4
    if int8_acts:
        return MINOR_INT8_ACTS
    return MINOR_FEATURES if flags & ~FLAG["TIED"] else MINOR_BASE


def pack_header(values: Mapping[str, object]) -> bytes:
    """The 256-byte fixed header; fields not given are zero."""
    out = bytearray(HEADER_BYTES)
    for name, v in values.items():
        f = H[name]
        if f.count > 1 and f.type == "u8":
            out[f.offset:f.offset + f.count] = bytes(v)  # type: ignore[arg-type]
        elif f.count > 1:
            seq = list(v)  # type: ignore[call-overload]
            struct.pack_into(f.fmt, out, f.offset, *(seq + [0] * (f.count - len(seq))))
        else:
            struct.pack_into(f.fmt, out, f.offset, v)
    return bytes(out)


def read_header(buf: bytes | bytearray | memoryview) -> dict:
    """Every header field by name (arrays as lists, dense_map as bytes); ValueError if buf is short."""
    if len(buf) < HEADER_BYTES:
        raise ValueError(f"{len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
    out: dict = {}
    for f in HEADER:
        v = struct.unpack_from(f.fmt, buf, f.offset)
        out[f.name] = bytes(v) if f.type == "u8" and f.count > 1 else list(v) if f.count > 1 else v[0]
    return out


def dense_layers_of(h: Mapping[str, object]) -> list[int]:
    """The layers a header's dense_map marks (bounded by DENSE_MAP_LAYERS, whatever n_layers says)."""
    bits = h["dense_map"]
    assert isinstance(bits, bytes)
    return [i for i in range(DENSE_MAP_LAYERS) if bits[i // 8] >> (i % 8) & 1]


def entry(buf: bytes | bytearray | memoryview, i: int) -> dict:
    """Table entry i by field name."""
    return dict(zip(ENTRY_NAMES, ENTRY_STRUCT.unpack_from(buf, HEADER_BYTES + ENTRY_BYTES * i), strict=True))


def pack_entry(**values: int) -> bytes:
    return ENTRY_STRUCT.pack(*(values.get(n, 0) for n in ENTRY_NAMES))


def feature_flags(spec) -> int:  # noqa: ANN001 (a ModelSpec; format.py imports nothing of codegen)
    """Header flags of a ModelSpec: TIED, and the features of the families beyond Mixtral."""
    deepseek = {"MLA": spec.kv_lora_rank > 0, "Q_LORA": spec.q_lora_rank > 0,
                "ROUTER_SIGMOID": spec.router_scoring == "sigmoid", "GROUP_TOPK": spec.group_score != "none"}
    on = {**deepseek, "TIED": spec.tied, "QKV_BIAS": spec.qkv_bias, "QK_NORM_HEAD": spec.qk_norm == "head",
          "QK_NORM_FULL": spec.qk_norm == "full", "TOPK_NO_NORM": not spec.norm_topk_prob,
          "SHARED_EXPERT": bool(spec.shared_ffn), "SHARED_GATE": spec.shared_gate,
          "DENSE_LAYERS": bool(spec.dense_layers), "ROUTED_SCALE": spec.routed_scale != 1.0,
          "PARAMS": bool(model_params(spec)), "SLIDING_WINDOW": any(spec.sliding_window),
          "ATTN_SINKS": spec.attn_sinks, "O_BIAS": spec.o_bias, "EXPERT_BIAS": spec.expert_bias,
          "CLAMPED_SWIGLU": bool(spec.swiglu_limit)}
    return sum(FLAG[name] for name, v in on.items() if v)


def model_params(spec) -> dict[tuple[str, int], float | int]:  # noqa: ANN001 (a ModelSpec)
    """The parameters section of a ModelSpec as {(key name, index): value}; empty: the blob has none."""
    out: dict[tuple[str, int], float | int] = {}
    out.update({("SLIDING_WINDOW", layer): w for layer, w in enumerate(spec.sliding_window) if w})
    if spec.swiglu_limit:
        out.update({("SWIGLU_ALPHA", 0): spec.swiglu_alpha, ("SWIGLU_LIMIT", 0): spec.swiglu_limit})
    if spec.group_score != "none":
        out.update({("N_GROUP", 0): spec.n_group, ("TOPK_GROUP", 0): spec.topk_group})
    return out


def blob_names(spec, tokenizer: bool = False) -> list[str]:  # noqa: ANN001 (a ModelSpec)
    """Canonical names of every table entry of a model's blob, in table order (with a tokenizer section:
    the TOKENIZER entry last)."""
    flags = feature_flags(spec) | (FLAG["TOKENIZER"] if tokenizer else 0)
    order = tensor_order(flags, spec.n_layers, spec.n_experts, spec.dense_layers)
    return [canonical_name(k, layer, e) for k, layer, e in order]


def tensor_fields(name: str) -> dict:
    """What manifest.json says of a tensor besides its name: its kind, the size audit's class for it
    (`group`), its layer and expert (None for global and non-expert tensors)."""
    kind, layer, expert = kind_of(name)
    return {"kind": kind.name, "group": kind.group, "layer": layer if "{L}" in kind.canonical else None,
            "expert": expert if "{E}" in kind.canonical else None}
