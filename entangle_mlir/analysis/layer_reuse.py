"""Whole-layer reuse: the layers of a run are walked once and summarized.

A transformer stacked by a Python loop is one flat block in which the ops of every layer
repeat with a fixed period. `find_runs` finds such runs of layers from op fingerprints alone
(op name, attributes, result types, region bodies), before anything is walked, the period
being the one with the most ops equal to the op one period on;
`OpFacts.signature` then pins a layer down exactly: the same ops, wired the same way inside
it, reading its external inputs (distinct values, in order of first use) in the same pattern.
A slice of a block argument (a layer's part of a stacked parameter, at an offset that differs
per layer) and its reshapes belong to no layer: they are walked as usual and their results
are the layer's inputs.

Two layers with equal signatures compute the same function of their external-input lists.
`LayerReuse`, which the walker (`infer.Walker`) owns and hands its per-op step and its tables,
uses this in both programs:

* the reference walks the first layer of a run once with fresh leaf terms ("holes") for the
  inputs that differ between layers (inputs every layer shares keep their own term), and
  gives each later layer's results the term `region_result(inputs_k, T)`: the template term
  T with the holes replaced by layer k's inputs;
* the sharded walk, when a repeated layer's inputs are exactly a reference layer's inputs,
  walks it once with those holes, so every rule instance it uses is proved by Z3 for all input
  values, and gives each later layer the same `region_result` terms, with the template's
  layouts, as long as the inputs keep the template's layouts. An input may also be a fixed
  view V (reshapes, transposes) of a hole's argument (XLA reads a bias slice as (1, 1, d)):
  the template then reads V(hole), and a later layer must read exactly V of its argument
  (`view_over` checks V(a) is the input term), so its values are the template's at the hole
  := its argument. An input that is not a hole's argument by identity is taken for it when
  the comparison of outputs would take it (under the valid-index assumption, up to constant
  rounding, or both at once: `LayerIndex.argument_term`), and the report says so.

Soundness rests on equal signatures (same function) and on every template rule instance
holding for all values of the holes (never taken for program inputs: the valid-index
assumption of `valid_indices.py` does not apply to them). Anything else (an input that is not
a plain relation, a changed layer) ends the summary, and the layers are walked op by op.
Where reuse is given up for good (the reuse fallback) is decided in one place, at the end:
`fallback` between tries (`walk_with_fallback`, which the pass runs), `recheck_op_by_op` after
the check (which the driver asks).

Words (docs/architecture.md): a *block* is an MLIR block, a *layer* one period of a *run* (ops
of a block repeating with one period); `OpFacts` is what reuse reads from a block's ops.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.analysis.valid_indices import ValidIndices
from entangle_mlir.core.relations import Rel, Value
from entangle_mlir.core.rounding import ASSUMPTION, describe_rounded, equal_up_to_rounding
from entangle_mlir.core.terms import (
    HOLE_BASE,
    REGION_TERMS,
    Term,
    intern,
    make_arg,
    make_reshape,
    make_transpose,
    subterms,
)
from entangle_mlir.rules.base import RuleContext

MIN_PERIOD = 8
"""Shorter repeats are not worth a summary."""

_SPECIAL = ("stablehlo.while", "sdy.manual_computation", "stablehlo.case", "stablehlo.if",
            "func.return", "stablehlo.return", "sdy.return", "func.call")
"""Ops the walker treats outside its per-op rules: never part of a summarized layer."""

_SELECTIONS = ("stablehlo.slice", "stablehlo.dynamic_slice")
_VIEWS = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")

_holes = 0


def fresh_hole(shape: tuple[int, ...], dtype: str) -> Term:
    """A leaf term standing for any value of this shape and type."""
    global _holes
    _holes += 1
    return make_arg(HOLE_BASE + _holes, shape, dtype)


def region_result(inputs: tuple[Term, ...], template: Term, holes: frozenset[int],
                  memo: dict[int, bool]) -> Term:
    """`template` with its holes replaced by `inputs`: an opaque leaf to everything else, or
    the template itself when it reads no hole (a causal mask built from iotas)."""
    if not _reads_holes(template, holes, memo):
        return template
    REGION_TERMS[template.serial] = template
    return intern("region_result", inputs, (template.serial,), template.shape,
                  template.dtype)


def _reads_holes(term: Term, holes: frozenset[int], memo: dict[int, bool]) -> bool:
    found = memo.get(term.serial)
    if found is None:
        found = memo[term.serial] = any(t.serial in holes for t in subterms([term]))
    return found


@dataclass(frozen=True)
class Run:
    """Ops [start, end) of a block repeat with `period`: a run of layers."""

    start: int
    end: int
    period: int


@dataclass
class OpFacts:
    """The ops of one MLIR block with the facts reuse needs: fingerprints, producers, last
    uses."""

    ops: list
    operands: list[list] = field(default_factory=list)
    fingerprints: list[int] = field(default_factory=list)
    position: dict = field(default_factory=dict)
    """value -> (op index, result index) for results of this block's ops."""
    last_use: dict = field(default_factory=dict)
    """value -> the largest op index (len(ops) for the terminator) that reads it."""
    prelude: set[int] = field(default_factory=set)
    """A slice of a block argument (a layer's part of a stacked parameter, at an offset that
    differs per layer) and reshapes, transposes and converts of it: they belong to no layer;
    their results are a layer's inputs."""
    reads: list[list[tuple]] = field(default_factory=list)
    """Per op, (operand, producer's op index), the index -1 for a value from outside the
    block or from a prelude op: `_read_from_outside`'s test is one comparison."""
    _external: dict = field(default_factory=dict)

    def external_inputs(self, start: int, period: int) -> list:
        """Distinct values ops [start, start+period) read from outside, in first-use order
        (prelude ops' results count as outside). Memoized: the block does not change."""
        found = self._external.get((start, period))
        if found is None:
            found = self._external[(start, period)] = self._read_from_outside(start, period)
        return found

    def _read_from_outside(self, start: int, period: int) -> list:
        seen, found, prelude, reads = set(), [], self.prelude, self.reads
        for i in range(start, start + period):
            if i in prelude:
                continue
            for v, producer in reads[i]:
                if producer < start and v not in seen:
                    seen.add(v)
                    found.append(v)
        return found

    def signature(self, start: int, period: int) -> tuple | None:
        """What makes two layers the same function of their external-input lists."""
        inputs = {v: k for k, v in enumerate(self.external_inputs(start, period))}
        out = []
        for i in range(start, start + period):
            if i in self.prelude:
                continue
            wiring = []
            for v in self.operands[i]:
                if v in inputs:
                    wiring.append(("in", inputs[v], str(v.type)))
                else:
                    where = self.position[v]
                    wiring.append((where[0] - start, where[1]))
            out.append((self.fingerprints[i], tuple(wiring)))
        return tuple(out)

    def used_outside(self, start: int, period: int) -> list:
        """Results of the layer's ops read by an op outside it."""
        end = start + period
        return [r for i in range(start, end) if i not in self.prelude
                for r in self.ops[i].results if self.last_use.get(r, -1) >= end]

    def layer_start(self, run: Run) -> int:
        """Where the run's layers should begin: the phase at which the fewest computed
        values cross into a layer (a layer boundary, where only the residual stream does),
        keeping at least three layers."""
        best, best_count = run.start, None
        last = min(run.start + run.period, run.end - 3 * run.period + 1)
        for start in range(run.start, last):
            count = sum(1 for v in self.external_inputs(start, run.period)
                        if v in self.position and self.position[v][0] not in self.prelude
                        and self.operands[self.position[v][0]])
            if best_count is None or count < best_count:
                best, best_count = start, count
        return best

    def preludes(self, start: int, period: int) -> list[int]:
        return [i for i in range(start, start + period) if i in self.prelude]


