"""Matching and editing StableHLO values: the helpers the normalize rewrites and analyses share.

A value's defining op and shape (`defining_op`, `shape_of`; `i64s` reads an array
attribute), the root a chain of broadcasts and reshapes reads (`root_of`) and which element of
it each element reads (`index_map`), the reductions and constants the rewrites look for
(`sum_reduce`, `max_reduce`, `splat_of`), a walk of a value's cone operands first
(`operands_first`), and erasing an op with the producers it leaves dead (`erase_and_prune`).

The rewrites edit the IR through `replace_uses`, `set_operand`, `set_attribute` and
`erase_and_prune`, and navigate it through `defining_op` and `uses_of`; within `reading` and
`editing` those are noted, so that a rewrite driver retries an op only where something it read
changed (`rewrites.Worklist`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.mlir.compat import block_argument
from entangle_mlir.mlir.ir import erase_dead, op_key, producer
from entangle_mlir.mlir.opinfo import constant_value, reducer_kind

MOVES = ("stablehlo.broadcast_in_dim", "stablehlo.reshape")
"""Ops that only lay out the values of their operand again (a root reads through them)."""
MOVES_AND_TRANSPOSES = (*MOVES, "stablehlo.transpose")

MAX_INDEX = 1 << 22
"""Largest tensor whose element-to-root index map is computed (to compare two views)."""


def defining_op(value) -> ir.Operation | None:
    """The op whose result `value` is; None for a block argument. Within `reading`, noted as
    read."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation if hasattr(owner, "operation") else owner
    reads = _READS.get()
    if reads is not None:
        reads.ops.add(op)
    return op


def uses_of(value) -> list:
    """The uses of `value` (`ir.OpOperand`s). Within `reading`, its producer's uses are noted
    as read."""
    reads = _READS.get()
    if reads is not None:
        op = producer(value)
        if op is not None:
            reads.uses.add(op)
    return list(value.uses)


class Reads:
    """What one rewrite attempt read (`reading`): the ops it reached (their operands,
    attributes and types), and the ops whose results' uses it listed. (Handles, compared as
    ops: the IR does not change while an attempt reads it; `keys` names them for later.)"""

    __slots__ = ("ops", "uses")

    def __init__(self) -> None:
        self.ops: set[ir.Operation] = set()
        self.uses: set[ir.Operation] = set()

    def keys(self) -> tuple[set[int], set[int]]:
        """The keys (`ir.op_key`) of the ops read, and of the ops whose uses were read."""
        return {op_key(op) for op in self.ops}, {op_key(op) for op in self.uses}


_READS: contextvars.ContextVar[Reads | None] = contextvars.ContextVar("reads", default=None)


@contextlib.contextmanager
def reading() -> Iterator[Reads]:
    """Note what `defining_op`, `uses_of` and `operands_first` (with a memo that is not a
    `Memo`) reach within the block."""
    reads = Reads()
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


class Edits:
    """What the rewrites changed within `editing`, besides the ops they erased (`erasures`):
    `changed`, the ops given another operand or attribute; `touched`, the ops whose results
    gained or lost uses; `installed`, the producers of the values given new uses (a new op
    among them leads to the others: `rewrites.Worklist` finds the new ops from there). Each
    by its key (`ir.op_key`, taken while the op is alive)."""

    def __init__(self) -> None:
        self.changed: dict[int, ir.Operation] = {}
        self.touched: dict[int, ir.Operation] = {}
        self.installed: dict[int, ir.Operation] = {}
        self.epoch = 0
        self.changed_at: dict[int, int] = {}
        self.remembered: dict = {}

    def __bool__(self) -> bool:
        return bool(self.changed or self.touched or self.installed)

    def clear(self) -> None:
        """Forget the edits (not when each op last changed: `remembered` needs that)."""
        self.changed.clear()
        self.touched.clear()
        self.installed.clear()

    def change(self, op) -> None:
        op = getattr(op, "operation", op)
        key = op_key(op)
        self.changed[key] = op
        self.stamp(key)

    def stamp(self, key: int) -> None:
        """The op of `key` changed (other operands or attributes) or was erased now."""
        self.epoch += 1
        self.changed_at[key] = self.epoch

    def touch(self, value, installed: bool = False) -> None:
        op = producer(value)
        if op is not None:
            self.touched[op_key(op)] = op
            if installed:
                self.installed[op_key(op)] = op


_EDITS: contextvars.ContextVar[Edits | None] = contextvars.ContextVar("edits", default=None)


