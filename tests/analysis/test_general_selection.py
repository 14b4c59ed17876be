"""Selections over blocks in the general tier's normal form (`core/selection.py`).

Term level: each identity is evaluated before and after on concrete inputs full of ties (the
semantics' argmax / top_k), and its nearest wrong inputs are left alone. Program level,
grounded by execution on simulated CPU devices: a vocab-sharded greedy argmax (argmin) and
top-k are proven; their nearest wrong twins (indices left local to the block, ties broken
toward the higher block, an argmin combine of argmax answers, the final top_k taking k + 1
of each block's top k) compute other numbers and are not proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.normal_form import make_concat, normal_form, slice_term
from entangle_mlir.core.selection import make_arg_reduce, make_top_k
from entangle_mlir.core.terms import (
    make_arg,
    make_broadcast,
    make_elementwise,
    make_iota,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    term_interval,
)
from entangle_mlir.driver import check_texts
from entangle_mlir.semantics.evaluate import evaluate_term
from tests.jax_runs import run_and_lower

ROWS, BLOCK, N = 3, 4, 3
WIDTH = BLOCK * N
X = make_arg(0, (ROWS, WIDTH), "f32")
NEG_INF, POS_INF = make_splat(-math.inf, (), "f32"), make_splat(math.inf, (), "f32")
ZERO = make_splat(0, (), "i32")


def _positions(shape: tuple[int, ...], d: int):
    iota = make_iota((shape[d],), 0, "i32")
    return iota if len(shape) == 1 else make_broadcast(iota, (d,), shape)


def _blocks(x=X):
    return [slice_term(x, 1, k * BLOCK, (k + 1) * BLOCK) for k in range(N)]


def _take_along(operand, index, d: int):
    """jax's take_along_axis as the gather term the expansion builds."""
    rank = len(operand.shape)
    others = tuple(k for k in range(rank) if k != d)
    attrs = (("collapsed_slice_dims", (d,)), ("index_vector_dim", rank), ("offset_dims", ()),
             ("operand_batching_dims", others), ("slice_sizes", (1,) * rank),
             ("start_index_map", (d,)), ("start_indices_batching_dims", others))
    return make_op("stablehlo.gather", (operand, index), attrs, index.shape[:-1],
                   operand.dtype)


def _greedy(kind: str = "argmax", offset: bool = True, combine: str | None = None,
            init=None):
    """The greedy decoder's terms: each block's max and argmax (global index when `offset`),
    stacked along a new dim 0, the argmax (`combine`) of the maxima picking the index."""
    reduce = "reduce_max" if kind == "argmax" else "reduce_min"
    init = init or (NEG_INF if kind == "argmax" else POS_INF)
    maxima, indices = [], []
    for k, b in enumerate(_blocks()):
        m = make_op(reduce, (b,), ((1,),), (ROWS,), "f32")
        i = make_arg_reduce(kind, b, _positions(b.shape, 1), init, ZERO, (1,), 1)
        maxima.append(make_reshape(m, (1, ROWS)))
        shifted = make_lin([(Fraction(1), i)], Fraction(k * BLOCK if offset else 0), (ROWS,),
                           "i32")
        indices.append(make_reshape(shifted, (1, ROWS)))
    m, c = make_concat(maxima, 0), make_concat(indices, 0)
    best = make_arg_reduce(combine or kind, m, _positions(m.shape, 0), init, ZERO, (0,), 1)
    return make_reshape(_take_along(c, make_reshape(best, (1, ROWS, 1)), 0), (ROWS,))


