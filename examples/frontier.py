"""Frontier-model programs (issue 21): Llama-3-70B / 405B widths and a DeepSeek-V3-like MoE,
at any width (the benchmark lowers them with abstract shapes; the tests run them tiny).

* `dense_step(cfg, dp, tp)`: the whole Llama-3 model (vocab-parallel embedding, LM head and
  cross-entropy over tp, Megatron attention and SwiGLU MLP) forward + backward + AdamW on a
  dp x tp mesh (examples/real's `llama3 adamw` program at `cfg`'s widths).
  `changed_layer=k`: its buggy twin, where layer k (and only it) feeds the gate projection's
  weight to the up projection (`h @ w_gate` for `h @ w_up`).
* `pipeline_step(cfg, dp, pp, tp, micro)`: the layer stack trained by the 1F1B schedule of
  examples/pipelines.py on dp x pp x tp (stage weights `P('pp', ...)`, Megatron attention and
  MLP over tp inside a stage, the micro-batches' rows split over dp), an MSE loss on the last
  stage and an Adam-like update of every stage's layers: no embedding or loss head.
* `deepseek_step(cfg, mla, ep)`: a DeepSeek-V3-like MoE stack forward + backward + SGD on
  an ep mesh: multi-head latent attention (low-rank q and compressed kv, decoupled RoPE
  dims), routed SwiGLU experts split over ep with all_to_all dispatch (top-k of
  `cfg.n_experts`, dense dispatch: no token dropped) plus one shared expert; every layer is
  MoE (V3's first three dense layers left out).

Widths: `LLAMA_70B`, `LLAMA_405B`, `DEEPSEEK_V3` (+ `DEEPSEEK_V3_MLA`), and `tiny(cfg)`
(tests/examples/test_frontier.py runs them tiny).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from examples import pipelines
from examples.heldout.corpus import f32
from examples.heldout.corpus import program as corpus_program
from examples.real.catalog import Example, program, twin
from examples.real.models import llama, moe
from examples.real.models.config import Config
from examples.real.models.layers import attention, cross_entropy, embed, rms_norm, rope, silu
from examples.real.models.par import Par, enter_tp, exit_tp, positions
from examples.real.models.params import ParamDef, layer, run_layers, unshard
from examples.real.programs import Variant

LLAMA_70B = Config(batch=2, seq=128, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                   d_ff=28672, vocab=128256, n_layers=80)
LLAMA_405B = Config(batch=2, seq=128, d_model=16384, n_heads=128, n_kv_heads=8, head_dim=128,
                    d_ff=53248, vocab=128256, n_layers=126)
DEEPSEEK_V3 = Config(batch=64, seq=16, d_model=7168, n_heads=128, n_kv_heads=128,
                     head_dim=128, d_ff=2048, vocab=129280, n_layers=61, n_experts=256,
                     top_k=8)


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention widths (DeepSeek-V3's)."""

    q_rank: int = 1536
    kv_rank: int = 512
    nope: int = 128  # per-head q/k dims without RoPE
    rope: int = 64  # per-head q/k dims with RoPE (k's shared by all heads)
    v: int = 128  # per-head value dims
    shared_ff: int = 2048  # the shared expert's hidden width


DEEPSEEK_V3_MLA = MLA()


