"""Sets of integers as finite unions of half-open intervals `[lo, hi)` (None: unbounded), the
values a device's range test accepts (`InBlock`). One form per set: sorted, disjoint, not
touching, none empty, so two tests are the same test exactly when their tuples are equal.
"""

from __future__ import annotations

import math

End = int | None
Ranges = tuple[tuple[End, End], ...]

EVERYTHING: Ranges = ((None, None),)
NOTHING: Ranges = ()


def _low(end: End) -> float:
    return -math.inf if end is None else end


def _high(end: End) -> float:
    return math.inf if end is None else end


def _end(value: float) -> End:
    return None if math.isinf(value) else int(value)


def canonical(parts) -> Ranges:
    """The one form of a union of intervals (any order, overlapping, empty ones allowed)."""
    spans = sorted((_low(lo), _high(hi)) for lo, hi in parts if _low(lo) < _high(hi))
    merged: list[list[float]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((_end(lo), _end(hi)) for lo, hi in merged)


def interval(lo: End, hi: End) -> Ranges:
    return canonical([(lo, hi)])


def complement(a: Ranges) -> Ranges:
    cuts = [-math.inf] + [x for lo, hi in a for x in (_low(lo), _high(hi))] + [math.inf]
    return canonical([(_end(cuts[i]), _end(cuts[i + 1])) for i in range(0, len(cuts), 2)
                      if cuts[i] < cuts[i + 1]])


def intersect(a: Ranges, b: Ranges) -> Ranges:
    spans = [(max(_low(p), _low(r)), min(_high(q), _high(s))) for p, q in a for r, s in b]
    return canonical([(_end(lo), _end(hi)) for lo, hi in spans if lo < hi])


def union(a: Ranges, b: Ranges) -> Ranges:
    return canonical(a + b)


def shift(a: Ranges, by: int) -> Ranges:
    return tuple((None if lo is None else lo + by, None if hi is None else hi + by)
                 for lo, hi in a)


def clip(a: Ranges, lo: int, hi: int) -> Ranges:
    """`a` where only [lo, hi) can occur: parts outside dropped, ends at lo or hi unbounded
    (the same test on every value that can occur)."""
    kept = intersect(a, interval(lo, hi))
    return canonical([(None if p == lo else p, None if q == hi else q) for p, q in kept])


def contains(a: Ranges, value: int) -> bool:
    return any(_low(lo) <= value < _high(hi) for lo, hi in a)


def describe(a: Ranges, name: str) -> str:
    """`a` as a test of `name`: '0 <= name < 4', 'not (0 <= name < 4)', or a union."""
    def one(lo: End, hi: End) -> str:
        if lo is None and hi is None:
            return "true"
        low = "" if lo is None else f"{lo} <= "
        high = "" if hi is None else f" < {hi}"
        return f"{low}{name}{high}"

    if not a:
        return "(false)"
    if len(a) == 1:
        return f"({one(*a[0])})"
    hole = complement(a)
    if len(hole) == 1:
        return f"not ({one(*hole[0])})"
    return "(" + " or ".join(one(lo, hi) for lo, hi in a) + ")"
