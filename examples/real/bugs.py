"""Buggy twins: real bugs of sharded training, each exactly one line ending in `# BUG`.

Each twin is a correct program of the corpus with one function replaced (a `Variant`): a
gradient synchronisation, a transformer block, an embedding, a norm. The replaced function is
a copy of the correct one with the one wrong line. The reference is the correct program's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from .catalog import Example, twin
from .catalog import correct_by_name as by_name
from .models import gpt2, llama, moe, train
from .models.config import Config
from .models.layers import (
    EPS,
    context_attention,
    gelu,
    layer_norm,
    rms_norm,
    rope,
    rows,
)
from .models.par import Par, axis_index, enter_tp, exit_tp, gather_seq, positions, scatter_seq
from .models.params import ParamDef, is_expert
from .programs import Variant

Array = jax.Array


# ---------------------------------------------------------------------------------------------
# Gradient synchronisation.
# ---------------------------------------------------------------------------------------------


def sync_router_not_allreduced(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """Megatron SP: only the parameters marked sequence-parallel (the norms) get their gradient
    all-reduced over tp; the MoE router is replicated too, but was not marked."""
    out = {}
    for pd in defs:
        g = grads[pd.name]
        if pd.role == "rep":  # BUG
            g = lax.psum(g, par.tp)
        out[pd.name] = g
    return out


def sync_sp_norms_not_allreduced(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """Sequence parallel without the all-reduce of the norm weights' gradients."""
    return {pd.name: grads[pd.name] for pd in defs}  # BUG


