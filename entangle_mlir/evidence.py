"""Evidence for a "not proven" verdict: run both programs on one seeded random input and show
that the numbers differ, at the outputs and at the op the diagnostic names.

Op-level evidence runs copies of the walked modules: the diverging sharded op's result becomes
the only result of the shard_map body, which runs as one replica per device (simulated CPU
devices), and its reference counterpart becomes the only result of the reference. The
per-device values are reassembled with the relation the check expected there (concat over the
split axes, the sum of partials, or each device's own value where a reduction is missing) and
compared with the reference's value. Needs jax and as many devices as the mesh.

Output evidence runs the whole programs: from Python the jax functions themselves
(`output_evidence`), from MLIR files the programs (`program_evidence`, on the machinery that
confirms claims, `compare_programs`).

Evidence calls values different relative to their scale, never by an absolute threshold:
elements w (reference) and g (sharded) differ when |w - g| > atol + rtol * max(|w|, |g|), with
atol = rtol * max|w| over the value (a sum that cancels keeps the rounding of its terms) and
rtol from the dtype and the reordered float sums the reference computes (`tolerance`). A
correct gradient near 1e11 whose float32 sums were reordered does not differ; a wrong value
near 1e-7 does.

Running a per-device program as replicas (`as_replicas`, `device_blocks`, `local_block`,
`execute_replicas`) also serves `jax.run_per_device` and the attacker. Importing this module
does not import jax: the functions that run programs do.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from entangle_mlir.analysis.infer import Walker
from entangle_mlir.mlir.compat import block_argument, hlo_bindings
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.mlir.per_device import (
    adopt_shardy_local,
    is_per_device,
    parameter_shardings,
    program_device_count,
    result_shardings,
)
from entangle_mlir.mlir.program import read_meshes

_EVIDENCE_MARK = "entangle.evidence_sharded"
_REFERENCE_MARK = "entangle.evidence_reference"
_NUMPY_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
                 "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
                 "ui64": "uint64", "ui32": "uint32", "ui16": "uint16", "ui8": "uint8",
                 "i1": "bool"}


_EPSILON = {"f64": 2.0 ** -52, "f32": 2.0 ** -23, "tf32": 2.0 ** -10, "f16": 2.0 ** -10,
            "bf16": 2.0 ** -7}
"""Machine epsilon per MLIR float type; float8 types (not listed) take `_EPSILON_F8`."""
_EPSILON_F8 = 2.0 ** -2

TOLERANCE_FACTOR = 16
"""rtol = TOLERANCE_FACTOR x the largest (epsilon x terms) of the reference's float sums:
reordering a sum of n terms moves it by up to about n epsilons of its terms; the factor covers a
few such sums in a chain and the ops between them."""

MAX_RTOL = 0.05
"""The loosest relative tolerance (low-precision programs with long sums): a difference of 5%
of the values' scale is always called one."""


class Unavailable(Exception):
    """Op-level evidence cannot be taken; the message says why (shown to the user)."""


def random_input(shape, dtype, rng: np.random.Generator, kind: str = "normal",
                 index_range: int = 0, edges: tuple[int, ...] = ()) -> np.ndarray:
    """One argument: standard normal floats (`kind` "positive": |normal| + 0.5, inputs of log
    and sqrt; "small": normal / 10, values that stay small through products; "large": 100 x
    normal, where an exp that is not shifted by the max overflows in float32); small
    non-negative integers (valid indices of any dim), or uniform in [0, `index_range`) for an
    input known to index a dim of that size; random booleans. The same draw for the outputs'
    and the op's evidence. `kind` "edges" with `edges` given: an integer input drawn as
    "normal", about half its elements replaced by values picked from `edges` (the extremes
    of its type, the constants the program compares it with: `confirm.input_edges`)."""
    dtype = np.dtype(dtype)
    if kind == "edges" and edges and np.issubdtype(dtype, np.integer):
        plain = random_input(shape, dtype, rng, "normal", index_range)
        picked = rng.choice(np.asarray(edges, dtype=np.int64), tuple(shape)).astype(dtype)
        return np.where(rng.random(tuple(shape)) < 0.5, picked, plain)
    if index_range and np.issubdtype(dtype, np.integer):
        return rng.integers(0, index_range, tuple(shape)).astype(dtype)
    values = rng.standard_normal(tuple(shape))
    if kind == "positive":
        values = np.abs(values) + 0.5
    elif kind == "small":
        values = values / 10
    elif kind == "large" and np.issubdtype(dtype, np.floating):
        values = values * 100
    if dtype == np.bool_:
        return values > 0
    if np.issubdtype(dtype, np.integer):
        return np.abs(values).astype(dtype)
    return values.astype(dtype)


def sum_precision(module_or_func) -> float:
    """The largest (epsilon of its type) x (terms summed) over the float sums an op computes in
    `module_or_func` (a dot_general's contracted size, a reduce's or reduce_window's reduced
    size; 0 when it sums nothing): how far reordering the program's sums may move a value,
    relative to its terms. `tolerance` turns it into a relative tolerance."""
    found = [0.0]

    def visit(op):
        name = op.name
        terms = 1
        try:
            if name in ("stablehlo.dot_general", "stablehlo.dot"):
                info = describe(op)
                lhs = info.operand_types[0].shape
                terms = math.prod(lhs[d] for d in info.attrs["lhs_contract"])
            elif name == "stablehlo.reduce":
                shape = ir.RankedTensorType(op.operands[0].type).shape
                terms = math.prod(shape[d] for d in ir.DenseI64ArrayAttr(
                    op.attributes["dimensions"]))
            elif name == "stablehlo.reduce_window":
                terms = math.prod(ir.DenseI64ArrayAttr(op.attributes["window_dimensions"]))
            else:
                return ir.WalkResult.ADVANCE
            element = str(ir.RankedTensorType(op.results[0].type).element_type)
        except Exception:  # noqa: BLE001 - an op it cannot read sums nothing it knows of
            return ir.WalkResult.ADVANCE
        if terms > 1 and (element in _EPSILON or element.startswith("f8")):
            found[0] = max(found[0], terms * _EPSILON.get(element, _EPSILON_F8))
        return ir.WalkResult.ADVANCE

    with context():
        operation = getattr(module_or_func, "operation", module_or_func)
        operation.walk(visit)
    return found[0]


