"""`tensor.dot_general` on exact numbers (ints and Fractions, as `differing_inputs` evaluates
terms): the products summed over one common denominator per operand are exactly the sums of
Fraction products, for mixed denominators, batch dims, integer-only operands, and operands
whose common denominator is too large (the plain Fraction matmul then)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.semantics import tensor
from entangle_mlir.semantics.tensor import dot_general


def _rationals(rng: random.Random, shape, denominators) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(shape):
        d = rng.choice(denominators)
        out[index] = rng.randint(-40, 40) if d == 1 else Fraction(rng.randint(-40, 40), d)
    return out


def _slow(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Batched (b, m, k) x (b, k, n) by Fraction products, one at a time."""
    b, m, k = lhs.shape
    out = np.empty((b, m, rhs.shape[2]), dtype=object)
    for index in np.ndindex(out.shape):
        i, r, c = index
        out[index] = sum((Fraction(lhs[i, r, t]) * Fraction(rhs[i, t, c]) for t in range(k)),
                         Fraction(0))
    return out


@pytest.mark.parametrize("denominators", [(1,), (1, 2, 3, 7), (97, 2001, 13), (1, 3)],
                         ids=["ints", "small", "odd", "thirds"])
def test_exact_dot_general_is_the_fraction_sum(denominators) -> None:
    rng = random.Random(len(denominators))
    lhs = _rationals(rng, (2, 3, 5), denominators)
    rhs = _rationals(rng, (2, 5, 4), denominators)
    got = dot_general(lhs, rhs, (0,), (0,), (2,), (1,))
    want = _slow(lhs, rhs)
    assert got.shape == want.shape
    assert all(type(v) in (int, Fraction) for v in got.flat)
    assert all(g == w for g, w in zip(got.flat, want.flat))


def test_a_large_common_denominator_falls_back_to_fractions(monkeypatch) -> None:
    """Denominators whose lcm exceeds the bound: the Fraction matmul, the same values."""
    monkeypatch.setattr(tensor, "MAX_COMMON_DENOMINATOR_BITS", 8)
    rng = random.Random(5)
    lhs = _rationals(rng, (1, 2, 6), (97, 89, 83, 79))
    rhs = _rationals(rng, (1, 6, 3), (101, 103))
    assert tensor._common_denominator(lhs[0]) is None
    got = dot_general(lhs, rhs, (0,), (0,), (2,), (1,))
    assert all(g == w for g, w in zip(got.flat, _slow(lhs, rhs).flat))
