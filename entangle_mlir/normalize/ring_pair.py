"""Differentiated ring loops folded by their invariant (issue 19): jax's gradient of a ring
attention `fori_loop` is a pair of loops, a forward that stores each step's residuals at
its counter's row and a backward that reads them at n - 1 - i, and this folds the pair into
its closed form at any trip count (`unroll.residual_pairs` unrolls it, up to 32 trips, where
this refuses).

The forward is read as `ring_fold._Ring` reads a ring (counters, rotating K/V blocks,
loop-invariant values, a running max m, online-softmax accumulators), plus its residual
buffers. The backward, on its body with every carry a block argument (one generic step t,
undoing forward step j = n - 1 - t), carry by carry:

* the residual buffers, read only at row n - 1 - t (`_reads_reversed`, every t evaluated):
  row j holds what the forward stored at step j (each row written once, at its step);
* loop-invariant values and counters;
* accumulators `acc' = h(acc) + f`, h the identity (dq) or a collective_permute (dK and dV
  going back around the ring), `f` the step's contribution;
* scaled cotangents `g' = g * views(c_j)`, `c_j = exp(m_j - m_{j+1})` the forward's rescale
  read back from its buffer (the output's and the denominator's cotangents);
* the running max's cotangent `g_m` (when the max is differentiated), and carries nothing
  else reads (dead).

The invariant, shown for one generic step (`_Step`: a scratch function holding the
forward's body at step j and the backward's at step t, every carry a free argument, the
backward's reads bound to the forward's stores) by `polynomial.is_zero` (algebra over atoms,
exact in real arithmetic) and at t = 0 in the program:

* `g_m(t) = sum_k <acc_k(j + 1), g_k(t)>` (each accumulator paired with its cotangent,
  summed onto m's rows through the adjoint of the accumulator's rescale views): then every
  product sending the max's cotangent to the scores' argmax is zero (`max_cotangent.
  _candidate`: the cotangent of m_{j+1} cancels), and the next step's g_m is the same sum at
  j. At t = 0 the sum is the output cotangent's pairing with the output, zero (the softmax is
  invariant under its shift). Those products are then zero in the loop at every step, and
  replaced by zeros (`max_cotangent._fold_zeros`);
* `g(t) = g(0) * views(E_t)` for each scaled cotangent, `E_t = exp(m_{j+1} - m_n)` (1 at
  t = 0; `E_{t+1} = E_t * c_j`, the exponential's identity `exp(a - b) exp(b - c) = exp(a -
  c)`); and each contribution f at step t, computed from `g(t)` and the forward's stored
  probabilities `p_j = exp(s_j - views(m_{j+1}))`, equals the same contribution computed
  from `g(0)` and `P_j = p_j * views(E_t) = exp(s_j - views(m_n))`: checked with E a free
  atom, op by op (`_congruent`: equal operands give equal results; arithmetic by
  `polynomial.is_zero`).

So at the trip count each accumulator is its initial value with the contributions of
steps 0..n-1 applied by its own h and add, each contribution read off the blocks of forward
step j = n - 1 - t (`ring_fold`'s per-step clones: scores, masks, K and V) and P_j, with
m_n the forward's closed form's max: no carry chained from step to step but the
accumulators. The forward's own results are `ring_fold`'s closed form.

In floating point the exponential's identity and the cancellation need the shifts ordered
and finite: m_j <= m_{j+1} <= m_n (a running max) and s_j <= m_{j+1} (a row max) make every
factor at most 1, m_{j+1} is finite where every row of the first block holds an element
above -inf (`ring_fold`'s check), and m_j (-inf before the first step) is read only by the
maximum, a comparison and `exp(m_j - m_{j+1})` (`_max_read_safely`); the atoms of each
algebraic check must be finite (`nonfinite_kinds`; products and sums of finite values under
`--assume-no-overflow` only, so the strict mode leaves the pair to `unroll.py`).

Anything else (another carry, a contribution reading the running state beyond P_j, a read
at another row, a result of a cotangent or buffer used after the loop) is left to
`unroll.py`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from entangle_mlir.core.diagnostics import parse_location
from entangle_mlir.mlir.ir import op_key, while_loops
from entangle_mlir.normalize import polynomial
from entangle_mlir.normalize.finite import Kinds, active, judge, nonfinite_kinds
from entangle_mlir.normalize.idioms import is_exp_of_sub
from entangle_mlir.normalize.match import (
    MOVES_AND_TRANSPOSES,
    defining_op,
    i64s,
    index_map,
    root_of,
    shape_of,
)
from entangle_mlir.normalize.max_cotangent import _candidate, _fold_zeros, _sweep, _zero_like
from entangle_mlir.normalize.ring_fold import _Ring, counted, unconverted
from entangle_mlir.normalize.unroll import (
    _is_zeros,
    as_compared,
    backward_of,
    constant_int,
    drop_zero_carries,
    fold_counters,
    integer_width,
    loop_counter,
    nested_reads_body,
    trip_count,
)

_ARITHMETIC = frozenset({"stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                         "stablehlo.divide", "stablehlo.negate", "stablehlo.dot_general",
                         "stablehlo.reduce", "stablehlo.broadcast_in_dim",
                         "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert"})
"""Ops `polynomial` expands: two results of one of them are compared by algebra."""

_INT_SCALAR = {"stablehlo.add": lambda a, b: a + b, "stablehlo.subtract": lambda a, b: a - b,
               "stablehlo.multiply": lambda a, b: a * b}


def _op(owner) -> ir.Operation:
    return owner.operation if hasattr(owner, "operation") else owner


def _uses(value) -> list[ir.Operation]:
    return [_op(use.owner) for use in value.uses]


class _Backward:
    """The backward loop's carries (module docstring), read off its body (`read`)."""

    def __init__(self, loop: ir.Operation, forward: _Ring) -> None:
        self.loop, self.forward = loop, forward
        self.body = loop.regions[1].blocks[0]
        self.args = list(self.body.arguments)
        ops = list(self.body.operations)
        self.ops = ops[:-1]
        self.yields = list(ops[-1].operands)
        self.buffers: dict[int, int] = {}
        """backward carry -> the forward buffer it is."""
        self.invariant: set[int] = set()
        self.counts: dict[int, tuple[int, int]] = {}
        self.accs: dict[int, tuple[ir.Operation, ir.Operation | None]] = {}
        """carry -> (its add, the collective_permute of the carry it adds to, or None)."""
        self.scaled: dict[int, ir.Operation] = {}
        """carry -> its multiply by views of the forward's rescale."""
        self.others: list[int] = []

    def read(self) -> bool:
        loop, forward = self.loop, self.forward
        if nested_reads_body(self.body) or len(self.yields) != len(self.args):
            return False
        counter = loop_counter(loop)
        if counter is None or constant_int(loop.operands[counter.index]) != 0:
            return False
        self.counter = counter.index
        for k, (arg, out) in enumerate(zip(self.args, self.yields)):
            operand = loop.operands[k]
            owner = operand.owner
            if not isinstance(owner, ir.Block) and _op(owner) == forward.loop and (
                    ir.OpResult(operand).result_number in forward.buffers):
                if out != arg:
                    return False
                self.buffers[k] = ir.OpResult(operand).result_number
            elif arg == out:
                self.invariant.add(k)
            elif (step := counted(loop, k)) is not None:
                self.counts[k] = step
            elif (acc := self._accumulator(k)) is not None:
                self.accs[k] = acc
            elif (mul := self._scaled(k)) is not None:
                self.scaled[k] = mul
            else:
                self.others.append(k)
        return bool(self.accs) and self.counter in self.counts and self._reads_reversed()

    def _accumulator(self, k: int):
        """`h(acc) + f`: h the carry itself or its collective_permute, the carry read by
        nothing else, f not reading it."""
        add = defining_op(self.yields[k])
        arg = self.args[k]
        if add is None or add.name != "stablehlo.add":
            return None
        for a, f in ((0, 1), (1, 0)):
            held = add.operands[a]
            permute = defining_op(held)
            if held == arg:
                permute = None
            elif not (permute is not None and permute.name == "stablehlo.collective_permute"
                      and len(permute.operands) == 1 and permute.operands[0] == arg
                      and _uses(held) == [add]):
                continue
            readers = _uses(arg)
            if readers != [permute if permute is not None else add]:
                continue
            if add.operands[f] == arg:
                continue
            return add, permute
        return None

    def _scaled(self, k: int) -> ir.Operation | None:
        """`g * views(r)`, r read from a buffer (what it holds is checked in `_Step`)."""
        mul = defining_op(self.yields[k])
        if mul is None or mul.name != "stablehlo.multiply":
            return None
        if mul.operands[0] == self.args[k] or mul.operands[1] == self.args[k]:
            return mul
        return None

    def _reads_reversed(self) -> bool:
        """Every read of a buffer is the row n - 1 - t at step t, whole (`dynamic_slice`
        at (index, 0, ..., 0), one row deep, the other dims whole)."""
        n = self.forward.trips
        self.reads: dict[object, int] = {}
        for op in self.ops:
            if op.name != "stablehlo.dynamic_slice":
                continue
            buffer = op.operands[0]
            k = next((k for k in self.buffers if self.args[k] == buffer), None)
            if k is None:
                continue
            starts = list(op.operands[1:])
            sizes = shape_of(op.results[0])
            if sizes[0] != 1 or sizes[1:] != shape_of(buffer)[1:] or any(
                    constant_int(s) != 0 for s in starts[1:]):
                return False
            for t in range(n):
                if self._scalar(starts[0], t) != n - 1 - t:
                    return False
            store = self.forward.buffers[self.buffers[k]]
            if store.operands[1].type != op.results[0].type:
                return False  # the row is written in part: a read sees more than the update
            self.reads[op.results[0]] = k
        return all(all(u.name == "stablehlo.dynamic_slice" or u.name == "stablehlo.return"
                       for u in _uses(self.args[k])) for k in self.buffers)

    def _scalar(self, value, t: int) -> int | None:
        """The integer scalar `value` at step t (the counter t, the body's constants)."""
        if value == self.args[self.counter]:
            return t
        op = defining_op(value)
        width = integer_width(value)
        if op is None or width is None or ir.RankedTensorType(value.type).rank != 0:
            return None
        if op.name == "stablehlo.constant":
            return constant_int(value)
        fn = _INT_SCALAR.get(op.name)
        if fn is None:
            return None
        a, b = (self._scalar(v, t) for v in op.operands)
        if a is None or b is None:
            return None
        element = ir.IntegerType(ir.RankedTensorType(value.type).element_type)
        return as_compared(fn(a, b), width, not element.is_unsigned)

    def describe(self, dead: set[int], max_cotangent: int | None,
                 pairing: dict[int, int]) -> str:
        """The invariant in words, carry by carry (numbered as the loop's operands); j = n -
        1 - t is the forward step a backward step t undoes, `pairing` the forward
        accumulators' cotangents (`_Pair.zero_max_cotangent`)."""
        texts: dict[int, str] = {}
        for k in self.counts:
            texts[k] = "a counter" if k != self.counter else (
                f"step index t in [0, {self.forward.trips}), undoing forward step j = n - 1 - t")
        for k in self.buffers:
            texts[k] = "a residual buffer read at row n - 1 - t (forward step j's values)"
        for k, (_, permute) in self.accs.items():
            texts[k] = ("the contributions of steps < t, each passed back around the ring "
                        "once a step" if permute is not None else
                        "the sum of the contributions of steps < t")
        running = self.forward.running
        for k in self.scaled:
            texts[k] = (f"its initial value times exp(m_(j+1) - m_n), m the forward's "
                        f"running max #{running}")
        paired = " + ".join(f"<forward #{a} after step j, #{c}>" for a, c in pairing.items())
        for k in dead:
            texts[k] = (f"the running max's cotangent, {paired} summed onto m's rows (what "
                        "it sends to the scores is zero)" if k == max_cotangent else "unread")
        for k in self.invariant:
            texts[k] = "loop-invariant"
        groups: dict[str, list[int]] = {}
        for k in sorted(texts):
            groups.setdefault(texts[k], []).append(k)
        order = sorted(groups.items(), key=lambda g: (g[0] == "loop-invariant",
                                                      g[0].startswith("a residual"), g[1][0]))
        return "; ".join(f"{', '.join(f'#{k}' for k in ks)}: {text}" for text, ks in order)