def read_ops(block: ir.Block) -> OpFacts:
    """Fingerprint every op of `block` (the terminator excluded), in one pass.

    The fingerprint (name, attributes, result types, operand count, region bodies) finds
    the period; `OpFacts.signature` adds the wiring and the input types that make equal layers
    equal functions (an internal operand's type is its producer's result type).
    """
    everything = [op.operation for op in block.operations]
    ops = everything[:-1] if everything and everything[-1].name in _SPECIAL else everything
    info = OpFacts(ops)
    position, last_use, prelude = info.position, info.last_use, info.prelude
    arguments = set(block.arguments)
    types: dict = {}
    for i, op in enumerate(everything):
        operands = list(op.operands)
        nested = len(op.regions) > 0
        for v in operands + (_nested_reads(op) if nested else []):
            last_use[v] = i
        if i == len(ops):
            break
        info.operands.append(operands)
        reads = []
        for v in operands:
            where = position.get(v)
            reads.append((v, -1 if where is None or where[0] in prelude else where[0]))
        info.reads.append(reads)
        name = op.name
        if name in _SELECTIONS and operands[0] in arguments and all(
                v in arguments or position.get(v, (-1,))[0] in prelude for v in operands) or \
                name in _VIEWS and all(position.get(v, (-1,))[0] in prelude for v in operands):
            prelude.add(i)
        info.fingerprints.append(_fingerprint(op, i, operands, nested, i in prelude, types))
        for r, result in enumerate(op.results):
            position[result] = (i, r)
    return info


