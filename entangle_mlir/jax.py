"""JAX front-end: lower a reference function and a sharded one, and check them.

    from entangle_mlir.jax import check, assert_refines
    report = check(reference_fn, sharded_fn, *avals)   # avals: jax.ShapeDtypeStruct with
                                                        # NamedSharding where the program is
                                                        # sharded
    assert report.proven, report.render_text()

`sharded_fn` is a `jax.shard_map` function (jitted or not). The reference is lowered at the same
global shapes without shardings. Importing this module imports jax; nothing else in entangle does.
"""

from __future__ import annotations

import glob
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.confirm import confirm_texts
from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.report import Report
from entangle_mlir.driver import check_texts
from entangle_mlir.evidence import (
    Unavailable,
    as_replicas,
    device_blocks,
    execute_replicas,
    local_block,
    op_evidence,
    output_evidence,
    program_evidence,
    sum_precision,
)
from entangle_mlir.mlir.compat import plain_replica_groups_options
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.per_device import (
    axis_names,
    parameter_shardings,
    program_device_count,
    result_shardings,
)
from entangle_mlir.mlir.program import (
    SwappedPrograms,
    from_two_modules,
    public_main,
    sharded_marker,
)
from entangle_mlir.mlir.xla import module_proto, module_proto_to_stablehlo


def _exclude_own_frames() -> None:
    """Source locations name the user's frames, not entangle's (the lowering happens here)."""
    try:
        from jax._src import (
            source_info_util,  # lazy: private jax API, may be missing from another jax
        )

        source_info_util.register_exclusion(str(Path(__file__).resolve().parent))
    except (ImportError, AttributeError):
        pass


_exclude_own_frames()