class _Step:
    """One generic step of the pair in a scratch function: the forward's body (step j) and
    the backward's (step t = n - 1 - j) cloned with every carry a free argument, the
    backward's reads bound to the forward's stores, the loop-invariant constants cloned."""

    def __init__(self, forward: _Ring, backward: _Backward, extra: list[ir.Type]) -> None:
        self.forward, self.backward = forward, backward
        self.module = ir.Module.create()
        types = [a.type for a in forward.args] + [a.type for a in backward.args] + extra
        with ir.InsertionPoint(self.module.body):
            fn = func.FuncOp("step", (types, []))
            self.entry = fn.add_entry_block()
        args = list(self.entry.arguments)
        nf, nb = len(forward.args), len(backward.args)
        self.fargs, self.bargs, self.extra = args[:nf], args[nf:nf + nb], args[nf + nb:]
        self.fmap = dict(zip(forward.args, self.fargs))
        for k in forward.invariant:
            self._constant(forward.args[k], forward.loop.operands[k], self.fmap)
        self.here = ir.InsertionPoint(self.entry)
        for op in forward.ops:
            self.clone(op, self.fmap)
        self.stored = {k: self.fmap[defining_op(forward.yields[k]).operands[1]]
                       for k in forward.buffers}

    def _constant(self, arg, outside, mapping: dict) -> None:
        """Map loop-invariant `arg` to a clone of `outside` where that is a constant or a
        broadcast of one (a comparison's branches must be seen as constants)."""
        op = defining_op(outside)
        if op is None:
            return
        if op.name == "stablehlo.constant":
            mapping[arg] = op.clone(ir.InsertionPoint(self.entry)).results[0]
        elif op.name == "stablehlo.broadcast_in_dim":
            inner = {}
            self._constant(arg, op.operands[0], inner)
            if arg in inner:
                clone = op.clone(ir.InsertionPoint(self.entry))
                clone.operands[0] = inner[arg]
                mapping[arg] = clone.results[0]

    def clone(self, op: ir.Operation, mapping: dict) -> ir.Operation:
        clone = op.clone(self.here)
        for i, operand in enumerate(clone.operands):
            if operand in mapping:
                clone.operands[i] = mapping[operand]
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
        return clone

    def backward_map(self, substitutes: dict[int, object]) -> dict:
        """A mapping of the backward's body for a clone: its carries the free arguments (or
        `substitutes`: carry -> value), its loop-invariant constants cloned (its reads are
        bound to the forward's stores as it is cloned: `clone_backward`)."""
        mapping = dict(zip(self.backward.args, self.bargs))
        for k in self.backward.invariant:
            self._constant(self.backward.args[k], self.backward.loop.operands[k], mapping)
        for k, value in substitutes.items():
            mapping[self.backward.args[k]] = value
        return mapping

    def clone_backward(self, mapping: dict) -> list[tuple[ir.Operation, ir.Operation]]:
        """Clone the backward's body ops with `mapping`: (op, clone) pairs; a read becomes
        the stored row, its unit dim dropped where the next reshape drops it."""
        created = []
        for op in self.backward.ops:
            if read_through(op, mapping, self.backward.reads, self.stored_of):
                continue
            created.append((op, self.clone(op, mapping)))
        return created

    def stored_of(self, k: int):
        return self.stored[self.backward.buffers[k]]

    def build(self, make) -> object:
        """A value built at the end of the scratch function by `make()` (stablehlo builders)."""
        with self.here, ir.Location.unknown():
            return make()

    def erase(self) -> None:
        """Let the scratch function go (the module is freed with its last reference)."""
        self.module = None