def _nested_reads(op: ir.Operation) -> list:
    """Every value the ops inside `op`'s regions read."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                found.extend(inner.operands)
                if len(inner.regions):
                    found.extend(_nested_reads(inner))
    return found


def _fingerprint(op: ir.Operation, index: int, operands: list, nested: bool, prelude: bool,
                 types: dict) -> int:
    if op.name in _SPECIAL:
        return hash(("unique", index))
    result_types = tuple(_type_text(r.type, types) for r in op.results)
    if prelude:
        return hash(("prelude", op.name, result_types))
    body = _region_text(op, types) if nested else ()
    if body is None:
        return hash(("unique", index))
    return hash((op.name, _attributes(op, types), result_types, len(operands), body))


def _type_text(thing, texts: dict) -> str:
    """The printed form of a type or attribute (uniqued by MLIR: printed once per block)."""
    text = texts.get(thing)
    if text is None:
        text = texts[thing] = str(thing)
    return text


def _attributes(op: ir.Operation, texts: dict) -> tuple:
    found = []
    attributes = op.attributes
    for i in range(len(attributes)):
        named = attributes[i]
        name = named.name
        text = _type_text(named.attr, texts)
        if name == "channel_handle" and not re.search(r"handle = 0\b", text):
            text = "channel"  # XLA numbers every collective; only a 0 handle means no channel
        found.append((name, text))
    return tuple(sorted(found))


def _region_text(op: ir.Operation, texts: dict) -> tuple | None:
    """The ops of `op`'s regions, self-contained (None if they read a value from above)."""
    if not op.regions:
        return ()
    local: dict = {}
    out = []
    for region in op.regions:
        for block in region.blocks:
            for n, arg in enumerate(block.arguments):
                local[arg] = ("barg", n, _type_text(arg.type, texts))
            for inner in block.operations:
                inner = inner.operation
                if inner.regions:
                    return None
                operands = []
                for v in inner.operands:
                    if v not in local:
                        return None
                    operands.append(local[v])
                for r, result in enumerate(inner.results):
                    local[result] = ("local", len(out), r)
                out.append((inner.name, _attributes(inner, texts),
                            tuple(_type_text(r.type, texts) for r in inner.results),
                            tuple(operands)))
    return tuple(out)


def find_runs(facts: OpFacts) -> list[Run]:
    """Maximal stretches of ops that repeat with one period, at least twice, non-overlapping."""
    hashes = facts.fingerprints
    n = len(hashes)
    last: dict[int, int] = {}
    distances: Counter = Counter()
    for i, h in enumerate(hashes):
        if h in last and i - last[h] >= MIN_PERIOD:
            distances[i - last[h]] += 1
        last[h] = i
    covered = [False] * n
    runs = []
    for period in _ranked_periods(hashes, distances):
        i = 0
        while i < n - period:
            if covered[i] or hashes[i] != hashes[i + period]:
                i += 1
                continue
            j = i
            while j < n - period and hashes[j] == hashes[j + period] and not covered[j + period]:
                j += 1
            end = j + period
            if end - i >= 2 * period and not any(covered[i:end]):
                runs.append(Run(i, end, period))
                for k in range(i, end):
                    covered[k] = True
            i = j + 1
    return sorted(runs, key=lambda run: run.start)


CANDIDATE_PERIODS = 16
"""Distances between repeats considered as periods (the most frequent ones)."""


def _ranked_periods(hashes: list[int], distances: Counter) -> list[int]:
    """The four periods, best first, among the most frequent distances between repeats of a
    fingerprint: ranked by how many ops equal the op one period on. Counting distances to the
    last repeat alone favours a short repeat inside each layer (XLA's per-device layers
    repeat 10 ops within their 148) over the layer itself."""
    candidates = [p for p, count in distances.most_common(CANDIDATE_PERIODS)
                  if count >= MIN_PERIOD]
    codes = np.array(hashes, dtype=np.int64)
    matches = {p: int(np.count_nonzero(codes[:-p] == codes[p:])) for p in candidates}
    return sorted(candidates, key=lambda p: (-matches[p], p))[:4]


@dataclass
class Summary:
    """One summarized run of the reference: its holes and each layer's hole arguments."""

    holes: list[Term]
    arguments: list[tuple[Term, ...]]
    """layer k -> the terms its hole inputs take."""
    key: tuple = ()
    """Which reference run it summarizes (block size, first op)."""
    reads_holes: dict[int, bool] = field(default_factory=dict)
    """term serial -> whether it reads a hole (memo for `region_result`)."""

    @property
    def hole_serials(self) -> frozenset[int]:
        return frozenset(h.serial for h in self.holes)


