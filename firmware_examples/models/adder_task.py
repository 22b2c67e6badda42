"""The addition task of the colibri demo model (standard library only).

A problem is ``a+b`` with non-negative operands of 1..``max_digits`` decimal digits.
The model sees the byte ids of ``<BOS>a+b=`` and must generate the decimal digits of
``a+b`` (most significant digit first, no leading zeros) followed by ``<EOS>``::

    prompt  "123+456="  ->  ids [256, 49, 50, 51, 43, 52, 53, 54, 61]
    answer  "579"       ->  generated ids [53, 55, 57, 257]

Token ids: 0..255 are raw bytes, 256 = BOS, 257 = EOS, 258 = PAD (never generated).

Held-out split: a pair (a, b) is *held out* when ``zlib.crc32(b"a+b") % HELDOUT_MODULUS == 0``
(the decimal prompt text without ``=``). Training never uses held-out pairs, and
``make_problems`` only returns held-out pairs, so any seed gives unseen problems.
"""

from __future__ import annotations

import random
import zlib

BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 260
HELDOUT_MODULUS = 32
REVERSED_ANSWER = False


def is_heldout(a: int, b: int) -> bool:
    """True when the pair (a, b) belongs to the held-out split (never trained on)."""
    return zlib.crc32(f"{a}+{b}".encode("ascii")) % HELDOUT_MODULUS == 0


def sample_operand(rng: random.Random, max_digits: int) -> int:
    """Digit count uniform in 1..max_digits, then a uniform number with that many digits."""
    digits = rng.randint(1, max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def format_problem(a: int, b: int) -> tuple[str, str]:
    """(prompt, expected answer) for a + b, e.g. (``"123+456="``, ``"579"``)."""
    answer = str(a + b)
    if REVERSED_ANSWER:
        answer = answer[::-1]
    return f"{a}+{b}=", answer


def make_problems(seed: int, n: int, max_digits: int) -> list[tuple[str, str]]:
    """``n`` distinct held-out problems as (prompt, expected answer) pairs, deterministic in ``seed``."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    problems: list[tuple[str, str]] = []
    while len(problems) < n:
        a = sample_operand(rng, max_digits)
        b = sample_operand(rng, max_digits)
        if (a, b) in seen or not is_heldout(a, b):
            continue
        seen.add((a, b))
        problems.append(format_problem(a, b))
    return problems


def encode_prompt(prompt: str) -> list[int]:
    """Token ids of a prompt such as ``"123+456="``: BOS followed by its bytes."""
    return [BOS, *prompt.encode("ascii")]


def encode_example(prompt: str, answer: str) -> list[int]:
    """Full training sequence: BOS, prompt bytes, answer bytes, EOS."""
    return [*encode_prompt(prompt), *answer.encode("ascii"), EOS]


def decode_answer(ids: list[int]) -> str:
    """Text of generated ids, stopping at EOS (or any other special id)."""
    out = bytearray()
    for tok in ids:
        if tok >= 256:
            break
        out.append(tok)
    return out.decode("ascii", errors="replace")
