"""A dot_general of transposed operands and the transpose of a dot_general (`terms.make_dot`,
`terms.make_transpose`): `A.T @ B` is the contraction of A's dim 0 with B's, and `(A @ B).T`
is `dot_general(B, A)`: the same products summed in the same order, so the normal form reads
them alike (jax's vjp spells a weight gradient `transpose(dot_general(d, x))` where a
hand-written backward pass spells it `x.T @ d`: the scaling book's data-parallel backward).
A transpose is taken into the dot only where the operand keeps the blocks the normal form reads
it in (its free dims one run, its runs of contracted dims runs), and a dot operand's
orientation is read off what its operands compute (`terms.orientation_key`), never the order
they were built in. Each identity is proved by Z3 from the raw nodes, on several shapes; its
nearest wrong variants are refuted."""

from __future__ import annotations

import pytest

from entangle_mlir.core import memos, terms
from entangle_mlir.core.terms import make_arg, make_dot, make_transpose, orientation_key, pretty
from tests.core.raw_terms import proved, raw, raw_slice, refuted

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


@pytest.mark.parametrize("b, m, k, n", [(2, 3, 2, 2), (1, 2, 3, 2), (3, 2, 2, 1)])
def test_a_batched_dot_reads_a_transpose_keeping_its_batch_dims(b, m, k, n) -> None:
    """`transpose(A, (0, 2, 1))` contracted per batch row is A contracted in place, and a
    transpose swapping a batched dot's free dims is the dot of the operands swapped (Z3)."""
    a, c = make_arg(0, (b, k, m), "f32"), make_arg(1, (b, k, n), "f32")
    attrs = ((0,), (0,), (2,), (1,))
    before = _raw_dot(_raw_transpose(a, (0, 2, 1)), c, attrs, (b, m, n))
    after = make_dot(make_transpose(a, (0, 2, 1)), c, attrs, (b, m, n), "f32")
    assert after.args == (a, c) and after.attrs == ((0,), (0,), (1,), (1,))
    assert proved(before, after)
    x, y = make_arg(2, (b, m, k), "f32"), make_arg(3, (b, k, n), "f32")
    dot_attrs = ((0,), (0,), (2,), (1,))
    raw_swap = _raw_transpose(_raw_dot(x, y, dot_attrs, (b, m, n)), (0, 2, 1))
    swapped = make_transpose(make_dot(x, y, dot_attrs, (b, m, n), "f32"), (0, 2, 1))
    assert swapped.op == "stablehlo.dot_general" and swapped.args == (y, x)
    assert proved(raw_swap, swapped)


def test_a_batched_swap_without_its_transpose_is_refuted() -> None:
    """The nearest wrong reading of a batched `(A @ B).T`: the operands swapped, each batch
    row's result left untransposed (square blocks, so the shapes agree)."""
    x, y = make_arg(0, (2, 3, 3), "f32"), make_arg(1, (2, 3, 3), "f32")
    attrs = ((0,), (0,), (2,), (1,))
    dot = make_dot(x, y, attrs, (2, 3, 3), "f32")
    assert refuted(make_transpose(dot, (0, 2, 1)), dot)
    assert refuted(make_transpose(dot, (0, 2, 1)), _raw_dot(y, x, attrs, (2, 3, 3)))


def test_a_transpose_moving_batch_dims_is_kept() -> None:
    """Read in place, `transpose(A, (1, 0, 2))` would contract per row of A's dim 1: its
    batch dims move, which the general tier's joins of attention's per-head contractions do
    not meet (tests/examples/test_frontier_pipeline.py failed with it); it is kept."""
    a, c = make_arg(0, (3, 2, 4), "f32"), make_arg(1, (2, 4, 5), "f32")
    t = make_transpose(a, (1, 0, 2))
    assert make_dot(t, c, ((0,), (0,), (2,), (1,)), (2, 3, 5), "f32").args[0] is t


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