def tolerance(dtype, precision: float) -> float:
    """The relative tolerance of values of `dtype` computed by a program whose reordered float
    sums have `precision` (`sum_precision`): 0 for integers and booleans (exact), else
    TOLERANCE_FACTOR x the larger of `precision` and the dtype's epsilon, at most MAX_RTOL."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return 0.0
    epsilon = _EPSILON.get({"float64": "f64", "float32": "f32", "float16": "f16",
                            "bfloat16": "bf16"}.get(dtype.name, ""), _EPSILON_F8)
    return min(MAX_RTOL, TOLERANCE_FACTOR * max(precision, epsilon))


def compare_values(want, got, rtol: float, scale: float | None = None) -> dict:
    """`want` (reference) against `got` (sharded): `max_abs_diff` (None when some value is not
    finite on one side only, or the shapes differ), `max_abs_reference` (the reference's scale:
    `scale` when given, for a block of a larger value, else max |want| over its finite values),
    `rtol`, and `differs`: some element has |w - g| > atol + rtol * max(|w|, |g|), atol = rtol x
    the scale (values equal on both sides, the same inf or NaN, never differ)."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if want.shape != got.shape:
        return {"max_abs_diff": None, "max_abs_reference": scale or 0.0, "rtol": rtol,
                "differs": True}
    same = (want == got) | (np.isnan(want) & np.isnan(got))
    if scale is None:
        magnitude = np.abs(want)
        scale = float(np.max(magnitude[np.isfinite(magnitude)], initial=0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(want - got))
        bound = rtol * scale + rtol * np.maximum(np.abs(want), np.abs(got))
        differs = bool(np.any(~same & ~(diff <= bound)))
    largest = float(np.max(diff, initial=0.0))
    return {"max_abs_diff": largest if math.isfinite(largest) else None,
            "max_abs_reference": scale, "rtol": rtol, "differs": differs}


def _compare_blocks(value: np.ndarray, pairs, rtol: float) -> dict:
    """An output compared device block by device block (`compare_programs`' pairs), against
    the scale of the whole reference value."""
    magnitude = np.abs(np.asarray(value, np.float64))
    scale = float(np.max(magnitude[np.isfinite(magnitude)], initial=0.0))
    found = [compare_values(want, got, rtol, scale) for want, got in pairs]
    diffs = [f["max_abs_diff"] for f in found]
    return {"max_abs_diff": None if None in diffs else max(diffs, default=0.0),
            "max_abs_reference": scale, "rtol": rtol,
            "differs": any(f["differs"] for f in found)}


def outputs_summary(results: list[dict], seed: int) -> dict:
    """The outputs' evidence from each output's comparison (`compare_values`): the numbers per
    output, and one line saying whether they differ, by how much, at what scale."""
    diffs = [r["max_abs_diff"] for r in results]
    where = f"on a random input (seed {seed})"
    differing = [i for i, r in enumerate(results) if r["differs"]]
    if any(d is None for d in diffs):
        summary = (f"{where} some outputs are not finite (inf or NaN) or not of the reference's "
                   "shape, so they cannot be compared numerically")
    elif differing:
        worst = max(differing, key=lambda i: diffs[i] / max(
            results[i]["max_abs_reference"], 1e-300))
        r = results[worst]
        summary = (f"{where} the outputs differ by up to {max(diffs):.3g} (result #{worst}: "
                   f"{r['max_abs_diff']:.3g} where its values reach "
                   f"{r['max_abs_reference']:.3g}, beyond the relative tolerance "
                   f"{r['rtol']:.2g} of reordered float sums)")
    else:
        rtol = max((r["rtol"] for r in results), default=0.0)
        scale = max((r["max_abs_reference"] for r in results), default=0.0)
        summary = (f"{where} the outputs agree to {max(diffs, default=0.0):.1g} at values up "
                   f"to {scale:.3g}, within the relative tolerance {rtol:.2g} of reordered "
                   "float sums: the difference needs other inputs, or it is beyond what was "
                   "proven")
    return {"seed": seed, "max_abs_diff": diffs,
            "max_abs_reference": [r["max_abs_reference"] for r in results],
            "rtol": [r["rtol"] for r in results],
            "differs": [r["differs"] for r in results], "summary": summary}


def program_evidence(program, index_ranges: dict[int, int] | None = None,
                     seed: int = 0) -> dict:
    """The outputs of both functions of `program` (a `mlir.program.Program` of modules that
    have not been normalized) on one seeded random input, compared relative to their scale
    (`compare_values`, rtol from `tolerance`), every device's block: what `entangle check
    --evidence` and `check_partitioned` report. Never raises: `{"summary": "not available
    (...)"}` says why the programs could not run."""
    found: list = []
    try:
        precision = sum_precision(program.ref_module)
        compare_programs(program, ((seed, "normal"),), index_ranges, collect=found)
    except ImportError as err:
        return {"summary": f"not available (jax is not available: {err})"}
    except Unavailable as err:
        return {"summary": f"not available ({err})"}
    except Exception as err:  # noqa: BLE001 - evidence is best effort, never a failure
        return {"summary": f"not available ({type(err).__name__}: {_first_line(err)})"}
    return outputs_summary([_compare_blocks(value, pairs, tolerance(value.dtype, precision))
                            for _, _, value, pairs in found], seed)


def output_evidence(reference_fn, sharded_fn, avals, seed: int = 0,
                    precision: float = 0.0) -> dict:
    """The outputs of both jax functions on a seeded random input, compared relative to their
    scale (`compare_values`; `precision`: the reference program's `sum_precision`)."""
    import jax  # lazy: 1 s to import; and check_evidence sets XLA_FLAGS before it loads

    rng = np.random.default_rng(seed)
    try:
        leaves, tree = jax.tree.flatten(list(avals))   # avals may be pytrees (params dicts)
        values = [random_input(aval.shape, aval.dtype, rng) for aval in leaves]
        placed = [jax.device_put(value, aval.sharding) if getattr(aval, "sharding", None)
                  is not None else value for value, aval in zip(values, leaves)]
        want = jax.tree.leaves(run_once(reference_fn, *jax.tree.unflatten(tree, values)))
        got = jax.tree.leaves(run_once(sharded_fn, *jax.tree.unflatten(tree, placed)))
    except Exception as err:  # noqa: BLE001 - evidence is best effort, never a failure
        return {"summary": f"not available ({type(err).__name__}: {err})"}
    results = [compare_values(w, g, tolerance(np.asarray(w).dtype, precision))
               for w, g in zip(want, got)]
    if len(want) != len(got):
        results.append({"max_abs_diff": None, "max_abs_reference": 0.0, "rtol": 0.0,
                        "differs": True})
    return outputs_summary(results, seed)


def run_once(fn, *args):
    """`fn(*args)` (`fn` jitted or not), compiled without XLA's backend optimisations
    (`FAST_COMPILE`): a program run once on small inputs, its outputs compared within a
    tolerance, where XLA's optimising would take most of the run's CPU."""
    import jax  # lazy: 1 s to import; and check_evidence sets XLA_FLAGS before it loads

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args).compile(compiler_options=FAST_COMPILE)(*args)


