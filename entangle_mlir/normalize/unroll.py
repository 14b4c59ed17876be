"""Unrolling ring loops: a `stablehlo.while` that passes blocks around a ring (a
collective_permute in its body) with a constant trip count becomes that many copies of its body.

`lax.fori_loop(0, n, step, carry)` over the n devices of a mesh axis (ring attention's loop
form) carries the step index, and the body derives the device whose block it holds from it
(`(axis_index - i) % n`): a device-dependent integer that changes every iteration, which a
fixpoint over layouts cannot describe. Unrolled, every step is the straight-line code the
Python-unrolled ring produces (and its online softmax folds the same way). Exact: the loop
runs its body exactly `trip count` times on the carried values.

Only loops whose condition is `i < c` on a carried integer that starts at a constant and the
body increments by one are unrolled, only when the body holds a collective_permute, and only
up to `MAX_TRIPS` iterations; nested regions of the body must not read the body's values.
The counter must be an integer (a float counter's `i < 4.5` or `i + 1.5` is not a count of
`c - start` steps) and the bounds are read as the comparison reads them (signed or unsigned).

`lax.fori_loop` differentiated is two loops: the forward stores each step's residuals into
buffers (`dynamic_update_slice` at the counter) and the backward reads them back
(`dynamic_slice` at `n - 1 - counter`). Once both are unrolled the counters are chains of
constant integer arithmetic; `forward_residuals` folds them (`fold_counters`) and forwards
every read of a buffer slot to the value stored there (store-to-load forwarding), after
which the backward reads each step's values directly, as the Python-unrolled ring's does.

Such a differentiated ring is folded by its invariant at any trip count by `ring_pair.py`
(first); where that refuses (strict mode, a body it does not read), the pair (`residual_pairs`:
the forward writing every row of its buffers at its counter, the backward the one loop
reading them, both of the same trip count) is unrolled up to `MAX_RESIDUAL_TRIPS`, past
`MAX_TRIPS`: each step's residuals read at row n - 1 - i as the buffer invariant says (rows
< i hold the per-step values), the backward's carries composed step by step, which
`forward_residuals` then reads at constant rows (and `online_backward.py` telescopes).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.mlir.ir import erase_dead, op_key, ops_in_order, while_loops
from entangle_mlir.mlir.opinfo import compare_type, constant_value
from entangle_mlir.normalize.match import shape_of

MAX_TRIPS = 16
"""Longest ring loop unrolled (a ring has one step per device of its mesh axis)."""

MAX_RESIDUAL_TRIPS = 32
"""Longest differentiated ring unrolled (`residual_pairs`: a forward storing its residuals at
each step's row and the backward reading them; module docstring)."""


def unroll_ring_loops(module: ir.Module, ops: list | None = None) -> int:
    """Unroll every ring loop in place, within a budget of `MAX_TRIPS` copies of the module's
    ops; the number unrolled. `ops`: the module's ops as `ir.ops_in_order` lists them now
    (saves the first walk).

    The budget keeps the program linear in its size: ring loops one after the other (a
    forward and its backward) copy each body at most `MAX_TRIPS` times, within it, but ring
    loops nested k deep would copy the innermost body trips^k times (16 nested loops of two
    trips: 65536 copies, minutes). A loop past the budget stays a loop (read by the walk's
    fixpoint, as any loop that is not unrolled)."""
    count = 0
    size = len(ops) if ops is not None else count_ops(module.operation)
    loops = while_loops(module) if ops is None else [op for name, op in ops
                                                if name == "stablehlo.while"]
    pairs = residual_pairs(loops)
    budget = [max([MAX_TRIPS, *pairs.values()]) * size]
    while any(_unroll(loop, budget, pairs) for loop in loops):
        loops = while_loops(module)
        count += 1
    return count


def residual_pairs(loops: list[ir.Operation]) -> dict[int, int]:
    """The differentiated ring loops past `MAX_TRIPS` and up to `MAX_RESIDUAL_TRIPS` trips
    (`op_key` -> trips): the pairs `backward_of` finds."""
    pairs: dict[int, int] = {}
    for forward in loops:
        trips = trip_count(forward)
        if trips is None or not MAX_TRIPS < trips <= MAX_RESIDUAL_TRIPS:
            continue
        backward = backward_of(forward, trips)
        if backward is not None:
            pairs[op_key(forward)] = pairs[op_key(backward)] = trips
    return pairs


def backward_of(forward: ir.Operation, trips: int) -> ir.Operation | None:
    """The loop reading the residuals `forward` stores, when the two are a differentiated
    ring: `forward` a ring loop of `trips` trips whose counter runs from 0, writing buffers
    whose rows are its trips, one row a step at the counter (`residual_buffers`: after the
    loop every row holds a step's value), and the one ring loop of the same trip count that
    reads those buffers: only by `dynamic_slice`, carried unchanged. Else None."""
    buffers = residual_buffers(forward, trips)
    if not buffers or not is_ring(forward.regions[1].blocks[0]):
        return None
    uses = [use for k in buffers for use in forward.results[k].uses]
    owners = {op_key(use.owner): _as_op(use.owner) for use in uses}
    if len(owners) != 1:
        return None
    (backward,) = owners.values()
    if backward.name != "stablehlo.while" or trip_count(backward) != trips or not (
            is_ring(backward.regions[1].blocks[0])):
        return None
    if not all(read_only_by_slices(backward, use.operand_number) for use in uses):
        return None
    return backward


def _as_op(owner) -> ir.Operation:
    return owner.operation if hasattr(owner, "operation") else owner


def residual_buffers(loop: ir.Operation, trips: int) -> list[int]:
    """The carries of `loop` (counter from 0) that are buffers of `trips` rows written one
    row a step at the counter: `dynamic_update_slice(buffer, update, i, 0, ..., 0)`, the
    update one row deep; none if any carry is written anywhere else."""
    counter = loop_counter(loop)
    if counter is None or constant_int(loop.operands[counter.index]) != 0:
        return []
    body = loop.regions[1].blocks[0]
    index = body.arguments[counter.index]
    found = []
    for k, (arg, out) in enumerate(zip(body.arguments, list(body.operations)[-1].operands)):
        store = defining_op(out)
        if store is None or store.name != "stablehlo.dynamic_update_slice" or (
                store.operands[0] != arg):
            continue
        starts = list(store.operands[2:])
        shape = shape_of(arg)
        if not (starts[0] == index and all(constant_int(s) == 0 for s in starts[1:]) and (
                shape and shape[0] == trips and shape_of(store.operands[1])[0] == 1)):
            return []
        found.append(k)
    return found


def read_only_by_slices(loop: ir.Operation, slot: int) -> bool:
    """Carry `slot` of `loop` is yielded unchanged and read in the body only by
    `dynamic_slice` ops (a buffer the loop reads and never writes)."""
    body = loop.regions[1].blocks[0]
    arg = body.arguments[slot]
    if list(body.operations)[-1].operands[slot] != arg:
        return False
    return all(_as_op(use.owner).name == "stablehlo.dynamic_slice" and use.operand_number == 0
               for use in arg.uses if _as_op(use.owner).name != "stablehlo.return")


def count_ops(op: ir.Operation) -> int:
    """The number of ops in `op`, itself and those nested in its regions included."""
    count = [0]

    def visit(_):
        count[0] += 1
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return count[0]


def defining_op(value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def integer_width(value) -> int | None:
    """The bit width of `value`'s integer element type (None: not an integer of 2+ bits)."""
    element = ir.RankedTensorType(value.type).element_type
    if not isinstance(element, ir.IntegerType) or ir.IntegerType(element).width < 2:
        return None
    return ir.IntegerType(element).width


def constant_int(value) -> int | None:
    """The value of an integer constant holding one element (None for anything else, floats
    included: `int(4.5)` is not the bound a float comparison tests)."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.constant" or integer_width(value) is None:
        return None
    array, _ = constant_value(op.attributes["value"])
    if array.size != 1:
        return None
    try:
        return int(array.reshape(-1)[0])
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Counter:
    """The counter of a counted loop `for (i = start; i < limit; i += 1)`: carried value
    `index`, compared (signed or unsigned, at `width` bits) with the constant `limit`."""

    index: int
    limit: int
    width: int
    signed: bool

    def trips(self, start: int) -> int:
        """The number of iterations from the counter's initial bits `start`."""
        return max(0, self.limit - as_compared(start, self.width, self.signed))


def loop_counter(loop: ir.Operation) -> Counter | None:
    """The counter of `loop` when its condition is `i < c` on a carried integer `i` and a
    constant `c`, and its body adds exactly 1 to `i`; else None."""
    cond, body = loop.regions[0].blocks[0], loop.regions[1].blocks[0]
    ops = list(cond.operations)
    ret = ops[-1]
    compare = defining_op(ret.operands[0]) if len(ret.operands) == 1 else None
    if compare is None or compare.name != "stablehlo.compare" or "LT" not in str(
            compare.attributes["comparison_direction"]):
        return None
    counter, bound = compare.operands
    args = list(cond.arguments)
    if counter not in args:
        return None
    index = args.index(counter)
    width = integer_width(counter)
    if width is None:  # a float counter: not a count of steps
        return None
    signed = _signed_comparison(compare, counter)
    if signed is None:
        return None
    limit = constant_int(bound)
    body_ret = list(body.operations)[-1]
    step = defining_op(body_ret.operands[index])
    if limit is None or step is None or step.name != "stablehlo.add":
        return None
    a, b = step.operands
    increments = (a == body.arguments[index] and constant_int(b) == 1) or (
        b == body.arguments[index] and constant_int(a) == 1)
    if not increments:
        return None
    return Counter(index, as_compared(limit, width, signed), width, signed)


def trip_count(loop: ir.Operation) -> int | None:
    """The number of iterations of `for (i = c0; i < c; i += 1)`, else None."""
    counter = loop_counter(loop)
    if counter is None:
        return None
    start = constant_int(loop.operands[counter.index])
    return None if start is None else counter.trips(start)


def _signed_comparison(compare: ir.Operation, counter) -> bool | None:
    """Whether `compare` orders integers as signed (True) or unsigned (False); None for a
    float or total-order comparison (its compare type, the element type's default when the
    attribute is absent: `opinfo.compare_type`)."""
    return {"SIGNED": True, "UNSIGNED": False}.get(compare_type(compare))


def as_compared(value: int, width: int, signed: bool) -> int:
    """The integer a `width`-bit comparison sees for the bits of `value`. (The counter never
    wraps: it is incremented only while below the bound, which is representable.)"""
    value %= 1 << width
    return value - (1 << width) if signed and value >= 1 << (width - 1) else value


def is_ring(body: ir.Block) -> bool:
    """The loop body `body` holds a collective_permute (at any depth)."""
    found = [False]

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            found[0] = True
        return ir.WalkResult.ADVANCE

    for op in body.operations:
        op.walk(visit)
    return found[0]


def nested_reads_body(body: ir.Block) -> bool:
    """A region inside the body reads a value of the body (cloning would not remap it)."""
    outer = set(body.arguments) | {r for op in body.operations for r in op.results}
    reads = [False]

    def visit(op):
        if any(v in outer for v in op.operands):
            reads[0] = True
        return ir.WalkResult.ADVANCE

    for op in body.operations:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner.walk(visit)
    return reads[0]


def _unroll(loop: ir.Operation, budget: list[int], pairs: dict[int, int]) -> bool:
    """Unroll `loop` if it is a ring loop whose copies fit in `budget` (ops still allowed to
    be created; updated), of at most `MAX_TRIPS` trips or one of the differentiated rings
    `pairs` (`residual_pairs`)."""
    body = loop.regions[1].blocks[0]
    trips = trip_count(loop)
    if trips is None or (trips > MAX_TRIPS and op_key(loop) not in pairs) or not is_ring(
            body) or nested_reads_body(body):
        return False
    cost = trips * sum(count_ops(op) for op in body.operations)
    if cost > budget[0]:
        return False
    budget[0] -= cost
    pairs.pop(op_key(loop), None)  # its address may be reused once it is erased
    current = list(loop.operands)
    ops = list(body.operations)
    for _ in range(trips):
        mapping = dict(zip(body.arguments, current))
        for op in ops[:-1]:
            clone = op.clone(ir.InsertionPoint(loop))
            for i, operand in enumerate(clone.operands):
                if operand in mapping:
                    clone.operands[i] = mapping[operand]
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
        current = [mapping.get(v, v) for v in ops[-1].operands]
    for result, value in zip(loop.results, current):
        result.replace_all_uses_with(value)
    loop.erase()
    return True


_COUNTER_ARITHMETIC = {"stablehlo.add": operator.add, "stablehlo.subtract": operator.sub,
                       "stablehlo.multiply": operator.mul}
"""Integer scalar ops folded once their operands are constants (an unrolled loop's counter)."""


def forward_residuals(module: ir.Module) -> int:
    """After unrolling: fold the counters, then forward every read of a residual buffer at
    constant indices to the value stored there, erasing the stores left unread. The number
    of folds and forwards (0: the module is unchanged)."""
    count = fold_counters(module)
    loads = [op for op in _ops(module) if op.name in _LOADS]
    for load in loads:
        count += _forward(load)
    count += drop_zero_carries(module)
    stores = [(op_key(op), op) for op in _ops(module)
              if op.name == "stablehlo.dynamic_update_slice"]
    erased: set[int] = set()
    for key, op in stores:
        if key not in erased:
            erase_dead(op, _erasable, erased)
    return count


def _ops(module: ir.Module) -> list[ir.Operation]:
    return [op for _, op in ops_in_order(module)]


def _erasable(name: str) -> bool:
    return name.startswith("stablehlo.")


def fold_counters(module: ir.Module) -> int:
    """Replace every add, subtract or multiply of two integer scalar constants by its value
    (wrapping at the type's width, as the op does). One pass in order folds whole chains."""
    count = 0
    for op in _ops(module):
        fn = _COUNTER_ARITHMETIC.get(op.name)
        if fn is None or len(op.results) != 1:
            continue
        result = op.results[0]
        tensor = ir.RankedTensorType(result.type)
        width = integer_width(result)
        if tensor.rank != 0 or width is None:
            continue
        a, b = (constant_int(v) for v in op.operands)
        if a is None or b is None:
            continue
        element = ir.IntegerType(tensor.element_type)
        value = as_compared(fn(a, b), width, not element.is_unsigned)
        with ir.InsertionPoint(op), op.location:
            attr = ir.DenseElementsAttr.get_splat(
                tensor, ir.IntegerAttr.get(tensor.element_type, value))
            constant = stablehlo.ConstantOp(attr).result
        result.replace_all_uses_with(constant)
        op.erase()
        count += 1
    return count


_LOADS = ("stablehlo.dynamic_slice", "stablehlo.slice")


def _index(value) -> int | None:
    """A constant start index as the op reads it (signed unless its type is unsigned)."""
    raw = constant_int(value)
    if raw is None:
        return None
    element = ir.IntegerType(ir.RankedTensorType(value.type).element_type)
    return as_compared(raw, ir.IntegerType(element).width, not element.is_unsigned)


def _clamped(starts: list, dims: tuple[int, ...], sizes: tuple[int, ...]
             ) -> tuple[int, ...] | None:
    """Start indices clamped into the operand, as dynamic_slice and dynamic_update_slice
    clamp them (None: one is not a constant)."""
    out = []
    for start, dim, size in zip(starts, dims, sizes):
        index = _index(start)
        if index is None:
            return None
        out.append(min(max(index, 0), dim - size))
    return tuple(out)


def _region(load: ir.Operation) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(starts, sizes) of the block a constant-index read takes from its operand."""
    sizes = shape_of(load.results[0])
    if load.name == "stablehlo.slice":
        strides = list(ir.DenseI64ArrayAttr(load.attributes["strides"]))
        if any(s != 1 for s in strides):
            return None
        return tuple(ir.DenseI64ArrayAttr(load.attributes["start_indices"])), sizes
    starts = _clamped(list(load.operands[1:]), shape_of(load.operands[0]), sizes)
    return None if starts is None else (starts, sizes)


def _stored(load: ir.Operation):
    """The value a read at constant indices finds in a buffer built by
    dynamic_update_slices at constant indices: the update writing exactly its block, after
    any updates of disjoint blocks (None: no such update, or one overlaps the block only in
    part, or an index is not constant)."""
    region = _region(load)
    if region is None:
        return None
    starts, sizes = region
    buffer = load.operands[0]
    while True:
        store = defining_op(buffer)
        if store is None or store.name != "stablehlo.dynamic_update_slice":
            return None
        update = store.operands[1]
        written = _clamped(list(store.operands[2:]), shape_of(buffer), shape_of(update))
        if written is None:
            return None
        if written == starts and shape_of(update) == sizes:
            return update if update.type == load.results[0].type else None
        if not any(w + u <= s or s + z <= w
                   for w, u, s, z in zip(written, shape_of(update), starts, sizes)):
            return None
        buffer = store.operands[0]


def _is_zeros(value) -> bool:
    """A splat constant 0, or a broadcast_in_dim of one."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.constant":
        return False
    array, splat = constant_value(op.attributes["value"])
    try:
        return bool(splat) and float(array.reshape(-1)[0]) == 0.0
    except (TypeError, ValueError):
        return False


def drop_zero_carries(module: ir.Module) -> int:
    """A collective_permute of zeros is those zeros (every device receives zeros, sent or
    not), and `0 + x`, `x + 0` are x: the zero cotangents an unrolled backward loop starts
    its carries with. The number dropped."""
    count = 0
    for op in _ops(module):
        if op.name == "stablehlo.collective_permute" and len(op.operands) == 1 and (
                _is_zeros(op.operands[0])
                and op.operands[0].type == op.results[0].type):
            op.results[0].replace_all_uses_with(op.operands[0])
        elif op.name == "stablehlo.add" and _is_zeros(op.operands[0]):
            op.results[0].replace_all_uses_with(op.operands[1])
        elif op.name == "stablehlo.add" and _is_zeros(op.operands[1]):
            op.results[0].replace_all_uses_with(op.operands[0])
        else:
            continue
        op.erase()
        count += 1
    return count


def _forward(load: ir.Operation) -> int:
    value = _stored(load)
    if value is None:
        return 0
    views = [use.owner for use in load.results[0].uses]
    load.results[0].replace_all_uses_with(value)
    load.erase()
    for view in views:
        _unit_dims_dropped(view)
    return 1


def _unit_dims_dropped(reshape) -> None:
    """`reshape(broadcast_in_dim(x))` back to x's type, where the broadcast only inserts unit
    dims (jax's `dynamic_index_in_dim` reads a slot as a (1, ...) block and drops its unit
    dim): x itself."""
    op = getattr(reshape, "operation", reshape)
    if op.name != "stablehlo.reshape":
        return
    broadcast = defining_op(op.operands[0])
    if broadcast is None or broadcast.name != "stablehlo.broadcast_in_dim":
        return
    source = broadcast.operands[0]
    if source.type != op.results[0].type:
        return
    dims = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
    shape, into = shape_of(source), shape_of(broadcast.results[0])
    if dims != sorted(set(dims)) or any(shape[i] != into[d] for i, d in enumerate(dims)):
        return
    if any(size != 1 for d, size in enumerate(into) if d not in dims):
        return
    op.results[0].replace_all_uses_with(source)
    op.erase()
