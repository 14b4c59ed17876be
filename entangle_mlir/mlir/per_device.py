"""Per-device SPMD programs (XLA's partitioner output): layouts from `mhlo.sharding` strings.

Such a program has no named mesh, so one is synthesized: the device count factored into prime
axes `d0, d1, ...` (row-major over device ids). Each tiled dim of a sharding is matched to the
ordered axes whose block index reproduces the tile index of every device; replica groups and
partition_id offset tables are read against the same axes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.core.mesh import Mesh, too_many_devices
from entangle_mlir.mlir.compat import hlo_bindings

_SHARDING = "mhlo.sharding"

PARTITIONED_DUMP = ("XLA_FLAGS=\"--xla_dump_to=DIR --xla_dump_hlo_pass_re=spmd-partitioning "
                    "--xla_dump_hlo_as_proto\" and check DIR/*after_spmd-partitioning*.hlo.pb")
"""How to get the program entangle checks from XLA: its module after SPMD partitioning, before
fusion (what `entangle_mlir.jax.partitioned_hlo` dumps)."""


@dataclass(frozen=True)
class DeviceLayout:
    """A parameter's or result's layout: tiling per dim (over the synthesized mesh)."""

    tiling: tuple[tuple[str, ...], ...] | None
    reason: str = ""


def is_per_device(module: ir.Module, func: ir.Operation) -> bool:
    """True for partitioned programs: shardings on parameters and no manual computation.

    Module-level `mhlo.spmd_parameters_shardings` describe the module's entry function, never
    a reference that another function names with `entangle.refines` (a combined module)."""
    if any(_SHARDING in _arg_attrs(func, i) for i in range(_num_args(func))):
        return True
    if "mhlo.spmd_parameters_shardings" not in module.operation.attributes:
        return False
    return not _is_reference(module, func)


def _is_reference(module: ir.Module, func: ir.Operation) -> bool:
    if "sym_name" not in func.attributes:
        return False
    name = ir.StringAttr(func.attributes["sym_name"]).value
    for op in module.body.operations:
        op = op.operation
        if (op.name == "func.func" and "entangle.refines" in op.attributes
                and str(op.attributes["entangle.refines"]).lstrip("@").strip('"') == name):
            return True
    return False


def _num_args(func: ir.Operation) -> int:
    return len(func.regions[0].blocks[0].arguments)


def _arg_attrs(func: ir.Operation, index: int) -> dict:
    if "arg_attrs" not in func.attributes:
        return {}
    attrs = ir.ArrayAttr(func.attributes["arg_attrs"])
    return _dict(attrs[index]) if index < len(attrs) else {}


def _res_attrs(func: ir.Operation, index: int) -> dict:
    if "res_attrs" not in func.attributes:
        return {}
    attrs = ir.ArrayAttr(func.attributes["res_attrs"])
    return _dict(attrs[index]) if index < len(attrs) else {}


def _dict(attr) -> dict:
    d = ir.DictAttr(attr)
    return {d[i].name: d[i].attr for i in range(len(d))}


def _string(attr) -> str:
    return ir.StringAttr(attr).value


def parameter_shardings(module: ir.Module, func: ir.Operation) -> list[str | None]:
    count = _num_args(func)
    found = [None] * count
    for i in range(count):
        attrs = _arg_attrs(func, i)
        if _SHARDING in attrs:
            found[i] = _string(attrs[_SHARDING])
    module_attrs = module.operation.attributes
    if "mhlo.spmd_parameters_shardings" in module_attrs:
        listed = ir.ArrayAttr(module_attrs["mhlo.spmd_parameters_shardings"])
        for i in range(min(count, len(listed))):
            if found[i] is None:
                found[i] = _string(listed[i])
    return found


def result_shardings(module: ir.Module, func: ir.Operation, count: int) -> list[str | None]:
    found: list[str | None] = [None] * count
    for i in range(count):
        attrs = _res_attrs(func, i)
        if _SHARDING in attrs:
            found[i] = _string(attrs[_SHARDING])
    module_attrs = module.operation.attributes
    if any(f is None for f in found) and "mhlo.spmd_output_sharding" in module_attrs:
        text = _string(module_attrs["mhlo.spmd_output_sharding"])
        parts = _tuple_elements(text) if count > 1 or text.startswith("{{") else [text]
        for i in range(min(count, len(parts))):
            if found[i] is None:
                found[i] = parts[i]
    return found


def _tuple_elements(text: str) -> list[str]:

    sharding = hlo_bindings().HloSharding.from_string(text)
    elements = sharding.tuple_elements()
    return [str(e) for e in elements] if elements else [text]


def _factor(n: int) -> list[int]:
    """The prime factors of `n`, ascending (trial division up to its square root)."""
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


MAX_MESH_ORDERS = 5040
"""Most orders of the prime axes `synthesize_mesh` tries (7 distinct primes' worth); a device
count with more distinct orders takes the first ones, ascending first."""


def synthesize_mesh(num_devices: int, shardings=()) -> Mesh:
    """Prime axes d0, d1, ... over row-major device ids. Their order matters when the device
    count has different prime factors (a 3 x 2 mesh is d0=3 x d1=2, a 2 x 3 one d0=2 x d1=3):
    given the program's sharding strings, the first order (ascending first, then in
    lexicographic order; at most `MAX_MESH_ORDERS`) under which every tiled one is
    expressible is taken."""
    factors = _factor(num_devices)
    texts = [t for t in shardings if t]
    for order in itertools.islice(_orders(factors), MAX_MESH_ORDERS):
        mesh = Mesh(tuple((f"d{i}", size) for i, size in enumerate(order)))
        if all(layout_of(t, 0, mesh).tiling is not None or not _tiled(t) for t in texts):
            return mesh
    return Mesh(tuple((f"d{i}", size) for i, size in enumerate(factors)))


def _orders(ascending: list[int]):
    """The distinct orders of a multiset in lexicographic order, from `ascending` (the first),
    one at a time (2^9 x 5^9 devices has 48620 of them, and 18! permutations)."""
    order = list(ascending)
    while True:
        yield tuple(order)
        i = len(order) - 2
        while i >= 0 and order[i] >= order[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(order) - 1
        while order[j] <= order[i]:
            j -= 1
        order[i], order[j] = order[j], order[i]
        order[i + 1:] = reversed(order[i + 1:])


def _tiled(text: str) -> bool:

    try:
        return hlo_bindings().HloSharding.from_string(text).is_tiled()
    except Exception:  # noqa: BLE001 - unparsable shardings are reported elsewhere
        return False


def axis_names(mesh: Mesh, shape: tuple[int, ...], names: tuple[str, ...]) -> dict | None:
    """How the axes of a jax mesh (devices in row-major id order) map onto the synthesized
    axes: each jax axis is a run of consecutive synthesized axes, e.g. dp=2 x tp=4 over
    d0 x d1 x d2 gives {'dp': ('d0',), 'tp': ('d1', 'd2')}; None if they do not line up."""
    out, position = {}, 0
    axes = list(mesh.axes)
    for name, size in zip(names, shape):
        run, product = [], 1
        while product < size and position < len(axes):
            run.append(axes[position][0])
            product *= axes[position][1]
            position += 1
        if product != size:
            return None
        out[name] = tuple(run)
    return out if position == len(axes) else None


def program_device_count(module: ir.Module, func: ir.Operation) -> int:
    """The device count of a per-device program `func`: what `mhlo.num_partitions` says, or
    what its parameters' or its results' shardings tile. A program whose parameters are all
    replicated still states its devices through its results (a shard_map manual over some
    axes, fed replicated inputs and returning a split value)."""
    result_count = len(ir.FunctionType(
        ir.TypeAttr(func.attributes["function_type"]).value).results)
    return device_count(module, parameter_shardings(module, func)
                        + result_shardings(module, func, result_count))


def device_count(module: ir.Module, shardings: list[str | None]) -> int:
    count = _device_count(module, shardings)
    if count is not None:
        problem = too_many_devices(count)
        if problem:
            raise InputError(f"per-device program: {problem}")
        return count
    if not _uses_devices(module.operation):
        return 1
    raise InputError("per-device program: cannot tell the number of devices "
                     "(no mhlo.num_partitions and no tiled sharding)")


def _device_count(module: ir.Module, shardings: list[str | None]) -> int | None:
    """The device count the module states, or its shardings tile (None: neither says)."""
    attrs = module.operation.attributes
    counts = {name: ir.IntegerAttr(attrs[name]).value
              for name in ("mhlo.num_partitions", "mhlo.num_replicas") if name in attrs}
    if counts.get("mhlo.num_partitions", 1) > 1:
        return counts["mhlo.num_partitions"]
    if counts.get("mhlo.num_replicas", 1) > 1:
        # A per-device program run as replicas (one partition): replica ids are device ids.
        return counts["mhlo.num_replicas"]
    if "mhlo.num_partitions" in counts:
        return counts["mhlo.num_partitions"]

    # The tile counts, not the device lists: those are materialized, O(devices).
    counts = [math.prod(hlo_bindings().HloSharding.from_string(s).tile_assignment_dimensions())
              for s in shardings if s]
    counts = [c for c in counts if c > 1]
    return max(counts) if counts else None


_DEVICE_OPS = ("stablehlo.partition_id", "stablehlo.replica_id", "stablehlo.all_reduce",
               "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
               "stablehlo.collective_permute", "stablehlo.collective_broadcast")


def _uses_devices(op) -> bool:
    """Whether a program reads its device id or talks to other devices: without either (every
    value replicated, as XLA leaves a function with replicated shardings and no
    mhlo.num_partitions) every device runs the same computation, and one device is exact."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name in _DEVICE_OPS or _uses_devices(inner):
                    return True
    return False


