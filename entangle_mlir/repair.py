"""Proof-backed repair: where the general tier does not prove a program the report claims is
wrong, the one op whose nearest alternative makes it proven names the bug (issue 19).

The layout tier stops at the first op it cannot relate, and the general tier says proven or
not: neither names the op where a pipeline schedule goes wrong (a ppermute in the wrong
direction, an off-by-one step index, the outputs taken from the wrong stage). The ops that
carry a schedule's decisions are few, and each has few near alternatives. So, on the program
as the user wrote it (calls inlined, nothing else rewritten), the repair lists the ops in the
backward cone of the failing output that carry such decisions (`sites`):

* a `collective_permute`: its pairs reversed, and (where they shift blocks by d along one mesh
  axis) shifted by -d, d - 1 and d + 1;
* an integer constant operand of an integer op or a compare whose other operand depends on the
  step counter (a loop's integer carry) or on the device id: the constant -1 and +1, and where
  the other operand depends on the device id alone, each other value it takes on a device;
* a `select` of data (not of integers) on such a predicate: its branches swapped.

Each alternative is applied alone to a fresh copy of the program, which is normalized and
decided by the general tier again (without the Z3 rule-instance checks; the winner is
re-decided with them where the check had them). A claim is made only where the report
already claims the program is wrong (exit code 1), every alternative was tried within the
bounds (`MAX_CANDIDATES`, `BUDGET_SECONDS`) and the alternatives of exactly one op make the
program proven: the report's first diagnostic then names that op, says what it does and what
makes the program proven ("the program is proven when it moves them by +1"); that is what was
shown, no more (other edits elsewhere may prove it as well; none at one op does). Otherwise
nothing is said beyond `stats["repair"]` (bounded, no edit proves it, several do). A proven
program is never repaired. Missing ops (a mask or an accumulation left out, a division by the
micro-batch count not made) are no edit of an op: such bugs keep the tiers' diagnostics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.analysis.refine import EvidenceFocus
from entangle_mlir.core.diagnostics import Diagnostic
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.report import Report
from entangle_mlir.mlir.ir import context, ops_in_order, parse_module, producer
from entangle_mlir.mlir.opinfo import op_location
from entangle_mlir.mlir.program import (
    Program,
    find_function,
    func_name,
    inline_calls,
    read_meshes,
)
from entangle_mlir.passes import PASSES
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

MAX_CANDIDATES = 48
"""The most alternatives tried (over all sites); beyond it the search is bounded: no claim."""
BUDGET_SECONDS = 30.0
"""The repair's whole time budget; out of it the search is bounded: no claim."""
CANDIDATE_SECONDS = 10.0
"""One alternative's general-tier budget."""
MAX_VALUES = 16
"""A device-dependent integer compared with a constant gets each value it takes on a device as
an alternative when it takes at most this many."""

MESSAGE_PREFIX = "repair ("
"""How a repair's diagnostic begins."""

_INT_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
            "stablehlo.remainder", "stablehlo.minimum", "stablehlo.maximum",
            "stablehlo.clamp", "stablehlo.compare")
_DEVICE_IDS = ("stablehlo.partition_id", "stablehlo.replica_id")


@dataclass(frozen=True)
class Alternative:
    """One edit of one op: `apply(op)` makes it on a fresh copy; `what` says what the op then
    does."""

    what: str
    apply: Callable[[ir.Operation], None] = field(compare=False)


@dataclass
class Site:
    """An op of the user's source carrying a schedule's decision: what it does now, its
    nearest alternatives, and the indices (in the walk of the inlined sharded module) of the
    ops it is: one, or several where a Python loop laid the line out several times (the same
    location, op and decision), which an alternative edits alike."""

    name: str
    does: str
    alternatives: list[Alternative]
    indices: list[int] = field(default_factory=list)
    loc: object = None


@dataclass
class Snapshot:
    """The pair as given, before normalization rewrites it in place: clones of its modules
    (the reference's, and the sharded one's when it is another module) and the functions'
    names."""

    ref: ir.Operation
    sharded: ir.Operation | None
    ref_name: str
    sharded_name: str
    ref_file: str
    sharded_file: str


