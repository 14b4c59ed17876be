"""Which mesh axes do what, and the collectives a model calls (no-ops in the reference).

A model is written once against a `Par`. With `Par()` (no axes) every helper is the identity and
the model is the unsharded reference; inside `shard_map` the same code runs on local shards and
the helpers communicate.

Two ways of getting gradients through the collectives:

* `megatron=True` (the default, `check_vma=False`): Megatron-LM's conjugate operators as
  `jax.custom_vjp` functions, e.g. `copy_to_tp` is the identity forward and a psum backward
  (Megatron's `f`), `reduce_from_tp` a psum forward and the identity backward (`g`); gradients of
  parameters computed redundantly or on a shard of the data are synchronised explicitly after
  `value_and_grad` (`train.sync_grads`), as Megatron / DDP do.
* `megatron=False` (`check_vma=True`): plain `lax` collectives; jax's varying-manual-axes types
  insert the transposes (the psum of a replicated parameter's gradient) by themselves.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


@dataclass(frozen=True)
class Par:
    """The parallel layout a model runs under. `Par()` is the unsharded reference."""

    tp: str | None = None  # Megatron tensor parallel (heads, MLP columns/rows)
    sp: bool = False  # Megatron sequence parallel on the tp axis (norms/dropout on seq shards)
    cp: str | None = None  # context parallel: sequence split, K/V all-gathered for attention
    dp: str | None = None  # data parallel: batch split, gradients averaged
    fsdp: str | None = None  # fully sharded data parallel: batch and weights split
    ep: str | None = None  # expert parallel: experts and tokens split, all_to_all dispatch
    vocab: bool = False  # vocab-parallel embedding, LM head and cross-entropy over tp
    vocab_clip: bool = False  # ... spelled `mask = (local >= 0) & (local < n); clip(local)`
    ring: str = ""  # context parallel by ring attention: "unrolled" (Python loop) or "loop"
    megatron: bool = True  # custom_vjp conjugate operators (else plain lax, check_vma=True)

    def with_(self, **kw) -> Par:
        return replace(self, **kw)

    @property
    def is_reference(self) -> bool:
        return not (self.tp or self.cp or self.dp or self.fsdp or self.ep)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """Axes over which the tokens of the batch are split (the loss is averaged over them)."""
        return tuple(a for a in (self.dp, self.fsdp, self.ep, self.cp) if a)

    @property
    def check_vma(self) -> bool:
        return not self.megatron


# ---------------------------------------------------------------------------------------------
# Megatron's conjugate operators (custom_vjp), and their lax twins.
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _copy(x: Array, axis: str) -> Array:
    return x


def _copy_fwd(x, axis):
    return x, None


def _copy_bwd(axis, _, g):
    return (lax.psum(g, axis),)


_copy.defvjp(_copy_fwd, _copy_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _reduce(x: Array, axis: str) -> Array:
    return lax.psum(x, axis)


def _reduce_fwd(x, axis):
    return lax.psum(x, axis), None


def _reduce_bwd(axis, _, g):
    return (g,)


_reduce.defvjp(_reduce_fwd, _reduce_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather(x: Array, axis: str, dim: int) -> Array:
    return lax.all_gather(x, axis, axis=dim, tiled=True)


def _gather_fwd(x, axis, dim):
    return lax.all_gather(x, axis, axis=dim, tiled=True), None


def _gather_bwd(axis, dim, _, g):
    return (lax.psum_scatter(g, axis, scatter_dimension=dim, tiled=True),)


_gather.defvjp(_gather_fwd, _gather_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _scatter(x: Array, axis: str, dim: int) -> Array:
    return lax.psum_scatter(x, axis, scatter_dimension=dim, tiled=True)


def _scatter_fwd(x, axis, dim):
    return lax.psum_scatter(x, axis, scatter_dimension=dim, tiled=True), None


def _scatter_bwd(axis, dim, _, g):
    return (lax.all_gather(g, axis, axis=dim, tiled=True),)


_scatter.defvjp(_scatter_fwd, _scatter_bwd)


def copy_to_tp(x: Array, par: Par) -> Array:
    """Megatron `f`: the input of a column-parallel layer (identity; psum of its gradient)."""
    if not par.tp:
        return x
    return _copy(x, par.tp) if par.megatron else x


def reduce_from_tp(x: Array, par: Par) -> Array:
    """Megatron `g`: the output of a row-parallel layer (psum; identity on its gradient)."""
    if not par.tp:
        return x
    return _reduce(x, par.tp) if par.megatron else lax.psum(x, par.tp)


def gather_seq(x: Array, par: Par, dim: int = 1) -> Array:
    """Sequence parallel: all_gather the sequence before a column-parallel layer."""
    if not (par.tp and par.sp):
        return x
    if par.megatron:
        return _gather(x, par.tp, dim)
    return lax.all_gather(x, par.tp, axis=dim, tiled=True)


def scatter_seq(x: Array, par: Par, dim: int = 1) -> Array:
    """Sequence parallel: reduce_scatter the output of a row-parallel layer along the sequence."""
    if not (par.tp and par.sp):
        return x
    if par.megatron:
        return _scatter(x, par.tp, dim)
    return lax.psum_scatter(x, par.tp, scatter_dimension=dim, tiled=True)


def enter_tp(x: Array, par: Par, dim: int = 1) -> Array:
    """Before a column-parallel layer: `f` under plain TP, all_gather(seq) under SP."""
    return gather_seq(x, par, dim) if par.sp else copy_to_tp(x, par)


def exit_tp(x: Array, par: Par, dim: int = 1) -> Array:
    """After a row-parallel layer: `g` (psum) under plain TP, reduce_scatter(seq) under SP."""
    return scatter_seq(x, par, dim) if par.sp else reduce_from_tp(x, par)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _allreduce(x: Array, axis: str) -> Array:
    return lax.psum(x, axis)


def _allreduce_fwd(x, axis):
    return lax.psum(x, axis), None


def _allreduce_bwd(axis, _, g):
    return (lax.psum(g, axis),)


_allreduce.defvjp(_allreduce_fwd, _allreduce_bwd)


def allreduce_tp(x: Array, par: Par) -> Array:
    """psum whose consumers are sharded (statistics of a tp-split hidden): psum both ways."""
    if not par.tp:
        return x
    return _allreduce(x, par.tp) if par.megatron else lax.psum(x, par.tp)


def gather_cp(x: Array, par: Par, dim: int = 1) -> Array:
    """Context parallel: all_gather K/V along the sequence (reduce_scatter of their gradient)."""
    if not par.cp:
        return x
    if par.megatron:
        return _gather(x, par.cp, dim)
    return lax.all_gather(x, par.cp, axis=dim, tiled=True)


def gather_weight(w: Array, par: Par, dim: int = 0) -> Array:
    """FSDP: all_gather a weight shard before use (its gradient is reduce-scattered)."""
    if not par.fsdp:
        return w
    return lax.all_gather(w, par.fsdp, axis=dim, tiled=True)


def axis_index(axis: str | None) -> Array | int:
    return lax.axis_index(axis) if axis else 0


def axis_size(axis: str | None) -> int:
    return lax.axis_size(axis) if axis else 1


def psum(x: Array, axis) -> Array:
    return lax.psum(x, axis) if axis else x


def pmax(x: Array, axis) -> Array:
    return lax.pmax(x, axis) if axis else x


def seq_offset(par: Par, local_len: int) -> Array | int:
    """Global position of this shard's first token (sequence split over cp)."""
    return axis_index(par.cp) * local_len if par.cp else 0


def positions(par: Par, local_len: int) -> Array:
    """Global positions of this shard's tokens."""
    return seq_offset(par, local_len) + jnp.arange(local_len)