def _max_diff(want, got) -> float:
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if want.shape != got.shape:
        return float("inf")
    # Equal values (the same infinities of a mask, NaN on both sides) do not differ.
    same = (want == got) | (np.isnan(want) & np.isnan(got))
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(same, 0.0, np.abs(want - got)), initial=0.0))


# ----- op-level evidence ------------------------------------------------------------------------

def op_evidence(focus, seed: int = 0) -> dict:
    """The diverging op's value, sharded (reassembled) against reference, on a random input.

    `focus` is the `refine.EvidenceFocus` of the report's first diagnostic. Returns
    `{"available": True, "max_abs_diff": ..., "summary": ...}` or `{"available": False,
    "reason": ..., "summary": ...}`; never raises.
    """
    if focus is None:
        return _unavailable("the check named no diverging op")
    if focus.unavailable:
        return _unavailable(focus.unavailable)
    if len(focus.modules) != 2:
        return _unavailable("the walked modules were not kept")
    try:
        return _op_evidence(focus, seed)
    except Unavailable as err:
        return _unavailable(str(err))
    except Exception as err:  # noqa: BLE001 - evidence is best effort, never a failure
        return _unavailable(f"running the programs failed ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})")


def check_evidence(report, program) -> dict:
    """`entangle check --evidence`: the outputs of both programs compared (`program_evidence`;
    `program` is the checked pair as loaded, not normalized) and, unless confirming a claim
    already took it, op-level evidence, on enough simulated CPU devices (jax is imported here,
    only when asked for)."""
    focus = report.focus
    needed = focus.mesh.num_devices if focus is not None and focus.mesh is not None else 1
    sizes = [int(size) for size in re.findall(r"=(\d+)", report.mesh)]
    needed = min(max(needed, math.prod(sizes), 8), MAX_RUN_DEVICES)
    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={needed}").strip()
    evidence = program_evidence(program, report.index_ranges)
    if "at_op" not in report.evidence:
        evidence["at_op"] = op_evidence(focus)
    return evidence


def _unavailable(reason: str) -> dict:
    return {"available": False, "reason": reason,
            "summary": f"no evidence at the diverging op: {reason}; the outputs are compared "
                       "instead"}


def _op_evidence(focus, seed: int) -> dict:
    ref_module, sharded_module = focus.modules
    ref_text, sharded_text = _marked_texts(focus, ref_module, sharded_module)
    rng = np.random.default_rng(seed)
    ref_main_types = _main_arg_types(ref_text)
    args = [random_input(shape, dtype, rng) for shape, dtype in ref_main_types]
    reference_program = _expose_reference(ref_text, focus.ref_result)
    want = execute_replicas(reference_program, [args], fast=True)[0][0]
    per_device_program, per_device_args, mesh = _sharded_program(sharded_text, focus, args)
    got_local = [outs[0] for outs in execute_replicas(per_device_program, per_device_args,
                                                      fast=True)]
    got = reassemble(got_local, focus.relation, mesh)
    if got.shape != want.shape:
        raise Unavailable(f"the sharded value reassembles to shape {list(got.shape)}, the "
                          f"reference's is {list(want.shape)}")
    diff = _max_diff(want, got)
    compared = compare_values(want, got, tolerance(np.asarray(want).dtype,
                                                   sum_precision(ref_module)))
    scale = compared["max_abs_reference"]
    sharded_op, ref_op = focus.sharded, focus.reference
    where = f" ({sharded_op.loc})" if sharded_op.loc else ""
    ref_where = f" ({ref_op.loc})" if ref_op.loc else ""
    reference = f"the reference's {ref_op.info.name}{ref_where}"
    if not math.isfinite(diff):
        verdict = (f"and {reference} are not finite (inf or NaN), so they cannot be compared "
                   "numerically")
    elif compared["differs"]:
        verdict = (f"differs from {reference} by up to {diff:.3g} (whose values reach "
                   f"{scale:.3g})")
    else:
        verdict = (f"agrees with {reference} to {diff:.1g}, within the relative tolerance "
                   f"{compared['rtol']:.2g} of reordered float sums: the difference needs "
                   "other inputs, or only shows later")
    summary = (f"on a random input (seed {seed}), at {sharded_op.info.name}{where} the sharded "
               f"value, read as {focus.how}, {verdict}")
    return {"available": True, "seed": seed,
            "sharded_op": sharded_op.info.name, "sharded_location": str(sharded_op.loc or ""),
            "reference_op": ref_op.info.name, "reference_location": str(ref_op.loc or ""),
            "relation": focus.how, "max_abs_diff": diff if math.isfinite(diff) else None,
            "max_abs_reference": scale, "rtol": compared["rtol"],
            "differs": compared["differs"], "summary": summary}


def _marked_texts(focus, ref_module, sharded_module) -> tuple[str, str]:
    """Both modules as text, with the two ops of interest marked by a unit attribute."""
    marks = ((focus.sharded.info.op, _EVIDENCE_MARK), (focus.reference.info.op, _REFERENCE_MARK))
    with context():
        for op, name in marks:
            op.attributes[name] = ir.UnitAttr.get()
        try:
            return _module_text(ref_module), _module_text(sharded_module)
        finally:
            for op, name in marks:
                del op.attributes[name]


def _module_text(module) -> str:
    return module.operation.get_asm(enable_debug_info=False)


def _main_arg_types(text: str) -> list[tuple[tuple[int, ...], str]]:
    """Shapes and numpy dtypes of the arguments of the reference function (the one holding the
    marked reference op)."""
    with context():
        module = parse_module(text)
        func_op = _enclosing_func(_find(module, _REFERENCE_MARK, keep=True))
        return [_numpy_type(a.type) for a in func_op.regions[0].blocks[0].arguments]


def _enclosing_func(op):
    while op is not None and op.name != "func.func":
        op = op.parent
    if op is None:
        raise Unavailable("the op is in no function")
    return op


