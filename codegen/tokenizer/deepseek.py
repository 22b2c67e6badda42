"""DeepSeek LLM / DeepSeek-MoE's pre-tokenizer, exactly as their tokenizer.json spells it (and llama.cpp's
LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM): a Sequence of five Split regexes (Isolated), Digits with
individual_digits, then ByteLevel without a regex. runtime_c/src/text/pre_deepseek.c runs it as code; the
letter class goes into the section as its L ranges, the punctuation and CJK classes are in the C.
"""

from __future__ import annotations

from typing import Any

LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
    "\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
PATTERNS = (
    "[\r\n]",
    r"\s?[" + LETTERS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
)
# what pre_deepseek.c's is_punct and is_cjk test, inclusive: checked against PATTERNS at import
PUNCT_RANGES = ((0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F), (0x3000, 0x3002))
CJK_RANGES = ((0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF))


def class_ranges(cls: str) -> tuple[tuple[int, int], ...]:
    """A regex character class body of single characters and ranges (no escapes) as inclusive ranges."""
    out: list[tuple[int, int]] = []
    k = 0
    while k < len(cls):
        if k + 2 < len(cls) and cls[k + 1] == "-":
            out.append((ord(cls[k]), ord(cls[k + 2])))
            k += 3
        else:
            out.append((ord(cls[k]), ord(cls[k])))
            k += 1
    return tuple(out)


def merged(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, adjacent ones joined (the section's form)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


LETTER_RANGES = merged(class_ranges(LETTERS))
assert class_ranges(PATTERNS[2][4:-2]) == PUNCT_RANGES and class_ranges(PATTERNS[4][1:-2]) == CJK_RANGES


def is_deepseek(subs: list[Any]) -> bool:
    """Whether a pre_tokenizer Sequence's members are DeepSeek's, setting for setting."""
    if len(subs) != len(PATTERNS) + 2 or not all(isinstance(s, dict) for s in subs):
        return False
    for sub, pat in zip(subs, PATTERNS, strict=False):
        if (sub.get("type") != "Split" or sub.get("pattern") != {"Regex": pat} or sub.get("behavior") != "Isolated"
                or sub.get("invert", False)):
            return False
    digits, bl = subs[-2], subs[-1]
    return (digits.get("type") == "Digits" and digits.get("individual_digits") is True
            and bl.get("type") == "ByteLevel" and not bl.get("use_regex", True)
            and not bl.get("add_prefix_space", False))


def pre_tokenizer() -> dict[str, Any]:
    """The tokenizer.json pre_tokenizer object this recognises."""
    splits = [{"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in PATTERNS]
    return {"type": "Sequence", "pretokenizers": [
        *splits, {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
