"""CRC-32 (zlib's) of a concatenation from the CRCs of its parts: zlib's crc32_combine, which Python's zlib
module does not expose. It lets the blob writer sum the weights' CRC as it writes them, and prefix the
header it writes last, without reading the blob back."""

from __future__ import annotations

_POLY = 0xEDB88320  # CRC-32's reflected polynomial


def _times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, m) for m in mat]


def combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib.crc32(a + b) from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b) and len2 = len(b)."""
    if len2 <= 0:
        return crc1
    op = [_POLY] + [1 << n for n in range(31)]  # the operator that appends one zero bit
    for _ in range(3):
        op = _square(op)  # ... one zero byte
    while len2:  # apply len2 zero bytes to crc1, a bit of len2 at a time
        if len2 & 1:
            crc1 = _times(op, crc1)
        len2 >>= 1
        op = _square(op)
    return crc1 ^ crc2