def snapshot(program: Program) -> Snapshot:
    """Clone the pair before the pipeline normalizes it (cheap: no text is printed)."""
    same = program.sharded_module is program.ref_module
    return Snapshot(program.ref_module.operation.clone(),
                    None if same else program.sharded_module.operation.clone(),
                    func_name(program.ref_func), func_name(program.sharded_func),
                    program.ref_file, program.sharded_file)


def wants_repair(report: Report) -> bool:
    """Whether the repair may run: not proven, the general tier ran and did not prove it, and
    the report claims the program is wrong (a repair relocates a claim, never makes one)."""
    tier = report.stats.get("general_tier")
    return (not report.proven and report.exit_code == 1 and isinstance(tier, dict)
            and not tier.get("proven"))


def repair(report: Report, snap: Snapshot, reference: tuple[str, object] | None = None, *,
           verify_rules: bool = True, assume_no_overflow: bool = False,
           jobs: int | None = None, budget_seconds: float = BUDGET_SECONDS,
           max_candidates: int = MAX_CANDIDATES) -> None:
    """Search single-op edits of the program that make the general tier prove it (module
    docstring); where exactly one op's do, put the claim first in `report` (in place).
    `stats["repair"]` says what was tried either way. `reference`: the normalized reference
    function's text and the check's walk of it, reused where an edited pair normalizes the
    reference to the same text."""
    if not wants_repair(report):
        return
    start = time.perf_counter()
    output = None  # the cone of every result: a training step's results share their loops
    with context():
        base = _inlined_text(snap)
        module = parse_module(base, snap.sharded_file)
        func = find_function(module, snap.sharded_name)
        sites = find_sites(module, func, snap.sharded_file, output)
    stats: dict = {"sites": len(sites), "candidates": sum(len(s.alternatives) for s in sites),
                   "tried": 0, "proven_by": []}
    report.stats["repair"] = stats
    if stats["candidates"] > max_candidates:
        stats["bounded"] = f"more than {max_candidates} alternatives"
        return
    ref_text = None if snap.sharded is None else snap.ref.get_asm(enable_debug_info=True)
    proving: list[tuple[Site, Alternative]] = []
    for site in sites:
        for alternative in site.alternatives:
            left = budget_seconds - (time.perf_counter() - start)
            if left <= 0:
                stats["bounded"] = f"out of time ({budget_seconds:g} s)"
                return
            stats["tried"] += 1
            if _proven(snap, base, ref_text, reference, site, alternative, verify=False,
                       assume_no_overflow=assume_no_overflow, jobs=jobs,
                       budget=min(left, CANDIDATE_SECONDS)):
                proving.append((site, alternative))
                stats["proven_by"].append(f"{site.name} at {site.loc}: {alternative.what}")
                break  # the site's other alternatives would name the same op
    stats["seconds"] = round(time.perf_counter() - start, 3)
    if len(proving) != 1:
        return
    site, alternative = proving[0]
    if verify_rules and not _proven(snap, base, ref_text, reference, site, alternative,
                                    verify=True,
                                    assume_no_overflow=assume_no_overflow, jobs=jobs,
                                    budget=max(budget_seconds, CANDIDATE_SECONDS)):
        stats["proven_by"] = []
        stats["not_claimed"] = "the edited program's rule instances did not all check"
        return
    tried = stats["tried"]
    message = (f"{MESSAGE_PREFIX}{tried} single-op edits tried at {len(sites)} ops): "
               f"{site.name.removeprefix('stablehlo.')} {site.does}; the program is proven "
               f"when it {alternative.what} (the only op whose edit proves it)")
    notes = tuple(Diagnostic("note", f"before the repair: {d.message}", d.loc,
                             category=d.category) for d in report.diagnostics[:1])
    diagnostic = Diagnostic("error", message, site.loc, notes, category="different_function")
    report.diagnostics.insert(0, diagnostic)
    outputs = (tuple(range(len(report.outputs))) if output is None else (output,))
    report.foci[(message, str(site.loc))] = EvidenceFocus(
        unavailable="a repair names an op of the sharded program alone", outputs=outputs)
    stats["claimed"] = f"{site.name} at {site.loc}"