def read_through(op: ir.Operation, mapping: dict, reads: dict, stored) -> bool:
    """Map `op`'s result instead of cloning it where it reads a buffer (the row: `stored(k)`)
    or drops the unit dim of such a row (`reshape(broadcast_in_dim(x))` back to x's type:
    x); True when mapped."""
    if op.name == "stablehlo.dynamic_slice" and op.results[0] in reads:
        mapping[op.results[0]] = stored(reads[op.results[0]])
        return True
    if op.name == "stablehlo.reshape":
        source = mapping.get(op.operands[0])
        broadcast = defining_op(source) if source is not None else None
        if broadcast is not None and broadcast.name == "stablehlo.broadcast_in_dim" and (
                broadcast.operands[0].type == op.results[0].type) and _inserts_unit_dims(
                broadcast):
            mapping[op.results[0]] = broadcast.operands[0]
            return True
    return False


def _inserts_unit_dims(broadcast: ir.Operation) -> bool:
    dims = i64s(broadcast, "broadcast_dimensions")
    shape, into = shape_of(broadcast.operands[0]), shape_of(broadcast.results[0])
    return dims == sorted(set(dims)) and all(shape[i] == into[d] for i, d in enumerate(dims)) \
        and all(n == 1 for d, n in enumerate(into) if d not in dims)


