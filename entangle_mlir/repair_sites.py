"""The places a proof-backed repair edits (`repair.py`, issue 19): the ops of a sharded
program that carry a schedule's decisions, and the places where a missing op would go, each
with its nearest alternatives.

Changed ops (`find_sites`):

* a `collective_permute`: its pairs reversed, and (where they shift blocks by d along one mesh
  axis) shifted by -d, d - 1 and d + 1;
* an integer constant operand of an integer op or a compare whose other operand depends on the
  step counter (a loop's integer carry) or on the device id: the constant -1 and +1, and where
  the other operand depends on the device id alone, each other value it takes on a device;
* a `select` of data (not of integers) on such a predicate: its branches swapped.

Inserted ops, at a loop that carries data (`missing_op_sites`): a value added to a carry on
every step (`carry + new`) gets a mask, `select(p, new, 0)` or `select(p, 0, new)`, for each
predicate on the step the loop body already computes before the add (a compare, or "an index
equals its clip", `clamp(lo, i, hi) == i`, where the body clips a step index); a value that
replaces a carry on every step, computed without it, is added to it instead (`carry + new`); a
carried sum is divided by a number the program knows (a divisor of a float division, a bound a
step index is compared with or clipped to) before it is used.

Each place is named at the innermost frame of the user's call stack that the edit belongs to
(jax records a call stack in each op's location, `core/diagnostics.call_stack`): a changed op
at its own line; an inserted op at the frame where the value it takes leaves the op that makes
it for the op that uses it (the caller's line of a helper that returned its argument, as
`return value` makes no op and so has no location); a division of a loop's result at the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core.diagnostics import Frame, SourceLoc, call_stack
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.mlir.ir import ops_in_order, producer
from entangle_mlir.mlir.opinfo import op_location
from entangle_mlir.mlir.program import read_meshes

MAX_VALUES = 16
"""A device-dependent integer compared with a constant gets each value it takes on a device as
an alternative when it takes at most this many."""
MAX_PREDICATES = 6
"""A value added to a carry unmasked gets at most this many predicates as masks (each both
ways), the nearest ones before the add first."""
MAX_DIVISORS = 4
"""A carried sum gets at most this many divisors (the smallest the program knows)."""

_INT_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
            "stablehlo.remainder", "stablehlo.minimum", "stablehlo.maximum",
            "stablehlo.clamp", "stablehlo.compare")
_DEVICE_IDS = ("stablehlo.partition_id", "stablehlo.replica_id")


@dataclass(frozen=True)
class Alternative:
    """One edit at one place: `apply(op, position, ops)` makes it on a fresh copy (`ops`: that
    copy's ops in walk order, for an edit that takes another op's value); `what` says what
    then holds, as a clause ("it moves them by +1 ...")."""

    what: str
    apply: Callable[[ir.Operation, int, list[ir.Operation]], None] = field(compare=False)


@dataclass
class Site:
    """A place in the user's source where a schedule's decision is made, or an op is missing:
    what the program does there, the nearest alternatives, and the targets it is (the index of
    an op in the walk of the inlined sharded module and the operand or result position the
    edit is at): one, or several where a Python loop laid the line out several times (the
    same location and decision), which an alternative edits alike."""

    name: str
    does: str
    alternatives: list[Alternative]
    targets: list[tuple[int, int]] = field(default_factory=list)
    loc: SourceLoc | None = None
    subject: str = ""
    """How the claim calls the place ("collective_permute", "the loop at f.py:12")."""


def find_sites(module: ir.Module, func: ir.Operation, file: str,
               output: int | None = None) -> list[Site]:
    """The places of `func` in the backward cone of result `output` (every result: None) where
    a schedule's decision is made (changed ops) or an op may be missing (inserted ops), with
    their alternatives: the changed ops in program order, then the insertions."""
    listed = ops_in_order(module)
    index = {_key(op): i for i, (_, op) in enumerate(listed)}
    cone = _cone(func, output)
    meshes = read_meshes(module)
    devices = max((m.num_devices for m in meshes.values()), default=1)
    stepped = _schedule_values(func, devices)
    idioms = _index_idioms(func, stepped)
    sites: dict[tuple, Site] = {}
    for _, op in listed:
        if _key(op) not in cone or _key(op) in idioms:
            continue
        found = _site(op, stepped, meshes)
        if found is None or not found.alternatives:
            continue
        loc = op_location(op, file)
        key = (found.name, str(op.location) if loc is None else str(loc), found.does,
               tuple(a.what for a in found.alternatives))
        site = sites.setdefault(key, found)
        site.targets.append((index[_key(op)], 0))
        site.loc = loc
    return list(sites.values()) + missing_op_sites(func, file, cone, index, idioms)


def _index_idioms(func: ir.Operation, stepped: dict) -> set[int]:
    """Keys of the ops that are jax's lowering rather than the user's decisions: a negative
    index wrapped (`select(i < 0, i + n, i)`), the device id split into mesh coordinates
    (a division or remainder of a value known on every device) and a loop counter's step
    (`i + 1` passed on as the carry `i`)."""
    found: set[int] = set()

    def visit(op):
        op = op.operation if hasattr(op, "operation") else op
        name = op.name
        if name == "stablehlo.select" and _is_integer(op.results[0].type):
            p, a, _b = (producer(v) for v in op.operands)
            if p is not None and a is not None and p.name == "stablehlo.compare" and \
                    a.name == "stablehlo.add" and p.operands[0] == op.operands[2] and \
                    _scalar_constant(p.operands[1]) == 0 and \
                    op.operands[2] in list(a.operands):
                found.update((_key(p), _key(a)))
        if name in ("stablehlo.divide", "stablehlo.remainder") and \
                stepped.get(_key_value(op.operands[0])) is not None:
            found.add(_key(op))
        if name == "stablehlo.while":
            body = op.regions[1].blocks[0]
            for i, value in enumerate(list(body.operations)[-1].operands):
                step = producer(value)
                if step is not None and step.name == "stablehlo.add" and \
                        body.arguments[i] in list(step.operands):
                    found.add(_key(step))
        return ir.WalkResult.ADVANCE

    func.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _key(op) -> int:
    return hash(op.operation if hasattr(op, "operation") else op)


def _site(op: ir.Operation, stepped: dict, meshes: dict[str, Mesh]) -> Site | None:
    name = op.name
    if name == "stablehlo.collective_permute":
        return _permute_site(op, meshes)
    if name == "stablehlo.select":
        if _is_integer(op.results[0].type) or _key_value(op.operands[0]) not in stepped:
            return None
        return Site(name, "picks its branches as written",
                    [Alternative("it picks the other branch (its branches swapped)", _swap)])
    if name not in _INT_OPS or not op.results or not _is_integer(op.operands[0].type):
        return None
    for position, value in enumerate(op.operands):
        constant = _scalar_constant(value)
        others = [v for i, v in enumerate(op.operands) if i != position]
        if constant is None or not any(_key_value(v) in stepped for v in others):
            continue
        candidates = [constant - 1, constant + 1]
        if name == "stablehlo.compare" and len(others) == 1:
            taken = stepped.get(_key_value(others[0]))
            if taken is not None and len(taken) <= MAX_VALUES:
                candidates = sorted(set(taken) - {constant}) or candidates
        return Site(name, f"takes {constant} as operand #{position}",
                    [Alternative(f"it takes {c} there", _set_operand(position, c))
                     for c in candidates])
    return None


def _cone(func: ir.Operation, output: int | None) -> set[int]:
    """The keys of the ops result `output` of `func` depends on (every result: None); an op
    with regions brings every op nested in it."""
    block = func.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    values = list(ret.operands) if output is None else [ret.operands[output]]
    seen: set[int] = set()
    pending = list(values)
    while pending:
        value = pending.pop()
        owner = producer(value)
        if owner is None:
            parent = value.owner.owner
            owner = parent.operation if hasattr(parent, "operation") else parent
            if owner is None or owner.name == "func.func":
                continue
        if _key(owner) in seen:
            continue
        seen.add(_key(owner))
        pending += list(owner.operands)
        for region in owner.regions:
            for inner_block in region.blocks:
                for inner in inner_block.operations:
                    pending += [r for r in inner.results]
                    pending += list(inner.operands)
    return seen


def _key_value(value) -> int:
    return hash(value)


def _schedule_values(func: ir.Operation, devices: int) -> dict[int, list[int] | None]:
    """The integer values of `func` that depend on the device id or on a loop's integer carry
    (keys), each with the values it takes on the devices where it depends on the device id
    and constants alone (else None)."""
    found: dict[int, list[int] | None] = {}
    concrete: dict[int, np.ndarray] = {}

    def visit(op):
        op = op.operation if hasattr(op, "operation") else op
        if op.name == "stablehlo.while":
            body = op.regions[1].blocks[0]
            yielded = list(body.operations)[-1].operands
            for region in op.regions:
                for i, arg in enumerate(region.blocks[0].arguments):
                    if not _is_integer(arg.type, bits=1):
                        continue
                    found[_key_value(arg)] = None
                    # a carry the body passes on unchanged keeps its value on every trip
                    if yielded[i] == body.arguments[i] and \
                            _key_value(op.operands[i]) in concrete:
                        concrete[_key_value(arg)] = concrete[_key_value(op.operands[i])]
        if op.name == "stablehlo.constant" and op.results and _is_integer(op.results[0].type):
            scalar = _scalar_constant(op.results[0])
            if scalar is not None:
                concrete[_key_value(op.results[0])] = np.int64(scalar)
            return ir.WalkResult.ADVANCE
        if op.name in _DEVICE_IDS:
            found[_key_value(op.results[0])] = None
            concrete[_key_value(op.results[0])] = np.arange(devices, dtype=np.int64)
            return ir.WalkResult.ADVANCE
        if not any(_key_value(v) in found for v in op.operands):
            return ir.WalkResult.ADVANCE
        values = _evaluate(op, [concrete.get(_key_value(v)) for v in op.operands])
        for i, result in enumerate(op.results):
            if _is_integer(result.type, bits=1):
                found[_key_value(result)] = None
                if values is not None and i == 0:
                    concrete[_key_value(result)] = values
        return ir.WalkResult.ADVANCE

    func.walk(visit, ir.WalkOrder.PRE_ORDER)
    for key, values in concrete.items():
        if key in found and np.ndim(values) == 1:
            found[key] = sorted({int(v) for v in values})
    return found


def _evaluate(op: ir.Operation, operands: list) -> np.ndarray | None:
    """An integer scalar op on per-device values (arrays over the device ids) and constants;
    None where an operand is not known or the op is not one of these."""
    if any(v is None for v in operands) or len(op.results) != 1:
        return None
    name = op.name
    if name == "stablehlo.convert" and _is_integer(op.results[0].type):
        return operands[0]
    if name == "stablehlo.compare":
        a, b = operands
        direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
        table = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                 "GT": np.greater, "GE": np.greater_equal}
        return table[direction](a, b).astype(np.int64) if direction in table else None
    binary = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
              "stablehlo.multiply": np.multiply, "stablehlo.minimum": np.minimum,
              "stablehlo.maximum": np.maximum, "stablehlo.and": np.bitwise_and,
              "stablehlo.or": np.bitwise_or}
    if name in binary:
        return binary[name](*operands)
    if name in ("stablehlo.divide", "stablehlo.remainder"):
        a, b = operands
        if np.any(b == 0) or np.any(a < 0) or np.any(b < 0):
            return None
        return a // b if name == "stablehlo.divide" else a % b
    if name == "stablehlo.select":
        p, a, b = operands
        return np.where(p != 0, a, b)
    return None


def _is_integer(mlir_type, bits: int = 2) -> bool:
    """Whether a tensor type's elements are integers of at least `bits` bits (1: booleans
    too)."""
    try:
        element = ir.RankedTensorType(mlir_type).element_type
    except ValueError:
        return False
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width >= bits


def _scalar_constant(value) -> int | None:
    """The value of a scalar integer `stablehlo.constant` (or a splat), else None."""
    op = producer(value)
    if op is None or op.name != "stablehlo.constant" or not _is_integer(value.type):
        return None
    attr = ir.DenseIntElementsAttr(op.attributes["value"])
    if not attr.is_splat and len(attr) != 1:
        return None
    if ir.RankedTensorType(value.type).shape != []:
        return None
    return int(np.array(attr).reshape(-1)[0]) if not attr.is_splat else int(
        ir.IntegerAttr(attr.get_splat_value()).value)


def _swap(op: ir.Operation, _position: int, _ops: list) -> None:
    a, b = op.operands[1], op.operands[2]
    op.operands[1] = b
    op.operands[2] = a


def _set_operand(position: int, number: int) -> Callable[[ir.Operation, int, list], None]:
    def apply(op: ir.Operation, _position: int, _ops: list) -> None:
        value_type = op.operands[position].type
        element = ir.RankedTensorType(value_type).element_type
        attr = ir.DenseElementsAttr.get_splat(value_type, ir.IntegerAttr.get(element, number))
        with ir.InsertionPoint(op), op.location:
            constant = ir.Operation.create("stablehlo.constant", results=[value_type],
                                           attributes={"value": attr})
        op.operands[position] = constant.results[0]
    return apply


def _permute_site(op: ir.Operation, meshes: dict[str, Mesh]) -> Site | None:
    pairs = [tuple(int(x) for x in row) for row in
             np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"]))]
    mesh = next(iter(meshes.values()), None) if len(meshes) == 1 else None
    shift = _shift(pairs, mesh) if mesh is not None else None
    options: dict[tuple, str] = {}
    if shift is not None:
        axis, size, d, cyclic = shift
        does = f"moves blocks by {d:+d} along '{axis}' ({_pairs_text(pairs)})"
        for other in (-d, d - 1, d + 1):
            if other == 0 or other == d or (cyclic and (other - d) % size == 0):
                continue
            moved = _shifted(pairs, mesh, axis, d, other, cyclic)
            if moved and moved != sorted(pairs):
                options.setdefault(tuple(moved), f"it moves them by {other:+d} along '{axis}' "
                                                 f"({_pairs_text(moved)})")
    else:
        does = f"sends {_pairs_text(pairs)}"
    reverse = sorted((t, s) for s, t in pairs)
    if reverse != sorted(pairs):
        options.setdefault(tuple(reverse), f"it sends the other way ({_pairs_text(reverse)})")
    alternatives = [Alternative(what, _set_pairs(list(p))) for p, what in options.items()]
    return Site(op.name, does, alternatives)


def _pairs_text(pairs) -> str:
    return ", ".join(f"{s}->{t}" for s, t in sorted(pairs))


def _coords(device: int, mesh: Mesh) -> dict[str, int]:
    coords = {}
    for name, size in reversed(mesh.axes):
        coords[name] = device % size
        device //= size
    return coords


def _device(coords: dict[str, int], mesh: Mesh) -> int:
    device = 0
    for name, size in mesh.axes:
        device = device * size + coords[name]
    return device


def _shift(pairs, mesh: Mesh) -> tuple[str, int, int, bool] | None:
    """(axis, its size, d, cyclic) where every pair moves a block by d along one mesh axis
    (cyclic: modulo the axis size, every device a source); else None."""
    for axis, size in mesh.axes:
        deltas = set()
        for s, t in pairs:
            cs, ct = _coords(s, mesh), _coords(t, mesh)
            if any(cs[a] != ct[a] for a in cs if a != axis):
                break
            deltas.add(ct[axis] - cs[axis])
        else:
            if len(deltas) == 1:
                (d,) = deltas
                if d != 0:
                    return axis, size, d, False
            mods = {d % size for d in deltas}
            if len(mods) == 1 and len(pairs) == mesh.num_devices and 0 not in mods:
                (d,) = mods
                return axis, size, d if d <= size // 2 else d - size, True
    return None


def _shifted(pairs, mesh: Mesh, axis: str, d: int, other: int, cyclic: bool) -> list:
    size = dict(mesh.axes)[axis]
    moved = []
    for s, _ in pairs:
        coords = _coords(s, mesh)
        target = coords[axis] + other
        if cyclic:
            target %= size
        elif not 0 <= target < size:
            continue
        moved.append((s, _device({**coords, axis: target}, mesh)))
    return sorted(moved)


def _set_pairs(pairs: list) -> Callable[[ir.Operation, int, list], None]:
    def apply(op: ir.Operation, _position: int, _ops: list) -> None:
        array = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        op.attributes["source_target_pairs"] = ir.DenseIntElementsAttr.get(array)
    return apply


# ----- missing ops: an op inserted where a loop carries data -------------------------------------

def missing_op_sites(func: ir.Operation, file: str, cone: set[int], index: dict[int, int],
                     idioms: set[int]) -> list[Site]:
    """The places in the loops of `func` (in `cone`) where an op may be missing (module
    docstring), each with its targets: the carries a Python loop over the params laid out
    alike (the same location) are one place, edited alike."""
    loops: list[ir.Operation] = []

    def collect(op):
        op = op.operation if hasattr(op, "operation") else op
        if op.name == "stablehlo.while" and _key(op) in cone:
            loops.append(op)
        return ir.WalkResult.ADVANCE

    func.walk(collect, ir.WalkOrder.PRE_ORDER)
    steps = {k for loop in loops for region in loop.regions
             for k in _depends_on(region.blocks[0], _integer_arguments(region.blocks[0]))}
    divisors = _divisors(func, steps)
    sites: dict[tuple, Site] = {}
    masks: dict[tuple, list[tuple[ir.Operation, int]]] = {}
    for loop in loops:
        body = loop.regions[1].blocks[0]
        ret = list(body.operations)[-1]
        args = list(body.arguments)
        by_loop = _frames(loop, file)
        loop_at = _frame_text(by_loop)
        for j, value in enumerate(ret.operands):
            if not _is_float(value.type) or value == args[j]:
                continue
            maker = producer(value)
            if maker is not None and maker.name == "stablehlo.add" and \
                    args[j] in list(maker.operands):
                position = 1 if maker.operands[0] == args[j] else 0
                if not _masked(maker.operands[position], steps):
                    used = _frames(maker, file)
                    masks.setdefault((index[_key(loop)], loop_at, tuple(used)), []).append(
                        (maker, position))
                if divisors and any(True for _ in loop.results[j].uses):
                    added_at = _frame_text(_frames(maker, file))
                    site = sites.setdefault(("scale", index[_key(loop)], added_at), Site(
                        loop.name, f"returns the sum it accumulates (at {added_at}) as it is",
                        [Alternative(f"that sum is divided by {d} before it is used",
                                     _divide(d)) for d in divisors],
                        loc=by_loop[0].loc if by_loop else op_location(loop, file),
                        subject="the loop here"))
                    site.targets.append((index[_key(loop)], j))
            elif _key_value(value) not in _depends_on(body, {_key_value(args[j])}):
                loc = _edge_loc(_frames(maker, file) if maker is not None else [], by_loop,
                                at_use=False)
                site = sites.setdefault(("accumulate", index[_key(loop)], str(loc)), Site(
                    "stablehlo.return", "takes the value made here as its carry on every "
                    "step, in place of the carried value",
                    [Alternative("that value is added to the carried value (an "
                                 "accumulation)", _accumulate)],
                    loc=loc, subject=f"the loop at {loop_at}"))
                site.targets.append((index[_key(ret)], j))
    masked = [_mask_site(group, loop_at, used, steps, idioms, index, file)
              for (_, loop_at, used), group in masks.items()]
    return [s for s in masked if s is not None] + list(sites.values())


def _masked(value, steps: set[int]) -> bool:
    """Whether `value` is a select on a predicate of the step (a mask)."""
    maker = producer(value)
    return maker is not None and maker.name == "stablehlo.select" and \
        _key_value(_root(maker.operands[0])) in steps


def _mask_site(group: list[tuple[ir.Operation, int]], loop_at: str, used: tuple[Frame, ...],
               steps: set[int], idioms: set[int], index: dict[int, int],
               file: str) -> Site | None:
    """The mask values added to carries (operand `position` of each add in `group`, laid out
    by one line) may lack: each predicate of the step the body computes before the first of
    them; None where it computes none."""
    group = sorted(group, key=lambda target: index[_key(target[0])])
    first, position = group[0]
    predicates = _predicates(first, first.block, steps, idioms, index, file)
    if not predicates:
        return None
    alternatives = []
    for text, build, both in predicates:
        alternatives.append(Alternative(f"that value is masked by {text}, 0 where it is "
                                        "false", _mask(build, keep=True)))
        if both:
            alternatives.append(Alternative(f"that value is masked by {text}, 0 where it "
                                            "holds", _mask(build, keep=False)))
    maker = producer(first.operands[position])
    loc = _edge_loc(_frames(maker, file) if maker is not None else [], list(used),
                    at_use=True)
    return Site(first.name, f"adds a value to a carry of the loop at {loop_at} on every step, "
                "unmasked", alternatives, [(index[_key(add)], p) for add, p in group], loc,
                subject=f"the add at {_frame_text(list(used))}")


def _predicates(before: ir.Operation, body: ir.Block, steps: set[int], idioms: set[int],
                index: dict[int, int], file: str) -> list[tuple[str, Callable, bool]]:
    """Predicates on the step the body computes before `before` (nearest first, at most
    `MAX_PREDICATES`): (how the claim shows it, a builder of its value on a fresh copy,
    whether its negation is tried too). A compare (or `and`/`or`/`not` of them) computed
    from the step is one; so is "the index equals its clip" where the body clips an index
    computed from the step to constant bounds (the mask `0 <= i < m` a clip to [0, m - 1]
    stands for)."""
    found: list[tuple[str, Callable, bool]] = []
    for op in body.operations:
        op = op.operation
        if _key(op) == _key(before):
            break
        if _key(op) in idioms or len(op.results) != 1 or \
                _key_value(op.results[0]) not in steps or not _is_scalar(op.results[0]):
            continue
        where = _frame_text(_frames(op, file))
        clip = _clip(op)
        if clip is not None:
            _x, lo, hi = clip
            found.append((f"`{lo} <= i <= {hi}` (i: the index clipped at {where})",
                          _clip_predicate(index[_key(op)]), False))
        elif _is_integer(op.results[0].type, bits=1) and not _is_integer(op.results[0].type) \
                and op.name in ("stablehlo.compare", "stablehlo.and", "stablehlo.or",
                                "stablehlo.not"):
            shown = op.name.removeprefix("stablehlo.")
            if op.name == "stablehlo.compare":
                shown = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
            found.append((f"the `{shown}` at {where}", _existing(index[_key(op)]), True))
    return found[::-1][:MAX_PREDICATES]


def _clip(op: ir.Operation) -> tuple[ir.Value, int, int] | None:
    """(x, lo, hi) where `op` computes `clamp(lo, x, hi)` of a scalar integer (`clamp`, or a
    `minimum` of a `maximum` or the other way round, constants through converts)."""
    if not op.results or not _is_integer(op.results[0].type) or not _is_scalar(op.results[0]):
        return None
    if op.name == "stablehlo.clamp":
        lo, x, hi = (_int_constant(v) for v in op.operands)
        if lo is None or hi is None or x is not None:
            return None
        return op.operands[1], lo, hi
    pairs = {"stablehlo.minimum": "stablehlo.maximum", "stablehlo.maximum": "stablehlo.minimum"}
    if op.name not in pairs:
        return None
    for i in range(2):
        outer = _int_constant(op.operands[i])
        inner = producer(_through_converts(op.operands[1 - i]))
        if outer is None or inner is None or inner.name != pairs[op.name]:
            continue
        for k in range(2):
            bound = _int_constant(inner.operands[k])
            if bound is None or _int_constant(inner.operands[1 - k]) is not None:
                continue
            lo, hi = (bound, outer) if op.name == "stablehlo.minimum" else (outer, bound)
            return (inner.operands[1 - k], lo, hi) if lo <= hi else None
    return None


def _divisors(func: ir.Operation, steps: set[int]) -> list[int]:
    """The numbers (at least 2) the program divides floats by, compares a step index with, or
    clips a step index below (the bound + 1: a count); the `MAX_DIVISORS` smallest."""
    found: set[int] = set()

    def visit(op):
        op = op.operation if hasattr(op, "operation") else op
        if op.name == "stablehlo.divide" and op.results and _is_float(op.results[0].type):
            number = _float_constant(op.operands[1])
            if number is not None and number == int(number):
                found.add(int(number))
        elif op.name == "stablehlo.compare" and any(_key_value(v) in steps
                                                    for v in op.operands):
            found.update(c for c in (_int_constant(v) for v in op.operands) if c is not None)
        elif len(op.results) == 1 and _key_value(op.results[0]) in steps:
            clip = _clip(op)
            if clip is not None:
                found.add(clip[2] + 1)
        return ir.WalkResult.ADVANCE

    func.walk(visit, ir.WalkOrder.PRE_ORDER)
    return sorted(d for d in found if d >= 2)[:MAX_DIVISORS]


def _depends_on(block: ir.Block, sources: set[int]) -> set[int]:
    """Keys of `sources` and of the values of `block` computed from them (an op with regions
    counts what its nested ops take from outside as its operands); one pass in order."""
    found = set(sources)
    for op in block.operations:
        op = op.operation
        inputs = list(op.operands)
        for region in op.regions:
            for inner_block in region.blocks:
                for inner in inner_block.operations:
                    inputs += list(inner.operands)
        if any(_key_value(v) in found for v in inputs):
            found.update(_key_value(r) for r in op.results)
    return found


def _integer_arguments(block: ir.Block) -> set[int]:
    return {_key_value(a) for a in block.arguments if _is_integer(a.type)}


def _root(value) -> ir.Value:
    """`value` through broadcasts, reshapes and converts (a mask's predicate as computed)."""
    for _ in range(16):
        op = producer(value)
        if op is None or op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                         "stablehlo.convert"):
            return value
        value = op.operands[0]
    return value


