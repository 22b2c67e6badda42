"""Export progress: a per-tensor line each (logs, pipes, tests), or one updating line on a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

REDRAW_S = 0.1


class TensorLines:
    """Reports every tensor's line through `report` (the non-terminal form)."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report

    def tensor_done(self, line: str, nbytes: int) -> None:
        self.report(line)

    def close(self) -> None:
        pass


class ProgressBar:
    """One line redrawn in place: tensors done/total, MB of source weights processed, MB/s and ETA."""

    def __init__(self, stream: TextIO, n_tensors: int, total_bytes: int) -> None:
        self.stream = stream
        self.n_tensors = n_tensors
        self.total_bytes = max(total_bytes, 1)
        self.done = 0
        self.done_bytes = 0
        self.t0 = time.perf_counter()
        self.drawn = 0.0

    def tensor_done(self, line: str, nbytes: int) -> None:
        self.done += 1
        self.done_bytes += nbytes
        now = time.perf_counter()
        if now - self.drawn >= REDRAW_S or self.done == self.n_tensors:
            self.drawn = now
            self.stream.write("\r" + self.status(now - self.t0) + "\x1b[K")
            self.stream.flush()

    def status(self, elapsed: float) -> str:
        rate = self.done_bytes / max(elapsed, 1e-9)
        left = (self.total_bytes - self.done_bytes) / rate if rate > 0 else float("inf")
        eta = f"{int(left) // 60}:{int(left) % 60:02d}" if left != float("inf") else "--:--"
        width = 24
        fill = int(width * self.done_bytes / self.total_bytes)
        return (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.n_tensors} tensors  "
                f"{self.done_bytes / 1e6:,.0f}/{self.total_bytes / 1e6:,.0f} MB  {rate / 1e6:.1f} MB/s  ETA {eta}")

    def close(self) -> None:
        if self.done:
            self.stream.write("\n")
            self.stream.flush()


def tensor_progress(report: Callable[[str], None], terminal: TextIO | None, n_tensors: int,
                    total_bytes: int) -> TensorLines | ProgressBar:
    """A bar on `terminal` when it is a TTY, else the per-tensor lines through `report`."""
    if terminal is not None and terminal.isatty():
        return ProgressBar(terminal, n_tensors, total_bytes)
    return TensorLines(report)
