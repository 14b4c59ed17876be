"""GPT-2: learned positions, pre-LayerNorm blocks, causal MHA, GELU MLP, tied embedding/LM head."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .config import Config
from .layers import context_attention, cross_entropy, embed, gelu, layer_norm, rows
from .par import Par, axis_index, copy_to_tp, enter_tp, exit_tp, positions
from .params import ParamDef, run_layers

Array = jax.Array


def param_defs(cfg: Config) -> list[ParamDef]:
    L, D, F, V, S, Q = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab, cfg.seq, cfg.q_width
    return [
        ParamDef("wte", (V, D), "embed"),
        ParamDef("wpe", (S, D), "rep"),
        ParamDef("ln1_g", (L, D), "rep", True), ParamDef("ln1_b", (L, D), "rep", True),
        ParamDef("wq", (L, D, Q), "col", True), ParamDef("bq", (L, Q), "col_b", True),
        ParamDef("wk", (L, D, Q), "col", True), ParamDef("bk", (L, Q), "col_b", True),
        ParamDef("wv", (L, D, Q), "col", True), ParamDef("bv", (L, Q), "col_b", True),
        ParamDef("wo", (L, Q, D), "row", True), ParamDef("bo", (L, D), "rep", True),
        ParamDef("ln2_g", (L, D), "rep", True), ParamDef("ln2_b", (L, D), "rep", True),
        ParamDef("w1", (L, D, F), "col", True), ParamDef("b1", (L, F), "col_b", True),
        ParamDef("w2", (L, F, D), "row", True), ParamDef("b2", (L, D), "rep", True),
        ParamDef("lnf_g", (D,), "rep"), ParamDef("lnf_b", (D,), "rep"),
    ]  # fmt: skip


def block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """One pre-LN block on (batch, local seq, d_model)."""
    b, _s, _ = x.shape
    h = enter_tp(layer_norm(x, p["ln1_g"], p["ln1_b"]), par)
    s_full = h.shape[1]
    q = (h @ p["wq"] + p["bq"]).reshape(b, s_full, -1, cfg.head_dim)
    k = (h @ p["wk"] + p["bk"]).reshape(b, s_full, -1, cfg.head_dim)
    v = (h @ p["wv"] + p["bv"]).reshape(b, s_full, -1, cfg.head_dim)
    a = context_attention(q, k, v, positions(par, s_full), par).reshape(b, s_full, -1)
    x = x + exit_tp(a @ p["wo"], par) + p["bo"]
    h = enter_tp(layer_norm(x, p["ln2_g"], p["ln2_b"]), par)
    h = gelu(h @ p["w1"] + p["b1"])
    return x + exit_tp(h @ p["w2"], par) + p["b2"]


def row_offset(par: Par, s_local: int):
    """Global position of the first row of this device's activations."""
    if par.cp:
        return axis_index(par.cp) * s_local
    if par.sp and par.tp:
        return axis_index(par.tp) * s_local
    return 0


def stack(params: dict, x: Array, cfg: Config, par: Par, scan: bool = False,
          block_fn=None) -> Array:
    """The transformer layers alone: hidden states in, hidden states out."""
    layer_fn = block_fn or block
    return run_layers(lambda p, h: layer_fn(p, h, cfg, par), x, params, param_defs(cfg),
                      cfg.n_layers, par, scan)


def hidden(params: dict, tokens: Array, cfg: Config, par: Par, scan: bool = False) -> Array:
    x = embed(params["wte"], tokens, par)
    x = x + rows(params["wpe"], row_offset(par, x.shape[1]), x.shape[1])
    x = stack(params, x, cfg, par, scan)
    return layer_norm(x, params["lnf_g"], params["lnf_b"])


def logits(params: dict, h: Array, par: Par) -> Array:
    """Tied LM head: h @ wte.T (vocab-parallel: local vocab columns)."""
    h = enter_tp(h, par) if par.vocab else h
    return h @ params["wte"].T


def forward(params: dict, tokens: Array, cfg: Config, par: Par, scan: bool = False) -> Array:
    return logits(params, hidden(params, tokens, cfg, par, scan), par)


def token_losses(params: dict, tokens: Array, targets: Array, cfg: Config, par: Par,
                 scan: bool = False) -> Array:
    return cross_entropy(forward(params, tokens, cfg, par, scan), targets, par)


__all__ = ["block", "copy_to_tp", "forward", "hidden", "jnp", "logits", "param_defs",
           "row_offset", "stack", "token_losses"]