def _as_entry(module, func_op) -> None:
    """Make `func_op` the module's public `main` (a combined file holds the reference and the
    sharded function side by side; calls are inlined by then): every other function goes."""
    if func_op.attributes["sym_name"] == ir.StringAttr.get("main") and (
            "sym_visibility" not in func_op.attributes):
        return
    for op in list(module.body.operations):
        if op.name == "func.func" and op != func_op:
            op.erase()
    func_op.attributes["sym_name"] = ir.StringAttr.get("main")
    if "sym_visibility" in func_op.attributes:
        del func_op.attributes["sym_visibility"]


def _numpy_type(t) -> tuple[tuple[int, ...], str]:
    if not isinstance(t, ir.RankedTensorType):
        raise Unavailable(f"an argument of type {t} cannot be made up")
    ranked = t
    name = _NUMPY_DTYPES.get(str(ranked.element_type))
    if name is None:
        raise Unavailable(f"no random input for element type {ranked.element_type}")
    if name == "bfloat16":
        import ml_dtypes  # lazy: 1 s to import (jax loads it too); only bf16 needs it

        return tuple(ranked.shape), ml_dtypes.bfloat16
    return tuple(ranked.shape), name


def _find(module, mark: str, keep: bool = False):
    found = []

    def visit(op):
        if mark in op.attributes:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if len(found) != 1:
        raise Unavailable("the op could not be found again in a copy of the program")
    if not keep:
        del found[0].attributes[mark]
    return found[0]


def _marked_entry(module, mark: str, what: str):
    """(the marked op, its function made the module's entry); Unavailable when the op sits in
    a nested region, which cannot run on its own."""
    target = _find(module, mark)
    main = target.parent
    if main.name != "func.func":
        raise Unavailable(f"{what} is inside a {main.name} region (a loop body or a branch "
                          "cannot be run on its own)")
    _as_entry(module, main)
    return target, main


def _expose_reference(text: str, result: int) -> str:
    """The reference with the marked op's `result` as its only result."""
    with context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        target, main = _marked_entry(module, _REFERENCE_MARK, "the reference op")
        value = target.results[result]
        block = main.regions[0].blocks[0]
        terminator = list(block.operations)[-1]
        with ir.InsertionPoint(terminator):
            func.ReturnOp([value])
        terminator.erase()
        inputs = [a.type for a in block.arguments]
        main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs,
                                                                               [value.type]))
        if "res_attrs" in main.attributes:
            del main.attributes["res_attrs"]
        return as_replicas(module, 1)


def _sharded_program(text: str, focus, args: list[np.ndarray]):
    """(per-device program returning the marked op's result, each device's arguments, mesh)
    for a shard_map program or a per-device (partitioned) one."""
    with context():
        module = parse_module(text)
        target = _find(module, _EVIDENCE_MARK, keep=True)
        in_shard_map = target.parent.name == "sdy.manual_computation" or any(
            op.name == "sdy.manual_computation"
            for op in _enclosing_func(target).regions[0].blocks[0].operations)
    if not in_shard_map:
        program, shardings, local_shapes = _expose_per_device(text, focus.result)
        return program, _per_device_args(args, shardings, local_shapes, focus.mesh), focus.mesh
    program, operand_args, tilings, mesh = _expose_sharded(text, focus.result)
    if len(operand_args) and max(operand_args) >= len(args):
        raise Unavailable("the sharded program takes other arguments than the reference")
    per_device_args = [[_block(args[j], tiling, mesh, d) for j, tiling in
                        zip(operand_args, tilings)] for d in range(mesh.num_devices)]
    return program, per_device_args, mesh


def _per_device_args(args, shardings, local_shapes, mesh) -> list[list[np.ndarray]]:
    """Each device's parameters of a partitioned program: its block of every global argument
    as the parameter's `mhlo.sharding` says (uneven shards zero-padded, as XLA does)."""
    if len(args) != len(shardings):
        raise Unavailable("the sharded program takes other arguments than the reference")
    n = mesh.num_devices
    per_arg = []
    for arg, sharding, local in zip(args, shardings, local_shapes):
        blocks = device_blocks(sharding, arg.shape, local, n)
        per_arg.append([local_block(arg, blocks[d], local) for d in range(n)])
    return [[column[d] for column in per_arg] for d in range(n)]


def _expose_per_device(text: str, result: int):
    """A partitioned program returning the marked op's `result` instead of its results, with
    its parameters' shardings and local shapes."""
    with context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        target, main = _marked_entry(module, _EVIDENCE_MARK, "the op")
        shardings = parameter_shardings(module, main)
        n = program_device_count(module, main)
        block = main.regions[0].blocks[0]
        local_shapes = [tuple(a.type.shape) for a in block.arguments]
        value = target.results[result]
        terminator = list(block.operations)[-1]
        with ir.InsertionPoint(terminator):
            func.ReturnOp([value])
        terminator.erase()
        main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in block.arguments], [value.type]))
        for name in ("res_attrs",):
            if name in main.attributes:
                del main.attributes[name]
        attrs = module.operation.attributes
        if "mhlo.spmd_output_sharding" in attrs:
            del attrs["mhlo.spmd_output_sharding"]
        return as_replicas(module, n), shardings, local_shapes


def _expose_sharded(text: str, result: int):
    """The body of the shard_map holding the marked op, as a per-device program returning the
    op's `result`; with, per body argument, the index of the main argument it receives and its
    tiling, and the mesh."""
    with context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        target = _find(module, _EVIDENCE_MARK)
        manual = target.parent
        if manual.name != "sdy.manual_computation":
            raise Unavailable(f"the op is inside a {manual.name} region (a loop body or a "
                              "branch cannot be run on its own)")
        main = manual.parent
        if main.name != "func.func":
            raise Unavailable(f"the shard_map is inside a {main.name} region")
        if "device_ids" in str(module.operation.attributes):
            raise Unavailable("the mesh lists its devices in a custom order")
        walker = Walker(main, module, "-")
        mesh, in_tilings, _, manual_axes = walker._manual_shardings(manual,
                                                                     describe(manual, "-"))
        if set(manual_axes) != set(mesh.names):
            raise Unavailable("the shard_map is manual over only some mesh axes")
        main_args = list(main.regions[0].blocks[0].arguments)
        operand_args = []
        for operand in manual.operands:
            argument = block_argument(operand)
            if argument is None or operand not in main_args:
                raise Unavailable("a shard_map operand is computed, not an argument of the "
                                  "program")
            operand_args.append(argument.arg_number)
        body = manual.regions[0].blocks[0]
        value = target.results[result]
        out = ir.Module.create()
        with ir.InsertionPoint(out.body):
            entry_func = func.FuncOp("main", ([a.type for a in body.arguments], [value.type]))
        entry = entry_func.add_entry_block()
        for old, new in zip(body.arguments, entry.arguments):
            old.replace_all_uses_with(new)
        with ir.InsertionPoint(entry):
            ret = func.ReturnOp([value])
        for op in list(body.operations):
            op.move_before(ret)
            if op == target:
                break
        return as_replicas(out, mesh.num_devices), operand_args, in_tilings, mesh


