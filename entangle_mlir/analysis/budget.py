"""Time budgets counted in CPU seconds of the thread doing the work, not wall-clock seconds.

A check's budget (the general tier's, the rule checks') decides a verdict when it runs out
("out of time"). Counted on the wall clock, that verdict depended on what else the machine
ran: the same pair was proven on an idle machine and not at a load of 12. Counted in the
process's CPU time it depended on what else the process ran: other threads (a test runner's,
a Python API user's, a cluster client's) spend it too, and CI saw a pair proven alone run out
of budget in a test worker. So a budget counts the CPU time of the thread that made it (where
the check runs, Z3's solving included: it solves in the calling thread) plus the CPU time
worker processes report for queries they proved for it (`instance/parallel.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Budget:
    """`seconds` of CPU time of the thread that makes it, from the moment it is made (read
    from any thread). Not shared with forked processes: a worker's own CPU time reaches it
    only through `spend`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._clock = _this_thread_clock()
        self._start = self._clock()
        self.spent_elsewhere = 0.0

    def spent(self) -> float:
        """CPU seconds spent so far: by the thread that made the budget, and reported from
        elsewhere."""
        return self._clock() - self._start + self.spent_elsewhere

    def over(self) -> bool:
        return self.spent() > self.seconds

    def spend(self, seconds: float) -> None:
        """Count CPU seconds another process spent on this budget's work."""
        self.spent_elsewhere += seconds


def _this_thread_clock() -> Callable[[], float]:
    """A function returning the calling thread's CPU seconds, readable from other threads
    (POSIX thread CPU clocks; after the thread ends, its last reading); where the platform has
    none, `time.thread_time` (which reads the thread that calls it)."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return time.thread_time
    last = [0.0]

    def read() -> float:
        try:
            last[0] = time.clock_gettime(clock)
        except OSError:  # the thread has ended: its CPU time is what it was
            pass
        return last[0]

    return read
