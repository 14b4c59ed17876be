"""What the ops that combine devices compute: collectives over process groups.

`COLLECTIVE_SEMANTICS[name](info, mesh, per_device_operands) -> per_device_results` holds the
ops whose result on one device depends on other devices (all_reduce, all_gather,
reduce_scatter, all_to_all, collective_permute) and the ops that read the device's id
(partition_id, replica_id). Which devices a collective combines is `groups.py` (the process
groups of the StableHLO spec); what one device computes alone is `ops.py`, and `run_op` runs
an op of either table.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from entangle_mlir.core.mesh import Mesh
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.semantics.element import SemanticsError, combine, dtype_kind
from entangle_mlir.semantics.groups import GroupError, permute_pairs, process_groups
from entangle_mlir.semantics.ops import OP_SEMANTICS, WRAPPED_OPS, result_shape
from entangle_mlir.semantics.tensor import Array, concatenate, full, obj_array, wrap_array

CollectiveFn = Callable[[OpInfo, Mesh, list[list[Array]]], list[list[Array]]]


# ----- collectives ----------------------------------------------------------------------------

def replica_groups(info: OpInfo, mesh: Mesh) -> list[list[int]]:
    """The groups of device ids a collective combines, as StableHLO defines them from its
    channel, use_global_device_ids and replica_groups (`groups.process_groups`)."""
    try:
        return process_groups(info.name, info.attrs, mesh.replicas, mesh.partitions)
    except GroupError as err:
        raise SemanticsError(str(err)) from None


def _group_of(groups: list[list[int]]) -> dict[int, list[int]]:
    return {d: g for g in groups for d in g}


def _all_reduce(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    kind = dtype_kind(info.attrs.get("reducer", "add"), info.result_types[0].dtype)
    results: list[list[Array]] = []
    for d in range(n):
        members = groups[d]
        per_operand = []
        for k in range(len(operands[d])):
            arrays = [obj_array(operands[m][k]) for m in members]
            out = np.empty(arrays[0].shape, dtype=object)
            for idx in np.ndindex(out.shape):
                out[idx] = combine(kind, [a[idx] for a in arrays])
            per_operand.append(out)
        results.append(per_operand)
    return results


def _all_gather(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    dim = info.attrs["all_gather_dim"]
    return [[concatenate([operands[m][k] for m in groups[d]], dim)
             for k in range(len(operands[d]))] for d in range(n)]


def _reduce_scatter(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                    ) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    summed = _all_reduce(info, mesh, operands)
    dim = info.attrs["scatter_dimension"]
    results = []
    for d in range(n):
        members = groups[d]
        position = members.index(d)
        per_operand = []
        for array in summed[d]:
            if array.shape[dim] % len(members):
                raise SemanticsError("reduce_scatter: dim not divisible by the group size")
            part = array.shape[dim] // len(members)
            index = [slice(None)] * array.ndim
            index[dim] = slice(position * part, (position + 1) * part)
            per_operand.append(array[tuple(index)].copy())
        results.append(per_operand)
    return results


def _all_to_all(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    """Device j of a group sends the i-th split block to device i, which concatenates the
    blocks it receives in group order."""
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    split, concat = info.attrs["split_dimension"], info.attrs["concat_dimension"]
    count = info.attrs.get("split_count")
    results = []
    for d in range(n):
        members = groups[d]
        if count is not None and count != len(members):
            raise SemanticsError("all_to_all: split_count differs from the group size")
        position = members.index(d)
        per_operand = []
        for k in range(len(operands[d])):
            blocks = []
            for m in members:
                array = obj_array(operands[m][k])
                part = array.shape[split] // len(members)
                index = [slice(None)] * array.ndim
                index[split] = slice(position * part, (position + 1) * part)
                blocks.append(array[tuple(index)])
            per_operand.append(concatenate(blocks, concat))
        results.append(per_operand)
    return results


def _collective_permute(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                        ) -> list[list[Array]]:
    """result[target] = operand[source]; devices nobody sends to get zeros."""
    n = mesh.num_devices
    try:
        source_of = {t: s for s, t in permute_pairs(info.attrs, mesh.replicas,
                                                    mesh.partitions)}
    except GroupError as err:
        raise SemanticsError(str(err)) from None
    results = []
    for d in range(n):
        if d in source_of:
            results.append([obj_array(x).copy() for x in operands[source_of[d]]])
        else:
            results.append([full(obj_array(x).shape, 0) for x in operands[d]])
    return results


def _partition_id(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    shape = result_shape(info) if info.result_types else ()
    return [[full(shape, d)] for d in range(mesh.num_devices)]


def _wrapped_collective(fn: CollectiveFn) -> CollectiveFn:
    def collective(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                   ) -> list[list[Array]]:
        per_device = fn(info, mesh, operands)
        return [[wrap_array(r, t.dtype) for r, t in zip(rs, info.result_types)]
                + rs[len(info.result_types):] for rs in per_device]

    collective.__doc__ = fn.__doc__
    return collective


COLLECTIVE_SEMANTICS: dict[str, CollectiveFn] = {
    "stablehlo.all_reduce": _all_reduce,
    "stablehlo.all_gather": _all_gather,
    "stablehlo.reduce_scatter": _reduce_scatter,
    "stablehlo.all_to_all": _all_to_all,
    "stablehlo.collective_permute": _collective_permute,
    "stablehlo.partition_id": _partition_id,
    "stablehlo.replica_id": _partition_id,
}
"""Cross-device semantics: `fn(info, mesh, operands per device) -> results per device`."""
COLLECTIVE_SEMANTICS.update({name: _wrapped_collective(COLLECTIVE_SEMANTICS[name])
                             for name in WRAPPED_OPS if name in COLLECTIVE_SEMANTICS})


def run_op(info: OpInfo, operands: list[list[Array]], mesh: Mesh | None) -> list[list[Array]]:
    """Results per device (one "device" when `mesh` is None) of any op in either table."""
    if info.name in COLLECTIVE_SEMANTICS:
        if mesh is None:
            raise SemanticsError(f"{info.name} needs a mesh")
        return COLLECTIVE_SEMANTICS[info.name](info, mesh, operands)
    fn = OP_SEMANTICS.get(info.name)
    if fn is None:
        raise SemanticsError(f"no semantics for op {info.name}")
    return [fn(info, ops) for ops in operands]
