"""The unit-dim fold of entangle-normalize (`entangle_mlir/normalize/unit_dims.py`): jax's transpose of a
broadcast (a reduce over size-1 dims, then a broadcast_in_dim putting them back) becomes
reshapes, exactly; any other reduction over a size-1 dim is left alone (it may be a genuine
partial sum over a split dim of local size 1)."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.normalize.unit_dims import fold_unit_dims
from entangle_mlir.semantics.collectives import run_op
from entangle_mlir.semantics.tensor import obj_array

TRANSPOSE = """
func.func @main(%x: tensor<1x3x1xf32>) -> tensor<1x3x8xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 2] : (tensor<1x3x1xf32>, tensor<f32>) -> tensor<3xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<1x3x8xf32>
  return %2 : tensor<1x3x8xf32>
}
"""

LOSS = """
func.func @main(%x: tensor<1x4xf32>) -> tensor<f32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x4xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
"""


SQUEEZED_GATHER = """
func.func @main(%x: tensor<1x3x4xf32>, %i: tensor<1x3x1xi32>) -> tensor<1x3x1xf32> {
  %0 = stablehlo.reshape %i : (tensor<1x3x1xi32>) -> tensor<3x1x1xi32>
  %1 = "stablehlo.gather"(%x, %0) <{dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [2], operand_batching_dims = [1], start_indices_batching_dims = [0], start_index_map = [2], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1, 1>}> : (tensor<1x3x4xf32>, tensor<3x1x1xi32>) -> tensor<1x3x1xf32>
  return %1 : tensor<1x3x1xf32>
}
"""
"""jax's `take_along_axis` on one sequence (a local batch of 1): the unit batch dim is an
offset dim of the gather and the indices are squeezed."""


def _ops(module) -> list[str]:
    names: list[str] = []

    def collect(op):
        names.append(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return names


def _run(module, *args: np.ndarray) -> np.ndarray:
    """The function's result on `args`, op by op with the exact semantics."""
    values = {}
    func = next(iter(module.body.operations))
    block = func.regions[0].blocks[0]
    for arg, x in zip(block.arguments, args):
        values[arg] = obj_array(x)
    for op in block.operations:
        if op.name == "func.return":
            return values[op.operands[0]]
        info = describe(op)
        (results,) = run_op(info, [[values[v] for v in op.operands]], None)
        for result, value in zip(op.results, results):
            values[result] = value
    raise AssertionError("no return")


def test_transpose_of_broadcast_becomes_reshapes_and_computes_the_same() -> None:
    x = np.arange(3, dtype=np.float64).reshape(1, 3, 1) + 1
    before = parse_module(TRANSPOSE)
    want = _run(before, x)
    module = parse_module(TRANSPOSE)
    with context():
        assert fold_unit_dims(module) == 2
    names = _ops(module)
    assert "stablehlo.reduce" not in names
    assert (_run(module, x) == want).all()


def test_a_reduction_that_is_not_broadcast_back_stays() -> None:
    module = parse_module(LOSS)
    with context():
        assert fold_unit_dims(module) == 0
    assert "stablehlo.reduce" in _ops(module)


def test_unit_offset_dim_of_a_batched_gather_becomes_a_batching_dim() -> None:
    """The rewrite is exact: the same elements for every index, the batch dim kept."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 4))
    index = rng.integers(0, 4, (1, 3, 1)).astype(np.int64)
    want = _run(parse_module(SQUEEZED_GATHER), x, index)
    module = parse_module(SQUEEZED_GATHER)
    with context():
        assert fold_unit_dims(module) == 1
    gather = next(op for op in module.body.operations[0].regions[0].blocks[0].operations
                  if op.name == "stablehlo.gather")
    text = str(gather.attributes["dimension_numbers"])
    assert "operand_batching_dims = [0, 1]" in text and "offset_dims" not in text
    assert str(gather.operands[1].type) == "tensor<1x3x1x1xi32>"
    assert (_run(module, x, index) == want).all()
    assert (want.reshape(3) == np.take_along_axis(x, index, axis=-1).reshape(3)).all()
