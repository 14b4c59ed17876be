"""`semantics.ops.integer_compare`: an integer compare of whole arrays at once is the element
by element `compare` exactly (every direction; booleans, negatives, integers past 2^63,
broadcast operands), and declines arrays holding anything but Python integers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import z3

from entangle_mlir.semantics.element import compare
from entangle_mlir.semantics.ops import integer_compare
from entangle_mlir.semantics.tensor import apply


def _array(values: list, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


def _random_elements(rng: random.Random, n: int) -> list:
    pool = [0, 1, -1, 2**31 - 1, -(2**31), 2**63, 2**64 - 1, -(2**63) - 1, True, False]
    return [rng.choice(pool) if rng.random() < 0.5 else rng.randint(-5, 5) for _ in range(n)]


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_integer_compare_is_compare_element_by_element(direction: str) -> None:
    rng = random.Random(direction)
    for shape_a, shape_b in [((6, 7), (6, 7)), ((6, 1), (1, 7)), ((), (4,))]:
        a = _array(_random_elements(rng, int(np.prod(shape_a))), shape_a)
        b = _array(_random_elements(rng, int(np.prod(shape_b))), shape_b)
        at_once = integer_compare(a, b, direction)
        one_by_one = apply(lambda x, y: compare(x, y, direction), a, b)
        assert at_once is not None and at_once.dtype == object
        assert at_once.shape == one_by_one.shape
        assert all(type(v) is bool for v in at_once.flat)
        assert at_once.tolist() == one_by_one.tolist()


def test_integer_compare_declines_other_elements() -> None:
    """A Z3 term, a float or a numpy integer among the elements: the element-by-element
    path decides it."""
    for odd in [z3.Int("x"), 1.5, np.int64(3)]:
        a = _array([1, odd], (2,))
        assert integer_compare(a, _array([1, 2], (2,)), "LT") is None
    assert integer_compare(_array([1], (1,)), _array([2], (1,)), "XX") is None
