"""Two shard_maps that pass device-local values from one to the other are one shard_map.

`jax.grad` of a shard_map'd function lowers to two manual computations: the forward returns
its residuals (the values the backward needs: a one-hot, a mask, an activation), each split
over every manual axis along dim 0 so that the global result holds every device's local
value, and the backward reads them back with the same specs. Device d's block of such a
result is exactly the value device d returned, so reading it back gives each device its own
value again (`analysis/infer.py` `_read_back` relies on the same fact while walking).

Here the two computations are merged into one at the IR level: the backward's body follows
the forward's, its residual arguments replaced by the values the forward returned, its other
operands passed in with their specs. The rewrites that read a value's producer (a one-hot
whose pick's gradient is a scatter, `one_hot.py`; the online softmax's backward,
`online_backward.py`) then see the whole computation, as in a gradient taken inside the
shard_map.

Exact when, for every value passed: the producer's out_spec and the consumer's in_spec are
the same sharding, that sharding splits over every manual axis (so no two devices share a
block of the global result), and every axis of the mesh with more than one device is manual
(no automatic axis: the global value would then be assembled by the partitioner). Both
computations must be in one block, the consumer's other operands defined before the producer
(or constants, which are moved up).
"""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from entangle_mlir.mlir.ir import op_key, ops_in_order
from entangle_mlir.mlir.program import read_meshes
from entangle_mlir.normalize.match import defining_op

MANUAL = "sdy.manual_computation"


def merge_manual_computations(module: ir.Module) -> bool:
    """Merge every pair of manual computations that passes device-local values (see the module
    docstring), repeatedly; whether anything changed."""
    meshes = read_meshes(module)
    changed = False
    while True:
        found = _mergeable(module, meshes)
        if found is None:
            return changed
        _merge(*found)
        changed = True


def _mergeable(module: ir.Module, meshes) -> tuple | None:
    """The first (producer, consumer, {consumer operand index: producer result index}) that
    may be merged, or None."""
    for name, consumer in ops_in_order(module):
        if name != MANUAL:
            continue
        producers = [op for op in map(defining_op, consumer.operands)
                     if op is not None and op.name == MANUAL]
        for producer in {id(op): op for op in producers}.values():
            passed = _passed(producer, consumer, meshes)
            if passed is not None:
                return producer, consumer, passed
    return None


def _passed(producer: ir.Operation, consumer: ir.Operation, meshes) -> dict[int, int] | None:
    """Which of the consumer's operands are the producer's results, each read back as the
    devices' own values; None when the two may not be merged."""
    if producer.block != consumer.block:
        return None
    manual = _manual_axes(producer)
    if manual != _manual_axes(consumer):
        return None
    outs = _shardings(producer, "out_shardings")
    ins = _shardings(consumer, "in_shardings")
    passed: dict[int, int] = {}
    for k, operand in enumerate(consumer.operands):
        owner = defining_op(operand)
        if owner is not None and owner == producer:
            index = ir.OpResult(operand).result_number
            if str(outs[index]) != str(ins[k]):
                return None
            if not _splits_every_device(outs[index], manual, meshes) and not _same_everywhere(
                    _returned(producer)[index], outs[index], manual, meshes):
                return None
            passed[k] = index
    extras = [v for k, v in enumerate(consumer.operands) if k not in passed]
    if not passed or _hoisted(extras, producer) is None:
        return None
    return passed


def _hoisted(values: list, producer: ir.Operation) -> list[ir.Operation] | None:
    """The ops after `producer` in its block that compute `values` (a constant broadcast to
    the cotangent's shape, between the two computations), in block order, to move before it;
    None when one of them reads the producer's results (the values then cannot be the merged
    computation's operands)."""
    found: dict[int, ir.Operation] = {}
    stack = list(values)
    while stack:
        op = defining_op(stack.pop())
        if op is None or op_key(op) in found or not _after(op, producer):
            continue
        if op == producer:
            return None
        found[op_key(op)] = op
        stack.extend(op.operands)
    order = {op_key(op): k for k, op in enumerate(producer.block.operations)}
    return sorted(found.values(), key=lambda op: order[op_key(op)])


def _after(op: ir.Operation, anchor: ir.Operation) -> bool:
    """Whether `op` comes after `anchor` in `anchor`'s block (False: before it, or elsewhere)."""
    if op.block != anchor.block:
        return False
    for other in anchor.block.operations:
        if other == anchor:
            return True
        if other == op:
            return False
    return False


def _manual_axes(op: ir.Operation) -> tuple[str, ...]:
    return tuple(str(a).strip('"') for a in sdy.ManualAxesAttr(op.attributes["manual_axes"]))


