"""What the checker's caches are keyed by: a proof by the instance it checked (`proof_key`),
a plan by what determines an instance's abstraction (`plan_key`, `Plan`), so the 2nd..Nth
identical layer costs a dictionary lookup."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from entangle_mlir.analysis.instance.abstraction import outputs_are_instances
from entangle_mlir.analysis.instance.common import ABSTRACT_BASE, value_key
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import DEVICE_BLOCK_VALUES, Rel, Returning, Shifted, Value
from entangle_mlir.core.terms import Term
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext


class CacheKey:
    """A cache key (a deep tuple) with its hash computed once: the plan and proof caches look
    keys up on every op. Equal exactly when the tuples are equal."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple) -> None:
        self._hash = hash(parts)  # TypeError when a part is unhashable
        self.parts = parts

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is CacheKey and self._hash == other._hash
                                 and self.parts == other.parts)


def proof_key(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None,
              ctx: RuleContext) -> CacheKey | None:
    """The proof cache's key: the op, its types, its values and the manual axes (None when a
    part is unhashable)."""
    try:
        return CacheKey((info.signature(), tuple(info.operand_types), tuple(info.result_types),
                         tuple(value_key(v) for v in ins), tuple(value_key(v) for v in outs), mesh,
                         tuple(ctx.manual_axes)))
    except TypeError:
        return None


def _layout_key(value: Value) -> tuple:
    """A value without its term: layout, shape and dtype (`value_key` for the others)."""
    if isinstance(value, Rel):
        return ("rel", value.tiling, value.partial, value.kind, value.poly, value.scope,
                value.term.shape, value.term.dtype)
    return value_key(value)


def plan_key(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None,
             manual_axes: tuple[str, ...]) -> CacheKey | None:
    """What determines an instance's "leaf" abstraction and everything planned from it: the
    op's attributes and types, the layouts, which inputs share a term, and the constants the
    abstraction keeps (see `abstraction._Abstractor.abstract`). Cheap: no rule runs, no term
    is built. None when the instance is not eligible (device-offset values are checked as they
    are)."""
    numbering: dict[int, int] = {}  # which inputs share a leaf: serial -> leaf number
    parts = []
    for value in ins:
        if type(value) is not Rel:
            if isinstance(value, _UNPLANNED):
                return None
            if not isinstance(value, Rel):
                parts.append(value_key(value))
                continue
        term = value.term
        layout = ("rel", value.tiling, value.partial, value.kind, value.poly, value.scope,
                  term.shape, term.dtype)  # _layout_key
        op = term.op
        if op == "splat" or op == "iota":
            parts.append((layout, term))
        elif op == "broadcast" and value.poly:
            operand = term.args[0]
            parts.append((layout, term.attrs, operand.shape, operand.dtype,
                          numbering.setdefault(operand.serial, len(numbering))))
        else:
            parts.append((layout, numbering.setdefault(term.serial, len(numbering))))
    if any(isinstance(v, _UNPLANNED) for v in outs):
        return None
    try:
        return CacheKey((info.signature(), tuple(info.operand_types), tuple(info.result_types),
                         tuple(parts), tuple(_layout_key(v) for v in outs), mesh, manual_axes))
    except TypeError:
        return None


_UNPLANNED = (Shifted, Returning, *DEVICE_BLOCK_VALUES)
"""Values checked as they are, never through a reusable plan."""


@dataclass
class Plan:
    """A planned check reusable by every instance with the same `plan_key`: the abstract
    instance (the rule's output on fresh leaves), what is checked, and its cache key.

    Reuse re-validates the abstraction for the new instance: its outputs must be the abstract
    outputs with its own input terms substituted (so a changed layer is checked afresh)."""

    abstract_ins: list[Value]
    abstract_outs: list[Value]
    plan: tuple
    key: CacheKey | None

    def instance_of(self, ins: Sequence[Value], outs: Sequence[Value]) -> bool:
        mapping: dict[int, Term] = {}
        for abstract, real in zip(self.abstract_ins, ins):
            if not isinstance(abstract, Rel):
                continue
            a, r = abstract.term, real.term
            if a.op in ("splat", "iota"):
                if a is not r:
                    return False
                continue
            if a.op == "broadcast" and r.op == "broadcast":
                if (a.attrs, a.shape, a.dtype) != (r.attrs, r.shape, r.dtype):
                    return False
                a, r = a.args[0], r.args[0]
            if not _is_leaf(a) or mapping.setdefault(a.serial, r) is not r:
                return False
        return outputs_are_instances(self.abstract_outs, outs, mapping)


def _is_leaf(term: Term) -> bool:
    return term.op == "arg" and term.attrs[0] >= ABSTRACT_BASE
