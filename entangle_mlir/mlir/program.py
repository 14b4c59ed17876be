"""The pair of functions to compare, found in one module or linked from two, plus the mesh.

A combined module holds both functions; the sharded one carries `entangle.refines = @ref`.
`entangle check REF SHARDED` uses the public `main` of each file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.mlir.compat import hlo_bindings, inlined_func_call
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.opinfo import op_location, tensor_type
from entangle_mlir.mlir.per_device import (
    PARTITIONED_DUMP,
    adopt_shardy_local,
    is_per_device,
    parameter_shardings,
    result_shardings,
)


@dataclass
class Program:
    """Reference and sharded functions (possibly in different modules) and their files."""

    ref_module: ir.Module
    sharded_module: ir.Module
    ref_func: ir.Operation
    sharded_func: ir.Operation
    ref_file: str
    sharded_file: str


_NAME_LOC = re.compile(r'loc\("((?:[^"\\]|\\.)*)"(?:\)|\()')


def argument_names(func: ir.Operation) -> dict[int, str]:
    """A function's argument names as jax records them (`loc("params['w1']")` on each
    argument of a lowering with debug info), by index; an argument with a file location or
    none has no name."""
    names = {}
    for index, argument in enumerate(func.regions[0].blocks[0].arguments):
        found = _NAME_LOC.match(str(argument.location))
        if found:
            names[index] = found.group(1).replace('\\"', '"')
    return names


def result_names(func: ir.Operation) -> list[str]:
    """A function's result names as jax records them (`jax.result_info = "result['grads']"`
    in the result attributes), by index ('' where absent; [] without result attributes)."""
    if "res_attrs" not in func.attributes:
        return []
    names = []
    for attrs in ir.ArrayAttr(func.attributes["res_attrs"]):
        info = ir.DictAttr(attrs)
        names.append(ir.StringAttr(info["jax.result_info"]).value
                     if "jax.result_info" in info else "")
    return names


def functions(module: ir.Module) -> list[ir.Operation]:
    return [op.operation for op in module.body.operations if op.operation.name == "func.func"]


def func_name(func: ir.Operation) -> str:
    return ir.StringAttr(func.attributes["sym_name"]).value


def find_function(module: ir.Module, name: str) -> ir.Operation | None:
    return next((f for f in functions(module) if func_name(f) == name), None)


def public_main(module: ir.Module, file: str) -> ir.Operation:
    """The module's entry function: `@main`, else its only public function; else the input
    is unusable (`file` names it in the error)."""
    funcs = functions(module)
    if not funcs:
        raise InputError("no func.func in the module", file=file)
    main = find_function(module, "main")
    if main is not None:
        return main
    public = [f for f in funcs if "sym_visibility" not in f.attributes]
    if len(public) == 1:
        return public[0]
    raise InputError("cannot tell which function is the entry point (no @main)", file=file)


def from_two_modules(ref: ir.Module, sharded: ir.Module, ref_file: str,
                     sharded_file: str) -> Program:
    return Program(ref, sharded, public_main(ref, ref_file), public_main(sharded, sharded_file),
                   ref_file, sharded_file)


def from_combined(module: ir.Module, file: str) -> Program:
    """The function carrying `entangle.refines = @ref` and the function it names."""
    marked = [f for f in functions(module) if "entangle.refines" in f.attributes]
    if len(marked) > 1:
        names = ", ".join(f"@{func_name(f)}" for f in marked)
        raise InputError(f"several functions carry entangle.refines ({names}): put one "
                         "reference/sharded pair per file", op_location(marked[1], file))
    for func in marked:
        target = str(func.attributes["entangle.refines"]).lstrip("@").strip('"')
        ref = find_function(module, target)
        if ref is None:
            raise InputError(f"entangle.refines names @{target}, which does not exist",
                             op_location(func, file))
        if target == func_name(func):
            raise InputError(f"@{target} carries entangle.refines = @{target}: a function "
                             "cannot be checked against itself", op_location(func, file))
        return Program(module, module, ref, func, file, file)
    raise InputError("no function carries `entangle.refines = @reference`", file=file)


def has_refines(module: ir.Module) -> bool:
    return any("entangle.refines" in f.attributes for f in functions(module))


PARTITIONED_GUIDANCE = (
    "pass the program XLA partitioned instead: its module after SPMD partitioning, before "
    f"fusion (run with {PARTITIONED_DUMP}; from Python, "
    "entangle_mlir.jax.check_partitioned(f, *avals, out_shardings=...) or "
    "entangle_mlir.jax.partitioned_hlo), or write the sharded program with jax.shard_map")
"""What to pass when the sharded program is not one entangle can check (`check_form`)."""

_BEFORE_PARTITIONING = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape")
"""custom_call targets that only a module before SPMD partitioning holds (GSPMD's sharding
annotations and shard_map boundaries; Shardy's round trip through HLO adds `xla.sdy.*`)."""

_ASYNC = "it holds asynchronous ops (all-reduce-start/-done, copy-start/-done, ...)"
_AFTER_OPTIMIZATIONS = {
    "mhlo.fusion": "it holds fusions",
    "stablehlo.async_start": _ASYNC,
    "stablehlo.async_done": _ASYNC,
    "mhlo.async_start": _ASYNC,
    "mhlo.async_done": _ASYNC,
}
"""Ops (as jaxlib converts HLO) that only XLA's optimization passes after partitioning make."""

_LIBRARY_CALLS = ("__cublas$", "__cudnn$", "__onednn$")
"""custom_call targets of the libraries XLA's optimizations rewrite dots and convolutions to."""


def check_dump(program: Program) -> None:
    """The sharded program is not one of XLA's other dumps: its module after optimizations
    (fusions, asynchronous collectives, library calls) or a module before SPMD partitioning
    (sharding custom_calls). Bad input naming the dump to pass instead, before the signatures
    are compared: either would otherwise fail there, or as an unsupported op. The reference
    is neither: read as one, a before-partitioning module's sharding custom_calls made a bug
    report about the reference."""
    file = program.sharded_file
    problem: list[str] = []

    def visit(op):
        name = op.name
        if name in _AFTER_OPTIMIZATIONS:
            problem.append(_AFTER_OPTIMIZATIONS[name])
        elif name == "stablehlo.custom_call":
            target = _call_target(op)
            if target in _BEFORE_PARTITIONING or target.startswith("xla.sdy."):
                problem.append(f"the sharded program is a module before SPMD partitioning "
                               f"(custom_call @{target}): its shardings are requests to the "
                               "partitioner, not a sharded program; ")
            elif target.startswith(_LIBRARY_CALLS):
                problem.append(f"it calls the library kernel @{target}")
        return ir.WalkResult.INTERRUPT if problem else ir.WalkResult.ADVANCE

    for func in _reachable(program.ref_module, program.ref_func):
        func.walk(visit)
        if problem:
            kind = ("XLA's module after optimizations" if not problem[0].startswith("the ")
                    else "a module before SPMD partitioning")
            raise InputError(f"the reference is {kind}, not the unsharded program: pass "
                             "jax.jit(f).lower(*avals).as_text() of the function without "
                             "shardings (entangle_mlir.jax.reference_text(f, *avals))",
                             file=program.ref_file)
    for func in _reachable(program.sharded_module, program.sharded_func):
        func.walk(visit)
        if problem:
            what = problem[0]  # the op's location names the user's source: the file
            if not what.startswith("the sharded program"):
                what = (f"the sharded program is XLA's module after optimizations ({what}), "
                        "not the partitioner's output; ")
            raise InputError(what + PARTITIONED_GUIDANCE, file=file)


def check_recorded_shardings(program: Program) -> None:
    """A program that talks to other devices but records no sharding on any parameter is a
    per-device program stripped of the shardings that say which block each device holds
    (entangle reads every layout from them): bad input, before its local shapes are compared
    with the reference's global ones."""
    module, func = program.sharded_module, program.sharded_func
    if not func.regions[0].blocks[0].arguments or is_per_device(module, func):
        return
    what = sharded_marker(module, func)
    if not what.startswith(("a collective", "the device's id")):
        return
    raise InputError(f"the sharded program holds {what} but records no sharding on its "
                     "parameters, so which block each device holds is unknown; XLA's module "
                     "after SPMD partitioning keeps `sharding={...}` on every parameter: pass "
                     f"that dump as XLA wrote it (run with {PARTITIONED_DUMP})",
                     op_location(func, program.sharded_file), program.sharded_file)


def _check_shardings_present(program: Program) -> None:
    """Every parameter and result of a per-device program records its sharding: without one
    its layout is unknown and nothing about it can be proven. XLA's HLO text dump leaves the
    output sharding out unless asked to keep it; its proto dump always records it."""
    module, func = program.sharded_module, program.sharded_func
    count = len(ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).results)
    missing = [f"argument #{i}" for i, s in enumerate(parameter_shardings(module, func))
               if s is None]
    missing += [f"result #{i}" for i, s in enumerate(result_shardings(module, func, count))
                if s is None]
    if not missing:
        return
    if missing[0].startswith("result"):
        why = ("XLA's HLO text dump after SPMD partitioning prints the output sharding only "
               "with --xla_keep_shardings_after_spmd=true; add that flag to XLA_FLAGS, or pass "
               "the proto dump, which always records it")
    else:
        why = ("XLA's module after SPMD partitioning records every parameter's sharding: pass "
               "that dump as XLA wrote it")
    raise InputError(f"the per-device program records no sharding for {missing[0]}, so its "
                     f"layout is unknown: {why} (run with {PARTITIONED_DUMP})",
                     op_location(func, program.sharded_file), program.sharded_file)


