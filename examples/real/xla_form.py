"""examples/real's GPT-2 and Llama-3 in XLA's per-device form (issue 18).

The unsharded forward (token ids to logits) jitted with Megatron's weight shardings (the
vocab-parallel embedding and LM head, heads and FFN columns over tp, the batch over dp) and
partitioned by XLA; the embedding is the Megatron-spelled lookup as a shard_map library
function (`local = ids - start; mask = (local >= 0) & (local < n); take(w, clip(local, 0,
n - 1)); where(mask, ., 0); psum`), the only hand-written collective: XLA places the others.
The reference is the same model's plain forward (`take(wte, ids)`). `benchmarks/scaling.py`
runs it at GPT-2 and Llama-3-8B widths (rows `... xla`), the tests at small widths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .catalog import Example, _avals, _compiled, make_mesh, program
from .models import gpt2, llama
from .models.config import Config
from .models.layers import layer_norm, rms_norm, rows
from .models.par import Par
from .programs import MODELS, Variant, logits_spec, program_fn


def megatron_lookup(ids, w):
    """Megatron's vocab-parallel lookup (the shard_map body): ids minus this block's start,
    clipped into the block, masked, summed over tp."""
    n = w.shape[0]
    local = ids - lax.axis_index("tp") * n
    mask = (local >= 0) & (local < n)
    rows_ = jnp.take(w, jnp.clip(local, 0, n - 1), axis=0)
    return lax.psum(jnp.where(mask[..., None], rows_, 0.0), "tp")


@dataclass(frozen=True)
class XlaForm:
    """One model in XLA's per-device form: `fn` (flat arguments as `example.args`) is what is
    jitted with `out_sharding` and partitioned; `example` is the shard_map program of the same
    model, layout and widths (its reference, argument shardings and meshes are shared)."""

    example: Example
    fn: Callable
    out_sharding: NamedSharding

    @property
    def avals(self) -> list[jax.ShapeDtypeStruct]:
        return _avals(self.example, True)

    def jitted(self) -> Callable:
        return jax.jit(self.fn, out_shardings=self.out_sharding)

    def run(self, inputs: list) -> list:
        """XLA's partitioned program on `inputs` (placed on the example's mesh by their
        shardings), on simulated CPU devices."""
        placed = [jax.device_put(x, a.sharding) for x, a in zip(inputs, self.avals)]
        out = _compiled(self.jitted(), tuple(self.avals))(*placed)
        return [np.asarray(o) for o in jax.tree.leaves(out)]


def xla_form(model: str, cfg: Config, dp: int, tp: int,
             lookup_body: Callable = megatron_lookup) -> XlaForm:
    """`model` ("gpt2" or "llama3") at widths `cfg` on dp x tp (no dp axis when dp = 0);
    `lookup_body` is the shard_map body of the embedding (a twin's, for a test)."""
    axes = ((("dp", dp),) if dp else ()) + (("tp", tp),)
    par = Par(tp="tp", dp="dp" if dp else None, vocab=True)
    ex = program(model, "fwd", par, axes, "tp + vocab, XLA-partitioned", cfg=cfg)
    batch = "dp" if dp else None
    lookup = jax.shard_map(lookup_body, mesh=make_mesh(ex),
                           in_specs=(P(batch), P("tp", None)), out_specs=P(batch))

    def forward(params, tokens, cfg, par, scan=False):
        x = lookup(tokens, params["wte"])
        if model == "gpt2":
            x = gpt2.stack(params, x + rows(params["wpe"], 0, x.shape[1]), cfg, par, scan)
            return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ params["wte"].T
        x = llama.stack(params, x, cfg, par, scan)
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    forward.__name__ = f"forward_{lookup_body.__name__}"
    fn = program_fn(Variant(MODELS[model][0], forward=forward), cfg, "fwd", Par(), False, False)
    return XlaForm(ex, fn, NamedSharding(make_mesh(ex), logits_spec(par)))


def lower_xla_pair(form: XlaForm) -> tuple[str, bytes]:
    """(the reference's StableHLO text, XLA's per-device program as StableHLO bytecode)."""
    from entangle_mlir.jax import lower_partitioned

    _, per_device = lower_partitioned(form.fn, *form.avals, out_shardings=form.out_sharding)
    ref = jax.jit(form.example.reference).lower(*_avals(form.example, False))
    return ref.as_text(debug_info=True), per_device