_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
                "stablehlo.all_to_all", "stablehlo.collective_permute",
                "stablehlo.collective_broadcast")


def as_replicas(module, n: int) -> str:
    """The module's text for running as `n` replicas of one partition: every collective
    cross-replica (replica ids are the logical device ids) and `partition_id` as `replica_id`
    (what `execute_replicas` runs). Rewrites `module` in place."""
    def cross_replica(op):
        if op.name in _COLLECTIVES:
            for name in ("channel_handle", "use_global_device_ids"):
                if name in op.attributes:
                    del op.attributes[name]
        return ir.WalkResult.ADVANCE

    module.operation.walk(cross_replica)
    attrs = module.operation.attributes
    attrs["mhlo.num_replicas"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), n)
    attrs["mhlo.num_partitions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
    return _module_text(module).replace("stablehlo.partition_id", "stablehlo.replica_id")


def compile_replicas(text: str, n: int, fast: bool = False):
    """(executable, devices): a StableHLO module compiled to run as `n` replicas of one
    partition on jax's first `n` CPU devices (`fast`: without XLA's backend optimisations,
    for a program run a few times)."""
    from jax._src import xla_bridge  # lazy: imports jax (1 s)
    from jax._src.lib import xla_client  # lazy: imports jax (1 s)

    backend = xla_bridge.get_backend("cpu")
    devices = backend.devices()[:n]
    if len(devices) < n:
        raise Unavailable(f"the program needs {n} devices, jax has {len(devices)} (set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    options = xla_client.CompileOptions()
    options.num_replicas = n
    options.num_partitions = 1
    options.executable_build_options.use_spmd_partitioning = False
    options.executable_build_options.num_replicas = n
    options.executable_build_options.num_partitions = 1
    options.device_assignment = xla_client.DeviceAssignment.create(np.arange(n).reshape(n, 1))
    if fast:
        options.env_option_overrides = list(FAST_COMPILE.items())
    return backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)), options), devices


def execute_replicas(text: str, per_device_args: list[list[np.ndarray]], fast: bool = False
                     ) -> list[list[np.ndarray]]:
    """Run a StableHLO module as one replica per entry of `per_device_args` (device d gets
    `per_device_args[d]`) on jax's CPU devices; `outputs[device][result]` as numpy arrays
    (`fast`: compiled without XLA's backend optimisations, `compile_replicas`)."""
    import jax  # lazy: 1 s to import; and check_evidence sets XLA_FLAGS before it loads

    n = len(per_device_args)
    executable, devices = compile_replicas(text, n, fast=fast)
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("replicas",)),
                                            jax.sharding.PartitionSpec())
    arrays = []
    for k in range(len(per_device_args[0]) if per_device_args else 0):
        shards = [jax.device_put(np.asarray(per_device_args[d][k]), devices[d])
                  for d in range(n)]
        # One array whose buffer on device d is device d's argument: declared replicated (the
        # shapes agree), the contents differ per device as the per-device program wants.
        arrays.append(jax.make_array_from_single_device_arrays(shards[0].shape, replicated,
                                                               shards))
    outs = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(outs[r][d]) for r in range(len(outs))] for d in range(n)]