@contextlib.contextmanager
def editing() -> Iterator[Edits]:
    """The edits `replace_uses`, `set_operand`, `set_attribute` and `erase_and_prune` make
    within the block, as an `Edits` the caller may clear as it goes."""
    edits = Edits()
    token = _EDITS.set(edits)
    try:
        yield edits
    finally:
        _EDITS.reset(token)


def replace_uses(old, new) -> None:
    """`old.replace_all_uses_with(new)`, noted within `editing`: the users of `old` get
    another operand, `old`'s and `new`'s producers other uses."""
    edits = _EDITS.get()
    if edits is not None:
        for use in old.uses:
            edits.change(use.owner)
        edits.touch(old)
        edits.touch(new, installed=True)
    old.replace_all_uses_with(new)


def set_operand(op: ir.Operation, index: int, value) -> None:
    """`op.operands[index] = value`, noted within `editing`."""
    edits = _EDITS.get()
    if edits is not None:
        edits.change(op)
        edits.touch(op.operands[index])
        edits.touch(value, installed=True)
    op.operands[index] = value


def set_attribute(op: ir.Operation, name: str, value: ir.Attribute) -> None:
    """`op.attributes[name] = value`, noted within `editing`."""
    edits = _EDITS.get()
    if edits is not None:
        edits.change(op)
    op.attributes[name] = value


def shape_of(value) -> tuple[int, ...]:
    """The shape of a ranked tensor value."""
    return tuple(ir.RankedTensorType(value.type).shape)


def i64s(op, name) -> list[int]:
    """The integers of the dense i64 array attribute `name` of `op` (dims, permutations)."""
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


