"""Loops by invariant in the general tier (docs/architecture.md, "Loops by invariant").

A counted loop (`for (i = start; i < limit; i += 1)`: what `fori_loop` and `scan` lower to)
is not expanded trip by trip. Its body is expanded ONCE on every device, with the step index
`i` and every carried value as fresh symbolic leaves (`L[k, d]`: carry k on device d at step
i). Each device's yield of each carry is then a term `Y[k, d](i, L)`, built by the same rules
as every other op (their instances checked by Z3 like any other): the relation of the carries
at step i + 1 to those at step i, for EVERY step i and every value of the carries, since the
leaves are free. That relation is the loop's invariant, read per carry (`Kind`): a constant,
a counter, a sum over the steps before i (`acc + g(i)`), a block rotating around a ring of
devices (`ppermute`), a buffer written at an index computed from i, or a function of the
other carries at step i - 1 (a pipeline stage's input: the previous stage's output a step
earlier). It is printed as `entangle.invariant` on the loop and as a note of the report.

The carried values at the exit are the invariant read at the trip count: every leaf is
substituted by the value it stands for and integer parts are folded (`instantiate`; exact:
a substitution into terms the rules built for all values of their leaves, and integer
arithmetic evaluated as the ops compute it), step after step from the loop's inputs. No rule
runs and no collective is combined again: the cost of the rules and their Z3 checks does not
grow with the trip count, only the size of the terms the exit values are (a sum over 128
micro-batches has 128 parts; the reference comparison needs each).

The base case is checked against the first trips run concretely (`BASE_TRIPS`, the
expansion's own trip-by-trip path; the outermost loop only, so nesting costs linear time in
its depth): every carried value must be the same term. Anything outside this (a loop that is not counted, a body the symbolic index does not expand, a
mismatch at the base) falls back to trip-by-trip expansion within its bound: it costs a
proof, never makes one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from entangle_mlir.analysis.general.values import (
    MAX_CONCRETE,
    Local,
    NotExpanded,
    concrete_term,
    integral,
)
from entangle_mlir.core.normal_form import normal_form, slice_term, update_slice
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    Term,
    intern,
    linear_parts,
    make_arg,
    make_lin,
    make_op,
    make_splat,
    pretty,
    rebuild,
    splat_value,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.normalize.unroll import Counter, loop_counter
from entangle_mlir.rules.gather_scatter import DUS, make_dynamic_update_slice
from entangle_mlir.semantics.element import SemanticsError
from entangle_mlir.semantics.evaluate import evaluate_term

if TYPE_CHECKING:
    from jaxlib.mlir import ir

    from entangle_mlir.core.mesh import Mesh

LEAF_BASE = 700_000_000
"""Argument indices of the loop leaves (the step index, the carried values at step i): above
`terms.HOLE_BASE` (so no valid-index range is read for them), below the instance checker's
`ABSTRACT_BASE`."""

_leaves = itertools.count(LEAF_BASE)

BASE_TRIPS = 2
"""Trips run concretely to check the invariant's base case; loops of at most this many trips
are simply run."""

MAX_TERM_WORK = 4_000_000
"""The most term nodes the exit values may be rebuilt from, over all loops solved by
invariant (the leaves' substitution visits each node of the body's yields once a step)."""


class NotSolved(Exception):
    """The loop is outside what the invariant handles (the reason is kept in the stats)."""


@dataclass(frozen=True)
class Kind:
    """How one carry on one device relates to the carries a step earlier (`Y[k, d]`).

    `name`: "constant" (it is its own leaf); "count" (`L[k, d] + c`, c a constant: another
    step counter, `fori_loop`'s own beside the while's); "sum" (`L[k, src] + g`, g not
    reading L[k, src]: a sum over the steps before i, handed on from device `src` when it
    is another one); "rotate" (`L[k, src]`: the value device src held a step earlier);
    "buffer" (`dynamic_update_slice(L[k, d], u, starts)`); "step" (not reading L[k, d]: a
    function of i and the carries `reads` a step earlier, as a pipeline stage's input is the
    previous stage's output); or "recurrence" (anything else: still exact, stepped term by
    term). `reads`: the other (carry, device) leaves the yield holds."""

    name: str
    src: int | None = None
    reads: tuple[tuple[int, int], ...] = ()
    step: object = None
    """Of a "count": what it adds every step."""


@dataclass
class LoopStats:
    """What the loops solved by invariant cost (merged into the expansion's stats)."""

    solved: int = 0
    trips: int = 0
    term_work: int = 0
    fallbacks: list[str] = field(default_factory=list)
    invariants: list[str] = field(default_factory=list)
    solving: int = 0
    """Loops being solved now (a loop met while another is solved is nested in it)."""


def solve_loop(expansion, op: ir.Operation, info: OpInfo, ins: list[list[Local]], env: dict,
               mesh: Mesh) -> list[list[Local]] | None:
    """The carried values after `op` on every device, by its invariant; None where the loop
    is not solved so (then the caller runs it trip by trip). `expansion`: the per-device
    expansion running the loop (`expand.Expansion`: it expands the body once, and the base
    trips)."""
    stats = _stats(expansion)
    stats.solving += 1
    try:
        solver = LoopSolver(expansion, op, info, ins, env, mesh, nested=stats.solving > 1)
        results = solver.solve()
    except NotSolved as why:
        stats.fallbacks.append(str(why))
        return None
    except NotExpanded as why:
        stats.fallbacks.append(f"the body at a symbolic step: {why.reason}")
        return None
    finally:
        stats.solving -= 1
    stats.solved += 1
    stats.trips += solver.trips
    text = solver.describe()
    where = f"the loop at {info.loc}" if info.loc else "a loop"
    line = f"{where} is read by its invariant over {solver.trips} trips: {text}"
    if line not in stats.invariants:
        stats.invariants.append(line)
    expansion.record_invariant(op, text)
    return results


def _stats(expansion) -> LoopStats:
    """The loop statistics the expansion keeps (`Expansion.loop_stats`)."""
    return expansion.loop_stats


class LoopSolver:
    """One counted loop on every device of a per-device expansion, solved by its invariant."""

    def __init__(self, expansion, op: ir.Operation, info: OpInfo, ins: list[list[Local]],
                 env: dict, mesh: Mesh, nested: bool = False):
        """`nested`: met while another loop is solved (`_check_base`)."""
        self.expansion = expansion
        self.nested = nested
        self.op = op
        self.info = info
        self.ins = ins
        self.env = env
        self.mesh = mesh
        self.n = mesh.num_devices
        self.trips = 0
        self.kinds: dict[tuple[int, int], Kind] = {}
        self.constant: set[int] = set()

    # ----- the loop's shape -----------------------------------------------------------

    def _counter(self) -> tuple[Counter, int]:
        counter = loop_counter(self.op)
        if counter is None:
            raise NotSolved("not a counted loop (i < constant, i += 1)")
        starts = {tuple(int(v) for v in local.values.flat) if local.values is not None
                  else None for local in self.ins[counter.index]}
        if len(starts) != 1 or None in starts:
            raise NotSolved("the counter does not start at one constant on every device")
        ((start,),) = starts
        return counter, start

    def solve(self) -> list[list[Local]]:
        counter, start = self._counter()
        self.counter, self.start = counter, start
        trips = counter.trips(start)
        self.trips = trips
        if trips <= BASE_TRIPS:
            raise NotSolved(f"{trips} trips: run concretely")
        body = self.op.regions[1].blocks[0]
        terminator = body.operations[len(body.operations) - 1].operation
        yielded = list(terminator.operands)
        if len(yielded) != len(self.ins):
            raise NotSolved("the body yields other values than the loop carries")
        self.constant = {k for k, (arg, out) in enumerate(zip(body.arguments, yielded))
                         if arg == out}
        k0 = counter.index
        dtype = self.ins[k0][0].dtype
        index = make_arg(next(_leaves), (), dtype)
        floor = index.serial  # every leaf, and every term holding one, is built after it
        leaves: list[list[Local] | None] = []
        for k, values in enumerate(self.ins):
            if k in self.constant:
                leaves.append(None)
            elif k == k0:
                leaves.append([Local(dtype, (), term=index)] * self.n)
            else:
                leaves.append([Local(v.dtype, v.shape, term=make_arg(next(_leaves), v.shape,
                                                                      v.dtype))
                               for v in values])
        for k, values in enumerate(leaves):
            if values is not None and k != k0:
                self.expansion.pair_leaves(values)
        args = [self.ins[k] if leaves[k] is None else leaves[k] for k in range(len(self.ins))]
        yields = self.expansion._expand_block(body, self.env, self.mesh, self.info, args)
        step = make_lin([(Fraction(1), index)], Fraction(1), (), dtype)
        if any(local.as_term() is not step for local in yields[k0]):
            raise NotSolved("the counter's yield is not i + 1")
        self.index, self.floor = index, floor
        live = [k for k in range(len(self.ins)) if leaves[k] is not None and k != k0]
        leaf_of = {leaves[k][d].term.serial: (k, d) for k in live for d in range(self.n)}
        self.yields = {(k, d): yields[k][d].as_term() for k in live for d in range(self.n)}
        self.leaf_terms = {(k, d): leaves[k][d].term for k in live for d in range(self.n)}
        self.leaf_of = leaf_of
        for node, term in self.yields.items():
            self.kinds[node] = self._kind(node, term)
        leaf_serials = {index.serial} | {leaf.serial for leaf in self.leaf_terms.values()}
        self.keep = leafless(list(self.yields.values()), floor, leaf_serials)
        carried = self._run(start, trips, live)
        self._check_base(start)
        results = self._results(carried, live, start + trips)
        # The exit values on gamma . r are r's renamed when the inputs and the step's yields
        # are (induction over the steps; `symmetry.py`).
        self.expansion.record_coherent(self.ins + [yields[k] for k in live], results)
        return results

    # ----- reading the invariant --------------------------------------------------------

    def _reads(self, term: Term) -> set[tuple[int, int]]:
        """The carries (k, d) whose leaves `term` holds."""
        found: set[tuple[int, int]] = set()
        for t in _above(term, self.floor):
            node = self.leaf_of.get(t.serial)
            if node is not None:
                found.add(node)
        return found

    def _kind(self, node: tuple[int, int], term: Term) -> Kind:
        k = node[0]
        if term is self.leaf_terms[node]:
            return Kind("constant")
        reads = self._reads(term)
        source = self.leaf_of.get(term.serial)
        if source is not None and source[0] == k:
            return Kind("rotate", src=source[1])
        if term.op == "lin":
            pairs, _ = linear_parts(term)
            mine = [(c, t) for c, t in pairs if self.leaf_of.get(t.serial, (None,))[0] == k]
            if len(mine) == 1 and mine[0][0] == 1:
                src = self.leaf_of[mine[0][1].serial]
                rest = [t for _, t in pairs if t is not mine[0][1]]
                if not rest and src == node:
                    return Kind("count", step=linear_parts(term)[1])
                if not any(src in self._reads(t) for t in rest):
                    return Kind("sum", src=src[1], reads=tuple(sorted(reads - {src})))
        others = tuple(sorted(reads - {node}))
        if node not in reads:
            return Kind("step", reads=others)
        if term.op == DUS and term.args[0] is self.leaf_terms[node]:
            return Kind("buffer", reads=others)
        return Kind("recurrence", reads=others)

    def describe(self) -> str:
        """The invariant in words, carry by carry: what each carry at step i + 1 is made of
        on every device, devices read relative to the device itself (`stages-1`: the previous
        one along the axis `stages`, modulo its size); devices alike are listed once."""
        end = self.start + self.trips
        parts = [f"#{self.counter.index}: step index i in [{self.start}, {end})"]
        for k in sorted({k for k, _ in self.kinds}):
            texts = [_kind_text(self.kinds[(k, d)], d, self.mesh) + self._windows((k, d))
                     for d in range(self.n)]
            groups: dict[str, list[int]] = {}
            for d, text in enumerate(texts):
                groups.setdefault(text, []).append(d)
            if len(groups) == 1:
                parts.append(f"#{k}: {texts[0]}")
                continue
            parts.append(f"#{k}: " + "; ".join(
                f"{text} on {_devices(ds)}" for text, ds in groups.items()))
        if self.constant:
            parts.append(f"#{', #'.join(str(k) for k in sorted(self.constant))}: "
                         "loop-invariant")
        return "; ".join(parts)

    def _windows(self, node: tuple[int, int]) -> str:
        """The loop-invariant values the yield reads a window of at an offset computed from
        the step (`, reading windows of xs at i`: a shifted micro-batch, a rotating block)."""
        if self.kinds[node].name == "constant":
            return ""
        found: list[str] = []
        for t in _above(self.yields[node], self.floor):
            if t.op != "dynamic_slice" or not self._holds_leaf(t) or self._holds_leaf(t.args[0]):
                continue
            text = pretty(t.args[0], 2)
            if text not in found:
                found.append(text)
        return f", reading windows of {', '.join(sorted(found))} at i" if found else ""

    def _holds_leaf(self, term: Term) -> bool:
        return term.serial >= self.floor and term.serial not in self.keep

    # ----- the exit values ----------------------------------------------------------------

    def _run(self, start: int, trips: int, live: list[int]) -> dict[tuple[int, int], Term]:
        """Every live carry's value after `trips` steps from the loop's inputs: the yields
        instantiated step after step (no rule runs again)."""
        dtype = self.index.dtype
        values = {(k, d): self.ins[k][d].as_term() for k in live for d in range(self.n)}
        self.history = [dict(values)]
        stats = _stats(self.expansion)
        changing = [node for node, kind in self.kinds.items() if kind.name != "constant"]
        keep = self.keep
        for j in range(start, start + trips):
            subst = {self.index.serial: make_splat(j, (), dtype)}
            for node, term in values.items():
                subst[self.leaf_terms[node].serial] = term
            memo: dict[int, Term] = {}
            work = [0]
            new = dict(values)
            for node in changing:
                new[node] = instantiate(self.yields[node], subst, self.floor, memo, work,
                                        keep)
            stats.term_work += work[0]
            if stats.term_work > MAX_TERM_WORK:
                raise NotSolved(f"exit values past {MAX_TERM_WORK} term nodes")
            values = new
            if len(self.history) <= BASE_TRIPS:
                self.history.append(dict(values))
        return values

    def _check_base(self, start: int) -> None:
        """The first `BASE_TRIPS` steps run concretely (the expansion's own path) must give
        the same carried values as the invariant. Only the outermost loop runs them: a loop
        nested in it is solved within its symbolic step and again within its base trips,
        and the outer loop's carried values after those trips hold the nested loop's exit
        values both ways; base trips at every depth would cost 3^depth bodies."""
        if self.nested:
            return
        concrete, ran = self.expansion.expand_trips(self.op, self.info, self.ins, self.env,
                                                    self.mesh, BASE_TRIPS)
        if ran != BASE_TRIPS:
            raise NotSolved("the base trips did not run")
        expected = self.history[BASE_TRIPS]
        memo: dict[int, Term] = {}
        for node, term in expected.items():
            k, d = node
            got = concrete[k][d]
            if got.values is not None and integral(got.dtype):
                value = _concrete_values(term)
                if value is None or value != tuple(int(v) for v in got.values.flat):
                    raise NotSolved(f"carry #{k} on device {d} differs from trip "
                                    f"{start + BASE_TRIPS} run concretely")
                continue
            other = got.as_term()
            if other is term or normal_form(other, memo) is normal_form(term, memo):
                continue
            raise NotSolved(f"carry #{k} on device {d} is not the term trip "
                            f"{start + BASE_TRIPS} gives when run concretely")

    def _results(self, carried: dict[tuple[int, int], Term], live: list[int],
                 end: int) -> list[list[Local]]:
        out: list[list[Local]] = []
        for k, values in enumerate(self.ins):
            if k in self.constant:
                out.append(values)
                continue
            if k == self.counter.index:
                local = values[0]
                out.append([_local(make_splat(end, (), local.dtype), local)] * self.n)
                continue
            out.append([_local(carried[(k, d)], values[d]) for d in range(self.n)])
        return out


def _local(term: Term, like: Local) -> Local:
    """An exit value as the expansion keeps it: integers with their concrete values."""
    if integral(like.dtype):
        values = _concrete_values(term)
        if values is not None:
            return Local(like.dtype, like.shape, term=term,
                         values=np.array(values, dtype=object).reshape(like.shape))
    return Local(like.dtype, like.shape, term=term)


def _concrete_values(term: Term) -> tuple[int, ...] | None:
    """The elements of an integer term without leaves, else None."""
    if not _constant(term, {}):
        return None
    try:
        return tuple(int(v) for v in evaluate_term(term, {}).flat)
    except (SemanticsError, TypeError, ValueError):
        return None


def _kind_text(kind: Kind, d: int, mesh: Mesh) -> str:
    """One carry on device d in words (see `Kind`)."""
    reads = ", ".join(f"#{k}@{_relative(e, d, mesh)}" for k, e in kind.reads)
    if kind.name == "constant":
        return "unchanged"
    if kind.name == "count":
        return f"a counter: {_fmt_step(kind.step)} each step"
    if kind.name == "sum":
        base = "" if kind.src == d else \
            f" (the running sum of device {_relative(kind.src, d, mesh)})"
        return f"sum over the steps before i{base} of a function of i" + (
            f" and {reads}" if reads else "")
    if kind.name == "rotate":
        return f"rotates: device {_relative(kind.src, d, mesh)}'s a step earlier"
    if kind.name == "buffer":
        return "buffer updated at an index computed from i" + (f" from {reads}" if reads
                                                                  else "")
    if kind.name == "step":
        return f"a function of i and {reads}" if reads else "a function of i"
    return "a recurrence" + (f" reading {reads}" if reads else "")


def _relative(e: int, d: int, mesh: Mesh) -> str:
    """Device e as seen from device d, by mesh axis, each offset modulo the axis (a ring's
    neighbour across the wrap is `ring+1` too): `d` (the same device), `stages-1`,
    `dp+1,tp-2`."""
    mine, theirs = mesh.coords(d), mesh.coords(e)
    parts = []
    for axis in mesh.names:
        size = mesh.size(axis)
        offset = (theirs[axis] - mine[axis]) % size
        if offset > size // 2:
            offset -= size
        if offset:
            parts.append(f"{axis}{offset:+d}")
    return ",".join(parts) or "d"


def _fmt_step(step) -> str:
    value = step if isinstance(step, Fraction) else Fraction(0)
    return f"+= {value}" if value >= 0 else f"-= {-value}"


def _devices(ds: list[int]) -> str:
    if len(ds) > 2 and ds == list(range(ds[0], ds[-1] + 1)):
        return f"devices {ds[0]}..{ds[-1]}"
    return ("device " if len(ds) == 1 else "devices ") + ", ".join(str(d) for d in ds)


# ----- substitution ----------------------------------------------------------------------------

def _above(term: Term, floor: int) -> Iterator[Term]:
    """The distinct subterms of `term` built after the leaf `floor` (serial >= floor; only they
    can hold a leaf made then: a term is built after its arguments)."""
    seen: set[int] = set()
    stack = [term]
    while stack:
        top = stack.pop()
        if top.serial < floor or top.serial in seen:
            continue
        seen.add(top.serial)
        yield top
        stack.extend(top.args)


def leafless(roots, floor: int, leaves: set[int]) -> set[int]:
    """The serials of the subterms of `roots` built after `floor` that hold none of `leaves`
    (terms the body built from loop-invariant values alone: every step keeps them)."""
    holds: dict[int, bool] = {}
    for root in roots:
        stack = [root]
        while stack:
            top = stack[-1]
            if top.serial in holds or top.serial < floor:
                stack.pop()
                continue
            pending = [a for a in top.args if a.serial >= floor and a.serial not in holds]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            holds[top.serial] = top.serial in leaves or any(
                holds.get(a.serial, False) for a in top.args)
    return {s for s, held in holds.items() if not held}


def instantiate(term: Term, subst: dict[int, Term], floor: int, memo: dict[int, Term],
                work: list[int] | None = None, keep: set[int] | frozenset = frozenset(),
                in_order: bool = False,
                known: Callable[[Term], Term | None] | None = None,
                built: list[tuple[Term, Term]] | None = None) -> Term:
    """`term` with every leaf in `subst` (by serial) replaced, rebuilt through the term
    builders bottom-up; integer parts whose leaves are all constants folded to their values,
    dynamic slices and updates at constant offsets made static, selects on a constant
    predicate resolved (`_rebuilt`). Terms built before `floor`, and those in `keep`
    (`leafless`), hold no leaf and are kept. `memo` (serial -> result) is shared by the
    calls of one substitution; `work[0]` counts the nodes rebuilt. `known(t)`: a result the
    caller already holds for a node (a true fact), taken without walking the node; `built`
    collects (node, result) for every node rebuilt."""
    if term.serial < floor or term.serial in keep:
        return term
    stack = [term]
    while stack:
        top = stack[-1]
        if top.serial in memo:
            stack.pop()
            continue
        if top.serial in keep:
            memo[top.serial] = top
            stack.pop()
            continue
        replaced = subst.get(top.serial)
        if replaced is None and known is not None:
            replaced = known(top)
        if replaced is not None:
            memo[top.serial] = replaced
            stack.pop()
            continue
        pending = [a for a in top.args if a.serial >= floor and a.serial not in memo]
        if pending:
            stack.extend(reversed(pending) if in_order else pending)
            continue
        stack.pop()
        args = tuple(memo.get(a.serial, a) if a.serial >= floor else a for a in top.args)
        out = memo[top.serial] = _rebuilt(top, args)
        if work is not None:
            work[0] += 1
        if built is not None:
            built.append((top, out))
    return memo[term.serial]


def _rebuilt(term: Term, args: tuple[Term, ...]) -> Term:
    """`term`'s node over new arguments (exact: each step is the op's own semantics)."""
    if all(a is b for a, b in zip(args, term.args)):
        return term
    op = term.op
    if op == "dynamic_slice":
        starts = [_int_constant(a) for a in args[1:]]
        x = args[0]
        if all(s is not None for s in starts):
            (sizes,) = term.attrs
            clamped = tuple(min(max(s, 0), n - k) for s, n, k in zip(starts, x.shape, sizes))
            limits = tuple(s + k for s, k in zip(clamped, sizes))
            return make_op("slice", (x,), (clamped, limits, (1,) * len(sizes)), tuple(sizes),
                           x.dtype, linear_in=0)
        return intern(op, args, term.attrs, term.shape, term.dtype)
    if op == DUS:
        x, update, *rest = args
        starts = [_int_constant(a) for a in rest]
        if all(s is not None for s in starts):
            clamped = [min(max(s, 0), n - k) for s, n, k in zip(starts, x.shape, update.shape)]
            return written(x, update, clamped)
        return make_dynamic_update_slice(x, update, list(rest))
    if op == "stablehlo.select":
        pred = splat_value(args[0])
        if isinstance(pred, Fraction):
            return args[1] if pred != 0 else args[2]
    out = rebuild(term, args)
    if integral(out.dtype) and out.op not in ("splat", "iota", "dense") and \
            math.prod(out.shape) <= MAX_CONCRETE and _constant(out, {}):
        try:
            values = evaluate_term(out, {})
        except (SemanticsError, TypeError, ValueError):
            return out
        return concrete_term(np.asarray(values, dtype=object).reshape(out.shape), out.dtype)
    return out


def written(x: Term, update: Term, starts: list[int]) -> Term:
    """`dynamic_update_slice(x, update, starts)` at in-range constant starts (exact). A
    buffer written along one dim (every other dim whole) stays one flat concatenation of
    its rows' pieces, the pieces the write covers replaced by the update (those it covers
    in part cut at its edges): writing micro-batch after micro-batch costs the pieces, not
    a new normal form of the whole buffer every step. Other writes are `update_slice`'s
    plain slices and concatenations."""
    cut = [d for d, (s, k, n) in enumerate(zip(starts, update.shape, x.shape)) if (s, k) != (0, n)]
    if len(cut) != 1:
        return update_slice(x, update, starts, joined=False)
    (dim,) = cut
    lo, hi = starts[dim], starts[dim] + update.shape[dim]
    pieces = list(x.args) if x.op == "concatenate" and x.attrs == (dim,) else [x]
    out: list[Term] = []
    row = 0
    for piece in pieces:
        size = piece.shape[dim]
        end = row + size
        if end <= lo or row >= hi:
            out.append(piece)
        else:
            if row < lo:
                out.append(slice_term(piece, dim, 0, lo - row))
            if row <= lo < end:
                out.append(update)
            if end > hi:
                out.append(slice_term(piece, dim, hi - row, size))
        row = end
    if len(out) == 1:
        return out[0]
    return intern("concatenate", tuple(out), (dim,), x.shape, x.dtype)


def _int_constant(term: Term) -> int | None:
    value = splat_value(term)
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return None


def _constant(term: Term, memo: dict[int, bool]) -> bool:
    """Whether every leaf of `term` is a value the evaluation knows (a splat, an iota, a
    dense constant whose values were kept)."""
    stack = [term]
    while stack:
        top = stack.pop()
        if top.serial in memo:
            if not memo[top.serial]:
                return False
            continue
        if not top.args:
            known = top.op in ("splat", "iota") or (top.op == "dense"
                                                    and top.attrs[0] in DENSE_VALUES)
            memo[top.serial] = known
            if not known:
                return False
            continue
        memo[top.serial] = True  # provisionally; a failing leaf returns False at once
        stack.extend(top.args)
    return True