def _plain(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def lower_pair(reference_fn: Callable, sharded_fn: Callable, *avals) -> tuple[str, str]:
    """The reference and sharded programs as StableHLO text, with source locations."""
    reference = reference_fn if hasattr(reference_fn, "lower") else jax.jit(reference_fn)
    sharded = sharded_fn if hasattr(sharded_fn, "lower") else jax.jit(sharded_fn)
    plain = [jax.tree.map(_plain, a) for a in avals]   # avals may be pytrees (params dicts)
    ref_text = reference.lower(*plain).as_text(debug_info=True)
    sharded_text = sharded.lower(*avals).as_text(debug_info=True)
    return ref_text, sharded_text


def lower_entry(entry: Callable, mesh_axes: dict[str, int]) -> tuple[str, str]:
    """A jax entry point of `entangle check-many` lowered (`lower_pair`): `entry(mesh)`, on a
    mesh of `mesh_axes` (axis name -> size, major first), gives `(reference_fn, sharded_fn,
    avals)`. A mesh larger than the devices jax has is an `InputError`."""
    size = math.prod(mesh_axes.values())
    if size > len(jax.devices()):
        raise InputError(f"a mesh of {size} devices, but jax has {len(jax.devices())} (set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={size} before jax "
                         "is imported)")
    mesh = jax.make_mesh(tuple(mesh_axes.values()), tuple(mesh_axes),
                         devices=jax.devices()[:size])
    reference_fn, sharded_fn, avals = entry(mesh)
    return lower_pair(reference_fn, sharded_fn, *avals)


def check(reference_fn: Callable, sharded_fn: Callable, *avals,
          verify_rules: bool = True, evidence: bool = True, confirm: bool = True,
          assume_no_overflow: bool = False, jobs: int | None = None) -> Report:
    """Prove that `sharded_fn` refines `reference_fn` on arguments shaped like `avals`.

    When not proven, a bug claim of the layout tier is made only if running both programs on
    random inputs confirms it (`confirm.py`; `confirm=False` keeps the raw claims), and
    `evidence` compares the outputs and the diverging op on one random input. The two
    functions given in the wrong order raise `InputError` saying so (as any input that cannot
    be used: `entangle check` exits 2 on it).
    `assume_no_overflow`: take sums and products of finite values as finite (`entangle check
    --assume-no-overflow`; listed among the assumptions where a proof relies on it).
    `jobs`: worker processes for the Z3 rule-instance checks (`entangle check --jobs`; None:
    one per free core, 1: serial)."""
    try:
        ref_text, sharded_text = lower_pair(reference_fn, sharded_fn, *avals)
    except Exception:
        # A shard_map given as the reference fails to lower without shardings (jax's
        # ValueError about in_specs): say that the two are swapped, when they are.
        what = _swapped(reference_fn, sharded_fn, avals)
        if what:
            raise InputError(_swapped_message(reference_fn, sharded_fn, what)) from None
        raise
    name = getattr(reference_fn, "__name__", "reference")
    ref_file = f"<{name}: reference>"
    sharded_file = f"<{getattr(sharded_fn, '__name__', 'sharded')}>"
    try:
        report = check_texts(ref_text, sharded_text, ref_file=ref_file,
                             sharded_file=sharded_file, verify_rules=verify_rules,
                             assume_no_overflow=assume_no_overflow, jobs=jobs)
    except SwappedPrograms as err:
        raise InputError(_swapped_message(reference_fn, sharded_fn, err.what)) from None
    if not report.proven and confirm:
        confirm_texts(report, ref_text, sharded_text, ref_file=ref_file,
                      sharded_file=sharded_file)
    if not report.proven and evidence:
        precision = sum_precision(parse_module(ref_text))
        report.evidence.update(output_evidence(reference_fn, sharded_fn, avals,
                                               precision=precision))
        if "at_op" not in report.evidence:
            report.evidence["at_op"] = op_evidence(report.focus)
    return report


def _swapped(reference_fn: Callable, sharded_fn: Callable, avals) -> str:
    """What marks `reference_fn` as the sharded program when the two functions were passed
    in the wrong order (it lowers, with the avals' shardings, to a sharded program and
    `sharded_fn`, without them, to an unsharded one), else ""."""
    try:
        ref_text, sharded_text = lower_pair(sharded_fn, reference_fn, *avals)
        program = from_two_modules(parse_module(ref_text), parse_module(sharded_text),
                                   "reference", "sharded")
        with context():
            if sharded_marker(program.ref_module, program.ref_func):
                return ""
            return sharded_marker(program.sharded_module, program.sharded_func)
    except Exception:  # noqa: BLE001 - only a better message; else jax's own error stands
        return ""


def _swapped_message(reference_fn: Callable, sharded_fn: Callable, what: str) -> str:
    first = getattr(reference_fn, "__name__", "the first function")
    second = getattr(sharded_fn, "__name__", "the second function")
    return (f"the functions are in the wrong order: the first one ({first}) is the sharded "
            f"program, it holds {what}, while the second ({second}) has nothing sharded; "
            "the order is check(reference_fn, sharded_fn, *avals), the reference first")


def assert_refines(reference_fn: Callable, sharded_fn: Callable, *avals,
                   verify_rules: bool = True, confirm: bool = True) -> Report:
    """For users' test suites: raise AssertionError if not proven, the first diagnostic its
    first line (the pytest plugin's `entangle_check` fixture fails the test the same way)."""
    __tracebackhide__ = True
    report = check(reference_fn, sharded_fn, *avals, verify_rules=verify_rules,
                   confirm=confirm)
    if not report.proven:
        raise AssertionError(report.render_failure())
    return report


# ----- XLA's SPMD partitioner (jit with shardings) ----------------------------------------------

_PARTITIONER_DUMP_OPTIONS = {
    "xla_dump_hlo_pass_re": "spmd-partitioning",
    "xla_dump_hlo_as_proto": True,
    **plain_replica_groups_options(),
}


def _unwrap(f: Callable) -> Callable:
    """The Python function under a `jax.jit` wrapper (the reference must carry no shardings)."""
    return getattr(f, "__wrapped__", f) if hasattr(f, "lower") else f


def partitioned_hlo(f: Callable, *avals, out_shardings=None, in_shardings=None) -> bytes:
    """XLA's per-device program for `f` after SPMD partitioning and before fusion, as a
    serialized HloModuleProto.

    `f` is jitted with `in_shardings` / `out_shardings` when given (else the shardings of the
    avals and XLA's choice for the outputs); an already jitted `f` is compiled as it is.
    """
    if hasattr(f, "lower") and in_shardings is None and out_shardings is None:
        jitted = f
    else:
        kwargs = {}
        if in_shardings is not None:
            kwargs["in_shardings"] = in_shardings
        if out_shardings is not None:
            kwargs["out_shardings"] = out_shardings
        jitted = jax.jit(_unwrap(f), **kwargs)
    with tempfile.TemporaryDirectory(prefix="entangle-xla-") as directory:
        # A fresh dump directory is part of the compile options, so jax's compilation cache
        # never hides the dump of a function compiled before.
        options = {"xla_dump_to": directory, **_PARTITIONER_DUMP_OPTIONS}
        jitted.lower(*avals).compile(compiler_options=options)
        found = sorted(glob.glob(os.path.join(directory, "*after_spmd-partitioning*.hlo.pb")))
        if not found:
            raise RuntimeError("XLA wrote no after-spmd-partitioning dump (is the program "
                               "partitioned? meshes need axis_types=(AxisType.Auto, ...))")
        with open(found[-1], "rb") as handle:
            return module_proto(handle.read())


def reference_text(f: Callable, *avals) -> str:
    """The unsharded reference: `f` lowered at the avals' global shapes without shardings."""
    return jax.jit(_unwrap(f)).lower(*[_plain(a) for a in avals]).as_text(debug_info=True)


def lower_partitioned(f: Callable, *avals, out_shardings=None, in_shardings=None
                      ) -> tuple[str, bytes]:
    """(reference StableHLO text, XLA's partitioned per-device program as StableHLO bytecode)."""
    proto = partitioned_hlo(f, *avals, out_shardings=out_shardings, in_shardings=in_shardings)
    return reference_text(f, *avals), module_proto_to_stablehlo(proto)


def check_partitioned(f: Callable, *avals, out_shardings=None, in_shardings=None,
                      verify_rules: bool = True, evidence: bool = True,
                      confirm: bool = True) -> Report:
    """Prove that XLA's SPMD partitioning of `f` refines `f` itself.

    `avals` are `jax.ShapeDtypeStruct`s, with a `NamedSharding` on a mesh of `AxisType.Auto`
    axes where an argument is sharded; `out_shardings` is passed to `jax.jit`. The reference is
    `f` lowered without shardings (sharding constraints inside `f` are identities there); the
    sharded program is XLA's after-spmd-partitioning module, before fusion. Bug claims are
    confirmed by running both programs, as in `check` (`confirm=False`: the raw claims).
    """
    ref_text, sharded = lower_partitioned(f, *avals, out_shardings=out_shardings,
                                          in_shardings=in_shardings)
    name = getattr(_unwrap(f), "__name__", "f")
    ref_file, sharded_file = f"<{name}: reference>", f"<{name}: partitioned by XLA>"
    report = check_texts(ref_text, sharded, ref_file=ref_file, sharded_file=sharded_file,
                         verify_rules=verify_rules)
    note = _mesh_note(report.mesh, avals)
    if note:
        report.notes.append(note)
    if not report.proven and confirm:
        confirm_texts(report, ref_text, sharded, ref_file=ref_file, sharded_file=sharded_file)
    if not report.proven and evidence:
        report.evidence.update(program_evidence(
            from_two_modules(parse_module(ref_text, ref_file), parse_module(sharded, sharded_file),
                             ref_file, sharded_file), report.index_ranges))
        if "at_op" not in report.evidence:
            report.evidence["at_op"] = op_evidence(report.focus)
    return report


def _mesh_note(described: str, avals) -> str:
    """'the program's devices as the jax mesh: 'd0' = 'dp', ('d1', 'd2') = 'tp'' when the
    synthesized axes line up with the avals' mesh (devices in id order)."""
    meshes = {getattr(getattr(a, "sharding", None), "mesh", None) for a in avals} - {None}
    if len(meshes) != 1 or not described:
        return ""
    mesh = meshes.pop()
    ids = np.asarray(getattr(mesh, "device_ids", []))
    if ids.size == 0 or not np.array_equal(ids.reshape(-1), np.arange(ids.size)):
        return ""
    try:
        synthesized = Mesh(tuple((name, int(size)) for name, size in
                                 (part.split("=") for part in described.split(" x "))))
    except ValueError:
        return ""
    names = axis_names(synthesized, tuple(mesh.shape.values()), tuple(mesh.axis_names))
    if not names:
        return ""

    def axes(run):
        return f"'{run[0]}'" if len(run) == 1 else "(" + ", ".join(f"'{a}'" for a in run) + ")"

    return ("the program's mesh axes as jax's: "
            + ", ".join(f"{axes(run)} = '{name}'" for name, run in names.items()))


def assert_partitioned_refines(f: Callable, *avals, out_shardings=None, in_shardings=None,
                               verify_rules: bool = True, confirm: bool = True) -> Report:
    """`check_partitioned` for users' test suites: AssertionError with the diagnostic."""
    __tracebackhide__ = True
    report = check_partitioned(f, *avals, out_shardings=out_shardings,
                               in_shardings=in_shardings, verify_rules=verify_rules,
                               confirm=confirm)
    if not report.proven:
        raise AssertionError(report.render_failure())
    return report


# ----- executing a per-device program (differential tests of partitioned programs) ---------------

def run_per_device(module, *global_args):
    """Run a per-device SPMD program (XLA partitioner output, as StableHLO text, bytecode or an
    `ir.Module`) on simulated devices and return each device's results.

    The program runs as N *replicas* (`partition_id` becomes `replica_id`, the module is compiled
    with `num_replicas=N`, no SPMD partitioning), each fed its block of the global arguments as
    the parameters' `mhlo.sharding` says. Needs N jax devices (on CPU:
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` before jax is imported).
    Returns `outputs[device][result]` as numpy arrays.
    """
    if isinstance(module, (str, bytes)):
        module = parse_module(module)
    with context():
        module = parse_module(str(module))   # a copy: the caller's module stays as it is
        main = public_main(module, "-")
        shardings = parameter_shardings(module, main)
        n = program_device_count(module, main)
        arg_types = [a.type for a in main.regions[0].blocks[0].arguments]
        text = as_replicas(module, n)
    per_device_args: list[list] = [[] for _ in range(n)]
    for arg, sharding, arg_type in zip(global_args, shardings, arg_types):
        arg = np.asarray(arg)
        local = tuple(arg_type.shape)
        blocks = device_blocks(sharding, arg.shape, local, n)
        for d in range(n):
            per_device_args[d].append(local_block(arg, blocks[d], local))
    try:
        return execute_replicas(text, per_device_args)
    except Unavailable as err:
        raise RuntimeError(str(err)) from None


def expected_per_device(module, reference_outputs):
    """Each device's block of the reference outputs, as the program's result shardings say
    (the value every device should return; padding of uneven shards is left out)."""
    if isinstance(module, (str, bytes)):
        module = parse_module(module)
    with context():
        main = public_main(module, "-")
        n = program_device_count(module, main)
        types = ir_result_types(main)
        texts = result_shardings(module, main, len(types))
    out = []
    for d in range(n):
        row = []
        for value, text, local in zip(reference_outputs, texts, types):
            value = np.asarray(value)
            blocks = device_blocks(text, value.shape, local, n)
            row.append(value[blocks[d]])
        out.append(row)
    return out


def ir_result_types(func) -> list[tuple[int, ...]]:
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    return [tuple(ir.RankedTensorType(t).shape) for t in ftype.results]