def _zero_scalar(element: ir.Type):
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
        ir.RankedTensorType.get([], element), ir.FloatAttr.get(element, 0.0))).result


def _sum_over(value, dims: list[int]):
    """`reduce_add(value, dims)` (built at the current insertion point)."""
    if not dims:
        return value
    tensor = ir.RankedTensorType(value.type)
    element = tensor.element_type
    shape = [n for d, n in enumerate(tensor.shape) if d not in dims]
    reduce = stablehlo.ReduceOp([ir.RankedTensorType.get(shape, element)], [value],
                                [_zero_scalar(element)], dims)
    scalar = ir.RankedTensorType.get([], element)
    block = reduce.body.blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp([stablehlo.AddOp(*block.arguments).result])
    return reduce.results[0]


def _adjoint(value, chain: list[ir.Operation]):
    """The adjoint of the views `chain` (outermost first) applied to `value` (the chain's
    result shape): sums over the dims a broadcast creates or widens, reshapes and
    transposes undone; None for a broadcast that reorders dims."""
    for op in chain:
        source = shape_of(op.operands[0])
        if op.name == "stablehlo.broadcast_in_dim":
            dims = i64s(op, "broadcast_dimensions")
            if dims != sorted(dims):
                return None
            into = shape_of(op.results[0])
            summed = [d for d in range(len(into)) if d not in dims] + [
                d for i, d in enumerate(dims) if source[i] == 1 and into[d] != 1]
            value = _sum_over(value, sorted(summed))
        elif op.name == "stablehlo.transpose":
            perm = i64s(op, "permutation")
            inverse = [perm.index(d) for d in range(len(perm))]
            value = stablehlo.TransposeOp(value, inverse).result
            continue
        if shape_of(value) != source:
            element = ir.RankedTensorType(value.type).element_type
            value = stablehlo.ReshapeOp(ir.RankedTensorType.get(source, element), value).result
    return value


def _views(value, chain: list[ir.Operation], at: ir.InsertionPoint):
    """The views `chain` (outermost first) applied to `value` (clones at `at`)."""
    for op in reversed(chain):
        clone = op.clone(at)
        clone.operands[0] = value
        value = clone.results[0]
    return value


class _Known:
    """What `nonfinite_kinds` found of the program's values during one `fold_ring_pairs`,
    per mode (a check at t = 0 walks the cone of a layer's cotangents: the program before
    it), and the P_j the folds built, each in [0, 1] (its scores a block of the
    concatenation whose row max is its shift, finite), which it cannot see. The scratch
    steps' values never enter it (their modules go)."""

    def __init__(self) -> None:
        self.bounded: list = []
        self.fresh()

    def fresh(self) -> None:
        """Forget every value but the P_j (after a fold erased the loops)."""
        self.memos = {mode: Kinds(mode) for mode in (False, True)}
        for value in self.bounded:
            self.bound(value)

    def bound(self, value) -> None:
        if value not in self.bounded:
            self.bounded.append(value)
        for memo in self.memos.values():
            memo[value] = 0

    def forget_erased(self, keys: set[int]) -> None:
        for memo in self.memos.values():
            memo.forget_erased(keys)

    def finite(self, atoms: list, at: ir.Operation, scratch: bool) -> bool:
        """Every atom finite, judged at `at` in the judge's mode (which records a reliance
        on `--assume-no-overflow`): with these memos, or fresh ones for a scratch step's."""
        def test(memo) -> bool:
            mode = getattr(memo, "assume_no_overflow", False)
            mine = Kinds(mode) if scratch else self.memos[mode]
            return all(nonfinite_kinds(v, mine) == 0 for v in atoms)

        return judge(test, at)