@dataclass
class LayerIndex:
    """The reference's summaries, and where each hole argument occurs (for the sharded walk)."""

    summaries: list[Summary] = field(default_factory=list)
    by_term: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    """term serial -> (summary, layer, hole) for every hole argument with that term, from
    the second layer on (the reference walks the first layer op by op)."""
    summarized: int = 0
    """Layers given summary terms, in this walk."""
    templates: list[Term] = field(default_factory=list)
    """The reference templates' terms (over holes): terms the reference computes."""
    shortest_run: int = 0
    """Ops in the reference's shortest summarized run."""
    excluded: frozenset = frozenset()
    """Reference runs not to summarize (the sharded walk could not follow them before)."""
    applied: set[int] = field(default_factory=set)
    """Summaries the sharded walk used."""

    reference_outputs: list[Term] = field(default_factory=list)
    """The reference's output terms: where the valid-index assumption's ranges come from."""
    rounding: bool = False
    """A sharded input may equal a hole's argument up to float32 rounding of constants (XLA's
    per-device programs multiply by float32(1 / c) where the reference divides by c)."""
    rounded: dict[int, list] = field(default_factory=dict)
    """term serial -> the constant pairs in which it differs from the hole argument it was
    taken for (reported as a note, as the comparison of outputs does)."""
    assumed: dict[int, list[str]] = field(default_factory=dict)
    """term serial -> the valid-index assumptions (in words) under which it equals the hole
    argument it was taken for up to rounding (`_rounded_valid_argument`)."""
    _valid_indices: object = None
    _simplified: dict | None = None
    _by_shape: dict | None = None
    _by_base: dict | None = None
    _rounding_memo: dict = field(default_factory=dict)
    _combined_memo: dict = field(default_factory=dict)

    @property
    def valid_indices(self):
        """The reference's `valid_indices.ValidIndices`, built on first use: a sharded input that
        equals a hole's argument only under the valid-index assumption (a vocab-parallel
        embedding) is taken for it, and the report states the assumption, as the comparison
        of outputs does."""
        if self._valid_indices is None:
            self._valid_indices = ValidIndices(self.reference_outputs)
        return self._valid_indices

    def argument_term(self, term: Term) -> Term | None:
        """The hole argument `term` is: itself, or what the valid-index assumption makes it."""
        if term.serial in self.by_term:
            return term
        if self.rounding:
            found = self._rounded_argument(term)
            if found is not None:
                return found
        if not self.valid_indices.ranges:
            return None
        simplify = self.valid_indices.simplifier.simplify
        if self._simplified is None:
            self._simplified = {}
            for argument in self._later_arguments():
                self._simplified.setdefault(simplify(argument).serial, argument)
        found = self._simplified.get(simplify(term).serial)
        if found is None and self.rounding:
            found = self._rounded_valid_argument(term)
        return found

    def _rounded_valid_argument(self, term: Term) -> Term | None:
        """The hole argument `term` equals under both liberties at once: the valid-index
        assumption and constants rounded to their dtype (`ValidIndices.equal_up_to_rounding`,
        what the comparison of outputs decides with; memoized). XLA's per-device program of a
        model with a vocab-parallel lookup reaches a later layer with the lookup's mask and
        the attention's `x * fl(1 / sqrt(d))` in its residual stream."""
        if term.serial in self._combined_memo:
            return self._combined_memo[term.serial]
        found = None
        for argument in self._same_shape(term):
            both = self.valid_indices.equal_up_to_rounding(argument, term)
            if both is not None:
                found = argument
                self.assumed[term.serial], self.rounded[term.serial] = both
                break
        self._combined_memo[term.serial] = found
        return found

    def _later_arguments(self) -> list[Term]:
        """Every summary's hole arguments from the second layer on (the first layer's are
        the holes themselves)."""
        return [argument for summary in self.summaries for arguments in summary.arguments[1:]
                for argument in arguments]

    def hole_argument(self, term: Term) -> tuple[Term, View] | None:
        """(hole argument, view) `term` is taken for: the argument itself (`argument_term`,
        the empty view), else a view of one (`view_argument`)."""
        found = self.argument_term(term)
        return (found, ()) if found is not None else self.view_argument(term)

    def view_argument(self, term: Term) -> tuple[Term, View] | None:
        """(hole argument a, view V) with `V(a)` exactly `term`, V reshapes and transposes:
        XLA reshapes a layer's slice of a stacked parameter where the reference reads the slice
        itself (the bias (768,) as (1, 1, 768)). A template walked with `V(hole)` for the input
        computes layer k's values from `V(a_k)`, which is layer k's input when the same V
        over `a_k` gives it (`_fits`)."""
        if self._by_base is None:
            self._by_base = {}
            for argument in self._later_arguments():
                same = self._by_base.setdefault(_view_base(argument).serial, [])
                if argument not in same:
                    same.append(argument)
        for argument in self._by_base.get(_view_base(term).serial, []):
            view = view_over(term, argument)
            if view is not None:
                return argument, view
        return None

    def _rounded_argument(self, term: Term) -> Term | None:
        """The hole argument `term` equals but for constants that are the argument's rounded to
        their dtype (`equal_up_to_rounding`, memoized)."""
        if term.serial in self._rounding_memo:
            return self._rounding_memo[term.serial]
        found = None
        for argument in self._same_shape(term):
            pairs = equal_up_to_rounding(argument, term)
            if pairs is not None:
                found, self.rounded[term.serial] = argument, pairs
                break
        self._rounding_memo[term.serial] = found
        return found

    def _same_shape(self, term: Term) -> list[Term]:
        """The hole arguments (from the second layer on) of `term`'s shape and type."""
        if self._by_shape is None:
            self._by_shape = {}
            for argument in self._later_arguments():
                same = self._by_shape.setdefault((argument.shape, argument.dtype), [])
                if argument not in same:
                    same.append(argument)
        return self._by_shape.get((term.shape, term.dtype), [])

    def first_unused(self) -> tuple | None:
        """The first summary the sharded walk has not used, if any."""
        return next((s.key for n, s in enumerate(self.summaries) if n not in self.applied),
                    None)

    def add(self, summary: Summary, ops: int) -> int:
        self.shortest_run = min(self.shortest_run or ops, ops)
        number = len(self.summaries)
        self.summaries.append(summary)
        for k, terms in enumerate(summary.arguments[1:], start=1):
            for h, term in enumerate(terms):
                self.by_term.setdefault(term.serial, []).append((number, k, h))
        return number