def sync_shared_head_weight_not_psummed(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """A replicated weight applied to every tp-split head (per-head QK-norm) whose gradient is
    used as computed locally: each rank only saw its own heads."""
    return {pd.name: grads[pd.name] for pd in defs}  # BUG


def sync_by_world_size(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """Gradients summed over dp but divided by the whole world size (dp x tp)."""
    world = lax.axis_size(par.dp) * lax.axis_size(par.tp)
    return {pd.name: lax.psum(grads[pd.name], par.dp) / world for pd in defs}  # BUG


def sync_cp_summed(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """dp x tp x sp: gradients averaged over dp, but only summed over the sequence ranks."""
    out = {pd.name: lax.pmean(grads[pd.name], par.dp) for pd in defs}
    return {k: lax.psum(g, par.cp) for k, g in out.items()}  # BUG


def sync_experts_averaged(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """Expert parallel: every gradient pmean'd over ep, as if experts were replicated."""
    return {pd.name: lax.pmean(grads[pd.name], par.ep) for pd in defs}  # BUG


def sync_fsdp_pmean_like_ddp(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """FSDP with DDP's habit: the reduce-scattered gradient shards are pmean'd over the fsdp
    axis, which averages the shards of different slices of the parameter together."""
    return {pd.name: lax.pmean(grads[pd.name], par.fsdp) for pd in defs}  # BUG


def loss_and_grads_double_reduction(loss_fn, params: dict, defs: list[ParamDef], par: Par):
    """jax-native DP (check_vma=True): jax already psums the gradients of the replicated
    parameters over dp; averaging them again leaves them dp times too large."""
    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads = {k: lax.pmean(g, par.dp) for k, g in grads.items()}  # BUG
    return lax.pmean(loss, par.dp), grads


def norm_counts_replicated(grads: dict, defs: list[ParamDef], par: Par) -> Array:
    """Global grad norm psum'ing every parameter's sum of squares over tp, replicated ones too."""
    return jnp.sqrt(lax.psum(sum(jnp.sum(jnp.square(g)) for g in grads.values()), par.tp))  # BUG


def norm_local_shards_only(grads: dict, defs: list[ParamDef], par: Par) -> Array:
    """Global grad norm from each rank's own shards: the split parameters' squares never psum'd."""
    total = jnp.float32(0.0)
    for g in grads.values():
        total = total + jnp.sum(jnp.square(g))  # BUG
    return jnp.sqrt(total)


def _with_sync(sync):
    return functools.partial(train.loss_and_grads, sync=sync)


# ---------------------------------------------------------------------------------------------
# Blocks.
# ---------------------------------------------------------------------------------------------


def gpt2_block_flat_mlp(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """GPT-2 block under SP with the MLP on flattened tokens (Megatron's [s*b, h] layout)."""
    b, _, d = x.shape
    h = enter_tp(layer_norm(x, p["ln1_g"], p["ln1_b"]), par)
    s = h.shape[1]
    q = (h @ p["wq"] + p["bq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"] + p["bk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"] + p["bv"]).reshape(b, s, -1, cfg.head_dim)
    a = context_attention(q, k, v, positions(par, s), par).reshape(b, s, -1)
    x = x + exit_tp(a @ p["wo"], par) + p["bo"]
    h = gather_seq(layer_norm(x, p["ln2_g"], p["ln2_b"]), par)
    t = gelu(h.reshape(-1, d) @ p["w1"] + p["b1"]) @ p["w2"]
    return x + scatter_seq(t.reshape(b, -1, d), par) + p["b2"]


def gpt2_block_gather_hidden(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """The same block gathering the hidden dim instead of the sequence before the MLP."""
    b, _, d = x.shape
    h = enter_tp(layer_norm(x, p["ln1_g"], p["ln1_b"]), par)
    s = h.shape[1]
    q = (h @ p["wq"] + p["bq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"] + p["bk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"] + p["bv"]).reshape(b, s, -1, cfg.head_dim)
    a = context_attention(q, k, v, positions(par, s), par).reshape(b, s, -1)
    x = x + exit_tp(a @ p["wo"], par) + p["bo"]
    h = lax.all_gather(layer_norm(x, p["ln2_g"], p["ln2_b"]), par.tp, axis=2, tiled=True)  # BUG
    t = gelu(h.reshape(-1, d) @ p["w1"] + p["b1"]) @ p["w2"]
    return x + lax.psum_scatter(t.reshape(b, -1, d), par.tp, scatter_dimension=1,
                                tiled=True) + p["b2"]


def _llama_block(attention_block):
    def block(p: dict, x: Array, cfg: Config, par: Par) -> Array:
        x = x + attention_block(p, x, cfg, par)
        return x + llama.mlp_block(p, x, par)

    return block


def attention_rope_restarts(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """Context parallel: RoPE positions start at 0 on every sequence shard."""
    b = x.shape[0]
    h = enter_tp(rms_norm(x, p["attn_norm"]), par)
    s = h.shape[1]
    q = (h @ p["wq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"]).reshape(b, s, -1, cfg.head_dim)
    rope_pos = jnp.arange(s)  # BUG
    q, k = rope(q, rope_pos, cfg.rope_theta), rope(k, rope_pos, cfg.rope_theta)
    a = context_attention(q, k, v, positions(par, s), par).reshape(b, s, -1)
    return exit_tp(a @ p["wo"], par)


def attention_missing_copy_to_tp(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """Megatron TP without `f` before the column-parallel q/k/v: the gradient of the block's
    input is each rank's partial sum over its own heads, never all-reduced."""
    b = x.shape[0]
    h = rms_norm(x, p["attn_norm"])
    s = h.shape[1]
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]  # BUG
    q = q.reshape(b, s, -1, cfg.head_dim)
    k = k.reshape(b, s, -1, cfg.head_dim)
    v = v.reshape(b, s, -1, cfg.head_dim)
    pos = positions(par, s)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    a = context_attention(q, k, v, pos, par).reshape(b, s, -1)
    return exit_tp(a @ p["wo"], par)


def attention_gqa_tile(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """Grouped-query attention sharing kv heads by `tile` (q head i -> kv head i % kv) where
    the checkpoint groups them by `repeat` (i -> i // group); invisible without TP only when
    there is one kv head."""
    b = x.shape[0]
    h = enter_tp(rms_norm(x, p["attn_norm"]), par)
    s = h.shape[1]
    q = (h @ p["wq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"]).reshape(b, s, -1, cfg.head_dim)
    pos = positions(par, s)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    group = q.shape[2] // k.shape[2]
    k, v = jnp.tile(k, (1, 1, group, 1)), jnp.tile(v, (1, 1, group, 1))  # BUG
    a = context_attention(q, k, v, pos, par).reshape(b, s, -1)
    return exit_tp(a @ p["wo"], par)


def attention_qk_norm_local(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    """OLMo-2 QK-norm under TP computed over the local heads only."""
    b = x.shape[0]
    h = enter_tp(rms_norm(x, p["attn_norm"]), par)
    s = h.shape[1]
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
    ms = jnp.mean(jnp.square(q), axis=-1, keepdims=True)  # BUG
    q = q * lax.rsqrt(ms + EPS) * p["q_norm"]
    k = k * lax.rsqrt(jnp.mean(jnp.square(k), axis=-1, keepdims=True) + EPS) * p["k_norm"]
    q = q.reshape(b, s, -1, cfg.head_dim)
    k = k.reshape(b, s, -1, cfg.head_dim)
    v = v.reshape(b, s, -1, cfg.head_dim)
    pos = positions(par, s)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    a = context_attention(q, k, v, pos, par).reshape(b, s, -1)
    return exit_tp(a @ p["wo"], par)


def ring_attention_wrong_direction(q: Array, k: Array, v: Array, q_pos: Array,
                                   par: Par) -> Array:
    """Ring attention sending K/V to the previous rank while the positions assume the next."""
    n = lax.axis_size(par.cp)
    me = lax.axis_index(par.cp)
    s_l = k.shape[1]
    rep = q.shape[2] // k.shape[2]
    perm = [(i, (i - 1) % n) for i in range(n)]
    b, _, h, d = q.shape
    o = jnp.zeros(q.shape, q.dtype)
    m = jnp.full((b, h, s_l), -jnp.inf, q.dtype)
    denom = jnp.zeros((b, h, s_l), q.dtype)
    kb, vb = k, v
    for i in range(n):
        src = (me - i) % n
        k_pos = src * s_l + jnp.arange(s_l)
        kr = jnp.repeat(kb, rep, axis=2) if rep > 1 else kb
        vr = jnp.repeat(vb, rep, axis=2) if rep > 1 else vb
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, kr) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        pr = jnp.exp(scores - m_new[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(pr, axis=-1)
        o = o * jnp.swapaxes(corr, 1, 2)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", pr, vr)
        m = m_new
        kb, vb = lax.ppermute(kb, par.cp, perm), lax.ppermute(vb, par.cp, perm)  # BUG
    return o / jnp.swapaxes(denom, 1, 2)[..., None]


def attention_ring_wrong_direction(p: dict, x: Array, cfg: Config, par: Par) -> Array:
    b = x.shape[0]
    h = rms_norm(x, p["attn_norm"])
    s = h.shape[1]
    q = (h @ p["wq"]).reshape(b, s, -1, cfg.head_dim)
    k = (h @ p["wk"]).reshape(b, s, -1, cfg.head_dim)
    v = (h @ p["wv"]).reshape(b, s, -1, cfg.head_dim)
    pos = positions(par, s)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    return ring_attention_wrong_direction(q, k, v, pos, par).reshape(b, s, -1) @ p["wo"]


# ---------------------------------------------------------------------------------------------
# Embedding.
# ---------------------------------------------------------------------------------------------


def gpt2_forward_embed_rs_then_ar(params: dict, tokens: Array, cfg: Config, par: Par,
                                  scan: bool = False) -> Array:
    """GPT-2 under SP whose vocab-parallel embedding is reduce-scattered along the sequence and
    then all-reduced as well (the non-SP all-reduce left in place)."""
    wte = params["wte"]
    vl = wte.shape[0]
    start = axis_index(par.tp) * vl
    outside = (tokens < start) | (tokens >= start + vl)
    found = jnp.take(wte, jnp.where(outside, 0, tokens - start), axis=0)
    found = jnp.where(outside[..., None], 0.0, found)
    x = lax.psum(lax.psum_scatter(found, par.tp, scatter_dimension=1, tiled=True), par.tp)  # BUG
    x = x + rows(params["wpe"], gpt2.row_offset(par, x.shape[1]), x.shape[1])
    x = gpt2.stack(params, x, cfg, par, scan)
    return gpt2.logits(params, layer_norm(x, params["lnf_g"], params["lnf_b"]), par)


# ---------------------------------------------------------------------------------------------
# The twins.
# ---------------------------------------------------------------------------------------------


# Bugs that leave something out: their `# BUG` line (a synchronisation that skips some
# gradients) emits no op of its own, so no diagnostic can point at it.
OMISSIONS = {"router_grad_not_allreduced", "norm_grads_not_allreduced",
             "shared_head_weight_grad_not_psummed"}


def _stack_with(base, block) -> Variant:
    return Variant(base, stack=functools.partial(base.stack, block_fn=block))


def buggy_programs() -> list[Example]:
    out = [
        twin(by_name("moe_stack_sgd_sp_tp4"), "router_grad_not_allreduced",
             Variant(moe, loss_and_grads=_with_sync(sync_router_not_allreduced)),
             "Megatron MoE under SP: the router's gradient is not all-reduced over tp",
             sync_router_not_allreduced),
        twin(by_name("llama3_stack_sgd_sp_tp4"), "norm_grads_not_allreduced",
             Variant(llama, loss_and_grads=_with_sync(sync_sp_norms_not_allreduced)),
             "Sequence parallel: RMSNorm weight gradients not all-reduced over tp",
             sync_sp_norms_not_allreduced),
        twin(by_name("qwen3_stack_sgd_tp4"), "shared_head_weight_grad_not_psummed",
             Variant(llama, loss_and_grads=_with_sync(sync_shared_head_weight_not_psummed)),
             "Per-head QK-norm weight (replicated, applied to tp-split heads) whose gradient "
             "is not psum'd over tp", sync_shared_head_weight_not_psummed),
        twin(by_name("llama3_stack_sgd_dp2_tp4"), "grads_scaled_by_world_size",
             Variant(llama, loss_and_grads=_with_sync(sync_by_world_size)),
             "Gradients summed over dp and divided by the world size instead of dp",
             sync_by_world_size),
        twin(by_name("llama3_stack_sgd_dp2_tp2_sp2"), "grads_summed_over_sp",
             Variant(llama, loss_and_grads=_with_sync(sync_cp_summed)),
             "dp x tp x sp: gradients summed over the sequence-parallel ranks (loss x sp)",
             sync_cp_summed),
        twin(by_name("moe_stack_sgd_ep4"), "expert_grads_averaged_over_ep",
             Variant(moe, loss_and_grads=_with_sync(sync_experts_averaged)),
             "Expert parallel: expert gradients pmean'd over ep, mixing different experts",
             sync_experts_averaged),
        twin(by_name("llama3_stack_sgd_fsdp4"), "fsdp_grad_shards_averaged",
             Variant(llama, loss_and_grads=_with_sync(sync_fsdp_pmean_like_ddp)),
             "FSDP: gradient shards pmean'd over the fsdp axis as DDP would (mixes shards)",
             sync_fsdp_pmean_like_ddp),
        twin(by_name("llama3_stack_sgd_native_dp4"), "grads_reduced_twice",
             Variant(llama, loss_and_grads=loss_and_grads_double_reduction),
             "jax-native DP: gradients pmean'd after jax already psum'd them",
             loss_and_grads_double_reduction),
        twin(by_name("llama3_stack_sgd_clip_tp4"), "grad_norm_counts_replicated",
             Variant(llama, clip=functools.partial(train.clip, norm=norm_counts_replicated)),
             "Gradient clipping whose global norm counts replicated parameters tp times",
             norm_counts_replicated),
        twin(by_name("gpt2_stack_flatmlp_sp_tp4"), "all_gather_wrong_dim",
             _stack_with(gpt2, gpt2_block_gather_hidden),
             "Sequence parallel: all_gather along hidden instead of sequence before the MLP",
             gpt2_block_gather_hidden),
        twin(by_name("llama3_stack_cp4"), "rope_positions_restart",
             _stack_with(llama, _llama_block(attention_rope_restarts)),
             "Context parallel: RoPE positions restart at 0 on every sequence shard",
             attention_rope_restarts),
        twin(by_name("llama3_stack_sgd_tp4"), "missing_copy_to_tp",
             _stack_with(llama, _llama_block(attention_missing_copy_to_tp)),
             "Megatron TP: no all-reduce of the gradient of the column-parallel input (f)",
             attention_missing_copy_to_tp),
        twin(by_name("llama3_stack_tp4"), "gqa_heads_tiled",
             _stack_with(llama, _llama_block(attention_gqa_tile)),
             "GQA under TP: kv heads shared by tile instead of repeat (wrong head grouping)",
             attention_gqa_tile),
        twin(by_name("llama3_stack_sgd_clip_tp4"), "grad_norm_local_shards",
             Variant(llama, clip=functools.partial(train.clip, norm=norm_local_shards_only)),
             "Gradient clipping by the norm of each rank's own shards (no psum over tp)",
             norm_local_shards_only),
        twin(by_name("llama3qkn_stack_tp4"), "qk_norm_local_heads",
             _stack_with(llama, _llama_block(attention_qk_norm_local)),
             "QK-norm over the local heads only", attention_qk_norm_local),
        twin(by_name("llama3_stack_ring_cp4"), "ring_wrong_direction",
             _stack_with(llama, _llama_block(attention_ring_wrong_direction)),
             "Ring attention passing K/V the wrong way round the ring",
             ring_attention_wrong_direction),
        twin(by_name("gpt2_fwd_sp_tp4"), "embedding_reduce_scatter_then_all_reduce",
             Variant(gpt2, forward=gpt2_forward_embed_rs_then_ar),
             "SP: embedding reduce-scattered, then all-reduced again", gpt2_forward_embed_rs_then_ar),
    ]
    from .accum import accum_programs
    from .ce import ce_programs

    return out + ce_programs()[1] + accum_programs()[1]


__all__ = ["OMISSIONS", "buggy_programs", "gpt2_block_flat_mlp", "is_expert"]
