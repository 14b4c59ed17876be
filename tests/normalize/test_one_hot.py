"""A one-hot contracted, picked or spread is a gather or a scatter (`normalize/one_hot.py`).

Lemmas, by Z3 on the rewrite as built (tests/normalize/symbolic_programs.py): every spelling
jax lowers (the one-hot matmul either side of the table, the pick as a product or a `where`,
the pick's gradient, the embedding's gradient either side) is rewritten, and the program
after equals the program before for every id, in range or not. Against jax's gather spelling
(`T[ids]`, `take_along_axis`, their gradients) the one-hot spelling is equal only where the
ids are valid: Z3 proves it under that hypothesis and refutes it without, and refutes the
near misses (an id off by one, on either side). The programs are grounded in the
held-out corpus (examples/heldout: one_hot_embed, one_hot_ce, one_hot_ce_grad, one_hot_lookup,
one_hot_pick and their buggy twins; tests/examples/test_heldout_grounded.py runs both programs,
test_heldout_check.py checks the verdicts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.normalize.symbolic_programs import compare, lowered, op_names, rewritten

f32, i32 = jnp.float32, jnp.int32


def _aval(shape, dtype=f32):
    return jax.ShapeDtypeStruct(shape, dtype)


def matmul(ids, table):
    return jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype) @ table


def matmul_rhs(ids, table):
    return jnp.einsum("vd,...v->d...", table, jax.nn.one_hot(ids, table.shape[0]))


def matmul_shifted_iota(ids, table, start):
    """The class positions shifted by a scalar (XLA's per-device `iota + 16 * partition`)."""
    hot = ids[:, None] == jnp.arange(table.shape[0])[None, :] + start
    return hot.astype(table.dtype) @ table


def pick(logits, labels):
    return jnp.sum(logits * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1)


def pick_where(logits, labels):
    hot = labels[..., None] == jnp.arange(logits.shape[-1])
    return jnp.sum(jnp.where(hot, logits, 0.0), axis=-1)


def spread(g, labels):
    return g[..., None] * jax.nn.one_hot(labels, 5)


def embed_grad(ids, g):
    return jax.nn.one_hot(ids, 5).T @ g


def embed_grad_rhs(ids, g):
    return g.T @ jax.nn.one_hot(ids, 5)


# (name, function, argument avals, the op the rewrite leaves in place of the one-hot)
SPELLINGS = [
    ("matmul-3", matmul, (_aval((3,), i32), _aval((4, 2))), "stablehlo.gather"),
    ("matmul-2x2", matmul, (_aval((2, 2), i32), _aval((3, 2))), "stablehlo.gather"),
    ("matmul-shifted-iota", matmul_shifted_iota,
     (_aval((3,), i32), _aval((4, 2)), _aval((), i32)), "stablehlo.gather"),
    ("matmul-rhs", matmul_rhs, (_aval((3,), i32), _aval((4, 2))), "stablehlo.gather"),
    ("pick-3x4", pick, (_aval((3, 4)), _aval((3,), i32)), "stablehlo.gather"),
    ("pick-2x2x3", pick, (_aval((2, 2, 3)), _aval((2, 2), i32)), "stablehlo.gather"),
    ("pick-where", pick_where, (_aval((3, 4)), _aval((3,), i32)), "stablehlo.gather"),
    ("spread", spread, (_aval((3,)), _aval((3,), i32)), "stablehlo.scatter"),
    ("embed-grad", embed_grad, (_aval((4,), i32), _aval((4, 2))), "stablehlo.scatter"),
    ("embed-grad-rhs", embed_grad_rhs, (_aval((4,), i32), _aval((4, 2))),
     "stablehlo.scatter"),
]


@pytest.mark.parametrize("fn,avals,built", [s[1:] for s in SPELLINGS],
                         ids=[s[0] for s in SPELLINGS])
def test_one_hot_rewrite_is_exact_for_every_id(fn, avals, built) -> None:
    before, after, count = rewritten(fn, *avals)
    assert count >= 1
    assert built in op_names(after) and built not in op_names(before)
    assert "stablehlo.iota" not in op_names(after)  # the one-hot is gone
    assert compare(before, after, avals) == "proved"


def _ids_valid(at: int, size: int):
    """The hypothesis that input `at` holds valid indices into a dim of `size`."""
    return lambda inputs: [c for x in np.ravel(inputs[at]) for c in (x >= 0, x < size)]


def embed(ids, table):
    return table[ids]


def embed_next(ids, table):
    return table[ids + 1]


def matmul_shifted(ids, table):
    return jax.nn.one_hot(ids - 1, table.shape[0], dtype=table.dtype) @ table


def take(logits, labels):
    return jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]