def check_form(program: Program) -> None:
    """The sharded program is one entangle checks: a shard_map lowering (an
    `sdy.manual_computation` somewhere) or a per-device program after SPMD partitioning with
    every parameter's and result's sharding recorded. A module before partitioning whose
    parameters are sharded but still of the reference's global shapes, and a plain jax.jit
    whose shardings only request a layout (nothing sharded: it computes globally) are bad
    input, named with what to pass instead: "verified" on them would check nothing. XLA's
    other dumps are recognised earlier (`check_dump`)."""
    file = program.sharded_file
    manual = [False]

    def visit(op):
        if op.name == "sdy.manual_computation":
            manual[0] = True
        return ir.WalkResult.INTERRUPT if manual[0] else ir.WalkResult.ADVANCE

    for func in _reachable(program.sharded_module, program.sharded_func):
        func.walk(visit)
        if manual[0]:
            return
    if is_per_device(program.sharded_module, program.sharded_func):
        _check_partitioned_shapes(program)
        _check_shardings_present(program)
        return
    raise InputError("nothing sharded to check: the sharded program has no shard_map "
                     "(sdy.manual_computation) and is not a per-device program after SPMD "
                     "partitioning; a jax.jit with in_shardings/out_shardings lowered before "
                     "partitioning computes globally (its shardings only request a layout "
                     "from XLA); " + PARTITIONED_GUIDANCE,
                     op_location(program.sharded_func, file), file)


