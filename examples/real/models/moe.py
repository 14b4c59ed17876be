"""Mixture of experts: Llama attention blocks with a top-k routed SwiGLU MoE MLP.

Tokens are dispatched densely (each expert receives every local token, masked by the routing
decision, so no token is ever dropped and the sharded program computes exactly the reference);
under expert parallelism the (expert, token, d) dispatch tensor goes through all_to_all over
`ep` (experts split, tokens gathered), the local experts run, and a second all_to_all returns
the outputs to the tokens' devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .config import Config
from .layers import cross_entropy, embed, rms_norm, silu
from .llama import attention_block
from .par import Par, enter_tp, exit_tp
from .params import ParamDef, run_layers

Array = jax.Array


def param_defs(cfg: Config) -> list[ParamDef]:
    L, D, F, V, E = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab, cfg.n_experts
    Q, KV = cfg.q_width, cfg.kv_width
    return [
        ParamDef("wte", (V, D), "embed"),
        ParamDef("attn_norm", (L, D), "rep", True),
        ParamDef("wq", (L, D, Q), "col", True),
        ParamDef("wk", (L, D, KV), "col", True),
        ParamDef("wv", (L, D, KV), "col", True),
        ParamDef("wo", (L, Q, D), "row", True),
        ParamDef("mlp_norm", (L, D), "rep", True),
        ParamDef("router", (L, D, E), "router", True),
        ParamDef("e_gate", (L, E, D, F), "expert_col", True),
        ParamDef("e_up", (L, E, D, F), "expert_col", True),
        ParamDef("e_down", (L, E, F, D), "expert_row", True),
        ParamDef("final_norm", (D,), "rep"),
        ParamDef("lm_head", (D, V), "head", fsdp_dim=1),
    ]


def route(t: Array, router: Array, k: int) -> tuple[Array, Array]:
    """Top-k routing: (dispatch mask, combine weights), both (tokens, experts)."""
    scores = t @ router
    top_vals, top_idx = lax.top_k(scores, k)
    gates = jax.nn.softmax(top_vals, axis=-1)
    chosen = (top_idx[..., None] == jnp.arange(router.shape[-1])).astype(t.dtype)
    dispatch = jnp.sum(chosen, axis=1)
    combine = jnp.sum(gates[..., None] * chosen, axis=1)
    return dispatch, combine


def dispatch_tokens(xe: Array, par: Par) -> Array:
    """(experts, local tokens, d) -> (local experts, tokens of every ep rank, d)."""
    if not par.ep:
        return xe
    return lax.all_to_all(xe, par.ep, split_axis=0, concat_axis=1, tiled=True)


def return_tokens(ye: Array, par: Par) -> Array:
    """(local experts, tokens of every ep rank, d) -> (experts, local tokens, d)."""
    if not par.ep:
        return ye
    return lax.all_to_all(ye, par.ep, split_axis=1, concat_axis=0, tiled=True)


def experts(p: dict, xe: Array, par: Par) -> Array:
    """SwiGLU per expert on (local experts, tokens, d); F split over tp (psum at the end).

    Under sequence parallelism each tp rank routes its own tokens and the experts are not split
    over tp (Megatron's expert tensor parallel size 1).
    """
    if par.sp:
        par = par.with_(tp=None, sp=False)
    xe = enter_tp(xe, par)
    g = jnp.einsum("etd,edf->etf", xe, p["e_gate"])
    u = jnp.einsum("etd,edf->etf", xe, p["e_up"])
    return exit_tp(jnp.einsum("etf,efd->etd", silu(g) * u, p["e_down"]), par)


def moe_block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    b, s, d = x.shape
    t = rms_norm(x, p["mlp_norm"]).reshape(-1, d)
    dispatch, combine = route(t, p["router"], cfg.top_k)
    xe = jnp.einsum("te,td->etd", dispatch, t)
    ye = return_tokens(experts(p, dispatch_tokens(xe, par), par), par)
    return jnp.einsum("te,etd->td", combine, ye).reshape(b, s, d)


def block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    x = x + attention_block(p, x, cfg, par)
    return x + moe_block(p, x, cfg, par)


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
