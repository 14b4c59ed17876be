"""A buffer a counted loop fills window by window from a loop-invariant x is x
(analysis/loop_slices.filled), and a loop result is named by its slice (loop_slices.closure).

The identity is checked by Z3 on the loop unrolled (every trip's write, at constant starts,
into an arbitrary initial buffer): for each loop, `filled` reads it as x exactly when Z3
proves the unrolled loop equal to x. Its nearest wrong variants (a trip short, the layers
written in the reversed slots, a window one row off) Z3 refutes and `filled` does not read.
"""

from __future__ import annotations

import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.analysis.loop_slices import closure, filled
from entangle_mlir.core import terms as T
from entangle_mlir.rules.gather_scatter import make_dynamic_update_slice, make_scatter

DEPTH = 1


def _index(scale: int, offset: int, i: T.Term) -> T.Term:
    return T.make_lin([(scale, i)], offset, (), "i32")


def _window(x: T.Term, start: T.Term) -> T.Term:
    sizes = (1, *x.shape[1:])
    zero = T.make_splat(0, (), "i32")
    return T.intern("dynamic_slice", (x, start, *[zero] * (len(x.shape) - 1)), (sizes,), sizes,
                    x.dtype)


def _write(buffer: T.Term, x: T.Term, read: T.Term, write: T.Term) -> T.Term:
    zero = T.make_splat(0, (), "i32")
    return make_dynamic_update_slice(buffer, _window(x, read), [write, *[zero] * (len(x.shape) - 1)])


def _loop(x: T.Term, trips: int, read: tuple[int, int], write: tuple[int, int]):
    """(cond, yields, inits) of `for i < trips: b[write(i)] = x[read(i)]`, the counter first."""
    i = T.make_loopvar(DEPTH, 0, (), "i32")
    b = T.make_loopvar(DEPTH, 1, x.shape, x.dtype)
    cond = T.make_elementwise("stablehlo.compare", (i, T.make_splat(trips, (), "i32")),
                              ("LT",), "i1")
    yields = [_index(1, 1, i), _write(b, x, _index(*read, i), _index(*write, i))]
    return cond, yields, [T.make_splat(0, (), "i32"), T.make_splat(0, x.shape, x.dtype)]


def _unrolled(x: T.Term, start: T.Term, trips: int, read, write) -> T.Term:
    buffer = start
    for i in range(trips):
        c = T.make_splat(i, (), "i32")
        buffer = _write(buffer, x, _index(*read, c), _index(*write, c))
    return buffer


SHAPES = [(2, 3), (3, 2, 2), (4, 2)]
FORWARD, BACKWARD = (1, 0), (-1, None)


def _cases(n: int):
    back = (-1, n - 1)
    return [("forward", n, FORWARD, FORWARD, True), ("backward", n, back, back, True),
            ("a trip short", n - 1, FORWARD, FORWARD, False),
            ("layers reversed", n, FORWARD, back, False),
            ("one row off", n, (1, 1), FORWARD, False)]


@pytest.mark.parametrize("shape", SHAPES)
def test_fill_is_x_exactly_when_z3_proves_the_unrolled_loop(shape):
    T.start_over()
    x = T.make_arg(0, shape, "f32")
    start = T.make_arg(1, shape, "f32")
    for what, trips, read, write, holds in _cases(shape[0]):
        cond, yields, inits = _loop(x, trips, read, write)
        read_as = filled(1, DEPTH, cond, yields, inits)
        proof = check_term_equality(_unrolled(x, start, trips, read, write), x)
        assert proof.status == ("proved" if holds else "refuted"), (what, proof.describe())
        assert (read_as is x) is holds, what


def test_fill_needs_x_invariant():
    T.start_over()
    x = T.make_arg(0, (3, 2), "f32")
    cond, yields, inits = _loop(x, 3, FORWARD, FORWARD)
    moving = T.make_loopvar(DEPTH, 1, x.shape, x.dtype)
    i = T.make_loopvar(DEPTH, 0, (), "i32")
    yields[1] = _write(moving, T.make_lin([(1, x), (1, moving)], 0, x.shape, x.dtype), i, i)
    assert filled(1, DEPTH, cond, yields, inits) is None


def test_closure_keeps_the_condition_and_what_yields_read():
    reads = [frozenset({0}), frozenset({0, 1}), frozenset({0, 2, 3}), frozenset({3}),
             frozenset({1, 4})]
    live = [0, 1, 2, 3, 4]
    assert closure(1, frozenset({0}), reads, live) == [0, 1]
    assert closure(2, frozenset({0}), reads, live) == [0, 2, 3]
    assert closure(4, frozenset({0}), reads, live) == [0, 1, 4]
    assert closure(3, frozenset(), reads, [0, 1, 2, 4]) == []


ROW = {"update_window_dims": (0,), "inserted_window_dims": (0,),
       "scatter_dims_to_operand_dims": (0,), "input_batching_dims": (),
       "scatter_indices_batching_dims": (), "index_vector_dim": 0}
"""`b.at[i].set(row)` on a 2-D buffer: one window (a row) at one index vector."""


def _set_row(buffer: T.Term, x: T.Term, i: T.Term) -> T.Term:
    row = T.make_reshape(_window(x, i), x.shape[1:])
    return make_scatter(buffer, T.make_reshape(i, (1,)), row, ROW, "replace")


@pytest.mark.parametrize("rows", [2, 3])
def test_scatter_fill_is_x_exactly_when_z3_proves_the_unrolled_loop(rows):
    """fori_loop's `b.at[i].set(x[i])`: a replacing scatter of one row per trip."""
    T.start_over()
    x = T.make_arg(0, (rows, 2), "f32")
    start = T.make_arg(1, (rows, 2), "f32")
    i = T.make_loopvar(DEPTH, 0, (), "i32")
    b = T.make_loopvar(DEPTH, 1, x.shape, x.dtype)
    for trips, holds in ((rows, True), (rows - 1, False)):
        cond = T.make_elementwise("stablehlo.compare", (i, T.make_splat(trips, (), "i32")),
                                  ("LT",), "i1")
        yields = [_index(1, 1, i), _set_row(b, x, i)]
        inits = [T.make_splat(0, (), "i32"), T.make_splat(0, x.shape, x.dtype)]
        unrolled = start
        for step in range(trips):
            unrolled = _set_row(unrolled, x, T.make_splat(step, (), "i32"))
        proof = check_term_equality(unrolled, x)
        assert proof.status == ("proved" if holds else "refuted"), (trips, proof.describe())
        assert (filled(1, DEPTH, cond, yields, inits) is x) is holds, trips
