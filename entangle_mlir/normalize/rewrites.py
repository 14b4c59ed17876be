"""The exact rewrites of numerical idioms, applied until none applies (`rewrite_idioms`).

Two sets of rewrites by op name: the forward's (`idioms.REWRITES`: psum as all_gather + sum,
log-sum-exp shifts, the online softmax), and the online softmax's backward
(`online_backward.REWRITES`), which joins in once the forward's are done, in a module that
passes blocks around a ring (a collective_permute).
"""

from __future__ import annotations

from jaxlib.mlir import ir

from entangle_mlir.mlir.compat import block_argument
from entangle_mlir.normalize import idioms, online_backward
from entangle_mlir.normalize.finite import active, judging
from entangle_mlir.normalize.match import erasures


def rewrite_idioms(module: ir.Module, ops: list | None = None) -> int:
    """Apply the rewrites in place until none applies; the number applied. (One rewrite per
    walk: a rewrite erases ops that a list collected before it would still hold.) `ops`: the
    module's ops as `ir.ops_in_order` lists them now (stands for the first walk). The online
    softmax's backward rewrites (`online_backward.py`) join in once the forward's are done,
    in a module that passes blocks around a ring (a collective_permute), unless the fold of
    an online softmax was refused (`finite.Refusal.root`): they telescope its corrections
    into the final max the fold produces, so without the fold they lead to no proof (and
    would try every backward op after each rewrite). The finiteness judge's memos
    (`finite.Finiteness`) live through the rewrites, forgetting the values of the ops each
    one erases."""
    count = 0
    states: set[int] = set()
    with judging() as finiteness, ir.Location.unknown(), erasures() as erased:
        finiteness.forget()
        roots = finiteness.root_refusals()
        while _rewrite_one(module, idioms.REWRITES, ops, erased):
            ops = None
            count += 1
            if count % _CYCLE_CHECK == 0 and _cycled(module, states):
                return count
        if not _has_ring(module, ops) or finiteness.root_refusals() > roots:
            return count
        forward, backward = idioms.REWRITES, online_backward.REWRITES
        both = {name: _either(forward.get(name), backward.get(name))
                for name in {*forward, *backward}}
        while _rewrite_one(module, both, ops, erased):
            ops = None
            count += 1
            if count % _CYCLE_CHECK == 0 and _cycled(module, states):
                return count
    return count


_CYCLE_CHECK = 25
"""Every this many rewrites the module's shape is compared with the earlier ones'."""


def _cycled(module: ir.Module, states: set[int]) -> bool:
    """The module has a shape it had before (`states`, updated): the rewrites cycle (a factor
    moved back and forth on a program they do not fit), so rewriting stops there. Every
    rewrite is exact, so stopping is sound; two shapes taken for one (the shape leaves out
    attributes) only stop it early."""
    index: dict = {}
    shape = []

    def visit(op):
        refs = []
        for v in op.operands:
            argument = block_argument(v)
            refs.append(index.get(v, ("arg", argument.arg_number) if argument is not None
                                  else None))
        for i, r in enumerate(op.results):
            index[r] = (len(shape), i)
        shape.append((op.name, tuple(refs), tuple(str(r.type) for r in op.results)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    state = hash(tuple(shape))
    if state in states:
        return True
    states.add(state)
    return False


def _has_ring(module: ir.Module, ops: list | None) -> bool:
    if ops is not None:
        return any(name == "stablehlo.collective_permute" for name, _ in ops)
    found = []

    def look(op):
        if op.name == "stablehlo.collective_permute":
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(look)
    return bool(found)


def _either(first, second):
    """Try `first`, then `second` (either may be None)."""
    return lambda op: bool(first and first(op)) or bool(second and second(op))


def _rewrite_one(module: ir.Module, rewrites: dict, listed: list | None,
                 erased: set[int]) -> bool:
    """Try the rewrites on the module's ops in order until one fires. `erased`: the keys of
    the ops erased (`match.erasures`), which the finiteness judge forgets after each try."""
    ops: list[ir.Operation] = []

    def collect(op):
        if op.name in rewrites:
            ops.append(op)
        return ir.WalkResult.ADVANCE

    if listed is None:
        module.operation.walk(collect)
    else:
        ops = [op for name, op in listed if name in rewrites]
    finiteness = active()
    for op in ops:
        finiteness.attempt()
        fired = rewrites[op.name](op)
        if erased:
            finiteness.forget_erased(erased)
            erased.clear()
        if fired:
            finiteness.fired()
            return True
    return False