@pytest.mark.parametrize("k1, k2, m, n", [(2, 3, 2, 2), (1, 2, 3, 2), (2, 2, 1, 3)])
def test_a_run_of_contracted_dims_is_contracted_in_place(k1, k2, m, n) -> None:
    """`transpose(A, (2, 0, 1))` contracting its dims (1, 2) against B's (0, 1): the run of
    two contracted dims stays a run of A, its free dim one run, so A is contracted in place."""
    a, b = make_arg(0, (k1, k2, m), "f32"), make_arg(1, (k1, k2, n), "f32")
    attrs = ((), (), (1, 2), (0, 1))
    before = _raw_dot(_raw_transpose(a, (2, 0, 1)), b, attrs, (m, n))
    after = make_dot(make_transpose(a, (2, 0, 1)), b, attrs, (m, n), "f32")
    assert after.args == (a, b) and after.attrs == ((), (), (0, 1), (0, 1))
    assert proved(before, after)


def test_contracting_a_run_crosswise_is_refuted() -> None:
    """The nearest wrong reading: A's two contracted dims paired with B's the other way."""
    a, b = make_arg(0, (2, 2, 3), "f32"), make_arg(1, (2, 2, 2), "f32")
    right = make_dot(make_transpose(a, (2, 0, 1)), b, ((), (), (1, 2), (0, 1)), (3, 2), "f32")
    crosswise = _raw_dot(a, b, ((), (), (1, 0), (0, 1)), (3, 2))
    assert refuted(right, crosswise)


def test_a_transpose_parting_the_operand_blocks_is_kept() -> None:
    """Attention's output and weight gradient (`cookbook_loss_and_grads` under FSDP):
    `transpose(out, (0, 3, 1, 2))` puts batch and query rows side by side before heads. Read
    in place, the forward's free dims (batch, query) and the gradient's contracted run
    (batch, query) would be apart in `out`, where a device's one-row batch block is regrouped
    unlike the whole batch; both keep the transpose."""
    out = make_arg(0, (2, 4, 4, 8), "f32")
    moved = make_transpose(out, (0, 3, 1, 2))
    w, x = make_arg(1, (4, 4, 16), "f32"), make_arg(2, (2, 8, 16), "f32")
    forward = make_dot(moved, w, ((), (), (3, 2), (1, 0)), (2, 8, 16), "f32")
    gradient = make_dot(moved, x, ((), (), (0, 1), (0, 1)), (4, 4, 16), "f32")
    assert forward.args[0] is moved and gradient.args[0] is moved


def test_an_operand_dot_is_oriented_by_content() -> None:
    """`dot(w, x)` as an operand is read as `transpose(dot(x, w))` (x, argument 0, first):
    the same values (Z3, from the raw nodes); the flipped dot without its transpose differs."""
    x, w = make_arg(0, (3, 3), "f32"), make_arg(1, (3, 3), "f32")
    built = _raw_dot(w, x, ((), (), (1,), (0,)), (3, 3))
    oriented = terms._oriented(built)
    assert oriented.op == "transpose" and oriented.args[0].args == (x, w)
    assert proved(built, oriented)
    assert refuted(built, oriented.args[0])


def test_orientation_does_not_depend_on_build_order() -> None:
    """The weight gradient of `h = x @ w` built with the arguments made in either order is
    one term: orientation by serial would read `h` flipped in one of them."""
    def gradient(first_w: bool) -> str:
        memos.start_over()
        if first_w:
            w, d, x = (make_arg(1, (3, 5), "f32"), make_arg(2, (4, 2), "f32"),
                       make_arg(0, (4, 3), "f32"))
        else:
            x, w, d = (make_arg(0, (4, 3), "f32"), make_arg(1, (3, 5), "f32"),
                       make_arg(2, (4, 2), "f32"))
        h = make_dot(x, w, ((), (), (1,), (0,)), (4, 5), "f32")
        vjp = make_transpose(make_dot(d, h, ((), (), (0,), (0,)), (2, 5), "f32"), T2)
        written = make_dot(make_transpose(h, T2), d, ((), (), (1,), (0,)), (5, 2), "f32")
        assert vjp is written
        return pretty(vjp, 8)

    assert gradient(False) == gradient(True)


def test_orientation_key_reads_through_row_blocks() -> None:
    """A device's rows of a value have the value's key (slices, reshapes and transposes are
    read through), so its contractions are oriented as the whole batch's."""
    x = make_arg(0, (4, 3), "f32")
    rows = raw_slice(x, (0, 0), (1, 3))
    assert orientation_key(rows) == orientation_key(x)
    assert orientation_key(x) < orientation_key(make_arg(1, (4, 3), "f32"))