class SwappedPrograms(InputError):
    """The reference is the sharded program and the sharded one the reference: the arguments
    were given in the wrong order (`check_order`). `what` says what marks the first one
    sharded; the front-ends word the fix in their own terms (`entangle_mlir.jax.check`)."""

    def __init__(self, message: str, what: str, file: str | None = None):
        super().__init__(message, file=file)
        self.what = what


_DEVICE_OPS = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
               "stablehlo.all_to_all", "stablehlo.collective_permute",
               "stablehlo.collective_broadcast", "stablehlo.partition_id")
"""Ops only a sharded program holds: collectives and the device's own id."""


def sharded_marker(module: ir.Module, func: ir.Operation) -> str:
    """What makes `func` a sharded program, in words ("a shard_map (sdy.manual_computation)",
    "a collective (stablehlo.all_reduce)", "shardings on its parameters (a per-device
    program)"), or "" for an unsharded one."""
    found: list[str] = []

    def visit(op):
        if op.name == "sdy.manual_computation":
            found.append("a shard_map (sdy.manual_computation)")
        elif op.name == "stablehlo.partition_id":
            found.append("the device's id (stablehlo.partition_id)")
        elif op.name in _DEVICE_OPS:
            found.append(f"a collective ({op.name})")
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    for reachable in _reachable(module, func):
        reachable.walk(visit, ir.WalkOrder.PRE_ORDER)
        if found:
            return found[0]
    if is_per_device(module, func):
        return "shardings on its parameters (a per-device program)"
    return ""


def check_order(program: Program) -> None:
    """The reference is unsharded, the sharded program sharded: when the reference holds a
    shard_map, collectives or per-device shardings and the sharded program none of them, the
    two were given in the wrong order (`entangle check SHARDED REF`): bad input saying so,
    before the signatures (a per-device reference's local shapes) or the form are judged."""
    what = sharded_marker(program.ref_module, program.ref_func)
    if not what or sharded_marker(program.sharded_module, program.sharded_func):
        return
    if program.ref_module is program.sharded_module:
        ref, sharded = func_name(program.ref_func), func_name(program.sharded_func)
        raise SwappedPrograms(
            f"@{sharded} carries `entangle.refines = @{ref}`, but @{ref} is the sharded "
            f"program, it holds {what}, while @{sharded} has nothing sharded: put "
            f"`entangle.refines = @{sharded}` on @{ref} instead", what, program.sharded_file)
    raise SwappedPrograms(
        f"the programs are in the wrong order: {program.ref_file} is the sharded program, it "
        f"holds {what}, while {program.sharded_file} has nothing sharded; the order is "
        f"`entangle check REF SHARDED`, the reference first: `entangle check "
        f"{program.sharded_file} {program.ref_file}`", what)