def take_next(logits, labels):
    return jnp.take_along_axis(logits, labels[..., None] + 1, axis=-1)[..., 0]


def take_grad(g, labels):
    return jax.vjp(lambda x: take(x, labels), jnp.zeros((3, 5)))[1](g)[0]


def embed_grad_ref(ids, g):
    return jax.vjp(lambda t: t[ids], jnp.zeros((5, 2)))[1](g)[0]


EMBED = (_aval((3,), i32), _aval((4, 2)))
PICK = (_aval((3, 4)), _aval((3,), i32))
# (name, one-hot spelling, gather spelling, avals, valid-index hypothesis, with it, without)
AGAINST_GATHERS = [
    ("embed", matmul, embed, EMBED, _ids_valid(0, 4), "proved", "refuted"),
    ("embed-off-by-one", matmul, embed_next, EMBED, _ids_valid(0, 4), "refuted", "refuted"),
    ("embed-one-hot-shifted", matmul_shifted, embed, EMBED, _ids_valid(0, 4), "refuted",
     "refuted"),
    ("pick", pick, take, PICK, _ids_valid(1, 4), "proved", "refuted"),
    ("pick-off-by-one", pick, take_next, PICK, _ids_valid(1, 4), "refuted", "refuted"),
    ("pick-grad", spread, take_grad, (_aval((3,)), _aval((3,), i32)), _ids_valid(1, 5),
     "proved", None),
    ("embed-grad", embed_grad, embed_grad_ref, (_aval((4,), i32), _aval((4, 2))),
     _ids_valid(0, 5), "proved", "refuted"),
]


@pytest.mark.parametrize("one_hot,gathers,avals,valid,under,plain",
                         [c[1:] for c in AGAINST_GATHERS], ids=[c[0] for c in AGAINST_GATHERS])
def test_one_hot_against_gathers(one_hot, gathers, avals, valid, under, plain) -> None:
    """Rewritten, the one-hot spelling equals jax's gather spelling exactly where the ids are
    valid; a near miss is refuted even there. `plain` None: equal for every id (both
    spellings drop an out-of-range update)."""
    _, after, _ = rewritten(one_hot, *avals)
    reference = lowered(gathers, *avals)
    assert compare(after, reference, avals, valid) == under
    if plain is not None:
        assert compare(after, reference, avals) == plain


def test_infinite_table_keeps_the_one_hot() -> None:
    """`0 * inf` is NaN: a one-hot contracted with a value that may be infinite (an exp of
    an input, which overflows) is not read as a gather."""
    _, after, _ = rewritten(lambda ids, t: matmul(ids, jnp.exp(t)), *EMBED)
    assert "stablehlo.gather" not in op_names(after)


def test_scaled_one_hot_and_diagonal_stay_elementwise() -> None:
    """A one-hot times one number everywhere (a mean loss's cotangent) is a scaled one-hot,
    and `iota == iota'` a diagonal mask: neither indexes anything, both stay elementwise (and
    the rewrite that did not fire leaves the program as it was)."""
    scaled = (_aval((3,), i32),)
    before, after, _ = rewritten(lambda ids: jax.nn.one_hot(ids, 5) * -0.25, *scaled)
    assert "stablehlo.scatter" not in op_names(after)
    assert compare(before, after, scaled) == "proved"
    square = (_aval((4, 4)),)
    _, after, _ = rewritten(
        lambda x: jnp.where(jnp.arange(4)[:, None] == jnp.arange(4)[None, :], x, 0.0).sum(-1),
        *square)
    assert "stablehlo.gather" not in op_names(after)
