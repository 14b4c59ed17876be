"""XLA-partitioned versions: functions jitted with shardings (mesh axes `AxisType.Auto`), whose
per-device program XLA's SPMD partitioner writes (the path of `check_partitioned`), some with a
shard_map inside as users write them (a TP matmul or the vocab-parallel embedding as a library
function called from a larger jit computation). Each follows a program of the other sources:
the shard_map notebook's TP example, the scaling book's jit examples, the training cookbook's
model, MaxText-style MoE and Ulysses written with sharding constraints.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import maxtext_style as mx
from .corpus import Example, f32, ids, program


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("xla_partitioned", prog, mesh, reference, body, args, out, what,
                   partitioned=True, **kw)


def _no_constraint(y, *spec):
    return y


def _constrainer(mesh):
    def constrain(y, *spec):
        return lax.with_sharding_constraint(y, NamedSharding(mesh, P(*spec)))
    return constrain


def _jit_form(f):
    return lambda mesh: (lambda *args: f(*args, constrain=_constrainer(mesh)))


# ----- the shard_map notebook's TP example: shard_map gemm inside a jit loss --------------------

def tp_loss_ref(w1, b1, w2, b2, inputs, targets):
    h = jax.nn.relu(inputs @ w1 + b1)
    predictions = h @ w2 + b2
    return jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))


def _gemm_tp(inputs, w, b):
    block_result = jnp.dot(inputs, w)
    return lax.psum_scatter(block_result, "feats", scatter_dimension=1, tiled=True) + b


def _gemm_tp_relu_first(inputs, w, b):
    block_result = jax.nn.relu(jnp.dot(inputs, w))  # BUG
    return lax.psum_scatter(block_result, "feats", scatter_dimension=1, tiled=True) + b


def _tp_loss(gemm):
    def build(mesh):
        spec = {"mesh": mesh, "in_specs": (P(None, "feats"), P("feats", None), P("feats")),
                    "out_specs": P(None, "feats")}
        layer = jax.shard_map(gemm, **spec)

        def loss_tp(w1, b1, w2, b2, inputs, targets):
            predictions = layer(jax.nn.relu(layer(inputs, w1, b1)), w2, b2)
            return jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))
        return loss_tp
    return build


# ----- the scaling book's jit examples ----------------------------------------------------------

def matmul(a, w, constrain=_no_constraint):
    return a @ w


def two_matmuls(x, w_in, w_out, constrain=_no_constraint):
    hidden = jnp.einsum("bd,df->bf", x, w_in)
    hidden = constrain(hidden, "x", "y")
    return jnp.einsum("bf,fd->bd", hidden, w_out)


def shard_average(a, constrain=_no_constraint):
    return a.reshape(2, -1, a.shape[1]).mean(axis=1)


# ----- the training cookbook's model (FSDP shardings, Auto mode) --------------------------------

def cookbook_loss(embedding, qkv, att_out, mlp_in, mlp_out, head, tokens, targets,
                  constrain=_no_constraint):
    out = embedding[tokens]
    out = constrain(out, "fsdp", None, None)
    skip = out
    q, k, v = (jnp.einsum("bsd,dkh->bskh", out, qkv[i]) for i in range(3))
    pos = jnp.arange(tokens.shape[1])
    scores = jnp.einsum("bqkh,bskh->bkqs", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -1e9)
    out = jnp.einsum("bkqs,bskh->bqkh", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("bskh,khd->bsd", out, att_out) + skip
    out = out * lax.rsqrt(jnp.sum(out * out, axis=-1, keepdims=True) + 1e-6)
    skip = out
    out = jax.nn.gelu(jnp.einsum("bsd,dh->bsh", out, mlp_in))
    out = constrain(out, "fsdp", None, None)
    out = jnp.einsum("bsh,hd->bsd", out, mlp_out) + skip
    logits = jnp.einsum("bsd,dl->bsl", out, head)
    labels = jax.nn.one_hot(targets, head.shape[1])
    return -(labels * jax.nn.log_softmax(logits)).mean()


def cookbook_grads(*args, constrain=_no_constraint):
    return jax.value_and_grad(cookbook_loss, argnums=tuple(range(6)))(*args, constrain=constrain)


# ----- vocab-parallel embedding (shard_map) inside a jitted model -------------------------------

def embed_mlp_ref(token_ids, table, w1, w2):
    h = table[token_ids]
    return h + jax.nn.gelu(h @ w1) @ w2


def _embed_mlp(embed):
    def build(mesh):
        lookup = jax.shard_map(embed, mesh=mesh, in_specs=(P(), P("tp", None)), out_specs=P())

        def model(token_ids, table, w1, w2):
            h = lookup(token_ids, table)
            return h + jax.nn.gelu(h @ w1) @ w2
        return model
    return build


def one_hot_lookup(token_ids, table, constrain=_no_constraint):
    """MaxText's one-hot embedding in a jitted model: the table split over the vocabulary,
    XLA partitions the one-hot's contraction."""
    return constrain(jax.nn.one_hot(token_ids, table.shape[0], dtype=table.dtype) @ table)