def _through_converts(value) -> ir.Value:
    for _ in range(16):
        op = producer(value)
        if op is None or op.name != "stablehlo.convert":
            return value
        value = op.operands[0]
    return value


def _int_constant(value) -> int | None:
    return _scalar_constant(_through_converts(value))


def _float_constant(value) -> float | None:
    """The value of a float constant splat (through a broadcast and converts), else None."""
    op = producer(_root(value))
    if op is None or op.name != "stablehlo.constant" or not _is_float(op.results[0].type):
        return None
    attr = ir.DenseElementsAttr(op.attributes["value"])
    if not attr.is_splat:
        return None
    return float(ir.FloatAttr(attr.get_splat_value()).value)


def _is_scalar(value) -> bool:
    try:
        return ir.RankedTensorType(value.type).shape == []
    except ValueError:
        return False


def _is_float(mlir_type) -> bool:
    try:
        return isinstance(ir.RankedTensorType(mlir_type).element_type, ir.FloatType)
    except ValueError:
        return False


def _frames(op: ir.Operation, file: str) -> list[Frame]:
    return call_stack(str(op.location), file)


def _frame_text(frames: list[Frame]) -> str:
    return str(frames[0].loc) if frames else ""


def _edge_loc(made: list[Frame], used: list[Frame], *, at_use: bool) -> SourceLoc | None:
    """Where an op inserted between the op that makes a value (its call stack `made`, innermost
    first) and one that uses it (`used`) goes in the user's source: the innermost frame both
    stacks run through is the function the value passes from one to the other in; its line
    there on the use's side (`at_use`: the call the value is handed to) or the making side
    (where a loop's carry takes it: the body function's line that makes it)."""
    if not made or not used:
        frames = used or made
        return frames[0].loc if frames else None
    outer_made, outer_used = made[::-1], used[::-1]
    depth = 0
    while depth < min(len(made), len(used)) and outer_made[depth] == outer_used[depth]:
        depth += 1
    if at_use and depth < len(used):
        return outer_used[depth].loc
    if depth < len(made):
        return outer_made[depth].loc
    return used[0].loc


