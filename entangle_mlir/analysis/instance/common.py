"""What every part of the instance check shares: its limits, the names of its queries, the
size of an instance and the cost of its terms, the relations a value is built on, and a value's
key."""

from __future__ import annotations

import math
from collections.abc import Sequence

from entangle_mlir.core.relations import (
    BlockIndex,
    DeviceScalar,
    InBlock,
    Masked,
    Permuted,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import Term, subterms
from entangle_mlir.mlir.opinfo import OpInfo

ABSTRACT_BASE = 1_000_000_000
"""Argument indices of abstract leaves (never used by real programs)."""

MAX_TERM_COST = 20_000
"""Real (non-abstracted) terms are evaluated only when all their subterms together have at most
this many elements."""

DEFAULT_TIMEOUT_MS = 5_000
"""Milliseconds per Z3 query."""


def query_name(info: OpInfo) -> str:
    """The name of an instance's queries: `instance.<op>`, `@<line>` added when known."""
    base = info.name.split(".")[-1]
    if info.loc is not None:
        loc = getattr(info.loc, "line", None)
        if loc:
            base += f"@{loc}"
    return f"instance.{base}"


def instance_size(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value]) -> int:
    """The elements of the instance's largest tensor: its local types and its terms."""
    sizes = [math.prod(t.shape) for t in info.operand_types + info.result_types]
    sizes += [math.prod(r.term.shape) for r in map(rel_of, list(ins) + list(outs))
              if r is not None]
    return max(sizes, default=1)


def rel_of(value: Value) -> Rel | None:
    """The relation a value is built on (a moved or shifted value's underlying Rel)."""
    if isinstance(value, Rel):
        return value
    if isinstance(value, Permuted | Windowed | Shifted | Reordered | Returning | InBlock
                  | BlockIndex | Masked):
        return value.rel
    return None


def rels_of(value: Value) -> list[Rel]:
    """Every relation a value is built on (a masked value's predicate too)."""
    rel = rel_of(value)
    if rel is None:
        return []
    return [rel, value.pred.rel] if isinstance(value, Masked) else [rel]


def term_cost(terms: Sequence[Term]) -> int:
    """Elements over all distinct subterms (the work of evaluating them symbolically)."""
    return sum(math.prod(term.shape) for term in subterms(terms))


def value_key(value: Value) -> tuple:
    """A value as a tuple: equal tuples for equal values (terms compared by identity)."""
    if isinstance(value, Rel):
        return ("rel", value.term, value.tiling, value.partial, value.kind, value.poly,
                value.scope)
    if isinstance(value, DeviceScalar):
        return ("scalar", value.values, value.shape)
    if isinstance(value, Shifted):
        return ("shifted", value_key(value.rel), value.offsets)
    if isinstance(value, Permuted):
        return ("permuted", value_key(value.rel), value.sources)
    if isinstance(value, Reordered):
        return ("reordered", value_key(value.rel), value.dim, value.orders,
                None if value.pieces is None else id(value.pieces))
    if isinstance(value, Returning):
        return ("returning", value_key(value.rel), value.dim, value.blocks, value.sources,
                None if value.pieces is None else id(value.pieces))
    if isinstance(value, Windowed):
        return ("windowed", value_key(value.rel), value.dim, value.offset, value.length,
                value.holes, value.summed, value.starts)
    if isinstance(value, InBlock):
        return ("inblock", value_key(value.rel), value.axes, value.length, value.ranges)
    if isinstance(value, BlockIndex):
        return ("blockindex", value_key(value.rel), value.axes, value.length, value.fill,
                value.add, value.clamp)
    if isinstance(value, Masked):
        return ("masked", value_key(value.rel), value_key(value.pred), value.zero)
    return ("opaque",)
