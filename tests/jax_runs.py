"""Grounding shared by the jax-based tests: run a shard_map program and its reference on
simulated CPU devices and lower the pair for the checker.

The importing test module sets `XLA_FLAGS` (host device count) before it imports jax."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding

from entangle_mlir.evidence import run_once  # noqa: F401 - groundings within a tolerance; exact ones jit
from entangle_mlir.jax import lower_pair


def run_and_lower(reference, body, args, specs, out_specs, mesh=(("d", 4),),
                  check_vma: bool = False):
    """(reference outputs, sharded outputs, (reference text, sharded text)): `body` under
    `jax.shard_map` on a mesh of `mesh`'s (axis, size) pairs, `args` placed by `specs`;
    outputs are pytrees of numpy arrays."""
    names = tuple(a for a, _ in mesh)
    sizes = tuple(s for _, s in mesh)
    device_mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))
    sharded = jax.jit(jax.shard_map(body, mesh=device_mesh, in_specs=tuple(specs),
                                    out_specs=out_specs, check_vma=check_vma))
    shardings = [NamedSharding(device_mesh, spec) for spec in specs]
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings)]
    placed = [jax.device_put(a, s) for a, s in zip(args, shardings)]
    want = jax.tree.map(np.asarray, jax.jit(reference)(*args))
    got = jax.tree.map(np.asarray, sharded(*placed))
    return want, got, lower_pair(reference, sharded, *avals)