View = tuple[tuple[str, tuple], ...]
"""Reshapes and transposes, innermost first: ("reshape", shape) or ("transpose", perm)."""

_VIEW_MAKERS = {"reshape": make_reshape, "transpose": make_transpose}


def apply_view(term: Term, view: View) -> Term:
    """`term` under the view's reshapes and transposes, in normal form."""
    for op, attr in view:
        term = _VIEW_MAKERS[op](term, attr)
    return term


def _view_base(term: Term) -> Term:
    """`term` without its outer reshapes and transposes."""
    while term.op in _VIEW_MAKERS:
        term = term.args[0]
    return term


def view_over(term: Term, argument: Term) -> View | None:
    """A view V with `apply_view(argument, V)` exactly `term` (checked), or None: peels the
    reshapes and transposes of `term` down to one that `argument` under them gives."""
    steps: list[tuple[str, tuple]] = []
    at = term
    while True:
        if at is argument:
            break
        if at.op == "reshape" and make_reshape(argument, at.shape) is at:
            steps.append(("reshape", at.shape))
            break
        if at.op not in _VIEW_MAKERS:
            return None
        steps.append(("reshape", at.shape) if at.op == "reshape" else ("transpose", at.attrs[0]))
        at = at.args[0]
    view = tuple(reversed(steps))
    return view if apply_view(argument, view) is term else None


@dataclass
class LayerPlan:
    """A block about to be walked with reuse: its ops' facts, runs, and the runs already used."""

    facts: OpFacts
    runs: list[Run]
    done: set[int] = field(default_factory=set)
    walked: set[int] = field(default_factory=set)
    """Prelude ops walked ahead of their layer."""


WalkOp = Callable[[ir.Operation, RuleContext], None]
"""The walker's per-op step: give an op's results their relations in the walk's tables."""


