"""Rows permuted and put back (`normalize/permutation.py`): a gather by the inverse of a
permutation, or a scatter to the permutation, of a row-wise computation of rows gathered by
it is the computation on the rows in place.

Lemmas by Z3 on the rewrite as built (tests/normalize/symbolic_programs.py), keys symbolic
integers (ties included: the sort is stable, and an argsort is a permutation whatever the
keys): the rewrite fires, and the program after equals the program before; the wrong
variants (unsorted by the permutation itself, a descending argsort as the inverse, the argsort
of a non-permutation, a scatter to another permutation) are not rewritten, and Z3 refutes
them against the unpermuted computation. Programs are grounded in the held-out
corpus (examples/heldout: sorted_moe, sorted_moe_scattered and their buggy twins;
tests/examples/test_heldout_grounded.py runs both programs, test_heldout_check.py checks the
verdicts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tests.normalize.symbolic_programs import compare, lowered, op_names, rewritten

f32, i32 = jnp.float32, jnp.int32


def _rows(x, w, keys):
    """Row i from row i of x and of the keys alone: the key's row of w times x's row."""
    return x * w[keys] + 1.0


def _sorted(x, w, keys, unsort):
    order = jnp.argsort(keys)
    return unsort(x[order] * w[keys[order]] + 1.0, order)


def by_argsort(x, w, keys):
    return _sorted(x, w, keys, lambda ys, order: ys[jnp.argsort(order)])


def by_scatter_set(x, w, keys):
    return _sorted(x, w, keys, lambda ys, order: jnp.zeros_like(ys).at[order].set(ys))


def by_scatter_add(x, w, keys):
    return _sorted(x, w, keys, lambda ys, order: jnp.zeros_like(ys).at[order].add(ys))


def by_inverse_scatter(x, w, keys):
    def unsort(ys, order):
        inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
        return ys[inverse]
    return _sorted(x, w, keys, unsort)


def by_order(x, w, keys):
    """Wrong: unsorted by the permutation itself."""
    return _sorted(x, w, keys, lambda ys, order: ys[order])


def by_descending_argsort(x, w, keys):
    """Wrong: the descending argsort of the permutation is no inverse."""
    return _sorted(x, w, keys, lambda ys, order: ys[jnp.argsort(order, descending=True)])


def by_argsort_of_keys(x, w, keys):
    """Wrong: the argsort of the keys (not a permutation) in place of the permutation's."""
    return _sorted(x, w, keys, lambda ys, order: ys[jnp.argsort(keys)])


def by_other_scatter(x, w, keys):
    """Wrong: scattered to the positions of another permutation (sorted by -keys)."""
    return _sorted(x, w, keys, lambda ys, order: jnp.zeros_like(ys).at[
        jnp.argsort(-keys)].set(ys))


def _avals(tokens: int, width: int, experts: int = 2):
    return (jax.ShapeDtypeStruct((tokens, width), f32),
            jax.ShapeDtypeStruct((experts, width), f32),
            jax.ShapeDtypeStruct((tokens,), i32))


SHAPES = ((2, 2), (3, 1))
"""(tokens, width): the symbolic sort of n keys is n^2 compare-exchanges and each gather at a
symbolic index a chain over the rows (a tanh and an einsum per row took Z3 minutes)."""

RIGHT = [(fn, shape) for fn in (by_argsort, by_scatter_set, by_scatter_add,
                                by_inverse_scatter) for shape in SHAPES] + [(by_argsort, (4, 1))]


@pytest.mark.parametrize("fn,shape", RIGHT, ids=[f"{f.__name__}-{n}x{w}" for f, (n, w) in RIGHT])
def test_unpermuted_rows_are_exact(fn, shape) -> None:
    avals = _avals(*shape)
    before, after, count = rewritten(fn, *avals)
    assert count >= 1
    assert "stablehlo.sort" not in op_names(after)
    assert compare(before, after, avals) == "proved"
    assert compare(after, lowered(_rows, *avals), avals) == "proved"


WRONG = [by_order, by_descending_argsort, by_argsort_of_keys, by_other_scatter]


@pytest.mark.parametrize("fn", WRONG, ids=[f.__name__ for f in WRONG])
def test_wrong_inverse_is_not_rewritten_and_refuted(fn) -> None:
    avals = _avals(3, 1)
    _, after, _ = rewritten(fn, *avals)
    assert "stablehlo.sort" in op_names(after)
    assert compare(after, lowered(_rows, *avals), avals) == "refuted"
