"""The pair of functions to compare, found in one module or linked from two, plus the mesh.

A combined module holds both functions; the sharded one carries `entangle.refines = @ref`.
`entangle check REF SHARDED` uses the public `main` of each file.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import sdy

from .diagnostics import InputError
from .ir import context, op_location
from .mesh import Mesh
from .opinfo import tensor_type


@dataclass
class Program:
    """Reference and sharded functions (possibly in different modules) and their files."""

    ref_module: ir.Module
    sharded_module: ir.Module
    ref_func: ir.Operation
    sharded_func: ir.Operation
    ref_file: str
    sharded_file: str


def functions(module: ir.Module) -> list[ir.Operation]:
    return [op.operation for op in module.body.operations if op.operation.name == "func.func"]


def func_name(func: ir.Operation) -> str:
    return ir.StringAttr(func.attributes["sym_name"]).value


def find_function(module: ir.Module, name: str) -> ir.Operation | None:
    return next((f for f in functions(module) if func_name(f) == name), None)


def _public_main(module: ir.Module, file: str) -> ir.Operation:
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
    return Program(ref, sharded, _public_main(ref, ref_file), _public_main(sharded, sharded_file),
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


def check_signatures(program: Program) -> None:
    """Same argument count, shapes and dtypes, same result count: else the input is unusable."""
    ref_args = list(program.ref_func.regions[0].blocks[0].arguments)
    sh_args = list(program.sharded_func.regions[0].blocks[0].arguments)
    where = op_location(program.sharded_func, program.sharded_file)
    if len(ref_args) != len(sh_args):
        raise InputError(f"the reference takes {len(ref_args)} arguments but the sharded "
                         f"function takes {len(sh_args)}", where, program.sharded_file)
    from .per_device import adopt_shardy_local, is_per_device

    adopt_shardy_local(program.sharded_module, program.sharded_func, program.ref_func)
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
                with ir.InsertionPoint(call), call.location:
                    new = _jax_mlir_ext.inlined_func_call(callee, list(call.operands))
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