def device_blocks(sharding: str | None, global_shape, local_shape, num_devices: int):
    """Per device, the index (tuple of slices) of its block of a global array, for an
    `mhlo.sharding` string (uneven shards are padded at the end, as XLA does)."""
    if sharding is None:
        return [tuple(slice(0, n) for n in global_shape)] * num_devices
    parsed = hlo_bindings().HloSharding.from_string(sharding)
    if parsed.is_replicated() or parsed.is_maximal():
        return [tuple(slice(0, n) for n in global_shape)] * num_devices
    dims = list(parsed.tile_assignment_dimensions())
    devices = list(parsed.tile_assignment_devices())
    strides = [1] * len(dims)
    for k in range(len(dims) - 2, -1, -1):
        strides[k] = strides[k + 1] * dims[k + 1]
    blocks = [None] * num_devices
    for position, device in enumerate(devices):
        index = []
        for k in range(len(global_shape)):
            tile = (position // strides[k]) % dims[k]
            start = tile * local_shape[k]
            index.append(slice(start, start + local_shape[k]))
        blocks[device] = tuple(index)
    return blocks


def local_block(array, index, local_shape) -> np.ndarray:
    """array[index], zero-padded to the local shape (the padding of uneven shards): a
    device's argument of a per-device program, with `index` from `device_blocks`."""
    block = np.asarray(array)[index]
    if block.shape == tuple(local_shape):
        return block
    out = np.zeros(local_shape, dtype=block.dtype)
    out[tuple(slice(0, n) for n in block.shape)] = block
    return out

def _block(array: np.ndarray, tiling, mesh, device: int) -> np.ndarray:
    """Device `device`'s block of a global array split by `tiling` (per dim, mesh axes)."""
    index = []
    for size, axes in zip(array.shape, tiling):
        parts = mesh.group_size(axes)
        if size % parts:
            raise Unavailable(f"a dim of size {size} does not divide over {len(axes)} axes")
        local = size // parts
        start = mesh.block_index(axes, device) * local
        index.append(slice(start, start + local))
    return array[tuple(index)]


_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def reassemble(per_device: list[np.ndarray], rel, mesh) -> np.ndarray:
    """The global value the per-device values stand for under `rel`: blocks placed along the
    split dims, partial values combined over the partial axes, devices that only differ on
    the other (replicating) axes read at coordinate 0 there. (A dim a broadcast widened at the
    local shape is read at its local size; the caller compares shapes.)"""
    local = per_device[0].shape
    if len(local) != len(rel.tiling):
        raise Unavailable("the value's rank differs from its relation's")
    combine = _COMBINE.get(rel.kind or "sum")
    if rel.partial and combine is None:
        raise Unavailable(f"a partial {rel.kind} cannot be combined")
    used = set(rel.tiled_axes) | set(rel.partial)
    shape = tuple(n * mesh.group_size(axes) for n, axes in zip(local, rel.tiling))
    out = np.zeros(shape, dtype=np.float64)
    filled = np.zeros(shape, dtype=bool)
    for device, value in enumerate(per_device):
        coords = mesh.coords(device)
        if any(coords[a] for a in mesh.names if a not in used):
            continue
        index = tuple(slice(mesh.block_index(axes, device) * n,
                            (mesh.block_index(axes, device) + 1) * n)
                      for n, axes in zip(local, rel.tiling))
        block = np.asarray(value, np.float64)
        out[index] = np.where(filled[index], combine(out[index], block), block)
        filled[index] = True
    return out


# ----- whole programs on random inputs (confirming a claim) --------------------------------------

INPUT_DRAWS: tuple[tuple[int, str], ...] = ((0, "normal"), (1, "small"), (2, "positive"),
                                             (3, "large"))
"""The random inputs whole programs are run on: (seed, kind) for `random_input`. Small values
keep a deep product's output near its inputs' scale (a wrong residual or bias shows there);
positive ones give a program taking logs or square roots finite outputs; large ones show a
log-sum-exp that overflows where the reference's does not."""

MAX_RUN_DEVICES = 64
"""Programs on more devices are not run (simulated CPU devices: one thread pool, slow)."""

MAX_RUN_ELEMENTS = 1 << 24
"""Programs whose arguments hold more elements in all are not run."""

CLAIM_TOLERANCE = 1e-3
"""Relative difference (to the reference output's largest magnitude) above which an output
differs: f32 reassociation of a well-conditioned output stays orders of magnitude below (an
ill-conditioned one is left out, `PERTURBATION`), a bf16 rounding of an f32 output above.
An output whose own type is coarser gets `LOW_PRECISION_ULPS` of its epsilon at least."""

LOW_PRECISION_ULPS = 8
"""An output of a float type whose epsilon is coarse (bf16: 2^-7, f16: 2^-10) differs only
beyond this many epsilons of its largest magnitude: the sharded program may regroup its
sums and products (liberty 1), and each regrouped step rounds to the output's type, so a
correct bf16 cumprod over 4 devices differs from the reference's by ~1 % of its scale (two
epsilons), more than `CLAIM_TOLERANCE`. (Before, a bf16 output was not even read as a
float: numpy does not count ml_dtypes' bfloat16 as floating, so any difference counted.)"""


def float_epsilon(dtype) -> float | None:
    """The epsilon of a real float type (numpy's or ml_dtypes': bf16, fp8), None for others
    (integers, booleans, complex)."""
    if np.issubdtype(dtype, np.complexfloating):
        return None
    try:
        return float(ml_dtypes.finfo(dtype).eps)
    except (ValueError, TypeError):
        return None

FAST_COMPILE = {"xla_backend_optimization_level": 0,
                "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_use_fusion_emitters": False}
"""XLA options for programs compiled to run once on small inputs (evidence, grounding, the
fuzzers): XLA's CPU backend would spend seconds optimising each."""


@dataclass
class OutputComparison:
    """One output of the sharded program against the reference's, over the input draws:
    `compared` when some finite values met (NaN and infinities are left out on both sides),
    `differs` when they are further apart than `CLAIM_TOLERANCE` allows; `seed` is the draw
    with the largest difference."""

    index: int
    compared: bool = False
    differs: bool = False
    max_abs_diff: float = 0.0
    max_abs_reference: float = 0.0
    seed: int | None = None
    not_finite: int | None = None
    """The draw (seed) on which the sharded output has inf or NaN where the reference's value
    is finite (an overflow the reference avoids), if any."""
    ill_conditioned: int = 0
    """Draws left out because the reference's output is too sensitive to its inputs there."""
    inputs_compared: int = 0
    """Draws on which finite values of the output were compared."""
    given: OutputComparison | None = None
    """The comparison on the given input alone (`compare_programs(..., given=)`), if any."""


GIVEN_SEED = -1
"""The `seed` of a comparison on a given input (no random draw)."""


def compare_programs(program, draws=INPUT_DRAWS, index_ranges: dict[int, int] | None = None,
                     given: dict[int, np.ndarray] | None = None,
                     collect: list | None = None,
                     edges: dict[int, tuple[int, ...]] | None = None
                     ) -> list[OutputComparison]:
    """Run both functions of `program` (a `mlir.program.Program` of modules that have not been
    normalized) on the random input `draws` and compare each output, every device's block of
    it. The reference runs on one CPU device; a shard_map program through XLA's SPMD
    partitioner on as many simulated devices as its mesh, a per-device program as replicas.
    Raises `Unavailable` when the programs cannot be run here (too large, too many devices,
    an argument type without random values, an op the CPU runtime cannot execute).

    `given`: one more input (argument index -> values, exact ones rounded to the argument's
    dtype; an argument it lacks drawn as the first draw draws it), compared on its own: each
    comparison's `given` is the comparison on it (a decision procedure's counterexample).

    `edges`: argument index -> integer values an "edges" draw mixes into it
    (`random_input`).

    `collect`: a list that receives, per draw and output, `(seed, index, reference value,
    [(the reference's block of device d, device d's block) for every device])`, ill-conditioned
    draws included: what `program_evidence` compares in its own way."""
    with context():
        reference = _entry_copy(program.ref_module, program.ref_func, program)
        sharded = _entry_copy(program.sharded_module, program.sharded_func, program)
        ref_main, sharded_main = (_public_main_of(reference), _public_main_of(sharded))
        arg_types = [_numpy_type(a.type) for a in ref_main.regions[0].blocks[0].arguments]
        if sum(math.prod(shape) for shape, _ in arg_types) > MAX_RUN_ELEMENTS:
            raise Unavailable(f"the arguments hold more than {MAX_RUN_ELEMENTS} elements")
        adopt_shardy_local(sharded, sharded_main, ref_main)
        per_device = is_per_device(sharded, sharded_main)
        ref_text = as_replicas(reference, 1)
        if per_device:
            shardings = parameter_shardings(sharded, sharded_main)
            n = program_device_count(sharded, sharded_main)
            locals_ = [tuple(a.type.shape) for a in sharded_main.regions[0].blocks[0].arguments]
            results = ir.FunctionType(ir.TypeAttr(
                sharded_main.attributes["function_type"]).value).results
            out_shardings = result_shardings(sharded, sharded_main, len(results))
            out_locals = [tuple(ir.RankedTensorType(t).shape) for t in results]
            sharded_text = None
            _limit_devices(n)
            replicas_text = as_replicas(sharded, n)
        else:
            n = _mesh_devices(sharded)
            _limit_devices(n)
            sharded_text = _module_text(sharded)
    import jax  # lazy: 1 s to import; only a run needs it

    ref_exe, _ = compile_replicas(ref_text, 1, fast=True)
    if per_device:
        exe, devices = compile_replicas(replicas_text, n, fast=True)
    else:
        exe, devices = _compile_partitioned(sharded_text, n)
        shardings = [_sharding_text(s) for s in exe.get_parameter_shardings()]
        out_shardings = [_sharding_text(s) for s in exe.get_output_shardings()]
        locals_ = [_local_shape(s, shape) for s, (shape, _) in zip(shardings, arg_types)]
        out_locals = None
    if len(shardings) != len(arg_types):
        raise Unavailable("the sharded program takes other arguments than the reference")
    ranges, special = index_ranges or {}, edges or {}

    def drawn(seed: int, kind: str) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [random_input(shape, dtype, rng, kind, ranges.get(i, 0), special.get(i, ()))
                for i, (shape, dtype) in enumerate(arg_types)]

    def compare(args: list[np.ndarray], seed: int, comparisons: list[OutputComparison]
                ) -> None:
        want = [np.asarray(w) for w in _execute(jax, ref_exe, devices[:1], [args])[0]]
        nearby = [np.asarray(w) for w in _execute(jax, ref_exe, devices[:1],
                                                  [_perturbed(args, seed)])[0]]
        per_device_args = []
        for d in range(n):
            per_device_args.append([local_block(arg, device_blocks(s, arg.shape, local, n)[d],
                                                local)
                                    for arg, s, local in zip(args, shardings, locals_)])
        got = _execute(jax, exe, devices, per_device_args)
        if not comparisons:
            comparisons.extend(OutputComparison(i) for i in range(len(want)))
        if any(len(row) != len(want) for row in got):
            raise Unavailable("the programs return different numbers of results")
        for i, value in enumerate(want):
            conditioned = _well_conditioned(value, nearby[i])
            if not conditioned and collect is None:
                comparisons[i].ill_conditioned += 1
                continue
            local = out_locals[i] if out_locals else _local_shape(out_shardings[i], value.shape)
            blocks = device_blocks(out_shardings[i], value.shape, local, n)
            pairs = []
            for d in range(n):
                block = value[blocks[d]]
                mine = np.asarray(got[d][i])[tuple(slice(0, k) for k in block.shape)]
                if mine.shape != block.shape:
                    raise Unavailable(f"result #{i} of device {d} has shape {list(mine.shape)}, "
                                      f"its block of the reference's {list(block.shape)}")
                pairs.append((block, mine))
            if collect is not None:
                collect.append((seed, i, value, pairs))
            if not conditioned:
                comparisons[i].ill_conditioned += 1
                continue
            _accumulate(comparisons[i], pairs, seed)

    comparisons: list[OutputComparison] = []
    for seed, kind in draws:
        compare(drawn(seed, kind), seed, comparisons)
    args = None if given is None else _given_args(
        given, arg_types, drawn(*draws[0]) if draws else drawn(0, "normal"))
    if args is not None:
        on_given: list[OutputComparison] = []
        compare(args, GIVEN_SEED, on_given)
        if not comparisons:
            comparisons = [OutputComparison(c.index) for c in on_given]
        for comparison, alone in zip(comparisons, on_given):
            comparison.given = alone
    return comparisons


def _given_args(given: dict[int, np.ndarray], arg_types, drawn: list[np.ndarray]
                ) -> list[np.ndarray] | None:
    """The arguments of a given input: its values where it has them (None when one does not
    have its argument's shape), else `drawn`'s."""
    args = []
    for i, (shape, dtype) in enumerate(arg_types):
        if i not in given:
            args.append(drawn[i])
            continue
        if np.shape(given[i]) != tuple(shape):
            return None
        args.append(_given_input(given[i], shape, dtype))
    return args


def _given_input(values, shape, dtype: str) -> np.ndarray:
    """Exact values (ints, Fractions, bools) as an argument of `dtype` (floats rounded)."""
    values = np.asarray(values, dtype=object)
    target = np.dtype(dtype)
    if target == np.bool_:
        return np.array([bool(v) for v in values.flat], dtype=np.bool_).reshape(shape)
    if np.issubdtype(target, np.integer):
        return np.array([int(v) for v in values.flat], dtype=object).reshape(shape
                                                                             ).astype(target)
    return np.array([float(v) for v in values.flat], dtype=np.float64).reshape(shape
                                                                           ).astype(target)


PERTURBATION = 1e-5
"""Relative noise on the float inputs of the reference's second run on each draw: an output that
moves by more than a tenth of `CLAIM_TOLERANCE` under it is ill-conditioned on that draw (an
argmax near a tie, a saturated softmax, a cancellation), where float reassociation alone can
move the sharded program's value as far; such a draw is not used for that output."""


def _perturbed(args: list[np.ndarray], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 1] if seed >= 0 else [0, 2])
    out = []
    for arg in args:
        if float_epsilon(arg.dtype) is not None:
            noise = 1 + PERTURBATION * rng.standard_normal(arg.shape)
            arg = (np.asarray(arg, np.float64) * noise).astype(arg.dtype)
        out.append(arg)
    return out