class LayerReuse:
    """Whole-layer reuse inside one walk: the runs of each block the walker enters, and their
    layers summarized (the reference's walk, `summarizing`) or given the reference's summaries
    (the sharded walk).

    The walker hands over what reuse needs: `walk_op`, its per-op step (the only way reuse
    walks an op), and the walk's tables, which reuse reads and writes in place: `values` (MLIR
    value -> relation), `records` (the op records; a template walk's are dropped again),
    `producer` (value -> the record of the op that made it) and `notes`."""

    def __init__(self, index: LayerIndex, summarizing: bool, walk_op: WalkOp, values: dict,
                 records: list, producer: dict, notes: list[str]):
        self.index = index
        self.summarizing = summarizing
        self.walk_op = walk_op
        self.values = values
        self.records = records
        self.producer = producer
        self.notes = notes

    def plan(self, block: ir.Block) -> LayerPlan | None:
        """The runs of `block` to reuse, or None: it has none, or the sharded walk has no
        summary to apply."""
        if not self.summarizing and not self.index.summaries:
            return None
        facts = read_ops(block)
        runs = find_runs(facts)
        if not runs and not self.summarizing and len(facts.ops) >= self.index.shortest_run:
            self._cannot_follow("no repeated layers in the sharded program")
        return LayerPlan(facts, runs) if runs else None

    def next_to_walk(self, plan: LayerPlan, index: int, ctx: RuleContext) -> int:
        """The first op from `index` on that the walker walks itself: layers summarized from
        there on, and prelude ops already walked ahead of their layer, are passed over."""
        while True:
            after = self._reuse_at(plan, index, ctx)
            if after is not None:
                index = after
            elif index in plan.walked:
                index += 1
            else:
                return index

    def _reuse_at(self, plan: LayerPlan, index: int, ctx: RuleContext) -> int | None:
        """Summarize the layers of a run starting at op `index`; the index after them, or
        None to walk op `index` as usual. The reference starts at a run's first op (and
        walks that first layer as usual too); the sharded walk at the first op where a layer
        reads the inputs of a later reference layer."""
        for number, run in enumerate(plan.runs):
            if number in plan.done or not run.start <= index <= run.end - run.period:
                continue
            if self.summarizing:
                if index != run.start:
                    continue
                plan.done.add(number)
                return self._summarize(plan, run, ctx)
            after = self._apply(plan, run, index, ctx)
            if after is not None:
                plan.done.add(number)
            elif index >= run.start + 5 * run.period // 2:
                plan.done.add(number)
                self._cannot_follow("the sharded layers do not read the reference's layer "
                                    "inputs")
            return after
        return None

    def _cannot_follow(self, reason: str) -> None:
        """The sharded walk cannot follow the reference's summaries here: while one of them is
        still unused, this try ends (`NoReuse` naming it) and `fallback` decides the next."""
        unused = self.index.first_unused()
        if unused is not None:
            raise NoReuse(reason, unused)

    def _walk_preludes(self, plan: LayerPlan, start: int, period: int, ctx: RuleContext) -> None:
        """Walk the layer's prelude ops (they read block arguments only) ahead of it."""
        for i in plan.facts.preludes(start, period):
            if i not in plan.walked:
                plan.walked.add(i)
                self.walk_op(plan.facts.ops[i], ctx)

    def _walk_template(self, facts: OpFacts, start: int, period: int, inputs: list,
                       ctx: RuleContext) -> dict:
        """Walk the layer's ops once with `inputs` for its external inputs; {(op offset,
        result number): value} for every result."""
        values = self.values
        external = facts.external_inputs(start, period)
        saved = [values[v] for v in external]
        for v, value in zip(external, inputs):
            values[v] = value
        for i in range(start, start + period):
            if i not in facts.prelude:
                self.walk_op(facts.ops[i], ctx)
        for v, value in zip(external, saved):
            values[v] = value
        return {(i - start, r): values[result]
                for i in range(start, start + period) if i not in facts.prelude
                for r, result in enumerate(facts.ops[i].results)}

    def _give_summary_terms(self, facts: OpFacts, start: int, period: int, template: dict,
                            arguments: tuple[Term, ...], summary: Summary) -> bool:
        """Results of the layer at `start` read outside it get `region_result` terms."""
        found = []
        for result in facts.used_outside(start, period):
            offset, r = facts.position[result]
            value = template[(offset - start, r)]
            if type(value) is not Rel:
                return False
            found.append((result, value))
        holes = summary.hole_serials
        for result, value in found:
            term = region_result(arguments, value.term, holes, summary.reads_holes)
            self.values[result] = replace(value, partial_origin=None, term=term)
            self.producer.pop(result, None)
        self.index.summarized += 1
        return True

    def _summarize(self, plan: LayerPlan, run: Run, ctx: RuleContext) -> int | None:
        """The reference's summary of `run`: its first layer walked with holes (the template)
        and as usual, the later layers given `region_result` terms; the index after them."""
        facts, period, values = plan.facts, run.period, self.values
        if (len(facts.ops), run.start) in self.index.excluded:
            return None
        first = facts.layer_start(run)
        signature = facts.signature(first, period)
        starts = [first]
        while starts[-1] + 2 * period <= run.end and \
                facts.signature(starts[-1] + period, period) == signature:
            starts.append(starts[-1] + period)
        if len(starts) < 3:
            return None
        for i in range(run.start, first):
            if i not in plan.walked:
                plan.walked.add(i)
                self.walk_op(facts.ops[i], ctx)
        self._walk_preludes(plan, first, period, ctx)
        external = facts.external_inputs(first, period)
        second = facts.external_inputs(starts[1], period)
        inputs, holes = [], {}
        for j, v in enumerate(external):
            value = values.get(v)
            if type(value) is not Rel:
                return None
            if second[j] == v and facts.position.get(v, (-1,))[0] not in facts.prelude:
                inputs.append(value)
                continue
            holes[j] = fresh_hole(value.term.shape, value.term.dtype)
            inputs.append(replace(value, term=holes[j], partial_origin=None))
        if not holes:
            return None
        summary = Summary(list(holes.values()), [], (len(facts.ops), run.start))
        mark = len(self.records)
        template = self._walk_template(facts, first, period, inputs, ctx)
        del self.records[mark:]
        for i in range(first, first + period):
            if i not in facts.prelude:
                self.walk_op(facts.ops[i], ctx)
        arguments = summary.arguments
        arguments.append(tuple(values[external[j]].term for j in holes))
        for start in starts[1:]:
            self._walk_preludes(plan, start, period, ctx)
            ext = facts.external_inputs(start, period)
            actual = [values.get(v) for v in ext]
            if not all(type(actual[j]) is Rel and replace(actual[j], term=hole) == inputs[j]
                       for j, hole in holes.items()) or not all(
                    ext[j] == v for j, v in enumerate(external) if j not in holes):
                break
            args = tuple(actual[j].term for j in holes)
            if not self._give_summary_terms(facts, start, period, template, args, summary):
                break
            arguments.append(args)
        if len(arguments) < 2:
            return first + period
        self.index.add(summary, len(arguments) * period)
        self.index.templates.extend(v.term for v in template.values() if isinstance(v, Rel))
        return starts[0] + len(arguments) * period

    def _apply(self, plan: LayerPlan, run: Run, start: int, ctx: RuleContext) -> int | None:
        """The reference's summary for the layers from `start` on, if they read exactly the
        inputs of the reference's layers k, k+1, ..."""
        facts, period, values, index = plan.facts, run.period, self.values, self.index
        if start not in facts.prelude and not any(
                type(values.get(v)) is Rel and index.hole_argument(values[v].term) is not None
                for v in facts.external_inputs(start, period)):
            return None
        self._walk_preludes(plan, start, period, ctx)
        found = self._summary_inputs(facts, start, period)
        if found is None:
            return None
        number, k, holes_of, views = found
        summary = index.summaries[number]
        signature = facts.signature(start, period)
        external = facts.external_inputs(start, period)
        inputs = [values[v] for v in external]
        template_inputs = [v if h is None else replace(
            v, term=apply_view(summary.holes[h], view), partial_origin=None)
            for v, h, view in zip(inputs, holes_of, views)]
        mark = len(self.records)
        template = self._walk_template(facts, start, period, template_inputs, ctx)
        given, at = 0, start
        while at + period <= run.end and k + given < len(summary.arguments):
            if given:
                self._walk_preludes(plan, at, period, ctx)
                ext = facts.external_inputs(at, period)
                actual = [values.get(v) for v in ext]
                args = summary.arguments[k + given]
                if facts.signature(at, period) != signature or len(actual) != len(inputs) \
                        or not all(_fits(v, t, h, view, args, index) for v, t, h, view in
                                   zip(actual, template_inputs, holes_of, views)):
                    break
                for v, h, view in zip(actual, holes_of, views):
                    if h is not None and v.term is not apply_view(args[h], view):
                        self._note_substitute(v.term)
            if not self._give_summary_terms(facts, at, period, template,
                                            summary.arguments[k + given], summary):
                break
            given += 1
            at += period
        if given == 0:
            del self.records[mark:]
            return None
        index.applied.add(number)
        return at

    def _summary_inputs(self, facts: OpFacts, start: int, period: int):
        """(summary, layer, hole per input or None, view per input) when the layer's inputs
        are a reference layer's hole arguments (or views of them, `LayerIndex.view_argument`),
        or plain relations the next layer reads too."""
        values, index = self.values, self.index
        external = facts.external_inputs(start, period)
        inputs = [values.get(v) for v in external]
        if any(type(v) is not Rel for v in inputs):
            return None
        following = facts.external_inputs(start + period, period) \
            if start + 2 * period <= len(facts.ops) else external
        candidates = None
        terms, views = [], []
        for v in inputs:
            term, view = index.hole_argument(v.term) or (None, ())
            terms.append(term)
            views.append(view)
        for term in terms:
            if term is not None:
                layers = {(n, k) for n, k, _ in index.by_term[term.serial]}
                candidates = layers if candidates is None else candidates & layers
        if not candidates:
            return None
        number, k = min(candidates)
        args = index.summaries[number].arguments[k]
        holes_of = [next((h for h, t in enumerate(args) if t is term), None) for term in terms]
        if set(holes_of) - {None} != set(range(len(args))):
            return None  # not the reference's layer boundary
        if len(following) != len(external) or any(
                h is None and v != w for v, w, h in zip(external, following, holes_of)):
            return None
        for v, term, h, view in zip(inputs, terms, holes_of, views):
            if h is not None and apply_view(term, view) is not v.term:
                self._note_substitute(v.term)
        return number, k, holes_of, views

    def _note_substitute(self, term: Term) -> None:
        """Say under what a sharded value was taken for a hole's argument it is not."""
        index = self.index
        if term.serial in index.rounded:
            pairs = index.rounded[term.serial]
            if pairs:  # none: the same value spelled otherwise (x / sqrt(8.0) vs x / 2.82842708)
                self.notes.append(
                    f"proven assuming {ASSUMPTION} (a summarized layer reads the sharded value "
                    f"as the reference's: {describe_rounded(pairs)})")
            if term.serial not in index.assumed:
                return
        for assumption in index.assumed.get(term.serial) or \
                index.valid_indices.assumed_for(term) or ["valid indices"]:
            self.notes.append(f"proven assuming {assumption} (a summarized "
                              "layer reads the sharded value as the reference's)")


