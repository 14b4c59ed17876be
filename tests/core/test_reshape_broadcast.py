"""`reshape(broadcast(y))` in normal form (`terms._reshape_broadcast`), checked against numpy.

A reshape that drops (or adds) the unit dims around a broadcast is itself a broadcast; the
causal mask of a batch of one sequence is spelled `reshape(broadcast(iota, (1, 1, S, S)))`
by one program and `broadcast(iota, (S, S))` by the other, and the two must meet. Every case
evaluates the built term and compares it with numpy's reshape of numpy's broadcast; the
nearest wrong form (the broadcast along the other dim) stays a different term.
"""

from __future__ import annotations

import numpy as np
import pytest

from entangle_mlir.core import terms as T
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.tensor import obj_array

CASES = [
    # (operand shape, broadcast dims, broadcast shape, reshaped to)
    ((4,), (2,), (1, 1, 4, 4), (4, 4)),          # a batch-of-one causal mask
    ((4,), (3,), (1, 1, 4, 4), (4, 4)),
    ((4,), (2,), (1, 1, 4, 3), (4, 3)),
    ((4,), (0,), (4, 3), (1, 4, 1, 3)),          # unit dims added around it
    ((4,), (1,), (1, 4, 3), (4, 3, 1)),
    ((2, 3), (1, 2), (1, 2, 3, 5), (2, 3, 5)),
    ((6,), (1,), (2, 6), (2, 2, 3)),             # a dim of y split
    ((1,), (1,), (3, 1, 2), (3, 2)),             # a unit operand dim dropped
    ((4,), (2,), (1, 2, 4, 3), (2, 12)),         # a real dim merged with a created one: kept
]


def _operand(shape: tuple[int, ...]) -> tuple[T.Term, np.ndarray]:
    values = np.arange(1, int(np.prod(shape)) + 1, dtype=np.int64).reshape(shape)
    return T.make_arg(0, shape, "i32"), values


def _expected(values, dims, shape, target) -> np.ndarray:
    expanded = values.reshape([values.shape[dims.index(d)] if d in dims else 1
                               for d in range(len(shape))])
    return np.broadcast_to(expanded, shape).reshape(target)


@pytest.mark.parametrize("operand,dims,shape,target", CASES)
def test_reshape_of_broadcast_evaluates_as_numpy(operand, dims, shape, target) -> None:
    arg, values = _operand(operand)
    term = T.make_reshape(T.make_broadcast(arg, dims, shape), target)
    got = evaluate_term(term, {0: obj_array(values)})
    want = _expected(values, dims, shape, target)
    assert np.array_equal(np.vectorize(int)(got), want), (term, got, want)


def test_batch_of_one_mask_meets_the_plain_broadcast() -> None:
    arg, _ = _operand((4,))
    squeezed = T.make_reshape(T.make_broadcast(arg, (2,), (1, 1, 4, 4)), (4, 4))
    assert squeezed is T.make_broadcast(arg, (0,), (4, 4))
    assert squeezed is not T.make_broadcast(arg, (1,), (4, 4))  # the transposed mask
    other = T.make_reshape(T.make_broadcast(arg, (3,), (1, 1, 4, 4)), (4, 4))
    assert other is T.make_broadcast(arg, (1,), (4, 4)) and other is not squeezed
