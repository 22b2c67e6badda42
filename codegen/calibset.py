"""A calibration set (`--calib`, `--prune-experts`): token ids or text, one sequence per line.

A file whose lines are mostly lists of token ids (integers separated by commas or spaces; `#` starts a
comment) is read as ids, and then every line must be one. Any other file is text: each non-blank line is a
sequence, encoded by the checkpoint's own tokenizer (tokenizer.json) with the BOS/EOS its
tokenizer_config.json asks for and special tokens' text matched whole. The encoder is the model's C
tokenizer (runtime_c/src/text, compiled for this machine into a temporary directory), so calibration sees
the ids the device makes of the same text.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError
from .safeio import read_text

WHAT = "a calibration set: token ids or text, a sequence per line"


@dataclass(frozen=True)
class CalibrationSet:
    seqs: list[list[int]]
    text: bool  # read as text and encoded by the checkpoint's tokenizer

    def describe(self, path: str | Path) -> str:
        kind = "lines of text encoded by its tokenizer.json" if self.text else "sequences of token ids"
        return f"{path}: {len(self.seqs)} {kind}"


def _ids(line: str) -> list[int] | None:
    try:
        return [int(t) for t in line.split("#", 1)[0].replace(",", " ").split()]
    except ValueError:
        return None


def read_calibration(path: str | Path, vocab: int,
                     section: Callable[[], bytes | None] = lambda: None) -> CalibrationSet:
    """The file's sequences. `section` gives the checkpoint's tokenizer section (None without one); it is
    called only for a text file."""
    p = Path(path)
    lines = read_text(p, "calibration set", "calibration").splitlines()
    parsed = [(n, _ids(line)) for n, line in enumerate(lines, 1) if line.split("#", 1)[0].strip()]
    as_ids = sum(ids is not None for _, ids in parsed)
    if as_ids * 2 > len(parsed) or not parsed:  # (a file of only comments and blank lines: no sequences)
        return CalibrationSet(_checked(p, parsed, vocab), text=False)
    texts = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]  # not empty: parsed is not
    tok = section()
    if tok is None:
        bad = next(n for n, ids in parsed if ids is None)
        raise ExportError(p, f"line {bad}: not a list of token ids, and the checkpoint has no tokenizer.json to "
                             "read the file as text")
    return CalibrationSet(_encode(p, tok, texts), text=True)


def _checked(p: Path, parsed: list[tuple[int, list[int] | None]], vocab: int) -> list[list[int]]:
    for n, seq in parsed:
        if seq is None:
            raise ExportError(p, f"line {n}: not a list of token ids")
        if any(not 0 <= t < vocab for t in seq):
            raise ExportError(p, f"line {n}: token id outside [0, {vocab})")
    seqs = [seq for _, seq in parsed if seq]
    if not seqs:
        raise ExportError(p, "the calibration set has no sequences")
    return seqs


def _encode(p: Path, section: bytes, texts: list[tuple[int, str]]) -> list[list[int]]:
    """Each line through the C tokenizer, with the BOS/EOS the tokenizer asks for; a special token's text in
    a line is that token (as HF tokenizers' encode does: chat-formatted calibration text keeps its markers)."""
    import ctypes

    from colibri.runtime.text import Tokenizer, TokenizerError, compile_library

    with tempfile.TemporaryDirectory(prefix="colibri-tok-") as tmp:
        try:
            lib = ctypes.CDLL(str(compile_library(Path(tmp))), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise ExportError(p, f"read as text, it needs a C compiler ($CC, or cc) to build the model's "
                                 f"tokenizer: {e.strerror or e}") from None
        except subprocess.CalledProcessError as e:
            first = next(iter((e.stderr or "").strip().splitlines()), f"exit status {e.returncode}")
            raise ExportError(p, f"read as text, the model's tokenizer did not compile: {first}") from None
        try:
            tok = Tokenizer.from_bytes(lib, section)
        except TokenizerError as e:
            raise ExportError(p, f"the model's tokenizer section does not load: {e}") from None
        seqs = []
        for n, text in texts:
            try:
                seqs.append(tok.encode(text, special=True, parse_special=True))
            except TokenizerError as e:
                raise ExportError(p, f"line {n}: the model's tokenizer cannot encode it: {e}") from None
        return seqs