class _Pair:
    """A differentiated ring: the forward `_Ring` (with its buffers) and its `_Backward`."""

    def __init__(self, forward: _Ring, backward: _Backward, known: _Known) -> None:
        self.forward, self.backward = forward, backward
        self.known = known
        self.max_cotangent: int | None = None
        self.dead: set[int] = set()
        self.pairing: dict[int, int] = {}
        self.zeroed = 0
        self.zeros: set[int] = set()
        """The zeros `zero_max_cotangent` put in the backward's body: their clones fold
        forward once the closed form is straight-line (the products they meet then read
        values known finite)."""

    # ----- the running max's cotangent ---------------------------------------------------

    def zero_max_cotangent(self) -> bool:
        """Where the backward carries the running max's cotangent: prove it the pairing of
        the accumulators with their cotangents (module docstring) and zero what it sends to
        the scores' argmax in the loop. True when that was proven and done."""
        forward, backward = self.forward, self.backward
        m_type = forward.args[forward.running].type
        cands = [k for k in backward.others if backward.args[k].type == m_type
                 and _is_zeros(backward.loop.operands[k])]
        for k in cands:
            partners = [[c for c in backward.others + list(backward.scaled)
                         if c != k and backward.args[c].type == forward.args[a].type]
                        for a in forward.accs]
            for pairing in itertools.product(*partners):
                if len(set(pairing)) == len(pairing) and self._zeroed(k, dict(zip(
                        forward.accs, pairing))):
                    self.max_cotangent = k
                    self.pairing = dict(zip(forward.accs, pairing))
                    backward.others.remove(k)
                    return True
        return False

    def _pairing(self, accs: dict, cots: dict):
        """sum_a adjoint_a(accs[a] * cots[a]) at the current insertion point."""
        total = None
        for a, acc in accs.items():
            _, chain = root_of(self.forward.rescales[a], MOVES_AND_TRANSPOSES)
            term = _adjoint(stablehlo.MulOp(acc, cots[a]).result, chain)
            if term is None:
                return None
            total = term if total is None else stablehlo.AddOp(total, term).result
        return total

    def _zeroed(self, k: int, pairing: dict[int, int]) -> bool:
        forward, backward = self.forward, self.backward
        step = _Step(forward, backward, [])
        try:
            fy = [step.fmap.get(v, v) for v in forward.yields]
            claimed = step.build(lambda: self._pairing(
                {a: fy[a] for a in pairing}, {a: step.bargs[c] for a, c in pairing.items()}))
            if claimed is None:
                return False
            mapping = step.backward_map({k: claimed})
            found = [(op, _candidate(c)) for op, c in step.clone_backward(mapping)]
            found = [(op, v) for op, v in found if v is not None]
            if not found:
                return False
            by = [mapping.get(v, v) for v in backward.yields]
            nxt = step.build(lambda: self._pairing(
                {a: step.fargs[a] for a in pairing}, {a: by[c] for a, c in pairing.items()}))
            if nxt is None:
                return False
            preserved = step.build(lambda: stablehlo.SubtractOp(by[k], nxt).result)
            if not all(self._is_zero(v) for _, v in found) or not self._is_zero(preserved):
                return False
            if not self._base(k, pairing):
                return False
            targets = [op for op, _ in found]
        finally:
            step.erase()
        body = backward.body
        before = {op_key(op) for op in body.operations}
        with ir.Location.unknown():
            for op in targets:
                zero = _zero_like(op.results[0], op)
                op.results[0].replace_all_uses_with(zero)
                _fold_zeros([zero], Kinds(active().assume_no_overflow))
                self.zeroed += 1
        self.zeros = {op_key(op) for op in body.operations if op_key(op) not in before}
        return True

    def _base(self, k: int, pairing: dict[int, int]) -> bool:
        """At t = 0 the running max's cotangent (the backward's initial value) is the
        pairing of the forward's results with the initial cotangents."""
        backward = self.backward.loop
        block = backward.operation.block
        before = {op_key(op) for op in block.operations}
        try:
            with ir.InsertionPoint(backward), ir.Location.unknown():
                total = self._pairing({a: self.forward.exits[a] for a in pairing},
                                      {a: backward.operands[c] for a, c in pairing.items()})
                if total is None:
                    return False
                diff = stablehlo.SubtractOp(backward.operands[k], total).result
            return polynomial.is_zero(diff, lambda atoms: self.known.finite(
                atoms, backward, scratch=False))
        finally:
            built = [op for op in block.operations if op_key(op) not in before]
            keys = {op_key(op) for op in built}
            for op in reversed(built):
                op.operation.erase()
            self.known.forget_erased(keys)

    def _is_zero(self, value) -> bool:
        """`value` of a scratch step is zero in real arithmetic, its atoms finite."""
        return polynomial.is_zero(value, lambda atoms: self.known.finite(
            atoms, self.backward.loop, scratch=True))

    # ----- the closed form ----------------------------------------------------------------

    def check(self) -> bool:
        """The backward's carries are those the closed form knows, the running max read
        safely, and the invariant of the scaled cotangents and contributions holds for one
        generic step (module docstring)."""
        forward, backward = self.forward, self.backward
        for k in backward.others:
            if any(True for _ in backward.loop.results[k].uses):
                return False
        self.dead = set(backward.others) | (
            {self.max_cotangent} if self.max_cotangent is not None else set())
        for k in list(self.dead) + list(backward.scaled) + list(backward.buffers):
            if any(True for _ in backward.loop.results[k].uses):
                return False
        self.contributions = {}
        for k, (add, permute) in backward.accs.items():
            held = backward.args[k] if permute is None else permute.results[0]
            self.contributions[k] = next(v for v in add.operands if v != held)
        roots = list(self.contributions.values())
        self.cone = _body_cone(roots, backward)
        if self.cone is None:
            return False
        allowed = set(backward.counts) | backward.invariant | set(backward.scaled)
        for value in self.cone[1]:
            if value not in backward.reads and value not in {backward.args[k] for k in allowed}:
                return False
        self.probabilities = {}
        for value in self.cone[1]:
            if value not in backward.reads:
                continue
            f = backward.buffers[backward.reads[value]]
            if f in forward.shifted:
                self.probabilities[f] = forward.shifted[f]
            elif f not in forward.plain:
                return False
        return self._invariant_holds()

    def _invariant_holds(self) -> bool:
        forward, backward = self.forward, self.backward
        m_type = forward.args[forward.running].type
        extra = [m_type] + [backward.args[k].type for k in backward.scaled]
        step = _Step(forward, backward, extra)
        try:
            e, inits = step.extra[0], dict(zip(backward.scaled, step.extra[1:]))
            free = step.backward_map({})
            step.clone_backward(free)
            chains = {}
            for k, mul in backward.scaled.items():
                mul_clone = defining_op(free[mul.results[0]])
                rescale = [v for v in mul_clone.operands if v != step.bargs[k]]
                if len(rescale) != 1:
                    return False
                root, chain = root_of(rescale[0], MOVES_AND_TRANSPOSES)
                if not _is_forward_rescale(root, step):
                    return False
                chains[k] = (root, chain)
            scaled = {k: step.build(lambda k=k: stablehlo.MulOp(
                inits[k], _views(e, chains[k][1], step.here)).result) for k in backward.scaled}
            body = step.backward_map(scaled)
            step.clone_backward(body)
            for k, (root, chain) in chains.items():
                claim = step.build(lambda k=k, root=root, chain=chain: stablehlo.SubtractOp(
                    body[backward.yields[k]], stablehlo.MulOp(inits[k], _views(
                        stablehlo.MulOp(e, root).result, chain, step.here)).result).result)
                if not self._is_zero(claim):
                    return False
            closed = step.backward_map(dict(inits))
            stored = dict(step.stored)
            for f, (_, sub) in self.probabilities.items():
                _, chain = root_of(sub.operands[1], MOVES_AND_TRANSPOSES)
                exp = step.fmap[_exp_of(sub).results[0]]
                scaled_p = step.build(lambda exp=exp, chain=chain: stablehlo.MulOp(
                    exp, _views(e, chain, step.here)).result)
                stored[f] = _rewrap(step.stored[f], scaled_p, step.here)
            return _congruent(step, body, closed, stored, self.cone[0], self._is_zero,
                              list(self.contributions.values()))
        finally:
            step.erase()

    def fold(self) -> None:
        """Build the closed form (module docstring) and replace both loops by it: step t
        after step t, its contributions applied to the accumulators by their own ops."""
        forward, backward = self.forward, self.backward
        loop, n = backward.loop, forward.trips
        at = ir.InsertionPoint(loop)
        rows = self._rows(at)
        current = {k: loop.operands[k] for k in backward.accs}
        self.folded_zeros = []
        for t in range(n):
            mapping = self._contributions(t, rows, at)
            for k, (add, permute) in backward.accs.items():
                held = current[k]
                if permute is not None:
                    clone = permute.clone(at)
                    clone.operands[0] = held
                    held = clone.results[0]
                clone = add.clone(at)
                contribution = mapping[self.contributions[k]]
                for i, operand in enumerate(add.operands):
                    clone.operands[i] = contribution if operand == self.contributions[k] \
                        else held
                current[k] = clone.results[0]
        for k, result in enumerate(loop.results):
            if k in backward.accs:
                result.replace_all_uses_with(current[k])
            elif k in backward.invariant:
                result.replace_all_uses_with(loop.operands[k])
            elif k in backward.counts:
                init, step_size = backward.counts[k]
                result.replace_all_uses_with(forward._constant(
                    backward.args[k], init + n * step_size, []))
        loop.erase()
        forward.commit()
        _fold_zeros(self.folded_zeros, Kinds(active().assume_no_overflow))

    def _rows(self, at: ir.InsertionPoint) -> dict[int, list]:
        """Forward buffer -> the row each step j stored, in the closed form: the clone of
        step j's slice, or for the probabilities P_j = exp(s_j - views(m_n))."""
        forward, backward = self.forward, self.backward
        m_n = forward.exits[forward.running]
        rows: dict[int, list] = {}
        for f in {backward.buffers[k] for k in backward.reads.values()}:
            update = defining_op(forward.yields[f]).operands[1]
            if f not in self.probabilities:
                rows[f] = [step.get(update, update) for step in forward.steps]
                continue
            s, sub = self.probabilities[f]
            _, chain = root_of(sub.operands[1], MOVES_AND_TRANSPOSES)
            rows[f] = []
            for step in forward.steps:
                with backward.loop.location:
                    shift = _views(m_n, chain, at)
                    with at:
                        p = stablehlo.ExpOp(stablehlo.SubtractOp(
                            step.get(s, s), shift).result).result
                self.known.bound(p)
                rows[f].append(_rewrap(update, p, at))
        return rows

    def _contributions(self, t: int, rows: dict[int, list], at: ir.InsertionPoint) -> dict:
        """The contributions' cone of backward step t cloned at `at` (the mapping from the
        body's values): the scaled cotangents their initial values, the reads forward step
        n - 1 - t's rows, the counters constant."""
        forward, backward = self.forward, self.backward
        loop, j = backward.loop, forward.trips - 1 - t
        mapping = {backward.args[k]: loop.operands[k]
                   for k in (*backward.invariant, *backward.scaled)}
        for k, (init, step_size) in backward.counts.items():
            mapping[backward.args[k]] = forward._constant(backward.args[k],
                                                          init + t * step_size, [])
        for op in backward.ops:
            if read_through(op, mapping, backward.reads,
                            lambda k: rows[backward.buffers[k]][j]):
                continue
            if op.operation not in self.cone[0]:
                continue
            clone = op.clone(at)
            for i, operand in enumerate(clone.operands):
                if operand in mapping:
                    clone.operands[i] = mapping[operand]
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
            if op_key(op) in self.zeros:
                self.folded_zeros.append(clone.results[0])
        return mapping


