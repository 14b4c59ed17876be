"""case (lax.switch, lax.cond): the results are the branches' results selected by the index.

The walker (`analysis/infer.py`, `Walker._case`) walks every branch's region whole (each op of
each branch by its own rule, every instance checked) and hands this rule the index and the
branches' results, branch by branch (`attrs["branches"]` branches of the op's result count).
StableHLO runs branch `index`, or the last branch when the index is out of range; branches are
pure, so the result is the select chain
`select(index == 0, b0, select(index == 1, b1, ... b_last))`, exact on every value of the
index (`semantics/ops.py` gives the op that meaning on the branches' values).

Per device the chain holds when every device reads the same index (a replicated value, or a
constant): then all devices run the same branch, and the results keep the layout the branches
agree on (tilings, a partial sum: `select(p, a_d, b_d)` summed over devices is the select of
the sums). An index that differs between devices (a partial value, a device table) is left to
the general tier; branches whose results are laid out differently are refused.
"""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import DeviceScalar, Opaque, Rel, Value
from entangle_mlir.core.terms import Term, make_broadcast, make_elementwise, make_splat, splat_value
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, unify_dims

CASE = "stablehlo.case"


def branch_pick(index: int, branches: int) -> int:
    """The branch a constant index runs (StableHLO: out of range runs the last)."""
    return index if 0 <= index < branches else branches - 1


def select_chain(index: Term, values: list[Term]) -> Term:
    """`select(index == 0, values[0], select(index == 1, values[1], ... values[-1]))`, the
    (scalar) index compared in its own type and broadcast to the values' shape."""
    result = values[-1]
    shape = result.shape
    for b in range(len(values) - 2, -1, -1):
        hit = make_elementwise("stablehlo.compare", (index, make_splat(b, (), index.dtype)),
                               ("EQ",), dtype="i1")
        if shape:
            hit = make_broadcast(hit, (), shape)
        result = make_elementwise("stablehlo.select", (hit, values[b], result),
                                  dtype=values[b].dtype)
    return result


def case(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """The select chain of the branches' results on a device-independent index."""
    branches = int(info.attrs.get("branches", 0))
    count = len(info.result_types)

    def refuse(why: str, category: str = "unsupported") -> list[Value]:
        return [Opaque(why, category=category)] * count

    if not branches or len(operands) != 1 + branches * count:
        return refuse("case: its branches' results were not handed over", "internal")
    index, flat = operands[0], operands[1:]
    if isinstance(index, DeviceScalar):
        if len(set(index.values)) != 1:
            return refuse("case on a device-dependent index (each device runs its own branch): "
                          "not supported by the layout tier")
        index = Rel(make_splat(index.values[0], (), info.operand_types[0].dtype), ())
    if not isinstance(index, Rel) or index.tiled_axes:
        return refuse("case on an index that is not one value on every device")
    if index.partial:
        return refuse(f"case on a partial {index.kind} over {axes_str(index.partial)} (each "
                      "device runs the branch of its own piece): not supported by the layout "
                      "tier")
    constant = splat_value(index.term)
    outputs: list[Value] = []
    for j in range(count):
        values = [flat[b * count + j] for b in range(branches)]
        if isinstance(constant, Fraction) and constant.denominator == 1:
            outputs.append(values[branch_pick(int(constant), branches)])
            continue
        outputs.append(_selected(index.term, values, ctx))
    return outputs


def _selected(index: Term, values: list[Value], ctx: RuleContext) -> Value:
    opaque = next((v for v in values if isinstance(v, Opaque)), None)
    if opaque is not None:
        return opaque
    if not all(type(v) is Rel for v in values):
        return Opaque("case: a branch yields a device-dependent value (not supported yet)",
                      category="unsupported")
    rels: list[Rel] = list(values)
    if any(r.scope != rels[0].scope for r in rels):
        return Opaque("case: branches yield values of different scopes", category="internal")
    first = rels[0]
    if any((r.partial, r.kind) != (first.partial, first.kind) for r in rels):
        return Opaque("case: branches yield partial values over different axes or of "
                      "different kinds", category="unsupported")
    rank = len(first.term.shape)
    if ctx.is_global:
        rels = [freeze(r) for r in rels]
        joint, still_poly = [(n, ()) for n in first.term.shape], set()
    else:
        unified = unify_dims(rels, [list(range(rank))] * len(rels), ctx, "case")
        if isinstance(unified, Opaque):
            return unified
        rels, joint, still_poly = unified
    term = select_chain(index, [r.term for r in rels])
    origin = next((r.partial_origin for r in rels if r.partial), None)
    return Rel(term, tuple(axes for _, axes in joint), first.partial, first.kind,
               frozenset(still_poly), first.scope, partial_origin=origin)


CONTROL_RULES = {
    CASE: case,
}
