"""Repeats in one spelling (`core/repeats.py`, `terms._repeat_of_repeat`, `terms._dot_of_repeat`).

A K/V head a device picks from a coarser split, repeated locally, is the reference's
`jnp.repeat` of the K/V heads: a repeat of a repeat, and a dot of a repeated weight, must intern
as the single repeat of the dot. Each identity is proved by Z3 on small symbolic tensors of
several shapes (the term as spelled, raw nodes the builders do not touch, against the builders'
result), and its nearest wrong variant (a tile where a repeat is, a repeat by the wrong count)
is refuted and stays a different term.
"""

from __future__ import annotations

import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core import repeats
from entangle_mlir.core import terms as T
from entangle_mlir.core.repeats import index_map, plan_of, result_size

F32 = "f32"


def proved(a: T.Term, b: T.Term) -> bool:
    return check_term_equality(a, b, "repeats.lemma").status == "proved"


def refuted(a: T.Term, b: T.Term) -> bool:
    return check_term_equality(a, b, "repeats.must_fail").status == "refuted"


def raw_repeat(term: T.Term, dim: int, count: int, *, tile: bool = False) -> T.Term:
    """`jnp.repeat(term, count, axis=dim)` (or `jnp.tile` along dim) as raw broadcast and reshape
    nodes."""
    shape = term.shape
    at = dim if tile else dim + 1
    wide = shape[:at] + (count,) + shape[at:]
    dims = tuple(i if i < at else i + 1 for i in range(len(shape)))
    wide_term = T.intern("broadcast", (term,), (dims,), wide, term.dtype)
    out = shape[:dim] + (shape[dim] * count,) + shape[dim + 1:]
    return T.intern("reshape", (wide_term,), (), out, term.dtype)


def built_repeat(term: T.Term, dim: int, count: int) -> T.Term:
    """The same repeat through the builders."""
    shape = term.shape
    wide = shape[:dim + 1] + (count,) + shape[dim + 1:]
    dims = tuple(i if i <= dim else i + 1 for i in range(len(shape)))
    out = shape[:dim] + (shape[dim] * count,) + shape[dim + 1:]
    return T.make_reshape(T.make_broadcast(term, dims, wide), out)


# (shape, dim, first count, second count)
NESTED = [((2, 3), 0, 2, 2), ((2, 3), 1, 3, 2), ((3, 2, 2), 1, 2, 3), ((2,), 0, 2, 4)]


@pytest.mark.parametrize("shape,dim,a,b", NESTED)
def test_repeat_of_a_repeat_is_one_repeat(shape, dim, a, b) -> None:
    x = T.make_arg(1, shape, F32)
    nested = built_repeat(built_repeat(x, dim, a), dim, b)
    assert nested is built_repeat(x, dim, a * b)
    assert proved(raw_repeat(raw_repeat(x, dim, a), dim, b), nested)


@pytest.mark.parametrize("shape,dim,a,b", NESTED)
def test_tile_of_a_repeat_is_no_repeat(shape, dim, a, b) -> None:
    x = T.make_arg(2, shape, F32)
    inner = built_repeat(x, dim, a)
    wide = inner.shape[:dim] + (b,) + inner.shape[dim:]
    dims = tuple(i if i < dim else i + 1 for i in range(len(shape)))
    tiled = T.make_reshape(T.make_broadcast(inner, dims, wide), built_repeat(x, dim, a * b).shape)
    assert tiled is not built_repeat(x, dim, a * b)
    assert proved(raw_repeat(raw_repeat(x, dim, a), dim, b, tile=True), tiled)
    assert refuted(tiled, built_repeat(x, dim, a * b))


def test_a_repeat_by_the_wrong_count_is_refuted() -> None:
    x = T.make_arg(3, (2, 2), F32)
    twice = built_repeat(built_repeat(x, 0, 2), 0, 2)
    assert twice is built_repeat(x, 0, 4)
    wrong = T.make_reshape(built_repeat(built_repeat(x, 1, 2), 0, 2), (8, 2))
    assert wrong is not twice and refuted(twice, wrong)


# (x shape, w shape, contracting dims x/w, repeated dim of w, count)
DOTS = [((2, 5), (5, 2, 3), (1, 0), 1, 2),
        ((3, 4), (4, 3), (1, 0), 1, 3),
        ((2, 4), (2, 4), (1, 1), 0, 2)]


