"""Parameters as flat argument lists: names, global shapes, and their layout under a `Par`.

Per-layer parameters are stacked along a leading layer dim (so that both a Python loop and
`jax.lax.scan` can run the layers); `role` says how Megatron lays a parameter out:

* `rep`: replicated (norm weights, biases added after a row-parallel reduction, positions);
* `col` / `col_b`: column-parallel weight (last dim over tp) and its bias;
* `row`: row-parallel weight (second-to-last dim over tp);
* `embed` / `head`: token embedding (V, D) and LM head (D, V), vocab dim over tp when vocab-parallel;
* `router`: MoE router (replicated);
* `head_shared`: replicated, but applied to every (tp-split) head, e.g. a per-head norm weight;
* `expert_col` / `expert_row`: (E, D, F) / (E, F, D) expert weights, E over ep and F over tp.

FSDP splits every parameter along `fsdp_dim` (of the unstacked shape) over the fsdp axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from .par import Par


@dataclass(frozen=True)
class ParamDef:
    name: str
    shape: tuple[int, ...]  # global shape, with the layer dim first when stacked
    role: str
    stacked: bool = False
    fsdp_dim: int = 0

    @property
    def fan_in(self) -> int:
        core = self.shape[1:] if self.stacked else self.shape
        return core[-2] if len(core) >= 2 else 1


def spec(pd: ParamDef, par: Par) -> P:
    """The PartitionSpec of a parameter under `par`."""
    dims: list = [None] * len(pd.shape)
    off = 1 if pd.stacked else 0
    tp = par.tp
    if tp:
        if pd.role in ("col", "col_b") or pd.role == "expert_col" and not par.sp:
            dims[-1] = tp
        elif pd.role == "row" or pd.role == "expert_row" and not par.sp:
            dims[-2] = tp
        elif pd.role == "embed" and par.vocab:
            dims[off] = tp
        elif pd.role == "head" and par.vocab:
            dims[-1] = tp
    if par.ep and pd.role in ("expert_col", "expert_row"):
        dims[off] = par.ep
    if par.fsdp:
        dim = off + pd.fsdp_dim
        assert dims[dim] is None, (pd.name, "fsdp dim already split")
        dims[dim] = par.fsdp
    return P(*dims)


def is_expert(pd: ParamDef) -> bool:
    return pd.role in ("expert_col", "expert_row")


def unflatten(defs: list[ParamDef], values) -> dict:
    return {pd.name: v for pd, v in zip(defs, values, strict=True)}


def layer(params: dict, defs: list[ParamDef], i: int) -> dict:
    """Layer i's slice of the stacked parameters (a static slice)."""
    return {pd.name: params[pd.name][i] for pd in defs if pd.stacked}


def stacked(params: dict, defs: list[ParamDef]) -> dict:
    return {pd.name: params[pd.name] for pd in defs if pd.stacked}


def unshard(p: dict, defs: list[ParamDef], par: Par) -> dict:
    """FSDP: all_gather every parameter of `p` (a layer slice or the globals) before use."""
    if not par.fsdp:
        return p
    by_name = {pd.name: pd for pd in defs}
    return {k: lax.all_gather(v, par.fsdp, axis=by_name[k].fsdp_dim, tiled=True)
            for k, v in p.items()}


def run_layers(layer_fn, x, params: dict, defs: list[ParamDef], n_layers: int, par: Par,
               scan: bool = False):
    """Apply `layer_fn(p, x)` for every layer: a Python loop, or `jax.lax.scan` over the stack."""
    if scan:
        def step(h, p):
            return layer_fn(unshard(p, defs, par), h), None

        x, _ = lax.scan(step, x, stacked(params, defs))
        return x
    for i in range(n_layers):
        x = layer_fn(unshard(layer(params, defs, i), defs, par), x)
    return x


__all__ = ["ParamDef", "is_expert", "jax", "layer", "run_layers", "spec", "stacked",
           "unflatten", "unshard"]