def _body_cone(roots: list, backward: _Backward):
    """(the body ops computing `roots`, the body arguments and reads they stop at)."""
    found: set = set()
    leaves: set = set()
    stack = list(roots)
    args = set(backward.args)
    while stack:
        value = stack.pop()
        if value in args or value in backward.reads:
            leaves.add(value)
            continue
        op = defining_op(value)
        if op is None or op.operation.block != backward.body or op in found:
            continue
        found.add(op)
        stack.extend(op.operands)
    return {op.operation for op in found}, leaves


def _exp_of(sub: ir.Operation) -> ir.Operation:
    return _op(next(iter(sub.results[0].uses)).owner)


def _shifted_by_new_max(update, forward: _Ring):
    """`views(exp(s - views(m')))`, m' the running max after the step and s computed from
    the blocks alone: (s, the subtract), else None."""
    root, _ = root_of(update, MOVES_AND_TRANSPOSES)
    if not is_exp_of_sub(root):
        return None
    sub = defining_op(defining_op(root).operands[0])
    s = sub.operands[0]
    shift, chain = root_of(sub.operands[1], MOVES_AND_TRANSPOSES)
    if unconverted(shift) != forward.yields[forward.running] or s != forward.scores:
        return None
    if len(_uses(sub.results[0])) != 1 or not _rows_placed(shift, chain, forward):
        return None
    return s, sub