def _ties(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    values = rng.integers(-2, 3, (ROWS, WIDTH))
    return {0: np.array([[Fraction(int(v)) for v in row] for row in values], dtype=object)}


def _value(term, env):
    return [int(v) if isinstance(v, (int, Fraction)) else v
            for v in np.asarray(evaluate_term(term, env, {})).flat]


def _agree(before, after, seeds=range(20)) -> bool:
    return all(_value(before, _ties(s)) == _value(after, _ties(s)) for s in seeds)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_greedy_pick_of_block_answers_is_the_argmax_of_the_row(kind: str) -> None:
    before = _greedy(kind)
    want = make_arg_reduce(kind, X, _positions(X.shape, 1),
                           NEG_INF if kind == "argmax" else POS_INF, ZERO, (1,), 1)
    assert normal_form(before) is want
    assert _agree(before, want)


@pytest.mark.parametrize("twin", [{"offset": False}, {"combine": "argmin"},
                                  {"init": make_splat(0, (), "f32")}],
                         ids=["local_indices", "argmin_combine", "finite_init"])
def test_greedy_twins_are_not_rewritten_to_the_argmax(twin) -> None:
    before = _greedy(**twin)
    want = make_arg_reduce("argmax", X, _positions(X.shape, 1), NEG_INF, ZERO, (1,), 1)
    assert normal_form(before) is not want
    if "init" not in twin:  # an init of 0 differs only on rows below 0 (not all seeds)
        assert not _agree(before, want)


def test_argmax_of_gathered_value_index_pairs_is_the_argmax_of_the_row() -> None:
    """The pairs spelling (XLA's partitioning): each block's (value, global index) answer,
    the argmax over the answers with their indices."""
    values, indices = [], []
    for k, b in enumerate(_blocks()):
        args = (b, _positions(b.shape, 1), NEG_INF, ZERO)
        values.append(make_reshape(make_arg_reduce("argmax", *args, (1,), 0), (ROWS, 1)))
        i = make_arg_reduce("argmax", *args, (1,), 1)
        indices.append(make_reshape(make_lin([(Fraction(1), i)], Fraction(k * BLOCK),
                                             (ROWS,), "i32"), (ROWS, 1)))
    before = make_arg_reduce("argmax", make_concat(values, 1), make_concat(indices, 1),
                             NEG_INF, ZERO, (1,), 1)
    want = make_arg_reduce("argmax", X, _positions(X.shape, 1), NEG_INF, ZERO, (1,), 1)
    assert normal_form(before) is want
    assert _agree(before, want)


def _top_k(k: int, k_block: int = 4, offsets=None):
    offsets = offsets if offsets is not None else [k * BLOCK for k in range(N)]
    values = make_concat([make_top_k(b, k_block, 0, "f32") for b in _blocks()], 1)
    index = make_concat([make_lin([(Fraction(1), make_top_k(b, k_block, 1, "i32"))],
                                  Fraction(s), (ROWS, k_block), "i32")
                         for b, s in zip(_blocks(), offsets)], 1)
    picks = make_top_k(values, k, 1, "i32")
    return (make_top_k(values, k, 0, "f32"),
            _take_along(index, make_reshape(picks, (ROWS, k, 1)), 1))


@pytest.mark.parametrize("k, k_block", [(3, 3), (2, 4), (1, 1)])
def test_top_k_of_block_top_ks_is_the_top_k_of_the_row(k: int, k_block: int) -> None:
    values, indices = _top_k(k, k_block)
    want = make_top_k(X, k, 0, "f32"), make_top_k(X, k, 1, "i32")
    assert normal_form(values) is want[0] and normal_form(indices) is want[1]
    assert _agree(values, want[0]) and _agree(indices, want[1])


@pytest.mark.parametrize("twin", ["k_plus_one", "local_indices", "offset_off_by_one"])
def test_top_k_twins_are_not_rewritten(twin: str) -> None:
    k, k_block, offsets = 3, 3, None
    if twin == "k_plus_one":
        k_block = 2
    elif twin == "local_indices":
        offsets = [0] * N
    else:
        offsets = [k * BLOCK + 1 for k in range(N)]
    values, indices = _top_k(k, k_block, offsets)
    want = make_top_k(X, k, 0, "f32"), make_top_k(X, k, 1, "i32")
    assert normal_form(indices) is not want[1]
    assert not _agree(indices, want[1])
    if twin == "k_plus_one":
        assert normal_form(values) is not want[0]
        assert not _agree(values, want[0])


def test_non_finite_blocks_are_not_rewritten() -> None:
    """exp of an input may overflow to inf: the comparator's ties with the init differ."""
    grown = make_elementwise("stablehlo.exponential", (X,))
    values = make_concat([make_top_k(b, 2, 0, "f32") for b in _blocks(grown)], 1)
    assert normal_form(make_top_k(values, 2, 0, "f32")).args[0] is values


def test_compares_are_decided_only_where_the_intervals_decide_them() -> None:
    i = make_arg_reduce("argmax", X, _positions(X.shape, 1), NEG_INF, ZERO, (1,), 1)
    assert term_interval(i) == (0.0, WIDTH - 1.0)
    top = make_splat(WIDTH - 1, (ROWS,), "i32")
    below = make_splat(WIDTH - 2, (ROWS,), "i32")
    le = make_elementwise("stablehlo.compare", (i, top), ("LE",), "i1")
    assert normal_form(le) is make_splat(1, (ROWS,), "i1")
    lt = make_elementwise("stablehlo.compare", (i, below), ("LE",), "i1")
    assert normal_form(lt) is lt
    indices = make_top_k(X, 2, 1, "i32")
    assert term_interval(indices) == (0.0, WIDTH - 1.0)  # positions, not the values' range


# ----- programs, grounded by execution -------------------------------------------------------------

TP = 4
RNG = np.random.default_rng(3)
LOGITS = RNG.integers(-2, 3, (8, 64)).astype(np.float32)  # many ties, across blocks too
LOGITS[LOGITS == 0] = RNG.choice(np.array([0.0, -0.0], np.float32), int((LOGITS == 0).sum()))
LOGITS[1, :] = 0.0
LOGITS[1, 20] = -0.0  # a row of zeros: the first block holds the (tied) max
LOGITS[2, :] = -1.0
LOGITS[2, 30:36] = 2.0  # six of the row's top 5 in one block: a top 4 per block misses one


def _greedy_program(offset: bool = True, last_block: bool = False, combine=jnp.argmax,
                    kind: str = "argmax"):
    best_of = jnp.argmax if kind == "argmax" else jnp.argmin
    extreme = jnp.max if kind == "argmax" else jnp.min

    def body(x):
        n = x.shape[-1]
        local_best = extreme(x, axis=-1)
        local = best_of(x, axis=-1)
        if offset:
            local = local + lax.axis_index("tp") * n
        maxes = lax.all_gather(local_best, "tp")
        args = lax.all_gather(local, "tp")
        if last_block:  # ties toward the higher block
            best = maxes.shape[0] - 1 - combine(maxes[::-1], axis=0)
        else:
            best = combine(maxes, axis=0)
        return jnp.take_along_axis(args, best[None], axis=0)[0]
    return body


def _top_k_program(k: int = 4, k_block: int = 4, offset: bool = True):
    def body(x):
        n = x.shape[-1]
        values, local = lax.top_k(x, k_block)
        values = lax.all_gather(values, "tp", axis=1, tiled=True)
        shift = lax.axis_index("tp") * n if offset else 0
        index = lax.all_gather(local + shift, "tp", axis=1, tiled=True)
        best, pick = lax.top_k(values, k)
        return best, jnp.take_along_axis(index, pick, axis=1)
    return body


def _run(reference, body):
    want, got, texts = run_and_lower(reference, body, (LOGITS,), (P(None, "tp"),), P(),
                                     (("tp", TP),))
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want),
                                                    jax.tree.leaves(got)))
    return same, texts


