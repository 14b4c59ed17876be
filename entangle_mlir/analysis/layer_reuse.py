"""Whole-layer reuse: repeated regions of a block are walked once and summarized.

A transformer stacked by a Python loop is one flat block in which the ops of every layer
repeat with a fixed period. `find_runs` finds such runs from op fingerprints alone (op name,
attributes, result types, region bodies), before anything is walked;
`Block.signature` then pins a region down exactly: the same ops, wired the same way inside it,
reading its external inputs (distinct values, in order of first use) in the same pattern. A
slice of a block argument (a layer's part of a stacked parameter, at an offset that differs
per layer) and its reshapes belong to no region: they are walked as usual and their results
are the region's inputs.

Two regions with equal signatures compute the same function of their external-input lists.
The walker (`infer.Walker`) uses this in both programs:

* the reference walks the first region of a run once with fresh leaf terms ("holes") for the
  inputs that differ between regions (inputs every region shares keep their own term), and
  gives each later region's results the term `region_result(inputs_k, T)`: the template term
  T with the holes replaced by region k's inputs;
* the sharded walk, when a repeated region's inputs are exactly a reference region's inputs,
  walks it once with those holes, so every rule instance it uses is proved by Z3 for all input
  values, and gives each later region the same `region_result` terms, with the template's
  layouts, as long as the inputs keep the template's layouts.

Soundness rests on equal signatures (same function) and on every template rule instance
holding for all values of the holes (never taken for program inputs: the valid-index
assumption of `assume.py` does not apply to them). Anything else (an input that is not a
plain relation, a changed layer) ends the summary, and the regions are walked op by op.
`check_program` re-runs a check without reuse unless it is proven with it, so diagnostics
always come from the op-by-op walk.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from jaxlib.mlir import ir

from entangle_mlir.analysis.valid_indices import ValidIndices
from entangle_mlir.core.rounding import equal_up_to_rounding
from entangle_mlir.core.terms import HOLE_BASE, REGION_TERMS, Term, intern, make_arg, subterms

MIN_PERIOD = 8
"""Shorter repeats are not worth a summary."""

_SPECIAL = ("stablehlo.while", "sdy.manual_computation", "stablehlo.case", "stablehlo.if",
            "func.return", "stablehlo.return", "sdy.return", "func.call")
"""Ops the walker treats outside its per-op rules: never part of a summarized region."""

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


class NoReuse(Exception):
    """The sharded walk cannot follow the reference's summary of the run `key` (None: of
    any run): walk again without it."""

    def __init__(self, reason: str, key: tuple | None = None):
        super().__init__(reason)
        self.key = key


@dataclass(frozen=True)
class Run:
    """Ops [start, end) of a block repeat with `period`."""

    start: int
    end: int
    period: int


@dataclass
class Block:
    """A block's ops with the facts reuse needs: fingerprints, producers, last uses."""

    ops: list
    operands: list[list] = field(default_factory=list)
    fingerprints: list[int] = field(default_factory=list)
    position: dict = field(default_factory=dict)
    """value -> (op index, result index) for results of this block's ops."""
    last_use: dict = field(default_factory=dict)
    """value -> the largest op index (len(ops) for the terminator) that reads it."""
    prelude: set[int] = field(default_factory=set)
    """A slice of a block argument (a layer's part of a stacked parameter, at an offset that
    differs per layer) and reshapes, transposes and converts of it: they belong to no region;
    their results are a region's inputs."""
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
        """What makes two regions the same function of their external-input lists."""
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
        """Results of the region's ops read by an op outside it."""
        end = start + period
        return [r for i in range(start, end) if i not in self.prelude
                for r in self.ops[i].results if self.last_use.get(r, -1) >= end]

    def layer_start(self, run: Run) -> int:
        """Where the run's regions should begin: the phase at which the fewest computed
        values cross into a region (a layer boundary, where only the residual stream does),
        keeping at least three regions."""
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


def read_block(block: ir.Block) -> Block:
    """Fingerprint every op of `block` (the terminator excluded), in one pass.

    The fingerprint (name, attributes, result types, operand count, region bodies) finds
    the period; `Block.signature` adds the wiring and the input types that make equal regions
    equal functions (an internal operand's type is its producer's result type).
    """
    everything = [op.operation for op in block.operations]
    ops = everything[:-1] if everything and everything[-1].name in _SPECIAL else everything
    info = Block(ops)
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


def find_runs(block: Block) -> list[Run]:
    """Maximal stretches of ops that repeat with one period, at least twice, non-overlapping."""
    hashes = block.fingerprints
    n = len(hashes)
    last: dict[int, int] = {}
    distances: Counter = Counter()
    for i, h in enumerate(hashes):
        if h in last and i - last[h] >= MIN_PERIOD:
            distances[i - last[h]] += 1
        last[h] = i
    covered = [False] * n
    runs = []
    for period, count in distances.most_common(4):
        if count < MIN_PERIOD:
            break
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


@dataclass
class Summary:
    """One summarized run of the reference: its holes and each region's hole arguments."""

    holes: list[Term]
    arguments: list[tuple[Term, ...]]
    """region k -> the terms its hole inputs take."""
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
    """term serial -> (summary, region, hole) for every hole argument with that term, from
    the second region on (the reference walks the first region op by op)."""
    regions: int = 0
    """Regions given summary terms, in this walk."""
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
    _valid_indices: object = None
    _simplified: dict | None = None
    _by_shape: dict | None = None
    _rounding_memo: dict = field(default_factory=dict)

    @property
    def valid_indices(self):
        """The reference's `assume.ValidIndices`, built on first use: a sharded input that
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
            for summary in self.summaries:
                for arguments in summary.arguments[1:]:
                    for argument in arguments:
                        self._simplified.setdefault(simplify(argument).serial, argument)
        return self._simplified.get(simplify(term).serial)

    def _rounded_argument(self, term: Term) -> Term | None:
        """The hole argument `term` equals but for constants that are the argument's rounded to
        their dtype (`equal_up_to_rounding`, memoized)."""
        if term.serial in self._rounding_memo:
            return self._rounding_memo[term.serial]
        if self._by_shape is None:
            self._by_shape = {}
            for summary in self.summaries:
                for arguments in summary.arguments[1:]:
                    for argument in arguments:
                        same = self._by_shape.setdefault((argument.shape, argument.dtype), [])
                        if argument not in same:
                            same.append(argument)
        found = None
        for argument in self._by_shape.get((term.shape, term.dtype), []):
            pairs = equal_up_to_rounding(argument, term)
            if pairs is not None:
                found, self.rounded[term.serial] = argument, pairs
                break
        self._rounding_memo[term.serial] = found
        return found

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


@dataclass
class LayerPlan:
    """A block about to be walked with reuse: its facts, runs, and the runs already used."""

    block: Block
    runs: list[Run]
    done: set[int] = field(default_factory=set)
    walked: set[int] = field(default_factory=set)
    """Prelude ops walked ahead of their region."""