def one_hot_lookup_off_by_one(token_ids, table, constrain=_no_constraint):
    return constrain(jax.nn.one_hot(token_ids - 1, table.shape[0], dtype=table.dtype) @ table)  # BUG


def one_hot_pick(logits, labels, constrain=_no_constraint):
    """The cross-entropy's target logit as a one-hot pick, logits split over the vocabulary."""
    return constrain(jnp.sum(logits * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1))


def take_pick(logits, labels):
    return jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


# ----- MaxText-style layers written with sharding constraints -----------------------------------

def moe_constrained(x, wg, w1, w2, constrain=_no_constraint):
    groups = x.reshape(4, -1, x.shape[-1])
    dispatch, combine = jax.vmap(mx._route, in_axes=(0, None))(groups, wg)
    expert_in = jnp.einsum("gtec,gtd->egcd", dispatch, groups)
    expert_in = constrain(expert_in, "ep", None, None, None)
    e, g, c, d = expert_in.shape
    out = mx._experts(expert_in.reshape(e, g * c, d), w1, w2).reshape(e, g, c, d)
    out = constrain(out, "ep", None, None, None)
    return jnp.einsum("gtec,egcd->gtd", combine, out).reshape(x.shape)


def ulysses_constrained(q, k, v, constrain=_no_constraint):
    q, k, v = (constrain(t, None, None, "sp", None) for t in (q, k, v))
    out = mx.causal_attention_ref(q, k, v)
    return constrain(out, None, "sp", None, None)


def top4(logits, constrain=_no_constraint):
    return tuple(lax.top_k(logits, 4))


def argmax(logits, constrain=_no_constraint):
    return jnp.argmax(logits, axis=-1)


def fsdp_grads(w1, w2, x, y, constrain=_no_constraint):
    return jax.grad(lambda a, b: jnp.mean((jnp.tanh(x @ a) @ b - y) ** 2), argnums=(0, 1))(w1, w2)


def cumsum_rows(x, constrain=_no_constraint):
    return jnp.cumsum(x, axis=0)


# ----- the corpus -----------------------------------------------------------------------------

