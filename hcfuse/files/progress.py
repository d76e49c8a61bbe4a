"""How a file run (hcfuse.files.pipeline) reports its progress.

A run calls ``start(weight_bytes)`` once the input is loaded, ``stage(text)`` after each stage and
``counter(label, total)`` before a counted step (saving the weights, one count per tensor). The
base class is silent; ``StageLines`` prints time-stamped stage lines (for logs) for models above a
size; ``TerminalProgress`` adds a tqdm bar for counted steps when its stream is a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

# Models with more weight bytes than this report their stages (smaller ones finish in seconds).
LARGE_MODEL_BYTES = 256 * 1024 * 1024


class Progress:
    """Receives a run's progress; this base reports nothing."""

    def start(self, weight_bytes: int) -> None:
        pass

    def stage(self, text: str) -> None:
        pass

    def counter(self, label: str, total: int | None = None) -> Callable[[int, int], None] | None:
        """A callback(done, total) for a counted step, or None to skip counting."""
        return None


class StageLines(Progress):
    """``[  12.3 s] text`` lines on stream for models above min_bytes, and ``label: k/n`` lines about
    every tenth of a counted step."""

    def __init__(self, stream=None, min_bytes: int = LARGE_MODEL_BYTES):
        self.stream = stream if stream is not None else sys.stderr
        self.min_bytes = min_bytes
        self.enabled = False
        self.began = time.perf_counter()

    def start(self, weight_bytes: int) -> None:
        self.enabled = weight_bytes > self.min_bytes

    def stage(self, text: str) -> None:
        if self.enabled:
            self._write(f"[{time.perf_counter() - self.began:6.1f} s] {text}")

    def _write(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def counter(self, label: str, total: int | None = None):
        if not self.enabled:
            return None
        state = {"next": 0.0}

        def report(done: int, total: int) -> None:
            if total and (done / total >= state["next"] or done == total):
                self._write(f"         {label}: {done}/{total}")
                state["next"] = done / total + 0.1

        return report


class TerminalProgress(StageLines):
    """StageLines, with a tqdm bar instead of count lines when the stream is a terminal."""

    def __init__(self, stream=None, min_bytes: int = LARGE_MODEL_BYTES):
        super().__init__(stream, min_bytes)
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def _write(self, line: str) -> None:
        if not self.tty:
            return super()._write(line)
        from tqdm import tqdm

        tqdm.write(line, file=self.stream)  # above any open bar

    def counter(self, label: str, total: int | None = None):
        if not (self.enabled and self.tty):
            return super().counter(label, total)
        from tqdm import tqdm

        bars = []  # made at the first count, when the total is known

        def report(done: int, total: int) -> None:
            if not bars:
                bars.append(tqdm(total=total, desc=f"         {label}", unit="tensor", file=self.stream, leave=True))
            bar = bars[0]
            if done > bar.n:  # writer threads may report out of order
                bar.update(done - bar.n)
            if done >= total:
                bar.close()

        return report