def _well_conditioned(want: np.ndarray, nearby: np.ndarray) -> bool:
    """Whether the reference's output barely moves under `PERTURBATION` of its inputs: by at
    most a tenth of `CLAIM_TOLERANCE` (relative to its largest magnitude), every finite value
    staying finite, an integer output not at all."""
    want64, nearby64 = np.asarray(want, np.float64), np.asarray(nearby, np.float64)
    if want64.shape != nearby64.shape:
        return False
    finite = np.isfinite(want64)
    if (finite & ~np.isfinite(nearby64)).any():
        return False
    dtype = np.asarray(want).dtype
    if float_epsilon(dtype) is None:
        return bool(np.array_equal(want64[finite], nearby64[finite]))
    if not finite.any():
        return True
    reach = float(np.max(np.abs(want64[finite])))
    noise = float(np.max(np.abs(want64[finite] - nearby64[finite])))
    return noise <= claim_limit(reach, dtype) / 10


ABSOLUTE_TOLERANCE = 1e-6
"""Differences below this do not count where the reference's output is exactly 0 (it has no
scale to be relative to)."""


def claim_limit(reach: float, dtype=None) -> float:
    """How far apart a float output (of `dtype`, if given) may be from the reference's whose
    largest magnitude is `reach` before it differs: `CLAIM_TOLERANCE` of that scale, or
    `LOW_PRECISION_ULPS` epsilons of `dtype` where more, however small the scale (a wrong
    value near 1e-11 differs as one near 1), or `ABSOLUTE_TOLERANCE` for an output of
    zeros."""
    if reach <= 0:
        return ABSOLUTE_TOLERANCE
    epsilon = float_epsilon(dtype) if dtype is not None else None
    return max(CLAIM_TOLERANCE, LOW_PRECISION_ULPS * (epsilon or 0.0)) * reach