class Memo(dict):
    """A memo of an analysis over IR values (`operands_first` fills it) that outlives
    rewrites: it records the op each value belongs to (its defining op, or a block
    argument's parent op), so that `forget_erased` drops the values of erased ops, whose
    addresses (the keys) a new op may reuse. The other values keep what they were given:
    the rewrites are exact, so a value downstream of one holds the same numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.owners: dict = {}
        self._owned: dict[int, list] = {}

    def own(self, value, key: int) -> None:
        """Record that `value` belongs to the op whose key is `key`."""
        self.owners[value] = key
        self._owned.setdefault(key, []).append(value)

    def forget_erased(self, erased: set[int]) -> None:
        """Drop the values of the ops whose keys (`ir.op_key`) are in `erased`."""
        for key in erased:
            for value in self._owned.pop(key, ()):
                if self.owners.get(value) == key:
                    self.pop(value, None)
                    del self.owners[value]

    def forget_downstream(self, ops: list[ir.Operation]) -> None:
        """Drop the values computed from the results of `ops` (given other operands or
        attributes), and everything computed from those: what a fresh memo would compute
        anew. The memo holds each value's cone with it (`operands_first`), so the walk along
        the uses stops at a value it lacks (a shard_map's body arguments are its operands)."""
        stack = [r for op in ops for r in op.results]
        while stack:
            value = stack.pop()
            if value not in self:
                continue
            del self[value]
            self.owners.pop(value, None)
            for use in value.uses:
                user = getattr(use.owner, "operation", use.owner)
                stack += list(user.results)
                if user.name == "sdy.manual_computation":
                    stack += list(user.regions[0].blocks[0].arguments)


def operands_first(value, memo: dict):
    """The values of `value`'s cone that `memo` lacks, each after its operands (a shard_map
    body argument's operand is the shard_map's operand it receives), as (value, its defining
    op or None, that outer operand or None). The caller puts each value in `memo` before
    asking for the next (a `Memo` also learns its op). Iterative: the cone of a layer is the
    whole program before it."""
    owners = memo.owners if isinstance(memo, Memo) else None
    navigate = defining_op if owners is None else producer
    stack = [value]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        op = navigate(top)
        outer = _outer_operand(top) if op is None else None
        waiting = [v for v in (op.operands if op is not None else [outer] if outer else [])
                   if v not in memo]
        if waiting:
            stack.extend(waiting)
            continue
        stack.pop()
        if owners is not None:
            memo.own(top, op_key(op if op is not None else top.owner.owner.operation))
        yield top, op, outer


def _outer_operand(value):
    """The operand of the shard_map (`sdy.manual_computation`) whose body argument `value`
    is (None for any other value)."""
    owner = value.owner
    op = owner.owner if isinstance(owner, ir.Block) else None
    if op is None or op.operation.name != "sdy.manual_computation":
        return None
    reads = _READS.get()
    if reads is not None:
        reads.ops.add(op.operation)
    return op.operation.operands[block_argument(value).arg_number]


def root_of(value, through: tuple[str, ...] = MOVES) -> tuple[object, list[ir.Operation]]:
    """The value under a chain of `through` ops (broadcast_in_dim / reshape by default), and the
    chain (outermost first)."""
    chain = []
    op = defining_op(value)
    while op is not None and op.name in through:
        chain.append(op)
        value = op.operands[0]
        op = defining_op(value)
    return value, chain


def index_map(root, chain: list[ir.Operation], created: list[int] = ()) -> np.ndarray | None:
    """For each element of the chain's result, the flat index of the root element it reads.

    Dims in `created` that the outermost broadcast_in_dim creates (from no operand dim or a
    unit one) are computed at size 1: the map does not vary along them, so their slice at 0
    is the map, and a vocab-wide broadcast of a per-token max stays small."""
    shape = shape_of(root)
    if math.prod(shape) > MAX_INDEX:
        return None
    index = np.arange(math.prod(shape)).reshape(shape)
    for op in reversed(chain):
        out = None
        if op is chain[0] and created and op.name == "stablehlo.broadcast_in_dim" and all(
                created_by(op, d) for d in created):
            out = tuple(1 if d in created else size
                        for d, size in enumerate(shape_of(op.results[0])))
        index = index_map_step(index, op, out)
        if index is None:
            return None
    return index


def index_map_step(index: np.ndarray, op: ir.Operation,
                   out: tuple[int, ...] | None = None) -> np.ndarray | None:
    """`index` carried through one broadcast_in_dim, reshape or transpose (to the shape `out`
    instead of the op's result shape where given)."""
    if op.name == "stablehlo.transpose":
        return index.transpose(i64s(op, "permutation"))
    out = out or shape_of(op.results[0])
    if math.prod(out) > MAX_INDEX:
        return None
    if op.name == "stablehlo.reshape":
        return index.reshape(out)
    dims = i64s(op, "broadcast_dimensions")
    expanded = [1] * len(out)
    for i, d in enumerate(dims):
        expanded[d] = index.shape[i]
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    return np.broadcast_to(index.transpose(order).reshape(expanded), out)


def created_by(broadcast: ir.Operation, dim: int) -> bool:
    """Result dim `dim` of a broadcast_in_dim reads no operand dim, or a unit one."""
    dims = i64s(broadcast, "broadcast_dimensions")
    return dim not in dims or shape_of(broadcast.operands[0])[dims.index(dim)] == 1


def same_along(sub_index: np.ndarray, dims: list[int], kept_index: np.ndarray) -> bool:
    """Every element of `sub_index` reads the root element that `kept_index` (the reduced
    shape) reads at the position it is reduced into."""
    kept = [d for d in range(sub_index.ndim) if d not in dims]
    first = sub_index[tuple(slice(None) if d in kept else slice(0, 1)
                            for d in range(sub_index.ndim))]
    if not (sub_index == first).all():
        return False
    return first.reshape([sub_index.shape[d] for d in kept]).shape == kept_index.shape and (
        first.reshape(kept_index.shape) == kept_index).all()


def splat_of(value, wanted: float) -> bool:
    """`value` is the constant `wanted` everywhere (a constant, or a broadcast of one)."""
    op = defining_op(value)
    while op is not None and (op.name in MOVES or op.name == "stablehlo.convert" and (
            ir.RankedTensorType(op.operands[0].type).element_type
            == ir.RankedTensorType(op.results[0].type).element_type)):
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.constant":
        return False
    array, _ = constant_value(op.attributes["value"])
    try:
        return bool(np.all(array.astype(float) == wanted))
    except (TypeError, ValueError):
        return False


def _zero_init(op: ir.Operation) -> bool:
    init = defining_op(op.operands[1])
    if init is None or init.name != "stablehlo.constant":
        return False
    value, _ = constant_value(init.attributes["value"])
    return value.size == 1 and float(value.reshape(-1)[0]) == 0.0


def sum_reduce(op: ir.Operation | None) -> bool:
    """`op` is a single-operand sum reduction from zero."""
    return (op is not None and op.name == "stablehlo.reduce" and len(op.operands) == 2
            and reducer_kind(op) == "add" and _zero_init(op))


def max_reduce(op: ir.Operation | None) -> list[int] | None:
    """The reduced dims of a single-operand max reduction; None for anything else."""
    if op is None or op.name != "stablehlo.reduce" or len(op.operands) != 2:
        return None
    if reducer_kind(op) != "max":
        return None
    return i64s(op, "dimensions")


def finite_test(pred, value) -> bool:
    """`pred` is is_finite(value) (broadcast alike): `select(pred, value, c)` is value where
    it is finite and c elsewhere (jax's logsumexp guards its max so)."""
    op = defining_op(pred)
    return op is not None and op.name == "stablehlo.is_finite" and op.operands[0] == value


def attr_names(op: ir.Operation) -> set[str]:
    """The names of `op`'s attributes."""
    return {a if isinstance(a, str) else a.name for a in op.attributes}


def same_value(a, b, depth: int = 6) -> bool:
    """`a` and `b` are the same value, or the same op (attributes and types) applied to the
    same values (each ring step recomputes its constants and broadcasts)."""
    if a == b:
        return True
    first, second = defining_op(a), defining_op(b)
    if depth == 0 or first is None or second is None or first.name != second.name or (
            a.type != b.type or len(first.operands) != len(second.operands)
            or len(first.regions) or len(second.regions)):
        return False
    names = attr_names(first)
    if names != attr_names(second) or any(not same_attribute(first.attributes[n],
                                                             second.attributes[n])
                                          for n in names):
        return False
    return all(same_value(x, y, depth - 1) for x, y in zip(first.operands, second.operands))


def same_attribute(a: ir.Attribute, b: ir.Attribute) -> bool:
    """`a` and `b` print alike: the same (uniqued) attribute, else compared as printed."""
    return a == b or str(a) == str(b)


def same_but(a: tuple[int, ...], b: tuple[int, ...], dim: int) -> bool:
    """Shapes `a` and `b` agree on every dim but `dim` (blocks of one concatenation)."""
    return len(a) == len(b) and all(x == y for d, (x, y) in enumerate(zip(a, b)) if d != dim)


def erase_and_prune(op: ir.Operation) -> None:
    """Erase `op` and then its operands' producers that it left without uses (memory-safe:
    `ir.erase_dead`); within `erasures`, their keys are collected, and within `editing` the
    producers left alive are noted as touched."""
    erased: set[int] = set()
    edits = _EDITS.get()
    erase_dead(op, _erasable, erased, None if edits is None else edits.touched)
    collected = _ERASED.get()
    if collected is not None:
        collected |= erased
    if edits is not None:
        for key in erased:
            edits.stamp(key)


def remembered(key, compute: Callable[[], object]) -> object:
    """`compute()`, remembered across rewrite attempts (within `editing` and `reading`) as
    long as none of the ops it read (`defining_op`) changed or was erased since: for a pure
    function of the IR it reads (no finiteness memo, no uses), keyed by its arguments (`key`,
    with the function's name). Its reads join the attempt's either way, so the rewrite
    driver retries the attempt when they change, as if it had computed it again."""
    edits, outer = _EDITS.get(), _READS.get()
    if edits is None or outer is None:
        return compute()
    found = edits.remembered.get(key)
    if found is not None:
        result, ops, keys, epoch = found
        changed_at = edits.changed_at
        if all(changed_at.get(k, 0) <= epoch for k in keys):
            outer.ops |= ops
            return result
    epoch = edits.epoch
    with reading() as reads:
        result = compute()
    outer.ops |= reads.ops
    outer.uses |= reads.uses
    ops = frozenset(reads.ops)
    edits.remembered[key] = (result, ops, [op_key(op) for op in ops], epoch)
    return result


_ERASED: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "erased", default=None)


@contextlib.contextmanager
def erasures() -> Iterator[set[int]]:
    """The keys (`ir.op_key`) of the ops `erase_and_prune` erases within the block, as a set
    the caller may empty as it goes (a `Memo` forgets those ops' values)."""
    found: set[int] = set()
    token = _ERASED.set(found)
    try:
        yield found
    finally:
        _ERASED.reset(token)


def _erasable(name: str) -> bool:
    return not name.startswith(("func.", "sdy."))


def dot_operand_dims(op: ir.Operation, dim: int) -> list[int | None]:
    """For each operand of the dot_general `op`, the dim that becomes result dim `dim`
    (None: that operand has no such dim; result dims are batch, lhs free, rhs free)."""
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    batch = [list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)]
    contract = [list(numbers.lhs_contracting_dimensions),
                list(numbers.rhs_contracting_dimensions)]
    free = [[d for d in range(len(shape_of(v))) if d not in batch[s] + contract[s]]
            for s, v in enumerate(op.operands)]
    if dim < len(batch[0]):
        return [batch[0][dim], batch[1][dim]]
    k = dim - len(batch[0])
    if k < len(free[0]):
        return [free[0][k], None]
    return [None, free[1][k - len(free[0])]]
