"""Correct programs written in unusual but equivalent ways: they must be proven too."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .catalog import Example, custom, program
from .models import gpt2, llama
from .models.config import Config
from .models.layers import context_attention, gelu, layer_norm, rms_norm, silu
from .models.par import Par, enter_tp, exit_tp, positions
from .programs import ArgDef, Variant

Array = jax.Array
TP = "tp"


def gpt2_block_gather_then_slice(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """SP block whose MLP residual is formed on the all-gathered sequence (psum instead of
    psum_scatter), after which each device slices its own rows back out."""
    if not par.tp:
        return gpt2.block(p, x, cfg, par)
    h = enter_tp(layer_norm(x, p["ln1_g"], p["ln1_b"]), par)
    b, s = h.shape[:2]
    q = (h @ p["wq"] + p["bq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"] + p["bk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"] + p["bv"]).reshape(b, s, -1, cfg.head_dim)
    a = context_attention(q, k, v, positions(par, s), par).reshape(b, s, -1)
    x = x + exit_tp(a @ p["wo"], par) + p["bo"]
    x_full = lax.all_gather(x, TP, axis=1, tiled=True)
    h = gelu(layer_norm(x_full, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"])
    out = x_full + lax.psum(h @ p["w2"], TP) + p["b2"]
    rows = x.shape[1]
    return lax.dynamic_slice_in_dim(out, lax.axis_index(TP) * rows, rows, axis=1)


def llama_block_replicated_mlp(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """TP attention, but the SwiGLU MLP computed redundantly (replicated weights) everywhere."""
    x = x + llama.attention_block(p, x, cfg, par)
    h = rms_norm(x, p["mlp_norm"])
    return x + (silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def llama_replicated_mlp_defs(cfg: Config):
    """Llama parameters with the MLP weights replicated (role `rep`)."""
    from dataclasses import replace

    return [replace(pd, role="rep") if pd.name in ("w_gate", "w_up", "w_down") else pd
            for pd in llama.param_defs(cfg)]


# x @ W.T with W split on dim 0: the tied LM head as a column-parallel layer.

B, S, D, V = 8, 16, 32, 64


def head_ref(h: Array, wte: Array) -> Array:
    return h @ wte.T


def head_vocab_parallel(h: Array, wte: Array) -> Array:
    return h @ wte.T


def row_split_transposed_ref(x: Array, w: Array) -> Array:
    return jnp.tanh(x @ w.T)


def row_split_transposed(x: Array, w: Array) -> Array:
    """PyTorch-layout column-parallel linear: W (out, in) split on dim 0, y = x @ W.T."""
    return jnp.tanh(x @ w.T)


def psum_by_gather_ref(x: Array, w: Array) -> Array:
    return x @ w


def psum_by_gather(x: Array, w: Array) -> Array:
    """Row-parallel matmul whose partial sums are all-gathered on a new axis and summed."""
    partial = x @ w
    return jnp.sum(lax.all_gather(partial, TP, axis=0), axis=0)


def tricky_programs() -> list[Example]:
    four = (("tp", 4),)
    sp = Par(tp=TP, sp=True, vocab=True)
    tp = Par(tp=TP)
    args_head = (ArgDef("h", (B, S, D), "float32", "data", P()),
                 ArgDef("wte", (V, D), "float32", "weight", P(TP, None), fan_in=D))
    args_lin = (ArgDef("x", (B, S, D), "float32", "data", P()),
                ArgDef("w", (V, D), "float32", "weight", P(TP, None), fan_in=D))
    args_row = (ArgDef("x", (B, S, V), "float32", "data", P(None, None, TP)),
                ArgDef("w", (V, D), "float32", "weight", P(TP, None), fan_in=V))
    replicated_mlp = Variant(llama, param_defs=llama_replicated_mlp_defs,
                             stack=functools.partial(llama.stack,
                                                     block_fn=llama_block_replicated_mlp))
    out = [
        program("gpt2", "stack", sp, four, "sp", "SP block: all_gather, psum, slice own rows",
                suffix="_gatherslice",
                mod=Variant(gpt2, stack=functools.partial(
                    gpt2.stack, block_fn=gpt2_block_gather_then_slice))),
        program("llama3", "stack", tp, four, "tp", "TP attention, MLP computed redundantly",
                suffix="_replmlp", mod=replicated_mlp),
        custom("tied_head_vocab_parallel", four, head_ref, head_vocab_parallel, args_head,
               P(None, None, TP), "Tied LM head h @ wte.T with wte split on the vocab dim",
               model="gpt2", style="tp + vocab", task="fwd"),
        custom("linear_w_transposed_row_split", four, row_split_transposed_ref,
               row_split_transposed, args_lin, P(None, None, TP),
               "x @ W.T with W (out, in) split on dim 0 (PyTorch layout, column-parallel)",
               model="linear", style="tp", task="fwd"),
        custom("psum_as_all_gather_sum", four, psum_by_gather_ref, psum_by_gather, args_row, P(),
               "Row-parallel matmul reduced by all_gather on a new axis + sum", model="linear",
               style="tp", task="fwd"),
    ]
    out = [_mark_tricky(e) for e in out]
    from .ce import ce_programs

    return out + [e for e in ce_programs()[0] if e.tricky]


def _mark_tricky(ex: Example) -> Example:
    from dataclasses import replace

    return replace(ex, tricky=True)
