"""Selection along a dim: `chlo.top_k` (values and indices of the k largest along the last dim),
`mhlo.topk`, the same op in XLA's per-device programs (`largest` true or absent), and
`stablehlo.sort` with jax's ascending comparator (`sort`).

Terms: `chlo.top_k` with attrs `(k, result)`, result 0 for the values and 1 for the i32
indices, over the GLOBAL operand; `semantics.top_k` evaluates both (ties: the lower index
first, as `lax.top_k` documents).

Per-device layout: top-k works row by row along the last dim, so every other dim keeps its
split (each device selects within its own rows, which are rows of the global tensor). Refused:

* the last dim split: each device would pick the top k of its own block of candidates (and
  number them from 0), not of the whole row;
* a partial operand: the top k of a partial sum is not the partial of anything.
"""

from __future__ import annotations

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import Opaque, Rel, Value
from entangle_mlir.core.selection import TOP_K, make_top_k
from entangle_mlir.core.terms import Term, intern
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, local_iota, unify_dims

MHLO_TOP_K = "mhlo.topk"


def top_k(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """Top-k along the last dim keeps the split of every other dim; refused when the last dim
    is split or the operand is a partial value."""
    (x,) = operands
    count = len(info.result_types)
    if not info.attrs.get("largest", True):
        return [Opaque(f"{info.name} of the k smallest values is not supported",
                       category="unsupported")] * max(count, 1)
    if not isinstance(x, Rel):
        return [Opaque("top_k of a device-dependent value", category="unsupported")] * count
    k = int(info.attrs.get("k", 0))
    if count != 2 or not info.operand_types or not info.operand_types[0].shape:
        return [Opaque("top_k: expected a ranked operand and two results",
                       category="internal")] * max(count, 1)
    x = freeze(x)
    last = len(x.tiling) - 1
    if x.tiling[last]:
        return [Opaque(f"top_k along dim {last}, which is split over "
                       f"{axes_str(x.tiling[last])}: each device picks the top {k} of its own "
                       "block of candidates, not of the whole row (all_gather the dim first)",
                       category="layout_mismatch")] * count
    if x.partial:
        return [Opaque(f"top_k of a partial {x.kind} over {axes_str(x.partial)}: missing "
                       "all_reduce/psum before it", category="nonlinear_partial")] * count
    if k > x.term.shape[last]:
        return [Opaque("top_k: k is larger than the dim", category="internal")] * count
    values = make_top_k(x.term, k, 0, info.result_types[0].dtype)
    indices = make_top_k(x.term, k, 1, info.result_types[1].dtype)
    tiling = x.tiling[:last] + ((),)
    return [Rel(values, tiling, (), "", frozenset(), x.scope),
            Rel(indices, tiling, (), "", frozenset(), x.scope)]


def make_sort(operands: tuple[Term, ...], dim: int, result: int) -> Term:
    """Result `result` of a stable ascending sort along `dim` by `operands[0]` (jax's
    comparator), every operand permuted alike (`tensor.sort_ascending`)."""
    shape = operands[result].shape
    return intern("sort", tuple(operands), (dim, result), shape, operands[result].dtype)


def sort(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """`stablehlo.sort` with jax's comparator (`opinfo.sort_comparator`: ascending by the
    first operand, read whole) along a dim that is not split: each device sorts whole rows of
    its block, so every other dim keeps its split (operands laid out alike). Refused: the
    sorted dim split (each device would sort its own block), a partial operand, another
    comparator, an unstable sort (ties in any order: the operands moved with the keys, or -0 and
    +0, which the comparator takes for equal)."""
    count = len(info.result_types)

    def refuse(why: str, category: str = "unsupported") -> list[Value]:
        return [Opaque(why, category=category)] * max(count, 1)

    if info.attrs.get("comparator") != "ascending":
        return refuse(f"not a supported sort: {info.attrs.get('region_problem', 'comparator')}")
    if not info.attrs.get("is_stable"):
        return refuse("an unstable sort (ties, -0 and +0 among them, in an unspecified order)")
    if not all(isinstance(v, Rel) for v in operands):
        return refuse("sort of a device-dependent value")
    dim = int(info.attrs["dimension"])
    rels: list[Rel] = list(operands)
    pending = next((r for r in rels if r.partial), None)
    if pending is not None:
        return refuse(f"sort of a partial {pending.kind} over {axes_str(pending.partial)}: "
                      "missing all_reduce/psum before it", "nonlinear_partial")
    split = next((r.tiling[dim] for r in rels if r.tiling[dim]), ())
    if split:
        return refuse(f"sort along dim {dim}, which is split over {axes_str(split)}: each "
                      "device sorts its own block, not the whole row (all_gather the dim "
                      "first)", "layout_mismatch")
    rank = len(rels[0].term.shape)
    rels = [local_iota(r, ctx) for r in rels]
    unified = unify_dims(rels, [list(range(rank))] * len(rels), ctx, "sort")
    if isinstance(unified, Opaque):
        return [unified] * count
    rels, joint, still_poly = unified
    if dim in still_poly:
        return refuse(f"sort along dim {dim}, a dim of local size only")
    rels = [freeze(r) for r in rels]
    tiling = tuple(axes for _, axes in joint)
    terms = tuple(r.term for r in rels)
    return [Rel(make_sort(terms, dim, k), tiling, (), "", frozenset(), rels[0].scope)
            for k in range(count)]


SORTING_RULES = {
    TOP_K: top_k,
    MHLO_TOP_K: top_k,
    "stablehlo.sort": sort,
}