def _existing(at: int) -> Callable[[list[ir.Operation], ir.Operation], ir.Value]:
    def build(ops: list[ir.Operation], _before: ir.Operation) -> ir.Value:
        return ops[at].results[0]
    return build


def _clip_predicate(at: int) -> Callable[[list[ir.Operation], ir.Operation], ir.Value]:
    """A builder of `x == clip(x)` for the clip `ops[at]` (made before `before`)."""
    def build(ops: list[ir.Operation], before: ir.Operation) -> ir.Value:
        clip = ops[at]
        x = _clip(clip)[0]
        element = ir.RankedTensorType(x.type).element_type
        signed = "UNSIGNED" if ir.IntegerType(element).is_unsigned else "SIGNED"
        with ir.InsertionPoint(before), before.location:
            compare = ir.Operation.create(
                "stablehlo.compare", results=[ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))],
                operands=[x, clip.results[0]],
                attributes={"comparison_direction":
                            ir.Attribute.parse("#stablehlo<comparison_direction EQ>"),
                            "compare_type":
                            ir.Attribute.parse(f"#stablehlo<comparison_type {signed}>")})
        return compare.results[0]
    return build


def _float_splat(value_type, number: float, before: ir.Operation) -> ir.Value:
    element = ir.RankedTensorType(value_type).element_type
    with ir.InsertionPoint(before), before.location:
        attr = ir.DenseElementsAttr.get_splat(value_type, ir.FloatAttr.get(element, number))
        return ir.Operation.create("stablehlo.constant", results=[value_type],
                                   attributes={"value": attr}).results[0]