@dataclass(frozen=True)
class DeviceTiles:
    """Which tile of a value each device holds, as a sharding string assigns them: `counts`
    the tiles along each tiled dim, `index[d]` device d's tile (one index per tiled dim);
    devices holding the same tile hold copies (replication, `last_tile_dim_replicate`)."""

    counts: tuple[int, ...]
    index: tuple[tuple[int, ...], ...]


def device_tiles(text: str | None, rank: int, num_devices: int
                 ) -> tuple[DeviceTiles | None, str]:
    """The tile every device holds of a value of rank `rank` under the sharding `text` (its
    device list or iota tile assignment read by XLA's own parser), or None and why not. A
    replicated sharding is one tile per dim; rank 0 with tiled dims (a caller that does not
    know the rank) gives every tiled dim."""
    if text is None:
        return None, ("no mhlo.sharding (an HLO text dump records the output sharding only "
                      "with xla_keep_shardings_after_spmd; the .hlo.pb dump always does)")

    try:
        sharding = hlo_bindings().HloSharding.from_string(text)
    except Exception as err:  # noqa: BLE001 - reported as bad input by the caller
        return None, f"cannot parse sharding {text!r}: {err}"
    if sharding.is_unknown():
        return None, f"unknown sharding {text}"
    if sharding.is_replicated():
        return DeviceTiles((1,) * rank, ((0,) * rank,) * num_devices), ""
    if sharding.is_manual():
        return None, (f"manual sharding {text} (a shard_map body left in the partitioned "
                      "program)")
    if sharding.is_maximal():
        return None, f"maximal sharding {text} (one device holds the value)"
    if sharding.is_unreduced():
        return None, f"unreduced sharding {text} (a pending partial sum across devices)"
    if sharding.tuple_elements():
        return None, f"tuple sharding {text} for a single value"
    subgroups = [str(t).rsplit(".", 1)[-1] for t in sharding.subgroup_types()]
    if "MANUAL" in subgroups:
        return None, f"partially manual sharding {text}"
    dims = list(sharding.tile_assignment_dimensions())
    if math.prod(dims) != num_devices:  # before listing the devices: O(devices)
        return None, (f"sharding {text} uses {math.prod(dims)} devices, the program "
                      f"{num_devices}")
    devices = list(sharding.tile_assignment_devices())
    if sorted(devices) != list(range(num_devices)):
        return None, f"sharding {text} does not use every device exactly once"
    extra = len(subgroups) + (1 if sharding.replicate_on_last_tile_dim() else 0)
    tiled_dims = len(dims) - extra
    if tiled_dims != rank and rank != 0:
        return None, (f"sharding {text} tiles {tiled_dims} dims but the value has rank "
                      f"{rank}")
    index_of: list[tuple[int, ...]] = [()] * num_devices
    strides = [1] * len(dims)
    for k in range(len(dims) - 2, -1, -1):
        strides[k] = strides[k + 1] * dims[k + 1]
    for position, device in enumerate(devices):
        index_of[device] = tuple((position // strides[k]) % dims[k] for k in range(tiled_dims))
    return DeviceTiles(tuple(dims[:tiled_dims]), tuple(index_of)), ""


_LAYOUTS: dict[tuple, DeviceLayout] = {}
"""`layout_of`'s answers: a program's values share a few sharding strings, and reading one
costs a pass over every device."""


def layout_of(text: str | None, rank: int, mesh: Mesh) -> DeviceLayout:
    """The tiling a sharding string describes, or a reason it cannot be used."""
    key = (text, rank, mesh.axes, mesh.replicas)
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = _layout_of(text, rank, mesh)
    return found


def _layout_of(text: str | None, rank: int, mesh: Mesh) -> DeviceLayout:
    tiles, reason = device_tiles(text, rank, mesh.num_devices)
    if tiles is None:
        return DeviceLayout(None, reason)
    if all(c == 1 for c in tiles.counts):
        return DeviceLayout(((),) * (rank or len(tiles.counts)))
    # rank 0 with tiled dims: the caller may not know the rank (an opaque result). The full
    # tiling is returned; a real scalar then fails the layout comparison, never proves.
    tiling: list[tuple[str, ...]] = []
    used: list[str] = []
    for k, count in enumerate(tiles.counts):
        if count == 1:
            tiling.append(())
            continue
        axes = _match(mesh, [tiles.index[d][k] for d in range(mesh.num_devices)], count, used)
        if axes is None:
            return DeviceLayout(None, f"sharding {text}: the tiles of dim {k} follow no "
                                      "ordering of mesh axes")
        used.extend(axes)
        tiling.append(axes)
    return DeviceLayout(tuple(tiling))


def _match(mesh: Mesh, index: list[int], blocks: int, used: list[str]
           ) -> tuple[str, ...] | None:
    """Ordered axes A, major first, with block_index(A, d) == index[d] for every device."""
    if blocks == 1:
        return () if all(i == 0 for i in index) else None
    for axis in mesh.names:
        size = mesh.size(axis)
        if axis in used or blocks % size:
            continue
        rest = blocks // size
        if all(index[d] // rest == mesh.coords(d)[axis] for d in range(mesh.num_devices)):
            tail = _match(mesh, [i % rest for i in index], rest, used + [axis])
            if tail is not None:
                return (axis,) + tail
    return None


# ----- Shardy's per-device form (sdy-convert-global-to-local) -------------------------------------

_SDY_SHARDING = "sdy.sharding"


def adopt_shardy_local(module: ir.Module, func: ir.Operation, reference: ir.Operation) -> bool:
    """Shardy's own pipeline (`sdy-propagation-pipeline`, `sdy-insert-explicit-reshards`,
    `sdy-reshard-to-collectives`, `sdy-convert-global-to-local`) leaves a per-device program
    that keeps `sdy.sharding` on its parameters and results and the `sdy.mesh`, with local
    shapes and stablehlo collectives but no manual computation. Recognised against the
    reference (every parameter is the reference's shape divided by its tiling, and some are
    smaller), its shardings are rewritten in place as `mhlo.sharding` strings over the mesh's
    devices, so that it is checked like XLA's partitioner output. False: not that form."""
    if is_per_device(module, func):
        return False
    block = func.regions[0].blocks[0]
    if any(op.operation.name == "sdy.manual_computation" for op in block.operations):
        return False
    meshes = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "sdy.mesh":
            meshes[_string(op.attributes["sym_name"])] = sdy.MeshAttr(op.attributes["mesh"])
    if not meshes:
        return False
    arg_shardings = [_arg_attrs(func, i).get(_SDY_SHARDING) for i in range(_num_args(func))]
    results = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).results
    res_shardings = [_res_attrs(func, i).get(_SDY_SHARDING) for i in range(len(results))]
    if not any(a is not None for a in arg_shardings + res_shardings):
        return False
    ref_args = [a.type for a in reference.regions[0].blocks[0].arguments]
    if len(ref_args) != len(arg_shardings):
        return False
    strings, smaller = [], False
    for arg, attr, ref_type in zip(block.arguments, arg_shardings, ref_args):
        converted = _sdy_to_mhlo(attr, meshes) if attr is not None else ("{replicated}", None)
        text, tiles = converted
        local, full = list(ir.RankedTensorType(arg.type).shape), list(
            ir.RankedTensorType(ref_type).shape)
        tiles = tiles or [1] * len(local)
        if text is None or len(local) != len(full) or [n * t for n, t in zip(local, tiles)
                                                       ] != full:
            return False
        smaller |= local != full
        strings.append(text)
    if not smaller:
        return False
    out_strings = [(_sdy_to_mhlo(attr, meshes)[0] if attr is not None else "{replicated}")
                   for attr in res_shardings]
    if any(text is None for text in out_strings):
        return False
    _set_shardings(func, "arg_attrs", strings)
    _set_shardings(func, "res_attrs", out_strings)
    if "mhlo.num_partitions" not in module.operation.attributes:
        count = math.prod(sdy.MeshAxisAttr(a).size for a in next(iter(meshes.values())).axes)
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), count)
    return True


