"""A progress line on stderr for long runs: only on a terminal, only after a second (or
`ENTANGLE_PROGRESS_DELAY` seconds), so CI logs and pipes stay quiet."""

from __future__ import annotations

import os
import sys
import time

DELAY_VARIABLE = "ENTANGLE_PROGRESS_DELAY"


class Progress:
    """`update(done)` redraws `label: done/total (elapsed)`; `total` 0 shows `done` alone."""

    def __init__(self, label: str, total: int = 0, delay: float | None = None):
        self.label = label
        self.total = total
        self.start = time.perf_counter()
        self.delay = _default_delay() if delay is None else delay
        self.enabled = sys.stderr.isatty()
        self.shown = False
        self.last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start < self.delay or now - self.last < 0.1:
            return
        self.last = now
        self.shown = True
        count = f"{done}/{self.total}" if self.total else str(done)
        sys.stderr.write(f"\r{self.label}: {count} ({now - self.start:.1f} s)")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 79 + "\r")
            sys.stderr.flush()


def _default_delay() -> float:
    try:
        return float(os.environ.get(DELAY_VARIABLE, "1"))
    except ValueError:
        return 1.0