def _rows_placed(m, chain: list[ir.Operation], forward: _Ring) -> bool:
    """The views `chain` put each row of the running max `m` on the scores' elements it is
    the max of (so `s - views(m) <= 0`, as `ring_fold._Ring._rescales` asks of a rescale)."""
    index = index_map(m, chain)
    y, m_shape = shape_of(forward.scores), shape_of(m)
    if index is None or index.shape != y or len(m_shape) != len(y) - 1:
        return False
    kept = [n if k != forward.dim else 1 for k, n in enumerate(y)]
    rows = np.broadcast_to(np.arange(math.prod(m_shape)).reshape(kept), y)
    return bool((rows == index).all())


def _is_forward_rescale(root, step: _Step) -> bool:
    """`root` is the forward's `exp(m - m')` (m the running max before the step, m' after)
    in the scratch step."""
    forward = step.forward
    if not is_exp_of_sub(root):
        return False
    sub = defining_op(defining_op(root).operands[0])
    old = step.fargs[forward.running]
    new = step.fmap[forward.yields[forward.running]]
    return [unconverted(v) for v in sub.operands] == [old, new]


def _max_read_safely(forward: _Ring) -> bool:
    """The running max before the step (-inf before the first) is read only by the
    maximum, comparisons, and `exp(m - m')`'s subtraction (through converts to its own
    type): an infinite m gives a finite maximum, a comparison, and exp(-inf) = 0."""
    pending = [forward.args[forward.running]]
    while pending:
        value = pending.pop()
        for user in _uses(value):
            if user.name == "stablehlo.convert" and user.results[0].type == value.type:
                pending.append(user.results[0])
            elif not (user.name in ("stablehlo.maximum", "stablehlo.compare") or (
                    user.name == "stablehlo.subtract" and user.operands[0] == value and {
                        u.name for u in _uses(user.results[0])} == {"stablehlo.exponential"})):
                return False
    return True


def _rewrap(update, value, at: ir.InsertionPoint):
    """`update` (views of an exponential) with `value` in place of the exponential: the
    views cloned at `at`."""
    _, chain = root_of(update, MOVES_AND_TRANSPOSES)
    return _views(value, chain, at)


