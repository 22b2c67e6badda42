"""The weights blob, tensor by tensor, as the exporter's manifest.json describes it.

This is the only place the audit learns anything about models, and only through
the manifest: tensor names, their class (`group`), layer and expert, offsets and byte spans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BLOB_SYMBOL = "colibri_blob_data"
BLOB_SECTION = ".rodata.model"
HEADER = "header+padding"
TOKENIZER_KIND = "tokenizer"  # the manifest's "tokenizer": the section inside the blob, after the weights
@dataclass(frozen=True)
class Tensor:
    name: str
    offset: int
    bytes: int
    kind: str  # the manifest's group: embedding, attention, norms, router, experts, shared_expert, dense_mlp,
    # lm_head, rope; other
    layer: int | None
    expert: int | None


@dataclass(frozen=True)
class Manifest:
    path: Path
    blob_bytes: int
    quant: str
    tensors: tuple[Tensor, ...]


def _fields_of(name: str) -> dict:
    """group, layer and expert of a tensor of a manifest written before its rows carried them: what the
    blob schema says of the name (the schema's one name parser), "other" for a name it does not know."""
    from colibri.codegen.format import tensor_fields

    try:
        return tensor_fields(name)
    except KeyError:
        return {"group": "other", "layer": None, "expert": None}


def load_manifest(path: Path) -> Manifest | None:
    """The manifest at path, or None when there is none; raises ValueError on a malformed one."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    try:
        blob_bytes = int(data["blob"]["bytes"])
        tensors = []
        for t in data.get("tensors", []):
            f = t if "group" in t else _fields_of(str(t["name"]))
            layer, expert = f.get("layer"), f.get("expert")
            tensors.append(Tensor(t["name"], int(t["offset"]), int(t["bytes"]), str(f["group"]),
                                  None if layer is None else int(layer), None if expert is None else int(expert)))
        tok = data.get("tokenizer")
        if isinstance(tok, dict) and "offset" in tok:  # manifests before the section moved into the blob: none
            tensors.append(Tensor(TOKENIZER_KIND, int(tok["offset"]), int(tok["bytes"]), TOKENIZER_KIND, None, None))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a colibri manifest (missing {e})") from None
    quant = data.get("quant", {}).get("scheme", "") if isinstance(data.get("quant"), dict) else str(data.get("quant"))
    return Manifest(path, blob_bytes, quant, tuple(sorted(tensors, key=lambda t: t.offset)))


def blob_pieces(manifest: Manifest | None, size: int) -> list[tuple[str, str, int, int]]:
    """(kind, name, start, end) pieces that cover [0, size) of the blob exactly once.

    Bytes no tensor claims (header, tensor table, alignment) are HEADER pieces."""
    if manifest is None or manifest.blob_bytes != size:
        return [("blob", BLOB_SYMBOL, 0, size)] if size else []
    out, cursor = [], 0
    for t in manifest.tensors:
        lo, hi = max(t.offset, cursor), min(t.offset + t.bytes, size)
        if hi <= lo:
            continue
        if lo > cursor:
            out.append((HEADER, f"[{HEADER}]", cursor, lo))
        out.append((t.kind, t.name, lo, hi))
        cursor = hi
    if cursor < size:
        out.append((HEADER, f"[{HEADER}]", cursor, size))
    return out


def weights_summary(manifest: Manifest | None, symbol_bytes: int) -> dict:
    """The JSON "weights" block: totals by kind, layer and expert."""
    pieces = blob_pieces(manifest, symbol_bytes)
    by_kind: dict[str, int] = {}
    by_layer: dict[str, int] = {}
    by_expert: dict[str, int] = {}
    tensors = {t.name: t for t in manifest.tensors} if manifest else {}
    rows = []
    for kind, name, lo, hi in pieces:
        n = hi - lo
        by_kind[kind] = by_kind.get(kind, 0) + n
        t = tensors.get(name)
        layer = "global" if t is None or t.layer is None else str(t.layer)
        by_layer[layer] = by_layer.get(layer, 0) + n
        if t is not None and t.expert is not None:
            key = f"layers.{t.layer}.experts.{t.expert}"
            by_expert[key] = by_expert.get(key, 0) + n
        if t is not None:
            rows.append({"name": name, "kind": kind, "layer": t.layer, "expert": t.expert, "offset": lo, "bytes": n})
    return {
        "manifest": str(manifest.path) if manifest else None,
        "quant": manifest.quant if manifest else None,
        "manifest_blob_bytes": manifest.blob_bytes if manifest else None,
        "blob_bytes": symbol_bytes,
        "matches_manifest": manifest is not None and manifest.blob_bytes == symbol_bytes,
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "by_layer": by_layer,
        "by_expert": by_expert,
        "tensors": rows,
    }