def _argmax(x):
    return jnp.argmax(x, axis=-1)


def _argmin(x):
    return jnp.argmin(x, axis=-1)


def _top4(x):
    return lax.top_k(x, 4)


def _top5(x):
    return lax.top_k(x, 5)


CORRECT = {
    "greedy_argmax": (_argmax, _greedy_program()),
    "greedy_argmin": (_argmin, _greedy_program(combine=jnp.argmin, kind="argmin")),
    "top4": (_top4, _top_k_program()),
    "top4_of_block_top6": (_top4, _top_k_program(k_block=6)),
}
TWINS = {
    "greedy_local_indices": (_argmax, _greedy_program(offset=False)),
    "greedy_ties_to_the_higher_block": (_argmax, _greedy_program(last_block=True)),
    "greedy_argmin_combine": (_argmax, _greedy_program(combine=jnp.argmin)),
    "top4_local_indices": (_top4, _top_k_program(offset=False)),
    "top5_of_block_top4": (_top5, _top_k_program(k=5)),
}


@pytest.mark.parametrize("name", CORRECT)
def test_sharded_selections_are_proven(name: str) -> None:
    same, (ref_text, sharded_text) = _run(*CORRECT[name])
    assert same  # grounded: the same numbers (ties, -0 and +0 included)
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "general"


@pytest.mark.parametrize("name", TWINS)
def test_sharded_selection_twins_are_not_proven(name: str) -> None:
    same, (ref_text, sharded_text) = _run(*TWINS[name])
    assert not same  # grounded: other numbers
    report = check_texts(ref_text, sharded_text)
    assert not report.proven, report.render_text()
