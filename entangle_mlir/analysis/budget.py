"""Time budgets counted in CPU seconds, not wall-clock seconds.

A check's budget (the general tier's, the rule checks') decides a verdict when it runs out
("out of time"). Counted on the wall clock, that verdict depended on what else the machine
ran: the same pair was proven on an idle machine and not at a load of 12. Counted in CPU
seconds it depends on the check's own work only: this process's CPU time (its threads, Z3's
included) plus the CPU time worker processes report for queries they proved for it
(`instance/parallel.py`).
"""

from __future__ import annotations

import time


class Budget:
    """`seconds` of CPU time from the moment it is made. Not shared with forked processes:
    a worker's own CPU time reaches it only through `spend`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._start = time.process_time()
        self.spent_elsewhere = 0.0

    def spent(self) -> float:
        """CPU seconds spent so far: here, and reported from elsewhere."""
        return time.process_time() - self._start + self.spent_elsewhere

    def over(self) -> bool:
        return self.spent() > self.seconds

    def spend(self, seconds: float) -> None:
        """Count CPU seconds another process spent on this budget's work."""
        self.spent_elsewhere += seconds
