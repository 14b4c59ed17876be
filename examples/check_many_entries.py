"""jax entry points for `entangle check-many` (the `[[jax]]` entries of a manifest, see
docs/check-many.md): each takes a `jax.sharding.Mesh` and returns `(reference_fn, sharded_fn,
avals)`, the arguments of `entangle_mlir.jax.check`. The mesh's `tp` axis splits the MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from examples.models import mlp_body, mlp_missing_psum_body, mlp_ref

_SPECS = (P(), P(None, "tp"), P("tp"), P("tp", None), P())  # x, w1, b1, w2, b2
_SHAPES = ((4, 8, 32), (32, 64), (64,), (64, 32), (32,))


def _case(body, mesh, check_vma: bool = True):
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=_SPECS, out_specs=P(),
                                    check_vma=check_vma))
    avals = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
             for shape, spec in zip(_SHAPES, _SPECS)]
    return mlp_ref, sharded, avals


def megatron_mlp(mesh):
    """Megatron tensor-parallel MLP (proven at every tp)."""
    return _case(mlp_body, mesh)


def megatron_mlp_missing_psum(mesh):
    """The same without its psum (a bug at every tp; jax's own replication check, which
    would refuse it, off)."""
    return _case(mlp_missing_psum_body, mesh, check_vma=False)
