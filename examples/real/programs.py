"""Build (reference, shard_map body) pairs from a model, a task and a parallel layout.

The reference is the model under `Par()`; the body is the *same code* under the sharded `Par`,
so the two differ exactly by the collectives and the local shapes. Tasks:

* `stack`: hidden states through the transformer layers (no embedding, no gather);
* `stack_sgd`: the layers trained one SGD step on 0.5 * mean((stack(x) - y)^2) (under sequence
  parallelism each device's share of the mean is over its own rows, then psum'd);
* `fwd`: tokens -> logits (embedding lookup, layers, final norm, LM head);
* `loss`: tokens, targets -> mean cross-entropy;
* `sgd` / `adamw`: tokens, targets (+ AdamW moments) -> loss and updated parameters (and
  moments), gradients by `jax.value_and_grad` inside shard_map, synchronised, optionally clipped.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .models import gpt2, llama, moe, train
from .models.config import GPT2, LLAMA3, LLAMA3_QK_NORM, MOE, QWEN2, QWEN3_HEAD_NORM, Config
from .models.par import Par
from .models.params import ParamDef, spec, unflatten, unshard

MODELS: dict[str, tuple[object, Config]] = {
    "gpt2": (gpt2, GPT2),
    "llama3": (llama, LLAMA3),
    "qwen2": (llama, QWEN2),
    "moe": (moe, MOE),
    "llama3qkn": (llama, LLAMA3_QK_NORM),  # OLMo-2 style QK-norm over the whole projection
    "qwen3": (llama, QWEN3_HEAD_NORM),  # per-head QK-norm with a shared head_dim weight
}


class Variant:
    """A model with some functions replaced (buggy twins, unusual but correct programs).

    Attributes not set fall back to `base` (a model module); `loss_and_grads` and `clip` may
    replace the training-step functions of `train`.
    """

    def __init__(self, base, **replaced):
        self.base = base
        self.__dict__.update(replaced)
        self.__name__ = base.__name__ + "+" + "+".join(sorted(replaced))

    def __getattr__(self, name):
        return getattr(self.base, name)


@dataclass(frozen=True)
class ArgDef:
    """One argument of a program: global shape, dtype, how to draw it, and its layout."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" or "int32"
    kind: str  # "weight", "gain", "bias", "tokens", "data", "large", "mask", "moment",
    #            "second_moment"
    spec: P
    high: int = 0  # tokens are drawn from [0, high)
    fan_in: int = 1


def _axes(*names) -> object:
    names = tuple(n for n in names if n)
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def batch_spec(par: Par) -> object:
    return _axes(par.dp, par.fsdp, par.ep)


def token_spec(par: Par) -> P:
    return P(batch_spec(par), _axes(par.cp))


def hidden_spec(par: Par) -> P:
    seq = _axes(par.cp, par.tp if par.sp else None)
    return P(batch_spec(par), seq, None)


def logits_spec(par: Par) -> P:
    return P(batch_spec(par), _axes(par.cp), par.tp if par.vocab else None)


def param_kind(pd: ParamDef) -> str:
    core = pd.shape[1:] if pd.stacked else pd.shape
    if len(core) >= 2:
        return "weight"
    return "gain" if "norm" in pd.name or pd.name.endswith("_g") else "bias"


def param_args(defs: list[ParamDef], par: Par, prefix: str = "") -> list[ArgDef]:
    return [ArgDef(prefix + pd.name, pd.shape, "float32",
                   "moment" if prefix == "m_" else "second_moment" if prefix == "v_"
                   else param_kind(pd), spec(pd, par), fan_in=pd.fan_in) for pd in defs]


def program_params(mod, cfg: Config, task: str) -> list[ParamDef]:
    """The parameters a task takes: the stacked layer parameters only for `stack*` tasks."""
    defs = mod.param_defs(cfg)
    return [pd for pd in defs if pd.stacked] if task.startswith("stack") else defs