def tiny(cfg: Config, layers: int = 2) -> Config:
    """`cfg`'s structure at test widths: heads and kv heads divide by 8, small everything."""
    gqa = min(cfg.n_heads // cfg.n_kv_heads, 2)
    return replace(cfg, seq=8, d_model=32, n_heads=8 * gqa, n_kv_heads=8, head_dim=4, d_ff=64,
                   vocab=64, n_layers=layers,
                   n_experts=min(cfg.n_experts, 16))


TINY_MLA = MLA(q_rank=16, kv_rank=8, nope=4, rope=4, v=4, shared_ff=16)


# ----- the dense model on dp x tp, and its changed-layer twin --------------------------------

def dense_step(cfg: Config, dp: int, tp: int, changed_layer: int | None = None) -> Example:
    """Llama-3 forward + backward + AdamW with vocab-parallel embedding and loss, dp x tp."""
    ex = program("llama3", "adamw", Par(dp="dp", tp="tp", vocab=True),
                 (("dp", dp), ("tp", tp)), "dp x tp", cfg=replace(cfg, batch=dp))
    if changed_layer is None:
        return ex
    stack = functools.partial(stack_changing_layer, changed_layer)
    mod = Variant(llama, stack=stack,
                  token_losses=functools.partial(token_losses_with, stack))
    return twin(ex, f"layer{changed_layer}_up_from_gate", mod,
                f"layer {changed_layer} of {cfg.n_layers} multiplies by w_gate where its "
                "reference uses w_up", changed_mlp)


def changed_mlp(p: dict, x, par: Par):
    """A SwiGLU MLP whose up projection uses the gate's weight."""
    h = enter_tp(rms_norm(x, p["mlp_norm"]), par)
    return exit_tp((silu(h @ p["w_gate"]) * (h @ p["w_gate"])) @ p["w_down"], par)  # BUG


def stack_changing_layer(changed: int, params: dict, x, cfg: Config, par: Par,
                         scan: bool = False, block_fn=None):
    """Llama's layer stack with layer `changed`'s MLP replaced by `changed_mlp`."""
    defs = llama.param_defs(cfg)
    for i in range(cfg.n_layers):
        p = unshard(layer(params, defs, i), defs, par)
        x = x + llama.attention_block(p, x, cfg, par)
        x = x + (changed_mlp(p, x, par) if i == changed else llama.mlp_block(p, x, par))
    return x


def token_losses_with(stack, params: dict, tokens, targets, cfg: Config, par: Par,
                      scan: bool = False):
    """Llama's token losses with its layer stack replaced by `stack`."""
    x = stack(params, embed(params["wte"], tokens, par), cfg, par, scan)
    return cross_entropy(llama.logits(params, rms_norm(x, params["final_norm"]), par), targets,
                         par)


# ----- the layer stack pipelined on dp x pp x tp ----------------------------------------------

LAYER_PARAMS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


MLP_PARAMS = ("mlp_norm", "w_gate", "w_up", "w_down")


def stage_block(cfg: Config, tp: str | None, attention: bool = True, mlp=None):
    """One Llama layer on a list of its params (`LAYER_PARAMS` order; `MLP_PARAMS` without
    attention), Megatron tp over `tp` with plain lax collectives (jax's varying types insert
    the gradients' psums); `mlp`: the MLP block in place of Llama's."""
    par = Par(tp=tp, megatron=False)
    mlp_block = mlp or llama.mlp_block

    def block(p, x):
        """On (..., seq, d): the reference runs every micro-batch at once."""
        flat = x.reshape(-1, *x.shape[-2:])
        if attention:
            layer = dict(zip(LAYER_PARAMS, p, strict=True))
            flat = flat + llama.attention_block(layer, flat, cfg, par)
            out = flat + mlp_block(layer, flat, par)
        else:
            out = flat + mlp_block(dict(zip(MLP_PARAMS, p, strict=True)), flat, par)
        return out.reshape(x.shape)
    return block


def mlp_without_psum(p: dict, x, par: Par):
    """A SwiGLU MLP whose row-parallel output is not summed over tp."""
    h = enter_tp(rms_norm(x, p["mlp_norm"]), par)
    return (silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]  # BUG


def stage_changing_layer(changed: int, changed_block, block, params, x):
    """A stage's layers (`pipelines.run_layers`) where global layer `changed` (stage s holds
    layers s * k ... s * k + k - 1) runs `changed_block` in place of `block`."""
    stage, per = lax.axis_index("pp"), params[0].shape[0]
    for i in range(per):
        p = pipelines.layer(params, i)
        x = jnp.where(stage * per + i == changed, changed_block(p, x), block(p, x))
    return x


PIPELINE_TWINS = {
    "bubble_unmasked": ({"bubble": pipelines.unmasked}, pipelines.unmasked),
    "gradients_to_a_wrong_stage": ({"back": pipelines.shift_skipping_a_stage},
                                   pipelines.shift_skipping_a_stage),
    "backward_microbatch_off_by_one": ({"bslot": pipelines.backward_slot_off_by_one},
                                       pipelines.backward_slot_off_by_one),
    "stage_mlp_without_psum": ({}, mlp_without_psum),
    "middle_layer_up_from_gate": ({}, changed_mlp),
}
"""`pipeline_step`'s buggy twins: the schedule's keywords and the function holding the
`# BUG` line (`stage_mlp_without_psum`: the stage's MLP misses its tp psum;
`middle_layer_up_from_gate`: layer L // 2 of the stack, and only it, multiplies by w_gate
where w_up belongs, `stage_changing_layer`: the pipeline analogue of `dense_step`'s
`changed_layer`). Each is lowered with shard_map's vma check, as the correct step is
(without it jax's transpose does not sum the replicated weights' gradients, so the step
differs from the reference before any bug), but `stage_mlp_without_psum`, whose missing
psum is what the check rejects."""


def pipeline_step(cfg: Config, dp: int, pp: int, tp: int, micro: int = 4,
                  attention: bool = True, bug: str | None = None, stage_mlp=None):
    """1F1B training step of `cfg.n_layers` Llama layers on dp x pp x tp (a corpus Example);
    `attention=False`: the layers' SwiGLU MLP blocks only (RMSNorm, residual); `bug`: one of
    `PIPELINE_TWINS`; `stage_mlp`: the stages' MLP block (`mlp_block(p, x, par)`) in place of
    Llama's in every layer (the reference keeps Llama's)."""
    L, D, F = cfg.n_layers, cfg.d_model, cfg.d_ff
    Q, KV = cfg.q_width, cfg.kv_width
    col, row, rep = P("pp", None, "tp"), P("pp", "tp", None), P("pp")
    params = [f32((L, D), rep, "weight"), f32((L, D, Q), col, "weight"),
              f32((L, D, KV), col, "weight"), f32((L, D, KV), col, "weight"),
              f32((L, Q, D), row, "weight"), f32((L, D), rep, "weight"),
              f32((L, D, F), col, "weight"), f32((L, D, F), col, "weight"),
              f32((L, F, D), row, "weight")]
    if not attention:
        params = [params[5], *params[6:]]
    rows = cfg.batch
    data = f32((micro, rows, cfg.seq, D), P(None, "dp"))
    mesh = (("dp", dp), ("pp", pp), ("tp", tp))
    specs = [a.spec for a in params]
    schedule, bug_fn = PIPELINE_TWINS[bug] if bug else ({}, None)
    mlp = mlp_without_psum if bug_fn is mlp_without_psum else stage_mlp
    if bug_fn is changed_mlp:
        schedule = {"layers": functools.partial(
            stage_changing_layer, L // 2, stage_block(cfg, "tp", attention, changed_mlp))}
    return corpus_program(
        "frontier", "onef1b_train_llama" + ("" if attention else "_mlp"), mesh,
        pipelines.train_reference_fn(stage_block(cfg, None, attention), True),
        pipelines.train_fn(pipelines.onef1b_train, stage_block(cfg, "tp", attention, mlp),
                           True, axes=("pp", "dp"), **schedule),
        [*params] * 3 + [data, data], (P(), *(tuple(specs),) * 3),
        f"1F1B training step of {L} Llama {'layers' if attention else 'MLP blocks'} on "
        "dp x pp x tp, Adam-like update", bug=bug, bug_fn=bug_fn,
        check_vma=bug_fn is not mlp_without_psum)


# ----- DeepSeek-V3-like MoE on ep --------------------------------------------------------------

class DeepSeek:
    """A model module (the interface of examples/real/models: `param_defs`, `stack`,
    `forward`, `token_losses`) for a DeepSeek-V3-like MoE stack with `mla`'s widths."""

    def __init__(self, mla: MLA):
        self.mla = mla
        self.__name__ = "deepseek"

    def param_defs(self, cfg: Config) -> list[ParamDef]:
        m, L, D, E, H = self.mla, cfg.n_layers, cfg.d_model, cfg.n_experts, cfg.n_heads
        F = cfg.d_ff
        return [
            ParamDef("wte", (cfg.vocab, D), "embed"),
            ParamDef("attn_norm", (L, D), "rep", True),
            ParamDef("wq_a", (L, D, m.q_rank), "rep", True),
            ParamDef("q_a_norm", (L, m.q_rank), "rep", True),
            ParamDef("wq_b", (L, m.q_rank, H * (m.nope + m.rope)), "rep", True),
            ParamDef("wkv_a", (L, D, m.kv_rank + m.rope), "rep", True),
            ParamDef("kv_a_norm", (L, m.kv_rank), "rep", True),
            ParamDef("wkv_b", (L, m.kv_rank, H * (m.nope + m.v)), "rep", True),
            ParamDef("wo", (L, H * m.v, D), "rep", True),
            ParamDef("mlp_norm", (L, D), "rep", True),
            ParamDef("router", (L, D, E), "router", True),
            ParamDef("e_gate", (L, E, D, F), "expert_col", True),
            ParamDef("e_up", (L, E, D, F), "expert_col", True),
            ParamDef("e_down", (L, E, F, D), "expert_row", True),
            ParamDef("s_gate", (L, D, m.shared_ff), "rep", True),
            ParamDef("s_up", (L, D, m.shared_ff), "rep", True),
            ParamDef("s_down", (L, m.shared_ff, D), "rep", True),
            ParamDef("final_norm", (D,), "rep"),
            ParamDef("lm_head", (D, cfg.vocab), "head"),
        ]

    def attention(self, p: dict, x, cfg: Config, par: Par):
        """Multi-head latent attention: q from a normed low-rank projection, k and v from a
        normed compressed kv; RoPE on separate dims, its k part shared by every head."""
        m, H = self.mla, cfg.n_heads
        b, s, _ = x.shape
        h = rms_norm(x, p["attn_norm"])
        q = (rms_norm(h @ p["wq_a"], p["q_a_norm"]) @ p["wq_b"]).reshape(b, s, H, -1)
        q_nope, q_pe = q[..., :m.nope], q[..., m.nope:]
        kv_a = h @ p["wkv_a"]
        ckv, k_pe = kv_a[..., :m.kv_rank], kv_a[..., m.kv_rank:]
        kv = (rms_norm(ckv, p["kv_a_norm"]) @ p["wkv_b"]).reshape(b, s, H, -1)
        k_nope, v = kv[..., :m.nope], kv[..., m.nope:]
        pos = positions(par, s)
        q_pe = rope(q_pe, pos, cfg.rope_theta)
        k_pe = jnp.broadcast_to(rope(k_pe[:, :, None, :], pos, cfg.rope_theta),
                                (b, s, H, m.rope))
        q = jnp.concatenate([q_nope, q_pe], axis=-1)
        k = jnp.concatenate([k_nope, k_pe], axis=-1)
        a = attention(q, k, v, pos, jnp.arange(s)).reshape(b, s, -1)
        return a @ p["wo"]

    def mlp(self, p: dict, x, cfg: Config, par: Par):
        """Routed experts (top-k, split over ep, all_to_all) plus the shared expert."""
        h = rms_norm(x, p["mlp_norm"])
        shared = (silu(h @ p["s_gate"]) * (h @ p["s_up"])) @ p["s_down"]
        return moe.moe_block(p, x, cfg, par) + shared

    def block(self, p: dict, x, cfg: Config, par: Par):
        x = x + self.attention(p, x, cfg, par)
        return x + self.mlp(p, x, cfg, par)

    def stack(self, params: dict, x, cfg: Config, par: Par, scan: bool = False, block_fn=None):
        return run_layers(lambda p, h: self.block(p, h, cfg, par), x, params,
                          self.param_defs(cfg), cfg.n_layers, par, scan)

    def forward(self, params: dict, tokens, cfg: Config, par: Par, scan: bool = False):
        x = self.stack(params, embed(params["wte"], tokens, par), cfg, par, scan)
        return moe.logits(params, rms_norm(x, params["final_norm"]), par)

    def token_losses(self, params: dict, tokens, targets, cfg: Config, par: Par,
                     scan: bool = False):
        return cross_entropy(self.forward(params, tokens, cfg, par, scan), targets, par)


@functools.cache
def deepseek_module(mla: MLA) -> DeepSeek:
    return DeepSeek(mla)


def deepseek_step(cfg: Config, mla: MLA, ep: int) -> Example:
    """The MoE layer stack forward + backward + SGD on ep (tokens and experts split)."""
    ex = program("moe", "stack_sgd", Par(ep="ep"), (("ep", ep),), "ep",
                 cfg=replace(cfg, batch=max(cfg.batch, ep)), mod=deepseek_module(mla))
    return replace(ex, name=ex.name.replace("moe_", "deepseek_", 1), model="deepseek")


__all__ = [
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_MLA",
    "LLAMA_70B",
    "LLAMA_405B",
    "MLA",
    "TINY_MLA",
    "deepseek_step",
    "dense_step",
    "pipeline_step",
    "tiny",
]
