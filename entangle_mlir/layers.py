"""Whole-layer reuse: repeated regions of a block are walked once and summarized.

A transformer stacked by a Python loop is one flat block in which the ops of every layer
repeat with a fixed period. `find_runs` finds such runs from op fingerprints alone (op name,
attributes, result types, and each operand as "the result r of the op d positions back" or "a
block argument of this type"), before anything is walked; `Region.signature` then pins down a
region exactly: the same ops, attributes and types, wired the same way inside it, reading its
external inputs (distinct values, in order of first use) in the same pattern.

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
holding for all values of the holes. Anything else (an input that is not a plain relation, a
changed layer, an integer hole) ends the summary, and the regions are walked op by op.
`check_program` re-runs a check without reuse unless it is proven with it, so diagnostics
always come from the op-by-op walk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from jaxlib.mlir import ir

from .terms import Term, intern, make_arg

MIN_PERIOD = 8
"""Shorter repeats are not worth a summary."""

HOLE_BASE = 500_000_000
"""Argument indices of holes (below instance.ABSTRACT_BASE, far above real arguments)."""

_SPECIAL = ("stablehlo.while", "sdy.manual_computation", "stablehlo.case", "stablehlo.if",
            "func.return", "stablehlo.return", "sdy.return", "func.call")
"""Ops the walker treats outside its per-op rules: never part of a summarized region."""

FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")

REGION_TERMS: dict[int, Term] = {}
"""serial -> the template term a `region_result` names by serial in its attrs."""

_holes = 0


def fresh_hole(shape: tuple[int, ...], dtype: str) -> Term:
    """A leaf term standing for any value of this shape and type."""
    global _holes
    _holes += 1
    return make_arg(HOLE_BASE + _holes, shape, dtype)


def region_result(inputs: tuple[Term, ...], template: Term) -> Term:
    """`template` with its holes replaced by `inputs` (an opaque leaf to everything else)."""
    REGION_TERMS[template.serial] = template
    return intern("region_result", inputs, (template.serial,), template.shape,
                  template.dtype)


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
    fingerprints: list[int]
    position: dict = field(default_factory=dict)
    """value -> (op index, result index) for results of this block's ops."""
    argument: dict = field(default_factory=dict)
    """block argument value -> its number."""
    last_use: dict = field(default_factory=dict)
    """value -> the largest op index (len(ops) for the terminator) that reads it."""
    constant: set[int] = field(default_factory=set)
    """Ops computed from constants alone (XLA shares them between layers)."""

    def external_inputs(self, start: int, period: int) -> list:
        """Distinct values ops [start, start+period) read from outside, in first-use order."""
        seen, found = set(), []
        for i in range(start, start + period):
            for v in self.ops[i].operands:
                where = self.position.get(v)
                if (where is None or where[0] < start) and v not in seen:
                    seen.add(v)
                    found.append(v)
        return found

    def signature(self, start: int, period: int) -> tuple | None:
        """What makes two regions the same function of their external-input lists."""
        inputs = {v: k for k, v in enumerate(self.external_inputs(start, period))}
        out = []
        for i in range(start, start + period):
            wiring = []
            for v in self.ops[i].operands:
                where = self.position.get(v)
                if where is not None and where[0] >= start:
                    wiring.append((where[0] - start, where[1]))
                elif v in inputs:
                    wiring.append(("in", inputs[v], str(v.type)))
                else:
                    return None
            out.append((self.fingerprints[i], tuple(wiring)))
        return tuple(out)

    def used_outside(self, start: int, period: int) -> list:
        """Results of ops [start, start+period) read by an op outside that range."""
        end = start + period
        return [r for i in range(start, end) for r in self.ops[i].results
                if self.last_use.get(r, -1) >= end]


def read_block(block: ir.Block) -> Block:
    """Fingerprint every op of `block` (the terminator excluded), in one pass."""
    everything = [op.operation for op in block.operations]
    ops = everything[:-1] if everything and everything[-1].name in _SPECIAL else everything
    info = Block(ops, [])
    position, last_use, constant = info.position, info.last_use, info.constant
    arguments = {arg: str(arg.type) for arg in block.arguments}
    info.argument = {arg: n for n, arg in enumerate(block.arguments)}
    types: dict = {}
    for i, op in enumerate(everything):
        operands = list(op.operands)
        nested = len(op.regions) > 0
        for v in operands:
            last_use[v] = i
        if nested:
            for v in _nested_reads(op):
                last_use[v] = i
        if i == len(ops):
            break
        info.fingerprints.append(_fingerprint(op, i, operands, nested, info, arguments, types))
        if not nested and all(position.get(v, (-1,))[0] in constant for v in operands):
            constant.add(i)
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


def _fingerprint(op: ir.Operation, index: int, operands: list, nested: bool, block: Block,
                 arguments: dict, types: dict) -> int:
    """Name, attributes, result types and operands: "result r of the op d positions back",
    a value computed from constants alone by its producer's fingerprint wherever it is, or
    "an argument of this type"."""
    if op.name in _SPECIAL:
        return hash(("unique", index))
    wiring = []
    for v in operands:
        where = block.position.get(v)
        if where is not None and where[0] in block.constant:
            wiring.append(("constant", block.fingerprints[where[0]]))
        elif where is not None:
            wiring.append((index - where[0], where[1]))
        elif v in arguments:
            wiring.append(("arg", arguments[v]))
        else:
            return hash(("unique", index))
    body = _region_text(op) if nested else ()
    if body is None:
        return hash(("unique", index))
    result_types = []
    for result in op.results:
        t = result.type
        text = types.get(t)
        if text is None:
            text = types[t] = str(t)
        result_types.append(text)
    return hash((op.name, _attributes(op), tuple(result_types), tuple(wiring), body))


def _attributes(op: ir.Operation) -> tuple:
    found = []
    attributes = op.attributes
    for i in range(len(attributes)):
        named = attributes[i]
        name = named.name
        found.append((name, "channel" if name == "channel_handle" else str(named.attr)))
    return tuple(sorted(found))


def _region_text(op: ir.Operation) -> tuple | None:
    """The ops of `op`'s regions, self-contained (None if they read a value from above)."""
    if not op.regions:
        return ()
    local: dict = {}
    out = []
    for region in op.regions:
        for block in region.blocks:
            for n, arg in enumerate(block.arguments):
                local[arg] = ("barg", n, str(arg.type))
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
                out.append((inner.name, _attributes(inner),
                            tuple(str(r.type) for r in inner.results), tuple(operands)))
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

    def add(self, summary: Summary) -> int:
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
