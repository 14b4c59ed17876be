"""Ring loops folded by their invariant: a counted `stablehlo.while` whose body accumulates an
online softmax over blocks passed around a ring (ring attention in a `fori_loop`) becomes
the softmax over the blocks' concatenation, at any trip count, without copying the body's
accumulation once per step (issue 19; `unroll.py` copies it whole and stops at 16 trips).

The loop is read carry by carry, on its body with every carry a block argument (one generic
step, the step index symbolic):

* step counters: `i + c` (the while's own counter and `fori_loop`'s index beside it);
* rotating blocks: `collective_permute(kb)` (the K/V blocks travelling around the ring);
* loop-invariant values (yielded unchanged);
* a running max `m' = max(m, reduce_max(s, d))`, starting at -inf;
* accumulators `acc' = acc * views(exp(m - m')) + F(exp(s - broadcast(m')))` starting at 0,
  F a sum over d (a reduce_add, or a dot_general contracting d with values v), the shift of
  every term the row of m' it is reduced into, the rescale the same rows (`idioms.
  Accumulated`, the checks of the unrolled fold `idioms._accumulate`).

The scores s and values v are functions of the step counters, the rotating blocks and the
loop-invariant values only (never of m or an accumulator). Then, writing s_j, v_j for s and v
at step j (the counters at their value j steps on, each block rotated j times), the invariant

    m_i   = reduce_max(concatenate(s_0, ..., s_{i-1}), d)                (-inf when i = 0)
    acc_i = F(exp(concatenate(s_0, ..., s_{i-1}) - broadcast(m_i)))       (0 when i = 0)
            (F over concatenate(v_0, ..., v_{i-1}) along its contracted dim)

holds at every step: max is associative and idempotent, and `F(exp(x - m_i)) * exp(m_i -
m_{i+1}) + F(exp(s_i - m_{i+1}))` is `F(exp(concatenate(x, s_i) - m_{i+1}))` (the regrouping
the unrolled fold makes, exact in real arithmetic: each term's shift moves from m_i to
m_{i+1}). The first step holds exactly (`0 * exp(-inf - m_1)` is 0 where m_1 is finite and NaN
where the row of s_0 is -inf throughout, where the folded form is NaN too); the later ones
need every m_i finite, i.e. every row of the first block s_0 to hold an element above -inf
(`finite.rows_finite`, judged as the unrolled fold judges it: refused where the scores may
overflow, unless under `--assume-no-overflow`). At the trip count n the loop's results are
that invariant at i = n: the per-step blocks s_j and v_j (the part of the body computing them,
cloned once per step with the counters constant: the values the closed form names), then one
max, one exponential and one F over their concatenations, marked as blocks so that the
idioms move them down to the K/V blocks (`idioms._sink_concat`), as after unrolling.

Any other carry, another use of the running max or an accumulator inside the blocks, a
nested region reading the body: the loop is left to `unroll.py`. (Residual buffers, which a
differentiated ring's forward writes a row a step, are read for `ring_pair.py`, which folds
that forward with its backward: `_Ring(loop, buffers=True)`, `build` then `commit`.) A
carry read through a convert to its own type (jax's weakly typed carries) is read as the
carry.
"""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.diagnostics import parse_location
from entangle_mlir.mlir.ir import while_loops
from entangle_mlir.normalize.finite import active, rows_finite
from entangle_mlir.normalize.idioms import (
    Accumulated,
    concat_blocks,
    is_exp_of_sub,
    running_max_refusal,
)
from entangle_mlir.normalize.match import (
    MOVES_AND_TRANSPOSES,
    defining_op,
    index_map,
    max_reduce,
    root_of,
    shape_of,
    splat_of,
)
from entangle_mlir.normalize.unroll import (
    MAX_TRIPS,
    as_compared,
    constant_int,
    fold_counters,
    integer_width,
    is_ring,
    loop_counter,
    nested_reads_body,
    residual_buffers,
)

MIN_TRIPS = 2
"""Shortest loop folded (a loop of one step is its body)."""

MAX_CLONED_OPS = 200_000
"""The most ops the closed form may clone (trips x the ops computing one step's blocks): a
loop past it is left to `unroll.py` (which leaves it a loop past 16 trips)."""