@pytest.mark.parametrize("xs,ws,contract,dim,count", DOTS)
def test_dot_of_a_repeat_is_the_repeat_of_the_dot(xs, ws, contract, dim, count) -> None:
    x, w = T.make_arg(4, xs, F32), T.make_arg(5, ws, F32)
    cx, cw = contract
    attrs = ((), (), (cx,), (cw,))
    repeated = built_repeat(w, dim, count)
    free_x = tuple(n for i, n in enumerate(xs) if i != cx)
    free_w = tuple(n for i, n in enumerate(repeated.shape) if i != cw)
    shape = free_x + free_w
    pulled = T.make_dot(x, repeated, attrs, shape, F32)
    raw = T.intern("stablehlo.dot_general", (x, raw_repeat(w, dim, count)), attrs, shape, F32)
    assert pulled.op != "stablehlo.dot_general"
    assert proved(raw, pulled)
    out_dim = len(free_x) + [i for i in range(len(ws)) if i != cw].index(dim)
    plain = T.make_dot(x, w, attrs, free_x + tuple(n for i, n in enumerate(ws) if i != cw), F32)
    assert pulled is built_repeat(plain, out_dim, count)
    tiled = T.intern("stablehlo.dot_general", (x, raw_repeat(w, dim, count, tile=True)), attrs,
                     shape, F32)
    assert refuted(tiled, pulled)


def test_a_repeat_along_a_contracting_dim_stays_in_the_dot() -> None:
    x, w = T.make_arg(6, (2, 4), F32), T.make_arg(7, (2, 3), F32)
    repeated = built_repeat(w, 0, 2)
    dot = T.make_dot(x, repeated, ((), (), (1,), (0,)), (2, 3), F32)
    assert dot.op == "stablehlo.dot_general" and dot.args[1] is repeated


def test_plans_reproduce_the_index_map() -> None:
    steps = (("broadcast", ((0, 2), (2, 3, 4))), ("reshape", (6, 4)),
             ("broadcast", ((0, 2), (6, 2, 4))), ("reshape", (12, 4)))
    plan = plan_of((2, 4), steps)
    assert plan is not None and (plan.wide, plan.dims, plan.counts) == ((2, 6, 4), (0, 2), (2, 1))
    sliced = (("reshape", (8,)), ("broadcast", ((0,), (8, 2))), ("reshape", (16,)))
    assert plan_of((2, 4), sliced[:1]) is not None
    assert plan_of((2, 4), sliced) is not None
    assert plan_of((3,), (("broadcast", ((1,), (2, 3))), ("transpose", (1, 0)))) is not None


CHAINS = [((2, 4), (("broadcast", ((0, 2), (2, 3, 4))), ("reshape", (6, 4)))),
          ((3,), (("broadcast", ((1,), (2, 3))), ("transpose", (1, 0)))),
          ((2, 3), (("transpose", (1, 0)), ("reshape", (6,)))),
          ((4,), ())]


@pytest.mark.parametrize("base,steps", CHAINS)
def test_result_size_is_the_index_maps(base, steps) -> None:
    assert result_size(base, steps) == index_map(base, steps).size


def test_a_chain_too_large_is_refused_before_its_map_is_made(monkeypatch) -> None:
    """A real-width repeat (a 70B row's K/V heads: 8 Mi elements broadcast, then reshaped, a
    copy of the broadcast) made arrays of hundreds of MiB only to be refused for its size."""
    wide = (128, 8, 8, 8192)
    steps = (("broadcast", ((0, 1, 3), wide)), ("reshape", (128, 64, 8192)))
    made: list[tuple] = []
    repeats._plan_of.cache_clear()
    monkeypatch.setattr(repeats, "index_map", lambda *args: made.append(args) or index_map(*args))
    assert plan_of((128, 8, 8192), steps) is None and not made
    small = ((2, 1, 4), (("broadcast", ((0, 1, 3), (2, 1, 2, 4))), ("reshape", (2, 2, 4))))
    assert plan_of(*small) is not None and made


def test_a_repeated_left_operand_moves_out_before_the_right_free_dims() -> None:
    x, w = T.make_arg(8, (2, 3, 4), F32), T.make_arg(9, (2, 4, 5), F32)
    attrs = ((0,), (0,), (2,), (1,))
    repeated = built_repeat(x, 1, 2)
    pulled = T.make_dot(repeated, w, attrs, (2, 6, 5), F32)
    raw = T.intern("stablehlo.dot_general", (raw_repeat(x, 1, 2), w), attrs, (2, 6, 5), F32)
    assert pulled is built_repeat(T.make_dot(x, w, attrs, (2, 3, 5), F32), 1, 2)
    assert proved(raw, pulled)
    tiled = T.intern("stablehlo.dot_general", (raw_repeat(x, 1, 2, tile=True), w), attrs,
                     (2, 6, 5), F32)
    assert refuted(tiled, pulled)
