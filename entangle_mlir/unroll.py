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
"""

from __future__ import annotations

from jaxlib.mlir import ir

from .opinfo import constant_value

MAX_TRIPS = 16
"""Longest ring loop unrolled (a ring has one step per device of its mesh axis)."""


def unroll_ring_loops(module: ir.Module, ops: list | None = None) -> int:
    """Unroll every ring loop in place; the number unrolled. `ops`: the module's ops as
    `ir.ops_in_order` lists them now (saves the first walk)."""
    count = 0
    loops = None if ops is None else [op for name, op in ops if name == "stablehlo.while"]
    while any(_unroll(loop) for loop in (_loops(module) if loops is None else loops)):
        loops = None
        count += 1
    return count


def _loops(module: ir.Module) -> list[ir.Operation]:
    loops: list[ir.Operation] = []

    def collect(op):
        if op.name == "stablehlo.while":
            loops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return loops


def _def(value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _integer_width(value) -> int | None:
    """The bit width of `value`'s integer element type (None: not an integer of 2+ bits)."""
    element = ir.RankedTensorType(value.type).element_type
    if not isinstance(element, ir.IntegerType) or ir.IntegerType(element).width < 2:
        return None
    return ir.IntegerType(element).width


def _constant_int(value) -> int | None:
    """The value of an integer constant holding one element (None for anything else, floats
    included: `int(4.5)` is not the bound a float comparison tests)."""
    op = _def(value)
    if op is None or op.name != "stablehlo.constant" or _integer_width(value) is None:
        return None
    array, _ = constant_value(op.attributes["value"])
    if array.size != 1:
        return None
    try:
        return int(array.reshape(-1)[0])
    except (TypeError, ValueError):
        return None


def _trip_count(loop: ir.Operation) -> int | None:
    """The number of iterations of `for (i = c0; i < c; i += 1)`, else None."""
    cond, body = loop.regions[0].blocks[0], loop.regions[1].blocks[0]
    ops = list(cond.operations)
    ret = ops[-1]
    compare = _def(ret.operands[0]) if len(ret.operands) == 1 else None
    if compare is None or compare.name != "stablehlo.compare" or "LT" not in str(
            compare.attributes["comparison_direction"]):
        return None
    counter, bound = compare.operands
    args = list(cond.arguments)
    if counter not in args:
        return None
    index = args.index(counter)
    width = _integer_width(counter)
    signed = _signed_comparison(compare, counter)
    if width is None or signed is None:
        return None
    limit, start = _constant_int(bound), _constant_int(loop.operands[index])
    if limit is not None and start is not None:
        limit, start = _as_compared(limit, width, signed), _as_compared(start, width, signed)
    body_ret = list(body.operations)[-1]
    step = _def(body_ret.operands[index])
    if limit is None or start is None or step is None or step.name != "stablehlo.add":
        return None
    a, b = step.operands
    increments = (a == body.arguments[index] and _constant_int(b) == 1) or (
        b == body.arguments[index] and _constant_int(a) == 1)
    if not increments:
        return None
    return max(0, limit - start)


def _signed_comparison(compare: ir.Operation, counter) -> bool | None:
    """Whether `compare` orders integers as signed (True) or unsigned (False); None for a
    float or total-order comparison."""
    if "compare_type" in compare.attributes:
        kind = str(compare.attributes["compare_type"])
        if "UNSIGNED" in kind:
            return False
        return True if "SIGNED" in kind else None
    element = ir.IntegerType(ir.RankedTensorType(counter.type).element_type)
    return not element.is_unsigned


def _as_compared(value: int, width: int, signed: bool) -> int:
    """The integer a `width`-bit comparison sees for the bits of `value`. (The counter never
    wraps: it is incremented only while below the bound, which is representable.)"""
    value %= 1 << width
    return value - (1 << width) if signed and value >= 1 << (width - 1) else value


def _is_ring(body: ir.Block) -> bool:
    found = [False]

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            found[0] = True
        return ir.WalkResult.ADVANCE

    for op in body.operations:
        op.walk(visit)
    return found[0]


def _nested_reads_body(body: ir.Block) -> bool:
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


def _unroll(loop: ir.Operation) -> bool:
    body = loop.regions[1].blocks[0]
    trips = _trip_count(loop)
    if trips is None or trips > MAX_TRIPS or not _is_ring(body) or _nested_reads_body(body):
        return False
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
