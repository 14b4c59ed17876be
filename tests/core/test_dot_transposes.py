"""A dot_general of transposed operands and the transpose of a dot_general (`terms.make_dot`,
`terms.make_transpose`): `A.T @ B` is the contraction of A's dim 0 with B's, and `(A @ B).T`
is `dot_general(B, A)`: the same products summed in the same order, so the normal form reads
them alike (jax's vjp spells a weight gradient `transpose(dot_general(d, x))` where a
hand-written backward pass spells it `x.T @ d`: the scaling book's data-parallel backward).
Each identity is proved by Z3 from the raw nodes, on several shapes; its nearest wrong
variants are refuted."""

from __future__ import annotations

import pytest

from entangle_mlir.core.terms import make_arg, make_dot, make_transpose
from tests.core.raw_terms import proved, raw, refuted

T2 = (1, 0)


def _raw_dot(a, b, attrs, shape):
    return raw("stablehlo.dot_general", (a, b), attrs, shape)


def _raw_transpose(a, perm):
    return raw("transpose", (a,), (perm,), tuple(a.shape[p] for p in perm))


@pytest.mark.parametrize("m, k, n", [(2, 3, 2), (3, 2, 4), (1, 2, 3)])
def test_a_transposed_operand_is_contracted_in_place(m, k, n) -> None:
    a, b = make_arg(0, (k, m), "f32"), make_arg(1, (k, n), "f32")
    before = _raw_dot(_raw_transpose(a, T2), b, ((), (), (1,), (0,)), (m, n))
    after = make_dot(make_transpose(a, T2), b, ((), (), (1,), (0,)), (m, n), "f32")
    assert after.op == "stablehlo.dot_general" and after.args == (a, b)
    assert after.attrs == ((), (), (0,), (0,))
    assert proved(before, after)


@pytest.mark.parametrize("m, k, n", [(2, 3, 2), (3, 2, 4), (2, 2, 1)])
def test_a_transposed_dot_is_the_dot_of_the_operands_swapped(m, k, n) -> None:
    a, b = make_arg(0, (m, k), "f32"), make_arg(1, (k, n), "f32")
    attrs = ((), (), (1,), (0,))
    before = _raw_transpose(_raw_dot(a, b, attrs, (m, n)), T2)
    after = make_transpose(make_dot(a, b, attrs, (m, n), "f32"), T2)
    assert after.op == "stablehlo.dot_general" and after.args == (b, a)
    assert proved(before, after)


def test_batched_dots_keep_their_transposes() -> None:
    """A dot with batch dims is left as built: absorbing a transpose reorders its batch dims
    (`(2, 0)`), which the general tier's joins of attention's per-head contractions do not
    meet (tests/examples/test_frontier_pipeline.py failed with it)."""
    a, b = make_arg(0, (2, 3, 4), "f32"), make_arg(1, (2, 4, 5), "f32")
    attrs = ((0,), (0,), (2,), (1,))
    dot = make_dot(a, b, attrs, (2, 3, 5), "f32")
    assert make_transpose(dot, (0, 2, 1)).op == "transpose"
    t = make_transpose(a, (0, 2, 1))
    assert make_dot(t, b, ((0,), (0,), (1,), (1,)), (2, 3, 5), "f32").args[0] is t


def test_a_weight_gradient_meets_in_both_spellings() -> None:
    """`(x @ w).T @ d` (hand-written) and `transpose(dot_general(d, x @ w))` contracting the
    batch (jax's vjp) are one term."""
    x, w, d = make_arg(0, (4, 3), "f32"), make_arg(1, (3, 5), "f32"), make_arg(2, (4, 2), "f32")
    h = make_dot(x, w, ((), (), (1,), (0,)), (4, 5), "f32")
    written = make_dot(make_transpose(h, T2), d, ((), (), (1,), (0,)), (5, 2), "f32")
    vjp = make_transpose(make_dot(d, h, ((), (), (0,), (0,)), (2, 5), "f32"), T2)
    assert written is vjp


def test_wrong_neighbours_are_refuted() -> None:
    """Not the same products: a transpose that keeps the dot's dims, a contraction of the
    other dim, the operands swapped without the transpose."""
    a, b = make_arg(0, (3, 3), "f32"), make_arg(1, (3, 3), "f32")
    attrs = ((), (), (1,), (0,))
    dot = make_dot(a, b, attrs, (3, 3), "f32")
    assert refuted(make_transpose(dot, T2), dot)
    assert refuted(make_dot(make_transpose(a, T2), b, attrs, (3, 3), "f32"), dot)
    assert refuted(make_dot(b, a, attrs, (3, 3), "f32"), dot)