def _inlined_text(snap: Snapshot) -> str:
    """The sharded module as given with its calls inlined (each source op once, the loop
    bodies in their loops): the program the sites index."""
    source = snap.sharded if snap.sharded is not None else snap.ref
    module = parse_module(source.get_asm(enable_debug_info=True), snap.sharded_file)
    inline_calls(module, snap.sharded_file)
    return module.operation.get_asm(enable_debug_info=True)


def _proven(snap: Snapshot, base: str, ref_text: str | None,
            reference: tuple[str, object] | None, site: Site, alternative: Alternative, *,
            verify: bool, assume_no_overflow: bool, jobs: int | None, budget: float) -> bool:
    """Whether the general tier proves the program with `alternative` applied at `site`
    (`verify`: as the check decides, with its rule instances checked; else only whether the
    outputs are proven)."""
    from entangle_mlir.analysis.general.tier import (
        run_general_tier,  # lazy: z3 and the semantics (~0.2 s); only when a bug is claimed
    )

    with context():
        sharded = parse_module(base, snap.sharded_file)
        listed = ops_in_order(sharded)
        for index in site.indices:
            alternative.apply(listed[index][1])
        ref = sharded if ref_text is None else parse_module(ref_text, snap.ref_file)
        program = Program(ref, sharded, find_function(ref, snap.ref_name),
                          find_function(sharded, snap.sharded_name), snap.ref_file,
                          snap.sharded_file)
        state = PassState(sharded, snap.sharded_file, program=program)
        normalize = "{assume-no-overflow=true}" if assume_no_overflow else ""
        try:
            run_pipeline(parse_pipeline(f"entangle-normalize{normalize}", PASSES), state)
        except Exception:  # noqa: BLE001 - an edit the normalizer refuses proves nothing
            return False
        walk = None
        if reference is not None and program.ref_func.get_asm() == reference[0]:
            walk = reference[1]
        result = run_general_tier(program, walk, budget_seconds=budget, verify_rules=verify,
                                  jobs=jobs, assume_no_overflow=assume_no_overflow,
                                  prove_only=not verify)
    return result.proven


# ----- the sites ---------------------------------------------------------------------------------

def find_sites(module: ir.Module, func: ir.Operation, file: str,
               output: int | None = None) -> list[Site]:
    """The ops of `func` in the backward cone of result `output` (every result: None) that
    carry a schedule's decision, with their alternatives, in program order."""
    listed = ops_in_order(module)
    index = {_key(op): i for i, (_, op) in enumerate(listed)}
    cone = _cone(func, output)
    devices = max((m.num_devices for m in read_meshes(module).values()), default=1)
    stepped = _schedule_values(func, devices)
    meshes = read_meshes(module)
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
        site.indices.append(index[_key(op)])
        site.loc = loc
    return list(sites.values())


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
                    [Alternative("picks the other branch (its branches swapped)", _swap)])
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
                    [Alternative(f"takes {c} there", _set_operand(position, c))
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


def _swap(op: ir.Operation) -> None:
    a, b = op.operands[1], op.operands[2]
    op.operands[1] = b
    op.operands[2] = a


def _set_operand(position: int, number: int) -> Callable[[ir.Operation], None]:
    def apply(op: ir.Operation) -> None:
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
                options.setdefault(tuple(moved), f"moves them by {other:+d} along '{axis}' "
                                                 f"({_pairs_text(moved)})")
    else:
        does = f"sends {_pairs_text(pairs)}"
    reverse = sorted((t, s) for s, t in pairs)
    if reverse != sorted(pairs):
        options.setdefault(tuple(reverse), f"sends the other way ({_pairs_text(reverse)})")
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


def _set_pairs(pairs: list) -> Callable[[ir.Operation], None]:
    def apply(op: ir.Operation) -> None:
        array = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        op.attributes["source_target_pairs"] = ir.DenseIntElementsAttr.get(array)
    return apply
