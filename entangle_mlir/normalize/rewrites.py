"""The exact rewrites of numerical idioms, applied until none applies (`rewrite_idioms`).

Two sets of rewrites by op name: the forward's (`forward_rewrites`: `one_hot.REWRITES`, a
one-hot contracted, picked or spread as a gather or scatter; `idioms.REWRITES`, psum as
all_gather + sum, log-sum-exp shifts, the online softmax; `permutation.REWRITES`, rows
permuted and put back), and the online softmax's backward
(`online_backward.REWRITES`), which joins in once the forward's are done, in a module that
passes blocks around a ring (a collective_permute).

The rewrites are applied one at a time, always at the first op in walk order that one fires
on. A `Worklist` finds that op without retrying every op after every rewrite (which was
quadratic in the length of a ring): an op whose rewrite did not fire is retried only once
something its attempt read has changed (`match.reading`, `match.editing`).

Termination, by construction: `Worklist.rewrite_one` returns as soon as an attempt changed
the module, and only a change makes an op pending again, so one call makes at most as many
attempts as ops are pending when it starts (each attempt takes one off, none is added); and
`rewrite_idioms` calls it at most `budget(ops)` times after a change (a number linear in the
module's size, far above what any ring needs). A rewrite that does not fire must leave the
module as it was (it decides before it edits); one that breaks this still counts as a change,
so it cannot keep the worklist busy without spending the budget.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from jaxlib.mlir import ir

from entangle_mlir.mlir.compat import block_argument
from entangle_mlir.mlir.ir import op_key, ops_in_order, producer
from entangle_mlir.normalize import idioms, one_hot, online_backward, permutation
from entangle_mlir.normalize.finite import active, judging
from entangle_mlir.normalize.match import Edits, Reads, editing, erasures, reading


def rewrite_idioms(module: ir.Module, ops: list | None = None, audit: bool = False,
                   stats: dict | None = None) -> int:
    """Apply the rewrites in place until none applies; the number applied. (One rewrite at a
    time, at the first op in walk order that one fires on: a `Worklist`.) `ops`: the
    module's ops as `ir.ops_in_order` lists them now (stands for the first walk). The online
    softmax's backward rewrites (`online_backward.py`) join in once the forward's are done,
    in a module that passes blocks around a ring (a collective_permute), unless the fold of
    an online softmax was refused (`finite.Refusal.root`): they telescope its corrections
    into the final max the fold produces, so without the fold they lead to no proof (and
    would try every backward op after each rewrite). The finiteness judge's memos
    (`finite.Finiteness`) live through the rewrites, forgetting the values of the ops each
    one erases. At most `budget(ops)` rewrites: then it stops (soundly, every rewrite being
    exact; a proof may be lost, never made). `audit`: after every attempt, compare the
    worklist's ops with a walk of the module, and fail on an attempt that edited without
    firing (tests); `stats` (updated): the number of rewrites tried ("attempts").""" 
    count = 0
    states: set[int] = set()
    with judging() as finiteness, ir.Location.unknown(), erasures() as erased, \
            editing() as edits, finiteness.tracked_cones():
        finiteness.forget()
        roots = finiteness.root_refusals()
        work = Worklist(module, ops, erased, edits, audit)
        limit = budget(len(work.ops))
        every = cycle_interval(len(work.ops))
        try:
            forward = forward_rewrites()
            work.start(forward)
            while count < limit and work.rewrite_one():
                count += 1
                if count % every == 0 and _cycled(module, states):
                    return count
            if count >= limit or not work.has("stablehlo.collective_permute") or (
                    finiteness.root_refusals() > roots):
                return count
            backward = online_backward.REWRITES
            both = {name: _either(forward.get(name), backward.get(name))
                    for name in {*forward, *backward}}
            work.start(both)
            while count < limit and work.rewrite_one():
                count += 1
                if count % every == 0 and _cycled(module, states):
                    return count
        finally:
            if stats is not None:
                stats["attempts"] = stats.get("attempts", 0) + work.attempts
            if count:
                valid(module)
    return count


class InvalidRewrite(RuntimeError):
    """A rewrite built an op StableHLO's verifier rejects: a defect of the rewrite, never read
    further (the walk would give the malformed op some meaning)."""


def valid(module: ir.Module) -> None:
    """Raise `InvalidRewrite` unless the rewritten module verifies."""
    try:
        ok = module.operation.verify()
    except ir.MLIRError as err:
        first = next((d.message for d in err.error_diagnostics), str(err))
        raise InvalidRewrite(f"a rewrite built an invalid module: {first}") from None
    if not ok:
        raise InvalidRewrite("a rewrite built an invalid module")


_CYCLE_CHECK = 25
"""The fewest rewrites between two comparisons of the module's shape with the earlier ones'."""


def cycle_interval(ops: int) -> int:
    """Rewrites between two comparisons of the module's shape (`_cycled`) in a module of
    `ops` ops: a comparison walks the module, so at most about 16 of them per rewrite per
    op (a ring takes under 1 rewrite per op: 16 walks in all, where one every 25 rewrites
    made the checks quadratic in the ring's length). A cycle of period p is still found
    after p comparisons of it (any two states p rewrites apart are equal), within
    `budget`'s 4 rewrites per op while p is under 64."""
    return max(_CYCLE_CHECK, ops // 16)


def budget(ops: int) -> int:
    """The most rewrites `rewrite_idioms` applies to a module of `ops` ops: 4 per op + 64
    (ring attention training takes under 1 per op: 0.36 / 0.53 / 0.68 at cp 4 / 8 / 16, 180
    per ring step; a rewrite that keeps firing on what it builds is stopped after this
    many)."""
    return 4 * ops + 64


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
            ref = index.get(v)
            if ref is None:
                argument = block_argument(v)
                ref = ("arg", argument.arg_number) if argument is not None else None
            refs.append(ref)
        results = op.results
        at = len(shape)
        for i, r in enumerate(results):
            index[r] = (at, i)
        shape.append((op.name, tuple(refs), tuple(results.types)))  # types are uniqued
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    state = hash(tuple(shape))
    if state in states:
        return True
    states.add(state)
    return False


def _either(first, second):
    """Try `first`, then `second` (either may be None)."""
    return lambda op: bool(first and first(op)) or bool(second and second(op))


def _joined(*tables: dict) -> dict:
    """The rewrites of several tables by op name, each op's tried in the tables' order."""
    joined: dict = {}
    for table in tables:
        for name, rewrite in table.items():
            joined[name] = _either(joined.get(name), rewrite)
    return joined


def forward_rewrites() -> dict:
    """The forward's rewrites: the one-hot's gathers and scatters, the numerical idioms, rows
    permuted and put back (each op's tried in that order). Joined at each call, so a table
    patched by a test is the one used."""
    return _joined(one_hot.REWRITES, idioms.REWRITES, permutation.REWRITES)


class _Place:
    """An op's place in the module's walk order (post-order: the ops nested in an op's
    regions before the op), for the worklist's heap: its chain of ancestors, each with its
    key (`ir.op_key`), block and, below its parent, the index of the region holding it (kept
    per op in `chains`: an op is pushed again after each rewrite that wakes it); `index`,
    its position in the first walk if it was there (ops never move, so two such positions
    compare as the ops do)."""

    __slots__ = ("_chain", "_chains", "index", "key", "op")

    def __init__(self, op: ir.Operation, key: int, index: int | None = None,
                 chains: dict | None = None) -> None:
        self.op = op
        self.key = key
        self.index = index
        self._chains = chains if chains is not None else {}
        self._chain: list | None = None

    def chain(self) -> list:
        if self._chain is None:
            found = self._chains.get(self.key)
            if found is None:
                found = []
                op = self.op
                while op is not None and op.name != "builtin.module":
                    parent = op.parent
                    parent = parent.operation if parent is not None else None
                    block = op.block
                    region = 0
                    if parent is not None and len(parent.regions) > 1:
                        region = next(i for i, r in enumerate(parent.regions)
                                      if any(b == block for b in r.blocks))
                    found.append((op_key(op), op, block, region))
                    op = parent
                found.reverse()
                self._chains[self.key] = found
            self._chain = found
        return self._chain

    def __lt__(self, other: _Place) -> bool:
        if self.index is not None and other.index is not None:
            return self.index < other.index
        for (ka, a, block_a, region_a), (kb, b, block_b, region_b) in zip(self.chain(),
                                                                          other.chain()):
            if ka == kb:
                continue
            if region_a != region_b or block_a != block_b:
                return region_a < region_b
            return a.is_before_in_block(b)
        return len(self.chain()) > len(other.chain())  # nested in the other: walked first


class Worklist:
    """The module's ops and, for each op a rewrite was tried on and did not fire on, what
    that attempt read (`match.Reads`): the ops it reached and the ops whose uses it listed.
    The attempt is retried only once one of those changed (`match.Edits`: another operand
    or attribute, other uses, erased), so each round tries only the ops a rewrite may have
    affected, in walk order, and stops at the first one that fires: the same rewrite, at the
    same op, as trying every op from the top (the attempts are otherwise pure: the
    finiteness memos keep what they computed, `match.operands_first`). New ops are found
    from the values a rewrite gave new uses to (`Edits.installed`)."""

    def __init__(self, module: ir.Module, listed: list | None, erased: set[int],
                 edits: Edits, audit: bool = False) -> None:
        self.module = module
        self.erased = erased
        self.edits = edits
        self.audit = audit
        self.ops: dict[int, ir.Operation] = {op_key(op): op for _, op in (
            listed if listed is not None else ops_in_order(module))}
        self._walked = {key: i for i, key in enumerate(self.ops)}
        self.rewrites: dict[str, Callable] = {}
        self.attempts = 0
        self._reads: dict[int, tuple[set[int], set[int]]] = {}
        self._readers: dict[int, set[int]] = {}
        self._use_readers: dict[int, set[int]] = {}
        self._pending: set[int] = set()
        self._heap: list[_Place] = []
        self._chains: dict[int, list] = {}

    def has(self, name: str) -> bool:
        """Some op of the module is named `name`."""
        return any(op.name == name for op in self.ops.values())

    def start(self, rewrites: dict[str, Callable]) -> None:
        """Try `rewrites` from now on: every op they name is pending."""
        self.rewrites = rewrites
        self._reads.clear()
        self._readers.clear()
        self._use_readers.clear()
        self._pending = set()
        self._heap = []
        for key, op in self.ops.items():
            if op.name in rewrites:
                self._pending.add(key)
                self._heap.append(_Place(op, key, self._walked.get(key), self._chains))
        heapq.heapify(self._heap)

    def rewrite_one(self) -> bool:
        """Try the pending ops in walk order until a rewrite fires on one (True) or none is
        left (False). Also True after an attempt that edited the module without firing
        (which breaks the rewrites' contract; `audit` fails on it): ops are made pending
        only here, after a change, so each call makes at most as many attempts as ops were
        pending when it began."""
        finiteness = active()
        while self._heap:
            place = heapq.heappop(self._heap)
            key = place.key
            if key not in self._pending:
                continue
            self._pending.discard(key)
            self._forget_reads(key)
            op = self.ops[key]
            finiteness.attempt()
            self.attempts += 1
            with reading() as reads:
                fired = self.rewrites[op.name](op)
            gone = set(self.erased)
            if self.erased:
                finiteness.forget_erased(self.erased)
                self.erased.clear()
            if self.audit and not fired and (gone or self.edits):
                raise AssertionError(f"a rewrite of {op.name} that did not fire edited the "
                                     "module")
            changed = bool(fired or gone or self.edits)
            if changed:
                finiteness.fired([op for k, op in self.edits.changed.items()
                                  if k not in gone])
                self._absorb(key, gone)
            else:
                reads.ops.add(op)
                self._remember_reads(key, reads)
            if self.audit:
                self._check_ops()
            if changed:
                return True
        return False

    def _remember_reads(self, key: int, reads: Reads) -> None:
        ops, uses = self._reads[key] = reads.keys()
        for k in ops:
            self._readers.setdefault(k, set()).add(key)
        for k in uses:
            self._use_readers.setdefault(k, set()).add(key)

    def _forget_reads(self, key: int) -> None:
        reads = self._reads.pop(key, None)
        if reads is None:
            return
        ops, uses = reads
        for k in ops:
            readers = self._readers.get(k)
            if readers is not None:
                readers.discard(key)
        for k in uses:
            readers = self._use_readers.get(k)
            if readers is not None:
                readers.discard(key)

    def _absorb(self, fired_key: int, gone: set[int]) -> None:
        """Take in one rewrite's edits: forget the erased ops, find the new ones, and make
        pending every op whose last attempt read what changed."""
        edits = self.edits
        wake: set[int] = set()
        stale = bool(gone & self._pending)
        for key in gone:
            self.ops.pop(key, None)
            self._walked.pop(key, None)
            self._chains.pop(key, None)
            self._forget_reads(key)
            self._pending.discard(key)
            wake |= self._readers.pop(key, set())
            wake |= self._use_readers.pop(key, set())
        changed = {k: op for k, op in edits.changed.items() if k not in gone}
        touched = {k: op for k, op in edits.touched.items() if k not in gone}
        roots = [op for k, op in edits.installed.items() if k not in gone]
        edits.clear()
        roots += changed.values()
        new = self._discover(roots, touched)
        for key in changed:
            wake |= self._readers.pop(key, set())
        for key in touched:
            wake |= self._use_readers.pop(key, set())
        wake |= {k for k, op in new.items() if op.name in self.rewrites}
        if fired_key in self.ops:
            wake.add(fired_key)
        if stale:  # an erased op must not be compared (its handle is gone)
            self._heap = [place for place in self._heap if place.key in self._pending]
            heapq.heapify(self._heap)
        for key in wake:
            op = self.ops.get(key)
            if op is None or key in self._pending or op.name not in self.rewrites:
                continue
            self._forget_reads(key)
            self._pending.add(key)
            heapq.heappush(self._heap, _Place(op, key, self._walked.get(key), self._chains))

    def _discover(self, roots: list[ir.Operation], touched: dict[int, ir.Operation]
                  ) -> dict[int, ir.Operation]:
        """The ops not known yet among `roots` and their producers, transitively (a rewrite's
        new ops, with the ops nested in their regions), added to `ops`; the known producers
        they use are `touched` (updated: they gained uses)."""
        new: dict[int, ir.Operation] = {}
        stack = list(roots)
        while stack:
            op = stack.pop()
            key = op_key(op)
            if key in self.ops:
                continue
            self.ops[key] = new[key] = op
            for value in op.operands:
                source = producer(value)
                if source is None:
                    continue
                if op_key(source) in self.ops:
                    touched[op_key(source)] = source
                else:
                    stack.append(source)
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        inner.operation.walk(
                            lambda nested: (stack.append(nested), ir.WalkResult.ADVANCE)[1])
        return new

    def _check_ops(self) -> None:
        """The ops known are the module's (`audit`)."""
        walked = {op_key(op): name for name, op in ops_in_order(self.module)}
        if walked.keys() != self.ops.keys():
            unknown = sorted({walked[k] for k in walked.keys() - self.ops.keys()})
            lost = len(self.ops.keys() - walked.keys())
            raise AssertionError(f"the worklist misses ops {unknown} and holds {lost} gone")