def _congruent(step: _Step, body: dict, closed: dict, stored: dict, ops: set,
               is_zero, roots: list) -> bool:
    """The backward's ops `ops` computed twice (`body`: the step's own carries, `closed`:
    the closed form's; its reads `stored`) give the same `roots`: op by op, a result is the
    same where its operands are (then it is not cloned again) or, for arithmetic, where
    their difference is zero (`is_zero`); a root that stays apart fails."""
    backward = step.backward
    for op in backward.ops:
        if read_through(op, closed, backward.reads, lambda k: stored[backward.buffers[k]]):
            continue
        if op.operation not in ops:
            continue
        operands = [closed.get(v, v) for v in op.operands]
        if operands == [body.get(v, v) for v in op.operands]:
            for old in op.results:
                closed[old] = body[old]
            continue
        clone = step.clone(op, closed)
        if op.name in _ARITHMETIC and len(op.results) == 1 and isinstance(
                ir.RankedTensorType(op.results[0].type).element_type, ir.FloatType):
            diff = step.build(lambda a=body[op.results[0]], b=clone.results[0]:
                              stablehlo.SubtractOp(a, b).result)
            if is_zero(diff):
                closed[op.results[0]] = body[op.results[0]]
    return all(closed.get(r) == body.get(r) for r in roots)


def fold_ring_pairs(module: ir.Module, ops: list | None = None,
                    notes: list[str] | None = None, file: str = "-") -> int:
    """Fold every differentiated ring pair (module docstring) into its closed form; the
    number folded. Where only the running max's cotangent is proven zero, that is zeroed in
    the backward loop and the pair left to `unroll.py`. The loops are tried again while one
    folds: a layer's backward reads the cotangents the next layer's backward computes, whose
    values are known once that pair is folded."""
    loops = while_loops(module) if ops is None else [op for name, op in ops
                                                     if name == "stablehlo.while"]
    count = 0
    forwards: dict[int, _Ring | None] = {}
    known = _Known()
    progress = True
    while progress:
        progress = False
        for loop in loops:
            if _fold_pair(module, loop, forwards, known, notes, file):
                known.fresh()
                count += 1
                progress = True
                break
        loops = while_loops(module)
    if count:
        fold_counters(module)
        drop_zero_carries(module)
        _sweep(module)
    return count


def _fold_pair(module: ir.Module, loop: ir.Operation, forwards: dict[int, _Ring | None],
               known: _Known, notes: list[str] | None, file: str) -> bool:
    """Fold the pair `loop` is the forward of (False: not folded; the loop list is stale
    after a fold). The forward's closed form is built (once: `forwards`) and its results but the
    buffers replaced by it first (exact, `ring_fold`'s invariant), so that the checks at
    t = 0 read the forward's values as straight-line code."""
    key = op_key(loop)
    if key not in forwards:
        forwards[key] = _forward(loop)
        if forwards[key] is not None:
            known.fresh()  # the forward's results were replaced: what read them changed
    forward = forwards[key]
    if forward is None:
        return False
    backward = backward_of(loop, forward.trips)
    if backward is None:
        return False
    reader = _Backward(backward, forward)
    if not reader.read():
        return False
    pair = _Pair(forward, reader, known)
    with module.context, ir.Location.unknown():
        if pair.zero_max_cotangent():
            zeroed, zeros, pairing = pair.max_cotangent, pair.zeros, pair.pairing
            reader = _Backward(backward, forward)
            if not reader.read():
                return False
            pair = _Pair(forward, reader, known)
            pair.max_cotangent, pair.zeros, pair.pairing = zeroed, zeros, pairing
            if zeroed in reader.others:
                reader.others.remove(zeroed)
        if not pair.check():
            return False
        text = (f"forward: {forward.describe()}; backward: "
                f"{reader.describe(pair.dead, pair.max_cotangent, pair.pairing)}")
        where = parse_location(str(loop.location), file)
        pair.fold()
    if notes is not None:
        notes.append(f"the differentiated ring loops at {where or file} are folded by their "
                     f"invariant over {forward.trips} trips: {text}")
    return True


def _forward(loop: ir.Operation) -> _Ring | None:
    """The forward of a differentiated ring, read and its closed form built, its results
    but the buffers replaced (None: not such a forward, or not folded). Its buffers are
    `plain` (rows computed from the blocks alone: cloned per step) or `shifted`
    (`_shifted_by_new_max`: rows P_j in the closed form); their blocks join the slice
    cloned per step."""
    trips = trip_count(loop)
    if trips is None or backward_of(loop, trips) is None:
        return None
    forward = _Ring(loop, buffers=True)
    if not (forward.read() and forward.hoistable() and forward.buffers
            and _max_read_safely(forward)):
        return None
    forward.plain, forward.shifted = set(), {}
    for f, store in forward.buffers.items():
        update = store.operands[1]
        if forward.cone([update]) is not None:
            forward.plain.add(f)
        elif (shifted := _shifted_by_new_max(update, forward)) is not None:
            forward.shifted[f] = shifted
    blocks = [forward.buffers[f].operands[1] for f in forward.plain]
    if not forward.widen(blocks + [s for s, _ in forward.shifted.values()]):
        return None
    with loop.context, ir.Location.unknown():
        if not forward.build():
            return None
    forward.replace_results()
    return forward
