"""Sums into a long `lin` (`terms._extend_lin`, the residual stream's path) build exactly the
term the general `make_lin` loop builds: same canonical form, same interned object."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from entangle_mlir.core import terms
from entangle_mlir.core.terms import make_arg, make_lin, make_splat

SHAPE = (4, 3)
DTYPE = "f32"


def _general(pairs, constant):
    """make_lin with the long-lin path switched off."""
    saved = terms.LONG_LIN
    terms.LONG_LIN = 10**9
    try:
        return make_lin(pairs, constant, SHAPE, DTYPE)
    finally:
        terms.LONG_LIN = saved


def _coef(rng: random.Random):
    return rng.choice([Fraction(1), Fraction(-1), Fraction(2), Fraction(1, 3), Fraction(-5, 7),
                       Fraction(0), 1, -2, Fraction(768), Fraction(1, 768)])


def _constant(rng: random.Random):
    return rng.choice([Fraction(0), Fraction(0), Fraction(1, 2), Fraction(-3), float("inf"),
                       float("-inf"), terms.NAN])


def _leaf(rng: random.Random):
    return make_arg(900_000 + rng.randrange(40), SHAPE, DTYPE)


def _random_lin(rng: random.Random, size: int):
    pairs = [(_coef(rng) or Fraction(1), _leaf(rng)) for _ in range(size)]
    return _general(pairs, rng.choice([Fraction(0), Fraction(0), Fraction(1, 2)]))


@pytest.mark.parametrize("seed", range(200))
def test_sum_into_long_lin_is_the_general_form(seed):
    rng = random.Random(seed)
    base = _random_lin(rng, rng.randrange(terms.LONG_LIN, 30))
    pairs = [(Fraction(1), base)]
    for _ in range(rng.randrange(0, 5)):
        kind = rng.randrange(4)
        if kind == 0:
            pairs.append((_coef(rng), _leaf(rng)))
        elif kind == 1:
            pairs.append((_coef(rng), _random_lin(rng, rng.randrange(1, 12))))
        elif kind == 2:
            pairs.append((_coef(rng), make_splat(_constant(rng), SHAPE, DTYPE)))
        else:
            # cancel some of base's own terms (coefficients drop to zero)
            for k, t in zip(base.attrs[1], base.args):
                if rng.random() < 0.3:
                    pairs.append((-k, t))
    rng.shuffle(pairs)
    constant = _constant(rng)
    general = _general(pairs, constant)
    fast = make_lin(pairs, constant, SHAPE, DTYPE)
    assert _same(fast, general), (terms.pretty(fast), terms.pretty(general))


def _same(a, b) -> bool:
    """Identity; for a sum whose constant is a NaN computed on the way (a fresh float, so never
    hash-consed, by either path), the same fields."""
    if a is b:
        return True
    def fields(t):
        return (t.op, t.args, tuple(map(_nan_free, t.attrs[1])), _nan_free(t.attrs[0]),
                t.shape, t.dtype)
    return a.op == b.op == "lin" and fields(a) == fields(b)


def _nan_free(value):
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def test_sum_cancelling_a_whole_long_lin():
    rng = random.Random(7)
    base = _random_lin(rng, 12)
    assert base.op == "lin" and len(base.args) >= terms.LONG_LIN
    pairs = [(Fraction(1), base), (Fraction(-1), base)]
    assert make_lin(pairs, Fraction(0), SHAPE, DTYPE) is _general(pairs, Fraction(0))
    assert make_lin(pairs, Fraction(0), SHAPE, DTYPE).op == "splat"


@pytest.mark.parametrize("seed", range(100))
def test_content_of_long_lin_is_the_general_one(seed):
    rng = random.Random(1000 + seed)
    scale = rng.choice([Fraction(1), Fraction(-1), Fraction(1, 768), Fraction(-6, 5), Fraction(4)])
    pairs = [(scale * (_coef(rng) or Fraction(1)), _leaf(rng))
             for _ in range(rng.randrange(terms.LONG_LIN, 30))]
    term = _general(pairs, scale * rng.choice([Fraction(0), Fraction(3), Fraction(-1, 2)]))
    if term.op != "lin" or len(term.args) < terms.LONG_LIN:
        return
    saved = terms.LONG_LIN
    terms.LONG_LIN = 10**9
    try:
        k_general, inner_general = terms._factor_content(term)
    finally:
        terms.LONG_LIN = saved
    k_fast, inner_fast = terms._factor_content(term)
    assert k_fast == k_general and type(k_fast) is type(k_general)
    assert inner_fast is inner_general


@pytest.mark.parametrize("seed", range(40))
def test_content_along_a_residual_stream_is_the_general_one(seed):
    """A residual stream grown add by add (`_DERIVED` steps), minus a scaled mean at each
    layer: content and inner sum as the general path computes them from scratch."""
    rng = random.Random(2000 + seed)
    counter = iter(range(10**6))

    def fresh():
        return make_arg(950_000 + seed * 1000 + next(counter), SHAPE, DTYPE)

    unit = Fraction(2) if seed % 2 else Fraction(1)  # a content other than 1 throughout
    stream = _general([(unit * rng.choice([1, 2, 768]), fresh()) for _ in range(9)],
                      unit * rng.choice([0, 0, 3]))
    for layer in range(12):
        added = [(unit * rng.choice([Fraction(1), Fraction(768 ** layer), Fraction(-1, 3)]),
                  fresh()) for _ in range(rng.randrange(1, 4))]
        stream = make_lin([(Fraction(1), stream)] + added, Fraction(0), SHAPE, DTYPE)
        assert stream is _general([(Fraction(1), stream)], Fraction(0))
        centred = make_lin([(Fraction(1), stream),
                            (rng.choice([Fraction(-1, 768), Fraction(-2), Fraction(5, 7)]),
                             fresh())], Fraction(0), SHAPE, DTYPE)
        for term in (stream, centred):
            fast = terms._factor_content(term)
            saved = terms.LONG_LIN
            terms.LONG_LIN = 10**9
            try:
                general = terms._factor_content(term)
            finally:
                terms.LONG_LIN = saved
            assert fast[0] == general[0] and fast[1] is general[1]
            factor = rng.choice([Fraction(768), Fraction(-1, 3), Fraction(2, 5)])
            assert terms._scaled(term, factor) is _general([(factor, term)], Fraction(0))
    assert stream.serial in terms._DERIVED, "the stream was not extended in place"