class _Ring:
    """A ring loop's carries, read off its body by `read` (False: not a ring loop this
    folds), and its closed form (`fold`)."""

    def __init__(self, loop: ir.Operation, buffers: bool = False) -> None:
        """`buffers`: also read residual buffers (`unroll.residual_buffers`: a buffer of a
        row per step, written at the step's row), as a differentiated ring's forward stores
        them (`ring_pair.py` folds the pair; a ring folded alone has none)."""
        self.loop = loop
        self.body = loop.regions[1].blocks[0]
        self.args = list(self.body.arguments)
        ops = list(self.body.operations)
        self.ops = ops[:-1]
        self.yields = list(ops[-1].operands)
        self.counts: dict[int, tuple[int, int]] = {}
        """carry -> (initial value, step): counters."""
        self.rotating: dict[int, ir.Operation] = {}
        """carry -> the collective_permute its yield is."""
        self.invariant: set[int] = set()
        self.running: int | None = None
        self.reduce: ir.Operation | None = None
        self.accs: dict[int, Accumulated] = {}
        self.rescales: dict[int, object] = {}
        """accumulator carry -> the rescale `views(exp(m - m'))` multiplying it."""
        self.buffers: dict[int, ir.Operation] = {}
        """carry -> the dynamic_update_slice writing the step's row (only with `buffers`)."""
        self.allow_buffers = buffers
        self.trips = 0
        self.start = 0
        self.counter = -1
        self.slice: list[ir.Operation] = []
        """The body ops computing one step's blocks and rotations, in body order."""

    # ----- reading the carries ------------------------------------------------------------

    def read(self) -> bool:
        loop = self.loop
        counter = loop_counter(loop)
        if counter is None or len(self.yields) != len(self.args):
            return False
        start = constant_int(loop.operands[counter.index])
        if start is None:
            return False
        self.trips = counter.trips(start)
        self.start, self.counter = start, counter.index
        if self.trips < MIN_TRIPS:
            return False
        others = []
        stored = set(residual_buffers(loop, self.trips)) if self.allow_buffers else set()
        for k, (arg, out) in enumerate(zip(self.args, self.yields)):
            if k in stored:
                self.buffers[k] = defining_op(out)
            elif arg == out:
                self.invariant.add(k)
            elif (step := self._count(k)) is not None:
                self.counts[k] = step
            elif (permute := self._permute(k)) is not None:
                self.rotating[k] = permute
            else:
                others.append(k)
        running = [k for k in others if self._running_max(k)]
        if len(running) != 1:
            return False
        self.running = running[0]
        for k in others:
            if k == self.running:
                continue
            acc = self._accumulator(k)
            if acc is None:
                return False
            self.accs[k] = acc
        return bool(self.accs) and self._blocks_read_no_accumulator()

    def _count(self, k: int) -> tuple[int, int] | None:
        return counted(self.loop, k)

    def _permute(self, k: int) -> ir.Operation | None:
        op = defining_op(self.yields[k])
        if op is None or op.name != "stablehlo.collective_permute" or len(op.operands) != 1 or (
                op.operands[0] != self.args[k]):
            return None
        return op

    def _running_max(self, k: int) -> bool:
        """Carry k is `max(m, reduce_max(s, d))` from -inf, the reduction from -inf."""
        op = defining_op(self.yields[k])
        if op is None or op.name != "stablehlo.maximum" or not splat_of(
                self.loop.operands[k], -math.inf):
            return False
        for p, c in ((0, 1), (1, 0)):
            if unconverted(op.operands[p]) != self.args[k]:
                continue
            reduce = defining_op(op.operands[c])
            dims = max_reduce(reduce)
            if dims is None or len(dims) != 1 or not splat_of(reduce.operands[1], -math.inf):
                continue
            if shape_of(reduce.results[0]) != shape_of(self.args[k]):
                continue
            self.reduce = reduce
            return True
        return False

    @property
    def scores(self):
        return self.reduce.operands[0]

    @property
    def dim(self) -> int:
        return max_reduce(self.reduce)[0]

    def _accumulator(self, k: int) -> Accumulated | None:
        """Carry k as `acc * views(exp(m - m')) + F(exp(s - broadcast(m')))` from 0 (the
        checks of `idioms._accumulate`, between the body's arguments and its yields)."""
        add = defining_op(self.yields[k])
        if add is None or add.name != "stablehlo.add" or not splat_of(self.loop.operands[k],
                                                                      0.0):
            return None
        old, new = self.args[self.running], self.yields[self.running]
        for a, c in ((0, 1), (1, 0)):
            mul = defining_op(add.operands[a])
            if mul is None or mul.name != "stablehlo.multiply":
                continue
            cur = Accumulated(add.operands[c])
            if not cur.ok or cur.y != self.scores or cur.d != self.dim or cur.m != new:
                continue
            for x, r in ((0, 1), (1, 0)):
                if mul.operands[x] == self.args[k] and self._rescales(mul.operands[r], cur,
                                                                       old, new):
                    self.rescales[k] = mul.operands[r]
                    return cur
        return None

    @staticmethod
    def _rescales(rescale, cur: Accumulated, old, new) -> bool:
        """`rescale` is views(exp(old - new)), each element the row its terms are shifted by,
        and the shift broadcasts m along d in its own layout (the row max's rows)."""
        root, chain = root_of(rescale, MOVES_AND_TRANSPOSES)
        if not is_exp_of_sub(root) or shape_of(root) != shape_of(cur.m):
            return False
        sub = defining_op(defining_op(root).operands[0])
        if [unconverted(v) for v in sub.operands] != [old, new]:
            return False
        index = index_map(root, chain)
        if index is None or index.shape != cur.index.shape or not (index == cur.index).all():
            return False
        y = shape_of(cur.y)
        kept = [n if k != cur.d else 1 for k, n in enumerate(y)]
        if len(shape_of(cur.m)) != len(y) - 1:
            return False
        plain = np.broadcast_to(np.arange(math.prod(shape_of(cur.m))).reshape(kept), y)
        return bool((plain == cur.sub_index).all())

    def _blocks_read_no_accumulator(self) -> bool:
        """The scores, the values and the rotations read only counters, rotating blocks and
        loop-invariant values, and no nested region reads the body (cloning would not remap
        it). Sets `slice`: the body ops computing them, in body order."""
        if nested_reads_body(self.body):
            return False
        roots = [self.scores] + [acc.v for acc in self.accs.values() if acc.v is not None]
        roots += [op.results[0] for op in self.rotating.values()]
        found = self.cone(roots)
        if found is None:
            return False
        self.slice = [op for op in self.ops if op.operation in found]
        return self.trips * len(self.slice) <= MAX_CLONED_OPS

    def cone(self, roots: list) -> set | None:
        """The body ops computing `roots`, if they read only counters, rotating blocks and
        loop-invariant values (None: they read another carry)."""
        allowed = set(self.counts) | set(self.rotating) | self.invariant
        found: set = set()
        stack = list(roots)
        position = {arg: k for k, arg in enumerate(self.args)}
        while stack:
            value = stack.pop()
            if value in position:
                if position[value] not in allowed:
                    return None
                continue
            op = defining_op(value)
            if op is None or not _in_body(op, self.body) or op in found:
                continue
            found.add(op)
            stack.extend(op.operands)
        return found

    def widen(self, roots: list) -> bool:
        """Add the ops computing `roots` to the slice cloned per step (they must read only
        what the blocks may); False, the slice unchanged, where they read another carry."""
        found = self.cone(roots)
        if found is None:
            return False
        found |= {op.operation for op in self.slice}
        self.slice = [op for op in self.ops if op.operation in found]
        return self.trips * len(self.slice) <= MAX_CLONED_OPS

    def describe(self) -> str:
        """The invariant in words, carry by carry (numbered as the loop's operands, as
        `analysis/general/loops.py` numbers them); carries alike are listed together."""
        texts: dict[int, str] = {}
        for k, (_, step) in self.counts.items():
            texts[k] = (f"step index i in [{self.start}, {self.start + self.trips})"
                        if k == self.counter else
                        f"a counter: {'+=' if step >= 0 else '-='} {abs(step)} each step")
        for k in self.rotating:
            texts[k] = "rotates: collective_permute each step (the block rotated i times)"
        texts[self.running] = "the running max over the blocks of steps < i"
        for k, acc in self.accs.items():
            texts[k] = ("an online-softmax sum over the blocks of steps < i" +
                        (" against their values" if acc.v is not None else "") +
                        ", shifted by the running max")
        for k in self.buffers:
            texts[k] = "a residual buffer: its rows < i hold the values of steps < i"
        for k in self.invariant:
            texts[k] = "loop-invariant"
        groups: dict[str, list[int]] = {}
        for k in sorted(texts):
            groups.setdefault(texts[k], []).append(k)
        order = sorted(groups.items(), key=lambda g: (g[0] == "loop-invariant", g[1][0]))
        return "; ".join(f"{', '.join(f'#{k}' for k in ks)}: {text}" for text, ks in order)

    # ----- the closed form ----------------------------------------------------------------

    def fold(self) -> bool:
        """Replace the loop by the invariant at its trip count; False (the module unchanged)
        where the first block's rows may be -inf throughout."""
        if not self.build():
            return False
        self.commit()
        return True

    def build(self) -> bool:
        """Build the closed form before the loop (`exits`: each carry's value at the trip
        count; `steps`: each step's mapping of the body's slice to its clones), leaving the
        loop in place; False (the clones erased) where the first block's rows may be -inf
        throughout."""
        loop = self.loop
        rotated = {k: loop.operands[k] for k in self.rotating}
        blocks: list = []
        values: dict[int, list] = {k: [] for k in self.accs}
        created: list[ir.Operation] = []
        permutes = {p.operation: k for k, p in self.rotating.items()}
        self.steps = []
        for j in range(self.trips):
            mapping = {}
            for k in self.invariant:
                mapping[self.args[k]] = loop.operands[k]
            for k in self.rotating:
                mapping[self.args[k]] = rotated[k]
            for k, (init, step) in self.counts.items():
                mapping[self.args[k]] = self._constant(self.args[k], init + j * step, created)
            nxt = dict(rotated)
            for op in self.slice:
                clone = op.clone(ir.InsertionPoint(loop))
                created.append(clone)
                for i, operand in enumerate(clone.operands):
                    if operand in mapping:
                        clone.operands[i] = mapping[operand]
                for old, new in zip(op.results, clone.results):
                    mapping[old] = new
                k = permutes.get(op.operation)
                if k is not None:
                    nxt[k] = clone.results[0]
            self.steps.append(mapping)
            # (a block computed outside the loop is the same at every step)
            blocks.append(mapping.get(self.scores, self.scores))
            for k, acc in self.accs.items():
                if acc.v is not None:
                    values[k].append(mapping.get(acc.v, acc.v))
            if j == 0 and not self._first_rows_finite(blocks[0], created):
                return False
            rotated = nxt
        finiteness = active()
        finiteness.fired()
        finiteness.forget()
        d = self.dim
        joined = concat_blocks(blocks, d, loop)
        reduce = self._hoisted_clone(self.reduce, {0: joined})
        m = reduce.results[0]
        exits: dict[int, object] = {self.running: m}
        shape = shape_of(joined)
        element = ir.RankedTensorType(joined.type).element_type
        kept = [k for k in range(len(shape)) if k != d]
        for k, acc in self.accs.items():
            with ir.InsertionPoint(loop), loop.location:
                shift = stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(shape, element), m,
                                                   kept).result
                exp = stablehlo.ExpOp(stablehlo.SubtractOp(joined, shift).result).result
            operands = {acc.side: exp}
            if acc.v is not None:
                operands[1 - acc.side] = concat_blocks(values[k], acc.dv, loop)
            value = self._hoisted_clone(acc.core, operands).results[0]
            for view in reversed(acc.views):
                value = self._hoisted_clone(view, {0: value}).results[0]
            exits[k] = value
        for k, (init, step) in self.counts.items():
            exits[k] = self._constant(self.args[k], init + self.trips * step, [])
        for k in self.rotating:
            exits[k] = rotated[k]
        for k in self.invariant:
            exits[k] = loop.operands[k]
        self.exits = exits
        return True

    def replace_results(self) -> None:
        """Replace the loop's results but its buffers by `exits` (the loop stays while its
        buffers are read)."""
        for k, result in enumerate(self.loop.results):
            if k not in self.buffers:
                result.replace_all_uses_with(self.exits[k])

    def commit(self) -> None:
        """Replace the loop's results by `exits` and erase it (a buffer's result must be
        unused by then: the pair's backward, its one reader, is folded first)."""
        self.replace_results()
        for k in self.buffers:
            assert not any(True for _ in self.loop.results[k].uses), "a buffer is still read"
        self.loop.erase()

    def _first_rows_finite(self, scores, created: list[ir.Operation]) -> bool:
        """Every row of the first block holds an element above -inf (then every running max
        after the first step is finite); else the clones are erased and, past the trips
        `unroll.py` unrolls, the refusal recorded (a possible overflow, strict mode)."""
        finiteness = active()
        finiteness.attempt()
        # Up to MAX_TRIPS the loop is unrolled next and the unrolled fold says why it refuses.
        refusal = running_max_refusal(scores) if self.trips > MAX_TRIPS else None
        if rows_finite(scores, self.dim, self.loop, refusal):
            return True
        for op in reversed(created):
            op.erase()
        finiteness.forget()
        return False

    def _constant(self, like, value: int, created: list[ir.Operation]):
        """An integer scalar constant of `like`'s type, wrapped at its width."""
        tensor = ir.RankedTensorType(like.type)
        element = ir.IntegerType(tensor.element_type)
        value = as_compared(value, element.width, not element.is_unsigned)
        with ir.InsertionPoint(self.loop), self.loop.location:
            op = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                tensor, ir.IntegerAttr.get(tensor.element_type, value)))
        created.append(op.operation)
        return op.result

    def _hoisted_clone(self, op: ir.Operation, operands: dict[int, object]) -> ir.Operation:
        """A clone of body op `op` before the loop, its operands `operands` where given, the
        others the body's constants cloned before the loop (or values from outside it)."""
        clone = op.clone(ir.InsertionPoint(self.loop))
        for i, operand in enumerate(op.operands):
            if i in operands:
                clone.operands[i] = operands[i]
                continue
            source = defining_op(operand)
            if source is not None and _in_body(source, self.body):
                clone.operands[i] = source.clone(ir.InsertionPoint(clone)).results[0]
        return clone

    def hoistable(self) -> bool:
        """The operands the closed form's reductions take from the body besides the blocks
        (`_hoisted_clone`'s others: their inits) are constants or values from outside the
        loop."""
        given = [(self.reduce, {0})] + [
            (acc.core, {acc.side} | (set() if acc.v is None else {1 - acc.side}))
            for acc in self.accs.values()]
        for op, blocks in given:
            for i, operand in enumerate(op.operands):
                if i in blocks:
                    continue
                source = defining_op(operand)
                if source is None:
                    return False
                if _in_body(source, self.body) and source.name != "stablehlo.constant":
                    return False
        return True