def _call_target(op: ir.Operation) -> str:
    if "call_target_name" not in op.attributes:
        return ""
    return ir.StringAttr(op.attributes["call_target_name"]).value


def _reachable(module: ir.Module, func: ir.Operation) -> list[ir.Operation]:
    """`func` and every function it calls, directly or not (before calls are inlined)."""
    table = {func_name(f): f for f in functions(module)}
    found, pending, seen = [], [func], {func_name(func)}
    while pending:
        current = pending.pop()
        found.append(current)
        callees: list[str] = []

        def visit(op, callees=callees):
            if op.name == "func.call":
                callees.append(str(op.attributes["callee"]).lstrip("@").strip('"'))
            return ir.WalkResult.ADVANCE

        current.walk(visit)
        for name in callees:
            if name in table and name not in seen:
                seen.add(name)
                pending.append(table[name])
    return found


def _check_partitioned_shapes(program: Program) -> None:
    """A per-device program's parameters and results tiled `t` ways along a dim hold a `1/t`
    block of the reference's dim (padded up: a dim of size 1 stays 1); one still of the
    reference's size is a module before partitioning."""
    file = program.sharded_file

    def result_types(func):
        return list(ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).results)

    ref_args = [a.type for a in program.ref_func.regions[0].blocks[0].arguments]
    sh_args = [a.type for a in program.sharded_func.regions[0].blocks[0].arguments]
    ref_results, sh_results = result_types(program.ref_func), result_types(program.sharded_func)
    values = [("argument", ref_args, sh_args,
               parameter_shardings(program.sharded_module, program.sharded_func)),
              ("result", ref_results, sh_results,
               result_shardings(program.sharded_module, program.sharded_func, len(sh_results)))]
    for what, refs, shs, shardings in values:
        for i, (a, b, text) in enumerate(zip(refs, shs, shardings)):
            tiles = _tiles(text) if text else []
            full = list(ir.RankedTensorType(a).shape)
            local = list(ir.RankedTensorType(b).shape)
            if len(full) != len(local) or len(tiles) < len(full):
                continue
            if any(t > 1 and n == g > 1 for n, g, t in zip(local, full, tiles)):
                raise InputError(f"the sharded program is a module before SPMD partitioning: "
                                 f"{what} #{i} is sharded {text} but still has the reference's "
                                 f"global shape {_fmt(tensor_type(b))}; "
                                 + PARTITIONED_GUIDANCE,
                                 op_location(program.sharded_func, file), file)


def _tiles(text: str) -> list[int]:
    """The tile counts of an `mhlo.sharding` string ([] if it tiles nothing or is unreadable:
    unreadable shardings are reported by the walk)."""

    try:
        sharding = hlo_bindings().HloSharding.from_string(text)
        return list(sharding.tile_assignment_dimensions()) if sharding.is_tiled() else []
    except Exception:  # noqa: BLE001
        return []


def check_signatures(program: Program) -> None:
    """Same argument count, shapes and dtypes, same result count: else the input is unusable."""
    ref_args = list(program.ref_func.regions[0].blocks[0].arguments)
    sh_args = list(program.sharded_func.regions[0].blocks[0].arguments)
    where = op_location(program.sharded_func, program.sharded_file)
    if len(ref_args) != len(sh_args):
        raise InputError(f"the reference takes {len(ref_args)} arguments but the sharded "
                         f"function takes {len(sh_args)}", where, program.sharded_file)
    adopt_shardy_local(program.sharded_module, program.sharded_func, program.ref_func)
    check_recorded_shardings(program)
    local_shapes = is_per_device(program.sharded_module, program.sharded_func)
    for i, (a, b) in enumerate(zip(ref_args, sh_args)):
        ta = _arg_type(a, program, i, program.ref_file)
        tb = _arg_type(b, program, i, program.sharded_file)
        if local_shapes and ta.dtype == tb.dtype and len(ta.shape) == len(tb.shape) and all(
                g % size == 0 for g, size in zip(ta.shape, tb.shape) if size):
            continue
        if ta != tb:
            raise InputError(f"argument #{i} is {_fmt(ta)} in the reference but {_fmt(tb)} in "
                             "the sharded function", where, program.sharded_file)
    ref_results = ir.FunctionType(ir.TypeAttr(program.ref_func.attributes["function_type"]).value
                                  ).results
    sh_results = ir.FunctionType(
        ir.TypeAttr(program.sharded_func.attributes["function_type"]).value).results
    if len(ref_results) != len(sh_results):
        raise InputError(f"the reference returns {len(ref_results)} results but the sharded "
                         f"function returns {len(sh_results)}", where, program.sharded_file)
    for i, (a, b) in enumerate(zip(ref_results, sh_results)):
        ta = _type(a, program, f"result #{i}", program.ref_file)
        tb = _type(b, program, f"result #{i}", program.sharded_file)
        if local_shapes and ta.dtype == tb.dtype and len(ta.shape) == len(tb.shape):
            continue
        if ta != tb:
            raise InputError(f"result #{i} is {_fmt(ta)} in the reference but {_fmt(tb)} in "
                             "the sharded function", where, program.sharded_file)