def programs() -> list[Example]:
    feats = (("feats", 8),)
    tp = (f32((32, 32), P("feats", None), "weight"), f32((32,), P("feats")),
          f32((32, 32), P("feats", None), "weight"), f32((32,), P("feats")),
          f32((8, 32), P(None, "feats")), f32((8, 32), P(None, "feats")))
    XY = (("X", 2), ("Y", 4))
    xy = (("x", 2), ("y", 4))
    V, D, H = 64, 16, 4
    cook = (f32((V, D), P(None, None), "weight"), f32((3, D, H, 4), P(None, "fsdp", None, None),
            "weight"), f32((H, 4, D), P("fsdp", None, None), "weight"),
            f32((D, 32), P("fsdp", None), "weight"), f32((32, D), P(None, "fsdp"), "weight"),
            f32((D, V), P("fsdp", None), "weight"), ids((4, 8), P("fsdp", None), V),
            ids((4, 8), P("fsdp", None), V))
    emb = (ids((4, 8), P(), V), f32((V, D), P("tp", None)), f32((D, 32), P(None, "tp"), "weight"),
           f32((32, D), P("tp", None), "weight"))
    moe = (f32((32, 8), P("ep", None)), f32((8, mx.E), P(), "weight"),
           f32((mx.E, 8, 16), P("ep", None, None), "weight"),
           f32((mx.E, 16, 8), P("ep", None, None), "weight"))
    qkv = tuple(f32((2, 16, 4, 8), P(None, "sp", None, None)) for _ in range(3))
    fsdp = (f32((16, 32), P("fsdp", None), "weight"), f32((32, 8), P("fsdp", None), "weight"),
            f32((16, 16), P("fsdp", None)), f32((16, 8), P("fsdp", None)))
    notebook = "shard_map notebook, 8-way tensor parallelism: gemm_tp called in a jit loss"
    return [
        _p("tp_loss_gemm_shard_map", feats, tp_loss_ref, _tp_loss(_gemm_tp), tp, P(), notebook),
        _p("tp_loss_gemm_shard_map", feats, tp_loss_ref, _tp_loss(_gemm_tp_relu_first), tp, P(),
           notebook, bug="relu_on_partial_sums", bug_fn=_gemm_tp_relu_first),
        _p("jit_matmul", XY, matmul, _jit_form(matmul),
           [f32((8, 16), P("X", "Y")), f32((16, 16), P(None, "Y"), "weight")], P("X", "Y"),
           "scaling book part 10: jax.jit matmul with out_shardings, XLA all-gathers A"),
        _p("jit_two_matmuls_constrained", xy, two_matmuls, _jit_form(two_matmuls),
           [f32((8, 16), P("x", None)), f32((16, 32), P(None, "y"), "weight"),
            f32((32, 16), P("y", None), "weight")], P("x", None),
           "scaling book part 10: two einsums, with_sharding_constraint on the hidden"),
        _p("jit_shard_average", XY, shard_average, _jit_form(shard_average),
           [f32((16, 8), P("X", "Y"))], P(None, "Y"),
           "scaling book part 10, Problem 1.1 with jax.jit"),
        _p("cookbook_loss_and_grads", (("fsdp", 4),), cookbook_grads, _jit_form(cookbook_grads),
           cook, None, "JAX training cookbook: model_apply and loss under the FSDP "
           "shardings (Auto axes), value_and_grad"),
        _p("vocab_embed_in_jit_model", (("tp", 4),), embed_mlp_ref, _embed_mlp(
            mx.vocab_parallel_embed), emb, P(),
           "the Megatron-spelled vocab-parallel embedding as a shard_map library function, "
           "called from a jitted model whose MLP XLA partitions"),
        _p("vocab_embed_in_jit_model", (("tp", 4),), embed_mlp_ref, _embed_mlp(
            mx.vocab_parallel_embed_upper_bound), emb, P(),
           "vocab-parallel embedding inside jit", bug="mask_upper_bound_inclusive",
           bug_fn=mx.vocab_parallel_embed_upper_bound, chosen=_embed_mlp_block_starts),
        _p("one_hot_lookup", (("tp", 4),), mx.embed_ref, _jit_form(one_hot_lookup),
           [ids((4, 8), P(), V), f32((V, D), P("tp", None))], None,
           "MaxText's one-hot embedding under jit, the table split over the vocabulary "
           "(XLA's partitioning of the one-hot contraction)"),
        _p("one_hot_lookup", (("tp", 4),), mx.embed_ref, _jit_form(one_hot_lookup_off_by_one),
           [ids((4, 8), P(), V), f32((V, D), P("tp", None))], None,
           "MaxText's one-hot embedding under jit", bug="ids_off_by_one",
           bug_fn=one_hot_lookup_off_by_one),
        _p("one_hot_pick", (("tp", 4),), take_pick, _jit_form(one_hot_pick),
           [f32((8, V), P(None, "tp")), ids((8,), P(), V)], None,
           "the cross-entropy's target logit as a one-hot pick under jit, logits split over "
           "the vocabulary"),
        _p("moe_top2_constrained", (("ep", 4),), moe_constrained, _jit_form(moe_constrained),
           moe, P("ep", None), "MaxText-style top-2 MoE with capacity, experts constrained "
           "to 'ep' (XLA chooses the collectives)"),
        _p("ulysses_constrained", (("sp", 4),), ulysses_constrained,
           _jit_form(ulysses_constrained), qkv, P(None, "sp", None, None),
           "Ulysses attention by sharding constraints: sequence-sharded in, heads-sharded "
           "attention"),
        _p("top4_vocab_sharded", (("tp", 4),), top4, _jit_form(top4),
           [f32((8, V), P(None, "tp"))], (P(), P()), "top-k over vocab-sharded logits"),
        _p("argmax_vocab_sharded", (("tp", 4),), argmax, _jit_form(argmax),
           [f32((8, V), P(None, "tp"))], P(), "greedy argmax over vocab-sharded logits"),
        _p("fsdp_grads", (("fsdp", 4),), fsdp_grads, _jit_form(fsdp_grads), fsdp,
           (P("fsdp", None), P("fsdp", None)),
           "ZeRO-3/FSDP gradients: params and grads sharded on dim 0, batch over 'fsdp'"),
        _p("cumsum_sharded_rows", (("x", 4),), cumsum_rows, _jit_form(cumsum_rows),
           [f32((16, 8), P("x", None))], P("x", None), "jnp.cumsum along a sharded dim"),
    ]


def _embed_mlp_block_starts():
    import numpy as np

    [[t, table]] = mx._block_starts()
    rng = np.random.default_rng(11)
    return [[t, table, (rng.standard_normal((16, 32)) / 4).astype(np.float32),
             (rng.standard_normal((32, 16)) / 6).astype(np.float32)]]
