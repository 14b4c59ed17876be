"""The token-dim rewrite of entangle-normalize (`entangle_mlir/normalize/token_dims.py`): a per-token
computation on `(batch, seq)` flattened to tokens keeps both dims, exactly (same numbers, op by
op); a region the rewrite cannot follow is left alone, and so is a region the other program does
not have."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.normalize.token_dims import split_token_dims
from entangle_mlir.semantics.collectives import run_op
from entangle_mlir.semantics.tensor import obj_array

# Router-like: per-token scores, a per-token normalisation, and the weight's gradient (a
# contraction over the tokens), then the scores back in (batch, seq) order.
TOKENS = """
func.func @main(%x: tensor<2x3x4xf32>, %w: tensor<4x5xf32>) -> (tensor<2x3x5xf32>, tensor<4x5xf32>) {
  %0 = stablehlo.reshape %x : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<6x4xf32>, tensor<4x5xf32>) -> tensor<6x5xf32>
  %2 = stablehlo.multiply %1, %1 : tensor<6x5xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %3 = stablehlo.reduce(%2 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<6x5xf32>, tensor<f32>) -> tensor<6xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0] : (tensor<6xf32>) -> tensor<6x5xf32>
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  %5 = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<6x5xf32>
  %6 = stablehlo.add %4, %5 : tensor<6x5xf32>
  %7 = stablehlo.divide %1, %6 : tensor<6x5xf32>
  %8 = stablehlo.transpose %7, dims = [1, 0] : (tensor<6x5xf32>) -> tensor<5x6xf32>
  %9 = stablehlo.dot_general %8, %0, contracting_dims = [1] x [0] : (tensor<5x6xf32>, tensor<6x4xf32>) -> tensor<5x4xf32>
  %10 = stablehlo.transpose %9, dims = [1, 0] : (tensor<5x4xf32>) -> tensor<4x5xf32>
  %11 = stablehlo.reshape %7 : (tensor<6x5xf32>) -> tensor<2x3x5xf32>
  return %11, %10 : tensor<2x3x5xf32>, tensor<4x5xf32>
}
"""

# The tokens regrouped another way (6 -> 3x2): no (batch, seq) view survives.
REGROUPED = """
func.func @main(%x: tensor<2x3x4xf32>) -> tensor<3x2x4xf32> {
  %0 = stablehlo.reshape %x : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<6x4xf32>
  %2 = stablehlo.reshape %1 : (tensor<6x4xf32>) -> tensor<3x2x4xf32>
  return %2 : tensor<3x2x4xf32>
}
"""


def _ops(module) -> list[str]:
    names: list[str] = []

    def collect(op):
        names.append(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return names


def _run(module, args: list[np.ndarray]) -> list[np.ndarray]:
    """The function's results on `args`, op by op with the exact semantics."""
    func = next(iter(module.body.operations))
    block = func.regions[0].blocks[0]
    values = {a: obj_array(x) for a, x in zip(block.arguments, args)}
    for op in block.operations:
        if op.name == "func.return":
            return [values[v] for v in op.operands]
        info = describe(op)
        (results,) = run_op(info, [[values[v] for v in op.operands]], None)
        for result, value in zip(op.results, results):
            values[result] = value
    raise AssertionError("no return")


def _pair(text: str):
    return parse_module(text), parse_module(text)


def test_token_region_keeps_batch_and_seq_and_computes_the_same() -> None:
    rng = np.random.default_rng(0)
    args = [rng.integers(-3, 4, (2, 3, 4)).astype(np.float64),
            rng.integers(-3, 4, (4, 5)).astype(np.float64)]
    want = _run(parse_module(TOKENS), args)
    ref, sharded = _pair(TOKENS)
    with context():
        assert split_token_dims([ref, sharded]) == 2
        assert ref.operation.verify() and sharded.operation.verify()
    assert "stablehlo.reshape" not in _ops(sharded)
    text = str(sharded)
    assert "tensor<2x3x5xf32>" in text and "tensor<6x5xf32>" not in text
    got = _run(sharded, args)
    assert all((g == w).all() for g, w in zip(got, want))


def test_tokens_regrouped_another_way_are_left_alone() -> None:
    ref, sharded = _pair(REGROUPED)
    with context():
        assert split_token_dims([ref, sharded]) == 0
    assert _ops(sharded).count("stablehlo.reshape") == 2


def test_a_region_only_one_program_can_rewrite_is_left_alone_in_both() -> None:
    ref, sharded = parse_module(TOKENS), parse_module(REGROUPED)
    with context():
        assert split_token_dims([ref, sharded]) == 0
    assert _ops(ref).count("stablehlo.reshape") == 2


def test_rewritten_moe_program_computes_the_same_when_executed() -> None:
    """The MoE training step under sequence parallelism (top_k, scatter-add, expert einsums,
    forward and backward), reference program, run by XLA before and after the rewrite."""
    from entangle_mlir.evidence import execute_replicas
    from entangle_mlir.mlir.program import inline_calls
    from examples.real.catalog import by_name, lower_pair, random_inputs

    ex = by_name("moe_stack_sgd_sp_tp4")
    ref_text, sharded_text = lower_pair(ex)
    args = random_inputs(ex, 0)
    with context():
        ref, sharded = parse_module(ref_text), parse_module(sharded_text)
        for module in (ref, sharded):
            inline_calls(module, "-")
        assert split_token_dims([ref, sharded]) == 4
        assert ref.operation.verify()
        rewritten = str(ref)
    before = execute_replicas(ref_text, [args])[0]
    after = execute_replicas(rewritten, [args])[0]
    assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))


# jnp.bincount of a raveled id block: the token dim reaches the scatter as a scatter dim of
# its indices (not a batching dim), which the rewrite cannot renumber.
COUNTS = """
func.func @main(%ids: tensor<2x3xi32>) -> tensor<4xi32> {
  %0 = stablehlo.reshape %ids : (tensor<2x3xi32>) -> tensor<6xi32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %zeros = stablehlo.broadcast_in_dim %c0, dims = [] : (tensor<i32>) -> tensor<4xi32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %ones = stablehlo.broadcast_in_dim %c1, dims = [] : (tensor<i32>) -> tensor<6xi32>
  %2 = "stablehlo.scatter"(%zeros, %1, %ones) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>):
    %s = stablehlo.add %a, %b : tensor<i32>
    stablehlo.return %s : tensor<i32>
  }) : (tensor<4xi32>, tensor<6x1xi32>, tensor<6xi32>) -> tensor<4xi32>
  return %2 : tensor<4xi32>
}
"""


def test_token_dim_as_a_scatter_dim_is_left_alone() -> None:
    """The indices alone would have been split (6x1 -> 2x3x1) against updates of 6: refused,
    the program stays as it was and computes the counts."""
    ref, sharded = _pair(COUNTS)
    with context():
        assert split_token_dims([ref, sharded]) == 0
        assert sharded.operation.verify()
    assert "tensor<6x1xi32>" in str(sharded)
    ids = np.array([[0, 1, 1], [3, 3, 3]])
    (got,) = _run(sharded, [ids])
    assert list(got) == [1, 2, 0, 3]