def _arg_type(arg, program: Program, index: int, file: str):
    return _type(arg.type, program, f"argument #{index}", file)


def _type(t, program: Program, what: str, file: str):
    try:
        return tensor_type(t)
    except ValueError as err:
        raise InputError(f"{what}: {err} (only static shapes are supported)",
                         file=file) from None


def _fmt(t) -> str:
    return f"tensor<{'x'.join(map(str, t.shape))}{'x' if t.shape else ''}{t.dtype}>"



def adopted_shardy_text(local_text: str, ref_text: str) -> str:
    """Shardy's per-device program (`xla.shardy_partition`) with its shardings as
    `mhlo.sharding` strings, as `check_signatures` adopts it on the way in, e.g. to execute it
    with `jax.run_per_device`."""
    module, ref = parse_module(local_text), parse_module(ref_text)
    with context():
        if not adopt_shardy_local(module, public_main(module, "-"), public_main(ref, "-")):
            raise InputError("not Shardy's per-device form of the reference")
        return module.operation.get_asm(enable_debug_info=True)

def read_meshes(module: ir.Module) -> dict[str, Mesh]:
    meshes = {}
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            name = ir.StringAttr(op.attributes["sym_name"]).value
            meshes[name] = mesh_from_attr(op.attributes["mesh"])
    return meshes


def mesh_from_attr(attr) -> Mesh:
    mesh = sdy.MeshAttr(attr)
    return Mesh(tuple((sdy.MeshAxisAttr(a).name, sdy.MeshAxisAttr(a).size) for a in mesh.axes))


def inline_calls(module: ir.Module, file: str) -> int:
    """Inline every func.call (jax helpers such as `_where`, `tril`).

    Functions are flattened callees first (post-order over the call graph), so each body is
    inlined once and the cost is linear in the program, however deep the calls nest.
    """
    table = {func_name(f): f for f in functions(module)}
    calls_in: dict[str, list[ir.Operation]] = {}
    with context():
        for name, func in table.items():
            found: list[ir.Operation] = []

            def collect(op, found=found):
                if op.name == "func.call":
                    found.append(op)
                return ir.WalkResult.ADVANCE

            func.walk(collect)
            calls_in[name] = found
        order = _callees_first(table, calls_in, file)
        count = 0
        for name in order:
            for call in calls_in[name]:
                callee = table[_callee(call)]
                new = inlined_func_call(callee, list(call.operands), call)
                for old, value in zip(call.results, new):
                    old.replace_all_uses_with(value)
                call.erase()
                count += 1
    return count


def _callee(call: ir.Operation) -> str:
    return str(call.attributes["callee"]).lstrip("@").strip('"')


def _callees_first(table: dict, calls_in: dict, file: str) -> list[str]:
    """Function names, every callee before its callers; unknown callees and recursion are
    bad input."""
    order: list[str] = []
    state: dict[str, int] = {}
    for root in table:
        stack = [(root, iter(calls_in[root]))]
        if state.get(root):
            continue
        state[root] = 1
        while stack:
            name, pending = stack[-1]
            call = next(pending, None)
            if call is None:
                state[name] = 2
                order.append(name)
                stack.pop()
                continue
            target = _callee(call)
            if target not in table:
                raise InputError(f"call to unknown function @{target}", op_location(call, file))
            if state.get(target) == 1:
                raise InputError(f"recursive call to @{target} cannot be inlined",
                                 op_location(call, file))
            if not state.get(target):
                state[target] = 1
                stack.append((target, iter(calls_in[target])))
    return order