def _relative(diff: float, reach: float) -> float:
    return diff / (reach if reach > 0 else ABSOLUTE_TOLERANCE)


def _accumulate(out: OutputComparison, pairs, seed: int) -> None:
    """Fold one draw's (reference block, device's block) pairs of an output into `out`: a
    float output differs when, on this draw, some finite values are further apart than
    `claim_limit` of the reference's largest magnitude allows, or the
    sharded value is inf or NaN where the reference's is finite; an integer one when any
    differ. Where the reference's value is not finite nothing is compared. The draw reported is
    the one with the largest relative difference."""
    diff = reach = 0.0
    exact = compared = False
    dtype = None
    for want, got in pairs:
        dtype = np.asarray(want).dtype
        exact = float_epsilon(dtype) is None
        want64, got64 = np.asarray(want, np.float64), np.asarray(got, np.float64)
        finite = np.isfinite(want64)
        if (finite & ~np.isfinite(got64)).any() and out.not_finite is None:
            out.not_finite, out.compared, out.differs = seed, True, True
        both = finite & np.isfinite(got64)
        if not both.any():
            continue
        compared = True
        reach = max(reach, float(np.max(np.abs(want64[both]))))
        diff = max(diff, float(np.max(np.abs(want64[both] - got64[both]))))
    if not compared:
        return
    out.compared = True
    out.inputs_compared += 1
    limit = 0.0 if exact else claim_limit(reach, dtype)
    if out.seed is None or _relative(diff, reach) > _relative(out.max_abs_diff,
                                                              out.max_abs_reference):
        out.max_abs_diff, out.max_abs_reference, out.seed = diff, reach, seed
    out.differs = out.differs or diff > limit


def _limit_devices(n: int) -> None:
    if n > MAX_RUN_DEVICES:
        raise Unavailable(f"the program runs on {n} devices (at most {MAX_RUN_DEVICES} are "
                          "simulated)")


def _entry_copy(module, func_op, program):
    """A copy of `module` whose entry (public `main`) is `func_op`: in a module holding both
    functions of the pair, the other one goes; every other function becomes private."""
    copy = ir.Module.parse(_module_text(module))
    name = ir.StringAttr(func_op.attributes["sym_name"]).value
    other = (program.sharded_func if func_op == program.ref_func else program.ref_func)
    other_name = (ir.StringAttr(other.attributes["sym_name"]).value
                  if program.ref_module == program.sharded_module else None)
    for op in list(copy.body.operations):
        if op.operation.name != "func.func":
            continue
        op_name = ir.StringAttr(op.attributes["sym_name"]).value
        if op_name == other_name or (op_name == "main" and name != "main"):
            op.operation.erase()
        elif op_name == name:
            op.attributes["sym_name"] = ir.StringAttr.get("main")
            for attr in ("sym_visibility", "entangle.refines"):
                if attr in op.attributes:
                    del op.attributes[attr]
        else:
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
    return copy


def _public_main_of(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(
                op.attributes["sym_name"]).value == "main":
            return op.operation
    raise Unavailable("the program has no entry function")


def _mesh_devices(module) -> int:
    """The device count of a shard_map program: its mesh's, or what the module states."""
    attrs = module.operation.attributes
    if "mhlo.num_partitions" in attrs and ir.IntegerAttr(attrs["mhlo.num_partitions"]).value > 1:
        return ir.IntegerAttr(attrs["mhlo.num_partitions"]).value
    meshes = read_meshes(module)
    sizes = {mesh.num_devices for mesh in meshes.values()}
    if len(sizes) != 1:
        raise Unavailable("the program's meshes do not say how many devices it runs on")
    return sizes.pop()


def _compile_partitioned(text: str, n: int):
    """(executable, devices): a module with shardings compiled by XLA's SPMD partitioner (Shardy)
    for `n` partitions on jax's first `n` CPU devices."""
    from jax._src import xla_bridge  # lazy: imports jax (1 s)
    from jax._src.lib import xla_client  # lazy: imports jax (1 s)

    backend = xla_bridge.get_backend("cpu")
    devices = backend.devices()[:n]
    if len(devices) < n:
        raise Unavailable(f"the program needs {n} devices, jax has {len(devices)} (set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    options = xla_client.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = n
    build = options.executable_build_options
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True
    build.num_replicas = 1
    build.num_partitions = n
    options.device_assignment = xla_client.DeviceAssignment.create(np.arange(n).reshape(1, n))
    options.env_option_overrides = list(FAST_COMPILE.items())
    try:
        executable = backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)),
                                              options)
    except Exception as err:  # noqa: BLE001 - XLA's error text says why
        raise Unavailable(f"XLA cannot compile the sharded program ({_first_line(err)})"
                          ) from None
    return executable, devices


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _sharding_text(op_sharding) -> str:
    return str(hlo_bindings().HloSharding.from_proto(op_sharding))


def _local_shape(sharding: str | None, shape) -> tuple[int, ...]:
    """A device's block shape of a global array under an `mhlo.sharding` (ceil division)."""
    if sharding is None:
        return tuple(shape)
    parsed = hlo_bindings().HloSharding.from_string(sharding)
    if parsed.is_replicated() or parsed.is_maximal():
        return tuple(shape)
    dims = list(parsed.tile_assignment_dimensions())
    return tuple(-(-size // dims[k]) for k, size in enumerate(shape))


def _execute(jax, executable, devices, per_device_args):
    """`outputs[device][result]` of a compiled program: device d gets `per_device_args[d]`."""
    n = len(per_device_args)
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices[:n]),
                                                              ("replicas",)),
                                            jax.sharding.PartitionSpec())
    arrays = []
    for k in range(len(per_device_args[0]) if per_device_args else 0):
        shards = [jax.device_put(np.asarray(per_device_args[d][k]), devices[d])
                  for d in range(n)]
        arrays.append(jax.make_array_from_single_device_arrays(shards[0].shape, replicated,
                                                               shards))
    try:
        outs = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
    except Exception as err:  # noqa: BLE001 - XLA's error text says why
        raise Unavailable(f"running the programs failed ({_first_line(err)})") from None
    return [[np.asarray(outs[r][d]) for r in range(len(outs))] for d in range(n)]
