"""The sum of a scatter-add over the dims it indexes (`valid_indices.Simplifier`): with every
index in bounds each update lands at one position of those dims, so the sum is the sum of the
updates, arranged by the dims kept (batching dims, whole windows). The gradient of
`log_softmax` picked by `take_along_axis` sums its one-hot cotangent over the vocabulary this
way. Z3 proves each fold an identity under the index range on several layouts, and refutes it
when an index may be one past the end (the update is dropped there); the simplifier does not
fold without the range, nor sums over other dims, and an arrangement of the kept dims other
than the fold's is refuted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.analysis.valid_indices import IndexRange, Simplifier
from entangle_mlir.core import terms as T
from entangle_mlir.rules.gather_scatter import make_scatter
from tests.rules.test_lemmas import arg


@dataclass(frozen=True)
class Layout:
    """A scatter-add's shapes and dimension numbers, and the dims summed."""

    operand: tuple[int, ...]
    indices: tuple[int, ...]
    updates: tuple[int, ...]
    dims: dict
    summed: tuple[int, ...]

    @property
    def size(self) -> int:
        """The smallest size of an indexed dim: valid indices are below it."""
        return min(self.operand[d] for d in self.dims["scatter_dims_to_operand_dims"])


def _dims(vector: int, windows=(), inserted=(), indexed=(), batching=(), index_batching=()):
    return {"index_vector_dim": vector, "update_window_dims": tuple(windows),
            "inserted_window_dims": tuple(inserted),
            "scatter_dims_to_operand_dims": tuple(indexed),
            "input_batching_dims": tuple(batching),
            "scatter_indices_batching_dims": tuple(index_batching)}


LAYOUTS = {
    # jnp.take_along_axis(x, labels[:, None], 1)'s transpose: one update a row, at its label.
    "one_hot_rows": Layout((3, 5), (3, 1, 1), (3, 1),
                           _dims(2, (), (1,), (1,), (0,), (0,)), (1,)),
    # jnp.zeros((V, D)).at[ids].add(g): the embedding's gradient, whole rows.
    "table_rows": Layout((5, 2), (4, 1), (4, 2), _dims(1, (1,), (0,), (0,)), (0,)),
    # batched rows with a window after the batch dim.
    "batch_then_window": Layout((2, 5, 3), (2, 4, 1), (2, 4, 3),
                                _dims(2, (2,), (1,), (1,), (0,), (0,)), (1,)),
    # the operand's window dim before its batching dim: the kept dims trade places.
    "window_then_batch": Layout((3, 2, 5), (2, 4, 1), (2, 4, 3),
                                _dims(2, (2,), (2,), (2,), (1,), (0,)), (2,)),
}


def _sum_of_scatter(layout: Layout):
    """reduce_sum(scatter_add(0, ids, u), summed) over fresh arguments; the ids argument."""
    ids = arg(layout.indices, "i32")
    updates = arg(layout.updates)
    zeros = T.make_splat(0, layout.operand, "f32")
    placed = make_scatter(zeros, ids, updates, layout.dims, "add")
    kept = tuple(n for d, n in enumerate(layout.operand) if d not in layout.summed)
    total = T.make_op("reduce_sum", (placed,), (layout.summed,), kept, "f32", linear_in=0)
    return total, ids


def _folded(term: T.Term, ids: T.Term, size: int) -> T.Term:
    return Simplifier({ids.serial: IndexRange(ids, size)}).simplify(term)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sum_of_scatter_is_the_sum_of_its_updates(name: str) -> None:
    layout = LAYOUTS[name]
    total, ids = _sum_of_scatter(layout)
    folded = _folded(total, ids, layout.size)
    assert not any(t.op == "stablehlo.scatter" for t in T.subterms([folded]))
    index = ids.attrs[0]
    assert check_term_equality(total, folded, ranges={index: (0, layout.size - 1)}
                               ).status == "proved"
    past_end = check_term_equality(total, folded, ranges={index: (0, layout.size)})
    assert past_end.status == "refuted", past_end


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_no_fold_when_an_index_may_be_out_of_bounds(name: str) -> None:
    layout = LAYOUTS[name]
    total, ids = _sum_of_scatter(layout)
    assert _folded(total, ids, layout.size + 1) is total
    assert Simplifier({}).simplify(total) is total


def test_no_fold_over_other_dims() -> None:
    """Summing the one-hot over its rows (not the dim it indexes) keeps the scatter."""
    layout = LAYOUTS["one_hot_rows"]
    total, ids = _sum_of_scatter(Layout(*[getattr(layout, f) for f in (
        "operand", "indices", "updates", "dims")], summed=(0,)))
    assert _folded(total, ids, layout.size) is total


def test_the_kept_dims_in_another_order_are_refuted() -> None:
    """The window and batching dims left in the updates' order (the transpose dropped, the
    rows reshaped into the result's shape): not the sum."""
    layout = LAYOUTS["window_then_batch"]
    total, ids = _sum_of_scatter(layout)
    folded = _folded(total, ids, layout.size)
    assert folded.op == "transpose"
    wrong = folded.args[0]
    assert wrong.shape == (2, 3) and total.shape == (3, 2)
    unswapped = T.make_reshape(wrong, total.shape)
    result = check_term_equality(total, unswapped, ranges={ids.attrs[0]: (0, layout.size - 1)})
    assert result.status == "refuted", result