def _shardings(op: ir.Operation, name: str) -> list:
    return list(sdy.TensorShardingPerValueAttr(op.attributes[name]).shardings)


def _splits_every_device(sharding, manual: tuple[str, ...], meshes) -> bool:
    """Whether `sharding` gives every device its own block: it splits over every manual axis,
    and every axis of its mesh with more than one device is manual."""
    tensor = sdy.TensorShardingAttr(sharding)
    mesh = _mesh(sharding, meshes)
    if mesh is None:
        return False
    split = set()
    for dim in tensor.dimension_shardings:
        for ref in sdy.DimensionShardingAttr(dim).axes:
            name = sdy.AxisRefAttr(ref).name
            if sdy.AxisRefAttr(ref).sub_axis_info is not None:
                return False
            split.add(name)
    busy = {name for name in mesh.names if mesh.size(name) > 1}
    return busy <= set(manual) and busy <= split


def _same_everywhere(value, sharding, manual: tuple[str, ...], meshes) -> bool:
    """Whether `value` (returned by a manual computation over every busy axis of the
    sharding's mesh) is the same on every device: the result of an all_reduce whose one group
    holds every device (a psum or pmax over the whole mesh), or a constant."""
    mesh = _mesh(sharding, meshes)
    if mesh is None or not {n for n in mesh.names if mesh.size(n) > 1} <= set(manual):
        return False
    op = defining_op(value)
    if op is None:
        return False
    if op.name == "stablehlo.constant":
        return True
    if op.name != "stablehlo.all_reduce" or "replica_groups" not in op.attributes:
        return False
    groups = ir.DenseIntElementsAttr(op.attributes["replica_groups"])
    shape = ir.ShapedType(groups.type).shape
    return len(shape) == 2 and shape[0] == 1 and shape[1] == mesh.num_devices


def _mesh(sharding, meshes):
    mesh_ref = str(sdy.TensorShardingAttr(sharding).mesh_or_ref)
    return meshes.get(mesh_ref[1:].strip('"')) if mesh_ref.startswith("@") else None


def _returned(op: ir.Operation) -> list:
    return list(_terminator(op.regions[0].blocks[0]).operands)


def _merge(producer: ir.Operation, consumer: ir.Operation, passed: dict[int, int]) -> None:
    """One manual computation in the producer's place: its operands and body, then the
    consumer's; its results those of the producer still used elsewhere, then the consumer's."""
    extras = [k for k in range(len(consumer.operands)) if k not in passed]
    for op in _hoisted([consumer.operands[k] for k in extras], producer) or []:
        op.move_before(producer)
    kept = [j for j, result in enumerate(producer.results)
            if any(_user(use) != consumer for use in result.uses)]
    ins = _shardings(producer, "in_shardings") + [
        _shardings(consumer, "in_shardings")[k] for k in extras]
    outs = [_shardings(producer, "out_shardings")[j] for j in kept] + _shardings(
        consumer, "out_shardings")
    first, second = producer.regions[0].blocks[0], consumer.regions[0].blocks[0]
    with ir.InsertionPoint(producer), producer.location:
        merged = ir.Operation.create(
            MANUAL, results=[producer.results[j].type for j in kept]
            + [r.type for r in consumer.results],
            operands=list(producer.operands) + [consumer.operands[k] for k in extras],
            attributes={"in_shardings": sdy.TensorShardingPerValueAttr.get(ins),
                        "out_shardings": sdy.TensorShardingPerValueAttr.get(outs),
                        "manual_axes": producer.attributes["manual_axes"]},
            regions=1)
    arguments = list(first.arguments) + [second.arguments[k] for k in extras]
    body = merged.regions[0].blocks.append(*[a.type for a in arguments],
                                            arg_locs=[producer.location] * len(arguments))
    for old, new in zip(arguments, body.arguments):
        old.replace_all_uses_with(new)
    returned = list(_terminator(first).operands)
    for k, index in passed.items():
        second.arguments[k].replace_all_uses_with(returned[index])
    for block in (first, second):
        for op in list(block.operations)[:-1]:
            body.append(op)
    with ir.InsertionPoint(body), consumer.location:
        ir.Operation.create("sdy.return", operands=[returned[j] for j in kept]
                            + list(_terminator(second).operands))
    for position, j in enumerate(kept):
        producer.results[j].replace_all_uses_with(merged.results[position])
    for j, result in enumerate(consumer.results):
        result.replace_all_uses_with(merged.results[len(kept) + j])
    consumer.erase()
    producer.erase()


def _user(use) -> ir.Operation:
    owner = use.owner
    return owner.operation if hasattr(owner, "operation") else owner


def _terminator(block: ir.Block) -> ir.Operation:
    return list(block.operations)[-1]