def counted(loop: ir.Operation, k: int) -> tuple[int, int] | None:
    """`(init, c)` where carry k of `loop` is an integer scalar `i + c` each step from the
    constant init."""
    body = loop.regions[1].blocks[0]
    arg, out = body.arguments[k], list(body.operations)[-1].operands[k]
    op = defining_op(out)
    if op is None or op.name != "stablehlo.add" or integer_width(arg) is None or (
            ir.RankedTensorType(arg.type).rank != 0):
        return None
    a, b = op.operands
    step = constant_int(b) if a == arg else constant_int(a) if b == arg else None
    init = constant_int(loop.operands[k])
    return None if step is None or init is None else (init, step)


def unconverted(value):
    """`value` under converts to its own type (jax's weakly typed carries): the same value."""
    op = defining_op(value)
    while op is not None and op.name == "stablehlo.convert" and (
            op.operands[0].type == op.results[0].type):
        value = op.operands[0]
        op = defining_op(value)
    return value


def _in_body(op: ir.Operation, body: ir.Block) -> bool:
    """`op` is directly in `body` (not nested deeper, not outside)."""
    return op.operation.block == body


def fold_ring_loops(module: ir.Module, ops: list | None = None,
                    notes: list[str] | None = None, file: str = "-") -> int:
    """Fold every ring loop whose body is one online-softmax step over rotating blocks into
    its closed form (module docstring); the number folded. `ops`: the module's ops as
    `ir.ops_in_order` lists them now; `notes` gets each folded loop's invariant (`file`: the
    module's, for the loop's location)."""
    loops = while_loops(module) if ops is None else [op for name, op in ops
                                                     if name == "stablehlo.while"]
    count = 0
    for loop in loops:
        body = loop.regions[1].blocks[0]
        if not is_ring(body):
            continue
        ring = _Ring(loop)
        if not (ring.read() and ring.hoistable()):
            continue
        text = ring.describe()
        where = parse_location(str(loop.location), file)
        if ring.fold():
            count += 1
            if notes is not None:
                notes.append(f"the ring loop at {where or file} is folded by its invariant "
                             f"over {ring.trips} trips: {text}")
    if count:
        fold_counters(module)
    return count
