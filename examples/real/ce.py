"""Vocab-parallel cross-entropy on its own: logits and (soft) labels in, mean loss out.

Labels are distributions over the vocabulary (one-hot or label-smoothed), as
`optax.softmax_cross_entropy` takes them, so the vocab-split labels line up with the vocab-split
logits and no index arithmetic is needed. Correct, tricky-but-correct, and buggy variants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .catalog import Example, custom
from .programs import ArgDef

TP = "tp"
B, S, V = 8, 16, 64
MESH = (("tp", 4),)
SPLIT = P(None, None, TP)


def ce_ref(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy with a max-subtracted log-sum-exp, mean over tokens."""
    m = jnp.max(logits, axis=-1, keepdims=True)
    lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[..., 0]
    return jnp.mean(lse - jnp.sum(labels * logits, axis=-1))


def ce_vocab_parallel(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Megatron's vocab-parallel cross-entropy: pmax, psum of exp-sums, psum of target logit."""
    m = lax.pmax(jnp.max(logits, axis=-1, keepdims=True), TP)
    sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), TP)
    target = lax.psum(jnp.sum(labels * logits, axis=-1), TP)
    return jnp.mean(jnp.log(sum_exp) + m[..., 0] - target)


def ce_local_max(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Each shard stabilises with its own max, then exp(m_local) undoes the shift before the
    psum: equal in exact arithmetic, but exp(m_local) overflows for logits above ~88 in
    float32 where the reference's max-shifted log-sum-exp stays finite."""
    m = jnp.max(logits, axis=-1, keepdims=True)  # a pmax is missing  # BUG
    sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1) * jnp.exp(m[..., 0]), TP)
    target = lax.psum(jnp.sum(labels * logits, axis=-1), TP)
    return jnp.mean(jnp.log(sum_exp) - target)


def ce_no_max(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """No max subtraction at all (the reference subtracts it; equal in exact arithmetic,
    but exp(logits) overflows for logits above ~88 in float32)."""
    sum_exp = lax.psum(jnp.sum(jnp.exp(logits), axis=-1), TP)  # BUG
    target = lax.psum(jnp.sum(labels * logits, axis=-1), TP)
    return jnp.mean(jnp.log(sum_exp) - target)


def ce_on_replicated_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The vocab-parallel CE applied to logits that are NOT vocab-split (replicated head)."""
    m = lax.pmax(jnp.max(logits, axis=-1, keepdims=True), TP)
    sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), TP)  # BUG
    target = jnp.sum(labels * logits, axis=-1)
    return jnp.mean(jnp.log(sum_exp) + m[..., 0] - target)


def _args(spec: P, logits: str = "data") -> tuple[ArgDef, ...]:
    """`logits="large"` draws logits of magnitude ~100, where exp overflows in float32."""
    return (ArgDef("logits", (B, S, V), "float32", logits, spec),
            ArgDef("labels", (B, S, V), "float32", "mask", spec))


def ce_programs() -> tuple[list[Example], list[Example]]:
    """(correct programs, buggy programs)."""
    correct = [
        custom("ce_vocab_parallel", MESH, ce_ref, ce_vocab_parallel, _args(SPLIT), P(),
               "Vocab-parallel cross-entropy (pmax, psum of exp-sums, psum of target logit)",
               model="ce", style="tp + vocab", task="loss"),
    ]
    buggy = [
        custom("ce_local_max", MESH, ce_ref, ce_local_max, _args(SPLIT, "large"), P(),
               "Vocab-parallel CE with a per-shard max undone by exp(m) before the psum: "
               "overflows where the reference does not", model="ce", style="tp + vocab",
               task="loss", bug="ce_local_max_overflows", bug_fn=ce_local_max),
        custom("ce_no_max", MESH, ce_ref, ce_no_max, _args(SPLIT, "large"), P(),
               "Vocab-parallel CE without max subtraction: overflows where the reference "
               "does not", model="ce", style="tp + vocab", task="loss",
               bug="ce_no_max_overflows", bug_fn=ce_no_max),
        custom("ce_replicated_logits", MESH, ce_ref, ce_on_replicated_logits, _args(P()), P(),
               "Vocab-parallel CE on replicated logits: the exp-sum is psum'd over copies "
               "(loss + log tp)", model="ce", style="tp + vocab", task="loss",
               bug="vocab_ce_on_replicated_logits", bug_fn=ce_on_replicated_logits),
    ]
    return correct, buggy
