"""Ranges of integer and boolean values in the IR, sound under two's-complement wrap-around:
whether a boolean is the same on every element (`decided`).

jax's `take` guards its gather with a test that the index is in bounds and fills NaN where it
is not (`select(in_bounds, gather, nan)`); an index clipped into the table (`jnp.clip(i, 0,
n - 1)`, the vocab-parallel embedding) is always in bounds, so the NaN is never picked, which
the finiteness analysis (`finite.nonfinite_kinds`) reads off `decided`.

A range is [lo, hi] of exact integers (booleans 0 / 1). A sum, difference or product whose
exact range leaves its dtype's may have wrapped around: its range is the whole dtype (so a
max or min after it is bounded only by its constant); a convert to a dtype that does not hold
the range likewise. Anything not modelled has its dtype's range. The walk is bounded
(`MAX_OPS`): past it, nothing is decided.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core.ranges import int_limits
from entangle_mlir.mlir.ir import op_key, producer
from entangle_mlir.mlir.opinfo import compare_type, constant_value, reducer_kind, tensor_type
from entangle_mlir.normalize.match import Memo, defining_op

Range = tuple[int, int]

MAX_OPS = 400
"""The most ops one question walks (the cone of an index test is a few ops)."""

_SAME = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
                   "stablehlo.slice", "stablehlo.reverse", "stablehlo.concatenate"})


def decided(value, shared: Memo | None = None) -> bool | None:
    """True (False) when the boolean `value` is true (false) on every element for every
    input; None when that is not shown. `shared`: ranges found by earlier questions (a walk
    that stayed within its budget leaves them there; each is then read without walking its
    cone again: a ring's masks share their positions' arithmetic). Rewrites are exact, so a
    range found before one still holds after it; the memo forgets erased ops' values."""
    ranges = _Ranges(shared)
    found = ranges.of(value)
    if shared is not None and ranges.budget >= 0:
        for v, r in ranges.memo.items():
            op = producer(v)
            if op is not None and r is not None:
                shared[v] = r
                shared.own(v, op_key(op))
    if found is None or found[0] != found[1]:
        return None
    return bool(found[0])


def _limits(value) -> Range | None:
    dtype = tensor_type(value.type).dtype
    if dtype == "i1":
        return 0, 1
    limits = int_limits(dtype)
    return None if limits is None else (int(limits[0]), int(limits[1]))


class _Ranges:
    def __init__(self, shared: dict | None = None) -> None:
        self.memo: dict = {}
        self.shared = shared if shared is not None else {}
        self.budget = MAX_OPS

    def of(self, value) -> Range | None:
        """The range of `value` (None: not an integer or boolean, or out of budget)."""
        if value in self.memo:
            return self.memo[value]
        if value in self.shared:
            return self.shared[value]
        limits = _limits(value)
        if limits is None:
            return None
        self.budget -= 1
        if self.budget < 0:
            return None
        op = defining_op(value)
        found = limits if op is None else self._op(op, limits)
        if found is not None and not (limits[0] <= found[0] <= found[1] <= limits[1]):
            found = limits  # wrapped around
        self.memo[value] = found
        return found

    def _op(self, op: ir.Operation, limits: Range) -> Range | None:
        name = op.name
        if name == "stablehlo.constant":
            array, _ = constant_value(op.attributes["value"])
            array = np.asarray(array)
            if array.size == 0 or array.dtype.kind not in "biu":
                return limits
            return int(array.min()), int(array.max())
        if name == "stablehlo.iota":
            return 0, max(max(tensor_type(op.results[0].type).shape, default=1) - 1, 0)
        args = [self.of(v) for v in op.operands]
        if name in _SAME or name == "stablehlo.convert":
            known = [a for a in args if a is not None]
            if name != "stablehlo.concatenate":
                known = known[:1]
            if len(known) != (len(args) if name == "stablehlo.concatenate" else 1):
                return limits
            return min(a[0] for a in known), max(a[1] for a in known)
        if any(a is None for a in args):
            return limits
        if name in ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply") and \
                tensor_type(op.results[0].type).dtype != "i1":
            (a_lo, a_hi), (b_lo, b_hi) = args
            if name == "stablehlo.add":
                return a_lo + b_lo, a_hi + b_hi
            if name == "stablehlo.subtract":
                return a_lo - b_hi, a_hi - b_lo
            corners = [a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi]
            return min(corners), max(corners)
        if name in ("stablehlo.maximum", "stablehlo.and"):
            if name == "stablehlo.and" and tensor_type(op.results[0].type).dtype != "i1":
                return limits
            pick = max if name == "stablehlo.maximum" else min
            return pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1])
        if name in ("stablehlo.minimum", "stablehlo.or"):
            if name == "stablehlo.or" and tensor_type(op.results[0].type).dtype != "i1":
                return limits
            pick = min if name == "stablehlo.minimum" else max
            return pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1])
        if name == "stablehlo.clamp":
            (lo, _), (x_lo, x_hi), (_, hi) = args
            return min(max(x_lo, lo), hi), min(max(x_hi, lo), hi)
        if name == "stablehlo.not" and tensor_type(op.results[0].type).dtype == "i1":
            return 1 - args[0][1], 1 - args[0][0]
        if name == "stablehlo.select":
            pred, on_true, on_false = args
            if pred == (1, 1):
                return on_true
            if pred == (0, 0):
                return on_false
            return min(on_true[0], on_false[0]), max(on_true[1], on_false[1])
        if name == "stablehlo.compare":
            return self._compare(op, args, limits)
        if name == "stablehlo.reduce" and len(op.operands) == 2 and \
                reducer_kind(op) in ("and", "or", "max", "min"):
            kind = reducer_kind(op)
            pick = max if kind in ("or", "max") else min
            return pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1])
        return limits

    @staticmethod
    def _compare(op: ir.Operation, args: list[Range], limits: Range) -> Range:
        dtype = tensor_type(op.operands[0].type).dtype
        signed = not (dtype == "i1" or dtype.startswith("ui"))
        if compare_type(op) != ("SIGNED" if signed else "UNSIGNED"):
            return limits
        direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
        (a_lo, a_hi), (b_lo, b_hi) = args
        always = {"LT": a_hi < b_lo, "LE": a_hi <= b_lo, "GT": a_lo > b_hi, "GE": a_lo >= b_hi,
                  "EQ": a_lo == a_hi == b_lo == b_hi, "NE": a_hi < b_lo or a_lo > b_hi}
        never = {"LT": a_lo >= b_hi, "LE": a_lo > b_hi, "GT": a_hi <= b_lo, "GE": a_hi < b_lo,
                 "EQ": a_hi < b_lo or a_lo > b_hi, "NE": a_lo == a_hi == b_lo == b_hi}
        if direction not in always:
            return limits
        if always[direction]:
            return 1, 1
        return (0, 0) if never[direction] else (0, 1)