def _sdy_to_mhlo(attr, meshes: dict) -> tuple[str | None, list[int] | None]:
    """(`mhlo.sharding` text, tiles per dim) of an `sdy.sharding`; (None, None) for forms
    with no mhlo equivalent here (sub-axes, unreduced axes, unknown or inline meshes)."""
    sharding = sdy.TensorShardingAttr(attr)
    name = str(sharding.mesh_or_ref).lstrip("@").strip('"')
    mesh = meshes.get(name)
    if mesh is None or list(sharding.unreduced_axes):
        return None, None
    axes = [(sdy.MeshAxisAttr(a).name, sdy.MeshAxisAttr(a).size) for a in mesh.axes]
    index = {n: i for i, (n, _) in enumerate(axes)}
    order, tiles = [], []
    for dim in sharding.dimension_shardings:
        count = 1
        for ref in sdy.DimensionShardingAttr(dim).axes:
            ref = sdy.AxisRefAttr(ref)
            if ref.sub_axis_info is not None or ref.name not in index:
                return None, None
            order.append(index[ref.name])
            count *= axes[index[ref.name]][1]
        tiles.append(count)
    rest = [i for i in range(len(axes)) if i not in order]
    replicated = math.prod(axes[i][1] for i in rest)
    if not order:
        return "{replicated}", tiles
    ids = list(mesh.device_ids) or list(range(math.prod(size for _, size in axes)))
    devices = np.array(ids).reshape([size for _, size in axes]).transpose(order + rest)
    dims = tiles + ([replicated] if replicated > 1 else [])
    listed = ",".join(str(int(d)) for d in devices.reshape(-1))
    suffix = " last_tile_dim_replicate" if replicated > 1 else ""
    return f"{{devices=[{','.join(map(str, dims))}]{listed}{suffix}}}", tiles


def _set_shardings(func: ir.Operation, key: str, texts: list[str]) -> None:
    """Replace `sdy.sharding` by `mhlo.sharding` in the arg/res attribute dictionaries."""
    old = ir.ArrayAttr(func.attributes[key]) if key in func.attributes else None
    dicts = []
    for i, text in enumerate(texts):
        entries = _dict(old[i]) if old is not None and i < len(old) else {}
        entries.pop(_SDY_SHARDING, None)
        entries[_SHARDING] = ir.StringAttr.get(text)
        dicts.append(ir.DictAttr.get(entries))
    func.attributes[key] = ir.ArrayAttr.get(dicts)
