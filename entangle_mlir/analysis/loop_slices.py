"""Loop slicing: a `while` result is a function of the carries it reads, not of all of them.

The value a carried slot holds at a loop's exit depends only on its own init and on the
carries its yield reads, transitively, together with those the condition reads (which fix
the trip count). A carry nobody else reads (a residual jax's scan stacks for the backward
pass: the all_gather'd weights FSDP saves, which the reference never stacks) does not change
the other results. So each result is named by its slice alone: the inits, condition and
yields of the carries in that closure, the loop variables renumbered within it. Two programs
whose loops differ only in carries a result does not read then name that result alike.

Reads are taken from the MLIR body (an operand of any op, nested regions included, that
depends on a block argument): an over-approximation of what the terms read, so a slice never
drops a carry the result depends on.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core.terms import (
    Term,
    make_loopvar,
    post_order,
    rebuild,
    splat_value,
    subterms,
)
from entangle_mlir.rules.gather_scatter import DUS
from entangle_mlir.semantics.element import SemanticsError
from entangle_mlir.semantics.evaluate import evaluate_term

SUMMARIES = frozenset({"while_result", "region_result"})
"""Terms naming a nested region by the serials of its body terms: loop variables they read
are out of reach of a renaming, so a slice holding one is not renumbered."""


def _reads(block: ir.Block) -> dict[ir.Value, frozenset[int]]:
    """Every value defined in `block` (block arguments included) -> the argument positions
    it depends on, through any op and the operands of ops in its nested regions."""
    reads: dict[ir.Value, frozenset[int]] = {arg: frozenset({k})
                                             for k, arg in enumerate(block.arguments)}
    for op in block.operations:
        found = set()
        for value in _operands_within(op.operation):
            found |= reads.get(value, frozenset())
        for result in op.operation.results:
            reads[result] = frozenset(found)
    return reads


def _operands_within(op: ir.Operation) -> list[ir.Value]:
    """The operands of `op` and of every op nested in its regions."""
    out = list(op.operands)
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                out.extend(_operands_within(inner.operation))
    return out


def carry_reads(cond: ir.Block, body: ir.Block) -> tuple[frozenset[int], list[frozenset[int]]]:
    """The carries the condition reads, and for each yield the carries it reads."""
    cond_reads, body_reads = _reads(cond), _reads(body)
    cond_out = cond.operations[len(cond.operations) - 1].operation.operands
    body_out = body.operations[len(body.operations) - 1].operation.operands
    reads_cond = frozenset().union(*(cond_reads.get(v, frozenset()) for v in cond_out))
    return reads_cond, [body_reads.get(v, frozenset()) for v in body_out]


def closure(k: int, reads_cond: frozenset[int], reads: list[frozenset[int]],
            live: list[int]) -> list[int]:
    """The live carries result `k` depends on: itself, what the condition reads, and what
    their yields read, transitively; in slot order."""
    todo, seen = [k, *reads_cond], set()
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        todo.extend(reads[j])
    return [j for j in live if j in seen]


def renumbered(roots: list[Term], depth: int, moves: dict[int, int]) -> list[Term] | None:
    """`roots` with each loop variable of the loop at `depth` in position p replaced by the
    one in position `moves[p]`; None when a root reads a nested summary (whose body terms,
    named by serial, could read a loop variable a renaming does not reach) or a loop variable
    of this loop outside `moves`."""
    for term in subterms(roots):
        if term.op in SUMMARIES:
            return None
        if term.op == "loopvar" and term.attrs[0] == depth and term.attrs[1] not in moves:
            return None
    memo: dict[int, Term] = {}
    for root in roots:
        for term in post_order(root, memo):
            if term.op == "loopvar" and term.attrs[0] == depth:
                out = make_loopvar(depth, moves[term.attrs[1]], term.shape, term.dtype)
            else:
                args = tuple(memo[a.serial] for a in term.args)
                out = term if all(a is b for a, b in zip(args, term.args)) \
                    else rebuild(term, args)
            memo[term.serial] = out
    return [memo[t.serial] for t in roots]


MAX_FILL_TRIPS = 1 << 16
"""Trips a counted loop is run on its counter alone to read where a fill writes."""


def filled(k: int, depth: int, cond: Term, yields: list[Term], inits: list[Term]
           ) -> Term | None:
    """`x` when carry `k` of a two-carry loop slice (`yields`, `inits` in slice order, loop
    variables numbered within it) is a buffer every trip overwrites with the window of a
    loop-invariant `x` at the same place, and the trips together cover the whole buffer:
    `b = dynamic_update_slice(b, dynamic_slice(x, s(i)), s(i))` for the other carry, a counter
    `i`: e.g. the residual jax's scan stacks of per-layer weights, which is the stacked weights
    again. Whatever `b` held before is overwritten; where trips overlap they write the same
    values of `x`. The counter is run concretely from its constant init while the condition
    holds (at most `MAX_FILL_TRIPS`), the start indices evaluated (clamped as the ops clamp
    them) at each trip. None: not such a loop, or a trip not matched."""
    if len(yields) != 2:
        return None
    c = 1 - k
    buffer = yields[k]
    if buffer.op != DUS or buffer.args[0] is not make_loopvar(
            depth, k, buffer.shape, buffer.dtype):
        return None
    window, *writes = buffer.args[1:]
    if window.op != "dynamic_slice" or window.args[0].shape != buffer.shape:
        return None
    x, *reads = window.args
    if not _invariant(x, depth):
        return None
    boxes = _trip_boxes(inits[c], depth, c, cond, yields[c], reads, writes,
                        x.shape, window.shape)
    return x if boxes is not None and _covers(boxes, x.shape, window.shape) else None


def _invariant(x: Term, depth: int) -> bool:
    """`x` reads nothing the loop at `depth` (or one nested in it) changes."""
    for term in subterms([x]):
        if term.op == "loopvar" and term.attrs[0] >= depth or term.op in SUMMARIES and (
                term.op != "while_result" or term.attrs[1] > depth):
            return False
    return True


def _trip_boxes(start: Term, depth: int, pos: int, cond: Term, step: Term, reads: list[Term],
                writes: list[Term], shape: tuple[int, ...], sizes: tuple[int, ...]
                ) -> list[tuple[int, ...]] | None:
    """The clamped start of the window each trip reads and writes, or None when they differ
    on some trip, a start or the counter is not computed from the counter alone, or the loop
    runs past `MAX_FILL_TRIPS`."""
    counter = splat_value(start)
    if counter is None or start.shape != ():
        return None
    key = ("loopvar", depth, pos)
    boxes = []
    try:
        for _trip in range(MAX_FILL_TRIPS + 1):
            env = {key: np.array(counter, dtype=object)}
            if not bool(evaluate_term(cond, env)):
                return boxes
            at = [_clamped(evaluate_term(t, env), n, s) for t, n, s in zip(reads, shape, sizes)]
            if at != [_clamped(evaluate_term(t, env), n, s)
                      for t, n, s in zip(writes, shape, sizes)]:
                return None
            boxes.append(tuple(at))
            counter = int(evaluate_term(step, env))
    except (SemanticsError, KeyError, TypeError, ValueError):
        return None
    return None


def _clamped(value, n: int, size: int) -> int:
    return min(max(int(value), 0), n - size)


def _covers(boxes: list[tuple[int, ...]], shape: tuple[int, ...],
            sizes: tuple[int, ...]) -> bool:
    """The windows of `sizes` at `boxes` cover every element of `shape`: at most one dim is
    windowed (the others whole), and its intervals leave no gap."""
    windowed = [d for d, (n, s) in enumerate(zip(shape, sizes)) if s < n]
    if not boxes or len(windowed) > 1:
        return False
    if not windowed:
        return True
    (d,) = windowed
    reach = 0
    for lo in sorted(b[d] for b in boxes):
        if lo > reach:
            return False
        reach = max(reach, lo + sizes[d])
    return reach >= shape[d]