def _fits(value: Value, template: Rel, hole: int | None, view: View,
          arguments: tuple[Term, ...], index: LayerIndex) -> bool:
    """A later layer's input is the template's: the same value, or the hole's argument there
    under the template's view (up to float32 rounding of constants in XLA's per-device
    programs) with the template's layout."""
    if type(value) is not Rel:
        return False
    if hole is None:
        return value == template
    if view:
        return value.term is apply_view(arguments[hole], view) and \
            replace(value, term=template.term) == template
    same = value.term is arguments[hole] or index.rounding and index.argument_term(
        value.term) is arguments[hole]
    return same and replace(value, term=template.term) == template


# ----- the reuse fallback: when reuse is given up and layers are walked op by op -----------


class NoReuse(Exception):
    """The sharded walk cannot follow the reference's summary of the run `key` (None: of
    any run): this try ends, and `fallback` decides the next."""

    def __init__(self, reason: str, key: tuple | None = None):
        super().__init__(reason)
        self.key = key


def fallback(index: LayerIndex | None, unfollowed: tuple | None) -> LayerIndex | None:
    """The layer-reuse fallback, decided here only: what the next try walks with after a try
    (both programs walked with `index`) in which the sharded walk did not follow the
    reference's summary of run `unfollowed` (it gave up, `NoReuse`, or never used it).

    The same index without that summary while another summarized run is left, so both walks
    start again and keep the rest; else None: no reuse, every layer walked op by op. Each try
    drops one more summarized run, so the tries end. A check that summarized layers and is
    not proven is checked again op by op as well (`recheck_op_by_op`)."""
    if index is None or unfollowed is None:
        return None
    summarized = {summary.key for summary in index.summaries}
    if unfollowed not in summarized or not summarized - {unfollowed}:
        return None
    return LayerIndex(excluded=index.excluded | {unfollowed}, rounding=index.rounding)


def walk_with_fallback(walk: Callable[[LayerIndex | None], None], index: LayerIndex | None,
                       restart: Callable[[], None]) -> None:
    """Walk both programs, `walk(index)`, until a try follows every summary it makes; each
    other try is followed by `restart()` (the caller forgets what that try counted) and a try
    with `fallback`'s index."""
    while True:
        try:
            walk(index)
            unfollowed = index.first_unused() if index is not None else None
        except NoReuse as stop:
            unfollowed = stop.key
        else:
            if unfollowed is None:
                return
        restart()
        index = fallback(index, unfollowed)


def recheck_op_by_op(proven: bool, reused: dict[str, int]) -> bool:
    """Whether a check must be run again without reuse: it summarized reference layers
    (`reused`: layers summarized per walk) and is not proven. Then every "not proven" and
    every diagnostic comes from the op-by-op walk, and checking the rule instances of the walk
    with reuse is not worth it."""
    return not proven and bool(reused.get("reference"))
