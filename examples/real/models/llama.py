"""Llama-3 (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head); Qwen2 adds q/k/v
biases (`Config.qkv_bias`); `Config.qk_norm` adds OLMo-2 style RMSNorm on the q/k projections."""

from __future__ import annotations

import jax

from .config import Config
from .layers import context_attention, cross_entropy, embed, rms_norm, rms_norm_tp, rope, silu
from .par import Par, enter_tp, exit_tp, positions
from .params import ParamDef, run_layers

Array = jax.Array


def param_defs(cfg: Config) -> list[ParamDef]:
    L, D, F, V = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab
    Q, KV = cfg.q_width, cfg.kv_width
    defs = [
        ParamDef("wte", (V, D), "embed"),
        ParamDef("attn_norm", (L, D), "rep", True),
        ParamDef("wq", (L, D, Q), "col", True),
        ParamDef("wk", (L, D, KV), "col", True),
        ParamDef("wv", (L, D, KV), "col", True),
    ]
    if cfg.qkv_bias:
        defs += [ParamDef("bq", (L, Q), "col_b", True), ParamDef("bk", (L, KV), "col_b", True),
                 ParamDef("bv", (L, KV), "col_b", True)]
    if cfg.qk_norm:
        defs += [ParamDef("q_norm", (L, Q), "col_b", True),
                 ParamDef("k_norm", (L, KV), "col_b", True)]
    if cfg.head_norm:
        defs += [ParamDef("q_head_norm", (L, cfg.head_dim), "head_shared", True),
                 ParamDef("k_head_norm", (L, cfg.head_dim), "head_shared", True)]
    defs += [
        ParamDef("wo", (L, Q, D), "row", True),
        ParamDef("mlp_norm", (L, D), "rep", True),
        ParamDef("w_gate", (L, D, F), "col", True),
        ParamDef("w_up", (L, D, F), "col", True),
        ParamDef("w_down", (L, F, D), "row", True),
        ParamDef("final_norm", (D,), "rep"),
        ParamDef("lm_head", (D, V), "head", fsdp_dim=1),
    ]
    return defs


def attention_block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """RMSNorm, q/k/v (column-parallel, GQA heads over tp), RoPE, attention, o (row-parallel)."""
    b = x.shape[0]
    h = enter_tp(rms_norm(x, p["attn_norm"]), par)
    s = h.shape[1]
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
    if cfg.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if cfg.qk_norm:
        q = rms_norm_tp(q, p["q_norm"], par)
        k = rms_norm_tp(k, p["k_norm"], par)
    q = q.reshape(b, s, -1, cfg.head_dim)
    k = k.reshape(b, s, -1, cfg.head_dim)
    v = v.reshape(b, s, -1, cfg.head_dim)
    if cfg.head_norm:
        q = rms_norm(q, p["q_head_norm"])
        k = rms_norm(k, p["k_head_norm"])
    pos = positions(par, s)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    a = context_attention(q, k, v, pos, par).reshape(b, s, -1)
    return exit_tp(a @ p["wo"], par)


def mlp_block(p: dict, x: Array, par: Par) -> Array:
    """RMSNorm and SwiGLU MLP (gate/up column-parallel, down row-parallel)."""
    h = enter_tp(rms_norm(x, p["mlp_norm"]), par)
    return exit_tp((silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], par)


def block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    x = x + attention_block(p, x, cfg, par)
    return x + mlp_block(p, x, par)


def stack(params: dict, x: Array, cfg: Config, par: Par, scan: bool = False,
          block_fn=None) -> Array:
    layer_fn = block_fn or block
    return run_layers(lambda p, h: layer_fn(p, h, cfg, par), x, params, param_defs(cfg),
                      cfg.n_layers, par, scan)


def hidden(params: dict, tokens: Array, cfg: Config, par: Par, scan: bool = False) -> Array:
    x = embed(params["wte"], tokens, par)
    x = stack(params, x, cfg, par, scan)
    return rms_norm(x, params["final_norm"])


def logits(params: dict, h: Array, par: Par) -> Array:
    h = enter_tp(h, par) if par.vocab else h
    return h @ params["lm_head"]


def forward(params: dict, tokens: Array, cfg: Config, par: Par, scan: bool = False) -> Array:
    return logits(params, hidden(params, tokens, cfg, par, scan), par)


def token_losses(params: dict, tokens: Array, targets: Array, cfg: Config, par: Par,
                 scan: bool = False) -> Array:
    return cross_entropy(forward(params, tokens, cfg, par, scan), targets, par)
