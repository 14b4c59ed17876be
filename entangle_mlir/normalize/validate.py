"""Programs XLA would reject are bad input (exit 2, one message at the op), checked before any
rewrite reads them: a compare whose `compare_type` does not fit its element type (XLA's HLO
verifier), and collectives whose groups or pairs are not what StableHLO allows
(`groups.py`: ids repeated or out of range, groups not covering every id, use_global_device_ids
without a channel, a collective_permute target outside the devices).

The process grid is `mhlo.num_replicas x mhlo.num_partitions`; a module without
`mhlo.num_partitions` runs on its one `sdy.mesh` (one replica). A program on several replicas
*and* several partitions is refused: the walk reads device ids as one flat list.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.mlir.opinfo import (
    allowed_compare_types,
    compare_type,
    describe,
    op_location,
    tensor_type,
)
from entangle_mlir.mlir.program import read_meshes
from entangle_mlir.semantics.groups import (
    GROUPED,
    GroupError,
    permute_pairs,
    process_groups,
    strategy,
)


def grid(module: ir.Module) -> tuple[int, int | None]:
    """(replicas, partitions) of a module; partitions None when nothing says."""
    attrs = module.operation.attributes
    counts = {name: ir.IntegerAttr(attrs[name]).value
              for name in ("mhlo.num_replicas", "mhlo.num_partitions") if name in attrs}
    replicas = counts.get("mhlo.num_replicas", 1)
    partitions = counts.get("mhlo.num_partitions")
    if partitions is None:
        meshes = {m.num_devices for m in read_meshes(module).values()}
        partitions = meshes.pop() if len(meshes) == 1 else None
    return replicas, partitions


def validate_module(module: ir.Module, file: str) -> None:
    """Raise `InputError` at the first op XLA would reject (see the module docstring)."""
    replicas, partitions = grid(module)
    compares, has_collectives = [], []

    def visit(op):  # (an exception raised inside a walk would surface as a RuntimeError)
        op = op.operation
        name = op.name
        if name == "stablehlo.compare":
            compares.append(op)
        elif name in GROUPED:
            has_collectives.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in compares:
        _check_compare(op, file)
    if not has_collectives:
        return
    if replicas > 1 and partitions is not None and partitions > 1:
        raise InputError(f"the program runs on {replicas} replicas x {partitions} partitions: "
                         "only one replica or one partition is supported",
                         op_location(has_collectives[0], file), file)
    for op in has_collectives:
        _check_collective(op, replicas, partitions, file)


def _check_compare(op: ir.Operation, file: str) -> None:
    dtype = tensor_type(op.operands[0].type).dtype
    kind = compare_type(op)
    allowed = allowed_compare_types(dtype)
    if kind not in allowed:
        raise InputError(f"compare with compare_type {kind} on {dtype} operands: XLA requires "
                         f"{' or '.join(allowed)}", op_location(op, file), file)


def _check_collective(op: ir.Operation, replicas: int, partitions: int | None,
                      file: str) -> None:
    info = describe(op, file)
    try:
        if partitions is None:
            strategy(info.name, info.attrs)
        elif info.name == "stablehlo.collective_permute":
            permute_pairs(info.attrs, replicas, partitions)
        else:
            process_groups(info.name, info.attrs, replicas, partitions)
    except GroupError as err:
        raise InputError(f"{err} (on {replicas} replica{'s' if replicas > 1 else ''} x "
                         f"{partitions} partitions)", info.loc, file) from None
