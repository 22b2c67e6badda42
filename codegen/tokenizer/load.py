"""tokenizer.json (+ tokenizer_config.json) -> a `Tokenizer` description the C runtime can execute.

Supported (everything else is refused with one line naming the component):
  - SentencePiece-style BPE: model BPE with byte_fallback, the "▁" metaspace either as a Metaspace
    pre-tokenizer (prepend_scheme first/always/never, split false) or as the normalizer pair
    Prepend("▁") + Replace(" ", "▁") (Mixtral, Llama 2, DeepSeek-MoE);
  - byte-level BPE: a ByteLevel pre-tokenizer with the GPT-2 regex (GPT-2, OLMoE's GPT-NeoX style), or
    Split(regex) + ByteLevel(use_regex=false) with the Llama 3 or the Qwen2 regex, or DeepSeek LLM/MoE's
    Sequence of Splits + Digits + ByteLevel (codegen/tokenizer/deepseek.py); an NFC normalizer where
    declared (composed in C from the section's NFC tables, codegen/tokenizer/nfc.py).
Added tokens are matched whole in the text before the model (as HF `encode` does); special ones only
when the caller asks to parse them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..safeio import read_json
from . import deepseek

KIND_SPM, KIND_BYTELEVEL = 1, 2
PRE_NONE, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_DEEPSEEK = 0, 1, 2, 3, 4

# The pre-tokenizer regexes the C matchers implement, exactly as tokenizer.json spells them.
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_PATTERNS = {LLAMA3_RE: PRE_LLAMA3, QWEN2_RE: PRE_QWEN2}
METASPACE = "\u2581"


@dataclass
class Tokenizer:
    kind: int
    pretok: int
    pieces: list[bytes]  # id -> the bytes the model matches (byte-level: raw bytes; SPM: UTF-8 with "▁")
    merges: list[tuple[int, int, int]]  # in rank order: (left id, right id, merged id)
    added: list[tuple[int, bool]]  # (id, special) of the tokens matched whole in the text
    ignore_merges: bool = False
    byte_fallback: bool = False
    nfc: bool = False
    prepend: int = 0  # SPM: 0 never, 1 first segment only, 2 every segment, 3 every segment unconditionally
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    categories: tuple[str, ...] = field(default=())
    class_ranges: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # a category's own ranges
    # byte-level: the id of each byte's vocabulary entry (DeepSeek also has some of them as added tokens,
    # whose piece is then the added text, not the byte)
    byte_ids: tuple[int, ...] = ()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _refuse(path: Path, component: str) -> ExportError:
    return ExportError(path, f"unsupported tokenizer component: {component}")


def _describe(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("type", "?"))
    return repr(obj)


def _metaspace(pre: dict, path: Path) -> int:
    if pre.get("replacement", METASPACE) != METASPACE or pre.get("split", True):
        raise _refuse(path, "pre_tokenizer Metaspace with split or another replacement")
    scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
    if scheme not in ("first", "always", "never"):
        raise _refuse(path, f"pre_tokenizer Metaspace prepend_scheme {scheme!r}")
    return {"never": 0, "first": 1, "always": 2}[scheme]


def _classify(tj: dict, path: Path) -> tuple[int, int, int, bool]:
    """(kind, pre-tokenizer, prepend, nfc) or refused."""
    norm, pre = tj.get("normalizer"), tj.get("pre_tokenizer")
    nfc, prepend = False, 0
    spm_norm = False
    if norm is not None:
        parts = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
        kinds = [_describe(p) for p in parts]
        if not kinds:  # an empty Sequence (DeepSeek's): no normalizer
            pass
        elif kinds == ["NFC"]:
            nfc = True
        elif (kinds == ["Prepend", "Replace"] and parts[0].get("prepend") == METASPACE
              and parts[1].get("pattern") == {"String": " "} and parts[1].get("content") == METASPACE):
            spm_norm, prepend = True, 3
        else:
            raise _refuse(path, f"normalizer {'+'.join(kinds)}")
    if pre is None:
        if not spm_norm:
            raise _refuse(path, "no pre_tokenizer and no metaspace normalizer")
        return KIND_SPM, PRE_NONE, prepend, nfc
    if pre.get("type") == "Metaspace" and not spm_norm:
        return KIND_SPM, PRE_NONE, _metaspace(pre, path), nfc
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space", False):
            raise _refuse(path, "pre_tokenizer ByteLevel with add_prefix_space")
        if not pre.get("use_regex", True):
            raise _refuse(path, "pre_tokenizer ByteLevel without a regex")
        return KIND_BYTELEVEL, PRE_GPT2, 0, nfc
    if pre.get("type") == "Sequence":
        subs = pre.get("pretokenizers", [])
        if deepseek.is_deepseek(subs):
            return KIND_BYTELEVEL, PRE_DEEPSEEK, 0, nfc
        if (len(subs) == 2 and subs[0].get("type") == "Split" and subs[1].get("type") == "ByteLevel"
                and not subs[1].get("use_regex", True) and not subs[1].get("add_prefix_space", False)):
            pat = subs[0].get("pattern", {}).get("Regex")
            if (pat in SPLIT_PATTERNS and subs[0].get("behavior") == "Isolated"
                    and not subs[0].get("invert", False)):
                return KIND_BYTELEVEL, SPLIT_PATTERNS[pat], 0, nfc
            raise _refuse(path, f"pre_tokenizer Split with the regex {pat!r}")
        raise _refuse(path, f"pre_tokenizer Sequence of {'+'.join(_describe(s) for s in subs)}")
    raise _refuse(path, f"pre_tokenizer {_describe(pre)}")


def _special_id(cfg: dict, key: str, vocab: dict[str, int], added: dict[str, int]) -> int | None:
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    if not isinstance(v, str):
        return None
    return added.get(v, vocab.get(v))


def _template_specials(post: Any, path: Path) -> tuple[int | None, int | None]:
    """The ids a TemplateProcessing post-processor puts before and after a single sequence."""
    if not isinstance(post, dict) or post.get("type") != "TemplateProcessing":
        return None, None
    single, specials = post.get("single") or [], post.get("special_tokens") or {}

    def sid(item: Any) -> int | None:
        if not (isinstance(item, dict) and "SpecialToken" in item):
            return None
        ids = (specials.get(item["SpecialToken"].get("id")) or {}).get("ids") or []
        if len(ids) != 1:
            raise _refuse(path, "post_processor TemplateProcessing with a multi-id special token")
        return int(ids[0])

    if sum(1 for it in single if isinstance(it, dict) and "Sequence" in it) != 1 or len(single) > 3:
        raise _refuse(path, "post_processor TemplateProcessing other than [BOS] $A [EOS]")
    return (sid(single[0]) if single else None), (sid(single[-1]) if len(single) > 1 else None)


def load_tokenizer(ckpt: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint directory (tokenizer.json required, tokenizer_config.json optional)."""
    ckpt = Path(ckpt)
    path = ckpt / "tokenizer.json"
    tj = read_json(path, "tokenizer.json", "tokenizer")
    if not isinstance(tj, dict) or not isinstance(tj.get("model"), dict):
        raise ExportError(path, "tokenizer.json has no model object")
    cfg_path = ckpt / "tokenizer_config.json"
    cfg = read_json(cfg_path, "tokenizer_config.json") if cfg_path.exists() else {}
    if not isinstance(cfg, dict):
        raise ExportError(cfg_path, "tokenizer_config.json is not a JSON object")
    model = tj["model"]
    if model.get("type") != "BPE":
        raise _refuse(path, f"model {model.get('type')}")
    if model.get("dropout") not in (None, 0, 0.0):
        raise _refuse(path, "model BPE with dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise _refuse(path, "model BPE with continuing_subword_prefix/end_of_word_suffix")
    kind, pretok, prepend, nfc = _classify(tj, path)
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ExportError(path, "model.vocab is not a non-empty object")
    added_list = tj.get("added_tokens") or []
    n = max([*vocab.values(), *(a.get("id", -1) for a in added_list)]) + 1
    if n > (1 << 24):
        raise ExportError(path, f"vocabulary of {n} tokens is more than 2^24")
    strings: list[str | None] = [None] * n
    for s, i in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise ExportError(path, f"model.vocab: token {s!r} has id {i!r}")
        strings[i] = s
    added: list[tuple[int, bool]] = []
    added_ids: dict[str, int] = {}
    for a in added_list:
        if a.get("lstrip") or a.get("rstrip") or a.get("single_word"):
            raise _refuse(path, f"added token {a.get('content')!r} with lstrip/rstrip/single_word")
        if not isinstance(a.get("content"), str) or not a["content"]:
            raise ExportError(path, f"added token {a!r} has no content")
        strings[a["id"]] = a["content"]
        added_ids[a["content"]] = a["id"]
        added.append((a["id"], bool(a.get("special"))))
    b2u = bytes_to_unicode()
    u2b = {c: b for b, c in b2u.items()}
    added_set = {i for i, _ in added}

    def piece(i: int, s: str | None) -> bytes:
        if s is None:
            return b""  # a hole in the ids: matches nothing
        if kind == KIND_BYTELEVEL and i not in added_set:
            try:
                return bytes(u2b[c] for c in s)
            except KeyError:
                raise ExportError(path, f"model.vocab: token {s!r} is not in the ByteLevel alphabet") from None
        return s.encode("utf-8")

    pieces = [piece(i, s) for i, s in enumerate(strings)]
    merges: list[tuple[int, int, int]] = []
    for rank, m in enumerate(model.get("merges") or []):
        pair = m.split(" ", 1) if isinstance(m, str) else m
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ExportError(path, f"model.merges[{rank}] is not a pair of tokens")
        left, right = (vocab.get(x) for x in pair)
        merged = vocab.get(pair[0] + pair[1])
        for what, v in ((pair[0], left), (pair[1], right), (pair[0] + pair[1], merged)):
            if v is None:
                raise ExportError(path, f"model.merges[{rank}]: {what!r} is not in the vocabulary")
        merges.append((left, right, merged))
    byte_fallback = bool(model.get("byte_fallback"))
    if kind == KIND_SPM and byte_fallback:
        for b in range(256):
            if f"<0x{b:02X}>" not in vocab:
                raise ExportError(path, f"byte_fallback without the token <0x{b:02X}>")
    if kind == KIND_BYTELEVEL:
        for b, c in b2u.items():
            if c not in vocab:
                raise ExportError(path, f"ByteLevel vocabulary lacks the byte {b:#04x} ({c!r})")
    unk = model.get("unk_token")
    bos, eos = _special_id(cfg, "bos_token", vocab, added_ids), _special_id(cfg, "eos_token", vocab, added_ids)
    add_bos, add_eos = cfg.get("add_bos_token"), cfg.get("add_eos_token")
    tpl = _template_specials(tj.get("post_processor"), path)
    if add_bos is None:  # what HF's encode(add_special_tokens=True) adds: the post-processor's template
        add_bos, bos = (True, tpl[0]) if tpl[0] is not None else (False, bos)
    if add_eos is None:
        add_eos, eos = (True, tpl[1]) if tpl[1] is not None else (False, eos)
    return Tokenizer(
        kind=kind, pretok=pretok, pieces=pieces, merges=merges, added=added,
        ignore_merges=bool(model.get("ignore_merges")), byte_fallback=byte_fallback, nfc=nfc, prepend=prepend,
        bos=bos, eos=eos, unk=vocab.get(unk) if isinstance(unk, str) else None,
        add_bos=bool(add_bos), add_eos=bool(add_eos),
        categories=("L", "N") if kind == KIND_BYTELEVEL else (),
        class_ranges={"L": deepseek.LETTER_RANGES} if pretok == PRE_DEEPSEEK else {},
        byte_ids=tuple(vocab[b2u[b]] for b in range(256)) if kind == KIND_BYTELEVEL else (),
    )
