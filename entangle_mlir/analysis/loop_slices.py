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

import math

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core.terms import (
    Term,
    make_loopvar,
    make_op,
    post_order,
    rebuild,
    splat_value,
    subterms,
)
from entangle_mlir.rules.gather_scatter import DUS, SCATTER
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
    """`x` when carry `k` of a loop slice (`yields`, `inits` in slice order, loop variables
    numbered within it) is a buffer every trip overwrites with the window of a loop-invariant
    `x` at the same place, and the trips together cover the whole buffer:
    `b = dynamic_update_slice(b, dynamic_slice(x, s(i)), s(i))` (or a scatter of that window
    at `s(i)`, `b.at[i].set(x[i])`) where the other carries are integer counters: e.g. the
    residual jax's scan stacks of per-layer weights, which is the stacked weights again.
    Whatever `b` held before is overwritten; where trips overlap they write the same values of
    `x`. The counters are run concretely from their constant inits while the condition holds
    (at most `MAX_FILL_TRIPS` trips), the windows' starts evaluated at each trip as the ops
    take them (dynamic slices clamp; a scatter's window must fit). None: not such a loop, or
    a trip not matched."""
    buffer = yields[k]
    if buffer.args[:1] != (make_loopvar(depth, k, buffer.shape, buffer.dtype),):
        return None
    write = _write(buffer)
    if write is None:
        return None
    writes, sizes, window = write
    if window.op == "reshape":
        window = window.args[0]
    if window.op != "dynamic_slice" or window.shape != sizes or \
            window.args[0].shape != buffer.shape:
        return None
    x, *reads = window.args
    counters = [j for j in range(len(yields)) if j != k]
    if not _invariant(x, depth) or any(
            inits[j].shape != () or splat_value(inits[j]) is None for j in counters):
        return None
    boxes = _trip_boxes({j: splat_value(inits[j]) for j in counters},
                        {j: yields[j] for j in counters}, depth, cond, reads, writes, sizes,
                        buffer.shape)
    return x if boxes is not None and _covers(boxes, x.shape, sizes) else None


def _write(buffer: Term) -> tuple[tuple[Term | None, ...], tuple[int, ...], Term] | None:
    """(start of each dim, window sizes, the window written) of a buffer's one write: a
    dynamic_update_slice, or a replacing scatter of one window at one index vector (None
    starts: the dims the scatter does not index, from 0)."""
    if buffer.op == DUS:
        return tuple(buffer.args[2:]), buffer.args[1].shape, buffer.args[1]
    if buffer.op != SCATTER:
        return None
    attrs = dict(buffer.attrs)
    indices, update = buffer.args[1], buffer.args[2]
    indexed = tuple(attrs["scatter_dims_to_operand_dims"])
    if attrs["reducer"] != "replace" or attrs["input_batching_dims"] or \
            indices.shape != (len(indexed),) or attrs["index_vector_dim"] != 0 or \
            tuple(attrs["inserted_window_dims"]) != indexed or \
            tuple(attrs["update_window_dims"]) != tuple(range(len(update.shape))) or \
            len(update.shape) + len(indexed) != len(buffer.shape):
        return None
    sizes = tuple(1 if d in indexed else n for d, n in zip(
        range(len(buffer.shape)), _spread(update.shape, indexed, len(buffer.shape))))
    if math.prod(sizes) != math.prod(update.shape):
        return None
    starts = tuple(make_op("slice", (indices,), ((indexed.index(d),), (indexed.index(d) + 1,),
                                                 (1,)), (1,), indices.dtype, linear_in=0)
                   if d in indexed else None for d in range(len(buffer.shape)))
    return starts, sizes, update


def _spread(shape: tuple[int, ...], inserted: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` with a unit dim at each of `inserted` (a window's sizes in the operand)."""
    dims = iter(shape)
    return tuple(1 if d in inserted else next(dims, 0) for d in range(rank))


def _invariant(x: Term, depth: int) -> bool:
    """`x` reads nothing the loop at `depth` (or one nested in it) changes."""
    for term in subterms([x]):
        if term.op == "loopvar" and term.attrs[0] >= depth or term.op in SUMMARIES and (
                term.op != "while_result" or term.attrs[1] > depth):
            return False
    return True


def _trip_boxes(counters: dict[int, object], steps: dict[int, Term], depth: int, cond: Term,
                reads: list[Term], writes: tuple[Term | None, ...], sizes: tuple[int, ...],
                shape: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """The start of the window each trip writes, or None when a trip writes elsewhere than it
    reads or a scatter's window out of bounds, a start or the condition reads more than the
    counters, or the loop runs past `MAX_FILL_TRIPS`."""
    boxes = []
    try:
        for _trip in range(MAX_FILL_TRIPS + 1):
            env = {("loopvar", depth, j): np.array(v, dtype=object) for j, v in counters.items()}
            if not bool(evaluate_term(cond, env)):
                return boxes
            at = [_clamped(evaluate_term(t, env), n, s) for t, n, s in zip(reads, shape, sizes)]
            if _put(writes, env, shape, sizes) != at:
                return None
            boxes.append(tuple(at))
            counters = {j: _scalar(evaluate_term(t, env)) for j, t in steps.items()}
    except (SemanticsError, KeyError, TypeError, ValueError):
        return None
    return None


def _put(writes: tuple[Term | None, ...], env: dict, shape: tuple[int, ...],
         sizes: tuple[int, ...]) -> list[int]:
    """Where a write's window lands: a dynamic_update_slice clamps its starts (all given); a
    scatter's (its unindexed dims None, from 0) must fit, since StableHLO leaves a window out
    of bounds to the implementation (ValueError)."""
    if all(t is not None for t in writes):
        return [_clamped(evaluate_term(t, env), n, s) for t, n, s in zip(writes, shape, sizes)]
    at = [0 if t is None else _scalar(evaluate_term(t, env)) for t in writes]
    if not all(0 <= a <= n - s for a, n, s in zip(at, shape, sizes)):
        raise ValueError("a scatter window out of bounds")
    return at


def _scalar(value) -> int:
    return int(np.asarray(value).reshape(-1)[0])


def _clamped(value, n: int, size: int) -> int:
    return min(max(_scalar(value), 0), n - size)


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