def _mask(build: Callable, keep: bool) -> Callable[[ir.Operation, int, list], None]:
    """Operand `position` of the op replaced by `select(p, it, 0)` (`keep`) or
    `select(p, 0, it)`, p built by `build`."""
    def apply(op: ir.Operation, position: int, ops: list) -> None:
        value = op.operands[position]
        predicate = build(ops, op)
        zero = _float_splat(value.type, 0.0, op)
        branches = [value, zero] if keep else [zero, value]
        with ir.InsertionPoint(op), op.location:
            select = ir.Operation.create("stablehlo.select", results=[value.type],
                                         operands=[predicate, *branches])
        op.operands[position] = select.results[0]
    return apply


def _accumulate(op: ir.Operation, position: int, _ops: list) -> None:
    """Yielded value `position` of a loop body's return replaced by the carry plus it."""
    carry = op.block.arguments[position]
    value = op.operands[position]
    with ir.InsertionPoint(op), op.location:
        add = ir.Operation.create("stablehlo.add", results=[value.type], operands=[carry, value])
    op.operands[position] = add.results[0]


def _divide(number: int) -> Callable[[ir.Operation, int, list], None]:
    """Result `position` of a loop divided by `number` wherever it is used."""
    def apply(op: ir.Operation, position: int, _ops: list) -> None:
        result = op.results[position]
        element = ir.RankedTensorType(result.type).element_type
        with ir.InsertionPoint.after(op), op.location:
            attr = ir.DenseElementsAttr.get_splat(result.type,
                                                  ir.FloatAttr.get(element, number))
            constant = ir.Operation.create("stablehlo.constant", results=[result.type],
                                           attributes={"value": attr})
        with ir.InsertionPoint.after(constant), op.location:
            divide = ir.Operation.create("stablehlo.divide", results=[result.type],
                                         operands=[result, constant.results[0]])
        result.replace_all_uses_except(divide.results[0], divide)
    return apply
