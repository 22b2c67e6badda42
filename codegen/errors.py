"""The one error type the exporter raises for bad input: it always names the file."""

from __future__ import annotations

from pathlib import Path


class ExportError(Exception):
    """A problem with an input file, reported as one line naming the file (and the tensor)."""

    def __init__(self, path: str | Path, message: str, tensor: str | None = None) -> None:
        super().__init__(str(path), message, tensor)
        self.path = Path(path)
        self.message = " ".join(str(message).split())
        self.tensor = tensor

    def __str__(self) -> str:
        if self.tensor is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}: tensor {self.tensor}: {self.message}"