@functools.cache
def program_fn(mod, cfg: Config, task: str, par: Par, scan: bool, clip: bool) -> Callable:
    """The flat-argument program of `task` under `par` (cached: equal references are shared)."""
    defs = program_params(mod, cfg, task)
    n = len(defs)
    loss_and_grads = getattr(mod, "loss_and_grads", train.loss_and_grads)
    clip_grads = getattr(mod, "clip", train.clip)

    def train_step(loss_fn, raw: dict):
        loss, grads = loss_and_grads(loss_fn, raw, defs, par)
        if clip:
            grads = clip_grads(grads, defs, par)
        return loss, grads

    def program(*args):
        raw = unflatten(defs, args[:n])
        rest = args[n:]
        if task in ("stack", "fwd"):
            params = global_params(raw, defs, par)
            run = mod.stack if task == "stack" else mod.forward
            return run(params, rest[0], cfg, par, scan)
        if task == "stack_sgd":
            x, y = rest

            def stack_loss(p):
                h = mod.stack(p, x, cfg, par, scan)
                loss = 0.5 * jnp.mean(jnp.square(h - y))
                # Sequence parallel: this device holds 1/tp of the rows; its share of the mean.
                return loss / lax.axis_size(par.tp) if par.sp else loss

            loss, grads = train_step(stack_loss, raw)
            if par.sp:
                loss = lax.psum(loss, par.tp)
            new = train.sgd(raw, grads)
            return loss, named(new, defs)
        tok, tgt = rest[0], rest[1]

        def lm_loss(p):
            p = global_params(p, defs, par)
            return jnp.mean(mod.token_losses(p, tok, tgt, cfg, par, scan))

        if task == "loss":
            return train.average_loss(lm_loss(raw), par)
        loss, grads = train_step(lm_loss, raw)
        if task == "sgd":
            new = train.sgd(raw, grads)
            return loss, named(new, defs)
        m = unflatten(defs, rest[2:2 + n])
        v = unflatten(defs, rest[2 + n:2 + 2 * n])
        new, new_m, new_v = train.adamw(raw, grads, m, v)
        return loss, named(new, defs), named(new_m, defs), named(new_v, defs)

    program.__name__ = f"{mod.__name__.split('.')[-1]}_{task}"
    program.par, program.cfg = par, cfg
    return program


def named(values: dict, defs: list[ParamDef]) -> tuple:
    """The updated parameters as a named tuple: jax records each result's pytree path
    (`jax.result_info = "result[1].attn_norm"`), so a diagnostic about a result names the
    parameter instead of a position. (A named tuple, not a dict: out_specs must be hashable.)"""
    return params_tuple(tuple(pd.name for pd in defs))(*[values[pd.name] for pd in defs])


@functools.cache
def params_tuple(names: tuple[str, ...]) -> type:
    """One named-tuple class per parameter list (cached: jax compares pytree node types)."""
    return collections.namedtuple("Params", names)


@dataclass(frozen=True)
class Built:
    reference: Callable
    body: Callable
    args: tuple[ArgDef, ...]
    out_specs: object
    check_vma: bool


def global_params(params: dict, defs: list[ParamDef], par: Par) -> dict:
    """FSDP: gather the non-layer parameters once (layers gather theirs in `run_layers`)."""
    if not par.fsdp:
        return params
    flat = [pd for pd in defs if not pd.stacked]
    return {**params, **unshard({pd.name: params[pd.name] for pd in flat}, flat, par)}


def build(model: str, task: str, par: Par, *, scan: bool = False, clip: bool = False,
          cfg: Config | None = None, mod=None) -> Built:
    """The reference and body of one program (see the module docstring for `task`)."""
    default_mod, default_cfg = MODELS[model]
    mod = mod or default_mod
    cfg = cfg or default_cfg
    defs = program_params(mod, cfg, task)
    B, S, D = cfg.batch, cfg.seq, cfg.d_model
    tokens = [ArgDef("tokens", (B, S), "int32", "tokens", token_spec(par), high=cfg.vocab)]
    targets = [ArgDef("targets", (B, S), "int32", "tokens", token_spec(par), high=cfg.vocab)]

    args = param_args(defs, par)
    pspecs = tuple(a.spec for a in args)
    if task == "stack":
        args += [ArgDef("x", (B, S, D), "float32", "data", hidden_spec(par))]
        out = hidden_spec(par)
    elif task == "stack_sgd":
        args += [ArgDef("x", (B, S, D), "float32", "data", hidden_spec(par)),
                 ArgDef("y", (B, S, D), "float32", "data", hidden_spec(par))]
        out = (P(), _by_name(defs, pspecs))
    elif task == "fwd":
        args += tokens
        out = logits_spec(par)
    elif task == "loss":
        args += tokens + targets
        out = P()
    elif task == "sgd":
        args += tokens + targets
        out = (P(), _by_name(defs, pspecs))
    elif task == "adamw":
        args += tokens + targets + param_args(defs, par, "m_") + param_args(defs, par, "v_")
        specs = _by_name(defs, pspecs)
        out = (P(), specs, specs, specs)
    else:
        raise ValueError(task)
    return Built(program_fn(mod, cfg, task, Par(), scan, clip),
                 program_fn(mod, cfg, task, par, scan, clip), tuple(args), out, par.check_vma)


def _by_name(defs: list[ParamDef], specs: tuple) -> tuple:
    return params_tuple(tuple(pd.name for pd in defs))(*specs)


__all__ = [
    "MODELS",
    "ArgDef",
    "Built",
    "batch_spec",
    "build",
    "hidden_spec",
    "jax",
    "logits_spec",
    "param_args",
    "token_spec",
]
