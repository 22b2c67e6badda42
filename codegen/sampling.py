"""colibri.json's "sampling": the built-in sampling of colibri_demo and the firmware image.

    "sampling": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "repeat_penalty": 1.1,
                 "seed": 7, "stop": [2]}

Every key is optional (DEFAULTS: greedy); the ranges are colibri_sample.h's. validate() checks types
and ranges (one line naming the key); c_values() and c_stop() give what model.h defines.
"""

from __future__ import annotations

import math
from typing import Any

DEFAULTS: dict[str, Any] = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
                            "seed": 0, "stop": []}
U64 = 1 << 64


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(key: str, v: Any, ok, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise ValueError(f"'sampling' key {key!r}: expected {what}, got {v!r}"[:160])
    return float(v)


def validate(data: Any, vocab: int) -> dict[str, Any]:
    """The sampling settings with defaults filled in; ValueError (one line) on a bad value."""
    if not isinstance(data, dict):
        raise ValueError(f"'sampling': expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"'sampling': unknown key {unknown[0]!r} (known: {', '.join(DEFAULTS)})")
    out = dict(DEFAULTS, stop=[])
    checks = {
        "temperature": (lambda v: v >= 0, "a number >= 0 (0: greedy)"),
        "top_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "min_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "repeat_penalty": (lambda v: v > 0, "a number > 0 (1: none)"),
    }
    for key, (ok, what) in checks.items():
        if key in data:
            out[key] = _number(key, data[key], ok, what)
    for key, hi in (("top_k", 1 << 32), ("seed", U64)):
        if key in data:
            v = data[key]
            if not _is_int(v) or not 0 <= v < hi:
                raise ValueError(f"'sampling' key {key!r}: expected an integer in [0, 2^{hi.bit_length() - 1}), "
                                 f"got {v!r}"[:160])
            out[key] = v
    if "stop" in data:
        stop = data["stop"]
        if not isinstance(stop, list) or not all(_is_int(t) and 0 <= t < vocab for t in stop) or len(stop) > 64:
            raise ValueError(f"'sampling' key 'stop': expected at most 64 token ids in [0, {vocab})")
        out["stop"] = list(stop)
    return out


def _c_float(v: float) -> str:
    return f"{float(v)!r}f"


def c_values(s: dict[str, Any]) -> dict[str, str]:
    """model.h's COLIBRI_DEFAULT_* sampling macros, as C source text."""
    return {
        "SAMPLING": "1" if s["temperature"] > 0 or s["repeat_penalty"] != 1.0 else "0",
        "TEMPERATURE": _c_float(s["temperature"]), "TOP_K": f"{s['top_k']}u", "TOP_P": _c_float(s["top_p"]),
        "MIN_P": _c_float(s["min_p"]), "REPEAT_PENALTY": _c_float(s["repeat_penalty"]), "SEED": f"{s['seed']}u",
        "N_STOP": str(len(s["stop"])),
    }


def c_stop(s: dict[str, Any]) -> list[int]:
    """COLIBRI_DEFAULT_STOP's elements: the stop ids, or one unused -1 (a C array is never empty)."""
    return [int(t) for t in s["stop"]] or [-1]
