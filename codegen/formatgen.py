"""runtime_c/src/cb_format.h and the tables of runtime_c/FORMAT.md, written from codegen/format.py.

`python -m colibri.codegen.formatgen` rewrites both in place; tests/test_format.py fails when the
checked-in files differ from what this module writes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from . import format as fmt

ROOT = Path(__file__).resolve().parent.parent
C_HEADER = ROOT / "runtime_c" / "src" / "cb_format.h"
FORMAT_MD = ROOT / "runtime_c" / "FORMAT.md"
MLP_ORDER = ("GATE", "DOWN", "UP")  # every MLP slot's three matrices, in this order


def _c_cond(cond: str) -> str:
    if cond.startswith("!"):
        return f"!{_c_cond(cond[1:])}"
    if cond == "moe":
        return "!dense"
    if cond == "dense":
        return "dense"
    if cond == "QK_NORM":
        return "(flags & CB_FLAG_QK_NORM)"
    return f"(flags & CB_FLAG_{cond})"


def _mlp_slots() -> list[fmt.Slot]:
    out = [s for s in fmt.LAYER_SLOTS if len(s.kinds) == len(MLP_ORDER) and s.kinds[0].endswith("GATE")]
    for s in out:
        if tuple(k.rsplit("_", 1)[-1] for k in s.kinds) != MLP_ORDER:
            raise AssertionError(f"slot {s.name}: an MLP's matrices must be in the order {MLP_ORDER}")
    return out


def c_header() -> str:
    """The text of cb_format.h."""
    w: list[str] = []
    add = w.append
    add("/* cb_format.h - the blob format's numbers, generated from codegen/format.py by")
    add(" * `python -m colibri.codegen.formatgen`: do not edit (tests/test_format.py checks it). */")
    add("#ifndef CB_FORMAT_H")
    add("#define CB_FORMAT_H")
    add("")
    add("#include <stdint.h>")
    add("")
    for name, value in (("MAGIC", f"0x{fmt.MAGIC:08X}u"), ("VERSION_MAJOR", f"{fmt.VERSION_MAJOR}u"),
                        ("HEADER_BYTES", f"{fmt.HEADER_BYTES}u"), ("ENTRY_BYTES", f"{fmt.ENTRY_BYTES}u"),
                        ("ALIGN", f"{fmt.ALIGN}u"), ("ROW_ALIGN", f"{fmt.ROW_ALIGN}u"),
                        ("CTX_BYTES", f"{fmt.CTX_BYTES}u"), ("CRC_FROM", f"{fmt.CRC_FROM}u")):
        add(f"#define CB_{name} {value}")
    add("/* integer matmuls: activation blocks, the tiled16 layout's tile */")
    for name, c_name in (("Q8_BLOCK", "Q8_BLOCK"), ("TILE_ROWS", "TILE16_ROWS"), ("TILE_COLS", "TILE16_COLS")):
        add(f"#define CB_{c_name} {getattr(fmt, name)}u")
    add("/* the format minor that introduced a feature */")
    for name in ("MINOR_FEATURES", "MINOR_INT8_ACTS", "MINOR_INT4", "MINOR_ATTN_LANES"):
        add(f"#define CB_{name} {getattr(fmt, name)}u")
    add(f"#define CB_ATTN_LANES {fmt.ATTN_LANES}u /* scores rows of a prefill block (minor >= 4) */")
    add("")
    add("/* bounds the validator applies before sizing anything (the Python readers apply the same) */")
    for name in ("MAX_LAYERS", "MAX_EXPERTS", "MAX_TOP_K", "MAX_PREFILL_BLOCK", "DENSE_MAP_LAYERS"):
        add(f"#define CB_{name} {getattr(fmt, name)}u")
    add("")
    add("/* fixed header: byte offsets (arrays: _COUNT elements) */")
    for f in fmt.HEADER:
        add(f"#define CB_H_{f.name.upper()} {f.offset}u /* {f.type_name} */")
        if f.count > 1:
            add(f"#define CB_H_{f.name.upper()}_COUNT {f.count}u")
    add("")
    add("/* tensor table entry: byte offsets */")
    for f in fmt.ENTRY:
        add(f"#define CB_E_{f.name.upper()} {f.offset}u /* {f.type_name} */")
    add("")
    add("/* flags */")
    for flag in fmt.FLAGS:
        add(f"#define CB_FLAG_{flag.name} (1u << {flag.bit})")
    add(f"#define CB_FLAGS_KNOWN 0x{fmt.FLAGS_KNOWN:X}u")
    add("#define CB_FLAG_QK_NORM (CB_FLAG_QK_NORM_HEAD | CB_FLAG_QK_NORM_FULL)")
    add("#define CB_FLAG_KV (CB_FLAG_KV_F16 | CB_FLAG_KV_INT8)")
    add(f"#define CB_KV_SCALE_BYTES {fmt.KV_SCALE_BYTES}u /* the f32 scale of one head's int8 KV row */")
    add("")
    add("/* weight layouts, dtypes */")
    for name, code in fmt.LAYOUTS.items():
        add(f"#define CB_LAYOUT_{name.upper()} {code}u")
    for name, code in fmt.DTYPES.items():
        add(f"#define CB_DTYPE_{name.upper()} {code}u")
    add(f"#define CB_DTYPE_LAST {max(fmt.DTYPES.values())}u /* codes above: formats this runtime lacks */")
    add(f"#define CB_BYTES_DTYPE {fmt.BYTES_DTYPE}u /* U8: raw bytes, the TOKENIZER and PARAMS entries only */")
    add(f"#define CB_INT4_BLOCK_BYTES {fmt.INT4_BLOCK_BYTES}u /* an int4 row: this many bytes a Q8 block */")
    add(f"#define CB_INT16_MAX {fmt.INT16_MAX} /* an int16 value's and activation's largest magnitude */")
    add("")
    add("/* the parameters section (FORMAT.md \"Parameters\"): records of {u16 key, u16 index, u32 value} */")
    add(f"#define CB_PARAM_RECORD_BYTES {fmt.PARAM_RECORD.size}u")
    for i, t in enumerate(fmt.PARAM_TYPES):
        add(f"#define CB_PARAM_{t.upper()} {i}u")
    for p in fmt.PARAMS:
        add(f"#define CB_PARAM_{p.name} {p.code}u /* {p.type}, {'per layer' if p.per_layer else 'global'} */")
    add(f"#define CB_PARAM_FLAGS 0x{fmt.PARAM_FLAGS:X}u /* flags whose feature reads parameters */")
    add("typedef struct cb_param_def {")
    add("    uint16_t key;")
    add("    uint8_t type, per_layer, required; /* required: its flag needs at least one record of it */")
    add("    uint32_t flag;")
    add("} cb_param_def;")
    add("/* every key this runtime knows, then a key-0 end mark */")
    defs = [f"{{{p.code}u, CB_PARAM_{p.type.upper()}, {int(p.per_layer)}u, {int(p.required)}u, CB_FLAG_{p.flag}}}"
            for p in fmt.PARAMS]
    add("#define CB_PARAM_DEFS { " + ", ".join(defs + ["{0u, 0u, 0u, 0u, 0u}"]) + " }")
    add("")
    add("/* tensor kinds */")
    add("enum cb_kind {")
    for k in fmt.KINDS:
        add(f"    CB_KIND_{k.name} = {k.code},")
    add("};")
    add("")
    add("/* table indices of the global tensors before the layers; the layers start at CB_FIRST_LAYER */")
    for i, k in enumerate(fmt.GLOBAL_HEAD):
        add(f"#define CB_T_{k} {i}u")
    add(f"#define CB_FIRST_LAYER {len(fmt.GLOBAL_HEAD)}u")
    add("/* an MLP's matrices from its slot (experts: expert e's from experts + CB_MLP_TENSORS * e) */")
    for i, part in enumerate(MLP_ORDER):
        add(f"#define CB_MLP_{part} {i}u")
    add(f"#define CB_MLP_TENSORS {len(MLP_ORDER)}u")
    _mlp_slots()
    for s in fmt.LAYER_SLOTS:
        if len(s.kinds) > 1 and s not in _mlp_slots():
            for i, k in enumerate(s.kinds):
                add(f"#define CB_OFF_{k} {i}u /* in the {s.name} slot */")
    add("")
    add("/* A layer's table entries, as indices from the layer's first (ATTN_NORM); CB_NO_SLOT when the flags")
    add(" * or the layer's kind (dense MLP or MoE) leave a slot out. */")
    add("#define CB_NO_SLOT UINT32_MAX")
    add("typedef struct cb_slots {")
    add(f"    uint32_t {', '.join(s.name for s in fmt.LAYER_SLOTS)};")
    add("    uint32_t n_tensors; /* entries of the layer */")
    add("} cb_slots;")
    add("")
    add("/* n_experts <= CB_MAX_EXPERTS (checked first), so n cannot wrap */")
    add("static inline cb_slots cb_layer_slots(uint32_t flags, uint32_t n_experts, int dense)")
    add("{")
    add("    cb_slots s;")
    add("    uint32_t n = 0;")
    for s in fmt.LAYER_SLOTS:
        size = f"{len(s.kinds)}u * n_experts" if s.per_expert else f"{len(s.kinds)}u"
        if s.when:
            cond = " && ".join(_c_cond(c) for c in s.when)
            add(f"    s.{s.name} = CB_NO_SLOT;")
            add(f"    if ({cond}) {{")
            add(f"        s.{s.name} = n;")
            add(f"        n += {size};")
            add("    }")
        else:
            add(f"    s.{s.name} = n;")
            add(f"    n += {size};")
    add("    s.n_tensors = n;")
    add("    return s;")
    add("}")
    add("")
    add("/* arena buffers; the table of lifetimes (first, last step) is CB_BUFFER_LIFETIMES */")
    add("enum cb_buffer {")
    for i, b in enumerate(fmt.BUFFERS):
        add(f"    CB_BUF_{b.name.upper()} = {i},")
    add("};")
    add(f"#define CB_N_BUFFERS {len(fmt.BUFFERS)}")
    add(f"#define CB_N_BASE_BUFFERS {fmt.N_BASE_BUFFERS} /* without a shared expert or dense layers */")
    add("#define CB_BUFFER_LIFETIMES { " + ", ".join(f"{{{b.first}, {b.last}}}" for b in fmt.BUFFERS) + " }")
    add("/* each buffer's class of data (colibri_class in colibri.h); xq's is CB_XQ_CLASS, last in _XQ */")
    classes = [f"COLIBRI_CLASS_{b.cls.upper()}" for b in fmt.BUFFERS]
    add("#define CB_BUFFER_CLASSES { " + ", ".join(classes) + " }")
    add(f"#define CB_XQ_CLASS COLIBRI_CLASS_{fmt.XQ_BUFFER.cls.upper()}")
    add("#define CB_BUFFER_CLASSES_XQ { " + ", ".join(classes) + ", CB_XQ_CLASS }")
    add("")
    add("#endif /* CB_FORMAT_H */")
    return "\n".join(w) + "\n"


def _table(head: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _since(minor: int) -> str:
    return f"1.{minor}" if minor else ""


def doc_tables() -> dict[str, str]:
    """FORMAT.md's generated sections by marker name."""
    slots = []
    for s in fmt.LAYER_SLOTS:
        kinds = ", ".join(s.kinds) + (" per expert" if s.per_expert else "")
        slots.append((s.name, kinds, " and ".join(s.when) or "always"))
    return {
        "header": _table(("offset", "type", "field", "since", "meaning"),
                         [(f.offset, f.type_name, f.name, _since(f.since), f.doc) for f in fmt.HEADER]),
        "flags": _table(("bit", "name", "since", "meaning"),
                        [(f.bit, f.name, _since(f.since), f.doc) for f in fmt.FLAGS]),
        "entry": _table(("offset", "type", "field", "meaning"),
                        [(f.offset, f.type_name, f.name, f.doc) for f in fmt.ENTRY]),
        "kinds": _table(("code", "kind", "canonical name", "rows × cols", "dtypes", "since"),
                        [(k.code, k.name, f"`{k.canonical}`", k.shape, k.dtypes, _since(k.since))
                         for k in fmt.KINDS]),
        "slots": _table(("slot", "kinds", "present when"), slots),
        "params": _table(("key", "name", "value", "records", "flag", "since", "meaning"),
                         [(p.code, p.name, p.type, "one per layer (index = layer)" if p.per_layer else
                           "one (index 0)", p.flag + (" (required)" if p.required else ""), _since(p.since), p.doc)
                          for p in fmt.PARAMS]),
        "buffers": _table(("i", "buffer", "f32 elements", "live steps", "class"),
                          [(i, b.doc, b.elements, f"{b.first}–{b.last}", b.cls) for i, b in enumerate(fmt.BUFFERS)]
                          + [("xq_offset", fmt.XQ_BUFFER.doc, fmt.XQ_BUFFER.elements, "0–11", fmt.XQ_BUFFER.cls)]),
    }


_MARKER = re.compile(r"(<!-- generated: (\w+) -->\n)(?:(?:(?!<!-- ).)*?\n)?(<!-- end generated -->)", re.S)


def format_md(text: str) -> str:
    """FORMAT.md with every generated section replaced by what format.py says."""
    tables = doc_tables()
    seen: set[str] = set()

    def put(m: re.Match) -> str:
        seen.add(m.group(2))
        return m.group(1) + tables[m.group(2)] + "\n" + m.group(3)

    out = _MARKER.sub(put, text)
    if seen != set(tables):
        raise AssertionError(f"FORMAT.md lacks the generated sections {sorted(set(tables) - seen)}")
    return out


def main(argv: list[str] | None = None) -> int:
    C_HEADER.write_text(c_header())
    FORMAT_MD.write_text(format_md(FORMAT_MD.read_text()))
    print(f"wrote {C_HEADER} and the tables of {FORMAT_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
